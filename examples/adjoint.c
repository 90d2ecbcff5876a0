/*
 * adjoint.c - an adjoint (reverse time migration style) computation that
 * checkpoints through tierfs with plain stdio.
 *
 * usage: adjoint DIR [NX] [STEPS] [EVERY]
 *
 * The forward pass propagates a 1-D wave field u (NX points, default
 * 131072: 1 MiB a state) for STEPS time steps (default 200) from a source,
 * records it at a receiver, and writes a checkpoint of its two last states
 * every EVERY steps (default 10) into DIR/fwd-NNNNN with fopen/fwrite.
 * The backward pass needs the forward states in reverse order: it declares
 * that order to tierfs (user.tierfs.restore_order on DIR, newest first), so
 * tierfs prefetches the checkpoints from the SSD ahead of the reads; reads
 * each checkpoint back with fread, recomputes its segment of forward states,
 * and correlates them with the adjoint field propagated backwards from the
 * receiver (the imaging condition of reverse time migration).
 *
 * Every recomputed state is checked against a hash taken in the forward pass:
 * a checkpoint that came back wrong is reported.  Exit status 0 when all
 * match, 1 otherwise.  On another file system the hint is refused and the
 * program runs all the same (hints are advice).
 *
 *	cc -O2 adjoint.c -o adjoint -lm   (tierfs.h installed)
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include <tierfs.h>

struct run {
	const char *dir;
	long nx, steps, every;
	long src, rcv;
	double c2;
	uint64_t *hash;		/* hash of u after each forward step */
	double *trace;		/* the receiver's record */
};

static uint64_t fnv(const double *u, long n)
{
	const unsigned char *p = (const unsigned char *)u;
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < (size_t)n * sizeof(*u); i++)
		h = (h ^ p[i]) * 1099511628211ULL;
	return h;
}

static double ricker(long t)
{
	double a = (t - 25) * 0.08;

	return (1 - 2 * a * a) * exp(-a * a);
}

/* One step of the wave equation: next from cur and prev (fixed ends). */
static void step(const struct run *r, const double *prev, const double *cur, double *next)
{
	next[0] = next[r->nx - 1] = 0;
	for (long i = 1; i < r->nx - 1; i++)
		next[i] = 2 * cur[i] - prev[i] + r->c2 * (cur[i + 1] - 2 * cur[i] + cur[i - 1]);
}

static void ckpt_name(const struct run *r, long k, char *buf, size_t len)
{
	snprintf(buf, len, "%s/fwd-%05ld", r->dir, k);
}

static int save(const struct run *r, long k, const double *prev, const double *cur)
{
	char path[4096];
	FILE *f;

	ckpt_name(r, k, path, sizeof(path));
	f = fopen(path, "wb");
	if (!f || fwrite(prev, sizeof(*prev), r->nx, f) != (size_t)r->nx ||
	    fwrite(cur, sizeof(*cur), r->nx, f) != (size_t)r->nx) {
		perror(path);
		if (f)
			fclose(f);
		return -1;
	}
	if (fclose(f)) {		/* tierfs: the data is in a cache tier */
		perror(path);
		return -1;
	}
	return 0;
}

static int load(const struct run *r, long k, double *prev, double *cur)
{
	char path[4096], tier[64] = "";
	ssize_t n;
	FILE *f;

	ckpt_name(r, k, path, sizeof(path));
	n = getxattr(path, TIERFS_XATTR_TIER, tier, sizeof(tier) - 1);
	tier[n > 0 ? n : 0] = 0;
	f = fopen(path, "rb");
	if (!f || fread(prev, sizeof(*prev), r->nx, f) != (size_t)r->nx ||
	    fread(cur, sizeof(*cur), r->nx, f) != (size_t)r->nx || fgetc(f) != EOF) {
		fprintf(stderr, "%s: %s\n", path, f && !ferror(f) ? "short or long" : strerror(errno));
		if (f)
			fclose(f);
		return -1;
	}
	fclose(f);
	printf("  read fwd-%05ld (%s)\n", k, *tier ? tier : "not tierfs");
	return 0;
}

/* The restore order: the checkpoints newest first.  Advice only. */
static void hint(const struct run *r, long nckpt)
{
	size_t len = (size_t)nckpt * 16 + 1, n = 0;
	char *list = malloc(len);

	if (!list)
		return;
	/* only tierfs has user.tierfs.prefetch: elsewhere setxattr would just
	 * store a stray attribute */
	if (getxattr(r->dir, TIERFS_XATTR_PREFETCH, list, len) < 0) {
		printf("restore order not set (%s is not on tierfs): reading without prefetch\n",
		       r->dir);
		free(list);
		return;
	}
	for (long k = nckpt - 1; k >= 0; k--)
		n += (size_t)snprintf(list + n, len - n, "fwd-%05ld\n", k);
	if (setxattr(r->dir, TIERFS_XATTR_RESTORE_ORDER, list, n, 0))
		printf("restore order not set (%s): reading without prefetch\n", strerror(errno));
	else
		printf("restore order set: %ld checkpoints, newest first\n", nckpt);
	free(list);
}

