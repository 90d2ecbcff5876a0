/*
 * gpu_tier.c - the GPU cache tier over a VMM reservation, and pinning of
 * the host cache (hipc22 §IV).  See gpu_tier.h for the contract.
 *
 * The cache: struct gpu_tier embeds its struct cache, so the copy
 * functions find the tier (and its VMM range) from the cache pointer they
 * are given, and c->priv stays the engine's.  Each copy is checked against
 * what is mapped before it reaches the driver: a copy into unmapped device
 * addresses would be an illegal access, which poisons the whole CUDA
 * context, so a bad offset must fail here with -EFAULT instead.
 *
 * Mapping: gpu/ maps the range in the background.  A watcher thread waits
 * for its end (gpu_vmm_wait) and records it, so that gpu_tier_fully_mapped()
 * also becomes true when the mapper gave up early (the device ran out of
 * memory): eviction may then run over the smaller cache.  The watcher must
 * be joined before gpu_vmm_destroy() frees what it waits on, so destroying
 * a tier whose mapping still runs waits for the mapping to end.
 *
 * Only gpu/gpu.h is used: with the no-CUDA stub gpu_init() fails and so
 * does gpu_tier_create(), with -ENODEV.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "clock.h"
#include "gpu.h"
#include "gpu_tier.h"
#include "dedup.h"
#include "json.h"

_Static_assert(GPU_TIER_MAX_DEVICES == GPU_MAX_DEVICES, "one limit of GPUs per cache");
_Static_assert(GPU_TIER_IPC_HANDLE_SIZE == GPU_IPC_HANDLE_SIZE, "one IPC handle size");

#define MiB(x)	((unsigned long long)((x) >> 20))

struct gpu_tier {
	struct cache cache;		/* first: the copy functions' handle */
	struct gpu_vmm *vmm;		/* the reservation */
	uint64_t dbase;			/* its device address */
	int dev;			/* device ordinal */
	char name[128];			/* device name */
	double t0;			/* creation time, for the log */
	pthread_t watcher;		/* waits for the mapper to end */
	bool watcher_started;
	bool mapping_done;		/* atomic: the mapper has ended */
	int mapping_err;		/* its result; valid once mapping_done */
	int oob_logged;			/* atomic: an out-of-range copy was logged */
	struct gpu_links links;		/* probed at creation (several GPUs) */
};

static struct gpu_tier *tier_of(struct cache *c)
{
	return (struct gpu_tier *)((char *)c - offsetof(struct gpu_tier, cache));
}

/* ---- copy functions --------------------------------------------------- */

/*
 * Is [off, off + len) inside the mapped part of the range?  Logs the first
 * offender (a bug in the caller: the table only places below usable).
 */
static bool range_ok(struct gpu_tier *g, const char *what, uint64_t off,
		     size_t len)
{
	uint64_t mapped = gpu_vmm_mapped(g->vmm);

	if (off <= mapped && len <= mapped - off)
		return true;
	if (!__atomic_exchange_n(&g->oob_logged, 1, __ATOMIC_RELAXED))
		tlog(LOG_ERR, "gpu cache: %s of %zu bytes at offset %" PRIu64
		     " outside the %" PRIu64 " mapped bytes: refused", what,
		     len, off, mapped);
	return false;
}

/*
 * Bytes from cache offset off to the end of the part (the GPU's memory)
 * it lies in: copies are issued per part, because one copy whose range
 * spans the memory of two GPUs runs at a fraction of either link's speed
 * (measured on two H200: 1 GiB across GPU 0's and GPU 1's parts in one
 * cuMemcpyDtoDAsync took 12.3 ms, the same bytes wholly on GPU 1 3.1 ms).
 */
static uint64_t part_left(struct gpu_tier *g, uint64_t off)
{
	unsigned i = gpu_tier_part_at(g, off);

	return i < gpu_vmm_ndevices(g->vmm) ? gpu_vmm_part_end(g->vmm, i) - off : UINT64_MAX;
}

/* The next piece of a copy at cache offset off with `left` bytes to go. */
static uint64_t piece(struct gpu_tier *g, uint64_t off, uint64_t left)
{
	uint64_t n = part_left(g, off);

	return left < n ? left : n;
}

