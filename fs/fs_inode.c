/*
 * fs_inode.c - the inode table, the names of inodes, lookups.
 *
 * An inode is found by its backing object's (st_dev, st_ino) in a hash
 * table; a FUSE node id is the inode's address.  A regular file remembers
 * every name it was given through the mount (its name and its aliases), so
 * that its new versions can be renamed in under the one it has left.
 *
 * Locking (see fs.h): the table, names and counts under fs.lock; a lookup
 * that misses without fs.nslock looks again with it (fs_lookup), because a
 * version commit may be half done.
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
#include "fs_persist.h"

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
bool fs_hidden_name(const char *name)
{
	return strncmp(name, FS_HIDDEN_PREFIX, sizeof(FS_HIDDEN_PREFIX) - 1) == 0;
}

/* The restore queue's key of a directory: its backing object. */
uint64_t fs_dir_key(const struct fs_inode *dir)
{
	return (uint64_t)dir->ino ^ ((uint64_t)dir->dev << 44) ^ ((uint64_t)dir->dev >> 20);
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
struct fs_inode *fs_table_find(dev_t dev, ino_t ino)
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


/* Record `name` in `parent` as in's name (NULL: unknown).  fs.lock held. */
void fs_set_name(struct fs_inode *in, struct fs_inode *parent, const char *name)
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
		fs_maybe_free(old);
	}
}

static void put_dir(struct fs_inode *dir)
{
	if (dir != &fs.root) {
		__atomic_sub_fetch(&dir->refs, 1, __ATOMIC_ACQ_REL);
		fs_maybe_free(dir);
	}
}

