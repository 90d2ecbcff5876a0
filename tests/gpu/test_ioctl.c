/*
 * test_ioctl.c - the GPU zero-copy ioctl and libtierfs against a live
 * tierfs mount with a GPU tier (tierfs-gpu(7)).
 *
 * usage: test_ioctl MOUNT [good|bad|verify|all]    (default: all)
 *        test_ioctl MOUNT child N                  (used by `good` itself)
 *
 *   good    data paths, each compared byte for byte with what was sent:
 *           sizes 1 B .. 256 MiB (1 GiB + 4097 B too, crossing the 1 GiB
 *           per-ioctl limit, with TIERFS_TEST_1G=1 and the memory for it)
 *           written with tierfs_pwrite_gpu and read back with read(2) and
 *           with tierfs_pread_gpu; unaligned buffer and file offsets and
 *           partial ranges against a host shadow of the file, with guard
 *           bytes around every GPU destination; write(2) then
 *           tierfs_pread_gpu and the other way round; a hole; reads at and
 *           past end of file; an allocation freed and replaced at the same
 *           address (the export cache must not send the old handle); 4
 *           threads sharing one allocation; 4 processes (fork + exec of
 *           this program) each writing its own file.  Leaves sizes/ in the
 *           mount for `verify`.
 *   verify  after a remount: sizes/ read back (from the SSD now) with
 *           tierfs_pread_gpu and read(2).
 *   bad     errors, none of which may crash or wedge the daemon: a garbage
 *           and an all-zero IPC handle (EINVAL), the handle of freed
 *           memory (EINVAL, or accepted: the driver may keep it), ranges
 *           that wrap or leave the allocation, offsets past INT64_MAX,
 *           flags != 0, wrong-size and unknown commands (ENOTTY), a
 *           directory (EINVAL), pwrite on O_RDONLY / pread on O_WRONLY
 *           (EBADF), a host pointer and a freed pointer (EINVAL), an fd not
 *           on tierfs (ENOTTY), and the mount still working afterwards.
 *
 * Exit 0: all passed; 1: a check failed; 77: skipped (no mount given, no
 * CUDA driver or device here).  A mount without a GPU tier fails (ENODEV).
 * Environment: TIERFS_GPU (device, default 0; the daemon's -o gpu=N),
 * TIERFS_TEST_SEED, TIERFS_TEST_1G=1.
 *
 * Built by `make check TESTS=` (HAVE_CUDA) against libtierfs.a; its own
 * cu*() calls go through gpu_dl.h (nothing links libcuda).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "gpu.h"
#include "gpu_dl.h"
#include "tierfs.h"

#define KiB	((uint64_t)1 << 10)
#define MiB	((uint64_t)1 << 20)
#define GiB	((uint64_t)1 << 30)
#define NCHILD	4
#define NTHREAD	4

static const char *mnt;
static int n_checks, n_failed;
static uint64_t seed0;
static CUcontext ctx;

/* ---- reporting ---------------------------------------------------------- */

static void fail(int line, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void fail(int line, const char *fmt, ...)
{
	va_list ap;

	n_failed++;
	fprintf(stdout, "FAIL (line %d): ", line);
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
}

#define CHECK(cond, ...) do {						\
	n_checks++;							\
	if (!(cond))							\
		fail(__LINE__, __VA_ARGS__);				\
} while (0)

/* r must be -1 with errno want. */
#define EXPECT_ERR(r, want, what) do {					\
	ssize_t r_ = (r);						\
	int e_ = errno;							\
	n_checks++;							\
	if (r_ >= 0)							\
		fail(__LINE__, "%s: returned %zd, expected %s", (what),	\
		     r_, strerror(want));				\
	else if (e_ != (want))						\
		fail(__LINE__, "%s: %s, expected %s", (what),		\
		     strerror(e_), strerror(want));			\
} while (0)

/* r must be exactly n. */
#define EXPECT_N(r, n, what) do {					\
	ssize_t r_ = (r);						\
	int e_ = errno;							\
	n_checks++;							\
	if (r_ != (ssize_t)(n))						\
		fail(__LINE__, "%s: returned %zd (%s), expected %zu",	\
		     (what), r_, r_ < 0 ? strerror(e_) : "short",	\
		     (size_t)(n));					\
} while (0)

static void section(const char *name)
{
	printf("== %s\n", name);
	fflush(stdout);
}

/* ---- data --------------------------------------------------------------- */

static void fill(void *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
	uint8_t *b = p;
	size_t i = 0;

	if (!x)
		x = 1;
	while (i < n) {
		uint64_t v;

		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		v = x * 0x2545F4914F6CDD1Dull;
		for (int k = 0; k < 8 && i < n; k++, v >>= 8)
			b[i++] = (uint8_t)v;
	}
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p) {
		fprintf(stderr, "test_ioctl: out of host memory (%zu)\n", n);
		exit(1);
	}
	return p;
}

