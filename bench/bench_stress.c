/*
 * bench_stress.c - a seeded random mix of file system operations from
 * several processes at once, in the manner of xfstests' fsstress (which
 * Debian packages neither in xfstests nor in LTP): each process works in
 * a directory of its own and picks, N times, one of creat, write, read,
 * truncate, fsync, fdatasync, punch and zero ranges (fallocate), unlink,
 * rename, link, mkdir, rmdir, symlink, readlink, getdents, stat, chmod
 * and setxattr, on a file or directory it made.  Writes land within the
 * file's size and 1 MiB past it, except one in 16, which lands anywhere
 * in the first 2 GiB: files grow as fsstress's do and some are sparse
 * files of a GiB or more.  A benchmark, not a test: errors a call may
 * give (ENOENT after a rename, ENOTEMPTY, ENOSPC) are counted, not fatal.
 *
 * usage: bench_stress DIR [-p PROCS] [-n OPS] [-s SEED] [-t]
 *
 * Prints one line: ops done, bytes the writes handed the file system, the
 * calls that failed, and the seconds the processes took.  -t: also, to
 * stderr, each kind of operation's count and the seconds the processes
 * spent in it, summed over them (c creat, w write, r read, t truncate,
 * s fsync, y fdatasync, p punch, z zero range, u unlink, n rename, l link,
 * m mkdir, d rmdir, k symlink, g getdents, a stat, h chmod, e readlink,
 * o setxattr, x write and fsync, X the fsync of x alone: within x's time).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define MAXNAMES	512		/* names a process keeps track of */
#define WRITE_MAX	(128 << 10)	/* the largest write */
#define FAR_MAX		(2ull << 30)	/* far writes land below this */

enum kind { K_FILE, K_DIR, K_LINK };

struct name {
	char path[256];
	enum kind kind;
};

struct proc {
	struct name n[MAXNAMES];
	unsigned nn;
	unsigned next;			/* numbers new names */
	uint64_t seed;
	uint64_t written, ops, failed;
	char buf[WRITE_MAX];
};

/* the operations, one letter each; "x" is a write and its fsync */
static const char ops[] = "cccwwwwrttsyuunnllmmdkkgaheoxpz";
static const char kinds[] = "cwrtsypzunlmdkgaheoxX";	/* each once; X: x's fsync */
#define NKINDS	(sizeof(kinds) - 1)

struct totals {				/* shared with the children */
	uint64_t written, ops, failed;
	uint64_t count[NKINDS];		/* operations of each kind */
	double seconds[NKINDS];		/* and the time they took */
};

