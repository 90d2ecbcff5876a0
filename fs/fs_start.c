/*
 * fs_start.c - the daemon's start-up and exit around the mount: where
 * messages go (stderr, syslog, -o logfile) and the one-line errors of a
 * start that fails; the backing directory's lock (one daemon per backing
 * directory, the lock file that says how the daemon ended); the checks of
 * the backing directory and the mount point (not inside each other, not
 * on a live tierfs mount, what a user mount needs); opening the backing
 * directory (fs_open_backing); going into the background.  fs_main.c
 * parses the options and runs the start-up in order.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "fs_persist.h"
#include "fs_start.h"

extern int tierfs_log_syslog;

static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/*
 * Where messages go.  tierfs_log() writes to stderr until the daemon is
 * detached, then to syslog.  With -o logfile=PATH, stderr becomes a
 * line-buffered stream that prefixes every line with the time and the PID
 * and appends it to PATH with one write (so lines of several writers never
 * mix), from the start; once the daemon is detached, descriptor 2 is the
 * log file too, so what bypasses stdio (sanitizer reports) lands there.
 * `console` is the stderr we were started with: fatal start-up errors go
 * there as well.
 */
static FILE *console;		/* fs_log_console */
static int log_fd = -1;			/* the log file, -1: none */
static bool log_bol = true;		/* next byte starts a line (log_mu) */
/* The stream's own lock serialises log_write() in glibc, but nothing
 * promises that of a cookie stream (and ThreadSanitizer cannot see it):
 * the line state has a lock of its own, the last of the lock order
 * (LR_LOG: a message may be written under any lock; nothing under it). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t log_stamp(char *buf, size_t len)
{
	struct timespec ts;
	struct tm tm;
	size_t n;

	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	n = strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
	n += (size_t)snprintf(buf + n, len - n, ".%03ld", ts.tv_nsec / 1000000);
	n += strftime(buf + n, len - n, " %z", &tm);
	n += (size_t)snprintf(buf + n, len - n, " [%ld] ", (long)getpid());
	return n < len ? n : len - 1;
}

/* fopencookie write: each line that starts here gets a time stamp. */
static ssize_t log_write(void *cookie, const char *buf, size_t len)
{
	size_t done = 0;

	(void)cookie;
	ranked_lock(&log_mu, LR_LOG);
	while (done < len) {
		const char *nl = memchr(buf + done, '\n', len - done);
		size_t n = nl ? (size_t)(nl - (buf + done)) + 1 : len - done;
		char stamp[80];
		struct iovec iov[2] = {
			{ stamp, log_bol ? log_stamp(stamp, sizeof(stamp)) : 0 },
			{ (void *)(buf + done), n },
		};

		/* a full disk loses lines, never the daemon's stderr */
		if (writev(log_fd, iov, 2) < 0) {
			/* nothing to report it to */
		}
		log_bol = nl != NULL;
		done += n;
	}
	ranked_unlock(&log_mu, LR_LOG);
	return (ssize_t)len;
}

/* -o logfile: open PATH (relative to where we were started) and send
 * stderr there.  Returns 0 or -errno. */
int fs_log_to_file(const char *path)
{
	cookie_io_functions_t io = { .write = log_write };
	FILE *f;

	log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);
	if (log_fd < 0)
		return -errno;
	f = fopencookie(NULL, "w", io);
	if (!f) {
		close(log_fd);
		log_fd = -1;
		return -ENOMEM;
	}
	setvbuf(f, NULL, _IOLBF, 4096);
	tzset();
	stderr = f;			/* glibc: stderr is a plain variable */
	return 0;
}

/* Keep the stderr we were started with as the console (first thing). */
void fs_log_console(void)
{
	console = stderr;
}

/* Is there a log file (-o logfile)? */
bool fs_log_file_open(void)
{
	return log_fd >= 0;
}

