/*
 * tier.h - tier-independent caching: cache buffers, allocation tables,
 * per-file life cycle, eviction policies and the flush/prefetch engine.
 *
 * A cache tier is one contiguous buffer (host memory, or a GPU VMM
 * reservation) plus copy functions.  The buffer is tiled by fragments, kept
 * in offset order: each fragment is either a gap or one file's cached copy
 * (struct copy).  A file's copy is contiguous, so a flush or a prefetch is a
 * single transfer.
 *
 * Locking: one engine mutex (struct engine.lock) protects every allocation
 * table, every copy's state and every file's copy pointers.  It is held for
 * bookkeeping only: bytes move with the lock dropped, under a lease
 * (copy.pins; the rule is in engine_int.h) that keeps the copy from being
 * evicted or moved.  Per-file mutexes (struct tfile.lock) order operations
 * on one file.  The order of all locks, fs ones included, is in
 * lockorder.h: tfile.lock -> file ilock -> fs.nslock -> dir ilock ->
 * fs.lock -> engine.lock.
 *
 * Nothing here depends on FUSE or CUDA: tiers/ is testable on its own.
 */
#ifndef TIERFS_TIER_H
#define TIERFS_TIER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TIER_ALIGN	4096u		/* fragment granularity (O_DIRECT) */
#define TIER_MAX	2		/* cache tiers: GPU, host */
#define TIER_INF	1e30		/* "never evictable" time */
#define TIER_FAR	UINT64_MAX	/* prefetch distance: no hint */

/* ---- life cycle (lifecycle.c) ---------------------------------------- */

/*
 * Per file per tier (hpdc23 Figure 1).  Checkpoint path:
 * INIT -> WRITE_IN_PROGRESS -> WRITE_COMPLETE -> FLUSHED.
 * Restore path: INIT -> READ_IN_PROGRESS -> READ_COMPLETE -> CONSUMED.
 * FLUSHED and CONSUMED copies are evictable.  A copy being written again
 * goes back to WRITE_IN_PROGRESS; a copy still flushing that is read goes
 * straight to READ_COMPLETE once flushed (it is already "promoted").
 */
enum tier_state {
	TS_INIT = 0,
	TS_WRITE_IN_PROGRESS,
	TS_WRITE_COMPLETE,
	TS_FLUSHED,
	TS_READ_IN_PROGRESS,
	TS_READ_COMPLETE,
	TS_CONSUMED,
	TS_NSTATES
};

const char *tier_state_name(enum tier_state s);
/* Is from -> to an allowed transition?  */
bool tier_transition_ok(enum tier_state from, enum tier_state to);
/* Move *s to `to`, asserting the transition is allowed. */
void tier_set_state(enum tier_state *s, enum tier_state to);
/* May a copy in state s be dropped without losing data? */
bool tier_state_evictable(enum tier_state s);
/* May cp be dropped now: unpinned, and safe elsewhere or garbage? */
struct copy;
bool tier_copy_evictable(const struct copy *cp);

/* ---- allocation table (cache.c) -------------------------------------- */

struct copy;
struct cache;
struct tfile;

struct frag {
	struct frag *prev, *next;	/* neighbours in offset order */
	struct frag *gprev, *gnext;	/* a gap's neighbouring gaps, in offset
					 * order (struct cache's gaps) */
	uint64_t off;			/* offset in the tier buffer */
	uint64_t size;			/* bytes, multiple of TIER_ALIGN */
	struct copy *copy;		/* the copy here, NULL for a gap */
};

