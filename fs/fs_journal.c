/*
 * fs_journal.c - the backing directory's one journal (store/journal.c) as
 * the daemon uses it (fs.journal, to which the persistent tier appends its
 * queue as notes, persist_journal.c): small changes made durable as
 * records (struct tfile_ops' journal_delta, journal_sync, journal_apply,
 * journal_retire, called by the engine's journal flush, tiers/flush_journal.c),
 * the notes kept by the replay for their reader, the commit intents of new
 * versions copied over hard-linked files (fs_journal_intent, called by
 * fs_version.c), the clone records of new files that are an earlier
 * version but for a few chunks (tfile_ops.journal_clone, called by the
 * dedup flush, tiers/dedup_flush.c; retired by fs_journal_clone_done at
 * the durable commit of the file's version, fs_version.c), the one replay at start-up and by `tierfs --recover`, the
 * journal's removal at a clean exit, and its counts in the statistics
 * (user.tierfs.stats' "journal", read by fs_xattr.c).
 *
 * BACKING/.tierfs.journal holds the records of changes that were made
 * durable there and may not be in their files yet; without the
 * persistent tier, BACKING/.tierfs.journal.1 too, the two taken in turn
 * (jnl_ring: their blocks written over, a record's sync changes no
 * metadata).  A record names its
 * file by its path beneath the backing root, else (renamed since) by the
 * backing file's handle (open_by_handle_at), and only where that is still
 * the inode it names (a file removed or replaced since is never written).
 * Replay applies the live records in sequence order (jnl_replay), deltas
 * and intents alike, before anything else reads the backing directory;
 * once the journal is empty, durably, it removes the versions the intents
 * and the clone records kept (BACKING/.tierfs.version.*).  Then, once, what the redo journal of
 * earlier releases left (BACKING/.tierfs.redo.*; minimal, see legacy_one):
 * its records came later than any delta of the same file.
 *
 * Locking: journal_apply holds the file's ilock (fs_attrs_lock) across its
 * write, as every commit of a version of it does; journal_delta takes no fs
 * lock but fs.lock for a look at the inode, and the journal's own
 * (jnl.lock, a leaf); fs_journal_intent and fs_journal_retire_durably run
 * under the ilock, fs.nslock and names locks of the commit (v_commit) and
 * take only jnl.lock.  Calls store/ (the journal), fs_fd.c (descriptors,
 * fs_fd_rel_path), persist_names.c (the persistent tier's intent and
 * commit, as for any change in place).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>
#include <linux/openat2.h>

#include "../common/json.h"
#include "fs.h"
#include "journal.h"

#define JOURNAL_NAME	FS_HIDDEN_PREFIX ".journal"
/* Its second file (jnl_ring), written in turn with the first past this
 * length; TIERFS_JOURNAL_RING=BYTES in the environment sets it (tests;
 * 0: one file). */
#define JOURNAL_NAME1	JOURNAL_NAME ".1"
#define JOURNAL_RING	(32u << 20)

static struct jnl jnl = { .fd = -1 };
static uint64_t replayed;	/* live records applied by the last replay */

static struct fs_inode *in_of(struct tfile *f)
{
	return (struct fs_inode *)((char *)f - offsetof(struct fs_inode, tf));
}

/* The journal's ranges of the engine's (drange: start, end; zero: those
 * that read as zeros, or NULL). */
static struct jnl_range *ranges_of(const struct drange *r, const bool *zero, uint32_t n)
{
	struct jnl_range *jr = malloc(((size_t)n ? n : 1) * sizeof(*jr));

	for (uint32_t i = 0; jr && i < n; i++)
		jr[i] = (struct jnl_range){ r[i].start, (r[i].end - r[i].start) |
							(zero && zero[i] ? JNL_ZERO : 0) };
	return jr;
}

/* Record seq of in retired (not synced): the retirement's seq noted in
 * in->jretired, for fs_journal_retired_durable. */
static void retire_of(struct fs_inode *in, uint64_t seq)
{
	uint64_t rs = jnl_retire(&jnl, seq);

	fs_atomic_max(&in->jretired, rs ? rs : UINT64_MAX);	/* 0: still live */
}

/* See fs.h. */
int fs_journal_retired_durable(struct fs_inode *in)
{
	uint64_t rs = __atomic_load_n(&in->jretired, __ATOMIC_RELAXED);
	uint64_t fr = __atomic_load_n(&fs.jretired_gone, __ATOMIC_RELAXED);

	if (rs == UINT64_MAX || fr == UINT64_MAX)
		return -EIO;		/* a record stays live */
	if (fr > rs)
		rs = fr;
	return jnl.fd < 0 || !rs ? 0 : jnl_sync(&jnl, rs);
}

