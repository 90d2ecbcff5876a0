/*
 * fs_version.c - new versions of backing files (struct tfile_ops).
 *
 * The engine writes a cached file back as a new version: an O_TMPFILE
 * next to the file (version_open), filled and synced by the engine, then
 * made current (version_commit) by linking it under a temporary name and
 * renaming it over the old one, so that the backing directory only ever
 * holds complete versions.  The inode moves to the new version's backing
 * object before its name does (swap_fd).
 *
 * Locking: fs.nslock is held across a commit (names steady); fs.lock only
 * around table and descriptor bookkeeping; the syscalls that change the
 * backing directory run without fs.lock (see v_commit).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

#include "fs.h"

static struct fs_inode *in_of(struct tfile *f)
{
	return (struct fs_inode *)((char *)f - offsetof(struct fs_inode, tf));
}

static int open_direct(const char *path, int flags, bool want_direct, bool *direct)
{
	int fd = -1, tries = 0;

	*direct = false;
again:
	if (want_direct) {
		fd = open(path, flags | O_DIRECT | O_CLOEXEC, 0600);
		if (fd >= 0) {
			*direct = true;
			return fd;
		}
		if (errno != EINVAL) {
			fd = -errno;
			goto err;
		}
	}
	fd = open(path, flags | O_CLOEXEC, 0600);
	if (fd >= 0)
		return fd;
	fd = -errno;
err:
	if (tries++ == 0 && fs_fd_reclaim(fd))
		goto again;	/* EMFILE: cached descriptors were closed */
	return fd;
}

/* open_direct() of the object fs_fd_hold(in) gives. */
static int open_held(struct fs_inode *in, int flags, bool want_direct, bool *direct)
{
	char path[64];
	int fd = fs_fd_hold(in);

	if (fd >= 0) {
		fs_proc_path(fd, path, sizeof(path));
		fd = open_direct(path, flags, want_direct, direct);
	}
	fs_fd_release(in);
	return fd;
}

static int v_open(struct tfile *f, bool want_direct, bool *direct, bool *inplace)
{
	struct fs_inode *in = in_of(f), *dir = NULL;
	struct stat st;
	int ret = 0, fd;

	/*
	 * Decide under fs.lock, open without it: creating the new version's
	 * inode takes a journal handle, which can wait for a commit (another
	 * flush's fdatasync), and lookups, creates, opens and releases of the
	 * whole mount take fs.lock.
	 */
	*inplace = false;
	pthread_mutex_lock(&fs.lock);
	if (in->unlinked) {
		/* anonymous storage for a file that has no name any more */
		dir = &fs.root;
	} else {
		fd = fs_fd_hold(in);
		if (fd < 0)
			ret = fd;
		else if (fstatat(fd, "", &st, AT_EMPTY_PATH) < 0)
			ret = -errno;
		else if (st.st_nlink == 1 && in->name && in->parent)
			dir = in->parent;
		fs_fd_release(in);
	}
	if (dir)
		fs_inode_get(dir);	/* it keeps its fd reopenable */
	pthread_mutex_unlock(&fs.lock);
	if (ret)
		return ret;
	if (!dir) {
		/* hard links: the file itself, in place */
		*inplace = true;
		return open_held(in, O_RDWR, want_direct, direct);
	}
	ret = open_held(dir, O_TMPFILE | O_RDWR, want_direct, direct);
	if (ret < 0 && dir != &fs.root && (ret == -EOPNOTSUPP || ret == -EISDIR)) {
		/* no O_TMPFILE here: the file itself, in place */
		*inplace = true;
		ret = open_held(in, O_RDWR, want_direct, direct);
	}
	fs_inode_put(dir);
	return ret;
}

/* Copy the user-visible attributes of the current version (ofd, held) to fd. */
static void copy_attrs(struct fs_inode *in, int ofd, int fd, const struct stat *old)
{
	char path[64], names[4096], val[65536];
	struct timespec tv[2];
	ssize_t nl, vl;
	char *n;

	if (fchown(fd, old->st_uid, old->st_gid) < 0)
		tlog(LOG_WARNING, "chown of new version: %s", strerror(errno));
	if (fchmod(fd, old->st_mode & 07777) < 0)
		tlog(LOG_WARNING, "chmod of new version: %s", strerror(errno));
	fs_proc_path(ofd, path, sizeof(path));
	nl = listxattr(path, names, sizeof(names));
	for (n = names; nl > 0 && n < names + nl; n += strlen(n) + 1) {
		vl = getxattr(path, n, val, sizeof(val));
		if (vl >= 0 && fsetxattr(fd, n, val, (size_t)vl, 0) < 0)
			tlog(LOG_WARNING, "xattr %s of new version: %s", n, strerror(errno));
	}
	tv[0] = old->st_atim;
	tv[1] = in->tf.mtime;
	if (!tv[1].tv_sec && !tv[1].tv_nsec)
		tv[1] = old->st_mtim;
	futimens(fd, tv);
}

