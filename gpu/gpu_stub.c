/*
 * gpu_stub.c - gpu.h for a tierfs built without CUDA.
 *
 * Linked instead of the other gpu/ files when configure found no CUDA.
 * gpu_init() fails with -ENODEV ("built without CUDA"), gpu_available()
 * says no, and every other call returns -EOPNOTSUPP (or nothing), so the
 * daemon runs with the host and SSD tiers only.  tiers/ never reaches the
 * VMM calls here, because it creates no GPU tier when gpu_available() is
 * false; they still behave sanely if it did.
 *
 * Includes nothing from CUDA.
 */
#include <errno.h>
#include <stdio.h>

#include "gpu.h"

/* gpu_built - false: no CUDA in this build. */
bool gpu_built(void)
{
	return false;
}

/* gpu_init - always -ENODEV, with "built without CUDA" in msg. */
int gpu_init(int dev, char *msg, size_t msglen)
{
	(void)dev;
	if (msg && msglen)
		snprintf(msg, msglen, "built without CUDA");
	return -ENODEV;
}

/* gpu_available - always false. */
bool gpu_available(void)
{
	return false;
}

/* gpu_mem_info - -EOPNOTSUPP; outputs untouched. */
int gpu_mem_info(uint64_t *free_b, uint64_t *total_b, char *name,
		 size_t namelen)
{
	(void)free_b;
	(void)total_b;
	(void)name;
	(void)namelen;
	return -EOPNOTSUPP;
}

/* gpu_device_count, gpu_can_access_peer, gpu_dev_mem_info - -EOPNOTSUPP. */
int gpu_can_access_peer(int a, int b)
{
	(void)a;
	(void)b;
	return -EOPNOTSUPP;
}

int gpu_device_count(void)
{
	return -EOPNOTSUPP;
}

int gpu_dev_mem_info(int dev, uint64_t *free_b, uint64_t *total_b, char *name,
		     size_t namelen)
{
	(void)dev;
	(void)free_b;
	(void)total_b;
	(void)name;
	(void)namelen;
	return -EOPNOTSUPP;
}

/* gpu_vmm_create_multi - -EOPNOTSUPP; *out is NULL. */
int gpu_vmm_create_multi(struct gpu_vmm **out, const int *devs, const uint64_t *sizes,
			 unsigned n, bool shareable)
{
	(void)devs;
	(void)sizes;
	(void)n;
	(void)shareable;
	if (out)
		*out = NULL;
	return -EOPNOTSUPP;
}

/* gpu_vmm_ndevices, gpu_vmm_device, gpu_vmm_part_end: no range exists. */
unsigned gpu_vmm_ndevices(const struct gpu_vmm *v)
{
	(void)v;
	return 0;
}

int gpu_vmm_device(const struct gpu_vmm *v, unsigned i)
{
	(void)v;
	(void)i;
	return -1;
}

uint64_t gpu_vmm_part_end(const struct gpu_vmm *v, unsigned i)
{
	(void)v;
	(void)i;
	return 0;
}

/* gpu_vmm_create - -EOPNOTSUPP; *out is NULL. */
int gpu_vmm_create(struct gpu_vmm **out, uint64_t size, bool shareable)
{
	(void)size;
	(void)shareable;
	if (out)
		*out = NULL;
	return -EOPNOTSUPP;
}

/* gpu_vmm_base/size/mapped - 0: no cache exists in this build. */
uint64_t gpu_vmm_base(const struct gpu_vmm *v)
{
	(void)v;
	return 0;
}

uint64_t gpu_vmm_size(const struct gpu_vmm *v)
{
	(void)v;
	return 0;
}

uint64_t gpu_vmm_mapped(const struct gpu_vmm *v)
{
	(void)v;
	return 0;
}

/* gpu_vmm_wait - -EOPNOTSUPP. */
int gpu_vmm_wait(struct gpu_vmm *v)
{
	(void)v;
	return -EOPNOTSUPP;
}

/* gpu_vmm_destroy - nothing to free. */
void gpu_vmm_destroy(struct gpu_vmm *v)
{
	(void)v;
}

/* gpu_copy_* - -EOPNOTSUPP. */
int gpu_copy_htod(uint64_t dst, const void *src, size_t len)
{
	(void)dst;
	(void)src;
	(void)len;
	return -EOPNOTSUPP;
}

int gpu_copy_dtoh(void *dst, uint64_t src, size_t len)
{
	(void)dst;
	(void)src;
	(void)len;
	return -EOPNOTSUPP;
}

int gpu_copy_dtod(uint64_t dst, uint64_t src, size_t len)
{
	(void)dst;
	(void)src;
	(void)len;
	return -EOPNOTSUPP;
}

int gpu_copy_dtod_on(int dev, uint64_t dst, uint64_t src, size_t len)
{
	(void)dev;
	return gpu_copy_dtod(dst, src, len);
}

