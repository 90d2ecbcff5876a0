/*
 * write.c - the write path: a writable copy in the fastest tier that takes
 * the file, truncate, the writers' close and fsync.
 *
 * Write path: a write lands in the file's copy, created (and filled with
 * the file's current content) on first write; the copy grows by
 * reallocation.  When no room can be made, the file goes write-through
 * (shadow.c): a new version of the backing file (the "shadow") receives
 * the content and the writes, and is committed on fsync (unless the fsync
 * is a journal record: eng_shadow_record), or -o flush_age after the last
 * close (eng_shadow_done; at once in place, or at the unmount).  Either
 * way a backing file is only ever replaced by a complete new version.  The
 * last writer's close (or an fsync) completes the copy and queues it for
 * flush.c.
 *
 * Owns: the tfile fields writers, write_err, gen, size and mtime while
 * dirty.  Entry points take f->lock, then e->lock; flush.c's
 * eng_commit_shadow() calls ops->version_commit with f->lock held and
 * e->lock dropped (the fs side takes fs.nslock and fs.lock there).
 * Calls place.c, shadow.c (write-through), flush.c (eng_complete_copy),
 * dedup_flush.c (eng_dd_retire), backing.c and the journal through
 * tfile_ops (journal_retire).
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
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "dedup_flush.h"
#include "filecopy.h"
#include "engine_int.h"
#include "gpu_tier.h"
#include "gpu.h"

static void touch_mtime(struct tfile *f)
{
	clock_gettime(CLOCK_REALTIME, &f->mtime);
}

/*
 * Holes stay out of the caches.  A cached copy is one contiguous fragment
 * from the file's offset 0, so a write far past the end of a file, or one
 * that loads a sparse file into a cache to change it, would fill the
 * caches with the holes' zeros (and copy them on every growth).  Such a
 * file is written through instead: a new version of its backing file,
 * holes kept (backing_copy_file), takes the write, and holes stay holes
 * there.  Sparse means: the write leaves a hole of SPARSE_HOLE bytes or
 * more past the end of the file, unless the file's copy already has room
 * for it (a vectored write's placement made it); or the file has no copy
 * and its backing file lacks SPARSE_HOLE bytes or more of blocks (a file
 * sized by ftruncate and written in the cache is no such file while its
 * copy lives: a size given before writing reserves its room).
 * e->lock and f->lock held; e->lock is dropped to look at the backing
 * file.  hole_at: where the write starts (the hole is before it).
 */
/*
 * Holes shorter than this are taken as zeros: they cost the cache little
 * (a flush leaves them holes anyway), and writes come out of order (the
 * kernel's writeback with -o writeback sends a later page range first;
 * threads share a file): a smaller hole would send such a file through to
 * the SSD, where a full disk fails the writes that a cache would hold.
 */
#define SPARSE_HOLE	(32u << 20)

bool eng_goes_sparse(struct engine *e, struct tfile *f, uint64_t hole_at, uint64_t end)
{
	int t = fastest_copy(e, f);
	bool far = hole_at > f->size && hole_at - f->size >= SPARSE_HOLE, sparse = false;
	struct stat st;
	int fd;

	if (t >= 0)
		return far && copy_cap(f->copy[t]) < end;
	if (far)
		return true;
	if (f->size < SPARSE_HOLE)
		return false;
	eng_unlock(e);
	fd = f->ops->data_fd(f, false);
	if (fd >= 0) {
		sparse = fstat(fd, &st) == 0 &&
			(uint64_t)st.st_blocks * 512 + SPARSE_HOLE <= (uint64_t)st.st_size;
		f->ops->release_data_fd(f, fd);
	}
	eng_lock(e);
	return sparse && fastest_copy(e, f) < 0;	/* no copy came meanwhile */
}

