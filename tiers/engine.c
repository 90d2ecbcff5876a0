/*
 * engine.c - files, their cached copies, and the flush engine.
 *
 * Owns the host cache (one mmap'ed buffer, huge pages advised), the flush
 * queue and the flusher threads that write cached copies to the SSD
 * through io_uring.  The fs side calls the tfile_* functions from FUSE
 * worker threads with the file's lock held by us (each entry point takes
 * f->lock itself).
 *
 * Write path: a write lands in the file's host copy, created (and filled
 * with the file's current content) on first write; the copy grows by
 * reallocation.  When no room can be made, the file goes write-through: a
 * new version of the backing file (the "shadow") receives the content and
 * the writes, and is committed on the last close or on fsync.  Either way
 * a backing file is only ever replaced by a complete new version.
 *
 * Flush path: the last writer's close (or an fsync) moves the copy to
 * WRITE_COMPLETE and queues the file; a flusher writes the copy into a new
 * version with O_DIRECT, fdatasyncs it and asks the fs side to commit it
 * (atomic rename).  Writers wait while their copy is being flushed.
 *
 * Lock order: tfile.lock -> engine.lock.  The flushers never take a
 * tfile.lock.
 */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <syslog.h>
#include <unistd.h>

#include "engine.h"
#include "ssd.h"
#include "gpu_tier.h"
#include "gpu.h"

#define FLUSH_RETRY_S	1		/* seconds between retries of a failed flush */

struct engine {
	pthread_mutex_t lock;		/* see file comment */
	pthread_cond_t cond;		/* any state change */
	struct engine_config cfg;
	struct cache host;		/* host cache tier */
	void *host_buf;			/* its mmap'ed buffer */
	int ntiers;			/* caches in tiers[] */
	struct cache *tiers[TIER_MAX];	/* fastest first */
	struct tfile *q_head, *q_tail;	/* flush queue */
	pthread_t *flushers;		/* flusher threads */
	int nflushers;
	bool stop;			/* threads must exit */
	int busy;			/* flushes running */
	double flush_bw;		/* measured bytes/s, for eviction */
	uint64_t tick;			/* access counter (lru) */
	/* statistics */
	uint64_t bytes_flushed, files_flushed, flush_errors;
	uint64_t bytes_written_through, files_written_through;
	uint64_t backlog;		/* bytes queued or being flushed */
	struct gpu_tier *gpu;		/* the GPU tier, NULL if none (yet) */
	struct cache gpu_slot;		/* tiers[0] until the GPU tier is built */
	pthread_t gbuilder;		/* builds the GPU tier in the background */
	bool gbuilder_started;
	bool pin_started;		/* the host buffer is being / was pinned */
	uint64_t host_pinned;		/* host buffer registered with CUDA */
	struct tfile *gq_head, *gq_tail;	/* GPU -> host queue */
	pthread_t gflusher;		/* its thread */
	bool gflusher_started;
	uint64_t bytes_to_host;		/* cascaded GPU -> host */
	double to_host_s;		/* time in those copies */
	uint64_t hint_head;		/* restore-queue ticket of the next read */
	struct hint *hq_head, *hq_tail;	/* the restore queue */
	uint64_t hint_next;		/* next ticket */
	uint64_t hq_len, hq_unbound;	/* entries, entries without a file */
	uint64_t hq_gen;		/* bumped when an entry is freed: a walk
					 * of the queue that dropped the lock
					 * starts again when it moved */
	bool prefetch_on;		/* start / stop */
	pthread_t prefetcher;
	bool prefetcher_started;
	uint64_t files_prefetched, bytes_prefetched, files_consumed;
	uint64_t files_to_gpu, bytes_to_gpu;	/* prefetches host -> GPU */
	uint64_t client_writes, client_reads, client_bytes;	/* spans */
	struct tfile **reap;		/* files whose copy went: put() them */
	size_t nreap, reapcap;
	pthread_t toucher;		/* pre-faults the host buffer */
	bool toucher_started;
	uint64_t touched;		/* host bytes touched so far */
};

/* One entry of the restore queue. */
struct hint {
	struct hint *next;
	uint64_t seq;			/* ticket: position in the queue */
	uint64_t dir;			/* directory key */
	struct tfile *file;		/* the file (referenced), NULL if unborn */
	char name[];			/* name in dir */
};

static void consume(struct engine *e, struct tfile *f);
static void hint_head_update(struct engine *e);

/*
 * A read of n bytes at off finished reading f: it returned the last bytes
 * (or it is the first read of an empty file).  The read at EOF that ends
 * a reader's loop returns nothing and does not count again: without the
 * page cache every read() reaches us, and one pass must consume one
 * restore-queue entry, not two.
 */
static bool read_to_end(const struct tfile *f, off_t off, size_t n)
{
	if (!n)
		return off == 0 && f->size == 0;
	return (uint64_t)off + n >= f->size;
}
static int fastest_copy(struct engine *e, struct tfile *f);
static uint8_t *copy_ptr(struct copy *cp);
static void hint_free(struct engine *e, struct hint *h);
static void writer_done(struct engine *e, struct tfile *f);
static uint64_t prefetch_distance(struct engine *e);
static void *prefetcher_main(void *arg);

/* Set by the prefetcher around its allocations: copies whose prefetch
 * distance is below this are needed sooner and must not be evicted. */
static __thread uint64_t protect_below;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wait on e->cond for at most ms milliseconds.  e->lock held. */
static void cond_wait_ms(struct engine *e, long ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&e->cond, &e->lock, &ts);
}

static const char *fname(struct tfile *f, char *buf, size_t len)
{
	return f->ops->name ? f->ops->name(f, buf, len) : "?";
}

/* ---- host tier -------------------------------------------------------- */

static int host_index(struct engine *e)
{
	return e->ntiers - 1;
}

/* ---- eviction --------------------------------------------------------- */

/* Prefetch distance of cp's file: its place in the restore queue. */
static uint64_t copy_dist(struct engine *e, struct copy *cp)
{
	uint64_t seq = cp->file->hint_seq;

	if (!seq || seq < e->hint_head)
		return TIER_FAR;
	return seq - e->hint_head;
}

/*
 * Set around an eviction decision in a tier below the GPU's (see
 * gpu_keeps_below()): restore-queue tickets below this are of files the
 * GPU tier is expected to keep until they are read.
 */
static __thread uint64_t gpu_keeps;

/*
 * The restore-queue ticket from which on the GPU tier cannot hold the
 * queue's files any more: walking the queue from its head, the first
 * entry at which their summed sizes pass the GPU cache's capacity.  A file
 * not written yet (or empty so far) counts as the mean size of those
 * written before it in the walk, which is what a forward pass knows.
 * 0 without a GPU tier or restore hints; UINT64_MAX when it all fits.
 * e->lock held.  O(queue entries up to that point).
 */
static uint64_t gpu_keeps_below(struct engine *e)
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
static uint64_t gpu_unflushed(struct engine *e)
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
static bool copy_shadowed(struct engine *e, struct copy *cp)
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
static uint64_t shadow_rank(uint64_t d)
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
static uint64_t copy_rank(struct engine *e, struct copy *cp)
{
	uint64_t d = copy_dist(e, cp);

	if (d == TIER_FAR || !copy_shadowed(e, cp))
		return d;
	return shadow_rank(d);
}

static struct evict_cost copy_cost(struct cache *c, struct frag *fr)
{
	struct engine *e = c->priv;
	struct copy *cp = fr->copy;
	struct evict_cost k = { 0, 0 };
	uint64_t done;

	if (!cp)
		return k;
	k.dist = copy_rank(e, cp);
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
	if (k.wait < TIER_INF && protect_below && k.dist < protect_below)
		k.wait = TIER_INF;	/* needed sooner than what we prefetch */
	return k;
}

/*
 * A copy keeps its file alive (one reference per copy, taken when the copy
 * is attached).  References are dropped later by a flusher, never under
 * e->lock: dropping the last one frees the file, which takes e->lock.
 */
static void defer_put(struct engine *e, struct tfile *f)
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
	pthread_cond_broadcast(&e->cond);
}

/*
 * A copy keeps its file alive while the file has a name, so that a file
 * that nobody uses but whose data is cached stays known.  An unlinked
 * file's copies hold no reference (tfile_unlinked() drops them): its life
 * is its users', and its copies go with it (tfile_destroy()), instead of
 * keeping each other alive forever (an unlinked file's unflushed copy is
 * never evictable).
 */
static void attach_copy(struct engine *e, struct tfile *f, int i, struct copy *cp)
{
	(void)e;
	f->copy[i] = cp;
	cp->fileref = !f->unlinked;
	if (cp->fileref)
		f->ops->get(f);
}

/* The cache dropped cp: detach it from its file. */
static void copy_evicted(struct copy *cp)
{
	struct tfile *f = cp->file;
	struct engine *e = f->eng;
	int i;

	for (i = 0; i < e->ntiers; i++)
		if (f->copy[i] == cp) {
			f->copy[i] = NULL;
			if (cp->fileref && !f->destroying)
				defer_put(e, f);
		}
	free(cp);
}

/*
 * Place cp in cache c with `size` bytes, evicting as the policy says.
 * Called with e->lock held; may drop it while waiting for flushes.
 * Returns 0, -EFBIG (bigger than the cache) or -ENOSPC (nothing can be
 * evicted: go to a slower tier).
 */
static int eng_alloc_wait(struct engine *e, struct cache *c, struct copy *cp,
			  uint64_t size, double max_wait)
{
	double t0 = now_s(), give_up = t0 + max_wait;
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

		if (e->gpu && c == e->tiers[0])
			gpu_tier_update_usable(e->gpu);
		if (cache_place(c, cp, size) == 0) {
			if (waits && now_s() - t0 > 0.05)
				tlog(LOG_INFO, "%s cache: %.0f ms to make room for %" PRIu64
				     " bytes (%d waits; the last for a copy %s%s%s)", c->name,
				     (now_s() - t0) * 1e3, size, waits,
				     tier_state_name(bstate), bpinned ? ", pinned" : "",
				     bflushing ? ", being copied out" : "");
			return 0;
		}
		if (e->gpu && c == e->tiers[0] && !gpu_tier_fully_mapped(e->gpu))
			return -ENOSPC;	/* no eviction before the tier is built */
		gpu_keeps = c != e->tiers[0] ? gpu_keeps_below(e) : 0;
		ret = c->policy->choose(c, size, copy_cost, &first, &last, &wait);
		gpu_keeps = 0;
		if (ret)
			return -ENOSPC;
		for (fr = first;; fr = fr->next) {
			if (fr->copy && (fr->copy->pins ||
					 !tier_state_evictable(fr->copy->state))) {
				ready = false;
				bstate = fr->copy->state;
				bpinned = fr->copy->pins > 0;
				bflushing = fr->copy->flushing;
			}
			if (fr == last)
				break;
		}
		if (ready) {
			for (fr = first;; fr = fr->next) {
				if (fr->copy) {
					uint64_t d = copy_dist(e, fr->copy);

					c->evictions++;
					c->evicted_bytes += fr->size;
					if (d != TIER_FAR) {
						c->evicted_queued++;
						tlog(LOG_DEBUG, "%s cache: evicting a copy %" PRIu64
						     " entries from the restore queue's head "
						     "(placing one %" PRIu64 " away)", c->name, d,
						     cp->file->hint_seq ? copy_dist(e, cp) : (uint64_t)0);
					}
				}
				if (fr == last)
					break;
			}
			cache_evict_window(c, first, last, copy_evicted);
			continue;
		}
		/* wait for the window's flushes, then decide again */
		if (now_s() > give_up) {
			if (max_wait >= 1)
				tlog(LOG_WARNING, "%s cache: no room after %.0f s of waiting; "
				     "%s", c->name, max_wait, c == &e->host ?
				     "writing through to the SSD" : "using a slower tier");
			return -ENOSPC;
		}
		waits++;
		cond_wait_ms(e, 20);
	}
}

