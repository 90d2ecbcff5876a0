/*
 * bench_hints.c - tierfs restore-hint benchmark: the adjoint (forward pass /
 * backward pass) checkpoint workload, as the application sees it.
 *
 * One run ("shot") in one directory DIR (a fresh directory on a tierfs
 * mount; a plain directory gives the baseline):
 *
 *  1. Set-up (untimed).  DIR is created if missing.  On tierfs (the mount
 *     root answers getxattr("user.tierfs.stats")), wait until the flush
 *     backlog is 0 so that earlier runs don't compete.  Unless
 *     --no-prefetch-stop, set user.tierfs.prefetch = "stop" on DIR, so that
 *     prefetches don't compete with the forward pass's flushes.  With
 *     --hints all, set user.tierfs.restore_order on DIR to every checkpoint
 *     name in restore order: the application knows its restore order before
 *     it writes anything.
 *
 *  2. Forward pass.  K iterations: a compute interval (-c MS; sleep, or
 *     --busy busy-wait), then checkpoint i: open(ckpt.NNNN, O_CREAT|O_TRUNC),
 *     write() in 1 MiB calls, close().  Checkpoint throughput = bytes
 *     written / time blocked in those open+write+close calls.
 *
 *  3. Between the passes (untimed).  On tierfs, unless --no-wait-flush,
 *     wait until the flush backlog is 0 (the restore phase waits for the
 *     checkpoint phase to be flushed, as in the paper's main scenario).
 *     A backlog that does not drain within --drain-timeout is reported
 *     (drain columns "timeout") and the run goes on.
 *     With --drop-caches, drop the kernel page cache (echo 3 >
 *     /proc/sys/vm/drop_caches; a plain directory is syncfs'ed first, so
 *     its pages are clean and really go), so that reads come from tierfs,
 *     or from the disk for a plain directory.  Then, unless
 *     --no-prefetch-stop, set user.tierfs.prefetch = "start".
 *
 *  4. Backward pass.  K iterations in the restore order (--order seq:
 *     0..K-1, rev: K-1..0, irr: a permutation drawn from --seed): with
 *     --hints single, set user.tierfs.restore_next on the NEXT file of the
 *     order (one hint ahead, given at the start of the current iteration);
 *     sample the prefetch distance (below); open, read() in 1 MiB calls up
 *     to EOF into a buffer, close; then the compute interval, during which
 *     the data is verified.  Restore throughput = bytes read / time blocked
 *     in open+read+close.
 *
 *  5. Clean-up (untimed): the checkpoints are unlinked (so the next run
 *     starts with an empty cache) and DIR removed if this run created it,
 *     unless --keep.
 *
 * Hints are only sent to tierfs: on a plain directory they are skipped
 * (setting user.* xattrs there would work and mean nothing).  When tierfs
 * rejects a hint (e.g. a build that does not implement hints yet), the
 * first failure of each attribute is reported on stderr and the run goes on
 * without it; the hint_err column counts the failed calls.
 *
 * Statistics (tierfs only; "-" elsewhere).  The mount root (found by
 * walking up from DIR while the device stays the same, or --stats PATH) is
 * read right before each backward-pass read: "prefetch":{"distance":N}
 * gives the prefetch distance at that read (the number of queue-head
 * entries already resident in the fastest cache tier); dist_avg/dist_max
 * are over the reads (absent key: "-").  hits/misses are the differences
 * over the backward pass of the "hits"/"misses" counters summed over the
 * cache tiers of "tiers" (on a host-only mount: the host tier; misses are
 * counted on the fastest tier only).  "files_prefetched" and "evictions"
 * are reported the same way (CSV only).
 *
 * Data.  A 1 MiB random block is generated once.  Every 1 MiB chunk of a
 * checkpoint (the last one may be shorter) is that block with a 32-byte tag
 * at its start and its end: magic, a per-run random id, the file index,
 * the chunk index and the file size.  A chunk from another file, another
 * offset, a stale run or a torn write fails the check; the rest of the
 * chunk is compared with the random block.  A wrong byte or a wrong file
 * size ends the run with exit status 1 and no result line.
 *
 * Sizes.  --sizes uniform: every checkpoint is -s S bytes.  --sizes var:
 * sizes shaped like the RTM traces of the paper's Figure 4 (compressed
 * wave-field snapshots): small at the beginning of the shot and growing,
 * with a spread around the trend.  Checkpoint i gets
 *     S * trend(i) * jitter,  trend: linear from 0.25 to 1.75 over the shot,
 *                             jitter: log-uniform in [1/2, 2] (mean 1),
 * clamped to [S/8, 2S] and rescaled so that the mean is S (the total is
 * K*S, as with uniform sizes), rounded to 64 KiB.  The draw depends only on
 * --seed, K and S, so every policy sees the same sizes and the same
 * irregular order.  --print-sizes shows them.
 *
 * Output: one line per run; --csv for comma-separated values (a header
 * line first unless --no-header).  GB means 10^9 bytes; sizes on the
 * command line take binary suffixes (K = 1024).
 *
 * A watchdog thread ends the program (exit status 3, with the tierfs stats
 * on stderr) if one call blocks longer than --timeout seconds, so that a
 * hung daemon does not hang the benchmark.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
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

#define BENCH_PROG	"bench_hints"
#include "bench_common.h"

#define CHUNK		(1u << 20)		/* bytes per read()/write() call */
#define SIZE_ALIGN	(64u << 10)		/* variable sizes: a multiple */
#define TAG_LEN		32u
#define TAG_MAGIC	0x3173746e69687374ull	/* "tshints1" */
#define POLL_NS		2000000ull		/* stats poll period: 2 ms */
#define XATTR_CHUNK	60000u			/* restore_order bytes per call */

