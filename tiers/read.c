/*
 * read.c - the read paths: tfile_read (copy out), tfile_read_begin/end
 * (zero-copy replies from the host cache), tfile_read_dev (into device
 * memory), and client spans (-o gpu_share).
 *
 * A read is served from the fastest tier whose copy holds the range, else
 * from the write-through shadow or the backing file.  Reading a file to
 * its end consumes it, and any read counts towards its consumption at its
 * last close (hints.c).  Entry points take f->lock then e->lock
 * (tfile_read_begin/end and tfile_span_end only e->lock: a writer may hold
 * f->lock while it waits for them).  Calls write.c for write spans,
 * hints.c and backing.c.
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

#include "engine_int.h"
#include "gpu_tier.h"
#include "gpu.h"

/*
 * e->lock held: wait while a prefetch fills a copy of f (READ_IN_PROGRESS),
 * on e->settled, which the end of every fill broadcasts (prefetch.c).
 * Returns whether it waited: a read served after such a wait is counted
 * late, not a hit (it waited for the SSD, only less than a miss does).
 */
static bool wait_filled(struct engine *e, struct tfile *f)
{
	bool waited = false;

	for (;;) {
		bool filling = false;

		for (int i = 0; i < e->ntiers; i++)
			if (f->copy[i] && f->copy[i]->state == TS_READ_IN_PROGRESS)
				filling = true;
		if (!filling)
			return waited;
		waited = true;
		pthread_cond_wait(&e->settled, &e->lock);
	}
}

/* Count a read served by cache c: a hit, or late if it waited for a fill. */
static void count_read(struct cache *c, bool waited)
{
	if (waited)
		c->late++;
	else
		c->hits++;
}

/* One device read, f->lock held (taken and dropped by the caller). */
static ssize_t read_dev_locked(struct tfile *f, uint64_t dptr, int dev, size_t len,
			       off_t off)
{
	struct engine *e = f->eng;
	struct lease l;
	ssize_t ret = 0;
	bool waited;
	int i;

	if (off < 0)
		return -EINVAL;
	eng_lock(e);
	waited = wait_filled(e, f);	/* a prefetch of it is running */
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
		count_read(c, waited);
		lease_begin(e, &l, cp, NULL);
		if (c->host_addressable)
			ret = gpu_copy_htod(dptr, copy_ptr(cp) + off, len);
		else
			ret = gpu_tier_copy_dev(e->gpu, dev, cp->frag->off + (uint64_t)off,
						dptr, len, false);
		lease_end(e, &l);
		ret = ret ? ret : (ssize_t)len;
		goto out;
	}
	e->tiers[0]->misses++;
	eng_unlock(e);
	{
		/* from the SSD (or the write-through version) via a bounce buffer */
		int fd = f->shadow_fd >= 0 ? -1 : f->ops->data_fd(f, false);

		if (f->shadow_fd >= 0)
			ret = eng_shadow_read(f, NULL, dptr, len, (uint64_t)off);
		else
			ret = fd < 0 ? fd :
			      backing_move(&(struct bend){ .kind = BEND_DEV, .at = dptr },
					   &(struct bend){ .kind = BEND_FD, .fd = fd,
							   .at = (uint64_t)off },
					   len, NULL);
		if (fd >= 0)
			f->ops->release_data_fd(f, fd);
		ret = ret ? ret : (ssize_t)len;
	}
	eng_lock(e);
out:
	if (ret >= 0)
		eng_read_done(e, f, off, (size_t)ret);
	eng_unlock(e);
	return ret;
}

ssize_t tfile_read_dev(struct tfile *f, uint64_t dptr, int dev, size_t len, off_t off)
{
	ssize_t ret;

	if (!f->eng->gpu)
		return -ENODEV;
	tfile_lock(f);
	ret = read_dev_locked(f, dptr, dev, len, off);
	tfile_unlock(f);
	return ret;
}

/* Under one f->lock: no write lands between the segments. */
/*
 * A vectored read whose segments one cached copy holds entirely (e->lock
 * held, f->lock too): every segment queued on its device and waited for
 * once.  Returns the total, -EAGAIN when no single copy holds them all
 * (the caller reads segment by segment), or -errno.
 */
