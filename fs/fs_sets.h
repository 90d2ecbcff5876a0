/*
 * fs_sets.h - checkpoint sets: a directory committed as one checkpoint,
 * its state per level (cache, ssd, pfs), retention of the N newest
 * complete sets of a directory on the SSD.  See fs_sets.c.
 */
#ifndef TIERFS_FS_SETS_H
#define TIERFS_FS_SETS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct fs_inode;

/* -o keep_sets=N (read by fs_main.c): sets kept per directory, 0: all. */
void fs_sets_setup(unsigned keep);
/* The watcher thread: start after the engine and the persister; stop
 * before the last flush (sets not followed then are judged when asked). */
void fs_sets_start(void);
void fs_sets_stop(void);

/* user.tierfs.commit, user.tierfs.set, user.tierfs.keep: is name one? */
bool fs_sets_xattr(const char *name);
/* Read one of them (length or -errno), set one (0 or -errno), remove
 * user.tierfs.keep (0 or -errno). */
int fs_sets_getx(struct fs_inode *in, const char *name, char *buf, size_t len);
int fs_sets_setx(struct fs_inode *in, const char *name, const char *value, size_t size);
int fs_sets_removex(struct fs_inode *in, const char *name);

#endif /* TIERFS_FS_SETS_H */
