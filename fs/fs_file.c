/*
 * fs_file.c - FUSE operations on file content: open, create, read, write,
 * flush, release, fsync, fallocate, lseek (holes); and what the kernel is told when the
 * GPU wrote a file behind its back (fs_kernel_written).
 *
 * Content goes through the engine (tiers/): each handler takes an inode
 * reference for the transfer; fs.lock is held only around open counts.
 */
#include <dirent.h>
#include <linux/falloc.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

#include "fs.h"
#include "../tiers/gpu_tier.h"

static bool writable(int flags)
{
	return (flags & O_ACCMODE) != O_RDONLY;
}

/* A writable handle closed (FLUSH), not yet released: fs.closing. */
struct fs_closing {
	uint32_t hid;		/* the handle's number (fi->fh) */
	double at;		/* tier_now() of its last FLUSH */
};

static uint32_t handle_number(const struct fuse_file_info *fi)
{
	return (uint32_t)(fi->fh >> 32) & 0x7fffffffu;
}

/* fs.lock held: fs.closing's entry of handle hid, or -1. */
static int closing_find(uint32_t hid)
{
	for (unsigned i = 0; i < fs.nclosing; i++)
		if (fs.closing[i].hid == hid)
			return (int)i;
	return -1;
}

/* A close of writable handle hid: counted until its release is over
 * (fs_closes_pending).  Without memory for it, not counted. */
static void closing_add(uint32_t hid)
{
	int i;

	fs_lock();
	i = closing_find(hid);
	if (i < 0 && fs.nclosing == fs.closing_cap) {
		unsigned cap = fs.closing_cap ? 2 * fs.closing_cap : 16;
		struct fs_closing *c = realloc(fs.closing, cap * sizeof(*c));

		if (c) {
			fs.closing = c;
			fs.closing_cap = cap;
		}
	}
	if (i < 0 && fs.nclosing < fs.closing_cap) {
		i = (int)fs.nclosing++;
		fs.closing[i].hid = hid;
	}
	if (i >= 0)
		fs.closing[i].at = tier_now();
	fs_unlock();
}

/* fs.lock held: handle hid's release is over. */
static void closing_del(uint32_t hid)
{
	int i = closing_find(hid);

	if (i >= 0)
		fs.closing[i] = fs.closing[--fs.nclosing];
}

unsigned fs_closes_pending(void)
{
	double now = tier_now();
	unsigned n = 0;

	for (unsigned i = 0; i < fs.nclosing; i++)
		n += now - fs.closing[i].at < FS_CLOSE_GRACE;
	return n;
}

static int open_common(struct fs_inode *in, struct fuse_file_info *fi)
{
	static uint32_t next_hid;

	fs_lock();
	if (in->fd_gone) {
		/* removed, closed and let go (an O_PATH descriptor reopened
		 * through /proc): nothing is left to open */
		fs_unlock();
		return -ENOENT;
	}
	in->nopen++;
	fs_unlock();
	if (writable(fi->flags))
		tfile_open_writer(&in->tf);
	fi->fh = FS_FH_FLAGS | (uint32_t)fi->flags |	/* for fs_ll_ioctl */
		 (uint64_t)(__atomic_add_fetch(&next_hid, 1, __ATOMIC_RELAXED) & 0x7fffffffu) << 32;
	/* no kernel page cache across opens: reads reach tierfs, which counts
	 * them, consumes restore hints, and is the cache */
	fi->keep_cache = 0;
	/*
	 * A reader's close() needs no FLUSH round trip: fs_ll_flush answers
	 * 0 to every read-only handle, and locks are the kernel's (tierfs
	 * has no lock operations).  One request less per restore.
	 */
	if ((fi->flags & O_ACCMODE) == O_RDONLY)
		fi->noflush = 1;
	/*
	 * Write-only handles bypass the page cache: the data goes from the
	 * writer's buffer to tierfs in one copy, without the page-cache copy
	 * and its dirty-page throttling.  Nothing can mmap a write-only fd.
	 * Other handles do too when the kernel still mmaps such files
	 * (fs.dio_mmap, see fs_loop.c): a read is then one copy from the
	 * cache into the reader's buffer.  no_direct_writes puts every
	 * writable handle in the page cache (with -o writeback: small
	 * write()s reach tierfs coalesced, and none bypasses the kernel's own
	 * modification time); no_direct_reads the read-only ones.
	 */
	bool dreads = fs.dio_mmap && fs.opts.direct_reads;

	switch (fi->flags & O_ACCMODE) {
	case O_RDONLY:
		fi->direct_io = dreads;
		break;
	case O_WRONLY:
		fi->direct_io = fs.opts.direct_writes;
		break;
	default:
		fi->direct_io = fs.opts.direct_writes && dreads;
	}
	return 0;
}

