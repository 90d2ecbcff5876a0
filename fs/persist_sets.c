/*
 * persist_sets.c - checkpoint sets in DIR (fs_sets.c has them on the
 * SSD): a set's record written into DIR once all its files are there (the
 * commit point in DIR), read back with DIR's files, judged, and
 * -o persist_keep's pruning of DIR's sets.
 *
 * Calls: persist_pool.c, persist_queue.c (whiteouts), persist_path.c.
 * Locks: pq.lock for the statistics only; the work on DIR runs in the
 * pool with no lock held.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "persist_int.h"
#include "../common/log.h"

/* ------------------------------------------------------------ sets in DIR */

#define RECORD_MAX	(64u << 20)	/* bytes of a record read at most */

/* The record of the set directory sfd (in DIR), malloc'ed and
 * NUL-terminated, or NULL (none, not a regular file, too big). */
static char *record_read(int sfd, size_t *len)
{
	struct stat st;
	char *t = NULL;
	int fd = openat(sfd, FS_SET_RECORD, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size <= RECORD_MAX &&
	    (t = malloc((size_t)st.st_size + 1))) {
		if (pread(fd, t, (size_t)st.st_size, 0) == st.st_size) {
			t[st.st_size] = 0;
			if (len)
				*len = (size_t)st.st_size;
		} else {
			free(t);
			t = NULL;
		}
	}
	close(fd);
	return t;
}

/* Is sfd/name a regular file of size and mtime? */
static bool pfile_there(int sfd, const char *name, uint64_t size, const struct timespec *mt)
{
	struct stat st;

	return !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..") &&
	       fstatat(sfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
	       (uint64_t)st.st_size == size && st.st_mtim.tv_sec == mt->tv_sec &&
	       st.st_mtim.tv_nsec == mt->tv_nsec;
}

/*
 * Judge the set directory sfd of DIR by its record (the lines of
 * fs_sets.c's format that matter here: "committed SEC.NSEC" and "file
 * SIZE SEC.NSEC NAME"): 1 every file named is there as recorded, 0 not,
 * -1 no record (or one that does not parse).  *committed: its time.
 */
static int record_judge(int sfd, struct timespec *committed)
{
	char *t = record_read(sfd, NULL), *p, *nl, *end;
	int ret = 1;

	if (!t)
		return -1;
	memset(committed, 0, sizeof(*committed));
	if (strncmp(t, "tierfs-set 1\n", 13))
		ret = -1;
	for (p = t + 13; ret >= 0 && *p; p = nl + 1) {
		if (!(nl = strchr(p, '\n'))) {
			ret = -1;
			break;
		}
		*nl = 0;
		if (!strncmp(p, "committed ", 10)) {
			committed->tv_sec = strtoll(p + 10, &end, 10);
			committed->tv_nsec = *end == '.' ? strtol(end + 1, NULL, 10) : 0;
		} else if (!strncmp(p, "file ", 5)) {
			struct timespec mt;
			uint64_t size = strtoull(p + 5, &end, 10);

			if (*end != ' ') {
				ret = -1;
				break;
			}
			mt.tv_sec = strtoll(end + 1, &end, 10);
			if (*end != '.') {
				ret = -1;
				break;
			}
			mt.tv_nsec = strtol(end + 1, &end, 10);
			if (*end != ' ') {
				ret = -1;
				break;
			}
			if (!pfile_there(sfd, end + 1, size, &mt))
				ret = 0;
		}
	}
	free(t);
	return ret >= 0 && !committed->tv_sec ? -1 : ret;
}

struct sent {
	char *name;
	struct timespec committed;
};

static int sent_newest_first(const void *a, const void *b)
{
	const struct sent *x = a, *y = b;

	if (x->committed.tv_sec != y->committed.tv_sec)
		return x->committed.tv_sec < y->committed.tv_sec ? 1 : -1;
	if (x->committed.tv_nsec != y->committed.tv_nsec)
		return x->committed.tv_nsec < y->committed.tv_nsec ? 1 : -1;
	return -strcmp(x->name, y->name);
}

/* Remove set directory pfd/name of DIR: its record first (no record: no
 * set), its files, itself.  A subdirectory in it (not the set's) or a copy
 * under way into it keeps it whole.  0 or -errno. */
static int remove_dir_set(int pfd, const char *name)
{
	struct dirent *de;
	int sfd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), ret = 0;
	DIR *d = sfd < 0 ? NULL : fdopendir(sfd);

	if (!d) {
		ret = -errno;
		if (sfd >= 0)
			close(sfd);
		return ret;
	}
	while ((de = readdir(d)))
		if ((de->d_type == DT_DIR && strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) ||
		    !strncmp(de->d_name, PTMP_PREFIX, strlen(PTMP_PREFIX))) {
			closedir(d);
			return -EBUSY;
		}
	if (unlinkat(sfd, FS_SET_RECORD, 0) < 0 && errno != ENOENT)
		ret = -errno;
	rewinddir(d);
	while (!ret && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    unlinkat(sfd, de->d_name, 0) < 0 && errno != ENOENT)
			ret = -errno;
	closedir(d);
	if (!ret && unlinkat(pfd, name, AT_REMOVEDIR) < 0)
		ret = -errno;
	return ret;
}

