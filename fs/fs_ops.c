/*
 * fs_ops.c - FUSE low-level operations over the backing directory.
 *
 * The namespace (names, modes, owners, times, special files, xattrs) is the
 * backing directory's: every operation is done on it through the inodes'
 * O_PATH fds.  File content goes through the engine (tiers/engine.c), which
 * caches it and writes new versions back; fs_version.c creates and
 * atomically commits those versions.
 *
 * st_ino as seen through the mount is the inode's FUSE node id: it stays
 * the same when a flush replaces the backing file.
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
#include "fs_hints.h"

struct fs fs;

/* ---- helpers ---------------------------------------------------------- */

int fs_proc_path(int fd, char *buf, size_t len)
{
	return snprintf(buf, len, "/proc/self/fd/%d", fd) >= (int)len ? -ENAMETOOLONG : 0;
}

/*
 * Reserved names: .tierfs* in every directory (new versions being renamed
 * into place, the backing directory's lock, leftovers of a killed daemon).
 * They never show through the mount: lookup says ENOENT and readdir skips
 * them; making one (create, mknod, mkdir, symlink, link, rename to it)
 * fails with EPERM.
 */
static bool hidden_name(const char *name)
{
	return strncmp(name, FS_HIDDEN_PREFIX, sizeof(FS_HIDDEN_PREFIX) - 1) == 0;
}

struct fs_inode *fs_inode_of(fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? &fs.root : (struct fs_inode *)(uintptr_t)ino;
}

static fuse_ino_t ino_of(struct fs_inode *in)
{
	return in == &fs.root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)in;
}

fuse_ino_t fs_ino_of(struct fs_inode *in)
{
	return ino_of(in);
}

static size_t hslot(dev_t dev, ino_t ino)
{
	uint64_t h = (uint64_t)ino * 0x9e3779b97f4a7c15ull ^ (uint64_t)dev;

	return (size_t)(h >> 17) & (fs.hsize - 1);
}

/* fs.lock held */
static struct fs_inode *table_find(dev_t dev, ino_t ino)
{
	struct fs_inode *in;

	if (fs.root.dev == dev && fs.root.ino == ino)
		return &fs.root;
	for (in = fs.htab[hslot(dev, ino)]; in; in = in->hnext)
		if (in->dev == dev && in->ino == ino)
			return in;
	return NULL;
}

static void table_grow(void)
{
	size_t nsize = fs.hsize * 2, i;
	struct fs_inode **nt = calloc(nsize, sizeof(*nt));

	if (!nt)
		return;
	for (i = 0; i < fs.hsize; i++) {
		struct fs_inode *in = fs.htab[i], *next;

		for (; in; in = next) {
			next = in->hnext;
			uint64_t h = (uint64_t)in->ino * 0x9e3779b97f4a7c15ull ^ (uint64_t)in->dev;
			size_t s = (size_t)(h >> 17) & (nsize - 1);
			in->hnext = nt[s];
			nt[s] = in;
		}
	}
	free(fs.htab);
	fs.htab = nt;
	fs.hsize = nsize;
}

void fs_table_insert(struct fs_inode *in)
{
	size_t s;

	if (fs.count + 1 > fs.hsize)
		table_grow();
	s = hslot(in->dev, in->ino);
	in->hnext = fs.htab[s];
	fs.htab[s] = in;
	fs.count++;
}

void fs_table_remove(struct fs_inode *in)
{
	struct fs_inode **pp = &fs.htab[hslot(in->dev, in->ino)];

	for (; *pp; pp = &(*pp)->hnext)
		if (*pp == in) {
			*pp = in->hnext;
			fs.count--;
			return;
		}
}

static void maybe_free(struct fs_inode *in);

/* Record `name` in `parent` as in's name (NULL: unknown).  fs.lock held. */
static void set_name(struct fs_inode *in, struct fs_inode *parent, const char *name)
{
	struct fs_inode *old = in->parent;

	if (name && parent != &fs.root)
		__atomic_add_fetch(&parent->refs, 1, __ATOMIC_ACQ_REL);
	free(in->name);
	in->name = name ? strdup(name) : NULL;
	in->parent = in->name ? parent : NULL;
	if (name && !in->name && parent != &fs.root)
		__atomic_sub_fetch(&parent->refs, 1, __ATOMIC_ACQ_REL);
	if (old && old != &fs.root) {
		__atomic_sub_fetch(&old->refs, 1, __ATOMIC_ACQ_REL);
		maybe_free(old);
	}
}

static void put_dir(struct fs_inode *dir)
{
	if (dir != &fs.root) {
		__atomic_sub_fetch(&dir->refs, 1, __ATOMIC_ACQ_REL);
		maybe_free(dir);
	}
}

