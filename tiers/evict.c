/*
 * evict.c - eviction policies: which consecutive fragments of a full cache
 * to clear for a new copy.
 *
 * A policy gets the allocation table, the bytes needed, and a cost()
 * callback from the engine that tells, per copy, how long until it is
 * evictable (wait: 0 now, seconds while it flushes, TIER_INF never, e.g.
 * promoted and not yet read or pinned) and how soon it will be read again
 * (dist: position in the restore queue, TIER_FAR without a hint).  It
 * answers a window [first, last] of consecutive fragments whose sizes add
 * up to the need; the engine waits for the window's copies to become
 * evictable and calls cache_evict_window().  Policies only read the table.
 *
 * score (the default, DESIGN.md "Eviction"): two pointers slide a window
 * over the whole table.  For each left end the right end advances until
 * the window holds `need` bytes; a fragment that will never be evictable
 * is a barrier no window may span.  Among those windows, in this order:
 *  1. the least summed wait wins (sums within WAIT_EPS tie);
 *  2. then the largest minimum prefetch distance over the window's copies
 *     (gaps do not count; a copy without a hint is TIER_FAR, and so is a
 *     window of gaps only);
 *  3. then the least summed urgency, a copy's urgency being 2^63 /
 *     (distance + 1) and 0 without a hint (gaps count 0; sums are
 *     128-bit so they are exact);
 *  4. then the oldest window: the least maximum insertion number
 *     (copy.seq) among its copies, gaps counting as oldest (0);
 *  5. then the lowest offset.
 *
 * Why the minimum, and why urgency rather than distance: this deviates
 * from hpdc23 Algorithm 1, whose s_score sums the distances.  A sum of
 * distances lets one unhinted copy (e.g. a file already consumed,
 * TIER_FAR) outweigh everything else in its window, so a window holding
 * it and the copy the restore queue needs NEXT beat a window whose every
 * copy is needed late, and score evicted files about to be read.  The
 * minimum is the soonest any copy of the window is needed again: a window
 * that is needed late as a whole goes first.  A sum of distances also
 * grows with every copy a window holds, so it prefers windows of more
 * copies: among equal minima it evicted two copies needed soon rather
 * than one needed late ({10, 50, 60} over {10, 100}), and without hints,
 * where every copy counted as 2^64-1, it evicted the window of the most
 * (small, and often young) copies every time, far more copies than fifo
 * does for the same room.  Urgency orders copies as distance does
 * (sooner needed, more urgent) but adds up what an eviction loses: each
 * hinted copy adds to it, an unhinted one (not known to be read again)
 * adds nothing.  Among equal minima the sum prefers fewer and later
 * copies, and a window of unhinted copies only ties with every other such
 * window whatever their number.  Without restore hints every copy is
 * TIER_FAR, all minima and urgencies tie and the order is decided by the
 * rules below.
 *
 * The age tie-break matters when restore hints are missing: every copy is
 * TIER_FAR and flushed copies all wait 0, so all windows tie on the
 * wait, the minimum and the urgency, and without it the lowest offset
 * would win every time: the
 * low end of the buffer would be recycled over and over and the newest
 * copies would be the ones evicted.  Why the
 * youngest copy's seq and not the summed (or mean) seq: with equal-size
 * copies and a one-copy need it picks the oldest copy, exactly as fifo
 * does; for a larger need it evicts no copy younger than it must (a fifo
 * cache holds the newest copies, and this keeps as many of them as a
 * window can), whereas a summed seq trades one of the newest copies for
 * two middle-aged ones ({1, 100} beats {60, 61}) and grows with the number
 * of copies in a window.  With variable sizes it also evicts one old
 * large copy rather than several younger small ones, as fifo does.  (Hit
 * rates of these choices: bench/RESULTS.md.)
 *
 * A window's minimum distance is asked for only when its wait does not
 * lose to the best so far, and its age only when it also ties on the
 * minimum and the summed urgency.  Each comes from a monotonic deque (struct minq, struct
 * ageq) brought up to date lazily: as both ends of the window only move
 * forward, each fragment is pushed and popped at most once per decision,
 * so the rules keep the decision O(N) and cost nothing when nothing ties.
 *
 * A window whose left fragment could be dropped while still holding
 * `need` is skipped: its left fragment is a gap or a ready copy that adds
 * nothing but a needless eviction (a copy evicted that is not in the
 * way).  Each left end and each right
 * end move forward only, and running sums are updated in O(1), so a
 * decision is O(N).
 *
 * How score keeps a decision cheap (timings: bench/RESULTS.md): the table
 * is copied, in blocks of GATHER_BLOCK fragments just ahead of the
 * window's right end, into 32-byte records (struct srec) that the slide
 * then reads while they are still in the CPU's first-level cache; the
 * copying loop is the
 * only one that calls cost(), so the slide's loop keeps its sums in
 * registers; a barrier ends a block, so the slide looks for barriers once
 * per block rather than once per fragment; and a window is first screened
 * with a few comparisons that rule out nearly every window once a good
 * one is known: the wait, the summed urgency, and in place of the
 * minimum the lesser distance of the window's two end fragments, which
 * bounds it from above (score_consider() then makes the exact
 * comparison).  The sums are formed in the same order as in the plain loop (add at the
 * right end until the window holds need, then look at it and drop its
 * left end), so decisions and summed waits are the same to the bit.
 *
 * fifo and lru are baselines that never wait: they look at ready copies
 * (wait == 0) in insertion order (copy.seq) or least-recent use
 * (copy.last_use), and for each try to grow a window from its fragment to
 * the right, then if needed to the left, over gaps and ready copies only.
 * The first that reaches `need` wins.  O(N log N) (a sort).
 *
 * Common rules:
 * - cost() is called at most once per fragment per decision, and never
 *   for gaps (a gap is always wait 0, dist 0).
 * - Only [0, c->usable) counts: a fragment is clipped to it, and one that
 *   lies wholly above it is a barrier.
 * - A negative wait counts as 0; a wait >= TIER_INF (or NaN) is a barrier.
 *   Waits are sums of seconds kept in double and reset exactly when
 *   the window holds no waiting copy, so the running sum's rounding stays
 *   far below WAIT_EPS for any realistic wait (well under 10^6 s).
 * - need == 0 is treated as 1 (any non-empty window).
 * - Per-decision arrays live in per-thread scratch buffers that only grow
 *   (about 65 bytes per fragment for score, 70 for fifo and lru; reused by
 *   every later decision of the thread and freed when it exits, by a
 *   pthread key's destructor), so a decision allocates nothing once they
 *   are warm.  They are the only per-thread state here: every input of a
 *   decision is an argument (the table, need, cost() and its ctx).
 * - Returns 0, -ENOSPC, or -ENOMEM when a scratch buffer cannot grow.
 *
 * Callers hold the engine lock; nothing here sleeps.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tier.h"

/* Summed waits closer than this (seconds, or relative) are a tie. */
#define WAIT_EPS	1e-9

