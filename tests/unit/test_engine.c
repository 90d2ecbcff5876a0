/*
 * test_engine.c - the engine end to end, without FUSE and without a GPU:
 * fake tfile_ops over a temporary directory (one backing file per tfile,
 * versions written beside it and renamed over it), the real io_uring
 * flushers and prefetcher, a host cache much smaller than the data.
 *
 * Checks: writes read back (from the cache and, once evicted, from the
 * backing files); eviction under pressure; fsync leaves the content in the
 * backing file; a file bigger than the cache is written through; restore
 * hints make the prefetcher bring evicted files back; truncate; several
 * threads writing and reading at once; where a flush leaves holes
 * (backing_run against a brute-force reading).  Exit 0 pass, 1 fail, 77 skip (no
 * io_uring).  Runs under ASan and TSan as built.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "engine_int.h"	/* backing_run */
#include "filecopy.h"	/* fc_zero_run */

#define FAIL(...) do {							\
	fprintf(stderr, "test_engine: %s:%d: ", __FILE__, __LINE__);	\
	fprintf(stderr, __VA_ARGS__);					\
	fputc('\n', stderr);						\
	exit(1);							\
} while (0)
#define ENSURE(c, ...) do { if (!(c)) FAIL(__VA_ARGS__); } while (0)

#define NFILES	40
#define FSIZE	(256u << 10)		/* bytes per file */
#define CACHE	(4u << 20)		/* host cache: 16 files of 40 */
#define NTHREADS 4

struct tf {
	struct tfile tf;		/* first: the engine's view */
	char path[PATH_MAX];		/* the backing file */
	int refs;			/* ops->get / ops->put */
	int id;
};

static char dir[PATH_MAX];
static struct tf files[NFILES + 1];	/* + one bigger than the cache */
static unsigned vseq;

static struct tf *tf_of(struct tfile *f)
{
	return (struct tf *)f;
}

static int open_maybe_direct(const char *p, int flags, bool want, bool *direct)
{
	int fd = want ? open(p, flags | O_DIRECT, 0644) : -1;

	*direct = fd >= 0;
	if (fd < 0)
		fd = open(p, flags, 0644);
	return fd < 0 ? -errno : fd;
}

static int f_version_open(struct tfile *f, bool want_direct, bool *direct, bool *inplace)
{
	char p[PATH_MAX + 32];

	snprintf(p, sizeof(p), "%s.v%u", tf_of(f)->path,
		 __atomic_add_fetch(&vseq, 1, __ATOMIC_RELAXED));
	*inplace = false;
	return open_maybe_direct(p, O_WRONLY | O_CREAT | O_TRUNC, want_direct, direct);
}

static int f_version_commit(struct tfile *f, int fd, bool inplace, bool durable)
{
	char link[64], p[PATH_MAX + 32];
	ssize_t n;
	int ret = 0;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, p, sizeof(p) - 1);
	if (n < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	p[n] = 0;
	if (durable && fsync(fd) < 0)
		ret = -errno;
	close(fd);
	if (!ret && rename(p, tf_of(f)->path) < 0)
		ret = -errno;
	return ret;
}

static int f_data_fd(struct tfile *f, bool direct)
{
	bool d;

	return open_maybe_direct(tf_of(f)->path, O_RDONLY, direct, &d);
}

static void f_release_data_fd(struct tfile *f, int fd)
{
	close(fd);
}

static void f_get(struct tfile *f)
{
	__atomic_add_fetch(&tf_of(f)->refs, 1, __ATOMIC_ACQ_REL);
}

static void f_put(struct tfile *f)
{
	__atomic_sub_fetch(&tf_of(f)->refs, 1, __ATOMIC_ACQ_REL);
}

static const char *f_name(struct tfile *f, char *buf, size_t len)
{
	snprintf(buf, len, "file%d", tf_of(f)->id);
	return buf;
}

static const struct tfile_ops fake_ops = {
	.version_open = f_version_open,
	.version_commit = f_version_commit,
	.data_fd = f_data_fd,
	.release_data_fd = f_release_data_fd,
	.get = f_get,
	.put = f_put,
	.name = f_name,
};

/* Byte i of file id's content, generation g. */
static uint8_t pat(int id, unsigned g, uint64_t i)
{
	return (uint8_t)(id * 131 + g * 17 + (i >> 12) * 7 + (i & 0xff));
}

static void fill(uint8_t *b, int id, unsigned g, uint64_t off, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[i] = pat(id, g, off + i);
}

