/*
 * test_evict.c - eviction policies of tiers/evict.c against brute force.
 *
 * Random allocation tables (built with cache.c: variable sizes, gaps,
 * copies whose wait is 0, some seconds, or TIER_INF - sometimes all equal,
 * rarely negative, NaN or above TIER_INF - and whose distance is small,
 * large or TIER_FAR - sometimes all TIER_FAR, as without restore hints,
 * sometimes mostly TIER_FAR among a few hints, sometimes a few small
 * values and TIER_FAR, so that minima tie often;
 * insertion numbers (copy.seq) in offset order, shuffled, reversed or with
 * many ties (and a few UINT64_MAX); sometimes with usable < size) are
 * handed to each policy with a random need:
 *
 *  - score: the brute force tries every window [i, j] of consecutive
 *    fragments (no barrier, >= need, and minimal: dropping either end
 *    fragment leaves < need) and keeps the least summed wait, then the
 *    largest minimum distance over its copies (gaps do not count; TIER_FAR
 *    when it holds none), then the least summed urgency (2^63 / (distance
 *    + 1) per hinted copy, 0 for unhinted copies and gaps), then the least
 *    age (maximum seq of its copies, 0 for gaps), then the lowest offset.
 *    The policy must find a window exactly when the brute force does, its
 *    window must itself qualify, its sums, minimum and age must equal the
 *    optimum (wait within 1e-9, the rest exactly), and it must be the
 *    brute force's window
 *    (the waits drawn are dyadic, so both sum them exactly and the lowest
 *    offset rule leaves no freedom).
 *  - fifo/lru: a plain linear re-statement of the rule (copies by seq or
 *    last_use, grow right then left over ready fragments) must give the
 *    same window; the window holds only gaps and ready copies, and
 *    -ENOSPC comes exactly when no such window exists.
 *  - every policy calls cost() at most once per fragment, never for a gap,
 *    and leaves the table as it was.
 *  - a replay of a small write stream without hints, copies of 1-8 blocks:
 *    score must hit at least as often as fifo.
 *
 * Usage: test_evict [seed].  Without one: a fixed seed (TIERFS_RANDOM_SEED=1:
 * one from the clock).  The seed is printed; exit 0 pass, 1 fail.
 */
#include <malloc.h>
#include <pthread.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier.h"
#include "testutil.h"

#define TABLES		20000
#define MAXCOPY		400
#define MAXFRAG		(2 * MAXCOPY + 2)

typedef unsigned __int128 u128;

struct tcopy {
	struct copy cp;
	double wait;
	uint64_t dist;
	int calls;		/* cost() calls in the current decision */
};

static uint64_t seed;
static long table_no;
static struct cache c;
static struct tcopy copies[MAXCOPY];
static int gap_calls;

/* the table as arrays, for the reference searches */
static struct frag *fr[MAXFRAG];
static uint64_t fsz[MAXFRAG];		/* clipped to usable */
static bool fbar[MAXFRAG];
static long double fw[MAXFRAG];
static uint64_t fd[MAXFRAG];		/* urgency; 0 for gaps */
static uint64_t fkey[MAXFRAG];		/* distance, TIER_FAR for gaps */
static uint64_t fseq[MAXFRAG];		/* copy.seq, 0 for gaps */
static int nf;

static long n_found[3], n_nospc[3];
static long n_age;		/* score decisions the age tie-break settled */
static long n_min;		/* ... where the summed urgency alone would
				 * have chosen another */

static void dump_table(void)
{
	int i;

	fprintf(stderr, "table (size %" PRIu64 ", usable %" PRIu64 "):\n",
		c.size, c.usable);
	for (i = 0; i < nf; i++) {
		fprintf(stderr, "  [%d] off %" PRIu64 " size %" PRIu64, i,
			fr[i]->off / TIER_ALIGN, fr[i]->size / TIER_ALIGN);
		if (!fr[i]->copy) {
			fprintf(stderr, " gap\n");
			continue;
		}
		fprintf(stderr, " wait %g dist %" PRIu64 " seq %" PRIu64
			" last_use %" PRIu64 "%s\n", (double)fw[i], fkey[i],
			fr[i]->copy->seq, fr[i]->copy->last_use,
			fbar[i] ? " BARRIER" : "");
	}
}

static void fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "test_evict: FAIL (seed %" PRIu64 ", table %ld): ",
		seed, table_no);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	dump_table();
	exit(1);
}

#define ENSURE(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)

static struct tcopy *tc_of(struct copy *cp)
{
	return (struct tcopy *)((char *)cp - offsetof(struct tcopy, cp));
}

static struct evict_cost test_cost(struct cache *cc, struct frag *f,
				     const struct evict_ctx *ctx)
{
	struct evict_cost k = { 0, 0 };
	struct tcopy *t;

	ENSURE(cc == &c, "cost() for another cache");
	if (!f->copy) {
		gap_calls++;
		return k;
	}
	t = tc_of(f->copy);
	t->calls++;
	k.wait = t->wait;
	k.dist = t->dist;
	return k;
}

