/*
 * fs_intent.c - new versions of files with several names: copied over the
 * file in place under a commit intent in the backing directory's journal
 * (fs_intent_copy, called by fs_version.c's commit), and the settler,
 * which syncs those files and retires their intents a moment later, many
 * at once.
 *
 * Locking: fs_intent_copy runs under the file's ilock, and fs.nslock and
 * its directory's names lock where it has a name (v_commit); the settler
 * takes each file's ilock alone, and settle.lock (a leaf) for its queue.
 * Calls fs_journal.c (the records), fs_fd.c (descriptors), fs_inode.c
 * (references), fs_locks.c, tiers/ (engine_settle_named) and store/ (the
 * copy, jnl_redo_write, the one a replay makes too).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "fs.h"
#include "journal.h"
#include "../common/fault.h"
#include "../common/log.h"

/*
 * Copy version fd's content over the file itself (ofd, held; a file with
 * other names), size it and (sync) sync it (jnl_redo_write, as a replay
 * does).
 * The version fd may be O_DIRECT, which copy_file_range (a splice
 * underneath) refuses for lengths that are not block multiples: both ends
 * are reopened buffered.
 */
static int copy_in_place(int ofd, int fd, bool sync)
{
	char path[64];
	struct stat st;
	int src, dst, ret;

	if (fstat(fd, &st) < 0)
		return -errno;
	fs_proc_path(fd, path, sizeof(path));
	src = backing_open(AT_FDCWD, path, O_RDONLY, 0);
	if (src < 0)
		return -errno;
	fs_proc_path(ofd, path, sizeof(path));
	dst = open(path, O_WRONLY | O_CLOEXEC);
	if (dst < 0) {
		ret = -errno;
		close(src);
		return ret;
	}
	ret = jnl_redo_write(src, dst, (uint64_t)st.st_size, sync);
	close(dst);
	close(src);
	return ret;
}

/*
 * New versions of files with several names: commit intents.
 *
 * A file with several names cannot be replaced by a rename (the other
 * names would keep the old version): its new version is copied over it.
 * A kill in the middle of that copy would leave it torn, so the copy is
 * guarded by a commit intent in the backing directory's one journal (a
 * JNL_REDO record, store/journal.h).  The complete, synced new version (an
 * O_TMPFILE in the backing root) is linked as BACKING/.tierfs.version.P.N
 * and the root synced; then the record that names the file (device,
 * inode, file handle, path), that version and its size is appended and
 * synced (fs_journal_intent): the commit point.  Then the version is
 * copied over the file and the commit is done; the settler (below) syncs
 * the file, retires the record durably and removes the version a moment
 * later, for many such copies at once.  The journal's one
 * replay (fs_journal.c: at start-up and by tierfs --recover) finishes a
 * copy cut short, in sequence order with the file's small changes made
 * before and after it, and removes the versions it leaves.
 *
 * A copy that fails leaves its record live (the replay finishes it) in
 * in->redo_seq (redo_copied false); the file's next intent retires it,
 * so that it is never replayed over a newer version, and meanwhile
 * no small change of the file is journalled (fs_journal_delta: the backing
 * file is not the base of one).  Where the file's handle is known, the
 * record names it by that, its path a hint, and no names lock is held
 * (commit_linked, fs_version.c); else fs.nslock is held throughout
 * (v_commit): the path keeps naming the file.  Where the mount has no
 * journal (its replay failed) or no name and no handle of the file is
 * known, the copy is made unjournalled, and the log says so.
 */

/*
 * The settler.  A copy made in place under a live intent need not be
 * synced before the commit returns: the intent is durable and names a
 * complete version, and a replay copies that version over the file again.
 * The intent is retired once the file is synced, and its version removed
 * after that retirement is durable.  fs_intent_copy queues the file
 * (settle_later, holding a reference on it); the settler thread takes
 * what came in the last SETTLE_MS, syncs each file and retires all their
 * intents with one journal sync.  A commit of a hard-linked file then
 * waits, where the backing log is ordered, for the root's sync (the
 * version's link) and the intent's, instead of three log commits
 * (RESULTS 18c).  A file committed again
 * before that retires the earlier intent itself (fs_intent_copy); the
 * retirement of an intent whose file cannot be synced waits for that
 * (the next start replays it).  fs_settle_end settles the rest before the
 * journal closes at exit.
 * Locking: settle.lock (LR_FS_SETTLE, a leaf) for the queue and each
 * queued inode's settle_queued; redo_* under the file's ilock, which the
 * settler takes for each file's sync and hand-over.
 */
#define SETTLE_MS	50
#define SETTLE_MAX	1024

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work;
	struct fs_inode *q[SETTLE_MAX];	/* each holds a reference */
	unsigned n;
	bool started, stop;
	pthread_t thr;
} settle = { .lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER };

/* Sync in's backing file: 0, or -errno (a file gone: 0, nothing to sync). */
static int sync_backing(struct fs_inode *in)
{
	char path[64];
	int fd = fs_fd_hold(in), rfd, ret;

	if (fd < 0) {
		fs_fd_release(in);
		return fd == -ENOENT || fd == -ESTALE ? 0 : fd;
	}
	fs_proc_path(fd, path, sizeof(path));
	rfd = open(path, O_RDONLY | O_CLOEXEC);
	ret = rfd < 0 || fsync(rfd) < 0 ? -errno : 0;
	if (rfd >= 0)
		close(rfd);
	fs_fd_release(in);
	return ret;
}

/* ilock held, intent seq (version vname) not in in->redo_*: the file
 * synced, seq retired durably, vname removed.  0 or -errno (live). */
static int settle_now(struct fs_inode *in, uint64_t seq, const char *vname)
{
	int ret = sync_backing(in);

	if (!ret)
		ret = fs_journal_retire_durably(seq);
	if (!ret)
		unlinkat(fs.root_fd, vname, 0);
	return ret;
}

/* ilock held: in queued for the settler.  false: no settler (not
 * started, stopping, or its queue full): the caller settles it. */
static bool settle_later(struct fs_inode *in)
{
	bool ok = true;

	ranked_lock(&settle.lock, LR_FS_SETTLE);
	if (!settle.started || settle.stop || settle.n == SETTLE_MAX)
		ok = false;
	else if (!in->settle_queued) {
		fs_inode_get(in);
		in->settle_queued = true;
		settle.q[settle.n++] = in;
		pthread_cond_signal(&settle.work);
	}
	ranked_unlock(&settle.lock, LR_FS_SETTLE);
	return ok;
}

/*
 * ilock held: in's done intent retired, its file synced first: the
 * retirement's seq (in's redo_* cleared, *vname its version's name to
 * remove once the retirement is durable), or 0 with nothing to retire, or
 * a file that could not be synced (it stays, not retried: a second fsync
 * after one that failed may succeed without the data, whose pages the
 * kernel has marked clean; the intent's replay copies the version again).
 * The retirement is appended here, under the ilock, before the intent
 * stops being in's: a small change of the file journalled after it
 * (fs_journal_delta refuses while an intent is live) comes after it in
 * the journal, and no replay can copy the intent's version over that
 * change.
 */
static uint64_t settle_take(struct fs_inode *in, char **vname)
{
	uint64_t seq = __atomic_load_n(&in->redo_seq, __ATOMIC_ACQUIRE), rs;
	int ret;

	*vname = NULL;
	if (!seq || !in->redo_copied)
		return 0;
	ret = sync_backing(in);
	rs = ret ? 0 : fs_journal_retire_one(seq);
	if (!rs) {
		tlog(LOG_WARNING, "inode %ju: its commit intent cannot be retired after its "
		     "new version was copied over it (%s): it stays live (the next start "
		     "finishes it)", (uintmax_t)in->number, strerror(ret ? -ret : EIO));
		return 0;
	}
	*vname = in->redo_version;
	in->redo_version = NULL;
	__atomic_store_n(&in->redo_copied, false, __ATOMIC_RELAXED);
	__atomic_store_n(&in->redo_seq, 0, __ATOMIC_RELEASE);
	return rs;
}

/* The n files v[] settled (nothing held): synced, their intents retired
 * with one journal sync, their versions removed; their references put. */
static void settle_batch(struct fs_inode **v, unsigned n)
{
	char **name = calloc(n, sizeof(*name));
	uint64_t rs = 0;
	int ret = -ENOMEM;

	if (name) {
		for (unsigned i = 0; i < n; i++) {
			fs_attrs_lock(v[i]);
			uint64_t r = settle_take(v[i], &name[i]);
			fs_attrs_unlock(v[i]);
			if (r > rs)
				rs = r;
		}
		ret = fs_journal_sync_to(rs);
		if (ret)	/* the files are synced: a replay copies the
				 * same bytes again; their versions stay for it */
			tlog(LOG_WARNING, "commit intents could not be retired (%s): the next "
			     "start finishes them", strerror(-ret));
	}
	/* the versions removed from the backing root, its mtime put back
	 * under its names lock (as a commit's link of them) */
	struct timespec rmt;
	bool rok;

	if (!ret && name) {
		fs_dirs_lock(&fs.root, NULL);
		fs_dir_mtime_get(fs.root_fd, &rmt, &rok);
		for (unsigned i = 0; i < n; i++)
			if (name[i])
				unlinkat(fs.root_fd, name[i], 0);
		fs_dir_mtime_put(fs.root_fd, &rmt, rok);
		fs_dirs_unlock(&fs.root, NULL);
	}
	for (unsigned i = 0; i < n; i++) {
		if (name)
			free(name[i]);
		fs_inode_put(v[i]);
	}
	free(name);
}