static void check(const uint8_t *b, int id, unsigned g, uint64_t off, size_t n,
		  const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != pat(id, g, off + i))
			FAIL("%s: file %d byte %" PRIu64 ": %u, expected %u", what, id,
			     off + i, b[i], pat(id, g, off + i));
}

/* Write file t (size bytes, generation g) in 64 KiB writes, as one writer. */
static void write_file(struct tf *t, unsigned g, uint64_t size)
{
	static __thread uint8_t b[64 << 10];

	tfile_open_writer(&t->tf);
	ENSURE(tfile_truncate(&t->tf, 0) == 0, "truncate file %d", t->id);	/* O_TRUNC */
	for (uint64_t off = 0; off < size; off += sizeof(b)) {
		size_t n = size - off < sizeof(b) ? (size_t)(size - off) : sizeof(b);

		fill(b, t->id, g, off, n);
		ENSURE(tfile_write(&t->tf, b, n, (off_t)off) == (ssize_t)n,
		       "write file %d at %" PRIu64, t->id, off);
	}
	tfile_close_writer(&t->tf);
}

static void read_file(struct tf *t, unsigned g, uint64_t size, const char *what)
{
	uint8_t *b = malloc(size + 1);
	uint64_t sz;
	struct timespec mt;

	ENSURE(b, "malloc");
	tfile_attr(&t->tf, &sz, &mt);
	ENSURE(sz == size, "%s: file %d size %" PRIu64 ", expected %" PRIu64, what,
	       t->id, sz, size);
	ENSURE(tfile_read(&t->tf, b, size + 1, 0) == (ssize_t)size, "%s: read file %d",
	       what, t->id);
	check(b, t->id, g, 0, size, what);
	free(b);
}

/* The backing file of t holds generation g. */
static void check_backing(struct tf *t, unsigned g, uint64_t size)
{
	uint8_t *b = malloc(size ? size : 1);
	int fd = open(t->path, O_RDONLY);
	struct stat st;

	ENSURE(b && fd >= 0, "open %s: %s", t->path, strerror(errno));
	ENSURE(fstat(fd, &st) == 0 && (uint64_t)st.st_size == size,
	       "backing file %d: %jd bytes, expected %" PRIu64, t->id,
	       (intmax_t)st.st_size, size);
	ENSURE(pread(fd, b, size, 0) == (ssize_t)size, "pread");
	check(b, t->id, g, 0, size, "backing file");
	close(fd);
	free(b);
}

