/*
 * persist_drain.c - the persister: the one low-priority thread that drains
 * the queue in order (a copy of a file's version into DIR under a
 * temporary name, synced, renamed into place; a removal or rename applied
 * to DIR), retries a failed operation with backoff, prunes DIR's files by
 * -o persist_keep, and its start (after the journal's replay) and stop at
 * unmount.
 *
 * Calls: persist_journal.c (done-markers, temporaries, the replay),
 * persist_path.c, persist_sets.c (a set's record goes with its directory).
 * Locks: pq.lock (persist_queue.c) around each step of the queue, never
 * across the work on DIR; the head operation is the persister's while it
 * is started.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "persist_int.h"
#include "journal.h"
#include "../common/log.h"
#include "../tiers/clock.h"

static bool same_version(const struct stat *a, const struct stat *b)
{
	return a->st_size == b->st_size && a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
	       a->st_ctim.tv_nsec == b->st_ctim.tv_nsec && a->st_ino == b->st_ino;
}

struct kent {
	struct timespec mtime;
	char *name;
};

static int newer_first(const void *a, const void *b)
{
	const struct kent *x = a, *y = b;

	if (x->mtime.tv_sec != y->mtime.tv_sec)
		return x->mtime.tv_sec < y->mtime.tv_sec ? 1 : -1;
	if (x->mtime.tv_nsec != y->mtime.tv_nsec)
		return x->mtime.tv_nsec < y->mtime.tv_nsec ? 1 : -1;
	return -strcmp(x->name, y->name);
}

/*
 * -o persist_keep=N: DIR's directory dfd (rel: its path, for the log) keeps
 * the N newest regular files (modification time, then name); older ones
 * are removed there, not in the backing directory.  Subdirectories and
 * temporaries do not count.  A checkpoint set (its backing directory or
 * DIR's has the record of fs_sets.c) is one checkpoint: its files are
 * never pruned one by one; prune_sets() counts sets.
 */
static void prune(int dfd, const char *rel)
{
	struct kent *e = NULL;
	size_t n = 0, cap = 0, i;
	struct dirent *de;
	int fd;
	DIR *d;

	if (faccessat(dfd, FS_SET_RECORD, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		return;		/* a set in DIR: see prune_sets() */
	fd = persist_walk_beneath(fs.root_fd, rel, false, NULL, NULL, NULL);
	if (fd >= 0) {
		bool set = faccessat(fd, FS_SET_RECORD, F_OK, AT_SYMLINK_NOFOLLOW) == 0;

		close(fd);
		if (set)
			return;	/* committed, not yet in DIR whole */
	}
	fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
	d = fd < 0 ? NULL : fdopendir(fd);
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(d))) {
		struct stat st;

		if (fs_hidden_name(de->d_name) || !strcmp(de->d_name, ".") ||
		    !strcmp(de->d_name, "..") ||
		    (de->d_type != DT_REG && de->d_type != DT_UNKNOWN) ||
		    fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(st.st_mode))
			continue;
		if (n == cap) {
			struct kent *ne = realloc(e, (cap = cap ? 2 * cap : 64) * sizeof(*e));

			if (!ne)
				break;
			e = ne;
		}
		if (!(e[n].name = strdup(de->d_name)))
			break;
		e[n++].mtime = st.st_mtim;
	}
	closedir(d);
	if (n > pq.keep)
		qsort(e, n, sizeof(*e), newer_first);
	for (i = pq.keep; i < n; i++) {
		if (unlinkat(dfd, e[i].name, 0) == 0) {
			pq_lock();
			pq.pruned++;
			pq_unlock();
			tlog(LOG_INFO, "persist: persist_keep=%u: removed %s/%s%s%s", pq.keep,
			     pq.dir, rel, *rel ? "/" : "", e[i].name);
		} else if (errno != ENOENT) {
			tlog(LOG_WARNING, "persist: persist_keep: cannot remove %s/%s%s%s: %s",
			     pq.dir, rel, *rel ? "/" : "", e[i].name, strerror(errno));
		}
	}
	for (i = 0; i < n; i++)
		free(e[i].name);
	free(e);
}

/*
 * Copy src (a version of a backing file) to rel under DIR as a complete
 * new version.  -EAGAIN: src changed while it was copied.
 */
