/*
 * gpu_selftest.c - checks the CUDA build of tierfs's gpu/ on a real GPU.
 *
 * One program, run by hand or by `make check` on a machine with a GPU:
 * prints PASS/FAIL per check and exits 0 (all passed), 1 (a check failed)
 * or 77 (no GPU: gpu_init() failed; what is left to check then is that
 * every other call fails cleanly, and a failure there exits 1).
 *
 *   VMM cache      a 1 GiB reservation maps progressively (mapped is
 *                  printed as it grows), is usable while it grows, reaches
 *                  its size; destroying it mid-mapping is clean; asking for
 *                  more than the device has stops at -ENOMEM with a usable
 *                  prefix, and all of it comes back on destroy.
 *   copies         H2D then D2H round trips of random data, 1 byte to
 *                  256 MiB, at odd offsets and across mapping chunks, from
 *                  pageable and pinned memory and from another thread;
 *                  D2D inside the cache, overlapping moves included; the
 *                  whole cache then matches a host shadow copy byte for
 *                  byte (no stray writes).
 *   pinning        register/unregister an mmap'ed, touched buffer (timed),
 *                  double register / unregister errors, the pin lock file
 *                  (mode 0666, exclusive, released).
 *   IPC            export a cuMemAlloc'ed buffer from an interior pointer,
 *                  refuse to export what cannot be, open the handle in a
 *                  child process (fork + exec of this program, which calls
 *                  cuInit itself), read, move device to device, write back,
 *                  and see the child's write in the parent.
 *   bandwidth      pinned/pageable H2D and D2H, and D2D, for 256 MiB
 *                  (informational, never a check).
 *
 * Environment: TIERFS_GPU_DEV (device, default 0), TIERFS_SELFTEST_SEED
 * (the seed; default 1, TIERFS_RANDOM_SEED=1: one from the clock; printed
 * either way), TIERFS_SELFTEST_VMM_MIB (cache size,
 * default 1024, at least 512), TIERFS_SELFTEST_OOM=0 (skip the check that
 * fills the whole device).
 *
 * Build (CUDA build of gpu/, not the stub; `make check` does this):
 *   gcc -O2 -Wall -Wextra -std=gnu11 -I/usr/local/cuda/include -Igpu \
 *       tests/gpu/gpu_selftest.c gpu/gpu_{common,vmm,copy,pin,ipc,dl}.c \
 *       -ldl -lpthread
 * No -lcuda: the driver is loaded at run time (gpu/gpu_dl.c), so the
 * program starts without one and skips.  Its own cu*() calls go through
 * the same table (gpu_dl.h), filled by gpu_init() before any of them.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "gpu.h"
#include "gpu_dl.h"
#include "../unit/testutil.h"

#define KiB		((uint64_t)1 << 10)
#define MiB		((uint64_t)1 << 20)
#define GiB		((uint64_t)1 << 30)
#define BIG		(256 * MiB)	/* largest copy, bandwidth size */


/* The daemon's logger, here: to stderr, indented under the checks. */
void tierfs_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void tierfs_log(int level, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "    log<%d> ", level);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *s = getenv(name);

	return s && *s ? strtoull(s, NULL, 0) : dflt;
}

/* Fill with a stream determined by seed alone (both IPC ends agree). */
static void fill_pattern(void *p, size_t len, uint64_t seed)
{
	uint64_t x = seed | 1, w;
	unsigned char *c = p;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		w = x * 0x2545F4914F6CDD1DULL;
		memcpy(c + i, &w, 8);
	}
	for (; i < len; i++)
		c[i] = (unsigned char)(seed >> (i % 8 * 8)) ^ (unsigned char)i;
}

static void fill_random_pattern(void *p, size_t len)
{
	fill_pattern(p, len, rnd());
}

/* First differing offset, or -1. */
static long long first_diff(const void *a, const void *b, size_t len)
{
	const unsigned char *x = a, *y = b;
	size_t i;

	if (!memcmp(a, b, len))
		return -1;
	for (i = 0; i < len && x[i] == y[i]; i++)
		;
	return (long long)i;
}

/* ---- VMM ------------------------------------------------------------ */

struct cache {
	struct gpu_vmm *v;
	uint64_t base, size;
	unsigned char *shadow;	/* what the device range must hold */
};

/*
 * Create the cache and watch it grow; copy into its first 4 MiB as soon as
 * they are mapped, while the rest is still being mapped.
 */
