/*
 * cache.c - the allocation table of a cache tier.
 *
 * A tier's buffer [0, size) is tiled by fragments kept in a doubly linked
 * list in offset order (struct frag, one malloc each).  A fragment is
 * either a gap (copy == NULL) or the whole reservation of one cached copy.
 * The gaps are also linked among themselves, in offset order (c->gaps,
 * gprev/gnext): placement walks them alone, not the copies between them
 * (a cache full of small files holds thousands of copies and few gaps).
 * Invariants, all checked by cache_check():
 *
 *   - the fragments tile [0, size): the first starts at 0, each starts
 *     where the previous one ends, the last ends at size;
 *   - every fragment is non-empty and TIER_ALIGN-aligned in offset and size;
 *   - no two gaps are adjacent (a gap is always coalesced with gap
 *     neighbours), so the table never holds more than about twice as many
 *     fragments as copies;
 *   - a copy's fragment points at the copy and the copy points back at it
 *     and at this cache;
 *   - the gap list holds every gap and nothing else, in offset order;
 *   - nfrags, ngaps and used (bytes in copies' fragments) are exact.
 *
 * Only [0, usable) may receive new copies: a GPU cache is mapped bit by
 * bit and its owner raises usable as it goes; usable starts at size.
 *
 * Callers hold the engine lock for every call here; nothing here blocks or
 * moves bytes (tier_host_ops, at the end, is the host tier's byte mover and
 * runs without the lock, under a pin).  Placement is first fit; choosing
 * what to evict is evict.c's job, cache_evict_window() carries it out.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier.h"

static struct frag *frag_new(uint64_t off, uint64_t size, struct copy *cp)
{
	struct frag *f = malloc(sizeof(*f));

	if (!f)
		return NULL;
	f->prev = f->next = NULL;
	f->gprev = f->gnext = NULL;
	f->off = off;
	f->size = size;
	f->copy = cp;
	return f;
}

/* Put n into the list right after f. */
static void frag_link_after(struct frag *f, struct frag *n)
{
	n->prev = f;
	n->next = f->next;
	if (f->next)
		f->next->prev = n;
	f->next = n;
}

/* Link n into c's list just before f (n becomes the head if f was). */
static void frag_link_before(struct cache *c, struct frag *f, struct frag *n)
{
	if (f->prev) {
		frag_link_after(f->prev, n);
	} else {
		n->next = f;
		n->prev = NULL;
		f->prev = n;
		c->head = n;
	}
}

/* ---- the gap list -------------------------------------------------------- */

/* Link gap n into c's gap list right before gap g (NULL: at its end, after
 * `last`, the list's last gap or NULL). */
static void gap_link(struct cache *c, struct frag *n, struct frag *g, struct frag *last)
{
	n->gnext = g;
	n->gprev = g ? g->gprev : last;
	if (n->gprev)
		n->gprev->gnext = n;
	else
		c->gaps = n;
	if (g)
		g->gprev = n;
}

/* Take gap g out of c's gap list. */
static void gap_del(struct cache *c, struct frag *g)
{
	if (g->gprev)
		g->gprev->gnext = g->gnext;
	else
		c->gaps = g->gnext;
	if (g->gnext)
		g->gnext->gprev = g->gprev;
	g->gprev = g->gnext = NULL;
}

/* Put n (a fragment just made a gap) in its place in the gap list: before
 * the nearest gap that follows it or after the nearest that precedes it,
 * looked for on both sides at once (the walk stops at the nearer). */
static void gap_add(struct cache *c, struct frag *n)
{
	struct frag *a = n->prev, *b = n->next;

	for (;;) {
		if (b && !b->copy) {
			gap_link(c, n, b, NULL);
			return;
		}
		if (a && !a->copy) {
			gap_link(c, n, a->gnext, a);
			return;
		}
		if (!a && !b) {		/* the only gap */
			gap_link(c, n, NULL, NULL);
			return;
		}
		if (a)
			a = a->prev;
		if (b)
			b = b->next;
	}
}

/* Take f out of c's list and free it; f is in no gap list. */
static void frag_free(struct cache *c, struct frag *f)
{
	if (f->prev)
		f->prev->next = f->next;
	else
		c->head = f->next;
	if (f->next)
		f->next->prev = f->prev;
	c->nfrags--;
	free(f);
}

