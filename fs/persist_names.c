/*
 * persist_names.c - which names of a file get a copy in DIR: the hooks of
 * a commit, a creation, a link, a release and a commit intent, and the
 * search of a hard-linked file's other names (the directories of its
 * known names, then the backing tree), since in DIR each name is a
 * separate file.
 *
 * Calls: persist_queue.c (the copies queued), persist_journal.c (intents
 * written), persist_path.c.  Locks: called under fs.nslock (the names are
 * steady), fs.lock for an inode's names, pq.lock for the intents and the
 * inodes' pcreated field.
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

/* Queue a copy of in to its name dir/name (dir NULL: name is the path)
 * if that is persistent; intent:
 * only write it in the journal (fs_persist_intent). */
static void copy_name(struct fs_inode *in, struct fs_inode *dir, const char *name,
		      bool intent)
{
	char drel[PATH_MAX], rel[PATH_MAX];
	int ret = 0;

	if (dir && ((ret = persist_rel_of(dir, drel, sizeof(drel))) ||
		    (ret = persist_join(rel, sizeof(rel), drel, name)))) {
		if (ret == -ENAMETOOLONG && !intent && persist_marked_inode(in))
			persist_path_failed(in, name);
		return;
	}
	if (!dir)
		snprintf(rel, sizeof(rel), "%s", name);
	if (!persist_marked(rel))
		return;
	if (!intent) {
		persist_queue_copy(in, rel, NULL);
		return;
	}
	pq_lock();
	/* an intent: 'I' in the journal */
	persist_jappend(&(struct pop){ .kind = P_COPY, .path = rel, .started = true });
	pq_unlock();
}

#define PNAMES_MAX	16	/* names of a hard-linked file copied per commit */

/*
 * The daemon knows the names of a file that it saw made or looked up since
 * its inode was last forgotten: a hard-linked file may have others.  Look
 * for them in the directories of the known ones (where hard links usually
 * are): the entries with its inode number.
 */
/*
 * Call fn(arg, name) for each entry of directory dfd (owned: closed here)
 * that is the inode of st, the hidden names left out, until fn returns
 * false.  The scan behind every hard-link fallback below.
 */
/* Is entry de of directory dfd (not a hidden name) the inode of st? */
static bool link_of(int dfd, const struct dirent *de, const struct stat *st)
{
	struct stat est;

	return de->d_ino == st->st_ino && !fs_hidden_name(de->d_name) &&
	       fstatat(dfd, de->d_name, &est, AT_SYMLINK_NOFOLLOW) == 0 &&
	       est.st_ino == st->st_ino && est.st_dev == st->st_dev;
}

static void each_link_in(int dfd, const struct stat *st, bool (*fn)(void *arg, const char *name),
			 void *arg)
{
	struct dirent *de;
	DIR *dp;

	if (dfd < 0 || !(dp = fdopendir(dfd))) {
		if (dfd >= 0)
			close(dfd);
		return;
	}
	while ((de = readdir(dp))) {
		if (!link_of(dfd, de, st))
			continue;
		if (!fn(arg, de->d_name))
			break;
	}
	closedir(dp);
}

struct more_names_scan {
	struct fs_inode **dirs, *dir;
	char **names;
	int n;
};

/* each_link_in()'s callback of more_names(): a name not known yet */
static bool more_names_one(void *arg, const char *name)
{
	struct more_names_scan *m = arg;
	int i;

	for (i = 0; i < m->n; i++)
		if (m->dirs[i] == m->dir && m->names[i] && !strcmp(m->names[i], name))
			return true;
	if (!(m->names[m->n] = strdup(name)))
		return true;
	m->dirs[m->n] = m->dir;
	fs_inode_get(m->dir);
	return ++m->n < PNAMES_MAX;
}

/*
 * The names of in beyond the n known ones in the directories of the known
 * ones (each scanned once; its (dev, ino) added to done[*ndone]); returns
 * the number of names in dirs[]/names[] now.  st: in's backing file.
 */
