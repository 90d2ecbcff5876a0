/*
 * filecopy.h - copying a file's bytes between descriptors at the same
 * offsets, holes kept: the data runs found with SEEK_DATA / SEEK_HOLE,
 * each copied with copy_file_range (extents shared where the file system
 * can), reads and writes where it cannot.  Used by tiers/backing.c (a new
 * version made from the backing file) and store/records.c (a hard-linked
 * file's new version copied over it in place).  And where a buffer's runs
 * of zeros are (fc_zero_run): the holes that tiers/backing.c leaves in a
 * new version and that store/records.c punches when it applies a record.
 * No lock, no allocation.
 */
#ifndef TIERFS_FILECOPY_H
#define TIERFS_FILECOPY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * The first data run of fd at or after pos, below end: [*data, *hole).
 * *data == end: none (a hole to end).  Where fd cannot say (no SEEK_DATA),
 * all of [pos, end) is data.
 */
void fc_next_run(int fd, loff_t pos, loff_t end, loff_t *data, loff_t *hole);

/*
 * Copy src's bytes [from, to) over dst at the same offsets.  *plain: set
 * once copy_file_range is refused (EXDEV, EINVAL, EOPNOTSUPP, ENOSYS),
 * reads and writes from then on; start it false.  0, -errno, or -EIO where
 * src ends before to.
 */
int fc_copy_range(int src, int dst, loff_t from, loff_t to, bool *plain);

/*
 * dst's bytes [from, to) read as zeros: their blocks freed (a punched hole,
 * the size kept), or zeros written where the file system cannot punch.
 * 0 / -errno.
 */
int fc_clear_range(int dst, loff_t from, loff_t to);

/* The shortest run of zeros left a hole (whole blocks): a new version's
 * (tiers/backing.c, SPARSE_RUN) and a journal record's applied in place
 * (store/records.c), so that a hole stays a hole either way. */
#define FC_HOLE_RUN	(64u << 10)

/*
 * The run of buf that starts at pos (a multiple of blk; buf[0] is at a
 * multiple of blk in its file), below end: its end.  A hole (*hole true)
 * where whole zero blocks start at pos, min bytes or more of them, or
 * (end_hole) zeros reach end, a short last block included; else data, up
 * to where such a hole starts, or to end.  Runs tile [pos, end).
 */
uint64_t fc_zero_run(const uint8_t *buf, uint64_t pos, uint64_t end, uint64_t blk, uint64_t min,
		     bool end_hole, bool *hole);

#endif