static int forward(struct run *r)
{
	double *a = calloc(r->nx, sizeof(double)), *b = calloc(r->nx, sizeof(double));
	double *c = calloc(r->nx, sizeof(double)), *t;
	int ret = 0;

	if (!a || !b || !c)
		return -1;
	for (long s = 0; s < r->steps && !ret; s++) {
		if (s % r->every == 0)
			ret = save(r, s / r->every, a, b);	/* state before step s */
		step(r, a, b, c);
		c[r->src] += ricker(s);
		r->trace[s] = c[r->rcv];
		r->hash[s] = fnv(c, r->nx);
		t = a, a = b, b = c, c = t;
	}
	free(a), free(b), free(c);
	return ret;
}

/* Backward: adjoint field q driven by the time-reversed trace; image +=
 * u(s) * q(s).  u(s) for a segment is recomputed from its checkpoint. */
static int backward(struct run *r, double *image, long *bad)
{
	long nck = (r->steps + r->every - 1) / r->every;
	double *seg = malloc((size_t)(r->every + 2) * r->nx * sizeof(double));
	double *q0 = calloc(r->nx, sizeof(double)), *q1 = calloc(r->nx, sizeof(double));
	double *q2 = calloc(r->nx, sizeof(double)), *t;

	if (!seg || !q0 || !q1 || !q2)
		return -1;
	hint(r, nck);
	for (long k = nck - 1; k >= 0; k--) {
		long s0 = k * r->every, s1 = s0 + r->every < r->steps ? s0 + r->every : r->steps;

		if (load(r, k, seg, seg + r->nx))
			return -1;
		for (long s = s0; s < s1; s++) {	/* seg[j + 2] is u after step s0 + j */
			double *u = seg + (s - s0 + 2) * r->nx;

			step(r, u - 2 * r->nx, u - r->nx, u);
			u[r->src] += ricker(s);
			if (fnv(u, r->nx) != r->hash[s])
				(*bad)++;
		}
		for (long s = s1 - 1; s >= s0; s--) {
			const double *u = seg + (s - s0 + 2) * r->nx;

			step(r, q0, q1, q2);
			q2[r->rcv] += r->trace[s];
			for (long i = 0; i < r->nx; i++)
				image[i] += u[i] * q2[i];
			t = q0, q0 = q1, q1 = q2, q2 = t;
		}
	}
	free(seg), free(q0), free(q1), free(q2);
	return 0;
}

int main(int argc, char *argv[])
{
	struct run r = { 0 };
	double *image, norm = 0;
	long bad = 0;

	if (argc < 2 || argc > 5) {
		fprintf(stderr, "usage: %s DIR [NX] [STEPS] [EVERY]\n", argv[0]);
		return 2;
	}
	r.dir = argv[1];
	r.nx = argc > 2 ? atol(argv[2]) : 131072;
	r.steps = argc > 3 ? atol(argv[3]) : 200;
	r.every = argc > 4 ? atol(argv[4]) : 10;
	if (r.nx < 16 || r.steps < 1 || r.every < 1) {
		fprintf(stderr, "%s: NX >= 16, STEPS >= 1, EVERY >= 1\n", argv[0]);
		return 2;
	}
	r.src = r.nx / 2 - 20;	/* the wave moves half a point a step */
	r.rcv = r.nx / 2 + 20;
	r.c2 = 0.25;
	r.hash = calloc(r.steps, sizeof(*r.hash));
	r.trace = calloc(r.steps, sizeof(*r.trace));
	image = calloc(r.nx, sizeof(*image));
	if (!r.hash || !r.trace || !image)
		return 1;
	printf("forward: %ld steps of %ld points, a checkpoint every %ld steps in %s\n",
	       r.steps, r.nx, r.every, r.dir);
	if (forward(&r))
		return 1;
	printf("backward:\n");
	if (backward(&r, image, &bad))
		return 1;
	for (long i = 0; i < r.nx; i++)
		norm += image[i] * image[i];
	if (bad) {
		printf("FAILED: %ld recomputed states differ from the forward pass\n", bad);
		return 1;
	}
	printf("all %ld recomputed states match the forward pass; image norm %.6e\n",
	       r.steps, sqrt(norm));
	free(r.hash), free(r.trace), free(image);
	return 0;
}
