/*
 * bench_io.c - tierfs I/O throughput benchmark.
 *
 * Measures, in one run, the write and read throughput of a set of target
 * directories (a tierfs mount, a plain directory on the SSD that backs it,
 * /dev/shm, ...) plus the raw O_DIRECT bandwidth of the SSD, and prints one
 * table.  The raw number is the reference for the tierfs target "flush to
 * SSD >= 90% of raw O_DIRECT bandwidth".
 *
 * Design
 *
 *  - One run = (target, block size B, writers J).  The sweep runs every
 *    combination of the -b and -j lists on every target: block size outer,
 *    writers next, targets inner, so targets are compared under the same
 *    conditions one after the other.
 *
 *  - Data.  One buffer of random bytes is generated before anything is
 *    timed.  Every block written (one write() call of B bytes) is that
 *    buffer with a 16-byte tag stamped at its start: a magic number, a
 *    per-run random id, the file index and the block's file offset.  Files
 *    therefore differ from each other and from earlier runs, and a block
 *    that comes back from the wrong file, the wrong offset or a stale run
 *    is caught.  Reads check every block's tag and its last 16 bytes
 *    against the random buffer.
 *
 *  - Write phase.  J threads, each owning a contiguous slice of the N
 *    files, wait on a barrier and then open/write/close their files.  The
 *    phase lasts from the first open (earliest thread start) to the last
 *    close (latest thread end): close is included, since tierfs promises
 *    that close() returns once the data is in a cache tier.
 *
 *  - Background flush (tierfs only).  If getxattr(dir, "user.tierfs.stats")
 *    returns JSON holding "flush_backlog" or "backlog_bytes", the target is
 *    tierfs-aware: right after the write phase the xattr is polled (1 ms)
 *    until every such key reads 0.  "drain" is the time from the end of the
 *    write phase to backlog 0; "bgflush" is N*S over the time from the
 *    first open to backlog 0, i.e. the rate at which the data reached the
 *    SSD while the writers ran and after.  Targets without the xattr are
 *    skipped silently.  Before each write phase such a target is also
 *    waited on until its backlog is 0, so runs don't overlap.
 *
 *  - Flush phase (--fsync).  After the write phase (and the drain wait),
 *    J threads reopen their files read-only, fsync and close them.  "flush"
 *    is N*S over the time from the first open of the write phase to the
 *    last fsync's close: the end-to-end time to durable data.
 *
 *  - Read phase.  J threads read their files back with B-byte read()
 *    calls, to EOF, verifying every block.  By default the data is read
 *    back at once ("cached"); --drop LABEL makes the untimed step
 *    fdatasync + posix_fadvise(POSIX_FADV_DONTNEED) run on that target's
 *    files before the read phase, so a plain directory is read from disk.
 *
 *  - Raw (--raw DIR).  N files of S bytes are written in DIR with O_DIRECT
 *    through one io_uring kept QD 32 deep with 1 MiB blocks from
 *    posix_memalign'ed buffers; when a file's last write completes, an
 *    IORING_OP_FSYNC (datasync) is queued on the same ring and the file is
 *    closed when it completes, so the queue never drains between files.
 *    The phase lasts from the first open to the last close.  The files are
 *    then read back the same way with O_DIRECT (no page cache involved).
 *
 *  - Files are named bench_io.<B>.j<J>.<index> (bench_io.raw.<index> for
 *    the raw pass) and removed after each run unless --keep is given.  A
 *    target directory that did not exist is created, and removed at exit
 *    if it is empty.  After cleanup of a plain target, syncfs() settles
 *    the file system before the next run (untimed).
 *
 *  - --repeat R runs every (target, B, J) R times, interleaved with the
 *    other targets, and the table shows the median of each column: where
 *    fresh memory is slow to fault in (virtual machines) single runs of
 *    page cache and tmpfs writes vary a lot.
 *
 *  - GB/s means 10^9 bytes per second; sizes given on the command line
 *    take binary suffixes (K = 1024).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define MAX_TARGETS	16
#define MAX_LIST	16
#define MAX_WRITERS	64
#define TAG_MAGIC	0x3162736672656974ull	/* "tierfsb1" */
#define STATS_XATTR	"user.tierfs.stats"
#define POLL_NS		1000000ull		/* stats poll period: 1 ms */
#define RAW_QD		32
#define RAW_BS		(1u << 20)
#define RAW_ALIGN	4096u
#define RAW_FSYNC_BIT	(1ull << 63)
#define NS		1000000000.0
#define PATH_LEN	(PATH_MAX + 128)	/* a target dir + a file name */

enum op { OP_WRITE, OP_FSYNC, OP_READ };

struct target {
	char label[64];
	char dir[PATH_MAX];
	bool created;		/* we made dir: remove it at exit if empty */
	bool stats;		/* exposes the tierfs stats xattr */
	bool drop;		/* drop the page cache before reading */
};

struct result {
	int tgt;
	size_t bs;
	int nwr;
	bool failed;
	double write_s;		/* first open .. last close */
	double read_s;
	double flush_s;		/* first open .. last fsync (--fsync) */
	int bg;			/* 0: no stats, 1: drained, 2: timed out */
	double drain_s;		/* end of write phase .. backlog 0 */
};

struct opts {
	long nfiles;
	size_t fsize;
	size_t bs[MAX_LIST];
	int nbs;
	int nwr[MAX_LIST];
	int nnwr;
	int repeat;
	bool fsync;
	bool keep;
	const char *ref;
	const char *raw;
	double drain_timeout;
	struct target tgt[MAX_TARGETS];
	int ntgt;
	const char *drop[MAX_TARGETS];
	int ndrop;
};

/* what a worker thread needs to know about its run */
struct run {
	const struct target *t;
	size_t bs;
	int nwr;
	uint32_t id;		/* random per run: stale data fails the tags */
};

