/*
 * dedup_flush.c - the dedup flush (-o dedup): how a flush makes a version
 * that shares extents with earlier ones, and the chunk index's versions.
 *  - incremental: a file changed in place since its base (the backing
 *    file's current version) clones the base's unchanged blocks into the
 *    new version and writes the changed ranges (write.c records them in
 *    f->dd);
 *  - by chunks: a whole new file is cut into chunks whose hashes (XXH3-128
 *    here, or the GPU tier's kernel, in the cascade or here) are looked up
 *    in the chunk index (dedup.c); runs found are cloned, the rest written;
 *    where an fsync waits and the file is one version but for a few
 *    chunks, a clone record makes it durable first (ddf_record);
 *  - the index's versions (struct dd_src): added after a flush by chunks,
 *    carried over by an incremental flush or by a small change's journal
 *    record written in place (flush.c: eng_dd_applied), retired when their
 *    file's next version starts or the file goes; their descriptors are
 *    closed by a flusher, without e->lock.
 *
 * Owns: e->dd (statistics, the index, the live versions, the descriptors
 * to close) and f->dd's src, hashed_whole and gh; reads f->dd's ranges and
 * lengths, which write.c keeps, and at a flush's end sets base_len and
 * clears taint.  Called by flush.c (a flush, the cascade, the flushers'
 * closes) through dedup_flush.h, and by write.c and engine.c (retire,
 * destroy).  Takes e->lock only: its callers hold it for the plan, the end
 * and the retirements; the writing functions run without it and take it
 * briefly (lookups, a clone's epoch check, statistics); never a
 * tfile.lock.  Calls backing.c (the writes and settling of a version),
 * dedup.c (the index, hashes, FICLONERANGE), the cache's hash operation,
 * and tfile_ops data_fd/release_data_fd, journal_clone and name without
 * e->lock.  The cascade's clone record (eng_dd_gpu_record) copies the
 * chunks that differ out of the GPU tier with the cache's read_ranges.
 *
 * Over 1,200 lines: the incremental flush, the flush by chunks and the
 * clone record share the versions' references and epochs (dd_src_*) and
 * the lookups' arrays, all under the one rule of e->lock above; split,
 * each part would call the others' helpers both ways.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include "dedup_flush.h"
#include "ssd.h"

#define DD_SRC_MAX	1024	/* versions held open for cloning */
#define DD_BATCH	4096	/* chunks looked up or indexed per hold of
				 * e->lock (64 MiB at 16 KiB chunks) */
#define DD_SAMPLE	8	/* chunks hashed first when recent files were new */
#define DD_LOW		0.03	/* "almost all new": less than this found */
#define DD_MIN_RUN	(64u << 10)	/* shorter runs of found chunks are
					 * written: a FICLONERANGE costs more
					 * than writing a few blocks */

/* FICLONERANGE, its time added to *clone_s. */
static int timed_clone(double *clone_s, int dst, uint64_t doff, int src, uint64_t soff,
		       uint64_t len)
{
	double t0 = tier_now();
	int ret = dedup_clone(dst, doff, src, soff, len);

	*clone_s += tier_now() - t0;
	return ret;
}

/* eng_settle_cloned(), its time added to *sync_s. */
static int settle_cloned(struct engine *e, int fd, double *sync_s)
{
	double t0 = tier_now();
	int ret = eng_settle_cloned(e, fd);

	*sync_s += tier_now() - t0;
	return ret;
}

/* ---- incremental flushes ----------------------------------------------- */

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
 * Fill version fd with cp's len bytes incrementally: clone the base's
 * unchanged blocks, write the changed ranges and the tail.  e->lock not
 * held, cp leased.  Returns 0, -EAGAIN when the base is not what the plan
 * says (nothing written: the caller writes it all), or -errno.
 */
static int flush_incr(struct engine *e, struct ssd_ring *ring, struct tfile *f,
		      struct copy *cp, int fd, bool direct, uint64_t len, struct incr *in)
{
	uint64_t end = direct ? tier_round(len) : len;
	uint64_t *progress = &cp->flushed_bytes;
	struct stat st;
	int src, ret;

