/*
 * records.c - the records of changes that the journal (journal.c) carries:
 * a delta (JNL_DELTA: a small change of one backing file, its ranges' bytes
 * and its new size), a delta over a clone of a base (JNL_CLONE: a new
 * file that is another's but for a few ranges) and a commit intent (JNL_REDO: a new version to copy
 * over a file in place); their payloads, appended through jnl_append; their
 * writes into a file, the live flush's and the replay's alike; and their
 * applies at a replay, to a file found beneath the backing root by its
 * path or handle, and only where it is still the inode the record names.
 *
 * A commit intent is replayed by copying its version over its file again
 * (jnl_redo_write, the live copy's own): a copy cut short is finished, a
 * finished one rewritten with the same bytes; a later delta or intent of
 * the same file follows it in the sequence.
 *
 * Split from journal.c, which keeps the file and its records' order,
 * durability and replay.  No lock of its own: an apply runs under the
 * caller's (the file's ilock live, nothing at a replay).  Calls journal.c
 * (jnl_append, jnl_pwrite_all) and common/ (filecopy, log, fault points).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>
#include <linux/fs.h>
#include <linux/openat2.h>

#include "fault.h"
#include "filecopy.h"
#include "journal.h"
#include "journal_int.h"
#include "log.h"

/* ---- JNL_DELTA ------------------------------------------------------------ */

/* The delta payload's fixed part; then the handle, the path, the ranges
 * (struct jnl_range each) and their bytes, in range order. */
struct delta_head {
	uint64_t dev, ino, size;
	int64_t mtime_sec, mtime_nsec;
	uint32_t handle_len, path_len, n, pad;
};

/* Append a record of type, the npre iovecs pre (at most 2) then delta d's
 * payload (its ranges' bytes at base + d->r[i].off).  Not synced. */
static int delta_append(struct jnl *j, uint16_t type, const struct iovec *pre, int npre,
			const struct jnl_delta *d, const void *base, uint64_t *seq)
{
	struct delta_head h = {
		.dev = d->dev, .ino = d->ino, .size = d->size,
		.mtime_sec = d->mtime_sec, .mtime_nsec = d->mtime_nsec,
		.handle_len = d->handle ? d->handle_len : 0,
		.path_len = d->path ? (uint32_t)strlen(d->path) : 0, .n = d->n,
	};
	struct iovec *v = malloc(((size_t)d->n + 6) * sizeof(*v));
	int k = 0, ret;

	if (!v)
		return -ENOMEM;
	for (; k < npre; k++)
		v[k] = pre[k];
	v[k++] = (struct iovec){ &h, sizeof(h) };
	v[k++] = (struct iovec){ (void *)d->handle, h.handle_len };
	v[k++] = (struct iovec){ (void *)d->path, h.path_len };
	v[k++] = (struct iovec){ (void *)d->r, (size_t)d->n * sizeof(*d->r) };
	for (uint32_t i = 0; i < d->n; i++)
		if (!(d->r[i].len & JNL_ZERO))
			v[k++] = (struct iovec){ (char *)base + d->r[i].off, d->r[i].len };
	ret = jnl_append(j, type, v, k, seq);
	free(v);
	return ret;
}

int jnl_delta_append(struct jnl *j, const struct jnl_delta *d, const void *base,
		     uint64_t *seq)
{
	return delta_append(j, JNL_DELTA, NULL, 0, d, base, seq);
}

/* len bytes of p written at off of fd.  0 or -errno. */
static int pwrite_buf(int fd, const char *p, uint64_t len, uint64_t off)
{
	struct iovec v = { (void *)p, len };

	return len ? jnl_pwrite_all(fd, &v, 1, len, off) : 0;
}

/* Zero runs of a range FC_HOLE_RUN long or more (whole blocks of the
 * file) are punched, not written: a hole stays a hole, as a whole version
 * leaves it (the engine's sparse writes). */
#define HOLE_BLOCK	4096u

/* Range [off, off + len) of fd made p's bytes: its data written, its runs
 * of zeros (FC_HOLE_RUN, whole blocks of the file) punched (fc_clear_range);
 * a short run of zeros is written with the data around it.  0 or -errno. */