#define X_STATS		"user.tierfs.stats"
#define X_ORDER		"user.tierfs.restore_order"
#define X_PREFETCH	"user.tierfs.prefetch"
#define X_NEXT		"user.tierfs.restore_next"

enum sizes { SZ_UNIFORM, SZ_VAR };
enum hints { H_ALL, H_SINGLE, H_NONE };

static const char *const sizes_name[] = { "uniform", "var" };
static const char *const order_name[] = { "seq", "rev", "irr" };
static const char *const hints_name[] = { "all", "single", "none" };

static struct {
	const char *dir;
	int k;
	uint64_t s;
	enum sizes sizes;
	enum bench_order order;
	enum hints hints;
	double interval_ms;
	bool busy;
	uint64_t seed;
	const char *label;
	bool csv;
	bool header;
	bool prefetch_stop;
	bool wait_flush;
	bool drop_caches;
	bool keep;
	bool print_sizes;
	double timeout_s;
	double drain_timeout_s;
	const char *stats;
} o = {
	.k = 64,
	.s = 16ull << 20,
	.sizes = SZ_UNIFORM,
	.order = ORD_SEQ,
	.hints = H_ALL,
	.interval_ms = 20,
	.seed = 1,
	.label = "-",
	.header = true,
	.prefetch_stop = true,
	.wait_flush = true,
	.timeout_s = 300,
	.drain_timeout_s = 600,
};

/* ---- watchdog --------------------------------------------------------- */

static uint64_t op_since;		/* start of the blocking call; 0: none */
static char op_what[PATH_MAX + 64];	/* which call (read by the watchdog) */
static char stats_path[PATH_MAX];	/* the mount root */
static bool is_tierfs;

static char *stats_get(void);

static void op_begin(const char *what, const char *name)
{
	size_t a = strlen(what), b = strnlen(name, sizeof(op_what) - a - 2);

	memcpy(op_what, what, a);
	op_what[a] = ' ';
	memcpy(op_what + a + 1, name, b);
	op_what[a + 1 + b] = 0;
	__atomic_store_n(&op_since, now_ns(), __ATOMIC_RELEASE);
}

static void op_end(void)
{
	__atomic_store_n(&op_since, 0, __ATOMIC_RELEASE);
}

static void *watchdog(void *arg)
{
	(void)arg;
	for (;;) {
		sleep(1);
		uint64_t t = __atomic_load_n(&op_since, __ATOMIC_ACQUIRE);

		if (t && (double)(now_ns() - t) / 1e9 > o.timeout_s) {
			char *js = is_tierfs ? stats_get() : NULL;

			fprintf(stderr, "bench_hints: %s: blocked for more than %.0f s, giving up\n",
				op_what, o.timeout_s);
			if (js)
				fprintf(stderr, "bench_hints: stats: %s\n", js);
			fflush(stderr);
			_exit(3);
		}
	}
	return NULL;
}

/* ---- tierfs statistics ------------------------------------------------ */

