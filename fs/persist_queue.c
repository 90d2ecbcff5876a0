/*
 * persist_queue.c - the ordered queue of the persistent tier: its state
 * (pq: the queue, the journal's descriptor, the statistics), operations
 * put on it (a copy of a file to a path, a removal or a rename made
 * through the mount, fs_persist_remove_begin() ... fs_persist_ns_end()),
 * the whiteouts that queued removals are, and the counting of copies that
 * cannot be made (a path too long, a link on the way in DIR).
 *
 * Calls: persist_journal.c (each operation is in the journal before it is
 * queued), persist_path.c.  Locks: pq.lock (LR_PERSIST) guards the queue,
 * the journal's writes, the statistics and the inodes' pstate, perr, pq_n
 * and pcreated fields; it is taken under a file's tfile.lock and ilock,
 * fs.nslock, directories' ilocks and fs.lock (an inode freed), never with
 * pg.lock, and nothing but the log's lock is taken under it.  The hooks
 * queue under fs.nslock: the queue's order is the namespace's.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "persist_int.h"
#include "../common/log.h"

/* The queue, whether it is journalled, and the statistics (pq.lock). */
struct persist_queue pq = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
	.wait_s = 5.0,
};

/* Is rel removed through the mount, not yet in DIR?  pq.lock held. */
static bool whiteout(const char *rel)
{
	for (struct pop *op = pq.head; op; op = op->next) {
		if (op->kind == P_COPY)
			continue;
		if (persist_covers(op->path, rel))
			return true;
		if (op->kind == P_RENAME && (op->flags & RENAME_EXCHANGE) &&
		    persist_covers(op->path2, rel))
			return true;
	}
	return false;
}

bool persist_whiteout_locked(const char *rel)
{
	bool w;

	pq_lock();
	w = whiteout(rel);
	pq_unlock();
	return w;
}

/* ------------------------------------------------------------ the queue */

static void queue(struct pop *op)
{
	if (!op->journaled)
		persist_jappend(op);
	op->next = NULL;
	if (pq.tail)
		pq.tail->next = op;
	else
		pq.head = op;
	pq.tail = op;
	pthread_cond_broadcast(&pq.cond);
}

/* See persist_int.h.  A copy by path ran after its file was renamed
 * through the mount (a removal or rename queued after it, or still in
 * flight: those end first, briefly): the copy goes to the new name, after
 * the operations that move DIR's old copy there. */
void persist_follow_copy(const struct pop *op)
{
	struct timespec ts;
	struct pop *c;
	char *name;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 2;		/* a namespace operation is a system call */
	while (pq.ns_open && !pq.abort &&
	       pthread_cond_timedwait(&pq.cond, &pq.lock, &ts) == 0)
		;
	name = persist_final_name(op->next, op->path);
	if (!name || !strcmp(name, op->path)) {
		free(name);	/* removed, or gone without an operation here */
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		tlog(LOG_ERR, "persist: out of memory: %s not copied to %s", name, pq.dir);
		free(name);
		return;
	}
	c->kind = P_COPY;
	c->path = name;
	pq.backlog_files++;
	queue(c);
}

/* Queue a copy of in (path rel); w: a waiter for it, or NULL. */
void persist_queue_copy(struct fs_inode *in, const char *rel, struct pwait *w)
{
	struct pop *op = calloc(1, sizeof(*op));
	struct stat st;
	int fd;

	if (!op || !(op->path = strdup(rel))) {
		free(op);
		tlog(LOG_ERR, "persist: out of memory queueing %s", rel);
		if (w) {
			w->done = true;
			w->err = -ENOMEM;
		}
		return;
	}
	fd = fs_fd_hold(in);
	if (fd >= 0 && fstatat(fd, "", &st, AT_EMPTY_PATH) == 0)
		op->bytes = (uint64_t)st.st_size;
	fs_fd_release(in);
	fs_inode_get(in);
	op->in = in;
	op->kind = P_COPY;
	pq_lock();
	/*
	 * A queued copy of in to this name, not started, with no removal or
	 * rename queued after it that touches the name: it will take the
	 * current version to the name we want.  One is enough.  (After such
	 * an operation, the earlier copy's data ends where that operation
	 * moved it; rel, made again since, needs a copy of its own.)
	 */
	struct pop *same = NULL;

	for (struct pop *o = pq.head; o; o = o->next) {
		if (o->kind == P_COPY) {
			if (o->in == in && !o->started && !strcmp(o->path, rel))
				same = o;
		} else if (persist_covers(o->path, rel) ||
			   (o->path2 && persist_covers(o->path2, rel))) {
			same = NULL;
		}
	}
	if (same) {
		if (w) {
			w->next = same->waiters;
			same->waiters = w;
		}
		pq_unlock();
		op_free(op);
		return;
	}
	op->waiters = w;
	in->pq_n++;
	in->pstate = PS_PENDING;
	pq.backlog_files++;
	pq.backlog_bytes += op->bytes;
	queue(op);
	pq_unlock();
}