	src = f->ops->data_fd(f, false);
	if (src < 0)
		return -EAGAIN;
	if (fstat(src, &st) < 0 || (uint64_t)st.st_size != in->base_len)
		ret = -EAGAIN;	/* not the base the ranges were kept against */
	else
		ret = timed_clone(&in->clone_s, fd, 0, src, 0, in->clone);
	f->ops->release_data_fd(f, src);
	if (ret)
		return -EAGAIN;
	/* the progress eviction and the statistics read: the clone counts
	 * whole, the ranges written over it do not count again */
	__atomic_add_fetch(progress, in->clone, __ATOMIC_RELAXED);
	eng_delay_at(NULL, "dedup_cloned");
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
		ret = backing_write_range(ring, fd, cp, a, b, NULL);
		tierfs_fault_kill("incr_write");
	}
	if (host && !ret && ns) {
		/* the first range alone first: the test hook's kill point */
		ret = backing_write_segs(ring, fd, seg, 1, NULL);
		tierfs_fault_kill("incr_write");
		if (!ret)
			ret = backing_write_segs(ring, fd, seg + 1, ns - 1, NULL);
	}
	free(seg);
	if (!ret)	/* past what was cloned the version is a hole */
		ret = backing_write_sparse(ring, fd, cp, in->clone, end, progress, false);
	in->written = inner + (end > in->clone ? end - in->clone : 0);
	in->cloned = in->clone - inner;
	__atomic_store_n(&cp->flushed_bytes, len, __ATOMIC_RELAXED);
	if (!ret && ftruncate(fd, (off_t)len) < 0)
		ret = -errno;
	if (!ret)
		ret = settle_cloned(e, fd, &in->sync_s);
	return ret;
}

/* ---- content de-duplication of whole new files ------------------------- */

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
	eng_flush_work(e);	/* a flusher closes it */
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

/* e->lock held: a clone record whose version no flush will index (its
 * file changed or went first) is not waited for (ddf_wait_pending). */
static void grec_end(struct engine *e)
{
	e->dd.versions_pending--;
	eng_flushed(e);
}

