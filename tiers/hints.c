/*
 * hints.c - the restore queue: names appended by the fs side (restore
 * hints), bound to files as they come into being, consumed as their
 * readers are done with them; the prefetch switch.
 *
 * A file's first entry is consumed when its reader is done with it,
 * whichever comes first: a read reaches its end (eng_read_done), or its
 * last handle is released after a read made while that entry was queued
 * (tfile_last_close: a partial reader, or a mapping, whose munmap comes as
 * the last release).  f->read_ticket remembers the queue's last ticket at
 * the latest such read; f->consumed_open that the file was consumed since
 * its last close, so a reader that read it to its end does not consume a
 * second entry when it closes.  An entry that leaves the queue any other
 * way (cleared, its directory removed) takes with it what was kept for it:
 * a file left without entries has its prefetched copies unpinned
 * (hint_unpin), evictable at once.
 *
 * Owns: e->hq_* and hint_* fields, f->hint_seq, f->hint_first/last,
 * f->read_ticket, f->consumed_open.
 * Everything here runs with e->lock held; entry points take it.  Calls
 * place.c (eng_defer_put).
 *
 * Any user who may write a directory appends to the queue, so two things
 * are bounded.  Its size: per uid (cfg.hint_max_user, unless the fs side
 * says the caller is exempt) and per mount (cfg.hint_max); a write past
 * either is refused whole with -EDQUOT.  And the cost of an entry to the
 * requests of others: the queue is one list in ticket order, and three
 * indexes let no request walk all of it:
 *   - each file's entries (f->hint_first..hint_last): consuming a file,
 *     unlinking one, O(its entries);
 *   - entries without a file, hashed by (directory, name) (e->hq_ub): a
 *     lookup or create binds its name's entries, O(its bucket);
 *   - each directory's entries (e->hq_dirs): listing and dropping them,
 *     O(that directory's entries).
 * Every list is doubly linked, so an entry leaves each in O(1).  The hash
 * is seeded at random per engine, so which names share a bucket is not
 * known in advance; both tables double when their load passes one.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "engine_int.h"

/* ---- hashing ------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/*
 * The seed of both hashes, random per engine, made by engine_create before
 * any thread can hash (names are hashed outside e->lock: a seed made on
 * first use could be made twice, and a directory filed under one looked
 * for under the other).
 */
void eng_hint_init(struct engine *e)
{
	uint64_t s = 0;

	if (getrandom(&s, sizeof(s), GRND_NONBLOCK) != sizeof(s))
		s = (uint64_t)getpid() ^ (uint64_t)(uintptr_t)e;
	e->hq_seed = s | 1;
}

static uint64_t hint_seed(struct engine *e)
{
	return e->hq_seed;
}

static uint64_t dir_hash(struct engine *e, uint64_t dir)
{
	return mix64(dir ^ hint_seed(e));
}

static uint64_t name_hash(struct engine *e, uint64_t dir, const char *name)
{
	uint64_t h = dir_hash(e, dir);

	for (; *name; name++)
		h = (h ^ (unsigned char)*name) * 0x100000001b3ull;
	return mix64(h);
}

/* ---- per-uid budgets ---------------------------------------------------- */

/*
 * The uid's count, or NULL.  Linear: one record per uid with entries in the
 * queue, and only root makes new uids.
 */
static struct hint_user *user_find(struct engine *e, uid_t uid)
{
	size_t i;

	for (i = 0; i < e->hq_nusers; i++)
		if (e->hq_users[i].uid == uid)
			return &e->hq_users[i];
	return NULL;
}

static struct hint_user *user_get(struct engine *e, uid_t uid)
{
	struct hint_user *u = user_find(e, uid);

	if (u)
		return u;
	if (e->hq_nusers == e->hq_usercap) {
		size_t cap = e->hq_usercap ? 2 * e->hq_usercap : 8;
		struct hint_user *nu = realloc(e->hq_users, cap * sizeof(*nu));

		if (!nu)
			return NULL;
		e->hq_users = nu;
		e->hq_usercap = cap;
	}
	u = &e->hq_users[e->hq_nusers++];
	u->uid = uid;
	u->n = 0;
	return u;
}