/* Take f out of c's list (and out of the gap list: a gap) and free it. */
static void frag_unlink(struct cache *c, struct frag *f)
{
	if (!f->copy)
		gap_del(c, f);
	frag_free(c, f);
}

/*
 * Turn f (a copy's fragment, already detached from its copy by the caller)
 * into a gap and coalesce it with gap neighbours.  Returns the gap that
 * now covers f's bytes (f itself or its left neighbour).
 */
static struct frag *frag_make_gap(struct cache *c, struct frag *f)
{
	struct frag *n = f->next, *p = f->prev;

	assert(f->copy == NULL);
	if (p && !p->copy) {		/* p takes f (and a gap after it) */
		p->size += f->size;
		if (n && !n->copy) {
			p->size += n->size;
			frag_unlink(c, n);
			c->ngaps--;
		}
		frag_free(c, f);	/* a copy's until now: in no gap list */
		return p;
	}
	c->ngaps++;
	if (n && !n->copy) {		/* f takes n's place in the gap list */
		f->size += n->size;
		gap_link(c, f, n, NULL);
		frag_unlink(c, n);
		c->ngaps--;
	} else {
		gap_add(c, f);
	}
	return f;
}

/*
 * Smallest reservation for a copy of `size` bytes: rounded up to
 * TIER_ALIGN, at least one block (every copy owns a non-empty fragment),
 * 0 when size cannot be rounded without overflow.
 */
static uint64_t resv_size(uint64_t size)
{
	if (size > UINT64_MAX - TIER_ALIGN)
		return 0;
	if (size == 0)
		return TIER_ALIGN;
	return tier_round(size);
}

/*
 * Set up c as an allocation table over [base, base+size): size is rounded
 * down to TIER_ALIGN, the table is one gap, usable = size, statistics are
 * zero and priv is NULL (every field of c is set).  Returns 0, -EINVAL when
 * less than one block remains, or -ENOMEM (c is then unusable but needs no
 * cache_destroy).
 */
int cache_init(struct cache *c, const char *name, int level, void *base,
	       uint64_t size, const struct tier_ops *ops,
	       const struct evict_policy *pol)
{
	struct frag *f;

	memset(c, 0, sizeof(*c));
	size &= ~(uint64_t)(TIER_ALIGN - 1);
	if (size == 0)
		return -EINVAL;
	f = frag_new(0, size, NULL);
	if (!f)
		return -ENOMEM;
	c->name = name;
	c->level = level;
	c->base = base;
	c->size = size;
	c->usable = size;
	c->ops = ops;
	c->policy = pol;
	c->head = f;
	c->gaps = f;
	c->nfrags = 1;
	c->ngaps = 1;
	return 0;
}

/*
 * Free the fragment list (not the buffer, which belongs to the tier's
 * owner).  Every copy must have been released or evicted first (asserted).
 * c is left empty (head NULL); cache_init may set it up again.
 */
void cache_destroy(struct cache *c)
{
	struct frag *f = c->head, *n;

	assert(c->used == 0);
	while (f) {
		n = f->next;
		assert(!f->copy);
		free(f);
		f = n;
	}
	c->head = NULL;
	c->gaps = NULL;
	c->nfrags = c->ngaps = 0;
}

/*
 * Turn [at, at + size) of gap g (which holds it; size a reservation size)
 * into cp's fragment: the gap keeps what lies before and after it (split
 * in two or three).  Sets cp->frag, cp->cache and cp->seq (next insertion
 * number) and adds to c->used; the copy's other fields are the caller's.
 * Returns 0, or -ENOMEM with nothing changed.
 */