void eng_dd_retire(struct engine *e, struct tfile *f)
{
	if (f->dd.src)
		dd_src_retire(e, f->dd.src);
	if (f->dd.grec_gen) {
		f->dd.grec_gen = 0;
		grec_end(e);
	}
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

/* e->lock held: is version s still what it was at epoch ep (not retired,
 * not suspended, not carried over since)? */
static bool dd_src_at(const struct dd_src *s, uint32_t ep)
{
	return !s->retired && s->fd >= 0 && s->epoch == ep;
}

/* e->lock held: a descriptor of version s if dd_src_at(s, ep), or -1. */
static int dd_src_dup(const struct dd_src *s, uint32_t ep)
{
	return dd_src_at(s, ep) ? dup(s->fd) : -1;
}

/*
 * A descriptor of base b as it was at epoch ep (dd_src_dup) and in *m the
 * chunks of it that the file's hashed chunks may share at the same
 * offsets (its whole chunks, at most d->nhashed): the descriptor, or -1
 * (b retired or changed since, or unreadable).  e->lock not held.
 */
static int ddf_base_open(struct engine *e, const struct ddf *d, const struct dd_src *b,
			 uint32_t ep, uint64_t *m)
{
	struct stat st;
	int bfd;

	eng_lock(e);
	bfd = dd_src_dup(b, ep);
	eng_unlock(e);
	if (bfd < 0)
		return -1;
	if (fstat(bfd, &st) < 0) {
		close(bfd);
		return -1;
	}
	*m = (uint64_t)st.st_size / d->chunk;
	if (*m > d->nhashed)
		*m = d->nhashed;
	return bfd;
}

/*
 * Clone len bytes at soff of version s, as it was at epoch ep (when its
 * chunks were looked up), into fd at off.  e->lock not held.  Returns 0,
 * or -errno (the caller writes those bytes instead): s was retired,
 * suspended or carried over before the clone was over (its content may
 * have changed).  The clone's time goes to d->clone_s, its bytes to
 * *progress (the flush's, read without the lock).
 */
static int ddf_clone(struct engine *e, struct ddf *d, int fd, uint64_t off, struct dd_src *s,
		     uint64_t soff, uint64_t len, uint32_t ep, uint64_t *progress)
{
	int sfd, ret;

	eng_lock(e);
	sfd = dd_src_dup(s, ep);
	eng_unlock(e);
	if (sfd < 0)
		return -ESTALE;
	ret = timed_clone(&d->clone_s, fd, off, sfd, soff, len);
	close(sfd);
	eng_lock(e);
	if (!ret && (s->retired || s->epoch != ep))
		ret = -ESTALE;	/* retired or suspended before anything of
				 * it changes: not now, the clone has its
				 * bytes */
	eng_unlock(e);
	if (!ret)
		__atomic_add_fetch(progress, len, __ATOMIC_RELAXED);
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
	for (uint64_t i = a; i < b; i += DD_BATCH) {	/* e->lock in turns */
		eng_lock(e);
		ddf_lookup(e, d, i, b - i < DD_BATCH ? b : i + DD_BATCH);
		eng_unlock(e);
	}
	d->nhashed = b;
}

/* The chunks looked up first: a sample where recent files were new. */
static uint64_t ddf_first(const struct ddf *d)
{
	return d->sample && d->n > DD_SAMPLE ? DD_SAMPLE : d->n;
}

/*
 * Take the hashes h of all d's chunks (computed on the GPU) and look them
 * up: the first ones (ddf_first), the rest only where those found
 * something.  true where the rest was left out (all new: d->nhashed is
 * ddf_first's).  e->lock not held.
 */
static bool ddf_take_sampled(struct engine *e, struct ddf *d, const struct dd_hash *h)
{
	uint64_t m = ddf_first(d);

	ddf_take_hashes(e, d, h, 0, m);
	if (m < d->n && !d->found)
		return true;
	if (m < d->n)
		ddf_take_hashes(e, d, h + m, m, d->n);
	return false;
}

/*
 * Hashes of d's chunks [0, n), computed on the host with XXH3-128 from the
 * host copy: when the last file hashed was almost all new, a sample first,
 * and the rest only if the sample found something.
 */
static void ddf_hash(struct engine *e, struct copy *cp, uint64_t len, struct ddf *d)
{
	uint64_t m = ddf_first(d);
	double t0 = tier_now();

	/* GPU hashes (the cascade's, or of a GPU copy flushed from the GPU):
	 * all of them, hashing costs next to nothing there; looked up as the
	 * host's are hashed (a sample first, when recent files were new), all
	 * of them kept for the index */
	if (!d->gh && !cp->cache->host_addressable)
		d->gh = ddf_cache_hash(e, cp, d->n, d->chunk);
	if (d->gh || !cp->cache->host_addressable) {
		bool out = false;

		if (d->gh) {
			out = ddf_take_sampled(e, d, d->gh);
			if (out) {	/* all new: not looked up */
				memcpy(d->h + m, d->gh + m, (d->n - m) * sizeof(*d->h));
				d->nhashed = d->n;
			}
		}
		eng_lock(e);
		e->dd.chunks_hashed += d->nhashed;
		e->dd.chunks_found += d->found;
		if (out)
			e->dd.sampled_out++;
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
	uint64_t C = d->chunk, m, i, inner = 0, cloned;
	uint64_t *progress = &cp->flushed_bytes;	/* the chunks written over
							 * the clone count twice */
	bool host = cp->cache->host_addressable;
	struct ssd_seg *seg = NULL;
	unsigned ns = 0;
	int sfd = ddf_base_open(e, d, b, ep, &m), ret = 0;

	if (sfd < 0)
		return -EAGAIN;
	close(sfd);	/* ddf_clone takes its own, checked again */
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
	if (ddf_clone(e, d, fd, 0, b, 0, m * C, ep, progress))
		return -EAGAIN;
	eng_delay_at(NULL, "dedup_cloned");
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
			    ddf_clone(e, d, fd, i * C, d->src[i], d->soff[i], (j - i) * C,
				      d->sep[i], progress) == 0) {
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
			ret = backing_write_range(ring, fd, cp, i * C, j * C, progress);
		}
		i = j;
	}
	if (host && !ret && ns)
		ret = backing_write_segs(ring, fd, seg, ns, progress);
	free(seg);
	tierfs_fault_kill("dedup_write");
	if (!ret)	/* past the clone: a hole until written */
		ret = backing_write_sparse(ring, fd, cp, d->nhashed * C, end, progress, false);
	d->written += inner + (end > d->nhashed * C ? end - d->nhashed * C : 0);
	d->cloned += cloned;
	return ret;
}

