/*
 * fs_ops.c - FUSE low-level operations over the backing directory.
 *
 * The namespace (names, modes, owners, times, special files, xattrs) is the
 * backing directory's: every operation is done on it through the inodes'
 * O_PATH fds.  This file has the handlers of the namespace operations
 * (lookup, attributes, make, link, unlink, rename, directories, statfs) and
 * the table of handlers; the names they make, link, remove and rename are
 * made by fs_ns.c, which tells the namespace's reader (-o persist);
 * fs_file.c has the content ones, which go through the engine (tiers/);
 * fs_version.c makes and commits new versions of backing files;
 * fs_inode.c keeps the inodes.  A listing merges DIR's entries through
 * fs.inode_ops (-o persist).
 *
 * st_ino and d_ino as seen through the mount are the inode numbers of
 * fs_inode.c (fs_ino_number, fs_dirent_ino), not the FUSE node ids: a
 * file keeps its number when the kernel forgets it, when a flush replaces
 * its backing file, and across restarts.
 *
 * Locking: see fs.h.  Handlers take fs.lock only around table and name
 * updates; data transfers never hold it.
 */
#include <dirent.h>
#include <linux/falloc.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

#include "fs.h"

struct fs fs;

static void reply_entry_or_err(fuse_req_t req, struct fs_inode *parent,
			       const char *name)
{
	struct fuse_entry_param e;
	int ret = fs_lookup(parent, name, &e);

	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_entry(req, &e);
}

/* ---- operations ------------------------------------------------------- */

static void fs_ll_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	if (fs.opts.writeback && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
		conn->want |= FUSE_CAP_WRITEBACK_CACHE;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	conn->want &= ~(unsigned)FUSE_CAP_HANDLE_KILLPRIV;
	conn->want &= ~(unsigned)FUSE_CAP_SPLICE_READ;	/* requests land in our buffers */
	conn->max_write = FS_IO_SIZE;
	conn->max_readahead = 1u << 20;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
}

static void fs_ll_destroy(void *userdata)
{
	(void)userdata;
	fs_sync_all(false);
}

static void fs_ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	reply_entry_or_err(req, fs_inode_of(parent), name);
}


static void fs_ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	fs_forget_one(ino, nlookup);
	fuse_reply_none(req);
}

static void fs_ll_forget_multi(fuse_req_t req, size_t count,
			       struct fuse_forget_data *forgets)
{
	size_t i;

	for (i = 0; i < count; i++)
		fs_forget_one(forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

static void fs_ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;
	int ret;

	if (ino == FUSE_ROOT_ID)
		tierfs_delay("getattr_root");	/* a test hook */
	ret = fs_stat_inode(fs_inode_of(ino), &st);
	(void)fi;
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &st, 1.0);
}

/*
 * Privileges that a change of the data takes away (FUSE_HANDLE_KILLPRIV_V2,
 * negotiated in fs_loop.c).  The kernel leaves to the file system what it
 * would do itself on a local one: a write, a truncate or an open with
 * O_TRUNC by a caller without CAP_FSETID clears the set-user-ID bit and
 * the set-group-ID bit of a group-executable file (the request carries a
 * KILL_SUIDGID flag: `suidgid`), and any write or truncate removes
 * security.capability.  (A chown does both in the backing file system.)
 * In return the kernel stops asking for security.capability before every
 * buffered write, a round trip each (bench/RESULTS.md 8e).  An inode seen
 * with neither is remembered (bit 0 of in->privs) until its mode or xattrs
 * change through us (the other bits count those changes, so that a look
 * that raced with one does not mark the inode clean): the common write
 * costs one load, a file's first a look without any lock.
 */
static mode_t killed_mode(mode_t mode, bool suidgid)
{
	mode_t m = mode & 07777;

	if (suidgid) {
		m &= ~(mode_t)S_ISUID;
		if (m & S_IXGRP)
			m &= ~(mode_t)S_ISGID;
	}
	return m;
}