static int write_range(int fd, const char *p, uint64_t off, uint64_t len)
{
	uint64_t head = (HOLE_BLOCK - off % HOLE_BLOCK) % HOLE_BLOCK, pos, next;
	const uint8_t *blocks;
	bool hole;
	int ret;

	head = head < len ? head : len;		/* to the file's next block */
	ret = pwrite_buf(fd, p, head, off);
	blocks = (const uint8_t *)p + head;
	for (pos = head; !ret && pos < len; pos = next) {
		next = head + fc_zero_run(blocks, pos - head, len - head, HOLE_BLOCK, FC_HOLE_RUN,
					  false, &hole);
		ret = hole ? fc_clear_range(fd, (loff_t)(off + pos), (loff_t)(off + next))
			   : pwrite_buf(fd, p + pos, next - pos, off + pos);
	}
	return ret;
}

/*
 * Write ranges r (n) into fd, size it and set its mtime, fsync it.  The
 * bytes of range i are at base + r[i].off, or (packed) one after the
 * other from base.
 */
static int write_delta(int fd, const struct jnl_range *r, uint32_t n, const void *base,
		       bool packed, uint64_t size, int64_t mtime_sec, int64_t mtime_nsec,
		       bool sync)
{
	const char *at = base;

	for (uint32_t i = 0; i < n; i++) {
		const char *p = packed ? at : (const char *)base + r[i].off;
		uint64_t len = r[i].len & ~JNL_ZERO;
		int ret = r[i].len & JNL_ZERO ?
			fc_clear_range(fd, (loff_t)r[i].off, (loff_t)(r[i].off + len)) :
			write_range(fd, p, r[i].off, len);

		if (ret)
			return ret;
		if (!(r[i].len & JNL_ZERO))
			at += len;
	}
	if (ftruncate(fd, (off_t)size) < 0)
		return -errno;
	if (mtime_sec || mtime_nsec) {
		struct timespec tv[2] = { { 0, UTIME_OMIT }, { mtime_sec, mtime_nsec } };

		futimens(fd, tv);
	}
	/*
	 * fdatasync: the bytes and the size.  The mtime set above is
	 * committed by the backing file system's log no later than the
	 * journal's next sync (ext4's and XFS's logs commit in order), which
	 * is what makes the record's retirement durable.
	 */
	return !sync ? 0 : fdatasync(fd) < 0 ? -errno : 0;
}

int jnl_delta_write(int fd, const struct jnl_range *r, uint32_t n, const void *base,
		    uint64_t size, int64_t mtime_sec, int64_t mtime_nsec, bool sync)
{
	return write_delta(fd, r, n, base, false, size, mtime_sec, mtime_nsec, sync);
}

/*
 * Is fd the file a record names: its inode number, and (where the record
 * has one) its handle, which tells a reused inode number from the file
 * itself.  Not its device number: a disk may come back under another
 * after a crash (and the file is beneath the backing root anyway).
 */
static bool same_file(int fd, uint64_t ino, const void *handle, uint32_t handle_len)
{
	union {
		struct file_handle fh;
		char buf[sizeof(struct file_handle) + MAX_HANDLE_SZ];
	} u;
	struct stat st;
	int mnt;

	if (fstat(fd, &st) < 0 || st.st_ino != (ino_t)ino || !S_ISREG(st.st_mode))
		return false;
	if (handle_len < sizeof(struct file_handle))
		return true;
	u.fh.handle_bytes = MAX_HANDLE_SZ;
	if (name_to_handle_at(fd, "", &u.fh, &mnt, AT_EMPTY_PATH) < 0)
		return true;	/* no handles here: the inode is all there is */
	return sizeof(u.fh) + u.fh.handle_bytes == handle_len &&
	       !memcmp(&u.fh, handle, handle_len);
}

/* Is fd's file beneath directory root_fd (by their paths)? */
static bool beneath(int root_fd, int fd)
{
	char proc[64], root[PATH_MAX], path[PATH_MAX];
	ssize_t rn, pn;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", root_fd);
	rn = readlink(proc, root, sizeof(root) - 1);
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	pn = readlink(proc, path, sizeof(path) - 1);
	if (rn <= 0 || pn <= 0)
		return false;
	root[rn] = path[pn] = 0;
	if (!strcmp(root, "/"))
		rn = 0;
	return pn > rn && !strncmp(path, root, (size_t)rn) && path[rn] == '/';
}

