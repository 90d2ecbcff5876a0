/*
 * test_hash_kernel_cpu.cc - gpu/gpu_hash.cu's kernels, the source itself,
 * run on the CPU, against libxxhash.
 *
 * test_xxh3_model checks the algorithm as re-stated by hand; this program
 * compiles the kernel file unchanged as C++ over a small CUDA shim and runs
 * every warp as 32 coroutines (ucontext) in lock step: each lane runs until
 * its next __shfl_xor_sync, and when all 32 are there the values are
 * exchanged, as the hardware does.  A shuffle that not every lane of the
 * warp reaches, or reaches with another lane mask, is reported as an error
 * (on a GPU it would hang or read garbage).  What this cannot show: the
 * GPU's memory system, the compiler's device code (nvcc, ptxas), timing.
 *
 * Checks, for the ring depths U4 and U8 (gpu_hash_xxh3_u4/_u8), against
 * XXH128_canonicalFromHash(XXH3_128bits()):
 *   - buffers of 1 .. 4200 bytes in steps that hit every short path and
 *     the block/stripe edges, chunk 4 KiB;
 *   - buffers of 1 MiB + 3 and 2 MiB + 4097 bytes at a 16-byte offset,
 *     every chunk size 4 KiB .. 1 MiB;
 *   - all-zero and all-ones data;
 *   - the read-bandwidth kernel runs (no check of its value).
 *
 * Usage: test_hash_kernel_cpu [seed] (the data; default fixed, printed).
 * Prints PASS/FAIL lines, exits 0 or 1.  No CUDA needed.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <xxhash.h>

#include "testutil.h"

/* ---- the CUDA shim ------------------------------------------------------ */

struct emu_dim3 {
	unsigned x, y, z;
};

static struct emu_dim3 emu_thread, emu_block, emu_bdim, emu_gdim;

#define threadIdx	emu_thread
#define blockIdx	emu_block
#define blockDim	emu_bdim
#define gridDim		emu_gdim

#define __CUDACC__	1	/* gpu_xxh3.h: the device branch */
#define __device__
#define __global__
#define __forceinline__	inline
#define __launch_bounds__(n)
#define __constant__

struct ulonglong2 {
	unsigned long long x, y;
};

static inline ulonglong2 make_ulonglong2(unsigned long long x,
					 unsigned long long y)
{
	ulonglong2 v = { x, y };

	return v;
}

static inline unsigned long long __ldg(const unsigned long long *p)
{
	return *p;
}

static inline ulonglong2 __ldcs(const ulonglong2 *p)
{
	return *p;
}

static inline unsigned long long __umul64hi(unsigned long long a,
					    unsigned long long b)
{
	return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

/* __byte_perm(x, 0, s): byte i of the result is byte (s >> 4i) & 7 of
 * {y, x} (only selectors 0..3 are used here). */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
	uint64_t xy = (uint64_t)y << 32 | x;
	unsigned r = 0;
	int i;

	for (i = 0; i < 4; i++)
		r |= (unsigned)((xy >> (8 * ((s >> (4 * i)) & 7))) & 0xff)
		     << (8 * i);
	return r;
}

/* The warp: 32 coroutines, switched at shuffles. */
enum { LANE_RUN, LANE_SHFL, LANE_DONE };

static struct {
	ucontext_t sched;		/* the scheduler's context */
	ucontext_t uc[32];		/* each lane's */
	char *stack[32];
	int state[32];			/* LANE_* */
	unsigned long long val[32];	/* value offered at a shuffle */
	int xmask[32];			/* its lane mask */
	unsigned long long snap[32];	/* the values, once all arrived */
	int cur;			/* running lane */
	unsigned warp0;			/* threadIdx.x of lane 0 */
	void (*body)(void);		/* the kernel call */
	int errors;			/* divergent shuffles seen */
} W;

#define LANE_STACK	(256 * 1024)

