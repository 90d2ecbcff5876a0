/*
 * test_gpu_tier.c - the GPU cache tier of tiers/gpu_tier.c on a real GPU.
 *
 * Without a GPU (or in a build without CUDA) only the parts that need none
 * run: the default-size rule, the stub behaviour of gpu_tier_create()
 * (-ENODEV with a message) and of gpu_tier_pin_host() (-ENODEV); then the
 * test exits 77 (skipped).
 *
 * With a GPU: a 256 MiB tier (level 0, "gpu", not host addressable, usable
 * 0 until mapping starts) is waited for until fully mapped; copies of odd
 * sizes are placed with cache_place() and filled with random host data
 * through c->ops->write, read back with c->ops->read, moved (disjoint and
 * overlapping) with c->ops->move and compared against a host shadow of the
 * whole cache; scattered ranges read out in one batch (read_ranges); copies outside the cache are refused without harming the
 * context; the stats JSON has "mapped" and "device"; the host pinning path
 * (lock file, register, *pinned, unpin) runs on a touched mmap'ed buffer;
 * and a default-size tier is created and destroyed at once (destroy waits
 * for its mapping to end).
 *
 * Usage: test_gpu_tier [seed].  Environment: TIERFS_GPU_DEV (device,
 * default 0), TIERFS_TEST_SEED (the seed, if no argument; default 1,
 * TIERFS_RANDOM_SEED=1: one from the clock; printed either way).
 * Exit 0 pass, 1 fail, 77 skipped (no GPU).
 *
 * Build (not in Makefile.am yet; tests/gpu/run.sh prep does this):
 *   gcc -std=gnu11 -D_GNU_SOURCE -Icommon -Itiers -Igpu tests/unit/test_gpu_tier.c \
 *       tiers/gpu_tier.c libtiers.a libgpucuda.a libcommon.a -ldl -lpthread -luring
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "dedup.h"
#include "engine.h"
#include "gpu.h"
#include "gpu_tier.h"
#include "testutil.h"

#define MiB		((uint64_t)1 << 20)
#define GiB		((uint64_t)1 << 30)
#define TIER_SIZE	(256 * MiB)
#define NCOPIES		12

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int finish(void)
{
	printf("%d checks, %d failed\n", n_checks, n_failed);
	return n_failed ? 1 : 0;
}

/* The default-size rule, pure arithmetic. */
static void test_default_size(void)
{
	check(gpu_tier_default_size(0) == 0, "default size: 0 free -> 0");
	check(gpu_tier_default_size(GiB) == 0, "default size: 1 GiB free -> 0");
	check(gpu_tier_default_size(GiB + 64 * MiB) == 64 * MiB,
	      "default size: 1 GiB + 64 MiB free -> 64 MiB (leaves 1 GiB)");
	check(gpu_tier_default_size(GiB + 63 * MiB) == 0,
	      "default size: 1 GiB + 63 MiB free -> 0");
	check(gpu_tier_default_size(2 * GiB) == GiB,
	      "default size: 2 GiB free -> 1 GiB");
	check(gpu_tier_default_size(80 * GiB + 100 * MiB) == 40 * GiB,
	      "default size: 80 GiB + 100 MiB free -> 40 GiB (64 MiB steps)");
	check(gpu_tier_default_size(3 * GiB / 2) == 512 * MiB,
	      "default size: 1.5 GiB free -> 512 MiB");
}

