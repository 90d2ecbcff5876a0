/*
 * engine_int.h - the engine's private state, shared by its rooms.
 *
 * The engine is split into rooms, one job each; every room's file opens
 * with what it owns, what it may call and which locks it takes:
 *
 *   engine.c    create/destroy, the GPU builder thread, file set-up and
 *               attributes, statistics
 *   place.c     placing a copy in a tier with eviction (eng_alloc_wait,
 *               the cost function), a copy's attachment and release
 *   write.c     the write path: writable copies, truncate, writers'
 *               close, fsync
 *   shadow.c    write-through: a file's shadow (a new version taking its
 *               writes) and the journal records of its fsyncs
 *   read.c      the read paths: read, zero-copy read, device read, spans
 *   flush.c     the SSD flush queue and its flushers, the whole-file
 *               flush, groups of small files
 *   flush_journal.c  the journal flush: a small change in place as a
 *               journal record, its apply, the applies' syncs left to a
 *               flusher's pause (flush_journal.h: what flush.c calls)
 *   cascade.c   the GPU -> host cascade thread (its queue is flush.c's)
 *   dedup_flush.c  the incremental and chunked flushes of -o dedup and
 *               the chunk index's versions (dedup_flush.h: what flush.c,
 *               write.c and engine.c call)
 *   hints.c     the restore queue
 *   prefetch.c  the prefetcher thread
 *   host.c      the host buffer's toucher and pinning
 *   backing.c   byte movers between caches, device memory and backing
 *               files; a flush's writes into its version, and its settling
 *   dedup.c     -o dedup's reflink probe, changed-range sets, chunk index
 *
 * Locks (lockorder.h has the table): e->lock guards everything in struct
 * engine below it and every cache's table, every copy and every tfile field
 * marked "protected by eng->lock".  It is held for bookkeeping only; bytes
 * move with it dropped, under a lease on the copies involved (below).
 *
 * Waits: one condition variable (with e->lock) per event, as Redis's bio.c
 * gives each job its own; a waiter sleeps on the one of the event it needs
 * and is woken by nothing else, so a request's end (a lease's) wakes only
 * who waits for that copy's pins.  Waking every waiter for every lease cost
 * about eight futex calls and as many context switches per 4 KiB write, and
 * most of a metadata workload's (bench/RESULTS.md, 8b).  Each wait below
 * re-checks its predicate in a loop; every change that can make the
 * predicate true broadcasts its condition variable (helper in brackets),
 * under e->lock:
 *
 *   unpinned  a copy's pins, spans or readers fell to 0 (lease_release,
 *             copy_unlease).  Waits: wait_unpinned() (pins == 0: before a
 *             copy is freed, eng_drop_copy, install_copy); drop_slower()
 *             (a slower copy's pins == 0); eng_writable_copy() while no
 *             copy of the file is flushing or filled but one is lent to a
 *             client span or a zero-copy reply (spans == readers == 0).
 *   settled   a transfer of a copy ended [eng_settled]: its flush or GPU ->
 *             host cascade (flushing cleared: flush.c), or a prefetch's
 *             fill (READ_IN_PROGRESS left, to READ_COMPLETE/CONSUMED or
 *             INIT: prefetch.c).  Waits: wait_filled() (no copy of the
 *             file READ_IN_PROGRESS: read.c); start_shadow() (the newest
 *             copy not flushing); eng_writable_copy() while a copy is
 *             flushing or filled (copies_busy).
 *   room      room may be made in a cache [eng_room]: a fragment was freed
 *             (a copy dropped, evicted, or placed and given back), or a copy
 *             may have become evictable (its last lease ended, its flush or
 *             cascade ended, it was consumed, discarded, or its file left
 *             the restore queue), or prefetch distances moved (the queue's
 *             head: what eviction protects).  Waits: eng_alloc_wait()
 *             (cache_place, or the policy's window evictable), at most
 *             20 ms at a time: a copy's estimated wait also shrinks with
 *             time.  The prefetcher, which stops when the caches are full
 *             of what is needed sooner, is woken too (prefetch_work).
 *   flushed   a flush ended (committed, journalled or failed) or a file was
 *             removed [eng_flushed].  Waits: tfile_fsync_data() (the file's
 *             generation durable, an error, or the file gone), at most
 *             100 ms at a time.
 *   gpu_built the GPU builder ended, with a tier or without (gpu_decided),
 *             or the engine stops.  Waits: engine_wait_gpu().
 *   flush_work  work for the SSD flushers [eng_flush_work]: a file joined
 *             the flush queue, the head of the aging queue changed, a
 *             writer waits for room (aged flushes are due at once), a file
 *             reference or a retired version's descriptor waits for them
 *             (e->reap, dd close list), the engine stops.  Waits: the
 *             flushers' idle wait, timed by the next due time (aging,
 *             retries).
 *   cascade_work  a file joined the GPU -> host queue, or the engine stops
 *             [eng_cascade_work].  Waits: the cascade thread's idle wait
 *             (50 ms at most: a failed copy's retry time).
 *   prefetch_work  the restore queue changed (entries appended, bound to
 *             their file, consumed, dropped: eng_hint_head_update),
 *             prefetching was started, room may be made (eng_room, while
 *             the restore queue has entries and prefetching is on), the
 *             engine stops [eng_prefetch_work].  Waits: the prefetcher's
 *             idle wait (50 ms at most: a failed prefetch's file).
 */