static double pick_wait(int mix)
{
	static const double waits[] = { 0.25, 0.5, 1, 1.5, 2, 3.75, 10 };
	uint64_t r = rnd_below(100);

	if (rnd_below(200) == 0) {	/* odd values: < 0 is 0, NaN a barrier */
		static const double odd[] = { -1.5, -0.0, 1e31 };

		return rnd_below(4) ? odd[rnd_below(3)] : __builtin_nan("");
	}
	switch (mix) {
	case 4:		/* every copy flushing, all the same wait */
		return 0.5;
	case 5:		/* two values: many equal sums */
		return r < 50 ? 0 : 1;
	case 0:		/* mostly ready */
		return r < 70 ? 0 : r < 95 ? waits[rnd_below(7)] : TIER_INF;
	case 1:		/* flush-heavy, few ties */
		return r < 20 ? 0 : r < 85 ?
		       (double)(1 + rnd_below(1000000)) / 1024.0 : TIER_INF;
	case 2:		/* barrier-heavy */
		return r < 40 ? 0 : r < 60 ? waits[rnd_below(7)] : TIER_INF;
	default:	/* all ready */
		return 0;
	}
}

static uint64_t pick_dist(int dmix)
{
	uint64_t r = rnd_below(100);

	if (dmix == 1)		/* no restore hints at all */
		return TIER_FAR;
	if (dmix == 2)		/* a few hints among unhinted copies */
		return r < 85 ? TIER_FAR : rnd_below(4);
	if (dmix == 3)		/* few values: many equal minima */
		return r < 40 ? TIER_FAR : rnd_below(3);
	if (r < 20)
		return TIER_FAR;
	if (r < 30)
		return UINT64_MAX - 1 - rnd_below(1000);
	if (r < 40)
		return 0;
	return rnd_below(50);
}

/*
 * Give the placed copies new insertion numbers: as placed (offset order),
 * a random permutation, reversed, or drawn from a small range (ties).
 */
static void draw_seq(void)
{
	static uint64_t perm[MAXCOPY];
	int i, m = 0, smix = (int)rnd_below(4);

	if (smix == 0)
		return;
	for (i = 0; i < MAXCOPY; i++)
		if (copies[i].cp.frag) {
			perm[m] = (uint64_t)m + 1;
			m++;
		}
	for (i = m - 1; i > 0; i--) {		/* Fisher-Yates */
		int k = (int)rnd_below((uint64_t)i + 1);
		uint64_t x = perm[i];

		perm[i] = perm[k];
		perm[k] = x;
	}
	m = 0;
	for (i = 0; i < MAXCOPY; i++) {
		struct copy *cp = &copies[i].cp;

		if (!cp->frag)
			continue;
		if (smix == 1)
			cp->seq = perm[m];
		else if (smix == 2)
			cp->seq = (uint64_t)(MAXCOPY - i);
		else if (rnd_below(50))
			cp->seq = 1 + rnd_below(4);
		else
			cp->seq = UINT64_MAX;
		m++;
	}
}

/*
 * A random table: fill with copies of random sizes, then release some to
 * make gaps.  Costs, insertion numbers, last_use and usable are drawn too.
 */
static void build_table(void)
{
	uint64_t nblk = 1 + rnd_below(rnd_below(4) ? 300 : 3000);
	uint64_t maxsz = 1 + rnd_below(rnd_below(2) ? 8 : 64);
	int i, mix = (int)rnd_below(6), dmix = (int)rnd_below(5);
	struct frag *f;

	ENSURE(cache_init(&c, "t", 0, NULL, nblk * TIER_ALIGN, &tier_host_ops,
			  &evict_score) == 0, "init");
	for (i = 0; i < MAXCOPY; i++) {
		struct tcopy *t = &copies[i];
		uint64_t sz = (1 + rnd_below(maxsz)) * TIER_ALIGN;

		memset(t, 0, sizeof(*t));
		if (sz > TIER_ALIGN && rnd_below(2))
			sz -= rnd_below(TIER_ALIGN);
		if (cache_place(&c, &t->cp, sz))
			t->cp.cache = NULL;
	}
	for (i = 0; i < MAXCOPY; i++) {
		struct tcopy *t = &copies[i];

		if (t->cp.frag && rnd_below(100) < 35) {
			cache_release(&c, &t->cp);
			t->cp.cache = NULL;
		}
		t->wait = pick_wait(mix);
		t->dist = pick_dist(dmix);
		t->cp.last_use = rnd_below(rnd_below(2) ? 10 : 100000);
	}
	draw_seq();
	if (rnd_below(5) == 0)
		c.usable = rnd_below(c.size / TIER_ALIGN + 1) * TIER_ALIGN;
	ENSURE(cache_check(&c) == 0, "built table");

	nf = 0;
	for (f = c.head; f; f = f->next, nf++) {
		fr[nf] = f;
		fbar[nf] = f->off >= c.usable;
		fsz[nf] = fbar[nf] ? 0 :
			  (f->off + f->size > c.usable ? c.usable - f->off
						       : f->size);
		fw[nf] = 0;
		fd[nf] = 0;
		fkey[nf] = TIER_FAR;
		fseq[nf] = 0;
		if (f->copy && !fbar[nf]) {
			struct tcopy *t = tc_of(f->copy);

			fbar[nf] = !(t->wait < TIER_INF);	/* also NaN */
			fw[nf] = fbar[nf] || !(t->wait > 0) ? 0 : t->wait;
			fd[nf] = t->dist == TIER_FAR ? 0 :
				 (UINT64_C(1) << 63) / (t->dist + 1);
			fkey[nf] = t->dist;
			fseq[nf] = f->copy->seq;
		}
	}
}

static void destroy_table(void)
{
	int i;

	for (i = 0; i < MAXCOPY; i++)
		if (copies[i].cp.frag)
			cache_release(&c, &copies[i].cp);
	cache_destroy(&c);
}

