/*
 * fs_persist.c - the persistent tier: -o persist=DIR.
 *
 * DIR is a directory on a file system that every node shares (Lustre,
 * GPFS, NFS...).  A file is persistent when its own user.tierfs.persist
 * mark, or else its nearest marked directory's, says 1 (or, with
 * -o persist_all, when no mark says 0); the marks are xattrs of the
 * backing objects, so they outlive the daemon.
 *
 * One ordered queue of operations per mount, drained by one low-priority
 * thread, the persister:
 *  - COPY: after each commit of a persistent file's new version to the
 *    SSD (fs_version.c), copy the backing file (not the cache) to the same
 *    relative path under DIR: into a temporary .tierfs.persist.* name in
 *    the target directory, fsync, rename into place, so that DIR only ever
 *    holds complete versions.  The copy reads through an fd of the version
 *    it copies (a newer version replaces the name, not that fd); a version
 *    changed in place meanwhile (a hard-linked file) is copied again.  The
 *    path is the file's name when the commit was queued; the data is its
 *    current version when the copy runs, which is newer or the same.
 *  - UNLINK, RMDIR, RENAME: the namespace changes made through the mount,
 *    applied to DIR after every operation queued before them.
 * The hooks queue under fs.nslock, which every namespace change and commit
 * of the backing directory holds: the queue's order is theirs, and DIR
 * always holds the state of some prefix of it.
 *
 * A failed operation stays at the head and is retried with backoff; the
 * error is logged once per cause and counted.  Nothing of the mount ever
 * waits for the persister except user.tierfs.persist=sync and unmount
 * (at most -o persist_wait seconds; what is left is logged).
 *
 * Restart anywhere: a lookup that finds nothing in the backing directory
 * looks in DIR (fs_persist_fetch, which the inode table calls through
 * fs.inode_ops: this room is above it): a directory is made, a file is copied
 * into the backing directory (temporary name, fsync, rename) and then is
 * an ordinary file.  A name removed or renamed away through the mount, and
 * not yet so in DIR, is not brought back: the queued operation is its
 * whiteout.  Listings merge DIR's entries (fs_persist_snapshot).
 *
 * The tier's files (persist_int.h is what they share; they call each
 * other one way, top first):
 *  - fs_persist.c: options (fs_persist_setup), the xattrs (mark, state,
 *    persist=sync), user.tierfs.tier/state's words, the statistics;
 *  - persist_drain.c: the persister thread, its start and stop;
 *  - persist_names.c: which names of a file get a copy (hooks of commits,
 *    creations and intents; a hard-linked file's other names);
 *  - persist_fetch.c: fetch on restart, listings merged, rmdir's check;
 *  - persist_sets.c: checkpoint sets' records in DIR, their pruning;
 *  - persist_queue.c: the queue, its whiteouts, namespace operations;
 *  - persist_journal.c: the journal's records and its replay;
 *  - persist_pool.c: the pool of threads that asks DIR in bounded time;
 *  - persist_path.c: paths, marks, the walk beneath a root, the copy of
 *    data and attributes.
 *
 * Locks: pq.lock (LR_PERSIST, persist_queue.c) guards the queue, the
 * journal's writes, the statistics and the inodes' pstate, perr, pq_n and
 * pcreated fields; it is taken under a file's tfile.lock and ilock,
 * fs.nslock, directories' ilocks and fs.lock (an inode freed).  pg.lock
 * (LR_PERSIST_POOL, persist_pool.c) guards the pool of DIR's requests; it
 * is taken under fs.nslock and directories' ilocks.  The two are never
 * held together, and nothing but the log's lock is taken under either.
 * This file takes each briefly: pq.lock for an inode's state and the
 * statistics, pg.lock for the pool's.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "persist_int.h"
#include "../common/json.h"
#include "../common/log.h"

/* ------------------------------------------------------------ options */

static bool under(const char *path, const char *top)
{
	size_t l = strlen(top);

	return strncmp(path, top, l) == 0 && (path[l] == '/' || path[l] == 0 ||
					      (l == 1 && top[0] == '/'));
}