/* Forget in's other names.  fs.lock held. */
static void drop_aliases(struct fs_inode *in)
{
	struct fs_alias *a, *next;

	for (a = in->aliases; a; a = next) {
		next = a->next;
		put_dir(a->parent);
		free(a);
	}
	in->aliases = NULL;
}

/*
 * `name` in `parent` is a new name of regular file in (link()).  Every
 * name is remembered, so that the file keeps a name to commit its versions
 * under when another goes (git: write a temp file, link it, unlink the
 * temp name).  fs.lock held.
 */
static void add_name(struct fs_inode *in, struct fs_inode *parent, const char *name)
{
	struct fs_alias *a;

	if (!S_ISREG(in->type) || in->unlinked)
		return;
	if (!in->name) {
		set_name(in, parent, name);
		return;
	}
	if (in->parent == parent && strcmp(in->name, name) == 0)
		return;
	for (a = in->aliases; a; a = a->next)
		if (a->parent == parent && strcmp(a->name, name) == 0)
			return;
	a = malloc(sizeof(*a) + strlen(name) + 1);
	if (!a)
		return;		/* forgotten: versions are then copied in place */
	a->parent = parent;
	strcpy(a->name, name);
	if (parent != &fs.root)
		__atomic_add_fetch(&parent->refs, 1, __ATOMIC_ACQ_REL);
	a->next = in->aliases;
	in->aliases = a;
}

/*
 * in's name `name` in `parent` moved to `nn` in `np`, or went away (nn
 * NULL; another known name then becomes its name).  Returns false if that
 * name was not known.  fs.lock held.
 */
static bool move_name(struct fs_inode *in, struct fs_inode *parent, const char *name,
		      struct fs_inode *np, const char *nn)
{
	struct fs_alias **pp, *a;

	if (in->name && in->parent == parent && strcmp(in->name, name) == 0) {
		if (nn) {
			set_name(in, np, nn);
			return true;
		}
		a = in->aliases;
		if (!a) {
			set_name(in, NULL, NULL);
			return true;
		}
		in->aliases = a->next;
		set_name(in, a->parent, a->name);
		put_dir(a->parent);	/* set_name took its own */
		free(a);
		return true;
	}
	for (pp = &in->aliases; (a = *pp); pp = &a->next) {
		if (a->parent != parent || strcmp(a->name, name))
			continue;
		if (nn)
			add_name(in, np, nn);
		for (pp = &in->aliases; *pp != a; pp = &(*pp)->next)
			;	/* add_name may have put one in front */
		*pp = a->next;
		put_dir(a->parent);
		free(a);
		return true;
	}
	return false;
}

static void inode_free(struct fs_inode *in);

/* fs.lock held: drop in if nothing references it any more. */
static void maybe_free(struct fs_inode *in)
{
	if (in == &fs.root || in->nlookup || __atomic_load_n(&in->refs, __ATOMIC_ACQUIRE) > 0 ||
	    in->nopen)
		return;
	fs_table_remove(in);
	inode_free(in);
}

static void drop_aliases(struct fs_inode *in);

static void inode_free(struct fs_inode *in)
{
	struct fs_inode *parent = in->parent;

	if (S_ISREG(in->type))
		tfile_destroy(&in->tf);
	fs_fd_detach(in);
	drop_aliases(in);
	free(in->name);
	free(in);
	if (parent && parent != &fs.root) {
		__atomic_sub_fetch(&parent->refs, 1, __ATOMIC_ACQ_REL);
		maybe_free(parent);
	}
}

/*
 * Take a reference.  The caller already keeps `in` alive (a kernel
 * reference, an open handle or another reference), so no lock is needed:
 * the engine calls this with its own lock held, and fs.lock may not be
 * taken under it.
 */
void fs_inode_get(struct fs_inode *in)
{
	__atomic_add_fetch(&in->refs, 1, __ATOMIC_ACQ_REL);
}

void fs_inode_put(struct fs_inode *in)
{
	pthread_mutex_lock(&fs.lock);
	__atomic_sub_fetch(&in->refs, 1, __ATOMIC_ACQ_REL);
	maybe_free(in);
	pthread_mutex_unlock(&fs.lock);
}

