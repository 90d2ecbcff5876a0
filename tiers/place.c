/*
 * place.c - placing a copy in a cache tier, evicting what the policy says,
 * and a copy's attachment to and release from its file.
 *
 * Owns: the eviction inputs (copy_cost(): how long until a copy is
 * evictable, how soon its file is read again), eng_alloc_wait() (decide,
 * evict, wait for flushes), the copy <-> file references (eng_attach_copy,
 * eng_copy_evicted, eng_defer_put) and dropping stale copies.  Everything
 * here runs with e->lock held; eng_alloc_wait() drops it only while it
 * waits on e->room, eng_drop_copy() while it waits on e->unpinned.  Calls
 * cache.c, evict.c (through c->policy) and gpu_tier.c; takes no other
 * lock.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "balance.h"
#include "engine_int.h"
#include "gpu_tier.h"

/* ---- eviction --------------------------------------------------------- */

/* Prefetch distance of cp's file: its place in the restore queue. */
uint64_t eng_copy_dist(struct engine *e, struct copy *cp)
{
	uint64_t seq = cp->file->hint_seq;

	if (!seq || seq < e->hint_head)
		return TIER_FAR;
	return seq - e->hint_head;
}

/*
 * The restore-queue ticket from which on the GPU tier cannot hold the
 * queue's files any more: walking the queue from its head, the first
 * entry at which their summed sizes pass the GPU cache's capacity.  A file
 * not written yet (or empty so far) counts as the mean size of those
 * written before it in the walk, which is what a forward pass knows.
 * 0 without a GPU tier or restore hints; UINT64_MAX when it all fits.
 * e->lock held.  O(queue entries up to that point).
 */
uint64_t eng_gpu_keeps_below(struct engine *e)
{
	uint64_t cap, known = 0, nknown = 0, nunknown = 0;
	struct hint *h;

	if (!e->gpu || e->ntiers < 2 || !e->hq_head)
		return 0;
	cap = e->tiers[0]->size;
	for (h = e->hq_head; h; h = h->next) {
		uint64_t size = h->file ? h->file->size : 0;

		if (size) {
			known += tier_round(size);
			nknown++;
		} else {
			nunknown++;
		}
		if (nknown && known + nunknown * (known / nknown) > cap)
			return h->seq;
	}
	return UINT64_MAX;
}

/*
 * Bytes of GPU copies that no slower tier holds yet: waiting for the
 * cascade, or for the SSD flushers (see cascade_one()).  e->lock held.
 * O(fragments).
 */
uint64_t eng_gpu_unflushed(struct engine *e)
{
	uint64_t n = 0;
	struct frag *fr;

	for (fr = e->tiers[0]->head; fr; fr = fr->next)
		if (fr->copy && fr->copy->state == TS_WRITE_COMPLETE)
			n += fr->size;
	return n;
}

/*
 * Is cp a second copy that no read will need: a faster tier holds all of
 * its file, and that copy stays there until the file is read (the GPU
 * tier keeps what the restore queue needs within its capacity, above)?
 */
static bool copy_shadowed(struct engine *e, struct copy *cp, uint64_t gpu_keeps)
{
	int i;

	if (!cp->file->hint_seq || cp->file->hint_seq >= gpu_keeps)
		return false;
	for (i = 0; i < e->ntiers && cp->file->copy[i] != cp; i++) {
		struct copy *up = cp->file->copy[i];

		if (up && up->len == cp->len &&
		    (up->state == TS_WRITE_COMPLETE || up->state == TS_FLUSHED ||
		     up->state == TS_READ_COMPLETE || up->state == TS_CONSUMED))
			return true;
	}
	return false;
}

/* The rank of a shadowed copy whose file is d entries from the queue's head. */
uint64_t eng_shadow_rank(uint64_t d)
{
	return (TIER_FAR >> 1) + (d < (TIER_FAR >> 1) ? d : (TIER_FAR >> 1) - 1);
}

