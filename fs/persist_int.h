/*
 * persist_int.h - what the files of the persistent tier (-o persist=DIR)
 * share, and nothing else includes: the queue's and the pool's state,
 * their operations and jobs, their locks, and the calls between the files.
 * fs_persist.h is the interface of the tier to the rest of fs/; fs_persist.c
 * says how the tier works and which file does what.
 *
 * The files call each other one way only (tools/check-calls): persist_path.c
 * calls none of them; persist_pool.c and persist_journal.c call only it;
 * persist_queue.c calls those; persist_names.c, persist_fetch.c and
 * persist_sets.c call the queue and below; persist_drain.c calls the journal,
 * the paths and persist_sets.c; fs_persist.c is on top.  pq and pg keep their
 * short names: the lock-order table (common/lockorder.c) names their locks
 * pq.lock and pg.lock.
 */
#ifndef TIERFS_PERSIST_INT_H
#define TIERFS_PERSIST_INT_H

#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "fs.h"
#include "fs_persist.h"

#define PCHUNK		(1u << 20)	/* copy buffer */
#define PBACKOFF_MIN	0.5		/* seconds before the first retry */
#define PBACKOFF_MAX	8.0
#define PTMP_PREFIX	FS_HIDDEN_PREFIX ".persist."
#define PFETCH_PREFIX	FS_HIDDEN_PREFIX ".new.fetch."	/* removed at start-up */

enum { PS_NONE, PS_PENDING, PS_PERSISTED, PS_FAILED };
enum pkind { P_COPY, P_UNLINK, P_RMDIR, P_RENAME };

struct pwait {
	struct pwait *next;
	bool done;
	int err;
};

struct pop {
	struct pop *next;
	enum pkind kind;
	struct fs_inode *in;		/* P_COPY: referenced; NULL: the file
					 * at path (replayed from the journal) */
	char *path, *path2;		/* relative to DIR; path2: rename target */
	unsigned flags;			/* P_RENAME: renameat2 flags */
	uint64_t bytes;			/* P_COPY: size when queued */
	bool started;
	bool made;			/* replayed removal or rename: the journal
					 * says the backing directory made it */
	bool journaled;			/* in the journal before it was queued */
	bool done;			/* replayed: its done-marker is there; kept
					 * until the copies before it follow it */
	struct pwait *waiters;		/* persist=sync callers */
};

/* The queue, its journal and the statistics (persist_queue.c). */
struct persist_queue {
	char *dir;			/* DIR (absolute), NULL: off */
	int all;			/* persist_all */
	double wait_s;			/* persist_wait */
	uint64_t bw;			/* persist_bw, bytes/s, 0: no cap */
	unsigned keep;			/* persist_keep, 0: keep everything */
	pthread_mutex_t lock;
	pthread_cond_t cond;		/* work queued; stop */
	pthread_cond_t done;		/* an operation ended (waiters) */
	struct pop *head, *tail;
	pthread_t thr;
	bool started, stop, abort, exited;
	bool jon;			/* its records go to the journal (notes) */
	int intents;			/* commits between intent and hook: the
					 * journal is not emptied meanwhile */
	unsigned ns_open;		/* removals and renames begun and not
					 * yet queued or cancelled (ns_begin) */
	bool jerr;			/* a journal write failed (logged) */
	/* statistics */
	uint64_t backlog_files, backlog_bytes;
	uint64_t files, bytes, ops, skipped, errors, retries;
	uint64_t fetched_files, fetched_bytes;
	uint64_t pruned;		/* removed from DIR by persist_keep */
	uint64_t failed;		/* copies given up: a path that cannot
					 * be (too long, a link or a non-directory
					 * on its way in DIR) */
	uint64_t refused;		/* links or non-directories met in DIR */
	char last_refused[256];		/* the path last logged for it */
	double busy_s;			/* time spent copying */
	uint64_t alive;			/* ms: the copy in progress last moved */
	int last_err;			/* the cause last logged, 0: none */
	char last_what[96];
};

extern struct persist_queue pq;

/*
 * DIR in bounded time.  What a request asks of DIR (a lookup that missed
 * locally, a listing, rmdir's emptiness check, the tier and state xattrs)
 * runs in a small pool of threads while the request waits at most
 * -o persist_timeout seconds without progress (a fetch that copies is
 * progress).  A request that gives up marks DIR as not answering: until
 * one of those calls comes back, requests do not ask DIR at all (names
 * that the backing directory lacks are absent, listings are the backing
 * directory's).  A thread stuck in a hung DIR stays stuck; there are at
 * most PG_THREADS.  The pool is persist_pool.c's.
 */
#define PG_THREADS	4

struct pjob {
	struct pjob *next;
	int (*fn)(struct pjob *);
	struct fs_inode *in;		/* referenced, or NULL */
	char name[NAME_MAX + 1];
	char rel[PATH_MAX];
	int fd;				/* a local directory (dup), or -1 */
	struct fs_psnap *snap;		/* out: DIR's extra entries */
	long n;				/* out: their number */
	struct stat st;			/* out: DIR's rel */
	char *text;			/* a set's record (in or out) */
	size_t tlen;
	struct fs_pfile *files;		/* a set's files (in or out) */
	size_t nfiles;
	int ret;
	int refs;			/* the caller's and the pool's */
	bool done, cancel;
	uint64_t alive;			/* ms: last progress (atomic) */
};