static int more_names(const struct stat *st, struct fs_inode **dirs, char **names, int n,
		      struct stat *done, int *ndone)
{
	struct more_names_scan m = { .dirs = dirs, .names = names, .n = n };
	int known = n;

	if (st->st_nlink <= (nlink_t)n)
		return n;
	for (int d = 0; d < known && m.n < PNAMES_MAX; d++) {
		int dfd, i;

		for (i = 0; i < d && dirs[i] != dirs[d]; i++)
			;
		if (i < d)
			continue;	/* looked through already */
		dfd = fs_fd_hold(dirs[d]);
		dfd = dfd < 0 ? -1 : openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		fs_fd_release(dirs[d]);
		if (dfd >= 0 && fstat(dfd, &done[*ndone]) == 0)
			(*ndone)++;
		m.dir = dirs[d];
		each_link_in(dfd, st, more_names_one, &m);
	}
	return m.n;
}

/*
 * The links that the scans of the known names' directories did not find
 * (st_nlink says how many there are: hard links across directories, seen by
 * a restarted daemon or made outside the mount): a walk of the whole backing
 * tree, the directories in done[] left out, that stops once `missing` links
 * were found.  It costs a walk of the namespace, so it runs only when names
 * are known to be missing.
 */
#define TREE_DEPTH_MAX	256	/* directories deeper than this are not walked */

struct tree_scan {
	struct fs_inode *in;
	const struct stat *st;		/* the file's backing file */
	const struct stat *done;	/* directories scanned already */
	int ndone;
	int missing;			/* links still to find */
	bool intent;
	char rel[PATH_MAX];		/* the directory being walked */
};

static void tree_links_in(int dfd, size_t len, struct tree_scan *t, int depth)
{
	char rel[PATH_MAX];
	struct stat dst, est;
	struct dirent *de;
	bool scanned = false;
	DIR *dp;

	if (fstat(dfd, &dst) < 0 || !(dp = fdopendir(dfd))) {
		close(dfd);
		return;
	}
	for (int i = 0; i < t->ndone; i++)
		if (t->done[i].st_ino == dst.st_ino && t->done[i].st_dev == dst.st_dev)
			scanned = true;
	while (t->missing > 0 && (de = readdir(dp))) {
		bool dir = de->d_type == DT_DIR;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fs_hidden_name(de->d_name))
			continue;
		if (de->d_type == DT_UNKNOWN) {
			if (fstatat(dirfd(dp), de->d_name, &est, AT_SYMLINK_NOFOLLOW) < 0)
				continue;
			dir = S_ISDIR(est.st_mode);
		}
		if (dir) {
			size_t nl = strlen(de->d_name);
			int cfd;

			if (depth >= TREE_DEPTH_MAX || len + nl + 2 > sizeof(t->rel))
				continue;
			cfd = openat(dirfd(dp), de->d_name,
				     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (cfd < 0)
				continue;
			snprintf(t->rel + len, sizeof(t->rel) - len, "%s%s", len ? "/" : "",
				 de->d_name);
			tree_links_in(cfd, len + nl + (len ? 1 : 0), t, depth + 1);
			t->rel[len] = 0;
			continue;
		}
		if (scanned || !link_of(dirfd(dp), de, t->st) ||
		    persist_join(rel, sizeof(rel), t->rel, de->d_name))
			continue;
		copy_name(t->in, NULL, rel, t->intent);
		t->missing--;
	}
	closedir(dp);
}

static void tree_links(struct fs_inode *in, const struct stat *st, const struct stat *done,
		       int ndone, int missing, bool intent)
{
	struct tree_scan *t;
	int dfd;

	if (missing <= 0 || !(t = calloc(1, sizeof(*t))))
		return;
	*t = (struct tree_scan){ .in = in, .st = st, .done = done, .ndone = ndone,
				 .missing = missing > PNAMES_MAX ? PNAMES_MAX : missing,
				 .intent = intent };
	dfd = openat(fs.root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0)
		tree_links_in(dfd, 0, t, 0);
	if (t->missing > 0)
		tlog(LOG_DEBUG, "persist: %d link(s) of inode %llu not found in the backing tree",
		     t->missing, (unsigned long long)st->st_ino);
	free(t);
}

