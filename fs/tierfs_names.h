/*
 * tierfs_names.h - the rule for a name in a restore order, shared by the
 * daemon (fs_hints.c, which applies it) and libtierfs (libtierfs_hints.c,
 * which checks names before it sends them).  Header-only: the library does
 * not link the daemon's code.
 */
#ifndef TIERFS_NAMES_H
#define TIERFS_NAMES_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define TIERFS_HIDDEN_PREFIX	".tierfs"	/* names tierfs keeps to itself */

/* Is s[0..n) valid UTF-8 (no overlongs, no surrogates)? */
static inline bool tierfs_utf8_ok(const unsigned char *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		unsigned c = s[i], need, min, cp;

		if (c < 0x80) {
			i++;
			continue;
		}
		if ((c & 0xe0) == 0xc0) {
			need = 1; min = 0x80; cp = c & 0x1f;
		} else if ((c & 0xf0) == 0xe0) {
			need = 2; min = 0x800; cp = c & 0x0f;
		} else if ((c & 0xf8) == 0xf0) {
			need = 3; min = 0x10000; cp = c & 0x07;
		} else {
			return false;
		}
		for (unsigned k = 1; k <= need; k++) {
			if (i + k >= n || (s[i + k] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += need + 1;
	}
	return true;
}

/*
 * Why line name[0..len) of a restore order is refused (the wording of the
 * Python package's check_names), or NULL if it is not.
 */
static inline const char *tierfs_hint_name_why(const char *name, size_t len)
{
	if (len > 255)
		return "longer than 255 bytes";
	if (memchr(name, '/', len))
		return "contains '/': only plain names inside the directory";
	if (memchr(name, 0, len))
		return "contains a NUL byte";
	if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'))
		return "'.' and '..' are not files";
	if (len >= sizeof(TIERFS_HIDDEN_PREFIX) - 1 &&
	    !memcmp(name, TIERFS_HIDDEN_PREFIX, sizeof(TIERFS_HIDDEN_PREFIX) - 1))
		return "names beginning with '.tierfs' are tierfs's own";
	if (!tierfs_utf8_ok((const unsigned char *)name, len))
		return "not valid UTF-8";
	return NULL;
}

/*
 * One line of a restore order, name[0..len): 1 when empty (skipped), 0 when
 * valid, -EINVAL otherwise (a slash or NUL, "." or "..", tierfs's own
 * prefix, over 255 bytes, not UTF-8: tierfs_hint_name_why says which).
 */
static inline int tierfs_hint_name_check(const char *name, size_t len)
{
	if (len == 0)
		return 1;
	return tierfs_hint_name_why(name, len) ? -EINVAL : 0;
}
#endif
