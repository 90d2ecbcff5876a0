/*
 * blkrec.c - a disk that remembers the order of its writes and cache
 * flushes, for the crash-state tests (tests/test_crash_states.py).
 *
 * blkrec IMAGE LOG MOUNTPOINT serves one file, MOUNTPOINT/disk, whose
 * content starts as IMAGE's (read into memory; IMAGE is not changed).  A
 * loop device over MOUNTPOINT/disk is then a block device whose every
 * completed write and every cache flush (the loop driver's REQ_PREFLUSH
 * and emulated FUA become fsync of its backing file) reaches this process
 * in the order the block layer completed them, and is appended to LOG:
 *
 *   struct rec { uint32_t type; uint32_t len; uint64_t off; } + len bytes
 *   type 1: a write of len bytes at off (the bytes follow)
 *   type 2: a cache flush (len 0): every write before it is durable
 *   type 3: a mark (the bytes written to MOUNTPOINT/mark follow): the
 *           test's note of an event, e.g. "an fsync returned"
 *
 * A power cut at any moment leaves the writes before the last completed
 * flush, and any subset of those after it; the test replays LOG into such
 * states and mounts them.  Files are opened with direct_io, so the kernel
 * keeps no page cache of the disk: each write of the loop device is one
 * WRITE here.  Single-threaded (-s), so the log's order is the order of
 * completion.  Runs in the foreground; `umount MOUNTPOINT` ends it.
 */
#define FUSE_USE_VERSION 31
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct rec {
	uint32_t type;
	uint32_t len;
	uint64_t off;
};

static uint8_t *disk;
static size_t disk_size;
static FILE *logf;

static void log_rec(uint32_t type, uint64_t off, const void *buf, uint32_t len)
{
	struct rec r = { type, len, off };

	if (fwrite(&r, sizeof(r), 1, logf) != 1 || (len && fwrite(buf, len, 1, logf) != 1)) {
		perror("blkrec: log");
		exit(1);
	}
}

static int br_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	(void)fi;
	memset(st, 0, sizeof(*st));
	if (strcmp(path, "/") == 0) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else if (strcmp(path, "/disk") == 0) {
		st->st_mode = S_IFREG | 0600;
		st->st_nlink = 1;
		st->st_size = (off_t)disk_size;
	} else if (strcmp(path, "/mark") == 0) {
		st->st_mode = S_IFREG | 0200;
		st->st_nlink = 1;
	} else {
		return -ENOENT;
	}
	return 0;
}

static int br_open(const char *path, struct fuse_file_info *fi)
{
	if (strcmp(path, "/disk") && strcmp(path, "/mark"))
		return -ENOENT;
	fi->direct_io = 1;
	return 0;
}

static int br_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	(void)fi;
	if (strcmp(path, "/mark") == 0)
		return 0;
	return size == (off_t)disk_size ? 0 : -EINVAL;
}

static int br_read(const char *path, char *buf, size_t len, off_t off,
		   struct fuse_file_info *fi)
{
	(void)fi;
	if (strcmp(path, "/disk"))
		return 0;
	if (off < 0 || (size_t)off >= disk_size)
		return 0;
	if (len > disk_size - (size_t)off)
		len = disk_size - (size_t)off;
	memcpy(buf, disk + off, len);
	return (int)len;
}

static int br_write(const char *path, const char *buf, size_t len, off_t off,
		    struct fuse_file_info *fi)
{
	(void)fi;
	if (strcmp(path, "/mark") == 0) {
		log_rec(3, 0, buf, (uint32_t)len);
		fflush(logf);
		return (int)len;
	}
	if (off < 0 || (size_t)off > disk_size || len > disk_size - (size_t)off)
		return -ENOSPC;
	memcpy(disk + off, buf, len);
	log_rec(1, (uint64_t)off, buf, (uint32_t)len);
	return (int)len;
}

static int br_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	(void)fi;
	if (strcmp(path, "/disk") == 0) {
		log_rec(2, 0, NULL, 0);
		fflush(logf);
	}
	return 0;
}

static int br_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
		      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)off;
	(void)fi;
	(void)flags;
	if (strcmp(path, "/"))
		return -ENOENT;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	fill(buf, "disk", NULL, 0, 0);
	fill(buf, "mark", NULL, 0, 0);
	return 0;
}

static void br_destroy(void *data)
{
	(void)data;
	fflush(logf);
}

static const struct fuse_operations ops = {
	.getattr = br_getattr,
	.open = br_open,
	.truncate = br_truncate,
	.read = br_read,
	.write = br_write,
	.fsync = br_fsync,
	.readdir = br_readdir,
	.destroy = br_destroy,
};

int main(int argc, char **argv)
{
	struct stat st;
	int fd;

	if (argc != 4) {
		fprintf(stderr, "usage: blkrec IMAGE LOG MOUNTPOINT\n");
		return 2;
	}
	fd = open(argv[1], O_RDONLY);
	if (fd < 0 || fstat(fd, &st) < 0) {
		perror(argv[1]);
		return 1;
	}
	disk_size = (size_t)st.st_size;
	disk = malloc(disk_size);
	if (!disk) {
		perror("blkrec: malloc");
		return 1;
	}
	for (size_t at = 0; at < disk_size;) {
		ssize_t n = pread(fd, disk + at, disk_size - at, (off_t)at);

		if (n <= 0) {
			perror(argv[1]);
			return 1;
		}
		at += (size_t)n;
	}
	close(fd);
	logf = fopen(argv[2], "w");
	if (!logf) {
		perror(argv[2]);
		return 1;
	}
	setvbuf(logf, NULL, _IOFBF, 1 << 20);
	char *fargv[] = { argv[0], "-f", "-s", argv[3], NULL };

	return fuse_main(4, fargv, &ops, NULL);
}
