/*
 * flush.c - the two flush queues and their threads (a queue and its
 * threads per job, as Redis's bio.c; their idle waits are on e->events,
 * woken by eng_wake(), not by every lease's end):
 *  - the SSD flush queue (e->q_head), and the aging queue (e->aq_head)
 *    where small files wait cfg.flush_age_ms after their close before
 *    they join it (eng_queue_flush_aged): flushers write a file's newest
 *    complete copy into a new version of its backing file with O_DIRECT
 *    through io_uring, fdatasync it and ask the fs side to commit it
 *    (atomic rename); a failed flush is retried every FLUSH_RETRY_S;
 *  - the GPU -> host queue (e->gq_head): the cascade thread copies a GPU
 *    copy into a new host copy, which then goes to the SSD queue.
 * Flushers also drop deferred file references (e->reap).
 *
 * Owns: the queues and the tfile fields queued, aging, due_at, gqueued,
 * fq_next, gq_next, retry_at, flush_err, flushed_gen; e->busy, flush_bw
 * and the flush statistics.  The threads hold e->lock except while bytes
 * move (under a lease) and while they call tfile_ops (version_open/commit,
 * put, name: those take fs locks).  They never take a tfile.lock.  Calls
 * place.c and backing.c.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include "engine_int.h"
#include "ssd.h"

/* ---- flush queue ------------------------------------------------------ */

/* e->lock held: unlink f, which is on the queue head..tail. */
static void queue_remove(struct tfile **head, struct tfile **tail, struct tfile *f)
{
	struct tfile **pp = head, *prev = NULL;

	while (*pp && *pp != f) {
		prev = *pp;
		pp = &prev->fq_next;
	}
	if (!*pp)
		return;
	*pp = f->fq_next;
	if (*tail == f)
		*tail = prev;
	f->fq_next = NULL;
}

/* e->lock held: take f, which is on it, off the aging queue (its
 * reference stays with the caller). */
static void aging_remove(struct engine *e, struct tfile *f)
{
	if (f->aq_prev)
		f->aq_prev->fq_next = f->fq_next;
	else
		e->aq_head = f->fq_next;
	if (f->fq_next)
		f->fq_next->aq_prev = f->aq_prev;
	else
		e->aq_tail = f->aq_prev;
	f->fq_next = f->aq_prev = NULL;
	f->aging = false;
	e->aq_len--;
}

/*
 * Queue f's flush to run as soon as a flusher is free (front: before the
 * others, for an fsync).  A file already waiting on the aging queue moves
 * over; one already on the flush queue moves to its front when asked.
 */
void eng_queue_flush(struct engine *e, struct tfile *f, bool front)
{
	if (f->unlinked && !f->queued)
		return;
	if (f->queued && f->aging) {
		aging_remove(e, f);
	} else if (f->queued) {
		if (!front || e->q_head == f)
			return;
		queue_remove(&e->q_head, &e->q_tail, f);
	} else {
		f->queued = true;
		f->ops->get(f);
	}
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
	eng_wake(e);
}

/*
 * Queue the background flush of f, whose newest copy holds len bytes.  A
 * small file waits cfg.flush_age_ms on the aging queue first: rewritten,
 * or removed, by then (a build's or a mail spool's short-lived files, a
 * checkpoint's small companions rewritten each step), it costs the disk
 * one flush or none instead of one per close, and no flush competes with
 * the fsyncs of other files meanwhile.  Large files (checkpoints) go at
 * once: the cache room they hold comes back only once they are flushed.
 * An fsync (flush_waiters), a writer waiting for cache room
 * (room_waiters), an eviction asked for (engine_evict_file) or the
 * unmount make an aging flush due at once.
 */
void eng_queue_flush_aged(struct engine *e, struct tfile *f, uint64_t len)
{
	if (!e->cfg.flush_age_ms || len > FLUSH_AGED_MAX || f->flush_waiters || e->stop ||
	    (f->queued && !f->aging)) {
		eng_queue_flush(e, f, false);
		return;
	}
	if (f->queued || f->unlinked)
		return;		/* aging already: due at its first close's age */
	f->queued = f->aging = true;
	f->ops->get(f);
	f->due_at = tier_now() + e->cfg.flush_age_ms / 1e3;
	f->fq_next = NULL;
	f->aq_prev = e->aq_tail;
	if (e->aq_tail)
		e->aq_tail->fq_next = f;
	else
		e->aq_head = f;
	e->aq_tail = f;
	e->aq_len++;
	if (e->aq_head == f)	/* else the flushers wait for an earlier one */
		eng_wake(e);
}

void engine_flush_now(struct engine *e, struct tfile *f)
{
	eng_lock(e);
	if (f) {
		if (f->queued && f->aging)
			eng_queue_flush(e, f, false);
	} else {
		while (e->aq_head)
			eng_queue_flush(e, e->aq_head, false);
	}
	eng_unlock(e);
}

/*
 * Per-stage times of the flush running on this thread, added to the
 * engine's totals at the end of flush_one() (one flush per thread at a
 * time): FICLONERANGE calls and the version's fsync/fdatasync.
 */
static __thread double fl_clone_s, fl_sync_s;

static int timed_clone(int dst, uint64_t doff, int src, uint64_t soff, uint64_t len)
{
	double t0 = tier_now();
	int ret = dedup_clone(dst, doff, src, soff, len);

	fl_clone_s += tier_now() - t0;
	return ret;
}

/* e->cfg.ordered_log holds for fd: it is on that file system. */
static bool ordered_here(struct engine *e, int fd)
{
	struct stat st;

	return e->cfg.ordered_log && fstat(fd, &st) == 0 && st.st_dev == e->cfg.ordered_dev;
}

/* Wait for the writes of fd already made or under way to complete. */
static int wait_written(int fd)
{
	return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
			       SYNC_FILE_RANGE_WAIT_AFTER) < 0 ? -errno : 0;
}

/*
 * Make a version holding extents cloned from earlier versions (an
 * incremental or a de-duplicated flush) stable before its rename.  Where
 * the log is ordered (eng_settle_version), as a whole version is: the
 * clones are logged changes of its extent map, committed in order before
 * the rename, and the blocks they share were written and completed for
 * the earlier version (its own settle), so the rename's commit, which
 * flushes the disk's cache first, makes all of it durable; the writes
 * over shared blocks (copy-on-write) are remapped when they complete,
 * before the wait returns.  Elsewhere an fsync, not an fdatasync: the
 * clones changed the extent map.  (tests/test_crash_states.py writes
 * such versions on XFS.)
 */
static int settle_cloned(struct engine *e, int fd)
{
	double t0 = tier_now();
	int ret = ordered_here(e, fd) ? wait_written(fd) : fsync(fd) < 0 ? -errno : 0;

	fl_sync_s += tier_now() - t0;
	return ret;
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
	eng_wake(e);
}

/* Mark the newest copy complete and queue it for flushing. */
void eng_complete_copy(struct engine *e, struct tfile *f, bool front)
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
	else if (front)
		eng_queue_flush(e, f, true);
	else
		eng_queue_flush_aged(e, f, cp->len);
}

/* ---- incremental flushes (-o dedup) ------------------------------------ */

/*
 * What an incremental flush needs, taken under e->lock when the flush
 * starts: the ranges changed since the base and how much of the base may
 * be cloned.
 */
struct incr {
	bool on;
	struct drange *r;
	uint32_t n;
	uint64_t base_len;	/* the size the base must have */
	uint64_t clone;		/* clone [0, clone) from the base */
	uint64_t align;		/* ranges rounded out to this */
	uint64_t written;	/* statistics: bytes written, */
	uint64_t cloned;	/* and bytes shared with the base */
	bool done;		/* the version was made this way */
	/* the base's entry in the chunk index, carried over to the new
	 * version (dd_src_carry): the chunks that changed, with the hashes
	 * of those that are full chunks of the new version (NULL: none) */
	struct dd_src *carry;
	uint64_t *ck, nck;
	struct dd_hash *ch;
};