/* How a record names its backing file (store/journal.h: struct jnl_delta). */
struct ident {
	struct stat st;
	union {
		struct file_handle fh;
		char buf[sizeof(struct file_handle) + MAX_HANDLE_SZ];
	} h;
	uint32_t hlen;
	char rel[PATH_MAX];
};

/*
 * in's backing file's identity for a record of it (id), where in can have
 * one now: 0; 1 where not (no journal, or none now; removed; an intent or
 * a clone record of it live; a file capability; nothing a replay could
 * find it by); or -errno.
 */
static int ident_of(struct fs_inode *in, struct ident *id)
{
	char path[64];
	bool gone;
	int fd, mnt, ret = 0;

	if (jnl.fd < 0 || jnl_failed(&jnl))
		return 1;	/* no journal, or none now: a new version */
	fs_lock();
	gone = in->unlinked;
	fs_unlock();
	if (gone)
		return 1;	/* a new version adopts or drops it */
	if (__atomic_load_n(&in->redo_seq, __ATOMIC_ACQUIRE) ||
	    __atomic_load_n(&in->clone_seq, __ATOMIC_ACQUIRE))
		return 1;	/* an intent of it is live (its copy failed, or
				 * the settler has not retired it yet), or a
				 * clone record (its version failed): a delta
				 * applied and retired before it would be undone
				 * by its replay; a new version retires it */
	id->hlen = 0;
	fd = fs_fd_hold(in);
	if (fd < 0 || fstatat(fd, "", &id->st, AT_EMPTY_PATH) < 0) {
		ret = fd < 0 ? fd : -errno;
		goto out_fd;
	}
	fs_proc_path(fd, path, sizeof(path));
	/* a file capability would go with our write (as v_small says); a
	 * live clone record's base keeps its content until the record is
	 * retired (its replay clones it): its change is a new version */
	if (!S_ISREG(id->st.st_mode) || getxattr(path, "security.capability", NULL, 0) >= 0 ||
	    fs_journal_is_base(id->st.st_dev, id->st.st_ino)) {
		ret = 1;
		goto out_fd;
	}
	id->h.fh.handle_bytes = MAX_HANDLE_SZ;
	if (name_to_handle_at(fd, "", &id->h.fh, &mnt, AT_EMPTY_PATH) == 0)
		id->hlen = (uint32_t)(sizeof(id->h.fh) + id->h.fh.handle_bytes);
	if (fs_fd_rel_path(fd, id->rel, sizeof(id->rel)))
		id->rel[0] = 0;
	if (!id->hlen && !id->rel[0])
		ret = 1;	/* nothing a replay could find it by */
out_fd:
	fs_fd_release(in);
	return ret;
}

/* The delta of a record of in (identity id, ranges jr). */
static struct jnl_delta delta_of(struct fs_inode *in, const struct ident *id,
				 const struct jnl_range *jr, uint32_t n, uint64_t size)
{
	struct timespec mt = tfile_mtime(&in->tf);

	return (struct jnl_delta){
		.dev = id->st.st_dev, .ino = id->st.st_ino, .size = size,
		.mtime_sec = mt.tv_sec, .mtime_nsec = mt.tv_nsec,
		.handle = id->hlen ? &id->h.fh : NULL, .handle_len = id->hlen,
		.path = id->rel[0] ? id->rel : NULL, .r = jr, .n = n,
	};
}

/* tfile_ops.journal_delta: see tfile.h. */
int fs_journal_delta(struct tfile *f, const void *base, const struct drange *r,
		     const bool *zero, uint32_t n, uint64_t size, uint64_t *seq, bool sync)
{
	struct fs_inode *in = in_of(f);
	struct jnl_range *jr;
	struct ident id;
	int ret = ident_of(in, &id);

	if (ret)
		return ret;
	jr = ranges_of(r, zero, n);
	if (!jr)
		return -ENOMEM;
	/* DIR's copy of the change: its intent ahead of the record in the
	 * journal, synced with it.  A replay that applies the record finds
	 * it (a kill before the apply would otherwise leave DIR the old
	 * file); the record keeps it there until it is retired. */
	fs_ns_intent(in, false);
	struct jnl_delta d = delta_of(in, &id, jr, n, size);

	ret = jnl_delta_append(&jnl, &d, base, seq);
	free(jr);
	tierfs_fault_kill("journal_appended");
	uint64_t held = ret || !fs.eng ? 0 : jnl_ring_blocker(&jnl);

	if (held)
		engine_journal_held(fs.eng, held);	/* the ring waits */
	if (!ret && sync && (ret = jnl_sync(&jnl, *seq)))
		retire_of(in, *seq);	/* perhaps durable: the retry journals
					 * the change again, no replay applies it */
	return ret;
}

