/*
 * test_dedup.c - the changed-range sets and the chunk index of
 * tiers/dedup.c under random operations.
 *
 * Range sets: random additions applied to a set and to a bitmap model;
 * after each one the set must be sorted, disjoint, not touching, and cover
 * every byte the model marks (a set squeezed past DSET_MAX may cover more,
 * never less).  Index: random additions, lookups, retirements and
 * in-place changes carried over (chunks of a version changed by an
 * incremental flush) against a model of the newest entry of each hash, in
 * an index small enough to evict; a chunk changed after its entry was
 * added is never found.
 *
 * Usage: test_dedup [seed].  Without one: seed 1 (TIERFS_RANDOM_SEED=1: one
 * from the clock).  The seed is printed; exit 0 pass, 1 fail.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dedup.h"
#define TESTUTIL_XORSHIFT64	/* the generator its printed seeds replay */
#include "testutil.h"

#define SPACE		(1u << 16)	/* bytes the ranges live in */
#define ROUNDS		200

static uint64_t seed;
static int failures;

#define FAIL(...) do { fprintf(stderr, "seed %" PRIu64 ": ", seed); \
		       fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
		       failures++; return; } while (0)

static void check_set(const struct dset *d, const unsigned char *model, bool exact)
{
	static unsigned char got[SPACE];

	memset(got, 0, sizeof(got));
	for (uint32_t i = 0; i < d->n; i++) {
		if (d->r[i].start >= d->r[i].end)
			FAIL("range %u empty", i);
		if (i && d->r[i].start <= d->r[i - 1].end)
			FAIL("ranges %u and %u overlap or touch", i - 1, i);
		for (uint64_t b = d->r[i].start; b < d->r[i].end && b < SPACE; b++)
			got[b] = 1;
	}
	for (uint32_t b = 0; b < SPACE; b++) {
		if (model[b] && !got[b])
			FAIL("byte %u changed but not in the set", b);
		if (exact && got[b] && !model[b])
			FAIL("byte %u in the set but not changed", b);
	}
	if (dset_bytes(d) > SPACE)
		FAIL("set covers %" PRIu64 " bytes", dset_bytes(d));
}

static void test_sets(void)
{
	static unsigned char model[SPACE];

	for (int round = 0; round < ROUNDS; round++) {
		struct dset d = { 0 };
		int ops = 1 + (int)(rnd() % 300);
		bool squeezed = false;

		memset(model, 0, sizeof(model));
		for (int i = 0; i < ops; i++) {
			uint64_t a = rnd() % SPACE, len = 1 + rnd() % (rnd() % 4 ? 64 : 4096);
			uint64_t b = a + len > SPACE ? SPACE : a + len;

			if (dset_add(&d, a, b))
				FAIL("dset_add: no memory");
			memset(model + a, 1, b - a);
		}
		squeezed = d.n == DSET_MAX;
		check_set(&d, model, !squeezed);
		if (round % 50 == 0) {
			dset_clear(&d);
			if (d.n)
				FAIL("dset_clear left %u ranges", d.n);
		}
		dset_free(&d);
	}
	/* past DSET_MAX: squeezed, still covering everything */
	struct dset d = { 0 };
	for (uint32_t i = 0; i < DSET_MAX + 100; i++)
		dset_add(&d, (uint64_t)i * 10 + (i % 3), (uint64_t)i * 10 + 5);
	if (d.n > DSET_MAX)
		FAIL("%u ranges, more than DSET_MAX", d.n);
	for (uint32_t i = 0; i < DSET_MAX + 100; i++) {
		uint64_t a = (uint64_t)i * 10 + (i % 3);
		bool in = false;

		for (uint32_t j = 0; j < d.n && !in; j++)
			in = d.r[j].start <= a && a + 1 <= d.r[j].end;
		if (!in)
			FAIL("range %u lost by the squeeze", i);
	}
	dset_free(&d);
}

#define NSRC	8
#define NHASH	64

/* versions whose last reference went: freed at the end (the model may
 * still point at them) */
static struct dd_src **grave;
static size_t ngrave;

static void bury(struct dd_src *v)
{
	struct dd_src **g = realloc(grave, (ngrave + 1) * sizeof(*g));

	if (!g) {
		perror("realloc");
		exit(1);
	}
	grave = g;
	grave[ngrave++] = v;
}

#define NOFF	1000	/* chunks of a version (chunk size 1) */

/* a version, and when each of its chunks last changed in place */
struct tsrc {
	struct dd_src v;
	uint64_t changed[NOFF];
};

static struct dd_src *new_src(uint32_t uid)
{
	struct tsrc *t = calloc(1, sizeof(*t));

	if (!t) {
		perror("calloc");
		exit(1);
	}
	t->v.uid = uid;
	t->v.refs = 1;		/* the owner's, until retired */
	t->v.chunk = 1;
	t->v.nchunks = NOFF;
	return &t->v;
}