/* e->lock held: plan an incremental flush of len bytes of f, if it can be. */
static void incr_plan(struct engine *e, struct tfile *f, uint64_t len, struct incr *in)
{
	uint64_t blk = e->cfg.dedup_block, c;

	memset(in, 0, sizeof(*in));
	if (!e->cfg.dedup || !blk || !f->dd.valid)
		return;
	/* O_DIRECT writes want TIER_ALIGN; blocks are powers of two */
	blk = blk < TIER_ALIGN ? TIER_ALIGN : blk;
	c = f->dd.clean_len < f->dd.base_len ? f->dd.clean_len : f->dd.base_len;
	if (c > len)
		c = len;
	c -= c % blk;
	if (!c || dset_dup(&f->dd.ranges, &in->r, &in->n))
		return;		/* nothing to share, or no memory: all written */
	in->base_len = f->dd.base_len;
	in->clone = c;
	in->align = blk;
	in->on = true;
}

/*
 * ssd_write_segs() through a flusher's io_uring, or, without one (ring
 * NULL: an fsync flushing its small file itself, eng_flush_inline), plain
 * writes in the caller's thread.
 */
static int write_segs(struct ssd_ring *ring, int fd, const struct ssd_seg *seg, unsigned n,
		      uint64_t *progress)
{
	if (ring)
		return ssd_write_segs(ring, fd, seg, n, progress);
	for (unsigned i = 0; i < n; i++) {
		int ret = backing_pwrite(fd, seg[i].buf, seg[i].len, (off_t)seg[i].off);

		if (ret)
			return ret;
		if (progress)
			__atomic_add_fetch(progress, seg[i].len, __ATOMIC_RELAXED);
	}
	return 0;
}

/* Write bytes [a, b) of cp at the same offset of fd. */
static int write_range(struct ssd_ring *ring, int fd, struct copy *cp, uint64_t a,
		       uint64_t b, uint64_t *progress)
{
	if (b <= a)
		return 0;
	if (!cp->cache->host_addressable)
		return backing_move(&(struct bend){ .kind = BEND_FD, .fd = fd, .at = a },
				    &(struct bend){ .kind = BEND_CACHE, .cache = cp->cache,
						    .at = cp->frag->off + a },
				    b - a, NULL);
	return write_segs(ring, fd, &(struct ssd_seg){ .off = a, .len = b - a,
						       .buf = copy_ptr(cp) + a }, 1, progress);
}

/*
 * Write bytes [a, b) of cp at the same offset of fd, its holes
 * (backing_run) left out: a fresh version's are holes already, and a
 * version written in place (inplace) has them punched (written as zeros
 * where the file system cannot punch).  a is a multiple of TIER_ALIGN.
 * Only host-addressable copies are looked at; others are written whole.
 */
static int write_sparse(struct ssd_ring *ring, int fd, struct copy *cp, uint64_t a,
			uint64_t b, uint64_t *progress, bool inplace)
{
	struct ssd_seg *seg = NULL, *ns;
	unsigned n = 0, cap = 0;
	uint64_t pos, next, holes = 0;
	bool hole;
	int ret = 0;

	if (!cp->cache->host_addressable)
		return write_range(ring, fd, cp, a, b, progress);
	for (pos = a; pos < b && !ret; pos = next) {
		next = backing_run(copy_ptr(cp), pos, b, &hole);
		if (hole) {
			holes += next - pos;
			if (inplace && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
						 (off_t)pos, (off_t)(next - pos)) < 0)
				ret = write_range(ring, fd, cp, pos, next, progress);
			continue;
		}
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			ns = realloc(seg, cap * sizeof(*seg));
			if (!ns) {
				ret = -ENOMEM;	/* retried, like any failed flush */
				break;
			}
			seg = ns;
		}
		seg[n++] = (struct ssd_seg){ .off = pos, .len = next - pos,
					     .buf = copy_ptr(cp) + pos };
	}
	if (!ret && n)
		ret = write_segs(ring, fd, seg, n, progress);
	free(seg);
	if (!ret && progress)
		__atomic_add_fetch(progress, holes, __ATOMIC_RELAXED);
	return ret;
}

/*
 * Fill version fd with cp's len bytes incrementally: clone the base's
 * unchanged blocks, write the changed ranges and the tail.  e->lock not
 * held, cp leased.  Returns 0, -EAGAIN when the base is not what the plan
 * says (nothing written: the caller writes it all), or -errno.
 */
static int flush_incr(struct engine *e, struct ssd_ring *ring, struct tfile *f,
		      struct copy *cp, int fd, bool direct, uint64_t len, struct incr *in)
{
	uint64_t end = direct ? tier_round(len) : len, done = 0;
	struct stat st;
	int src, ret;

	src = f->ops->data_fd(f, false);
	if (src < 0)
		return -EAGAIN;
	if (fstat(src, &st) < 0 || (uint64_t)st.st_size != in->base_len)
		ret = -EAGAIN;	/* not the base the ranges were kept against */
	else
		ret = timed_clone(fd, 0, src, 0, in->clone);
	f->ops->release_data_fd(f, src);
	if (ret)
		return -EAGAIN;
	uint64_t inner = 0, last = 0;
	bool host = cp->cache->host_addressable;
	unsigned ns = 0, cap = in->n + 1;
	struct ssd_seg *seg = host ? malloc(cap * sizeof(*seg)) : NULL, *more;

	if (host && !seg)
		return -ENOMEM;		/* retried, like any failed flush */
	for (uint32_t i = 0; i < in->n && !ret; i++) {
		uint64_t a = in->r[i].start, b = in->r[i].end;

		a -= a % in->align;
		if (a < last)
			a = last;	/* neighbours rounded into each other */
		if (b % in->align)
			b += in->align - b % in->align;
		if (b > in->clone)
			b = in->clone;	/* the rest goes with the tail */
		if (a >= b)
			continue;
		inner += b - a;
		last = b;
		/* written together, below; runs of zeros (a punched hole)
		 * punched over the clone instead */
		for (uint64_t p = a, q; host && p < b && !ret; p = q) {
			bool hole;

			q = backing_run(copy_ptr(cp), p, b, &hole);
			if (hole && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
					      (off_t)p, (off_t)(q - p)) == 0)
				continue;
			if (ns == cap) {
				cap *= 2;
				more = realloc(seg, cap * sizeof(*seg));
				if (!more) {
					ret = -ENOMEM;
					break;
				}
				seg = more;
			}
			seg[ns++] = (struct ssd_seg){ .off = p, .len = q - p,
						      .buf = copy_ptr(cp) + p };
		}
		if (host)
			continue;
		ret = write_range(ring, fd, cp, a, b, &done);
		tierfs_fault_kill("incr_write");
	}
	if (host && !ret && ns) {
		/* the first range alone first: the test hook's kill point */
		ret = write_segs(ring, fd, seg, 1, &done);
		tierfs_fault_kill("incr_write");
		if (!ret)
			ret = write_segs(ring, fd, seg + 1, ns - 1, &done);
	}
	free(seg);
	if (!ret)	/* past what was cloned the version is a hole */
		ret = write_sparse(ring, fd, cp, in->clone, end, &done, false);
	in->written = inner + (end > in->clone ? end - in->clone : 0);
	in->cloned = in->clone - inner;
	__atomic_store_n(&cp->flushed_bytes, len, __ATOMIC_RELAXED);
	if (!ret && ftruncate(fd, (off_t)len) < 0)
		ret = -errno;
	if (!ret)
		ret = settle_cloned(e, fd);
	return ret;
}