static int eng_alloc(struct engine *e, struct cache *c, struct copy *cp,
		     uint64_t size)
{
	return eng_alloc_wait(e, c, cp, size, 30);
}

/* Flush backlog accounting, idempotent per copy.  e->lock held. */
static void backlog_add(struct engine *e, struct copy *cp)
{
	if (!cp->in_backlog && !cp->file->unlinked) {	/* unlinked: no flush */
		cp->in_backlog = true;
		e->backlog += cp->len;
	}
}

static void backlog_del(struct engine *e, struct copy *cp)
{
	if (cp->in_backlog) {
		cp->in_backlog = false;
		e->backlog -= cp->len < e->backlog ? cp->len : e->backlog;
	}
}

static uint8_t *copy_ptr(struct copy *cp)
{
	return cp->cache->base + cp->frag->off;
}

static uint64_t copy_cap(struct copy *cp)
{
	return cp->frag->size;
}

/* Check that [off, off + len) lies inside cp's fragment.  A transfer past
 * it would land on the neighbouring fragments, other files' copies. */
static int copy_bounds(struct copy *cp, uint64_t off, uint64_t len)
{
	if (off <= copy_cap(cp) && len <= copy_cap(cp) - off)
		return 0;
	tlog(LOG_CRIT, "%s cache: refused a transfer of %" PRIu64 " bytes at %" PRIu64
	     " into a copy of %" PRIu64 " bytes", cp->cache->name, len, off, copy_cap(cp));
	assert(!"transfer past a copy's fragment");
	return -EIO;
}

static void wait_unpinned(struct engine *e, struct copy *cp)
{
	while (cp->pins)
		pthread_cond_wait(&e->cond, &e->lock);
}

/* Free f's copy in tier i (no data may be lost: the caller checked). */
static void drop_copy(struct engine *e, struct tfile *f, int i)
{
	struct copy *cp = f->copy[i];

	if (!cp)
		return;
	wait_unpinned(e, cp);
	cache_release(cp->cache, cp);
	copy_evicted(cp);
	pthread_cond_broadcast(&e->cond);
}

/* e->lock held: f's copy in tier i is stale (f is being written); free it. */
static void discard_copy(struct engine *e, struct tfile *f, int i)
{
	struct copy *cp = f->copy[i];

	backlog_del(e, cp);
	if (cp->state == TS_WRITE_COMPLETE || cp->state == TS_WRITE_IN_PROGRESS)
		tier_set_state(&cp->state, TS_INIT);
	drop_copy(e, f, i);
}

/* ---- flush queue ------------------------------------------------------ */

static void queue_flush(struct engine *e, struct tfile *f, bool front)
{
	if (f->queued || f->unlinked)
		return;
	f->queued = true;
	f->ops->get(f);
	f->fq_next = NULL;
	if (!e->q_head) {
		e->q_head = e->q_tail = f;
	} else if (front) {
		f->fq_next = e->q_head;
		e->q_head = f;
	} else {
		e->q_tail->fq_next = f;
		e->q_tail = f;
	}
	pthread_cond_broadcast(&e->cond);
}

/* Queue f for the GPU -> host cascade. */
static void queue_gpu_flush(struct engine *e, struct tfile *f)
{
	if (f->gqueued || f->unlinked)
		return;
	f->gqueued = true;
	f->ops->get(f);
	f->gq_next = NULL;
	if (e->gq_tail)
		e->gq_tail->gq_next = f;
	else
		e->gq_head = f;
	e->gq_tail = f;
	pthread_cond_broadcast(&e->cond);
}

/* Mark the newest copy complete and queue it for flushing. */
static void complete_copy(struct engine *e, struct tfile *f, bool front)
{
	int t = fastest_copy(e, f);
	struct copy *cp = t >= 0 ? f->copy[t] : NULL;

	if (!cp || !f->dirty)
		return;
	if (cp->state == TS_WRITE_IN_PROGRESS)
		tier_set_state(&cp->state, TS_WRITE_COMPLETE);
	if (cp->state != TS_WRITE_COMPLETE)
		return;
	backlog_add(e, cp);
	if (t < host_index(e))
		queue_gpu_flush(e, f);
	else
		queue_flush(e, f, front);
}

/* Write a copy that the CPU cannot address through a bounce buffer. */
static int write_bounced(struct copy *cp, int fd, uint64_t len)
{
	const size_t chunk = 8u << 20;
	uint8_t *b = malloc(chunk);
	uint64_t done = 0;
	int ret = 0;

	if (!b)
		return -ENOMEM;
	while (done < len && !ret) {
		size_t n = len - done < chunk ? (size_t)(len - done) : chunk;

		ret = cp->cache->ops->read(cp->cache, cp->frag->off + done, b, n);
		if (!ret && pwrite(fd, b, n, (off_t)done) != (ssize_t)n)
			ret = errno ? -errno : -EIO;
		done += n;
		__atomic_store_n(&cp->flushed_bytes, done, __ATOMIC_RELAXED);
	}
	free(b);
	return ret;
}

/*
 * Flush f's newest copy to the SSD as a new version.  e->lock held
 * (dropped meanwhile).  Normally the host copy; a GPU copy when the host
 * tier had no room for the cascade.
 */
static int flush_one(struct engine *e, struct ssd_ring *ring, struct tfile *f)
{
	struct copy *cp = NULL;
	char nb[256];
	int t;

	for (t = 0; t < e->ntiers && !cp; t++)	/* the newest complete copy */
		if (f->copy[t] && f->copy[t]->state == TS_WRITE_COMPLETE)
			cp = f->copy[t];
	uint64_t gen, len;
	bool direct, inplace;
	double t0;
	int fd, ret;

	if (!cp || !f->dirty || f->unlinked || cp->state != TS_WRITE_COMPLETE ||
	    cp->flushing)
		return 0;	/* nothing to do, or another flusher has it */
	cp->flushing = true;
	__atomic_store_n(&cp->flushed_bytes, 0, __ATOMIC_RELAXED);
	cp->pins++;
	gen = f->gen;
	len = cp->len;
	e->busy++;
	pthread_mutex_unlock(&e->lock);

	t0 = now_s();
	fd = f->ops->version_open(f, cp->cache->host_addressable, &direct, &inplace);
	if (fd < 0) {
		ret = fd;
		goto out;
	}
	ret = copy_bounds(cp, 0, direct ? tier_round(len) : len);
	if (ret)
		close(fd);
	if (ret)
		goto out;
	if (!cp->cache->host_addressable)
		ret = write_bounced(cp, fd, len);
	else if (direct)
		ret = ssd_write(ring, fd, copy_ptr(cp), tier_round(len), 0,
				&cp->flushed_bytes);
	else
		ret = ssd_write(ring, fd, copy_ptr(cp), len, 0, &cp->flushed_bytes);
	if (!ret && ftruncate(fd, (off_t)len) < 0)
		ret = -errno;
	if (!ret)
		ret = ssd_fdatasync(ring, fd);
	if (ret) {
		close(fd);
		goto out;
	}
	ret = f->ops->version_commit(f, fd, inplace, false);
out:
	fname(f, nb, sizeof(nb));	/* not under e->lock: it takes fs locks */
	pthread_mutex_lock(&e->lock);
	e->busy--;
	cp->pins--;
	cp->flushing = false;
	if (ret == 0) {
		double dt = now_s() - t0;

		if (len >= (1u << 20) && dt > 0)
			e->flush_bw = e->flush_bw > 0 ?
				0.7 * e->flush_bw + 0.3 * (double)len / dt :
				(double)len / dt;
		e->bytes_flushed += len;
		e->files_flushed++;
		f->flushed_gen = gen;
		if (f->flush_err)
			tlog(LOG_NOTICE, "%s: flushed after earlier failure", nb);
		f->flush_err = 0;
		if (f->gen == gen) {
			backlog_del(e, cp);
			f->dirty = false;
			tier_set_state(&cp->state, TS_FLUSHED);
			if (cp->promoted)
				tier_set_state(&cp->state, TS_READ_COMPLETE);
		}
	} else if (ret == -ENOENT && f->unlinked) {
		/* unlinked meanwhile: nothing to flush */
	} else {
		e->flush_errors++;
		if (f->flush_err != ret)
			tlog(LOG_ERR, "%s: flush to SSD failed: %s; data stays cached, retrying",
			     nb, strerror(-ret));
		f->flush_err = ret;
		clock_gettime(CLOCK_MONOTONIC, &f->retry_at);
		f->retry_at.tv_sec += FLUSH_RETRY_S;
		queue_flush(e, f, false);
	}
	pthread_cond_broadcast(&e->cond);
	return ret;
}

static bool retry_due(struct tfile *f)
{
	struct timespec ts;

	if (!f->flush_err)
		return true;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec > f->retry_at.tv_sec ||
	       (ts.tv_sec == f->retry_at.tv_sec && ts.tv_nsec >= f->retry_at.tv_nsec);
}

#define QLINK(f, off)	(*(struct tfile **)((char *)(f) + (off)))

/*
 * Unlink and return the first file of a queue (linked through the field at
 * link_off) whose retry time has come, or NULL.  e->lock held.
 */
static struct tfile *pop_due(struct tfile **head, struct tfile **tail, size_t link_off)
{
	struct tfile *f = *head, *prev = NULL;

	while (f && !retry_due(f)) {
		prev = f;
		f = QLINK(f, link_off);
	}
	if (!f)
		return NULL;
	if (prev)
		QLINK(prev, link_off) = QLINK(f, link_off);
	else
		*head = QLINK(f, link_off);
	if (*tail == f)
		*tail = prev;
	return f;
}

static void *flusher_main(void *arg)
{
	struct engine *e = arg;
	struct ssd_ring ring;
	int ret;

	ret = ssd_ring_init(&ring, e->cfg.queue_depth, e->cfg.chunk);
	if (ret) {
		tlog(LOG_CRIT, "io_uring setup failed: %s", strerror(-ret));
		return NULL;
	}
	pthread_mutex_lock(&e->lock);
	for (;;) {
		struct tfile *f;

		if (e->nreap) {
			struct tfile *r = e->reap[--e->nreap];

			pthread_mutex_unlock(&e->lock);
			r->ops->put(r);
			pthread_mutex_lock(&e->lock);
			continue;
		}
		f = pop_due(&e->q_head, &e->q_tail, offsetof(struct tfile, fq_next));
		if (!f) {
			if (e->stop && !e->q_head && !e->nreap)
				break;
			cond_wait_ms(e, e->q_head ? 100 : 1100);
			continue;
		}
		f->queued = false;
		flush_one(e, &ring, f);
		pthread_mutex_unlock(&e->lock);
		f->ops->put(f);
		pthread_mutex_lock(&e->lock);
	}
	pthread_mutex_unlock(&e->lock);
	ssd_ring_exit(&ring);
	return NULL;
}

/* ---- GPU -> host cascade ---------------------------------------------- */

