/*
 * prefetch.c - the prefetcher thread: walks the restore queue from its
 * head and brings each file up the hierarchy (SSD -> host, host -> GPU)
 * before it is read, as far ahead as the caches have room without
 * evicting what the queue needs sooner.
 *
 * Owns: its thread and the prefetch statistics.  Holds e->lock except
 * while bytes move (under a lease) and while it calls tfile_ops; never
 * takes a tfile.lock.  Idle, it waits on e->prefetch_work (the restore
 * queue changed, prefetching started, room may be made); the end of each
 * fill broadcasts e->settled (readers waiting for it) and e->room.  Calls
 * place.c (with an eviction context that protects the files needed
 * sooner) and ssd.c.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_int.h"
#include "ssd.h"

/* Queue entries the prefetcher looks at before it lets go of e->lock. */
#define PREFETCH_WALK_SLICE	1024

/*
 * e->lock held: copy f's clean host copy up into the GPU tier (host ->
 * device on the prefetch direction's stream), as far ahead as the GPU
 * cache has room without evicting what the queue needs sooner.  The GPU
 * copy is promoted (kept until read); the host copy, now a second copy of
 * clean data, becomes CONSUMED: the first to go when the host tier needs
 * room for the next prefetch from the SSD.  Returns as prefetch_one().
 */
static int promote_gpu_held(struct engine *e, struct tfile *f, uint64_t dist);

static int promote_gpu(struct engine *e, struct tfile *f, uint64_t dist)
{
	int hi = host_index(e);
	struct cache *g = e->tiers[0];
	struct copy *hcp = f->copy[hi];
	uint64_t size = f->size;
	int ret;

	if (!e->gpu || !g || f->copy[0] || f->dirty || f->shadow_fd >= 0 || f->unlinked ||
	    f->destroying || !hcp || hcp->len != size || tier_round(size ? size : 1) > g->size ||
	    (hcp->state != TS_READ_COMPLETE && hcp->state != TS_FLUSHED))
		return 0;
	/* the lock is dropped below: f must outlive its queue entry */
	f->ops->get(f);
	ret = promote_gpu_held(e, f, dist);
	eng_unlock(e);
	f->ops->put(f);
	eng_lock(e);
	return ret;
}

/* promote_gpu() with the checks done and a reference on f held */
static int promote_gpu_held(struct engine *e, struct tfile *f, uint64_t dist)
{
	int hi = host_index(e);
	struct cache *g = e->tiers[0];
	struct copy *hcp = f->copy[hi], *gcp;
	struct lease l = { .n = 0 };
	uint64_t size = f->size;
	int ret;

	gcp = calloc(1, sizeof(*gcp));
	if (!gcp)
		return -ENOMEM;
	gcp->file = f;
	gcp->for_read = true;	/* into the part of the GPU that reads it */
	lease_take(&l, hcp);	/* eng_alloc_wait() may drop the lock */
	ret = eng_alloc_wait(e, g, gcp, size, 0.05, dist + 1);
	if (ret) {
		lease_release(e, &l);
		free(gcp);
		return ret == -EFBIG ? 0 : -ENOSPC;
	}
	if (f->copy[0] || f->dirty || f->copy[hi] != hcp) {	/* changed meanwhile */
		lease_release(e, &l);
		cache_release(g, gcp);
		eng_room(e);
		free(gcp);
		return 0;
	}
	tier_set_state(&gcp->state, TS_READ_IN_PROGRESS);
	eng_attach_copy(e, f, 0, gcp);
	lease_take(&l, gcp);
	eng_unlock(e);		/* under the lease of hcp and gcp */
	ret = eng_copy_bounds(gcp, 0, size);
	if (!ret)
		ret = eng_copy_bounds(hcp, 0, size);
	if (!ret)
		ret = g->ops->write(g, gcp->frag->off, copy_ptr(hcp), size);
	lease_end(e, &l);
	if (ret || f->size != size || f->dirty) {
		if (ret)
			tlog(LOG_WARNING, "host -> GPU prefetch copy failed: %s", strerror(-ret));
		if (f->copy[0] == gcp && gcp->state == TS_READ_IN_PROGRESS) {
			tier_set_state(&gcp->state, TS_INIT);
			eng_settled(e);		/* readers waiting for the fill */
			eng_drop_copy(e, f, 0);
		}
		return 0;
	}
	gcp->len = size;
	tier_set_state(&gcp->state, TS_READ_COMPLETE);
	/* kept until read, unless its entries left the queue meanwhile */
	gcp->promoted = f->hint_first != NULL;
	if (!gcp->promoted)
		tier_set_state(&gcp->state, TS_CONSUMED);
	if (hcp->state == TS_FLUSHED)
		tier_set_state(&hcp->state, TS_READ_COMPLETE);
	if (hcp->state == TS_READ_COMPLETE)
		tier_set_state(&hcp->state, TS_CONSUMED);
	hcp->promoted = false;
	e->files_to_gpu++;
	e->bytes_to_gpu += size;
	eng_settled(e);		/* readers waiting for the fill */
	eng_room(e);		/* hcp is CONSUMED (gcp too, unless promoted) */
	return 1;
}

/*
 * e->lock held: bring f into the fastest tier (drops the lock meanwhile).
 * Returns 1 if it did, 0 if nothing was needed, -ENOSPC when there is no
 * room without evicting what the queue needs sooner.
 */