static int place_at(struct cache *c, struct frag *g, uint64_t at, struct copy *cp,
		    uint64_t size)
{
	struct frag *f, *before = NULL;

	assert(!g->copy && at >= g->off && at + size <= g->off + g->size);
	if (at > g->off) {	/* the gap's front stays a gap */
		before = frag_new(g->off, at - g->off, NULL);
		if (!before)
			return -ENOMEM;
	}
	if (g->off + g->size == at + size) {
		f = g;
		if (before)		/* the front keeps g's place in the gap list */
			gap_link(c, before, g, NULL);
		gap_del(c, g);
		f->off = at;
		f->size = size;
		c->ngaps--;
	} else {
		f = frag_new(at, size, cp);
		if (!f) {
			free(before);
			return -ENOMEM;
		}
		if (before)	/* the front is a gap of its own, before g */
			gap_link(c, before, g, NULL);
		frag_link_before(c, g, f);
		c->nfrags++;
		g->size -= at + size - g->off;
		g->off = at + size;
	}
	if (before) {
		frag_link_before(c, f, before);
		c->nfrags++;
		c->ngaps++;
	}
	f->copy = cp;
	cp->frag = f;
	cp->cache = c;
	cp->seq = ++c->seq;
	c->used += size;
	return 0;
}

/*
 * The part of gap g inside [lo, hi): true with it in [*a, *b), false when
 * g is a copy or lies outside the range.
 */
static bool gap_clip(const struct frag *g, uint64_t lo, uint64_t hi, uint64_t *a, uint64_t *b)
{
	if (g->copy)
		return false;
	*a = g->off > lo ? g->off : lo;
	*b = g->off + g->size < hi ? g->off + g->size : hi;
	return *a < *b;
}

/*
 * Place cp in the first gap (in offset order) that can hold `size` bytes
 * (rounded up to TIER_ALIGN, at least one block) inside [lo, hi), which is
 * cut to c->usable; with `top`, in the last such gap and at the top of the
 * room it has inside the range (a GPU's part filled from its upper end).
 * The copy's fragment starts at the gap's start, or at lo when the gap
 * begins before lo (without top).  Returns 0, -ENOSPC when no gap has room
 * inside the range, or -ENOMEM; on error nothing changes.
 */
int cache_place_in(struct cache *c, struct copy *cp, uint64_t size,
		   uint64_t lo, uint64_t hi, bool top)
{
	struct frag *g, *best = NULL;
	uint64_t at = 0;

	size = resv_size(size);
	if (hi > c->usable)
		hi = c->usable;
	lo = tier_round(lo);
	hi &= ~(uint64_t)(TIER_ALIGN - 1);
	if (size == 0 || lo >= hi || size > hi - lo)
		return -ENOSPC;
	for (g = c->gaps; g && g->off < hi; g = g->gnext) {
		uint64_t a, b;

		if (!gap_clip(g, lo, hi, &a, &b) || b - a < size)
			continue;
		best = g;
		at = top ? b - size : a;
		if (!top)
			break;
	}
	if (!best)
		return -ENOSPC;
	return place_at(c, best, at, cp, size);
}

int cache_place_at(struct cache *c, struct copy *cp, uint64_t size, uint64_t at)
{
	struct frag *g;

	size = resv_size(size);
	if (size == 0 || at % TIER_ALIGN || at > c->usable || size > c->usable - at)
		return -ENOSPC;
	for (g = c->gaps; g && g->off <= at; g = g->gnext)
		if (at + size <= g->off + g->size)
			return place_at(c, g, at, cp, size);
	return -ENOSPC;
}

int cache_place(struct cache *c, struct copy *cp, uint64_t size)
{
	return cache_place_in(c, cp, size, 0, c->usable, false);
}

/* The largest gap's bytes inside [lo, hi) (cut to c->usable). */
uint64_t cache_largest_gap_in(const struct cache *c, uint64_t lo, uint64_t hi)
{
	const struct frag *g;
	uint64_t best = 0;

	if (hi > c->usable)
		hi = c->usable;
	for (g = c->gaps; g && g->off < hi; g = g->gnext) {
		uint64_t a, b;

		if (gap_clip(g, lo, hi, &a, &b) && b - a > best)
			best = b - a;
	}
	return best & ~(uint64_t)(TIER_ALIGN - 1);
}

/*
 * Give cp's fragment back as a gap, coalesced with gap neighbours.  cp must
 * be placed in c; afterwards cp->frag is NULL (cp->cache is left as it
 * was, for the caller's bookkeeping).  The copy's state and pins are the
 * caller's business: nothing here looks at them.
 */