struct copy {
	struct cache *cache;		/* tier holding it */
	struct tfile *file;		/* owner */
	struct frag *frag;		/* its fragment (frag->copy == this) */
	uint64_t len;			/* valid bytes (file size when written) */
	enum tier_state state;		/* life-cycle state */
	int pins;			/* users of the bytes: no evict/move */
	int spans;			/* of them, client copies (gpu_share) */
	int readers;			/* of them, zero-copy read replies in
					 * flight: no write may change the bytes */
	bool flushing;			/* a flush of it to the next tier runs */
	bool promoted;			/* prefetched and not yet consumed */
	bool in_backlog;		/* counted in the engine's flush backlog */
	bool for_read;			/* placed by a prefetch: in the GPU part
					 * of the file's reader (gpu_rdev) */
	bool fileref;			/* holds a reference on its file (while
					 * the file has a name; see attach_copy) */
	bool discarded;			/* its file is gone and nobody can read
					 * it: garbage, evictable once idle */
	uint64_t flushed_bytes;		/* progress of the running flush: bytes
					 * written or cloned (may pass len by what
					 * was written over a clone: read it capped) */
	struct copy *fl_next;		/* on the engine's fl_running (flush.c) */
	uint64_t seq;			/* insertion order (fifo) */
	uint64_t last_use;		/* last access tick (lru) */
};

/*
 * Per-fragment inputs of an eviction decision, filled by the engine.
 * wait: seconds until the fragment is evictable (0: now; TIER_INF: never).
 * dist: prefetch distance of the copy (position in the restore queue;
 * TIER_FAR for no hint; 0 for gaps).
 */
struct evict_cost {
	double wait;
	uint64_t dist;
};

/*
 * The caller's inputs to one decision besides the table (the engine's is
 * in engine_int.h): choose() hands it to every cost() call unchanged and
 * never looks inside.  May be NULL when cost() needs nothing.
 */
struct evict_ctx;
typedef struct evict_cost (*evict_cost_fn)(struct cache *c, struct frag *fr,
					   const struct evict_ctx *ctx);

struct evict_policy {
	const char *name;
	/*
	 * Pick a window of consecutive fragments [*first, *last] of the cache
	 * whose total size is >= need and whose copies can all be evicted
	 * eventually.  cost(c, frag, ctx) tells each fragment's wait and
	 * distance.  Returns 0 (and *wait_s, the window's summed wait) or
	 * -ENOSPC when no window qualifies.  Must not modify the table.
	 */
	int (*choose)(struct cache *c, uint64_t need, evict_cost_fn cost,
		      const struct evict_ctx *ctx,
		      struct frag **first, struct frag **last, double *wait_s);
};

extern const struct evict_policy evict_fifo, evict_lru, evict_score;
/* Policy by name ("score", "fifo", "lru"), NULL if unknown. */
const struct evict_policy *evict_policy_find(const char *name);

/* Copy functions of a tier: host memcpy, or CUDA copies for the GPU. */
struct drange;			/* dedup.h: [start, end) of a file */

struct tier_ops {
	/* copy len bytes from host memory src to buffer offset off */
	int (*write)(struct cache *c, uint64_t off, const void *src, size_t len);
	/* copy len bytes at buffer offset off to host memory dst */
	int (*read)(struct cache *c, uint64_t off, void *dst, size_t len);
	/* copy inside the buffer (reallocation) */
	int (*move)(struct cache *c, uint64_t dst, uint64_t src, size_t len);
	/*
	 * Optional (NULL: hash on the host): XXH3-128 of each chunk-byte
	 * piece of [off, off + len) into out[i] = { low 64, high 64 bits },
	 * the last piece short.  0 or -errno.
	 */
	int (*hash)(struct cache *c, uint64_t off, uint64_t len, uint64_t chunk,
		    uint64_t (*out)[2]);
	/*
	 * Optional (NULL: the cascade makes no clone record, dedup_flush.c):
	 * copy the n ranges [r.start, r.end) of the buffer at offset off to
	 * dst + r.start, all of them queued before one wait (a file's
	 * scattered chunks).  0 or -errno.
	 */
	int (*read_ranges)(struct cache *c, uint64_t off, const struct drange *r, uint32_t n,
			   void *dst);
};