/*
 * The journal's own links of users' files.  A clone record's base is the
 * backing file of another checkpoint, linked under a hidden name while the
 * record is live: that link is no name of the file's, and the link counts
 * the mount reports leave it out (fs_journal_fstat).  bases holds the
 * backing inodes so linked, with how many links each; a link and its entry
 * change between base_begin and base_end, which move active and gen, so
 * that a reader whose fstat and look at the table saw no change between
 * them knows they are of one moment.
 */
static struct {
	pthread_mutex_t lock;		/* LR_FS_BASES (a leaf): v, n, cap */
	struct base_link { dev_t dev; ino_t ino; unsigned links; } *v;
	unsigned n, cap;		/* n: read atomically too */
	unsigned long gen, active;	/* atomic */
} bases = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void base_begin(void)
{
	__atomic_add_fetch(&bases.active, 1, __ATOMIC_SEQ_CST);
}

static void base_end(void)
{
	__atomic_add_fetch(&bases.gen, 1, __ATOMIC_SEQ_CST);
	__atomic_sub_fetch(&bases.active, 1, __ATOMIC_SEQ_CST);
}

/* dev/ino's links by the journal counted up or down (d).  false where a
 * link up found no room for its entry (then it is not counted, and the
 * caller takes the link away: an inode the table does not know could be
 * written in place while a record depends on it). */
static bool base_count(dev_t dev, ino_t ino, int d)
{
	bool ok = true;
	unsigned i;

	ranked_lock(&bases.lock, LR_FS_BASES);
	for (i = 0; i < bases.n; i++)
		if (bases.v[i].dev == dev && bases.v[i].ino == ino)
			break;
	if (i == bases.n && d > 0) {
		if (bases.n == bases.cap) {
			unsigned cap = bases.cap ? bases.cap * 2 : 16;
			struct base_link *v = realloc(bases.v, cap * sizeof(*v));

			if (!v) {
				ok = false;
				goto out;
			}
			bases.v = v;
			bases.cap = cap;
		}
		bases.v[i] = (struct base_link){ dev, ino, 0 };
		__atomic_store_n(&bases.n, bases.n + 1, __ATOMIC_SEQ_CST);
	}
	if (i == bases.n)
		goto out;
	if (d > 0)
		bases.v[i].links++;
	else if (bases.v[i].links && !--bases.v[i].links) {
		bases.v[i] = bases.v[bases.n - 1];
		__atomic_store_n(&bases.n, bases.n - 1, __ATOMIC_SEQ_CST);
	}
out:
	ranked_unlock(&bases.lock, LR_FS_BASES);
	return ok;
}

/* The journal's link name of dev/ino removed. */
static void base_unlink(const char *name, dev_t dev, ino_t ino)
{
	base_begin();
	base_count(dev, ino, -1);
	unlinkat(fs.root_fd, name, 0);
	base_end();
}

/* fs_journal_keep (fs.h), where base is not NULL counting the link as
 * the journal's link of base's backing inode (a clone record's base). */
static int keep(int fd, const char *tag, char *name, size_t len, const struct stat *base)
{
	static uint64_t counter;
	char path[64];
	int ret = 0;

	if (snprintf(name, len, FS_INTENT_PREFIX "%s%lx.%" PRIu64, tag, (unsigned long)getpid(),
		     __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED)) >= (int)len)
		return -ENAMETOOLONG;
	fs_proc_path(fd, path, sizeof(path));
	if (base)
		base_begin();
	if (linkat(AT_FDCWD, path, fs.root_fd, name, AT_SYMLINK_FOLLOW) < 0)
		ret = -errno;
	else if (base && !base_count(base->st_dev, base->st_ino, 1)) {
		unlinkat(fs.root_fd, name, 0);
		ret = -ENOMEM;
	}
	if (base)
		base_end();
	if (ret)
		return ret;
	ret = fs_fd_sync_dir(fs.root_fd);
	if (ret && base)
		base_unlink(name, base->st_dev, base->st_ino);
	else if (ret)
		unlinkat(fs.root_fd, name, 0);
	return ret;
}