static ssize_t readv_from_copy(struct engine *e, struct tfile *f,
			       const struct tdev_seg *seg, int n)
{
	struct tier_dxfer *x;
	struct copy *cp = NULL;
	uint64_t need = 0, total = 0;
	struct lease l;
	bool waited, host;
	int i, ret;

	waited = wait_filled(e, f);	/* a prefetch of it is running */
	for (i = 0; i < n; i++) {
		uint64_t end = seg[i].off + seg[i].len;

		if (seg[i].off < f->size && (end > f->size ? f->size : end) > need)
			need = end > f->size ? f->size : end;
	}
	if (!need)
		return -EAGAIN;		/* nothing but end of file: the slow way */
	for (i = 0; i < e->ntiers && !cp; i++)
		if (f->copy[i] && f->copy[i]->state != TS_INIT && need <= f->copy[i]->len)
			cp = f->copy[i];
	if (!cp)
		return -EAGAIN;
	x = malloc((size_t)n * sizeof(*x));
	if (!x)
		return -ENOMEM;
	host = cp->cache->host_addressable;
	for (i = 0; i < n; i++) {
		uint64_t len = seg[i].off >= f->size ? 0 :
			       seg[i].len > f->size - seg[i].off ? f->size - seg[i].off :
			       seg[i].len;

		x[i] = (struct tier_dxfer){
			.dev = seg[i].dev,
			.off = host ? (uint64_t)(uintptr_t)(copy_ptr(cp) + seg[i].off)
				    : cp->frag->off + seg[i].off,
			.dptr = seg[i].dptr,
			.len = len,
		};
		total += len;
		count_read(cp->cache, waited);
	}
	lease_begin(e, &l, cp, NULL);
	ret = gpu_tier_copy_devv(e->gpu, x, n, false, host);
	lease_end(e, &l);
	for (i = 0; !ret && i < n; i++)
		if (x[i].len)
			eng_read_done(e, f, (off_t)seg[i].off, (size_t)x[i].len);
	free(x);
	return ret ? ret : (ssize_t)total;
}

ssize_t tfile_readv_dev(struct tfile *f, const struct tdev_seg *seg, int n)
{
	struct engine *e = f->eng;
	ssize_t ret = 0, r = 0;
	int i;

	if (!e->gpu)
		return -ENODEV;
	tfile_lock(f);
	eng_lock(e);
	r = readv_from_copy(e, f, seg, n);
	eng_unlock(e);
	if (r != -EAGAIN) {
		tfile_unlock(f);
		return r;
	}
	r = 0;
	for (i = 0; i < n; i++) {
		r = read_dev_locked(f, seg[i].dptr, seg[i].dev, (size_t)seg[i].len,
				    (off_t)seg[i].off);
		if (r < 0)
			break;
		ret += r;
	}
	tfile_unlock(f);
	return r < 0 ? r : ret;
}

/*
 * ---- client spans (-o gpu_share) ----------------------------------------
 *
 * With a shared GPU cache the client copies device to device itself,
 * between tfile_span_begin() and tfile_span_end(), which run in two
 * different requests.  In between the copy is pinned (no eviction, no
 * move) and counted in cp->spans: eng_writable_copy() waits until no span of
 * the file is open, so no write, truncate or relocation overlaps a span
 * (client write spans of one file take turns, like the writes of
 * do_write() under f->lock).  A write span counts as a writer of the file
 * (f->writers), so its close does not complete the copy under it.
 */

/*
 * tfile_spanv_begin for a write over [r[0].off, hi), f->lock and e->lock
 * held (e->lock dropped while the holes before the ranges are zeroed): the
 * writable copy, its changes noted, pinned and counted as a span and a
 * writer, into *cpp.  Returns 0, -EAGAIN when the daemon copies (written
 * through, a hole, not in the GPU tier), or eng_writable_copy's error.
 */
