/*
 * gpu.h - the plain-C face of everything CUDA in tierfs.
 *
 * No CUDA type leaks out of gpu/: device addresses are uint64_t, IPC
 * handles are opaque 64-byte blobs.  A build without CUDA links gpu_stub.c,
 * whose gpu_available() says no and whose other calls return -EOPNOTSUPP.
 * Every call returns 0 (or a count) or -errno; CUDA errors are logged once
 * with the failing call's text.
 *
 * Threads: any thread may call any function; each function makes the
 * device's primary context current itself.
 */
#ifndef TIERFS_GPU_H
#define TIERFS_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPU_IPC_HANDLE_SIZE 64
#define GPU_MAX_DEVICES	8	/* devices one cache may span */

/* Was tierfs built with CUDA? */
bool gpu_built(void);
/*
 * Initialise the driver and pick device `dev`.  Returns 0, or -ENODEV (no
 * driver/device; why is written to msg).  Idempotent.
 */
int gpu_init(int dev, char *msg, size_t msglen);
/* After gpu_init: is a device usable? */
bool gpu_available(void);
/* Free and total device memory in bytes, name of the device. */
int gpu_mem_info(uint64_t *free_b, uint64_t *total_b, char *name, size_t namelen);
/* After gpu_init: the number of CUDA devices, or -errno. */
int gpu_device_count(void);
/* After gpu_init: 1 when device a can access device b's memory (peer
 * access), 0 when not, -ENODEV when either does not exist. */
int gpu_can_access_peer(int a, int b);
/* gpu_mem_info() of any device (ordinal dev), after gpu_init. */
int gpu_dev_mem_info(int dev, uint64_t *free_b, uint64_t *total_b, char *name,
		     size_t namelen);

/* ---- VMM cache buffer (gpu_vmm.c) ---------------------------------- */

struct gpu_vmm;
/*
 * Reserve `size` bytes of device address space (cuMemAddressReserve) and
 * start a background thread that maps physical memory chunk by chunk
 * (cuMemCreate, cuMemMap, cuMemSetAccess).  Returns at once: bytes become
 * usable from the start of the range as gpu_vmm_mapped() grows.
 */
int gpu_vmm_create(struct gpu_vmm **out, uint64_t size, bool shareable);
/*
 * The same over several devices: one range whose i-th part (sizes[i] bytes,
 * rounded up to whole chunks) is memory of device devs[i], every part
 * accessible to every device (peer access between each pair is required:
 * -EOPNOTSUPP otherwise).  gpu_vmm_create() is this with the gpu_init()
 * device alone.
 */
int gpu_vmm_create_multi(struct gpu_vmm **out, const int *devs, const uint64_t *sizes,
			 unsigned n, bool shareable);
unsigned gpu_vmm_ndevices(const struct gpu_vmm *v);	/* devices spanned */
int gpu_vmm_device(const struct gpu_vmm *v, unsigned i);	/* i-th one's ordinal */
uint64_t gpu_vmm_part_end(const struct gpu_vmm *v, unsigned i);	/* its part's end */
uint64_t gpu_vmm_base(const struct gpu_vmm *v);	/* device address */
uint64_t gpu_vmm_size(const struct gpu_vmm *v);	/* reserved bytes */
uint64_t gpu_vmm_mapped(const struct gpu_vmm *v);	/* mapped so far */
uint64_t gpu_vmm_chunk(const struct gpu_vmm *v);	/* bytes per chunk */
/* A POSIX fd for chunk i of a shareable range (the caller closes it), or
 * -errno. */
int gpu_vmm_export(struct gpu_vmm *v, uint64_t i);
/* Wait until fully mapped; returns 0 or the mapping thread's error. */
int gpu_vmm_wait(struct gpu_vmm *v);
/* Stop mapping, unmap, release, free. */
void gpu_vmm_destroy(struct gpu_vmm *v);

/* ---- copies (gpu_copy.c) -------------------------------------------- */

/* Directions, each with its own stream(s) (hpdc23 §4.3). */
enum gpu_dir { GPU_H2D = 0, GPU_D2H, GPU_D2D, GPU_NDIRS };

/* Synchronous copies on the direction's stream.  Host memory may be
 * pinned or not. */
int gpu_copy_htod(uint64_t dst, const void *src, size_t len);
int gpu_copy_dtoh(void *dst, uint64_t src, size_t len);
int gpu_copy_dtod(uint64_t dst, uint64_t src, size_t len);
/* gpu_copy_dtod() issued on device dev (its primary context and a stream
 * of its own; dev < 0: the gpu_init() device), e.g. the GPU that holds the
 * source buffer.  Both addresses must be accessible from dev. */
int gpu_copy_dtod_on(int dev, uint64_t dst, uint64_t src, size_t len);
/*
 * A list of copies for one client request (a vectored ioctl): queued in
 * order on device dev's device-to-device stream (as gpu_copy_dtod_on) and
 * waited for once, so n segments cost one synchronisation, not n.  dir
 * says which end is host memory (GPU_H2D: src, GPU_D2H: dst, as a
 * pointer); GPU_D2D moves may overlap (as gpu_copy_dtod).  Returns 0 or
 * the first error (some copies may have landed).
 */
struct gpu_xfer {
	uint64_t dst, src;
	size_t len;
	enum gpu_dir dir;
};
int gpu_copy_batch_on(int dev, const struct gpu_xfer *x, int n);
/* The same on the device-to-host stream (the flushes'), for copies out of
 * the cache (GPU_D2H): a file's scattered pieces copied with one wait. */
