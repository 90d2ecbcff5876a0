/*
 * fs_inode.c - the inode table, the names of inodes, lookups, inode numbers.
 *
 * An inode is found by its backing object's (st_dev, st_ino) in a hash
 * table; a FUSE node id is the inode's address (the kernel's handle on it:
 * valid while it holds a reference, another address after a forget).  A
 * regular file remembers every name it was given through the mount (its
 * name and its aliases), so that its new versions can be renamed in under
 * the one it has left.
 *
 * Inode numbers (st_ino, d_ino) are not node ids: a file keeps its number
 * for as long as it exists, whatever the kernel forgets, whatever its
 * name (every link shows one number), across new versions and restarts.
 *  - A directory, symlink or special file keeps its backing object for
 *    life: its number is the backing st_ino.  So is the root's.
 *  - A regular file's backing object is replaced by each new version (a
 *    new inode renamed over the name, fs_version.c), so its backing st_ino
 *    is no number for it; nor is its first version's, which is freed with
 *    that version and can be given to a new file or directory.  A regular
 *    file's number is stored with it, as the xattr user.tierfs.ino on its
 *    backing file: each new version gets a copy (copy_attrs), a hard-linked
 *    file's in-place copy keeps it, every name reads the same one.  The
 *    numbers come from a counter in a range of their own, bits 63 and 62
 *    set (FS_INO_TAGGED): backing file systems (ext4, XFS, btrfs, tmpfs)
 *    number their inodes far below 2^62, so a number given here never
 *    equals a directory's.  The counter is kept on the backing root as
 *    user.tierfs.ino_next, reserved a block at a time and synced before a
 *    number of the block is given: a crash skips the rest of a block but
 *    never gives a number twice.
 *  - A file without the xattr (made in the backing directory before the
 *    mount, or outside it) is given its number the first time the mount
 *    shows it (a lookup, a stat, or a listing that reads its d_ino), not at
 *    its first new version: it then has one number from the start, and a
 *    number taken from its backing st_ino would be freed with that first
 *    version (see above).  The cost: one xattr write per such file, once,
 *    which moves its backing ctime.  A file made through the mount is
 *    given its number by the lookup of its create.
 *  - Giving a number reads the xattr again and writes it under the file's
 *    ilock, which a version commit holds from the copy of the xattrs to
 *    the rename: the number goes on the version that stays.  An inode
 *    keeps its number in memory (in->number) once known.
 *  - Where the xattr cannot be written (a backing file system without user
 *    xattrs, a read-only one, an immutable file) the number is bit 63 |
 *    backing st_ino (FS_INO_BACKING): unique among live objects, and
 *    stable until the file's next version (a read-only backing directory
 *    makes none).  A copy of a backing file made outside the mount with
 *    its xattrs (cp -a, rsync -X there) shares the original's number.
 *
 * Calls fs_fd.c (descriptors), fs_locks.c (ilocks) and tiers/; the
 * persistent tier (fs_persist.c), which uses the table, only through
 * fs.inode_ops: a lookup that finds nothing may fetch the name from DIR,
 * and a regular file's inode is forgotten there when it is freed.
 *
 * Locking (see fs.h): the table, names and counts under fs.lock; a lookup
 * that misses without fs.nslock looks again with it (fs_lookup), because a
 * version commit may be half done.  ino.lock (a leaf) guards the counter.
 */
#include <dirent.h>
#include <linux/falloc.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
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
		if (fs.inode_ops)
			fs.inode_ops->forget(in);
		if (in->jretired)	/* its file may come back as a new inode */
			fs_atomic_max(&fs.jretired_gone, in->jretired);
		tfile_destroy(&in->tf);
	}
	fs_fd_detach(in);
	fs_drop_aliases(in);
	free(in->name);
	free(in->redo_version);	/* its record stays live: the replay passes
				 * over it (the file is gone) or finishes it */
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

/* ---- inode numbers (see the top) ----------------------------------- */

#define FS_INO_BACKING	(1ULL << 63)			/* | backing st_ino */
#define FS_INO_TAGGED	(FS_INO_BACKING | (1ULL << 62))	/* | the counter's */
#define FS_INO_BLOCK	4096				/* reserved at a time */

static struct {
	pthread_mutex_t lock;		/* the fields below (LR_FS_INO, a leaf) */
	uint64_t next;			/* the counter's next number */
	uint64_t limit;			/* numbers below it are reserved on disk */
} ino = { .lock = PTHREAD_MUTEX_INITIALIZER, .next = 1, .limit = 1 };