/* Open path beneath root_fd without following symlinks: fd or -1 (errno). */
static int open_beneath(int root_fd, const char *path, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)flags | O_NOFOLLOW | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	int fd = (int)syscall(SYS_openat2, root_fd, path, &how, sizeof(how));

	if (fd < 0 && errno == ENOSYS)
		fd = openat(root_fd, path, flags | O_NOFOLLOW | O_CLOEXEC);
	return fd;
}

/*
 * The file a record names (inode ino, its handle of handle_len bytes,
 * path or NULL), O_RDWR: by its path beneath root_fd (no symlinks
 * followed); where that names another file now (renamed since), by its
 * handle, if the file it opens is still beneath root_fd.  -ENOENT with why
 * where neither finds it; -errno where the path names something that
 * cannot be opened for writing now (an immutable file, a read-only file
 * system, no memory): not a reason to drop the record.
 */
static int file_open(int root_fd, uint64_t ino, const void *handle, uint32_t handle_len,
		     const char *path, char *why, size_t wl)
{
	int fd = -1;

	snprintf(why, wl, "removed since");
	if (path && path[0]) {
		fd = open_beneath(root_fd, path, O_RDWR);
		if (fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS ||
			       errno == EIO || errno == ENOMEM || errno == EMFILE ||
			       errno == ENFILE || errno == ETXTBSY)) {
			int ret = -errno;	/* there, and not writable now: the
						 * record stays */

			snprintf(why, wl, "not writable");
			return ret;
		}
		if (fd >= 0 && same_file(fd, ino, handle, handle_len))
			return fd;
		if (fd >= 0) {
			snprintf(why, wl, "another file now");
			close(fd);
		}
	}
	if (handle_len >= sizeof(struct file_handle)) {
		int mfd = openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		struct file_handle *fh = malloc(handle_len);

		fd = -1;
		if (mfd >= 0 && fh) {
			memcpy(fh, handle, handle_len);
			if (fh->handle_bytes + sizeof(*fh) == handle_len)
				fd = open_by_handle_at(mfd, fh, O_RDWR | O_CLOEXEC);
		}
		free(fh);
		if (fd >= 0 && (!same_file(fd, ino, handle, handle_len) || !beneath(mfd, fd))) {
			close(fd);
			fd = -1;
		}
		if (mfd >= 0)
			close(mfd);
		if (fd >= 0)
			return fd;
	}
	return -ENOENT;
}

/*
 * fd's content made base bfd's first bsize bytes: all of it cloned (its
 * extents shared, none copied), then cut to bsize (the delta's apply sizes
 * it after).  0 or -errno.
 */
static int clone_base(int bfd, uint64_t bsize, int fd)
{
	if (ftruncate(fd, 0) < 0)
		return -errno;
	if (bsize && ioctl(fd, FICLONE, bfd) < 0)
		return -errno;
	return ftruncate(fd, (off_t)bsize) < 0 ? -errno : 0;
}

/*
 * A file a record keeps under a hidden name below root_fd (a commit
 * intent's new version, a clone record's base; `what` says which), opened
 * for reading where it is still the regular file of inode ino and size
 * bytes that the record names: its descriptor, or -1 with why saying what
 * became of it (the record is then passed over).
 */
static int open_kept(int root_fd, const char *name, uint64_t ino, uint64_t size,
		     const char *what, char *why, size_t wl)
{
	struct stat st;
	int fd = open_beneath(root_fd, name, O_RDONLY);

	if (fd < 0 || fstat(fd, &st) < 0) {
		snprintf(why, wl, "its %s %s is gone (%s)", what, name, strerror(errno));
	} else if (!S_ISREG(st.st_mode) || st.st_ino != (ino_t)ino ||
		   (uint64_t)st.st_size != size) {
		snprintf(why, wl, "its %s %s is another file now", what, name);
	} else {
		return fd;
	}
	if (fd >= 0)
		close(fd);
	return -1;
}

/*
 * Apply delta payload p (len bytes) to its file below root_fd, after a
 * clone of base fd bfd (bsize bytes) into it where bfd >= 0.
 */
