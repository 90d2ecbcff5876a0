/*
 * test_cache.c - the allocation table of tiers/cache.c under random
 * operations.
 *
 * A shadow model (the owner of every TIER_ALIGN block) is kept next to the
 * real table; thousands of random place / release / shrink / grow /
 * evict-window / policy-evict / usable changes are applied to both, and
 * after each one cache_check() must pass and the table must match the
 * model block for block (first fit included).  Also: cache_init edge
 * cases, cache_check catching broken tables, and tier_host_ops.
 *
 * Usage: test_cache [seed].  Without one: a fixed seed (TIERFS_RANDOM_SEED=1:
 * one from the clock).  The seed is printed; exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tier.h"
#include "testutil.h"

#define MAXBLK		512
#define MAXCOPY		256
#define ROUNDS		200
#define OPS		2500

struct tcopy {
	struct copy cp;
	int id;
	bool live;
	double wait;		/* for policy-driven evictions */
};

static uint64_t seed;
static struct cache c;
static struct tcopy copies[MAXCOPY];
static int owner[MAXBLK];		/* copy id per block, -1 free */
static uint64_t nblk;
static int nlive;
static long op_no;
static const char *op_name = "?";
static int evicted_calls;
static long n_placed, n_nospc, n_grown, n_nogrow, n_chosen, n_nochoice;

static void fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "test_cache: FAIL (seed %" PRIu64 ", op %ld %s): ",
		seed, op_no, op_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

#define ENSURE(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)

static struct tcopy *tc_of(struct copy *cp)
{
	return (struct tcopy *)((char *)cp - offsetof(struct tcopy, cp));
}

/* Compare the table with the model, block for block. */
static void check_model(void)
{
	const struct frag *f;
	int ncopies = 0;
	uint64_t b;

	ENSURE(cache_check(&c) == 0, "cache_check");
	for (f = c.head; f; f = f->next) {
		int want = f->copy ? tc_of(f->copy)->id : -1;

		if (f->copy) {
			ncopies++;
			ENSURE(tc_of(f->copy)->live, "dead copy in table");
		}
		for (b = f->off / TIER_ALIGN;
		     b < (f->off + f->size) / TIER_ALIGN; b++)
			ENSURE(owner[b] == want,
			       "block %" PRIu64 ": table says %d, model %d",
			       b, want, owner[b]);
	}
	ENSURE(ncopies == nlive, "%d copies in table, %d live", ncopies, nlive);
}

/* First fit in the model: start block of the first free run that fits. */
static long model_first_fit(uint64_t blocks)
{
	uint64_t usable_blk = c.usable / TIER_ALIGN, b = 0, s, e;

	while (b < nblk) {
		if (owner[b] != -1) {
			b++;
			continue;
		}
		s = b;
		while (b < nblk && owner[b] == -1)
			b++;
		e = b;
		if (e - s >= blocks && s + blocks <= usable_blk)
			return (long)s;
	}
	return -1;
}

static struct tcopy *pick_live(void)
{
	int i, k;

	if (!nlive)
		return NULL;
	k = (int)rnd_below(nlive);
	for (i = 0; i < MAXCOPY; i++)
		if (copies[i].live && k-- == 0)
			return &copies[i];
	return NULL;
}

static struct tcopy *pick_free(void)
{
	int i, k = (int)rnd_below(MAXCOPY);

	for (i = 0; i < MAXCOPY; i++) {
		struct tcopy *t = &copies[(k + i) % MAXCOPY];

		if (!t->live)
			return t;
	}
	return NULL;
}

static void model_set(uint64_t off, uint64_t size, int id)
{
	uint64_t b;

	for (b = off / TIER_ALIGN; b < (off + size) / TIER_ALIGN; b++)
		owner[b] = id;
}