int gpu_copy_dtoh_batch(const struct gpu_xfer *x, int n);

/* ---- host memory pinning (gpu_pin.c) -------------------------------- */

/* cudaHostRegister / unregister of an existing host range. */
int gpu_host_register(void *p, size_t len);
int gpu_host_unregister(void *p);
/*
 * Serialise pinning across tierfs instances on one node: take/release an
 * exclusive lock on `path` (flock).  Blocks.  Returns an fd or -errno.
 */
int gpu_pin_lock(const char *path);
void gpu_pin_unlock(int fd);

/* ---- IPC memory handles (gpu_ipc.c) --------------------------------- */

/*
 * Open a client's cudaIpcMemHandle (64 bytes) in this process.  Returns the
 * device address of the allocation's base in *dptr and its size in *size.
 * -EINVAL: garbage handle; -ENODEV: no GPU tier; -EXDEV: other device.
 */
int gpu_ipc_open(const void *handle, uint64_t *dptr, uint64_t *size);
int gpu_ipc_close(uint64_t dptr);
/* The same in device dev's primary context (dev < 0: the gpu_init()
 * device): the handle must be memory of device dev (-EXDEV otherwise).
 * Close with gpu_ipc_close_on() and the same dev. */
int gpu_ipc_open_on(int dev, const void *handle, uint64_t *dptr, uint64_t *size);
int gpu_ipc_close_on(int dev, uint64_t dptr);

/* Client side (libtierfs): find the allocation holding dptr and export
 * its handle.  *base and *size describe the allocation. */
int gpu_ipc_export(uint64_t dptr, void *handle, uint64_t *base,
		   uint64_t *size, int *device);

/* ---- a shared GPU cache, client side (gpu_share.c) ------------------- */

/* Reserve size bytes of device addresses on device dev (aligned). */
int gpu_share_reserve(int dev, uint64_t size, uint64_t align, uint64_t *va);
/* Map the chunk exported as fd at va (len bytes); fd stays open. */
int gpu_share_map(int dev, uint64_t va, uint64_t len, int fd);
/* Grant device dev read/write access to [va, va + len). */
int gpu_share_access(int dev, uint64_t va, uint64_t len);
/* Unmap the first `mapped` bytes (chunks of `chunk`), free the range. */
void gpu_share_release(int dev, uint64_t va, uint64_t mapped, uint64_t chunk,
		       uint64_t size);
/* Device-to-device copy in ctx (a CUcontext, or NULL: dev's primary
 * context) on its legacy default stream; waits for it. */
int gpu_share_copy(int dev, void *ctx, uint64_t dst, uint64_t src, size_t len);
/* gpu_share_copy() of a list of device-to-device copies (x[i].dir
 * GPU_D2D), queued in order and waited for once. */
int gpu_share_copyv(int dev, void *ctx, const struct gpu_xfer *x, int n);

/* ---- chunk hashing (gpu_hash.c, kernels in gpu_hash.cu) ------------- */

#define GPU_HASH_SIZE		16		/* bytes of one hash */
#define GPU_HASH_CHUNK_MIN	4096u		/* chunk sizes: powers of two */
#define GPU_HASH_CHUNK_MAX	(1u << 20)

/* Kernels of gpu_hash_chunks_dev(): AUTO is what gpu_hash_chunks() uses
 * (U8 at 8 KiB chunks, U4 at the others); U4 and U8 keep 4 or 8 KiB of loads
 * in flight per chunk (benchmarks compare them). */
enum { GPU_HASH_VARIANT_AUTO = 0, GPU_HASH_VARIANT_U4, GPU_HASH_VARIANT_U8 };

/*
 * XXH3-128 (seed 0, default secret: libxxhash's XXH3_128bits()) of each
 * chunk of [src, src + len) on the device: chunk i is the `chunk` bytes at
 * src + i * chunk, the last one possibly shorter (len need not be a
 * multiple).  out[i] (host memory, ceil(len / chunk) entries) receives
 * XXH128_canonicalFromHash() of chunk i's hash: high64 then low64, each
 * big-endian, i.e. memcmp() orders hashes as numbers.  src must be 16-byte
 * aligned; chunk a power of two in [GPU_HASH_CHUNK_MIN, GPU_HASH_CHUNK_MAX].
 * Synchronous; calls are serialised.  Returns 0, -EINVAL, -ENODEV (no
 * gpu_init()), -ENOMEM or -EIO; -EOPNOTSUPP without CUDA.
 */
int gpu_hash_chunks(uint64_t src, uint64_t len, uint64_t chunk,
		    uint8_t (*out)[GPU_HASH_SIZE]);
/* The same into device memory dst (16-byte aligned), with a given kernel
 * (GPU_HASH_VARIANT_*). */
int gpu_hash_chunks_dev(uint64_t src, uint64_t len, uint64_t chunk,
			uint64_t dst, int variant);
/* Read [src, src + len) once and discard it (both 16-byte multiples): the
 * device's read bandwidth, the roofline of the hash (benchmarks). */
int gpu_hash_readbw(uint64_t src, uint64_t len);
/* One line on the loaded kernels (registers, code version, SMs). */
int gpu_hash_describe(char *buf, size_t len);

#endif /* TIERFS_GPU_H */