static int delta_apply(int root_fd, const void *p, uint64_t len, int bfd, uint64_t bsize,
		       char *why, size_t wl)
{
	const char *q = p;
	struct delta_head h;
	struct jnl_range *r = NULL;
	char *path = NULL;
	uint64_t need, bytes = 0;
	int fd, ret;

	snprintf(why, wl, "-");
	if (len < sizeof(h))
		return -EINVAL;
	memcpy(&h, q, sizeof(h));
	need = sizeof(h) + (uint64_t)h.handle_len + h.path_len + (uint64_t)h.n * sizeof(*r);
	if (need > len || h.path_len >= PATH_MAX)
		return -EINVAL;
	/* copied: they may be unaligned in p */
	r = malloc(((size_t)h.n ? h.n : 1) * sizeof(*r));
	if (!r)
		return -ENOMEM;
	memcpy(r, q + sizeof(h) + h.handle_len + h.path_len, (size_t)h.n * sizeof(*r));
	ret = -EINVAL;
	for (uint32_t i = 0; i < h.n; i++) {
		uint64_t rl = r[i].len & ~JNL_ZERO;

		if (r[i].off + rl < r[i].off || r[i].off + rl > h.size)
			goto out_r;
		if (!(r[i].len & JNL_ZERO))
			bytes += rl;
	}
	if (bytes != len - need)
		goto out_r;
	ret = -ENOMEM;
	path = strndup(q + sizeof(h) + h.handle_len, h.path_len);
	if (!path)
		goto out_r;
	fd = file_open(root_fd, h.ino, q + sizeof(h), h.handle_len, path, why, wl);
	free(path);
	if (fd < 0) {
		ret = fd == -ENOENT ? 1 : fd;
		goto out_r;
	}
	ret = bfd >= 0 ? clone_base(bfd, bsize, fd) : 0;
	if (!ret)
		ret = write_delta(fd, r, h.n, q + need, true, h.size, h.mtime_sec,
				  h.mtime_nsec, true);
	close(fd);
out_r:
	free(r);
	return ret;
}

int jnl_delta_apply(int root_fd, const void *p, uint64_t len, char *why, size_t wl)
{
	return delta_apply(root_fd, p, len, -1, 0, why, wl);
}

/* ---- JNL_CLONE ------------------------------------------------------------ */

/* The clone payload's fixed part; then the base's name, then a delta's
 * payload. */
struct clone_head {
	uint64_t bino, bsize;
	uint32_t name_len, pad;
};

int jnl_clone_append(struct jnl *j, const struct jnl_base *b, const struct jnl_delta *d,
		     const void *data, uint64_t *seq)
{
	struct clone_head h = { .bino = b->ino, .bsize = b->size,
				.name_len = (uint32_t)strlen(b->name) };
	struct iovec pre[2] = { { &h, sizeof(h) }, { (void *)b->name, h.name_len } };

	if (!h.name_len || h.name_len >= PATH_MAX)
		return -EINVAL;
	return delta_append(j, JNL_CLONE, pre, 2, d, data, seq);
}

int jnl_clone_apply(int root_fd, const void *p, uint64_t len, char *why, size_t wl)
{
	const char *q = p;
	struct clone_head h;
	char *name;
	int bfd, ret = 1;

	snprintf(why, wl, "-");
	if (len < sizeof(h))
		return -EINVAL;
	memcpy(&h, q, sizeof(h));
	if (!h.name_len || h.name_len >= PATH_MAX || sizeof(h) + (uint64_t)h.name_len > len)
		return -EINVAL;
	name = strndup(q + sizeof(h), h.name_len);
	if (!name)
		return -ENOMEM;
	bfd = open_kept(root_fd, name, h.bino, h.bsize, "base", why, wl);
	if (bfd >= 0) {
		ret = delta_apply(root_fd, q + sizeof(h) + h.name_len,
				  len - sizeof(h) - h.name_len, bfd, h.bsize, why, wl);
		close(bfd);
	}
	free(name);
	return ret;
}

/* ---- JNL_REDO ------------------------------------------------------------- */

/* The intent payload's fixed part; then the handle, the path and the
 * version's name. */
struct redo_head {
	uint64_t dev, ino, size, vino;
	uint32_t handle_len, path_len, version_len, pad;
};