void cache_release(struct cache *c, struct copy *cp)
{
	struct frag *f = cp->frag;

	assert(f && f->copy == cp && cp->cache == c);
	f->copy = NULL;
	cp->frag = NULL;
	c->used -= f->size;
	frag_make_gap(c, f);
}

/*
 * Evict every copy of the consecutive fragments [first, last] of c and
 * turn the window into one gap (coalesced with gap neighbours outside the
 * window too).  Every copy in it must be evictable and unpinned
 * (asserted).  Each copy is taken out of the table before evicted(cp) is
 * called for it, so evicted() sees cp->frag == NULL and a consistent
 * table, and may free cp.  Statistics (c->evictions, c->evicted_bytes)
 * are the caller's to count.  Returns the gap covering the window: it
 * starts at or before first's offset and ends at or after last's end.
 */
struct frag *cache_evict_window(struct cache *c, struct frag *first,
				struct frag *last,
				void (*evicted)(struct copy *cp))
{
	uint64_t end = last->off + last->size;
	struct frag *f = first, *g;

	assert(first->off <= last->off);
	for (;;) {
		struct copy *cp = f->copy;

		if (cp) {
			assert(cp->frag == f && cp->cache == c);
			assert(tier_copy_evictable(cp));
			f->copy = NULL;
			cp->frag = NULL;
			c->used -= f->size;
			g = frag_make_gap(c, f);
			if (evicted)
				evicted(cp);
		} else {
			g = f;
		}
		/* g is a coalesced gap: its successor, if any, is a copy */
		if (g->off + g->size >= end)
			return g;
		f = g->next;
		assert(f);
	}
}

/*
 * Shrink cp's reservation to `size` bytes (rounded up to TIER_ALIGN, at
 * least one block; must be >= cp->len and not more than the current
 * reservation, asserted).  The freed tail becomes a gap, or joins the gap
 * that follows.  Should the new gap's fragment not be allocatable, the
 * reservation stays as it was: harmless, only less compact.
 */
void cache_shrink(struct cache *c, struct copy *cp, uint64_t size)
{
	struct frag *f = cp->frag, *n, *g;
	uint64_t cut;

	assert(f && f->copy == cp && cp->cache == c);
	size = resv_size(size);
	assert(size != 0 && size >= cp->len && size <= f->size);
	if (size >= f->size)
		return;
	cut = f->size - size;
	n = f->next;
	if (n && !n->copy) {
		n->off -= cut;
		n->size += cut;
	} else {
		g = frag_new(f->off + size, cut, NULL);
		if (!g)
			return;
		frag_link_after(f, g);
		gap_add(c, g);
		c->nfrags++;
		c->ngaps++;
	}
	f->size = size;
	c->used -= cut;
}

/*
 * Grow cp's reservation in place to `size` bytes (rounded up to
 * TIER_ALIGN) by taking the front of the gap that follows it; the grown
 * fragment must end at or below c->usable.  Returns 0 (also when the
 * reservation is already that large: it is never shrunk here) or -ENOSPC,
 * nothing changed, when the next fragment is not a gap big enough.
 */
int cache_grow_inplace(struct cache *c, struct copy *cp, uint64_t size)
{
	struct frag *f = cp->frag, *n;
	uint64_t more;

	assert(f && f->copy == cp && cp->cache == c);
	size = resv_size(size);
	if (size == 0)
		return -ENOSPC;
	if (size <= f->size)
		return 0;
	more = size - f->size;
	n = f->next;
	if (!n || n->copy || n->size < more || f->off + size > c->usable)
		return -ENOSPC;
	if (n->size == more) {
		frag_unlink(c, n);
		c->ngaps--;
	} else {
		n->off += more;
		n->size -= more;
	}
	f->size = size;
	c->used += more;
	return 0;
}

#define BROKEN(...) do {						\
	fprintf(stderr, "tierfs: cache %s: ", c->name ? c->name : "?");	\
	fprintf(stderr, __VA_ARGS__);					\
	fputc('\n', stderr);						\
	return -EUCLEAN;						\
} while (0)

/*
 * Check every invariant of c's table (see the top of this file).  Returns
 * 0, or -EUCLEAN after printing the first broken invariant to stderr.
 * Reads only; O(nfrags).
 */
