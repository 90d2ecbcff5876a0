/*
 * dedup.c - the reflink probe, FICLONERANGE and the changed-range sets of
 * incremental flushes (see dedup.h; dedup_flush.c uses them, write.c and read.c
 * record changes through eng_note_change()).
 *
 * Owns nothing shared: a struct dset belongs to whoever embeds it (a
 * tfile's, under e->lock).  Takes no lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/vfs.h>
#include <linux/fs.h>

#include <xxhash.h>

#include "dedup.h"

/* Index of the first range whose end reaches start (may be d->n). */
static uint32_t dset_find(const struct dset *d, uint64_t start)
{
	uint32_t lo = 0, hi = d->n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (d->r[mid].end < start)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Merge the two neighbours with the smallest gap between them. */
static void dset_squeeze(struct dset *d)
{
	uint32_t best = 0;
	uint64_t gap = UINT64_MAX;

	for (uint32_t i = 0; i + 1 < d->n; i++)
		if (d->r[i + 1].start - d->r[i].end < gap) {
			gap = d->r[i + 1].start - d->r[i].end;
			best = i;
		}
	d->r[best].end = d->r[best + 1].end;
	memmove(&d->r[best + 1], &d->r[best + 2],
		(d->n - best - 2) * sizeof(d->r[0]));
	d->n--;
}

int dset_add(struct dset *d, uint64_t start, uint64_t end)
{
	uint32_t i, j;

	if (end <= start)
		return 0;
	i = dset_find(d, start);
	for (j = i; j < d->n && d->r[j].start <= end; j++)
		;
	if (j > i) {		/* overlaps or touches r[i..j-1]: one range */
		if (d->r[i].start < start)
			start = d->r[i].start;
		if (d->r[j - 1].end > end)
			end = d->r[j - 1].end;
		d->r[i].start = start;
		d->r[i].end = end;
		memmove(&d->r[i + 1], &d->r[j], (d->n - j) * sizeof(d->r[0]));
		d->n -= j - i - 1;
		return 0;
	}
	if (d->n == d->cap) {
		uint32_t cap = d->cap ? 2 * d->cap : 16;
		struct drange *r = realloc(d->r, cap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		d->r = r;
		d->cap = cap;
	}
	memmove(&d->r[i + 1], &d->r[i], (d->n - i) * sizeof(d->r[0]));
	d->r[i].start = start;
	d->r[i].end = end;
	d->n++;
	if (d->n > DSET_MAX)
		dset_squeeze(d);
	return 0;
}

void dset_clear(struct dset *d)
{
	d->n = 0;
	if (d->cap > 64) {	/* a burst of scattered writes: give it back */
		free(d->r);
		d->r = NULL;
		d->cap = 0;
	}
}

void dset_free(struct dset *d)
{
	free(d->r);
	memset(d, 0, sizeof(*d));
}

int dset_dup(const struct dset *src, struct drange **out, uint32_t *n)
{
	*out = NULL;
	*n = src->n;
	if (!src->n)
		return 0;
	*out = malloc(src->n * sizeof(**out));
	if (!*out)
		return -ENOMEM;
	memcpy(*out, src->r, src->n * sizeof(**out));
	return 0;
}

uint64_t dset_bytes(const struct dset *d)
{
	uint64_t b = 0;

	for (uint32_t i = 0; i < d->n; i++)
		b += d->r[i].end - d->r[i].start;
	return b;
}

int dedup_clone(int dst, uint64_t doff, int src, uint64_t soff, uint64_t len)
{
	struct file_clone_range r = {
		.src_fd = src, .src_offset = soff, .src_length = len, .dest_offset = doff,
	};

	if (!len)
		return 0;
	return ioctl(dst, FICLONERANGE, &r) < 0 ? -errno : 0;
}

int dedup_probe(int dirfd, uint32_t *blk, char *why, size_t wl)
{
	char a[64], b[64], *buf = NULL;
	struct statfs sfs;
	int fa, fb = -1, ret;

	snprintf(a, sizeof(a), ".tierfs.new.probe.%ld.a", (long)getpid());
	snprintf(b, sizeof(b), ".tierfs.new.probe.%ld.b", (long)getpid());
	unlinkat(dirfd, a, 0);
	unlinkat(dirfd, b, 0);
	fa = openat(dirfd, a, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fa < 0) {
		ret = -errno;
		snprintf(why, wl, "cannot create a probe file: %s", strerror(-ret));
		return ret;
	}
	fb = openat(dirfd, b, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fb < 0 || fstatfs(fa, &sfs) < 0) {
		ret = -errno;
		snprintf(why, wl, "cannot create a probe file: %s", strerror(-ret));
		goto out;
	}
	*blk = sfs.f_bsize >= 512 && sfs.f_bsize <= (1 << 20) &&
	       !(sfs.f_bsize & (sfs.f_bsize - 1)) ? (uint32_t)sfs.f_bsize : 4096;
	buf = calloc(1, *blk);
	if (!buf) {
		ret = -ENOMEM;
		snprintf(why, wl, "out of memory");
		goto out;
	}
	memset(buf, 0x5a, *blk);
	if (pwrite(fa, buf, *blk, 0) != (ssize_t)*blk) {
		ret = -EIO;
		snprintf(why, wl, "cannot write a probe file");
		goto out;
	}
	ret = dedup_clone(fb, 0, fa, 0, *blk);
	if (ret)
		snprintf(why, wl, "its file system cannot share extents (FICLONERANGE: %s)",
			 strerror(-ret));
out:
	free(buf);
	close(fa);
	if (fb >= 0)
		close(fb);
	unlinkat(dirfd, a, 0);
	unlinkat(dirfd, b, 0);
	return ret;
}

/* ---- the chunk index ----------------------------------------------------- */

#define DD_NONE	UINT32_MAX

int dd_index_init(struct dd_index *x, uint64_t bytes)
{
	uint64_t per = sizeof(struct dd_ent) + 2 * sizeof(uint32_t);
	uint64_t cap = bytes / per;

	memset(x, 0, sizeof(*x));
	if (cap < 16)
		return 0;
	if (cap > UINT32_MAX / 2)
		cap = UINT32_MAX / 2;
	x->ent = calloc(cap, sizeof(*x->ent));
	x->bucket = malloc(2 * cap * sizeof(*x->bucket));
	if (!x->ent || !x->bucket) {
		dd_index_free(x);
		return -ENOMEM;
	}
	x->cap = (uint32_t)cap;
	x->nbucket = (uint32_t)(2 * cap);
	memset(x->bucket, 0xff, x->nbucket * sizeof(*x->bucket));
	return 0;
}

void dd_index_free(struct dd_index *x)
{
	free(x->ent);
	free(x->bucket);
	memset(x, 0, sizeof(*x));
}

static uint32_t dd_bucket(const struct dd_index *x, const struct dd_hash *h)
{
	return (uint32_t)(h->lo % x->nbucket);
}

/* Unlink entry i (about to be overwritten) from its chain. */
static void dd_unchain(struct dd_index *x, uint32_t i)
{
	uint32_t *p = &x->bucket[dd_bucket(x, &x->ent[i].h)];

	while (*p != DD_NONE && *p != i)
		p = &x->ent[*p].next;
	if (*p == i)
		*p = x->ent[i].next;
}

struct dd_src *dd_index_add(struct dd_index *x, const struct dd_hash *h,
			    struct dd_src *src, uint64_t off, uint32_t gen)
{
	struct dd_src *gone = NULL;
	uint32_t i, b;

	if (!x->cap)
		return NULL;
	i = x->head;
	x->head = (x->head + 1) % x->cap;
	if (x->count == x->cap) {	/* the oldest goes */
		struct dd_src *o = x->ent[i].src;

		dd_unchain(x, i);
		if (o && !o->retired)
			x->live--;
		if (o && --o->refs == 0)
			gone = o;
	} else {
		x->count++;
	}
	b = dd_bucket(x, h);
	x->ent[i] = (struct dd_ent){ .h = *h, .src = src, .off = off, .next = x->bucket[b],
				     .gen = gen };
	x->bucket[b] = i;
	src->refs++;
	x->live++;
	return gone;
}

bool dd_ent_valid(const struct dd_ent *d)
{
	const struct dd_src *s = d->src;
	uint64_t k;

	if (!s || s->retired || s->fd < 0 || !s->chunk)
		return false;
	k = d->off / s->chunk;
	return k < s->nchunks && (!s->cgen || d->gen >= s->cgen[k]);
}

const struct dd_ent *dd_index_find(const struct dd_index *x, const struct dd_hash *h,
				   uint32_t uid)
{
	if (!x->cap)
		return NULL;
	for (uint32_t i = x->bucket[dd_bucket(x, h)]; i != DD_NONE; i = x->ent[i].next) {
		const struct dd_ent *d = &x->ent[i];

		if (d->h.lo == h->lo && d->h.hi == h->hi && d->src && d->src->uid == uid &&
		    dd_ent_valid(d))
			return d;
	}
	return NULL;
}

uint64_t dd_index_bytes(const struct dd_index *x)
{
	return (uint64_t)x->cap * sizeof(*x->ent) + (uint64_t)x->nbucket * sizeof(*x->bucket);
}

void dd_hash_chunks(const uint8_t *p, uint64_t len, uint64_t chunk, struct dd_hash *out,
		    uint64_t first, uint64_t n)
{
	for (uint64_t i = first; i < first + n; i++) {
		uint64_t at = i * chunk, l = len - at < chunk ? len - at : chunk;
		XXH128_hash_t h = XXH3_128bits(p + at, l);

		out[i].lo = h.low64;
		out[i].hi = h.high64;
	}
}
