/*
 * gpu_vmm.c - the GPU cache buffer: one address reservation, mapped in the
 * background (hipc22 §IV-A, §IV-C).
 *
 * A mount's GPU cache is one contiguous range of device addresses.  Asking
 * the driver for all of its memory at once is slow, and slower still when
 * several tierfs instances on a node start together, so gpu_vmm_create()
 * only reserves the addresses (cuMemAddressReserve, which is cheap) and
 * hands the physical side to a mapper thread: chunk by chunk, from the
 * start of the range, it creates physical memory (cuMemCreate), maps it
 * (cuMemMap) and grants the device read/write access (cuMemSetAccess), then
 * publishes the new end in `mapped`.  Callers may use [base, base + mapped)
 * at once; tiers/ holds back eviction until mapped == size.
 *
 * If the device runs out of memory midway, the mapper stops there, records
 * the error for gpu_vmm_wait() and logs it once: the cache is then simply
 * smaller (mapped stays what was mapped).
 *
 * Chunks: 64 MiB rounded up to the recommended granularity; the last one
 * may be shorter (the size is rounded up to the minimum granularity only).
 * One physical handle per chunk, kept until gpu_vmm_destroy().
 *
 * Several GPUs (-o gpu=0:1, gpu_vmm_create_multi): the one range spans the
 * devices.  Its first part is physical memory of the first device, the next
 * part memory of the second, and so on, each part a whole number of chunks
 * (the last may end short; a part smaller than 64 MiB makes the chunks its
 * size, so that it is not rounded up past it); every chunk is readable and writable by every
 * device of the range (cuMemSetAccess with one descriptor per device, which
 * needs peer access between each pair: checked before anything is
 * reserved).  The range stays one table for tiers/: a file placed across a
 * part's end is split between two GPUs, and the copies, which address the
 * range with unified addresses, reach either one (over NVLink or PCIe peer
 * to peer).
 *
 * Sharing (-o gpu_share, tierfs-gpu(7)): a shareable range's chunks are
 * created exportable as POSIX file descriptors, and gpu_vmm_export() hands
 * out one descriptor per mapped chunk; another process imports them and
 * maps the same memory (gpu_share.c, client side).
 *
 * Threads and memory order: the mapper alone writes handles[] and nmapped
 * and then stores `mapped` with release order; gpu_vmm_mapped() loads it
 * with acquire order.  lock/cond only carry the end of the mapper (done,
 * err) to gpu_vmm_wait().  gpu_vmm_destroy() joins the mapper before it
 * touches handles[].
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_internal.h"

#define VMM_CHUNK	(64ULL << 20)	/* step, before rounding */
#define MiB(x)		((unsigned long long)((x) >> 20))

struct gpu_vmm {
	CUdeviceptr base;	/* start of the reservation */
	uint64_t size;		/* reserved bytes, granularity multiple */
	uint64_t chunk;		/* bytes per mapping step, ditto */
	uint64_t nchunks;	/* ceil(size / chunk) */
	CUmemAllocationProp prop;	/* pinned device memory; location.id is
					 * set per chunk (chunk_dev) */
	unsigned ndev;		/* devices the range spans, 1..GPU_MAX_DEVICES */
	int dev[GPU_MAX_DEVICES];	/* their ordinals, in range order */
	uint64_t dend[GPU_MAX_DEVICES];	/* end offset of each one's part */
	CUcontext dctx[GPU_MAX_DEVICES];	/* primary contexts retained for
						 * devs 1.. (dctx[0] unused) */
	CUmemAccessDesc access[GPU_MAX_DEVICES];	/* read/write for each */
	CUmemGenericAllocationHandle *handles;	/* one per mapped chunk */
	uint64_t nmapped;	/* chunks mapped; the mapper's until joined */
	_Atomic uint64_t mapped;	/* bytes usable from base; only grows */
	atomic_bool stop;	/* gpu_vmm_destroy() asks the mapper to quit */
	pthread_t mapper;	/* the mapping thread */
	pthread_mutex_t lock;	/* guards done and err */
	pthread_cond_t cond;	/* signalled when done turns true */
	bool done;		/* the mapper has finished (or given up) */
	int err;		/* 0, or why the mapper stopped early */
};

static uint64_t round_up(uint64_t x, uint64_t to)
{
	return (x + to - 1) / to * to;
}

static void release_ctxs(struct gpu_vmm *v);

