/*
 * fs_hints.c - the restore-hint side of the xattr protocol (tierfs-hints(7)):
 * user.tierfs.restore_order and user.tierfs.prefetch on directories,
 * user.tierfs.restore_next on files.  A long restore_order reads back in
 * pages (user.tierfs.restore_order.N: from the N-th entry, 64 KiB at most).
 *
 * Who may do what: the kernel lets whoever may write a directory (or
 * file) set its user.* attributes.  That is enough for what concerns that
 * directory (its restore order) or file; prefetch, which starts or holds
 * prefetching for the whole mount, also needs root or the owner of the
 * mount's root (EPERM otherwise).
 *
 * Values are checked completely before anything changes: a malformed list
 * appends nothing, and neither does one that would pass a bound on the
 * queue (EDQUOT): the mount's (-o hint_max), and the caller's own (-o
 * hint_max_user, by the uid of the request) unless the caller may steer
 * the mount (root, the owner of the mount's root).  Names of files that
 * do not exist yet are accepted and bound to the file when it appears
 * (engine_hint_bind, from lookup and create).  The queue itself lives in
 * the engine.
 *
 * A value refused with EINVAL is also said in the log (refused(), at level
 * notice, at most one line a second): setfattr(1) prints a bare "Invalid
 * argument", and the shell user finds the reason there.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "fs_hints.h"
#include "tierfs_names.h"
#include "tierfs.h"

/* Newlines in s[0..n). */
static size_t memcnt_nl(const char *s, size_t n)
{
	size_t c = 0;

	while (n--)
		c += *s++ == '\n';
	return c;
}

/* Drop the references of files[0..n). */
static void put_files(struct tfile **files, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (files[i])
			files[i]->ops->put(files[i]);
}

static int may_steer_mount(uid_t uid);

/*
 * Say why setting attr on in was refused, then return -EINVAL.  At most one
 * line a second (a loop of bad writes cannot flood the log); the next line
 * that is said counts those left out meanwhile.  Lock-free: two atomics.
 */
static int refused(struct fs_inode *in, const char *attr, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int refused(struct fs_inode *in, const char *attr, const char *fmt, ...)
{
	static uint64_t next_s;		/* atomic: first second for a line */
	static uint64_t left_out;	/* atomic: lines not said since */
	struct timespec ts;
	char why[320], path[512];
	uint64_t now, at;
	va_list ap;

	if (LOG_NOTICE > tierfs_log_level)
		return -EINVAL;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec;
	at = __atomic_load_n(&next_s, __ATOMIC_RELAXED);
	if (now < at || !__atomic_compare_exchange_n(&next_s, &at, now + 1, false,
						     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
		__atomic_add_fetch(&left_out, 1, __ATOMIC_RELAXED);
		return -EINVAL;
	}
	uint64_t n = __atomic_exchange_n(&left_out, 0, __ATOMIC_RELAXED);

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (fs_rel_path(in, path, sizeof(path)))
		snprintf(path, sizeof(path), "(inode %llu)", (unsigned long long)in->ino);
	if (n)
		tlog(LOG_NOTICE, "%s on %s refused (EINVAL): %s (and %llu more refused "
		     "value(s) not logged)", attr, path, why, (unsigned long long)n);
	else
		tlog(LOG_NOTICE, "%s on %s refused (EINVAL): %s", attr, path, why);
	return -EINVAL;
}

/* A name of a restore order as it may go in a log line: at most 64 bytes,
 * what is not printable ASCII as '?'. */
static const char *printable(const char *name, size_t len, char *buf, size_t size)
{
	size_t i, n = len < size - 1 ? len : size - 1;

	if (n > 64)
		n = 64;
	for (i = 0; i < n; i++)
		buf[i] = name[i] >= 0x20 && name[i] < 0x7f ? name[i] : '?';
	buf[n] = 0;
	if (n < len && n >= 3)
		memcpy(buf + n - 3, "...", 3);
	return buf;
}

static int set_restore_order(struct fs_inode *dir, const char *value, size_t size,
			     uid_t uid)
{
	const char *attr = TIERFS_XATTR_RESTORE_ORDER, *why, *nul;
	const char **names = NULL;
	struct tfile **files = NULL;
	char *copy = NULL, pb[80];
	size_t n = 0, cap = 0, i, line = 0;
	int ret = 0;

	if (!S_ISDIR(dir->type))
		return refused(dir, attr, "not a directory");
	if (size == 0)
		return refused(dir, attr, "empty value: one name per line");
	nul = memchr(value, 0, size);
	if (nul)
		return refused(dir, attr, "line %zu: contains a NUL byte",
			       1 + memcnt_nl(value, (size_t)(nul - value)));
	copy = malloc(size + 1);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, value, size);
	copy[size] = 0;
	for (char *p = copy; p < copy + size;) {
		char *nl = memchr(p, '\n', (size_t)(copy + size - p));
		size_t len = nl ? (size_t)(nl - p) : strlen(p);

		if (nl)
			*nl = 0;
		line++;
		ret = tierfs_hint_name_check(p, len);
		if (ret < 0) {
			why = tierfs_hint_name_why(p, len);
			ret = refused(dir, attr, "line %zu '%s': %s", line,
				      printable(p, len, pb, sizeof(pb)), why ? why : "bad name");
			goto out;
		}
		if (ret == 0) {
			if (n == cap) {
				cap = cap ? 2 * cap : 16;
				const char **nn = realloc(names, cap * sizeof(*nn));
				if (!nn) {
					ret = -ENOMEM;
					goto out;
				}
				names = nn;
			}
			names[n++] = p;
		}
		ret = 0;
		p += len + 1;
	}
	if (n == 0) {
		ret = refused(dir, attr, "no names, only empty lines");
		goto out;
	}
	files = calloc(n, sizeof(*files));
	if (!files) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < n; i++) {
		ret = fs_child_tfile(dir, names[i], &files[i]);
		if (ret) {
			put_files(files, i);
			if (ret == -EINVAL)
				refused(dir, attr, "'%s': exists and is not a regular file",
					printable(names[i], strlen(names[i]), pb, sizeof(pb)));
			goto out;
		}
	}
	ret = engine_hint_append(fs.eng, fs_dir_key(dir), uid, may_steer_mount(uid) != 0,
				 names, files, n);
	if (ret)
		put_files(files, n);
out:
	free(files);
	free(names);
	free(copy);
	return ret;
}

