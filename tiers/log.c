/*
 * log.c - tierfs_log(): one line per message on stderr (or syslog once the
 * daemon is in the background), "tierfs: LEVEL: text".
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "log.h"

int tierfs_log_level = LOG_NOTICE;
int tierfs_log_syslog;			/* set by the daemon when detached */

static const char *const level_names[] = {
	"EMERG", "ALERT", "CRIT", "ERROR", "WARNING", "NOTICE", "INFO", "DEBUG",
};

void tierfs_log(int level, const char *fmt, ...)
{
	va_list ap;

	if (level > tierfs_log_level)
		return;
	va_start(ap, fmt);
	if (tierfs_log_syslog) {
		vsyslog(level, fmt, ap);
	} else {
		char line[1024];

		vsnprintf(line, sizeof(line), fmt, ap);
		fprintf(stderr, "tierfs: %s: %s\n",
			level_names[level & 7], line);
	}
	va_end(ap);
}

bool tierfs_fault(const char *point)
{
	const char *f = getenv("TIERFS_FAULT");

	return f && strcmp(f, point) == 0;
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
