/*
 * fs.h - the FUSE side of tierfs: inodes, the backing directory, options.
 *
 * Each inode the kernel knows is a struct fs_inode, its FUSE ino the
 * pointer (the st_ino the mount shows is another number: fs_inode.c).
 * It keeps the file handle of its backing object and, while
 * fs_fd.c caches one (a bounded set, see there), an O_PATH fd on it;
 * regular files also embed their tiering state (struct tfile).  Inodes are
 * found by the backing (st_dev, st_ino); a flush that replaces a backing
 * file rekeys its inode.
 *
 * Locks: fs.lock protects the inode table, every inode's names, and
 * reference counts; fs_fd.c's fdc.lock the descriptors.  fs.nslock,
 * taken before fs.lock, serialises namespace changes in the backing
 * directory (rename, unlink, rmdir, link, version commits); the syscalls
 * that change the backing directory run with nslock only (journal
 * operations that can wait for a commit), so lookups, creates, opens and
 * releases never wait for those.  Without -o persist nslock is taken only
 * by a version commit whose file has several links (its commit intent
 * names a path) and by renames of directories (which change paths):
 * every inode's ilock does the rest, a regular file's
 * ordering the commits of its versions with the changes of its
 * attributes (fs_attrs_lock), a directory's keeping its names steady
 * (fs_dirs_lock).  The order of all locks is the table of
 * tiers/lockorder.h: tfile.lock -> file ilock -> fs.nslock -> directory
 * ilocks -> fs.lock -> engine.lock, and fs.nslock -> fs.lock -> fdc.lock
 * (fdc.lock never with engine.lock).
 * version_commit runs with tfile.lock held and engine.lock not held; the
 * fs side calls tfile_destroy() and tfile_unlinked() (engine.lock) under
 * fs.lock, and never calls a tfile_* function that takes tfile.lock while
 * it holds an ilock, fs.nslock, fs.lock or fdc.lock.  fs_lock()/fs_ns_lock() (and
 * fs_fd.c's fdc_lock()) take them through the debug-build rank check.
 */
#ifndef TIERFS_FS_H
#define TIERFS_FS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <errno.h>
#include <limits.h>
#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "../common/fault.h"
#include "../tiers/engine.h"
#include "../common/lockorder.h"

#define FS_HIDDEN_PREFIX ".tierfs"	/* backing-dir names tierfs keeps to itself */
/* A regular file's inode number, on its backing file (fs_inode.c); and the
 * next block of numbers, on the backing root.  user.tierfs.*: never listed,
 * read, set or removed through the mount (fs_xattr.c). */
#define FS_XATTR_INO		"user.tierfs.ino"
#define FS_XATTR_INO_NEXT	"user.tierfs.ino_next"

struct fs_inode {
	struct tfile tf;		/* tiering state (regular files) */
	struct fs_inode *hnext;		/* hash chain */
	dev_t dev;			/* backing st_dev */
	ino_t ino;			/* backing st_ino (key) */
	mode_t type;			/* S_IFMT bits */
	struct file_handle *fh;		/* handle of the backing object, NULL:
					 * none (fd is then never closed) */
	int fd;				/* O_PATH fd on the backing object, -1
					 * while not cached (fs_fd_hold) */
	int fd_users;			/* holders of fd (fs_fd_hold) */
	bool fd_pinned;			/* removed but in use: fd kept */
	bool fd_gone;			/* removed, fds closed: never reopened
					 * (set under fs.lock too) */
	bool lru_in;			/* on the descriptor LRU */
	struct fs_inode *lru_prev, *lru_next;	/* descriptor LRU links */
	struct stat *gone_st;		/* attributes when it went (fd_gone) */
	uint64_t nlookup;		/* kernel references */
	int refs;			/* internal references */
	int nopen;			/* open handles */
	struct fs_inode *parent;	/* directory of `name` (referenced) */
	char *name;			/* a name of it, NULL if unknown */
	struct fs_alias *aliases;	/* its other known names (hard links) */
	bool unlinked;			/* its last name is gone */
	int data_fd;			/* read fd on the current version, -1 */
	int data_users;			/* borrowers of data_fd */
	struct oldfd *old_fds;		/* read fds of replaced versions that
					 * still have borrowers */
	struct oldfd *old_paths;	/* O_PATH fds of replaced versions: a
					 * holder may still use one; closed when
					 * fd_users drops to 0 */
	/* the persistent tier (fs_persist.c, under pq.lock: persist_queue.c) */
	unsigned char pstate;		/* PS_*: its copy in DIR */
	int perr;			/* last failure copying it (-errno) */
	int pq_n;			/* its copies queued or running */
	bool pcreated;			/* made empty through the mount, not
					 * persisted yet: a counted intent */
	uint64_t privs;			/* atomic: bit 0: seen without set-ID
					 * bits and security.capability; the
					 * rest counts changes (fs_kill_privs) */
	uint64_t renames;		/* atomic: versions renamed over it */
	uint64_t renames_synced;	/* atomic: of those, how many are
					 * durable (their directory synced) */
	uint64_t attrs;			/* atomic: changes of its mode, owner,
					 * times or xattrs (fs_attrs_changed) */
	uint64_t attrs_synced;		/* atomic: of those, how many are
					 * durable (its backing file synced) */
	int read_since_atime;		/* atomic: a read came since the access
					 * time was last considered (fs_file.c) */
	uint64_t number;		/* atomic: st_ino through the mount, 0:
					 * not known yet (fs_ino_number) */
	uint64_t redo_seq;		/* a commit intent of it whose copy in
					 * place failed (the journal keeps it
					 * live until a later one of the file is
					 * done), 0: none; under ilock
					 * (fs_version.c), read atomically */
	char *redo_version;		/* that intent's version (its name in
					 * the backing root), under ilock */
	bool redo_copied;		/* redo_seq's copy is in the file, not
					 * synced: the settler retires it
					 * (fs_version.c); else the copy failed.
					 * Under ilock, read atomically */
	bool settle_queued;		/* on the settler's list (settle.lock) */
	uint64_t clone_seq;		/* its live clone record (a new version
					 * made durable as a delta over a base,
					 * fs_journal_clone), 0: none; under
					 * ilock, read atomically */
	char clone_base[64];		/* that record's base (its link's name
					 * in the backing root), under ilock */
	dev_t clone_dev;		/* the base's backing inode (the */
	ino_t clone_ino;		/* journal's link of it), under ilock */
	uint64_t jretired;		/* atomic: the seq of the retirement of
					 * its last journal record retired, not
					 * synced perhaps (UINT64_MAX: one could
					 * not be appended, the record stays);
					 * made durable before the file is
					 * written in place outside the journal
					 * (fs_journal_retired_durable) */
	pthread_mutex_t ilock;		/* a regular file's: a new version
					 * made current and a change of its
					 * attributes, one at a time
					 * (fs_attrs_lock); a directory's: its
					 * names (fs_dirs_lock) */
};

