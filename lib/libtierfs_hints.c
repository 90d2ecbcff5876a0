/*
 * libtierfs_hints.c - the restore hints and statistics of tierfs-hints(7)
 * as C calls (fs/tierfs.h): tierfs_restore_order(), tierfs_restore_queue(),
 * tierfs_stats(), tierfs_wait_flushed(), and the checkpoint sets'
 * tierfs_commit(), tierfs_latest(), tierfs_wait_set().  Plain extended-attribute calls: no CUDA, no
 * state, thread-safe.
 *
 * Names are checked here as the daemon checks them (fs/fs_hints.c), so a
 * bad one is found, and named, before anything is sent, also when a long
 * list goes in several writes (the kernel takes at most 64 KiB a value).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include "tierfs.h"
#include "tierfs_names.h"

#define TIERFS_EXPORT __attribute__((visibility("default")))

#define VALUE_MAX	(64 * 1024)	/* the kernel's limit on one value */

/* A name the daemon accepts, and, if it exists in dirfd, a regular file. */
static bool name_ok(int dirfd, const char *name)
{
	size_t len = name ? strlen(name) : 0;
	struct stat st;

	/* the daemon's rule; a newline would split the line, an empty
	 * name would be skipped */
	if (len == 0 || strchr(name, '\n') || tierfs_hint_name_check(name, len))
		return false;
	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
		return false;
	return true;
}

static int open_tierfs(const char *path, int flags)
{
	int fd = open(path, flags | O_RDONLY | O_CLOEXEC), r;

	if (fd < 0)
		return -1;
	r = tierfs_is_tierfs(fd);
	if (r == 1)
		return fd;
	close(fd);
	if (r == 0)
		errno = ENOTSUP;
	return -1;
}

TIERFS_EXPORT int tierfs_restore_order(const char *dir, const char *const *names,
				       size_t n, size_t *bad)
{
	char *buf;
	size_t i, len = 0;
	int fd, ret = 0, err = 0;

	if (n == 0 || !names) {
		errno = EINVAL;
		return -1;
	}
	fd = open_tierfs(dir, O_DIRECTORY);
	if (fd < 0)
		return -1;
	for (i = 0; i < n; i++) {
		if (!name_ok(fd, names[i])) {
			if (bad)
				*bad = i;
			close(fd);
			errno = EINVAL;
			return -1;
		}
	}
	buf = malloc(VALUE_MAX);
	if (!buf) {
		close(fd);
		return -1;
	}
	for (i = 0; i <= n && !ret; i++) {
		size_t l = i < n ? strlen(names[i]) + 1 : 0;

		if (len && (i == n || len + l > VALUE_MAX)) {	/* send what is there */
			ret = fsetxattr(fd, TIERFS_XATTR_RESTORE_ORDER, buf, len, 0);
			err = errno;
			len = 0;
		}
		if (i < n) {
			memcpy(buf + len, names[i], l - 1);
			buf[len + l - 1] = '\n';
			len += l;
		}
	}
	free(buf);
	close(fd);
	errno = ret ? err : errno;
	return ret ? -1 : 0;
}

/*
 * The page of dir's queue from entry `at` into buf (TIERFS_RESTORE_ORDER_PAGE_MAX
 * bytes): its length, or -1 with errno.  A daemon without pages (ENODATA
 * for the first page of a directory): the plain attribute, *whole set.
 */
static ssize_t queue_page(int fd, size_t at, char *buf, bool *whole)
{
	char name[sizeof(TIERFS_XATTR_RESTORE_ORDER_PAGE) + 24];
	ssize_t r;

	snprintf(name, sizeof(name), "%s%zu", TIERFS_XATTR_RESTORE_ORDER_PAGE, at);
	r = fgetxattr(fd, name, buf, TIERFS_RESTORE_ORDER_PAGE_MAX);
	if (r < 0 && errno == ENODATA && at == 0) {
		*whole = true;
		r = fgetxattr(fd, TIERFS_XATTR_RESTORE_ORDER, buf, TIERFS_RESTORE_ORDER_PAGE_MAX);
	}
	return r;
}

