/*
 * bench_startup.c - how soon a tierfs mount accepts checkpoints, and how
 * long a forward pass blocks the application, against allocating the same
 * caches the naive way.
 *
 *   bench_startup [-k K] [-s SIZE] [-c MS] TIERFS_BIN [GPU_CACHE_GIB [HOST_CACHE_GIB]]
 *
 * Defaults: a 4 GiB GPU cache, a 32 GiB host cache (the HiPC'22 paper's
 * "large-host" set-up), K = 32 checkpoints of SIZE = 64 MiB (binary K/M/G
 * suffixes; at least 1 MiB), MS = 100 ms of compute between them.
 *
 * Before anything, a child process checks for a CUDA device (cuInit,
 * cuDeviceGetCount): none gives one line on stderr and exit status 77.
 * This process itself initialises CUDA only in the naive run, where that
 * is timed.  Then, one after the other:
 *
 *  1. Start-up (a first daemon, `TIERFS_BIN B M -f -o gpu=0,gpu_cache=..,
 *     host_cache=..`, stderr to a log in the temporary directory): time
 *     from fork() to the first accepted checkpoint of 1 MiB (open
 *     O_CREAT|O_TRUNC, one write(), close on the mount), and to fully built
 *     caches (GPU cache mapped and host cache pinned, read from
 *     user.tierfs.stats, polled every ms).  Unmount, wait for the daemon.
 *
 *  2. Forward pass on tierfs (a second, fresh daemon on a fresh backing
 *     directory): right after fork() the application starts the forward
 *     pass of bench_hints: K checkpoints ckpt.NNNN of SIZE bytes, each
 *     open(O_CREAT|O_TRUNC), write() in 1 MiB calls, close(), with a
 *     compute interval (a sleep) between two checkpoints.  Blocked time:
 *     from fork() until the mount accepted checkpoint 0 (waiting for the
 *     mount counts), plus the open+write+close of every later checkpoint;
 *     compute intervals are not blocked.  Then, untimed: checkpoints 0,
 *     K/2 and K-1 are read back and compared, all are unlinked, the mount
 *     is unmounted and the daemon waited for.
 *
 *  3. Naive, in this process: cuInit + primary context, cuMemAlloc of the
 *     GPU cache, cuMemHostAlloc of the host cache (blocked: nothing can be
 *     written before they return; this allocation also gives table 1's
 *     naive row), then the same forward pass into that in-process cache:
 *     each checkpoint memcpy'd into the pinned host buffer, then
 *     cuMemcpyHtoD'd into the device buffer (synchronous from pinned
 *     memory), at consecutive offsets that wrap around.  Blocked time: the
 *     initialisation and allocations plus those copies.  Untimed: the last
 *     checkpoint is copied back from the device and compared.
 *
 * Every checkpoint is the same pseudo-random SIZE bytes with a 16-byte tag
 * (magic ^ checkpoint number, chunk number) at the start of each 1 MiB
 * chunk, stamped before the checkpoint's timer starts, so a file holding
 * another checkpoint's or another offset's data fails the comparison.
 *
 * Output: two tables (start-up; forward pass: blocked total and time for
 * the whole pass, ratio naive/tierfs of blocked time, also without the
 * naive run's cuInit + context, which an application that already uses the
 * GPU has paid).  Exit status 0; 1 on a failure (a daemon that exits or
 * does not mount within 120 s, a failed call, wrong data); 77 without a
 * CUDA device.  The temporary directory (under /var/tmp) is removed unless
 * a mount could not be undone.
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define CHUNK		(1u << 20)	/* bytes per write()/read() call */
#define TAG_MAGIC	0x7473747274737462ull	/* tag of every chunk */
#define MOUNT_TIMEOUT	120.0		/* s from fork() to the first checkpoint */
#ifndef BUILT_TIMEOUT
#define BUILT_TIMEOUT	300.0		/* s from fork() to fully built caches */
#endif
#define EXIT_TIMEOUT	60.0		/* s from unmount to the daemon's exit */