static int copy_out(int src, const struct stat *st, const char *rel)
{
	static unsigned long counter;
	char tmp[NAME_MAX + 1], host[64] = "";
	struct stat now;
	int root, dfd, wfd, ret;

	root = persist_open_dir_root();
	if (root < 0)
		return root;
	dfd = persist_walk_beneath(root, rel, true, NULL, persist_made_like_backing, NULL);
	close(root);
	if (dfd < 0)
		return dfd;
	gethostname(host, sizeof(host) - 1);
	snprintf(tmp, sizeof(tmp), PTMP_PREFIX "%.40s.%lu.%lu", host, (unsigned long)getpid(),
		 ++counter);
	persist_jtemp(rel, tmp);
	wfd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (wfd < 0) {
		ret = -errno;
		close(dfd);
		return ret;
	}
	__atomic_store_n(&pq.alive, persist_now_ms(), __ATOMIC_RELAXED);
	ret = persist_copy_data(src, wfd, (uint64_t)st->st_size, pq.bw, &pq.abort, &pq.alive);
	if (!ret) {
		persist_copy_xattrs(src, wfd);
		persist_give_attrs(wfd, st, "a file in DIR");
	}
	if (!ret && fsync(wfd) < 0)
		ret = -errno;
	if (close(wfd) < 0 && !ret)
		ret = -errno;
	if (!ret && (fstat(src, &now) < 0 || !same_version(st, &now)))
		ret = -EAGAIN;		/* changed in place meanwhile */
	if (!ret && renameat(dfd, tmp, dfd, persist_base_of(rel)) < 0)
		ret = -errno;
	if (ret)
		unlinkat(dfd, tmp, 0);
	else if (fsync(dfd) < 0 && errno != EINVAL)
		ret = -errno;
	if (!ret && pq.keep) {
		char drel[PATH_MAX];
		const char *b = persist_base_of(rel);

		snprintf(drel, sizeof(drel), "%.*s", b > rel ? (int)(b - rel - 1) : 0, rel);
		prune(dfd, drel);
	}
	close(dfd);
	return ret;
}

