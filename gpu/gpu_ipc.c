/*
 * gpu_ipc.c - CUDA IPC memory handles for the zero-copy ioctl.
 *
 * Both ends live here.  The client side (libtierfs, in the application's
 * process) turns a device pointer into a 64-byte handle with
 * gpu_ipc_export(): it finds the cuMemAlloc/cudaMalloc allocation that
 * holds the pointer, because only whole allocations can be exported, and
 * returns the handle plus the allocation's base and size, so that the
 * ioctl can carry "handle + offset".  The daemon side opens a handle with
 * gpu_ipc_open() (fs/fs_ioctl.c caches the result: a handle is opened once per
 * allocation) and copies device to device between the mapping and the GPU
 * cache; gpu_ipc_close() drops the mapping.
 *
 * Contexts: the daemon opens handles in the primary context gpu_init()
 * retained.  gpu_ipc_export() runs in the application and need not follow
 * gpu_init(): it loads the driver itself (gpu_dl_load()) and works in the
 * context that owns the pointer, pushed for the duration of the call and
 * popped after, so the application's own current context is left as it
 * was.
 *
 * A process cannot open a handle it exported itself; the driver refuses,
 * and gpu_ipc_open() then says so (-EINVAL).
 *
 * Locking: none; the driver serialises its own IPC bookkeeping.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "gpu_internal.h"

_Static_assert(sizeof(CUipcMemHandle) == GPU_IPC_HANDLE_SIZE,
	       "GPU_IPC_HANDLE_SIZE must match CUipcMemHandle");

/*
 * gpu_ipc_open - map a client's exported allocation into this process.
 * Returns 0 with the mapping's device address in *dptr and the allocation's
 * size in *size; -ENODEV before gpu_init(); -EINVAL for a handle that is
 * garbage, whose allocation was freed, or that this process exported;
 * -EXDEV when it lives on another device than the cache's (even one the
 * driver could map as a peer); -EEXIST when the handle is mapped in this
 * context already (the driver maps a handle once per context: a second
 * open while another thread's is under way or held can be refused so,
 * quietly: the caller uses the other mapping); -ENOMEM; -EIO.  On error
 * nothing stays open.
 */
int gpu_ipc_open(const void *handle, uint64_t *dptr, uint64_t *size)
{
	return gpu_ipc_open_on(-1, handle, dptr, size);
}

/*
 * gpu_ipc_open_on - gpu_ipc_open() in device dev's primary context (dev < 0:
 * the gpu_init() device), for memory of device dev: a mount over several
 * GPUs maps each buffer in its own GPU's context, so that the copies issued
 * there (gpu_copy_dtod_on) read it locally.  -EXDEV when the buffer is on
 * another device.
 */
int gpu_ipc_open_on(int dev, const void *handle, uint64_t *dptr, uint64_t *size)
{
	CUipcMemHandle h;
	CUdeviceptr d = 0, base = 0;
	size_t sz = 0;
	const char *why = NULL;
	CUresult r;
	int ord = -1, ret;

	if (!handle || !dptr || !size)
		return -EINVAL;
	ret = gpu_ctx_enter_dev(dev);
	if (ret)
		return ret;
	if (dev < 0)
		dev = gpu_cu_ordinal();
	memcpy(&h, handle, sizeof(h));

	r = cuIpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	switch (r) {
	case CUDA_SUCCESS:
		break;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
	case CUDA_ERROR_MAP_FAILED:
	case CUDA_ERROR_INVALID_CONTEXT:
		if (cuGetErrorName(r, &why) != CUDA_SUCCESS)
			why = "?";
		gpu_log(LOG_WARNING,
			"gpu: IPC handle refused (%s): garbage, its allocation "
			"freed, or exported by this process", why);
		return -EINVAL;
	case CUDA_ERROR_ALREADY_MAPPED:
		return -EEXIST;
	case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
	case CUDA_ERROR_TOO_MANY_PEERS:
		gpu_log(LOG_WARNING,
			"gpu: IPC handle is on a device that device %d cannot map",
			dev);
		return -EXDEV;
	default:
		return gpu_cu_err("cuIpcOpenMemHandle(&d, h, "
				  "CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)", r);
	}

	GPU_CU(cuMemGetAddressRange(&base, &sz, d), out_close);
	GPU_CU(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
				     d), out_close);
	if (ord != dev) {
		gpu_log(LOG_WARNING,
			"gpu: IPC buffer is on device %d, not on device %d",
			ord, dev);
		ret = -EXDEV;
		goto out_close;
	}
	*dptr = base;
	*size = sz;
	return 0;