struct worker {
	pthread_t thr;
	pthread_barrier_t *bar;
	const struct run *run;
	enum op op;
	long first, last;	/* files [first, last) */
	uint8_t *buf;
	uint64_t t0, t1;
	int err;
	char msg[PATH_LEN + 128];
};

static struct opts o = {
	.nfiles = 64,
	.fsize = 64ull << 20,
	.repeat = 1,
	.ref = "shm",
	.drain_timeout = 300,
};

static uint8_t *rnd;		/* random bytes, generated once */
static size_t rnd_size;

/* ---- helpers ---------------------------------------------------------- */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("bench_io: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

static void *xmalloc_aligned(size_t size)
{
	void *p;

	if (posix_memalign(&p, RAW_ALIGN, size ? size : 1))
		die("out of memory (%zu bytes)", size);
	return p;
}

/* "64M", "4k", "1G", "512" -> bytes; 0 on a malformed value */
static size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return 0;
	switch (toupper((unsigned char)*end)) {
	case 'K': shift = 10; end++; break;
	case 'M': shift = 20; end++; break;
	case 'G': shift = 30; end++; break;
	case 'T': shift = 40; end++; break;
	}
	if (shift && (*end == 'i' || *end == 'I'))
		end++;
	if (shift && (*end == 'B' || *end == 'b'))
		end++;
	if (*end || v > (SIZE_MAX >> shift))
		return 0;
	return (size_t)v << shift;
}

static const char *fmt_size(size_t v, char *buf, size_t len)
{
	static const char sfx[] = "KMGT";
	int i = -1;

	while (v && v % 1024 == 0 && i < 3) {
		v /= 1024;
		i++;
	}
	if (i < 0)
		snprintf(buf, len, "%zu", v);
	else
		snprintf(buf, len, "%zu%c", v, sfx[i]);
	return buf;
}

static double gbps(double bytes, double secs)
{
	return secs > 0 ? bytes / secs / 1e9 : 0;
}

static void file_path(char *buf, size_t len, const struct run *r, long i)
{
	char b[32];

	snprintf(buf, len, "%s/bench_io.%s.j%d.%04ld", r->t->dir,
		 fmt_size(r->bs, b, sizeof(b)), r->nwr, i);
}

static void fill_random(uint8_t *p, size_t len)
{
	uint64_t x = now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
	size_t i;

	for (i = 0; i < len; i += 8) {
		uint64_t v;

		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		v = x * 0x2545f4914f6cdd1dull;
		memcpy(p + i, &v, len - i < 8 ? len - i : 8);
	}
}

static uint32_t random_u32(void)
{
	uint64_t x = now_ns() * 0x9e3779b97f4a7c15ull;

	return (uint32_t)(x >> 32) ^ (uint32_t)getpid();
}

/* ---- block tags ------------------------------------------------------- */

struct blk_tag {
	uint64_t id;		/* TAG_MAGIC ^ run id << 32 ^ file index */
	uint64_t off;		/* file offset of the block */
};

static void tag_stamp(uint8_t *p, size_t len, uint32_t run, uint32_t file,
		      uint64_t off)
{
	struct blk_tag t = {
		.id = TAG_MAGIC ^ ((uint64_t)run << 32) ^ file,
		.off = off,
	};

	memcpy(p, &t, len < sizeof(t) ? len : sizeof(t));
}

/* a block read back: its tag, and its last 16 bytes against rnd */
static bool tag_check(const uint8_t *p, size_t len, uint32_t run,
		      uint32_t file, uint64_t off)
{
	uint8_t want[sizeof(struct blk_tag)];
	size_t n = len < sizeof(want) ? len : sizeof(want);

	tag_stamp(want, n, run, file, off);
	if (memcmp(p, want, n))
		return false;
	if (len >= 2 * sizeof(want) &&
	    memcmp(p + len - sizeof(want), rnd + len - sizeof(want),
		   sizeof(want)))
		return false;
	return true;
}

/* ---- tierfs stats xattr ---------------------------------------------- */

static bool json_value_busy(const char *q)
{
	char *end;
	int depth = 0;

	if (*q != '{' && *q != '[') {
		if (!isdigit((unsigned char)*q) && *q != '-')
			return false;
		return strtod(q, &end) != 0;
	}
	/* an object or array: busy if any number in it is non-zero */
	for (; *q; q++) {
		if (*q == '{' || *q == '[') {
			depth++;
		} else if (*q == '}' || *q == ']') {
			if (--depth == 0)
				break;
		} else if (*q == ':' || *q == ',') {
			const char *v = q + 1;

			while (isspace((unsigned char)*v))
				v++;
			if ((isdigit((unsigned char)*v) || *v == '-') &&
			    strtod(v, &end) != 0)
				return true;
		}
	}
	return false;
}

/* 1: something left to flush, 0: backlog 0, -1: no backlog key */
static int json_backlog(const char *json)
{
	static const char *const keys[] = {
		"\"flush_backlog\"", "\"backlog_bytes\"",
	};
	bool found = false, busy = false;
	size_t k;

	for (k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
		const char *p = json;

		while ((p = strstr(p, keys[k]))) {
			const char *q = p + strlen(keys[k]);

			p = q;
			while (isspace((unsigned char)*q))
				q++;
			if (*q != ':')
				continue;
			q++;
			while (isspace((unsigned char)*q))
				q++;
			found = true;
			if (json_value_busy(q))
				busy = true;
		}
	}
	return found ? busy : -1;
}

/* 1: backlog, 0: none, -1: no stats xattr (or no backlog key in it) */
static int stats_backlog(const char *dir)
{
	static __thread char *buf;
	static __thread size_t cap;
	ssize_t n;

	for (;;) {
		if (!buf) {
			cap = 4096;
			buf = malloc(cap);
			if (!buf)
				return -1;
		}
		n = getxattr(dir, STATS_XATTR, buf, cap - 1);
		if (n >= 0)
			break;
		if (errno != ERANGE)
			return -1;
		n = getxattr(dir, STATS_XATTR, NULL, 0);
		if (n < 0)
			return -1;
		free(buf);
		cap = (size_t)n * 2 + 4096;
		buf = malloc(cap);
		if (!buf)
			return -1;
	}
	buf[n] = 0;
	return json_backlog(buf);
}