static int stat_inode(struct fs_inode *in, struct stat *st)
{
	int fd, ret, tries = 0;

again:
	fd = fs_fd_hold(in);
	ret = fd < 0 ? fd :
	      fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
	fs_fd_release(in);
	/* a version commit may have renamed a new version over the one we
	 * held (it moves the inode first): the next hold gets the new one */
	if (!ret && S_ISREG(in->type) && st->st_nlink == 0 &&
	    !__atomic_load_n(&in->unlinked, __ATOMIC_ACQUIRE) && tries++ < 2)
		goto again;
	if (ret == -ENOENT && fs_fd_gone_stat(in, st))
		ret = 0;	/* removed and closed: what it was */
	if (ret)
		return ret;
	st->st_ino = ino_of(in);
	if (S_ISREG(in->type)) {
		uint64_t size;
		struct timespec mt;

		if (tfile_attr(&in->tf, &size, &mt)) {
			st->st_size = (off_t)size;
			st->st_mtim = mt;
			if (mt.tv_sec > st->st_ctim.tv_sec)
				st->st_ctim = mt;
			st->st_blocks = (blkcnt_t)((size + 511) / 512);
		} else {
			st->st_size = (off_t)size;
		}
		/* the preferred I/O size: stdio, cp and friends then move a
		 * file in 1 MiB calls (one FUSE request each), not 4 KiB ones */
		st->st_blksize = FS_IO_SIZE;
	}
	return 0;
}

/*
 * Find or make the inode for `name` in `parent` and take a kernel
 * reference on it.  Fills e.  Returns 0 or -errno.
 */
/*
 * One look at parent/name.  Between its fstat and its table look-up a
 * version commit may move the name to a new version and the inode to it
 * (v_commit, under fs.nslock): a miss there may be that window, not a new
 * object.  So a miss without fs.nslock held (`ns`) returns -EAGAIN, and
 * do_lookup() looks again with it, when no commit is half done.
 */
static int lookup_once(struct fs_inode *parent, const char *name,
		       struct fuse_entry_param *e, bool ns)
{
	struct fs_inode *in;
	struct stat st;
	int fd, pfd, ret;

	memset(e, 0, sizeof(*e));
	if (hidden_name(name))
		return -ENOENT;
	pfd = fs_fd_hold(parent);
	fd = pfd < 0 ? pfd : fs_fd_openat(pfd, name, O_PATH | O_NOFOLLOW, 0);
	fs_fd_release(parent);
	if (fd < 0)
		return fd;
	if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	pthread_mutex_lock(&fs.lock);
	in = table_find(st.st_dev, st.st_ino);
	if (in && in != &fs.root && !fs_fd_same(in, fd, st.st_mode)) {
		/* its backing object is gone and the number reused: the old
		 * inode stays in the table (until forgotten) under a key no
		 * backing object has */
		fs_table_remove(in);
		in->dev = (dev_t)-1;
		in->ino = (ino_t)(uintptr_t)in;
		fs_table_insert(in);
		in = NULL;
	}
	if (in) {
		fs_fd_offer(in, fd);	/* saves a reopen if it had none */
		in->nlookup++;
		if (S_ISREG(in->type) && st.st_nlink == 1 && !in->unlinked &&
		    (!in->name || in->parent != parent || strcmp(in->name, name) ||
		     in->aliases)) {
			drop_aliases(in);	/* its only name */
			set_name(in, parent, name);
		}
	} else if (!ns) {
		pthread_mutex_unlock(&fs.lock);
		close(fd);
		return -EAGAIN;
	} else {
		in = calloc(1, sizeof(*in));
		if (!in) {
			pthread_mutex_unlock(&fs.lock);
			close(fd);
			return -ENOMEM;
		}
		in->dev = st.st_dev;
		in->ino = st.st_ino;
		in->type = st.st_mode & S_IFMT;
		in->nlookup = 1;
		fs_fd_attach(in, fd);
		if (S_ISREG(in->type)) {
			tfile_init(&in->tf, fs.eng, &fs_tfile_ops, (uint64_t)st.st_size);
			in->tf.mtime = st.st_mtim;
			set_name(in, parent, name);
		}
		fs_table_insert(in);
		if (S_ISREG(in->type)) {
			/* the kernel's reference keeps it alive across the bind */
			pthread_mutex_unlock(&fs.lock);
			engine_hint_bind(fs.eng, fs_dir_key(parent), name, &in->tf);
			pthread_mutex_lock(&fs.lock);
		}
	}
	pthread_mutex_unlock(&fs.lock);
	ret = stat_inode(in, &e->attr);
	if (ret)
		e->attr = st;
	e->attr.st_ino = ino_of(in);
	e->ino = ino_of(in);
	e->attr_timeout = 1.0;
	e->entry_timeout = 1.0;
	return 0;
}

/* Look parent/name up, making its inode known.  fs.nslock not held. */
static int do_lookup(struct fs_inode *parent, const char *name,
		     struct fuse_entry_param *e)
{
	int ret = lookup_once(parent, name, e, false);

