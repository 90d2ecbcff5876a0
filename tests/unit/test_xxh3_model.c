/*
 * test_xxh3_model.c - the GPU chunk hash's algorithm, run on the CPU.
 *
 * gpu/gpu_hash.cu hashes a chunk with a warp: 32 lanes, each holding one
 * accumulator pair of two stripes per 1 KiB block, summed with xor-shuffles,
 * a ring of U blocks of loads in flight.  No GPU is needed to check that
 * this decomposition computes XXH3-128: this program runs the kernel's
 * steps statement by statement for all 32 lanes in lock step (a shuffle
 * reads the other lanes' values as they were before it, as
 * __shfl_xor_sync does), on the arithmetic of gpu/gpu_xxh3.h compiled for
 * the host, and compares with libxxhash's XXH3_128bits():
 *
 *   - the tables of gpu_xxh3.h against the secret bytes;
 *   - every length 0..5200 (short paths, first blocks, every tail shape);
 *   - lengths around block and stripe edges up to 20 blocks, random
 *     lengths up to 1 MiB, all-zero and all-ones inputs;
 *   - whole buffers cut into chunks of 4 KiB .. 1 MiB (the sizes of
 *     tests/gpu/test_gpu_hash), and the canonical byte order;
 *   - the unaligned 8-byte read of the last stripe (aligned words and
 *     shifts, as the kernel does it) at every misalignment.
 *
 * Usage: test_xxh3_model [seed] (or TIERFS_XXH3_SEED; default fixed,
 * TIERFS_RANDOM_SEED=1: one from the clock; printed either way).
 * Prints PASS/FAIL lines; exits 0 or 1.  Runs in any build (no CUDA).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "gpu_xxh3.h"
#include "testutil.h"

#define LANES	32
#define U_MAX	8

/* The kernel's ld64_any(): the aligned words holding p[0] and p[7]. */
static uint64_t ld64_any(const uint8_t *p)
{
	uintptr_t a = (uintptr_t)p;
	const uint64_t *q = (const uint64_t *)(a & ~(uintptr_t)7);
	unsigned sh = (unsigned)(a & 7) * 8;
	uint64_t lo = q[0];

	if (!sh)
		return lo;
	return lo >> sh | q[1] << (64 - sh);
}

struct v16 {
	uint64_t x, y;
};

/* lane t's 16 bytes at `at` (a ulonglong2 load; at is 16-byte aligned). */
static struct v16 ld16(const uint8_t *at)
{
	struct v16 v;

	memcpy(&v, at, 16);
	return v;
}

/* __shfl_xor_sync over all lanes, then add: v[t] += v[t ^ m]. */
static void shfl_xor_add(uint64_t v[LANES], unsigned m)
{
	uint64_t old[LANES];
	unsigned t;

	memcpy(old, v, sizeof(old));
	for (t = 0; t < LANES; t++)
		v[t] = old[t] + old[t ^ m];
}

static uint32_t block_lim(uint32_t b, uint32_t nb, uint32_t tail)
{
	return b < nb ? XH_BLOCK : tail;
}

static void block_load(struct v16 v[2], const uint8_t *at, unsigned t,
		       uint32_t lim)
{
	if (16 * t < lim)
		v[0] = ld16(at);
	if (512 + 16 * t < lim)
		v[1] = ld16(at + 512);
}

/*
 * hash_long<U>() of gpu_hash.cu, each statement over the 32 lanes.  Also
 * checks that the eight lanes of a pair agree after every block.
 */