/* Zero bytes [from, to) of cp. */
void eng_copy_zero(struct copy *cp, uint64_t from, uint64_t to)
{
	static const uint8_t zeros[1 << 16];
	struct cache *c = cp->cache;

	if (to <= from || eng_copy_bounds(cp, from, to - from))
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
	struct lease l;			/* on them (and the copy being filled) */
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

/* e->lock held, copies_busy(e, f): what to wait for, the end of a transfer
 * (a flush, cascade or fill) while one runs, else the end of a span or a
 * zero-copy reply.  One at a time: each ends with its own broadcast. */
static pthread_cond_t *copies_busy_cond(struct engine *e, struct tfile *f)
{
	for (int i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (cp && (cp->flushing || cp->state == TS_READ_IN_PROGRESS))
			return &e->settled;
	}
	return &e->unpinned;
}

/* e->lock held: remember f's copies and lease them for a wait. */
static void snap_pin(struct engine *e, struct tfile *f, struct copies_snap *s)
{
	s->l.n = 0;
	for (int i = 0; i < TIER_MAX; i++) {
		s->cp[i] = i < e->ntiers ? f->copy[i] : NULL;
		lease_take(&s->l, s->cp[i]);
	}
}

/* e->lock held, after the wait: unpin; true if f's copies are as they were
 * and quiet, so that what was decided before the wait still holds. */
static bool snap_unpin_holds(struct engine *e, struct tfile *f, struct copies_snap *s)
{
	bool same = true;

	lease_release(e, &s->l);
	for (int i = 0; i < TIER_MAX; i++)
		if (i < e->ntiers && f->copy[i] != s->cp[i])
			same = false;
	return same && !copies_busy(e, f);
}

/* e->lock held: cp is about to be written (no flush may start on it). */
static void make_writable(struct engine *e, struct copy *cp)
{
	cp->file->dd.wepoch++;	/* chunk hashes of the old bytes are stale */
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
			pthread_cond_wait(&e->unpinned, &e->lock);
			return true;
		}
		eng_discard_copy(e, f, i);
	}
	return false;
}

/* Files at least this long are filled by their data runs (two lseeks a
 * run): below it one read costs less. */
#define FILL_SPARSE_MIN	(1u << 20)

/*
 * Fill the new copy ncp (not attached, pinned) with the first n bytes of
 * f's content: from src (a copy in the same or a faster tier) or, without
 * one, from the backing file (zeros past its end).  e->lock not held.
 * Returns 0 or -errno.
 */
static int fill_copy(struct tfile *f, struct copy *ncp, struct copy *src, uint64_t n)
{
	struct cache *c = ncp->cache;
	int fd, ret = 0;

	if (!n)
		return 0;
	if ((ret = eng_copy_bounds(ncp, 0, n)) || (src && (ret = eng_copy_bounds(src, 0, n))))
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
	/* zeros past its end; a large file's holes not read (a memset) */
	ret = n >= FILL_SPARSE_MIN ? backing_pread_sparse(fd, copy_ptr(ncp), n) :
				     backing_pread(fd, copy_ptr(ncp), n, 0);
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
		eng_room(e);
	} else {
		eng_attach_copy(e, f, t, ncp);
	}
	for (int i = 0; i < e->ntiers; i++)
		if (i != t && f->copy[i])
			eng_discard_copy(e, f, i);
}

/* What one step of eng_writable_copy() tells the next (or -errno). */
enum wc_step {
	WC_OK = 0,
	WC_AGAIN,		/* f changed while the lock was dropped: plan anew */
	WC_NOROOM,		/* the tier has no room, even by eviction */
};

/* Step 1: the tier the writable copy goes to, from f's copies now; *src
 * is the newest content (NULL: the backing file). */
static int wc_target(struct engine *e, struct tfile *f, uint64_t cap, uint64_t keep,
		     bool host_only, struct copy **src)
{
	int hi = host_index(e), t = fastest_copy(e, f);

	*src = t >= 0 ? f->copy[t] : NULL;
	if (t < 0)	/* new content to the GPU; old content is loaded to the host */
		t = (e->gpu && keep == 0 && cap <= gpu_limit(e)) ? 0 : hi;
	if (t < hi && (host_only || cap > gpu_limit(e)))
		t = hi;
	return t;
}

/*
 * Step 2: a new, unattached copy in tier t with room for at least cap
 * bytes (twice the old copy when growing it: appends copy O(n) bytes),
 * f's copies leased while eviction waits.  Returns it, or NULL with *st
 * WC_AGAIN, WC_NOROOM or -ENOMEM.
 */
