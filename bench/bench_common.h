/*
 * bench_common.h - what bench_hints.c and bench_gpu_hints.c share: the
 * checkpoint workload (sizes, restore order, the same for the same seed in
 * both), the random numbers behind it, and small helpers.
 *
 * Header-only (static functions): define BENCH_PROG (the program's name,
 * which starts its messages) before including it.
 */
#ifndef TIERFS_BENCH_COMMON_H
#define TIERFS_BENCH_COMMON_H

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* "BENCH_PROG: message" on stderr. */
static void vsay(const char *fmt, va_list ap)
{
	fputs(BENCH_PROG ": ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

static void warn(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay(fmt, ap);
	va_end(ap);
}

/* A usage or set-up error: exit status 2. */
static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay(fmt, ap);
	va_end(ap);
	exit(2);
}

enum bench_order { ORD_SEQ, ORD_REV, ORD_IRR };

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		die("out of memory (%zu bytes)", n);
	return p;
}

/* splitmix64: small, seedable, good enough for sizes and permutations */
static uint64_t rng_next(uint64_t *st)
{
	uint64_t z = (*st += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rng_unit(uint64_t *st)	/* [0, 1) */
{
	return (double)(rng_next(st) >> 11) * (1.0 / 9007199254740992.0);
}

/* e^x for |x| < 1 by its series (no libm needed) */
static double exp_small(double x)
{
	double sum = 1, term = 1;

	for (int n = 1; n < 30; n++) {
		term *= x / n;
		sum += term;
	}
	return sum;
}

/* "16M" -> bytes, binary suffixes */
static bool parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	int shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return false;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	}
	if (*end == 'i' || *end == 'I')
		end++;
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return false;
	*out = (uint64_t)v << shift;
	return true;
}

static int pick(const char *arg, const char *const *names, int n, const char *what)
{
	for (int i = 0; i < n; i++)
		if (strcmp(arg, names[i]) == 0)
			return i;
	die("bad %s '%s'", what, arg);
	return -1;
}

/*
 * The k checkpoint sizes of mean s: all s, or (var) shaped like the RTM
 * traces of hpdc23's Figure 4: s * trend(i) * jitter, trend linear from
 * 0.25 to 1.75 over the shot, jitter log-uniform in [1/2, 2] (mean 1),
 * clamped to [s/8, 2s] and rescaled to mean s, multiples of align.  The
 * draw depends only on seed, k and s.
 */
static void ckpt_sizes(uint64_t *sz, int k, uint64_t s, bool var, uint64_t seed,
		       uint64_t align)
{
	if (!var) {
		for (int i = 0; i < k; i++)
			sz[i] = s;
		return;
	}

	uint64_t st = seed * 0x2545f4914f6cdd1dull + 1;
	double *x = xmalloc(sizeof(double) * (size_t)k);
	const double ln2 = 0.69314718055994530942;
	const double lo = 0.125, hi = 2.0;

	for (int i = 0; i < k; i++) {
		double trend = 0.25 + 1.5 * (k > 1 ? (double)i / (k - 1) : 0.5);
		/* log-uniform in [1/2, 2]: 2^(2u-1), mean 1.5/ln 4 */
		double jitter = exp_small((2 * rng_unit(&st) - 1) * ln2) / (1.5 / (2 * ln2));

		x[i] = trend * jitter;
	}
	/* clamp to [S/8, 2S] and rescale to mean 1; a few rounds converge */
	for (int round = 0; round < 50; round++) {
		double sum = 0;

		for (int i = 0; i < k; i++) {
			x[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
			sum += x[i];
		}
		double f = k / sum;

		if (f > 0.9999 && f < 1.0001)
			break;
		for (int i = 0; i < k; i++)
			x[i] *= f;
	}
	for (int i = 0; i < k; i++) {
		double b = x[i] * (double)s;
		uint64_t v = ((uint64_t)(b + align / 2) / align) * align;
		uint64_t min = (s / 8 + align - 1) / align * align;

		sz[i] = v < min ? min : v > 2 * s ? 2 * s : v;
	}
	free(x);
}

/* The restore order of k checkpoints: 0..k-1, k-1..0, or a permutation
 * drawn from seed. */
static void ckpt_order(int *ord, int k, enum bench_order order, uint64_t seed)
{
	for (int i = 0; i < k; i++)
		ord[i] = order == ORD_REV ? k - 1 - i : i;
	if (order == ORD_IRR) {
		uint64_t st = seed * 0x9e3779b97f4a7c15ull + 2;

		for (int i = k - 1; i > 0; i--) {
			int j = (int)(rng_next(&st) % (uint64_t)(i + 1));
			int t = ord[i];

			ord[i] = ord[j];
			ord[j] = t;
		}
	}
}

/* The root of the mount holding dir: walk up while the device stays. */
static void find_root(const char *dir, char *out, size_t len)
{
	char cur[PATH_MAX];
	struct stat st, pst;

	if (!realpath(dir, cur))
		die("%s: %s", dir, strerror(errno));
	if (stat(cur, &st))
		die("%s: %s", cur, strerror(errno));
	while (strcmp(cur, "/") != 0) {
		char parent[PATH_MAX];
		char *slash;

		snprintf(parent, sizeof(parent), "%s", cur);
		slash = strrchr(parent, '/');
		if (slash == parent)
			slash[1] = 0;
		else
			*slash = 0;
		if (stat(parent, &pst) || pst.st_dev != st.st_dev)
			break;
		snprintf(cur, sizeof(cur), "%s", parent);
	}
	snprintf(out, len, "%s", cur);
}

/*
 * In the JSON text [p, end), the object that is the value of the first
 * "key": its '{' (returned) and its '}' (*oend); NULL if there is none.
 * Enough for user.tierfs.stats: no escapes in keys, strings skipped.
 */
static const char *json_obj(const char *p, const char *end, const char *key,
			    const char **oend)
{
	char pat[64];
	int depth = 0;
	bool str = false;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(p, pat);
	if (!p || p >= end)
		return NULL;
	p += strlen(pat);
	while (*p == ' ')
		p++;
	if (*p != '{')
		return NULL;
	for (const char *q = p; *q && q < end; q++) {
		if (str) {
			if (*q == '\\' && q[1])
				q++;
			else if (*q == '"')
				str = false;
		} else if (*q == '"') {
			str = true;
		} else if (*q == '{') {
			depth++;
		} else if (*q == '}' && --depth == 0) {
			*oend = q;
			return p;
		}
	}
	return NULL;
}

#endif
