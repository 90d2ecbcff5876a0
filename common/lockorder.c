/*
 * lockorder.c - the debug-build check of lockorder.h: a per-thread mask of
 * the lock ranks held; taking a lock whose rank is not above every rank
 * held aborts with both ranks named.  Nothing here locks.
 */
#include <stdio.h>
#include <stdlib.h>

#include "lockorder.h"

#ifndef NDEBUG
static const char *const rank_names[] = {
	[LR_TFILE] = "tfile.lock", [LR_FS_FILE] = "a file's ilock",
	[LR_FS_NS] = "fs.nslock", [LR_FS_DIR] = "a directory's ilock", [LR_FS] = "fs.lock",
	[LR_ENGINE] = "engine.lock", [LR_FS_FD] = "fdc.lock", [LR_FS_INO] = "ino.lock",
	[LR_SETS] = "sets.lock", [LR_PERSIST_POOL] = "pg.lock", [LR_PERSIST] = "pq.lock",
	[LR_IPC] = "ipc_cache.lock", [LR_SHARE] = "share.lock",
	[LR_GPU_INIT] = "gpu_state.lock", [LR_GPU_LANE] = "a GPU copy lane's lock",
	[LR_GPU_HASH] = "hash_state.lock", [LR_GPU_CTX] = "devctx_lock",
	[LR_GPU_VMM] = "a GPU cache mapper's lock", [LR_JOURNAL] = "jnl.lock",
	[LR_FS_CLOSER] = "closer.lock", [LR_FS_SETTLE] = "settle.lock",
	[LR_FS_LINKS] = "links_mu", [LR_FS_BASES] = "bases.lock",
	[LR_LOG] = "log_mu",
};

/* Debug-only checker state: the ranks this thread holds (bit r). */
static __thread unsigned ranks_held;

void lock_rank_take(enum lock_rank r)
{
	unsigned higher = ranks_held & ~((1u << r) - 1);

	if (higher) {
		int h = 31 - __builtin_clz(higher);

		fprintf(stderr, "tierfs: lock order violated: taking %s while holding %s "
			"(lockorder.h)\n", rank_names[r], rank_names[h]);
		abort();
	}
	ranks_held |= 1u << r;
}

void lock_rank_tried(enum lock_rank r)
{
	ranks_held |= 1u << r;
}

void lock_rank_drop(enum lock_rank r)
{
	if (!(ranks_held & (1u << r))) {
		fprintf(stderr, "tierfs: releasing %s, not held (lockorder.h)\n",
			rank_names[r]);
		abort();
	}
	ranks_held &= ~(1u << r);
}
#endif