static bool parse_number(const char *buf, ssize_t n, uint64_t *v)
{
	char tmp[24], *end;

	if (n <= 0 || n >= (ssize_t)sizeof(tmp))
		return false;
	memcpy(tmp, buf, (size_t)n);
	tmp[n] = 0;
	errno = 0;
	*v = strtoull(tmp, &end, 10);
	return !errno && *end == 0 && end != tmp;
}

/* The counter where the last daemon left it: before any lookup. */
void fs_ino_start(void)
{
	char path[64], buf[24];
	ssize_t n;
	uint64_t v;

	fs_proc_path(fs.root_fd, path, sizeof(path));
	n = getxattr(path, FS_XATTR_INO_NEXT, buf, sizeof(buf));
	if (parse_number(buf, n, &v) && v > 0 && v < (1ULL << 62))
		ino.next = ino.limit = v;
	else if (n >= 0 || errno != ENODATA)
		tlog(LOG_INFO, "%s: no inode number counter (%s): starting at 1",
		     fs.opts.backing, n >= 0 ? "bad value" : strerror(errno));
}

/*
 * A new number of the counter, into *v; 0 or -errno (nothing could be
 * reserved on disk: no number is given).  A block is reserved on the
 * backing root, and the root synced, before any number of it is given.
 */
static int ino_alloc(uint64_t *v)
{
	char path[64], buf[24];
	int ret = 0, dfd;

	ranked_lock(&ino.lock, LR_FS_INO);
	if (ino.next >= ino.limit) {
		uint64_t limit = ino.next + FS_INO_BLOCK;

		fs_proc_path(fs.root_fd, path, sizeof(path));
		snprintf(buf, sizeof(buf), "%" PRIu64, limit);
		if (limit >= (1ULL << 62))
			ret = -EOVERFLOW;
		else if (setxattr(path, FS_XATTR_INO_NEXT, buf, strlen(buf), 0) < 0)
			ret = -errno;
		if (!ret) {
			dfd = fs_fd_openat(fs.root_fd, ".", O_RDONLY | O_DIRECTORY, 0);
			ret = dfd < 0 ? dfd : fsync(dfd) < 0 ? -errno : 0;
			if (dfd >= 0)
				close(dfd);
		}
		if (!ret)
			ino.limit = limit;
	}
	if (!ret)
		*v = FS_INO_TAGGED | ino.next++;
	ranked_unlock(&ino.lock, LR_FS_INO);
	return ret;
}

/*
 * A number in user.tierfs.ino: the counter's part of it (the range bits
 * left out), little-endian, its high zero bytes left out: 4 bytes or fewer
 * below 2^32 numbers.  ext4 keeps small xattrs in the inode's spare room
 * (about 100 bytes), which the user's attributes share.
 */
static size_t number_encode(uint64_t v, unsigned char *buf)
{
	size_t n = 0;

	for (v &= ~FS_INO_TAGGED; v; v >>= 8)
		buf[n++] = (unsigned char)v;
	return n;
}

/*
 * The number in the xattr of path's object: 0 or -errno (-ENODATA: none,
 * or not one tierfs gave).  follow: path is a /proc fd link (to follow);
 * else a name in the backing directory (never followed).
 */
static int number_read(const char *path, bool follow, uint64_t *v)
{
	unsigned char buf[9];
	ssize_t n = (follow ? getxattr : lgetxattr)(path, FS_XATTR_INO, buf, sizeof(buf));

	if (n < 0)
		return errno == ERANGE ? -ENODATA : -errno;
	if (n == 0 || n > 8 || buf[n - 1] == 0)
		return -ENODATA;
	*v = 0;
	while (n--)
		*v = *v << 8 | buf[n];
	if (*v & FS_INO_TAGGED)
		return -ENODATA;
	*v |= FS_INO_TAGGED;
	return 0;
}

/*
 * Regular file in's number, given now if it has none.  Its ilock held:
 * a version commit copies the xattrs to the new version under it.
 */
