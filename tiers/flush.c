/*
 * flush.c - the flush queues and the SSD flushers (a queue and its threads
 * per job, as Redis's bio.c; idle, the flushers wait on e->flush_work; the
 * GPU -> host queue's thread is cascade.c's):
 *  - the SSD flush queue (e->q_head), and the aging queue (e->aq_head)
 *    where small files wait cfg.flush_age_ms after their close before
 *    they join it (eng_queue_flush_aged): flushers write a file's newest
 *    complete copy into a new version of its backing file with O_DIRECT
 *    through io_uring, fdatasync it and ask the fs side to commit it
 *    (atomic rename); a failed flush is retried every FLUSH_RETRY_S.
 *    With -o dedup the version is made by dedup_flush.c where it can be
 *    (incrementally, or by chunks), else written whole here; a small
 *    change in place is a journal record instead, with dedup or without
 *    (flush_journal.c);
 *  - small files closed together flushed as one group (flush_batch): one
 *    sync of their versions, or of their journal records and applies;
 *  - write-through shadows committed (eng_commit_shadow, shadow_due), at
 *    once where the journal's ring waits for their records
 *    (engine_journal_held).
 * Flushers also drop deferred file references (e->reap) and sync the
 * journal applies left to their pause (eng_asettle_all).
 *
 * Owns: the queues (the GPU -> host queue e->gq_head too, which cascade.c's
 * thread takes) and the tfile fields queued, aging, due_at, fq_next,
 * gqueued, gq_next, retry_at, flush_err, flushed_gen; e->busy, fl_running, flush_bw and the
 * flush statistics (write_through_early_commits: e->jheld_shadows).  The threads hold e->lock except while bytes move
 * (under a lease) and while they call tfile_ops (version_open/commit,
 * put, name: those take fs locks).  They take a tfile.lock only by a try,
 * for a write-through file's shadow due after its last close (shadow_due,
 * which commits it).  Calls place.c, backing.c, flush_journal.c (through
 * flush_journal.h) and dedup_flush.c (through dedup_flush.h: a flush's
 * dedup plan, write, commit and end, and the new version's chunks indexed
 * once the end is published; the closes of retired versions), which call
 * nothing here; cascade.c calls eng_flush_one and eng_pop_due.
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

#include "dedup_flush.h"
#include "flush_journal.h"
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
	eng_flush_work(e);
}

/* ---- write-through shadows -------------------------------------------- */

/*
 * Commit the shadow version.  e->lock and f->lock held.  Its data is made
 * stable first, as a flush's is (eng_settle_version), also at a close: a
 * rename of unwritten data could be durable before the data, and a power
 * cut would then leave neither the old version nor the new one.  A shadow
 * written in place (no rename) is synced only for fsync.
 */
int eng_commit_shadow(struct engine *e, struct tfile *f, bool durable)
{
	int fd = f->shadow_fd;
	uint64_t gen = f->gen;
	int ret = 0;

	/* its fsyncs' journal records are retired once it is committed:
	 * durably (shadow.c) */
	bool logged = f->slog && f->slog->nseq;

	eng_shadow_unqueued(e, f);
	if (!eng_shadow_apply(e, f))
		return 0;	/* several names: applied in place */
	ret = eng_shadow_fill(e, f);	/* a version holds all of the file */
	if (ret) {
		f->flush_err = ret;
		return ret;
	}
	eng_unlock(e);
	if (durable || !f->shadow_inplace)
		ret = eng_settle_version(e, NULL, fd, true, f->shadow_inplace);
	if (!ret)
		ret = f->ops->version_commit(f, fd, f->shadow_inplace, durable || logged);
	eng_shadow_committed(f, ret);
	eng_lock(e);
	if (ret && ret != -ENOENT) {
		f->flush_err = ret;
		return ret;		/* shadow stays; fd still ours */
	}
	f->shadow_fd = -1;
	f->shadow_seq0 = 0;	/* its records retired */
	if (ret == -ENOENT)
		return 0;
	f->flushed_gen = gen;
	f->flush_err = 0;
	f->dirty = false;
	return 0;
}

