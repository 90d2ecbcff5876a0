/*
 * tierfs.h - the public interface of tierfs: extended attribute names and
 * the GPU zero-copy ioctl ABI.  Installed; plain C, no CUDA needed.
 */
#ifndef TIERFS_PUBLIC_H
#define TIERFS_PUBLIC_H

#include <stdint.h>
#include <sys/ioctl.h>

/** Prefix of every tierfs extended attribute. */
#define TIERFS_XATTR_PREFIX		"user.tierfs."
/** Directory, write: names (one per line) appended to the restore queue;
 *  read: what remains of the queue (a list over 64 KiB: E2BIG, read it in
 *  pages). */
#define TIERFS_XATTR_RESTORE_ORDER	"user.tierfs.restore_order"
/** Directory, read-only: TIERFS_XATTR_RESTORE_ORDER_PAGE followed by N in
 *  decimal ("user.tierfs.restore_order.0") reads the directory's queue from
 *  its N-th entry (0: the first): as many whole lines as fit in
 *  TIERFS_RESTORE_ORDER_PAGE_MAX bytes, at least one; an empty value past
 *  the end.  The next page starts at N plus the lines of this one. */
#define TIERFS_XATTR_RESTORE_ORDER_PAGE	"user.tierfs.restore_order."
#define TIERFS_RESTORE_ORDER_PAGE_MAX	65536
/** Directory, write: "start" or "stop" prefetching. */
#define TIERFS_XATTR_PREFETCH		"user.tierfs.prefetch"
/** File, write (any value): enqueue this file (single-hint mode). */
#define TIERFS_XATTR_RESTORE_NEXT	"user.tierfs.restore_next"
/** File, read/write: the CUDA ordinal of the GPU that will read it back
 * ("1"; "none" forgets it).  Read: that, or the GPU its last ioctl write
 * came from.  A mount over several GPUs (-o gpu=0:1) prefetches the file
 * into that GPU's part of the cache. */
#define TIERFS_XATTR_RESTORE_DEVICE	"user.tierfs.restore_device"
/** File, read-only: tiers holding a copy, fastest first ("host,ssd"). */
#define TIERFS_XATTR_TIER		"user.tierfs.tier"
/** File, read-only: life-cycle state per tier ("host:FLUSHED,ssd:CURRENT"). */
#define TIERFS_XATTR_STATE		"user.tierfs.state"
/** File, write (any value): drop its cached copies that are on the SSD
 *  (EBUSY: a copy is not flushed yet, or in use). */
#define TIERFS_XATTR_EVICT		"user.tierfs.evict"
/** File or directory, write (any value): flush now what waits for its age
 *  (-o flush_age): the file's data, or on a directory every file of the
 *  mount that waits.  Returns at once; user.tierfs.state (ssd:CURRENT) or
 *  the statistics' flush_backlog and flush_queued (0) tell when it is on
 *  the SSD. */
#define TIERFS_XATTR_FLUSH		"user.tierfs.flush"
/** File, read-only: "SHARED SIZE": bytes of its backing file (as flushed)
 *  whose extents other files share too (-o dedup), and the file's size. */
#define TIERFS_XATTR_SHARED		"user.tierfs.shared"
/** Directory, write (any value): commit it as a checkpoint set: every
 *  regular file in it is written and closed (EBUSY: one is open for
 *  writing, the log names it), their flush is asked for, and the set's
 *  files, sizes and times are recorded durably beside them (tierfs-hints(7),
 *  CHECKPOINT SETS). */
#define TIERFS_XATTR_COMMIT		"user.tierfs.commit"
/** Directory, read-only: a committed set's state, one "KEY VALUE" a line:
 *  committed TIME, files N, bytes N, then per level ("cache", "ssd", "pfs")
 *  "complete [TIME]", "pending N", "incomplete N" or "off"; "level L" (the
 *  last complete level, or "none"); "file NAME WHAT" for each file that
 *  keeps a level from being complete.  ENODATA: not a committed set. */