/* See fs.h. */
int fs_journal_fstat(int fd, struct stat *st, int flags)
{
	for (int tries = 0;; tries++) {
		unsigned long gen = __atomic_load_n(&bases.gen, __ATOMIC_SEQ_CST);
		bool quiet = !__atomic_load_n(&bases.active, __ATOMIC_SEQ_CST);
		unsigned links = 0;

		if (fstatat(fd, "", st, flags | AT_EMPTY_PATH) < 0)
			return -errno;
		if (!__atomic_load_n(&bases.n, __ATOMIC_SEQ_CST) && quiet &&
		    __atomic_load_n(&bases.gen, __ATOMIC_SEQ_CST) == gen)
			return 0;	/* no link of the journal's, then or now */
		if (!S_ISREG(st->st_mode))
			return 0;
		ranked_lock(&bases.lock, LR_FS_BASES);
		for (unsigned i = 0; i < bases.n; i++)
			if (bases.v[i].dev == st->st_dev && bases.v[i].ino == st->st_ino)
				links = bases.v[i].links;
		ranked_unlock(&bases.lock, LR_FS_BASES);
		if ((quiet && __atomic_load_n(&bases.active, __ATOMIC_SEQ_CST) == 0 &&
		     __atomic_load_n(&bases.gen, __ATOMIC_SEQ_CST) == gen) || tries == 64) {
			/* after 64 changes in its way (never seen): as read */
			st->st_nlink -= links < st->st_nlink ? links : st->st_nlink;
			return 0;
		}
		sched_yield();	/* a link being made or removed: a moment */
	}
}

/* See fs.h. */
bool fs_journal_no_bases(void)
{
	return !__atomic_load_n(&bases.n, __ATOMIC_SEQ_CST);
}

/* See fs.h. */
bool fs_journal_is_base(dev_t dev, ino_t ino)
{
	bool live = false;

	/* n is stored under the lock before the link's maker looks at what
	 * would change the base (fs_journal_clone): seen here, or it sees */
	if (fs_journal_no_bases())
		return false;
	ranked_lock(&bases.lock, LR_FS_BASES);
	for (unsigned i = 0; i < bases.n && !live; i++)
		live = bases.v[i].dev == dev && bases.v[i].ino == ino;
	ranked_unlock(&bases.lock, LR_FS_BASES);
	return live;
}

/*
 * A link(2) of a file and its taking as a clone record's base exclude each
 * other: the new version of a file of several names is copied over its
 * inode (fs_version.c), which the record's replay clones.  So a base of
 * several names is refused (fs_journal_clone, under links_mu from the
 * base's count to the look at its names), and a file that is a live base
 * gets a second name only once its record is retired (fs_ns_link, its
 * linkat under links_mu).
 */
static pthread_mutex_t links_mu = PTHREAD_MUTEX_INITIALIZER;	/* LR_FS_LINKS */

/* See fs.h. */
bool fs_journal_link_begin(int fd, bool force)
{
	struct stat st;

	ranked_lock(&links_mu, LR_FS_LINKS);
	/* bases are counted under links_mu (fs_journal_clone): none now, none
	 * until fs_journal_link_end, and no fstat for the link */
	if (force || fs_journal_no_bases() || fstat(fd, &st) < 0 ||
	    !fs_journal_is_base(st.st_dev, st.st_ino))
		return true;
	ranked_unlock(&links_mu, LR_FS_LINKS);
	return false;
}

/* See fs.h. */
void fs_journal_link_end(void)
{
	ranked_unlock(&links_mu, LR_FS_LINKS);
}

/* See fs.h. */
bool fs_journal_base_wait(dev_t dev, ino_t ino, double max_s)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (fs_journal_is_base(dev, ino)) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 >= max_s)
			return false;
		usleep(5000);
	}
	return true;
}

/*
 * tfile_ops.journal_clone: see tfile.h.  The base (a version in the chunk
 * index, bfd) is linked under a hidden name in the backing root and that
 * made durable (its data, then the root) before the record, which names
 * it; the record is then appended and synced.  The root's sync does a
 * second job: the file recorded is mostly a new one (the next checkpoint
 * of a series), whose own name nothing else makes durable before its
 * fsync returns at the record (no version is renamed over it yet, so
 * v_sync_meta finds no rename to sync), and once the journal's files are
 * written over a record's sync forces no log of the backing file system
 * (tests/test_power_cut.py, a clone record of a new file; bench/RESULTS.md
 * 9o).  One clone record of a file
 * at a time: while one is live (its version failed) the next flush just
 * writes its version, whose durable commit retires it.  Runs under in's
 * ilock, as its commits do.
 */