static int spanv_begin_write(struct engine *e, struct tfile *f, const struct tspan_range *r,
			     int n, uint64_t hi, struct copy **cpp)
{
	struct copy *cp;
	uint64_t at;
	int err, i;

	/* written through, or to be (a hole the caches do not take):
	 * the daemon copies */
	if (f->shadow_fd >= 0 || eng_goes_sparse(e, f, r[0].off, hi))
		return -EAGAIN;
	cp = eng_writable_copy(e, f, hi > f->size ? hi : f->size, f->size, &err);
	if (!cp)
		return err ? err : -EAGAIN;
	if (cp->cache->host_addressable)
		return -EAGAIN;	/* not in the GPU tier */
	for (i = 0; i < n; i++)
		eng_note_change(e, f, cp->len < r[i].off ? cp->len : r[i].off,
				r[i].off + r[i].len);
	copy_lease(cp);		/* until tfile_span_end() */
	cp->spans++;
	f->writers++;
	e->client_writes++;
	at = cp->len;
	eng_unlock(e);
	for (i = 0; i < n; i++) {	/* the holes before the ranges */
		eng_copy_zero(cp, at, r[i].off);
		if (r[i].off + r[i].len > at)
			at = r[i].off + r[i].len;
	}
	eng_lock(e);
	*cpp = cp;
	return 0;
}

/*
 * tfile_spanv_begin for a read, f->lock and e->lock held: the ranges cut
 * at end of file, [*lo, *hi) (the caller's starts empty) widened to their
 * union and *last set to the one that ends last, and the GPU tier's copy,
 * pinned and counted as a span, into *cpp (left NULL when nothing is left
 * to read: no span).
 * Returns 0, or -EAGAIN when the ranges are not all in the GPU tier.
 */
static int spanv_begin_read(struct engine *e, struct tfile *f, struct tspan_range *r, int n,
			    uint64_t *lo, uint64_t *hi, int *last, struct copy **cpp)
{
	bool waited = wait_filled(e, f);	/* a prefetch of it is running */
	struct copy *cp;
	int i;

	for (i = 0; i < n; i++) {
		if (r[i].off >= f->size)
			r[i].len = 0;	/* nothing to read there */
		else if (r[i].len > f->size - r[i].off)
			r[i].len = f->size - r[i].off;
		if (!r[i].len)
			continue;
		if (r[i].off < *lo)
			*lo = r[i].off;
		if (r[i].off + r[i].len > *hi) {
			*hi = r[i].off + r[i].len;
			*last = i;
		}
	}
	if (!*hi)
		return 0;	/* nothing to read: no span */
	cp = f->copy[0];
	if (!cp || cp->cache != e->tiers[0] || cp->state == TS_INIT || *hi > cp->len)
		return -EAGAIN;	/* not in the GPU tier */
	copy_lease(cp);		/* until tfile_span_end() */
	cp->spans++;
	cp->last_use = ++e->tick;
	for (i = 0; i < n; i++)
		if (r[i].len)
			count_read(cp->cache, waited);
	e->client_reads++;
	*cpp = cp;
	return 0;
}

int tfile_spanv_begin(struct tfile *f, bool write, struct tspan_range *r, int n,
		      struct tspan *s, uint64_t *cache_off)
{
	struct engine *e = f->eng;
	uint64_t lo = UINT64_MAX, hi = 0, bytes = 0;
	struct copy *cp = NULL;
	int ret = 0, i, last = 0;

	memset(s, 0, sizeof(*s));
	if (!e->gpu)
		return -ENODEV;
	if (n < 1)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		if (r[i].off > (uint64_t)INT64_MAX || r[i].len > (uint64_t)INT64_MAX - r[i].off)
			return -EINVAL;
		if (write && i && r[i].off < r[i - 1].off + r[i - 1].len)
			return -EINVAL;		/* unsorted or overlapping */
	}
	tfile_lock(f);
	eng_lock(e);
	if (write) {
		lo = r[0].off;
		hi = r[n - 1].off + r[n - 1].len;
		last = n - 1;
		ret = spanv_begin_write(e, f, r, n, hi, &cp);
	} else {
		ret = spanv_begin_read(e, f, r, n, &lo, &hi, &last, &cp);
	}
	if (ret || !cp)
		goto out;
	for (i = 0; i < n; i++) {
		cache_off[i] = cp->frag->off + r[i].off;
		bytes += r[i].len;
	}
	s->cp = cp;
	s->off = r[last].off;
	s->len = r[last].len;
	s->lo = lo;
	s->hi = hi;
	s->bytes = bytes;
	s->write = write;
out:
	eng_unlock(e);
	tfile_unlock(f);
	return ret;
}

int tfile_span_begin(struct tfile *f, bool write, uint64_t off, uint64_t len,
		     struct tspan *s, uint64_t *cache_off)
{
	struct tspan_range r = { off, len };

