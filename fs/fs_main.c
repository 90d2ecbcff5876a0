/*
 * fs_main.c - the tierfs daemon: its options (parsed and checked), the
 * start-up in order (the checks, the lock and what goes to the log are
 * fs_start.c's), the mount, tierfs --recover, and the orderly shutdown
 * that flushes every cached file to the backing directory.  The request
 * loop is in fs_loop.c.
 */
#include <errno.h>
#include <poll.h>
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
#include <sys/stat.h>
#include <sys/sysmacros.h>
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
#include "fs_start.h"
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

/* tierfs --help: what tierfs does and each option in a few lines
 * (tierfs(8) has the rest).  Over 100 lines: it is the text. */
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
"    -o dedup=auto|on|off   flush files changed in place (by more than\n"
"                           journal_pct) incrementally, sharing unchanged\n"
"                           extents with the backing file's earlier\n"
"                           version (reflink: XFS, btrfs);\n"
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
"    -o flush_threads=N     threads flushing to the SSD (default 4)\n"
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
		fs_say("%s%s", msg, "");
		exit(2);
	}
	if (!fs.opts.persist && (fs.opts.persist_all || persist_wait_str || persist_bw_str ||
				 persist_timeout_str || num_opt_given("persist_keep"))) {
		fs_say("persist_all, persist_wait, persist_bw, persist_timeout and persist_keep "
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
			fs_say("%s%s", msg, "");
			exit(n->status);
		}
		*n->dst = (int)v;
	}
	ecfg->host_cache = ram / 4;
	if (host_cache_str && fs_opt_size("host_cache", host_cache_str, FS_OPT_PCT, ram,
					  &ecfg->host_cache, msg, sizeof(msg)))
		fs_die("%s%s", msg, "");
	if (ecfg->host_cache < TIER_ALIGN)
		fs_die("host_cache=%s is too small: give a size like 512M, 8G or 25%%%s",
		    host_cache_str, "");
	if (ecfg->host_cache > ram)
		fs_die("host_cache=%s is more than this machine's memory%s", host_cache_str, "");
	ecfg->policy = evict_policy_find(fs.opts.evict ? fs.opts.evict : "score");
	if (!ecfg->policy)
		fs_die("unknown evict policy '%s' (score, fifo, lru)%s", fs.opts.evict, "");
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
		fs_die("%s%s", msg, "");
	if (fs.opts.balance) {
		enum balance_policy bp;

		if (balance_policy_parse(fs.opts.balance, &bp) || bp == BALANCE_MINCOST)
			fs_die("bad balance '%s': maxflow, greedy or host%s", fs.opts.balance, "");
		ecfg->balance = (int)bp;
	} else {
		ecfg->balance = BALANCE_MAXFLOW;
	}
	if (fs.opts.gpu && strcmp(fs.opts.gpu, "none") != 0) {
		int devs[ENGINE_MAX_GPUS];
		unsigned n;
		bool all;

		if (gpu_spec(fs.opts.gpu, devs, &n, &all))
			fs_die("bad gpu '%s': a device number, several joined by ':' "
			    "(0:1, at most 8, each once), all, or none%s", fs.opts.gpu, "");
	}
	if (fs.opts.max_fds > 0 && fs.opts.max_fds < 16)
		fs_die("max_fds must be 16 or more (0: the default), not '%s'%s",
		       num_opt_given("max_fds"), "");
	check_persist_options();
}

/*
 * -o dedup: can the backing directory share extents?  auto: on where it
 * can (one line says why not elsewhere); on: refuse to mount where not.
 * off: probed too, silently (ecfg->shares_extents: a copy in place of a
 * file of several names costs no data there).
 */