	if (ret == -EAGAIN) {
		pthread_mutex_lock(&fs.nslock);
		ret = lookup_once(parent, name, e, true);
		pthread_mutex_unlock(&fs.nslock);
	}
	return ret;
}

static void forget_one(fuse_ino_t ino, uint64_t n);

int fs_child_tfile(struct fs_inode *dir, const char *name, struct tfile **out)
{
	struct fuse_entry_param e;
	struct fs_inode *in;
	int ret;

	*out = NULL;
	ret = do_lookup(dir, name, &e);
	if (ret == -ENOENT)
		return 0;	/* not written yet: bound when it appears */
	if (ret)
		return ret;
	in = fs_inode_of(e.ino);
	if (!S_ISREG(in->type)) {
		forget_one(e.ino, 1);
		return -EINVAL;
	}
	fs_inode_get(in);	/* trade the lookup reference for ours */
	forget_one(e.ino, 1);
	*out = &in->tf;
	return 0;
}

static void reply_entry_or_err(fuse_req_t req, struct fs_inode *parent,
			       const char *name)
{
	struct fuse_entry_param e;
	int ret = do_lookup(parent, name, &e);

	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_entry(req, &e);
}

/* Give a freshly created backing object to the caller. */
static void own_new(struct fs_inode *parent, const char *name, fuse_req_t req)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct stat pst;
	gid_t gid = ctx->gid;
	int pfd = fs_fd_hold(parent);

	if (pfd >= 0 && fstatat(pfd, "", &pst, AT_EMPTY_PATH) == 0 && (pst.st_mode & S_ISGID))
		gid = (gid_t)-1;	/* setgid directory: keep its group */
	if (pfd >= 0 && fchownat(pfd, name, ctx->uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		tlog(LOG_WARNING, "chown of new %s: %s", name, strerror(errno));
	fs_fd_release(parent);
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

static void forget_one(fuse_ino_t ino, uint64_t n)
{
	struct fs_inode *in = fs_inode_of(ino);

	if (in == &fs.root)
		return;
	pthread_mutex_lock(&fs.lock);
	in->nlookup -= n <= in->nlookup ? n : in->nlookup;
	maybe_free(in);
	pthread_mutex_unlock(&fs.lock);
}

static void fs_ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	forget_one(ino, nlookup);
	fuse_reply_none(req);
}

static void fs_ll_forget_multi(fuse_req_t req, size_t count,
			       struct fuse_forget_data *forgets)
{
	size_t i;

	for (i = 0; i < count; i++)
		forget_one(forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

static void fs_ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;
	int ret = stat_inode(fs_inode_of(ino), &st);

	(void)fi;
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &st, 1.0);
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
	pthread_mutex_lock(&fs.nslock);
	ret = fs_fd_hold(in);
	ret = ret < 0 ? ret : 0;
	fs_proc_path(in->fd, path, sizeof(path));
	if (!ret && (valid & FUSE_SET_ATTR_MODE)) {
		if (S_ISLNK(in->type))
			ret = -EOPNOTSUPP;
		else if (chmod(path, attr->st_mode & 07777) < 0)
			ret = -errno;
	}
	if (!ret && (valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) {
		uid_t u = (valid & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1;
		gid_t g = (valid & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1;

		if (fchownat(in->fd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
			ret = -errno;
	}
	fs_fd_release(in);
	pthread_mutex_unlock(&fs.nslock);
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
		pthread_mutex_lock(&fs.nslock);
		fs_fd_hold(in);
		if (utimensat(in->fd, "", tv, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
			ret = -errno;
			fs_proc_path(in->fd, path, sizeof(path));
			if (ret == -EINVAL)
				ret = utimensat(AT_FDCWD, path, tv, 0) < 0 ? -errno : 0;
		}
		fs_fd_release(in);
		pthread_mutex_unlock(&fs.nslock);
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
	ret = stat_inode(in, &st);
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

static int check_new_name(const char *name)
{
	return hidden_name(name) ? -EPERM : 0;
}

static void fs_ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
			mode_t mode, dev_t rdev)
{
	struct fs_inode *p = fs_inode_of(parent);
	int ret = check_new_name(name), pfd = fs_fd_hold(p);

	if (!ret && pfd < 0)
		ret = pfd;
	if (!ret && mknodat(pfd, name, mode, rdev) < 0)
		ret = -errno;
	fs_fd_release(p);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	own_new(p, name, req);
	reply_entry_or_err(req, p, name);
}

static void fs_ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
			mode_t mode)
{
	struct fs_inode *p = fs_inode_of(parent);
	int ret = check_new_name(name), pfd = fs_fd_hold(p);

	if (!ret && pfd < 0)
		ret = pfd;
	if (!ret && mkdirat(pfd, name, mode) < 0)
		ret = -errno;
	fs_fd_release(p);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	own_new(p, name, req);
	reply_entry_or_err(req, p, name);
}

static void fs_ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
			  const char *name)
{
	struct fs_inode *p = fs_inode_of(parent);
	int ret = check_new_name(name), pfd = fs_fd_hold(p);

	if (!ret && pfd < 0)
		ret = pfd;
	if (!ret && symlinkat(link, pfd, name) < 0)
		ret = -errno;
	fs_fd_release(p);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	own_new(p, name, req);
	reply_entry_or_err(req, p, name);
}

static void fs_ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		       const char *newname)
{
	struct fs_inode *in = fs_inode_of(ino), *p = fs_inode_of(newparent);
	struct fuse_entry_param e;
	int ret = check_new_name(newname), fd, pfd;

	pthread_mutex_lock(&fs.nslock);
	pthread_mutex_lock(&fs.lock);
	fd = fs_fd_hold(in);
	pfd = fs_fd_hold(p);
	if (!ret)
		ret = fd < 0 ? fd : pfd < 0 ? pfd : 0;
	if (!ret && linkat(fd, "", pfd, newname, AT_EMPTY_PATH) < 0)
		ret = -errno;
	if (!ret)
		add_name(in, p, newname);
	fs_fd_release(p);
	fs_fd_release(in);
	pthread_mutex_unlock(&fs.lock);
	pthread_mutex_unlock(&fs.nslock);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	ret = do_lookup(p, newname, &e);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_entry(req, &e);
}

/*
 * After a name of `in` went away (fd: in's held fd): if it has no name
 * left, the file is gone (its pending flush is cancelled), and its backing
 * object is let go as soon as no open handle or request uses it: its space
 * comes back.  fs.lock held.
 */
static void name_removed(struct fs_inode *in, int fd, struct fs_inode *parent,
			 const char *name)
{
	struct stat st;

	move_name(in, parent, name, NULL, NULL);
	if (fd >= 0 && fstatat(fd, "", &st, AT_EMPTY_PATH) == 0 && st.st_nlink == 0) {
		in->unlinked = true;
		drop_aliases(in);
		if (S_ISREG(in->type))
			tfile_unlinked(&in->tf);
		if (in->nopen)
			fs_fd_pin(in);
		else
			fs_fd_gone(in);	/* closed at the caller's release */
	}
}

/*
 * The known inode of name in directory fd dfd, or NULL; referenced, with
 * its fd held in *fd (the caller releases both, after fs.lock: the last
 * close of a removed file frees its blocks).  fs.lock held.
 */
static struct fs_inode *find_child(int dfd, const char *name, int *fd)
{
	struct fs_inode *in;
	struct stat st;

	*fd = -1;
	if (dfd < 0 || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return NULL;
	in = table_find(st.st_dev, st.st_ino);
	if (!in || in == &fs.root)
		return NULL;
	fs_inode_get(in);
	*fd = fs_fd_hold(in);
	return in;
}

static void put_child(struct fs_inode *in)
{
	if (in) {
		fs_fd_release(in);
		fs_inode_put(in);
	}
}

static void fs_ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs_inode *p = fs_inode_of(parent), *in;
	int ret = 0, pfd, fd;

	pthread_mutex_lock(&fs.nslock);
	pthread_mutex_lock(&fs.lock);
	pfd = fs_fd_hold(p);
	in = find_child(pfd, name, &fd);
	if (pfd < 0)
		ret = pfd;
	else if (unlinkat(pfd, name, 0) < 0)
		ret = -errno;
	else if (in)
		name_removed(in, fd, p, name);
	pthread_mutex_unlock(&fs.lock);
	pthread_mutex_unlock(&fs.nslock);
	fs_fd_release(p);
	put_child(in);
	fuse_reply_err(req, -ret);
}

static void fs_ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs_inode *p = fs_inode_of(parent), *in;
	int ret = 0, pfd, fd;

	pthread_mutex_lock(&fs.nslock);
	pthread_mutex_lock(&fs.lock);
	pfd = fs_fd_hold(p);
	in = find_child(pfd, name, &fd);
	if (pfd < 0)
		ret = pfd;
	else if (unlinkat(pfd, name, AT_REMOVEDIR) < 0)
		ret = -errno;
	else if (in)
		name_removed(in, fd, p, name);
	pthread_mutex_unlock(&fs.lock);
	pthread_mutex_unlock(&fs.nslock);
	fs_fd_release(p);
	put_child(in);
	fuse_reply_err(req, -ret);
}

static void fs_ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
			 fuse_ino_t newparent, const char *newname,
			 unsigned int flags)
{
	struct fs_inode *p = fs_inode_of(parent), *np = fs_inode_of(newparent);
	struct fs_inode *src, *dst;
	int ret = check_new_name(newname), pfd, npfd, sfd, dfd;

	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	pthread_mutex_lock(&fs.nslock);
	pthread_mutex_lock(&fs.lock);
	pfd = fs_fd_hold(p);
	npfd = fs_fd_hold(np);
	src = find_child(pfd, name, &sfd);
	dst = find_child(npfd, newname, &dfd);
	if (pfd < 0 || npfd < 0) {
		ret = pfd < 0 ? pfd : npfd;
		goto out;
	}
	if (renameat2(pfd, name, npfd, newname, flags) < 0) {
		ret = -errno;
		goto out;
	}
	if (src == dst)
		goto out;	/* two names of one file: nothing changed */
	if (flags & RENAME_EXCHANGE) {
		if (src)
			move_name(src, p, name, np, newname);
		if (dst)
			move_name(dst, np, newname, p, name);
		goto out;
	}
	if (dst)
		name_removed(dst, dfd, np, newname);
	if (src && S_ISREG(src->type) && !move_name(src, p, name, np, newname))
		set_name(src, np, newname);
out:
	pthread_mutex_unlock(&fs.lock);
	pthread_mutex_unlock(&fs.nslock);
	fs_fd_release(np);
	fs_fd_release(p);
	/* every descriptor first: a put takes fs.lock */
	if (dst)
		fs_fd_release(dst);
	if (src)
		fs_fd_release(src);
	if (dst)
		fs_inode_put(dst);
	if (src)
		fs_inode_put(src);
	fuse_reply_err(req, -ret);
}

static bool writable(int flags)
{
	return (flags & O_ACCMODE) != O_RDONLY;
}

static int open_common(struct fs_inode *in, struct fuse_file_info *fi)
{
	pthread_mutex_lock(&fs.lock);
	if (in->fd_gone) {
		/* removed, closed and let go (an O_PATH descriptor reopened
		 * through /proc): nothing is left to open */
		pthread_mutex_unlock(&fs.lock);
		return -ENOENT;
	}
	in->nopen++;
	pthread_mutex_unlock(&fs.lock);
	if (writable(fi->flags))
		tfile_open_writer(&in->tf);
	fi->fh = FS_FH_FLAGS | (uint32_t)fi->flags;	/* for fs_ll_ioctl */
	/* no kernel page cache across opens: reads reach tierfs, which counts
	 * them, consumes restore hints, and is the cache */
	fi->keep_cache = 0;
	/*
	 * Write-only handles bypass the page cache: the data goes from the
	 * writer's buffer to tierfs in one copy, without the page-cache copy
	 * and its dirty-page throttling.  Nothing can mmap a write-only fd.
	 * Other handles do too when the kernel still mmaps such files
	 * (fs.dio_mmap, see fs_main.c): a read is then one copy from the
	 * cache into the reader's buffer.
	 */
	if ((fi->flags & O_ACCMODE) == O_WRONLY && fs.opts.direct_writes)
		fi->direct_io = 1;
	if (fs.dio_mmap && fs.opts.direct_reads)
		fi->direct_io = 1;
	return 0;
}

static void fs_ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	int ret;

	if (!S_ISREG(in->type)) {
		fuse_reply_err(req, S_ISDIR(in->type) ? EISDIR : ENXIO);
		return;
	}
	ret = open_common(in, fi);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	if (fi->flags & O_TRUNC) {
		ret = tfile_truncate(&in->tf, 0);
		if (ret) {
			if (writable(fi->flags))
				tfile_close_writer(&in->tf);
			pthread_mutex_lock(&fs.lock);
			in->nopen--;
			pthread_mutex_unlock(&fs.lock);
			fuse_reply_err(req, -ret);
			return;
		}
	}
	if (fuse_reply_open(req, fi) == -ENOENT) {
		if (writable(fi->flags))
			tfile_close_writer(&in->tf);
		pthread_mutex_lock(&fs.lock);
		in->nopen--;
		maybe_free(in);
		pthread_mutex_unlock(&fs.lock);
	}
}

static void fs_ll_create(fuse_req_t req, fuse_ino_t parent, const char *name,
			 mode_t mode, struct fuse_file_info *fi)
{
	struct fs_inode *p = fs_inode_of(parent), *in;
	struct fuse_entry_param e;
	int fd, pfd, ret = check_new_name(name);

	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	pfd = fs_fd_hold(p);
	fd = pfd < 0 ? pfd : fs_fd_openat(pfd, name, (fi->flags & (O_EXCL | O_TRUNC | O_NOFOLLOW)) |
					  O_CREAT | O_RDWR, mode);
	if (fd == -EACCES)
		fd = fs_fd_openat(pfd, name, (fi->flags & (O_EXCL | O_NOFOLLOW)) |
				  O_CREAT | O_RDONLY, mode);
	fs_fd_release(p);
	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	close(fd);
	own_new(p, name, req);
	ret = do_lookup(p, name, &e);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	in = fs_inode_of(e.ino);
	if (!S_ISREG(in->type)) {
		forget_one(e.ino, 1);
		fuse_reply_err(req, EISDIR);
		return;
	}
	ret = open_common(in, fi);
	if (ret) {
		forget_one(e.ino, 1);
		fuse_reply_err(req, -ret);
		return;
	}
	if (fi->flags & O_TRUNC)
		tfile_truncate(&in->tf, 0);
	if (fuse_reply_create(req, &e, fi) == -ENOENT) {
		if (writable(fi->flags))
			tfile_close_writer(&in->tf);
		pthread_mutex_lock(&fs.lock);
		in->nopen--;
		pthread_mutex_unlock(&fs.lock);
		forget_one(e.ino, 1);
	}
}

static void fs_ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	const void *p;
	struct copy *pin;
	size_t n;
	ssize_t ret;

	(void)fi;
	if (tfile_read_begin(&in->tf, size, off, &p, &n, &pin)) {
		/* once the reply is out, the reader may close the file and the
		 * kernel forget it: our reference keeps it until read_end */
		fs_inode_get(in);
		fuse_reply_buf(req, p, n);
		tfile_read_end(&in->tf, pin);
		fs_inode_put(in);
		return;
	}
	void *buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ret = tfile_read(&in->tf, buf, size, off);
	if (ret < 0)
		fuse_reply_err(req, (int)-ret);
	else
		fuse_reply_buf(req, buf, (size_t)ret);
	free(buf);
}

