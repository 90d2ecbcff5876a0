/*
 * libtierfs.c - the client side of the tierfs GPU zero-copy ioctl
 * (fs/tierfs.h, tierfs-gpu(7)).
 *
 * tierfs_pwrite_gpu(fd, dev_ptr, len, off) and tierfs_pread_gpu() turn a
 * device pointer into what TIERFS_IOC_PWRITE_GPU / TIERFS_IOC_PREAD_GPU
 * carry: the CUDA IPC handle of the cuMemAlloc/cudaMalloc allocation that
 * holds the pointer (gpu_ipc_export: only whole allocations can be
 * exported), the pointer's offset inside it, a length and a file offset.
 *
 * Per call:
 *  1. Arguments: off >= 0, len <= SSIZE_MAX, off + len <= INT64_MAX, else
 *     EINVAL; len == 0 returns 0 once fd has passed step 2.
 *  2. The fd must be on tierfs (ENOTTY otherwise): an IPC handle is a
 *     capability for the whole allocation, and is not handed to another
 *     file system's ioctl.  The verdict (tierfs_is_tierfs) is cached per
 *     mount (st_dev and mount id, read with statx(AT_STATX_DONT_SYNC): no
 *     FUSE round trip).
 *  3. The allocation: a cache of exported handles (EXPORT_CACHE_MAX
 *     entries: 512, twice the daemon's mappings, so that a state dict of a
 *     few hundred allocations saved again exports nothing; sets of 8 by
 *     buffer id, least recently used out of a set) keyed by the driver's
 *     process-wide
 *     unique buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID), so an allocation
 *     freed and replaced at the same address is exported again, never sent
 *     with its predecessor's handle.  A miss calls gpu_ipc_export.
 *  4. The range [dev_ptr, dev_ptr + len) must lie in the allocation.
 *  5. The legacy default stream of the buffer's context is synchronised,
 *     so work queued there before the call is complete (the daemon copies
 *     on its own stream, in another process, which nothing else orders).
 *     And what write(2) left dirty in the kernel's writeback cache over
 *     [off, off + len) is written back (sync_file_range; no fsync: nothing
 *     is made durable), so that a GPU read sees it and a later writeback
 *     does not overwrite what the GPU wrote.  After a GPU write the daemon
 *     itself drops the kernel's cached pages of the range.
 *  6. With a mount that shares its GPU cache (-o gpu_share) and a buffer
 *     on the cache's GPU, the bytes move through the shared cache, span by
 *     span, copied in the application's own context (below); what is left
 *     (the file is not in the GPU tier, ...) takes step 7.
 *  7. ioctls of at most TIERFS_GPU_IO_MAX bytes, repeated on short counts
 *     (a read stops at end of file) and on EINTR (both commands are
 *     idempotent).  An error after some progress returns the progress.
 *     An EINVAL on a handle that came from the cache (not freshly exported)
 *     drops that entry and retries once with a fresh export.
 *
 * tierfs_pwritev_gpu / tierfs_preadv_gpu (gpu_iov) do the same for a list
 * of segments and one file: every segment is checked first (length > 0,
 * offsets, the total, a write's file ranges not overlapping: sorted), then
 * the fd, then each distinct allocation is resolved once (a segment inside
 * an allocation already seen in this call asks the driver nothing), each
 * context synchronised once, sync_file_range once over the union; the
 * shared cache takes what it can (a span per list of up to 256 ranges,
 * TIERFS_IOC_GPU_SPANV, copied with one wait; a span per segment with a
 * daemon older than share protocol 3); the rest goes in
 * TIERFS_IOC_PWRITEV_GPU / PREADV_GPU batches of 192 pieces, 128 handles and
 * TIERFS_GPU_VEC_MAX bytes (the count comes back in the struct: a 4 GiB
 * state dict is one call).  Any failure returns -1 (no partial count: the
 * segments have no order a count could describe).
 *
 * Without CUDA (built without it, or no libcuda.so.1 at run time) the
 * calls fail with ENODEV after steps 1 and 2.
 *
 * Threads: every entry point is thread-safe; the caches have one mutex
 * each, held only for table look-ups, never across a driver call or an
 * ioctl.  The driver is loaded at run time (gpu/gpu_dl.c): nothing here
 * links libcuda.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"
#include "tierfs.h"
#include "tierfs_share.h"
#ifdef HAVE_CUDA
#include "gpu_dl.h"
#endif

#define TIERFS_EXPORT __attribute__((visibility("default")))

_Static_assert(TIERFS_IPC_HANDLE_SIZE == GPU_IPC_HANDLE_SIZE,
	       "IPC handle sizes of tierfs.h and gpu.h");

#define FUSE_SUPER_MAGIC_	0x65735546
#define EXPORT_CACHE_WAYS	8	/* exported allocations: sets of 8, */
#define EXPORT_CACHE_SETS	64	/* chosen by buffer id (512 in all) */
#define EXPORT_CACHE_MAX	(EXPORT_CACHE_WAYS * EXPORT_CACHE_SETS)
#define MOUNT_CACHE_MAX		16	/* mounts with a verdict */

/* ---- which fds are on tierfs ------------------------------------------ */

/*
 * The file system type of fd's mount in /proc/self/mountinfo is
 * "fuse.tierfs" (the daemon mounts with subtype=tierfs): 1, else 0.
 */
static int mountinfo_is_tierfs(int fd)
{
	struct statx stx;
	char line[4096], *sep, fstype[64];
	unsigned long long id;
	int ret = 0;
	FILE *f;

	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_MNT_ID,
		  &stx) < 0 || !(stx.stx_mask & STATX_MNT_ID))
		return 0;
	f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llu", &id) != 1 || id != stx.stx_mnt_id)
			continue;
		sep = strstr(line, " - ");
		if (sep && sscanf(sep + 3, "%63s", fstype) == 1)
			ret = strcmp(fstype, "fuse.tierfs") == 0;
		break;
	}
	fclose(f);
	return ret;
}

/*
 * tierfs_is_tierfs - 1: fd is on a tierfs mount (a FUSE file system that
 * answers tierfs's own attributes; when the caller may not read the
 * attributes, one whose mount says "fuse.tierfs"); 0: it is not; -1 with
 * errno: fd cannot be examined (EBADF: not open, or opened O_PATH).
 */
