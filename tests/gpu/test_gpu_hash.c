/*
 * test_gpu_hash.c - the GPU chunk hash (gpu_hash_chunks) on a real GPU:
 * every hash against libxxhash's XXH3_128bits() on the host, then its
 * throughput against the host and against plain device memory traffic.
 *
 * Prints PASS/FAIL lines (a FAIL names the first wrong chunk: buffer size,
 * offset, chunk size, kernel, chunk index and length, both hashes) and
 * INFO lines, and exits 0 (all passed), 1 (a check failed) or 77 (no GPU:
 * the hash calls must then fail cleanly with -ENODEV).
 *
 *   sizes        random data of 1, 15, 16, 17, 128, 129, 240, 241, 1000,
 *                4096, 4097, 1 MiB + 3 and 256 MiB bytes, at 16-byte
 *                aligned offsets 0, 16, 48, 4096 in turn, in a VMM range
 *                (gpu_vmm_create: the memory of the GPU cache), hashed in
 *                chunks of 4 KiB .. 1 MiB with each kernel: the default
 *                (gpu_hash_chunks, hashes to host memory) and both ring
 *                depths (gpu_hash_chunks_dev, U4 and U8);
 *   lengths      every length 1..4200 (chunk 4 KiB: every short path and
 *                every tail of a first and second chunk), 200 random
 *                lengths, chunk sizes, offsets and kernels;
 *   data         all-zero and all-ones buffers;
 *   arguments    misaligned source or destination, chunk sizes that are
 *                not powers of two or out of range, len 0;
 *   1 GiB        hashed at each chunk size, every hash checked.
 *
 * Throughput (INFO, never a check): for 1 GiB of random data in the VMM
 * range, GB/s of each kernel at each chunk size (median of 9 timed runs
 * after a warm-up, host clock around the synchronous call: each run
 * includes one launch and one stream synchronisation, a few microseconds),
 * of gpu_hash_chunks() with the hashes copied to pageable host memory,
 * and of XXH3_128bits() on one host thread over the same data; and two
 * baselines of the same 1 GiB: a read-only kernel (gpu_hash_readbw: the
 * memory's read roofline; a hash can at best match it) and cuMemcpyDtoD
 * (gpu_copy_dtod: reads and writes each byte, so its GB/s counts half
 * the traffic).
 *
 * Usage: test_gpu_hash [seed].  Environment: TIERFS_GPU_DEV (device,
 * default 0), TIERFS_HASH_SEED (the seed, if no argument; default 1,
 * TIERFS_RANDOM_SEED=1: one from the clock; printed either way), TIERFS_HASH_REPS (timed runs, 9),
 * TIERFS_HASH_BENCH_MIB (benchmark size, default 1024, at least 256).
 *
 * Built by `make check` (CUDA build with libxxhash-dev); libxxhash is
 * linked statically, libcuda is loaded at run time (gpu/gpu_dl.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <xxhash.h>

#include "gpu.h"
#include "gpu_dl.h"
#include "../unit/testutil.h"

#define KiB		((uint64_t)1 << 10)
#define MiB		((uint64_t)1 << 20)
#define GiB		((uint64_t)1 << 30)
#define BIG		T.big		/* benchmark size, >= 256 MiB */
#define PAD		(8 * KiB)	/* room for offsets past BIG */
#define MAX_HASHES	(BIG / GPU_HASH_CHUNK_MIN)

typedef uint8_t hash_t[GPU_HASH_SIZE];


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

static void hex(const uint8_t h[GPU_HASH_SIZE], char out[33])
{
	int i;

	for (i = 0; i < GPU_HASH_SIZE; i++)
		sprintf(out + 2 * i, "%02x", h[i]);
}

/* The reference: XXH3_128bits of each chunk, canonical form. */
static void ref_hashes(const uint8_t *p, uint64_t len, uint64_t chunk,
		       hash_t *out)
{
	XXH128_canonical_t c;
	uint64_t off, i = 0;

	for (off = 0; off < len; off += chunk, i++) {
		XXH128_canonicalFromHash(&c, XXH3_128bits(p + off,
			len - off < chunk ? len - off : chunk));
		memcpy(out[i], c.digest, GPU_HASH_SIZE);
	}
}

/* ---- the kernels under test ------------------------------------------ */

enum kern { K_AUTO_HOST, K_U4, K_U8, K_COUNT };

static const char *const kern_names[K_COUNT] = {
	[K_AUTO_HOST] = "gpu_hash_chunks",
	[K_U4] = "U4 (dev)",
	[K_U8] = "U8 (dev)",
};

