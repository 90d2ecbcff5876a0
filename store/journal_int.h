/*
 * journal_int.h - what journal.c lends records.c, inside the store: not
 * for callers of journal.h.
 */
#ifndef TIERFS_JOURNAL_INT_H
#define TIERFS_JOURNAL_INT_H

#include <stdint.h>
#include <sys/uio.h>

/* pwritev all of iov (iovcnt, total bytes) at off: 0 or -errno.  iov is
 * used up (advanced past what was written). */
int jnl_pwrite_all(int fd, struct iovec *iov, int iovcnt, uint64_t total, uint64_t off);

#endif