static struct copy *wc_place(struct engine *e, struct tfile *f, int t,
			     struct copy *src, uint64_t cap, int *st)
{
	struct cache *c = e->tiers[t];
	struct copy *cp = f->copy[t], *ncp;
	struct copies_snap s;
	uint64_t want = cap;
	int ret;

	ncp = calloc(1, sizeof(*ncp));
	if (!ncp) {
		*st = -ENOMEM;
		return NULL;
	}
	ncp->file = f;
	if (cp && cp == src && want < 2 * copy_cap(cp))
		want = 2 * copy_cap(cp);
	if (want > c->size || (t < host_index(e) && want > gpu_limit(e)))
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
		*st = WC_AGAIN;
		return NULL;
	}
	if (ret) {
		free(ncp);
		*st = WC_NOROOM;
		return NULL;
	}
	tier_set_state(&ncp->state, TS_WRITE_IN_PROGRESS);
	return ncp;
}

/*
 * Step 3: fill ncp with the first n bytes of f's content, e->lock dropped
 * and f's copies leased.  Returns WC_OK, or WC_AGAIN or -errno with ncp
 * released and freed.
 */
static int wc_fill(struct engine *e, struct tfile *f, struct copy *ncp,
		   struct copy *src, uint64_t n)
{
	struct copies_snap s;
	bool holds;
	int ret;

	snap_pin(e, f, &s);
	lease_take(&s.l, ncp);
	eng_unlock(e);		/* under the lease of f's copies and ncp */
	ret = fill_copy(f, ncp, src, n);
	eng_lock(e);
	holds = snap_unpin_holds(e, f, &s);
	if (holds && !ret)
		return WC_OK;
	tier_set_state(&ncp->state, TS_INIT);
	cache_release(ncp->cache, ncp);
	free(ncp);
	return holds ? ret : WC_AGAIN;	/* WC_AGAIN: f changed while the bytes moved */
}

/*
 * Make sure f has a writable copy of at least `cap` bytes holding the
 * first `keep` bytes of its content (keep <= cap: the rest is the
 * caller's), in state WRITE_IN_PROGRESS, in the fastest tier that can take
 * it; copies in other tiers are dropped (they are stale once the file is
 * written).  e->lock and f->lock held; e->lock is dropped while it waits.
 * Each step that drops the lock may find f changed (WC_AGAIN): the plan
 * starts over.  Returns the copy, or NULL with *err = 0 when the file must
 * go write-through, or *err < 0 on a real error.
 */
struct copy *eng_writable_copy(struct engine *e, struct tfile *f,
			       uint64_t cap, uint64_t keep, int *err)
{
	bool host_only = false;	/* the GPU tier had no room */

	*err = 0;
	cap = cap ? cap : 1;
	if (keep > cap)
		keep = cap;
	for (;;) {
		struct copy *cp, *src, *ncp;
		uint64_t n;
		int t, st;

		if (copies_busy(e, f)) {
			pthread_cond_wait(copies_busy_cond(e, f), &e->lock);
			continue;
		}
		t = wc_target(e, f, cap, keep, host_only, &src);
		if (drop_slower(e, f, t))
			continue;
		cp = f->copy[t];
		if (cp && cp == src && (copy_cap(cp) >= cap ||
					eng_grow_inplace(e, cp, tier_round(cap)) == 0)) {
			make_writable(e, cp);
			return cp;
		}
		ncp = wc_place(e, f, t, src, cap, &st);
		if (!ncp && st == WC_NOROOM && t < host_index(e)) {
			host_only = true;
			continue;
		}
		if (!ncp && st == WC_AGAIN)
			continue;
		if (!ncp) {
			*err = st == WC_NOROOM ? 0 : st;	/* 0: write-through */
			return NULL;
		}
		n = src ? (src->len < keep ? src->len : keep) : keep;
		st = wc_fill(e, f, ncp, src, n);
		if (st == WC_AGAIN)
			continue;
		if (st) {
			*err = st;
			return NULL;
		}
		ncp->len = n;
		install_copy(e, f, t, ncp);
		return ncp;
	}
}

