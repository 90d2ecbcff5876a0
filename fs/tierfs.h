/*
 * tierfs.h - the public interface of tierfs: extended attribute names and
 * the GPU zero-copy ioctl ABI.  Installed; plain C, no CUDA needed.
 */
#ifndef TIERFS_PUBLIC_H
#define TIERFS_PUBLIC_H

#include <stdint.h>
#include <sys/ioctl.h>

/** Prefix of every tierfs extended attribute. */
#define TIERFS_XATTR_PREFIX		"user.tierfs."
/** Directory, write: names (one per line) appended to the restore queue;
 *  read: what remains of the queue. */
#define TIERFS_XATTR_RESTORE_ORDER	"user.tierfs.restore_order"
/** Directory, write: "start" or "stop" prefetching. */
#define TIERFS_XATTR_PREFETCH		"user.tierfs.prefetch"
/** File, write (any value): enqueue this file (single-hint mode). */
#define TIERFS_XATTR_RESTORE_NEXT	"user.tierfs.restore_next"
/** File, read-only: tiers holding a copy, fastest first ("host,ssd"). */
#define TIERFS_XATTR_TIER		"user.tierfs.tier"
/** File, read-only: life-cycle state per tier ("host:FLUSHED,ssd:CURRENT"). */
#define TIERFS_XATTR_STATE		"user.tierfs.state"
/** Mount root, read-only: statistics as JSON. */
#define TIERFS_XATTR_STATS		"user.tierfs.stats"

#endif /* TIERFS_PUBLIC_H */
