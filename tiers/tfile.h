/*
 * tfile.h - a file as the engine sees it: struct tfile (embedded by the fs
 * side in each regular file's inode), the backing-store operations the fs
 * side implements for it (struct tfile_ops), and the tfile_* calls that
 * write, read, truncate, sync and describe it.
 *
 * Every tfile_* call takes the file's own lock (tfile.lock) and the engine
 * lock itself; the caller holds neither (it may hold fs.lock for
 * tfile_destroy() and tfile_unlinked(): see lockorder.h).
 */
#ifndef TIERFS_TFILE_H
#define TIERFS_TFILE_H

#include <sys/types.h>

struct hint;
#include <time.h>

#include "tier.h"
#include "dedup.h"

struct engine;
struct tfile;

/* Journal records a write-through version holds at most before an fsync
 * commits it instead (struct shadow_log). */
#define SLOG_MAX	16

/* Backing-store operations, implemented by the fs side. */
struct tfile_ops {
	/*
	 * Open a new, invisible version of f's backing file for writing (or,
	 * for files that cannot be replaced atomically, the file itself:
	 * *inplace set).  *direct tells whether the fd is O_DIRECT.
	 * Returns an fd or -errno.
	 */
	int (*version_open)(struct tfile *f, bool want_direct, bool *direct,
			    bool *inplace);
	/*
	 * Make fd f's content atomically (attributes copied over), or drop it
	 * when the file has been unlinked meanwhile (returns -ENOENT).  Closes
	 * fd in every case.  durable: also fsync the directory.
	 */
	int (*version_commit)(struct tfile *f, int fd, bool inplace, bool durable);
	/*
	 * Optional.  Make durable what fsync covers besides the data: the
	 * renames that commits without durable made (a version renamed over
	 * the file in the background: its data was synced, the rename is
	 * durable only once its directory is), and changes of the file's
	 * attributes on the fs side.  Called by tfile_fsync with no lock
	 * held.  Returns 0 or -errno.
	 */
	int (*sync_meta)(struct tfile *f);
	/*
	 * Optional.  Write buf (len bytes, a complete version of f) as its
	 * content without a new version, where the fs side can do that
	 * atomically (a small first version of an empty file).  Returns 1
	 * with *fd the file written, which the caller settles (as a version
	 * written in place) and hands to version_commit with inplace; 0 when
	 * it cannot (the caller writes a new version), or -errno.
	 */
	int (*version_small)(struct tfile *f, const void *buf, uint64_t len, int *fd);
	/*
	 * Optional, the four together (-o journal_pct; flush_journal.c's journal
	 * flush).  journal_delta: append a record of f's change since its
	 * backing file's content: the n ranges r, whose bytes are at
	 * base + r[i].start (zero: NULL, or where zero[i], range i reads as
	 * zeros, its bytes not recorded: its apply punches it), and size,
	 * made durable (sync) or not yet (the
	 * caller's journal_sync does, for a group's records at once).
	 * Returns 0 with *seq the record's, 1 where f cannot be journalled
	 * (the caller writes a new version), or -errno.  journal_sync: the
	 * records up to seq durable (any file's: f names the journal's
	 * owner), 0 or -errno.  journal_apply, once the record is durable:
	 * write that change (zero as journal_delta's) into the backing file
	 * itself (the record, or the records of a shadow, guard
	 * the write) and sync it, or (fd not NULL) leave the sync to the
	 * caller, *fd then a descriptor of the file written, the caller's to
	 * sync and close before the record is retired: 0 or -errno.
	 * journal_retire: record seq is in the backing file, synced (or
	 * superseded, or in a new version committed durably: a shadow's,
	 * shadow.c): no replay needs it.
	 */
	int (*journal_delta)(struct tfile *f, const void *base, const struct drange *r,
			     const bool *zero, uint32_t n, uint64_t size, uint64_t *seq,
			     bool sync);
	int (*journal_sync)(struct tfile *f, uint64_t seq);
	int (*journal_apply)(struct tfile *f, const void *base, const struct drange *r,
			     const bool *zero, uint32_t n, uint64_t size, int *fd);
	void (*journal_retire)(struct tfile *f, uint64_t seq);
	/*
	 * Record seq of f is not applied, and f's next version is not made
	 * from its ranges (a whole new version): apply it to the backing
	 * file from the journal, sync, and retire it durably, before the new
	 * version is committed (which may copy over the file in place: a
	 * record replayed after that would undo part of it).  0 or -errno.
	 */
	int (*journal_settle)(struct tfile *f, uint64_t seq);
	/*
	 * Optional (-o dedup with a journal): append a record saying that
	 * f's content is now that of the version open at bfd (a base in the
	 * chunk index) but for the n ranges r, whose bytes are at
	 * data + r[i].start, and size; and make it durable.  The caller then
	 * makes the new version from the same base and ranges and commits
	 * it, which retires the record (the fs side's, at a durable commit);
	 * a crash in between leaves the record, which a replay applies to
	 * the backing file.  The base is the fs side's to keep unchanged
	 * from here until that retirement; base_ok(arg), called once it is
	 * kept and before the record, says whether it is still the version
	 * the ranges were found against (no flush of its file began since).
	 * Returns 0 with *seq the record's, 1 where f cannot have one now
	 * (the caller just writes the version), or -errno.
	 */
	int (*journal_clone)(struct tfile *f, int bfd, const void *data, const struct drange *r,
			     uint32_t n, uint64_t size, uint64_t *seq, bool (*base_ok)(void *),
			     void *arg);
	/* An fd reading f's current backing content, owned by the fs side
	 * (valid until release_data_fd).  Returns fd or -errno. */
	int (*data_fd)(struct tfile *f, bool direct);
	void (*release_data_fd)(struct tfile *f, int fd);
	/* Take / drop a reference that keeps f alive while the engine uses it. */
	void (*get)(struct tfile *f);
	void (*put)(struct tfile *f);
	/* Name for log messages (may return a static "?"). */
	const char *(*name)(struct tfile *f, char *buf, size_t len);
};

