#!/usr/bin/env python3
"""bench_torch.py - PyTorch checkpoints: how long a training loop is blocked.

A training-like loop holds a state dict of CUDA tensors (a model in bf16 and
an Adam-like optimizer in fp32, nested as torch.optim's state_dict is), and
saves it SAVES times between compute steps, then restores the checkpoints
newest first.  Per method: the time the loop is blocked per save and per
restore (median [min-max]), the time until the save is durable on the SSD,
and every restore checked equal to what was saved (per-tensor checksums
computed on the GPU).

Methods (all in one run, the same state dict):
  raw         device-to-device copies into preallocated buffers (the floor)
  save:local  torch.save / torch.load(map_location=cuda), a local directory
  save:shm    the same in /dev/shm
  dcp:local   torch.distributed.checkpoint save / load, FileSystemWriter
  dcp-async:local   dcp.async_save (blocked: until it returns), dcp.load
  tierfs      tierfs.torch.save / load(into=) on the tierfs mount
  tierfs-fsync  the same, durable by an fsync of the file (as torch.save's)
  dcp:tierfs, dcp-async:tierfs   DCP with tierfs.torch's writer and reader
  restart     a process saves SAVES checkpoints with tierfs.torch and is
              SIGKILLed; a new process loads them back (into=), newest
              first, from the mount

Durable: torch.save and DCP: the save, then an fsync of every file written
and of their directories; tierfs: until tierfs.wait_flushed(file) returns
(the SSD copy current), from the start of the save (tierfs-fsync: an fsync
of the file and its directory instead).  For the tierfs methods, where the
time to durable went is printed after the row, from the mount's statistics
(user.tierfs.stats) read before and after each save: the GPU -> host
cascade, the SSD flush (its write, its sync, its commit).  For torch.save, the
bytes the kernel had not yet written back when the fsync began (Dirty +
Writeback of /proc/meminfo, system-wide) are printed after its row: the
fsync writes only those.

usage: bench_torch.py --mount MNT --local DIR [--gib 4] [--saves 5]
                      [--methods raw,save:local,...] [--device cuda]
Needs torch 2.x with CUDA for the GPU figures (--device cpu runs the same
loop on the CPU, for a check of the program itself).
"""

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402

import tierfs  # noqa: E402
import tierfs.torch as tt  # noqa: E402

ALL = ["raw", "save:local", "save:shm", "dcp:local", "dcp-async:local", "tierfs",
       "tierfs-fsync", "dcp:tierfs", "dcp-async:tierfs", "restart"]


def make_state(gib, device, seed=1):
    """~gib GiB: L layers of a bf16 weight [R, C] and a fp32 bias [R]; Adam
    state (exp_avg, exp_avg_sq in fp32, a step tensor) per parameter."""
    g = torch.Generator(device=device).manual_seed(seed)
    rows, cols = 4096, 4096
    per_layer = rows * cols * (2 + 4 + 4)           # weight bf16 + two fp32 moments
    layers = max(1, int(gib * (1 << 30) // per_layer))
    model, state = {}, {}
    for i in range(layers):
        w = torch.randn(rows, cols, generator=g, device=device).to(torch.bfloat16)
        b = torch.randn(rows, generator=g, device=device)
        model[f"layers.{i}.weight"] = w
        model[f"layers.{i}.bias"] = b
        for k, p in ((2 * i, w), (2 * i + 1, b)):
            state[k] = {"step": torch.tensor(float(i)),
                        "exp_avg": torch.randn(p.shape, generator=g, device=device),
                        "exp_avg_sq": torch.rand(p.shape, generator=g, device=device)}
    optim = {"state": state,
             "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8,
                               "weight_decay": 0.0, "params": list(range(2 * layers))}]}
    return {"model": model, "optim": optim}