static unsigned long long __shfl_xor_sync(unsigned mask,
					  unsigned long long v, int m)
{
	int t = W.cur;

	if (mask != 0xffffffffu)
		W.errors++;
	W.val[t] = v;
	W.xmask[t] = m;
	W.state[t] = LANE_SHFL;
	swapcontext(&W.uc[t], &W.sched);
	return W.snap[t ^ m];
}

static void lane_main(void)
{
	W.body();
	W.state[W.cur] = LANE_DONE;
	/* returns to W.sched through uc_link */
}

/* Run one warp (threads warp0 .. warp0 + 31 of the current block). */
static void run_warp(unsigned warp0)
{
	int t, waiting, done, m;

	W.warp0 = warp0;
	for (t = 0; t < 32; t++) {
		getcontext(&W.uc[t]);
		W.uc[t].uc_stack.ss_sp = W.stack[t];
		W.uc[t].uc_stack.ss_size = LANE_STACK;
		W.uc[t].uc_link = &W.sched;
		makecontext(&W.uc[t], lane_main, 0);
		W.state[t] = LANE_RUN;
	}
	for (;;) {
		for (t = 0; t < 32; t++) {
			if (W.state[t] != LANE_RUN)
				continue;
			W.cur = t;
			emu_thread.x = warp0 + t;
			swapcontext(&W.sched, &W.uc[t]);
		}
		waiting = done = 0;
		m = -1;
		for (t = 0; t < 32; t++) {
			if (W.state[t] == LANE_DONE) {
				done++;
				continue;
			}
			waiting++;
			if (m >= 0 && W.xmask[t] != m)
				W.errors++;	/* lanes at different shuffles */
			m = W.xmask[t];
		}
		if (!waiting)
			return;
		if (done) {
			/* a full-mask shuffle some lanes never reach */
			W.errors++;
			return;
		}
		for (t = 0; t < 32; t++) {
			W.snap[t] = W.val[t];
			W.state[t] = LANE_RUN;
		}
	}
}

/* A launch: every block, every warp in it, one after the other. */
static void launch(unsigned grid, unsigned block, void (*body)(void))
{
	unsigned b, w;

	W.body = body;
	emu_gdim.x = grid;
	emu_bdim.x = block;
	emu_gdim.y = emu_gdim.z = emu_bdim.y = emu_bdim.z = 1;
	for (b = 0; b < grid; b++) {
		emu_block.x = b;
		for (w = 0; w < block; w += 32)
			run_warp(w);
	}
}

/* ---- the kernels, unchanged --------------------------------------------- */

#include "gpu_hash.cu"

#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim

/* ---- the test ------------------------------------------------------------ */

/* The arguments of the launch under way. */
static struct {
	const uint8_t *src;
	uint64_t len, nchunks;
	unsigned shift;
	uint8_t *out;
	int u8;
} L;

static void body_hash(void)
{
	if (L.u8)
		gpu_hash_xxh3_u8(L.src, L.len, L.shift, L.nchunks, L.out);
	else
		gpu_hash_xxh3_u4(L.src, L.len, L.shift, L.nchunks, L.out);
}

/* Hash len bytes at src in chunks of 1 << shift with kernel U4 or U8, as
 * gpu_hash.c launches it (4 warps per block); compare every chunk.  Returns
 * true if all match, else prints the first mismatch. */
static bool kernel_matches(const uint8_t *src, uint64_t len, unsigned shift,
			   int u8, const char *what)
{
	static uint8_t out[4096][16];
	uint64_t chunk = (uint64_t)1 << shift, n = (len + chunk - 1) / chunk;
	XXH128_canonical_t c;
	uint64_t i, off;
	int err0 = W.errors;

	if (n > 4096)
		return false;
	memset(out, 0xa5, n * 16);
	L.src = src;
	L.len = len;
	L.shift = shift;
	L.nchunks = n;
	L.out = &out[0][0];
	L.u8 = u8;
	launch((unsigned)((n + 3) / 4), 128, body_hash);
	if (W.errors != err0) {
		printf("  %s: len %" PRIu64 " chunk %" PRIu64 " U%d: "
		       "divergent shuffle\n", what, len, chunk, u8 ? 8 : 4);
		return false;
	}
	for (i = 0, off = 0; i < n; i++, off += chunk) {
		XXH128_canonicalFromHash(&c, XXH3_128bits(src + off,
			len - off < chunk ? len - off : chunk));
		if (memcmp(out[i], c.digest, 16)) {
			printf("  %s: len %" PRIu64 " chunk %" PRIu64 " U%d: "
			       "chunk %" PRIu64 " differs\n", what, len, chunk,
			       u8 ? 8 : 4, i);
			return false;
		}
	}
	return true;
}

