/*
 * gpu_common.c - driver start-up, the device's primary context, errors.
 *
 * tierfs talks to the GPU through the CUDA driver API only (libcuda), so
 * the daemon needs nothing from the toolkit at run time, and it loads even
 * the driver itself at run time (gpu_dl.c): without one, gpu_init() fails
 * with -ENODEV and the daemon runs without a GPU tier.  gpu_init() runs
 * once per process: load libcuda.so.1, cuInit, pick the device, retain its
 * primary context and make it current.  The primary context is the one the CUDA runtime of
 * any other library in the process would use too, and it is never released:
 * it lives as long as the process.
 *
 * Every other entry point of gpu/ calls gpu_ctx_enter() first, so any
 * thread (FUSE workers, the flush engine, the VMM mapper) may call into
 * gpu/ without setting anything up.
 *
 * Locking: gpu_state.lock serialises gpu_init() only; readers look at the
 * atomic `ready` flag and then at fields that never change once it is set.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "gpu_internal.h"

static struct {
	pthread_mutex_t lock;	/* serialises gpu_init() */
	atomic_bool ready;	/* gpu_init() succeeded; never cleared */
	int ordinal;		/* device ordinal asked of gpu_init() */
	CUdevice dev;		/* its driver handle */
	CUcontext ctx;		/* its retained primary context */
	int driver;		/* driver version, e.g. 13000 */
	char name[128];		/* device name */
} gpu_state = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
};

/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or the bare number (also
 * when no driver is loaded to name it). */
static void cu_describe(CUresult r, char *buf, size_t len)
{
	const char *name = NULL, *text = NULL;

	if (gpu_dl_loaded()) {
		if (cuGetErrorName(r, &name) != CUDA_SUCCESS)
			name = NULL;
		if (cuGetErrorString(r, &text) != CUDA_SUCCESS)
			text = NULL;
	}
	if (name && text)
		snprintf(buf, len, "%s (%s)", name, text);
	else if (name)
		snprintf(buf, len, "%s", name);
	else
		snprintf(buf, len, "CUresult %d", (int)r);
}

/* Why cuInit failed, in words an operator acts on. */
static void init_failure(CUresult r, char *msg, size_t msglen)
{
	char why[160];

	if (!msg || !msglen)
		return;
	cu_describe(r, why, sizeof(why));
	switch (r) {
	case CUDA_ERROR_STUB_LIBRARY:
		snprintf(msg, msglen,
			 "no CUDA driver (libcuda is the toolkit's link stub)");
		break;
	case CUDA_ERROR_NO_DEVICE:
		snprintf(msg, msglen, "no CUDA device");
		break;
	case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
	case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
		snprintf(msg, msglen, "CUDA driver too old or mismatched: %s",
			 why);
		break;
	default:
		snprintf(msg, msglen, "no usable CUDA driver: cuInit: %s", why);
		break;
	}
}

/*
 * gpu_cu_errno - map a CUresult to -errno, without logging.
 * Out of memory -> -ENOMEM; invalid value or handle -> -EINVAL; the rest
 * -> -EIO.  CUDA_SUCCESS -> 0.
 */
int gpu_cu_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
		return -EINVAL;
	default:
		return -EIO;
	}
}

/*
 * gpu_cu_err - log a failed driver call once (LOG_ERR, with the call's
 * source text and the driver's name for the error) and return its -errno.
 */
int gpu_cu_err(const char *what, CUresult r)
{
	char why[160];

	cu_describe(r, why, sizeof(why));
	gpu_log(LOG_ERR, "gpu: %s failed: %s", what, why);
	return gpu_cu_errno(r);
}

/*
 * gpu_built - true: this is the CUDA build of gpu/.
 */
bool gpu_built(void)
{
	return true;
}

/*
 * gpu_init's first steps, gpu_state.lock held: load the driver, cuInit,
 * note the driver's version (0 when it does not say).  Returns 0, or
 * gpu_dl_load's error or -ENODEV with the reason in msg.
 */
static int init_driver(char *msg, size_t msglen)
{
	CUresult r;
	int ret;

	ret = gpu_dl_load(msg, msglen);
	if (ret)
		return ret;
	r = cuInit(0);
	if (r != CUDA_SUCCESS) {
		init_failure(r, msg, msglen);
		return -ENODEV;
	}
	if (cuDriverGetVersion(&gpu_state.driver) != CUDA_SUCCESS)
		gpu_state.driver = 0;
	return 0;
}

/*
 * Device `dev`'s driver handle into *d, gpu_state.lock held and the driver
 * initialised.  Returns 0, or -ENODEV with the reason in msg.
 */
static int init_device(int dev, CUdevice *d, char *msg, size_t msglen)
{
	CUresult r;
	char why[160];
	int count = 0;

	r = cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS)
		count = 0;
	if (dev < 0 || dev >= count) {
		if (msg && msglen)
			snprintf(msg, msglen, "no device %d (%d CUDA device%s)",
				 dev, count, count == 1 ? "" : "s");
		return -ENODEV;
	}
	r = cuDeviceGet(d, dev);
	if (r != CUDA_SUCCESS) {
		cu_describe(r, why, sizeof(why));
		if (msg && msglen)
			snprintf(msg, msglen, "no device %d: %s", dev, why);
		return -ENODEV;
	}
	return 0;
}

