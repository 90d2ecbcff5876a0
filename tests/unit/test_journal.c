/*
 * test_journal.c - the journal (store/journal.c): records appended and
 * replayed in order; a torn tail, a bad checksum in the middle, an empty
 * file, a wrong magic and a stale tail past an emptied journal stop the
 * replay where they start; retired records are not replayed; a delta
 * record applied to its file, twice, and over a partial apply, gives the
 * same file.  No seed: the cases are fixed.  Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "journal.h"

static int fails;

#define CHECK(cond, ...) do {						\
	if (!(cond)) {							\
		printf("FAIL %s:%d: ", __FILE__, __LINE__);		\
		printf(__VA_ARGS__);					\
		putchar('\n');						\
		fails++;						\
	}								\
} while (0)

#define JN	"journal"

static int dirfd_;

/* What replay handed over: the first byte of each payload, in order. */
static char seen[64];
static int nseen;

static int collect(void *arg, uint16_t type, uint64_t seq, const void *p, uint64_t len)
{
	(void)arg;
	(void)seq;
	if (type == 7 && len && nseen < (int)sizeof(seen) - 1)
		seen[nseen++] = *(const char *)p;
	return 0;
}

/* A journal of records "a...", "b...", ... (n of them, each len bytes). */
static void make(int n, size_t len, uint64_t *seqs)
{
	struct jnl j;
	char buf[4096];

	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	for (int i = 0; i < n; i++) {
		struct iovec v = { buf, len };
		uint64_t s;

		memset(buf, 'a' + i, len);
		CHECK(jnl_append(&j, 7, &v, 1, &s) == 0, "append %d", i);
		if (seqs)
			seqs[i] = s;
	}
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	jnl_close(&j);
}

static const char *replay(struct jnl_replay_stats *st)
{
	nseen = 0;
	CHECK(jnl_replay(dirfd_, JN, collect, NULL, st) == 0, "replay");
	seen[nseen] = 0;
	return seen;
}

static off_t jsize(void)
{
	struct stat st;

	return fstatat(dirfd_, JN, &st, 0) == 0 ? st.st_size : -1;
}

static void flip(off_t at)
{
	int fd = openat(dirfd_, JN, O_RDWR);
	char c;

	CHECK(pread(fd, &c, 1, at) == 1, "read");
	c ^= 0x55;
	CHECK(pwrite(fd, &c, 1, at) == 1, "write");
	close(fd);
}

#define REC(len)	((off_t)(sizeof(struct jnl_rec) + (len)))

static void test_records(void)
{
	struct jnl_replay_stats st;

	make(3, 100, NULL);
	CHECK(!strcmp(replay(&st), "abc"), "three records: got '%s'", seen);
	CHECK(st.records == 3 && st.applied == 3 && !st.torn, "stats %lu %lu",
	      (unsigned long)st.records, (unsigned long)st.applied);
	CHECK(jsize() == 0, "emptied after a whole replay: %ld", (long)jsize());
	CHECK(!strcmp(replay(&st), ""), "replayed twice: '%s'", seen);
}

static void test_torn_tail(void)
{
	struct jnl_replay_stats st;

	make(3, 100, NULL);
	CHECK(truncate(JN, REC(100) * 2 + 50) == 0, "truncate");
	CHECK(!strcmp(replay(&st), "ab"), "torn tail: got '%s'", seen);
	CHECK(st.torn && st.dropped_bytes == 50, "torn %d dropped %lu", st.torn,
	      (unsigned long)st.dropped_bytes);
	/* a tail shorter than a header */
	make(2, 100, NULL);
	CHECK(truncate(JN, REC(100) + 7) == 0, "truncate");
	CHECK(!strcmp(replay(&st), "a"), "torn header: got '%s'", seen);
	CHECK(st.torn, "not seen as torn");
}

static void test_bad_sum_middle(void)
{
	struct jnl_replay_stats st;

	make(3, 100, NULL);
	flip(REC(100) + (off_t)sizeof(struct jnl_rec) + 10);	/* b's payload */
	CHECK(!strcmp(replay(&st), "a"), "bad checksum in the middle: got '%s'", seen);
	CHECK(st.torn && st.dropped_bytes == (uint64_t)REC(100) * 2, "dropped %lu",
	      (unsigned long)st.dropped_bytes);
}