/* The stats JSON of the mount root, malloc'ed, or NULL. */
static char *stats_get(void)
{
	size_t cap = 64 << 10;

	for (int tries = 0; tries < 4; tries++) {
		char *buf = xmalloc(cap + 1);
		ssize_t n = getxattr(stats_path, X_STATS, buf, cap);

		if (n >= 0) {
			buf[n] = 0;
			return buf;
		}
		free(buf);
		if (errno != ERANGE)
			return NULL;
		cap *= 4;
	}
	return NULL;
}

/* Sum of the numbers of every "key": in [p, end); false if none. */
static bool json_sum(const char *p, const char *end, const char *key, long long *sum)
{
	char pat[64];
	bool found = false;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	*sum = 0;
	while ((p = strstr(p, pat)) && p < end) {
		char *e;
		long long v;

		p += strlen(pat);
		v = strtoll(p, &e, 10);
		if (e != p) {
			*sum += v;
			found = true;
		}
	}
	return found;
}

/* Numbers of interest, -1 where absent. */
struct stats {
	long long hits, misses, evictions;
	long long distance, prefetched;
	long long backlog, running;
};

static bool stats_read(struct stats *st)
{
	char *js = stats_get();
	const char *b, *e;

	st->hits = st->misses = st->evictions = -1;
	st->distance = st->prefetched = st->backlog = st->running = -1;
	if (!js)
		return false;
	if ((b = json_obj(js, js + strlen(js), "tiers", &e))) {
		if (!json_sum(b, e, "hits", &st->hits))
			st->hits = -1;
		if (!json_sum(b, e, "misses", &st->misses))
			st->misses = -1;
		if (!json_sum(b, e, "evictions", &st->evictions))
			st->evictions = -1;
	}
	if ((b = json_obj(js, js + strlen(js), "prefetch", &e))) {
		if (!json_sum(b, e, "distance", &st->distance))
			st->distance = -1;
		if (!json_sum(b, e, "files_prefetched", &st->prefetched))
			st->prefetched = -1;
	}
	if ((b = json_obj(js, js + strlen(js), "ssd", &e))) {
		if (!json_sum(b, e, "flush_backlog", &st->backlog))
			st->backlog = -1;
		if (!json_sum(b, e, "flushes_running", &st->running))
			st->running = -1;
	}
	free(js);
	return true;
}

/* Wait until nothing is left to flush; seconds waited, -1: timed out. */
static double drain(const char *when)
{
	uint64_t t0 = now_ns();
	struct stats st;

	for (;;) {
		if (!stats_read(&st) || st.backlog < 0)
			return 0;	/* nothing to wait on */
		if (st.backlog == 0 && st.running <= 0)
			break;
		if ((double)(now_ns() - t0) / 1e9 > o.drain_timeout_s) {
			warn("warning: %s: flush backlog still %lld bytes (%lld flushes running) "
			     "after %.0f s; going on", when, st.backlog, st.running,
			     o.drain_timeout_s);
			return -1;
		}
		struct timespec ts = { 0, POLL_NS };
		nanosleep(&ts, NULL);
	}
	return (double)(now_ns() - t0) / 1e9;
}

/* ---- hints ------------------------------------------------------------ */

static long hint_err;
static uint64_t hint_ns;

static void hint_set(const char *path, const char *name, const char *val, size_t len)
{
	static bool warned[3];
	int w = strcmp(name, X_ORDER) == 0 ? 0 : strcmp(name, X_PREFETCH) == 0 ? 1 : 2;
	uint64_t t0 = now_ns();
	int ret;

	if (!is_tierfs)
		return;
	op_begin("setxattr", name);
	ret = setxattr(path, name, val, len, 0);
	op_end();
	hint_ns += now_ns() - t0;
	if (ret) {
		hint_err++;
		if (!warned[w]) {
			warned[w] = true;
			warn("warning: setxattr(%s, %s): %s; continuing without this hint "
			     "(reported once)", path, name, strerror(errno));
		}
	}
}

/* ---- the workload ----------------------------------------------------- */

struct tag {
	uint64_t magic;
	uint64_t run;
	uint32_t file;
	uint32_t chunk;
	uint64_t size;
};

static uint8_t *rnd;		/* CHUNK random bytes */
static uint64_t run_id;