/*
 * Retain device `dev`'s (d's) primary context into *ctx and make it
 * current, gpu_state.lock held.  Returns 0, or -ENODEV with the reason in
 * msg and the context released again.
 */
static int init_context(int dev, CUdevice d, CUcontext *ctx, char *msg, size_t msglen)
{
	CUresult r;
	char why[160];

	r = cuDevicePrimaryCtxRetain(ctx, d);
	if (r != CUDA_SUCCESS) {
		cu_describe(r, why, sizeof(why));
		if (msg && msglen)
			snprintf(msg, msglen,
				 "device %d refuses a context: %s", dev, why);
		return -ENODEV;
	}
	r = cuCtxSetCurrent(*ctx);
	if (r != CUDA_SUCCESS) {
		cu_describe(r, why, sizeof(why));
		if (msg && msglen)
			snprintf(msg, msglen,
				 "device %d: cannot make its context current: %s",
				 dev, why);
		cuDevicePrimaryCtxRelease(d);
		return -ENODEV;
	}
	return 0;
}

/*
 * gpu_init - initialise the driver and make device `dev`'s primary context
 * current in the calling thread.  Returns 0 and writes a one-line
 * description of the device to msg; or -ENODEV (no driver: "no CUDA driver
 * (libcuda.so.1: <dlerror>)"; no such device; context refused) with the
 * reason in msg.  Calling it again with the same
 * `dev` returns 0 at once; with another `dev` it returns -EINVAL (one
 * device per process).  On failure nothing stays retained.
 */
int gpu_init(int dev, char *msg, size_t msglen)
{
	CUcontext ctx = NULL;
	CUdevice d;
	int ret = 0;

	if (msg && msglen)
		msg[0] = '\0';
	ranked_lock(&gpu_state.lock, LR_GPU_INIT);
	if (atomic_load(&gpu_state.ready)) {
		if (dev != gpu_state.ordinal) {
			ret = -EINVAL;
			if (msg && msglen)
				snprintf(msg, msglen,
					 "already initialised on device %d",
					 gpu_state.ordinal);
			goto out_unlock;
		}
		goto out_describe;
	}

	ret = init_driver(msg, msglen);
	if (ret)
		goto out_unlock;
	ret = init_device(dev, &d, msg, msglen);
	if (ret)
		goto out_unlock;
	ret = init_context(dev, d, &ctx, msg, msglen);
	if (ret)
		goto out_unlock;

	if (cuDeviceGetName(gpu_state.name, sizeof(gpu_state.name), d) !=
	    CUDA_SUCCESS)
		snprintf(gpu_state.name, sizeof(gpu_state.name), "device %d",
			 dev);
	gpu_state.name[sizeof(gpu_state.name) - 1] = '\0';
	gpu_state.ordinal = dev;
	gpu_state.dev = d;
	gpu_state.ctx = ctx;
	atomic_store(&gpu_state.ready, true);
	gpu_log(LOG_INFO, "gpu: device %d: %s, CUDA driver %d.%d", dev,
		gpu_state.name, gpu_state.driver / 1000,
		gpu_state.driver % 1000 / 10);

out_describe:
	if (msg && msglen)
		snprintf(msg, msglen, "device %d: %s, CUDA driver %d.%d",
			 gpu_state.ordinal, gpu_state.name,
			 gpu_state.driver / 1000, gpu_state.driver % 1000 / 10);
	ranked_unlock(&gpu_state.lock, LR_GPU_INIT);
	return 0;

out_unlock:
	ranked_unlock(&gpu_state.lock, LR_GPU_INIT);
	return ret;
}

/*
 * gpu_available - true once gpu_init() has succeeded.
 */
bool gpu_available(void)
{
	return atomic_load(&gpu_state.ready);
}

/*
 * gpu_ctx_enter - make the primary context current in this thread.
 * Returns 0, -ENODEV before gpu_init(), or the mapped driver error.
 */
int gpu_ctx_enter(void)
{
	CUcontext cur = NULL;
	int ret = 0;

	if (!atomic_load(&gpu_state.ready))
		return -ENODEV;
	if (cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == gpu_state.ctx)
		return 0;
	GPU_CU(cuCtxSetCurrent(gpu_state.ctx), out);
out:
	return ret;
}

/*
 * Other devices' primary contexts (a mount over several GPUs copies in the
 * context of the GPU that holds the bytes): retained on first use, under
 * devctx_lock, and kept for the life of the process as gpu_init()'s is.
 */
static pthread_mutex_t devctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext devctx[GPU_MAX_ORDINAL];	/* set once, then read-only */

/*
 * gpu_ctx_enter_dev - make device dev's primary context current in this
 * thread (dev < 0 or gpu_init()'s device: gpu_ctx_enter()).  Returns 0,
 * -ENODEV before gpu_init() or for no such device, or the driver's error.
 */
