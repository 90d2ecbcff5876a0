/*
 * fs_xattr.c - extended attributes: user.* attributes pass through to the
 * backing directory; user.tierfs.* is tierfs's own protocol (fs/tierfs.h):
 * read-only reports (tier, state, stats) and the restore hints.
 *
 * tierfs attributes are never listed, so tools that copy every attribute
 * (cp -a, rsync -X) don't try to set them elsewhere.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "fs.h"
#include "fs_hints.h"
#include "fs_persist.h"
#include "fs_sets.h"
#include "tierfs.h"
#include "../common/json.h"

static bool tierfs_name(const char *name)
{
	return strncmp(name, TIERFS_XATTR_PREFIX, sizeof(TIERFS_XATTR_PREFIX) - 1) == 0;
}

static void reply_value(fuse_req_t req, const char *val, size_t len, size_t size)
{
	if (size == 0)
		fuse_reply_xattr(req, len);
	else if (len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, val, len);
}

/*
 * user.tierfs.shared: the bytes of in's backing file whose extents are
 * shared (FIEMAP_EXTENT_SHARED: a reflink, -o dedup) and the backing
 * file's size.  What is not flushed yet is not in the backing file; a file
 * system without FIEMAP shares nothing.
 */
static int shared_get(struct fs_inode *in, char *buf, size_t len)
{
	enum { N = 128 };
	struct fiemap *fm = calloc(1, sizeof(*fm) + N * sizeof(struct fiemap_extent));
	uint64_t shared = 0, start = 0;
	struct stat st;
	bool last = false;
	int fd, ret = 0;

	if (!fm)
		return -ENOMEM;
	char proc[64];

	fd = fs_fd_hold(in);	/* may be O_PATH: FIEMAP needs an open file */
	if (fd >= 0) {
		fs_proc_path(fd, proc, sizeof(proc));
		fd = open(proc, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			fd = -errno;
	}
	fs_fd_release(in);
	if (fd < 0 || fstat(fd, &st) < 0) {
		ret = fd < 0 ? fd : -errno;
		if (fd >= 0)
			close(fd);
		free(fm);
		return ret;
	}
	while (!last && start < (uint64_t)st.st_size) {
		memset(fm, 0, sizeof(*fm));
		fm->fm_start = start;
		fm->fm_length = (uint64_t)st.st_size - start;
		fm->fm_extent_count = N;
		if (ioctl(fd, FS_IOC_FIEMAP, fm) < 0 || fm->fm_mapped_extents == 0)
			break;	/* EOPNOTSUPP (tmpfs), or nothing mapped past start */
		for (unsigned i = 0; i < fm->fm_mapped_extents; i++) {
			struct fiemap_extent *x = &fm->fm_extents[i];
			uint64_t lo = x->fe_logical, hi = lo + x->fe_length;

			if (hi > (uint64_t)st.st_size)
				hi = (uint64_t)st.st_size;
			if (lo < start)
				lo = start;
			if ((x->fe_flags & FIEMAP_EXTENT_SHARED) && hi > lo)
				shared += hi - lo;
			if (x->fe_flags & FIEMAP_EXTENT_LAST)
				last = true;
			if (x->fe_logical + x->fe_length > start)
				start = x->fe_logical + x->fe_length;
		}
	}
	close(fd);
	free(fm);
	ret = snprintf(buf, len, "%" PRIu64 " %" PRIu64, shared, (uint64_t)st.st_size);
	return ret >= (int)len ? -ERANGE : ret;
}

/* Value of a read-only tierfs attribute into buf; length or -errno. */
static int tierfs_get(struct fs_inode *in, const char *name, char *buf, size_t len)
{
	char tier[256], state[512];
	int ret;

	if (strcmp(name, TIERFS_XATTR_STATS) == 0) {
		struct json j;

		if (in != &fs.root)
			return -ENODATA;
		json_init(&j, buf, len);
		json_obj(&j, NULL);
		engine_stats_put(fs.eng, &j);
		fs_lock();
		json_u64(&j, "closes_pending", fs_closes_pending());
		fs_unlock();
		fs_journal_stats_put(&j);
		fs_persist_stats_put(&j);
		json_close(&j);
		return json_end(&j);
	}
	if (fs_persist_xattr(name))
		return fs_persist_getx(in, buf, len);
	if (fs_sets_xattr(name))
		return fs_sets_getx(in, name, buf, len);
	if (strcmp(name, TIERFS_XATTR_SHARED) == 0)
		return S_ISREG(in->type) ? shared_get(in, buf, len) : -ENODATA;
	if (strcmp(name, TIERFS_XATTR_TIER) == 0 || strcmp(name, TIERFS_XATTR_STATE) == 0) {
		if (!S_ISREG(in->type))
			return -ENODATA;
		ret = tfile_describe(&in->tf, tier, sizeof(tier), state, sizeof(state));
		if (ret)
			return ret;
		fs_persist_describe(in, tier, sizeof(tier), state, sizeof(state));
		ret = snprintf(buf, len, "%s", name[12] == 't' ? tier : state);
		return ret >= (int)len ? -ERANGE : ret;
	}
	return fs_hints_get(in, name, buf, len);
}

void fs_ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct fs_inode *in = fs_inode_of(ino);
	char path[64];
	ssize_t n;

	if (tierfs_name(name)) {
		char *buf = malloc(1 << 20);
		int ret;

		if (!buf) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		ret = tierfs_get(in, name, buf, 1 << 20);
		if (ret < 0)
			fuse_reply_err(req, -ret);
		else
			reply_value(req, buf, (size_t)ret, size);
		free(buf);
		return;
	}
	if (S_ISLNK(in->type)) {
		fuse_reply_err(req, ENODATA);
		return;
	}
	/* the held descriptor, not in->fd: a commit may swap in->fd */
	fs_proc_path(fs_fd_hold(in), path, sizeof(path));
	if (size == 0) {
		n = getxattr(path, name, NULL, 0);
		fs_fd_release(in);
		if (n < 0)
			fuse_reply_err(req, errno);
		else
			fuse_reply_xattr(req, (size_t)n);
		return;
	}
	char *val = malloc(size);
	if (!val) {
		fs_fd_release(in);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	n = getxattr(path, name, val, size);
	fs_fd_release(in);
	if (n < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_buf(req, val, (size_t)n);
	free(val);
}

void fs_ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		    const char *value, size_t size, int flags)
{
	struct fs_inode *in = fs_inode_of(ino);
	char path[64];
	int ret = 0;

	if (fs_persist_xattr(name)) {
		fuse_reply_err(req, -fs_persist_setx(in, value, size));
		return;
	}
	if (fs_sets_xattr(name)) {
		fuse_reply_err(req, -fs_sets_setx(in, name, value, size));
		return;
	}
	if (tierfs_name(name)) {
		fuse_reply_err(req, -fs_hints_set(in, name, value, size, flags,
						  fuse_req_ctx(req)->uid));
		return;
	}
	if (S_ISLNK(in->type)) {
		fuse_reply_err(req, EPERM);
		return;
	}
	fs_attrs_lock(in);	/* not while a new version is committed */
	ret = fs_fd_hold(in);		/* reopened if the budget closed it */
	if (ret >= 0)
		fs_proc_path(ret, path, sizeof(path));
	if (ret >= 0)
		ret = setxattr(path, name, value, size, flags) < 0 ? -errno : 0;
	if (!ret) {
		fs_privs_changed(in);
		fs_attrs_changed(in);
	}
	fs_fd_release(in);
	fs_attrs_unlock(in);
	fuse_reply_err(req, -ret);
}

void fs_ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct fs_inode *in = fs_inode_of(ino);
	char path[64];
	ssize_t n;
	char *buf, *p, *q;

	if (S_ISLNK(in->type)) {
		reply_value(req, "", 0, size);
		return;
	}
	fs_proc_path(fs_fd_hold(in), path, sizeof(path));	/* not in->fd: see above */
	n = listxattr(path, NULL, 0);
	buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
	if (n < 0 || !buf) {
		int err = n < 0 ? errno : ENOMEM;

		fs_fd_release(in);
		fuse_reply_err(req, err);
		return;
	}
	n = listxattr(path, buf, (size_t)n);
	fs_fd_release(in);
	if (n < 0) {
		fuse_reply_err(req, errno);
		free(buf);
		return;
	}
	/* drop tierfs names in place */
	for (p = q = buf; p < buf + n; p += strlen(p) + 1) {
		size_t l = strlen(p) + 1;

		if (tierfs_name(p))
			continue;
		memmove(q, p, l);
		q += l;
	}
	reply_value(req, buf, (size_t)(q - buf), size);
	free(buf);
}

void fs_ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct fs_inode *in = fs_inode_of(ino);
	char path[64];
	int ret = 0;

	if (fs_persist_xattr(name)) {
		fuse_reply_err(req, -fs_persist_removex(in));
		return;
	}
	if (fs_sets_xattr(name)) {
		fuse_reply_err(req, -fs_sets_removex(in, name));
		return;
	}
	if (tierfs_name(name)) {
		fuse_reply_err(req, -fs_hints_remove(in, name));
		return;
	}
	if (S_ISLNK(in->type)) {
		fuse_reply_err(req, ENODATA);
		return;
	}
	fs_attrs_lock(in);	/* not while a new version is committed */
	ret = fs_fd_hold(in);		/* reopened if the budget closed it */
	if (ret >= 0)
		fs_proc_path(ret, path, sizeof(path));
	if (ret >= 0)
		ret = removexattr(path, name) < 0 ? -errno : 0;
	if (!ret)
		fs_attrs_changed(in);
	fs_fd_release(in);
	fs_attrs_unlock(in);
	fuse_reply_err(req, -ret);
}
