/*
 * balance.h - checkpoint load balancing between the GPUs of one node
 * (-o balance=maxflow|greedy|host|mincost): where the part of each GPU's
 * checkpoint that does not fit in its own cache goes, computed on the CPU.
 *
 * The model (a node, one moment: every GPU checkpoints at once).
 *
 *   - N GPUs (1..BALANCE_MAX_GPUS).  GPU i has ckpt[i] bytes to place now
 *     and free[i] bytes of free cache.
 *   - Local first: GPU i keeps min(ckpt[i], free[i]) bytes in its own cache,
 *     written at local_bw[i].  Its overflow r[i] = ckpt[i] - that goes to
 *     peers' spare room (spare[j] = free[j] - min(ckpt[j], free[j])) or to
 *     host memory; a GPU's free space is shared between its own data and
 *     what peers send it, and its own data comes first.  Every policy keeps
 *     this rule (as the MASCOTS'21 schedules do); the optimum below is the
 *     optimum among plans that keep it.
 *   - Links, each a resource of its own, directed:
 *       local i    GPU i into its own memory, local_bw[i];
 *       peer i->j  peer_bw[i][j] (NVLink, or PCIe peer-to-peer; 0: no peer
 *                  access, nothing may go that way);
 *       host g     a link to host memory, host_bw[g], shared by every GPU i
 *                  with host_link[i] == g: GPUs behind one PCIe switch share
 *                  its uplink (host_link[i] = i: a link of its own per GPU).
 *     Host memory holds at most host_free bytes (BALANCE_HOST_UNLIMITED).
 *   - Time: a link carries its bytes at its bandwidth, whether its
 *     transfers take turns or share it fairly (the last byte leaves at
 *     bytes / bw either way: the link is busy from time 0 until then);
 *     different links run in parallel.  The blocking time of the group is
 *     the end of the last transfer: the maximum over links of bytes / bw.
 *   - Not modelled: a PCIe peer transfer also uses the GPUs' PCIe lanes
 *     that carry their host traffic (give peer_bw[i][j] as measured with
 *     that traffic, or 0); a GPU's HBM bandwidth shared between its local
 *     write and what it sends; latency and per-transfer set-up.
 *
 * Policies:
 *   BALANCE_HOST     the baseline: the overflow goes to host memory.
 *   BALANCE_GREEDY   MASCOTS'21 greedy: GPUs by largest overflow first, each
 *                    fills its peers' spare room fastest link first, the
 *                    rest goes to host memory.  O(N^3).
 *   BALANCE_MAXFLOW  min-time: the least blocking time over all plans (to
 *                    within one byte per link), by parametric max-flow: T
 *                    is feasible iff a flow with capacities T*bw on every
 *                    link places every overflow; the least T is found by
 *                    Newton steps on min cuts (exact, a few max-flows);
 *                    among the plans of that T it takes one of least cost
 *                    (a byte to a peer costs 1, to host memory 3: GPU
 *                    memory preferred).
 *   BALANCE_MINCOST  the MASCOTS'21 min-time max-flow as the paper states
 *                    it: the overflow cut into about BALANCE_UNITS units,
 *                    successive shortest paths, each unit on a link raising
 *                    the link's cost by its unit transfer time.  That is a
 *                    min-cost flow with convex costs: it minimises the sum
 *                    of the units' finish times, not the latest one, and
 *                    can be well above the optimum (two GPUs sharing one
 *                    peer's spare room over links of unequal speed: see
 *                    tests/unit/test_balance.c), besides the units' rounding
 *                    (spare room is used in whole units).  Kept to compare.
 *
 * Nothing here allocates or takes a lock: a plan is computed on the
 * caller's stack (about 20 KiB for BALANCE_MAXFLOW and BALANCE_MINCOST).
 */
#ifndef TIERFS_BALANCE_H
#define TIERFS_BALANCE_H

#include <stdint.h>

#define BALANCE_MAX_GPUS	16
/* ckpt, free and host_free (unless unlimited) are at most this */
#define BALANCE_MAX_BYTES	(1ULL << 56)
#define BALANCE_HOST_UNLIMITED	UINT64_MAX
/* BALANCE_MINCOST cuts the total overflow into about this many units */
#define BALANCE_UNITS		256

enum balance_policy {
	BALANCE_HOST,
	BALANCE_GREEDY,
	BALANCE_MAXFLOW,
	BALANCE_MINCOST,
	BALANCE_NPOLICIES
};

struct balance_node {
	unsigned n;					/* GPUs, 1..BALANCE_MAX_GPUS */
	uint64_t ckpt[BALANCE_MAX_GPUS];		/* bytes GPU i checkpoints now */
	uint64_t free[BALANCE_MAX_GPUS];		/* free bytes in GPU i's cache */
	double local_bw[BALANCE_MAX_GPUS];		/* bytes/s into its own memory, > 0 */
	double peer_bw[BALANCE_MAX_GPUS][BALANCE_MAX_GPUS]; /* i->j bytes/s, 0 = no peer access; [i][i] ignored */
	unsigned host_link[BALANCE_MAX_GPUS];		/* GPU i's host link, < n */
	double host_bw[BALANCE_MAX_GPUS];		/* bytes/s of host link g (> 0 where used) */
	uint64_t host_free;				/* bytes host memory takes, or BALANCE_HOST_UNLIMITED */
};

struct balance_plan {
	unsigned n;					/* as the node's */
	uint64_t to_gpu[BALANCE_MAX_GPUS][BALANCE_MAX_GPUS]; /* bytes of GPU i's checkpoint into GPU j's cache ([i][i]: its own) */
	uint64_t to_host[BALANCE_MAX_GPUS];		/* bytes of GPU i's checkpoint to host memory */
	double time;					/* its blocking time, seconds */
};

/*
 * Compute the plan of policy p for node n into *out.  Returns 0, -EINVAL
 * (n, out or p invalid: no GPU or more than BALANCE_MAX_GPUS, a bandwidth
 * negative, NaN or infinite, local_bw or a used host_bw not > 0, a
 * host_link out of range, a size over BALANCE_MAX_BYTES) or -ENOSPC (the
 * overflow does not fit in the peers' spare room it can reach and host
 * memory; BALANCE_GREEDY and BALANCE_HOST give it also where the policy's
 * own rule leaves bytes over, BALANCE_MINCOST where whole units do not
 * fit; -EDOM, BALANCE_MAXFLOW not converging, would be a bug).  On error
 * *out is zeroed.  Allocates nothing.
 */
int balance_plan(const struct balance_node *n, enum balance_policy p,
		 struct balance_plan *out);

/*
 * The blocking time of any plan under the model: the maximum over links
 * of bytes / bandwidth.  INFINITY when the plan sends bytes over a link
 * without bandwidth, NaN when the node is invalid or the plan's n is not
 * the node's.  Does not check capacities: balance_plan_check() does.
 */
double balance_blocking_time(const struct balance_node *n,
			     const struct balance_plan *p);

/*
 * 0 if plan p is valid for node n: every checkpoint placed exactly, no
 * GPU's cache given more than its free space, host memory no more than
 * host_free, no bytes over a missing link.  -EINVAL otherwise.
 */
int balance_plan_check(const struct balance_node *n,
		       const struct balance_plan *p);

/* "host", "greedy", "maxflow", "mincost" -> *p; 0 or -EINVAL. */
int balance_policy_parse(const char *s, enum balance_policy *p);
/* The name balance_policy_parse() takes; "?" for an invalid value. */
const char *balance_policy_name(enum balance_policy p);

#endif