/* What the inode table asks of DIR (fs.h): a name the backing directory
 * lacks, an inode freed, a listing merged. */
static const struct fs_inode_ops persist_inode_ops = {
	.fetch = fs_persist_fetch,
	.forget = fs_persist_forget,
	.snapshot = fs_persist_snapshot,
	.readdir = fs_persist_readdir,
	.snap_free = fs_persist_snap_free,
};

/* What the namespace (fs_ns.c) and the version commits tell the queue
 * (fs.h): the tier reads the namespace's changes in their order. */
static const struct fs_ns_ops persist_ns_ops = {
	.name_begin = fs_persist_name_begin,
	.created = fs_persist_created,
	.released = fs_persist_released,
	.linked = fs_persist_linked,
	.remove_begin = fs_persist_remove_begin,
	.rename_begin = fs_persist_rename_begin,
	.end = fs_persist_ns_end,
	.may_rmdir = fs_persist_may_rmdir,
	.intent = fs_persist_intent,
	.intent_end = fs_persist_intent_end,
	.committed = fs_persist_committed,
};

/* "DIR: persist directory: why" into msg; returns err. */
static int refuse(int err, char *msg, size_t len, const char *dir, const char *why)
{
	snprintf(msg, len, "%s: persist directory: %s", dir, why);
	return err;
}

int fs_persist_setup(char *msg, size_t len)
{
	const char *dir = fs.opts.persist, *why = NULL;
	struct stat st;
	char *r;

	pq.all = fs.opts.persist_all;
	if (fs.opts.persist_wait >= 0)
		pq.wait_s = fs.opts.persist_wait;
	pq.bw = fs.opts.persist_bw;
	if (fs.opts.persist_timeout > 0)
		pg.timeout = fs.opts.persist_timeout;
	pq.keep = (unsigned)fs.opts.persist_keep;
	if (!dir)
		return 0;
	if (stat(dir, &st) < 0)
		return refuse(-errno, msg, len, dir, "cannot stat it (it must exist)");
	if (!S_ISDIR(st.st_mode))
		return refuse(-ENOTDIR, msg, len, dir, "not a directory");
	r = realpath(dir, NULL);
	if (!r)
		return refuse(-errno, msg, len, dir, "cannot resolve it");
	if (fs.opts.backing && (under(r, fs.opts.backing) || under(fs.opts.backing, r)))
		why = "must not contain or be inside the backing directory";
	else if (fs.opts.mountpoint && under(r, fs.opts.mountpoint))
		why = "must not be inside the mount point";
	if (why) {
		refuse(-EINVAL, msg, len, r, why);
		free(r);
		return -EINVAL;
	}
	pq.dir = r;
	fs.persist = true;
	fs.inode_ops = &persist_inode_ops;
	fs.ns_ops = &persist_ns_ops;
	return 0;
}

/* ------------------------------------------------------------ xattrs */

bool fs_persist_xattr(const char *name)
{
	return strcmp(name, TIERFS_XATTR_PERSIST) == 0;
}

int fs_persist_getx(struct fs_inode *in, char *buf, size_t len)
{
	char rel[PATH_MAX];
	int ret = persist_rel_of(in, rel, sizeof(rel));

	if (ret)
		return ret;
	return snprintf(buf, len, "%d", persist_marked(rel) ? 1 : 0);
}

static bool same_in_dir(struct fs_inode *in);

/*
 * Is in's current version (its data on the SSD: after its fsync) in DIR
 * under its name already?  Nothing of it queued or failed, nothing queued
 * that moves or removes its name or a directory above it, and DIR's file
 * of that name is of its size and modification time (copies keep it).
 */
