/*
 * backing.c - moving bytes where no cache tier's own copy function does:
 * between a cache, device memory and a backing file, through one bounce
 * buffer (backing_move), and the plain file I/O of the engine (reads that
 * zero-fill past the end of a file, writes that write everything, the
 * sparse copy of a backing file into a new version), and where a buffer's
 * holes are (backing_run: the runs of zeros a version leaves unwritten);
 * the writes of a flush into its version, through a flusher's io_uring or
 * plain, holes left out (flush.c and dedup_flush.c share them), and the
 * settling of a version before its rename (eng_settle_version, of a
 * group of small ones at once eng_settle_versions, and eng_settle_cloned
 * for one holding clones).
 *
 * Owns nothing and takes no lock: callers hold a lease on any copy they
 * name (engine_int.h) and have dropped e->lock.  Calls the tiers' copy
 * functions (struct tier_ops), gpu/ (gpu_copy_*) and ssd.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <linux/falloc.h>

#include "engine_int.h"
#include "filecopy.h"
#include "gpu.h"
#include "ssd.h"

#define BOUNCE_MAX	(8u << 20)	/* bytes per bounced chunk */

int backing_open(int dirfd, const char *path, int flags, mode_t mode)
{
	int fd = openat(dirfd, path, flags | O_NOATIME | O_CLOEXEC, mode);

	if (fd < 0 && errno == EPERM)
		fd = openat(dirfd, path, flags | O_CLOEXEC, mode);
	return fd;
}

int backing_pread(int fd, void *buf, size_t n, off_t off)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = pread(fd, (char *)buf + done, n - done, off + (off_t)done);

		if (r < 0)
			return -errno;
		if (r == 0) {		/* past the file's end: a hole */
			memset((char *)buf + done, 0, n - done);
			break;
		}
		done += (size_t)r;
	}
	return 0;
}

/*
 * A read of a sparse file's holes goes through the page cache, which the
 * kernel fills with pages of zeros, each copied out: a writable copy of a
 * file of a few MiB of data in a large hole (eng_writable_copy's fill)
 * cost the copy of its whole length.  Its data runs are read; its holes
 * are a memset.  Where fd says nothing, the rest is read whole
 * (fc_next_run, as backing_copy_file walks them).
 */
int backing_pread_sparse(int fd, void *buf, size_t n)
{
	char *b = buf;
	loff_t pos = 0, end = (loff_t)n, data, hole;
	int ret = 0;

	while (!ret && pos < end) {
		fc_next_run(fd, pos, end, &data, &hole);
		memset(b + pos, 0, (size_t)(data - pos));
		if (data < hole)
			ret = backing_pread(fd, b + data, (size_t)(hole - data), data);
		pos = hole;
	}
	return ret;
}

int backing_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	size_t done = 0;

	while (done < n) {
		ssize_t w = pwrite(fd, (const char *)buf + done, n - done, off + (off_t)done);

		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;
		done += (size_t)w;
	}
	return 0;
}

/* Read n bytes at offset `at` (past the end's own start) of end b. */
static int bend_read(const struct bend *b, uint64_t at, void *buf, size_t n)
{
	switch (b->kind) {
	case BEND_CACHE:
		return b->cache->ops->read(b->cache, b->at + at, buf, n);
	case BEND_DEV:
		return gpu_copy_dtoh(buf, b->at + at, n);
	case BEND_FD:
		return backing_pread(b->fd, buf, n, (off_t)(b->at + at));
	}
	return -EINVAL;
}

/* buf's n bytes at off of fd, its runs of zeros left out (backing_run). */
static int pwrite_sparse(int fd, const void *buf, uint64_t n, uint64_t off)
{
	uint64_t pos = 0, next;
	bool hole;
	int ret = 0;

	for (; pos < n && !ret; pos = next) {
		next = backing_run(buf, pos, n, &hole);
		if (!hole)
			ret = backing_pwrite(fd, (const uint8_t *)buf + pos, next - pos,
					     (off_t)(off + pos));
	}
	return ret;
}

