/*
 * lockorder.h - the locks of tierfs and the one order in which they nest.
 *
 * A thread holding a lock may take only locks of a higher rank.  Two locks
 * of one rank are never held together.  This is what the code does today
 * (the fs entries included, since fs code calls into tiers/ and tiers/
 * calls back into fs code through struct tfile_ops):
 *
 * rank lock            guards                                  held while calling
 *  1   tfile.lock      the order of operations on one file     ops->version_commit (eng_commit_shadow:
 *      (tiers/)        (writes, truncate, fsync, close)        writer_done, truncate, fsync, and a
 *                                                              flusher's shadow_due, which only
 *                                                              tries it: ranked_trylock),
 *                                                              ops->version_open, ops->data_fd
 *  2   file ilock      a regular file's version commits and    -
 *      (fs/fs.h)       the changes of its mode, owner, times
 *                      and xattrs (fs_attrs_lock)
 *  3   fs.nslock       namespace changes with -o persist;      -
 *      (fs/fs.h)       commits of hard-linked files and
 *                      renames of directories
 *  4   dir ilock       one directory's names (fs_dirs_lock;    -
 *      (fs/fs.h)       rename takes two, in address order)
 *  5   fs.lock         the inode table, names, reference       tfile_destroy() (inode_free),
 *      (fs/fs.h)       counts                                  tfile_unlinked() (name_removed)
 *  6   engine.lock     every cache table, copy and the         ops->get (an atomic increment)
 *      (tiers/)        tfile fields marked "eng->lock"
 *  7   fdc.lock        the descriptor cache (fs/fs_fd.c):      nothing (innermost)
 *      (fs/fs_fd.c)    never held with engine.lock
 *  8   ino.lock        the block of inode numbers reserved     nothing (a leaf; taken under
 *      (fs/fs_inode.c) on the backing root (fs_ino_number)     a file ilock, fs.nslock)
 *  9   sets.lock       the watch list of committed sets        nothing (a leaf)
 *      (fs/fs_sets.c)
 * 10   pg.lock         the pool of requests to the persistent  nothing (a leaf; taken under
 *      (persist_pool.c)  tier's DIR, its hung state            fs.nslock, directory ilocks)
 * 11   pq.lock         the persister's queue and journal, its  nothing (a leaf; taken under
 *      (persist_queue.c) statistics, the inodes' pstate        tfile.lock, ilocks, fs.nslock,
 *                                                              fs.lock: an inode freed)
 * 12   ipc_cache.lock  the cached IPC mappings of clients'     nothing (a leaf; taken with
 *      (fs/fs_ioctl.c) GPU buffers                             no lock held)
 * 13   share.lock      -o gpu_share's connections and their    nothing of fs/ or tiers/
 *      (fs/fs_share.c) spans                                   (taken with no lock held)
 * 14   gpu_state.lock  gpu_init()'s one start-up               nothing but the log
 *      (gpu/gpu_common.c)
 * 15   a copy lane     one direction's stream (gpu/gpu_copy.c; gpu_ctx_enter_dev (devctx_lock)
 *      lock            one lane at a time)
 * 16   hash_state.lock the hashing module and its buffers      gpu_ctx_enter
 *      (gpu/gpu_hash.c)
 * 17   devctx_lock     other devices' primary contexts         nothing (a leaf)
 *      (gpu/gpu_common.c)
 * 18   a vmm's lock    a GPU cache mapper's done / err         nothing (a leaf)
 *      (gpu/gpu_vmm.c)
 * 19   jnl.lock        the journal's end, sequence numbers     nothing (a leaf; taken under
 *      (store/journal.c) and syncs (never held across one)     an ilock, engine.lock never)
 * 20   closer.lock     removed files' descriptors queued for   nothing (a leaf; taken after
 *      (fs/fs_fd.c)    the closer thread                       fdc.lock is dropped)
 * 21   settle.lock     the settler's queue of hard-linked      nothing (a leaf; taken under
 *      (fs/fs_intent.c) files whose intents wait for a sync    a file ilock)
 * 22   links_mu        a link(2) of a file against its taking   bases.lock (fs_journal_keep's
 *      (fs/fs_journal.c) as a clone record's base                count, the base's names)
 * 23   bases.lock      the backing inodes that clone records'   nothing (a leaf; taken under
 *      (fs/fs_journal.c) bases link under hidden names          a file ilock, in stats)
 * 24   log_mu          the line state of -o logfile's stream   nothing (the last: a message
 *      (fs/fs_start.c)                                         is written under any lock)
 *
 * So tfile.lock -> file ilock -> fs.nslock -> dir ilock -> fs.lock ->
 * engine.lock, and fs.nslock -> fs.lock -> fdc.lock.  Two files' ilocks
 * are never held together; two directories' only by fs_dirs_lock.  Consequences:
 *  - tiers/ never calls a tfile_ops function that may take fs.lock
 *    (version_open, version_commit, version_small, data_fd, put, name) with
 *    engine.lock held; references go through eng_defer_put() and are dropped by a
 *    flusher with no lock held.
 *  - the fs side never takes a tfile.lock itself and never calls a tfile_*
 *    function that takes one (write, read, truncate, fsync, close_writer,
 *    span_begin, read_dev, write_dev) while holding an ilock, fs.nslock,
 *    fs.lock or fdc.lock.
 *  - engine threads (flushers, cascade, prefetcher) never take a
 *    tfile.lock.
 *  - gpu/'s locks come after every lock of fs/ and tiers/: gpu/ calls no
 *    room above it, and tiers/ may call it with any of its locks held.
 * Every mutex of the daemon is in the table and taken through
 * ranked_lock() / ranked_unlock() (or a wrapper made of them); this header
 * is in common/ so that gpu/ can use it too (libtierfs, which is built
 * from some of gpu/'s files, checks the order of those locks in the
 * application's threads).
 *
 * Debug builds (NDEBUG not defined) check the order: lock_rank_take()
 * asserts that the thread holds no lock of the same or a higher rank.
 */