/*
 * The distance a copy is ranked by at eviction: its file's place in the
 * restore queue, or for a shadowed copy (above) that place pushed behind
 * every copy that is its file's only cached one, yet ahead of copies with
 * no hint (consumed, or never asked for).  Without it the host tier under
 * a GPU tier keeps second copies of the files needed first, which reads
 * never use, and evicts the only cached copies of the files needed next
 * (measured: rev order, bench_gpu_hints --tiers; score's host cache held
 * nothing else at the end of the forward pass).
 */
static uint64_t copy_rank(struct engine *e, struct copy *cp, uint64_t gpu_keeps)
{
	uint64_t d = eng_copy_dist(e, cp);

	if (d == TIER_FAR || !copy_shadowed(e, cp, gpu_keeps))
		return d;
	return eng_shadow_rank(d);
}

static struct evict_cost copy_cost(struct cache *c, struct frag *fr,
				   const struct evict_ctx *ctx)
{
	struct engine *e = c->priv;
	struct copy *cp = fr->copy;
	struct evict_cost k = { 0, 0 };
	uint64_t done;

	/* freeing one GPU's part: a gap must lie inside it, a copy at least
	 * partly (one across the boundary with the next part goes too) */
	if (ctx->part_hi && (cp ? fr->off + fr->size <= ctx->part_lo || fr->off >= ctx->part_hi :
			     fr->off < ctx->part_lo || fr->off + fr->size > ctx->part_hi)) {
		k.wait = TIER_INF;
		return k;
	}
	if (!cp)
		return k;
	if (cp->discarded) {	/* garbage: first to go, once idle */
		k.dist = TIER_FAR;
		k.wait = tier_copy_evictable(cp) ? 0 : 1e-4;
		return k;
	}
	k.dist = copy_rank(e, cp, ctx->gpu_keeps);
	switch (cp->state) {
	case TS_FLUSHED:
	case TS_CONSUMED:
		/* readers hold pins for a moment only */
		k.wait = cp->pins ? 1e-4 : 0;
		break;
	case TS_WRITE_COMPLETE:
		if (cp->file->unlinked || cp->file->flush_err || cp->promoted) {
			k.wait = TIER_INF;
			break;
		}
		/* the flusher publishes its progress without the lock */
		done = cp->flushing ? __atomic_load_n(&cp->flushed_bytes, __ATOMIC_RELAXED) : 0;
		k.wait = (double)(cp->len - (done < cp->len ? done : cp->len)) /
			 (e->flush_bw > 0 ? e->flush_bw : 1e9);
		if (k.wait <= 0)
			k.wait = 1e-6;
		break;
	default:		/* being written, being read, promoted */
		k.wait = TIER_INF;
	}
	if (cp->promoted)
		k.wait = TIER_INF;
	if (k.wait < TIER_INF && ctx->protect_below && k.dist < ctx->protect_below)
		k.wait = TIER_INF;	/* needed sooner than what we prefetch */
	return k;
}

/*
 * A copy keeps its file alive (one reference per copy, taken when the copy
 * is attached).  References are dropped later by a flusher, never under
 * e->lock: dropping the last one frees the file, which takes e->lock.
 */
void eng_defer_put(struct engine *e, struct tfile *f)
{
	if (e->nreap == e->reapcap) {
		size_t n = e->reapcap ? 2 * e->reapcap : 64;
		struct tfile **r = realloc(e->reap, n * sizeof(*r));

		if (!r) {
			tlog(LOG_CRIT, "out of memory: a file's inode is leaked");
			return;
		}
		e->reap = r;
		e->reapcap = n;
	}
	e->reap[e->nreap++] = f;
	eng_flush_work(e);	/* the flushers put() it */
}

/*
 * A copy keeps its file alive while the file has a name, so that a file
 * that nobody uses but whose data is cached stays known.  An unlinked
 * file's copies hold no reference (tfile_unlinked() drops them): its life
 * is its users', and its copies go with it (tfile_destroy()), instead of
 * keeping each other alive forever (an unlinked file's unflushed copy is
 * never evictable).
 */
void eng_attach_copy(struct engine *e, struct tfile *f, int i, struct copy *cp)
{
	(void)e;
	f->copy[i] = cp;
	cp->fileref = !f->unlinked;
	cp->discarded = f->orphaned;
	if (cp->fileref)
		f->ops->get(f);
}

