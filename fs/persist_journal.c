/*
 * persist_journal.c - the persistent tier's records in the backing
 * directory's one journal (notes, fs_journal.c and store/journal.c): what
 * the queue (persist_queue.c, persist_names.c) and the persister
 * (persist_drain.c) append, and their replay by the next daemon over the
 * same backing directory (persist_replay(), before any request), which
 * queues again what the previous one had not done and removes the
 * temporaries it left in DIR.  The journal file of earlier releases
 * (PJOURNAL) is read once, before the notes, for an upgrade.
 *
 * Calls: persist_path.c, and store/ for the notes (the journal that
 * fs_journal.c opened, fs.journal).  Locks: the
 * records are written under pq.lock (persist_jtemp() takes it, the others
 * are called with it held), then the journal's own (a leaf); the replay
 * runs before the persister thread and any request, alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "persist_int.h"
#include "journal.h"
#include "../common/log.h"

/*
 * The records, each a note of the backing directory's journal: every
 * queued operation is appended (kind, flags, path, path2, NUL-separated),
 * and the journal is told the notes are done with whenever the queue is
 * empty (it may then be emptied); a daemon that starts over the same
 * backing directory queues what the notes say first.  So a kill, or an
 * unmount that gave up on DIR, loses no copy and no removal: the next
 * mount on this node resumes them (copies then take the file now at that
 * path, or follow it where the mount renamed it since:
 * persist_follow_copy).  Not synced: they survive the daemon, and the node
 * where a later record's sync covers them (the backing directory is the
 * node's SSD anyway); a torn one ends the journal's replay, as any
 * record's does.
 * Records: C, U, D, R (a queued copy, unlink, rmdir, rename), I (an
 * intent: a copy to make if the daemon dies), X (the head operation done),
 * Y and Z after a removal or rename (the backing directory made it, or did
 * not), T (a copy's temporary), S (the queue as a replay left it, whole,
 * in the same note: what came before is replaced by it).
 */

/* Append p (n bytes) to the journal as a note (not synced).  0 or -errno. */
static int note(const void *p, size_t n)
{
	struct iovec v = { (void *)p, n };
	uint64_t seq;

	return fs.journal ? jnl_append(fs.journal, JNL_NOTE, &v, 1, &seq) : -EBADF;
}

/* Append record rec (n bytes) as a note.  pq.lock held. */
static void jwrite(const char *rec, size_t n)
{
	int ret;

	if (!pq.jon)
		return;
	ret = note(rec, n);
	if (ret && !pq.jerr) {
		pq.jerr = true;
		tlog(LOG_WARNING, "persist: cannot write to the journal of %s: %s; a restart "
		     "may miss operations for %s", fs.opts.backing, strerror(-ret), pq.dir);
	}
}

/* The journal's notes are done with if nothing is queued or about to be.
 * pq.lock held. */
void persist_jempty(void)
{
	if (pq.jon && !pq.head && !pq.intents)
		jnl_notes_done(fs.journal);
}

/* The head operation is done: a marker, so that a replay skips it (the
 * queue ends operations in order).  pq.lock held. */
void persist_jdone(void)
{
	static const char rec[] = "X0\0\0";	/* three strings, the last NUL too */

	jwrite(rec, sizeof(rec));
}

/* The removal or rename just queued was made by the backing directory (Y),
 * or was not (Z: a replay drops it).  pq.lock held. */
void persist_jmade(bool made)
{
	static const char y[] = "Y0\0\0", z[] = "Z0\0\0";

	jwrite(made ? y : z, sizeof(y));
}

/* op's record at rec (cap bytes): its length, or 0 where it does not fit. */
static size_t op_rec(const struct pop *op, char *rec, size_t cap)
{
	int n = snprintf(rec, cap, "%c%u%c%s%c%s", op->started ? 'I' : "CUDR"[op->kind],
			 op->flags, 0, op->path, 0, op->path2 ? op->path2 : "");

	return n < 0 || (size_t)n >= cap ? 0 : (size_t)n + 1;
}

void persist_jappend(const struct pop *op)
{
	char rec[2 * PATH_MAX + 32];
	size_t n = op_rec(op, rec, sizeof(rec));

	if (n)
		jwrite(rec, n);
}