static int gpu_tier_write(struct cache *c, uint64_t off, const void *src,
			  size_t len)
{
	struct gpu_tier *g = tier_of(c);
	int ret = 0;

	if (!range_ok(g, "write", off, len))
		return -EFAULT;
	for (size_t at = 0, n; !ret && at < len; at += n) {
		n = piece(g, off + at, len - at);
		ret = gpu_copy_htod(g->dbase + off + at, (const char *)src + at, n);
	}
	return ret;
}

static int gpu_tier_read(struct cache *c, uint64_t off, void *dst, size_t len)
{
	struct gpu_tier *g = tier_of(c);
	int ret = 0;

	if (!range_ok(g, "read", off, len))
		return -EFAULT;
	for (size_t at = 0, n; !ret && at < len; at += n) {
		n = piece(g, off + at, len - at);
		ret = gpu_copy_dtoh((char *)dst + at, g->dbase + off + at, n);
	}
	return ret;
}

static int gpu_tier_move(struct cache *c, uint64_t dst, uint64_t src,
			 size_t len)
{
	struct gpu_tier *g = tier_of(c);
	int ret = 0;

	if (!len || dst == src)
		return 0;
	if (!range_ok(g, "move", dst, len) || !range_ok(g, "move", src, len))
		return -EFAULT;
	if (dst < src + len && src < dst + len)	/* overlapping: memmove order */
		return gpu_copy_dtod(g->dbase + dst, g->dbase + src, len);
	for (size_t at = 0, n; !ret && at < len; at += n) {
		n = piece(g, src + at, piece(g, dst + at, len - at));
		ret = gpu_copy_dtod(g->dbase + dst + at, g->dbase + src + at, n);
	}
	return ret;
}

int gpu_tier_copy_dev(struct gpu_tier *g, int dev, uint64_t off, uint64_t dptr,
		      uint64_t len, bool into_cache)
{
	struct tier_dxfer x = { .dev = dev, .off = off, .dptr = dptr, .len = len };

	return gpu_tier_copy_devv(g, &x, 1, into_cache, false);
}

int gpu_tier_copy_devv(struct gpu_tier *g, const struct tier_dxfer *x, int n,
		       bool into_cache, bool host)
{
	struct gpu_xfer *q;
	int ret = 0, i = 0, k, cap = 0;

	for (k = 0; k < n; k++) {
		if (!host && !range_ok(g, into_cache ? "device write" : "device read",
				       x[k].off, x[k].len))
			return -EFAULT;
		cap += host ? 1 : (int)gpu_vmm_ndevices(g->vmm) + 1;
	}
	q = malloc((size_t)(cap ? cap : 1) * sizeof(*q));
	if (!q)
		return -ENOMEM;
	while (!ret && i < n) {
		int dev = x[i].dev, nq = 0;

		for (; i < n && x[i].dev == dev; i++) {
			for (uint64_t at = 0, m; at < x[i].len; at += m) {
				uint64_t c = host ? x[i].off + at : g->dbase + x[i].off + at;
				uint64_t d = x[i].dptr + at;

				m = host ? x[i].len : piece(g, x[i].off + at, x[i].len - at);
				q[nq++] = (struct gpu_xfer){
					.dst = into_cache ? c : d,
					.src = into_cache ? d : c,
					.len = m,
					.dir = !host ? GPU_D2D : into_cache ? GPU_D2H : GPU_H2D,
				};
			}
		}
		ret = gpu_copy_batch_on(dev, q, nq);
	}
	free(q);
	return ret;
}

/* Chunk hashes on the GPU (gpu_hash_chunks: canonical, big-endian high
 * half first), turned into { low, high } pairs. */
static int gpu_tier_hash(struct cache *c, uint64_t off, uint64_t len, uint64_t chunk,
			 uint64_t (*out)[2])
{
	struct gpu_tier *g = tier_of(c);
	uint64_t n = (len + chunk - 1) / chunk;
	int ret;

	if (!len)
		return 0;
	if (!range_ok(g, "hash", off, len))
		return -EFAULT;
	/* out has 16 bytes per chunk: the canonical form first, in place */
	ret = gpu_hash_chunks(g->dbase + off, len, chunk, (uint8_t (*)[16])out);
	for (uint64_t i = 0; !ret && i < n; i++) {
		const uint8_t *b = (const uint8_t *)out[i];
		uint64_t hi = 0, lo = 0;

		for (int k = 0; k < 8; k++) {
			hi = hi << 8 | b[k];
			lo = lo << 8 | b[8 + k];
		}
		out[i][0] = lo;
		out[i][1] = hi;
	}
	return ret;
}

