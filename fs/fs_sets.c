/*
 * fs_sets.c - checkpoint sets (tierfs-hints(7), CHECKPOINT SETS).
 *
 * A set is a directory whose regular files are one checkpoint (its
 * subdirectories are not part of it).  Setting user.tierfs.commit on it
 * records, in the hidden file .tierfs.set of its backing directory (the
 * manifest), the commit time and each file's name, size and modification
 * time: written to a temporary name, synced, renamed, the directory
 * synced, so a commit that returned survives the daemon and the node.  A
 * file still open for writing refuses the commit (EBUSY, the log names
 * it).  The set's state at each level is judged against the manifest
 * whenever it is asked (user.tierfs.set) or watched:
 *  - cache: every file exists, has no writer, and has the manifest's size
 *    and modification time;
 *  - ssd: so has its backing file, nothing newer is cached, and files and
 *    directory entries are synced (done the first time the set is seen so;
 *    the manifest then records "ssd TIME");
 *  - pfs: every file is in DIR (-o persist), as user.tierfs.state says;
 *    recorded as "pfs TIME".
 * A file missing, different from the manifest (a kill before its flush
 * loses what only the cache held), or whose flush failed keeps its levels
 * from being complete, and the state names it.  So a set is never said
 * complete with a file missing, whatever happened between its commit and
 * the question.
 *
 * The watcher thread follows committed sets until they reach their last
 * level (each commit asks for the set's flush at once); when one reaches
 * ssd it applies retention to its parent directory: user.tierfs.keep=N
 * there (an xattr of the backing directory), else -o keep_sets=N, keeps
 * the N newest sets complete at ssd, and removes older complete ones from
 * the caches and the backing directory, except one with a file open or in
 * the restore queue, the newest complete at any level, and (with -o
 * persist) one whose files are persistent and not all in DIR yet.  DIR
 * keeps what the SSD drops (its persist_keep counts sets there).
 *
 * Locks: sets.lock (LR_SETS, a leaf) guards the watch list and its flags
 * only; evaluations and removals run with no lock of this file held, the
 * manifest's rewrites under fs.nslock (which orders them with commits).
 * The manifest's format, its reading and writing: sets_manifest.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "fs_persist.h"
#include "fs_sets.h"
#include "sets_int.h"
#include "tierfs.h"
#include "../common/fault.h"
#include "../common/log.h"

#define PROBLEMS_MAX	(60u << 10)		/* bytes of "file" lines */
#define KEEP_XATTR	TIERFS_XATTR_KEEP	/* on the backing directory */

struct level {
	size_t pending;			/* files not there yet */
	size_t bad;			/* files that will not get there */
	size_t unmarked;		/* pfs: files not persistent */
};

struct eval {
	struct manifest m;
	struct level lv[L_N];
	bool busy;			/* a file open, or in the restore queue */
	char *probs;			/* "file NAME WHAT\n" lines */
	size_t plen, pcap, pmore;
};

struct watch {
	struct watch *next;
	struct fs_inode *dir;		/* referenced */
	bool kept;			/* retention applied at its ssd */
	bool kept_pfs;			/* ... and at its pfs (an older set
					 * kept as the newest in DIR goes now) */
	bool retain;			/* only apply retention in dir (a request
					 * cannot: its directory is locked by
					 * the kernel, which the entries'
					 * invalidation needs) */
};

static struct {
	unsigned keep;			/* -o keep_sets, 0: off */
	pthread_mutex_t lock;		/* LR_SETS: the fields below */
	pthread_cond_t cond;		/* a set was committed; stop */
	struct watch *head;
	pthread_t thr;
	bool started, stop;
	uint64_t removed;		/* sets removed by retention */
} sets = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
};

static void sets_lock(void)
{
	ranked_lock(&sets.lock, LR_SETS);
}

static void sets_unlock(void)
{
	ranked_unlock(&sets.lock, LR_SETS);
}

/* ------------------------------------------------------------ options */

/* "N": 0..1000000; -1 otherwise. */
static long parse_keep(const char *s, size_t len)
{
	char buf[16], *end;
	long v;

	if (len && s[len - 1] == '\n')
		len--;
	if (len == 0 || len >= sizeof(buf) || s[0] < '0' || s[0] > '9')
		return -1;
	memcpy(buf, s, len);
	buf[len] = 0;
	errno = 0;
	v = strtol(buf, &end, 10);
	return errno || *end || v > 1000000 ? -1 : v;
}

void fs_sets_setup(unsigned keep)
{
	sets.keep = keep;
}

/* ------------------------------------------------------------ commit */

static int pfile_cmp(const void *a, const void *b)
{
	return strcmp(((const struct fs_pfile *)a)->name, ((const struct fs_pfile *)b)->name);
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(((const struct mfile *)a)->name, ((const struct mfile *)b)->name);
}

