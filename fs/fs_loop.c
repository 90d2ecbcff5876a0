/*
 * fs_loop.c - the FUSE request loop: a fixed pool of workers with receive
 * buffers of their own (registered with CUDA once where a GPU tier is
 * up), polling for requests a while before sleeping in read(), and the
 * custom I/O that amends the FUSE_INIT reply (direct I/O with mmap).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>
#include <linux/fuse.h>

#include "config.h"
#include "fs.h"
#include "fs_start.h"
#include "../tiers/gpu_tier.h"

/*
 * The request loop.  Instead of libfuse's loop, a fixed pool of workers,
 * each with a receive buffer of its own that is allocated once and, with
 * a GPU tier, registered with CUDA once: writes then copy host -> device
 * from pinned memory.  Signals go to the main thread only.
 */
#define FS_WORKERS	16
#define FS_RECV_SIZE	((1u << 20) + (64u << 10))	/* > libfuse's bufsize */

/*
 * Direct I/O with mmap.  Handles opened with FOPEN_DIRECT_IO skip the
 * page cache (one copy from the cache to the reader's buffer instead of
 * page-cache allocation and two copies), but a kernel refuses MAP_SHARED
 * mmap of them unless the daemon answers FUSE_INIT with
 * FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6+; the kernel then writes back and
 * invalidates mmap()ed pages around direct reads and writes).  libfuse
 * 3.14 cannot ask for it (its capability word is 32 bits), so the INIT
 * reply is amended on its way out: the request is noted when it arrives
 * (its unique id, and whether the kernel offers the flag), and our writev
 * sets the flag in the reply with that id.  fs.dio_mmap says it was done;
 * open() uses direct I/O for every handle only then.
 */
#ifndef FUSE_DIRECT_IO_ALLOW_MMAP
#define FUSE_DIRECT_IO_ALLOW_MMAP	(1ULL << 36)
#endif

static uint64_t init_unique;		/* FUSE_INIT's id, while pending */
static uint32_t init_offered;		/* its flags */
static uint32_t init_offered2;		/* and flags2 */

static void note_init(const void *mem, size_t len)
{
	const struct fuse_in_header *h = mem;
	const struct fuse_init_in *in = (const void *)(h + 1);

	if (len < sizeof(*h) + offsetof(struct fuse_init_in, flags2) + sizeof(in->flags2) ||
	    h->opcode != FUSE_INIT)
		return;
	init_offered = in->flags;
	init_offered2 = (in->flags & FUSE_INIT_EXT) ? in->flags2 : 0;
	__atomic_store_n(&init_unique, h->unique, __ATOMIC_RELEASE);
}

/* The amendments to the INIT reply, where the kernel offers them. */
static void amend_init(struct fuse_init_out *out)
{
	if (init_offered2 & (uint32_t)(FUSE_DIRECT_IO_ALLOW_MMAP >> 32)) {
		out->flags |= FUSE_INIT_EXT;
		out->flags2 |= (uint32_t)(FUSE_DIRECT_IO_ALLOW_MMAP >> 32);
		fs.dio_mmap = true;
		tlog(LOG_INFO, "kernel mmaps direct-I/O files: %s",
		     fs.opts.direct_reads ? "reads bypass the page cache"
					  : "but no_direct_reads is set");
	}
	/* see fs_kill_privs() */
	if (init_offered & FUSE_HANDLE_KILLPRIV_V2) {
		out->flags |= FUSE_HANDLE_KILLPRIV_V2;
		fs.killpriv_v2 = true;
	}
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	uint64_t id = __atomic_load_n(&init_unique, __ATOMIC_ACQUIRE);

	(void)userdata;
	if (id && count >= 2 && iov[0].iov_len >= sizeof(struct fuse_out_header)) {
		struct fuse_out_header *oh = iov[0].iov_base;
		struct fuse_init_out *out = iov[1].iov_base;

		if (oh->unique == id) {
			if (!oh->error && iov[1].iov_len >= offsetof(struct fuse_init_out, flags2) +
							     sizeof(out->flags2))
				amend_init(out);
			__atomic_store_n(&init_unique, 0, __ATOMIC_RELEASE);
		}
	}
	return writev(fd, iov, count);
}

/*
 * With FUSE_HANDLE_KILLPRIV_V2 the file system clears the privileges that
 * a change of the data takes away (fs_kill_privs): WRITE, a SETATTR of the
 * size, an OPEN with O_TRUNC.  libfuse 3.14 passes none of the requests'
 * KILL_SUIDGID flags on, so they are read here, before the request runs
 * (as a local file system clears them before it writes).
 */