/*
 * e->lock and f->lock held, f's shadow without a writer: committed now
 * where it is the file itself (in place: nothing to wait for), at the
 * unmount, or without -o flush_age; else it waits on the aging queue as a
 * small file's copy does (eng_queue_flush_aged), and the flusher that
 * takes it commits it (shadow_due).  A file written through is
 * opened, written and closed again and again by some programs (fsstress,
 * a log): each commit makes the next write copy the whole file into a new
 * version again where the backing file system cannot share extents, so
 * the writes of one moment share one version.  Nothing is promised at a
 * close: an fsync commits it at once (tfile_fsync_data).
 */
int eng_shadow_done(struct engine *e, struct tfile *f)
{
	if (f->shadow_inplace || !e->cfg.flush_age_ms || e->stop || f->flush_waiters)
		return eng_commit_shadow(e, f, false);
	eng_queue_flush_aged(e, f, 0);
	if (!f->shadow_backlog && f->size) {	/* the flush statistics wait for it */
		f->shadow_backlog = f->size;
		e->backlog += f->size;
	}
	return 0;
}

void eng_shadow_unqueued(struct engine *e, struct tfile *f)
{
	e->backlog -= f->shadow_backlog < e->backlog ? f->shadow_backlog : e->backlog;
	f->shadow_backlog = 0;
}

/*
 * e->lock held: f came off a flush queue with a shadow (eng_shadow_done):
 * committed unless a writer has it again.  f->lock is only tried: its
 * holder may be waiting for cache room that this flusher's others make,
 * and is doing something to f anyway; f then waits its age again.
 */