/* Does the engine keep f->dd's changed ranges (for dedup or the journal)? */
static bool tracks_changes(const struct engine *e)
{
	return e->cfg.dedup || e->cfg.journal_pct;
}

void eng_note_change(struct engine *e, struct tfile *f, uint64_t start, uint64_t end)
{
	uint64_t blk = e->cfg.dedup_block ? e->cfg.dedup_block : TIER_ALIGN;

	if (!tracks_changes(e))
		return;
	if (!f->dirty && !f->dd.noted && f->shadow_fd < 0 && !f->dd.taint) {
		/* not dirty, nothing noted since: every copy holds what the
		 * backing file holds */
		dset_clear(&f->dd.ranges);
		f->dd.base_len = f->dd.clean_len = f->size;
		f->dd.valid = true;
	}
	if (!f->dirty)
		f->dd.noted = true;	/* until eng_mark_modified() */
	if (!f->dd.valid || end <= start)
		return;
	start -= start % blk;
	if (start >= f->dd.clean_len)
		return;		/* past the base's bytes: always written */
	end = end + blk - 1 < end ? UINT64_MAX : (end + blk - 1) / blk * blk;
	if (dset_add(&f->dd.ranges, start, end))
		f->dd.valid = false;	/* no memory: the next flush writes all */
}

void eng_note_truncate(struct engine *e, struct tfile *f, struct copy *cp, uint64_t size)
{
	uint64_t have = cp && cp->len < f->size ? cp->len : f->size;

	eng_note_change(e, f, size, size);	/* only starts from the base */
	if (!tracks_changes(e) || !f->dd.valid)
		return;
	if (size > have)	/* zeros: different from what the base had there */
		eng_note_change(e, f, have, size);
	if (size < f->dd.clean_len)
		f->dd.clean_len = size;
}

void eng_mark_modified(struct tfile *f)
{
	f->dirty = true;
	f->dd.noted = false;	/* dirty says it now (eng_note_change) */
	f->gen++;
	touch_mtime(f);
}

/* Move len bytes into cp at off from host memory buf or device address dptr
 * (memory of GPU dev, -1: not known; a device copy is issued there). */
static int copy_in(struct copy *cp, uint64_t off, const void *buf, uint64_t dptr,
		   int dev, size_t len)
{
	struct cache *c = cp->cache;
	int ret = eng_copy_bounds(cp, off, len);

	if (ret)
		return ret;
	if (buf)
		return c->ops->write(c, cp->frag->off + off, buf, len);
	if (c->host_addressable)
		return gpu_copy_dtoh(copy_ptr(cp) + off, dptr, len);
	return gpu_tier_copy_dev(cp->file->eng->gpu, dev, cp->frag->off + off, dptr, len, true);
}

/*
 * e->lock held, after bytes were copied into f's writable copy cp up to
 * file offset end: on success (err 0) the copy and the file grow to end
 * and the file is modified; after a failed copy some bytes may have
 * changed, so the dedup base is no longer trusted (sizes stay).
 */
static void copy_written(struct engine *e, struct tfile *f, struct copy *cp,
			 uint64_t end, int err)
{
	if (err) {
		f->dd.valid = false;
		f->dd.taint = true;
		return;
	}
	if (end > cp->len)
		cp->len = end;
	if (end > f->size)
		f->size = end;
	cp->last_use = ++e->tick;
	eng_mark_modified(f);
}

