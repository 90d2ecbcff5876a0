/*
 * flush_journal.c - the journal flush: a file changed in place by a few
 * bytes made durable by a journal record of the changed ranges (through
 * tfile_ops.journal_delta: appended and synced, one sequential write),
 * then applied in its backing file (journal_apply) and retired
 * (journal_retire), and the applies whose syncs are left to a flusher's
 * pause (the asettle queue).  See flush_journal.h for how flush.c calls it.
 *
 * Owns: the plan (struct jflush, in a flush's job), the counting of a
 * change without its blocks of zeros and of a grown file by its data runs,
 * the record's ranges, e->asettle and e->nasettle, and the tfile fields
 * jseq, jgen, journaled_gen, jsettle and jsettling.  Locks: e->lock around
 * those fields, never while bytes move or while tfile_ops are called (those
 * take the fs side's and the journal's locks).  Calls backing.c's
 * backing_run, ssd.c's ssd_fdatasync_many and tfile_ops; nothing of flush.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flush_journal.h"

/*
 * e->lock held: plan the journal flush of len bytes of f (copy cp).  No
 * plan (p->r NULL) when the mount does not journal, the ranges are not
 * known, or the change is not small even without its blocks of zeros
 * (over the limit with them, it is counted again once the copy is
 * leased: journal_data).  Past the backing file's size (the
 * base's) the file's new bytes are counted by their data runs only, found
 * once the copy is leased (journal_tail): a file grown by a write far past
 * its end is a small change, and its hole stays a hole.
 */
void eng_jf_plan(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
			 struct jflush *p)
{
	uint64_t c, tb, bytes = 0;
	uint32_t k = 0;

	memset(p, 0, sizeof(*p));
	p->pending = f->jseq;
	p->sparse = UINT64_MAX;
	if (!e->cfg.journal_pct || !f->ops->journal_delta ||
	    !cp->cache->host_addressable || !f->dd.valid || f->dd.taint || f->shadow_fd >= 0)
		return;
	c = f->dd.clean_len < len ? f->dd.clean_len : len;
	tb = f->dd.base_len > c ? (f->dd.base_len < len ? f->dd.base_len : len) : c;
	p->cap = f->dd.ranges.n + 1;
	p->r = malloc((size_t)p->cap * sizeof(*p->r));
	if (!p->r)
		return;
	for (uint32_t i = 0; i < f->dd.ranges.n; i++) {
		struct drange d = f->dd.ranges.r[i];

		if (d.start >= c)
			break;
		if (d.end > c)
			d.end = c;
		p->r[k++] = d;
		bytes += d.end - d.start;
	}
	if (tb > c) {		/* the base's bytes past the least size: all */
		p->r[k++] = (struct drange){ c, tb };
		bytes += tb - c;
	}
	p->n = k;
	p->bytes = bytes;
	if (tb < len)
		p->sparse = tb;
	p->record = !(f->jseq && f->jgen == f->gen);
	/* over the limit, a new record is counted again without its zero
	 * blocks once the copy is leased (journal_data): kept */
	if (eng_journal_small(e, f, bytes, len) || (bytes <= JOURNAL_MAX && p->record))
		return;
	free(p->r);
	p->r = NULL;
}

/*
 * The run of buf from pos (below end) of whole TIER_ALIGN blocks of zeros
 * (*hole) or of data: its end.  An unaligned head is data up to the next
 * block.
 */
static uint64_t zero_blocks_run(const uint8_t *buf, uint64_t pos, uint64_t end, bool *hole)
{
	uint64_t next;

	if (pos % TIER_ALIGN) {
		next = pos - pos % TIER_ALIGN + TIER_ALIGN;
		*hole = false;
		return next < end ? next : end;
	}
	return fc_zero_run(buf, pos, end, TIER_ALIGN, TIER_ALIGN, false, hole);
}

/*
 * A new record's plan over the limit counted again, of f's copy buf: its
 * ranges' bytes less their whole TIER_ALIGN blocks of zeros, which are no
 * bytes of the record (record_ranges) and which its apply punches or
 * writes as the file's own.  A hole punched or a range zeroed through the
 * mount (fallocate), or a file cut short and grown again, is then a small
 * change, as it is to the disk.  0, or 2 where it is not small after all.
 */
