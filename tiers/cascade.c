/*
 * cascade.c - the GPU -> host cascade: the thread (eng_gflusher_main, idle
 * on e->cascade_work) that takes the files of the GPU -> host queue
 * (flush.c's, with the others: e->gq_head) and copies a file's complete GPU copy into a new host
 * copy, then queues that for the SSD flushers (flush.c); the GPU copy
 * becomes FLUSHED (evictable).  Where the host cache has no room now the
 * file goes to the SSD from the GPU: here (eng_flush_one), or, for a file
 * the GPU tier keeps until it is read, by the flushers.  With -o dedup a
 * whole new file's chunks are hashed on the GPU first, and where an fsync
 * waits its clone record is made from the chunks that differ before the
 * rest crosses (dedup_flush.c: eng_dd_gpu_plan, _hash, _record, _keep).
 *
 * Owns: e->bytes_to_host and e->to_host_s.  Holds e->lock except
 * while the bytes move (cp and the new host copy leased) and while the
 * dedup calls hash and record.  Calls flush.c (eng_flush_one, eng_pop_due,
 * eng_queue_flush, eng_queue_flush_aged), place.c (eng_alloc_wait) and
 * dedup_flush.c, which call nothing here.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "dedup_flush.h"
#include "ssd.h"

/*
 * e->lock held (dropped while it waits), f's GPU copy cp leased and
 * flushing: room for hcp, len bytes, in the host cache; *kept when the GPU
 * tier keeps f until it is read.  0, -EEXIST where f has a host copy or
 * went away meanwhile, or eng_alloc_wait's error (no room now).
 */
static int cascade_room(struct engine *e, struct tfile *f, struct copy *cp, struct copy *hcp,
			uint64_t len, bool *kept)
{
	int hi = host_index(e);
	int ret;

	*kept = !f->copy[hi] && f->hint_seq && f->hint_seq >= e->hint_head &&
		f->hint_seq < eng_gpu_keeps_below(e) &&
		eng_gpu_unflushed(e) <= e->tiers[0]->size / 2;
	if (f->copy[hi])
		return -EEXIST;
	if (*kept) {
		/*
		 * The GPU tier keeps this file until it is read: a host copy
		 * would only be a second one.  Take room that is free now and
		 * holds nothing needed sooner, or else have the SSD flushers
		 * write it from the GPU, so the host cache keeps the files
		 * the GPU tier will not.
		 */
		ret = eng_alloc_wait(e, &e->host, hcp, len, 0,
				     eng_shadow_rank(eng_copy_dist(e, cp)) + 1);
	} else {
		ret = eng_alloc_wait(e, &e->host, hcp, len, 1, 0);
	}
	if (!ret && (f->copy[hi] || f->unlinked)) {	/* changed while we waited */
		cache_release(&e->host, hcp);
		eng_room(e);
		ret = -EEXIST;
	}
	return ret;
}

/* e->lock held: hcp, which did not become its file's host copy, dropped. */
static void cascade_drop(struct engine *e, struct copy *hcp)
{
	tier_set_state(&hcp->state, TS_INIT);
	cache_release(&e->host, hcp);
	free(hcp);
	eng_settled(e);
	eng_room(e);
}

/*
 * e->lock held: copy f's GPU copy into a new host copy, which then goes to
 * the SSD flush queue; the GPU copy becomes FLUSHED (evictable).
 */
