/*
 * sets_manifest.c - the record of a checkpoint set (fs_sets.c): the
 * manifest .tierfs.set in the set's backing directory, its text format
 * ("tierfs-set 1", "committed SEC.NSEC", a "file SIZE MTIME NAME" line a
 * file, "ssd TIME" and "pfs TIME" once reached; keys a reader does not
 * know are skipped), read and parsed, and written whole: a temporary name,
 * synced, renamed, the directory synced.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "fs_persist.h"
#include "sets_int.h"
#include "../common/log.h"

#define MANIFEST_MAX	(64u << 20)		/* bytes read at most */

const char *const sets_level_name[L_N] = { "cache", "ssd", "pfs" };

void sets_ts_now(struct timespec *t)
{
	clock_gettime(CLOCK_REALTIME, t);
}

int sets_ts_cmp(const struct timespec *a, const struct timespec *b)
{
	if (a->tv_sec != b->tv_sec)
		return a->tv_sec < b->tv_sec ? -1 : 1;
	return a->tv_nsec < b->tv_nsec ? -1 : a->tv_nsec > b->tv_nsec;
}

/* "SEC.NSEC" at *p; advances *p.  false: not one. */
static bool parse_ts(char **p, struct timespec *t)
{
	char *end;

	errno = 0;
	t->tv_sec = strtoll(*p, &end, 10);
	if (errno || end == *p || *end != '.')
		return false;
	*p = end + 1;
	t->tv_nsec = strtol(*p, &end, 10);
	if (errno || end == *p || t->tv_nsec < 0 || t->tv_nsec > 999999999)
		return false;
	*p = end;
	return true;
}

void sets_manifest_free(struct manifest *m)
{
	free(m->f);
	free(m->text);
	memset(m, 0, sizeof(*m));
}

/* Parse m->text (malloc'ed, NUL-terminated; m owns it): 0, or -EIO for
 * one that does not parse (logged; m freed). */
int sets_manifest_parse(struct manifest *m)
{
	size_t cap = 0;
	char *p, *nl;
	int ret = 0;

	if (strncmp(m->text, "tierfs-set 1\n", 13)) {
		ret = -EIO;
		goto out;
	}
	for (p = m->text + 13; *p; p = nl + 1) {
		nl = strchr(p, '\n');
		if (!nl) {
			ret = -EIO;	/* the last line is whole in a whole file */
			goto out;
		}
		*nl = 0;
		if (!strncmp(p, "committed ", 10)) {
			p += 10;
			if (!parse_ts(&p, &m->committed))
				ret = -EIO;
		} else if (!strncmp(p, "ssd ", 4) || !strncmp(p, "pfs ", 4)) {
			int l = p[0] == 's' ? L_SSD : L_PFS;

			p += 4;
			if (!parse_ts(&p, &m->at[l]))
				ret = -EIO;
			m->rec[l] = true;
		} else if (!strncmp(p, "file ", 5)) {
			struct mfile *f;
			char *end;

			if (m->n == cap) {
				cap = cap ? 2 * cap : 16;
				f = realloc(m->f, cap * sizeof(*f));
				if (!f) {
					ret = -ENOMEM;
					goto out;
				}
				m->f = f;
			}
			f = &m->f[m->n];
			p += 5;
			errno = 0;
			f->size = strtoull(p, &end, 10);
			if (errno || end == p || *end != ' ') {
				ret = -EIO;
				goto out;
			}
			p = end + 1;
			if (!parse_ts(&p, &f->mtime) || *p != ' ' || !p[1]) {
				ret = -EIO;
				goto out;
			}
			f->name = p + 1;
			if (strchr(f->name, '/') || !strcmp(f->name, ".") ||
			    !strcmp(f->name, "..")) {
				ret = -EIO;	/* not a name of the set's directory */
				goto out;
			}
			m->bytes += f->size;
			m->n++;
		}			/* other keys: a newer format's, skipped */
		if (ret)
			goto out;
	}
	if (!m->committed.tv_sec)
		ret = -EIO;
out:
	if (ret == -EIO)
		tlog(LOG_WARNING, "sets: a %s that does not parse: taken as no commit", MANIFEST);
	if (ret)
		sets_manifest_free(m);
	return ret;
}

