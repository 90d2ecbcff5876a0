/*
 * sets_int.h - what the rooms of checkpoint sets share: fs_sets.c (commit,
 * state, retention, the watcher, the xattrs) and sets_manifest.c (the
 * set's record in its backing directory).  Not for the rest of fs/:
 * fs_sets.h is.
 */
#ifndef TIERFS_SETS_INT_H
#define TIERFS_SETS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define MANIFEST	FS_SET_RECORD		/* fs_persist.h */
#define MANIFEST_TMP	FS_SET_RECORD_TMP	/* fs_persist.h */

/* The levels a set reaches, in order. */
enum { L_CACHE, L_SSD, L_PFS, L_N };
extern const char *const sets_level_name[L_N];	/* "cache", "ssd", "pfs" */

/* A file of a set as its commit recorded it. */
struct mfile {
	char *name;
	uint64_t size;
	struct timespec mtime;
};

/* A set's manifest, read or to be written. */
struct manifest {
	struct timespec committed;
	struct timespec at[L_N];	/* when ssd, pfs were recorded */
	bool rec[L_N];			/* recorded (ssd, pfs) */
	size_t n;
	struct mfile *f;
	uint64_t bytes;
	char *text;			/* as read: names point into it */
};

/* Read and parse the manifest of backing directory dfd (O_PATH is
 * enough): 0, -ENODATA where there is none (not a set), -EIO for one that
 * does not parse (logged), -ENOMEM. */
int sets_manifest_read(int dfd, struct manifest *m);
/* Write m as dfd's manifest (temporary name, fsync, rename, the directory
 * synced), keeping the directory's mtime.  fs.nslock held.  0 or -errno
 * (the old manifest, if any, stays). */
int sets_manifest_write(int dfd, const struct manifest *m);
void sets_manifest_free(struct manifest *m);
/* Parse m->text (malloc'ed, NUL-terminated; m owns it): 0, or -EIO for
 * one that does not parse (logged; m freed), -ENOMEM. */
int sets_manifest_parse(struct manifest *m);
/* The manifest's text for m, with the records that are set: malloc'ed
 * (NULL: out of memory), its length in *len. */
char *sets_manifest_text(const struct manifest *m, size_t *len);

void sets_ts_now(struct timespec *t);
/* <0, 0, >0 as a is before, at, after b. */
int sets_ts_cmp(const struct timespec *a, const struct timespec *b);
/* fsync dfd/rel, opened read-only with `flags` added; sets_sync_dir: a
 * directory.  0 or -errno. */
int sets_sync_at(int dfd, const char *rel, int flags);
int sets_sync_dir(int dfd, const char *rel);

#endif
