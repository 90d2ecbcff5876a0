/*
 * filecopy.c - a file's bytes copied at the same offsets, holes kept
 * (filecopy.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "filecopy.h"

void fc_next_run(int fd, loff_t pos, loff_t end, loff_t *data, loff_t *hole)
{
	loff_t d = lseek(fd, pos, SEEK_DATA), h;

	if (d < 0 && errno == ENXIO)
		d = end;		/* a hole to the end of the file */
	else if (d < 0)
		d = pos;		/* cannot say: data */
	if (d > end)
		d = end;
	*data = d;
	if (d == end) {
		*hole = end;
		return;
	}
	h = lseek(fd, d, SEEK_HOLE);
	*hole = h < 0 || h > end ? end : h;
}

int fc_copy_range(int src, int dst, loff_t from, loff_t to, bool *plain)
{
	char buf[65536];
	loff_t i = from, o = from;

	while (i < to) {
		size_t len = (size_t)(to - i);
		ssize_t n;

		if (!*plain) {
			n = copy_file_range(src, &i, dst, &o, len, 0);
			if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP ||
				      errno == ENOSYS)) {
				*plain = true;
				continue;
			}
		} else {
			n = pread(src, buf, len < sizeof(buf) ? len : sizeof(buf), i);
			if (n > 0 && pwrite(dst, buf, (size_t)n, o) != n)
				n = -1;
			if (n > 0) {
				i += n;
				o += n;
			}
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;	/* src is short */
	}
	return 0;
}

int fc_clear_range(int dst, loff_t from, loff_t to)
{
	static const char zeros[65536];

	if (from >= to)
		return 0;
	if (fallocate(dst, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, from, to - from) == 0)
		return 0;
	if (errno != EOPNOTSUPP && errno != ENOSYS)
		return -errno;
	while (from < to) {
		size_t len = (size_t)(to - from) < sizeof(zeros) ? (size_t)(to - from)
								  : sizeof(zeros);
		ssize_t n = pwrite(dst, zeros, len, from);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		from += n;
	}
	return 0;
}

/* Is block [b, b + blk) of buf (cut at end) all zeros? */
static bool zero_block(const uint8_t *buf, uint64_t b, uint64_t blk, uint64_t end)
{
	size_t n = end - b < blk ? (size_t)(end - b) : (size_t)blk;
	const uint8_t *p = buf + b;

	return !p[0] && !memcmp(p, p + 1, n - 1);
}

uint64_t fc_zero_run(const uint8_t *buf, uint64_t pos, uint64_t end, uint64_t blk, uint64_t min,
		     bool end_hole, bool *hole)
{
	uint64_t b = pos, zs;	/* zs: where the current zero blocks start */

	while (b < end && zero_block(buf, b, blk, end))
		b += blk;
	b = b < end ? b : end;
	if (b > pos && (b - pos >= min || (end_hole && b == end))) {
		*hole = true;
		return b;
	}
	*hole = false;
	for (zs = end; b < end; b += blk) {
		if (!zero_block(buf, b, blk, end)) {
			zs = end;
			continue;
		}
		if (zs == end)
			zs = b;
		if ((b + blk < end ? b + blk : end) - zs >= min)
			return zs;
	}
	return end_hole ? zs : end;	/* zeros to the end: the next run */
}