/* First differing offset of two buffers, or n. */
static size_t first_diff(const void *a, const void *b, size_t n)
{
	const uint8_t *x = a, *y = b;
	size_t i;

	if (!memcmp(a, b, n))
		return n;
	for (i = 0; i < n && x[i] == y[i]; i++)
		;
	return i;
}

/* First offset of p[0..n) that is not v, or n. */
static size_t not_byte(const uint8_t *p, size_t n, uint8_t v)
{
	size_t i;

	for (i = 0; i < n && p[i] == v; i++)
		;
	return i;
}

#define EXPECT_SAME(got, want, n, what) do {				\
	size_t d_ = first_diff((got), (want), (n));			\
	n_checks++;							\
	if (d_ != (size_t)(n))						\
		fail(__LINE__, "%s: differs at byte %zu of %zu", (what),	\
		     d_, (size_t)(n));					\
} while (0)

/* ---- CUDA --------------------------------------------------------------- */

static bool cu_ok(CUresult r, const char *what)
{
	const char *name = NULL;

	if (r == CUDA_SUCCESS)
		return true;
	cuGetErrorName(r, &name);
	fprintf(stdout, "FAIL: %s: %s\n", what, name ? name : "?");
	n_failed++;
	return false;
}

static CUdeviceptr dalloc(size_t n)
{
	CUdeviceptr d = 0;

	if (!cu_ok(cuMemAlloc(&d, n), "cuMemAlloc")) {
		printf("test_ioctl: cannot allocate %zu bytes of GPU memory\n", n);
		exit(1);
	}
	return d;
}

static void h2d(CUdeviceptr d, const void *h, size_t n)
{
	if (n && (!cu_ok(cuMemcpyHtoDAsync(d, h, n, NULL), "cuMemcpyHtoD") ||
		  !cu_ok(cuStreamSynchronize(NULL), "cuStreamSynchronize")))
		exit(1);
}

static void d2h(void *h, CUdeviceptr d, size_t n)
{
	if (n && (!cu_ok(cuMemcpyDtoHAsync(h, d, n, NULL), "cuMemcpyDtoH") ||
		  !cu_ok(cuStreamSynchronize(NULL), "cuStreamSynchronize")))
		exit(1);
}

/* Fill device memory with byte v. */
static void dset(CUdeviceptr d, int v, size_t n)
{
	void *h = xmalloc(n);

	memset(h, v, n);
	h2d(d, h, n);
	free(h);
}

static void *dptr(CUdeviceptr d)
{
	return (void *)(uintptr_t)d;
}

/* Skip (77) unless the driver and device `dev` are usable. */
static void gpu_setup(void)
{
	const char *s = getenv("TIERFS_GPU");
	char msg[256];
	int dev = s && *s ? atoi(s) : 0;

	if (gpu_init(dev, msg, sizeof(msg)) < 0) {
		printf("SKIP: no usable GPU here: %s\n", msg);
		exit(77);
	}
	if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) {
		printf("SKIP: no current context after gpu_init\n");
		exit(77);
	}
	printf("GPU: %s\n", msg);
}

/* ---- files -------------------------------------------------------------- */

static char *path_of(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));
static char *path_of(const char *fmt, ...)
{
	static __thread char buf[4096];
	char rel[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	snprintf(buf, sizeof(buf), "%s/%s", mnt, rel);
	return buf;
}

static int xopen(const char *path, int flags)
{
	int fd = open(path, flags | O_CLOEXEC, 0644);

	if (fd < 0) {
		printf("FAIL: open %s: %s\n", path, strerror(errno));
		exit(1);
	}
	return fd;
}

static void xmkdir(const char *path)
{
	if (mkdir(path, 0755) < 0 && errno != EEXIST) {
		printf("FAIL: mkdir %s: %s\n", path, strerror(errno));
		exit(1);
	}
}

/* read(2) n bytes at off into buf (short reads repeated); bytes read. */
static size_t read_at(int fd, void *buf, size_t n, off_t off)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = pread(fd, (char *)buf + done, n - done,
				  off + (off_t)done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		done += (size_t)r;
	}
	return done;
}

static bool write_at(int fd, const void *buf, size_t n, off_t off)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = pwrite(fd, (const char *)buf + done, n - done,
				   off + (off_t)done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		done += (size_t)r;
	}
	return true;
}

static off_t fsize(int fd)
{
	struct stat st;

	return fstat(fd, &st) < 0 ? -1 : st.st_size;
}

/* A raw ioctl; returns its result, errno on -1. */
static int raw_io(int fd, unsigned long cmd, const void *handle,
		  uint64_t hoff, uint64_t len, uint64_t foff, uint32_t flags)
{
	struct tierfs_gpu_io io;

	memset(&io, 0, sizeof(io));
	memcpy(io.handle, handle, sizeof(io.handle));
	io.handle_off = hoff;
	io.len = len;
	io.file_off = foff;
	io.flags = flags;
	return ioctl(fd, cmd, &io);
}

