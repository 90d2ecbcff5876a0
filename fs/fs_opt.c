/*
 * fs_opt.c - the values of -o options (fs_opt.h): sizes, whole numbers and
 * seconds, each read by one parser with one set of rules (tierfs(8),
 * OPTIONS).  fs_main.c calls it for every option that takes a number;
 * nothing here knows the options themselves, and nothing is logged: the
 * caller says the line this leaves in msg and refuses to start.
 *
 * Numbers are read digit by digit, not by strtod() or sscanf(): no sign,
 * blanks, exponent, hexadecimal, "inf" or "nan", and an overflow is an
 * error instead of a wrapped or undefined value.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fs_opt.h"

#define FRAC_DIGITS	9		/* of a fraction; the rest are read, unused */
#define FRAC_SCALE	1000000000u

/*
 * "DIGITS[.DIGITS]" at *p, advanced past it.  The whole part in *ip, the
 * fraction as *frac / FRAC_SCALE.  -EINVAL: no digit first, or none after
 * the point; *over: the whole part does not fit 64 bits (read anyway, so
 * that junk after it is told as junk).
 */
static int decimal(const char **p, uint64_t *ip, uint64_t *frac, int *over)
{
	const char *s = *p;
	unsigned n = 0;

	*ip = 0;
	*frac = 0;
	*over = 0;
	if (*s < '0' || *s > '9')
		return -EINVAL;
	for (; *s >= '0' && *s <= '9'; s++) {
		unsigned d = (unsigned)(*s - '0');

		if (*ip > (UINT64_MAX - d) / 10)
			*over = 1;
		else
			*ip = *ip * 10 + d;
	}
	if (*s == '.') {
		s++;
		if (*s < '0' || *s > '9')
			return -EINVAL;
		for (; *s >= '0' && *s <= '9'; s++, n++)
			if (n < FRAC_DIGITS)
				*frac = *frac * 10 + (uint64_t)(*s - '0');
		for (; n < FRAC_DIGITS; n++)
			*frac *= 10;
	}
	*p = s;
	return 0;
}

static int refuse(int err, char *msg, size_t len, const char *name, const char *val,
		  const char *why)
{
	snprintf(msg, len, "bad %s '%s': %s", name, val, why);
	return err;
}

int fs_opt_size(const char *name, const char *val, unsigned flags, uint64_t pct_of,
		uint64_t *out, char *msg, size_t len)
{
	const char *form = flags & FS_OPT_PCT ? "a size like 512M, 8G or 25%" :
			   flags & FS_OPT_RATE ? "a rate in bytes per second like 200M" :
			   "a size like 64K, 512M or 8G";
	const char *p = val;
	unsigned __int128 v;
	uint64_t ip, frac;
	unsigned shift = 0;
	int over, pct = 0;

	if (decimal(&p, &ip, &frac, &over))
		return refuse(-EINVAL, msg, len, name, val, form);
	switch (*p) {
	case 'k': case 'K': shift = 10; break;
	case 'm': case 'M': shift = 20; break;
	case 'g': case 'G': shift = 30; break;
	case 't': case 'T': shift = 40; break;
	case '%': pct = 1; break;
	}
	if (shift || pct)
		p++;
	if (shift && p[0] == 'i' && p[1] == 'B')
		p += 2;
	else if (!pct && *p == 'B')
		p++;
	if ((flags & FS_OPT_RATE) && !strcmp(p, "/s"))
		p += 2;
	if (*p || (pct && !(flags & FS_OPT_PCT)))
		return refuse(-EINVAL, msg, len, name, val, form);
	if (over)
		return refuse(-ERANGE, msg, len, name, val, "too large");
	if (pct) {
		if (ip > 100 || (ip == 100 && frac))
			return refuse(-ERANGE, msg, len, name, val, "at most 100%");
		v = ((unsigned __int128)ip * FRAC_SCALE + frac) * pct_of / (100ull * FRAC_SCALE);
	} else {
		v = ((unsigned __int128)ip << shift) +
		    (((unsigned __int128)frac << shift) / FRAC_SCALE);
	}
	if (v > UINT64_MAX)
		return refuse(-ERANGE, msg, len, name, val, "too large");
	*out = (uint64_t)v;
	return 0;
}

int fs_opt_uint(const char *name, const char *val, int64_t min, int64_t max, const char *unit,
		int64_t *out, char *msg, size_t len)
{
	const char *p = val;
	uint64_t ip, frac;
	int over, ret = 0;

	if (decimal(&p, &ip, &frac, &over) || *p || strchr(val, '.'))
		ret = -EINVAL;
	else if (over || ip > (uint64_t)max || (int64_t)ip < min)
		ret = -ERANGE;
	if (ret == 0) {
		*out = (int64_t)ip;
		return 0;
	}
	if (max >= INT32_MAX)
		snprintf(msg, len, "%s must be %lld or more%s%s (at most %lld), not '%s'", name,
			 (long long)min, unit ? " " : "", unit ? unit : "", (long long)max, val);
	else
		snprintf(msg, len, "%s must be %lld..%lld%s%s, not '%s'", name, (long long)min,
			 (long long)max, unit ? " " : "", unit ? unit : "", val);
	return ret;
}

int fs_opt_seconds(const char *name, const char *val, double min, double max, int above_min,
		   double *out, char *msg, size_t len)
{
	const char *p = val;
	uint64_t ip, frac;
	double v = 0;
	int over, ret = 0;

	if (decimal(&p, &ip, &frac, &over) || *p)
		ret = -EINVAL;
	else {
		v = (double)ip + (double)frac / FRAC_SCALE;
		if (over || v < min || (above_min && v == min) || v > max)
			ret = -ERANGE;
	}
	if (ret == 0) {
		*out = v;
		return 0;
	}
	if (above_min)
		snprintf(msg, len, "%s must be more than %g and at most %g seconds, not '%s'",
			 name, min, max, val);
	else if (max < 1e300)
		snprintf(msg, len, "%s must be %g..%g seconds, not '%s'", name, min, max, val);
	else
		snprintf(msg, len, "%s must be %g or more seconds, not '%s'", name, min, val);
	return ret;
}