struct persist_pool {
	pthread_mutex_t lock;
	pthread_cond_t work, done;
	struct pjob *head, *tail;
	int threads, idle;
	bool hung;			/* a request gave up on DIR */
	double timeout;			/* persist_timeout */
	uint64_t timeouts;		/* requests that gave up */
};

extern struct persist_pool pg;

/* A listing's entries of DIR (persist_fetch.c makes them, the pool frees
 * a job's). */
struct pent {
	char *name;
	unsigned char type;
	ino_t ino;
};

struct fs_psnap {
	size_t n, cap;
	struct pent *e;
};

/* pq.lock and pg.lock, through the lock-order check (lockorder.h). */
static inline void pq_lock(void)
{
	ranked_lock(&pq.lock, LR_PERSIST);
}

static inline void pq_unlock(void)
{
	ranked_unlock(&pq.lock, LR_PERSIST);
}

static inline void pg_lock(void)
{
	ranked_lock(&pg.lock, LR_PERSIST_POOL);
}

static inline void pg_unlock(void)
{
	ranked_unlock(&pg.lock, LR_PERSIST_POOL);
}

/* An operation freed: by the queue (its own, replaced or done) and by the
 * journal's replay (the dropped ones); inline here, so that neither of the
 * two files calls the other. */
static inline void op_free(struct pop *op)
{
	if (op->in)
		fs_inode_put(op->in);
	free(op->path);
	free(op->path2);
	free(op);
}

/* The journal of the queue that releases before the one journal kept
 * apart, in the backing root: read once, for an upgrade (persist_journal.c). */
#define PJOURNAL	FS_HIDDEN_PREFIX ".persist.journal"

/* ------------------------------------------------------------ persist_path.c */

/* a + "/" + b (just b when a is ""), or -ENAMETOOLONG */
int persist_join(char *out, size_t len, const char *a, const char *b);
int persist_rel_of_fd_any(int fd, char *rel, size_t len, bool *gone);
int persist_rel_of(struct fs_inode *in, char *rel, size_t len);
int persist_mark_at(const char *path, bool follow);
bool persist_marked(const char *rel);
bool persist_marked_inode(struct fs_inode *in);
bool persist_covers(const char *path, const char *rel);
/* DIR, open (a descriptor or -errno) */
int persist_open_dir_root(void);
/* mode, owner and times of a directory made by walk_beneath() */
typedef void (*walk_made_fn)(int fd, const char *prefix, void *arg);
int persist_walk_beneath(int root, const char *rel, bool parent, const char **base,
			 walk_made_fn made, void *arg);
int persist_backing_lstat(const char *rel, struct stat *st);
void persist_give_attrs(int fd, const struct stat *st, const char *what);
void persist_made_like_backing(int fd, const char *prefix, void *arg);
void persist_copy_xattrs(int src, int dst);
uint64_t persist_now_ms(void);
/* rel's last component */
const char *persist_base_of(const char *rel);
int persist_copy_data(int src, int wfd, uint64_t size, uint64_t bw, bool *stop,
		      uint64_t *alive);

/* ------------------------------------------------------------ persist_pool.c */

struct pjob *persist_pjob_new(int (*fn)(struct pjob *));
void persist_pjob_put(struct pjob *j);
bool persist_pg_run(struct pjob *j, const char *what);

/* ------------------------------------------------------------ persist_journal.c */

/* Records appended to the journal: pq.lock held, except by persist_jtemp(),
 * which takes it. */
void persist_jempty(void);
void persist_jdone(void);
void persist_jmade(bool made);
void persist_jappend(const struct pop *op);
void persist_jtemp(const char *rel, const char *tmp);
/* Queue what a previous daemon's journal holds (before any request). */
void persist_replay(void);
/* Where the name cur went through the namespace operations from op on:
 * its new name, or NULL if removed or replaced (malloc'ed).  pq.lock held
 * or the queue the caller's alone. */
char *persist_final_name(const struct pop *op, const char *cur);

/* ------------------------------------------------------------ persist_queue.c */

bool persist_whiteout_locked(const char *rel);
void persist_queue_copy(struct fs_inode *in, const char *rel, struct pwait *w);
void persist_path_failed(struct fs_inode *in, const char *name);
void persist_refused(const char *rel, int err);
/* A copy resumed from the journal (by path) found no file there: a copy
 * of the name its file went to through the queued operations after it,
 * queued last.  pq.lock held. */
void persist_follow_copy(const struct pop *op);

/* ------------------------------------------------------------ fs.ns_ops */

/* What the namespace tells the tier (fs.ns_ops, fs.h), each with
 * fs.nslock held (it orders them): a new version of in was committed; a
 * name is removed or renamed (begin before the change of the backing
 * directory, end after it). */
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

/* ------------------------------------------------------------ fs.inode_ops */

/* A lookup's miss brought from DIR (persist_fetch.c); an inode freed
 * (persist_names.c).  fs_persist.c puts them in fs.inode_ops. */
int fs_persist_fetch(struct fs_inode *dir, const char *name);
void fs_persist_forget(struct fs_inode *in);

/* Directory listings: DIR's entries that the backing directory (dp, an
 * open stream of in) lacks.  NULL: none (list the backing directory as
 * usual); otherwise the whole merged listing, served by
 * fs_persist_readdir() with offsets of its own. */
struct fs_psnap;
struct fs_psnap *fs_persist_snapshot(struct fs_inode *in, DIR *dp);
size_t fs_persist_readdir(void *req, struct fs_psnap *s, char *buf, size_t size, off_t off);
void fs_persist_snap_free(struct fs_psnap *s);

#endif /* TIERFS_PERSIST_INT_H */