/* Another known name of a hard-linked regular file (fs.lock). */
struct fs_alias {
	struct fs_alias *next;
	struct fs_inode *parent;	/* referenced */
	char name[];
};

enum { FS_RELATIME, FS_NOATIME, FS_STRICTATIME };

/* Preferred I/O size reported in st_blksize, = max_write. */
#define FS_IO_SIZE	(1 << 20)

struct fs_opts {
	char *backing;			/* BACKING_DIR (absolute) */
	char *mountpoint;
	uint64_t host_cache;		/* bytes; 0 = default */
	char *evict;			/* policy name */
	char *gpu;			/* "none" or a device number */
	char *balance;			/* -o balance: host, greedy, maxflow */
	uint64_t gpu_cache;		/* bytes; 0 = default */
	char *log;			/* level name */
	int foreground;
	int debug;
	int writeback;			/* kernel writeback cache */
	int direct_writes;		/* write-only opens skip the page cache */
	int direct_reads;		/* so do all others, where mmap allows */
	int atime;			/* FS_RELATIME (default), FS_NOATIME, ... */
	int readahead_kb;		/* kernel readahead of the mount */
	int poll_us;			/* a worker polls for requests this long */
	int max_fds;			/* descriptor budget, 0: default */
	int allow_other;
	int default_permissions;
	int flush_threads;
	int flush_age_ms;		/* -o flush_age: background flush delay
					 * of small files */
	int journal_pct;		/* -o journal_pct: a change of at most
					 * this share of a file is journalled */
	int queue_depth;
	int hint_max;			/* -o hint_max: restore-queue entries
					 * of the mount, -1: not given */
	int hint_max_user;		/* -o hint_max_user: of one uid */
	int gpu_share;			/* clients may map the GPU cache */
	char *dedup;			/* auto (default), on, off */
	int version_sync;		/* fdatasync every version before its
					 * rename, whatever the file system */
	int show_help, show_version;
	/* the persistent tier's (fs_persist.c) and the sets' (fs_sets.c) */
	char *persist;			/* -o persist=DIR, as given; NULL: none */
	int persist_all;		/* -o persist_all */
	double persist_wait;		/* seconds; -1: not given */
	uint64_t persist_bw;		/* bytes per second; 0: no cap */
	double persist_timeout;		/* seconds; 0: not given */
	int persist_keep;		/* files (sets) kept in DIR; 0: all */
	int keep_sets;			/* sets kept on the SSD; 0: all */
};

#define FS_LOST_NAMES	16		/* names kept of the files given up */

struct fs_inode_ops;
struct fs_ns_ops;

struct jnl;