struct params {
	const char *bin;		/* the tierfs binary */
	double gpu_gib, host_gib;	/* cache sizes as given */
	size_t gpu_bytes, host_bytes;	/* the same, whole MiB */
	unsigned k;			/* checkpoints in the forward pass */
	size_t size;			/* bytes per checkpoint */
	double interval;		/* s of compute between two checkpoints */
};

struct daemon {
	pid_t pid;			/* 0: not started or reaped */
	int status;			/* wait status once reaped */
	int seen_mounted;		/* the mount answered at least once */
	char b[300], m[300];		/* backing directory, mount point */
	char log[300];			/* its stderr */
};

struct startup_result {
	double first;			/* s to the first 1 MiB checkpoint, or -1 */
	double built;			/* s to fully built caches, or -1 */
};

struct fwd_result {
	double mount;			/* s until the mount point was a mount */
	double first;			/* s until checkpoint 0 was accepted */
	double blocked;			/* s blocked in all */
	double pass;			/* s for the whole pass */
	double init, gpu, host;		/* naive: cuInit + context, the allocations */
};

static const char *tmpdir;		/* the temporary directory, for stat() */

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_for(double s)
{
	struct timespec ts;
	long long ns;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ns = ts.tv_nsec + (long long)(s * 1e9);
	ts.tv_sec += ns / 1000000000;
	ts.tv_nsec = ns % 1000000000;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* 0 for CUDA_SUCCESS, else 1 after a message naming the call. */
static int cu_failed(const char *call, CUresult r)
{
	const char *name = NULL;

	if (r == CUDA_SUCCESS)
		return 0;
	if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
		name = "unknown error";
	fprintf(stderr, "bench_startup: %s: %s (%d)\n", call, name, (int)r);
	return 1;
}

#define CU(call, label) do {				\
	if (cu_failed(#call, (call)))			\
		goto label;				\
} while (0)

/* ---- data ------------------------------------------------------------- */

static void fill_pattern(char *buf, size_t size)
{
	uint64_t x = 0x243f6a8885a308d3ull, w;
	size_t i;

	for (i = 0; i + sizeof(w) <= size; i += sizeof(w)) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		w = x;
		memcpy(buf + i, &w, sizeof(w));
	}
	for (; i < size; i++)
		buf[i] = (char)i;
}

/* Tag each 1 MiB chunk of buf as chunk c of checkpoint file. */
static void stamp(char *buf, size_t size, unsigned file)
{
	size_t off, n;
	uint64_t tag[2];

	for (off = 0; off < size; off += CHUNK) {
		tag[0] = TAG_MAGIC ^ file;
		tag[1] = off / CHUNK;
		n = size - off < sizeof(tag) ? size - off : sizeof(tag);
		memcpy(buf + off, tag, n);
	}
}

/* ---- checkpoints on the mount ----------------------------------------- */

/* open(O_CREAT|O_TRUNC), write() in 1 MiB calls, close(): 0 or -errno. */
static int ckpt_write(const char *path, const char *buf, size_t size)
{
	size_t off = 0, n;
	ssize_t w;
	int fd, ret;

	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (fd < 0)
		return -errno;
	while (off < size) {
		n = size - off < CHUNK ? size - off : CHUNK;
		w = write(fd, buf + off, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			ret = w < 0 ? -errno : -EIO;
			close(fd);
			return ret;
		}
		off += (size_t)w;
	}
	if (close(fd) < 0)
		return -errno;
	return 0;
}

/* Read path back and compare with want: 0, or 1 with a message. */
static int ckpt_verify(const char *path, const char *want, size_t size, char *buf)
{
	struct stat st;
	size_t off = 0, n, i;
	ssize_t r;
	int fd = open(path, O_RDONLY);

	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "bench_startup: verify %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return 1;
	}
	if ((size_t)st.st_size != size) {
		fprintf(stderr, "bench_startup: verify %s: size %lld, want %zu\n",
			path, (long long)st.st_size, size);
		close(fd);
		return 1;
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);	/* read from tierfs */
	while (off < size) {
		n = size - off < CHUNK ? size - off : CHUNK;
		r = read(fd, buf, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			fprintf(stderr, "bench_startup: verify %s: read at %zu: %s\n", path, off,
				r < 0 ? strerror(errno) : "early end of file");
			close(fd);
			return 1;
		}
		if (memcmp(buf, want + off, (size_t)r)) {
			for (i = 0; buf[i] == want[off + i]; i++)
				;
			fprintf(stderr, "bench_startup: verify %s: wrong data at byte %zu\n",
				path, off + i);
			close(fd);
			return 1;
		}
		off += (size_t)r;
	}
	close(fd);
	return 0;
}

