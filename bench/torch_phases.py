#!/usr/bin/env python3
"""torch_phases.py - where the time of one tierfs.torch save and load goes.

Saves bench_torch.py's state dict (--gib GiB of CUDA tensors) SAVES times to
a tierfs mount with tierfs.torch.save and loads each back with load(into=),
timing every call that crosses a boundary while it runs: opening, closing
and renaming the file (FUSE round trips), the vectored GPU calls
(tierfs.pwritev_gpu / preadv_gpu: export, ioctls, the daemon's copies),
the host writes and reads (header, CPU tensors), the producers' stream
synchronisation, and the rest (Python: walking the state dict, the
header's JSON).  Prints, per phase, the median milliseconds per save and
per load, and the raw device-to-device copy of the same bytes.

usage: torch_phases.py --mount MNT [--gib 4] [--saves 5] [--files N] [--profile]
(root not needed; a GPU and torch 2.x with CUDA; TIERFS_LIB for libtierfs)
"""

import argparse
import collections
import cProfile
import os
import pstats
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import bench_torch as bt  # noqa: E402
import tierfs  # noqa: E402
import tierfs.torch as tt  # noqa: E402

acc = collections.defaultdict(float)


def timed(owner, name, phase):
    """Replace owner.name by a wrapper that adds its time to acc[phase]."""
    fn = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[phase] += time.perf_counter() - t0
    setattr(owner, name, wrapper)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mount", required=True)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--files", type=int, default=0,
                    help="names to cycle through (default: one per save); "
                         "more saves than the GPU cache holds files")
    ap.add_argument("--profile", action="store_true",
                    help="also print the Python profile (cProfile) of the saves and loads")
    args = ap.parse_args()

    sd = bt.make_state(args.gib, "cuda")
    d = os.path.join(args.mount, "torch_phases")
    os.makedirs(d, exist_ok=True)
    timed(os, "open", "open")
    timed(os, "close", "close")
    timed(os, "replace", "rename")
    timed(os, "pwritev", "host write")
    timed(os, "preadv", "host read")
    timed(os, "pread", "host read")
    timed(tierfs, "_gpu_iov_packed", "gpu call")     # under pwritev_gpu / preadv_gpu
    timed(torch.cuda, "synchronize", "cuda sync")
    rows = collections.defaultdict(lambda: {"save": [], "load": []})
    prof = {w: cProfile.Profile() for w in ("save", "load")} if args.profile else None
    files = args.files or args.saves
    for k in range(args.saves):
        bt.step(sd, k, "cuda")
        torch.cuda.synchronize()
        acc.clear()
        t0 = time.perf_counter()
        if prof and k:
            prof["save"].enable()
        tt.save(sd, os.path.join(d, f"ckpt-{k % files}"))
        if prof:
            prof["save"].disable()
        total = time.perf_counter() - t0
        for ph, v in acc.items():
            rows[ph]["save"].append(v)
        rows["python, rest"]["save"].append(total - sum(acc.values()))
        rows["total"]["save"].append(total)
    for k in reversed(range(args.saves)):
        dst = bt.zeros_like(sd)
        torch.cuda.synchronize()
        acc.clear()
        t0 = time.perf_counter()
        if prof and k != args.saves - 1:
            prof["load"].enable()
        tt.load(os.path.join(d, f"ckpt-{k % files}"), into=dst)
        if prof:
            prof["load"].disable()
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
        for ph, v in acc.items():
            rows[ph]["load"].append(v)
        rows["python, rest"]["load"].append(total - sum(acc.values()))
        rows["total"]["load"].append(total)
    # the floor: the same bytes copied device to device
    dst = bt.zeros_like(sd)
    raw = []
    for _ in range(args.saves):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for (_, a), (_, b) in zip(bt.tensors(dst), bt.tensors(sd)):
            a.copy_(b, non_blocking=True)
        torch.cuda.synchronize()
        raw.append(time.perf_counter() - t0)
    n = sum(1 for _ in bt.tensors(sd))
    print(f"tierfs.torch phases: {bt.nbytes(sd) / 2**30:.2f} GiB in {n} tensors, "
          f"{args.saves} saves, medians in ms")
    print(f"{'phase':<16}{'save':>10}{'load':>10}")
    order = ["open", "gpu call", "host write", "host read", "cuda sync", "close", "rename",
             "python, rest", "total"]
    for ph in order + sorted(set(rows) - set(order)):
        if ph not in rows:
            continue
        cells = [f"{statistics.median(rows[ph][w]) * 1e3:10.2f}" if rows[ph][w] else f"{'-':>10}"
                 for w in ("save", "load")]
        print(f"{ph:<16}{cells[0]}{cells[1]}")
    print(f"{'raw D2D copy':<16}{statistics.median(raw) * 1e3:10.2f}")
    for w, p in (prof or {}).items():
        print(f"\nPython profile of the {w}s after the first:")
        pstats.Stats(p).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