static void user_put(struct engine *e, uid_t uid)
{
	struct hint_user *u = user_find(e, uid);

	assert(u && u->n);
	if (--u->n == 0)
		*u = e->hq_users[--e->hq_nusers];
}

/* ---- entries without a file, by (dir, name) ---------------------------- */

static struct hint_bucket *ub_bucket(struct engine *e, uint64_t hash)
{
	return &e->hq_ub[hash & (e->hq_ubsize - 1)];
}

/* Append h to the tail of its bucket list (it is the newest there). */
static void bucket_append(struct hint_bucket *b, struct hint *h)
{
	h->fnext = NULL;
	h->fprev = b->tail;
	if (b->tail)
		b->tail->fnext = h;
	else
		b->head = h;
	b->tail = h;
}

/*
 * Room for `want` entries at a load of at most one.  -ENOMEM only where
 * there is no table at all; a table that cannot grow is merely slower.
 * Doubling keeps each bucket in ticket order: the entries of one old
 * bucket are dealt, in order, to two new ones.
 */
static int ub_reserve(struct engine *e, uint64_t want)
{
	size_t size = e->hq_ubsize ? e->hq_ubsize : 64, i;
	struct hint_bucket *nb;

	while (size < want)
		size *= 2;
	if (size == e->hq_ubsize)
		return 0;
	nb = calloc(size, sizeof(*nb));
	if (!nb)
		return e->hq_ubsize ? 0 : -ENOMEM;
	for (i = 0; i < e->hq_ubsize; i++) {
		struct hint *h = e->hq_ub[i].head, *next;

		for (; h; h = next) {
			next = h->fnext;
			bucket_append(&nb[h->hash & (size - 1)], h);
		}
	}
	free(e->hq_ub);
	e->hq_ub = nb;
	e->hq_ubsize = size;
	return 0;
}

static void ub_remove(struct engine *e, struct hint *h)
{
	struct hint_bucket *b = ub_bucket(e, h->hash);

	if (h->fprev)
		h->fprev->fnext = h->fnext;
	else
		b->head = h->fnext;
	if (h->fnext)
		h->fnext->fprev = h->fprev;
	else
		b->tail = h->fprev;
	h->fnext = h->fprev = NULL;
	e->hq_unbound--;
}

/* ---- each file's entries ----------------------------------------------- */

/* Link h (without a file) to f, in ticket order (the caller gives the
 * entry its reference to f).  O(1) when h is f's newest entry, as
 * appending makes it, and binding too (a new file has no entries). */
static void file_link(struct tfile *f, struct hint *h)
{
	struct hint *at = f->hint_last;

	while (at && at->seq > h->seq)
		at = at->fprev;
	h->fprev = at;
	h->fnext = at ? at->fnext : f->hint_first;
	if (h->fprev)
		h->fprev->fnext = h;
	else
		f->hint_first = h;
	if (h->fnext)
		h->fnext->fprev = h;
	else
		f->hint_last = h;
	h->file = f;
	f->hint_seq = f->hint_first->seq;
}

static void file_unlink(struct hint *h)
{
	struct tfile *f = h->file;

	if (h->fprev)
		h->fprev->fnext = h->fnext;
	else
		f->hint_first = h->fnext;
	if (h->fnext)
		h->fnext->fprev = h->fprev;
	else
		f->hint_last = h->fprev;
	h->fnext = h->fprev = NULL;
	f->hint_seq = f->hint_first ? f->hint_first->seq : 0;
}

/* ---- each directory's entries ------------------------------------------ */

static struct hint_dir *dir_find(struct engine *e, uint64_t dir)
{
	struct hint_dir *d;

	if (!e->hq_dsize)
		return NULL;
	for (d = e->hq_dirs[dir_hash(e, dir) & (e->hq_dsize - 1)]; d; d = d->hnext)
		if (d->key == dir)
			return d;
	return NULL;
}

/* The record of dir, made if need be; NULL: out of memory. */
static struct hint_dir *dir_get(struct engine *e, uint64_t dir)
{
	struct hint_dir *d = dir_find(e, dir), **slot;

