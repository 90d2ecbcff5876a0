/*
 * gpu_checkpoint.c - checkpoint a GPU buffer into tierfs and restore it,
 * device to device, with libtierfs (tierfs-gpu(7)).
 *
 * usage: gpu_checkpoint FILE [MIB] [DEVICE]
 *
 * FILE is a path on a tierfs mount whose daemon has a GPU tier on the same
 * GPU (-o gpu=DEVICE).  The program allocates MIB MiB (default 64) with
 * cuMemAlloc, fills it with a pattern (copied from the host: no kernel
 * needed), checkpoints it with tierfs_pwrite_gpu, clears the buffer,
 * restores it with tierfs_pread_gpu and checks every byte.
 *
 * Outside the tierfs tree:
 *	cc gpu_checkpoint.c -o gpu_checkpoint $(pkg-config --cflags --libs libtierfs) \
 *	   -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcuda
 * In the tree (TIERFS_IN_TREE) the driver calls go through gpu/gpu_dl.h
 * instead, which loads libcuda at run time: the source is the same.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include <tierfs.h>
#ifdef TIERFS_IN_TREE
#include "gpu_dl.h"
#endif

#define CU(call) do {							\
	CUresult r_ = (call);						\
	if (r_ != CUDA_SUCCESS) {					\
		const char *n_ = "?";					\
		cuGetErrorName(r_, &n_);				\
		fprintf(stderr, "%s: %s\n", #call, n_);			\
		exit(1);						\
	}								\
} while (0)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 2 ? strtoul(argv[2], NULL, 0) : 64;
	int ordinal = argc > 3 ? atoi(argv[3]) : 0;
	size_t n = mib << 20, i;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr buf;
	unsigned char *host;
	double t0, t_ckpt, t_rest;
	ssize_t r;
	int fd;

	if (argc < 2 || !n) {
		fprintf(stderr, "usage: %s FILE [MIB] [DEVICE]\n", argv[0]);
		return 2;
	}
#ifdef TIERFS_IN_TREE
	{
		char msg[256];

		if (gpu_dl_load(msg, sizeof(msg))) {
			fprintf(stderr, "%s\n", msg);
			return 77;
		}
	}
#endif
	/* the application's usual CUDA set-up */
	CU(cuInit(0));
	CU(cuDeviceGet(&dev, ordinal));
	CU(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU(cuCtxSetCurrent(ctx));
	CU(cuMemAlloc(&buf, n));

	/* fill it: a pattern that depends on the position, copied from host */
	host = malloc(n);
	if (!host) {
		perror("malloc");
		return 1;
	}
	for (i = 0; i < n; i++)
		host[i] = (unsigned char)(i * 31 + (i >> 12));
	CU(cuMemcpyHtoDAsync(buf, host, n, NULL));
	CU(cuStreamSynchronize(NULL));

	/* checkpoint */
	fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	if (tierfs_is_tierfs(fd) != 1)
		fprintf(stderr, "warning: %s is not on tierfs\n", argv[1]);
	t0 = now();
	r = tierfs_pwrite_gpu(fd, (const void *)(uintptr_t)buf, n, 0);
	t_ckpt = now() - t0;
	if (r != (ssize_t)n) {
		fprintf(stderr, "tierfs_pwrite_gpu: %s\n",
			r < 0 ? strerror(errno) : "short write");
		return 1;
	}
	if (close(fd) < 0) {		/* close reports a failed flush */
		perror("close");
		return 1;
	}

	/* where tierfs keeps it now, fastest tier first: "gpu,host" */
	{
		char tier[64] = "";
		ssize_t tl = getxattr(argv[1], TIERFS_XATTR_TIER, tier,
				      sizeof(tier) - 1);

		printf("checkpoint cached in: %s\n", tl > 0 ? tier : "?");
	}

	/* clobber the buffer, then restore it */
	memset(host, 0, n);
	CU(cuMemcpyHtoDAsync(buf, host, n, NULL));
	CU(cuStreamSynchronize(NULL));
	fd = open(argv[1], O_RDONLY);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	t0 = now();
	r = tierfs_pread_gpu(fd, (void *)(uintptr_t)buf, n, 0);
	t_rest = now() - t0;
	if (r != (ssize_t)n) {
		fprintf(stderr, "tierfs_pread_gpu: %s\n",
			r < 0 ? strerror(errno) : "short read");
		return 1;
	}
	close(fd);

	/* verify */
	CU(cuMemcpyDtoHAsync(host, buf, n, NULL));
	CU(cuStreamSynchronize(NULL));
	for (i = 0; i < n; i++) {
		if (host[i] != (unsigned char)(i * 31 + (i >> 12))) {
			fprintf(stderr, "restored data differs at byte %zu\n", i);
			return 1;
		}
	}
	printf("%zu MiB: checkpoint %.3f s (%.2f GB/s), restore %.3f s "
	       "(%.2f GB/s), verified\n", mib, t_ckpt, n / t_ckpt / 1e9,
	       t_rest, n / t_rest / 1e9);
	free(host);
	CU(cuMemFree(buf));
	CU(cuDevicePrimaryCtxRelease(dev));
	return 0;
}