/*
 * Every name of in gets the new version: in DIR, hard links are separate
 * files (a version renamed into place replaces one name).  fs.nslock held:
 * the names are steady.
 */
static void each_name(struct fs_inode *in, bool intent);

/* The counted intent of a created file ends (its copy is queued, or it
 * will never have one). */
static void created_done(struct fs_inode *in)
{
	if (!pq.dir)
		return;
	pq_lock();
	if (in->pcreated) {
		in->pcreated = false;
		pq.intents--;
		persist_jempty();
	}
	pq_unlock();
}

void fs_persist_committed(struct fs_inode *in)
{
	each_name(in, false);
	created_done(in);
}

bool fs_persist_name_begin(struct fs_inode *dir, const char *name, struct fs_inode *in)
{
	char drel[PATH_MAX], rel[PATH_MAX];
	int m = -1, fd;

	if (!pq.jon || persist_rel_of(dir, drel, sizeof(drel)) ||
	    persist_join(rel, sizeof(rel), drel, name))
		return false;
	if (in) {		/* a link: the file's own mark, if it has one */
		fd = fs_fd_hold(in);
		if (fd >= 0) {
			char proc[64];

			fs_proc_path(fd, proc, sizeof(proc));
			m = persist_mark_at(proc, true);
		}
		fs_fd_release(in);
	}
	if (m == 0 || (m < 0 && !persist_marked(rel)))
		return false;
	pq_lock();
	pq.intents++;	/* the journal keeps the record until it ends */
	/* an intent: 'I' in the journal */
	persist_jappend(&(struct pop){ .kind = P_COPY, .path = rel, .started = true });
	pq_unlock();
	return true;
}

void fs_persist_created(struct fs_inode *in, struct fs_inode *dir, const char *name, bool held)
{
	char drel[PATH_MAX], rel[PATH_MAX];

	if (!pq.dir || !S_ISREG(in->type) || persist_rel_of(dir, drel, sizeof(drel)) ||
	    persist_join(rel, sizeof(rel), drel, name) || !persist_marked(rel)) {
		if (held)
			fs_persist_intent_end();
		return;
	}
	pq_lock();
	bool first = !in->pcreated;

	if (first) {
		in->pcreated = true;	/* the intent held, or a new one */
		if (!held) {
			pq.intents++;	/* the journal keeps the record until then */
			persist_jappend(&(struct pop){ .kind = P_COPY, .path = rel,
						       .started = true });
		}
	}
	pq_unlock();
	if (!first && held)
		fs_persist_intent_end();	/* its creation is counted already */
}

void fs_persist_released(struct fs_inode *in)
{
	uint64_t size = 0;
	struct timespec mt;
	struct stat st;
	bool pending;
	int fd;

	if (!pq.dir)
		return;
	pq_lock();
	pending = in->pcreated;
	pq_unlock();
	if (!pending)
		return;
	/* data not flushed yet: its commit queues the copies */
	if (tfile_attr(&in->tf, &size, &mt) && size)
		return;
	fs_ns_lock();
	fd = fs_fd_hold(in);
	if (fd >= 0 && fstatat(fd, "", &st, AT_EMPTY_PATH) == 0 && st.st_size == 0) {
		each_name(in, false);
		created_done(in);
	}
	fs_fd_release(in);
	fs_ns_unlock();
}

/* A regular file's inode is freed (fs.lock held). */
void fs_persist_forget(struct fs_inode *in)
{
	created_done(in);
}

void fs_persist_intent(struct fs_inode *in, bool counted)
{
	if (!pq.jon || !S_ISREG(in->type))
		return;
	if (counted) {
		pq_lock();
		pq.intents++;
		pq_unlock();
	}
	each_name(in, true);
}

void fs_persist_intent_end(void)
{
	if (!pq.jon)
		return;
	pq_lock();
	pq.intents--;
	persist_jempty();
	pq_unlock();
}

/*
 * each_name() for a file known only by rel (the name its descriptor was
 * opened by): rel and the entries of rel's directory with its inode.
 */
