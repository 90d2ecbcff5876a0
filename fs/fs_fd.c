/*
 * fs_fd.c - the daemon's descriptors are a budget.
 *
 * A mount may know millions of files; the daemon cannot keep a descriptor
 * on each.  Every inode keeps the file handle of its backing object
 * (name_to_handle_at at lookup) and an O_PATH descriptor only while it is
 * cached here: a use takes the descriptor with fs_fd_hold(), which reopens
 * it from the handle (open_by_handle_at on the backing directory) when it
 * was closed, and gives it back with fs_fd_release().  Cached descriptors
 * (O_PATH ones, the read descriptors of data_fd, open directory streams)
 * are counted; past the budget the least recently used ones that nobody
 * holds are closed.  A descriptor in use is never closed: holders count in
 * fd_users, borrowers of the read descriptor in data_users.
 *
 * Removed files: the backing inode of a file whose last name is gone lives
 * only as long as a descriptor on it.  While such a file is open (or a
 * request uses it) its descriptors are pinned; once it is not, they are
 * closed at the last use and never reopened (fd_gone): its space comes
 * back.  fstat through a descriptor the kernel still has then reports the
 * attributes the file had (gone_st), with no links.
 *
 * That last close frees the file's blocks, which takes the backing file
 * system a while for a big file (ext4 with discard: most of a second a
 * GiB), and an unlink or a rename over a checkpoint would wait for it.  A
 * removed file of CLOSE_LATER_BYTES or more is closed by the closer thread
 * instead, after the request was answered: its space comes back a moment
 * later.  An operation that fails with ENOSPC meanwhile waits for the
 * closes queued before it (fs_fd_frees_wait) and is tried again, as ext4
 * retries an allocation once its journal has let go of freed blocks.
 *
 * Without file handles (a backing file system that does not export them,
 * or a daemon without CAP_DAC_READ_SEARCH) descriptors are kept as before,
 * one per known inode, and the start-up log says so.
 *
 * Locking: fdc.lock guards the counts, the LRU and the fd, data_fd,
 * fd_users, data_users, fd_pinned, fd_gone and gone_st fields of every
 * inode; it is the innermost lock (nothing is taken under it) and nothing
 * is closed under it.  A holder counts in fd_users; a version commit
 * (fs_fd_replace) never waits for holders: it parks the replaced
 * descriptor (old_paths) until fd_users drops to 0.  Order:
 * fs.nslock -> fs.lock -> fdc.lock.  closer.lock is a leaf, taken with
 * fdc.lock dropped.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "fs.h"

struct oldfd {				/* a read descriptor of a replaced version */
	struct oldfd *next;
	int fd;
	int users;			/* borrowers left */
};

static struct {
	pthread_mutex_t lock;		/* see file comment */
	struct fs_inode *head, *tail;	/* LRU of evictable inodes, newest first */
	unsigned open;			/* descriptors counted (see file comment) */
	unsigned max;			/* the budget */
	unsigned peak;			/* most ever counted */
	bool handles;			/* open_by_handle_at works here */
	int mount_fd;			/* open_by_handle_at's (not O_PATH) */
	bool warned;			/* "over budget" logged */
} fdc = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* fdc.lock, through the lock-order check (innermost; lockorder.h). */
static void fdc_lock(void)
{
	ranked_lock(&fdc.lock, LR_FS_FD);
}

static void fdc_unlock(void)
{
	ranked_unlock(&fdc.lock, LR_FS_FD);
}

/* Descriptors closed after fdc.lock is dropped; `later`: those of a big
 * removed file, for the closer. */
struct closing {
	int fd[64];
	int n;
	bool later;
};

/* ---- the closer (see the file comment) ----------------------------------- */

#define CLOSE_LATER_BYTES	(8u << 20)	/* blocks a removed file holds */
#define CLOSER_MAX		32		/* descriptors queued at most */

static struct {
	pthread_mutex_t lock;		/* LR_FS_CLOSER: the fields below */
	pthread_cond_t work, done;	/* queued; a batch closed */
	int fd[CLOSER_MAX];
	int n;
	uint64_t queued, closed;	/* descriptors ever queued, closed */
	bool started;
} closer = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.work = PTHREAD_COND_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
};