static void say(struct fs_inode *in, int level, const char *fmt, const char *a, const char *b)
{
	char path[512];

	if (level > tierfs_log_level)
		return;
	if (fs_rel_path(in, path, sizeof(path)))
		snprintf(path, sizeof(path), "(inode %llu)", (unsigned long long)in->ino);
	tierfs_log(level, fmt, path, a, b);
}

static void watch_add(struct fs_inode *dir, bool retain);

#define RELEASE_WAIT_MS	500	/* a commit waits this long for a writer's release */

/*
 * One entry of a set being committed (commit below): a regular file with
 * no writer is flushed now and goes into m (its name, size and mtime); a
 * name that is not a regular file, or gone meanwhile, is skipped.  0, or
 * -errno refusing the commit (said in the log): a name with a newline, a
 * file open for writing (EBUSY).
 */
static int commit_file(struct fs_inode *dir, const char *name, struct manifest *m,
		       size_t *cap)
{
	struct tfile *tf;
	struct tfile_facts fx;
	struct stat st;
	struct mfile *f;
	int ret;

	if (strchr(name, '\n')) {
		say(dir, LOG_NOTICE, "sets: commit of %s refused: a file name with a "
		    "newline%s%s", "", "");
		return -EINVAL;
	}
	ret = fs_child_tfile(dir, name, &tf);
	if (ret == -EINVAL)		/* not a regular file: not in the set */
		return 0;
	if (ret)
		return ret;
	if (!tf)
		return 0;		/* gone meanwhile */
	tfile_facts(tf, &fx);
	/* close(2) returns before the kernel's release reaches us: a writer
	 * that has just closed is given RELEASE_WAIT_MS */
	for (int w = 0; fx.writers && w < RELEASE_WAIT_MS / 5; w++) {
		usleep(5000);
		tfile_facts(tf, &fx);
	}
	if (fx.writers) {
		say(dir, LOG_NOTICE, "sets: commit of %s refused (EBUSY): %s%s is open "
		    "for writing", "", name);
		tf->ops->put(tf);
		return -EBUSY;
	}
	ret = fs_stat_inode((struct fs_inode *)tf, &st);
	if (!ret)
		engine_flush_now(fs.eng, tf);
	tf->ops->put(tf);
	if (ret)
		return ret;
	if (m->n == *cap) {
		size_t c = *cap ? 2 * *cap : 16;

		f = realloc(m->f, c * sizeof(*f));
		if (!f)
			return -ENOMEM;
		m->f = f;
		*cap = c;
	}
	f = &m->f[m->n];
	f->name = strdup(name);
	if (!f->name)
		return -ENOMEM;
	f->size = (uint64_t)st.st_size;
	f->mtime = st.st_mtim;
	m->n++;
	return 0;
}

/*
 * Commit directory dir as a set: every regular file in it is written and
 * closed (else -EBUSY, the first open one named in the log, after waiting
 * RELEASE_WAIT_MS for the release of a close that has just returned: the
 * kernel sends it after close(2) returns); their flush
 * is asked for now; the manifest records them.  -EINVAL: not a directory,
 * the mount's root, no file, a name with a newline.  A set committed again
 * is recorded anew (its levels are judged again).
 */
static int commit(struct fs_inode *dir)
{
	struct manifest m = { 0 };
	size_t cap = 0;
	struct dirent *de;
	DIR *dp = NULL;
	int dfd, rfd, ret = 0;

	if (!S_ISDIR(dir->type))
		return -ENOTDIR;
	if (dir == &fs.root) {
		say(dir, LOG_NOTICE, "sets: commit of %s refused: the mount's root cannot be "
		    "a set (make a directory per checkpoint)%s%s", "", "");
		return -EINVAL;
	}
	dfd = fs_fd_hold(dir);
	if (dfd < 0) {
		fs_fd_release(dir);
		return dfd;
	}
	rfd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	dp = rfd >= 0 ? fdopendir(rfd) : NULL;
	if (!dp) {
		ret = -errno;
		if (rfd >= 0)
			close(rfd);
		goto out;
	}
	sets_ts_now(&m.committed);
	while ((de = readdir(dp))) {
		if (de->d_type != DT_REG && de->d_type != DT_UNKNOWN)
			continue;
		if (fs_hidden_name(de->d_name) || !strcmp(de->d_name, ".") ||
		    !strcmp(de->d_name, ".."))
			continue;
		ret = commit_file(dir, de->d_name, &m, &cap);
		if (ret)
			goto out;
	}
	if (m.n == 0) {
		say(dir, LOG_NOTICE, "sets: commit of %s refused: no file in it%s%s", "", "");
		ret = -EINVAL;
		goto out;
	}
	qsort(m.f, m.n, sizeof(*m.f), name_cmp);
	fs_ns_lock();
	ret = sets_manifest_write(dfd, &m);
	fs_ns_unlock();
	if (ret)
		say(dir, LOG_WARNING, "sets: commit of %s failed: cannot write its %s: %s",
		    MANIFEST, strerror(-ret));
	else
		say(dir, LOG_INFO, "sets: %s committed%s%s", "", "");
out:
	if (dp)
		closedir(dp);
	fs_fd_release(dir);
	for (size_t i = 0; i < m.n; i++)
		free(m.f[i].name);
	free(m.f);
	if (!ret)
		watch_add(dir, false);
	return ret;
}