void fs_kill_privs(fuse_ino_t ino, bool suidgid)
{
	struct fs_inode *in = fs_inode_of(ino);
	uint64_t seen = __atomic_load_n(&in->privs, __ATOMIC_ACQUIRE);
	bool changed = false, cap;
	char path[64];
	struct stat st;
	mode_t m;
	int fd;

	if (!S_ISREG(in->type) || (seen & 1))
		return;
	/* look first, without the lock: most files have nothing to clear */
	fd = fs_fd_hold(in);
	if (fd < 0 || fstatat(fd, "", &st, AT_EMPTY_PATH) < 0) {
		fs_fd_release(in);
		return;
	}
	fs_proc_path(fd, path, sizeof(path));
	cap = getxattr(path, "security.capability", NULL, 0) >= 0;
	fs_fd_release(in);
	m = killed_mode(st.st_mode, suidgid);
	if (!cap && m == (st.st_mode & 07777)) {
		/* clean unless the mode or xattrs changed meanwhile (privs moved) */
		if (!(m & (S_ISUID | S_ISGID)))
			__atomic_compare_exchange_n(&in->privs, &seen, seen | 1, false,
						    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		return;
	}
	fs_attrs_lock(in);	/* as setattr: not while a new version copies them */
	fd = fs_fd_hold(in);
	if (fd >= 0 && fstatat(fd, "", &st, AT_EMPTY_PATH) == 0) {
		m = killed_mode(st.st_mode, suidgid);
		fs_proc_path(fd, path, sizeof(path));
		if (m != (st.st_mode & 07777) && chmod(path, m) < 0)
			tlog(LOG_WARNING, "clearing the set-ID bits of %s: %s",
			     in->name ? in->name : "a file", strerror(errno));
		else if (m != (st.st_mode & 07777))
			changed = true;
		if (removexattr(path, "security.capability") == 0)
			changed = true;
		else if (errno != ENODATA && errno != ENOTSUP)
			tlog(LOG_WARNING, "removing security.capability of %s: %s",
			     in->name ? in->name : "a file", strerror(errno));
	}
	fs_fd_release(in);
	fs_attrs_unlock(in);
	/* the kernel's cached mode is stale: dropped (attributes only) */
	if (changed) {
		fs_attrs_changed(in);
		fuse_lowlevel_notify_inval_inode(fs.se, ino, -1, 0);
	}
}

/*
 * Its mode, owner, times or xattrs changed in the backing file: the next
 * fsync(2) of it makes that durable (tfile_ops.sync_meta), as fsync does
 * a file's metadata on a local file system.
 */
void fs_attrs_changed(struct fs_inode *in)
{
	__atomic_add_fetch(&in->attrs, 1, __ATOMIC_ACQ_REL);
}

/* Its mode or xattrs changed (under its ilock): look again at the next write. */
void fs_privs_changed(struct fs_inode *in)
{
	__atomic_fetch_add(&in->privs, 2, __ATOMIC_ACQ_REL);
	__atomic_fetch_and(&in->privs, ~(uint64_t)1, __ATOMIC_ACQ_REL);
}

static void fs_ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
			  int valid, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	char path[64];
	struct stat st;
	int ret = 0;

	(void)fi;
	/* attributes: not while a new version copies them (v_commit) */
	fs_attrs_lock(in);
	ret = fs_fd_hold(in);
	ret = ret < 0 ? ret : 0;
	fs_proc_path(in->fd, path, sizeof(path));
	if (!ret && (valid & FUSE_SET_ATTR_MODE)) {
		if (S_ISLNK(in->type))
			ret = -EOPNOTSUPP;
		else if (chmod(path, attr->st_mode & 07777) < 0)
			ret = -errno;
		fs_privs_changed(in);
	}
	if (!ret && (valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) {
		uid_t u = (valid & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1;
		gid_t g = (valid & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1;

		if (fchownat(in->fd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
			ret = -errno;
	}
	fs_fd_release(in);
	fs_attrs_unlock(in);
	if (valid & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))
		fs_attrs_changed(in);	/* in part, maybe, if it failed */
	if (ret)
		goto out;
	if (valid & FUSE_SET_ATTR_SIZE) {
		if (!S_ISREG(in->type)) {
			ret = S_ISDIR(in->type) ? -EISDIR : -EINVAL;
			goto out;
		}
		ret = tfile_truncate(&in->tf, (uint64_t)attr->st_size);
		if (ret)
			goto out;
	}
	if (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
		struct timespec tv[2];

		tv[0].tv_nsec = tv[1].tv_nsec = UTIME_OMIT;
		if (valid & FUSE_SET_ATTR_ATIME_NOW)
			tv[0].tv_nsec = UTIME_NOW;
		else if (valid & FUSE_SET_ATTR_ATIME)
			tv[0] = attr->st_atim;
		if (valid & FUSE_SET_ATTR_MTIME_NOW)
			clock_gettime(CLOCK_REALTIME, &tv[1]);
		else if (valid & FUSE_SET_ATTR_MTIME)
			tv[1] = attr->st_mtim;
		/*
		 * On the object itself, a symlink included (never its
		 * target): AT_EMPTY_PATH on the O_PATH fd; kernels whose
		 * utimensat lacks it get the /proc magic link, which lands
		 * on the object and does not follow it further.
		 * (AT_SYMLINK_NOFOLLOW on the /proc path would set the times
		 * of /proc's own link: a silent no-op.)
		 */
		fs_attrs_lock(in);
		fs_fd_hold(in);
		if (utimensat(in->fd, "", tv, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
			ret = -errno;
			fs_proc_path(in->fd, path, sizeof(path));
			if (ret == -EINVAL)
				ret = utimensat(AT_FDCWD, path, tv, 0) < 0 ? -errno : 0;
		}
		fs_fd_release(in);
		fs_attrs_unlock(in);
		fs_attrs_changed(in);
		if (ret)
			goto out;
		if (S_ISREG(in->type) && (valid & FUSE_SET_ATTR_MTIME))
			tfile_set_mtime(&in->tf, &tv[1]);
	}
out:
	if (ret) {
		tlog(LOG_DEBUG, "setattr 0x%x: %s", valid, strerror(-ret));
		fuse_reply_err(req, -ret);
		return;
	}
	ret = fs_stat_inode(in, &st);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &st, 1.0);
}

static void fs_ll_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct fs_inode *in = fs_inode_of(ino);
	char buf[PATH_MAX + 1];
	int fd = fs_fd_hold(in);
	ssize_t n = fd < 0 ? fd : readlinkat(fd, "", buf, sizeof(buf));

	if (n < 0 && fd >= 0)
		n = -errno;
	fs_fd_release(in);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else if (n >= (ssize_t)sizeof(buf))
		fuse_reply_err(req, ENAMETOOLONG);
	else {
		buf[n] = 0;
		fuse_reply_readlink(req, buf);
	}
}

/*
 * mknod, mkdir, symlink: one body.  The object is made in the backing
 * directory (fs_ns_make), given to the caller (fs_own_new) and looked up.
 * A regular file made by mknod(2) is empty and has no opener whose close
 * would tell the namespace's reader of it: it is told at once (as a file
 * created and closed empty is), then the entry is replied.
 */
static void make_node(fuse_req_t req, fuse_ino_t parent, const char *name,
		      enum fs_new kind, mode_t mode, dev_t rdev, const char *link)
{
	struct fs_inode *p = fs_inode_of(parent), *in = NULL;
	struct fuse_entry_param e;
	int ret = fs_check_new_name(name);
	bool held = false;

	if (!ret)
		ret = fs_ns_make(p, name, kind, mode, rdev, link, &held);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	fs_own_new(p, name, req);
	ret = fs_lookup(p, name, &e);
	if (!ret)
		in = fs_inode_of(e.ino);
	if (held || (in && S_ISREG(in->type))) {
		fs_ns_made(in, p, name, held);
		if (in && S_ISREG(in->type))
			fs_ns_closed(in);
	}
	if (ret)
		fuse_reply_err(req, -ret);
	else if (fuse_reply_entry(req, &e) == -ENOENT)
		fs_forget_one(e.ino, 1);
}

static void fs_ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
			mode_t mode, dev_t rdev)
{
	make_node(req, parent, name, FS_NEW_NODE, mode, rdev, NULL);
}

static void fs_ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
			mode_t mode)
{
	make_node(req, parent, name, FS_NEW_DIR, mode, 0, NULL);
}

static void fs_ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
			  const char *name)
{
	make_node(req, parent, name, FS_NEW_SYMLINK, 0, 0, link);
}