/* The mount must have a GPU tier: a first ioctl says ENODEV if not. */
static void require_gpu_tier(void)
{
	CUdeviceptr d = dalloc(4096);
	int fd = xopen(path_of("probe"), O_RDWR | O_CREAT | O_TRUNC);
	ssize_t r = tierfs_pwrite_gpu(fd, dptr(d), 16, 0);

	if (r < 0 && errno == ENODEV) {
		printf("FAIL: %s has no GPU tier (ENODEV): mount it with "
		       "-o gpu=N\n", mnt);
		exit(1);
	}
	EXPECT_N(r, 16, "first tierfs_pwrite_gpu");
	close(fd);
	unlink(path_of("probe"));
	cuMemFree(d);
}

/* ---- good: sizes -------------------------------------------------------- */

static const size_t sizes[] = {
	1, 2, 7, 4095, 4096, 4097, 65539, MiB, MiB + 1, 16 * MiB + 13,
	64 * MiB + 5, 256 * MiB,
};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

/* Write size n from the GPU, read it back both ways. */
static void one_size(size_t n, const char *path, bool keep)
{
	uint8_t *want = xmalloc(n), *got = xmalloc(n);
	CUdeviceptr src = dalloc(n), dst = dalloc(n);
	char what[128];
	int fd;

	snprintf(what, sizeof(what), "size %zu", n);
	fill(want, n, seed0 ^ n);
	h2d(src, want, n);
	fd = xopen(path, O_RDWR | O_CREAT | O_TRUNC);
	EXPECT_N(tierfs_pwrite_gpu(fd, dptr(src), n, 0), n, what);
	CHECK(fsize(fd) == (off_t)n, "%s: file size %jd", what,
	      (intmax_t)fsize(fd));

	memset(got, 0, n);
	CHECK(read_at(fd, got, n, 0) == n, "%s: read(2) short", what);
	EXPECT_SAME(got, want, n, "read(2) after tierfs_pwrite_gpu");

	dset(dst, 0x5A, n);
	EXPECT_N(tierfs_pread_gpu(fd, dptr(dst), n, 0), n, what);
	d2h(got, dst, n);
	EXPECT_SAME(got, want, n, "tierfs_pread_gpu after tierfs_pwrite_gpu");
	close(fd);
	if (!keep)
		unlink(path);
	cuMemFree(src);
	cuMemFree(dst);
	free(want);
	free(got);
}

static void test_sizes(void)
{
	size_t i, free_b = 0, total_b = 0;

	section("sizes 1 B .. 256 MiB");
	xmkdir(path_of("sizes"));
	for (i = 0; i < NSIZES; i++)
		one_size(sizes[i], path_of("sizes/s%zu", sizes[i]), true);

	if (!getenv("TIERFS_TEST_1G") || strcmp(getenv("TIERFS_TEST_1G"), "1")) {
		printf("   (1 GiB case skipped: set TIERFS_TEST_1G=1)\n");
		return;
	}
	cuMemGetInfo(&free_b, &total_b);
	if (free_b < 3 * GiB) {
		printf("   (1 GiB case skipped: %zu MiB of GPU memory free)\n",
		       free_b >> 20);
		return;
	}
	section("size 1 GiB + 4097 (two ioctls)");
	one_size(GiB + 4097, path_of("big"), false);
}

/* ---- good: offsets and ranges against a host shadow ---------------------- */

