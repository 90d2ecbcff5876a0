/*
 * gpu_tier.h - the GPU cache tier: a struct cache over a VMM reservation,
 * and pinning of the host cache (hipc22 §IV); and what fs/ uses of the GPU
 * outside the cache (IPC mappings of clients' buffers, the cache's export
 * for -o gpu_share, pinned request buffers): fs/ reaches gpu/ only through
 * tiers/, and this is its way (tools/check-calls checks it).
 *
 * The GPU cache is one contiguous range of device addresses
 * (gpu_vmm_create) that a background thread of gpu/ maps chunk by chunk
 * from its start.  gpu_tier_create() sets up a struct cache over the whole
 * range with level 0, name "gpu", host_addressable false and copy functions
 * that call gpu_copy_htod / gpu_copy_dtoh / gpu_copy_dtod on base + offset.
 * Its `usable` starts at 0 and follows the mapping: the engine calls
 * gpu_tier_update_usable() (with its lock held) before it places copies in
 * the tier, and evicts from it only once gpu_tier_fully_mapped() says the
 * mapping is over.
 *
 * The host cache stays the engine's; gpu_tier_pin_host() is what its
 * toucher thread runs once every page is touched: take the node-wide pin
 * lock, cudaHostRegister the whole buffer, release the lock.
 *
 * Only gpu/gpu.h is used, so this builds with or without CUDA; without it
 * (or without a device) gpu_tier_create() fails with -ENODEV.
 *
 * Threads: the copy functions may run on any thread, concurrently, without
 * the engine lock.  gpu_tier_update_usable() writes c->usable: call it with
 * the engine lock held.  gpu_tier_fully_mapped() reads
 * atomics only.  The struct cache lives inside struct gpu_tier: use the
 * pointer gpu_tier_cache() returns, never a copy of the struct; c->priv is
 * free for the engine.
 */
#ifndef TIERFS_GPU_TIER_H
#define TIERFS_GPU_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tier.h"

#define GPU_TIER_MAX_DEVICES	8	/* gpu.h's GPU_MAX_DEVICES */
#define GPU_TIER_STEP		(64ull << 20)	/* default sizes are multiples */
#define GPU_TIER_RESERVE	(1ull << 30)	/* default sizes leave this free */
#define GPU_TIER_PIN_LOCK	"/run/lock/tierfs-pin.lock"
#define GPU_TIER_PIN_LOCK_TMP	"/tmp/tierfs-pin.lock"	/* without /run/lock */

struct gpu_tier;

/*
 * Create the GPU tier on devices devs[0..ndev) (ndev 0: every device of the
 * machine, up to GPU_MAX_DEVICES): gpu_init(the first), pick each device's
 * size, reserve one range over them (gpu_vmm_create_multi, which starts
 * mapping in the background) and set up the cache over it with eviction
 * policy `pol`.  With several devices the cache is one table over one
 * range of device addresses whose consecutive parts are each device's
 * memory: a copy placed across a part's end lies on two GPUs.
 *
 * size (per device) 0: the default, gpu_tier_default_size(free memory of
 * that device).  A larger size than a device can hold while leaving
 * GPU_TIER_RESERVE free is cut down to that (with a warning), so that the
 * mapping does not stop midway.  The reservation is rounded up to the
 * devices' granularity: the cache's c->size is what it got.  With
 * `shareable` the memory is created exportable (gpu_vmm_export, for -o
 * gpu_share).
 *
 * Returns 0 with *out set, or -errno with a sentence in msg: -ENODEV (no
 * CUDA in this build, no driver, no such device), -ENOMEM (not enough free
 * device memory), -EOPNOTSUPP (a device has no VMM, or two devices cannot
 * access each other's memory), -EINVAL (more than GPU_MAX_DEVICES, a device
 * named twice), other driver errors.
 */
int gpu_tier_create(struct gpu_tier **out, const int *devs, unsigned ndev,
		    uint64_t size, bool shareable, const struct evict_policy *pol,
		    char *msg, size_t msglen);

/*
 * The default size for a device with free_b bytes free: half of it,
 * rounded down to GPU_TIER_STEP, cut so that GPU_TIER_RESERVE stays free.
 * 0 when that leaves less than GPU_TIER_STEP.
 */
uint64_t gpu_tier_default_size(uint64_t free_b);