/* Write bytes [a, b) of cp into fresh version fd (backing_write_sparse),
 * their blocks given first where pre (backing_prealloc_range). */
static int write_new(struct ssd_ring *ring, int fd, struct copy *cp, uint64_t a, uint64_t b,
		     uint64_t *progress, bool pre)
{
	int ret = pre ? backing_prealloc_range(fd, cp, a, b) : 0;

	return ret ? ret : backing_write_sparse(ring, fd, cp, a, b, progress, false);
}

/*
 * Write cp's len bytes into fd: runs of chunks found in the index are
 * cloned (one FICLONERANGE per run that is contiguous in one version),
 * the rest written.  e->lock not held.
 */
static int ddf_write(struct engine *e, struct ssd_ring *ring, struct copy *cp, int fd,
		     bool direct, uint64_t len, struct ddf *d)
{
	uint64_t end = direct ? tier_round(len) : len, C = d->chunk, i = 0;
	uint64_t *progress = &cp->flushed_bytes;
	uint64_t ws = 0;	/* bytes [ws, i * C) are still to be written */
	uint32_t ep = 0;
	struct dd_src *base = ddf_base(d, &ep);
	/* the version sized first and each run's blocks given before its
	 * direct writes, as flush_whole() does: a direct write past the end
	 * runs alone, so the requests in flight would go one at a time */
	bool pre = direct && cp->cache->host_addressable;
	int ret = 0;

	if (base && (ret = ddf_write_based(e, ring, cp, fd, end, d, base, ep)) != -EAGAIN)
		goto out;
	ret = pre && ftruncate(fd, (off_t)end) < 0 ? -errno : 0;

	while (i < d->nhashed && !ret) {
		uint64_t j = i + 1;

		if (d->src[i]) {
			while (j < d->nhashed && ddf_same_run(d, i, j))
				j++;
			if ((j - i) * C >= DD_MIN_RUN) {
				ret = write_new(ring, fd, cp, ws, i * C, progress, pre);
				d->written += i * C - ws;
				ws = i * C;
				if (!ret && ddf_clone(e, d, fd, i * C, d->src[i], d->soff[i],
						      (j - i) * C, d->sep[i], progress) == 0) {
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
		ret = write_new(ring, fd, cp, ws, end, progress, pre);
	d->written += end > ws ? end - ws : 0;
out:
	__atomic_store_n(&cp->flushed_bytes, len, __ATOMIC_RELAXED);
	if (!ret && ftruncate(fd, (off_t)len) < 0)
		ret = -errno;
	if (!ret)
		ret = settle_cloned(e, fd, &d->sync_s);
	return ret;
}

/*
 * The ranges of d's file (len bytes) that are not in base b (epoch ep, m
 * of its chunks at their own offsets): its chunks found nowhere else or
 * elsewhere, and its tail past its last full chunk.  Returns their number
 * (*r malloc'ed, *bytes their length), or 0 with *r NULL where they cannot
 * be allocated.
 */
static uint32_t ddf_not_in_base(const struct ddf *d, uint64_t len, const struct dd_src *b,
				uint32_t ep, uint64_t m, struct drange **r, uint64_t *bytes)
{
	uint64_t C = d->chunk, i;
	uint32_t n = 0;

	*bytes = 0;
	*r = malloc((d->nhashed + 1) * sizeof(**r));
	if (!*r)
		return 0;
	for (i = 0; i < d->nhashed; i++) {
		if (ddf_in_base(d, i, m, b, ep))
			continue;
		if (n && (*r)[n - 1].end == i * C)
			(*r)[n - 1].end += C;
		else
			(*r)[n++] = (struct drange){ i * C, (i + 1) * C };
		*bytes += C;
	}
	if (len > d->nhashed * C) {
		if (n && (*r)[n - 1].end == d->nhashed * C)
			(*r)[n - 1].end = len;
		else
			(*r)[n++] = (struct drange){ d->nhashed * C, len };
		*bytes += len - d->nhashed * C;
	}
	return n;
}

/*
 * The ranges r[0..n) of copy `from` (the GPU tier's, whose cache has
 * read_ranges: eng_dd_gpu_plan) into copy `to` (the host cache's, of len
 * bytes) at their own offsets, all queued before one wait.  e->lock not
 * held, both leased.  0 or -errno.
 */
static int ddf_gather(struct engine *e, struct copy *from, struct copy *to,
		      const struct drange *r, uint32_t n, uint64_t len)
{
	double t0 = tier_now();
	int ret = eng_copy_bounds(to, 0, len);

	if (!ret)
		ret = eng_copy_bounds(from, 0, len);
	if (!ret)
		ret = from->cache->ops->read_ranges(from->cache, from->frag->off, r, n,
						    copy_ptr(to));
	eng_lock(e);
	e->dd.gather_s += tier_now() - t0;
	eng_unlock(e);
	return ret;
}

/* A clone record's base, as ddf_record() found it: still so? */
struct base_at {
	struct engine *e;
	const struct dd_src *b;
	uint32_t ep;
};

/* journal_clone's base_ok: b still the version of epoch ep (no flush of
 * its file has begun, which could write its inode in place).  Takes
 * e->lock. */
static bool base_still(void *arg)
{
	struct base_at *a = arg;
	bool ok;

	eng_lock(a->e);
	ok = dd_src_at(a->b, a->ep);
	eng_unlock(a->e);
	return ok;
}

/*
 * An fsync waits for this flush (d->record) of a file that is its base
 * but for a few chunks (a checkpoint of a series): its content made
 * durable first as a clone record (tfile_ops.journal_clone: those chunks
 * and the tail appended to the journal, one sequential write and one
 * sync), and the waiter woken (journaled_gen); then the version is made
 * as without it (ddf_write), and its durable commit retires the record.
 * The version costs a clone of the base, whose extent map grows with each
 * version of a series, and a copy on write per changed chunk: the record
 * only the changed bytes.  Nothing happens where the change is not small
 * (journal_pct), the base cannot be held, or the fs side refuses.  With
 * `from` (the cascade, eng_dd_gpu_record), cp is the host copy still to be
 * filled: the chunks that differ are copied into it from `from` first.
 * e->lock not held.
 */
static void ddf_record(struct engine *e, struct tfile *f, struct copy *cp, struct copy *from,
		       uint64_t len, struct ddf *d)
{
	uint32_t ep = 0, n;
	struct dd_src *b = ddf_base(d, &ep);
	struct drange *r = NULL;
	uint64_t bytes, seq, m;
	int bfd, ret;

	if (!b || (bfd = ddf_base_open(e, d, b, ep, &m)) < 0)
		return;
	n = ddf_not_in_base(d, len, b, ep, m, &r, &bytes);
	if (!r || !eng_journal_small(e, f, bytes, len))
		goto out;
	if (from && ddf_gather(e, from, cp, r, n, len))
		goto out;	/* the whole copy and the flush follow */
	ret = f->ops->journal_clone(f, bfd, copy_ptr(cp), r, n, len, &seq, base_still,
				    &(struct base_at){ e, b, ep });
	if (ret < 0) {
		char nb[256];

		tlog(LOG_WARNING, "%s: no journal record of its new version (%s): written "
		     "whole before its fsync returns", f->ops->name(f, nb, sizeof(nb)),
		     strerror(-ret));
	}
	if (ret)
		goto out;
	eng_lock(e);
	if (f->journaled_gen < d->gen)
		f->journaled_gen = d->gen;	/* its fsync returns */
	d->recorded = true;
	e->dd.versions_pending++;
	e->dd.records++;
	e->dd.records_gpu += from != NULL;
	e->dd.bytes_recorded += bytes;
	eng_flushed(e);
	eng_unlock(e);
	eng_delay_at(NULL, "clone_recorded");
out:
	free(r);
	close(bfd);
}

/*
 * A flush that may make a clone record waits first (a second at most) for
 * the versions of earlier clone records to be in the index: their fsyncs
 * returned before those versions were written, and the next checkpoint of
 * a series, arriving meanwhile, would take the one before as its base and
 * differ from it twice as much (a record of twice the chunks, or none).
 * e->lock not held.
 */
static void ddf_wait_pending(struct engine *e)
{
	double t0 = tier_now(), until = t0 + 1.0;

	eng_lock(e);
	while (e->dd.versions_pending && !e->stop && tier_now() < until)
		wait_ms(e, &e->flushed, 20);
	e->dd.pending_s += tier_now() - t0;
	eng_unlock(e);
}

/* e->lock held: p's clone record's version is indexed, or failed. */
static void pending_end(struct engine *e, struct dd_flush *p)
{
	if (!p->d.recorded)
		return;
	p->d.recorded = false;
	e->dd.versions_pending--;
	eng_flushed(e);		/* ddf_wait_pending */
}

/*
 * d's owner (the backing file's: the new version is still ours), whose
 * versions alone it may clone, and its arrays for d->n chunks.  0, or
 * -EAGAIN (what was allocated is freed by ddf_done() or eng_dd_gpu_record()).
 * e->lock not held.
 */
static int ddf_setup(struct tfile *f, struct ddf *d)
{
	struct stat st;
	int sfd = f->ops->data_fd(f, false);

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
	return d->h && d->src && d->soff && d->sep ? 0 : -EAGAIN;
}

/* e->lock held: the references of d's lookups dropped. */
static void ddf_put_found(struct ddf *d)
{
	if (d->src)
		for (uint64_t i = 0; i < d->n; i++)
			if (d->src[i])
				dd_src_put(d->src[i]);
}

/* Flush f's whole new content by chunks.  e->lock not held.  -EAGAIN: the
 * caller writes it all (nothing was done). */
static int flush_dedup(struct engine *e, struct ssd_ring *ring, struct tfile *f,
		       struct copy *cp, int fd, bool direct, uint64_t len, struct ddf *d)
{
	if (ddf_setup(f, d))
		return -EAGAIN;
	if (!ring)
		d->record = false;	/* in the fsync's own thread (a few
					 * pages): the version returns as soon */
	if (d->record)
		ddf_wait_pending(e);
	ddf_hash(e, cp, len, d);
	if (d->record)
		ddf_record(e, f, cp, NULL, len, d);
	return ddf_write(e, ring, cp, fd, direct, len, d);
}

/*
 * e->lock held, after the flush: drop the references of the lookup, and on
 * success make the new version (d->vfd, taken over) f's in the index and
 * return it, referenced, for eng_dd_index() to add its chunks (d->h, then
 * NULL, its hashes: the caller's to free); else NULL.
 */
static struct dd_src *ddf_done(struct engine *e, struct tfile *f, struct ddf *d, bool ok)
{
	struct dd_src *s = NULL;

	ddf_put_found(d);
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
		s->refs++;	/* eng_dd_index()'s */
	}
	dd_close_later(e, d->vfd);	/* not kept: closed like a retired one */
	d->vfd = -1;
	if (!s)
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
	return s;
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

/* ---- what flush.c calls ------------------------------------------------ */

void eng_dd_plan(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
		 struct dd_flush *p)
{
	uint64_t grec = f->dd.grec_gen;

	f->dd.grec_gen = 0;
	memset(p, 0, sizeof(*p));
	p->vfd = -1;
	p->gen = f->gen;
	incr_plan(e, f, len, &p->in);
	p->had_src = f->dd.src != NULL;
	/* its backing version is about to change: out of the index, or
	 * suspended there to be carried over to the new version */
	p->in.carry = p->in.on && e->dd.index.cap ? dd_src_suspend(e, f->dd.src) : NULL;
	if (!p->in.carry)
		eng_dd_retire(e, f);
	ddf_plan(e, f, cp, len, &p->d);
	if (p->in.on)
		p->d.on = false;
	p->d.gen = p->gen;
	p->d.record = p->d.on && f->flush_waiters && e->cfg.journal_pct &&
		      f->ops->journal_clone && cp->cache->host_addressable;
	if (grec && grec == p->gen && p->d.on) {
		p->d.recorded = true;	/* the cascade's record of this content:
					 * its version is this flush's */
		p->d.record = false;
	} else if (grec) {
		grec_end(e);
	}
}

int eng_dd_write(struct engine *e, struct ssd_ring *ring, struct tfile *f, struct copy *cp,
		 int fd, bool direct, bool inplace, uint64_t len, struct dd_flush *p)
{
	struct incr *in = &p->in;
	struct ddf *d = &p->d;
	int ret;

	if (in->on && !inplace) {
		ret = flush_incr(e, ring, f, cp, fd, direct, len, in);
		if (!ret && in->carry)
			incr_changed(e, cp, len, in->carry->chunk, in);
		else if (!ret && !p->had_src)
			ddf_hash_whole(e, f, cp, len, d);
		in->done = !ret && (!in->carry || in->ck);
		if (ret != -EAGAIN)
			goto out;
		in->on = false;	/* the whole file, over what was cloned */
	}
	if (d->on && !inplace) {
		ret = flush_dedup(e, ring, f, cp, fd, direct, len, d);
		if (ret != -EAGAIN)
			goto out;
	}
	d->on = false;
	ret = -EAGAIN;
out:
	p->clone_s = in->clone_s + d->clone_s;
	p->sync_s = in->sync_s + d->sync_s;
	return ret;
}

void eng_dd_committed(struct tfile *f, uint64_t len, struct dd_flush *p)
{
	struct ddf *d = &p->d;

	if (d->nhashed)		/* by chunks, or hashed whole */
		d->vfd = open_version(f);
	if (!d->on && d->vfd >= 0) {	/* hashed whole: the version's owner */
		struct stat vst;

		if (fstat(d->vfd, &vst) == 0 && (uint64_t)vst.st_size == len)
			d->uid = vst.st_uid;
		else
			d->nhashed = 0;	/* not what was hashed: not indexed */
	}
	if (p->in.done && p->in.carry)
		p->vfd = open_version(f);
}

void eng_dd_applied(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
		    struct dd_flush *p)
{
	struct incr *in = &p->in;

	if (!in->on || !in->carry)
		return;
	/* the apply wrote the plan's ranges below in->clone and everything
	 * from it on, as an incremental flush writes them */
	incr_changed(e, cp, len, in->carry->chunk, in);
	in->done = true;
	p->vfd = open_version(f);
}

void eng_dd_done(struct engine *e, struct tfile *f, struct dd_flush *p, bool ok,
		 uint64_t len)
{
	struct incr *in = &p->in;
	struct ddf *d = &p->d;

	free(in->r);
	in->r = NULL;
	p->ix_n = d->nhashed;
	p->ix_h = d->h;
	p->ix_chunk = d->chunk;
	p->ix_src = ddf_done(e, f, d, ok);
	if (!p->ix_src)
		p->ix_h = NULL;		/* freed */
	if (in->carry)
		dd_src_carry(e, f, in->carry, ok ? p->vfd : -1, in, len);
	else
		dd_close_later(e, p->vfd);
	p->vfd = -1;
	free(in->ck);
	free(in->ch);
	in->ck = NULL;
	in->ch = NULL;
	if (!ok) {
		pending_end(e, p);
		return;
	}
	if (e->cfg.dedup && !p->journalled) {
		e->dd.bytes_logical += len;
		e->dd.bytes_written += in->on ? in->written : d->on ? d->written : len;
		e->dd.bytes_cloned += in->on ? in->cloned : d->on ? d->cloned : 0;
		if (in->on)
			e->dd.files_incremental++;
		else if (d->on && d->cloned)
			e->dd.files_dedup++;
		else
			e->dd.files_full++;
	}
	/* the base is this version now (any change made since is a change
	 * against it too: the ranges are kept) */
	f->dd.base_len = len;
	if (f->gen == p->gen)
		f->dd.taint = false;
}

void eng_dd_index(struct engine *e, struct dd_flush *p)
{
	struct dd_src *s = p->ix_src;

	if (!s) {
		pending_end(e, p);
		return;
	}
	for (uint64_t i = 0; i < p->ix_n && !s->retired;) {
		uint64_t end = p->ix_n - i < DD_BATCH ? p->ix_n : i + DD_BATCH;

		for (; i < end; i++) {
			struct dd_src *gone = dd_index_add(&e->dd.index, &p->ix_h[i], s,
							   i * p->ix_chunk, 0);

			if (gone)
				dd_src_free(gone);	/* retired, its last entry gone */
		}
		if (i < p->ix_n) {	/* others' turn: writers, fsyncs, stats */
			eng_unlock(e);
			eng_lock(e);
		}
	}
	dd_src_put(s);
	free(p->ix_h);
	p->ix_src = NULL;
	p->ix_h = NULL;
	pending_end(e, p);
}

int eng_dd_take_close(struct engine *e)
{
	return e->dd.nclose ? e->dd.close[--e->dd.nclose] : -1;
}

void eng_dd_gpu_plan(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
		     struct dd_ghash *g)
{
	/* a whole new file is flushed by chunks: hash them on the GPU, from
	 * the bytes the host copy gets (writers wait for cp->flushing) */
	g->h = NULL;
	g->n = ddf_whole_new(e, f, len) && cp->cache->ops->hash ? len / e->cfg.dedup_chunk : 0;
	g->chunk = e->cfg.dedup_chunk;
	g->len = len;
	g->gen = f->gen;
	g->epoch = f->dd.wepoch;
	g->record = g->n && f->flush_waiters && e->cfg.journal_pct && f->ops->journal_clone &&
		    cp->cache->ops->read_ranges;
}

/*
 * See dedup_flush.h.  The chunks are looked up as the flush would look
 * them up (ddf_take_hashes; a sample first where recent files were new,
 * as ddf_hash does), and the record is the flush's (ddf_record),
 * its chunks copied from cp first; the flush of hcp that follows takes it
 * over (eng_dd_plan: grec_gen), looks them up again and makes the version.
 */
void eng_dd_gpu_record(struct engine *e, struct tfile *f, struct copy *cp, struct copy *hcp,
		       uint64_t len, const struct dd_ghash *g)
{
	struct ddf d = { .vfd = -1, .chunk = g->chunk, .n = g->n, .gen = g->gen, .on = true };
	bool pending;

	if (!g->record || !g->h)
		return;
	/*
	 * Where an earlier record's version is not indexed yet, the record
	 * is the flush's, which waits for it (ddf_wait_pending) in a flusher:
	 * the cascade serves every file of the GPU tier and waits for none,
	 * and meanwhile this file's whole copy crosses to the host.
	 */
	eng_lock(e);
	d.sample = e->dd.dup < DD_LOW;	/* as ddf_plan */
	pending = e->dd.versions_pending > 0;
	e->dd.records_left += pending;
	if (!pending)	/* as eng_dd_plan: a replay writes the record over
			 * the backing file, which is no base from here on */
		eng_dd_retire(e, f);
	eng_unlock(e);
	if (pending)
		return;
	if (!ddf_setup(f, &d)) {
		if (!ddf_take_sampled(e, &d, g->h))	/* else all new: no base */
			ddf_record(e, f, hcp, cp, len, &d);
	}
	eng_lock(e);
	ddf_put_found(&d);
	if (d.recorded && f->dd.grec_gen)
		grec_end(e);		/* an earlier one's flush never came */
	if (d.recorded)
		f->dd.grec_gen = d.gen;	/* counted in versions_pending */
	eng_unlock(e);
	free(d.h);
	free(d.src);
	free(d.soff);
	free(d.sep);
}

void eng_dd_gpu_hash(struct engine *e, struct copy *cp, struct dd_ghash *g)
{
	if (g->n)
		g->h = ddf_cache_hash(e, cp, g->n, g->chunk);
}

void eng_dd_gpu_keep(struct tfile *f, struct dd_ghash *g, bool keep)
{
	if (keep && g->h && f->gen == g->gen && f->dd.wepoch == g->epoch) {
		free(f->dd.gh.h);
		f->dd.gh = *g;	/* for the flush of the host copy (ddf_plan) */
		g->h = NULL;
	}
	free(g->h);	/* no host copy of these bytes follows */
	g->h = NULL;
}