TIERFS_EXPORT char **tierfs_restore_queue(const char *dir, size_t *np)
{
	char *page = NULL, *text = NULL, **v, *s;
	size_t len = 0, cap = 0, n = 0, i;
	bool whole = false;
	int fd, err;

	fd = open_tierfs(dir, O_DIRECTORY);
	if (fd < 0)
		return NULL;
	page = malloc(TIERFS_RESTORE_ORDER_PAGE_MAX);
	if (!page)
		goto fail;
	for (;;) {
		ssize_t r = queue_page(fd, n, page, &whole);
		size_t lines = 0;

		if (r < 0)
			goto fail;
		if (r == 0)
			break;
		if (page[r - 1] != '\n') {	/* not the daemon's listing */
			errno = EIO;
			goto fail;
		}
		if (len + (size_t)r + 1 > cap) {
			size_t nc = cap ? 2 * cap : 2 * TIERFS_RESTORE_ORDER_PAGE_MAX;
			char *nt;

			while (nc < len + (size_t)r + 1)
				nc *= 2;
			nt = realloc(text, nc);
			if (!nt)
				goto fail;
			text = nt;
			cap = nc;
		}
		memcpy(text + len, page, (size_t)r);
		len += (size_t)r;
		for (i = 0; i < (size_t)r; i++)
			lines += page[i] == '\n';
		n += lines;
		if (whole)
			break;
	}
	free(page);
	page = NULL;
	close(fd);
	fd = -1;
	/* one block: the n + 1 pointers, then the names */
	v = malloc((n + 1) * sizeof(*v) + len + 1);
	if (!v)
		goto fail;
	s = (char *)(v + n + 1);
	if (len)
		memcpy(s, text, len);
	s[len] = 0;
	for (i = 0; i < n; i++) {
		char *nl = strchr(s, '\n');

		v[i] = s;
		*nl = 0;
		s = nl + 1;
	}
	v[n] = NULL;
	free(text);
	if (np)
		*np = n;
	return v;
fail:
	err = errno;
	free(page);
	free(text);
	if (fd >= 0)
		close(fd);
	errno = err;
	return NULL;
}

TIERFS_EXPORT char *tierfs_stats(const char *mount)
{
	ssize_t n, size = 4096;
	char *buf = NULL;
	int fd = open_tierfs(mount, O_DIRECTORY), up, err;
	struct stat st, upst;

	if (fd < 0 && errno == ENOTDIR) {	/* a file: from its directory */
		const char *slash = strrchr(mount, '/');
		char *dir = slash ? strndup(mount, (size_t)(slash - mount) + 1) : strdup(".");

		if (!dir)
			return NULL;
		fd = open_tierfs(dir, O_DIRECTORY);
		free(dir);
	}
	if (fd < 0)
		return NULL;
	/* up to the mount's root: the directory whose parent is on another
	 * device (a parent that cannot be opened: let the attribute say) */
	while (fstat(fd, &st) == 0) {
		up = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (up < 0)
			break;
		if (fstat(up, &upst) < 0 || upst.st_dev != st.st_dev ||
		    upst.st_ino == st.st_ino) {
			close(up);
			break;
		}
		close(fd);
		fd = up;
	}
	for (;;) {
		char *nb = realloc(buf, (size_t)size + 1);

		if (!nb) {
			err = errno;
			break;
		}
		buf = nb;
		n = fgetxattr(fd, TIERFS_XATTR_STATS, buf, (size_t)size);
		if (n >= 0) {
			buf[n] = 0;
			close(fd);
			return buf;
		}
		err = errno;
		if (errno != ERANGE || size >= (1 << 24))
			break;
		size *= 4;
	}
	free(buf);
	close(fd);
	errno = err;
	return NULL;
}

/* The value of "key": N in the JSON text s (first occurrence), or -1. */
static long long json_num(const char *s, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(s, pat);
	if (!p)
		return -1;
	p += strlen(pat);
	while (*p == ' ')
		p++;
	return strtoll(p, NULL, 10);
}