struct tfile {
	struct engine *eng;
	const struct tfile_ops *ops;
	pthread_mutex_t lock;		/* orders operations on this file; rank
					 * LR_TFILE (lockorder.h): the outermost
					 * lock, taken by the tfile_* calls */
	/* below: protected by eng->lock */
	struct copy *copy[TIER_MAX];	/* cached copy per tier, or NULL */
	uint64_t size;			/* logical size, authoritative if dirty */
	struct timespec mtime;		/* modification time while dirty */
	bool dirty;			/* content newer than the backing file */
	bool unlinked;			/* no name left: discard, never flush */
	bool orphaned;			/* and no handle left: its copies are
					 * garbage (copy.discarded) */
	bool queued;			/* on a flush queue */
	bool aging;			/* that queue is the aging queue */
	double due_at;			/* its flush is due then (tier_now) */
	int flush_waiters;		/* fsyncs waiting for its flush: it is
					 * flushed at once, never aged */
	bool destroying;		/* being freed: copies hold no reference */
	int shadow_fd;			/* write-through version being built */
	bool shadow_inplace;		/* shadow_fd is the file itself */
	bool linked;			/* atomic, no lock: its backing file has
					 * several names, so that its new versions
					 * are copied over it in place (the fs
					 * side's word: tfile_set_linked) */
	uint64_t shadow_backlog;	/* bytes of e->backlog for a shadow
					 * waiting on the aging queue */
	uint64_t shadow_seq0;		/* eng->lock: the seq of the shadow's
					 * first live journal record, 0: none
					 * (engine_journal_held) */
	/*
	 * A shadow's fsyncs made durable by journal records instead of a
	 * new version each (shadow.c's eng_shadow_record): the ranges written
	 * since its base (the backing file, which it was made from, or its
	 * last record), while valid; base_len the size then, clean_len the
	 * least since; seq the live records, in order, until the shadow is
	 * committed (durably: then they are retired); gen the gen the last
	 * one holds.  all, all_clean_len: the ranges written since the
	 * backing file's content, and the least size since (the records
	 * together; base0_len its size), for a commit by an apply in place
	 * (shadow.c's eng_shadow_apply).  lazy: the shadow holds only what
	 * was written since (all, and from all_clean_len on), the rest is
	 * read from the backing file (eng_shadow_owned); all is then kept
	 * whatever valid says.  Under f->lock (every write to a shadow, and
	 * every read of one, holds it).
	 */
	struct shadow_log {
		struct dset ranges, all;
		uint64_t base_len, clean_len, base0_len, all_clean_len;
		bool valid, lazy;
		int base_fd;		/* lazy: the backing file, read */
		uint32_t nseq;
		uint64_t seq[SLOG_MAX];
		uint64_t gen;
	} *slog;			/* NULL: none (malloc'ed by start_shadow) */
	int writers;			/* open handles that may write */
	int flush_err;			/* last flush failure (-errno), or 0 */
	int write_err;			/* a write-through write failed (-errno):
					 * reported by the next fsync, then 0 */
	uint64_t gen;			/* bumped by every modification */
	uint64_t flushed_gen;		/* gen last committed to the SSD */
	uint64_t journaled_gen;		/* gen last made durable by a journal
					 * record (applied or not) */
	uint64_t jseq;			/* its record while not yet applied to
					 * the backing file, 0: none */
	uint64_t jgen;			/* the gen that record holds */
	uint64_t jsettle;		/* its record applied to the backing
					 * file, the apply not synced yet
					 * (flush_journal.c's asettle), 0: none */
	bool jsettling;			/* that sync under way */
	uint64_t hint_seq;		/* restore-queue ticket, 0: no hint */
	struct hint *hint_first, *hint_last;	/* its restore-queue entries,
						 * ticket order (hints.c) */
	uint64_t read_ticket;		/* the queue's last ticket at its latest
					 * read since its last close, 0: none (or
					 * consumed since): tfile_last_close() */
	bool consumed_open;		/* consumed since its last close */
	int gpu_wdev;			/* the GPU its last GPU write came from
					 * (the ioctl's buffer), -1: none */
	int gpu_rdev;			/* the GPU that will read it back
					 * (user.tierfs.restore_device), -1: none */
	struct tfile *fq_next;		/* flush queue link */
	struct tfile *aq_prev;		/* and back, on the aging queue */
	struct tfile *gq_next;		/* GPU -> host queue link */
	bool gqueued;			/* on the GPU -> host queue */
	double retry_at;		/* after a failed flush (tier_now) */
	struct tfile_dedup dd;		/* incremental flushes and the chunk
					 * index (-o dedup): dedup.h */
};

