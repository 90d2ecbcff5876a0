/*
 * bench_gpu_hints.c - restore throughput of GPU checkpoints: tierfs with
 * all restore hints against the "unified memory" baseline of hpdc23 §5.2.2,
 * on one GPU, in one run.
 *
 * The workload is bench_hints.c's adjoint shot (read its header: the same
 * --sizes formula and --seed semantics, the same seq/rev/irr orders), with
 * the application's data on the GPU: checkpoint i is written from a
 * cuMemAlloc buffer and restored into another.
 *
 *  Forward pass: K iterations: a compute interval (-c MS, sleep or --busy),
 *  during which the write buffer is filled (below), then checkpoint i.
 *  Backward pass: K iterations in the restore order: restore, then a
 *  compute interval during which the restored data is verified.
 *  Throughput = bytes / time blocked in the checkpoint or restore calls
 *  (GB = 10^9 bytes); fill and verification are never timed.
 *
 * Modes (--mode, a comma-separated list run one after the other, each on
 * the same sizes and order; one table at the end):
 *
 *  tierfs  The files DIR/ckpt.NNNN on a tierfs mount with a GPU tier
 *          (tierfs B M -o gpu=0,gpu_cache=...,host_cache=...).  Set-up: a
 *          small warm-up file is written and read back (the first IPC
 *          export and open are not part of the shot) and unlinked, the
 *          flush backlog drains ("flush_backlog" of user.tierfs.stats on
 *          the mount root reaches 0), user.tierfs.prefetch = "stop" and
 *          user.tierfs.restore_order = every name in restore order (all
 *          hints) are set on DIR.  Checkpoint: open(O_CREAT|O_TRUNC|
 *          O_WRONLY), tierfs_pwrite_gpu, close.  Between the passes: the
 *          sizes are checked (stat), the backlog drains (the paper's
 *          "restore phase waits for checkpoint phase", §5.4.2), then
 *          prefetch = "start".  Restore: open(O_RDONLY), tierfs_pread_gpu
 *          of the whole file, close.  Statistics of the backward pass: hits
 *          and misses of the GPU tier, files prefetched, and the prefetch
 *          distance sampled before each restore.  The files are unlinked
 *          afterwards unless --keep.  --tiers prints, after the forward
 *          pass, each checkpoint's fastest tier (user.tierfs.tier: G, H or
 *          S), and for each restore where it found the file (read just
 *          before the timed restore) and how long it took.
 *
 *  um      The paper's optimised UVM baseline.  Each checkpoint has its own
 *          cuMemAllocManaged allocation (made before the shot, advised
 *          SET_ACCESSED_BY the GPU); the bytes resident on the GPU are
 *          bounded by --gpu-cache (the same size as tierfs's GPU cache).
 *          Checkpoint (timed): while the new checkpoint does not fit under
 *          the bound, the oldest resident one is migrated to the host
 *          (advise SET_PREFERRED_LOCATION host + cuMemPrefetchAsync to the
 *          host: FIFO); then advise SET_PREFERRED_LOCATION GPU,
 *          cuMemPrefetchAsync to the GPU (populates its pages there) and
 *          cuMemcpyDtoDAsync from the application's buffer, all on the
 *          application's stream, and a stream synchronisation.  Restore: a
 *          prefetch thread, started where tierfs gets "start", walks the
 *          restore order: for the next checkpoint it makes room under the
 *          bound by migrating to the host checkpoints already consumed
 *          (first) or resident ones needed later than it (farthest first),
 *          waits for the application to consume when neither exists, then
 *          advises SET_PREFERRED_LOCATION GPU and cuMemPrefetchAsync's it on
 *          its own stream, and records an event.  A checkpoint still
 *          resident from the forward pass needs no prefetch.  Restore
 *          (timed): wait until the prefetch thread has reached this
 *          checkpoint, make the application's stream wait for its event,
 *          cuMemcpyDtoDAsync into the application's buffer, synchronise.
 *          The whole managed total must fit in the GPU's free memory:
 *          oversubscribed managed memory can hang the GPU, so the mode
 *          refuses to run otherwise.
 *
 *  raw     A ceiling: every checkpoint kept in its own cuMemAlloc buffer;
 *          checkpoint and restore are one device-to-device copy each.
 *
 * Data.  The write buffer of checkpoint i is filled with a 32-bit word
 * derived from i and a per-process run id (cuMemsetD32Async), with a
 * 64-byte tag (magic, run id, file index, offset, size) copied from the
 * host at 16 places and at the end.  Verification copies a 4 KiB window
 * around every tag back to the host and compares it with what it must
 * hold; a wrong byte or size ends the program with exit status 1.
 *
 * Exit status: 0 (the target line is printed, not asserted); 1 wrong data
 * or a failed CUDA or I/O call (named on stderr); 2 usage or set-up
 * errors; 3 a call blocked longer than --timeout; 77 no CUDA driver or
 * device here.  The driver is loaded at run time (dlopen of libcuda.so.1),
 * so the binary runs, and says so, where there is none.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "tierfs.h"

#define BENCH_PROG	"bench_gpu_hints"
#include "bench_common.h"

#define PROG		BENCH_PROG
#define SIZE_ALIGN	(64u << 10)		/* variable sizes: a multiple */
#define TAG_LEN		64u
#define TAG_MAGIC	0x3173746e69687067ull	/* "gphints1" */
#define NSAMP		16			/* tags per checkpoint, + the end */
#define WIN		4096u			/* verification window */
#define POLL_NS		2000000ull		/* stats poll period: 2 ms */
#define XATTR_CHUNK	60000u			/* restore_order bytes per call */
#define UM_MARGIN	(512ull << 20)		/* free memory left beside um */
#define RAW_MARGIN	(256ull << 20)

/* ---- the CUDA driver, loaded at run time ------------------------------ */

/*
 * Every driver call used here: the API name as written in code, and the
 * member of `drv` that holds it.  cuda.h maps many names to versioned
 * symbols (cuMemAlloc -> cuMemAlloc_v2); DRV_STR() sees them expanded, so
 * dlsym() looks up what libcuda exports, and __typeof__ gives the
 * member that symbol's type.  After the table each name is redirected to
 * its member: a call that misses its redirect fails to link (nothing
 * provides driver symbols at link time).
 */
#define DRV_FUNCS(X)					\
	X(cuInit, Init)					\
	X(cuDriverGetVersion, DriverGetVersion)		\
	X(cuGetErrorName, GetErrorName)			\
	X(cuDeviceGetCount, DeviceGetCount)		\
	X(cuDeviceGet, DeviceGet)			\
	X(cuDeviceGetName, DeviceGetName)		\
	X(cuDeviceGetAttribute, DeviceGetAttribute)	\
	X(cuDevicePrimaryCtxRetain, PrimaryCtxRetain)	\
	X(cuCtxSetCurrent, CtxSetCurrent)		\
	X(cuMemGetInfo, MemGetInfo)			\
	X(cuMemAlloc, MemAlloc)				\
	X(cuMemAllocManaged, MemAllocManaged)		\
	X(cuMemFree, MemFree)				\
	X(cuMemAdvise, MemAdvise)			\
	X(cuMemPrefetchAsync, MemPrefetchAsync)		\
	X(cuMemcpyHtoDAsync, MemcpyHtoDAsync)		\
	X(cuMemcpyDtoHAsync, MemcpyDtoHAsync)		\
	X(cuMemcpyDtoDAsync, MemcpyDtoDAsync)		\
	X(cuMemsetD32Async, MemsetD32Async)		\
	X(cuStreamCreate, StreamCreate)			\
	X(cuStreamDestroy, StreamDestroy)		\
	X(cuStreamSynchronize, StreamSynchronize)	\
	X(cuStreamWaitEvent, StreamWaitEvent)		\
	X(cuEventCreate, EventCreate)			\
	X(cuEventDestroy, EventDestroy)			\
	X(cuEventRecord, EventRecord)

