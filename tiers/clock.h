/*
 * clock.h - the daemon's one clock: seconds on the monotonic clock, for
 * timings, deadlines and bandwidths (fs/, store/ and tiers/; gpu/, below
 * them, keeps its own).  Wall-clock times (file times, log stamps, condition
 * variable deadlines) use CLOCK_REALTIME where they are taken.
 */
#ifndef TIERFS_CLOCK_H
#define TIERFS_CLOCK_H

#include <time.h>

static inline double tier_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* TIERFS_CLOCK_H */