/* The cache dropped cp: detach it from its file. */
void eng_copy_evicted(struct copy *cp)
{
	struct tfile *f = cp->file;
	struct engine *e = f->eng;
	int i;

	for (i = 0; i < e->ntiers; i++)
		if (f->copy[i] == cp) {
			f->copy[i] = NULL;
			if (cp->fileref && !f->destroying)
				eng_defer_put(e, f);
		}
	free(cp);
}

/* ---- a cache over several GPUs (-o gpu=0:1, -o balance) ---------------- */

/*
 * The part of the GPU cache a copy belongs in: its reader's GPU for a
 * prefetch (user.tierfs.restore_device, else the GPU it was written from),
 * its writer's GPU for a write (the ioctl's buffer, else the reader's);
 * part 0 (the mount's first GPU) when neither is known or the cache does
 * not span that GPU.
 */
static unsigned copy_part(struct engine *e, struct copy *cp)
{
	struct tfile *f = cp->file;
	int dev = cp->for_read ? (f->gpu_rdev >= 0 ? f->gpu_rdev : f->gpu_wdev) :
				 (f->gpu_wdev >= 0 ? f->gpu_wdev : f->gpu_rdev);
	int p = dev >= 0 ? gpu_tier_part_of(e->gpu, dev) : 0;

	return p > 0 ? (unsigned)p : 0;
}

/* The gap holding byte `off` of the cache, or NULL (a copy, or past usable). */
static struct frag *gap_at(struct cache *c, uint64_t off)
{
	struct frag *g;

	if (off >= c->usable)
		return NULL;
	for (g = c->head; g && g->off <= off; g = g->next)
		if (off < g->off + g->size)
			return g->copy ? NULL : g;
	return NULL;
}

/* A place for a copy: at offset `at` of the cache, or host memory (!gpu). */
struct spot {
	bool gpu;
	uint64_t at;
	unsigned peer;			/* the part its other bytes are in */
	uint64_t local, remote;		/* its bytes in part d and in `peer` */
	double time;			/* the model's blocking time */
};

/*
 * The model's blocking time of a placement of GPU d's copy (balance.h:
 * bytes / bandwidth per link, the slowest link's).  e->lock held.
 */
static double spot_time(struct engine *e, unsigned d, const struct spot *s, uint64_t size)
{
	const struct gpu_links *l = gpu_tier_links(e->gpu);
	unsigned n = gpu_tier_ndevices(e->gpu);
	struct balance_node node;
	struct balance_plan plan;

	memset(&node, 0, sizeof(node));
	memset(&plan, 0, sizeof(plan));
	node.n = plan.n = n;
	node.ckpt[d] = size;
	node.host_free = BALANCE_HOST_UNLIMITED;
	for (unsigned i = 0; i < n; i++) {
		node.free[i] = BALANCE_MAX_BYTES;
		node.local_bw[i] = l->local[i] > 0 ? l->local[i] : 1e12;
		node.host_link[i] = i;
		node.host_bw[i] = l->host[i] > 0 ? l->host[i] : 1e9;
		for (unsigned j = 0; j < n; j++)
			node.peer_bw[i][j] = i != j && l->peer[i][j] > 0 ? l->peer[i][j] : 0;
	}
	if (!s->gpu)
		plan.to_host[d] = size;
	else {
		plan.to_gpu[d][d] = s->local;
		plan.to_gpu[d][s->peer] += s->remote;
	}
	return balance_blocking_time(&node, &plan);
}

/*
 * Where GPU d's copy of `size` bytes goes when d's part has no room for it
 * whole (a copy is contiguous; the cache's parts are adjacent ranges of
 * device addresses):
 *   - split: across the boundary between d's part and its pair's (parts
 *     0|1, 2|3, ...: even parts are filled from their low end and odd ones
 *     from their high end, so the room of a pair gathers at its boundary):
 *     what d's part has there, the rest in the neighbour's memory, one
 *     copy whose bytes lie on two GPUs;
 *   - whole in a peer's part with a gap that holds it;
 *   - host memory (*s->gpu false).
 * greedy (MASCOTS'21): its own room first, then the fastest peer with room,
 * then host memory.  maxflow: of those placements the one of least blocking
 * time under balance.h's model over the links measured at start-up (the
 * byte-level min-time plan of balance_plan(), which may also send part of
 * a checkpoint to host memory, is what a contiguous copy approximates).
 * host: host memory.  e->lock held.
 */