static uint64_t rnd(struct proc *p)	/* splitmix64 */
{
	uint64_t z = (p->seed += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static struct name *pick(struct proc *p, enum kind k)
{
	unsigned start, i;

	if (!p->nn)
		return NULL;
	start = rnd(p) % p->nn;
	for (i = 0; i < p->nn; i++) {
		struct name *n = &p->n[(start + i) % p->nn];

		if (n->kind == k)
			return n;
	}
	return NULL;
}

/* A new name below a directory of p's (or its top). */
static void new_path(struct proc *p, char *out, size_t len, const char *prefix)
{
	struct name *d = rnd(p) % 4 ? pick(p, K_DIR) : NULL;

	if (d && strlen(d->path) > 200)
		d = NULL;		/* deep enough */
	snprintf(out, len, "%.200s/%s%u", d ? d->path : ".", prefix, p->next++);
}

static void add(struct proc *p, const char *path, enum kind k)
{
	struct name *n;

	if (p->nn == MAXNAMES)
		n = &p->n[rnd(p) % MAXNAMES];	/* forget one */
	else
		n = &p->n[p->nn++];
	snprintf(n->path, sizeof(n->path), "%s", path);
	n->kind = k;
}

static void drop(struct proc *p, struct name *n)
{
	*n = p->n[--p->nn];
}

/* Below path: names under a removed or renamed directory go too. */
static void drop_below(struct proc *p, const char *path)
{
	size_t l = strlen(path);

	for (unsigned i = 0; i < p->nn;) {
		if (!strncmp(p->n[i].path, path, l) && p->n[i].path[l] == '/')
			drop(p, &p->n[i]);
		else
			i++;
	}
}

static int fail(struct proc *p)
{
	p->failed++;
	return -1;
}

static off_t where(struct proc *p, int fd)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return 0;
	if (rnd(p) % 16 == 0)
		return (off_t)(rnd(p) % FAR_MAX);
	return (off_t)(rnd(p) % ((uint64_t)st.st_size + (1 << 20)));
}

static int op_write(struct proc *p, struct name *f)
{
	int fd = open(f->path, O_WRONLY);
	size_t len = rnd(p) % WRITE_MAX + 1;
	ssize_t n;

	if (fd < 0)
		return fail(p);
	memset(p->buf, (int)(rnd(p) & 0xff) | 1, len);
	n = pwrite(fd, p->buf, len, where(p, fd));
	if (n > 0)
		p->written += (uint64_t)n;
	close(fd);
	return n < 0 ? fail(p) : 0;
}

static int op_read(struct proc *p, struct name *f)
{
	int fd = open(f->path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return fail(p);
	n = pread(fd, p->buf, rnd(p) % WRITE_MAX + 1, where(p, fd));
	close(fd);
	return n < 0 ? fail(p) : 0;
}

/* fsync (sync 1), fdatasync (2), ftruncate (3), punch (4), zero (5) */
static int op_fd(struct proc *p, struct name *f, int what)
{
	int fd = open(f->path, O_WRONLY), r = 0;
	off_t off;

	if (fd < 0)
		return fail(p);
	off = where(p, fd);
	switch (what) {
	case 1: r = fsync(fd); break;
	case 2: r = fdatasync(fd); break;
	case 3: r = ftruncate(fd, off); break;
	case 4: r = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off,
			      (off_t)(rnd(p) % (1 << 20)) + 1); break;
	case 5: r = fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, off,
			      (off_t)(rnd(p) % (1 << 20)) + 1); break;
	}
	close(fd);
	return r < 0 ? fail(p) : 0;
}

static int op_rename(struct proc *p)
{
	struct name *n = &p->n[rnd(p) % p->nn];
	char to[256];

	new_path(p, to, sizeof(to), n->kind == K_DIR ? "d" : n->kind == K_LINK ? "l" : "f");
	if (!strncmp(to, n->path, strlen(n->path)) && to[strlen(n->path)] == '/')
		return 0;			/* into itself */
	if (rename(n->path, to) < 0)
		return fail(p);
	if (n->kind == K_DIR)
		drop_below(p, n->path);
	snprintf(n->path, sizeof(n->path), "%s", to);
	return 0;
}

static int op_rmdir(struct proc *p, struct name *d)
{
	if (rmdir(d->path) < 0)
		return fail(p);
	drop(p, d);
	return 0;
}

