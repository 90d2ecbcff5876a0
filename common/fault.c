/*
 * fault.c - the test hooks of fault.h: TIERFS_FAULT (a point where the
 * daemon kills itself, or fails; TIERFS_FAULT_ARM: only once a file is
 * there) and TIERFS_DELAY (points where a thread sleeps).  Read from the
 * environment (and the file system) at each call; nothing is cached.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"

bool tierfs_fault(const char *point)
{
	const char *f = getenv("TIERFS_FAULT"), *arm;

	if (!f || strcmp(f, point) != 0)
		return false;
	arm = getenv("TIERFS_FAULT_ARM");
	return !arm || !*arm || access(arm, F_OK) == 0;
}

void tierfs_fault_kill(const char *point)
{
	if (tierfs_fault(point))
		raise(SIGKILL);
}

long tierfs_delay_ms(const char *point)
{
	const char *d = getenv("TIERFS_DELAY");
	size_t n = strlen(point);
	long ms = -1;

	for (; d && *d; d += strcspn(d, ","), d += *d == ',') {
		if (strncmp(d, point, n) == 0 && d[n] == '=') {
			ms = strtol(d + n + 1, NULL, 10);
			break;
		}
	}
	if (ms <= 0)
		return 0;
	tlog(LOG_DEBUG, "TIERFS_DELAY: %ld ms at %s", ms, point);
	return ms;
}

void tierfs_delay(const char *point)
{
	long ms = tierfs_delay_ms(point);

	if (ms > 0)
		usleep((useconds_t)(ms * 1000));
}
