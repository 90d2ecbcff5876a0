/*
 * bench_meta.c - a metadata-heavy workload, fsstress-like: P processes,
 * each in a directory of its own, run N random operations over a pool of
 * 256 names: create (O_CREAT|O_TRUNC, a small write, close), mkdir, rmdir,
 * rename, unlink, link, chmod, truncate, stat, a small append, readdir,
 * a write followed by fsync, a read of a whole file.
 * Prints one line: operations per second over all processes, and the
 * seconds taken.
 *
 * With -v, also the time each kind of operation took, over all processes
 * (count, seconds, mean microseconds), to see which kind a file system
 * loses its time in.
 *
 * usage: bench_meta DIR [-p PROCS] [-n OPS] [-s SEED] [-v]
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NAMES 256

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static unsigned rnd(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (*s >> 8) & 0xffffff;
}

static char rbuf[8192];

#define KINDS 18
static const char *const kind_name[KINDS] = {
	"create", "create", "create", "mkdir", "rmdir", "rename", "rename", "unlink",
	"unlink", "link", "chmod", "truncate", "stat", "stat", "append", "readdir",
	"write+fsync", "read",
};

/* per kind, shared by the processes: operations and nanoseconds */
struct kind_time {
	long n, ns;
};
static struct kind_time *kt;

static int one(const char *d, unsigned *s, char *buf)
{
	char a[600], b[600];
	struct stat st;
	int fd, kind;

	snprintf(a, sizeof(a), "%s/n%u", d, rnd(s) % NAMES);
	snprintf(b, sizeof(b), "%s/n%u", d, rnd(s) % NAMES);
	kind = rnd(s) % KINDS;
	switch (kind) {
	case 0: case 1: case 2:	/* create a small file */
		fd = open(a, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			if (write(fd, buf, 1 + rnd(s) % 8192) < 0)
				perror("write");
			close(fd);
		}
		break;
	case 3:
		mkdir(a, 0755);
		break;
	case 4:
		rmdir(a);
		break;
	case 5: case 6:
		rename(a, b);
		break;
	case 7: case 8:
		unlink(a);
		break;
	case 9:
		link(a, b);
		break;
	case 10:
		chmod(a, 0600 | (rnd(s) % 2 ? 044 : 0));
		break;
	case 11:
		truncate(a, rnd(s) % 16384);
		break;
	case 12: case 13:
		stat(a, &st);
		break;
	case 14:		/* append */
		fd = open(a, O_WRONLY | O_APPEND);
		if (fd >= 0) {
			if (write(fd, buf, 1 + rnd(s) % 4096) < 0)
				perror("write");
			close(fd);
		}
		break;
	case 16:		/* write, then fsync (fsstress's fsync/fdatasync) */
		fd = open(a, O_WRONLY | O_CREAT, 0644);
		if (fd >= 0) {
			if (pwrite(fd, buf, 1 + rnd(s) % 8192, rnd(s) % 65536) < 0)
				perror("pwrite");
			if (fsync(fd) < 0)
				perror("fsync");
			close(fd);
		}
		break;
	case 17:		/* read it all */
		fd = open(a, O_RDONLY);
		if (fd >= 0) {
			while (read(fd, rbuf, 8192) > 0)
				;
			close(fd);
		}
		break;
	case 15: {
		DIR *dp = opendir(d);

		if (dp) {
			while (readdir(dp))
				;
			closedir(dp);
		}
		break;
	}
	}
	return kind;
}

int main(int argc, char **argv)
{
	int procs = 4, c, i, verbose = 0;
	long ops = 20000;
	unsigned seed = 1;
	char *buf;
	double t0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR [-p PROCS] [-n OPS] [-s SEED] [-v]\n", argv[0]);
		return 2;
	}
	optind = 2;
	while ((c = getopt(argc, argv, "p:n:s:v")) != -1) {
		switch (c) {
		case 'v': verbose = 1; break;
		case 'p': procs = atoi(optarg); break;
		case 'n': ops = atol(optarg); break;
		case 's': seed = (unsigned)atoi(optarg); break;
		default: return 2;
		}
	}
	buf = calloc(1, 8192);
	if (!buf)
		return 1;
	memset(buf, 'x', 8192);
	kt = mmap(NULL, KINDS * sizeof(*kt), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		  -1, 0);
	if (kt == MAP_FAILED)
		return 1;
	t0 = now();
	for (i = 0; i < procs; i++) {
		if (fork() == 0) {
			char d[512];
			unsigned s = seed * 7919u + (unsigned)i;
			long k;

			snprintf(d, sizeof(d), "%s/p%d", argv[1], i);
			mkdir(d, 0755);
			for (k = 0; k < ops; k++) {
				double t = now();
				int kind = one(d, &s, buf);

				__atomic_add_fetch(&kt[kind].n, 1, __ATOMIC_RELAXED);
				__atomic_add_fetch(&kt[kind].ns, (long)((now() - t) * 1e9),
						   __ATOMIC_RELAXED);
			}
			_exit(0);
		}
	}
	while (wait(NULL) > 0)
		;
	double dt = now() - t0;
	printf("%ld ops in %.2f s: %.0f ops/s\n", (long)procs * ops, dt, procs * ops / dt);
	if (verbose) {
		/* kinds drawn for several cases are summed under one name */
		for (i = 0; i < KINDS; i++) {
			long n = 0, ns = 0;
			int j;

			if (i && !strcmp(kind_name[i], kind_name[i - 1]))
				continue;
			for (j = i; j < KINDS && !strcmp(kind_name[j], kind_name[i]); j++) {
				n += kt[j].n;
				ns += kt[j].ns;
			}
			printf("  %-12s %7ld ops %8.3f s %9.1f us\n", kind_name[i], n, ns / 1e9,
			       n ? ns / 1e3 / n : 0.0);
		}
	}
	return 0;
}
