#!/usr/bin/env python3
"""plot_gpu_hints.py - medians, spreads and a plot of several runs of
bench_gpu_hints.sh (tierfs, um and raw modes; seq, rev and irr orders).

usage: bench/plot_gpu_hints.py DATA [--png OUT.png] [--title TEXT]

DATA holds the summary tables of the runs, as bench_gpu_hints.sh prints
them at its end (the "order ..." header and one line per order; runs may be
separated by any other lines, e.g. "== run N").  Prints one table: per
order and mode, the median checkpoint and restore GB/s over the runs with
their range (min-max), and the restore ratios tierfs/um and tierfs/raw of
the medians.  With --png (needs matplotlib: Debian's python3-matplotlib)
also draws the restore medians as bars with min-max whiskers, one group per
order, on a log scale (hpdc23 Fig. 5/6 style).
"""

import argparse
import statistics
import sys

MODES = ("tierfs", "um", "raw")
ORDERS = ("seq", "rev", "irr")


def parse(path):
    """{(order, mode, 'ckpt'|'rest'): [GB/s per run]}"""
    runs = {}
    cols = None
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "order":
                cols = []       # "tierfs ckpt", "um ckpt", ... pairs
                for i in range(1, len(w) - 1, 2):
                    if w[i] in MODES:
                        cols.append((w[i], w[i + 1][:4]))
                continue
            if cols and w[0] in ORDERS:
                for (mode, kind), v in zip(cols, w[1:]):
                    try:
                        runs.setdefault((w[0], mode, kind), []).append(float(v))
                    except ValueError:
                        pass            # "-": mode not run
    return runs


def med(v):
    return statistics.median(v) if v else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--png")
    ap.add_argument("--title", default="restore throughput (GB/s, median and range)")
    a = ap.parse_args()
    runs = parse(a.data)
    if not runs:
        sys.exit(f"{a.data}: no bench_gpu_hints summary tables found")
    n = max(len(v) for v in runs.values())
    print(f"{n} runs; GB/s = 10^9 B/s of time blocked; median (min-max)")
    print(f"{'order':6} {'mode':7} {'checkpoint':>24} {'restore':>24}")
    for o in ORDERS:
        for m in MODES:
            cells = []
            for k in ("ckpt", "rest"):
                v = runs.get((o, m, k), [])
                cells.append(f"{med(v):8.1f} ({min(v):6.1f}-{max(v):6.1f})" if v else "-")
            print(f"{o:6} {m:7} {cells[0]:>24} {cells[1]:>24}")
        t, u, r = (med(runs.get((o, m, "rest"), [])) for m in MODES)
        if t and u and r:
            print(f"{o:6} ratios  restore tierfs/um {t / u:.2f}x, tierfs/raw {t / r:.2f}; "
                  f"checkpoint tierfs/raw "
                  f"{med(runs[(o, 'tierfs', 'ckpt')]) / med(runs[(o, 'raw', 'ckpt')]):.2f}")
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.26
        for i, m in enumerate(MODES):
            xs, ys, lo, hi = [], [], [], []
            for j, o in enumerate(ORDERS):
                v = runs.get((o, m, "rest"), [])
                if not v:
                    continue
                xs.append(j + (i - 1) * width)
                ys.append(med(v))
                lo.append(med(v) - min(v))
                hi.append(max(v) - med(v))
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=m)
        ax.set_xticks(range(len(ORDERS)))
        ax.set_xticklabels(ORDERS)
        ax.set_yscale("log")
        ax.set_ylabel("restore GB/s")
        ax.set_title(a.title, fontsize=10)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)
        print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