/*
 * e->lock held: copy f's GPU copy into a new host copy, which then goes to
 * the SSD flush queue; the GPU copy becomes FLUSHED (evictable).
 */
static void cascade_one(struct engine *e, struct ssd_ring *ring, struct tfile *f)
{
	int hi = host_index(e);
	struct copy *cp = f->copy[0], *hcp;
	uint64_t len;
	double t0;
	bool kept;
	int ret;

	if (!cp || cp->cache != e->tiers[0] || cp->state != TS_WRITE_COMPLETE ||
	    cp->flushing || f->unlinked || !f->dirty)
		return;
	hcp = calloc(1, sizeof(*hcp));
	if (!hcp)
		return;
	hcp->file = f;
	cp->flushing = true;
	cp->pins++;
	len = cp->len;
	kept = !f->copy[hi] && f->hint_seq && f->hint_seq >= e->hint_head &&
	       f->hint_seq < gpu_keeps_below(e) &&
	       gpu_unflushed(e) <= e->tiers[0]->size / 2;
	if (f->copy[hi]) {
		ret = -EEXIST;
	} else if (kept) {
		/*
		 * The GPU tier keeps this file until it is read: a host copy
		 * would only be a second one.  Take room that is free now and
		 * holds nothing needed sooner, or else have the SSD flushers
		 * write it from the GPU, so the host cache keeps the files
		 * the GPU tier will not.
		 */
		protect_below = shadow_rank(copy_dist(e, cp)) + 1;
		ret = eng_alloc_wait(e, &e->host, hcp, len, 0);
		protect_below = 0;
	} else {
		ret = eng_alloc_wait(e, &e->host, hcp, len, 1);
	}
	if (!ret && (f->copy[hi] || f->unlinked)) {	/* changed while we waited */
		cache_release(&e->host, hcp);
		ret = -EEXIST;
	}
	if (ret) {
		free(hcp);
		cp->flushing = false;
		cp->pins--;
		/*
		 * The host tier has no room now: straight to the SSD, here
		 * (which holds back the cascade, as the full host cache
		 * asks) or, for a file the GPU keeps, by the SSD flushers
		 * (the cascade goes on with the files that must leave).
		 */
		if (ret != -EEXIST && kept)
			queue_flush(e, f, false);
		else if (ret != -EEXIST)
			flush_one(e, ring, f);
		pthread_cond_broadcast(&e->cond);
		return;
	}
	tier_set_state(&hcp->state, TS_WRITE_IN_PROGRESS);
	hcp->pins++;
	pthread_mutex_unlock(&e->lock);
	t0 = now_s();
	ret = copy_bounds(hcp, 0, len);
	if (!ret)
		ret = copy_bounds(cp, 0, len);
	if (!ret)
		ret = cp->cache->ops->read(cp->cache, cp->frag->off, copy_ptr(hcp), len);
	t0 = now_s() - t0;
	pthread_mutex_lock(&e->lock);
	hcp->pins--;
	cp->pins--;
	cp->flushing = false;
	if (!ret && (f->copy[hi] || f->copy[0] != cp || f->unlinked ||
		     cp->state != TS_WRITE_COMPLETE)) {
		/* changed while the bytes moved (not by a writer: they wait
		 * for cp->flushing): this copy is not the file's any more */
		tier_set_state(&hcp->state, TS_INIT);
		cache_release(&e->host, hcp);
		free(hcp);
		pthread_cond_broadcast(&e->cond);
		return;
	}
	if (ret) {
		tier_set_state(&hcp->state, TS_INIT);
		cache_release(&e->host, hcp);
		free(hcp);
		tlog(LOG_ERR, "GPU -> host copy failed: %s", strerror(-ret));
		pthread_cond_broadcast(&e->cond);
		return;
	}
	hcp->len = len;
	attach_copy(e, f, hi, hcp);
	tier_set_state(&hcp->state, TS_WRITE_COMPLETE);
	backlog_del(e, cp);
	tier_set_state(&cp->state, TS_FLUSHED);
	if (cp->promoted)
		tier_set_state(&cp->state, TS_READ_COMPLETE);
	backlog_add(e, hcp);
	e->bytes_to_host += len;
	e->to_host_s += t0;
	queue_flush(e, f, false);
	pthread_cond_broadcast(&e->cond);
}

static void *gflusher_main(void *arg)
{
	struct engine *e = arg;
	struct ssd_ring ring;

	if (ssd_ring_init(&ring, e->cfg.queue_depth, e->cfg.chunk)) {
		tlog(LOG_CRIT, "io_uring setup for the GPU flusher failed");
		return NULL;
	}
	pthread_mutex_lock(&e->lock);
	for (;;) {
		struct tfile *f = pop_due(&e->gq_head, &e->gq_tail,
					  offsetof(struct tfile, gq_next));

		if (!f) {
			if (e->stop && !e->gq_head)
				break;
			cond_wait_ms(e, 50);
			continue;
		}
		f->gqueued = false;
		cascade_one(e, &ring, f);
		pthread_mutex_unlock(&e->lock);
		f->ops->put(f);
		pthread_mutex_lock(&e->lock);
	}
	pthread_mutex_unlock(&e->lock);
	ssd_ring_exit(&ring);
	return NULL;
}

/* ---- engine ----------------------------------------------------------- */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/*
 * Pin the host buffer once it is touched and a GPU tier exists, whichever
 * of the two comes last (the toucher or the GPU builder calls this).
 */
static void pin_host_once(struct engine *e)
{
	bool pin;

	pthread_mutex_lock(&e->lock);
	pin = e->gpu && !e->pin_started && !e->stop &&
	      __atomic_load_n(&e->touched, __ATOMIC_RELAXED) >= e->host.size;
	if (pin)
		e->pin_started = true;
	pthread_mutex_unlock(&e->lock);
	if (pin)
		gpu_tier_pin_host(e->host.base, e->host.size, NULL, &e->touched,
				  &e->host_pinned);
}

static void *gflusher_main(void *arg);
static void *gbuilder_main(void *arg);
static void *toucher_main(void *arg);

/*
 * Start the toucher and the GPU builder (once).  Both hold up the rest of
 * the process while they work: faulting the host buffer in holds the
 * address space's lock, which every new thread's stack mapping waits for,
 * and loading the CUDA driver library holds the dynamic loader's lock
 * (about half a second of constructors), which pthread_create() waits for.
 * So they start after the threads that serve requests exist.
 */
void engine_start_background(struct engine *e)
{
	if (!e->toucher_started && pthread_create(&e->toucher, NULL, toucher_main, e) == 0)
		e->toucher_started = true;
	if (e->cfg.gpu_dev >= 0 && !e->gbuilder_started &&
	    pthread_create(&e->gbuilder, NULL, gbuilder_main, e) == 0)
		e->gbuilder_started = true;
}

/* Build the GPU tier (CUDA start-up, VMM reservation) off the mount's path. */
static void *gbuilder_main(void *arg)
{
	struct engine *e = arg;
	struct gpu_tier *g;
	char msg[256] = "";
	bool ok = false;

	if (gpu_tier_create(&g, e->cfg.gpu_dev, e->cfg.gpu_cache, e->cfg.gpu_share,
			    e->cfg.policy, msg, sizeof(msg))) {
		tlog(LOG_NOTICE, "GPU tier: not available (%s); using host + SSD", msg);
		return NULL;
	}
	pthread_mutex_lock(&e->lock);
	if (!e->stop) {
		struct cache *gc = gpu_tier_cache(g);

		gc->priv = e;
		e->tiers[0] = gc;	/* the placeholder never held a copy */
		e->gpu = g;
		if (pthread_create(&e->gflusher, NULL, gflusher_main, e) == 0)
			e->gflusher_started = true;
		ok = true;
	}
	pthread_mutex_unlock(&e->lock);
	if (!ok) {
		gpu_tier_destroy(g);
		return NULL;
	}
	tlog(LOG_NOTICE, "GPU tier: %s", msg);
	pin_host_once(e);
	return NULL;
}

/*
 * Fault the host buffer in, front to back, in the background (hipc22 §IV:
 * the cache is usable at once; first writes into untouched pages just pay
 * the page faults themselves).
 */
static void *toucher_main(void *arg)
{
	struct engine *e = arg;
	uint64_t chunk = 8ull << 20, off;	/* short holds of the mm lock */
	double t0 = now_s();
	bool populate = true;

	for (off = 0; off < e->host.size; off += chunk) {
		uint64_t n = e->host.size - off < chunk ? e->host.size - off : chunk;

		if (__atomic_load_n(&e->stop, __ATOMIC_RELAXED))
			return NULL;
		if (populate && madvise(e->host.base + off, n, MADV_POPULATE_WRITE) < 0)
			populate = false;
		if (!populate) {
			volatile uint8_t *p = e->host.base + off;
			uint64_t i;

			for (i = 0; i < n; i += 4096)
				p[i] = p[i];
		}
		__atomic_store_n(&e->touched, off + n, __ATOMIC_RELAXED);
	}
	tlog(LOG_INFO, "host cache: %.1f GiB touched in %.2f s",
	     (double)e->host.size / (1 << 30), now_s() - t0);
	pin_host_once(e);
	return NULL;
}

int engine_create(struct engine **out, const struct engine_config *cfg)
{
	struct engine *e = calloc(1, sizeof(*e));
	int ret, i;

	if (!e)
		return -ENOMEM;
	e->cfg = *cfg;
	if (!e->cfg.flush_threads)
		e->cfg.flush_threads = 2;
	if (!e->cfg.queue_depth)
		e->cfg.queue_depth = 32;
	if (!e->cfg.chunk)
		e->cfg.chunk = 1u << 20;
	if (!e->cfg.policy)
		e->cfg.policy = &evict_fifo;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->cond, NULL);
	e->flush_bw = 1e9;

	uint64_t size = tier_round(cfg->host_cache);
	if (size < TIER_ALIGN)
		size = TIER_ALIGN;
	e->host_buf = mmap(NULL, size, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (e->host_buf == MAP_FAILED) {
		ret = -errno;
		tlog(LOG_ERR, "cannot map a %" PRIu64 "-byte host cache: %s",
		     size, strerror(errno));
		goto err_free;
	}
	if (cfg->hugepages)
		madvise(e->host_buf, size, MADV_HUGEPAGE);
	ret = cache_init(&e->host, "host", 1, e->host_buf, size, &tier_host_ops,
			 e->cfg.policy);
	if (ret)
		goto err_unmap;
	e->host.priv = e;
	e->host.host_addressable = true;
	if (cfg->gpu_dev >= 0) {
		/*
		 * The GPU tier is built in the background (gbuilder_main): the
		 * mount serves writes, into the host tier, from the start.  Its
		 * slot holds an empty placeholder until then.
		 */
		ret = cache_init(&e->gpu_slot, "gpu", 0, e->host_buf, TIER_ALIGN,
				 &tier_host_ops, e->cfg.policy);
		if (ret)
			goto err_cache;
		e->gpu_slot.usable = 0;
		e->gpu_slot.priv = e;
		e->tiers[e->ntiers++] = &e->gpu_slot;
	}
	e->tiers[e->ntiers++] = &e->host;

	e->prefetch_on = true;
	if (pthread_create(&e->prefetcher, NULL, prefetcher_main, e) == 0)
		e->prefetcher_started = true;

	e->flushers = calloc((size_t)e->cfg.flush_threads, sizeof(pthread_t));
	if (!e->flushers) {
		ret = -ENOMEM;
		goto err_threads;
	}
	for (i = 0; i < e->cfg.flush_threads; i++) {
		ret = -pthread_create(&e->flushers[i], NULL, flusher_main, e);
		if (ret)
			goto err_threads;
		e->nflushers++;
	}
	if (!cfg->later)
		engine_start_background(e);
	*out = e;
	return 0;

err_threads:
	pthread_mutex_lock(&e->lock);
	e->stop = true;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	if (e->gbuilder_started)
		pthread_join(e->gbuilder, NULL);
	for (i = 0; i < e->nflushers; i++)
		pthread_join(e->flushers[i], NULL);
	free(e->flushers);
	if (e->toucher_started)
		pthread_join(e->toucher, NULL);
	if (e->prefetcher_started)
		pthread_join(e->prefetcher, NULL);
	if (e->gflusher_started)
		pthread_join(e->gflusher, NULL);
	if (e->gpu)
		gpu_tier_destroy(e->gpu);
err_cache:
	if (e->gpu_slot.head)
		cache_destroy(&e->gpu_slot);
	cache_destroy(&e->host);
err_unmap:
	munmap(e->host_buf, size);
err_free:
	free(e);
	return ret;
}