int gpu_ctx_enter_dev(int dev)
{
	CUcontext ctx, cur = NULL;
	CUdevice d;
	int ret = 0, count;

	if (dev < 0 || dev == gpu_state.ordinal)
		return gpu_ctx_enter();
	if (!atomic_load(&gpu_state.ready))
		return -ENODEV;
	if (dev >= GPU_MAX_ORDINAL)
		return -ENODEV;
	ctx = __atomic_load_n(&devctx[dev], __ATOMIC_ACQUIRE);
	if (!ctx) {
		count = gpu_device_count();
		if (count < 0)
			return count;
		if (dev >= count)
			return -ENODEV;
		ranked_lock(&devctx_lock, LR_GPU_CTX);
		ctx = devctx[dev];
		if (!ctx) {
			GPU_CU(cuDeviceGet(&d, dev), out_unlock);
			GPU_CU(cuDevicePrimaryCtxRetain(&ctx, d), out_unlock);
			__atomic_store_n(&devctx[dev], ctx, __ATOMIC_RELEASE);
		}
out_unlock:
		ranked_unlock(&devctx_lock, LR_GPU_CTX);
		if (ret)
			return ret;
	}
	if (cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx)
		return 0;
	GPU_CU(cuCtxSetCurrent(ctx), out);
out:
	return ret;
}

/* gpu_cu_device - the driver handle of the device gpu_init() picked. */
CUdevice gpu_cu_device(void)
{
	return gpu_state.dev;
}

/* gpu_cu_ordinal - the ordinal of the device gpu_init() picked. */
int gpu_cu_ordinal(void)
{
	return gpu_state.ordinal;
}

/*
 * gpu_mem_info - free and total device memory in bytes and the device's
 * name; any pointer may be NULL.  Returns 0, -ENODEV before gpu_init(), or
 * the mapped driver error (outputs then untouched).
 */
int gpu_mem_info(uint64_t *free_b, uint64_t *total_b, char *name,
		 size_t namelen)
{
	size_t f = 0, t = 0;
	int ret;

	ret = gpu_ctx_enter();
	if (ret)
		return ret;
	GPU_CU(cuMemGetInfo(&f, &t), out);
	if (free_b)
		*free_b = f;
	if (total_b)
		*total_b = t;
	if (name && namelen)
		snprintf(name, namelen, "%s", gpu_state.name);
out:
	return ret;
}

/* gpu_device_count - CUDA devices present; -ENODEV before gpu_init(). */
int gpu_device_count(void)
{
	int count = 0, ret;

	ret = gpu_ctx_enter();
	if (ret)
		return ret;
	GPU_CU(cuDeviceGetCount(&count), out);
	return count;
out:
	return ret;
}

/*
 * gpu_dev_mem_info - gpu_mem_info() of device `dev` (any ordinal): its
 * primary context is made current for the query, then the daemon's again.
 * Returns 0, -ENODEV before gpu_init() or for no such device, or the mapped
 * driver error (outputs then untouched).
 */
int gpu_dev_mem_info(int dev, uint64_t *free_b, uint64_t *total_b, char *name,
		     size_t namelen)
{
	CUcontext ctx;
	CUdevice d;
	size_t f = 0, t = 0;
	int ret, count = gpu_device_count();

	if (count < 0)
		return count;
	if (dev < 0 || dev >= count)
		return -ENODEV;
	if (dev == gpu_state.ordinal)
		return gpu_mem_info(free_b, total_b, name, namelen);
	GPU_CU(cuDeviceGet(&d, dev), out);
	GPU_CU(cuDevicePrimaryCtxRetain(&ctx, d), out);
	ret = 0;
	if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cuMemGetInfo(&f, &t) != CUDA_SUCCESS)
		ret = -EIO;
	if (!ret && name && namelen &&
	    cuDeviceGetName(name, (int)(namelen > INT32_MAX ? INT32_MAX : namelen), d) !=
	    CUDA_SUCCESS)
		snprintf(name, namelen, "device %d", dev);
	cuCtxSetCurrent(gpu_state.ctx);
	cuDevicePrimaryCtxRelease(d);
	if (ret) {
		gpu_log(LOG_ERR, "gpu: device %d: no memory information", dev);
		return ret;
	}
	if (free_b)
		*free_b = f;
	if (total_b)
		*total_b = t;
out:
	return ret;
}

/* gpu_can_access_peer - may device a access device b's memory? */
int gpu_can_access_peer(int a, int b)
{
	int count = gpu_device_count(), can = 0, ret;
	CUdevice da, db;

	if (count < 0)
		return count;
	if (a < 0 || b < 0 || a >= count || b >= count)
		return -ENODEV;
	GPU_CU(cuDeviceGet(&da, a), out);
	GPU_CU(cuDeviceGet(&db, b), out);
	GPU_CU(cuDeviceCanAccessPeer(&can, da, db), out);
	return can ? 1 : 0;
out:
	return ret;
}