/* The ranges of a copy at cache offset off to host dst (at the ranges'
 * own offsets), in pieces that do not cross from one GPU's part to the
 * next, all queued on the device-to-host stream before one wait. */
static int gpu_tier_read_ranges(struct cache *c, uint64_t off, const struct drange *r,
				uint32_t n, void *dst)
{
	struct gpu_tier *g = tier_of(c);
	size_t cap = (size_t)n + gpu_vmm_ndevices(g->vmm), nq = 0;
	struct gpu_xfer *q;
	int ret;

	for (uint32_t i = 0; i < n; i++)
		if (r[i].end < r[i].start || !range_ok(g, "read", off + r[i].start,
							 r[i].end - r[i].start))
			return -EFAULT;
	q = malloc((cap ? cap : 1) * sizeof(*q));
	if (!q)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		for (uint64_t at = r[i].start, m; at < r[i].end; at += m) {
			m = piece(g, off + at, r[i].end - at);
			if (nq == cap) {
				struct gpu_xfer *nqp = realloc(q, 2 * cap * sizeof(*q));

				if (!nqp) {
					free(q);
					return -ENOMEM;
				}
				q = nqp;
				cap *= 2;
			}
			q[nq++] = (struct gpu_xfer){ .dst = (uint64_t)(uintptr_t)((char *)dst + at),
						     .src = g->dbase + off + at, .len = m,
						     .dir = GPU_D2H };
		}
	}
	ret = nq > INT_MAX ? -E2BIG : gpu_copy_dtoh_batch(q, (int)nq);
	free(q);
	return ret;
}

static const struct tier_ops gpu_tier_ops = {
	.write = gpu_tier_write,
	.read = gpu_tier_read,
	.move = gpu_tier_move,
	.hash = gpu_tier_hash,
	.read_ranges = gpu_tier_read_ranges,
};

/* ---- mapping ---------------------------------------------------------- */

static void *watcher_main(void *arg)
{
	struct gpu_tier *g = arg;
	int ret = gpu_vmm_wait(g->vmm);
	uint64_t mapped = gpu_vmm_mapped(g->vmm);

	g->mapping_err = ret;
	__atomic_store_n(&g->mapping_done, true, __ATOMIC_RELEASE);
	if (!ret)
		tlog(LOG_INFO, "gpu cache: %llu MiB mapped in %.2f s",
		     MiB(mapped), tier_now() - g->t0);
	else if (ret != -ECANCELED)
		tlog(LOG_WARNING, "gpu cache: mapping stopped at %llu of %llu "
		     "MiB (%s): the GPU cache stays that size", MiB(mapped),
		     MiB(g->cache.size), strerror(-ret));
	return NULL;
}

uint64_t gpu_tier_default_size(uint64_t free_b)
{
	uint64_t size;

	if (free_b <= GPU_TIER_RESERVE)
		return 0;
	size = free_b / 2;
	if (size > free_b - GPU_TIER_RESERVE)
		size = free_b - GPU_TIER_RESERVE;
	size -= size % GPU_TIER_STEP;
	return size;
}

/* The size of device dev's part: size, or its default; cut to what it has
 * room for.  0 with a sentence in msg when it has too little. */
static uint64_t part_size(int dev, uint64_t size, char *name, size_t namelen,
			  uint64_t *free_out, uint64_t *total_out, char *msg, size_t msglen,
			  int *err)
{
	uint64_t free_b = 0, total_b = 0, room;
	int ret;

	ret = gpu_dev_mem_info(dev, &free_b, &total_b, name, namelen);
	if (ret) {
		if (msg && msglen)
			snprintf(msg, msglen, "GPU %d: no memory information: %s",
				 dev, strerror(-ret));
		*err = ret;
		return 0;
	}
	*free_out = free_b;
	*total_out = total_b;
	room = free_b > GPU_TIER_RESERVE ? free_b - GPU_TIER_RESERVE : 0;
	if (!size) {
		size = gpu_tier_default_size(free_b);
		if (!size) {
			if (msg && msglen)
				snprintf(msg, msglen, "GPU %d (%s): only %llu MiB "
					 "free, too little for a GPU cache", dev,
					 name, MiB(free_b));
			*err = -ENOMEM;
			return 0;
		}
	} else if (size > room) {
		if (room < TIER_ALIGN) {
			if (msg && msglen)
				snprintf(msg, msglen, "GPU %d (%s): only %llu MiB "
					 "free, too little for a GPU cache", dev,
					 name, MiB(free_b));
			*err = -ENOMEM;
			return 0;
		}
		tlog(LOG_WARNING, "gpu cache: %llu MiB asked for, GPU %d has "
		     "%llu MiB free: using %llu MiB", MiB(size), dev,
		     MiB(free_b), MiB(room));
		size = room;
	}
	return size;
}

