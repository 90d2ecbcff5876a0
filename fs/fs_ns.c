/*
 * fs_ns.c - the namespace of the backing directory: every name that a
 * request makes, links, removes or renames there goes through here, with
 * the inode table kept in step (fs_inode.c), and is told to the
 * namespace's reader.
 *
 * The handlers (fs_ops.c, fs_file.c) check their arguments, call one of
 * these and reply.  The reader is the persistent tier (-o persist=DIR),
 * the room above (fs_persist.c sets fs.ns_ops before the mount serves
 * anything; NULL without DIR): it hears of each change in the namespace's
 * order (under fs.nslock, which -o persist makes every change take:
 * fs_names_lock) and journals it before the backing directory changes, so
 * that a kill between the two leaves the next daemon the operation to
 * resume (fs_persist.c).  Version commits, the other namespace change, are
 * told by fs_version.c and fs_journal.c, through the same table.
 *
 * Locks (fs.h): a directory's names lock keeps the name's object steady
 * from its look-up to the bookkeeping of its change, so the syscalls run
 * without fs.lock: they need a journal handle of the backing file system,
 * which can wait for a commit, and fs.lock is every lookup's, open's and
 * release's.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs.h"
#include "../common/fault.h"

/* ---- names made --------------------------------------------------------- */

/*
 * With -o persist, a regular file's name is told to the reader before it
 * exists (name_begin, under fs.nslock across the syscall): its copy is in
 * the journal first, as removals and renames are, so that a kill right
 * after the syscall still leaves the next daemon a copy to make.  *held:
 * the reader counts that intent until fs_ns_made() hands it over or ends it.
 */
static bool made_begin(struct fs_inode *p, const char *name, struct fs_inode *in)
{
	if (!fs.ns_ops)
		return false;
	fs_ns_lock();
	return fs.ns_ops->name_begin(p, name, in);
}

int fs_ns_make(struct fs_inode *p, const char *name, enum fs_new kind, mode_t mode,
	       dev_t rdev, const char *link, bool *held)
{
	bool reg = kind == FS_NEW_NODE && S_ISREG(mode);
	int pfd = fs_fd_hold(p), r = -1, err = 0;

	*held = false;
	if (pfd < 0) {
		fs_fd_release(p);
		return pfd;
	}
	if (reg)
		*held = made_begin(p, name, NULL);
	for (int tries = 0; tries < 2; tries++) {
		r = kind == FS_NEW_DIR ? mkdirat(pfd, name, mode) :
		    kind == FS_NEW_SYMLINK ? symlinkat(link, pfd, name) :
		    mknodat(pfd, name, mode, rdev);
		err = r < 0 ? errno : 0;
		/* full: what removed files free (the closer) */
		if (err != ENOSPC || !fs_fd_frees_wait())
			break;
	}
	if (r == 0)
		tierfs_fault_kill("name_made");
	if (reg && fs.ns_ops)
		fs_ns_unlock();
	fs_fd_release(p);
	if (r < 0 && *held) {
		fs.ns_ops->intent_end();
		*held = false;
	}
	return r < 0 ? -err : 0;
}

int fs_ns_create(struct fs_inode *p, const char *name, int flags, mode_t mode, bool *held)
{
	int pfd = fs_fd_hold(p), fd;

	*held = false;
	if (pfd >= 0)
		*held = made_begin(p, name, NULL);
	else if (fs.ns_ops)
		fs_ns_lock();	/* as made_begin, for one unlock below */
	fd = pfd < 0 ? pfd : fs_fd_openat(pfd, name, (flags & (O_EXCL | O_TRUNC | O_NOFOLLOW)) |
					  O_CREAT | O_RDWR, mode);
	if (fd == -EACCES)
		fd = fs_fd_openat(pfd, name, (flags & (O_EXCL | O_NOFOLLOW)) | O_CREAT | O_RDONLY,
				  mode);
	if (fd >= 0)
		tierfs_fault_kill("name_made");
	if (fs.ns_ops)
		fs_ns_unlock();
	fs_fd_release(p);
	if (fd < 0 && *held) {
		fs.ns_ops->intent_end();
		*held = false;
	}
	return fd;
}

/*
 * A new, empty file is part of the namespace's history from its creation:
 * its first commit copies it to DIR, or its last writer's close if it is
 * still empty then (fs_ns_closed), or, after a kill before either, the next
 * daemon (the journal's record of the creation).  A name that had content
 * already is persisted by its versions' commits.
 */