static void shadow_due(struct engine *e, struct tfile *f)
{
	if (!ranked_trylock(&f->lock, LR_TFILE)) {
		eng_queue_flush_aged(e, f, 0);
		return;
	}
	e->busy++;		/* a flush running, for the statistics' waiters */
	if (f->shadow_fd >= 0 && !f->writers && f->dirty && !f->unlinked)
		eng_commit_shadow(e, f, false);
	else
		eng_shadow_unqueued(e, f);	/* a writer's close queues it again */
	e->busy--;
	tfile_unlock(f);
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
		eng_flush_work(e);
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


/* Files looked at on the aging queue per engine_journal_held(). */
#define JHELD_SCAN	256

/*
 * See engine.h.  Only the shadows whose records reach back to seq, the
 * record the ring waits for, go: each shadow committed makes the file's
 * next write copy the whole file into a new one (where extents cannot be
 * shared), so the others keep their age.  The caller may hold a tfile's
 * lock (the journal record of a shadow, eng_shadow_record): no other is
 * taken here, f->shadow_seq0 is under e->lock.
 */
void engine_journal_held(struct engine *e, uint64_t seq)
{
	struct tfile *f, *next;
	unsigned n = 0;

	eng_lock(e);
	for (f = e->aq_head; f && n < JHELD_SCAN; f = next, n++) {
		next = f->fq_next;
		if (f->shadow_fd >= 0 && f->shadow_seq0 && f->shadow_seq0 <= seq) {
			eng_queue_flush(e, f, false);	/* shadow_due at once */
			e->jheld_shadows++;
		}
	}
	eng_unlock(e);
}

/* Queue f for the GPU -> host cascade (cascade.c). */
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
	eng_cascade_work(e);
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

/* Write cp's len bytes into version fd (its holes left out:
 * backing_write_sparse) and size it; the settle is the caller's.
 * e->lock not held, cp leased. */
static int flush_whole(struct ssd_ring *ring, struct copy *cp, int fd, uint64_t len,
		       bool direct, bool small, bool inplace)
{
	int ret;

	if (!cp->cache->host_addressable)	/* holes left out here too */
		ret = backing_move(&(struct bend){ .kind = BEND_FD, .fd = fd,
						   .sparse = !inplace },
				   &(struct bend){ .kind = BEND_CACHE, .cache = cp->cache,
						   .at = cp->frag->off },
				   len, &cp->flushed_bytes);
	else {	/* a few pages (small) as plain writes, not a trip through io-wq */
		ret = direct && !inplace ? backing_prealloc(fd, cp, tier_round(len)) : 0;
		if (!ret)
			ret = backing_write_sparse(small ? NULL : ring, fd, cp, 0,
						   direct ? tier_round(len) : len,
						   &cp->flushed_bytes, inplace);
	}
	/* a fresh version written with plain writes has its size when its
	 * last byte was written (not in a hole: not a zero) */
	if (!ret && !(small && !inplace && (!len || copy_ptr(cp)[len - 1])) &&
	    ftruncate(fd, (off_t)len) < 0)
		ret = -errno;
	return ret;
}

/* e->lock held: cp's flush (on e->fl_running) ended. */
static void running_remove(struct engine *e, struct copy *cp)
{
	struct copy **pp = &e->fl_running;

	while (*pp && *pp != cp)
		pp = &(*pp)->fl_next;
	if (*pp)
		*pp = cp->fl_next;
	cp->fl_next = NULL;
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
 * A flush in its phases, for one file (eng_flush_one) or a group of small ones
 * (flush_batch): flush_start (e->lock held: the plan, the lease),
 * flush_write (the version written, or the journal record, or the small
 * first version in place), the settle of the version (eng_settle_version,
 * or eng_settle_versions for a group), flush_commit (version_commit) and
 * flush_end (e->lock taken again: the bookkeeping).
 */
struct fjob {
	struct tfile *f;
	struct copy *cp;		/* the copy written, leased (l) */
	struct lease l;
	uint64_t gen, len;		/* f's gen and cp's length at the start */
	struct dd_flush dd;
	struct jflush jf;
	bool direct, inplace, small;
	bool vsmall;			/* written in place by version_small */
	bool settle;			/* fd is to be settled before its commit */
	bool jonly;			/* journalled, the apply left to a flusher */
	bool jgroup;			/* journalled with its group (journal_group):
					 * done, j->ret its result */
	uint64_t jseq;			/* the record journal_group applies */
	bool held;			/* past its flush_write delay point */
	int fd;				/* the version to commit, or -1 */
	int ret;
	double t0, ts, tc;		/* start; seconds settling, committing */
};

/*
 * e->lock held: start the flush of f's newest complete copy into j (cp
 * flushing, leased; e->lock stays held).  false: nothing to do, or
 * another flusher has it.
 */
static bool flush_start(struct engine *e, struct tfile *f, struct fjob *j)
{
	struct copy *cp;

	eng_delay_at(e, "flush_start");
	cp = newest_complete(e, f);
	if (!cp || !f->dirty || f->unlinked || cp->state != TS_WRITE_COMPLETE ||
	    cp->flushing)
		return false;
	memset(j, 0, sizeof(*j));
	j->f = f;
	j->cp = cp;
	j->fd = -1;
	cp->flushing = true;
	__atomic_store_n(&cp->flushed_bytes, 0, __ATOMIC_RELAXED);
	cp->fl_next = e->fl_running;
	e->fl_running = cp;
	j->gen = f->gen;
	j->len = cp->len;
	eng_dd_plan(e, f, cp, j->len, &j->dd);	/* its version leaves the index */
	eng_jf_plan(e, f, cp, j->len, &j->jf);
	e->busy++;
	lease_take(&j->l, cp);
	return true;
}

/*
 * e->lock not held, j->cp leased: write j's version (j->fd, to be settled
 * where j->settle, then committed), or its journal record, or the whole
 * flush where nothing is left to commit (j->fd -1, j->ret its result).
 * ring NULL: in an fsync's thread.
 */
static void flush_write(struct engine *e, struct ssd_ring *ring, struct fjob *j)
{
	struct tfile *f = j->f;
	struct copy *cp = j->cp;
	uint64_t len = j->len;
	int fd, ret;

	if (j->jgroup)
		return;		/* journal_group's */
	if (!j->held)
		eng_delay_at(NULL, "flush_write");	/* under cp's lease */
	j->t0 = tier_now();
	if (j->jf.r) {
		ret = eng_jf_flush(e, f, cp, j->gen, len, &j->jf, !ring);
		j->jonly = ret == 1;
		if (ret != 2) {
			j->dd.journalled = true;
			if (!ret) {	/* applied: the version stays indexed */
				eng_dd_applied(e, f, cp, len, &j->dd);
				__atomic_store_n(&cp->flushed_bytes, len, __ATOMIC_RELAXED);
			}
			j->ret = ret;
			return;
		}
	}
	/* an applied record settled before a version (eng_asettle_file) */
	ret = eng_asettle_file(e, f);
	if (ret) {
		j->ret = ret;
		return;
	}
	if (j->jf.pending) {
		ret = eng_settle_record(e, f, j->jf.pending);
		if (ret) {
			j->ret = ret;
			return;
		}
		j->jf.pending = 0;
	}
	j->small = cp->cache->host_addressable && len <= FLUSH_BUFFERED_MAX;
	if (j->small && f->ops->version_small) {
		ret = eng_copy_bounds(cp, 0, len);
		if (!ret)
			ret = f->ops->version_small(f, copy_ptr(cp), len, &fd);
		if (ret > 0) {
			__atomic_store_n(&cp->flushed_bytes, len, __ATOMIC_RELAXED);
			j->vsmall = j->inplace = j->settle = true;
			j->fd = fd;
			return;
		}
		if (ret) {
			j->ret = ret;
			return;
		}
	}
	fd = f->ops->version_open(f, cp->cache->host_addressable && !j->small, &j->direct,
				  &j->inplace);
	if (fd < 0) {
		j->ret = fd;
		return;
	}
	ret = eng_copy_bounds(cp, 0, j->direct ? tier_round(len) : len);
	if (!ret) {
		ret = eng_dd_write(e, ring, f, cp, fd, j->direct, j->inplace, len, &j->dd);
		if (ret == -EAGAIN) {	/* not by dedup: the whole file */
			ret = flush_whole(ring, cp, fd, len, j->direct, j->small, j->inplace);
			j->settle = true;
		}
	}
	if (ret) {
		close(fd);
		j->ret = ret;
		return;
	}
	j->fd = fd;
}

/* j's version settled alone (its time in j->ts); on failure it is dropped. */
static void flush_settle(struct engine *e, struct ssd_ring *ring, struct fjob *j)
{
	double t0;

	if (j->fd < 0 || !j->settle)
		return;
	t0 = tier_now();
	j->ret = eng_settle_version(e, ring, j->fd, j->small, j->inplace);
	j->ts += tier_now() - t0;
	__atomic_add_fetch(&e->fl_syncs, 1, __ATOMIC_RELAXED);
	if (j->ret) {
		close(j->fd);
		j->fd = -1;
	}
}

/* e->lock not held: make j's settled version f's content (version_commit). */
static void flush_commit(struct engine *e, struct fjob *j)
{
	struct tfile *f = j->f;
	double t0;
	int ret;

	if (j->fd < 0)
		return;
	t0 = tier_now();
	ret = f->ops->version_commit(f, j->fd, j->inplace, false);
	j->fd = -1;
	j->tc = tier_now() - t0;
	if (!ret && !j->vsmall)
		eng_dd_committed(f, j->len, &j->dd);
	j->ret = ret;
}

/*
 * e->lock not held: end j's flush (its lease, the file's state, the
 * statistics, a retry after a failure).  Returns with e->lock held.
 */
static int flush_end(struct engine *e, struct fjob *j)
{
	struct tfile *f = j->f;
	struct copy *cp = j->cp;
	uint64_t gen = j->gen, len = j->len;
	int ret = j->ret;
	char nb[256];

	if (j->jonly) {
		/* journalled by an fsync: a flusher applies it */
		free(j->jf.r);
		lease_end(e, &j->l);
		e->busy--;
		cp->flushing = false;
		running_remove(e, cp);
		eng_dd_done(e, f, &j->dd, false, len);
		e->fl_total_s += tier_now() - j->t0;
		eng_queue_flush(e, f, false);
		eng_settled(e);		/* not flushing (still complete: no room) */
		eng_flushed(e);
		return 0;
	}
	free(j->jf.r);
	fname(f, nb, sizeof(nb));	/* not under e->lock: it takes fs locks */
	lease_end(e, &j->l);
	e->busy--;
	cp->flushing = false;
	running_remove(e, cp);
	eng_dd_done(e, f, &j->dd, ret == 0, len);
	e->fl_total_s += tier_now() - j->t0;
	e->fl_clone_s += j->dd.clone_s;
	e->fl_sync_s += j->ts + j->dd.sync_s;
	e->fl_commit_s += j->tc;
	if (ret == 0) {
		double dt = tier_now() - j->t0;

		/* the rate of whole versions, which eviction waits for (a
		 * journal flush writes a few ranges of len in that time) */
		if (len >= (1u << 20) && dt > 0 && !j->dd.journalled)
			e->flush_bw = e->flush_bw > 0 ?
				0.7 * e->flush_bw + 0.3 * (double)len / dt :
				(double)len / dt;
		/* a journal flush wrote its ranges into the file, not len */
		e->bytes_flushed += j->dd.journalled ? j->jf.bytes : len;
		e->files_flushed++;
		f->flushed_gen = gen;
		if (f->flush_err)
			tlog(LOG_NOTICE, "%s: flushed after earlier failure", nb);
		f->flush_err = 0;
		if (f->gen == gen) {
			backlog_del(e, cp);
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
	eng_settled(e);
	eng_room(e);		/* cp is FLUSHED (evictable) when it went well */
	eng_flushed(e);
	eng_dd_index(e, &j->dd);	/* after the fsync waiters were woken */
	return ret;
}

/*
 * Flush f's newest copy to the SSD as a new version.  e->lock held
 * (dropped meanwhile).  Normally the host copy; a GPU copy when the host
 * tier had no room for the cascade.
 */
int eng_flush_one(struct engine *e, struct ssd_ring *ring, struct tfile *f)
{
	struct fjob j;

	if (!flush_start(e, f, &j))
		return 0;	/* nothing to do, or another flusher has it */
	eng_unlock(e);
	flush_write(e, ring, &j);
	flush_settle(e, ring, &j);
	flush_commit(e, &j);
	return flush_end(e, &j);
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
	eng_flush_one(e, NULL, f);
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
struct tfile *eng_pop_due(struct tfile **head, struct tfile **tail, size_t link_off)
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
	struct tfile *f = eng_pop_due(&e->q_head, &e->q_tail, offsetof(struct tfile, fq_next));

	if (f || !(f = e->aq_head))
		return f;
	if (f->due_at > tier_now() && !e->room_waiters && !e->stop)
		return NULL;
	aging_remove(e, f);
	return f;
}

/*
 * Small files are flushed in groups (flush_batch): a flusher that takes a
 * small file from the queues takes up to FLUSH_BATCH_FILES more that are
 * due (FLUSH_BATCH_BYTES in all), writes all their versions, makes them
 * durable together (eng_settle_versions: their syncs in flight at once,
 * which the backing file system's log commits together: a tar extraction
 * of thousands of small files pays a few log commits, not one a file),
 * then commits each.  Each version is still durable before its rename.
 * Their small changes in place go together too (journal_group): one
 * journal sync for the group's records, one group sync of their files.
 * A file on the aging queue joins a group up to group_slack before it is
 * due.
 */
#define FLUSH_BATCH_FILES	64
#define FLUSH_BATCH_BYTES	(4u << 20)

/*
 * How many files a flusher's group holds (e->batch_files): each holds a
 * descriptor on its version until it is committed, so all the flushers'
 * groups together stay within cfg.flush_fds (the owner's share of its
 * descriptor budget), and a group of 1 is no group.
 */
void eng_batch_files(struct engine *e)
{
	unsigned n = FLUSH_BATCH_FILES;

	if (e->cfg.flush_fds) {
		n = e->cfg.flush_fds / (unsigned)e->cfg.flush_threads;
		if (n > FLUSH_BATCH_FILES)
			n = FLUSH_BATCH_FILES;
	}
	e->batch_files = n;
}

/* e->lock held: is f's flush one for a group?  A small host copy, no
 * -o dedup (whose flushes settle their own versions), no fsync waiting
 * (its flush alone is sooner). */
static bool batchable(struct engine *e, struct tfile *f)
{
	struct copy *cp = newest_complete(e, f);

	return cp && !e->cfg.dedup && !f->flush_waiters && cp->cache->host_addressable &&
	       cp->len <= FLUSH_BUFFERED_MAX;
}

/*
 * How much sooner than its due time an aging file may join a group: an
 * eighth of its age.  Files closed a few milliseconds apart share their
 * group's syncs (journal_group, eng_settle_versions) instead of each
 * making a group of one when its time comes.
 */
static double group_slack(const struct engine *e)
{
	return e->cfg.flush_age_ms / 8e3;
}

/*
 * e->lock held: unlink and return a due file of the queues for a group
 * (batchable), or NULL: the first of the flush queue's first
 * FLUSH_BATCH_FILES that is, else the aging queue's first when it is due
 * (pop_flush's rule) or due within group_slack.
 */
static struct tfile *pop_small(struct engine *e)
{
	struct tfile *f, *prev = NULL;
	int seen = 0;

	for (f = e->q_head; f && seen < FLUSH_BATCH_FILES; prev = f, f = f->fq_next, seen++) {
		if (!retry_due(f) || !batchable(e, f))
			continue;
		if (prev)
			prev->fq_next = f->fq_next;
		else
			e->q_head = f->fq_next;
		if (e->q_tail == f)
			e->q_tail = prev;
		f->fq_next = NULL;
		return f;
	}
	f = e->aq_head;
	if (!f || (f->due_at > tier_now() + group_slack(e) && !e->room_waiters && !e->stop) ||
	    !batchable(e, f))
		return NULL;
	aging_remove(e, f);
	return f;
}

/*
 * e->lock not held: the journal flushes of a group's jobs j[0..n) (those
 * with a plan, j->jf.r), made together so that they share their syncs:
 * every record appended, the journal synced once for them all (each
 * record durable before its file is written in place), every change
 * applied, the files synced together (ssd_fdatasync_many: the backing
 * log commits them at once), then each record retired.  Two log commits
 * for the group where each alone takes two (RESULTS 18f).  A job whose
 * change is not small after all goes on to a new version (flush_write);
 * one whose step fails keeps its record live (retried, or replayed), as
 * eng_jf_flush's does.
 */
static void journal_group(struct engine *e, struct ssd_ring *ring, struct fjob *j, unsigned n)
{
	int fds[FLUSH_BATCH_FILES], res[FLUSH_BATCH_FILES];
	unsigned idx[FLUSH_BATCH_FILES], na = 0, i, k;
	uint64_t last = 0;
	struct tfile *owner = NULL;
	int ret;

	for (i = 0; i < n; i++) {	/* the records, not synced yet */
		struct fjob *q = &j[i];

		if (!q->jf.r)
			continue;
		eng_delay_at(NULL, "flush_write");	/* before its record, as alone */
		q->held = true;
		q->t0 = tier_now();
		ret = eng_jf_record(e, q->f, q->cp, q->len, &q->jf, false, &q->jseq);
		if (ret == 2) {		/* a new version: flush_write's */
			free(q->jf.r);
			q->jf.r = NULL;
			continue;
		}
		q->jgroup = true;
		q->ret = ret;
		if (ret)
			continue;
		if (q->jf.record && q->jseq > last) {
			last = q->jseq;
			owner = q->f;
		}
	}
	ret = owner ? owner->ops->journal_sync(owner, last) : 0;
	for (i = 0, k = 0; i < n; i++) {	/* durable: each file's now */
		struct fjob *q = &j[i];

		if (!q->jgroup || q->ret)
			continue;
		if (ret && q->jf.record) {
			/* perhaps durable: retired, so that no replay applies
			 * a change that the flush's retry journals again */
			q->f->ops->journal_retire(q->f, q->jseq);
			q->ret = ret;
			continue;
		}
		if (q->jf.record)
			eng_jf_recorded(e, q->f, q->gen, q->jseq);
		k++;
	}
	if (k)		/* tests: the records are all there is */
		eng_delay_at(NULL, "journal_apply");
	for (i = 0; i < n; i++) {	/* applied, not synced */
		struct fjob *q = &j[i];

		if (!q->jgroup || q->ret)
			continue;
		q->ret = eng_asettle_file(e, q->f);	/* its earlier apply first */
		if (!q->ret)
			q->ret = q->f->ops->journal_apply(q->f, copy_ptr(q->cp), q->jf.r,
							  NULL, q->jf.n, q->len, &fds[na]);
		if (!q->ret)
			idx[na++] = i;
	}
	if (na)
		ssd_fdatasync_many(ring, fds, res, na);
	for (k = 0; k < na; k++) {
		struct fjob *q = &j[idx[k]];

		close(fds[k]);
		q->ret = res[k];
		if (!q->ret) {
			eng_jf_applied(e, q->f, q->jseq);
			/* as eng_jf_flush's caller (a group has no dedup:
			 * batchable; bytes_flushed counts its ranges) */
			q->dd.journalled = true;
			eng_dd_applied(e, q->f, q->cp, q->len, &q->dd);
			__atomic_store_n(&q->cp->flushed_bytes, q->len, __ATOMIC_RELAXED);
		}
	}
	if (na)
		__atomic_add_fetch(&e->fl_syncs, 1, __ATOMIC_RELAXED);
}

/*
 * e->lock held (dropped meanwhile): flush first, a small file taken off
 * the queues (its reference the caller's), with the due small files that
 * pop_small gives, as a group; j: room for e->batch_files jobs.  The
 * references of the others are dropped here.
 */
static void flush_batch(struct engine *e, struct ssd_ring *ring, struct tfile *first,
			struct fjob *j)
{
	struct tfile *more[FLUSH_BATCH_FILES];
	int fds[FLUSH_BATCH_FILES], res[FLUSH_BATCH_FILES];
	bool inplace[FLUSH_BATCH_FILES];
	unsigned n = 0, nmore = 0, ns = 0, i;
	uint64_t bytes = 0;
	struct tfile *f = first;
	double t0 = 0;

	do {
		f->queued = false;
		if (f != first)
			more[nmore++] = f;
		if (flush_start(e, f, &j[n]))
			bytes += j[n++].len;
	} while (n < e->batch_files && nmore < e->batch_files - 1 &&
		 bytes < FLUSH_BATCH_BYTES && (f = pop_small(e)));
	eng_unlock(e);
	journal_group(e, ring, j, n);
	for (i = 0; i < n; i++) {
		flush_write(e, ring, &j[i]);
		if (j[i].fd >= 0 && j[i].settle) {
			fds[ns] = j[i].fd;
			inplace[ns++] = j[i].inplace;
		}
	}
	if (ns) {
		t0 = tier_now();
		eng_settle_versions(e, ring, fds, inplace, res, ns);
		t0 = (tier_now() - t0) / ns;	/* each one's share */
		__atomic_add_fetch(&e->fl_syncs, 1, __ATOMIC_RELAXED);
	}
	for (i = 0, ns = 0; i < n; i++) {
		if (j[i].fd < 0 || !j[i].settle)
			continue;
		j[i].ts += t0;
		j[i].ret = res[ns++];
		if (j[i].ret) {
			close(j[i].fd);
			j[i].fd = -1;
		}
	}
	for (i = 0; i < n; i++)
		flush_commit(e, &j[i]);
	for (i = 0; i < n; i++) {
		if (i)
			eng_unlock(e);
		flush_end(e, &j[i]);
	}
	if (n)
		eng_unlock(e);	/* flush_end took it */
	for (i = 0; i < nmore; i++)
		more[i]->ops->put(more[i]);
	eng_lock(e);
}

void *eng_flusher_main(void *arg)
{
	struct engine *e = arg;
	struct ssd_ring ring;
	struct fjob *batch;
	int ret;

	ret = ssd_ring_init(&ring, e->cfg.queue_depth, e->cfg.chunk);
	if (ret) {
		tlog(LOG_CRIT, "io_uring setup failed: %s", strerror(-ret));
		return NULL;
	}
	/* NULL: one at a time */
	batch = e->batch_files > 1 ? calloc(e->batch_files, sizeof(*batch)) : NULL;
	eng_lock(e);
	for (;;) {
		struct tfile *f;
		int fd;

		if (e->nreap) {
			struct tfile *r = e->reap[--e->nreap];

			eng_unlock(e);
			r->ops->put(r);
			eng_lock(e);
			continue;
		}
		fd = eng_dd_take_close(e);	/* of a retired version */
		if (fd >= 0) {
			eng_unlock(e);
			close(fd);
			eng_lock(e);
			continue;
		}
		if (e->nasettle >= ASETTLE_BATCH) {
			eng_asettle_all(e, &ring);
			continue;
		}
		f = pop_flush(e);
		if (!f && e->nasettle) {	/* nothing due: their syncs now */
			eng_asettle_all(e, &ring);
			continue;
		}
		if (!f) {
			int ms = e->q_head ? 100 : 1100;

			if (e->stop && !e->q_head && !e->aq_head && !e->nreap)
				break;
			if (e->aq_head) {
				double left = (e->aq_head->due_at - tier_now()) * 1e3 + 1;

				ms = left < 1 ? 1 : left < ms ? (int)left : ms;
			}
			wait_ms(e, &e->flush_work, ms);
			continue;
		}
		if (f->shadow_fd >= 0) {
			f->queued = false;
			shadow_due(e, f);
		} else if (batch && batchable(e, f)) {
			flush_batch(e, &ring, f, batch);
		} else {
			f->queued = false;
			eng_flush_one(e, &ring, f);
		}
		eng_unlock(e);
		f->ops->put(f);
		eng_lock(e);
	}
	eng_unlock(e);
	free(batch);
	ssd_ring_exit(&ring);
	return NULL;
}
