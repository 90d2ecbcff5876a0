/*
 * ssd.c - bulk I/O between cache buffers and backing files via io_uring,
 * and the fdatasyncs of a group of versions in flight together.
 *
 * A transfer is cut into chunk-sized requests; up to `depth` are in flight.
 * Short transfers are resubmitted for the remainder.  Used by the flusher
 * threads (cache -> SSD) and the prefetcher (SSD -> cache); each thread owns
 * its ring, so nothing here locks.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "ssd.h"

int ssd_ring_init(struct ssd_ring *r, unsigned depth, uint64_t chunk)
{
	int ret;

	memset(r, 0, sizeof(*r));
	r->depth = depth ? depth : 32;
	r->chunk = chunk ? chunk : (1u << 20);
	ret = io_uring_queue_init(r->depth, &r->ring, 0);
	return ret < 0 ? ret : 0;
}

void ssd_ring_exit(struct ssd_ring *r)
{
	io_uring_queue_exit(&r->ring);
}

/* One request: where it is and how much of it remains. */
struct ssd_req {
	uint64_t off;			/* file offset */
	uint64_t len;			/* bytes left */
	uint8_t *buf;			/* memory */
};

/*
 * Move the segments seg[0..nseg) (each len bytes between buf and the file
 * at off), up to the ring's depth of requests in flight across all of
 * them: many small segments cost one wait for the slowest, not one each.
 */
static int ssd_xfer_segs(struct ssd_ring *r, int fd, const struct ssd_seg *seg,
			 unsigned nseg, bool write, uint64_t *progress)
{
	struct ssd_req reqs[256];
	unsigned depth = r->depth > 256 ? 256 : r->depth;
	unsigned inflight = 0, i, si = 0;
	uint64_t next = 0;		/* bytes of seg[si] handed out so far */
	int err = 0;
	bool free_slot[256];

	for (i = 0; i < depth; i++)
		free_slot[i] = true;
	while (si < nseg && !seg[si].len)
		si++;

	while ((si < nseg && !err) || inflight) {
		/* top up the queue */
		while (!err && si < nseg && inflight < depth) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
			uint64_t n = seg[si].len - next;

			if (!sqe)
				break;
			if (n > r->chunk)
				n = r->chunk;
			for (i = 0; !free_slot[i]; i++)
				;
			free_slot[i] = false;
			reqs[i] = (struct ssd_req){ seg[si].off + next, n, seg[si].buf + next };
			if (write)
				io_uring_prep_write(sqe, fd, reqs[i].buf, n, reqs[i].off);
			else
				io_uring_prep_read(sqe, fd, reqs[i].buf, n, reqs[i].off);
			io_uring_sqe_set_data64(sqe, i);
			next += n;
			inflight++;
			if (next == seg[si].len) {
				next = 0;
				while (++si < nseg && !seg[si].len)
					;
			}
		}
		int ret = io_uring_submit_and_wait(&r->ring, 1);
		if (ret < 0 && ret != -EINTR) {
			if (!err)
				err = ret;
			if (!inflight)
				break;
		}
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&r->ring, head, cqe) {
			struct ssd_req *q = &reqs[cqe->user_data];
			int res = cqe->res;

			seen++;
			if (res == -EAGAIN || res == -EINTR)
				res = 0;	/* resubmit below */
			if (res < 0) {
				if (!err)
					err = res;
				free_slot[cqe->user_data] = true;
				inflight--;
				continue;
			}
			if (res == 0 && !write) {
				/* EOF: the rest reads as zeros */
				memset(q->buf, 0, q->len);
				res = (int)q->len;
			}
			q->off += (uint64_t)res;
			q->buf += res;
			q->len -= (uint64_t)res;
			if (progress)
				__atomic_add_fetch(progress, (uint64_t)res, __ATOMIC_RELAXED);
			if (q->len == 0 || err) {
				free_slot[cqe->user_data] = true;
				inflight--;
				continue;
			}
			/* short transfer: resubmit the remainder */
			struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
			if (!sqe) {
				if (!err)
					err = -EBUSY;
				free_slot[cqe->user_data] = true;
				inflight--;
				continue;
			}
			if (write)
				io_uring_prep_write(sqe, fd, q->buf, q->len, q->off);
			else
				io_uring_prep_read(sqe, fd, q->buf, q->len, q->off);
			io_uring_sqe_set_data64(sqe, cqe->user_data);
		}
		io_uring_cq_advance(&r->ring, seen);
	}
	return err;
}

int ssd_write(struct ssd_ring *r, int fd, const void *buf, uint64_t len,
	      uint64_t off, uint64_t *progress)
{
	struct ssd_seg s = { .off = off, .len = len, .buf = (uint8_t *)buf };

	return ssd_xfer_segs(r, fd, &s, 1, true, progress);
}

int ssd_write_segs(struct ssd_ring *r, int fd, const struct ssd_seg *seg, unsigned n,
		   uint64_t *progress)
{
	return ssd_xfer_segs(r, fd, seg, n, true, progress);
}

int ssd_read(struct ssd_ring *r, int fd, void *buf, uint64_t len, uint64_t off)
{
	struct ssd_seg s = { .off = off, .len = len, .buf = buf };

	return ssd_xfer_segs(r, fd, &s, 1, false, NULL);
}

int ssd_fdatasync(struct ssd_ring *r, int fd)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
	struct io_uring_cqe *cqe;
	int ret;

	if (!sqe)
		return -EBUSY;
	io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
	ret = io_uring_submit_and_wait(&r->ring, 1);
	if (ret < 0)
		return ret;
	ret = io_uring_wait_cqe(&r->ring, &cqe);
	if (ret < 0)
		return ret;
	ret = cqe->res;
	io_uring_cqe_seen(&r->ring, cqe);
	return ret < 0 ? ret : 0;
}

void ssd_fdatasync_many(struct ssd_ring *r, const int *fd, int *res, unsigned n)
{
	unsigned sent = 0, inflight = 0, i;

	while (sent < n || inflight) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		int ret;

		while (sent < n && inflight < r->depth) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);

			if (!sqe)
				break;
			io_uring_prep_fsync(sqe, fd[sent], IORING_FSYNC_DATASYNC);
			io_uring_sqe_set_data64(sqe, sent);
			sent++;
			inflight++;
		}
		ret = io_uring_submit_and_wait(&r->ring, 1);
		if (ret < 0 && ret != -EINTR && sent < n) {
			/* the ring takes no more: the rest are synced in this
			 * thread, those in flight reaped */
			for (i = sent; i < n; i++)
				res[i] = fdatasync(fd[i]) < 0 ? -errno : 0;
			sent = n;
		}
		io_uring_for_each_cqe(&r->ring, head, cqe) {
			res[cqe->user_data] = cqe->res < 0 ? cqe->res : 0;
			inflight--;
			seen++;
		}
		io_uring_cq_advance(&r->ring, seen);
	}
}