/* 0: drained (at *t_done), 1: timed out, -1: no stats */
static int wait_drained(const char *dir, double timeout, uint64_t *t_done)
{
	uint64_t start = now_ns();
	uint64_t limit = start + (uint64_t)(timeout * NS);
	struct timespec ts = { 0, POLL_NS };
	int b;

	for (;;) {
		b = stats_backlog(dir);
		if (t_done)
			*t_done = now_ns();
		if (b <= 0)
			return b;
		if (now_ns() > limit)
			return 1;
		nanosleep(&ts, NULL);
	}
}

/* ---- worker threads -------------------------------------------------- */

static void wfail(struct worker *w, const char *what, const char *path)
{
	if (w->err)
		return;
	w->err = errno ? errno : EIO;
	snprintf(w->msg, sizeof(w->msg), "%s %s: %s", what, path,
		 strerror(w->err));
}

static int write_full(int fd, const uint8_t *p, size_t len)
{
	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (n == 0) {
			errno = EIO;
			return -1;
		}
		p += n;
		len -= n;
	}
	return 0;
}

/* bytes read (short only at EOF), or -1 */
static ssize_t read_full(int fd, uint8_t *p, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, p + got, len - got);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (n == 0)
			break;
		got += n;
	}
	return got;
}

static void do_write(struct worker *w, const char *path, long i)
{
	const struct run *r = w->run;
	uint64_t off;
	int fd;

	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return wfail(w, "open", path);
	for (off = 0; off < o.fsize; off += r->bs) {
		size_t len = o.fsize - off < r->bs ? o.fsize - off : r->bs;

		tag_stamp(w->buf, len, r->id, (uint32_t)i, off);
		if (write_full(fd, w->buf, len)) {
			wfail(w, "write", path);
			close(fd);
			return;
		}
	}
	if (close(fd))
		wfail(w, "close", path);
}

static void do_fsync(struct worker *w, const char *path)
{
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return wfail(w, "open", path);
	if (fsync(fd))
		wfail(w, "fsync", path);
	if (close(fd))
		wfail(w, "close", path);
}

static void do_read(struct worker *w, const char *path, long i)
{
	const struct run *r = w->run;
	uint64_t off;
	ssize_t n;
	int fd;

	fd = open(path, O_RDONLY);
	if (fd < 0)
		return wfail(w, "open", path);
	for (off = 0; off < o.fsize; off += r->bs) {
		size_t len = o.fsize - off < r->bs ? o.fsize - off : r->bs;

		n = read_full(fd, w->buf, len);
		if (n < 0) {
			wfail(w, "read", path);
			goto out;
		}
		if ((size_t)n < len) {
			w->err = EIO;
			snprintf(w->msg, sizeof(w->msg),
				 "read %s: short file (%" PRIu64 " bytes)",
				 path, off + n);
			goto out;
		}
		if (!tag_check(w->buf, len, r->id, (uint32_t)i, off)) {
			w->err = EIO;
			snprintf(w->msg, sizeof(w->msg),
				 "read %s: bad data in block at offset %"
				 PRIu64, path, off);
			goto out;
		}
	}
	/* one more read: the file must end here */
	n = read_full(fd, w->buf, 1);
	if (n != 0) {
		if (n < 0) {
			wfail(w, "read", path);
		} else {
			w->err = EIO;
			snprintf(w->msg, sizeof(w->msg),
				 "read %s: longer than %zu bytes", path,
				 o.fsize);
		}
	}
out:
	if (close(fd))
		wfail(w, "close", path);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	char path[PATH_LEN];
	long i;

	pthread_barrier_wait(w->bar);
	w->t0 = now_ns();
	for (i = w->first; i < w->last && !w->err; i++) {
		file_path(path, sizeof(path), w->run, i);
		switch (w->op) {
		case OP_WRITE:
			do_write(w, path, i);
			break;
		case OP_FSYNC:
			do_fsync(w, path);
			break;
		case OP_READ:
			do_read(w, path, i);
			break;
		}
	}
	w->t1 = now_ns();
	return NULL;
}

/*
 * Run one phase with r->nwr threads; *t0 = first thread start, *t1 = last
 * thread end.  Returns 0, or -1 after printing the first error.
 */
static int run_phase(const struct run *r, enum op op, uint64_t *t0,
		     uint64_t *t1)
{
	static const char *const names[] = { "write", "fsync", "read" };
	struct worker *w;
	pthread_barrier_t bar;
	int nw = r->nwr, k, rc = 0;

	if (nw > o.nfiles)
		nw = (int)o.nfiles;
	w = calloc(nw, sizeof(*w));
	if (!w)
		die("out of memory");
	pthread_barrier_init(&bar, NULL, nw);
	for (k = 0; k < nw; k++) {
		w[k].bar = &bar;
		w[k].run = r;
		w[k].op = op;
		w[k].first = o.nfiles * k / nw;
		w[k].last = o.nfiles * (k + 1) / nw;
		w[k].buf = xmalloc_aligned(r->bs);
		/* the random pattern, copied before anything is timed */
		memcpy(w[k].buf, rnd, r->bs);
		if (pthread_create(&w[k].thr, NULL, worker_main, &w[k]))
			die("pthread_create failed");
	}
	*t0 = UINT64_MAX;
	*t1 = 0;
	for (k = 0; k < nw; k++) {
		pthread_join(w[k].thr, NULL);
		if (w[k].t0 < *t0)
			*t0 = w[k].t0;
		if (w[k].t1 > *t1)
			*t1 = w[k].t1;
		if (w[k].err && !rc) {
			fprintf(stderr, "bench_io: %s [%s]: %s\n", r->t->label,
				names[op], w[k].msg);
			rc = -1;
		}
		free(w[k].buf);
	}
	pthread_barrier_destroy(&bar);
	free(w);
	return rc;
}