static void *settler_main(void *arg)
{
	static struct fs_inode *v[SETTLE_MAX];	/* the one settler's */
	unsigned n;

	(void)arg;
	ranked_lock(&settle.lock, LR_FS_SETTLE);
	for (;;) {
		while (!settle.n && !settle.stop)
			pthread_cond_wait(&settle.work, &settle.lock);
		if (!settle.n)
			break;
		if (!settle.stop) {	/* a group: what comes meanwhile */
			ranked_unlock(&settle.lock, LR_FS_SETTLE);
			usleep(SETTLE_MS * 1000);
			ranked_lock(&settle.lock, LR_FS_SETTLE);
		}
		n = settle.n;
		memcpy(v, settle.q, n * sizeof(v[0]));
		settle.n = 0;
		for (unsigned i = 0; i < n; i++)
			v[i]->settle_queued = false;
		ranked_unlock(&settle.lock, LR_FS_SETTLE);
		tierfs_delay("settle");	/* tests: a power cut first */
		settle_batch(v, n);
		ranked_lock(&settle.lock, LR_FS_SETTLE);
	}
	ranked_unlock(&settle.lock, LR_FS_SETTLE);
	return NULL;
}

/* See fs.h. */
void fs_settle_start(void)
{
	ranked_lock(&settle.lock, LR_FS_SETTLE);
	settle.started = pthread_create(&settle.thr, NULL, settler_main, NULL) == 0;
	ranked_unlock(&settle.lock, LR_FS_SETTLE);
}

/* See fs.h. */
void fs_settle_end(void)
{
	bool started;

	ranked_lock(&settle.lock, LR_FS_SETTLE);
	started = settle.started;
	settle.stop = true;
	pthread_cond_signal(&settle.work);
	ranked_unlock(&settle.lock, LR_FS_SETTLE);
	if (started)
		pthread_join(settle.thr, NULL);
}

/*
 * The path of backing file ofd (old: its stat), relative to the backing
 * root, for a commit intent: dir/name where that name still names it,
 * else what /proc says of ofd, else "" (the handle alone names it).  len
 * is rel's size, PATH_MAX at least.
 */
static void intent_path(struct fs_inode *dir, const char *name, int ofd,
			const struct stat *old, char *rel, size_t len)
{
	int ret = -ENOENT;

	if (dir && name) {
		int pfd = fs_fd_hold(dir);
		struct stat nst;

		if (pfd >= 0 && fstatat(pfd, name, &nst, AT_SYMLINK_NOFOLLOW) == 0 &&
		    nst.st_ino == old->st_ino && nst.st_dev == old->st_dev) {
			rel[0] = 0;
			ret = dir == &fs.root ? 0 : fs_fd_rel_path(pfd, rel, len - NAME_MAX - 2);
			if (!ret && rel[0])
				strcat(rel, "/");
			if (!ret)
				strncat(rel, name, NAME_MAX);
		}
		fs_fd_release(dir);
	}
	if (ret)
		ret = fs_fd_rel_path(ofd, rel, len);
	if (ret)
		rel[0] = 0;
}

/*
 * ilock held: intent seq (version vname) made in's, after its copy ended
 * with ret (0: done): the file's earlier intent retired durably, and this
 * one kept live (for the settler, or, failed, for the replay) or settled
 * now.  rel names the file in the log.  Returns ret, or settle_now's error.
 */
static int intent_hand_over(struct fs_inode *in, uint64_t seq, const char *vname,
			    const char *rel, int ret)
{
	uint64_t pending;

	/*
	 * The file's earlier intent (a copy that failed, or one the settler
	 * has not retired yet) is retired durably and its version removed:
	 * no replay may copy it over this one.
	 */
	pending = __atomic_load_n(&in->redo_seq, __ATOMIC_ACQUIRE);
	if (pending) {
		int dret = fs_journal_retire_durably(pending);

		if (dret)	/* a replay copies it, then this one over it */
			tlog(LOG_WARNING, "%s: an earlier commit intent of it could not be "
			     "retired (%s)", rel[0] ? rel : "(no name)", strerror(-dret));
		if (in->redo_version)
			unlinkat(fs.root_fd, in->redo_version, 0);
		free(in->redo_version);
		in->redo_version = NULL;
		__atomic_store_n(&in->redo_seq, 0, __ATOMIC_RELEASE);
	}
	/*
	 * This one stays live: a failed copy until the replay finishes it or
	 * the file's next intent retires it; a done one until the settler
	 * has synced the file and retired it (at once where there is no
	 * settler).
	 */
	in->redo_version = strdup(vname);
	if (!in->redo_version) {
		if (!ret)
			ret = settle_now(in, seq, vname);
		return ret;	/* failed: the replay finishes it */
	}
	__atomic_store_n(&in->redo_copied, ret == 0, __ATOMIC_RELEASE);
	__atomic_store_n(&in->redo_seq, seq, __ATOMIC_RELEASE);
	if (!ret && !settle_later(in)) {
		char *v = in->redo_version;

		in->redo_version = NULL;
		__atomic_store_n(&in->redo_copied, false, __ATOMIC_RELAXED);
		__atomic_store_n(&in->redo_seq, 0, __ATOMIC_RELEASE);
		ret = settle_now(in, seq, v);
		free(v);
	}
	return ret;
}