static void note_kill(const void *mem, size_t len)
{
	const struct fuse_in_header *h = mem;
	const void *arg = h + 1;
	bool flag;

	if (!fs.killpriv_v2 || len < sizeof(*h))
		return;
	len -= sizeof(*h);
	switch (h->opcode) {
	case FUSE_WRITE:
		if (len < sizeof(struct fuse_write_in))
			return;
		flag = ((const struct fuse_write_in *)arg)->write_flags & FUSE_WRITE_KILL_SUIDGID;
		break;
	case FUSE_SETATTR:
		if (len < sizeof(struct fuse_setattr_in) ||
		    !(((const struct fuse_setattr_in *)arg)->valid & FATTR_SIZE))
			return;
		flag = ((const struct fuse_setattr_in *)arg)->valid & FATTR_KILL_SUIDGID;
		break;
	case FUSE_OPEN:
		if (len < sizeof(struct fuse_open_in) ||
		    !(((const struct fuse_open_in *)arg)->flags & O_TRUNC))
			return;
		flag = ((const struct fuse_open_in *)arg)->open_flags & FUSE_OPEN_KILL_SUIDGID;
		break;
	default:
		return;
	}
	fs_kill_privs(h->nodeid, flag);
}

/*
 * Polling for the next request (-o poll_us).  A worker that sleeps in
 * read() on /dev/fuse for a while takes 50-500 us to wake when a request
 * comes, on an idle machine (more than a 128 MiB device copy takes).  So
 * the worker that finishes a request, if no other worker is polling,
 * polls /dev/fuse for poll_us before it sleeps: a request that follows
 * within that time (the ioctl after an open, a read after a stat) is
 * picked up at once.  One worker polls at a time; the cost is at most
 * poll_us of one CPU after each request (default FS_POLL_US_DEFAULT on
 * machines with FS_POLL_MIN_CPUS CPUs or more, fs.h).
 */

static int polling;			/* atomic: a worker polls */

static void poll_for_request(int fd)
{
	if (fs.opts.poll_us > 0 && !__atomic_exchange_n(&polling, 1, __ATOMIC_ACQUIRE)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		double until = tier_now() + fs.opts.poll_us * 1e-6;

		while (poll(&p, 1, 0) == 0 && tier_now() < until)
			fs_cpu_relax();
		__atomic_store_n(&polling, 0, __ATOMIC_RELEASE);
	}
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
	(void)userdata;
	poll_for_request(fd);
	return read(fd, buf, len);
}

static ssize_t io_splice(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
			 unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

static ssize_t io_splice_receive(int fdin, off_t *offin, int fdout, off_t *offout,
				 size_t len, unsigned int flags, void *userdata)
{
	poll_for_request(fdin);
	return io_splice(fdin, offin, fdout, offout, len, flags, userdata);
}

const struct fuse_custom_io fs_io = {
	.writev = io_writev,
	.read = io_read,
	.splice_receive = io_splice_receive,
	.splice_send = io_splice,
};

/* Requests that take longer are logged (level info), with their opcode. */
#define SLOW_REQUEST_S	0.05

struct fs_worker {
	pthread_t th;			/* the thread */
	struct fuse_buf buf;		/* its receive buffer */
	bool registered;		/* buf.mem is pinned */
};

static bool conn_aborted_said;

static void *worker_main(void *arg)
{
	struct fs_worker *w = arg;
	sigset_t all;
	double t0;
	int res, old;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
	/*
	 * A thread's first malloc makes its arena (mmap, munmap, mprotect:
	 * each takes the process's memory map lock for writing, behind the
	 * host cache's toucher and the pinning).  Made here, before the
	 * first request this worker serves, not in it.
	 */
	void *volatile first = malloc(64);	/* volatile: not optimised away */

	free(first);
	while (!fuse_session_exited(fs.se)) {
		pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &old);
		res = fuse_session_receive_buf(fs.se, &w->buf);
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
		if (res == -EINTR || res == -EAGAIN)
			continue;
		if (res <= 0) {
			/*
			 * The connection ended: ENODEV, or ECONNABORTED where
			 * the kernel aborts it (a fusectl abort; an unmount
			 * that finds requests still queued, such as the
			 * background RELEASEs of many closes).  Said once.
			 */
			if (res == -ECONNABORTED && !__atomic_exchange_n(&conn_aborted_said, true,
									 __ATOMIC_RELAXED))
				tlog(LOG_NOTICE, "the kernel aborted the connection (unmounted "
				     "with requests queued, or aborted through fusectl)");
			else if (res < 0 && res != -ENODEV && res != -ECONNABORTED)
				tlog(LOG_ERR, "reading /dev/fuse: %s", strerror(-res));
			fuse_session_exit(fs.se);
			break;
		}
		if (!(w->buf.flags & FUSE_BUF_IS_FD)) {
			note_init(w->buf.mem, (size_t)res);
			note_kill(w->buf.mem, (size_t)res);
		}
		t0 = tier_now();
		fuse_session_process_buf(fs.se, &w->buf);
		t0 = tier_now() - t0;
		if (t0 > SLOW_REQUEST_S && !(w->buf.flags & FUSE_BUF_IS_FD))
			tlog(LOG_INFO, "slow request: opcode %u took %.0f ms",
			     ((const struct fuse_in_header *)w->buf.mem)->opcode, t0 * 1e3);
	}
	return NULL;
}