static void test_ranges(void)
{
	const size_t bsz = 8 * MiB + 333, fcap = 16 * MiB;
	static const struct { size_t boff, len; uint64_t foff; } w[] = {
		{ 1, 100, 3 },
		{ 511, 65537, 4093 },
		{ 12345, 3 * MiB + 3, MiB + 17 },
		{ 0, 1, 0 },
		{ 4096, 4096, 8 * MiB - 1 },
		{ 7, 2 * MiB, 10 * MiB + 5 },	/* extends the file */
		{ 8 * MiB, 333, 2 },
	};
	static const struct { size_t boff, len; uint64_t foff; } r[] = {
		{ 3, 10, 0 }, { 1, 1, 1 }, { 777, 1 * MiB + 1, 4093 },
		{ 4093, 3 * MiB, MiB }, { 0, 12 * MiB, 0 },
		{ 129, 5 * MiB, 7 * MiB + 9 },
	};
	uint8_t *src = xmalloc(bsz), *shadow = xmalloc(fcap),
		*got = xmalloc(fcap + 2 * MiB);
	CUdeviceptr ds = dalloc(bsz), dd = dalloc(12 * MiB + 4096);
	size_t i, fsz = 0, n, want_n;
	int fd;

	section("unaligned offsets, partial ranges");
	fill(src, bsz, seed0 + 1);
	h2d(ds, src, bsz);
	memset(shadow, 0, fcap);
	fd = xopen(path_of("ranges"), O_RDWR | O_CREAT | O_TRUNC);
	for (i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
		char what[96];

		snprintf(what, sizeof(what), "write %zu@%" PRIu64 " from +%zu",
			 w[i].len, w[i].foff, w[i].boff);
		EXPECT_N(tierfs_pwrite_gpu(fd, dptr(ds + w[i].boff), w[i].len,
					   (off_t)w[i].foff), w[i].len, what);
		memcpy(shadow + w[i].foff, src + w[i].boff, w[i].len);
		if (w[i].foff + w[i].len > fsz)
			fsz = w[i].foff + w[i].len;
	}
	CHECK(fsize(fd) == (off_t)fsz, "ranges: size %jd, expected %zu",
	      (intmax_t)fsize(fd), fsz);
	n = read_at(fd, got, fsz, 0);
	CHECK(n == fsz, "ranges: read(2) got %zu of %zu", n, fsz);
	EXPECT_SAME(got, shadow, fsz, "ranges: whole file by read(2)");

	for (i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
		size_t dsz = 12 * MiB + 4096;
		char what[96];

		snprintf(what, sizeof(what), "read %zu@%" PRIu64 " to +%zu",
			 r[i].len, r[i].foff, r[i].boff);
		want_n = r[i].foff >= fsz ? 0 :
			 (fsz - r[i].foff < r[i].len ? fsz - r[i].foff : r[i].len);
		dset(dd, 0xAB, dsz);
		EXPECT_N(tierfs_pread_gpu(fd, dptr(dd + r[i].boff), r[i].len,
					  (off_t)r[i].foff), want_n, what);
		d2h(got, dd, dsz);
		EXPECT_SAME(got + r[i].boff, shadow + r[i].foff, want_n, what);
		/* guard bytes: nothing written outside the range */
		n = not_byte(got, r[i].boff, 0xAB);
		if (n == r[i].boff)
			n = r[i].boff + want_n +
			    not_byte(got + r[i].boff + want_n,
				     dsz - r[i].boff - want_n, 0xAB);
		CHECK(n >= dsz, "%s: stray write at buffer byte %zu", what, n);
	}
	close(fd);
	unlink(path_of("ranges"));
	cuMemFree(ds);
	cuMemFree(dd);
	free(src);
	free(shadow);
	free(got);
}

/* ---- good: POSIX and GPU I/O mixed, holes, end of file -------------------- */

static void test_mixed(void)
{
	const size_t n = 3 * MiB + 7;
	uint8_t *a = xmalloc(n), *b = xmalloc(n), *got = xmalloc(n + 4096);
	CUdeviceptr d = dalloc(n + 4096);
	int fd;

	section("write(2) then tierfs_pread_gpu, and the other way round");
	fill(a, n, seed0 + 2);
	fill(b, n, seed0 + 3);
	fd = xopen(path_of("mixed"), O_RDWR | O_CREAT | O_TRUNC);
	CHECK(write_at(fd, a, n, 0), "mixed: write(2): %s", strerror(errno));
	dset(d, 0, n);
	EXPECT_N(tierfs_pread_gpu(fd, dptr(d), n, 0), n, "pread_gpu after write");
	d2h(got, d, n);
	EXPECT_SAME(got, a, n, "tierfs_pread_gpu after write(2)");

	/* GPU overwrites the middle, read(2) sees it */
	h2d(d, b, n);
	EXPECT_N(tierfs_pwrite_gpu(fd, dptr(d + 100), MiB, 4096), MiB,
		 "pwrite_gpu over write(2) data");
	memcpy(a + 4096, b + 100, MiB);
	CHECK(read_at(fd, got, n, 0) == n, "mixed: read(2) short");
	EXPECT_SAME(got, a, n, "read(2) after a GPU overwrite");

	/* write(2) overwrites part of that, the GPU reads it */
	CHECK(write_at(fd, b, 5000, 4000), "mixed: write(2) #2");
	memcpy(a + 4000, b, 5000);
	dset(d, 0, n);
	EXPECT_N(tierfs_pread_gpu(fd, dptr(d), n, 0), n, "pread_gpu #2");
	d2h(got, d, n);
	EXPECT_SAME(got, a, n, "tierfs_pread_gpu after write(2) #2");
	close(fd);

	section("reads at and past end of file, a hole");
	fd = xopen(path_of("mixed"), O_RDONLY);
	EXPECT_N(tierfs_pread_gpu(fd, dptr(d), 100, (off_t)n), 0, "read at EOF");
	EXPECT_N(tierfs_pread_gpu(fd, dptr(d), 100, (off_t)n + 100), 0,
		 "read past EOF");
	EXPECT_N(tierfs_pread_gpu(fd, dptr(d), 100, (off_t)n - 10), 10,
		 "read across EOF");
	EXPECT_N(tierfs_pread_gpu(fd, dptr(d), 0, 0), 0, "read of 0 bytes");
	close(fd);
	unlink(path_of("mixed"));

	fd = xopen(path_of("empty"), O_RDWR | O_CREAT | O_TRUNC);
	EXPECT_N(tierfs_pread_gpu(fd, dptr(d), 4096, 0), 0, "read of an empty file");
	EXPECT_N(tierfs_pwrite_gpu(fd, dptr(d), 0, 0), 0, "write of 0 bytes");
	CHECK(fsize(fd) == 0, "write of 0 bytes changed the size");
	close(fd);
	unlink(path_of("empty"));

	fd = xopen(path_of("hole"), O_RDWR | O_CREAT | O_TRUNC);
	h2d(d, b, 4096);
	EXPECT_N(tierfs_pwrite_gpu(fd, dptr(d), 4096, (off_t)MiB), 4096,
		 "write after a hole");
	CHECK(fsize(fd) == (off_t)(MiB + 4096), "hole: size %jd",
	      (intmax_t)fsize(fd));
	dset(d, 0x77, MiB + 4096);
	EXPECT_N(tierfs_pread_gpu(fd, dptr(d), MiB + 4096, 0), MiB + 4096,
		 "read over a hole");
	d2h(got, d, MiB + 4096);
	memset(a, 0, MiB);
	EXPECT_SAME(got, a, MiB, "hole reads as zeros");
	EXPECT_SAME(got + MiB, b, 4096, "data after the hole");
	close(fd);
	unlink(path_of("hole"));
	cuMemFree(d);
	free(a);
	free(b);
	free(got);
}