static struct {
	uint64_t big;		/* benchmark bytes (TIERFS_HASH_BENCH_MIB) */
	uint64_t vbase;		/* VMM range: the data */
	uint64_t dhash;		/* device hashes, MAX_HASHES * 16 bytes */
	uint64_t dcopy;		/* cuMemAlloc'ed BIG + PAD: copy target */
	uint8_t *host;		/* host copy of the data, BIG + PAD */
	hash_t *want, *got;	/* MAX_HASHES each */
} T;

/* Hash [src, src + len) in chunks with kernel k into T.got; 0 or -errno. */
static int run_kern(enum kern k, uint64_t src, uint64_t len, uint64_t chunk)
{
	uint64_t n = (len + chunk - 1) / chunk;
	int ret;

	if (k == K_AUTO_HOST)
		return gpu_hash_chunks(src, len, chunk, T.got);
	ret = gpu_hash_chunks_dev(src, len, chunk, T.dhash,
				  k == K_U4 ? GPU_HASH_VARIANT_U4
					    : GPU_HASH_VARIANT_U8);
	if (ret)
		return ret;
	return gpu_copy_dtoh(T.got, T.dhash, n * GPU_HASH_SIZE);
}

/*
 * Hash host bytes [off, off + len) of T.host (also at T.vbase + off) with
 * kernel k; compare with the reference.  Returns true when all match;
 * otherwise describes the first mismatch in why (or the call's error).
 */
static bool hash_matches(enum kern k, uint64_t off, uint64_t len,
			 uint64_t chunk, bool want_ready, char *why,
			 size_t whylen)
{
	uint64_t n = (len + chunk - 1) / chunk, i;
	char g[33], w[33];
	int ret;

	if (!want_ready)
		ref_hashes(T.host + off, len, chunk, T.want);
	memset(T.got, 0xa5, n * GPU_HASH_SIZE);
	ret = run_kern(k, T.vbase + off, len, chunk);
	if (ret) {
		snprintf(why, whylen, "%s: len %" PRIu64 " @+%" PRIu64
			 " chunk %" PRIu64 ": error %d (%s)", kern_names[k],
			 len, off, chunk, ret, strerror(-ret));
		return false;
	}
	for (i = 0; i < n; i++)
		if (memcmp(T.got[i], T.want[i], GPU_HASH_SIZE))
			break;
	if (i == n)
		return true;
	hex(T.got[i], g);
	hex(T.want[i], w);
	snprintf(why, whylen, "%s: len %" PRIu64 " @+%" PRIu64 " chunk %"
		 PRIu64 ": chunk %" PRIu64 " of %" PRIu64 " (bytes %" PRIu64
		 "..%" PRIu64 ", %" PRIu64 " long): gpu %s, xxhash %s",
		 kern_names[k], len, off, chunk, i, n, i * chunk,
		 (i + 1) * chunk < len ? (i + 1) * chunk : len,
		 (i + 1) * chunk < len ? chunk : len - i * chunk, g, w);
	return false;
}

/* ---- checks ----------------------------------------------------------- */

static void test_sizes(void)
{
	static const uint64_t sizes[] = { 1, 15, 16, 17, 128, 129, 240, 241,
					  1000, 4096, 4097, MiB + 3,
					  256 * MiB };
	static const uint64_t offs[] = { 0, 16, 48, 4096 };
	uint64_t chunk, off;
	char why[512] = "";
	unsigned nhash;
	size_t i;
	bool ok;
	int k;

	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		off = offs[i % 4];
		ok = true;
		nhash = 0;
		for (chunk = GPU_HASH_CHUNK_MIN;
		     ok && chunk <= GPU_HASH_CHUNK_MAX; chunk <<= 1) {
			ref_hashes(T.host + off, sizes[i], chunk, T.want);
			for (k = 0; ok && k < K_COUNT; k++) {
				ok = hash_matches(k, off, sizes[i], chunk,
						  true, why, sizeof(why));
				nhash += (sizes[i] + chunk - 1) / chunk;
			}
		}
		if (ok)
			check(true, "%" PRIu64 " bytes @+%" PRIu64 ": chunks "
			      "4 KiB..1 MiB x 3 kernels, %u hashes equal XXH3_128bits",
			      sizes[i], off, nhash);
		else
			check(false, "%" PRIu64 " bytes @+%" PRIu64 ": %s",
			      sizes[i], off, why);
	}
}