/* Can syslog(3) deliver?  0, or why not (-errno). */
int fs_syslog_reachable(void)
{
	static const int types[] = { SOCK_DGRAM, SOCK_STREAM };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int i, fd, err = 0;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", _PATH_LOG);
	for (i = 0; i < 2; i++) {
		fd = socket(AF_UNIX, types[i] | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		err = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0;
		close(fd);
		if (err != -EPROTOTYPE)
			break;
	}
	return err;
}

/* One line on the console, and in the log file when there is one. */
void fs_say(const char *fmt, const char *a, const char *b)
{
	FILE *out[2] = { console ? console : stderr, stderr };
	int i;

	for (i = 0; i < (out[1] != out[0] ? 2 : 1); i++) {
		fprintf(out[i], "tierfs: ");
		fprintf(out[i], fmt, a, b);
		fputc('\n', out[i]);
		fflush(out[i]);
	}
}

/* One-line error and exit 1 (before mounting): see fs_say(). */
void fs_die(const char *fmt, const char *a, const char *b)
{
	fs_say(fmt, a, b);
	exit(1);
}

/*
 * One daemon per backing directory.  BACKING/.tierfs.lock (a reserved
 * name: never seen through the mount) carries an open file description
 * lock, which stays with the descriptor across the fork into the
 * background, unlike a POSIX record lock; the file says "PID MOUNTPOINT"
 * of the daemon holding it, for the error a second daemon gives.  The
 * holder removes it when it exits, after its last write to the backing
 * directory; so a daemon that got the lock checks that its file is still
 * the one under that name (else the holder removed it on its way out
 * after we opened it: again).
 */
#define FS_LOCK_NAME	FS_HIDDEN_PREFIX ".lock"

static int lock_fd = -1;

static bool same_file(int fd, int dirfd, const char *name)
{
	struct stat a, b;

	return fstat(fd, &a) == 0 && fstatat(dirfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Who holds the lock: "PID MOUNTPOINT" into buf (waits a moment for a
 * holder that has just locked it to say so). */
static void lock_holder(int fd, char *buf, size_t len)
{
	ssize_t n = 0;
	int i;

	for (i = 0; i < 50; i++) {
		n = pread(fd, buf, len - 1, 0);
		if (n > 0)
			break;
		usleep(20 * 1000);
	}
	buf[n > 0 ? n : 0] = 0;
	buf[strcspn(buf, "\n")] = 0;
}

/* Say who holds the lock: this process, on fs.opts.mountpoint ("running":
 * lock_note_exit will say how it ends; a file left so, the daemon was
 * killed). */
void fs_lock_note(void)
{
	char line[PATH_MAX + 32];
	int n;

	if (lock_fd < 0)
		return;
	n = snprintf(line, sizeof(line), "%ld %s\nrunning\n", (long)getpid(),
		     fs.opts.mountpoint);
	if (n >= (int)sizeof(line) || pwrite(lock_fd, line, (size_t)n, 0) != n ||
	    ftruncate(lock_fd, n) < 0)
		tlog(LOG_WARNING, "cannot write %s/%s: %s", fs.opts.backing, FS_LOCK_NAME,
		     strerror(errno));
}

/*
 * At exit, after the last flush: add to the lock file how the daemon ends,
 * for `tierfsctl wait` and tierfs.wait_flushed, which hold it open to read
 * it once the process is gone (see unlock_backing):
 *	PID MOUNTPOINT
 *	exit STATUS
 *	lost N			files given up (fs_sync_all)
 *	PATH			one line each, the first FS_LOST_NAMES
 *	unpersisted M DIR	the last line: operations that did not reach
 *				-o persist's DIR (M 0, no DIR: none)
 * All within the file's first 4 KiB, which its first line already
 * occupies: a full backing file system still takes it.
 */
#define LOCK_TAIL_ROOM	(PATH_MAX + 32)		/* the unpersisted line */

void fs_lock_note_exit(int status, unsigned unpersisted)
{
	char buf[4096 + LOCK_TAIL_ROOM];
	const size_t room = 4096 - 64;		/* for the lines before the last */
	const char *pdir = fs_persist_dir();
	int n, i, m;

	if (lock_fd < 0)
		return;
	n = snprintf(buf, room, "%ld %s\nexit %d\nlost %u\n", (long)getpid(),
		     fs.opts.mountpoint, status, fs.lost);
	for (i = 0; i < FS_LOST_NAMES && i < (int)fs.lost && n < (int)room; i++) {
		const char *p = fs.lost_names[i] ? fs.lost_names[i] : "?";

		m = snprintf(buf + n, room - (size_t)n, "%s\n", p);
		if (m >= (int)room - n)
			break;		/* no room for the whole line */
		for (char *c = buf + n; c < buf + n + m - 1; c++)
			if (*c == '\n')
				*c = '?';
		n += m;
	}
	if (n >= (int)room)
		return;
	m = snprintf(buf + n, sizeof(buf) - (size_t)n, "unpersisted %u %s\n", unpersisted,
		     pdir ? pdir : "-");
	if (n + m > 4096 || strchr(buf + n, '\n') != buf + n + m - 1)	/* DIR left out */
		m = snprintf(buf + n, sizeof(buf) - (size_t)n, "unpersisted %u -\n", unpersisted);
	n += m;
	if (pwrite(lock_fd, buf, (size_t)n, 0) != n)
		tlog(LOG_WARNING, "cannot write %s/%s: %s", fs.opts.backing, FS_LOCK_NAME,
		     strerror(errno));
}

/* Take the lock, or exit saying who holds it. */
static void lock_backing(void)
{
	char holder[PATH_MAX + 32], why[PATH_MAX + 64], *mnt;
	int i, r, fd;

	for (i = 0; i < 100; i++) {
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };

		fd = openat(fs.root_fd, FS_LOCK_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC,
			    0644);
		if (fd < 0)
			fs_die("cannot create %s/" FS_LOCK_NAME ": %s", fs.opts.backing,
			    strerror(errno));
		r = fcntl(fd, F_OFD_SETLK, &fl);
		if (r < 0 && errno == EINVAL)		/* no OFD locks: Linux < 3.15 */
			r = flock(fd, LOCK_EX | LOCK_NB);
		if (r < 0 && (errno == EAGAIN || errno == EACCES)) {
			lock_holder(fd, holder, sizeof(holder));
			close(fd);
			mnt = strchr(holder, ' ');
			if (mnt)
				*mnt++ = 0;
			snprintf(why, sizeof(why), "PID %s, mounted on %s",
				 holder[0] ? holder : "unknown", mnt ? mnt : "?");
			fs_die("backing directory %s is in use by another tierfs daemon (%s)",
			    fs.opts.backing, why);
		}
		if (r < 0) {		/* e.g. a network file system without locks */
			tlog(LOG_WARNING, "cannot lock %s/%s (%s): nothing stops a second "
			     "daemon from using it", fs.opts.backing, FS_LOCK_NAME,
			     strerror(errno));
			close(fd);
			return;
		}
		if (same_file(fd, fs.root_fd, FS_LOCK_NAME)) {
			lock_fd = fd;
			fs_lock_note();
			return;
		}
		close(fd);		/* removed by a holder on its way out */
	}
	fs_die("cannot lock %s/" FS_LOCK_NAME ": it keeps being replaced%s", fs.opts.backing, "");
}

/*
 * Open the backing root (fs.root_fd), keep its mtime for the caller to put
 * back (*rmt, *rmt_ok: the lock file and the daemon's own names change
 * it), and take the backing directory's lock: the start of a mount and of
 * tierfs --recover.
 */
void fs_open_backing_root(struct timespec *rmt, bool *rmt_ok)
{
	fs.root_fd = open(fs.opts.backing, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fs.root_fd < 0)
		fs_die("cannot open %s: %s", fs.opts.backing, strerror(errno));
	fs.tmp_fd = -1;
	fs_dir_mtime_get(fs.root_fd, rmt, rmt_ok);
	lock_backing();
}

/*
 * Exit: the backing directory is free again (see lock_backing).  The lock
 * file goes, but its descriptor stays open until the process ends: what
 * is left of the exit (the CUDA driver's own teardown takes a while) comes
 * after, and `tierfsctl wait` finds an exiting daemon by that descriptor
 * (python/tierfs _find_daemon), to wait for the process itself.  An
 * unlinked file locks nothing: a new daemon makes a lock file of its own.
 */
void fs_unlock_backing(void)
{
	struct timespec t;
	bool ok;

	if (lock_fd < 0)
		return;
	fs_dir_mtime_get(fs.root_fd, &t, &ok);
	fs_tmp_dir_end();
	fs_journal_end();
	if (same_file(lock_fd, fs.root_fd, FS_LOCK_NAME))
		unlinkat(fs.root_fd, FS_LOCK_NAME, 0);
	fs_dir_mtime_put(fs.root_fd, &t, ok);
}

/* A mountinfo field as it was before the kernel escaped it (\ooo). */
void fs_mountinfo_unescape(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*o++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 | (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = 0;
}

/*
 * A mount point on a live tierfs mount (its root, or a directory inside
 * it) is refused: the new mount would hide the first one's files, which
 * its daemon still flushes.  statfs(2) says whether it is on FUSE at all
 * (a dead FUSE mount fails it: not ours to judge); the mount holding it,
 * the last in /proc/self/mountinfo with the longest mount point above it,
 * says whether that is tierfs.
 */
#define FUSE_SUPER_MAGIC_	0x65735546

static void check_not_on_tierfs(void)
{
	const char *mp = fs.opts.mountpoint;
	char line[3 * PATH_MAX], best[PATH_MAX] = "", mnt[PATH_MAX], type[64];
	size_t bl = 0;
	struct statfs sf;
	bool tierfs = false;
	FILE *f;

	if (statfs(mp, &sf) < 0 || (unsigned long)sf.f_type != FUSE_SUPER_MAGIC_)
		return;
	f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *sep = strstr(line, " - ");
		size_t ml;

		if (!sep || sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 ||
		    sscanf(sep + 3, "%63s", type) != 1)
			continue;
		fs_mountinfo_unescape(mnt);
		ml = strlen(mnt);
		if (strncmp(mp, mnt, ml) || (mp[ml] && mp[ml] != '/' && strcmp(mnt, "/")) ||
		    ml < bl)
			continue;
		snprintf(best, sizeof(best), "%s", mnt);
		bl = ml;
		tierfs = !strcmp(type, "fuse.tierfs");
	}
	fclose(f);
	if (!tierfs)
		return;
	/* after lock_backing: a second daemon over the same backing directory
	 * has been told which daemon holds it; this one's lock goes first */
	fs_unlock_backing();
	if (!strcmp(best, mp))
		fs_die("mount point %s is a live tierfs mount already: unmount it first "
		    "(a second mount would hide it)%s", mp, "");
	fs_die("mount point %s is inside the live tierfs mount %s (its files would be "
	    "hidden)", mp, best);
}

/*
 * The mount point may not be the backing directory or inside it (the
 * daemon would serve its own mount through itself).  Compared by st_dev
 * and st_ino of the mount point and each of its parents, so that a
 * symlink or a bind mount of the backing directory is seen through.
 */
static void check_mountpoint(const struct stat *bst)
{
	char *p = strdup(fs.opts.mountpoint), *slash;
	struct stat st;
	bool self = true;

	if (!p)
		fs_die("out of memory%s%s", "", "");
	for (;;) {
		if (stat(p, &st) == 0 && st.st_dev == bst->st_dev && st.st_ino == bst->st_ino) {
			if (self)
				fs_die("mount point %s is the backing directory%s",
				    fs.opts.mountpoint, "");
			fs_die("mount point %s is inside the backing directory %s",
			    fs.opts.mountpoint, fs.opts.backing);
		}
		slash = strrchr(p, '/');
		if (!slash || (slash == p && !p[1]))
			break;
		slash[slash == p ? 1 : 0] = 0;
		self = false;
	}
	free(p);
}

/*
 * Into the background (without -f).  Unlike fuse_daemonize(), the
 * starting process waits until the daemon is ready (the cache created,
 * the lock naming the daemon's PID) and exits with its status: a daemon
 * that fails to start says why on the console, and its starter exits 1.
 */
static int ready_pipe = -1;

void fs_daemon_fork(void)
{
	char status = 1;
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		fs_die("cannot go into the background: %s%s", strerror(errno), "");
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		fs_die("cannot go into the background: %s%s", strerror(errno), "");
	if (pid > 0) {
		close(p[1]);
		if (read(p[0], &status, 1) != 1)
			status = 1;	/* the daemon died starting */
		_exit(status);
	}
	close(p[0]);
	ready_pipe = p[1];
	if (setsid() < 0)
		tlog(LOG_WARNING, "setsid: %s", strerror(errno));
}

/*
 * Start-up is over: in the background, descriptors 0 and 1 go to
 * /dev/null and 2 to the log file (or /dev/null), messages to syslog
 * unless there is a log file, and the starting process exits 0.  In the
 * foreground only the log file, if any, takes descriptor 2.
 */
void fs_daemon_ready(void)
{
	int nullfd;
	char ok = 0;

	if (fs.opts.foreground) {
		if (log_fd >= 0)
			dup2(log_fd, STDERR_FILENO);
		return;
	}
	if (log_fd < 0) {
		openlog("tierfs", LOG_PID, LOG_DAEMON);
		tierfs_log_syslog = 1;
	}
	fflush(NULL);
	nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (nullfd >= 0) {
		dup2(nullfd, STDIN_FILENO);
		dup2(nullfd, STDOUT_FILENO);
		dup2(log_fd >= 0 ? log_fd : nullfd, STDERR_FILENO);
		if (nullfd > STDERR_FILENO)
			close(nullfd);
	}
	if (write(ready_pipe, &ok, 1) != 1)
		tlog(LOG_WARNING, "cannot tell the starting process: %s", strerror(errno));
	close(ready_pipe);
	ready_pipe = -1;
}

/*
 * Mounting as a user (tierfs(8), MOUNTING AS A USER).  A daemon that is
 * not root opens /dev/fuse itself and has fusermount3 (set-user-ID root)
 * mount it, which refuses a mount point the user may not write, a sticky
 * one that is not the user's, and allow_other or allow_root unless
 * /etc/fuse.conf says user_allow_other.  Each is checked here first, so
 * that the error says what is wrong and what it takes, before anything is
 * made in the backing directory.
 */
#define FUSE_CONF	"/etc/fuse.conf"

static const char *user_name(uid_t uid, char *buf, size_t len)
{
	struct passwd *pw = getpwuid(uid);

	if (pw)
		snprintf(buf, len, "%s", pw->pw_name);
	else
		snprintf(buf, len, "%lu", (unsigned long)uid);
	return buf;
}

/* Does /etc/fuse.conf have a line user_allow_other?  1, 0, or -errno. */
static int fuse_conf_allow_other(void)
{
	char line[256];
	FILE *f = fopen(FUSE_CONF, "re");
	int yes = 0;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *p = line, *e;

		while (*p == ' ' || *p == '\t')
			p++;
		e = p + strcspn(p, "\r\n");
		while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
			e--;
		*e = 0;
		if (!strcmp(p, "user_allow_other"))
			yes = 1;
	}
	fclose(f);
	return yes;
}

static void check_user_mount(const struct stat *mst, bool allow_root)
{
	char me[64], owner[64], mode[8], why[PATH_MAX + 256];
	uid_t uid = geteuid();

	if (uid == 0)
		return;
	user_name(uid, me, sizeof(me));
	if (access("/dev/fuse", R_OK | W_OK) < 0) {
		if (errno == ENOENT)
			fs_die("/dev/fuse is missing: load the FUSE module (modprobe fuse)%s%s", "", "");
		snprintf(why, sizeof(why), "user %s cannot open /dev/fuse (%s): a user mounts "
			 "only with read and write access to it (its mode is usually 0666; "
			 "see tierfs(8), MOUNTING AS A USER)", me, strerror(errno));
		fs_die("%s%s", why, "");
	}
	user_name(mst->st_uid, owner, sizeof(owner));
	snprintf(mode, sizeof(mode), "%04o", (unsigned)(mst->st_mode & 07777));
	if ((mst->st_mode & S_ISVTX) && mst->st_uid != uid) {
		snprintf(why, sizeof(why), "mount point %s is sticky and not user %s's own "
			 "(owner %s, mode %s): fusermount3 mounts a user's file system on a "
			 "sticky directory only if it is the user's", fs.opts.mountpoint, me,
			 owner, mode);
		fs_die("%s%s", why, "");
	}
	if (access(fs.opts.mountpoint, W_OK) < 0) {
		snprintf(why, sizeof(why), "mount point %s is not writable by user %s (owner "
			 "%s, mode %s): fusermount3 mounts a user's file system only on a "
			 "directory the user may write", fs.opts.mountpoint, me, owner, mode);
		fs_die("%s%s", why, "");
	}
	if ((fs.opts.allow_other || allow_root) && fuse_conf_allow_other() <= 0) {
		snprintf(why, sizeof(why), "%s: a user may use it only where %s has a line "
			 "user_allow_other, and it has none here (or mount as root)",
			 fs.opts.allow_other ? "allow_other" : "allow_root", FUSE_CONF);
		fs_die("%s%s", why, "");
	}
}

/*
 * The backing directory: checked, locked (one daemon), what a killed
 * daemon left finished (fs_journal_start), the root inode and the table.
 */
void fs_open_backing(bool allow_root)
{
	struct timespec rmt;
	struct stat st;
	bool rmt_ok;

	if (stat(fs.opts.backing, &st) < 0)
		fs_die("cannot use backing directory %s: %s", fs.opts.backing, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		fs_die("backing directory %s is not a directory%s", fs.opts.backing, "");
	if (access(fs.opts.backing, R_OK | W_OK | X_OK) < 0)
		fs_die("backing directory %s is not writable: %s", fs.opts.backing, strerror(errno));
	check_mountpoint(&st);
	if (stat(fs.opts.mountpoint, &st) < 0)
		fs_die("cannot use mount point %s: %s", fs.opts.mountpoint, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		fs_die("mount point %s is not a directory%s", fs.opts.mountpoint, "");
	check_user_mount(&st, allow_root);

	umask(0);
	raise_nofile();
	fs_open_backing_root(&rmt, &rmt_ok);
	check_not_on_tierfs();
	fs_tmp_dir_start();
	fs_journal_start();
	fs_dir_mtime_put(fs.root_fd, &rmt, rmt_ok);	/* the lock file, .tierfs.tmp and
							 * .tierfs.journal(.1) are ours */
	fs_ino_start();
	fstat(fs.root_fd, &st);
	fs.root.fd = fs.root_fd;
	fs.root.dev = st.st_dev;
	fs.root.ino = st.st_ino;
	fs.root.type = S_IFDIR;
	fs.root.data_fd = -1;
	fs.root.nlookup = 2;
	pthread_mutex_init(&fs.root.ilock, NULL);
	pthread_mutex_init(&fs.lock, NULL);
	pthread_mutex_init(&fs.nslock, NULL);
	fs.hsize = 1024;
	fs.htab = calloc(fs.hsize, sizeof(*fs.htab));
	if (!fs.htab)
		fs_die("out of memory%s%s", "", "");
	fs_fd_setup(fs.opts.max_fds);
}