#ifndef TIERFS_ENGINE_INT_H
#define TIERFS_ENGINE_INT_H

#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "lockorder.h"
#include "fault.h"
#include "filecopy.h"
#include "log.h"

#define FLUSH_RETRY_S	1		/* seconds between retries of a failed flush */
/*
 * Versions up to this size are flushed with buffered writes: O_DIRECT
 * would write a rounded-up block and truncate it back, which zeroes (and
 * first reads) the partial last block; small files gain nothing from
 * bypassing the page cache.
 */
#define FLUSH_BUFFERED_MAX	(256u << 10)
/* Journal applies left unsynced at most, and how many a flusher that
 * still has work lets wait before it syncs them (flush_journal.c's asettle). */
#define ASETTLE_MAX	64
#define ASETTLE_BATCH	16

struct ssd_ring;

struct engine {
	pthread_mutex_t lock;		/* guards all below; rank LR_ENGINE
					 * (lockorder.h): taken after tfile.lock
					 * and fs.lock, never before them */
	/* one condition variable per event (the table above says which
	 * changes broadcast each and who waits on it) */
	pthread_cond_t unpinned;	/* a copy's pins, spans or readers fell to 0 */
	pthread_cond_t settled;		/* a copy's flush, cascade or fill ended */
	pthread_cond_t room;		/* a cache may have room */
	pthread_cond_t flushed;		/* a flush ended, a file was removed */
	pthread_cond_t gpu_built;	/* the GPU builder ended; stop */
	pthread_cond_t flush_work;	/* for the SSD flushers */
	pthread_cond_t cascade_work;	/* for the GPU -> host cascade */
	pthread_cond_t prefetch_work;	/* for the prefetcher */
	struct engine_config cfg;
	struct cache host;		/* host cache tier */
	void *host_buf;			/* its mmap'ed buffer */
	int ntiers;			/* caches in tiers[] */
	struct cache *tiers[TIER_MAX];	/* fastest first */
	struct tfile *q_head, *q_tail;	/* flush queue */
	struct tfile *aq_head, *aq_tail;	/* aging queue: small files closed
					 * less than cfg.flush_age_ms ago, in
					 * the order of their due times */
	uint64_t aq_len;		/* files on it */
	int room_waiters;		/* eng_alloc_wait()s waiting for room:
					 * aged flushes are due at once */
	pthread_t *flushers;		/* flusher threads */
	int nflushers;
	bool stop;			/* threads must exit */
	int busy;			/* flushes running */
	struct copy *fl_running;	/* the copies those flushes write, linked
					 * by fl_next (their flushed_bytes: the
					 * statistics' flush_done_bytes) */
	double flush_bw;		/* measured bytes/s, for eviction */
	uint64_t tick;			/* access counter (lru) */
	/* statistics */
	uint64_t bytes_flushed, files_flushed, flush_errors;
	uint64_t bytes_written_through, files_written_through;
	uint64_t write_through_records;	/* their fsyncs made journal records */
	uint64_t jheld_shadows;		/* shadows committed before their age
					 * as the journal's ring waited for
					 * their records (engine_journal_held) */
	uint64_t write_through_copy_bytes;
	uint64_t write_through_applies;	/* shadows committed by an apply */
	uint64_t write_through_record_bytes;	/* the bytes those held */
	uint64_t backlog;		/* bytes queued or being flushed */
	struct gpu_tier *gpu;		/* the GPU tier, NULL if none (yet); set once,
					 * atomically (engine_has_gpu reads it
					 * without e->lock) */
	struct cache gpu_slot;		/* tiers[0] until the GPU tier is built */
	pthread_t gbuilder;		/* builds the GPU tier in the background */
	bool gbuilder_started;
	bool gpu_decided;		/* the builder has ended (tier or not) */
	bool pin_started;		/* the host buffer is being / was pinned */
	uint64_t host_pinned;		/* host buffer registered with CUDA;
					 * atomic (the pinning thread sets it
					 * without e->lock) */
	struct tfile *gq_head, *gq_tail;	/* GPU -> host queue */
	pthread_t gflusher;		/* its thread */
	bool gflusher_started;
	uint64_t bytes_to_host;		/* cascaded GPU -> host */
	double to_host_s;		/* time in those copies */
	uint64_t hint_head;		/* restore-queue ticket of the next read */
	struct hint *hq_head, *hq_tail;	/* the restore queue */
	uint64_t hint_next;		/* next ticket */
	uint64_t hq_len, hq_unbound;	/* entries, entries without a file */
	/* indexes of the queue, so that no request walks all of it (hints.c) */
	struct hint_bucket *hq_ub;	/* entries without a file, by (dir, name) */
	size_t hq_ubsize;		/* buckets: a power of two, or 0 */
	struct hint_dir **hq_dirs;	/* entries by directory */
	size_t hq_dsize, hq_ndirs;	/* buckets (a power of two, or 0), dirs */
	uint64_t hq_seed;		/* of both hashes: random per engine,
					 * made by engine_create (eng_hint_init) */
	struct hint_user *hq_users;	/* entries per uid (-o hint_max_user) */
	size_t hq_nusers, hq_usercap;
	uint64_t hq_gen;		/* bumped when an entry is freed: a walk
					 * of the queue that dropped the lock
					 * starts again when it moved */
	bool prefetch_on;		/* start / stop */
	pthread_t prefetcher;
	bool prefetcher_started;
	uint64_t files_prefetched, bytes_prefetched, files_consumed;
	uint64_t files_to_gpu, bytes_to_gpu;	/* prefetches host -> GPU */
	/* a cache over several GPUs: copies placed in their GPU's part, in a
	 * peer's part by the balance schedule, or sent to host memory */
	uint64_t bal_own, bal_peer, bal_peer_bytes, bal_host, bal_host_bytes;
	uint64_t bal_split;		/* of bal_peer, copies across a boundary */
	uint64_t client_writes, client_reads, client_bytes;	/* spans */
	struct tfile **reap;		/* files whose copy went: put() them */
	size_t nreap, reapcap;
	/* journal applies written and not synced yet (flush_journal.c's asettle):
	 * a flusher syncs them together once it has nothing due or
	 * ASETTLE_BATCH wait, then retires their records; each holds a
	 * reference to its file */
	struct asettle {
		struct tfile *f;
		uint64_t seq;		/* the record applied */
		int fd;			/* the backing file written */
	} asettle[ASETTLE_MAX];
	unsigned nasettle;		/* waiting */
	unsigned asettling;		/* being synced (f->jsettling) */
	pthread_t toucher;		/* pre-faults the host buffer */
	bool toucher_started;
	uint64_t touched;		/* host bytes touched so far */
	struct engine_dedup dd;		/* -o dedup: statistics, chunk index,
					 * live versions (dedup.h) */
	/* where the SSD flushes spent their time (flush.c, "ssd":"seconds"):
	 * all of flush_one, of which in FICLONERANGE, in the version's
	 * fsync/fdatasync, and in version_commit (rename, directory fsync) */
	double fl_total_s, fl_clone_s, fl_sync_s, fl_commit_s;
	uint64_t fl_syncs;		/* rounds of those syncs: one version's,
					 * or a group's (flush_batch) */
	unsigned batch_files;		/* files of a flusher's group, 1: no
					 * groups (eng_batch_files) */
};

