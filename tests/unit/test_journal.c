/*
 * test_journal.c - the journal (store/journal.c): records appended and
 * replayed in order; a torn tail, a bad checksum in the middle, an empty
 * file, a wrong magic and a stale tail past an emptied journal stop the
 * replay where they start; retired records are not replayed; a delta
 * record applied to its file, twice, and over a partial apply, gives the
 * same file; so does a commit intent (a new version copied over a file
 * with two names), replayed in order with a delta after it, and passed
 * over when torn, when its version is gone or another file, or when its
 * file is; notes (another reader's records) are kept across a replay, in
 * order, and hold the journal until their reader is done with them; two
 * files in turn (jnl_ring) are replayed together, in seq order; after a
 * failed sync no record of it or after it is said durable, none is
 * taken until all are retired, then the journal is emptied; a record
 * of many MiB, written in steps, replays byte for byte.  No
 * seed: the cases are fixed.  Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
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

static int drop_notes(void *arg, uint16_t type, uint64_t seq, const void *p, uint64_t len)
{
	(void)arg, (void)type, (void)seq, (void)p, (void)len;
	return 1;
}

static int collect(void *arg, uint16_t type, uint64_t seq, const void *p, uint64_t len)
{
	(void)arg;
	(void)seq;
	if ((type == 7 || type == JNL_NOTE) && len && nseen < (int)sizeof(seen) - 1)
		seen[nseen++] = *(const char *)p;
	return type == JNL_NOTE ? JNL_KEEP : 0;
}

/* Append records "a...", "b...", ... to j (n of them, each len bytes, at
 * most 4096), their seqs into seqs (unless NULL). */
static void append_n(struct jnl *j, int n, size_t len, uint64_t *seqs)
{
	char buf[4096];

	for (int i = 0; i < n; i++) {
		struct iovec v = { buf, len };
		uint64_t s;

		memset(buf, 'a' + i, len);
		CHECK(jnl_append(j, 7, &v, 1, &s) == 0, "append %d", i);
		if (seqs)
			seqs[i] = s;
	}
}

/* A journal of records "a...", "b...", ... (n of them, each len bytes). */
static void make(int n, size_t len, uint64_t *seqs)
{
	struct jnl j;

	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	append_n(&j, n, len, seqs);
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
	append_n(&j, 3, sizeof(buf), s);
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
	append_n(&j, 2, sizeof(buf), s);
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

	/* a record retired twice counts once: the journal is not emptied
	 * under the record still live, and a seq never appended changes
	 * nothing either */
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	j.reset_at = 0;
	append_n(&j, 2, sizeof(buf), s);
	CHECK(jnl_retire(&j, s[0]) != 0, "retire a");
	CHECK(jnl_retire(&j, s[0]) != 0, "retire a again: answers the seq to sync");
	CHECK(jnl_retire(&j, 999) != 0, "retire a seq never appended");
	CHECK(j.live == 1 && j.off != 0 && j.resets == 0,
	      "twice retired: live %lu off %lu resets %lu", (unsigned long)j.live,
	      (unsigned long)j.off, (unsigned long)j.resets);
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "b"), "b stays live: got '%s'", seen);
}

/* Append one record of type with payload c * len. */
static uint64_t append1(struct jnl *j, uint16_t type, char c, size_t len)
{
	char buf[64];
	struct iovec v = { buf, len };
	uint64_t s = 0;

	memset(buf, c, len);
	CHECK(jnl_append(j, type, &v, 1, &s) == 0, "append %c", c);
	return s;
}

/* Notes (another reader's records) are handed over in order with the
 * live records, never live themselves; those kept survive the replay, alone
 * and renumbered, in a journal that jnl_open goes on after; they hold it
 * (not emptied) until jnl_notes_done. */