static void *closer_main(void *arg)
{
	int fd[CLOSER_MAX], n;

	(void)arg;
	ranked_lock(&closer.lock, LR_FS_CLOSER);
	for (;;) {
		while (!closer.n)
			pthread_cond_wait(&closer.work, &closer.lock);
		n = closer.n;
		memcpy(fd, closer.fd, (size_t)n * sizeof(fd[0]));
		closer.n = 0;
		ranked_unlock(&closer.lock, LR_FS_CLOSER);
		tierfs_delay("gone_close");	/* the tests' slow disk */
		for (int i = 0; i < n; i++)
			close(fd[i]);
		ranked_lock(&closer.lock, LR_FS_CLOSER);
		closer.closed += (uint64_t)n;
		pthread_cond_broadcast(&closer.done);
	}
	return NULL;
}

/* Start the closer if it is not running (closer.lock held). */
static void closer_start_locked(void)
{
	pthread_t t;
	pthread_attr_t a;

	if (closer.started)
		return;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	closer.started = pthread_create(&t, &a, closer_main, NULL) == 0;
	pthread_attr_destroy(&a);
}

void fs_fd_start(void)
{
	ranked_lock(&closer.lock, LR_FS_CLOSER);
	closer_start_locked();
	ranked_unlock(&closer.lock, LR_FS_CLOSER);
}

/* Hand c's descriptors to the closer (started with the daemon, or here if
 * that failed).  false: it cannot take them (full, or no thread), the
 * caller closes them. */
static bool closer_take(struct closing *c)
{
	bool ok = false;

	ranked_lock(&closer.lock, LR_FS_CLOSER);
	closer_start_locked();
	if (closer.started && closer.n + c->n <= CLOSER_MAX) {
		memcpy(closer.fd + closer.n, c->fd, (size_t)c->n * sizeof(c->fd[0]));
		closer.n += c->n;
		closer.queued += (uint64_t)c->n;
		pthread_cond_signal(&closer.work);
		ok = true;
	}
	ranked_unlock(&closer.lock, LR_FS_CLOSER);
	return ok;
}

bool fs_fd_frees_wait(void)
{
	uint64_t upto;
	bool waited = false;

	ranked_lock(&closer.lock, LR_FS_CLOSER);
	upto = closer.queued;
	while (closer.closed < upto) {
		waited = true;
		pthread_cond_wait(&closer.done, &closer.lock);
	}
	ranked_unlock(&closer.lock, LR_FS_CLOSER);
	return waited;
}

static void closing_add(struct closing *c, int fd)
{
	if (fd < 0)
		return;
	if (c->n == (int)(sizeof(c->fd) / sizeof(c->fd[0]))) {
		/* full: close under the lock rather than leak (rare) */
		close(fd);
		return;
	}
	c->fd[c->n++] = fd;
}

static void closing_run(struct closing *c)
{
	if (c->later && c->n && closer_take(c)) {
		c->n = 0;
		return;
	}
	for (int i = 0; i < c->n; i++)
		close(c->fd[i]);
	c->n = 0;
}

/* ---- LRU (fdc.lock held) ------------------------------------------------ */

static bool evictable(const struct fs_inode *in)
{
	return in != &fs.root && in->fh && !in->fd_pinned && !in->fd_gone;
}

static void lru_unlink(struct fs_inode *in)
{
	if (!in->lru_in)
		return;
	if (in->lru_prev)
		in->lru_prev->lru_next = in->lru_next;
	else
		fdc.head = in->lru_next;
	if (in->lru_next)
		in->lru_next->lru_prev = in->lru_prev;
	else
		fdc.tail = in->lru_prev;
	in->lru_prev = in->lru_next = NULL;
	in->lru_in = false;
}

/* in was used: newest, if it belongs on the list at all */
static void lru_touch(struct fs_inode *in)
{
	if (in->lru_in && fdc.head == in)
		return;
	lru_unlink(in);
	if (!evictable(in) || (in->fd < 0 && in->data_fd < 0))
		return;
	in->lru_prev = NULL;
	in->lru_next = fdc.head;
	if (fdc.head)
		fdc.head->lru_prev = in;
	else
		fdc.tail = in;
	fdc.head = in;
	in->lru_in = true;
}