TIERFS_EXPORT int tierfs_is_tierfs(int fd)
{
	static const char *const probes[] = {
		TIERFS_XATTR_STATE,		/* regular files */
		TIERFS_XATTR_PREFETCH,		/* directories */
	};
	struct statfs sf;
	bool denied = false;
	size_t i;

	if (fstatfs(fd, &sf) < 0)
		return -1;
	if ((unsigned long)sf.f_type != FUSE_SUPER_MAGIC_)
		return 0;
	for (i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
		if (fgetxattr(fd, probes[i], NULL, 0) >= 0 || errno == ERANGE)
			return 1;
		switch (errno) {
		case ENODATA:		/* not this kind of file, or not tierfs */
			break;
		case EACCES:		/* default_permissions: unreadable file */
		case EPERM:
			denied = true;
			break;
		case ENOTSUP:		/* a FUSE file system without xattrs */
#if EOPNOTSUPP != ENOTSUP
		case EOPNOTSUPP:
#endif
			return 0;
		default:
			return -1;
		}
	}
	return denied ? mountinfo_is_tierfs(fd) : 0;
}

static struct {
	pthread_mutex_t lock;
	struct mount_verdict {
		dev_t dev;
		uint64_t mnt_id;	/* 0: unknown (old kernel) */
		bool tierfs;
	} m[MOUNT_CACHE_MAX];
	int n, next;
} mounts = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* 0 if fd is on tierfs; else -1 with errno ENOTTY or statx's error.
 * *devp and *mntp say which mount. */
static int check_fd(int fd, dev_t *devp, uint64_t *mntp)
{
	struct statx stx;
	dev_t dev;
	uint64_t mnt_id;
	int i, v;

	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC,
		  STATX_TYPE | STATX_MNT_ID, &stx) < 0)
		return -1;
	dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
	mnt_id = (stx.stx_mask & STATX_MNT_ID) ? stx.stx_mnt_id : 0;
	*devp = dev;
	*mntp = mnt_id;
	pthread_mutex_lock(&mounts.lock);
	for (i = 0; i < mounts.n; i++) {
		if (mounts.m[i].dev == dev && mounts.m[i].mnt_id == mnt_id) {
			v = mounts.m[i].tierfs;
			pthread_mutex_unlock(&mounts.lock);
			goto verdict;
		}
	}
	pthread_mutex_unlock(&mounts.lock);

	v = tierfs_is_tierfs(fd);
	if (v < 0)
		return -1;
	pthread_mutex_lock(&mounts.lock);
	i = mounts.n < MOUNT_CACHE_MAX ? mounts.n++ : mounts.next++ % MOUNT_CACHE_MAX;
	mounts.m[i].dev = dev;
	mounts.m[i].mnt_id = mnt_id;
	mounts.m[i].tierfs = v;
	pthread_mutex_unlock(&mounts.lock);
verdict:
	if (!v) {
		errno = ENOTTY;
		return -1;
	}
	return 0;
}

/* ---- exported allocations -------------------------------------------- */

struct xent {
	uint64_t id;		/* driver buffer id; 0: slot free */
	uint64_t base, size;
	int device;
	uint8_t handle[TIERFS_IPC_HANDLE_SIZE];
	uint64_t used;		/* LRU tick */
};

static struct {
	pthread_mutex_t lock;
	struct xent e[EXPORT_CACHE_MAX];
	uint64_t tick;
} xcache = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* What the driver says about one pointer, without exporting anything. */
struct ptr_info {
	uint64_t id;		/* buffer id, 0: not device memory / unknown */
	void *ctx;		/* owning context (CUcontext), or NULL */
};

static void ptr_query(uint64_t p, struct ptr_info *pi)
{
	pi->id = 0;
	pi->ctx = NULL;
#ifdef HAVE_CUDA
	CUpointer_attribute attrs[] = {
		CU_POINTER_ATTRIBUTE_BUFFER_ID,
		CU_POINTER_ATTRIBUTE_CONTEXT,
	};
	unsigned long long id = 0;
	CUcontext ctx = NULL;
	void *data[] = { &id, &ctx };

	if (!gpu_dl_loaded())	/* nothing exported yet: no driver to ask */
		return;
	/* not an error for host or unknown pointers: attributes stay 0 */
	if (cuPointerGetAttributes(2, attrs, data, (CUdeviceptr)p) !=
	    CUDA_SUCCESS)
		return;
	pi->id = id;
	pi->ctx = ctx;
#else
	(void)p;
#endif
}

/*
 * Make work queued on the legacy default stream of ctx complete before the
 * daemon touches the buffer.  Returns 0 or -1 with errno (EIO).
 */
static int sync_buffer(void *ctx)
{
#ifdef HAVE_CUDA
	CUcontext popped;
	CUresult r;

	if (!ctx || !gpu_dl_loaded())
		return 0;
	if (cuCtxPushCurrent((CUcontext)ctx) != CUDA_SUCCESS) {
		errno = EIO;
		return -1;
	}
	r = cuStreamSynchronize(NULL);
	cuCtxPopCurrent(&popped);
	if (r != CUDA_SUCCESS) {
		errno = r == CUDA_ERROR_OUT_OF_MEMORY ? ENOMEM : EIO;
		return -1;
	}
#else
	(void)ctx;
#endif
	return 0;
}

/* The set of the cache that buffer id falls in. */
static struct xent *xset(uint64_t id)
{
	uint64_t h = id * 0x9e3779b97f4a7c15ull;

	return &xcache.e[(h >> 58) % EXPORT_CACHE_SETS * EXPORT_CACHE_WAYS];
}

static void xcache_drop(uint64_t id)
{
	struct xent *set = xset(id);
	int i;

	pthread_mutex_lock(&xcache.lock);
	for (i = 0; i < EXPORT_CACHE_WAYS; i++)
		if (set[i].id == id)
			set[i].id = 0;
	pthread_mutex_unlock(&xcache.lock);
}

