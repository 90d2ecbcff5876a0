/*
 * gpu_xxh3.h - the arithmetic of XXH3-128 (seed 0, default secret), shared
 * by the GPU kernel (gpu_hash.cu) and its CPU model (tests/unit/test_xxh3_model.c).
 *
 * Written from the algorithm of xxHash 0.8 (Debian's libxxhash, xxhash.h):
 * the output equals XXH3_128bits(); the test programs check that against
 * the library.  This header holds only the pieces; how a warp walks a chunk
 * is gpu_hash.cu's (and the model's) business.  The parts:
 *
 *   short inputs   xh_short(): 0..240 bytes, one thread (the 0-16, 17-128
 *                  and 129-240 byte paths of xxhash.h).
 *   long inputs    8 64-bit accumulators.  Input is read in 64-byte
 *                  stripes; stripe n of a 1024-byte block adds, to
 *                  accumulator i, lo32(d_i ^ k_{n+i}) * hi32(d_i ^ k_{n+i})
 *                  and d_{i^1} (d: the stripe's 8 words, k: xh_kw, the
 *                  secret as words).  After each full block every
 *                  accumulator is scrambled with words 16..23.  The block
 *                  after the last full one (whatever is left, 1..1024
 *                  bytes) adds its whole stripes but the last byte's, is not
 *                  scrambled, and then the 64 bytes that end the input are
 *                  added once more as a stripe keyed with xh_klast.  Two
 *                  merges (xh_kmlo, xh_kmhi) give the low and high halves.
 *
 * What makes a GPU fast at it: within a block, the additions commute, so
 * the 128 words of a block may be summed in any order and by any number of
 * threads; only the scramble between blocks is sequential.  Accumulators
 * 2p and 2p+1 (a "pair") only ever exchange with each other (i ^ 1), so a
 * thread holding both words of a pair of a stripe updates a pair alone
 * (xh_acc_pair()).
 *
 * The secret's words at unaligned offsets (last stripe, merges) are
 * precomputed below as constants; test_xxh3_model checks every table
 * against XXH3_kSecret.
 *
 * Compiles as CUDA (device functions, tables in __constant__ memory) and as
 * C (static inline host functions, for the model).
 */
#ifndef TIERFS_GPU_XXH3_H
#define TIERFS_GPU_XXH3_H

#include <stdint.h>

#ifdef __CUDACC__
#define XH_FN	static __device__ __forceinline__
#define XH_TAB	static __device__ const
#else
#define XH_FN	static inline
#define XH_TAB	static const
#endif

#define XH_PRIME32_1	0x9E3779B1U
#define XH_PRIME32_2	0x85EBCA77U
#define XH_PRIME32_3	0xC2B2AE3DU
#define XH_PRIME64_1	0x9E3779B185EBCA87ULL
#define XH_PRIME64_2	0xC2B2AE3D27D4EB4FULL
#define XH_PRIME64_3	0x165667B19E3779F9ULL
#define XH_PRIME64_4	0x85EBCA77C2B2AE63ULL
#define XH_PRIME64_5	0x27D4EB2F165667C5ULL

#define XH_STRIPE	64		/* bytes per stripe */
#define XH_BLOCK	1024		/* bytes per block: 16 stripes */
#define XH_MIDSIZE_MAX	240		/* longer inputs take the long path */