/* Index (in dev[]) of the device whose part holds offset off. */
static unsigned part_of(const struct gpu_vmm *v, uint64_t off)
{
	unsigned d = 0;

	while (d + 1 < v->ndev && off >= v->dend[d])
		d++;
	return d;
}

/* Create, map and open chunk i.  Returns 0 or -errno, leaving it unmapped. */
static int vmm_map_chunk(struct gpu_vmm *v, uint64_t i)
{
	uint64_t off = i * v->chunk;
	size_t len = v->size - off < v->chunk ? v->size - off : v->chunk;
	CUdeviceptr at = v->base + off;
	CUmemAllocationProp prop = v->prop;
	CUmemGenericAllocationHandle h;
	CUresult r;
	int ret = 0;

	prop.location.id = v->dev[part_of(v, off)];
	r = cuMemCreate(&h, len, &prop, 0);
	if (r != CUDA_SUCCESS) {
		/* Running out of memory is an outcome here, not a bug:
		 * the caller logs it with the sizes. */
		if (r != CUDA_ERROR_OUT_OF_MEMORY)
			return gpu_cu_err("cuMemCreate(&h, len, &v->prop, 0)",
					  r);
		return -ENOMEM;
	}
	GPU_CU(cuMemMap(at, len, 0, h, 0), out_release);
	GPU_CU(cuMemSetAccess(at, len, v->access, v->ndev), out_unmap);
	v->handles[i] = h;
	return 0;

out_unmap:
	cuMemUnmap(at, len);
out_release:
	cuMemRelease(h);
	return ret;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *vmm_mapper(void *arg)
{
	struct gpu_vmm *v = arg;
	double t0 = now_ms();
	uint64_t i, end;
	int ret;

	ret = gpu_ctx_enter();
	for (i = 0; !ret && i < v->nchunks; i++) {
		if (atomic_load_explicit(&v->stop, memory_order_relaxed))
			break;
		ret = vmm_map_chunk(v, i);
		if (ret)
			break;
		v->nmapped = i + 1;
		end = (i + 1) * v->chunk;
		if (end > v->size)
			end = v->size;
		atomic_store_explicit(&v->mapped, end, memory_order_release);
	}
	if (ret)
		gpu_log(LOG_WARNING,
			"gpu: cache mapping stopped at %llu of %llu MiB after %.0f ms: %s",
			MiB(atomic_load(&v->mapped)), MiB(v->size),
			now_ms() - t0, strerror(-ret));
	else if (i == v->nchunks)
		gpu_log(LOG_INFO, "gpu: cache fully mapped (%llu MiB) in %.0f ms",
			MiB(v->size), now_ms() - t0);

	ranked_lock(&v->lock, LR_GPU_VMM);
	v->err = ret;
	v->done = true;
	pthread_cond_broadcast(&v->cond);
	ranked_unlock(&v->lock, LR_GPU_VMM);
	return NULL;
}

/*
 * The devices of gpu_vmm_create_multi (n of them, each named once): each
 * must exist, manage virtual memory and reach the memory of every other
 * (peer access).  The daemon's context is current.  Returns 0, -ENODEV,
 * -EOPNOTSUPP (logged), or the mapped driver error.
 */
static int vmm_check_devs(const int *devs, unsigned n)
{
	int vmm_ok = 0, ret = 0, count = 0;

	GPU_CU(cuDeviceGetCount(&count), out);
	for (unsigned i = 0; i < n; i++) {
		CUdevice d;

		if (devs[i] < 0 || devs[i] >= count) {
			gpu_log(LOG_ERR, "gpu: no device %d (%d CUDA device%s)", devs[i], count,
				count == 1 ? "" : "s");
			return -ENODEV;
		}
		GPU_CU(cuDeviceGet(&d, devs[i]), out);
		GPU_CU(cuDeviceGetAttribute(&vmm_ok,
				CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
				d), out);
		if (!vmm_ok) {
			gpu_log(LOG_ERR, "gpu: device %d has no virtual memory management",
				devs[i]);
			return -EOPNOTSUPP;
		}
		for (unsigned j = 0; j < n; j++) {
			CUdevice e;
			int can = 0;

			if (j == i)
				continue;
			GPU_CU(cuDeviceGet(&e, devs[j]), out);
			GPU_CU(cuDeviceCanAccessPeer(&can, d, e), out);
			if (!can) {
				gpu_log(LOG_ERR, "gpu: device %d cannot access the memory of "
					"device %d (no peer access): one cache cannot span them",
					devs[i], devs[j]);
				return -EOPNOTSUPP;
			}
		}
	}
out:
	return ret;
}

/*
 * The devices of a new, zeroed range v: their ordinals, read/write
 * access for each, the chunks' allocation properties (v->prop, its
 * location devs[0]'s), and in *gmin and *grec the largest minimum and
 * recommended granularity of them all (2 MiB when the driver says none;
 * grec at least gmin).  Returns 0 or the mapped driver error.
 */
static int vmm_set_devs(struct gpu_vmm *v, const int *devs, unsigned n, bool shareable,
			size_t *gmin, size_t *grec)
{
	int ret = 0;

	v->ndev = n;
	v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	v->prop.requestedHandleTypes = shareable ?
		CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
	v->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	for (unsigned i = 0; i < n; i++) {
		size_t dmin = 0, drec = 0;

		v->dev[i] = devs[i];
		v->access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		v->access[i].location.id = devs[i];
		v->access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		v->prop.location.id = devs[i];
		GPU_CU(cuMemGetAllocationGranularity(&dmin, &v->prop,
				CU_MEM_ALLOC_GRANULARITY_MINIMUM), out);
		GPU_CU(cuMemGetAllocationGranularity(&drec, &v->prop,
				CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), out);
		if (dmin > *gmin)
			*gmin = dmin;
		if (drec > *grec)
			*grec = drec;
	}
	v->prop.location.id = devs[0];
	if (!*gmin)
		*gmin = 2ULL << 20;
	if (*grec < *gmin)
		*grec = *gmin;
out:
	return ret;
}

/*
 * The layout of v over its devices' parts: the chunk (VMM_CHUNK rounded up
 * to the granularities, smaller for a small part), each part's end in
 * dend[] (whole chunks but the last, which is rounded to gmin only), the
 * size and the number of chunks.
 */
static void vmm_set_parts(struct gpu_vmm *v, const uint64_t *sizes, unsigned n, size_t gmin,
			  size_t grec)
{
	uint64_t total = 0;

	v->chunk = round_up(round_up(VMM_CHUNK, grec), gmin);
	for (unsigned i = 0; i + 1 < n; i++)	/* a small part: smaller chunks */
		if (round_up(sizes[i], gmin) < v->chunk)
			v->chunk = round_up(sizes[i], gmin);
	for (unsigned i = 0; i < n; i++) {
		/* whole chunks per part, so that no chunk straddles two
		 * devices; the last part only to the granularity */
		total += i + 1 < n ? round_up(sizes[i], v->chunk) : round_up(sizes[i], gmin);
		v->dend[i] = total;
	}
	v->size = total;
	v->nchunks = (v->size + v->chunk - 1) / v->chunk;
}

/*
 * Retain the primary contexts of v's devices but the first (dctx[1..]),
 * then make the daemon's context current again.  Returns 0 or -errno;
 * what was retained stays in dctx[] for release_ctxs().
 */
static int vmm_retain_ctxs(struct gpu_vmm *v, const int *devs, unsigned n)
{
	int ret = 0;

	for (unsigned i = 1; i < n; i++) {	/* the other devices' driver state */
		CUdevice d;

		GPU_CU(cuDeviceGet(&d, devs[i]), out);
		GPU_CU(cuDevicePrimaryCtxRetain(&v->dctx[i], d), out);
	}
	ret = gpu_ctx_enter();	/* back to the daemon's context */
out:
	return ret;
}

/* Log where the reserved range of v lies, part by part. */
static void vmm_log_parts(const struct gpu_vmm *v, const int *devs, unsigned n)
{
	if (n == 1)
		gpu_log(LOG_INFO,
			"gpu: cache of %llu MiB reserved at 0x%llx, mapping %llu MiB chunks",
			MiB(v->size), (unsigned long long)v->base, MiB(v->chunk));
	else
		for (unsigned i = 0; i < n; i++)
			gpu_log(LOG_INFO, "gpu: cache part %u: %llu MiB on device %d at "
				"0x%llx (%llu MiB chunks)", i,
				MiB(v->dend[i] - (i ? v->dend[i - 1] : 0)), devs[i],
				(unsigned long long)(v->base + (i ? v->dend[i - 1] : 0)),
				MiB(v->chunk));
}

/*
 * Start v's mapper thread with every signal blocked (they belong to the
 * daemon's loop).  Returns 0, or the pthread error as -errno (logged).
 */
static int vmm_start_mapper(struct gpu_vmm *v)
{
	sigset_t all, old;
	int ret;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	ret = -pthread_create(&v->mapper, NULL, vmm_mapper, v);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret)
		gpu_log(LOG_ERR, "gpu: cannot start the cache mapper: %s",
			strerror(-ret));
	return ret;
}