/* One entry of the restore queue. */
struct hint {
	struct hint *next, *prev;	/* the queue, in ticket order */
	struct hint *fnext, *fprev;	/* with a file: the file's entries; without:
					 * its (dir, name) bucket; ticket order */
	struct hint *dnext, *dprev;	/* its directory's entries, ticket order */
	struct hint_dir *hd;		/* its directory */
	uint64_t seq;			/* ticket: position in the queue */
	uint64_t dir;			/* directory key */
	uint64_t hash;			/* of (dir, name) */
	uid_t uid;			/* who appended it (its budget) */
	struct tfile *file;		/* the file (referenced), NULL if unborn */
	char name[];			/* name in dir */
};

/* The entries of one directory (a chain of e->hq_dirs). */
struct hint_dir {
	struct hint_dir *hnext;		/* bucket chain */
	uint64_t key;			/* directory key */
	struct hint *head, *tail;	/* its entries, ticket order */
	/* where the last paged listing stopped (engine_hint_list_page): valid
	 * while e->hq_gen is list_gen (no entry freed since) */
	struct hint *list_h;		/* the entry at index list_at, or NULL */
	uint64_t list_at, list_gen;
};

/* A bucket of e->hq_ub: entries without a file, ticket order. */
struct hint_bucket {
	struct hint *head, *tail;
};