/* untimed: write back and evict a target's files from the page cache */
static void drop_cache(const struct run *r)
{
	char path[PATH_LEN];
	long i;
	int fd;

	for (i = 0; i < o.nfiles; i++) {
		file_path(path, sizeof(path), r, i);
		fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		if (fdatasync(fd))
			fprintf(stderr, "bench_io: fdatasync %s: %s\n", path,
				strerror(errno));
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
}

static void cleanup_run(const struct run *r)
{
	char path[PATH_LEN];
	long i;
	int fd;

	if (o.keep)
		return;
	for (i = 0; i < o.nfiles; i++) {
		file_path(path, sizeof(path), r, i);
		unlink(path);
	}
	if (r->t->stats)
		return;
	fd = open(r->t->dir, O_RDONLY | O_DIRECTORY);
	if (fd >= 0) {
		syncfs(fd);
		close(fd);
	}
}

static void run_one(const struct target *t, size_t bs, int nwr,
		    struct result *res)
{
	struct run r = { .t = t, .bs = bs, .nwr = nwr, .id = random_u32() };
	double bytes = (double)o.nfiles * o.fsize;
	uint64_t w0, w1, f0, f1, r0, r1, td;
	char b[32];

	memset(res, 0, sizeof(*res));
	res->bs = bs;
	res->nwr = nwr;

	/* don't let an earlier run's flush overlap this one */
	if (t->stats && stats_backlog(t->dir) == 1) {
		fprintf(stderr, "%s: waiting for the flush backlog to drain "
			"(at most %g s)\n", t->label, o.drain_timeout);
		if (wait_drained(t->dir, o.drain_timeout, NULL) == 1)
			fprintf(stderr, "%s: flush backlog still not 0; "
				"going on\n", t->label);
	}

	if (run_phase(&r, OP_WRITE, &w0, &w1))
		goto fail;
	res->write_s = (w1 - w0) / NS;

	if (t->stats) {
		int rc = wait_drained(t->dir, o.drain_timeout, &td);

		if (rc >= 0) {
			res->bg = rc == 0 ? 1 : 2;
			res->drain_s = (td - w1) / NS;
		}
		if (rc == 1)
			fprintf(stderr, "%s: flush backlog not 0 %g s after "
				"the write phase\n", t->label, o.drain_timeout);
	}

	if (o.fsync) {
		if (run_phase(&r, OP_FSYNC, &f0, &f1))
			goto fail;
		res->flush_s = (f1 - w0) / NS;
	}

	if (t->drop)
		drop_cache(&r);

	if (run_phase(&r, OP_READ, &r0, &r1))
		goto fail;
	res->read_s = (r1 - r0) / NS;

	fprintf(stderr, "%-10s bs %-4s j %-2d  write %7.3f s %6.2f GB/s  "
		"read %7.3f s %6.2f GB/s", t->label,
		fmt_size(bs, b, sizeof(b)), nwr, res->write_s,
		gbps(bytes, res->write_s), res->read_s,
		gbps(bytes, res->read_s));
	if (o.fsync)
		fprintf(stderr, "  flush %7.3f s", res->flush_s);
	if (res->bg == 1)
		fprintf(stderr, "  drain %7.3f s", res->drain_s);
	else if (res->bg == 2)
		fprintf(stderr, "  drain timed out");
	fputc('\n', stderr);
	cleanup_run(&r);
	return;
fail:
	res->failed = true;
	cleanup_run(&r);
}

/* ---- raw O_DIRECT through io_uring ----------------------------------- */

struct raw_file {
	int fd;
	uint32_t left;		/* blocks not yet completed */
};

struct raw_slot {
	uint8_t *buf;
	uint32_t file;
	uint64_t off;
	uint32_t len;
};

static uint32_t raw_id;		/* run id of the last raw write pass */

static void raw_path(char *buf, size_t len, const char *dir, long i)
{
	snprintf(buf, len, "%s/bench_io.raw.%04ld", dir, i);
}

static struct io_uring_sqe *raw_sqe(struct io_uring *ring)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe) {
		io_uring_submit(ring);
		sqe = io_uring_get_sqe(ring);
	}
	return sqe;
}