/*
 * gpu_vmm_create_multi - reserve sizes[0] + ... + sizes[n - 1] bytes of
 * device addresses, the first sizes[0] (rounded up to whole chunks, the
 * last part to the granularity only) to be backed by memory of device
 * devs[0], the next by devs[1], and so on, and start the mapper thread;
 * with `shareable`, chunks are created exportable (gpu_vmm_export).  Every
 * device gets read/write access to the whole range.  Returns 0 with *out
 * set, -EINVAL for a size 0, n out of 1..GPU_MAX_DEVICES or a device named
 * twice, -ENODEV before gpu_init() or for a device that does not exist,
 * -EOPNOTSUPP when a device lacks VMM or two of them cannot reach each
 * other's memory (peer access), or the mapped driver / pthread error; on
 * error *out is NULL and nothing is left reserved.
 */
int gpu_vmm_create_multi(struct gpu_vmm **out, const int *devs, const uint64_t *sizes,
			 unsigned n, bool shareable)
{
	struct gpu_vmm *v;
	size_t gmin = 0, grec = 0;
	int ret;

	*out = NULL;
	if (!n || n > GPU_MAX_DEVICES)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		if (!sizes[i] || sizes[i] > UINT64_MAX / 2 / GPU_MAX_DEVICES)
			return -EINVAL;
		for (unsigned j = 0; j < i; j++)
			if (devs[j] == devs[i])
				return -EINVAL;
	}
	ret = gpu_ctx_enter();
	if (ret)
		return ret;
	ret = vmm_check_devs(devs, n);
	if (ret)
		goto out;

	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	ret = vmm_set_devs(v, devs, n, shareable, &gmin, &grec);
	if (ret)
		goto out_free;
	vmm_set_parts(v, sizes, n, gmin, grec);
	v->handles = calloc(v->nchunks, sizeof(*v->handles));
	if (!v->handles) {
		ret = -ENOMEM;
		goto out_free;
	}
	ret = vmm_retain_ctxs(v, devs, n);
	if (ret)
		goto out_release_ctx;

	GPU_CU(cuMemAddressReserve(&v->base, v->size, grec, 0, 0),
	       out_release_ctx);

	atomic_init(&v->mapped, 0);
	atomic_init(&v->stop, false);
	pthread_mutex_init(&v->lock, NULL);
	pthread_cond_init(&v->cond, NULL);

	vmm_log_parts(v, devs, n);
	ret = vmm_start_mapper(v);
	if (ret)
		goto out_addr_free;
	*out = v;
	return 0;