struct fs {
	struct fs_opts opts;
	bool persist;			/* -o persist=DIR (fs_persist.c): every
					 * namespace change under fs.nslock */
	const struct fs_inode_ops *inode_ops;	/* the persistent tier's, for
					 * the inode table; NULL: none */
	const struct fs_ns_ops *ns_ops;	/* the namespace's reader (the
					 * persistent tier); NULL: none */
	int root_fd;			/* O_PATH fd of BACKING_DIR */
	struct jnl *journal;		/* its one journal (fs_journal.c),
					 * NULL: none this mount; the persistent
					 * tier appends its notes to it */
	uint64_t jretired_gone;		/* atomic: the highest jretired of the
					 * inodes dropped from the table (whose
					 * backing files may come back as new
					 * inodes): fs_journal_retired_durable */
	int tmp_fd;			/* O_PATH fd of BACKING_DIR/.tierfs.tmp,
					 * where new versions are linked before
					 * their rename; -1: the root is used */
	struct fs_inode root;		/* FUSE_ROOT_ID */
	pthread_mutex_t lock;		/* see file comment */
	pthread_mutex_t nslock;		/* backing namespace changes (taken
					 * before lock; see v_commit) */
	struct fs_inode **htab;		/* inode table */
	size_t hsize, count;
	struct engine *eng;
	struct fuse_session *se;
	bool dio_mmap;			/* kernel mmaps FOPEN_DIRECT_IO files */
	bool killpriv_v2;		/* we clear set-ID bits (fs_kill_privs) */
	struct fs_closing *closing;	/* writable handles closed, not yet
					 * released (fs_file.c), under fs.lock */
	unsigned nclosing, closing_cap;
	/* files given up at exit (fs_sync_all), written by one thread */
	unsigned lost;			/* how many */
	char *lost_names[FS_LOST_NAMES];	/* the first ones' paths */
};

extern struct fs fs;

/* fs.lock and fs.nslock, through the lock-order check (lockorder.h). */
static inline void fs_lock(void)
{
	ranked_lock(&fs.lock, LR_FS);
}

static inline void fs_unlock(void)
{
	ranked_unlock(&fs.lock, LR_FS);
}

static inline void fs_ns_lock(void)
{
	ranked_lock(&fs.nslock, LR_FS_NS);
}

static inline void fs_ns_unlock(void)
{
	ranked_unlock(&fs.nslock, LR_FS_NS);
}

/* Is there a persistent tier (-o persist=DIR, set before the mount serves
 * anything)? */
static inline bool fs_persist_on(void)
{
	return fs.persist;
}

/*
 * fs_locks.c: the inodes' ilocks, taken through the lock-order check.
 *
 * A regular file's ilock (and fs.nslock with -o persist): held while a new
 * version of it is made current (v_commit, v_small; the commit copies the
 * mode, owner, times and xattrs onto it) and while those attributes change
 * in the backing object (setattr, xattrs, the set-ID bits' clearing,
 * atime).  A change of one file's attributes so waits only for a commit of
 * that file.  For other types it takes fs.nslock with -o persist only.
 */
void fs_attrs_lock(struct fs_inode *in);
void fs_attrs_unlock(struct fs_inode *in);
/*
 * The names of directories a and b (b NULL or a directory; in address
 * order): held from the look-up of a name in them to the bookkeeping of
 * its change (unlink, rmdir, rename, link, a version renamed over its
 * name), so that the name keeps naming the object looked up and the
 * inode table follows the backing directory.  Namespace changes in
 * different directories run at once; only -o persist orders them all
 * under fs.nslock, which fs_names_lock() takes first in that case.
 */
void fs_dirs_lock(struct fs_inode *a, struct fs_inode *b);
void fs_dirs_unlock(struct fs_inode *a, struct fs_inode *b);
void fs_names_lock(struct fs_inode *a, struct fs_inode *b);
void fs_names_unlock(struct fs_inode *a, struct fs_inode *b);
extern const struct fuse_lowlevel_ops fs_ll_ops;
extern const struct tfile_ops fs_tfile_ops;

/* fs_inode.c: the inode table, names, lookups (fs.lock: see the top) */
struct fs_inode *fs_inode_of(fuse_ino_t ino);
fuse_ino_t fs_ino_of(struct fs_inode *in);
void fs_inode_get(struct fs_inode *in);	/* +1 ref, fs.lock not held */
void fs_inode_put(struct fs_inode *in);
void fs_maybe_free(struct fs_inode *in);	/* fs.lock held: free it if unused */
/* .tierfs*: reserved in every directory, never shown through the mount */
bool fs_hidden_name(const char *name);
int fs_check_new_name(const char *name);	/* -EPERM for a reserved one */
/* The key that names directory `dir` in the restore queue. */
uint64_t fs_dir_key(const struct fs_inode *dir);
/* in's path relative to the mount point ("." for the root) into buf, from
 * the backing directory's own path (/proc/self/fd): 0, -ENOENT where it is
 * not known (a file without a name, a removed directory), -ENAMETOOLONG.
 * Takes fs.lock and holds in's (or its directory's) descriptor: not to be
 * called with fs.lock held. */
