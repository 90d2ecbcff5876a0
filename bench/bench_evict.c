/*
 * bench_evict.c - time one eviction decision of each policy, and compare
 * the policies' hit rates on a write stream without restore hints.
 *
 * Timing: random allocation tables of 10 to 100000 fragments (about a
 * quarter gaps, copy sizes 1-16 blocks, waits mostly 0 with some flushing
 * copies and a few never-evictable ones, distances small or TIER_FAR; in
 * offset order insertion numbers grow, as after a first fill) and choose()
 * for score, fifo and lru with a need of 32 blocks.  "score/nohint" is
 * score on the same tables as a mount without restore hints sees them once
 * its flushes are done: every distance TIER_FAR and every wait 0 (the
 * never-evictable copies stay): windows with as many copies tie on wait
 * and distance and are told apart by age, score's most expensive path.
 * Prints ns per decision (median and best of 7 batches: the best is the
 * one to trust on a loaded machine) and ns per fragment: flat ns per
 * fragment means linear time (score); fifo and lru sort their candidates
 * and grow by log N.
 *
 * Hit rates: a cache of 1024 blocks takes a stream of 20000 checkpoints
 * (all 8 blocks, or 1-16 blocks), each flushed at once (wait 0), a full
 * cache evicting through the policy; after each write one of the last
 * 256 checkpoints, drawn uniformly, is read (a hit refreshes last_use; a
 * miss is not cached).  Without restore hints every copy is TIER_FAR: a
 * policy that keeps the newest checkpoints hits about as often as the
 * cache holds copies out of 256.  With hints the next 16 or 64 reads are
 * announced before each decision, as a restore queue: a cached copy's
 * distance is the position of its first read there, TIER_FAR when it has
 * none (fifo and lru ignore distances).  Every column replays the same
 * stream (sizes and reads drawn from the seed).
 *
 * Usage: bench_evict [seed].  No assertions on timings: it only reports.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tier.h"

struct bcopy {
	struct copy cp;
	double wait;
	uint64_t dist;
};

static uint64_t rng_state = 0x6a09e667f3bcc909ULL;

static uint64_t rnd(void)
{
	uint64_t x = rng_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545f4914f6cdd1dULL;
}

static uint64_t rnd_below(uint64_t n)
{
	return rnd() % n;
}

static struct evict_cost bench_cost(struct cache *c, struct frag *f,
				     const struct evict_ctx *ctx)
{
	const struct bcopy *b = (const struct bcopy *)
		((const char *)f->copy - offsetof(struct bcopy, cp));
	struct evict_cost k = { b->wait, b->dist };

	(void)c;
	return k;
}

/*
 * A table of exactly n fragments, linked by hand (placing copies one by
 * one with first fit would take O(n^2) to build the large ones).
 */
static struct bcopy *build(struct cache *c, size_t n)
{
	struct bcopy *cps = calloc(n, sizeof(*cps));
	struct frag *prev = NULL;
	uint64_t off = 0;
	bool prev_gap = false;
	size_t k;