/* one pass over the raw files: write (+ datasync) or read; -1 on error */
static int raw_pass(struct io_uring *ring, struct raw_slot *slots,
		    const char *dir, bool wr, double *secs)
{
	uint32_t nblk = (uint32_t)((o.fsize + RAW_BS - 1) / RAW_BS);
	struct raw_file *files;
	int freel[RAW_QD], nfree = RAW_QD;
	long next = 0, closed = 0, i;
	uint64_t next_off = 0, t0;
	unsigned inflight = 0;
	uint32_t id;
	bool err = false;
	char path[PATH_LEN];

	files = calloc(o.nfiles, sizeof(*files));
	if (!files)
		die("out of memory");
	for (i = 0; i < o.nfiles; i++)
		files[i].fd = -1;
	for (i = 0; i < RAW_QD; i++)
		freel[i] = (int)i;
	/* the write pass stamps tags; the read pass expects the same run id */
	if (wr)
		raw_id = random_u32();
	id = raw_id;

	t0 = now_ns();
	while (closed < o.nfiles && !(err && !inflight)) {
		struct io_uring_cqe *cqe;

		/* keep the queue full, across file boundaries */
		while (!err && nfree && next < o.nfiles) {
			struct raw_file *f = &files[next];
			struct io_uring_sqe *sqe;
			struct raw_slot *s;
			int k;

			if (f->fd < 0) {
				raw_path(path, sizeof(path), dir, next);
				f->fd = open(path, wr ? O_WRONLY | O_CREAT |
					     O_TRUNC | O_DIRECT :
					     O_RDONLY | O_DIRECT, 0644);
				if (f->fd < 0) {
					fprintf(stderr, "bench_io: raw: open "
						"%s: %s\n", path,
						strerror(errno));
					err = true;
					break;
				}
				f->left = nblk;
			}
			sqe = raw_sqe(ring);
			if (!sqe)
				break;
			k = freel[--nfree];
			s = &slots[k];
			s->file = (uint32_t)next;
			s->off = next_off;
			s->len = (uint32_t)(o.fsize - next_off < RAW_BS ?
					    o.fsize - next_off : RAW_BS);
			if (wr) {
				tag_stamp(s->buf, s->len, id, s->file, s->off);
				io_uring_prep_write(sqe, f->fd, s->buf, s->len,
						    s->off);
			} else {
				io_uring_prep_read(sqe, f->fd, s->buf, s->len,
						   s->off);
			}
			sqe->user_data = (uint64_t)k;
			inflight++;
			next_off += s->len;
			if (next_off >= o.fsize) {
				next++;
				next_off = 0;
			}
		}
		if (!inflight)
			break;
		if (io_uring_submit_and_wait(ring, 1) < 0) {
			fprintf(stderr, "bench_io: raw: io_uring_submit: %s\n",
				strerror(errno));
			err = true;
			break;
		}
		while (io_uring_peek_cqe(ring, &cqe) == 0) {
			uint64_t ud = cqe->user_data;
			int res = cqe->res;
			struct raw_slot *s;
			struct raw_file *f;

			io_uring_cqe_seen(ring, cqe);
			inflight--;
			if (ud & RAW_FSYNC_BIT) {
				f = &files[ud & ~RAW_FSYNC_BIT];
				if (res < 0) {
					fprintf(stderr, "bench_io: raw: "
						"fdatasync: %s\n",
						strerror(-res));
					err = true;
				}
				close(f->fd);
				f->fd = -1;
				closed++;
				continue;
			}
			s = &slots[ud];
			f = &files[s->file];
			freel[nfree++] = (int)ud;
			if (res != (int)s->len) {
				fprintf(stderr, "bench_io: raw: %s file %u "
					"offset %" PRIu64 ": %s\n",
					wr ? "write" : "read", s->file, s->off,
					res < 0 ? strerror(-res) : "short");
				err = true;
			} else if (!wr && !tag_check(s->buf, s->len, id,
						     s->file, s->off)) {
				fprintf(stderr, "bench_io: raw: bad data in "
					"file %u offset %" PRIu64 "\n",
					s->file, s->off);
				err = true;
			}
			if (--f->left)
				continue;
			if (wr && !err) {
				struct io_uring_sqe *sqe = raw_sqe(ring);

				if (sqe) {
					io_uring_prep_fsync(sqe, f->fd,
						IORING_FSYNC_DATASYNC);
					sqe->user_data = RAW_FSYNC_BIT |
							 s->file;
					inflight++;
					continue;
				}
				err = true;
			}
			close(f->fd);
			f->fd = -1;
			closed++;
		}
	}
	*secs = (now_ns() - t0) / NS;
	/* after an error, drain what is still in flight */
	while (inflight) {
		struct io_uring_cqe *cqe;

		if (io_uring_wait_cqe(ring, &cqe))
			break;
		io_uring_cqe_seen(ring, cqe);
		inflight--;
	}
	for (i = 0; i < o.nfiles; i++)
		if (files[i].fd >= 0)
			close(files[i].fd);
	free(files);
	return err ? -1 : 0;
}

static int raw_bench(const char *dir, double *wsecs, double *rsecs)
{
	struct raw_slot slots[RAW_QD];
	struct io_uring ring;
	char path[PATH_LEN];
	int rc, k;
	long i;

	if (o.fsize % RAW_ALIGN) {
		fprintf(stderr, "bench_io: raw: file size must be a multiple "
			"of %u for O_DIRECT\n", RAW_ALIGN);
		return -1;
	}
	rc = io_uring_queue_init(2 * RAW_QD, &ring, 0);
	if (rc < 0) {
		fprintf(stderr, "bench_io: raw: io_uring_queue_init: %s\n",
			strerror(-rc));
		return -1;
	}
	for (k = 0; k < RAW_QD; k++) {
		slots[k].buf = xmalloc_aligned(RAW_BS);
		memcpy(slots[k].buf, rnd, RAW_BS);
	}
	rc = raw_pass(&ring, slots, dir, true, wsecs);
	if (!rc)
		rc = raw_pass(&ring, slots, dir, false, rsecs);
	io_uring_queue_exit(&ring);
	for (k = 0; k < RAW_QD; k++)
		free(slots[k].buf);
	if (!o.keep) {
		for (i = 0; i < o.nfiles; i++) {
			raw_path(path, sizeof(path), dir, i);
			unlink(path);
		}
		/* settle the file system before the runs that follow */
		k = open(dir, O_RDONLY | O_DIRECTORY);
		if (k >= 0) {
			syncfs(k);
			close(k);
		}
	}
	return rc;
}

