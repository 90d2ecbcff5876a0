/*
 * fake_libcuda.c - a libcuda.so.1 without a GPU, for test_gpu_hash's
 * plumbing (tests/gpu/test_gpu_hash_fake.sh).
 *
 * Exports every driver function gpu/gpu_dl.h looks up.  "Device memory" is
 * host memory (cuMemAlloc: malloc; a VMM reservation: one anonymous
 * mapping, cuMemMap a no-op), copies are memcpy, streams do nothing.  The
 * hash kernels are not emulated here (tests/unit/test_hash_kernel_cpu runs
 * them): cuLaunchKernel checks the launch gpu_hash.c makes (the embedded
 * fatbin's magic and kernel names, the parameter block, a grid covering
 * every chunk and no more than a block beyond) and writes what the kernel
 * must, computed with libxxhash.  So test_gpu_hash runs end to end on any
 * machine: argument checks, batching, offsets, the comparison and report
 * code; its GB/s are then the CPU's and mean nothing.
 *
 * The daemon runs over it too (tests that mount with a GPU tier where there
 * is no GPU, util.gpu_or_fake): then the environment sets the machine:
 *   TIERFS_FAKE_CUDA_DEVICES=N   N devices (default 1), all alike
 *   TIERFS_FAKE_CUDA_NO_PEER=1   no device can access another's memory
 *   TIERFS_FAKE_CUDA_DTOD_GBPS=X device-to-device copies take at least
 *                                bytes / X GB/s (slower links than host's)
 * cuMemCreate refuses a location that is not a device, and cuMemSetAccess
 * a descriptor of a device that does not exist, as the driver does.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cuda.h>
#include <xxhash.h>

#define FAKE_SMS	4

static const char *const fn_names[] = {
	"gpu_hash_xxh3_u4", "gpu_hash_xxh3_u8", "gpu_hash_readbw",
};
static int fn_ids[3];
static int ctx_obj, stream_obj;
static __thread CUcontext cur_ctx;
static const unsigned char *image;	/* the module's fatbin */

CUresult cuInit(unsigned int flags)
{
	return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v)
{
	*v = 13000;
	return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult e, const char **s)
{
	*s = "FAKE_CUDA_ERROR";
	return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult e, const char **s)
{
	*s = "fake libcuda";
	return CUDA_SUCCESS;
}

static int ndevices(void)
{
	const char *s = getenv("TIERFS_FAKE_CUDA_DEVICES");
	int n = s ? atoi(s) : 1;

	return n < 1 ? 1 : n > 16 ? 16 : n;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	if (ordinal < 0 || ordinal >= ndevices())
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n)
{
	*n = ndevices();
	return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer)
{
	if (d < 0 || d >= ndevices() || peer < 0 || peer >= ndevices())
		return CUDA_ERROR_INVALID_DEVICE;
	*can = d != peer && !getenv("TIERFS_FAKE_CUDA_NO_PEER");
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	if (d)
		snprintf(name, len, "FAKE device %d (tests/gpu/fake_libcuda.c)", (int)d);
	else
		snprintf(name, len, "FAKE device (tests/gpu/fake_libcuda.c: CPU memory, libxxhash)");
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
	switch (a) {
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		*v = 1;
		break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
		*v = FAKE_SMS;
		break;
	default:
		*v = 0;
	}
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	*c = (CUcontext)&ctx_obj;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
	return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *c)
{
	*c = cur_ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c)
{
	cur_ctx = c;
	return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext c)
{
	cur_ctx = c;
	return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *c)
{
	if (c)
		*c = cur_ctx;
	return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(size_t *f, size_t *t)
{
	*f = (size_t)16 << 30;
	*t = (size_t)16 << 30;
	return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *p, size_t n)
{
	void *m = aligned_alloc(256, (n + 255) & ~(size_t)255);

	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p)
{
	free((void *)(uintptr_t)p);
	return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr *b, size_t *s, CUdeviceptr p)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* A reservation is one anonymous mapping, aligned by over-mapping. */
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
			     CUdeviceptr addr, unsigned long long flags)
{
	size_t a = align ? align : (size_t)2 << 20;
	char *m = mmap(NULL, size + a, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uintptr_t u;

	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	u = ((uintptr_t)m + a - 1) & ~(uintptr_t)(a - 1);
	if (u > (uintptr_t)m)
		munmap(m, u - (uintptr_t)m);
	munmap((char *)u + size, (uintptr_t)m + a - u);
	*p = (CUdeviceptr)u;
	return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
	munmap((void *)(uintptr_t)p, size);
	return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    prop->location.id < 0 || prop->location.id >= ndevices())
		return CUDA_ERROR_INVALID_DEVICE;
	*h = 1;
	return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off,
		  CUmemGenericAllocationHandle h, unsigned long long flags)
{
	return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
	return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d,
			size_t count)
{
	for (size_t i = 0; i < count; i++)
		if (d[i].location.id < 0 || d[i].location.id >= ndevices())
			return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *g,
				       const CUmemAllocationProp *prop,
				       CUmemAllocationGranularity_flags o)
{
	*g = (size_t)2 << 20;
	return CUDA_SUCCESS;
}