int cache_check(const struct cache *c)
{
	const struct frag *f, *prev = NULL;
	const struct frag *gap = c->gaps, *gprev = NULL;	/* the gap list's next */
	uint64_t off = 0, nfrags = 0, ngaps = 0, used = 0;

	if (c->size == 0 || c->size % TIER_ALIGN)
		BROKEN("size %" PRIu64 " not a positive multiple of %u",
		       c->size, TIER_ALIGN);
	if (c->usable > c->size)
		BROKEN("usable %" PRIu64 " > size %" PRIu64, c->usable, c->size);
	if (!c->head)
		BROKEN("no fragments");
	for (f = c->head; f; prev = f, f = f->next) {
		if (f->prev != prev)
			BROKEN("fragment at %" PRIu64 ": bad prev link", f->off);
		if (f->off != off)
			BROKEN("fragment at %" PRIu64 " should start at %" PRIu64,
			       f->off, off);
		if (f->size == 0 || f->size % TIER_ALIGN)
			BROKEN("fragment at %" PRIu64 ": bad size %" PRIu64,
			       f->off, f->size);
		if (f->size > c->size - off)
			BROKEN("fragment at %" PRIu64 " (%" PRIu64
			       " bytes) runs past the end %" PRIu64,
			       f->off, f->size, c->size);
		off += f->size;
		nfrags++;
		if (!f->copy) {
			ngaps++;
			if (prev && !prev->copy)
				BROKEN("adjacent gaps at %" PRIu64 " and %" PRIu64,
				       prev->off, f->off);
			if (f != gap)
				BROKEN("gap at %" PRIu64 " is not next in the gap list", f->off);
			if (gap->gprev != gprev)
				BROKEN("gap at %" PRIu64 ": bad gprev link", f->off);
			gprev = gap;
			gap = gap->gnext;
			continue;
		}
		used += f->size;
		if (f->copy->frag != f)
			BROKEN("copy at %" PRIu64 " does not point back", f->off);
		if (f->copy->cache != c)
			BROKEN("copy at %" PRIu64 " names another cache", f->off);
		if (f->copy->len > f->size)
			BROKEN("copy at %" PRIu64 ": len %" PRIu64
			       " > reservation %" PRIu64,
			       f->off, f->copy->len, f->size);
	}
	if (off != c->size)
		BROKEN("fragments end at %" PRIu64 ", size %" PRIu64,
		       off, c->size);
	if (gap)
		BROKEN("the gap list goes on past the last gap, at %" PRIu64, gap->off);
	if (nfrags != c->nfrags)
		BROKEN("nfrags %" PRIu64 ", counted %" PRIu64, c->nfrags, nfrags);
	if (ngaps != c->ngaps)
		BROKEN("ngaps %" PRIu64 ", counted %" PRIu64, c->ngaps, ngaps);
	if (used != c->used)
		BROKEN("used %" PRIu64 ", counted %" PRIu64, c->used, used);
	return 0;
}

#undef BROKEN

/* ---- host-memory byte mover ------------------------------------------ */

static bool host_range_ok(const struct cache *c, uint64_t off, size_t len)
{
	return off <= c->size && len <= c->size - off;
}

static int host_write(struct cache *c, uint64_t off, const void *src,
		      size_t len)
{
	if (!host_range_ok(c, off, len))
		return -EINVAL;
	memcpy(c->base + off, src, len);
	return 0;
}

static int host_read(struct cache *c, uint64_t off, void *dst, size_t len)
{
	if (!host_range_ok(c, off, len))
		return -EINVAL;
	memcpy(dst, c->base + off, len);
	return 0;
}

static int host_move(struct cache *c, uint64_t dst, uint64_t src, size_t len)
{
	if (!host_range_ok(c, dst, len) || !host_range_ok(c, src, len))
		return -EINVAL;
	memmove(c->base + dst, c->base + src, len);
	return 0;
}

/*
 * Copy functions of a host-memory tier: plain memcpy/memmove on c->base.
 * Each returns 0, or -EINVAL for a range outside [0, c->size).
 */
const struct tier_ops tier_host_ops = {
	.write	= host_write,
	.read	= host_read,
	.move	= host_move,
};
