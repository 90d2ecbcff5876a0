/*
 * fs_ioctl.c - the GPU zero-copy ioctls (fs/tierfs.h, tierfs-gpu(7)).
 *
 * TIERFS_IOC_PWRITE_GPU / TIERFS_IOC_PREAD_GPU carry a struct tierfs_gpu_io:
 * the CUDA IPC handle of the caller's allocation, the buffer's offset in it,
 * a length and a file offset.  The daemon maps the allocation into its own
 * CUDA context (gpu_tier_ipc_open) and hands the device address to the
 * engine (tfile_write_dev / tfile_read_dev), which moves the bytes device
 * to device into or out of the file's GPU cache copy.  The reply is the
 * byte count.
 *
 * Checks, in this order (the first that fails gives the error):
 *   FUSE_IOCTL_COMPAT (a 32-bit caller)          ENOSYS
 *   cmd other than the two above                 ENOTTY  (a directory too:
 *                                                libfuse answers ENOTTY)
 *   in_bufsz != sizeof(struct tierfs_gpu_io)     EINVAL
 *   not a regular file                           EINVAL
 *   PWRITE on a read-only handle,
 *   PREAD on a write-only handle                 EBADF
 *   no GPU tier in this mount                    ENODEV
 *   flags != 0                                   EINVAL
 *   len == 0                                     returns 0
 *   handle_off + len or file_off + len wraps,
 *   file_off + len > INT64_MAX                   EINVAL
 *   handle not openable                          what gpu_tier_ipc_open says:
 *                                                EINVAL (garbage, exported
 *                                                by the daemon; a freed
 *                                                allocation's handle may
 *                                                still open: see below),
 *                                                EXDEV (other device),
 *                                                ENOMEM, EIO; EBUSY: mapped
 *                                                by another request for 10 s
 *                                                and not cached (all 256
 *                                                cached mappings in use)
 *   handle_off + len > allocation size           EINVAL
 *   then the engine's own errors (ENOSPC, EIO, ...).
 * Kernel caches: a GPU write bypasses the kernel's page cache, so after one
 * the daemon drops the kernel's cached pages of the range and attributes
 * and moves its file size (fs_kernel_written), before replying.  The other
 * way round, data that write(2) left dirty in the kernel's writeback cache has not reached the
 * daemon yet: the caller writes it back first (libtierfs does, with
 * sync_file_range over the range; raw ioctl users must do the same).
 *
 * Vectored: TIERFS_IOC_PWRITEV_GPU / TIERFS_IOC_PREADV_GPU carry a struct
 * tierfs_gpu_vec: up to 128 IPC handles and 192 segments (handle index,
 * offset in it, length, file offset), moved between GPU memory and the one
 * file (vec_ioctl).  Checks, in this order, each before any byte moves:
 *   FUSE_IOCTL_COMPAT, cmd, in_bufsz, regular file, access mode, GPU tier
 *                                                as above
 *   out_bufsz short of the struct                 EINVAL
 *   flags, reserved or reserved2 != 0,
 *   nhandles not 1..128, nsegs not 1..192
 *   (the earlier layouts: 16 or 64, and 256),
 *   a handle's reserved != 0                     EINVAL
 *   a segment: handle >= nhandles, flags != 0,
 *   len == 0, handle_off + len wraps,
 *   file_off + len > INT64_MAX                   EINVAL
 *   a handle no segment uses                     EINVAL
 *   lengths adding up past TIERFS_GPU_VEC_MAX    E2BIG
 *   write: two file ranges overlap               EINVAL  (reads may)
 *   each handle opened once (ipc_get)            its errors, as above
 *   a segment's range past its allocation        EINVAL
 * Then the engine moves the segments in file order under one hold of the
 * file's lock (tfile_writev_dev / tfile_readv_dev): no flush, fsync or
 * truncate runs between them, so no backing version ever holds part of a
 * request (and a daemon killed meanwhile leaves the last committed one).
 * A write that fails part-way may have written the segments before the
 * failure.  After a write the kernel's pages of the union of the ranges
 * are dropped once (fs_kernel_written), whether it failed or not; the size
 * moves only on success.  The reply is the struct with the total in
 * `moved` (a read's segment is short at end of file), so that one call
 * moves a whole state dict: four 1 GiB calls left the GPU idle between
 * them.  The earlier layouts (vec_parse) get the total as the result,
 * at most TIERFS_GPU_IO_MAX (E2BIG past it).
 *
 * A single call moves at most TIERFS_GPU_IO_MAX (1 GiB) bytes, so that the
 * count fits the ioctl's int result: a longer request returns a short
 * count, as write(2) does past its own limit (libtierfs loops).
 *
 * Access: FUSE ioctl requests carry the file handle but not the open flags;
 * open_common() (fs_ops.c) stores the open flags in fi->fh for that
 * (FS_FH_FLAGS), and a handle without them is refused (EBADF).
 *
 * Trust model: an IPC handle is a capability.  Whoever holds its 64 bytes
 * may read and write the whole allocation it names, so the daemon uses it
 * only for the file access the caller already has through its fd, checked
 * as for write()/read(); it does not check that the caller owns the
 * allocation.  Mappings are cached (below): when a client frees an
 * allocation whose mapping is cached, the daemon's mapping keeps that
 * memory alive until the entry is evicted; the same handle keeps working on
 * the old memory meanwhile, a new allocation always comes with a new handle.
 * (Even uncached, the driver may open the handle of a freed allocation: it
 * can keep the memory for reuse; seen with CUDA 13 on an H200.)  Sending
 * such handles is the client's error, and touches only memory that was the
 * client's: libtierfs re-exports a buffer whose allocation changed.
 *
 * Handle cache: at most IPC_CACHE_MAX (256) mappings, keyed by the 64
 * handle bytes, least recently used first out; an entry idle for
 * IPC_IDLE_SEC (60 s) is closed at the next ioctl.  So the daemon keeps at
 * most 256 client allocations alive.  256, not fewer: PyTorch's caching
 * allocator gives each large tensor a cudaMalloc block of its own, and a
 * state dict of 200 such tensors saved through one vectored call every few
 * seconds must find its mappings here (with 64 each save reopened all 200,
 * a few hundred microseconds each).  Entries are reference counted: an
 * entry is closed (gpu_tier_ipc_close) only when no ioctl is using it.  When
 * all 256 are in use at once a mapping is opened for the one call and
 * closed after it.
 * fs_ioctl_shutdown() closes everything at unmount.
 *
 * With -o gpu_share two more commands serve libtierfs (tierfs_share.h,
 * fs_share.c): TIERFS_IOC_GPU_SHARE (where to map the cache from) and
 * TIERFS_IOC_GPU_SPAN (place or find a file range in the GPU cache for
 * the client to copy itself).  The span ioctl makes the same file checks
 * as the others (regular file, access mode, GPU tier, ranges) in the same
 * order; flags other than TIERFS_SPAN_WRITE are EINVAL.
 *
 * Locking: ipc_cache.lock (LR_IPC) protects the table and every entry's
 * refs, last_use and `cached`; it is taken with no other lock held, and
 * nothing is taken under it (gpu_tier_ipc_open/close run outside it).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>

#include "fs.h"

/* Seconds an ioctl waits for a GPU tier that is still being built. */
#define FS_GPU_WAIT_S	30.0
#include "gpu_tier.h"
#include "tierfs.h"
#include "tierfs_share.h"

