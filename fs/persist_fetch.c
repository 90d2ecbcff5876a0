/*
 * persist_fetch.c - what DIR has and the backing directory lacks: a
 * lookup's miss fetched from DIR (fs_persist_fetch(), which the inode
 * table calls through fs.inode_ops), a listing's entries merged with DIR's
 * (fs_persist_snapshot(), fs_persist_readdir()), and rmdir's check that
 * DIR's directory is empty too.  Each runs in the pool (persist_pool.c).
 *
 * Calls: persist_pool.c, persist_queue.c (whiteouts, refused paths),
 * persist_path.c.  Locks: a fetched name is renamed into place under
 * fs.nslock, after its whiteout check (pq.lock); pq.lock for the
 * statistics.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "persist_int.h"
#include "../common/fault.h"
#include "../common/log.h"

/* ------------------------------------------------------------ restart */

/* Copy DIR's file (src, stat st) into the backing directory dfd as name. */
static int fetch_file(int src, const struct stat *st, struct fs_inode *dir, const char *name,
		      const char *rel, struct pjob *j)
{
	static unsigned long counter;
	char tmp[64];
	int wfd, pfd, ret;

	snprintf(tmp, sizeof(tmp), PFETCH_PREFIX "%lu.%lu", (unsigned long)getpid(),
		 __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	wfd = openat(fs.root_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (wfd < 0)
		return -errno;
	ret = persist_copy_data(src, wfd, (uint64_t)st->st_size, 0, &j->cancel, &j->alive);
	if (!ret)
		persist_copy_xattrs(src, wfd);
	if (!ret && fsetxattr(wfd, TIERFS_XATTR_PERSIST, "1", 1, 0) < 0 && errno != ENOTSUP)
		ret = -errno;
	if (!ret)
		persist_give_attrs(wfd, st, "a fetched file");
	if (!ret && fdatasync(wfd) < 0)
		ret = -errno;
	if (close(wfd) < 0 && !ret)
		ret = -errno;
	if (ret) {
		unlinkat(fs.root_fd, tmp, 0);
		return ret;
	}
	/* under fs.nslock: no removal through the mount slips in between
	 * its whiteout check and the rename */
	fs_ns_lock();
	pfd = fs_fd_hold(dir);
	if (pfd < 0)
		ret = pfd;
	else if (persist_whiteout_locked(rel))
		ret = -ENOENT;
	else if (__atomic_load_n(&j->cancel, __ATOMIC_RELAXED))
		ret = -ECANCELED;	/* the lookup said "absent" meanwhile */
	else if (renameat2(fs.root_fd, tmp, pfd, name, RENAME_NOREPLACE) < 0)
		ret = errno == EEXIST ? 0 : -errno;	/* EEXIST: someone was first */
	else
		tmp[0] = 0;
	fs_fd_release(dir);
	fs_ns_unlock();
	if (tmp[0])
		unlinkat(fs.root_fd, tmp, 0);
	if (!ret) {
		pq_lock();
		pq.fetched_files++;
		pq.fetched_bytes += (uint64_t)st->st_size;
		pq_unlock();
		tlog(LOG_INFO, "persist: fetched %s from %s", rel, pq.dir);
	}
	return ret;
}

static int fetch_dir(const struct stat *st, struct fs_inode *dir, const char *name,
		     const char *rel)
{
	int pfd, ret = 0;

	fs_ns_lock();
	pfd = fs_fd_hold(dir);
	if (pfd < 0)
		ret = pfd;
	else if (persist_whiteout_locked(rel))
		ret = -ENOENT;
	else if (mkdirat(pfd, name, 0700) < 0)
		ret = errno == EEXIST ? 0 : -errno;
	else {
		int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

		if (fd >= 0) {
			fsetxattr(fd, TIERFS_XATTR_PERSIST, "1", 1, 0);
			persist_give_attrs(fd, st, "a fetched directory");
			close(fd);
		}
	}
	fs_fd_release(dir);
	fs_ns_unlock();
	return ret;
}

static int job_fetch(struct pjob *j)
{
	struct stat st;
	const char *b;
	int root, src, d, ret;

	root = persist_open_dir_root();
	if (root < 0)
		return -ENOENT;
	/* nothing but a directory or a regular file is opened (a device or
	 * a FIFO that a user put in DIR, a link anywhere on the way) */
	d = persist_walk_beneath(root, j->rel, true, &b, NULL, NULL);
	close(root);
	if (d < 0)
		ret = d;
	else if (fstatat(d, b, &st, AT_SYMLINK_NOFOLLOW) < 0)
		ret = -ENOENT;	/* not in DIR (st is not filled: not looked at) */
	else if (S_ISLNK(st.st_mode))
		ret = -ELOOP;
	else
		ret = S_ISDIR(st.st_mode) || S_ISREG(st.st_mode) ? 0 : -ENOENT;
	if (ret) {
		if (d >= 0)
			close(d);
		if (ret == -ELOOP || ret == -ENOTDIR)
			persist_refused(j->rel, ret);
		return -ENOENT;
	}
	src = backing_open(d, b, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
	close(d);
	if (src < 0)
		return -ENOENT;
	if (fstat(src, &st) < 0)
		ret = -errno;
	else if (S_ISDIR(st.st_mode))
		ret = fetch_dir(&st, j->in, j->name, j->rel);
	else if (S_ISREG(st.st_mode))
		ret = fetch_file(src, &st, j->in, j->name, j->rel, j);
	else
		ret = -ENOENT;
	close(src);
	if (ret && ret != -ENOENT && ret != -ECANCELED)
		tlog(LOG_WARNING, "persist: cannot fetch %s from %s: %s", j->rel, pq.dir,
		     strerror(-ret));
	return ret;
}

/* A lookup found no dir/name in the backing directory: bring it from DIR
 * (0: it is there now; -ENOENT: DIR has none either, or it was removed
 * through the mount).  fs.nslock not held. */
int fs_persist_fetch(struct fs_inode *dir, const char *name)
{
	char drel[PATH_MAX];
	struct pjob *j;
	int ret = -ENOENT;

	if (!pq.dir || fs_hidden_name(name) || strlen(name) > NAME_MAX ||
	    persist_rel_of(dir, drel, sizeof(drel)))
		return -ENOENT;
	j = persist_pjob_new(job_fetch);
	if (!j)
		return -ENOENT;
	snprintf(j->name, sizeof(j->name), "%s", name);
	if (persist_join(j->rel, sizeof(j->rel), drel, name) || persist_whiteout_locked(j->rel)) {
		persist_pjob_put(j);
		return -ENOENT;
	}
	fs_inode_get(dir);
	j->in = dir;
	if (persist_pg_run(j, "a lookup") && j->ret == 0)
		ret = 0;
	persist_pjob_put(j);
	return ret;
}

static int snap_add(struct fs_psnap *s, const char *name, unsigned char type, ino_t ino)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 64;
		struct pent *e = realloc(s->e, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		s->e = e;
		s->cap = cap;
	}
	if (!(s->e[s->n].name = strdup(name)))
		return -ENOMEM;
	s->e[s->n].type = type;
	s->e[s->n].ino = ino;
	s->n++;
	return 0;
}

/* DIR's directory rel, open as a stream, or NULL */
static DIR *open_pdir(const char *rel)
{
	int root = persist_open_dir_root(), fd;
	DIR *d;

	if (root < 0)
		return NULL;
	fd = persist_walk_beneath(root, rel, false, NULL, NULL, NULL);
	close(root);
	if (fd < 0)
		return NULL;
	d = fdopendir(fd);
	if (!d)
		close(fd);
	return d;
}

/* Add DIR's entries of rel that local (a directory fd) lacks; count them. */
static long add_extras(struct fs_psnap *s, const char *rel, int local)
{
	char crel[PATH_MAX];
	struct dirent *de;
	struct stat st;
	long n = 0;
	DIR *d = open_pdir(rel);

	if (!d)
		return 0;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fs_hidden_name(de->d_name))
			continue;
		if (fstatat(local, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
			continue;
		tierfs_delay("persist_extras");	/* a test hook for races */
		if (persist_join(crel, sizeof(crel), rel, de->d_name) ||
		    persist_whiteout_locked(crel))
			continue;
		/* the persister removes a queued removal or rename after it
		 * has made it in DIR: one that was queued when readdir saw the
		 * name and is gone now has taken the name away there */
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (de->d_type != DT_DIR && de->d_type != DT_REG && de->d_type != DT_UNKNOWN)
			continue;	/* only files and directories are fetched */
		if (s && snap_add(s, de->d_name, de->d_type, de->d_ino))
			break;
		n++;
	}
	closedir(d);
	return n;
}

static int job_extras(struct pjob *j)
{
	if (!j->snap && !(j->snap = calloc(1, sizeof(*j->snap))))
		return -ENOMEM;
	j->n = add_extras(j->snap, j->rel, j->fd);
	return 0;
}

struct fs_psnap *fs_persist_snapshot(struct fs_inode *in, DIR *dp)
{
	struct fs_psnap *s = NULL, *x;
	struct dirent *de;
	struct pjob *j;

	if (!pq.dir || !(j = persist_pjob_new(job_extras)))
		return NULL;
	if (persist_rel_of(in, j->rel, sizeof(j->rel)) ||
	    (j->fd = fcntl(dirfd(dp), F_DUPFD_CLOEXEC, 0)) < 0 ||
	    !persist_pg_run(j, "a listing") || j->ret || j->n == 0 ||
	    !(s = calloc(1, sizeof(*s)))) {
		persist_pjob_put(j);
		return s;
	}
	rewinddir(dp);
	while ((de = readdir(dp)))	/* local entries: the numbers a stat shows */
		if (!fs_hidden_name(de->d_name) &&
		    snap_add(s, de->d_name, de->d_type,
			     fs_dirent_ino(in, dirfd(dp), de->d_name, de->d_ino, de->d_type)))
			break;
	x = j->snap;
	for (size_t i = 0; i < x->n; i++)
		if (snap_add(s, x->e[i].name, x->e[i].type, x->e[i].ino))
			break;
	persist_pjob_put(j);
	return s;
}

size_t fs_persist_readdir(void *req, struct fs_psnap *s, char *buf, size_t size, off_t off)
{
	size_t used = 0;

	for (size_t i = (size_t)off; i < s->n; i++) {
		struct stat st = { .st_ino = s->e[i].ino ? s->e[i].ino : 1,
				   .st_mode = (mode_t)s->e[i].type << 12 };
		size_t n = fuse_add_direntry(req, buf + used, size - used, s->e[i].name, &st,
					     (off_t)i + 1);

		if (n > size - used)
			break;
		used += n;
	}
	return used;
}

static int job_count(struct pjob *j)
{
	j->n = add_extras(NULL, j->rel, j->fd);
	return 0;
}

int fs_persist_may_rmdir(struct fs_inode *dir, const char *name)
{
	char drel[PATH_MAX];
	struct pjob *j;
	int pfd, ret = 0;

	if (!pq.dir || persist_rel_of(dir, drel, sizeof(drel)) ||
	    !(j = persist_pjob_new(job_count)))
		return 0;
	if (persist_join(j->rel, sizeof(j->rel), drel, name)) {
		persist_pjob_put(j);
		return 0;
	}
	pfd = fs_fd_hold(dir);
	j->fd = pfd < 0 ? -1 : openat(pfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fs_fd_release(dir);
	if (j->fd >= 0 && persist_pg_run(j, "rmdir's check") && j->n)
		ret = -ENOTEMPTY;
	persist_pjob_put(j);
	return ret;
}
