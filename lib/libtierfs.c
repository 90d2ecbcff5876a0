/*
 * libtierfs.c - the client side of the tierfs GPU zero-copy ioctl
 * (fs/tierfs.h, tierfs-gpu(7)).
 *
 * tierfs_pwrite_gpu(fd, dev_ptr, len, off) and tierfs_pread_gpu() turn a
 * device pointer into what TIERFS_IOC_PWRITE_GPU / TIERFS_IOC_PREAD_GPU
 * carry: the CUDA IPC handle of the cuMemAlloc/cudaMalloc allocation that
 * holds the pointer (gpu_ipc_export: only whole allocations can be
 * exported), the pointer's offset inside it, a length and a file offset.
 *
 * Per call:
 *  1. Arguments: off >= 0, len <= SSIZE_MAX, off + len <= INT64_MAX, else
 *     EINVAL; len == 0 returns 0 once fd has passed step 2.
 *  2. The fd must be on tierfs (ENOTTY otherwise): an IPC handle is a
 *     capability for the whole allocation, and is not handed to another
 *     file system's ioctl.  The verdict (tierfs_is_tierfs) is cached per
 *     mount (st_dev and mount id, read with statx(AT_STATX_DONT_SYNC): no
 *     FUSE round trip).
 *  3. The allocation: a cache of exported handles (EXPORT_CACHE_MAX
 *     entries, least recently used out) keyed by the driver's process-wide
 *     unique buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID), so an allocation
 *     freed and replaced at the same address is exported again, never sent
 *     with its predecessor's handle.  A miss calls gpu_ipc_export.
 *  4. The range [dev_ptr, dev_ptr + len) must lie in the allocation.
 *  5. The legacy default stream of the buffer's context is synchronised,
 *     so work queued there before the call is complete (the daemon copies
 *     on its own stream, in another process, which nothing else orders).
 *     And what write(2) left dirty in the kernel's writeback cache over
 *     [off, off + len) is written back (sync_file_range; no fsync: nothing
 *     is made durable), so that a GPU read sees it and a later writeback
 *     does not overwrite what the GPU wrote.  After a GPU write the daemon
 *     itself drops the kernel's cached pages of the range.
 *  6. ioctls of at most TIERFS_GPU_IO_MAX bytes, repeated on short counts
 *     (a read stops at end of file) and on EINTR (both commands are
 *     idempotent).  An error after some progress returns the progress.
 *     An EINVAL on a handle that came from the cache (not freshly exported)
 *     drops that entry and retries once with a fresh export.
 *
 * Without CUDA (built without it, or no libcuda.so.1 at run time) the
 * calls fail with ENODEV after steps 1 and 2.
 *
 * Threads: every entry point is thread-safe; the caches have one mutex
 * each, held only for table look-ups, never across a driver call or an
 * ioctl.  The driver is loaded at run time (gpu/gpu_dl.c): nothing here
 * links libcuda.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "gpu.h"
#include "tierfs.h"
#ifdef HAVE_CUDA
#include "gpu_dl.h"
#endif

#define TIERFS_EXPORT __attribute__((visibility("default")))

_Static_assert(TIERFS_IPC_HANDLE_SIZE == GPU_IPC_HANDLE_SIZE,
	       "IPC handle sizes of tierfs.h and gpu.h");

#define FUSE_SUPER_MAGIC_	0x65735546
#define EXPORT_CACHE_MAX	32	/* exported allocations */
#define MOUNT_CACHE_MAX		16	/* mounts with a verdict */

/* ---- which fds are on tierfs ------------------------------------------ */

/*
 * The file system type of fd's mount in /proc/self/mountinfo is
 * "fuse.tierfs" (the daemon mounts with subtype=tierfs): 1, else 0.
 */
static int mountinfo_is_tierfs(int fd)
{
	struct statx stx;
	char line[4096], *sep, fstype[64];
	unsigned long long id;
	int ret = 0;
	FILE *f;

	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_MNT_ID,
		  &stx) < 0 || !(stx.stx_mask & STATX_MNT_ID))
		return 0;
	f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llu", &id) != 1 || id != stx.stx_mnt_id)
			continue;
		sep = strstr(line, " - ");
		if (sep && sscanf(sep + 3, "%63s", fstype) == 1)
			ret = strcmp(fstype, "fuse.tierfs") == 0;
		break;
	}
	fclose(f);
	return ret;
}

/*
 * tierfs_is_tierfs - 1: fd is on a tierfs mount (a FUSE file system that
 * answers tierfs's own attributes; when the caller may not read the
 * attributes, one whose mount says "fuse.tierfs"); 0: it is not; -1 with
 * errno: fd cannot be examined (EBADF: not open, or opened O_PATH).
 */