static void fs_ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		       const char *newname)
{
	struct fs_inode *in = fs_inode_of(ino), *p = fs_inode_of(newparent);
	struct fuse_entry_param e;
	int ret = fs_check_new_name(newname);

	if (!ret)
		ret = fs_ns_link(in, p, newname);
	if (!ret)
		ret = fs_lookup(p, newname, &e);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_entry(req, &e);
}

static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name, int flags)
{
	fuse_reply_err(req, -fs_ns_remove(fs_inode_of(parent), name, flags));
}

static void fs_ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, 0);
}

static void fs_ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, AT_REMOVEDIR);
}

static void fs_ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
			 fuse_ino_t newparent, const char *newname,
			 unsigned int flags)
{
	int ret = fs_check_new_name(newname);

	if (!ret)
		ret = fs_ns_rename(fs_inode_of(parent), name, fs_inode_of(newparent), newname,
				   flags);
	fuse_reply_err(req, -ret);
}

struct fs_dir {
	DIR *dp;			/* open directory stream */
	off_t off;			/* position of the next entry */
	struct dirent *ent;		/* entry read but not yet returned */
	struct fs_psnap *snap;		/* merged with -o persist's DIR, or NULL */
};

static void fs_ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	struct fs_dir *d = calloc(1, sizeof(*d));
	int fd;

	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	fd = fs_fd_opendir(in);		/* counted in the descriptor budget */
	if (fd < 0 || !(d->dp = fdopendir(fd))) {
		int err = fd < 0 ? -fd : errno;

		if (fd >= 0) {
			close(fd);
			fs_fd_closedir();
		}
		free(d);
		fuse_reply_err(req, err);
		return;
	}
	if (fs.inode_ops)
		d->snap = fs.inode_ops->snapshot(in, d->dp);
	fi->fh = (uint64_t)(uintptr_t)d;
	fi->cache_readdir = 0;
	fuse_reply_open(req, fi);
}