int fs_rel_path(struct fs_inode *in, char *buf, size_t len);
/* The inode table, keyed by backing (st_dev, st_ino); fs.lock held. */
struct fs_inode *fs_table_find(dev_t dev, ino_t ino);
void fs_table_insert(struct fs_inode *in);
void fs_table_remove(struct fs_inode *in);
/* A regular file's names (fs.lock held): its name, its aliases. */
void fs_set_name(struct fs_inode *in, struct fs_inode *parent, const char *name);
void fs_drop_aliases(struct fs_inode *in);
void fs_add_name(struct fs_inode *in, struct fs_inode *parent, const char *name);
bool fs_move_name(struct fs_inode *in, struct fs_inode *parent, const char *name,
		  struct fs_inode *np, const char *nn);
/* stat of in as the mount shows it (size and mtime from the engine,
 * st_ino from fs_ino_number); no lock held. */
int fs_stat_inode(struct fs_inode *in, struct stat *st);
/*
 * Inode numbers (see fs_inode.c's top).  fs_ino_start() reads the next
 * block of numbers at start-up.  fs_ino_number(): in's st_ino, st its
 * backing object's stat; a regular file's may be given its number now (its
 * ilock taken: none of in's, no directory ilock, no fs.lock held).
 * fs_dirent_ino(): d_ino of entry `name` (backing d_ino, d_type) of dir,
 * whose open fd is dfd; the same number as a stat of it gives.
 */
void fs_ino_start(void);
uint64_t fs_ino_number(struct fs_inode *in, const struct stat *st);
uint64_t fs_dirent_ino(struct fs_inode *dir, int dfd, const char *name, uint64_t d_ino,
		       unsigned char d_type);
/* Look parent/name up, making its inode known (+1 kernel reference).
 * no names lock held. */
int fs_lookup(struct fs_inode *parent, const char *name, struct fuse_entry_param *e);
void fs_forget_one(fuse_ino_t ino, uint64_t n);
/* chown a new backing object to the request's caller. */
void fs_own_new(struct fs_inode *parent, const char *name, fuse_req_t req);
/* The file `name` in dir, referenced, or NULL if there is none yet;
 * -EINVAL if it is not a regular file. */
int fs_child_tfile(struct fs_inode *dir, const char *name, struct tfile **out);
/*
 * What the inode table asks of the persistent tier, the room above it
 * (fs_persist.c sets fs.inode_ops when it has a DIR, before the mount
 * serves anything), as tiers/ calls up through struct tfile_ops:
 *  - fetch: a lookup found no dir/name in the backing directory: bring it
 *    from DIR.  0: it is there now; -ENOENT: DIR has none either, or it
 *    was removed through the mount.  No names lock held.
 *  - forget: regular file in is being freed (fs.lock held).
 */
struct fs_psnap;
struct fs_inode_ops {
	int (*fetch)(struct fs_inode *dir, const char *name);
	void (*forget)(struct fs_inode *in);
	/* a listing of in (dp: its open stream) merged with DIR's entries
	 * that the backing directory lacks, served by readdir with offsets of
	 * its own; NULL: none, list the backing directory as usual */
	struct fs_psnap *(*snapshot)(struct fs_inode *in, DIR *dp);
	size_t (*readdir)(void *req, struct fs_psnap *s, char *buf, size_t size, off_t off);
	void (*snap_free)(struct fs_psnap *s);
};

/*
 * fs_ns.c: the namespace of the backing directory.  Every name a request
 * makes, links, removes or renames is made there and told to the
 * namespace's reader, the persistent tier (fs_persist.c sets fs.ns_ops
 * when it has a DIR, before the mount serves anything), in the
 * namespace's order: each call below is made with fs.nslock held.
 *  - name_begin: dir/name is about to be made by create, mknod (in NULL)
 *    or link (in the file linked); true: the reader counts an intent
 *    until created() takes it over or intent_end() ends it;
 *  - created: in was made empty as dir/name (held: name_begin's intent);
 *    released: its last writer closed it (no nslock needed);
 *  - linked: dir/name is a new name of in;
 *  - remove_begin, rename_begin: before the backing directory changes
 *    (NULL: nothing for the reader); end: after it (done: it was made);
 *  - may_rmdir: 0, or -ENOTEMPTY while DIR has entries in dir/name that
 *    the backing directory lacks;
 *  - intent: a new version of in is about to replace (or be copied over)
 *    its backing file (counted: a commit intent that intent_end ends);
 *    committed: it did (fs_version.c, fs_journal.c).
 */
struct pop;
struct fs_ns_ops {
	bool (*name_begin)(struct fs_inode *dir, const char *name, struct fs_inode *in);
	void (*created)(struct fs_inode *in, struct fs_inode *dir, const char *name, bool held);
	void (*released)(struct fs_inode *in);
	void (*linked)(struct fs_inode *in, struct fs_inode *dir, const char *name);
	struct pop *(*remove_begin)(struct fs_inode *dir, const char *name, bool isdir);
	struct pop *(*rename_begin)(struct fs_inode *p, const char *name, struct fs_inode *np,
				    const char *nn, unsigned flags);
	void (*end)(struct pop *op, bool done);
	int (*may_rmdir)(struct fs_inode *dir, const char *name);
	void (*intent)(struct fs_inode *in, bool counted);
	void (*intent_end)(void);
	void (*committed)(struct fs_inode *in);
};