/* ---- content de-duplication of whole new files (-o dedup) -------------- */

#define DD_SRC_MAX	1024	/* versions held open for cloning */
#define DD_SAMPLE	8	/* chunks hashed first when recent files were new */
#define DD_LOW		0.03	/* "almost all new": less than this found */
#define DD_MIN_RUN	(64u << 10)	/* shorter runs of found chunks are
					 * written: a FICLONERANGE costs more
					 * than writing a few blocks */

static void dd_src_free(struct dd_src *s)
{
	free(s->cgen);
	free(s);
}

/* e->lock held: drop a reference on s; the last one frees it. */
static void dd_src_put(struct dd_src *s)
{
	if (--s->refs == 0)
		dd_src_free(s);
}

/* e->lock held: fd (of a version) is closed by a flusher: the last close
 * of a replaced version frees its blocks, a journal operation, never
 * under e->lock. */
static void dd_close_later(struct engine *e, int fd)
{
	if (fd < 0)
		return;
	if (e->dd.nclose == e->dd.closecap) {
		size_t cap = e->dd.closecap ? 2 * e->dd.closecap : 16;
		int *c = realloc(e->dd.close, cap * sizeof(*c));

		if (c) {
			e->dd.close = c;
			e->dd.closecap = cap;
		}
	}
	if (e->dd.nclose < e->dd.closecap)
		e->dd.close[e->dd.nclose++] = fd;
	else
		close(fd);	/* no memory: rather a slow close than a leak */
	pthread_cond_broadcast(&e->cond);
}

/* e->lock held: s's chunks may not be cloned any more; its fd is closed
 * by a flusher. */
static void dd_src_retire(struct engine *e, struct dd_src *s)
{
	if (s->retired)
		return;
	s->retired = true;
	((struct tfile *)s->owner)->dd.src = NULL;
	s->owner = NULL;
	if (s->prev)
		s->prev->next = s->next;
	else
		e->dd.live = s->next;
	if (s->next)
		s->next->prev = s->prev;
	else
		e->dd.live_tail = s->prev;
	e->dd.nlive--;
	dd_close_later(e, s->fd);
	s->fd = -1;
	if (s->cgen) {		/* no entry of it is valid any more */
		e->dd.cgen_bytes -= s->nchunks * sizeof(*s->cgen);
		free(s->cgen);
		s->cgen = NULL;
	}
	dd_src_put(s);		/* the owner's reference */
}

/*
 * e->lock held, when f's next version is about to be flushed
 * incrementally: suspend its version in the index instead of retiring it
 * (nothing is found in it or cloned from it until dd_src_carry()).
 * Returns it, referenced, or NULL (then retire it as usual).
 */
static struct dd_src *dd_src_suspend(struct engine *e, struct dd_src *s)
{
	if (!s || s->retired || s->fd < 0 || s->epoch >= UINT32_MAX - 1 ||
	    e->dd.cgen_bytes > e->cfg.dedup_index / 4)
		return NULL;	/* no room for more chunk generations */
	dd_close_later(e, s->fd);	/* the old version: it is not changed,
					 * only replaced (or changed in place:
					 * then it is never taken back) */
	s->fd = -1;
	s->epoch++;
	s->refs++;
	return s;
}

/*
 * e->lock held, after the flush that dd_src_suspend() was for.  When that
 * flush made f's new version incrementally (in->done) and committed it
 * (vfd: that version, read), s takes it over: the chunks the flush changed
 * get the new epoch (their older entries are no longer found), the new
 * hashes of changed chunks are added, the other entries stay (the
 * unchanged chunks are clones of the same bytes at the same offsets).
 * Otherwise s is retired.  Takes vfd and s's reference.
 */
static void dd_src_carry(struct engine *e, struct tfile *f, struct dd_src *s, int vfd,
			 struct incr *in, uint64_t len)
{
	uint64_t C = s->chunk, nn = C ? len / C : 0, cap, first;
	struct stat st;
	bool ok = in->done && vfd >= 0 && !s->retired && f->dd.src == s && !f->unlinked &&
		  s->epoch < UINT32_MAX && C && fstat(vfd, &st) == 0 &&
		  (uint64_t)st.st_size == len;

	cap = s->cgen ? s->nchunks : 0;
	if (ok && (nn > cap || !s->cgen)) {	/* chunks are never taken away */
		uint64_t want = nn > s->nchunks ? nn : s->nchunks;
		uint32_t *g = realloc(s->cgen, want * sizeof(*g));

		if (!g) {
			ok = false;
		} else {
			if (!s->cgen)
				memset(g, 0, want * sizeof(*g));
			else
				for (uint64_t k = cap; k < want; k++)
					g[k] = 0;
			e->dd.cgen_bytes += (want - cap) * sizeof(*g);
			s->cgen = g;
			s->nchunks = want;
		}
	}
	if (!ok) {
		dd_close_later(e, vfd);
		if (!s->retired && f->dd.src == s)
			dd_src_retire(e, s);
		dd_src_put(s);
		return;
	}
	/* what changed: the listed chunks, and everything from the first
	 * chunk not wholly cloned on (the tail, a size that changed) */
	first = in->clone / C;
	for (uint64_t i = 0; i < in->nck; i++)
		s->cgen[in->ck[i]] = s->epoch;
	for (uint64_t k = first; k < s->nchunks; k++)
		s->cgen[k] = s->epoch;
	s->nchunks = s->nchunks > nn ? s->nchunks : nn;
	s->fd = vfd;
	s->uid = st.st_uid;
	if (in->ch)
		for (uint64_t i = 0; i < in->nck; i++) {
			if (in->ck[i] >= nn)
				continue;
			struct dd_src *gone = dd_index_add(&e->dd.index, &in->ch[i], s, in->ck[i] * C,
							   s->epoch);

			if (gone)
				dd_src_free(gone);	/* retired, its last entry gone */
		}
	e->dd.carried++;
	dd_src_put(s);
}

/* Room for twice *max chunks in in->ck; false (and none) on no memory. */
static bool ck_grow(struct incr *in, uint64_t *max)
{
	uint64_t *g = realloc(in->ck, 2 * *max * sizeof(*g));

	if (!g) {
		free(in->ck);
		in->ck = NULL;
		return false;
	}
	in->ck = g;
	*max *= 2;
	return true;
}

/*
 * The chunks (of chunk bytes) that an incremental flush of len bytes
 * changes: those that meet a changed range below the clone, and from the
 * clone on all of them up to the new size; with a host copy, the hashes of
 * those that are full chunks (XXH3-128, from cp: no writer changes it
 * while the flush holds it).  e->lock not held.  Nothing on no memory
 * (then the carry fails and the version is retired).
 */
static void incr_changed(struct engine *e, struct copy *cp, uint64_t len, uint64_t chunk,
			 struct incr *in)
{
	uint64_t first = in->clone / chunk, nn = len / chunk, n = 0, last = UINT64_MAX;
	uint64_t max = (uint64_t)in->n * 2 + (nn > first ? nn - first : 0) + 1;
	double t0 = tier_now();