static int index_of(const struct frag *f)
{
	int i;

	for (i = 0; i < nf; i++)
		if (fr[i] == f)
			return i;
	return -1;
}

static bool wait_less(long double a, long double b)
{
	long double m = a > b ? a : b;	/* sums are >= 0 */

	return a < b - 1e-9L * (m > 1 ? m : 1);
}

/*
 * Sums over [i, j], its minimum distance (copies only) and its age
 * (maximum seq); false if it holds a barrier.
 */
static bool window_sums(int i, int j, uint64_t *sz, long double *w,
			uint64_t *m, u128 *d, uint64_t *age)
{
	int k;

	*sz = 0;
	*w = 0;
	*m = TIER_FAR;
	*d = 0;
	*age = 0;
	for (k = i; k <= j; k++) {
		if (fbar[k])
			return false;
		*sz += fsz[k];
		*w += fw[k];
		if (fkey[k] < *m)
			*m = fkey[k];
		*d += fd[k];
		if (fseq[k] > *age)
			*age = fseq[k];
	}
	return true;
}

static bool window_qualifies(int i, int j, uint64_t need)
{
	uint64_t sz, m, age;
	long double w;
	u128 d;

	if (i < 0 || j < i || !window_sums(i, j, &sz, &w, &m, &d, &age))
		return false;
	return sz >= need && sz - fsz[i] < need && sz - fsz[j] < need;
}

static void before_decision(uint64_t *nfr, uint64_t *ngp, uint64_t *used)
{
	int i;

	for (i = 0; i < MAXCOPY; i++)
		copies[i].calls = 0;
	gap_calls = 0;
	*nfr = c.nfrags;
	*ngp = c.ngaps;
	*used = c.used;
}

static void after_decision(const char *pol, uint64_t nfr, uint64_t ngp,
			   uint64_t used)
{
	int i;

	ENSURE(gap_calls == 0, "%s: cost() asked about %d gaps", pol,
	       gap_calls);
	for (i = 0; i < MAXCOPY; i++)
		ENSURE(copies[i].calls <= 1, "%s: cost() called %d times for "
		       "one copy", pol, copies[i].calls);
	ENSURE(nfr == c.nfrags && ngp == c.ngaps && used == c.used &&
	       cache_check(&c) == 0, "%s changed the table", pol);
}

/*
 * The 4-level order: least wait, then largest minimum distance, then
 * least summed urgency, then least age.
 */
static bool better(long double w, uint64_t m, u128 d, uint64_t age,
		   long double bw, uint64_t bm, u128 bd, uint64_t bage)
{
	if (wait_less(w, bw))
		return true;
	if (wait_less(bw, w))
		return false;
	if (m != bm)
		return m > bm;
	if (d != bd)
		return d < bd;
	return age < bage;
}

static void check_score(uint64_t need)
{
	struct frag *first = NULL, *last = NULL;
	long double best_w = 0, w;
	u128 best_d = 0, d;
	uint64_t nfr, ngp, used, sz, m, age, best_m = 0, best_age = 0;
	bool found = false, by_age = false, by_min = false;
	double ws = -1;
	int i, j, ret, fi, li, bi = -1, bj = -1;

	/* brute force: every window [i, j], sums grown with j; on a full tie
	 * the first (lowest offset) window stays */
	for (i = 0; i < nf; i++) {
		sz = 0;
		w = 0;
		m = TIER_FAR;
		d = 0;
		age = 0;
		for (j = i; j < nf && !fbar[j]; j++) {
			sz += fsz[j];
			w += fw[j];
			if (fkey[j] < m)
				m = fkey[j];
			d += fd[j];
			if (fseq[j] > age)
				age = fseq[j];
			if (sz < need || sz - fsz[i] >= need ||
			    sz - fsz[j] >= need)
				continue;
			if (!found || better(w, m, d, age, best_w, best_m,
					     best_d, best_age)) {
				best_w = w;
				best_m = m;
				best_d = d;
				best_age = age;
				bi = i;
				bj = j;
				found = true;
			}
		}
	}

	/* coverage: did another window tie on wait, minimum and summed
	 * urgency, or tie on wait with a less summed urgency? */
	for (i = 0; found && i < nf; i++) {
		sz = 0;
		w = 0;
		m = TIER_FAR;
		d = 0;
		age = 0;
		for (j = i; j < nf && !fbar[j]; j++) {
			sz += fsz[j];
			w += fw[j];
			if (fkey[j] < m)
				m = fkey[j];
			d += fd[j];
			if (fseq[j] > age)
				age = fseq[j];
			if (sz < need || sz - fsz[i] >= need ||
			    sz - fsz[j] >= need || wait_less(w, best_w) ||
			    wait_less(best_w, w))
				continue;
			by_age |= m == best_m && d == best_d &&
				  age != best_age;
			by_min |= d < best_d;
		}
	}
	n_age += by_age;
	n_min += by_min;

	before_decision(&nfr, &ngp, &used);
	ret = evict_score.choose(&c, need, test_cost, NULL, &first, &last, &ws);
	after_decision("score", nfr, ngp, used);
	if (!found) {
		ENSURE(ret == -ENOSPC, "score: need %" PRIu64 ": got %d, brute "
		       "force found nothing", need, ret);
		n_nospc[0]++;
		return;
	}
	ENSURE(ret == 0, "score: need %" PRIu64 ": got %d, brute force found "
	       "wait %Lg", need, ret, best_w);
	fi = index_of(first);
	li = index_of(last);
	ENSURE(window_qualifies(fi, li, need), "score: window [%d, %d] does "
	       "not qualify for need %" PRIu64, fi, li, need);
	window_sums(fi, li, &sz, &w, &m, &d, &age);
	ENSURE(!wait_less(w, best_w) && !wait_less(best_w, w),
	       "score: window [%d, %d] waits %Lg, optimum %Lg", fi, li, w,
	       best_w);
	ENSURE(m == best_m, "score: window [%d, %d] minimum distance %"
	       PRIu64 ", optimum %" PRIu64, fi, li, m, best_m);
	ENSURE(d == best_d, "score: window [%d, %d] urgency %.6Le, optimum "
	       "%.6Le", fi, li, (long double)d, (long double)best_d);
	ENSURE(age == best_age, "score: window [%d, %d] age (max seq) %"
	       PRIu64 ", optimum %" PRIu64, fi, li, age, best_age);
	ENSURE(fi == bi && li == bj, "score: need %" PRIu64 ": window [%d, "
	       "%d], brute force [%d, %d]", need, fi, li, bi, bj);
	ENSURE((long double)ws - w <= 1e-6L * (1 + w) &&
	       w - (long double)ws <= 1e-6L * (1 + w),
	       "score: reported wait %g, window sums %Lg", ws, w);
	n_found[0]++;
}