static int test_vmm_create(struct cache *c, uint64_t size)
{
	static const double marks[] = { 0, 1e-4, 1e-3, 2e-3, 5e-3, 1e-2,
					2e-2, 5e-2, 0.1, 0.2, 0.5, 1, 2, 5 };
	const unsigned nmarks = sizeof(marks) / sizeof(marks[0]);
	unsigned char *a = malloc(4 * MiB), *b = malloc(4 * MiB);
	uint64_t m, last = UINT64_MAX;
	double t0, t, t_change = 0;
	unsigned i = 0, steps = 0, lines = 0;
	bool early_done = false, mark;
	int ret;

	fill_random_pattern(a, 4 * MiB);
	t0 = now_s();
	ret = gpu_vmm_create(&c->v, size, false);
	if (!check(ret == 0, "gpu_vmm_create(%" PRIu64 " MiB) = %d in %.2f ms",
		   size / MiB, ret, (now_s() - t0) * 1e3)) {
		free(a);
		free(b);
		return -1;
	}
	c->base = gpu_vmm_base(c->v);
	c->size = gpu_vmm_size(c->v);

	/* Print mapped as it grows (each new value, up to 40 lines) and at
	 * fixed times; poll every 50 us. */
	for (;;) {
		t = now_s() - t0;
		m = gpu_vmm_mapped(c->v);
		mark = i < nmarks && t >= marks[i];
		while (i < nmarks && t >= marks[i])
			i++;
		if (m != last) {
			steps++;
			t_change = t;
		}
		if ((m != last || mark) && lines < 40) {
			printf("INFO: t=%8.3f ms  mapped %6" PRIu64 " / %"
			       PRIu64 " MiB\n", t * 1e3, m / MiB,
			       c->size / MiB);
			lines++;
		}
		last = m;
		if (!early_done && m >= 4 * MiB && m < c->size) {
			early_done = true;
			ret = gpu_copy_htod(c->base, a, 4 * MiB);
			if (!ret)
				ret = gpu_copy_dtoh(b, c->base, 4 * MiB);
			check(!ret && first_diff(a, b, 4 * MiB) < 0,
			      "round trip of the first 4 MiB while mapping "
			      "(mapped %" PRIu64 " MiB) = %d", m / MiB, ret);
		}
		/* Done, or stuck (the mapper failed: gpu_vmm_wait says). */
		if (m >= c->size || t - t_change > 5)
			break;
		usleep(50);
	}
	printf("INFO: t=%8.3f ms  mapped %6" PRIu64 " / %" PRIu64
	       " MiB (%u distinct values seen)\n", (now_s() - t0) * 1e3,
	       gpu_vmm_mapped(c->v) / MiB, c->size / MiB, steps);
	check(c->base != 0 && c->base % (2 * MiB) == 0,
	      "reservation at 0x%" PRIx64 " (2 MiB aligned)", c->base);
	check(c->size >= size && c->size - size < 2 * MiB,
	      "reserved size %" PRIu64 " for %" PRIu64 " asked", c->size, size);
	if (!early_done)
		printf("INFO: mapping finished before 4 MiB could be used "
		       "mid-way\n");
	free(a);
	free(b);

	ret = gpu_vmm_wait(c->v);
	check(ret == 0, "gpu_vmm_wait = %d", ret);
	check(gpu_vmm_mapped(c->v) == c->size,
	      "mapped reached size (%" PRIu64 " of %" PRIu64 ")",
	      gpu_vmm_mapped(c->v), c->size);
	return 0;
}

/* Fill the whole cache from a random host shadow. */
static int cache_fill(struct cache *c)
{
	uint64_t off, n;
	int ret = 0;

	c->shadow = malloc(c->size);
	if (!c->shadow)
		return -ENOMEM;
	fill_random_pattern(c->shadow, c->size);
	for (off = 0; off < c->size && !ret; off += n) {
		n = c->size - off < BIG ? c->size - off : BIG;
		ret = gpu_copy_htod(c->base + off, c->shadow + off, n);
	}
	check(ret == 0, "fill the cache from its shadow = %d", ret);
	return ret;
}

/* Does the whole device range equal the shadow? */
static void cache_compare(struct cache *c, const char *when)
{
	unsigned char *buf = malloc(BIG);
	uint64_t off, n;
	long long d = -1;
	int ret = 0;

	for (off = 0; off < c->size && !ret && d < 0; off += n) {
		n = c->size - off < BIG ? c->size - off : BIG;
		ret = gpu_copy_dtoh(buf, c->base + off, n);
		if (!ret) {
			d = first_diff(buf, c->shadow + off, n);
			if (d >= 0)
				d += off;
		}
	}
	check(!ret && d < 0, "whole cache equals its shadow %s (ret %d, "
	      "first difference at %lld)", when, ret, d);
	free(buf);
}

