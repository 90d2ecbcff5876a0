/*
 * fs_start.h - the daemon's start-up and exit around the mount
 * (fs_start.c), for fs_main.c: messages, the backing directory's lock and
 * checks, the background.
 */
#ifndef TIERFS_FS_START_H
#define TIERFS_FS_START_H

#include <stdbool.h>
#include <time.h>

/* One line "tierfs: " fmt (with a and b) on the console, and in the log
 * file when there is one; fs_die then exits 1 (before mounting). */
void fs_say(const char *fmt, const char *a, const char *b);
__attribute__((noreturn)) void fs_die(const char *fmt, const char *a, const char *b);

/* Keep the stderr we were started with as the console: first in main. */
void fs_log_console(void);
/* -o logfile: stderr becomes PATH (time and PID on every line).  0 or
 * -errno. */
int fs_log_to_file(const char *path);
bool fs_log_file_open(void);
/* Can syslog(3) deliver?  0, or why not (-errno). */
int fs_syslog_reachable(void);

/*
 * The backing directory and the mount point checked (exits saying what is
 * wrong), the backing directory locked (one daemon), what a killed daemon
 * left finished, the root inode and the table set up.  allow_root:
 * libfuse's -o allow_root was given (a user mount needs fuse.conf's
 * user_allow_other for it).
 */
void fs_open_backing(bool allow_root);
/* Open the backing root (fs.root_fd) and take its lock; its mtime before
 * into *rmt, for the caller to put back.  The start of a mount and of
 * tierfs --recover. */
void fs_open_backing_root(struct timespec *rmt, bool *rmt_ok);
/* The lock file names this process (its PID), or at exit says how the
 * daemon ended; fs_unlock_backing frees the backing directory. */
void fs_lock_note(void);
void fs_lock_note_exit(int status, unsigned unpersisted);
void fs_unlock_backing(void);

/* Into the background (without -f): the starting process waits for
 * fs_daemon_ready and exits with the daemon's start-up status. */
void fs_daemon_fork(void);
void fs_daemon_ready(void);

/* A field of /proc/self/mountinfo undone in place: the kernel writes
 * space, tab, newline and backslash as \ooo. */
void fs_mountinfo_unescape(char *s);

#endif