/* ---- link bandwidths (several GPUs) ----------------------------------- */

#define PROBE_BYTES	(16ull << 20)
#define PROBE_REPS	3

/* Median of PROBE_REPS timed runs of one copy, as bytes/s (0: it failed). */
static double probe_one(int on, uint64_t dst, uint64_t src, void *host, bool to_host)
{
	double t[PROBE_REPS], x;

	for (int r = 0; r < PROBE_REPS; r++) {
		double t0 = tier_now();
		int ret = to_host ? gpu_copy_dtoh(host, src, PROBE_BYTES) :
				    gpu_copy_dtod_on(on, dst, src, PROBE_BYTES);

		if (ret)
			return 0;
		t[r] = tier_now() - t0;
	}
	for (int i = 1; i < PROBE_REPS; i++)	/* sort: 3 values */
		for (int j = i; j > 0 && t[j] < t[j - 1]; j--)
			x = t[j], t[j] = t[j - 1], t[j - 1] = x;
	return t[PROBE_REPS / 2] > 0 ? PROBE_BYTES / t[PROBE_REPS / 2] : 0;
}

/*
 * Measure the links between the devices of a cache over several GPUs (the
 * balance schedules' input): a scratch range with a part on each device
 * (PROBE_BYTES twice), each copy issued on its source device, median of
 * PROBE_REPS after a warm-up.  Host links: device to a pinned host buffer,
 * issued on the first device (the cascade's copies are).  What fails to
 * measure is left 0 (no such link for the schedules); *l->probed says
 * whether anything was measured.
 */
static void probe_links(const int *devs, unsigned n, struct gpu_links *l)
{
	uint64_t sizes[GPU_MAX_DEVICES];
	struct gpu_vmm *v = NULL;
	void *host = NULL;
	bool pinned = false;
	double t0 = tier_now();

	memset(l, 0, sizeof(*l));
	l->n = n;
	for (unsigned i = 0; i < n; i++)
		sizes[i] = 2 * PROBE_BYTES;
	if (gpu_vmm_create_multi(&v, devs, sizes, n, false) || gpu_vmm_wait(v)) {
		tlog(LOG_WARNING, "gpu cache: the links between the GPUs could not be "
		     "measured (no scratch memory): peers are not used for overflow");
		goto out;
	}
	if (posix_memalign(&host, 4096, PROBE_BYTES) == 0) {
		memset(host, 0, PROBE_BYTES);
		pinned = gpu_host_register(host, PROBE_BYTES) == 0;
	}
	for (unsigned i = 0; i < n; i++) {
		uint64_t a = gpu_vmm_base(v) + (i ? gpu_vmm_part_end(v, i - 1) : 0);

		for (unsigned j = 0; j < n; j++) {
			uint64_t b = gpu_vmm_base(v) + (j ? gpu_vmm_part_end(v, j - 1) : 0);

			if (i == j)
				b += PROBE_BYTES;
			probe_one(devs[i], b, a, NULL, false);	/* warm-up */
			if (i == j)
				l->local[i] = probe_one(devs[i], b, a, NULL, false);
			else
				l->peer[i][j] = probe_one(devs[i], b, a, NULL, false);
		}
		if (host && pinned)
			l->host[i] = probe_one(-1, 0, a, host, true);
	}
	l->probed = true;
	tlog(LOG_INFO, "gpu cache: links measured in %.0f ms (GPU %d: local %.0f GB/s, "
	     "to GPU %d %.0f GB/s, to host %.1f GB/s)", (tier_now() - t0) * 1e3, devs[0],
	     l->local[0] / 1e9, devs[1], l->peer[0][1] / 1e9, l->host[0] / 1e9);
out:
	if (pinned)
		gpu_host_unregister(host);
	free(host);
	if (v)
		gpu_vmm_destroy(v);
}