/*
 * Copy version fd's content over the file itself (ofd, held; a file with
 * other names).  The version fd may be O_DIRECT, which copy_file_range
 * (a splice underneath) refuses for lengths that are not block multiples:
 * both ends are reopened buffered.
 */
static int copy_in_place(int ofd, int fd, bool durable)
{
	char path[64], buf[65536];
	struct stat st;
	int src, dst, ret = 0;

	if (fstat(fd, &st) < 0)
		return -errno;
	fs_proc_path(fd, path, sizeof(path));
	src = open(path, O_RDONLY | O_CLOEXEC);
	if (src < 0)
		return -errno;
	fs_proc_path(ofd, path, sizeof(path));
	dst = open(path, O_WRONLY | O_CLOEXEC);
	if (dst < 0) {
		ret = -errno;
		close(src);
		return ret;
	}
	loff_t i = 0, o = 0;
	bool plain = false;
	while (i < st.st_size) {
		ssize_t n = -1;

		if (!plain) {
			n = copy_file_range(src, &i, dst, &o, (size_t)(st.st_size - i), 0);
			if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP ||
				      errno == ENOSYS)) {
				plain = true;
				continue;
			}
		} else {
			n = pread(src, buf, sizeof(buf), i);
			if (n > 0 && pwrite(dst, buf, (size_t)n, o) != n)
				n = -1;
			if (n > 0) {
				i += n;
				o += n;
			}
		}
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			break;
		}
	}
	if (!ret && ftruncate(dst, st.st_size) < 0)
		ret = -errno;
	if (!ret && durable && fsync(dst) < 0)
		ret = -errno;
	close(dst);
	close(src);
	return ret;
}

/*
 * Make fd in's current version.  fs.lock held.  Returns the fds that it
 * replaced (old[0], old[1]; -1 for none), for the caller to close once
 * fs.lock is released: the last close of a replaced version frees its
 * blocks, a journal operation that can wait on a commit.  A read fd of
 * the old version that the engine still borrows is closed by its last
 * borrower; no read after this comes from it.
 */
static void swap_fd(struct fs_inode *in, int fd, int old[2])
{
	struct stat st;

	if (fstat(fd, &st) == 0) {
		fs_table_remove(in);
		in->dev = st.st_dev;
		in->ino = st.st_ino;
		fs_table_insert(in);
	}
	fs_fd_replace(in, fd, old);
}

/*
 * Make version fd (an O_TMPFILE, or with inplace the file itself) current.
 *
 * Locking: fs.nslock, which every change of the backing namespace takes
 * (link, unlink, rmdir, rename, and this), keeps in's name and parent
 * steady while the new version is linked in and renamed over the old one;
 * fs.lock is taken only for the bookkeeping.  The syscalls that change the
 * backing directory run without it: each needs a journal handle, which
 * can wait for a commit (hundreds of ms on a disk busy with flushes), and
 * every lookup, create, open and release of the mount takes fs.lock.
 */