static bool ready(int k)
{
	return !fbar[k] && fw[k] == 0;
}

/* The fifo/lru rule, stated plainly (linear scans, no prefix sums). */
static bool ref_order(bool lru, uint64_t need, int *fi, int *li)
{
	int order[MAXFRAG], m = 0, a, b, k, x;

	for (k = 0; k < nf; k++)
		if (fr[k]->copy && ready(k))
			order[m++] = k;
	/* insertion sort by key, offset order among equals */
	for (a = 1; a < m; a++) {
		int v = order[a];
		uint64_t kv = lru ? fr[v]->copy->last_use : fr[v]->copy->seq;

		for (b = a; b > 0; b--) {
			int u = order[b - 1];
			uint64_t ku = lru ? fr[u]->copy->last_use
					  : fr[u]->copy->seq;

			if (ku < kv || (ku == kv && u < v))
				break;
			order[b] = u;
		}
		order[b] = v;
	}
	for (x = 0; x < m; x++) {
		uint64_t sz = 0;
		int r, l;

		k = order[x];
		for (r = k; r < nf && ready(r); r++) {
			sz += fsz[r];
			if (sz >= need)
				break;
		}
		if (sz >= need) {
			*fi = k;
			*li = r;
			return true;
		}
		r--;		/* last ready fragment on the right */
		for (l = k - 1; l >= 0 && ready(l); l--) {
			sz += fsz[l];
			if (sz >= need)
				break;
		}
		if (sz >= need) {
			*fi = l;
			*li = r;
			return true;
		}
	}
	for (k = 0; k < nf; k++) {
		if (!fr[k]->copy && !fbar[k] && fsz[k] >= need) {
			*fi = *li = k;
			return true;
		}
	}
	return false;
}

static void check_order(const struct evict_policy *p, bool lru,
			uint64_t need)
{
	struct frag *first = NULL, *last = NULL;
	uint64_t nfr, ngp, used, sz = 0;
	int ret, fi, li, wi = -1, wl = -1, k;
	int slot = lru ? 2 : 1;
	bool want;
	double ws = -1;

	want = ref_order(lru, need, &wi, &wl);
	before_decision(&nfr, &ngp, &used);
	ret = p->choose(&c, need, test_cost, NULL, &first, &last, &ws);
	after_decision(p->name, nfr, ngp, used);
	if (!want) {
		ENSURE(ret == -ENOSPC, "%s: need %" PRIu64 ": got %d, want "
		       "-ENOSPC", p->name, need, ret);
		n_nospc[slot]++;
		return;
	}
	ENSURE(ret == 0, "%s: need %" PRIu64 ": got %d, want [%d, %d]",
	       p->name, need, ret, wi, wl);
	fi = index_of(first);
	li = index_of(last);
	ENSURE(fi >= 0 && li >= fi, "%s: bad window", p->name);
	for (k = fi; k <= li; k++) {
		ENSURE(ready(k), "%s: window [%d, %d] holds fragment %d that "
		       "is not ready", p->name, fi, li, k);
		sz += fsz[k];
	}
	ENSURE(sz >= need, "%s: window holds %" PRIu64 " < %" PRIu64,
	       p->name, sz, need);
	ENSURE(ws == 0, "%s: wait %g", p->name, ws);
	ENSURE(fi == wi && li == wl, "%s: need %" PRIu64 ": window [%d, %d], "
	       "want [%d, %d]", p->name, need, fi, li, wi, wl);
	n_found[slot]++;
}

static uint64_t pick_need(void)
{
	uint64_t top = c.usable ? c.usable : TIER_ALIGN;

	switch (rnd_below(5)) {
	case 0:
		return 1 + rnd_below(top + top / 8);
	case 1:
		return (1 + rnd_below(4)) * TIER_ALIGN;
	case 2:
		return 1 + rnd_below(32 * TIER_ALIGN);
	default:
		return 1 + rnd_below(top / 4 + 1);
	}
}