/* One fragment as fifo and lru see it (score has struct srec). */
struct ent {
	struct frag *f;
	uint64_t size;		/* bytes below usable */
	double wait;		/* >= 0, finite (0 for a barrier) */
	uint64_t dist;
	uint64_t key;		/* copy.seq (fifo) or last_use (lru) */
	bool barrier;		/* never evictable, or above usable */
	uint32_t run_lo;	/* first index of the ready run holding it */
	uint32_t run_hi;	/* last index of that run */
};

/*
 * The per-thread buffers go with their thread: the first reserve of a
 * thread registers it with a key whose destructor frees them (without it,
 * every thread that ever made a decision leaked its buffers at exit).
 */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static __thread bool scratch_registered;
static void scratch_free(void *unused);

static void scratch_key_init(void)
{
	pthread_key_create(&scratch_key, scratch_free);
}

static void scratch_register(void)
{
	if (scratch_registered)
		return;
	pthread_once(&scratch_once, scratch_key_init);
	pthread_setspecific(scratch_key, &scratch_registered);
	scratch_registered = true;
}

static __thread struct ent *scratch;	/* fifo and lru */
static __thread size_t scratch_cap;
/* fifo/lru: prefix sums and candidate order; score: the window-maximum
 * deque's keys and indices */
static __thread uint64_t *pre_buf;	/* n + 1 */
static __thread uint32_t *cand_buf;	/* n + 1 */
static __thread size_t aux_cap;