/* Pinning a touched, mmap'ed buffer through the pin lock. */
static void test_pin(const char *lockpath, bool have_gpu)
{
	uint64_t size = 64 * MiB, pinned = 0;
	volatile uint64_t touched = 0;
	uint8_t *buf;
	int ret;

	buf = mmap(NULL, size, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		check(false, "pin: mmap 64 MiB: %s", strerror(errno));
		return;
	}
	if (!have_gpu) {
		memset(buf, 1, size);
		touched = size;
		ret = gpu_tier_pin_host(buf, size, lockpath, &touched, &pinned);
		check(ret == -ENODEV && pinned == 0,
		      "pin without a GPU: -ENODEV, not pinned (got %d)", ret);
		munmap(buf, size);
		return;
	}
	memset(buf, 1, size / 2);
	touched = size / 2;
	ret = gpu_tier_pin_host(buf, size, lockpath, &touched, &pinned);
	check(ret == -EAGAIN && pinned == 0,
	      "pin half-touched buffer: -EAGAIN, not pinned (got %d)", ret);
	memset(buf + size / 2, 2, size / 2);
	touched = size;
	ret = gpu_tier_pin_host(buf, size, lockpath, &touched, &pinned);
	check(ret == 0 && pinned == 1, "pin touched buffer: 0, *pinned 1 (got %d)",
	      ret);
	check(access(lockpath, F_OK) == 0, "pin lock file %s exists", lockpath);
	if (ret == 0) {
		/* pinned memory works as a copy source */
		check(gpu_host_register(buf, size) == -EEXIST,
		      "pinned buffer is registered (second register: -EEXIST)");
		ret = gpu_tier_unpin_host(buf, &pinned);
		check(ret == 0 && pinned == 0, "unpin: 0, *pinned 0 (got %d)", ret);
		check(gpu_tier_unpin_host(buf, &pinned) == 0,
		      "unpin when not pinned: 0, no call");
	}
	ret = gpu_tier_pin_host(buf, size, NULL, NULL, &pinned);
	check(ret == 0 && pinned == 1, "pin with the default lock %s: 0 (got %d)",
	      gpu_tier_pin_lock_path(), ret);
	if (ret == 0)
		gpu_tier_unpin_host(buf, &pinned);
	munmap(buf, size);
}