/* Is the regular file fd's newest data on the SSD (ssd:CURRENT, no copy
 * being written or waiting for a flush)? 1, 0, or -1 with errno. */
static int file_flushed(int fd)
{
	char st[512];
	ssize_t n = fgetxattr(fd, TIERFS_XATTR_STATE, st, sizeof(st) - 1);

	if (n < 0)
		return -1;
	st[n] = 0;
	if (!strstr(st, "ssd:CURRENT"))
		return 0;
	return !strstr(st, ":INIT") && !strstr(st, ":WRITE_IN_PROGRESS") &&
	       !strstr(st, ":WRITE_COMPLETE");
}

/* The mount's flush backlog empty, nothing flushing or queued (a queued
 * flush may have no bytes in the backlog: a file truncated to 0, a journal
 * record's apply), no close whose release is not over (it may queue a
 * flush yet: closes_pending)?  1, 0, -1. */
static int mount_flushed(int rootfd)
{
	char buf[1 << 16];
	ssize_t n = fgetxattr(rootfd, TIERFS_XATTR_STATS, buf, sizeof(buf) - 1);

	if (n < 0)
		return -1;
	buf[n] = 0;
	return json_num(buf, "flush_backlog") == 0 && json_num(buf, "flushes_running") <= 0 &&
	       json_num(buf, "flush_queued") <= 0 && json_num(buf, "closes_pending") <= 0;
}

/* The root of the mount holding directory fd: climb while ".." is on the
 * same device.  Takes fd; returns the root's fd or -1. */
static int mount_root(int fd)
{
	struct stat st, up;

	if (fstat(fd, &st) < 0) {
		close(fd);
		return -1;
	}
	for (;;) {
		int pfd = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (pfd < 0 || fstat(pfd, &up) < 0 || up.st_dev != st.st_dev ||
		    up.st_ino == st.st_ino) {
			if (pfd >= 0)
				close(pfd);
			return fd;
		}
		close(fd);
		fd = pfd;
		st = up;
	}
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

TIERFS_EXPORT int tierfs_wait_flushed(const char *path, int timeout_ms)
{
	struct stat st;
	double end = now() + timeout_ms / 1000.0;
	useconds_t pause = 1000;
	bool file;
	int fd = open_tierfs(path, 0), r, err;

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0)
		goto fail;
	file = S_ISREG(st.st_mode);
	if (!file && !S_ISDIR(st.st_mode)) {
		errno = EINVAL;
		goto fail;
	}
	if (!file) {
		fd = mount_root(fd);
		if (fd < 0)
			return -1;
	}
	for (;;) {
		/* asked again each time: a file closed meanwhile waits for
		 * its age (-o flush_age); older daemons refuse it (EINVAL) */
		(void)fsetxattr(fd, TIERFS_XATTR_FLUSH, "", 0, 0);
		r = file ? file_flushed(fd) : mount_flushed(fd);
		if (r != 0)
			break;
		if (timeout_ms >= 0 && now() >= end) {
			errno = ETIMEDOUT;
			goto fail;
		}
		usleep(pause);
		if (pause < 50000)
			pause *= 2;
	}
	if (r < 0)
		goto fail;
	close(fd);
	return 0;
fail:
	err = errno;
	close(fd);
	errno = err;
	return -1;
}

/* ---- checkpoint sets ------------------------------------------------ */

TIERFS_EXPORT int tierfs_commit(const char *set)
{
	int fd = open_tierfs(set, O_DIRECTORY), err;

	if (fd < 0)
		return -1;
	if (fsetxattr(fd, TIERFS_XATTR_COMMIT, "", 0, 0) < 0) {
		err = errno;
		close(fd);
		errno = err;
		return -1;
	}
	close(fd);
	return 0;
}

static bool level_ok(const char *level)
{
	return level && (!strcmp(level, "cache") || !strcmp(level, "ssd") ||
			 !strcmp(level, "pfs"));
}

/* The state of set fd (user.tierfs.set), NUL-terminated, malloc'ed; NULL
 * with errno. */
