/*
 * test_libtierfs.c - tierfs_restore_order(), tierfs_restore_queue(),
 * tierfs_stats() and tierfs_wait_flushed() against a tierfs mount.
 *
 * usage: test_libtierfs MOUNTPOINT [PLAIN_DIR]
 * Run by tests/test_libtierfs.py; alone (no argument) it exits 77 (skip).
 * Prints "ok N - what" per check; exit status 0 when all pass.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "tierfs.h"

static int failed, n;

#define CHECK(cond, ...) do {						\
	n++;								\
	if (cond) {							\
		printf("ok %d - ", n);					\
	} else {							\
		printf("not ok %d - ", n);				\
		failed++;						\
	}								\
	printf(__VA_ARGS__);						\
	printf(" (line %d, errno %s)\n", __LINE__, strerror(errno));	\
} while (0)

static char *queued(const char *dir)
{
	static char buf[1 << 16];
	ssize_t r = getxattr(dir, TIERFS_XATTR_RESTORE_ORDER, buf, sizeof(buf) - 1);

	buf[r > 0 ? r : 0] = 0;
	return r < 0 ? NULL : buf;
}

static void write_file(const char *path, size_t size)
{
	char *b = malloc(size);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	memset(b, 'x', size);
	if (fd < 0 || write(fd, b, size) != (ssize_t)size || close(fd)) {
		perror(path);
		exit(1);
	}
	free(b);
}

int main(int argc, char *argv[])
{
	char dir[4096], path[4200], sub[4200];
	const char *names[] = { "c", "b", "a" };
	const char *bad1[] = { "ok", "x/y" }, *bad2[] = { "sub" }, *bad3[] = { ".tierfs-x" };
	const char **many;
	size_t bad = 99, i;
	char *st;

	if (argc < 2) {
		fprintf(stderr, "usage: %s MOUNTPOINT [PLAIN_DIR]\n", argv[0]);
		return 77;
	}
	snprintf(dir, sizeof(dir), "%s/lib", argv[1]);
	snprintf(sub, sizeof(sub), "%s/sub", dir);
	if (mkdir(dir, 0755) || mkdir(sub, 0755)) {
		perror(dir);
		return 1;
	}

	CHECK(tierfs_restore_order(dir, names, 3, &bad) == 0, "restore_order of 3 names");
	CHECK(queued(dir) && !strcmp(queued(dir), "c\nb\na\n"), "queued: %s", queued(dir));
	CHECK(tierfs_restore_order(dir, bad1, 2, &bad) == -1 && errno == EINVAL && bad == 1,
	      "a name with '/' refused at index %zu", bad);
	CHECK(tierfs_restore_order(dir, bad2, 1, &bad) == -1 && errno == EINVAL && bad == 0,
	      "a directory refused");
	CHECK(tierfs_restore_order(dir, bad3, 1, &bad) == -1 && errno == EINVAL,
	      ".tierfs names refused");
	CHECK(tierfs_restore_order(dir, names, 0, NULL) == -1 && errno == EINVAL, "no names");
	CHECK(!strcmp(queued(dir), "c\nb\na\n"), "nothing sent by the refused calls");
	removexattr(dir, TIERFS_XATTR_RESTORE_ORDER);

	/* 600 names of 200 bytes: more than 64 KiB, several writes */
	many = calloc(600, sizeof(*many));
	for (i = 0; i < 600; i++) {
		char *s = malloc(201);

		memset(s, 'n', 200);
		snprintf(s, 201, "%0200zu", i);
		many[i] = s;
	}
	CHECK(tierfs_restore_order(dir, many, 600, NULL) == 0, "600 long names");
	st = tierfs_stats(argv[1]);
	CHECK(st && strstr(st, "\"queue\":600"), "the queue holds 600 entries");
	free(st);
	removexattr(dir, TIERFS_XATTR_RESTORE_ORDER);

	/* 20,000 names (about 400 KiB): appended and listed back whole, in
	 * order, although one value holds 64 KiB */
	{
		const size_t N = 20000;
		const char **big = calloc(N, sizeof(*big));
		char **got;
		size_t k, same = 0, ngot = 0;

		for (k = 0; k < N; k++) {
			char *s = malloc(24);

			snprintf(s, 24, "shard-%06zu.pt", k);
			big[k] = s;
		}
		CHECK(tierfs_restore_order(dir, big, N, NULL) == 0, "20000 names appended");
		got = tierfs_restore_queue(dir, &ngot);
		for (k = 0; got && k < N && k < ngot; k++)
			same += !strcmp(got[k], big[k]);
		CHECK(got && ngot == N && same == N && got[N] == NULL,
		      "tierfs_restore_queue: %zu names, %zu in place", ngot, same);
		free(got);
		removexattr(dir, TIERFS_XATTR_RESTORE_ORDER);
		got = tierfs_restore_queue(dir, &ngot);
		CHECK(got && ngot == 0 && got[0] == NULL, "an empty queue: no names");
		free(got);
		for (k = 0; k < N; k++)
			free((char *)big[k]);
		free(big);
	}

	st = tierfs_stats(argv[1]);
	CHECK(st && st[0] == '{' && strstr(st, "\"tiers\"") && strstr(st, "\"ssd\""),
	      "tierfs_stats: JSON text");
	free(st);
	st = tierfs_stats(dir);
	CHECK(st && strstr(st, "\"tiers\""), "stats of a subdirectory: the mount's");
	free(st);

	snprintf(path, sizeof(path), "%s/f", dir);
	write_file(path, 4 << 20);
	CHECK(tierfs_wait_flushed(path, 60000) == 0, "wait_flushed(file)");
	{
		char s[256];
		ssize_t r = getxattr(path, TIERFS_XATTR_STATE, s, sizeof(s) - 1);

		s[r > 0 ? r : 0] = 0;
		CHECK(strstr(s, "ssd:CURRENT") != NULL, "the file is on the SSD: %s", s);
	}
	/* the mount's flush_age is a minute (test_libtierfs.py): the wait
	 * asks for a small file's flush, or it would time out */
	snprintf(path, sizeof(path), "%s/small", dir);
	write_file(path, 8192);
	CHECK(tierfs_wait_flushed(path, 20000) == 0, "wait_flushed(small file): not its age");
	for (i = 0; i < 4; i++) {
		snprintf(path, sizeof(path), "%s/g%zu", dir, i);
		write_file(path, 4 << 20);
	}
	snprintf(path, sizeof(path), "%s/small2", dir);
	write_file(path, 8192);
	CHECK(tierfs_wait_flushed(sub, 20000) == 0, "wait_flushed(a subdirectory): the mount");
	st = tierfs_stats(argv[1]);
	CHECK(st && strstr(st, "\"flush_backlog\":0"), "backlog 0 after the wait");
	free(st);

	if (argc > 2) {
		const char *one[] = { "x" };

		CHECK(tierfs_restore_order(argv[2], one, 1, NULL) == -1 && errno == ENOTSUP,
		      "restore_order on another file system");
		CHECK(tierfs_stats(argv[2]) == NULL && errno == ENOTSUP,
		      "stats of another file system");
		CHECK(tierfs_restore_queue(argv[2], NULL) == NULL && errno == ENOTSUP,
		      "restore_queue on another file system");
		CHECK(tierfs_wait_flushed(argv[2], 0) == -1 && errno == ENOTSUP,
		      "wait_flushed on another file system");
	}
	CHECK(tierfs_wait_flushed("/nonexistent/x", 0) == -1 && errno == ENOENT, "ENOENT");
	printf("%d of %d checks failed\n", failed, n);
	return failed ? 1 : 0;
}