/* A counter from the stats JSON: the first "key":N after `after`. */
static uint64_t stat_u64(struct engine *e, const char *after, const char *key)
{
	static char buf[8192];
	char k[64];
	const char *p;

	ENSURE(engine_stats_json(e, buf, sizeof(buf)) > 0, "stats");
	p = strstr(buf, after);
	ENSURE(p, "stats: no %s in %s", after, buf);
	snprintf(k, sizeof(k), "\"%s\":", key);
	p = strstr(p, k);
	ENSURE(p, "stats: no %s in %s", key, buf);
	return strtoull(p + strlen(k), NULL, 10);
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

struct worker {
	struct engine *e;
	int first;				/* files first, first + NTHREADS, ... */
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	for (int round = 0; round < 2; round++)
		for (int i = w->first; i < NFILES; i += NTHREADS) {
			write_file(&files[i], 2 + round, FSIZE / 2 + (uint64_t)i * 4096);
			read_file(&files[i], 2 + round, FSIZE / 2 + (uint64_t)i * 4096,
				  "concurrent");
		}
	return NULL;
}

/*
 * backing_run (fc_zero_run with end_hole) and fc_zero_run without it (the
 * journal's punched ranges) over random block patterns (zero blocks, data
 * blocks, a partial last block): the runs tile the buffer; a hole is all
 * zeros and at least SPARSE_RUN long or (end_hole) reaches the end; data
 * holds no zero run of SPARSE_RUN.
 */
static void check_runs_of(bool end_hole)
{
	enum { B = TIER_ALIGN, NB = 64 };
	static uint8_t buf[NB * B];
	uint64_t seed = 3803;

	for (int round = 0; round < 2000; round++) {
		uint64_t len = (uint64_t)(seed % NB + 1) * B - (round % 3 ? 0 : seed % B);
		uint64_t pos, next;
		bool hole;

		for (int b = 0; b < NB; b++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			memset(buf + (size_t)b * B, 0, B);
			if ((seed >> 33) % 4 == 0)	/* a quarter of the blocks: data */
				buf[(size_t)b * B + (seed >> 40) % B] = 1;
		}
		for (pos = 0; pos < len; pos = next) {
			next = end_hole ? backing_run(buf, pos, len, &hole)
					: fc_zero_run(buf, pos, len, B, SPARSE_RUN, false, &hole);
			ENSURE(next > pos && next <= len && (next % B == 0 || next == len),
			       "round %d: run [%" PRIu64 ", %" PRIu64 ")", round, pos, next);
			uint64_t zrun = 0, zmax = 0;
			for (uint64_t i = pos; i < next; i++) {
				ENSURE(!hole || !buf[i], "round %d: data in a hole at %" PRIu64,
				       round, i);
				if (i % B == 0)
					zrun = 0;
			}
			for (uint64_t b = pos; b < next; b += B) {
				uint64_t e = b + B < next ? b + B : next, i;
				for (i = b; i < e && !buf[i]; i++)
					;
				zrun = i == e ? zrun + (e - b) : 0;
				zmax = zrun > zmax ? zrun : zmax;
			}
			if (hole)
				ENSURE(next - pos >= SPARSE_RUN || (end_hole && next == len),
				       "round %d: short hole [%" PRIu64 ", %" PRIu64 ")",
				       round, pos, next);
			else
				ENSURE(zmax < SPARSE_RUN, "round %d: data [%" PRIu64 ", %" PRIu64
				       ") holds %" PRIu64 " zero bytes in a row", round, pos, next,
				       zmax);
		}
	}
}

static void check_runs(void)
{
	check_runs_of(true);
	check_runs_of(false);
}

/* A cache that is not host-addressable, as the GPU tier is: read through ops. */
static uint8_t *dev_mem;

static int dev_read(struct cache *c, uint64_t off, void *dst, size_t len)
{
	(void)c;
	memcpy(dst, dev_mem + off, len);
	return 0;
}

/*
 * SEEK_DATA / SEEK_HOLE in a copy that is not host-addressable
 * (backing_seek_cache, three bounce chunks of 8 MiB): within one chunk the
 * same answers as over host memory (backing_seek_buf); over several, never
 * data skipped (SEEK_DATA: zeros from off to the answer; -ENXIO only for
 * zeros to the end) and a hole only where the bytes are zeros.  A fresh
 * file written from that cache with .sparse set reads back the same bytes
 * and leaves the long zero runs unallocated.
 */
static void check_seek_cache(const char *tmp)
{
	enum { B = TIER_ALIGN };
	const uint64_t len = 20u << 20, chunk = 8u << 20;
	struct tier_ops ops = { .read = dev_read };
	struct cache c = { .name = "dev", .ops = &ops };
	uint64_t seed = 4099, at = 0;
	char path[PATH_MAX];
	struct stat st;
	uint8_t *back;
	int fd;

	dev_mem = calloc(1, len);
	back = malloc(len);
	ENSURE(dev_mem && back, "malloc");
	while (at < len) {		/* runs of zero blocks and data blocks */
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t n = ((seed >> 33) % 96 + 1) * B;
		bool data = (seed >> 20) % 3 == 0;

		n = n < len - at ? n : len - at;
		if (data)
			for (uint64_t b = at; b < at + n; b += B)
				dev_mem[b + (seed >> 40) % B] = 1 + (uint8_t)(b >> 12);
		at += n;
	}
	for (int round = 0; round < 400; round++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t off = (seed >> 11) % len, size = len + (round % 2) * B;
		int whence = round % 2 ? SEEK_DATA : SEEK_HOLE;
		off_t r = backing_seek_cache(&c, 0, len, size, off, whence);
		uint64_t i;

		if (off / chunk == (len - 1) / chunk) {	/* the last chunk: one read */
			off_t h = backing_seek_buf(dev_mem + off / chunk * chunk,
						   len - off / chunk * chunk, size - off / chunk * chunk,
						   off % chunk, whence);
			ENSURE(r == (h < 0 ? h : h + (off_t)(off / chunk * chunk)),
			       "seek %d at %" PRIu64 ": %jd, in host memory %jd", whence, off,
			       (intmax_t)r, (intmax_t)h);
		}
		if (whence == SEEK_DATA) {
			uint64_t end = r == -ENXIO ? len : (uint64_t)r;

			ENSURE(r == -ENXIO || (r >= (off_t)off && (uint64_t)r < len),
			       "SEEK_DATA at %" PRIu64 ": %jd", off, (intmax_t)r);
			for (i = off; i < end; i++)
				ENSURE(!dev_mem[i], "SEEK_DATA at %" PRIu64 " answers %jd, past data "
				       "at %" PRIu64, off, (intmax_t)r, i);
		} else {
			ENSURE(r >= (off_t)off && (uint64_t)r <= len, "SEEK_HOLE at %" PRIu64
			       ": %jd", off, (intmax_t)r);
			for (i = (uint64_t)r; i < len && (i == (uint64_t)r || i % B); i++)
				ENSURE(!dev_mem[i], "SEEK_HOLE at %" PRIu64 " answers %jd, data at %"
				       PRIu64, off, (intmax_t)r, i);
		}
	}
	snprintf(path, sizeof(path), "%.4000s/test_engine_sparse.XXXXXX", tmp);
	fd = mkstemp(path);
	ENSURE(fd >= 0, "mkstemp %s: %s", path, strerror(errno));
	unlink(path);
	ENSURE(backing_move(&(struct bend){ .kind = BEND_FD, .fd = fd, .sparse = true },
			    &(struct bend){ .kind = BEND_CACHE, .cache = &c }, len, NULL) == 0 &&
	       ftruncate(fd, (off_t)len) == 0, "sparse write: %s", strerror(errno));
	ENSURE(pread(fd, back, len, 0) == (ssize_t)len && !memcmp(back, dev_mem, len),
	       "the sparse write reads back other bytes");
	ENSURE(fstat(fd, &st) == 0 && (uint64_t)st.st_blocks * 512 < len * 3 / 4,
	       "the sparse write allocated %jd of %" PRIu64 " bytes",
	       (intmax_t)st.st_blocks * 512, len);
	close(fd);
	free(back);
	free(dev_mem);
}

/*
 * The restore queue's first entries, appended by several threads at once
 * to a fresh engine: each directory's entries are found again, and the
 * engine frees them (the hashes' seed was made on first use, outside the
 * engine's lock: two first appends could each make one, and a directory
 * filed under one was looked for under the other, a NULL dereference at
 * its removal).
 */
#define HINT_THREADS	8
struct hint_arg {
	struct engine *e;
	pthread_barrier_t *b;
	uint64_t dir;
};

static void *hint_first(void *p)
{
	struct hint_arg *a = p;
	const char *name[1] = { "ckpt" };
	struct tfile *none[1] = { NULL };

	pthread_barrier_wait(a->b);
	ENSURE(engine_hint_append(a->e, a->dir, 0, true, name, none, 1) == 0, "hint_append");
	return NULL;
}

static void check_hints_first_at_once(void)
{
	struct engine_config cfg = {
		.host_cache = 1 << 20, .policy = &evict_score, .flush_threads = 1,
		.queue_depth = 2, .gpu_dev = -1,
	};

	for (int trial = 0; trial < 50; trial++) {
		struct hint_arg a[HINT_THREADS];
		pthread_t t[HINT_THREADS];
		pthread_barrier_t b;
		struct engine *e;
		char buf[256];
		int ret = engine_create(&e, &cfg);

		if (ret == -ENOSYS || ret == -EPERM)
			return;		/* no io_uring: main() says so */
		ENSURE(ret == 0, "engine_create: %s", strerror(-ret));
		pthread_barrier_init(&b, NULL, HINT_THREADS);
		for (int i = 0; i < HINT_THREADS; i++) {
			a[i] = (struct hint_arg){ e, &b, 100 + (uint64_t)i };
			ENSURE(pthread_create(&t[i], NULL, hint_first, &a[i]) == 0, "thread");
		}
		for (int i = 0; i < HINT_THREADS; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&b);
		for (int i = 0; i < HINT_THREADS; i++) {
			ret = engine_hint_list(e, 100 + (uint64_t)i, buf, sizeof(buf));
			ENSURE(ret > 0 && strstr(buf, "ckpt"), "trial %d: directory %d's entry "
			       "not found (%d)", trial, i, ret);
		}
		engine_destroy(e);
	}
}

int main(void)
{
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
	struct engine_config cfg = {
		.host_cache = CACHE, .policy = &evict_score, .flush_threads = 2,
		.queue_depth = 8, .gpu_dev = -1,
	};
	struct tf *big = &files[NFILES];
	const char *order[8];
	struct tfile *hinted[8];
	char names[8][16];
	struct engine *e;
	int ret, i;

	check_runs();
	check_seek_cache(tmp);
	check_hints_first_at_once();
	snprintf(dir, sizeof(dir), "%s/test_engine.XXXXXX", tmp);
	ENSURE(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
	ret = engine_create(&e, &cfg);
	if (ret == -ENOSYS || ret == -EPERM) {
		fprintf(stderr, "test_engine: no io_uring (%s): skipped\n", strerror(-ret));
		rmdir(dir);
		return 77;
	}
	ENSURE(ret == 0, "engine_create: %s", strerror(-ret));
	for (i = 0; i <= NFILES; i++) {
		files[i].id = i;
		snprintf(files[i].path, sizeof(files[i].path), "%.4000s/f%d", dir, i);
		tfile_init(&files[i].tf, e, &fake_ops, 0);
	}

	/* writes, and reads while the data is cached */
	for (i = 0; i < NFILES; i++) {
		write_file(&files[i], 1, FSIZE);
		read_file(&files[i], 1, FSIZE, "after write");
	}
	/* eviction under pressure: 10 MiB through a 4 MiB cache */
	ENSURE(stat_u64(e, "\"host\"", "evictions") > 0, "no eviction");
	for (i = 0; i < NFILES; i++)
		read_file(&files[i], 1, FSIZE, "after eviction");

	/* flush: fsync makes the backing file current */
	for (i = 0; i < NFILES; i++) {
		ENSURE(tfile_fsync(&files[i].tf) == 0, "fsync file %d", i);
		check_backing(&files[i], 1, FSIZE);
	}

	/* bigger than the cache: written through to a shadow version */
	write_file(big, 1, 2 * CACHE + 12345);
	ENSURE(tfile_fsync(&big->tf) == 0, "fsync big");
	check_backing(big, 1, 2 * CACHE + 12345);
	ENSURE(stat_u64(e, "\"ssd\"", "files_written_through") >= 1, "no write-through");
	read_file(big, 1, 2 * CACHE + 12345, "written through");

	/* prefetch: hint the first files (evicted by now), then read them */
	for (i = 0; i < 8; i++) {
		snprintf(names[i], sizeof(names[i]), "f%d", i);
		order[i] = names[i];
		hinted[i] = &files[i].tf;
		f_get(hinted[i]);	/* the queue takes it over */
	}
	ENSURE(engine_hint_append(e, 1, 0, true, order, hinted, 8) == 0, "hint_append");
	engine_prefetch_set(e, true);
	for (i = 0; i < 500 && stat_u64(e, "\"prefetch\"", "files_prefetched") < 4; i++)
		sleep_ms(10);
	ENSURE(stat_u64(e, "\"prefetch\"", "files_prefetched") >= 4, "prefetched %" PRIu64,
	       stat_u64(e, "\"prefetch\"", "files_prefetched"));
	for (i = 0; i < 8; i++)
		read_file(&files[i], 1, FSIZE, "prefetched");
	ENSURE(stat_u64(e, "\"prefetch\"", "consumed") == 8, "consumed");

	/* truncate */
	ENSURE(tfile_truncate(&files[0].tf, FSIZE / 4) == 0, "truncate");
	read_file(&files[0], 1, FSIZE / 4, "truncated");
	ENSURE(tfile_fsync(&files[0].tf) == 0, "fsync truncated");
	check_backing(&files[0], 1, FSIZE / 4);

	/* several writers and readers at once */
	{
		struct worker w[NTHREADS];
		pthread_t th[NTHREADS];

		for (i = 0; i < NTHREADS; i++) {
			w[i].e = e;
			w[i].first = i;
			ENSURE(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0, "thread");
		}
		for (i = 0; i < NTHREADS; i++)
			pthread_join(th[i], NULL);
	}
	for (i = 0; i < NFILES; i++) {
		ENSURE(tfile_fsync(&files[i].tf) == 0, "fsync file %d", i);
		check_backing(&files[i], 3, FSIZE / 2 + (uint64_t)i * 4096);
	}

	/* the files go: their copies and hints drop their references, which
	 * the flushers put; then nothing of the engine holds them */
	for (i = 0; i <= NFILES; i++)
		tfile_unlinked(&files[i].tf);
	for (i = 0; i < 1000; i++) {
		int held = 0;

		for (int j = 0; j <= NFILES; j++)
			held += __atomic_load_n(&files[j].refs, __ATOMIC_ACQUIRE) != 0;
		if (!held)
			break;
		sleep_ms(10);
	}
	ENSURE(i < 1000, "references still held after 10 s");
	for (i = 0; i <= NFILES; i++)
		tfile_destroy(&files[i].tf);
	engine_destroy(e);
	{
		DIR *d = opendir(dir);
		struct dirent *de;

		while (d && (de = readdir(d)))
			if (de->d_name[0] != '.')
				unlinkat(dirfd(d), de->d_name, 0);
		if (d)
			closedir(d);
	}
	ENSURE(rmdir(dir) == 0, "rmdir %s: %s", dir, strerror(errno));
	printf("test_engine: ok\n");
	return 0;
}
