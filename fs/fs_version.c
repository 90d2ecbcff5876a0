/*
 * fs_version.c - new versions of backing files (struct tfile_ops).
 *
 * The engine writes a cached file back as a new version: an O_TMPFILE
 * next to the file (version_open), filled and synced by the engine, then
 * made current (version_commit) by linking it under a temporary name and
 * renaming it over the old one, so that the backing directory only ever
 * holds complete versions.  A hard-linked file's new version is copied
 * over it instead, under a commit intent in the backing directory's
 * journal (fs_intent.c).  The inode moves to the new
 * version's backing object before its name does (swap_fd).
 *
 * Locking (the helpers are fs_locks.c's): the file's ilock across a commit
 * (its attributes steady), its directory's names lock across the part
 * that reads and uses its name (fs_dirs_lock), fs.nslock too for a
 * hard-linked file's journalled copy; fs.lock only around table and
 * descriptor bookkeeping; the syscalls that change the backing directory
 * run without fs.lock (see v_commit).  Calls fs_intent.c for the copy of
 * a hard-linked file's version.
 */
#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

#include "fs.h"
#include "journal.h"

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
		fd = backing_open(AT_FDCWD, path, flags | O_DIRECT, 0600);
		if (fd >= 0) {
			*direct = true;
			return fd;
		}
		if (errno != EINVAL) {
			fd = -errno;
			goto err;
		}
	}
	fd = backing_open(AT_FDCWD, path, flags, 0600);
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
	bool gone;
	int ret = 0, fd;

	/*
	 * Decide under fs.lock, open without it: creating the new version's
	 * inode takes a journal handle, which can wait for a commit (another
	 * flush's fdatasync), and lookups, creates, opens and releases of the
	 * whole mount take fs.lock.
	 */
	*inplace = false;
	fs_lock();
	gone = in->unlinked;
	if (gone) {
		/* anonymous storage for a file that has no name any more */
		dir = &fs.root;
	} else {
		fd = fs_fd_hold(in);
		if (fd < 0)
			ret = fd;
		else if ((ret = fs_journal_fstat(fd, &st, 0)))
			;	/* names only: a clone record's base link is none */
		else if (st.st_nlink == 1 && in->name && in->parent)
			dir = in->parent;
		else		/* hard links: copied in place at commit */
			dir = &fs.root;
		if (!ret)	/* its next changes journalled, whatever their share */
			tfile_set_linked(&in->tf, st.st_nlink > 1);
		fs_fd_release(in);
	}
	if (dir)
		fs_inode_get(dir);	/* it keeps its fd reopenable */
	fs_unlock();
	if (ret)
		return ret;
	ret = open_held(dir, O_TMPFILE | O_RDWR, want_direct, direct);
	if (ret < 0 && !gone && (ret == -EOPNOTSUPP || ret == -EISDIR)) {
		/* no O_TMPFILE here: the file itself, in place (not atomic) */
		*inplace = true;
		ret = fs_journal_retired_durable(in);
		if (!ret) {
			fs_ns_intent(in, false);
			ret = open_held(in, O_RDWR, want_direct, direct);
		}
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
	/* the file's inode number (fs_inode.c), whatever the list above
	 * could hold: a file's number is its for life */
	vl = getxattr(path, FS_XATTR_INO, val, sizeof(val));
	if (vl > 0 && fsetxattr(fd, FS_XATTR_INO, val, (size_t)vl, 0) < 0)
		tlog(LOG_WARNING, "the inode number of a new version: %s", strerror(errno));
	tv[0] = old->st_atim;
	tv[1] = tfile_mtime(&in->tf);
	if (!tv[1].tv_sec && !tv[1].tv_nsec)
		tv[1] = old->st_mtim;
	futimens(fd, tv);
}

/*
 * BACKING/.tierfs.tmp: the temporary names of new versions (rename_in).  In
 * a directory of their own, not the backing root: a link there and the
 * rename away from there change that directory's mtime, which would
 * otherwise be the root's, put back by every commit with the root's names
 * lock held from the link to the rename, so that all commits of the mount
 * waited for each other and every name change in the root for them.
 * Emptied at start-up (what is there is a killed daemon's, never
 * committed); removed at exit.  Without it (it cannot be made, or is not
 * a directory) the root is used as before.
 */
