/*
 * tierfs_share.h - the protocol between libtierfs and the daemon for a
 * shared GPU cache (-o gpu_share, tierfs-gpu(7)).  Private: not installed;
 * only libtierfs speaks it, and both sides come from one tree.
 *
 * 1. TIERFS_IOC_GPU_SHARE on any regular file of the mount returns the
 *    name of the daemon's share socket (an abstract AF_UNIX
 *    SOCK_SEQPACKET socket), the cache's id and the GPU.  Errors: ENODEV
 *    (no GPU tier), EOPNOTSUPP (gpu_share is off), EAGAIN (the GPU cache is
 *    still being mapped: ask again later), EPERM (the caller is neither
 *    root nor the daemon's user).
 * 2. The client connects.  The daemon checks the peer's credentials as in
 *    1 and sends a struct share_hello; when its err is 0, then nchunks
 *    descriptors (SCM_RIGHTS), in messages of a struct share_batch and at
 *    most SHARE_BATCH_MAX descriptors each: chunk i of the cache is
 *    [i * chunk, min((i + 1) * chunk, size)).  The client maps them all,
 *    in order, into one reservation of `size` bytes.
 * 3. Per transfer: TIERFS_IOC_GPU_SPAN (conn_id from the hello) places
 *    (write) or finds (read) the file range in the GPU cache and pins it;
 *    it returns the range's offset in the cache (cache_off), its length
 *    (n; a read is cut at end of file) and a token.  The client copies
 *    n bytes between its buffer and cache base + cache_off, waits for the
 *    copy, and ends the span on the socket: a struct share_end, answered
 *    by a struct share_result (bytes committed, or -errno).  The span
 *    ioctl fails with EAGAIN when the range is not in the GPU tier (use
 *    TIERFS_IOC_PWRITE_GPU / PREAD_GPU instead) and ESTALE when conn_id is
 *    not a live connection.  A span not ended when its connection closes
 *    (the client exited) is ended as failed.
 * cache_id names one daemon's cache: a client whose mapping has another
 * id must map again.
 */
#ifndef TIERFS_SHARE_H
#define TIERFS_SHARE_H

#include <stdint.h>
#include <sys/ioctl.h>

#define SHARE_MAGIC		0x48534654u	/* "TFSH" */
#define SHARE_VERSION		3	/* 2: SHARE_END_NOREPLY, 3: SPANV */
#define SHARE_VERSION_MIN	1	/* the oldest a client still speaks */
#define SHARE_NAME_MAX		64
#define SHARE_BATCH_MAX		64

struct tierfs_gpu_share {
	char socket[SHARE_NAME_MAX];	/* abstract name, without the NUL */
	uint64_t cache_id;
	int32_t device;			/* CUDA ordinal of the cache */
	uint32_t reserved;
};

#define TIERFS_SPAN_WRITE	1u

struct tierfs_gpu_span {
	uint64_t conn_id;		/* in: from share_hello */
	uint64_t file_off;		/* in */
	uint64_t len;			/* in */
	uint32_t flags;			/* in: TIERFS_SPAN_WRITE or 0 */
	uint32_t reserved;
	uint64_t cache_id;		/* out */
	uint64_t token;			/* out: 0 when n == 0 */
	uint64_t cache_off;		/* out */
	uint64_t n;			/* out */
};

#define TIERFS_IOC_GPU_SHARE	_IOR('T', 3, struct tierfs_gpu_share)
#define TIERFS_IOC_GPU_SPAN	_IOWR('T', 4, struct tierfs_gpu_span)

/*
 * Version 3: TIERFS_IOC_GPU_SPANV, one span over up to SHARE_SPANV_MAX
 * ranges of one file (a vectored call), placed or found at once, ended by
 * one struct share_end (its token), which commits them all: the client
 * copies every range and waits once.  A write's ranges come sorted by
 * file offset and do not overlap; their lengths add up to at most
 * TIERFS_GPU_IO_MAX (E2BIG).  A read's n are cut at end of file.  The
 * errors are the span ioctl's; EAGAIN means the daemon must copy them all.
 */
#define SHARE_SPANV_MAX		256

struct tierfs_gpu_spanv_range {
	uint64_t file_off;		/* in */
	uint64_t len;			/* in, > 0 */
	uint64_t cache_off;		/* out */
	uint64_t n;			/* out */
};

struct tierfs_gpu_spanv {
	uint64_t conn_id;		/* in: from share_hello */
	uint32_t flags;			/* in: TIERFS_SPAN_WRITE or 0 */
	uint32_t nranges;		/* in: 1..SHARE_SPANV_MAX */
	uint64_t cache_id;		/* out */
	uint64_t token;			/* out: 0 when nothing is read */
	struct tierfs_gpu_spanv_range r[SHARE_SPANV_MAX];
};

#define TIERFS_IOC_GPU_SPANV	_IOWR('T', 7, struct tierfs_gpu_spanv)

struct share_hello {
	uint32_t magic, version;
	int32_t err;			/* 0, or a positive errno: no chunks */
	int32_t device;
	uint64_t cache_id;
	uint64_t conn_id;
	uint64_t size;			/* bytes of the cache */
	uint64_t chunk;			/* bytes per chunk */
	uint64_t nchunks;
};

struct share_batch {
	uint32_t first;			/* index of the first chunk */
	uint32_t count;			/* descriptors attached */
};

/*
 * SHARE_END_NOREPLY (version 2): the daemon sends no share_result.  A read
 * span's end only releases the range (its bytes are already copied), so
 * the client need not wait for it; a write's end commits and is answered.
 */
#define SHARE_END_NOREPLY	1u

struct share_end {
	uint64_t token;
	int32_t ok;			/* 1: the copy completed */
	uint32_t flags;			/* SHARE_END_NOREPLY or 0 */
};

struct share_result {
	int64_t result;			/* bytes committed, or -errno */
};

#endif /* TIERFS_SHARE_H */