static void balance_spot(struct engine *e, unsigned d, uint64_t size, struct spot *best)
{
	const struct gpu_links *l = gpu_tier_links(e->gpu);
	struct cache *c = e->tiers[0];
	unsigned n = gpu_tier_ndevices(e->gpu), p = d ^ 1;
	struct spot cand;

	size = tier_round(size ? size : 1);
	memset(best, 0, sizeof(*best));
	best->time = spot_time(e, d, best, size);	/* host memory */
	if (e->cfg.balance == BALANCE_HOST || !l->probed || n < 2 || n > GPU_TIER_MAX_DEVICES)
		return;
	/* split with the pair's other part */
	if (p < n && l->peer[d][p] > 0) {
		uint64_t dlo, dhi, plo, phi, bnd, rd = 0, rp = 0;
		struct frag *g;

		gpu_tier_part_range(e->gpu, d, &dlo, &dhi);
		gpu_tier_part_range(e->gpu, p, &plo, &phi);
		bnd = d < p ? dhi : dlo;
		g = bnd > 0 ? gap_at(c, bnd - 1) : NULL;
		if (g && g == gap_at(c, bnd)) {		/* free on both sides */
			uint64_t low = d < p ? dlo : plo, top = d < p ? phi : dhi;	/* the pair */
			uint64_t below = bnd - (g->off > low ? g->off : low);
			uint64_t above = (g->off + g->size < top ? g->off + g->size : top) - bnd;

			rd = d < p ? below : above;
			rp = d < p ? above : below;
		}
		if (rd && rd < size && rp >= size - rd) {
			memset(&cand, 0, sizeof(cand));
			cand.gpu = true;
			cand.peer = p;
			cand.local = rd;
			cand.remote = size - rd;
			cand.at = d < p ? bnd - rd : bnd + rd - size;
			cand.time = spot_time(e, d, &cand, size);
			if (e->cfg.balance == BALANCE_GREEDY || cand.time < best->time) {
				*best = cand;
				if (e->cfg.balance == BALANCE_GREEDY)
					return;
			}
		}
	}
	/* whole in a peer's part: greedy the fastest link, maxflow the least time */
	for (unsigned j = 0; j < n; j++) {
		uint64_t lo, hi;

		if (j == d || !(l->peer[d][j] > 0))
			continue;
		gpu_tier_part_range(e->gpu, j, &lo, &hi);
		if (cache_largest_gap_in(c, lo, hi) < size)
			continue;
		memset(&cand, 0, sizeof(cand));
		cand.gpu = true;
		cand.peer = j;
		cand.remote = size;
		cand.at = UINT64_MAX;		/* placed in the part by fit */
		cand.time = spot_time(e, d, &cand, size);
		if (e->cfg.balance == BALANCE_GREEDY ?
		    (!best->gpu || l->peer[d][j] > l->peer[d][best->peer]) :
		    cand.time < best->time)
			*best = cand;
	}
}

/*
 * Can the window [first, last] be evicted now (no copy in it pinned or not
 * yet safe elsewhere)?  *need: the soonest restore-queue distance of its
 * copies (TIER_FAR: none hinted).  With `copies`, a window of gaps alone
 * does not count (free room is the balance policy's to judge).
 */
static bool window_ready(struct engine *e, struct frag *first, struct frag *last,
			 uint64_t *need, bool copies)
{
	bool any = false;

	*need = TIER_FAR;
	for (struct frag *fr = first;; fr = fr->next) {
		if (fr->copy) {
			uint64_t dist = eng_copy_dist(e, fr->copy);

			if (!tier_copy_evictable(fr->copy))
				return false;
			if (dist < *need)
				*need = dist;
			any = true;
		}
		if (fr == last)
			return any || !copies;
	}
}

