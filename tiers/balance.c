/*
 * balance.c - checkpoint load balancing between the GPUs of one node: the
 * plans of balance.h's policies and their blocking time under its model.
 *
 * Pure computation: no lock, no allocation, no state between calls (a
 * plan's flow network lives on the caller's stack).  Called by whoever
 * places a group's checkpoints (-o balance=...), by tests/unit/test_balance
 * and bench/bench_balance.
 *
 * The flow network of BALANCE_MAXFLOW and BALANCE_MINCOST (only the
 * overflow is placed; each GPU's local part is fixed, see balance.h):
 *
 *   S --r[i]--> G_i --peer i->j--> R_j --spare[j]--> T
 *                   \--> H_g --host link g--> HS --host_free--> T
 *
 * G_i is GPU i as a sender, R_j GPU j as a receiver, H_g host link g (the
 * arcs G_i -> H_{host_link[i]} are unbounded), HS host memory.  A link's
 * arc carries its bytes.  BALANCE_MAXFLOW gives a link arc the capacity
 * T * bw: a plan of blocking time T exists iff the max flow is the whole
 * overflow D.  The min cut's capacity c(T) = min over cuts of (a + b*T) is
 * concave and piecewise linear; Newton's method from below (T' = (D - a) /
 * b for the min cut (a, b) at T) rises to the least T with c(T) >= D in a
 * few steps, each a max flow, and never passes it (but for a margin of
 * 1e-13 against rounding).  Capacities are whole bytes, ceil(T * bw): a
 * link may end one byte past T, never more.  At the least T, a min-cost
 * flow (a byte to a peer costs 1, to host memory 3) picks the plan.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "balance.h"

/* ---- the node -------------------------------------------------------- */

static bool bw_ok(double bw)
{
	return isfinite(bw) && bw >= 0;
}

static int node_check(const struct balance_node *n)
{
	if (!n || n->n == 0 || n->n > BALANCE_MAX_GPUS)
		return -EINVAL;
	if (n->host_free > BALANCE_MAX_BYTES && n->host_free != BALANCE_HOST_UNLIMITED)
		return -EINVAL;
	for (unsigned i = 0; i < n->n; i++) {
		if (n->ckpt[i] > BALANCE_MAX_BYTES || n->free[i] > BALANCE_MAX_BYTES)
			return -EINVAL;
		if (!bw_ok(n->local_bw[i]) || n->local_bw[i] == 0)
			return -EINVAL;
		if (n->host_link[i] >= n->n)
			return -EINVAL;
		if (!bw_ok(n->host_bw[n->host_link[i]]) || n->host_bw[n->host_link[i]] == 0)
			return -EINVAL;
		for (unsigned j = 0; j < n->n; j++)
			if (j != i && !bw_ok(n->peer_bw[i][j]))
				return -EINVAL;
	}
	return 0;
}

/* Local first: each GPU's own part, overflow and spare room. */
struct split {
	uint64_t r[BALANCE_MAX_GPUS];		/* overflow of GPU i */
	uint64_t spare[BALANCE_MAX_GPUS];	/* room left in GPU j for peers */
	uint64_t d;				/* sum of r */
	double tlocal;				/* the slowest local write, s */
};

static void split_node(const struct balance_node *n, struct split *sp,
		       struct balance_plan *out)
{
	sp->d = 0;
	sp->tlocal = 0;
	for (unsigned i = 0; i < n->n; i++) {
		uint64_t loc = n->ckpt[i] < n->free[i] ? n->ckpt[i] : n->free[i];

		out->to_gpu[i][i] = loc;
		sp->r[i] = n->ckpt[i] - loc;
		sp->spare[i] = n->free[i] - loc;
		sp->d += sp->r[i];		/* <= 16 * 2^56: no overflow */
		if ((double)loc / n->local_bw[i] > sp->tlocal)
			sp->tlocal = (double)loc / n->local_bw[i];
	}
}

/* ---- the flow network ------------------------------------------------ */