static bool in_dir_already(struct fs_inode *in)
{
	char rel[PATH_MAX];
	bool quiet;

	fs_ns_lock();
	if (persist_rel_of(in, rel, sizeof(rel))) {
		fs_ns_unlock();
		return false;
	}
	pq_lock();
	quiet = in->pq_n == 0 && in->pstate != PS_FAILED;
	for (struct pop *op = pq.head; quiet && op; op = op->next)
		if (op->kind != P_COPY && (persist_covers(op->path, rel) ||
					   (op->path2 && persist_covers(op->path2, rel))))
			quiet = false;
	pq_unlock();
	fs_ns_unlock();
	return quiet && same_in_dir(in);
}

/* persist=sync: durable on the SSD, then in DIR (at once if it is). */
static int persist_sync(struct fs_inode *in)
{
	struct pwait w = { 0 };
	char rel[PATH_MAX];
	int ret;

	if (!pq.dir || !pq.started)
		return -EOPNOTSUPP;
	if (!S_ISREG(in->type))
		return -EINVAL;
	ret = tfile_fsync(&in->tf);
	if (ret)
		return ret;
	if (in_dir_already(in))
		return 0;
	fs_ns_lock();
	ret = persist_rel_of(in, rel, sizeof(rel));
	if (!ret)
		persist_queue_copy(in, rel, &w);
	fs_ns_unlock();
	if (ret)
		return ret;
	pq_lock();
	ret = -ECANCELED;
	while (!w.done && !pq.exited) {
		struct timespec ts;

		/* a DIR that hangs in the operation at work: give up */
		if (pq.head && pq.head->started &&
		    persist_now_ms() - __atomic_load_n(&pq.alive, __ATOMIC_RELAXED) >
		    (uint64_t)(pg.timeout * 1000.0)) {
			ret = -ETIMEDOUT;
			break;
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec++;
		pthread_cond_timedwait(&pq.done, &pq.lock, &ts);
	}
	if (w.done)
		ret = w.err;
	/* still queued (a failure): forget the waiter, it is on our stack */
	for (struct pop *op = pq.head; op; op = op->next) {
		struct pwait **pp = &op->waiters;

		while (*pp && *pp != &w)
			pp = &(*pp)->next;
		if (*pp)
			*pp = w.next;
	}
	pq_unlock();
	return ret;
}

int fs_persist_setx(struct fs_inode *in, const char *value, size_t size)
{
	char path[64], v[8];
	int fd, ret;

	if (size >= sizeof(v))
		return -EINVAL;
	memcpy(v, value, size);
	v[size] = 0;
	if (size && v[size - 1] == '\n')
		v[size - 1] = 0;
	if (!strcmp(v, "sync"))
		return persist_sync(in);
	if (strcmp(v, "1") && strcmp(v, "0"))
		return -EINVAL;
	if (!S_ISREG(in->type) && !S_ISDIR(in->type))
		return -EINVAL;
	fs_ns_lock();		/* not while a new version is committed */
	fd = fs_fd_hold(in);
	ret = fd < 0 ? fd : fs_proc_path(fd, path, sizeof(path));
	if (!ret && setxattr(path, TIERFS_XATTR_PERSIST, v, 1, 0) < 0)
		ret = -errno;
	fs_fd_release(in);
	fs_ns_unlock();
	/* a file already on the SSD is copied now; a dirty one after its flush */
	if (!ret && v[0] == '1' && S_ISREG(in->type) && pq.started) {
		uint64_t sz;
		struct timespec mt;

		if (!tfile_attr(&in->tf, &sz, &mt)) {
			char rel[PATH_MAX];

			fs_ns_lock();
			if (!persist_rel_of(in, rel, sizeof(rel)))
				persist_queue_copy(in, rel, NULL);
			fs_ns_unlock();
		}
	}
	return ret;
}

int fs_persist_removex(struct fs_inode *in)
{
	char path[64];
	int fd, ret;

	fs_ns_lock();
	fd = fs_fd_hold(in);
	ret = fd < 0 ? fd : fs_proc_path(fd, path, sizeof(path));
	if (!ret && removexattr(path, TIERFS_XATTR_PERSIST) < 0)
		ret = -errno;
	fs_fd_release(in);
	fs_ns_unlock();
	return ret;
}

static void append(char *buf, size_t len, const char *s)
{
	size_t at = strlen(buf);

	snprintf(buf + at, at < len ? len - at : 0, "%s%s", at ? "," : "", s);
}

/* A file that no copy of this daemon's went to DIR: is DIR's the same
 * version (size and modification time; copies keep it)? */
static int job_stat(struct pjob *j)
{
	const char *b;
	int root = persist_open_dir_root(), d, ret = 0;

	if (root < 0)
		return root;
	d = persist_walk_beneath(root, j->rel, true, &b, NULL, NULL);
	close(root);
	if (d < 0)
		return d;
	if (fstatat(d, b, &j->st, AT_SYMLINK_NOFOLLOW) < 0)
		ret = -errno;
	close(d);
	return ret;
}

static bool same_in_dir(struct fs_inode *in)
{
	struct stat a, *b;
	struct pjob *j = persist_pjob_new(job_stat);
	int fd;
	bool ok;

	if (!j)
		return false;
	if (persist_rel_of(in, j->rel, sizeof(j->rel))) {
		persist_pjob_put(j);
		return false;
	}
	fd = fs_fd_hold(in);
	ok = fd >= 0 && fstatat(fd, "", &a, AT_EMPTY_PATH) == 0;
	fs_fd_release(in);
	b = &j->st;
	ok = ok && persist_pg_run(j, "the state xattr") && j->ret == 0 && S_ISREG(b->st_mode) &&
	     a.st_size == b->st_size && a.st_mtim.tv_sec == b->st_mtim.tv_sec &&
	     a.st_mtim.tv_nsec == b->st_mtim.tv_nsec;
	persist_pjob_put(j);
	return ok;
}

void fs_persist_describe(struct fs_inode *in, char *tier, size_t tl, char *state, size_t sl)
{
	static const char *const names[] = { "", "PENDING", "PERSISTED", "FAILED" };
	char s[32];
	int ps;

	if (!pq.dir || !S_ISREG(in->type))
		return;
	pq_lock();
	ps = in->pstate;
	pq_unlock();
	if (ps == PS_NONE && same_in_dir(in))
		ps = PS_PERSISTED;
	if (ps == PS_NONE)
		return;
	if (ps == PS_PERSISTED)
		append(tier, tl, "pfs");
	snprintf(s, sizeof(s), "pfs:%s", names[ps]);
	append(state, sl, s);
}

void fs_persist_stats_put(struct json *j)
{
	uint64_t timeouts;
	bool hung;

	if (!pq.dir)
		return;
	pg_lock();
	hung = pg.hung;
	timeouts = pg.timeouts;
	pg_unlock();
	pq_lock();
	json_obj(j, "persist");
	json_str(j, "dir", pq.dir);	/* any byte a path can hold: escaped */
	json_u64(j, "backlog_files", pq.backlog_files);
	json_u64(j, "backlog_bytes", pq.backlog_bytes);
	json_u64(j, "files_persisted", pq.files);
	json_u64(j, "bytes_persisted", pq.bytes);
	json_u64(j, "namespace_ops", pq.ops);
	json_u64(j, "skipped", pq.skipped);
	json_u64(j, "errors", pq.errors);
	json_str(j, "last_error", pq.last_what);
	json_str(j, "state", hung ? "not answering" : pq.last_err ? "retrying" : "ok");
	json_num(j, "bandwidth", pq.busy_s > 0 ? (double)pq.bytes / pq.busy_s : 0.0, 0);
	json_u64(j, "bw_cap", pq.bw);
	json_u64(j, "files_fetched", pq.fetched_files);
	json_u64(j, "bytes_fetched", pq.fetched_bytes);
	json_bool(j, "dir_answers", !hung);
	json_u64(j, "timeouts", timeouts);
	json_u64(j, "pruned", pq.pruned);
	json_u64(j, "keep", pq.keep);
	json_u64(j, "failed", pq.failed);
	json_u64(j, "refused", pq.refused);
	json_close(j);
	pq_unlock();
}
