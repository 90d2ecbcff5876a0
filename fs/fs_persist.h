/*
 * fs_persist.h - the persistent tier (-o persist=DIR, tierfs(8)): marked
 * files drain after their SSD flush to DIR, a directory on a file system
 * that all nodes share; a mount whose backing directory lacks what DIR
 * has shows it and fetches it.  See fs_persist.c.
 */
#ifndef TIERFS_FS_PERSIST_H
#define TIERFS_FS_PERSIST_H

#include <dirent.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct fs_inode;

#define TIERFS_XATTR_PERSIST	"user.tierfs.persist"

/* The persist options (fs.opts, read by fs_main.c) taken, DIR checked.
 * After the main options (backing and mount point known).  0, or -errno
 * with the one line to say in msg (the mount must not go on). */
int fs_persist_setup(char *msg, size_t len);
/* The persister thread: start after the engine; stop after the last
 * flush (waits at most -o persist_wait, logs what was not persisted).
 * fs_persist_stop returns how many operations did not reach DIR (left in
 * the journal for the next mount, or copies given up); 0 without DIR. */
void fs_persist_start(void);
unsigned fs_persist_stop(void);
/* DIR, or NULL without -o persist. */
const char *fs_persist_dir(void);

/* The rest of the mount reaches the tier through two tables that
 * fs_persist_setup() sets where there is a DIR (fs.h): fs.ns_ops, which
 * the namespace (fs_ns.c) and the version commits tell of their changes in
 * their order, and fs.inode_ops, which the inode table asks (a lookup's
 * miss, an inode freed, listings merged).  Their functions are the tier's
 * own (persist_int.h). */

struct fs_pfile {
	char *name;
	uint64_t size;
	struct timespec mtime;
};

/* Write text as set dir's record in DIR once each of files[0..n) is in
 * DIR's directory of dir as a regular file of its size and modification
 * time (temporary name, fsync, rename, the directory synced); then, with
 * -o persist_keep, sets are counted in DIR's parent of it.  0, -ESTALE (a
 * file is not there as named), -ETIMEDOUT (DIR did not answer), -errno. */
int fs_persist_record_put(struct fs_inode *dir, const char *text, size_t len,
			  const struct fs_pfile *files, size_t n);
/* DIR's record of set dir: *text (malloc'ed, NUL-terminated) and the
 * regular files of DIR's directory of dir (*files, sorted by name; free
 * with fs_persist_files_free).  0; -ENODATA: no record there (or DIR did
 * not answer, or is off). */
int fs_persist_record_get(struct fs_inode *dir, char **text, struct fs_pfile **files,
			  size_t *n);
void fs_persist_files_free(struct fs_pfile *files, size_t n);

/* user.tierfs.persist (get/set/remove) and the additions to tier, state
 * and stats. */
bool fs_persist_xattr(const char *name);
int fs_persist_getx(struct fs_inode *in, char *buf, size_t len);
int fs_persist_setx(struct fs_inode *in, const char *value, size_t size);
int fs_persist_removex(struct fs_inode *in);
void fs_persist_describe(struct fs_inode *in, char *tier, size_t tl, char *state, size_t sl);
/* The "persist":{...} member of user.tierfs.stats, written by j into the
 * object it has open; nothing without DIR. */
struct json;
void fs_persist_stats_put(struct json *j);

#endif /* TIERFS_FS_PERSIST_H */