static void fs_ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
			size_t size, off_t off, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	ssize_t ret;

	(void)fi;
	ret = tfile_write(&in->tf, buf, size, off);
	if (ret < 0)
		fuse_reply_err(req, (int)-ret);
	else
		fuse_reply_write(req, (size_t)ret);
}

/*
 * close(): a flush of the file that already failed is reported to a
 * descriptor opened for writing (its data is what did not reach the
 * SSD), never to a reader, whose data was right (cat, md5sum).  fsync
 * reports it to every descriptor.  FLUSH carries no open flags: they are
 * in fh (open_common).
 */
static void fs_ll_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	bool wrote = (fi->fh & FS_FH_FLAGS) && writable((int)(uint32_t)fi->fh);

	fuse_reply_err(req, S_ISREG(in->type) && wrote ? -tfile_pending_error(&in->tf) : 0);
}

/*
 * Access time.  FUSE leaves it to the daemon (the kernel marks FUSE inodes
 * S_NOATIME), and reads served from the cache never touch the backing
 * file, so tierfs sets it: when a handle that could read is released (the
 * kernel sends RELEASE in the background, so close() does not wait for
 * this), following the mount's option: noatime never; strictatime always;
 * relatime (the default) when the access time is not newer than the
 * modification time, or is a day old.  (The ctime test of the kernel's
 * relatime is left out: setting the time moves the backing file's ctime.)
 */