_Static_assert(TIERFS_IPC_HANDLE_SIZE == GPU_TIER_IPC_HANDLE_SIZE,
	       "IPC handle sizes of tierfs.h and gpu_tier.h");
_Static_assert(TIERFS_GPU_IO_MAX <= INT_MAX, "a count must fit an int");

#define IPC_CACHE_MAX	256	/* cached mappings */
#define IPC_IDLE_SEC	60	/* an unused mapping is closed after this */
#define IPC_BUSY_TRIES	10000	/* 1 ms each: a buffer being mapped by another
				 * request (ipc_get) */

struct ipc_entry {
	uint8_t handle[TIERFS_IPC_HANDLE_SIZE];
	uint64_t hash;		/* handle_hash(handle): compared first */
	uint64_t base;		/* device address of the mapping */
	uint64_t size;		/* allocation size */
	int dev;		/* the GPU it was opened on (its own), -1: the
				 * GPU tier's first (gpu_tier_ipc_open) */
	int refs;		/* ioctls using it */
	bool cached;		/* in the table (else closed at refs 0) */
	time_t last_use;	/* CLOCK_MONOTONIC seconds */
};

static struct {
	pthread_mutex_t lock;
	struct ipc_entry *e[IPC_CACHE_MAX];
	int n;
	time_t expired_at;	/* the last table_expire() pass (seconds) */
	bool shut;		/* fs_ioctl_shutdown() ran: cache nothing */
} ipc_cache = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
};

/* ipc_cache.lock, through the lock-order check (lockorder.h). */
static void ipc_lock(void)
{
	ranked_lock(&ipc_cache.lock, LR_IPC);
}

