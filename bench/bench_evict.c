/*
 * bench_evict.c - time one eviction decision of each policy.
 *
 * Builds random allocation tables of 10 to 100000 fragments (about a
 * quarter gaps, copy sizes 1-16 blocks, waits mostly 0 with some flushing
 * copies and a few never-evictable ones, distances small or TIER_FAR) and
 * times choose() for score, fifo and lru with a need of 32 blocks.  Prints
 * ns per decision and ns per fragment: flat ns per fragment means linear
 * time (score); fifo and lru sort their candidates and grow by log N.
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

static struct evict_cost bench_cost(struct cache *c, struct frag *f)
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

/* Median over 5 batches of the mean time of one decision. */
static double time_policy(const struct evict_policy *p, struct cache *c,
			  uint64_t need, size_t n, int *ok)
{
	struct frag *first, *last;
	double t[5], wait;
	long reps = (long)(4000000 / n), r;
	int b, ret = 0;

	if (reps < 5)
		reps = 5;
	p->choose(c, need, bench_cost, &first, &last, &wait);	/* warm up */
	for (b = 0; b < 5; b++) {
		double t0 = now_ns();

		for (r = 0; r < reps; r++)
			ret |= p->choose(c, need, bench_cost, &first, &last,
					 &wait);
		t[b] = (now_ns() - t0) / (double)reps;
	}
	*ok = ret == 0;
	qsort(t, 5, sizeof(t[0]), cmp_double);
	return t[2];
}

int main(int argc, char **argv)
{
	static const size_t sizes[] = { 10, 100, 1000, 10000, 100000 };
	static const struct evict_policy *const pols[] = {
		&evict_score, &evict_fifo, &evict_lru,
	};
	uint64_t need = 32 * TIER_ALIGN;
	size_t s, p;

	if (argc > 1)
		rng_state = strtoull(argv[1], NULL, 0) | 1;
	printf("bench_evict: need %" PRIu64 " blocks, median of 5 batches\n\n",
	       need / TIER_ALIGN);
	printf("%-6s %9s %14s %12s\n", "policy", "fragments", "ns/decision",
	       "ns/fragment");
	for (p = 0; p < sizeof(pols) / sizeof(pols[0]); p++) {
		for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			struct cache c;
			struct bcopy *cps = build(&c, sizes[s]);
			double ns;
			int ok;
			size_t k;

			if (!cps || cache_check(&c)) {
				fprintf(stderr, "bench_evict: bad table\n");
				return 1;
			}
			ns = time_policy(pols[p], &c, need, sizes[s], &ok);
			printf("%-6s %9zu %14.0f %12.2f%s\n", pols[p]->name,
			       sizes[s], ns, ns / (double)sizes[s],
			       ok ? "" : "  (some -ENOSPC)");
			for (k = 0; k < sizes[s]; k++)
				if (cps[k].cp.frag)
					cache_release(&c, &cps[k].cp);
			cache_destroy(&c);
			free(cps);
		}
	}
	return 0;
}