	in->ck = malloc(max * sizeof(*in->ck));
	if (!in->ck)
		return;
	for (uint32_t i = 0; i < in->n; i++) {
		uint64_t a = in->r[i].start / chunk, b;

		if (in->r[i].end <= in->r[i].start || a >= first)
			continue;
		b = (in->r[i].end - 1) / chunk;
		if (b >= first)
			b = first - 1;
		for (uint64_t k = a; k <= b; k++) {
			if (k == last)
				continue;
			if (n == max && !ck_grow(in, &max))
				return;
			in->ck[n++] = last = k;
		}
	}
	for (uint64_t k = first; k < nn; k++) {	/* the tail's full chunks */
		if (n == max && !ck_grow(in, &max))
			return;
		in->ck[n++] = k;
	}
	in->nck = n;
	if (!cp->cache->host_addressable || !n)
		return;		/* a GPU copy: only what went is known */
	in->ch = malloc(n * sizeof(*in->ch));
	if (!in->ch)
		return;
	for (uint64_t i = 0; i < n; i++)
		if (in->ck[i] < nn)
			dd_hash_chunks(copy_ptr(cp) + in->ck[i] * chunk, chunk, chunk,
				       &in->ch[i], 0, 1);
	eng_lock(e);
	e->dd.hash_s += tier_now() - t0;
	e->dd.bytes_hashed += n * chunk;
	e->dd.chunks_hashed += n;
	eng_unlock(e);
}

void eng_dd_retire(struct engine *e, struct tfile *f)
{
	if (f->dd.src)
		dd_src_retire(e, f->dd.src);
}

void eng_dd_destroy(struct engine *e)
{
	struct dd_index *x = &e->dd.index;

	while (e->dd.live)
		dd_src_retire(e, e->dd.live);
	for (uint32_t i = 0; i < x->count; i++)
		if (x->ent[i].src)
			dd_src_put(x->ent[i].src);
	dd_index_free(x);
	while (e->dd.nclose)
		close(e->dd.close[--e->dd.nclose]);
	free(e->dd.close);
	e->dd.close = NULL;
}

/* A whole new file's flush by chunks: the plan, and what it found. */
struct ddf {
	bool on;
	bool sample;		/* recent files were new: hash a few first */
	uint64_t chunk, n;	/* chunk size, full chunks */
	uint32_t uid;
	struct dd_hash *h;	/* hashes of chunks [0, nhashed) */
	uint64_t nhashed;
	struct dd_src **src;	/* per chunk: a version holding it (referenced) */
	uint64_t *soff;		/* and where, */
	uint32_t *sep;		/* and that version's epoch then */
	uint64_t found, written, cloned;
	int vfd;		/* after the commit: the new version, read */
	struct dd_hash *gh;	/* all n hashes, computed by the cascade on
				 * the GPU (owned; NULL: hash here) */
};

/* e->lock held: is f's content of len bytes whole new (no base to clone
 * from), so that it is flushed by chunks? */
static bool ddf_whole_new(struct engine *e, struct tfile *f, uint64_t len)
{
	return e->cfg.dedup && e->dd.index.cap && e->cfg.dedup_chunk && f->dd.valid &&
	       !f->dd.clean_len && len >= e->cfg.dedup_chunk;
}

/*
 * Chunk hashes of the n full chunks of cp's first n * chunk bytes by its
 * cache's own hash operation (the GPU tier's kernel), or NULL.  e->lock
 * not held; cp leased.
 */
static struct dd_hash *ddf_cache_hash(struct engine *e, struct copy *cp, uint64_t n,
				      uint64_t chunk)
{
	struct dd_hash *h;
	double t0 = tier_now();

	if (!cp->cache->ops->hash || !n)
		return NULL;
	h = malloc(n * sizeof(*h));
	/* struct dd_hash is { low, high }, as the operation's pairs */
	if (h && cp->cache->ops->hash(cp->cache, cp->frag->off, n * chunk, chunk,
				      (uint64_t (*)[2])h)) {
		free(h);
		return NULL;
	}
	if (h) {
		eng_lock(e);
		e->dd.gpu_chunks += n;
		e->dd.gpu_bytes += n * chunk;
		e->dd.gpu_s += tier_now() - t0;
		eng_unlock(e);
	}
	return h;
}

/* e->lock held: plan a flush by chunks of f's copy cp (len bytes). */
static void ddf_plan(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
		     struct ddf *d)
{
	memset(d, 0, sizeof(*d));
	d->vfd = -1;
	d->chunk = e->cfg.dedup_chunk;
	if (!ddf_whole_new(e, f, len) ||
	    (!cp->cache->host_addressable && !cp->cache->ops->hash))
		return;		/* not a whole new file we can hash */
	d->n = len / d->chunk;
	d->sample = e->dd.dup < DD_LOW;
	d->on = true;
	/* hashes the cascade computed on the GPU, if they are of this content */
	if (f->dd.gh.h && f->dd.gh.gen == f->gen && f->dd.gh.epoch == f->dd.wepoch &&
	    f->dd.gh.chunk == d->chunk && f->dd.gh.n == d->n && f->dd.gh.len == len) {
		d->gh = f->dd.gh.h;
		f->dd.gh.h = NULL;
	}
	free(f->dd.gh.h);		/* used or stale: once only */
	f->dd.gh.h = NULL;
}

/* e->lock held: look chunks [a, b) up, referencing the versions found. */
static void ddf_lookup(struct engine *e, struct ddf *d, uint64_t a, uint64_t b)
{
	for (uint64_t i = a; i < b; i++) {
		const struct dd_ent *x = dd_index_find(&e->dd.index, &d->h[i], d->uid);

		if (x) {
			d->src[i] = x->src;
			d->soff[i] = x->off;
			d->sep[i] = x->src->epoch;
			x->src->refs++;
			d->found++;
		}
	}
}

/* e->lock held: a descriptor of version s if it is still what it was at
 * epoch ep (not retired, not suspended, not carried over since), or -1. */
static int dd_src_dup(const struct dd_src *s, uint32_t ep)
{
	return s->retired || s->fd < 0 || s->epoch != ep ? -1 : dup(s->fd);
}

/*
 * Clone len bytes at soff of version s, as it was at epoch ep (when its
 * chunks were looked up), into fd at off.  e->lock not held.  Returns 0,
 * or -errno (the caller writes those bytes instead): s was retired,
 * suspended or carried over before the clone was over (its content may
 * have changed).
 */
static int ddf_clone(struct engine *e, int fd, uint64_t off, struct dd_src *s, uint64_t soff,
		     uint64_t len, uint32_t ep)
{
	int sfd, ret;

	eng_lock(e);
	sfd = dd_src_dup(s, ep);
	eng_unlock(e);
	if (sfd < 0)
		return -ESTALE;
	ret = timed_clone(fd, off, sfd, soff, len);
	close(sfd);
	eng_lock(e);
	if (!ret && (s->retired || s->epoch != ep))
		ret = -ESTALE;	/* retired or suspended before anything of
				 * it changes: not now, the clone has its
				 * bytes */
	eng_unlock(e);
	return ret;
}

/* Is chunk j found in the index at the run that starts at chunk i? */
static bool ddf_same_run(const struct ddf *d, uint64_t i, uint64_t j)
{
	return d->src[j] == d->src[i] && d->sep[j] == d->sep[i] &&
	       d->soff[j] == d->soff[i] + (j - i) * d->chunk;
}

/*
 * Take the hashes h of chunks [a, b) of the file being flushed (XXH3-128
 * of each d->chunk bytes, in order) and look them up.  e->lock not held.
 * The entry point for hashes computed elsewhere: a GPU kernel over the
 * file's GPU copy hands its array here (chunks [0, d->n)), and ddf_write()
 * then clones and writes as for hashes computed on the host.
 */
static void ddf_take_hashes(struct engine *e, struct ddf *d, const struct dd_hash *h,
			    uint64_t a, uint64_t b)
{
	if (h != d->h + a)
		memcpy(d->h + a, h, (b - a) * sizeof(*h));
	eng_lock(e);
	ddf_lookup(e, d, a, b);
	eng_unlock(e);
	d->nhashed = b;
}

/*
 * Hashes of d's chunks [0, n), computed on the host with XXH3-128 from the
 * host copy: when the last file hashed was almost all new, a sample first,
 * and the rest only if the sample found something.
 */