static void test_notes(void)
{
	struct jnl_replay_stats st;
	struct jnl j;
	uint64_t a, c;
	int fd;

	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	j.reset_at = 0;
	a = append1(&j, 7, 'a', 8);
	append1(&j, JNL_NOTE, 'N', 8);
	append1(&j, 7, 'b', 8);
	append1(&j, JNL_NOTE, 'O', 8);
	CHECK(j.live == 2 && j.held, "notes are not live: live %lu", (unsigned long)j.live);
	jnl_retire(&j, a);
	CHECK(j.off != 0 && j.resets == 0, "a held journal is not emptied at a retire");
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "NbO"), "notes in order with the live: got '%s'", seen);
	CHECK(st.kept == 2 && st.applied == 1, "kept %lu applied %lu", (unsigned long)st.kept,
	      (unsigned long)st.applied);
	CHECK(jsize() == 2 * REC(8), "rewritten with the notes alone: %ld bytes", (long)jsize());
	CHECK(!strcmp(replay(&st), "NO") && st.kept == 2, "kept again: got '%s'", seen);

	/* a torn tail after them is cut off at the open; the next records
	 * follow the notes */
	fd = openat(dirfd_, JN, O_WRONLY | O_APPEND);
	CHECK(fd >= 0 && write(fd, "torn", 4) == 4, "tear");
	close(fd);
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(j.seq == 2 && j.off == 2 * REC(8) && j.held && j.live == 0 &&
	      jsize() == 2 * REC(8), "open after kept notes: seq %lu off %lu size %ld",
	      (unsigned long)j.seq, (unsigned long)j.off, (long)jsize());
	{
		size_t nl;
		char *n = jnl_take_notes(&j, &nl);

		CHECK(n && nl == 16 && !memcmp(n, "NNNNNNNNOOOOOOOO", 17),
		      "the notes' payloads, in order, for their reader");
		free(n);
		CHECK(!jnl_take_notes(&j, &nl) && nl == 0, "taken once");
	}
	j.reset_at = 0;
	c = append1(&j, 7, 'c', 8);
	CHECK(c == 3, "seq %lu follows the notes", (unsigned long)c);
	jnl_retire(&j, c);
	CHECK(j.off == 2 * REC(8) && j.resets == 1 && j.seq == 6 && jsize() == 2 * REC(8),
	      "held notes survive an emptying, alone: off %lu seq %lu",
	      (unsigned long)j.off, (unsigned long)j.seq);
	CHECK(append1(&j, 7, 'd', 8) == 7, "the next record follows them");
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "NOd") && st.kept == 2, "after the emptying: got '%s'",
	      seen);
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	j.reset_at = 0;
	jnl_notes_done(&j);
	CHECK(j.off == 0 && j.resets == 1 && !j.held, "done with the notes: emptied");
	append1(&j, JNL_NOTE, 'P', 8);
	CHECK(j.held, "a new note holds it again");
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "P"), "after emptying: got '%s'", seen);
	/* a replay whose fn keeps nothing empties the journal */
	nseen = 0;
	CHECK(jnl_replay(dirfd_, JN, drop_notes, NULL, &st) == 0 && st.skipped == 1 &&
	      jsize() == 0, "notes not kept: size %ld", (long)jsize());
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
	/* where the inode number came back the record was not replayed
	 * (without a handle it names that number alone): it is dropped
	 * here, not left to the next test's replay */
	unlinkat(dirfd_, JN, 0);
	close(fd);
	close(rootfd);
	free(content);
	free(want);
	free(got);
}

/*
 * A delta with a JNL_ZERO range (a hole of a file written through): none
 * of its bytes in the record, and its apply punches it (its blocks freed)
 * beside a range written and one past the old end, which the size grows
 * over as a hole.
 */