/* 0 done, 1 nothing to do (the file is gone), or -errno */
static int do_copy(struct pop *op)
{
	struct fs_inode *in = op->in;
	char proc[64];
	struct stat st;
	bool gone;
	int hfd, src, ret;

	if (!in) {		/* from the journal: the file now at path, if marked */
		if (!persist_marked(op->path))
			return 1;
		const char *b;
		int dfd = persist_walk_beneath(fs.root_fd, op->path, true, &b, NULL, NULL);

		src = dfd < 0 ? -1 : backing_open(dfd, b, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
		ret = dfd < 0 ? dfd : src < 0 ? -errno : 0;
		if (dfd >= 0)
			close(dfd);
		if (src < 0)
			return ret == -ENOENT || ret == -ELOOP || ret == -ENOTDIR ? 1 : ret;
		goto copy;
	}
	fs_lock();
	gone = in->unlinked;
	fs_unlock();
	if (gone)
		return 1;
	hfd = fs_fd_hold(in);
	if (hfd < 0) {
		fs_fd_release(in);
		return hfd == -ENOENT || hfd == -ESTALE ? 1 : hfd;
	}
	fs_proc_path(hfd, proc, sizeof(proc));
	src = backing_open(AT_FDCWD, proc, O_RDONLY, 0);
	ret = src < 0 ? -errno : 0;
	fs_fd_release(in);
	if (src < 0)
		return ret == -ENOENT ? 1 : ret;
copy:
	if (fstat(src, &st) < 0)
		ret = -errno;
	else if (st.st_nlink == 0 || !S_ISREG(st.st_mode))
		ret = 1;		/* removed meanwhile */
	else
		ret = copy_out(src, &st, op->path);
	close(src);
	if (!ret) {
		pq_lock();
		pq.bytes += (uint64_t)st.st_size;
		pq_unlock();
	}
	return ret;
}

static int do_ns(struct pop *op)
{
	int root = persist_open_dir_root(), ret = 0, d = -1, d2 = -1;
	const char *b, *b2;

	if (root < 0)
		return root;
	/* ENOENT on the way: the name never reached DIR (a copy follows,
	 * if it is persistent), or a replay of what was done */
	d = persist_walk_beneath(root, op->path, true, &b, NULL, NULL);
	if (d < 0) {
		ret = d == -ENOENT ? 0 : d;
		goto out;
	}
	switch (op->kind) {
	case P_UNLINK:
		if (unlinkat(d, b, 0) < 0 && errno != ENOENT)
			ret = -errno;
		break;
	case P_RMDIR: {
		int r = unlinkat(d, b, AT_REMOVEDIR) < 0 ? errno : 0;

		/* a set's record, all that is left of it, goes with it */
		if ((r == ENOTEMPTY || r == EEXIST) && fs_rmdir_set_record(d, b))
			r = unlinkat(d, b, AT_REMOVEDIR) < 0 ? errno : 0;
		if (r && r != ENOENT)
			ret = r == ENOTEMPTY || r == EEXIST ? 1 : -r;
		if (ret == 1)
			tlog(LOG_WARNING, "persist: %s/%s: not empty there, kept", pq.dir,
			     op->path);
		break;
	}
	case P_RENAME:
		d2 = persist_walk_beneath(root, op->path2, true, &b2, persist_made_like_backing,
					  NULL);
		if (d2 < 0) {
			ret = d2;
			break;
		}
		if (renameat2(d, b, d2, b2, op->flags & RENAME_EXCHANGE) < 0 && errno != ENOENT)
			ret = -errno;
		break;
	default:
		break;
	}
out:
	if (d >= 0)
		close(d);
	if (d2 >= 0)
		close(d2);
	close(root);
	return ret;
}

/* Errors that retrying cannot mend: the operation is dropped. */
static bool permanent(int err)
{
	return err == -ENAMETOOLONG || err == -EINVAL || err == -ENOTDIR ||
	       err == -EISDIR || err == -ELOOP || err == -ENOMEM;
}

static const char *op_name(enum pkind k)
{
	static const char *const n[] = { "copy", "unlink", "rmdir", "rename" };

	return n[k];
}

static void wake_waiters(struct pop *op, int err, bool final)
{
	for (struct pwait *w = op->waiters; w; w = w->next) {
		w->done = true;
		w->err = err;
	}
	if (final || err)
		op->waiters = NULL;	/* each waiter sees one outcome */
	pthread_cond_broadcast(&pq.done);
}

/* The head operation ended with ret (pq.lock held). */
static void op_ended(struct pop *op, int ret, double dt)
{
	bool failed = ret < 0 && ret != -EAGAIN;

	if (failed && !permanent(ret)) {
		pq.errors++;
		if (ret != pq.last_err)
			tlog(LOG_ERR, "persist: %s %s to %s failed: %s; retrying (logged once)",
			     op_name(op->kind), op->path, pq.dir, strerror(-ret));
		pq.last_err = ret;
		snprintf(pq.last_what, sizeof(pq.last_what), "%s", strerror(-ret));
		if (op->kind == P_COPY && op->in) {
			op->in->pstate = PS_FAILED;
			op->in->perr = ret;
		}
		/* every persist=sync caller behind it waits for it: they learn */
		for (struct pop *o = op; o; o = o->next)
			wake_waiters(o, ret, false);
		op->started = false;
		return;
	}
	if (ret == -EAGAIN) {
		op->started = false;
		pq.retries++;
		return;
	}
	if (failed) {
		pq.errors++;
		if (op->kind == P_COPY)
			pq.failed++;
		snprintf(pq.last_what, sizeof(pq.last_what), "%s", strerror(-ret));
		if (ret == -ELOOP || ret == -ENOTDIR)
			pq.refused++;
		if (ret == -ELOOP || ret == -ENOTDIR)
			tlog(LOG_ERR, "persist: %s %s%s%s: a symbolic link or a non-directory on "
			     "its way in %s, not followed; dropped", op_name(op->kind), op->path,
			     op->path2 ? " -> " : "", op->path2 ? op->path2 : "", pq.dir);
		else if (ret == -EINVAL)
			tlog(LOG_ERR, "persist: %s %s%s%s: not a path beneath %s (an empty, "
			     "'.' or '..' component, or absolute); dropped", op_name(op->kind),
			     op->path, op->path2 ? " -> " : "", op->path2 ? op->path2 : "", pq.dir);
		else
			tlog(LOG_ERR, "persist: %s %s to %s failed: %s; dropped",
			     op_name(op->kind), op->path, pq.dir, strerror(-ret));
	} else if (pq.last_err) {
		tlog(LOG_NOTICE, "persist: %s writable again", pq.dir);
		pq.last_err = 0;
	}
	pq.head = op->next;
	if (!pq.head)
		pq.tail = NULL;
	persist_jdone();
	persist_jempty();
	if (op->kind == P_COPY) {
		pq.backlog_files--;
		pq.backlog_bytes -= op->bytes;
		if (ret == 0) {
			pq.files++;
			pq.busy_s += dt;
		} else {
			pq.skipped++;
		}
		if (op->in && --op->in->pq_n == 0)
			op->in->pstate = failed ? PS_FAILED : ret == 0 ? PS_PERSISTED : PS_NONE;
		if (op->in)
			op->in->perr = failed ? ret : 0;
	} else {
		pq.ops++;
	}
	wake_waiters(op, failed ? ret : 0, true);
}

/* Low priority: the persister yields CPU and disk to the application. */
static void lower_priority(void)
{
	pid_t tid = (pid_t)syscall(SYS_gettid);

	setpriority(PRIO_PROCESS, (id_t)tid, 10);
#ifdef SYS_ioprio_set
	/* IOPRIO_WHO_PROCESS, best effort class, lowest level */
	syscall(SYS_ioprio_set, 1, tid, (2 << 13) | 7);
#endif
}

static void *persister(void *arg)
{
	double backoff = 0;

	(void)arg;
	lower_priority();
	pq_lock();
	for (;;) {
		while (!pq.head && !pq.stop)
			pthread_cond_wait(&pq.cond, &pq.lock);
		if (!pq.head || pq.abort)
			break;
		struct pop *op = pq.head;

		op->started = true;	/* a new commit queues a new copy */
		__atomic_store_n(&pq.alive, persist_now_ms(), __ATOMIC_RELAXED);
		pq_unlock();
		double t0 = tier_now();
		int ret = op->kind == P_COPY ? do_copy(op) : do_ns(op);
		double dt = tier_now() - t0;

		pq_lock();
		if (ret == -ECANCELED && pq.abort)
			break;
		if (ret == 1 && op->kind == P_COPY && !op->in)
			persist_follow_copy(op);	/* renamed since the replay? */
		op_ended(op, ret, dt);
		if (pq.head != op) {
			backoff = 0;
			pq_unlock();
			op_free(op);
			pq_lock();
			continue;
		}
		if (ret == -EAGAIN)
			continue;
		/* failed: wait, then retry the same operation (order) */
		backoff = backoff ? backoff * 2 : PBACKOFF_MIN;
		if (backoff > PBACKOFF_MAX)
			backoff = PBACKOFF_MAX;
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + backoff;

		ts.tv_sec = (time_t)end;
		ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
		while (!pq.abort && pthread_cond_timedwait(&pq.cond, &pq.lock, &ts) == 0)
			;
	}
	pq.exited = true;
	pthread_cond_broadcast(&pq.done);
	pq_unlock();
	return NULL;
}

void fs_persist_start(void)
{
	int r;

	if (!pq.dir)
		return;
	pq.jon = fs.journal != NULL;
	if (!pq.jon)
		tlog(LOG_WARNING, "persist: %s has no journal this time (logged above); a "
		     "restart may miss operations", fs.opts.backing);
	else
		persist_replay();
	r = pthread_create(&pq.thr, NULL, persister, NULL);
	if (r) {
		tlog(LOG_ERR, "persist: cannot start its thread: %s; nothing is persisted",
		     strerror(r));
		return;
	}
	pq.started = true;
	tlog(LOG_NOTICE, "persist: marked files drain to %s%s", pq.dir,
	     pq.all ? " (persist_all)" : "");
}

const char *fs_persist_dir(void)
{
	return pq.started ? pq.dir : NULL;
}

unsigned fs_persist_stop(void)
{
	struct timespec ts;
	struct pop *op, *next;
	unsigned left = 0;

	if (!pq.started)
		return 0;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)pq.wait_s;
	ts.tv_nsec += (long)((pq.wait_s - (double)(time_t)pq.wait_s) * 1e9);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pq_lock();
	pq.stop = true;
	pthread_cond_broadcast(&pq.cond);
	while (!pq.exited && pthread_cond_timedwait(&pq.done, &pq.lock, &ts) == 0)
		;
	pq.abort = true;
	pthread_cond_broadcast(&pq.cond);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 2;		/* a copy in progress notices within a chunk */
	while (!pq.exited && pthread_cond_timedwait(&pq.done, &pq.lock, &ts) == 0)
		;
	if (!pq.exited) {
		for (op = pq.head; op; op = op->next)
			left++;
		pq.jon = false;	/* the journal closes next: the thread left
				 * behind appends nothing to it */
		pq_unlock();
		tlog(LOG_ERR, "persist: %s does not answer: exiting without waiting for it",
		     pq.dir);
		/* the thread is left; the process ends */
		return left ? left : 1;
	}
	pq_unlock();
	pthread_join(pq.thr, NULL);
	for (op = pq.head; op; op = next) {
		next = op->next;
		if (left++ < 20)
			tlog(LOG_ERR, "persist: not in %s at unmount: %s %s%s%s", pq.dir,
			     op_name(op->kind), op->path, op->path2 ? " -> " : "",
			     op->path2 ? op->path2 : "");
		if (op->kind == P_COPY && op->in)
			op->in->pq_n--;
		op_free(op);
	}
	if (left) {
		tlog(LOG_ERR, "persist: %u operation%s not applied to %s (the next mount "
		     "over this backing directory resumes them)", left, left == 1 ? "" : "s",
		     pq.dir);
	} else {
		if (pq.failed)
			tlog(LOG_ERR, "persist: %" PRIu64 " file copies could not be persisted "
			     "to %s (logged above); everything else is there", pq.failed, pq.dir);
		else
			tlog(LOG_NOTICE, "persist: everything is in %s", pq.dir);
		jnl_notes_done(fs.journal);	/* the journal may go */
	}
	pq.jon = false;
	pq.head = pq.tail = NULL;
	return left + (unsigned)pq.failed;
}