const struct gpu_links *gpu_tier_links(struct gpu_tier *g)
{
	return &g->links;
}

int gpu_tier_part_of(struct gpu_tier *g, int ordinal)
{
	unsigned nd = gpu_vmm_ndevices(g->vmm);

	for (unsigned i = 0; i < nd; i++)
		if (gpu_vmm_device(g->vmm, i) == ordinal)
			return (int)i;
	return -1;
}

void gpu_tier_part_range(struct gpu_tier *g, unsigned i, uint64_t *lo, uint64_t *hi)
{
	*lo = i ? gpu_vmm_part_end(g->vmm, i - 1) : 0;
	*hi = gpu_vmm_part_end(g->vmm, i);
	if (*hi > g->cache.size)
		*hi = g->cache.size;
}

unsigned gpu_tier_part_at(struct gpu_tier *g, uint64_t off)
{
	unsigned n = gpu_vmm_ndevices(g->vmm), i;

	for (i = 0; i < n && off >= gpu_vmm_part_end(g->vmm, i); i++)
		;
	return i;
}

int gpu_tier_part_device(struct gpu_tier *g, unsigned i)
{
	return gpu_vmm_device(g->vmm, i);
}

/* ---- creation --------------------------------------------------------- */

/* What gpu_tier_create() learns of its devices before it reserves memory. */
struct tier_devs {
	int devs[GPU_MAX_DEVICES];	/* device ordinals; the first is the tier's */
	unsigned n;			/* how many */
	uint64_t sizes[GPU_MAX_DEVICES];	/* each one's part of the cache */
	uint64_t free_all, total_all;	/* their free and total memory, bytes */
};

/*
 * The devices of the cache into d: devs_in[0..ndev), each checked to exist
 * where the device count is known, or with ndev 0 every device (up to
 * GPU_MAX_DEVICES).  0, or -ENODEV with a sentence in msg.  After
 * gpu_init(); no lock (nothing is shared yet).
 */
static int pick_devices(struct tier_devs *d, const int *devs_in, unsigned ndev,
			char *msg, size_t msglen)
{
	int count;

	if (!ndev) {		/* every device (gpu=all) */
		count = gpu_device_count();
		if (count < 1) {
			if (msg && msglen)
				snprintf(msg, msglen, "no CUDA device");
			return -ENODEV;
		}
		d->n = (unsigned)count < GPU_MAX_DEVICES ? (unsigned)count : GPU_MAX_DEVICES;
		for (unsigned i = 0; i < d->n; i++)
			d->devs[i] = (int)i;
		return 0;
	}
	d->n = ndev;
	memcpy(d->devs, devs_in, ndev * sizeof(*d->devs));
	count = gpu_device_count();
	for (unsigned i = 0; i < ndev; i++)
		if (count >= 0 && (d->devs[i] < 0 || d->devs[i] >= count)) {
			if (msg && msglen)
				snprintf(msg, msglen, "no device %d (%d CUDA device%s)",
					 d->devs[i], count, count == 1 ? "" : "s");
			return -ENODEV;
		}
	return 0;
}

/*
 * One range over several devices: each must reach the others' memory.
 * 0, or -EOPNOTSUPP with a sentence in msg naming the first pair that
 * cannot.  No lock.
 */
static int check_peers(const struct tier_devs *d, char *msg, size_t msglen)
{
	for (unsigned i = 0; i < d->n; i++)
		for (unsigned j = 0; j < d->n; j++)
			if (i != j && gpu_can_access_peer(d->devs[i], d->devs[j]) != 1) {
				if (msg && msglen)
					snprintf(msg, msglen, "GPU %d cannot access the memory of "
						 "GPU %d (no peer access): one cache cannot span them; "
						 "name one of them in gpu=", d->devs[i], d->devs[j]);
				return -EOPNOTSUPP;
			}
	return 0;
}

/*
 * Each device's part of the cache (size per device, 0: the default;
 * part_size) into d->sizes, the first device's name into name (namelen
 * bytes), and the devices' free and total memory summed.  0, or -errno
 * with a sentence in msg.  No lock.
 */