#define BF_MAXV		(3 * BALANCE_MAX_GPUS + 3)
#define BF_MAXA		(BALANCE_MAX_GPUS * (BALANCE_MAX_GPUS + 3) + 1)
#define BF_S		0
#define BF_T		1
#define BF_HS		2
#define BF_G(i)		(3 + (i))
#define BF_R(n, j)	(3 + (n) + (j))
#define BF_H(n, g)	(3 + 2 * (n) + (g))

enum { ARC_OTHER, ARC_PEER, ARC_HOST };

struct bf_arc {
	int64_t cap;		/* capacity now */
	int64_t flow;		/* 0 <= flow <= cap */
	int64_t ccap;		/* the capacity when pbw == 0 */
	double pbw;		/* > 0: capacity T * pbw (a link, bytes/s) */
	double cost;		/* cost per unit */
	double conv;		/* the k-th unit costs cost + k * conv more */
	uint8_t from, to;
	uint8_t kind, i, j;	/* ARC_PEER i->j, ARC_HOST from GPU i */
};

/*
 * Residual edge e is arc e / 2 forward (e even) or backward (e odd).
 * Forward: capacity cap - flow, cost of the next unit cost + (flow+1) *
 * conv.  Backward: capacity flow, cost -(cost + flow * conv), the saving
 * of taking the last unit back.
 */
struct bf_graph {
	int nv, na;
	int16_t head[BF_MAXV];
	int16_t next[2 * BF_MAXA];
	struct bf_arc a[BF_MAXA];
};

static void bf_init(struct bf_graph *g, int nv)
{
	g->nv = nv;
	g->na = 0;
	for (int v = 0; v < nv; v++)
		g->head[v] = -1;
}

static struct bf_arc *bf_add(struct bf_graph *g, int from, int to)
{
	struct bf_arc *x = &g->a[g->na];
	int e = 2 * g->na++;

	memset(x, 0, sizeof(*x));
	x->from = (uint8_t)from;
	x->to = (uint8_t)to;
	g->next[e] = g->head[from];
	g->head[from] = (int16_t)e;
	g->next[e + 1] = g->head[to];
	g->head[to] = (int16_t)(e + 1);
	return x;
}

static inline int64_t bf_rcap(const struct bf_graph *g, int e)
{
	const struct bf_arc *x = &g->a[e >> 1];

	return e & 1 ? x->flow : x->cap - x->flow;
}

static inline double bf_rcost(const struct bf_graph *g, int e)
{
	const struct bf_arc *x = &g->a[e >> 1];

	if (e & 1)
		return -(x->cost + (double)x->flow * x->conv);
	return x->cost + (double)(x->flow + 1) * x->conv;
}

static inline int bf_head(const struct bf_graph *g, int e)
{
	return e & 1 ? g->a[e >> 1].from : g->a[e >> 1].to;
}

static inline int bf_tail(const struct bf_graph *g, int e)
{
	return e & 1 ? g->a[e >> 1].to : g->a[e >> 1].from;
}

/*
 * Cheapest S -> T path in the residual graph (Bellman-Ford with a queue):
 * pred[v] is the residual edge into v.  Every cost is a whole number (see
 * bf_build) and every sum of them is exact in a double, so the paths are
 * truly the cheapest and the residual graph of the flow never holds a
 * negative cycle: each vertex is popped at most nv - 1 times.  (Costs in
 * seconds per unit, about 1e-11, once made a comparison with a tolerance
 * skip improvements of that size; the flow then drifted from the optimum
 * into a negative cycle, and the search ran out of pops with a cycle in
 * pred: mincost returned -ENOSPC with unlimited host memory.)  The bound
 * on pops stays as a guard.
 */
