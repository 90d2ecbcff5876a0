/*
 * persist_journal.c - the persist journal: the records that the queue
 * (persist_queue.c, persist_names.c) and the persister (persist_drain.c)
 * append to it, and its replay by the next daemon over the same backing
 * directory (persist_replay(), before any request), which queues again
 * what the previous one had not done and removes the temporaries it left
 * in DIR.
 *
 * Calls: persist_path.c only.  Locks: the records are written under
 * pq.lock (persist_jtemp() takes it, the others are called with it held);
 * the replay runs before the persister thread and any request, alone.
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
#include "../common/log.h"

/*
 * The journal, BACKING_DIR/.tierfs.persist.journal: every queued operation
 * is appended (kind, flags, path, path2, NUL-separated) and the file is
 * emptied whenever the queue is; a daemon that starts over the same backing
 * directory queues what it finds there first.  So a kill, or an unmount
 * that gave up on DIR, loses no copy and no removal: the next mount on
 * this node resumes them (copies then take the file now at that path).
 * Not synced: it survives the daemon, not the node (whose SSD is the
 * backing directory anyway).  Records: C, U, D, R (a queued copy,
 * unlink, rmdir, rename), I (an intent: a copy to make if the daemon
 * dies), X (the head operation done), Y and Z after a removal or rename
 * (the backing directory made it, or did not), T (a copy's temporary).
 */

/* Empty the journal if nothing is queued or about to be.  pq.lock held. */
void persist_jempty(void)
{
	if (pq.jfd >= 0 && !pq.head && !pq.intents && ftruncate(pq.jfd, 0) < 0)
		tlog(LOG_WARNING, "persist: cannot empty %s: %s", PJOURNAL, strerror(errno));
}

/* The head operation is done: a marker, so that a replay skips it (the
 * queue ends operations in order).  pq.lock held. */
void persist_jdone(void)
{
	static const char rec[] = "X0\0\0";	/* three strings, the last NUL too */

	if (pq.jfd >= 0 && write(pq.jfd, rec, sizeof(rec)) != sizeof(rec) && !pq.jerr) {
		pq.jerr = true;
		tlog(LOG_WARNING, "persist: cannot write %s: %s", PJOURNAL, strerror(errno));
	}
}

void persist_jappend(const struct pop *op)
{
	char rec[2 * PATH_MAX + 32];
	int n;

	if (pq.jfd < 0)
		return;
	n = snprintf(rec, sizeof(rec), "%c%u", op->started ? 'I' : "CUDR"[op->kind], op->flags);
	n++;
	n += snprintf(rec + n, sizeof(rec) - (size_t)n, "%s", op->path) + 1;
	n += snprintf(rec + n, sizeof(rec) - (size_t)n, "%s", op->path2 ? op->path2 : "") + 1;
	if (write(pq.jfd, rec, (size_t)n) != n && !pq.jerr) {
		pq.jerr = true;
		tlog(LOG_WARNING, "persist: cannot write %s: %s; a restart may miss "
		     "operations for %s", PJOURNAL, strerror(errno), pq.dir);
	}
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
	if (pq.jfd >= 0 && write(pq.jfd, rec, (size_t)n) != n && !pq.jerr) {
		pq.jerr = true;
		tlog(LOG_WARNING, "persist: cannot write %s: %s", PJOURNAL, strerror(errno));
	}
	pq_unlock();
}

/*
 * Where the name cur went through the namespace operations after op: its
 * new name, or NULL if it was removed or replaced (malloc'ed).
 */
static char *final_name(const struct pop *op, const char *cur)
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
 * file has after the replayed renames, or nowhere if it was removed.
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
		char *name = final_name(next, op->path);
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
	pq.tail = NULL;
	for (op = pq.head; op; op = op->next)
		pq.tail = op;
}

/* A journal of the queue as it is now (the replay reordered it), in place
 * of the old one, so that done-markers count in queue order again. */
static void jrewrite(void)
{
	int fd = openat(fs.root_fd, PJOURNAL ".new", O_RDWR | O_CREAT | O_TRUNC | O_APPEND |
			O_CLOEXEC, 0600), old = pq.jfd;

	if (fd < 0)
		return;
	pq.jfd = fd;
	for (struct pop *op = pq.head; op; op = op->next)
		persist_jappend(op);
	if (pq.jerr || renameat(fs.root_fd, PJOURNAL ".new", fs.root_fd, PJOURNAL) < 0) {
		tlog(LOG_WARNING, "persist: cannot rewrite %s", PJOURNAL);
		close(fd);
		unlinkat(fs.root_fd, PJOURNAL ".new", 0);
		pq.jfd = old;
		return;
	}
	close(old);
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

/* Queue what the journal of a previous daemon holds (before any request):
 * its operations less as many as it has done-markers (they end in order).
 * Over 100 lines: its three passes (temporaries and done-markers, the
 * records, the drops) share the buffer and the counts, and read in the
 * order the replay has. */
void persist_replay(void)
{
	char *buf, *p, *end, *kf, *path, *path2;
	unsigned long done = 0, n = 0;
	struct stat st;
	ssize_t got;

	if (fstat(pq.jfd, &st) < 0 || st.st_size == 0)
		return;
	buf = malloc((size_t)st.st_size + 1);
	if (!buf)
		return;
	got = pread(pq.jfd, buf, (size_t)st.st_size, 0);
	if (got < 0)
		got = 0;
	buf[got] = 0;
	end = buf + got;
	for (p = buf; p < end && jnext(&p, end, &kf, &path, &path2);) {
		done += kf[0] == 'X';
		if (kf[0] == 'T' && *path)
			remove_temp(path);
	}
	for (p = buf; p < end && jnext(&p, end, &kf, &path, &path2);) {
		static const char kinds[] = "CUDRI";	/* enum pkind, intent */
		const char *k = kf[0] ? strchr(kinds, kf[0]) : NULL;
		struct pop *op;

		if (kf[0] == 'Z' || kf[0] == 'Y') {
			/* the last removal or rename did not happen (Z, dropped
			 * below) or did (Y) */
			struct pop *last = NULL;

			for (op = pq.head; op; op = op->next)
				if (op->kind != P_COPY)
					last = op;
			if (last && kf[0] == 'Z')
				last->started = true;
			else if (last)
				last->made = true;
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
	free(buf);
	/* drop the cancelled, then the done (they end in order), then the
	 * removals and renames that the backing directory did not make */
	for (struct pop **pp = &pq.head, *op; (op = *pp);) {
		struct stat lst;
		bool drop = op->started;

		if (!drop && !op->journaled && done) {
			done--;
			drop = true;
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
	move_copies_last();
	jrewrite();
	if (n)
		tlog(LOG_NOTICE, "persist: resuming %lu operation%s that a previous daemon "
		     "queued for %s", n, n == 1 ? "" : "s", pq.dir);
}