static void make_tag(uint8_t *dst, uint32_t file, uint32_t chunk, uint64_t size)
{
	struct tag t = { TAG_MAGIC, run_id, file, chunk, size };

	_Static_assert(sizeof(t) == TAG_LEN, "tag size");
	memcpy(dst, &t, TAG_LEN);
}

/* Checkpoint sizes (see the header comment). */
static void make_sizes(uint64_t *sz)
{
	ckpt_sizes(sz, o.k, o.s, o.sizes == SZ_VAR, o.seed, SIZE_ALIGN);
}

static void make_order(int *ord)
{
	ckpt_order(ord, o.k, o.order, o.seed);
}

/* Compute interval that started at t0 (absolute deadline). */
static void compute_until(uint64_t t0)
{
	uint64_t end = t0 + (uint64_t)(o.interval_ms * 1e6);

	if (o.busy) {
		while (now_ns() < end)
			;
		return;
	}
	struct timespec ts = { (time_t)(end / 1000000000ull), (long)(end % 1000000000ull) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static char **names;
static int name_width;

static void path_of(char *buf, size_t len, int i)
{
	snprintf(buf, len, "%s/%s", o.dir, names[i]);
}

/* Write checkpoint i; seconds blocked in open+write+close. */
static uint64_t write_ckpt(int i, uint64_t size, uint8_t *buf)
{
	char path[PATH_MAX + 64];
	uint64_t blocked = 0, t0, off = 0;
	uint32_t c = 0;
	int fd;

	path_of(path, sizeof(path), i);
	op_begin("open", path);
	t0 = now_ns();
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	blocked += now_ns() - t0;
	op_end();
	if (fd < 0)
		die("open %s: %s", path, strerror(errno));
	for (off = 0; off < size; off += CHUNK, c++) {
		size_t len = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
		size_t done = 0;

		make_tag(buf, (uint32_t)i, c, size);
		make_tag(buf + len - TAG_LEN, (uint32_t)i, c, size);
		op_begin("write", path);
		t0 = now_ns();
		while (done < len) {
			ssize_t n = write(fd, buf + done, len - done);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				die("write %s at %" PRIu64 ": %s", path, off + done,
				    n < 0 ? strerror(errno) : "wrote nothing");
			done += (size_t)n;
		}
		blocked += now_ns() - t0;
		op_end();
		memcpy(buf + len - TAG_LEN, rnd + len - TAG_LEN, TAG_LEN);
	}
	op_begin("close", path);
	t0 = now_ns();
	if (close(fd))
		die("close %s: %s", path, strerror(errno));
	blocked += now_ns() - t0;
	op_end();
	return blocked;
}

/* Read checkpoint i to EOF into buf (capacity cap); bytes via *got. */
static uint64_t read_ckpt(int i, uint8_t *buf, uint64_t cap, uint64_t *got)
{
	char path[PATH_MAX + 64];
	uint64_t blocked = 0, t0, off = 0;
	int fd;

	path_of(path, sizeof(path), i);
	op_begin("open", path);
	t0 = now_ns();
	fd = open(path, O_RDONLY | O_CLOEXEC);
	blocked += now_ns() - t0;
	op_end();
	if (fd < 0)
		die("open %s: %s", path, strerror(errno));
	for (;;) {
		size_t want = cap - off < CHUNK ? (size_t)(cap - off) : CHUNK;
		ssize_t n;

		if (want == 0)
			die("%s: longer than expected (more than %" PRIu64 " bytes)", path, cap);
		op_begin("read", path);
		t0 = now_ns();
		n = read(fd, buf + off, want);
		blocked += now_ns() - t0;
		op_end();
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("read %s at %" PRIu64 ": %s", path, off, strerror(errno));
		if (n == 0)
			break;
		off += (uint64_t)n;
	}
	op_begin("close", path);
	t0 = now_ns();
	if (close(fd))
		die("close %s: %s", path, strerror(errno));
	blocked += now_ns() - t0;
	op_end();
	*got = off;
	return blocked;
}

static void verify(int i, const uint8_t *buf, uint64_t got, uint64_t size)
{
	uint8_t tag[TAG_LEN];
	uint32_t c = 0;

	if (got != size) {
		fprintf(stderr, "bench_hints: WRONG DATA: %s/%s: %" PRIu64 " bytes, expected %" PRIu64 "\n",
			o.dir, names[i], got, size);
		exit(1);
	}
	for (uint64_t off = 0; off < size; off += CHUNK, c++) {
		size_t len = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
		const uint8_t *p = buf + off;
		const char *bad = NULL;

		make_tag(tag, (uint32_t)i, c, size);
		if (memcmp(p, tag, TAG_LEN))
			bad = "head tag";
		else if (memcmp(p + len - TAG_LEN, tag, TAG_LEN))
			bad = "tail tag";
		else if (memcmp(p + TAG_LEN, rnd + TAG_LEN, len - 2 * TAG_LEN))
			bad = "content";
		if (bad) {
			const struct tag *t = (const void *)p;

			fprintf(stderr, "bench_hints: WRONG DATA: %s/%s: chunk %u (offset %" PRIu64
				"): bad %s (head: magic %s, run %s, file %u, chunk %u)\n",
				o.dir, names[i], c, off, bad,
				t->magic == TAG_MAGIC ? "ok" : "wrong",
				t->run == run_id ? "this" : "other", t->file, t->chunk);
			exit(1);
		}
	}
}

static void drop_page_cache(void)
{
	int fd;

	if (!is_tierfs) {
		/* dirty pages are not dropped: write them out first */
		fd = open(o.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd >= 0) {
			syncfs(fd);
			close(fd);
		}
	}
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "3\n", 2) != 2) {
		static bool warned;

		if (!warned)
			warn("warning: cannot drop the page cache (%s): reads may be cached",
			     strerror(errno));
		warned = true;
	}
	if (fd >= 0)
		close(fd);
}