static void ddf_hash(struct engine *e, struct copy *cp, uint64_t len, struct ddf *d)
{
	uint64_t m = d->sample && d->n > DD_SAMPLE ? DD_SAMPLE : d->n;
	double t0 = tier_now();

	/* GPU hashes (the cascade's, or of a GPU copy flushed from the GPU):
	 * all of them, hashing costs next to nothing there */
	if (!d->gh && !cp->cache->host_addressable)
		d->gh = ddf_cache_hash(e, cp, d->n, d->chunk);
	if (d->gh || !cp->cache->host_addressable) {
		if (d->gh)
			ddf_take_hashes(e, d, d->gh, 0, d->n);
		eng_lock(e);
		e->dd.chunks_hashed += d->nhashed;
		e->dd.chunks_found += d->found;
		if (d->nhashed)
			e->dd.dup = (double)d->found / (double)d->nhashed;
		eng_unlock(e);
		return;
	}
	dd_hash_chunks(copy_ptr(cp), len, d->chunk, d->h, 0, m);
	ddf_take_hashes(e, d, d->h, 0, m);
	if (m < d->n && d->found) {	/* not all new after all */
		dd_hash_chunks(copy_ptr(cp), len, d->chunk, d->h, m, d->n - m);
		ddf_take_hashes(e, d, d->h + m, m, d->n);
	}
	eng_lock(e);
	e->dd.hash_s += tier_now() - t0;
	e->dd.chunks_hashed += d->nhashed;
	e->dd.bytes_hashed += d->nhashed * d->chunk;
	e->dd.chunks_found += d->found;
	if (d->nhashed < d->n)
		e->dd.sampled_out++;
	e->dd.dup = (double)d->found / (double)d->nhashed;	/* the last file says */
	eng_unlock(e);
}

/*
 * The version that holds most of the chunks at their own offsets (the
 * previous checkpoint of a series), when it holds at least half of them:
 * the base that ddf_write_based() clones whole.  Referenced by d->src.
 */
static struct dd_src *ddf_base(const struct ddf *d, uint32_t *ep)
{
	struct dd_src *cand = NULL;
	uint64_t votes = 0, n = 0;

	for (uint64_t i = 0; i < d->nhashed; i++) {	/* majority vote */
		struct dd_src *s = d->src[i] && d->soff[i] == i * d->chunk ? d->src[i] : NULL;

		if (!s)
			continue;
		if (!votes) {
			cand = s;
			*ep = d->sep[i];
		}
		votes += s == cand && d->sep[i] == *ep ? 1 : (uint64_t)-1;
	}
	for (uint64_t i = 0; cand && i < d->nhashed; i++)
		n += d->src[i] == cand && d->sep[i] == *ep && d->soff[i] == i * d->chunk;
	return cand && 2 * n >= d->nhashed ? cand : NULL;
}

/* Is chunk i of d in place in base b (epoch ep), of which m chunks are
 * cloned? */
static bool ddf_in_base(const struct ddf *d, uint64_t i, uint64_t m, const struct dd_src *b,
			uint32_t ep)
{
	return i < m && d->src[i] == b && d->sep[i] == ep && d->soff[i] == i * d->chunk;
}

/*
 * ddf_write() for a file most of which is its base b at the same offsets
 * (a checkpoint in a series): one FICLONERANGE of the base's chunks, then
 * the chunks that differ (other runs found elsewhere cloned, the rest
 * written, all of those writes in flight together) and the tail.
 * -EAGAIN: the base could not be cloned (nothing was written).
 */
static int ddf_write_based(struct engine *e, struct ssd_ring *ring, struct copy *cp, int fd,
			   uint64_t end, struct ddf *d, struct dd_src *b, uint32_t ep)
{
	uint64_t C = d->chunk, m, i, done = 0, inner = 0, cloned;
	bool host = cp->cache->host_addressable;
	struct ssd_seg *seg = NULL;
	struct stat st;
	unsigned ns = 0;
	int sfd, ret = 0;

	eng_lock(e);
	sfd = dd_src_dup(b, ep);
	eng_unlock(e);
	if (sfd < 0)
		return -EAGAIN;
	ret = fstat(sfd, &st) < 0 ? -errno : 0;
	close(sfd);
	m = ret ? 0 : (uint64_t)st.st_size / C;
	if (m > d->nhashed)
		m = d->nhashed;
	if (!m)
		return -EAGAIN;
	/* the chunks written over the clone are copies on write: XFS would
	 * reserve its default COW extent (32 blocks) for each, and keep the
	 * rest while the version is open (the index holds it); one chunk */
	struct fsxattr fx;

	if (ioctl(fd, FS_IOC_FSGETXATTR, &fx) == 0 && C <= UINT32_MAX) {
		fx.fsx_xflags |= FS_XFLAG_COWEXTSIZE;
		fx.fsx_cowextsize = (uint32_t)C;
		(void)ioctl(fd, FS_IOC_FSSETXATTR, &fx);	/* a hint */
	}
	if (ddf_clone(e, fd, 0, b, 0, m * C, ep))
		return -EAGAIN;
	cloned = m * C;
	if (host && !(seg = malloc((d->nhashed + 1) * sizeof(*seg))))
		return -ENOMEM;		/* retried, like any failed flush */
	for (i = 0; i < d->nhashed && !ret;) {
		uint64_t j = i + 1;

		if (ddf_in_base(d, i, m, b, ep)) {
			i = j;		/* in place already */
			continue;
		}
		if (d->src[i]) {	/* found elsewhere: a run of it cloned */
			while (j < d->nhashed && ddf_same_run(d, i, j) &&
			       !ddf_in_base(d, j, m, b, ep))
				j++;
			if ((j - i) * C >= DD_MIN_RUN &&
			    ddf_clone(e, fd, i * C, d->src[i], d->soff[i], (j - i) * C,
				      d->sep[i]) == 0) {
				if (j > m)
					cloned += (j - (i > m ? i : m)) * C;
				i = j;
				continue;
			}
		}
		/* written: this chunk (and its neighbours to write, merged) */
		j = i + 1;
		while (j < d->nhashed && !ddf_in_base(d, j, m, b, ep) && !d->src[j])
			j++;
		if (i < m)
			cloned -= ((j < m ? j : m) - i) * C;
		inner += (j - i) * C;
		if (host) {
			if (ns && seg[ns - 1].off + seg[ns - 1].len == i * C)
				seg[ns - 1].len += (j - i) * C;
			else
				seg[ns++] = (struct ssd_seg){ .off = i * C, .len = (j - i) * C,
							      .buf = copy_ptr(cp) + i * C };
		} else {
			ret = write_range(ring, fd, cp, i * C, j * C, &done);
		}
		i = j;
	}
	if (host && !ret && ns)
		ret = write_segs(ring, fd, seg, ns, &done);
	free(seg);
	tierfs_fault_kill("dedup_write");
	if (!ret)	/* past the clone: a hole until written */
		ret = write_sparse(ring, fd, cp, d->nhashed * C, end, &done, false);
	d->written += inner + (end > d->nhashed * C ? end - d->nhashed * C : 0);
	d->cloned += cloned;
	return ret;
}

/*
 * Write cp's len bytes into fd: runs of chunks found in the index are
 * cloned (one FICLONERANGE per run that is contiguous in one version),
 * the rest written.  e->lock not held.
 */