/* ---- copies --------------------------------------------------------- */

struct rt_case {
	uint64_t off, len;
};

/*
 * H2D from src at a random offset, D2H into dst at a random offset,
 * compare; the dst bytes just outside must be untouched.
 */
static bool round_trip(struct cache *c, uint64_t off, uint64_t len,
		       unsigned char *src, unsigned char *dst, size_t bufsz,
		       const char *kind)
{
	uint64_t soff = rnd_below(bufsz - len + 1);
	uint64_t doff = 1 + rnd_below(bufsz - len - 1);
	long long d;
	int ret;

	fill_random_pattern(src + soff, len);
	dst[doff - 1] = 0xa5;
	dst[doff + len] = 0x5a;
	ret = gpu_copy_htod(c->base + off, src + soff, len);
	if (!ret)
		ret = gpu_copy_dtoh(dst + doff, c->base + off, len);
	d = ret ? -2 : first_diff(dst + doff, src + soff, len);
	if (!ret)
		memcpy(c->shadow + off, src + soff, len);
	return check(!ret && d < 0 && dst[doff - 1] == 0xa5 &&
		     dst[doff + len] == 0x5a,
		     "%s round trip off %" PRIu64 " len %" PRIu64
		     " = %d (first difference %lld)", kind, off, len, ret, d);
}

static void test_round_trips(struct cache *c, unsigned char *src,
			     unsigned char *dst, size_t bufsz,
			     const char *kind)
{
	const uint64_t s = c->size, chunk = 64 * MiB;
	const struct rt_case cases[] = {
		{ 0, 1 },
		{ 1, 1 },
		{ 4095, 3 },
		{ 2 * MiB - 1, 2 },
		{ chunk - 5, 10 },			/* across chunks */
		{ 12345, MiB + 7 },
		{ 3 * chunk - 3 * MiB - 1, 8 * MiB + 3 },
		{ 100 * MiB + 3, 64 * MiB + 1 },
		{ 7, BIG - 8 },
		{ s - BIG, BIG },			/* the tail, 256 MiB */
		{ s - 1, 1 },
		{ rnd_below(s - 4 * MiB), 1 + rnd_below(4 * MiB) },
	};
	unsigned i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		round_trip(c, cases[i].off, cases[i].len, src, dst, bufsz,
			   kind);
}

struct thread_arg {
	struct cache *c;
	int ret;
	long long diff;
};

static void *other_thread(void *p)
{
	struct thread_arg *a = p;
	unsigned char *x = malloc(MiB), *y = malloc(MiB);
	uint64_t off = a->c->size / 2 + 17;

	fill_pattern(x, MiB, 42);
	a->ret = gpu_copy_htod(a->c->base + off, x, MiB);
	if (!a->ret)
		a->ret = gpu_copy_dtoh(y, a->c->base + off, MiB);
	a->diff = a->ret ? -2 : first_diff(x, y, MiB);
	if (!a->ret)
		memcpy(a->c->shadow + off, x, MiB);
	free(x);
	free(y);
	return NULL;
}

static void test_thread(struct cache *c)
{
	struct thread_arg a = { .c = c };
	pthread_t t;

	if (pthread_create(&t, NULL, other_thread, &a)) {
		check(false, "start a thread");
		return;
	}
	pthread_join(t, NULL);
	check(!a.ret && a.diff < 0,
	      "round trip from a thread that never saw gpu_init = %d", a.ret);
}

/* One D2D move inside the cache, checked against the same memmove on the
 * shadow. */
static void dtod_case(struct cache *c, uint64_t dst, uint64_t src,
		      uint64_t len, unsigned char *buf)
{
	long long d;
	int ret;

	ret = gpu_copy_dtod(c->base + dst, c->base + src, len);
	if (!ret)
		memmove(c->shadow + dst, c->shadow + src, len);
	if (!ret)
		ret = gpu_copy_dtoh(buf, c->base + dst, len);
	d = ret ? -2 : first_diff(buf, c->shadow + dst, len);
	check(!ret && d < 0, "D2D %" PRIu64 " -> %" PRIu64 " len %" PRIu64
	      "%s = %d (first difference %lld)", src, dst, len,
	      (dst < src + len && src < dst + len) ? " (overlapping)" : "",
	      ret, d);
}