void engine_destroy(struct engine *e)
{
	int i;

	pthread_mutex_lock(&e->lock);
	e->stop = true;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	if (e->gbuilder_started)
		pthread_join(e->gbuilder, NULL);
	for (i = 0; i < e->nflushers; i++)
		pthread_join(e->flushers[i], NULL);
	free(e->flushers);
	if (e->toucher_started)
		pthread_join(e->toucher, NULL);
	if (e->prefetcher_started)
		pthread_join(e->prefetcher, NULL);
	if (e->gflusher_started)
		pthread_join(e->gflusher, NULL);
	while (e->gq_head) {
		struct tfile *f = e->gq_head;

		e->gq_head = f->gq_next;
		f->gqueued = false;
		f->ops->put(f);
	}
	while (e->hq_head) {
		struct hint *h = e->hq_head;

		e->hq_head = h->next;
		hint_free(e, h);
	}
	while (e->nreap) {
		struct tfile *r = e->reap[--e->nreap];

		r->ops->put(r);
	}
	free(e->reap);
	/* files still queued hold a reference; the fs frees them */
	while (e->q_head) {
		struct tfile *f = e->q_head;

		e->q_head = f->fq_next;
		f->queued = false;
		f->ops->put(f);
	}
	/* copies of files the fs never freed (it exits right after) */
	for (i = 0; i < e->ntiers; i++) {
		struct cache *c = e->tiers[i];
		struct frag *fr;

		while (c->used) {
			for (fr = c->head; fr && !fr->copy; fr = fr->next)
				;
			if (!fr)
				break;
			struct copy *cp = fr->copy;

			cp->file->destroying = true;
			cache_release(c, cp);
			copy_evicted(cp);
		}
	}
	if (e->gpu) {
		gpu_tier_unpin_host(e->host_buf, &e->host_pinned);
		gpu_tier_destroy(e->gpu);
	}
	if (e->gpu_slot.head)
		cache_destroy(&e->gpu_slot);
	munmap(e->host_buf, e->host.size);
	cache_destroy(&e->host);
	free(e);
}

uint64_t engine_host_cache_size(struct engine *e)
{
	return e->host.size;
}

/* ---- files ------------------------------------------------------------ */

void tfile_init(struct tfile *f, struct engine *e, const struct tfile_ops *ops,
		uint64_t size)
{
	memset(f, 0, sizeof(*f));
	f->eng = e;
	f->ops = ops;
	f->size = size;
	f->shadow_fd = -1;
	pthread_mutex_init(&f->lock, NULL);
}

void tfile_destroy(struct tfile *f)
{
	struct engine *e = f->eng;
	int i;

	pthread_mutex_lock(&e->lock);
	f->destroying = true;
	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (cp)
			backlog_del(e, cp);
		drop_copy(e, f, i);
	}
	pthread_mutex_unlock(&e->lock);
	if (f->shadow_fd >= 0)
		close(f->shadow_fd);
	f->shadow_fd = -1;
	pthread_mutex_destroy(&f->lock);
}

static void touch_mtime(struct tfile *f)
{
	clock_gettime(CLOCK_REALTIME, &f->mtime);
}

/*
 * Copy the first `len` bytes of the current backing content into fd
 * (sparse-aware: holes stay holes).  Returns 0 or -errno.
 */
static int copy_backing(struct tfile *f, int dst, uint64_t len)
{
	int src = f->ops->data_fd(f, false);
	off_t pos = 0;
	int ret = 0;

	if (src < 0)
		return src == -ENOENT ? 0 : src;
	while ((uint64_t)pos < len) {
		off_t data = lseek(src, pos, SEEK_DATA);
		off_t hole;

		if (data < 0 || (uint64_t)data >= len)
			break;
		hole = lseek(src, data, SEEK_HOLE);
		if (hole < 0 || (uint64_t)hole > len)
			hole = (off_t)len;
		loff_t in = data, outp = data;
		size_t left = (size_t)(hole - data);
		while (left) {
			ssize_t n = copy_file_range(src, &in, dst, &outp, left, 0);
			if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP)) {
				char buf[65536];
				ssize_t r = pread(src, buf, left < sizeof(buf) ? left : sizeof(buf), in);
				if (r <= 0) {
					ret = r < 0 ? -errno : 0;
					left = 0;
					break;
				}
				if (pwrite(dst, buf, (size_t)r, outp) != r) {
					ret = -errno;
					break;
				}
				n = r;
				in += r;
				outp += r;
			} else if (n < 0) {
				ret = -errno;
				break;
			} else if (n == 0) {
				break;
			}
			left -= (size_t)n;
		}
		if (ret)
			break;
		pos = hole;
	}
	f->ops->release_data_fd(f, src);
	return ret;
}

/*
 * Switch f to write-through: a new version holding the current content
 * becomes the target of all writes.  e->lock held on entry and exit
 * (dropped meanwhile); f->lock held.  Returns 0 or -errno.
 */
static int start_shadow(struct engine *e, struct tfile *f)
{
	int ci = fastest_copy(e, f);
	struct copy *cp = ci >= 0 ? f->copy[ci] : NULL;
	bool direct, inplace;
	char nb[256];
	int fd, ret = 0;

	if (cp) {
		while (cp->flushing)
			pthread_cond_wait(&e->cond, &e->lock);
		cp->pins++;
	}
	pthread_mutex_unlock(&e->lock);
	fd = f->ops->version_open(f, false, &direct, &inplace);
	if (fd < 0) {
		ret = fd;
	} else if (cp) {
		uint64_t done = 0;
		uint8_t *bounce = cp->cache->host_addressable ? NULL : malloc(4u << 20);

		if (!cp->cache->host_addressable && !bounce)
			ret = -ENOMEM;
		while (!ret && done < cp->len) {
			size_t n = cp->len - done;
			const uint8_t *src = copy_ptr(cp) + done;
			ssize_t w;

			if (bounce) {
				n = n < (4u << 20) ? n : (4u << 20);
				ret = cp->cache->ops->read(cp->cache, cp->frag->off + done, bounce, n);
				src = bounce;
			}
			w = ret ? -1 : pwrite(fd, src, n, (off_t)done);
			if (w < 0) {
				ret = ret ? ret : -errno;
				break;
			}
			done += (uint64_t)w;
		}
		free(bounce);
	} else if (!inplace) {
		ret = copy_backing(f, fd, f->size);
	}
	if (!ret && ftruncate(fd, (off_t)f->size) < 0)
		ret = -errno;
	fname(f, nb, sizeof(nb));
	pthread_mutex_lock(&e->lock);
	if (cp)
		cp->pins--;
	if (ret) {
		if (fd >= 0)
			close(fd);
		tlog(LOG_ERR, "%s: cannot write through to the SSD: %s", nb, strerror(-ret));
		return ret;
	}
	for (int i = 0; i < e->ntiers; i++)
		if (f->copy[i])
			discard_copy(e, f, i);
	f->shadow_fd = fd;
	f->shadow_inplace = inplace;
	f->dirty = true;
	e->files_written_through++;
	tlog(LOG_INFO, "%s: written through to the SSD (%" PRIu64 " bytes so far)",
	     nb, f->size);
	return 0;
}

/* Commit the shadow version.  e->lock and f->lock held. */
static int commit_shadow(struct engine *e, struct tfile *f, bool durable)
{
	int fd = f->shadow_fd;
	uint64_t gen = f->gen;
	int ret = 0;

	pthread_mutex_unlock(&e->lock);
	if (durable && fdatasync(fd) < 0)
		ret = -errno;
	if (!ret) {
		ret = f->ops->version_commit(f, fd, f->shadow_inplace, durable);
	}
	pthread_mutex_lock(&e->lock);
	if (ret && ret != -ENOENT) {
		f->flush_err = ret;
		return ret;		/* shadow stays; fd still ours */
	}
	f->shadow_fd = -1;
	if (ret == -ENOENT)
		return 0;
	f->flushed_gen = gen;
	f->flush_err = 0;
	f->dirty = false;
	return 0;
}

/* The fastest tier holding a copy of f, or -1. */
static int fastest_copy(struct engine *e, struct tfile *f)
{
	int i;

	for (i = 0; i < e->ntiers; i++)
		if (f->copy[i])
			return i;
	return -1;
}

/* Zero bytes [from, to) of cp. */
static void copy_zero(struct copy *cp, uint64_t from, uint64_t to)
{
	static const uint8_t zeros[1 << 16];
	struct cache *c = cp->cache;

	if (to <= from || copy_bounds(cp, from, to - from))
		return;
	if (c->host_addressable) {
		memset(copy_ptr(cp) + from, 0, to - from);
		return;
	}
	while (from < to) {
		size_t n = to - from < sizeof(zeros) ? (size_t)(to - from) : sizeof(zeros);

		c->ops->write(c, cp->frag->off + from, zeros, n);
		from += n;
	}
}

/* Largest file the GPU tier takes: it must also fit the host tier below. */
static uint64_t gpu_limit(struct engine *e)
{
	if (!e->gpu)
		return 0;
	return e->tiers[0]->size < e->host.size ? e->tiers[0]->size : e->host.size;
}

/*
 * The rule of the write path: a decision taken under e->lock holds only as
 * long as the lock is held.  Whatever waits (for room, for a reader's pin,
 * for a transfer) drops the lock, and other threads may meanwhile flush,
 * cascade, evict, prefetch or attach copies of the file; so after every
 * such wait the write path looks at the file's copies again (a snapshot
 * taken before the wait must still hold) and plans anew when it does not.
 * While it waits, every copy of the file is pinned, so the snapshot's
 * pointers stay valid and cannot be reused.
 */
struct copies_snap {
	struct copy *cp[TIER_MAX];	/* f->copy[] before the wait */
};

/* Is a copy of f in use by a transfer that a writer must not race: being
 * flushed or cascaded, filled by a prefetch, or lent to a client span? */
static bool copies_busy(struct engine *e, struct tfile *f)
{
	for (int i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (cp && (cp->flushing || cp->state == TS_READ_IN_PROGRESS || cp->spans ||
			   cp->readers))
			return true;
	}
	return false;
}