static void count_up(void)
{
	fdc.open++;
	if (fdc.open > fdc.peak)
		fdc.peak = fdc.open;
}

/* Close in's cached descriptors (nobody uses them).  fdc.lock held. */
static void drop_fds(struct fs_inode *in, struct closing *c)
{
	if (in->fd >= 0) {
		closing_add(c, in->fd);
		in->fd = -1;
		fdc.open--;
	}
	if (in->data_fd >= 0) {
		closing_add(c, in->data_fd);
		in->data_fd = -1;
		fdc.open--;
	}
	lru_unlink(in);
}

/*
 * Close unused descriptors from the old end of the LRU until at most
 * `target` are counted, or `c` is full.  fdc.lock held.  Returns how many
 * were closed.
 */
static int shrink_locked(unsigned target, struct closing *c)
{
	struct fs_inode *in = fdc.tail;
	unsigned steps = 0, limit = fdc.open + 16;
	int closed = 0;

	while (in && fdc.open > target && c->n + 2 <= (int)(sizeof(c->fd) / sizeof(c->fd[0])) &&
	       steps++ < limit) {
		struct fs_inode *prev = in->lru_prev;

		if (in->fd_users || in->data_users) {
			lru_touch(in);	/* in use: recent */
		} else {
			closed += (in->fd >= 0) + (in->data_fd >= 0);
			drop_fds(in, c);
		}
		in = prev;
	}
	return closed;
}

/* Bring the count back under the budget (fdc.lock not held). */
static void shrink(void)
{
	struct closing c = { .n = 0 };

	for (;;) {
		fdc_lock();
		/* a little below the budget, so that this runs in batches */
		unsigned target = fdc.max - fdc.max / 16;
		int closed = fdc.open > fdc.max ? shrink_locked(target, &c) : 0;
		bool over = fdc.open > fdc.max;

		if (over && !closed && !fdc.warned) {
			fdc.warned = true;
			tlog(LOG_WARNING, "%u descriptors in use, more than max_fds=%u "
			     "(open files and directories)", fdc.open, fdc.max);
		}
		fdc_unlock();
		closing_run(&c);
		if (!over || !closed)
			return;
	}
}

bool fs_fd_reclaim(int err)
{
	struct closing c = { .n = 0 };
	int closed;

	if (err != EMFILE && err != ENFILE && err != -EMFILE && err != -ENFILE)
		return false;
	fdc_lock();
	closed = shrink_locked(fdc.open / 2, &c);
	fdc_unlock();
	closing_run(&c);
	if (closed)
		tlog(LOG_INFO, "out of descriptors (%s): closed %d cached ones",
		     strerror(err < 0 ? -err : err), closed);
	return closed > 0;
}

/* ---- set-up --------------------------------------------------------------- */

static struct file_handle *handle_of(int fd)
{
	struct file_handle *fh;
	int mnt;

	fh = malloc(sizeof(*fh) + MAX_HANDLE_SZ);
	if (!fh)
		return NULL;
	fh->handle_bytes = MAX_HANDLE_SZ;
	if (name_to_handle_at(fd, "", fh, &mnt, AT_EMPTY_PATH) < 0) {
		free(fh);
		return NULL;
	}
	struct file_handle *t = realloc(fh, sizeof(*fh) + fh->handle_bytes);

	return t ? t : fh;
}

