/*
 * bench_balance_gpu - the checkpoint load-balancing schedules of
 * tiers/balance.c carried out on the GPUs of this machine.
 *
 * Every GPU "checkpoints" at once: GPU i copies ckpt[i] bytes from a
 * source buffer in its own memory into cache space.  Its cache has free[i]
 * bytes; what does not fit (the overflow) goes where the schedule says: to
 * peers' spare room over peer-to-peer copies, or to pinned host memory.
 * Each policy's plan is computed by balance_plan() from the link
 * bandwidths measured here first (the probe), then executed: one stream per
 * link (local, each peer, host), all launched together; the group blocking
 * time is the time from the launch until the last copy ended.  Printed per
 * policy: the plan's modelled time, the measured time, and the measured
 * time against maxflow's.  The probe's table also gives each link's
 * bandwidth through the same copy calls against a raw cuMemcpyPeer of the
 * same size between two plain allocations (the baseline of the issue).
 *
 * usage: bench_balance_gpu [-r REPEAT] [-s MiB] CKPT:FREE[,CKPT:FREE...]...
 *   CKPT:FREE   one GPU's checkpoint and free cache in MiB (one pair per
 *               GPU, in device order; several lists = several scenarios)
 *   -s MiB      probe transfer size (default 256)
 *   -r REPEAT   runs per policy and scenario, median reported (default 7)
 * Without scenarios: the MASCOTS'21 shape on the GPUs present (one GPU
 * checkpoints more than its cache holds, the others less), at 128 MiB free
 * on the full GPU.
 *
 * Exit 0, 77 when there is no CUDA driver or device, 1 on an error.
 */
#include <cuda.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../tiers/balance.h"

#define MiB		(1024.0 * 1024.0)
#define MAXG		8		/* GPUs used at most */
#define MAXSCEN		16

#define CK(call) do {							\
	CUresult r_ = (call);						\
	if (r_ != CUDA_SUCCESS) {					\
		const char *s_ = "?";					\
		cuGetErrorString(r_, &s_);				\
		fprintf(stderr, "bench_balance_gpu: %s: %s (line %d)\n",	\
			#call, s_, __LINE__);				\
		exit(1);						\
	}								\
} while (0)

struct gpu {
	CUcontext ctx;
	CUstream s_local, s_host, s_peer[MAXG];
	CUdeviceptr src;		/* the checkpoint */
	CUdeviceptr cache;		/* cache space: own data, then peers' */
	size_t src_len, cache_len;
	char name[128];
};

static unsigned ng;
static struct gpu g[MAXG];
static void *host_buf;			/* pinned, portable */
static size_t host_len;
static int peer_ok[MAXG][MAXG];

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void sync_all(void)
{
	for (unsigned i = 0; i < ng; i++) {
		CK(cuCtxSetCurrent(g[i].ctx));
		CK(cuCtxSynchronize());
	}
}

/* Make sure GPU i has a source of n bytes and cache space of c bytes. */
static void ensure(unsigned i, size_t n, size_t c)
{
	CK(cuCtxSetCurrent(g[i].ctx));
	if (n > g[i].src_len) {
		if (g[i].src)
			CK(cuMemFree(g[i].src));
		CK(cuMemAlloc(&g[i].src, n));
		CK(cuMemsetD8(g[i].src, (unsigned char)(0x40 + i), n));
		g[i].src_len = n;
	}
	if (c > g[i].cache_len) {
		if (g[i].cache)
			CK(cuMemFree(g[i].cache));
		CK(cuMemAlloc(&g[i].cache, c));
		g[i].cache_len = c;
	}
}

static void ensure_host(size_t n)
{
	if (n <= host_len)
		return;
	CK(cuCtxSetCurrent(g[0].ctx));
	if (host_buf)
		CK(cuMemFreeHost(host_buf));
	CK(cuMemHostAlloc(&host_buf, n, CU_MEMHOSTALLOC_PORTABLE));
	memset(host_buf, 0, n);
	host_len = n;
}

/* ---- the probe ---------------------------------------------------------- */

enum link { L_LOCAL, L_PEER, L_HOST };

