/*
 * gpu_dl.h - the CUDA driver API through a table filled at run time.
 *
 * Nothing in tierfs links libcuda: a binary linked with -lcuda does not
 * even start where the NVIDIA driver is missing, and the daemon has to run
 * everywhere.  gpu_dl.c dlopen()s libcuda.so.1 once and dlsym()s every
 * driver function gpu/ uses into `gpu_cu`; below, each of those names is
 * redirected to its table slot, so a call such as
 *
 *	cuMemGetAddressRange(&b, &sz, d)
 *
 * keeps its source text and becomes (gpu_cu.cuMemGetAddressRange_v2)(...).
 *
 * How: <cuda.h> #defines many API names to versioned ones
 * (cuMemGetAddressRange -> cuMemGetAddressRange_v2, cuMemcpyHtoDAsync ->
 * __CUDA_API_PTSZ(cuMemcpyHtoDAsync_v2) -> cuMemcpyHtoDAsync_v2, ...).
 * GPU_CU_FUNCS() lists the API names as written in the code; X() sees
 * them macro-expanded, so the table members, their types (__typeof__ of
 * cuda.h's declaration) and the strings gpu_dl.c looks up are the symbols
 * libcuda really exports.  The redirects come after the struct and name
 * the expanded symbols: `#define cuMemAlloc_v2 (gpu_cu.cuMemAlloc_v2)`
 * leaves the member name alone (a macro is not expanded inside its own
 * expansion).
 *
 * Adding a driver call: add its API name to GPU_CU_FUNCS and a redirect of
 * its expanded name (grep cuda.h for `#define <name>`).  A redirect that
 * names no member fails to compile; a call whose expanded name has no
 * redirect fails to link (undefined reference to cuX_v2): nothing
 * provides driver symbols at link time.
 *
 * Included by gpu_internal.h (so by every CUDA file of gpu/) and by
 * tests/gpu/gpu_selftest.c.  gpu_dl.c defines GPU_DL_NO_REDIRECT first: it
 * needs the names unredirected.
 */
#ifndef TIERFS_GPU_DL_H
#define TIERFS_GPU_DL_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>