void fs_ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	int ret;

	if (!S_ISREG(in->type)) {
		fuse_reply_err(req, S_ISDIR(in->type) ? EISDIR : ENXIO);
		return;
	}
	ret = open_common(in, fi);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	if (fi->flags & O_TRUNC) {
		ret = tfile_truncate(&in->tf, 0);
		if (ret) {
			if (writable(fi->flags))
				tfile_close_writer(&in->tf);
			fs_lock();
			in->nopen--;
			fs_unlock();
			fuse_reply_err(req, -ret);
			return;
		}
	}
	if (fuse_reply_open(req, fi) == -ENOENT) {
		if (writable(fi->flags))
			tfile_close_writer(&in->tf);
		fs_lock();
		in->nopen--;
		fs_maybe_free(in);
		fs_unlock();
	}
}

void fs_ll_create(fuse_req_t req, fuse_ino_t parent, const char *name,
			 mode_t mode, struct fuse_file_info *fi)
{
	struct fs_inode *p = fs_inode_of(parent), *in;
	struct fuse_entry_param e;
	int fd, ret = fs_check_new_name(name);
	bool held = false;

	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	fd = fs_ns_create(p, name, fi->flags, mode, &held);
	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	close(fd);
	fs_own_new(p, name, req);
	ret = fs_lookup(p, name, &e);
	in = ret ? NULL : fs_inode_of(e.ino);
	fs_ns_made(in, p, name, held);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	if (!S_ISREG(in->type)) {
		fs_forget_one(e.ino, 1);
		fuse_reply_err(req, EISDIR);
		return;
	}
	ret = open_common(in, fi);
	if (ret) {
		fs_forget_one(e.ino, 1);
		fuse_reply_err(req, -ret);
		return;
	}
	if (fi->flags & O_TRUNC)
		tfile_truncate(&in->tf, 0);
	if (fuse_reply_create(req, &e, fi) == -ENOENT) {
		if (writable(fi->flags))
			tfile_close_writer(&in->tf);
		fs_lock();
		in->nopen--;
		fs_unlock();
		fs_forget_one(e.ino, 1);
	}
}

void fs_ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	const void *p;
	struct copy *pin;
	size_t n;
	ssize_t ret;

	(void)fi;
	__atomic_store_n(&in->read_since_atime, 1, __ATOMIC_RELEASE);
	if (tfile_read_begin(&in->tf, size, off, &p, &n, &pin)) {
		/* once the reply is out, the reader may close the file and the
		 * kernel forget it: our reference keeps it until read_end */
		fs_inode_get(in);
		fuse_reply_buf(req, p, n);
		tfile_read_end(&in->tf, pin);
		fs_inode_put(in);
		return;
	}
	void *buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ret = tfile_read(&in->tf, buf, size, off);
	if (ret < 0)
		fuse_reply_err(req, (int)-ret);
	else
		fuse_reply_buf(req, buf, (size_t)ret);
	free(buf);
}

void fs_ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
			size_t size, off_t off, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	ssize_t ret;

	(void)fi;
	ret = tfile_write(&in->tf, buf, size, off);
	if (ret == -ENOSPC && fs_fd_frees_wait())	/* space a removal frees */
		ret = tfile_write(&in->tf, buf, size, off);
	if (ret < 0)
		fuse_reply_err(req, (int)-ret);
	else
		fuse_reply_write(req, (size_t)ret);
}