static int ddf_write(struct engine *e, struct ssd_ring *ring, struct copy *cp, int fd,
		     bool direct, uint64_t len, struct ddf *d)
{
	uint64_t end = direct ? tier_round(len) : len, C = d->chunk, i = 0, done = 0;
	uint64_t ws = 0;	/* bytes [ws, i * C) are still to be written */
	uint32_t ep = 0;
	struct dd_src *base = ddf_base(d, &ep);
	int ret = 0;

	if (base && (ret = ddf_write_based(e, ring, cp, fd, end, d, base, ep)) != -EAGAIN)
		goto out;
	ret = 0;

	while (i < d->nhashed && !ret) {
		uint64_t j = i + 1;

		if (d->src[i]) {
			while (j < d->nhashed && ddf_same_run(d, i, j))
				j++;
			if ((j - i) * C >= DD_MIN_RUN) {
				ret = write_sparse(ring, fd, cp, ws, i * C, &done, false);
				d->written += i * C - ws;
				ws = i * C;
				if (!ret && ddf_clone(e, fd, i * C, d->src[i], d->soff[i],
						      (j - i) * C, d->sep[i]) == 0) {
					d->cloned += (j - i) * C;
					ws = j * C;
					tierfs_fault_kill("dedup_write");
				}
			}
		} else {
			while (j < d->nhashed && !d->src[j])
				j++;
		}
		i = j;		/* not cloned: joins the bytes to write */
	}
	if (!ret)	/* a fresh version: holes need no writing */
		ret = write_sparse(ring, fd, cp, ws, end, &done, false);
	d->written += end > ws ? end - ws : 0;
out:
	__atomic_store_n(&cp->flushed_bytes, len, __ATOMIC_RELAXED);
	if (!ret && ftruncate(fd, (off_t)len) < 0)
		ret = -errno;
	if (!ret)
		ret = settle_cloned(e, fd);
	return ret;
}

/* Flush f's whole new content by chunks.  e->lock not held.  -EAGAIN: the
 * caller writes it all (nothing was done). */
static int flush_dedup(struct engine *e, struct ssd_ring *ring, struct tfile *f,
		       struct copy *cp, int fd, bool direct, uint64_t len, struct ddf *d)
{
	struct stat st;
	int sfd = f->ops->data_fd(f, false);

	/* the owner: the backing file's (the new version is still ours) */
	if (sfd < 0)
		return -EAGAIN;
	if (fstat(sfd, &st) < 0) {
		f->ops->release_data_fd(f, sfd);
		return -EAGAIN;
	}
	f->ops->release_data_fd(f, sfd);
	d->uid = st.st_uid;
	d->h = malloc(d->n * sizeof(*d->h));
	d->src = calloc(d->n, sizeof(*d->src));
	d->soff = malloc(d->n * sizeof(*d->soff));
	d->sep = malloc(d->n * sizeof(*d->sep));
	if (!d->h || !d->src || !d->soff || !d->sep)
		return -EAGAIN;		/* freed by ddf_done() */
	ddf_hash(e, cp, len, d);
	return ddf_write(e, ring, cp, fd, direct, len, d);
}

/*
 * e->lock held, after the flush: on success index the new version's
 * chunks (d->vfd, taken over), and drop the references of the lookup.
 */
static void ddf_done(struct engine *e, struct tfile *f, struct ddf *d, bool ok)
{
	struct dd_src *s = NULL;

	if (d->src)
		for (uint64_t i = 0; i < d->n; i++)
			if (d->src[i])
				dd_src_put(d->src[i]);
	if (ok && d->vfd >= 0 && d->nhashed && !f->unlinked && !f->dd.src)
		s = calloc(1, sizeof(*s));
	if (s) {
		s->fd = d->vfd;
		d->vfd = -1;
		s->uid = d->uid;
		s->chunk = d->chunk;
		s->nchunks = d->n;
		s->refs = 1;
		s->owner = f;
		f->dd.src = s;
		s->prev = e->dd.live_tail;
		if (e->dd.live_tail)
			e->dd.live_tail->next = s;
		else
			e->dd.live = s;
		e->dd.live_tail = s;
		if (++e->dd.nlive > DD_SRC_MAX)
			dd_src_retire(e, e->dd.live);
		for (uint64_t i = 0; i < d->nhashed; i++) {
			struct dd_src *gone = dd_index_add(&e->dd.index, &d->h[i], s, i * d->chunk, 0);

			if (gone)
				dd_src_free(gone);	/* retired, its last entry gone */
		}
	}
	dd_close_later(e, d->vfd);	/* not kept: closed like a retired one */
	d->vfd = -1;
	free(d->h);
	free(d->src);
	free(d->soff);
	free(d->sep);
	d->sep = NULL;
	free(d->gh);
	d->gh = NULL;
	d->h = NULL;
	d->src = NULL;
	d->soff = NULL;
}

#define DD_WHOLE_MAX	(1ull << 30)	/* host copies hashed whole at most */

/*
 * After an incremental flush of f that had no version in the index to
 * carry over (a file loaded from its backing file at mount and changed in
 * place, a database opened after a restart): hash all its full chunks
 * once, from cp (len bytes, leased: no writer changes it while the flush
 * holds it; the version holds exactly these bytes), so that ddf_done()
 * indexes the version and its later versions are carried over
 * (dd_src_carry) instead of hashed.  Once per file: the whole hash costs
 * the file's size, a carry only its changed chunks.  On the GPU whatever
 * the size (hashing costs next to nothing there); on the host up to
 * DD_WHOLE_MAX.  e->lock not held.  Nothing is indexed when anything fails.
 */
static void ddf_hash_whole(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
			   struct ddf *d)
{
	double t0 = tier_now();
	bool gpu = !cp->cache->host_addressable;

	if (f->dd.hashed_whole || !e->dd.index.cap || !d->chunk || len < d->chunk ||
	    (gpu && !cp->cache->ops->hash) || (!gpu && len > DD_WHOLE_MAX))
		return;
	f->dd.hashed_whole = true;
	d->n = len / d->chunk;
	if (gpu) {
		d->h = ddf_cache_hash(e, cp, d->n, d->chunk);
	} else {
		d->h = malloc(d->n * sizeof(*d->h));
		if (d->h)
			dd_hash_chunks(copy_ptr(cp), len, d->chunk, d->h, 0, d->n);
	}
	if (!d->h)
		return;
	d->nhashed = d->n;
	eng_lock(e);
	if (!gpu) {
		e->dd.hash_s += tier_now() - t0;
		e->dd.bytes_hashed += d->n * d->chunk;
	}
	e->dd.chunks_hashed += d->n;
	eng_unlock(e);
}

/* The new version just committed, opened for reading (-1: none). */
static int open_version(struct tfile *f)
{
	char path[64];
	int fd = f->ops->data_fd(f, false), nfd;

	if (fd < 0)
		return -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	nfd = backing_open(AT_FDCWD, path, O_RDONLY, 0);
	f->ops->release_data_fd(f, fd);
	return nfd;
}

/*
 * Make the bytes written to version fd stable before its rename.  In
 * general an fdatasync: the rename must never be durable before the data
 * it names.  On a file system whose log commits every metadata change in
 * order, each commit after a flush of the disk's cache (e->cfg.ordered_log,
 * backing_log_ordered()), it is enough that the writes completed: the
 * version's allocation and size are logged before its rename, and the
 * commit that makes the rename durable (the directory's fsync at the
 * file's fsync, or the file system's own) flushes the cache first.  One
 * log commit per fsync instead of two, and none per background flush
 * (tests/test_crash_states.py checks both ways at every moment of a run).
 * Not for a version written in place (no rename orders it), nor on another
 * file system under the backing directory.  ring NULL: a plain fdatasync.
 */
int eng_settle_version(struct engine *e, struct ssd_ring *ring, int fd, bool small,
		       bool inplace)
{
	if (!inplace && ordered_here(e, fd))
		return wait_written(fd);
	return small || !ring ? (fdatasync(fd) < 0 ? -errno : 0) : ssd_fdatasync(ring, fd);
}

/* Write cp's len bytes into version fd (its holes left out: write_sparse),
 * size it and settle it.
 * e->lock not held, cp leased. */