static int journal_data(struct engine *e, const struct tfile *f, const uint8_t *buf,
			uint64_t len, struct jflush *p)
{
	uint64_t bytes = 0;

	for (uint32_t i = 0; i < p->n; i++) {
		uint64_t pos = p->r[i].start, end = p->r[i].end, next;
		bool hole = false;

		for (; pos < end; pos = next) {
			next = zero_blocks_run(buf, pos, end, &hole);
			if (!hole)
				bytes += next - pos;
		}
	}
	p->bytes = bytes;
	return eng_journal_small(e, f, bytes, len) ? 0 : 2;
}

/*
 * p's ranges completed with the data runs of buf past p->sparse (to len),
 * as a fresh version's are written (backing_run): 0, 2 when the change is
 * not small after all (a new version is written), -ENOMEM.
 */
static int journal_tail(struct engine *e, const struct tfile *f, const uint8_t *buf,
			uint64_t len, struct jflush *p)
{
	uint64_t pos = p->sparse, next;
	bool hole;

	p->sparse = UINT64_MAX;		/* done once: a retry keeps these */
	while (pos < len) {
		next = backing_run(buf, pos, len, &hole);
		if (!hole) {
			if (p->n == p->cap) {
				struct drange *r = realloc(p->r, (size_t)p->cap * 2 * sizeof(*r));

				if (!r)
					return -ENOMEM;
				p->r = r;
				p->cap *= 2;
			}
			p->r[p->n++] = (struct drange){ pos, next };
			p->bytes += next - pos;
			if (!eng_journal_small(e, f, p->bytes, len))
				return 2;
		}
		pos = next;
	}
	return 0;
}

/*
 * The ranges of record p, of f's copy buf: p's, each cut where whole
 * TIER_ALIGN blocks of zeros start and end.  The zero runs (*zero true)
 * hold no bytes in the record (JNL_ZERO: a replay punches them; the apply
 * in place writes what it writes, zeros or a hole, the same bytes).
 * *r and *zero malloc'ed, *n of them; both NULL where p has no zero
 * block (its ranges go as they are).  0 or -ENOMEM.
 */
static int record_ranges(const uint8_t *buf, const struct jflush *p, struct drange **r,
			 bool **zero, uint32_t *n)
{
	uint32_t k = 0, cap = 0;
	bool any = false;

	*r = NULL;
	*zero = NULL;
	*n = 0;
	for (int pass = 0; pass < 2; pass++) {	/* count, then fill */
		for (uint32_t i = 0; i < p->n; i++) {
			uint64_t pos = p->r[i].start, end = p->r[i].end, next;
			bool hole;

			for (; pos < end; pos = next) {
				next = zero_blocks_run(buf, pos, end, &hole);
				any = any || hole;
				if (pass && k && (*zero)[k - 1] == hole && (*r)[k - 1].end == pos) {
					(*r)[k - 1].end = next;
					continue;
				}
				if (pass) {
					(*r)[k] = (struct drange){ pos, next };
					(*zero)[k] = hole;
				}
				k++;
			}
		}
		if (!any)
			return 0;
		if (!pass) {
			cap = k;
			k = 0;
			*r = malloc((size_t)cap * sizeof(**r));
			*zero = malloc((size_t)cap * sizeof(**zero));
			if (!*r || !*zero) {
				free(*r);
				free(*zero);
				*r = NULL;
				*zero = NULL;
				return -ENOMEM;
			}
		}
	}
	*n = k;
	return 0;
}

/*
 * The journal flush in its phases, which a group of flushes (flush_batch:
 * journal_group) takes together.  1: p's record appended (synced where
 * sync), of f's copy cp (leased, e->lock not held), *seq the record to
 * apply (p->pending where p's is a record made before): 0, 2 where f
 * cannot be journalled after all (a new version is written), or -errno.
 */
int eng_jf_record(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
			  struct jflush *p, bool sync, uint64_t *seq)
{
	int ret = eng_copy_bounds(cp, 0, len);

	*seq = p->pending;
	if (!ret && p->record && !eng_journal_small(e, f, p->bytes, len))
		ret = journal_data(e, f, copy_ptr(cp), len, p);
	if (!ret && p->sparse < len)
		ret = journal_tail(e, f, copy_ptr(cp), len, p);
	if (ret || !p->record)
		return ret;
	struct drange *r;
	bool *zero;
	uint32_t n;