static struct xh128 model_long(const uint8_t *base, uint64_t n, int U,
			       bool *lanes_agree)
{
	const uint32_t nb = (uint32_t)(n - 1) / XH_BLOCK, nblk = nb + 1;
	const uint32_t tail = (uint32_t)(n - 1) % XH_BLOCK / XH_STRIPE *
			      XH_STRIPE;
	uint64_t a0[LANES], a1[LANES], d0[LANES], d1[LANES];
	uint64_t c0[LANES], c1[LANES], mlo[LANES], mhi[LANES];
	struct v16 buf[LANES][U_MAX][2];
	uint32_t b0, b, bn, lim;
	unsigned t, p, s;
	int j;

	for (t = 0; t < LANES; t++) {
		p = t & 3;
		a0[t] = xh_init[2 * p];
		a1[t] = xh_init[2 * p + 1];
		d0[t] = ld64_any(base + n - XH_STRIPE + 16 * p);
		d1[t] = ld64_any(base + n - XH_STRIPE + 16 * p + 8);
	}
	memset(buf, 0, sizeof(buf));
	for (j = 0; j < U; j++)
		for (t = 0; t < LANES && (uint32_t)j < nblk; t++)
			block_load(buf[t][j], base + 16 * t +
				   (uint64_t)j * XH_BLOCK, t,
				   block_lim(j, nb, tail));

	for (b0 = 0; b0 < nblk; b0 += U) {
		for (j = 0; j < U; j++) {
			b = b0 + j;
			bn = b + U;
			if (b >= nblk)
				break;
			lim = block_lim(b, nb, tail);
			for (t = 0; t < LANES; t++) {
				struct v16 x0 = buf[t][j][0], x1 = buf[t][j][1];

				p = t & 3;
				s = t >> 2;
				if (bn < nblk)
					block_load(buf[t][j], base + 16 * t +
						   (uint64_t)bn * XH_BLOCK, t,
						   block_lim(bn, nb, tail));
				c0[t] = c1[t] = 0;
				if (16 * t < lim)
					xh_acc_pair(&c0[t], &c1[t], x0.x, x0.y,
						    xh_kw[s + 2 * p],
						    xh_kw[s + 2 * p + 1]);
				if (512 + 16 * t < lim)
					xh_acc_pair(&c0[t], &c1[t], x1.x, x1.y,
						    xh_kw[8 + s + 2 * p],
						    xh_kw[9 + s + 2 * p]);
			}
			shfl_xor_add(c0, 4);
			shfl_xor_add(c0, 8);
			shfl_xor_add(c0, 16);
			shfl_xor_add(c1, 4);
			shfl_xor_add(c1, 8);
			shfl_xor_add(c1, 16);
			for (t = 0; t < LANES; t++) {
				p = t & 3;
				a0[t] += c0[t];
				a1[t] += c1[t];
				if (b < nb) {
					a0[t] = xh_scramble(a0[t],
						xh_kw[XH_KW_SCRAMBLE + 2 * p]);
					a1[t] = xh_scramble(a1[t],
						xh_kw[XH_KW_SCRAMBLE + 2 * p + 1]);
				}
				if (a0[t] != a0[p] || a1[t] != a1[p])
					*lanes_agree = false;
			}
		}
	}

	for (t = 0; t < LANES; t++) {
		p = t & 3;
		xh_acc_pair(&a0[t], &a1[t], d0[t], d1[t], xh_klast[2 * p],
			    xh_klast[2 * p + 1]);
		mlo[t] = xh_mix2(a0[t], a1[t], xh_kmlo[2 * p],
				 xh_kmlo[2 * p + 1]);
		mhi[t] = xh_mix2(a0[t], a1[t], xh_kmhi[2 * p],
				 xh_kmhi[2 * p + 1]);
	}
	shfl_xor_add(mlo, 1);
	shfl_xor_add(mlo, 2);
	shfl_xor_add(mhi, 1);
	shfl_xor_add(mhi, 2);
	for (t = 1; t < LANES; t++)
		if (mlo[t] != mlo[0] || mhi[t] != mhi[0])
			*lanes_agree = false;
	return xh_long_final(mlo[0], mhi[0], n);
}

/* The kernel's view of one chunk of n bytes. */
static struct xh128 model_chunk(const uint8_t *base, uint64_t n, int U,
				bool *lanes_agree)
{
	if (n <= XH_MIDSIZE_MAX)
		return xh_short(base, n);
	return model_long(base, n, U, lanes_agree);
}

/* Compare the model (both ring depths) with XXH3_128bits() on n bytes at
 * p; on a mismatch print it (the first few) and return false. */
static bool same(const uint8_t *p, uint64_t n, const char *what)
{
	static int reported;
	XXH128_hash_t r = XXH3_128bits(p, n);
	bool agree = true, ok = true;
	struct xh128 m;
	int U;

	for (U = 4; U <= U_MAX; U += 4) {
		m = model_chunk(p, n, U, &agree);
		if (m.lo != r.low64 || m.hi != r.high64 || !agree) {
			ok = false;
			if (reported++ < 10)
				printf("  mismatch (%s): len %" PRIu64 " U=%d: "
				       "model %016" PRIx64 "%016" PRIx64
				       " xxhash %016llx%016llx%s\n",
				       what, n, U, m.hi, m.lo,
				       (unsigned long long)r.high64,
				       (unsigned long long)r.low64,
				       agree ? "" : " (lanes disagree)");
		}
	}
	return ok;
}

static void check_tables(void)
{
	bool ok = true;
	int i;

	for (i = 0; i < 24; i++)
		ok &= xh_kw[i] == xh_rd64(xh_secret + 8 * i);
	for (i = 0; i < 8; i++) {
		ok &= xh_klast[i] == xh_rd64(xh_secret + 121 + 8 * i);
		ok &= xh_kmlo[i] == xh_rd64(xh_secret + 11 + 8 * i);
		ok &= xh_kmhi[i] == xh_rd64(xh_secret + 117 + 8 * i);
	}
	check(ok, "secret word tables (stripe, last stripe, merges) match the secret's bytes");
}