/* Hand-made cases with a known answer. */
static void fixed_cases(void)
{
	struct frag *first, *last;
	double ws;
	int i, ret;

	table_no = -1;
	ENSURE(evict_policy_find("score") == &evict_score, "find score");
	ENSURE(evict_policy_find("fifo") == &evict_fifo, "find fifo");
	ENSURE(evict_policy_find("lru") == &evict_lru, "find lru");
	ENSURE(evict_policy_find("LRU") == NULL, "find LRU");
	ENSURE(evict_policy_find("") == NULL, "find empty");
	ENSURE(evict_policy_find(NULL) == NULL, "find NULL");

	/* 8 one-block copies, all flushing: fifo and lru never wait */
	ENSURE(cache_init(&c, "f", 0, NULL, 8 * TIER_ALIGN, &tier_host_ops,
			  &evict_fifo) == 0, "init");
	for (i = 0; i < 8; i++) {
		memset(&copies[i], 0, sizeof(copies[i]));
		ENSURE(cache_place(&c, &copies[i].cp, TIER_ALIGN) == 0, "place");
		copies[i].wait = 2.0;
		copies[i].dist = (uint64_t)i;
	}
	nf = 0;
	ret = evict_fifo.choose(&c, TIER_ALIGN, test_cost, NULL, &first, &last, &ws);
	ENSURE(ret == -ENOSPC, "fifo with nothing ready: %d", ret);
	ret = evict_lru.choose(&c, TIER_ALIGN, test_cost, NULL, &first, &last, &ws);
	ENSURE(ret == -ENOSPC, "lru with nothing ready: %d", ret);
	/* score waits: the two copies with the least wait */
	copies[5].wait = 0.5;
	copies[6].wait = 0.25;
	copies[2].wait = 0.25;
	ret = evict_score.choose(&c, 2 * TIER_ALIGN, test_cost, NULL, &first, &last,
				 &ws);
	ENSURE(ret == 0 && first == copies[5].cp.frag &&
	       last == copies[6].cp.frag && ws > 0.75 - 1e-12 &&
	       ws < 0.75 + 1e-12,
	       "score picks [5, 6]: %d", ret);
	/* equal wait: the larger minimum distance wins (TIER_FAR is largest) */
	for (i = 0; i < 8; i++)
		copies[i].wait = 0;
	copies[3].dist = TIER_FAR;
	ret = evict_score.choose(&c, TIER_ALIGN, test_cost, NULL, &first, &last, &ws);
	ENSURE(ret == 0 && first == last && first == copies[3].cp.frag &&
	       ws == 0, "score picks the copy without a hint");
	/* a barrier in the middle: nothing spans it */
	copies[3].wait = TIER_INF;
	ret = evict_score.choose(&c, 5 * TIER_ALIGN, test_cost, NULL, &first, &last,
				 &ws);
	ENSURE(ret == -ENOSPC, "score across a barrier: %d", ret);
	ret = evict_score.choose(&c, 4 * TIER_ALIGN, test_cost, NULL, &first, &last,
				 &ws);
	ENSURE(ret == 0 && first == copies[4].cp.frag &&
	       last == copies[7].cp.frag, "score beside a barrier");
	ret = evict_fifo.choose(&c, 4 * TIER_ALIGN, test_cost, NULL, &first, &last,
				&ws);
	ENSURE(ret == 0 && first == copies[4].cp.frag &&
	       last == copies[7].cp.frag, "fifo grows right past its run");
	ret = evict_fifo.choose(&c, 3 * TIER_ALIGN, test_cost, NULL, &first, &last,
				&ws);
	ENSURE(ret == 0 && first == copies[0].cp.frag &&
	       last == copies[2].cp.frag, "fifo from the oldest");
	/* oldest's run too short on the right: grow left */
	copies[1].wait = 1;
	for (i = 0; i < 8; i++)
		copies[i].cp.last_use = i == 6 ? 0 : 10 + (uint64_t)i;
	ret = evict_lru.choose(&c, 3 * TIER_ALIGN, test_cost, NULL, &first, &last,
			       &ws);
	ENSURE(ret == 0 && first == copies[5].cp.frag &&
	       last == copies[7].cp.frag, "lru grows left");
	for (i = 0; i < 8; i++)
		cache_release(&c, &copies[i].cp);
	cache_destroy(&c);
}

/*
 * The flaw of summing distances: [consumed, TIER_FAR, 1 block][needed
 * next, dist 0, 1 block][gap, 1 block][dist 20, 2 blocks], all ready, need
 * 2 blocks.  Summed distance puts [consumed, next] first (2^64 - 1 > 20)
 * and evicts the copy about to be read; the minimum puts the dist-20 copy
 * first (20 > 0).  [next, gap] has minimum 0, [gap, dist 20] is not
 * minimal (the gap can be dropped).
 */