static void usage(FILE *f)
{
	fprintf(f,
"usage: bench_hints [options] DIR\n"
"\n"
"The adjoint checkpoint workload on DIR (a tierfs mount, or a plain\n"
"directory for the baseline): a forward pass writes K checkpoints, a\n"
"backward pass reads them all back in a given order, with restore hints.\n"
"\n"
"  -k, --count K          checkpoints (default 64)\n"
"  -s, --size S           (mean) checkpoint size, K/M/G suffixes (default 16M)\n"
"      --sizes uniform|var  all S, or a spread from S/8 to 2S with mean S,\n"
"                         growing over the shot (default uniform)\n"
"  -o, --order seq|rev|irr  restore order: as written, reversed, or a seeded\n"
"                         random permutation (default seq)\n"
"  -H, --hints all|single|none  restore_order for all files before the forward\n"
"                         pass / restore_next one file ahead / none (default all)\n"
"  -c, --interval MS      compute interval between checkpoints and between\n"
"                         reads, milliseconds (default 20)\n"
"      --busy             busy-wait the compute interval (default: sleep)\n"
"      --seed N           seed of the sizes and the irregular order (default 1)\n"
"      --label L          first column, e.g. the eviction policy (default -)\n"
"      --csv              comma-separated output\n"
"      --no-header        no header line\n"
"      --no-prefetch-stop do not hold prefetching during the forward pass\n"
"      --no-wait-flush    start the backward pass without waiting for the\n"
"                         flush backlog to drain\n"
"      --drop-caches      drop the kernel page cache before the backward pass\n"
"                         (root; a plain directory is syncfs'ed first)\n"
"      --keep             keep the checkpoints\n"
"      --stats PATH       where to read " X_STATS " (default: the mount root)\n"
"      --timeout S        give up if one call blocks this long (default 300)\n"
"      --drain-timeout S  longest wait for the flush backlog (default 600)\n"
"      --print-sizes      print the checkpoint sizes and exit\n"
"  -h, --help             this text\n"
"\n"
"Columns: ckpt_GBps = bytes written / time in open+write+close; restore_GBps =\n"
"bytes read / time in open+read+close (compute intervals excluded); dist =\n"
"mean prefetch distance sampled before each read; hits/misses = cache-tier\n"
"read counters over the backward pass (tierfs only, else -).  GB = 10^9 B.\n");
}