static void test_empty_and_missing(void)
{
	struct jnl_replay_stats st;
	int fd = openat(dirfd_, JN, O_RDWR | O_CREAT | O_TRUNC, 0600);

	close(fd);
	CHECK(!strcmp(replay(&st), "") && !st.torn && !st.records, "empty file");
	unlinkat(dirfd_, JN, 0);
	CHECK(!strcmp(replay(&st), "") && !st.torn, "missing file");
}

static void test_wrong_magic(void)
{
	struct jnl_replay_stats st;

	make(2, 100, NULL);
	flip(0);
	CHECK(!strcmp(replay(&st), "") && st.torn && st.records == 0,
	      "wrong magic: got '%s'", seen);
	CHECK(jsize() == 0, "a journal that does not check out is emptied too");
}

static void test_retired(void)
{
	struct jnl_replay_stats st;
	struct jnl j;
	char buf[8] = "xxxxxxx";
	uint64_t s[3];

	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	for (int i = 0; i < 3; i++) {
		struct iovec v = { buf, sizeof(buf) };

		buf[0] = 'a' + i;
		CHECK(jnl_append(&j, 7, &v, 1, &s[i]) == 0, "append");
	}
	{
		uint16_t type;
		uint64_t len;
		void *p;

		CHECK(jnl_read(&j, s[1], &type, &p, &len) == 0 && type == 7 &&
		      len == sizeof(buf) && *(char *)p == 'b', "read back b");
		free(p);
		CHECK(jnl_read(&j, 99, &type, &p, &len) == -ENOENT, "read back a seq not there");
	}
	CHECK(jnl_retire(&j, s[1]) != 0, "retire");
	CHECK(j.live == 2, "live %lu", (unsigned long)j.live);
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "ac"), "retired b: got '%s'", seen);

	/* all retired: emptied; the next records follow with higher seqs */
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	j.reset_at = 0;
	for (int i = 0; i < 2; i++) {
		struct iovec v = { buf, sizeof(buf) };

		buf[0] = 'a' + i;
		CHECK(jnl_append(&j, 7, &v, 1, &s[i]) == 0, "append");
	}
	jnl_retire(&j, s[0]);
	jnl_retire(&j, s[1]);
	CHECK(j.live == 0 && j.off == 0 && j.resets == 1, "emptied: live %lu off %lu",
	      (unsigned long)j.live, (unsigned long)j.off);
	{
		struct iovec v = { buf, sizeof(buf) };

		buf[0] = 'z';
		CHECK(jnl_append(&j, 7, &v, 1, &s[2]) == 0 && s[2] == 5, "seq %lu",
		      (unsigned long)s[2]);
	}
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "z"), "after emptying: got '%s'", seen);
}

/* Old records past new ones (an emptying lost in a crash): not replayed. */
static void test_stale_tail(void)
{
	struct jnl_replay_stats st;
	char old[4096];
	off_t n;
	int fd;

	make(3, 100, NULL);		/* seqs 1..3: 'a' 'b' 'c' */
	fd = openat(dirfd_, JN, O_RDONLY);
	n = pread(fd, old, sizeof(old), 0);
	close(fd);
	/* a new journal, seqs 1 and 2, then the old records 2 and 3 */
	make(2, 100, NULL);
	fd = openat(dirfd_, JN, O_RDWR);
	CHECK(pwrite(fd, old + REC(100), (size_t)(n - REC(100)), REC(100) * 2) ==
	      n - REC(100), "write");
	close(fd);
	CHECK(!strcmp(replay(&st), "ab"), "stale records past the end: got '%s'", seen);
	CHECK(st.torn, "stale tail not dropped");
}

static int apply_delta(void *arg, uint16_t type, uint64_t seq, const void *p, uint64_t len)
{
	char why[128];

	(void)seq;
	if (type != JNL_DELTA)
		return 1;
	return jnl_delta_apply(*(int *)arg, p, len, why, sizeof(why));
}