	ret = record_ranges(copy_ptr(cp), p, &r, &zero, &n);
	if (ret)
		return ret;
	ret = r ? f->ops->journal_delta(f, copy_ptr(cp), r, zero, n, len, seq, sync)
		: f->ops->journal_delta(f, copy_ptr(cp), p->r, NULL, p->n, len, seq, sync);
	free(r);
	free(zero);
	return ret > 0 ? 2 : ret;
}

/* 2: record seq, durable, is f's as of gen (the fsyncs of gen are done);
 * the record before it is superseded (this one holds its ranges too). */
void eng_jf_recorded(struct engine *e, struct tfile *f, uint64_t gen, uint64_t seq)
{
	uint64_t old;

	eng_lock(e);
	old = f->jseq;
	f->jseq = seq;
	f->jgen = gen;
	if (f->journaled_gen < gen)
		f->journaled_gen = gen;
	eng_flushed(e);
	eng_unlock(e);
	if (old)
		f->ops->journal_retire(f, old);
}

/* 3, after journal_apply: record seq is in the backing file, synced. */
void eng_jf_applied(struct engine *e, struct tfile *f, uint64_t seq)
{
	f->ops->journal_retire(f, seq);
	eng_lock(e);
	if (f->jseq == seq)
		f->jseq = 0;
	eng_unlock(e);
}

/*
 * An apply's sync left to a flusher's pause.  A journal flush alone
 * (eng_jf_flush) writes its record's ranges into the backing file and,
 * while other flushes are due, instead of waiting there for their sync (a
 * log commit each, in the flusher that should be making room), queues the
 * file here: a flusher
 * that has nothing due, or that finds ASETTLE_BATCH waiting, syncs them
 * all together (ssd_fdatasync_many: the backing log commits them at once)
 * and retires their records.  Until then the record stays live: a crash
 * replays it, writing the same bytes again.  Its retirement must come
 * before anything newer of the file is written into its backing file and
 * retired (a replay of the older record would undo it): another apply, a
 * settle, a version (flush_write, start_shadow) each settle f's first
 * (eng_asettle_file).  A file is queued once at most (f->jsettle).
 * e->asettle is under e->lock; f->jsettle, f->jsettling too.
 */

/* e->lock held: f's apply of record seq (written through fd, not synced)
 * queued; false where the queue is full (the caller syncs it).  Only while
 * other flushes are due (eng_jf_flush): a flusher with nothing else to do
 * syncs at once, as soon as a pause would. */
static bool asettle_later(struct engine *e, struct tfile *f, uint64_t seq, int fd)
{
	if (e->nasettle == ASETTLE_MAX)
		return false;
	f->ops->get(f);
	e->asettle[e->nasettle++] = (struct asettle){ f, seq, fd };
	f->jsettle = seq;
	if (f->jseq == seq)
		f->jseq = 0;	/* applied: no later record supersedes it */
	return true;
}

/*
 * e->lock not held: the sync of an apply of f's record seq ended with
 * ret (fd closed).  Retired where it is durable; else the record is
 * applied again from the journal (journal_settle: written, synced,
 * retired durably), as a replay would.  0 or -errno (it stays f's).
 */
static int asettle_done(struct tfile *f, uint64_t seq, int ret)
{
	if (!ret) {
		f->ops->journal_retire(f, seq);
		return 0;
	}
	return f->ops->journal_settle(f, seq);
}

/* e->lock held: f's settle of seq over (ret), its waiters woken. */
static void asettle_end(struct engine *e, struct tfile *f, uint64_t seq, int ret)
{
	f->jsettling = false;
	if (!ret && f->jsettle == seq)
		f->jsettle = 0;
	eng_flushed(e);
}

/* e->lock held (dropped meanwhile): every queued apply synced, together,
 * and its record retired. */
void eng_asettle_all(struct engine *e, struct ssd_ring *ring)
{
	struct asettle v[ASETTLE_MAX];
	int fds[ASETTLE_MAX], res[ASETTLE_MAX];
	unsigned n = e->nasettle, i;

	memcpy(v, e->asettle, n * sizeof(v[0]));
	e->nasettle = 0;
	e->asettling += n;
	for (i = 0; i < n; i++) {
		v[i].f->jsettling = true;
		fds[i] = v[i].fd;
	}
	eng_unlock(e);
	eng_delay_at(NULL, "journal_settle_applied");	/* tests: a power cut first */
	ssd_fdatasync_many(ring, fds, res, n);
	__atomic_add_fetch(&e->fl_syncs, 1, __ATOMIC_RELAXED);
	for (i = 0; i < n; i++) {
		close(fds[i]);
		res[i] = asettle_done(v[i].f, v[i].seq, res[i]);
		if (res[i]) {
			char nb[256];

			tlog(LOG_WARNING, "%s: a journal record's apply could not be synced (%s): "
			     "it stays live (retried before the file's next change)",
			     fname(v[i].f, nb, sizeof(nb)), strerror(-res[i]));
		}
	}
	eng_lock(e);
	for (i = 0; i < n; i++)
		asettle_end(e, v[i].f, v[i].seq, res[i]);
	e->asettling -= n;
	eng_unlock(e);
	for (i = 0; i < n; i++)
		v[i].f->ops->put(v[i].f);
	eng_lock(e);
}