/* e->lock held: remember f's copies and pin them for a wait. */
static void snap_pin(struct engine *e, struct tfile *f, struct copies_snap *s)
{
	for (int i = 0; i < TIER_MAX; i++) {
		s->cp[i] = i < e->ntiers ? f->copy[i] : NULL;
		if (s->cp[i])
			s->cp[i]->pins++;
	}
}

/* e->lock held, after the wait: unpin; true if f's copies are as they were
 * and quiet, so that what was decided before the wait still holds. */
static bool snap_unpin_holds(struct engine *e, struct tfile *f, struct copies_snap *s)
{
	bool same = true;

	for (int i = 0; i < TIER_MAX; i++) {
		if (s->cp[i])
			s->cp[i]->pins--;
		if (i < e->ntiers && f->copy[i] != s->cp[i])
			same = false;
	}
	pthread_cond_broadcast(&e->cond);
	return same && !copies_busy(e, f);
}

/* e->lock held: cp is about to be written (no flush may start on it). */
static void make_writable(struct engine *e, struct copy *cp)
{
	if (cp->state != TS_WRITE_IN_PROGRESS) {
		backlog_del(e, cp);
		tier_set_state(&cp->state, TS_WRITE_IN_PROGRESS);
	}
	cp->promoted = false;
}

/*
 * e->lock held: free f's copies in tiers slower than t without waiting.
 * Returns true when one was pinned by a reader: it waited for that (the
 * lock was dropped) and the caller must look at f again.
 */
static bool drop_slower(struct engine *e, struct tfile *f, int t)
{
	for (int i = t + 1; i < e->ntiers; i++) {
		if (!f->copy[i])
			continue;
		if (f->copy[i]->pins) {
			pthread_cond_wait(&e->cond, &e->lock);
			return true;
		}
		discard_copy(e, f, i);
	}
	return false;
}

/*
 * Fill the new copy ncp (not attached, pinned) with the first n bytes of
 * f's content: from src (a copy in the same or a faster tier) or, without
 * one, from the backing file (zeros past its end).  e->lock not held.
 * Returns 0 or -errno.
 */
static int fill_copy(struct tfile *f, struct copy *ncp, struct copy *src, uint64_t n)
{
	struct cache *c = ncp->cache;
	uint64_t done = 0;
	int fd, ret = 0;

	if (!n)
		return 0;
	if ((ret = copy_bounds(ncp, 0, n)) || (src && (ret = copy_bounds(src, 0, n))))
		return ret;
	if (src && src->cache == c)
		return c->ops->move(c, ncp->frag->off, src->frag->off, n);
	if (!c->host_addressable)
		return -EOPNOTSUPP;	/* content is never loaded into the GPU here */
	if (src)
		return src->cache->ops->read(src->cache, src->frag->off, copy_ptr(ncp), n);
	fd = f->ops->data_fd(f, false);
	if (fd == -ENOENT) {
		memset(copy_ptr(ncp), 0, n);
		return 0;
	}
	if (fd < 0)
		return fd;
	while (done < n) {
		ssize_t r = pread(fd, copy_ptr(ncp) + done, n - done, (off_t)done);

		if (r < 0) {
			ret = -errno;
			break;
		}
		if (r == 0) {		/* past the backing file's end: a hole */
			memset(copy_ptr(ncp) + done, 0, n - done);
			break;
		}
		done += (uint64_t)r;
	}
	f->ops->release_data_fd(f, fd);
	return ret;
}

/*
 * e->lock held: make ncp f's copy in tier t, the only one (the others are
 * stale now: slower ones were dropped before, faster ones go here).
 */
static void install_copy(struct engine *e, struct tfile *f, int t, struct copy *ncp)
{
	struct copy *old = f->copy[t];

	if (old) {
		backlog_del(e, old);
		f->copy[t] = ncp;	/* takes over old's reference */
		ncp->fileref = old->fileref;
		wait_unpinned(e, old);	/* readers of the old bytes */
		cache_release(old->cache, old);
		free(old);
	} else {
		attach_copy(e, f, t, ncp);
	}
	for (int i = 0; i < e->ntiers; i++)
		if (i != t && f->copy[i])
			discard_copy(e, f, i);
	pthread_cond_broadcast(&e->cond);
}

/*
 * Make sure f has a writable copy of at least `cap` bytes holding the
 * first `keep` bytes of its content (keep <= cap: the rest is the
 * caller's), in state WRITE_IN_PROGRESS, in the fastest tier that can take
 * it; copies in other tiers are dropped (they are stale once the file is
 * written).  e->lock and f->lock held; e->lock is dropped while it waits.
 * Returns the copy, or NULL with *err = 0 when the file must go
 * write-through, or *err < 0 on a real error.
 */
static struct copy *writable_copy(struct engine *e, struct tfile *f,
				  uint64_t cap, uint64_t keep, int *err)
{
	int hi = host_index(e);
	bool host_only = false;	/* the GPU tier had no room */

	*err = 0;
	cap = cap ? cap : 1;
	if (keep > cap)
		keep = cap;
	for (;;) {
		struct copies_snap s;
		struct copy *cp, *src, *ncp;
		struct cache *c;
		uint64_t want, n;
		int t, si, ret;
		bool holds;

		if (copies_busy(e, f)) {
			pthread_cond_wait(&e->cond, &e->lock);
			continue;
		}
		si = fastest_copy(e, f);	/* the newest content */
		src = si >= 0 ? f->copy[si] : NULL;
		t = si;
		if (t < 0)	/* new content to the GPU; old content is loaded to the host */
			t = (e->gpu && keep == 0 && cap <= gpu_limit(e)) ? 0 : hi;
		if (t < hi && (host_only || cap > gpu_limit(e)))
			t = hi;
		if (drop_slower(e, f, t))
			continue;
		c = e->tiers[t];
		cp = f->copy[t];
		if (cp && cp == src && (copy_cap(cp) >= cap ||
					cache_grow_inplace(c, cp, tier_round(cap)) == 0)) {
			make_writable(e, cp);
			return cp;
		}

		/* a new copy: room first (may wait), then the content */
		ncp = calloc(1, sizeof(*ncp));
		if (!ncp) {
			*err = -ENOMEM;
			return NULL;
		}
		ncp->file = f;
		want = cap;	/* grow geometrically: appends copy O(n) bytes */
		if (cp && cp == src && want < 2 * copy_cap(cp))
			want = 2 * copy_cap(cp);
		if (want > c->size || (t < hi && want > gpu_limit(e)))
			want = cap;
		if (src)
			make_writable(e, src);	/* no flush may start on it now */
		snap_pin(e, f, &s);
		ret = eng_alloc(e, c, ncp, want);
		if (ret && want > cap)
			ret = eng_alloc(e, c, ncp, cap);
		if (!snap_unpin_holds(e, f, &s)) {
			if (!ret)
				cache_release(c, ncp);
			free(ncp);
			continue;	/* f changed while we waited */
		}
		if (ret) {
			free(ncp);
			if (t < hi) {
				host_only = true;
				continue;
			}
			return NULL;	/* no room anywhere: write-through */
		}
		tier_set_state(&ncp->state, TS_WRITE_IN_PROGRESS);
		n = src ? (src->len < keep ? src->len : keep) : keep;
		ncp->pins++;
		snap_pin(e, f, &s);
		pthread_mutex_unlock(&e->lock);
		ret = fill_copy(f, ncp, src, n);
		pthread_mutex_lock(&e->lock);
		ncp->pins--;
		holds = snap_unpin_holds(e, f, &s);
		if (!holds || ret) {
			tier_set_state(&ncp->state, TS_INIT);
			cache_release(c, ncp);
			free(ncp);
			if (!holds)
				continue;	/* f changed while the bytes moved */
			*err = ret;
			return NULL;
		}
		ncp->len = n;
		install_copy(e, f, t, ncp);
		return ncp;
	}
}

static void mark_modified(struct tfile *f)
{
	f->dirty = true;
	f->gen++;
	touch_mtime(f);
}

/* Move len bytes into cp at off from host memory buf or device address dptr. */
static int copy_in(struct copy *cp, uint64_t off, const void *buf, uint64_t dptr,
		   size_t len)
{
	struct cache *c = cp->cache;
	int ret = copy_bounds(cp, off, len);

	if (ret)
		return ret;
	if (buf)
		return c->ops->write(c, cp->frag->off + off, buf, len);
	if (c->host_addressable)
		return gpu_copy_dtoh(copy_ptr(cp) + off, dptr, len);
	return gpu_copy_dtod((uint64_t)(uintptr_t)(c->base + cp->frag->off + off), dptr, len);
}

/* pwrite from device memory through a bounce buffer. */
static ssize_t pwrite_dev(int fd, uint64_t dptr, size_t len, off_t off)
{
	const size_t chunk = 8u << 20;
	uint8_t *b = malloc(len < chunk ? len : chunk);
	size_t done = 0;
	int ret = 0;

	if (!b)
		return -ENOMEM;
	while (done < len && !ret) {
		size_t n = len - done < chunk ? len - done : chunk;

		ret = gpu_copy_dtoh(b, dptr + done, n);
		if (!ret && pwrite(fd, b, n, off + (off_t)done) != (ssize_t)n)
			ret = errno ? -errno : -EIO;
		done += n;
	}
	free(b);
	return ret ? ret : (ssize_t)len;
}

static ssize_t do_write(struct tfile *f, const void *buf, uint64_t dptr, size_t len,
			off_t off)
{
	struct engine *e = f->eng;
	uint64_t end = (uint64_t)off + len;
	struct copy *cp;
	ssize_t ret;
	int err;

	if (off < 0 || end < (uint64_t)off)
		return -EINVAL;
	pthread_mutex_lock(&f->lock);
	pthread_mutex_lock(&e->lock);
	if (f->shadow_fd < 0) {
		uint64_t cap = end > f->size ? end : f->size;

		bool trace = !buf && tierfs_log_level >= LOG_DEBUG;
		double t0 = trace ? now_s() : 0, t1 = 0, t2 = 0;

		cp = writable_copy(e, f, cap, f->size, &err);
		if (!cp && err) {
			ret = err;
			goto out;
		}
		if (cp) {
			cp->pins++;
			pthread_mutex_unlock(&e->lock);
			if (trace)
				t1 = now_s();
			copy_zero(cp, cp->len, (uint64_t)off);
			ret = copy_in(cp, (uint64_t)off, buf, dptr, len);
			if (trace) {
				t2 = now_s();
				tlog(LOG_DEBUG, "device write of %zu B into the %s cache: "
				     "place %.0f us, copy %.0f us", len, cp->cache->name,
				     (t1 - t0) * 1e6, (t2 - t1) * 1e6);
			}
			pthread_mutex_lock(&e->lock);
			if (ret) {
				cp->pins--;
				pthread_cond_broadcast(&e->cond);
				goto out;
			}
			cp->pins--;
			if (end > cp->len)
				cp->len = end;
			if (end > f->size)
				f->size = end;
			cp->last_use = ++e->tick;
			mark_modified(f);
			pthread_cond_broadcast(&e->cond);
			ret = (ssize_t)len;
			goto out;
		}
		ret = start_shadow(e, f);
		if (ret)
			goto out;
	}
	/* write-through */
	pthread_mutex_unlock(&e->lock);
	if (buf) {
		ret = pwrite(f->shadow_fd, buf, len, off);
		if (ret < 0)
			ret = -errno;
	} else {
		ret = pwrite_dev(f->shadow_fd, dptr, len, off);
	}
	pthread_mutex_lock(&e->lock);
	if (ret < 0)
		f->write_err = (int)ret;	/* for fsync, as write-back would */
	if (ret > 0) {
		uint64_t wend = (uint64_t)off + (uint64_t)ret;
		if (wend > f->size)
			f->size = wend;
		e->bytes_written_through += (uint64_t)ret;
		mark_modified(f);
	}
out:
	pthread_mutex_unlock(&e->lock);
	pthread_mutex_unlock(&f->lock);
	return ret;
}