static void ipc_unlock(void)
{
	ranked_unlock(&ipc_cache.lock, LR_IPC);
}

static void entry_close(struct ipc_entry *ent)
{
	int ret = gpu_tier_ipc_close(ent->dev, ent->base);

	if (ret)
		tlog(LOG_WARNING, "gpu ioctl: closing an IPC mapping: %s",
		     strerror(-ret));
	free(ent);
}

/* Remove table slot i (lock held); the caller closes the entry. */
static struct ipc_entry *table_take(int i)
{
	struct ipc_entry *ent = ipc_cache.e[i];

	ipc_cache.e[i] = ipc_cache.e[--ipc_cache.n];
	ipc_cache.e[ipc_cache.n] = NULL;
	ent->cached = false;
	return ent;
}

/*
 * Detach idle entries (lock held) into out[] (room for IPC_CACHE_MAX);
 * returns how many.  With `need_room`, also the least recently used unused
 * entry when the table is full.
 */
static int table_expire(time_t now, bool need_room, struct ipc_entry **out)
{
	int i, n = 0, lru = -1;

	/* idleness counts in seconds: one pass a second is enough, unless
	 * room is needed (a vectored call looks up to TIERFS_GPU_VEC_HANDLES
	 * at a time) */
	if (!need_room && ipc_cache.expired_at == now)
		return 0;
	ipc_cache.expired_at = now;
	for (i = 0; i < ipc_cache.n;) {
		struct ipc_entry *ent = ipc_cache.e[i];

		if (!ent->refs && now - ent->last_use >= IPC_IDLE_SEC) {
			out[n++] = table_take(i);
			continue;	/* slot i holds another entry now */
		}
		if (!ent->refs && (lru < 0 ||
				   ent->last_use < ipc_cache.e[lru]->last_use))
			lru = i;
		i++;
	}
	if (need_room && ipc_cache.n == IPC_CACHE_MAX && lru >= 0)
		out[n++] = table_take(lru);
	return n;
}

/*
 * ipc_get - the mapping of `handle`, referenced: from the cache, or opened
 * and cached.  Returns 0 or gpu_tier_ipc_open()'s -errno.
 */
/* FNV-1a of a handle's bytes. */
static uint64_t handle_hash(const uint8_t *handle)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (int i = 0; i < TIERFS_IPC_HANDLE_SIZE; i++)
		h = (h ^ handle[i]) * 0x100000001b3ull;
	return h;
}

/* The cached mapping of handle (hash h), referenced, or NULL.
 * ipc_cache.lock held. */
static struct ipc_entry *table_get(const uint8_t *handle, uint64_t h, time_t now)
{
	int i;

	for (i = 0; i < ipc_cache.n; i++) {
		struct ipc_entry *ent = ipc_cache.e[i];

		if (ent->hash == h && !memcmp(ent->handle, handle, TIERFS_IPC_HANDLE_SIZE)) {
			ent->refs++;
			ent->last_use = now;
			return ent;
		}
	}
	return NULL;
}

static int ipc_get(const uint8_t *handle, int dev, struct ipc_entry **out)
{
	struct ipc_entry *dead[IPC_CACHE_MAX], *ent = NULL, *mine;
	time_t now = (time_t)tier_now();
	uint64_t h = handle_hash(handle);
	int i, ndead, ret;

	ipc_lock();
	ent = table_get(handle, h, now);
	ndead = table_expire(now, false, dead);
	ipc_unlock();
	for (i = 0; i < ndead; i++)
		entry_close(dead[i]);
	if (ent) {
		*out = ent;
		return 0;
	}

	/* miss: open outside the lock, then insert unless someone was faster */
	mine = calloc(1, sizeof(*mine));
	if (!mine)
		return -ENOMEM;
	/* a buffer on one of the mount's GPUs is mapped in its own GPU's
	 * context, where its copies then run (they never cross a link to
	 * reach memory of the GPU they run on); any other in the first's */
	mine->dev = engine_gpu_spans(fs.eng, dev) ? dev : -1;
	for (i = 0;; i++) {
		ret = gpu_tier_ipc_open(mine->dev, handle, &mine->base, &mine->size);
		if (ret != -EEXIST)
			break;
		/*
		 * Another ioctl is mapping the same buffer (a client's
		 * threads writing from one allocation at once): the driver
		 * maps a handle once per context.  Its entry is used once it
		 * is in the table; tried again should its open fail.
		 */
		if (i >= IPC_BUSY_TRIES) {
			tlog(LOG_WARNING, "gpu: a client's buffer stays mapped by another "
			     "request (the %d cached mappings all in use?)", IPC_CACHE_MAX);
			free(mine);
			return -EBUSY;
		}
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
		ipc_lock();
		ent = table_get(handle, h, (time_t)tier_now());
		ipc_unlock();
		if (ent) {
			free(mine);
			*out = ent;
			return 0;
		}
	}
	if (ret) {
		free(mine);
		return ret;
	}
	memcpy(mine->handle, handle, TIERFS_IPC_HANDLE_SIZE);
	mine->hash = h;
	mine->refs = 1;
	mine->last_use = now;

	ipc_lock();
	ent = table_get(handle, h, now);
	ndead = 0;
	if (!ent && !ipc_cache.shut) {
		ndead = table_expire(now, true, dead);
		if (ipc_cache.n < IPC_CACHE_MAX) {
			mine->cached = true;
			ipc_cache.e[ipc_cache.n++] = mine;
		}
		/* else: every entry is in use; mine serves this call only */
	}
	ipc_unlock();
	for (i = 0; i < ndead; i++)
		entry_close(dead[i]);
	if (ent) {		/* lost the race: drop our second open */
		entry_close(mine);
		mine = ent;
	}
	*out = mine;
	return 0;
}