/* What a request makes (fs_ns_make). */
enum fs_new { FS_NEW_NODE, FS_NEW_DIR, FS_NEW_SYMLINK };

/* mknod, mkdir or symlink of p/name (link: the symlink's target): 0 or
 * -errno.  *held: for fs_ns_made, which the caller calls once it has the
 * new object's inode (a regular file), or NULL (failed), when *held or
 * the object is a regular file. */
int fs_ns_make(struct fs_inode *p, const char *name, enum fs_new kind, mode_t mode,
	       dev_t rdev, const char *link, bool *held);
/* create(2) of p/name with open flags and mode: the new file's descriptor
 * (read-write, or read-only where the mode refuses writing), or -errno;
 * *held as fs_ns_make's. */
int fs_ns_create(struct fs_inode *p, const char *name, int flags, mode_t mode, bool *held);
/* p/name was made as in (NULL: it could not be looked up). */
void fs_ns_made(struct fs_inode *in, struct fs_inode *p, const char *name, bool held);
/* A writable handle of regular file in was released. */
void fs_ns_closed(struct fs_inode *in);
/* link(2), unlink(2) (flags 0) or rmdir(2) (AT_REMOVEDIR), rename(2) with
 * renameat2 flags: 0 or -errno. */
int fs_ns_link(struct fs_inode *in, struct fs_inode *p, const char *name);
int fs_ns_remove(struct fs_inode *p, const char *name, int flags);
int fs_ns_rename(struct fs_inode *p, const char *name, struct fs_inode *np, const char *nn,
		 unsigned flags);
/* unlink or rmdir of p/name as fs_ns_remove, but in the backing directory
 * only: DIR (-o persist) keeps its copy (retention of sets, fs_sets.c).  No
 * names lock held.  0 or -errno; the caller invalidates the kernel's
 * entry. */
int fs_remove_local(struct fs_inode *p, const char *name, int flags);

/*
 * Checkpoint sets (fs_sets.c owns the record's format): a set's commit
 * record is the hidden file FS_SET_RECORD of its directory; in DIR
 * (-o persist) it is the commit point, written only once every file it
 * names is there.
 */
#define FS_SET_RECORD	FS_HIDDEN_PREFIX ".set"
/* The record while it is rewritten (fs_sets.c). */
#define FS_SET_RECORD_TMP	FS_HIDDEN_PREFIX ".set.new"
/* fs_ns.c: rmdir of dfd/name failed as not empty: if a set's record (and
 * its rewrite) is all that is left in it, remove them.  true: removed, try
 * the rmdir again.  For the backing directory and DIR (persist_drain.c). */
bool fs_rmdir_set_record(int dfd, const char *name);

/* A version commit told to the reader (fs_version.c, fs_journal.c). */
static inline void fs_ns_intent(struct fs_inode *in, bool counted)
{
	if (fs.ns_ops)
		fs.ns_ops->intent(in, counted);
}

static inline void fs_ns_intent_end(void)
{
	if (fs.ns_ops)
		fs.ns_ops->intent_end();
}

static inline void fs_ns_committed(struct fs_inode *in)
{
	if (fs.ns_ops)
		fs.ns_ops->committed(in);
}
/* Flush every dirty file (unmount, SIGTERM); returns how many could not be
 * written.  give_up: log each of those with its size and drop its cached
 * data, so that the engine can stop (unmount always ends), and count it in
 * fs.lost (its path, relative to the mount, in fs.lost_names while there
 * is room). */
int fs_sync_all(bool give_up);

/* fs_loop.c: serve requests until unmount or a signal; the I/O of the
 * session (set with fuse_session_custom_io before the loop). */
int fs_run_loop(void);
#define FS_FLUSH_AGE_DEFAULT_MS	1000	/* -o flush_age default */
#define FS_JOURNAL_PCT_DEFAULT	25	/* -o journal_pct default (bench/RESULTS.md 16) */
#define FS_POLL_US_DEFAULT	200	/* -o poll_us default... */
#define FS_POLL_MIN_CPUS	8	/* ...on machines with this many CPUs */
extern const struct fuse_custom_io fs_io;

/* fs_fd.c: fd's path relative to the backing root into rel, or -errno. */
int fs_fd_rel_path(int fd, char *rel, size_t len);
/* fs_fd.c: remove the entries of directory dir_fd whose names start with
 * prefix and that keep (may be NULL) does not keep.  0, or -errno when the
 * directory cannot be read. */