static int size_parts(struct tier_devs *d, uint64_t size, char *name, size_t namelen,
		      char *msg, size_t msglen)
{
	uint64_t free_b = 0, total_b = 0;
	char other[sizeof(((struct gpu_tier *)0)->name)];
	int ret = 0;

	for (unsigned i = 0; i < d->n; i++) {
		d->sizes[i] = part_size(d->devs[i], size, i ? other : name,
					namelen, &free_b, &total_b, msg, msglen, &ret);
		if (!d->sizes[i])
			return ret;
		d->free_all += free_b;
		d->total_all += total_b;
	}
	return 0;
}

/* Say in msg why the range over devices d (the first one's name: name)
 * could not be reserved (ret). */
static void say_no_range(const struct tier_devs *d, const char *name, int ret, char *msg,
			 size_t msglen)
{
	if (msg && msglen && d->n == 1)
		snprintf(msg, msglen, "GPU %d (%s): cannot reserve a "
			 "%llu MiB cache: %s", d->devs[0], name, MiB(d->sizes[0]),
			 strerror(-ret));
	else if (msg && msglen)
		snprintf(msg, msglen, "GPUs %d..%d: cannot reserve one cache "
			 "over them: %s%s", d->devs[0], d->devs[d->n - 1], strerror(-ret),
			 ret == -EOPNOTSUPP ? " (see the log)" : "");
}

/*
 * Start g's mapping watcher (watcher_main); where it cannot start, say so
 * in the log: eviction then waits for the whole mapping.  No lock (g is
 * not shared yet).
 */