/* Entries one uid has in the queue. */
struct hint_user {
	uid_t uid;
	uint64_t n;
};

/* ---- locks (the order: lockorder.h) ----------------------------------- */

static inline void eng_lock(struct engine *e)
{
	ranked_lock(&e->lock, LR_ENGINE);
}

static inline void eng_unlock(struct engine *e)
{
	ranked_unlock(&e->lock, LR_ENGINE);
}

static inline void tfile_lock(struct tfile *f)
{
	ranked_lock(&f->lock, LR_TFILE);
}

static inline void tfile_unlock(struct tfile *f)
{
	ranked_unlock(&f->lock, LR_TFILE);
}

/*
 * ---- leases: the one way to use a copy without e->lock ------------------
 *
 * The rule: whoever uses a copy's bytes, or keeps a pointer to a copy,
 * while e->lock is not held holds a lease on it for the whole time.  A
 * leased copy (cp->pins > 0) is never evicted (eviction waits for it),
 * moved, released or reused (eng_drop_copy and install_copy wait for the
 * last lease); its fragment keeps its place and size.  Its state and the
 * file's copy pointers may still change, so after the lease the holder
 * looks at the file again before it trusts what it decided before.
 * Leases are taken and released with e->lock held; a release that leaves
 * a copy unpinned wakes e->unpinned (threads wait for pins to drop) and
 * e->room (an unpinned copy may be evicted).
 *
 * A transfer:   lease_begin(e, &l, a, b);  ...copy...;  lease_end(e, &l);
 * A lease that outlives one request (a zero-copy read reply, a client
 * span) is one copy_lease() / copy_unlease() pair on the copy itself.
 */
#define LEASE_MAX	(TIER_MAX + 1)

struct lease {
	struct copy *cp[LEASE_MAX];	/* the leased copies */
	int n;
};

static inline void copy_lease(struct copy *cp)
{
	cp->pins++;
}

static inline void eng_room(struct engine *e);

/* The end of a lease that outlives a request: a client span's or a
 * zero-copy reply's (the caller counts spans or readers down first);
 * writers wait for those to end (copies_busy, write.c). */
static inline void copy_unlease(struct engine *e, struct copy *cp)
{
	assert(cp->pins > 0);
	cp->pins--;
	pthread_cond_broadcast(&e->unpinned);
	if (!cp->pins)
		eng_room(e);
}

/* e->lock held: add cp (NULL: nothing) to lease l. */
static inline void lease_take(struct lease *l, struct copy *cp)
{
	if (!cp)
		return;
	assert(l->n < LEASE_MAX);
	copy_lease(cp);
	l->cp[l->n++] = cp;
}

/* e->lock held: release every copy of l; wake who waits for one of them
 * to be unpinned. */
static inline void lease_release(struct engine *e, struct lease *l)
{
	bool freed = false;

	while (l->n > 0) {
		struct copy *cp = l->cp[--l->n];

		assert(cp->pins > 0);
		if (--cp->pins == 0)
			freed = true;
	}
	if (freed) {
		pthread_cond_broadcast(&e->unpinned);
		eng_room(e);
	}
}

/* e->lock held: lease a and b (either may be NULL), then drop e->lock. */
static inline void lease_begin(struct engine *e, struct lease *l, struct copy *a,
			       struct copy *b)
{
	l->n = 0;
	lease_take(l, a);
	lease_take(l, b);
	eng_unlock(e);
}

/* Take e->lock again and release the lease. */
static inline void lease_end(struct engine *e, struct lease *l)
{
	eng_lock(e);
	lease_release(e, l);
}

/* ---- shared helpers (e->lock held unless said otherwise) -------------- */

/*
 * A read of n bytes at off finished reading f: it returned the last bytes
 * (or it is the first read of an empty file).  The read at EOF that ends
 * a reader's loop returns nothing and does not count again: without the
 * page cache every read() reaches us, and one pass must consume one
 * restore-queue entry, not two.
 */
static inline bool read_to_end(const struct tfile *f, off_t off, size_t n)
{
	if (!n)
		return off == 0 && f->size == 0;
	return (uint64_t)off + n >= f->size;
}