/*
 * Evict the window [first, last], every copy in it evictable and unpinned,
 * to make room for cp: counted in the cache's statistics (a copy still in
 * the restore queue also logged).  Returns the gap it leaves; what cp does
 * not take of it is room for the others who wait (eng_room).
 */
static struct frag *evict_now(struct engine *e, struct cache *c, struct frag *first,
			      struct frag *last, struct copy *cp)
{
	for (struct frag *fr = first;; fr = fr->next) {
		if (fr->copy) {
			uint64_t d = eng_copy_dist(e, fr->copy);

			c->evictions++;
			c->evicted_bytes += fr->size;
			if (d != TIER_FAR) {
				c->evicted_queued++;
				tlog(LOG_DEBUG, "%s cache: evicting a copy %" PRIu64
				     " entries from the restore queue's head "
				     "(placing one %" PRIu64 " away)", c->name, d,
				     cp->file->hint_seq ? eng_copy_dist(e, cp) : (uint64_t)0);
			}
		}
		if (fr == last)
			break;
	}
	eng_room(e);
	return cache_evict_window(c, first, last, eng_copy_evicted);
}

/*
 * Evict the window [first, last] and place cp in the gap it leaves (a peer's
 * part, or across parts): counted as sent to a peer.  0 or -ENOSPC.
 */
static int place_evicting(struct engine *e, struct cache *c, struct copy *cp, uint64_t size,
			  unsigned d, struct frag *first, struct frag *last)
{
	struct frag *gap = evict_now(e, c, first, last, cp);
	uint64_t lo, hi;

	if (cache_place_in(c, cp, size, gap->off, gap->off + gap->size, false))
		return -ENOSPC;
	gpu_tier_part_range(e->gpu, d, &lo, &hi);
	if (cp->frag->off >= lo && cp->frag->off + cp->frag->size <= hi) {
		e->bal_own++;	/* the window was in its own GPU's part */
		return 0;
	}
	e->bal_peer++;
	e->bal_peer_bytes += size;
	tlog(LOG_DEBUG, "gpu cache: a copy of %" PRIu64 " bytes for GPU %d placed where "
	     "evictable copies were (offset %" PRIu64 ")", size, gpu_tier_part_device(e->gpu, d),
	     cp->frag->off);
	return 0;
}

/*
 * Place cp (`size` bytes) in a GPU cache over several GPUs.  In order:
 *   1. a gap in its GPU's part;
 *   2. copies in that part that no restore hint needs and that are safe in
 *      host memory already, evicted at once;
 *   3. free room elsewhere, where the balance policy says: across the
 *      boundary with its pair's part, in a peer's part, or host memory;
 *   4. copies elsewhere needed later in the restore order than those of
 *      step 5's window (or, without such a window, any safe copies of a
 *      peer the policy would send the checkpoint to), evicted at once, the
 *      checkpoint in their place;
 *   5. copies in its own part that are safe already but hinted;
 *   6. -ENOSPC: host memory.
 * It never waits for a flush: a GPU whose part is full of copies still to
 * be cascaded sends its checkpoint elsewhere instead of blocking on them
 * (sc22's load balancing).  So without hints a checkpoint stays on its GPU
 * while its part holds anything evictable, and with hints the copies
 * needed last go first, whichever GPU holds them.  e->lock held.
 */