int fs_fd_setup(int max_fds)
{
	struct rlimit rl;
	unsigned soft = 1024, room;
	struct file_handle *fh;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		if (rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			setrlimit(RLIMIT_NOFILE, &rl);
			getrlimit(RLIMIT_NOFILE, &rl);
		}
		soft = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1u << 30) ?
		       1u << 30 : (unsigned)rl.rlim_cur;
	}
	/* room for what is not counted: /dev/fuse, io_uring rings, versions
	 * being written, write-through files, transfers in flight */
	room = soft > 256 ? soft - 128 : soft / 2;
	if (max_fds > 0) {
		if ((unsigned)max_fds > room) {
			tlog(LOG_WARNING, "max_fds=%d is more than RLIMIT_NOFILE (%u) allows: "
			     "using %u", max_fds, soft, room);
			fdc.max = room;
		} else {
			fdc.max = (unsigned)max_fds;
		}
	} else {
		fdc.max = room / 2 < FS_MAX_FDS_DEFAULT ? room / 2 : FS_MAX_FDS_DEFAULT;
	}
	if (fdc.max < 16)
		fdc.max = 16;

	/* can descriptors be reopened from handles here? */
	char path[64];

	fs_proc_path(fs.root_fd, path, sizeof(path));
	fdc.mount_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fh = handle_of(fs.root_fd);
	if (!fh) {
		tlog(LOG_WARNING, "descriptors are not bounded: the backing directory "
		     "exports no file handles (%s); one is kept per known file",
		     strerror(errno));
	} else if (fdc.mount_fd < 0) {
		tlog(LOG_WARNING, "descriptors are not bounded: cannot open the backing "
		     "directory: %s", strerror(errno));
	} else {
		int fd = open_by_handle_at(fdc.mount_fd, fh, O_PATH | O_CLOEXEC);

		if (fd >= 0) {
			close(fd);
			fdc.handles = true;
		} else if (errno == EPERM && geteuid() != 0) {
			/* a user's daemon (tierfs(8), MOUNTING AS A USER): expected */
			tlog(LOG_NOTICE, "descriptors: one is kept per known file, up to "
			     "RLIMIT_NOFILE (%u): a daemon without CAP_DAC_READ_SEARCH cannot "
			     "reopen files from handles (max_fds does not apply)", soft);
		} else {
			tlog(LOG_WARNING, "descriptors are not bounded: open_by_handle_at: %s "
			     "(it needs CAP_DAC_READ_SEARCH); one is kept per known file",
			     strerror(errno));
		}
	}
	free(fh);
	tlog(LOG_INFO, "descriptor budget: %u (RLIMIT_NOFILE %u)", fdc.max, soft);
	return 0;
}

unsigned fs_fd_budget(void)
{
	return fdc.max;		/* set once, before any thread */
}

void fs_fd_stats(unsigned *open, unsigned *max, unsigned *peak)
{
	fdc_lock();
	*open = fdc.open;
	*max = fdc.max;
	*peak = fdc.peak;
	fdc_unlock();
}

/* ---- inodes ------------------------------------------------------------- */

void fs_fd_attach(struct fs_inode *in, int fd)
{
	in->fh = fdc.handles ? handle_of(fd) : NULL;
	in->data_fd = -1;
	fdc_lock();
	in->fd = fd;
	count_up();
	lru_touch(in);
	bool over = fdc.open > fdc.max;
	fdc_unlock();
	if (over)
		shrink();
}

void fs_fd_offer(struct fs_inode *in, int fd)
{
	bool over = false;

	fdc_lock();
	if (in->fd < 0 && !in->fd_gone && in != &fs.root) {
		in->fd = fd;
		fd = -1;
		count_up();
		lru_touch(in);
		over = fdc.open > fdc.max;
	}
	fdc_unlock();
	if (fd >= 0)
		close(fd);
	if (over)
		shrink();
}

void fs_fd_detach(struct fs_inode *in)
{
	struct closing c = { .n = 0 };
	struct oldfd *o, *next;

	fdc_lock();
	drop_fds(in, &c);
	for (o = in->old_paths; o; o = next) {	/* no holder is left */
		next = o->next;
		close(o->fd);
		fdc.open--;
		free(o);
	}
	in->old_paths = NULL;
	for (o = in->old_fds; o; o = next) {	/* no borrower is left */
		next = o->next;
		closing_add(&c, o->fd);
		fdc.open--;
		free(o);
	}
	in->old_fds = NULL;
	fdc_unlock();
	closing_run(&c);
	free(in->fh);
	in->fh = NULL;
	free(in->gone_st);
	in->gone_st = NULL;
}