/* One write, f->lock held (taken and dropped by the caller). */
static ssize_t do_write_locked(struct tfile *f, const void *buf, uint64_t dptr,
			       int dev, size_t len, off_t off)
{
	struct engine *e = f->eng;
	uint64_t end = (uint64_t)off + len;
	struct copy *cp;
	struct lease l;
	ssize_t ret;
	int err;

	if (off < 0 || end < (uint64_t)off)
		return -EINVAL;
	eng_lock(e);
	if (!buf && dev >= 0)
		f->gpu_wdev = dev;	/* its GPU copy goes to that GPU's part */
	if (f->shadow_fd < 0 && eng_goes_sparse(e, f, (uint64_t)off, end) &&
	    (ret = eng_shadow_start(e, f)))
		goto out;
	if (f->shadow_fd < 0) {
		uint64_t cap = end > f->size ? end : f->size;

		bool trace = !buf && tierfs_log_level >= LOG_DEBUG;
		double t0 = trace ? tier_now() : 0, t1 = 0, t2 = 0;

		cp = eng_writable_copy(e, f, cap, f->size, &err);
		if (!cp && err) {
			ret = err;
			goto out;
		}
		if (cp) {
			eng_note_change(e, f, cp->len < (uint64_t)off ? cp->len : (uint64_t)off,
					end);
			lease_begin(e, &l, cp, NULL);
			if (trace)
				t1 = tier_now();
			eng_copy_zero(cp, cp->len, (uint64_t)off);
			ret = copy_in(cp, (uint64_t)off, buf, dptr, dev, len);
			if (trace) {
				t2 = tier_now();
				tlog(LOG_DEBUG, "device write of %zu B into the %s cache: "
				     "place %.0f us, copy %.0f us", len, cp->cache->name,
				     (t1 - t0) * 1e6, (t2 - t1) * 1e6);
			}
			lease_end(e, &l);
			copy_written(e, f, cp, end, (int)ret);
			if (ret)
				goto out;
			ret = (ssize_t)len;
			goto out;
		}
		ret = eng_shadow_start(e, f);
		if (ret)
			goto out;
	}
	/* write-through */
	ret = eng_shadow_room(e, f);
	if (ret)
		goto out;
	eng_unlock(e);
	if (buf) {
		ret = pwrite(f->shadow_fd, buf, len, off);
		if (ret < 0)
			ret = -errno;
	} else {
		ret = backing_move(&(struct bend){ .kind = BEND_FD, .fd = f->shadow_fd,
						   .at = (uint64_t)off },
				   &(struct bend){ .kind = BEND_DEV, .at = dptr }, len, NULL);
		ret = ret ? ret : (ssize_t)len;
	}
	eng_lock(e);
	eng_slog_note(f, (uint64_t)off, (uint64_t)off + (ret > 0 ? (uint64_t)ret : 0), ret >= 0);
	if (ret > 0 && (err = eng_shadow_written(e, f, (uint64_t)off, (uint64_t)off + ret)))
		ret = err;		/* its bytes are not known to be the file's */
	if (ret < 0)
		f->write_err = (int)ret;	/* for fsync, as write-back would */
	if (ret > 0) {
		uint64_t wend = (uint64_t)off + (uint64_t)ret;
		if (wend > f->size)
			f->size = wend;
		e->bytes_written_through += (uint64_t)ret;
		eng_mark_modified(f);
	}
out:
	eng_unlock(e);
	return ret;
}

static ssize_t do_write(struct tfile *f, const void *buf, uint64_t dptr, int dev,
			size_t len, off_t off)
{
	ssize_t ret;

	tfile_lock(f);
	ret = do_write_locked(f, buf, dptr, dev, len, off);
	tfile_unlock(f);
	return ret;
}

ssize_t tfile_write(struct tfile *f, const void *buf, size_t len, off_t off)
{
	return do_write(f, buf, 0, -1, len, off);
}

ssize_t tfile_write_dev(struct tfile *f, uint64_t dptr, int dev, size_t len, off_t off)
{
	if (!f->eng->gpu)
		return -ENODEV;
	return do_write(f, NULL, dptr, dev, len, off);
}

/*
 * The vectored write holds f->lock across all its segments: an fsync, a
 * truncate or another writer's close (which complete the copy and queue its
 * flush, or commit a write-through version) waits for the whole list, so
 * no version holding part of it is ever committed.  The copy is made room
 * for the list's end first (one placement, not one growth per segment);
 * the segments then go in the caller's order (the fs side sorts them by
 * file offset: each zero-fills at most the gap before it).
 */
/*
 * The segments of a vectored write, all into f's writable copy cp (e->lock
 * held on entry and on return, dropped for the copies): the holes between
 * them past the copy's end are zeroed, then every segment is queued on its
 * device and waited for once (gpu_tier_copy_devv), not one wait per
 * segment.  seg[] is sorted by file offset (the ioctl's checks sort it).
 */