def tensors(sd, prefix=""):
    """[(name, tensor)] of a nested state dict, in a fixed order."""
    out = []
    if isinstance(sd, dict):
        for k in sd:
            out += tensors(sd[k], f"{prefix}{k}.")
    elif isinstance(sd, (list, tuple)):
        for i, v in enumerate(sd):
            out += tensors(v, f"{prefix}{i}.")
    elif torch.is_tensor(sd):
        out.append((prefix[:-1], sd))
    return out


def nbytes(sd):
    return sum(t.numel() * t.element_size() for _, t in tensors(sd))


def checksums(sd):
    """Per-tensor checksums, computed where the tensors are."""
    out = {}
    for name, t in tensors(sd):
        v = t.detach().contiguous().view(-1).view(torch.uint8)
        n = v.numel() - v.numel() % 4
        s = v[:n].view(torch.int32).to(torch.int64).sum() if n else torch.zeros((), dtype=torch.int64)
        out[name] = (int(s), tuple(t.shape), str(t.dtype), int(v[n:].sum()) if v.numel() > n else 0)
    return out


def step(sd, k, device):
    """A compute step: a matmul, then every tensor changed (so that each
    checkpoint differs from the last in every byte range)."""
    x = torch.randn(2048, 2048, device=device)
    for _ in range(4):
        x = x @ x
        x = x / (x.norm() + 1)
    for _, t in tensors(sd):
        if t.dtype.is_floating_point:
            t.add_(0.001 * (k + 1))
        else:
            t.add_(1)
    sync(device)


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


DIRTY = {}                               # method -> [bytes not yet on the disk at its fsync]
PARTS = {}                               # method -> [{part: seconds}] per save (tierfs)


def flush_clock(mount):
    """The mount's cumulative flush seconds: the cascade to host, the SSD
    flush and its sync and commit."""
    import json
    st = json.loads(os.getxattr(mount, "user.tierfs.stats"))
    to_host = 0.0
    for t in st["tiers"].values():
        if t.get("to_host_bandwidth"):
            to_host = t["bytes_to_host"] / t["to_host_bandwidth"]
    sec = st["ssd"]["seconds"]
    return {"to_host": to_host, "flush": sec["total"], "sync": sec["sync"],
            "commit": sec["commit"]}


def dirty_bytes():
    """Dirty + Writeback of /proc/meminfo: what the kernel has not written
    back yet (a torch.save's fsync writes only that much)."""
    n = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                if k in ("Dirty", "Writeback"):
                    n += int(v.split()[0]) * 1024
    except OSError:
        return float("nan")
    return n


def fsync_tree(path):
    paths = [path] if os.path.isfile(path) else \
        [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs] + \
        [d for d, _, _ in os.walk(path)]
    for p in paths + [os.path.dirname(os.path.abspath(path))]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def zeros_like(sd):
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [zeros_like(v) for v in sd]
    if isinstance(sd, tuple):
        return tuple(zeros_like(v) for v in sd)
    if torch.is_tensor(sd):
        return torch.zeros_like(sd)
    return sd


# ---- one method: returns (blocked save s, durable s, restore fn) per save