/* A removed file nobody uses: close its descriptors.  fdc.lock held. */
static void release_gone(struct fs_inode *in, struct closing *c)
{
	if (!in->fd_gone || in->fd_users || in->data_users)
		return;
	if (in->fd >= 0 && !in->gone_st) {
		struct stat *st = malloc(sizeof(*st));

		/* fstat of an O_PATH descriptor: no I/O */
		if (st && fstatat(in->fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0) {
			st->st_nlink = 0;
			in->gone_st = st;
		} else {
			free(st);
		}
	}
	if (in->gone_st && (uint64_t)in->gone_st->st_blocks * 512 >= CLOSE_LATER_BYTES)
		c->later = true;	/* its blocks take a while to free */
	drop_fds(in, c);
}

/* Replaced O_PATH descriptors of in, now that nobody holds one.  fdc.lock
 * held. */
static void close_old_paths(struct fs_inode *in, struct closing *c)
{
	while (in->old_paths) {
		struct oldfd *o = in->old_paths;

		in->old_paths = o->next;
		closing_add(c, o->fd);
		fdc.open--;
		free(o);
	}
}

static int reopen(struct fs_inode *in)
{
	int fd, err = 0;

	for (int tries = 0; tries < 2; tries++) {
		fd = open_by_handle_at(fdc.mount_fd, in->fh, O_PATH | O_CLOEXEC);
		if (fd >= 0)
			return fd;
		err = errno;
		if (!fs_fd_reclaim(err))
			break;
	}
	/* a handle of an object removed behind tierfs's back */
	return err == ESTALE ? -ENOENT : -err;
}

int fs_fd_hold(struct fs_inode *in)
{
	struct closing c = { .n = 0 };
	bool over = false;
	int fd;

	fdc_lock();
	in->fd_users++;
	if (in->fd >= 0) {
		lru_touch(in);
		fd = in->fd;
		fdc_unlock();
		return fd;
	}
	if (in->fd_gone || !in->fh) {
		fdc_unlock();
		return -ENOENT;
	}
	fdc_unlock();
	fd = reopen(in);
	if (fd < 0)
		return fd;
	fdc_lock();
	if (in->fd >= 0) {		/* another holder was first */
		closing_add(&c, fd);
	} else {
		in->fd = fd;
		count_up();
		lru_touch(in);
		over = fdc.open > fdc.max;
	}
	fd = in->fd;
	fdc_unlock();
	closing_run(&c);
	if (over)
		shrink();
	return fd;
}

void fs_fd_release(struct fs_inode *in)
{
	struct closing c = { .n = 0 };

	fdc_lock();
	in->fd_users--;
	if (!in->fd_users)
		close_old_paths(in, &c);
	release_gone(in, &c);
	fdc_unlock();
	closing_run(&c);
}

void fs_fd_pin(struct fs_inode *in)
{
	fdc_lock();
	in->fd_pinned = true;
	lru_unlink(in);
	fdc_unlock();
}

void fs_fd_gone(struct fs_inode *in)
{
	struct closing c = { .n = 0 };

	if (in == &fs.root)
		return;
	fdc_lock();
	in->fd_pinned = false;
	in->fd_gone = true;
	lru_unlink(in);
	release_gone(in, &c);
	fdc_unlock();
	closing_run(&c);
}

bool fs_fd_gone_stat(struct fs_inode *in, struct stat *st)
{
	bool ok;

	fdc_lock();
	ok = in->fd_gone && in->gone_st;
	if (ok)
		*st = *in->gone_st;
	fdc_unlock();
	return ok;
}

int fs_fd_replace(struct fs_inode *in, int fd, int old[2])
{
	struct file_handle *fh = fdc.handles ? handle_of(fd) : NULL;
	struct oldfd *o = malloc(sizeof(*o));

	old[0] = old[1] = -1;
	/*
	 * Never waits for the holders of the old descriptor: a replace runs
	 * under fs.nslock and fs.lock, and a holder may wait for fs.lock
	 * (rename, a reference's put), so waiting here deadlocked.  A
	 * holder keeps using the descriptor it got; the old one is closed
	 * once nobody holds the inode's descriptor (fs_fd_release).
	 */
	fdc_lock();
	old[0] = in->fd;
	if (old[0] < 0)
		count_up();
	if (old[0] >= 0 && in->fd_users) {
		struct oldfd *p = malloc(sizeof(*p));

		if (p) {
			p->fd = old[0];
			p->users = 0;
			p->next = in->old_paths;
			in->old_paths = p;
			count_up();
		} else {
			tlog(LOG_CRIT, "out of memory: a descriptor is leaked");
		}
		old[0] = -1;
	}
	in->fd = fd;
	free(in->fh);
	in->fh = fh;
	if (in->data_fd >= 0) {
		if (!in->data_users) {
			old[1] = in->data_fd;
			fdc.open--;
		} else if (o) {
			/* borrowed: closed by its last borrower; nobody new
			 * gets it (it reads the replaced version) */
			o->fd = in->data_fd;
			o->users = in->data_users;
			o->next = in->old_fds;
			in->old_fds = o;
			o = NULL;
		} else {
			/* no memory to track it: leak it rather than close it
			 * under its borrowers */
			fdc.open--;
			tlog(LOG_CRIT, "out of memory: a descriptor is leaked");
		}
		in->data_fd = -1;
		in->data_users = 0;
	}
	if (!in->fh)
		lru_unlink(in);
	else
		lru_touch(in);
	fdc_unlock();
	free(o);
	return 0;
}

/* ---- read descriptors ------------------------------------------------------ */

int fs_data_fd_get(struct fs_inode *in)
{
	char path[64];
	bool over = false;
	int pfd, fd = -1;

	pfd = fs_fd_hold(in);
	if (pfd < 0) {
		fs_fd_release(in);
		return pfd;
	}
	fdc_lock();
	if (in->data_fd >= 0) {
		in->data_users++;
		fd = in->data_fd;
		lru_touch(in);
	}
	fdc_unlock();
	if (fd >= 0) {
		fs_fd_release(in);
		return fd;
	}
	/* a new version may replace pfd meanwhile: checked below */
	fs_proc_path(pfd, path, sizeof(path));
	for (int tries = 0; tries < 2; tries++) {
		fd = backing_open(AT_FDCWD, path, O_RDONLY, 0);
		if (fd < 0)
			fd = -errno;
		if (fd >= 0 || !fs_fd_reclaim(fd))
			break;
	}
	if (fd < 0) {
		fs_fd_release(in);
		return fd;
	}
	fdc_lock();
	if (in->fd != pfd) {
		/* a new version replaced pfd while we opened it: this fd
		 * reads the old one; start again from the new */
		fdc_unlock();
		close(fd);
		fs_fd_release(in);
		return fs_data_fd_get(in);
	}
	if (in->data_fd >= 0) {
		int extra = fd;

		fd = in->data_fd;
		in->data_users++;
		fdc_unlock();
		close(extra);
	} else {
		in->data_fd = fd;
		in->data_users++;
		count_up();
		lru_touch(in);
		over = fdc.open > fdc.max;
		fdc_unlock();
	}
	fs_fd_release(in);
	if (over)
		shrink();
	return fd;
}

void fs_data_fd_put(struct fs_inode *in, int fd)
{
	struct closing c = { .n = 0 };
	struct oldfd **pp;

	fdc_lock();
	if (fd == in->data_fd && in->data_users > 0) {
		in->data_users--;
		release_gone(in, &c);
		goto out;
	}
	for (pp = &in->old_fds; *pp; pp = &(*pp)->next) {
		struct oldfd *o = *pp;

		if (o->fd == fd) {
			if (--o->users == 0) {
				*pp = o->next;
				closing_add(&c, o->fd);
				fdc.open--;
				free(o);
			}
			goto out;
		}
	}
	closing_add(&c, fd);		/* one of its own (O_DIRECT) */
out:
	fdc_unlock();
	closing_run(&c);
}

void fs_data_fd_drop(struct fs_inode *in)
{
	struct closing c = { .n = 0 };

	fdc_lock();
	if (in->data_fd >= 0 && !in->data_users) {
		closing_add(&c, in->data_fd);
		in->data_fd = -1;
		fdc.open--;
		if (in->fd < 0)
			lru_unlink(in);
	}
	fdc_unlock();
	closing_run(&c);
}

/* ---- descriptors of open directories ---------------------------------------- */

int fs_fd_opendir(struct fs_inode *in)
{
	int pfd = fs_fd_hold(in), fd = pfd;

	if (pfd >= 0)
		fd = fs_fd_openat(pfd, ".", O_RDONLY | O_DIRECTORY, 0);
	fs_fd_release(in);
	if (fd < 0)
		return fd;
	fdc_lock();
	count_up();
	bool over = fdc.open > fdc.max;
	fdc_unlock();
	if (over)
		shrink();
	return fd;
}

void fs_fd_closedir(void)
{
	fdc_lock();
	fdc.open--;
	fdc_unlock();
}

int fs_fd_openat(int dirfd, const char *name, int flags, mode_t mode)
{
	int fd = -1;

	for (int tries = 0; tries < 2; tries++) {
		fd = openat(dirfd, name, flags | O_CLOEXEC, mode);
		if (fd < 0)
			fd = -errno;
		if (fd >= 0)
			break;
		if (fd == -ENOSPC ? !fs_fd_frees_wait() : !fs_fd_reclaim(fd))
			break;
	}
	return fd;
}

int fs_fd_sync_dir(int pfd)
{
	int dfd = fs_fd_openat(pfd, ".", O_RDONLY | O_DIRECTORY, 0);
	int ret = 0;

	if (dfd < 0)
		return dfd;
	if (fsync(dfd) < 0)
		ret = -errno;
	close(dfd);
	return ret;
}

/* See fs.h. */
void fs_dir_mtime_get(int fd, struct timespec *t, bool *ok)
{
	struct stat st;

	*ok = fd >= 0 && fstatat(fd, "", &st, AT_EMPTY_PATH) == 0;
	if (*ok)
		*t = st.st_mtim;
}

void fs_dir_mtime_put(int fd, const struct timespec *t, bool ok)
{
	struct timespec tv[2] = { { 0, UTIME_OMIT }, *t };
	struct stat st;
	char path[64];

	if (!ok || fstatat(fd, "", &st, AT_EMPTY_PATH) < 0 ||
	    (st.st_mtim.tv_sec == t->tv_sec && st.st_mtim.tv_nsec == t->tv_nsec))
		return;
	fs_proc_path(fd, path, sizeof(path));
	if (utimensat(AT_FDCWD, path, tv, 0) < 0)
		tlog(LOG_DEBUG, "a directory's mtime not put back after a flush: %s",
		     strerror(errno));
}

bool fs_fd_same(struct fs_inode *in, int fd, mode_t mode)
{
	struct file_handle *fh;
	bool known, same;

	if ((mode & S_IFMT) != in->type)
		return false;
	fdc_lock();
	known = !in->fd_gone && (in->fd >= 0 || !in->fh);
	same = !in->fd_gone;
	fdc_unlock();
	if (known || !same)
		return same;	/* an open fd keeps its object (and number) */
	fh = handle_of(fd);
	if (!fh)
		return true;	/* cannot tell: trust the number */
	same = fh->handle_type == in->fh->handle_type &&
	       fh->handle_bytes == in->fh->handle_bytes &&
	       memcmp(fh->f_handle, in->fh->f_handle, fh->handle_bytes) == 0;
	free(fh);
	return same;
}

/* See fs.h. */
int fs_sweep_names(int dir_fd, const char *prefix, bool (*keep)(int dfd, const char *name))
{
	int dfd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	DIR *d;

	if (dfd < 0 || !(d = fdopendir(dfd))) {
		int ret = -errno;

		if (dfd >= 0)
			close(dfd);
		return ret;
	}
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, prefix, strlen(prefix)) &&
		    (!keep || !keep(dirfd(d), de->d_name)))
			unlinkat(dirfd(d), de->d_name, 0);
	closedir(d);
	return 0;
}

/* See fs.h. */
int fs_fd_rel_path(int fd, char *rel, size_t len)
{
	char proc[64], root[PATH_MAX], path[PATH_MAX];
	ssize_t rn, pn;

	fs_proc_path(fs.root_fd, proc, sizeof(proc));
	rn = readlink(proc, root, sizeof(root) - 1);
	fs_proc_path(fd, proc, sizeof(proc));
	pn = readlink(proc, path, sizeof(path) - 1);
	if (rn <= 0 || pn <= 0)
		return -errno;
	root[rn] = path[pn] = 0;
	if (strcmp(root, "/") == 0)
		rn = 0;
	if (strncmp(path, root, (size_t)rn) || path[rn] != '/' || !path[rn + 1] ||
	    (size_t)(pn - rn) > len)
		return -ENOENT;		/* elsewhere, or " (deleted)" */
	memcpy(rel, path + rn + 1, (size_t)(pn - rn));
	return 0;
}