/*
 * The allocation holding p: from the cache (*cached true) or exported now.
 * Fills out (handle, base, size, device) and *pi.  Returns 0 or -1 with
 * errno: ENODEV (no CUDA), EINVAL (not exportable device memory), EIO.
 */
static int resolve(uint64_t p, struct xent *out, struct ptr_info *pi,
		   bool *cached, bool no_cache)
{
	uint64_t base = 0, size = 0;
	struct xent *set;
	int i, victim, dev = -1, ret;

	ptr_query(p, pi);
	if (pi->id && !no_cache) {
		set = xset(pi->id);
		pthread_mutex_lock(&xcache.lock);
		for (i = 0; i < EXPORT_CACHE_WAYS; i++) {
			struct xent *x = &set[i];

			if (x->id == pi->id && p >= x->base &&
			    p - x->base < x->size) {
				x->used = ++xcache.tick;
				*out = *x;
				*cached = true;
				pthread_mutex_unlock(&xcache.lock);
				return 0;
			}
		}
		pthread_mutex_unlock(&xcache.lock);
	}

	*cached = false;
	ret = gpu_ipc_export(p, out->handle, &base, &size, &dev);
	if (ret) {
		errno = ret == -EOPNOTSUPP ? ENODEV : -ret;
		return -1;
	}
	out->base = base;
	out->size = size;
	out->device = dev;
	if (!pi->id)		/* the driver is loaded now: ask again */
		ptr_query(p, pi);
	out->id = pi->id;
	if (!out->id)		/* cannot tell it from a successor: no cache */
		return 0;

	set = xset(out->id);
	pthread_mutex_lock(&xcache.lock);
	victim = 0;
	for (i = 0; i < EXPORT_CACHE_WAYS; i++) {
		struct xent *x = &set[i];

		if (x->id == out->id || !x->id) {
			victim = i;	/* the same allocation, or a free slot */
			break;
		}
		if (x->used < set[victim].used)
			victim = i;
	}
	out->used = ++xcache.tick;
	set[victim] = *out;
	pthread_mutex_unlock(&xcache.lock);
	return 0;
}

/* ---- a shared GPU cache (-o gpu_share) ------------------------------- */

/*
 * With -o gpu_share the daemon lets root and its own user map its GPU
 * cache (tierfs_share.h).  The first call on a mount asks for it
 * (TIERFS_IOC_GPU_SHARE), connects to the daemon's socket, receives the
 * cache's chunks as descriptors and maps them; later calls copy device to
 * device in the application's own context between TIERFS_IOC_GPU_SPAN and
 * the span's end on the socket.  Whatever cannot go that way (sharing off
 * or refused, a buffer on another GPU, a file not in the GPU tier) takes
 * the daemon-copy ioctl above, with the same results.  TIERFS_GPU_SHARE=0
 * in the environment turns the shared path off in this process.
 *
 * A mapping is reference counted: a daemon that went away (its socket
 * closed, or a span answered ESTALE) makes it dead; the last user unmaps.
 */
#define SHARE_CACHE_MAX		8
#define SHARE_RETRY_S		1	/* after EAGAIN: cache still mapping */
#define SHARE_SPIN_S		0.002	/* poll for a span's end this long */

struct share {
	dev_t dev;
	uint64_t mnt_id;
	bool on;		/* mapped; else `retry_at` says when to ask */
	bool dead;		/* no new users; unmapped by the last one */
	double retry_at;	/* CLOCK_MONOTONIC s; 0: never again */
	int users;
	int sock;
	int device;
	uint64_t conn_id, cache_id, va, size, chunk, mapped;
	bool noreply;		/* the daemon takes SHARE_END_NOREPLY */
	bool spanv;		/* ... and TIERFS_IOC_GPU_SPANV */
	pthread_mutex_t io;	/* one span end at a time on sock */
};

static struct {
	pthread_mutex_t lock;
	struct share *s[SHARE_CACHE_MAX];
} shares = { .lock = PTHREAD_MUTEX_INITIALIZER };

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Unmap the cache (if mapped) and close the socket; sh stays allocated. */
static void share_unmap(struct share *sh)
{
	if (sh->on)
		gpu_share_release(sh->device, sh->va, sh->mapped, sh->chunk,
				  sh->size);
	sh->on = false;
	if (sh->sock >= 0)
		close(sh->sock);
	sh->sock = -1;
}

static void share_free(struct share *sh)
{
	share_unmap(sh);
	pthread_mutex_destroy(&sh->io);
	free(sh);
}

static void share_put(struct share *sh)
{
	bool last;

	pthread_mutex_lock(&shares.lock);
	last = --sh->users == 0 && sh->dead;
	pthread_mutex_unlock(&shares.lock);
	if (last)
		share_free(sh);
}

/* Take sh out of the table (the daemon went away); the last user frees. */
static void share_kill(struct share *sh)
{
	int i;

	pthread_mutex_lock(&shares.lock);
	for (i = 0; i < SHARE_CACHE_MAX; i++)
		if (shares.s[i] == sh)
			shares.s[i] = NULL;
	sh->dead = true;
	pthread_mutex_unlock(&shares.lock);
}

/* Receive one batch of chunk descriptors and map them.  0 or -errno. */
static int share_map_batch(struct share *sh, uint64_t nchunks)
{
	char ctl[CMSG_SPACE(SHARE_BATCH_MAX * sizeof(int))];
	struct share_batch b;
	struct iovec iov = { &b, sizeof(b) };
	struct msghdr m = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = ctl, .msg_controllen = sizeof(ctl),
	};
	struct cmsghdr *cm;
	int fds[SHARE_BATCH_MAX], nfd = 0, i, ret = 0;
	ssize_t n = recvmsg(sh->sock, &m, MSG_CMSG_CLOEXEC);

	if (n < 0)
		return -errno;
	for (cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

			if (k > SHARE_BATCH_MAX - nfd)
				k = SHARE_BATCH_MAX - nfd;
			memcpy(fds + nfd, CMSG_DATA(cm), (size_t)k * sizeof(int));
			nfd += k;
		}
	if (n != sizeof(b) || (m.msg_flags & MSG_CTRUNC) || b.count != (uint32_t)nfd ||
	    b.first * sh->chunk != sh->mapped || b.first + (uint64_t)b.count > nchunks)
		ret = -EPROTO;
	for (i = 0; i < nfd; i++) {
		uint64_t len = sh->size - sh->mapped < sh->chunk ?
			       sh->size - sh->mapped : sh->chunk;

		if (!ret && !(ret = gpu_share_map(sh->device, sh->va + sh->mapped,
						  len, fds[i])))
			sh->mapped += len;
		close(fds[i]);
	}
	return ret;
}

