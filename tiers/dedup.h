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
#define DSET_MAX	1024

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

#endif /* TIERFS_DEDUP_H */
