/*
 * lifecycle.c - the per-file, per-tier life cycle of a cached copy.
 *
 * Every copy of a file in a cache tier carries an enum tier_state.  The
 * engine moves it along two paths:
 *
 *   checkpoint: INIT -> WRITE_IN_PROGRESS -> WRITE_COMPLETE -> FLUSHED
 *   restore:    INIT -> READ_IN_PROGRESS  -> READ_COMPLETE  -> CONSUMED
 *
 * FLUSHED and CONSUMED copies hold nothing that is not also in the next
 * tier, so they may be evicted; every other state pins the copy's data in
 * its tier.  The table below is the whole truth about which moves are
 * legal; tier_set_state() asserts against it on every move, so a bug in
 * the engine shows up at the transition that breaks the rules rather than
 * as lost data later.
 *
 * Callers hold the engine lock (the state lives in struct copy).  Nothing
 * here takes a lock or allocates.
 */
#include <assert.h>
#include <stdio.h>

#include "tier.h"

static const char *const state_names[TS_NSTATES] = {
	[TS_INIT]		= "INIT",
	[TS_WRITE_IN_PROGRESS]	= "WRITE_IN_PROGRESS",
	[TS_WRITE_COMPLETE]	= "WRITE_COMPLETE",
	[TS_FLUSHED]		= "FLUSHED",
	[TS_READ_IN_PROGRESS]	= "READ_IN_PROGRESS",
	[TS_READ_COMPLETE]	= "READ_COMPLETE",
	[TS_CONSUMED]		= "CONSUMED",
};

/*
 * Allowed transitions, allowed[from][to].  A transition to the same state
 * is not a transition and is refused: callers test before moving.
 *
 * from \ to          INIT WIP WC  FL  RIP RC  CON
 * INIT                .   x   .   .   x   .   .
 * WRITE_IN_PROGRESS   d   .   x   .   .   .   .
 * WRITE_COMPLETE      d   x   .   x   .   .   .
 * FLUSHED             x   x   .   .   .   x   .
 * READ_IN_PROGRESS    x   .   .   .   .   x   .
 * READ_COMPLETE       x   x   .   .   .   .   x
 * CONSUMED            x   x   .   .   .   x   .
 *
 * Notes:
 * - WRITE_COMPLETE -> WRITE_IN_PROGRESS and FLUSHED/READ_COMPLETE/CONSUMED
 *   -> WRITE_IN_PROGRESS: the file is written again.
 * - FLUSHED -> READ_COMPLETE: a flushed copy that is read is promoted in
 *   place; CONSUMED -> READ_COMPLETE: it is read again.
 * - WRITE_COMPLETE -> READ_COMPLETE is refused on purpose: a copy that is
 *   read while its flush runs is marked promoted (copy.promoted) and goes
 *   WRITE_COMPLETE -> FLUSHED -> READ_COMPLETE once the flush ends, so the
 *   flushed state (the data is safe in the next tier) is never skipped.
 * - READ_IN_PROGRESS -> INIT: a prefetch cancelled before it completed.
 * - FLUSHED/READ_COMPLETE/CONSUMED -> INIT: the copy is dropped.
 * - d: WRITE_IN_PROGRESS/WRITE_COMPLETE -> INIT drop unflushed data.  They
 *   are legal only for a discarded file (unlinked, or marked discardable),
 *   whose data must never reach the SSD; the table cannot see that, so the
 *   engine must only use them for such files.
 */
static const bool allowed[TS_NSTATES][TS_NSTATES] = {
	[TS_INIT] = {
		[TS_WRITE_IN_PROGRESS]	= true,
		[TS_READ_IN_PROGRESS]	= true,
	},
	[TS_WRITE_IN_PROGRESS] = {
		[TS_INIT]		= true,		/* discarded file */
		[TS_WRITE_COMPLETE]	= true,
	},
	[TS_WRITE_COMPLETE] = {
		[TS_INIT]		= true,		/* discarded file */
		[TS_WRITE_IN_PROGRESS]	= true,
		[TS_FLUSHED]		= true,
	},
	[TS_FLUSHED] = {
		[TS_INIT]		= true,
		[TS_WRITE_IN_PROGRESS]	= true,
		[TS_READ_COMPLETE]	= true,
	},
	[TS_READ_IN_PROGRESS] = {
		[TS_INIT]		= true,
		[TS_READ_COMPLETE]	= true,
	},
	[TS_READ_COMPLETE] = {
		[TS_INIT]		= true,
		[TS_WRITE_IN_PROGRESS]	= true,
		[TS_CONSUMED]		= true,
	},
	[TS_CONSUMED] = {
		[TS_INIT]		= true,
		[TS_WRITE_IN_PROGRESS]	= true,
		[TS_READ_COMPLETE]	= true,
	},
};

static bool state_valid(enum tier_state s)
{
	return (unsigned)s < TS_NSTATES;
}

/*
 * Name of state s for logs and xattrs ("FLUSHED"); "?" for a value that is
 * not a state.  The string is static.
 */
const char *tier_state_name(enum tier_state s)
{
	return state_valid(s) ? state_names[s] : "?";
}

/*
 * Is from -> to listed in the transition table?  False for out-of-range
 * values and for from == to.
 */
bool tier_transition_ok(enum tier_state from, enum tier_state to)
{
	if (!state_valid(from) || !state_valid(to))
		return false;
	return allowed[from][to];
}

/*
 * Move *s to `to`.  The transition must be allowed (asserted): an illegal
 * one is an engine bug.  Caller holds the engine lock.
 */
void tier_set_state(enum tier_state *s, enum tier_state to)
{
	if (!tier_transition_ok(*s, to))
		fprintf(stderr, "tierfs: BUG: illegal life-cycle transition %s -> %s\n",
			tier_state_name(*s), tier_state_name(to));
	assert(tier_transition_ok(*s, to));
	*s = to;
}

/*
 * True for FLUSHED and CONSUMED: the copy's data also lives in a slower
 * tier and no pending read needs it here, so it may be dropped.  Whether
 * it is pinned is the caller's business (copy.pins).
 */
bool tier_state_evictable(enum tier_state s)
{
	return s == TS_FLUSHED || s == TS_CONSUMED;
}

/*
 * A copy may be dropped now when nothing uses its bytes (no pin, no flush
 * running) and either its data lives on in a slower tier (an evictable
 * state) or nobody can ever read it (copy.discarded: its file was removed
 * and closed; then WRITE_* -> INIT is legal, see the notes above).  A
 * discarded prefetch still in flight is its prefetcher's to cancel.
 */
bool tier_copy_evictable(const struct copy *cp)
{
	if (cp->pins || cp->flushing)
		return false;
	return tier_state_evictable(cp->state) ||
	       (cp->discarded && cp->state != TS_READ_IN_PROGRESS);
}
