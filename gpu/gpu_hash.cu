/*
 * gpu_hash.cu - XXH3-128 of every fixed-size chunk of a device buffer.
 *
 * The only CUDA kernels of tierfs.  The build compiles this file with nvcc
 * into a fatbin (sm_80 and sm_90 code, compute_90 PTX for later GPUs) and
 * embeds it in the binary as a byte array; gpu_hash.c loads it with
 * cuModuleLoadData and launches the kernels by name through the driver
 * table (gpu_dl.h), so nothing here is linked against the CUDA runtime.
 * The arithmetic is gpu_xxh3.h's; this file decides who reads what.
 *
 * One warp per chunk.  A chunk is a 16-byte-aligned run of `chunk` bytes
 * (a power of two, 4 KiB to 1 MiB; the last chunk of the buffer may be
 * shorter).  Chunks of up to 240 bytes (only ever the last one) take
 * XXH3's short paths in lane 0.  Longer ones are walked 1 KiB block by
 * block, the unit between two scrambles of the accumulators:
 *
 *   - lane t loads bytes [16t, 16t + 16) and [512 + 16t, 512 + 16t + 16)
 *     of the block (two fully coalesced 512-byte warp loads): words
 *     2p, 2p + 1 (p = t & 3) of stripes t >> 2 and 8 + (t >> 2), i.e. one
 *     accumulator pair of two stripes;
 *   - it adds their contributions to its pair (xh_acc_pair), the eight
 *     lanes of a pair sum theirs with three xor-shuffles, and every lane
 *     then holds the block's sum for its pair, adds it to its copy of the
 *     pair's accumulators and scrambles them (all eight lanes the same:
 *     no lane waits for another);
 *   - the block after the last full one has only its whole stripes
 *     counted (the loads of other lanes are masked) and is not scrambled;
 *     the input's last 64 bytes, read early at any alignment, are then
 *     added as the final stripe, and the merges are summed over the four
 *     pairs with two more shuffles.  Lane 0 writes the hash.
 *
 * The loads of the next U blocks are in flight while a block is summed (a
 * ring of registers, U = 4 or 8), so that a warp keeps 4-8 KiB moving:
 * with 1 MiB chunks there are only about eight warps per SM for a GiB.
 * Bulk loads are ld.global.cs (streamed: read once, evicted first).
 *
 * Output: 16 bytes per chunk, XXH128_canonicalFromHash() of the chunk's
 * XXH3_128bits() (high half first, both big-endian), at out + 16 * i.
 *
 * gpu_hash_readbw is not a hash: it reads a buffer once, as fast as the
 * memory allows, and is the roofline the benchmarks compare against.
 */
#include <stdint.h>

#include "gpu_xxh3.h"

#define WARP		32
#define FULL_MASK	0xffffffffu

/* 8 bytes at any address p of device memory, read as the one or two
 * aligned words holding p[0] and p[7] (never a byte past p + 8's word). */
static __device__ __forceinline__ uint64_t ld64_any(const uint8_t *p)
{
	uintptr_t a = (uintptr_t)p;
	const unsigned long long *q =
		(const unsigned long long *)(a & ~(uintptr_t)7);
	unsigned sh = (unsigned)(a & 7) * 8;
	uint64_t lo = __ldg(q);

	if (!sh)
		return lo;
	return lo >> sh | (uint64_t)__ldg(q + 1) << (64 - sh);
}

/* Sum v over the lanes that share t & 3 (xor 4, 8, 16): a pair's lanes. */
static __device__ __forceinline__ uint64_t pair_sum(uint64_t v)
{
	v += __shfl_xor_sync(FULL_MASK, v, 4);
	v += __shfl_xor_sync(FULL_MASK, v, 8);
	v += __shfl_xor_sync(FULL_MASK, v, 16);
	return v;
}

/* Sum v over the four lanes of a quad (xor 1, 2): the four pairs. */
static __device__ __forceinline__ uint64_t quad_sum(uint64_t v)
{
	v += __shfl_xor_sync(FULL_MASK, v, 1);
	v += __shfl_xor_sync(FULL_MASK, v, 2);
	return v;
}

/* Bytes of block b to count: all of a full block, the whole stripes of
 * the one after (tail). */
static __device__ __forceinline__ uint32_t block_lim(uint32_t b, uint32_t nb,
						     uint32_t tail)
{
	return b < nb ? XH_BLOCK : tail;
}

/* Queue lane t's two loads of a block (those inside lim). */
static __device__ __forceinline__ void block_load(ulonglong2 v[2],
						  const uint8_t *at, unsigned t,
						  uint32_t lim)
{
	if (16 * t < lim)
		v[0] = __ldcs((const ulonglong2 *)at);
	if (512 + 16 * t < lim)
		v[1] = __ldcs((const ulonglong2 *)(at + 512));
}

/* Store a hash in canonical form (16-byte aligned out). */
static __device__ __forceinline__ void hash_store(uint8_t *out, struct xh128 h)
{
	ulonglong2 c;

	c.x = xh_swap64(h.hi);
	c.y = xh_swap64(h.lo);
	*(ulonglong2 *)out = c;
}

/*
 * The warp's chunk of n > 240 bytes at base (16-byte aligned); lane t.
 * U: blocks in flight.
 */