class Method:
    def __init__(self, name, args):
        self.name, self.args = name, args
        where = name.split(":")[-1] if ":" in name else "tierfs"
        base = {"local": args.local, "shm": args.shm, "tierfs": args.mount}.get(where)
        self.dir = os.path.join(base, "bench_torch." + name.replace(":", "_")) if base else None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            os.makedirs(self.dir)
        self.pending = None

    def path(self, k):
        return os.path.join(self.dir, f"ckpt-{k:02d}" +
                            (".safetensors" if self.name.startswith("tierfs") else ""))

    def save(self, sd, k):
        """Returns (blocked, durable) seconds."""
        p = self.path(k) if self.dir else None
        t0 = time.perf_counter()
        kind = self.name.split(":")[0]
        if kind == "save":
            torch.save(sd, p)
            t1 = time.perf_counter()
            DIRTY.setdefault(self.name, []).append(dirty_bytes())
            fsync_tree(p)
        elif kind in ("dcp", "dcp-async"):
            import torch.distributed.checkpoint as dcp
            w = tt.FileSystemWriter(p) if self.name.endswith("tierfs") else dcp.FileSystemWriter(p)
            if kind == "dcp":
                dcp.save(sd, storage_writer=w)
                t1 = time.perf_counter()
            else:
                if self.pending is not None:
                    self.pending.result()   # one async save in flight, as DCP advises
                fut = dcp.async_save(sd, storage_writer=w)
                t1 = time.perf_counter()
                fut.result()
            if self.name.endswith("tierfs"):
                tierfs.wait_flushed(p)
            else:
                fsync_tree(p)
        elif kind in ("tierfs", "tierfs-fsync"):
            c0 = flush_clock(self.args.mount)
            t0 = time.perf_counter()
            tt.save(sd, p)
            t1 = time.perf_counter()
            if kind == "tierfs":
                tierfs.wait_flushed(p)
            else:
                fsync_tree(p)
            t2 = time.perf_counter()
            c1 = flush_clock(self.args.mount)
            PARTS.setdefault(self.name, []).append({k: c1[k] - c0[k] for k in c0})
            return t1 - t0, t2 - t0
        else:
            raise ValueError(self.name)
        return t1 - t0, time.perf_counter() - t0

    def load(self, k, like):
        """Returns (blocked seconds, the state dict loaded)."""
        p = self.path(k)
        kind = self.name.split(":")[0]
        if kind == "save":
            t0 = time.perf_counter()
            got = torch.load(p, map_location=self.args.device)
        elif kind in ("dcp", "dcp-async"):
            import torch.distributed.checkpoint as dcp
            got = zeros_like(like)
            sync(self.args.device)
            r = tt.FileSystemReader(p) if self.name.endswith("tierfs") else dcp.FileSystemReader(p)
            t0 = time.perf_counter()
            dcp.load(got, storage_reader=r)
        else:
            got = zeros_like(like)
            sync(self.args.device)
            t0 = time.perf_counter()
            tt.load(p, into=got)
        sync(self.args.device)
        return time.perf_counter() - t0, got


def run_raw(sd, args):
    bufs = [zeros_like(sd) for _ in range(args.saves)]
    saves, loads, ok = [], [], True
    sums = []
    for k in range(args.saves):
        step(sd, k, args.device)
        sums.append(checksums(sd))
        t0 = time.perf_counter()
        for (_, a), (_, b) in zip(tensors(bufs[k]), tensors(sd)):
            a.copy_(b, non_blocking=True)
        sync(args.device)
        saves.append((time.perf_counter() - t0, float("nan")))
    for k in reversed(range(args.saves)):
        dst = zeros_like(sd)
        sync(args.device)
        t0 = time.perf_counter()
        for (_, a), (_, b) in zip(tensors(dst), tensors(bufs[k])):
            a.copy_(b, non_blocking=True)
        sync(args.device)
        loads.append(time.perf_counter() - t0)
        ok &= checksums(dst) == sums[k]
    return saves, loads, ok


def run_method(name, sd, args):
    m = Method(name, args)
    saves, loads, sums, ok = [], [], [], True
    for k in range(args.saves):
        step(sd, k, args.device)
        sums.append(checksums(sd))
        saves.append(m.save(sd, k))
    for k in reversed(range(args.saves)):
        dt, got = m.load(k, sd)
        loads.append(dt)
        if checksums(got) != sums[k]:
            print(f"  {name}: checkpoint {k} differs", file=sys.stderr)
            ok = False
        del got
    shutil.rmtree(m.dir, ignore_errors=True)
    return saves, loads, ok


def _restart_writer(d, gib, device, saves, q):
    sd = make_state(gib, device, seed=7)
    for k in range(saves):
        step(sd, k, device)
        q.put(checksums(sd))
        tt.save(sd, os.path.join(d, f"ckpt-{k:02d}.safetensors"))
    q.put("saved")
    time.sleep(3600)                    # killed here