/*
 * A copy's temporary in DIR, before it is created: "T0", its path under
 * DIR.  Replay removes the temporaries of a killed daemon (a name that was
 * renamed into place meanwhile no longer exists); they count as no
 * operation.  The copy's operation is at the queue's head meanwhile, so the
 * journal is not emptied under it.
 */
void persist_jtemp(const char *rel, const char *tmp)
{
	char rec[PATH_MAX + 32];
	const char *slash = strrchr(rel, '/');
	int n, m;

	n = snprintf(rec, sizeof(rec), "T0") + 1;
	m = slash ? snprintf(rec + n, sizeof(rec) - (size_t)n, "%.*s/%s",
			     (int)(slash - rel), rel, tmp)
		  : snprintf(rec + n, sizeof(rec) - (size_t)n, "%s", tmp);
	if (m < 0 || (size_t)(n + m + 2) > sizeof(rec))
		return;
	n += m + 1;
	rec[n++] = 0;
	pq_lock();
	jwrite(rec, (size_t)n);
	pq_unlock();
}

/* See persist_int.h. */
char *persist_final_name(const struct pop *op, const char *cur)
{
	char *name = strdup(cur);

	for (; op && name; op = op->next) {
		const char *from = NULL, *to = NULL;

		if (op->kind == P_UNLINK || op->kind == P_RMDIR) {
			if (persist_covers(op->path, name)) {
				free(name);
				return NULL;
			}
			continue;
		}
		if (op->kind != P_RENAME)
			continue;
		if (persist_covers(op->path, name)) {
			from = op->path;
			to = op->path2;
		} else if ((op->flags & RENAME_EXCHANGE) && persist_covers(op->path2, name)) {
			from = op->path2;
			to = op->path;
		} else if (persist_covers(op->path2, name)) {
			free(name);	/* replaced by another file */
			return NULL;
		}
		if (from) {
			char buf[PATH_MAX];

			snprintf(buf, sizeof(buf), "%s%s", to, name + strlen(from));
			free(name);
			name = strdup(buf);
		}
	}
	return name;
}

/*
 * A copy in the journal names the file by the path it had; the file may
 * have been renamed after it (the live queue copies by inode, and the
 * rename moves the copy).  So a replayed copy goes last, to the name its
 * file has after the replayed renames, done ones too (a rename done in DIR
 * before the file had a copy there moved nothing: the copy must still go
 * to the new name), or nowhere if it was removed.  The done operations
 * leave the queue here, after the copies have followed them.
 */
static void move_copies_last(void)
{
	struct pop *op, *next, **pp = &pq.head, *copies = NULL, **ct = &copies;

	for (op = pq.head; op; op = next) {
		next = op->next;
		if (op->kind != P_COPY) {
			pp = &op->next;
			continue;
		}
		*pp = next;
		char *name = op->done ? NULL : persist_final_name(next, op->path);
		bool dup = false;

		for (struct pop *c = copies; name && c; c = c->next)
			dup = dup || !strcmp(c->path, name);
		if (!name || dup) {
			free(name);
			op_free(op);
			continue;
		}
		free(op->path);
		op->path = name;
		op->next = NULL;
		*ct = op;
		ct = &op->next;
		pq.backlog_files++;
	}
	*pp = copies;
	for (pp = &pq.head; (op = *pp);) {
		if (op->done) {
			*pp = op->next;
			op_free(op);
		} else {
			pp = &op->next;
		}
	}
	pq.tail = NULL;
	for (op = pq.head; op; op = op->next)
		pq.tail = op;
}

/*
 * The queue as it is now (the replay reordered it) as one note, S first,
 * in place of the notes before it, so that done-markers count in queue
 * order again: one record, so that a crash leaves it whole or not at all
 * (then the notes before it are replayed again).  false where it could
 * not be written.
 */
static bool jrewrite(void)
{
	size_t len = 5, cap = 4096, n;
	char *buf = malloc(cap), *nb;
	int ret;

	if (!buf)
		return false;
	memcpy(buf, "S0\0\0", 5);
	for (struct pop *op = pq.head; op; op = op->next) {
		if (cap - len < 2 * PATH_MAX + 32) {
			if (!(nb = realloc(buf, cap *= 2))) {
				free(buf);
				return false;
			}
			buf = nb;
		}
		n = op_rec(op, buf + len, cap - len);
		len += n;
	}
	ret = note(buf, len);
	free(buf);
	if (ret)
		tlog(LOG_WARNING, "persist: cannot write the resumed queue to the journal of "
		     "%s: %s", fs.opts.backing, strerror(-ret));
	return !ret;
}