static void test_dtod(struct cache *c, unsigned char *buf)
{
	const uint64_t s = c->size;

	dtod_case(c, 3, s / 2 + 1, 1, buf);
	dtod_case(c, 64 * MiB - 7, 300 * MiB + 11, 9 * MiB + 5, buf);
	dtod_case(c, s - BIG, 1, BIG, buf);
	dtod_case(c, 5 * MiB, 3 * MiB, 64 * MiB, buf);	/* up by 2 MiB */
	dtod_case(c, 200 * MiB, 201 * MiB + 3, 32 * MiB, buf); /* down */
	dtod_case(c, 400 * MiB + 3, 400 * MiB, 64 * KiB, buf); /* up by 3 */
}

/* ---- pinning -------------------------------------------------------- */

static unsigned char *pinned_buf;	/* BIG bytes, registered */

/* Registered host memory has a CUDA memory type; other memory has none. */
static bool host_is_registered(void *p)
{
	unsigned int type = 0;

	return cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
				     (CUdeviceptr)(uintptr_t)p) ==
	       CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST;
}

static void test_register(void)
{
	unsigned int flags = 0;
	double t0, dt;
	size_t i;
	int ret;

	pinned_buf = mmap(NULL, BIG, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!check(pinned_buf != MAP_FAILED, "mmap %" PRIu64 " MiB",
		   BIG / MiB)) {
		pinned_buf = NULL;
		return;
	}
	madvise(pinned_buf, BIG, MADV_HUGEPAGE);
	t0 = now_s();
	for (i = 0; i < BIG; i += 4096)
		pinned_buf[i] = 1;
	printf("INFO: touched %" PRIu64 " MiB in %.1f ms\n", BIG / MiB,
	       (now_s() - t0) * 1e3);

	t0 = now_s();
	ret = gpu_host_register(pinned_buf, BIG);
	dt = now_s() - t0;
	check(ret == 0, "gpu_host_register(%" PRIu64 " MiB, touched) = %d "
	      "in %.1f ms", BIG / MiB, ret, dt * 1e3);
	if (ret) {
		munmap(pinned_buf, BIG);
		pinned_buf = NULL;
		return;
	}
	check(host_is_registered(pinned_buf + BIG / 2),
	      "the driver knows the range as host memory");
	if (cuMemHostGetFlags(&flags, pinned_buf) == CUDA_SUCCESS)
		printf("INFO: cuMemHostGetFlags = 0x%x\n", flags);
	ret = gpu_host_register(pinned_buf, BIG);
	check(ret == -EEXIST, "registering it again = %d (want -EEXIST)", ret);
}

/* Round trips through the registered buffer: src in front, dst behind. */
static void test_pinned_round_trips(struct cache *c)
{
	const size_t half = BIG / 2;
	const uint64_t offs[] = { 0, 1, 64 * MiB - 3, c->size - half };
	const uint64_t lens[] = { 1, 4 * MiB + 1, 7, half - 2 };
	unsigned i;

	if (!pinned_buf)
		return;
	for (i = 0; i < 4; i++)
		round_trip(c, offs[i], lens[i], pinned_buf, pinned_buf + half,
			   half, "pinned");
}

static void test_unregister(void)
{
	double t0;
	int ret;

	if (!pinned_buf)
		return;
	t0 = now_s();
	ret = gpu_host_unregister(pinned_buf);
	check(ret == 0, "gpu_host_unregister = %d in %.1f ms", ret,
	      (now_s() - t0) * 1e3);
	check(!host_is_registered(pinned_buf + BIG / 2),
	      "the driver forgot the range");
	ret = gpu_host_unregister(pinned_buf);
	check(ret == -EINVAL, "unregistering it again = %d (want -EINVAL)",
	      ret);
	munmap(pinned_buf, BIG);
	pinned_buf = NULL;
}