/* The tier's cache (level 0, "gpu").  Valid until gpu_tier_destroy(). */
struct cache *gpu_tier_cache(struct gpu_tier *g);
/* Its device ordinal (the first device's). */
int gpu_tier_device(struct gpu_tier *g);
/*
 * Its VMM range as -o gpu_share hands it to clients (fs_share.c): the
 * device address of its start, the bytes reserved, the bytes per mapped
 * chunk, and chunk i as a POSIX fd (the caller closes it; -errno, e.g.
 * when the range was not created shareable).  Constant but the export.
 */
uint64_t gpu_tier_base(struct gpu_tier *g);
uint64_t gpu_tier_size(struct gpu_tier *g);
uint64_t gpu_tier_chunk(struct gpu_tier *g);
int gpu_tier_export(struct gpu_tier *g, uint64_t i);

/*
 * Raise c->usable to what is mapped now (it never goes down).  Cheap (one
 * atomic load).  The caller holds the engine lock.
 */
void gpu_tier_update_usable(struct gpu_tier *g);

/*
 * Is the mapping over?  True once the whole reservation is mapped, and
 * also when the mapper stopped early (the device ran out of memory meanwhile:
 * the cache is then only as large as what was mapped, and stays so).
 * The engine evicts from the tier only after this said true (and after a
 * gpu_tier_update_usable() that followed it).
 */
bool gpu_tier_fully_mapped(struct gpu_tier *g);

/* Bytes mapped so far (from the start of the range). */
uint64_t gpu_tier_mapped(struct gpu_tier *g);

/*
 * Free the tier: wait for the mapper to end, free the table, unmap and
 * release the device memory.  Every copy must have been released (cache_
 * release / eviction) and no copy may be running.  NULL is a no-op.
 */
void gpu_tier_destroy(struct gpu_tier *g);

/*
 * Devices the tier spans, and the bytes of cached copies on each (used[i]
 * for the i-th device of the range, up to max of them); returns how many
 * were written.  The caller holds the engine lock (the table is walked).
 */
unsigned gpu_tier_ndevices(struct gpu_tier *g);
unsigned gpu_tier_device_use(struct gpu_tier *g, uint64_t *used, unsigned max);

/*
 * The parts of a cache over several GPUs: the index of device `ordinal`'s
 * part (-1: the tier does not span it), part i's offsets [*lo, *hi) in the
 * cache, part i's device ordinal, and the part holding an offset.
 * Constant for the tier's life: no lock needed.
 */
int gpu_tier_part_of(struct gpu_tier *g, int ordinal);
void gpu_tier_part_range(struct gpu_tier *g, unsigned i, uint64_t *lo, uint64_t *hi);
int gpu_tier_part_device(struct gpu_tier *g, unsigned i);
/* The index of the part holding cache offset off (the number of parts
 * when off is past the last). */
unsigned gpu_tier_part_at(struct gpu_tier *g, uint64_t off);

/*
 * Copy len bytes between cache offset off and device address dptr (an
 * application's buffer; into the cache when into_cache), issued on device
 * dev (gpu_copy_dtod_on; -1: the first), one copy per part the range
 * touches.  0 or -errno (-EFAULT outside what is mapped).
 */
int gpu_tier_copy_dev(struct gpu_tier *g, int dev, uint64_t off, uint64_t dptr,
		      uint64_t len, bool into_cache);

/*
 * gpu_tier_copy_dev() of a list (a vectored request): the copies of each
 * run of segments issued on one device are queued together and waited
 * for once (gpu_copy_batch_on).  host: the other end is host memory
 * (dptr a pointer), for a copy kept in a host-addressable cache.  0 or the
 * first -errno; after an error some segments may have been copied.
 */
struct tier_dxfer {
	int dev;			/* issuing device, -1: the first */
	uint64_t off;			/* cache offset (host: the address) */
	uint64_t dptr;			/* the application's device address */
	uint64_t len;
};
int gpu_tier_copy_devv(struct gpu_tier *g, const struct tier_dxfer *x, int n,
		       bool into_cache, bool host);

/*
 * The links between the parts' devices in bytes/s, measured when the tier
 * was created over several GPUs (the input of -o balance): local[i] a copy
 * inside device i, peer[i][j] from device i to device j, host[i] from
 * device i to pinned host memory; 0 where not measured.  probed is false
 * with one device, or when the measurement failed.  Constant.
 */