static ssize_t writev_into(struct engine *e, struct tfile *f, struct copy *cp,
			   const struct tdev_seg *seg, int n, uint64_t end)
{
	struct tier_dxfer *x = malloc((size_t)n * sizeof(*x));
	bool host = cp->cache->host_addressable;
	uint64_t at = cp->len, total = 0;
	struct lease l;
	int i, ret;

	if (!x)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		eng_note_change(e, f, cp->len < seg[i].off ? cp->len : seg[i].off,
				seg[i].off + seg[i].len);
		x[i] = (struct tier_dxfer){
			.dev = seg[i].dev,
			.off = host ? (uint64_t)(uintptr_t)(copy_ptr(cp) + seg[i].off)
				    : cp->frag->off + seg[i].off,
			.dptr = seg[i].dptr,
			.len = seg[i].len,
		};
		total += seg[i].len;
	}
	ret = eng_copy_bounds(cp, 0, end);
	if (ret)
		goto out;
	lease_begin(e, &l, cp, NULL);
	for (i = 0; i < n; i++) {	/* holes before segments past the end */
		eng_copy_zero(cp, at, seg[i].off);
		if (seg[i].off + seg[i].len > at)
			at = seg[i].off + seg[i].len;
	}
	ret = gpu_tier_copy_devv(e->gpu, x, n, true, host);
	lease_end(e, &l);
	copy_written(e, f, cp, end, ret);
out:
	free(x);
	return ret ? ret : (ssize_t)total;
}

ssize_t tfile_writev_dev(struct tfile *f, const struct tdev_seg *seg, int n)
{
	struct engine *e = f->eng;
	struct copy *cp = NULL;
	uint64_t end = 0, lo = UINT64_MAX;
	ssize_t ret = 0, r;
	int i, err = 0;

	if (!e->gpu)
		return -ENODEV;
	for (i = 0; i < n; i++) {
		if (seg[i].off > (uint64_t)INT64_MAX ||
		    seg[i].len > (uint64_t)INT64_MAX - seg[i].off)
			return -EINVAL;
		if (seg[i].off + seg[i].len > end)
			end = seg[i].off + seg[i].len;
		if (i && seg[i].off < seg[i - 1].off)
			return -EINVAL;	/* the callers sort */
		if (seg[i].off < lo)
			lo = seg[i].off;
	}
	tfile_lock(f);
	eng_lock(e);
	if (n > 0 && seg[0].dev >= 0)
		f->gpu_wdev = seg[0].dev;	/* its GPU copy goes to that GPU's part */
	/* no room is made for a list that leaves a hole (eng_goes_sparse): its
	 * segments go one at a time, written through */
	if (f->shadow_fd < 0 && !eng_goes_sparse(e, f, lo, end))
		cp = eng_writable_copy(e, f, end > f->size ? end : f->size, f->size, &err);
	if (cp) {
		ret = writev_into(e, f, cp, seg, n, end);
		eng_unlock(e);
		tfile_unlock(f);
		return ret;
	}
	eng_unlock(e);
	/* written through (or no room): one segment at a time */
	for (i = 0; !err && i < n; i++) {
		r = do_write_locked(f, NULL, seg[i].dptr, seg[i].dev,
				    (size_t)seg[i].len, (off_t)seg[i].off);
		if (r < 0)
			err = (int)r;
		else
			ret += r;
	}
	tfile_unlock(f);
	return err ? err : ret;
}