TIERFS_EXPORT int tierfs_is_tierfs(int fd)
{
	static const char *const probes[] = {
		TIERFS_XATTR_STATE,		/* regular files */
		TIERFS_XATTR_PREFETCH,		/* directories */
	};
	struct statfs sf;
	bool denied = false;
	size_t i;

	if (fstatfs(fd, &sf) < 0)
		return -1;
	if ((unsigned long)sf.f_type != FUSE_SUPER_MAGIC_)
		return 0;
	for (i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
		if (fgetxattr(fd, probes[i], NULL, 0) >= 0 || errno == ERANGE)
			return 1;
		switch (errno) {
		case ENODATA:		/* not this kind of file, or not tierfs */
			break;
		case EACCES:		/* default_permissions: unreadable file */
		case EPERM:
			denied = true;
			break;
		case ENOTSUP:		/* a FUSE file system without xattrs */
#if EOPNOTSUPP != ENOTSUP
		case EOPNOTSUPP:
#endif
			return 0;
		default:
			return -1;
		}
	}
	return denied ? mountinfo_is_tierfs(fd) : 0;
}

static struct {
	pthread_mutex_t lock;
	struct mount_verdict {
		dev_t dev;
		uint64_t mnt_id;	/* 0: unknown (old kernel) */
		bool tierfs;
	} m[MOUNT_CACHE_MAX];
	int n, next;
} mounts = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* 0 if fd is on tierfs; else -1 with errno ENOTTY or statx's error. */
static int check_fd(int fd)
{
	struct statx stx;
	dev_t dev;
	uint64_t mnt_id;
	int i, v;

	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC,
		  STATX_TYPE | STATX_MNT_ID, &stx) < 0)
		return -1;
	dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
	mnt_id = (stx.stx_mask & STATX_MNT_ID) ? stx.stx_mnt_id : 0;
	pthread_mutex_lock(&mounts.lock);
	for (i = 0; i < mounts.n; i++) {
		if (mounts.m[i].dev == dev && mounts.m[i].mnt_id == mnt_id) {
			v = mounts.m[i].tierfs;
			pthread_mutex_unlock(&mounts.lock);
			goto verdict;
		}
	}
	pthread_mutex_unlock(&mounts.lock);

	v = tierfs_is_tierfs(fd);
	if (v < 0)
		return -1;
	pthread_mutex_lock(&mounts.lock);
	i = mounts.n < MOUNT_CACHE_MAX ? mounts.n++ : mounts.next++ % MOUNT_CACHE_MAX;
	mounts.m[i].dev = dev;
	mounts.m[i].mnt_id = mnt_id;
	mounts.m[i].tierfs = v;
	pthread_mutex_unlock(&mounts.lock);
verdict:
	if (!v) {
		errno = ENOTTY;
		return -1;
	}
	return 0;
}

/* ---- exported allocations -------------------------------------------- */

struct xent {
	uint64_t id;		/* driver buffer id; 0: slot free */
	uint64_t base, size;
	int device;
	uint8_t handle[TIERFS_IPC_HANDLE_SIZE];
	uint64_t used;		/* LRU tick */
};

static struct {
	pthread_mutex_t lock;
	struct xent e[EXPORT_CACHE_MAX];
	uint64_t tick;
} xcache = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* What the driver says about one pointer, without exporting anything. */
struct ptr_info {
	uint64_t id;		/* buffer id, 0: not device memory / unknown */
	void *ctx;		/* owning context (CUcontext), or NULL */
};

static void ptr_query(uint64_t p, struct ptr_info *pi)
{
	pi->id = 0;
	pi->ctx = NULL;
#ifdef HAVE_CUDA
	CUpointer_attribute attrs[] = {
		CU_POINTER_ATTRIBUTE_BUFFER_ID,
		CU_POINTER_ATTRIBUTE_CONTEXT,
	};
	unsigned long long id = 0;
	CUcontext ctx = NULL;
	void *data[] = { &id, &ctx };

	if (!gpu_dl_loaded())	/* nothing exported yet: no driver to ask */
		return;
	/* not an error for host or unknown pointers: attributes stay 0 */
	if (cuPointerGetAttributes(2, attrs, data, (CUdeviceptr)p) !=
	    CUDA_SUCCESS)
		return;
	pi->id = id;
	pi->ctx = ctx;
#else
	(void)p;
#endif
}

/*
 * Make work queued on the legacy default stream of ctx complete before the
 * daemon touches the buffer.  Returns 0 or -1 with errno (EIO).
 */
static int sync_buffer(void *ctx)
{
#ifdef HAVE_CUDA
	CUcontext popped;
	CUresult r;

	if (!ctx || !gpu_dl_loaded())
		return 0;
	if (cuCtxPushCurrent((CUcontext)ctx) != CUDA_SUCCESS) {
		errno = EIO;
		return -1;
	}
	r = cuStreamSynchronize(NULL);
	cuCtxPopCurrent(&popped);
	if (r != CUDA_SUCCESS) {
		errno = r == CUDA_ERROR_OUT_OF_MEMORY ? ENOMEM : EIO;
		return -1;
	}
#else
	(void)ctx;
#endif
	return 0;
}

static void xcache_drop(uint64_t id)
{
	int i;

	pthread_mutex_lock(&xcache.lock);
	for (i = 0; i < EXPORT_CACHE_MAX; i++)
		if (xcache.e[i].id == id)
			xcache.e[i].id = 0;
	pthread_mutex_unlock(&xcache.lock);
}