static void test_delta(void)
{
	struct jnl_replay_stats st;
	struct jnl_range r[2] = { { 4096, 4096 }, { 12288, 100 } };
	char *content = malloc(20000), *want = malloc(20000), *got = malloc(20000);
	struct stat sb;
	struct jnl j;
	uint64_t s;
	int fd, rootfd = openat(dirfd_, ".", O_RDONLY | O_DIRECTORY);

	memset(content, 'o', 16384);
	fd = openat(dirfd_, "f", O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(pwrite(fd, content, 16384, 0) == 16384, "write");
	fstat(fd, &sb);
	/* the new content: two ranges changed, cut to 12388 bytes */
	memcpy(want, content, 16384);
	memset(want + 4096, 'N', 4096);
	memset(want + 12288, 'M', 100);
	struct jnl_delta d = { .dev = sb.st_dev, .ino = sb.st_ino, .size = 12388,
			       .mtime_sec = 1000000000, .path = "f", .r = r, .n = 2 };
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(jnl_delta_append(&j, &d, want, &s) == 0, "delta append");
	CHECK(jnl_sync(&j, s) == 0, "sync");
	jnl_close(&j);
	/* a partial apply first: half of the first range */
	memset(content + 4096, 'N', 2048);
	CHECK(pwrite(fd, content + 4096, 2048, 4096) == 2048, "partial");
	for (int pass = 0; pass < 2; pass++) {
		if (pass) {	/* again, from the same journal */
			CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
			CHECK(jnl_delta_append(&j, &d, want, &s) == 0, "delta append");
			jnl_sync(&j, s);
			jnl_close(&j);
		}
		CHECK(jnl_replay(dirfd_, JN, apply_delta, &rootfd, &st) == 0, "replay");
		CHECK(st.applied == 1, "delta applied %lu skipped %lu failed %lu",
		      (unsigned long)st.applied, (unsigned long)st.skipped,
		      (unsigned long)st.failed);
		fstat(fd, &sb);
		CHECK(sb.st_size == 12388 && sb.st_mtim.tv_sec == 1000000000,
		      "size %ld mtime %ld", (long)sb.st_size, (long)sb.st_mtim.tv_sec);
		CHECK(pread(fd, got, 20000, 0) == 12388 && !memcmp(got, want, 12388),
		      "content after apply %d", pass);
	}
	/* another file under the name now: passed over, not written */
	close(fd);
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(jnl_delta_append(&j, &d, want, &s) == 0, "delta append");
	jnl_sync(&j, s);
	jnl_close(&j);
	unlinkat(dirfd_, "f", 0);
	fd = openat(dirfd_, "g", O_RDWR | O_CREAT | O_TRUNC, 0600);	/* holds f's inode? */
	close(fd);
	fd = openat(dirfd_, "f", O_RDWR | O_CREAT | O_TRUNC, 0600);
	fstat(fd, &sb);
	if (sb.st_ino != (ino_t)d.ino) {
		CHECK(jnl_replay(dirfd_, JN, apply_delta, &rootfd, &st) == 0, "replay");
		CHECK(st.skipped == 1 && st.applied == 0, "another file: applied %lu",
		      (unsigned long)st.applied);
		fstat(fd, &sb);
		CHECK(sb.st_size == 0, "another file written: %ld", (long)sb.st_size);
	}
	close(fd);
	close(rootfd);
	free(content);
	free(want);
	free(got);
}

int main(void)
{
	char dir[] = "/tmp/test_journal.XXXXXX";

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	dirfd_ = open(dir, O_RDONLY | O_DIRECTORY);
	if (chdir(dir) < 0)
		return 1;
	test_records();
	test_torn_tail();
	test_bad_sum_middle();
	test_empty_and_missing();
	test_wrong_magic();
	test_retired();
	test_stale_tail();
	test_delta();
	unlinkat(dirfd_, JN, 0);
	unlinkat(dirfd_, "f", 0);
	unlinkat(dirfd_, "g", 0);
	close(dirfd_);
	rmdir(dir);
	printf("%s\n", fails ? "FAIL" : "PASS");
	return fails ? 1 : 0;
}