/* ---- good: an allocation replaced at the same address ------------------- */

static void test_realloc(void)
{
	const size_t n = 2 * MiB;
	uint8_t *a = xmalloc(n), *b = xmalloc(n), *got = xmalloc(n);
	CUdeviceptr d1, d2;
	int fd, same = 0, i;

	section("freed and reallocated buffers (export cache)");
	fill(a, n, seed0 + 4);
	fd = xopen(path_of("realloc"), O_RDWR | O_CREAT | O_TRUNC);
	for (i = 0; i < 4; i++) {
		d1 = dalloc(n);
		fill(b, n, seed0 + 40 + (uint64_t)i);
		h2d(d1, b, n);
		EXPECT_N(tierfs_pwrite_gpu(fd, dptr(d1), n, 0), n, "realloc write");
		CHECK(read_at(fd, got, n, 0) == n, "realloc: short read");
		EXPECT_SAME(got, b, n, "data of the current allocation");
		cuMemFree(d1);
		d2 = dalloc(n);
		same += d2 == d1;
		h2d(d2, a, n);
		EXPECT_N(tierfs_pwrite_gpu(fd, dptr(d2), n, 0), n, "realloc write 2");
		CHECK(read_at(fd, got, n, 0) == n, "realloc: short read 2");
		EXPECT_SAME(got, a, n, "data of the replacing allocation");
		cuMemFree(d2);
	}
	printf("   (%d of 4 replacements at the same address)\n", same);
	close(fd);
	unlink(path_of("realloc"));
	free(a);
	free(b);
	free(got);
}

/* ---- good: threads sharing one allocation -------------------------------- */

struct thr {
	int idx;
	CUdeviceptr d;
	size_t slice;
	const uint8_t *data;
	int failed;			/* 1 open, 2 write, 3 read back */
	int err;			/* its errno, or 0: short */
	ssize_t got;			/* what the failed call returned */
};

static void *thread_main(void *arg)
{
	struct thr *t = arg;
	uint8_t *got = xmalloc(t->slice);
	char path[4096];
	int fd, it;

	cuCtxSetCurrent(ctx);
	snprintf(path, sizeof(path), "%s/thr%d", mnt, t->idx);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		t->failed = 1;
		t->err = errno;
		free(got);
		return NULL;
	}
	for (it = 0; it < 16 && !t->failed; it++) {
		size_t off = (size_t)it * 4099 % (t->slice / 2);
		size_t len = t->slice - off;

		errno = 0;
		t->got = tierfs_pwrite_gpu(fd, dptr(t->d + t->slice * (size_t)t->idx + off),
					   len, (off_t)off);
		if (t->got != (ssize_t)len) {
			t->failed = 2;
			t->err = t->got < 0 ? errno : 0;
		}
	}
	if (!t->failed && (read_at(fd, got, t->slice, 0) != t->slice ||
			   memcmp(got, t->data + t->slice * (size_t)t->idx,
				  t->slice)))
		t->failed = 3;
	close(fd);
	unlink(path);
	free(got);
	return NULL;
}