/* Wait on cond for at most ms milliseconds.  e->lock held. */
static inline void wait_ms(struct engine *e, pthread_cond_t *cond, long ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(cond, &e->lock, &ts);
}

/* ---- events (the table atop this file) ------------------------------- */

/* A flush ended or a file was removed: wake fsync. */
static inline void eng_flushed(struct engine *e)
{
	pthread_cond_broadcast(&e->flushed);
}

/* A flush, cascade or prefetch fill of a copy ended. */
static inline void eng_settled(struct engine *e)
{
	pthread_cond_broadcast(&e->settled);
}

/* Work for the SSD flushers, the GPU -> host cascade, the prefetcher. */
static inline void eng_flush_work(struct engine *e)
{
	pthread_cond_broadcast(&e->flush_work);
}

static inline void eng_cascade_work(struct engine *e)
{
	pthread_cond_broadcast(&e->cascade_work);
}

static inline void eng_prefetch_work(struct engine *e)
{
	pthread_cond_broadcast(&e->prefetch_work);
}

/* Room may be made in a cache (e->lock held): wake writers waiting for
 * it (eng_alloc_wait) and the prefetcher, if it has a restore queue to
 * work on (an idle one woken at every flush's end and lease's end only
 * took e->lock to find nothing: thousands of wake-ups a second). */
static inline void eng_room(struct engine *e)
{
	pthread_cond_broadcast(&e->room);
	if (e->hq_head && e->prefetch_on)
		eng_prefetch_work(e);
}

/*
 * A test hook for races: TIERFS_DELAY="point=ms[,point=ms...]" makes each
 * thread that reaches `point` sleep that many milliseconds (e->lock, held
 * when e is given, is dropped meanwhile: the caller looks at its state
 * again after).  Unset, it costs one getenv (tierfs_delay_ms, log.c).
 */
static inline void eng_delay_at(struct engine *e, const char *point)
{
	long ms = tierfs_delay_ms(point);

	if (ms <= 0)
		return;
	if (e)
		eng_unlock(e);
	usleep((useconds_t)(ms * 1000));
	if (e)
		eng_lock(e);
}


static inline const char *fname(struct tfile *f, char *buf, size_t len)
{
	return f->ops->name ? f->ops->name(f, buf, len) : "?";
}

static inline int host_index(struct engine *e)
{
	return e->ntiers - 1;
}

static inline uint8_t *copy_ptr(struct copy *cp)
{
	return cp->cache->base + cp->frag->off;
}

static inline uint64_t copy_cap(struct copy *cp)
{
	return cp->frag->size;
}

static inline void wait_unpinned(struct engine *e, struct copy *cp)
{
	while (cp->pins)
		pthread_cond_wait(&e->unpinned, &e->lock);
}

/* Flush backlog accounting, idempotent per copy.  e->lock held. */
static inline void backlog_add(struct engine *e, struct copy *cp)
{
	if (!cp->in_backlog && !cp->file->unlinked) {	/* unlinked: no flush */
		cp->in_backlog = true;
		e->backlog += cp->len;
	}
}

static inline void backlog_del(struct engine *e, struct copy *cp)
{
	if (cp->in_backlog) {
		cp->in_backlog = false;
		e->backlog -= cp->len < e->backlog ? cp->len : e->backlog;
	}
}

/* The fastest tier holding a copy of f, or -1. */
static inline int fastest_copy(struct engine *e, struct tfile *f)
{
	int i;

	for (i = 0; i < e->ntiers; i++)
		if (f->copy[i])
			return i;
	return -1;
}

/* ---- place.c ---------------------------------------------------------- */

/*
 * The engine's inputs to one eviction decision: eng_alloc_wait() fills it
 * and the policy hands it to copy_cost() unchanged.
 */
struct evict_ctx {
	uint64_t protect_below;		/* copies whose prefetch distance is
					 * below this are needed sooner than
					 * the one being placed: never evicted
					 * (0: no such copies) */
	uint64_t part_lo, part_hi;	/* part_hi > 0: only fragments wholly
					 * inside [part_lo, part_hi) may be
					 * evicted (one GPU's part) */
	uint64_t gpu_keeps;		/* restore-queue tickets below this are
					 * of files the GPU tier keeps until
					 * they are read (eng_gpu_keeps_below;
					 * 0: none, or this is the GPU tier) */
};
uint64_t eng_copy_dist(struct engine *e, struct copy *cp);
int eng_grow_inplace(struct engine *e, struct copy *cp, uint64_t size);
uint64_t eng_gpu_keeps_below(struct engine *e);
uint64_t eng_gpu_unflushed(struct engine *e);
uint64_t eng_shadow_rank(uint64_t d);
void eng_defer_put(struct engine *e, struct tfile *f);
void eng_attach_copy(struct engine *e, struct tfile *f, int i, struct copy *cp);
void eng_copy_evicted(struct copy *cp);
int eng_alloc_wait(struct engine *e, struct cache *c, struct copy *cp,
		   uint64_t size, double max_wait, uint64_t protect_below);
