/*
 * fs_hints.h - the restore-hint side of the xattr protocol.
 */
#ifndef TIERFS_FS_HINTS_H
#define TIERFS_FS_HINTS_H

#include "fs.h"

/* Set a user.tierfs.* attribute for user uid (the caller; the kernel has
 * checked its write access to in).  Returns 0 or -errno. */
int fs_hints_set(struct fs_inode *in, const char *name, const char *value,
		 size_t size, int flags, uid_t uid);
/* Read a user.tierfs.* attribute not handled elsewhere: length or -errno. */
int fs_hints_get(struct fs_inode *in, const char *name, char *buf, size_t len);

/* Remove a user.tierfs.* attribute (restore_order: drop the entries). */
int fs_hints_remove(struct fs_inode *in, const char *name);

#endif
