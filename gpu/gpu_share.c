/*
 * gpu_share.c - the client's view of a shared GPU cache (-o gpu_share,
 * tierfs-gpu(7)).
 *
 * With gpu_share the daemon hands a client process one POSIX file
 * descriptor per chunk of its GPU cache (gpu_vmm_export); the client maps
 * them, in the same layout, into an address range of its own, and then
 * copies device to device between its buffers and the cache in its own
 * CUDA context.  The copy then needs no switch from the application's
 * context to the daemon's, which costs ~150-200 us per call on an H100
 * (tierfs-gpu(7)).  These functions run in the client (libtierfs); like
 * gpu_ipc_export() they load the driver themselves and need no gpu_init().
 *
 * Use: gpu_share_reserve(), then gpu_share_map() per chunk, then
 * gpu_share_access() once all are mapped; gpu_share_release() undoes any
 * prefix of that.  gpu_share_copy() moves bytes.
 *
 * Contexts: the VMM calls run in the device's primary context, retained
 * by gpu_share_reserve() and released by gpu_share_release().  A copy runs
 * in the context it is given (the one owning the application's buffer),
 * or in the primary context.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <unistd.h>

#include "gpu_internal.h"

/* Load the driver, retain device dev's primary context and push it. */
static int share_enter(int dev, CUcontext *ctx, CUdevice *d)
{
	char why[256];
	int ret = 0;

	if (gpu_dl_load(why, sizeof(why)))
		return -ENODEV;
	GPU_CU(cuInit(0), out);
	GPU_CU(cuDeviceGet(d, dev), out);
	GPU_CU(cuDevicePrimaryCtxRetain(ctx, *d), out);
	GPU_CU(cuCtxPushCurrent(*ctx), out_release);
	return 0;
out_release:
	cuDevicePrimaryCtxRelease(*d);
out:
	return ret;
}

/* Undo share_enter(). */
static void share_leave(CUdevice d)
{
	CUcontext popped;

	cuCtxPopCurrent(&popped);
	cuDevicePrimaryCtxRelease(d);
}

/*
 * gpu_share_reserve - reserve `size` bytes of device addresses for a
 * shared cache on device dev, aligned to `align`.  Returns 0 with *va, or
 * -errno (-ENODEV: no driver).
 */
int gpu_share_reserve(int dev, uint64_t size, uint64_t align, uint64_t *va)
{
	CUcontext ctx, again;
	CUdeviceptr p = 0;
	CUdevice d;
	int ret = share_enter(dev, &ctx, &d);

	if (ret)
		return ret;
	GPU_CU(cuMemAddressReserve(&p, size, align, 0, 0), out);
	/* one more reference, kept until gpu_share_release(): the context
	 * is not torn down and rebuilt between calls */
	GPU_CU(cuDevicePrimaryCtxRetain(&again, d), out_free);
	*va = p;
	goto out;
out_free:
	cuMemAddressFree(p, size);
out:
	share_leave(d);
	return ret;
}

/*
 * gpu_share_map - map the memory behind `fd` (one exported chunk) at va,
 * len bytes.  The fd stays the caller's to close.  Returns 0 or -errno.
 */
int gpu_share_map(int dev, uint64_t va, uint64_t len, int fd)
{
	CUmemGenericAllocationHandle h;
	CUcontext ctx;
	CUdevice d;
	int ret = share_enter(dev, &ctx, &d);

	if (ret)
		return ret;
	GPU_CU(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), out);
	GPU_CU(cuMemMap(va, len, 0, h, 0), out_release);
out_release:
	cuMemRelease(h);	/* the mapping keeps the memory */
out:
	share_leave(d);
	return ret;
}

/* gpu_share_access - grant device dev read/write access to [va, va + len). */
int gpu_share_access(int dev, uint64_t va, uint64_t len)
{
	CUmemAccessDesc a = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	CUcontext ctx;
	CUdevice d;
	int ret = share_enter(dev, &ctx, &d);

	if (ret)
		return ret;
	GPU_CU(cuMemSetAccess(va, len, &a, 1), out);
out:
	share_leave(d);
	return ret;
}

/*
 * gpu_share_release - unmap the first `mapped` bytes of the range (whole
 * chunks of `chunk` bytes, the last one possibly shorter), free the
 * reservation of `size` bytes, and drop the primary context reference
 * gpu_share_reserve() took.
 */
void gpu_share_release(int dev, uint64_t va, uint64_t mapped, uint64_t chunk,
		       uint64_t size)
{
	CUcontext ctx;
	CUdevice d;
	uint64_t off, len;

	if (share_enter(dev, &ctx, &d))
		return;
	for (off = 0; chunk && off < mapped; off += chunk) {
		len = mapped - off < chunk ? mapped - off : chunk;
		cuMemUnmap(va + off, len);
	}
	cuMemAddressFree(va, size);
	cuDevicePrimaryCtxRelease(d);	/* gpu_share_reserve's reference */
	share_leave(d);
}

/*
 * gpu_share_copy - copy len bytes device to device from src to dst in
 * context ctx (NULL: device dev's primary context), on its legacy default
 * stream, so after the work queued there, and wait for it.  Returns 0 or
 * -errno.
 */
int gpu_share_copy(int dev, void *ctx, uint64_t dst, uint64_t src, size_t len)
{
	struct gpu_xfer x = { .dst = dst, .src = src, .len = len, .dir = GPU_D2D };

	return gpu_share_copyv(dev, ctx, &x, 1);
}

/* gpu_share_copyv - gpu_share_copy() of a list, waited for once. */
int gpu_share_copyv(int dev, void *ctx, const struct gpu_xfer *x, int n)
{
	CUcontext pctx = NULL, popped;
	CUdevice d = 0;
	CUresult r = CUDA_SUCCESS;
	int ret = 0, i;

	if (ctx) {
		GPU_CU(cuCtxPushCurrent((CUcontext)ctx), out);
	} else {
		ret = share_enter(dev, &pctx, &d);
		if (ret)
			return ret;
	}
	for (i = 0; i < n && r == CUDA_SUCCESS; i++)
		if (x[i].len)
			r = cuMemcpyDtoDAsync(x[i].dst, x[i].src, x[i].len, NULL);
	if (r != CUDA_SUCCESS)
		ret = gpu_cu_err("cuMemcpyDtoDAsync (list)", r);
	/* what was queued before a failure runs all the same: wait for it */
	GPU_CU(cuStreamSynchronize(NULL), out_pop);
out_pop:
	if (pctx)
		share_leave(d);
	else
		cuCtxPopCurrent(&popped);
out:
	return ret;
}