int eng_alloc(struct engine *e, struct cache *c, struct copy *cp, uint64_t size);
int eng_copy_bounds(struct copy *cp, uint64_t off, uint64_t len);
void eng_drop_copy(struct engine *e, struct tfile *f, int i);
void eng_discard_copy(struct engine *e, struct tfile *f, int i);

/* ---- write.c ---------------------------------------------------------- */

struct copy *eng_writable_copy(struct engine *e, struct tfile *f,
			       uint64_t cap, uint64_t keep, int *err);
void eng_writer_done(struct engine *e, struct tfile *f);

void eng_mark_modified(struct tfile *f);
/*
 * e->lock held, before bytes [start, end) of f's copy change (a write, a
 * hole zeroed, a client span): record them for an incremental flush.  The
 * first change of a file that is not dirty starts from its backing file.
 */
void eng_note_change(struct engine *e, struct tfile *f, uint64_t start, uint64_t end);
/* e->lock held: f is being cut or extended to size (its copy cp). */
void eng_note_truncate(struct engine *e, struct tfile *f, struct copy *cp, uint64_t size);
void eng_copy_zero(struct copy *cp, uint64_t from, uint64_t to);
/* A write of [hole_at, end) to f goes write-through, leaving its hole out of
 * the caches (write.c); e->lock and f->lock held, e->lock dropped meanwhile. */
bool eng_goes_sparse(struct engine *e, struct tfile *f, uint64_t hole_at, uint64_t end);

/* ---- shadow.c --------------------------------------------------------- */

/* e->lock and f->lock held (e->lock dropped meanwhile): f written through
 * from here on, into a new version holding its current content.  0 or
 * -errno. */
int eng_shadow_start(struct engine *e, struct tfile *f);
/* e->lock and f->lock held (dropped meanwhile): f's shadow made durable by
 * a journal record of its changes.  0, or 1 where it cannot be (the
 * caller commits it). */
int eng_shadow_record(struct engine *e, struct tfile *f);
/* e->lock and f->lock held (dropped meanwhile): f's shadow, where its
 * backing file has several names, committed by writing its change into
 * that file in place under its journal records.  0, or 1 where it is not
 * (the caller commits it as a version). */
int eng_shadow_apply(struct engine *e, struct tfile *f);
/* Lazy shadows (shadow.c), f->lock held.  owned: is [off, *next) of f's
 * shadow its own (else the backing file's)?  fill (e->lock held, dropped
 * meanwhile): the rest copied in, 0 or -errno.  room and written (e->lock
 * held, dropped meanwhile): before a write and after it, [off, end)
 * written, 0 or -errno.  read (e->lock not held): len bytes at off into
 * buf or GPU memory dptr, 0 or -errno. */
bool eng_shadow_owned(const struct tfile *f, uint64_t off, uint64_t end, uint64_t *next);
int eng_shadow_fill(struct engine *e, struct tfile *f);
int eng_shadow_room(struct engine *e, struct tfile *f);
int eng_shadow_written(struct engine *e, struct tfile *f, uint64_t off, uint64_t end);
int eng_shadow_read(struct tfile *f, void *buf, uint64_t dptr, uint64_t len, uint64_t off);
/* f->lock held: bytes [start, end) of f's shadow changed (ok false: a
 * change that failed, its bytes not known); the shadow sized to size. */
void eng_slog_note(struct tfile *f, uint64_t start, uint64_t end, bool ok);
void eng_slog_truncate(struct tfile *f, uint64_t size, bool ok);
/* [off, end) of shadow fd zeroed: a hole punched, or zeros written.  0 or
 * -errno. */
int eng_shadow_zero(int fd, uint64_t off, uint64_t end);

/* ---- flush.c ---------------------------------------------------------- */

void eng_queue_flush(struct engine *e, struct tfile *f, bool front);
void eng_queue_flush_aged(struct engine *e, struct tfile *f, uint64_t len);
bool eng_flush_inline(struct engine *e, struct tfile *f);
void eng_complete_copy(struct engine *e, struct tfile *f, bool front);
void *eng_flusher_main(void *arg);
void eng_batch_files(struct engine *e);
int eng_settle_record(struct engine *e, struct tfile *f, uint64_t seq);
/* e->lock held: flush f now, in this thread (the cascade, where the host
 * cache has no room): its newest complete copy into a new version. */