static void test_delta_zero(void)
{
	enum { OLD = 1 << 20, NEW = 3 << 20 };
	struct jnl_replay_stats st;
	struct jnl_range r[3] = {
		{ 4096, (256 << 10) | JNL_ZERO }, { 300000, 10 }, { NEW - 5, 5 },
	};
	char *want = calloc(1, NEW), *got = malloc(NEW), *old = malloc(OLD);
	struct stat sb;
	struct jnl j;
	uint64_t s;
	int fd, rootfd = openat(dirfd_, ".", O_RDONLY | O_DIRECTORY);

	memset(old, 'o', OLD);
	fd = openat(dirfd_, "z", O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(pwrite(fd, old, OLD, 0) == OLD && fsync(fd) == 0, "write");
	fstat(fd, &sb);
	memcpy(want, old, OLD);
	memset(want + 4096, 0, 256 << 10);
	memset(want + 300000, 'N', 10);
	memset(want + NEW - 5, 'E', 5);
	struct jnl_delta d = { .dev = sb.st_dev, .ino = sb.st_ino, .size = NEW,
			       .path = "z", .r = r, .n = 3 };
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	/* the zero range's bytes are never read: base need not hold them */
	CHECK(jnl_delta_append(&j, &d, want, &s) == 0, "delta append");
	CHECK(jnl_sync(&j, s) == 0, "sync");
	CHECK(j.off < 4096, "the zero range's bytes recorded: %lu bytes",
	      (unsigned long)j.off);
	jnl_close(&j);
	CHECK(jnl_replay(dirfd_, JN, apply_delta, &rootfd, &st) == 0, "replay");
	CHECK(st.applied == 1, "zero delta: applied %lu failed %lu",
	      (unsigned long)st.applied, (unsigned long)st.failed);
	fstat(fd, &sb);
	CHECK(sb.st_size == NEW, "size %ld", (long)sb.st_size);
	CHECK(pread(fd, got, NEW, 0) == NEW && !memcmp(got, want, NEW), "zero delta content");
	CHECK(sb.st_blocks * 512 <= OLD - (240 << 10), "the zero range not punched: %ld blocks",
	      (long)sb.st_blocks);
	close(fd);
	unlinkat(dirfd_, "z", 0);
	close(rootfd);
	free(want);
	free(got);
	free(old);
}

static int apply_any(void *arg, uint16_t type, uint64_t seq, const void *p, uint64_t len)
{
	char why[256];

	(void)seq;
	if (type == JNL_DELTA)
		return jnl_delta_apply(*(int *)arg, p, len, why, sizeof(why));
	if (type == JNL_REDO)
		return jnl_redo_apply(*(int *)arg, p, len, why, sizeof(why));
	return 1;
}

/* A file of n bytes of c, as name (created or truncated): its stat. */
static struct stat put(const char *name, char c, size_t n)
{
	char *b = malloc(n ? n : 1);
	struct stat st;
	int fd = openat(dirfd_, name, O_RDWR | O_CREAT | O_TRUNC, 0600);

	memset(b, c, n);
	CHECK(fd >= 0 && pwrite(fd, b, n, 0) == (ssize_t)n, "write %s", name);
	fstat(fd, &st);
	close(fd);
	free(b);
	return st;
}

/* Does name hold n bytes of c, then (where m) m bytes of d at off? */
static bool holds(const char *name, char c, size_t n, off_t off, char d, size_t m)
{
	char *b = malloc(n + 1);
	int fd = openat(dirfd_, name, O_RDONLY);
	bool ok = fd >= 0 && pread(fd, b, n + 1, 0) == (ssize_t)n;

	for (size_t i = 0; ok && i < n; i++)
		ok = b[i] == ((off_t)i >= off && i < (size_t)off + m ? d : c);
	if (fd >= 0)
		close(fd);
	free(b);
	return ok;
}

/* Append intent r and, with d, delta d (bytes base) after it; synced. */
static void intent(const struct jnl_redo *r, const struct jnl_delta *d, const void *base)
{
	struct jnl j;
	uint64_t s;

	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(jnl_redo_append(&j, r, &s) == 0, "intent append");
	if (d)
		CHECK(jnl_delta_append(&j, d, base, &s) == 0, "delta append");
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	jnl_close(&j);
}

/*
 * Commit intents (JNL_REDO): a new version copied over a file with two
 * names, replayed after a copy cut short, then after a finished one (the
 * same file); with a delta of that file after it, in order; torn, or with
 * its version gone or of another size, or its file another one: passed
 * over, the file untouched.
 */
static void test_redo(void)
{
	struct jnl_replay_stats st;
	int rootfd = openat(dirfd_, ".", O_RDONLY | O_DIRECTORY);
	struct stat fs_ = put("h", 'o', 20000), vs = put(".v1", 'N', 12000), a, b;

	CHECK(linkat(dirfd_, "h", dirfd_, "h2", 0) == 0, "link");
	struct jnl_redo r = { .dev = fs_.st_dev, .ino = fs_.st_ino, .path = "h",
			      .version = ".v1", .vino = vs.st_ino, .size = 12000 };
	/* a copy cut short: the first 5000 bytes new */
	int fd = openat(dirfd_, "h", O_RDWR);
	char half[5000];

	memset(half, 'N', sizeof(half));
	CHECK(pwrite(fd, half, sizeof(half), 0) == (ssize_t)sizeof(half), "half");
	close(fd);
	for (int pass = 0; pass < 2; pass++) {
		intent(&r, NULL, NULL);
		CHECK(jnl_replay(dirfd_, JN, apply_any, &rootfd, &st) == 0, "replay");
		CHECK(st.applied == 1, "intent %d: applied %lu skipped %lu failed %lu", pass,
		      (unsigned long)st.applied, (unsigned long)st.skipped,
		      (unsigned long)st.failed);
		CHECK(holds("h2", 'N', 12000, 0, 0, 0), "the other name after intent %d", pass);
		fstatat(dirfd_, "h", &a, 0);
		fstatat(dirfd_, "h2", &b, 0);
		CHECK(a.st_ino == fs_.st_ino && b.st_ino == fs_.st_ino, "not one inode");
		CHECK(jsize() == 0, "not emptied");
	}
	/* an intent, then a delta of the file: in that order */
	struct jnl_range dr = { 100, 50 };
	char *m = malloc(12000);

	memset(m, 'D', 12000);
	put(".v1", 'P', 12000);
	fstatat(dirfd_, ".v1", &vs, 0);
	r.vino = vs.st_ino;
	struct jnl_delta d = { .dev = fs_.st_dev, .ino = fs_.st_ino, .size = 12000,
			       .path = "h2", .r = &dr, .n = 1 };
	intent(&r, &d, m);
	CHECK(jnl_replay(dirfd_, JN, apply_any, &rootfd, &st) == 0 && st.applied == 2,
	      "intent and delta: applied %lu", (unsigned long)st.applied);
	CHECK(holds("h", 'P', 12000, 100, 'D', 50), "the delta over the intent's version");
	free(m);
	/* torn: dropped, the file untouched */
	put(".v1", 'Q', 12000);
	fstatat(dirfd_, ".v1", &vs, 0);
	r.vino = vs.st_ino;
	intent(&r, NULL, NULL);
	CHECK(truncate(JN, jsize() - 3) == 0, "truncate");
	CHECK(jnl_replay(dirfd_, JN, apply_any, &rootfd, &st) == 0 && st.torn &&
	      st.records == 0, "a torn intent: records %lu", (unsigned long)st.records);
	CHECK(holds("h", 'P', 12000, 100, 'D', 50), "a torn intent was applied");
	/* its version of another size (not the one recorded), then gone */
	r.size = 11000;
	intent(&r, NULL, NULL);
	CHECK(jnl_replay(dirfd_, JN, apply_any, &rootfd, &st) == 0 && st.skipped == 1,
	      "version of another size: skipped %lu", (unsigned long)st.skipped);
	r.size = 12000;
	unlinkat(dirfd_, ".v1", 0);
	intent(&r, NULL, NULL);
	CHECK(jnl_replay(dirfd_, JN, apply_any, &rootfd, &st) == 0 && st.skipped == 1,
	      "version gone: skipped %lu", (unsigned long)st.skipped);
	CHECK(holds("h", 'P', 12000, 100, 'D', 50), "written without its version");
	/* its file another one now (both names replaced) */
	put(".v1", 'R', 12000);
	fstatat(dirfd_, ".v1", &vs, 0);
	r.vino = vs.st_ino;
	unlinkat(dirfd_, "h", 0);
	unlinkat(dirfd_, "h2", 0);
	put("x", 'x', 10);	/* may take h's inode number */
	put("h", 'z', 10);
	intent(&r, NULL, NULL);
	CHECK(jnl_replay(dirfd_, JN, apply_any, &rootfd, &st) == 0, "replay");
	fstatat(dirfd_, "h", &a, 0);
	if (a.st_ino != fs_.st_ino)
		CHECK(st.skipped == 1 && holds("h", 'z', 10, 0, 0, 0), "another file written");
	/* a payload that does not parse */
	{
		char why[64];

		CHECK(jnl_redo_apply(rootfd, "xx", 2, why, sizeof(why)) == -EINVAL, "parse");
	}
	unlinkat(dirfd_, ".v1", 0);
	unlinkat(dirfd_, "h", 0);
	unlinkat(dirfd_, "x", 0);
	close(rootfd);
}

static off_t jsize1(void)
{
	struct stat st;

	return fstatat(dirfd_, JN ".1", &st, 0) == 0 ? st.st_size : -1;
}

/*
 * Two files in turn (jnl_ring): past `at` bytes the records go to the
 * second file, and back to the first (written again from its start) only
 * once no record of the first is live; records are read back from either
 * file; a replay takes both files' live records in seq order and not an
 * earlier round's left past a taken-again file's records; a note is
 * refused once the second file was taken.
 */
static void test_ring(void)
{
	struct jnl_replay_stats st;
	struct jnl j;
	uint64_t s[8], t[8], u[2], len;
	uint16_t type;
	void *p;

	unlinkat(dirfd_, JN, 0);
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(jnl_ring(&j, 3 * REC(100)), "ring on an empty journal");
	CHECK(jsize1() == 0, "the second file made: %ld", (long)jsize1());
	append_n(&j, 3, 100, s);		/* a b c in the first file */
	CHECK(j.wfd == j.fd && j.off == 3 * REC(100), "first file: off %lu",
	      (unsigned long)j.off);
	append_n(&j, 4, 100, t);		/* a: to the second, after START */
	CHECK(j.wfd == j.fd1 && j.resets == 1 && j.cur_start == t[0] - 1,
	      "second file taken: resets %lu start %lu", (unsigned long)j.resets,
	      (unsigned long)j.cur_start);
	CHECK(j.off == REC(0) + 4 * REC(100) && jsize1() == REC(0) + 4 * REC(100),
	      "four records after START in the second: off %lu", (unsigned long)j.off);
	CHECK(j.synced >= s[2], "the first file's records synced at the change");
	/* b of the first file still live: no change back */
	jnl_retire(&j, s[0]);
	jnl_retire(&j, s[2]);
	append_n(&j, 1, 100, NULL);
	CHECK(j.wfd == j.fd1 && j.resets == 1, "no change back while b is live");
	CHECK(jnl_read(&j, s[1], &type, &p, &len) == 0 && type == 7 && *(char *)p == 'b',
	      "b read back from the first file");
	free(p);
	CHECK(jnl_read(&j, t[3], &type, &p, &len) == 0 && type == 7 && *(char *)p == 'd',
	      "d read back from the second file");
	free(p);
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	/* a crash now: the first file's b, then the second file's a b c d
	 * a (the retire records of the first file's a and c among them) */
	{
		struct jnl j2;

		CHECK(jnl_open(&j2, dirfd_, JN) == -ENOTEMPTY,
		      "no opening over a second file that holds records");
	}
	CHECK(!strcmp(replay(&st), "babcda"), "both files in seq order: got '%s'", seen);
	CHECK(jsize() == 0 && jsize1() == 0, "both emptied by the replay: %ld %ld",
	      (long)jsize(), (long)jsize1());
	jnl_close(&j);

	/* the change back once b is retired: the first file written again
	 * from its start, what it held past the new records not replayed */
	unlinkat(dirfd_, JN ".1", 0);
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(jnl_ring(&j, 3 * REC(100)), "ring");
	append_n(&j, 3, 100, s);
	append_n(&j, 3, 100, t);		/* second file */
	for (int i = 0; i < 3; i++)
		jnl_retire(&j, s[i]);		/* retire records: second file */
	append_n(&j, 2, 100, u);		/* the second is long enough: first */
	CHECK(j.wfd == j.fd && j.resets == 2 && j.off == REC(0) + 2 * REC(100),
	      "the first file taken again: resets %lu off %lu", (unsigned long)j.resets,
	      (unsigned long)j.off);
	CHECK(jsize() == 3 * REC(100), "written over, not grown: %ld", (long)jsize());
	CHECK(jnl_read(&j, t[1], &type, &p, &len) == 0 && *(char *)p == 'b',
	      "b of the second file read back");
	free(p);
	{
		char n = 'n';
		struct iovec v = { &n, 1 };
		uint64_t q;

		CHECK(jnl_append(&j, JNL_NOTE, &v, 1, &q) == -EOPNOTSUPP,
		      "a note refused once the second file was taken");
	}
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "abcab"), "second file then first: got '%s'", seen);
	CHECK(!st.torn && st.applied == 5, "an earlier round is no torn tail: torn %d applied %lu",
	      st.torn, (unsigned long)st.applied);

	/* the first record after a START torn: the replay stops there, and
	 * reads nothing of the earlier round past it (its seqs do not
	 * follow) */
	unlinkat(dirfd_, JN ".1", 0);
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(jnl_ring(&j, 3 * REC(100)), "ring");
	append_n(&j, 3, 100, s);
	append_n(&j, 3, 100, t);
	for (int i = 0; i < 3; i++)
		jnl_retire(&j, s[i]);
	append_n(&j, 1, 100, u);		/* the first file again */
	CHECK(j.wfd == j.fd && j.off == REC(0) + REC(100), "first file again");
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	jnl_close(&j);
	flip(REC(0) + REC(50));			/* u's payload */
	CHECK(!strcmp(replay(&st), "abc"), "stops at the torn record: got '%s'", seen);

	/* no ring where jnl_open found records, or the second file holds some */
	make(1, 10, NULL);
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(!jnl_ring(&j, 4096), "no ring over a journal that holds records");
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "a"), "the record: got '%s'", seen);
	unlinkat(dirfd_, JN ".1", 0);
}