/*
 * A persistent file whose path cannot be said (longer than PATH_MAX): a
 * failed copy, counted once per file, in its state, and logged.
 */
void persist_path_failed(struct fs_inode *in, const char *name)
{
	bool first;

	pq_lock();
	first = in->pstate != PS_FAILED || in->perr != -ENAMETOOLONG;
	in->pstate = PS_FAILED;
	in->perr = -ENAMETOOLONG;
	if (first) {
		pq.errors++;
		pq.failed++;
		snprintf(pq.last_what, sizeof(pq.last_what), "%s", strerror(ENAMETOOLONG));
	}
	pq_unlock();
	if (first)
		tlog(LOG_ERR, "persist: .../%s: its path is longer than %d bytes: not copied "
		     "to %s", name, PATH_MAX, pq.dir);
}

/* A path of DIR with a link or a non-directory on its way: counted, and
 * logged once while it is the last one met. */
void persist_refused(const char *rel, int err)
{
	bool log;

	pq_lock();
	pq.errors++;
	pq.refused++;
	log = strncmp(pq.last_refused, rel, sizeof(pq.last_refused) - 1) != 0;
	if (log)
		snprintf(pq.last_refused, sizeof(pq.last_refused), "%.*s",
			 (int)sizeof(pq.last_refused) - 1, rel);
	pq_unlock();
	if (log)
		tlog(LOG_WARNING, "persist: %s/%s: %s on its way there: not followed",
		     pq.dir, rel, err == -ELOOP ? "a symbolic link" : "not a directory");
}

/*
 * A removal or rename is in the journal before the backing directory
 * changes (a kill right after the change must not let the old name come
 * back from DIR), and queued after it; if the change fails, a cancel
 * record follows.  A replay skips such an operation when the backing
 * directory still has its (source) name: the change did not happen, or a
 * new file took the name, whose own operations follow.
 */
static struct pop *ns_begin(enum pkind kind, const char *path, const char *path2,
			    unsigned flags)
{
	struct pop *op = calloc(1, sizeof(*op));

	if (!op || !(op->path = strdup(path)) || (path2 && !(op->path2 = strdup(path2)))) {
		tlog(LOG_ERR, "persist: out of memory: %s not applied to %s", path, pq.dir);
		if (op)
			free(op->path);
		free(op);
		return NULL;
	}
	op->kind = kind;
	op->flags = flags;
	pq_lock();
	persist_jappend(op);
	pq.ns_open++;		/* until fs_persist_ns_end */
	pq_unlock();
	op->journaled = true;
	return op;
}

struct pop *fs_persist_remove_begin(struct fs_inode *dir, const char *name, bool isdir)
{
	char drel[PATH_MAX], rel[PATH_MAX];

	if (!pq.dir || persist_rel_of(dir, drel, sizeof(drel)) ||
	    persist_join(rel, sizeof(rel), drel, name))
		return NULL;
	return ns_begin(isdir ? P_RMDIR : P_UNLINK, rel, NULL, 0);
}

struct pop *fs_persist_rename_begin(struct fs_inode *p, const char *name, struct fs_inode *np,
				    const char *nn, unsigned flags)
{
	char a[PATH_MAX], b[PATH_MAX], ra[PATH_MAX], rb[PATH_MAX];

	if (!pq.dir || persist_rel_of(p, a, sizeof(a)) || persist_rel_of(np, b, sizeof(b)) ||
	    persist_join(ra, sizeof(ra), a, name) || persist_join(rb, sizeof(rb), b, nn))
		return NULL;
	return ns_begin(P_RENAME, ra, rb, flags);
}

void fs_persist_ns_end(struct pop *op, bool done)
{
	if (!op)
		return;
	pq_lock();
	persist_jmade(done);
	pq.ns_open--;
	pthread_cond_broadcast(&pq.cond);	/* persist_follow_copy's wait */
	if (done) {
		queue(op);
		op = NULL;
	}
	pq_unlock();
	if (op)
		op_free(op);
}