/* ------------------------------------------------------------ state */

static void problem(struct eval *ev, const char *name, const char *what)
{
	size_t need = strlen(name) + strlen(what) + 8;

	if (ev->plen + need > PROBLEMS_MAX) {
		ev->pmore++;
		return;
	}
	if (ev->plen + need >= ev->pcap) {
		size_t cap = 2 * ev->pcap + need + 256;
		char *p = realloc(ev->probs, cap);

		if (!p) {
			ev->pmore++;
			return;
		}
		ev->probs = p;
		ev->pcap = cap;
	}
	ev->plen += (size_t)snprintf(ev->probs + ev->plen, ev->pcap - ev->plen, "file %s %s\n",
				     name, what);
}

static bool same(const struct stat *st, const struct mfile *f)
{
	return (uint64_t)st->st_size == f->size && st->st_mtim.tv_sec == f->mtime.tv_sec &&
	       st->st_mtim.tv_nsec == f->mtime.tv_nsec;
}


/* f's file is not there (or not a regular file): bad at every level. */
static void missing(struct eval *ev, const char *name)
{
	problem(ev, name, "missing");
	for (int l = 0; l < L_N; l++)
		ev->lv[l].bad++;
}

/* One file of the set against its manifest line. */
static void eval_file(struct fs_inode *dir, int dfd, const struct mfile *f, struct eval *ev)
{
	char tier[256], state[512], what[96];
	struct tfile_facts fx;
	struct stat bst, st;
	struct fs_inode *in;
	struct tfile *tf = NULL;
	bool bsame, changed = false;
	int nopen;

	/*
	 * The file's state first, its backing file's stat after: a file clean
	 * now was committed before, so its backing file is that version (the
	 * other order could pair the version a flush replaced with the clean
	 * state it left, and read "changed").
	 */
	if (fs_child_tfile(dir, f->name, &tf) || !tf) {
		missing(ev, f->name);
		return;
	}
	in = (struct fs_inode *)tf;
	tfile_facts(tf, &fx);
	tierfs_delay("set_eval");		/* a test hook for races */
	if (fstatat(dfd, f->name, &bst, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(bst.st_mode)) {
		missing(ev, f->name);
		tf->ops->put(tf);
		return;
	}
	fs_lock();
	nopen = in->nopen;
	fs_unlock();
	if (nopen || fx.restore_queued)
		ev->busy = true;
	bsame = same(&bst, f);
	if (fs_stat_inode(in, &st))
		st = bst;
	/* cache: written and closed, as committed */
	if (fx.writers) {
		ev->lv[L_CACHE].pending++;
		problem(ev, f->name, "open-for-writing");
	} else if (!same(&st, f)) {
		ev->lv[L_CACHE].bad++;
		changed = true;
		snprintf(what, sizeof(what), "changed size %" PRIu64 " committed %" PRIu64,
			 (uint64_t)st.st_size, f->size);
		problem(ev, f->name, what);
	}
	/* ssd: the backing file is that version, nothing newer cached */
	if (fx.dirty && fx.flush_err) {
		ev->lv[L_SSD].bad++;
		snprintf(what, sizeof(what), "flush-failed %s", strerrorname_np(-fx.flush_err) ?
			 strerrorname_np(-fx.flush_err) : "?");
		problem(ev, f->name, what);
	} else if (changed) {
		ev->lv[L_SSD].bad++;	/* its next flush is not the commit's */
	} else if (fx.dirty || fx.writers) {
		ev->lv[L_SSD].pending++;
	} else if (!bsame) {
		ev->lv[L_SSD].bad++;
		if (!changed)
			problem(ev, f->name, "changed");
	} else if (!ev->m.rec[L_SSD] && sets_sync_at(dfd, f->name, O_NOFOLLOW)) {
		ev->lv[L_SSD].pending++;	/* not durable yet: asked again */
	}
	/* pfs: its copy in DIR is this version */
	if (!fs_persist_on())
		ev->lv[L_PFS].unmarked++;
	else if (!tfile_describe(tf, tier, sizeof(tier), state, sizeof(state))) {
		fs_persist_describe(in, tier, sizeof(tier), state, sizeof(state));
		if (strstr(state, "pfs:PERSISTED") && !fx.dirty && bsame)
			;
		else if (changed)
			ev->lv[L_PFS].bad++;
		else if (strstr(state, "pfs:FAILED")) {
			ev->lv[L_PFS].bad++;
			problem(ev, f->name, "persist-failed");
		} else if (strstr(state, "pfs:") || fx.dirty || fx.writers)
			ev->lv[L_PFS].pending++;
		else if (!bsame)
			ev->lv[L_PFS].bad++;
		else
			ev->lv[L_PFS].unmarked++;
	} else {
		ev->lv[L_PFS].pending++;
	}
	tf->ops->put(tf);
}

static bool complete(const struct eval *ev, int l)
{
	const struct level *v = &ev->lv[l];

	return !v->pending && !v->bad && !v->unmarked;
}

static void eval_free(struct eval *ev)
{
	sets_manifest_free(&ev->m);
	free(ev->probs);
}

/*
 * The set's record into DIR, the commit point there: m's text (its pfs
 * time, without the ssd one, which is this node's) once each of its files
 * is in DIR as committed.  0 or -errno.
 */
static int record_to_dir(struct fs_inode *dir, const struct manifest *m0)
{
	struct manifest m = *m0;
	struct fs_pfile *pf;
	size_t len;
	char *text;
	int ret;

	m.rec[L_SSD] = false;
	text = sets_manifest_text(&m, &len);
	pf = calloc(m.n ? m.n : 1, sizeof(*pf));
	if (!text || !pf) {
		free(text);
		free(pf);
		return -ENOMEM;
	}
	for (size_t i = 0; i < m.n; i++) {
		pf[i].name = m.f[i].name;	/* borrowed */
		pf[i].size = m.f[i].size;
		pf[i].mtime = m.f[i].mtime;
	}
	ret = fs_persist_record_put(dir, text, len, pf, m.n);
	free(pf);
	free(text);
	return ret;
}

/*
 * Record level l (ssd, pfs) as reached in dfd's manifest, if it is still
 * the commit judged (a commit meanwhile starts over).  ssd: the set's
 * directory entries synced first (its files were, by eval_file); pfs: the
 * record is written to DIR first (with no lock held: DIR may be slow), and
 * pfs is recorded here only once it is there.
 */
static void record(struct fs_inode *dir, int dfd, struct eval *ev, int l)
{
	struct manifest now;
	struct timespec at;
	int ret;

	sets_ts_now(&at);
	if (l == L_SSD && (sets_sync_dir(dfd, ".") || sets_sync_dir(dfd, "..")))
		return;
	if (l == L_PFS) {
		ev->m.at[L_PFS] = at;
		ev->m.rec[L_PFS] = true;
		ret = record_to_dir(dir, &ev->m);
		ev->m.rec[L_PFS] = false;
		if (ret) {
			say(dir, LOG_INFO, "sets: %s: its record not written to DIR yet: %s%s",
			    strerror(-ret), "");
			return;
		}
	}
	fs_ns_lock();
	if (!sets_manifest_read(dfd, &now)) {
		if (!sets_ts_cmp(&now.committed, &ev->m.committed) && !now.rec[l]) {
			now.at[l] = at;
			now.rec[l] = true;
			if (!sets_manifest_write(dfd, &now)) {
				ev->m.rec[l] = true;
				ev->m.at[l] = now.at[l];
			}
		} else if (now.rec[l]) {
			ev->m.rec[l] = true;
			ev->m.at[l] = now.at[l];
		}
		sets_manifest_free(&now);
	}
	fs_ns_unlock();
}

static const struct fs_pfile *pfile_find(const struct fs_pfile *pf, size_t n, const char *name)
{
	struct fs_pfile key = { .name = (char *)name };

	return n ? bsearch(&key, pf, n, sizeof(*pf), pfile_cmp) : NULL;
}

/*
 * A set whose backing directory has no manifest, but DIR has its record
 * (a restart on a fresh backing directory, or retention removed it from
 * the SSD): judged by that record.  Complete at pfs where every file is in
 * DIR as recorded; a file not in the backing directory keeps cache and
 * ssd pending (only-in-pfs) until it is fetched.  Once all are here, the
 * record becomes the backing directory's manifest (*adopted) and the set
 * is judged as any other.  0, or -ENODATA: DIR has no record of it.
 */
static int evaluate_from_dir(struct fs_inode *dir, int dfd, struct eval *ev, bool *adopted)
{
	struct fs_pfile *pf;
	size_t npf, here = 0;
	char *text;
	int ret;

	*adopted = false;
	if (fs_persist_record_get(dir, &text, &pf, &npf))
		return -ENODATA;
	ev->m.text = text;
	ret = sets_manifest_parse(&ev->m);
	if (ret) {
		fs_persist_files_free(pf, npf);
		return -ENODATA;
	}
	for (size_t i = 0; i < ev->m.n; i++) {
		const struct mfile *f = &ev->m.f[i];
		const struct fs_pfile *p = pfile_find(pf, npf, f->name);
		bool indir = p && p->size == f->size && p->mtime.tv_sec == f->mtime.tv_sec &&
			     p->mtime.tv_nsec == f->mtime.tv_nsec;
		struct stat bst;
		bool local = fstatat(dfd, f->name, &bst, AT_SYMLINK_NOFOLLOW) == 0 &&
			     S_ISREG(bst.st_mode) && same(&bst, f);

		if (!indir) {
			ev->lv[L_PFS].bad++;
			problem(ev, f->name, "missing-in-pfs");
		}
		if (local) {
			here++;
		} else if (indir) {
			ev->lv[L_CACHE].pending++;
			ev->lv[L_SSD].pending++;
			problem(ev, f->name, "only-in-pfs");
		} else {
			ev->lv[L_CACHE].bad++;
			ev->lv[L_SSD].bad++;
			problem(ev, f->name, "missing");
		}
	}
	fs_persist_files_free(pf, npf);
	if (ev->m.n && here == ev->m.n && !ev->lv[L_PFS].bad) {
		struct manifest cur;

		/* all fetched: DIR's record is the backing directory's now */
		fs_ns_lock();
		if (sets_manifest_read(dfd, &cur) == -ENODATA)
			*adopted = !sets_manifest_write(dfd, &ev->m);
		else
			sets_manifest_free(&cur);
		fs_ns_unlock();
		if (*adopted)
			say(dir, LOG_INFO, "sets: %s: fetched from DIR whole, its record "
			    "adopted%s%s", "", "");
	}
	return 0;
}

/*
 * Judge set dir against its manifest: 0 with ev filled (eval_free it),
 * -ENODATA for a directory that is no set.  Levels reached for the first
 * time are recorded.
 */
static int evaluate(struct fs_inode *dir, struct eval *ev)
{
	bool adopted = false;
	int dfd, ret;

again:
	memset(ev, 0, sizeof(*ev));
	if (!S_ISDIR(dir->type))
		return -ENODATA;
	dfd = fs_fd_hold(dir);
	if (dfd < 0) {
		fs_fd_release(dir);
		return dfd;
	}
	ret = sets_manifest_read(dfd, &ev->m);
	if (ret == -ENODATA && fs_persist_on() && !adopted && dir != &fs.root) {
		ret = evaluate_from_dir(dir, dfd, ev, &adopted);
		fs_fd_release(dir);
		if (adopted) {
			eval_free(ev);
			goto again;
		}
		if (ret)
			eval_free(ev);
		return ret;
	}
	if (ret) {
		fs_fd_release(dir);
		return ret == -EIO ? -ENODATA : ret;
	}
	for (size_t i = 0; i < ev->m.n; i++)
		eval_file(dir, dfd, &ev->m.f[i], ev);
	if (ev->lv[L_PFS].unmarked && ev->lv[L_PFS].unmarked < ev->m.n) {
		/* some files not persistent: the set never gets to DIR whole */
		ev->lv[L_PFS].bad += ev->lv[L_PFS].unmarked;
		ev->lv[L_PFS].unmarked = 0;
		problem(ev, "-", "some-files-not-persistent");
	}
	for (int l = L_SSD; l < L_N; l++)
		if (complete(ev, l) && !ev->m.rec[l])
			record(dir, dfd, ev, l);
	if (complete(ev, L_PFS) && !ev->m.rec[L_PFS]) {
		/* its files are in DIR, its record not yet: not there as a set */
		ev->lv[L_PFS].pending++;
		problem(ev, "-", "record-pending");
	}
	fs_fd_release(dir);
	return 0;
}

static size_t put(char *buf, size_t len, size_t at, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static size_t put(char *buf, size_t len, size_t at, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	at += (size_t)vsnprintf(buf + at, at < len ? len - at : 0, fmt, ap);
	va_end(ap);
	return at;
}

/* user.tierfs.set: see tierfs-hints(7), CHECKPOINT SETS. */
static int state_text(struct fs_inode *dir, char *buf, size_t len)
{
	struct eval ev;
	const char *top = "none";
	size_t at = 0;
	int ret = evaluate(dir, &ev);

	if (ret)
		return ret;
	at = put(buf, len, at, "committed %lld.%09ld\nfiles %zu\nbytes %" PRIu64 "\n",
		 (long long)ev.m.committed.tv_sec, ev.m.committed.tv_nsec, ev.m.n, ev.m.bytes);
	for (int l = 0; l < L_N; l++) {
		const struct level *v = &ev.lv[l];

		at = put(buf, len, at, "%s ", sets_level_name[l]);
		if (complete(&ev, l)) {
			top = sets_level_name[l];
			if (ev.m.rec[l])
				at = put(buf, len, at, "complete %lld.%09ld\n",
					 (long long)ev.m.at[l].tv_sec, ev.m.at[l].tv_nsec);
			else
				at = put(buf, len, at, "complete\n");
		} else if (v->bad) {
			at = put(buf, len, at, "incomplete %zu\n", v->bad);
		} else if (l == L_PFS && v->unmarked == ev.m.n) {
			at = put(buf, len, at, "off\n");
		} else {
			at = put(buf, len, at, "pending %zu\n", v->pending + v->unmarked);
		}
	}
	at = put(buf, len, at, "level %s\n", top);
	if (ev.plen)
		at = put(buf, len, at, "%.*s", (int)ev.plen, ev.probs);
	if (ev.pmore)
		at = put(buf, len, at, "more %zu\n", ev.pmore);
	eval_free(&ev);
	return at >= len ? -ERANGE : (int)at;
}

/* ------------------------------------------------------------ retention */

/* The number of sets dir keeps: its user.tierfs.keep, else keep_sets. */
static unsigned keep_of(struct fs_inode *dir)
{
	char path[64], val[16];
	ssize_t n;
	long v = -1;
	int fd = fs_fd_hold(dir);

	if (fd >= 0 && !fs_proc_path(fd, path, sizeof(path))) {
		n = getxattr(path, KEEP_XATTR, val, sizeof(val));
		if (n > 0)
			v = parse_keep(val, (size_t)n);
	}
	fs_fd_release(dir);
	return v >= 0 ? (unsigned)v : sets.keep;
}

struct cand {
	char *name;
	struct fs_inode *in;		/* referenced */
	struct timespec committed;
	bool done[L_N];			/* complete at that level */
	bool busy, persistent;
};

static int newest_first(const void *a, const void *b)
{
	return sets_ts_cmp(&((const struct cand *)b)->committed, &((const struct cand *)a)->committed);
}

/* A child directory's inode (looked up, referenced), or NULL. */
static struct fs_inode *child_dir(struct fs_inode *dir, const char *name)
{
	struct fuse_entry_param e;
	struct fs_inode *in;

	if (fs_lookup(dir, name, &e))
		return NULL;
	in = fs_inode_of(e.ino);
	fs_inode_get(in);
	fs_forget_one(e.ino, 1);
	if (!S_ISDIR(in->type)) {
		fs_inode_put(in);
		return NULL;
	}
	return in;
}

/* Remove set c (a child of parent): its files, its manifest, itself. */
static bool remove_set(struct fs_inode *parent, struct cand *c)
{
	struct dirent *de;
	DIR *dp;
	int dfd = fs_fd_hold(c->in), rfd, ret = 0;

	rfd = dfd >= 0 ? openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	dp = rfd >= 0 ? fdopendir(rfd) : NULL;
	if (!dp) {
		if (rfd >= 0)
			close(rfd);
		fs_fd_release(c->in);
		return false;
	}
	while (!ret && (de = readdir(dp))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fs_hidden_name(de->d_name))
			continue;
		if (de->d_type == DT_DIR) {
			ret = -ENOTEMPTY;	/* not the set's: left to its owner */
			break;
		}
		ret = fs_remove_local(c->in, de->d_name, 0);
		if (!ret)
			fuse_lowlevel_notify_inval_entry(fs.se, fs_ino_of(c->in), de->d_name,
							 strlen(de->d_name));
	}
	closedir(dp);
	fs_fd_release(c->in);
	if (!ret)
		ret = fs_remove_local(parent, c->name, AT_REMOVEDIR);
	if (!ret) {
		fuse_lowlevel_notify_inval_entry(fs.se, fs_ino_of(parent), c->name,
						 strlen(c->name));
		say(parent, LOG_NOTICE, "sets: keep: removed %s/%s from the SSD%s", c->name, "");
	} else {
		say(c->in, LOG_NOTICE, "sets: keep: %s not removed: %s%s", strerror(-ret), "");
	}
	return !ret;
}

/*
 * Retention in directory parent: keep its N newest sets complete at ssd,
 * remove older complete ones (see the top of the file).
 */
static void retain(struct fs_inode *parent)
{
	unsigned keep = keep_of(parent);
	struct cand *c = NULL;
	size_t n = 0, cap = 0, i, kept = 0;
	struct dirent *de;
	DIR *dp;
	int dfd, rfd;
	bool newest[L_N] = { false };

	if (!keep)
		return;
	dfd = fs_fd_hold(parent);
	rfd = dfd >= 0 ? openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	dp = rfd >= 0 ? fdopendir(rfd) : NULL;
	if (!dp) {
		if (rfd >= 0)
			close(rfd);
		fs_fd_release(parent);
		return;
	}
	while ((de = readdir(dp))) {
		struct eval ev;
		struct fs_inode *in;

		if (de->d_type != DT_DIR || fs_hidden_name(de->d_name) ||
		    !strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		{
			char mp[NAME_MAX + 16];

			snprintf(mp, sizeof(mp), "%s/" MANIFEST, de->d_name);
			if (faccessat(rfd, mp, F_OK, AT_SYMLINK_NOFOLLOW) < 0)
				continue;	/* not a set: no lookup */
		}
		in = child_dir(parent, de->d_name);
		if (!in)
			continue;
		if (evaluate(in, &ev)) {
			fs_inode_put(in);
			continue;
		}
		if (n == cap) {
			struct cand *nc;

			cap = cap ? 2 * cap : 16;
			nc = realloc(c, cap * sizeof(*c));
			if (!nc) {
				eval_free(&ev);
				fs_inode_put(in);
				break;
			}
			c = nc;
		}
		c[n].name = strdup(de->d_name);
		c[n].in = in;
		c[n].committed = ev.m.committed;
		for (int l = 0; l < L_N; l++)
			c[n].done[l] = complete(&ev, l);
		c[n].busy = ev.busy;
		c[n].persistent = fs_persist_on() && ev.lv[L_PFS].unmarked < ev.m.n;
		eval_free(&ev);
		if (!c[n].name) {
			fs_inode_put(in);
			continue;
		}
		n++;
	}
	closedir(dp);
	fs_fd_release(parent);
	if (n)		/* c is NULL when the directory holds no set */
		qsort(c, n, sizeof(*c), newest_first);
	tlog(LOG_DEBUG, "sets: keep %u: %zu set(s) in a directory", keep, n);
	for (i = 0; i < n; i++) {
		bool mine = false;

		for (int l = 0; l < L_N; l++)
			if (c[i].done[l] && !newest[l])
				newest[l] = mine = true;	/* the newest complete at l */
		if (!c[i].done[L_SSD])
			continue;
		if (kept < keep) {
			kept++;
			continue;
		}
		if (mine || c[i].busy || (c[i].persistent && !c[i].done[L_PFS]))
			continue;
		if (remove_set(parent, &c[i])) {
			sets_lock();
			sets.removed++;
			sets_unlock();
		}
	}
	for (i = 0; i < n; i++) {
		fs_inode_put(c[i].in);
		free(c[i].name);
	}
	free(c);
}

/* ------------------------------------------------------------ watcher */

static void watch_add(struct fs_inode *dir, bool retain)
{
	struct watch *w = calloc(1, sizeof(*w));

	if (!w)
		return;		/* judged when asked, retention at the next commit */
	fs_inode_get(dir);
	w->dir = dir;
	w->retain = retain;
	sets_lock();
	if (!sets.started || sets.stop) {
		sets_unlock();
		fs_inode_put(dir);
		free(w);
		return;
	}
	w->next = sets.head;
	sets.head = w;
	pthread_cond_signal(&sets.cond);
	sets_unlock();
}

/* Directory dir's parent, if the inode table knows it (the kernel
 * looked it up: it did, to reach dir): referenced, or NULL. */
static struct fs_inode *parent_of(struct fs_inode *dir)
{
	struct fs_inode *p = NULL;
	struct stat st;
	int fd = fs_fd_hold(dir);

	if (fd >= 0 && fstatat(fd, "..", &st, AT_SYMLINK_NOFOLLOW) == 0) {
		fs_lock();
		p = fs_table_find(st.st_dev, st.st_ino);
		if (p && p != dir)
			fs_inode_get(p);
		else
			p = NULL;
		fs_unlock();
	}
	fs_fd_release(dir);
	return p;
}

/* Follow one watched set; true: done with it. */
static bool watch_one(struct watch *w)
{
	struct fs_inode *parent = NULL;
	struct eval ev;
	bool done;

	tlog(LOG_DEBUG, "sets: watching %p%s", (void *)w->dir, w->retain ? " (keep)" : "");
	if (w->retain) {
		retain(w->dir);
		return true;
	}
	if (evaluate(w->dir, &ev))
		return true;		/* no set any more */
	done = complete(&ev, L_SSD) && (complete(&ev, L_PFS) ||
					ev.lv[L_PFS].unmarked == ev.m.n || ev.lv[L_PFS].bad);
	if ((complete(&ev, L_SSD) && !w->kept) || (complete(&ev, L_PFS) && !w->kept_pfs)) {
		w->kept |= complete(&ev, L_SSD);
		w->kept_pfs |= complete(&ev, L_PFS);
		parent = parent_of(w->dir);
	}
	eval_free(&ev);
	if (parent) {
		retain(parent);
		fs_inode_put(parent);
	}
	return done;
}

static void *watcher(void *arg)
{
	double pause = 0.005;

	(void)arg;
	sets_lock();
	while (!sets.stop) {
		struct watch *list = sets.head, *keepl = NULL, *w;
		struct timespec until;

		sets.head = NULL;
		sets_unlock();
		while ((w = list)) {
			list = w->next;
			if (watch_one(w)) {
				fs_inode_put(w->dir);
				free(w);
			} else {
				w->next = keepl;
				keepl = w;
			}
		}
		sets_lock();
		while ((w = keepl)) {
			keepl = w->next;
			w->next = sets.head;
			sets.head = w;
		}
		if (sets.stop)
			break;
		if (sets.head) {
			pause = pause < 0.2 ? pause * 2 : 0.25;
			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_nsec += (long)(pause * 1e9);
			until.tv_sec += until.tv_nsec / 1000000000;
			until.tv_nsec %= 1000000000;
			pthread_cond_timedwait(&sets.cond, &sets.lock, &until);
		} else {
			pause = 0.005;
			pthread_cond_wait(&sets.cond, &sets.lock);
		}
	}
	sets_unlock();
	return NULL;
}

void fs_sets_start(void)
{
	sets_lock();
	sets.started = pthread_create(&sets.thr, NULL, watcher, NULL) == 0;
	if (!sets.started)
		tlog(LOG_WARNING, "sets: no watcher thread: levels are recorded when asked");
	sets_unlock();
}

void fs_sets_stop(void)
{
	struct watch *w;
	bool started;

	sets_lock();
	started = sets.started;
	sets.stop = true;
	pthread_cond_signal(&sets.cond);
	sets_unlock();
	if (started)
		pthread_join(sets.thr, NULL);
	sets_lock();
	while ((w = sets.head)) {
		sets.head = w->next;
		sets_unlock();
		fs_inode_put(w->dir);
		free(w);
		sets_lock();
	}
	sets_unlock();
}

/* ------------------------------------------------------------ xattrs */

bool fs_sets_xattr(const char *name)
{
	return !strcmp(name, TIERFS_XATTR_COMMIT) || !strcmp(name, TIERFS_XATTR_SET) ||
	       !strcmp(name, TIERFS_XATTR_KEEP);
}

int fs_sets_getx(struct fs_inode *in, const char *name, char *buf, size_t len)
{
	if (!strcmp(name, TIERFS_XATTR_SET))
		return state_text(in, buf, len);
	if (!strcmp(name, TIERFS_XATTR_KEEP)) {
		if (!S_ISDIR(in->type))
			return -ENODATA;
		return snprintf(buf, len, "%u", keep_of(in));
	}
	return -ENODATA;	/* commit: write-only */
}

/* user.tierfs.keep on a directory: kept on its backing directory. */
static int keep_set(struct fs_inode *in, const char *value, size_t size, bool remove)
{
	char path[64], v[24];
	long k = remove ? 0 : parse_keep(value, size);
	int fd, ret;

	if (!S_ISDIR(in->type))
		return -ENOTDIR;
	if (k < 0)
		return -EINVAL;
	fs_attrs_lock(in);
	fd = fs_fd_hold(in);
	ret = fd < 0 ? fd : fs_proc_path(fd, path, sizeof(path));
	if (!ret && remove)
		ret = removexattr(path, KEEP_XATTR) < 0 ? -errno : 0;
	else if (!ret) {
		snprintf(v, sizeof(v), "%ld", k);
		ret = setxattr(path, KEEP_XATTR, v, strlen(v), 0) < 0 ? -errno : 0;
	}
	fs_fd_release(in);
	fs_attrs_unlock(in);
	if (!ret && !remove)
		watch_add(in, true);	/* a smaller N applies now */
	return ret;
}

int fs_sets_setx(struct fs_inode *in, const char *name, const char *value, size_t size)
{
	if (!strcmp(name, TIERFS_XATTR_COMMIT))
		return commit(in);
	if (!strcmp(name, TIERFS_XATTR_KEEP))
		return keep_set(in, value, size, false);
	return -EPERM;		/* set: read-only */
}

int fs_sets_removex(struct fs_inode *in, const char *name)
{
	if (!strcmp(name, TIERFS_XATTR_KEEP))
		return keep_set(in, NULL, 0, true);
	return -EPERM;
}