#ifndef TIERFS_LOCKORDER_H
#define TIERFS_LOCKORDER_H

#include <pthread.h>
#include <stdbool.h>

enum lock_rank {
	LR_TFILE = 1,		/* tfile.lock */
	LR_FS_FILE,		/* a regular file's ilock */
	LR_FS_NS,		/* fs.nslock */
	LR_FS_DIR,		/* directories' ilocks */
	LR_FS,			/* fs.lock */
	LR_ENGINE,		/* engine.lock */
	LR_FS_FD,		/* fdc.lock */
	LR_FS_INO,		/* fs_inode.c's ino.lock: a leaf */
	LR_SETS,		/* fs_sets.c's sets.lock: a leaf */
	LR_PERSIST_POOL,	/* persist_pool.c's pg.lock: a leaf */
	LR_PERSIST,		/* persist_queue.c's pq.lock: a leaf */
	LR_IPC,			/* fs_ioctl.c's ipc_cache.lock: a leaf */
	LR_SHARE,		/* fs_share.c's share.lock */
	LR_GPU_INIT,		/* gpu_common.c's gpu_state.lock */
	LR_GPU_LANE,		/* gpu_copy.c's lanes */
	LR_GPU_HASH,		/* gpu_hash.c's hash_state.lock */
	LR_GPU_CTX,		/* gpu_common.c's devctx_lock: a leaf */
	LR_GPU_VMM,		/* gpu_vmm.c's vmm lock: a leaf */
	LR_JOURNAL,		/* store/journal.c's jnl.lock: a leaf */
	LR_FS_CLOSER,		/* fs_fd.c's closer.lock: a leaf */
	LR_FS_SETTLE,		/* fs_intent.c's settle.lock: a leaf */
	LR_FS_LINKS,		/* fs_journal.c's links_mu */
	LR_FS_BASES,		/* fs_journal.c's bases.lock: a leaf */
	LR_LOG,			/* fs_start.c's log_mu: the last */
};

#ifndef NDEBUG
/* The thread is about to take a lock of rank r / has released it /
 * took it by a try (ranked_trylock: no order to check). */
void lock_rank_take(enum lock_rank r);
void lock_rank_drop(enum lock_rank r);
void lock_rank_tried(enum lock_rank r);
#else
static inline void lock_rank_take(enum lock_rank r) { (void)r; }
static inline void lock_rank_drop(enum lock_rank r) { (void)r; }
static inline void lock_rank_tried(enum lock_rank r) { (void)r; }
#endif

/* Take / release mutex m of rank r through the check: what every lock's
 * own pair of calls (fs_lock, eng_lock, pq_lock, ...) is made of. */
static inline void ranked_lock(pthread_mutex_t *m, enum lock_rank r)
{
	lock_rank_take(r);
	pthread_mutex_lock(m);
}

/*
 * Take m of rank r only if it is free, whatever the thread holds: a try
 * never waits, so it cannot close a cycle, and is outside the order (a
 * flusher holding engine.lock tries a tfile.lock, flush.c's shadow_due).
 * true: taken (ranked_unlock releases it); the locks taken after it are
 * checked against it as usual.
 */
static inline bool ranked_trylock(pthread_mutex_t *m, enum lock_rank r)
{
	if (pthread_mutex_trylock(m))
		return false;
	lock_rank_tried(r);
	return true;
}

static inline void ranked_unlock(pthread_mutex_t *m, enum lock_rank r)
{
	pthread_mutex_unlock(m);
	lock_rank_drop(r);
}

#endif /* TIERFS_LOCKORDER_H */
