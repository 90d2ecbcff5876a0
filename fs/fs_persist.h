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

/* Hooks of the namespace, each called with fs.nslock held (it orders
 * them): a new version of in was committed; a name is removed or renamed
 * (begin before the change of the backing directory, end after it). */
void fs_persist_committed(struct fs_inode *in);
/* Before a new version of in replaces (or is copied over) its backing
 * file: the journal says so, should the daemon die before the commit's
 * hook (a restart then copies whatever version is there). */
void fs_persist_intent(struct fs_inode *in, bool counted);
/* the commit of a counted intent is over (after fs_persist_committed) */
void fs_persist_intent_end(void);
/* A name is about to be made in the backing directory by create, mknod
 * or link (in: the file linked, else NULL), fs.nslock held across this
 * and the syscall: its copy is in the journal first, as removals and
 * renames are, so that a kill right after the syscall still leaves the
 * next daemon a copy to make.  true: that intent is counted (the journal
 * is kept) until fs_persist_created() takes it over or
 * fs_persist_intent_end() ends it. */
bool fs_persist_name_begin(struct fs_inode *dir, const char *name, struct fs_inode *in);
/* in was made (empty) as dir/name (held: fs_persist_name_begin's intent,
 * which this takes over or ends): a kill before its first commit must not
 * leave it out of DIR (fs.nslock held); its last writer closed it (copied
 * now if it is still empty: a file made and closed empty has no commit);
 * it is forgotten. */
void fs_persist_created(struct fs_inode *in, struct fs_inode *dir, const char *name,
			bool held);
void fs_persist_released(struct fs_inode *in);
/* a new name of in (link) */
void fs_persist_linked(struct fs_inode *in, struct fs_inode *dir, const char *name);
struct pop;
struct pop *fs_persist_remove_begin(struct fs_inode *dir, const char *name, bool isdir);
struct pop *fs_persist_rename_begin(struct fs_inode *p, const char *name, struct fs_inode *np,
				    const char *nn, unsigned flags);
void fs_persist_ns_end(struct pop *op, bool done);	/* done: the change was made */
/* rmdir of dir/name: -ENOTEMPTY while DIR has entries in it that the
 * backing directory lacks.  fs.nslock held. */
int fs_persist_may_rmdir(struct fs_inode *dir, const char *name);

/* Directory listings: DIR's entries that the backing directory (dp, an
 * open stream of in) lacks.  NULL: none (list the backing directory as
 * usual); otherwise the whole merged listing, served by
 * fs_persist_readdir() with offsets of its own. */
struct fs_psnap;
struct fs_psnap *fs_persist_snapshot(struct fs_inode *in, DIR *dp);
size_t fs_persist_readdir(void *req, struct fs_psnap *s, char *buf, size_t size, off_t off);
void fs_persist_snap_free(struct fs_psnap *s);

/*
 * Checkpoint sets in DIR (fs_sets.c owns the record's format): a set's
 * commit record is the hidden file FS_SET_RECORD of its directory; in DIR
 * it is the commit point, written only once every file it names is there.
 */
#define FS_SET_RECORD	FS_HIDDEN_PREFIX ".set"
/* The record while it is rewritten (fs_sets.c). */
#define FS_SET_RECORD_TMP	FS_HIDDEN_PREFIX ".set.new"

/* rmdir of dfd/name failed as not empty: if a set's record (and its
 * rewrite) is all that is left in it, remove them.  true: removed, try
 * the rmdir again.  For the backing directory (fs_ops.c) and DIR. */
bool fs_rmdir_set_record(int dfd, const char *name);

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