static void test_pin_lock(void)
{
	char dir[] = "/tmp/tierfs-gpu-selftest-XXXXXX", path[128];
	struct stat st;
	int fd, fd2, r;
	mode_t old;

	if (!check(mkdtemp(dir) != NULL, "mkdtemp"))
		return;
	snprintf(path, sizeof(path), "%s/pin.lock", dir);
	old = umask(022);
	fd = gpu_pin_lock(path);
	umask(old);
	check(fd >= 0, "gpu_pin_lock(new file) = %d", fd);
	if (fd < 0)
		goto out_rmdir;
	if (stat(path, &st))
		st.st_mode = 0;
	check((st.st_mode & 0777) == 0666,
	      "lock file created mode 0666 despite umask 022 (0%o)",
	      (unsigned)(st.st_mode & 0777));
	fd2 = open(path, O_RDONLY | O_CLOEXEC);
	r = flock(fd2, LOCK_EX | LOCK_NB);
	check(r < 0 && errno == EWOULDBLOCK,
	      "lock is exclusive while held (flock = %d)", r);
	gpu_pin_unlock(fd);
	r = flock(fd2, LOCK_EX | LOCK_NB);
	check(r == 0, "lock free after gpu_pin_unlock (flock = %d)", r);
	close(fd2);
	fd = gpu_pin_lock(path);
	check(fd >= 0, "gpu_pin_lock(existing file) = %d", fd);
	gpu_pin_unlock(fd);
	unlink(path);
out_rmdir:
	rmdir(dir);
}

/* ---- IPC ------------------------------------------------------------ */

struct ipc_msg {
	unsigned char handle[GPU_IPC_HANDLE_SIZE];
	uint64_t len;		/* bytes the child reads and rewrites */
	uint64_t seed;		/* pattern A = seed, pattern B = ~seed */
	int dev;
};

/* The importing side, in a fresh process (exec'd with --ipc-child fd). */
static int ipc_child(int fd)
{
	struct ipc_msg m;
	char msg[256];
	unsigned char *want, *got, junk[GPU_IPC_HANDLE_SIZE];
	uint64_t d = 0, size = 0, d2 = 0, s2 = 0;
	CUdeviceptr scratch = 0;
	int ret, rc = 0;
	size_t i;

	if (read(fd, &m, sizeof(m)) != (ssize_t)sizeof(m))
		return 10;
	close(fd);
	ret = gpu_init(m.dev, msg, sizeof(msg));
	if (ret) {
		fprintf(stderr, "  child: gpu_init: %s\n", msg);
		return 11;
	}
	ret = gpu_ipc_open(m.handle, &d, &size);
	if (ret || !d || size < m.len) {
		fprintf(stderr, "  child: gpu_ipc_open = %d, size %" PRIu64
			"\n", ret, size);
		return 12;
	}
	want = malloc(m.len);
	got = malloc(m.len);
	fill_pattern(want, m.len, m.seed);
	ret = gpu_copy_dtoh(got, d, m.len);
	if (ret || first_diff(want, got, m.len) >= 0) {
		fprintf(stderr, "  child: read of the IPC buffer = %d or wrong"
			" data\n", ret);
		rc = 13;
		goto out;
	}
	/* The daemon's path: device to device between mapping and cache. */
	if (cuMemAlloc(&scratch, m.len) != CUDA_SUCCESS) {
		rc = 14;
		goto out;
	}
	memset(got, 0, m.len);
	ret = gpu_copy_dtod(scratch, d, m.len);
	if (!ret)
		ret = gpu_copy_dtoh(got, scratch, m.len);
	if (ret || first_diff(want, got, m.len) >= 0) {
		fprintf(stderr, "  child: D2D from the IPC buffer = %d or "
			"wrong data\n", ret);
		rc = 15;
		goto out;
	}
	fill_pattern(want, m.len, ~m.seed);
	ret = gpu_copy_htod(scratch, want, m.len);
	if (!ret)
		ret = gpu_copy_dtod(d, scratch, m.len);
	if (ret) {
		rc = 16;
		goto out;
	}
	/* Opening it twice gives the same mapping, closed twice. */
	ret = gpu_ipc_open(m.handle, &d2, &s2);
	if (ret || d2 != d || s2 != size) {
		fprintf(stderr, "  child: second open = %d at 0x%" PRIx64
			"\n", ret, d2);
		rc = 17;
		goto out;
	}
	gpu_ipc_close(d2);
out:
	if (scratch)
		cuMemFree(scratch);
	ret = gpu_ipc_close(d);
	if (ret && !rc)
		rc = 19;
	free(want);
	free(got);
	if (rc)
		return rc;

	/* Garbage must be refused, not crash (last: it may upset the
	 * driver's bookkeeping for this process). */
	for (i = 0; i < sizeof(junk); i++)
		junk[i] = (unsigned char)(m.seed >> (i % 8 * 8)) ^ 0x3c;
	ret = gpu_ipc_open(junk, &d2, &s2);
	if (ret >= 0) {
		fprintf(stderr, "  child: a garbage handle opened (%d)\n",
			ret);
		gpu_ipc_close(d2);
		return 18;
	}
	fprintf(stderr, "  child: garbage handle refused with %d\n", ret);
	return rc;
}