static void start_watcher(struct gpu_tier *g)
{
	sigset_t all, old;

	/* The watcher takes no signals: they belong to the daemon's loop. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	g->watcher_started = pthread_create(&g->watcher, NULL, watcher_main,
					    g) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!g->watcher_started)
		tlog(LOG_WARNING, "gpu cache: no mapping watcher: eviction "
		     "waits for the whole cache to be mapped");
}

/* Say in msg what cache g over devices d (the first one's name: name) is. */
static void say_created(const struct gpu_tier *g, const struct tier_devs *d,
			const char *name, char *msg, size_t msglen)
{
	if (msg && msglen && d->n == 1)
		snprintf(msg, msglen, "GPU %d (%s): %llu MiB cache, %llu of "
			 "%llu MiB free", d->devs[0], name, MiB(g->cache.size),
			 MiB(d->free_all), MiB(d->total_all));
	else if (msg && msglen)
		snprintf(msg, msglen, "%u GPUs (%d..%d, %s): one %llu MiB cache over "
			 "them, %llu of %llu MiB free", d->n, d->devs[0], d->devs[d->n - 1],
			 name, MiB(g->cache.size), MiB(d->free_all), MiB(d->total_all));
}

int gpu_tier_create(struct gpu_tier **out, const int *devs_in, unsigned ndev,
		    uint64_t size, bool shareable, const struct evict_policy *pol,
		    char *msg, size_t msglen)
{
	struct tier_devs d = { .n = 0 };
	struct gpu_links links = { .n = 1 };
	struct gpu_tier *g;
	char name[sizeof(g->name)] = "";
	int ret = 0;

	*out = NULL;
	if (msg && msglen)
		msg[0] = '\0';
	if (ndev > GPU_MAX_DEVICES || (ndev && !devs_in)) {
		if (msg && msglen)
			snprintf(msg, msglen, "at most %d GPUs per mount", GPU_MAX_DEVICES);
		return -EINVAL;
	}
	ret = gpu_init(ndev ? devs_in[0] : 0, msg, msglen);
	if (ret)
		return ret;
	ret = pick_devices(&d, devs_in, ndev, msg, msglen);
	if (!ret)
		ret = check_peers(&d, msg, msglen);
	if (ret)
		return ret;
	if (d.n > 1)
		probe_links(d.devs, d.n, &links);
	ret = size_parts(&d, size, name, sizeof(name), msg, msglen);
	if (ret)
		return ret;

	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->dev = d.devs[0];
	g->t0 = tier_now();
	g->links = links;
	if (d.n == 1)
		snprintf(g->name, sizeof(g->name), "%s", name);
	else
		snprintf(g->name, sizeof(g->name), "%u x %s", d.n, name);
	ret = gpu_vmm_create_multi(&g->vmm, d.devs, d.sizes, d.n, shareable);
	if (ret) {
		say_no_range(&d, name, ret, msg, msglen);
		goto err_free;
	}
	g->dbase = gpu_vmm_base(g->vmm);
	ret = cache_init(&g->cache, "gpu", 0, (uint8_t *)(uintptr_t)g->dbase,
			 gpu_vmm_size(g->vmm), &gpu_tier_ops, pol);
	if (ret) {
		if (msg && msglen)
			snprintf(msg, msglen, "GPU cache table: %s",
				 strerror(-ret));
		goto err_vmm;
	}
	g->cache.host_addressable = false;
	g->cache.usable = 0;		/* gpu_tier_update_usable() raises it */
	start_watcher(g);
	say_created(g, &d, name, msg, msglen);
	*out = g;
	return 0;

err_vmm:
	gpu_vmm_destroy(g->vmm);
err_free:
	free(g);
	return ret;
}

struct cache *gpu_tier_cache(struct gpu_tier *g)
{
	return &g->cache;
}

uint64_t gpu_tier_base(struct gpu_tier *g)
{
	return gpu_vmm_base(g->vmm);
}

uint64_t gpu_tier_size(struct gpu_tier *g)
{
	return gpu_vmm_size(g->vmm);
}

uint64_t gpu_tier_chunk(struct gpu_tier *g)
{
	return gpu_vmm_chunk(g->vmm);
}

int gpu_tier_export(struct gpu_tier *g, uint64_t i)
{
	return gpu_vmm_export(g->vmm, i);
}

int gpu_tier_device(struct gpu_tier *g)
{
	return g->dev;
}

unsigned gpu_tier_device_use(struct gpu_tier *g, uint64_t *used, unsigned max)
{
	unsigned nd = gpu_vmm_ndevices(g->vmm);
	const struct frag *fr;

	if (nd > max)
		nd = max;
	memset(used, 0, nd * sizeof(*used));
	for (fr = g->cache.head; fr; fr = fr->next) {
		uint64_t lo = fr->off, hi = fr->off + fr->size;

		if (!fr->copy)
			continue;	/* a gap */
		for (unsigned i = 0; i < nd; i++) {
			uint64_t plo = i ? gpu_vmm_part_end(g->vmm, i - 1) : 0,
				 phi = gpu_vmm_part_end(g->vmm, i);
			uint64_t a = lo > plo ? lo : plo, b = hi < phi ? hi : phi;

			if (a < b)
				used[i] += b - a;
		}
	}
	return nd;
}

unsigned gpu_tier_ndevices(struct gpu_tier *g)
{
	return gpu_vmm_ndevices(g->vmm);
}

uint64_t gpu_tier_mapped(struct gpu_tier *g)
{
	return gpu_vmm_mapped(g->vmm);
}

void gpu_tier_update_usable(struct gpu_tier *g)
{
	uint64_t m = gpu_vmm_mapped(g->vmm);

	m &= ~(uint64_t)(TIER_ALIGN - 1);
	if (m > g->cache.size)
		m = g->cache.size;
	if (m > g->cache.usable)
		g->cache.usable = m;
}

bool gpu_tier_fully_mapped(struct gpu_tier *g)
{
	if (gpu_vmm_mapped(g->vmm) >= g->cache.size)
		return true;
	return __atomic_load_n(&g->mapping_done, __ATOMIC_ACQUIRE);
}

void gpu_tier_destroy(struct gpu_tier *g)
{
	if (!g)
		return;
	if (g->watcher_started) {
		if (!gpu_tier_fully_mapped(g))
			tlog(LOG_DEBUG, "gpu cache: waiting for the mapping to "
			     "end (%llu of %llu MiB)", MiB(gpu_tier_mapped(g)),
			     MiB(g->cache.size));
		pthread_join(g->watcher, NULL);
	}
	cache_destroy(&g->cache);
	gpu_vmm_destroy(g->vmm);
	free(g);
}

/* ---- statistics ------------------------------------------------------- */

void gpu_tier_stats_put(struct gpu_tier *g, struct json *j)
{
	json_u64(j, "mapped", gpu_vmm_mapped(g->vmm));
	json_bool(j, "fully_mapped", gpu_tier_fully_mapped(g));
	json_str(j, "device", g->name);
	json_int(j, "device_id", g->dev);
	if (gpu_vmm_ndevices(g->vmm) > 1) {
		/* several GPUs: each one's part of the range */
		uint64_t used[GPU_MAX_DEVICES];
		unsigned nd = gpu_tier_device_use(g, used, GPU_MAX_DEVICES);

		json_arr(j, "devices");
		for (unsigned i = 0; i < nd; i++) {
			uint64_t lo = i ? gpu_vmm_part_end(g->vmm, i - 1) : 0;

			json_obj(j, NULL);
			json_int(j, "device_id", gpu_vmm_device(g->vmm, i));
			json_u64(j, "offset", lo);
			json_u64(j, "size", gpu_vmm_part_end(g->vmm, i) - lo);
			json_u64(j, "used", used[i]);
			json_close(j);
		}
		json_close_arr(j);
	}
}

int gpu_tier_stats_json(struct gpu_tier *g, char *buf, size_t len)
{
	struct json j;

	json_init_inside(&j, buf, len);
	gpu_tier_stats_put(g, &j);
	return json_end(&j);
}

/* ---- host cache pinning (hipc22 §IV) ---------------------------------- */

const char *gpu_tier_pin_lock_path(void)
{
	struct stat st;

	if (stat("/run/lock", &st) == 0 && S_ISDIR(st.st_mode) &&
	    access("/run/lock", W_OK) == 0)
		return GPU_TIER_PIN_LOCK;
	return GPU_TIER_PIN_LOCK_TMP;
}

int gpu_tier_pin_host(void *buf, uint64_t size, const char *lockpath,
		      volatile uint64_t *touched, uint64_t *pinned_out)
{
	double t0, t1, t2;
	int fd, ret;

	if (!gpu_available())
		return -ENODEV;
	if (!buf || !size)
		return -EINVAL;
	if (touched && __atomic_load_n(touched, __ATOMIC_ACQUIRE) < size) {
		tlog(LOG_DEBUG, "host cache: not pinned, %" PRIu64 " of %"
		     PRIu64 " bytes touched", *touched, size);
		return -EAGAIN;
	}
	if (!lockpath || !*lockpath)
		lockpath = gpu_tier_pin_lock_path();

	t0 = tier_now();
	fd = gpu_pin_lock(lockpath);
	if (fd < 0)
		tlog(LOG_WARNING, "host cache: pin lock %s: %s; pinning without "
		     "it", lockpath, strerror(-fd));
	t1 = tier_now();
	ret = gpu_host_register(buf, size);
	t2 = tier_now();
	gpu_pin_unlock(fd);
	if (ret) {
		tlog(LOG_WARNING, "host cache: cannot pin %.2f GiB: %s%s; it "
		     "stays pageable (slower GPU copies)",
		     (double)size / (1 << 30), strerror(-ret),
		     ret == -ENOMEM ? " (see ulimit -l)" : "");
		return ret;
	}
	tlog(LOG_INFO, "host cache pinned: %.2f GiB in %.2f s (waited %.2f s "
	     "for the pin lock)", (double)size / (1 << 30), t2 - t1, t1 - t0);
	if (pinned_out)
		__atomic_store_n(pinned_out, 1, __ATOMIC_RELEASE);
	return 0;
}

int gpu_tier_unpin_host(void *buf, uint64_t *pinned)
{
	int ret;

	if (!pinned || !__atomic_load_n(pinned, __ATOMIC_ACQUIRE))
		return 0;
	ret = gpu_host_unregister(buf);
	if (ret)
		tlog(LOG_WARNING, "host cache: cannot unpin: %s",
		     strerror(-ret));
	__atomic_store_n(pinned, 0, __ATOMIC_RELEASE);
	return ret;
}

/* ---- the GPU outside the cache, for fs/ ------------------------------- */

bool gpu_tier_built(void)
{
	return gpu_built();
}

int gpu_tier_read_dev(void *dst, uint64_t dptr, size_t n)
{
	return gpu_copy_dtoh(dst, dptr, n);
}

int gpu_tier_ipc_open(int dev, const void *handle, uint64_t *dptr, uint64_t *size)
{
	return gpu_ipc_open_on(dev, handle, dptr, size);
}

int gpu_tier_ipc_close(int dev, uint64_t dptr)
{
	return gpu_ipc_close_on(dev, dptr);
}

int gpu_tier_host_register(void *p, size_t len)
{
	return gpu_host_register(p, len);
}

int gpu_tier_host_unregister(void *p)
{
	return gpu_host_unregister(p);
}
