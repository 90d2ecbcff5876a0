#!/usr/bin/env python3
"""torch_checkpoint.py - a PyTorch training loop that checkpoints into a
tierfs mount with tierfs.torch.save, then restores its checkpoints newest
first with restore hints (the Python package tierfs).

usage: torch_checkpoint.py DIR [--steps N] [--every K] [--width W] [--device DEV]
                           [--gpu-io]

The forward part trains a small network (CPU tensors by default; --device
cuda to train on a GPU) and saves model and optimizer every K steps into
DIR/ckpt-NNNNN.safetensors (tierfs.torch.save: the safetensors layout, the
optimizer's nested state kept), with prefetching held (tierfs.prefetch(d,
False)) so the flushes have the SSD to themselves.  The restore part
declares the order in which it will read the checkpoints back (newest
first, as for a rollback or an adjoint pass: tierfs.restore_order), so
tierfs prefetches them from the SSD into its caches ahead of the reads; it
loads each one in place into a fresh model and optimizer
(tierfs.torch.load(path, into=...)), checks the parameters against those
saved, and says which tier served it.  Then it waits until every checkpoint
is on the SSD (tierfs.wait_flushed).

CUDA tensors (--device cuda) move device to device into tierfs's GPU cache
where the mount has a GPU tier and libtierfs has the vectored GPU call, and
through host memory elsewhere; the output says which.  With --gpu-io the
parameters are also saved as one flat CUDA tensor with tierfs.save_gpu (the
GPU ioctl of libtierfs; DIR/ckpt-NNNNN.gpu) and restored with
tierfs.load_gpu.

On another file system it runs without the hints.  Exit status 0 when every
checkpoint came back identical, 1 otherwise.
"""

import argparse
import hashlib
import os
import sys

try:
    import tierfs
except ImportError:                     # in the source tree: python/tierfs
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "python"))
    import tierfs

import torch

import tierfs.torch  # noqa: E402  (after torch: needs it)


def digest(model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


SUFFIX = ".safetensors"


def gpu_name(name):
    return name[:-len(SUFFIX)] + ".gpu"


def make_model(width, device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 1)).to(device)


def train(d, args, on_tierfs):
    """Train, saving every args.every steps; return {name: digest}."""
    model = make_model(args.width, args.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    saved = {}
    hold = tierfs.prefetch(d, False) if on_tierfs else None
    try:
        for step in range(1, args.steps + 1):
            x = torch.randn(256, 64, generator=gen).to(args.device)
            y = x[:, :1] * 0.5 + x[:, 1:2] ** 2
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % args.every == 0:
                name = f"ckpt-{step:05d}{SUFFIX}"
                ck = {"step": step, "model": model.state_dict(), "optim": opt.state_dict(),
                      "loss": loss.item()}
                if args.gpu_io:         # the parameters also as one flat tensor
                    flat = torch.nn.utils.parameters_to_vector(model.parameters())
                    tierfs.save_gpu(os.path.join(d, gpu_name(name)), flat.contiguous())
                tierfs.torch.save(ck, os.path.join(d, name))
                saved[name] = digest(model)
                print(f"step {step:5d}  loss {loss.item():.5f}  saved {name}")
    finally:
        if hold is not None:
            hold.__exit__(None, None, None)     # prefetching back on
    return saved


def restore(d, args, saved, on_tierfs):
    names = sorted(saved, reverse=True)         # newest first
    bad = 0

    def load_all():
        nonlocal bad
        for name in names:
            path = os.path.join(d, name)
            where = ",".join(tierfs.tier(path)) if on_tierfs else "-"
            model = make_model(args.width, args.device)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
            ck = {"model": model.state_dict(), "optim": opt.state_dict()}
            tierfs.torch.load(path, into=ck)    # in place: the model's own tensors
            opt.load_state_dict(ck["optim"])
            ok = digest(model) == saved[name]
            if args.gpu_io:
                flat = torch.nn.utils.parameters_to_vector(model.parameters())
                tierfs.load_gpu(os.path.join(d, gpu_name(name)), flat)
                ok = ok and torch.equal(
                    flat, torch.nn.utils.parameters_to_vector(model.parameters()))
                where += " (parameters through the GPU ioctl)"
            bad += not ok
            print(f"restored {name} (step {ck['step']}) from {where}: "
                  f"{'identical' if ok else 'DIFFERENT'}")

    if on_tierfs:
        order = [n for name in names for n in
                 ((gpu_name(name), name) if args.gpu_io else (name,))]
        with tierfs.restore_order(d, order):
            load_all()
    else:
        load_all()
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--width", type=int, default=512, help="hidden layer width")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gpu-io", action="store_true",
                    help="parameters through the GPU ioctl (tierfs.save_gpu/load_gpu)")
    args = ap.parse_args()
    if args.gpu_io and not args.device.startswith("cuda"):
        ap.error("--gpu-io needs --device cuda")
    os.makedirs(args.dir, exist_ok=True)
    on_tierfs = tierfs.is_tierfs(args.dir)
    if not on_tierfs:
        print(f"{args.dir} is not on tierfs: no restore hints")
    saved = train(args.dir, args, on_tierfs)
    bad = restore(args.dir, args, saved, on_tierfs)
    st = tierfs.torch.io_stats
    if args.device.startswith("cuda"):
        print(f"CUDA tensor bytes device to device: {st['gpu_write'] + st['gpu_read']}, "
              f"through host memory: {st['posix_write'] + st['posix_read']}")
    if on_tierfs:
        tierfs.wait_flushed(args.dir)
        s = tierfs.stats(args.dir)
        reads = sum(t.get("hits", 0) + t.get("late", 0) + t.get("misses", 0)
                    for t in s["tiers"].values())
        hits = sum(t.get("hits", 0) for t in s["tiers"].values())
        print(f"all on the SSD; reads {reads}, cache hits {hits}, "
              f"prefetched {s['prefetch']['files_prefetched']} files")
    print("FAILED" if bad else f"all {len(saved)} checkpoints restored identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
