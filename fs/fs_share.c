/*
 * fs_share.c - sharing the GPU cache with client processes (-o gpu_share).
 *
 * Why: when the daemon copies a client's GPU buffer (TIERFS_IOC_PWRITE_GPU),
 * the copy runs in the daemon's CUDA context, and the GPU switches from the
 * application's context to the daemon's and back: ~150-200 us per call on
 * an H100, more than a 128 MiB device copy takes.  With gpu_share the
 * client maps the daemon's GPU cache into its own address space and copies
 * in its own context; the daemon only places and pins the bytes (a span,
 * tfile_span_begin) and commits them afterwards (tfile_span_end).  The
 * protocol is in tierfs_share.h.
 *
 * Trust model: a client that maps the cache can read and write all of it,
 * every cached file included, whatever the files' permissions.  So only
 * root and the daemon's own user may (checked on the ioctl and again on the
 * socket, SO_PEERCRED): processes that could already read and write the
 * daemon's memory (ptrace, /proc/PID/mem).  Everyone else keeps the ioctl
 * path, where the daemon copies and checks file access per call.
 *
 * One thread serves the socket (epoll): it accepts clients, sends them the
 * cache's chunks, and ends spans.  A span's end comes within the copy's
 * time (~0.1-1 ms), but a thread that has slept for a while takes up to
 * ~150 us to wake (measured on an H200 machine: more than a 128 MiB copy
 * takes).  So the FUSE worker that began the span, awake anyway, replies
 * and then polls the connection for the end for a bounded time (a span's
 * expected copy time plus a margin, POLL_MAX_US at most) and ends it itself
 * (fs_share_poll).  If the end is late, the worker kicks the socket thread
 * and returns to FUSE: that thread polls while spans are open (SPIN_MAX_MS
 * at most) and sleeps otherwise.  No wait for a span's end ever holds a
 * FUSE worker beyond that bound, so requests that wait for a span (writes
 * to the same file) cannot starve the span's end of workers.  Either
 * thread may receive a connection's message (SOCK_SEQPACKET: each message
 * goes to one reader, whole) and answer it; a client has one request
 * outstanding per connection.  A client that exits or closes its socket
 * has its open spans ended as failed (by the socket thread).
 *
 * Locking: share.lock guards the connection list, every connection's span
 * list and `busy`; no engine call runs under it.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "gpu_tier.h"
#include "tierfs_share.h"

struct span_ent {
	struct span_ent *next;
	uint64_t token;
	struct fs_inode *in;		/* referenced */
	struct tspan s;
	uint64_t dptr;			/* the daemon's address of file byte 0 */
	uint64_t before;		/* file size before a write */
};

#define SPIN_MAX_MS	20
#define POLL_MIN_US	100		/* a worker polls for a span's end... */
#define POLL_MAX_US	2000		/* ...this long at most */
#define POLL_US_PER_MIB	2.0		/* expected copy time (0.5 TB/s) */

struct conn {
	struct conn *next;
	int fd;
	uint64_t id;
	uid_t uid;
	pid_t pid;
	struct span_ent *spans;
	bool dead;			/* closed; freed when busy drops to 0 */
	int busy;			/* span ioctls using it */
};

static struct {
	pthread_mutex_t lock;
	int lfd, efd, stopfd, kickfd;
	int open_spans;			/* atomic: spans begun, not ended */
	pthread_t thread;
	bool started;
	char name[SHARE_NAME_MAX];
	uint64_t cache_id;
	struct conn *conns;
	uint64_t next_token;
} share = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.lfd = -1, .efd = -1, .stopfd = -1, .kickfd = -1,
};

static uint64_t random64(void)
{
	uint64_t v = 0;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = (uint64_t)time(NULL) * 6364136223846793005ULL ^ (uint64_t)getpid();
	return v ? v : 1;
}

/* Root and the daemon's user may map the cache. */
static bool uid_allowed(uid_t uid)
{
	return uid == 0 || uid == geteuid();
}