int eng_flush_one(struct engine *e, struct ssd_ring *ring, struct tfile *f);
/* e->lock held: the first file of queue *head that is due (not waiting
 * for a retry), taken off it; NULL: none.  link_off: its link's offset. */
struct tfile *eng_pop_due(struct tfile **head, struct tfile **tail, size_t link_off);

/* ---- cascade.c -------------------------------------------------------- */

void *eng_gflusher_main(void *arg);
/* Bytes at most journalled per flush: a record's payload stays small. */
#define JOURNAL_MAX	(64ull << 20)

/*
 * Is a journal record of bytes changed in len-byte file f small enough
 * (-o journal_pct of the file, JOURNAL_MAX at most)?  The one rule of the
 * records of flush.c, shadow.c and dedup_flush.c.  A record costs the
 * changed bytes twice (the record, then the apply in place), a new
 * version the file's data, so that records win up to about half the file
 * (RESULTS 16); journal_pct, 25 by default, is half that.  A file with
 * several names (f->linked) has its new version copied over it in place,
 * its data twice where the backing file system shares no extents: records
 * win up to the whole file there, and the share is doubled (RESULTS 18x).
 */
static inline bool eng_journal_small(const struct engine *e, const struct tfile *f,
				     uint64_t bytes, uint64_t len)
{
	uint64_t pct = e->cfg.journal_pct;

	if (!e->cfg.shares_extents && __atomic_load_n(&f->linked, __ATOMIC_RELAXED))
		pct = pct * 2 < 100 ? pct * 2 : 100;
	return bytes <= JOURNAL_MAX && bytes * 100 <= pct * len;
}
/* f's applied record whose sync a flusher has not made yet synced and
 * retired now (flush_journal.c's asettle), before anything newer of f is written
 * into its backing file.  e->lock not held.  0 or -errno. */
int eng_asettle_file(struct engine *e, struct tfile *f);
/*
 * Write-through shadows (shadow.c makes them): eng_commit_shadow makes f's
 * shadow its backing file's content (e->lock and f->lock held, e->lock
 * dropped meanwhile; durable: for fsync); eng_shadow_done is the last
 * writer's close: committed now, or after -o flush_age by a flusher;
 * eng_shadow_unqueued (e->lock held): a shadow off the aging queue
 * (committed, dropped), its bytes out of the flush backlog.
 */
int eng_commit_shadow(struct engine *e, struct tfile *f, bool durable);
/* f's shadow committed (ret 0, or -ENOENT: dropped with its file): the
 * journal records of its fsyncs (shadow.c's eng_shadow_record) retired;
 * e->lock not held. */
void eng_shadow_committed(struct tfile *f, int ret);
int eng_shadow_done(struct engine *e, struct tfile *f);
void eng_shadow_unqueued(struct engine *e, struct tfile *f);

/* ---- hints.c ---------------------------------------------------------- */

void eng_hint_init(struct engine *e);
void eng_hint_head_update(struct engine *e);
void eng_hint_remove(struct engine *e, struct hint *h);
void eng_hint_unbind_file(struct engine *e, struct tfile *f);
void eng_hint_destroy(struct engine *e);
void eng_consume(struct engine *e, struct tfile *f);
void eng_read_done(struct engine *e, struct tfile *f, off_t off, size_t n);
uint64_t eng_prefetch_distance(struct engine *e);

/* ---- backing.c -------------------------------------------------------- */

/* One end of a bounced transfer: a cache tier (at: offset in its buffer),
 * device memory (at: device address) or a file (at: file offset). */
enum bend_kind { BEND_CACHE, BEND_DEV, BEND_FD };
struct bend {
	enum bend_kind kind;
	struct cache *cache;		/* BEND_CACHE */
	int fd;				/* BEND_FD */
	uint64_t at;			/* where byte 0 of the transfer is */
	bool sparse;			/* BEND_FD destination reading zeros
					 * already (a fresh version): its runs
					 * of zeros are left unwritten, holes
					 * (backing_run, chunk by chunk) */
};
/*
 * Move len bytes from src to dst through one bounce buffer of at most
 * 8 MiB, chunk by chunk: caches through their tier_ops, device memory
 * through gpu_copy_*, files with backing_pread/backing_pwrite.  After each
 * chunk *progress (when not NULL) is set to the bytes moved (a relaxed
 * atomic store: eviction reads it without the lock).  e->lock not held;
 * the caller leases any copy it names.  Returns 0 or the first -errno.
 */