	if (d)
		return d;
	if (e->hq_ndirs + 1 > e->hq_dsize) {	/* grow: load at most one */
		size_t size = e->hq_dsize ? 2 * e->hq_dsize : 16, i;
		struct hint_dir **nd = calloc(size, sizeof(*nd));

		if (nd) {
			for (i = 0; i < e->hq_dsize; i++) {
				struct hint_dir *x = e->hq_dirs[i], *next;

				for (; x; x = next) {
					next = x->hnext;
					slot = &nd[dir_hash(e, x->key) & (size - 1)];
					x->hnext = *slot;
					*slot = x;
				}
			}
			free(e->hq_dirs);
			e->hq_dirs = nd;
			e->hq_dsize = size;
		} else if (!e->hq_dsize) {
			return NULL;
		}
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->key = dir;
	slot = &e->hq_dirs[dir_hash(e, dir) & (e->hq_dsize - 1)];
	d->hnext = *slot;
	*slot = d;
	e->hq_ndirs++;
	return d;
}

static void dir_unlink(struct engine *e, struct hint *h)
{
	struct hint_dir *d = h->hd, **pp;

	if (h->dprev)
		h->dprev->dnext = h->dnext;
	else
		d->head = h->dnext;
	if (h->dnext)
		h->dnext->dprev = h->dprev;
	else
		d->tail = h->dprev;
	if (d->head)
		return;
	for (pp = &e->hq_dirs[dir_hash(e, d->key) & (e->hq_dsize - 1)]; *pp != d;
	     pp = &(*pp)->hnext)
		;
	*pp = d->hnext;
	e->hq_ndirs--;
	free(d);
}

/* ---- the queue ----------------------------------------------------------- */

/* e->lock held: the queue's head moved or an entry went; keep tickets.
 * Prefetch distances moved (eviction protects by them): eng_room(), which
 * wakes the prefetcher too. */
void eng_hint_head_update(struct engine *e)
{
	e->hint_head = e->hq_head ? e->hq_head->seq : e->hint_next;
	eng_room(e);
}

/*
 * e->lock held: take h out of the queue and every index, release its file
 * (deferred) and its place in its user's budget, free it.  The caller
 * updates the head (eng_hint_head_update).
 */
void eng_hint_remove(struct engine *e, struct hint *h)
{
	if (h->prev)
		h->prev->next = h->next;
	else
		e->hq_head = h->next;
	if (h->next)
		h->next->prev = h->prev;
	else
		e->hq_tail = h->prev;
	dir_unlink(e, h);
	if (h->file) {
		file_unlink(h);
		eng_defer_put(e, h->file);
	} else {
		ub_remove(e, h);
	}
	user_put(e, h->uid);
	e->hq_gen++;
	e->hq_len--;
	free(h);
}

/*
 * e->lock held: nothing in the queue wants f's cached copies any more
 * (its last entry left without being consumed).  What the prefetcher kept
 * for it goes back to the eviction policy: a copy held until read
 * (READ_COMPLETE) is CONSUMED, the first to go, and none stays promoted (a
 * copy still being written becomes FLUSHED, not READ_COMPLETE, once
 * flushed).  A prefetch of f still running sees the same when it ends
 * (prefetch.c).
 */
static void hint_unpin(struct engine *e, struct tfile *f)
{
	int i;

	for (i = 0; i < e->ntiers; i++) {
		struct copy *cp = f->copy[i];

		if (!cp)
			continue;
		cp->promoted = false;
		if (cp->state == TS_READ_COMPLETE)
			tier_set_state(&cp->state, TS_CONSUMED);
	}
	eng_room(e);		/* they may be evicted now */
}

/* e->lock held: h leaves the queue unconsumed (cleared, its directory
 * gone); a file left without entries is unpinned.  As eng_hint_remove. */
static void hint_withdraw(struct engine *e, struct hint *h)
{
	struct tfile *f = h->file;

	if (f && f->hint_first == h && f->hint_last == h)
		hint_unpin(e, f);
	eng_hint_remove(e, h);
}

/*
 * e->lock held: f is gone (unlinked).  Its entries wait, without a file,
 * for the next file of their name, as entries written before it do.
 * They go back into their buckets in ticket order: f's entries from the
 * newest, each bucket walked backwards from its tail once.
 */
void eng_hint_unbind_file(struct engine *e, struct tfile *f)
{
	struct hint *h, *prev;

	for (h = f->hint_last; h; h = prev) {
		struct hint_bucket *b = ub_bucket(e, h->hash);
		struct hint *at = b->tail;

		prev = h->fprev;
		file_unlink(h);
		h->file = NULL;
		eng_defer_put(e, f);
		while (at && at->seq > h->seq)
			at = at->fprev;
		h->fprev = at;
		h->fnext = at ? at->fnext : b->head;
		if (h->fprev)
			h->fprev->fnext = h;
		else
			b->head = h;
		if (h->fnext)
			h->fnext->fprev = h;
		else
			b->tail = h;
		e->hq_unbound++;
	}
	f->hint_seq = 0;
}

/* engine_destroy, no thread left: free every entry and index. */
void eng_hint_destroy(struct engine *e)
{
	while (e->hq_head)
		eng_hint_remove(e, e->hq_head);
	free(e->hq_ub);
	free(e->hq_dirs);
	free(e->hq_users);
	e->hq_ub = NULL;
	e->hq_dirs = NULL;
	e->hq_users = NULL;
	e->hq_ubsize = e->hq_dsize = e->hq_nusers = e->hq_usercap = 0;
}

int engine_hint_append(struct engine *e, uint64_t dir, uid_t uid, bool user_bound,
		       const char *const *names, struct tfile *const *files, size_t n)
{
	uint64_t max = e->cfg.hint_max ? e->cfg.hint_max : ENGINE_HINT_MAX;
	uint64_t umax = e->cfg.hint_max_user ? e->cfg.hint_max_user : ENGINE_HINT_MAX_USER;
	struct hint **v = calloc(n ? n : 1, sizeof(*v));
	struct hint_user *u;
	struct hint_dir *d;
	size_t i, unbound = 0;
	int ret = 0;

	if (!v)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		size_t l = strlen(names[i]) + 1;

		v[i] = malloc(sizeof(struct hint) + l);
		if (!v[i]) {
			ret = -ENOMEM;
			goto free_entries;
		}
		memcpy(v[i]->name, names[i], l);
		v[i]->hash = name_hash(e, dir, names[i]);
		unbound += !files[i];
	}
	eng_lock(e);
	/*
	 * Every check, and every allocation that can fail, before the first
	 * change: a refused write appends nothing.  EDQUOT rather than ENOSPC:
	 * what ran out is an allowance of the caller (or of all callers), not
	 * room on the file system, which ENOSPC would tell an application.
	 */
	u = user_find(e, uid);
	if (e->hq_len + n > max || (user_bound && (u ? u->n : 0) + n > umax)) {
		ret = -EDQUOT;
		goto unlock;
	}
	u = user_get(e, uid);
	d = NULL;
	if (u && (!unbound || !ub_reserve(e, e->hq_unbound + unbound)))
		d = dir_get(e, dir);
	if (!d) {
		ret = -ENOMEM;
		if (u && !u->n)		/* made for this call */
			*u = e->hq_users[--e->hq_nusers];
		goto unlock;
	}
	for (i = 0; i < n; i++) {
		struct hint *h = v[i];

		h->seq = ++e->hint_next;
		h->dir = dir;
		h->uid = uid;
		h->hd = d;
		h->next = NULL;
		h->prev = e->hq_tail;
		if (e->hq_tail)
			e->hq_tail->next = h;
		else
			e->hq_head = h;
		e->hq_tail = h;
		h->dnext = NULL;
		h->dprev = d->tail;
		if (d->tail)
			d->tail->dnext = h;
		else
			d->head = h;
		d->tail = h;
		h->file = NULL;
		if (files[i]) {
			file_link(files[i], h);
		} else {
			bucket_append(ub_bucket(e, h->hash), h);
			e->hq_unbound++;
		}
		e->hq_len++;
	}
	u->n += n;
	eng_hint_head_update(e);
	eng_unlock(e);
	free(v);
	return 0;
unlock:
	eng_unlock(e);
	i = n;
free_entries:
	while (i--)
		free(v[i]);
	free(v);
	return ret;
}