static uint64_t number_give(struct fs_inode *in, const struct stat *st)
{
	unsigned char buf[8];
	char path[64];
	uint64_t v = 0;
	struct stat cur;
	int fd, ret;

	fd = fs_fd_hold(in);
	if (fd < 0) {
		fs_fd_release(in);
		return FS_INO_BACKING | st->st_ino;	/* removed and closed */
	}
	fs_proc_path(fd, path, sizeof(path));
	ret = number_read(path, true, &v);
	if (ret == -ENODATA) {
		ret = ino_alloc(&v);
		if (!ret && setxattr(path, FS_XATTR_INO, buf, number_encode(v, buf), 0) < 0)
			ret = -errno;
		static bool told;
		if (ret && !__atomic_exchange_n(&told, true, __ATOMIC_RELAXED))
			tlog(LOG_NOTICE, "%s: a file's inode number cannot be kept with it "
			     "(%s): such files show one of the backing file's, which "
			     "changes with each new version", fs.opts.backing, strerror(-ret));
	}
	if (ret) {
		/* the version held now, not st's (which may be older) */
		v = FS_INO_BACKING | (fstat(fd, &cur) == 0 ? cur.st_ino : st->st_ino);
	}
	fs_fd_release(in);
	return v;
}

/* See fs.h. */
uint64_t fs_ino_number(struct fs_inode *in, const struct stat *st)
{
	char path[64];
	uint64_t v;
	int fd, ret;

	if (!S_ISREG(in->type))
		return st->st_ino;
	v = __atomic_load_n(&in->number, __ATOMIC_ACQUIRE);
	if (v)
		return v;
	fd = fs_fd_hold(in);		/* most files have one: no lock */
	ret = fd < 0 ? fd : fs_proc_path(fd, path, sizeof(path));
	if (!ret)
		ret = number_read(path, true, &v);
	fs_fd_release(in);
	if (ret) {
		fs_attrs_lock(in);
		v = __atomic_load_n(&in->number, __ATOMIC_ACQUIRE);
		if (!v)
			v = number_give(in, st);
		__atomic_store_n(&in->number, v, __ATOMIC_RELEASE);
		fs_attrs_unlock(in);
		return v;
	}
	/* two threads that both read it store the same */
	__atomic_store_n(&in->number, v, __ATOMIC_RELEASE);
	return v;
}

/* See fs.h.  A file without a number is looked up: given one, under its
 * ilock, as a stat would. */
uint64_t fs_dirent_ino(struct fs_inode *dir, int dfd, const char *name, uint64_t d_ino,
		       unsigned char d_type)
{
	struct fuse_entry_param e;
	char path[PATH_MAX];
	uint64_t v;
	int ret;

	if (d_type != DT_REG && d_type != DT_UNKNOWN)
		return d_ino;
	if (snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dfd, name) >= (int)sizeof(path))
		return d_ino;
	ret = number_read(path, false, &v);
	if (!ret)
		return v;
	if (ret == -ENOTSUP && d_type == DT_REG)
		return FS_INO_BACKING | d_ino;	/* no xattrs here: see the top */
	if (fs_lookup(dir, name, &e))
		return d_type == DT_REG ? FS_INO_BACKING | d_ino : d_ino;	/* gone */
	v = e.attr.st_ino;
	fs_forget_one(e.ino, 1);
	return v;
}

/* stat of in's backing object, size and mtime from the engine; st_ino is
 * the backing one. */
