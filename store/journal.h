/*
 * journal.h - the journal of a backing directory: a file of records (two
 * taken in turn, jnl_ring), each
 * a header (magic, type, sequence number, length), a payload and a checksum
 * (XXH3-64 over both), appended and made durable with fdatasync; replayed
 * in one place (jnl_replay), which stops at the first record that is torn
 * or does not check out (journal.c).
 *
 * Records of type JNL_DELTA carry a small change of one backing file: its
 * identity (device, inode, file handle, path below the backing root), its
 * new size and mtime, and the changed ranges with their bytes.  Applying
 * one (jnl_delta_apply) writes the ranges into the file, sizes it and
 * syncs it: applying it twice, or over a partial apply, gives the same
 * file.  Records of type JNL_REDO are commit intents: a new version of a
 * file with several names, copied over it in place (a rename would leave
 * the other names the old version).  The record names the file (as a
 * delta does) and the complete, synced new version, linked under a
 * hidden name below the backing root, with its size; it is durable before
 * the copy starts.  Applying it (jnl_redo_apply) copies the version over
 * the file again, sizes and syncs it: a copy cut short is finished, a
 * finished one gives the same file.  A record stays live until it is
 * retired (jnl_retire: a JNL_RETIRE record naming it), once what it
 * describes is in the backing file and synced; replay applies only the
 * live ones, in order: deltas and intents of one file in the order they
 * were made.
 *
 * Records of type JNL_CLONE are deltas over a base: a new file whose
 * content is another file's (a version of the previous checkpoint of a
 * series, -o dedup) but for a few ranges.  The record names the file (as a
 * delta does), the base (linked under a hidden name below the backing
 * root, durable before the record, with its inode number and size), the
 * new size and the ranges that differ, with their bytes.  Applying one
 * (jnl_clone_apply) clones the whole base into the file (FICLONE), then
 * writes the ranges, sizes and syncs it: applying it again, or over a
 * partial apply, gives the same file.  The live flush makes the file's new
 * version from the same base and ranges after the record is durable, then
 * retires it; the record makes the change durable in one sequential write
 * where the version costs a clone of a fragmented file and a copy on write
 * per changed chunk.
 *
 * Records of type JNL_NOTE are another reader's (the persistent tier's
 * queue, fs/persist_journal.c): opaque here, never live, never retired.
 * They are appended as any record is (checksummed, in sequence, durable
 * with the next jnl_sync), and hold the journal (it is not emptied) until
 * their reader says it is done with them (jnl_notes_done).  A replay
 * hands them to its fn in order with the rest; those fn keeps (JNL_KEEP)
 * survive it: the journal is then rewritten to hold them alone, in their
 * order, and jnl_open goes on after them.
 */
#ifndef TIERFS_JOURNAL_H
#define TIERFS_JOURNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define JNL_MAGIC	0x314a5254u	/* "TRJ1" */

enum jnl_type {
	JNL_RETIRE = 1,			/* payload: the seq (u64) of a record done */
	JNL_DELTA = 2,			/* a small change of a file (below) */
	JNL_REDO = 3,			/* a new version copied over a file (below) */
	JNL_NOTE = 4,			/* another reader's record (above) */
	JNL_START = 5,			/* no payload: the first record of a
					 * journal file taken again (below) */
	JNL_CLONE = 6,			/* a delta over a clone of another
					 * file (below) */
};

/* What a replay's fn returns for a record it keeps (JNL_NOTE). */
#define JNL_KEEP	2

/* A record's header, as on disk (host byte order: the journal is never
 * read by another machine). */
struct jnl_rec {
	uint32_t magic;			/* JNL_MAGIC */
	uint16_t type;			/* enum jnl_type */
	uint16_t hlen;			/* sizeof(struct jnl_rec) */
	uint64_t seq;			/* one more than the record before */
	uint64_t len;			/* payload bytes that follow */
	uint64_t sum;			/* XXH3-64 of the header (sum 0) and payload */
};