static void test_ipc(int dev, struct cache *c)
{
	const uint64_t len = 64 * MiB + 12345;
	struct ipc_msg m = { .len = len, .seed = rnd() | 1, .dev = dev };
	unsigned char *host = malloc(len), *back = malloc(len);
	unsigned char handle[GPU_IPC_HANDLE_SIZE];
	uint64_t base = 0, size = 0, d = 0, s = 0;
	CUdeviceptr buf = 0;
	int ret, device = -1, p[2], status = 0;
	char fdstr[16];
	pid_t pid;

	if (!check(cuMemAlloc(&buf, len) == CUDA_SUCCESS,
		   "cuMemAlloc %" PRIu64 " bytes for IPC", len))
		goto out;
	fill_pattern(host, len, m.seed);
	ret = gpu_copy_htod(buf, host, len);
	check(ret == 0, "fill the IPC buffer = %d", ret);

	ret = gpu_ipc_export(buf + 4096 + 5, m.handle, &base, &size, &device);
	check(ret == 0 && base == buf && size >= len && device == dev,
	      "gpu_ipc_export(interior pointer) = %d: base %s, size %"
	      PRIu64 ", device %d", ret, base == buf ? "ok" : "WRONG",
	      size, device);

	ret = gpu_ipc_export((uint64_t)(uintptr_t)host, handle, NULL, NULL,
			     NULL);
	check(ret == -EINVAL, "export of host memory = %d (want -EINVAL)",
	      ret);
	ret = gpu_ipc_export(c->base + MiB, handle, NULL, NULL, NULL);
	check(ret == -EINVAL, "export of VMM cache memory = %d (want -EINVAL)",
	      ret);
	/* The driver refuses this; tierfs never does it (the daemon and
	 * its clients are distinct processes), so it is not a check. */
	ret = gpu_ipc_open(m.handle, &d, &s);
	printf("INFO: opening our own handle in the exporting process = %d\n",
	       ret);
	if (!ret)
		gpu_ipc_close(d);

	if (pipe(p)) {
		check(false, "pipe");
		goto out_free;
	}
	snprintf(fdstr, sizeof(fdstr), "%d", p[0]);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		close(p[1]);
		execl("/proc/self/exe", "gpu_selftest", "--ipc-child", fdstr,
		      (char *)NULL);
		_exit(127);
	}
	close(p[0]);
	if (pid < 0 || write(p[1], &m, sizeof(m)) != (ssize_t)sizeof(m)) {
		check(false, "start the IPC child");
		close(p[1]);
		goto out_free;
	}
	close(p[1]);
	waitpid(pid, &status, 0);
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "child process opened the handle, read, copied D2D, wrote "
	      "(exit %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);

	fill_pattern(host, len, ~m.seed);
	ret = gpu_copy_dtoh(back, buf, len);
	check(!ret && first_diff(host, back, len) < 0,
	      "parent sees the child's write = %d", ret);
out_free:
	cuMemFree(buf);
out:
	free(host);
	free(back);
}

/* ---- start-up and failure paths of the VMM --------------------------- */

static void test_vmm_destroy_early(void)
{
	struct gpu_vmm *v;
	uint64_t before = 0, after = 0;
	int ret;

	gpu_mem_info(&before, NULL, NULL, 0);
	ret = gpu_vmm_create(&v, 8 * GiB, false);
	if (!check(ret == 0, "gpu_vmm_create(8 GiB) = %d", ret))
		return;
	gpu_vmm_destroy(v);
	gpu_mem_info(&after, NULL, NULL, 0);
	check(after + 64 * MiB >= before,
	      "destroy while mapping returns the memory (free %" PRIu64
	      " -> %" PRIu64 " MiB)", before / MiB, after / MiB);
}