#define TMP_DIR		FS_HIDDEN_PREFIX ".tmp"
#define NEW_PREFIX	FS_HIDDEN_PREFIX ".new."


void fs_tmp_dir_start(void)
{
	struct dirent *de;
	DIR *d;
	int dfd;

	fs.tmp_fd = -1;
	/* the temporary names a killed daemon left in the backing root itself
	 * (where it had no .tierfs.tmp): versions never committed */
	(void)fs_sweep_names(fs.root_fd, NEW_PREFIX, NULL);
	if (mkdirat(fs.root_fd, TMP_DIR, 0700) < 0 && errno != EEXIST) {
		tlog(LOG_INFO, "cannot make %s/" TMP_DIR " (%s): new versions are named in "
		     "the backing directory itself", fs.opts.backing, strerror(errno));
		return;
	}
	dfd = openat(fs.root_fd, TMP_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0 || !(d = fdopendir(dfd))) {
		tlog(LOG_WARNING, "cannot open %s/" TMP_DIR " (%s): new versions are named "
		     "in the backing directory itself", fs.opts.backing, strerror(errno));
		if (dfd >= 0)
			close(dfd);
		return;
	}
	while ((de = readdir(d)))	/* a killed daemon's uncommitted versions */
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			unlinkat(dirfd(d), de->d_name, 0);
	closedir(d);
	fs.tmp_fd = openat(fs.root_fd, TMP_DIR, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

void fs_tmp_dir_end(void)
{
	if (fs.tmp_fd < 0)
		return;
	close(fs.tmp_fd);
	fs.tmp_fd = -1;
	if (unlinkat(fs.root_fd, TMP_DIR, AT_REMOVEDIR) < 0 && errno != ENOENT)
		tlog(LOG_WARNING, "cannot remove %s/" TMP_DIR ": %s", fs.opts.backing,
		     strerror(errno));
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
 * Link version fd (consumed) under a temporary name and rename it over
 * dir/name, moving in to it first.  dir's names locked, and the root's
 * where the temporary name is made there (lock_parent).  closing: the fds that
 * swap_fd replaced, for the caller to close; *dfd: with durable, the
 * directory for the caller to sync.
 */
static int rename_in(struct fs_inode *in, struct fs_inode *dir, const char *name, int fd,
		     bool durable, int closing[2], int *dfd)
{
	static unsigned long counter;
	char path[64], tmp[64];
	struct timespec dmt = { 0, 0 }, rmt = { 0, 0 };
	bool dok = false, rok = false;
	int ret = 0, pfd, nfd;

	pfd = fs_fd_hold(dir);
	if (pfd < 0) {
		ret = pfd;
		goto out;
	}
	fs_dir_mtime_get(pfd, &dmt, &dok);
	if (dir != &fs.root && fs.tmp_fd < 0)
		fs_dir_mtime_get(fs.root_fd, &rmt, &rok);
	fs_proc_path(fd, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), FS_HIDDEN_PREFIX ".new.%lx.%lu",
		 (unsigned long)getpid(), __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	/*
	 * The temporary name is in BACKING/.tierfs.tmp (or the backing root),
	 * where the next start-up removes it if a kill comes before the
	 * rename (fs_tmp_dir_start); in the file's own
	 * directory only where that is another file system.
	 */
	int tdir = fs.tmp_fd >= 0 ? fs.tmp_fd : fs.root_fd;
	int r = linkat(AT_FDCWD, path, tdir, tmp, AT_SYMLINK_FOLLOW);

	if (r < 0 && errno == EXDEV) {
		tdir = pfd;
		r = linkat(AT_FDCWD, path, tdir, tmp, AT_SYMLINK_FOLLOW);
	}
	if (r < 0) {
		ret = -errno;
		goto out;
	}
	/*
	 * The inode moves to the new version before its name does: a stat
	 * of it in between sees the new version under its temporary name
	 * (one link), never the old one renamed over (no link left).  A
	 * lookup of the name in between finds the old version under a key
	 * the table no longer has, and looks again under dir's names lock, which
	 * we hold (do_lookup).  Reopened by name: the tmpfile's own dentry
	 * stays an unnamed one.
	 */
	tierfs_fault_kill("new_linked");
	nfd = fs_fd_openat(tdir, tmp, O_PATH | O_NOFOLLOW, 0);
	if (nfd >= 0) {
		close(fd);
		fd = nfd;
	}
	fs_lock();
	swap_fd(in, fd, closing);
	fs_unlock();
	fd = -1;
	if (renameat(tdir, tmp, pfd, name) < 0) {
		int back[2] = { -1, -1 };

		ret = -errno;
		unlinkat(tdir, tmp, 0);
		/* the name keeps the old version: the inode goes back to it */
		nfd = fs_fd_openat(pfd, name, O_PATH | O_NOFOLLOW, 0);
		if (nfd >= 0) {
			fs_lock();
			swap_fd(in, nfd, back);
			fs_unlock();
			for (int i = 0; i < 2; i++)
				if (back[i] >= 0)
					close(back[i]);
		}
		goto out;
	}
	__atomic_add_fetch(&in->renames, 1, __ATOMIC_ACQ_REL);
	if (durable) {		/* synced by the caller */
		*dfd = fs_fd_openat(pfd, ".", O_RDONLY | O_DIRECTORY, 0);
		if (*dfd < 0)
			ret = *dfd;
	}
out:
	if (pfd >= 0) {
		fs_dir_mtime_put(pfd, &dmt, dok);
		fs_dir_mtime_put(fs.root_fd, &rmt, rok);
	}
	fs_fd_release(dir);
	if (fd >= 0)
		close(fd);
	return ret;
}

/*
 * The directory that holds in's name, referenced, with its names locked
 * (fs_dirs_lock), and the backing root's too where it is changed and its
 * mtime put back (root: a journalled copy's record; no .tierfs.tmp: the
 * temporary name); NULL, nothing locked, for a file without a known name.
 */
static struct fs_inode *lock_parent(struct fs_inode *in, bool root, struct fs_inode **also)
{
	struct fs_inode *dir;
	bool same;

	*also = root || fs.tmp_fd < 0 ? &fs.root : NULL;
	for (;;) {
		fs_lock();
		dir = in->unlinked ? NULL : in->parent;
		if (dir)
			fs_inode_get(dir);
		fs_unlock();
		if (!dir)
			return NULL;
		fs_dirs_lock(dir, *also);
		fs_lock();
		same = !in->unlinked && in->parent == dir;
		fs_unlock();
		if (same)
			return dir;
		fs_dirs_unlock(dir, *also);	/* renamed meanwhile */
		fs_inode_put(dir);
	}
}

/* A version written in the file itself (v_commit's inplace): its mtime
 * set, synced when it must be durable, closed; the persistent tier told. */
static int commit_inplace(struct fs_inode *in, int fd, bool durable)
{
	struct timespec tv[2] = { { 0, UTIME_OMIT }, tfile_mtime(&in->tf) };
	int ret = 0;

	if (tv[1].tv_sec || tv[1].tv_nsec)
		futimens(fd, tv);
	if (durable && fsync(fd) < 0)
		ret = -errno;
	close(fd);
	if (!ret && fs_persist_on()) {
		fs_ns_lock();
		fs_ns_committed(in);
		fs_ns_unlock();
	}
	return ret;
}

/*
 * in's ilock held: version fd (consumed) of a file with several names
 * copied over it in place under a commit intent (fs_intent_copy) that
 * names it by its handle, without the names lock of its directory or
 * fs.nslock.  An in-place copy renames nothing, and the intent's path is a
 * hint beside the handle (a replay looks the file up by its handle where
 * the path names another), as it is once the commit returns and until the
 * settler retires the intent; held across the intent's journal sync (a
 * log commit) and the copy, those locks made every create, link, unlink
 * and rename in the directory wait, and every rename of a directory
 * (RESULTS 18n).  1 where the file has no handle or no name left (the
 * caller commits it under the locks, fd still its), else 0 or -errno.
 */
static int commit_linked(struct fs_inode *in, int fd)
{
	struct timespec rmt;
	struct stat old;
	bool fast, rok;
	int ofd, ret;

	fs_lock();
	fast = in->fh && !in->unlinked;
	fs_unlock();
	if (!fast)
		return 1;
	ofd = fs_fd_hold(in);
	if (ofd < 0 || fstatat(ofd, "", &old, AT_EMPTY_PATH) < 0) {
		ret = ofd < 0 ? ofd : -errno;
	} else {
		fs_dir_mtime_get(fs.root_fd, &rmt, &rok);
		ret = fs_intent_copy(in, NULL, NULL, ofd, fd, &old);
		fs_dir_mtime_put(fs.root_fd, &rmt, rok);
	}
	fs_fd_release(in);
	close(fd);
	return ret;
}

/*
 * Make version fd (an O_TMPFILE, or with inplace the file itself) current.
 *
 * Locking: in's ilock (fs_attrs_lock) across the whole commit: the mode,
 * owner, xattrs and times copied onto the new version are the ones it
 * replaces (setattr and the xattr calls take it too), and no link of it
 * is made meanwhile.  Its directory's names lock (lock_parent), which
 * every change of a name in it takes (link, unlink, rmdir, rename), from
 * the reading of in's name to the rename of the new version
 * over the old one: the name keeps naming in, and a lookup that misses
 * while the inode and the name move to the new version looks again under
 * it (lookup_once).  The attribute copy (a dozen syscalls, each of which
 * can wait for the journal) is made before it, and namespace changes in
 * other directories never wait for a commit.  A hard-linked file is
 * copied in place under a commit intent, without these locks where its
 * handle names it (commit_linked); else the intent names its path, and
 * fs.nslock is taken as well, which every rename of a directory takes
 * (fs_ll_rename), so that the path keeps naming the file.
 * fs.lock is taken only for the bookkeeping.  The syscalls that change
 * the backing directory run without it: each needs a journal handle,
 * which can wait for a commit (hundreds of ms on a disk busy with
 * flushes), and every lookup, create, open and release of the mount takes
 * fs.lock.
 *
 * Over 100 lines: the lock protocol above runs from the attribute copy to
 * the directory's sync with one unwinding for all its ways out (removed
 * meanwhile, adopted, copied in place, renamed); in pieces, each would
 * have to know which of the locks the others took.
 */
/*
 * v_commit's end, with no lock held: the descriptors a swap or rename let
 * go (closing) closed, and the rename made durable with its directory
 * (dfd, -1: none).  Returns ret, or the directory sync's error.
 */
static int commit_end(struct fs_inode *in, int closing[2], int dfd, int ret)
{
	if (closing[0] >= 0)
		close(closing[0]);
	if (closing[1] >= 0)
		close(closing[1]);
	if (dfd >= 0) {
		uint64_t renames = __atomic_load_n(&in->renames, __ATOMIC_ACQUIRE);

		if (fsync(dfd) < 0) {
			if (!ret)
				ret = -errno;
		} else {
			fs_atomic_max(&in->renames_synced, renames);
		}
		close(dfd);
	}
	return ret;
}

/*
 * A removed file still open adopts its new version: the data lives on,
 * nameless, with the file's mode, owner, xattrs and times (copied
 * already); fd is consumed.  -ENOENT where nobody has it open any more.
 * in's descriptor held (released here).
 */
static int adopt(struct fs_inode *in, int fd, int closing[2])
{
	int ret = 0;

	fs_fd_release(in);
	fs_lock();
	if (in->nopen)
		swap_fd(in, fd, closing);
	else
		ret = -ENOENT;
	fs_unlock();
	if (ret)
		close(fd);
	return ret;
}

/*
 * A file of several names (or none known) whose backing inode is a live
 * clone record's base (a name was linked to it after the record was made:
 * a base of several names is refused, fs_journal_clone) has its new
 * version copied over that inode, which the record's replay clones: wait, before any of
 * the commit's locks, for the record's version to retire it (its build
 * takes none of them).  After BASE_WAIT_S the copy goes ahead, said in the
 * log: until that version is in, a crash would replay the record against
 * the new content.
 */
#define BASE_WAIT_S	30.0

static void base_wait(struct fs_inode *in)
{
	struct stat st;
	char nb[PATH_MAX];
	int ofd;
	bool named, inplace;

	if (fs_journal_no_bases())
		return;		/* every commit: no fstat, no fs.lock */
	ofd = fs_fd_hold(in);
	fs_lock();
	named = in->name && in->parent && !in->unlinked;
	fs_unlock();
	/* copied in place (below): several names, or no name known */
	inplace = ofd >= 0 && fs_journal_fstat(ofd, &st, 0) == 0 &&
		  (st.st_nlink > 1 || (!named && st.st_nlink));
	fs_fd_release(in);
	if (!inplace || fs_journal_base_wait(st.st_dev, st.st_ino, BASE_WAIT_S))
		return;
	fs_lock();
	snprintf(nb, sizeof(nb), "%s", in->name ? in->name : "(unlinked file)");
	fs_unlock();
	tlog(LOG_WARNING, "%s: a clone record based on this file (several names, or none "
	     "known) is still live after %.0f s; its new version is copied over it in place",
	     nb, BASE_WAIT_S);
}

static int v_commit(struct tfile *f, int fd, bool inplace, bool durable)
{
	struct fs_inode *in = in_of(f), *dir = NULL, *also = NULL;
	char *name = NULL;
	struct stat old;
	bool unlinked, open, named, intended = false, ns;
	int ret = 0, ofd, dfd = -1, closing[2] = { -1, -1 };

	if (inplace)
		return commit_inplace(in, fd, durable);
	base_wait(in);
	fs_attrs_lock(in);
	/* the attributes first, outside the names locks: they are in's,
	 * whatever its name (a removed file's are adopted with its data);
	 * its names counted without the journal's links of it (a live clone
	 * record's base: the rename below leaves that inode as it is) */
	ofd = fs_fd_hold(in);
	if (ofd < 0 || (ret = fs_journal_fstat(ofd, &old, 0))) {
		ret = ofd < 0 ? ofd : ret;
		fs_fd_release(in);
		fs_lock();
		if (in->unlinked && !in->nopen)
			ret = -ENOENT;	/* as below: removed meanwhile */
		fs_unlock();
		goto out_attrs;
	}
	copy_attrs(in, ofd, fd, &old);
	fs_fd_release(in);
	if (old.st_nlink > 1 && !fs_persist_on()) {
		ret = commit_linked(in, fd);
		if (ret != 1) {
			fd = -1;	/* consumed */
			goto out_attrs;
		}
		ret = 0;
	}
	/* links are made under in's ilock: one link now stays one */
	ns = old.st_nlink > 1 && !fs_persist_on();
	if (ns)
		fs_ns_lock();
	dir = lock_parent(in, ns, &also);
	fs_lock();
	unlinked = in->unlinked;
	open = in->nopen > 0;
	named = !unlinked && in->name && dir;
	if (named)
		name = strdup(in->name);
	fs_unlock();
	if (unlinked && !open) {
		ret = -ENOENT;	/* removed, and nobody can read it any more */
		goto out_close;
	}
	if (named && !name) {
		ret = -ENOMEM;
		goto out_close;
	}
	ofd = fs_fd_hold(in);
	if (ofd < 0 || (ret = fs_journal_fstat(ofd, &old, 0))) {
		ret = ofd < 0 ? ofd : ret;
		fs_fd_release(in);
		goto out_close;
	}
	if (unlinked) {
		ret = adopt(in, fd, closing);
		fd = -1;
		goto out_close;
	}
	fs_ns_intent(in, true);
	intended = true;
	if (old.st_nlink > 1 || !name) {
		/* hard-linked, or no name of it is known: copy it in place,
		 * journalled in the backing root (whose mtime is put back) */
		struct timespec rmt;
		bool rok;

		fs_dir_mtime_get(fs.root_fd, &rmt, &rok);
		ret = fs_intent_copy(in, name ? dir : NULL, name, ofd, fd, &old);
		fs_dir_mtime_put(fs.root_fd, &rmt, rok);
		fs_fd_release(in);
		goto out_close;
	}
	fs_fd_release(in);

	ret = rename_in(in, dir, name, fd, durable, closing, &dfd);
	fd = -1;
out_close:
	if (fd >= 0)
		close(fd);
	fd = -1;
	if (!ret && !unlinked)
		fs_ns_committed(in);	/* in order with renames: nslock */
	if (intended)
		fs_ns_intent_end();
	if (dir)
		fs_dirs_unlock(dir, also);
	if (ns)
		fs_ns_unlock();
out_attrs:
	fs_attrs_unlock(in);
	if (fd >= 0)
		close(fd);
	free(name);
	if (dir)
		fs_inode_put(dir);
	return commit_end(in, closing, dfd, ret);
}

/*
 * tfile_ops.sync_meta, the part of fsync(2) that is not the flush of the
 * data:
 *  - the renames of versions that flushers made in the background (no
 *    directory sync: a flush is not an fsync) become durable with the
 *    directory that holds the file's name.  Without this an fsync that
 *    found its flush done, or waited for one, returned while a power cut
 *    could still bring the previous version back (tests/test_power_cut.py).
 *    The current directory: a rename of the file elsewhere since was made
 *    after the version's, and ext4, XFS and btrfs make a directory's
 *    changes durable in the order of their journal or log, earlier ones
 *    first.
 *  - changes of the mode, owner, times and xattrs made since the last
 *    fsync, in the backing file itself, with an fsync of it.
 * Each only when there is something to make durable: a sync of what is
 * durable already still costs the disk a cache flush.  Nothing for a
 * removed file: none of it is left to make durable.
 */
static int v_sync_meta(struct tfile *f)
{
	struct fs_inode *in = in_of(f), *dir = NULL;
	uint64_t renames = __atomic_load_n(&in->renames, __ATOMIC_ACQUIRE);
	uint64_t attrs = __atomic_load_n(&in->attrs, __ATOMIC_ACQUIRE);
	bool attrs_due = __atomic_load_n(&in->attrs_synced, __ATOMIC_ACQUIRE) < attrs;
	int ret = 0;

	fs_lock();
	if (in->unlinked) {
		fs_unlock();
		return 0;
	}
	if (in->parent && __atomic_load_n(&in->renames_synced, __ATOMIC_ACQUIRE) < renames) {
		dir = in->parent;
		fs_inode_get(dir);
	}
	fs_unlock();
	if (attrs_due) {
		int fd = fs_data_fd_get(in);

		ret = fd < 0 ? fd : fsync(fd) < 0 ? -errno : 0;
		if (fd >= 0)
			fs_data_fd_put(in, fd);
		if (!ret)
			fs_atomic_max(&in->attrs_synced, attrs);
	}
	if (dir) {
		int pfd = fs_fd_hold(dir);

		if (!ret)
			ret = pfd < 0 ? pfd : fs_fd_sync_dir(pfd);
		fs_fd_release(dir);
		fs_inode_put(dir);
		if (!ret)
			fs_atomic_max(&in->renames_synced, renames);
	}
	return ret;
}

/*
 * A small first version, in place (tfile_ops.version_small).
 *
 * A file created through the mount has an empty backing file until its
 * first flush.  When that first version fits in one page, it is written
 * into the backing file itself with ONE pwrite at offset 0, instead of a
 * new O_TMPFILE inode linked and renamed over the name (two inode
 * allocations and a free per small file, where a local file system
 * spends one).  Why that keeps "after a kill or crash each file is some
 * complete version":
 *  - a kill of the daemon: a buffered write that fits in one page is
 *    copied in one step; the kernel checks for a fatal signal only
 *    between pages, and a short copy into a page that is not up to date
 *    is thrown away whole (block_write_end).  The file is either still
 *    empty (its previous version) or holds all of the new one.  A short
 *    write (an error) is truncated back to empty.
 *  - a crash of the machine before the flusher's fdatasync: ext4 with
 *    data=ordered (its default) allocates the block and sets the on-disk
 *    size at writeback, in the transaction that the data is ordered
 *    before: the file is empty or complete, as with a rename.  (Without
 *    a journal, or with data=writeback, nothing is promised across a
 *    power loss, for a rename either.)
 *  - only an empty, singly linked regular file qualifies: nothing of an
 *    earlier version can show through, and no other name needs the
 *    journalled copy.  The test and the write are made under the file's
 *    ilock (fs_attrs_lock), which every commit of a version of it takes:
 *    two flushes cannot both find it empty, and no xattr call can give it
 *    a file capability in between.  Names do not matter here (the write
 *    is through the inode, not a name): a link or rename made meanwhile
 *    keeps the inode, and an unlink leaves a removed file's data.
 * The flusher settles the fd as a version written in place (its
 * fdatasync, in flight with those of the other small files of its group)
 * and commits it (v_commit with inplace: the cached mtime, the close, the
 * persistent tier's note); mode, owner and xattrs are the file's own
 * already.
 */
static int v_small(struct tfile *f, const void *buf, uint64_t len, int *fdp)
{
	struct fs_inode *in = in_of(f);
	struct stat st;
	bool gone, d;
	ssize_t n = 0;
	int fd, ret = 1;

	if (len > (uint64_t)sysconf(_SC_PAGESIZE))
		return 0;
	fs_attrs_lock(in);
	fs_lock();
	gone = in->unlinked || !in->name || !in->parent;
	fs_unlock();
	if (gone) {
		fs_attrs_unlock(in);
		return 0;	/* the usual path adopts or drops it */
	}
	/* most small flushes are rewrites: look before opening */
	fd = fs_fd_hold(in);
	ret = fd < 0 ? fd : fstatat(fd, "", &st, AT_EMPTY_PATH) < 0 ? -errno : 1;
	fs_fd_release(in);
	if (ret > 0 && (!S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_size))
		ret = 0;
	if (ret > 0)
		fd = open_held(in, O_RDWR, false, &d);
	if (ret > 0 && fd < 0)
		ret = fd;
	/* the same file, still empty: an open through /proc is of the inode;
	 * and without a file capability, which our write would take away */
	if (ret > 0 && (fstat(fd, &st) < 0 || st.st_nlink != 1 || st.st_size ||
			fgetxattr(fd, "security.capability", NULL, 0) >= 0)) {
		close(fd);
		ret = 0;
	}
	if (ret > 0 && fs_journal_retired_durable(in)) {
		close(fd);
		ret = 0;	/* a record's retirement not durable: a new
				 * version, which no replay of it can touch */
	}
	if (ret <= 0) {
		fs_attrs_unlock(in);
		return ret;
	}
	fs_ns_intent(in, false);	/* changed in place, as v_open's */
	if (len)
		n = pwrite(fd, buf, (size_t)len, 0);
	tierfs_fault_kill("small_written");
	if (n != (ssize_t)len) {
		ret = n < 0 ? -errno : -EIO;
		if (n > 0 && ftruncate(fd, 0) < 0)	/* back to its version */
			tlog(LOG_ERR, "inode %ju: a short write of its first version "
			     "could not be undone: %s", (uintmax_t)st.st_ino, strerror(errno));
	}
	fs_attrs_unlock(in);
	if (ret > 0)
		*fdp = fd;	/* settled, then committed as in place (v_commit) */
	else
		close(fd);
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

	fs_lock();
	snprintf(buf, len, "%s", in->name ? in->name : "(unlinked file)");
	fs_unlock();
	return buf;
}

/*
 * tfile_ops.version_commit: v_commit, durably where the file has a live
 * clone record (fs_journal_clone: its fsync returned once the record was
 * durable), which is then retired: the record may go only once the
 * version that holds its change is in the backing directory for good.  A
 * file removed meanwhile (its version adopted nameless, or dropped) has
 * its removal made durable first (syncfs: the directory it left is not
 * known here), so that no crash brings its name back without the change.
 * A record whose file is removed and never committed again stays live
 * until the next start, whose replay passes over it (as a commit intent
 * of a freed inode does).
 */
static int version_commit(struct tfile *f, int fd, bool inplace, bool durable)
{
	struct fs_inode *in = in_of(f);
	bool cloned = __atomic_load_n(&in->clone_seq, __ATOMIC_ACQUIRE) != 0, gone;
	int ret = v_commit(f, fd, inplace, durable || cloned);

	if (!cloned || (ret && ret != -ENOENT))
		return ret;
	fs_lock();
	gone = in->unlinked;
	fs_unlock();
	if (gone ? syncfs(fs.root_fd) == 0 : !ret)
		fs_journal_clone_done(in);
	return ret;
}

const struct tfile_ops fs_tfile_ops = {
	.version_open	= v_open,
	.version_commit	= version_commit,
	.sync_meta	= v_sync_meta,
	.version_small	= v_small,
	.data_fd	= v_data_fd,
	.release_data_fd = v_release_data_fd,
	.get		= v_get,
	.put		= v_put,
	.name		= v_name,
	.journal_delta	= fs_journal_delta,
	.journal_sync	= fs_journal_sync,
	.journal_apply	= fs_journal_apply,
	.journal_retire	= fs_journal_retire,
	.journal_settle	= fs_journal_settle,
	.journal_clone	= fs_journal_clone,
};