int tfile_truncate(struct tfile *f, uint64_t size)
{
	struct engine *e = f->eng;
	struct copy *cp;
	int ret = 0, err;

	tfile_lock(f);
	eng_lock(e);
	if (size == f->size && !f->dirty && !f->copy[host_index(e)])
		goto out;
	/* a sparse file is not loaded into a cache for it (the room a size
	 * given before writing reserves is no hole: hole_at 0) */
	if (f->shadow_fd < 0 && eng_goes_sparse(e, f, 0, size) && (ret = eng_shadow_start(e, f)))
		goto out;
	if (f->shadow_fd < 0) {
		/* keep at most `size` bytes of the old content */
		cp = eng_writable_copy(e, f, size ? size : 1, size < f->size ? size : f->size, &err);
		if (!cp && err) {
			ret = err;
			goto out;
		}
		if (cp) {
			eng_note_truncate(e, f, cp, size);
			eng_copy_zero(cp, cp->len, size);
			cp->len = size;
			f->size = size;
			eng_mark_modified(f);
			if (!f->writers)
				eng_complete_copy(e, f, false);
			goto out;
		}
		ret = eng_shadow_start(e, f);
		if (ret)
			goto out;
	}
	eng_unlock(e);
	if (ftruncate(f->shadow_fd, (off_t)size) < 0)
		ret = -errno;
	eng_lock(e);
	eng_slog_truncate(f, size, !ret);
	if (!ret) {
		f->size = size;
		eng_mark_modified(f);
		if (!f->writers)
			ret = eng_shadow_done(e, f);
	}
out:
	eng_unlock(e);
	tfile_unlock(f);
	return ret;
}

int tfile_zero(struct tfile *f, uint64_t off, uint64_t len)
{
	struct engine *e = f->eng;
	uint64_t end = off + len < off ? UINT64_MAX : off + len;
	struct copy *cp;
	struct lease l;
	int ret = 0, err;

	tfile_lock(f);
	eng_lock(e);
	if (end > f->size)
		end = f->size;
	if (off >= end)
		goto out;
	if (f->shadow_fd < 0 && eng_goes_sparse(e, f, 0, f->size) && (ret = eng_shadow_start(e, f)))
		goto out;
	if (f->shadow_fd < 0) {
		cp = eng_writable_copy(e, f, f->size, f->size, &err);
		if (!cp && err) {
			ret = err;
			goto out;
		}
		if (cp) {
			eng_note_change(e, f, off, end);
			if (end > cp->len)
				end = cp->len;	/* past it: zeros already */
			lease_begin(e, &l, cp, NULL);
			eng_copy_zero(cp, off, end);
			lease_end(e, &l);
			cp->last_use = ++e->tick;
			eng_mark_modified(f);
			if (!f->writers)
				eng_complete_copy(e, f, false);
			goto out;
		}
		ret = eng_shadow_start(e, f);
		if (ret)
			goto out;
	}
	ret = eng_shadow_room(e, f);
	if (ret)
		goto out;
	eng_unlock(e);
	ret = eng_shadow_zero(f->shadow_fd, off, end);
	eng_lock(e);
	eng_slog_note(f, off, end, !ret);
	if (!ret)
		ret = eng_shadow_written(e, f, off, end);
	if (ret) {
		f->write_err = ret;	/* for fsync, as a failed write */
		goto out;
	}
	eng_mark_modified(f);
	if (!f->writers)
		ret = eng_shadow_done(e, f);
out:
	eng_unlock(e);
	tfile_unlock(f);
	return ret;
}

off_t tfile_seek(struct tfile *f, off_t off, int whence)
{
	struct engine *e = f->eng;
	struct copy *cp;
	struct lease l;
	uint64_t size;
	off_t ret;
	int t, fd;

	if (whence != SEEK_DATA && whence != SEEK_HOLE)
		return -EINVAL;
	tfile_lock(f);
	eng_lock(e);
	size = f->size;
	t = fastest_copy(e, f);
	cp = t >= 0 ? f->copy[t] : NULL;
	if (off < 0 || (uint64_t)off >= size) {
		ret = -ENXIO;
	} else if (f->shadow_fd >= 0 && (ret = eng_shadow_fill(e, f))) {
		;	/* a lazy shadow's holes are not the file's */
	} else if (f->shadow_fd >= 0 || !f->dirty || !cp) {
		/* the version being written through, or the backing file,
		 * which holds the content (a file not dirty) */
		bool shadow = f->shadow_fd >= 0;

		eng_unlock(e);
		fd = shadow ? f->shadow_fd : f->ops->data_fd(f, false);
		if (fd == -ENOENT)	/* never flushed and all hole */
			ret = whence == SEEK_DATA ? -ENXIO : off;
		else if (fd < 0)
			ret = fd;
		else if ((ret = lseek(fd, off, whence)) < 0)
			ret = -errno;
		if (fd >= 0 && !shadow)
			f->ops->release_data_fd(f, fd);
		eng_lock(e);
	} else {
		uint64_t len = cp->len < size ? cp->len : size;

		lease_begin(e, &l, cp, NULL);
		if (cp->cache->host_addressable) {
			ret = backing_seek_buf(copy_ptr(cp), len, size, (uint64_t)off, whence);
		} else {	/* GPU memory, read through a bounce buffer */
			ret = backing_seek_cache(cp->cache, cp->frag->off, len, size,
						 (uint64_t)off, whence);
		}
		lease_end(e, &l);
	}
	eng_unlock(e);
	tfile_unlock(f);
	return ret;
}