	return tfile_spanv_begin(f, write, &r, 1, s, cache_off);
}

ssize_t tfile_span_end(struct tfile *f, struct tspan *s, bool ok)
{
	struct engine *e = f->eng;
	struct copy *cp = s->cp;
	ssize_t ret = ok ? (ssize_t)s->bytes : -EIO;

	if (!cp)
		return 0;
	/* not f->lock: a write to the file may hold it while it waits for
	 * this span to end (eng_writable_copy) */
	eng_lock(e);
	copy_unlease(e, cp);
	cp->spans--;
	if (s->write) {
		/* a failed copy may have changed bytes inside the file: they
		 * are flushed as they are, and the size stays */
		if (ok) {
			if (s->hi > cp->len)
				cp->len = s->hi;
			if (s->hi > f->size)
				f->size = s->hi;
			e->client_bytes += s->bytes;
		}
		cp->last_use = ++e->tick;
		eng_mark_modified(f);
		eng_writer_done(e, f);	/* a span cannot be written through */
	} else if (ok) {
		e->client_bytes += s->bytes;
		eng_read_done(e, f, (off_t)s->off, (size_t)s->len);
	}
	eng_unlock(e);
	s->cp = NULL;
	return ret;
}

int tfile_read_begin(struct tfile *f, size_t len, off_t off,
		     const void **p, size_t *n, struct copy **pin)
{
	struct engine *e = f->eng;
	bool waited;
	int i, ret = 0;

	eng_lock(e);
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
	waited = wait_filled(e, f);	/* a prefetch of it: quicker to wait for it */
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
		copy_lease(cp);		/* until tfile_read_end() */
		cp->readers++;	/* writers wait for it (copies_busy) */
		cp->last_use = ++e->tick;
		count_read(cp->cache, waited);
		*p = copy_ptr(cp) + off;
		*pin = cp;
		ret = 1;
		goto out;
	}
out:
	/* consumed now, before the caller replies: once the reader has its
	 * bytes, the restore queue and the state already say so */
	if (ret)
		eng_read_done(e, f, off, *n);
	eng_unlock(e);
	return ret;
}

void tfile_read_end(struct tfile *f, struct copy *pin)
{
	struct engine *e = f->eng;

	eng_lock(e);
	if (pin) {
		pin->readers--;
		copy_unlease(e, pin);
	}
	eng_unlock(e);
}

ssize_t tfile_read(struct tfile *f, void *buf, size_t len, off_t off)
{
	struct engine *e = f->eng;
	struct lease l;
	ssize_t ret = 0;
	int fd, i;

	tfile_lock(f);
	eng_lock(e);
	if ((uint64_t)off >= f->size)
		goto out;
	if ((uint64_t)off + len > f->size)
		len = (size_t)(f->size - (uint64_t)off);
	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (!cp || cp->state == TS_INIT || cp->state == TS_READ_IN_PROGRESS ||
		    (uint64_t)off + len > cp->len)
			continue;
		cp->cache->hits++;
		lease_begin(e, &l, cp, NULL);
		ret = cp->cache->ops->read(cp->cache, cp->frag->off + (uint64_t)off, buf, len);
		lease_end(e, &l);
		ret = ret ? ret : (ssize_t)len;
		goto out;
	}
	e->host.misses++;
	if (f->shadow_fd >= 0 && f->slog && f->slog->lazy) {
		eng_unlock(e);
		ret = eng_shadow_read(f, buf, 0, len, (uint64_t)off);
		ret = ret ? ret : (ssize_t)len;
		eng_lock(e);
	} else if (f->shadow_fd >= 0) {
		fd = f->shadow_fd;
		eng_unlock(e);
		ret = pread(fd, buf, len, off);
		if (ret < 0)
			ret = -errno;
		eng_lock(e);
	} else {
		eng_unlock(e);
		fd = f->ops->data_fd(f, false);
		if (fd < 0) {
			ret = fd;
		} else {
			ret = backing_pread(fd, buf, len, off);	/* zeros past its end */
			ret = ret ? ret : (ssize_t)len;
			f->ops->release_data_fd(f, fd);
		}
		eng_lock(e);
	}
out:
	if (ret >= 0)
		eng_read_done(e, f, off, (size_t)ret);
	eng_unlock(e);
	tfile_unlock(f);
	return ret;
}