int fs_journal_clone(struct tfile *f, int bfd, const void *data, const struct drange *r,
		     uint32_t n, uint64_t size, uint64_t *seq, bool (*base_ok)(void *),
		     void *arg)
{
	struct fs_inode *in = in_of(f);
	char bname[sizeof(in->clone_base)];
	struct jnl_range *jr;
	struct ident id;
	struct stat bst, nst;
	int ret;

	fs_attrs_lock(in);
	ret = ident_of(in, &id);
	if (ret)
		goto out;
	if (fstat(bfd, &bst) < 0 || !S_ISREG(bst.st_mode) || bst.st_dev != id.st.st_dev ||
	    bst.st_ino == id.st.st_ino) {
		ret = 1;	/* not a base a replay could clone (the file's own
				 * inode: the replay writes it) */
		goto out;
	}
	ret = fsync(bfd) < 0 ? -errno : 0;
	if (!ret) {
		ranked_lock(&links_mu, LR_FS_LINKS);
		ret = keep(bfd, "b", bname, sizeof(bname), &bst);
		/* counted as a base from here on, the inode is never written
		 * in place (ident_of, v_commit) nor linked (fs_ns_link); one
		 * of several names is refused: its next version would be
		 * copied over it in place */
		if (!ret && (fs_journal_fstat(bfd, &nst, 0) || nst.st_nlink > 1))
			ret = 1;
		ranked_unlock(&links_mu, LR_FS_LINKS);
	}
	if (ret < 0) {
		ret = ret == -ENOENT ? 1 : ret;	/* the base has no name left */
		goto out;
	}
	/* a writer that looked before the count sees its change in base_ok:
	 * the engine's version of the base moved on */
	if (!ret && !base_ok(arg))
		ret = 1;
	jr = ret ? NULL : ranges_of(r, NULL, n);
	if (!ret && !jr)
		ret = -ENOMEM;
	if (!ret) {
		struct jnl_base b = { .name = bname, .ino = bst.st_ino,
				      .size = (uint64_t)bst.st_size };
		struct jnl_delta d = delta_of(in, &id, jr, n, size);

		fs_ns_intent(in, false);	/* as fs_journal_delta's */
		ret = jnl_clone_append(&jnl, &b, &d, data, seq);
		free(jr);
		tierfs_fault_kill("clone_appended");
		if (!ret && (ret = jnl_sync(&jnl, *seq)))
			retire_of(in, *seq);	/* perhaps durable: passed over by
						 * a replay once the version is in */
	}
	if (ret) {
		base_unlink(bname, bst.st_dev, bst.st_ino);
		goto out;
	}
	memcpy(in->clone_base, bname, sizeof(bname));
	in->clone_dev = bst.st_dev;
	in->clone_ino = bst.st_ino;
	__atomic_store_n(&in->clone_seq, *seq, __ATOMIC_RELEASE);
out:
	fs_attrs_unlock(in);
	return ret;
}

/* See fs.h. */
void fs_journal_clone_done(struct fs_inode *in)
{
	char bname[sizeof(in->clone_base)];
	uint64_t seq;
	dev_t dev;
	ino_t ino;

	fs_attrs_lock(in);
	seq = __atomic_load_n(&in->clone_seq, __ATOMIC_ACQUIRE);
	memcpy(bname, in->clone_base, sizeof(bname));
	dev = in->clone_dev;
	ino = in->clone_ino;
	__atomic_store_n(&in->clone_seq, 0, __ATOMIC_RELEASE);
	fs_attrs_unlock(in);
	/* a record that stays live (its retirement not durable) is passed
	 * over by a replay (its file is the new version now), and its base's
	 * link goes with the journal's next emptying at a start-up */
	if (seq && !fs_journal_retire_durably(seq))
		base_unlink(bname, dev, ino);
}

/* See fs.h. */
void fs_journal_retire_shadow(struct fs_inode *in)
{
	uint32_t n;
	const uint64_t *seq = tfile_shadow_records(&in->tf, &n);

	for (uint32_t i = 0; jnl.fd >= 0 && i < n; i++)
		retire_of(in, seq[i]);
}

/* tfile_ops.journal_sync: see tfile.h. */
int fs_journal_sync(struct tfile *f, uint64_t seq)
{
	(void)f;
	return jnl.fd < 0 ? -EBADF : jnl_sync(&jnl, seq);
}

/* tfile_ops.journal_apply: see tfile.h. */
int fs_journal_apply(struct tfile *f, const void *base, const struct drange *r, const bool *zero,
		     uint32_t n, uint64_t size, int *fdp)
{
	struct fs_inode *in = in_of(f);
	struct timespec mt = tfile_mtime(f);
	struct jnl_range *jr = ranges_of(r, zero, n);
	char path[64];
	int fd, ret;

	if (!jr)
		return -ENOMEM;
	if (tierfs_fault("journal_apply_eio")) {	/* tests: the record stays */
		free(jr);
		return -EIO;
	}
	fs_attrs_lock(in);
	fd = fs_fd_hold(in);
	if (fd >= 0) {
		fs_proc_path(fd, path, sizeof(path));
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			fd = -errno;
	}
	fs_fd_release(in);
	if (fd < 0) {
		fs_attrs_unlock(in);
		free(jr);
		return fd;
	}
	if (n && tierfs_fault("journal_apply_torn")) {
		/* a kill in the middle of the apply (tests) */
		struct jnl_range half = { jr[0].off, jr[0].len / 2 };

		jnl_delta_write(fd, &half, 1, base, size, 0, 0, true);
		raise(SIGKILL);
	}
	ret = jnl_delta_write(fd, jr, n, base, size, mt.tv_sec, mt.tv_nsec, !fdp);
	fs_attrs_unlock(in);
	if (!ret && fdp)
		*fdp = fd;	/* the caller's, to sync */
	else
		close(fd);
	free(jr);
	if (!ret && fs_persist_on()) {
		fs_ns_lock();
		fs_ns_committed(in);	/* in order with renames */
		fs_ns_unlock();
	}
	return ret;
}