/*
 * -o persist_keep=N where sets are: DIR's directory pfd (rel: its path,
 * for the log) keeps the N newest sets complete there (by their records:
 * every file as recorded); older complete ones are removed from DIR, not
 * from the backing directory.  Incomplete sets, and directories without a
 * record (a set whose files are still on their way), are never removed:
 * a set goes only once N newer ones are complete in DIR.
 */
static void prune_sets(int pfd, const char *rel)
{
	struct sent *e = NULL;
	size_t n = 0, cap = 0, i;
	struct dirent *de;
	int fd = fcntl(pfd, F_DUPFD_CLOEXEC, 0);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);

	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(d))) {
		struct timespec c;
		int sfd;

		if ((de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) ||
		    fs_hidden_name(de->d_name) || !strcmp(de->d_name, ".") ||
		    !strcmp(de->d_name, ".."))
			continue;
		sfd = openat(pfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sfd < 0)
			continue;
		if (record_judge(sfd, &c) == 1) {
			if (n == cap) {
				struct sent *ne = realloc(e, (cap = cap ? 2 * cap : 16) * sizeof(*e));

				if (!ne) {
					close(sfd);
					break;
				}
				e = ne;
			}
			if ((e[n].name = strdup(de->d_name)))
				e[n++].committed = c;
		}
		close(sfd);
	}
	closedir(d);
	if (n > pq.keep)
		qsort(e, n, sizeof(*e), sent_newest_first);
	for (i = pq.keep; i < n; i++) {
		int ret = remove_dir_set(pfd, e[i].name);

		if (!ret) {
			pq_lock();
			pq.pruned++;
			pq_unlock();
			tlog(LOG_INFO, "persist: persist_keep=%u: removed set %s/%s%s%s", pq.keep,
			     pq.dir, rel, *rel ? "/" : "", e[i].name);
		} else {
			tlog(ret == -EBUSY ? LOG_INFO : LOG_WARNING,
			     "persist: persist_keep: set %s/%s%s%s kept: %s", pq.dir, rel,
			     *rel ? "/" : "", e[i].name, ret == -EBUSY ?
			     "a copy into it is under way, or it has a subdirectory" : strerror(-ret));
		}
	}
	for (i = 0; i < n; i++)
		free(e[i].name);
	free(e);
}