static void min_dist_case(void)
{
	struct frag *first, *last;
	double ws;
	int i, ret;

	table_no = -3;
	ENSURE(cache_init(&c, "m", 0, NULL, 5 * TIER_ALIGN, &tier_host_ops,
			  &evict_score) == 0, "init");
	for (i = 0; i < 4; i++) {
		memset(&copies[i], 0, sizeof(copies[i]));
		ENSURE(cache_place(&c, &copies[i].cp, (i == 3 ? 2 : 1) *
				   TIER_ALIGN) == 0, "place");
		copies[i].cp.seq = (uint64_t)i + 1;
	}
	cache_release(&c, &copies[2].cp);	/* the gap */
	copies[0].dist = TIER_FAR;		/* consumed: no hint left */
	copies[1].dist = 0;			/* next in the restore queue */
	copies[3].dist = 20;
	ENSURE(cache_check(&c) == 0 && c.nfrags == 4 && c.ngaps == 1,
	       "min case: table");
	ret = evict_score.choose(&c, 2 * TIER_ALIGN, test_cost, NULL, &first, &last,
				 &ws);
	ENSURE(ret == 0 && first == last && first == copies[3].cp.frag &&
	       ws == 0, "min case: score picks [%s, %s], want the dist-20 "
	       "copy", first == copies[0].cp.frag ? "consumed" :
	       first == copies[1].cp.frag ? "next" : "other",
	       last == copies[1].cp.frag ? "next" :
	       last == copies[3].cp.frag ? "dist 20" : "other");
	/* with the next-needed copy hinted far, its window's minimum wins */
	copies[1].dist = 30;
	ret = evict_score.choose(&c, 2 * TIER_ALIGN, test_cost, NULL, &first, &last,
				 &ws);
	ENSURE(ret == 0 && first == copies[0].cp.frag &&
	       last == copies[1].cp.frag, "min case: minima 30 > 20");
	/* equal minima: the unhinted copy adds no urgency, so the windows
	 * tie on it too, and the older ([consumed, next], seq 2) wins */
	copies[1].dist = 20;
	ret = evict_score.choose(&c, 2 * TIER_ALIGN, test_cost, NULL, &first, &last,
				 &ws);
	ENSURE(ret == 0 && first == copies[0].cp.frag &&
	       last == copies[1].cp.frag, "min case: equal minima, age");
	for (i = 0; i < 4; i++)
		if (copies[i].cp.frag)
			cache_release(&c, &copies[i].cp);
	cache_destroy(&c);
}

/* copies[k] sits at fragment index k of a table of equal one-block copies */
static int copy_at(const struct frag *f)
{
	int i;

	for (i = 0; i < MAXCOPY; i++)
		if (copies[i].cp.frag == f)
			return i;
	return -1;
}

/*
 * The summed urgency among equal minima: [d 50, 1 block][d 60, 1 block]
 * [d 10, 2 blocks][d 100, 2 blocks], need 4 blocks.  The minimal windows
 * [50, 60, 10] and [10, 100] both hold the d-10 copy; a summed distance
 * (120 > 110) evicts three copies, two of them needed before the d-100
 * one; the least summed urgency keeps them and evicts [10, 100].
 */
static void urgency_case(void)
{
	static const uint64_t dist[4] = { 50, 60, 10, 100 };
	static const uint64_t blocks[4] = { 1, 1, 2, 2 };
	struct frag *first, *last;
	double ws;
	int i, ret;

	table_no = -4;
	ENSURE(cache_init(&c, "u", 0, NULL, 6 * TIER_ALIGN, &tier_host_ops,
			  &evict_score) == 0, "init");
	for (i = 0; i < 4; i++) {
		memset(&copies[i], 0, sizeof(copies[i]));
		ENSURE(cache_place(&c, &copies[i].cp, blocks[i] * TIER_ALIGN)
		       == 0, "place");
		copies[i].cp.seq = (uint64_t)i + 1;
		copies[i].dist = dist[i];
	}
	ret = evict_score.choose(&c, 4 * TIER_ALIGN, test_cost, NULL, &first,
				 &last, &ws);
	ENSURE(ret == 0 && first == copies[2].cp.frag &&
	       last == copies[3].cp.frag, "urgency case: score picks [%d, %d], "
	       "want [2, 3]", copy_at(first), copy_at(last));
	for (i = 0; i < 4; i++)
		cache_release(&c, &copies[i].cp);
	cache_destroy(&c);
}

/*
 * No hints, variable sizes: [4 one-block copies, seq 10-13][one 4-block
 * copy, seq 5], need 4 blocks.  Every copy is TIER_FAR; counting each as
 * a distance of 2^64 - 1 made the four young copies the larger sum, and
 * score evicted them rather than the one old copy that fifo evicts.
 */
static void no_hint_sizes_case(void)
{
	struct frag *first, *last;
	double ws;
	int i, ret;

	table_no = -5;
	ENSURE(cache_init(&c, "v", 0, NULL, 8 * TIER_ALIGN, &tier_host_ops,
			  &evict_score) == 0, "init");
	for (i = 0; i < 5; i++) {
		memset(&copies[i], 0, sizeof(copies[i]));
		ENSURE(cache_place(&c, &copies[i].cp, (i == 4 ? 4 : 1) *
				   TIER_ALIGN) == 0, "place");
		copies[i].cp.state = TS_FLUSHED;
		copies[i].cp.seq = i == 4 ? 5 : 10 + (uint64_t)i;
		copies[i].dist = TIER_FAR;
	}
	ret = evict_score.choose(&c, 4 * TIER_ALIGN, test_cost, NULL, &first,
				 &last, &ws);
	ENSURE(ret == 0 && first == last && first == copies[4].cp.frag,
	       "no hints, sizes: score picks [%d, %d], want the old 4-block "
	       "copy [4]", copy_at(first), copy_at(last));
	ret = evict_fifo.choose(&c, 4 * TIER_ALIGN, test_cost, NULL, &first,
				&last, &ws);
	ENSURE(ret == 0 && first == last && first == copies[4].cp.frag,
	       "no hints, sizes: fifo picks the old copy");
	for (i = 0; i < 5; i++)
		cache_release(&c, &copies[i].cp);
	cache_destroy(&c);
}