/* bytes/s of one link: median of reps copies of len bytes */
static double probe(enum link k, unsigned i, unsigned j, size_t len, int reps)
{
	double t[16];

	if (reps > 16)
		reps = 16;
	for (int r = -1; r < reps; r++) {	/* r = -1: warm-up */
		double t0;

		CK(cuCtxSetCurrent(g[i].ctx));
		t0 = now();
		if (k == L_LOCAL)
			CK(cuMemcpyDtoDAsync(g[i].cache, g[i].src, len, g[i].s_local));
		else if (k == L_PEER)
			CK(cuMemcpyPeerAsync(g[j].cache, g[j].ctx, g[i].src, g[i].ctx, len,
					     g[i].s_peer[j]));
		else
			CK(cuMemcpyDtoHAsync(host_buf, g[i].src, len, g[i].s_host));
		sync_all();
		if (r >= 0)
			t[r] = now() - t0;
	}
	return (double)len / median(t, reps);
}

/* raw baseline: cuMemcpyPeer (synchronous, default stream) between two
 * fresh allocations, nothing else in flight */
static double probe_raw_peer(unsigned i, unsigned j, size_t len, int reps)
{
	CUdeviceptr a, b;
	double t[16];

	if (reps > 16)
		reps = 16;
	CK(cuCtxSetCurrent(g[i].ctx));
	CK(cuMemAlloc(&a, len));
	CK(cuCtxSetCurrent(g[j].ctx));
	CK(cuMemAlloc(&b, len));
	for (int r = -1; r < reps; r++) {
		double t0;

		CK(cuCtxSetCurrent(g[i].ctx));
		t0 = now();
		CK(cuMemcpyPeer(b, g[j].ctx, a, g[i].ctx, len));
		CK(cuCtxSynchronize());
		if (r >= 0)
			t[r] = now() - t0;
	}
	CK(cuMemFree(a));
	CK(cuCtxSetCurrent(g[j].ctx));
	CK(cuMemFree(b));
	return (double)len / median(t, reps);
}

/* ---- executing a plan --------------------------------------------------- */

/* Launch every copy of plan p on its link's stream, wait for all; seconds. */
static double execute(const struct balance_plan *p)
{
	size_t used[MAXG] = { 0 }, hoff = 0;
	double t0;

	for (unsigned i = 0; i < ng; i++)	/* own data first in each cache */
		used[i] = p->to_gpu[i][i];
	sync_all();
	t0 = now();
	for (unsigned i = 0; i < ng; i++) {
		size_t soff = 0;

		CK(cuCtxSetCurrent(g[i].ctx));
		if (p->to_gpu[i][i])
			CK(cuMemcpyDtoDAsync(g[i].cache, g[i].src, p->to_gpu[i][i],
					     g[i].s_local));
		soff = p->to_gpu[i][i];
		for (unsigned j = 0; j < ng; j++) {
			size_t n = p->to_gpu[i][j];

			if (j == i || !n)
				continue;
			CK(cuMemcpyPeerAsync(g[j].cache + used[j], g[j].ctx, g[i].src + soff,
					     g[i].ctx, n, g[i].s_peer[j]));
			used[j] += n;
			soff += n;
		}
		if (p->to_host[i]) {
			CK(cuMemcpyDtoHAsync((char *)host_buf + hoff, g[i].src + soff,
					     p->to_host[i], g[i].s_host));
			hoff += p->to_host[i];
		}
	}
	sync_all();
	return now() - t0;
}

/* ---- main --------------------------------------------------------------- */

static int parse_scenario(const char *s, uint64_t *ckpt, uint64_t *fr)
{
	unsigned n = 0;

	while (*s) {
		char *end;
		double c = strtod(s, &end), f;

		if (end == s || *end != ':' || n >= ng)
			return -1;
		s = end + 1;
		f = strtod(s, &end);
		if (end == s || (*end && *end != ',') || c < 0 || f < 0)
			return -1;
		ckpt[n] = (uint64_t)(c * MiB);
		fr[n] = (uint64_t)(f * MiB);
		n++;
		s = *end ? end + 1 : end;
	}
	return n == ng ? 0 : -1;
}