static int flush_whole(struct engine *e, struct ssd_ring *ring, struct copy *cp, int fd,
		       uint64_t len, bool direct, bool small, bool inplace)
{
	int ret;

	if (!cp->cache->host_addressable)
		ret = backing_move(&(struct bend){ .kind = BEND_FD, .fd = fd },
				   &(struct bend){ .kind = BEND_CACHE, .cache = cp->cache,
						   .at = cp->frag->off },
				   len, &cp->flushed_bytes);
	else	/* a few pages (small) as plain writes, not a trip through io-wq */
		ret = write_sparse(small ? NULL : ring, fd, cp, 0, direct ? tier_round(len) : len,
				   &cp->flushed_bytes, inplace);
	/* a fresh version written with plain writes has its size when its
	 * last byte was written (not in a hole: not a zero) */
	if (!ret && !(small && !inplace && (!len || copy_ptr(cp)[len - 1])) &&
	    ftruncate(fd, (off_t)len) < 0)
		ret = -errno;
	if (!ret) {
		double t0 = tier_now();

		ret = eng_settle_version(e, ring, fd, small, inplace);
		fl_sync_s += tier_now() - t0;
	}
	return ret;
}

/* e->lock held: f's copy in the fastest tier that holds a complete one
 * (what a flush writes), or NULL. */
static struct copy *newest_complete(struct engine *e, struct tfile *f)
{
	for (int t = 0; t < e->ntiers; t++)
		if (f->copy[t] && f->copy[t]->state == TS_WRITE_COMPLETE)
			return f->copy[t];
	return NULL;
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

	eng_delay_at(e, "flush_start");
	cp = newest_complete(e, f);
	uint64_t gen, len;
	bool direct, inplace, small, had_src;
	struct incr incr;
	struct ddf ddf;
	struct lease l;
	double t0, tc = 0;
	int fd, ret, vfd = -1;

	if (!cp || !f->dirty || f->unlinked || cp->state != TS_WRITE_COMPLETE ||
	    cp->flushing)
		return 0;	/* nothing to do, or another flusher has it */
	cp->flushing = true;
	__atomic_store_n(&cp->flushed_bytes, 0, __ATOMIC_RELAXED);
	gen = f->gen;
	len = cp->len;
	incr_plan(e, f, len, &incr);
	had_src = f->dd.src != NULL;
	/* its backing version is about to change: out of the index, or
	 * suspended there to be carried over to the new version */
	incr.carry = incr.on && e->dd.index.cap ? dd_src_suspend(e, f->dd.src) : NULL;
	if (!incr.carry)
		eng_dd_retire(e, f);
	ddf_plan(e, f, cp, len, &ddf);
	if (incr.on)
		ddf.on = false;
	e->busy++;
	lease_begin(e, &l, cp, NULL);

	eng_delay_at(NULL, "flush_write");	/* under cp's lease */
	t0 = tier_now();
	fl_clone_s = fl_sync_s = 0;
	small = cp->cache->host_addressable && len <= FLUSH_BUFFERED_MAX;
	if (small && f->ops->version_small) {
		ret = eng_copy_bounds(cp, 0, len);
		if (!ret)
			ret = f->ops->version_small(f, copy_ptr(cp), len);
		if (ret > 0)
			__atomic_store_n(&cp->flushed_bytes, len, __ATOMIC_RELAXED);
		if (ret)
			goto out_small;
	}
	fd = f->ops->version_open(f, cp->cache->host_addressable && !small, &direct, &inplace);
	if (fd < 0) {
		ret = fd;
		goto out;
	}
	ret = eng_copy_bounds(cp, 0, direct ? tier_round(len) : len);
	if (ret)
		close(fd);
	if (ret)
		goto out;
	if (incr.on && !inplace) {
		ret = flush_incr(e, ring, f, cp, fd, direct, len, &incr);
		if (!ret && incr.carry)
			incr_changed(e, cp, len, incr.carry->chunk, &incr);
		else if (!ret && !had_src)
			ddf_hash_whole(e, f, cp, len, &ddf);
		incr.done = !ret && (!incr.carry || incr.ck);
		if (ret != -EAGAIN)
			goto written;
		incr.on = false;	/* the whole file, over what was cloned */
	}
	if (ddf.on && !inplace) {
		ret = flush_dedup(e, ring, f, cp, fd, direct, len, &ddf);
		if (ret != -EAGAIN)
			goto written;
	}
	ddf.on = false;
	ret = flush_whole(e, ring, cp, fd, len, direct, small, inplace);
written:
	if (ret) {
		close(fd);
		goto out;
	}
	tc = tier_now();
	ret = f->ops->version_commit(f, fd, inplace, false);
	tc = tier_now() - tc;
	if (!ret && ddf.nhashed)	/* by chunks, or hashed whole */
		ddf.vfd = open_version(f);
	if (!ddf.on && ddf.vfd >= 0) {	/* hashed whole: the version's owner */
		struct stat vst;

		if (fstat(ddf.vfd, &vst) == 0 && (uint64_t)vst.st_size == len)
			ddf.uid = vst.st_uid;
		else
			ddf.nhashed = 0;	/* not what was hashed: not indexed */
	}
	if (!ret && incr.done && incr.carry)
		vfd = open_version(f);
out_small:
	if (ret > 0)
		ret = 0;	/* version_small did it */
out:
	free(incr.r);
	fname(f, nb, sizeof(nb));	/* not under e->lock: it takes fs locks */
	lease_end(e, &l);
	e->busy--;
	cp->flushing = false;
	ddf_done(e, f, &ddf, ret == 0);
	if (incr.carry)
		dd_src_carry(e, f, incr.carry, ret == 0 ? vfd : -1, &incr, len);
	else
		dd_close_later(e, vfd);
	free(incr.ck);
	free(incr.ch);
	e->fl_total_s += tier_now() - t0;
	e->fl_clone_s += fl_clone_s;
	e->fl_sync_s += fl_sync_s;
	e->fl_commit_s += tc;
	if (ret == 0) {
		double dt = tier_now() - t0;

		if (len >= (1u << 20) && dt > 0)
			e->flush_bw = e->flush_bw > 0 ?
				0.7 * e->flush_bw + 0.3 * (double)len / dt :
				(double)len / dt;
		e->bytes_flushed += len;
		e->files_flushed++;
		if (e->cfg.dedup) {
			e->dd.bytes_logical += len;
			e->dd.bytes_written += incr.on ? incr.written : ddf.on ? ddf.written : len;
			e->dd.bytes_cloned += incr.on ? incr.cloned : ddf.on ? ddf.cloned : 0;
			if (incr.on)
				e->dd.files_incremental++;
			else if (ddf.on && ddf.cloned)
				e->dd.files_dedup++;
			else
				e->dd.files_full++;
		}
		/* the base is this version now (any change made since is a
		 * change against it too: the ranges are kept) */
		f->dd.base_len = len;
		f->flushed_gen = gen;
		if (f->flush_err)
			tlog(LOG_NOTICE, "%s: flushed after earlier failure", nb);
		f->flush_err = 0;
		if (f->gen == gen) {
			backlog_del(e, cp);
			f->dd.taint = false;
			f->dirty = false;
			if (f->aging) {	/* flushed before its age (an fsync) */
				aging_remove(e, f);
				f->queued = false;
				eng_defer_put(e, f);
			}
			/*
			 * The version holds f's content (nothing was written
			 * since), but cp may be f's copy no more: a writer that
			 * went write-through, or installed a copy in another
			 * tier, dropped it meanwhile (INIT, waiting for this
			 * flush's lease).  Only a copy still complete becomes
			 * FLUSHED (the lease rule: look again after the lease).
			 */
			if (cp->state == TS_WRITE_COMPLETE) {
				tier_set_state(&cp->state, TS_FLUSHED);
				if (cp->promoted)
					tier_set_state(&cp->state, TS_READ_COMPLETE);
			}
		}
	} else if (ret == -ENOENT && f->unlinked) {
		/* unlinked meanwhile: nothing to flush */
	} else {
		e->flush_errors++;
		if (f->flush_err != ret)
			tlog(LOG_ERR, "%s: flush to SSD failed: %s; data stays cached, retrying",
			     nb, strerror(-ret));
		f->flush_err = ret;
		f->retry_at = tier_now() + FLUSH_RETRY_S;
		eng_queue_flush(e, f, false);
	}
	eng_wake(e);
	eng_flushed(e);
	return ret;
}