/* Ask the daemon of fd's mount for its cache and map it.  0 or -errno. */
static int share_setup(struct share *sh, int fd)
{
	struct tierfs_gpu_share info;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct share_hello h;
	uint64_t nchunks;
	size_t nl;
	int ret;

	if (ioctl(fd, TIERFS_IOC_GPU_SHARE, &info) < 0)
		return -errno;
	info.socket[sizeof(info.socket) - 1] = 0;
	nl = strlen(info.socket);
	memcpy(a.sun_path + 1, info.socket, nl);
	sh->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (sh->sock < 0 ||
	    connect(sh->sock, (struct sockaddr *)&a,
		    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl)) < 0)
		return -errno;
	if (recv(sh->sock, &h, sizeof(h), 0) != sizeof(h))
		return -EPROTO;
	if (h.magic != SHARE_MAGIC || h.version < SHARE_VERSION_MIN ||
	    h.version > SHARE_VERSION)
		return -EPROTO;
	if (h.err)
		return -h.err;
	if (!h.size || !h.chunk || h.cache_id != info.cache_id)
		return -EPROTO;
	sh->device = h.device;
	sh->noreply = h.version >= 2;
	sh->spanv = h.version >= 3;
	sh->conn_id = h.conn_id;
	sh->cache_id = h.cache_id;
	sh->size = h.size;
	sh->chunk = h.chunk;
	nchunks = (h.size + h.chunk - 1) / h.chunk;
	ret = gpu_share_reserve(sh->device, sh->size, 0, &sh->va);
	if (ret)
		return ret;
	sh->on = true;		/* from here on share_free() unmaps */
	while (!ret && sh->mapped < sh->size)
		ret = share_map_batch(sh, nchunks);
	if (!ret)
		ret = gpu_share_access(sh->device, sh->va, sh->size);
	return ret;
}

/*
 * The mapped cache of fd's mount, referenced (share_put() it), or NULL:
 * not shared, not yet, or not here.
 */
static struct share *share_get(int fd, dev_t dev, uint64_t mnt_id)
{
	const char *env = getenv("TIERFS_GPU_SHARE");
	struct share *sh = NULL, *old = NULL;
	double now = mono_s();
	int i, slot, ret;

	if (env && strcmp(env, "0") == 0)
		return NULL;
	pthread_mutex_lock(&shares.lock);
	for (i = 0; i < SHARE_CACHE_MAX; i++) {
		struct share *x = shares.s[i];

		if (!x || x->dev != dev || x->mnt_id != mnt_id)
			continue;
		if (x->on) {
			x->users++;
			pthread_mutex_unlock(&shares.lock);
			return x;
		}
		if (!x->retry_at || now < x->retry_at) {
			pthread_mutex_unlock(&shares.lock);
			return NULL;	/* asked recently, or never again */
		}
		shares.s[i] = NULL;	/* ask again below */
		old = x;
		break;
	}
	pthread_mutex_unlock(&shares.lock);
	if (old)
		share_free(old);

	sh = calloc(1, sizeof(*sh));
	if (!sh)
		return NULL;
	sh->dev = dev;
	sh->mnt_id = mnt_id;
	sh->sock = -1;
	pthread_mutex_init(&sh->io, NULL);
	ret = share_setup(sh, fd);
	if (ret) {
		/* the cache is still being mapped: soon; anything else
		 * (sharing off, refused, no GPU): not again */
		share_unmap(sh);
		sh->retry_at = ret == -EAGAIN ? now + SHARE_RETRY_S : 0;
	} else {
		sh->users = 1;
	}

	/* into the table: a free slot, else one nobody uses */
	old = NULL;
	pthread_mutex_lock(&shares.lock);
	for (slot = -1, i = 0; i < SHARE_CACHE_MAX && slot < 0; i++)
		if (!shares.s[i])
			slot = i;
	for (i = 0; i < SHARE_CACHE_MAX && slot < 0; i++)
		if (!shares.s[i]->users) {
			slot = i;
			old = shares.s[i];
		}
	if (slot >= 0)
		shares.s[slot] = sh;
	else
		sh->dead = true;	/* not in the table: freed after use */
	pthread_mutex_unlock(&shares.lock);
	if (old)
		share_free(old);	/* out of the table, unused */
	if (!sh->on) {
		if (slot < 0)
			share_free(sh);
		return NULL;
	}
	return sh;
}

/*
 * End span `token` on the socket; the daemon's result (bytes or -errno).
 * A read span that copied its n bytes is ended without waiting for the
 * answer (it only releases the range): returns n.
 */
static int64_t share_end(struct share *sh, uint64_t token, bool ok, bool write,
			 uint64_t n_read)
{
	struct share_end req = { .token = token, .ok = ok ? 1 : 0 };
	struct share_result res;
	bool noreply = !write && ok && sh->noreply;
	ssize_t n;

	if (noreply)
		req.flags = SHARE_END_NOREPLY;
	pthread_mutex_lock(&sh->io);
	n = send(sh->sock, &req, sizeof(req), MSG_NOSIGNAL);
	if (n == sizeof(req) && noreply) {
		pthread_mutex_unlock(&sh->io);
		return (int64_t)n_read;
	}
	if (n == sizeof(req)) {
		/* the answer takes microseconds: poll for it a while before
		 * sleeping (waking up costs tens of microseconds) */
		double until = mono_s() + SHARE_SPIN_S;

		do
			n = recv(sh->sock, &res, sizeof(res), MSG_DONTWAIT);
		while (n < 0 && (errno == EAGAIN || errno == EINTR) &&
		       mono_s() < until);
		while (n < 0 && (errno == EAGAIN || errno == EINTR))
			n = recv(sh->sock, &res, sizeof(res), 0);
	}
	pthread_mutex_unlock(&sh->io);
	if (n != sizeof(res)) {
		share_kill(sh);		/* the daemon went away */
		return -EIO;
	}
	return res.result;
}

