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
 * Locks: pq.lock (LR_PERSIST) guards the queue, the journal's writes, the
 * statistics and the inodes' pstate, perr, pq_n and pcreated fields; it is
 * taken under a file's tfile.lock and ilock, fs.nslock, directories'
 * ilocks and fs.lock (an inode freed).  pg.lock (LR_PERSIST_POOL) guards
 * the pool of DIR's requests; it is taken under fs.nslock and
 * directories' ilocks.  The two are never held together, and nothing but
 * the log's lock is taken under either.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "fs.h"
#include "fs_persist.h"
#include "../common/json.h"
#include "../tiers/clock.h"
#include "../common/log.h"

#define PCHUNK		(1u << 20)	/* copy buffer */
#define PBACKOFF_MIN	0.5		/* seconds before the first retry */
#define PBACKOFF_MAX	8.0
#define PTMP_PREFIX	FS_HIDDEN_PREFIX ".persist."
#define PFETCH_PREFIX	FS_HIDDEN_PREFIX ".new.fetch."	/* removed at start-up */

enum { PS_NONE, PS_PENDING, PS_PERSISTED, PS_FAILED };
enum pkind { P_COPY, P_UNLINK, P_RMDIR, P_RENAME };

struct pwait {
	struct pwait *next;
	bool done;
	int err;
};

struct pop {
	struct pop *next;
	enum pkind kind;
	struct fs_inode *in;		/* P_COPY: referenced; NULL: the file
					 * at path (replayed from the journal) */
	char *path, *path2;		/* relative to DIR; path2: rename target */
	unsigned flags;			/* P_RENAME: renameat2 flags */
	uint64_t bytes;			/* P_COPY: size when queued */
	bool started;
	bool made;			/* replayed removal or rename: the journal
					 * says the backing directory made it */
	bool journaled;			/* in the journal before it was queued */
	struct pwait *waiters;		/* persist=sync callers */
};

static struct {
	char *dir;			/* DIR (absolute), NULL: off */
	int all;			/* persist_all */
	double wait_s;			/* persist_wait */
	uint64_t bw;			/* persist_bw, bytes/s, 0: no cap */
	unsigned keep;			/* persist_keep, 0: keep everything */
	pthread_mutex_t lock;
	pthread_cond_t cond;		/* work queued; stop */
	pthread_cond_t done;		/* an operation ended (waiters) */
	struct pop *head, *tail;
	pthread_t thr;
	bool started, stop, abort, exited;
	int jfd;			/* the journal, -1: none */
	int intents;			/* commits between intent and hook: the
					 * journal is not emptied meanwhile */
	bool jerr;			/* a journal write failed (logged) */
	/* statistics */
	uint64_t backlog_files, backlog_bytes;
	uint64_t files, bytes, ops, skipped, errors, retries;
	uint64_t fetched_files, fetched_bytes;
	uint64_t pruned;		/* removed from DIR by persist_keep */
	uint64_t failed;		/* copies given up: a path that cannot
					 * be (too long, a link or a non-directory
					 * on its way in DIR) */
	uint64_t refused;		/* links or non-directories met in DIR */
	char last_refused[256];		/* the path last logged for it */
	double busy_s;			/* time spent copying */
	uint64_t alive;			/* ms: the copy in progress last moved */
	int last_err;			/* the cause last logged, 0: none */
	char last_what[96];
} pq = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
	.wait_s = 5.0,
	.jfd = -1,
};

/*
 * DIR in bounded time.  What a request asks of DIR (a lookup that missed
 * locally, a listing, rmdir's emptiness check, the tier and state xattrs)
 * runs in a small pool of threads while the request waits at most
 * -o persist_timeout seconds without progress (a fetch that copies is
 * progress).  A request that gives up marks DIR as not answering: until
 * one of those calls comes back, requests do not ask DIR at all (names
 * that the backing directory lacks are absent, listings are the backing
 * directory's).  A thread stuck in a hung DIR stays stuck; there are at
 * most PG_THREADS.
 */
#define PG_THREADS	4

struct pjob {
	struct pjob *next;
	int (*fn)(struct pjob *);
	struct fs_inode *in;		/* referenced, or NULL */
	char name[NAME_MAX + 1];
	char rel[PATH_MAX];
	int fd;				/* a local directory (dup), or -1 */
	struct fs_psnap *snap;		/* out: DIR's extra entries */
	long n;				/* out: their number */
	struct stat st;			/* out: DIR's rel */
	char *text;			/* a set's record (in or out) */
	size_t tlen;
	struct fs_pfile *files;		/* a set's files (in or out) */
	size_t nfiles;
	int ret;
	int refs;			/* the caller's and the pool's */
	bool done, cancel;
	uint64_t alive;			/* ms: last progress (atomic) */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work, done;
	struct pjob *head, *tail;
	int threads, idle;
	bool hung;			/* a request gave up on DIR */
	double timeout;			/* persist_timeout */
	uint64_t timeouts;		/* requests that gave up */
} pg = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.work = PTHREAD_COND_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
	.timeout = 10.0,
};

/* pq.lock and pg.lock, through the lock-order check (lockorder.h). */
static void pq_lock(void)
{
	ranked_lock(&pq.lock, LR_PERSIST);
}

static void pq_unlock(void)
{
	ranked_unlock(&pq.lock, LR_PERSIST);
}

static void pg_lock(void)
{
	ranked_lock(&pg.lock, LR_PERSIST_POOL);
}

static void pg_unlock(void)
{
	ranked_unlock(&pg.lock, LR_PERSIST_POOL);
}

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
#define PJOURNAL	FS_HIDDEN_PREFIX ".persist.journal"

/* Empty the journal if nothing is queued or about to be.  pq.lock held. */
static void jempty(void)
{
	if (pq.jfd >= 0 && !pq.head && !pq.intents && ftruncate(pq.jfd, 0) < 0)
		tlog(LOG_WARNING, "persist: cannot empty %s: %s", PJOURNAL, strerror(errno));
}

/* The head operation is done: a marker, so that a replay skips it (the
 * queue ends operations in order).  pq.lock held. */
static void jdone(void)
{
	static const char rec[] = "X0\0\0";	/* three strings, the last NUL too */

	if (pq.jfd >= 0 && write(pq.jfd, rec, sizeof(rec)) != sizeof(rec) && !pq.jerr) {
		pq.jerr = true;
		tlog(LOG_WARNING, "persist: cannot write %s: %s", PJOURNAL, strerror(errno));
	}
}

static void jappend(const struct pop *op)
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
static void jtemp(const char *rel, const char *tmp)
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

/* ------------------------------------------------------------ options */

static bool under(const char *path, const char *top)
{
	size_t l = strlen(top);

	return strncmp(path, top, l) == 0 && (path[l] == '/' || path[l] == 0 ||
					      (l == 1 && top[0] == '/'));
}

static int fs_persist_fetch(struct fs_inode *dir, const char *name);
static void fs_persist_forget(struct fs_inode *in);

/* What the inode table asks of DIR (fs.h): a name the backing directory
 * lacks, an inode freed. */
static const struct fs_inode_ops persist_inode_ops = {
	.fetch = fs_persist_fetch,
	.forget = fs_persist_forget,
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
	return 0;
}

/* ------------------------------------------------------------ paths */