ssize_t tfile_write(struct tfile *f, const void *buf, size_t len, off_t off)
{
	return do_write(f, buf, 0, len, off);
}

ssize_t tfile_write_dev(struct tfile *f, uint64_t dptr, size_t len, off_t off)
{
	if (!f->eng->gpu)
		return -ENODEV;
	return do_write(f, NULL, dptr, len, off);
}

bool engine_has_gpu(struct engine *e)
{
	return e->gpu != NULL;
}

struct gpu_tier *engine_gpu_tier(struct engine *e)
{
	struct gpu_tier *g;

	pthread_mutex_lock(&e->lock);
	g = e->gpu;
	pthread_mutex_unlock(&e->lock);
	return g;
}

/* e->lock held: wait while a prefetch fills a copy of f (READ_IN_PROGRESS). */
static void wait_filled(struct engine *e, struct tfile *f)
{
	for (;;) {
		bool filling = false;

		for (int i = 0; i < e->ntiers; i++)
			if (f->copy[i] && f->copy[i]->state == TS_READ_IN_PROGRESS)
				filling = true;
		if (!filling)
			return;
		pthread_cond_wait(&e->cond, &e->lock);
	}
}

ssize_t tfile_read_dev(struct tfile *f, uint64_t dptr, size_t len, off_t off)
{
	struct engine *e = f->eng;
	ssize_t ret = 0;
	int i;

	if (!e->gpu)
		return -ENODEV;
	if (off < 0)
		return -EINVAL;
	pthread_mutex_lock(&f->lock);
	pthread_mutex_lock(&e->lock);
	wait_filled(e, f);	/* a prefetch of it is running */
	if ((uint64_t)off >= f->size)
		goto out;
	if ((uint64_t)off + len > f->size)
		len = (size_t)(f->size - (uint64_t)off);
	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];
		struct cache *c;

		if (!cp || cp->state == TS_INIT || (uint64_t)off + len > cp->len)
			continue;
		c = cp->cache;
		cp->pins++;
		c->hits++;
		pthread_mutex_unlock(&e->lock);
		if (c->host_addressable)
			ret = gpu_copy_htod(dptr, copy_ptr(cp) + off, len);
		else
			ret = gpu_copy_dtod(dptr, (uint64_t)(uintptr_t)(c->base + cp->frag->off +
								   (uint64_t)off), len);
		pthread_mutex_lock(&e->lock);
		cp->pins--;
		pthread_cond_broadcast(&e->cond);
		ret = ret ? ret : (ssize_t)len;
		goto out;
	}
	e->tiers[0]->misses++;
	pthread_mutex_unlock(&e->lock);
	{
		/* from the SSD (or the write-through version) via a bounce buffer */
		const size_t chunk = 8u << 20;
		uint8_t *b = malloc(len < chunk ? len : chunk);
		int fd = f->shadow_fd >= 0 ? f->shadow_fd : f->ops->data_fd(f, false);
		size_t done = 0;

		ret = !b ? -ENOMEM : fd < 0 ? fd : 0;
		while (!ret && done < len) {
			size_t n = len - done < chunk ? len - done : chunk;
			ssize_t r = pread(fd, b, n, off + (off_t)done);

			if (r < 0) {
				ret = -errno;
				break;
			}
			if ((size_t)r < n)
				memset(b + r, 0, n - (size_t)r);	/* hole past EOF */
			ret = gpu_copy_htod(dptr + done, b, n);
			done += n;
		}
		if (fd >= 0 && fd != f->shadow_fd)
			f->ops->release_data_fd(f, fd);
		free(b);
		ret = ret ? ret : (ssize_t)len;
	}
	pthread_mutex_lock(&e->lock);
out:
	if (ret >= 0 && read_to_end(f, off, (size_t)ret))
		consume(e, f);
	pthread_mutex_unlock(&e->lock);
	pthread_mutex_unlock(&f->lock);
	return ret;
}

/*
 * ---- client spans (-o gpu_share) ----------------------------------------
 *
 * With a shared GPU cache the client copies device to device itself,
 * between tfile_span_begin() and tfile_span_end(), which run in two
 * different requests.  In between the copy is pinned (no eviction, no
 * move) and counted in cp->spans: writable_copy() waits until no span of
 * the file is open, so no write, truncate or relocation overlaps a span
 * (client write spans of one file take turns, like the writes of
 * do_write() under f->lock).  A write span counts as a writer of the file
 * (f->writers), so its close does not complete the copy under it.
 */
int tfile_span_begin(struct tfile *f, bool write, uint64_t off, uint64_t len,
		     struct tspan *s, uint64_t *cache_off)
{
	struct engine *e = f->eng;
	uint64_t end = off + len;
	struct copy *cp = NULL;
	int ret = 0, err;

	memset(s, 0, sizeof(*s));
	if (!e->gpu)
		return -ENODEV;
	if (off > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX - off)
		return -EINVAL;
	pthread_mutex_lock(&f->lock);
	pthread_mutex_lock(&e->lock);
	if (write) {
		if (f->shadow_fd >= 0) {
			ret = -EAGAIN;	/* written through: the daemon copies */
			goto out;
		}
		cp = writable_copy(e, f, end > f->size ? end : f->size, f->size, &err);
		if (!cp) {
			ret = err ? err : -EAGAIN;
			goto out;
		}
		if (cp->cache->host_addressable) {
			ret = -EAGAIN;	/* not in the GPU tier */
			goto out;
		}
		cp->pins++;
		cp->spans++;
		f->writers++;
		e->client_writes++;
		pthread_mutex_unlock(&e->lock);
		copy_zero(cp, cp->len, off);	/* a hole before the span */
		pthread_mutex_lock(&e->lock);
	} else {
		wait_filled(e, f);	/* a prefetch of it is running */
		if (off >= f->size)
			goto out;	/* nothing to read: no span */
		if (end > f->size)
			len = f->size - off;
		cp = f->copy[0];
		if (!cp || cp->cache != e->tiers[0] || cp->state == TS_INIT ||
		    off + len > cp->len) {
			ret = -EAGAIN;	/* not in the GPU tier */
			goto out;
		}
		cp->pins++;
		cp->spans++;
		cp->last_use = ++e->tick;
		cp->cache->hits++;
		e->client_reads++;
	}
	s->cp = cp;
	s->off = off;
	s->len = len;
	s->write = write;
	*cache_off = cp->frag->off + off;
out:
	pthread_mutex_unlock(&e->lock);
	pthread_mutex_unlock(&f->lock);
	return ret;
}

ssize_t tfile_span_end(struct tfile *f, struct tspan *s, bool ok)
{
	struct engine *e = f->eng;
	struct copy *cp = s->cp;
	ssize_t ret = ok ? (ssize_t)s->len : -EIO;
	uint64_t end = s->off + s->len;

	if (!cp)
		return 0;
	/* not f->lock: a write to the file may hold it while it waits for
	 * this span to end (writable_copy) */
	pthread_mutex_lock(&e->lock);
	cp->pins--;
	cp->spans--;
	if (s->write) {
		/* a failed copy may have changed bytes inside the file: they
		 * are flushed as they are, and the size stays */
		if (ok) {
			if (end > cp->len)
				cp->len = end;
			if (end > f->size)
				f->size = end;
			e->client_bytes += s->len;
		}
		cp->last_use = ++e->tick;
		mark_modified(f);
		writer_done(e, f);	/* a span cannot be written through */
	} else if (ok) {
		e->client_bytes += s->len;
		if (read_to_end(f, (off_t)s->off, (size_t)s->len))
			consume(e, f);
	}
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	s->cp = NULL;
	return ret;
}

int tfile_read_begin(struct tfile *f, size_t len, off_t off,
		     const void **p, size_t *n, struct copy **pin)
{
	struct engine *e = f->eng;
	int i, ret = 0;

	pthread_mutex_lock(&e->lock);
	*n = 0;
	if ((uint64_t)off >= f->size) {
		ret = 1;
		*p = NULL;
		*pin = NULL;
		goto out;
	}
	*n = len;
	if ((uint64_t)off + len > f->size)
		*n = (size_t)(f->size - (uint64_t)off);
	wait_filled(e, f);	/* a prefetch of it: quicker to wait for it */
	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (!cp || cp->state == TS_INIT || cp->state == TS_READ_IN_PROGRESS)
			continue;
		/* being written: the bytes may change while the reply goes
		 * out; tfile_read() copies them under f->lock instead */
		if (cp->state == TS_WRITE_IN_PROGRESS)
			break;
		if (!cp->cache->host_addressable || (uint64_t)off + *n > cp->len)
			continue;
		cp->pins++;
		cp->readers++;	/* writers wait for it (copies_busy) */
		cp->last_use = ++e->tick;
		cp->cache->hits++;
		*p = copy_ptr(cp) + off;
		*pin = cp;
		ret = 1;
		goto out;
	}
out:
	/* consumed now, before the caller replies: once the reader has its
	 * bytes, the restore queue and the state already say so */
	if (ret && read_to_end(f, off, *n))
		consume(e, f);
	pthread_mutex_unlock(&e->lock);
	return ret;
}

void tfile_read_end(struct tfile *f, struct copy *pin)
{
	struct engine *e = f->eng;

	pthread_mutex_lock(&e->lock);
	if (pin) {
		pin->pins--;
		pin->readers--;
		pthread_cond_broadcast(&e->cond);
	}
	pthread_mutex_unlock(&e->lock);
}

ssize_t tfile_read(struct tfile *f, void *buf, size_t len, off_t off)
{
	struct engine *e = f->eng;
	ssize_t ret = 0;
	int fd, i;

	pthread_mutex_lock(&f->lock);
	pthread_mutex_lock(&e->lock);
	if ((uint64_t)off >= f->size)
		goto out;
	if ((uint64_t)off + len > f->size)
		len = (size_t)(f->size - (uint64_t)off);
	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (!cp || cp->state == TS_INIT || cp->state == TS_READ_IN_PROGRESS ||
		    (uint64_t)off + len > cp->len)
			continue;
		cp->pins++;
		cp->cache->hits++;
		pthread_mutex_unlock(&e->lock);
		ret = cp->cache->ops->read(cp->cache, cp->frag->off + (uint64_t)off, buf, len);
		pthread_mutex_lock(&e->lock);
		cp->pins--;
		pthread_cond_broadcast(&e->cond);
		ret = ret ? ret : (ssize_t)len;
		goto out;
	}
	e->host.misses++;
	if (f->shadow_fd >= 0) {
		fd = f->shadow_fd;
		pthread_mutex_unlock(&e->lock);
		ret = pread(fd, buf, len, off);
		if (ret < 0)
			ret = -errno;
		pthread_mutex_lock(&e->lock);
	} else {
		pthread_mutex_unlock(&e->lock);
		fd = f->ops->data_fd(f, false);
		if (fd < 0) {
			ret = fd;
		} else {
			size_t done = 0;
			while (done < len) {
				ssize_t n = pread(fd, (char *)buf + done, len - done,
						  off + (off_t)done);
				if (n < 0) {
					ret = -errno;
					break;
				}
				if (n == 0) {	/* hole past the backing EOF */
					memset((char *)buf + done, 0, len - done);
					done = len;
					break;
				}
				done += (size_t)n;
			}
			if (done == len)
				ret = (ssize_t)len;
			f->ops->release_data_fd(f, fd);
		}
		pthread_mutex_lock(&e->lock);
	}