/* ---- set-up and report ------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f,
"usage: bench_io [options] [--label NAME=DIR]... [DIR]...\n"
"\n"
"Write N files of S bytes into each target directory with write() calls of\n"
"B bytes from J threads, read them back (verifying every block), and print\n"
"write/read throughput in GB/s (10^9 bytes/s) for every combination of the\n"
"block sizes and writer counts, plus the ratio to a reference target.\n"
"\n"
"  -n, --files N         files per run (default 64)\n"
"  -s, --size S          bytes per file, K/M/G suffixes (default 64M)\n"
"  -b, --bs LIST         write/read block sizes, e.g. 4K,64K,1M,16M\n"
"                        (default 1M)\n"
"  -j, --writers LIST    writer (and reader) thread counts, e.g. 1,4\n"
"                        (default 1)\n"
"  -l, --label NAME=DIR  a target directory and its label in the table; a\n"
"                        bare DIR argument is its own label\n"
"  -r, --ref NAME        label the ratio columns compare to (default shm)\n"
"  -f, --fsync           after the write phase fsync every file; report\n"
"                        \"flush\" = N*S / (first open .. last fsync)\n"
"      --raw DIR         measure the raw O_DIRECT write (+ fdatasync) and\n"
"                        read bandwidth of the disk holding DIR: N files of\n"
"                        S bytes, io_uring, QD %d, 1 MiB blocks\n"
"  -d, --drop LABEL      before the read phase of that target, fdatasync its\n"
"                        files and drop them from the page cache\n"
"                        (POSIX_FADV_DONTNEED); may repeat, or \"all\".\n"
"                        Without it reads are cached (right after writing)\n"
"      --drain-timeout SEC  longest wait for a tierfs flush backlog to\n"
"                        drain (default 300)\n"
"  -R, --repeat R        run every combination R times; the table shows\n"
"                        medians (default 1)\n"
"  -k, --keep            leave the files in place\n"
"  -h, --help            this text\n"
"\n"
"A target whose directory answers getxattr(\"" STATS_XATTR "\") with\n"
"JSON holding \"flush_backlog\" or \"backlog_bytes\" is a tierfs mount: after\n"
"the write phase the xattr is polled until the backlog is 0, giving the\n"
"\"drain\" time (end of writes .. backlog 0) and \"bgflush\" = N*S / (first\n"
"open .. backlog 0).  Other targets skip this silently.\n"
"\n"
"example:\n"
"  bench_io -n 64 -s 64M -b 4K,1M -j 1,4 --fsync --label tierfs=/mnt/t \\\n"
"      --label ssd=/var/tmp/plain --label shm=/dev/shm/x --raw /var/tmp/raw\n",
		RAW_QD);
}

static int parse_list_size(const char *arg, size_t *out)
{
	char *s = strdup(arg), *tok, *save = NULL;
	int n = 0;

	if (!s)
		die("out of memory");
	for (tok = strtok_r(s, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (n == MAX_LIST)
			die("too many values in '%s' (max %d)", arg, MAX_LIST);
		out[n] = parse_size(tok);
		if (out[n] < 64 || out[n] > (1ull << 30))
			die("bad block size '%s' (64 .. 1G)", tok);
		n++;
	}
	free(s);
	if (!n)
		die("empty list '%s'", arg);
	return n;
}

static int parse_list_int(const char *arg, int *out)
{
	char *s = strdup(arg), *tok, *save = NULL, *end;
	int n = 0;

	if (!s)
		die("out of memory");
	for (tok = strtok_r(s, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		long v = strtol(tok, &end, 10);

		if (n == MAX_LIST)
			die("too many values in '%s' (max %d)", arg, MAX_LIST);
		if (*end || end == tok || v < 1 || v > MAX_WRITERS)
			die("bad writer count '%s' (1 .. %d)", tok,
			    MAX_WRITERS);
		out[n++] = (int)v;
	}
	free(s);
	if (!n)
		die("empty list '%s'", arg);
	return n;
}

static void add_target(const char *label, size_t llen, const char *dir)
{
	struct target *t;

	if (o.ntgt == MAX_TARGETS)
		die("too many targets (max %d)", MAX_TARGETS);
	t = &o.tgt[o.ntgt++];
	if (!llen || llen >= sizeof(t->label))
		die("bad label in '%s'", label);
	if (!*dir || strlen(dir) >= sizeof(t->dir) - 64)
		die("bad directory for label '%.*s'", (int)llen, label);
	memcpy(t->label, label, llen);
	t->label[llen] = 0;
	strcpy(t->dir, dir);
}

/* mkdir -p; true if the leaf was created */
static bool make_dir(const char *dir)
{
	char p[PATH_MAX], *s;
	struct stat st;

	if (!stat(dir, &st)) {
		if (!S_ISDIR(st.st_mode))
			die("%s is not a directory", dir);
		return false;
	}
	snprintf(p, sizeof(p), "%s", dir);
	for (s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0755) && errno != EEXIST)
			die("mkdir %s: %s", p, strerror(errno));
		*s = '/';
	}
	if (mkdir(p, 0755) && errno != EEXIST)
		die("mkdir %s: %s", p, strerror(errno));
	return true;
}

