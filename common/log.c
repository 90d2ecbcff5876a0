/*
 * log.c - tierfs_log(): one line per message on stderr (or syslog once the
 * daemon is in the background), "tierfs: LEVEL: text".  Every room logs
 * through it, gpu/ included; it calls nothing of theirs.  libtierfs links
 * it too, silent (TIERFS_LOG_DEFAULT -1): the library prints nothing.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "log.h"

#ifndef TIERFS_LOG_DEFAULT
#define TIERFS_LOG_DEFAULT	LOG_NOTICE
#endif

int tierfs_log_level = TIERFS_LOG_DEFAULT;
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
