/*
 * bench_gpu_io.c - checkpoint and restore throughput of a GPU buffer:
 * the tierfs ioctl against POSIX I/O and against a plain device copy.
 *
 * usage: bench_gpu_io MOUNT [REPS]        (REPS default 5)
 *        bench_gpu_io MOUNT --vec [NSEG [REPS]]   (NSEG default 62)
 *
 * --vec: a state dict's checkpoint: NSEG segments of mixed sizes (an
 * embedding of 64 MiB, then weights of 4 MiB and 1 MiB, biases and norms
 * of 16 and 4 KiB, in turn), cut from two allocations, written to one file
 * at file offsets in reverse order and read back: one vectored call
 * (tierfs_pwritev_gpu / tierfs_preadv_gpu), NSEG single calls
 * (tierfs_pwrite_gpu / tierfs_pread_gpu), and NSEG cuMemcpyDtoDAsync of
 * the same bytes in this process (the ceiling).  Prints the median and
 * best milliseconds of each, the ratios, and checks the bytes read back.
 *
 * MOUNT is a tierfs mount with a GPU tier on the same GPU, big enough to
 * hold a 1 GiB file (e.g. -o gpu=0,gpu_cache=4G,host_cache=4G).  It waits
 * for the daemon's start-up work (GPU cache mapped, host cache pinned).  For each
 * size (128 MiB and 1 GiB; BENCH_SIZES_MIB="128,1024" overrides) and each
 * path, REPS times: checkpoint (open O_WRONLY|O_CREAT|O_TRUNC, write, close)
 * and restore (open O_RDONLY, read, close) of a fresh file, then unlink.
 *
 *   ioctl   tierfs_pwrite_gpu / tierfs_pread_gpu: device to device, the
 *           daemon copying (TIERFS_GPU_SHARE=0 for libtierfs)
 *   shared  the same calls, libtierfs copying itself through the daemon's
 *           shared GPU cache (a mount with -o gpu_share; without it this
 *           path is the ioctl again, and the program says so)
 *   posix   the application copies D2H into pinned host memory and
 *           write(2)s it; read(2)s into pinned memory and copies H2D
 *   raw     cuMemcpyDtoD of the same size in this process (no file at all):
 *           the ceiling for the ioctl
 *
 * Prints the median and best GB/s (10^9 bytes/s) per path and direction,
 * from open to close ("all") and of the data call alone ("call": the ioctl,
 * or the application's device copy plus write/read), then the ratios
 * ioctl/raw and ioctl/posix of the medians, and per run the tier the file
 * was restored from (its user.tierfs.tier just before).  Restored bytes
 * are spot-checked (64 KiB at 16 places) every time.  TIERFS_GPU: device
 * (default 0); BENCH_VERBOSE=1: also each checkpoint's and restore's
 * open/call/close times;
 * BENCH_GAP_MS=N: the GPU idles N ms before each checkpoint and restore (an
 * application computing between them; the daemon's cascade then runs in
 * the gap instead of beside the next copy).
 * Then the cost of one call: 4 KiB moved 200 times each way on an open
 * file, by the ioctl and by POSIX I/O with the application's copy.  Last,
 * the daemon's GPU -> host cascade rate over the run (bytes it copied from
 * its GPU cache into its host cache over the time those copies took, from
 * user.tierfs.stats) against cuMemcpyDtoH into pinned memory here.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cuda.h>

#include "gpu.h"
#include "gpu_dl.h"
#include "tierfs.h"

#define MiB	((size_t)1 << 20)
#define MAXREPS	50
#define MAXSIZES 8

enum path { P_IOCTL, P_SHARED, P_POSIX, P_RAW, NPATHS };
static const char *const path_name[NPATHS] = { "ioctl", "shared", "posix", "raw D2D" };

/* libtierfs: daemon copy (ioctl) or the shared cache, for this process */
static void use_share(bool on)
{
	setenv("TIERFS_GPU_SHARE", on ? "1" : "0", 1);
}

static const char *mnt;
static int verbose;		/* BENCH_VERBOSE=1: per-run times */
static int gap_ms;		/* BENCH_GAP_MS: idle time before each call */