static void touch_atime(struct fs_inode *in)
{
	struct timespec now, mt, cmt, tv[2] = { { 0, UTIME_NOW }, { 0, UTIME_OMIT } };
	char path[64];
	uint64_t size;
	struct stat st;

	if (fs.opts.atime == FS_NOATIME)
		return;
	/* not while a new version copies the attributes (v_commit): the
	 * time would land on the version being replaced */
	pthread_mutex_lock(&fs.nslock);
	fs_fd_hold(in);
	if (fstatat(in->fd, "", &st, AT_EMPTY_PATH) == 0) {
		clock_gettime(CLOCK_REALTIME, &now);
		mt = st.st_mtim;	/* a dirty file's cached mtime is newer */
		if (S_ISREG(in->type) && tfile_attr(&in->tf, &size, &cmt) &&
		    (cmt.tv_sec > mt.tv_sec ||
		     (cmt.tv_sec == mt.tv_sec && cmt.tv_nsec > mt.tv_nsec)))
			mt = cmt;
		if (fs.opts.atime == FS_STRICTATIME ||
		    st.st_atim.tv_sec < mt.tv_sec ||
		    (st.st_atim.tv_sec == mt.tv_sec && st.st_atim.tv_nsec <= mt.tv_nsec) ||
		    now.tv_sec - st.st_atim.tv_sec >= 24 * 3600) {
			fs_proc_path(in->fd, path, sizeof(path));
			utimensat(AT_FDCWD, path, tv, 0);
		}
	}
	fs_fd_release(in);
	pthread_mutex_unlock(&fs.nslock);
}