struct cache {
	const char *name;		/* "gpu", "host" */
	int level;			/* 0 = fastest */
	uint8_t *base;			/* buffer (device address for the GPU) */
	uint64_t size;			/* capacity in bytes */
	uint64_t usable;		/* bytes usable now (mapped/touched) */
	const struct tier_ops *ops;	/* copy functions */
	bool host_addressable;		/* base can be dereferenced by the CPU */
	const struct evict_policy *policy;
	struct frag *head;		/* fragments in offset order */
	struct frag *gaps;		/* the gaps alone, in offset order:
					 * what placement walks */
	uint64_t nfrags, ngaps;		/* table size */
	uint64_t used;			/* bytes held by copies */
	uint64_t seq;			/* copy insertion counter */
	void *priv;			/* tier owner's data */
	/* statistics */
	uint64_t hits, misses, evictions, evicted_bytes;
	uint64_t late;			/* reads served after waiting for a
					 * prefetch of their file (not hits) */
	uint64_t evicted_queued;	/* evictions of copies still in the restore queue */
};

/*
 * Set up an allocation table over [base, base+size) (size rounded down to
 * TIER_ALIGN): one gap.  Returns 0 or -errno.
 */
int cache_init(struct cache *c, const char *name, int level, void *base,
	       uint64_t size, const struct tier_ops *ops,
	       const struct evict_policy *pol);
/* Free the table (not the buffer).  All copies must be gone. */
void cache_destroy(struct cache *c);
/*
 * Place copy cp in a gap of at least `size` bytes (rounded up to
 * TIER_ALIGN), first fit inside the usable part.  Returns 0 or -ENOSPC
 * when no single gap is big enough (nothing changes then).
 */
int cache_place(struct cache *c, struct copy *cp, uint64_t size);
/*
 * The same inside [lo, hi) only (a GPU's part of a cache over several
 * GPUs): first fit of the whole copy inside the range, which may start in
 * the middle of a gap; with `top`, last fit, at the top of the room the
 * last gap with room has inside the range.  cache_place() is this over
 * [0, usable) without top.
 */
int cache_place_in(struct cache *c, struct copy *cp, uint64_t size,
		   uint64_t lo, uint64_t hi, bool top);
/* Place cp at offset `at` (TIER_ALIGN-aligned), which with `size` bytes
 * must lie inside one gap below usable: 0, -ENOSPC, -ENOMEM. */
int cache_place_at(struct cache *c, struct copy *cp, uint64_t size, uint64_t at);
/* Bytes of the largest gap inside [lo, hi), in whole TIER_ALIGN blocks. */
uint64_t cache_largest_gap_in(const struct cache *c, uint64_t lo, uint64_t hi);
/* Turn cp's fragment into a gap (coalesced with neighbours). */
void cache_release(struct cache *c, struct copy *cp);
/*
 * Evict the window [first, last]: every copy in it must be evictable and
 * unpinned; each is released through evicted(cp) (which detaches it from
 * its file and frees it) and the window becomes one gap.  Returns the gap.
 */
struct frag *cache_evict_window(struct cache *c, struct frag *first,
				struct frag *last,
				void (*evicted)(struct copy *cp));
/* Shrink cp's fragment to `size` bytes (>= cp->len), the rest a gap. */
void cache_shrink(struct cache *c, struct copy *cp, uint64_t size);
/* Grow cp's fragment in place to `size` when the next fragment is a gap
 * big enough.  Returns 0 or -ENOSPC (unchanged). */
int cache_grow_inplace(struct cache *c, struct copy *cp, uint64_t size);
/*
 * Check the table's invariants: fragments tile [0, size), no overlap, no
 * two adjacent gaps, counters match, copies point back.  Returns 0 or
 * -EUCLEAN with a message on stderr.
 */
int cache_check(const struct cache *c);
/* Round up to TIER_ALIGN. */
static inline uint64_t tier_round(uint64_t n)
{
	return (n + TIER_ALIGN - 1) & ~(uint64_t)(TIER_ALIGN - 1);
}

/* Host-memory tier copy functions (memcpy). */
extern const struct tier_ops tier_host_ops;

#endif /* TIERFS_TIER_H */