static char *set_text(int fd)
{
	ssize_t n = fgetxattr(fd, TIERFS_XATTR_SET, NULL, 0);
	char *buf;

	if (n < 0)
		return NULL;
	buf = malloc((size_t)n + 4096);	/* it may grow between the calls */
	if (!buf)
		return NULL;
	n = fgetxattr(fd, TIERFS_XATTR_SET, buf, (size_t)n + 4095);
	if (n < 0) {
		int err = errno;

		free(buf);
		errno = err;
		return NULL;
	}
	buf[n] = 0;
	return buf;
}

/* The value of line "KEY ..." of state text s (after the key and a space),
 * or NULL. */
static const char *set_line(const char *s, const char *key)
{
	size_t kl = strlen(key);

	for (const char *p = s; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (!strncmp(p, key, kl) && p[kl] == ' ')
			return p + kl + 1;
	return NULL;
}

static bool word_is(const char *v, const char *w)
{
	size_t l = strlen(w);

	return v && !strncmp(v, w, l) && (v[l] == ' ' || v[l] == '\n' || !v[l]);
}

TIERFS_EXPORT char *tierfs_latest(const char *parent, const char *level)
{
	struct dirent *de;
	double best = -1;
	char *out = NULL;
	DIR *dp;
	int dfd;

	if (!level_ok(level)) {
		errno = EINVAL;
		return NULL;
	}
	dfd = open_tierfs(parent, O_DIRECTORY);
	if (dfd < 0)
		return NULL;
	dp = fdopendir(dfd);
	if (!dp) {
		int err = errno;

		close(dfd);
		errno = err;
		return NULL;
	}
	while ((de = readdir(dp))) {
		const char *c, *v;
		char *text;
		double t;
		int fd;

		if (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN)
			continue;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		fd = openat(dirfd(dp), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			continue;
		text = set_text(fd);
		close(fd);
		if (!text)
			continue;	/* not a set */
		c = set_line(text, "committed");
		v = set_line(text, level);
		t = c ? strtod(c, NULL) : -1;
		if (word_is(v, "complete") && t > best) {
			size_t len = strlen(parent) + strlen(de->d_name) + 2;
			char *p = malloc(len);

			if (p) {
				snprintf(p, len, "%s/%s", parent, de->d_name);
				free(out);
				out = p;
				best = t;
			}
		}
		free(text);
	}
	closedir(dp);
	if (!out)
		errno = ENOENT;
	return out;
}

TIERFS_EXPORT int tierfs_wait_set(const char *set, const char *level, int timeout_ms)
{
	double end = now() + timeout_ms / 1000.0;
	useconds_t pause = 1000;
	int fd, err = 0;

	if (!level_ok(level)) {
		errno = EINVAL;
		return -1;
	}
	fd = open_tierfs(set, O_DIRECTORY);
	if (fd < 0)
		return -1;
	for (;;) {
		char *text = set_text(fd);
		const char *v, *f;
		bool lost = false;

		if (!text) {
			err = errno;
			break;
		}
		v = set_line(text, level);
		/* a file that will not get there by itself */
		for (f = set_line(text, "file"); f; f = set_line(f, "file")) {
			const char *w = strchr(f, '\n');
			size_t l = w ? (size_t)(w - f) : strlen(f);
			char line[512];

			snprintf(line, sizeof(line), " %.*s ", (int)(l < 500 ? l : 500), f);
			if (strstr(line, " missing ") || strstr(line, " changed ") ||
			    (!strcmp(level, "pfs") && strstr(line, " persist-failed ")))
				lost = true;
			if (!w)
				break;
			f = w;	/* set_line looks from here on */
		}
		if (word_is(v, "complete")) {
			free(text);
			break;
		}
		free(text);
		if (word_is(v, "off")) {
			err = EINVAL;
			break;
		}
		if (lost) {
			err = EIO;
			break;
		}
		if (timeout_ms >= 0 && now() >= end) {
			err = ETIMEDOUT;
			break;
		}
		usleep(pause);
		if (pause < 50000)
			pause *= 2;
	}
	close(fd);
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}