static int bend_write(const struct bend *b, uint64_t at, const void *buf, size_t n)
{
	if (b->kind == BEND_FD && b->sparse)
		return pwrite_sparse(b->fd, buf, n, b->at + at);
	switch (b->kind) {
	case BEND_CACHE:
		return b->cache->ops->write(b->cache, b->at + at, buf, n);
	case BEND_DEV:
		return gpu_copy_htod(b->at + at, buf, n);
	case BEND_FD:
		return backing_pwrite(b->fd, buf, n, (off_t)(b->at + at));
	}
	return -EINVAL;
}

int backing_move(const struct bend *dst, const struct bend *src, uint64_t len,
		 uint64_t *progress)
{
	size_t cap = len < BOUNCE_MAX ? (size_t)len : BOUNCE_MAX;
	uint64_t done = 0;
	uint8_t *b;
	int ret = 0;

	if (!len)
		return 0;
	b = malloc(cap);
	if (!b)
		return -ENOMEM;
	while (done < len && !ret) {
		size_t n = len - done < cap ? (size_t)(len - done) : cap;

		ret = bend_read(src, done, b, n);
		if (!ret)
			ret = bend_write(dst, done, b, n);
		done += n;
		if (progress)
			__atomic_store_n(progress, done, __ATOMIC_RELAXED);
	}
	free(b);
	return ret;
}

uint64_t backing_run(const uint8_t *buf, uint64_t pos, uint64_t end, bool *hole)
{
	return fc_zero_run(buf, pos, end, TIER_ALIGN, SPARSE_RUN, true, hole);
}

off_t backing_seek_buf(const uint8_t *buf, uint64_t len, uint64_t size, uint64_t off,
		       int whence)
{
	uint64_t pos = off - off % TIER_ALIGN, next;
	bool hole;

	for (; pos < len; pos = next) {
		next = backing_run(buf, pos, len, &hole);
		if (next > off && hole == (whence == SEEK_HOLE))
			return (off_t)(pos > off ? pos : off);
	}
	if (whence == SEEK_DATA)
		return -ENXIO;
	return (off_t)(len > off ? len : off < size ? off : size);
}

off_t backing_seek_cache(struct cache *c, uint64_t at, uint64_t len, uint64_t size,
			 uint64_t off, int whence)
{
	size_t cap = len < BOUNCE_MAX ? (size_t)len : BOUNCE_MAX;
	uint64_t base;
	uint8_t *b;
	off_t ret = -ENXIO;

	if (!cap || off >= len)
		return backing_seek_buf(NULL, 0, size, off, whence);
	b = malloc(cap);
	if (!b)
		return -ENOMEM;
	for (base = off - off % cap; base < len; base += cap) {
		size_t n = len - base < cap ? (size_t)(len - base) : cap;
		uint64_t from = off > base ? off - base : 0;
		int err = c->ops->read(c, at + base, b, n);

		if (err) {
			ret = err;
			break;
		}
		ret = backing_seek_buf(b, n, n, from, whence);
		if (ret >= 0 && (whence == SEEK_DATA || (uint64_t)ret < n)) {
			ret += (off_t)base;
			break;
		}
		ret = -ENXIO;	/* on to the next chunk */
	}
	free(b);
	if (ret == -ENXIO && whence == SEEK_HOLE)
		ret = (off_t)len;	/* data to len, a hole after it */
	return ret;
}

int backing_pwrite_sparse(int fd, const void *buf, uint64_t n)
{
	return pwrite_sparse(fd, buf, n, 0);
}

/* ---- a flush's writes and the settling of its version --------------- */

/*
 * ssd_write_segs() through a flusher's io_uring, or, without one (ring
 * NULL: an fsync flushing its small file itself, eng_flush_inline), plain
 * writes in the caller's thread.  0 or the first -errno.
 */
int backing_write_segs(struct ssd_ring *ring, int fd, const struct ssd_seg *seg, unsigned n,
		       uint64_t *progress)
{
	if (ring)
		return ssd_write_segs(ring, fd, seg, n, progress);
	for (unsigned i = 0; i < n; i++) {
		int ret = backing_pwrite(fd, seg[i].buf, seg[i].len, (off_t)seg[i].off);

		if (ret)
			return ret;
		if (progress)
			__atomic_add_fetch(progress, seg[i].len, __ATOMIC_RELAXED);
	}
	return 0;
}

