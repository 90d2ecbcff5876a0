/*
 * bench_balance_mount - checkpoint load balancing through a tierfs mount
 * over several GPUs (-o gpu=0:1,balance=...): every GPU checkpoints at once
 * through the ioctl, one process per GPU, while GPU 0's part of the cache
 * is nearly full of checkpoints still open for writing (not evictable).
 *
 * usage: bench_balance_mount MOUNT NGPUS CKPT_MIB FILL_MIB [REPS]
 *
 * Per run: process i (GPU i) allocates CKPT_MIB of device memory and fills
 * it with a pattern of its own; process 0 first writes FILL_MIB into files
 * it keeps open (in 256 MiB files).  When every process is ready they all
 * start together: open a fresh file, tierfs_pwrite_gpu() the whole buffer,
 * close.  The group blocking time is from the common start until the last
 * close returned.  Then each reads its file back into a second buffer with
 * tierfs_pread_gpu() and compares 64 KiB at 16 places; the files are
 * removed.  Printed: each run's blocking time and each GPU's own time,
 * their medians, and the mount's balance counters (to_peer, to_host) over
 * the runs.  A raw cuMemcpyDtoD of CKPT_MIB on each GPU at once, in the same
 * processes, is the floor.
 *
 * Exit 0, 77 without a CUDA driver or with fewer than NGPUS devices, 1 on
 * an error or a mismatch.
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "tierfs.h"

#define MiB		((size_t)1 << 20)
#define MAXG		8
#define MAXREPS		25
#define FILL_FILE	(256 * MiB)

struct report {
	double t0, t1;		/* start and end of the checkpoint */
	double raw_s;		/* the raw copy of the same size */
	double peer_s;		/* GPU 0 only: a raw cuMemcpyPeer of it to GPU 1 */
	int ok;			/* read back and matched */
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CK(call) do {							\
	CUresult r_ = (call);						\
	if (r_ != CUDA_SUCCESS) {					\
		const char *s_ = "?";					\
		cuGetErrorString(r_, &s_);				\
		fprintf(stderr, "bench_balance_mount: %s: %s\n", #call, s_); \
		_exit(1);						\
	}								\
} while (0)

/* One GPU's process: set up, say ready, wait for go, checkpoint, check. */
static void child(const char *mnt, int gpu, int ngpu, int rep, size_t ckpt, size_t fill,
		  int ready_fd, int go_fd, int out_fd)
{
	struct report r = { 0 };
	CUdevice d;
	CUcontext ctx;
	CUdeviceptr buf, back, scratch;
	int fills[64], nfill = 0, fd;
	char path[4096], c;
	uint32_t pat = 0x9e3779b9u * (uint32_t)(rep * MAXG + gpu + 1);

	CK(cuInit(0));
	CK(cuDeviceGet(&d, gpu));
	CK(cuDevicePrimaryCtxRetain(&ctx, d));
	CK(cuCtxSetCurrent(ctx));
	CK(cuMemAlloc(&buf, ckpt));
	CK(cuMemAlloc(&back, ckpt));
	CK(cuMemAlloc(&scratch, ckpt));
	CK(cuMemsetD32(buf, pat, ckpt / 4));
	/* the floor: a device copy of the same size, alone */
	CK(cuCtxSynchronize());
	r.raw_s = now();
	CK(cuMemcpyDtoD(scratch, buf, ckpt));
	CK(cuCtxSynchronize());
	r.raw_s = now() - r.raw_s;
	if (gpu == 0 && ngpu > 1) {	/* the raw peer copy of the same size */
		CUdevice d1;
		CUcontext c1;
		CUdeviceptr b1;

		CK(cuDeviceGet(&d1, 1));
		CK(cuDevicePrimaryCtxRetain(&c1, d1));
		CK(cuCtxSetCurrent(c1));
		CK(cuMemAlloc(&b1, ckpt));
		CK(cuCtxSetCurrent(ctx));
		if (cuCtxEnablePeerAccess(c1, 0) != CUDA_SUCCESS)	/* else staged via host */
			fprintf(stderr, "bench_balance_mount: no peer access 0 -> 1\n");
		CK(cuMemcpyPeer(b1, c1, scratch, ctx, ckpt));	/* warm-up */
		CK(cuCtxSynchronize());
		r.peer_s = now();
		CK(cuMemcpyPeer(b1, c1, buf, ctx, ckpt));
		CK(cuCtxSynchronize());
		r.peer_s = now() - r.peer_s;
		CK(cuCtxSetCurrent(c1));
		CK(cuMemFree(b1));
		CK(cuCtxSetCurrent(ctx));
	}
	for (size_t done = 0; gpu == 0 && done < fill && nfill < 64; nfill++) {
		size_t n = fill - done < FILL_FILE ? fill - done : FILL_FILE;

		if (n > ckpt)
			n = ckpt;
		snprintf(path, sizeof(path), "%s/fill.%d.%d", mnt, rep, nfill);
		fills[nfill] = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fills[nfill] < 0 || tierfs_pwrite_gpu(fills[nfill], (void *)buf, n, 0) != (ssize_t)n) {
			perror("bench_balance_mount: fill");
			_exit(1);
		}
		done += n;
	}
	if (write(ready_fd, "r", 1) != 1 || read(go_fd, &c, 1) != 1)
		_exit(1);
	snprintf(path, sizeof(path), "%s/ckpt.%d.%d", mnt, rep, gpu);
	r.t0 = now();
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || tierfs_pwrite_gpu(fd, (void *)buf, ckpt, 0) != (ssize_t)ckpt ||
	    close(fd) < 0) {
		perror("bench_balance_mount: checkpoint");
		_exit(1);
	}
	r.t1 = now();
	fd = open(path, O_RDONLY);
	r.ok = fd >= 0 && tierfs_pread_gpu(fd, (void *)back, ckpt, 0) == (ssize_t)ckpt;
	if (fd >= 0)
		close(fd);
	for (int k = 0; r.ok && k < 16; k++) {
		static uint32_t a[16384];
		size_t off = (ckpt - sizeof(a)) / 15 * k & ~(size_t)3;

		CK(cuMemcpyDtoH(a, back + off, sizeof(a)));
		for (size_t w = 0; w < sizeof(a) / 4; w++)
			if (a[w] != pat) {
				r.ok = 0;
				break;
			}
	}
	if (write(out_fd, &r, sizeof(r)) != sizeof(r))
		_exit(1);
	for (int k = 0; k < nfill; k++) {
		close(fills[k]);
		snprintf(path, sizeof(path), "%s/fill.%d.%d", mnt, rep, k);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/ckpt.%d.%d", mnt, rep, gpu);
	unlink(path);
	_exit(0);
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* A counter of the mount's "balance" statistics, -1 when absent. */
static long long stat_of(const char *mnt, const char *key)
{
	static char js[1 << 20];
	char pat[64];
	ssize_t n = getxattr(mnt, TIERFS_XATTR_STATS, js, sizeof(js) - 1);
	char *p;

	if (n < 0)
		return -1;
	js[n] = '\0';
	p = strstr(js, "\"balance\":");
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = p ? strstr(p, pat) : NULL;
	return p ? atoll(p + strlen(pat)) : -1;
}

int main(int argc, char **argv)
{
	double block[MAXREPS], own[MAXG][MAXREPS], raw[MAXG][MAXREPS], peer[MAXREPS] = { 0 };
	long long peer0, host0, split0;
	int ngpu, reps, count = 0, bad = 0;
	size_t ckpt, fill;

	if (argc < 5) {
		fprintf(stderr, "usage: %s MOUNT NGPUS CKPT_MIB FILL_MIB [REPS]\n", argv[0]);
		return 1;
	}
	ngpu = atoi(argv[2]);
	ckpt = (size_t)atoll(argv[3]) * MiB;
	fill = (size_t)atoll(argv[4]) * MiB;
	reps = argc > 5 ? atoi(argv[5]) : 5;
	if (ngpu < 1 || ngpu > MAXG || !ckpt || reps < 1 || reps > MAXREPS) {
		fprintf(stderr, "bench_balance_mount: 1..%d GPUs, 1..%d runs\n", MAXG, MAXREPS);
		return 1;
	}
	/* count the devices in a child: this process must not start CUDA
	 * before it forks */
	{
		int p[2];
		pid_t pid;

		if (pipe(p))
			return 1;
		pid = fork();
		if (pid == 0) {
			int n = 0;

			if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS)
				n = 0;
			_exit(write(p[1], &n, sizeof(n)) == sizeof(n) ? 0 : 1);
		}
		if (read(p[0], &count, sizeof(count)) != sizeof(count))
			count = 0;
		waitpid(pid, NULL, 0);
		close(p[0]);
		close(p[1]);
	}
	if (count < ngpu) {
		fprintf(stderr, "bench_balance_mount: %d CUDA devices, %d asked for\n", count, ngpu);
		return 77;
	}
	peer0 = stat_of(argv[1], "to_peer");
	host0 = stat_of(argv[1], "to_host");
	split0 = stat_of(argv[1], "split");
	for (int rep = 0; rep < reps; rep++) {
		int ready[2], go[2], out[2];
		double t0 = 1e30, t1 = 0;
		pid_t pids[MAXG];
		char c;

		if (pipe(ready) || pipe(go) || pipe(out))
			return 1;
		for (int i = 0; i < ngpu; i++) {
			pids[i] = fork();
			if (pids[i] == 0)
				child(argv[1], i, ngpu, rep, ckpt, fill, ready[1], go[0], out[1]);
		}
		for (int i = 0; i < ngpu; i++)
			if (read(ready[0], &c, 1) != 1)
				return 1;
		for (int i = 0; i < ngpu; i++)
			if (write(go[1], "g", 1) != 1)
				return 1;
		for (int i = 0; i < ngpu; i++) {
			struct report r;

			if (read(out[0], &r, sizeof(r)) != sizeof(r)) {
				fprintf(stderr, "bench_balance_mount: a GPU's process failed\n");
				return 1;
			}
			t0 = r.t0 < t0 ? r.t0 : t0;
			t1 = r.t1 > t1 ? r.t1 : t1;
			bad += !r.ok;
			own[i][rep] = r.t1 - r.t0;
			raw[i][rep] = r.raw_s;
			if (r.peer_s > 0)
				peer[rep] = r.peer_s;
		}
		/* reports come in completion order: own[] is per finisher, which is
		 * enough for the spread below; the group time is exact */
		for (int i = 0; i < ngpu; i++)
			waitpid(pids[i], NULL, 0);
		block[rep] = t1 - t0;
		close(ready[0]); close(ready[1]); close(go[0]); close(go[1]);
		close(out[0]); close(out[1]);
		printf("run %d: group blocking %.3f ms\n", rep, block[rep] * 1e3);
		usleep(300 * 1000);	/* the removed files' copies go */
	}
	qsort(block, (size_t)reps, sizeof(double), cmp);
	qsort(peer, (size_t)reps, sizeof(double), cmp);
	for (int i = 0; i < ngpu; i++) {
		qsort(own[i], (size_t)reps, sizeof(double), cmp);
		qsort(raw[i], (size_t)reps, sizeof(double), cmp);
	}
	printf("%d GPUs, %zu MiB each, %zu MiB held open on GPU 0: group blocking %.3f ms "
	       "(median of %d; fastest GPU %.3f ms, slowest %.3f ms; raw copy %.3f ms, "
	       "raw cuMemcpyPeer 0->1 %.3f ms = %.1f GB/s); to_peer %lld (split %lld), "
	       "to_host %lld; %s\n", ngpu, ckpt / MiB, fill / MiB,
	       block[reps / 2] * 1e3, reps, own[0][reps / 2] * 1e3,
	       own[ngpu - 1][reps / 2] * 1e3, raw[0][reps / 2] * 1e3,
	       ngpu > 1 ? peer[reps / 2] * 1e3 : 0.0,
	       ngpu > 1 && peer[reps / 2] > 0 ? ckpt / peer[reps / 2] / 1e9 : 0.0,
	       stat_of(argv[1], "to_peer") - peer0, stat_of(argv[1], "split") - split0,
	       stat_of(argv[1], "to_host") - host0, bad ? "MISMATCH" : "all read back");
	return bad ? 1 : 0;
}