/*
 * The allocation holding p: from the cache (*cached true) or exported now.
 * Fills out (handle, base, size, device) and *pi.  Returns 0 or -1 with
 * errno: ENODEV (no CUDA), EINVAL (not exportable device memory), EIO.
 */
static int resolve(uint64_t p, struct xent *out, struct ptr_info *pi,
		   bool *cached, bool no_cache)
{
	uint64_t base = 0, size = 0;
	int i, victim, dev = -1, ret;

	ptr_query(p, pi);
	if (pi->id && !no_cache) {
		pthread_mutex_lock(&xcache.lock);
		for (i = 0; i < EXPORT_CACHE_MAX; i++) {
			struct xent *x = &xcache.e[i];

			if (x->id == pi->id && p >= x->base &&
			    p - x->base < x->size) {
				x->used = ++xcache.tick;
				*out = *x;
				*cached = true;
				pthread_mutex_unlock(&xcache.lock);
				return 0;
			}
		}
		pthread_mutex_unlock(&xcache.lock);
	}

	*cached = false;
	ret = gpu_ipc_export(p, out->handle, &base, &size, &dev);
	if (ret) {
		errno = ret == -EOPNOTSUPP ? ENODEV : -ret;
		return -1;
	}
	out->base = base;
	out->size = size;
	out->device = dev;
	if (!pi->id)		/* the driver is loaded now: ask again */
		ptr_query(p, pi);
	out->id = pi->id;
	if (!out->id)		/* cannot tell it from a successor: no cache */
		return 0;

	pthread_mutex_lock(&xcache.lock);
	victim = 0;
	for (i = 0; i < EXPORT_CACHE_MAX; i++) {
		struct xent *x = &xcache.e[i];

		if (x->id == out->id || (x->id && x->base == base)) {
			victim = i;	/* same allocation, or a dead one here */
			break;
		}
		if (!x->id) {
			victim = i;
			break;
		}
		if (x->used < xcache.e[victim].used)
			victim = i;
	}
	out->used = ++xcache.tick;
	xcache.e[victim] = *out;
	pthread_mutex_unlock(&xcache.lock);
	return 0;
}

/* ---- the calls -------------------------------------------------------- */

static ssize_t gpu_io(int fd, uint64_t p, size_t len, off_t off, bool write)
{
	unsigned long cmd = write ? TIERFS_IOC_PWRITE_GPU : TIERFS_IOC_PREAD_GPU;
	struct tierfs_gpu_io io;
	struct ptr_info pi;
	struct xent x;
	bool cached, retried = false;
	size_t done = 0;
	int r;

	if (off < 0 || len > SSIZE_MAX ||
	    len > (uint64_t)INT64_MAX - (uint64_t)off) {
		errno = EINVAL;
		return -1;
	}
	if (check_fd(fd) < 0)
		return -1;
	if (len == 0)
		return 0;
	if (!p) {
		errno = EINVAL;
		return -1;
	}
again:
	if (resolve(p, &x, &pi, &cached, retried) < 0)
		return -1;
	if (p - x.base > x.size || len > x.size - (p - x.base)) {
		errno = EINVAL;	/* the range leaves the allocation */
		return -1;
	}
	if (!retried && (sync_buffer(pi.ctx) < 0 ||
			 sync_file_range(fd, off, (off_t)len,
					 SYNC_FILE_RANGE_WAIT_BEFORE |
					 SYNC_FILE_RANGE_WRITE |
					 SYNC_FILE_RANGE_WAIT_AFTER) < 0))
		return -1;

	memset(&io, 0, sizeof(io));
	memcpy(io.handle, x.handle, sizeof(io.handle));
	io.device = x.device < 0 ? 0 : (uint32_t)x.device;
	while (done < len) {
		size_t chunk = len - done;

		if (chunk > TIERFS_GPU_IO_MAX)
			chunk = TIERFS_GPU_IO_MAX;
		io.handle_off = p + done - x.base;
		io.len = chunk;
		io.file_off = (uint64_t)off + done;
		r = ioctl(fd, cmd, &io);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EINVAL && cached && !retried && !done) {
				/* a handle the daemon no longer takes: export
				 * the allocation afresh, once */
				xcache_drop(x.id);
				retried = true;
				goto again;
			}
			return done ? (ssize_t)done : -1;
		}
		if (r == 0)
			break;		/* end of file (read) */
		done += (size_t)r;
	}
	return (ssize_t)done;
}

TIERFS_EXPORT ssize_t tierfs_pwrite_gpu(int fd, const void *dev_ptr,
					size_t len, off_t off)
{
	return gpu_io(fd, (uint64_t)(uintptr_t)dev_ptr, len, off, true);
}

TIERFS_EXPORT ssize_t tierfs_pread_gpu(int fd, void *dev_ptr, size_t len,
				       off_t off)
{
	return gpu_io(fd, (uint64_t)(uintptr_t)dev_ptr, len, off, false);
}