static int op_getdents(struct proc *p, struct name *d)
{
	DIR *dp = opendir(d ? d->path : ".");

	if (!dp)
		return fail(p);
	while (readdir(dp))
		;
	closedir(dp);
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One operation, picked with p's generator; its kind's count and time in t. */
static void one(struct proc *p, struct totals *t)
{
	char op = ops[rnd(p) % (sizeof(ops) - 1)], path[256];
	struct name *f = pick(p, K_FILE), *d;
	int fd;

	double t0 = now();

	p->ops++;
	if (!f && op != 'm' && op != 'k')
		op = 'c';
	switch (op) {
	case 'c':
		new_path(p, path, sizeof(path), "f");
		fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
		if (fd < 0) {
			fail(p);
			break;
		}
		close(fd);
		add(p, path, K_FILE);
		break;
	case 'w': op_write(p, f); break;
	case 'r': op_read(p, f); break;
	case 't': op_fd(p, f, 3); break;
	case 's': op_fd(p, f, 1); break;
	case 'y': op_fd(p, f, 2); break;
	case 'p': op_fd(p, f, 4); break;
	case 'z': op_fd(p, f, 5); break;
	case 'u':
		if (unlink(f->path) < 0)
			fail(p);
		else
			drop(p, f);
		break;
	case 'n': op_rename(p); break;
	case 'l':
		new_path(p, path, sizeof(path), "f");
		if (link(f->path, path) < 0)
			fail(p);
		else
			add(p, path, K_FILE);
		break;
	case 'm':
		new_path(p, path, sizeof(path), "d");
		if (mkdir(path, 0755) < 0)
			fail(p);
		else
			add(p, path, K_DIR);
		break;
	case 'd':
		if ((d = pick(p, K_DIR)))
			op_rmdir(p, d);
		break;
	case 'k':
		new_path(p, path, sizeof(path), "l");
		if (symlink("../some/target/of/a/link", path) < 0)
			fail(p);
		else
			add(p, path, K_LINK);
		break;
	case 'g': op_getdents(p, pick(p, K_DIR)); break;
	case 'a': {
		struct stat st;

		if (stat(f->path, &st) < 0)
			fail(p);
		break;
	}
	case 'h':
		if (chmod(f->path, 0600 | (rnd(p) & 044)) < 0)
			fail(p);
		break;
	case 'e':
		if ((d = pick(p, K_LINK)) && readlink(d->path, path, sizeof(path)) < 0)
			fail(p);
		break;
	case 'o':
		if (setxattr(f->path, "user.stress", path, rnd(p) % 64 + 1, 0) < 0)
			fail(p);
		break;
	case 'x': {
		size_t kx = (size_t)(strchr(kinds, 'X') - kinds);
		double t1;

		op_write(p, f);		/* a write and its fsync */
		t1 = now();
		op_fd(p, f, 1);
		t->count[kx]++;
		t->seconds[kx] += now() - t1;
		break;
	}
	}
	size_t k = (size_t)(strchr(kinds, op) - kinds);

	t->count[k]++;
	t->seconds[k] += now() - t0;
}

int main(int argc, char **argv)
{
	unsigned procs = 4, n = 20000;
	uint64_t seed = 1;
	struct totals *t;
	const char *dir;
	bool times = false;
	double t0;
	int c;

	if (argc < 2 || argv[1][0] == '-') {
		fprintf(stderr, "usage: bench_stress DIR [-p PROCS] [-n OPS] [-s SEED] [-t]\n");
		return 2;
	}
	dir = argv[1];
	optind = 2;
	while ((c = getopt(argc, argv, "p:n:s:t")) != -1) {
		switch (c) {
		case 't': times = true; break;
		case 'p': procs = (unsigned)atoi(optarg); break;
		case 'n': n = (unsigned)atoi(optarg); break;
		case 's': seed = strtoull(optarg, NULL, 0); break;
		default: return 2;
		}
	}
	t = mmap(NULL, sizeof(*t) * procs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		 -1, 0);
	if (t == MAP_FAILED)
		return 1;
	t0 = now();
	for (unsigned i = 0; i < procs; i++) {
		pid_t pid = fork();

		if (pid < 0)
			return 1;
		if (pid == 0) {
			struct proc *p = calloc(1, sizeof(*p));
			char sub[4096];

			snprintf(sub, sizeof(sub), "%s/p%u", dir, i);
			if (!p || (mkdir(sub, 0755) < 0 && errno != EEXIST) || chdir(sub) < 0) {
				perror(sub);
				_exit(1);
			}
			p->seed = seed * 1000003 + i;
			for (unsigned k = 0; k < n; k++)
				one(p, &t[i]);
			t[i].written = p->written;
			t[i].ops = p->ops;
			t[i].failed = p->failed;
			_exit(0);
		}
	}
	int bad = 0, st;
	while (wait(&st) > 0)
		bad |= !WIFEXITED(st) || WEXITSTATUS(st);
	struct totals sum = { 0 };
	for (unsigned i = 0; i < procs; i++) {
		sum.written += t[i].written;
		sum.ops += t[i].ops;
		sum.failed += t[i].failed;
		for (size_t k = 0; k < NKINDS; k++) {
			sum.count[k] += t[i].count[k];
			sum.seconds[k] += t[i].seconds[k];
		}
	}
	printf("ops %" PRIu64 " written %" PRIu64 " failed %" PRIu64 " seconds %.2f seed %" PRIu64
	       "\n", sum.ops, sum.written, sum.failed, now() - t0, seed);
	fflush(stdout);
	if (times) {		/* to stderr: the summary line stays one line */
		fprintf(stderr, "%-4s %8s %10s %10s\n", "op", "count", "seconds", "mean ms");
		for (size_t k = 0; k < NKINDS; k++)
			fprintf(stderr, "%-4c %8" PRIu64 " %10.3f %10.3f\n", kinds[k], sum.count[k],
				sum.seconds[k],
				sum.count[k] ? sum.seconds[k] * 1e3 / sum.count[k] : 0.0);
	}
	return bad;
}