static void ipc_put(struct ipc_entry *ent)
{
	bool close_it;

	ipc_lock();
	close_it = --ent->refs == 0 && !ent->cached;
	ipc_unlock();
	if (close_it)
		entry_close(ent);
}

/*
 * fs_ioctl_shutdown - close every cached IPC mapping.  Call once no FUSE
 * request runs any more (after the session loop returned); entries still
 * in use are closed by their last user.  Later ioctls cache nothing.
 */
void fs_ioctl_shutdown(void)
{
	struct ipc_entry *dead[IPC_CACHE_MAX];
	int i, n = 0;

	ipc_lock();
	ipc_cache.shut = true;
	while (ipc_cache.n) {
		struct ipc_entry *ent = table_take(ipc_cache.n - 1);

		if (!ent->refs)
			dead[n++] = ent;
	}
	ipc_unlock();
	for (i = 0; i < n; i++)
		entry_close(dead[i]);
}

/* The checks that need no GPU; 0 or -errno. */
static int check_request(struct fs_inode *in, bool write,
			 const struct fuse_file_info *fi,
			 const struct tierfs_gpu_io *io)
{
	int acc;

	if (!S_ISREG(in->type))
		return -EINVAL;
	if (!(fi->fh & FS_FH_FLAGS))
		return -EBADF;
	acc = (int)(fi->fh & O_ACCMODE);
	if (write ? acc == O_RDONLY : acc == O_WRONLY)
		return -EBADF;
	/* right after mounting, the GPU tier may still be being built */
	if (!engine_wait_gpu(fs.eng, FS_GPU_WAIT_S))
		return -ENODEV;
	if (io->flags != 0)
		return -EINVAL;
	if (io->len == 0)
		return 0;
	if (io->handle_off + io->len < io->handle_off ||
	    io->file_off > (uint64_t)INT64_MAX ||
	    io->len > (uint64_t)INT64_MAX - io->file_off)
		return -EINVAL;
	return 0;
}

/* A segment's file range and its index, for sorting by offset. */
struct vec_range {
	uint64_t off, len;
	uint32_t i;
};

static int range_cmp(const void *a, const void *b)
{
	const struct vec_range *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

/*
 * A vectored request of any layout, as the checks and the copies read it:
 * today's struct tierfs_gpu_vec, or an earlier one (vec_parse).
 */
#define VEC_SEGS_MAX	256	/* the most segments of any layout (the earlier ones') */

struct vec_req {
	uint32_t nhandles, nsegs;
	uint32_t room, seg_room;	/* the handles and segments its layout holds */
	uint64_t max;			/* the most bytes it may move */
	struct tierfs_gpu_vec_handle handles[TIERFS_GPU_VEC_HANDLES];
	struct tierfs_gpu_vec_seg segs[VEC_SEGS_MAX];
};

/*
 * The earlier layouts of struct tierfs_gpu_vec, still taken: no `moved`
 * (the count is the ioctl's result, so at most TIERFS_GPU_IO_MAX bytes a
 * call), room for 16 handles (9360 bytes) or 64 (12816 bytes), and 256
 * segments; their command numbers differ by size and direction.
 */
#define VEC_OLD_HEAD	16
#define VEC_OLD_SIZE(h)	(VEC_OLD_HEAD + (h) * sizeof(struct tierfs_gpu_vec_handle) +	\
			 VEC_SEGS_MAX * sizeof(struct tierfs_gpu_vec_seg))