/*
 * Move what can go through the shared cache: from *done on, span by span.
 * Returns 0 when the rest (if any) is for the daemon-copy ioctl, 1 when
 * the call is over (*done final: end of file), -1 with errno on failure.
 */
/* TIERFS_TRACE=1: print the phases of each call on stderr */
static bool tracing(void)
{
	static int trace = -1;

	if (trace < 0)
		trace = getenv("TIERFS_TRACE") && atoi(getenv("TIERFS_TRACE")) > 0;
	return trace;
}

static int share_io(struct share *sh, int fd, uint64_t p, void *ctx,
		    size_t len, off_t off, bool write, size_t *done)
{
	bool trace = tracing();

	while (*done < len) {
		struct tierfs_gpu_span sp = {
			.conn_id = sh->conn_id,
			.file_off = (uint64_t)off + *done,
			.len = len - *done,
			.flags = write ? TIERFS_SPAN_WRITE : 0,
		};
		uint64_t dev_at;
		int64_t res;
		double t[4];
		int ret;

		if (sp.len > TIERFS_GPU_IO_MAX)
			sp.len = TIERFS_GPU_IO_MAX;
		t[0] = trace ? mono_s() : 0;
		if (ioctl(fd, TIERFS_IOC_GPU_SPAN, &sp) < 0) {
			if (errno == EINTR)
				continue;
			if (errno == ESTALE)
				share_kill(sh);
			if (errno == EAGAIN || errno == ESTALE || errno == EPERM)
				return 0;	/* the daemon copies the rest */
			return -1;
		}
		if (sp.n == 0)
			return 1;		/* end of file */
		if (sp.cache_id != sh->cache_id) {
			share_end(sh, sp.token, false, write, 0);
			share_kill(sh);
			return 0;
		}
		dev_at = sh->va + sp.cache_off;
		t[1] = trace ? mono_s() : 0;
		ret = write ? gpu_share_copy(sh->device, ctx, dev_at, p + *done, sp.n)
			    : gpu_share_copy(sh->device, ctx, p + *done, dev_at, sp.n);
		t[2] = trace ? mono_s() : 0;
		res = share_end(sh, sp.token, ret == 0, write, sp.n);
		if (trace) {
			t[3] = mono_s();
			fprintf(stderr, "libtierfs: shared %s of %" PRIu64 " B: span %.1f us, "
				"copy %.1f us, end %.1f us\n", write ? "write" : "read",
				sp.n, (t[1] - t[0]) * 1e6, (t[2] - t[1]) * 1e6,
				(t[3] - t[2]) * 1e6);
		}
		if (ret) {
			errno = ret == -ENOMEM ? ENOMEM : EIO;
			return -1;
		}
		if (res < 0) {
			errno = (int)-res;
			return -1;
		}
		*done += (size_t)res;
		if (!write && (uint64_t)res < sp.len)
			return 1;		/* read to end of file */
	}
	return 1;
}

/* ---- the calls -------------------------------------------------------- */

static ssize_t gpu_io(int fd, uint64_t p, size_t len, off_t off, bool write)
{
	unsigned long cmd = write ? TIERFS_IOC_PWRITE_GPU : TIERFS_IOC_PREAD_GPU;
	struct tierfs_gpu_io io;
	struct ptr_info pi;
	struct share *sh;
	struct xent x;
	bool cached, retried = false;
	size_t done = 0;
	uint64_t mnt_id;
	dev_t dev;
	int r;

	double t_in = tracing() ? mono_s() : 0;

	if (off < 0 || len > SSIZE_MAX ||
	    len > (uint64_t)INT64_MAX - (uint64_t)off) {
		errno = EINVAL;
		return -1;
	}
	if (check_fd(fd, &dev, &mnt_id) < 0)
		return -1;
	if (len == 0)
		return 0;
	if (!p) {
		errno = EINVAL;
		return -1;
	}
again:
	if (resolve(p, &x, &pi, &cached, retried) < 0)
		return -1;
	if (p - x.base > x.size || len > x.size - (p - x.base)) {
		errno = EINVAL;	/* the range leaves the allocation */
		return -1;
	}
	if (!retried && (sync_buffer(pi.ctx) < 0 ||
			 sync_file_range(fd, off, (off_t)len,
					 SYNC_FILE_RANGE_WAIT_BEFORE |
					 SYNC_FILE_RANGE_WRITE |
					 SYNC_FILE_RANGE_WAIT_AFTER) < 0))
		return -1;

	if (!retried && (sh = share_get(fd, dev, mnt_id))) {
		if (tracing())
			fprintf(stderr, "libtierfs: %s of %zu B: %.1f us before the first span\n",
				write ? "write" : "read", len, (mono_s() - t_in) * 1e6);
		r = x.device == sh->device ?
		    share_io(sh, fd, p, pi.ctx, len, off, write, &done) : 0;
		share_put(sh);
		if (r < 0)
			return done ? (ssize_t)done : -1;
		if (r > 0 || done == len)
			return (ssize_t)done;
	}

	memset(&io, 0, sizeof(io));
	memcpy(io.handle, x.handle, sizeof(io.handle));
	io.device = x.device < 0 ? 0 : (uint32_t)x.device;
	while (done < len) {
		size_t chunk = len - done;

		if (chunk > TIERFS_GPU_IO_MAX)
			chunk = TIERFS_GPU_IO_MAX;
		io.handle_off = p + done - x.base;
		io.len = chunk;
		io.file_off = (uint64_t)off + done;
		r = ioctl(fd, cmd, &io);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EINVAL && cached && !retried && !done) {
				/* a handle the daemon no longer takes: export
				 * the allocation afresh, once */
				xcache_drop(x.id);
				retried = true;
				goto again;
			}
			return done ? (ssize_t)done : -1;
		}
		if (r == 0)
			break;		/* end of file (read) */
		done += (size_t)r;
	}
	return (ssize_t)done;
}