static int v_commit(struct tfile *f, int fd, bool inplace, bool durable)
{
	struct fs_inode *in = in_of(f), *dir = NULL;
	char path[64], tmp[64], *name = NULL;
	static unsigned long counter;
	struct stat old;
	bool unlinked, open;
	int ret = 0, ofd, dfd = -1, pfd, closing[2] = { -1, -1 };

	if (inplace) {
		struct timespec tv[2] = { { 0, UTIME_OMIT }, in->tf.mtime };

		if (tv[1].tv_sec || tv[1].tv_nsec)
			futimens(fd, tv);
		if (durable && fsync(fd) < 0)
			ret = -errno;
		close(fd);
		return ret;
	}
	pthread_mutex_lock(&fs.nslock);
	pthread_mutex_lock(&fs.lock);
	unlinked = in->unlinked;
	open = in->nopen > 0;
	if (!unlinked && in->name && in->parent) {
		name = strdup(in->name);
		dir = in->parent;
		fs_inode_get(dir);
	}
	pthread_mutex_unlock(&fs.lock);
	if (unlinked && !open) {
		ret = -ENOENT;	/* removed, and nobody can read it any more */
		goto out_close;
	}
	if (dir && !name) {
		ret = -ENOMEM;
		goto out_close;
	}
	ofd = fs_fd_hold(in);
	if (ofd < 0 || fstatat(ofd, "", &old, AT_EMPTY_PATH) < 0) {
		ret = ofd < 0 ? ofd : -errno;
		fs_fd_release(in);
		goto out_close;
	}
	if (unlinked) {
		/* adopt: the data lives on, nameless, with the file's mode,
		 * owner, xattrs and times (fstat of an open removed file) */
		copy_attrs(in, ofd, fd, &old);
		fs_fd_release(in);
		pthread_mutex_lock(&fs.lock);
		if (!in->nopen) {
			pthread_mutex_unlock(&fs.lock);
			ret = -ENOENT;
			goto out_close;
		}
		swap_fd(in, fd, closing);
		goto out_locked;
	}
	if (old.st_nlink > 1 || !name) {
		/* hard-linked since the version was started, or no name of
		 * it is known: copy it in place */
		ret = copy_in_place(ofd, fd, durable);
		fs_fd_release(in);
		goto out_close;
	}
	copy_attrs(in, ofd, fd, &old);
	fs_fd_release(in);

	pfd = fs_fd_hold(dir);
	if (pfd < 0) {
		ret = pfd;
		fs_fd_release(dir);
		goto out_close;
	}
	fs_proc_path(fd, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), FS_HIDDEN_PREFIX ".new.%lx.%lu",
		 (unsigned long)getpid(), __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	if (linkat(AT_FDCWD, path, pfd, tmp, AT_SYMLINK_FOLLOW) < 0) {
		ret = -errno;
		fs_fd_release(dir);
		goto out_close;
	}
	/*
	 * The inode moves to the new version before its name does: a stat
	 * of it in between sees the new version under its temporary name
	 * (one link), never the old one renamed over (no link left).  A
	 * lookup of the name in between finds the old version under a key
	 * the table no longer has, and looks again under fs.nslock, which
	 * we hold (do_lookup).  Reopened by name: the tmpfile's own dentry
	 * stays an unnamed one.
	 */
	int nfd = fs_fd_openat(pfd, tmp, O_PATH | O_NOFOLLOW, 0);
	if (nfd >= 0) {
		close(fd);
		fd = nfd;
	}
	pthread_mutex_lock(&fs.lock);
	swap_fd(in, fd, closing);
	pthread_mutex_unlock(&fs.lock);
	fd = -1;
	if (renameat(pfd, tmp, pfd, name) < 0) {
		int back[2] = { -1, -1 };

		ret = -errno;
		unlinkat(pfd, tmp, 0);
		/* the name keeps the old version: the inode goes back to it */
		nfd = fs_fd_openat(pfd, name, O_PATH | O_NOFOLLOW, 0);
		if (nfd >= 0) {
			pthread_mutex_lock(&fs.lock);
			swap_fd(in, nfd, back);
			pthread_mutex_unlock(&fs.lock);
			for (int i = 0; i < 2; i++)
				if (back[i] >= 0)
					close(back[i]);
		}
		fs_fd_release(dir);
		goto out_close;
	}
	if (durable) {		/* synced at the end */
		dfd = fs_fd_openat(pfd, ".", O_RDONLY | O_DIRECTORY, 0);
		if (dfd < 0)
			ret = dfd;
	}
	fs_fd_release(dir);
	pthread_mutex_lock(&fs.lock);
out_locked:
	pthread_mutex_unlock(&fs.lock);
	fd = -1;
out_close:
	if (fd >= 0)
		close(fd);
	pthread_mutex_unlock(&fs.nslock);
	free(name);
	if (dir)
		fs_inode_put(dir);
	if (closing[0] >= 0)
		close(closing[0]);
	if (closing[1] >= 0)
		close(closing[1]);
	/* the rename is durable once the directory is */
	if (dfd >= 0) {
		if (fsync(dfd) < 0 && !ret)
			ret = -errno;
		close(dfd);
	}
	return ret;
}

static int v_data_fd(struct tfile *f, bool direct)
{
	struct fs_inode *in = in_of(f);
	bool d;

	if (direct)	/* a descriptor of its own, closed at release */
		return open_held(in, O_RDONLY, true, &d);
	return fs_data_fd_get(in);
}

static void v_release_data_fd(struct tfile *f, int fd)
{
	fs_data_fd_put(in_of(f), fd);
}

static void v_get(struct tfile *f)
{
	fs_inode_get(in_of(f));
}

static void v_put(struct tfile *f)
{
	fs_inode_put(in_of(f));
}

static const char *v_name(struct tfile *f, char *buf, size_t len)
{
	struct fs_inode *in = in_of(f);

	pthread_mutex_lock(&fs.lock);
	snprintf(buf, len, "%s", in->name ? in->name : "(unlinked file)");
	pthread_mutex_unlock(&fs.lock);
	return buf;
}

const struct tfile_ops fs_tfile_ops = {
	.version_open	= v_open,
	.version_commit	= v_commit,
	.data_fd	= v_data_fd,
	.release_data_fd = v_release_data_fd,
	.get		= v_get,
	.put		= v_put,
	.name		= v_name,
};