int fs_sweep_names(int dir_fd, const char *prefix, bool (*keep)(int dfd, const char *name));
/*
 * fs_journal.c: the backing directory's journal.  fs_journal_replay applies
 * what journal BACKING/.tierfs.journal of root_fd holds (start-up, tierfs
 * --recover): small changes and commit intents, in order, then what the
 * redo journal of earlier releases left: 0, or -errno with why in msg
 * (records kept).  fs_journal_start
 * replays it and opens it for the mount's records; fs_journal_end closes it,
 * removed when every record is in its file.  The tfile_ops of the journal
 * flush (tfile.h).  fs_journal_stats_put adds the "journal" member to the
 * statistics object j has open (user.tierfs.stats).
 */
int fs_journal_replay(int root_fd, char *msg, size_t len);
int fs_journal_start(void);
void fs_journal_end(void);
struct json;
void fs_journal_stats_put(struct json *j);
int fs_journal_delta(struct tfile *f, const void *base, const struct drange *r,
		     const bool *zero, uint32_t n, uint64_t size, uint64_t *seq, bool sync);
int fs_journal_sync(struct tfile *f, uint64_t seq);
int fs_journal_apply(struct tfile *f, const void *base, const struct drange *r, const bool *zero,
		     uint32_t n, uint64_t size, int *fd);
void fs_journal_retire(struct tfile *f, uint64_t seq);
/* The journal records of the fsyncs of in's shadow (tfile_shadow_records)
 * retired (not synced): a commit intent that copies the shadow over the
 * file is durable.  Its caller holds the tfile's lock. */
void fs_journal_retire_shadow(struct fs_inode *in);
int fs_journal_settle(struct tfile *f, uint64_t seq);
int fs_journal_clone(struct tfile *f, int bfd, const void *data, const struct drange *r,
		     uint32_t n, uint64_t size, uint64_t *seq, bool (*base_ok)(void *),
		     void *arg);
/* fs_journal.c: in's clone record, if any, retired durably and its base's
 * link removed, after a version of in was committed durably (v_commit's
 * caller: fs_version.c).  Takes in's ilock. */
void fs_journal_clone_done(struct fs_inode *in);
/*
 * fs_journal.c: fstatat(fd, "", st, flags | AT_EMPTY_PATH) of a backing
 * object, its st_nlink without the journal's own links of it (a live clone
 * record's base, linked under a hidden name: no name of the file's), of
 * one moment.  0 or -errno.
 */
int fs_journal_fstat(int fd, struct stat *st, int flags);
/*
 * fs_journal.c: is backing inode dev/ino a live clone record's base?  Its
 * replay clones the inode, so until the record is retired nothing writes
 * it in place: its changes are new versions renamed over its name
 * (v_commit, ident_of refuses it a journal record), and a file of several
 * names is never taken as a base.  fs_journal_base_wait: wait (max_s at
 * most) until it is none; false where it still is.
 */
bool fs_journal_is_base(dev_t dev, ino_t ino);
/* No live base at all (one atomic load: the callers' look before the
 * fstat that fs_journal_is_base needs). */
bool fs_journal_no_bases(void);
bool fs_journal_base_wait(dev_t dev, ino_t ino, double max_s);
/*
 * fs_journal.c: around a linkat of the file at fd (fs_ns_link): true with
 * the link and the taking of bases excluded until fs_journal_link_end;
 * false where the file is a live base (unless force: linked anyway), and
 * then nothing is held (wait for it with fs_journal_base_wait, no lock
 * held, and try again).
 */
bool fs_journal_link_begin(int fd, bool force);
void fs_journal_link_end(void);
/*
 * fs_journal.c: the commit intent of a new version copied over a file in
 * place (fs_version.c), r (store/journal.h), made durable: 0 with *seq
 * its record's, 1 where the mount has no journal, or -errno (nothing of
 * it counts).
 */
struct jnl_redo;
int fs_journal_intent(const struct jnl_redo *r, uint64_t *seq);
/*
 * fs_journal.c: the file open as fd (synced already) linked under a new
 * hidden name in the backing root (FS_INTENT_PREFIX, tag, the daemon's pid
 * and a count: a name no link of this daemon or an earlier one has), put
 * in name (len bytes), then the root synced: the name durable before a
 * record names it.  0, or -errno with nothing linked (-ENOENT: fd has no
 * name left to link from).
 */
int fs_journal_keep(int fd, const char *tag, char *name, size_t len);
/* fs_journal.c: record seq retired, not synced: the retirement's own
 * seq, 0 when it could not be appended; fs_journal_sync_to(rs) makes the
 * records up to rs durable (0: nothing).  0 or -errno.
 * fs_journal_retire_durably: both (what it describes is in its file and
 * synced; no journal: 0).  0 or -errno. */
uint64_t fs_journal_retire_one(uint64_t seq);
int fs_journal_sync_to(uint64_t rs);
int fs_journal_retire_durably(uint64_t seq);
/*
 * fs_journal.c: every record of in retired durably, before the file is
 * written in place outside the journal (a first version into an empty
 * file, v_small; v_open's fallback): a record whose retirement a crash
 * lost is replayed, and would undo that write (a truncation to 0 emptying
 * the file again).  0, or -errno (the caller writes a new version, or
 * fails).
 */