TIERFS_EXPORT ssize_t tierfs_pwrite_gpu(int fd, const void *dev_ptr,
					size_t len, off_t off)
{
	return gpu_io(fd, (uint64_t)(uintptr_t)dev_ptr, len, off, true);
}

TIERFS_EXPORT ssize_t tierfs_pread_gpu(int fd, void *dev_ptr, size_t len,
				       off_t off)
{
	return gpu_io(fd, (uint64_t)(uintptr_t)dev_ptr, len, off, false);
}

/* ---- vectored calls --------------------------------------------------- */

/* An allocation a vectored call touches (resolved once per call). */
struct valloc {
	struct xent x;
	struct ptr_info pi;
	bool cached;		/* the handle came from the export cache */
	int slot;		/* its index in the batch's handles[], -1 */
};

struct vseg {
	uint64_t p, len, off;
	int a;			/* its struct valloc */
	uint64_t done;		/* bytes moved already (the shared path) */
	bool over;		/* nothing more to move (a read at EOF) */
};

static int off_cmp(const void *a, const void *b)
{
	const struct vseg *x = *(const struct vseg *const *)a;
	const struct vseg *y = *(const struct vseg *const *)b;

	return x->off < y->off ? -1 : x->off > y->off;
}

/* Send one batch; on an EINVAL of a cached handle re-export its
 * allocations once.  Returns the daemon's count (v->moved) or -1 with
 * errno. */
static int64_t vec_send(int fd, bool write, struct tierfs_gpu_vec *v,
			struct valloc *al, int nal, bool *retried)
{
	unsigned long cmd = write ? TIERFS_IOC_PWRITEV_GPU : TIERFS_IOC_PREADV_GPU;
	int r, i;

	for (;;) {
		bool any = false;

		v->moved = 0;
		r = ioctl(fd, cmd, v);
		if (r >= 0)
			return (int64_t)v->moved;
		if (errno == EINTR)
			continue;
		if (errno != EINVAL || *retried)
			return -1;
		/* the checks passed here: a handle the daemon no longer
		 * takes (nothing moved: handles come before any byte) */
		*retried = true;
		for (i = 0; i < nal; i++) {
			struct valloc *x = &al[i];
			bool cached;

			if (x->slot < 0 || !x->cached)
				continue;
			xcache_drop(x->x.id);
			if (resolve(x->x.base, &x->x, &x->pi, &cached, true) < 0)
				return -1;
			x->cached = false;
			memcpy(v->handles[x->slot].handle, x->x.handle,
			       TIERFS_IPC_HANDLE_SIZE);
			any = true;
		}
		if (!any) {
			errno = EINVAL;
			return -1;
		}
	}
}

/*
 * The segments on the shared cache's GPU, in the context of the first of
 * them, through TIERFS_IOC_GPU_SPANV: lists of at most SHARE_SPANV_MAX
 * ranges and TIERFS_GPU_IO_MAX bytes, each placed or found by one ioctl,
 * copied with one wait and ended by one message.  Segments it moves get
 * done/over set; the others (another device or context, longer than one
 * call, not in the GPU tier) are left for the span-by-span loop and the
 * daemon.  Returns 0, 1 when the daemon must copy the rest (not in the GPU
 * tier, the share gone), or -1 with errno on a failure that fails the call.
 */
static int share_iov(struct share *sh, int fd, struct vseg **by_off, int iovcnt,
		     const struct valloc *al, bool write, uint64_t *moved)
{
	struct tierfs_gpu_spanv *sv = malloc(sizeof(*sv));
	struct gpu_xfer *x = malloc(SHARE_SPANV_MAX * sizeof(*x));
	struct vseg *pick[SHARE_SPANV_MAX];
	void *ctx = NULL;
	bool have_ctx = false;
	int i = 0, k, ret = -1;

	if (!sv || !x) {
		errno = ENOMEM;
		goto out;
	}
	while (i < iovcnt) {
		uint64_t total = 0;
		int n = 0, r;
		int64_t res;

		memset(sv, 0, offsetof(struct tierfs_gpu_spanv, r));
		for (; i < iovcnt && n < SHARE_SPANV_MAX; i++) {
			struct vseg *s = by_off[i];
			const struct valloc *a = &al[s->a];

			if (a->x.device != sh->device || s->len > TIERFS_GPU_IO_MAX)
				continue;
			if (have_ctx && a->pi.ctx != ctx)
				continue;
			if (s->len > TIERFS_GPU_IO_MAX - total)
				break;
			ctx = a->pi.ctx;
			have_ctx = true;
			sv->r[n].file_off = s->off;
			sv->r[n].len = s->len;
			pick[n++] = s;
			total += s->len;
		}
		if (!n)
			continue;
		sv->conn_id = sh->conn_id;
		sv->flags = write ? TIERFS_SPAN_WRITE : 0;
		sv->nranges = (uint32_t)n;
		while ((r = ioctl(fd, TIERFS_IOC_GPU_SPANV, sv)) < 0 && errno == EINTR)
			;
		if (r < 0) {
			if (errno == ESTALE)
				share_kill(sh);
			if (errno == EAGAIN || errno == ESTALE || errno == EPERM) {
				ret = 1;	/* the daemon copies the rest */
				goto out;
			}
			goto out;
		}
		if (!sv->token) {		/* a read wholly past end of file */
			for (k = 0; k < n; k++)
				pick[k]->over = true;
			continue;
		}
		if (sv->cache_id != sh->cache_id) {
			share_end(sh, sv->token, false, write, 0);
			share_kill(sh);
			ret = 1;
			goto out;
		}
		for (k = 0; k < n; k++) {
			uint64_t at = sh->va + sv->r[k].cache_off;

			x[k] = (struct gpu_xfer){
				.dst = write ? at : pick[k]->p,
				.src = write ? pick[k]->p : at,
				.len = sv->r[k].n,
				.dir = GPU_D2D,
			};
		}
		r = gpu_share_copyv(sh->device, ctx, x, n);
		total = 0;
		for (k = 0; k < n; k++)
			total += sv->r[k].n;
		res = share_end(sh, sv->token, r == 0, write, total);
		if (r) {
			errno = r == -ENOMEM ? ENOMEM : EIO;
			goto out;
		}
		if (res < 0) {
			errno = (int)-res;
			goto out;
		}
		for (k = 0; k < n; k++) {
			pick[k]->done = sv->r[k].n;
			pick[k]->over = true;	/* all of it, or end of file */
			*moved += sv->r[k].n;
		}
	}
	ret = 0;
out:
	free(x);
	free(sv);
	return ret;
}