static void test_vmm_oom(void)
{
	struct gpu_vmm *v;
	uint64_t before = 0, after = 0, want;
	double t0;
	int ret;

	if (gpu_mem_info(&before, NULL, NULL, 0))
		return;
	want = before + 4 * GiB;
	t0 = now_s();
	ret = gpu_vmm_create(&v, want, false);
	if (!check(ret == 0, "gpu_vmm_create(free + 4 GiB = %" PRIu64
		   " MiB) = %d", want / MiB, ret))
		return;
	ret = gpu_vmm_wait(v);
	check(ret == -ENOMEM && gpu_vmm_mapped(v) < gpu_vmm_size(v),
	      "mapping more than the device has stops with -ENOMEM (%d) "
	      "after %" PRIu64 " of %" PRIu64 " MiB, %.0f ms", ret,
	      gpu_vmm_mapped(v) / MiB, gpu_vmm_size(v) / MiB,
	      (now_s() - t0) * 1e3);
	if (gpu_vmm_mapped(v) >= MiB) {
		unsigned char x[64] = { 1, 2, 3 }, y[64];

		ret = gpu_copy_htod(gpu_vmm_base(v) + gpu_vmm_mapped(v) - 64,
				    x, 64);
		if (!ret)
			ret = gpu_copy_dtoh(y, gpu_vmm_base(v) +
					    gpu_vmm_mapped(v) - 64, 64);
		check(!ret && !memcmp(x, y, 64),
		      "the mapped prefix stays usable = %d", ret);
	}
	gpu_vmm_destroy(v);
	gpu_mem_info(&after, NULL, NULL, 0);
	check(after + 64 * MiB >= before,
	      "all of it comes back on destroy (free %" PRIu64 " -> %" PRIu64
	      " MiB)", before / MiB, after / MiB);
}

/* ---- bandwidth (informational) -------------------------------------- */

enum bw_kind { BW_H2D, BW_D2H, BW_D2D };

static void bandwidth(const char *name, enum bw_kind k, uint64_t dev,
		      uint64_t dev2, void *host)
{
	double best = 1e9, sum = 0, t;
	int i, ret = 0, reps = 5;

	for (i = -1; i < reps && !ret; i++) {
		t = now_s();
		if (k == BW_H2D)
			ret = gpu_copy_htod(dev, host, BIG);
		else if (k == BW_D2H)
			ret = gpu_copy_dtoh(host, dev, BIG);
		else
			ret = gpu_copy_dtod(dev2, dev, BIG);
		t = now_s() - t;
		if (i < 0)
			continue;	/* warm-up */
		sum += t;
		if (t < best)
			best = t;
	}
	if (ret)
		printf("INFO: %-14s failed: %d\n", name, ret);
	else
		printf("INFO: %-14s 256 MiB: best %6.1f GB/s, mean %6.1f GB/s\n",
		       name, BIG / best / 1e9, BIG * reps / sum / 1e9);
}

/* ---- no GPU ---------------------------------------------------------- */

/*
 * gpu_init() failed: every other call must fail cleanly, without touching
 * the (unloaded) driver table.  Without a driver at all, gpu_init() says
 * so and gpu_ipc_export() (which loads the driver itself) is -ENODEV too.
 */
static void test_no_gpu(int dev, const char *msg)
{
	static char not_null;
	unsigned char h[GPU_IPC_HANDLE_SIZE], buf[16] = { 0 };
	struct gpu_vmm *v = (struct gpu_vmm *)&not_null;
	char again[256];
	uint64_t d = 0, s = 0;
	bool no_driver = !strncmp(msg, "no CUDA driver (", 16);
	int ret;

	check(!gpu_available(), "gpu_available is false");
	ret = gpu_mem_info(&d, &s, NULL, 0);
	check(ret == -ENODEV, "gpu_mem_info = %d (want -ENODEV)", ret);
	ret = gpu_vmm_create(&v, 64 * MiB, false);
	check(ret == -ENODEV && !v, "gpu_vmm_create = %d, out %s", ret,
	      v ? "set" : "NULL");
	ret = gpu_copy_htod(0x1000, buf, sizeof(buf));
	check(ret == -ENODEV, "gpu_copy_htod = %d", ret);
	ret = gpu_copy_dtoh(buf, 0x1000, sizeof(buf));
	check(ret == -ENODEV, "gpu_copy_dtoh = %d", ret);
	ret = gpu_copy_dtod(0x1000, 0x2000, sizeof(buf));
	check(ret == -ENODEV, "gpu_copy_dtod = %d", ret);
	ret = gpu_host_register(buf, sizeof(buf));
	check(ret == -ENODEV, "gpu_host_register = %d", ret);
	ret = gpu_host_unregister(buf);
	check(ret == -ENODEV, "gpu_host_unregister = %d", ret);
	memset(h, 0, sizeof(h));
	ret = gpu_ipc_open(h, &d, &s);
	check(ret == -ENODEV, "gpu_ipc_open = %d", ret);
	ret = gpu_ipc_close(0x1000);
	check(ret == -ENODEV, "gpu_ipc_close = %d", ret);
	if (no_driver) {
		ret = gpu_ipc_export(0x1000, h, &d, &s, NULL);
		check(ret == -ENODEV, "gpu_ipc_export without a driver = %d",
		      ret);
		ret = gpu_init(dev, again, sizeof(again));
		check(ret == -ENODEV && !strcmp(again, msg),
		      "gpu_init again = %d, same reason", ret);
	}
}