static int scratch_reserve(size_t n)
{
	struct ent *e;
	size_t cap;

	scratch_register();
	if (n <= scratch_cap)
		return 0;
	cap = scratch_cap ? scratch_cap : 64;
	while (cap < n)
		cap *= 2;
	e = realloc(scratch, cap * sizeof(*e));
	if (!e)
		return -ENOMEM;
	scratch = e;
	scratch_cap = cap;
	return 0;
}

static int aux_reserve(size_t n)
{
	uint64_t *p;
	uint32_t *q;
	size_t cap;

	scratch_register();
	if (n + 1 <= aux_cap)
		return 0;
	cap = aux_cap ? aux_cap : 64;
	while (cap < n + 1)
		cap *= 2;
	p = realloc(pre_buf, cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	pre_buf = p;
	q = realloc(cand_buf, cap * sizeof(*q));
	if (!q)
		return -ENOMEM;		/* pre_buf is kept, aux_cap not raised */
	cand_buf = q;
	aux_cap = cap;
	return 0;
}

enum order_key { KEY_SEQ, KEY_LAST_USE };

/*
 * Fill the scratch array (fifo and lru) with c's fragments in offset
 * order, asking cost() once per copy below usable, and taking the seq or
 * last_use key (0 for gaps and for fragments above usable).
 * Returns the fragment count, -ENOMEM, or -EUCLEAN when the list holds
 * more fragments than c->nfrags says.
 */
static long gather(struct cache *c,
		   evict_cost_fn cost, const struct evict_ctx *ctx,
		   enum order_key key)
{
	struct evict_cost k;
	struct frag *f;
	size_t n = 0;
	uint64_t wbits;

	if (c->nfrags > UINT32_MAX - 2 || scratch_reserve(c->nfrags))
		return -ENOMEM;
	for (f = c->head; f; f = f->next, n++) {
		struct ent *e;

		if (n >= c->nfrags)
			return -EUCLEAN;
		e = &scratch[n];
		e->f = f;
		e->wait = 0;
		e->dist = 0;
		e->key = 0;
		e->barrier = false;
		if (f->off >= c->usable) {
			e->size = 0;
			e->barrier = true;
			continue;
		}
		e->size = f->size;
		if (f->size > c->usable - f->off)
			e->size = c->usable - f->off;
		if (!f->copy)
			continue;
		k = cost(c, f, ctx);
		/*
		 * wait = k.wait if 0 < k.wait < TIER_INF, else 0 (also NaN),
		 * by a bit mask: waits are often random, and gcc's branch on
		 * them mispredicts (about a sixth of a decision's misses).
		 */
		memcpy(&wbits, &k.wait, sizeof(wbits));
		wbits &= -(uint64_t)((k.wait > 0) & (k.wait < TIER_INF));
		memcpy(&e->wait, &wbits, sizeof(wbits));
		e->barrier = !(k.wait < TIER_INF);	/* also NaN */
		e->dist = k.dist;
		if (key == KEY_SEQ)
			e->key = f->copy->seq;
		else if (key == KEY_LAST_USE)
			e->key = f->copy->last_use;
	}
	return (long)n;
}

/* ---- score ----------------------------------------------------------- */

typedef unsigned __int128 u128;

/*
 * One fragment as score's slide reads it: each record is read twice, as
 * the window's right end passes it and then its left end, so it is kept
 * small.  Insertion numbers are read by age queries only, and from the
 * fragments themselves.
 */
struct srec {
	uint64_t size;		/* bytes below usable */
	double wait;		/* >= 0, finite; HUGE_VAL for a barrier */
	uint64_t urg;		/* urgency(); 0 for gaps: the summed urgency */
	uint64_t key;		/* TIER_FAR for gaps: the minimum distance */
};

/*
 * How soon a copy at prefetch distance dist is needed, in fixed point:
 * 2^63 / (dist + 1), and 0 without a hint (TIER_FAR).  Window sums of it
 * are exact (128-bit) and, unlike distances, do not grow with the number
 * of unhinted copies a window holds.
 */
static inline uint64_t urgency(uint64_t dist)
{
	return dist == TIER_FAR ? 0 : (UINT64_C(1) << 63) / (dist + 1);
}

static __thread struct srec *srec_buf;		/* records, table order */
static __thread struct frag **sfrag_buf;	/* their fragments */
static __thread uint64_t *mink_buf;		/* struct minq's keys */
static __thread uint32_t *mini_buf;		/* and indices */
static __thread size_t srec_cap;

/* The key's destructor: the exiting thread's buffers. */
static void scratch_free(void *unused)
{
	(void)unused;
	free(scratch);
	free(pre_buf);
	free(cand_buf);
	free(srec_buf);
	free(sfrag_buf);
	free(mink_buf);
	free(mini_buf);
	scratch = NULL;
	pre_buf = NULL;
	cand_buf = NULL;
	srec_buf = NULL;
	sfrag_buf = NULL;
	mink_buf = NULL;
	mini_buf = NULL;
	scratch_cap = aux_cap = srec_cap = 0;
	scratch_registered = false;
}

static int srec_reserve(size_t n)
{
	struct srec *r;
	struct frag **f;
	uint64_t *k;
	uint32_t *x;
	size_t cap;

	scratch_register();
	if (n + 1 <= srec_cap)
		return 0;
	cap = srec_cap ? srec_cap : 64;
	while (cap < n + 1)
		cap *= 2;
	r = realloc(srec_buf, cap * sizeof(*r));
	if (!r)
		return -ENOMEM;
	srec_buf = r;
	f = realloc(sfrag_buf, cap * sizeof(*f));
	if (!f)
		return -ENOMEM;		/* what grew is kept, srec_cap not raised */
	sfrag_buf = f;
	k = realloc(mink_buf, cap * sizeof(*k));
	if (!k)
		return -ENOMEM;
	mink_buf = k;
	x = realloc(mini_buf, cap * sizeof(*x));
	if (!x)
		return -ENOMEM;
	mini_buf = x;
	srec_cap = cap;
	return 0;
}

/* Fragments copied per call of score_gather(): 2 KiB of records. */
#define GATHER_BLOCK	64

/*
 * Copy the fragments from *fp on into srec_buf and sfrag_buf from index n
 * on: up to GATHER_BLOCK of them, and no further than the first barrier
 * (which is copied too), asking cost() once per copy below usable.  *fp
 * moves past them, *bar is the barrier's index or, when there is none,
 * the new count.  Returns the new count (n when the list is done), or
 * -EUCLEAN when the list holds more than c->nfrags fragments.
 * Never inlined: it is the only loop that calls cost(), and the slide
 * calls it once per block, so the slide's own loop makes no calls and
 * keeps its sums in registers.
 */
static __attribute__((noinline)) long
score_gather(struct cache *c,
	     evict_cost_fn cost, const struct evict_ctx *ctx,
	     struct frag **fp, long n, long *bar)
{
	struct srec *r = srec_buf + n, *end = r + GATHER_BLOCK;
	struct frag **fr = sfrag_buf + n;
	uint64_t usable = c->usable;
	struct frag *f = *fp;

	if ((uint64_t)n + GATHER_BLOCK > c->nfrags)
		end = srec_buf + c->nfrags;
	for (; f && r < end; f = f->next, r++, fr++) {
		struct evict_cost k = { 0, 0 };
		uint64_t room = usable - f->off;

		*fr = f;
		if (f->off >= usable)
			break;
		if (f->copy) {
			k = cost(c, f, ctx);
			if (!(k.wait < TIER_INF))	/* also NaN */
				break;
		}
		r->size = f->size < room ? f->size : room;
		r->wait = k.wait > 0 ? k.wait : 0;	/* < 0 counts as 0 */
		r->urg = f->copy ? urgency(k.dist) : 0;
		r->key = f->copy ? k.dist : TIER_FAR;
	}
	n = r - srec_buf;
	*bar = n;
	if (f && r < end) {		/* stopped at a barrier */
		r->size = 0;
		r->wait = HUGE_VAL;
		r->urg = 0;
		r->key = TIER_FAR;
		f = f->next;
		n++;
	}
	*fp = f;
	if (f && (uint64_t)n >= c->nfrags)
		return -EUCLEAN;
	return n;
}

/* Is summed wait a clearly less than b? */
static bool wait_less(double a, double b)
{
	double m = a > b ? a : b;		/* sums are >= 0 */

	return a < b - WAIT_EPS * (m > 1 ? m : 1);
}

/*
 * Window-age deque for score: the copies of a window [i, j) with keys
 * (copy.seq) non-increasing from front to back, as (key, index) pairs in
 * [qh, qt); qk[qh - 1] is a UINT64_MAX sentinel that ends every pop from
 * the back.  It is brought up to date only when a window's age is asked
 * for; as i and j only grow, each index is pushed and popped at most once
 * per decision.  At most n pushes from slot 1: n + 1 entries.
 */
struct ageq {
	struct frag *const *frag;	/* the table, for the keys */
	uint64_t *qk;
	uint32_t *qi;
	long qh, qt;
	long next;		/* first index not pushed yet */
};

/* Seq of the youngest copy in [i, j), 0 when it holds only gaps. */
static uint64_t window_age(struct ageq *q, long i, long j)
{
	if (q->next < i) {		/* all of it is left of the window */
		q->qh = q->qt = 1;	/* qk[0] is still the sentinel */
		q->next = i;
	}
	for (; q->next < j; q->next++) {
		const struct copy *cp = q->frag[q->next]->copy;
		uint64_t key = cp ? cp->seq : 0;

		while (q->qk[q->qt - 1] < key)	/* the sentinel stops it */
			q->qt--;
		q->qk[q->qt] = key;
		q->qi[q->qt] = (uint32_t)q->next;
		q->qt += key != 0;	/* a gap (key 0) is not kept */
	}
	while (q->qt > q->qh && q->qi[q->qh] < i) {
		q->qk[q->qh] = UINT64_MAX;	/* the new sentinel */
		q->qh++;
	}
	return q->qt > q->qh ? q->qk[q->qh] : 0;
}

/*
 * Window-minimum deque for score, the mirror of struct ageq: the hinted
 * copies of a window [i, j) with distances non-decreasing from front to
 * back, as (distance, index) pairs in [qh, qt); qk[qh - 1] is a 0
 * sentinel that ends every pop from the back.  Gaps and copies without a
 * hint (key TIER_FAR) are not kept: an empty deque means TIER_FAR.
 * Brought up to date when a window's minimum is asked for, with the same
 * bound: at most n pushes from slot 1, n + 1 entries.
 */
struct minq {
	const struct srec *rec;	/* the records, for the keys */
	uint64_t *qk;
	uint32_t *qi;
	long qh, qt;
	long next;		/* first index not pushed yet */
};

/* Least distance of a copy in [i, j), TIER_FAR when it holds none. */
static uint64_t window_min(struct minq *q, long i, long j)
{
	if (q->next < i) {		/* all of it is left of the window */
		q->qh = q->qt = 1;	/* qk[0] is still the sentinel */
		q->next = i;
	}
	for (; q->next < j; q->next++) {
		uint64_t key = q->rec[q->next].key;

		while (q->qk[q->qt - 1] > key)	/* the sentinel stops it */
			q->qt--;
		q->qk[q->qt] = key;
		q->qi[q->qt] = (uint32_t)q->next;
		q->qt += key != TIER_FAR;	/* TIER_FAR is not kept */
	}
	while (q->qt > q->qh && q->qi[q->qh] < i) {
		q->qk[q->qh] = 0;	/* the new sentinel */
		q->qh++;
	}
	return q->qt > q->qh ? q->qk[q->qh] : TIER_FAR;
}

/* The best window so far, and what is needed to compare others with it. */
struct best {
	long i, j;		/* [i, j]; i < 0 while there is none */
	double w;		/* summed wait */
	uint64_t m;		/* least distance of a copy (TIER_FAR: none) */
	u128 u;			/* summed urgency (all ones: no best) */
	uint64_t age;		/* valid once asked: aged */
	bool aged;
	/*
	 * A summed wait above thr is clearly more than w: then
	 * wait_less(w, wait) holds, with a margin of about 10^-6 (relative,
	 * or absolute below 1 s) that dwarfs the rounding of either side.
	 * HUGE_VAL while there is no best.
	 */
	double thr;
	struct ageq q;
	struct minq mq;
};

/*
 * Window [i, j) (summed wait w, urgency u), from which no end fragment
 * can be dropped, passed the slide's screen: take it if it beats the best
 * (least wait, then largest minimum distance, then least summed urgency,
 * then oldest; ties stay with the lower offset).  The minimum
 * is asked for whenever the wait does not lose, so minimum queries come
 * in slide order.  Not inlined: it is rarely called, and inlined its
 * registers would crowd the slide's.
 */
static __attribute__((noinline)) void
score_consider(struct best *b, long i, long j, double w, u128 u)
{
	uint64_t m;
	bool take = true, by_age = false;

	if (b->i >= 0 && wait_less(b->w, w))
		return;
	m = window_min(&b->mq, i, j);
	if (b->i >= 0 && !wait_less(w, b->w)) {
		if (m != b->m) {
			take = m > b->m;
		} else if (u != b->u) {
			take = u < b->u;
		} else {
			/*
			 * Tied on wait, minimum and urgency: the older wins.
			 * The best's age is asked for first: no query since
			 * it was found went past its left end.
			 */
			uint64_t age;

			if (!b->aged) {
				b->age = window_age(&b->q, b->i, b->j + 1);
				b->aged = true;
			}
			age = window_age(&b->q, i, j);
			take = age < b->age;
			by_age = true;
			if (take)
				b->age = age;	/* the new best's age */
		}
	}
	if (take) {
		b->aged = by_age;
		b->i = i;
		b->j = j - 1;
		b->w = w;
		b->m = m;
		b->u = u;
		b->thr = w * (1 + 1e-6) + 1e-6;
	}
}

/*
 * Start a decision's best window: none yet, with its deques empty over the
 * thread's scratch buffers (which the caller has grown to the table:
 * srec_reserve, aux_reserve).
 */
static void best_init(struct best *b)
{
	b->i = b->j = -1;
	b->w = 0;
	b->m = 0;
	b->u = ~(u128)0;
	b->age = 0;
	b->aged = false;
	b->thr = HUGE_VAL;
	b->q.frag = sfrag_buf;
	b->q.qk = pre_buf;
	b->q.qi = cand_buf;
	b->q.qk[0] = UINT64_MAX;
	b->q.qh = b->q.qt = 1;
	b->q.next = 0;
	b->mq.rec = srec_buf;
	b->mq.qk = mink_buf;
	b->mq.qi = mini_buf;
	b->mq.qk[0] = 0;
	b->mq.qh = b->mq.qt = 1;
	b->mq.next = 0;
}

/*
 * The decision's answer from the best window b found: its end fragments in
 * *first and *last, its summed wait in *wait_s.  0, or -ENOSPC when no
 * window holds the need.
 */
static int best_window(const struct best *b, struct frag **first, struct frag **last,
		       double *wait_s)
{
	if (b->i < 0)
		return -ENOSPC;
	*first = sfrag_buf[b->i];
	*last = sfrag_buf[b->j];
	*wait_s = b->w;
	return 0;
}

static int score_choose(struct cache *c, uint64_t need,
			evict_cost_fn cost, const struct evict_ctx *ctx,
			struct frag **first, struct frag **last, double *wait_s)
{
	struct frag *f = c->head;	/* next fragment to copy */
	const struct srec *r, *ri, *rj;	/* window [ri, rj) */
	const struct srec *lim;		/* a barrier or the end of the copy */
	long n = 0, bar;		/* records copied; barrier */
	uint64_t size = 0;		/* window sums: */
	double wsum = 0;		/* double: x87 long double is slow */
	uint64_t ulo = 0, uhi = 0;	/* urgency, low and high 64 bits */
	long nwait = 0;			/* fragments with wait > 0 */
	struct best b;

	if (c->nfrags > UINT32_MAX - 2 || srec_reserve(c->nfrags) ||
	    aux_reserve(c->nfrags))
		return -ENOMEM;
	r = ri = rj = lim = srec_buf;
	best_init(&b);
	if (need == 0)
		need = 1;
	for (;;) {
		uint64_t s, d, k;
		u128 usum;
		double w;

		/* grow the window to need; nothing spans a barrier */
		while (size < need) {
			if (rj == lim) {
				if (rj < r + n) {
					/* a barrier: restart past it, empty */
					ri = rj = rj + 1;
					lim = r + n;
					size = 0;
					wsum = 0;
					ulo = uhi = 0;
					nwait = 0;
					continue;
				}
				n = score_gather(c, cost, ctx, &f, n, &bar);
				if (n < 0)
					return (int)n;
				if (rj == r + n)
					goto done;	/* no later window */
				lim = r + bar;
				continue;
			}
			w = rj->wait;
			d = rj->urg;
			size += rj->size;
			wsum += w;
			ulo += d;
			uhi += ulo < d;
			nwait += w > 0;
			rj++;
		}
		/*
		 * [ri, rj) holds need; skip it if [ri + 1, rj) does too, else
		 * screen it.  The screen passes every window that could beat
		 * the best: a wait clearly less than b.w is less, and one not
		 * clearly more is at most b.thr (see struct best); the least
		 * key of its end fragments, k, bounds its minimum distance
		 * from above, so a window that ties on wait and beats or ties
		 * b.m has k > b.m, or k == b.m and then needs a summed
		 * urgency of at most b.u (all ones while there is no best).
		 * One branch for all of it: each test alone would
		 * often mispredict.
		 */
		s = ri->size;
		w = ri->wait;
		d = ri->urg;
		k = ri->key < rj[-1].key ? ri->key : rj[-1].key;
		usum = (u128)uhi << 64 | ulo;
		if ((size - s < need) & (wsum <= b.thr) &
		    ((wsum < b.w) | (k > b.m) | ((k == b.m) & (usum <= b.u))))
			score_consider(&b, ri - r, rj - r, wsum, usum);
		size -= s;
		wsum -= w;
		uhi -= ulo < d;
		ulo -= d;
		nwait -= w > 0;
		if (nwait == 0)
			wsum = 0;	/* drop rounding residue exactly */
		ri++;
	}
done:
	return best_window(&b, first, last, wait_s);
}

/* ---- fifo and lru ---------------------------------------------------- */

static int cand_cmp(const void *a, const void *b)
{
	const struct ent *x = &scratch[*(const uint32_t *)a];
	const struct ent *y = &scratch[*(const uint32_t *)b];

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->f->off < y->f->off ? -1 : x->f->off > y->f->off;
}

static bool ready(const struct ent *e)
{
	return !e->barrier && e->wait == 0;
}

/*
 * Smallest j in [k, hi] with pre[j + 1] - pre[k] >= need, given that
 * pre[hi + 1] - pre[k] >= need.
 */
static uint32_t grow_right(const uint64_t *pre, uint32_t k, uint32_t hi,
			   uint64_t need)
{
	uint32_t lo = k;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (pre[mid + 1] - pre[k] >= need)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/*
 * Largest i in [lo, k] with pre[end + 1] - pre[i] >= need, given that
 * pre[end + 1] - pre[lo] >= need.
 */
static uint32_t grow_left(const uint64_t *pre, uint32_t lo, uint32_t k,
			  uint32_t end, uint64_t need)
{
	while (lo < k) {
		uint32_t mid = lo + (k - lo + 1) / 2;

		if (pre[end + 1] - pre[mid] >= need)
			lo = mid;
		else
			k = mid - 1;
	}
	return lo;
}

static int order_choose(struct cache *c, uint64_t need,
			evict_cost_fn cost, const struct evict_ctx *ctx,
			struct frag **first, struct frag **last, double *wait_s,
			bool lru)
{
	long n = gather(c, cost, ctx, lru ? KEY_LAST_USE : KEY_SEQ);
	uint32_t k, m = 0, x;
	uint64_t *pre;
	uint32_t *cand;

	if (n < 0)
		return (int)n;
	if (aux_reserve((size_t)n))
		return -ENOMEM;
	pre = pre_buf;
	cand = cand_buf;
	if (need == 0)
		need = 1;

	/* prefix sums and maximal runs of ready fragments */
	pre[0] = 0;
	for (k = 0; k < n; k++) {
		pre[k + 1] = pre[k] + scratch[k].size;
		if (ready(&scratch[k]))
			scratch[k].run_lo = k > 0 && ready(&scratch[k - 1]) ?
					    scratch[k - 1].run_lo : k;
	}
	for (k = (uint32_t)n; k-- > 0; )
		if (ready(&scratch[k]))
			scratch[k].run_hi = k + 1 < n && ready(&scratch[k + 1]) ?
					    scratch[k + 1].run_hi : k;

	for (k = 0; k < n; k++)
		if (scratch[k].f->copy && ready(&scratch[k]))
			cand[m++] = k;
	qsort(cand, m, sizeof(*cand), cand_cmp);

	for (x = 0; x < m; x++) {
		const struct ent *e = &scratch[cand[x]];
		uint32_t lo = e->run_lo, hi = e->run_hi;

		k = cand[x];
		if (pre[hi + 1] - pre[lo] < need)
			continue;
		if (pre[hi + 1] - pre[k] >= need) {
			*first = e->f;
			*last = scratch[grow_right(pre, k, hi, need)].f;
		} else {
			*first = scratch[grow_left(pre, lo, k, hi, need)].f;
			*last = scratch[hi].f;
		}
		*wait_s = 0;
		return 0;
	}
	/* no copy needs to go: a single gap large enough (below usable) */
	for (k = 0; k < n; k++) {
		if (!scratch[k].f->copy && !scratch[k].barrier &&
		    scratch[k].size >= need) {
			*first = *last = scratch[k].f;
			*wait_s = 0;
			return 0;
		}
	}
	return -ENOSPC;
}

static int fifo_choose(struct cache *c, uint64_t need,
		       evict_cost_fn cost, const struct evict_ctx *ctx,
		       struct frag **first, struct frag **last, double *wait_s)
{
	return order_choose(c, need, cost, ctx, first, last, wait_s, false);
}

static int lru_choose(struct cache *c, uint64_t need,
		      evict_cost_fn cost, const struct evict_ctx *ctx,
		      struct frag **first, struct frag **last, double *wait_s)
{
	return order_choose(c, need, cost, ctx, first, last, wait_s, true);
}

/* The three policies; see the top of this file. */
const struct evict_policy evict_score = { "score", score_choose };
const struct evict_policy evict_fifo = { "fifo", fifo_choose };
const struct evict_policy evict_lru = { "lru", lru_choose };

/*
 * Policy named name ("score", "fifo", "lru"; exact, case-sensitive), or
 * NULL when there is none.
 */
const struct evict_policy *evict_policy_find(const char *name)
{
	static const struct evict_policy *const all[] = {
		&evict_score, &evict_fifo, &evict_lru,
	};
	size_t i;

	if (!name)
		return NULL;
	for (i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (strcmp(all[i]->name, name) == 0)
			return all[i];
	return NULL;
}
