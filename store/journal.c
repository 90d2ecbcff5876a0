/*
 * journal.c - the journal of a backing directory (journal.h): appends,
 * group commit, retirement, their counts, and the one replay.
 *
 * The file is a sequence of records; each header says its type, its
 * sequence number (one more than the record before it), its payload's
 * length, and an XXH3-64 checksum of header and payload.  A record is
 * durable once an fdatasync that began after its pwrite has returned.
 * Replay reads records up to the first one that does not check out: a
 * torn tail (a record cut short by a crash), bytes that are not a record,
 * or a record whose seq does not follow (what is left past the end of a
 * journal that was emptied and written again, when the emptying did not
 * survive a crash: the new records' seqs are above every old one).
 *
 * When no record is live (every one retired) and the file has grown past
 * JNL_RESET_AT, jnl_retire empties the file
 * (ftruncate, not synced): if the truncation is lost in a crash the old
 * records come back, all retired or applied already, and replaying an
 * applied delta again gives the file it has, except where something else
 * changed that file since; such a change (a new version of the file)
 * first makes the retirement durable (jnl_sync of the retire record's seq:
 * fs/fs_journal.c's fs_journal_settle and fs_journal_retire_durably).
 *
 * Two files in turn (jnl_ring, without notes): past ring_at bytes the
 * records go to `name`.1, and back to `name` once none of the first
 * file's records is live, and so on: a file is written again from its
 * start, over blocks it already has, so that the fdatasync of a record
 * changes no metadata of the backing file system (a file that grows
 * does: its size, its blocks).  The change of file (ring_switch) syncs
 * the file left, then writes JNL_START at the other one's start and syncs
 * it before any other record goes there: what that file held before (an
 * earlier round, all retired) can then never be read as records, as it
 * does not follow JNL_START's seq.  A replay reads both files and takes
 * their records in seq order (each file holds one run of seqs); a record
 * retired in the other file than its own is found retired either way.
 *
 * A failed sync (sync_failed) leaves the records it was for perhaps lost
 * on the disk, so that a replay would stop there and never reach a record
 * after them: none of them, and no record after them, is ever said
 * durable, and no record that would be live is taken until every live one
 * is retired (their owners retire a record whose sync failed).  Then the
 * journal is emptied, both files, durably (heal), and works again.  Until
 * then the changes that need a record fail (EIO) and are tried again;
 * retire records are still taken.
 *
 * A commit intent (JNL_REDO) is replayed by copying its version over its
 * file again (jnl_redo_write, the live copy's own): a copy cut short is
 * finished, a finished one rewritten with the same bytes; a later delta or
 * intent of the same file follows it in the sequence.
 *
 * Locking: jnl.lock (rank LR_JOURNAL, a leaf) around the end of the file,
 * the sequence numbers and the counts; an append's pwrite is made under it
 * (records go in seq order, one sequential write each); an fdatasync never
 * is: the thread that syncs does it for every record appended before it
 * began, and the threads that come meanwhile wait for the next one (group
 * commit).  Called by fs/ (the daemon and --recover); calls common/ (log,
 * the tests' fault points) and libxxhash only.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>
#include <linux/openat2.h>
#include <xxhash.h>

#include "fault.h"
#include "filecopy.h"
#include "journal.h"
#include "lockorder.h"
#include "log.h"

/* An empty journal (no live record) longer than this starts afresh: not
 * at every emptying, where its blocks would be freed and allocated again
 * (metadata for the file system's log) at each record. */
#define JNL_RESET_AT	(4u << 20)

/* A record found valid by a scan. */
struct scanned {
	uint64_t off, len, seq;
	uint16_t type;
};

static int read_rec(int fd, uint64_t off, uint64_t size, uint64_t prev_seq, bool first,
		    struct jnl_rec *h, void **p);
static int scan(int fd, uint64_t size, struct scanned **recs, uint64_t *n, uint16_t only);
static int rewrite_kept(int dirfd, const char *name, int fd, uint64_t size,
			const struct scanned *recs, uint64_t n, uint64_t seq, uint64_t *len);
static int open1(struct jnl *j, int flags);

static void jlock(struct jnl *j)
{
	ranked_lock(&j->lock, LR_JOURNAL);
}

static void junlock(struct jnl *j)
{
	ranked_unlock(&j->lock, LR_JOURNAL);
}

int jnl_open(struct jnl *j, int dirfd, const char *name)
{
	struct stat sb;
	struct jnl_rec h;
	void *p;
	int r;

	memset(j, 0, sizeof(*j));
	j->dirfd = dirfd;
	j->name = name;
	j->fd1 = -1;
	j->fd = openat(dirfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (j->fd < 0)
		return -errno;
	j->wfd = j->fd;
	/* a second file that holds anything is a replay's to empty first:
	 * the records appended here would not follow its seqs (an empty one
	 * is kept open for jnl_ring) */
	r = open1(j, 0);
	if (r >= 0 && (fstat(r, &sb) < 0 || sb.st_size)) {
		close(r);
		errno = ENOTEMPTY;
		goto fail;
	}
	j->fd1 = r >= 0 ? r : -1;
	if (fstat(j->fd, &sb) < 0)
		goto fail;
	/* the notes a replay kept, for jnl_take_notes(): the next records
	 * follow them */
	while ((r = read_rec(j->fd, j->off, (uint64_t)sb.st_size, j->seq, j->off == 0,
			     &h, &p)) == 1) {
		char *n = h.type == JNL_NOTE ? realloc(j->notes, j->notes_len + h.len + 1) : NULL;

		if (n) {
			memcpy(n + j->notes_len, p, h.len);
			j->notes = n;
			j->notes_len += h.len;
			n[j->notes_len] = 0;	/* the reader's strings end here */
		} else if (h.type == JNL_NOTE) {
			r = -ENOMEM;
		}
		free(p);
		if (r < 0)
			break;
		if (!j->off)
			j->cur_start = h.seq;
		j->seq = h.seq;
		j->off += sizeof(h) + h.len;
		j->held = true;
	}
	errno = -r;
	if (r < 0 || (j->off < (uint64_t)sb.st_size && ftruncate(j->fd, (off_t)j->off) < 0))
		goto fail;
	j->synced = j->seq;
	if (!j->off)
		j->cur_start = j->seq + 1;
	j->reset_at = JNL_RESET_AT;
	pthread_mutex_init(&j->lock, NULL);
	pthread_cond_init(&j->synced_cond, NULL);
	return 0;
fail:
	r = -errno;
	close(j->fd);
	j->fd = -1;
	if (j->fd1 >= 0)
		close(j->fd1);
	j->fd1 = -1;
	free(j->notes);
	j->notes = NULL;
	return r;
}

char *jnl_take_notes(struct jnl *j, size_t *len)
{
	char *n = j->notes;

	*len = j->notes_len;
	j->notes = NULL;
	j->notes_len = 0;
	return n;
}

void jnl_close(struct jnl *j)
{
	if (j->fd < 0)
		return;
	close(j->fd);
	j->fd = -1;
	if (j->fd1 >= 0)
		close(j->fd1);
	j->fd1 = -1;
	free(j->live_seq);
	j->live_seq = NULL;
	j->live_cap = 0;
	free(j->notes);
	j->notes = NULL;
	pthread_cond_destroy(&j->synced_cond);
	pthread_mutex_destroy(&j->lock);
}

/* The checksum of header h (its sum taken as 0) and payload iov. */
static uint64_t rec_sum(const struct jnl_rec *h, const struct iovec *iov, int iovcnt)
{
	XXH3_state_t *st = XXH3_createState();
	struct jnl_rec z = *h;
	uint64_t sum;

	if (!st)
		return 0;	/* a record nobody can check: replay drops it */
	z.sum = 0;
	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, &z, sizeof(z));
	for (int i = 0; i < iovcnt; i++)
		XXH3_64bits_update(st, iov[i].iov_base, iov[i].iov_len);
	sum = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return sum;
}