/*
 * The device number of the file system mounted last on path (this
 * daemon's, once mounted), from /proc/self/mountinfo.  Not from a stat()
 * of the mount point: that is a request to this daemon, and a thread of
 * it waiting for its own answer keeps a killed daemon from ever exiting
 * (the threads that answer die first, the waiting one cannot, and the
 * connection lives while the process holds /dev/fuse open).  Nothing of
 * the daemon's may go through its own mount.  0 or -errno.
 */
static int mounted_dev(const char *path, unsigned *maj, unsigned *min)
{
	char line[8192], mp[4096];
	FILE *f = fopen("/proc/self/mountinfo", "re");
	int ret = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		unsigned a, b;

		if (sscanf(line, "%*d %*d %u:%u %*s %4095s", &a, &b, mp) != 3)
			continue;
		fs_mountinfo_unescape(mp);
		if (!strcmp(mp, path)) {	/* the last one is on top */
			*maj = a;
			*min = b;
			ret = 0;
		}
	}
	fclose(f);
	return ret;
}

/*
 * The kernel gives a FUSE mount 128 KiB of readahead; sequential reads of
 * cached checkpoints run much faster with more (bench/RESULTS.md).
 */
static void set_readahead(void)
{
	char path[128], val[32];
	unsigned maj, min;
	int fd;

	if (fs.opts.readahead_kb <= 0 || mounted_dev(fs.opts.mountpoint, &maj, &min))
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
	snprintf(val, sizeof(val), "%d", fs.opts.readahead_kb);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, val, strlen(val)) < 0)
		tlog(LOG_INFO, "cannot set readahead to %d KiB (%s): %s", fs.opts.readahead_kb,
		     path, strerror(errno));
	if (fd >= 0)
		close(fd);
}

int fs_run_loop(void)
{
	struct fs_worker *w = calloc(FS_WORKERS, sizeof(*w));
	int i, n = 0, pinned = 0;

	if (!w)
		return -ENOMEM;
	for (i = 0; i < FS_WORKERS; i++) {
		w[i].buf.mem = aligned_alloc(4096, FS_RECV_SIZE);
		w[i].buf.size = FS_RECV_SIZE;
		if (!w[i].buf.mem)
			break;
		memset(w[i].buf.mem, 0, FS_RECV_SIZE);		/* fault it in */
		if (pthread_create(&w[i].th, NULL, worker_main, &w[i]) != 0) {
			free(w[i].buf.mem);
			break;
		}
		n++;
	}
	/* last: faulting the host cache in and loading the CUDA driver stall
	 * thread creation (see engine_start_background) */
	engine_start_background(fs.eng);
	set_readahead();
	while (n && !fuse_session_exited(fs.se)) {
		/* the GPU tier comes up in the background: pin the request
		 * buffers once, when it is there */
		if (pinned == 0 && engine_has_gpu(fs.eng)) {
			for (i = 0; i < n; i++)
				if (gpu_tier_host_register(w[i].buf.mem, FS_RECV_SIZE) == 0) {
					w[i].registered = true;
					pinned++;
				}
			tlog(LOG_INFO, "%d request buffers pinned for host -> GPU copies", pinned);
			if (!pinned)
				pinned = -1;	/* do not try again */
		}
		usleep(20 * 1000);	/* signals and worker exits end this */
	}
	for (i = 0; i < n; i++)
		pthread_cancel(w[i].th);
	for (i = 0; i < n; i++) {
		pthread_join(w[i].th, NULL);
		if (w[i].registered)
			gpu_tier_host_unregister(w[i].buf.mem);
		free(w[i].buf.mem);
	}
	free(w);
	return n ? 0 : -EAGAIN;
}
