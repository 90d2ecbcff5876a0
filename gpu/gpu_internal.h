/*
 * gpu_internal.h - what the CUDA files of gpu/ share, and nothing more.
 *
 * Only files under gpu/ include this header (it pulls in <cuda.h>).  It
 * holds the CUresult -> -errno mapping, the GPU_CU() error macro, the
 * helper that makes the device's primary context current in the calling
 * thread, and the logging hook.  Through gpu_dl.h, every cu*() call in a
 * file that includes it goes through the driver table gpu_dl.c fills at
 * run time (nothing links libcuda).
 *
 * Logging: tierfs_log() of common/log.c, which every program that links
 * gpu/ links too (libtierfs a silent one; the GPU test programs their
 * own).  gpu_log() calls it without reading tierfs_log_level: it filters
 * by level itself, and a test program's own logger has no level.
 */
#ifndef TIERFS_GPU_INTERNAL_H
#define TIERFS_GPU_INTERNAL_H

#include <syslog.h>

#include <cuda.h>

#include "gpu.h"
#include "gpu_dl.h"
#include "lockorder.h"
#include "log.h"

#define gpu_log(level, ...)	tierfs_log((level), __VA_ARGS__)

/*
 * Map a CUresult to -errno without logging: out of memory -> -ENOMEM,
 * invalid value/handle -> -EINVAL, everything else -> -EIO.
 */
int gpu_cu_errno(CUresult r);

/*
 * Log "gpu: <call> failed: <name> (<text>)" once at LOG_ERR and return
 * gpu_cu_errno(r).  `what` is the failing call's source text.
 */
int gpu_cu_err(const char *what, CUresult r);

/*
 * Run `call`; on failure set `ret` (an int in scope) to the mapped -errno,
 * log the call text once, and jump to `label`.
 */
#define GPU_CU(call, label) do {				\
	CUresult __r = (call);					\
	if (__r != CUDA_SUCCESS) {				\
		ret = gpu_cu_err(#call, __r);			\
		goto label;					\
	}							\
} while (0)

/*
 * Make the primary context of the device picked by gpu_init() current in
 * the calling thread (cheap when it already is).  Returns 0, -ENODEV before
 * a successful gpu_init(), or the mapped CUDA error.
 */
int gpu_ctx_enter(void);

/* The device picked by gpu_init(): handle and ordinal.  Only meaningful
 * once gpu_available(). */
CUdevice gpu_cu_device(void);
int gpu_cu_ordinal(void);
/* Device ordinals below this may get a context of their own
 * (gpu_ctx_enter_dev); others are refused with -ENODEV. */
#define GPU_MAX_ORDINAL	64
int gpu_ctx_enter_dev(int dev);

#endif /* TIERFS_GPU_INTERNAL_H */