/* tfile_ops.journal_retire: see tfile.h. */
void fs_journal_retire(struct tfile *f, uint64_t seq)
{
	if (jnl.fd >= 0)
		retire_of(in_of(f), seq);
}

/* tfile_ops.journal_settle: see tfile.h. */
int fs_journal_settle(struct tfile *f, uint64_t seq)
{
	struct fs_inode *in = in_of(f);
	char why[128];
	uint64_t len;
	uint16_t type;
	void *p;
	int ret;

	if (jnl.fd < 0)
		return 0;
	ret = jnl_read(&jnl, seq, &type, &p, &len);
	if (ret == -ENOENT)
		return 0;	/* the journal was emptied: nothing of it is live */
	if (ret)
		return ret;
	fs_attrs_lock(in);
	ret = type == JNL_DELTA ? jnl_delta_apply(fs.root_fd, p, len, why, sizeof(why)) : 0;
	fs_attrs_unlock(in);
	free(p);
	if (ret < 0)
		return ret;
	return fs_journal_retire_durably(seq);
}

/* See fs.h. */
int fs_journal_keep(int fd, const char *tag, char *name, size_t len)
{
	return keep(fd, tag, name, len, NULL);
}

/* See fs.h. */
int fs_journal_intent(const struct jnl_redo *r, uint64_t *seq)
{
	int ret;

	if (jnl.fd < 0)
		return 1;
	ret = jnl_redo_append(&jnl, r, seq);
	if (ret)
		return ret;
	tierfs_fault_kill("redo_appended");
	ret = jnl_sync(&jnl, *seq);
	if (ret)
		jnl_retire(&jnl, *seq);	/* no copy follows it */
	return ret;
}

/* See fs.h. */
uint64_t fs_journal_retire_one(uint64_t seq)
{
	return jnl.fd < 0 ? 0 : jnl_retire(&jnl, seq);
}

/* See fs.h. */
int fs_journal_sync_to(uint64_t rs)
{
	return jnl.fd < 0 || !rs ? 0 : jnl_sync(&jnl, rs);
}

/* See fs.h. */
int fs_journal_retire_durably(uint64_t seq)
{
	uint64_t rs = fs_journal_retire_one(seq);

	return jnl.fd < 0 ? 0 : rs ? fs_journal_sync_to(rs) : -EIO;
}

/* jnl_replay's fn: a delta or an intent applied to its file beneath the
 * root (arg), a note kept. */
static int replay_one(void *arg, uint16_t type, uint64_t seq, const void *p, uint64_t len)
{
	char why[PATH_MAX + 128];
	int ret;

	if (type == JNL_NOTE)
		return JNL_KEEP;	/* the persistent tier's: jnl_take_notes() */
	if (type == JNL_DELTA) {
		ret = jnl_delta_apply(*(int *)arg, p, len, why, sizeof(why));
		if (ret == 1)
			tlog(LOG_INFO, "journal record %" PRIu64 ": its file is %s; passed over",
			     seq, why);
	} else if (type == JNL_CLONE) {
		ret = jnl_clone_apply(*(int *)arg, p, len, why, sizeof(why));
		if (ret == 1)
			tlog(LOG_WARNING, "journal record %" PRIu64 " (a new version made of "
			     "another's and a few changes): %s; passed over", seq, why);
	} else if (type == JNL_REDO) {
		ret = jnl_redo_apply(*(int *)arg, p, len, why, sizeof(why));
		if (ret == 1)
			tlog(LOG_WARNING, "journal record %" PRIu64 " (a new version copied over "
			     "a file with several names): %s; passed over", seq, why);
		else if (!ret)
			tlog(LOG_NOTICE, "journal record %" PRIu64 ": finished an update cut "
			     "short by the previous daemon's end (a new version copied over a "
			     "file with several names)", seq);
	} else {
		tlog(LOG_WARNING, "journal record %" PRIu64 " of an unknown type %u: left",
		     seq, type);
		return -EINVAL;
	}
	if (ret < 0)
		tlog(LOG_ERR, "journal record %" PRIu64 " could not be applied: %s%s%s", seq,
		     strerror(-ret), why[0] != '-' ? ": " : "", why[0] != '-' ? why : "");
	return ret;
}