/* The largest payload: a record bigger than this is not a record. */
#define JNL_PAYLOAD_MAX	(1ull << 32)

/* An open journal (the daemon's), appended to by any thread. */
struct jnl {
	int fd;				/* O_RDWR, -1: none; set by jnl_open
					 * only (an emptying that keeps notes
					 * puts the new file under it: dup2) */
	int dirfd;			/* its directory's (open while j is) */
	const char *name;		/* its name there (kept while j is) */
	pthread_mutex_t lock;		/* the fields below; rank LR_JOURNAL
					 * (lockorder.h): a leaf, never held
					 * across fdatasync */
	pthread_cond_t synced_cond;	/* a sync ended */
	uint64_t off;			/* where the next record goes */
	uint64_t seq;			/* of the last record appended */
	uint64_t synced;		/* records up to this seq are durable */
	bool syncing;			/* a thread is in fdatasync for the rest */
	uint64_t live;			/* records appended and not retired */
	uint64_t *live_seq;		/* their seqs, ascending (appends come
					 * in seq order): a retire counts
					 * only for a seq found here */
	uint64_t live_cap;		/* slots of live_seq */
	uint64_t reset_at;		/* emptied when none is live and it is
					 * this long (jnl_retire) */
	bool held;			/* notes appended since the reader was
					 * last done with them: not emptied */
	char *notes;			/* the payloads of the notes jnl_open
					 * found, one after the other, then a
					 * NUL (jnl_take_notes) */
	size_t notes_len;
	/*
	 * Two files in turn (jnl_ring): records go to one until it is
	 * ring_at long, then to the other one, written again from its start
	 * once no record in it is live.  Writes over blocks a file has
	 * already cost its file system no metadata, so the fdatasync of a
	 * record commits nothing to that file system's log.
	 */
	int fd1;			/* the second file (name + ".1"), -1:
					 * not open */
	int wfd;			/* the file appended to: fd or fd1 */
	uint64_t ring_at;		/* 0: one file (no ring) */
	uint64_t cur_start;		/* seq of wfd's first record */
	uint64_t other_end;		/* the end of the records of the other
					 * file (jnl_read) */
	bool switching;			/* appends wait: the files change */
	int fail_err;			/* a sync failed (sync_failed): every
					 * record after fail_from is never
					 * said durable, none that would be
					 * live is taken, until all are
					 * retired and the journal emptied */
	uint64_t fail_from;
	/* statistics */
	uint64_t appends, retires, syncs, bytes, resets, failures;
	double append_s, sync_s;	/* in the appends' writes, in fdatasync */
};

/*
 * Open (create) journal `name` in directory dirfd for appending: the
 * caller has replayed what it held (jnl_replay), so it is empty or holds
 * the notes that replay kept, which the next records follow (held, until
 * jnl_notes_done), their payloads for jnl_take_notes.  Anything after
 * its last whole record is cut off.  -ENOTEMPTY where `name`.1 (jnl_ring)
 * is not empty: a replay empties it.
 * dirfd and name stay valid while j is open (an emptying that keeps
 * notes replaces the file).  0 or -errno.
 */
int jnl_open(struct jnl *j, int dirfd, const char *name);
void jnl_close(struct jnl *j);
/*
 * Take two files in turn from now on, `name` and `name`.1 (made here
 * where absent: the caller syncs dirfd before a record counts, as after
 * jnl_open): once the file appended to is `at`
 * bytes long and no record of the other one is live, the other one is
 * taken again.  Its first record, JNL_START, is made durable (after
 * every record of the file left) before any other is written there, so a
 * replay never reads an earlier round's records in it: they do not
 * follow JNL_START's seq.  The journal is never emptied then (its blocks
 * are written over; jnl_retire's emptying is for one file), and a replay
 * reads both files.  Only on a journal that jnl_open found empty, with
 * no `name`.1 holding records, and never where notes are appended (the
 * first note turns the ring off: notes_done's emptying needs one file).
 * true where it is on.
 */