void tfile_init(struct tfile *f, struct engine *e, const struct tfile_ops *ops,
		uint64_t size);
/*
 * The live journal records that hold the fsyncs of f's write-through
 * version (shadow.c), *n of them, in order: for a commit of it that copies
 * it over the file in place, which retires them once its own intent is
 * durable (before that intent can be retired: a replay of them after
 * the copy would undo part of it).  The caller of version_commit holds
 * f->lock, which keeps them.
 */
const uint64_t *tfile_shadow_records(struct tfile *f, uint32_t *n);
/* Drop every copy and pending work of a file that is going away. */
void tfile_destroy(struct tfile *f);

/* A handle opened for writing / its last close (queues the flush). */
void tfile_open_writer(struct tfile *f);
void tfile_close_writer(struct tfile *f);
/*
 * The file's last open handle was released (a mapping holds its handle
 * until munmap).  A queued file read while its first entry was queued, and
 * not consumed since its last close, is consumed now (hints.c): a reader
 * that read only part of it is done with it.
 */
void tfile_last_close(struct tfile *f);
/* Write; returns bytes written or -errno.  Never -ENOSPC for a full cache. */
ssize_t tfile_write(struct tfile *f, const void *buf, size_t len, off_t off);
/* Read into buf; returns bytes read (short at EOF) or -errno. */
ssize_t tfile_read(struct tfile *f, void *buf, size_t len, off_t off);
/*
 * Zero-copy read from a host-addressable cache: on 1 a pointer to the
 * bytes is in *p and the copy is pinned until tfile_read_end(); on 0
 * the caller must use tfile_read.  *n is the byte count (0 at EOF).
 */