/* The GPU tier when it is fully mapped; else NULL and *err (-errno) says why. */
static struct gpu_tier *tier_ready(int *err)
{
	struct gpu_tier *g = engine_gpu_tier(fs.eng);

	if (!g) {
		*err = -ENODEV;
		return NULL;
	}
	if (gpu_tier_mapped(g) < gpu_tier_size(g)) {
		*err = -EAGAIN;
		return NULL;
	}
	return g;
}

/* ---- the ioctls (FUSE workers) ---------------------------------------- */

int fs_share_info(uid_t uid, struct tierfs_gpu_share *out)
{
	struct gpu_tier *g;
	int err;

	if (!share.started)
		return engine_has_gpu(fs.eng) ? -EOPNOTSUPP : -ENODEV;
	if (!uid_allowed(uid))
		return -EPERM;
	g = tier_ready(&err);
	if (!g)
		return err;
	memset(out, 0, sizeof(*out));
	snprintf(out->socket, sizeof(out->socket), "%s", share.name);
	out->cache_id = share.cache_id;
	out->device = gpu_tier_device(g);
	return 0;
}

static void conn_free(struct conn *c)
{
	close(c->fd);
	free(c);
}

/* A connection by id, busy; NULL if none is live.  share.lock held. */
static struct conn *conn_find(uint64_t id)
{
	struct conn *c;

	for (c = share.conns; c; c = c->next)
		if (c->id == id && !c->dead) {
			c->busy++;
			return c;
		}
	return NULL;
}

/*
 * Begin one span over ranges r[0..n) of in's file for connection conn_id:
 * cache_off[i] and r[i].len (cut at end of file) out, *token 0 when
 * nothing is pinned.  Returns 0 or -errno.
 */
static int share_begin(uid_t uid, struct fs_inode *in, uint64_t conn_id, bool write,
		       struct tspan_range *r, int n, uint64_t *cache_off,
		       uint64_t *token, struct share_poll *poll)
{
	struct gpu_tier *g = engine_gpu_tier(fs.eng);
	struct span_ent *ent;
	struct timespec mt;
	struct conn *c;
	bool dead, free_conn, trace = tierfs_log_level >= LOG_DEBUG;
	double t0;
	int ret;

	memset(poll, 0, sizeof(*poll));
	*token = 0;
	if (!share.started)
		return -EOPNOTSUPP;
	if (!uid_allowed(uid))
		return -EPERM;
	if (!g)
		return -ENODEV;
	ent = calloc(1, sizeof(*ent));
	if (!ent)
		return -ENOMEM;
	ranked_lock(&share.lock, LR_SHARE);
	c = conn_find(conn_id);
	ranked_unlock(&share.lock, LR_SHARE);
	if (!c) {
		free(ent);
		return -ESTALE;
	}
	tfile_attr(&in->tf, &ent->before, &mt);
	t0 = trace ? tier_now() : 0;
	ret = tfile_spanv_begin(&in->tf, write, r, n, &ent->s, cache_off);
	if (trace)
		tlog(LOG_DEBUG, "gpu share: %s span of %d range%s, %" PRIu64 " B: placed "
		     "in %.1f us", write ? "write" : "read", n, n == 1 ? "" : "s",
		     ent->s.bytes, (tier_now() - t0) * 1e6);
	ranked_lock(&share.lock, LR_SHARE);
	dead = c->dead;
	if (!ret && ent->s.cp && !dead) {
		int i = 0;

		while (!r[i].len)
			i++;		/* a range that is in the span */
		__atomic_add_fetch(&share.open_spans, 1, __ATOMIC_RELAXED);
		ent->token = ++share.next_token;
		ent->in = in;
		/* the daemon's address of file byte 0 of the copy */
		ent->dptr = gpu_tier_base(g) + cache_off[i] - r[i].off;
		fs_inode_get(in);
		ent->next = c->spans;
		c->spans = ent;
		/* the connection stays busy for fs_share_poll() */
		poll->c = c;
		poll->token = ent->token;
		poll->len = ent->s.bytes;
		free_conn = false;
	} else {
		free_conn = --c->busy == 0 && dead;
	}
	ranked_unlock(&share.lock, LR_SHARE);
	if (free_conn)
		conn_free(c);
	if (!ret && dead) {	/* the client went away meanwhile */
		tfile_span_end(&in->tf, &ent->s, false);
		ret = -ESTALE;
	}
	if (!ret && ent->token) {
		*token = ent->token;
		return 0;
	}
	free(ent);
	return ret;
}

