/*
 * test_lifecycle.c - the life-cycle transition table of tiers/lifecycle.c.
 *
 * Every (from, to) pair is checked against a table written out here
 * independently of the one in lifecycle.c, then the checkpoint and restore
 * paths and the rewrite/re-read loops are walked with tier_set_state().
 * Illegal moves are only ever asked of tier_transition_ok(), never of
 * tier_set_state() (which would assert).  Exit 0 pass, 1 fail.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier.h"

static int failures;

#define CHECK(cond, ...) do {						\
	if (!(cond)) {							\
		fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);	\
		fprintf(stderr, __VA_ARGS__);				\
		fputc('\n', stderr);					\
		failures++;						\
	}								\
} while (0)

#define I TS_INIT
#define WIP TS_WRITE_IN_PROGRESS
#define WC TS_WRITE_COMPLETE
#define FL TS_FLUSHED
#define RIP TS_READ_IN_PROGRESS
#define RC TS_READ_COMPLETE
#define CON TS_CONSUMED

/* The allowed moves, as a list (lifecycle.c keeps a matrix). */
static const enum tier_state expected[][2] = {
	{ I, WIP }, { I, RIP },
	{ WIP, WC },
	{ WC, FL }, { WC, WIP },
	{ FL, WIP }, { FL, RC },
	{ RIP, RC }, { RIP, I },
	{ RC, CON }, { RC, WIP },
	{ CON, WIP }, { CON, RC },
	/* drops */
	{ FL, I }, { CON, I }, { RC, I },
	/* discarded (unlinked) files only */
	{ WIP, I }, { WC, I },
};

static bool expected_ok(enum tier_state from, enum tier_state to)
{
	size_t i;

	for (i = 0; i < sizeof(expected) / sizeof(expected[0]); i++)
		if (expected[i][0] == from && expected[i][1] == to)
			return true;
	return false;
}

static void walk(const char *what, const enum tier_state *path, size_t n)
{
	enum tier_state s = path[0];
	size_t i;

	for (i = 1; i < n; i++) {
		CHECK(tier_transition_ok(s, path[i]), "%s: %s -> %s refused",
		      what, tier_state_name(s), tier_state_name(path[i]));
		if (!tier_transition_ok(s, path[i]))
			return;
		tier_set_state(&s, path[i]);
		CHECK(s == path[i], "%s: state not set", what);
	}
}

#define WALK(what, ...) do {						\
	static const enum tier_state p[] = { __VA_ARGS__ };		\
	walk(what, p, sizeof(p) / sizeof(p[0]));			\
} while (0)

int main(void)
{
	int from, to, nok = 0;

	/* names: distinct, non-empty, "?" out of range */
	for (from = 0; from < TS_NSTATES; from++) {
		const char *a = tier_state_name(from);

		CHECK(a && *a && strcmp(a, "?"), "state %d has no name", from);
		for (to = 0; to < from; to++)
			CHECK(strcmp(a, tier_state_name(to)),
			      "states %d and %d share name %s", from, to, a);
	}
	CHECK(!strcmp(tier_state_name(TS_NSTATES), "?"), "name of TS_NSTATES");
	CHECK(!strcmp(tier_state_name((enum tier_state)-1), "?"), "name of -1");
	CHECK(!strcmp(tier_state_name(TS_FLUSHED), "FLUSHED"), "FLUSHED name");

	/* the full matrix, out-of-range values included */
	for (from = -1; from <= TS_NSTATES; from++) {
		for (to = -1; to <= TS_NSTATES; to++) {
			bool want = from >= 0 && from < TS_NSTATES &&
				    to >= 0 && to < TS_NSTATES &&
				    expected_ok(from, to);
			bool got = tier_transition_ok(from, to);

			CHECK(got == want, "%s -> %s: got %d, want %d",
			      tier_state_name(from), tier_state_name(to),
			      got, want);
			nok += got;
		}
	}
	CHECK(nok == (int)(sizeof(expected) / sizeof(expected[0])),
	      "%d transitions allowed", nok);

	/* pointed checks on the rules that matter most */
	CHECK(!tier_transition_ok(WC, RC), "WRITE_COMPLETE -> READ_COMPLETE");
	CHECK(!tier_transition_ok(I, FL), "INIT -> FLUSHED");
	CHECK(!tier_transition_ok(I, CON), "INIT -> CONSUMED");
	CHECK(!tier_transition_ok(WIP, FL), "WRITE_IN_PROGRESS -> FLUSHED");
	CHECK(!tier_transition_ok(RIP, CON), "READ_IN_PROGRESS -> CONSUMED");
	CHECK(!tier_transition_ok(I, I), "INIT -> INIT");
	for (from = 0; from < TS_NSTATES; from++)
		CHECK(!tier_transition_ok(from, from), "%s -> itself",
		      tier_state_name(from));

	/* evictable states */
	for (from = 0; from < TS_NSTATES; from++)
		CHECK(tier_state_evictable(from) ==
		      (from == TS_FLUSHED || from == TS_CONSUMED),
		      "evictable(%s)", tier_state_name(from));

	/* paths */
	WALK("checkpoint", I, WIP, WC, FL);
	WALK("restore", I, RIP, RC, CON);
	WALK("rewrite before flush", I, WIP, WC, WIP, WC, FL);
	WALK("rewrite after flush", I, WIP, WC, FL, WIP, WC, FL);
	WALK("read while flushing", I, WIP, WC, FL, RC, CON);
	WALK("re-read", I, RIP, RC, CON, RC, CON);
	WALK("write after read", I, RIP, RC, WIP, WC, FL);
	WALK("write after consume", I, RIP, RC, CON, WIP, WC, FL);
	WALK("prefetch cancelled", I, RIP, I, RIP, RC);
	WALK("dropped", I, WIP, WC, FL, I, RIP, RC, CON, I);
	WALK("drop promoted", I, RIP, RC, I);
	WALK("unlinked while written", I, WIP, I);
	WALK("unlinked while flushing", I, WIP, WC, I);

	if (failures) {
		fprintf(stderr, "test_lifecycle: %d failure(s)\n", failures);
		return 1;
	}
	printf("test_lifecycle: ok (%d transitions allowed of %d pairs)\n",
	       nok, TS_NSTATES * TS_NSTATES);
	return 0;
}
