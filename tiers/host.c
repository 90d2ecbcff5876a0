/*
 * host.c - the host cache buffer's start-up (hipc22 section IV): the
 * toucher thread faults it in front to back in the background, and once it
 * is touched and a GPU tier exists it is pinned (cudaHostRegister through
 * gpu_tier.c), once.
 *
 * Owns: e->touched, e->pin_started, e->host_pinned.  Takes e->lock only
 * to decide to pin; touches and pins without it.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "engine_int.h"
#include "gpu_tier.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/*
 * Pin the host buffer once it is touched and a GPU tier exists, whichever
 * of the two comes last (the toucher or the GPU builder calls this).
 */
void eng_pin_host_once(struct engine *e)
{
	bool pin;

	eng_lock(e);
	pin = e->gpu && !e->pin_started && !e->stop &&
	      __atomic_load_n(&e->touched, __ATOMIC_RELAXED) >= e->host.size;
	if (pin)
		e->pin_started = true;
	eng_unlock(e);
	if (pin)
		gpu_tier_pin_host(e->host.base, e->host.size, NULL, &e->touched,
				  &e->host_pinned);
}

/*
 * Fault the host buffer in, front to back, in the background (hipc22 §IV:
 * the cache is usable at once; first writes into untouched pages just pay
 * the page faults themselves).  In 2 MiB steps: each holds the address
 * space's lock for reading while it faults its pages in, and every mmap,
 * mprotect or munmap of the daemon meanwhile (a thread's malloc arena
 * growing, a flush's arrays) waits for the step under way (8 MiB steps
 * made a dedup flush's fsync in the first seconds after a mount twice as
 * long on a small VM: bench/RESULTS.md, 9i).
 */
void *eng_toucher_main(void *arg)
{
	struct engine *e = arg;
	uint64_t chunk = 2ull << 20, off;	/* short holds of the mm lock */
	double t0 = tier_now();
	bool populate = true;

	for (off = 0; off < e->host.size; off += chunk) {
		uint64_t n = e->host.size - off < chunk ? e->host.size - off : chunk;

		if (__atomic_load_n(&e->stop, __ATOMIC_RELAXED))
			return NULL;
		if (populate && madvise(e->host.base + off, n, MADV_POPULATE_WRITE) < 0)
			populate = false;
		if (!populate) {
			volatile uint8_t *p = e->host.base + off;
			uint64_t i;

			for (i = 0; i < n; i += 4096)
				p[i] = p[i];
		}
		__atomic_store_n(&e->touched, off + n, __ATOMIC_RELAXED);
	}
	tlog(LOG_INFO, "host cache: %.1f GiB touched in %.2f s",
	     (double)e->host.size / (1 << 30), tier_now() - t0);
	eng_pin_host_once(e);
	return NULL;
}