/*
 * e->lock not held: f's applied record, where one waits for its sync,
 * settled now (synced and retired, or applied again from the journal),
 * before anything newer of f is written into its backing file; one that
 * a flusher is settling is waited for.  0 or -errno.
 */
int eng_asettle_file(struct engine *e, struct tfile *f)
{
	uint64_t seq;
	int fd = -1, ret;
	bool queued = false;

	eng_lock(e);
	while (f->jsettling)
		pthread_cond_wait(&e->flushed, &e->lock);
	seq = f->jsettle;
	if (!seq) {
		eng_unlock(e);
		return 0;
	}
	for (unsigned i = 0; i < e->nasettle; i++)
		if (e->asettle[i].f == f) {
			fd = e->asettle[i].fd;
			e->asettle[i] = e->asettle[--e->nasettle];
			queued = true;
			break;
		}
	f->jsettling = true;
	e->asettling++;
	eng_unlock(e);
	ret = -EIO;		/* not queued: its sync failed before */
	if (fd >= 0) {
		ret = fdatasync(fd) < 0 ? -errno : 0;
		close(fd);
	}
	ret = asettle_done(f, seq, ret);
	eng_lock(e);
	asettle_end(e, f, seq, ret);
	e->asettling--;
	eng_unlock(e);
	if (queued)
		f->ops->put(f);
	return ret;
}

/*
 * The journal flush planned in p, of f's copy cp (leased, e->lock not
 * held) as of gen, alone.  inline_: in an fsync's thread (the apply is
 * left to a flusher: returns 1 once the record is durable).  0 when the
 * backing file holds it, 1 (inline_), 2 where f cannot be journalled (the
 * caller writes a new version), or -errno.
 */
int eng_jf_flush(struct engine *e, struct tfile *f, struct copy *cp, uint64_t gen,
			 uint64_t len, struct jflush *p, bool inline_)
{
	uint64_t seq;
	bool queued;
	int ret, fd;

	ret = eng_jf_record(e, f, cp, len, p, true, &seq);
	if (ret)
		return ret;
	if (p->record)
		eng_jf_recorded(e, f, gen, seq);
	if (inline_)
		return 1;
	eng_delay_at(NULL, "journal_apply");
	ret = eng_asettle_file(e, f);	/* its earlier apply first */
	if (!ret)
		ret = f->ops->journal_apply(f, copy_ptr(cp), p->r, NULL, p->n, len, &fd);
	if (ret)
		return ret;	/* the record stays: retried, or replayed */
	eng_lock(e);
	queued = (e->q_head || tierfs_fault("journal_settle_later")) &&	/* others due */
		 asettle_later(e, f, seq, fd);
	eng_unlock(e);
	if (queued)
		return 0;
	ret = fdatasync(fd) < 0 ? -errno : 0;
	close(fd);
	if (ret)
		return ret;
	eng_jf_applied(e, f, seq);
	return 0;
}

/*
 * e->lock not held: f's journal record seq, not applied yet, into the
 * backing file and retired, durably (journal_settle), before anything of a
 * new version of f is written (flush_write, start_shadow).  Left live, its
 * replay after a crash would undo a version that keeps the file's inode
 * (written in place, or copied over a file of several names), and the
 * file would lose what was acknowledged since; applied after an in-place
 * write, too.  f->jseq is cleared if it still names seq.  0 or -errno.
 */
int eng_settle_record(struct engine *e, struct tfile *f, uint64_t seq)
{
	int ret = eng_asettle_file(e, f);	/* an older record's retirement first */

	if (!ret)
		ret = f->ops->journal_settle(f, seq);
	if (!ret) {
		eng_lock(e);
		if (f->jseq == seq)
			f->jseq = 0;
		eng_unlock(e);
	}
	return ret;
}