out_addr_free:
	pthread_cond_destroy(&v->cond);
	pthread_mutex_destroy(&v->lock);
	cuMemAddressFree(v->base, v->size);
out_release_ctx:
	release_ctxs(v);
	free(v->handles);
out_free:
	free(v);
out:
	return ret;
}

/*
 * gpu_vmm_create - gpu_vmm_create_multi() on the device gpu_init() picked
 * alone.
 */
int gpu_vmm_create(struct gpu_vmm **out, uint64_t size, bool shareable)
{
	int dev = gpu_cu_ordinal();

	*out = NULL;
	if (!size)
		return -EINVAL;
	if (!gpu_available())
		return -ENODEV;
	return gpu_vmm_create_multi(out, &dev, &size, 1, shareable);
}

/* The primary contexts retained for the other devices. */
static void release_ctxs(struct gpu_vmm *v)
{
	for (unsigned i = 1; i < v->ndev; i++) {
		CUdevice d;

		if (v->dctx[i] && cuDeviceGet(&d, v->dev[i]) == CUDA_SUCCESS)
			cuDevicePrimaryCtxRelease(d);
		v->dctx[i] = NULL;
	}
}

/* gpu_vmm_ndevices - devices the range spans (1 for gpu_vmm_create). */
unsigned gpu_vmm_ndevices(const struct gpu_vmm *v)
{
	return v->ndev;
}