static void test_lengths(void)
{
	uint64_t len, off, chunk;
	char why[512] = "", first[512] = "";
	int bad = 0, i, k;

	for (len = 1; len <= 4200; len++)
		if (!hash_matches(K_AUTO_HOST, 0, len, 4096, false, why,
				  sizeof(why)) && !bad++)
			memcpy(first, why, sizeof(first));
	check(!bad, "every length 1..4200, chunk 4 KiB: %d wrong%s%s", bad,
	      bad ? ", the first: " : "", first);

	bad = 0;
	first[0] = '\0';
	for (i = 0; i < 200; i++) {
		chunk = GPU_HASH_CHUNK_MIN << (rnd() % 9);
		len = 1 + rnd() % (8 * MiB);
		off = 16 * (rnd() % 256);
		k = (int)(rnd() % K_COUNT);
		if (!hash_matches(k, off, len, chunk, false, why,
				  sizeof(why)) && !bad++)
			memcpy(first, why, sizeof(first));
	}
	check(!bad, "200 random lengths (<= 8 MiB), offsets, chunk sizes, kernels: %d wrong%s%s",
	      bad, bad ? ", the first: " : "", first);
}

/* Constant data, in the copy buffer: zeros then ones, 1 MiB + 5. */
static void test_constant(void)
{
	uint64_t len = MiB + 5, chunk, n, i;
	char why[128] = "";
	int fill, bad = 0, ret, k;

	for (fill = 0; fill <= 0xff; fill += 0xff) {
		memset(T.host, fill, len);
		ret = gpu_copy_htod(T.dcopy, T.host, len);
		if (ret) {
			check(false, "copy of constant data: %d", ret);
			return;
		}
		for (chunk = GPU_HASH_CHUNK_MIN; chunk <= GPU_HASH_CHUNK_MAX;
		     chunk <<= 1) {
			n = (len + chunk - 1) / chunk;
			ref_hashes(T.host, len, chunk, T.want);
			for (k = 0; k < K_COUNT; k++) {
				memset(T.got, 0xa5, n * GPU_HASH_SIZE);
				ret = run_kern(k, T.dcopy, len, chunk);
				for (i = 0; !ret && i < n; i++)
					if (memcmp(T.got[i], T.want[i],
						   GPU_HASH_SIZE))
						break;
				if ((ret || i < n) && !bad++)
					snprintf(why, sizeof(why),
						 "%s, %s, chunk %" PRIu64
						 ": ret %d, chunk %" PRIu64,
						 fill ? "ones" : "zeros",
						 kern_names[k], chunk, ret, i);
			}
		}
	}
	check(!bad, "all-zero and all-ones data, chunks 4 KiB..1 MiB, 3 kernels: %d wrong%s%s",
	      bad, bad ? ": first " : "", why);
}

static void test_args(void)
{
	int r1, r2, r3, r4, r5, r6, r7;

	r1 = gpu_hash_chunks(T.vbase + 8, 8192, 4096, T.got);
	r2 = gpu_hash_chunks(T.vbase, 8192, 2048, T.got);
	r3 = gpu_hash_chunks(T.vbase, 8192, 3 * 4096, T.got);
	r4 = gpu_hash_chunks(T.vbase, 8192, 2 * MiB, T.got);
	r5 = gpu_hash_chunks_dev(T.vbase, 8192, 4096, T.dhash + 8,
				 GPU_HASH_VARIANT_AUTO);
	r6 = gpu_hash_chunks_dev(T.vbase, 8192, 4096, T.dhash, 7);
	memset(T.got, 0xa5, GPU_HASH_SIZE);
	r7 = gpu_hash_chunks(T.vbase, 0, 4096, T.got);
	check(r1 == -EINVAL && r2 == -EINVAL && r3 == -EINVAL &&
	      r4 == -EINVAL && r5 == -EINVAL && r6 == -EINVAL && r7 == 0 &&
	      T.got[0][0] == 0xa5,
	      "arguments: misaligned src %d, chunk 2 KiB %d, 12 KiB %d, 2 MiB %d, "
	      "misaligned dst %d, bad variant %d (all -EINVAL); len 0 = %d, "
	      "nothing written", r1, r2, r3, r4, r5, r6, r7);
}

/* ---- throughput -------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

enum bench_op { OP_HASH, OP_READBW, OP_COPY };

/* Median seconds of reps timed runs (after one warm-up) of one operation
 * on BIG bytes; < 0 on error. */