int fs_journal_retired_durable(struct fs_inode *in);
/* The prefix of the hidden names of intents' versions in BACKING_DIR. */
#define FS_INTENT_PREFIX	FS_HIDDEN_PREFIX ".version."
/* fs_version.c: BACKING_DIR/.tierfs.tmp made empty (start-up), removed (exit). */
void fs_tmp_dir_start(void);
void fs_tmp_dir_end(void);
/*
 * fs_intent.c: the settler, which retires the commit intents of copies
 * made in place once their files are synced (a thread, started after the
 * engine); fs_settle_end settles what is left and stops it, before the
 * journal closes.
 */
void fs_settle_start(void);
void fs_settle_end(void);
/*
 * fs_intent.c: copy version fd over in's backing file ofd (held; old: its
 * stat) under a commit intent; dir/name a name of it (may be NULL).  in's
 * ilock held, and where a name is given its directory's names lock and
 * fs.nslock (v_commit; commit_linked gives none, the handle names the
 * file).  0 or -errno.
 */
int fs_intent_copy(struct fs_inode *in, struct fs_inode *dir, const char *name, int ofd, int fd,
		   const struct stat *old);
/*
 * fs_fd.c: the mtime of directory fd, to put back with fs_dir_mtime_put() after
 * tierfs's own change in it (a new version linked and renamed over a file,
 * the lock file, the probe files): those are no change of the directory
 * as the user sees it (its ctime still moves).  Called under fs.nslock,
 * which every change of the backing namespace by a user takes, or before
 * the mount serves anything.  *ok false: unknown, then left alone.
 */
void fs_dir_mtime_get(int fd, struct timespec *t, bool *ok);
void fs_dir_mtime_put(int fd, const struct timespec *t, bool ok);

/* fs_ops.c: clear what a change of the data takes away (set-ID bits,
 * security.capability) before request ino runs; a change of its mode or
 * xattrs (fs.nslock held) makes the next write look again. */
void fs_kill_privs(fuse_ino_t ino, bool suidgid);
void fs_privs_changed(struct fs_inode *in);
void fs_attrs_changed(struct fs_inode *in);

/* fs_file.c: the content handlers of fs_ll_ops */
void fs_ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		  struct fuse_file_info *fi);
void fs_ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		struct fuse_file_info *fi);
void fs_ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		 struct fuse_file_info *fi);
void fs_ll_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);
void fs_ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t length,
		     struct fuse_file_info *fi);
void fs_ll_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		 struct fuse_file_info *fi);

/* In a polling loop: let the other hardware thread of the core run. */
static inline void fs_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* *at = the larger of *at and v, atomically (a count that only grows:
 * how many changes are durable, a journal seq reached). */
static inline void fs_atomic_max(uint64_t *at, uint64_t v)
{
	uint64_t cur = __atomic_load_n(at, __ATOMIC_ACQUIRE);

	while (cur < v && !__atomic_compare_exchange_n(at, &cur, v, false, __ATOMIC_ACQ_REL,
						       __ATOMIC_ACQUIRE))
		;
}

/* The /proc/self/fd path of descriptor fd into buf[len], for the calls
 * that take a path and no descriptor (the xattr calls on an O_PATH fd):
 * 0, or -ENAMETOOLONG (buf too small). */
static inline int fs_proc_path(int fd, char *buf, size_t len)
{
	return snprintf(buf, len, "/proc/self/fd/%d", fd) >= (int)len ? -ENAMETOOLONG : 0;
}

/*
 * fs_fd.c: the descriptor budget (max_fds).
 *
 * fs_fd_hold() returns in's O_PATH fd (reopened from its handle if it was
 * closed), or -errno; either way it must be paired with fs_fd_release().
 * Meanwhile the fd is neither closed nor replaced by a new version.
 */
int fs_fd_hold(struct fs_inode *in);
void fs_fd_release(struct fs_inode *in);
/* Default budget when RLIMIT_NOFILE allows it. */
#define FS_MAX_FDS_DEFAULT	4096
/* Raise RLIMIT_NOFILE to its hard limit, set the budget (max_fds <= 0:
 * default), find out whether handles can be reopened.  After fs.root_fd. */
int fs_fd_setup(int max_fds);
void fs_fd_stats(unsigned *open, unsigned *max, unsigned *peak);
/* The budget (max_fds as fs_fd_setup settled it). */
unsigned fs_fd_budget(void);
/* A new inode's backing fd (its handle is taken here). */
void fs_fd_attach(struct fs_inode *in, int fd);
/* A fresh fd on in's backing object: cached if in has none, else closed. */
void fs_fd_offer(struct fs_inode *in, int fd);
/* Is fd (of type mode) in's backing object?  A number seen again may
 * belong to a new object once in's fd is closed.  fs.lock held. */
