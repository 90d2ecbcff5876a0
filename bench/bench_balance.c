/*
 * bench_balance.c - checkpoint load balancing (tiers/balance.c): the time
 * to compute each policy's plan, and the MASCOTS'21 comparison of their
 * blocking times, reproduced in simulation.
 *
 * (a) Compute time: nodes of 2, 4, 8 and 16 GPUs (full NVLink meshes for
 * 2 and 4, the DGX-1 mesh below for 8, two DGX-1 meshes joined by PCIe for
 * 16), checkpoint sizes of the trace below, 128 MiB free; each call timed
 * alone (CLOCK_MONOTONIC), median and 99th percentile over all calls.
 *
 * (b) Blocking time on a DGX-1 (8 V100), with the bandwidths of the
 * MASCOTS'21 slides: local write 350 GB/s, GPU-to-GPU 24 GB/s over one
 * NVLink and 48 GB/s over two, GPU-to-host 12 GB/s.  NVLinks as in the
 * DGX-1V hybrid cube mesh (nvidia-smi topo -m); pairs without NVLink have
 * no peer access here (peer copies between the two CPU sockets' PCIe trees
 * are not supported on DGX-1).  Host links, two models: "own", 12 GB/s per
 * GPU (the slides' figure, as if each GPU had the host to itself), and
 * "pair", GPUs 0-1, 2-3, 4-5, 6-7 behind one PCIe switch sharing its x16
 * uplink of 12 GB/s (closer to the hardware when all GPUs write at once).
 *
 * The trace, RTM-like (the paper's RTM trace is not public; this one has
 * its shape: 776 checkpoints per GPU, all GPUs at once, uneven sizes since
 * compression ratios differ between the GPUs' subdomains): GPU i's mean
 * size is m * w_i with w_i from 0.25 to 1.75 (a shuffled ramp, so some
 * GPUs overflow while others have room), each checkpoint +-25% of it
 * uniformly; m = 144 MiB unless swept.  Before each round every GPU has F
 * bytes free (the cache drained in between).  Blocking time is summed
 * over the rounds; each policy is reported as percent slower than maxflow.
 *
 * Usage: bench_balance [seed].  No assertions: it only reports.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "balance.h"

#define MiB		(1ULL << 20)
#define GBs		1e9
#define ROUNDS		776
#define TIMED_NODES	400
#define TIMED_REPS	5

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)
{
	uint64_t x = rng_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545f4914f6cdd1dULL;
}

static double rnd_unit(void)
{
	return (double)(rnd() >> 11) / 9007199254740992.0;
}

/* DGX-1V hybrid cube mesh: NVLinks between each pair (0, 1 or 2) */
static const int dgx1_links[8][8] = {
	{ 0, 1, 1, 2, 2, 0, 0, 0 },
	{ 1, 0, 2, 1, 0, 2, 0, 0 },
	{ 1, 2, 0, 2, 0, 0, 1, 0 },
	{ 2, 1, 2, 0, 0, 0, 0, 1 },
	{ 2, 0, 0, 0, 0, 1, 1, 2 },
	{ 0, 2, 0, 0, 1, 0, 2, 1 },
	{ 0, 0, 1, 0, 1, 2, 0, 2 },
	{ 0, 0, 0, 1, 2, 1, 2, 0 },
};

static void node_init(struct balance_node *nd, unsigned n, int pair_host)
{
	memset(nd, 0, sizeof(*nd));
	nd->n = n;
	nd->host_free = BALANCE_HOST_UNLIMITED;
	for (unsigned i = 0; i < n; i++) {
		nd->local_bw[i] = 350 * GBs;
		nd->host_link[i] = pair_host ? i & ~1u : i;
		nd->host_bw[i] = 12 * GBs;
	}
}

/* the DGX-1 for n = 8; a full 24 GB/s NVLink mesh for fewer; two DGX-1
 * meshes whose halves see each other over PCIe (10 GB/s) for 16 */
static void node_topo(struct balance_node *nd, unsigned n, int pair_host)
{
	node_init(nd, n, pair_host);
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < n; j++) {
			if (i == j)
				continue;
			if (n < 8)
				nd->peer_bw[i][j] = 24 * GBs;
			else if (i / 8 == j / 8)
				nd->peer_bw[i][j] = 24 * GBs * dgx1_links[i % 8][j % 8];
			else if (i % 8 == j % 8)
				nd->peer_bw[i][j] = 10 * GBs;
		}
}

/* GPU weights of the trace: a ramp from 0.25 to 1.75, shuffled */
static void weights(double *w, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		w[i] = n > 1 ? 0.25 + 1.5 * i / (n - 1) : 1;
	for (unsigned i = n - 1; i > 0; i--) {
		unsigned j = (unsigned)(rnd() % (i + 1));
		double t = w[i];

		w[i] = w[j];
		w[j] = t;
	}
}