static void probe_dedup(struct engine_config *ecfg)
{
	const char *mode = fs.opts.dedup ? fs.opts.dedup : "auto";
	char why[160], msg[FS_OPT_MSG];
	uint64_t chunk = DEDUP_CHUNK_DEFAULT, index = DEDUP_INDEX_DEFAULT;
	uint32_t blk = 0;

	if (dedup_chunk_str && fs_opt_size("dedup_chunk", dedup_chunk_str, 0, 0, &chunk, msg,
					   sizeof(msg)))
		fs_die("%s%s", msg, "");
	if (dedup_chunk_str && (chunk < 4096 || chunk > (64u << 20) || (chunk & (chunk - 1))))
		fs_die("bad dedup_chunk '%s': a power of two from 4K to 64M%s", dedup_chunk_str, "");
	if (dedup_index_str && fs_opt_size("dedup_index", dedup_index_str, FS_OPT_PCT,
					   total_ram(), &index, msg, sizeof(msg)))
		fs_die("%s%s", msg, "");
	if (strcmp(mode, "auto") && strcmp(mode, "on") && strcmp(mode, "off"))
		fs_die("bad dedup '%s': auto, on or off%s", mode, "");
	struct timespec rmt;
	bool rmt_ok;
	int probed;

	fs_dir_mtime_get(fs.root_fd, &rmt, &rmt_ok);
	probed = dedup_probe(fs.root_fd, &blk, why, sizeof(why));
	fs_dir_mtime_put(fs.root_fd, &rmt, rmt_ok);	/* its files are ours */
	ecfg->shares_extents = probed == 0;
	if (strcmp(mode, "off") == 0)
		return;
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
		fs_unlock_backing();
		fs_die("dedup=on: %s cannot be used: %s", fs.opts.backing, why);
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
		fs_die("cannot use backing directory %s: %s", argv[2], strerror(errno));
	fs.opts.mountpoint = "(tierfs --recover)";
	fs_open_backing_root(&rmt, &rmt_ok);
	ret = fs_journal_replay(fs.root_fd, msg, sizeof(msg));
	fs_tmp_dir_start();		/* a killed daemon's uncommitted versions */
	fs_unlock_backing();
	fs_dir_mtime_put(fs.root_fd, &rmt, rmt_ok);
	if (ret) {
		fs_say("%s: %s", fs.opts.backing, msg);
		return 1;
	}
	return 0;
}

/*
 * The command line: the options parsed into fs.opts (and the values kept
 * for check_options), --help and --version answered, the log level and
 * -o logfile set.  -1 to go on, else main's exit status.
 */
static int parse_args(char *argv[], struct fuse_args *args)
{
	int level;

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
	if (fuse_opt_parse(args, &fs.opts, opt_spec, opt_proc) < 0)
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
			fs_die("bad log level '%s' (err, warning, notice, info, debug)%s", fs.opts.log, "");
		tierfs_log_level = level;
	} else if (getenv("TIERFS_DEBUG")) {
		tierfs_log_level = LOG_DEBUG;
	}
	if (fs.opts.debug)
		tierfs_log_level = LOG_DEBUG;
	fuse_set_log_func(fuse_log_to_tierfs);
	if (logfile_path) {
		int r = *logfile_path ? fs_log_to_file(logfile_path) : -EINVAL;

		if (r)
			fs_die("cannot open log file '%s': %s", logfile_path, strerror(-r));
	}
	return -1;
}

/* Mount fs.se on the mount point: 0, or 1 after one line saying why not
 * (libfuse's reason, kept from its log). */
static int mount_session(void)
{
	char line[PATH_MAX + sizeof(fuse_complaint) + 32], *c = fuse_complaint;
	int ret;

	fuse_complaint[0] = 0;
	fuse_capture = true;
	ret = fuse_session_mount(fs.se, fs.opts.mountpoint);
	fuse_capture = false;
	if (ret == 0)
		return 0;
	c[strcspn(c, "\n")] = 0;
	while (!strncmp(c, "fuse: ", 6))
		c += 6;
	snprintf(line, sizeof(line), "cannot mount on %s%s%s", fs.opts.mountpoint,
		 *c ? ": " : "", c);
	fs_say("%s%s", line, "");
	return 1;
}

/*
 * The FUSE session over args (tierfs' own options added to them) in
 * fs.se: 0, or -1 after one line saying why not (libfuse's reason).  What
 * libfuse complained of without failing goes to the log.
 */
static int new_session(struct fuse_args *args)
{
	fuse_opt_add_arg(args, "-odefault_permissions");
	add_fsname(args);
	fuse_opt_add_arg(args, "-osubtype=tierfs");
	fuse_capture = true;
	fs.se = fuse_session_new(args, &fs_ll_ops, sizeof(fs_ll_ops), NULL);
	fuse_capture = false;
	if (!fs.se) {
		say_fuse_complaint();
		return -1;
	}
	if (*fuse_complaint)		/* said, but not fatal */
		tlog(LOG_WARNING, "fuse: %s", fuse_complaint);
	return 0;
}

/*
 * Just mounted: our FUSE I/O put in place, the mount logged (and a
 * warning where a daemon's messages would be lost), then into the
 * background unless -f, out of the caller's directory, and the daemon's
 * PID noted in the lock.  Called before any thread of ours starts.
 */