static void fs_ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	bool last, gone;

	fuse_reply_err(req, 0);		/* nothing below can fail */
	if ((fi->flags & O_ACCMODE) != O_WRONLY)
		touch_atime(in);
	if (writable(fi->flags))
		tfile_close_writer(&in->tf);
	pthread_mutex_lock(&fs.lock);
	in->nopen--;
	last = !in->nopen;
	gone = last && in->unlinked;
	if (last)
		fs_inode_get(in);	/* for the closes below, without fs.lock */
	if (gone) {
		/* a removed file's space comes back now (or at the end of
		 * the last request or engine transfer using it): gone under
		 * fs.lock, against a reopen (open_common); closed by the
		 * release below, without fs.lock */
		fs_fd_hold(in);
		fs_fd_gone(in);
	}
	pthread_mutex_unlock(&fs.lock);
	if (last) {
		if (gone)
			fs_fd_release(in);
		else
			fs_data_fd_drop(in);
		fs_inode_put(in);
	}
}

static void fs_ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
			struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);

	(void)datasync;
	(void)fi;
	fuse_reply_err(req, -tfile_fsync(&in->tf));
}

struct fs_dir {
	DIR *dp;			/* open directory stream */
	off_t off;			/* position of the next entry */
	struct dirent *ent;		/* entry read but not yet returned */
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