/* A failed sync (TIERFS_FAULT=journal_sync_eio: it ran, then says EIO, as
 * a failing disk may): none of the records it was for is ever said
 * durable, no record is taken while one of them is live (a replay would
 * stop at a lost one, so nothing after it could be made durable), and
 * once all are retired the journal is emptied and works again.  The same
 * at a change of file (journal_switch_eio), both files emptied. */
static void test_sync_failure(void)
{
	struct jnl_replay_stats st;
	struct jnl j;
	uint64_t s[3], u[10], c, rs;
	char buf[100];
	int n;
	struct iovec v = { buf, sizeof(buf) };

	memset(buf, 'c', sizeof(buf));
	unlinkat(dirfd_, JN, 0);
	unlinkat(dirfd_, JN ".1", 0);
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	append_n(&j, 2, 100, s);
	setenv("TIERFS_FAULT", "journal_sync_eio", 1);
	CHECK(jnl_sync(&j, s[1]) == -EIO, "the failed sync");
	unsetenv("TIERFS_FAULT");
	CHECK(jnl_sync(&j, s[0]) == -EIO, "a's sync after b's failed: not durable");
	CHECK(jnl_sync(&j, s[1]) == -EIO, "b's sync again: not durable");
	CHECK(jnl_append(&j, 7, &v, 1, &c) == -EIO, "a record while a and b are live");
	CHECK(jnl_failed(&j), "failed while a and b are live");
	rs = jnl_retire(&j, s[0]);
	CHECK(rs && jnl_sync(&j, rs) == -EIO, "a's retirement is not durable");
	jnl_retire(&j, s[1]);
	CHECK(!jnl_failed(&j) && j.off == 0 && jsize() == 0,
	      "emptied once a and b are retired: off %lu size %ld", (unsigned long)j.off,
	      (long)jsize());
	CHECK(jnl_append(&j, 7, &v, 1, &c) == 0, "a record once a and b are retired");
	CHECK(j.off == REC(100) && jsize() == REC(100), "emptied, then c: off %lu size %ld",
	      (unsigned long)j.off, (long)jsize());
	CHECK(jnl_sync(&j, c) == 0, "c durable");
	CHECK(jnl_sync(&j, rs) == 0, "a's retirement: the emptied journal holds no a");
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "c"), "c alone: got '%s'", seen);

	/* at the change back to the first file: records in both files, and
	 * t, u... of the second file live across the failure */
	unlinkat(dirfd_, JN ".1", 0);
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(jnl_ring(&j, 3 * REC(100)), "ring");
	append_n(&j, 3, 100, s);
	for (int i = 0; i < 3; i++)
		jnl_retire(&j, s[i]);
	CHECK(j.wfd == j.fd1 && j.resets == 1, "the second file taken");
	setenv("TIERFS_FAULT", "journal_switch_eio", 1);
	for (n = 0; n < 10 && jnl_append(&j, 7, &v, 1, &u[n]) == 0; n++)
		;
	unsetenv("TIERFS_FAULT");
	CHECK(n >= 1 && n < 10 && j.failures == 1 && j.wfd == j.fd1,
	      "the change back failed after %d records: failures %lu", n,
	      (unsigned long)j.failures);
	CHECK(jnl_sync(&j, u[0]) == -EIO, "a record of the second file: not durable");
	CHECK(jsize1() > 0, "the second file holds records");
	for (int i = 0; i < n - 1; i++)
		jnl_retire(&j, u[i]);
	CHECK(jnl_append(&j, 7, &v, 1, &c) == -EIO, "a record while one is live");
	jnl_retire(&j, u[n - 1]);
	CHECK(jnl_append(&j, 7, &v, 1, &c) == 0 && jnl_sync(&j, c) == 0,
	      "a record once all are retired");
	CHECK(j.wfd == j.fd && jsize() == REC(100) && jsize1() == 0,
	      "both emptied, c in the first: %ld %ld", (long)jsize(), (long)jsize1());
	jnl_close(&j);
	CHECK(!strcmp(replay(&st), "c"), "the new c alone: got '%s'", seen);
	unlinkat(dirfd_, JN ".1", 0);
}