static void cascade_one(struct engine *e, struct ssd_ring *ring, struct tfile *f)
{
	int hi = host_index(e);
	struct copy *cp = f->copy[0], *hcp;
	struct lease l = { .n = 0 };
	uint64_t len;
	struct dd_ghash gh;
	double t0;
	bool kept, moved;
	int ret;

	if (!cp || cp->cache != e->tiers[0] || cp->state != TS_WRITE_COMPLETE ||
	    cp->flushing || f->unlinked || !f->dirty)
		return;
	hcp = calloc(1, sizeof(*hcp));
	if (!hcp)
		return;
	hcp->file = f;
	cp->flushing = true;
	lease_take(&l, cp);	/* eng_alloc_wait() may drop the lock */
	len = cp->len;
	ret = cascade_room(e, f, cp, hcp, len, &kept);
	if (ret) {
		free(hcp);
		cp->flushing = false;
		lease_release(e, &l);
		/*
		 * The host tier has no room now: straight to the SSD, here
		 * (which holds back the cascade, as the full host cache
		 * asks) or, for a file the GPU keeps, by the SSD flushers
		 * (the cascade goes on with the files that must leave).
		 */
		if (ret != -EEXIST && kept)
			eng_queue_flush(e, f, false);
		else if (ret != -EEXIST)
			eng_flush_one(e, ring, f);
		eng_settled(e);
		return;
	}
	tier_set_state(&hcp->state, TS_WRITE_IN_PROGRESS);
	lease_take(&l, hcp);
	eng_dd_gpu_plan(e, f, cp, len, &gh);	/* a whole new file's chunks */
	eng_unlock(e);		/* under the lease of cp and hcp */
	/* hashed first: where an fsync waits, its clone record is made
	 * from the chunks that differ before the rest crosses over */
	eng_dd_gpu_hash(e, cp, &gh);
	eng_dd_gpu_record(e, f, cp, hcp, len, &gh);
	t0 = tier_now();
	ret = eng_copy_bounds(hcp, 0, len);
	if (!ret)
		ret = eng_copy_bounds(cp, 0, len);
	if (!ret)
		ret = cp->cache->ops->read(cp->cache, cp->frag->off, copy_ptr(hcp), len);
	t0 = tier_now() - t0;
	lease_end(e, &l);
	cp->flushing = false;
	/* changed while the bytes moved (not by a writer: they wait for
	 * cp->flushing): this copy is not the file's any more */
	moved = f->copy[hi] || f->copy[0] != cp || f->unlinked || cp->state != TS_WRITE_COMPLETE;
	if (ret || moved) {
		eng_dd_gpu_keep(f, &gh, false);	/* no host copy of them follows */
		cascade_drop(e, hcp);
		if (ret)
			tlog(LOG_ERR, "GPU -> host copy failed: %s", strerror(-ret));
		return;
	}
	hcp->len = len;
	eng_dd_gpu_keep(f, &gh, true);	/* for the flush of hcp */
	eng_attach_copy(e, f, hi, hcp);
	tier_set_state(&hcp->state, TS_WRITE_COMPLETE);
	backlog_del(e, cp);
	tier_set_state(&cp->state, TS_FLUSHED);
	if (cp->promoted)
		tier_set_state(&cp->state, TS_READ_COMPLETE);
	backlog_add(e, hcp);
	e->bytes_to_host += len;
	e->to_host_s += t0;
	eng_queue_flush_aged(e, f, len);
	eng_settled(e);
	eng_room(e);		/* cp is FLUSHED (evictable) */
}

void *eng_gflusher_main(void *arg)
{
	struct engine *e = arg;
	struct ssd_ring ring;

	if (ssd_ring_init(&ring, e->cfg.queue_depth, e->cfg.chunk)) {
		tlog(LOG_CRIT, "io_uring setup for the GPU flusher failed");
		return NULL;
	}
	eng_lock(e);
	for (;;) {
		struct tfile *f = eng_pop_due(&e->gq_head, &e->gq_tail,
					  offsetof(struct tfile, gq_next));

		if (!f) {
			if (e->stop && !e->gq_head)
				break;
			wait_ms(e, &e->cascade_work, 50);
			continue;
		}
		f->gqueued = false;
		cascade_one(e, &ring, f);
		eng_unlock(e);
		f->ops->put(f);
		eng_lock(e);
	}
	eng_unlock(e);
	ssd_ring_exit(&ring);
	return NULL;
}
