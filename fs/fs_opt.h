/*
 * fs_opt.h - the values of -o options: one parser for sizes, whole numbers
 * and seconds, with the rules tierfs(8) states once under OPTIONS.  Each
 * refusal fills msg with one line naming the option and the value.
 */
#ifndef TIERFS_FS_OPT_H
#define TIERFS_FS_OPT_H

#include <stddef.h>
#include <stdint.h>

#define FS_OPT_PCT	0x1	/* "N%" of pct_of is allowed */
#define FS_OPT_RATE	0x2	/* a rate: "/s" may follow */

#define FS_OPT_MSG	256	/* room for a refusal's line */

/*
 * A size: decimal digits, an optional fraction (".5"), then an optional
 * suffix K, M, G or T in either case (powers of 1024), which "iB" or "B" may
 * follow ("64MiB"); "B" alone means bytes.  With FS_OPT_PCT, "N%" (N at
 * most 100) is that share of pct_of.  No sign, no blanks, nothing else.
 * 0 and *out in bytes (a fraction of a byte is dropped); -EINVAL (junk) or
 * -ERANGE (more than 2^64 - 1) with "bad NAME 'VALUE': why" in msg, and
 * *out untouched.
 */
int fs_opt_size(const char *name, const char *val, unsigned flags, uint64_t pct_of,
		uint64_t *out, char *msg, size_t len);

/*
 * A whole number from min to max: decimal digits only.  0 and *out;
 * -EINVAL or -ERANGE with "NAME must be MIN..MAX[ UNIT], not 'VALUE'" in
 * msg ("NAME must be MIN or more (at most MAX), ..." where max is
 * INT32_MAX or more).
 */
int fs_opt_uint(const char *name, const char *val, int64_t min, int64_t max, const char *unit,
		int64_t *out, char *msg, size_t len);

/*
 * Seconds: decimal digits with an optional fraction, from min to max
 * (HUGE_VAL: no bound); above_min: min itself is refused.  0 and *out; -EINVAL or -ERANGE with
 * "NAME must be ... seconds, not 'VALUE'" in msg.
 */
int fs_opt_seconds(const char *name, const char *val, double min, double max, int above_min,
		   double *out, char *msg, size_t len);

#endif
