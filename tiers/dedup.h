/*
 * dedup.h - sharing extents with earlier versions (-o dedup): the reflink
 * probe and the set of changed ranges a file keeps between flushes.
 *
 * A flush normally writes a file's whole content into its new version.
 * Where the backing file system can share extents (FICLONERANGE: XFS with
 * reflink=1, btrfs), a file that was loaded from its backing file and then
 * changed in place is flushed incrementally: the new version first clones
 * the old version's unchanged blocks, then gets the changed ranges
 * written.  The version is still a complete, plain file, committed by
 * rename as before.
 */
#ifndef TIERFS_DEDUP_H
#define TIERFS_DEDUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A set of disjoint, sorted byte ranges [start, end). */
struct drange {
	uint64_t start, end;
};

struct dset {
	struct drange *r;
	uint32_t n, cap;
};

/* At most this many ranges: past it the two closest are merged (a range
 * then covers some unchanged bytes, which are written: still correct). */
#define DSET_MAX	8192

/* Add [start, end), merging what it touches.  0 or -ENOMEM (d unchanged). */
int dset_add(struct dset *d, uint64_t start, uint64_t end);
void dset_clear(struct dset *d);
void dset_free(struct dset *d);
/* Copy of src's ranges into a new array (*out, *n); 0 or -ENOMEM. */
int dset_dup(const struct dset *src, struct drange **out, uint32_t *n);
/* Bytes covered by the set. */
uint64_t dset_bytes(const struct dset *d);

/*
 * Can files in directory dirfd share extents?  Clones one block between
 * two temporary files (.tierfs.new.probe.*, removed; a start-up after a
 * kill removes leftovers).  Returns 0 with *blk the file system's block
 * size, or -errno with a reason in why.
 */
int dedup_probe(int dirfd, uint32_t *blk, char *why, size_t wl);

/* FICLONERANGE of len bytes at soff of src to doff of dst: 0 or -errno. */
int dedup_clone(int dst, uint64_t doff, int src, uint64_t soff, uint64_t len);


/* ---- the chunk index (content de-duplication of whole new files) ------ */

/* A chunk's 128-bit hash (XXH3-128). */
struct dd_hash {
	uint64_t lo, hi;
};

/*
 * One flushed version of a file that chunks may be cloned from: a read
 * descriptor of that version, held while it is the file's current one.
 * It is retired (fd queued for closing, entries dead) before anything can
 * change it: when its file's next flush or write-through starts, when the
 * file is removed or freed, or when too many are open.  The index keeps no
 * pointer to a file, only to these.
 */
struct dd_src {
	int fd;				/* O_RDONLY of the version */
	uint32_t uid;			/* its owner: chunks are shared only
					 * between files of one owner */
	uint32_t refs;			/* index entries + cloners using it */
	bool retired;
	void *owner;			/* its struct tfile while live */
	struct dd_src *prev, *next;	/* the live ones, oldest first */
	/*
	 * Carried over by incremental flushes.  While its file's next
	 * version is flushed incrementally the version is suspended (fd -1:
	 * nothing is found in it or cloned from it) and epoch grows; when
	 * that version is committed it takes the old one's place: fd is
	 * the new version's, the chunks the flush changed get cgen = epoch,
	 * and an entry is found only while its gen >= its chunk's cgen (the
	 * unchanged chunks hold the same bytes at the same offsets: their
	 * entries stay).  A clone checks that epoch did not move between
	 * the lookup and the end of the clone.
	 */
	uint32_t epoch;
	uint64_t chunk;			/* the chunk size of its entries */
	uint64_t nchunks;		/* full chunks of the version */
	uint32_t *cgen;			/* per chunk (nchunks); NULL: all 0 */
};

/* Where a chunk was flushed: version src, at offset off. */
struct dd_ent {
	struct dd_hash h;
	struct dd_src *src;		/* NULL: a free slot */
	uint64_t off;
	uint32_t next;			/* hash chain, UINT32_MAX: end */
	uint32_t gen;			/* src->epoch when it was added */
};

struct dd_index {
	struct dd_ent *ent;		/* a ring: the oldest is overwritten */
	uint32_t *bucket;
	uint32_t cap, nbucket, head, count;
	uint64_t live;			/* entries of live versions (approximate) */
};

/* Size the index for `bytes` of memory (0: none).  0 or -ENOMEM. */
int dd_index_init(struct dd_index *x, uint64_t bytes);
void dd_index_free(struct dd_index *x);
/* Add an entry (takes a reference on src), evicting the oldest when full.
 * Returns a version whose last reference went (to free), or NULL. */
