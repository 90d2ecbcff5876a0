/*
 * gpu_copy.c - synchronous copies, one stream per direction (hpdc23 §4.3).
 *
 * Flushes (device to host), prefetches (host to device) and zero-copy
 * ioctls (device to device) each get their own CUstream, so a long flush
 * never queues a prefetch or a client's copy behind it.  Streams are
 * created non-blocking (they never wait on the legacy default stream, which
 * an application's CUDA runtime in the same context might use) and lazily,
 * on the first copy of their direction, in the primary context.
 *
 * A copy is queued with cuMemcpy*Async on its direction's stream and waited
 * for with cuStreamSynchronize.  Host memory may be pinned or pageable: for
 * pageable memory the driver stages the copy through its own pinned
 * buffers, so any size works, only slower.  Device-to-device moves may
 * overlap (the cache compacts fragments in place): they are split into
 * pieces that do not.
 *
 * Locking: one mutex per direction, held for the whole copy (queue and
 * wait), so copies of one direction run one at a time in submission order,
 * and the stream is created under it.  No lock is held across directions.
 */
#include <errno.h>
#include <pthread.h>

#include "gpu_internal.h"

static struct gpu_lane {
	pthread_mutex_t lock;	/* serialises copies of this direction */
	CUstream stream;	/* created on first use, never destroyed */
} gpu_lanes[GPU_NDIRS] = {
	[GPU_H2D] = { .lock = PTHREAD_MUTEX_INITIALIZER },
	[GPU_D2H] = { .lock = PTHREAD_MUTEX_INITIALIZER },
	[GPU_D2D] = { .lock = PTHREAD_MUTEX_INITIALIZER },
};

/*
 * Device-to-device copies issued in another device's context (a mount over
 * several GPUs: the copy runs on the GPU that holds the source buffer, so
 * that a copy from GPU 1's memory into GPU 1's part of the cache never
 * crosses a link): one lane per device ordinal, its stream created in that
 * device's primary context.
 */
static struct gpu_lane dtod_lanes[GPU_MAX_ORDINAL] = {
	[0 ... GPU_MAX_ORDINAL - 1] = { .lock = PTHREAD_MUTEX_INITIALIZER },
};

/*
 * Lock lane l, make device dev's primary context current (dev < 0: the
 * gpu_init() device's), create the lane's stream if needed.  Returns l
 * locked, or NULL with *err set (the lane then unlocked).
 */
static struct gpu_lane *lane_lock(struct gpu_lane *l, int dev, int *err)
{
	int ret;

	ranked_lock(&l->lock, LR_GPU_LANE);
	ret = gpu_ctx_enter_dev(dev);
	if (ret)
		goto out_unlock;
	if (!l->stream)
		GPU_CU(cuStreamCreate(&l->stream, CU_STREAM_NON_BLOCKING),
		       out_unlock);
	return l;

out_unlock:
	ranked_unlock(&l->lock, LR_GPU_LANE);
	*err = ret;
	return NULL;
}

/* Direction dir's lane on the gpu_init() device, locked (lane_lock). */
static struct gpu_lane *lane_get(enum gpu_dir dir, int *err)
{
	return lane_lock(&gpu_lanes[dir], -1, err);
}

/* The locked device-to-device lane of device dev (< 0: the primary one's). */
static struct gpu_lane *dtod_lane_get(int dev, int *err)
{
	if (dev < 0 || dev == gpu_cu_ordinal())
		return lane_get(GPU_D2D, err);
	if (dev >= GPU_MAX_ORDINAL) {
		*err = -ENODEV;
		return NULL;
	}
	return lane_lock(&dtod_lanes[dev], dev, err);
}

/*
 * gpu_copy_htod - copy len bytes from host src (pinned or pageable) to
 * device dst on the host-to-device stream; returns once they have landed.
 * Returns 0, -ENODEV before gpu_init(), -EINVAL for a bad address, or -EIO.
 */
int gpu_copy_htod(uint64_t dst, const void *src, size_t len)
{
	struct gpu_lane *l;
	int ret = 0;

	if (!len)
		return 0;
	l = lane_get(GPU_H2D, &ret);
	if (!l)
		return ret;
	GPU_CU(cuMemcpyHtoDAsync(dst, src, len, l->stream), out);
	GPU_CU(cuStreamSynchronize(l->stream), out);
out:
	ranked_unlock(&l->lock, LR_GPU_LANE);
	return ret;
}


/*
 * gpu_copy_dtoh - copy len bytes from device src to host dst (pinned or
 * pageable) on the device-to-host stream; returns once dst holds them.
 * Returns as gpu_copy_htod().
 */