static bool bf_shortest(const struct bf_graph *g, int *pred)
{
	double d[BF_MAXV];
	bool inq[BF_MAXV];
	int q[BF_MAXV + 1], qh = 0, qt = 0, pops = 0;

	for (int v = 0; v < g->nv; v++) {
		d[v] = INFINITY;
		inq[v] = false;
		pred[v] = -1;
	}
	d[BF_S] = 0;
	q[qt++] = BF_S;
	inq[BF_S] = true;
	while (qh != qt && pops++ < 4 * g->nv * g->nv) {
		int u = q[qh];

		qh = (qh + 1) % (BF_MAXV + 1);
		inq[u] = false;
		for (int e = g->head[u]; e >= 0; e = g->next[e]) {
			int v = bf_head(g, e);
			double nd;

			if (bf_rcap(g, e) <= 0)
				continue;
			nd = d[u] + bf_rcost(g, e);
			if (nd < d[v]) {
				d[v] = nd;
				pred[v] = e;
				if (!inq[v]) {
					inq[v] = true;
					q[qt] = v;
					qt = (qt + 1) % (BF_MAXV + 1);
				}
			}
		}
	}
	return pred[BF_T] >= 0;
}

/*
 * Successive shortest paths from S to T until want units flow or no path
 * is left; one unit at a time where unit (the convex costs change with
 * every unit), else the path's bottleneck.  Returns the flow.
 */
static int64_t bf_flow(struct bf_graph *g, int64_t want, bool unit)
{
	int pred[BF_MAXV];
	int64_t f = 0;

	while (f < want && bf_shortest(g, pred)) {
		int64_t push = want - f;
		int len = 0;

		for (int v = BF_T; v != BF_S; v = bf_tail(g, pred[v])) {
			if (bf_rcap(g, pred[v]) < push)
				push = bf_rcap(g, pred[v]);
			if (++len > g->nv)	/* a cycle of rounding noise */
				return f;
		}
		if (unit)
			push = 1;
		for (int v = BF_T; v != BF_S; v = bf_tail(g, pred[v])) {
			int e = pred[v];

			g->a[e >> 1].flow += e & 1 ? -push : push;
		}
		f += push;
	}
	return f;
}

/*
 * The convex cost of a unit over a link of bw bytes/s: its time, unit /
 * bw, as a whole number of ticks.  A tick is the slowest link's unit time
 * over BF_TICKS; with at most BF_MAXV edges of at most (inf + 1) * BF_TICKS
 * on a path (inf <= 2 * BALANCE_UNITS + BALANCE_MAX_GPUS + 1), every path
 * cost stays below 2^53, exact in a double.  Rounding changes a link's
 * cost by at most 2^-38 of the slowest's: nothing a plan would notice.
 */
#define BF_TICKS	((double)(1ull << 38))

static double bf_conv(double bw, double min_bw)
{
	/* min_bw <= bw: 0 < c <= BF_TICKS (the cast rounds, no libm) */
	double c = (double)(uint64_t)(min_bw / bw * BF_TICKS + 0.5);

	return c < 1 ? 1 : c;
}

/*
 * The network of a node's overflow: link arcs with capacity T * bw
 * (exact: BALANCE_MAXFLOW) or unbounded with convex costs of unit bytes
 * (BALANCE_MINCOST); inf is more than any flow.
 */