bool jnl_ring(struct jnl *j, uint64_t at);
/* The second file's name for name (buf of len bytes): 0 or -ENAMETOOLONG. */
int jnl_name1(const char *name, char *buf, size_t len);

/*
 * Append a record of `type` whose payload is the iovcnt buffers of iov
 * (not synced: jnl_sync).  *seq: its sequence number.  0 or -errno (then
 * nothing of it counts: a later record overwrites it); after a failed
 * sync, the sync's error for any record but a JNL_RETIRE until the records
 * then live are all retired (jnl_failed).
 */
int jnl_append(struct jnl *j, uint16_t type, const struct iovec *iov, int iovcnt,
	       uint64_t *seq);
/*
 * Make the records up to seq durable: one fdatasync for every waiter that
 * comes while one is running (group commit).  0 or -errno.  A failed sync
 * fails every jnl_sync of its records and of any record after them, until
 * the journal is emptied (jnl_failed): such a record may follow a lost
 * one, where a replay stops.
 */
int jnl_sync(struct jnl *j, uint64_t seq);
/*
 * Record seq is done (what it describes is durable elsewhere): a
 * JNL_RETIRE record is appended, durable with the next jnl_sync.  With no
 * live record left and a few MiB written the journal is emptied (the records it held are all
 * done, whether or not that emptying survives a crash).  Returns the
 * retire record's seq (for a jnl_sync that must precede a change that the
 * record would undo), or 0 when it could not be appended.  A seq that is
 * not live (retired already, or never appended) appends nothing and
 * counts for nothing: the answer is then the last record's seq, whose
 * sync covers the retire record made before.
 */
uint64_t jnl_retire(struct jnl *j, uint64_t seq);

/*
 * The oldest live record that keeps the ring (jnl_ring) from taking its
 * other file: the file appended to is past ring_at and that record, in
 * the other one, is not retired yet.  Its seq, or 0.  Meanwhile the
 * records go on in the file appended to, which grows: its size and blocks
 * change, and each record's sync commits them to the backing file
 * system's log.
 */
uint64_t jnl_ring_blocker(struct jnl *j);
/*
 * The reader of the notes is done with those appended so far: the journal
 * is emptied now where no record is live (whatever its length: a replay
 * does not read the done notes again), else as at a retire.  A note
 * appended later holds it again.
 */
void jnl_notes_done(struct jnl *j);
/*
 * The payloads of the notes the journal held when jnl_open opened it, one
 * after the other, NUL-terminated (malloc'ed, the caller's, *len bytes
 * without the NUL; NULL: none).  Once: a second call gives NULL.
 */
char *jnl_take_notes(struct jnl *j, size_t *len);

/* What a journal did since jnl_open (the statistics' "journal"). */
struct jnl_counts {
	uint64_t appends;		/* records appended (changes and their
					 * JNL_RETIRE records) */
	uint64_t bytes;			/* their bytes, headers included */
	uint64_t syncs;			/* fdatasyncs, one per group commit */
	uint64_t retires;		/* records retired */
	uint64_t live;			/* records appended and not retired */
	uint64_t resets;		/* times the file was emptied, or the
					 * other file taken again (jnl_ring) */
	uint64_t failures;		/* failed syncs (sync_failed), each
					 * until the journal was emptied */
	double append_s;		/* seconds in the appends' writes */
	double sync_s;			/* seconds in fdatasync */
};
/* Copy j's counts into *c (under j's lock). */
void jnl_counts(struct jnl *j, struct jnl_counts *c);

/*
 * Does j take no record now, after a failed sync whose records (or later
 * ones) are not all retired yet?  Where they are, j is emptied first,
 * durably, and works again (false).  A caller with a change to make
 * durable makes it another way meanwhile (a whole new version).
 */