/* Copies into a fully mapped tier, against a host shadow. */
static void test_copies(struct cache *c)
{
	static struct copy cps[NCOPIES];
	uint64_t sizes[NCOPIES], bad;
	uint8_t *shadow, *tmp;
	bool ok;
	int i, ret;

	shadow = malloc(c->size);
	tmp = malloc(c->size);
	if (!shadow || !tmp) {
		check(false, "copies: host buffers of %" PRIu64 " bytes", c->size);
		free(shadow);
		free(tmp);
		return;
	}
	fill_random(shadow, c->size);
	ret = c->ops->write(c, 0, shadow, c->size);
	check(ret == 0, "write the whole cache (%" PRIu64 " MiB): %d",
	      c->size >> 20, ret);

	/* place copies of odd sizes, fill them with fresh random data */
	ok = true;
	for (i = 0; i < NCOPIES; i++) {
		sizes[i] = 1 + rnd() % (8 * MiB);
		if (i == 0)
			sizes[i] = 1;
		if (i == 1)
			sizes[i] = 64 * MiB + 12345;	/* across mapping chunks */
		memset(&cps[i], 0, sizeof(cps[i]));
		ret = cache_place(c, &cps[i], sizes[i]);
		if (ret) {
			check(false, "cache_place copy %d (%" PRIu64 " bytes): %d",
			      i, sizes[i], ret);
			ok = false;
			break;
		}
		cps[i].len = sizes[i];
		uint64_t off = cps[i].frag->off;
		fill_random(shadow + off, sizes[i]);
		ret = c->ops->write(c, off, shadow + off, sizes[i]);
		if (ret) {
			check(false, "write copy %d: %d", i, ret);
			ok = false;
		}
	}
	check(ok && cache_check(c) == 0, "%d copies placed and written", i);
	for (int j = 0; j < i; j++) {
		uint64_t off = cps[j].frag->off;

		memset(tmp, 0, sizes[j]);
		ret = c->ops->read(c, off, tmp, sizes[j]);
		if (ret || memcmp(tmp, shadow + off, sizes[j])) {
			check(false, "read back copy %d (%" PRIu64 " bytes at %"
			      PRIu64 "): %d", j, sizes[j], off, ret);
			ok = false;
		}
	}
	check(ok, "copies read back equal");

	/* odd, unaligned offsets and lengths */
	{
		uint64_t off = cps[1].frag->off + 4097, len = 3 * MiB + 7;

		fill_random(shadow + off, len);
		ret = c->ops->write(c, off, shadow + off, len);
		ret = ret ? ret : c->ops->read(c, off - 3, tmp, len + 6);
		check(ret == 0 && !memcmp(tmp, shadow + off - 3, len + 6),
		      "unaligned write/read inside copy 1: %d", ret);
	}

	/* move: copy 2 into a new placement (disjoint) */
	if (i > 2) {
		struct copy mv;

		memset(&mv, 0, sizeof(mv));
		ret = cache_place(c, &mv, sizes[2]);
		if (ret == 0) {
			uint64_t src = cps[2].frag->off, dst = mv.frag->off;

			ret = c->ops->move(c, dst, src, sizes[2]);
			memcpy(shadow + dst, shadow + src, sizes[2]);
			ret = ret ? ret : c->ops->read(c, dst, tmp, sizes[2]);
			check(ret == 0 && !memcmp(tmp, shadow + dst, sizes[2]),
			      "move copy 2 (%" PRIu64 " bytes) %" PRIu64 " -> %"
			      PRIu64 ": %d", sizes[2], src, dst, ret);
			cache_release(c, &cps[2]);
			cps[2] = mv;
			cps[2].frag->copy = &cps[2];
			check(cache_check(c) == 0, "table after the move");
		} else {
			check(false, "place the move target: %d", ret);
		}
	}

	/* overlapping moves inside copy 1 (compaction), both directions */
	{
		uint64_t base = cps[1].frag->off, len = 32 * MiB + 5;

		ret = c->ops->move(c, base + 4096, base, len);
		memmove(shadow + base + 4096, shadow + base, len);
		ret = ret ? ret : c->ops->read(c, base, tmp, len + 4096);
		check(ret == 0 && !memcmp(tmp, shadow + base, len + 4096),
		      "overlapping move up by 4 KiB (%" PRIu64 " bytes): %d",
		      len, ret);
		ret = c->ops->move(c, base + 1000, base + 3 * MiB, len);
		memmove(shadow + base + 1000, shadow + base + 3 * MiB, len);
		ret = ret ? ret : c->ops->read(c, base, tmp, len + 3 * MiB);
		check(ret == 0 && !memcmp(tmp, shadow + base, len + 3 * MiB),
		      "overlapping move down by 3 MiB - 1000: %d", ret);
	}

	/* scattered ranges out in one batch (read_ranges): each lands at its
	 * own offset of dst, the bytes between them untouched; a range past
	 * the end refuses the whole call */
	{
		uint64_t base = 5 * MiB + 4096;
		struct drange r[] = {
			{ 0, 16384 }, { 3 * 16384, 5 * 16384 }, { 100 * 16384 + 7, 100 * 16384 + 7 },
			{ 200 * 16384, 200 * 16384 + 4097 }, { 2 * MiB - 1, 3 * MiB + 12345 },
		};
		uint32_t nr = sizeof(r) / sizeof(r[0]);
		bool same = true;

		memset(tmp, 0xa5, 4 * MiB);
		ret = c->ops->read_ranges ? c->ops->read_ranges(c, base, r, nr, tmp) : -ENOSYS;
		for (uint64_t k = 0, in = 0; ret == 0 && k < 4 * MiB; k++, in = 0) {
			for (uint32_t q = 0; q < nr; q++)
				in |= k >= r[q].start && k < r[q].end;
			same = same && tmp[k] == (in ? shadow[base + k] : 0xa5);
		}
		check(ret == 0 && same, "read_ranges: %u ranges at their offsets (%d)", nr, ret);
		r[nr - 1].end = c->size;
		ret = c->ops->read_ranges(c, base, r, nr, tmp);
		check(ret == -EFAULT, "read_ranges past the end: -EFAULT (got %d)", ret);
		check(c->ops->read_ranges(c, base, r, 0, tmp) == 0, "read_ranges of none: 0");
	}

	/* out of range: refused, and the context still works */
	bad = c->size - 100;
	ret = c->ops->write(c, bad, tmp, 4096);
	check(ret == -EFAULT, "write past the end: -EFAULT (got %d)", ret);
	ret = c->ops->read(c, UINT64_MAX - 10, tmp, 4096);
	check(ret == -EFAULT, "read at a wrapping offset: -EFAULT (got %d)", ret);
	ret = c->ops->move(c, 0, c->size, 1);
	check(ret == -EFAULT, "move from past the end: -EFAULT (got %d)", ret);
	check(c->ops->write(c, 0, tmp, 0) == 0 && c->ops->read(c, 0, tmp, 0) == 0 &&
	      c->ops->move(c, 0, 4096, 0) == 0, "zero-length copies: 0");

	/* no stray writes: the whole cache equals the shadow */
	memset(tmp, 0, c->size);
	ret = c->ops->read(c, 0, tmp, c->size);
	check(ret == 0 && !memcmp(tmp, shadow, c->size),
	      "whole cache equals the host shadow: %d", ret);

	for (int j = 0; j < i; j++)
		cache_release(c, &cps[j]);
	check(cache_check(c) == 0 && c->used == 0 && c->nfrags == 1,
	      "all copies released: one gap");
	free(shadow);
	free(tmp);
}