bool fs_fd_same(struct fs_inode *in, int fd, mode_t mode);
/* inode_free: close everything, forget the handle. */
void fs_fd_detach(struct fs_inode *in);
/* Removed files: keep the fds while in use (pin) or close them at the
 * last use and never reopen (gone; fs.lock held, so that an open can tell:
 * fd_gone); gone_stat: its attributes then. */
void fs_fd_pin(struct fs_inode *in);
void fs_fd_gone(struct fs_inode *in);
bool fs_fd_gone_stat(struct fs_inode *in, struct stat *st);
/* A new version fd becomes in's fd; old[0] (the replaced fd) and old[1] (an
 * unborrowed read fd of the old version) are for the caller to close. */
int fs_fd_replace(struct fs_inode *in, int fd, int old[2]);
/* The borrowed read fd of in's current version (engine data_fd). */
int fs_data_fd_get(struct fs_inode *in);
void fs_data_fd_put(struct fs_inode *in, int fd);
void fs_data_fd_drop(struct fs_inode *in);	/* close it if not borrowed */
/* An open directory's fd, counted in the budget; -errno on failure. */
int fs_fd_opendir(struct fs_inode *in);
void fs_fd_closedir(void);
/* openat, retried once after closing cached fds on EMFILE/ENFILE, or after
 * the closer's frees on ENOSPC (O_CLOEXEC added).  Returns the fd or
 * -errno. */
int fs_fd_openat(int dirfd, const char *name, int flags, mode_t mode);
/* fsync the directory of O_PATH descriptor pfd: 0 or -errno. */
int fs_fd_sync_dir(int pfd);
/* err is EMFILE/ENFILE (either sign): close unused cached fds; true if
 * any were closed (worth a retry). */
bool fs_fd_reclaim(int err);
/*
 * Wait until the descriptors of removed files queued for the closer so far
 * are closed (their blocks freed): true if there were any, so that an
 * operation that failed with ENOSPC is worth another try.  No lock held.
 */
bool fs_fd_frees_wait(void);
/*
 * Start the closer thread: after the fork into the background, before the
 * first request (a thread started at a removal would wait for the host
 * cache's pages being populated meanwhile: both need the address space).
 */
void fs_fd_start(void);

/*
 * fi->fh of a regular file's handle: FS_FH_FLAGS | the handle's number
 * << 32 | its open flags, set by open/create.  FUSE ioctl requests carry
 * fh but not the open flags, and fs_ioctl.c checks the access mode as
 * write()/read() would; the number tells a handle's close (FLUSH) and its
 * release apart from other handles' (fs_closes_pending).
 */
#define FS_FH_FLAGS		(1ULL << 63)
/* fs_file.c: writable handles whose close(2) the daemon has seen (FLUSH)
 * in the last FS_CLOSE_GRACE seconds and whose release it has not
 * finished: the kernel sends a release after close(2) has returned, and
 * the new version a written-through file's last close makes due is queued
 * only then.  Mount-wide waits for the flush backlog wait for these first
 * (the statistics' "closes_pending").  Past the grace a handle is not
 * counted: one whose descriptor was duplicated stays open after one of
 * them is closed.  fs.lock held. */
#define FS_CLOSE_GRACE		5.0
unsigned fs_closes_pending(void);

/* fs_ioctl.c: the GPU zero-copy ioctl (tierfs-gpu(7)) */
void fs_ll_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
		 struct fuse_file_info *fi, unsigned flags, const void *in_buf,
		 size_t in_bufsz, size_t out_bufsz);
/* Close the cached IPC mappings; after the session loop has returned. */
void fs_ioctl_shutdown(void);
/* fs_file.c: the GPU wrote [off, off + n) of ino (its last byte from device
 * address last_src): drop the kernel's cached pages and attributes, tell it a
 * grown size. */
void fs_kernel_written(fuse_ino_t ino, uint64_t last_src, uint64_t off, uint64_t n,
		       uint64_t before);

/* fs_share.c: clients map the GPU cache (-o gpu_share, tierfs_share.h) */
struct tierfs_gpu_share;
struct tierfs_gpu_span;
int fs_share_start(void);
void fs_share_stop(void);
/* The ioctls' work; 0 or -errno. */
int fs_share_info(uid_t uid, struct tierfs_gpu_share *out);
/* what the span ioctl's worker polls for after its reply (fs_share_poll) */
struct share_poll {
	struct conn *c;			/* NULL: nothing */
	uint64_t token;
	uint64_t len;
};
int fs_share_begin(uid_t uid, struct fs_inode *in, struct tierfs_gpu_span *sp,
		   struct share_poll *poll);
struct tierfs_gpu_spanv;
int fs_share_beginv(uid_t uid, struct fs_inode *in, struct tierfs_gpu_spanv *sv,
		    struct share_poll *poll);
void fs_share_poll(struct share_poll *poll);

/* fs_xattr.c */
void fs_ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		    const char *value, size_t size, int flags);
void fs_ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void fs_ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void fs_ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

#endif /* TIERFS_FS_H */
