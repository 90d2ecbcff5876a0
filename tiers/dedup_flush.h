/*
 * dedup_flush.h - the dedup flush (-o dedup), as flush.c and the engine
 * call it: a file's new version made incrementally (the base's unchanged
 * blocks cloned, the changed ranges written) or by chunks (runs of chunks
 * found in the chunk index cloned, the rest written), and the index's
 * versions kept in step with the backing files.
 *
 * A flush (flush.c, eng_flush_one) plans under e->lock (eng_dd_plan), writes
 * the version without it (eng_dd_write; -EAGAIN: the flush writes the
 * whole file itself), opens what the index keeps once the version is
 * committed (eng_dd_committed), and ends under e->lock (eng_dd_done, then,
 * once its end is published, eng_dd_index: the new version's chunks).  The
 * GPU -> host cascade hashes a whole new file's chunks on the GPU for the
 * flush that follows (eng_dd_gpu_plan, _hash, _keep), and makes its clone
 * record first where an fsync waits (eng_dd_gpu_record).
 */
#ifndef TIERFS_DEDUP_FLUSH_H
#define TIERFS_DEDUP_FLUSH_H

#include "engine_int.h"

/*
 * What an incremental flush needs, taken under e->lock when the flush
 * starts: the ranges changed since the base and how much of the base may
 * be cloned.
 */
struct incr {
	bool on;
	struct drange *r;
	uint32_t n;
	uint64_t base_len;	/* the size the base must have */
	uint64_t clone;		/* clone [0, clone) from the base */
	uint64_t align;		/* ranges rounded out to this */
	uint64_t written;	/* statistics: bytes written, */
	uint64_t cloned;	/* and bytes shared with the base */
	bool done;		/* the version was made this way */
	double clone_s, sync_s;	/* statistics: seconds in FICLONERANGE
				 * and settling the version */
	/* the base's entry in the chunk index, carried over to the new
	 * version (dd_src_carry): the chunks that changed, with the hashes
	 * of those that are full chunks of the new version (NULL: none) */
	struct dd_src *carry;
	uint64_t *ck, nck;
	struct dd_hash *ch;
};

/* A whole new file's flush by chunks: the plan, and what it found. */
struct ddf {
	bool on;
	bool sample;		/* recent files were new: hash a few first */
	uint64_t chunk, n;	/* chunk size, full chunks */
	uint32_t uid;
	struct dd_hash *h;	/* hashes of chunks [0, nhashed) */
	uint64_t nhashed;
	struct dd_src **src;	/* per chunk: a version holding it (referenced) */
	uint64_t *soff;		/* and where, */
	uint32_t *sep;		/* and that version's epoch then */
	uint64_t found, written, cloned;
	int vfd;		/* after the commit: the new version, read */
	struct dd_hash *gh;	/* all n hashes, computed by the cascade on
				 * the GPU (owned; NULL: hash here) */
	double clone_s, sync_s;	/* statistics: seconds in FICLONERANGE
				 * and settling the version */
	bool record;		/* an fsync waits: a clone record first,
				 * where the file is its base but for a
				 * few chunks (ddf_record) */
	uint64_t gen;		/* the file's gen that the flush writes */
	bool recorded;		/* made one: counted in versions_pending
				 * until its version is indexed or failed */
};

/*
 * One flush's dedup plan, on its flusher's stack.  flush.c reads clone_s
 * and sync_s; the rest is the dedup flush's own.
 */
struct dd_flush {
	struct incr in;		/* an incremental flush */
	struct ddf d;		/* a flush by chunks (or a version hashed whole) */
	bool had_src;		/* the file had a version in the index */
	bool journalled;	/* made a journal record instead (flush.c):
				 * no version, counted by the journal */
	uint64_t gen;		/* the file's gen when the flush started */
	int vfd;		/* after the commit: the new version, read, for
				 * the carry of in.carry (-1: none) */
	double clone_s, sync_s;	/* seconds in FICLONERANGE and in settling
				 * a version with clones (eng_dd_write) */
	struct dd_src *ix_src;	/* after eng_dd_done: the new version
				 * (referenced), whose ix_n chunks of ix_chunk
				 * bytes, hashes ix_h (owned), eng_dd_index()
				 * adds to the index */
	struct dd_hash *ix_h;
	uint64_t ix_n, ix_chunk;
};