	(void)ino;
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
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
		if (hidden_name(d->ent->d_name)) {
			d->off = d->ent->d_off;
			d->ent = NULL;
			continue;
		}
		struct stat st = { .st_ino = d->ent->d_ino,
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

static void fs_ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
			    off_t len, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	uint64_t size, end = (uint64_t)off + (uint64_t)len;
	struct timespec mt;
	int ret = 0;

	(void)fi;
	if (off < 0 || len <= 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	tfile_attr(&in->tf, &size, &mt);
	if (mode == 0) {
		if (end > size)
			ret = tfile_truncate(&in->tf, end);
	} else if (mode == FALLOC_FL_KEEP_SIZE) {
		ret = 0;		/* space is the cache's business */
	} else if (mode == (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) ||
		   mode == FALLOC_FL_ZERO_RANGE ||
		   mode == (FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE)) {
		static const char zeros[65536];
		uint64_t pos = (uint64_t)off, stop = end;

		if ((mode & FALLOC_FL_KEEP_SIZE) && stop > size)
			stop = size;
		while (pos < stop && !ret) {
			size_t n = stop - pos < sizeof(zeros) ? (size_t)(stop - pos) : sizeof(zeros);
			ssize_t w = tfile_write(&in->tf, zeros, n, (off_t)pos);
			ret = w < 0 ? (int)w : 0;
			pos += n;
		}
	} else {
		ret = -EOPNOTSUPP;
	}
	fuse_reply_err(req, -ret);
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
	.ioctl		= fs_ll_ioctl,
};

int fs_sync_all(bool give_up)
{
	struct fs_inode **list = NULL;
	size_t n = 0, cap = 0, i;
	int failed = 0;

	pthread_mutex_lock(&fs.lock);
	for (i = 0; i < fs.hsize; i++) {
		struct fs_inode *in;

		for (in = fs.htab[i]; in; in = in->hnext) {
			if (!S_ISREG(in->type) || in->unlinked)
				continue;
			if (n == cap) {
				cap = cap ? 2 * cap : 64;
				struct fs_inode **nl = realloc(list, cap * sizeof(*nl));
				if (!nl)
					break;
				list = nl;
			}
			__atomic_add_fetch(&in->refs, 1, __ATOMIC_ACQ_REL);
			list[n++] = in;
		}
	}
	pthread_mutex_unlock(&fs.lock);
	for (i = 0; i < n; i++) {
		struct tfile *f = &list[i]->tf;
		int r = tfile_fsync(f);

		if (r && give_up) {
			struct timespec mt;
			uint64_t size;
			char nb[256];

			tfile_attr(f, &size, &mt);
			tlog(LOG_ERR, "%s: not written to the backing directory (%" PRIu64
			     " bytes): %s", fs_tfile_ops.name(f, nb, sizeof(nb)), size,
			     strerror(-r));
			tfile_unlinked(f);	/* discarded: its flush is cancelled */
		}
		if (r)
			failed++;
		fs_inode_put(list[i]);
	}
	free(list);
	if (failed && give_up)
		tlog(LOG_ERR, "%d file(s) could not be written to the backing directory", failed);
	return failed;
}
