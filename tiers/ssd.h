/*
 * ssd.h - the SSD tier: large transfers between a cache buffer and a backing
 * file through io_uring, many requests in flight.
 */
#ifndef TIERFS_SSD_H
#define TIERFS_SSD_H

#include <liburing.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ssd_ring {
	struct io_uring ring;		/* one ring per thread */
	unsigned depth;			/* requests in flight at most */
	uint64_t chunk;			/* bytes per request */
};

/* Set up a ring of `depth` entries; chunk bytes per request.  0 / -errno. */
int ssd_ring_init(struct ssd_ring *r, unsigned depth, uint64_t chunk);
void ssd_ring_exit(struct ssd_ring *r);
/*
 * Write len bytes of buf at file offset off (all of it, retrying short
 * writes); with O_DIRECT fds buf, len and off must be 4 KiB aligned.
 * progress, when not NULL, is advanced as requests complete.
 * Returns 0 or -errno (the first failure).
 */
int ssd_write(struct ssd_ring *r, int fd, const void *buf, uint64_t len,
	      uint64_t off, uint64_t *progress);
/* A piece of a vectored write: len bytes of buf to file offset off. */
struct ssd_seg {
	uint64_t off, len;
	uint8_t *buf;
};
/* ssd_write() of every segment, their requests in flight together. */
int ssd_write_segs(struct ssd_ring *r, int fd, const struct ssd_seg *seg, unsigned n,
		   uint64_t *progress);
/* Read len bytes at off into buf; short reads past EOF zero-fill. */
int ssd_read(struct ssd_ring *r, int fd, void *buf, uint64_t len, uint64_t off);
/* fdatasync through the ring. */
int ssd_fdatasync(struct ssd_ring *r, int fd);
/*
 * fdatasync of fd[0..n) through the ring, up to its depth in flight at
 * once (the file system commits their log changes together); res[i] gets
 * fd[i]'s result, 0 or -errno.
 */
void ssd_fdatasync_many(struct ssd_ring *r, const int *fd, int *res, unsigned n);

#endif /* TIERFS_SSD_H */