int main(int argc, char **argv)
{
	static const enum balance_policy pol[] = {
		BALANCE_HOST, BALANCE_GREEDY, BALANCE_MINCOST, BALANCE_MAXFLOW };
	uint64_t ckpt[MAXSCEN][MAXG], fr[MAXSCEN][MAXG];
	struct balance_node node;
	size_t plen = 256u << 20;
	int reps = 7, nscen = 0, opt, count;
	CUresult cr;

	while ((opt = getopt(argc, argv, "r:s:h")) != -1) {
		switch (opt) {
		case 'r':
			reps = atoi(optarg);
			break;
		case 's':
			plen = (size_t)atol(optarg) << 20;
			break;
		default:
			fprintf(stderr, "usage: %s [-r REPEAT] [-s MiB] CKPT:FREE[,...] ...\n",
				argv[0]);
			return opt == 'h' ? 0 : 1;
		}
	}
	if (reps < 1 || reps > 16 || plen == 0) {
		fprintf(stderr, "bench_balance_gpu: -r 1..16, -s > 0\n");
		return 1;
	}
	cr = cuInit(0);
	if (cr == CUDA_SUCCESS)
		cr = cuDeviceGetCount(&count);
	if (cr != CUDA_SUCCESS || count < 1) {
		fprintf(stderr, "bench_balance_gpu: no CUDA device: skipped\n");
		return 77;
	}
	ng = (unsigned)count > MAXG ? MAXG : (unsigned)count;
	for (unsigned i = 0; i < ng; i++) {
		CUdevice d;

		CK(cuDeviceGet(&d, (int)i));
		CK(cuDeviceGetName(g[i].name, sizeof(g[i].name), d));
		CK(cuDevicePrimaryCtxRetain(&g[i].ctx, d));
		CK(cuCtxSetCurrent(g[i].ctx));
		CK(cuStreamCreate(&g[i].s_local, CU_STREAM_NON_BLOCKING));
		CK(cuStreamCreate(&g[i].s_host, CU_STREAM_NON_BLOCKING));
		for (unsigned j = 0; j < ng; j++)
			CK(cuStreamCreate(&g[i].s_peer[j], CU_STREAM_NON_BLOCKING));
	}
	for (unsigned i = 0; i < ng; i++)
		for (unsigned j = 0; j < ng; j++) {
			CUdevice di, dj;
			int can = 0;

			if (i == j)
				continue;
			CK(cuDeviceGet(&di, (int)i));
			CK(cuDeviceGet(&dj, (int)j));
			CK(cuDeviceCanAccessPeer(&can, di, dj));
			if (can) {
				CK(cuCtxSetCurrent(g[i].ctx));
				cr = cuCtxEnablePeerAccess(g[j].ctx, 0);
				can = cr == CUDA_SUCCESS ||
				      cr == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
			}
			peer_ok[i][j] = can;
		}

	/* scenarios */
	for (int a = optind; a < argc && nscen < MAXSCEN; a++, nscen++)
		if (parse_scenario(argv[a], ckpt[nscen], fr[nscen])) {
			fprintf(stderr, "bench_balance_gpu: '%s': want %u CKPT:FREE pairs (MiB)\n",
				argv[a], ng);
			return 1;
		}
	if (!nscen) {
		/* one GPU over its cache, the others under: 128 MiB free on the
		 * full one, sizes swept */
		static const double big[] = { 512, 1024, 2048 };

		for (unsigned k = 0; k < 3; k++, nscen++)
			for (unsigned i = 0; i < ng; i++) {
				ckpt[nscen][i] = (uint64_t)((i ? big[k] / 4 : big[k]) * MiB);
				fr[nscen][i] = (uint64_t)((i ? big[k] : 128) * MiB);
			}
	}

	/* the probe */
	memset(&node, 0, sizeof(node));
	node.n = ng;
	node.host_free = BALANCE_HOST_UNLIMITED;
	for (unsigned i = 0; i < ng; i++)
		ensure(i, plen, plen);
	ensure_host(plen * ng);
	printf("bench_balance_gpu: %u GPU(s)", ng);
	for (unsigned i = 0; i < ng; i++)
		printf("%s %u: %s", i ? "," : "", i, g[i].name);
	printf("\n\nprobe: %zu MiB copies, median of %d, GB/s\n", plen >> 20, reps);
	printf("%-14s %10s %14s %8s\n", "link", "streams", "raw cuMemcpyPeer", "ratio");
	for (unsigned i = 0; i < ng; i++) {
		node.local_bw[i] = probe(L_LOCAL, i, i, plen, reps);
		node.host_link[i] = i;
		node.host_bw[i] = probe(L_HOST, i, i, plen, reps);
		printf("local %u        %10.1f\n", i, node.local_bw[i] / 1e9);
		printf("host %u         %10.1f\n", i, node.host_bw[i] / 1e9);
		for (unsigned j = 0; j < ng; j++) {
			double raw;

			if (j == i)
				continue;
			if (!peer_ok[i][j]) {
				printf("peer %u->%u      no peer access\n", i, j);
				continue;
			}
			node.peer_bw[i][j] = probe(L_PEER, i, j, plen, reps);
			raw = probe_raw_peer(i, j, plen, reps);
			printf("peer %u->%u      %10.1f %14.1f %8.2f\n", i, j,
			       node.peer_bw[i][j] / 1e9, raw / 1e9, node.peer_bw[i][j] / raw);
		}
	}
	if (ng > 1) {	/* do the host links share an uplink? */
		struct balance_plan all = { .n = ng };
		double t;

		for (unsigned i = 0; i < ng; i++)
			all.to_host[i] = plen;
		t = execute(&all);
		t = execute(&all);
		printf("host, all %u GPUs at once: %.1f GB/s in all (alone: %.1f each)\n", ng,
		       (double)plen * ng / t / 1e9, node.host_bw[0] / 1e9);
	}

	/* the scenarios */
	for (int s = 0; s < nscen; s++) {
		struct balance_plan plan[4];
		double meas[4], base = 0;

		memcpy(node.ckpt, ckpt[s], sizeof(node.ckpt[0]) * ng);
		memcpy(node.free, fr[s], sizeof(node.free[0]) * ng);
		printf("\nscenario %d: MiB checkpoint/free per GPU:", s);
		for (unsigned i = 0; i < ng; i++)
			printf(" %.0f/%.0f", ckpt[s][i] / MiB, fr[s][i] / MiB);
		printf("\n%-8s %10s %12s %12s %12s %12s\n", "policy", "plan us", "model ms",
		       "measured ms", "to peers MiB", "to host MiB");
		for (int k = 0; k < 4; k++) {
			double tp[16], tm[16], t0;
			uint64_t peers = 0, host = 0;

			for (int r = 0; r < reps; r++) {
				t0 = now();
				if (balance_plan(&node, pol[k], &plan[k])) {
					fprintf(stderr, "bench_balance_gpu: %s: no plan\n",
						balance_policy_name(pol[k]));
					return 1;
				}
				tp[r] = now() - t0;
			}
			for (unsigned i = 0; i < ng; i++) {
				ensure(i, ckpt[s][i], fr[s][i] > ckpt[s][i] ? fr[s][i] : ckpt[s][i]);
				host += plan[k].to_host[i];
				for (unsigned j = 0; j < ng; j++)
					if (j != i)
						peers += plan[k].to_gpu[i][j];
			}
			ensure_host(host + 1);
			execute(&plan[k]);	/* warm-up */
			for (int r = 0; r < reps; r++)
				tm[r] = execute(&plan[k]);
			meas[k] = median(tm, reps);
			if (pol[k] == BALANCE_MAXFLOW)
				base = meas[k];
			printf("%-8s %10.2f %12.3f %12.3f %12.0f %12.0f\n",
			       balance_policy_name(pol[k]), median(tp, reps) * 1e6,
			       plan[k].time * 1e3, meas[k] * 1e3, peers / MiB, host / MiB);
		}
		printf("measured against maxflow:");
		for (int k = 0; k < 4; k++)
			printf(" %s %+.0f%%", balance_policy_name(pol[k]),
			       (meas[k] / base - 1) * 100);
		printf("\n");
	}
	return 0;
}