#define TIERFS_XATTR_SET		"user.tierfs.set"
/** Directory, read/write: keep the N newest sets complete at ssd in it on
 *  the SSD ("0": off); read: the number in effect (-o keep_sets). */
#define TIERFS_XATTR_KEEP		"user.tierfs.keep"
/** Mount root, read-only: statistics as JSON. */
#define TIERFS_XATTR_STATS		"user.tierfs.stats"

/*
 * GPU zero-copy I/O (tierfs-gpu(7)).  The caller hands tierfs a CUDA IPC
 * memory handle of the allocation holding its buffer (cudaIpcGetMemHandle /
 * cuIpcGetMemHandle of the allocation's base), the buffer's offset inside
 * that allocation, a length and a file offset.  The data moves
 * device-to-device between the buffer and the file's GPU cache copy.
 * The struct has a fixed size and layout (FUSE restricted ioctls encode the
 * size in the command number).
 */
#define TIERFS_IPC_HANDLE_SIZE	64

struct tierfs_gpu_io {
	uint8_t handle[TIERFS_IPC_HANDLE_SIZE];	/**< cudaIpcMemHandle_t bytes */
	uint64_t handle_off;	/**< buffer offset inside the allocation */
	uint64_t len;		/**< bytes to move */
	uint64_t file_off;	/**< file offset */
	uint32_t flags;		/**< 0 (reserved for future use) */
	uint32_t device;	/**< CUDA device ordinal of the allocation */
};

#define TIERFS_IOC_MAGIC	'T'
/** Write len bytes from GPU memory at file_off.  Returns bytes written. */
#define TIERFS_IOC_PWRITE_GPU	_IOW(TIERFS_IOC_MAGIC, 1, struct tierfs_gpu_io)
/** Read up to len bytes at file_off into GPU memory.  Returns bytes read
 *  (short at end of file). */
#define TIERFS_IOC_PREAD_GPU	_IOW(TIERFS_IOC_MAGIC, 2, struct tierfs_gpu_io)
/** Most bytes one ioctl moves (the count must fit its int result): a longer
 *  request returns a short count, as write(2) does past its limit. */
#define TIERFS_GPU_IO_MAX	(1ULL << 30)

/*
 * Vectored GPU I/O: one ioctl moves a list of segments between GPU memory
 * and one file.  The allocations go in a small table (a caching allocator
 * puts many buffers in few allocations: the daemon opens each once per
 * call); each segment names its allocation by index.  Fixed size, as
 * above: libtierfs splits longer lists into several ioctls.  There are
 * about as many handles as segments: a caching allocator gives each large
 * tensor an allocation of its own.  Two earlier layouts (16 or 64 handles
 * and 256 segments, no `moved`, the count the ioctl's result, at most
 * TIERFS_GPU_IO_MAX bytes a call) are still taken by the daemon.
 */
#define TIERFS_GPU_VEC_HANDLES	128	/* allocations per ioctl */
#define TIERFS_GPU_VEC_SEGS	192	/* segments per ioctl */

struct tierfs_gpu_vec_handle {
	uint8_t handle[TIERFS_IPC_HANDLE_SIZE];	/**< cudaIpcMemHandle_t bytes */
	uint32_t device;	/**< CUDA device ordinal of the allocation */
	uint32_t reserved;	/**< 0 */
};

struct tierfs_gpu_vec_seg {
	uint64_t handle_off;	/**< buffer offset inside the allocation */
	uint64_t len;		/**< bytes to move, > 0 */
	uint64_t file_off;	/**< file offset */
	uint32_t handle;	/**< index into handles[], < nhandles */
	uint32_t flags;		/**< 0 */
};

struct tierfs_gpu_vec {
	uint32_t nhandles;	/**< entries of handles[] in use, 1..128, each
				 *   used by some segment */
	uint32_t nsegs;		/**< entries of segs[] in use, 1..192 */
	uint32_t flags;		/**< 0 (reserved for future use) */
	uint32_t reserved;	/**< 0 */
	uint64_t moved;		/**< out: the bytes moved (in: ignored) */
	uint64_t reserved2;	/**< 0 */
	struct tierfs_gpu_vec_handle handles[TIERFS_GPU_VEC_HANDLES];
	struct tierfs_gpu_vec_seg segs[TIERFS_GPU_VEC_SEGS];
};

