/*
 * test_opt.c - the values of -o options (fs/fs_opt.c): the forms every
 * size option takes and what they mean, the refusals and their lines,
 * whole numbers and seconds.  No seed: the cases are fixed.
 * Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fs_opt.h"

static int fails;

#define CHECK(cond, ...) do {						\
	if (!(cond)) {							\
		printf("FAIL %s:%d: ", __FILE__, __LINE__);		\
		printf(__VA_ARGS__);					\
		putchar('\n');						\
		fails++;						\
	}								\
} while (0)

static void size_ok(const char *val, unsigned flags, uint64_t pct_of, uint64_t want)
{
	char msg[FS_OPT_MSG] = "";
	uint64_t got = 7;
	int r = fs_opt_size("host_cache", val, flags, pct_of, &got, msg, sizeof(msg));

	CHECK(r == 0 && got == want, "'%s': %d %llu, want %llu (%s)", val, r,
	      (unsigned long long)got, (unsigned long long)want, msg);
}

static void size_bad(const char *val, unsigned flags, int err, const char *why)
{
	char msg[FS_OPT_MSG] = "", want[FS_OPT_MSG];
	uint64_t got = 7;
	int r = fs_opt_size("dedup_index", val, flags, 1 << 20, &got, msg, sizeof(msg));

	snprintf(want, sizeof(want), "bad dedup_index '%s': %s", val, why);
	CHECK(r == err && got == 7 && !strcmp(msg, want), "'%s': %d '%s', want %d '%s'",
	      val, r, msg, err, want);
}

int main(void)
{
	const char *junk = "a size like 64K, 512M or 8G";
	char msg[FS_OPT_MSG];
	int64_t n;
	double s;

	/* one meaning per form, whatever the option */
	size_ok("0", 0, 0, 0);
	size_ok("4096", 0, 0, 4096);
	size_ok("4096B", 0, 0, 4096);
	size_ok("64K", 0, 0, 64 << 10);
	size_ok("64k", 0, 0, 64 << 10);
	size_ok("64KiB", 0, 0, 64 << 10);
	size_ok("64KB", 0, 0, 64 << 10);
	size_ok("512M", 0, 0, 512ull << 20);
	size_ok("1G", 0, 0, 1ull << 30);
	size_ok("1g", 0, 0, 1ull << 30);
	size_ok("1.5G", 0, 0, 3ull << 29);
	size_ok("0.5K", 0, 0, 512);
	size_ok("2T", 0, 0, 2ull << 40);
	size_ok("16777215.999999999T", 0, 0, UINT64_MAX - 1099);	/* 2^64 - 1100 */
	size_ok("18446744073709551615", 0, 0, UINT64_MAX);
	size_ok("25%", FS_OPT_PCT, 1000, 250);
	size_ok("100%", FS_OPT_PCT, 1ull << 40, 1ull << 40);
	size_ok("12.5%", FS_OPT_PCT, 800, 100);
	size_ok("200M/s", FS_OPT_RATE, 0, 200ull << 20);
	size_ok("200M", FS_OPT_RATE, 0, 200ull << 20);

	/* refused: the line names the option and the value */
	size_bad("12Q", 0, -EINVAL, junk);
	size_bad("-1", 0, -EINVAL, junk);
	size_bad("+1", 0, -EINVAL, junk);
	size_bad(" 1", 0, -EINVAL, junk);
	size_bad("", 0, -EINVAL, junk);
	size_bad("M", 0, -EINVAL, junk);
	size_bad(".5M", 0, -EINVAL, junk);
	size_bad("1.M", 0, -EINVAL, junk);
	size_bad("1e3", 0, -EINVAL, junk);
	size_bad("0x10", 0, -EINVAL, junk);
	size_bad("inf", 0, -EINVAL, junk);
	size_bad("nan", 0, -EINVAL, junk);
	size_bad("1Mi", 0, -EINVAL, junk);
	size_bad("1iB", 0, -EINVAL, junk);
	size_bad("1MBB", 0, -EINVAL, junk);
	size_bad("25%", 0, -EINVAL, junk);
	size_bad("1M/s", 0, -EINVAL, junk);
	size_bad("99999999999999999999G", 0, -ERANGE, "too large");
	size_bad("18446744073709551616", 0, -ERANGE, "too large");
	size_bad("16777216T", 0, -ERANGE, "too large");
	size_bad("99999999999999999999Q", 0, -EINVAL, junk);
	size_bad("101%", FS_OPT_PCT, -ERANGE, "at most 100%");
	size_bad("25%B", FS_OPT_PCT, -EINVAL, "a size like 512M, 8G or 25%");

	/* whole numbers */
	CHECK(fs_opt_uint("flush_threads", "64", 1, 64, NULL, &n, msg, sizeof(msg)) == 0 &&
	      n == 64, "64");
	CHECK(fs_opt_uint("flush_threads", "0", 1, 64, NULL, &n, msg, sizeof(msg)) == -ERANGE &&
	      !strcmp(msg, "flush_threads must be 1..64, not '0'"), "%s", msg);
	CHECK(fs_opt_uint("flush_age", "4x", 0, 60000, "milliseconds", &n, msg,
			  sizeof(msg)) == -EINVAL &&
	      !strcmp(msg, "flush_age must be 0..60000 milliseconds, not '4x'"), "%s", msg);
	CHECK(fs_opt_uint("flush_age", "-1", 0, 60000, "milliseconds", &n, msg,
			  sizeof(msg)) == -EINVAL, "-1");
	CHECK(fs_opt_uint("flush_age", "1.5", 0, 60000, "milliseconds", &n, msg,
			  sizeof(msg)) == -EINVAL, "1.5");
	CHECK(fs_opt_uint("hint_max", "99999999999999999999", 1, INT32_MAX, NULL, &n, msg,
			  sizeof(msg)) == -ERANGE &&
	      !strcmp(msg, "hint_max must be 1 or more (at most 2147483647), "
		      "not '99999999999999999999'"), "%s", msg);

	/* seconds */
	CHECK(fs_opt_seconds("persist_wait", "0.25", 0, HUGE_VAL, 0, &s, msg, sizeof(msg)) == 0 &&
	      s == 0.25, "0.25");
	CHECK(fs_opt_seconds("persist_wait", "nan", 0, HUGE_VAL, 0, &s, msg,
			     sizeof(msg)) == -EINVAL &&
	      !strcmp(msg, "persist_wait must be 0 or more seconds, not 'nan'"), "%s", msg);
	CHECK(fs_opt_seconds("persist_timeout", "0", 0, 86400, 1, &s, msg,
			     sizeof(msg)) == -ERANGE &&
	      !strcmp(msg, "persist_timeout must be more than 0 and at most 86400 seconds, "
		      "not '0'"), "%s", msg);
	CHECK(fs_opt_seconds("persist_timeout", "86400.5", 0, 86400, 1, &s, msg,
			     sizeof(msg)) == -ERANGE, "86400.5");

	printf("%s\n", fails ? "FAIL" : "PASS");
	return fails ? 1 : 0;
}