void engine_hint_bind(struct engine *e, uint64_t dir, const char *name,
		      struct tfile *f)
{
	struct hint *h, *next;
	uint64_t hash;

	eng_lock(e);
	if (!e->hq_unbound)
		goto out;
	hash = name_hash(e, dir, name);
	for (h = ub_bucket(e, hash)->head; h; h = next) {
		next = h->fnext;
		if (h->hash != hash || h->dir != dir || strcmp(h->name, name))
			continue;
		ub_remove(e, h);
		file_link(f, h);
		f->ops->get(f);
	}
	eng_prefetch_work(e);	/* entries with a file now */
out:
	eng_unlock(e);
}

int engine_hint_list(struct engine *e, uint64_t dir, char *buf, size_t len)
{
	struct hint_dir *d;
	struct hint *h;
	size_t at = 0;

	eng_lock(e);
	d = dir_find(e, dir);
	for (h = d ? d->head : NULL; h; h = h->dnext)
		at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s\n", h->name);
	eng_unlock(e);
	return at >= len && at ? -ERANGE : (int)at;
}

int engine_hint_list_page(struct engine *e, uint64_t dir, uint64_t index, char *buf,
			  size_t len)
{
	struct hint_dir *d;
	struct hint *h;
	uint64_t at = 0;
	size_t n = 0;

	eng_lock(e);
	d = dir_find(e, dir);
	h = d ? d->head : NULL;
	/* go on from where the page before stopped, if nothing was freed */
	if (d && d->list_h && d->list_gen == e->hq_gen && d->list_at <= index) {
		h = d->list_h;
		at = d->list_at;
	}
	for (; h && at < index; h = h->dnext)
		at++;
	for (; h; h = h->dnext, at++) {
		size_t l = strlen(h->name);

		if (n + l + 1 > len)
			break;
		memcpy(buf + n, h->name, l);
		buf[n + l] = '\n';
		n += l + 1;
	}
	if (d) {
		d->list_h = h;
		d->list_at = at;
		d->list_gen = e->hq_gen;
	}
	eng_unlock(e);
	return (int)n;
}