#define TIERFS_IOC_PWRITEV_GPU16 _IOC(_IOC_WRITE, TIERFS_IOC_MAGIC, 5, VEC_OLD_SIZE(16))
#define TIERFS_IOC_PREADV_GPU16	_IOC(_IOC_WRITE, TIERFS_IOC_MAGIC, 6, VEC_OLD_SIZE(16))
#define TIERFS_IOC_PWRITEV_GPU64 _IOC(_IOC_WRITE, TIERFS_IOC_MAGIC, 5, VEC_OLD_SIZE(64))
#define TIERFS_IOC_PREADV_GPU64	_IOC(_IOC_WRITE, TIERFS_IOC_MAGIC, 6, VEC_OLD_SIZE(64))

/*
 * q = the request at b: today's layout (v, a copy of b, kept for the
 * reply) where old is 0, else the earlier one with room for old handles.
 * -EINVAL for flags or reserved fields that are not 0.
 */
static int vec_parse(struct vec_req *q, const struct tierfs_gpu_vec *v, const uint8_t *b,
		     uint32_t old)
{
	uint32_t head[4];

	if (!old) {
		if (v->flags || v->reserved || v->reserved2)
			return -EINVAL;
		*q = (struct vec_req){ .nhandles = v->nhandles, .nsegs = v->nsegs,
				       .room = TIERFS_GPU_VEC_HANDLES,
				       .seg_room = TIERFS_GPU_VEC_SEGS,
				       .max = TIERFS_GPU_VEC_MAX };
		memcpy(q->handles, v->handles, sizeof(v->handles));
		memcpy(q->segs, v->segs, sizeof(v->segs));
		return 0;
	}
	memcpy(head, b, sizeof(head));		/* nhandles, nsegs, flags, reserved */
	if (head[2] || head[3])
		return -EINVAL;
	*q = (struct vec_req){ .nhandles = head[0], .nsegs = head[1], .room = old,
			       .seg_room = VEC_SEGS_MAX, .max = TIERFS_GPU_IO_MAX };
	memcpy(q->handles, b + VEC_OLD_HEAD, old * sizeof(q->handles[0]));
	memcpy(q->segs, b + VEC_OLD_HEAD + old * sizeof(q->handles[0]), sizeof(q->segs));
	return 0;
}

/*
 * The checks of a vectored request that need no GPU (see the table at the
 * top), in order; 0 or -errno.  Fills r[] with the segments'
 * ranges sorted by file offset.
 */
static int vec_check(const struct vec_req *q, bool write, struct vec_range *r)
{
	bool used[TIERFS_GPU_VEC_HANDLES] = { false }, big = false;
	uint64_t total = 0;
	uint32_t i;

	if (!q->nhandles || q->nhandles > q->room || !q->nsegs || q->nsegs > q->seg_room)
		return -EINVAL;
	for (i = 0; i < q->nhandles; i++)
		if (q->handles[i].reserved)
			return -EINVAL;
	for (i = 0; i < q->nsegs; i++) {
		const struct tierfs_gpu_vec_seg *sg = &q->segs[i];

		if (sg->handle >= q->nhandles || sg->flags || !sg->len ||
		    sg->handle_off + sg->len < sg->handle_off ||
		    sg->file_off > (uint64_t)INT64_MAX ||
		    sg->len > (uint64_t)INT64_MAX - sg->file_off)
			return -EINVAL;
		used[sg->handle] = true;
		if (sg->len > q->max - total)
			big = true;
		else
			total += sg->len;
		r[i] = (struct vec_range){ sg->file_off, sg->len, i };
	}
	for (i = 0; i < q->nhandles; i++)
		if (!used[i])
			return -EINVAL;
	if (big)
		return -E2BIG;
	qsort(r, q->nsegs, sizeof(*r), range_cmp);
	for (i = 1; write && i < q->nsegs; i++)
		if (r[i - 1].off + r[i - 1].len > r[i].off)
			return -EINVAL;
	return 0;
}

/* TIERFS_IOC_PWRITEV_GPU / TIERFS_IOC_PREADV_GPU; old: the room for
 * handles of an earlier layout (the count in the result), or 0. */
