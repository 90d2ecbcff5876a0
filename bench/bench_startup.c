/*
 * bench_startup.c - how soon a tierfs mount accepts checkpoints, against
 * allocating the same caches the naive way.
 *
 *   bench_startup TIERFS_BIN [GPU_CACHE_GIB [HOST_CACHE_GIB]]
 *
 * tierfs: time from starting the daemon to the first accepted 1 MiB write,
 * and to fully built caches (GPU cache mapped and host cache pinned, read
 * from user.tierfs.stats).  Naive: cuMemAlloc of the GPU cache plus
 * cuMemHostAlloc of the host cache, in this process: nothing can be
 * written before both return.  Prints one table.
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int built(const char *mnt)
{
	char buf[8192];
	ssize_t n = getxattr(mnt, "user.tierfs.stats", buf, sizeof(buf) - 1);

	if (n <= 0)
		return 0;
	buf[n] = 0;
	return strstr(buf, "\"fully_mapped\":true") && strstr(buf, "\"pinned\":true");
}

int main(int argc, char **argv)
{
	double gpu_gib = argc > 2 ? atof(argv[2]) : 4, host_gib = argc > 3 ? atof(argv[3]) : 32;
	char dir[] = "/var/tmp/tierfs-startup.XXXXXX", b[256], m[256], f[300], opt[128];
	static char data[1 << 20];
	double t0, t_first = -1, t_built = -1;
	pid_t pid;

	if (argc < 2) {
		fprintf(stderr, "usage: %s TIERFS_BIN [GPU_CACHE_GIB [HOST_CACHE_GIB]]\n", argv[0]);
		return 2;
	}
	if (!mkdtemp(dir))
		return 1;
	snprintf(b, sizeof(b), "%s/b", dir);
	snprintf(m, sizeof(m), "%s/m", dir);
	snprintf(f, sizeof(f), "%s/first", m);
	mkdir(b, 0755);
	mkdir(m, 0755);
	snprintf(opt, sizeof(opt), "gpu=0,gpu_cache=%.0fM,host_cache=%.0fM",
		 gpu_gib * 1024, host_gib * 1024);
	memset(data, 0x5a, sizeof(data));

	t0 = now();
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		dup2(null, 2);
		execl(argv[1], argv[1], b, m, "-f", "-o", opt, (char *)NULL);
		_exit(127);
	}
	while (now() - t0 < 120) {
		struct stat sm, sd;

		if (stat(m, &sm) == 0 && stat(dir, &sd) == 0 && sm.st_dev != sd.st_dev) {
			int fd = open(f, O_CREAT | O_WRONLY | O_TRUNC, 0644);

			if (fd >= 0 && write(fd, data, sizeof(data)) == (ssize_t)sizeof(data) &&
			    close(fd) == 0) {
				t_first = now() - t0;
				break;
			}
		}
		usleep(200);
	}
	while (t_first >= 0 && now() - t0 < 300) {
		if (built(m)) {
			t_built = now() - t0;
			break;
		}
		usleep(1000);
	}
	if (fork() == 0) {
		execlp("umount", "umount", m, (char *)NULL);
		_exit(127);
	}
	wait(NULL);
	waitpid(pid, NULL, 0);

	/* the naive way: allocate both caches before the first write */
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr d;
	void *h;
	double n0 = now(), n_gpu, n_host;

	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
	    cuCtxSetCurrent(ctx)) {
		fprintf(stderr, "no CUDA device\n");
		return 77;
	}
	double n1 = now();
	if (cuMemAlloc(&d, (size_t)(gpu_gib * (1 << 30)))) {
		fprintf(stderr, "cuMemAlloc failed\n");
		return 1;
	}
	n_gpu = now() - n1;
	if (cuMemHostAlloc(&h, (size_t)(host_gib * (1 << 30)), CU_MEMHOSTALLOC_PORTABLE)) {
		fprintf(stderr, "cuMemHostAlloc failed\n");
		return 1;
	}
	n_host = now() - n1 - n_gpu;
	double n_first = now() - n0;
	cuMemFreeHost(h);
	cuMemFree(d);

	printf("start-up with a %.0f GiB GPU cache and a %.0f GiB host cache\n", gpu_gib, host_gib);
	printf("%-40s %10s %14s\n", "", "first write", "caches built");
	printf("%-40s %9.3fs %13.3fs\n", "tierfs (VMM + background touch/pin)", t_first, t_built);
	printf("%-40s %9.3fs %13.3fs   (cuInit %.3fs, cuMemAlloc %.3fs, cuMemHostAlloc %.3fs)\n",
	       "naive (cuMemAlloc + cuMemHostAlloc)", n_first, n_first, n1 - n0, n_gpu, n_host);
	if (t_first > 0)
		printf("first write: tierfs %.1fx sooner\n", n_first / t_first);
	rmdir(m);
	rmdir(b);
	rmdir(dir);
	return t_first < 0;
}