/*
 * e->lock held, as f's flush of its copy cp (len bytes) starts: f's
 * version leaves the chunk index (or is suspended there, to be carried over
 * to the new version), and p gets the plan: incremental, by chunks, or
 * none.  Every plan ends with eng_dd_done().
 */
void eng_dd_plan(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
		 struct dd_flush *p);
/*
 * Make version fd (direct: opened O_DIRECT; inplace: the backing file
 * itself) of cp's len bytes as planned, sized and settled.  e->lock not
 * held, cp leased.  Returns 0 or -errno; -EAGAIN when there is no plan or
 * it cannot be followed: the caller writes the whole file into fd (over
 * whatever was cloned).
 */
int eng_dd_write(struct engine *e, struct ssd_ring *ring, struct tfile *f, struct copy *cp,
		 int fd, bool direct, bool inplace, uint64_t len, struct dd_flush *p);
/*
 * e->lock not held, cp leased: f's version was changed in place by the
 * apply of a journal record of cp's len bytes (flush.c), not replaced.
 * Where the plan suspended it in the index it is carried over as after an
 * incremental flush (the changed chunks hashed anew, the others' entries
 * kept); otherwise it left the index at the plan.
 */
void eng_dd_applied(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
		    struct dd_flush *p);
/* e->lock not held, f's new version of len bytes committed: open what the
 * index keeps of it. */
void eng_dd_committed(struct tfile *f, uint64_t len, struct dd_flush *p);
/*
 * e->lock held, after the flush (ok: its version of len bytes committed):
 * index the new version or carry the old one over to it, drop what the
 * plan held, count the flush in e->dd (not a journalled one) and, when
 * ok, make the version f's base.  Never fails.
 */
void eng_dd_done(struct engine *e, struct tfile *f, struct dd_flush *p, bool ok,
		 uint64_t len);
/*
 * e->lock held (dropped and taken again between batches of chunks), once
 * the flush's end is published (fsync waiters woken): add the chunks of
 * the version eng_dd_done() indexed, unless it is retired meanwhile.  Off
 * the fsync's path: an all-new 1 GiB file hashed on the GPU has 65,536.
 */
void eng_dd_index(struct engine *e, struct dd_flush *p);
/* e->lock held: a descriptor of a retired version for a flusher to close
 * without e->lock (the last close frees its blocks), or -1: none. */
int eng_dd_take_close(struct engine *e);

/*
 * The cascade's GPU hashes of f's copy cp (len bytes): e->lock held, plan
 * them into g (g->n 0: none wanted); e->lock not held, cp leased, hash
 * them (g->h, NULL when that failed); e->lock held, give them to f for
 * its flush when keep and f is still what was hashed, else free them.
 */
void eng_dd_gpu_plan(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
		     struct dd_ghash *g);
void eng_dd_gpu_hash(struct engine *e, struct copy *cp, struct dd_ghash *g);
/*
 * e->lock not held, cp (f's GPU copy) and hcp (the host copy the cascade
 * fills, len bytes) leased, g hashed: where an fsync waits for f (g->record)
 * and f is an indexed version but for a few chunks, make its clone record
 * from those chunks alone, copied from cp into hcp, before the cascade
 * copies the rest: the fsync returns without waiting for the whole file to
 * cross to the host.  Nothing where a record cannot be made, or where an
 * earlier record's version is still pending (the cascade waits for none):
 * the flush of hcp then makes it, or writes the version.
 */
void eng_dd_gpu_record(struct engine *e, struct tfile *f, struct copy *cp, struct copy *hcp,
		       uint64_t len, const struct dd_ghash *g);
void eng_dd_gpu_keep(struct tfile *f, struct dd_ghash *g, bool keep);

/* e->lock held: f's backing version is about to change or go: its chunks
 * leave the index. */
void eng_dd_retire(struct engine *e, struct tfile *f);
/* Free every indexed version (engine_destroy, no thread left). */
void eng_dd_destroy(struct engine *e);

#endif /* TIERFS_DEDUP_FLUSH_H */