static void round_sizes(struct balance_node *nd, const double *w, double mean, uint64_t freeb)
{
	for (unsigned i = 0; i < nd->n; i++) {
		nd->ckpt[i] = (uint64_t)(mean * w[i] * (0.75 + 0.5 * rnd_unit()));
		nd->free[i] = freeb;
	}
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void bench_compute(void)
{
	static const unsigned ns[] = { 2, 4, 8, 16 };
	static double t[TIMED_NODES * TIMED_REPS];
	struct balance_node nd;
	struct balance_plan p;
	double w[BALANCE_MAX_GPUS];

	printf("(a) time to compute a plan, us (median / p99 of %d calls; %d nodes x %d)\n",
	       TIMED_NODES * TIMED_REPS, TIMED_NODES, TIMED_REPS);
	printf("    %-5s %16s %16s %16s %16s\n", "GPUs", "host", "greedy", "maxflow", "mincost");
	for (unsigned k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
		printf("    %-5u", ns[k]);
		for (int pol = 0; pol < BALANCE_NPOLICIES; pol++) {
			uint64_t keep = rng_state;
			int m = 0;

			for (int c = 0; c < TIMED_NODES; c++) {
				node_topo(&nd, ns[k], c & 1);
				weights(w, ns[k]);
				round_sizes(&nd, w, 144.0 * MiB, 128 * MiB);
				for (int r = 0; r < TIMED_REPS; r++) {
					double t0 = now_us();
					int ret = balance_plan(&nd, (enum balance_policy)pol, &p);

					t[m++] = now_us() - t0;
					if (ret)
						printf(" (error %d)", ret);
				}
			}
			rng_state = keep;		/* the same nodes for every policy */
			qsort(t, (size_t)m, sizeof(t[0]), cmp_double);
			printf(" %7.2f / %6.2f", t[m / 2], t[m * 99 / 100]);
		}
		printf("\n");
	}
}

/* Blocking time of each policy summed over the trace's rounds. */
static void run_trace(int pair_host, double mean, uint64_t freeb, double *sum)
{
	struct balance_node nd;
	struct balance_plan p;
	double w[8];
	uint64_t keep = rng_state;

	node_topo(&nd, 8, pair_host);
	weights(w, 8);
	for (int pol = 0; pol < BALANCE_NPOLICIES; pol++)
		sum[pol] = 0;
	for (int r = 0; r < ROUNDS; r++) {
		round_sizes(&nd, w, mean, freeb);
		for (int pol = 0; pol < BALANCE_NPOLICIES; pol++) {
			if (balance_plan(&nd, (enum balance_policy)pol, &p)) {
				sum[pol] = NAN;
				continue;
			}
			sum[pol] += p.time;
		}
	}
	rng_state = keep;	/* every row sees the same trace */
}

/* percent slower than maxflow; maxflow may end a byte per link late
 * (whole-byte capacities): what is within that shows as 0 */
static double pct(double x, double mf)
{
	double v = 100 * (x / mf - 1);

	return fabs(v) < 0.05 ? 0 : v;
}

static void print_row(const char *label, const double *sum)
{
	double mf = sum[BALANCE_MAXFLOW];

	printf("    %-12s %10.2f %9.0f%% %9.0f%% %9.1f%%\n", label, mf * 1e3 / ROUNDS,
	       pct(sum[BALANCE_HOST], mf), pct(sum[BALANCE_GREEDY], mf),
	       pct(sum[BALANCE_MINCOST], mf));
}

static void bench_blocking(void)
{
	static const uint64_t frees[] = { 0, 64, 128, 256, 512, 1024 };
	static const double means[] = { 64, 96, 144, 192, 256, 384, 512 };
	double sum[BALANCE_NPOLICIES];
	char label[32];

	for (int pair = 0; pair < 2; pair++) {
		const char *hl = pair ? "pair: GPU pairs share 12 GB/s to host"
				      : "own: 12 GB/s to host per GPU";

		printf("\n(b) DGX-1, 8 GPUs, %d rounds; host links %s\n", ROUNDS, hl);
		printf("    mean size 144 MiB, free memory swept; maxflow: mean blocking per round, others: %% slower\n");
		printf("    %-12s %10s %10s %10s %10s\n", "free/GPU", "maxflow ms", "host",
		       "greedy", "mincost");
		for (unsigned k = 0; k < sizeof(frees) / sizeof(frees[0]); k++) {
			run_trace(pair, 144.0 * MiB, frees[k] * MiB, sum);
			snprintf(label, sizeof(label), "%" PRIu64 " MiB", frees[k]);
			print_row(label, sum);
		}
		printf("    free 128 MiB, mean checkpoint size swept:\n");
		printf("    %-12s %10s %10s %10s %10s\n", "mean size", "maxflow ms", "host",
		       "greedy", "mincost");
		for (unsigned k = 0; k < sizeof(means) / sizeof(means[0]); k++) {
			run_trace(pair, means[k] * MiB, 128 * MiB, sum);
			snprintf(label, sizeof(label), "%.0f MiB", means[k]);
			print_row(label, sum);
		}
	}
}

int main(int argc, char **argv)
{
	uint64_t seed = rng_state;

	if (argc > 1)
		seed = rng_state = strtoull(argv[1], NULL, 0) | 1;
	printf("bench_balance: seed %#" PRIx64 "\n", seed);
	printf("model: local write 350 GB/s, NVLink 24 GB/s per link (48 over two), host 12 GB/s\n"
	       "       (MASCOTS'21 slides); DGX-1V hybrid cube mesh, no peer access without NVLink;\n"
	       "       links in parallel, a link's transfers share it; blocking = last link done\n"
	       "trace: RTM-like, synthetic: %d rounds, all 8 GPUs at once, GPU i's mean size\n"
	       "       m*w_i (w_i a shuffled ramp 0.25..1.75), +-25%% per round; free reset per round\n\n",
	       ROUNDS);
	bench_compute();
	bench_blocking();
	return 0;
}