void tfile_open_writer(struct tfile *f)
{
	eng_lock(f->eng);
	f->writers++;
	eng_unlock(f->eng);
}

/* e->lock held: one writer of f is done; the last one completes the file. */
void eng_writer_done(struct engine *e, struct tfile *f)
{
	if (f->writers > 0)
		f->writers--;
	if (!f->writers && f->dirty && !f->unlinked) {
		if (f->shadow_fd >= 0)
			eng_shadow_done(e, f);
		else
			eng_complete_copy(e, f, false);
	}
}

void tfile_close_writer(struct tfile *f)
{
	struct engine *e = f->eng;

	tfile_lock(f);
	eng_lock(e);
	eng_writer_done(e, f);
	eng_unlock(e);
	tfile_unlock(f);
}

/*
 * f durable in its backing file, or (record) in a journal record where a
 * shadow's change is small (eng_shadow_record).  Without record (the unmount's
 * sync, tfile_fsync_data) a shadow is committed: every backing file is
 * complete after a clean exit, and the persistent tier, which stops
 * before the engine does, copies the committed file.
 */
static int fsync_data(struct tfile *f, bool record)
{
	struct engine *e = f->eng;
	int ret = 0;

	tfile_lock(f);
	eng_lock(e);
	if (f->write_err) {		/* an earlier write failed: say so once */
		ret = f->write_err;
		f->write_err = 0;
		goto out;
	}
	if (f->unlinked)
		goto out;
	if (f->shadow_fd >= 0) {
		/* a journal record of its changes, else a new version */
		if (!record || eng_shadow_record(e, f))
			ret = eng_commit_shadow(e, f, true);
		goto out;
	}
	if (!f->dirty) {
		ret = 0;
		goto out;
	}
	uint64_t target = f->gen;
	f->flush_waiters++;	/* its flush is not aged, wherever it comes from */
	eng_complete_copy(e, f, true);
	/* a failed flush is retried now, and its result reported */
	f->retry_at = 0;
	uint64_t errs = e->flush_errors;
	if (!eng_flush_inline(e, f))
		eng_flush_work(e);	/* queued in front, and due now */
	/* durable: in a new version, or in a journal record */
	while (f->flushed_gen < target && f->journaled_gen < target && !f->unlinked) {
		if (e->flush_errors != errs && f->flush_err) {
			ret = f->flush_err;
			break;
		}
		if (fastest_copy(e, f) < 0 && f->shadow_fd < 0)
			break;
		/* flush_one() and tfile_unlinked() signal it; a copy that
		 * went away otherwise is seen at the timeout */
		wait_ms(e, &e->flushed, 100);
	}
	f->flush_waiters--;
out:
	eng_unlock(e);
	tfile_unlock(f);
	return ret;
}

int tfile_fsync_data(struct tfile *f)
{
	return fsync_data(f, false);
}

int tfile_fsync(struct tfile *f)
{
	int ret = fsync_data(f, true);

	/* the flushes' renames (this one's, or a background one's since the
	 * last fsync) are durable only with their directory; attributes
	 * changed since the last fsync, with the backing file */
	if (!ret && f->ops->sync_meta)
		ret = f->ops->sync_meta(f);
	return ret;
}