static int set_restore_next(struct fs_inode *in, uid_t uid)
{
	const char *name;
	struct tfile *f = &in->tf;
	uint64_t key;
	char *n;
	int ret;

	if (!S_ISREG(in->type))
		return refused(in, TIERFS_XATTR_RESTORE_NEXT, "not a regular file");
	fs_lock();
	if (!in->name || !in->parent) {
		fs_unlock();
		return in->unlinked ? -ENOENT : -EINVAL;
	}
	n = strdup(in->name);
	key = fs_dir_key(in->parent);
	fs_unlock();
	if (!n)
		return -ENOMEM;
	name = n;
	f->ops->get(f);
	ret = engine_hint_append(fs.eng, key, uid, may_steer_mount(uid) != 0, &name, &f, 1);
	if (ret)
		f->ops->put(f);
	free(n);
	return ret;
}

/* Drop the file's cached copies that the SSD holds (tierfsctl evict). */
static int set_evict(struct fs_inode *in)
{
	if (!S_ISREG(in->type))
		return -EINVAL;
	return engine_evict_file(fs.eng, &in->tf);
}

/* user.tierfs.flush: a file's waiting flush, or a directory's: all of them */
static int set_flush(struct fs_inode *in)
{
	if (S_ISREG(in->type))
		engine_flush_now(fs.eng, &in->tf);
	else if (S_ISDIR(in->type))
		engine_flush_now(fs.eng, NULL);
	else
		return -EINVAL;
	return 0;
}

/*
 * user.tierfs.restore_device: the CUDA ordinal of the GPU that will read
 * the file back ("1", a newline allowed), or "none" to forget it.  A mount
 * over several GPUs prefetches the file into that GPU's part of the cache,
 * and POSIX writes place its GPU copy there.  -EINVAL for anything but a
 * number below 64 or "none"; -ENODEV when the mount's GPU tier does not
 * span that GPU.
 */
static int set_restore_device(struct fs_inode *in, const char *value, size_t size)
{
	const char *attr = TIERFS_XATTR_RESTORE_DEVICE;
	char buf[8];
	char *end;
	long dev;

	if (!S_ISREG(in->type))
		return refused(in, attr, "not a regular file");
	if (size && value[size - 1] == '\n')
		size--;
	if (size == 0 || size >= sizeof(buf))
		return refused(in, attr, "not a GPU number below 64 or \"none\"");
	memcpy(buf, value, size);
	buf[size] = '\0';
	if (!strcmp(buf, "none"))
		return tfile_set_gpu_device(&in->tf, -1);
	if (buf[0] < '0' || buf[0] > '9')
		return refused(in, attr, "not a GPU number below 64 or \"none\"");
	errno = 0;
	dev = strtol(buf, &end, 10);
	if (errno || *end || dev < 0 || dev >= 64)
		return refused(in, attr, "not a GPU number below 64 or \"none\"");
	return tfile_set_gpu_device(&in->tf, (int)dev);
}