/* gpu_vmm_device - the ordinal of the i-th device of the range. */
int gpu_vmm_device(const struct gpu_vmm *v, unsigned i)
{
	return i < v->ndev ? v->dev[i] : -1;
}

/* gpu_vmm_part_end - the end offset of the i-th device's part. */
uint64_t gpu_vmm_part_end(const struct gpu_vmm *v, unsigned i)
{
	return i < v->ndev ? v->dend[i] : v->size;
}

/* gpu_vmm_base - device address of the start of the reservation. */
uint64_t gpu_vmm_base(const struct gpu_vmm *v)
{
	return v->base;
}

/* gpu_vmm_size - reserved bytes (the requested size rounded up to the
 * allocation granularity); gpu_vmm_mapped() reaches it when all is well. */
uint64_t gpu_vmm_size(const struct gpu_vmm *v)
{
	return v->size;
}

/*
 * gpu_vmm_mapped - bytes usable from the base right now.  Only grows;
 * stays short of gpu_vmm_size() if the mapper failed or was stopped.
 */
uint64_t gpu_vmm_mapped(const struct gpu_vmm *v)
{
	return atomic_load_explicit(&v->mapped, memory_order_acquire);
}

/* gpu_vmm_chunk - bytes per chunk (the last one may be shorter). */
uint64_t gpu_vmm_chunk(const struct gpu_vmm *v)
{
	return v->chunk;
}

/*
 * gpu_vmm_export - a POSIX file descriptor for chunk i's physical memory
 * (the caller closes it).  Returns it, -EINVAL when chunk i is not mapped
 * (yet), -EOPNOTSUPP when the range was not created shareable, or the
 * mapped driver error.  Only chunks below gpu_vmm_mapped() are mapped.
 */
int gpu_vmm_export(struct gpu_vmm *v, uint64_t i)
{
	uint64_t end = (i + 1) * v->chunk;
	int fd = -1, ret;

	if (v->prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return -EOPNOTSUPP;
	if (end > v->size)
		end = v->size;
	if (i >= v->nchunks || gpu_vmm_mapped(v) < end)
		return -EINVAL;	/* handles[i] is published by `mapped` */
	ret = gpu_ctx_enter();
	if (ret)
		return ret;
	GPU_CU(cuMemExportToShareableHandle(&fd, v->handles[i],
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), out);
	return fd;
out:
	return ret;
}

/*
 * gpu_vmm_wait - block until the mapper has finished.  Returns 0 when the
 * whole range is mapped, or the error that stopped the mapper (-ENOMEM when
 * the device ran out of memory); -ECANCELED if destroy stopped it.
 */
int gpu_vmm_wait(struct gpu_vmm *v)
{
	int ret;

	ranked_lock(&v->lock, LR_GPU_VMM);
	while (!v->done)
		pthread_cond_wait(&v->cond, &v->lock);
	ret = v->err;
	ranked_unlock(&v->lock, LR_GPU_VMM);
	if (!ret && gpu_vmm_mapped(v) != v->size)
		ret = -ECANCELED;
	return ret;
}

/*
 * gpu_vmm_destroy - stop the mapper (it finishes the chunk in hand), unmap
 * and release every chunk, free the reservation and v.  The caller must
 * have stopped every copy into the range.  NULL is a no-op.
 */
void gpu_vmm_destroy(struct gpu_vmm *v)
{
	uint64_t i, off;
	size_t len;
	int ret;

	if (!v)
		return;
	atomic_store(&v->stop, true);
	pthread_join(v->mapper, NULL);

	ret = gpu_ctx_enter();
	if (ret) {
		/* Cannot happen after gpu_init(); leak, don't crash. */
		gpu_log(LOG_ERR, "gpu: cache not released: %s", strerror(-ret));
		goto out_free;
	}
	for (i = 0; i < v->nmapped; i++) {
		off = i * v->chunk;
		len = v->size - off < v->chunk ? v->size - off : v->chunk;
		GPU_CU(cuMemUnmap(v->base + off, len), next);
		GPU_CU(cuMemRelease(v->handles[i]), next);
next:
		continue;
	}
	GPU_CU(cuMemAddressFree(v->base, v->size), out_free);
out_free:
	release_ctxs(v);
	pthread_cond_destroy(&v->cond);
	pthread_mutex_destroy(&v->lock);
	free(v->handles);
	free(v);
}