/*
 * A write stream without restore hints, as a mount sees it: a 64-block
 * cache, REPLAY_WRITES copies of 1-8 blocks (flushed at once: wait 0,
 * TIER_FAR), each followed by a read of one of the last 32.  Returns the
 * hits of policy p (a miss is not cached, a hit refreshes last_use).
 */
#define REPLAY_WRITES	3000

static long replay_hits(const struct evict_policy *p)
{
	static struct tcopy rc[REPLAY_WRITES];
	uint64_t rs = 0x9e3779b97f4a7c15ULL, tick = 0;
	long t, hits = 0;

	memset(rc, 0, sizeof(rc));
	ENSURE(cache_init(&c, "r", 0, NULL, 64 * TIER_ALIGN, &tier_host_ops,
			  p) == 0, "init");
	for (t = 0; t < REPLAY_WRITES; t++) {
		uint64_t sz;

		rs ^= rs << 13;
		rs ^= rs >> 7;
		rs ^= rs << 17;
		sz = (1 + rs % 8) * TIER_ALIGN;
		rc[t].dist = TIER_FAR;
		while (cache_place(&c, &rc[t].cp, sz)) {
			struct frag *first, *last;
			double ws;

			ENSURE(p->choose(&c, sz, test_cost, NULL, &first, &last,
					 &ws) == 0, "replay %s: write %ld: no "
			       "window", p->name, t);
			cache_evict_window(&c, first, last, NULL);
		}
		rc[t].cp.state = TS_FLUSHED;
		rc[t].cp.last_use = ++tick;
		if (t > 0) {
			long back = 1 + (long)((rs >> 32) % 32);
			struct tcopy *r = &rc[t >= back ? t - back : 0];

			if (r->cp.frag) {
				hits++;
				r->cp.last_use = ++tick;
			}
		}
	}
	ENSURE(cache_check(&c) == 0, "replay %s: table", p->name);
	for (t = 0; t < REPLAY_WRITES; t++)
		if (rc[t].cp.frag)
			cache_release(&c, &rc[t].cp);
	cache_destroy(&c);
	return hits;
}

static void no_hint_replay(void)
{
	long hs, hf;

	table_no = -6;
	hs = replay_hits(&evict_score);
	hf = replay_hits(&evict_fifo);
	printf("test_evict: no-hint replay, %d writes of 1-8 blocks: score %ld "
	       "hits, fifo %ld\n", REPLAY_WRITES, hs, hf);
	ENSURE(hs >= hf, "no-hint replay: score %ld hits < fifo %ld", hs, hf);
}

/*
 * No restore hints: equal-size FLUSHED copies, all ready and TIER_FAR, so
 * waits and distances tie and only the age tie-break tells windows apart.
 * Insertion numbers are out of offset order.
 */
static void no_hint_cases(void)
{
	static const uint64_t seqs[8] = { 5, 3, 8, 1, 7, 2, 6, 4 };
	struct frag *first, *last;
	uint64_t next_seq = 9;
	double ws;
	int i, k, ret, fi, fl;

	table_no = -2;
	ENSURE(cache_init(&c, "h", 0, NULL, 8 * TIER_ALIGN, &tier_host_ops,
			  &evict_score) == 0, "init");
	for (i = 0; i < 8; i++) {
		memset(&copies[i], 0, sizeof(copies[i]));
		ENSURE(cache_place(&c, &copies[i].cp, TIER_ALIGN) == 0, "place");
		copies[i].cp.state = TS_FLUSHED;
		copies[i].cp.seq = seqs[i];
		copies[i].cp.last_use = seqs[i];
		copies[i].wait = 0;
		copies[i].dist = TIER_FAR;
	}
	/* one block: the oldest copy (seq 1, at index 3), as fifo takes */
	ret = evict_score.choose(&c, TIER_ALIGN, test_cost, NULL, &first, &last, &ws);
	ENSURE(ret == 0 && first == last && first == copies[3].cp.frag &&
	       ws == 0, "no hints: score picks [%d, %d], want the oldest "
	       "copy [3]", copy_at(first), copy_at(last));
	ret = evict_fifo.choose(&c, TIER_ALIGN, test_cost, NULL, &first, &last, &ws);
	ENSURE(ret == 0 && first == last && first == copies[3].cp.frag,
	       "no hints: fifo picks the oldest copy");
	/* two blocks: the window whose youngest copy is oldest, {5, 3} at
	 * [0, 1] (fifo takes [3, 4] = {1, 7}, evicting the 2nd newest) */
	ret = evict_score.choose(&c, 2 * TIER_ALIGN, test_cost, NULL, &first, &last,
				 &ws);
	ENSURE(ret == 0 && first == copies[0].cp.frag &&
	       last == copies[1].cp.frag, "no hints: score picks [%d, %d] "
	       "for two blocks, want [0, 1]", copy_at(first), copy_at(last));
	/* one hinted copy, even the oldest: an unhinted one goes first */
	copies[3].dist = 2;
	ret = evict_score.choose(&c, TIER_ALIGN, test_cost, NULL, &first, &last, &ws);
	ENSURE(ret == 0 && first == last && first == copies[5].cp.frag,
	       "hint on the oldest: score picks [%d], want the oldest "
	       "unhinted copy [5]", copy_at(first));
	copies[3].dist = TIER_FAR;

	/*
	 * The mount's write stream: each new copy evicts one, chosen by score.
	 * The cache must always hold the 8 newest copies (what fifo keeps);
	 * lowest-offset tie-breaking kept recycling block 0 instead.
	 */
	for (k = 0; k < 24; k++) {
		ret = evict_score.choose(&c, TIER_ALIGN, test_cost, NULL, &first,
					 &last, &ws);
		ENSURE(ret == 0 && first == last, "stream %d: %d", k, ret);
		fi = copy_at(first);
		ENSURE(fi >= 0 && copies[fi].cp.seq == next_seq - 8,
		       "stream %d: score evicts seq %" PRIu64 ", want the "
		       "oldest %" PRIu64, k, fi >= 0 ? copies[fi].cp.seq : 0,
		       next_seq - 8);
		cache_evict_window(&c, first, last, NULL);
		ENSURE(cache_place(&c, &copies[fi].cp, TIER_ALIGN) == 0,
		       "stream %d: place", k);
		copies[fi].cp.seq = next_seq++;
		ENSURE(cache_check(&c) == 0, "stream %d: table", k);
	}
	for (i = 0, fl = 0; i < 8; i++)
		fl += copies[i].cp.seq >= next_seq - 8;
	ENSURE(fl == 8, "stream: %d of the 8 newest copies cached", fl);
	for (i = 0; i < 8; i++)
		cache_release(&c, &copies[i].cp);
	cache_destroy(&c);
}