static void test_threads(void)
{
	const size_t slice = 4 * MiB + 1;
	uint8_t *data = xmalloc(slice * NTHREAD);
	CUdeviceptr d = dalloc(slice * NTHREAD);
	struct thr t[NTHREAD];
	pthread_t tid[NTHREAD];
	int i;

	section("4 threads, one allocation");
	fill(data, slice * NTHREAD, seed0 + 5);
	h2d(d, data, slice * NTHREAD);
	for (i = 0; i < NTHREAD; i++) {
		t[i] = (struct thr){ .idx = i, .d = d, .slice = slice, .data = data };
		pthread_create(&tid[i], NULL, thread_main, &t[i]);
	}
	for (i = 0; i < NTHREAD; i++) {
		pthread_join(tid[i], NULL);
		CHECK(!t[i].failed, "thread %d failed (%d: %zd, %s)", i, t[i].failed, t[i].got,
		      t[i].err ? strerror(t[i].err) : "short");
	}
	cuMemFree(d);
	free(data);
}

/* ---- good: processes ------------------------------------------------------ */

static int child_main(int idx)
{
	size_t n = 16 * MiB + (size_t)idx * 4097, q = n / 4;
	uint8_t *want = xmalloc(n), *got = xmalloc(n);
	CUdeviceptr d;
	char path[4096];
	int fd, k;

	gpu_setup();
	d = dalloc(n);
	fill(want, n, seed0 + 100 + (uint64_t)idx);
	h2d(d, want, n);
	snprintf(path, sizeof(path), "%s/conc/c%d", mnt, idx);
	fd = xopen(path, O_RDWR | O_CREAT | O_TRUNC);
	for (k = 3; k >= 0; k--) {	/* back to front */
		size_t off = q * (size_t)k, len = k == 3 ? n - off : q;

		EXPECT_N(tierfs_pwrite_gpu(fd, dptr(d + off), len, (off_t)off),
			 len, "child write");
	}
	memset(got, 0, n);
	CHECK(read_at(fd, got, n, 0) == n, "child %d: short read", idx);
	EXPECT_SAME(got, want, n, "child: read(2)");
	dset(d, 0, n);
	EXPECT_N(tierfs_pread_gpu(fd, dptr(d), n, 0), n, "child read");
	d2h(got, d, n);
	EXPECT_SAME(got, want, n, "child: tierfs_pread_gpu");
	close(fd);
	unlink(path);
	cuMemFree(d);
	free(want);
	free(got);
	return n_failed ? 1 : 0;
}

static void test_processes(const char *self)
{
	pid_t pid[NCHILD];
	char idx[16];
	int i, st;

	section("4 processes, one file each");
	xmkdir(path_of("conc"));
	fflush(stdout);
	for (i = 0; i < NCHILD; i++) {
		snprintf(idx, sizeof(idx), "%d", i);
		pid[i] = fork();
		if (pid[i] == 0) {
			execl(self, self, mnt, "child", idx, (char *)NULL);
			_exit(127);
		}
		CHECK(pid[i] > 0, "fork: %s", strerror(errno));
	}
	for (i = 0; i < NCHILD; i++) {
		if (pid[i] <= 0)
			continue;
		if (waitpid(pid[i], &st, 0) < 0)
			st = -1;
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "child %d: status 0x%x", i, st);
	}
	rmdir(path_of("conc"));
}

/* ---- verify (after a remount) -------------------------------------------- */

static void test_verify(void)
{
	size_t i;

	section("verify sizes/ after a remount");
	for (i = 0; i < NSIZES; i++) {
		size_t n = sizes[i];
		uint8_t *want = xmalloc(n), *got = xmalloc(n);
		CUdeviceptr d = dalloc(n);
		const char *p = path_of("sizes/s%zu", n);
		int fd = xopen(p, O_RDONLY);

		fill(want, n, seed0 ^ n);
		dset(d, 0x5A, n);
		EXPECT_N(tierfs_pread_gpu(fd, dptr(d), n, 0), n, "verify read");
		d2h(got, d, n);
		EXPECT_SAME(got, want, n, "verify: tierfs_pread_gpu");
		memset(got, 0, n);
		CHECK(read_at(fd, got, n, 0) == n, "verify: short read(2)");
		EXPECT_SAME(got, want, n, "verify: read(2)");
		close(fd);
		unlink(p);
		cuMemFree(d);
		free(want);
		free(got);
	}
	rmdir(path_of("sizes"));
}

/* ---- bad ------------------------------------------------------------------- */