static void after_mount(void)
{
	/* our writev amends the FUSE_INIT reply (see note_init) */
	if (fuse_session_custom_io(fs.se, &fs_io, fuse_session_fd(fs.se)) != 0)
		tlog(LOG_INFO, "no custom FUSE I/O: reads go through the page cache");
	tlog(LOG_NOTICE, "mounted %s on %s", fs.opts.backing, fs.opts.mountpoint);
	if (!fs.opts.foreground && !fs_log_file_open()) {
		int r = fs_syslog_reachable();

		if (r)
			tlog(LOG_WARNING, "syslog cannot be reached (%s: %s): in the background "
			     "messages are lost; use -f or -o logfile=PATH", _PATH_LOG, strerror(-r));
	}
	/* threads and CUDA contexts do not survive fork(): start them after */
	if (!fs.opts.foreground)
		fs_daemon_fork();
	if (chdir("/") < 0)
		tlog(LOG_WARNING, "chdir /: %s", strerror(errno));
	fs_lock_note();			/* the daemon's PID */
}

/*
 * The mounted daemon's life: the engine (ecfg) and the background threads
 * started, requests served until the mount ends or a signal stops it,
 * then the mount point unmounted (also where the engine could not start).
 * Returns main's exit status so far: 0, or 1 where the engine could not
 * start or the loop failed.
 */
static int serve(struct engine_config *ecfg)
{
	int ret;

	if (start_engine(ecfg)) {
		fuse_session_unmount(fs.se);
		return 1;
	}
	if (fs.opts.gpu_share && ecfg->gpu_dev >= 0)
		fs_share_start();	/* failing, the daemon copies */
	fs_persist_start();
	fs_sets_start();
	fs_fd_start();			/* the closer (fs_fd.c) */
	fs_settle_start();		/* intents' retirement (fs_version.c) */
	fs_daemon_ready();
	ret = fs_run_loop() ? 1 : 0;	/* a signal is an orderly stop */

	fs_sets_stop();			/* no retention while the mount goes */
	tlog(LOG_NOTICE, "unmounting: flushing cached files to %s", fs.opts.backing);
	fuse_session_unmount(fs.se);
	return ret;
}

/*
 * The session destroyed (which flushes every cached file), IPC mappings
 * and shares closed, and where the engine was created: what it holds
 * synced, the last intents settled, the persister stopped (it waits
 * persist_wait), the engine destroyed and the exit noted in the lock.
 * Returns main's exit status: ret, or 1 where the sync failed.
 */
static int end_session(int ret)
{
	fuse_session_destroy(fs.se);	/* calls destroy: flushes everything */
	fs_ioctl_shutdown();		/* no worker runs: close IPC mappings */
	fs_share_stop();		/* clients' open copies fail */
	if (fs.eng) {
		unsigned unpersisted;

		if (sync_before_exit())
			ret = 1;
		fs_settle_end();	/* the intents of the last copies */
		/* after the last flush: waits persist_wait */
		unpersisted = fs_persist_stop();
		engine_destroy(fs.eng);
		fs_lock_note_exit(ret, unpersisted);
	}
	return ret;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct engine_config ecfg = { 0 };
	uint64_t ram = total_ram();
	char msg[PATH_MAX + 128];
	int ret = 1;

	fs_log_console();
	if (argc >= 2 && !strcmp(argv[1], "--recover"))
		return recover(argc, argv);
	ret = parse_args(argv, &args);
	if (ret >= 0)
		return ret;
	ret = 1;
	check_options(&ecfg, ram);
	if (fs_persist_setup(msg, sizeof(msg))) {	/* -o persist=DIR */
		fs_say("%s%s", msg, "");
		return 2;
	}
	fs_sets_setup((unsigned)fs.opts.keep_sets);
	fs_open_backing(allow_root);

	if (new_session(&args)) {
		ret = 2;
		goto out_unlock;
	}
	probe_dedup(&ecfg);		/* after the options' complaints */
	probe_log(&ecfg);
	if (fuse_set_signal_handlers(fs.se) != 0) {
		ret = 1;
		goto out_session;
	}
	if (mount_session()) {
		ret = 1;
		goto out_signals;
	}
	after_mount();
	ret = serve(&ecfg);
out_signals:
	fuse_remove_signal_handlers(fs.se);
out_session:
	ret = end_session(ret);
out_unlock:
	fs_unlock_backing();
	if (tierfs_fault("slow_exit"))
		sleep(2);	/* as a long driver teardown would (tests) */
	if (ret != 2)		/* a usage error has said its one line */
		tlog(LOG_NOTICE, "exited%s", ret ? " with errors" : " cleanly");
	fuse_opt_free_args(&args);
	return ret;
}
