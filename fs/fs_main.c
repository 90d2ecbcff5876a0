/*
 * fs_main.c - the tierfs daemon: options, start-up checks (one daemon per
 * backing directory), where messages go (stderr, syslog, -o logfile), the
 * mount, and the orderly shutdown that flushes every cached file to the
 * backing directory.  The request loop is in fs_loop.c.
 */
#include <errno.h>
#include <poll.h>
#include <pwd.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>
#include <linux/fuse.h>

#include "balance.h"
#include "config.h"
#include "fs.h"
#include "fs_opt.h"
#include "fs_persist.h"
#include "fs_sets.h"
#include "../tiers/gpu_tier.h"

extern int tierfs_log_syslog;

#define OPT(t, p, v) { t, offsetof(struct fs_opts, p), v }

static char *host_cache_str, *gpu_cache_str, *logfile_path;
static int gpu_spec(const char *s, int *devs, unsigned *n, bool *all);

static const struct fuse_opt opt_spec[] = {
	OPT("evict=%s", evict, 0),
	OPT("gpu=%s", gpu, 0),
	OPT("balance=%s", balance, 0),
	OPT("log=%s", log, 0),
	OPT("writeback", writeback, 1),
	OPT("no_writeback", writeback, 0),
	OPT("direct_writes", direct_writes, 1),
	OPT("no_direct_writes", direct_writes, 0),
	OPT("direct_reads", direct_reads, 1),
	OPT("no_direct_reads", direct_reads, 0),
	OPT("gpu_share", gpu_share, 1),
	OPT("no_gpu_share", gpu_share, 0),
	OPT("dedup=%s", dedup, 0),
	OPT("version_sync", version_sync, 1),
	OPT("persist=%s", persist, 0),
	OPT("persist_all", persist_all, 1),
	OPT("-h", show_help, 1),
	OPT("--help", show_help, 1),
	OPT("-V", show_version, 1),
	OPT("--version", show_version, 1),
	FUSE_OPT_KEY("host_cache=", 1),
	FUSE_OPT_KEY("gpu_cache=", 2),
	FUSE_OPT_KEY("-f", 3),
	FUSE_OPT_KEY("-d", 4),
	FUSE_OPT_KEY("debug", 4),
	FUSE_OPT_KEY("allow_other", 5),
	FUSE_OPT_KEY("noatime", 6),
	FUSE_OPT_KEY("relatime", 7),
	FUSE_OPT_KEY("strictatime", 8),
	FUSE_OPT_KEY("logfile=", 9),
	FUSE_OPT_KEY("flush_threads=", 10),
	FUSE_OPT_KEY("flush_age=", 10),
	FUSE_OPT_KEY("queue_depth=", 10),
	FUSE_OPT_KEY("hint_max=", 10),
	FUSE_OPT_KEY("hint_max_user=", 10),
	FUSE_OPT_KEY("readahead_kb=", 10),
	FUSE_OPT_KEY("poll_us=", 10),
	FUSE_OPT_KEY("max_fds=", 10),
	FUSE_OPT_KEY("exit_timeout=", 10),
	FUSE_OPT_KEY("persist_keep=", 10),
	FUSE_OPT_KEY("journal_pct=", 10),
	FUSE_OPT_KEY("keep_sets=", 10),
	FUSE_OPT_KEY("persist_wait=", 14),
	FUSE_OPT_KEY("persist_bw=", 15),
	FUSE_OPT_KEY("persist_timeout=", 16),
	FUSE_OPT_KEY("dedup_chunk=", 11),
	FUSE_OPT_KEY("dedup_index=", 12),
	FUSE_OPT_KEY("allow_root", 13),
	FUSE_OPT_END
};

static int nonopts;

#define EXIT_TIMEOUT_DEFAULT	60
static int exit_timeout = EXIT_TIMEOUT_DEFAULT;	/* -o exit_timeout, seconds */

static char *persist_wait_str, *persist_bw_str, *persist_timeout_str;

/*
 * The options that take a whole number: the value as given (opt_proc),
 * read by check_options() with fs_opt_uint() into dst.  A dst keeps its
 * "not given" value (main) until then.  A bad value exits 1; those of the
 * persistent tier and the sets exit 2, as they always have.
 */
static struct num_opt {
	const char *name;
	int *dst;
	int64_t min, max;
	const char *unit;
	int status;			/* exit status of a refusal */
	char *val;			/* as given; NULL: not given */
} num_opts[] = {
	{ "flush_threads", &fs.opts.flush_threads, 1, 64, NULL, 1, NULL },
	{ "flush_age", &fs.opts.flush_age_ms, 0, 60000, "milliseconds", 1, NULL },
	{ "queue_depth", &fs.opts.queue_depth, 1, 256, NULL, 1, NULL },
	{ "hint_max", &fs.opts.hint_max, 1, INT_MAX, NULL, 1, NULL },
	{ "hint_max_user", &fs.opts.hint_max_user, 1, INT_MAX, NULL, 1, NULL },
	{ "readahead_kb", &fs.opts.readahead_kb, 0, 65536, NULL, 1, NULL },
	{ "poll_us", &fs.opts.poll_us, 0, 100000, NULL, 1, NULL },
	{ "max_fds", &fs.opts.max_fds, 0, INT_MAX, NULL, 1, NULL },
	{ "exit_timeout", &exit_timeout, 0, 7 * 24 * 3600, "seconds", 1, NULL },
	{ "persist_keep", &fs.opts.persist_keep, 1, 1000000, "files", 2, NULL },
	{ "keep_sets", &fs.opts.keep_sets, 0, 1000000, "sets", 2, NULL },
	{ "journal_pct", &fs.opts.journal_pct, 0, 100, "percent", 1, NULL },
};