/*
 * Read and parse the manifest of the backing directory dfd (O_PATH is
 * enough): 0, -ENODATA where there is none (not a set), -EIO for one that
 * does not parse (logged).
 */
int sets_manifest_read(int dfd, struct manifest *m)
{
	struct stat st;
	int fd, ret = 0;
	ssize_t n;

	memset(m, 0, sizeof(*m));
	fd = openat(dfd, MANIFEST, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT || errno == ENOTDIR ? -ENODATA : -errno;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MANIFEST_MAX) {
		close(fd);
		return -EIO;
	}
	m->text = malloc((size_t)st.st_size + 1);
	if (!m->text) {
		close(fd);
		return -ENOMEM;
	}
	n = pread(fd, m->text, (size_t)st.st_size, 0);
	close(fd);
	if (n != st.st_size) {
		ret = -EIO;
		goto out;
	}
	m->text[n] = 0;
	return sets_manifest_parse(m);
out:
	sets_manifest_free(m);
	return ret;
}

/* The manifest's text for m, with the records that are set: malloc'ed. */
char *sets_manifest_text(const struct manifest *m, size_t *len)
{
	size_t cap = 128 + m->n * 64, at = 0, i;
	char *s = malloc(cap), *ns;

	for (i = 0; s && i <= m->n + 1; i++) {
		size_t need = i < m->n ? strlen(m->f[i].name) + 64 : 128;

		if (at + need >= cap) {
			cap = 2 * cap + need;
			ns = realloc(s, cap);
			if (!ns) {
				free(s);
				return NULL;
			}
			s = ns;
		}
		if (i == 0)
			at += (size_t)snprintf(s + at, cap - at, "tierfs-set 1\ncommitted %lld.%09ld\n",
					       (long long)m->committed.tv_sec, m->committed.tv_nsec);
		if (i < m->n)
			at += (size_t)snprintf(s + at, cap - at, "file %" PRIu64 " %lld.%09ld %s\n",
					       m->f[i].size, (long long)m->f[i].mtime.tv_sec,
					       m->f[i].mtime.tv_nsec, m->f[i].name);
		else if (i == m->n + 1)
			for (int l = L_SSD; l < L_N; l++)
				if (m->rec[l])
					at += (size_t)snprintf(s + at, cap - at, "%s %lld.%09ld\n",
							       sets_level_name[l],
							       (long long)m->at[l].tv_sec,
							       m->at[l].tv_nsec);
	}
	*len = at;
	return s;
}

/* fsync dfd/rel, opened read-only with `flags` added.  0 or -errno. */
int sets_sync_at(int dfd, const char *rel, int flags)
{
	int fd = openat(dfd, rel, O_RDONLY | O_CLOEXEC | flags), ret = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* fsync directory dfd/rel (O_PATH dfd).  0 or -errno. */
int sets_sync_dir(int dfd, const char *rel)
{
	return sets_sync_at(dfd, rel, O_DIRECTORY);
}

/*
 * Write m as dfd's manifest (temporary name, fsync, rename, the directory
 * synced), keeping the directory's mtime (the set's files did not change).
 * fs.nslock held.  0 or -errno (the old manifest, if any, stays).
 */
int sets_manifest_write(int dfd, const struct manifest *m)
{
	struct timespec mt;
	size_t len;
	char *s = sets_manifest_text(m, &len);
	bool ok;
	int fd, ret = 0;

	if (!s)
		return -ENOMEM;
	fs_dir_mtime_get(dfd, &mt, &ok);
	fd = openat(dfd, MANIFEST_TMP, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
		    0600);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	if (write(fd, s, len) != (ssize_t)len)
		ret = errno ? -errno : -EIO;
	else if (fsync(fd) < 0)
		ret = -errno;
	close(fd);
	if (!ret && renameat(dfd, MANIFEST_TMP, dfd, MANIFEST) < 0)
		ret = -errno;
	if (ret)
		unlinkat(dfd, MANIFEST_TMP, 0);
	else
		ret = sets_sync_dir(dfd, ".");
out:
	fs_dir_mtime_put(dfd, &mt, ok);
	free(s);
	return ret;
}
