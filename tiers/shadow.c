/*
 * shadow.c - write-through: a file that no cache tier takes (no room, or
 * a write that would fill a cache with a hole's zeros) is written into a
 * new version of its backing file, its "shadow"; and the fsyncs of such a
 * file, made durable as journal records of what changed since the shadow's
 * base instead of a commit each.
 *
 * Owns: the tfile fields shadow_fd, shadow_inplace and slog (f->slog under
 * f->lock: every write to the shadow holds it), and shadow_seq0 (the
 * slog's first record, under e->lock, for flush.c's engine_journal_held);
 * the statistics
 * files_written_through, write_through_records, write_through_record_bytes,
 * write_through_copy_bytes and write_through_applies.  Entry points are write.c's (the writes,
 * truncate, zero, fsync) and are called with f->lock and e->lock held
 * (e->lock dropped while bytes move or tfile_ops are called).  The
 * commit of a shadow is flush.c's (eng_commit_shadow, eng_shadow_done).
 * Calls backing.c (the shadow's content), flush_journal.c
 * (eng_settle_record, eng_asettle_file: a record of the backing file
 * settled before the shadow is made), dedup_flush.c (eng_dd_retire), place.c
 * (eng_discard_copy) and tfile_ops (version_open, journal_delta); nothing
 * of write.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "dedup_flush.h"
#include "filecopy.h"
#include "engine_int.h"

/*
 * Fsyncs of a file written through.  Committing its shadow (fdatasync of
 * the shadow, a rename, a sync of its directory) at every fsync costs the
 * backing log several commits, and the next write then copies the whole
 * file into a new shadow again where extents cannot be shared (ext4): the
 * sparse files of a GiB that fsstress writes and fsyncs again and again.
 * Instead, where the shadow was made from the backing file's content (its
 * base), an fsync whose changes since the base are small
 * (eng_journal_small) appends them to the journal as a delta record of
 * the backing file (tfile_ops.journal_delta, synced: one sequential
 * write) and returns; the shadow stays and takes the next writes.  The
 * next fsync's record holds what changed since the one before: a replay
 * applies the live records of a file in order, the base plus each one
 * giving the shadow as it was at that fsync.  The records stay live until
 * the shadow is committed, durably (eng_commit_shadow), and are retired
 * then (eng_shadow_committed): after the rename the path names another
 * inode, and a replay passes them over anyway.  A commit copied over a
 * hard-linked file in place retires them once its intent is durable
 * (fs_intent.c), before the intent itself can be retired; one of a file of
 * several names is applied in place instead where it can be
 * (eng_shadow_apply, below).  A shadow holds
 * SLOG_MAX records at most; an fsync commits it after that, or where its
 * changes are not small or not known (a write that failed, no memory).
 * f->slog is under f->lock (every write to the shadow holds it).
 */

/* e->lock held: f's new shadow, made from its backing file's content
 * where base: its changes are tracked from here; lazy: the shadow holds
 * none of that content (eng_shadow_owned). */
static void slog_start(struct engine *e, struct tfile *f, bool base, bool lazy)
{
	struct shadow_log *s = f->slog;

	if (!base || !e->cfg.journal_pct || !f->ops->journal_delta)
		return;
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s)
			return;
		f->slog = s;
	}
	dset_clear(&s->ranges);
	dset_clear(&s->all);
	s->base_len = s->clean_len = s->base0_len = s->all_clean_len = f->size;
	s->nseq = 0;
	f->shadow_seq0 = 0;
	s->valid = true;
	s->lazy = lazy;
}

/* Bytes [start, end) of f's shadow changed (written, zeroed); ok false: a
 * change that failed, whose bytes are not known. */
void eng_slog_note(struct tfile *f, uint64_t start, uint64_t end, bool ok)
{
	struct shadow_log *s = f->slog;

	/* a lazy shadow's all is the caller's, before the write (eng_shadow_own) */
	if (s && s->valid && (!ok || (end > start && (dset_add(&s->ranges, start, end) ||
						      (!s->lazy && dset_add(&s->all, start, end))))))
		s->valid = false;
}