#define DRV_STR_(x)	#x
#define DRV_STR(x)	DRV_STR_(x)
#define DRV_MEMBER(api, m)	__typeof__(api) *m;
#define DRV_SLOT(api, m)	{ DRV_STR(api), (void **)&drv.m },

static struct {
	DRV_FUNCS(DRV_MEMBER)
} drv;

static const struct {
	const char *sym;	/* exported symbol, e.g. "cuMemAlloc_v2" */
	void **slot;		/* its member of drv */
} drv_syms[] = {
	DRV_FUNCS(DRV_SLOT)
};

#undef cuInit
#define cuInit			(drv.Init)
#undef cuDriverGetVersion
#define cuDriverGetVersion	(drv.DriverGetVersion)
#undef cuGetErrorName
#define cuGetErrorName		(drv.GetErrorName)
#undef cuDeviceGetCount
#define cuDeviceGetCount	(drv.DeviceGetCount)
#undef cuDeviceGet
#define cuDeviceGet		(drv.DeviceGet)
#undef cuDeviceGetName
#define cuDeviceGetName		(drv.DeviceGetName)
#undef cuDeviceGetAttribute
#define cuDeviceGetAttribute	(drv.DeviceGetAttribute)
#undef cuDevicePrimaryCtxRetain
#define cuDevicePrimaryCtxRetain (drv.PrimaryCtxRetain)
#undef cuCtxSetCurrent
#define cuCtxSetCurrent		(drv.CtxSetCurrent)
#undef cuMemGetInfo
#define cuMemGetInfo		(drv.MemGetInfo)
#undef cuMemAlloc
#define cuMemAlloc		(drv.MemAlloc)
#undef cuMemAllocManaged
#define cuMemAllocManaged	(drv.MemAllocManaged)
#undef cuMemFree
#define cuMemFree		(drv.MemFree)
#undef cuMemAdvise
#define cuMemAdvise		(drv.MemAdvise)
#undef cuMemPrefetchAsync
#define cuMemPrefetchAsync	(drv.MemPrefetchAsync)
#undef cuMemcpyHtoDAsync
#define cuMemcpyHtoDAsync	(drv.MemcpyHtoDAsync)
#undef cuMemcpyDtoHAsync
#define cuMemcpyDtoHAsync	(drv.MemcpyDtoHAsync)
#undef cuMemcpyDtoDAsync
#define cuMemcpyDtoDAsync	(drv.MemcpyDtoDAsync)
#undef cuMemsetD32Async
#define cuMemsetD32Async	(drv.MemsetD32Async)
#undef cuStreamCreate
#define cuStreamCreate		(drv.StreamCreate)
#undef cuStreamDestroy
#define cuStreamDestroy		(drv.StreamDestroy)
#undef cuStreamSynchronize
#define cuStreamSynchronize	(drv.StreamSynchronize)
#undef cuStreamWaitEvent
#define cuStreamWaitEvent	(drv.StreamWaitEvent)
#undef cuEventCreate
#define cuEventCreate		(drv.EventCreate)
#undef cuEventDestroy
#define cuEventDestroy		(drv.EventDestroy)
#undef cuEventRecord
#define cuEventRecord		(drv.EventRecord)

/* Load libcuda.so.1 and every symbol; false with the reason in msg. */
static bool drv_load(char *msg, size_t len)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	size_t i;

	if (!h) {
		snprintf(msg, len, "no CUDA driver (libcuda.so.1: %s)", dlerror());
		return false;
	}
	for (i = 0; i < sizeof(drv_syms) / sizeof(drv_syms[0]); i++) {
		*drv_syms[i].slot = dlsym(h, drv_syms[i].sym);
		if (!*drv_syms[i].slot) {
			snprintf(msg, len, "the CUDA driver lacks %s (too old for "
				 "this CUDA 13 build?)", drv_syms[i].sym);
			return false;
		}
	}
	return true;
}

/* ---- options ---------------------------------------------------------- */

enum sizes { SZ_UNIFORM, SZ_VAR };
enum mode { M_TIERFS, M_UM, M_RAW, NMODES };

static const char *const sizes_name[] = { "uniform", "var" };
static const char *const order_name[] = { "seq", "rev", "irr" };
static const char *const mode_name[NMODES] = { "tierfs", "um", "raw" };

static struct {
	bool mode[NMODES];
	const char *dir;
	int k;
	uint64_t s;
	enum sizes sizes;
	enum bench_order order;
	double interval_ms;
	bool busy;
	uint64_t seed;
	uint64_t gpu_cache;
	int device;
	const char *stats;
	bool keep;
	bool print_sizes;
	bool tiers;
	double timeout_s;
	double drain_timeout_s;
	double gpu_wait_s;
	double target;
} o = {
	.k = 32,
	.s = 64ull << 20,
	.sizes = SZ_UNIFORM,
	.order = ORD_SEQ,
	.interval_ms = 10,
	.seed = 1,
	.gpu_cache = 1ull << 30,
	.timeout_s = 300,
	.drain_timeout_s = 600,
	.gpu_wait_s = 120,
	.target = 10,
};

/* ---- helpers ---------------------------------------------------------- */

/* A failed run (wrong data, a failed call): exit status 1. */
static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay(fmt, ap);
	va_end(ap);
	exit(1);
}

/* A failed driver call: its text and the error's name; exit status 1. */
static void cu_check(CUresult r, const char *call)
{
	const char *name = NULL;

	if (r == CUDA_SUCCESS)
		return;
	if (!drv.GetErrorName || cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
		name = "unknown error";
	fail("%s: %s (%d)", call, name, (int)r);
}

#define CK(call)	cu_check((call), #call)

static void *xcalloc(size_t n, size_t each)
{
	void *p = calloc(n ? n : 1, each ? each : 1);

	if (!p)
		die("out of memory (%zu bytes)", n * each);
	return p;
}

/* b bytes as "1.00 GiB" or, below 1 GiB, "96.0 MiB", in buf. */
static const char *gib(uint64_t b, char *buf, size_t len)
{
	if (b >= 1ull << 30)
		snprintf(buf, len, "%.2f GiB", (double)b / (1ull << 30));
	else
		snprintf(buf, len, "%.1f MiB", (double)b / (1ull << 20));
	return buf;
}

/* ---- watchdog --------------------------------------------------------- */

static uint64_t op_since;		/* start of the blocking call; 0: none */
static const char *op_what = "";	/* which call (read by the watchdog) */

static void op_begin(const char *what)
{
	op_what = what;
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
			fprintf(stderr, PROG ": %s: blocked for more than %.0f s, giving up\n",
				op_what, o.timeout_s);
			fflush(stderr);
			_exit(3);
		}
	}
	return NULL;
}

/* ---- the workload: sizes, order, compute interval --------------------- */

static int k;			/* o.k */
static uint64_t *size;		/* per checkpoint */
static int *ord;		/* restore order: ord[j] = checkpoint */
static uint64_t total, maxsz;