static double timed(enum bench_op op, enum kern k, uint64_t chunk, int reps)
{
	double t[64], t0;
	int i, ret = 0;

	if (reps > 64)
		reps = 64;
	for (i = -1; i < reps; i++) {
		t0 = now_s();
		switch (op) {
		case OP_HASH:
			ret = k == K_AUTO_HOST
				? gpu_hash_chunks(T.vbase, BIG, chunk, T.got)
				: gpu_hash_chunks_dev(T.vbase, BIG, chunk,
					T.dhash, k == K_U4 ? GPU_HASH_VARIANT_U4
							   : GPU_HASH_VARIANT_U8);
			break;
		case OP_READBW:
			ret = gpu_hash_readbw(T.vbase, BIG);
			break;
		case OP_COPY:
			ret = gpu_copy_dtod(T.dcopy, T.vbase, BIG);
			break;
		}
		if (ret)
			return -1;
		if (i >= 0)
			t[i] = now_s() - t0;
	}
	qsort(t, reps, sizeof(t[0]), cmp_double);
	return t[reps / 2];
}

static double gbs(double secs)
{
	return secs > 0 ? BIG / secs / 1e9 : 0;
}

static void bench(int reps)
{
	double t_read, t_copy, t_host, t_k[K_COUNT], best;
	uint64_t chunk, n, i;
	char why[512];
	int k, bad;

	printf("INFO: throughput over %" PRIu64 " MiB of random data in a VMM range "
	       "(GB/s = 1e9 bytes/s, median of %d runs)\n", BIG / MiB, reps);
	t_read = timed(OP_READBW, 0, 0, reps);
	t_copy = timed(OP_COPY, 0, 0, reps);
	check(t_read > 0 && t_copy > 0,
	      "baselines ran: read-only pass %.1f GB/s, cuMemcpyDtoD %.1f GB/s",
	      gbs(t_read), gbs(t_copy));
	printf("INFO: baseline read-only kernel (gpu_hash_readbw): %8.1f GB/s  "
	       "(the read roofline a hash can reach)\n", gbs(t_read));
	printf("INFO: baseline cuMemcpyDtoD (gpu_copy_dtod):        %8.1f GB/s  "
	       "(copied bytes/s; moves 2 bytes of traffic per byte)\n",
	       gbs(t_copy));
	printf("INFO:\n");
	printf("INFO: %8s %8s | %9s %9s %9s | %9s | %8s %8s %8s\n", "chunk",
	       "hashes", "U4 dev", "U8 dev", "->host", "host 1thr",
	       "best/rd", "best/cp", "best/cpu");
	for (chunk = GPU_HASH_CHUNK_MIN; chunk <= GPU_HASH_CHUNK_MAX;
	     chunk <<= 1) {
		n = BIG / chunk;
		t_host = now_s();
		ref_hashes(T.host, BIG, chunk, T.want);
		t_host = now_s() - t_host;
		bad = 0;
		why[0] = '\0';
		for (k = 0; k < K_COUNT; k++) {
			t_k[k] = timed(OP_HASH, k, chunk, reps);
			if (t_k[k] < 0) {
				bad++;
				snprintf(why, sizeof(why), "%s failed",
					 kern_names[k]);
				continue;
			}
			if (k != K_AUTO_HOST &&
			    gpu_copy_dtoh(T.got, T.dhash, n * GPU_HASH_SIZE))
				bad++;
			for (i = 0; i < n; i++)
				if (memcmp(T.got[i], T.want[i], GPU_HASH_SIZE))
					break;
			if (i < n && !bad++)
				snprintf(why, sizeof(why), "%s: chunk %" PRIu64
					 " differs", kern_names[k], i);
		}
		best = t_k[K_U4] < t_k[K_U8] ? t_k[K_U4] : t_k[K_U8];
		printf("INFO: %6" PRIu64 "Ki %8" PRIu64 " | %9.1f %9.1f %9.1f |"
		       " %9.2f | %8.2f %8.2f %8.0fx\n", chunk / KiB, n,
		       gbs(t_k[K_U4]), gbs(t_k[K_U8]), gbs(t_k[K_AUTO_HOST]),
		       gbs(t_host), t_read / best, t_copy / best,
		       t_host / best);
		check(!bad, "%" PRIu64 " MiB in %" PRIu64 " KiB chunks: all %" PRIu64
		      " hashes of the 3 kernels equal XXH3_128bits%s%s",
		      BIG / MiB, chunk / KiB, n, bad ? ": " : "", why);
	}
	printf("INFO: U4/U8 dev: kernel alone, hashes left in device memory; "
	       "->host: gpu_hash_chunks, hashes copied to pageable host memory "
	       "(what tierfs calls; U8 at 8 KiB chunks, U4 at the others); host 1thr: "
	       "XXH3_128bits on one CPU thread; best/rd, best/cp: the faster "
	       "kernel's GB/s over the read-only pass and over the copy; "
	       "best/cpu: its speed-up over one CPU thread\n");
}