/* What test_large's replay found: the payload of its one record. */
static unsigned char *big_seen;
static uint64_t big_len;

static int collect_big(void *arg, uint16_t type, uint64_t seq, const void *p, uint64_t len)
{
	(void)arg, (void)seq;
	if (type == 7 && !big_seen && (big_seen = malloc(len))) {
		memcpy(big_seen, p, len);
		big_len = len;
	}
	return 0;
}

/*
 * A record of ~9 MiB written in steps (JNL_STEP): 1,500 iovecs (more than
 * IOV_MAX) of sizes that fall across the steps' ends, one of them longer
 * than a step, then a small record after it: the replay gives both, the
 * large one byte for byte.
 */
static void test_large(void)
{
	enum { NV = 1500 };
	static struct iovec v[NV];
	struct jnl_replay_stats st;
	size_t total = 0, off = 0;
	unsigned char *buf;
	struct jnl j;
	uint64_t s;

	for (int i = 0; i < NV; i++) {
		v[i].iov_len = i == 700 ? (3u << 20) + 17 : 1 + (size_t)(i * 7919) % 8191;
		total += v[i].iov_len;
	}
	buf = malloc(total);
	CHECK(buf != NULL, "malloc");
	if (!buf)
		return;
	for (size_t k = 0; k < total; k++)
		buf[k] = (unsigned char)(k * 131 + k / 4093);
	for (int i = 0; i < NV; i++) {
		v[i].iov_base = buf + off;
		off += v[i].iov_len;
	}
	CHECK(jnl_open(&j, dirfd_, JN) == 0, "open");
	CHECK(jnl_append(&j, 7, v, NV, &s) == 0, "append %zu bytes", total);
	append_n(&j, 1, 10, NULL);
	CHECK(jnl_sync(&j, j.seq) == 0, "sync");
	CHECK(j.off == 2 * sizeof(struct jnl_rec) + total + 10, "offset %lu",
	      (unsigned long)j.off);
	jnl_close(&j);
	big_seen = NULL;
	CHECK(jnl_replay(dirfd_, JN, collect_big, NULL, &st) == 0, "replay");
	CHECK(st.records == 2 && !st.torn, "records %lu", (unsigned long)st.records);
	CHECK(big_seen && big_len == total && !memcmp(big_seen, buf, total),
	      "the large record's %zu bytes replayed (%lu)", total, (unsigned long)big_len);
	free(big_seen);
	free(buf);
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
	test_notes();
	test_stale_tail();
	test_delta();
	test_delta_zero();
	test_redo();
	test_ring();
	test_sync_failure();
	test_large();
	unlinkat(dirfd_, JN, 0);
	unlinkat(dirfd_, JN ".1", 0);
	unlinkat(dirfd_, "f", 0);
	unlinkat(dirfd_, "g", 0);
	close(dirfd_);
	rmdir(dir);
	printf("%s\n", fails ? "FAIL" : "PASS");
	return fails ? 1 : 0;
}