/* bench_hints.c's sizes: uniform S, or the RTM-like spread (its header). */
static void make_sizes(void)
{
	ckpt_sizes(size, k, o.s, o.sizes == SZ_VAR, o.seed, SIZE_ALIGN);
}

static void make_order(void)
{
	ckpt_order(ord, k, o.order, o.seed);
}

/* The compute interval that started at t0 (absolute deadline). */
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

/* ---- GPU state and the data pattern ----------------------------------- */

static CUdevice dev;
static CUcontext ctx;
static CUstream st;		/* the application's stream (non-blocking) */
static CUdeviceptr wbuf, rbuf;	/* the application's buffers, maxsz each */
static uint64_t run_id;

struct tag {
	uint64_t magic;
	uint64_t run;
	uint32_t file;
	uint32_t place;
	uint64_t off;
	uint64_t size;
	uint8_t pad[24];
};

static uint32_t word_of(int i)
{
	return (uint32_t)(run_id >> 32) ^ (0x9e3779b1u * (uint32_t)(i + 1));
}

/* Where the tags of an n-byte checkpoint go: NSAMP places and the end. */
static uint64_t tag_off(uint64_t n, int p)
{
	if (p == NSAMP)
		return n - TAG_LEN;
	return (n / NSAMP * (uint64_t)p) & ~(uint64_t)(TAG_LEN - 1);
}

static void make_tag(struct tag *t, int i, int p, uint64_t n)
{
	_Static_assert(sizeof(struct tag) == TAG_LEN, "tag size");
	memset(t, 0, sizeof(*t));
	t->magic = TAG_MAGIC;
	t->run = run_id;
	t->file = (uint32_t)i;
	t->place = (uint32_t)p;
	t->off = tag_off(n, p);
	t->size = n;
}

/* Fill the write buffer with checkpoint i (untimed: "compute"). */
static void fill(int i)
{
	static struct tag tags[NSAMP + 1];
	uint64_t n = size[i];

	CK(cuMemsetD32Async(wbuf, word_of(i), n / 4, st));
	for (int p = 0; p <= NSAMP; p++) {
		make_tag(&tags[p], i, p, n);
		CK(cuMemcpyHtoDAsync(wbuf + tags[p].off, &tags[p], TAG_LEN, st));
	}
	CK(cuStreamSynchronize(st));
}

/* What bytes [w, w + len) of checkpoint i hold. */
static void expected(int i, uint64_t w, size_t len, uint8_t *out)
{
	uint32_t word = word_of(i);
	uint64_t n = size[i];
	struct tag t;

	for (size_t b = 0; b < len; b += 4)	/* w and len are multiples of 4 */
		memcpy(out + b, &word, 4);
	for (int p = 0; p <= NSAMP; p++) {
		uint64_t a = tag_off(n, p);

		if (a + TAG_LEN <= w || a >= w + len)
			continue;
		make_tag(&t, i, p, n);
		for (uint64_t x = a; x < a + TAG_LEN; x++)
			if (x >= w && x < w + len)
				out[x - w] = ((const uint8_t *)&t)[x - a];
	}
}

/* Check the restored buffer against checkpoint i; exit 1 if it differs. */
static void verify(const char *mode, int i)
{
	static uint8_t got[WIN], want[WIN];
	uint64_t n = size[i];

	for (int p = 0; p <= NSAMP; p++) {
		uint64_t a = tag_off(n, p);
		uint64_t w = a + WIN <= n ? a : n - WIN;

		CK(cuMemcpyDtoHAsync(got, rbuf + w, WIN, st));
		CK(cuStreamSynchronize(st));
		expected(i, w, WIN, want);
		if (memcmp(got, want, WIN) == 0)
			continue;

		size_t b = 0;

		while (got[b] == want[b])
			b++;
		const struct tag *t = (const void *)(got + (a - w));

		fail("WRONG DATA: %s: checkpoint %d (%" PRIu64 " bytes): byte %" PRIu64
		     " differs (the tag there says: magic %s, run %s, file %u, offset %" PRIu64
		     ", size %" PRIu64 ")", mode, i, n, w + b,
		     t->magic == TAG_MAGIC ? "ok" : "wrong", t->run == run_id ? "this" : "other",
		     t->file, t->off, t->size);
	}
}

/* ---- tierfs statistics (the JSON of user.tierfs.stats) ----------------- */

static char stats_path[PATH_MAX];	/* the mount root */