/* ---- the daemon ------------------------------------------------------- */

/* The mount point answers as a mount, or as a dead one (ENOTCONN). */
static int mounted(const char *m)
{
	struct stat sm, sd;

	if (stat(m, &sm) < 0)
		return errno == ENOTCONN;
	return stat(tmpdir, &sd) == 0 && sm.st_dev != sd.st_dev;
}

/* The daemon exited (reaped now or before). */
static int daemon_exited(struct daemon *dm)
{
	if (dm->pid > 0 && waitpid(dm->pid, &dm->status, WNOHANG) == dm->pid)
		dm->pid = 0;
	return dm->pid == 0;
}

static void daemon_why(const struct daemon *dm)
{
	char buf[4096];
	ssize_t n;
	off_t end;
	int fd;

	if (WIFEXITED(dm->status))
		fprintf(stderr, "bench_startup: tierfs exited with status %d\n",
			WEXITSTATUS(dm->status));
	else if (WIFSIGNALED(dm->status))
		fprintf(stderr, "bench_startup: tierfs killed by signal %d\n", WTERMSIG(dm->status));
	fd = open(dm->log, O_RDONLY);
	if (fd < 0)
		return;
	end = lseek(fd, 0, SEEK_END);
	lseek(fd, end > (off_t)sizeof(buf) - 1 ? end - (off_t)sizeof(buf) + 1 : 0, SEEK_SET);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n > 0) {
		buf[n] = 0;
		fprintf(stderr, "---- end of %s ----\n%s----\n", dm->log, buf);
	}
}