/* f's shadow sized to size. */
void eng_slog_truncate(struct tfile *f, uint64_t size, bool ok)
{
	struct shadow_log *s = f->slog;

	if (s && s->valid && !ok)
		s->valid = false;
	if (s && s->valid && size < s->clean_len)
		s->clean_len = size;
	/* a lazy shadow's, whatever valid says: what it was cut to is its own */
	if (s && (s->valid || (s->lazy && ok)) && size < s->all_clean_len)
		s->all_clean_len = size;
}

/*
 * Lazy shadows.  A file of several names written through, where its
 * shadow is committed by an apply in place (eng_shadow_apply: the backing
 * file keeps its content until then), needs no copy of that content in
 * its shadow: the shadow starts as a sparse file of the file's size, holds
 * what is written from then on (slog->all, and everything from the least
 * size since, all_clean_len), and the rest is read from the backing file.
 * Records and the apply read only those ranges.  Whatever needs the whole
 * file in the shadow (a commit as a version, SEEK_DATA/SEEK_HOLE, a set of
 * ranges that would have to be merged, no memory) has the rest copied in
 * first (eng_shadow_fill), and the shadow is a plain one from then on.
 * Under f->lock, which every read and write of a shadow holds.
 */

/* Is [off, *next) of f's shadow its own (else the backing file's), *next
 * at most end?  A shadow that is not lazy owns all of it. */