/*
 * Step 1 of gpu_iov: check every segment before anything else (length > 0,
 * offsets, the total within SSIZE_MAX), fill sg[] and by_off[] (sorted by
 * file offset) and widen [*lo, *hi) (the caller's starts empty) to the
 * union of the file ranges; a write's ranges must not overlap.  Returns 0,
 * or -1 with errno EINVAL.
 */
static int vec_check(const struct tierfs_gpu_iovec *iov, int iovcnt, bool write,
		     struct vseg *sg, struct vseg **by_off, uint64_t *lo, uint64_t *hi)
{
	uint64_t total = 0;
	int i;

	for (i = 0; i < iovcnt; i++) {
		uint64_t len = iov[i].len;

		if (!len || iov[i].off < 0 || len > SSIZE_MAX || !iov[i].dev_ptr ||
		    len > (uint64_t)INT64_MAX - (uint64_t)iov[i].off ||
		    len > (uint64_t)SSIZE_MAX - total) {
			errno = EINVAL;
			return -1;
		}
		total += len;
		sg[i] = (struct vseg){ (uint64_t)(uintptr_t)iov[i].dev_ptr, len,
				       (uint64_t)iov[i].off, -1, 0, false };
		by_off[i] = &sg[i];
		if (sg[i].off < *lo)
			*lo = sg[i].off;
		if (sg[i].off + len > *hi)
			*hi = sg[i].off + len;
	}
	qsort(by_off, (size_t)iovcnt, sizeof(*by_off), off_cmp);
	for (i = 1; write && i < iovcnt; i++)
		if (by_off[i - 1]->off + by_off[i - 1]->len > by_off[i]->off) {
			errno = EINVAL;		/* file ranges overlap */
			return -1;
		}
	return 0;
}

/*
 * Steps 3 and 4 of gpu_iov: each allocation the segments point into,
 * resolved once into al[] (a segment inside one already seen asks the
 * driver nothing) and named in the segment's a; every range must lie
 * inside its own allocation.  Returns how many allocations al[] holds, or
 * -1 with errno.
 */
static int vec_resolve(struct vseg *sg, int iovcnt, struct valloc *al)
{
	int i, j, nal = 0;

	for (i = 0; i < iovcnt; i++) {
		struct vseg *s = &sg[i];

		for (j = 0; j < nal; j++)
			if (s->p >= al[j].x.base && s->p - al[j].x.base < al[j].x.size)
				break;
		if (j == nal) {
			if (resolve(s->p, &al[nal].x, &al[nal].pi, &al[nal].cached,
				    false) < 0)
				return -1;
			al[nal++].slot = -1;
		}
		s->a = j;
		if (s->len > al[j].x.size - (s->p - al[j].x.base)) {
			errno = EINVAL;	/* the range leaves its allocation */
			return -1;
		}
	}
	return nal;
}

/*
 * Step 5 of gpu_iov: the legacy default stream of each allocation's context
 * (once for a run of allocations of one context), then the kernel's dirty
 * pages over the file range [lo, hi).  Returns 0, or -1 with errno.
 */
static int vec_sync(int fd, const struct valloc *al, int nal, uint64_t lo, uint64_t hi)
{
	void *last_ctx = NULL;
	int j;

	for (j = 0; j < nal; j++)
		if (al[j].pi.ctx != last_ctx) {
			last_ctx = al[j].pi.ctx;
			if (sync_buffer(last_ctx) < 0)
				return -1;
		}
	if (sync_file_range(fd, (off_t)lo, (off_t)(hi - lo),
			    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
			    SYNC_FILE_RANGE_WAIT_AFTER) < 0)
		return -1;
	return 0;
}

/*
 * Step 6 of gpu_iov, through the share sh (the caller holds a reference
 * and puts it): lists of ranges, one span each (share_iov, when the daemon
 * takes them), else segment by segment (share_io) for the segments on the
 * share's GPU.  Each segment's done/over records what moved; *moved adds
 * it up.  Returns 0 (the daemon moves the rest), or -1 with errno.
 */
static int vec_share(struct share *sh, int fd, struct vseg *sg, struct vseg **by_off,
		     int iovcnt, const struct valloc *al, bool write, uint64_t *moved)
{
	int sr = sh->spanv ? share_iov(sh, fd, by_off, iovcnt, al, write, moved) : 0;
	int i;

	if (sr < 0)
		return -1;
	for (i = 0; sr == 0 && i < iovcnt; i++) {
		struct vseg *s = &sg[i];
		size_t done = 0;
		int r;

		if (al[s->a].x.device != sh->device || s->over || s->done)
			continue;
		r = share_io(sh, fd, s->p, al[s->a].pi.ctx, (size_t)s->len,
			     (off_t)s->off, write, &done);
		s->done = done;
		*moved += done;
		if (r < 0)
			return -1;
		if (r > 0)
			s->over = true;	/* all of it, or EOF */
	}
	return 0;
}

/*
 * One batch of step 7 of gpu_iov into v: from by_off[i] on, the pieces the
 * shared cache left, at most TIERFS_GPU_VEC_SEGS of them,
 * TIERFS_GPU_VEC_HANDLES allocations (al[].slot: their place in
 * v->handles[]) and TIERFS_GPU_VEC_MAX bytes (a longer segment is cut; the
 * piece counts as done).  Returns the index the next batch starts from;
 * v->nsegs is 0 when nothing was left.
 */
static int vec_fill(struct tierfs_gpu_vec *v, struct vseg **by_off, int i, int iovcnt,
		    struct valloc *al, int nal)
{
	uint64_t btotal = 0;
	int j;