int jnl_redo_append(struct jnl *j, const struct jnl_redo *r, uint64_t *seq)
{
	struct redo_head h = {
		.dev = r->dev, .ino = r->ino, .size = r->size, .vino = r->vino,
		.handle_len = r->handle ? r->handle_len : 0,
		.path_len = r->path ? (uint32_t)strlen(r->path) : 0,
		.version_len = (uint32_t)strlen(r->version),
	};
	struct iovec v[4] = {
		{ &h, sizeof(h) },
		{ (void *)r->handle, h.handle_len },
		{ (void *)r->path, h.path_len },
		{ (void *)r->version, h.version_len },
	};

	if (!h.version_len || h.version_len >= PATH_MAX || h.path_len >= PATH_MAX)
		return -EINVAL;
	return jnl_append(j, JNL_REDO, v, 4, seq);
}

/*
 * The version's data runs are copied and its holes made holes in fd
 * (filecopy.h): a sparse file stays sparse, and the copy costs its data,
 * not its size.  Where vfd cannot say (no SEEK_DATA), all of it is data.
 * The "inplace_copy" kill (tests) comes once half of size is copied.
 */
int jnl_redo_write(int vfd, int fd, uint64_t size, bool sync)
{
	char cap[256];
	loff_t pos = 0, end = (loff_t)size, half = (loff_t)(size / 2);
	bool plain = false, fault = tierfs_fault("inplace_copy");
	int ret = 0;
	/*
	 * Our writes take the file's capability away (any write does, root's
	 * too); it was the user's to keep: put back after the copy.  (A kill
	 * in between loses it; a replay of the intent restores the data only.)
	 */
	ssize_t caplen = fgetxattr(fd, "security.capability", cap, sizeof(cap));

	while (!ret && pos < end) {
		loff_t data, hole;

		if (fault && pos >= half)
			raise(SIGKILL);		/* tests: a kill halfway */
		fc_next_run(vfd, pos, end, &data, &hole);
		ret = fc_clear_range(fd, pos, data);
		if (ret || data == end)
			break;
		if (fault && data >= half)
			raise(SIGKILL);
		if (fault && hole > half) {
			ret = fc_copy_range(vfd, fd, data, half, &plain);
			if (!ret)
				raise(SIGKILL);
		}
		ret = fc_copy_range(vfd, fd, data, hole, &plain);
		pos = hole;
	}
	if (ret)
		return ret;
	if (fault)
		raise(SIGKILL);			/* the data all before half */
	if (ftruncate(fd, (off_t)size) < 0)
		return -errno;
	if (caplen > 0 && fsetxattr(fd, "security.capability", cap, (size_t)caplen, 0) < 0)
		tlog(LOG_WARNING, "a file capability could not be put back after an in-place "
		     "copy: %s", strerror(errno));
	return sync && fsync(fd) < 0 ? -errno : 0;
}

int jnl_redo_apply(int root_fd, const void *p, uint64_t len, char *why, size_t wl)
{
	const char *q = p;
	struct redo_head h;
	char *path = NULL, *version = NULL;
	int fd = -1, vfd = -1, ret;

	snprintf(why, wl, "-");
	if (len < sizeof(h))
		return -EINVAL;
	memcpy(&h, q, sizeof(h));
	if (len != sizeof(h) + (uint64_t)h.handle_len + h.path_len + h.version_len ||
	    h.path_len >= PATH_MAX || !h.version_len || h.version_len >= PATH_MAX)
		return -EINVAL;
	ret = -ENOMEM;
	path = strndup(q + sizeof(h) + h.handle_len, h.path_len);
	version = strndup(q + sizeof(h) + h.handle_len + h.path_len, h.version_len);
	if (!path || !version)
		goto out;
	ret = 1;
	vfd = open_kept(root_fd, version, h.vino, h.size, "new version", why, wl);
	if (vfd < 0)
		goto out;
	char fwhy[64];

	fd = file_open(root_fd, h.ino, q + sizeof(h), h.handle_len, path, fwhy, sizeof(fwhy));
	if (fd < 0) {
		snprintf(why, wl, "its file %s is %s", path[0] ? path : "(no path)", fwhy);
		ret = fd == -ENOENT ? 1 : fd;
		goto out;
	}
	ret = jnl_redo_write(vfd, fd, h.size, true);
out:
	if (fd >= 0)
		close(fd);
	if (vfd >= 0)
		close(vfd);
	free(path);
	free(version);
	return ret;
}