int gpu_copy_batch_on(int dev, const struct gpu_xfer *x, int n)
{
	(void)dev;
	(void)x;
	(void)n;
	return -EOPNOTSUPP;
}

int gpu_copy_dtoh_batch(const struct gpu_xfer *x, int n)
{
	(void)x;
	(void)n;
	return -EOPNOTSUPP;
}

/* gpu_host_register/unregister - -EOPNOTSUPP: nothing to pin for. */
int gpu_host_register(void *p, size_t len)
{
	(void)p;
	(void)len;
	return -EOPNOTSUPP;
}

int gpu_host_unregister(void *p)
{
	(void)p;
	return -EOPNOTSUPP;
}

/* gpu_pin_lock - -EOPNOTSUPP: without CUDA nothing gets pinned. */
int gpu_pin_lock(const char *path)
{
	(void)path;
	return -EOPNOTSUPP;
}

/* gpu_pin_unlock - nothing was locked. */
void gpu_pin_unlock(int fd)
{
	(void)fd;
}

/* gpu_ipc_* - -EOPNOTSUPP. */
int gpu_ipc_open(const void *handle, uint64_t *dptr, uint64_t *size)
{
	(void)handle;
	(void)dptr;
	(void)size;
	return -EOPNOTSUPP;
}

int gpu_ipc_close(uint64_t dptr)
{
	(void)dptr;
	return -EOPNOTSUPP;
}

int gpu_ipc_open_on(int dev, const void *handle, uint64_t *dptr, uint64_t *size)
{
	(void)dev;
	return gpu_ipc_open(handle, dptr, size);
}

int gpu_ipc_close_on(int dev, uint64_t dptr)
{
	(void)dev;
	return gpu_ipc_close(dptr);
}

int gpu_ipc_export(uint64_t dptr, void *handle, uint64_t *base,
		   uint64_t *size, int *device)
{
	(void)dptr;
	(void)handle;
	(void)base;
	(void)size;
	(void)device;
	return -EOPNOTSUPP;
}

/* gpu_vmm_chunk - 0; gpu_vmm_export - -EOPNOTSUPP. */
uint64_t gpu_vmm_chunk(const struct gpu_vmm *v)
{
	(void)v;
	return 0;
}

int gpu_vmm_export(struct gpu_vmm *v, uint64_t i)
{
	(void)v;
	(void)i;
	return -EOPNOTSUPP;
}

/* gpu_share_* - -EOPNOTSUPP (release: nothing to undo). */
int gpu_share_reserve(int dev, uint64_t size, uint64_t align, uint64_t *va)
{
	(void)dev;
	(void)size;
	(void)align;
	(void)va;
	return -EOPNOTSUPP;
}

int gpu_share_map(int dev, uint64_t va, uint64_t len, int fd)
{
	(void)dev;
	(void)va;
	(void)len;
	(void)fd;
	return -EOPNOTSUPP;
}

int gpu_share_access(int dev, uint64_t va, uint64_t len)
{
	(void)dev;
	(void)va;
	(void)len;
	return -EOPNOTSUPP;
}

void gpu_share_release(int dev, uint64_t va, uint64_t mapped, uint64_t chunk,
		       uint64_t size)
{
	(void)dev;
	(void)va;
	(void)mapped;
	(void)chunk;
	(void)size;
}

int gpu_share_copy(int dev, void *ctx, uint64_t dst, uint64_t src, size_t len)
{
	(void)dev;
	(void)ctx;
	(void)dst;
	(void)src;
	(void)len;
	return -EOPNOTSUPP;
}

int gpu_share_copyv(int dev, void *ctx, const struct gpu_xfer *x, int n)
{
	(void)dev;
	(void)ctx;
	(void)x;
	(void)n;
	return -EOPNOTSUPP;
}

/* gpu_hash_chunks - -EOPNOTSUPP: hash on the host instead; out untouched. */
int gpu_hash_chunks(uint64_t src, uint64_t len, uint64_t chunk,
		    uint8_t (*out)[GPU_HASH_SIZE])
{
	(void)src;
	(void)len;
	(void)chunk;
	(void)out;
	return -EOPNOTSUPP;
}

int gpu_hash_chunks_dev(uint64_t src, uint64_t len, uint64_t chunk,
			uint64_t dst, int variant)
{
	(void)src;
	(void)len;
	(void)chunk;
	(void)dst;
	(void)variant;
	return -EOPNOTSUPP;
}

int gpu_hash_readbw(uint64_t src, uint64_t len)
{
	(void)src;
	(void)len;
	return -EOPNOTSUPP;
}

/* gpu_hash_describe - -EOPNOTSUPP, with "built without CUDA" in buf. */
int gpu_hash_describe(char *buf, size_t len)
{
	if (buf && len)
		snprintf(buf, len, "built without CUDA");
	return -EOPNOTSUPP;
}