	memset(v, 0, offsetof(struct tierfs_gpu_vec, segs));
	for (j = 0; j < nal; j++)
		al[j].slot = -1;
	for (; i < iovcnt; i++) {
		struct vseg *s = by_off[i];
		struct valloc *x = &al[s->a];
		struct tierfs_gpu_vec_seg *o;
		uint64_t piece;

		if (s->over || s->done == s->len)
			continue;
		if (v->nsegs == TIERFS_GPU_VEC_SEGS || btotal == TIERFS_GPU_VEC_MAX ||
		    (x->slot < 0 && v->nhandles == TIERFS_GPU_VEC_HANDLES))
			break;
		if (x->slot < 0) {
			x->slot = (int)v->nhandles++;
			memcpy(v->handles[x->slot].handle, x->x.handle,
			       TIERFS_IPC_HANDLE_SIZE);
			v->handles[x->slot].device =
				x->x.device < 0 ? 0 : (uint32_t)x->x.device;
		}
		piece = s->len - s->done;
		if (piece > TIERFS_GPU_VEC_MAX - btotal)
			piece = TIERFS_GPU_VEC_MAX - btotal;
		o = &v->segs[v->nsegs++];
		o->handle_off = s->p + s->done - x->x.base;
		o->len = piece;
		o->file_off = s->off + s->done;
		o->handle = (uint32_t)x->slot;
		o->flags = 0;
		btotal += piece;
		s->done += piece;
		if (s->done < s->len)
			break;	/* the batch is full: the rest next time */
	}
	return i;
}

/*
 * Step 7 of gpu_iov: what the shared cache left, through the daemon, in
 * batches filled in v (vec_fill) and sent by vec_send (a handle the daemon
 * refuses is exported again, once per call).  *moved adds up what moved;
 * when tracing, *tio adds the time spent in the ioctls and *nio counts
 * them.  Returns 0, or -1 with errno.
 */
static int vec_daemon(int fd, bool write, struct tierfs_gpu_vec *v, struct vseg **by_off,
		      int iovcnt, struct valloc *al, int nal, uint64_t *moved, double *tio,
		      int *nio)
{
	bool retried = false, trace = tracing();
	int i = 0;

	while (i < iovcnt) {
		double t0;
		int64_t r;

		i = vec_fill(v, by_off, i, iovcnt, al, nal);
		if (!v->nsegs)
			break;
		t0 = trace ? mono_s() : 0;
		r = vec_send(fd, write, v, al, nal, &retried);
		if (trace) {
			*tio += mono_s() - t0;
			(*nio)++;
		}
		if (r < 0)
			return -1;
		*moved += (uint64_t)r;
	}
	return 0;
}

static ssize_t gpu_iov(int fd, const struct tierfs_gpu_iovec *iov, int iovcnt,
		       bool write)
{
	struct tierfs_gpu_vec *v = NULL;
	struct vseg *sg = NULL, **by_off = NULL;
	struct valloc *al = NULL;
	struct share *sh;
	uint64_t lo = UINT64_MAX, hi = 0, moved = 0;
	bool trace = tracing();
	double t[4] = { trace ? mono_s() : 0 }, tio = 0;
	int nal = 0, ret = -1, saved, nio = 0;
	uint64_t mnt_id;
	dev_t dev;

	if (iovcnt < 1 || iovcnt > TIERFS_GPU_IOV_MAX || !iov) {
		errno = EINVAL;
		return -1;
	}
	sg = calloc((size_t)iovcnt, sizeof(*sg));
	by_off = calloc((size_t)iovcnt, sizeof(*by_off));
	al = calloc((size_t)iovcnt, sizeof(*al));
	if (!sg || !by_off || !al)
		goto out;
	/* 1. every segment, before anything else */
	if (vec_check(iov, iovcnt, write, sg, by_off, &lo, &hi) < 0)
		goto out;
	/* 2. the fd */
	if (check_fd(fd, &dev, &mnt_id) < 0)
		goto out;
	/* 3, 4. each allocation once, and every range inside its own */
	nal = vec_resolve(sg, iovcnt, al);
	if (nal < 0)
		goto out;
	if (trace)
		t[1] = mono_s();
	/* 5. the producers' default streams, the kernel's dirty pages */
	if (vec_sync(fd, al, nal, lo, hi) < 0)
		goto out;

	if (trace)
		t[2] = mono_s();
	/* 6. the shared GPU cache, where it can: lists of ranges (one span
	 * each), else segment by segment */
	sh = share_get(fd, dev, mnt_id);
	if (sh) {
		int sr = vec_share(sh, fd, sg, by_off, iovcnt, al, write, &moved);

		share_put(sh);
		if (sr < 0)
			goto out;
	}

	/* 7. the rest through the daemon: batches of at most
	 * TIERFS_GPU_VEC_SEGS pieces, TIERFS_GPU_VEC_HANDLES allocations and
	 * TIERFS_GPU_VEC_MAX bytes (a longer segment is cut) */
	v = malloc(sizeof(*v));
	if (!v)
		goto out;
	if (vec_daemon(fd, write, v, by_off, iovcnt, al, nal, &moved, &tio, &nio) < 0)
		goto out;
	ret = 0;
out:
	saved = errno;
	if (trace && !ret) {
		t[3] = mono_s();
		fprintf(stderr, "libtierfs: vectored %s of %d segments, %d allocations, %"
			PRIu64 " B: checks and exports %.1f us, syncs %.1f us, shared cache "
			"and batching %.1f us, %d ioctls %.1f us, in all %.1f us\n", write ? "write" : "read",
			iovcnt, nal, moved, (t[1] - t[0]) * 1e6, (t[2] - t[1]) * 1e6,
			(t[3] - t[2] - tio) * 1e6, nio, tio * 1e6, (t[3] - t[0]) * 1e6);
	}
	free(v);
	free(al);
	free(by_off);
	free(sg);
	errno = saved;
	return ret < 0 ? -1 : (ssize_t)moved;
}

TIERFS_EXPORT ssize_t tierfs_pwritev_gpu(int fd, const struct tierfs_gpu_iovec *iov,
					 int iovcnt)
{
	return gpu_iov(fd, iov, iovcnt, true);
}

TIERFS_EXPORT ssize_t tierfs_preadv_gpu(int fd, const struct tierfs_gpu_iovec *iov,
					int iovcnt)
{
	return gpu_iov(fd, iov, iovcnt, false);
}