/* The stats JSON of the mount root, malloc'ed, or NULL. */
static char *stats_get(void)
{
	size_t cap = 64 << 10;

	for (int tries = 0; tries < 4; tries++) {
		char *buf = xmalloc(cap + 1);
		ssize_t n = getxattr(stats_path, TIERFS_XATTR_STATS, buf, cap);

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

/* The first "key": in [p, end) as a number (true/false: 1/0); -1: absent. */
static long long json_num(const char *p, const char *end, const char *key)
{
	char pat[64], *e;
	long long v;

	if (!p)
		return -1;
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(p, pat);
	if (!p || p >= end)
		return -1;
	p += strlen(pat);
	if (strncmp(p, "true", 4) == 0)
		return 1;
	if (strncmp(p, "false", 5) == 0)
		return 0;
	v = strtoll(p, &e, 10);
	return e == p ? -1 : v;
}

/* Numbers of interest, -1 where absent. */
struct stats {
	bool gpu;			/* the GPU tier is up */
	long long gpu_capacity, gpu_mapped, gpu_device;
	long long gpu_hits, gpu_misses, gpu_evictions;
	long long gpu_fragments, gpu_gaps, gpu_used;
	long long distance, prefetched;
	long long backlog, running;
};

static bool stats_read(struct stats *s)
{
	char *js = stats_get();
	const char *b, *e, *g = NULL, *ge = NULL, *end;

	memset(s, 0xff, sizeof(*s));	/* every count -1 */
	s->gpu = false;
	if (!js)
		return false;
	end = js + strlen(js);
	if ((b = json_obj(js, end, "tiers", &e)) && (g = json_obj(b, e, "gpu", &ge)))
		s->gpu = true;
	s->gpu_capacity = json_num(g, ge, "capacity");
	s->gpu_mapped = json_num(g, ge, "fully_mapped");
	s->gpu_device = json_num(g, ge, "device_id");
	s->gpu_hits = json_num(g, ge, "hits");
	s->gpu_misses = json_num(g, ge, "misses");
	s->gpu_evictions = json_num(g, ge, "evictions");
	s->gpu_fragments = json_num(g, ge, "fragments");
	s->gpu_gaps = json_num(g, ge, "gaps");
	s->gpu_used = json_num(g, ge, "used");
	if ((b = json_obj(js, end, "prefetch", &e))) {
		s->distance = json_num(b, e, "distance");
		s->prefetched = json_num(b, e, "files_prefetched");
	}
	if ((b = json_obj(js, end, "ssd", &e))) {
		s->backlog = json_num(b, e, "flush_backlog");
		s->running = json_num(b, e, "flushes_running");
	}
	free(js);
	return true;
}

/* Wait until nothing is left to flush; seconds waited, -1: timed out. */
static double drain(const char *when)
{
	uint64_t t0 = now_ns();
	struct stats s;

	for (;;) {
		if (!stats_read(&s))
			die("%s: cannot read %s at %s: %s", when, TIERFS_XATTR_STATS,
			    stats_path, strerror(errno));
		if (s.backlog <= 0 && s.running <= 0)
			break;
		if ((double)(now_ns() - t0) / 1e9 > o.drain_timeout_s) {
			warn("warning: %s: flush backlog still %lld bytes (%lld flushes running) "
			     "after %.0f s; going on", when, s.backlog, s.running,
			     o.drain_timeout_s);
			return -1;
		}
		struct timespec ts = { 0, POLL_NS };
		nanosleep(&ts, NULL);
	}
	return (double)(now_ns() - t0) / 1e9;
}

/* ---- results ---------------------------------------------------------- */

struct result {
	bool ran;
	uint64_t ckpt_ns, restore_ns;	/* blocked in the calls */
	double fwd_wall, bwd_wall;	/* seconds, whole passes */
	char note[256];			/* mode-specific counters */
};

static struct result res[NMODES];

/* ---- mode tierfs ------------------------------------------------------ */

static char **names;		/* ckpt.NNNN */

static void path_of(char *buf, size_t len, int i)
{
	snprintf(buf, len, "%s/%s", o.dir, names[i]);
}

static void set_hint(const char *name, const char *val, size_t len)
{
	if (setxattr(o.dir, name, val, len, 0))
		die("setxattr(%s, %s): %s (does this tierfs take restore hints?)",
		    o.dir, name, strerror(errno));
}

/* Write n bytes of wbuf as path; nanoseconds blocked. */
static uint64_t tierfs_ckpt(const char *path, uint64_t n)
{
	uint64_t t0 = now_ns();
	ssize_t r;
	int fd;

	op_begin("checkpoint (open, tierfs_pwrite_gpu, close)");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		fail("open %s: %s", path, strerror(errno));
	r = tierfs_pwrite_gpu(fd, (const void *)(uintptr_t)wbuf, n, 0);
	if (r != (ssize_t)n)
		fail("tierfs_pwrite_gpu %s: %s", path,
		     r < 0 ? strerror(errno) : "short write");
	if (close(fd))
		fail("close %s: %s", path, strerror(errno));
	op_end();
	return now_ns() - t0;
}

/* Read the n-byte path into rbuf; nanoseconds blocked. */
static uint64_t tierfs_restore(const char *path, uint64_t n)
{
	uint64_t t0 = now_ns();
	ssize_t r;
	int fd;

	op_begin("restore (open, tierfs_pread_gpu, close)");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		fail("open %s: %s", path, strerror(errno));
	r = tierfs_pread_gpu(fd, (void *)(uintptr_t)rbuf, n, 0);
	if (r != (ssize_t)n)
		fail("tierfs_pread_gpu %s: %s", path,
		     r < 0 ? strerror(errno) : "short read");
	if (close(fd))
		fail("close %s: %s", path, strerror(errno));
	op_end();
	return now_ns() - t0;
}

/*
 * --tiers: the fastest tier holding checkpoint i, as one letter: G (the
 * GPU cache), H (the host cache), S (the SSD only), ? (unreadable).
 */
static char tier_letter(int i)
{
	char path[PATH_MAX], val[256];
	ssize_t n;

	path_of(path, sizeof(path), i);
	n = getxattr(path, TIERFS_XATTR_TIER, val, sizeof(val) - 1);
	if (n < 0)
		return '?';
	val[n] = 0;
	return !strncmp(val, "gpu", 3) ? 'G' : !strncmp(val, "host", 4) ? 'H' :
	       !strncmp(val, "ssd", 3) ? 'S' : '?';
}

static bool dir_created;	/* rmdir it at the end */

/* atexit: a DIR this run created goes when a set-up error ends the run
 * (rmdir: only while it is empty, and never twice). */
static void dir_remove(void)
{
	if (dir_created)
		rmdir(o.dir);
}

/* Create DIR and check the mount before anything runs: tierfs, and a GPU
 * tier on our device (waiting for it to come up). */
static void tierfs_probe(void)
{
	struct stats s;
	uint64_t t0 = now_ns();
	char b1[32], b2[32];
	bool warned = false;

	if (mkdir(o.dir, 0755) == 0) {
		dir_created = true;
		atexit(dir_remove);
	} else if (errno != EEXIST)
		die("mkdir %s: %s", o.dir, strerror(errno));
	if (o.stats)
		snprintf(stats_path, sizeof(stats_path), "%s", o.stats);
	else
		find_root(o.dir, stats_path, sizeof(stats_path));
	if (!stats_read(&s))
		die("%s is not on tierfs (no %s at %s)", o.dir, TIERFS_XATTR_STATS,
		    stats_path);
	/* the GPU tier comes up in the background after the mount */
	while (!s.gpu || s.gpu_mapped == 0) {
		if ((double)(now_ns() - t0) / 1e9 > o.gpu_wait_s) {
			if (!s.gpu)
				die("the tierfs mount at %s has no GPU tier after %.0f s "
				    "(mount it with -o gpu=%d; its log may say why)",
				    stats_path, o.gpu_wait_s, o.device);
			warn("warning: the GPU tier is not fully mapped after %.0f s; going on",
			     o.gpu_wait_s);
			break;
		}
		if (!warned)
			fprintf(stderr, PROG ": waiting for the GPU tier of %s\n", stats_path);
		warned = true;
		struct timespec ts = { 0, 20000000 };
		nanosleep(&ts, NULL);
		stats_read(&s);
	}
	if (s.gpu_device >= 0 && s.gpu_device != o.device)
		die("the mount's GPU tier is on device %lld, this run uses device %d "
		    "(--device)", s.gpu_device, o.device);
	if (s.gpu_capacity > 0 && (uint64_t)s.gpu_capacity != o.gpu_cache)
		warn("warning: the mount's GPU cache is %s, --gpu-cache (um's bound) %s",
		     gib((uint64_t)s.gpu_capacity, b1, sizeof(b1)),
		     gib(o.gpu_cache, b2, sizeof(b2)));
	if (s.gpu_capacity > 0 && maxsz > (uint64_t)s.gpu_capacity)
		warn("warning: the largest checkpoint does not fit in the mount's GPU cache");
	printf("# tierfs: dir %s, mount %s, GPU cache %s\n", o.dir, stats_path,
	       s.gpu_capacity > 0 ? gib((uint64_t)s.gpu_capacity, b1, sizeof(b1)) : "?");
}

static void run_tierfs(struct result *r)
{
	char path[PATH_MAX + 64];
	struct stats s0, s1, sn;
	long long dist_sum = 0, dist_n = 0;

	/* 1. set-up: warm-up (first export and IPC open), hints */
	snprintf(path, sizeof(path), "%s/warmup", o.dir);
	fill(0);
	tierfs_ckpt(path, SIZE_ALIGN);
	tierfs_restore(path, SIZE_ALIGN);
	if (unlink(path))
		fail("unlink %s: %s", path, strerror(errno));
	drain("before the run");
	set_hint(TIERFS_XATTR_PREFETCH, "stop", 4);
	{
		char *val = xmalloc(XATTR_CHUNK + 64);
		size_t len = 0;

		for (int j = 0; j <= k; j++) {
			size_t nl = j < k ? strlen(names[ord[j]]) + 1 : 0;

			if (len && (j == k || len + nl > XATTR_CHUNK)) {
				set_hint(TIERFS_XATTR_RESTORE_ORDER, val, len);
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
	uint64_t t_fwd = now_ns(), slow_ckpt = 0;
	int slow_i = 0;

	for (int i = 0; i < k; i++) {
		uint64_t t0 = now_ns();

		fill(i);
		compute_until(t0);
		path_of(path, sizeof(path), i);
		uint64_t dt = tierfs_ckpt(path, size[i]);

		r->ckpt_ns += dt;
		if (dt > slow_ckpt) {
			slow_ckpt = dt;
			slow_i = i;
		}
	}
	r->fwd_wall = (double)(now_ns() - t_fwd) / 1e9;

	/* 3. between the passes */
	for (int i = 0; i < k; i++) {
		struct stat sb;

		path_of(path, sizeof(path), i);
		if (stat(path, &sb))
			fail("stat %s: %s", path, strerror(errno));
		if ((uint64_t)sb.st_size != size[i])
			fail("WRONG DATA: tierfs: %s has %lld bytes, %" PRIu64 " written",
			     path, (long long)sb.st_size, size[i]);
	}
	double drain_s = drain("after the forward pass");
	char *where = o.tiers ? xmalloc((size_t)k + 1) : NULL;

	if (o.tiers) {
		struct stats st;

		for (int i = 0; i < k; i++)
			where[i] = tier_letter(i);
		where[k] = 0;
		printf("tiers after the forward pass (write order): %s\n", where);
		if (stats_read(&st) && st.gpu)
			printf("gpu tier: %lld fragments, %lld gaps, %lld bytes used\n",
			       st.gpu_fragments, st.gpu_gaps, st.gpu_used);
	}

	set_hint(TIERFS_XATTR_PREFETCH, "start", 5);

	/* 4. backward pass */
	bool have0 = stats_read(&s0);
	uint64_t t_bwd = now_ns();

	CK(cuMemsetD32Async(rbuf, 0, maxsz / 4, st));
	CK(cuStreamSynchronize(st));
	for (int j = 0; j < k; j++) {
		int i = ord[j];

		if (stats_read(&sn) && sn.distance >= 0) {
			dist_sum += sn.distance;
			dist_n++;
		}
		if (where)
			where[j] = tier_letter(i);
		path_of(path, sizeof(path), i);
		uint64_t rt = tierfs_restore(path, size[i]);

		r->restore_ns += rt;
		if (o.tiers)
			printf("restore %2d: #%-3d %6.1f MiB from %c in %8.3f ms\n", j, i,
			       (double)size[i] / 1048576, where[j], (double)rt / 1e6);

		uint64_t t0 = now_ns();

		verify("tierfs", i);
		compute_until(t0);
	}
	r->bwd_wall = (double)(now_ns() - t_bwd) / 1e9;
	if (where) {
		printf("restored from (restore order): %s\n", where);
		free(where);
	}
	bool have1 = have0 && stats_read(&s1);

	/* 5. clean-up */
	if (!o.keep) {
		removexattr(o.dir, TIERFS_XATTR_RESTORE_ORDER);	/* leftovers */
		for (int i = 0; i < k; i++) {
			path_of(path, sizeof(path), i);
			if (unlink(path))
				warn("warning: unlink %s: %s", path, strerror(errno));
		}
		if (dir_created && rmdir(o.dir))
			warn("warning: rmdir %s: %s", o.dir, strerror(errno));
		dir_created = false;
	}

	char hits[32] = "-", misses[32] = "-", pref[32] = "-", dist[32] = "-", dr[32] = "timeout";

	if (have1 && s0.gpu_hits >= 0 && s1.gpu_hits >= 0)
		snprintf(hits, sizeof(hits), "%lld", s1.gpu_hits - s0.gpu_hits);
	if (have1 && s0.gpu_misses >= 0 && s1.gpu_misses >= 0)
		snprintf(misses, sizeof(misses), "%lld", s1.gpu_misses - s0.gpu_misses);
	if (have1 && s0.prefetched >= 0 && s1.prefetched >= 0)
		snprintf(pref, sizeof(pref), "%lld", s1.prefetched - s0.prefetched);
	if (dist_n)
		snprintf(dist, sizeof(dist), "%.2f", (double)dist_sum / (double)dist_n);
	if (drain_s >= 0)
		snprintf(dr, sizeof(dr), "%.2fs", drain_s);
	snprintf(r->note, sizeof(r->note),
		 "gpu hits %s misses %s, prefetched %s, dist %s, drain %s; slowest "
		 "checkpoint #%d %.1f ms", hits, misses, pref, dist, dr, slow_i,
		 (double)slow_ckpt / 1e6);
}

/* ---- mode um ---------------------------------------------------------- */

static struct {
	CUdeviceptr *m;		/* managed allocation per checkpoint */
	CUevent *ev;		/* backward: its prefetch to the GPU done */
	bool *on_gpu;		/* counted in resident (placed on the GPU) */
	bool *ready;		/* backward: the prefetcher got past it */
	bool *has_ev;		/* backward: ev was recorded for it */
	bool *consumed;		/* backward: restored by the application */
	int *pos;		/* its position in the restore order */
	int *fifo;		/* forward: resident checkpoints, oldest first */
	int fifo_head, fifo_tail;
	uint64_t resident;	/* bytes placed on the GPU */
	CUstream pst;		/* the prefetch thread's stream */
	pthread_mutex_t lock;	/* guards on_gpu, ready, has_ev, consumed, resident */
	pthread_cond_t cond;	/* any of those changed */
	long ev_fwd, ev_bwd;	/* migrations to the host */
	uint64_t ev_fwd_b, ev_bwd_b;
	long pf;		/* prefetches to the GPU (backward) */
	long waits;		/* restores that found the prefetcher behind */
} um;

static CUmemLocation loc_gpu(void)
{
	CUmemLocation l = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = o.device };

	return l;
}

static CUmemLocation loc_host(void)
{
	CUmemLocation l = { .type = CU_MEM_LOCATION_TYPE_HOST, .id = 0 };

	return l;
}

/* Migrate checkpoint i to the host on stream s ("flush + evict"). */
static void um_to_host(int i, CUstream s)
{
	CK(cuMemAdvise(um.m[i], size[i], CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc_host()));
	CK(cuMemPrefetchAsync(um.m[i], size[i], loc_host(), 0, s));
}

/* Migrate (or populate) checkpoint i on the GPU on stream s. */
static void um_to_gpu(int i, CUstream s)
{
	CK(cuMemAdvise(um.m[i], size[i], CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc_gpu()));
	CK(cuMemPrefetchAsync(um.m[i], size[i], loc_gpu(), 0, s));
}

/* um.lock held: a checkpoint to move off the GPU so that position p fits:
 * a consumed one, else the resident one needed last after p; -1: none. */
static int um_victim(int p)
{
	int best = -1;

	for (int x = 0; x < k; x++) {
		if (!um.on_gpu[x])
			continue;
		if (um.consumed[x])
			return x;
		if (um.pos[x] > p && (best < 0 || um.pos[x] > um.pos[best]))
			best = x;
	}
	return best;
}

/* The prefetch thread of the backward pass (see the header). */
static void *um_prefetcher(void *arg)
{
	int *victims = xmalloc(sizeof(int) * (size_t)k);

	(void)arg;
	CK(cuCtxSetCurrent(ctx));
	for (int p = 0; p < k; p++) {
		int c = ord[p], nv = 0;

		pthread_mutex_lock(&um.lock);
		if (um.on_gpu[c]) {		/* still there from the forward pass */
			um.ready[c] = true;
			pthread_cond_broadcast(&um.cond);
			pthread_mutex_unlock(&um.lock);
			continue;
		}
		while (um.resident + size[c] > o.gpu_cache) {
			int v = um_victim(p);

			if (v < 0) {		/* all in the window: wait for a restore */
				pthread_cond_wait(&um.cond, &um.lock);
				continue;
			}
			um.on_gpu[v] = false;
			um.resident -= size[v];
			victims[nv++] = v;
		}
		um.on_gpu[c] = true;
		um.resident += size[c];
		pthread_mutex_unlock(&um.lock);

		for (int v = 0; v < nv; v++) {
			um_to_host(victims[v], um.pst);
			um.ev_bwd++;
			um.ev_bwd_b += size[victims[v]];
		}
		um_to_gpu(c, um.pst);
		CK(cuEventRecord(um.ev[c], um.pst));
		um.pf++;

		pthread_mutex_lock(&um.lock);
		um.has_ev[c] = true;
		um.ready[c] = true;
		pthread_cond_broadcast(&um.cond);
		pthread_mutex_unlock(&um.lock);
	}
	free(victims);
	return NULL;
}

static void run_um(struct result *r)
{
	char b1[32], b2[32];
	pthread_t pt;
	int ret;

	um.m = xcalloc((size_t)k, sizeof(*um.m));
	um.ev = xcalloc((size_t)k, sizeof(*um.ev));
	um.on_gpu = xcalloc((size_t)k, sizeof(bool));
	um.ready = xcalloc((size_t)k, sizeof(bool));
	um.has_ev = xcalloc((size_t)k, sizeof(bool));
	um.consumed = xcalloc((size_t)k, sizeof(bool));
	um.pos = xcalloc((size_t)k, sizeof(int));
	um.fifo = xcalloc((size_t)k, sizeof(int));
	pthread_mutex_init(&um.lock, NULL);
	pthread_cond_init(&um.cond, NULL);
	for (int j = 0; j < k; j++)
		um.pos[ord[j]] = j;

	/* set-up (untimed): the allocations, accessed by the GPU */
	for (int i = 0; i < k; i++) {
		CK(cuMemAllocManaged(&um.m[i], size[i], CU_MEM_ATTACH_GLOBAL));
		CK(cuMemAdvise(um.m[i], size[i], CU_MEM_ADVISE_SET_ACCESSED_BY, loc_gpu()));
		CK(cuEventCreate(&um.ev[i], CU_EVENT_DISABLE_TIMING));
	}
	CK(cuStreamCreate(&um.pst, CU_STREAM_NON_BLOCKING));

	/* forward pass: FIFO eviction under the bound, on the app's stream */
	uint64_t t_fwd = now_ns();

	for (int i = 0; i < k; i++) {
		uint64_t t0 = now_ns();

		fill(i);
		compute_until(t0);
		t0 = now_ns();
		op_begin("um checkpoint");
		while (um.resident + size[i] > o.gpu_cache) {
			int v = um.fifo[um.fifo_head++];

			um_to_host(v, st);
			um.on_gpu[v] = false;
			um.resident -= size[v];
			um.ev_fwd++;
			um.ev_fwd_b += size[v];
		}
		um_to_gpu(i, st);
		CK(cuMemcpyDtoDAsync(um.m[i], wbuf, size[i], st));
		CK(cuStreamSynchronize(st));
		um.on_gpu[i] = true;
		um.resident += size[i];
		um.fifo[um.fifo_tail++] = i;
		op_end();
		r->ckpt_ns += now_ns() - t0;
	}
	r->fwd_wall = (double)(now_ns() - t_fwd) / 1e9;
	printf("# um: after the forward pass %s on the GPU (bound %s)\n",
	       gib(um.resident, b1, sizeof(b1)), gib(o.gpu_cache, b2, sizeof(b2)));

	/* backward pass: the prefetch thread starts ("prefetch start") */
	CK(cuMemsetD32Async(rbuf, 0, maxsz / 4, st));
	CK(cuStreamSynchronize(st));
	ret = pthread_create(&pt, NULL, um_prefetcher, NULL);
	if (ret)
		die("pthread_create: %s", strerror(ret));

	uint64_t t_bwd = now_ns();

	for (int j = 0; j < k; j++) {
		int c = ord[j];
		uint64_t t0 = now_ns();
		bool he;

		op_begin("um restore");
		pthread_mutex_lock(&um.lock);
		if (!um.ready[c])
			um.waits++;
		while (!um.ready[c])
			pthread_cond_wait(&um.cond, &um.lock);
		he = um.has_ev[c];
		pthread_mutex_unlock(&um.lock);
		if (he)
			CK(cuStreamWaitEvent(st, um.ev[c], 0));
		CK(cuMemcpyDtoDAsync(rbuf, um.m[c], size[c], st));
		CK(cuStreamSynchronize(st));
		op_end();
		r->restore_ns += now_ns() - t0;

		pthread_mutex_lock(&um.lock);
		um.consumed[c] = true;
		pthread_cond_broadcast(&um.cond);
		pthread_mutex_unlock(&um.lock);

		t0 = now_ns();
		verify("um", c);
		compute_until(t0);
	}
	r->bwd_wall = (double)(now_ns() - t_bwd) / 1e9;
	ret = pthread_join(pt, NULL);
	if (ret)
		die("pthread_join: %s", strerror(ret));

	/* clean-up */
	CK(cuStreamSynchronize(um.pst));
	CK(cuStreamDestroy(um.pst));
	for (int i = 0; i < k; i++) {
		CK(cuEventDestroy(um.ev[i]));
		CK(cuMemFree(um.m[i]));
	}
	snprintf(r->note, sizeof(r->note),
		 "to host: fwd %ld (%.2f GB), bwd %ld (%.2f GB); prefetched %ld, "
		 "restores waiting for the prefetcher %ld", um.ev_fwd, um.ev_fwd_b / 1e9,
		 um.ev_bwd, um.ev_bwd_b / 1e9, um.pf, um.waits);
	free(um.m);
	free(um.ev);
	free(um.on_gpu);
	free(um.ready);
	free(um.has_ev);
	free(um.consumed);
	free(um.pos);
	free(um.fifo);
	pthread_mutex_destroy(&um.lock);
	pthread_cond_destroy(&um.cond);
}

/* ---- mode raw --------------------------------------------------------- */

static void run_raw(struct result *r)
{
	CUdeviceptr *d = xcalloc((size_t)k, sizeof(*d));

	for (int i = 0; i < k; i++)
		CK(cuMemAlloc(&d[i], size[i]));

	uint64_t t_fwd = now_ns();

	for (int i = 0; i < k; i++) {
		uint64_t t0 = now_ns();

		fill(i);
		compute_until(t0);
		t0 = now_ns();
		op_begin("raw checkpoint");
		CK(cuMemcpyDtoDAsync(d[i], wbuf, size[i], st));
		CK(cuStreamSynchronize(st));
		op_end();
		r->ckpt_ns += now_ns() - t0;
	}
	r->fwd_wall = (double)(now_ns() - t_fwd) / 1e9;

	CK(cuMemsetD32Async(rbuf, 0, maxsz / 4, st));
	CK(cuStreamSynchronize(st));

	uint64_t t_bwd = now_ns();

	for (int j = 0; j < k; j++) {
		int c = ord[j];
		uint64_t t0 = now_ns();

		op_begin("raw restore");
		CK(cuMemcpyDtoDAsync(rbuf, d[c], size[c], st));
		CK(cuStreamSynchronize(st));
		op_end();
		r->restore_ns += now_ns() - t0;
		t0 = now_ns();
		verify("raw", c);
		compute_until(t0);
	}
	r->bwd_wall = (double)(now_ns() - t_bwd) / 1e9;
	for (int i = 0; i < k; i++)
		CK(cuMemFree(d[i]));
	free(d);
	snprintf(r->note, sizeof(r->note), "all checkpoints in cuMemAlloc buffers");
}

/* ---- main ------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
"usage: " PROG " [options]\n"
"\n"
"GPU checkpoints (cuMemAlloc buffers) of an adjoint shot: a forward pass\n"
"writes K checkpoints, a backward pass restores them all in a given order.\n"
"Compares tierfs (all restore hints) with unified memory (hpdc23 §5.2.2).\n"
"\n"
"  -m, --mode LIST        comma-separated tierfs,um,raw (default: all three\n"
"                         with --dir, else um,raw)\n"
"  -d, --dir DIR          a directory on a tierfs mount with a GPU tier\n"
"                         (created if missing; mode tierfs)\n"
"  -k, --count K          checkpoints (default 32)\n"
"  -s, --size S           (mean) checkpoint size, K/M/G suffixes (default 64M)\n"
"      --sizes uniform|var  all S, or bench_hints' spread from S/8 to 2S\n"
"                         with mean S (default uniform)\n"
"  -o, --order seq|rev|irr  restore order (default seq)\n"
"  -c, --interval MS      compute interval, milliseconds (default 10)\n"
"      --busy             busy-wait the compute interval (default: sleep)\n"
"      --seed N           seed of the sizes and the irregular order (default 1)\n"
"  -g, --gpu-cache SIZE   um: bound on the GPU-resident bytes; give the\n"
"                         mount's gpu_cache (default 1G)\n"
"      --device N         CUDA device (default $TIERFS_GPU, else 0)\n"
"      --stats PATH       where to read " TIERFS_XATTR_STATS " (default: the\n"
"                         mount root of DIR)\n"
"      --keep             keep the tierfs checkpoints\n"
"      --tiers            tierfs: print each checkpoint's tier after the\n"
"                         forward pass and where each restore found it\n"
"      --target X         the ratio the target line asks for (default 10)\n"
"      --timeout S        give up if one call blocks this long (default 300)\n"
"      --drain-timeout S  longest wait for the flush backlog (default 600)\n"
"      --gpu-wait S       longest wait for the mount's GPU tier (default 120)\n"
"      --print-sizes      print the checkpoint sizes and exit\n"
"  -h, --help             this text\n"
"\n"
"GB/s = 10^9 bytes / s of time blocked in the checkpoint or restore calls\n"
"(compute intervals, buffer fills and verification excluded).  Exit status\n"
"77: no CUDA driver or device.\n");
}

static void parse_modes(const char *arg)
{
	char *copy = strdup(arg), *tok, *save = NULL;

	if (!copy)
		die("out of memory");
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		o.mode[pick(tok, mode_name, NMODES, "--mode")] = true;
	free(copy);
}

int main(int argc, char **argv)
{
	enum { O_SIZES = 256, O_BUSY, O_SEED, O_DEVICE, O_STATS, O_KEEP, O_TARGET,
	       O_TIMEOUT, O_DRAINTO, O_GPUWAIT, O_PRINT, O_TIERS };
	static const struct option lopts[] = {
		{ "mode", required_argument, NULL, 'm' },
		{ "dir", required_argument, NULL, 'd' },
		{ "count", required_argument, NULL, 'k' },
		{ "size", required_argument, NULL, 's' },
		{ "sizes", required_argument, NULL, O_SIZES },
		{ "order", required_argument, NULL, 'o' },
		{ "interval", required_argument, NULL, 'c' },
		{ "busy", no_argument, NULL, O_BUSY },
		{ "seed", required_argument, NULL, O_SEED },
		{ "gpu-cache", required_argument, NULL, 'g' },
		{ "device", required_argument, NULL, O_DEVICE },
		{ "stats", required_argument, NULL, O_STATS },
		{ "keep", no_argument, NULL, O_KEEP },
		{ "target", required_argument, NULL, O_TARGET },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "drain-timeout", required_argument, NULL, O_DRAINTO },
		{ "gpu-wait", required_argument, NULL, O_GPUWAIT },
		{ "print-sizes", no_argument, NULL, O_PRINT },
		{ "tiers", no_argument, NULL, O_TIERS },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	const char *env = getenv("TIERFS_GPU");
	bool mode_given = false;
	char msg[512], b1[32], b2[32], b3[32], b4[32];
	int c, count = 0, drv_ver = 0;
	char *end;

	o.device = env && *env ? atoi(env) : 0;
	while ((c = getopt_long(argc, argv, "m:d:k:s:o:c:g:h", lopts, NULL)) != -1) {
		switch (c) {
		case 'm': parse_modes(optarg); mode_given = true; break;
		case 'd': o.dir = optarg; break;
		case 'k':
			o.k = (int)strtol(optarg, &end, 10);
			if (*end || o.k < 1 || o.k > 100000)
				die("bad count '%s'", optarg);
			break;
		case 's':
			if (!parse_size(optarg, &o.s) || o.s < 64 * 1024 || o.s % 4096)
				die("bad size '%s' (64K or more, a multiple of 4K)", optarg);
			break;
		case O_SIZES: o.sizes = pick(optarg, sizes_name, 2, "--sizes"); break;
		case 'o': o.order = pick(optarg, order_name, 3, "--order"); break;
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
		case 'g':
			if (!parse_size(optarg, &o.gpu_cache) || o.gpu_cache == 0)
				die("bad GPU cache size '%s'", optarg);
			break;
		case O_DEVICE:
			o.device = (int)strtol(optarg, &end, 10);
			if (*end || o.device < 0)
				die("bad device '%s'", optarg);
			break;
		case O_STATS: o.stats = optarg; break;
		case O_KEEP: o.keep = true; break;
		case O_TARGET:
			o.target = strtod(optarg, &end);
			if (*end || o.target <= 0)
				die("bad target '%s'", optarg);
			break;
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
		case O_GPUWAIT:
			o.gpu_wait_s = strtod(optarg, &end);
			if (*end || o.gpu_wait_s < 0)
				die("bad GPU wait '%s'", optarg);
			break;
		case O_PRINT: o.print_sizes = true; break;
		case O_TIERS: o.tiers = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	if (!mode_given) {
		o.mode[M_TIERFS] = o.dir != NULL;
		o.mode[M_UM] = o.mode[M_RAW] = true;
	}
	if (o.mode[M_TIERFS] && !o.dir)
		die("mode tierfs needs --dir DIR on a tierfs mount");

	k = o.k;
	size = xmalloc(sizeof(*size) * (size_t)k);
	ord = xmalloc(sizeof(*ord) * (size_t)k);
	make_sizes();
	make_order();
	uint64_t minsz = UINT64_MAX;

	for (int i = 0; i < k; i++) {
		total += size[i];
		maxsz = size[i] > maxsz ? size[i] : maxsz;
		minsz = size[i] < minsz ? size[i] : minsz;
	}
	if (o.print_sizes) {
		for (int i = 0; i < k; i++)
			printf("%d %" PRIu64 "\n", i, size[i]);
		printf("# %s sizes, K=%d: min %.2f MiB, mean %.2f MiB, max %.2f MiB, total %.3f GB\n",
		       sizes_name[o.sizes], k, minsz / 1048576.0, total / (double)k / 1048576.0,
		       maxsz / 1048576.0, total / 1e9);
		return 0;
	}
	if (o.mode[M_UM] && maxsz > o.gpu_cache)
		die("the largest checkpoint (%s) is more than --gpu-cache %s",
		    gib(maxsz, b1, sizeof(b1)), gib(o.gpu_cache, b2, sizeof(b2)));
	names = xmalloc(sizeof(*names) * (size_t)k);
	for (int i = 0; i < k; i++) {
		names[i] = xmalloc(32);
		snprintf(names[i], 32, "ckpt.%0*d", k > 10000 ? 6 : 4, i);
	}

	/* the driver and the device: 77 where there is none */
	if (!drv_load(msg, sizeof(msg))) {
		fprintf(stderr, PROG ": %s\n", msg);
		return 77;
	}
	CUresult cr = cuInit(0);

	if (cr != CUDA_SUCCESS) {
		const char *n = "?";

		cuGetErrorName(cr, &n);
		fprintf(stderr, PROG ": no usable CUDA device (cuInit: %s)\n", n);
		return 77;
	}
	if (cuDeviceGetCount(&count) != CUDA_SUCCESS || o.device >= count) {
		fprintf(stderr, PROG ": no CUDA device %d (%d devices)\n", o.device, count);
		return 77;
	}
	CK(cuDriverGetVersion(&drv_ver));
	CK(cuDeviceGet(&dev, o.device));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	{
		char name[128] = "?";
		int managed = 0, concurrent = 0;

		CK(cuDeviceGetName(name, sizeof(name), dev));
		CK(cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, dev));
		CK(cuDeviceGetAttribute(&concurrent,
					CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev));
		if (o.mode[M_UM] && (!managed || !concurrent))
			die("mode um: device %d (%s) has no %s (cuMemPrefetchAsync to the GPU "
			    "needs it); leave um out", o.device, name,
			    managed ? "concurrent managed access" : "managed memory");
		printf("# " PROG ": device %d: %s, CUDA driver %d.%d\n", o.device, name,
		       drv_ver / 1000, drv_ver % 1000 / 10);
	}
	CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	CK(cuMemAlloc(&wbuf, maxsz));
	CK(cuMemAlloc(&rbuf, maxsz));

	/* room for what the modes allocate, each in turn, checked up front */
	{
		size_t fr = 0, tot = 0;
		uint64_t managed = 0;

		CK(cuMemGetInfo(&fr, &tot));
		for (int i = 0; i < k; i++)	/* managed memory comes in 2 MiB pages */
			managed += (size[i] + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);
		if (o.mode[M_UM] && managed + UM_MARGIN > fr)
			die("mode um: %s of managed checkpoints (+ %s margin) do not fit in the "
			    "GPU's free memory (%s of %s): oversubscribed managed memory can "
			    "hang the GPU; lower -k/-s, or leave um out",
			    gib(managed, b1, sizeof(b1)), gib(UM_MARGIN, b2, sizeof(b2)),
			    gib(fr, b3, sizeof(b3)), gib(tot, b4, sizeof(b4)));
		if (o.mode[M_RAW] && total + RAW_MARGIN > fr)
			die("mode raw: %s of checkpoints do not fit in the GPU's free memory "
			    "(%s); lower -k/-s, or leave raw out", gib(total, b1, sizeof(b1)),
			    gib(fr, b2, sizeof(b2)));
	}

	uint64_t seed = now_ns() ^ ((uint64_t)getpid() << 32);

	run_id = rng_next(&seed);

	pthread_t wd;

	if (pthread_create(&wd, NULL, watchdog, NULL) == 0)
		pthread_detach(wd);

	printf("# K=%d S=%s sizes=%s (min %.1f MiB, max %.1f MiB, total %.3f GB) "
	       "order=%s interval=%g ms%s seed=%" PRIu64 " gpu-cache=%s hints=all\n",
	       k, gib(o.s, b2, sizeof(b2)), sizes_name[o.sizes], minsz / 1048576.0,
	       maxsz / 1048576.0, total / 1e9, order_name[o.order], o.interval_ms,
	       o.busy ? " (busy)" : "", o.seed, gib(o.gpu_cache, b1, sizeof(b1)));
	if (o.mode[M_TIERFS])
		tierfs_probe();
	fflush(stdout);

	for (int m = 0; m < NMODES; m++) {
		if (!o.mode[m])
			continue;
		fprintf(stderr, PROG ": running %s ...\n", mode_name[m]);
		res[m].ran = true;
		if (m == M_TIERFS)
			run_tierfs(&res[m]);
		else if (m == M_UM)
			run_um(&res[m]);
		else
			run_raw(&res[m]);
	}

	/* the table */
	double um_rest = res[M_UM].ran && res[M_UM].restore_ns ?
			 total / (res[M_UM].restore_ns / 1e9) / 1e9 : 0;

	printf("\n%-7s %10s %13s %14s %9s %10s  %s\n", "mode", "ckpt GB/s", "restore GB/s",
	       "restore vs um", "ckpt s", "restore s", "notes");
	for (int m = 0; m < NMODES; m++) {
		struct result *r = &res[m];
		double cg, rg;
		char ratio[32] = "-";

		if (!r->ran)
			continue;
		cg = r->ckpt_ns ? total / (r->ckpt_ns / 1e9) / 1e9 : 0;
		rg = r->restore_ns ? total / (r->restore_ns / 1e9) / 1e9 : 0;
		if (um_rest > 0)
			snprintf(ratio, sizeof(ratio), "%.2fx", rg / um_rest);
		printf("%-7s %10.3f %13.3f %14s %9.4f %10.4f  %s\n", mode_name[m], cg, rg, ratio,
		       r->ckpt_ns / 1e9, r->restore_ns / 1e9, r->note);
	}
	/* for scripts, one line per mode: result,MODE,SIZES,ORDER,K,S_BYTES,
	 * CKPT_GBPS,RESTORE_GBPS,RESTORE_VS_UM,FWD_WALL_S,BWD_WALL_S */
	for (int m = 0; m < NMODES; m++) {
		struct result *r = &res[m];

		if (!r->ran)
			continue;
		printf("result,%s,%s,%s,%d,%" PRIu64 ",%.4f,%.4f,%.4f,%.3f,%.3f\n", mode_name[m],
		       sizes_name[o.sizes], order_name[o.order], k, o.s,
		       r->ckpt_ns ? total / (r->ckpt_ns / 1e9) / 1e9 : 0,
		       r->restore_ns ? total / (r->restore_ns / 1e9) / 1e9 : 0,
		       um_rest > 0 && r->restore_ns ? total / (r->restore_ns / 1e9) / 1e9 / um_rest : 0,
		       r->fwd_wall, r->bwd_wall);
	}
	if (res[M_TIERFS].ran && um_rest > 0) {
		double v = total / (res[M_TIERFS].restore_ns / 1e9) / 1e9 / um_rest;

		printf("target (printed, not asserted): tierfs restore >= %gx um "
		       "(all hints, %s, %s): %.2fx  %s\n", o.target, order_name[o.order],
		       sizes_name[o.sizes], v, v >= o.target ? "PASS" : "FAIL");
	}
	fflush(stdout);
	CK(cuMemFree(wbuf));
	CK(cuMemFree(rbuf));
	CK(cuStreamDestroy(st));
	return 0;
}
