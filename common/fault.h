/*
 * fault.h - test hooks (tests/README.md): fault injection and delays at
 * named points of the daemon, set from the environment.
 */
#ifndef TIERFS_FAULT_H
#define TIERFS_FAULT_H

#include <stdbool.h>

/*
 * Test hooks: TIERFS_FAULT=POINT names one point where the daemon kills
 * itself (SIGKILL), for the tests of what a restart finds.  Points:
 * new_linked, small_written (fs_version.c); inplace_copy (store/records.c,
 * the copy of a commit intent); incr_write, dedup_write (dedup_flush.c);
 * journal_appended, redo_appended, clone_appended, journal_apply_torn
 * (fs_journal.c);
 * name_made (a new name in the backing directory,
 * made by create, mknod or link, before anything else: fs_file.c,
 * fs_ops.c).  tierfs_fault() tells whether POINT is the one named;
 * tierfs_fault_kill() kills there if it is.  Not a kill:
 * journal_apply_eio (every apply of a journalled change fails),
 * inplace_copy_eio (the first copy of a commit intent fails: fs_intent.c),
 * journal_sync_eio (the journal's first sync runs, then reports EIO:
 * store/journal.c), journal_switch_eio (the same for the sync of the file
 * left at the journal's first change of file: store/journal.c),
 * journal_settle_later (every apply's sync is left to a
 * flusher's pause, not only while other flushes are due: flush_journal.c).
 * TIERFS_FAULT_ARM=PATH arms the point only once PATH exists (a test
 * creates it when the daemon is in the state it wants the fault in);
 * "once" points count their one time from then.
 */
bool tierfs_fault(const char *point);
void tierfs_fault_kill(const char *point);
/*
 * TIERFS_DELAY="point=ms[,point=ms...]" names points where a thread
 * sleeps, for the tests of races: tierfs_delay_ms() is the milliseconds
 * named for POINT (logged at LOG_DEBUG), 0 for none.  Points: flush_start,
 * flush_write (flush.c), journal_apply, journal_settle_applied
 * (flush_journal.c: before a flusher syncs the applies left to it), dedup_cloned (dedup_flush.c: after
 * a flush cloned its base), clone_recorded (dedup_flush.c: a flush whose
 * clone record is durable, before its version is written), shadow_copy (write.c), prefetch_read
 * (prefetch.c); eng_delay_at() (engine_int.h) sleeps them.  In fs/:
 * release (fs_file.c: a writer's release), set_eval (fs_sets.c: between a
 * set's file's state and its backing file's stat), settle (fs_intent.c:
 * before the settler syncs files copied in place and retires their
 * intents), intent_copy (fs_intent.c: a commit intent durable, before its
 * copy in place), persist_extras (persist_fetch.c: a listing between its read
 * of DIR's names and its look at the queue's removals and renames),
 * getattr_root (fs_ops.c: a getattr of the mount's root).
 */
long tierfs_delay_ms(const char *point);
/* Sleep the milliseconds TIERFS_DELAY names for POINT, if any (no lock of
 * the caller's is dropped: the engine's points use eng_delay_at). */
void tierfs_delay(const char *point);

#endif /* TIERFS_FAULT_H */
