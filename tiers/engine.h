/*
 * engine.h - the flush/prefetch engine: the caches, the threads that move
 * bytes between tiers and the SSD, and the restore queue.
 *
 * The fs side embeds a struct tfile (tfile.h) in each regular file's inode
 * and gives the engine a struct tfile_ops that creates and commits
 * versions of the backing file.  The engine owns the caches, the flush
 * queues, the flusher and prefetcher threads and the restore queue.  Its
 * rooms are listed in engine_int.h, with its condition variables (one per
 * event: what broadcasts each, and every wait on it with its predicate);
 * its locks in lockorder.h.
 */
#ifndef TIERFS_ENGINE_H
#define TIERFS_ENGINE_H

#include <stdarg.h>
#include <time.h>

#include "tier.h"
#include "tfile.h"
#include "log.h"
#include <sys/types.h>

#include "clock.h"

struct engine;

#define ENGINE_MAX_GPUS	8		/* GPUs one cache spans (gpu.h's GPU_MAX_DEVICES) */

/* The largest file whose background flush waits flush_age_ms after its
 * close: one rewritten or removed by then is never written at all. */
#define FLUSH_AGED_MAX	(256u << 10)

struct engine_config {
	uint64_t host_cache;		/* bytes */
	const struct evict_policy *policy;
	int flush_threads;		/* host -> SSD flushers */
	unsigned flush_fds;		/* descriptors of versions that the
					 * flushers together may hold open at
					 * once beyond one each (groups of small
					 * files, flush_batch), 0: no bound but
					 * FLUSH_BATCH_FILES a flusher */
	unsigned queue_depth;		/* io_uring depth per flusher */
	unsigned flush_age_ms;		/* a closed file of at most
					 * FLUSH_AGED_MAX bytes is flushed this
					 * long after its close (0: at once) */
	uint64_t chunk;			/* bytes per I/O */
	bool hugepages;			/* madvise the host buffer */
	int gpu_dev;			/* GPU for the GPU tier, -1: none */
	int gpu_more[ENGINE_MAX_GPUS - 1];	/* further GPUs the one GPU cache
						 * spans (-o gpu=0:1), after gpu_dev */
	unsigned gpu_nmore;		/* how many */
	bool gpu_all;			/* every GPU of the machine (-o gpu=all) */
	uint64_t gpu_cache;		/* its size per GPU, 0: default */
	int balance;			/* enum balance_policy: where a copy goes
					 * that does not fit in its GPU's part of a
					 * cache over several GPUs (-o balance) */
	bool gpu_share;			/* chunks exportable (-o gpu_share) */
	bool later;			/* the caller calls engine_start_background() */
	bool dedup;			/* the backing directory shares extents:
					 * flush changed files incrementally */
	bool shares_extents;		/* it can (with -o dedup=off too): a copy
					 * between its files costs no data */
	uint32_t dedup_block;		/* its file system's block size */
	uint64_t dedup_chunk;		/* chunk of content de-duplication */
	uint64_t dedup_index;		/* memory of its index, bytes */
	unsigned journal_pct;		/* a flush whose changed bytes are at most
					 * this share (percent) of the file is
					 * made durable as a journal record and
					 * applied in place (tfile_ops.journal_*);
					 * 0: never.  Not with dedup */
	bool ordered_log;		/* the backing file system's log commits
					 * every metadata change in order, after
					 * a cache flush (backing_log_ordered):
					 * a version's data is written and
					 * waited for before its rename, and the
					 * rename's commit makes both durable */
	dev_t ordered_dev;		/* that file system's st_dev */
	uint64_t hint_max;		/* restore-queue entries of the mount
					 * (-o hint_max), 0: ENGINE_HINT_MAX */
	uint64_t hint_max_user;		/* of one uid (-o hint_max_user),
					 * 0: ENGINE_HINT_MAX_USER */
};

/*
 * Bounds on the restore queue, which any user who may write a directory
 * appends to.  An entry costs about 100 bytes plus its name (at most 255):
 * a user's 100,000 at most about 35 MB, the mount's million at most about
 * 350 MB, typically a third of that.  A checkpoint of 100,000 files still
 * fits one user's budget.
 */
#define ENGINE_HINT_MAX		1000000u
#define ENGINE_HINT_MAX_USER	100000u

/* Create the engine: the host cache buffer and the flusher threads. */
int engine_create(struct engine **out, const struct engine_config *cfg);
/* Start faulting the host cache in and building the GPU tier, in the
 * background (engine_create does unless cfg->later). */
void engine_start_background(struct engine *e);
/* Flush every dirty file, stop the threads, free the caches. */
void engine_destroy(struct engine *e);

/* Does this engine have a GPU tier? */
bool engine_has_gpu(struct engine *e);
/*
 * The same, but while a GPU tier asked for is still being built (the first
 * seconds after mounting: CUDA start-up, one context per GPU), wait for the
 * outcome, at most max_s seconds.  Never waits when no GPU tier was asked
 * for or one exists.
 */
bool engine_wait_gpu(struct engine *e, double max_s);
/* Is the GPU tier a cache over several GPUs, GPU dev among them? */
bool engine_gpu_spans(struct engine *e, int dev);
/* The GPU tier, NULL while there is none (yet). */
struct gpu_tier;
struct gpu_tier *engine_gpu_tier(struct engine *e);