/* fs_sweep_names() of the backing root, a failure logged. */
static void sweep(int root_fd, const char *prefix, bool (*keep)(int dfd, const char *name))
{
	int ret = fs_sweep_names(root_fd, prefix, keep);

	if (ret)
		tlog(LOG_ERR, "cannot read the backing directory for what its journal left: "
		     "%s", strerror(-ret));
}

/*
 * The redo journal of the release before the one journal, read once, for
 * an upgrade; nothing writes it any more, and this reader is kept minimal.
 * A backing directory that release left after a crash may hold records
 * BACKING/.tierfs.redo.N.h, "tierfs-redo 1\n" DEV " " INO " " SIZE "\n"
 * PATH, each with its complete new version BACKING/.tierfs.redo.N.  A
 * record whose version is there with SIZE bytes, and whose PATH (beneath
 * the root, no symlinks followed) is still inode DEV INO, is finished: the
 * version copied over the file (jnl_redo_write).  Then the record goes
 * (the root synced: a record that came back would copy an old version
 * over a newer one), then its version.  A record whose copy fails stays,
 * with its version, for the next start.  Every other .tierfs.redo.* goes.
 */
#define LEGACY_PREFIX	FS_HIDDEN_PREFIX ".redo."
#define LEGACY_MAGIC	"tierfs-redo 1\n"

static bool legacy_record(const char *name)
{
	size_t l = strlen(name);

	return !strncmp(name, LEGACY_PREFIX, strlen(LEGACY_PREFIX)) && l > 2 &&
	       !strcmp(name + l - 2, ".h");
}