void engine_hint_drop_dir(struct engine *e, uint64_t dir)
{
	struct hint_dir *d;

	eng_lock(e);
	/* the record goes with its last entry */
	while ((d = dir_find(e, dir)))
		hint_withdraw(e, d->head);
	eng_hint_head_update(e);
	eng_unlock(e);
}

void engine_prefetch_set(struct engine *e, bool on)
{
	eng_lock(e);
	e->prefetch_on = on;
	eng_prefetch_work(e);
	eng_unlock(e);
}

bool engine_prefetch_get(struct engine *e)
{
	bool on;

	eng_lock(e);
	on = e->prefetch_on;
	eng_unlock(e);
	return on;
}

/*
 * e->lock held: f's reader is done with it (read to its end, or its last
 * close after a read).  Its copy becomes CONSUMED (first to go at
 * eviction) and its first queue entry is done.
 */
void eng_consume(struct engine *e, struct tfile *f)
{
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
	eng_room(e);		/* they may be evicted now */
	f->read_ticket = 0;
	f->consumed_open = true;
	if (!f->hint_first)
		return;
	eng_hint_remove(e, f->hint_first);
	e->files_consumed++;
	eng_hint_head_update(e);
}

/*
 * e->lock held: a read of f returned n bytes from off.  Read to its end:
 * consumed now.  Otherwise, a read with bytes counts towards consumption
 * at the last close, for the entries queued by now (the queue's last
 * ticket), unless f was consumed since its last close.
 */
void eng_read_done(struct engine *e, struct tfile *f, off_t off, size_t n)
{
	if (read_to_end(f, off, n))
		eng_consume(e, f);
	else if (n && !f->consumed_open)
		f->read_ticket = e->hint_next;
}

void tfile_last_close(struct tfile *f)
{
	struct engine *e = f->eng;

	eng_lock(e);
	if (!f->consumed_open && f->read_ticket && f->hint_first &&
	    f->hint_first->seq <= f->read_ticket)
		eng_consume(e, f);
	f->read_ticket = 0;
	f->consumed_open = false;
	eng_unlock(e);
}

/* Prefetch distance now: queue entries at the head already cached. */
uint64_t eng_prefetch_distance(struct engine *e)
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