static int stat_backing(struct fs_inode *in, struct stat *st)
{
	int fd, ret, tries = 0;

again:
	fd = fs_fd_hold(in);
	ret = fd < 0 ? fd :
	      fs_journal_fstat(fd, st, AT_SYMLINK_NOFOLLOW);
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

int fs_stat_inode(struct fs_inode *in, struct stat *st)
{
	int ret = stat_backing(in, st);

	if (!ret)
		st->st_ino = fs_ino_number(in, st);
	return ret;
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
	ret = fs_journal_fstat(fd, &st, AT_SYMLINK_NOFOLLOW);
	if (ret) {
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
	ret = stat_backing(in, &e->attr);	/* st_ino: fs_lookup's, unlocked */
	if (ret)
		e->attr = st;
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

/* ...or, with -o persist, brought from its DIR (fs.inode_ops) */
int fs_lookup(struct fs_inode *parent, const char *name,
		     struct fuse_entry_param *e)
{
	int ret = lookup_local(parent, name, e);

	if (ret == -ENOENT && fs.inode_ops && fs.inode_ops->fetch(parent, name) == 0)
		ret = lookup_local(parent, name, e);
	if (!ret)
		e->attr.st_ino = fs_ino_number(fs_inode_of(e->ino), &e->attr);
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

/* readlink of fd's /proc/self/fd entry into buf[len]: 0 or -errno. */
static int fd_path(int fd, char *buf, size_t len)
{
	char proc[64];
	ssize_t n;

	if (fd < 0)
		return fd;
	fs_proc_path(fd, proc, sizeof(proc));
	n = readlink(proc, buf, len - 1);
	if (n < 0)
		return -errno;
	buf[n] = 0;
	return 0;
}

int fs_rel_path(struct fs_inode *in, char *buf, size_t len)
{
	char name[NAME_MAX + 1] = "", dpath[PATH_MAX], rpath[PATH_MAX];
	struct fs_inode *dir = in;
	const char *rel;
	size_t rl;
	int ret;

	if (!S_ISDIR(in->type)) {	/* a file: its name in its directory */
		fs_lock();
		if (!in->name || !in->parent) {
			fs_unlock();
			return -ENOENT;
		}
		snprintf(name, sizeof(name), "%s", in->name);
		dir = in->parent;
		__atomic_add_fetch(&dir->refs, 1, __ATOMIC_ACQ_REL);
		fs_unlock();
	}
	/* the directory: where its backing directory is under the root's */
	ret = fd_path(fs_fd_hold(dir), dpath, sizeof(dpath));
	fs_fd_release(dir);
	if (dir != in)
		fs_inode_put(dir);
	if (!ret)
		ret = fd_path(fs.root_fd, rpath, sizeof(rpath));
	if (ret)
		return ret;
	rl = strlen(rpath);
	if (strncmp(dpath, rpath, rl) || (dpath[rl] && dpath[rl] != '/'))
		return -ENOENT;		/* moved out, or removed ("... (deleted)") */
	rel = dpath[rl] ? dpath + rl + 1 : "";
	if (snprintf(buf, len, "%s%s%s", *rel ? rel : (*name ? "" : "."),
		     *rel && *name ? "/" : "", name) >= (int)len)
		return -ENAMETOOLONG;
	return 0;
}

/* Count in as given up; keep its path while there is room (its name
 * alone, fallback, where the path is not known). */
static void note_lost(struct fs_inode *in, const char *fallback)
{
	char path[PATH_MAX];

	if (fs.lost++ >= FS_LOST_NAMES)
		return;
	fs.lost_names[fs.lost - 1] = strdup(fs_rel_path(in, path, sizeof(path)) ? fallback : path);
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
			note_lost(list[i], nb);
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

/*
 * Give a freshly created backing object to the caller.  A daemon that is
 * not root (a user's mount) made it as its own user and cannot give it
 * away: an object another user makes through allow_other stays the
 * mount's user's (said once), and the mount's user's own take the
 * caller's group where the daemon may (a group it is in).
 */
void fs_own_new(struct fs_inode *parent, const char *name, fuse_req_t req)
{
	static int said_others, said_group;
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct stat pst;
	gid_t gid = ctx->gid;
	uid_t me = geteuid();
	int pfd;

	if (me != 0 && ctx->uid != me) {
		if (!__atomic_exchange_n(&said_others, 1, __ATOMIC_RELAXED))
			tlog(LOG_NOTICE, "files that other users make (allow_other) belong to "
			     "the mount's user, uid %lu: a daemon not run as root cannot give "
			     "them away", (unsigned long)me);
		return;
	}
	pfd = fs_fd_hold(parent);
	if (pfd >= 0 && fstatat(pfd, "", &pst, AT_EMPTY_PATH) == 0 && (pst.st_mode & S_ISGID))
		gid = (gid_t)-1;	/* setgid directory: keep its group */
	if (me != 0)
		gid = gid == getegid() ? (gid_t)-1 : gid;
	if (pfd >= 0 && (me == 0 || gid != (gid_t)-1) &&
	    fchownat(pfd, name, me == 0 ? ctx->uid : (uid_t)-1, gid, AT_SYMLINK_NOFOLLOW) < 0) {
		if (me == 0)
			tlog(LOG_WARNING, "chown of new %s: %s", name, strerror(errno));
		else if (!__atomic_exchange_n(&said_group, 1, __ATOMIC_RELAXED))
			tlog(LOG_NOTICE, "new files keep the daemon's group where the caller's "
			     "(gid %lu) is not one of its groups: %s", (unsigned long)ctx->gid,
			     strerror(errno));
	}
	fs_fd_release(parent);
}