/*
 * e->lock held (dropped meanwhile), f's fsync waiting: flush f in the
 * caller's thread when its newest copy is a few pages of host memory, as
 * the flushers would (the same new version, commit and bookkeeping),
 * instead of queueing it behind the flushes the flushers have in hand:
 * an fsync then costs its own syncs, not theirs too, and concurrent
 * fsyncs share the backing file system's journal commits.  Its writes
 * are plain system calls (ring NULL), incremental ones (-o dedup) too.
 * Not for a copy a flusher has already started, nor after a failure
 * (retried at its time).  Returns true when it flushed (or tried to).
 */
bool eng_flush_inline(struct engine *e, struct tfile *f)
{
	struct copy *cp = newest_complete(e, f);

	if (!cp || cp->flushing || !cp->cache->host_addressable ||
	    cp->len > FLUSH_BUFFERED_MAX || f->flush_err || !f->dirty || f->unlinked)
		return false;
	flush_one(e, NULL, f);
	return true;
}

static bool retry_due(struct tfile *f)
{
	return !f->flush_err || tier_now() >= f->retry_at;
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

/*
 * e->lock held: the next file to flush: the flush queue's first that is
 * due, else the aging queue's first once its age has passed (its due times
 * only grow along it), or at once while a writer waits for room or the
 * mount goes away.
 */
static struct tfile *pop_flush(struct engine *e)
{
	struct tfile *f = pop_due(&e->q_head, &e->q_tail, offsetof(struct tfile, fq_next));

	if (f || !(f = e->aq_head))
		return f;
	if (f->due_at > tier_now() && !e->room_waiters && !e->stop)
		return NULL;
	aging_remove(e, f);
	return f;
}

void *eng_flusher_main(void *arg)
{
	struct engine *e = arg;
	struct ssd_ring ring;
	int ret;

	ret = ssd_ring_init(&ring, e->cfg.queue_depth, e->cfg.chunk);
	if (ret) {
		tlog(LOG_CRIT, "io_uring setup failed: %s", strerror(-ret));
		return NULL;
	}
	eng_lock(e);
	for (;;) {
		struct tfile *f;

		if (e->nreap) {
			struct tfile *r = e->reap[--e->nreap];

			eng_unlock(e);
			r->ops->put(r);
			eng_lock(e);
			continue;
		}
		if (e->dd.nclose) {	/* retired versions (dd_src_retire) */
			int fd = e->dd.close[--e->dd.nclose];

			eng_unlock(e);
			close(fd);
			eng_lock(e);
			continue;
		}
		f = pop_flush(e);
		if (!f) {
			int ms = e->q_head ? 100 : 1100;

			if (e->stop && !e->q_head && !e->aq_head && !e->nreap)
				break;
			if (e->aq_head) {
				double left = (e->aq_head->due_at - tier_now()) * 1e3 + 1;

				ms = left < 1 ? 1 : left < ms ? (int)left : ms;
			}
			events_wait_ms(e, ms);
			continue;
		}
		f->queued = false;
		flush_one(e, &ring, f);
		eng_unlock(e);
		f->ops->put(f);
		eng_lock(e);
	}
	eng_unlock(e);
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
	struct lease l = { .n = 0 };
	uint64_t len, gh_n = 0, gh_chunk = 0, gh_gen = 0, gh_epoch = 0;
	struct dd_hash *gh = NULL;
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
	lease_take(&l, cp);	/* eng_alloc_wait() may drop the lock */
	len = cp->len;
	kept = !f->copy[hi] && f->hint_seq && f->hint_seq >= e->hint_head &&
	       f->hint_seq < eng_gpu_keeps_below(e) &&
	       eng_gpu_unflushed(e) <= e->tiers[0]->size / 2;
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
		ret = eng_alloc_wait(e, &e->host, hcp, len, 0,
				     eng_shadow_rank(eng_copy_dist(e, cp)) + 1);
	} else {
		ret = eng_alloc_wait(e, &e->host, hcp, len, 1, 0);
	}
	if (!ret && (f->copy[hi] || f->unlinked)) {	/* changed while we waited */
		cache_release(&e->host, hcp);
		ret = -EEXIST;
	}
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
			flush_one(e, ring, f);
		eng_wake(e);
		return;
	}
	tier_set_state(&hcp->state, TS_WRITE_IN_PROGRESS);
	lease_take(&l, hcp);
	/* a whole new file is flushed by chunks: hash them here, on the GPU,
	 * from the bytes the host copy gets (writers wait for cp->flushing) */
	gh_n = ddf_whole_new(e, f, len) && cp->cache->ops->hash ?
	       len / e->cfg.dedup_chunk : 0;
	gh_chunk = e->cfg.dedup_chunk;
	gh_gen = f->gen;
	gh_epoch = f->dd.wepoch;
	eng_unlock(e);		/* under the lease of cp and hcp */
	t0 = tier_now();
	ret = eng_copy_bounds(hcp, 0, len);
	if (!ret)
		ret = eng_copy_bounds(cp, 0, len);
	if (!ret)
		ret = cp->cache->ops->read(cp->cache, cp->frag->off, copy_ptr(hcp), len);
	t0 = tier_now() - t0;
	if (!ret && gh_n)
		gh = ddf_cache_hash(e, cp, gh_n, gh_chunk);
	lease_end(e, &l);
	cp->flushing = false;
	if (ret || f->copy[hi] || f->copy[0] != cp || f->unlinked ||
	    cp->state != TS_WRITE_COMPLETE) {
		free(gh);	/* no host copy of these bytes follows */
		gh = NULL;
	}
	if (!ret && (f->copy[hi] || f->copy[0] != cp || f->unlinked ||
		     cp->state != TS_WRITE_COMPLETE)) {
		/* changed while the bytes moved (not by a writer: they wait
		 * for cp->flushing): this copy is not the file's any more */
		tier_set_state(&hcp->state, TS_INIT);
		cache_release(&e->host, hcp);
		free(hcp);
		eng_wake(e);
		return;
	}
	if (ret) {
		tier_set_state(&hcp->state, TS_INIT);
		cache_release(&e->host, hcp);
		free(hcp);
		tlog(LOG_ERR, "GPU -> host copy failed: %s", strerror(-ret));
		eng_wake(e);
		return;
	}
	hcp->len = len;
	if (gh && f->gen == gh_gen && f->dd.wepoch == gh_epoch) {
		free(f->dd.gh.h);
		f->dd.gh.h = gh;	/* for the flush of hcp (ddf_plan) */
		f->dd.gh.n = gh_n;
		f->dd.gh.chunk = gh_chunk;
		f->dd.gh.len = len;
		f->dd.gh.gen = gh_gen;
		f->dd.gh.epoch = gh_epoch;
		gh = NULL;
	}
	free(gh);
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
	eng_wake(e);
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
		struct tfile *f = pop_due(&e->gq_head, &e->gq_tail,
					  offsetof(struct tfile, gq_next));

		if (!f) {
			if (e->stop && !e->gq_head)
				break;
			events_wait_ms(e, 50);
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