int main(int argc, char **argv)
{
	size_t size = 3 * (1 << 20);
	uint8_t *buf = (uint8_t *)aligned_alloc(256, size);
	unsigned long long sink = 0;
	uint64_t len;
	unsigned shift;
	int bad, cnt, u8, t, fill;

	for (t = 0; t < 32; t++)
		W.stack[t] = (char *)malloc(LANE_STACK);
	if (!buf || !W.stack[31]) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	rng_state = tu_seed("test_hash_kernel_cpu:", argc > 1 ? argv[1] : NULL, NULL,
			    0x7469657266730002ULL, NULL);
	if (!rng_state)
		rng_state = 1;
	for (len = 0; len < size; len += 8) {
		uint64_t v = rnd();

		memcpy(buf + len, &v, 8);
	}
	printf("test_hash_kernel_cpu: gpu/gpu_hash.cu on the CPU, 32 lanes per warp in lock step\n");

	bad = cnt = 0;
	for (len = 1; len <= 4200; len++) {
		/* all up to 300, then each stripe edge +-1 */
		if (len > 300 && (len + 1) % 64 > 2)
			continue;
		for (u8 = 0; u8 <= 1; u8++, cnt++)
			bad += !kernel_matches(buf, len, 12, u8, "lengths");
	}
	check(!bad, "lengths 1..4200 (every one to 300, then around each stripe edge), "
	      "chunk 4 KiB, U4 and U8: %d runs, %d wrong", cnt, bad);

	bad = cnt = 0;
	for (shift = 12; shift <= 20; shift++)
		for (u8 = 0; u8 <= 1; u8++, cnt += 2) {
			bad += !kernel_matches(buf + 16, (1 << 20) + 3, shift,
					       u8, "1 MiB + 3");
			bad += !kernel_matches(buf + 16, (2 << 20) + 4097,
					       shift, u8, "2 MiB + 4097");
		}
	check(!bad, "1 MiB + 3 and 2 MiB + 4097 bytes @+16, chunks 4 KiB..1 MiB, U4 and U8: "
	      "%d runs, %d wrong", cnt, bad);

	bad = cnt = 0;
	for (fill = 0; fill <= 0xff; fill += 0xff) {
		memset(buf, fill, 70000);
		for (u8 = 0; u8 <= 1; u8++, cnt += 2) {
			bad += !kernel_matches(buf, 70000, 12, u8, "constant");
			bad += !kernel_matches(buf, 70000, 16, u8, "constant");
		}
	}
	check(!bad, "all-zero and all-ones data: %d runs, %d wrong", cnt, bad);

	/* readbw: four per thread, then the remainder loop; no shuffles */
	{
		const ulonglong2 *s = (const ulonglong2 *)buf;

		W.body = NULL;
		emu_gdim.x = 2;
		emu_bdim.x = 64;
		for (emu_block.x = 0; emu_block.x < 2; emu_block.x++)
			for (emu_thread.x = 0; emu_thread.x < 64;
			     emu_thread.x++)
				gpu_hash_readbw(s, 1000, &sink);
		check(true, "read-bandwidth kernel ran over 16000 bytes");
	}

	for (t = 0; t < 32; t++)
		free(W.stack[t]);
	free(buf);
	printf("%d checks, %d failed\n", n_checks, n_failed);
	return n_failed ? 1 : 0;
}
