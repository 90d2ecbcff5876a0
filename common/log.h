/*
 * log.h - tierfs_log() and tlog(): one line per message, syslog levels;
 * tlog() checks the level before it formats anything.  common/: every
 * room, gpu/ included, calls it directly.
 */
#ifndef TIERFS_LOG_H
#define TIERFS_LOG_H

#include <stddef.h>
#include <syslog.h>

extern int tierfs_log_level;		/* syslog level, LOG_NOTICE default */
void tierfs_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
#define tlog(level, ...) do {						\
	if ((level) <= tierfs_log_level)				\
		tierfs_log((level), __VA_ARGS__);			\
} while (0)
extern int tierfs_log_syslog;		/* log to syslog (detached daemon) */

#endif /* TIERFS_LOG_H */