struct rel_names_scan {
	struct fs_inode *in;
	const char *drel, *skip;
	bool intent;
	int n;
};

/* each_link_in()'s callback of rel_names(): copy drel/name */
static bool rel_names_one(void *arg, const char *name)
{
	struct rel_names_scan *r = arg;
	char rel[PATH_MAX];

	if ((r->skip && !strcmp(name, r->skip)) || persist_join(rel, sizeof(rel), r->drel, name))
		return true;
	copy_name(r->in, NULL, rel, r->intent);
	return ++r->n < PNAMES_MAX;
}

/* Returns the number of names found (rel itself when self); the directory
 * scanned goes to *done. */
static int rel_names(struct fs_inode *in, const struct stat *st, const char *rel, bool self,
		     bool intent, struct stat *done, int *ndone)
{
	const char *b = persist_base_of(rel);
	char drel[PATH_MAX];
	struct rel_names_scan r = { .in = in, .drel = drel, .skip = self ? b : NULL,
				    .intent = intent, .n = self ? 1 : 0 };
	int dfd;

	if (self)
		copy_name(in, NULL, rel, intent);
	if (st->st_nlink < (self ? 2u : 1u))
		return r.n;
	snprintf(drel, sizeof(drel), "%.*s", b > rel ? (int)(b - rel - 1) : 0, rel);
	dfd = persist_walk_beneath(fs.root_fd, drel, false, NULL, NULL, NULL);
	if (dfd >= 0 && fstat(dfd, &done[*ndone]) == 0)
		(*ndone)++;
	each_link_in(dfd, st, rel_names_one, &r);
	return r.n;
}

static void each_name(struct fs_inode *in, bool intent)
{
	struct fs_inode *dirs[PNAMES_MAX];
	char *names[PNAMES_MAX];
	struct stat st, done[PNAMES_MAX];
	struct fs_alias *a;
	char rel[PATH_MAX];
	int n = 0, i, ndone = 0, found = 0, fd;
	bool have_st, have_rel, removed = false;

	if (!pq.dir || !S_ISREG(in->type))
		return;
	fs_lock();
	if (in->name && in->parent && !in->unlinked) {
		dirs[n] = in->parent;
		names[n++] = strdup(in->name);
	}
	for (a = in->unlinked ? NULL : in->aliases; a && n < PNAMES_MAX; a = a->next) {
		dirs[n] = a->parent;
		names[n++] = strdup(a->name);
	}
	for (i = 0; i < n; i++)
		fs_inode_get(dirs[i]);
	fs_unlock();
	/* no known name: the name its descriptor was opened by (rel) */
	fd = fs_fd_hold(in);
	/* its names: a live clone record's base link is none (no walk for it) */
	have_st = fd >= 0 && fs_journal_fstat(fd, &st, 0) == 0;
	have_rel = have_st && !n && !in->unlinked &&
		   !persist_rel_of_fd_any(fd, rel, sizeof(rel), &removed) && *rel;
	fs_fd_release(in);
	if (n) {
		if (have_st)
			n = more_names(&st, dirs, names, n, done, &ndone);
		found = n;
	} else if (have_rel) {
		/* a hard-linked file whose known names are gone: rel, if that
		 * still is one, and the other names of the file in that
		 * directory (also when that name was removed) */
		found = rel_names(in, &st, rel, !removed, intent, done, &ndone);
	}
	/* names in directories that no known name is in */
	if (have_st && (found || !in->unlinked) && found < PNAMES_MAX &&
	    st.st_nlink > (nlink_t)found)
		tree_links(in, &st, done, ndone, (int)(st.st_nlink - found), intent);
	for (i = 0; i < n; i++) {
		if (names[i])
			copy_name(in, dirs[i], names[i], intent);
		free(names[i]);
		fs_inode_put(dirs[i]);
	}
}

void fs_persist_linked(struct fs_inode *in, struct fs_inode *dir, const char *name)
{
	if (pq.dir && S_ISREG(in->type))
		copy_name(in, dir, name, false);
}