/* fork/exec TIERFS_BIN B M -f -o OPT; 0 or -errno. */
static int daemon_start(struct daemon *dm, const struct params *p, const char *name)
{
	char opt[160];

	snprintf(dm->b, sizeof(dm->b), "%s/b%s", tmpdir, name);
	snprintf(dm->m, sizeof(dm->m), "%s/m%s", tmpdir, name);
	snprintf(dm->log, sizeof(dm->log), "%s/tierfs%s.log", tmpdir, name);
	if (mkdir(dm->b, 0755) < 0 || mkdir(dm->m, 0755) < 0)
		return -errno;
	snprintf(opt, sizeof(opt), "gpu=0,gpu_cache=%zuM,host_cache=%zuM",
		 p->gpu_bytes >> 20, p->host_bytes >> 20);
	dm->seen_mounted = 0;
	dm->status = 0;
	dm->pid = fork();
	if (dm->pid < 0) {
		dm->pid = 0;
		return -errno;
	}
	if (dm->pid == 0) {
		int fd = open(dm->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execl(p->bin, p->bin, dm->b, dm->m, "-f", "-o", opt, (char *)NULL);
		fprintf(stderr, "exec %s: %s\n", p->bin, strerror(errno));
		_exit(127);
	}
	return 0;
}

/* Run a command, its output to ours; its exit status, or -1. */
static int run_cmd(const char *a0, const char *a1, const char *a2)
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0) {
		execlp(a0, a0, a1, a2, (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

static int wait_exit(struct daemon *dm, double timeout)
{
	double t0 = now();

	while (!daemon_exited(dm)) {
		if (now() - t0 > timeout)
			return -1;
		usleep(10000);
	}
	return 0;
}

/*
 * Unmount (umount M, else fusermount3 -u -z M) and wait for the daemon;
 * SIGTERM, then SIGKILL, if it does not exit.  0 when the daemon is gone
 * and M is no mount any more.
 */
static int daemon_stop(struct daemon *dm)
{
	if (dm->seen_mounted || mounted(dm->m)) {
		if (run_cmd("umount", dm->m, NULL) != 0)
			run_cmd("fusermount3", "-uz", dm->m);
	}
	if (dm->pid > 0 && wait_exit(dm, EXIT_TIMEOUT) < 0) {
		fprintf(stderr, "bench_startup: tierfs still running %.0f s after unmount: "
			"SIGTERM\n", EXIT_TIMEOUT);
		kill(dm->pid, SIGTERM);
		if (wait_exit(dm, 10) < 0) {
			kill(dm->pid, SIGKILL);
			wait_exit(dm, 10);
		}
	}
	if (mounted(dm->m)) {
		fprintf(stderr, "bench_startup: %s is still mounted\n", dm->m);
		return -1;
	}
	return dm->pid > 0 ? -1 : 0;
}

/* ---- 1: start-up ------------------------------------------------------ */

static int built(const char *mnt)
{
	char buf[8192];
	ssize_t n = getxattr(mnt, "user.tierfs.stats", buf, sizeof(buf) - 1);

	if (n <= 0)
		return 0;
	buf[n] = 0;
	return strstr(buf, "\"fully_mapped\":true") && strstr(buf, "\"pinned\":true");
}

/* 0, or 1 after a message; *clean is cleared if the mount stayed. */
static int run_startup(const struct params *p, struct startup_result *r, int *clean)
{
	static char data[CHUNK];
	struct daemon dm;
	char f[320];
	double t0;
	int err, ret = 1;

	r->first = r->built = -1;
	memset(data, 0x5a, sizeof(data));
	t0 = now();
	err = daemon_start(&dm, p, "1");
	if (err < 0) {
		fprintf(stderr, "bench_startup: starting tierfs: %s\n", strerror(-err));
		return 1;
	}
	snprintf(f, sizeof(f), "%s/first", dm.m);
	while (now() - t0 < MOUNT_TIMEOUT) {
		if (daemon_exited(&dm))
			break;
		if (mounted(dm.m)) {
			dm.seen_mounted = 1;
			if (ckpt_write(f, data, sizeof(data)) == 0) {
				r->first = now() - t0;
				break;
			}
		}
		usleep(200);
	}
	while (r->first >= 0 && now() - t0 < BUILT_TIMEOUT && !daemon_exited(&dm)) {
		if (built(dm.m)) {
			r->built = now() - t0;
			break;
		}
		usleep(1000);
	}
	if (daemon_exited(&dm))
		daemon_why(&dm);
	else if (r->first < 0)
		fprintf(stderr, "bench_startup: start-up: no write accepted within %.0f s\n",
			MOUNT_TIMEOUT);
	else
		ret = 0;
	if (!ret && r->built < 0)
		fprintf(stderr, "bench_startup: start-up: caches not built within %.0f s\n",
			BUILT_TIMEOUT);
	if (r->first >= 0)
		unlink(f);
	if (daemon_stop(&dm) < 0)
		*clean = 0;
	return ret;
}

/* ---- 2: forward pass on tierfs ---------------------------------------- */

static int run_tierfs(const struct params *p, char *src, char *vbuf, struct fwd_result *r,
		      int *clean)
{
	unsigned check[3] = { 0, p->k / 2, p->k - 1 };
	struct daemon dm;
	char f[320];
	double t0, t;
	int err, first_err = 0, ret = 1;
	unsigned i, done = 0;

	memset(r, 0, sizeof(*r));
	r->mount = r->first = -1;
	stamp(src, p->size, 0);
	t0 = now();
	err = daemon_start(&dm, p, "2");
	if (err < 0) {
		fprintf(stderr, "bench_startup: starting tierfs: %s\n", strerror(-err));
		return 1;
	}
	snprintf(f, sizeof(f), "%s/ckpt.%04u", dm.m, 0u);
	while (now() - t0 < MOUNT_TIMEOUT && !daemon_exited(&dm)) {
		if (!mounted(dm.m)) {
			usleep(200);
			continue;
		}
		if (!dm.seen_mounted) {
			dm.seen_mounted = 1;
			r->mount = now() - t0;
		}
		err = ckpt_write(f, src, p->size);
		if (err == 0) {
			r->first = now() - t0;
			break;
		}
		if (!first_err)
			fprintf(stderr, "bench_startup: checkpoint 0: %s (retrying)\n",
				strerror(-err));
		first_err = err;
		usleep(1000);
	}
	if (r->first < 0) {
		if (dm.pid > 0)
			fprintf(stderr, "bench_startup: forward pass: checkpoint 0 not accepted "
				"within %.0f s\n", MOUNT_TIMEOUT);
		goto stop;
	}
	done = 1;
	r->blocked = r->first;
	for (i = 1; i < p->k; i++) {
		sleep_for(p->interval);
		stamp(src, p->size, i);
		snprintf(f, sizeof(f), "%s/ckpt.%04u", dm.m, i);
		t = now();
		err = ckpt_write(f, src, p->size);
		r->blocked += now() - t;
		if (err) {
			fprintf(stderr, "bench_startup: checkpoint %u: %s\n", i, strerror(-err));
			goto stop;
		}
		done++;
	}
	r->pass = now() - t0;

	for (i = 0; i < 3; i++) {
		if (i && check[i] == check[i - 1])
			continue;
		stamp(src, p->size, check[i]);
		snprintf(f, sizeof(f), "%s/ckpt.%04u", dm.m, check[i]);
		if (ckpt_verify(f, src, p->size, vbuf))
			goto stop;
	}
	ret = 0;
stop:
	if (daemon_exited(&dm)) {
		daemon_why(&dm);
		ret = 1;
	}
	for (i = 0; i < done; i++) {
		snprintf(f, sizeof(f), "%s/ckpt.%04u", dm.m, i);
		unlink(f);
	}
	if (daemon_stop(&dm) < 0)
		*clean = 0;
	return ret;
}

/* ---- 3: the naive way ------------------------------------------------- */

static int run_naive(const struct params *p, char *src, char *vbuf, struct fwd_result *r)
{
	CUdevice dev = 0;
	CUcontext ctx = NULL;
	CUdeviceptr d = 0;
	void *h = NULL;
	size_t hoff = 0, doff = 0, last = 0;
	double t0, t;
	unsigned i;
	int ret = 1;

	memset(r, 0, sizeof(*r));
	stamp(src, p->size, 0);
	t0 = now();
	CU(cuInit(0), out);
	CU(cuDeviceGet(&dev, 0), out);
	CU(cuDevicePrimaryCtxRetain(&ctx, dev), out);
	CU(cuCtxSetCurrent(ctx), release_ctx);
	r->init = now() - t0;
	t = now();
	CU(cuMemAlloc(&d, p->gpu_bytes), release_ctx);
	r->gpu = now() - t;
	t = now();
	CU(cuMemHostAlloc(&h, p->host_bytes, CU_MEMHOSTALLOC_PORTABLE), free_dev);
	r->host = now() - t;
	r->first = r->blocked = now() - t0;

	for (i = 0; i < p->k; i++) {
		if (i) {
			sleep_for(p->interval);
			stamp(src, p->size, i);
		}
		if (hoff + p->size > p->host_bytes)
			hoff = 0;
		if (doff + p->size > p->gpu_bytes)
			doff = 0;
		t = now();
		memcpy((char *)h + hoff, src, p->size);
		CU(cuMemcpyHtoD(d + doff, (char *)h + hoff, p->size), free_host);
		r->blocked += now() - t;
		last = doff;
		hoff += p->size;
		doff += p->size;
	}
	r->pass = now() - t0;

	CU(cuMemcpyDtoH(vbuf, d + last, p->size), free_host);
	if (memcmp(vbuf, src, p->size))
		fprintf(stderr, "bench_startup: naive: checkpoint %u differs on the device\n",
			p->k - 1);
	else
		ret = 0;
free_host:
	if (cu_failed("cuMemFreeHost(h)", cuMemFreeHost(h)))
		ret = 1;
free_dev:
	if (cu_failed("cuMemFree(d)", cuMemFree(d)))
		ret = 1;
release_ctx:
	if (cu_failed("cuDevicePrimaryCtxRelease(dev)", cuDevicePrimaryCtxRelease(dev)))
		ret = 1;
out:
	return ret;
}

/* ---- main ------------------------------------------------------------- */

/* In a child, so that this process's cuInit stays to be timed: 0 or 77. */
static int gpu_check(void)
{
	int status, n = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return 0;	/* let the naive run find out */
	if (pid == 0) {
		CU(cuInit(0), none);
		CU(cuDeviceGetCount(&n), none);
		if (n < 1) {
			fprintf(stderr, "bench_startup: cuDeviceGetCount: no device\n");
			goto none;
		}
		_exit(0);
none:
		_exit(77);
	}
	if (waitpid(pid, &status, 0) != pid)
		return 0;
	return WIFEXITED(status) && WEXITSTATUS(status) == 77 ? 77 : 0;
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	if (*end == 'K' || *end == 'k')
		shift = 10;
	else if (*end == 'M' || *end == 'm')
		shift = 20;
	else if (*end == 'G' || *end == 'g')
		shift = 30;
	if (shift)
		end++;
	if (*end == 'i')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v > (SIZE_MAX >> shift))
		return -EINVAL;
	*out = (size_t)v << shift;
	return 0;
}

static void usage(const char *prog)
{
	fprintf(stderr, "usage: %s [-k K] [-s SIZE] [-c MS] TIERFS_BIN "
		"[GPU_CACHE_GIB [HOST_CACHE_GIB]]\n"
		"  -k K     checkpoints in the forward pass (default 32)\n"
		"  -s SIZE  bytes per checkpoint, K/M/G suffixes (default 64M, at least 1M)\n"
		"  -c MS    compute interval between checkpoints in ms (default 100)\n", prog);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	if (remove(path) < 0)
		fprintf(stderr, "bench_startup: remove %s: %s\n", path, strerror(errno));
	return 0;
}

int main(int argc, char **argv)
{
	static char dir[] = "/var/tmp/tierfs-startup.XXXXXX";
	struct params p = { .gpu_gib = 4, .host_gib = 32, .k = 32, .size = 64u << 20,
			    .interval = 0.1 };
	struct startup_result su;
	struct fwd_result tf, nv;
	char *src = NULL, *vbuf = NULL, *end, built_s[32];
	int c, clean = 1, ret = 1;
	long k;

	while ((c = getopt(argc, argv, "k:s:c:h")) != -1) {
		switch (c) {
		case 'k':
			k = strtol(optarg, &end, 10);
			if (*end || k < 1 || k > 9999) {
				fprintf(stderr, "bad -k '%s' (1..9999)\n", optarg);
				return 2;
			}
			p.k = (unsigned)k;
			break;
		case 's':
			if (parse_size(optarg, &p.size) < 0 || p.size < CHUNK) {
				fprintf(stderr, "bad -s '%s' (a size of 1M or more)\n", optarg);
				return 2;
			}
			break;
		case 'c':
			p.interval = strtod(optarg, &end) / 1e3;
			if (*end || end == optarg || p.interval < 0) {
				fprintf(stderr, "bad -c '%s' (milliseconds)\n", optarg);
				return 2;
			}
			break;
		default:
			usage(argv[0]);
			return c == 'h' ? 0 : 2;
		}
	}
	if (optind >= argc || argc - optind > 3) {
		usage(argv[0]);
		return 2;
	}
	p.bin = argv[optind];
	if (argc - optind > 1)
		p.gpu_gib = atof(argv[optind + 1]);
	if (argc - optind > 2)
		p.host_gib = atof(argv[optind + 2]);
	p.gpu_bytes = (size_t)(p.gpu_gib * 1024 + 0.5) << 20;
	p.host_bytes = (size_t)(p.host_gib * 1024 + 0.5) << 20;
	if (p.size > p.gpu_bytes || p.size > p.host_bytes) {
		fprintf(stderr, "a checkpoint (%zu MiB) must fit both caches (%zu and %zu MiB)\n",
			p.size >> 20, p.gpu_bytes >> 20, p.host_bytes >> 20);
		return 2;
	}
	if (access(p.bin, X_OK) < 0) {
		fprintf(stderr, "bench_startup: %s: %s\n", p.bin, strerror(errno));
		return 2;
	}

	if (gpu_check() == 77) {
		fprintf(stderr, "bench_startup: no usable CUDA device: skipped\n");
		return 77;
	}
	src = malloc(p.size);
	vbuf = malloc(p.size);
	if (!src || !vbuf || !mkdtemp(dir)) {
		fprintf(stderr, "bench_startup: %s\n", strerror(errno));
		goto free_bufs;
	}
	tmpdir = dir;
	fill_pattern(src, p.size);

	if (run_startup(&p, &su, &clean) || run_tierfs(&p, src, vbuf, &tf, &clean) ||
	    run_naive(&p, src, vbuf, &nv))
		goto rm_dir;

	printf("start-up with a %g GiB GPU cache and a %g GiB host cache\n",
	       p.gpu_gib, p.host_gib);
	printf("%-40s %12s %14s\n", "", "first write", "caches built");
	if (su.built >= 0)
		snprintf(built_s, sizeof(built_s), "%.3fs", su.built);
	else
		snprintf(built_s, sizeof(built_s), "not in %.0fs", BUILT_TIMEOUT);
	printf("%-40s %11.3fs %14s\n", "tierfs (VMM + background touch/pin)",
	       su.first, built_s);
	printf("%-40s %11.3fs %13.3fs   (cuInit+context %.3fs, cuMemAlloc %.3fs, "
	       "cuMemHostAlloc %.3fs)\n", "naive (cuMemAlloc + cuMemHostAlloc)",
	       nv.first, nv.first, nv.init, nv.gpu, nv.host);
	printf("first write: tierfs %.1fx sooner\n\n", nv.first / su.first);

	printf("forward pass: %u x %g MiB checkpoints, %g ms compute interval, "
	       "written in 1 MiB calls\n", p.k, (double)p.size / (1 << 20), p.interval * 1e3);
	printf("%-40s %12s %14s\n", "", "blocked", "forward pass");
	printf("%-40s %11.3fs %13.3fs   (mount after %.3fs, checkpoint 0 done %.3fs, "
	       "later checkpoints %.3fs)\n", "tierfs (mount wait + open/write/close)",
	       tf.blocked, tf.pass, tf.mount, tf.first, tf.blocked - tf.first);
	printf("%-40s %11.3fs %13.3fs   (cuInit+context %.3fs, allocation %.3fs, "
	       "copies %.3fs)\n", "naive (allocation + memcpy/cuMemcpyHtoD)",
	       nv.blocked, nv.pass, nv.init, nv.gpu + nv.host, nv.blocked - nv.first);
	printf("blocked: naive/tierfs %.1fx (%.1fx without the naive cuInit+context); "
	       "target >= 5x, HiPC paper 12.5x\n", nv.blocked / tf.blocked,
	       (nv.blocked - nv.init) / tf.blocked);
	printf("verified: tierfs ckpt.%04u ckpt.%04u ckpt.%04u read back, naive ckpt.%04u "
	       "copied back\n", 0u, p.k / 2, p.k - 1, p.k - 1);
	ret = 0;
rm_dir:
	if (clean)
		nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
	else
		fprintf(stderr, "bench_startup: left %s (a mount remained)\n", dir);
free_bufs:
	free(vbuf);
	free(src);
	return ret;
}