def _restart_reader(d, gib, device, saves, q):
    like = make_state(gib, device, seed=9)
    for k in reversed(range(saves)):
        got = zeros_like(like)
        sync(device)
        t0 = time.perf_counter()
        tt.load(os.path.join(d, f"ckpt-{k:02d}.safetensors"), into=got)
        sync(device)
        q.put((k, time.perf_counter() - t0, checksums(got)))
        del got


def run_restart(args):
    """A training process saves SAVES checkpoints and is SIGKILLed; a new
    process reloads them from the mount, newest first (from the GPU cache,
    which lives in the daemon)."""
    ctx = mp.get_context("spawn")
    d = os.path.join(args.mount, "bench_torch.restart")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    q = ctx.Queue()
    w = ctx.Process(target=_restart_writer, args=(d, args.gib, args.device, args.saves, q))
    w.start()
    want = [q.get(timeout=900) for _ in range(args.saves)]
    assert q.get(timeout=900) == "saved"
    os.kill(w.pid, signal.SIGKILL)
    w.join()
    r = ctx.Process(target=_restart_reader, args=(d, args.gib, args.device, args.saves, q))
    r.start()
    loads, ok = [], True
    for _ in range(args.saves):
        k, dt, sums = q.get(timeout=900)
        loads.append(dt)
        ok &= sums == want[k]
    r.join()
    shutil.rmtree(d, ignore_errors=True)
    return [], loads, ok


def fmt(xs, scale=1e3):
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    return f"{statistics.median(xs) * scale:.1f} [{min(xs) * scale:.1f}-{max(xs) * scale:.1f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mount", required=True, help="a tierfs mount (with a GPU tier)")
    ap.add_argument("--local", required=True, help="a directory on the local disk")
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--methods", default=",".join(ALL))
    args = ap.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in ALL:
            ap.error(f"unknown method {m} (one of {', '.join(ALL)})")
    if not tierfs.is_tierfs(args.mount):
        ap.error(f"{args.mount} is not a tierfs mount")
    sd = make_state(args.gib, args.device)
    size = nbytes(sd)
    ntens = len(tensors(sd))
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"bench_torch: {size / 2**30:.2f} GiB in {ntens} tensors on {dev}, "
          f"{args.saves} saves, torch {torch.__version__}")
    rows = []
    for name in methods:
        t0 = time.perf_counter()
        try:
            if name == "raw":
                saves, loads, ok = run_raw(sd, args)
            elif name == "restart":
                saves, loads, ok = run_restart(args)
            else:
                saves, loads, ok = run_method(name, sd, args)
        except Exception as e:          # noqa: BLE001 - a row that says why
            print(f"  {name}: {type(e).__name__}: {e}", file=sys.stderr)
            rows.append((name, "error", "-", "-", str(e)[:40]))
            continue
        rows.append((name, fmt([s[0] for s in saves]), fmt([s[1] for s in saves]),
                     fmt(loads), "yes" if ok else "NO"))
        print(f"  {'  '.join(rows[-1])}   ({time.perf_counter() - t0:.0f} s)", flush=True)
        if PARTS.get(name):
            med = {k: statistics.median(d[k] for d in PARTS[name]) * 1e3 for k in PARTS[name][0]}
            print(f"  {name}: where the time to durable went (medians, ms): GPU -> host "
                  f"{med['to_host']:.0f}, SSD flush {med['flush']:.0f} (of it sync "
                  f"{med['sync']:.0f}, commit {med['commit']:.0f})", flush=True)
        if DIRTY.get(name):
            print(f"  {name}: not yet written back when its fsync began (Dirty + Writeback): "
                  f"{statistics.median(DIRTY[name]) / 2**20:.0f} MiB (median) of "
                  f"{size / 2**20:.0f} MiB per checkpoint", flush=True)
    hdr = ("method", "blocked/save ms", "durable ms", "blocked/restore ms", "equal")
    w = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(5)]
    for r in [hdr] + rows:
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)))
    return 0 if all(r[4] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