out:
	if (ret >= 0 && read_to_end(f, off, (size_t)ret))
		consume(e, f);
	pthread_mutex_unlock(&e->lock);
	pthread_mutex_unlock(&f->lock);
	return ret;
}

int tfile_truncate(struct tfile *f, uint64_t size)
{
	struct engine *e = f->eng;
	struct copy *cp;
	int ret = 0, err;

	pthread_mutex_lock(&f->lock);
	pthread_mutex_lock(&e->lock);
	if (size == f->size && !f->dirty && !f->copy[host_index(e)])
		goto out;
	if (f->shadow_fd < 0) {
		/* keep at most `size` bytes of the old content */
		cp = writable_copy(e, f, size ? size : 1, size < f->size ? size : f->size, &err);
		if (!cp && err) {
			ret = err;
			goto out;
		}
		if (cp) {
			copy_zero(cp, cp->len, size);
			cp->len = size;
			f->size = size;
			mark_modified(f);
			if (!f->writers)
				complete_copy(e, f, false);
			goto out;
		}
		ret = start_shadow(e, f);
		if (ret)
			goto out;
	}
	pthread_mutex_unlock(&e->lock);
	if (ftruncate(f->shadow_fd, (off_t)size) < 0)
		ret = -errno;
	pthread_mutex_lock(&e->lock);
	if (!ret) {
		f->size = size;
		mark_modified(f);
		if (!f->writers)
			ret = commit_shadow(e, f, false);
	}
out:
	pthread_mutex_unlock(&e->lock);
	pthread_mutex_unlock(&f->lock);
	return ret;
}

void tfile_open_writer(struct tfile *f)
{
	pthread_mutex_lock(&f->eng->lock);
	f->writers++;
	pthread_mutex_unlock(&f->eng->lock);
}

/* e->lock held: one writer of f is done; the last one completes the file. */
static void writer_done(struct engine *e, struct tfile *f)
{
	if (f->writers > 0)
		f->writers--;
	if (!f->writers && f->dirty && !f->unlinked) {
		if (f->shadow_fd >= 0)
			commit_shadow(e, f, false);
		else
			complete_copy(e, f, false);
	}
}

void tfile_close_writer(struct tfile *f)
{
	struct engine *e = f->eng;

	pthread_mutex_lock(&f->lock);
	pthread_mutex_lock(&e->lock);
	writer_done(e, f);
	pthread_mutex_unlock(&e->lock);
	pthread_mutex_unlock(&f->lock);
}

int tfile_fsync(struct tfile *f)
{
	struct engine *e = f->eng;
	int ret = 0;

	pthread_mutex_lock(&f->lock);
	pthread_mutex_lock(&e->lock);
	if (f->write_err) {		/* an earlier write failed: say so once */
		ret = f->write_err;
		f->write_err = 0;
		goto out;
	}
	if (f->unlinked)
		goto out;
	if (f->shadow_fd >= 0) {
		ret = commit_shadow(e, f, true);
		goto out;
	}
	if (!f->dirty) {
		ret = 0;
		goto out;
	}
	uint64_t target = f->gen;
	complete_copy(e, f, true);
	/* a failed flush is retried now, and its result reported */
	f->retry_at.tv_sec = 0;
	uint64_t errs = e->flush_errors;
	pthread_cond_broadcast(&e->cond);
	while (f->flushed_gen < target && !f->unlinked) {
		if (e->flush_errors != errs && f->flush_err) {
			ret = f->flush_err;
			break;
		}
		if (fastest_copy(e, f) < 0 && f->shadow_fd < 0)
			break;
		pthread_cond_wait(&e->cond, &e->lock);
	}
out:
	pthread_mutex_unlock(&e->lock);
	pthread_mutex_unlock(&f->lock);
	return ret;
}

void tfile_unlinked(struct tfile *f)
{
	struct engine *e = f->eng;
	struct hint *h;
	struct copy *cp;

	pthread_mutex_lock(&e->lock);
	f->unlinked = true;
	for (int i = 0; i < e->ntiers; i++) {
		cp = f->copy[i];
		if (!cp)
			continue;
		backlog_del(e, cp);	/* its flush is cancelled */
		cp->promoted = false;	/* no restore will read it by name */
		if (cp->fileref) {	/* see attach_copy() */
			cp->fileref = false;
			defer_put(e, f);
		}
	}
	/* its restore-queue entries name a file that is gone: they wait for
	 * the next file of that name, as entries written before it do */
	for (h = e->hq_head; h; h = h->next)
		if (h->file == f) {
			h->file = NULL;
			e->hq_unbound++;
			defer_put(e, f);
		}
	f->hint_seq = 0;
	hint_head_update(e);
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
}

bool tfile_attr(struct tfile *f, uint64_t *size, struct timespec *mtime)
{
	bool dirty;

	pthread_mutex_lock(&f->eng->lock);
	dirty = f->dirty;
	*size = f->size;
	*mtime = f->mtime;
	pthread_mutex_unlock(&f->eng->lock);
	return dirty;
}

void tfile_set_mtime(struct tfile *f, const struct timespec *mt)
{
	pthread_mutex_lock(&f->eng->lock);
	f->mtime = *mt;
	pthread_mutex_unlock(&f->eng->lock);
}

int tfile_pending_error(struct tfile *f)
{
	int ret;

	pthread_mutex_lock(&f->eng->lock);
	ret = f->flush_err ? f->flush_err : f->write_err;
	pthread_mutex_unlock(&f->eng->lock);
	return ret;
}

int tfile_describe(struct tfile *f, char *tier, size_t tl, char *state, size_t sl)
{
	struct engine *e = f->eng;
	size_t a = 0, b = 0;
	int i;

	pthread_mutex_lock(&e->lock);
	tier[0] = state[0] = 0;
	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (!cp)
			continue;
		a += (size_t)snprintf(tier + a, a < tl ? tl - a : 0, "%s%s",
				      a ? "," : "", cp->cache->name);
		b += (size_t)snprintf(state + b, b < sl ? sl - b : 0, "%s%s:%s",
				      b ? "," : "", cp->cache->name,
				      tier_state_name(cp->state));
	}
	if (!f->dirty || f->shadow_fd >= 0 || f->flushed_gen)
		a += (size_t)snprintf(tier + a, a < tl ? tl - a : 0, "%sssd", a ? "," : "");
	b += (size_t)snprintf(state + b, b < sl ? sl - b : 0, "%sssd:%s",
			      b ? "," : "",
			      f->shadow_fd >= 0 ? "WRITE_THROUGH" :
			      f->dirty ? (f->flush_err ? "FLUSH_FAILED" : "PENDING") :
			      "CURRENT");
	pthread_mutex_unlock(&e->lock);
	return (a >= tl || b >= sl) ? -ERANGE : 0;
}


static void cache_json(struct cache *c, char *buf, size_t len, size_t *at)
{
	*at += (size_t)snprintf(buf + *at, *at < len ? len - *at : 0,
		"\"%s\":{\"capacity\":%" PRIu64 ",\"usable\":%" PRIu64
		",\"used\":%" PRIu64 ",\"fragments\":%" PRIu64 ",\"gaps\":%" PRIu64
		",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64 ",\"evictions\":%" PRIu64
		",\"evicted_bytes\":%" PRIu64 ",\"evicted_queued\":%" PRIu64
		",\"policy\":\"%s\"}",
		c->name, c->size, c->usable, c->used, c->nfrags, c->ngaps,
		c->hits, c->misses, c->evictions, c->evicted_bytes, c->evicted_queued,
		c->policy->name);
}

int engine_stats_json(struct engine *e, char *buf, size_t len)
{
	size_t at = 0;
	int i;

	pthread_mutex_lock(&e->lock);
	at += (size_t)snprintf(buf, len, "{\"tiers\":{");
	for (i = 0; i < e->ntiers; i++) {
		if (e->tiers[i] == &e->gpu_slot)
			continue;	/* no GPU tier (yet) */
		if (at > 0 && at <= len && buf[at - 1] != '{')
			at += (size_t)snprintf(buf + at, at < len ? len - at : 0, ",");
		cache_json(e->tiers[i], buf, len, &at);
		if (at < len && at > 0) {
			at--;		/* extend the tier's object */
			if (e->gpu && e->tiers[i] == e->tiers[0]) {
				int n = gpu_tier_stats_json(e->gpu, buf + at, len - at);
				at += n > 0 ? (size_t)n : 0;
				at += (size_t)snprintf(buf + at, at < len ? len - at : 0,
						       ",\"bytes_to_host\":%" PRIu64
						       ",\"to_host_bandwidth\":%.0f"
						       ",\"client_writes\":%" PRIu64
						       ",\"client_reads\":%" PRIu64
						       ",\"client_bytes\":%" PRIu64, e->bytes_to_host,
						       e->to_host_s > 0 ? (double)e->bytes_to_host /
						       e->to_host_s : 0.0, e->client_writes,
						       e->client_reads, e->client_bytes);
			} else if (e->tiers[i] == &e->host) {
				at += (size_t)snprintf(buf + at, at < len ? len - at : 0,
						       ",\"touched\":%" PRIu64 ",\"pinned\":%s",
						       __atomic_load_n(&e->touched, __ATOMIC_RELAXED),
						       e->host_pinned ? "true" : "false");
			}
			at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "}");
		}
	}
	at += (size_t)snprintf(buf + at, at < len ? len - at : 0,
		"},\"host_touched\":%" PRIu64 ",\"ssd\":{", __atomic_load_n(&e->touched, __ATOMIC_RELAXED));
	at += (size_t)snprintf(buf + at, at < len ? len - at : 0,
		"\"bytes_flushed\":%" PRIu64 ",\"files_flushed\":%" PRIu64
		",\"flush_errors\":%" PRIu64 ",\"flush_backlog\":%" PRIu64
		",\"flushes_running\":%d,\"flush_bandwidth\":%.0f"
		",\"bytes_written_through\":%" PRIu64 ",\"files_written_through\":%" PRIu64 "}}",
		e->bytes_flushed, e->files_flushed, e->flush_errors, e->backlog,
		e->busy, e->flush_bw, e->bytes_written_through, e->files_written_through);
	if (at)
		at--;			/* reopen the outer object */
	at += (size_t)snprintf(buf + at, at < len ? len - at : 0,
		",\"prefetch\":{\"state\":\"%s\",\"queue\":%" PRIu64
		",\"unbound\":%" PRIu64 ",\"files_prefetched\":%" PRIu64
		",\"bytes_prefetched\":%" PRIu64 ",\"distance\":%" PRIu64
		",\"files_to_gpu\":%" PRIu64 ",\"bytes_to_gpu\":%" PRIu64
		",\"consumed\":%" PRIu64 "}}",
		e->prefetch_on ? "start" : "stop", e->hq_len, e->hq_unbound,
		e->files_prefetched, e->bytes_prefetched, prefetch_distance(e),
		e->files_to_gpu, e->bytes_to_gpu, e->files_consumed);
	pthread_mutex_unlock(&e->lock);
	return at >= len ? -ERANGE : (int)at;
}