/* ---- main ------------------------------------------------------------- */

int main(int argc, char **argv)
{
	struct gpu_vmm *v = NULL;
	uint64_t seed, free_b = 0, total_b = 0;
	CUdeviceptr d = 0;
	char msg[256], info[256];
	hash_t h1;
	int dev, ret, reps;

	setvbuf(stdout, NULL, _IOLBF, 0);
	dev = (int)env_u64("TIERFS_GPU_DEV", 0);
	seed = tu_seed("INFO: test_gpu_hash:", argc > 1 ? argv[1] : NULL, "TIERFS_HASH_SEED",
		       1, NULL);
	reps = (int)env_u64("TIERFS_HASH_REPS", 9);
	if (reps < 1)
		reps = 1;
	T.big = env_u64("TIERFS_HASH_BENCH_MIB", 1024) * MiB;
	if (T.big < 256 * MiB)
		T.big = 256 * MiB;
	rng_state = seed | 1;
	printf("INFO: test_gpu_hash: XXH3-128 of device chunks against "
	       "libxxhash %u\n", XXH_versionNumber());

	if (!gpu_built()) {
		printf("SKIP: gpu/ built without CUDA\n");
		return 77;
	}
	ret = gpu_init(dev, msg, sizeof(msg));
	if (ret) {
		int r1 = gpu_hash_chunks(0x1000, 4096, 4096, &h1);
		int r2 = gpu_hash_readbw(0x1000, 4096);

		check(r1 == -ENODEV && r2 == -ENODEV,
		      "without a GPU the hash calls fail cleanly: %d %d (want -ENODEV)",
		      r1, r2);
		if (n_failed)
			return 1;
		printf("SKIP: no GPU: gpu_init(%d) = %d: %s\n", dev, ret, msg);
		return 77;
	}
	printf("INFO: %s\n", msg);
	if (!gpu_mem_info(&free_b, &total_b, NULL, 0))
		printf("INFO: device memory %" PRIu64 " of %" PRIu64
		       " MiB free\n", free_b / MiB, total_b / MiB);
	ret = gpu_hash_describe(info, sizeof(info));
	if (!check(ret == 0, "kernels load (cuModuleLoadData of the embedded fatbin): %d%s%s",
		   ret, ret ? "" : ": ", ret ? "" : info))
		return 1;

	ret = gpu_vmm_create(&v, BIG + 2 * MiB, false);
	if (!ret)
		ret = gpu_vmm_wait(v);
	if (!check(ret == 0, "VMM range of %" PRIu64 " MiB mapped: %d",
		   (BIG + 2 * MiB) / MiB, ret))
		goto out;
	T.vbase = gpu_vmm_base(v);
	if (!check(cuMemAlloc(&d, MAX_HASHES * GPU_HASH_SIZE) == CUDA_SUCCESS,
		   "cuMemAlloc of the device hash array"))
		goto out;
	T.dhash = d;
	d = 0;
	if (!check(cuMemAlloc(&d, BIG + PAD) == CUDA_SUCCESS,
		   "cuMemAlloc of the copy buffer (%" PRIu64 " MiB)",
		   (BIG + PAD) / MiB))
		goto out;
	T.dcopy = d;
	T.host = malloc(BIG + PAD);
	T.want = malloc(MAX_HASHES * GPU_HASH_SIZE);
	T.got = malloc(MAX_HASHES * GPU_HASH_SIZE);
	if (!check(T.host && T.want && T.got, "host buffers"))
		goto out;
	fill_random(T.host, BIG + PAD);
	ret = gpu_copy_htod(T.vbase, T.host, BIG + PAD);
	if (!check(ret == 0, "random data copied to the VMM range: %d", ret))
		goto out;

	test_args();
	test_sizes();
	test_lengths();
	bench(reps);
	test_constant();	/* last: it overwrites T.host */

out:
	if (T.dcopy)
		cuMemFree(T.dcopy);
	if (T.dhash)
		cuMemFree(T.dhash);
	if (v)
		gpu_vmm_destroy(v);
	free(T.host);
	free(T.want);
	free(T.got);
	printf("%s: %d checks, %d failed\n", n_failed ? "FAIL" : "PASS",
	       n_checks, n_failed);
	return n_failed ? 1 : 0;
}