static void bf_build(struct bf_graph *g, const struct balance_node *n,
		     const struct split *sp, bool exact, uint64_t unit, int64_t inf)
{
	unsigned nn = n->n;
	bool hused[BALANCE_MAX_GPUS] = { false };
	double min_bw = INFINITY;
	struct bf_arc *x;

	/* the slowest link any unit may take: the tick of bf_conv() */
	for (unsigned i = 0; i < nn; i++) {
		if (!sp->r[i])
			continue;
		for (unsigned j = 0; j < nn; j++)
			if (j != i && n->peer_bw[i][j] > 0 && sp->spare[j] &&
			    n->peer_bw[i][j] < min_bw)
				min_bw = n->peer_bw[i][j];
		if (n->host_bw[n->host_link[i]] < min_bw)
			min_bw = n->host_bw[n->host_link[i]];
	}
	bf_init(g, 3 + 3 * (int)nn);
	for (unsigned i = 0; i < nn; i++) {
		if (!sp->r[i])
			continue;
		x = bf_add(g, BF_S, BF_G(i));
		x->ccap = (int64_t)((sp->r[i] + unit - 1) / unit);
		for (unsigned j = 0; j < nn; j++) {
			double bw = n->peer_bw[i][j];

			if (j == i || bw <= 0 || !sp->spare[j])
				continue;
			x = bf_add(g, BF_G(i), BF_R(nn, j));
			x->kind = ARC_PEER;
			x->i = (uint8_t)i;
			x->j = (uint8_t)j;
			if (exact) {
				x->pbw = bw;
				x->cost = 1;
			} else {
				x->ccap = inf;
				x->conv = bf_conv(bw, min_bw);
			}
		}
		x = bf_add(g, BF_G(i), BF_H(nn, n->host_link[i]));
		x->kind = ARC_HOST;
		x->i = (uint8_t)i;
		x->ccap = inf;
		x->cost = exact ? 3 : 0;
		hused[n->host_link[i]] = true;
	}
	for (unsigned j = 0; j < nn; j++) {
		if (!sp->spare[j])
			continue;
		x = bf_add(g, BF_R(nn, j), BF_T);
		x->ccap = sp->spare[j] / unit < (uint64_t)inf ? (int64_t)(sp->spare[j] / unit) : inf;
	}
	for (unsigned h = 0; h < nn; h++) {
		if (!hused[h])
			continue;
		x = bf_add(g, BF_H(nn, h), BF_HS);
		if (exact) {
			x->pbw = n->host_bw[h];
		} else {
			x->ccap = inf;
			x->conv = bf_conv(n->host_bw[h], min_bw);
		}
	}
	x = bf_add(g, BF_HS, BF_T);
	x->ccap = n->host_free / unit < (uint64_t)inf ? (int64_t)(n->host_free / unit) : inf;
}

static void bf_extract(const struct bf_graph *g, uint64_t unit,
		       struct balance_plan *out)
{
	for (int k = 0; k < g->na; k++) {
		const struct bf_arc *x = &g->a[k];

		if (x->kind == ARC_PEER)
			out->to_gpu[x->i][x->j] = (uint64_t)x->flow * unit;
		else if (x->kind == ARC_HOST)
			out->to_host[x->i] = (uint64_t)x->flow * unit;
	}
}

/* ---- the policies ---------------------------------------------------- */

static int plan_host(const struct balance_node *n, const struct split *sp,
		     struct balance_plan *out)
{
	if (n->host_free != BALANCE_HOST_UNLIMITED && sp->d > n->host_free)
		return -ENOSPC;
	for (unsigned i = 0; i < n->n; i++)
		out->to_host[i] = sp->r[i];
	return 0;
}

static int plan_greedy(const struct balance_node *n, const struct split *sp,
		       struct balance_plan *out)
{
	unsigned order[BALANCE_MAX_GPUS], m = 0;
	uint64_t spare[BALANCE_MAX_GPUS];
	uint64_t hleft = n->host_free;

	memcpy(spare, sp->spare, sizeof(spare));
	/* largest overflow first (ties: lower index first) */
	for (unsigned i = 0; i < n->n; i++) {
		unsigned k;

		if (!sp->r[i])
			continue;
		for (k = m++; k > 0 && sp->r[order[k - 1]] < sp->r[i]; k--)
			order[k] = order[k - 1];
		order[k] = i;
	}
	for (unsigned o = 0; o < m; o++) {
		unsigned i = order[o];
		uint64_t rem = sp->r[i];

		/* the fastest peer with room, again and again */
		while (rem) {
			int best = -1;

			for (unsigned j = 0; j < n->n; j++)
				if (j != i && spare[j] && n->peer_bw[i][j] > 0 &&
				    (best < 0 || n->peer_bw[i][j] > n->peer_bw[i][best]))
					best = (int)j;
			if (best < 0)
				break;
			uint64_t x = rem < spare[best] ? rem : spare[best];

			out->to_gpu[i][best] += x;
			spare[best] -= x;
			rem -= x;
		}
		if (rem && n->host_free != BALANCE_HOST_UNLIMITED) {
			if (rem > hleft)
				return -ENOSPC;
			hleft -= rem;
		}
		out->to_host[i] = rem;
	}
	return 0;
}