/* The default secret (XXH3_kSecret, 192 bytes), for the short paths. */
XH_TAB uint8_t xh_secret[192] = {
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

/* The secret as 24 little-endian words: stripe keys (n + i) and, from
 * word 16, the scramble keys. */
XH_TAB uint64_t xh_kw[24] = {
	0xbe4ba423396cfeb8ULL, 0x1cad21f72c81017cULL,
	0xdb979083e96dd4deULL, 0x1f67b3b7a4a44072ULL,
	0x78e5c0cc4ee679cbULL, 0x2172ffcc7dd05a82ULL,
	0x8e2443f7744608b8ULL, 0x4c263a81e69035e0ULL,
	0xcb00c391bb52283cULL, 0xa32e531b8b65d088ULL,
	0x4ef90da297486471ULL, 0xd8acdea946ef1938ULL,
	0x3f349ce33f76faa8ULL, 0x1d4f0bc7c7bbdcf9ULL,
	0x3159b4cd4be0518aULL, 0x647378d9c97e9fc8ULL,
	0xc3ebd33483acc5eaULL, 0xeb6313faffa081c5ULL,
	0x49daf0b751dd0d17ULL, 0x9e68d429265516d3ULL,
	0xfca1477d58be162bULL, 0xce31d07ad1b8f88fULL,
	0x280416958f3acb45ULL, 0x7e404bbbcafbd7afULL,
};
#define XH_KW_SCRAMBLE	16	/* xh_kw[16 + i] scrambles accumulator i */

/* Words at byte 121 + 8i: the key of the input's last stripe. */
XH_TAB uint64_t xh_klast[8] = {
	0xea647378d9c97e9fULL, 0xc5c3ebd33483acc5ULL,
	0x17eb6313faffa081ULL, 0xd349daf0b751dd0dULL,
	0x2b9e68d429265516ULL, 0x8ffca1477d58be16ULL,
	0x45ce31d07ad1b8f8ULL, 0xaf280416958f3acbULL,
};

/* Words at byte 11 + 8i: the merge into the low half. */
XH_TAB uint64_t xh_kmlo[8] = {
	0x6dd4de1cad21f72cULL, 0xa44072db979083e9ULL,
	0xe679cb1f67b3b7a4ULL, 0xd05a8278e5c0cc4eULL,
	0x4608b82172ffcc7dULL, 0x9035e08e2443f774ULL,
	0x52283c4c263a81e6ULL, 0x65d088cb00c391bbULL,
};

/* Words at byte 117 + 8i (192 - 64 - 11): the merge into the high half. */
XH_TAB uint64_t xh_kmhi[8] = {
	0xd9c97e9fc83159b4ULL, 0x3483acc5ea647378ULL,
	0xfaffa081c5c3ebd3ULL, 0xb751dd0d17eb6313ULL,
	0x29265516d349daf0ULL, 0x7d58be162b9e68d4ULL,
	0x7ad1b8f88ffca147ULL, 0x958f3acb45ce31d0ULL,
};

/* The accumulators' initial values (XXH3_INIT_ACC). */
XH_TAB uint64_t xh_init[8] = {
	XH_PRIME32_3, XH_PRIME64_1, XH_PRIME64_2, XH_PRIME64_3,
	XH_PRIME64_4, XH_PRIME32_2, XH_PRIME64_5, XH_PRIME32_1,
};

struct xh128 {
	uint64_t lo;		/* XXH128_hash_t.low64 */
	uint64_t hi;		/* XXH128_hash_t.high64 */
};

/* ---- scalar helpers ---------------------------------------------------- */

/* Little-endian reads, byte by byte: any alignment, never past p + n. */
XH_FN uint32_t xh_rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

XH_FN uint64_t xh_rd64(const uint8_t *p)
{
	return (uint64_t)xh_rd32(p) | (uint64_t)xh_rd32(p + 4) << 32;
}

XH_FN uint32_t xh_swap32(uint32_t x)
{
#ifdef __CUDACC__
	return __byte_perm(x, 0, 0x0123);
#else
	return __builtin_bswap32(x);
#endif
}

XH_FN uint64_t xh_swap64(uint64_t x)
{
	return (uint64_t)xh_swap32((uint32_t)x) << 32 |
	       xh_swap32((uint32_t)(x >> 32));
}

XH_FN uint32_t xh_rotl32(uint32_t x, int r)
{
	return x << r | x >> (32 - r);
}

XH_FN uint64_t xh_rotl64(uint64_t x, int r)
{
	return x << r | x >> (64 - r);
}

/* The full 128-bit product of two 64-bit words. */
XH_FN struct xh128 xh_mul128(uint64_t a, uint64_t b)
{
	struct xh128 r;

#ifdef __CUDACC__
	r.lo = a * b;
	r.hi = __umul64hi(a, b);
#else
	unsigned __int128 p = (unsigned __int128)a * b;

	r.lo = (uint64_t)p;
	r.hi = (uint64_t)(p >> 64);
#endif
	return r;
}

XH_FN uint64_t xh_mul128_fold64(uint64_t a, uint64_t b)
{
	struct xh128 r = xh_mul128(a, b);

	return r.lo ^ r.hi;
}

/* lo32(x) * hi32(x), the one multiply of the stripe loop. */
XH_FN uint64_t xh_mul32x32(uint64_t x)
{
	return (uint64_t)(uint32_t)x * (uint32_t)(x >> 32);
}

XH_FN uint64_t xh_avalanche(uint64_t h)	/* XXH3_avalanche */
{
	h ^= h >> 37;
	h *= 0x165667919E3779F9ULL;
	return h ^ (h >> 32);
}

XH_FN uint64_t xh64_avalanche(uint64_t h)	/* XXH64_avalanche */
{
	h ^= h >> 33;
	h *= XH_PRIME64_2;
	h ^= h >> 29;
	h *= XH_PRIME64_3;
	return h ^ (h >> 32);
}

/* ---- inputs of 0..240 bytes (one thread) ------------------------------ */

XH_FN struct xh128 xh_len_1to3(const uint8_t *in, uint64_t len)
{
	uint8_t c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
	uint32_t cl = (uint32_t)c1 << 16 | (uint32_t)c2 << 24 |
		      (uint32_t)c3 | (uint32_t)len << 8;
	uint32_t ch = xh_rotl32(xh_swap32(cl), 13);
	uint64_t fl = xh_rd32(xh_secret) ^ xh_rd32(xh_secret + 4);
	uint64_t fh = xh_rd32(xh_secret + 8) ^ xh_rd32(xh_secret + 12);
	struct xh128 h;

	h.lo = xh64_avalanche((uint64_t)cl ^ fl);
	h.hi = xh64_avalanche((uint64_t)ch ^ fh);
	return h;
}

XH_FN struct xh128 xh_len_4to8(const uint8_t *in, uint64_t len)
{
	uint64_t in64 = xh_rd32(in) + ((uint64_t)xh_rd32(in + len - 4) << 32);
	uint64_t flip = xh_rd64(xh_secret + 16) ^ xh_rd64(xh_secret + 24);
	struct xh128 m = xh_mul128(in64 ^ flip, XH_PRIME64_1 + (len << 2));

	m.hi += m.lo << 1;
	m.lo ^= m.hi >> 3;
	m.lo ^= m.lo >> 35;
	m.lo *= 0x9FB21C651E98DF25ULL;
	m.lo ^= m.lo >> 28;
	m.hi = xh_avalanche(m.hi);
	return m;
}

XH_FN struct xh128 xh_len_9to16(const uint8_t *in, uint64_t len)
{
	uint64_t fl = xh_rd64(xh_secret + 32) ^ xh_rd64(xh_secret + 40);
	uint64_t fh = xh_rd64(xh_secret + 48) ^ xh_rd64(xh_secret + 56);
	uint64_t ilo = xh_rd64(in), ihi = xh_rd64(in + len - 8);
	struct xh128 m = xh_mul128(ilo ^ ihi ^ fl, XH_PRIME64_1), h;

	m.lo += (len - 1) << 54;
	ihi ^= fh;
	m.hi += ihi + (uint64_t)(uint32_t)ihi * (XH_PRIME32_2 - 1);
	m.lo ^= xh_swap64(m.hi);
	h = xh_mul128(m.lo, XH_PRIME64_2);
	h.hi += m.hi * XH_PRIME64_2;
	h.lo = xh_avalanche(h.lo);
	h.hi = xh_avalanche(h.hi);
	return h;
}

/* XXH3_mix16B with seed 0. */
XH_FN uint64_t xh_mix16(const uint8_t *in, const uint8_t *sec)
{
	return xh_mul128_fold64(xh_rd64(in) ^ xh_rd64(sec),
				xh_rd64(in + 8) ^ xh_rd64(sec + 8));
}

/* XXH128_mix32B with seed 0. */
XH_FN struct xh128 xh_mix32(struct xh128 acc, const uint8_t *in1,
			    const uint8_t *in2, const uint8_t *sec)
{
	acc.lo += xh_mix16(in1, sec);
	acc.lo ^= xh_rd64(in2) + xh_rd64(in2 + 8);
	acc.hi += xh_mix16(in2, sec + 16);
	acc.hi ^= xh_rd64(in1) + xh_rd64(in1 + 8);
	return acc;
}

/* The common ending of the 17..240 byte paths. */
XH_FN struct xh128 xh_mid_final(struct xh128 acc, uint64_t len)
{
	struct xh128 h;

	h.lo = xh_avalanche(acc.lo + acc.hi);
	h.hi = 0 - xh_avalanche(acc.lo * XH_PRIME64_1 + acc.hi * XH_PRIME64_4 +
				len * XH_PRIME64_2);
	return h;
}

XH_FN struct xh128 xh_len_17to128(const uint8_t *in, uint64_t len)
{
	struct xh128 acc;

	acc.lo = len * XH_PRIME64_1;
	acc.hi = 0;
	if (len > 32) {
		if (len > 64) {
			if (len > 96)
				acc = xh_mix32(acc, in + 48, in + len - 64,
					       xh_secret + 96);
			acc = xh_mix32(acc, in + 32, in + len - 48,
				       xh_secret + 64);
		}
		acc = xh_mix32(acc, in + 16, in + len - 32, xh_secret + 32);
	}
	acc = xh_mix32(acc, in, in + len - 16, xh_secret);
	return xh_mid_final(acc, len);
}

XH_FN struct xh128 xh_len_129to240(const uint8_t *in, uint64_t len)
{
	struct xh128 acc;
	int i, rounds = (int)len / 32;

	acc.lo = len * XH_PRIME64_1;
	acc.hi = 0;
	for (i = 0; i < 4; i++)
		acc = xh_mix32(acc, in + 32 * i, in + 32 * i + 16,
			       xh_secret + 32 * i);
	acc.lo = xh_avalanche(acc.lo);
	acc.hi = xh_avalanche(acc.hi);
	/* XXH3_MIDSIZE_STARTOFFSET 3, from the 5th round on */
	for (i = 4; i < rounds; i++)
		acc = xh_mix32(acc, in + 32 * i, in + 32 * i + 16,
			       xh_secret + 3 + 32 * (i - 4));
	/* XXH3_SECRET_SIZE_MIN 136 - XXH3_MIDSIZE_LASTOFFSET 17 - 16 */
	acc = xh_mix32(acc, in + len - 16, in + len - 32, xh_secret + 103);
	return xh_mid_final(acc, len);
}

/* XXH3_128bits() of len <= 240 bytes at in. */
XH_FN struct xh128 xh_short(const uint8_t *in, uint64_t len)
{
	struct xh128 h;

	if (len > 128)
		return xh_len_129to240(in, len);
	if (len > 16)
		return xh_len_17to128(in, len);
	if (len > 8)
		return xh_len_9to16(in, len);
	if (len >= 4)
		return xh_len_4to8(in, len);
	if (len)
		return xh_len_1to3(in, len);
	h.lo = xh64_avalanche(xh_rd64(xh_secret + 64) ^ xh_rd64(xh_secret + 72));
	h.hi = xh64_avalanche(xh_rd64(xh_secret + 80) ^ xh_rd64(xh_secret + 88));
	return h;
}

/* ---- inputs longer than 240 bytes: the pieces ------------------------- */

/*
 * Add words d0, d1 (accumulators 2p and 2p+1 of one stripe), keyed with
 * k0, k1, to the pair a0, a1: a stripe's contribution to one pair.
 */
XH_FN void xh_acc_pair(uint64_t *a0, uint64_t *a1, uint64_t d0, uint64_t d1,
		       uint64_t k0, uint64_t k1)
{
	*a0 += d1 + xh_mul32x32(d0 ^ k0);
	*a1 += d0 + xh_mul32x32(d1 ^ k1);
}

/* Scramble one accumulator with its key (xh_kw[16 + i]). */
XH_FN uint64_t xh_scramble(uint64_t a, uint64_t k)
{
	a ^= a >> 47;
	a ^= k;
	return a * XH_PRIME32_1;
}

/* One pair's term of a merge (XXH3_mix2Accs). */
XH_FN uint64_t xh_mix2(uint64_t a0, uint64_t a1, uint64_t k0, uint64_t k1)
{
	return xh_mul128_fold64(a0 ^ k0, a1 ^ k1);
}

/* The two merges, given the sums of the four pairs' xh_mix2 terms. */
XH_FN struct xh128 xh_long_final(uint64_t mlo, uint64_t mhi, uint64_t len)
{
	struct xh128 h;

	h.lo = xh_avalanche(len * XH_PRIME64_1 + mlo);
	h.hi = xh_avalanche(~(len * XH_PRIME64_2) + mhi);
	return h;
}

/* XXH128_canonicalFromHash: high half then low half, each big-endian. */
XH_FN void xh_canonical(struct xh128 h, uint8_t out[16])
{
	int i;

	for (i = 0; i < 8; i++) {
		out[i] = (uint8_t)(h.hi >> (56 - 8 * i));
		out[8 + i] = (uint8_t)(h.lo >> (56 - 8 * i));
	}
}

#endif /* TIERFS_GPU_XXH3_H */