/*
 * Copy version fd over in's backing file ofd (held; old: its stat) under a
 * commit intent.  dir/name: a name of it (may be NULL).  in's ilock held,
 * and where a name is given its directory's names lock and fs.nslock
 * (v_commit; commit_linked gives none: the handle names the file).
 */
int fs_intent_copy(struct fs_inode *in, struct fs_inode *dir, const char *name, int ofd, int fd,
		   const struct stat *old)
{
	union {
		struct file_handle fh;
		char buf[sizeof(struct file_handle) + MAX_HANDLE_SZ];
	} h;
	char rel[PATH_MAX], vname[96];
	uint64_t seq = 0;
	uint32_t hlen = 0;
	struct stat st;
	int mnt, ret;

	intent_path(dir, name, ofd, old, rel, sizeof(rel));
	h.fh.handle_bytes = MAX_HANDLE_SZ;
	if (name_to_handle_at(ofd, "", &h.fh, &mnt, AT_EMPTY_PATH) == 0)
		hlen = (uint32_t)(sizeof(h.fh) + h.fh.handle_bytes);
	if (!rel[0] && !hlen) {
		tlog(LOG_WARNING, "inode %ju: no name or handle found for its commit intent: its "
		     "new version is copied in place unjournalled", (uintmax_t)old->st_ino);
		return copy_in_place(ofd, fd, true);
	}
	/*
	 * The version's data, its allocation and its name durable before the
	 * record: the version settled (engine_settle_named: its writes
	 * completed where the backing log is ordered, else an fsync), linked,
	 * and the root synced, which commits the log where it is ordered.
	 * Never left to the record's own sync: that commits the log only
	 * where the append grows the journal, and a journal written over
	 * (jnl_ring) changes no metadata.  (tests/test_crash_states.py has a
	 * hard-linked file; test_journal.py's commit intent in a journal
	 * written over.)
	 */
	ret = engine_settle_named(fs.eng, fd);
	if (ret < 0)
		return ret;
	if (fstat(fd, &st) < 0)
		return -errno;
	ret = fs_journal_keep(fd, "", vname, sizeof(vname));	/* its name durable first */
	if (ret) {
		tlog(LOG_WARNING, "inode %ju: cannot keep its new version for a commit intent "
		     "(%s): copied in place unjournalled", (uintmax_t)old->st_ino,
		     strerror(-ret));
		return copy_in_place(ofd, fd, true);
	}
	struct jnl_redo r = {
		.dev = old->st_dev, .ino = old->st_ino,
		.handle = hlen ? &h.fh : NULL, .handle_len = hlen,
		.path = rel[0] ? rel : NULL, .version = vname,
		.vino = st.st_ino, .size = (uint64_t)st.st_size,
	};
	ret = fs_journal_intent(&r, &seq);
	if (ret) {
		unlinkat(fs.root_fd, vname, 0);
		if (ret < 0)
			return ret;
		tlog(LOG_WARNING, "inode %ju: no journal for its commit intent: its new "
		     "version is copied in place unjournalled", (uintmax_t)old->st_ino);
		return copy_in_place(ofd, fd, true);
	}
	/* the intent, durable, supersedes the records of the fsyncs of a
	 * shadow committed here (tfile_shadow_records): retired before the
	 * intent can be */
	fs_journal_retire_shadow(in);
	tierfs_delay("intent_copy");
	static bool eio_once;

	if (tierfs_fault("inplace_copy_eio") && !__atomic_exchange_n(&eio_once, true,
								    __ATOMIC_RELAXED))
		ret = -EIO;	/* tests: the first copy fails, the file untouched */
	else
		ret = copy_in_place(ofd, fd, false);	/* the intent stays: see settle */
	if (ret)
		tlog(LOG_ERR, "%s: copying its new version in place failed (%s); journal "
		     "record %" PRIu64 " keeps it (%s)", rel[0] ? rel : "(no name)",
		     strerror(-ret), seq, vname);
	return intent_hand_over(in, seq, vname, rel, ret);
}