/* Newton steps are a few in practice; the bound only stops a bug. */
#define BF_NEWTON_MAX	1000

static int plan_maxflow(const struct balance_node *n, const struct split *sp,
			struct balance_plan *out)
{
	struct bf_graph g;
	int64_t d = (int64_t)sp->d, inf = d + 1;
	long double t = sp->tlocal;	/* no plan ends before the local writes */
	int it;

	if (!d)
		return 0;
	bf_build(&g, n, sp, true, 1, inf);
	for (it = 0; it < BF_NEWTON_MAX; it++) {
		bool reach[BF_MAXV] = { false };
		int q[BF_MAXV], qn = 0;
		long double a = 0, b = 0, tn;

		for (int k = 0; k < g.na; k++) {
			struct bf_arc *x = &g.a[k];

			x->flow = 0;
			if (x->pbw > 0) {
				long double c = ceill(t * x->pbw);

				x->cap = c >= (long double)inf ? inf : (int64_t)c;
			} else {
				x->cap = x->ccap;
			}
		}
		if (bf_flow(&g, d, false) == d)
			break;
		/* the min cut: what S still reaches */
		reach[BF_S] = true;
		q[qn++] = BF_S;
		while (qn) {
			int u = q[--qn];

			for (int e = g.head[u]; e >= 0; e = g.next[e]) {
				int v = bf_head(&g, e);

				if (!reach[v] && bf_rcap(&g, e) > 0) {
					reach[v] = true;
					q[qn++] = v;
				}
			}
		}
		for (int k = 0; k < g.na; k++) {
			const struct bf_arc *x = &g.a[k];

			if (!reach[x->from] || reach[x->to])
				continue;
			if (x->pbw > 0)
				b += x->pbw;
			else
				a += x->ccap;
		}
		if (b == 0)		/* no link in the cut: no T is enough */
			return -ENOSPC;
		/*
		 * At tn the cut's capacity is d (a little more: rounding must
		 * not bring the same cut back); it may still not be the min.
		 */
		tn = (d - a) / b * (1 + 1e-13L);
		t = tn > t ? tn : t * (1 + 1e-12L) + 1e-15L;
	}
	if (it == BF_NEWTON_MAX)
		return -EDOM;
	bf_extract(&g, 1, out);
	return 0;
}

static int plan_mincost(const struct balance_node *n, const struct split *sp,
			struct balance_plan *out)
{
	struct bf_graph g;
	uint64_t unit = (sp->d + BALANCE_UNITS - 1) / BALANCE_UNITS, want = 0;
	int64_t inf;

	if (!sp->d)
		return 0;
	if (!unit)
		unit = 1;
	for (unsigned i = 0; i < n->n; i++)
		want += (sp->r[i] + unit - 1) / unit;
	inf = (int64_t)want + 1;
	bf_build(&g, n, sp, false, unit, inf);
	for (int k = 0; k < g.na; k++)
		g.a[k].cap = g.a[k].ccap;
	if (bf_flow(&g, (int64_t)want, true) != (int64_t)want)
		return -ENOSPC;
	bf_extract(&g, unit, out);
	/* whole units place up to unit - 1 bytes too many: take them back */
	for (unsigned i = 0; i < n->n; i++) {
		uint64_t over = (sp->r[i] + unit - 1) / unit * unit - sp->r[i];
		uint64_t *most = &out->to_host[i];

		for (unsigned j = 0; j < n->n; j++)
			if (j != i && out->to_gpu[i][j] > *most)
				most = &out->to_gpu[i][j];
		*most -= over;		/* over < unit <= *most when over > 0 */
	}
	return 0;
}