/*
 * close(): a flush of the file that already failed is reported to a
 * descriptor opened for writing (its data is what did not reach the
 * SSD), never to a reader, whose data was right (cat, md5sum).  fsync
 * reports it to every descriptor.  FLUSH carries no open flags: they are
 * in fh (open_common).
 */
void fs_ll_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	bool wrote = (fi->fh & FS_FH_FLAGS) && writable((int)(uint32_t)fi->fh);

	if (wrote)
		closing_add(handle_number(fi));	/* its release follows */
	fuse_reply_err(req, S_ISREG(in->type) && wrote ? -tfile_pending_error(&in->tf) : 0);
}

/*
 * Access time.  FUSE leaves it to the daemon (the kernel marks FUSE inodes
 * S_NOATIME), and reads served from the cache never touch the backing
 * file, so tierfs sets it: when a handle that could read is released after
 * a read of the file (the kernel sends RELEASE in the background, so
 * close() does not wait for this; a handle that only wrote must not move
 * the access time, nor undo a utimensat(2) made after its close but before
 * its RELEASE arrived), following the mount's option: noatime never;
 * strictatime always;
 * relatime (the default) when the access time is not newer than the
 * modification time, or is a day old.  (The ctime test of the kernel's
 * relatime is left out: setting the time moves the backing file's ctime.)
 */
static void touch_atime(struct fs_inode *in)
{
	struct timespec now, mt, cmt, tv[2] = { { 0, UTIME_NOW }, { 0, UTIME_OMIT } };
	char path[64];
	uint64_t size;
	struct stat st;

	if (fs.opts.atime == FS_NOATIME ||
	    !__atomic_exchange_n(&in->read_since_atime, 0, __ATOMIC_ACQ_REL))
		return;
	/* not while a new version copies the attributes (v_commit): the
	 * time would land on the version being replaced */
	fs_attrs_lock(in);
	fs_fd_hold(in);
	if (fstatat(in->fd, "", &st, AT_EMPTY_PATH) == 0) {
		clock_gettime(CLOCK_REALTIME, &now);
		mt = st.st_mtim;	/* a dirty file's cached mtime is newer */
		if (S_ISREG(in->type) && tfile_attr(&in->tf, &size, &cmt) &&
		    (cmt.tv_sec > mt.tv_sec ||
		     (cmt.tv_sec == mt.tv_sec && cmt.tv_nsec > mt.tv_nsec)))
			mt = cmt;
		if (fs.opts.atime == FS_STRICTATIME ||
		    st.st_atim.tv_sec < mt.tv_sec ||
		    (st.st_atim.tv_sec == mt.tv_sec && st.st_atim.tv_nsec <= mt.tv_nsec) ||
		    now.tv_sec - st.st_atim.tv_sec >= 24 * 3600) {
			fs_proc_path(in->fd, path, sizeof(path));
			utimensat(AT_FDCWD, path, tv, 0);
		}
	}
	fs_fd_release(in);
	fs_attrs_unlock(in);
}

void fs_ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	bool last, gone;

	fuse_reply_err(req, 0);		/* nothing below can fail */
	if ((fi->flags & O_ACCMODE) != O_WRONLY)
		touch_atime(in);
	if (writable(fi->flags)) {
		tierfs_delay("release");	/* a test hook for races */
		tfile_close_writer(&in->tf);
	}
	if (writable(fi->flags))
		fs_ns_closed(in);	/* made and closed empty: its reader's */
	fs_lock();
	if (writable(fi->flags))	/* the version its close made due is
					 * queued (fs_closes_pending) */
		closing_del(handle_number(fi));
	in->nopen--;
	last = !in->nopen;
	gone = last && in->unlinked;
	if (last)
		fs_inode_get(in);	/* for the closes below, without fs.lock */
	if (gone) {
		/* a removed file's space comes back now (or at the end of
		 * the last request or engine transfer using it): gone under
		 * fs.lock, against a reopen (open_common); closed by the
		 * release below, without fs.lock */
		fs_fd_hold(in);
		fs_fd_gone(in);
	}
	fs_unlock();
	if (gone)
		tfile_orphaned(&in->tf);	/* its cache room comes back now */
	if (last) {
		/* a reader done with it (the last close after a read, or the
		 * munmap of a mapping): a queued file is consumed */
		tfile_last_close(&in->tf);
		if (gone)
			fs_fd_release(in);
		else
			fs_data_fd_drop(in);
		fs_inode_put(in);
	}
}