static void op_place(void)
{
	struct tcopy *t = pick_free();
	uint64_t size, blocks;
	long want;
	int ret;

	if (!t)
		return;
	switch (rnd_below(4)) {
	case 0:
		size = rnd_below(3) * TIER_ALIGN;	/* 0 and exact sizes */
		break;
	case 1:
		size = rnd_below(nblk + 2) * TIER_ALIGN + rnd_below(TIER_ALIGN);
		break;
	default:
		size = 1 + rnd_below(24 * TIER_ALIGN);
		break;
	}
	blocks = size ? (size + TIER_ALIGN - 1) / TIER_ALIGN : 1;
	want = model_first_fit(blocks);
	memset(&t->cp, 0, sizeof(t->cp));
	t->cp.len = size;
	ret = cache_place(&c, &t->cp, size);
	if (want < 0) {
		ENSURE(ret == -ENOSPC, "place %" PRIu64 ": got %d, want -ENOSPC",
		       size, ret);
		n_nospc++;
		return;
	}
	ENSURE(ret == 0, "place %" PRIu64 ": got %d, want offset %ld",
	       size, ret, want * (long)TIER_ALIGN);
	ENSURE(t->cp.frag && t->cp.frag->copy == &t->cp && t->cp.cache == &c,
	       "placed copy not linked");
	ENSURE(t->cp.frag->off == (uint64_t)want * TIER_ALIGN,
	       "first fit: at %" PRIu64 ", want %ld", t->cp.frag->off,
	       want * (long)TIER_ALIGN);
	ENSURE(t->cp.frag->size == blocks * TIER_ALIGN, "reservation size");
	ENSURE(t->cp.seq == c.seq, "seq not the latest");
	t->live = true;
	nlive++;
	n_placed++;
	model_set(t->cp.frag->off, t->cp.frag->size, t->id);
	/* to an evictable state, through the life cycle */
	tier_set_state(&t->cp.state, TS_WRITE_IN_PROGRESS);
	tier_set_state(&t->cp.state, TS_WRITE_COMPLETE);
	tier_set_state(&t->cp.state, TS_FLUSHED);
	if (rnd_below(2)) {
		tier_set_state(&t->cp.state, TS_READ_COMPLETE);
		tier_set_state(&t->cp.state, TS_CONSUMED);
	}
}

static void op_release(void)
{
	struct tcopy *t = pick_live();
	uint64_t off, size;

	if (!t)
		return;
	off = t->cp.frag->off;
	size = t->cp.frag->size;
	cache_release(&c, &t->cp);
	ENSURE(t->cp.frag == NULL, "released copy keeps its fragment");
	t->live = false;
	nlive--;
	model_set(off, size, -1);
}