out_close:
	cuIpcCloseMemHandle(d);
	return ret;
}

/*
 * gpu_ipc_close - unmap what gpu_ipc_open() returned at dptr (one open).
 * Returns 0, -ENODEV, -EINVAL (not an open IPC mapping), or -EIO.
 */
int gpu_ipc_close(uint64_t dptr)
{
	return gpu_ipc_close_on(-1, dptr);
}

/* gpu_ipc_close_on - gpu_ipc_close() of what gpu_ipc_open_on(dev) opened. */
int gpu_ipc_close_on(int dev, uint64_t dptr)
{
	int ret;

	ret = gpu_ctx_enter_dev(dev);
	if (ret)
		return ret;
	GPU_CU(cuIpcCloseMemHandle(dptr), out);
out:
	return ret;
}

/*
 * gpu_ipc_export - client side: export the allocation holding dptr.
 * Writes the handle (GPU_IPC_HANDLE_SIZE bytes) and the allocation's base,
 * size and device ordinal (any of base/size/device may be NULL).  Returns
 * 0; -ENODEV when there is no CUDA driver (libcuda.so.1 missing, or cuInit
 * fails; it loads the driver itself); -EINVAL when dptr is not device
 * memory, or is device memory that cannot be exported (VMM, pool or
 * managed memory: only cuMemAlloc/cudaMalloc memory can); -EIO otherwise.
 * Needs no gpu_init(); leaves the calling thread's context as it was.
 */
int gpu_ipc_export(uint64_t dptr, void *handle, uint64_t *base,
		   uint64_t *size, int *device)
{
	CUpointer_attribute attrs[] = {
		CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
		CU_POINTER_ATTRIBUTE_CONTEXT,
		CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
		CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
	};
	unsigned int mtype = 0;
	CUcontext ctx = NULL, popped;
	int ord = -1;
	uint64_t ipc_ok = 0;	/* a boolean, of whatever width */
	void *data[] = { &mtype, &ctx, &ord, &ipc_ok };
	CUipcMemHandle h;
	CUdeviceptr b = 0;
	size_t sz = 0;
	CUresult r;
	char why[256];
	int ret = 0;

	if (!handle || !dptr)
		return -EINVAL;
	if (gpu_dl_load(why, sizeof(why))) {
		gpu_log(LOG_ERR, "gpu: %s", why);
		return -ENODEV;
	}
	r = cuInit(0);
	if (r != CUDA_SUCCESS) {
		gpu_cu_err("cuInit(0)", r);
		return -ENODEV;
	}
	GPU_CU(cuPointerGetAttributes(4, attrs, data, dptr), out);
	if (mtype != CU_MEMORYTYPE_DEVICE) {
		gpu_log(LOG_ERR, "gpu: 0x%" PRIx64 " is not CUDA device memory",
			dptr);
		return -EINVAL;
	}
	if (!ipc_ok) {
		gpu_log(LOG_ERR,
			"gpu: 0x%" PRIx64 " cannot be exported: only cuMemAlloc/"
			"cudaMalloc memory can (not VMM, pool or managed memory)",
			dptr);
		return -EINVAL;
	}

	if (ctx)
		GPU_CU(cuCtxPushCurrent(ctx), out);
	GPU_CU(cuMemGetAddressRange(&b, &sz, dptr), out_pop);
	GPU_CU(cuIpcGetMemHandle(&h, b), out_pop);
	memcpy(handle, &h, sizeof(h));
	if (base)
		*base = b;
	if (size)
		*size = sz;
	if (device)
		*device = ord;
out_pop:
	if (ctx)
		cuCtxPopCurrent(&popped);
out:
	return ret;
}