/* Write bytes [a, b) of cp at the same offset of fd: 0 / -errno. */
int backing_write_range(struct ssd_ring *ring, int fd, struct copy *cp, uint64_t a,
			uint64_t b, uint64_t *progress)
{
	if (b <= a)
		return 0;
	if (!cp->cache->host_addressable)
		return backing_move(&(struct bend){ .kind = BEND_FD, .fd = fd, .at = a },
				    &(struct bend){ .kind = BEND_CACHE, .cache = cp->cache,
						    .at = cp->frag->off + a },
				    b - a, NULL);
	return backing_write_segs(ring, fd, &(struct ssd_seg){ .off = a, .len = b - a,
							       .buf = copy_ptr(cp) + a },
				  1, progress);
}

/*
 * Give fresh version fd its size end and the blocks of cp's data below it
 * (its runs of zeros stay holes, backing_run) before a flusher's direct
 * writes: none of them then extends the file, or allocates blocks as it
 * goes.  A direct write past the end of the file runs alone on ext4 and
 * XFS (the inode locked for it, ext4 waits for its completion too), so
 * the flusher's requests in flight would be written one at a time.  A
 * file system without fallocate() gets the size only.  cp is
 * host-addressable (its data runs are read).  0 / -errno.
 */
int backing_prealloc(int fd, struct copy *cp, uint64_t end)
{
	if (ftruncate(fd, (off_t)end) < 0)
		return -errno;
	return backing_prealloc_range(fd, cp, 0, end);
}

/* The blocks of cp's data in [a, b) of fd (its holes left out), as
 * backing_prealloc() gives them, fd's size left.  0 / -errno. */
int backing_prealloc_range(int fd, struct copy *cp, uint64_t a, uint64_t b)
{
	uint64_t pos, next;
	bool hole;

	for (pos = a; pos < b; pos = next) {
		next = backing_run(copy_ptr(cp), pos, b, &hole);
		if (hole)
			continue;
		if (fallocate(fd, 0, (off_t)pos, (off_t)(next - pos)) < 0) {
			if (errno == EOPNOTSUPP || errno == ENOSYS)
				return 0;
			return -errno;	/* ENOSPC: the flush fails, and is retried */
		}
	}
	return 0;
}

/*
 * Write bytes [a, b) of cp at the same offset of fd, its holes
 * (backing_run) left out: a fresh version's are holes already, and a
 * version written in place (inplace) has them punched (written as zeros
 * where the file system cannot punch).  a is a multiple of TIER_ALIGN.
 * Only host-addressable copies are looked at; others are written whole.
 * 0 or -errno (-ENOMEM too: retried, like any failed flush).
 */
int backing_write_sparse(struct ssd_ring *ring, int fd, struct copy *cp, uint64_t a,
			 uint64_t b, uint64_t *progress, bool inplace)
{
	struct ssd_seg *seg = NULL, *ns;
	unsigned n = 0, cap = 0;
	uint64_t pos, next, holes = 0;
	bool hole;
	int ret = 0;

	if (!cp->cache->host_addressable)
		return backing_write_range(ring, fd, cp, a, b, progress);
	for (pos = a; pos < b && !ret; pos = next) {
		next = backing_run(copy_ptr(cp), pos, b, &hole);
		if (hole) {
			holes += next - pos;
			if (inplace && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
						 (off_t)pos, (off_t)(next - pos)) < 0)
				ret = backing_write_range(ring, fd, cp, pos, next, progress);
			continue;
		}
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			ns = realloc(seg, cap * sizeof(*seg));
			if (!ns) {
				ret = -ENOMEM;	/* retried, like any failed flush */
				break;
			}
			seg = ns;
		}
		seg[n++] = (struct ssd_seg){ .off = pos, .len = next - pos,
					     .buf = copy_ptr(cp) + pos };
	}
	if (!ret && n)
		ret = backing_write_segs(ring, fd, seg, n, progress);
	free(seg);
	if (!ret && progress)
		__atomic_add_fetch(progress, holes, __ATOMIC_RELAXED);
	return ret;
}