static int job_record_put(struct pjob *j)
{
	static unsigned long counter;
	char tmp[NAME_MAX + 1], host[64] = "";
	const char *b;
	int root, pfd, sfd, wfd, ret = 0;

	root = persist_open_dir_root();
	if (root < 0)
		return root;
	pfd = persist_walk_beneath(root, j->rel, true, &b, NULL, NULL);
	close(root);
	if (pfd < 0)
		return pfd == -ENOENT ? -ESTALE : pfd;
	sfd = openat(pfd, b, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sfd < 0) {
		ret = errno == ENOENT ? -ESTALE : -errno;
		goto out_parent;
	}
	/* the commit point: only once every file of the set is there */
	for (size_t i = 0; i < j->nfiles; i++) {
		if (!pfile_there(sfd, j->files[i].name, j->files[i].size, &j->files[i].mtime)) {
			ret = -ESTALE;
			goto out;
		}
		__atomic_store_n(&j->alive, persist_now_ms(), __ATOMIC_RELAXED);
	}
	gethostname(host, sizeof(host) - 1);
	snprintf(tmp, sizeof(tmp), PTMP_PREFIX "set.%.40s.%lu.%lu", host, (unsigned long)getpid(),
		 __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	wfd = openat(sfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (wfd < 0) {
		ret = -errno;
		goto out;
	}
	if (write(wfd, j->text, j->tlen) != (ssize_t)j->tlen)
		ret = errno ? -errno : -EIO;
	else if (fsync(wfd) < 0)
		ret = -errno;
	if (close(wfd) < 0 && !ret)
		ret = -errno;
	if (!ret && renameat(sfd, tmp, sfd, FS_SET_RECORD) < 0)
		ret = -errno;
	if (ret)
		unlinkat(sfd, tmp, 0);
	else if (fsync(sfd) < 0 && errno != EINVAL)
		ret = -errno;
	if (!ret) {
		tlog(LOG_INFO, "persist: set %s is complete in %s (its record written)", j->rel,
		     pq.dir);
		if (pq.keep) {
			char prel[PATH_MAX];

			snprintf(prel, sizeof(prel), "%.*s", b > j->rel ? (int)(b - j->rel - 1) : 0,
				 j->rel);
			prune_sets(pfd, prel);
		}
	}
out:
	close(sfd);
out_parent:
	close(pfd);
	return ret;
}

int fs_persist_record_put(struct fs_inode *dir, const char *text, size_t len,
			  const struct fs_pfile *files, size_t n)
{
	struct pjob *j;
	int ret = -ENOMEM;

	if (!pq.dir)
		return -EOPNOTSUPP;
	if (!(j = persist_pjob_new(job_record_put)))
		return -ENOMEM;
	if (persist_rel_of(dir, j->rel, sizeof(j->rel)) || !*j->rel) {
		persist_pjob_put(j);
		return -EINVAL;
	}
	/* the job's own copies: it may outlive this call (DIR hung) */
	if (!(j->text = malloc(len + 1)) || !(j->files = calloc(n ? n : 1, sizeof(*files))))
		goto out;
	memcpy(j->text, text, len);
	j->tlen = len;
	for (; j->nfiles < n; j->nfiles++) {
		j->files[j->nfiles] = files[j->nfiles];
		if (!(j->files[j->nfiles].name = strdup(files[j->nfiles].name)))
			goto out;
	}
	ret = persist_pg_run(j, "a set's record") ? j->ret : -ETIMEDOUT;
out:
	persist_pjob_put(j);
	return ret;
}

static int pfile_cmp(const void *a, const void *b)
{
	return strcmp(((const struct fs_pfile *)a)->name, ((const struct fs_pfile *)b)->name);
}

static int job_record_get(struct pjob *j)
{
	struct dirent *de;
	size_t cap = 0;
	int root, sfd, fd;
	DIR *d;

	root = persist_open_dir_root();
	if (root < 0)
		return -ENODATA;
	sfd = persist_walk_beneath(root, j->rel, false, NULL, NULL, NULL);
	close(root);
	if (sfd < 0)
		return -ENODATA;
	j->text = record_read(sfd, &j->tlen);
	fd = j->text ? fcntl(sfd, F_DUPFD_CLOEXEC, 0) : -1;
	d = fd < 0 ? NULL : fdopendir(fd);
	if (!d) {
		if (fd >= 0)
			close(fd);
		close(sfd);
		return -ENODATA;
	}
	while ((de = readdir(d))) {
		struct stat st;
		struct fs_pfile *f;

		if (fs_hidden_name(de->d_name) || (de->d_type != DT_REG && de->d_type != DT_UNKNOWN) ||
		    fstatat(sfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
			continue;
		if (j->nfiles == cap) {
			f = realloc(j->files, (cap = cap ? 2 * cap : 16) * sizeof(*f));
			if (!f)
				break;
			j->files = f;
		}
		f = &j->files[j->nfiles];
		if (!(f->name = strdup(de->d_name)))
			break;
		f->size = (uint64_t)st.st_size;
		f->mtime = st.st_mtim;
		j->nfiles++;
		__atomic_store_n(&j->alive, persist_now_ms(), __ATOMIC_RELAXED);
	}
	closedir(d);
	close(sfd);
	if (j->nfiles)
		qsort(j->files, j->nfiles, sizeof(*j->files), pfile_cmp);
	return 0;
}

int fs_persist_record_get(struct fs_inode *dir, char **text, struct fs_pfile **files,
			  size_t *n)
{
	struct pjob *j;
	int ret = -ENODATA;

	*text = NULL;
	*files = NULL;
	*n = 0;
	if (!pq.dir || !(j = persist_pjob_new(job_record_get)))
		return -ENODATA;
	if (!persist_rel_of(dir, j->rel, sizeof(j->rel)) && *j->rel &&
	    !persist_whiteout_locked(j->rel) &&
	    persist_pg_run(j, "a set's state") && j->ret == 0 && j->text) {
		*text = j->text;
		*files = j->files;
		*n = j->nfiles;
		j->text = NULL;
		j->files = NULL;
		j->nfiles = 0;
		ret = 0;
	}
	persist_pjob_put(j);
	return ret;
}
