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
 *  read: what remains of the queue. */
#define TIERFS_XATTR_RESTORE_ORDER	"user.tierfs.restore_order"
/** Directory, write: "start" or "stop" prefetching. */
#define TIERFS_XATTR_PREFETCH		"user.tierfs.prefetch"
/** File, write (any value): enqueue this file (single-hint mode). */
#define TIERFS_XATTR_RESTORE_NEXT	"user.tierfs.restore_next"
/** File, read-only: tiers holding a copy, fastest first ("host,ssd"). */
#define TIERFS_XATTR_TIER		"user.tierfs.tier"
/** File, read-only: life-cycle state per tier ("host:FLUSHED,ssd:CURRENT"). */
#define TIERFS_XATTR_STATE		"user.tierfs.state"
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

#endif /* TIERFS_PUBLIC_H */