	if (!cps)
		return NULL;
	memset(c, 0, sizeof(*c));
	c->name = "bench";
	c->ops = &tier_host_ops;
	c->policy = &evict_score;
	for (k = 0; k < n; k++) {
		struct frag *f = malloc(sizeof(*f));
		bool gap = !prev_gap && rnd_below(4) == 0;

		if (!f)
			exit(1);
		f->prev = prev;
		f->next = NULL;
		f->off = off;
		f->size = (1 + rnd_below(16)) * TIER_ALIGN;
		f->copy = NULL;
		if (prev)
			prev->next = f;
		else
			c->head = f;
		if (gap) {
			c->ngaps++;
		} else {
			struct bcopy *b = &cps[k];
			uint64_t r = rnd_below(100);

			b->cp.cache = c;
			b->cp.frag = f;
			b->cp.state = TS_FLUSHED;
			b->cp.seq = ++c->seq;
			b->cp.last_use = rnd_below(1000000);
			b->wait = r < 70 ? 0 : r < 98 ?
				  (double)rnd_below(1000) / 100 : TIER_INF;
			b->dist = rnd_below(5) == 0 ? TIER_FAR : rnd_below(n);
			f->copy = &b->cp;
			c->used += f->size;
		}
		prev_gap = gap;
		prev = f;
		off += f->size;
		c->nfrags++;
	}
	c->size = c->usable = off;
	return cps;
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

#define BATCHES	7

/* Median and best over BATCHES batches of the mean time of one decision. */
static double time_policy(const struct evict_policy *p, struct cache *c,
			  uint64_t need, size_t n, int *ok, double *best)
{
	struct frag *first, *last;
	double t[BATCHES], wait;
	long reps = (long)(3000000 / n), r;
	int b, ret = 0;

	if (reps < 5)
		reps = 5;
	p->choose(c, need, bench_cost, NULL, &first, &last, &wait);	/* warm up */
	for (b = 0; b < BATCHES; b++) {
		double t0 = now_ns();

		for (r = 0; r < reps; r++)
			ret |= p->choose(c, need, bench_cost, NULL, &first, &last,
					 &wait);
		t[b] = (now_ns() - t0) / (double)reps;
	}
	*ok = ret == 0;
	qsort(t, BATCHES, sizeof(t[0]), cmp_double);
	*best = t[0];
	return t[BATCHES / 2];
}

/* ---- hit rates without restore hints ---------------------------------- */

#define SIM_BLOCKS	1024
#define SIM_WRITES	20000
#define SIM_WINDOW	256		/* reads go to the last SIM_WINDOW */

static void sim_evicted(struct copy *cp)
{
	(void)cp;			/* cp->frag is NULL now: not cached */
}

/*
 * Restore hints for the stream: the queue holds the next `queue` reads
 * (reads[t] .. reads[t + queue - 1]); a cached copy's distance is the
 * position of its first read there, TIER_FAR when it has none.
 */
static void sim_hint(struct bcopy *cps, const long *reads, long t,
		     long queue)
{
	long k;

	for (k = 0; k < t; k++)
		if (cps[k].cp.frag)
			cps[k].dist = TIER_FAR;
	for (k = 0; k < queue && t + k < SIM_WRITES; k++) {
		struct bcopy *b;

		if (reads[t + k] < 0)
			continue;
		b = &cps[reads[t + k]];
		if (b->cp.frag && b->dist == TIER_FAR)
			b->dist = (uint64_t)k;
	}
}

/*
 * The write stream above through policy p; sizes 8 blocks (uniform) or
 * 1-16; with `queue` > 0 the next `queue` reads are announced as restore
 * hints before each decision.  Returns the read hit rate in percent, or
 * -1 on an error.
 */
static double sim_hits(const struct evict_policy *p, bool uniform,
		       long queue, uint64_t seed)
{
	struct bcopy *cps = calloc(SIM_WRITES, sizeof(*cps));
	uint64_t *size = calloc(SIM_WRITES, sizeof(*size));
	long *reads = calloc(SIM_WRITES, sizeof(*reads));
	struct cache c;
	long t, k, hits = 0, reads_n = 0;
	uint64_t tick = 0;

	if (!cps || !size || !reads ||
	    cache_init(&c, "sim", 0, NULL, SIM_BLOCKS * TIER_ALIGN,
		       &tier_host_ops, p)) {
		free(cps);
		free(size);
		free(reads);
		return -1;
	}
	/* the stream first (the same draws as the stream itself made) */
	rng_state = seed;
	for (t = 0; t < SIM_WRITES; t++) {
		size[t] = (uniform ? 8 : 1 + rnd_below(16)) * TIER_ALIGN;
		reads[t] = -1;
		if (t > 0) {
			long back = 1 + (long)rnd_below(SIM_WINDOW);

			reads[t] = t >= back ? t - back : 0;
		}
	}
	for (t = 0; t < SIM_WRITES; t++) {
		struct bcopy *b = &cps[t];

		b->wait = 0;
		b->dist = TIER_FAR;
		while (cache_place(&c, &b->cp, size[t])) {
			struct frag *first, *last;
			double wait;

			if (queue > 0)
				sim_hint(cps, reads, t, queue);
			if (p->choose(&c, size[t], bench_cost, NULL, &first,
				      &last, &wait)) {
				t = -1;
				goto out;
			}
			cache_evict_window(&c, first, last, sim_evicted);
		}
		b->cp.state = TS_FLUSHED;
		b->cp.last_use = ++tick;
		if (reads[t] >= 0) {
			struct bcopy *r = &cps[reads[t]];

			reads_n++;
			if (r->cp.frag) {
				hits++;
				r->cp.last_use = ++tick;
			}
		}
	}
out:
	for (k = 0; k < SIM_WRITES; k++)
		if (cps[k].cp.frag)
			cache_release(&c, &cps[k].cp);
	cache_destroy(&c);
	free(cps);
	free(size);
	free(reads);
	return t < 0 ? -1 : 100.0 * (double)hits / (double)reads_n;
}

int main(int argc, char **argv)
{
	static const size_t sizes[] = { 10, 100, 1000, 10000, 100000 };
	static const struct evict_policy *const pols[] = {
		&evict_score, &evict_score, &evict_fifo, &evict_lru,
	};
	static const char *const names[] = {
		"score", "score/nohint", "fifo", "lru",
	};
	uint64_t need = 32 * TIER_ALIGN, seed = rng_state;
	size_t s, p;

	if (argc > 1)
		seed = rng_state = strtoull(argv[1], NULL, 0) | 1;
	printf("bench_evict: need %" PRIu64 " blocks, median and best of %d "
	       "batches\n\n", need / TIER_ALIGN, BATCHES);
	printf("%-12s %9s %12s %12s %12s\n", "policy", "fragments",
	       "ns/decision", "best ns", "ns/fragment");
	for (p = 0; p < sizeof(pols) / sizeof(pols[0]); p++) {
		for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			struct cache c;
			struct bcopy *cps = build(&c, sizes[s]);
			double ns, best;
			int ok;
			size_t k;

			if (!cps || cache_check(&c)) {
				fprintf(stderr, "bench_evict: bad table\n");
				return 1;
			}
			if (p == 1) {		/* score/nohint */
				for (k = 0; k < sizes[s]; k++) {
					cps[k].dist = TIER_FAR;
					if (cps[k].wait < TIER_INF)
						cps[k].wait = 0;
				}
			}
			ns = time_policy(pols[p], &c, need, sizes[s], &ok,
					 &best);
			printf("%-12s %9zu %12.0f %12.0f %12.2f%s\n", names[p],
			       sizes[s], ns, best, ns / (double)sizes[s],
			       ok ? "" : "  (some -ENOSPC)");
			for (k = 0; k < sizes[s]; k++)
				if (cps[k].cp.frag)
					cache_release(&c, &cps[k].cp);
			cache_destroy(&c);
			free(cps);
		}
	}