static int join(char *out, size_t len, const char *a, const char *b)
{
	int n = *a ? snprintf(out, len, "%s/%s", a, b) : snprintf(out, len, "%s", b);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/*
 * The path of fd's name relative to the backing root, also for a name that
 * was removed (the kernel shows it with " (deleted)" even while the file
 * has other names): *gone says so, and rel is that old name (its directory
 * is where the file's other names usually are).
 */
static int rel_of_fd_any(int fd, char *rel, size_t len, bool *gone)
{
	char proc[64], p[PATH_MAX];
	size_t bl = strlen(fs.opts.backing);
	ssize_t n;

	fs_proc_path(fd, proc, sizeof(proc));
	n = readlink(proc, p, sizeof(p) - 1);
	if (n < 0)
		return -errno;
	p[n] = 0;
	*gone = n > 10 && strcmp(p + n - 10, " (deleted)") == 0;
	if (*gone)
		p[n - 10] = 0;
	if (strncmp(p, fs.opts.backing, bl) || (p[bl] && p[bl] != '/'))
		return -ENOENT;
	return snprintf(rel, len, "%s", p[bl] ? p + bl + 1 : "") >= (int)len ?
		-ENAMETOOLONG : 0;
}

/* The path of backing object fd relative to the backing root ("" for it). */
static int rel_of_fd(int fd, char *rel, size_t len)
{
	bool gone;
	int ret = rel_of_fd_any(fd, rel, len, &gone);

	return ret ? ret : gone ? -ENOENT : 0;
}

/*
 * in's path relative to the backing root.  A directory's through its fd
 * (the kernel follows renames); a regular file's as its directory's plus
 * its name (a new version's fd may be a tmpfile's).
 */
static int rel_of(struct fs_inode *in, char *rel, size_t len)
{
	int fd, ret;

	if (in == &fs.root) {
		rel[0] = 0;
		return 0;
	}
	if (S_ISREG(in->type)) {
		struct fs_inode *dir = NULL;
		char name[NAME_MAX + 1], drel[PATH_MAX];

		fs_lock();
		if (in->name && in->parent && !in->unlinked) {
			dir = in->parent;
			fs_inode_get(dir);
			snprintf(name, sizeof(name), "%s", in->name);
		}
		fs_unlock();
		if (!dir)
			return -ENOENT;
		ret = rel_of(dir, drel, sizeof(drel));
		fs_inode_put(dir);
		return ret ? ret : join(rel, len, drel, name);
	}
	fd = fs_fd_hold(in);
	ret = fd < 0 ? fd : rel_of_fd(fd, rel, len);
	fs_fd_release(in);
	return ret;
}

/* The own mark of a backing path: 1, 0, or -1 for none; follow: the path
 * may be a symbolic link to the object (/proc/self/fd/N). */
static int mark_at(const char *path, bool follow)
{
	char v[8];
	ssize_t n = (follow ? getxattr : lgetxattr)(path, TIERFS_XATTR_PERSIST, v, sizeof(v));

	return n <= 0 ? -1 : v[0] == '1';
}

static int rel_ok(const char *rel);

/* The own mark of fd's object (any kind of descriptor): 1, 0 or -1. */
static int mark_of_fd(int fd)
{
	char proc[64];

	fs_proc_path(fd, proc, sizeof(proc));
	return mark_at(proc, true);
}

/*
 * Is the backing object at rel persistent (its mark, else its nearest
 * marked directory's, else persist_all)?  Walked down from the root, no
 * link followed: a user's symbolic link in the mount does not make the
 * daemon read the marks of what it points to.
 */
static bool marked(const char *rel)
{
	char *buf = rel_ok(rel) ? NULL : strdup(rel), *p, *slash;
	int m = pq.all, own, fd, nfd;
	struct stat st;

	if (!buf)
		return false;
	fd = fcntl(fs.root_fd, F_DUPFD_CLOEXEC, 0);
	if (fd >= 0 && (own = mark_of_fd(fd)) >= 0)
		m = own;
	for (p = buf; fd >= 0 && *p; p = slash + 1) {
		if ((slash = strchr(p, '/')))
			*slash = 0;
		if (slash)
			nfd = openat(fd, p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		else if (fstatat(fd, p, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISLNK(st.st_mode))
			nfd = openat(fd, p, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		else
			nfd = -1;
		close(fd);
		fd = nfd;
		if (fd >= 0 && (own = mark_of_fd(fd)) >= 0)
			m = own;
		if (!slash)
			break;
	}
	if (fd >= 0)
		close(fd);
	free(buf);
	return m;
}

/*
 * The same for an inode whose path is too long to say (longer than
 * PATH_MAX): its own mark, then its known directories' up to the root.
 */
static bool marked_inode(struct fs_inode *in)
{
	struct fs_inode *cur = in, *up;
	int own, fd, depth = 0;

	fs_inode_get(cur);
	for (;;) {
		fd = fs_fd_hold(cur);
		own = fd < 0 ? -1 : mark_of_fd(fd);
		fs_fd_release(cur);
		if (own >= 0 || cur == &fs.root || ++depth > 4096)
			break;
		fs_lock();
		up = cur->parent;
		if (up)
			fs_inode_get(up);
		fs_unlock();
		fs_inode_put(cur);
		if (!(cur = up))
			return pq.all;
	}
	fs_inode_put(cur);
	return own >= 0 ? own : pq.all;
}

/* rel is path or lies under it */
static bool covers(const char *path, const char *rel)
{
	size_t l = strlen(path);

	return strncmp(path, rel, l) == 0 && (rel[l] == 0 || rel[l] == '/');
}

/* Is rel removed through the mount, not yet in DIR?  pq.lock held. */
static bool whiteout(const char *rel)
{
	for (struct pop *op = pq.head; op; op = op->next) {
		if (op->kind == P_COPY)
			continue;
		if (covers(op->path, rel))
			return true;
		if (op->kind == P_RENAME && (op->flags & RENAME_EXCHANGE) &&
		    covers(op->path2, rel))
			return true;
	}
	return false;
}

static bool whiteout_locked(const char *rel)
{
	bool w;

	pq_lock();
	w = whiteout(rel);
	pq_unlock();
	return w;
}

static int open_dir_root(void)
{
	int fd = open(pq.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

/*
 * Paths beneath a root, never through a symbolic link.
 *
 * The daemon runs as root and DIR is shared: each user may change their
 * part of it behind the daemon's back (a directory swapped for a symbolic
 * link to /etc, before a copy or during it).  So no path into DIR (nor
 * into the backing directory, which a user shapes through the mount) is
 * given to the kernel whole: a directory is reached from its parent's
 * descriptor, each component opened with O_NOFOLLOW, and the work is done
 * relative to the last descriptor (openat, unlinkat, renameat, mkdirat).
 * A component that is a symbolic link fails with ELOOP, one that is not a
 * directory with ENOTDIR; an empty, "." or ".." component with EINVAL.  A
 * component swapped after it was opened changes nothing: the descriptor
 * is the directory that was there.  Where the kernel has openat2, one
 * call with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS does the same walk.
 * Paths of any length work: nothing is bounded by PATH_MAX.
 */

/* May rel's components be walked?  0 or -EINVAL. */
static int rel_ok(const char *rel)
{
	const char *p = rel;

	if (rel[0] == '/')
		return -EINVAL;
	for (;;) {
		size_t l = strcspn(p, "/");

		if (l == 0 || (l == 1 && p[0] == '.') || (l == 2 && p[0] == '.' && p[1] == '.'))
			return *rel ? -EINVAL : 0;
		if (l > NAME_MAX)
			return -ENAMETOOLONG;
		if (!p[l])
			return 0;
		p += l + 1;
	}
}

static int openat_beneath(int root, const char *path)
{
#ifdef SYS_openat2
	static int none;	/* the kernel lacks openat2 */
	struct open_how how = {
		.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};

	/* TIERFS_FAULT=no_openat2: the walk, as on kernels before 5.6 */
	if (!__atomic_load_n(&none, __ATOMIC_RELAXED) && strlen(path) < PATH_MAX &&
	    !tierfs_fault("no_openat2")) {
		int fd = (int)syscall(SYS_openat2, root, path, &how, sizeof(how));

		if (fd >= 0 || (errno != ENOSYS && errno != EAGAIN && errno != EXDEV &&
				errno != ENAMETOOLONG))
			return fd < 0 ? -errno : fd;
		if (errno == ENOSYS)
			__atomic_store_n(&none, 1, __ATOMIC_RELAXED);
	}
#endif
	(void)root;
	(void)path;
	return -ENOSYS;
}

/* mode, owner and times of a directory made by walk_beneath() */
typedef void (*walk_made_fn)(int fd, const char *prefix, void *arg);

/*
 * An O_RDONLY descriptor of directory rel beneath root, or with parent, of
 * the directory that holds rel's last component (*base then points to that
 * component; "" for rel itself is root).  made: make missing directories
 * (0700, then made(fd, prefix, arg) gives them their owner and mode);
 * NULL: -ENOENT where one is missing.  Returns the descriptor or -errno.
 */
static int walk_beneath(int root, const char *rel, bool parent, const char **base,
			walk_made_fn made, void *arg)
{
	const char *b = strrchr(rel, '/');
	size_t len;
	char *buf, *p;
	int fd, ret = rel_ok(rel);

	if (ret)
		return ret;
	b = b ? b + 1 : rel;
	if (base)
		*base = b;
	len = parent ? (b > rel ? (size_t)(b - rel - 1) : 0) : strlen(rel);
	if (len == 0) {
		fd = fcntl(root, F_DUPFD_CLOEXEC, 0);
		return fd < 0 ? -errno : fd;
	}
	if (!(buf = malloc(len + 1)))
		return -ENOMEM;
	memcpy(buf, rel, len);
	buf[len] = 0;
	fd = openat_beneath(root, buf);
	if (fd >= 0 || (fd != -ENOSYS && !(fd == -ENOENT && made))) {
		free(buf);
		return fd;
	}
	/* the walk, a component at a time */
	if ((fd = fcntl(root, F_DUPFD_CLOEXEC, 0)) < 0) {
		ret = -errno;
		goto out;
	}
	for (p = buf;;) {
		char *slash = strchr(p, '/');
		int nfd;

		if (slash)
			*slash = 0;
		nfd = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (nfd < 0 && errno == ENOENT && made) {
			if (mkdirat(fd, p, 0700) < 0 && errno != EEXIST) {
				ret = -errno;
				break;
			}
			nfd = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (nfd >= 0)
				made(nfd, buf, arg);
		}
		if (nfd < 0) {
			/* O_NOFOLLOW | O_DIRECTORY on a symbolic link: ELOOP or
			 * ENOTDIR, by kernel; say ELOOP for a link */
			struct stat st;

			ret = -errno;
			if (ret == -ENOTDIR && fstatat(fd, p, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    S_ISLNK(st.st_mode))
				ret = -ELOOP;
			break;
		}
		close(fd);
		fd = nfd;
		if (!slash) {
			free(buf);
			return fd;
		}
		*slash = '/';
		p = slash + 1;
	}
	close(fd);
out:
	free(buf);
	return ret;
}

/* The backing directory's rel (a directory), stat'ed without following a
 * link. */
static int backing_dir_stat(const char *rel, struct stat *st)
{
	int fd = walk_beneath(fs.root_fd, rel, false, NULL, NULL, NULL), ret = 0;

	if (fd < 0)
		return fd;
	if (fstat(fd, st) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* lstat of the backing directory's rel, no link followed on the way */
static int backing_lstat(const char *rel, struct stat *st)
{
	const char *b;
	int fd = walk_beneath(fs.root_fd, rel, true, &b, NULL, NULL), ret = 0;

	if (fd < 0)
		return fd;
	if (fstatat(fd, *b ? b : ".", st, AT_SYMLINK_NOFOLLOW) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/*
 * Give fd (a new object in DIR or in the backing directory) the owner,
 * mode and times of st: owner first (a chown clears set-ID bits).  A
 * file system that refuses the owner (NFS with root squashing) keeps its
 * own: logged once, and the object keeps the daemon's owner and st's mode,
 * no more open than the original.
 */
static void give_attrs(int fd, const struct stat *st, const char *what)
{
	static int warned;
	struct timespec tv[2] = { st->st_atim, st->st_mtim };

	if (fchown(fd, st->st_uid, st->st_gid) < 0 &&
	    !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		tlog(LOG_WARNING, "persist: cannot give %s to uid %u gid %u: %s; objects "
		     "made there keep the daemon's owner (logged once)", what,
		     (unsigned)st->st_uid, (unsigned)st->st_gid, strerror(errno));
	if (fchmod(fd, st->st_mode & 07777) < 0 && S_ISREG(st->st_mode))
		tlog(LOG_WARNING, "persist: chmod of %s: %s", what, strerror(errno));
	futimens(fd, tv);
}

/* walk_beneath()'s made for DIR: like the backing directory's prefix */
static void made_like_backing(int fd, const char *prefix, void *arg)
{
	struct stat st;

	(void)arg;
	if (backing_dir_stat(prefix, &st) == 0)
		give_attrs(fd, &st, "a directory in DIR");
}

/*
 * The user xattrs of src go to dst (descriptors, both O_RDONLY or better);
 * tierfs's own (user.tierfs.*) are left: a mark is set by whoever copies.
 */
static void copy_xattrs(int src, int dst)
{
	char *list = NULL, *p, *val = NULL;
	ssize_t n = flistxattr(src, NULL, 0), m;

	if (n <= 0 || !(list = malloc((size_t)n)) || !(val = malloc(XATTR_SIZE_MAX)))
		goto out;
	n = flistxattr(src, list, (size_t)n);
	for (p = list; n > 0 && p < list + n; p += strlen(p) + 1) {
		if (strncmp(p, "user.", 5) || !strncmp(p, "user.tierfs.", 12))
			continue;
		m = fgetxattr(src, p, val, XATTR_SIZE_MAX);
		if (m >= 0 && fsetxattr(dst, p, val, (size_t)m, 0) < 0 && errno != ENOTSUP)
			tlog(LOG_INFO, "persist: xattr %s not copied: %s", p, strerror(errno));
	}
out:
	free(list);
	free(val);
}

static uint64_t now_ms(void)
{
	return (uint64_t)(tier_now() * 1000.0);
}

void fs_persist_files_free(struct fs_pfile *files, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(files[i].name);
	free(files);
}

static void pjob_put(struct pjob *j)
{
	bool last;

	pg_lock();
	last = --j->refs == 0;
	pg_unlock();
	if (!last)
		return;
	if (j->in)
		fs_inode_put(j->in);
	if (j->fd >= 0)
		close(j->fd);
	fs_persist_snap_free(j->snap);
	free(j->text);
	fs_persist_files_free(j->files, j->nfiles);
	free(j);
}

static void *pg_thread(void *arg)
{
	(void)arg;
	pg_lock();
	for (;;) {
		struct pjob *j;

		pg.idle++;
		while (!pg.head)
			pthread_cond_wait(&pg.work, &pg.lock);
		pg.idle--;
		j = pg.head;
		pg.head = j->next;
		if (!pg.head)
			pg.tail = NULL;
		if (!__atomic_load_n(&j->cancel, __ATOMIC_RELAXED)) {
			pg_unlock();
			j->ret = j->fn(j);
			pg_lock();
			if (pg.hung) {
				pg.hung = false;
				tlog(LOG_NOTICE, "persist: %s answers again", pq.dir);
			}
		}
		j->done = true;
		pthread_cond_broadcast(&pg.done);
		pg_unlock();
		pjob_put(j);
		pg_lock();
	}
	return NULL;
}

/*
 * Run j->fn in the pool; wait while it makes progress.  True: it ran, and
 * j->ret and its outputs are j's; false: DIR did not answer (now or
 * before).  The caller puts j either way.
 */
static bool pg_run(struct pjob *j, const char *what)
{
	uint64_t limit = (uint64_t)(pg.timeout * 1000.0);
	bool answered;

	j->alive = now_ms();
	pg_lock();
	if (pg.hung) {
		pg_unlock();
		return false;
	}
	if (!pg.idle && pg.threads < PG_THREADS) {
		pthread_t t;
		pthread_attr_t a;

		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &a, pg_thread, NULL) == 0)
			pg.threads++;
		pthread_attr_destroy(&a);
	}
	if (!pg.threads) {	/* no thread: ask DIR here, unbounded */
		pg_unlock();
		j->ret = j->fn(j);
		return true;
	}
	j->refs++;		/* the pool's */
	j->next = NULL;
	if (pg.tail)
		pg.tail->next = j;
	else
		pg.head = j;
	pg.tail = j;
	pthread_cond_signal(&pg.work);
	while (!j->done) {
		struct timespec ts;
		uint64_t alive = __atomic_load_n(&j->alive, __ATOMIC_RELAXED), now = now_ms();

		if (now >= alive + limit) {
			__atomic_store_n(&j->cancel, true, __ATOMIC_RELAXED);
			pg.timeouts++;
			if (!pg.hung)
				tlog(LOG_ERR, "persist: %s does not answer (%s: nothing for %.3g s); "
				     "until it does, names that the backing directory lacks are "
				     "absent and listings show the backing directory only", pq.dir,
				     what, pg.timeout);
			pg.hung = true;
			break;
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t wait = alive + limit - now;

		if (wait > 1000)
			wait = 1000;
		ts.tv_sec += (time_t)(wait / 1000);
		ts.tv_nsec += (long)(wait % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&pg.done, &pg.lock, &ts);
	}
	answered = j->done;
	pg_unlock();
	return answered;
}

static struct pjob *pjob_new(int (*fn)(struct pjob *))
{
	struct pjob *j = calloc(1, sizeof(*j));

	if (j) {
		j->fn = fn;
		j->fd = -1;
		j->refs = 1;
	}
	return j;
}

/* ------------------------------------------------------------ the queue */

static void queue(struct pop *op)
{
	if (!op->journaled)
		jappend(op);
	op->next = NULL;
	if (pq.tail)
		pq.tail->next = op;
	else
		pq.head = op;
	pq.tail = op;
	pthread_cond_broadcast(&pq.cond);
}

static void op_free(struct pop *op)
{
	if (op->in)
		fs_inode_put(op->in);
	free(op->path);
	free(op->path2);
	free(op);
}

/* Queue a copy of in (path rel); w: a waiter for it, or NULL. */
static void queue_copy(struct fs_inode *in, const char *rel, struct pwait *w)
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
		} else if (covers(o->path, rel) || (o->path2 && covers(o->path2, rel))) {
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
static void path_failed(struct fs_inode *in, const char *name)
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
static void refused(const char *rel, int err)
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

/* Queue a copy of in to its name dir/name (dir NULL: name is the path)
 * if that is persistent; intent:
 * only write it in the journal (fs_persist_intent). */
static void copy_name(struct fs_inode *in, struct fs_inode *dir, const char *name,
		      bool intent)
{
	char drel[PATH_MAX], rel[PATH_MAX];
	int ret = 0;

	if (dir && ((ret = rel_of(dir, drel, sizeof(drel))) ||
		    (ret = join(rel, sizeof(rel), drel, name)))) {
		if (ret == -ENAMETOOLONG && !intent && marked_inode(in))
			path_failed(in, name);
		return;
	}
	if (!dir)
		snprintf(rel, sizeof(rel), "%s", name);
	if (!marked(rel))
		return;
	if (!intent) {
		queue_copy(in, rel, NULL);
		return;
	}
	pq_lock();
	jappend(&(struct pop){ .kind = P_COPY, .path = rel, .started = true });	/* 'I' */
	pq_unlock();
}

#define PNAMES_MAX	16	/* names of a hard-linked file copied per commit */

/*
 * The daemon knows the names of a file that it saw made or looked up since
 * its inode was last forgotten: a hard-linked file may have others.  Look
 * for them in the directories of the known ones (where hard links usually
 * are): the entries with its inode number.
 */
/*
 * Call fn(arg, name) for each entry of directory dfd (owned: closed here)
 * that is the inode of st, the hidden names left out, until fn returns
 * false.  The scan behind every hard-link fallback below.
 */
/* Is entry de of directory dfd (not a hidden name) the inode of st? */
static bool link_of(int dfd, const struct dirent *de, const struct stat *st)
{
	struct stat est;

	return de->d_ino == st->st_ino && !fs_hidden_name(de->d_name) &&
	       fstatat(dfd, de->d_name, &est, AT_SYMLINK_NOFOLLOW) == 0 &&
	       est.st_ino == st->st_ino && est.st_dev == st->st_dev;
}

static void each_link_in(int dfd, const struct stat *st, bool (*fn)(void *arg, const char *name),
			 void *arg)
{
	struct dirent *de;
	DIR *dp;

	if (dfd < 0 || !(dp = fdopendir(dfd))) {
		if (dfd >= 0)
			close(dfd);
		return;
	}
	while ((de = readdir(dp))) {
		if (!link_of(dfd, de, st))
			continue;
		if (!fn(arg, de->d_name))
			break;
	}
	closedir(dp);
}

struct more_names_scan {
	struct fs_inode **dirs, *dir;
	char **names;
	int n;
};

/* each_link_in()'s callback of more_names(): a name not known yet */
static bool more_names_one(void *arg, const char *name)
{
	struct more_names_scan *m = arg;
	int i;

	for (i = 0; i < m->n; i++)
		if (m->dirs[i] == m->dir && m->names[i] && !strcmp(m->names[i], name))
			return true;
	if (!(m->names[m->n] = strdup(name)))
		return true;
	m->dirs[m->n] = m->dir;
	fs_inode_get(m->dir);
	return ++m->n < PNAMES_MAX;
}

/*
 * The names of in beyond the n known ones in the directories of the known
 * ones (each scanned once; its (dev, ino) added to done[*ndone]); returns
 * the number of names in dirs[]/names[] now.  st: in's backing file.
 */
static int more_names(const struct stat *st, struct fs_inode **dirs, char **names, int n,
		      struct stat *done, int *ndone)
{
	struct more_names_scan m = { .dirs = dirs, .names = names, .n = n };
	int known = n;

	if (st->st_nlink <= (nlink_t)n)
		return n;
	for (int d = 0; d < known && m.n < PNAMES_MAX; d++) {
		int dfd, i;

		for (i = 0; i < d && dirs[i] != dirs[d]; i++)
			;
		if (i < d)
			continue;	/* looked through already */
		dfd = fs_fd_hold(dirs[d]);
		dfd = dfd < 0 ? -1 : openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		fs_fd_release(dirs[d]);
		if (dfd >= 0 && fstat(dfd, &done[*ndone]) == 0)
			(*ndone)++;
		m.dir = dirs[d];
		each_link_in(dfd, st, more_names_one, &m);
	}
	return m.n;
}

/*
 * The links that the scans of the known names' directories did not find
 * (st_nlink says how many there are: hard links across directories, seen by
 * a restarted daemon or made outside the mount): a walk of the whole backing
 * tree, the directories in done[] left out, that stops once `missing` links
 * were found.  It costs a walk of the namespace, so it runs only when names
 * are known to be missing.
 */
#define TREE_DEPTH_MAX	256	/* directories deeper than this are not walked */

struct tree_scan {
	struct fs_inode *in;
	const struct stat *st;		/* the file's backing file */
	const struct stat *done;	/* directories scanned already */
	int ndone;
	int missing;			/* links still to find */
	bool intent;
	char rel[PATH_MAX];		/* the directory being walked */
};

static void tree_links_in(int dfd, size_t len, struct tree_scan *t, int depth)
{
	char rel[PATH_MAX];
	struct stat dst, est;
	struct dirent *de;
	bool scanned = false;
	DIR *dp;

	if (fstat(dfd, &dst) < 0 || !(dp = fdopendir(dfd))) {
		close(dfd);
		return;
	}
	for (int i = 0; i < t->ndone; i++)
		if (t->done[i].st_ino == dst.st_ino && t->done[i].st_dev == dst.st_dev)
			scanned = true;
	while (t->missing > 0 && (de = readdir(dp))) {
		bool dir = de->d_type == DT_DIR;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fs_hidden_name(de->d_name))
			continue;
		if (de->d_type == DT_UNKNOWN) {
			if (fstatat(dirfd(dp), de->d_name, &est, AT_SYMLINK_NOFOLLOW) < 0)
				continue;
			dir = S_ISDIR(est.st_mode);
		}
		if (dir) {
			size_t nl = strlen(de->d_name);
			int cfd;

			if (depth >= TREE_DEPTH_MAX || len + nl + 2 > sizeof(t->rel))
				continue;
			cfd = openat(dirfd(dp), de->d_name,
				     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (cfd < 0)
				continue;
			snprintf(t->rel + len, sizeof(t->rel) - len, "%s%s", len ? "/" : "",
				 de->d_name);
			tree_links_in(cfd, len + nl + (len ? 1 : 0), t, depth + 1);
			t->rel[len] = 0;
			continue;
		}
		if (scanned || !link_of(dirfd(dp), de, t->st) ||
		    join(rel, sizeof(rel), t->rel, de->d_name))
			continue;
		copy_name(t->in, NULL, rel, t->intent);
		t->missing--;
	}
	closedir(dp);
}

static void tree_links(struct fs_inode *in, const struct stat *st, const struct stat *done,
		       int ndone, int missing, bool intent)
{
	struct tree_scan *t;
	int dfd;

	if (missing <= 0 || !(t = calloc(1, sizeof(*t))))
		return;
	*t = (struct tree_scan){ .in = in, .st = st, .done = done, .ndone = ndone,
				 .missing = missing > PNAMES_MAX ? PNAMES_MAX : missing,
				 .intent = intent };
	dfd = openat(fs.root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0)
		tree_links_in(dfd, 0, t, 0);
	if (t->missing > 0)
		tlog(LOG_DEBUG, "persist: %d link(s) of inode %llu not found in the backing tree",
		     t->missing, (unsigned long long)st->st_ino);
	free(t);
}

/*
 * Every name of in gets the new version: in DIR, hard links are separate
 * files (a version renamed into place replaces one name).  fs.nslock held:
 * the names are steady.
 */
static void each_name(struct fs_inode *in, bool intent);

/* The counted intent of a created file ends (its copy is queued, or it
 * will never have one). */
static void created_done(struct fs_inode *in)
{
	if (!pq.dir)
		return;
	pq_lock();
	if (in->pcreated) {
		in->pcreated = false;
		pq.intents--;
		jempty();
	}
	pq_unlock();
}

void fs_persist_committed(struct fs_inode *in)
{
	each_name(in, false);
	created_done(in);
}

bool fs_persist_name_begin(struct fs_inode *dir, const char *name, struct fs_inode *in)
{
	char drel[PATH_MAX], rel[PATH_MAX];
	int m = -1, fd;

	if (pq.jfd < 0 || rel_of(dir, drel, sizeof(drel)) || join(rel, sizeof(rel), drel, name))
		return false;
	if (in) {		/* a link: the file's own mark, if it has one */
		fd = fs_fd_hold(in);
		if (fd >= 0) {
			char proc[64];

			fs_proc_path(fd, proc, sizeof(proc));
			m = mark_at(proc, true);
		}
		fs_fd_release(in);
	}
	if (m == 0 || (m < 0 && !marked(rel)))
		return false;
	pq_lock();
	pq.intents++;	/* the journal keeps the record until it ends */
	jappend(&(struct pop){ .kind = P_COPY, .path = rel, .started = true });	/* 'I' */
	pq_unlock();
	return true;
}

void fs_persist_created(struct fs_inode *in, struct fs_inode *dir, const char *name, bool held)
{
	char drel[PATH_MAX], rel[PATH_MAX];

	if (!pq.dir || !S_ISREG(in->type) || rel_of(dir, drel, sizeof(drel)) ||
	    join(rel, sizeof(rel), drel, name) || !marked(rel)) {
		if (held)
			fs_persist_intent_end();
		return;
	}
	pq_lock();
	bool first = !in->pcreated;

	if (first) {
		in->pcreated = true;	/* the intent held, or a new one */
		if (!held) {
			pq.intents++;	/* the journal keeps the record until then */
			jappend(&(struct pop){ .kind = P_COPY, .path = rel, .started = true });
		}
	}
	pq_unlock();
	if (!first && held)
		fs_persist_intent_end();	/* its creation is counted already */
}

void fs_persist_released(struct fs_inode *in)
{
	uint64_t size = 0;
	struct timespec mt;
	struct stat st;
	bool pending;
	int fd;

	if (!pq.dir)
		return;
	pq_lock();
	pending = in->pcreated;
	pq_unlock();
	if (!pending)
		return;
	/* data not flushed yet: its commit queues the copies */
	if (tfile_attr(&in->tf, &size, &mt) && size)
		return;
	fs_ns_lock();
	fd = fs_fd_hold(in);
	if (fd >= 0 && fstatat(fd, "", &st, AT_EMPTY_PATH) == 0 && st.st_size == 0) {
		each_name(in, false);
		created_done(in);
	}
	fs_fd_release(in);
	fs_ns_unlock();
}

/* A regular file's inode is freed (fs.lock held). */
static void fs_persist_forget(struct fs_inode *in)
{
	created_done(in);
}

void fs_persist_intent(struct fs_inode *in, bool counted)
{
	if (pq.jfd < 0 || !S_ISREG(in->type))
		return;
	if (counted) {
		pq_lock();
		pq.intents++;
		pq_unlock();
	}
	each_name(in, true);
}

void fs_persist_intent_end(void)
{
	if (pq.jfd < 0)
		return;
	pq_lock();
	pq.intents--;
	jempty();
	pq_unlock();
}

static const char *base_of(const char *rel);

/*
 * each_name() for a file known only by rel (the name its descriptor was
 * opened by): rel and the entries of rel's directory with its inode.
 */
struct rel_names_scan {
	struct fs_inode *in;
	const char *drel, *skip;
	bool intent;
	int n;
};

/* each_link_in()'s callback of rel_names(): copy drel/name */
static bool rel_names_one(void *arg, const char *name)
{
	struct rel_names_scan *r = arg;
	char rel[PATH_MAX];

	if ((r->skip && !strcmp(name, r->skip)) || join(rel, sizeof(rel), r->drel, name))
		return true;
	copy_name(r->in, NULL, rel, r->intent);
	return ++r->n < PNAMES_MAX;
}

/* Returns the number of names found (rel itself when self); the directory
 * scanned goes to *done. */
static int rel_names(struct fs_inode *in, const struct stat *st, const char *rel, bool self,
		     bool intent, struct stat *done, int *ndone)
{
	const char *b = base_of(rel);
	char drel[PATH_MAX];
	struct rel_names_scan r = { .in = in, .drel = drel, .skip = self ? b : NULL,
				    .intent = intent, .n = self ? 1 : 0 };
	int dfd;

	if (self)
		copy_name(in, NULL, rel, intent);
	if (st->st_nlink < (self ? 2u : 1u))
		return r.n;
	snprintf(drel, sizeof(drel), "%.*s", b > rel ? (int)(b - rel - 1) : 0, rel);
	dfd = walk_beneath(fs.root_fd, drel, false, NULL, NULL, NULL);
	if (dfd >= 0 && fstat(dfd, &done[*ndone]) == 0)
		(*ndone)++;
	each_link_in(dfd, st, rel_names_one, &r);
	return r.n;
}

static void each_name(struct fs_inode *in, bool intent)
{
	struct fs_inode *dirs[PNAMES_MAX];
	char *names[PNAMES_MAX];
	struct stat st, done[PNAMES_MAX];
	struct fs_alias *a;
	char rel[PATH_MAX];
	int n = 0, i, ndone = 0, found = 0, fd;
	bool have_st, have_rel, removed = false;

	if (!pq.dir || !S_ISREG(in->type))
		return;
	fs_lock();
	if (in->name && in->parent && !in->unlinked) {
		dirs[n] = in->parent;
		names[n++] = strdup(in->name);
	}
	for (a = in->unlinked ? NULL : in->aliases; a && n < PNAMES_MAX; a = a->next) {
		dirs[n] = a->parent;
		names[n++] = strdup(a->name);
	}
	for (i = 0; i < n; i++)
		fs_inode_get(dirs[i]);
	fs_unlock();
	/* no known name: the name its descriptor was opened by (rel) */
	fd = fs_fd_hold(in);
	have_st = fd >= 0 && fstatat(fd, "", &st, AT_EMPTY_PATH) == 0;
	have_rel = have_st && !n && !in->unlinked &&
		   !rel_of_fd_any(fd, rel, sizeof(rel), &removed) && *rel;
	fs_fd_release(in);
	if (n) {
		if (have_st)
			n = more_names(&st, dirs, names, n, done, &ndone);
		found = n;
	} else if (have_rel) {
		/* a hard-linked file whose known names are gone: rel, if that
		 * still is one, and the other names of the file in that
		 * directory (also when that name was removed) */
		found = rel_names(in, &st, rel, !removed, intent, done, &ndone);
	}
	/* names in directories that no known name is in */
	if (have_st && (found || !in->unlinked) && found < PNAMES_MAX &&
	    st.st_nlink > (nlink_t)found)
		tree_links(in, &st, done, ndone, (int)(st.st_nlink - found), intent);
	for (i = 0; i < n; i++) {
		if (names[i])
			copy_name(in, dirs[i], names[i], intent);
		free(names[i]);
		fs_inode_put(dirs[i]);
	}
}

void fs_persist_linked(struct fs_inode *in, struct fs_inode *dir, const char *name)
{
	if (pq.dir && S_ISREG(in->type))
		copy_name(in, dir, name, false);
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
	jappend(op);
	pq_unlock();
	op->journaled = true;
	return op;
}

struct pop *fs_persist_remove_begin(struct fs_inode *dir, const char *name, bool isdir)
{
	char drel[PATH_MAX], rel[PATH_MAX];

	if (!pq.dir || rel_of(dir, drel, sizeof(drel)) || join(rel, sizeof(rel), drel, name))
		return NULL;
	return ns_begin(isdir ? P_RMDIR : P_UNLINK, rel, NULL, 0);
}

struct pop *fs_persist_rename_begin(struct fs_inode *p, const char *name, struct fs_inode *np,
				    const char *nn, unsigned flags)
{
	char a[PATH_MAX], b[PATH_MAX], ra[PATH_MAX], rb[PATH_MAX];

	if (!pq.dir || rel_of(p, a, sizeof(a)) || rel_of(np, b, sizeof(b)) ||
	    join(ra, sizeof(ra), a, name) || join(rb, sizeof(rb), b, nn))
		return NULL;
	return ns_begin(P_RENAME, ra, rb, flags);
}

void fs_persist_ns_end(struct pop *op, bool done)
{
	static const char cancel[] = "Z0\0\0", made[] = "Y0\0\0";
	const char *rec = done ? made : cancel;

	if (!op)
		return;
	pq_lock();
	/* Y: made, Z: not made (a replay drops it) */
	if (pq.jfd >= 0 && write(pq.jfd, rec, sizeof(made)) != sizeof(made))
		tlog(LOG_WARNING, "persist: cannot write %s: %s", PJOURNAL, strerror(errno));
	if (done) {
		queue(op);
		op = NULL;
	}
	pq_unlock();
	if (op)
		op_free(op);
}

/* ------------------------------------------------------------ copying */

static const char *base_of(const char *rel)
{
	const char *s = strrchr(rel, '/');

	return s ? s + 1 : rel;
}

/*
 * Copy src (size st->st_size) into wfd with a bounded buffer; bw: cap in
 * bytes/s (0: none); stop: give up when it turns true; alive: the time of
 * the last progress (ms), or NULL.
 */
static int copy_data(int src, int wfd, uint64_t size, uint64_t bw, bool *stop, uint64_t *alive)
{
	char *buf = malloc(PCHUNK);
	uint64_t done = 0;
	double t0 = tier_now();
	bool cfr = true;	/* copy_file_range until it says it cannot */
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	for (;;) {
		ssize_t n, w = 0;

		if (cfr) {
			loff_t in = (loff_t)done;

			/* in the kernel; a reflink or a server-side copy where
			 * the file systems can (the same one), else EXDEV */
			n = copy_file_range(src, &in, wfd, NULL, PCHUNK, 0);
			if (n < 0 && done == 0 && (errno == EXDEV || errno == EINVAL ||
						   errno == ENOSYS || errno == EOPNOTSUPP)) {
				cfr = false;
				continue;
			}
			w = n;
		} else {
			n = pread(src, buf, PCHUNK, (off_t)done);
		}
		if (n < 0) {
			ret = -errno;
			break;
		}
		if (n == 0)
			break;
		while (w < n) {
			ssize_t k = write(wfd, buf + w, (size_t)(n - w));

			if (k < 0) {
				ret = -errno;
				goto out;
			}
			w += k;
		}
		done += (uint64_t)n;
		if (alive)
			__atomic_store_n(alive, now_ms(), __ATOMIC_RELAXED);
		if (stop && __atomic_load_n(stop, __ATOMIC_RELAXED)) {
			ret = -ECANCELED;
			break;
		}
		if (bw) {
			double ahead = (double)done / (double)bw - (tier_now() - t0);

			if (ahead > 0)
				usleep((useconds_t)(ahead * 1e6));
		}
	}
out:
	(void)size;
	free(buf);
	return ret;
}

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
	fd = walk_beneath(fs.root_fd, rel, false, NULL, NULL, NULL);
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

	root = open_dir_root();
	if (root < 0)
		return root;
	dfd = walk_beneath(root, rel, true, NULL, made_like_backing, NULL);
	close(root);
	if (dfd < 0)
		return dfd;
	gethostname(host, sizeof(host) - 1);
	snprintf(tmp, sizeof(tmp), PTMP_PREFIX "%.40s.%lu.%lu", host, (unsigned long)getpid(),
		 ++counter);
	jtemp(rel, tmp);
	wfd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (wfd < 0) {
		ret = -errno;
		close(dfd);
		return ret;
	}
	__atomic_store_n(&pq.alive, now_ms(), __ATOMIC_RELAXED);
	ret = copy_data(src, wfd, (uint64_t)st->st_size, pq.bw, &pq.abort, &pq.alive);
	if (!ret) {
		copy_xattrs(src, wfd);
		give_attrs(wfd, st, "a file in DIR");
	}
	if (!ret && fsync(wfd) < 0)
		ret = -errno;
	if (close(wfd) < 0 && !ret)
		ret = -errno;
	if (!ret && (fstat(src, &now) < 0 || !same_version(st, &now)))
		ret = -EAGAIN;		/* changed in place meanwhile */
	if (!ret && renameat(dfd, tmp, dfd, base_of(rel)) < 0)
		ret = -errno;
	if (ret)
		unlinkat(dfd, tmp, 0);
	else if (fsync(dfd) < 0 && errno != EINVAL)
		ret = -errno;
	if (!ret && pq.keep) {
		char drel[PATH_MAX];
		const char *b = base_of(rel);

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
		if (!marked(op->path))
			return 1;
		const char *b;
		int dfd = walk_beneath(fs.root_fd, op->path, true, &b, NULL, NULL);

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
	int root = open_dir_root(), ret = 0, d = -1, d2 = -1;
	const char *b, *b2;

	if (root < 0)
		return root;
	/* ENOENT on the way: the name never reached DIR (a copy follows,
	 * if it is persistent), or a replay of what was done */
	d = walk_beneath(root, op->path, true, &b, NULL, NULL);
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
		d2 = walk_beneath(root, op->path2, true, &b2, made_like_backing, NULL);
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
	jdone();
	jempty();
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
		__atomic_store_n(&pq.alive, now_ms(), __ATOMIC_RELAXED);
		pq_unlock();
		double t0 = tier_now();
		int ret = op->kind == P_COPY ? do_copy(op) : do_ns(op);
		double dt = tier_now() - t0;

		pq_lock();
		if (ret == -ECANCELED && pq.abort)
			break;
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
			if (covers(op->path, name)) {
				free(name);
				return NULL;
			}
			continue;
		}
		if (op->kind != P_RENAME)
			continue;
		if (covers(op->path, name)) {
			from = op->path;
			to = op->path2;
		} else if ((op->flags & RENAME_EXCHANGE) && covers(op->path2, name)) {
			from = op->path2;
			to = op->path;
		} else if (covers(op->path2, name)) {
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
		jappend(op);
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

	if (strncmp(base_of(rel), PTMP_PREFIX, strlen(PTMP_PREFIX)) != 0)
		return;		/* not one of ours: garbage */
	root = open_dir_root();
	d = root < 0 ? root : walk_beneath(root, rel, true, &b, NULL, NULL);
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
 * its operations less as many as it has done-markers (they end in order). */
static void replay(void)
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
		    backing_lstat(op->path, &lst) == 0) {
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

void fs_persist_start(void)
{
	int r;

	if (!pq.dir)
		return;
	pq.jfd = openat(fs.root_fd, PJOURNAL, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (pq.jfd < 0)
		tlog(LOG_WARNING, "persist: cannot open %s: %s; a restart may miss operations",
		     PJOURNAL, strerror(errno));
	else
		replay();
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
		if (pq.jfd >= 0)
			unlinkat(fs.root_fd, PJOURNAL, 0);
	}
	if (pq.jfd >= 0)
		close(pq.jfd);
	pq.jfd = -1;
	pq.head = pq.tail = NULL;
	return left + (unsigned)pq.failed;
}

/* ------------------------------------------------------------ restart */

/* Copy DIR's file (src, stat st) into the backing directory dfd as name. */
static int fetch_file(int src, const struct stat *st, struct fs_inode *dir, const char *name,
		      const char *rel, struct pjob *j)
{
	static unsigned long counter;
	char tmp[64];
	int wfd, pfd, ret;

	snprintf(tmp, sizeof(tmp), PFETCH_PREFIX "%lu.%lu", (unsigned long)getpid(),
		 __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	wfd = openat(fs.root_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (wfd < 0)
		return -errno;
	ret = copy_data(src, wfd, (uint64_t)st->st_size, 0, &j->cancel, &j->alive);
	if (!ret)
		copy_xattrs(src, wfd);
	if (!ret && fsetxattr(wfd, TIERFS_XATTR_PERSIST, "1", 1, 0) < 0 && errno != ENOTSUP)
		ret = -errno;
	if (!ret)
		give_attrs(wfd, st, "a fetched file");
	if (!ret && fdatasync(wfd) < 0)
		ret = -errno;
	if (close(wfd) < 0 && !ret)
		ret = -errno;
	if (ret) {
		unlinkat(fs.root_fd, tmp, 0);
		return ret;
	}
	/* under fs.nslock: no removal through the mount slips in between
	 * its whiteout check and the rename */
	fs_ns_lock();
	pfd = fs_fd_hold(dir);
	if (pfd < 0)
		ret = pfd;
	else if (whiteout_locked(rel))
		ret = -ENOENT;
	else if (__atomic_load_n(&j->cancel, __ATOMIC_RELAXED))
		ret = -ECANCELED;	/* the lookup said "absent" meanwhile */
	else if (renameat2(fs.root_fd, tmp, pfd, name, RENAME_NOREPLACE) < 0)
		ret = errno == EEXIST ? 0 : -errno;	/* EEXIST: someone was first */
	else
		tmp[0] = 0;
	fs_fd_release(dir);
	fs_ns_unlock();
	if (tmp[0])
		unlinkat(fs.root_fd, tmp, 0);
	if (!ret) {
		pq_lock();
		pq.fetched_files++;
		pq.fetched_bytes += (uint64_t)st->st_size;
		pq_unlock();
		tlog(LOG_INFO, "persist: fetched %s from %s", rel, pq.dir);
	}
	return ret;
}

static int fetch_dir(const struct stat *st, struct fs_inode *dir, const char *name,
		     const char *rel)
{
	int pfd, ret = 0;

	fs_ns_lock();
	pfd = fs_fd_hold(dir);
	if (pfd < 0)
		ret = pfd;
	else if (whiteout_locked(rel))
		ret = -ENOENT;
	else if (mkdirat(pfd, name, 0700) < 0)
		ret = errno == EEXIST ? 0 : -errno;
	else {
		int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

		if (fd >= 0) {
			fsetxattr(fd, TIERFS_XATTR_PERSIST, "1", 1, 0);
			give_attrs(fd, st, "a fetched directory");
			close(fd);
		}
	}
	fs_fd_release(dir);
	fs_ns_unlock();
	return ret;
}

static int job_fetch(struct pjob *j)
{
	struct stat st;
	const char *b;
	int root, src, d, ret;

	root = open_dir_root();
	if (root < 0)
		return -ENOENT;
	/* nothing but a directory or a regular file is opened (a device or
	 * a FIFO that a user put in DIR, a link anywhere on the way) */
	d = walk_beneath(root, j->rel, true, &b, NULL, NULL);
	close(root);
	if (d < 0 || fstatat(d, b, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
	    !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))) {
		ret = d < 0 ? d : S_ISLNK(st.st_mode) ? -ELOOP : -ENOENT;
		if (d >= 0)
			close(d);
		if (ret == -ELOOP || ret == -ENOTDIR)
			refused(j->rel, ret);
		return -ENOENT;
	}
	src = backing_open(d, b, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
	close(d);
	if (src < 0)
		return -ENOENT;
	if (fstat(src, &st) < 0)
		ret = -errno;
	else if (S_ISDIR(st.st_mode))
		ret = fetch_dir(&st, j->in, j->name, j->rel);
	else if (S_ISREG(st.st_mode))
		ret = fetch_file(src, &st, j->in, j->name, j->rel, j);
	else
		ret = -ENOENT;
	close(src);
	if (ret && ret != -ENOENT && ret != -ECANCELED)
		tlog(LOG_WARNING, "persist: cannot fetch %s from %s: %s", j->rel, pq.dir,
		     strerror(-ret));
	return ret;
}

/* A lookup found no dir/name in the backing directory: bring it from DIR
 * (0: it is there now; -ENOENT: DIR has none either, or it was removed
 * through the mount).  fs.nslock not held. */
static int fs_persist_fetch(struct fs_inode *dir, const char *name)
{
	char drel[PATH_MAX];
	struct pjob *j;
	int ret = -ENOENT;

	if (!pq.dir || fs_hidden_name(name) || strlen(name) > NAME_MAX ||
	    rel_of(dir, drel, sizeof(drel)))
		return -ENOENT;
	j = pjob_new(job_fetch);
	if (!j)
		return -ENOENT;
	snprintf(j->name, sizeof(j->name), "%s", name);
	if (join(j->rel, sizeof(j->rel), drel, name) || whiteout_locked(j->rel)) {
		pjob_put(j);
		return -ENOENT;
	}
	fs_inode_get(dir);
	j->in = dir;
	if (pg_run(j, "a lookup") && j->ret == 0)
		ret = 0;
	pjob_put(j);
	return ret;
}

struct pent {
	char *name;
	unsigned char type;
	ino_t ino;
};

struct fs_psnap {
	size_t n, cap;
	struct pent *e;
};

static int snap_add(struct fs_psnap *s, const char *name, unsigned char type, ino_t ino)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 64;
		struct pent *e = realloc(s->e, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		s->e = e;
		s->cap = cap;
	}
	if (!(s->e[s->n].name = strdup(name)))
		return -ENOMEM;
	s->e[s->n].type = type;
	s->e[s->n].ino = ino;
	s->n++;
	return 0;
}

void fs_persist_snap_free(struct fs_psnap *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		free(s->e[i].name);
	free(s->e);
	free(s);
}

/* DIR's directory rel, open as a stream, or NULL */
static DIR *open_pdir(const char *rel)
{
	int root = open_dir_root(), fd;
	DIR *d;

	if (root < 0)
		return NULL;
	fd = walk_beneath(root, rel, false, NULL, NULL, NULL);
	close(root);
	if (fd < 0)
		return NULL;
	d = fdopendir(fd);
	if (!d)
		close(fd);
	return d;
}

/* Add DIR's entries of rel that local (a directory fd) lacks; count them. */
static long add_extras(struct fs_psnap *s, const char *rel, int local)
{
	char crel[PATH_MAX];
	struct dirent *de;
	struct stat st;
	long n = 0;
	DIR *d = open_pdir(rel);

	if (!d)
		return 0;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fs_hidden_name(de->d_name))
			continue;
		if (fstatat(local, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
			continue;
		if (join(crel, sizeof(crel), rel, de->d_name) || whiteout_locked(crel))
			continue;
		if (de->d_type != DT_DIR && de->d_type != DT_REG && de->d_type != DT_UNKNOWN)
			continue;	/* only files and directories are fetched */
		if (s && snap_add(s, de->d_name, de->d_type, de->d_ino))
			break;
		n++;
	}
	closedir(d);
	return n;
}

static int job_extras(struct pjob *j)
{
	if (!j->snap && !(j->snap = calloc(1, sizeof(*j->snap))))
		return -ENOMEM;
	j->n = add_extras(j->snap, j->rel, j->fd);
	return 0;
}

struct fs_psnap *fs_persist_snapshot(struct fs_inode *in, DIR *dp)
{
	struct fs_psnap *s = NULL, *x;
	struct dirent *de;
	struct pjob *j;

	if (!pq.dir || !(j = pjob_new(job_extras)))
		return NULL;
	if (rel_of(in, j->rel, sizeof(j->rel)) ||
	    (j->fd = fcntl(dirfd(dp), F_DUPFD_CLOEXEC, 0)) < 0 ||
	    !pg_run(j, "a listing") || j->ret || j->n == 0 || !(s = calloc(1, sizeof(*s)))) {
		pjob_put(j);
		return s;
	}
	rewinddir(dp);
	while ((de = readdir(dp)))	/* local entries: the numbers a stat shows */
		if (!fs_hidden_name(de->d_name) &&
		    snap_add(s, de->d_name, de->d_type,
			     fs_dirent_ino(in, dirfd(dp), de->d_name, de->d_ino, de->d_type)))
			break;
	x = j->snap;
	for (size_t i = 0; i < x->n; i++)
		if (snap_add(s, x->e[i].name, x->e[i].type, x->e[i].ino))
			break;
	pjob_put(j);
	return s;
}

size_t fs_persist_readdir(void *req, struct fs_psnap *s, char *buf, size_t size, off_t off)
{
	size_t used = 0;

	for (size_t i = (size_t)off; i < s->n; i++) {
		struct stat st = { .st_ino = s->e[i].ino ? s->e[i].ino : 1,
				   .st_mode = (mode_t)s->e[i].type << 12 };
		size_t n = fuse_add_direntry(req, buf + used, size - used, s->e[i].name, &st,
					     (off_t)i + 1);

		if (n > size - used)
			break;
		used += n;
	}
	return used;
}

static int job_count(struct pjob *j)
{
	j->n = add_extras(NULL, j->rel, j->fd);
	return 0;
}

int fs_persist_may_rmdir(struct fs_inode *dir, const char *name)
{
	char drel[PATH_MAX];
	struct pjob *j;
	int pfd, ret = 0;

	if (!pq.dir || rel_of(dir, drel, sizeof(drel)) || !(j = pjob_new(job_count)))
		return 0;
	if (join(j->rel, sizeof(j->rel), drel, name)) {
		pjob_put(j);
		return 0;
	}
	pfd = fs_fd_hold(dir);
	j->fd = pfd < 0 ? -1 : openat(pfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fs_fd_release(dir);
	if (j->fd >= 0 && pg_run(j, "rmdir's check") && j->n)
		ret = -ENOTEMPTY;
	pjob_put(j);
	return ret;
}

/* ------------------------------------------------------------ sets in DIR */

#define RECORD_MAX	(64u << 20)	/* bytes of a record read at most */

/* The record of the set directory sfd (in DIR), malloc'ed and
 * NUL-terminated, or NULL (none, not a regular file, too big). */
static char *record_read(int sfd, size_t *len)
{
	struct stat st;
	char *t = NULL;
	int fd = openat(sfd, FS_SET_RECORD, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size <= RECORD_MAX &&
	    (t = malloc((size_t)st.st_size + 1))) {
		if (pread(fd, t, (size_t)st.st_size, 0) == st.st_size) {
			t[st.st_size] = 0;
			if (len)
				*len = (size_t)st.st_size;
		} else {
			free(t);
			t = NULL;
		}
	}
	close(fd);
	return t;
}

/* Is sfd/name a regular file of size and mtime? */
static bool pfile_there(int sfd, const char *name, uint64_t size, const struct timespec *mt)
{
	struct stat st;

	return !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..") &&
	       fstatat(sfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
	       (uint64_t)st.st_size == size && st.st_mtim.tv_sec == mt->tv_sec &&
	       st.st_mtim.tv_nsec == mt->tv_nsec;
}

/*
 * Judge the set directory sfd of DIR by its record (the lines of
 * fs_sets.c's format that matter here: "committed SEC.NSEC" and "file
 * SIZE SEC.NSEC NAME"): 1 every file named is there as recorded, 0 not,
 * -1 no record (or one that does not parse).  *committed: its time.
 */
static int record_judge(int sfd, struct timespec *committed)
{
	char *t = record_read(sfd, NULL), *p, *nl, *end;
	int ret = 1;

	if (!t)
		return -1;
	memset(committed, 0, sizeof(*committed));
	if (strncmp(t, "tierfs-set 1\n", 13))
		ret = -1;
	for (p = t + 13; ret >= 0 && *p; p = nl + 1) {
		if (!(nl = strchr(p, '\n'))) {
			ret = -1;
			break;
		}
		*nl = 0;
		if (!strncmp(p, "committed ", 10)) {
			committed->tv_sec = strtoll(p + 10, &end, 10);
			committed->tv_nsec = *end == '.' ? strtol(end + 1, NULL, 10) : 0;
		} else if (!strncmp(p, "file ", 5)) {
			struct timespec mt;
			uint64_t size = strtoull(p + 5, &end, 10);

			if (*end != ' ') {
				ret = -1;
				break;
			}
			mt.tv_sec = strtoll(end + 1, &end, 10);
			if (*end != '.') {
				ret = -1;
				break;
			}
			mt.tv_nsec = strtol(end + 1, &end, 10);
			if (*end != ' ') {
				ret = -1;
				break;
			}
			if (!pfile_there(sfd, end + 1, size, &mt))
				ret = 0;
		}
	}
	free(t);
	return ret >= 0 && !committed->tv_sec ? -1 : ret;
}

struct sent {
	char *name;
	struct timespec committed;
};

static int sent_newest_first(const void *a, const void *b)
{
	const struct sent *x = a, *y = b;

	if (x->committed.tv_sec != y->committed.tv_sec)
		return x->committed.tv_sec < y->committed.tv_sec ? 1 : -1;
	if (x->committed.tv_nsec != y->committed.tv_nsec)
		return x->committed.tv_nsec < y->committed.tv_nsec ? 1 : -1;
	return -strcmp(x->name, y->name);
}

/* Remove set directory pfd/name of DIR: its record first (no record: no
 * set), its files, itself.  A subdirectory in it (not the set's) or a copy
 * under way into it keeps it whole.  0 or -errno. */
static int remove_dir_set(int pfd, const char *name)
{
	struct dirent *de;
	int sfd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), ret = 0;
	DIR *d = sfd < 0 ? NULL : fdopendir(sfd);

	if (!d) {
		ret = -errno;
		if (sfd >= 0)
			close(sfd);
		return ret;
	}
	while ((de = readdir(d)))
		if ((de->d_type == DT_DIR && strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) ||
		    !strncmp(de->d_name, PTMP_PREFIX, strlen(PTMP_PREFIX))) {
			closedir(d);
			return -EBUSY;
		}
	if (unlinkat(sfd, FS_SET_RECORD, 0) < 0 && errno != ENOENT)
		ret = -errno;
	rewinddir(d);
	while (!ret && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    unlinkat(sfd, de->d_name, 0) < 0 && errno != ENOENT)
			ret = -errno;
	closedir(d);
	if (!ret && unlinkat(pfd, name, AT_REMOVEDIR) < 0)
		ret = -errno;
	return ret;
}

/*
 * -o persist_keep=N where sets are: DIR's directory pfd (rel: its path,
 * for the log) keeps the N newest sets complete there (by their records:
 * every file as recorded); older complete ones are removed from DIR, not
 * from the backing directory.  Incomplete sets, and directories without a
 * record (a set whose files are still on their way), are never removed:
 * a set goes only once N newer ones are complete in DIR.
 */
static void prune_sets(int pfd, const char *rel)
{
	struct sent *e = NULL;
	size_t n = 0, cap = 0, i;
	struct dirent *de;
	int fd = fcntl(pfd, F_DUPFD_CLOEXEC, 0);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);

	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(d))) {
		struct timespec c;
		int sfd;

		if ((de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) ||
		    fs_hidden_name(de->d_name) || !strcmp(de->d_name, ".") ||
		    !strcmp(de->d_name, ".."))
			continue;
		sfd = openat(pfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sfd < 0)
			continue;
		if (record_judge(sfd, &c) == 1) {
			if (n == cap) {
				struct sent *ne = realloc(e, (cap = cap ? 2 * cap : 16) * sizeof(*e));

				if (!ne) {
					close(sfd);
					break;
				}
				e = ne;
			}
			if ((e[n].name = strdup(de->d_name)))
				e[n++].committed = c;
		}
		close(sfd);
	}
	closedir(d);
	if (n > pq.keep)
		qsort(e, n, sizeof(*e), sent_newest_first);
	for (i = pq.keep; i < n; i++) {
		int ret = remove_dir_set(pfd, e[i].name);

		if (!ret) {
			pq_lock();
			pq.pruned++;
			pq_unlock();
			tlog(LOG_INFO, "persist: persist_keep=%u: removed set %s/%s%s%s", pq.keep,
			     pq.dir, rel, *rel ? "/" : "", e[i].name);
		} else {
			tlog(ret == -EBUSY ? LOG_INFO : LOG_WARNING,
			     "persist: persist_keep: set %s/%s%s%s kept: %s", pq.dir, rel,
			     *rel ? "/" : "", e[i].name, ret == -EBUSY ?
			     "a copy into it is under way, or it has a subdirectory" : strerror(-ret));
		}
	}
	for (i = 0; i < n; i++)
		free(e[i].name);
	free(e);
}

bool fs_rmdir_set_record(int dfd, const char *name)
{
	struct dirent *de;
	bool only = true;
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);

	if (!d) {
		if (fd >= 0)
			close(fd);
		return false;
	}
	while (only && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    strcmp(de->d_name, FS_SET_RECORD) && strcmp(de->d_name, FS_SET_RECORD_TMP))
			only = false;
	if (only) {
		only = unlinkat(fd, FS_SET_RECORD, 0) == 0;
		unlinkat(fd, FS_SET_RECORD_TMP, 0);
	}
	closedir(d);
	return only;
}

static int job_record_put(struct pjob *j)
{
	static unsigned long counter;
	char tmp[NAME_MAX + 1], host[64] = "";
	const char *b;
	int root, pfd, sfd, wfd, ret = 0;

	root = open_dir_root();
	if (root < 0)
		return root;
	pfd = walk_beneath(root, j->rel, true, &b, NULL, NULL);
	close(root);
	if (pfd < 0)
		return pfd == -ENOENT ? -ESTALE : pfd;
	sfd = openat(pfd, b, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sfd < 0) {
		ret = errno == ENOENT ? -ESTALE : -errno;
		goto out_parent;
	}
	/* the commit point: only once every file of the set is there */
	for (size_t i = 0; i < j->nfiles; i++) {
		if (!pfile_there(sfd, j->files[i].name, j->files[i].size, &j->files[i].mtime)) {
			ret = -ESTALE;
			goto out;
		}
		__atomic_store_n(&j->alive, now_ms(), __ATOMIC_RELAXED);
	}
	gethostname(host, sizeof(host) - 1);
	snprintf(tmp, sizeof(tmp), PTMP_PREFIX "set.%.40s.%lu.%lu", host, (unsigned long)getpid(),
		 __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	wfd = openat(sfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (wfd < 0) {
		ret = -errno;
		goto out;
	}
	if (write(wfd, j->text, j->tlen) != (ssize_t)j->tlen)
		ret = errno ? -errno : -EIO;
	else if (fsync(wfd) < 0)
		ret = -errno;
	if (close(wfd) < 0 && !ret)
		ret = -errno;
	if (!ret && renameat(sfd, tmp, sfd, FS_SET_RECORD) < 0)
		ret = -errno;
	if (ret)
		unlinkat(sfd, tmp, 0);
	else if (fsync(sfd) < 0 && errno != EINVAL)
		ret = -errno;
	if (!ret) {
		tlog(LOG_INFO, "persist: set %s is complete in %s (its record written)", j->rel,
		     pq.dir);
		if (pq.keep) {
			char prel[PATH_MAX];

			snprintf(prel, sizeof(prel), "%.*s", b > j->rel ? (int)(b - j->rel - 1) : 0,
				 j->rel);
			prune_sets(pfd, prel);
		}
	}
out:
	close(sfd);
out_parent:
	close(pfd);
	return ret;
}

int fs_persist_record_put(struct fs_inode *dir, const char *text, size_t len,
			  const struct fs_pfile *files, size_t n)
{
	struct pjob *j;
	int ret = -ENOMEM;

	if (!pq.dir)
		return -EOPNOTSUPP;
	if (!(j = pjob_new(job_record_put)))
		return -ENOMEM;
	if (rel_of(dir, j->rel, sizeof(j->rel)) || !*j->rel) {
		pjob_put(j);
		return -EINVAL;
	}
	/* the job's own copies: it may outlive this call (DIR hung) */
	if (!(j->text = malloc(len + 1)) || !(j->files = calloc(n ? n : 1, sizeof(*files))))
		goto out;
	memcpy(j->text, text, len);
	j->tlen = len;
	for (; j->nfiles < n; j->nfiles++) {
		j->files[j->nfiles] = files[j->nfiles];
		if (!(j->files[j->nfiles].name = strdup(files[j->nfiles].name)))
			goto out;
	}
	ret = pg_run(j, "a set's record") ? j->ret : -ETIMEDOUT;
out:
	pjob_put(j);
	return ret;
}

static int pfile_cmp(const void *a, const void *b)
{
	return strcmp(((const struct fs_pfile *)a)->name, ((const struct fs_pfile *)b)->name);
}

static int job_record_get(struct pjob *j)
{
	struct dirent *de;
	size_t cap = 0;
	int root, sfd, fd;
	DIR *d;

	root = open_dir_root();
	if (root < 0)
		return -ENODATA;
	sfd = walk_beneath(root, j->rel, false, NULL, NULL, NULL);
	close(root);
	if (sfd < 0)
		return -ENODATA;
	j->text = record_read(sfd, &j->tlen);
	fd = j->text ? fcntl(sfd, F_DUPFD_CLOEXEC, 0) : -1;
	d = fd < 0 ? NULL : fdopendir(fd);
	if (!d) {
		if (fd >= 0)
			close(fd);
		close(sfd);
		return -ENODATA;
	}
	while ((de = readdir(d))) {
		struct stat st;
		struct fs_pfile *f;

		if (fs_hidden_name(de->d_name) || (de->d_type != DT_REG && de->d_type != DT_UNKNOWN) ||
		    fstatat(sfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
			continue;
		if (j->nfiles == cap) {
			f = realloc(j->files, (cap = cap ? 2 * cap : 16) * sizeof(*f));
			if (!f)
				break;
			j->files = f;
		}
		f = &j->files[j->nfiles];
		if (!(f->name = strdup(de->d_name)))
			break;
		f->size = (uint64_t)st.st_size;
		f->mtime = st.st_mtim;
		j->nfiles++;
		__atomic_store_n(&j->alive, now_ms(), __ATOMIC_RELAXED);
	}
	closedir(d);
	close(sfd);
	if (j->nfiles)
		qsort(j->files, j->nfiles, sizeof(*j->files), pfile_cmp);
	return 0;
}

int fs_persist_record_get(struct fs_inode *dir, char **text, struct fs_pfile **files,
			  size_t *n)
{
	struct pjob *j;
	int ret = -ENODATA;

	*text = NULL;
	*files = NULL;
	*n = 0;
	if (!pq.dir || !(j = pjob_new(job_record_get)))
		return -ENODATA;
	if (!rel_of(dir, j->rel, sizeof(j->rel)) && *j->rel && !whiteout_locked(j->rel) &&
	    pg_run(j, "a set's state") && j->ret == 0 && j->text) {
		*text = j->text;
		*files = j->files;
		*n = j->nfiles;
		j->text = NULL;
		j->files = NULL;
		j->nfiles = 0;
		ret = 0;
	}
	pjob_put(j);
	return ret;
}

/* ------------------------------------------------------------ xattrs */

bool fs_persist_xattr(const char *name)
{
	return strcmp(name, TIERFS_XATTR_PERSIST) == 0;
}

int fs_persist_getx(struct fs_inode *in, char *buf, size_t len)
{
	char rel[PATH_MAX];
	int ret = rel_of(in, rel, sizeof(rel));

	if (ret)
		return ret;
	return snprintf(buf, len, "%d", marked(rel) ? 1 : 0);
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
	if (rel_of(in, rel, sizeof(rel))) {
		fs_ns_unlock();
		return false;
	}
	pq_lock();
	quiet = in->pq_n == 0 && in->pstate != PS_FAILED;
	for (struct pop *op = pq.head; quiet && op; op = op->next)
		if (op->kind != P_COPY && (covers(op->path, rel) ||
					   (op->path2 && covers(op->path2, rel))))
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
	ret = rel_of(in, rel, sizeof(rel));
	if (!ret)
		queue_copy(in, rel, &w);
	fs_ns_unlock();
	if (ret)
		return ret;
	pq_lock();
	ret = -ECANCELED;
	while (!w.done && !pq.exited) {
		struct timespec ts;

		/* a DIR that hangs in the operation at work: give up */
		if (pq.head && pq.head->started &&
		    now_ms() - __atomic_load_n(&pq.alive, __ATOMIC_RELAXED) >
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
			if (!rel_of(in, rel, sizeof(rel)))
				queue_copy(in, rel, NULL);
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
	int root = open_dir_root(), d, ret = 0;

	if (root < 0)
		return root;
	d = walk_beneath(root, j->rel, true, &b, NULL, NULL);
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
	struct pjob *j = pjob_new(job_stat);
	int fd;
	bool ok;

	if (!j)
		return false;
	if (rel_of(in, j->rel, sizeof(j->rel))) {
		pjob_put(j);
		return false;
	}
	fd = fs_fd_hold(in);
	ok = fd >= 0 && fstatat(fd, "", &a, AT_EMPTY_PATH) == 0;
	fs_fd_release(in);
	b = &j->st;
	ok = ok && pg_run(j, "the state xattr") && j->ret == 0 && S_ISREG(b->st_mode) &&
	     a.st_size == b->st_size && a.st_mtim.tv_sec == b->st_mtim.tv_sec &&
	     a.st_mtim.tv_nsec == b->st_mtim.tv_nsec;
	pjob_put(j);
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