/* Mount-wide controls: root, or the owner of the mount's root. */
static int may_steer_mount(uid_t uid)
{
	struct stat st;

	if (uid == 0)
		return 0;
	if (fstatat(fs.root_fd, "", &st, AT_EMPTY_PATH) < 0)
		return -errno;
	return st.st_uid == uid ? 0 : -EPERM;
}

static int set_prefetch(struct fs_inode *dir, const char *value, size_t size, uid_t uid)
{
	int ret;

	if (!S_ISDIR(dir->type))
		return refused(dir, TIERFS_XATTR_PREFETCH, "not a directory");
	ret = may_steer_mount(uid);
	if (ret)
		return ret;
	if (size && value[size - 1] == '\n')
		size--;
	if (size == 5 && !memcmp(value, "start", 5))
		engine_prefetch_set(fs.eng, true);
	else if (size == 4 && !memcmp(value, "stop", 4))
		engine_prefetch_set(fs.eng, false);
	else
		return refused(dir, TIERFS_XATTR_PREFETCH, "the value is \"start\" or \"stop\"");
	return 0;
}

int fs_hints_set(struct fs_inode *in, const char *name, const char *value,
		 size_t size, int flags, uid_t uid)
{
	(void)flags;
	if (!strcmp(name, TIERFS_XATTR_RESTORE_ORDER))
		return set_restore_order(in, value, size, uid);
	if (!strcmp(name, TIERFS_XATTR_PREFETCH))
		return set_prefetch(in, value, size, uid);
	if (!strcmp(name, TIERFS_XATTR_RESTORE_NEXT))
		return set_restore_next(in, uid);
	if (!strcmp(name, TIERFS_XATTR_EVICT))
		return set_evict(in);
	if (!strcmp(name, TIERFS_XATTR_FLUSH))
		return set_flush(in);
	if (!strcmp(name, TIERFS_XATTR_RESTORE_DEVICE))
		return set_restore_device(in, value, size);
	if (!strcmp(name, TIERFS_XATTR_TIER) || !strcmp(name, TIERFS_XATTR_STATE) ||
	    !strcmp(name, TIERFS_XATTR_STATS) || !strcmp(name, TIERFS_XATTR_SHARED))
		return -EPERM;
	return refused(in, name, "no such tierfs attribute");
}

/*
 * The index N of "user.tierfs.restore_order.N": decimal digits only, no
 * sign, below 2^64.  -1: not such a name.
 */
static int order_page_index(const char *name, uint64_t *index)
{
	const size_t pl = sizeof(TIERFS_XATTR_RESTORE_ORDER_PAGE) - 1;
	const char *p = name + pl;
	uint64_t v = 0;

	if (strncmp(name, TIERFS_XATTR_RESTORE_ORDER_PAGE, pl) || !*p)
		return -1;
	for (; *p; p++) {
		if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	*index = v;
	return 0;
}

int fs_hints_get(struct fs_inode *in, const char *name, char *buf, size_t len)
{
	uint64_t index;

	if (!strcmp(name, TIERFS_XATTR_RESTORE_ORDER)) {
		if (!S_ISDIR(in->type))
			return -ENODATA;
		return engine_hint_list(fs.eng, fs_dir_key(in), buf, len);
	}
	/* a page of it: 64 KiB at most whatever the caller's buffer, so that
	 * the size asked first and the value read next agree */
	if (!order_page_index(name, &index)) {
		if (!S_ISDIR(in->type))
			return -ENODATA;
		if (len > TIERFS_RESTORE_ORDER_PAGE_MAX)
			len = TIERFS_RESTORE_ORDER_PAGE_MAX;
		return engine_hint_list_page(fs.eng, fs_dir_key(in), index, buf, len);
	}
	if (!strcmp(name, TIERFS_XATTR_PREFETCH)) {
		if (!S_ISDIR(in->type))
			return -ENODATA;
		return snprintf(buf, len, "%s", engine_prefetch_get(fs.eng) ? "start" : "stop");
	}
	if (!strcmp(name, TIERFS_XATTR_RESTORE_DEVICE)) {
		int dev = S_ISREG(in->type) ? tfile_gpu_device(&in->tf) : -1;

		return dev < 0 ? -ENODATA : snprintf(buf, len, "%d", dev);
	}
	return -ENODATA;
}

int fs_hints_remove(struct fs_inode *in, const char *name)
{
	if (!strcmp(name, TIERFS_XATTR_RESTORE_ORDER) && S_ISDIR(in->type)) {
		engine_hint_drop_dir(fs.eng, fs_dir_key(in));
		return 0;
	}
	if (!strcmp(name, TIERFS_XATTR_RESTORE_DEVICE) && S_ISREG(in->type))
		return tfile_set_gpu_device(&in->tf, -1);
	return -EPERM;
}