/** Most bytes one vectored ioctl moves (its count comes back in `moved`,
 *  not in the ioctl's int result). */
#define TIERFS_GPU_VEC_MAX	(1ULL << 40)

/** Write every segment (write segments' file ranges must not overlap; any
 *  order).  All checks come before any byte moves.  Returns 0, with the
 *  total in `moved` (the sum of the lengths, at most TIERFS_GPU_VEC_MAX:
 *  E2BIG past it). */
#define TIERFS_IOC_PWRITEV_GPU	_IOWR(TIERFS_IOC_MAGIC, 5, struct tierfs_gpu_vec)
/** Read every segment (file ranges may overlap).  Returns 0, with the total
 *  bytes read in `moved`: a segment reaching past end of file reads only up
 *  to it, and its buffer's bytes past that are left as they were. */
#define TIERFS_IOC_PREADV_GPU	_IOWR(TIERFS_IOC_MAGIC, 6, struct tierfs_gpu_vec)
/** Most segments one libtierfs vectored call takes (iovcnt). */
#define TIERFS_GPU_IOV_MAX	65536

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#include <stddef.h>
/* The ABI, checked wherever the header is compiled (daemon and library). */
_Static_assert(sizeof(struct tierfs_gpu_io) == 96, "struct tierfs_gpu_io is 96 bytes");
_Static_assert(offsetof(struct tierfs_gpu_io, handle_off) == 64 &&
	       offsetof(struct tierfs_gpu_io, len) == 72 &&
	       offsetof(struct tierfs_gpu_io, file_off) == 80 &&
	       offsetof(struct tierfs_gpu_io, flags) == 88 &&
	       offsetof(struct tierfs_gpu_io, device) == 92,
	       "struct tierfs_gpu_io layout");
_Static_assert(sizeof(struct tierfs_gpu_vec_handle) == 72 &&
	       offsetof(struct tierfs_gpu_vec_handle, device) == 64,
	       "struct tierfs_gpu_vec_handle layout");
_Static_assert(sizeof(struct tierfs_gpu_vec_seg) == 32 &&
	       offsetof(struct tierfs_gpu_vec_seg, len) == 8 &&
	       offsetof(struct tierfs_gpu_vec_seg, file_off) == 16 &&
	       offsetof(struct tierfs_gpu_vec_seg, handle) == 24 &&
	       offsetof(struct tierfs_gpu_vec_seg, flags) == 28,
	       "struct tierfs_gpu_vec_seg layout");
_Static_assert(sizeof(struct tierfs_gpu_vec) == 15392 &&
	       offsetof(struct tierfs_gpu_vec, moved) == 16 &&
	       offsetof(struct tierfs_gpu_vec, handles) == 32 &&
	       offsetof(struct tierfs_gpu_vec, segs) == 32 + 128 * 72,
	       "struct tierfs_gpu_vec layout");
/* FUSE restricted ioctls: the size must fit _IOC_SIZE (14 bits) */
_Static_assert(sizeof(struct tierfs_gpu_vec) < 16384, "struct tierfs_gpu_vec too big");
#endif