bool jnl_failed(struct jnl *j);

/*
 * Read record seq back from the journal: its type and payload (*p,
 * malloc'ed, *len bytes).  0, -ENOENT where no record of that seq is
 * there, or -errno.
 */
int jnl_read(struct jnl *j, uint64_t seq, uint16_t *type, void **p, uint64_t *len);

/* ---- replay -------------------------------------------------------------- */

struct jnl_replay_stats {
	uint64_t records;		/* checked out */
	uint64_t applied;		/* live ones applied (fn returned 0) */
	uint64_t skipped;		/* live ones fn passed over (returned 1) */
	uint64_t failed;		/* live ones fn failed (returned < 0) */
	uint64_t kept;			/* ones fn kept (JNL_KEEP: notes) */
	uint64_t dropped_bytes;		/* of a torn or bad tail, dropped */
	bool torn;			/* the tail was cut short or did not check out */
};

/*
 * Apply one live record (not JNL_RETIRE), or take a note: 0 applied, 1
 * passed over (what it was for is gone), JNL_KEEP kept (a note, for its
 * reader after the replay), or -errno (the record stays).
 */
typedef int (*jnl_apply_fn)(void *arg, uint16_t type, uint64_t seq, const void *payload,
			    uint64_t len);

/*
 * Replay journal `name` of dirfd: read its records in order up to the first
 * one that is torn, does not check out (magic, length, checksum) or does
 * not follow the one before (seq), which is logged and dropped with all
 * after it; then hand each live record and note to fn, in order.  When
 * every one was applied, passed over or kept, the journal is emptied
 * durably (the records are in their files now), or where fn kept some,
 * replaced durably by one that holds those alone (renumbered from 1; a
 * rename, so that a crash leaves one journal or the other, whole).  A
 * missing journal is an empty one.  `name`.1 (jnl_ring) is read too, its
 * records in seq order with the other file's, and emptied first.  In a
 * file that begins with JNL_START, what follows its last record is an
 * earlier round's, not a torn tail.
 * Returns 0, or -errno where the journal could not be read or emptied;
 * fn's failures are counted in st (the journal keeps them).
 */
int jnl_replay(int dirfd, const char *name, jnl_apply_fn fn, void *arg,
	       struct jnl_replay_stats *st);

/* ---- JNL_DELTA: a small change of one backing file (records.c) ----------- */

/* A changed range of a delta.  With JNL_ZERO set in len, the range reads
 * as zeros: none of its bytes are in the record, and its apply punches it
 * (a hole of a sparse file stays one, and costs the record nothing). */
struct jnl_range {
	uint64_t off, len;
};
#define JNL_ZERO	(1ull << 63)

/* What a delta record says besides its ranges' bytes. */
struct jnl_delta {
	uint64_t dev, ino;		/* the backing file's */
	uint64_t size;			/* its size after the change */
	int64_t mtime_sec, mtime_nsec;	/* its mtime after it (0, 0: left) */
	const void *handle;		/* its struct file_handle (whole), or NULL */
	uint32_t handle_len;
	const char *path;		/* relative to the backing root, or NULL */
	const struct jnl_range *r;	/* the changed ranges, below size */
	uint32_t n;
};

/*
 * Append the record of delta d, the bytes of range i being at
 * base + d->r[i].off (a file's cached copy, or a mapping of a file),
 * none for a JNL_ZERO range.  Not synced.  0 or -errno.
 */
int jnl_delta_append(struct jnl *j, const struct jnl_delta *d, const void *base,
		     uint64_t *seq);
/*
 * Write ranges r (n, bytes at base + r[i].off) into fd, set its size and
 * mtime (both 0: left), and (sync) fdatasync it: the one way a delta
 * reaches its file, live or replayed.  Without sync the caller syncs fd
 * before the record is retired (a group's files together: tiers/flush.c).
 * 0 or -errno.
 */