void fs_ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
			struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);

	int ret;

	(void)datasync;
	(void)fi;
	ret = tfile_fsync(&in->tf);
	if (ret == -ENOSPC && fs_fd_frees_wait())	/* space a removal frees */
		ret = tfile_fsync(&in->tf);
	fuse_reply_err(req, -ret);
}

void fs_ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
			    off_t len, struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	uint64_t size, end = (uint64_t)off + (uint64_t)len;
	struct timespec mt;
	int ret = 0;

	(void)fi;
	if (off < 0 || len <= 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	tfile_attr(&in->tf, &size, &mt);
	if (mode == 0) {
		if (end > size)
			ret = tfile_truncate(&in->tf, end);
	} else if (mode == FALLOC_FL_KEEP_SIZE) {
		ret = 0;		/* space is the cache's business */
	} else if (mode == (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) ||
		   mode == FALLOC_FL_ZERO_RANGE ||
		   mode == (FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE)) {
		/* zeros inside the file (holes once flushed); past its end a
		 * zero range grows it, whose new bytes are zeros already */
		if (!(mode & FALLOC_FL_KEEP_SIZE) && end > size)
			ret = tfile_truncate(&in->tf, end);
		if (!ret && (uint64_t)off < size)
			ret = tfile_zero(&in->tf, (uint64_t)off,
					 (end < size ? end : size) - (uint64_t)off);
	} else {
		ret = -EOPNOTSUPP;
	}
	fuse_reply_err(req, -ret);
}

/* SEEK_DATA / SEEK_HOLE (the kernel answers the other whences itself). */
void fs_ll_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		 struct fuse_file_info *fi)
{
	struct fs_inode *in = fs_inode_of(ino);
	off_t ret;

	(void)fi;
	ret = tfile_seek(&in->tf, off, whence);
	if (ret < 0)
		fuse_reply_err(req, (int)-ret);
	else
		fuse_reply_lseek(req, ret);
}

/*
 * Tell the kernel that the GPU wrote [off, off + n) of ino behind its back,
 * the range's last byte from device address last_src (a vectored write passes
 * the union of its ranges): drop its cached pages of the range and its
 * cached attributes, and when the write grew the file past `before` (the
 * size before it) grow the kernel's size too.  Without the writeback cache
 * (the default) the kernel takes the size from the next getattr once its
 * attributes are dropped.  With it (-o writeback) the kernel keeps a
 * regular file's size itself and never takes the daemon's; storing the
 * file's new last byte into its page cache moves it (forward only; an
 * empty store does not).  The notifications are done when they return, so
 * before the reply.
 */
void fs_kernel_written(fuse_ino_t ino, uint64_t last_src, uint64_t off,
		       uint64_t n, uint64_t before)
{
	struct fuse_bufvec last = FUSE_BUFVEC_INIT(1);
	uint8_t byte;
	int ret;

	if (fs.opts.writeback && off + n > before) {
		ret = gpu_tier_read_dev(&byte, last_src, 1);
		if (!ret) {
			last.buf[0].mem = &byte;
			ret = fuse_lowlevel_notify_store(fs.se, ino,
							 (off_t)(off + n - 1),
							 &last, 0);
		}
		if (ret && ret != -ENOENT)
			tlog(LOG_WARNING, "gpu ioctl: cannot tell the kernel the "
			     "new size: %s", strerror(-ret));
	}
	ret = fuse_lowlevel_notify_inval_inode(fs.se, ino, (off_t)off,
					       (off_t)n);
	if (ret && ret != -ENOENT)
		tlog(LOG_WARNING, "gpu ioctl: cannot drop the kernel's cached "
		     "pages: %s", strerror(-ret));
}