int main(int argc, char **argv)
{
	enum { O_SIZES = 256, O_BUSY, O_SEED, O_LABEL, O_CSV, O_NOHDR, O_NOSTOP, O_NOWAIT,
	       O_DROP, O_KEEP, O_STATS, O_TIMEOUT, O_DRAINTO, O_PRINT };
	static const struct option lopts[] = {
		{ "count", required_argument, NULL, 'k' },
		{ "size", required_argument, NULL, 's' },
		{ "sizes", required_argument, NULL, O_SIZES },
		{ "order", required_argument, NULL, 'o' },
		{ "hints", required_argument, NULL, 'H' },
		{ "interval", required_argument, NULL, 'c' },
		{ "busy", no_argument, NULL, O_BUSY },
		{ "seed", required_argument, NULL, O_SEED },
		{ "label", required_argument, NULL, O_LABEL },
		{ "csv", no_argument, NULL, O_CSV },
		{ "no-header", no_argument, NULL, O_NOHDR },
		{ "no-prefetch-stop", no_argument, NULL, O_NOSTOP },
		{ "no-wait-flush", no_argument, NULL, O_NOWAIT },
		{ "drop-caches", no_argument, NULL, O_DROP },
		{ "keep", no_argument, NULL, O_KEEP },
		{ "stats", required_argument, NULL, O_STATS },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "drain-timeout", required_argument, NULL, O_DRAINTO },
		{ "print-sizes", no_argument, NULL, O_PRINT },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	int c;
	char *end;

	while ((c = getopt_long(argc, argv, "k:s:o:H:c:h", lopts, NULL)) != -1) {
		switch (c) {
		case 'k':
			o.k = (int)strtol(optarg, &end, 10);
			if (*end || o.k < 1 || o.k > 1000000)
				die("bad count '%s'", optarg);
			break;
		case 's':
			if (!parse_size(optarg, &o.s) || o.s < 64 * 1024 || o.s % 4096)
				die("bad size '%s' (64K or more, a multiple of 4K)", optarg);
			break;
		case O_SIZES: o.sizes = pick(optarg, sizes_name, 2, "--sizes"); break;
		case 'o': o.order = pick(optarg, order_name, 3, "--order"); break;
		case 'H': o.hints = pick(optarg, hints_name, 3, "--hints"); break;
		case 'c':
			o.interval_ms = strtod(optarg, &end);
			if (*end || o.interval_ms < 0)
				die("bad interval '%s'", optarg);
			break;
		case O_BUSY: o.busy = true; break;
		case O_SEED:
			o.seed = strtoull(optarg, &end, 0);
			if (*end)
				die("bad seed '%s'", optarg);
			break;
		case O_LABEL: o.label = optarg; break;
		case O_CSV: o.csv = true; break;
		case O_NOHDR: o.header = false; break;
		case O_NOSTOP: o.prefetch_stop = false; break;
		case O_NOWAIT: o.wait_flush = false; break;
		case O_DROP: o.drop_caches = true; break;
		case O_KEEP: o.keep = true; break;
		case O_STATS: o.stats = optarg; break;
		case O_TIMEOUT:
			o.timeout_s = strtod(optarg, &end);
			if (*end || o.timeout_s <= 0)
				die("bad timeout '%s'", optarg);
			break;
		case O_DRAINTO:
			o.drain_timeout_s = strtod(optarg, &end);
			if (*end || o.drain_timeout_s <= 0)
				die("bad drain timeout '%s'", optarg);
			break;
		case O_PRINT: o.print_sizes = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}

	int k = o.k;
	uint64_t *size = xmalloc(sizeof(*size) * (size_t)k);
	int *ord = xmalloc(sizeof(*ord) * (size_t)k);
	uint64_t total = 0, maxsz = 0;

	make_sizes(size);
	make_order(ord);
	for (int i = 0; i < k; i++) {
		total += size[i];
		maxsz = size[i] > maxsz ? size[i] : maxsz;
	}
	if (o.print_sizes) {
		uint64_t minsz = UINT64_MAX;

		for (int i = 0; i < k; i++) {
			minsz = size[i] < minsz ? size[i] : minsz;
			printf("%d %" PRIu64 "\n", i, size[i]);
		}
		printf("# %s sizes, K=%d: min %.2f MiB, mean %.2f MiB, max %.2f MiB, total %.3f GB\n",
		       sizes_name[o.sizes], k, minsz / 1048576.0, total / (double)k / 1048576.0,
		       maxsz / 1048576.0, total / 1e9);
		return 0;
	}
	if (optind != argc - 1) {
		usage(stderr);
		return 2;
	}
	o.dir = argv[optind];

	/* names: ckpt.NNNN, wider when K needs it */
	name_width = 4;
	for (int n = k - 1; n >= 10000; n /= 10)
		name_width++;
	names = xmalloc(sizeof(*names) * (size_t)k);
	for (int i = 0; i < k; i++) {
		names[i] = xmalloc(32);
		snprintf(names[i], 32, "ckpt.%0*d", name_width, i);
	}

	bool created = false;

	if (mkdir(o.dir, 0755) == 0)
		created = true;
	else if (errno != EEXIST)
		die("mkdir %s: %s", o.dir, strerror(errno));
	if (o.stats)
		snprintf(stats_path, sizeof(stats_path), "%s", o.stats);
	else
		find_root(o.dir, stats_path, sizeof(stats_path));
	{
		char *js = stats_get();

		is_tierfs = js != NULL;
		free(js);
	}
	if (!is_tierfs && o.hints != H_NONE)
		warn("note: %s is not on tierfs (no %s at %s): hints are not sent",
		     o.dir, X_STATS, stats_path);

	/* data */
	uint64_t seed = now_ns() ^ ((uint64_t)getpid() << 32);

	run_id = rng_next(&seed);
	rnd = xmalloc(CHUNK);
	for (size_t i = 0; i < CHUNK; i += 8) {
		uint64_t v = rng_next(&seed);

		memcpy(rnd + i, &v, 8);
	}
	uint8_t *wbuf = xmalloc(CHUNK);
	uint64_t rcap = maxsz + CHUNK;	/* room to notice a too-long file */
	uint8_t *rbuf = xmalloc(rcap);

	memcpy(wbuf, rnd, CHUNK);
	memset(rbuf, 0, rcap);	/* fault it in now, not during the reads */

	pthread_t wd;

	if (pthread_create(&wd, NULL, watchdog, NULL) == 0)
		pthread_detach(wd);

	/* 1. set-up */
	double drain0_s = is_tierfs ? drain("before the run") : 0;

	if (o.prefetch_stop)
		hint_set(o.dir, X_PREFETCH, "stop", 4);
	if (o.hints == H_ALL && is_tierfs) {
		/* in pieces that stay under the kernel's 64 KiB value limit */
		char *val = xmalloc(XATTR_CHUNK + 64);
		size_t len = 0;

		for (int j = 0; j <= k; j++) {
			size_t nl = j < k ? strlen(names[ord[j]]) + 1 : 0;

			if (len && (j == k || len + nl > XATTR_CHUNK)) {
				hint_set(o.dir, X_ORDER, val, len);
				len = 0;
			}
			if (j < k) {
				memcpy(val + len, names[ord[j]], nl - 1);
				val[len + nl - 1] = '\n';
				len += nl;
			}
		}
		free(val);
	}

	/* 2. forward pass */
	uint64_t ckpt_ns = 0, t_fwd = now_ns();

	for (int i = 0; i < k; i++) {
		compute_until(now_ns());
		ckpt_ns += write_ckpt(i, size[i], wbuf);
	}
	double fwd_wall = (double)(now_ns() - t_fwd) / 1e9;

	/* 3. between the passes */
	double drain_s = is_tierfs && o.wait_flush ? drain("after the forward pass") : 0;

	if (o.drop_caches)
		drop_page_cache();
	if (o.prefetch_stop)
		hint_set(o.dir, X_PREFETCH, "start", 5);

	/* 4. backward pass */
	struct stats s0, s1, sn;
	bool have0 = is_tierfs && stats_read(&s0);
	uint64_t restore_ns = 0, rbytes = 0, t_bwd = now_ns();
	long long dist_sum = 0, dist_max = -1;
	long dist_n = 0;

	for (int j = 0; j < k; j++) {
		int i = ord[j];
		uint64_t got;

		if (o.hints == H_SINGLE && j + 1 < k) {
			char path[PATH_MAX + 64];

			path_of(path, sizeof(path), ord[j + 1]);
			hint_set(path, X_NEXT, "", 0);
		}
		if (is_tierfs && stats_read(&sn) && sn.distance >= 0) {
			dist_sum += sn.distance;
			dist_max = sn.distance > dist_max ? sn.distance : dist_max;
			dist_n++;
		}
		restore_ns += read_ckpt(i, rbuf, rcap, &got);
		rbytes += got;
		uint64_t t0 = now_ns();	/* the compute interval starts */

		verify(i, rbuf, got, size[i]);
		compute_until(t0);
	}
	double bwd_wall = (double)(now_ns() - t_bwd) / 1e9;
	bool have1 = have0 && stats_read(&s1);

	/* 5. clean-up */
	if (!o.keep) {
		char path[PATH_MAX + 64];

		if (is_tierfs && o.hints != H_NONE)
			removexattr(o.dir, X_ORDER);	/* leftovers, if any */
		for (int i = 0; i < k; i++) {
			path_of(path, sizeof(path), i);
			if (unlink(path))
				warn("warning: unlink %s: %s", path, strerror(errno));
		}
		if (created && rmdir(o.dir))
			warn("warning: rmdir %s: %s", o.dir, strerror(errno));
	}

	/* result */
	double ckpt_gbps = ckpt_ns ? (double)total / ((double)ckpt_ns / 1e9) / 1e9 : 0;
	double rest_gbps = restore_ns ? (double)rbytes / ((double)restore_ns / 1e9) / 1e9 : 0;
	char dist[32] = "-", dmax[32] = "-", hits[32] = "-", misses[32] = "-";
	char pref[32] = "-", evic[32] = "-", ssize[32];

	if (dist_n) {
		snprintf(dist, sizeof(dist), "%.2f", (double)dist_sum / (double)dist_n);
		snprintf(dmax, sizeof(dmax), "%lld", dist_max);
	}
	if (have1) {
		if (s0.hits >= 0 && s1.hits >= 0)
			snprintf(hits, sizeof(hits), "%lld", s1.hits - s0.hits);
		if (s0.misses >= 0 && s1.misses >= 0)
			snprintf(misses, sizeof(misses), "%lld", s1.misses - s0.misses);
		if (s0.prefetched >= 0 && s1.prefetched >= 0)
			snprintf(pref, sizeof(pref), "%lld", s1.prefetched - s0.prefetched);
		if (s0.evictions >= 0 && s1.evictions >= 0)
			snprintf(evic, sizeof(evic), "%lld", s1.evictions - s0.evictions);
	}
	char d0[32] = "timeout", d1[32] = "timeout";

	if (drain0_s >= 0)
		snprintf(d0, sizeof(d0), "%.3f", drain0_s);
	if (drain_s >= 0)
		snprintf(d1, sizeof(d1), "%.3f", drain_s);
	if (o.s % (1 << 20) == 0)
		snprintf(ssize, sizeof(ssize), "%" PRIu64 "M", o.s >> 20);
	else
		snprintf(ssize, sizeof(ssize), "%" PRIu64 "K", o.s >> 10);

	if (o.csv) {
		if (o.header)
			printf("label,sizes,order,hints,K,S,total_GB,ckpt_GBps,restore_GBps,"
			       "dist_avg,dist_max,hits,misses,prefetched,evictions,ckpt_s,restore_s,"
			       "fwd_wall_s,bwd_wall_s,drain_before_s,drain_s,hint_ms,hint_err,interval_ms,tierfs\n");
		printf("%s,%s,%s,%s,%d,%s,%.4f,%.4f,%.4f,%s,%s,%s,%s,%s,%s,%.4f,%.4f,"
		       "%.3f,%.3f,%s,%s,%.3f,%ld,%g,%d\n",
		       o.label, sizes_name[o.sizes], order_name[o.order], hints_name[o.hints], k,
		       ssize, total / 1e9, ckpt_gbps, rest_gbps, dist, dmax, hits, misses, pref,
		       evic, ckpt_ns / 1e9, restore_ns / 1e9, fwd_wall, bwd_wall, d0, d1,
		       hint_ns / 1e6, hint_err, o.interval_ms, is_tierfs);
	} else {
		if (o.header)
			printf("%-8s %-7s %-5s %-6s %5s %6s %8s %9s %12s %6s %8s %8s\n",
			       "label", "sizes", "order", "hints", "K", "S", "GB", "ckpt_GB/s",
			       "restore_GB/s", "dist", "hits", "misses");
		printf("%-8s %-7s %-5s %-6s %5d %6s %8.3f %9.3f %12.3f %6s %8s %8s%s%s\n",
		       o.label, sizes_name[o.sizes], order_name[o.order], hints_name[o.hints], k,
		       ssize, total / 1e9, ckpt_gbps, rest_gbps, dist, hits, misses,
		       hint_err ? "  (hints rejected)" : "",
		       drain0_s < 0 || drain_s < 0 ? "  (flush backlog did not drain)" : "");
	}
	fflush(stdout);
	return 0;
}