/* ---- restore hints (the restore queue and the prefetcher) ------------ */

/*
 * Append n names of directory `dir` (an fs-defined key) to the restore
 * queue, in order, on behalf of `uid`.  files[i] is the file if it exists
 * (the queue takes over a reference the caller got with ops->get), else
 * NULL: it is bound later by engine_hint_bind().  The entries count
 * against the mount's bound (cfg.hint_max) and, if user_bound, against
 * uid's (cfg.hint_max_user) until they are consumed or dropped.  Returns
 * 0, -EDQUOT when they would pass a bound, or -ENOMEM; on error nothing
 * is appended and the caller keeps its references.
 */
int engine_hint_append(struct engine *e, uint64_t dir, uid_t uid, bool user_bound,
		       const char *const *names, struct tfile *const *files, size_t n);
/* A file named `name` in `dir` came into being: bind pending entries.
 * O(entries of that name, and of the names sharing its hash bucket). */
void engine_hint_bind(struct engine *e, uint64_t dir, const char *name,
		      struct tfile *f);
/* The remaining entries of `dir`, "name\n" each; length or -ERANGE.
 * O(entries of dir). */
int engine_hint_list(struct engine *e, uint64_t dir, char *buf, size_t len);
/*
 * A page of that list: the entries of `dir` from the index-th (0: its
 * first), as many whole "name\n" lines as fit in len bytes; length (0 past
 * the end).  A page holds at least one line when len > 256.  O(index) the
 * first time, O(page) for the page after the one before (no entry freed
 * meanwhile).
 */
int engine_hint_list_page(struct engine *e, uint64_t dir, uint64_t index, char *buf,
			  size_t len);
/* Drop the entries of `dir` (cleared, or the directory went); they leave
 * their users' budgets, and a file left without entries loses what was kept
 * for them: its prefetched copies may be evicted at once. */
void engine_hint_drop_dir(struct engine *e, uint64_t dir);
/* Prefetching on (start) or held (stop). */
void engine_prefetch_set(struct engine *e, bool on);
bool engine_prefetch_get(struct engine *e);

/*
 * Drop f's cached copies that hold nothing the slower tiers lack (as the
 * eviction policy would): 0 when none is left, -EBUSY when one stays
 * (being written, not flushed yet, or in use: wait for the flush and ask
 * again).  Never waits.
 */
int engine_evict_file(struct engine *e, struct tfile *f);

/*
 * Flush now what waits for its age (-o flush_age): f's flush, or with f
 * NULL every file's.  Never waits: the file's state, or the statistics'
 * flush backlog, tell when it is done.
 */
void engine_flush_now(struct engine *e, struct tfile *f);

/*
 * The journal's ring cannot take its other file: a record there is still
 * live (jnl_ring_blocker).  The live records that stay longest are a
 * written-through file's (its fsyncs' records, retired when its shadow
 * is committed, eng_shadow_record): the shadow that waits for its age
 * with a record as old as seq, the one the ring waits for, is committed
 * now instead; its records retired, the ring turns, and its files stop
 * growing.  Never waits.
 */
void engine_journal_held(struct engine *e, uint64_t seq);

/*
 * Settle a new version fd before it is linked under a name that a synced
 * record will name (a hard-linked file's commit intent): where the backing
 * log is ordered and fd is on that file system, its writes completed (the
 * sync of the directory that then holds its name commits the log, its
 * allocation with it, after a flush of the disk's cache); elsewhere an
 * fsync.  The caller syncs that directory either way: the record's own
 * sync does not (the journal written over, jnl_ring, commits nothing).
 * 0 or -errno.
 */
int engine_settle_named(struct engine *e, int fd);

/* Statistics as JSON into buf; returns length or -ERANGE. */
int engine_stats_json(struct engine *e, char *buf, size_t len);
/* The same, as members of the object that j has open (user.tierfs.stats
 * adds the persistent tier's after them). */
struct json;
void engine_stats_put(struct engine *e, struct json *j);
uint64_t engine_host_cache_size(struct engine *e);

/*
 * open(2)/openat(2) of a backing file (or a new version of one) by tierfs
 * itself: with O_NOATIME, so that its own reads (flushes, fetches,
 * prefetches, the copies into new versions and DIR, hashing) never move
 * the access time a user sees, which tierfs keeps itself (the mount's
 * atime option, fs_file.c); without it where the kernel refuses it (EPERM:
 * a file the daemon neither owns nor has CAP_FOWNER over).  O_CLOEXEC is
 * added.  Returns the descriptor, or -1 with errno set.
 */
int backing_open(int dirfd, const char *path, int flags, mode_t mode);

/*
 * Does the file system of directory dirfd keep one ordered log of its
 * metadata changes, each commit of which starts with a flush of the disk's
 * cache, so that a metadata change made after a write completed is never
 * durable without the data?  XFS; ext4 with its journal, without fast
 * commits (which log the inodes an fsync names) and without
 * journal_async_commit (whose commit block is flushed together with the
 * data).  True, or false with the reason in why.  Reads the superblock of
 * an ext4 file system's device (root).
 */
bool backing_log_ordered(int dirfd, char *why, size_t wl);

#endif /* TIERFS_ENGINE_H */