/* Finish legacy record rname of directory dfd: false where it stays. */
static bool legacy_one(int dfd, const char *rname)
{
	char buf[PATH_MAX + 128], vname[NAME_MAX + 1], *rel, *end;
	uintmax_t dev, ino;
	uint64_t size;
	struct stat vst, tst;
	ssize_t n = -1;
	int rfd, vfd = -1, tfd = -1, ret;
	bool done = true;

	snprintf(vname, sizeof(vname), "%.*s", (int)(strlen(rname) - 2), rname);
	rfd = openat(dfd, rname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (rfd >= 0) {
		n = read(rfd, buf, sizeof(buf) - 1);
		close(rfd);
	}
	if (n > 0)
		buf[n] = 0;
	end = n > 0 ? strchr(buf + strlen(LEGACY_MAGIC), '\n') : NULL;
	if (n <= (ssize_t)strlen(LEGACY_MAGIC) || strncmp(buf, LEGACY_MAGIC, strlen(LEGACY_MAGIC)) ||
	    sscanf(buf + strlen(LEGACY_MAGIC), "%ju %ju %" SCNu64, &dev, &ino, &size) != 3 ||
	    !end || !end[1]) {
		tlog(LOG_WARNING, "journal %s: unreadable record; removed", rname);
		goto out;
	}
	rel = end + 1;
	vfd = openat(dfd, vname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (vfd < 0 || fstat(vfd, &vst) < 0 || (uint64_t)vst.st_size != size) {
		tlog(LOG_ERR, "journal %s: its version %s is %s; %s keeps what it holds",
		     rname, vname, vfd < 0 ? "missing" : "incomplete", rel);
		goto out;
	}
	struct open_how how = {
		.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	char proc[64];

	tfd = (int)syscall(SYS_openat2, dfd, rel, &how, sizeof(how));
	if (tfd < 0 && errno == ENOSYS)
		tfd = openat(dfd, rel, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (tfd < 0 || fstat(tfd, &tst) < 0 || tst.st_ino != (ino_t)ino ||
	    tst.st_dev != (dev_t)dev || !S_ISREG(tst.st_mode)) {
		tlog(LOG_WARNING, "journal %s: %s is no longer the file it was written "
		     "for; not replayed", rname, rel);
		goto out;
	}
	fs_proc_path(tfd, proc, sizeof(proc));
	int wfd = open(proc, O_WRONLY | O_CLOEXEC);

	ret = wfd < 0 ? -errno : jnl_redo_write(vfd, wfd, size, true);
	if (wfd >= 0)
		close(wfd);
	if (ret) {
		tlog(LOG_ERR, "journal %s: cannot finish the update of %s: %s (kept; "
		     "retried at the next start)", rname, rel, strerror(-ret));
		done = false;
		goto out;
	}
	tlog(LOG_NOTICE, "%s: finished an update cut short by the previous daemon's "
	     "end (%" PRIu64 " bytes)", rel, size);
out:
	if (vfd >= 0)
		close(vfd);
	if (tfd >= 0)
		close(tfd);
	if (done) {
		unlinkat(dfd, rname, 0);
		fsync(dfd);
		unlinkat(dfd, vname, 0);
	}
	return done;
}

/* sweep's keep for legacy names: a record that stays, and its version. */
static bool legacy_keep(int dfd, const char *name)
{
	char rname[NAME_MAX + 1];
	struct stat st;

	if (legacy_record(name))
		return !legacy_one(dfd, name);
	snprintf(rname, sizeof(rname), "%s.h", name);
	return fstatat(dfd, rname, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* See fs.h. */
int fs_journal_replay(int root_fd, char *msg, size_t len)
{
	struct jnl_replay_stats st;
	int ret;

	ret = jnl_replay(root_fd, JOURNAL_NAME, replay_one, &root_fd, &st);
	if (!ret && !st.failed)		/* the journal is empty, durably */
		sweep(root_fd, FS_INTENT_PREFIX, NULL);
	/* a rewrite of the journal that a crash cut short (its notes kept,
	 * jnl_replay and the emptying of a journal that holds notes) */
	unlinkat(root_fd, JOURNAL_NAME ".new", 0);
	sweep(root_fd, LEGACY_PREFIX, legacy_keep);	/* later than its deltas */
	if (ret) {
		snprintf(msg, len, "cannot replay its journal " JOURNAL_NAME ": %s",
			 strerror(-ret));
		return ret;
	}
	replayed = st.applied;
	if (st.applied || st.skipped || st.failed || st.torn)
		tlog(LOG_NOTICE, "journal: %" PRIu64 " change(s) made durable before the "
		     "previous daemon's end applied, %" PRIu64 " passed over, %" PRIu64
		     " failed%s", st.applied, st.skipped, st.failed,
		     st.torn ? "; a torn record at its end dropped" : "");
	if (st.failed) {
		snprintf(msg, len, "%" PRIu64 " record(s) of its journal " JOURNAL_NAME
			 " could not be applied (kept)", st.failed);
		return -EIO;
	}
	return 0;
}

/* See fs.h. */
int fs_journal_start(void)
{
	char msg[256];
	int ret = fs_journal_replay(fs.root_fd, msg, sizeof(msg));

	if (ret) {
		tlog(LOG_ERR, "%s: %s; no journal this time", fs.opts.backing, msg);
		return ret;
	}
	ret = jnl_open(&jnl, fs.root_fd, JOURNAL_NAME);
	if (ret) {
		tlog(LOG_WARNING, "cannot open %s/" JOURNAL_NAME " (%s): small changes are "
		     "flushed as new versions", fs.opts.backing, strerror(-ret));
		return ret;
	}
	fs.journal = &jnl;
	/* two files in turn, without the persistent tier (its notes need
	 * a journal that can be emptied) */
	const char *ring = getenv("TIERFS_JOURNAL_RING");

	if (!fs_persist_on())
		jnl_ring(&jnl, ring ? strtoull(ring, NULL, 0) : JOURNAL_RING);
	/* its name durable before any record in it counts */
	int dfd = openat(fs.root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dfd < 0 || fsync(dfd) < 0)
		tlog(LOG_WARNING, "cannot sync %s for its journal: %s", fs.opts.backing,
		     strerror(errno));
	if (dfd >= 0)
		close(dfd);
	return 0;
}

/* See fs.h. */
void fs_journal_end(void)
{
	bool empty;

	if (jnl.fd < 0)
		return;
	fs.journal = NULL;
	empty = jnl.live == 0 && !jnl.held;	/* notes held: the persistent
						 * tier's queue, for the next
						 * mount (it said so) */
	if (jnl.live)
		tlog(LOG_WARNING, "%s/" JOURNAL_NAME " keeps changes not yet in their files: "
		     "the next start or tierfs --recover applies them", fs.opts.backing);
	jnl_close(&jnl);
	if (empty) {		/* the second file first: a replay reads it */
		unlinkat(fs.root_fd, JOURNAL_NAME1, 0);
		unlinkat(fs.root_fd, JOURNAL_NAME, 0);
	}
}

/* See fs.h.  The journal's counts since the mount, and the records the
 * mount's replay applied (made durable before the previous daemon's end). */
void fs_journal_stats_put(struct json *j)
{
	struct jnl_counts c = { 0 };
	bool on = jnl.fd >= 0;

	if (on)
		jnl_counts(&jnl, &c);
	json_obj(j, "journal");
	json_bool(j, "on", on);
	json_u64(j, "records_appended", c.appends);
	json_u64(j, "bytes_appended", c.bytes);
	json_u64(j, "syncs", c.syncs);
	json_u64(j, "records_retired", c.retires);
	json_u64(j, "records_live", c.live);
	json_u64(j, "resets", c.resets);
	json_u64(j, "sync_failures", c.failures);
	json_num(j, "append_seconds", c.append_s, 3);
	json_num(j, "sync_seconds", c.sync_s, 3);
	json_u64(j, "records_replayed", replayed);
	json_close(j);
}
