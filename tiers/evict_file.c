/*
 * evict_file.c - drop one file's cached copies on request (the fs side's
 * user.tierfs.evict, tierfsctl evict).
 *
 * Only what the policy itself may evict is dropped: copies in an
 * evictable state (FLUSHED: the next tier holds the data; CONSUMED), not
 * leased, not being copied out, and in the GPU cache only once it is built.
 * A copy with data found nowhere else (being written, or not flushed yet),
 * or one in use (a prefetch, a read, a promotion kept for the restore
 * queue) stays, and the call says EBUSY: the caller waits for the flush
 * and asks again (a small file whose flush was waiting for its age is
 * flushed now).  Nothing is ever waited for here.
 *
 * Everything runs with e->lock held, as eviction in place.c does.
 */
#include <errno.h>
#include <pthread.h>

#include "engine_int.h"
#include "gpu_tier.h"

static bool may_drop(struct engine *e, struct copy *cp)
{
	if (!tier_copy_evictable(cp))
		return false;
	if (e->gpu && cp->cache == e->tiers[0] && !gpu_tier_fully_mapped(e->gpu))
		return false;		/* as eng_alloc_wait: not while it is built */
	return true;
}

int engine_evict_file(struct engine *e, struct tfile *f)
{
	bool busy = false, dropped = false;
	int i;

	eng_lock(e);
	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];
		struct cache *c;

		if (!cp)
			continue;
		if (!may_drop(e, cp)) {
			busy = true;
			continue;
		}
		c = cp->cache;
		c->evictions++;
		c->evicted_bytes += cp->frag->size;
		cache_evict_window(c, cp->frag, cp->frag, eng_copy_evicted);
		dropped = true;
	}
	if (busy && f->aging)
		eng_queue_flush(e, f, false);	/* asked for: its age is over */
	if (dropped)
		eng_room(e);	/* writers and the prefetcher */
	eng_unlock(e);
	return busy ? -EBUSY : 0;
}
