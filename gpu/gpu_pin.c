/*
 * gpu_pin.c - pinning the host cache, one tierfs instance at a time
 * (hipc22 §IV-A, "serialized registration").
 *
 * The host tier mmaps its buffer, touches its pages in the background and
 * writes to it unpinned meanwhile; once every page is touched it pins the
 * whole buffer with gpu_host_register(), which then only has to lock pages
 * that already exist.  Registering stalls the device's copies while it
 * runs, and several instances registering at once slow each other down,
 * so instances on one node take turns: gpu_pin_lock() takes an exclusive
 * flock on a lock file shared by all of them, gpu_pin_unlock() passes the
 * turn on.
 *
 * Registration is portable (CU_MEMHOSTREGISTER_PORTABLE): the range counts
 * as pinned for every context in the process, not only the primary one.
 *
 * Locking: none inside; the flock is between processes.  The caller holds
 * it around gpu_host_register() and nothing else.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpu_internal.h"

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/*
 * gpu_host_register - pin [p, p + len) for fast DMA.  Returns 0, -EINVAL
 * (len 0, or a range the driver refuses), -EEXIST (already registered),
 * -ENOMEM (the pages cannot be locked: see RLIMIT_MEMLOCK), -ENODEV before
 * gpu_init(), or -EIO.  On error nothing is registered.
 */
int gpu_host_register(void *p, size_t len)
{
	CUresult r;
	double t0;
	int ret;

	if (!p || !len)
		return -EINVAL;
	ret = gpu_ctx_enter();
	if (ret)
		return ret;
	t0 = now_ms();
	r = cuMemHostRegister(p, len, CU_MEMHOSTREGISTER_PORTABLE);
	if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
		gpu_log(LOG_ERR, "gpu: host range %p is already pinned", p);
		return -EEXIST;
	}
	if (r != CUDA_SUCCESS)
		return gpu_cu_err("cuMemHostRegister(p, len, "
				  "CU_MEMHOSTREGISTER_PORTABLE)", r);
	gpu_log(LOG_INFO, "gpu: pinned %zu MiB of host memory in %.1f ms",
		len >> 20, now_ms() - t0);
	return 0;
}

/*
 * gpu_host_unregister - unpin the range registered at p.  Returns 0,
 * -EINVAL if p does not start a registered range, -ENODEV, or -EIO.
 */
int gpu_host_unregister(void *p)
{
	CUresult r;
	int ret;

	ret = gpu_ctx_enter();
	if (ret)
		return ret;
	r = cuMemHostUnregister(p);
	if (r == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) {
		gpu_log(LOG_ERR, "gpu: host range %p is not pinned", p);
		return -EINVAL;
	}
	if (r != CUDA_SUCCESS)
		return gpu_cu_err("cuMemHostUnregister(p)", r);
	return 0;
}

/*
 * gpu_pin_lock - wait for the node-wide pinning turn: take an exclusive
 * flock on `path`, creating it mode 0666 (whatever the umask) so that
 * instances of other users can take turns too.  Blocks; restarts after
 * signals.  Returns the fd that holds the lock, or -errno (nothing open).
 */
int gpu_pin_lock(const char *path)
{
	int fd, ret;

	if (!path || !*path)
		return -EINVAL;
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
	if (fd >= 0) {
		/* Ours: open it to everyone despite the umask. */
		(void)fchmod(fd, 0666);
	} else if (errno == EEXIST) {
		/* flock needs no write access: read-only is enough. */
		fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	if (fd < 0) {
		ret = -errno;
		gpu_log(LOG_ERR, "gpu: pin lock %s: %s", path, strerror(-ret));
		return ret;
	}
	while (flock(fd, LOCK_EX) < 0) {
		if (errno == EINTR)
			continue;
		ret = -errno;
		gpu_log(LOG_ERR, "gpu: pin lock %s: flock: %s", path,
			strerror(-ret));
		close(fd);
		return ret;
	}
	return fd;
}

/*
 * gpu_pin_unlock - pass the pinning turn on: release and close the fd
 * gpu_pin_lock() returned.  A negative fd is a no-op.
 */
void gpu_pin_unlock(int fd)
{
	if (fd < 0)
		return;
	flock(fd, LOCK_UN);
	close(fd);
}