	printf("\nread hits in percent: %d-block cache, %d writes, each "
	       "followed by a read of\none of the last %d checkpoints; "
	       "hints: none, or the next 16 or 64 reads\nannounced as "
	       "restore hints before each decision (fifo and lru ignore "
	       "them)\n\n", SIM_BLOCKS, SIM_WRITES, SIM_WINDOW);
	printf("%-12s %20s %20s\n", "", "8 blocks each", "1-16 blocks");
	printf("%-12s %6s %6s %6s %6s %6s %6s\n", "policy", "none", "16",
	       "64", "none", "16", "64");
	for (p = 0; p < sizeof(pols) / sizeof(pols[0]); p++) {
		static const long queues[] = { 0, 16, 64 };
		double v[6];
		int u, q;

		if (p == 1)
			continue;
		for (u = 0; u < 2; u++) {
			for (q = 0; q < 3; q++) {
				v[u * 3 + q] = sim_hits(pols[p], u == 0,
							queues[q], seed);
				if (v[u * 3 + q] < 0) {
					fprintf(stderr, "bench_evict: %s: "
						"simulation failed\n",
						names[p]);
					return 1;
				}
			}
		}
		printf("%-12s %6.1f %6.1f %6.1f %6.1f %6.1f %6.1f\n",
		       names[p], v[0], v[1], v[2], v[3], v[4], v[5]);
	}
	return 0;
}
