/*
 * persist_path.c - paths and marks of the persistent tier (fs_persist.c):
 * a file's path relative to the backing root, its user.tierfs.persist mark
 * and its nearest marked directory's, the walk beneath a root that never
 * follows a symbolic link (into DIR and into the backing directory), the
 * owner, mode, times and user xattrs that a copy takes from its original,
 * and the bounded copy of a file's data (to DIR and back from it).
 *
 * Calls: the inode table and the descriptor budget (fs_inode_get/put,
 * fs_fd_hold/release), nothing of the other persist_*.c files.  Locks:
 * fs.lock for an inode's name and parent, no lock of the tier's own.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "persist_int.h"
#include "../common/log.h"
#include "../tiers/clock.h"

/* ------------------------------------------------------------ paths */

int persist_join(char *out, size_t len, const char *a, const char *b)
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
int persist_rel_of_fd_any(int fd, char *rel, size_t len, bool *gone)
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
	int ret = persist_rel_of_fd_any(fd, rel, len, &gone);

	return ret ? ret : gone ? -ENOENT : 0;
}

/*
 * in's path relative to the backing root.  A directory's through its fd
 * (the kernel follows renames); a regular file's as its directory's plus
 * its name (a new version's fd may be a tmpfile's).
 */
int persist_rel_of(struct fs_inode *in, char *rel, size_t len)
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
		ret = persist_rel_of(dir, drel, sizeof(drel));
		fs_inode_put(dir);
		return ret ? ret : persist_join(rel, len, drel, name);
	}
	fd = fs_fd_hold(in);
	ret = fd < 0 ? fd : rel_of_fd(fd, rel, len);
	fs_fd_release(in);
	return ret;
}

/* The own mark of a backing path: 1, 0, or -1 for none; follow: the path
 * may be a symbolic link to the object (/proc/self/fd/N). */
int persist_mark_at(const char *path, bool follow)
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
	return persist_mark_at(proc, true);
}

/*
 * Is the backing object at rel persistent (its mark, else its nearest
 * marked directory's, else persist_all)?  Walked down from the root, no
 * link followed: a user's symbolic link in the mount does not make the
 * daemon read the marks of what it points to.
 */
bool persist_marked(const char *rel)
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
bool persist_marked_inode(struct fs_inode *in)
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
bool persist_covers(const char *path, const char *rel)
{
	size_t l = strlen(path);

	return strncmp(path, rel, l) == 0 && (rel[l] == 0 || rel[l] == '/');
}

int persist_open_dir_root(void)
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

/*
 * An O_RDONLY descriptor of directory rel beneath root, or with parent, of
 * the directory that holds rel's last component (*base then points to that
 * component; "" for rel itself is root).  made: make missing directories
 * (0700, then made(fd, prefix, arg) gives them their owner and mode);
 * NULL: -ENOENT where one is missing.  Returns the descriptor or -errno.
 */
int persist_walk_beneath(int root, const char *rel, bool parent, const char **base,
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
	int fd = persist_walk_beneath(fs.root_fd, rel, false, NULL, NULL, NULL), ret = 0;

	if (fd < 0)
		return fd;
	if (fstat(fd, st) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* lstat of the backing directory's rel, no link followed on the way */
int persist_backing_lstat(const char *rel, struct stat *st)
{
	const char *b;
	int fd = persist_walk_beneath(fs.root_fd, rel, true, &b, NULL, NULL), ret = 0;

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
void persist_give_attrs(int fd, const struct stat *st, const char *what)
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

/* persist_walk_beneath()'s made for DIR: like the backing directory's prefix */
void persist_made_like_backing(int fd, const char *prefix, void *arg)
{
	struct stat st;

	(void)arg;
	if (backing_dir_stat(prefix, &st) == 0)
		persist_give_attrs(fd, &st, "a directory in DIR");
}

/*
 * The user xattrs of src go to dst (descriptors, both O_RDONLY or better);
 * tierfs's own (user.tierfs.*) are left: a mark is set by whoever copies.
 */
void persist_copy_xattrs(int src, int dst)
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

uint64_t persist_now_ms(void)
{
	return (uint64_t)(tier_now() * 1000.0);
}

const char *persist_base_of(const char *rel)
{
	const char *s = strrchr(rel, '/');

	return s ? s + 1 : rel;
}

/*
 * Copy src (size st->st_size) into wfd with a bounded buffer; bw: cap in
 * bytes/s (0: none); stop: give up when it turns true; alive: the time of
 * the last progress (ms), or NULL.
 */
int persist_copy_data(int src, int wfd, uint64_t size, uint64_t bw, bool *stop, uint64_t *alive)
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
			__atomic_store_n(alive, persist_now_ms(), __ATOMIC_RELAXED);
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