static void op_shrink(void)
{
	struct tcopy *t = pick_live();
	uint64_t lo, cur, size;

	if (!t)
		return;
	cur = t->cp.frag->size;
	lo = t->cp.len ? (t->cp.len + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN
		       : TIER_ALIGN;
	/* sometimes drop len first, as a truncate would */
	if (rnd_below(3) == 0) {
		t->cp.len = rnd_below(t->cp.len + 1);
		lo = t->cp.len ? (t->cp.len + TIER_ALIGN - 1) / TIER_ALIGN *
				 TIER_ALIGN : TIER_ALIGN;
	}
	size = lo + rnd_below(cur - lo + 1);
	if (size > t->cp.len && rnd_below(2))
		size -= rnd_below(TIER_ALIGN);	/* unaligned request */
	if (size < t->cp.len)
		size = t->cp.len;
	cache_shrink(&c, &t->cp, size);
	size = size ? (size + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN
		    : TIER_ALIGN;
	ENSURE(t->cp.frag->size == size, "shrunk to %" PRIu64 ", want %" PRIu64,
	       t->cp.frag->size, size);
	model_set(t->cp.frag->off + size, cur - size, -1);
}

static void op_grow(void)
{
	struct tcopy *t = pick_live();
	uint64_t cur, size, off, b, fb;
	bool fits;
	int ret;

	if (!t)
		return;
	off = t->cp.frag->off;
	cur = t->cp.frag->size;
	size = cur + rnd_below(12 * TIER_ALIGN) - (rnd_below(4) ? 0 : cur / 2);
	if (size == 0)
		size = 1;
	fb = (size + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN;
	fits = true;
	if (fb > cur) {
		if (off + fb > c.usable)
			fits = false;
		for (b = (off + cur) / TIER_ALIGN;
		     fits && b < (off + fb) / TIER_ALIGN; b++)
			if (b >= nblk || owner[b] != -1)
				fits = false;
	}
	ret = cache_grow_inplace(&c, &t->cp, size);
	if (!fits) {
		ENSURE(ret == -ENOSPC, "grow to %" PRIu64 ": got %d", size, ret);
		ENSURE(t->cp.frag->size == cur, "failed grow changed size");
		n_nogrow++;
		return;
	}
	ENSURE(ret == 0, "grow to %" PRIu64 ": got %d", size, ret);
	ENSURE(t->cp.frag->size == (fb > cur ? fb : cur), "grown size");
	ENSURE(t->cp.frag->off == off, "grow moved the copy");
	if (fb > cur)
		model_set(off + cur, fb - cur, t->id);
	n_grown++;
}

static void evicted_cb(struct copy *cp)
{
	struct tcopy *t = tc_of(cp);

	ENSURE(cp->frag == NULL, "evicted copy still has a fragment");
	ENSURE(t->live, "evicted a dead copy");
	/* the table must already be consistent without it */
	ENSURE(cache_check(&c) == 0, "table inconsistent inside evicted()");
	t->live = false;
	nlive--;
	evicted_calls++;
}

/* Evict [first, last] and check the gap returned against the model. */
static void evict_and_check(struct frag *first, struct frag *last)
{
	uint64_t s = first->off, e = last->off + last->size, b, gs, ge;
	int ncp = 0, calls0 = evicted_calls;
	struct frag *f, *g;

	for (f = first;; f = f->next) {
		ncp += f->copy != NULL;
		if (f == last)
			break;
	}
	g = cache_evict_window(&c, first, last, evicted_cb);
	ENSURE(evicted_calls - calls0 == ncp, "evicted() calls %d, want %d",
	       evicted_calls - calls0, ncp);
	ENSURE(c.evictions == 0, "evictions are the caller's to count");
	model_set(s, e - s, -1);
	/* the gap must be the maximal free run around [s, e) */
	gs = s / TIER_ALIGN;
	while (gs > 0 && owner[gs - 1] == -1)
		gs--;
	ge = e / TIER_ALIGN;
	while (ge < nblk && owner[ge] == -1)
		ge++;
	ENSURE(g && !g->copy, "evict_window returned no gap");
	ENSURE(g->off == gs * TIER_ALIGN && g->off + g->size == ge * TIER_ALIGN,
	       "gap [%" PRIu64 ", %" PRIu64 "), want [%" PRIu64 ", %" PRIu64 ")",
	       g->off, g->off + g->size, gs * TIER_ALIGN, ge * TIER_ALIGN);
	for (b = gs; b < ge; b++)
		ENSURE(owner[b] == -1, "model");
}

static void op_evict_random(void)
{
	struct frag *first = c.head, *last;
	uint64_t k = rnd_below(c.nfrags), len;

	while (k--)
		first = first->next;
	len = rnd_below(5);
	for (last = first; len-- && last->next; )
		last = last->next;
	evict_and_check(first, last);
}

static struct evict_cost tc_cost(struct cache *cc, struct frag *f,
				     const struct evict_ctx *ctx)
{
	struct evict_cost k = { 0, 0 };

	(void)cc;
	if (f->copy) {
		k.wait = tc_of(f->copy)->wait;
		k.dist = (uint64_t)tc_of(f->copy)->id;
	}
	return k;
}

/* A policy picks a window for `need`; evicting it makes room for need. */
static void op_policy_evict(void)
{
	static const struct evict_policy *const pols[] = {
		&evict_score, &evict_fifo, &evict_lru,
	};
	const struct evict_policy *p = pols[rnd_below(3)];
	struct frag *first = NULL, *last = NULL;
	uint64_t need = 1 + rnd_below(c.usable ? c.usable : 1);
	struct tcopy *t;
	double w;
	int i, ret;

	for (i = 0; i < MAXCOPY; i++) {
		copies[i].wait = rnd_below(4) ? 0 : (rnd_below(5) ? 1.5 : TIER_INF);
		copies[i].cp.last_use = rnd_below(1000);
	}
	op_name = p->name;
	ret = p->choose(&c, need, tc_cost, NULL, &first, &last, &w);
	ENSURE(cache_check(&c) == 0, "policy changed the table");
	if (ret == -ENOSPC) {
		n_nochoice++;
		return;
	}
	ENSURE(ret == 0, "choose: %d", ret);
	n_chosen++;
	evict_and_check(first, last);
	check_model();
	t = pick_free();
	if (!t)
		return;
	memset(&t->cp, 0, sizeof(t->cp));
	t->cp.len = need;
	ret = cache_place(&c, &t->cp, need);
	ENSURE(ret == 0, "no room for %" PRIu64 " after the %s eviction",
	       need, p->name);
	t->live = true;
	nlive++;
	model_set(t->cp.frag->off, t->cp.frag->size, t->id);
	tier_set_state(&t->cp.state, TS_READ_IN_PROGRESS);
	tier_set_state(&t->cp.state, TS_READ_COMPLETE);
	tier_set_state(&t->cp.state, TS_CONSUMED);
}

static void op_usable(void)
{
	if (rnd_below(3))
		c.usable = c.size;
	else
		c.usable = rnd_below(nblk + 1) * TIER_ALIGN;
}

static void run_round(void)
{
	int i, o;

	nblk = 1 + rnd_below(MAXBLK);
	ENSURE(cache_init(&c, "test", 1, NULL, nblk * TIER_ALIGN +
			  rnd_below(TIER_ALIGN), &tier_host_ops,
			  &evict_score) == 0, "cache_init");
	ENSURE(c.size == nblk * TIER_ALIGN && c.usable == c.size,
	       "init size/usable");
	for (i = 0; i < MAXCOPY; i++) {
		memset(&copies[i], 0, sizeof(copies[i]));
		copies[i].id = i;
	}
	for (i = 0; i < MAXBLK; i++)
		owner[i] = -1;
	nlive = 0;
	check_model();
	for (o = 0; o < OPS; o++, op_no++) {
		unsigned r = (unsigned)rnd_below(100);

		if (r < 40) {
			op_name = "place";
			op_place();
		} else if (r < 60) {
			op_name = "release";
			op_release();
		} else if (r < 70) {
			op_name = "shrink";
			op_shrink();
		} else if (r < 80) {
			op_name = "grow";
			op_grow();
		} else if (r < 88) {
			op_name = "evict";
			op_evict_random();
		} else if (r < 97) {
			op_policy_evict();
		} else {
			op_name = "usable";
			op_usable();
		}
		check_model();
	}
	/* empty it and tear down */
	op_name = "teardown";
	for (i = 0; i < MAXCOPY; i++) {
		if (copies[i].live) {
			cache_release(&c, &copies[i].cp);
			copies[i].live = false;
			nlive--;
		}
	}
	ENSURE(c.nfrags == 1 && c.ngaps == 1 && c.used == 0, "empty table");
	ENSURE(cache_check(&c) == 0, "empty table check");
	cache_destroy(&c);
}

/* cache_check must notice each kind of damage. */
static void test_check_catches(void)
{
	struct tcopy a, b;
	int saved, devnull;
	uint64_t v;

	op_name = "check";
	ENSURE(cache_init(&c, "bad", 0, NULL, 16 * TIER_ALIGN, &tier_host_ops,
			  &evict_score) == 0, "init");
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	ENSURE(cache_place(&c, &a.cp, 2 * TIER_ALIGN) == 0, "place a");
	ENSURE(cache_place(&c, &b.cp, 3 * TIER_ALIGN) == 0, "place b");
	ENSURE(cache_check(&c) == 0, "good table");

	fflush(stderr);
	saved = dup(2);
	devnull = open("/dev/null", O_WRONLY);
	ENSURE(saved >= 0 && devnull >= 0, "redirect stderr");
	dup2(devnull, 2);

	c.nfrags++;
	ENSURE(cache_check(&c) == -EUCLEAN, "nfrags");
	c.nfrags--;
	c.ngaps--;
	ENSURE(cache_check(&c) == -EUCLEAN, "ngaps");
	c.ngaps++;
	c.used += TIER_ALIGN;
	ENSURE(cache_check(&c) == -EUCLEAN, "used");
	c.used -= TIER_ALIGN;
	a.cp.frag->size += TIER_ALIGN;
	ENSURE(cache_check(&c) == -EUCLEAN, "overlap");
	a.cp.frag->size -= TIER_ALIGN;
	v = b.cp.frag->off;
	b.cp.frag->off += 1;
	ENSURE(cache_check(&c) == -EUCLEAN, "misaligned");
	b.cp.frag->off = v;
	b.cp.frag = a.cp.frag;
	ENSURE(cache_check(&c) == -EUCLEAN, "back pointer");
	b.cp.frag = a.cp.frag->next;
	b.cp.cache = NULL;
	ENSURE(cache_check(&c) == -EUCLEAN, "cache pointer");
	b.cp.cache = &c;
	a.cp.frag->copy = NULL;	/* two gaps side by side? no: a gap, b */
	ENSURE(cache_check(&c) == -EUCLEAN, "gap count");
	a.cp.frag->copy = &a.cp;
	c.usable = c.size + TIER_ALIGN;
	ENSURE(cache_check(&c) == -EUCLEAN, "usable");
	c.usable = c.size;
	a.cp.len = 3 * TIER_ALIGN;
	ENSURE(cache_check(&c) == -EUCLEAN, "len past reservation");
	a.cp.len = 0;
	b.cp.frag->prev = NULL;
	ENSURE(cache_check(&c) == -EUCLEAN, "prev link");
	b.cp.frag->prev = a.cp.frag;

	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	close(devnull);

	ENSURE(cache_check(&c) == 0, "repaired table");
	cache_release(&c, &b.cp);
	ENSURE(cache_check(&c) == 0 && c.nfrags == 2, "release b");
	cache_release(&c, &a.cp);
	ENSURE(cache_check(&c) == 0 && c.nfrags == 1, "release a");
	cache_destroy(&c);

	ENSURE(cache_init(&c, "tiny", 0, NULL, TIER_ALIGN - 1, &tier_host_ops,
			  &evict_score) == -EINVAL, "too small");
	ENSURE(cache_init(&c, "odd", 0, NULL, 3 * TIER_ALIGN + 5,
			  &tier_host_ops, NULL) == 0 &&
	       c.size == 3 * TIER_ALIGN, "rounded down");
	ENSURE(cache_place(&c, &a.cp, UINT64_MAX) == -ENOSPC, "huge place");
	ENSURE(cache_place(&c, &a.cp, 4 * TIER_ALIGN) == -ENOSPC, "too big");
	ENSURE(cache_check(&c) == 0, "after failed places");
	cache_destroy(&c);
}

/*
 * cache_place_in (a GPU's part of a cache over several GPUs): random tables
 * of up to 64 blocks, random ranges; a placement lies wholly inside the
 * range, the table stays valid, and -ENOSPC comes exactly when
 * cache_largest_gap_in says no gap inside the range has room.
 */
static void test_place_in(void)
{
	enum { NB = 64, NC = 48 };
	static struct tcopy t[NC];
	int round, i;

	op_name = "place_in";
	for (round = 0; round < 2000; round++) {
		uint64_t usable = (1 + rnd_below(NB)) * TIER_ALIGN;
		int n = 0;

		ENSURE(cache_init(&c, "part", 0, NULL, NB * TIER_ALIGN, &tier_host_ops,
				  &evict_score) == 0, "init");
		c.usable = usable;
		memset(t, 0, sizeof(t));
		/* fill, then punch holes, so the gaps lie anywhere */
		while (n < NC && cache_place(&c, &t[n].cp, (1 + rnd_below(4)) * TIER_ALIGN) == 0)
			n++;
		for (i = 0; i < n; i++)
			if (rnd_below(3) == 0) {
				cache_release(&c, &t[i].cp);
				t[i].cp.frag = NULL;
			}
		ENSURE(cache_check(&c) == 0, "table before");
		for (i = 0; i < 8; i++) {
			struct tcopy x;
			uint64_t lo = rnd_below(NB + 1) * TIER_ALIGN, hi = rnd_below(NB + 1) * TIER_ALIGN;
			uint64_t size = (1 + rnd_below(8)) * TIER_ALIGN;
			uint64_t room = cache_largest_gap_in(&c, lo, hi);
			int ret;

			bool top = rnd_below(2);
			uint64_t at = rnd_below(NB) * TIER_ALIGN;
			bool free_at = at + size <= c.usable;

			memset(&x, 0, sizeof(x));
			ret = cache_place_in(&c, &x.cp, size, lo, hi, top);
			ENSURE((ret == 0) == (room >= size), "placed iff a gap in the range has room");
			ENSURE(cache_check(&c) == 0, "table after");
			if (ret == 0) {
				uint64_t end = x.cp.frag->off + x.cp.frag->size;
				struct frag *nx = x.cp.frag->next;

				ENSURE(x.cp.frag->off >= lo && end <= hi && end <= c.usable,
				       "inside the range");
				/* top: nothing with room above it in the range */
				ENSURE(!top || end == hi || end == c.usable || !nx || nx->copy ||
				       cache_largest_gap_in(&c, end, hi) < size, "top fit is the last");
				cache_release(&c, &x.cp);
				ENSURE(cache_check(&c) == 0, "table after release");
			}
			/* at a given offset: iff [at, at + size) is inside one gap */
			for (struct frag *g = c.head; g && free_at; g = g->next)
				if (g->copy && g->off < at + size && at < g->off + g->size)
					free_at = false;
			memset(&x, 0, sizeof(x));
			ret = cache_place_at(&c, &x.cp, size, at);
			ENSURE((ret == 0) == free_at, "placed at iff free there");
			ENSURE(cache_check(&c) == 0, "table after place_at");
			if (ret == 0) {
				ENSURE(x.cp.frag->off == at && x.cp.frag->size == size, "placed at at");
				cache_release(&c, &x.cp);
				ENSURE(cache_check(&c) == 0, "table after its release");
			}
		}
		for (i = 0; i < n; i++)
			if (t[i].cp.frag)
				cache_release(&c, &t[i].cp);
		cache_destroy(&c);
	}
}

static void test_host_ops(void)
{
	static uint8_t buf[8 * TIER_ALIGN];
	uint8_t in[3 * TIER_ALIGN], out[3 * TIER_ALIGN];
	size_t i;

	op_name = "host_ops";
	ENSURE(cache_init(&c, "host", 1, buf, sizeof(buf), &tier_host_ops,
			  &evict_score) == 0, "init");
	for (i = 0; i < sizeof(in); i++)
		in[i] = (uint8_t)(i * 7 + 3);
	ENSURE(c.ops->write(&c, 100, in, sizeof(in)) == 0, "write");
	ENSURE(c.ops->read(&c, 100, out, sizeof(out)) == 0, "read");
	ENSURE(!memcmp(in, out, sizeof(in)), "read back");
	/* overlapping move up */
	ENSURE(c.ops->move(&c, 1000, 100, sizeof(in)) == 0, "move");
	ENSURE(c.ops->read(&c, 1000, out, sizeof(out)) == 0, "read moved");
	ENSURE(!memcmp(in, out, sizeof(in)), "moved bytes");
	/* and down */
	ENSURE(c.ops->move(&c, 10, 1000, sizeof(in)) == 0, "move down");
	ENSURE(c.ops->read(&c, 10, out, sizeof(out)) == 0, "read moved");
	ENSURE(!memcmp(in, out, sizeof(in)), "moved bytes down");
	ENSURE(c.ops->write(&c, sizeof(buf) - 1, in, 2) == -EINVAL, "oob write");
	ENSURE(c.ops->read(&c, sizeof(buf) + 1, out, 0) == -EINVAL, "oob read");
	ENSURE(c.ops->move(&c, 0, sizeof(buf) - 4, 8) == -EINVAL, "oob move");
	ENSURE(c.ops->read(&c, sizeof(buf), out, 0) == 0, "empty read at end");
	cache_destroy(&c);
}

int main(int argc, char **argv)
{
	int r;

	seed = tu_seed("test_cache:", argc > 1 ? argv[1] : NULL, NULL, 0x7e1f5eedULL, NULL);
	rng_state = seed * 0x9e3779b97f4a7c15ULL + 1;
	if (!rng_state)
		rng_state = 1;
	test_check_catches();
	test_host_ops();
	test_place_in();
	for (r = 0; r < ROUNDS; r++)
		run_round();
	printf("test_cache: ok (%d rounds, %ld operations, %d evictions)\n",
	       ROUNDS, op_no, evicted_calls);
	printf("test_cache: placed %ld (%ld -ENOSPC), grown %ld (%ld -ENOSPC), "
	       "policy windows %ld (%ld -ENOSPC)\n", n_placed, n_nospc,
	       n_grown, n_nogrow, n_chosen, n_nochoice);
	return 0;
}