#ifndef TIERFS_NO_CLIENT_API
/*
 * ---- libtierfs: the client library (-ltierfs, pkg-config libtierfs) -----
 *
 * Define TIERFS_NO_CLIENT_API before including this header to get the ABI
 * alone.  Every call returns -1 with errno set on failure, like pwrite(2)
 * and pread(2); see tierfs-gpu(7) for the full list of errors.
 */
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * tierfs_pwrite_gpu - write len bytes from GPU memory at dev_ptr to fd at
 * offset off, device to device.  dev_ptr is a CUDA device address inside
 * memory from cuMemAlloc/cudaMalloc (any offset in the allocation; VMM,
 * pool and managed memory cannot be exported).  Orders itself after the
 * work queued on the legacy default stream of the buffer's context (as
 * cudaMemcpy does); work on other streams that touches the buffer must be
 * complete.  Returns len (the library repeats short transfers and splits
 * requests into TIERFS_GPU_IO_MAX pieces) or -1 with errno:
 *   ENOTTY  fd is not on tierfs;  EBADF  fd is not open for writing;
 *   ENODEV  the mount has no GPU tier, or there is no CUDA driver here;
 *   EXDEV   the buffer is on another GPU than the mount's GPU tier;
 *   EINVAL  dev_ptr is not cuMemAlloc/cudaMalloc memory, the range leaves
 *           its allocation, or off/len are out of range;
 *   and the errors of write(2) (ENOSPC, EIO, ...).
 */
ssize_t tierfs_pwrite_gpu(int fd, const void *dev_ptr, size_t len, off_t off);
/*
 * tierfs_pread_gpu - read up to len bytes of fd at offset off into GPU
 * memory at dev_ptr.  Returns the count (short only at end of file, 0 at
 * or past it) or -1 with errno, as tierfs_pwrite_gpu (EBADF: not open for
 * reading).  The data is in place when it returns.
 */
ssize_t tierfs_pread_gpu(int fd, void *dev_ptr, size_t len, off_t off);
/* One segment of a vectored call: len bytes at dev_ptr <-> file offset off. */
struct tierfs_gpu_iovec {
	void *dev_ptr;		/**< CUDA device address (cuMemAlloc memory) */
	size_t len;		/**< bytes, > 0 */
	off_t off;		/**< file offset */
};
/*
 * tierfs_pwritev_gpu - write iovcnt segments of GPU memory to fd, each at
 * its own file offset (any order; the file ranges must not overlap), in
 * one ioctl per TIERFS_GPU_VEC_SEGS segments, TIERFS_GPU_VEC_HANDLES
 * allocations or TIERFS_GPU_VEC_MAX bytes (a longer segment is cut).  Each
 * distinct allocation is exported once (and cached, as tierfs_pwrite_gpu
 * does).  Every segment is checked before any byte moves; a list that fits
 * one ioctl is written with the file locked throughout, so no flush commits
 * a version holding part of it.  Returns the sum of the lengths, or -1 with
 * errno (after a failure past the checks some segments may be written):
 *   EINVAL  iovcnt < 1 or > TIERFS_GPU_IOV_MAX; a segment of length 0, with
 *           off < 0, past INT64_MAX, or a NULL or non-exportable dev_ptr,
 *           or leaving its allocation; the lengths add up past SSIZE_MAX;
 *           two file ranges overlap;
 *   and the errors of tierfs_pwrite_gpu (ENOTTY, EBADF, ENODEV, EXDEV, ...).
 */
ssize_t tierfs_pwritev_gpu(int fd, const struct tierfs_gpu_iovec *iov, int iovcnt);
/*
 * tierfs_preadv_gpu - read iovcnt segments of fd into GPU memory.  File
 * ranges may overlap.  Returns the bytes read in all (less than the sum of
 * the lengths only where segments reach past end of file: their buffers'
 * bytes past it are left untouched) or -1 with errno, as
 * tierfs_pwritev_gpu (without the overlap check; EBADF: not open for
 * reading).
 */
ssize_t tierfs_preadv_gpu(int fd, const struct tierfs_gpu_iovec *iov, int iovcnt);
/*
 * tierfs_is_tierfs - 1 if fd is a file or directory on a tierfs mount, 0
 * if not, -1 with errno if fd cannot be examined (EBADF, ...).
 */
int tierfs_is_tierfs(int fd);