static int gpu_place_multi(struct engine *e, struct cache *c, struct copy *cp,
			   uint64_t size, struct evict_ctx *ctx)
{
	unsigned d = copy_part(e, cp);
	struct frag *first = NULL, *last = NULL, *gfirst, *glast;
	struct spot s;
	uint64_t lo, hi, need = TIER_FAR, gneed;
	double wait;
	bool top = d & 1;	/* odd parts fill from their high end */
	bool own = false;

	gpu_tier_part_range(e->gpu, d, &lo, &hi);
	ctx->gpu_keeps = 0;
	for (int round = 0; round < 8; round++) {
		if (cache_place_in(c, cp, size, lo, hi, top) == 0) {		/* 1 */
			e->bal_own++;
			return 0;
		}
		if (!gpu_tier_fully_mapped(e->gpu))
			return -ENOSPC;		/* the parts' room is not known yet */
		ctx->part_lo = lo;
		ctx->part_hi = hi;
		own = c->policy->choose(c, size, copy_cost, ctx, &first, &last, &wait) == 0 &&
		      window_ready(e, first, last, &need, false);
		ctx->part_hi = 0;
		if (!own || need != TIER_FAR)
			break;
		evict_now(e, c, first, last, cp);					/* 2 */
	}
	balance_spot(e, d, size, &s);						/* 3 */
	if (s.gpu) {
		uint64_t plo, phi;
		int ret;

		gpu_tier_part_range(e->gpu, s.peer, &plo, &phi);
		ret = s.at == UINT64_MAX ? cache_place_in(c, cp, size, plo, phi, s.peer & 1) :
					   cache_place_at(c, cp, size, s.at);
		if (ret == 0) {
			e->bal_peer++;
			e->bal_peer_bytes += s.remote;
			e->bal_split += s.local > 0;
			tlog(LOG_DEBUG, "gpu cache: a copy of %" PRIu64 " bytes for GPU %d: %" PRIu64
			     " on it, %" PRIu64 " on GPU %d (balance=%s, model %.3f ms)", size,
			     gpu_tier_part_device(e->gpu, d), s.local, s.remote,
			     gpu_tier_part_device(e->gpu, s.peer),
			     balance_policy_name((enum balance_policy)e->cfg.balance), s.time * 1e3);
			return 0;
		}
	}
	if (e->cfg.balance != BALANCE_HOST &&					/* 4 */
	    c->policy->choose(c, size, copy_cost, ctx, &gfirst, &glast, &wait) == 0 &&
	    window_ready(e, gfirst, glast, &gneed, true)) {
		bool go;

		if (own) {
			go = gneed > need;
		} else {
			struct spot w = { .gpu = true, .remote = tier_round(size ? size : 1),
					  .peer = gpu_tier_part_at(e->gpu, gfirst->off) };

			if (w.peer == d) {
				w.local = w.remote;
				w.remote = 0;
			}
			go = e->cfg.balance == BALANCE_GREEDY ||
			     spot_time(e, d, &w, w.local + w.remote) < s.time;
		}
		if (go && place_evicting(e, c, cp, size, d, gfirst, glast) == 0)
			return 0;
	}
	if (own) {								/* 5 */
		evict_now(e, c, first, last, cp);
		if (cache_place_in(c, cp, size, lo, hi, top) == 0) {
			e->bal_own++;
			return 0;
		}
	}
	e->bal_host++;								/* 6 */
	e->bal_host_bytes += size;
	return -ENOSPC;
}

/*
 * cache_grow_inplace(), but in a GPU cache over several GPUs only inside
 * the part the copy starts in: a copy that grows stays on its GPU (a write
 * that needs more goes through a new placement, and the balance policy).
 * e->lock held.
 */
int eng_grow_inplace(struct engine *e, struct copy *cp, uint64_t size)
{
	struct cache *c = cp->cache;

	if (e->gpu && c == e->tiers[0] && gpu_tier_ndevices(e->gpu) > 1) {
		unsigned i = gpu_tier_part_at(e->gpu, cp->frag->off);
		uint64_t lo, hi;

		if (i < gpu_tier_ndevices(e->gpu)) {
			gpu_tier_part_range(e->gpu, i, &lo, &hi);
			if (size > hi - cp->frag->off)
				return -ENOSPC;
		}
	}
	return cache_grow_inplace(c, cp, size);
}

/*
 * Place cp in cache c with `size` bytes, evicting as the policy says,
 * waiting at most max_wait seconds for the chosen window's flushes.
 * Copies whose prefetch distance is below protect_below (0: none) are not
 * evicted: the prefetcher places a file without evicting those needed
 * sooner.  Called with e->lock held; may drop it while waiting for
 * flushes.  Returns 0, -EFBIG (bigger than the cache) or -ENOSPC (nothing
 * can be evicted: go to a slower tier).
 */