template <int U>
static __device__ __forceinline__ void hash_long(const uint8_t *base,
						 uint64_t n, unsigned t,
						 uint8_t *out)
{
	const unsigned p = t & 3, s = t >> 2;
	/* full blocks, then a block of `tail` bytes of whole stripes (n is
	 * at most 1 MiB: 32-bit counts) */
	const uint32_t nb = (uint32_t)(n - 1) / XH_BLOCK, nblk = nb + 1;
	const uint32_t tail = (uint32_t)(n - 1) % XH_BLOCK / XH_STRIPE *
			      XH_STRIPE;
	const uint64_t k00 = xh_kw[s + 2 * p], k01 = xh_kw[s + 2 * p + 1];
	const uint64_t k10 = xh_kw[8 + s + 2 * p], k11 = xh_kw[9 + s + 2 * p];
	const uint64_t ks0 = xh_kw[XH_KW_SCRAMBLE + 2 * p];
	const uint64_t ks1 = xh_kw[XH_KW_SCRAMBLE + 2 * p + 1];
	const uint8_t *lane = base + 16 * t;
	const uint8_t *last = base + n - XH_STRIPE + 16 * p;
	uint64_t a0 = xh_init[2 * p], a1 = xh_init[2 * p + 1];
	uint64_t d0, d1, mlo, mhi;
	ulonglong2 buf[U][2];
	uint32_t b0;
	unsigned j;

	/* the last stripe's two words of this pair, early: off the path */
	d0 = ld64_any(last);
	d1 = ld64_any(last + 8);

#pragma unroll
	for (j = 0; j < U; j++) {
		buf[j][0] = buf[j][1] = make_ulonglong2(0, 0);
		if (j < nblk)
			block_load(buf[j], lane + (uint64_t)j * XH_BLOCK, t,
				   block_lim(j, nb, tail));
	}

	for (b0 = 0; b0 < nblk; b0 += U) {
#pragma unroll
		for (j = 0; j < U; j++) {
			const uint32_t b = b0 + j, bn = b + U;
			ulonglong2 x0, x1;
			uint64_t c0 = 0, c1 = 0;
			uint32_t lim;

			if (b >= nblk)		/* warp-uniform */
				break;
			x0 = buf[j][0];
			x1 = buf[j][1];
			if (bn < nblk)
				block_load(buf[j], lane + (uint64_t)bn * XH_BLOCK, t,
					   block_lim(bn, nb, tail));
			lim = block_lim(b, nb, tail);
			if (16 * t < lim)
				xh_acc_pair(&c0, &c1, x0.x, x0.y, k00, k01);
			if (512 + 16 * t < lim)
				xh_acc_pair(&c0, &c1, x1.x, x1.y, k10, k11);
			a0 += pair_sum(c0);
			a1 += pair_sum(c1);
			if (b < nb) {
				a0 = xh_scramble(a0, ks0);
				a1 = xh_scramble(a1, ks1);
			}
		}
	}

	xh_acc_pair(&a0, &a1, d0, d1, xh_klast[2 * p], xh_klast[2 * p + 1]);
	mlo = quad_sum(xh_mix2(a0, a1, xh_kmlo[2 * p], xh_kmlo[2 * p + 1]));
	mhi = quad_sum(xh_mix2(a0, a1, xh_kmhi[2 * p], xh_kmhi[2 * p + 1]));
	if (t == 0)
		hash_store(out, xh_long_final(mlo, mhi, n));
}

/*
 * Chunk i of [src, src + len) is warp blockIdx.x * (blockDim.x / 32) +
 * threadIdx.x / 32: its hash goes to out + 16 * i.  chunk = 1 << shift.
 */
template <int U>
static __device__ __forceinline__ void hash_chunks(const uint8_t *src,
						   uint64_t len, unsigned shift,
						   uint64_t nchunks,
						   uint8_t *out)
{
	const unsigned t = threadIdx.x % WARP;
	const uint64_t i = (uint64_t)blockIdx.x * (blockDim.x / WARP) +
			   threadIdx.x / WARP;
	const uint8_t *base;
	uint64_t n;

	if (i >= nchunks)
		return;
	base = src + (i << shift);
	n = len - (i << shift);
	if (n > (uint64_t)1 << shift)
		n = (uint64_t)1 << shift;
	if (n <= XH_MIDSIZE_MAX) {
		if (t == 0)
			hash_store(out + 16 * i, xh_short(base, n));
		return;
	}
	hash_long<U>(base, n, t, out + 16 * i);
}

/* The kernels gpu_hash.c launches, by these names. */
extern "C" __global__ void __launch_bounds__(128)
gpu_hash_xxh3_u4(const uint8_t *src, uint64_t len, unsigned shift,
		 uint64_t nchunks, uint8_t *out)
{
	hash_chunks<4>(src, len, shift, nchunks, out);
}

extern "C" __global__ void __launch_bounds__(128)
gpu_hash_xxh3_u8(const uint8_t *src, uint64_t len, unsigned shift,
		 uint64_t nchunks, uint8_t *out)
{
	hash_chunks<8>(src, len, shift, nchunks, out);
}

/*
 * Read n16 16-byte words at src (grid-stride, four loads in flight per
 * thread) and fold them, writing the fold to *sink only if it equals a
 * value it practically never does (so that the loads are not dropped).
 */
extern "C" __global__ void __launch_bounds__(256)
gpu_hash_readbw(const ulonglong2 *src, uint64_t n16, unsigned long long *sink)
{
	const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	unsigned long long f = 0;
	ulonglong2 v0, v1, v2, v3;

	for (; i + 3 * stride < n16; i += 4 * stride) {
		v0 = __ldcs(src + i);
		v1 = __ldcs(src + i + stride);
		v2 = __ldcs(src + i + 2 * stride);
		v3 = __ldcs(src + i + 3 * stride);
		f ^= v0.x ^ v0.y ^ v1.x ^ v1.y ^ v2.x ^ v2.y ^ v3.x ^ v3.y;
	}
	for (; i < n16; i += stride) {
		v0 = __ldcs(src + i);
		f ^= v0.x ^ v0.y;
	}
	if (f == 0x7469657266732121ULL)
		*sink = f;
}