struct gpu_links {
	unsigned n;
	bool probed;
	double local[GPU_TIER_MAX_DEVICES];
	double peer[GPU_TIER_MAX_DEVICES][GPU_TIER_MAX_DEVICES];
	double host[GPU_TIER_MAX_DEVICES];
};
const struct gpu_links *gpu_tier_links(struct gpu_tier *g);

/*
 * Tier-specific statistics as JSON members to append inside the gpu tier's
 * object: ,"mapped":N,"fully_mapped":true|false,"device":"name",
 * "device_id":N (the first device), and with several devices
 * ,"devices":[{"device_id":N,"offset":N,"size":N,"used":N},...].  The
 * caller holds the engine lock.  Returns the length, or -ERANGE when buf
 * is too small (buf then holds a truncated, NUL-terminated string).
 */
int gpu_tier_stats_json(struct gpu_tier *g, char *buf, size_t len);
/* The same members, written by j into the object it has open. */
struct json;
void gpu_tier_stats_put(struct gpu_tier *g, struct json *j);

/*
 * Pin the host cache (hipc22 §IV): meant for the host toucher thread, once
 * it has touched every page.  Takes the node-wide pin lock on `lockpath`
 * (NULL: gpu_tier_pin_lock_path()), registers [buf, buf + size) with the
 * driver (cudaHostRegister, portable), releases the lock, logs the timings
 * and sets *pinned_out to 1 (atomically).
 *
 * touched: the toucher's progress counter, or NULL; if it is below size
 * nothing happens and -EAGAIN is returned (pinning untouched pages would
 * fault them all in under the lock).  If the lock cannot be taken the
 * buffer is pinned anyway (with a warning): the lock only spaces instances
 * out.  Returns 0, -ENODEV when no GPU is in use (quietly: call it
 * unconditionally), or the registration's error (logged; the host cache
 * then simply stays pageable, which is correct, only slower).
 */
int gpu_tier_pin_host(void *buf, uint64_t size, const char *lockpath,
		      volatile uint64_t *touched, uint64_t *pinned_out);

/*
 * Undo gpu_tier_pin_host() before the buffer is unmapped: unregister buf
 * if *pinned says it is pinned, and clear *pinned.  Returns 0 or -errno.
 * The toucher must have been joined first.
 */
int gpu_tier_unpin_host(void *buf, uint64_t *pinned);

/* The default pin lock: GPU_TIER_PIN_LOCK, or GPU_TIER_PIN_LOCK_TMP when
 * /run/lock is not a writable directory. */
const char *gpu_tier_pin_lock_path(void);

/*
 * The GPU outside the cache, for the FUSE side, which reaches gpu/ only
 * through tiers/ (the calls of gpu.h of the same names, which say more):
 *  - gpu_tier_built(): was tierfs built with CUDA;
 *  - gpu_tier_read_dev(): n bytes of device memory at dptr (a client's
 *    buffer, the cache) into dst; 0 or -errno;
 *  - gpu_tier_ipc_open() / gpu_tier_ipc_close(): a client's IPC memory
 *    handle (GPU_TIER_IPC_HANDLE_SIZE bytes) mapped in device dev's
 *    context (dev < 0: the first device's), *dptr and *size its whole
 *    allocation; closed with the same dev; 0 or -errno (-EINVAL garbage,
 *    -EXDEV memory of another device, -ENODEV no GPU);
 *  - gpu_tier_host_register() / gpu_tier_host_unregister(): host memory
 *    pinned for the driver's copies (the request buffers); 0 or -errno.
 */
#define GPU_TIER_IPC_HANDLE_SIZE	64	/* gpu.h's GPU_IPC_HANDLE_SIZE */
bool gpu_tier_built(void);
int gpu_tier_read_dev(void *dst, uint64_t dptr, size_t n);
int gpu_tier_ipc_open(int dev, const void *handle, uint64_t *dptr, uint64_t *size);
int gpu_tier_ipc_close(int dev, uint64_t dptr);
int gpu_tier_host_register(void *p, size_t len);
int gpu_tier_host_unregister(void *p);

#endif /* TIERFS_GPU_TIER_H */