int backing_move(const struct bend *dst, const struct bend *src, uint64_t len,
		 uint64_t *progress);
/* Read n bytes at off of fd into buf, zeros past the file's end: 0 / -errno. */
int backing_pread(int fd, void *buf, size_t n, off_t off);
/* The first n bytes of fd into buf as backing_pread, fd's holes (SEEK_DATA,
 * SEEK_HOLE) zeroed instead of read (moves fd's offset): 0 / -errno. */
int backing_pread_sparse(int fd, void *buf, size_t n);
/* Write all n bytes of buf at off of fd: 0 / -errno. */
int backing_pwrite(int fd, const void *buf, size_t n, off_t off);
/*
 * Holes (sparse files).  A version leaves unwritten, as a hole, every run
 * of zeros of whole TIER_ALIGN blocks that is at least SPARSE_RUN bytes
 * long or reaches the end of what is written (shorter runs between data
 * are written: fewer, larger writes); reads give the same zeros.
 * backing_run() returns the end of the run that starts at pos (a multiple
 * of TIER_ALIGN) in buf[pos, end): a hole (*hole) or data (which may hold
 * shorter runs of zeros).  Callers check no more than they write.
 */
#define SPARSE_RUN	FC_HOLE_RUN
uint64_t backing_run(const uint8_t *buf, uint64_t pos, uint64_t end, bool *hole);
/* Write the n bytes of buf at offset 0 of fd, a fresh file, holes left
 * out (backing_run); the caller sizes the file.  0 / -errno. */
int backing_pwrite_sparse(int fd, const void *buf, uint64_t n);
/*
 * lseek(2)'s SEEK_DATA / SEEK_HOLE (whence) from off in the first len bytes
 * of a file of size bytes (len <= size; past len: a hole), holes as a
 * flush leaves them (backing_run), in buf (host memory), or read from
 * cache c at `at` (a copy that is not host-addressable, GPU memory) through
 * a bounce buffer, backing_move's chunks, whose flush leaves the same
 * holes.  -ENXIO: no data after off; -errno (the read).
 */
off_t backing_seek_buf(const uint8_t *buf, uint64_t len, uint64_t size, uint64_t off,
		       int whence);
off_t backing_seek_cache(struct cache *c, uint64_t at, uint64_t len, uint64_t size,
			 uint64_t off, int whence);
/* Copy the first len bytes of f's backing content into fd, holes kept
 * (copy_file_range, else read and write): 0 / -errno. */
int backing_copy_file(struct tfile *f, int dst, uint64_t len);
/* The same for bytes [from, to) of file src, at the same offsets. */
int backing_copy_range(int src, int dst, uint64_t from, uint64_t to);
/*
 * A flush's writes into its version fd, at the same offsets as in the copy
 * (e->lock not held, the copy leased): segments through ring, or plain
 * writes where ring is NULL (an fsync's own flush); bytes [a, b) of cp;
 * the same with cp's holes left out (punched when inplace).  progress, when
 * not NULL, is advanced as bytes go.  0 or the first -errno.
 */
struct ssd_seg;
int backing_write_segs(struct ssd_ring *ring, int fd, const struct ssd_seg *seg, unsigned n,
		       uint64_t *progress);
int backing_write_range(struct ssd_ring *ring, int fd, struct copy *cp, uint64_t a,
			uint64_t b, uint64_t *progress);
int backing_prealloc(int fd, struct copy *cp, uint64_t end);
int backing_prealloc_range(int fd, struct copy *cp, uint64_t a, uint64_t b);
int backing_write_sparse(struct ssd_ring *ring, int fd, struct copy *cp, uint64_t a,
			 uint64_t b, uint64_t *progress, bool inplace);
/* Make version fd's data stable before its rename: a whole version (an
 * fdatasync, or the wait for its writes where the log is ordered), or one
 * holding clones of earlier versions (an fsync, or that wait).  0 / -errno. */
int eng_settle_version(struct engine *e, struct ssd_ring *ring, int fd, bool small,
		       bool inplace);
int eng_settle_cloned(struct engine *e, int fd);
/* eng_settle_version() of n versions at once (flush.c's groups). */
void eng_settle_versions(struct engine *e, struct ssd_ring *ring, const int *fd,
			 const bool *inplace, int *res, unsigned n);

/* ---- prefetch.c, host.c ----------------------------------------------- */

void *eng_prefetcher_main(void *arg);
void *eng_toucher_main(void *arg);
void eng_pin_host_once(struct engine *e);

#endif /* TIERFS_ENGINE_INT_H */
