/*
 * hints.c - the restore queue: names appended by the fs side (restore
 * hints), bound to files as they come into being, consumed as files are
 * read to their end; the prefetch switch.
 *
 * Owns: e->hq_* and hint_* fields, f->hint_seq.  Everything here runs with
 * e->lock held; entry points take it.  Calls place.c (eng_defer_put).
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

/* ---- restore hints ---------------------------------------------------- */

/* e->lock held: the queue's head moved or an entry went; keep tickets. */
void eng_hint_head_update(struct engine *e)
{
	e->hint_head = e->hq_head ? e->hq_head->seq : e->hint_next;
	eng_wake(e);
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

void eng_hint_free(struct engine *e, struct hint *h)
{
	e->hq_gen++;
	if (h->file)
		eng_defer_put(e, h->file);
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
	eng_lock(e);
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
	eng_hint_head_update(e);
	eng_unlock(e);
	free(v);
	return 0;
}

void engine_hint_bind(struct engine *e, uint64_t dir, const char *name,
		      struct tfile *f)
{
	struct hint *h;

	eng_lock(e);
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
	eng_wake(e);
out:
	eng_unlock(e);
}

int engine_hint_list(struct engine *e, uint64_t dir, char *buf, size_t len)
{
	struct hint *h;
	size_t at = 0;

	eng_lock(e);
	for (h = e->hq_head; h; h = h->next)
		if (h->dir == dir)
			at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s\n", h->name);
	eng_unlock(e);
	return at >= len && at ? -ERANGE : (int)at;
}

void engine_hint_drop_dir(struct engine *e, uint64_t dir)
{
	struct hint **pp, *h;

	eng_lock(e);
	for (pp = &e->hq_head; (h = *pp);) {
		if (h->dir != dir) {
			pp = &h->next;
			continue;
		}
		*pp = h->next;
		if (h->file) {
			struct tfile *f = h->file;

			eng_hint_free(e, h);
			hint_reseq(e, f);
		} else {
			eng_hint_free(e, h);
		}
	}
	e->hq_tail = NULL;
	for (h = e->hq_head; h; h = h->next)
		e->hq_tail = h;
	eng_hint_head_update(e);
	eng_unlock(e);
}

void engine_prefetch_set(struct engine *e, bool on)
{
	eng_lock(e);
	e->prefetch_on = on;
	eng_wake(e);
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
 * e->lock held: f was read to its end.  Its copy becomes CONSUMED (first
 * to go at eviction) and its first queue entry is done.
 */
void eng_consume(struct engine *e, struct tfile *f)
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
			eng_hint_free(e, h);
			e->files_consumed++;
			break;
		}
	hint_reseq(e, f);
	eng_hint_head_update(e);
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