/* ---- per-thread buffers go with their thread -------------------------- */

#define TB_FRAGS	20000
#define TB_THREADS	16

static struct cache tb_cache;
static struct copy tb_copies[TB_FRAGS];

static struct evict_cost tb_cost(struct cache *cc, struct frag *f,
				     const struct evict_ctx *ctx)
{
	struct evict_cost k = { 0, TIER_FAR };

	(void)cc;
	(void)f;
	return k;
}

static void *tb_decide(void *arg)
{
	struct frag *first, *last;
	double w;

	(void)arg;
	ENSURE(evict_score.choose(&tb_cache, 8 * TIER_ALIGN, tb_cost, NULL, &first, &last, &w) == 0,
	       "score decision");
	ENSURE(evict_fifo.choose(&tb_cache, 8 * TIER_ALIGN, tb_cost, NULL, &first, &last, &w) == 0,
	       "fifo decision");
	return NULL;
}

/*
 * Threads that made eviction decisions and exited leave nothing behind:
 * each decision over TB_FRAGS fragments grows its thread's buffers to
 * about 65 bytes a fragment, which leaked at every thread's exit.
 */
static void thread_buffers_freed(void)
{
	struct mallinfo2 before, after;
	pthread_t th;
	int i;

	ENSURE(cache_init(&tb_cache, "tb", 0, NULL, (uint64_t)TB_FRAGS * TIER_ALIGN,
			  &tier_host_ops, &evict_score) == 0, "init");
	for (i = 0; i < TB_FRAGS; i++)
		ENSURE(cache_place(&tb_cache, &tb_copies[i], TIER_ALIGN) == 0, "place");
	for (i = 0; i < TB_FRAGS; i++)
		tb_copies[i].state = TS_FLUSHED;
	pthread_create(&th, NULL, tb_decide, NULL);	/* warm up libc's own */
	pthread_join(th, NULL);
	before = mallinfo2();
	for (i = 0; i < TB_THREADS; i++) {
		pthread_create(&th, NULL, tb_decide, NULL);
		pthread_join(th, NULL);
	}
	after = mallinfo2();
	/* the buffers are big enough to be mmap'ed chunks (hblkhd), which
	 * mallinfo2() counts whichever arena they came from */
	ENSURE(after.hblkhd < before.hblkhd + (size_t)TB_FRAGS * 8,
	       "threads' decision buffers not freed at exit");
	for (i = 0; i < TB_FRAGS; i++)
		cache_release(&tb_cache, &tb_copies[i]);
	cache_destroy(&tb_cache);
	printf("test_evict: per-thread buffers freed at thread exit "
	       "(%zu bytes mapped before %d threads, %zu after)\n",
	       before.hblkhd, TB_THREADS, after.hblkhd);
}

int main(int argc, char **argv)
{
	long t;

	seed = tu_seed("test_evict:", argc > 1 ? argv[1] : NULL, NULL, 0x5c0eULL, NULL);
	rng_state = seed * 0x9e3779b97f4a7c15ULL + 1;
	if (!rng_state)
		rng_state = 1;
	fixed_cases();
	thread_buffers_freed();
	no_hint_cases();
	min_dist_case();
	urgency_case();
	no_hint_sizes_case();
	no_hint_replay();
	for (t = 0; t < TABLES; t++) {
		int q;

		table_no = t;
		build_table();
		for (q = 0; q < 4; q++) {
			uint64_t need = pick_need();

			check_score(need);
			check_order(&evict_fifo, false, need);
			check_order(&evict_lru, true, need);
		}
		destroy_table();
	}
	printf("test_evict: ok (%d tables; windows found/-ENOSPC: score "
	       "%ld/%ld (%ld settled by age, %ld by minimum over sum), fifo "
	       "%ld/%ld, lru %ld/%ld)\n", TABLES, n_found[0], n_nospc[0],
	       n_age, n_min, n_found[1], n_nospc[1], n_found[2], n_nospc[2]);
	return 0;
}