/* The next record of the journal at *p (kind+flags, path, path2), or false. */
static bool jnext(char **p, char *end, char **kf, char **path, char **path2)
{
	*kf = *p;
	*path = *kf + strlen(*kf) + 1;
	if (*path >= end)
		return false;
	*path2 = *path + strlen(*path) + 1;
	if (*path2 >= end)
		return false;
	*p = *path2 + strlen(*path2) + 1;
	return true;
}

/* A temporary that a killed daemon left in DIR (a journal 'T' record). */
static void remove_temp(const char *rel)
{
	const char *b;
	int root, d;

	if (strncmp(persist_base_of(rel), PTMP_PREFIX, strlen(PTMP_PREFIX)) != 0)
		return;		/* not one of ours: garbage */
	root = persist_open_dir_root();
	d = root < 0 ? root : persist_walk_beneath(root, rel, true, &b, NULL, NULL);
	if (d >= 0 && unlinkat(d, b, 0) < 0 && errno != ENOENT)
		d = -errno;
	if (d < 0 && d != -ENOENT)
		tlog(LOG_WARNING, "persist: cannot remove the temporary %s/%s that a previous "
		     "daemon left: %s", pq.dir, rel, strerror(-d));
	if (d >= 0)
		close(d);
	if (root >= 0)
		close(root);
}

/*
 * The records a previous daemon left: the journal file of a release before
 * the one journal (PJOURNAL, older), then the notes of the one journal,
 * from the last S on (malloc'ed, NUL-terminated, *len bytes; NULL: none).
 * *legacy: PJOURNAL was there.
 */
static char *left_records(size_t *len, bool *legacy)
{
	size_t nlen, olen = 0;
	char *notes = jnl_take_notes(fs.journal, &nlen), *buf = NULL, *p, *end, *kf, *path;
	char *path2;
	char *from = notes;
	struct stat st;
	int fd = openat(fs.root_fd, PJOURNAL, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	*legacy = fd >= 0;
	if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0 &&
	    (buf = malloc((size_t)st.st_size + nlen + 1))) {
		ssize_t got = pread(fd, buf, (size_t)st.st_size, 0);

		olen = got > 0 ? (size_t)got : 0;
	}
	if (fd >= 0)
		close(fd);
	for (p = notes, end = notes + nlen; p && p < end && jnext(&p, end, &kf, &path, &path2);)
		if (kf[0] == 'S') {
			from = kf;	/* the queue, whole: what came before is in it */
			olen = 0;	/* PJOURNAL's too, first or not */
		}
	nlen -= (size_t)(from - notes);
	if (!buf)
		buf = malloc(nlen + 1);
	if (buf && nlen)
		memcpy(buf + olen, from, nlen);
	free(notes);
	if (buf)
		buf[olen + nlen] = 0;
	*len = olen + nlen;
	return buf;
}

/*
 * Replay's first pass over the records buf..end: the temporaries a killed
 * daemon left in DIR removed (T), and the done-markers (X) counted.
 * Returns their count.  Before any request, alone.
 */
static unsigned long replay_scan(char *buf, char *end)
{
	char *p, *kf, *path, *path2;
	unsigned long done = 0;

	for (p = buf; p < end && jnext(&p, end, &kf, &path, &path2);) {
		done += kf[0] == 'X';
		if (kf[0] == 'T' && *path)
			remove_temp(path);
	}
	return done;
}

/*
 * A Y or Z record: the last removal or rename queued so far did not happen
 * (Z, dropped by replay_drop) or did (Y).  Before any request, alone.
 */
static void replay_mark(char kind)
{
	struct pop *op, *last = NULL;

	for (op = pq.head; op; op = op->next)
		if (op->kind != P_COPY)
			last = op;
	if (last && kind == 'Z')
		last->started = true;
	else if (last)
		last->made = true;
}

/*
 * Replay's second pass over the records buf..end: each operation and
 * intent appended to the queue, as queue() would but already in the
 * journal; the Y and Z markers applied to the operation before them.
 * Stops at the first that cannot be allocated.  Before any request, alone.
 */