/* The value given to the number option name, or NULL. */
static const char *num_opt_given(const char *name)
{
	for (size_t i = 0; i < sizeof(num_opts) / sizeof(num_opts[0]); i++)
		if (!strcmp(num_opts[i].name, name))
			return num_opts[i].val;
	return NULL;
}

static char *dedup_chunk_str, *dedup_index_str;
static bool allow_root;			/* -o allow_root (libfuse's) */

#define DEDUP_CHUNK_DEFAULT	(16u << 10)	/* bench/RESULTS.md section 9 */
#define DEDUP_INDEX_DEFAULT	(64u << 20)

/* "name=value": keep value in *dst (the last one given counts). */
static int keep_value(char **dst, const char *arg)
{
	free(*dst);
	*dst = strdup(strchr(arg, '=') + 1);
	return 0;
}

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *out)
{
	struct fs_opts *o = data;

	(void)out;
	switch (key) {
	case 1:
		return keep_value(&host_cache_str, arg);
	case 2:
		return keep_value(&gpu_cache_str, arg);
	case 3:
		o->foreground = 1;
		return 0;
	case 4:
		o->debug = 1;
		o->foreground = 1;
		return 1;		/* libfuse prints requests too */
	case 5:
		o->allow_other = 1;
		return 1;
	case 6:			/* atime options: ours, and the kernel's too */
		o->atime = FS_NOATIME;
		return 1;
	case 7:
		o->atime = FS_RELATIME;
		return 1;
	case 8:			/* libfuse 3.14 does not know this one */
		o->atime = FS_STRICTATIME;
		return 0;
	case 9:
		return keep_value(&logfile_path, arg);
	case 10:
		for (size_t i = 0; i < sizeof(num_opts) / sizeof(num_opts[0]); i++) {
			size_t l = strlen(num_opts[i].name);

			if (!strncmp(arg, num_opts[i].name, l) && arg[l] == '=')
				keep_value(&num_opts[i].val, arg);
		}
		return 0;
	case 11:
		return keep_value(&dedup_chunk_str, arg);
	case 12:
		return keep_value(&dedup_index_str, arg);
	case 13:
		allow_root = true;
		return 1;		/* libfuse's */
	case 14:
		return keep_value(&persist_wait_str, arg);
	case 15:
		return keep_value(&persist_bw_str, arg);
	case 16:
		return keep_value(&persist_timeout_str, arg);
	case FUSE_OPT_KEY_NONOPT:
		if (nonopts == 0) {
			char *r = realpath(arg, NULL);

			o->backing = r ? r : strdup(arg);
		}
		else if (nonopts == 1) {
			char *r = realpath(arg, NULL);

			o->mountpoint = r ? r : strdup(arg);
		}
		else {
			fprintf(stderr, "tierfs: unexpected argument '%s'\n", arg);
			exit(2);
		}
		nonopts++;
		return 0;
	}
	return 1;
}