bool eng_shadow_owned(const struct tfile *f, uint64_t off, uint64_t end, uint64_t *next)
{
	const struct shadow_log *s = f->slog;
	uint32_t lo = 0, hi;
	uint64_t lim;

	*next = end;
	if (!s || !s->lazy || off >= s->all_clean_len)
		return true;
	lim = s->all_clean_len < end ? s->all_clean_len : end;
	for (hi = s->all.n; lo < hi;) {		/* the first range ending past off */
		uint32_t mid = lo + (hi - lo) / 2;

		if (s->all.r[mid].end <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < s->all.n && s->all.r[lo].start <= off) {
		*next = s->all.r[lo].end < end ? s->all.r[lo].end : end;
		return true;
	}
	*next = lo < s->all.n && s->all.r[lo].start < lim ? s->all.r[lo].start : lim;
	return false;
}

/* e->lock and f->lock held (e->lock dropped meanwhile): the backing
 * file's bytes that f's lazy shadow does not own copied into it, but for
 * [xs, xe) (written, its own, though not said so); a plain shadow from
 * then on.  0 or -errno (still lazy). */
static int fill_but(struct engine *e, struct tfile *f, uint64_t xs, uint64_t xe)
{
	struct shadow_log *s = f->slog;
	uint64_t pos, next, lim, had = 0, copied = 0;
	struct stat st;
	int ret = 0;

	if (!s || !s->lazy)
		return 0;
	lim = s->all_clean_len;
	eng_unlock(e);
	if (fstat(f->shadow_fd, &st) == 0)
		had = (uint64_t)st.st_blocks;
	for (pos = 0; !ret && pos < lim; pos = next) {
		if (eng_shadow_owned(f, pos, lim, &next))
			continue;
		if (pos < xs)
			ret = backing_copy_range(s->base_fd, f->shadow_fd, pos,
						 next < xs ? next : xs);
		if (!ret && next > xe)
			ret = backing_copy_range(s->base_fd, f->shadow_fd, pos > xe ? pos : xe,
						 next);
	}
	if (!ret && fstat(f->shadow_fd, &st) == 0 && (uint64_t)st.st_blocks > had)
		copied = ((uint64_t)st.st_blocks - had) * 512;
	if (ret) {
		char nb[256];

		fname(f, nb, sizeof(nb));	/* not under e->lock: fs locks */
		tlog(LOG_ERR, "%s: cannot copy its content into its write-through version: %s",
		     nb, strerror(-ret));
	}
	eng_lock(e);
	if (ret)
		return ret;
	s->lazy = false;
	close(s->base_fd);
	s->base_fd = -1;
	e->write_through_copy_bytes += copied;
	return 0;
}

int eng_shadow_fill(struct engine *e, struct tfile *f)
{
	return fill_but(e, f, 0, 0);
}

/*
 * e->lock and f->lock held (e->lock dropped meanwhile).  Before a write
 * to f's shadow: a lazy one with no room for one more range of its own
 * is filled (a merge of two would own bytes it does not hold).  After:
 * [off, end), written, is its own (a failed write owns nothing: what it
 * was to replace is still read from the backing file); where that range
 * cannot be noted (no memory), the rest is copied in around it.  0 or
 * -errno.
 */
int eng_shadow_room(struct engine *e, struct tfile *f)
{
	struct shadow_log *s = f->slog;

	return s && s->lazy && s->all.n + 2 >= DSET_MAX ? eng_shadow_fill(e, f) : 0;
}

int eng_shadow_written(struct engine *e, struct tfile *f, uint64_t off, uint64_t end)
{
	struct shadow_log *s = f->slog;
	int ret;

	if (!s || !s->lazy || end <= off || off >= s->all_clean_len ||
	    !dset_add(&s->all, off, end))
		return 0;
	ret = fill_but(e, f, off, end);
	if (ret)
		s->valid = false;	/* its records would hold what reads do not */
	return ret;
}

/* f->lock held, e->lock not: len bytes of f's shadow at off into buf, or
 * into GPU memory dptr: a lazy shadow's own bytes from it, the others from
 * the backing file.  0 or -errno. */
int eng_shadow_read(struct tfile *f, void *buf, uint64_t dptr, uint64_t len, uint64_t off)
{
	uint64_t pos, next, end = off + len;
	int ret = 0;

	for (pos = off; !ret && pos < end; pos = next) {
		int fd = eng_shadow_owned(f, pos, end, &next) ? f->shadow_fd : f->slog->base_fd;

		ret = buf ? backing_pread(fd, (char *)buf + (pos - off), next - pos, pos) :
		      backing_move(&(struct bend){ .kind = BEND_DEV, .at = dptr + (pos - off) },
				   &(struct bend){ .kind = BEND_FD, .fd = fd, .at = pos },
				   next - pos, NULL);
	}
	return ret;
}

/* The ranges of a shadow's record: r[i] reads as zeros where zero[i]
 * (none of its bytes recorded); bytes: of the others. */
struct slog_plan {
	struct drange *r;
	bool *zero;
	uint32_t n, cap;
	uint64_t bytes;
};

/* [start, end) added to p (zero: a hole); false: no memory. */
static bool plan_add(struct slog_plan *p, uint64_t start, uint64_t end, bool zero)
{
	if (p->n == p->cap) {
		uint32_t cap = p->cap ? p->cap * 2 : 16;
		struct drange *r = realloc(p->r, (size_t)cap * sizeof(*r));
		bool *z = r ? realloc(p->zero, (size_t)cap * sizeof(*z)) : NULL;

		if (r)
			p->r = r;
		if (!z)
			return false;
		p->zero = z;
		p->cap = cap;
	}
	p->r[p->n] = (struct drange){ start, end };
	p->zero[p->n++] = zero;
	if (!zero)
		p->bytes += end - start;
	return true;
}

/* [start, end) of shadow fd added to p as its data runs and, where
 * holes, zeros (holes: true), or its data runs alone. */
static bool plan_runs(struct slog_plan *p, int fd, uint64_t start, uint64_t end, bool holes)
{
	loff_t pos, data, hole;

	for (pos = (loff_t)start; pos < (loff_t)end; pos = hole) {
		fc_next_run(fd, pos, (loff_t)end, &data, &hole);
		if (holes && data > pos && !plan_add(p, (uint64_t)pos, (uint64_t)data, true))
			return false;
		if (data < hole && !plan_add(p, (uint64_t)data, (uint64_t)hole, false))
			return false;
	}
	return true;
}

/*
 * Plan the change of f's shadow (fd, size bytes) since a base of base_len
 * bytes: the ranges d written below the least size since (clean_len), the
 * base's bytes from there to its size (or the file's) whole, each as the
 * shadow's data runs and holes there (zeros); past that the shadow's data
 * runs alone (its holes are holes of the file grown to size).  false where
 * there are too many bytes for a record, or no memory.  f->lock held.
 */
static bool plan_change(struct engine *e, struct tfile *f, int fd, uint64_t size,
			const struct dset *d, uint64_t base_len, uint64_t clean_len,
			struct slog_plan *p)
{
	uint64_t c = clean_len < size ? clean_len : size, tb = c;
	bool ok = true;

	for (uint32_t i = 0; ok && i < d->n && d->r[i].start < c; i++) {
		uint64_t end = d->r[i].end < c ? d->r[i].end : c;

		ok = plan_runs(p, fd, d->r[i].start, end, true);
	}
	if (ok && base_len > c) {
		tb = base_len < size ? base_len : size;
		ok = plan_runs(p, fd, c, tb, true);
	}
	if (ok)
		ok = plan_runs(p, fd, tb, size, false);
	return ok && eng_journal_small(e, f, p->bytes, size);
}

/* The record of f's shadow: its change since its base or its last record. */
static bool slog_plan(struct engine *e, struct tfile *f, int fd, uint64_t size,
		      struct slog_plan *p)
{
	struct shadow_log *s = f->slog;

	return plan_change(e, f, fd, size, &s->ranges, s->base_len, s->clean_len, p);
}

/*
 * e->lock and f->lock held (e->lock dropped meanwhile): f's shadow made
 * durable by a journal record of its changes since its base or its last
 * record (above).  0, or 1 where it cannot be (the caller commits it).
 */
int eng_shadow_record(struct engine *e, struct tfile *f)
{
	struct shadow_log *s = f->slog;
	uint64_t size = f->size, gen = f->gen, seq;
	struct slog_plan p = { 0 };
	void *map = NULL;
	struct stat st;
	int ret = 1;

	if (!s || !s->valid || s->nseq == SLOG_MAX)
		return 1;
	if (s->nseq && s->gen == gen)
		return 0;		/* its last record holds it */
	eng_unlock(e);
	/* the shadow as f->size says (a write cut short may have grown it) */
	if (fstat(f->shadow_fd, &st) < 0 || (uint64_t)st.st_size != size ||
	    !slog_plan(e, f, f->shadow_fd, size, &p))
		goto out;
	if (size) {
		map = mmap(NULL, size, PROT_READ, MAP_SHARED, f->shadow_fd, 0);
		if (map == MAP_FAILED) {
			map = NULL;
			goto out;
		}
	}
	ret = f->ops->journal_delta(f, map, p.r, p.zero, p.n, size, &seq, true);
	if (ret < 0)
		tlog(LOG_DEBUG, "a write-through file's journal record failed (%s): its "
		     "version is committed", strerror(-ret));
out:
	if (map)
		munmap(map, size);
	free(p.r);
	free(p.zero);
	eng_lock(e);
	if (ret)
		return 1;
	if (!s->nseq)
		f->shadow_seq0 = seq;
	s->seq[s->nseq++] = seq;
	s->gen = gen;
	dset_clear(&s->ranges);		/* the next record: from this one (all: kept) */
	s->base_len = s->clean_len = size;
	if (f->journaled_gen < gen)
		f->journaled_gen = gen;
	e->write_through_records++;
	e->write_through_record_bytes += p.bytes;
	return 0;
}

/* See engine_int.h: the records of the shadow's fsyncs (eng_shadow_record) retired once the shadow is committed, durably. */
void eng_shadow_committed(struct tfile *f, int ret)
{
	struct shadow_log *s = f->slog;

	if (!s || (ret && ret != -ENOENT))
		return;			/* live: a replay needs them */
	for (uint32_t i = 0; i < s->nseq; i++)
		f->ops->journal_retire(f, s->seq[i]);
	s->nseq = 0;
	s->valid = false;
	if (s->lazy)
		close(s->base_fd);
	s->lazy = false;
}

/*
 * A shadow of a file with several names (f->linked) committed by an apply
 * in place.  Such a file's new version is copied over it under a commit
 * intent (fs_intent.c): its data written twice, the shadow's copy and then
 * the copy in place, for what may be a few blocks of a sparse file of a
 * GiB, where the backing file system shares no extents (ext4; on XFS both
 * copies share them, and the apply wrote 5% more: RESULTS 18x).  Where the
 * shadow's change since the backing file's content (the
 * base it was made from: slog->all) is known and small (eng_journal_small,
 * whose share is doubled for such a file), its last changes become a
 * record (eng_shadow_record), so that its records together give the
 * shadow; then the change is written from the shadow into the backing file
 * and synced (journal_apply), the records are retired and the shadow is
 * dropped.  A crash during the apply leaves the records, which a replay
 * applies in order over what the file holds.  e->lock and f->lock held
 * (e->lock dropped meanwhile).  0: committed; 1: not (a failed apply is
 * logged): the caller commits the shadow as a version, which also writes
 * whatever an apply cut short left.
 */
int eng_shadow_apply(struct engine *e, struct tfile *f)
{
	struct shadow_log *s = f->slog;
	struct slog_plan p = { 0 };
	uint64_t size = f->size, gen = f->gen;
	void *map = NULL;
	struct stat st;
	char nb[256];
	int ret = 1;
	bool ok;

	if (!s || !s->valid || f->shadow_inplace || f->unlinked || !f->ops->journal_apply ||
	    e->cfg.shares_extents || !__atomic_load_n(&f->linked, __ATOMIC_RELAXED))
		return 1;	/* where extents are shared, that copy shares them */
	eng_unlock(e);		/* f->lock held: no write moves the shadow */
	ok = fstat(f->shadow_fd, &st) == 0 && (uint64_t)st.st_size == size &&
	     plan_change(e, f, f->shadow_fd, size, &s->all, s->base0_len, s->all_clean_len, &p);
	eng_lock(e);
	if (!ok || eng_shadow_record(e, f))
		goto out;
	eng_unlock(e);
	if (size) {
		map = mmap(NULL, size, PROT_READ, MAP_SHARED, f->shadow_fd, 0);
		if (map == MAP_FAILED)
			map = NULL;
	}
	ret = size && !map ? -errno :
	      f->ops->journal_apply(f, map, p.r, p.zero, p.n, size, NULL);
	if (map)
		munmap(map, size);
	if (ret) {
		fname(f, nb, sizeof(nb));
		tlog(LOG_NOTICE, "%s: a write-through change could not be applied in place (%s); "
		     "its new version is copied over the file instead", nb, strerror(-ret));
		ret = 1;
	}
	eng_lock(e);
	if (ret)
		goto out;
	eng_shadow_committed(f, 0);	/* the file holds them now */
	close(f->shadow_fd);
	f->shadow_fd = -1;
	f->shadow_seq0 = 0;
	f->flushed_gen = gen;
	f->flush_err = 0;
	f->dirty = false;
	e->write_through_applies++;
out:
	free(p.r);
	free(p.zero);
	return ret;
}

const uint64_t *tfile_shadow_records(struct tfile *f, uint32_t *n)
{
	*n = f->slog ? f->slog->nseq : 0;
	return f->slog ? f->slog->seq : NULL;
}

/* e->lock not held: a descriptor of f's backing file of a lazy shadow's
 * own, from which it reads the rest (readable when the file's names go,
 * where the fs side's could not be reopened); -1: none. */
static int base_dup(struct tfile *f)
{
	int dfd = f->ops->data_fd(f, false), fd;

	if (dfd < 0)
		return -1;
	fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
	f->ops->release_data_fd(f, dfd);
	return fd;
}

/*
 * Switch f to write-through: a new version holding the current content
 * becomes the target of all writes.  e->lock held on entry and exit
 * (dropped meanwhile); f->lock held.  Returns 0 or -errno.
 */
int eng_shadow_start(struct engine *e, struct tfile *f)
{
	struct copy *cp;
	bool direct, inplace, was_dirty = f->dirty, base, lazy;
	int base_fd = -1;
	struct lease l;
	struct stat st;
	char nb[256];
	uint64_t pending, copied = 0;
	int ci, fd, ret = 0;

	/* f's newest copy, once no flush copies it out: looked up again after
	 * each wait (a flushed copy may be evicted before this thread runs) */
	for (;;) {
		ci = fastest_copy(e, f);
		cp = ci >= 0 ? f->copy[ci] : NULL;
		if (!cp || !cp->flushing)
			break;
		pthread_cond_wait(&e->settled, &e->lock);
	}
	/* a journal record not applied yet, or applied and not synced:
	 * settled before anything of the shadow is written
	 * (eng_settle_record, eng_asettle_file); claimed here, so that no
	 * flush that starts meanwhile settles it too */
	pending = f->jseq;
	f->jseq = 0;
	/* its fsyncs may be journal records where it is made from the
	 * backing file's content (a file not dirty: no copy newer); and then,
	 * where it will be applied in place, none of that content need be
	 * copied into it (lazy, above) */
	base = !was_dirty && !f->dd.taint;
	lazy = base && e->cfg.journal_pct && f->ops->journal_delta &&
	       f->ops->journal_apply && !e->cfg.shares_extents &&
	       __atomic_load_n(&f->linked, __ATOMIC_RELAXED) &&
	       (f->slog || (f->slog = calloc(1, sizeof(*f->slog))));
	lease_begin(e, &l, cp, NULL);
	base_fd = lazy ? base_dup(f) : -1;
	lazy = base_fd >= 0;
	eng_delay_at(NULL, "shadow_copy");
	fd = pending ? eng_settle_record(e, f, pending) : eng_asettle_file(e, f);
	if (!fd) {
		pending = 0;	/* in the backing file, retired */
		fd = f->ops->version_open(f, false, &direct, &inplace);
	}
	if (fd < 0) {
		ret = fd;
	} else if (lazy && !inplace) {
		;	/* the backing file holds it (not dirty: a copy is the same) */
	} else if (cp && cp->cache->host_addressable) {
		/* a new version's holes need no writing; the file itself's do */
		ret = inplace ? backing_pwrite(fd, copy_ptr(cp), cp->len, 0) :
			backing_pwrite_sparse(fd, copy_ptr(cp), cp->len);
	} else if (cp) {
		ret = backing_move(&(struct bend){ .kind = BEND_FD, .fd = fd, .sparse = !inplace },
				   &(struct bend){ .kind = BEND_CACHE, .cache = cp->cache,
						   .at = cp->frag->off },
				   cp->len, NULL);
	} else if (!inplace) {
		ret = backing_copy_file(f, fd, f->size);
	}
	if (!ret && ftruncate(fd, (off_t)f->size) < 0)
		ret = -errno;
	if (!ret && fstat(fd, &st) == 0)	/* what the copy took on the disk */
		copied = (uint64_t)st.st_blocks * 512;
	fname(f, nb, sizeof(nb));
	lease_end(e, &l);
	e->write_through_copy_bytes += copied;
	if (ret) {
		if (pending && !f->jseq)
			f->jseq = pending;	/* not settled: still to be */
		if (fd >= 0)
			close(fd);
		if (base_fd >= 0)
			close(base_fd);
		tlog(LOG_ERR, "%s: cannot write through to the SSD: %s", nb, strerror(-ret));
		return ret;
	}
	for (int i = 0; i < e->ntiers; i++)
		if (f->copy[i])
			eng_discard_copy(e, f, i);
	f->dd.valid = false;	/* the shadow is written whole */
	eng_dd_retire(e, f);	/* and may be the backing file itself */
	f->shadow_fd = fd;
	f->shadow_inplace = inplace;
	slog_start(e, f, base && !inplace, lazy && !inplace);
	if (f->slog && f->slog->lazy)
		f->slog->base_fd = base_fd;
	else if (base_fd >= 0)
		close(base_fd);
	f->dirty = true;
	e->files_written_through++;
	tlog(LOG_INFO, "%s: written through to the SSD (%" PRIu64 " bytes so far)",
	     nb, f->size);
	return 0;
}


/* Zero [off, end) of the write-through version fd: a hole punched, or
 * zeros written where the file system punches none.  0 / -errno. */
int eng_shadow_zero(int fd, uint64_t off, uint64_t end)
{
	static const uint8_t zeros[1 << 16];
	int ret = 0;

	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
		      (off_t)(end - off)) == 0)
		return 0;
	if (errno != EOPNOTSUPP)
		return -errno;
	while (off < end && !ret) {
		size_t n = end - off < sizeof(zeros) ? (size_t)(end - off) : sizeof(zeros);

		ret = backing_pwrite(fd, zeros, n, (off_t)off);
		off += n;
	}
	return ret;
}