int eng_alloc_wait(struct engine *e, struct cache *c, struct copy *cp,
		   uint64_t size, double max_wait, uint64_t protect_below)
{
	struct evict_ctx ctx = { .protect_below = protect_below };
	double t0 = tier_now(), give_up = t0 + max_wait;
	/* what the last wait was for (copied: the copy may go meanwhile) */
	enum tier_state bstate = TS_INIT;
	bool bpinned = false, bflushing = false;
	int waits = 0;

	size = tier_round(size ? size : 1);
	if (size > c->size)
		return -EFBIG;
	for (;;) {
		struct frag *first, *last, *fr;
		double wait;
		bool ready = true;
		int ret;

		if (e->gpu && c == e->tiers[0]) {
			gpu_tier_update_usable(e->gpu);
			if (gpu_tier_ndevices(e->gpu) > 1)
				return gpu_place_multi(e, c, cp, size, &ctx);
		}
		if (cache_place(c, cp, size) == 0) {
			if (waits && tier_now() - t0 > 0.05)
				tlog(LOG_INFO, "%s cache: %.0f ms to make room for %" PRIu64
				     " bytes (%d waits; the last for a copy %s%s%s)", c->name,
				     (tier_now() - t0) * 1e3, size, waits,
				     tier_state_name(bstate), bpinned ? ", pinned" : "",
				     bflushing ? ", being copied out" : "");
			return 0;
		}
		if (e->gpu && c == e->tiers[0] && !gpu_tier_fully_mapped(e->gpu))
			return -ENOSPC;	/* no eviction before the tier is built */
		ctx.gpu_keeps = c != e->tiers[0] ? eng_gpu_keeps_below(e) : 0;
		ret = c->policy->choose(c, size, copy_cost, &ctx, &first, &last, &wait);
		if (ret)
			return -ENOSPC;
		for (fr = first;; fr = fr->next) {
			if (fr->copy && !tier_copy_evictable(fr->copy)) {
				ready = false;
				bstate = fr->copy->state;
				bpinned = fr->copy->pins > 0;
				bflushing = fr->copy->flushing;
			}
			if (fr == last)
				break;
		}
		if (ready) {
			evict_now(e, c, first, last, cp);
			continue;
		}
		/* wait for the window's flushes, then decide again */
		if (tier_now() > give_up) {
			if (max_wait >= 1)
				tlog(LOG_WARNING, "%s cache: no room after %.0f s of waiting; "
				     "%s", c->name, max_wait, c == &e->host ?
				     "writing through to the SSD" : "using a slower tier");
			return -ENOSPC;
		}
		waits++;
		e->room_waiters++;	/* aging flushes are due now */
		if (e->aq_head)
			eng_flush_work(e);
		wait_ms(e, &e->room, 20);
		e->room_waiters--;
	}
}

int eng_alloc(struct engine *e, struct cache *c, struct copy *cp,
		     uint64_t size)
{
	return eng_alloc_wait(e, c, cp, size, 30, 0);
}

/* Check that [off, off + len) lies inside cp's fragment.  A transfer past
 * it would land on the neighbouring fragments, other files' copies. */
int eng_copy_bounds(struct copy *cp, uint64_t off, uint64_t len)
{
	if (off <= copy_cap(cp) && len <= copy_cap(cp) - off)
		return 0;
	tlog(LOG_CRIT, "%s cache: refused a transfer of %" PRIu64 " bytes at %" PRIu64
	     " into a copy of %" PRIu64 " bytes", cp->cache->name, len, off, copy_cap(cp));
	assert(!"transfer past a copy's fragment");
	return -EIO;
}

/* Free f's copy in tier i (no data may be lost: the caller checked). */
void eng_drop_copy(struct engine *e, struct tfile *f, int i)
{
	struct copy *cp = f->copy[i];

	if (!cp)
		return;
	wait_unpinned(e, cp);
	cache_release(cp->cache, cp);
	eng_copy_evicted(cp);
	eng_room(e);
}

/* e->lock held: f's copy in tier i is stale (f is being written); free it. */
void eng_discard_copy(struct engine *e, struct tfile *f, int i)
{
	struct copy *cp = f->copy[i];

	backlog_del(e, cp);
	if (cp->state == TS_WRITE_COMPLETE || cp->state == TS_WRITE_IN_PROGRESS)
		tier_set_state(&cp->state, TS_INIT);
	eng_drop_copy(e, f, i);
}