/* e->cfg.ordered_log holds for fd: it is on that file system. */
static bool ordered_here(struct engine *e, int fd)
{
	struct stat st;

	return e->cfg.ordered_log && fstat(fd, &st) == 0 && st.st_dev == e->cfg.ordered_dev;
}

/* Wait for the writes of fd already made or under way to complete. */
static int wait_written(int fd)
{
	return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
			       SYNC_FILE_RANGE_WAIT_AFTER) < 0 ? -errno : 0;
}

/*
 * Make the bytes written to version fd stable before its rename.  In
 * general an fdatasync: the rename must never be durable before the data
 * it names.  On a file system whose log commits every metadata change in
 * order, each commit after a flush of the disk's cache (e->cfg.ordered_log,
 * backing_log_ordered()), it is enough that the writes completed: the
 * version's allocation and size are logged before its rename, and the
 * commit that makes the rename durable (the directory's fsync at the
 * file's fsync, or the file system's own) flushes the cache first.  One
 * log commit per fsync instead of two, and none per background flush
 * (tests/test_crash_states.py checks both ways at every moment of a run).
 * Not for a version written in place (no rename orders it), nor on another
 * file system under the backing directory.  ring NULL: a plain fdatasync.
 */
int eng_settle_version(struct engine *e, struct ssd_ring *ring, int fd, bool small,
		       bool inplace)
{
	if (!inplace && ordered_here(e, fd))
		return wait_written(fd);
	return small || !ring ? (fdatasync(fd) < 0 ? -errno : 0) : ssd_fdatasync(ring, fd);
}

/*
 * eng_settle_version() of the n versions fd[0..n) (inplace[i]: fd[i] is
 * written in place) at once, res[i] each one's result: where the log is
 * ordered, their writebacks started together and waited for; elsewhere
 * their fdatasyncs in flight together through the ring (the file
 * system's log commits them in one transaction or a few, where one at a
 * time would be a commit and a disk cache flush each).
 */
void eng_settle_versions(struct engine *e, struct ssd_ring *ring, const int *fd,
			 const bool *inplace, int *res, unsigned n)
{
	int sfd[n], sres[n];
	bool ord[n];
	unsigned ns = 0, i;

	for (i = 0; i < n; i++) {
		res[i] = 0;
		ord[i] = !inplace[i] && ordered_here(e, fd[i]);
		if (ord[i]) {
			if (sync_file_range(fd[i], 0, 0, SYNC_FILE_RANGE_WRITE) < 0)
				res[i] = -errno;
		} else {
			sfd[ns++] = fd[i];
		}
	}
	if (ns)
		ssd_fdatasync_many(ring, sfd, sres, ns);
	for (i = 0, ns = 0; i < n; i++) {
		if (!ord[i])
			res[i] = sres[ns++];
		else if (!res[i])
			res[i] = wait_written(fd[i]);
	}
}

/*
 * Make a version holding extents cloned from earlier versions (an
 * incremental or a de-duplicated flush) stable before its rename.  Where
 * the log is ordered (eng_settle_version), as a whole version is: the
 * clones are logged changes of its extent map, committed in order before
 * the rename, and the blocks they share were written and completed for
 * the earlier version (its own settle), so the rename's commit, which
 * flushes the disk's cache first, makes all of it durable; the writes
 * over shared blocks (copy-on-write) are remapped when they complete,
 * before the wait returns.  Elsewhere an fsync, not an fdatasync: the
 * clones changed the extent map.  (tests/test_crash_states.py writes
 * such versions on XFS.)  0 / -errno.
 */
int eng_settle_cloned(struct engine *e, int fd)
{
	return ordered_here(e, fd) ? wait_written(fd) : fsync(fd) < 0 ? -errno : 0;
}

/* engine.h.  As eng_settle_cloned (an fsync where not ordered: the
 * version's size and allocation are metadata the record depends on). */
int engine_settle_named(struct engine *e, int fd)
{
	return eng_settle_cloned(e, fd);
}