/*
 * Restore hints and statistics (tierfs-hints(7)); plain attribute calls,
 * no GPU needed.  ENOTSUP: the path is not on a tierfs mount.
 *
 * tierfs_restore_order - append names[0..n) (files of directory dir, in
 * the order they will be read back; files not written yet are fine) to the
 * mount's restore queue.  Every name is checked first as the daemon checks
 * it (a plain name: no '/', newline, not "." or "..", not beginning with
 * ".tierfs", 1 to 255 bytes of UTF-8; an existing one a regular file): on
 * a bad one nothing is sent, *bad (if bad is not NULL) is its index, and
 * the call fails with EINVAL.  Lists longer than the kernel's 64 KiB per
 * value go in several writes.  Returns 0 or -1 with errno: EDQUOT when a
 * write would pass a bound on the queue (-o hint_max_user, -o hint_max):
 * that write appends nothing, the writes before it of a long list stay.
 */
int tierfs_restore_order(const char *dir, const char *const *names, size_t n, size_t *bad);
/*
 * tierfs_restore_queue - the entries of directory dir still in the restore
 * queue, in order, however many: read in pages of 64 KiB at most
 * (TIERFS_XATTR_RESTORE_ORDER_PAGE).  Returns a NULL-terminated array of
 * names, *n (if n is not NULL) their count, all in one block: free() the
 * array alone.  NULL with errno on failure.  Entries consumed while it
 * reads move the ones after them forward: such a listing may leave names
 * out.
 */
char **tierfs_restore_queue(const char *dir, size_t *n);
/*
 * tierfs_stats - the statistics of the tierfs mount holding mount (its
 * mount point, or any file or directory on it), as JSON text (see
 * tierfs-hints(7), STATISTICS): a NUL-terminated string to free(), or
 * NULL with errno (ENOTSUP: not on a tierfs mount).
 */
char *tierfs_stats(const char *mount);
/*
 * tierfs_wait_flushed - wait until what was written is on the SSD: for a
 * regular file, until its SSD copy is current; for a directory (any one of
 * the mount), until the whole mount's flush backlog is empty, no flush
 * runs and no close is pending (the release of a file closed before the
 * call, which the kernel sends after close returns).  What waits for its
 * age (-o flush_age) is asked for at once (user.tierfs.flush).
 * timeout_ms < 0 waits for ever.  Returns 0, or -1 with errno (ETIMEDOUT
 * after timeout_ms; ENOTCONN when the daemon stopped
 * meanwhile, e.g. on SIGTERM: what it wrote before its exit, `tierfsctl
 * wait` tells).  The call holds the path open: a plain umount(8) of the
 * mount fails with EBUSY meanwhile, so nothing is given up under it.
 */
int tierfs_wait_flushed(const char *path, int timeout_ms);
/*
 * Checkpoint sets (tierfs-hints(7), CHECKPOINT SETS).  level is "cache",
 * "ssd" or "pfs" (EINVAL otherwise).
 *
 * tierfs_commit - commit directory set as one checkpoint: every regular
 * file in it is written and closed; their flush starts now.  Returns 0 or
 * -1 with errno: EBUSY while a file in it is open for writing (the
 * daemon's log names it), EINVAL for a directory without files or the
 * mount's root, ENOTSUP off tierfs.
 */
int tierfs_commit(const char *set);
/*
 * tierfs_latest - the newest set directly under directory parent that is
 * complete at level (the restart target): its path (parent/NAME), a
 * string to free(); NULL with errno ENOENT when there is none, or the
 * errors of opendir(3) and getxattr(2).
 */
char *tierfs_latest(const char *parent, const char *level);
/*
 * tierfs_wait_set - wait until set is complete at level.  timeout_ms < 0
 * waits for ever.  Returns 0, or -1 with errno: EIO when a file of the set
 * is lost (missing, changed since its commit, failed to reach DIR: the
 * set's user.tierfs.set names it); ETIMEDOUT (files whose flush fails are
 * retried until then); ENODATA: not a committed set; EINVAL: level pfs
 * where the set does not go to DIR.
 */
int tierfs_wait_set(const char *set, const char *level, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* TIERFS_NO_CLIENT_API */

#endif /* TIERFS_PUBLIC_H */
