/*
 * flush_journal.h - the journal flush, as flush.c calls it (flush_journal.c):
 * a small change of a file in place made durable as a journal record, then
 * applied in the backing file and retired.
 *
 * A flush plans under e->lock (eng_jf_plan: no plan, p->r NULL, where the
 * change is not small); alone (eng_jf_flush) or in a group of small files
 * (flush.c's journal_group, in phases: eng_jf_record appends, one sync for
 * the group, eng_jf_recorded, the applies, one sync, eng_jf_applied), with
 * the copy leased and e->lock not held.  The flushers sync the applies left
 * to their pause (eng_asettle_all); eng_asettle_file and eng_settle_record
 * (engine_int.h) settle one file's before anything newer of it is written.
 */
#ifndef TIERFS_FLUSH_JOURNAL_H
#define TIERFS_FLUSH_JOURNAL_H

#include "engine_int.h"
#include "ssd.h"

/*
 * A file changed in place by a few bytes is not flushed as a new version
 * (its whole content written again): the changed ranges go into a journal
 * record (tfile_ops.journal_delta: appended and synced, one sequential
 * write), which makes them durable, and then into the backing file itself
 * (journal_apply, synced); the record is retired after.  A crash between
 * the two leaves the older version plus the record, which the next start
 * (or tierfs --recover) applies.  An fsync that made the flush in its own
 * thread (eng_flush_inline: ring NULL) returns once the record is durable;
 * the apply is left to a flusher.
 *
 * The changed ranges are those f->dd keeps (write.c) since the backing
 * file last held the file's content: while they are valid, the content
 * differs from the backing file only inside them and at or past
 * clean_len.
 */
struct jflush {
	struct drange *r;		/* the ranges to journal / apply, NULL: none */
	uint32_t n;
	bool record;			/* a new record (else f->jseq's is applied) */
	uint64_t pending;		/* f->jseq when planned */
	uint32_t cap;			/* r's room */
	uint64_t bytes;			/* in r */
	uint64_t sparse;		/* bytes from here to the end are new to
					 * the backing file (past its size):
					 * their data runs only (journal_tail),
					 * UINT64_MAX: none */
};

/* e->lock held: plan the journal flush of len bytes of f (copy cp) in p. */
void eng_jf_plan(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
		 struct jflush *p);
/* Phase 1: p's record appended (synced where sync), *seq the record to
 * apply: 0, 2 where f cannot be journalled after all, or -errno. */
int eng_jf_record(struct engine *e, struct tfile *f, struct copy *cp, uint64_t len,
		  struct jflush *p, bool sync, uint64_t *seq);
/* Phase 2: record seq, durable, is f's as of gen. */
void eng_jf_recorded(struct engine *e, struct tfile *f, uint64_t gen, uint64_t seq);
/* Phase 3: record seq is in the backing file, synced: retired. */
void eng_jf_applied(struct engine *e, struct tfile *f, uint64_t seq);
/* The journal flush of p alone: 0, 1 (inline_: the record is durable, the
 * apply left to a flusher), 2 (write a new version instead), or -errno. */
int eng_jf_flush(struct engine *e, struct tfile *f, struct copy *cp, uint64_t gen,
		 uint64_t len, struct jflush *p, bool inline_);
/* e->lock held (dropped meanwhile): every apply left to a flusher's pause
 * synced, together, and its record retired. */
void eng_asettle_all(struct engine *e, struct ssd_ring *ring);

#endif /* TIERFS_FLUSH_JOURNAL_H */
