/*
 * testutil.h - what the test programs share (those of tests/unit, the C++
 * of test_hash_kernel_cpu.cc, and those of tests/gpu): the seed convention, the
 * random generator and the PASS/FAIL check of the programs that print each
 * check.  Static functions only: each program includes it once, nothing
 * is linked.
 *
 * Seeds (tests/README.md, "Seeds"): a program's seed is the one it is
 * given (its argument, or its own environment variable); else
 * TIERFS_RANDOM_SEED=1 (set, non-empty, not "0") draws one from the clock;
 * else a fixed default, so that `make check` runs the same cases each
 * time.  The seed is printed either way, with where it came from.
 *
 * The generator: xorshift64* (Vigna) on the global rng_state; a program
 * that defines TESTUTIL_XORSHIFT64 before the include gets Marsaglia's
 * xorshift64 (13, 7, 17) instead, which test_balance and test_dedup
 * always used: their printed seeds replay the same cases.
 */
#ifndef TESTUTIL_H
#define TESTUTIL_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- seeds -------------------------------------------------------------- */

/* True when TIERFS_RANDOM_SEED asks for a seed from the clock. */
static inline bool tu_random_seed_wanted(void)
{
	const char *s = getenv("TIERFS_RANDOM_SEED");

	return s && *s && strcmp(s, "0");
}

/*
 * The seed of a run: GIVEN (argv[1], or NULL), else the program's own
 * environment variable ENV (NULL: none) when set and non-empty, else one
 * from the clock when tu_random_seed_wanted(), else DFLT.  Prints
 * "LABEL seed N (where from)" on stdout.  *FIXED (may be NULL) says
 * whether DFLT was taken.
 */
static inline uint64_t tu_seed(const char *label, const char *given, const char *env,
			       uint64_t dflt, bool *fixed)
{
	const char *e = env ? getenv(env) : NULL;
	const char *from;
	struct timespec ts;
	uint64_t seed;

	if (fixed)
		*fixed = false;
	if (given) {
		seed = strtoull(given, NULL, 0);
		from = "given";
	} else if (e && *e) {
		seed = strtoull(e, NULL, 0);
		from = env;
	} else if (tu_random_seed_wanted()) {
		clock_gettime(CLOCK_REALTIME, &ts);
		seed = ((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec) ^
		       ((uint64_t)getpid() << 32);
		from = "TIERFS_RANDOM_SEED: from the clock";
	} else {
		seed = dflt;
		from = "the fixed default; TIERFS_RANDOM_SEED=1 for a random one";
		if (fixed)
			*fixed = true;
	}
	printf("%s seed %" PRIu64 " (%s)\n", label, seed, from);
	fflush(stdout);
	return seed;
}

/* ---- random numbers ----------------------------------------------------- */

/* xorshift64* (Vigna): the generator of most tests. */
static inline uint64_t tu_xorshift64s(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dULL;
}

/* xorshift64 (Marsaglia, 13, 7, 17). */
static inline uint64_t tu_xorshift64(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static uint64_t rng_state;		/* never 0: set from the seed */

static inline uint64_t rnd(void)
{
#ifdef TESTUTIL_XORSHIFT64
	return tu_xorshift64(&rng_state);
#else
	return tu_xorshift64s(&rng_state);
#endif
}

/* Uniform enough in [0, n); 0 for n = 0. */
static inline uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/* In [lo, hi), from the top 53 bits. */
static inline double rnd_in(double lo, double hi)
{
	return lo + (hi - lo) * (double)(rnd() >> 11) / 9007199254740992.0;
}

/* N bytes of the stream, 8 at a time (the tail from one draw each). */
static inline void fill_random(uint8_t *p, size_t n)
{
	uint64_t v;
	size_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		v = rnd();
		memcpy(p + i, &v, 8);
	}
	for (; i < n; i++)
		p[i] = (uint8_t)rnd();
}

/* ---- checks that print PASS or FAIL ------------------------------------- */

static int n_checks, n_failed;

/* Counts and prints one check ("PASS: what" or "FAIL: what"); returns ok. */
static inline bool check(bool ok, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static inline bool check(bool ok, const char *fmt, ...)
{
	va_list ap;

	n_checks++;
	if (!ok)
		n_failed++;
	printf("%s: ", ok ? "PASS" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	return ok;
}

#endif /* TESTUTIL_H */