/* Forget in's other names.  fs.lock held. */
void fs_drop_aliases(struct fs_inode *in)
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
void fs_add_name(struct fs_inode *in, struct fs_inode *parent, const char *name)
{
	struct fs_alias *a;

	if (!S_ISREG(in->type) || in->unlinked)
		return;
	if (!in->name) {
		fs_set_name(in, parent, name);
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
bool fs_move_name(struct fs_inode *in, struct fs_inode *parent, const char *name,
		      struct fs_inode *np, const char *nn)
{
	struct fs_alias **pp, *a;

	if (in->name && in->parent == parent && strcmp(in->name, name) == 0) {
		if (nn) {
			fs_set_name(in, np, nn);
			return true;
		}
		a = in->aliases;
		if (!a) {
			fs_set_name(in, NULL, NULL);
			return true;
		}
		in->aliases = a->next;
		fs_set_name(in, a->parent, a->name);
		put_dir(a->parent);	/* fs_set_name took its own */
		free(a);
		return true;
	}
	for (pp = &in->aliases; (a = *pp); pp = &a->next) {
		if (a->parent != parent || strcmp(a->name, name))
			continue;
		if (nn)
			fs_add_name(in, np, nn);
		for (pp = &in->aliases; *pp != a; pp = &(*pp)->next)
			;	/* fs_add_name may have put one in front */
		*pp = a->next;
		put_dir(a->parent);
		free(a);
		return true;
	}
	return false;
}

static void inode_free(struct fs_inode *in);

/* fs.lock held: drop in if nothing references it any more. */
void fs_maybe_free(struct fs_inode *in)
{
	if (in == &fs.root || in->nlookup || __atomic_load_n(&in->refs, __ATOMIC_ACQUIRE) > 0 ||
	    in->nopen)
		return;
	fs_table_remove(in);
	inode_free(in);
}


static void inode_free(struct fs_inode *in)
{
	struct fs_inode *parent = in->parent;

	if (S_ISREG(in->type)) {
		fs_persist_forget(in);
		tfile_destroy(&in->tf);
	}
	fs_fd_detach(in);
	fs_drop_aliases(in);
	free(in->name);
	pthread_mutex_destroy(&in->ilock);
	free(in);
	if (parent && parent != &fs.root) {
		__atomic_sub_fetch(&parent->refs, 1, __ATOMIC_ACQ_REL);
		fs_maybe_free(parent);
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
	fs_lock();
	__atomic_sub_fetch(&in->refs, 1, __ATOMIC_ACQ_REL);
	fs_maybe_free(in);
	fs_unlock();
}

int fs_stat_inode(struct fs_inode *in, struct stat *st)
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
 * (v_commit, under the directory's names lock): a miss there may be that
 * window, not a new object.  So a miss without that lock held (`ns`)
 * returns -EAGAIN, and fs_lookup() looks again with it, when no commit in
 * the directory is half done.
 */
static int lookup_once(struct fs_inode *parent, const char *name,
		       struct fuse_entry_param *e, bool ns)
{
	struct fs_inode *in;
	struct stat st;
	int fd, pfd, ret;

	memset(e, 0, sizeof(*e));
	if (fs_hidden_name(name))
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
	fs_lock();
	in = fs_table_find(st.st_dev, st.st_ino);
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
			fs_drop_aliases(in);	/* its only name */
			fs_set_name(in, parent, name);
		}
	} else if (!ns) {
		fs_unlock();
		close(fd);
		return -EAGAIN;
	} else {
		in = calloc(1, sizeof(*in));
		if (!in) {
			fs_unlock();
			close(fd);
			return -ENOMEM;
		}
		in->dev = st.st_dev;
		in->ino = st.st_ino;
		in->type = st.st_mode & S_IFMT;
		in->nlookup = 1;
		pthread_mutex_init(&in->ilock, NULL);
		fs_fd_attach(in, fd);
		if (S_ISREG(in->type)) {
			tfile_init(&in->tf, fs.eng, &fs_tfile_ops, (uint64_t)st.st_size);
			in->tf.mtime = st.st_mtim;
			fs_set_name(in, parent, name);
		}
		fs_table_insert(in);
		if (S_ISREG(in->type)) {
			/* the kernel's reference keeps it alive across the bind */
			fs_unlock();
			engine_hint_bind(fs.eng, fs_dir_key(parent), name, &in->tf);
			fs_lock();
		}
	}
	fs_unlock();
	ret = fs_stat_inode(in, &e->attr);
	if (ret)
		e->attr = st;
	e->attr.st_ino = ino_of(in);
	e->ino = ino_of(in);
	e->attr_timeout = 1.0;
	e->entry_timeout = 1.0;
	return 0;
}

/* Look parent/name up, making its inode known.  No names lock held. */
static int lookup_local(struct fs_inode *parent, const char *name,
			struct fuse_entry_param *e)
{
	int ret = lookup_once(parent, name, e, false);

	if (ret == -EAGAIN) {
		fs_names_lock(parent, NULL);
		ret = lookup_once(parent, name, e, true);
		fs_names_unlock(parent, NULL);
	}
	return ret;
}

/* ...or, with -o persist, brought from its DIR (fs_persist.c) */
int fs_lookup(struct fs_inode *parent, const char *name,
		     struct fuse_entry_param *e)
{
	int ret = lookup_local(parent, name, e);

	if (ret == -ENOENT && fs_persist_on() && fs_persist_fetch(parent, name) == 0)
		ret = lookup_local(parent, name, e);
	return ret;
}


int fs_child_tfile(struct fs_inode *dir, const char *name, struct tfile **out)
{
	struct fuse_entry_param e;
	struct fs_inode *in;
	int ret;

	*out = NULL;
	ret = fs_lookup(dir, name, &e);
	if (ret == -ENOENT)
		return 0;	/* not written yet: bound when it appears */
	if (ret)
		return ret;
	in = fs_inode_of(e.ino);
	if (!S_ISREG(in->type)) {
		fs_forget_one(e.ino, 1);
		return -EINVAL;
	}
	fs_inode_get(in);	/* trade the lookup reference for ours */
	fs_forget_one(e.ino, 1);
	*out = &in->tf;
	return 0;
}


void fs_forget_one(fuse_ino_t ino, uint64_t n)
{
	struct fs_inode *in = fs_inode_of(ino);

	if (in == &fs.root)
		return;
	fs_lock();
	in->nlookup -= n <= in->nlookup ? n : in->nlookup;
	fs_maybe_free(in);
	fs_unlock();
}

int fs_sync_all(bool give_up)
{
	struct fs_inode **list = NULL;
	size_t n = 0, cap = 0, i;
	int failed = 0;

	fs_lock();
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
	fs_unlock();
	for (i = 0; i < n; i++) {
		struct tfile *f = &list[i]->tf;
		int r = tfile_fsync_data(f);	/* the rest: one syncfs below */

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
	/* the flushes' renames, all at once (a directory sync each would be
	 * a journal commit each, for every file flushed) */
	int rfd = fs_fd_openat(fs.root_fd, ".", O_RDONLY | O_DIRECTORY, 0);

	if (rfd < 0 || syncfs(rfd) < 0) {
		tlog(LOG_ERR, "syncfs of %s: %s", fs.opts.backing,
		     strerror(rfd < 0 ? -rfd : errno));
		failed++;
	}
	if (rfd >= 0)
		close(rfd);
	if (failed && give_up)
		tlog(LOG_ERR, "%d file(s) could not be written to the backing directory", failed);
	return failed;
}

int fs_check_new_name(const char *name)
{
	return fs_hidden_name(name) ? -EPERM : 0;
}

/* Give a freshly created backing object to the caller. */
void fs_own_new(struct fs_inode *parent, const char *name, fuse_req_t req)
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

