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
 * then a small change is made durable as a whole new version instead
 * (jnl_failed), a change that needs a record fails (EIO) and is tried
 * again, and retire records are still taken.
 *
 * The payloads of the records of changes (deltas, commit intents), their
 * writes into files and their applies are records.c's.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>
#include <xxhash.h>

#include "clock.h"
#include "fault.h"
#include "journal.h"
#include "journal_int.h"
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

/*
 * A record longer than two of these is written in steps of JNL_STEP bytes,
 * each step's write-back started (sync_file_range) before the next is copied
 * into the page cache: the device writes one step while the next is
 * copied, and the sync that follows waits for the last steps alone, not
 * for the whole record (a clone record of a 1 GiB checkpoint is tens of
 * MiB).  Smaller records are one write, as the sync writes them at once.
 */
#define JNL_STEP	(2u << 20)

/* See journal_int.h. */
int jnl_pwrite_all(int fd, struct iovec *iov, int iovcnt, uint64_t total, uint64_t off)
{
	bool steps = total > 2 * JNL_STEP;

	while (total) {
		int cnt = iovcnt < IOV_MAX ? iovcnt : IOV_MAX;
		size_t cut = 0, sum = 0;
		ssize_t n;

		if (steps) {	/* at most JNL_STEP bytes: the iovecs that
				 * fit, the last one cut short for the call */
			for (cnt = 0; cnt < iovcnt && cnt < IOV_MAX && sum < JNL_STEP; cnt++)
				sum += iov[cnt].iov_len;
			if (sum > JNL_STEP) {
				cut = iov[cnt - 1].iov_len;
				iov[cnt - 1].iov_len -= sum - JNL_STEP;
			}
		}
		n = pwritev(fd, iov, cnt, (off_t)off);
		if (cut)
			iov[cnt - 1].iov_len = cut;
		if (n > 0 && steps)	/* a hint: the sync writes what it misses */
			(void)sync_file_range(fd, (off_t)off, n, SYNC_FILE_RANGE_WRITE);

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

uint64_t jnl_ring_blocker(struct jnl *j)
{
	uint64_t seq = 0;

	jlock(j);
	if (j->ring_at && j->off >= j->ring_at && j->live && !ring_other_done(j))
		seq = j->live_seq[0];	/* notes turned the ring off: not held */
	junlock(j);
	return seq;
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
		nret = jnl_pwrite_all(nfd, &v, 1, sizeof(h), 0);
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
	double t0;
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
	t0 = tier_now();
	ret = jnl_pwrite_all(j->wfd, v, iovcnt + 1, sizeof(h) + len, j->off);
	j->append_s += tier_now() - t0;
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
	double t0;

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
		t0 = tier_now();
		if (fdatasync(fd) < 0)
			ret = -errno;
		else if (fault_once("journal_sync_eio", &sync_eio))
			ret = -EIO;
		t0 = tier_now() - t0;
		jlock(j);
		j->syncing = false;
		j->syncs++;
		j->sync_s += t0;
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

bool jnl_failed(struct jnl *j)
{
	bool failed;

	jlock(j);
	failed = j->fail_err && !heal(j);
	junlock(j);
	return failed;
}

void jnl_counts(struct jnl *j, struct jnl_counts *c)
{
	jlock(j);
	*c = (struct jnl_counts){ .appends = j->appends, .bytes = j->bytes, .syncs = j->syncs,
				  .retires = j->retires, .live = j->live, .resets = j->resets,
				  .failures = j->failures, .append_s = j->append_s,
				  .sync_s = j->sync_s };
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
		ret = jnl_pwrite_all(nfd, v, 2, sizeof(h) + h.len, off);
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