struct dd_src *dd_index_add(struct dd_index *x, const struct dd_hash *h,
			    struct dd_src *src, uint64_t off, uint32_t gen);
/* Does the entry still describe its version's bytes (live, not suspended,
 * its chunk unchanged since it was added)? */
bool dd_ent_valid(const struct dd_ent *d);
/* The newest valid entry of h from a version of owner uid, or NULL. */
const struct dd_ent *dd_index_find(const struct dd_index *x, const struct dd_hash *h,
				   uint32_t uid);
/* Memory the index holds. */
uint64_t dd_index_bytes(const struct dd_index *x);

/* XXH3-128 of chunks [first, first + n) of `chunk` bytes of p (len bytes). */
void dd_hash_chunks(const uint8_t *p, uint64_t len, uint64_t chunk, struct dd_hash *out,
		    uint64_t first, uint64_t n);

/* ---- per-file and per-engine state (struct tfile's dd, struct engine's dd) */

/* Chunk hashes of a file's content computed on the GPU by the cascade. */
struct dd_ghash {
	struct dd_hash *h;		/* n hashes (owned), NULL: none */
	uint64_t n, chunk, len;		/* of n chunks of chunk bytes of len */
	uint64_t gen, epoch;		/* its gen and wepoch then */
	bool record;			/* an fsync waits: a clone record from
					 * the GPU copy first (eng_dd_gpu_record) */
};

/*
 * A file's incremental-flush state (-o dedup; write.c records, the dedup
 * flush uses), under e->lock.  The "base" is the backing file's current
 * version.  While valid, the file's content differs from the base only
 * inside ranges (block aligned) and at or past clean_len (the least size
 * the file had since it equalled the base); base_len is the base's size.
 */
struct tfile_dedup {
	struct dset ranges;
	uint64_t base_len, clean_len;
	bool valid;
	struct dd_src *src;		/* its current version in the chunk index */
	bool hashed_whole;		/* an incremental flush hashed it whole
					 * (once: then its versions are carried) */
	/*
	 * Chunk hashes of the content computed on the GPU by the cascade
	 * (flush.c): valid while gen and wepoch are what they were then
	 * (wepoch counts the copies made writable: a failed write may
	 * change bytes without a new gen).
	 */
	struct dd_ghash gh;
	uint64_t wepoch;
	uint64_t grec_gen;		/* the gen of a clone record the cascade
					 * made (eng_dd_gpu_record), counted in
					 * versions_pending until the flush of
					 * that gen takes it over; 0: none */
	bool noted;			/* changes noted while the file is not
					 * dirty yet (a vectored write notes all
					 * its segments before it writes any):
					 * they add to the ranges, not restart
					 * them; cleared when it becomes dirty */
	bool taint;			/* a copy may differ from the base although
					 * the file is not dirty (a failed write):
					 * no base until a full flush */
};

/* The engine's dedup statistics, chunk index and live versions, under
 * e->lock. */
struct engine_dedup {
	/* statistics of the flushes */
	uint64_t bytes_logical;		/* bytes of the versions flushed */
	uint64_t bytes_written;		/* of which written to the SSD */
	uint64_t bytes_cloned;		/* of which shared with earlier versions */
	uint64_t files_incremental, files_full;
	/* content de-duplication */
	struct dd_index index;		/* chunks of versions flushed */
	struct dd_src *live, *live_tail;	/* live versions, oldest first */
	uint32_t nlive;
	int *close;			/* fds of retired versions, closed by
					 * a flusher without e->lock */
	size_t nclose, closecap;
	double dup;			/* share of chunks found, recent flushes */
	uint64_t files_dedup, chunks_hashed, chunks_found, sampled_out;
	uint64_t bytes_hashed;
	double hash_s;
	uint64_t carried;		/* versions carried over (dd_src_carry) */
	uint64_t cgen_bytes;		/* memory of their chunk generations */
	uint64_t gpu_chunks, gpu_bytes;	/* hashed on the GPU */
	uint64_t records, bytes_recorded;	/* fsyncs made durable by a
					 * clone record (ddf_record) first */
	uint32_t versions_pending;	/* versions of clone records not yet
					 * in the index (ddf_wait_pending) */
	double gpu_s;
	uint64_t records_gpu;		/* clone records made from the GPU copy */
	double gather_s;		/* their chunks' copies to the host */
	double pending_s;		/* waited in ddf_wait_pending */
	uint64_t records_left;		/* GPU files' records left to their
					 * flush: a version was pending */
};

#endif /* TIERFS_DEDUP_H */