/* An incremental flush of v's file changed chunks [a, a + n) at time when. */
static void carry(struct dd_src *v, uint64_t a, uint64_t n, uint64_t when)
{
	struct tsrc *t = (struct tsrc *)v;

	if (!v->cgen && !(v->cgen = calloc(NOFF, sizeof(*v->cgen)))) {
		perror("calloc");
		exit(1);
	}
	v->epoch++;
	for (uint64_t k = a; k < a + n && k < NOFF; k++) {
		v->cgen[k] = v->epoch;
		t->changed[k] = when;
	}
}

static void free_src(struct dd_src *v)
{
	free(v->cgen);
	free(v);
}

static void test_index(void)
{
	struct dd_index x;
	struct dd_src *cur[NSRC];
	/* model: the newest (version, off) of each (hash, uid), and when */
	struct { struct dd_src *v; uint64_t off, when; } model[NHASH][2];
	uint64_t when = 0, retired = 0, carried = 0;
	uint64_t *added;	/* per ring slot: when its entry was added */
	uint32_t cap;

	if (dd_index_init(&x, 100 * (sizeof(struct dd_ent) + 8)))
		FAIL("dd_index_init");
	cap = x.cap;
	if (cap < 16 || cap > 1024)
		FAIL("index of %u entries", cap);
	added = calloc(cap, sizeof(*added));
	if (!added) {
		perror("calloc");
		exit(1);
	}
	for (int i = 0; i < NSRC; i++)
		cur[i] = new_src((uint32_t)i % 2);
	memset(model, 0, sizeof(model));
	for (int op = 0; op < 50000; op++) {
		int s = (int)(rnd() % NSRC), h = (int)(rnd() % NHASH);
		struct dd_hash hh = { .lo = (uint64_t)h * 0x9e3779b97f4a7c15ull, .hi = (uint64_t)h };

		if (rnd() % 40 == 0) {		/* the version goes; a new one */
			struct dd_src *v = cur[s];

			v->retired = true;
			if (--v->refs == 0)
				bury(v);
			cur[s] = new_src((uint32_t)s % 2);
			retired++;
			continue;
		}
		if (rnd() % 20 == 0) {		/* changed in place: carried over */
			uint64_t a = rnd() % NOFF, n = 1 + rnd() % 50;

			when++;
			carry(cur[s], a, n, when);
			carried++;
			for (int k = 0; k < NHASH; k++)	/* the newest may be stale now */
				for (int u = 0; u < 2; u++)
					if (model[k][u].v == cur[s] && model[k][u].off >= a &&
					    model[k][u].off < a + n)
						model[k][u].v = NULL;
			continue;
		}
		if (rnd() % 2) {
			uint64_t off = rnd() % NOFF;
			uint32_t slot = x.head;
			struct dd_src *gone = dd_index_add(&x, &hh, cur[s], off, cur[s]->epoch);

			if (gone && !gone->retired)
				FAIL("a live version was given back");
			if (gone)
				bury(gone);
			when++;
			added[slot] = when;
			model[h][cur[s]->uid].v = cur[s];
			model[h][cur[s]->uid].off = off;
			model[h][cur[s]->uid].when = when;
			continue;
		}
		for (uint32_t u = 0; u < 2; u++) {
			const struct dd_ent *e = dd_index_find(&x, &hh, u);
			/* the newest entry is findable while in the ring and live */
			bool in = model[h][u].when && when - model[h][u].when < cap &&
				  model[h][u].v && !model[h][u].v->retired;

			if (e && (e->src->retired || e->src->uid != u))
				FAIL("found a retired or foreign version");
			if (e && ((struct tsrc *)e->src)->changed[e->off] > added[e - x.ent])
				FAIL("found a chunk that changed after it was indexed");
			if (in && !e)
				FAIL("hash %d uid %u: the newest entry is not found", h, u);
			if (in && e && (e->src != model[h][u].v || e->off != model[h][u].off))
				FAIL("hash %d uid %u: not the newest entry", h, u);
		}
	}
	if (retired < 100 || carried < 100)
		FAIL("only %" PRIu64 " versions retired, %" PRIu64 " carried over", retired,
		     carried);
	/* the end: every version's references come back */
	for (uint32_t i = 0; i < x.count; i++) {
		struct dd_src *v = x.ent[i].src;

		if (v && --v->refs == 0)
			bury(v);
	}
	for (int i = 0; i < NSRC; i++)
		if (--cur[i]->refs == 0)
			free_src(cur[i]);
		else
			FAIL("version %d keeps %u references", i, cur[i]->refs);
	dd_index_free(&x);
	while (ngrave)
		free_src(grave[--ngrave]);
	free(grave);
	free(added);
}

int main(int argc, char **argv)
{
	seed = tu_seed("test_dedup:", argc > 1 ? argv[1] : NULL, NULL, 1, NULL);
	rng_state = seed ? seed : 1;
	test_sets();
	test_index();
	if (failures) {
		printf("test_dedup: %d failures\n", failures);
		return 1;
	}
	printf("test_dedup: ok\n");
	return 0;
}