static int prefetch_one(struct engine *e, struct ssd_ring *ring, struct tfile *f,
			uint64_t dist)
{
	int hi = host_index(e), t = fastest_copy(e, f);
	struct cache *c = &e->host;
	struct copy *cp = t >= 0 ? f->copy[t] : NULL;
	uint64_t size = f->size;
	struct lease l;
	int fd, ret;

	if (cp) {
		/* cached already: protect it until it is read */
		if (cp->state == TS_FLUSHED) {
			tier_set_state(&cp->state, TS_READ_COMPLETE);
			cp->promoted = true;
		} else if (cp->state == TS_WRITE_COMPLETE || cp->state == TS_CONSUMED) {
			cp->promoted = cp->state == TS_WRITE_COMPLETE;
			if (cp->state == TS_CONSUMED)
				tier_set_state(&cp->state, TS_READ_COMPLETE), cp->promoted = true;
		}
		/* in the host tier with a GPU tier above it: one level up */
		if (t == hi && hi > 0)
			return promote_gpu(e, f, dist);
		return 0;
	}
	if (f->dirty || f->shadow_fd >= 0 || f->unlinked || f->destroying)
		return 0;
	cp = calloc(1, sizeof(*cp));
	if (!cp)
		return -ENOMEM;
	cp->file = f;
	f->ops->get(f);		/* the lock is dropped: f must outlive its entry */
	ret = eng_alloc_wait(e, c, cp, size, 0.05, dist + 1);
	if (!ret && (fastest_copy(e, f) >= 0 || f->dirty || f->unlinked ||
		     f->size != size)) {	/* a writer came first */
		cache_release(c, cp);
		eng_room(e);
		ret = 1;
	}
	if (ret) {
		free(cp);
		eng_unlock(e);
		f->ops->put(f);
		eng_lock(e);
		return ret < 0 ? -ENOSPC : 0;
	}
	tier_set_state(&cp->state, TS_READ_IN_PROGRESS);
	eng_attach_copy(e, f, hi, cp);
	lease_begin(e, &l, cp, NULL);
	eng_delay_at(NULL, "prefetch_read");	/* under cp's lease */

	fd = f->ops->data_fd(f, true);
	if (fd < 0) {
		ret = fd;
	} else {
		ret = eng_copy_bounds(cp, 0, tier_round(size));
		if (!ret)
			ret = ssd_read(ring, fd, copy_ptr(cp), tier_round(size), 0);
		f->ops->release_data_fd(f, fd);
	}

	lease_end(e, &l);
	if (ret || f->size != size || f->dirty) {
		/* failed, or changed meanwhile: drop the copy */
		if (ret) {
			char nb[256];

			eng_unlock(e);
			fname(f, nb, sizeof(nb));
			eng_lock(e);
			tlog(LOG_WARNING, "%s: prefetch failed: %s", nb, strerror(-ret));
		}
		if (f->copy[hi] == cp && cp->state == TS_READ_IN_PROGRESS) {
			tier_set_state(&cp->state, TS_INIT);
			eng_settled(e);		/* readers waiting for the fill */
			eng_drop_copy(e, f, hi);
		}
		eng_unlock(e);
		f->ops->put(f);
		eng_lock(e);
		return 0;
	}
	cp->len = size;
	tier_set_state(&cp->state, TS_READ_COMPLETE);
	/* kept until read, unless its entries left the queue meanwhile
	 * (consumed by a read from the SSD, cleared): then evictable */
	cp->promoted = f->hint_first != NULL;
	if (!cp->promoted)
		tier_set_state(&cp->state, TS_CONSUMED);
	e->files_prefetched++;
	e->bytes_prefetched += size;
	eng_settled(e);		/* readers waiting for the fill */
	eng_room(e);		/* evictable if CONSUMED, or discarded meanwhile */
	eng_unlock(e);
	f->ops->put(f);
	eng_lock(e);
	return 1;
}

void *eng_prefetcher_main(void *arg)
{
	struct engine *e = arg;
	struct ssd_ring ring;
	int ret;

	ret = ssd_ring_init(&ring, e->cfg.queue_depth, e->cfg.chunk);
	if (ret) {
		tlog(LOG_CRIT, "io_uring setup for prefetching failed: %s", strerror(-ret));
		return NULL;
	}
	eng_lock(e);
	while (!e->stop) {
		struct hint *h;
		bool did = false;

		if (e->prefetch_on) {
			unsigned walked = 0;

			for (h = e->hq_head; h && !e->stop; h = h->next) {
				uint64_t dist = h->seq - e->hint_head;

				uint64_t gen = e->hq_gen;

				/*
				 * The queue may be long (-o hint_max) and
				 * mostly cached or unborn: every so many
				 * entries let the requests waiting for the
				 * lock in, and go on from h if none went.
				 */
				if (++walked % PREFETCH_WALK_SLICE == 0) {
					eng_unlock(e);
					sched_yield();
					eng_lock(e);
					if (e->hq_gen != gen || e->stop) {
						did = true;	/* h may be gone */
						break;
					}
				}
				if (!h->file || h->file->unlinked)
					continue;
				ret = prefetch_one(e, &ring, h->file, dist);
				if (ret == 1) {
					did = true;
					break;	/* the queue may have changed: rescan */
				}
				if (ret < 0)
					break;	/* full of what is needed sooner */
				if (e->hq_gen != gen) {
					did = true;	/* h may be gone: rescan */
					break;
				}
			}
		}
		if (did)
			continue;
		wait_ms(e, &e->prefetch_work, 50);
	}
	eng_unlock(e);
	ssd_ring_exit(&ring);
	return NULL;
}