/* The application computing between checkpoints: the GPU idle here. */
static void gap(void)
{
	struct timespec ts = { gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L };

	if (gap_ms > 0)
		nanosleep(&ts, NULL);
}
static CUdeviceptr dsrc, ddst;
static unsigned char *pinned, *ref;

#define CU(call) do {							\
	CUresult r_ = (call);						\
	if (r_ != CUDA_SUCCESS) {					\
		const char *n_ = "?";					\
		cuGetErrorName(r_, &n_);				\
		fprintf(stderr, "bench_gpu_io: %s: %s\n", #call, n_);	\
		exit(1);						\
	}								\
} while (0)

static void die(const char *what)
{
	fprintf(stderr, "bench_gpu_io: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void write_all(int fd, const unsigned char *p, size_t n)
{
	while (n) {
		ssize_t r = write(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			die("write");
		p += r;
		n -= (size_t)r;
	}
}

static void read_all(int fd, unsigned char *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("read");
		if (r == 0) {
			errno = EIO;
			die("read: unexpected end of file");
		}
		p += r;
		n -= (size_t)r;
	}
}

/* Spot-check the restored buffer (device dst) against ref. */
static void check(CUdeviceptr d, size_t n, const char *what)
{
	static unsigned char got[64 << 10];
	size_t k, off, len;

	for (k = 0; k < 16; k++) {
		off = n / 16 * k;
		len = n - off < sizeof(got) ? n - off : sizeof(got);
		CU(cuMemcpyDtoHAsync(got, d + off, len, NULL));
		CU(cuStreamSynchronize(NULL));
		if (memcmp(got, ref + off, len)) {
			fprintf(stderr, "bench_gpu_io: %s: restored data differs "
				"near byte %zu\n", what, off);
			exit(1);
		}
	}
}

/* Zero the places check() looks at. */
static void spoil(CUdeviceptr d, size_t n)
{
	static const unsigned char zero[64 << 10];
	size_t k, off, len;

	for (k = 0; k < 16; k++) {
		off = n / 16 * k;
		len = n - off < sizeof(zero) ? n - off : sizeof(zero);
		CU(cuMemcpyHtoDAsync(d + off, zero, len, NULL));
	}
	CU(cuStreamSynchronize(NULL));
}

/* Times of one run: [C_*] checkpoint, [R_*] restore; *_ALL from open to
 * close, *_CALL the data call (and the application's copy) alone. */
enum { C_ALL, C_CALL, R_ALL, R_CALL, NT };

/*
 * Wait (at most 120 s) until the daemon's start-up work is over: its GPU
 * cache fully mapped and its host cache touched and pinned.  Before that,
 * the toucher and the pinning hold the process's memory map and the first
 * runs would measure them.  Returns the seconds waited.
 */
static double wait_ready(void)
{
	static char buf[1 << 16];
	double t0 = now();

	while (now() - t0 < 120) {
		ssize_t n = getxattr(mnt, "user.tierfs.stats", buf, sizeof(buf) - 1);

		if (n > 0) {
			buf[n] = 0;
			if (strstr(buf, "\"fully_mapped\":true") && strstr(buf, "\"pinned\":true"))
				break;
		}
		usleep(20000);
	}
	return now() - t0;
}

/* The first tier "user.tierfs.tier" lists, "gpu" etc., or "?". */
static void tier_of(const char *path, char *buf, size_t len)
{
	ssize_t n = getxattr(path, TIERFS_XATTR_TIER, buf, len - 1);
	char *comma;

	if (n <= 0) {
		snprintf(buf, len, "%s", n == 0 ? "none" : "?");
		return;
	}
	buf[n] = '\0';
	comma = strchr(buf, ',');
	if (comma)
		*comma = '\0';
}

/* One checkpoint + restore: seconds in t[], the restore's tier in tier. */
static void one(enum path p, size_t n, int rep, double t[NT], char *tier,
		size_t tierlen)
{
	char path[4096];
	double t0, t1;
	int fd;

	spoil(ddst, n);		/* the restore target starts out wrong */
	gap();
	if (p == P_RAW) {
		t0 = now();
		CU(cuMemcpyDtoDAsync(ddst, dsrc, n, NULL));
		CU(cuStreamSynchronize(NULL));
		t[C_ALL] = t[C_CALL] = now() - t0;
		gap();
		t0 = now();
		CU(cuMemcpyDtoDAsync(ddst, dsrc, n, NULL));
		CU(cuStreamSynchronize(NULL));
		t[R_ALL] = t[R_CALL] = now() - t0;
		check(ddst, n, "raw");
		snprintf(tier, tierlen, "-");
		return;
	}

	snprintf(path, sizeof(path), "%s/bench_gpu_io.%d.%zu", mnt, rep, n);
	t0 = now();
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		die(path);
	t1 = now();
	if (p == P_IOCTL || p == P_SHARED) {
		use_share(p == P_SHARED);
		if (tierfs_pwrite_gpu(fd, (void *)(uintptr_t)dsrc, n, 0) !=
		    (ssize_t)n)
			die("tierfs_pwrite_gpu");
	} else {
		CU(cuMemcpyDtoHAsync(pinned, dsrc, n, NULL));
		CU(cuStreamSynchronize(NULL));
		write_all(fd, pinned, n);
	}
	t[C_CALL] = now() - t1;
	t1 = now();
	if (close(fd) < 0)
		die("close");
	t[C_ALL] = now() - t0;
	if (verbose)
		printf("   %s %zu MiB rep %d: checkpoint open %.3f ms, call %.3f ms, "
		       "close %.3f ms\n", path_name[p], n / MiB, rep,
		       (t[C_ALL] - t[C_CALL] - (now() - t1)) * 1e3, t[C_CALL] * 1e3,
		       (now() - t1) * 1e3);

	tier_of(path, tier, tierlen);
	gap();
	t0 = now();
	fd = open(path, O_RDONLY);
	if (fd < 0)
		die(path);
	t1 = now();
	if (p == P_IOCTL || p == P_SHARED) {
		if (tierfs_pread_gpu(fd, (void *)(uintptr_t)ddst, n, 0) !=
		    (ssize_t)n)
			die("tierfs_pread_gpu");
	} else {
		read_all(fd, pinned, n);
		CU(cuMemcpyHtoDAsync(ddst, pinned, n, NULL));
		CU(cuStreamSynchronize(NULL));
	}
	t[R_CALL] = now() - t1;
	t1 = now();
	close(fd);
	t[R_ALL] = now() - t0;
	if (verbose)
		printf("   %s %zu MiB rep %d: restore open %.3f ms, call %.3f ms, "
		       "close %.3f ms (from %s)\n", path_name[p], n / MiB, rep,
		       (t[R_ALL] - t[R_CALL] - (now() - t1)) * 1e3,
		       t[R_CALL] * 1e3, (now() - t1) * 1e3, tier);
	check(ddst, n, path_name[p]);
	if (unlink(path) < 0)
		die("unlink");
}

/* The daemon's GPU -> host cascade counters (user.tierfs.stats). */
struct cascade_stat {
	double bytes, secs;	/* cascaded, and the time its copies took */
	int pinned;		/* the host cache is pinned */
};

static double json_num(const char *js, const char *key)
{
	const char *p = strstr(js, key);

	return p ? strtod(p + strlen(key), NULL) : 0;
}

static void cascade_sample(struct cascade_stat *c)
{
	char js[16384];
	ssize_t n = getxattr(mnt, "user.tierfs.stats", js, sizeof(js) - 1);
	double bw;

	memset(c, 0, sizeof(*c));
	if (n <= 0)
		return;
	js[n] = 0;
	c->bytes = json_num(js, "\"bytes_to_host\":");
	bw = json_num(js, "\"to_host_bandwidth\":");
	c->secs = bw > 0 ? c->bytes / bw : 0;
	c->pinned = strstr(js, "\"pinned\":true") != NULL;
}

static double median(double *v, int n);

/*
 * GPU -> host cascade: the daemon's copy rate over this run (its copies
 * of the checkpoints above out of the GPU cache into its host cache),
 * against cuMemcpyDtoH of the same sizes into pinned memory here.
 */
static void cascade(size_t n, int reps, const struct cascade_stat *c0)
{
	struct cascade_stat c1;
	double t[MAXREPS], d2h;
	int r;

	for (r = 0; r < reps; r++) {
		double t0 = now();

		CU(cuMemcpyDtoHAsync(pinned, dsrc, n, NULL));
		CU(cuStreamSynchronize(NULL));
		t[r] = now() - t0;
	}
	d2h = n / median(t, reps) / 1e9;
	cascade_sample(&c1);
	printf("\nGPU -> host cascade, the daemon's copies during this run: ");
	if (c1.secs - c0->secs <= 0) {
		printf("none measured\n");
		return;
	}
	double casc = (c1.bytes - c0->bytes) / (c1.secs - c0->secs) / 1e9;

	printf("%.1f GB/s over %.2f GB (host cache %s)\n", casc,
	       (c1.bytes - c0->bytes) / 1e9, c1.pinned ? "pinned" : "not pinned yet");
	printf("pinned D2H here (cuMemcpyDtoH, %zu MiB, median of %d): %.1f GB/s; "
	       "cascade/pinned = %.2f\n", n / MiB, reps, d2h, casc / d2h);
}

static double median(double *v, int n);

/*
 * Per-call cost: the median time of LAT_N calls moving 4 KiB on an open
 * file, through the ioctl and through POSIX with the application's copy.
 */
#define LAT_N	200
#define LAT_SZ	4096

static void latency(void)
{
	static double tw[3][LAT_N], tr[3][LAT_N], tx[2][LAT_N];
	char path[4096];
	double t0;
	int fd, i, p;

	snprintf(path, sizeof(path), "%s/bench_gpu_io.lat", mnt);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		die(path);
	for (p = 0; p < 3; p++) {
		use_share(p == 1);
		for (i = 0; i < LAT_N; i++) {
			t0 = now();
			if (p < 2) {
				if (tierfs_pwrite_gpu(fd, (void *)(uintptr_t)dsrc,
						      LAT_SZ, 0) != LAT_SZ)
					die("tierfs_pwrite_gpu");
			} else {
				CU(cuMemcpyDtoHAsync(pinned, dsrc, LAT_SZ, NULL));
				CU(cuStreamSynchronize(NULL));
				if (pwrite(fd, pinned, LAT_SZ, 0) != LAT_SZ)
					die("pwrite");
			}
			tw[p][i] = now() - t0;
			t0 = now();
			if (p < 2) {
				if (tierfs_pread_gpu(fd, (void *)(uintptr_t)ddst,
						     LAT_SZ, 0) != LAT_SZ)
					die("tierfs_pread_gpu");
			} else {
				if (pread(fd, pinned, LAT_SZ, 0) != LAT_SZ)
					die("pread");
				CU(cuMemcpyHtoDAsync(ddst, pinned, LAT_SZ, NULL));
				CU(cuStreamSynchronize(NULL));
			}
			tr[p][i] = now() - t0;
		}
	}
	/* the same ioctl write, each right after this process used the GPU
	 * (a 4 KiB device copy of its own): the GPU then switches from the
	 * application's context to the daemon's for the daemon's copy */
	for (p = 0; p < 2; p++) {
		use_share(p == 1);
		for (i = 0; i < LAT_N; i++) {
			CU(cuMemcpyDtoDAsync(ddst, dsrc, LAT_SZ, NULL));
			CU(cuStreamSynchronize(NULL));
			t0 = now();
			if (tierfs_pwrite_gpu(fd, (void *)(uintptr_t)dsrc, LAT_SZ,
					      0) != LAT_SZ)
				die("tierfs_pwrite_gpu");
			tx[p][i] = now() - t0;
		}
	}
	close(fd);
	unlink(path);
	printf("\nper call, %d B, median of %d: ioctl write %.1f us, read %.1f us; "
	       "shared write %.1f us, read %.1f us; "
	       "posix (with the copy) write %.1f us, read %.1f us\n", LAT_SZ,
	       LAT_N, median(tw[0], LAT_N) * 1e6, median(tr[0], LAT_N) * 1e6,
	       median(tw[1], LAT_N) * 1e6, median(tr[1], LAT_N) * 1e6,
	       median(tw[2], LAT_N) * 1e6, median(tr[2], LAT_N) * 1e6);
	printf("write right after a device copy of this process's own: ioctl %.1f us, "
	       "shared %.1f us\n", median(tx[0], LAT_N) * 1e6,
	       median(tx[1], LAT_N) * 1e6);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- --vec: many segments, one file --------------------------------- */

#define VEC_MAX 4096

static size_t vec_size(int i)
{
	static const size_t cycle[] = { 4 * MiB, 16 << 10, 1 * MiB, 4 << 10 };

	return i == 0 ? 64 * MiB : cycle[(i - 1) % 4];
}

static int vec_main(int nseg, int reps)
{
	static struct tierfs_gpu_iovec w[VEC_MAX], rd[VEC_MAX];
	static double t[5][MAXREPS];
	static const char *const what[5] = {
		"vectored write", "single writes", "vectored read", "single reads",
		"raw D2D",
	};
	char path[4096], msg[256], name[128] = "?";
	const char *g = getenv("TIERFS_GPU");
	uint64_t free_b = 0, total_b = 0;
	size_t total = 0, half[2] = { 0, 0 }, at[2] = { 0, 0 };
	CUdeviceptr a[2], back;
	unsigned char *h1, *h2;
	int i, r, k, fd;

	if (gpu_init(g && *g ? atoi(g) : 0, msg, sizeof(msg)) < 0) {
		fprintf(stderr, "bench_gpu_io: no GPU: %s\n", msg);
		return 77;
	}
	gpu_mem_info(&free_b, &total_b, name, sizeof(name));
	for (i = 0; i < nseg; i++) {
		half[i % 2] += vec_size(i);
		total += vec_size(i);
	}
	printf("bench_gpu_io --vec: %s, mount %s, %d segments, %.1f MiB, %d reps\n",
	       name, mnt, nseg, total / (double)MiB, reps);
	printf("waited %.2f s for the daemon's start-up\n", wait_ready());
	CU(cuMemAlloc(&a[0], half[0]));
	CU(cuMemAlloc(&a[1], half[1] ? half[1] : 1));
	CU(cuMemAlloc(&back, total));
	h1 = malloc(total);
	h2 = malloc(total);
	if (!h1 || !h2)
		die("host buffers");
	for (i = 0; (size_t)i < total; i++)
		h1[i] = (unsigned char)(i * 131 + (i >> 16) + 7);
	{
		size_t fo = total;

		for (i = 0; i < nseg; i++) {	/* file offsets in reverse */
			size_t n = vec_size(i);

			fo -= n;
			w[i].dev_ptr = (void *)(uintptr_t)(a[i % 2] + at[i % 2]);
			w[i].len = n;
			w[i].off = (off_t)fo;
			rd[i] = w[i];
			rd[i].dev_ptr = (void *)(uintptr_t)(back + fo);
			CU(cuMemcpyHtoDAsync(a[i % 2] + at[i % 2], h1 + fo, n, NULL));
			at[i % 2] += n;
		}
		CU(cuStreamSynchronize(NULL));
	}
	snprintf(path, sizeof(path), "%s/bench_gpu_io.vec", mnt);
	for (r = -1; r < reps; r++) {	/* r -1: warm-up */
		double t0;

		fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			die(path);
		t0 = now();
		if (tierfs_pwritev_gpu(fd, w, nseg) != (ssize_t)total)
			die("tierfs_pwritev_gpu");
		if (r >= 0)
			t[0][r] = now() - t0;
		memset(h2, 0, total);
		CU(cuMemcpyHtoDAsync(back, h2, total, NULL));
		CU(cuStreamSynchronize(NULL));
		t0 = now();
		if (tierfs_preadv_gpu(fd, rd, nseg) != (ssize_t)total)
			die("tierfs_preadv_gpu");
		if (r >= 0)
			t[2][r] = now() - t0;
		CU(cuMemcpyDtoHAsync(h2, back, total, NULL));
		CU(cuStreamSynchronize(NULL));
		if (memcmp(h1, h2, total)) {
			fprintf(stderr, "bench_gpu_io: vectored read differs\n");
			return 1;
		}
		close(fd);
		fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			die(path);
		t0 = now();
		for (i = 0; i < nseg; i++)
			if (tierfs_pwrite_gpu(fd, w[i].dev_ptr, w[i].len, w[i].off) !=
			    (ssize_t)w[i].len)
				die("tierfs_pwrite_gpu");
		if (r >= 0)
			t[1][r] = now() - t0;
		t0 = now();
		for (i = 0; i < nseg; i++)
			if (tierfs_pread_gpu(fd, rd[i].dev_ptr, rd[i].len, rd[i].off) !=
			    (ssize_t)rd[i].len)
				die("tierfs_pread_gpu");
		if (r >= 0)
			t[3][r] = now() - t0;
		close(fd);
		t0 = now();
		for (i = 0; i < nseg; i++)
			CU(cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)rd[i].dev_ptr,
					     (CUdeviceptr)(uintptr_t)w[i].dev_ptr, w[i].len,
					     NULL));
		CU(cuStreamSynchronize(NULL));
		if (r >= 0)
			t[4][r] = now() - t0;
		unlink(path);
	}
	printf("\n%-16s %10s %10s %8s %10s\n", "", "median ms", "best ms", "GB/s",
	       "x raw");
	for (k = 0; k < 5; k++) {
		double m = median(t[k], reps);

		printf("%-16s %10.3f %10.3f %8.2f %10.2f\n", what[k], m * 1e3,
		       t[k][0] * 1e3, total / m / 1e9, m / median(t[4], reps));
	}
	printf("single/vectored: write %.2fx, read %.2fx\n",
	       median(t[1], reps) / median(t[0], reps),
	       median(t[3], reps) / median(t[2], reps));
	cuMemFree(a[0]);
	cuMemFree(a[1]);
	cuMemFree(back);
	free(h1);
	free(h2);
	return 0;
}

int main(int argc, char **argv)
{
	const char *env = getenv("BENCH_SIZES_MIB"), *g = getenv("TIERFS_GPU");
	size_t sizes[MAXSIZES], maxn = 0, i;
	int nsizes = 0, reps = argc > 2 ? atoi(argv[2]) : 5, s, p, r, k;
	double t[NPATHS][NT][MAXREPS], med[NPATHS][NT], best[NPATHS][NT];
	double tt[NT];
	static char tiers[NPATHS][MAXREPS][16];
	char tier[16];
	char msg[256], name[128] = "?", label[32];
	uint64_t free_b = 0, total_b = 0;
	struct cascade_stat c0;

	if (argc > 2 && strcmp(argv[2], "--vec") == 0) {
		int nseg = argc > 3 ? atoi(argv[3]) : 62;

		reps = argc > 4 ? atoi(argv[4]) : 5;
		if (nseg < 1 || nseg > VEC_MAX || reps < 1 || reps > MAXREPS) {
			fprintf(stderr, "usage: %s MOUNT --vec [NSEG (1..%d) [REPS (1..%d)]]\n",
				argv[0], VEC_MAX, MAXREPS);
			return 2;
		}
		mnt = argv[1];
		return vec_main(nseg, reps);
	}
	if (argc < 2 || reps < 1 || reps > MAXREPS) {
		fprintf(stderr, "usage: %s MOUNT [REPS (1..%d)]\n"
			"       %s MOUNT --vec [NSEG [REPS]]\n", argv[0], MAXREPS, argv[0]);
		return 2;
	}
	mnt = argv[1];
	verbose = getenv("BENCH_VERBOSE") && atoi(getenv("BENCH_VERBOSE"));
	gap_ms = getenv("BENCH_GAP_MS") ? atoi(getenv("BENCH_GAP_MS")) : 0;
	if (env && *env) {
		char *copy = strdup(env), *tok, *save = NULL;

		for (tok = strtok_r(copy, ",", &save); tok && nsizes < MAXSIZES;
		     tok = strtok_r(NULL, ",", &save))
			sizes[nsizes++] = strtoul(tok, NULL, 0) * MiB;
		free(copy);
	} else {
		sizes[nsizes++] = 128 * MiB;
		sizes[nsizes++] = 1024 * MiB;
	}
	for (s = 0; s < nsizes; s++)
		if (sizes[s] > maxn)
			maxn = sizes[s];

	if (gpu_init(g && *g ? atoi(g) : 0, msg, sizeof(msg)) < 0) {
		fprintf(stderr, "bench_gpu_io: no GPU: %s\n", msg);
		return 77;
	}
	gpu_mem_info(&free_b, &total_b, name, sizeof(name));
	printf("bench_gpu_io: %s, mount %s, %d reps, %d ms idle before each "
	       "checkpoint and restore\n", name, mnt, reps, gap_ms);
	printf("waited %.2f s for the daemon's start-up (GPU cache mapped, host cache "
	       "pinned)\n", wait_ready());

	CU(cuMemAlloc(&dsrc, maxn));
	CU(cuMemAlloc(&ddst, maxn));
	if (posix_memalign((void **)&pinned, 1 << 21, maxn) ||
	    !(ref = malloc(maxn))) {
		errno = ENOMEM;
		die("host buffers");
	}
	memset(pinned, 0, maxn);	/* touch before pinning */
	CU(cuMemHostRegister(pinned, maxn, 0));
	for (i = 0; i < maxn; i++)
		ref[i] = (unsigned char)(i * 131 + (i >> 16) + 7);
	CU(cuMemcpyHtoDAsync(dsrc, ref, maxn, NULL));
	CU(cuStreamSynchronize(NULL));

	/* warm up every path once (first IPC open, first file) */
	cascade_sample(&c0);
	for (p = 0; p < NPATHS; p++)
		one((enum path)p, sizes[0], -1, tt, tier, sizeof(tier));

	printf("\nGB/s, median of %d (best); \"all\": open to close, "
	       "\"call\": the data call alone\n", reps);
	printf("%-9s %-11s %17s %17s %17s %17s  %s\n", "size", "path",
	       "ckpt all", "ckpt call", "restore all", "restore call",
	       "restored from");
	for (s = 0; s < nsizes; s++) {
		size_t n = sizes[s];

		for (r = 0; r < reps; r++)
			for (p = 0; p < NPATHS; p++) {
				one((enum path)p, n, r, tt, tier, sizeof(tier));
				for (k = 0; k < NT; k++)
					t[p][k][r] = tt[k];
				snprintf(tiers[p][r], sizeof(tiers[p][r]), "%s",
					 tier);
			}
		for (p = 0; p < NPATHS; p++) {
			char from[256] = "";

			for (k = 0; k < NT; k++) {
				med[p][k] = n / median(t[p][k], reps) / 1e9;
				best[p][k] = n / t[p][k][0] / 1e9; /* sorted */
			}
			for (r = 0; r < reps; r++) {
				size_t l = strlen(from);

				snprintf(from + l, sizeof(from) - l, "%s%s",
					 r ? "," : "", tiers[p][r]);
			}
			snprintf(label, sizeof(label), "%zu MiB", n / MiB);
			printf("%-9s %-11s", p ? "" : label, path_name[p]);
			for (k = 0; k < NT; k++)
				printf(" %8.2f (%6.1f)", med[p][k], best[p][k]);
			printf("  %s\n", from);
		}
		for (p = P_IOCTL; p <= P_SHARED; p++) {
			printf("%-9s %-11s", "", p == P_IOCTL ? "ioctl/raw" : "shared/raw");
			for (k = 0; k < NT; k++)
				printf(" %8.3f %8s", med[p][k] / med[P_RAW][k], "");
			printf("\n%-9s %-11s", "", p == P_IOCTL ? "ioctl/posix" : "shared/posix");
			for (k = 0; k < NT; k++)
				printf(" %8.2f %8s", med[p][k] / med[P_POSIX][k], "");
			printf("\n");
		}
	}

	latency();
	cascade(maxn, reps, &c0);
	{
		char js[16384];
		ssize_t jn = getxattr(mnt, "user.tierfs.stats", js, sizeof(js) - 1);

		js[jn > 0 ? jn : 0] = '\0';
		printf("shared path: %.0f copies by this process through the shared "
		       "cache%s\n", json_num(js, "\"client_writes\":") +
		       json_num(js, "\"client_reads\":"),
		       json_num(js, "\"client_writes\":") > 0 ? "" :
		       " (the mount has no -o gpu_share: \"shared\" rows are the ioctl's)");
	}

	cuMemHostUnregister(pinned);
	cuMemFree(dsrc);
	cuMemFree(ddst);
	free(pinned);
	free(ref);
	return 0;
}