/* pwritev all of iov (iovcnt, total bytes) at off: 0 or -errno. */
static int pwrite_all(int fd, struct iovec *iov, int iovcnt, uint64_t total, uint64_t off)
{
	while (total) {
		int cnt = iovcnt < IOV_MAX ? iovcnt : IOV_MAX;
		ssize_t n = pwritev(fd, iov, cnt, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		off += (uint64_t)n;
		total -= (uint64_t)n;
		while (iovcnt && (size_t)n >= iov->iov_len) {
			n -= (ssize_t)iov->iov_len;
			iov++;
			iovcnt--;
		}
		if (iovcnt) {
			iov->iov_base = (char *)iov->iov_base + n;
			iov->iov_len -= (size_t)n;
		}
	}
	return 0;
}

/* ---- two files in turn (jnl_ring) --------------------------------------- */

int jnl_name1(const char *name, char *buf, size_t len)
{
	return snprintf(buf, len, "%s.1", name) < (int)len ? 0 : -ENAMETOOLONG;
}

/* The second file opened (flags: O_CREAT to make it): its descriptor,
 * or -errno. */
static int open1(struct jnl *j, int flags)
{
	char n1[NAME_MAX + 1];
	int fd, ret = jnl_name1(j->name, n1, sizeof(n1));

	if (ret)
		return ret;
	fd = openat(j->dirfd, n1, O_RDWR | O_NOFOLLOW | O_CLOEXEC | flags, 0600);
	return fd < 0 ? -errno : fd;
}

bool jnl_ring(struct jnl *j, uint64_t at)
{
	struct stat sb;
	int fd = j->fd1;	/* jnl_open's, empty */

	if (j->fd < 0 || j->off || j->held || !at || fstat(j->fd, &sb) < 0 || sb.st_size)
		return false;
	if (fd < 0)
		fd = open1(j, O_CREAT);	/* now: the directory changes while
					 * the caller expects it */
	if (fd < 0)
		return false;
	jlock(j);
	j->fd1 = fd;
	j->ring_at = at;
	junlock(j);
	return true;
}

/* Tests: is TIERFS_FAULT point, the first time it is asked (*once)?
 * journal_sync_eio makes the first sync report EIO after it ran, as a
 * failing disk may (its records are perhaps durable); journal_switch_eio
 * the sync of the file left at the first change of file. */
static bool fault_once(const char *point, bool *once)
{
	return tierfs_fault(point) && !__atomic_exchange_n(once, true, __ATOMIC_RELAXED);
}

/* Under j's lock: is every record of the file not appended to retired
 * (its seqs are those below cur_start)?  Notes turn the ring off. */
static bool ring_other_done(const struct jnl *j)
{
	return !j->held && (!j->live || j->live_seq[0] >= j->cur_start);
}

/* Under j's lock: a sync of the records after seq `from` failed (err). */
static void sync_failed(struct jnl *j, uint64_t from, int err)
{
	if (j->fail_err)
		return;		/* failed already, from an earlier point */
	j->fail_from = from;
	j->fail_err = err;
	j->failures++;
	tlog(LOG_ERR, "journal %s: cannot sync it (%s): its records from seq %" PRIu64
	     " may be lost; no record is taken until they are retired, then it "
	     "starts again empty", j->name, strerror(-err), from + 1);
}

/*
 * Under j's lock, after a failed sync (j->fail_err): empty the journal,
 * both files, durably, once no record is live and no note is held.  The
 * records of the failed sync and every one after them are gone then, all
 * retired, and a record appended from now on is durable at its sync
 * again.  True when the journal works again.
 */
static bool heal(struct jnl *j)
{
	if (j->live || j->held)
		return false;
	while (j->syncing)	/* its fdatasync runs without the lock */
		pthread_cond_wait(&j->synced_cond, &j->lock);
	if (ftruncate(j->fd, 0) < 0 || (j->fd1 >= 0 && ftruncate(j->fd1, 0) < 0) ||
	    fdatasync(j->fd) < 0 || (j->fd1 >= 0 && fdatasync(j->fd1) < 0))
		return false;	/* tried again at the next append */
	j->wfd = j->fd;
	j->off = 0;
	j->other_end = 0;
	j->cur_start = j->seq + 1;
	j->synced = j->seq;	/* what is below is gone, all retired */
	j->fail_err = 0;
	j->resets++;
	tlog(LOG_WARNING, "journal %s: every record of the failed sync retired: emptied, "
	     "records are taken again", j->name);
	return true;
}

/*
 * Under j's lock (dropped meanwhile; appends and syncs wait): make every
 * record of the file appended to durable, then start the other file with
 * JNL_START, durable before any other record goes there (so that what it
 * held before, an earlier round's, can never be read as records after
 * it: their seqs do not follow its), and append to it from now on.  A
 * failure to sync the file left is a failed sync (sync_failed); a failure
 * of the other file turns the ring off (the records go on where they
 * were, durable).
 */
static void ring_switch(struct jnl *j)
{
	static bool switch_eio;
	struct jnl_rec h = { .magic = JNL_MAGIC, .type = JNL_START, .hlen = sizeof(h) };
	int ofd = j->wfd, nfd, ret, nret = 0;
	uint64_t oend;

	j->switching = true;		/* no append from now on */
	while (j->syncing)
		pthread_cond_wait(&j->synced_cond, &j->lock);
	j->syncing = true;
	oend = j->off;
	h.seq = j->seq + 1;
	nfd = ofd == j->fd ? j->fd1 : j->fd;	/* both open: jnl_ring */
	junlock(j);
	ret = fdatasync(ofd) < 0 ? -errno : 0;
	if (!ret && fault_once("journal_switch_eio", &switch_eio))
		ret = -EIO;
	if (!ret) {
		struct iovec v = { &h, sizeof(h) };

		h.sum = rec_sum(&h, NULL, 0);
		nret = pwrite_all(nfd, &v, 1, sizeof(h), 0);
		if (!nret && fdatasync(nfd) < 0)
			nret = -errno;
	}
	jlock(j);
	if (ret) {
		sync_failed(j, j->synced, ret);
	} else {
		j->syncs++;
		j->synced = j->seq;	/* nothing was appended meanwhile */
		if (nret) {
			j->ring_at = 0;
			tlog(LOG_WARNING, "journal %s: cannot take its second file (%s): one "
			     "file from now on", j->name, strerror(-nret));
		} else {
			j->syncs++;
			j->wfd = nfd;
			j->seq = j->synced = h.seq;
			j->off = sizeof(h);
			j->other_end = oend;
			j->cur_start = h.seq;
			j->resets++;
		}
	}
	j->syncing = false;
	j->switching = false;
	pthread_cond_broadcast(&j->synced_cond);
}

int jnl_append(struct jnl *j, uint16_t type, const struct iovec *iov, int iovcnt,
	       uint64_t *seq)
{
	struct jnl_rec h = { .magic = JNL_MAGIC, .type = type, .hlen = sizeof(h) };
	bool live = type != JNL_RETIRE && type != JNL_NOTE;	/* until retired */
	struct iovec *v;
	uint64_t len = 0;
	int ret;

	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	if (len >= JNL_PAYLOAD_MAX)
		return -EFBIG;
	v = malloc(((size_t)iovcnt + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	h.len = len;
	jlock(j);
	while (j->switching)
		pthread_cond_wait(&j->synced_cond, &j->lock);
	if (type == JNL_NOTE && j->other_end) {
		junlock(j);	/* see jnl_ring: the emptying that notes need
				 * is for one file */
		free(v);
		return -EOPNOTSUPP;
	}
	if (type == JNL_NOTE)
		j->ring_at = 0;	/* one file from now on */
	if (j->ring_at && j->off >= j->ring_at && !j->fail_err && ring_other_done(j))
		ring_switch(j);	/* may wait: appends come after it */
	if (j->fail_err && type != JNL_RETIRE && !heal(j)) {
		ret = j->fail_err;	/* see sync_failed */
		junlock(j);
		free(v);
		return ret;
	}
	if (live && j->live == j->live_cap) {
		uint64_t cap = j->live_cap ? 2 * j->live_cap : 16;
		uint64_t *n = realloc(j->live_seq, cap * sizeof(*n));

		if (!n) {
			junlock(j);
			free(v);
			return -ENOMEM;
		}
		j->live_seq = n;
		j->live_cap = cap;
	}
	h.seq = j->seq + 1;
	h.sum = rec_sum(&h, iov, iovcnt);
	v[0] = (struct iovec){ &h, sizeof(h) };
	memcpy(v + 1, iov, (size_t)iovcnt * sizeof(*v));
	ret = pwrite_all(j->wfd, v, iovcnt + 1, sizeof(h) + len, j->off);
	if (!ret) {
		j->seq = h.seq;
		j->off += sizeof(h) + len;
		j->appends++;
		j->bytes += sizeof(h) + len;
		if (live)
			j->live_seq[j->live++] = h.seq;
		j->held = j->held || type == JNL_NOTE;
		*seq = h.seq;
	}
	junlock(j);
	free(v);
	return ret;
}

int jnl_sync(struct jnl *j, uint64_t seq)
{
	static bool sync_eio;
	int ret = 0, fd;

	jlock(j);
	for (;;) {
		uint64_t upto;

		/* a record of a failed sync, or after one: perhaps
		 * durable, never said to be (sync_failed) */
		if (j->fail_err && seq > j->fail_from) {
			ret = j->fail_err;
			break;
		}
		if (ret || j->synced >= seq)
			break;
		if (j->syncing) {
			pthread_cond_wait(&j->synced_cond, &j->lock);
			continue;
		}
		j->syncing = true;	/* j->wfd stays while it is set */
		upto = j->seq;
		fd = j->wfd;
		junlock(j);
		if (fdatasync(fd) < 0)
			ret = -errno;
		else if (fault_once("journal_sync_eio", &sync_eio))
			ret = -EIO;
		jlock(j);
		j->syncing = false;
		j->syncs++;
		if (ret)
			sync_failed(j, j->synced, ret);
		else if (j->synced < upto)
			j->synced = upto;
		pthread_cond_broadcast(&j->synced_cond);
	}
	junlock(j);
	return ret;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Where seq is in j->live_seq, or -1 (under j's lock). */
static int64_t live_find(const struct jnl *j, uint64_t seq)
{
	const uint64_t *at = j->live ? bsearch(&seq, j->live_seq, j->live,
					       sizeof(*j->live_seq), cmp_u64) : NULL;

	return at ? at - j->live_seq : -1;
}

/* Empty the journal (under j's lock; nothing in it is needed).  One file
 * only: a ring that took its second file is never emptied (maybe_reset,
 * and jnl_append refuses notes there). */
static void truncate_all(struct jnl *j)
{
	if (j->other_end)	/* set at every change of file */
		return;
	if (ftruncate(j->fd, 0) == 0) {
		j->off = 0;	/* seqs go on: what a lost truncation leaves
				 * past the new records does not follow them */
		j->cur_start = j->seq + 1;
		j->resets++;
	}
}

/*
 * Empty the journal where no record is live and it is long enough (under
 * j's lock).  Notes held are kept: the journal is replaced by one that
 * holds them alone (rewrite_kept; a few paths each), so that a reader
 * that is never done for long (a persistent tier whose DIR is away) does
 * not keep every record after them.
 */
static void maybe_reset(struct jnl *j)
{
	struct scanned *recs = NULL;
	uint64_t n = 0, len;
	int nfd;

	if (j->live || j->off < j->reset_at || j->ring_at)
		return;		/* the ring writes its files again instead */
	if (!j->held) {
		truncate_all(j);
		return;
	}
	/* not under a sync's fdatasync, which runs without the lock; one
	 * file (a ring that took its second one holds no note) */
	if (j->syncing || j->other_end || scan(j->fd, j->off, &recs, &n, JNL_NOTE))
		goto out;
	nfd = rewrite_kept(j->dirfd, j->name, j->fd, j->off, recs, n, j->seq + 1, &len);
	if (nfd < 0)
		goto out;	/* tried again at the next reset */
	/* the new journal under the same descriptor number: j->fd never
	 * changes, so that callers may test it without the lock */
	int r;

	while ((r = dup2(nfd, j->fd)) < 0 && (errno == EINTR || errno == EBUSY))
		;
	if (r < 0) {		/* not seen: the journal is nfd anyway */
		close(j->fd);
		j->fd = nfd;
	} else {
		close(nfd);
	}
	j->wfd = j->fd;
	j->cur_start = j->seq + 1;
	j->off = len;
	j->seq += n;
	j->synced = j->seq;
	j->resets++;
out:
	free(recs);
}

uint64_t jnl_retire(struct jnl *j, uint64_t seq)
{
	struct iovec v = { &seq, sizeof(seq) };
	uint64_t rs = 0;
	int64_t at;

	jlock(j);
	at = live_find(j, seq);
	rs = j->seq;
	junlock(j);
	if (at < 0)
		return rs;	/* retired already (or never live) */
	if (jnl_append(j, JNL_RETIRE, &v, 1, &rs))
		return 0;
	jlock(j);
	at = live_find(j, seq);
	if (at < 0) {		/* a concurrent retire of it came first */
		junlock(j);
		return rs;
	}
	memmove(j->live_seq + at, j->live_seq + at + 1,
		(j->live - (uint64_t)at - 1) * sizeof(*j->live_seq));
	j->live--;
	j->retires++;
	maybe_reset(j);
	junlock(j);
	return rs;
}

void jnl_notes_done(struct jnl *j)
{
	if (j->fd < 0)
		return;
	jlock(j);
	j->held = false;
	if (!j->live && j->off)
		truncate_all(j);	/* whatever its length: the reader's done
					 * records are not read again */
	junlock(j);
}

void jnl_counts(struct jnl *j, struct jnl_counts *c)
{
	jlock(j);
	*c = (struct jnl_counts){ .appends = j->appends, .bytes = j->bytes, .syncs = j->syncs,
				  .retires = j->retires, .live = j->live, .resets = j->resets,
				  .failures = j->failures };
	junlock(j);
}

/* ---- replay -------------------------------------------------------------- */

/* pread exactly len bytes: 0, or -errno (-EIO: the file ends first). */
static int pread_all(int fd, void *buf, uint64_t len, uint64_t off)
{
	while (len) {
		ssize_t n = pread(fd, buf, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		buf = (char *)buf + n;
		len -= (uint64_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

/*
 * Read the record at off (size: the file's): 1 with its header in *h and
 * payload in *p (malloc'ed), 0 where no valid record is there, -errno.
 */
static int read_rec(int fd, uint64_t off, uint64_t size, uint64_t prev_seq, bool first,
		    struct jnl_rec *h, void **p)
{
	struct iovec v;
	int ret;

	*p = NULL;
	if (size - off < sizeof(*h))
		return 0;
	ret = pread_all(fd, h, sizeof(*h), off);
	if (ret)
		return ret;
	if (h->magic != JNL_MAGIC || h->hlen != sizeof(*h) || h->len >= JNL_PAYLOAD_MAX ||
	    h->len > size - off - sizeof(*h) || (!first && h->seq != prev_seq + 1))
		return 0;
	*p = malloc(h->len ? h->len : 1);
	if (!*p)
		return -ENOMEM;
	ret = pread_all(fd, *p, h->len, off + sizeof(*h));
	if (ret) {
		free(*p);
		*p = NULL;
		return ret;
	}
	v = (struct iovec){ *p, h->len };
	if (rec_sum(h, &v, 1) != h->sum) {
		free(*p);
		*p = NULL;
		return 0;
	}
	return 1;
}

int jnl_read(struct jnl *j, uint64_t seq, uint16_t *type, void **p, uint64_t *len)
{
	uint64_t end, off = 0;
	struct jnl_rec h;
	int fd;

	*p = NULL;
	jlock(j);
	end = j->off;		/* records below it are whole */
	fd = j->wfd;
	if (seq < j->cur_start) {	/* in the other file (a live record's
					 * file is not taken again) */
		fd = j->wfd == j->fd ? j->fd1 : j->fd;
		end = j->other_end;
	}
	junlock(j);
	while (fd >= 0 && off + sizeof(h) <= end) {
		int ret = pread_all(fd, &h, sizeof(h), off);

		if (ret)
			return ret;
		if (h.magic != JNL_MAGIC || h.hlen != sizeof(h) || h.len > end - off - sizeof(h))
			return -ENOENT;
		if (h.seq == seq) {
			ret = read_rec(fd, off, end, 0, true, &h, p);
			if (ret <= 0)
				return ret ? ret : -EIO;
			*type = h.type;
			*len = h.len;
			return 0;
		}
		off += sizeof(h) + h.len;
	}
	return -ENOENT;
}

/*
 * Replace journal `name` (fd, size bytes) of dirfd by one that holds its
 * records recs[0..n) alone, renumbered from seq: written beside it,
 * synced, renamed over it, the directory synced.  The new journal's
 * descriptor (O_RDWR), its length in *len, or -errno (the journal left as
 * it was, unless the directory's sync failed after the rename).
 */
static int rewrite_kept(int dirfd, const char *name, int fd, uint64_t size,
			const struct scanned *recs, uint64_t n, uint64_t seq, uint64_t *len)
{
	char tmp[NAME_MAX + 1];
	uint64_t off = 0;
	int nfd, ret = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.new", name) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	nfd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (nfd < 0)
		return -errno;
	for (uint64_t i = 0; i < n && !ret; i++) {
		struct jnl_rec h;
		struct iovec v[2];
		void *p;
		int r = read_rec(fd, recs[i].off, size, 0, true, &h, &p);

		if (r <= 0) {
			ret = r ? r : -EIO;	/* it checked out a moment ago */
			break;
		}
		h.seq = seq + i;
		v[1] = (struct iovec){ p, h.len };
		h.sum = rec_sum(&h, &v[1], 1);
		v[0] = (struct iovec){ &h, sizeof(h) };
		ret = pwrite_all(nfd, v, 2, sizeof(h) + h.len, off);
		off += sizeof(h) + h.len;
		free(p);
	}
	if (!ret && fdatasync(nfd) < 0)
		ret = -errno;
	if (!ret && renameat(dirfd, tmp, dirfd, name) < 0)
		ret = -errno;
	if (ret) {
		unlinkat(dirfd, tmp, 0);
		close(nfd);
		return ret;
	}
	/* dirfd may be an O_PATH descriptor */
	int d = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (d < 0 || fsync(d) < 0)
		ret = -errno;
	if (d >= 0)
		close(d);
	if (ret)
		close(nfd);
	*len = off;
	return ret ? ret : nfd;	/* the rename is made: nfd is the journal */
}

/*
 * The records of type `only` among fd's first size bytes, which this
 * process appended (their headers are read, and trusted: the payloads of
 * other records are not read), in *recs (malloc'ed, *n of them).  0 or
 * -errno.
 */
static int scan(int fd, uint64_t size, struct scanned **recs, uint64_t *n, uint16_t only)
{
	uint64_t off = 0, cap = 0;
	struct jnl_rec h;
	int r = 0;

	*recs = NULL;
	*n = 0;
	while (off + sizeof(h) <= size && !(r = pread_all(fd, &h, sizeof(h), off))) {
		if (h.magic != JNL_MAGIC || h.hlen != sizeof(h) || h.len > size - off - sizeof(h))
			return -EIO;
		if (h.type == only && *n == cap) {
			struct scanned *m = realloc(*recs, (cap = cap ? 2 * cap : 64) * sizeof(*m));

			if (!m)
				return -ENOMEM;
			*recs = m;
		}
		if (h.type == only)
			(*recs)[(*n)++] = (struct scanned){ off, h.len, h.seq, h.type };
		off += sizeof(h) + h.len;
	}
	return r;
}

/* What replay's first pass found (replay_read): the records that check
 * out and the seqs that their JNL_RETIRE records retire. */
struct replay_set {
	struct scanned *recs;		/* every valid record, in order (malloc'ed) */
	uint64_t nrec, caprec;		/* in recs; its room */
	uint64_t *retired;		/* seqs retired, in record order (malloc'ed) */
	uint64_t nret, capret;		/* in retired; its room */
	uint64_t end;			/* offset past the last valid record */
};

/* Add the seq that retire record payload p names to rs->retired: 0 or
 * -ENOMEM. */
static int replay_add_retired(struct replay_set *rs, const void *p)
{
	if (rs->nret == rs->capret) {
		uint64_t *n;

		rs->capret = rs->capret ? 2 * rs->capret : 64;
		n = realloc(rs->retired, rs->capret * sizeof(*n));
		if (!n)
			return -ENOMEM;
		rs->retired = n;
	}
	memcpy(&rs->retired[rs->nret++], p, sizeof(uint64_t));
	return 0;
}

/* Add the record at off (header h) to rs->recs: 0 or -ENOMEM. */
static int replay_add_rec(struct replay_set *rs, const struct jnl_rec *h, uint64_t off)
{
	if (rs->nrec == rs->caprec) {
		struct scanned *n;

		rs->caprec = rs->caprec ? 2 * rs->caprec : 64;
		n = realloc(rs->recs, rs->caprec * sizeof(*n));
		if (!n)
			return -ENOMEM;
		rs->recs = n;
	}
	rs->recs[rs->nrec++] = (struct scanned){ off, h->len, h->seq, h->type };
	return 0;
}

/*
 * Replay's first pass: fd's records (size: the file's length) read in
 * order up to the first one that is torn, does not check out or does not
 * follow the one before, into rs (zeroed by the caller), rs->end set past
 * the last.  0 or -errno; rs holds what was read either way (the caller
 * frees it).
 */
static int replay_read(int fd, uint64_t size, struct replay_set *rs)
{
	uint64_t prev = 0;

	for (;;) {
		struct jnl_rec h;
		void *p;
		int r = read_rec(fd, rs->end, size, prev, rs->nrec == 0, &h, &p);

		if (r <= 0)
			return r;	/* 0: no valid record here, the end */
		r = 0;
		if (h.type == JNL_RETIRE && h.len == sizeof(uint64_t))
			r = replay_add_retired(rs, p);
		free(p);
		if (!r)
			r = replay_add_rec(rs, &h, rs->end);
		if (r)
			return r;
		prev = h.seq;
		rs->end += sizeof(h) + h.len;
	}
}

/*
 * Replay's second pass: each record of rs that is live (not JNL_RETIRE or
 * JNL_START, its seq not in retired, sorted, nret of them) read again
 * from fd (size bytes) and handed to fn(arg, ...), the outcomes counted in
 * st; the notes fn kept moved to the front of rs->recs (st->kept of them).
 * 0 or -errno where a record could not be read again.
 */
static int replay_apply(int fd, uint64_t size, struct replay_set *rs, const uint64_t *retired,
			uint64_t nret, jnl_apply_fn fn, void *arg, struct jnl_replay_stats *st)
{
	struct scanned *recs = rs->recs;

	for (uint64_t i = 0; i < rs->nrec; i++) {
		struct jnl_rec h;
		void *p;
		int r;

		if (recs[i].type == JNL_RETIRE || recs[i].type == JNL_START ||
		    (nret && bsearch(&recs[i].seq, retired, nret, sizeof(*retired), cmp_u64)))
			continue;
		r = read_rec(fd, recs[i].off, size, 0, true, &h, &p);
		if (r <= 0)
			return r ? r : -EIO;	/* it checked out a moment ago */
		r = fn(arg, h.type, h.seq, p, h.len);
		free(p);
		if (r == JNL_KEEP && h.type == JNL_NOTE)
			recs[st->kept++] = recs[i];	/* below i: read already */
		else if (r == 0)
			st->applied++;
		else if (r > 0)
			st->skipped++;
		else
			st->failed++;
	}
	return 0;
}

/*
 * After replay_apply, journal `name` of dirfd (fd, size bytes) emptied
 * durably, or replaced by one that holds the st->kept notes at the front
 * of recs alone; left as it is where fn failed a record.  0 or -errno.
 */
static int replay_settle(int dirfd, const char *name, int fd, uint64_t size,
			 const struct scanned *recs, const struct jnl_replay_stats *st)
{
	if (st->failed)
		return 0;
	/* everything is in its file (synced by fn): start afresh, with the
	 * notes kept */
	if (st->kept) {
		uint64_t len;
		int nfd = rewrite_kept(dirfd, name, fd, size, recs, st->kept, 1, &len);

		if (nfd >= 0)
			close(nfd);
		return nfd < 0 ? nfd : 0;
	}
	if (ftruncate(fd, 0) < 0 || fsync(fd) < 0)
		return -errno;
	return 0;
}

/* One file of a journal being replayed. */
struct replay_file {
	int fd;				/* -1: absent */
	uint64_t size;
	struct replay_set rs;
	struct jnl_replay_stats st;
};

/* Open and read file `name` of dirfd into rf (zeroed by the caller): 0
 * (rf->fd -1 where it is absent) or -errno. */
static int replay_file_read(int dirfd, const char *name, struct replay_file *rf)
{
	struct stat sb;
	int ret;

	rf->fd = openat(dirfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (rf->fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (fstat(rf->fd, &sb) < 0)
		return -errno;
	rf->size = (uint64_t)sb.st_size;
	ret = replay_read(rf->fd, rf->size, &rf->rs);
	if (ret)
		return ret;
	rf->st.records = rf->rs.nrec;
	if (rf->rs.end < rf->size && rf->rs.nrec && rf->rs.recs[0].type == JNL_START)
		return 0;	/* a file the ring took again: the rest is an
				 * earlier round's */
	if (rf->rs.end < rf->size) {
		rf->st.torn = true;
		rf->st.dropped_bytes = rf->size - rf->rs.end;
		tlog(LOG_WARNING, "journal %s: %" PRIu64 " bytes at its end are not whole, "
		     "valid records (a write cut short): dropped", name, rf->st.dropped_bytes);
	}
	return 0;
}

int jnl_replay(int dirfd, const char *name, jnl_apply_fn fn, void *arg,
	       struct jnl_replay_stats *st)
{
	struct replay_file f[2];
	char n1[NAME_MAX + 1];
	uint64_t *retired = NULL, nret;
	int ret, first;

	memset(st, 0, sizeof(*st));
	memset(f, 0, sizeof(f));
	f[0].fd = f[1].fd = -1;
	ret = jnl_name1(name, n1, sizeof(n1));
	if (!ret)
		ret = replay_file_read(dirfd, name, &f[0]);
	if (!ret)
		ret = replay_file_read(dirfd, n1, &f[1]);
	if (ret || (f[0].fd < 0 && f[1].fd < 0))
		goto out;
	/* the retired seqs of both files (a record's retirement may be in
	 * the file after its own) */
	nret = f[0].rs.nret + f[1].rs.nret;
	retired = malloc((nret ? nret : 1) * sizeof(*retired));
	if (!retired) {
		ret = -ENOMEM;
		goto out;
	}
	if (f[0].rs.nret)
		memcpy(retired, f[0].rs.retired, f[0].rs.nret * sizeof(*retired));
	if (f[1].rs.nret)
		memcpy(retired + f[0].rs.nret, f[1].rs.retired, f[1].rs.nret * sizeof(*retired));
	if (nret)	/* qsort's base may not be NULL, even for no element */
		qsort(retired, nret, sizeof(*retired), cmp_u64);
	/* the file of the earlier records first: each holds a run of seqs */
	first = f[1].rs.nrec && (!f[0].rs.nrec || f[1].rs.recs[0].seq < f[0].rs.recs[0].seq);
	for (int k = 0; k < 2 && !ret; k++) {
		struct replay_file *rf = &f[k ? !first : first];

		if (rf->fd >= 0)
			ret = replay_apply(rf->fd, rf->size, &rf->rs, retired, nret, fn, arg,
					   &rf->st);
	}
	for (int k = 0; k < 2; k++) {
		st->records += f[k].st.records;
		st->applied += f[k].st.applied;
		st->skipped += f[k].st.skipped;
		st->failed += f[k].st.failed;
		st->kept += f[k].st.kept;
		st->dropped_bytes += f[k].st.dropped_bytes;
		st->torn = st->torn || f[k].st.torn;
	}
	if (ret || st->failed)
		goto out;	/* the journal keeps what failed */
	/* everything is in its file (synced by fn): the second file emptied
	 * first (what is left is all in the first one then, applied), the
	 * first one with the notes kept (the second holds none: jnl_append) */
	if (f[1].fd >= 0 && f[1].st.kept) {
		tlog(LOG_WARNING, "journal %s: notes in its second file: kept as it is", name);
		goto out;
	}
	if (f[1].fd >= 0 && (ftruncate(f[1].fd, 0) < 0 || fsync(f[1].fd) < 0)) {
		ret = -errno;
		goto out;
	}
	if (f[0].fd >= 0)
		ret = replay_settle(dirfd, name, f[0].fd, f[0].size, f[0].rs.recs, &f[0].st);
out:
	for (int k = 0; k < 2; k++) {
		free(f[k].rs.recs);
		free(f[k].rs.retired);
		if (f[k].fd >= 0)
			close(f[k].fd);
	}
	free(retired);
	return ret;
}

/* ---- JNL_DELTA ------------------------------------------------------------ */

/* The delta payload's fixed part; then the handle, the path, the ranges
 * (struct jnl_range each) and their bytes, in range order. */
struct delta_head {
	uint64_t dev, ino, size;
	int64_t mtime_sec, mtime_nsec;
	uint32_t handle_len, path_len, n, pad;
};

int jnl_delta_append(struct jnl *j, const struct jnl_delta *d, const void *base,
		     uint64_t *seq)
{
	struct delta_head h = {
		.dev = d->dev, .ino = d->ino, .size = d->size,
		.mtime_sec = d->mtime_sec, .mtime_nsec = d->mtime_nsec,
		.handle_len = d->handle ? d->handle_len : 0,
		.path_len = d->path ? (uint32_t)strlen(d->path) : 0, .n = d->n,
	};
	struct iovec *v = malloc(((size_t)d->n + 4) * sizeof(*v));
	int k = 0, ret;

	if (!v)
		return -ENOMEM;
	v[k++] = (struct iovec){ &h, sizeof(h) };
	v[k++] = (struct iovec){ (void *)d->handle, h.handle_len };
	v[k++] = (struct iovec){ (void *)d->path, h.path_len };
	v[k++] = (struct iovec){ (void *)d->r, (size_t)d->n * sizeof(*d->r) };
	for (uint32_t i = 0; i < d->n; i++)
		if (!(d->r[i].len & JNL_ZERO))
			v[k++] = (struct iovec){ (char *)base + d->r[i].off, d->r[i].len };
	ret = jnl_append(j, JNL_DELTA, v, k, seq);
	free(v);
	return ret;
}

/* len bytes of p written at off of fd.  0 or -errno. */
static int pwrite_buf(int fd, const char *p, uint64_t len, uint64_t off)
{
	struct iovec v = { (void *)p, len };

	return len ? pwrite_all(fd, &v, 1, len, off) : 0;
}

/* Zero runs of a range FC_HOLE_RUN long or more (whole blocks of the
 * file) are punched, not written: a hole stays a hole, as a whole version
 * leaves it (the engine's sparse writes). */
#define HOLE_BLOCK	4096u

/* Range [off, off + len) of fd made p's bytes: its data written, its runs
 * of zeros (FC_HOLE_RUN, whole blocks of the file) punched (fc_clear_range);
 * a short run of zeros is written with the data around it.  0 or -errno. */
static int write_range(int fd, const char *p, uint64_t off, uint64_t len)
{
	uint64_t head = (HOLE_BLOCK - off % HOLE_BLOCK) % HOLE_BLOCK, pos, next;
	const uint8_t *blocks;
	bool hole;
	int ret;

	head = head < len ? head : len;		/* to the file's next block */
	ret = pwrite_buf(fd, p, head, off);
	blocks = (const uint8_t *)p + head;
	for (pos = head; !ret && pos < len; pos = next) {
		next = head + fc_zero_run(blocks, pos - head, len - head, HOLE_BLOCK, FC_HOLE_RUN,
					  false, &hole);
		ret = hole ? fc_clear_range(fd, (loff_t)(off + pos), (loff_t)(off + next))
			   : pwrite_buf(fd, p + pos, next - pos, off + pos);
	}
	return ret;
}

/*
 * Write ranges r (n) into fd, size it and set its mtime, fsync it.  The
 * bytes of range i are at base + r[i].off, or (packed) one after the
 * other from base.
 */
static int write_delta(int fd, const struct jnl_range *r, uint32_t n, const void *base,
		       bool packed, uint64_t size, int64_t mtime_sec, int64_t mtime_nsec,
		       bool sync)
{
	const char *at = base;

	for (uint32_t i = 0; i < n; i++) {
		const char *p = packed ? at : (const char *)base + r[i].off;
		uint64_t len = r[i].len & ~JNL_ZERO;
		int ret = r[i].len & JNL_ZERO ?
			fc_clear_range(fd, (loff_t)r[i].off, (loff_t)(r[i].off + len)) :
			write_range(fd, p, r[i].off, len);

		if (ret)
			return ret;
		if (!(r[i].len & JNL_ZERO))
			at += len;
	}
	if (ftruncate(fd, (off_t)size) < 0)
		return -errno;
	if (mtime_sec || mtime_nsec) {
		struct timespec tv[2] = { { 0, UTIME_OMIT }, { mtime_sec, mtime_nsec } };

		futimens(fd, tv);
	}
	/*
	 * fdatasync: the bytes and the size.  The mtime set above is
	 * committed by the backing file system's log no later than the
	 * journal's next sync (ext4's and XFS's logs commit in order), which
	 * is what makes the record's retirement durable.
	 */
	return !sync ? 0 : fdatasync(fd) < 0 ? -errno : 0;
}

int jnl_delta_write(int fd, const struct jnl_range *r, uint32_t n, const void *base,
		    uint64_t size, int64_t mtime_sec, int64_t mtime_nsec, bool sync)
{
	return write_delta(fd, r, n, base, false, size, mtime_sec, mtime_nsec, sync);
}

/*
 * Is fd the file a record names: its inode number, and (where the record
 * has one) its handle, which tells a reused inode number from the file
 * itself.  Not its device number: a disk may come back under another
 * after a crash (and the file is beneath the backing root anyway).
 */
static bool same_file(int fd, uint64_t ino, const void *handle, uint32_t handle_len)
{
	union {
		struct file_handle fh;
		char buf[sizeof(struct file_handle) + MAX_HANDLE_SZ];
	} u;
	struct stat st;
	int mnt;

	if (fstat(fd, &st) < 0 || st.st_ino != (ino_t)ino || !S_ISREG(st.st_mode))
		return false;
	if (handle_len < sizeof(struct file_handle))
		return true;
	u.fh.handle_bytes = MAX_HANDLE_SZ;
	if (name_to_handle_at(fd, "", &u.fh, &mnt, AT_EMPTY_PATH) < 0)
		return true;	/* no handles here: the inode is all there is */
	return sizeof(u.fh) + u.fh.handle_bytes == handle_len &&
	       !memcmp(&u.fh, handle, handle_len);
}

/* Is fd's file beneath directory root_fd (by their paths)? */
static bool beneath(int root_fd, int fd)
{
	char proc[64], root[PATH_MAX], path[PATH_MAX];
	ssize_t rn, pn;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", root_fd);
	rn = readlink(proc, root, sizeof(root) - 1);
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	pn = readlink(proc, path, sizeof(path) - 1);
	if (rn <= 0 || pn <= 0)
		return false;
	root[rn] = path[pn] = 0;
	if (!strcmp(root, "/"))
		rn = 0;
	return pn > rn && !strncmp(path, root, (size_t)rn) && path[rn] == '/';
}

/* Open path beneath root_fd without following symlinks: fd or -1 (errno). */
static int open_beneath(int root_fd, const char *path, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)flags | O_NOFOLLOW | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	int fd = (int)syscall(SYS_openat2, root_fd, path, &how, sizeof(how));

	if (fd < 0 && errno == ENOSYS)
		fd = openat(root_fd, path, flags | O_NOFOLLOW | O_CLOEXEC);
	return fd;
}

/*
 * The file a record names (inode ino, its handle of handle_len bytes,
 * path or NULL), O_RDWR: by its path beneath root_fd (no symlinks
 * followed); where that names another file now (renamed since), by its
 * handle, if the file it opens is still beneath root_fd.  -ENOENT with why
 * where neither finds it; -errno where the path names something that
 * cannot be opened for writing now (an immutable file, a read-only file
 * system, no memory): not a reason to drop the record.
 */
static int file_open(int root_fd, uint64_t ino, const void *handle, uint32_t handle_len,
		     const char *path, char *why, size_t wl)
{
	int fd = -1;

	snprintf(why, wl, "removed since");
	if (path && path[0]) {
		fd = open_beneath(root_fd, path, O_RDWR);
		if (fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS ||
			       errno == EIO || errno == ENOMEM || errno == EMFILE ||
			       errno == ENFILE || errno == ETXTBSY)) {
			int ret = -errno;	/* there, and not writable now: the
						 * record stays */

			snprintf(why, wl, "not writable");
			return ret;
		}
		if (fd >= 0 && same_file(fd, ino, handle, handle_len))
			return fd;
		if (fd >= 0) {
			snprintf(why, wl, "another file now");
			close(fd);
		}
	}
	if (handle_len >= sizeof(struct file_handle)) {
		int mfd = openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		struct file_handle *fh = malloc(handle_len);

		fd = -1;
		if (mfd >= 0 && fh) {
			memcpy(fh, handle, handle_len);
			if (fh->handle_bytes + sizeof(*fh) == handle_len)
				fd = open_by_handle_at(mfd, fh, O_RDWR | O_CLOEXEC);
		}
		free(fh);
		if (fd >= 0 && (!same_file(fd, ino, handle, handle_len) || !beneath(mfd, fd))) {
			close(fd);
			fd = -1;
		}
		if (mfd >= 0)
			close(mfd);
		if (fd >= 0)
			return fd;
	}
	return -ENOENT;
}

int jnl_delta_apply(int root_fd, const void *p, uint64_t len, char *why, size_t wl)
{
	const char *q = p;
	struct delta_head h;
	struct jnl_range *r = NULL;
	char *path = NULL;
	uint64_t need, bytes = 0;
	int fd, ret;

	snprintf(why, wl, "-");
	if (len < sizeof(h))
		return -EINVAL;
	memcpy(&h, q, sizeof(h));
	need = sizeof(h) + (uint64_t)h.handle_len + h.path_len + (uint64_t)h.n * sizeof(*r);
	if (need > len || h.path_len >= PATH_MAX)
		return -EINVAL;
	/* copied: they may be unaligned in p */
	r = malloc(((size_t)h.n ? h.n : 1) * sizeof(*r));
	if (!r)
		return -ENOMEM;
	memcpy(r, q + sizeof(h) + h.handle_len + h.path_len, (size_t)h.n * sizeof(*r));
	ret = -EINVAL;
	for (uint32_t i = 0; i < h.n; i++) {
		uint64_t rl = r[i].len & ~JNL_ZERO;

		if (r[i].off + rl < r[i].off || r[i].off + rl > h.size)
			goto out_r;
		if (!(r[i].len & JNL_ZERO))
			bytes += rl;
	}
	if (bytes != len - need)
		goto out_r;
	ret = -ENOMEM;
	path = strndup(q + sizeof(h) + h.handle_len, h.path_len);
	if (!path)
		goto out_r;
	fd = file_open(root_fd, h.ino, q + sizeof(h), h.handle_len, path, why, wl);
	free(path);
	if (fd < 0) {
		ret = fd == -ENOENT ? 1 : fd;
		goto out_r;
	}
	ret = write_delta(fd, r, h.n, q + need, true, h.size, h.mtime_sec, h.mtime_nsec, true);
	close(fd);
out_r:
	free(r);
	return ret;
}

/* ---- JNL_REDO ------------------------------------------------------------- */

/* The intent payload's fixed part; then the handle, the path and the
 * version's name. */
struct redo_head {
	uint64_t dev, ino, size, vino;
	uint32_t handle_len, path_len, version_len, pad;
};

int jnl_redo_append(struct jnl *j, const struct jnl_redo *r, uint64_t *seq)
{
	struct redo_head h = {
		.dev = r->dev, .ino = r->ino, .size = r->size, .vino = r->vino,
		.handle_len = r->handle ? r->handle_len : 0,
		.path_len = r->path ? (uint32_t)strlen(r->path) : 0,
		.version_len = (uint32_t)strlen(r->version),
	};
	struct iovec v[4] = {
		{ &h, sizeof(h) },
		{ (void *)r->handle, h.handle_len },
		{ (void *)r->path, h.path_len },
		{ (void *)r->version, h.version_len },
	};

	if (!h.version_len || h.version_len >= PATH_MAX || h.path_len >= PATH_MAX)
		return -EINVAL;
	return jnl_append(j, JNL_REDO, v, 4, seq);
}

/*
 * The version's data runs are copied and its holes made holes in fd
 * (filecopy.h): a sparse file stays sparse, and the copy costs its data,
 * not its size.  Where vfd cannot say (no SEEK_DATA), all of it is data.
 * The "inplace_copy" kill (tests) comes once half of size is copied.
 */
int jnl_redo_write(int vfd, int fd, uint64_t size, bool sync)
{
	char cap[256];
	loff_t pos = 0, end = (loff_t)size, half = (loff_t)(size / 2);
	bool plain = false, fault = tierfs_fault("inplace_copy");
	int ret = 0;
	/*
	 * Our writes take the file's capability away (any write does, root's
	 * too); it was the user's to keep: put back after the copy.  (A kill
	 * in between loses it; a replay of the intent restores the data only.)
	 */
	ssize_t caplen = fgetxattr(fd, "security.capability", cap, sizeof(cap));

	while (!ret && pos < end) {
		loff_t data, hole;

		if (fault && pos >= half)
			raise(SIGKILL);		/* tests: a kill halfway */
		fc_next_run(vfd, pos, end, &data, &hole);
		ret = fc_clear_range(fd, pos, data);
		if (ret || data == end)
			break;
		if (fault && data >= half)
			raise(SIGKILL);
		if (fault && hole > half) {
			ret = fc_copy_range(vfd, fd, data, half, &plain);
			if (!ret)
				raise(SIGKILL);
		}
		ret = fc_copy_range(vfd, fd, data, hole, &plain);
		pos = hole;
	}
	if (ret)
		return ret;
	if (fault)
		raise(SIGKILL);			/* the data all before half */
	if (ftruncate(fd, (off_t)size) < 0)
		return -errno;
	if (caplen > 0 && fsetxattr(fd, "security.capability", cap, (size_t)caplen, 0) < 0)
		tlog(LOG_WARNING, "a file capability could not be put back after an in-place "
		     "copy: %s", strerror(errno));
	return sync && fsync(fd) < 0 ? -errno : 0;
}

int jnl_redo_apply(int root_fd, const void *p, uint64_t len, char *why, size_t wl)
{
	const char *q = p;
	struct redo_head h;
	char *path = NULL, *version = NULL;
	struct stat vst;
	int fd = -1, vfd = -1, ret;

	snprintf(why, wl, "-");
	if (len < sizeof(h))
		return -EINVAL;
	memcpy(&h, q, sizeof(h));
	if (len != sizeof(h) + (uint64_t)h.handle_len + h.path_len + h.version_len ||
	    h.path_len >= PATH_MAX || !h.version_len || h.version_len >= PATH_MAX)
		return -EINVAL;
	ret = -ENOMEM;
	path = strndup(q + sizeof(h) + h.handle_len, h.path_len);
	version = strndup(q + sizeof(h) + h.handle_len + h.path_len, h.version_len);
	if (!path || !version)
		goto out;
	ret = 1;
	vfd = open_beneath(root_fd, version, O_RDONLY);
	if (vfd < 0 || fstat(vfd, &vst) < 0) {
		snprintf(why, wl, "its new version %s is gone (%s)", version, strerror(errno));
		goto out;
	}
	if (!S_ISREG(vst.st_mode) || vst.st_ino != (ino_t)h.vino ||
	    (uint64_t)vst.st_size != h.size) {
		snprintf(why, wl, "its new version %s is another file now", version);
		goto out;
	}
	char fwhy[64];

	fd = file_open(root_fd, h.ino, q + sizeof(h), h.handle_len, path, fwhy, sizeof(fwhy));
	if (fd < 0) {
		snprintf(why, wl, "its file %s is %s", path[0] ? path : "(no path)", fwhy);
		ret = fd == -ENOENT ? 1 : fd;
		goto out;
	}
	ret = jnl_redo_write(vfd, fd, h.size, true);
out:
	if (fd >= 0)
		close(fd);
	if (vfd >= 0)
		close(vfd);
	free(path);
	free(version);
	return ret;
}