/* ---- main ------------------------------------------------------------ */

int main(int argc, char **argv)
{
	struct cache c = { 0 };
	unsigned char *src = NULL, *dst = NULL;
	uint64_t seed, vmm_size, free_b = 0, total_b = 0;
	char msg[256], name[128] = "";
	size_t bufsz = BIG + 2 * MiB;
	int dev, ret;

	if (argc == 3 && !strcmp(argv[1], "--ipc-child"))
		return ipc_child(atoi(argv[2]));

	setvbuf(stdout, NULL, _IOLBF, 0);
	dev = (int)env_u64("TIERFS_GPU_DEV", 0);
	seed = tu_seed("INFO:", NULL, "TIERFS_SELFTEST_SEED", 1, NULL);
	rng_state = seed | 1;
	vmm_size = env_u64("TIERFS_SELFTEST_VMM_MIB", 1024) * MiB;
	if (vmm_size < 512 * MiB)
		vmm_size = 512 * MiB;

	if (!gpu_built()) {
		printf("SKIP: gpu/ built without CUDA\n");
		return 77;
	}
	ret = gpu_init(dev, msg, sizeof(msg));
	if (ret) {
		check(ret == -ENODEV && msg[0], "gpu_init(%d) = %d: %s", dev,
		      ret, msg);
		test_no_gpu(dev, msg);
		if (n_failed) {
			printf("FAIL: %d of %d checks without a GPU\n",
			       n_failed, n_checks);
			return 1;
		}
		printf("SKIP: no GPU: gpu_init(%d) = %d: %s\n", dev, ret, msg);
		return 77;
	}
	printf("INFO: %s\n", msg);
	check(gpu_available(), "gpu_available after gpu_init");
	ret = gpu_init(dev, msg, sizeof(msg));
	check(ret == 0, "gpu_init again is idempotent = %d", ret);
	ret = gpu_init(dev + 1, msg, sizeof(msg));
	check(ret == -EINVAL, "gpu_init of another device = %d (%s)", ret,
	      msg);
	ret = gpu_mem_info(&free_b, &total_b, name, sizeof(name));
	check(ret == 0 && total_b > 0 && free_b <= total_b && name[0],
	      "gpu_mem_info = %d: %s, %" PRIu64 " of %" PRIu64 " MiB free",
	      ret, name, free_b / MiB, total_b / MiB);

	/* VMM cache */
	if (test_vmm_create(&c, vmm_size) || cache_fill(&c))
		goto out;

	/* copies */
	src = malloc(bufsz);
	dst = malloc(bufsz);
	if (!src || !dst)
		goto out;
	memset(dst, 0, bufsz);
	test_round_trips(&c, src, dst, bufsz, "pageable");
	test_thread(&c);
	test_dtod(&c, dst);
	cache_compare(&c, "after pageable copies and D2D");

	/* pinning */
	test_register();
	test_pinned_round_trips(&c);
	test_pin_lock();

	/* bandwidth */
	if (pinned_buf) {
		bandwidth("H2D pinned", BW_H2D, c.base, 0, pinned_buf);
		bandwidth("D2H pinned", BW_D2H, c.base, 0, pinned_buf);
	}
	memset(src, 1, BIG);
	bandwidth("H2D pageable", BW_H2D, c.base, 0, src);
	bandwidth("D2H pageable", BW_D2H, c.base, 0, dst);
	bandwidth("D2D in cache", BW_D2D, c.base, c.base + BIG, NULL);
	/* The bandwidth copies changed the cache: resync the shadow. */
	memcpy(c.shadow, src, BIG);
	memcpy(c.shadow + BIG, c.shadow, BIG);
	test_unregister();

	/* IPC */
	test_ipc(dev, &c);
	cache_compare(&c, "at the end");

	gpu_vmm_destroy(c.v);
	c.v = NULL;

	/* failure paths */
	test_vmm_destroy_early();
	if (env_u64("TIERFS_SELFTEST_OOM", 1))
		test_vmm_oom();
	else
		printf("INFO: out-of-memory mapping check skipped\n");
out:
	gpu_vmm_destroy(c.v);
	free(c.shadow);
	free(src);
	free(dst);
	printf("%s: %d checks, %d failed\n", n_failed ? "FAIL" : "PASS",
	       n_checks, n_failed);
	return n_failed ? 1 : 0;
}