int tfile_read_begin(struct tfile *f, size_t len, off_t off,
		     const void **p, size_t *n, struct copy **pin);
void tfile_read_end(struct tfile *f, struct copy *pin);
int tfile_truncate(struct tfile *f, uint64_t size);
/*
 * Zero [off, off + len) of the file, cut at its size (punch hole, zero
 * range): in its cached copy, which a flush then leaves as holes where the
 * zeros make whole runs; a hole punched in a version being written
 * through.  The size does not change.  Returns 0 or -errno.
 */
int tfile_zero(struct tfile *f, uint64_t off, uint64_t len);
/*
 * lseek(2)'s SEEK_DATA / SEEK_HOLE (whence) from off: the backing file's
 * answer for a file that is not dirty or is being written through, the
 * cached copy's holes (as a flush will leave them) otherwise.  Returns the
 * offset, -ENXIO at or past the end (SEEK_DATA: no data after off), or
 * -errno.
 */
off_t tfile_seek(struct tfile *f, off_t off, int whence);
/*
 * Write / read with the other side in GPU memory (device address dptr, in
 * this process's CUDA context).  The file's GPU copy is used when it has
 * one (device-to-device); a host copy or the SSD otherwise (a new file's
 * first write places it in the GPU tier).  Returns bytes or -errno;
 * -ENODEV when there is no GPU tier.
 */
ssize_t tfile_write_dev(struct tfile *f, uint64_t dptr, int dev, size_t len, off_t off);
ssize_t tfile_read_dev(struct tfile *f, uint64_t dptr, int dev, size_t len, off_t off);
/*
 * Vectored tfile_write_dev / tfile_read_dev: n segments, in order, under
 * one hold of f->lock, so nothing commits a version (fsync, a writer's
 * close, truncate) or writes the file between them.  The write makes room
 * for the list's end once before the first segment.  Returns the total
 * (a read's segment is short at end of file) or the first -errno; after
 * an error the segments before it stay written.
 */
struct tdev_seg {
	uint64_t dptr;			/* device address */
	int dev;			/* its GPU, -1: not known */
	uint64_t len, off;		/* bytes and file offset */
};
ssize_t tfile_writev_dev(struct tfile *f, const struct tdev_seg *seg, int n);
ssize_t tfile_readv_dev(struct tfile *f, const struct tdev_seg *seg, int n);
/*
 * The GPU that will read f back (user.tierfs.restore_device): a prefetch
 * into a GPU cache over several GPUs places its copy in that GPU's part,
 * and so do POSIX writes.  dev -1 forgets it.  Returns 0; -ENODEV when the
 * mount's GPU tier does not span GPU dev (or there is none yet).
 */
int tfile_set_gpu_device(struct tfile *f, int dev);
/* The GPU recorded for f (restore_device, else its last GPU writer), -1. */
int tfile_gpu_device(struct tfile *f);
/*
 * A client copy into or out of the file's GPU cache copy (-o gpu_share):
 * tfile_span_begin() places (write: as a write of [off, off + len) would,
 * zeroing a hole before it) or finds (read) the bytes in the GPU tier,
 * pins them and returns their offset in the GPU cache in *cache_off; the
 * client copies; tfile_span_end() commits (write: size, dirty, flush as a
 * write would; read: consumption) and unpins.  begin returns 0 (a read at
 * or past the end: 0 with s->len 0 and nothing pinned), -EAGAIN when the
 * bytes are not in the GPU tier (the file is in a slower tier, too big for
 * the GPU cache, or written through: the daemon must copy), -ENODEV
 * without a GPU tier, -EINVAL, or writable_copy()'s errors.  end returns
 * the bytes committed, or -EIO when !ok (a write's failed copy: the size
 * stays, the bytes inside the file are kept as they are).
 */