static int parse_level(const char *s)
{
	static const char *const names[] = {
		"emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
	};
	int i;

	if (!strcmp(s, "error"))
		return LOG_ERR;
	if (!strcmp(s, "warn"))
		return LOG_WARNING;
	for (i = 0; i < 8; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -1;
}

static void usage(const char *prog)
{
	printf(
"usage: %s BACKING_DIR MOUNTPOINT [-f] [-o OPTION[,OPTION...]]\n"
"       tierfs --recover BACKING_DIR\n"
"\n"
"tierfs presents BACKING_DIR at MOUNTPOINT with a GPU / host-memory cache in\n"
"front of it: writes land in the cache and are flushed to BACKING_DIR in the\n"
"background; restore hints (user.tierfs.* xattrs) prefetch files back.\n"
"\n"
"tierfs options:\n"
"    -o host_cache=SIZE     host cache size (K/M/G/T suffix or N%% of RAM;\n"
"                           default 25%% of RAM)\n"
"    -o evict=POLICY        eviction policy: score (default), fifo, lru\n"
"    -o gpu=N|N:M...|all|none  GPU(s) for the GPU cache tier (default: 0 when\n"
"                           a GPU is present); several: one cache over them,\n"
"                           a part on each (they need peer access)\n"
"    -o gpu_cache=SIZE      GPU cache size per GPU (default 50%% of its free\n"
"                           memory, leaving at least 1 GiB free)\n"
"    -o balance=POLICY      with several GPUs, where a checkpoint goes that\n"
"                           does not fit in its GPU's part: maxflow (default:\n"
"                           the min-time plan over the measured links),\n"
"                           greedy (the fastest peer with room), host (host\n"
"                           memory)\n"
"    -o gpu_share           let the daemon's user and root map the GPU cache:\n"
"                           libtierfs then copies in the application's own\n"
"                           CUDA context (default: off; see tierfs-gpu(7))\n"
"    -o journal_pct=N       a change of at most N%% of a file's bytes is made\n"
"                           durable as a journal record and written into\n"
"                           the file in place after (default 25; 0: never)\n"
"    -o dedup=auto|on|off   flush files changed in place incrementally,\n"
"                           sharing unchanged extents with the backing\n"
"                           file's earlier version (reflink: XFS, btrfs);\n"
"                           auto (default): where BACKING_DIR can; on: refuse\n"
"                           to mount where it cannot\n"
"    -o dedup_chunk=SIZE    chunk of content de-duplication of whole new\n"
"                           files: a power of two, 4K..64M (default 16K)\n"
"    -o dedup_index=SIZE    memory of its index of chunks (default 64M;\n"
"                           0: whole new files are written whole)\n"
"    -o version_sync        sync each new version's data before its rename\n"
"                           even where the backing file system's log orders\n"
"                           them (XFS, journalled ext4: one commit per fsync\n"
"                           instead of two by default)\n"
"    -o log=LEVEL           err, warning, notice (default), info, debug\n"
"    -o logfile=PATH        append messages to PATH, one timestamped line\n"
"                           each (default: stderr with -f, else syslog)\n"
"    -o flush_threads=N     threads flushing to the SSD (default 2)\n"
"    -o flush_age=MS        a closed file of at most 256 KiB is flushed to\n"
"                           the SSD this long after its close, unless an\n"
"                           fsync or a lack of cache room asks sooner\n"
"                           (default 1000; 0: at once)\n"
"    -o exit_timeout=SECS   at unmount, retry files that cannot be written to\n"
"                           BACKING_DIR this long, then give them up (logged)\n"
"                           and exit 1 (default 60)\n"
"    -o queue_depth=N       io_uring requests in flight per flusher (default 32)\n"
"    -o hint_max=N          restore-queue entries (user.tierfs.restore_order)\n"
"                           the mount holds; more are refused with EDQUOT\n"
"                           (default 1000000)\n"
"    -o hint_max_user=N     of those, entries one user may hold; root and the\n"
"                           owner of the mount's root only have hint_max\n"
"                           (default 100000)\n"
"    -o max_fds=N           descriptors kept open on known files and\n"
"                           directories (default 4096, at most half of\n"
"                           RLIMIT_NOFILE)\n"
"    -o writeback           use the kernel writeback cache for page-cache\n"
"                           handles (default: off; see tierfs(8)); with\n"
"                           no_direct_writes, the setting for small writers\n"
"    -o no_direct_writes    let writable opens use the page cache\n"
"                           (default: write-only opens bypass it)\n"
"    -o no_direct_reads     let read and read-write opens use the page cache\n"
"                           (default: they bypass it when the kernel can still\n"
"                           mmap such files: Linux 6.6 and later)\n"
"    -o readahead_kb=N      kernel readahead of the mount (default 1024)\n"
"    -o poll_us=N           after a request, a worker polls for the next one\n"
"                           N microseconds before it sleeps (default 200 with\n"
"                           8 or more CPUs, else 0: off)\n"
"    -o persist=DIR         persistent tier: copy marked files (xattr\n"
"                           user.tierfs.persist=1) after their SSD flush to\n"
"                           DIR on a shared file system; show and fetch what\n"
"                           DIR has and BACKING_DIR lacks (restart anywhere)\n"
"    -o persist_all         every file is persistent unless marked 0\n"
"    -o persist_wait=SECS   at unmount, wait this long for the copies to DIR\n"
"                           (default 5), then log what is missing\n"
"    -o persist_bw=RATE     cap the copies to DIR (a SIZE per second)\n"
"    -o persist_keep=N      each directory of DIR keeps its N newest files\n"
"                           (or checkpoint sets, where it holds sets)\n"
"    -o persist_timeout=SECS  a DIR silent this long is taken as not\n"
"                           answering (default 10)\n"
"    -o keep_sets=N         each directory keeps its N newest complete\n"
"                           checkpoint sets on the SSD (default 0: all;\n"
"                           user.tierfs.keep sets it per directory)\n"
"    -o noatime|relatime|strictatime   access times (default relatime)\n"
"    -o allow_other         let other users access the mount\n"
"    -f                     stay in the foreground, log to stderr\n"
"                           (or to the log file)\n"
"    -d, -o debug           foreground, print every FUSE request\n"
"    -h, --help             this text;  -V, --version  the version\n"
"\n"
"Permissions are checked by the kernel (default_permissions is always on).\n"
"One daemon per BACKING_DIR (the lock BACKING_DIR/.tierfs.lock); MOUNTPOINT\n"
"may not be BACKING_DIR or inside it.\n"
"Unmount with umount(8) or fusermount3 -u; the daemon then writes every\n"
"cached file to BACKING_DIR and exits.\n"
"\n"
"FUSE options:\n", prog);
	fuse_lowlevel_help();
}

/* While fuse_session_new() parses the options, libfuse's complaints are
 * kept here, to be said on one line if it fails (it splits one unknown
 * option over three). */
static char fuse_complaint[512];
static bool fuse_capture;

static void fuse_log_to_tierfs(enum fuse_log_level level, const char *fmt, va_list ap)
{
	char line[1024];

	if (fuse_capture) {
		size_t n = strlen(fuse_complaint);

		vsnprintf(fuse_complaint + n, sizeof(fuse_complaint) - n, fmt, ap);
		return;
	}
	if ((int)level > tierfs_log_level)
		return;
	vsnprintf(line, sizeof(line), fmt, ap);
	line[strcspn(line, "\n")] = 0;
	tierfs_log((int)level, "fuse: %s", line);
}

static uint64_t total_ram(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 4ull << 30;
}

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
static FILE *console;
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
static int log_to_file(const char *path)
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

/* Can syslog(3) deliver?  0, or why not (-errno). */
static int syslog_reachable(void)
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

/*
 * Unmount always ends.  Files that cannot be written to the backing
 * directory (full, failing) are retried about once a second for
 * exit_timeout seconds; then each is logged with its size and given up,
 * and the daemon exits 1.  Returns how many were given up.
 */
static int sync_before_exit(void)
{
	double until = tier_now() + (double)exit_timeout;
	int failed = fs_sync_all(false);

	if (failed)
		tlog(LOG_WARNING, "%d file(s) cannot be written to %s; retrying for up to "
		     "%d s (exit_timeout)", failed, fs.opts.backing, exit_timeout);
	while (failed && tier_now() < until) {
		sleep(1);
		failed = fs_sync_all(false);
	}
	return failed ? fs_sync_all(true) : 0;
}

/* One line on the console, and in the log file when there is one. */
static void say(const char *fmt, const char *a, const char *b)
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

/* One-line error and exit 1 (before mounting): see say(). */
static void die(const char *fmt, const char *a, const char *b)
{
	say(fmt, a, b);
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
static void lock_note(void)
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

static void lock_note_exit(int status, unsigned unpersisted)
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
			die("cannot create %s/" FS_LOCK_NAME ": %s", fs.opts.backing,
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
			die("backing directory %s is in use by another tierfs daemon (%s)",
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
			lock_note();
			return;
		}
		close(fd);		/* removed by a holder on its way out */
	}
	die("cannot lock %s/" FS_LOCK_NAME ": it keeps being replaced%s", fs.opts.backing, "");
}

/*
 * Open the backing root (fs.root_fd), keep its mtime for the caller to put
 * back (*rmt, *rmt_ok: the lock file and the daemon's own names change
 * it), and take the backing directory's lock: the start of a mount and of
 * tierfs --recover.
 */
static void open_backing_root(struct timespec *rmt, bool *rmt_ok)
{
	fs.root_fd = open(fs.opts.backing, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fs.root_fd < 0)
		die("cannot open %s: %s", fs.opts.backing, strerror(errno));
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
static void unlock_backing(void)
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
static void unescape_mnt(char *s)
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
		unescape_mnt(mnt);
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
	unlock_backing();
	if (!strcmp(best, mp))
		die("mount point %s is a live tierfs mount already: unmount it first "
		    "(a second mount would hide it)%s", mp, "");
	die("mount point %s is inside the live tierfs mount %s (its files would be "
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
		die("out of memory%s%s", "", "");
	for (;;) {
		if (stat(p, &st) == 0 && st.st_dev == bst->st_dev && st.st_ino == bst->st_ino) {
			if (self)
				die("mount point %s is the backing directory%s",
				    fs.opts.mountpoint, "");
			die("mount point %s is inside the backing directory %s",
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

static void daemon_fork(void)
{
	char status = 1;
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		die("cannot go into the background: %s%s", strerror(errno), "");
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		die("cannot go into the background: %s%s", strerror(errno), "");
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
static void daemon_ready(void)
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

/* The mount's source (df, findmnt, /proc/mounts): the backing directory,
 * its commas escaped for libfuse's option parser. */
static void add_fsname(struct fuse_args *args)
{
	const char *p = fs.opts.backing;
	char *opt = malloc(strlen(p) * 2 + sizeof("-ofsname="));
	char *q;

	if (!opt) {
		fuse_opt_add_arg(args, "-ofsname=tierfs");
		return;
	}
	q = stpcpy(opt, "-ofsname=");
	for (; *p; p++) {
		if (*p == ',' || *p == '\\')
			*q++ = '\\';
		*q++ = *p;
	}
	*q = 0;
	fuse_opt_add_arg(args, opt);
	free(opt);
}

/* libfuse's complaint about the options, on one line. */
static void say_fuse_complaint(void)
{
	char *r = fuse_complaint, *w = fuse_complaint;

	for (; *r; r++) {
		char c = *r == '\n' || *r == '\t' ? ' ' : *r;

		if (c == ' ' && (w == fuse_complaint || w[-1] == ' '))
			continue;
		*w++ = c;
	}
	while (w > fuse_complaint && w[-1] == ' ')
		w--;
	*w = 0;
	r = fuse_complaint;
	while (!strncmp(r, "fuse: ", 6))
		r += 6;
	fprintf(stderr, "tierfs: %s (see tierfs --help)\n", *r ? r : "bad FUSE options");
}

/* The persistent tier's options (exit 2 on a bad one, as they always have). */
static void check_persist_options(void)
{
	char msg[FS_OPT_MSG];

	fs.opts.persist_wait = -1;
	if ((persist_wait_str && fs_opt_seconds("persist_wait", persist_wait_str, 0, HUGE_VAL, 0,
						&fs.opts.persist_wait, msg, sizeof(msg))) ||
	    (persist_bw_str && fs_opt_size("persist_bw", persist_bw_str, FS_OPT_RATE, 0,
					   &fs.opts.persist_bw, msg, sizeof(msg))) ||
	    (persist_timeout_str && fs_opt_seconds("persist_timeout", persist_timeout_str, 0,
						   86400, 1, &fs.opts.persist_timeout, msg,
						   sizeof(msg)))) {
		say("%s%s", msg, "");
		exit(2);
	}
	if (!fs.opts.persist && (fs.opts.persist_all || persist_wait_str || persist_bw_str ||
				 persist_timeout_str || num_opt_given("persist_keep"))) {
		say("persist_all, persist_wait, persist_bw, persist_timeout and persist_keep "
		    "need: -o persist=DIR%s%s", "", "");
		exit(2);
	}
}

/* The options that configure the engine, checked (exits on a bad one). */
static void check_options(struct engine_config *ecfg, uint64_t ram)
{
	char msg[FS_OPT_MSG];

	for (size_t i = 0; i < sizeof(num_opts) / sizeof(num_opts[0]); i++) {
		struct num_opt *n = &num_opts[i];
		int64_t v;

		if (!n->val)
			continue;
		if (fs_opt_uint(n->name, n->val, n->min, n->max, n->unit, &v, msg, sizeof(msg))) {
			say("%s%s", msg, "");
			exit(n->status);
		}
		*n->dst = (int)v;
	}
	ecfg->host_cache = ram / 4;
	if (host_cache_str && fs_opt_size("host_cache", host_cache_str, FS_OPT_PCT, ram,
					  &ecfg->host_cache, msg, sizeof(msg)))
		die("%s%s", msg, "");
	if (ecfg->host_cache < TIER_ALIGN)
		die("host_cache=%s is too small: give a size like 512M, 8G or 25%%%s",
		    host_cache_str, "");
	if (ecfg->host_cache > ram)
		die("host_cache=%s is more than this machine's memory%s", host_cache_str, "");
	ecfg->policy = evict_policy_find(fs.opts.evict ? fs.opts.evict : "score");
	if (!ecfg->policy)
		die("unknown evict policy '%s' (score, fifo, lru)%s", fs.opts.evict, "");
	if (fs.opts.flush_threads == -1)	/* not given: the engine's default */
		fs.opts.flush_threads = 0;
	if (fs.opts.flush_age_ms == INT_MIN)	/* not given */
		fs.opts.flush_age_ms = FS_FLUSH_AGE_DEFAULT_MS;
	if (fs.opts.poll_us == -1)	/* default: where a CPU can be spared */
		fs.opts.poll_us = sysconf(_SC_NPROCESSORS_ONLN) >= FS_POLL_MIN_CPUS ?
				 FS_POLL_US_DEFAULT : 0;
	if (fs.opts.queue_depth == -1)		/* not given: the engine's default */
		fs.opts.queue_depth = 0;
	if (fs.opts.hint_max == -1)
		fs.opts.hint_max = ENGINE_HINT_MAX;
	if (fs.opts.hint_max_user == -1)
		fs.opts.hint_max_user = ENGINE_HINT_MAX_USER;
	ecfg->hint_max = (uint64_t)fs.opts.hint_max;
	ecfg->hint_max_user = (uint64_t)fs.opts.hint_max_user;
	ecfg->flush_threads = fs.opts.flush_threads;
	ecfg->queue_depth = (unsigned)fs.opts.queue_depth;
	ecfg->flush_age_ms = (unsigned)fs.opts.flush_age_ms;
	if (fs.opts.journal_pct == -1)		/* not given */
		fs.opts.journal_pct = FS_JOURNAL_PCT_DEFAULT;
	ecfg->journal_pct = (unsigned)fs.opts.journal_pct;
	ecfg->hugepages = true;
	if (gpu_cache_str && fs_opt_size("gpu_cache", gpu_cache_str, FS_OPT_PCT, ram,
					 &fs.opts.gpu_cache, msg, sizeof(msg)))
		die("%s%s", msg, "");
	if (fs.opts.balance) {
		enum balance_policy bp;

		if (balance_policy_parse(fs.opts.balance, &bp) || bp == BALANCE_MINCOST)
			die("bad balance '%s': maxflow, greedy or host%s", fs.opts.balance, "");
		ecfg->balance = (int)bp;
	} else {
		ecfg->balance = BALANCE_MAXFLOW;
	}
	if (fs.opts.gpu && strcmp(fs.opts.gpu, "none") != 0) {
		int devs[ENGINE_MAX_GPUS];
		unsigned n;
		bool all;

		if (gpu_spec(fs.opts.gpu, devs, &n, &all))
			die("bad gpu '%s': a device number, several joined by ':' "
			    "(0:1, at most 8, each once), all, or none%s", fs.opts.gpu, "");
	}
	check_persist_options();
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

static void check_user_mount(const struct stat *mst)
{
	char me[64], owner[64], mode[8], why[PATH_MAX + 256];
	uid_t uid = geteuid();

	if (uid == 0)
		return;
	user_name(uid, me, sizeof(me));
	if (access("/dev/fuse", R_OK | W_OK) < 0) {
		if (errno == ENOENT)
			die("/dev/fuse is missing: load the FUSE module (modprobe fuse)%s%s", "", "");
		snprintf(why, sizeof(why), "user %s cannot open /dev/fuse (%s): a user mounts "
			 "only with read and write access to it (its mode is usually 0666; "
			 "see tierfs(8), MOUNTING AS A USER)", me, strerror(errno));
		die("%s%s", why, "");
	}
	user_name(mst->st_uid, owner, sizeof(owner));
	snprintf(mode, sizeof(mode), "%04o", (unsigned)(mst->st_mode & 07777));
	if ((mst->st_mode & S_ISVTX) && mst->st_uid != uid) {
		snprintf(why, sizeof(why), "mount point %s is sticky and not user %s's own "
			 "(owner %s, mode %s): fusermount3 mounts a user's file system on a "
			 "sticky directory only if it is the user's", fs.opts.mountpoint, me,
			 owner, mode);
		die("%s%s", why, "");
	}
	if (access(fs.opts.mountpoint, W_OK) < 0) {
		snprintf(why, sizeof(why), "mount point %s is not writable by user %s (owner "
			 "%s, mode %s): fusermount3 mounts a user's file system only on a "
			 "directory the user may write", fs.opts.mountpoint, me, owner, mode);
		die("%s%s", why, "");
	}
	if ((fs.opts.allow_other || allow_root) && fuse_conf_allow_other() <= 0) {
		snprintf(why, sizeof(why), "%s: a user may use it only where %s has a line "
			 "user_allow_other, and it has none here (or mount as root)",
			 fs.opts.allow_other ? "allow_other" : "allow_root", FUSE_CONF);
		die("%s%s", why, "");
	}
}

/*
 * The backing directory: checked, locked (one daemon), what a killed
 * daemon left finished (fs_journal_start), the root inode and the table.
 */
static void open_backing(void)
{
	struct timespec rmt;
	struct stat st;
	bool rmt_ok;

	if (stat(fs.opts.backing, &st) < 0)
		die("cannot use backing directory %s: %s", fs.opts.backing, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		die("backing directory %s is not a directory%s", fs.opts.backing, "");
	if (access(fs.opts.backing, R_OK | W_OK | X_OK) < 0)
		die("backing directory %s is not writable: %s", fs.opts.backing, strerror(errno));
	check_mountpoint(&st);
	if (stat(fs.opts.mountpoint, &st) < 0)
		die("cannot use mount point %s: %s", fs.opts.mountpoint, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		die("mount point %s is not a directory%s", fs.opts.mountpoint, "");
	check_user_mount(&st);

	umask(0);
	raise_nofile();
	open_backing_root(&rmt, &rmt_ok);
	check_not_on_tierfs();
	fs_tmp_dir_start();
	fs_journal_start();
	fs_dir_mtime_put(fs.root_fd, &rmt, rmt_ok);	/* the lock file, .tierfs.tmp and
							 * .tierfs.journal are ours */
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
		die("out of memory%s%s", "", "");
	if (fs.opts.max_fds > 0 && fs.opts.max_fds < 16)
		die("max_fds must be 16 or more (0: the default), not '%s'%s",
		    num_opt_given("max_fds"), "");
	fs_fd_setup(fs.opts.max_fds);
}

/*
 * -o dedup: can the backing directory share extents?  auto: on where it
 * can (one line says why not elsewhere); on: refuse to mount where not.
 */
static void probe_dedup(struct engine_config *ecfg)
{
	const char *mode = fs.opts.dedup ? fs.opts.dedup : "auto";
	char why[160], msg[FS_OPT_MSG];
	uint64_t chunk = DEDUP_CHUNK_DEFAULT, index = DEDUP_INDEX_DEFAULT;
	uint32_t blk = 0;

	if (dedup_chunk_str && fs_opt_size("dedup_chunk", dedup_chunk_str, 0, 0, &chunk, msg,
					   sizeof(msg)))
		die("%s%s", msg, "");
	if (dedup_chunk_str && (chunk < 4096 || chunk > (64u << 20) || (chunk & (chunk - 1))))
		die("bad dedup_chunk '%s': a power of two from 4K to 64M%s", dedup_chunk_str, "");
	if (dedup_index_str && fs_opt_size("dedup_index", dedup_index_str, FS_OPT_PCT,
					   total_ram(), &index, msg, sizeof(msg)))
		die("%s%s", msg, "");
	if (strcmp(mode, "off") == 0)
		return;
	if (strcmp(mode, "auto") && strcmp(mode, "on"))
		die("bad dedup '%s': auto, on or off%s", mode, "");
	struct timespec rmt;
	bool rmt_ok;
	int probed;

	fs_dir_mtime_get(fs.root_fd, &rmt, &rmt_ok);
	probed = dedup_probe(fs.root_fd, &blk, why, sizeof(why));
	fs_dir_mtime_put(fs.root_fd, &rmt, rmt_ok);	/* its files are ours */
	if (probed == 0) {
		if (chunk < blk)
			chunk = blk;
		ecfg->dedup = true;
		ecfg->dedup_block = blk;
		ecfg->dedup_chunk = chunk;
		ecfg->dedup_index = index;
		tlog(LOG_NOTICE, "dedup: on (%s shares extents; block %u bytes, chunk %" PRIu64
		     " KiB, index %" PRIu64 " MiB)", fs.opts.backing, blk, chunk >> 10,
		     index >> 20);
		return;
	}
	if (strcmp(mode, "on") == 0) {
		unlock_backing();
		die("dedup=on: %s cannot be used: %s", fs.opts.backing, why);
	}
	tlog(LOG_NOTICE, "dedup: off (%s: %s)", fs.opts.backing, why);
}

/*
 * Can a new version's data go without its own sync before the rename
 * (engine_config.ordered_log)?  Where the backing file system's log is
 * ordered (backing_log_ordered), unless -o version_sync.
 */
static void probe_log(struct engine_config *ecfg)
{
	struct stat st;
	char why[160];

	if (fs.opts.version_sync) {
		tlog(LOG_INFO, "versions: synced before their rename (-o version_sync)");
		return;
	}
	if (!backing_log_ordered(fs.root_fd, why, sizeof(why)) || fstat(fs.root_fd, &st) < 0) {
		tlog(LOG_INFO, "versions: synced before their rename (%s: %s)",
		     fs.opts.backing, why);
		return;
	}
	ecfg->ordered_log = true;
	ecfg->ordered_dev = st.st_dev;
	tlog(LOG_INFO, "versions: made durable with their rename (%s: ordered log)",
	     fs.opts.backing);
}

/*
 * -o gpu=SPEC: a device number, several joined by ':' (one cache over them,
 * -o's own ',' being the option separator), or "all".  0 with the devices
 * in devs[0..*n), or -EINVAL (not numbers, a device twice, more than
 * ENGINE_MAX_GPUS).  "none" is the caller's.
 */
static int gpu_spec(const char *s, int *devs, unsigned *n, bool *all)
{
	*n = 0;
	*all = !strcmp(s, "all");
	if (*all) {
		devs[0] = 0;
		*n = 1;
		return 0;
	}
	for (;;) {
		char *end;
		long d;

		errno = 0;
		d = strtol(s, &end, 10);
		if (end == s || errno || d < 0 || d > 1023 || (*end && *end != ':') ||
		    *n >= ENGINE_MAX_GPUS || (*s < '0' || *s > '9'))
			return -EINVAL;
		for (unsigned i = 0; i < *n; i++)
			if (devs[i] == (int)d)
				return -EINVAL;
		devs[(*n)++] = (int)d;
		if (!*end)
			return 0;
		s = end + 1;
	}
}

/* The engine (host cache, flushers; the GPU tier where there is one). */
static int start_engine(struct engine_config *ecfg)
{
	char sz[32];
	int ret;

	/* GPU tier: the engine builds it when a GPU is usable */
	ecfg->gpu_dev = -1;
	ecfg->gpu_cache = fs.opts.gpu_cache;
	ecfg->gpu_share = fs.opts.gpu_share;
	ecfg->later = true;		/* fs_run_loop starts the background work */
	ecfg->flush_fds = fs_fd_budget() / 8;	/* tierfs(8), max_fds */
	if (fs.opts.gpu && strcmp(fs.opts.gpu, "none") == 0) {
		tlog(LOG_NOTICE, "GPU tier: disabled (gpu=none); using host + SSD");
	} else if (!gpu_tier_built()) {
		tlog(LOG_NOTICE, "GPU tier: not available (built without CUDA); using host + SSD");
	} else {
		/* built in the background; the engine logs what it found */
		int devs[ENGINE_MAX_GPUS] = { 0 };
		unsigned n = 1;
		bool all = false;

		if (fs.opts.gpu)
			gpu_spec(fs.opts.gpu, devs, &n, &all);	/* checked before */
		ecfg->gpu_dev = devs[0];
		ecfg->gpu_nmore = n - 1;
		for (unsigned i = 1; i < n; i++)
			ecfg->gpu_more[i - 1] = devs[i];
		ecfg->gpu_all = all;
		if ((all || n > 1) && ecfg->gpu_share) {
			tlog(LOG_NOTICE, "gpu_share: off (it serves a cache on one GPU; "
			     "gpu=%s spans several)", fs.opts.gpu);
			ecfg->gpu_share = false;
		}
	}

	ret = engine_create(&fs.eng, ecfg);
	if (ret) {
		tlog(LOG_ERR, "cannot create the cache: %s", strerror(-ret));
		return ret;
	}
	uint64_t hc = engine_host_cache_size(fs.eng);
	if (hc >= (1ull << 30))
		snprintf(sz, sizeof(sz), "%.1f GiB", (double)hc / (1 << 30));
	else
		snprintf(sz, sizeof(sz), "%.0f MiB", (double)hc / (1 << 20));
	tlog(LOG_NOTICE, "host cache: %s%s, eviction %s, backing %s", sz,
	     host_cache_str ? "" : " (default: 25% of RAM)", ecfg->policy->name,
	     fs.opts.backing);
	return 0;
}

/*
 * tierfs --recover BACKING_DIR: what a crashed daemon left, finished
 * without mounting: the journal's records applied to their files (small
 * changes, and new versions copied over files with several names),
 * uncommitted versions removed.  Takes
 * the backing directory's lock (not while a daemon uses it).  Exit 0, 1
 * with a line saying what could not be applied, 2 on a usage error.
 */
static int recover(int argc, char *argv[])
{
	char msg[PATH_MAX + 256];
	struct timespec rmt;
	bool rmt_ok;
	int ret;

	if (argc != 3) {
		fprintf(stderr, "usage: %s --recover BACKING_DIR\n", argv[0]);
		return 2;
	}
	fs.opts.backing = realpath(argv[2], NULL);
	if (!fs.opts.backing)
		die("cannot use backing directory %s: %s", argv[2], strerror(errno));
	fs.opts.mountpoint = "(tierfs --recover)";
	open_backing_root(&rmt, &rmt_ok);
	ret = fs_journal_replay(fs.root_fd, msg, sizeof(msg));
	fs_tmp_dir_start();		/* a killed daemon's uncommitted versions */
	unlock_backing();
	fs_dir_mtime_put(fs.root_fd, &rmt, rmt_ok);
	if (ret) {
		say("%s: %s", fs.opts.backing, msg);
		return 1;
	}
	return 0;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct engine_config ecfg = { 0 };
	uint64_t ram = total_ram();
	char msg[PATH_MAX + 128];
	int ret = 1, level, mret;

	console = stderr;
	if (argc >= 2 && !strcmp(argv[1], "--recover"))
		return recover(argc, argv);
	fs.opts.direct_writes = 1;
	fs.opts.direct_reads = 1;
	fs.opts.readahead_kb = 1024;
	fs.opts.poll_us = -1;
	fs.opts.flush_threads = -1;		/* -1: not given */
	fs.opts.flush_age_ms = INT_MIN;
	fs.opts.journal_pct = -1;
	fs.opts.queue_depth = -1;
	fs.opts.hint_max = -1;
	fs.opts.hint_max_user = -1;
	if (fuse_opt_parse(&args, &fs.opts, opt_spec, opt_proc) < 0)
		return 2;
	if (fs.opts.show_help) {
		usage(argv[0]);
		return 0;
	}
	if (fs.opts.show_version) {
		printf("tierfs %s (FUSE %s, GPU tier %s)\n", PACKAGE_VERSION,
		       fuse_pkgversion(), gpu_tier_built() ? "built" : "not built");
		return 0;
	}
	if (!fs.opts.backing || !fs.opts.mountpoint) {
		fprintf(stderr, "usage: %s BACKING_DIR MOUNTPOINT [-f] [-o OPTIONS]  (see --help)\n",
			argv[0]);
		return 2;
	}
	if (fs.opts.log) {
		level = parse_level(fs.opts.log);
		if (level < 0)
			die("bad log level '%s' (err, warning, notice, info, debug)%s", fs.opts.log, "");
		tierfs_log_level = level;
	} else if (getenv("TIERFS_DEBUG")) {
		tierfs_log_level = LOG_DEBUG;
	}
	if (fs.opts.debug)
		tierfs_log_level = LOG_DEBUG;
	fuse_set_log_func(fuse_log_to_tierfs);
	if (logfile_path) {
		int r = *logfile_path ? log_to_file(logfile_path) : -EINVAL;

		if (r)
			die("cannot open log file '%s': %s", logfile_path, strerror(-r));
	}

	check_options(&ecfg, ram);
	if (fs_persist_setup(msg, sizeof(msg))) {	/* -o persist=DIR */
		say("%s%s", msg, "");
		return 2;
	}
	fs_sets_setup((unsigned)fs.opts.keep_sets);
	open_backing();

	fuse_opt_add_arg(&args, "-odefault_permissions");
	add_fsname(&args);
	fuse_opt_add_arg(&args, "-osubtype=tierfs");
	fuse_capture = true;
	fs.se = fuse_session_new(&args, &fs_ll_ops, sizeof(fs_ll_ops), NULL);
	fuse_capture = false;
	if (!fs.se) {
		say_fuse_complaint();
		ret = 2;
		goto out_unlock;
	}
	if (*fuse_complaint)		/* said, but not fatal */
		tlog(LOG_WARNING, "fuse: %s", fuse_complaint);
	probe_dedup(&ecfg);		/* after the options' complaints */
	probe_log(&ecfg);
	if (fuse_set_signal_handlers(fs.se) != 0) {
		ret = 1;
		goto out_session;
	}
	fuse_complaint[0] = 0;
	fuse_capture = true;		/* libfuse's reason, for the one line below */
	mret = fuse_session_mount(fs.se, fs.opts.mountpoint);
	fuse_capture = false;
	if (mret != 0) {
		char line[PATH_MAX + sizeof(fuse_complaint) + 32], *c = fuse_complaint;

		c[strcspn(c, "\n")] = 0;
		while (!strncmp(c, "fuse: ", 6))
			c += 6;
		snprintf(line, sizeof(line), "cannot mount on %s%s%s", fs.opts.mountpoint,
			 *c ? ": " : "", c);
		say("%s%s", line, "");
		ret = 1;
		goto out_signals;
	}
	/* our writev amends the FUSE_INIT reply (see note_init) */
	if (fuse_session_custom_io(fs.se, &fs_io, fuse_session_fd(fs.se)) != 0)
		tlog(LOG_INFO, "no custom FUSE I/O: reads go through the page cache");
	tlog(LOG_NOTICE, "mounted %s on %s", fs.opts.backing, fs.opts.mountpoint);
	if (!fs.opts.foreground && log_fd < 0) {
		int r = syslog_reachable();

		if (r)
			tlog(LOG_WARNING, "syslog cannot be reached (%s: %s): in the background "
			     "messages are lost; use -f or -o logfile=PATH", _PATH_LOG, strerror(-r));
	}
	/* threads and CUDA contexts do not survive fork(): start them after */
	if (!fs.opts.foreground)
		daemon_fork();
	if (chdir("/") < 0)
		tlog(LOG_WARNING, "chdir /: %s", strerror(errno));
	lock_note();			/* the daemon's PID */

	if (start_engine(&ecfg)) {
		fuse_session_unmount(fs.se);
		ret = 1;
		goto out_signals;
	}
	if (fs.opts.gpu_share && ecfg.gpu_dev >= 0)
		fs_share_start();	/* failing, the daemon copies */
	fs_persist_start();
	fs_sets_start();
	daemon_ready();
	ret = fs_run_loop() ? 1 : 0;	/* a signal is an orderly stop */

	fs_sets_stop();			/* no retention while the mount goes */
	tlog(LOG_NOTICE, "unmounting: flushing cached files to %s", fs.opts.backing);
	fuse_session_unmount(fs.se);
out_signals:
	fuse_remove_signal_handlers(fs.se);
out_session:
	fuse_session_destroy(fs.se);	/* calls destroy: flushes everything */
	fs_ioctl_shutdown();		/* no worker runs: close IPC mappings */
	fs_share_stop();		/* clients' open copies fail */
	if (fs.eng) {
		unsigned unpersisted;

		if (sync_before_exit())
			ret = 1;
		/* after the last flush: waits persist_wait */
		unpersisted = fs_persist_stop();
		engine_destroy(fs.eng);
		lock_note_exit(ret, unpersisted);
	}
out_unlock:
	unlock_backing();
	if (tierfs_fault("slow_exit"))
		sleep(2);	/* as a long driver teardown would (tests) */
	if (ret != 2)		/* a usage error has said its one line */
		tlog(LOG_NOTICE, "exited%s", ret ? " with errors" : " cleanly");
	fuse_opt_free_args(&args);
	return ret;
}