static void fs_ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			  struct fuse_file_info *fi)
{
	struct fs_dir *d = (struct fs_dir *)(uintptr_t)fi->fh;
	char *buf = malloc(size), *p = buf;
	size_t rem = size;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (d->snap) {
		fuse_reply_buf(req, buf, fs.inode_ops->readdir(req, d->snap, buf, size, off));
		free(buf);
		return;
	}
	if (off != d->off) {
		seekdir(d->dp, off);
		d->ent = NULL;
		d->off = off;
	}
	for (;;) {
		if (!d->ent) {
			errno = 0;
			d->ent = readdir(d->dp);
			if (!d->ent)
				break;
		}
		if (fs_hidden_name(d->ent->d_name)) {
			d->off = d->ent->d_off;
			d->ent = NULL;
			continue;
		}
		/* stat's number (a regular file's is not its backing one) */
		struct stat st = {
			.st_ino = fs_dirent_ino(fs_inode_of(ino), dirfd(d->dp), d->ent->d_name,
						d->ent->d_ino, d->ent->d_type),
			.st_mode = (mode_t)d->ent->d_type << 12 };
		size_t n = fuse_add_direntry(req, p, rem, d->ent->d_name, &st,
					     d->ent->d_off);
		if (n > rem)
			break;
		p += n;
		rem -= n;
		d->off = d->ent->d_off;
		d->ent = NULL;
	}
	fuse_reply_buf(req, buf, size - rem);
	free(buf);
}

static void fs_ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_dir *d = (struct fs_dir *)(uintptr_t)fi->fh;

	(void)ino;
	closedir(d->dp);
	fs_fd_closedir();
	if (d->snap)
		fs.inode_ops->snap_free(d->snap);
	free(d);
	fuse_reply_err(req, 0);
}

static void fs_ll_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
			   struct fuse_file_info *fi)
{
	struct fs_dir *d = (struct fs_dir *)(uintptr_t)fi->fh;
	int fd = dirfd(d->dp);

	(void)ino;
	fuse_reply_err(req, (datasync ? fdatasync(fd) : fsync(fd)) < 0 ? errno : 0);
}

static void fs_ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv;

	(void)ino;
	if (fstatvfs(fs.root_fd, &sv) < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_statfs(req, &sv);
}


const struct fuse_lowlevel_ops fs_ll_ops = {
	.init		= fs_ll_init,
	.destroy	= fs_ll_destroy,
	.lookup		= fs_ll_lookup,
	.forget		= fs_ll_forget,
	.forget_multi	= fs_ll_forget_multi,
	.getattr	= fs_ll_getattr,
	.setattr	= fs_ll_setattr,
	.readlink	= fs_ll_readlink,
	.mknod		= fs_ll_mknod,
	.mkdir		= fs_ll_mkdir,
	.symlink	= fs_ll_symlink,
	.link		= fs_ll_link,
	.unlink		= fs_ll_unlink,
	.rmdir		= fs_ll_rmdir,
	.rename		= fs_ll_rename,
	.open		= fs_ll_open,
	.create		= fs_ll_create,
	.read		= fs_ll_read,
	.write		= fs_ll_write,
	.flush		= fs_ll_flush,
	.release	= fs_ll_release,
	.fsync		= fs_ll_fsync,
	.opendir	= fs_ll_opendir,
	.readdir	= fs_ll_readdir,
	.releasedir	= fs_ll_releasedir,
	.fsyncdir	= fs_ll_fsyncdir,
	.statfs		= fs_ll_statfs,
	.setxattr	= fs_ll_setxattr,
	.getxattr	= fs_ll_getxattr,
	.listxattr	= fs_ll_listxattr,
	.removexattr	= fs_ll_removexattr,
	.fallocate	= fs_ll_fallocate,
	.lseek		= fs_ll_lseek,
	.ioctl		= fs_ll_ioctl,
};