/* ---- restore hints ---------------------------------------------------- */

/* e->lock held: the queue's head moved or an entry went; keep tickets. */
static void hint_head_update(struct engine *e)
{
	e->hint_head = e->hq_head ? e->hq_head->seq : e->hint_next;
	pthread_cond_broadcast(&e->cond);
}

/* e->lock held: set f->hint_seq to its first remaining entry. */
static void hint_reseq(struct engine *e, struct tfile *f)
{
	struct hint *h;

	f->hint_seq = 0;
	for (h = e->hq_head; h; h = h->next)
		if (h->file == f) {
			f->hint_seq = h->seq;
			return;
		}
}

static void hint_free(struct engine *e, struct hint *h)
{
	e->hq_gen++;
	if (h->file)
		defer_put(e, h->file);
	else
		e->hq_unbound--;
	e->hq_len--;
	free(h);
}

int engine_hint_append(struct engine *e, uint64_t dir, const char *const *names,
		       struct tfile *const *files, size_t n)
{
	struct hint **v = calloc(n ? n : 1, sizeof(*v));
	size_t i;

	if (!v)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		size_t l = strlen(names[i]) + 1;

		v[i] = malloc(sizeof(struct hint) + l);
		if (!v[i]) {
			while (i--)
				free(v[i]);
			free(v);
			return -ENOMEM;
		}
		memcpy(v[i]->name, names[i], l);
	}
	pthread_mutex_lock(&e->lock);
	for (i = 0; i < n; i++) {
		struct hint *h = v[i];

		h->next = NULL;
		h->seq = ++e->hint_next;
		h->dir = dir;
		h->file = files[i];
		if (h->file && !h->file->hint_seq)
			h->file->hint_seq = h->seq;
		if (!h->file)
			e->hq_unbound++;
		e->hq_len++;
		if (e->hq_tail)
			e->hq_tail->next = h;
		else
			e->hq_head = h;
		e->hq_tail = h;
	}
	hint_head_update(e);
	pthread_mutex_unlock(&e->lock);
	free(v);
	return 0;
}

void engine_hint_bind(struct engine *e, uint64_t dir, const char *name,
		      struct tfile *f)
{
	struct hint *h;

	pthread_mutex_lock(&e->lock);
	if (!e->hq_unbound)
		goto out;
	for (h = e->hq_head; h; h = h->next) {
		if (h->file || h->dir != dir || strcmp(h->name, name))
			continue;
		h->file = f;
		f->ops->get(f);
		e->hq_unbound--;
		if (!f->hint_seq || h->seq < f->hint_seq)
			f->hint_seq = h->seq;
	}
	pthread_cond_broadcast(&e->cond);
out:
	pthread_mutex_unlock(&e->lock);
}

int engine_hint_list(struct engine *e, uint64_t dir, char *buf, size_t len)
{
	struct hint *h;
	size_t at = 0;

	pthread_mutex_lock(&e->lock);
	for (h = e->hq_head; h; h = h->next)
		if (h->dir == dir)
			at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s\n", h->name);
	pthread_mutex_unlock(&e->lock);
	return at >= len && at ? -ERANGE : (int)at;
}

void engine_hint_drop_dir(struct engine *e, uint64_t dir)
{
	struct hint **pp, *h;

	pthread_mutex_lock(&e->lock);
	for (pp = &e->hq_head; (h = *pp);) {
		if (h->dir != dir) {
			pp = &h->next;
			continue;
		}
		*pp = h->next;
		if (h->file) {
			struct tfile *f = h->file;

			hint_free(e, h);
			hint_reseq(e, f);
		} else {
			hint_free(e, h);
		}
	}
	e->hq_tail = NULL;
	for (h = e->hq_head; h; h = h->next)
		e->hq_tail = h;
	hint_head_update(e);
	pthread_mutex_unlock(&e->lock);
}

void engine_prefetch_set(struct engine *e, bool on)
{
	pthread_mutex_lock(&e->lock);
	e->prefetch_on = on;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
}

bool engine_prefetch_get(struct engine *e)
{
	bool on;

	pthread_mutex_lock(&e->lock);
	on = e->prefetch_on;
	pthread_mutex_unlock(&e->lock);
	return on;
}

/*
 * e->lock held: f was read to its end.  Its copy becomes CONSUMED (first
 * to go at eviction) and its first queue entry is done.
 */
static void consume(struct engine *e, struct tfile *f)
{
	struct hint **pp, *h;
	int i;

	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (!cp)
			continue;
		if (cp->state == TS_FLUSHED)
			tier_set_state(&cp->state, TS_READ_COMPLETE);
		if (cp->state == TS_READ_COMPLETE)
			tier_set_state(&cp->state, TS_CONSUMED);
		cp->promoted = false;
	}
	if (!f->hint_seq)
		return;
	for (pp = &e->hq_head; (h = *pp); pp = &h->next)
		if (h->file == f) {
			*pp = h->next;
			if (e->hq_tail == h) {
				struct hint *t;

				e->hq_tail = NULL;
				for (t = e->hq_head; t; t = t->next)
					e->hq_tail = t;
			}
			hint_free(e, h);
			e->files_consumed++;
			break;
		}
	hint_reseq(e, f);
	hint_head_update(e);
}

/* Prefetch distance now: queue entries at the head already cached. */
static uint64_t prefetch_distance(struct engine *e)
{
	struct hint *h;
	uint64_t d = 0;

	for (h = e->hq_head; h; h = h->next) {
		int t = h->file ? fastest_copy(e, h->file) : -1;
		struct copy *cp = t >= 0 ? h->file->copy[t] : NULL;

		if (!cp || cp->state == TS_INIT || cp->state == TS_READ_IN_PROGRESS)
			break;
		d++;
	}
	return d;
}

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
	pthread_mutex_unlock(&e->lock);
	f->ops->put(f);
	pthread_mutex_lock(&e->lock);
	return ret;
}

/* promote_gpu() with the checks done and a reference on f held */
static int promote_gpu_held(struct engine *e, struct tfile *f, uint64_t dist)
{
	int hi = host_index(e);
	struct cache *g = e->tiers[0];
	struct copy *hcp = f->copy[hi], *gcp;
	uint64_t size = f->size;
	int ret;

	gcp = calloc(1, sizeof(*gcp));
	if (!gcp)
		return -ENOMEM;
	gcp->file = f;
	hcp->pins++;
	protect_below = dist + 1;
	ret = eng_alloc_wait(e, g, gcp, size, 0.05);
	protect_below = 0;
	if (ret) {
		hcp->pins--;
		pthread_cond_broadcast(&e->cond);
		free(gcp);
		return ret == -EFBIG ? 0 : -ENOSPC;
	}
	if (f->copy[0] || f->dirty || f->copy[hi] != hcp) {	/* changed meanwhile */
		hcp->pins--;
		cache_release(g, gcp);
		free(gcp);
		pthread_cond_broadcast(&e->cond);
		return 0;
	}
	tier_set_state(&gcp->state, TS_READ_IN_PROGRESS);
	attach_copy(e, f, 0, gcp);
	gcp->pins++;
	pthread_mutex_unlock(&e->lock);
	ret = copy_bounds(gcp, 0, size);
	if (!ret)
		ret = copy_bounds(hcp, 0, size);
	if (!ret)
		ret = g->ops->write(g, gcp->frag->off, copy_ptr(hcp), size);
	pthread_mutex_lock(&e->lock);
	gcp->pins--;
	hcp->pins--;
	if (ret || f->size != size || f->dirty) {
		if (ret)
			tlog(LOG_WARNING, "host -> GPU prefetch copy failed: %s", strerror(-ret));
		if (f->copy[0] == gcp && gcp->state == TS_READ_IN_PROGRESS) {
			tier_set_state(&gcp->state, TS_INIT);
			drop_copy(e, f, 0);
		}
		pthread_cond_broadcast(&e->cond);
		return 0;
	}
	gcp->len = size;
	tier_set_state(&gcp->state, TS_READ_COMPLETE);
	gcp->promoted = true;
	if (hcp->state == TS_FLUSHED)
		tier_set_state(&hcp->state, TS_READ_COMPLETE);
	if (hcp->state == TS_READ_COMPLETE)
		tier_set_state(&hcp->state, TS_CONSUMED);
	hcp->promoted = false;
	e->files_to_gpu++;
	e->bytes_to_gpu += size;
	pthread_cond_broadcast(&e->cond);
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
	protect_below = dist + 1;
	ret = eng_alloc_wait(e, c, cp, size, 0.05);
	protect_below = 0;
	if (!ret && (fastest_copy(e, f) >= 0 || f->dirty || f->unlinked ||
		     f->size != size)) {	/* a writer came first */
		cache_release(c, cp);
		ret = 1;
	}
	if (ret) {
		free(cp);
		pthread_mutex_unlock(&e->lock);
		f->ops->put(f);
		pthread_mutex_lock(&e->lock);
		return ret < 0 ? -ENOSPC : 0;
	}
	tier_set_state(&cp->state, TS_READ_IN_PROGRESS);
	attach_copy(e, f, hi, cp);
	cp->pins++;
	pthread_mutex_unlock(&e->lock);

	fd = f->ops->data_fd(f, true);
	if (fd < 0) {
		ret = fd;
	} else {
		ret = copy_bounds(cp, 0, tier_round(size));
		if (!ret)
			ret = ssd_read(ring, fd, copy_ptr(cp), tier_round(size), 0);
		f->ops->release_data_fd(f, fd);
	}

	pthread_mutex_lock(&e->lock);
	cp->pins--;
	if (ret || f->size != size || f->dirty) {
		/* failed, or changed meanwhile: drop the copy */
		if (ret) {
			char nb[256];

			pthread_mutex_unlock(&e->lock);
			fname(f, nb, sizeof(nb));
			pthread_mutex_lock(&e->lock);
			tlog(LOG_WARNING, "%s: prefetch failed: %s", nb, strerror(-ret));
		}
		if (f->copy[hi] == cp && cp->state == TS_READ_IN_PROGRESS) {
			tier_set_state(&cp->state, TS_INIT);
			drop_copy(e, f, hi);
		}
		pthread_cond_broadcast(&e->cond);
		pthread_mutex_unlock(&e->lock);
		f->ops->put(f);
		pthread_mutex_lock(&e->lock);
		return 0;
	}
	cp->len = size;
	tier_set_state(&cp->state, TS_READ_COMPLETE);
	cp->promoted = true;
	e->files_prefetched++;
	e->bytes_prefetched += size;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	f->ops->put(f);
	pthread_mutex_lock(&e->lock);
	return 1;
}

static void *prefetcher_main(void *arg)
{
	struct engine *e = arg;
	struct ssd_ring ring;
	int ret;

	ret = ssd_ring_init(&ring, e->cfg.queue_depth, e->cfg.chunk);
	if (ret) {
		tlog(LOG_CRIT, "io_uring setup for prefetching failed: %s", strerror(-ret));
		return NULL;
	}
	pthread_mutex_lock(&e->lock);
	while (!e->stop) {
		struct hint *h;
		bool did = false;

		if (e->prefetch_on) {
			for (h = e->hq_head; h && !e->stop; h = h->next) {
				uint64_t dist = h->seq - e->hint_head;

				uint64_t gen = e->hq_gen;

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
		cond_wait_ms(e, 50);
	}
	pthread_mutex_unlock(&e->lock);
	ssd_ring_exit(&ring);
	return NULL;
}