/* The redirects below name the legacy-stream symbols. */
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM) || defined(__CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "gpu/ does not support per-thread default streams"
#endif

/* The driver's soname: the one the driver package installs. */
#define GPU_DL_LIBCUDA "libcuda.so.1"

/* Every driver function gpu/ and its self-test call, as spelt in code. */
#define GPU_CU_FUNCS(X)				\
	X(cuInit)				\
	X(cuDriverGetVersion)			\
	X(cuGetErrorName)			\
	X(cuGetErrorString)			\
	X(cuDeviceGet)				\
	X(cuDeviceGetCount)			\
	X(cuDeviceGetName)			\
	X(cuDeviceGetAttribute)			\
	X(cuDeviceCanAccessPeer)		\
	X(cuDevicePrimaryCtxRetain)		\
	X(cuDevicePrimaryCtxRelease)		\
	X(cuCtxGetCurrent)			\
	X(cuCtxSetCurrent)			\
	X(cuCtxPushCurrent)			\
	X(cuCtxPopCurrent)			\
	X(cuMemGetInfo)				\
	X(cuMemAlloc)				\
	X(cuMemFree)				\
	X(cuMemGetAddressRange)			\
	X(cuMemAddressReserve)			\
	X(cuMemAddressFree)			\
	X(cuMemCreate)				\
	X(cuMemRelease)				\
	X(cuMemMap)				\
	X(cuMemUnmap)				\
	X(cuMemSetAccess)			\
	X(cuMemGetAllocationGranularity)	\
	X(cuMemHostRegister)			\
	X(cuMemHostUnregister)			\
	X(cuMemHostGetFlags)			\
	X(cuMemcpyHtoDAsync)			\
	X(cuMemcpyDtoHAsync)			\
	X(cuMemcpyDtoDAsync)			\
	X(cuStreamCreate)			\
	X(cuStreamSynchronize)			\
	X(cuPointerGetAttribute)		\
	X(cuPointerGetAttributes)		\
	X(cuIpcGetMemHandle)			\
	X(cuIpcOpenMemHandle)			\
	X(cuIpcCloseMemHandle)			\
	X(cuMemExportToShareableHandle)		\
	X(cuMemImportFromShareableHandle)	\
	X(cuModuleLoadData)			\
	X(cuModuleGetFunction)			\
	X(cuFuncGetAttribute)			\
	X(cuLaunchKernel)

/* One pointer per function, named by the exported (expanded) symbol. */
#define GPU_CU_MEMBER(f) __typeof__(f) *f;

struct gpu_cu_table {
	GPU_CU_FUNCS(GPU_CU_MEMBER)
};

/* Filled by gpu_dl_load(); all NULL until it has succeeded. */
extern struct gpu_cu_table gpu_cu;

/*
 * gpu_dl_load - dlopen libcuda.so.1 and resolve every GPU_CU_FUNCS entry,
 * once per process (later calls return the first outcome).  Thread-safe.
 * Returns 0, or -ENODEV with "no CUDA driver (libcuda.so.1: <dlerror>)" in
 * msg (msg may be NULL); on failure nothing stays loaded and `gpu_cu` stays
 * all NULL.
 */
int gpu_dl_load(char *msg, size_t msglen);

/* Has gpu_dl_load() succeeded?  Never blocks, never loads. */
bool gpu_dl_loaded(void);

#ifndef GPU_DL_NO_REDIRECT
#define cuInit				(gpu_cu.cuInit)
#define cuDriverGetVersion		(gpu_cu.cuDriverGetVersion)
#define cuGetErrorName			(gpu_cu.cuGetErrorName)
#define cuGetErrorString		(gpu_cu.cuGetErrorString)
#define cuDeviceGet			(gpu_cu.cuDeviceGet)
#define cuDeviceGetCount		(gpu_cu.cuDeviceGetCount)
#define cuDeviceGetName			(gpu_cu.cuDeviceGetName)
#define cuDeviceGetAttribute		(gpu_cu.cuDeviceGetAttribute)
#define cuDeviceCanAccessPeer		(gpu_cu.cuDeviceCanAccessPeer)
#define cuDevicePrimaryCtxRetain	(gpu_cu.cuDevicePrimaryCtxRetain)
#define cuDevicePrimaryCtxRelease_v2	(gpu_cu.cuDevicePrimaryCtxRelease_v2)
#define cuCtxGetCurrent			(gpu_cu.cuCtxGetCurrent)
#define cuCtxSetCurrent			(gpu_cu.cuCtxSetCurrent)
#define cuCtxPushCurrent_v2		(gpu_cu.cuCtxPushCurrent_v2)
#define cuCtxPopCurrent_v2		(gpu_cu.cuCtxPopCurrent_v2)
#define cuMemGetInfo_v2			(gpu_cu.cuMemGetInfo_v2)
#define cuMemAlloc_v2			(gpu_cu.cuMemAlloc_v2)
#define cuMemFree_v2			(gpu_cu.cuMemFree_v2)
#define cuMemGetAddressRange_v2		(gpu_cu.cuMemGetAddressRange_v2)
#define cuMemAddressReserve		(gpu_cu.cuMemAddressReserve)
#define cuMemAddressFree		(gpu_cu.cuMemAddressFree)
#define cuMemCreate			(gpu_cu.cuMemCreate)
#define cuMemRelease			(gpu_cu.cuMemRelease)
#define cuMemMap			(gpu_cu.cuMemMap)
#define cuMemUnmap			(gpu_cu.cuMemUnmap)
#define cuMemSetAccess			(gpu_cu.cuMemSetAccess)
#define cuMemGetAllocationGranularity	(gpu_cu.cuMemGetAllocationGranularity)
#define cuMemHostRegister_v2		(gpu_cu.cuMemHostRegister_v2)
#define cuMemHostUnregister		(gpu_cu.cuMemHostUnregister)
#define cuMemHostGetFlags		(gpu_cu.cuMemHostGetFlags)
#define cuMemcpyHtoDAsync_v2		(gpu_cu.cuMemcpyHtoDAsync_v2)
#define cuMemcpyDtoHAsync_v2		(gpu_cu.cuMemcpyDtoHAsync_v2)
#define cuMemcpyDtoDAsync_v2		(gpu_cu.cuMemcpyDtoDAsync_v2)
#define cuStreamCreate			(gpu_cu.cuStreamCreate)
/* cuda.h: cuStreamSynchronize -> __CUDA_API_PTSZ(cuStreamSynchronize),
 * i.e. itself without per-thread default streams: replace its macro. */
#undef cuStreamSynchronize
#define cuStreamSynchronize		(gpu_cu.cuStreamSynchronize)
#define cuPointerGetAttribute		(gpu_cu.cuPointerGetAttribute)
#define cuPointerGetAttributes		(gpu_cu.cuPointerGetAttributes)
#define cuIpcGetMemHandle		(gpu_cu.cuIpcGetMemHandle)
#define cuIpcOpenMemHandle_v2		(gpu_cu.cuIpcOpenMemHandle_v2)
#define cuIpcCloseMemHandle		(gpu_cu.cuIpcCloseMemHandle)
#define cuMemExportToShareableHandle	(gpu_cu.cuMemExportToShareableHandle)
#define cuMemImportFromShareableHandle	(gpu_cu.cuMemImportFromShareableHandle)
#define cuModuleLoadData		(gpu_cu.cuModuleLoadData)
#define cuModuleGetFunction		(gpu_cu.cuModuleGetFunction)
#define cuFuncGetAttribute		(gpu_cu.cuFuncGetAttribute)
/* cuda.h: cuLaunchKernel -> __CUDA_API_PTSZ(cuLaunchKernel): as above. */
#undef cuLaunchKernel
#define cuLaunchKernel			(gpu_cu.cuLaunchKernel)
#endif /* GPU_DL_NO_REDIRECT */

#endif /* TIERFS_GPU_DL_H */