static void vec_ioctl(fuse_req_t req, fuse_ino_t ino, struct fs_inode *in, bool write,
		      const struct fuse_file_info *fi, const void *in_buf,
		      size_t in_bufsz, size_t out_bufsz, uint32_t old)
{
	struct ipc_entry *ent[TIERFS_GPU_VEC_HANDLES] = { NULL };
	struct tierfs_gpu_io io = { 0 };
	struct {
		struct tierfs_gpu_vec v;	/* today's layout: the reply */
		struct vec_req q;
		struct vec_range r[VEC_SEGS_MAX];
		struct tdev_seg d[VEC_SEGS_MAX];
	} *w = NULL;
	uint64_t before = 0, lo = UINT64_MAX, hi = 0, last_src = 0;
	struct timespec mtime;
	ssize_t n = 0;
	uint32_t i, nh = 0;
	int err;

	if (in_bufsz != (old ? VEC_OLD_SIZE(old) : sizeof(w->v)) || !in_buf ||
	    (!old && out_bufsz < sizeof(w->v))) {
		err = -EINVAL;
		goto reply;
	}
	err = check_request(in, write, fi, &io);	/* file, access, GPU tier */
	if (err)
		goto reply;
	w = malloc(sizeof(*w));
	if (!w) {
		err = -ENOMEM;
		goto reply;
	}
	if (!old)
		memcpy(&w->v, in_buf, sizeof(w->v));	/* in_buf need not be aligned */
	err = vec_parse(&w->q, &w->v, in_buf, old);
	if (!err)
		err = vec_check(&w->q, write, w->r);
	if (err)
		goto reply;
	/* each allocation once, however many segments it holds */
	for (nh = 0; nh < w->q.nhandles; nh++) {
		uint32_t dev = w->q.handles[nh].device;

		err = ipc_get(w->q.handles[nh].handle, (int)(dev < 64 ? dev : 64),
			       &ent[nh]);
		if (err) {
			tlog(LOG_INFO, "gpu ioctl: IPC handle %" PRIu32 " of a vector "
			     "refused: %s", nh, strerror(-err));
			goto reply;
		}
	}
	for (i = 0; i < w->q.nsegs; i++) {
		const struct tierfs_gpu_vec_seg *sg = &w->q.segs[w->r[i].i];
		const struct ipc_entry *e = ent[sg->handle];

		if (sg->handle_off > e->size || sg->len > e->size - sg->handle_off) {
			tlog(LOG_INFO, "gpu ioctl: segment %" PRIu32 ": range %" PRIu64
			     "+%" PRIu64 " outside the %" PRIu64 "-byte allocation",
			     w->r[i].i, sg->handle_off, sg->len, e->size);
			err = -EINVAL;
			goto reply;
		}
		w->d[i] = (struct tdev_seg){ .dptr = e->base + sg->handle_off,
					     .dev = e->dev, .len = sg->len,
					     .off = sg->file_off };
		if (sg->file_off < lo)
			lo = sg->file_off;
		if (sg->file_off + sg->len > hi) {
			hi = sg->file_off + sg->len;
			last_src = w->d[i].dptr + sg->len - 1;
		}
	}
	if (write) {
		tfile_attr(&in->tf, &before, &mtime);
		n = tfile_writev_dev(&in->tf, w->d, (int)w->q.nsegs);
		if (n == -ENOSPC && fs_fd_frees_wait())	/* space a removal frees */
			n = tfile_writev_dev(&in->tf, w->d, (int)w->q.nsegs);
		/* after a failure some segments may be written: the kernel
		 * drops its pages of them all the same (its size stays) */
		fs_kernel_written(ino, last_src, lo, hi - lo, n > 0 ? before : UINT64_MAX);
	} else {
		n = tfile_readv_dev(&in->tf, w->d, (int)w->q.nsegs);
	}
	if (n < 0)
		err = (int)n;
reply:
	for (i = 0; i < nh; i++)
		ipc_put(ent[i]);
	if (tierfs_log_level >= LOG_DEBUG)
		tlog(LOG_DEBUG, "gpu ioctl: vectored %s of %zu-byte request: %s",
		     write ? "write" : "read", in_bufsz, err ? strerror(-err) : "done");
	if (err) {
		fuse_reply_err(req, -err);
	} else if (old) {
		fuse_reply_ioctl(req, (int)n, NULL, 0);
	} else {
		w->v.moved = (uint64_t)n;
		fuse_reply_ioctl(req, 0, &w->v, sizeof(w->v));
	}
	free(w);
}