static void replay_queue(char *buf, char *end)
{
	char *p, *kf, *path, *path2;

	for (p = buf; p < end && jnext(&p, end, &kf, &path, &path2);) {
		static const char kinds[] = "CUDRI";	/* enum pkind, intent */
		const char *k = kf[0] ? strchr(kinds, kf[0]) : NULL;
		struct pop *op;

		if (kf[0] == 'Z' || kf[0] == 'Y') {
			replay_mark(kf[0]);
			continue;
		}
		if (!k || !*path)
			continue;	/* a marker, or garbage */
		op = calloc(1, sizeof(*op));
		if (!op || !(op->path = strdup(path)) ||
		    (*path2 && !(op->path2 = strdup(path2)))) {
			if (op)
				free(op->path);
			free(op);
			break;
		}
		op->kind = *k == 'I' ? P_COPY : (enum pkind)(k - kinds);
		op->flags = (unsigned)strtoul(kf + 1, NULL, 10);
		op->journaled = *k == 'I';	/* an intent: never queued, never done */
		op->next = NULL;	/* as queue(), but already in the journal */
		if (pq.tail)
			pq.tail->next = op;
		else
			pq.head = op;
		pq.tail = op;
	}
}

/*
 * Turn removal or rename op into a copy of its path, followed by a copy of
 * its path2 where it had one (and the copy can be allocated), each to
 * take the file now at that name.  Before any request, alone.
 */
static void replay_as_copies(struct pop *op)
{
	struct pop *c = op->path2 ? calloc(1, sizeof(*c)) : NULL;

	if (c && (c->path = op->path2)) {
		op->path2 = NULL;
		c->kind = P_COPY;
		c->journaled = true;	/* counts no done-marker */
		c->next = op->next;
		op->next = c;
	}
	free(op->path2);
	op->path2 = NULL;
	op->kind = P_COPY;
	op->flags = 0;
}

/*
 * Replay's third pass, over the queue it built: the first `done`
 * operations that are not intents marked done, the cancelled ones freed,
 * and the removals and renames the backing directory did not make turned
 * into copies (replay_as_copies); pq.tail set again.  Returns the number of
 * operations left to resume.  Before any request, alone.
 */
static unsigned long replay_drop(unsigned long done)
{
	unsigned long n = 0;

	/* drop the cancelled, then the done (they end in order: kept until
	 * the copies before them have followed them, move_copies_last), then
	 * the removals and renames that the backing directory did not make */
	for (struct pop **pp = &pq.head, *op; (op = *pp);) {
		struct stat lst;
		bool drop = op->started;

		if (!drop && !op->journaled && done) {
			done--;
			op->done = true;
			pp = &op->next;
			continue;
		}
		if (!drop && op->kind != P_COPY && !op->made &&
		    persist_backing_lstat(op->path, &lst) == 0) {
			/*
			 * Not known to be made (a kill between the change and
			 * its Y record), and the name is there: not made, or
			 * taken again since; either way the names it touches
			 * get their current files (copies, which go last; a
			 * directory is skipped).
			 */
			replay_as_copies(op);
		}
		if (drop) {
			*pp = op->next;
			op_free(op);
			continue;
		}
		op->journaled = false;
		n++;
		pp = &op->next;
	}
	pq.tail = NULL;
	for (struct pop *op = pq.head; op; op = op->next)
		pq.tail = op;
	return n;
}

/* Queue what the journal of a previous daemon holds (before any request):
 * its operations less as many as it has done-markers (they end in order).
 * Three passes over the same records, in the order the replay has:
 * temporaries and done-markers (replay_scan), the records (replay_queue),
 * the drops (replay_drop). */
void persist_replay(void)
{
	unsigned long done, n;
	size_t got;
	bool legacy;
	char *buf;

	buf = left_records(&got, &legacy);
	if (!buf || !got) {
		free(buf);
		if (legacy)
			unlinkat(fs.root_fd, PJOURNAL, 0);
		persist_jempty();
		return;
	}
	done = replay_scan(buf, buf + got);
	replay_queue(buf, buf + got);
	free(buf);
	n = replay_drop(done);
	move_copies_last();
	if (jrewrite() && legacy)
		unlinkat(fs.root_fd, PJOURNAL, 0);	/* in the journal now */
	persist_jempty();	/* nothing left to resume: done with them */
	if (n)
		tlog(LOG_NOTICE, "persist: resuming %lu operation%s that a previous daemon "
		     "queued for %s", n, n == 1 ? "" : "s", pq.dir);
}