int gpu_copy_dtoh(void *dst, uint64_t src, size_t len)
{
	struct gpu_lane *l;
	int ret = 0;

	if (!len)
		return 0;
	l = lane_get(GPU_D2H, &ret);
	if (!l)
		return ret;
	GPU_CU(cuMemcpyDtoHAsync(dst, src, len, l->stream), out);
	GPU_CU(cuStreamSynchronize(l->stream), out);
out:
	ranked_unlock(&l->lock, LR_GPU_LANE);
	return ret;
}

/*
 * Queue an overlapping move as pieces no longer than the distance between
 * the ranges, front first when moving down and back first when moving up,
 * so that no piece reads bytes an earlier piece has overwritten.  The
 * stream runs the pieces in order.
 */
static CUresult dtod_overlap(uint64_t dst, uint64_t src, size_t len,
			     CUstream s)
{
	size_t step = dst < src ? src - dst : dst - src, done = 0, n;
	CUresult r = CUDA_SUCCESS;

	while (r == CUDA_SUCCESS && done < len) {
		n = len - done < step ? len - done : step;
		if (dst < src)
			r = cuMemcpyDtoDAsync(dst + done, src + done, n, s);
		else
			r = cuMemcpyDtoDAsync(dst + len - done - n,
					      src + len - done - n, n, s);
		done += n;
	}
	return r;
}

/*
 * gpu_copy_dtod - copy len bytes between device addresses (the cache, an
 * IPC-opened client buffer, a peer device) on the device-to-device stream.
 * Overlapping ranges are moved as memmove() would (in pieces no longer
 * than their distance: fast for moves of at least a few MiB).  Returns as
 * gpu_copy_htod().
 */
int gpu_copy_dtod(uint64_t dst, uint64_t src, size_t len)
{
	return gpu_copy_dtod_on(-1, dst, src, len);
}

/*
 * gpu_copy_dtod_on - gpu_copy_dtod() issued on device dev's own stream, in
 * its primary context (dev < 0: the primary device's).  Both addresses must
 * be accessible from dev.  Returns as gpu_copy_htod(), or -ENODEV for no
 * such device.
 */
int gpu_copy_dtod_on(int dev, uint64_t dst, uint64_t src, size_t len)
{
	struct gpu_xfer x = { .dst = dst, .src = src, .len = len, .dir = GPU_D2D };

	if (!len || dst == src)
		return 0;
	return gpu_copy_batch_on(dev, &x, 1);
}

/*
 * Queue every copy of x[0..n) on lane l (locked), in order, then wait
 * once.  On a queueing error the copies queued before it are still waited
 * for (they read and write memory that the caller frees after the return).
 * Unlocks l.
 */
static int batch_on_lane(struct gpu_lane *l, const struct gpu_xfer *x, int n)
{
	CUresult r = CUDA_SUCCESS;
	int ret = 0, i;

	for (i = 0; i < n && r == CUDA_SUCCESS; i++) {
		const struct gpu_xfer *c = &x[i];

		if (!c->len)
			continue;
		if (c->dir == GPU_H2D)
			r = cuMemcpyHtoDAsync(c->dst, (const void *)(uintptr_t)c->src,
					      c->len, l->stream);
		else if (c->dir == GPU_D2H)
			r = cuMemcpyDtoHAsync((void *)(uintptr_t)c->dst, c->src,
					      c->len, l->stream);
		else if (c->dst == c->src)
			continue;
		else if (c->dst < c->src + c->len && c->src < c->dst + c->len)
			r = dtod_overlap(c->dst, c->src, c->len, l->stream);
		else
			r = cuMemcpyDtoDAsync(c->dst, c->src, c->len, l->stream);
	}
	if (r != CUDA_SUCCESS) {
		ret = gpu_cu_err("cuMemcpyAsync (batch)", r);
		cuStreamSynchronize(l->stream);
	} else {
		GPU_CU(cuStreamSynchronize(l->stream), out);
	}
out:
	ranked_unlock(&l->lock, LR_GPU_LANE);
	return ret;
}

/*
 * gpu_copy_batch_on - queue every copy of x[0..n) on device dev's
 * device-to-device lane, in order, then wait once.
 */
int gpu_copy_batch_on(int dev, const struct gpu_xfer *x, int n)
{
	struct gpu_lane *l;
	int ret = 0;

	if (n <= 0)
		return 0;
	l = dtod_lane_get(dev, &ret);
	return l ? batch_on_lane(l, x, n) : ret;
}

/*
 * gpu_copy_dtoh_batch - the same on the device-to-host lane (the flushes'):
 * pieces of the cache copied out to host memory together, one wait.
 */
int gpu_copy_dtoh_batch(const struct gpu_xfer *x, int n)
{
	struct gpu_lane *l;
	int ret = 0;

	if (n <= 0)
		return 0;
	l = lane_get(GPU_D2H, &ret);
	return l ? batch_on_lane(l, x, n) : ret;
}