/* The checks of a TIERFS_IOC_GPU_SPANV request past check_request(). */
static int spanv_check(const struct tierfs_gpu_spanv *sv, bool write)
{
	uint64_t total = 0;
	uint32_t i;

	if ((sv->flags & ~TIERFS_SPAN_WRITE) || !sv->nranges ||
	    sv->nranges > SHARE_SPANV_MAX)
		return -EINVAL;
	for (i = 0; i < sv->nranges; i++) {
		const struct tierfs_gpu_spanv_range *r = &sv->r[i];

		if (!r->len || r->file_off > (uint64_t)INT64_MAX ||
		    r->len > (uint64_t)INT64_MAX - r->file_off)
			return -EINVAL;
		if (write && i && r->file_off < sv->r[i - 1].file_off + sv->r[i - 1].len)
			return -EINVAL;	/* a write's ranges: sorted, apart */
		if (r->len > TIERFS_GPU_IO_MAX - total)
			return -E2BIG;
		total += r->len;
	}
	return 0;
}

/* TIERFS_IOC_GPU_SPANV (fs_share.c): a span over a list of ranges. */
static void spanv_ioctl(fuse_req_t req, struct fs_inode *in, struct fuse_file_info *fi,
			const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
	struct tierfs_gpu_io io = { 0 };
	struct share_poll poll = { 0 };
	struct tierfs_gpu_spanv *sv;
	bool write;
	int err;

	if (in_bufsz != sizeof(*sv) || !in_buf || out_bufsz < sizeof(*sv)) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	sv = malloc(sizeof(*sv));
	if (!sv) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	memcpy(sv, in_buf, sizeof(*sv));
	write = sv->flags & TIERFS_SPAN_WRITE;
	err = check_request(in, write, fi, &io);	/* file, access, GPU tier */
	if (!err)
		err = spanv_check(sv, write);
	if (!err)
		err = fs_share_beginv(fuse_req_ctx(req)->uid, in, sv, &poll);
	if (err) {
		fuse_reply_err(req, -err);
	} else {
		fuse_reply_ioctl(req, 0, sv, sizeof(*sv));
		fs_share_poll(&poll);	/* the span's end, soon after */
	}
	free(sv);
}

/* TIERFS_IOC_GPU_SHARE and TIERFS_IOC_GPU_SPAN (fs_share.c). */
static void share_ioctl(fuse_req_t req, struct fs_inode *in, unsigned int cmd,
			struct fuse_file_info *fi, const void *in_buf,
			size_t in_bufsz, size_t out_bufsz)
{
	uid_t uid = fuse_req_ctx(req)->uid;
	struct tierfs_gpu_io io = { 0 };
	struct tierfs_gpu_span sp;
	struct tierfs_gpu_share sh;
	struct share_poll poll = { 0 };
	bool write;
	int err;

	if (cmd == TIERFS_IOC_GPU_SHARE) {
		if (out_bufsz < sizeof(sh)) {
			fuse_reply_err(req, EINVAL);
			return;
		}
		err = !S_ISREG(in->type) ? -EINVAL : fs_share_info(uid, &sh);
		if (err)
			fuse_reply_err(req, -err);
		else
			fuse_reply_ioctl(req, 0, &sh, sizeof(sh));
		return;
	}
	if (in_bufsz != sizeof(sp) || !in_buf || out_bufsz < sizeof(sp)) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	memcpy(&sp, in_buf, sizeof(sp));
	write = sp.flags & TIERFS_SPAN_WRITE;
	io.len = sp.len;
	io.file_off = sp.file_off;
	err = check_request(in, write, fi, &io);
	if (!err && (sp.flags & ~TIERFS_SPAN_WRITE))
		err = -EINVAL;
	if (!err) {
		if (sp.len > TIERFS_GPU_IO_MAX)
			sp.len = TIERFS_GPU_IO_MAX;
		err = fs_share_begin(uid, in, &sp, &poll);
	}
	if (err) {
		fuse_reply_err(req, -err);
	} else {
		fuse_reply_ioctl(req, 0, &sp, sizeof(sp));
		fs_share_poll(&poll);	/* the span's end, soon after */
	}
}

/* TIERFS_IOC_PWRITE_GPU / TIERFS_IOC_PREAD_GPU: one range of a client's
 * GPU buffer (an IPC handle) to or from the file, device to device. */
static void one_ioctl(fuse_req_t req, fuse_ino_t ino, struct fs_inode *in, bool write,
		      struct fuse_file_info *fi, const void *in_buf, size_t in_bufsz)
{
	struct tierfs_gpu_io io;
	struct ipc_entry *ent;
	struct timespec mtime;
	uint64_t len, before = 0;
	ssize_t n;
	bool trace = tierfs_log_level >= LOG_DEBUG;
	double t[3] = { 0 };
	int err;