static void parse_args(int argc, char **argv)
{
	enum { OPT_RAW = 256, OPT_DRAIN };
	static const struct option lo[] = {
		{ "files", required_argument, NULL, 'n' },
		{ "size", required_argument, NULL, 's' },
		{ "bs", required_argument, NULL, 'b' },
		{ "writers", required_argument, NULL, 'j' },
		{ "label", required_argument, NULL, 'l' },
		{ "ref", required_argument, NULL, 'r' },
		{ "fsync", no_argument, NULL, 'f' },
		{ "raw", required_argument, NULL, OPT_RAW },
		{ "drop", required_argument, NULL, 'd' },
		{ "drain-timeout", required_argument, NULL, OPT_DRAIN },
		{ "repeat", required_argument, NULL, 'R' },
		{ "keep", no_argument, NULL, 'k' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *eq;
	char *end;
	int c, i, k;

	while ((c = getopt_long(argc, argv, "n:s:b:j:l:r:fd:R:kh", lo,
				NULL)) != -1) {
		switch (c) {
		case 'n':
			o.nfiles = strtol(optarg, &end, 10);
			if (*end || o.nfiles < 1 || o.nfiles > 1000000)
				die("bad file count '%s'", optarg);
			break;
		case 's':
			o.fsize = parse_size(optarg);
			if (!o.fsize)
				die("bad file size '%s'", optarg);
			break;
		case 'b':
			o.nbs = parse_list_size(optarg, o.bs);
			break;
		case 'j':
			o.nnwr = parse_list_int(optarg, o.nwr);
			break;
		case 'l':
			eq = strchr(optarg, '=');
			if (!eq)
				die("--label wants NAME=DIR, got '%s'", optarg);
			add_target(optarg, eq - optarg, eq + 1);
			break;
		case 'r':
			o.ref = optarg;
			break;
		case 'f':
			o.fsync = true;
			break;
		case OPT_RAW:
			o.raw = optarg;
			break;
		case 'd':
			if (o.ndrop == MAX_TARGETS)
				die("too many --drop");
			o.drop[o.ndrop++] = optarg;
			break;
		case OPT_DRAIN:
			o.drain_timeout = strtod(optarg, &end);
			if (*end || o.drain_timeout <= 0)
				die("bad --drain-timeout '%s'", optarg);
			break;
		case 'R':
			o.repeat = (int)strtol(optarg, &end, 10);
			if (*end || o.repeat < 1 || o.repeat > 99)
				die("bad --repeat '%s' (1 .. 99)", optarg);
			break;
		case 'k':
			o.keep = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			exit(2);
		}
	}
	for (i = optind; i < argc; i++)
		add_target(argv[i], strlen(argv[i]), argv[i]);
	if (!o.ntgt && !o.raw) {
		usage(stderr);
		exit(2);
	}
	if (!o.nbs) {
		o.bs[0] = 1 << 20;
		o.nbs = 1;
	}
	if (!o.nnwr) {
		o.nwr[0] = 1;
		o.nnwr = 1;
	}
	for (k = 0; k < o.ndrop; k++) {
		bool hit = false;

		for (i = 0; i < o.ntgt; i++) {
			if (!strcmp(o.drop[k], "all") ||
			    !strcmp(o.drop[k], o.tgt[i].label)) {
				o.tgt[i].drop = true;
				hit = true;
			}
		}
		if (!hit)
			die("--drop %s: no such label", o.drop[k]);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * Fold the repetitions of each (target, B, J) into one result: the median
 * of every time; failed if any repetition failed; bg timed out if any did.
 */
static int fold_repeats(const struct result *res, int nres,
			struct result *out)
{
	double w[99], r[99], f[99], d[99];
	int i, k, n, nout = 0, nd;

	for (i = 0; i < nres; i++) {
		struct result *a;

		for (k = 0; k < nout; k++)
			if (out[k].tgt == res[i].tgt &&
			    out[k].bs == res[i].bs && out[k].nwr == res[i].nwr)
				break;
		if (k < nout)
			continue;
		a = &out[nout++];
		*a = res[i];
		a->bg = 1;
		n = nd = 0;
		for (k = i; k < nres; k++) {
			const struct result *x = &res[k];

			if (x->tgt != a->tgt || x->bs != a->bs ||
			    x->nwr != a->nwr)
				continue;
			if (x->failed) {
				a->failed = true;
				continue;
			}
			w[n] = x->write_s;
			r[n] = x->read_s;
			f[n] = x->flush_s;
			n++;
			if (x->bg == 1)
				d[nd++] = x->drain_s;
			if (x->bg != 1 && a->bg != 2)
				a->bg = x->bg;
		}
		a->write_s = median(w, n);
		a->read_s = median(r, n);
		a->flush_s = median(f, n);
		a->drain_s = median(d, nd);
	}
	return nout;
}

static const struct result *find_result(const struct result *res, int nres,
					int tgt, size_t bs, int nwr)
{
	int i;

	for (i = 0; i < nres; i++)
		if (res[i].tgt == tgt && res[i].bs == bs && res[i].nwr == nwr)
			return &res[i];
	return NULL;
}

static void cell_gbps(double bytes, double secs, bool ok)
{
	if (ok && secs > 0)
		printf("  %9.3f", gbps(bytes, secs));
	else
		printf("  %9s", ok ? "-" : "FAIL");
}

static void cell_ratio(double num, double den)
{
	if (num > 0 && den > 0)
		printf("  %6.2f", num / den);
	else
		printf("  %6s", "-");
}

static void print_rows(const struct result *res, int nres, int ref, int lw,
		       bool any_bg, bool raw_ok, double raw_w)
{
	double bytes = (double)o.nfiles * o.fsize;
	char b[32];
	int i;

	printf("\n%-*s  %5s  %3s  %9s  %9s  %6s  %6s", lw, "label", "block",
	       "wr", "write", "read", "w/ref", "r/ref");
	if (o.fsync)
		printf("  %9s%s", "flush", raw_ok ? "  fl/raw" : "");
	if (any_bg)
		printf("  %9s  %8s%s", "bgflush", "drain s",
		       raw_ok ? "  bg/raw" : "");
	printf("\n%-*s  %5s  %3s  %9s  %9s  %6s  %6s", lw, "", "", "", "GB/s",
	       "GB/s", "", "");
	if (o.fsync)
		printf("  %9s%s", "GB/s", raw_ok ? "        " : "");
	if (any_bg)
		printf("  %9s  %8s%s", "GB/s", "", raw_ok ? "        " : "");
	printf("\n");

	for (i = 0; i < nres; i++) {
		const struct result *r = &res[i];
		const struct result *rr = ref >= 0 ?
			find_result(res, nres, ref, r->bs, r->nwr) : NULL;
		bool ok = !r->failed, rok = rr && !rr->failed;

		if (i && (r->bs != res[i - 1].bs || r->nwr != res[i - 1].nwr))
			printf("\n");
		printf("%-*s  %5s  %3d", lw, o.tgt[r->tgt].label,
		       fmt_size(r->bs, b, sizeof(b)), r->nwr);
		cell_gbps(bytes, r->write_s, ok);
		cell_gbps(bytes, r->read_s, ok);
		cell_ratio(ok && rok ? rr->write_s : 0, ok ? r->write_s : 0);
		cell_ratio(ok && rok ? rr->read_s : 0, ok ? r->read_s : 0);
		if (o.fsync) {
			cell_gbps(bytes, r->flush_s, ok);
			if (raw_ok)
				cell_ratio(ok ? raw_w : 0, r->flush_s);
		}
		if (any_bg) {
			if (r->bg == 1) {
				double t = r->write_s + r->drain_s;

				cell_gbps(bytes, t, true);
				printf("  %8.3f", r->drain_s);
				if (raw_ok)
					cell_ratio(raw_w, t);
			} else {
				printf("  %9s  %8s%s", r->bg == 2 ? "timeout" :
				       "-", "-", raw_ok ? "       -" : "");
			}
		}
		printf("\n");
	}
}

static void print_table(const struct result *res, int nres, bool raw_ok,
			double raw_w, double raw_r)
{
	double bytes = (double)o.nfiles * o.fsize;
	bool any_bg = false, any_drop = false;
	int i, ref = -1, lw = 6;
	char s[32];

	for (i = 0; i < o.ntgt; i++) {
		int l = (int)strlen(o.tgt[i].label);

		if (!strcmp(o.tgt[i].label, o.ref))
			ref = i;
		if (l > lw)
			lw = l;
		any_bg |= o.tgt[i].stats;
		any_drop |= o.tgt[i].drop;
	}
	for (i = 0; i < nres; i++)
		any_bg |= res[i].bg != 0;

	printf("\nbench_io: %ld files x %s = %.2f GB per run; GB/s = 10^9 "
	       "bytes/s; ratios vs '%s'%s\n", o.nfiles,
	       fmt_size(o.fsize, s, sizeof(s)), bytes / 1e9, o.ref,
	       ref < 0 ? " (not among the targets)" : "");
	if (o.repeat > 1)
		printf("every row: median of %d runs\n", o.repeat);
	if (any_drop) {
		printf("page cache dropped (fdatasync + POSIX_FADV_DONTNEED) "
		       "before reading:");
		for (i = 0; i < o.ntgt; i++)
			if (o.tgt[i].drop)
				printf(" %s", o.tgt[i].label);
		printf("; other reads are cached (right after writing)\n");
	} else {
		printf("reads are cached (right after writing, page cache "
		       "not dropped)\n");
	}
	if (nres)
		print_rows(res, nres, ref, lw, any_bg, raw_ok, raw_w);
	if (o.raw) {
		printf("\nraw O_DIRECT (%s): ", o.raw);
		if (raw_ok)
			printf("write+fdatasync %.3f GB/s, read %.3f GB/s "
			       "(io_uring, QD %d, 1M blocks)\n",
			       gbps(bytes, raw_w), gbps(bytes, raw_r), RAW_QD);
		else
			printf("FAILED\n");
	}
	printf("\nwrite: first open .. last close (wr threads share the "
	       "files); read: the same files read back, every block "
	       "verified\n");
	if (o.fsync)
		printf("flush: first open of the write phase .. last fsync "
		       "returned (durable)%s\n",
		       raw_ok ? "; fl/raw = flush / raw write" : "");
	if (any_bg)
		printf("bgflush: first open .. " STATS_XATTR " backlog 0; "
		       "drain: end of write phase .. backlog 0%s\n",
		       raw_ok ? "; bg/raw = bgflush / raw write" : "");
}

int main(int argc, char **argv)
{
	struct result *res, *agg;
	double raw_w = 0, raw_r = 0;
	bool raw_ok = false, raw_created = false, failed = false;
	int nres = 0, i, k, t, rep;
	size_t nmax;
	size_t maxbs = RAW_BS;

	parse_args(argc, argv);

	for (i = 0; i < o.nbs; i++)
		if (o.bs[i] > maxbs)
			maxbs = o.bs[i];
	rnd_size = maxbs;
	rnd = xmalloc_aligned(rnd_size);
	fill_random(rnd, rnd_size);

	for (t = 0; t < o.ntgt; t++) {
		o.tgt[t].created = make_dir(o.tgt[t].dir);
		o.tgt[t].stats = stats_backlog(o.tgt[t].dir) >= 0;
	}

	if (o.raw) {
		double ws[99], rs[99];

		raw_created = make_dir(o.raw);
		raw_ok = true;
		for (rep = 0; rep < o.repeat && raw_ok; rep++) {
			raw_ok = raw_bench(o.raw, &ws[rep], &rs[rep]) == 0;
			if (!raw_ok)
				break;
			fprintf(stderr, "raw        O_DIRECT QD %d  write %7.3f "
				"s %6.2f GB/s  read %7.3f s %6.2f GB/s\n",
				RAW_QD, ws[rep],
				gbps((double)o.nfiles * o.fsize, ws[rep]),
				rs[rep],
				gbps((double)o.nfiles * o.fsize, rs[rep]));
		}
		if (raw_ok) {
			raw_w = median(ws, o.repeat);
			raw_r = median(rs, o.repeat);
		} else {
			failed = true;
		}
		if (raw_created && !o.keep)
			rmdir(o.raw);
	}

	nmax = (size_t)o.nbs * o.nnwr * (o.ntgt ? o.ntgt : 1);
	res = calloc(nmax * o.repeat, sizeof(*res));
	agg = calloc(nmax, sizeof(*agg));
	if (!res || !agg)
		die("out of memory");
	for (i = 0; i < o.nbs; i++) {
		for (k = 0; k < o.nnwr; k++) {
			for (rep = 0; rep < o.repeat; rep++) {
				for (t = 0; t < o.ntgt; t++) {
					run_one(&o.tgt[t], o.bs[i], o.nwr[k],
						&res[nres]);
					res[nres].tgt = t;
					failed |= res[nres].failed;
					nres++;
				}
			}
		}
	}

	print_table(agg, fold_repeats(res, nres, agg), raw_ok, raw_w, raw_r);

	for (t = 0; t < o.ntgt; t++)
		if (o.tgt[t].created && !o.keep)
			rmdir(o.tgt[t].dir);
	free(agg);
	free(res);
	free(rnd);
	return failed ? 1 : 0;
}