void fs_ns_made(struct fs_inode *in, struct fs_inode *p, const char *name, bool held)
{
	struct stat st;
	int fd;

	if (!fs.ns_ops)
		return;
	if (!in || !S_ISREG(in->type)) {
		if (held)
			fs.ns_ops->intent_end();
		return;
	}
	fs_ns_lock();		/* its names steady */
	fd = fs_fd_hold(in);
	if (fd >= 0 && fstatat(fd, "", &st, AT_EMPTY_PATH) == 0 && st.st_size == 0 &&
	    st.st_nlink == 1)
		fs.ns_ops->created(in, p, name, held);
	else if (held)
		fs.ns_ops->intent_end();	/* it had content: its commits copy it */
	fs_fd_release(in);
	fs_ns_unlock();
}

void fs_ns_closed(struct fs_inode *in)
{
	if (fs.ns_ops)
		fs.ns_ops->released(in);
}

/*
 * A file that is a live clone record's base gets a second name once the
 * record is retired (fs_journal_link_begin): waited for with no lock held,
 * LINK_BASE_WAIT_S at most (a record whose version keeps failing stays
 * live), after which it is linked anyway and its next version waits in
 * v_commit (fs_version.c) before it is copied over the base.
 */
#define LINK_BASE_WAIT_S	10.0

/* Wait (no lock held) while in's backing inode is a live base; false once
 * LINK_BASE_WAIT_S passed. */
static bool link_wait(struct fs_inode *in)
{
	struct stat st;
	int fd;
	bool ok;

	if (fs_journal_no_bases())
		return true;
	fd = fs_fd_hold(in);
	ok = fd >= 0 && fstat(fd, &st) == 0;
	fs_fd_release(in);
	return !ok || fs_journal_base_wait(st.st_dev, st.st_ino, LINK_BASE_WAIT_S);
}

int fs_ns_link(struct fs_inode *in, struct fs_inode *p, const char *name)
{
	int ret, fd, pfd;
	bool held = false, force = false, linking = false;

again:
	force = force || !link_wait(in);
	/* the syscall without fs.lock; not while a version of in is made
	 * current (v_commit tells a singly linked file by its link count) */
	fs_attrs_lock(in);
	fs_dirs_lock(p, NULL);
	fd = fs_fd_hold(in);
	pfd = fs_fd_hold(p);
	ret = fd < 0 ? fd : pfd < 0 ? pfd : 0;
	/* the new name's copy journalled before the name exists (fs.nslock
	 * is held already: fs_attrs_lock takes it with -o persist) */
	if (!ret && fs.ns_ops)
		held = fs.ns_ops->name_begin(p, name, in);
	if (!ret && !(linking = fs_journal_link_begin(fd, force))) {
		if (held)	/* taken as a base meanwhile: as a failed link */
			fs.ns_ops->intent_end();
		held = false;
		fs_fd_release(p);
		fs_fd_release(in);
		fs_dirs_unlock(p, NULL);
		fs_attrs_unlock(in);
		goto again;
	}
	if (!ret && linkat(fd, "", pfd, name, AT_EMPTY_PATH) < 0)
		ret = -errno;
	if (linking)
		fs_journal_link_end();
	if (!ret) {
		tierfs_fault_kill("name_made");
		fs_lock();
		fs_add_name(in, p, name);
		fs_unlock();
		if (S_ISREG(in->type))	/* its versions now copied in place */
			tfile_set_linked(&in->tf, true);
		if (fs.ns_ops)
			fs.ns_ops->linked(in, p, name);
	}
	if (held)
		fs.ns_ops->intent_end();	/* after the copy is queued */
	fs_fd_release(p);
	fs_fd_release(in);
	fs_dirs_unlock(p, NULL);
	fs_attrs_unlock(in);
	return ret;
}