int fs_share_begin(uid_t uid, struct fs_inode *in, struct tierfs_gpu_span *sp,
		   struct share_poll *poll)
{
	struct tspan_range r = { sp->file_off, sp->len };
	uint64_t cache_off = 0;
	int ret;

	/* the outputs: no span unless one is begun below */
	memset(&sp->cache_id, 0, sizeof(*sp) - offsetof(struct tierfs_gpu_span, cache_id));
	memset(poll, 0, sizeof(*poll));
	if (share.started && sp->len == 0 && uid_allowed(uid) && engine_gpu_tier(fs.eng)) {
		sp->cache_id = share.cache_id;
		return 0;	/* nothing to move */
	}
	ret = share_begin(uid, in, sp->conn_id, sp->flags & TIERFS_SPAN_WRITE, &r, 1,
			  &cache_off, &sp->token, poll);
	if (ret)
		return ret;
	sp->cache_id = share.cache_id;
	if (sp->token) {
		sp->cache_off = cache_off;
		sp->n = r.len;
	}
	return 0;
}

int fs_share_beginv(uid_t uid, struct fs_inode *in, struct tierfs_gpu_spanv *sv,
		    struct share_poll *poll)
{
	struct tspan_range r[SHARE_SPANV_MAX];
	uint64_t cache_off[SHARE_SPANV_MAX];
	uint32_t i, n = sv->nranges;
	int ret;

	for (i = 0; i < n; i++)
		r[i] = (struct tspan_range){ sv->r[i].file_off, sv->r[i].len };
	ret = share_begin(uid, in, sv->conn_id, sv->flags & TIERFS_SPAN_WRITE, r, (int)n,
			  cache_off, &sv->token, poll);
	sv->cache_id = ret ? 0 : share.cache_id;
	for (i = 0; i < n; i++) {
		sv->r[i].cache_off = !ret && sv->token ? cache_off[i] : 0;
		sv->r[i].n = !ret && sv->token ? r[i].len : 0;
	}
	return ret;
}

/* ---- the socket thread ------------------------------------------------ */

/* End one span (taken off its connection): commit or fail, tell the kernel. */
static int64_t span_finish(struct span_ent *ent, bool ok)
{
	bool trace = tierfs_log_level >= LOG_DEBUG;
	double t0 = trace ? tier_now() : 0, t1 = 0;
	ssize_t n = tfile_span_end(&ent->in->tf, &ent->s, ok);

	__atomic_sub_fetch(&share.open_spans, 1, __ATOMIC_RELAXED);
	t1 = trace ? tier_now() : 0;
	if (ent->s.write)
		fs_kernel_written(fs_ino_of(ent->in), ent->dptr + ent->s.hi - 1, ent->s.lo,
				  ent->s.hi - ent->s.lo, ent->before);
	if (trace)
		tlog(LOG_DEBUG, "gpu share: %s span of %" PRIu64 " B ended: commit %.1f us, "
		     "kernel notify %.1f us", ent->s.write ? "write" : "read", ent->s.bytes,
		     (t1 - t0) * 1e6, (tier_now() - t1) * 1e6);
	fs_inode_put(ent->in);
	free(ent);
	return n;
}

