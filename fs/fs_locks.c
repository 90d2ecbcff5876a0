/*
 * fs_locks.c - the inodes' ilocks, the helpers every room takes them with.
 *
 * A regular file's ilock orders the commits of its versions with the
 * changes of its attributes (fs_attrs_lock); a directory's keeps its names
 * steady from a look-up to the bookkeeping of its change (fs_dirs_lock,
 * two at a time in address order); with -o persist both also take
 * fs.nslock, which orders the persistent tier's journal with every
 * namespace change (fs_names_lock takes it before the directories').  See
 * fs.h for who holds what.
 *
 * Calls nothing of the other rooms: every room of fs/ takes these locks,
 * so this file is under them all.  Ranks (tiers/lockorder.h): a file's
 * ilock LR_FS_FILE, fs.nslock LR_FS_NS, directories' LR_FS_DIR.
 */
#include <stdint.h>

#include "fs.h"

void fs_attrs_lock(struct fs_inode *in)
{
	if (S_ISREG(in->type)) {
		lock_rank_take(LR_FS_FILE);
		pthread_mutex_lock(&in->ilock);
	}
	if (fs_persist_on())
		fs_ns_lock();	/* the journal's records in order with renames */
}

void fs_attrs_unlock(struct fs_inode *in)
{
	if (fs_persist_on())
		fs_ns_unlock();
	if (S_ISREG(in->type)) {
		pthread_mutex_unlock(&in->ilock);
		lock_rank_drop(LR_FS_FILE);
	}
}

void fs_dirs_lock(struct fs_inode *a, struct fs_inode *b)
{
	lock_rank_take(LR_FS_DIR);
	if (b == a)
		b = NULL;
	if (b && (uintptr_t)b < (uintptr_t)a) {
		struct fs_inode *t = a;

		a = b;
		b = t;
	}
	pthread_mutex_lock(&a->ilock);
	if (b)
		pthread_mutex_lock(&b->ilock);
}

void fs_dirs_unlock(struct fs_inode *a, struct fs_inode *b)
{
	if (b && b != a)
		pthread_mutex_unlock(&b->ilock);
	pthread_mutex_unlock(&a->ilock);
	lock_rank_drop(LR_FS_DIR);
}

void fs_names_lock(struct fs_inode *a, struct fs_inode *b)
{
	if (fs_persist_on())
		fs_ns_lock();
	fs_dirs_lock(a, b);
}

void fs_names_unlock(struct fs_inode *a, struct fs_inode *b)
{
	fs_dirs_unlock(a, b);
	if (fs_persist_on())
		fs_ns_unlock();
}