static void test_bad(void)
{
	const size_t n = MiB;
	uint8_t h[TIERFS_IPC_HANDLE_SIZE], zero[TIERFS_IPC_HANDLE_SIZE] = { 0 };
	uint8_t *data = xmalloc(n), *got = xmalloc(n);
	CUdeviceptr d = dalloc(n), dfree;
	uint64_t base = 0, size = 0;
	char tmpl[] = "/tmp/tierfs-test-ioctl.XXXXXX";
	unsigned long bad_size_cmd = _IOW(TIERFS_IOC_MAGIC, 1, char[95]);
	unsigned long unknown_cmd = _IOW(TIERFS_IOC_MAGIC, 3, struct tierfs_gpu_io);
	int fd, ro, wo, dirfd, other, i, dev = 0;

	fill(data, n, seed0 + 6);
	h2d(d, data, n);
	fd = xopen(path_of("bad"), O_RDWR | O_CREAT | O_TRUNC);
	CHECK(write_at(fd, data, n, 0), "bad: write(2)");

	section("garbage handles");
	for (i = 0; i < 4; i++) {
		fill(h, sizeof(h), seed0 + 200 + (uint64_t)i);
		EXPECT_ERR(raw_io(fd, TIERFS_IOC_PWRITE_GPU, h, 0, 4096, 0, 0),
			   EINVAL, "random handle (write)");
		EXPECT_ERR(raw_io(fd, TIERFS_IOC_PREAD_GPU, h, 0, 4096, 0, 0),
			   EINVAL, "random handle (read)");
	}
	EXPECT_ERR(raw_io(fd, TIERFS_IOC_PWRITE_GPU, zero, 0, 4096, 0, 0),
		   EINVAL, "all-zero handle");

	section("the handle of freed memory");
	dfree = dalloc(n);
	CHECK(gpu_ipc_export(dfree, h, &base, &size, &dev) == 0,
	      "gpu_ipc_export of a fresh allocation");
	cuMemFree(dfree);
	/* the driver may still open it (it can keep a freed allocation's
	 * memory); either way, no crash and no other error */
	errno = 0;
	i = raw_io(fd, TIERFS_IOC_PWRITE_GPU, h, 0, 4096, 0, 0);
	CHECK(i == 4096 || (i < 0 && errno == EINVAL),
	      "handle of freed memory: %d (%s), expected 4096 or EINVAL", i,
	      strerror(errno));
	printf("   (handle of freed memory: %s)\n",
	       i < 0 ? "refused, EINVAL" : "opened by the driver");
	EXPECT_ERR(tierfs_pwrite_gpu(fd, dptr(dfree), 4096, 0), EINVAL,
		   "tierfs_pwrite_gpu of a freed pointer");
	EXPECT_ERR(tierfs_pwrite_gpu(fd, data, 4096, 0), EINVAL,
		   "tierfs_pwrite_gpu of a host pointer");
	EXPECT_ERR(tierfs_pwrite_gpu(fd, NULL, 4096, 0), EINVAL,
		   "tierfs_pwrite_gpu of NULL");

	section("ranges, offsets, flags");
	CHECK(gpu_ipc_export(d, h, &base, &size, &dev) == 0, "gpu_ipc_export");
	CHECK(base == d && size >= n, "export: base/size");
	EXPECT_N(raw_io(fd, TIERFS_IOC_PWRITE_GPU, h, 0, 4096, 0, 0), 4096,
		 "raw ioctl with a good handle");
	EXPECT_ERR(raw_io(fd, TIERFS_IOC_PWRITE_GPU, h, 16, UINT64_MAX - 8, 0, 0),
		   EINVAL, "handle_off + len wraps");
	EXPECT_ERR(raw_io(fd, TIERFS_IOC_PWRITE_GPU, h, 0, 16, UINT64_MAX - 4, 0),
		   EINVAL, "file_off + len wraps");
	EXPECT_ERR(raw_io(fd, TIERFS_IOC_PWRITE_GPU, h, 0, 16,
			  (uint64_t)INT64_MAX - 4, 0),
		   EINVAL, "file_off + len past INT64_MAX");
	EXPECT_ERR(raw_io(fd, TIERFS_IOC_PREAD_GPU, h, 0, 16, (uint64_t)1 << 63, 0),
		   EINVAL, "file_off past INT64_MAX");
	EXPECT_ERR(raw_io(fd, TIERFS_IOC_PWRITE_GPU, h, size - 8, 16, 0, 0),
		   EINVAL, "range leaves the allocation");
	EXPECT_ERR(raw_io(fd, TIERFS_IOC_PREAD_GPU, h, size + 4096, 16, 0, 0),
		   EINVAL, "handle_off past the allocation");
	EXPECT_ERR(raw_io(fd, TIERFS_IOC_PWRITE_GPU, h, 0, 16, 0, 1),
		   EINVAL, "flags != 0");
	EXPECT_N(raw_io(fd, TIERFS_IOC_PWRITE_GPU, h, size + 4096, 0, 0, 0), 0,
		 "len 0 (nothing checked past the flags)");
	EXPECT_ERR(tierfs_pwrite_gpu(fd, dptr(d), size + 1, 0), EINVAL,
		   "library: len past the allocation");
	EXPECT_ERR(tierfs_pwrite_gpu(fd, dptr(d + size - 1), 2, 0), EINVAL,
		   "library: range leaves the allocation");
	EXPECT_ERR(tierfs_pwrite_gpu(fd, dptr(d), 16, -1), EINVAL,
		   "library: negative offset");
	EXPECT_ERR(tierfs_pread_gpu(fd, dptr(d), (size_t)SSIZE_MAX + 1, 0),
		   EINVAL, "library: len > SSIZE_MAX");
	EXPECT_ERR(tierfs_pwrite_gpu(fd, dptr(d), 16, INT64_MAX - 4), EINVAL,
		   "library: off + len past INT64_MAX");

	section("commands");
	EXPECT_ERR(raw_io(fd, bad_size_cmd, h, 0, 16, 0, 0), ENOTTY,
		   "wrong-size command");
	EXPECT_ERR(raw_io(fd, unknown_cmd, h, 0, 16, 0, 0), ENOTTY,
		   "unknown command");
	CHECK(!isatty(fd), "isatty on a tierfs file");
	dirfd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	EXPECT_ERR(raw_io(dirfd, TIERFS_IOC_PWRITE_GPU, h, 0, 16, 0, 0), EINVAL,
		   "ioctl on a directory");
	CHECK(tierfs_is_tierfs(dirfd) == 1, "tierfs_is_tierfs(mount dir)");
	close(dirfd);

	section("access modes, other file systems");
	ro = xopen(path_of("bad"), O_RDONLY);
	wo = xopen(path_of("bad"), O_WRONLY);
	EXPECT_ERR(tierfs_pwrite_gpu(ro, dptr(d), 16, 0), EBADF,
		   "pwrite_gpu on O_RDONLY");
	EXPECT_ERR(raw_io(ro, TIERFS_IOC_PWRITE_GPU, h, 0, 16, 0, 0), EBADF,
		   "raw pwrite on O_RDONLY");
	EXPECT_ERR(tierfs_pread_gpu(wo, dptr(d), 16, 0), EBADF,
		   "pread_gpu on O_WRONLY");
	EXPECT_N(tierfs_pread_gpu(ro, dptr(d), 16, 0), 16, "pread_gpu on O_RDONLY");
	EXPECT_N(tierfs_pwrite_gpu(wo, dptr(d), 16, 0), 16, "pwrite_gpu on O_WRONLY");
	CHECK(tierfs_is_tierfs(ro) == 1, "tierfs_is_tierfs(tierfs file)");
	close(ro);
	close(wo);
	other = mkstemp(tmpl);
	if (other >= 0) {
		unlink(tmpl);
		CHECK(tierfs_is_tierfs(other) == 0, "tierfs_is_tierfs(/tmp file)");
		EXPECT_ERR(tierfs_pwrite_gpu(other, dptr(d), 16, 0), ENOTTY,
			   "pwrite_gpu on a file not on tierfs");
		EXPECT_ERR(tierfs_pread_gpu(other, dptr(d), 16, 0), ENOTTY,
			   "pread_gpu on a file not on tierfs");
		close(other);
	}
	EXPECT_ERR(tierfs_pwrite_gpu(-1, dptr(d), 16, 0), EBADF,
		   "pwrite_gpu on fd -1");

	section("still working");
	fill(data, n, seed0 + 7);
	h2d(d, data, n);
	EXPECT_N(tierfs_pwrite_gpu(fd, dptr(d), n, 0), n, "write after errors");
	CHECK(read_at(fd, got, n, 0) == n, "short read after errors");
	EXPECT_SAME(got, data, n, "data after errors");
	close(fd);
	unlink(path_of("bad"));
	cuMemFree(d);
	free(data);
	free(got);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 2 ? argv[2] : "all";
	const char *s = getenv("TIERFS_TEST_SEED");
	struct stat st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2) {
		printf("SKIP: usage: %s MOUNT [good|bad|verify|all] "
		       "(run by tests/test_ioctl.py against a tierfs mount)\n",
		       argv[0]);
		return 77;
	}
	mnt = argv[1];
	seed0 = s && *s ? strtoull(s, NULL, 0) : 0x7469657266735ull;
	if (stat(mnt, &st) < 0 || !S_ISDIR(st.st_mode)) {
		printf("FAIL: %s is not a directory\n", mnt);
		return 1;
	}
	if (!strcmp(mode, "child"))
		return child_main(argc > 3 ? atoi(argv[3]) : 0);

	gpu_setup();
	printf("seed 0x%" PRIx64 " (TIERFS_TEST_SEED)\n", seed0);
	require_gpu_tier();
	if (!strcmp(mode, "good") || !strcmp(mode, "all")) {
		test_sizes();
		test_ranges();
		test_mixed();
		test_realloc();
		test_threads();
		test_processes("/proc/self/exe");
	}
	if (!strcmp(mode, "verify") || !strcmp(mode, "all"))
		test_verify();
	if (!strcmp(mode, "bad") || !strcmp(mode, "all"))
		test_bad();
	printf("%d checks, %d failed\n", n_checks, n_failed);
	return n_failed ? 1 : 0;
}