int jnl_delta_write(int fd, const struct jnl_range *r, uint32_t n, const void *base,
		    uint64_t size, int64_t mtime_sec, int64_t mtime_nsec, bool sync);
/*
 * Apply delta record payload p (len bytes) to its file below root_fd: found
 * by its path without following symlinks, else (renamed since) by its
 * handle, and only where it is still the inode the record names (the same
 * handle: not a reused inode number) beneath root_fd.
 * 0 applied, 1 passed over (gone, or another file now: why says so),
 * -EINVAL for a payload that does not parse, or -errno.
 */
int jnl_delta_apply(int root_fd, const void *p, uint64_t len, char *why, size_t wl);

/* ---- JNL_CLONE: a delta over a clone of a base (records.c) --------------- */

/* The base of a clone record: a name relative to the backing root (a
 * hidden link of its inode, made durable before the record), its inode
 * number and size. */
struct jnl_base {
	const char *name;
	uint64_t ino, size;
};

/*
 * Append the record of delta d over base b (d's file's content is b's
 * first b->size bytes but for d's ranges, then d->size), the bytes of
 * range i being at data + d->r[i].off.  Not synced.  0 or -errno.
 */
int jnl_clone_append(struct jnl *j, const struct jnl_base *b, const struct jnl_delta *d,
		     const void *data, uint64_t *seq);
/*
 * Apply clone record payload p (len bytes): its file found as a delta's is
 * (jnl_delta_apply), its base by its name without following symlinks, and
 * only where that is still the inode of the size recorded; the base cloned
 * whole into the file, then the delta written (jnl_delta_write) and synced.
 * 0 applied, 1 passed over (why says so), -EINVAL for a payload that does
 * not parse, or -errno.  The base's link is left (the caller removes it
 * once the record is retired or the journal emptied, durably).
 */
int jnl_clone_apply(int root_fd, const void *p, uint64_t len, char *why, size_t wl);

/* ---- JNL_REDO: a new version copied over a file in place (records.c) ----- */

/* What a commit intent says. */
struct jnl_redo {
	uint64_t dev, ino;		/* the backing file's */
	const void *handle;		/* its struct file_handle (whole), or NULL */
	uint32_t handle_len;
	const char *path;		/* relative to the backing root, or NULL */
	const char *version;		/* the new version's name, relative to the
					 * backing root (a hidden one) */
	uint64_t vino;			/* the new version's inode number */
	uint64_t size;			/* its size: the file's after the copy */
};

/* Append the record of intent r.  Not synced.  0 or -errno. */
int jnl_redo_append(struct jnl *j, const struct jnl_redo *r, uint64_t *seq);
/*
 * Copy the first size bytes of vfd over fd (from offset 0), size fd to
 * size and (sync) fsync it: the one way an intent reaches its file, live
 * or replayed (a live copy whose intent stays live until the file is
 * synced need not sync: fs_version.c's settler).  Only vfd's data is written; its holes are punched in fd
 * (zeros written where fd's file system cannot punch).  A file capability of fd, which the write takes away, is put
 * back.  0 or -errno (fd partly written: the intent stays).
 */
int jnl_redo_write(int vfd, int fd, uint64_t size, bool sync);
/*
 * Apply intent payload p (len bytes) below root_fd: its file found as a
 * delta's is (jnl_delta_apply), its version by its name without following
 * symlinks, and only where that is still the inode of the size recorded.
 * 0 applied, 1 passed over (the file or its version gone, or another file
 * now: why says so), -EINVAL for a payload that does not parse, or -errno.
 * The version is left where it is (the caller removes it once the record
 * is retired or the journal emptied, durably).
 */
int jnl_redo_apply(int root_fd, const void *p, uint64_t len, char *why, size_t wl);

#endif /* TIERFS_JOURNAL_H */