/* ---- names removed and renamed ------------------------------------------ */

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

	fs_move_name(in, parent, name, NULL, NULL);
	if (fd >= 0 && fs_journal_fstat(fd, &st, 0) == 0 && st.st_nlink == 0) {
		in->unlinked = true;
		fs_drop_aliases(in);
		if (S_ISREG(in->type))
			tfile_unlinked(&in->tf);
		/* its restore queue goes with it (and leaves its users'
		 * budgets): a directory made later may get its inode number */
		if (S_ISDIR(in->type))
			engine_hint_drop_dir(fs.eng, fs_dir_key(in));
		if (in->nopen) {
			fs_fd_pin(in);
		} else {
			fs_fd_gone(in);	/* closed at the caller's release */
			if (S_ISREG(in->type))
				tfile_orphaned(&in->tf);	/* its cache room now */
		}
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
	in = fs_table_find(st.st_dev, st.st_ino);
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

/* See fs.h. */
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

/* unlink and rmdir; tell: the reader hears of it (DIR changes too). */
static int remove_core(struct fs_inode *p, const char *name, int flags, bool tell)
{
	const struct fs_ns_ops *ops = tell ? fs.ns_ops : NULL;
	struct fs_inode *in;
	struct pop *pop = NULL;
	int ret = 0, pfd, fd;

	fs_names_lock(p, NULL);
	pfd = fs_fd_hold(p);
	fs_lock();
	in = find_child(pfd, name, &fd);
	fs_unlock();
	if (pfd < 0)
		ret = pfd;
	else if (ops && (flags & AT_REMOVEDIR) && (ret = ops->may_rmdir(p, name)))
		;	/* DIR has entries in it that the mount shows */
	else {
		if (ops)
			pop = ops->remove_begin(p, name, flags & AT_REMOVEDIR);
		if (unlinkat(pfd, name, flags) < 0)
			ret = -errno;
		/* a set's own hidden files (fs_sets.c) go with it */
		if (ret == -ENOTEMPTY && (flags & AT_REMOVEDIR) && fs_rmdir_set_record(pfd, name))
			ret = unlinkat(pfd, name, flags) < 0 ? -errno : 0;
	}
	if (!ret && in) {
		fs_lock();
		name_removed(in, fd, p, name);
		fs_unlock();
	}
	if (ops)
		ops->end(pop, !ret);
	fs_names_unlock(p, NULL);
	fs_fd_release(p);
	put_child(in);
	return ret;
}

int fs_ns_remove(struct fs_inode *p, const char *name, int flags)
{
	return remove_core(p, name, flags, true);
}

int fs_remove_local(struct fs_inode *p, const char *name, int flags)
{
	return remove_core(p, name, flags, false);
}

/* What a rename held: the directories' and the objects' descriptors, and
 * the objects' references. */
static void rename_release(struct fs_inode *p, struct fs_inode *np, struct fs_inode *src,
			   struct fs_inode *dst)
{
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
}

/* The inode table after a rename made: src went from p/name to np/nn (and
 * dst the other way with RENAME_EXCHANGE; otherwise dst lost its name).
 * fs.lock held. */
static void renamed(struct fs_inode *p, const char *name, struct fs_inode *np, const char *nn,
		    unsigned flags, struct fs_inode *src, struct fs_inode *dst, int dfd)
{
	if (flags & RENAME_EXCHANGE) {
		if (src)
			fs_move_name(src, p, name, np, nn);
		if (dst)
			fs_move_name(dst, np, nn, p, name);
		return;
	}
	if (dst)
		name_removed(dst, dfd, np, nn);
	if (src && S_ISREG(src->type) && !fs_move_name(src, p, name, np, nn))
		fs_set_name(src, np, nn);
}

int fs_ns_rename(struct fs_inode *p, const char *name, struct fs_inode *np, const char *nn,
		 unsigned flags)
{
	struct fs_inode *src, *dst;
	struct pop *pop = NULL;
	int ret = 0, pfd, npfd, sfd, dfd;
	bool ns = false;

again:
	if (ns)
		fs_ns_lock();
	fs_names_lock(p, np);
	pfd = fs_fd_hold(p);
	npfd = fs_fd_hold(np);
	fs_lock();
	src = find_child(pfd, name, &sfd);
	dst = find_child(npfd, nn, &dfd);
	fs_unlock();
	/*
	 * A directory that moves changes the path of everything below it:
	 * with fs.nslock, which a hard-linked file's commit holds while its
	 * commit intent names that path (v_commit).  Every directory above a
	 * file with a known name is in the table (its parent references).
	 * With -o persist, fs_names_lock took it already.
	 */
	if (!ns && !fs_persist_on() && ((src && S_ISDIR(src->type)) ||
			((flags & RENAME_EXCHANGE) && dst && S_ISDIR(dst->type)))) {
		fs_names_unlock(p, np);
		rename_release(p, np, src, dst);
		ns = true;
		goto again;
	}
	if (pfd < 0 || npfd < 0)
		ret = pfd < 0 ? pfd : npfd;
	else {
		if (fs.ns_ops && (!src || src != dst))	/* two names of one file: a no-op */
			pop = fs.ns_ops->rename_begin(p, name, np, nn, flags);
		if (renameat2(pfd, name, npfd, nn, flags) < 0)
			ret = -errno;
	}
	if (!ret && src != dst) {	/* two names of one file: nothing changed */
		fs_lock();
		renamed(p, name, np, nn, flags, src, dst, dfd);
		fs_unlock();
	}
	if (fs.ns_ops)
		fs.ns_ops->end(pop, !ret);
	fs_names_unlock(p, np);
	if (ns)
		fs_ns_unlock();
	rename_release(p, np, src, dst);
	return ret;
}