/* "device" memory is host memory: pinning is nothing to do */
CUresult cuMemHostRegister(void *p, size_t n, unsigned int flags)
{
	return p && n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemHostUnregister(void *p)
{
	return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemHostGetFlags(unsigned int *f, void *p)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st)
{
	memcpy((void *)(uintptr_t)d, s, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st)
{
	memcpy(d, (const void *)(uintptr_t)s, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n,
			   CUstream st)
{
	const char *gbps = getenv("TIERFS_FAKE_CUDA_DTOD_GBPS");

	memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
	if (gbps && atof(gbps) > 0) {	/* device copies this slow (GB/s) */
		double sec = (double)n / (atof(gbps) * 1e9);
		struct timespec ts = { (time_t)sec, (long)((sec - (time_t)sec) * 1e9) };

		nanosleep(&ts, NULL);
	}
	return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
	*s = (CUstream)&stream_obj;
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s)
{
	return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a,
			       CUdeviceptr p)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *a,
				void **data, CUdeviceptr p)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h,
			    unsigned int flags)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemExportToShareableHandle(void *sh, CUmemGenericAllocationHandle h,
				      CUmemAllocationHandleType t,
				      unsigned long long flags)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h,
					void *os, CUmemAllocationHandleType t)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* A fatbin starts with magic 0xBA55ED50, version 1, header size, size. */
CUresult cuModuleLoadData(CUmodule *m, const void *img)
{
	uint32_t magic;

	memcpy(&magic, img, 4);
	if (magic != 0xBA55ED50u) {
		fprintf(stderr, "fake libcuda: module image is not a fatbin (magic %#x)\n",
			magic);
		return CUDA_ERROR_INVALID_IMAGE;
	}
	image = img;
	*m = (CUmodule)&image;
	return CUDA_SUCCESS;
}

/* Known names only, and only if the image names them too. */
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
	uint64_t size;
	size_t i;

	memcpy(&size, image + 8, 8);	/* fatbin: size after the header */
	for (i = 0; i < 3; i++) {
		if (strcmp(name, fn_names[i]))
			continue;
		if (!memmem(image, size + 16, name, strlen(name))) {
			fprintf(stderr, "fake libcuda: %s is not in the fatbin\n",
				name);
			return CUDA_ERROR_NOT_FOUND;
		}
		*f = (CUfunction)&fn_ids[i];
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_NOT_FOUND;
}

CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f)
{
	*v = 0;
	return CUDA_SUCCESS;
}

/* What gpu_hash_xxh3_u4/_u8 must do, with the launch checked. */
static CUresult fake_hash(unsigned gx, unsigned bx, void **params)
{
	const uint8_t *src = *(const uint8_t **)params[0];
	uint64_t len = *(uint64_t *)params[1];
	unsigned shift = *(unsigned *)params[2];
	uint64_t nchunks = *(uint64_t *)params[3];
	uint8_t *out = *(uint8_t **)params[4];
	uint64_t chunk = (uint64_t)1 << shift, warps, i, off, n;
	XXH128_canonical_t c;

	warps = (uint64_t)gx * (bx / 32);
	if (bx % 32 || shift < 12 || shift > 20 || ((uintptr_t)src & 15) ||
	    ((uintptr_t)out & 15) || warps < nchunks ||
	    warps >= nchunks + bx / 32 || nchunks > (len + chunk - 1) / chunk ||
	    !len) {
		fprintf(stderr, "fake libcuda: bad hash launch: grid %u block %u "
			"len %llu shift %u nchunks %llu\n", gx, bx,
			(unsigned long long)len, shift,
			(unsigned long long)nchunks);
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (i = 0; i < nchunks; i++) {
		off = i << shift;
		n = len - off < chunk ? len - off : chunk;
		XXH128_canonicalFromHash(&c, XXH3_128bits(src + off, n));
		memcpy(out + 16 * i, c.digest, 16);
	}
	return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
			unsigned int gz, unsigned int bx, unsigned int by,
			unsigned int bz, unsigned int shmem, CUstream s,
			void **params, void **extra)
{
	if (gy != 1 || gz != 1 || by != 1 || bz != 1 || shmem || extra ||
	    !params || !gx || !bx || bx > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	if (f == (CUfunction)&fn_ids[0] || f == (CUfunction)&fn_ids[1])
		return fake_hash(gx, bx, params);
	if (f == (CUfunction)&fn_ids[2])
		return (*(uintptr_t *)params[0] & 15) ? CUDA_ERROR_INVALID_VALUE
						      : CUDA_SUCCESS;
	return CUDA_ERROR_INVALID_HANDLE;
}