int main(int argc, char **argv)
{
	const char *s = getenv("TIERFS_GPU_DEV");
	int dev = s ? atoi(s) : 0;
	char msg[256], json[512], dir[] = "/tmp/test_gpu_tier.XXXXXX",
	     lockpath[64];
	struct gpu_tier *g = NULL;
	struct cache *c;
	double t0;
	int ret;

	setvbuf(stdout, NULL, _IOLBF, 0);
	rng_state = tu_seed("test_gpu_tier:", argc > 1 ? argv[1] : NULL, "TIERFS_TEST_SEED",
			    1, NULL);
	if (!rng_state)
		rng_state = 1;
	printf("test_gpu_tier: device %d\n", dev);
	tierfs_log_level = LOG_DEBUG;

	test_default_size();
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(lockpath, sizeof(lockpath), "%s/pin.lock", dir);

	ret = gpu_tier_create(&g, &dev, 1, TIER_SIZE, false, &evict_score, msg, sizeof(msg));
	if (ret == -ENODEV || ret == -EOPNOTSUPP) {
		check(g == NULL && msg[0], "no GPU: gpu_tier_create %d, \"%s\"",
		      ret, msg);
		test_pin(lockpath, false);
		rmdir(dir);
		if (n_failed)
			return finish();
		printf("SKIP: no GPU tier (%s)\n", msg);
		return 77;
	}
	check(ret == 0, "gpu_tier_create(256 MiB): %d \"%s\"", ret, msg);
	if (ret) {
		rmdir(dir);
		return finish();
	}
	c = gpu_tier_cache(g);
	check(c->level == 0 && !strcmp(c->name, "gpu") && !c->host_addressable &&
	      c->ops && c->base, "cache: level 0, \"gpu\", not host addressable");
	check(c->size >= TIER_SIZE && c->size < TIER_SIZE + 64 * MiB,
	      "cache size %" PRIu64 " (256 MiB rounded to the granularity)",
	      c->size);
	check(c->usable <= gpu_tier_mapped(g), "usable %" PRIu64 " starts <= "
	      "mapped %" PRIu64, c->usable, gpu_tier_mapped(g));

	t0 = now_s();
	while (!gpu_tier_fully_mapped(g) && now_s() - t0 < 60) {
		gpu_tier_update_usable(g);
		usleep(1000);
	}
	gpu_tier_update_usable(g);
	check(gpu_tier_fully_mapped(g) && c->usable == c->size &&
	      gpu_tier_mapped(g) >= c->size,
	      "fully mapped in %.3f s, usable %" PRIu64 " == size",
	      now_s() - t0, c->usable);

	ret = gpu_tier_stats_json(g, json, sizeof(json));
	printf("     stats: %s\n", json);
	check(ret > 0 && strstr(json, ",\"mapped\":") && strstr(json, "\"device\":\"") &&
	      strstr(json, "\"fully_mapped\":true"), "stats JSON fragment (%d)", ret);
	check(gpu_tier_stats_json(g, json, 10) == -ERANGE, "stats JSON: -ERANGE "
	      "when short");

	if (c->usable == c->size)
		test_copies(c);
	gpu_tier_destroy(g);
	check(true, "destroyed");

	test_pin(lockpath, true);
	unlink(lockpath);
	rmdir(dir);

	/* the default size, destroyed at once */
	{
		uint64_t free_b = 0, total_b = 0, want;

		gpu_mem_info(&free_b, &total_b, NULL, 0);
		want = gpu_tier_default_size(free_b);
		t0 = now_s();
		ret = gpu_tier_create(&g, &dev, 1, 0, false, &evict_score, msg, sizeof(msg));
		if (want == 0)
			check(ret == -ENOMEM, "default-size tier with %" PRIu64
			      " MiB free: -ENOMEM (got %d \"%s\")",
			      free_b >> 20, ret, msg);
		else
			check(ret == 0 && gpu_tier_cache(g)->size >= TIER_ALIGN &&
			      gpu_tier_cache(g)->size <= want + 64 * MiB,
			      "default-size tier: %d \"%s\" (rule: %" PRIu64
			      " MiB of %" PRIu64 " MiB free)", ret, msg,
			      want >> 20, free_b >> 20);
		if (ret == 0) {
			gpu_tier_update_usable(g);
			gpu_tier_destroy(g);
			check(true, "default-size tier destroyed after %.2f s",
			      now_s() - t0);
		}
	}
	return finish();
}