/* Holes kept (filecopy.h): the version gets f's data runs only. */
int backing_copy_file(struct tfile *f, int dst, uint64_t len)
{
	int src = f->ops->data_fd(f, false), ret;

	if (src < 0)
		return src == -ENOENT ? 0 : src;
	ret = backing_copy_range(src, dst, 0, len);
	f->ops->release_data_fd(f, src);
	return ret;
}

int backing_copy_range(int src, int dst, uint64_t from, uint64_t to)
{
	loff_t pos = (loff_t)from, end = (loff_t)to;
	bool plain = false;
	int ret = 0;

	while (!ret && pos < end) {
		loff_t data, hole;

		fc_next_run(src, pos, end, &data, &hole);
		if (data == end)
			break;
		ret = fc_copy_range(src, dst, data, hole, &plain);
		pos = hole;
	}
	return ret;
}

#define XFS_MAGIC		0x58465342
#define EXT4_MAGIC		0xEF53
#define EXT4_HAS_JOURNAL	0x0004	/* s_feature_compat */
#define EXT4_FAST_COMMIT	0x0400

/* The mount options of the file system with device dev (empty: unknown). */
static void mount_opts(dev_t dev, char *out, size_t len)
{
	char line[4096];
	FILE *f = fopen("/proc/self/mountinfo", "re");

	out[0] = 0;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		unsigned maj, min;
		char *sep, *super;

		if (sscanf(line, "%*d %*d %u:%u", &maj, &min) != 2 ||
		    makedev(maj, min) != dev || !(sep = strstr(line, " - ")))
			continue;
		/* " - FSTYPE SOURCE SUPER_OPTIONS" */
		super = strrchr(sep, ' ');
		snprintf(out, len, "%s", super ? super + 1 : "");
		break;
	}
	fclose(f);
}

/* ext4's feature_compat word from the superblock of device dev, or -1. */
static long ext4_compat(dev_t dev)
{
	char path[64], name[64] = "", line[256];
	uint8_t sb[1024];
	FILE *f;
	int fd;

	snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/uevent", major(dev), minor(dev));
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "DEVNAME=%63s", name) == 1)
			break;
	fclose(f);
	if (!name[0])
		return -1;
	snprintf(path, sizeof(path), "/dev/%s", name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (pread(fd, sb, sizeof(sb), 1024) != (ssize_t)sizeof(sb) ||
	    (sb[0x38] | sb[0x39] << 8) != EXT4_MAGIC) {
		close(fd);
		return -1;
	}
	close(fd);
	return (long)((uint32_t)sb[0x5C] | (uint32_t)sb[0x5D] << 8 |
		      (uint32_t)sb[0x5E] << 16 | (uint32_t)sb[0x5F] << 24);
}

bool backing_log_ordered(int dirfd, char *why, size_t wl)
{
	struct statfs sf;
	struct stat st;
	char opts[1024];
	long compat;

	if (fstatfs(dirfd, &sf) < 0 || fstat(dirfd, &st) < 0) {
		snprintf(why, wl, "cannot examine it: %s", strerror(errno));
		return false;
	}
	mount_opts(st.st_dev, opts, sizeof(opts));
	if ((unsigned long)sf.f_type == XFS_MAGIC)
		return true;
	if ((unsigned long)sf.f_type != EXT4_MAGIC) {
		snprintf(why, wl, "not ext4 or XFS");
		return false;
	}
	compat = ext4_compat(st.st_dev);
	if (compat < 0) {
		snprintf(why, wl, "ext4 whose superblock cannot be read");
		return false;
	}
	if (!(compat & EXT4_HAS_JOURNAL)) {
		snprintf(why, wl, "ext4 without a journal");
		return false;
	}
	if (compat & EXT4_FAST_COMMIT) {
		snprintf(why, wl, "ext4 with fast commits");
		return false;
	}
	if (strstr(opts, "journal_async_commit") || strstr(opts, "nobarrier") ||
	    strstr(opts, "barrier=0")) {
		snprintf(why, wl, "ext4 mounted with %s",
			 strstr(opts, "journal_async_commit") ? "journal_async_commit" :
			 "no barriers");
		return false;
	}
	return true;
}