/* ---- the interface --------------------------------------------------- */

int balance_plan(const struct balance_node *n, enum balance_policy p,
		 struct balance_plan *out)
{
	struct split sp;
	int ret;

	if (!out)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	if (node_check(n) || (unsigned)p >= BALANCE_NPOLICIES)
		return -EINVAL;
	out->n = n->n;
	split_node(n, &sp, out);
	switch (p) {
	case BALANCE_HOST:
		ret = plan_host(n, &sp, out);
		break;
	case BALANCE_GREEDY:
		ret = plan_greedy(n, &sp, out);
		break;
	case BALANCE_MAXFLOW:
		ret = plan_maxflow(n, &sp, out);
		break;
	default:
		ret = plan_mincost(n, &sp, out);
		break;
	}
	if (ret) {
		memset(out, 0, sizeof(*out));
		return ret;
	}
	out->time = balance_blocking_time(n, out);
	return 0;
}

double balance_blocking_time(const struct balance_node *n,
			     const struct balance_plan *p)
{
	double host[BALANCE_MAX_GPUS] = { 0 }, t = 0;

	if (node_check(n) || !p || p->n != n->n)
		return NAN;
	for (unsigned i = 0; i < n->n; i++) {
		for (unsigned j = 0; j < n->n; j++) {
			double bw = j == i ? n->local_bw[i] : n->peer_bw[i][j];

			if (!p->to_gpu[i][j])
				continue;
			if (bw <= 0)
				return INFINITY;
			if ((double)p->to_gpu[i][j] / bw > t)
				t = (double)p->to_gpu[i][j] / bw;
		}
		host[n->host_link[i]] += (double)p->to_host[i];
	}
	for (unsigned h = 0; h < n->n; h++)
		if (host[h] > 0 && host[h] / n->host_bw[h] > t)
			t = host[h] / n->host_bw[h];
	return t;
}

int balance_plan_check(const struct balance_node *n,
		       const struct balance_plan *p)
{
	uint64_t got[BALANCE_MAX_GPUS] = { 0 }, host = 0;

	if (node_check(n) || !p || p->n != n->n)
		return -EINVAL;
	for (unsigned i = 0; i < n->n; i++) {
		uint64_t sum = p->to_host[i];

		if (__builtin_add_overflow(host, p->to_host[i], &host))
			return -EINVAL;
		for (unsigned j = 0; j < n->n; j++) {
			if (__builtin_add_overflow(sum, p->to_gpu[i][j], &sum) ||
			    __builtin_add_overflow(got[j], p->to_gpu[i][j], &got[j]))
				return -EINVAL;
			if (j != i && p->to_gpu[i][j] && !(n->peer_bw[i][j] > 0))
				return -EINVAL;
		}
		if (sum != n->ckpt[i])
			return -EINVAL;
	}
	for (unsigned j = 0; j < n->n; j++)
		if (got[j] > n->free[j])
			return -EINVAL;
	if (n->host_free != BALANCE_HOST_UNLIMITED && host > n->host_free)
		return -EINVAL;
	return 0;
}

static const char *const balance_names[BALANCE_NPOLICIES] = {
	[BALANCE_HOST] = "host",
	[BALANCE_GREEDY] = "greedy",
	[BALANCE_MAXFLOW] = "maxflow",
	[BALANCE_MINCOST] = "mincost",
};

int balance_policy_parse(const char *s, enum balance_policy *p)
{
	if (!s || !p)
		return -EINVAL;
	for (int k = 0; k < BALANCE_NPOLICIES; k++)
		if (!strcmp(s, balance_names[k])) {
			*p = (enum balance_policy)k;
			return 0;
		}
	return -EINVAL;
}

const char *balance_policy_name(enum balance_policy p)
{
	return (unsigned)p < BALANCE_NPOLICIES ? balance_names[p] : "?";
}