static void conn_close(struct conn *c)
{
	struct span_ent *list, *next;
	bool free_it;
	int n = 0;

	ranked_lock(&share.lock, LR_SHARE);
	for (struct conn **pp = &share.conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	c->dead = true;
	list = c->spans;
	c->spans = NULL;
	free_it = c->busy == 0;
	ranked_unlock(&share.lock, LR_SHARE);
	for (; list; list = next) {
		next = list->next;
		span_finish(list, false);
		n++;
	}
	tlog(n ? LOG_WARNING : LOG_INFO, "gpu share: client pid %d left%s", (int)c->pid,
	     n ? ", its unfinished copies failed" : "");
	epoll_ctl(share.efd, EPOLL_CTL_DEL, c->fd, NULL);
	if (free_it)
		conn_free(c);
}

/* Send the hello (err: 0 or -errno, the refusal) and, unless refused, the
 * chunks' descriptors.  Returns 0 or -errno. */
static int send_chunks(struct conn *c, struct gpu_tier *g, int err)
{
	struct share_hello h = {
		.magic = SHARE_MAGIC, .version = SHARE_VERSION,
		.err = -err,		/* the protocol's: a positive errno */
		.cache_id = share.cache_id, .conn_id = c->id,
	};
	int fds[SHARE_BATCH_MAX];
	uint64_t i = 0, k;
	int ret = 0;

	if (g) {
		h.device = gpu_tier_device(g);
		h.size = gpu_tier_size(g);
		h.chunk = gpu_tier_chunk(g);
		h.nchunks = (h.size + h.chunk - 1) / h.chunk;
	}
	if (send(c->fd, &h, sizeof(h), MSG_NOSIGNAL) != sizeof(h))
		return -errno;
	while (!err && i < h.nchunks) {
		struct share_batch b = { .first = (uint32_t)i };
		char ctl[CMSG_SPACE(sizeof(fds))];
		struct iovec iov = { &b, sizeof(b) };
		struct msghdr m = {
			.msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = ctl,
		};
		struct cmsghdr *cm;

		for (k = 0; k < SHARE_BATCH_MAX && i + k < h.nchunks; k++) {
			fds[k] = gpu_tier_export(g, i + k);
			if (fds[k] < 0) {
				ret = fds[k];
				break;
			}
		}
		b.count = (uint32_t)k;
		if (!ret) {
			memset(ctl, 0, sizeof(ctl));
			m.msg_controllen = CMSG_SPACE(k * sizeof(int));
			cm = CMSG_FIRSTHDR(&m);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(k * sizeof(int));
			memcpy(CMSG_DATA(cm), fds, k * sizeof(int));
			if (sendmsg(c->fd, &m, MSG_NOSIGNAL) != (ssize_t)sizeof(b))
				ret = -errno;
		}
		while (k > 0)
			close(fds[--k]);
		if (ret)
			return ret;
		i += b.count;
	}
	return 0;
}

static void accept_one(void)
{
	struct timeval tv = { .tv_sec = 5 };
	struct epoll_event ev = { .events = EPOLLIN };
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	struct gpu_tier *g = NULL;
	struct conn *c;
	int fd, err = 0, ret;

	fd = accept4(share.lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return;
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->fd = fd;
	c->id = random64();
	/* a client that stops reading cannot hold this thread for long */
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0)
		err = -EPERM;
	else if (c->uid = cred.uid, c->pid = cred.pid, !uid_allowed(cred.uid))
		err = -EPERM;
	else
		g = tier_ready(&err);
	ret = send_chunks(c, g, err);
	if (err || ret) {
		if (ret)
			tlog(LOG_WARNING, "gpu share: cannot hand the cache to pid %d: %s",
			     (int)c->pid, strerror(-ret));
		else
			tlog(LOG_INFO, "gpu share: pid %d (uid %d) refused: %s",
			     (int)c->pid, (int)c->uid, strerror(-err));
		conn_free(c);
		return;
	}
	ev.data.ptr = c;
	if (epoll_ctl(share.efd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		conn_free(c);
		return;
	}
	ranked_lock(&share.lock, LR_SHARE);
	c->next = share.conns;
	share.conns = c;
	ranked_unlock(&share.lock, LR_SHARE);
	tlog(LOG_INFO, "gpu share: pid %d (uid %d) maps the GPU cache", (int)c->pid,
	     (int)c->uid);
}

/*
 * One request of a connection, if one is waiting: end a span.  Returns 1
 * when it answered one, 0 when none was waiting (another thread may have
 * taken it), -1 when the connection is closed or broken (only the socket
 * thread closes it: conn_close()).
 */
static int serve_one(struct conn *c)
{
	struct span_ent *ent = NULL;
	struct share_end req;
	struct share_result res = { -EINVAL };
	ssize_t n = recv(c->fd, &req, sizeof(req), MSG_DONTWAIT);

	if (n <= 0)
		return n == 0 || (errno != EINTR && errno != EAGAIN) ? -1 : 0;
	if (n == sizeof(req)) {
		ranked_lock(&share.lock, LR_SHARE);
		for (struct span_ent **pp = &c->spans; *pp; pp = &(*pp)->next)
			if ((*pp)->token == req.token) {
				ent = *pp;
				*pp = ent->next;
				break;
			}
		ranked_unlock(&share.lock, LR_SHARE);
		if (ent)
			res.result = span_finish(ent, req.ok == 1);
		if (req.flags & SHARE_END_NOREPLY)
			return 1;	/* a read's end: nobody waits for it */
	}
	return send(c->fd, &res, sizeof(res), MSG_NOSIGNAL) == sizeof(res) ? 1 : -1;
}

/* The socket thread's turn: answer a request, or close the connection. */
static void serve(struct conn *c)
{
	if (serve_one(c) < 0)
		conn_close(c);
}

static bool span_open(struct conn *c, uint64_t token)
{
	struct span_ent *e;
	bool open = false;

	ranked_lock(&share.lock, LR_SHARE);
	for (e = c->dead ? NULL : c->spans; e && !open; e = e->next)
		open = e->token == token;
	ranked_unlock(&share.lock, LR_SHARE);
	return open;
}

/*
 * fs_share_poll - after the span ioctl's reply: wait for the span's end on
 * its connection and end it here, for a bounded time; past that, leave it
 * to the socket thread (kicked awake).  Releases the connection.
 */
void fs_share_poll(struct share_poll *poll)
{
	struct conn *c = poll->c;
	double t0 = tier_now(), until, mib = (double)poll->len / (1 << 20);
	bool open, free_conn, trace = tierfs_log_level >= LOG_DEBUG;
	long served = 0;
	int r = 0;

	if (!c)
		return;
	until = POLL_MIN_US + mib * POLL_US_PER_MIB;
	until = t0 + (until < POLL_MAX_US ? until : POLL_MAX_US) * 1e-6;
	while ((open = span_open(c, poll->token)) && r >= 0 && tier_now() < until) {
		r = serve_one(c);
		served += r > 0;
		if (r == 0)
			fs_cpu_relax();
	}
	if (open) {	/* late: the socket thread ends it */
		uint64_t one = 1;

		if (write(share.kickfd, &one, sizeof(one)) < 0)
			tlog(LOG_DEBUG, "gpu share: kick: %s", strerror(errno));
	}
	if (trace)
		tlog(LOG_DEBUG, "gpu share: worker polled %.1f us, answered %ld, span %s",
		     (tier_now() - t0) * 1e6, served, open ? "left to the socket thread" : "ended");
	ranked_lock(&share.lock, LR_SHARE);
	free_conn = --c->busy == 0 && c->dead;
	ranked_unlock(&share.lock, LR_SHARE);
	if (free_conn)
		conn_free(c);
}

static void *share_main(void *arg)
{
	struct epoll_event evs[16];
	double spin_from = 0;
	uint64_t v;
	int i, n, timeout;

	(void)arg;
	for (;;) {
		/* poll while spans are open (for SPIN_MAX_MS at most) */
		timeout = -1;
		if (__atomic_load_n(&share.open_spans, __ATOMIC_RELAXED) > 0) {
			if (!spin_from)
				spin_from = (tier_now() * 1e3);
			if ((tier_now() * 1e3) - spin_from < SPIN_MAX_MS)
				timeout = 0;
		} else {
			spin_from = 0;
		}
		n = epoll_wait(share.efd, evs, 16, timeout);
		if (n < 0 && errno != EINTR)
			break;
		for (i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;

			if (p == &share.stopfd)
				return NULL;
			if (p == &share.kickfd) {
				if (read(share.kickfd, &v, sizeof(v)) < 0)
					continue;	/* reset; nothing else */
				spin_from = 0;	/* a new span: poll afresh */
			} else if (p == &share.lfd) {
				accept_one();
			} else {
				serve(p);
			}
		}
	}
	return NULL;
}

/*
 * fs_share_start - open the share socket and its thread (-o gpu_share).
 * Returns 0 or -errno (logged); the mount then works without sharing.
 */
int fs_share_start(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct epoll_event ev = { .events = EPOLLIN };
	sigset_t all, old;
	socklen_t len;
	int ret;

	share.cache_id = random64();
	snprintf(share.name, sizeof(share.name), "tierfs-share-%d-%016" PRIx64,
		 (int)getpid(), share.cache_id);
	/* abstract: a_sun_path[0] = '\0', then the name, no terminator */
	memcpy(a.sun_path + 1, share.name, strlen(share.name));
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(share.name));
	share.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	share.efd = epoll_create1(EPOLL_CLOEXEC);
	share.stopfd = eventfd(0, EFD_CLOEXEC);
	share.kickfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (share.lfd < 0 || share.efd < 0 || share.stopfd < 0 || share.kickfd < 0 ||
	    bind(share.lfd, (struct sockaddr *)&a, len) < 0 ||
	    listen(share.lfd, 16) < 0)
		goto fail;
	ev.data.ptr = &share.lfd;
	if (epoll_ctl(share.efd, EPOLL_CTL_ADD, share.lfd, &ev) < 0)
		goto fail;
	ev.data.ptr = &share.stopfd;
	if (epoll_ctl(share.efd, EPOLL_CTL_ADD, share.stopfd, &ev) < 0)
		goto fail;
	ev.data.ptr = &share.kickfd;
	if (epoll_ctl(share.efd, EPOLL_CTL_ADD, share.kickfd, &ev) < 0)
		goto fail;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	ret = pthread_create(&share.thread, NULL, share_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret) {
		errno = ret;
		goto fail;
	}
	share.started = true;
	tlog(LOG_NOTICE, "gpu share: on: the daemon's user and root may map the GPU "
	     "cache (socket @%s)", share.name);
	return 0;
fail:
	ret = -errno;
	tlog(LOG_ERR, "gpu share: cannot open its socket: %s; the daemon copies",
	     strerror(-ret));
	if (share.lfd >= 0)
		close(share.lfd);
	if (share.efd >= 0)
		close(share.efd);
	if (share.stopfd >= 0)
		close(share.stopfd);
	if (share.kickfd >= 0)
		close(share.kickfd);
	share.lfd = share.efd = share.stopfd = share.kickfd = -1;
	return ret;
}

/*
 * fs_share_stop - close every connection (open spans fail) and the socket.
 * Call after the FUSE loop has returned, before the engine goes.
 */
void fs_share_stop(void)
{
	uint64_t one = 1;

	if (!share.started)
		return;
	if (write(share.stopfd, &one, sizeof(one)) != sizeof(one))
		tlog(LOG_WARNING, "gpu share: cannot stop its thread");
	pthread_join(share.thread, NULL);
	share.started = false;
	while (share.conns)
		conn_close(share.conns);
	close(share.lfd);
	close(share.efd);
	close(share.stopfd);
	close(share.kickfd);
	share.lfd = share.efd = share.stopfd = share.kickfd = -1;
}