	if (in_bufsz != sizeof(io) || !in_buf) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if (trace)
		t[0] = tier_now();
	memcpy(&io, in_buf, sizeof(io));	/* in_buf need not be aligned */
	err = check_request(in, write, fi, &io);
	if (err || io.len == 0) {
		if (err)
			fuse_reply_err(req, -err);
		else
			fuse_reply_ioctl(req, 0, NULL, 0);
		return;
	}

	err = ipc_get(io.handle, (int)(io.device < 64 ? io.device : 64), &ent);
	if (err) {
		tlog(LOG_INFO, "gpu ioctl: IPC handle refused: %s",
		     strerror(-err));
		fuse_reply_err(req, -err);
		return;
	}
	if (io.handle_off > ent->size || io.len > ent->size - io.handle_off) {
		tlog(LOG_INFO, "gpu ioctl: range %" PRIu64 "+%" PRIu64
		     " outside the %" PRIu64 "-byte allocation",
		     io.handle_off, io.len, ent->size);
		ipc_put(ent);
		fuse_reply_err(req, EINVAL);
		return;
	}
	len = io.len < TIERFS_GPU_IO_MAX ? io.len : TIERFS_GPU_IO_MAX;
	if (trace)
		t[1] = tier_now();
	if (write) {
		tfile_attr(&in->tf, &before, &mtime);
		n = tfile_write_dev(&in->tf, ent->base + io.handle_off, ent->dev,
				    (size_t)len, (off_t)io.file_off);
		if (n == -ENOSPC && fs_fd_frees_wait())	/* space a removal frees */
			n = tfile_write_dev(&in->tf, ent->base + io.handle_off, ent->dev,
					    (size_t)len, (off_t)io.file_off);
		if (trace)
			t[2] = tier_now();
		if (n > 0)
			fs_kernel_written(ino, ent->base + io.handle_off + (uint64_t)n - 1,
					  io.file_off, (uint64_t)n, before);
	} else {
		n = tfile_read_dev(&in->tf, ent->base + io.handle_off, ent->dev,
				   (size_t)len, (off_t)io.file_off);
		if (trace)
			t[2] = tier_now();
	}
	ipc_put(ent);
	if (trace)
		tlog(LOG_DEBUG, "gpu ioctl %s of %" PRIu64 " B: checks+handle %.0f us, "
		     "data %.0f us, kernel notify %.0f us", write ? "write" : "read", len,
		     (t[1] - t[0]) * 1e6, (t[2] - t[1]) * 1e6, (tier_now() - t[2]) * 1e6);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_ioctl(req, (int)n, NULL, 0);
}

void fs_ll_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
		 struct fuse_file_info *fi, unsigned flags, const void *in_buf,
		 size_t in_bufsz, size_t out_bufsz)
{
	struct fs_inode *in = fs_inode_of(ino);
	bool write;

	(void)arg;
	(void)out_bufsz;
	if (flags & FUSE_IOCTL_COMPAT) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	if (cmd == TIERFS_IOC_PWRITE_GPU) {
		write = true;
	} else if (cmd == TIERFS_IOC_PREAD_GPU) {
		write = false;
	} else if (cmd == TIERFS_IOC_PWRITEV_GPU || cmd == TIERFS_IOC_PREADV_GPU) {
		vec_ioctl(req, ino, in, cmd == TIERFS_IOC_PWRITEV_GPU, fi, in_buf,
			  in_bufsz, out_bufsz, 0);
		return;
	} else if (cmd == TIERFS_IOC_PWRITEV_GPU64 || cmd == TIERFS_IOC_PREADV_GPU64) {
		vec_ioctl(req, ino, in, cmd == TIERFS_IOC_PWRITEV_GPU64, fi, in_buf,
			  in_bufsz, out_bufsz, 64);
		return;
	} else if (cmd == TIERFS_IOC_PWRITEV_GPU16 || cmd == TIERFS_IOC_PREADV_GPU16) {
		vec_ioctl(req, ino, in, cmd == TIERFS_IOC_PWRITEV_GPU16, fi, in_buf,
			  in_bufsz, out_bufsz, 16);
		return;
	} else if (cmd == TIERFS_IOC_GPU_SHARE || cmd == TIERFS_IOC_GPU_SPAN) {
		share_ioctl(req, in, cmd, fi, in_buf, in_bufsz, out_bufsz);
		return;
	} else if (cmd == TIERFS_IOC_GPU_SPANV) {
		spanv_ioctl(req, in, fi, in_buf, in_bufsz, out_bufsz);
		return;
	} else {
		fuse_reply_err(req, ENOTTY);
		return;
	}
	one_ioctl(req, ino, in, write, fi, in_buf, in_bufsz);
}