struct tspan {
	struct copy *cp;		/* pinned copy, NULL: no span */
	uint64_t off, len;		/* the file range (a list: its last) */
	uint64_t lo, hi;		/* the union of the ranges */
	uint64_t bytes;			/* the sum of their lengths */
	bool write;
};
int tfile_span_begin(struct tfile *f, bool write, uint64_t off, uint64_t len,
		     struct tspan *s, uint64_t *cache_off);
/*
 * tfile_spanv_begin - one span over a list of file ranges of one file (a
 * vectored client copy): placed once (write: one writable copy sized for
 * the list's end, the holes before ranges past the copy's end zeroed) or
 * found once (read: every range in the GPU tier's one copy), pinned once
 * and committed by one tfile_span_end.  r[i].len is cut at end of file
 * for a read (0: that range reads nothing); cache_off[i] is each range's
 * offset in the GPU cache.  A write's ranges must come sorted by offset,
 * not overlapping (-EINVAL).  Returns as tfile_span_begin.
 */
struct tspan_range {
	uint64_t off, len;
};
int tfile_spanv_begin(struct tfile *f, bool write, struct tspan_range *r, int n,
		      struct tspan *s, uint64_t *cache_off);
ssize_t tfile_span_end(struct tfile *f, struct tspan *s, bool ok);
/* Make the file durable on the SSD; returns 0 or the flush error. */
int tfile_fsync(struct tfile *f);
/* tfile_fsync but for ops->sync_meta: the caller makes the whole backing
 * file system durable afterwards (syncfs at unmount); a file written
 * through is committed, never left to a journal record (write.c). */
int tfile_fsync_data(struct tfile *f);
/* The file lost its last name: cancel its flush, free its copies once no
 * handle uses them. */
void tfile_unlinked(struct tfile *f);
/* The unlinked file lost its last handle too: nobody can read its data
 * again.  Its idle copies are freed now, the others once idle (evictable
 * at once), without waiting for the file to be let go. */
void tfile_orphaned(struct tfile *f);
/* The backing file has several names (linked), or one: its new versions
 * are copied over it in place, or renamed over it.  Any change of a file
 * with several names is then a journal record where the mount journals
 * (eng_journal_small). */
void tfile_set_linked(struct tfile *f, bool linked);
/* Size and mtime as the fs should report them; false if not dirty. */
bool tfile_attr(struct tfile *f, uint64_t *size, struct timespec *mtime);
/* Set the modification time to report and to give the next version. */
void tfile_set_mtime(struct tfile *f, const struct timespec *mt);
/* The cached mtime (zero: none), read under the engine's lock. */
struct timespec tfile_mtime(struct tfile *f);
/* The error a close() should report (a flush that already failed). */
int tfile_pending_error(struct tfile *f);
/* What a checkpoint set asks of one of its files (fs/fs_sets.c), read at
 * once under the engine's lock. */
struct tfile_facts {
	int writers;			/* open handles that may write */
	bool restore_queued;		/* in the restore queue */
	bool dirty;			/* content newer than the backing file */
	int flush_err;			/* last flush failure (-errno), or 0 */
};
void tfile_facts(struct tfile *f, struct tfile_facts *out);
/* Copies' tiers and states, "host:FLUSHED" etc., for xattrs. */
int tfile_describe(struct tfile *f, char *tier, size_t tl, char *state, size_t sl);

#endif /* TIERFS_TFILE_H */