static void check_ld64_any(const uint8_t *buf)
{
	uint64_t want;
	bool ok = true;
	int off;

	for (off = 0; off < 64; off++) {
		memcpy(&want, buf + off, 8);
		ok &= ld64_any(buf + off) == want;
	}
	check(ok, "unaligned 8-byte read at every misalignment");
}

static void check_lengths(const uint8_t *buf)
{
	uint64_t n, k, m;
	int d, bad = 0, cnt = 0;

	for (n = 0; n <= 5200; n++, cnt++)
		bad += !same(buf, n, "every length");
	check(!bad, "every length 0..5200 (%d lengths, %d wrong)", cnt, bad);

	bad = cnt = 0;
	for (k = 1; k <= 20; k++)
		for (m = 0; m < 16; m++)
			for (d = -1; d <= 1; d++) {
				n = k * XH_BLOCK + m * XH_STRIPE + d;
				bad += !same(buf, n, "edges");
				cnt++;
			}
	check(!bad, "block/stripe edges up to 20 KiB (%d lengths, %d wrong)",
	      cnt, bad);

	bad = 0;
	for (cnt = 0; cnt < 300; cnt++) {
		n = 1 + rnd() % (1 << 20);
		bad += !same(buf + 16 * (rnd() % 64), n, "random");
	}
	check(!bad, "300 random lengths up to 1 MiB at 16-byte offsets (%d wrong)",
	      bad);
}

static void check_constant_data(uint8_t *tmp)
{
	static const uint64_t lens[] = { 1, 3, 4, 8, 9, 16, 17, 128, 129, 240,
					 241, 1024, 1025, 4096, 65536 + 7 };
	int bad = 0, fill;
	size_t i;

	for (fill = 0; fill <= 0xff; fill += 0xff) {
		memset(tmp, fill, 65536 + 64);
		for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
			bad += !same(tmp, lens[i], fill ? "ones" : "zeros");
	}
	check(!bad, "all-zero and all-ones inputs (%d wrong)", bad);
}

static void check_buffers(const uint8_t *buf)
{
	static const uint64_t sizes[] = { 1, 15, 16, 17, 128, 129, 240, 241,
					  1000, 4096, 4097, (1 << 20) + 3,
					  (4 << 20) + 1 };
	uint64_t chunk, off, n;
	uint8_t canon[16];
	XXH128_canonical_t rc;
	XXH128_hash_t r;
	struct xh128 m;
	bool agree = true;
	int bad, canon_bad = 0;
	size_t i;

	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		bad = 0;
		for (chunk = 4096; chunk <= (1 << 20); chunk <<= 1) {
			for (off = 0; off < sizes[i]; off += chunk) {
				n = sizes[i] - off < chunk ? sizes[i] - off
							   : chunk;
				bad += !same(buf + off, n, "buffer");
				/* the canonical form the kernel stores */
				m = model_chunk(buf + off, n, 8, &agree);
				r = XXH3_128bits(buf + off, n);
				xh_canonical(m, canon);
				XXH128_canonicalFromHash(&rc, r);
				canon_bad += memcmp(canon, rc.digest, 16) != 0;
			}
		}
		check(!bad, "buffer of %" PRIu64 " bytes in chunks of 4 KiB..1 MiB (%d wrong)",
		      sizes[i], bad);
	}
	check(!canon_bad, "canonical byte order equals XXH128_canonicalFromHash (%d wrong)",
	      canon_bad);
}

int main(int argc, char **argv)
{
	size_t len = (4 << 20) + 4096;
	uint8_t *buf, *tmp;

	rng_state = tu_seed("test_xxh3_model:", argc > 1 ? argv[1] : NULL, "TIERFS_XXH3_SEED",
			    0x7469657266730001ULL, NULL);
	if (!rng_state)
		rng_state = 1;
	printf("test_xxh3_model: xxhash %u\n", XXH_versionNumber());
	buf = aligned_alloc(64, len);
	tmp = aligned_alloc(64, 65536 + 128);
	if (!buf || !tmp) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	fill_random(buf, len);

	check_tables();
	check_ld64_any(buf);
	check_lengths(buf);
	check_constant_data(tmp);
	check_buffers(buf);

	free(buf);
	free(tmp);
	printf("%d checks, %d failed\n", n_checks, n_failed);
	return n_failed ? 1 : 0;
}
