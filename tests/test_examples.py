"""The examples in examples/, run against a real tierfs so that they cannot
rot: the C adjoint (stdio checkpoints, a restore order through setxattr)
and the PyTorch training loop (tierfs.torch.save/load, hints through the
Python package; skipped where torch cannot be imported)."""

import glob
import os
import re
import subprocess
import sys

import pytest

import util

sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
import tierfs  # noqa: E402


@pytest.mark.daemon
def test_adjoint(mount):
    exe = os.path.join(os.path.dirname(util.tierfs_bin()), "examples", "adjoint")
    if not os.access(exe, os.X_OK):
        pytest.skip(f"{exe} not built (make in the build directory)")
    m = mount(host_cache="8M")              # 12 checkpoints of 1 MiB and the
    d = os.path.join(m.mnt, "rtm")          # flushes: some come from the SSD
    os.mkdir(d)
    r = subprocess.run([exe, d, "65536", "120", "10"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "restore order set: 12 checkpoints, newest first" in out, out
    reads = re.findall(r"read fwd-(\d+) \(([a-z,]+)\)", out)
    assert [int(k) for k, _ in reads] == list(range(11, -1, -1)), out
    assert all(t in ("host", "host,ssd", "ssd", "gpu", "gpu,host", "gpu,ssd",
                     "gpu,host,ssd") for _, t in reads), out
    assert "all 120 recomputed states match the forward pass" in out, out
    s = tierfs.stats(m.mnt)
    assert s["prefetch"]["consumed"] >= 12, s["prefetch"]
    assert tierfs.queued(d) == []
    tierfs.wait_flushed(m.mnt, timeout=120)
    for k in range(12):
        assert os.path.getsize(os.path.join(m.backing, "rtm", f"fwd-{k:05d}")) == 2 * 65536 * 8


def test_adjoint_plain_directory(tmp_path):
    exe = os.path.join(os.path.dirname(util.tierfs_bin()), "examples", "adjoint")
    if not os.access(exe, os.X_OK):
        pytest.skip(f"{exe} not built")
    r = subprocess.run([exe, str(tmp_path), "4096", "30", "7"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restore order not set" in r.stdout
    assert "all 30 recomputed states match" in r.stdout


@pytest.mark.daemon
def test_torch_checkpoint(mount):
    try:
        subprocess.run([sys.executable, "-c", "import torch"], check=True,
                       capture_output=True, timeout=120)
    except subprocess.CalledProcessError:
        pytest.skip("torch cannot be imported (Debian: python3-torch)")
    m = mount(host_cache="8M")
    d = os.path.join(m.mnt, "train")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, os.path.join(util.REPO_DIR, "examples",
                                                     "torch_checkpoint.py"),
                        d, "--steps", "30", "--every", "5", "--width", "256"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "all 6 checkpoints restored identical" in out, out
    restored = re.findall(r"restored ckpt-(\d+)\.safetensors \(step (\d+)\) from "
                          r"([a-z,]+): identical",
                          out)
    assert [int(a) for a, _, _ in restored] == [30, 25, 20, 15, 10, 5], out
    assert "all on the SSD" in out
    assert tierfs.queued(d) == []                      # the context dropped the rest
    assert tierfs.prefetch(d)                          # held only while training
    for step in range(5, 31, 5):
        assert os.path.isfile(os.path.join(m.backing, "train",
                                           f"ckpt-{step:05d}.safetensors"))


@pytest.mark.gpu
def test_torch_checkpoint_cuda_through_the_ioctl(mount):
    """The PyTorch example on the GPU: CUDA tensors saved and restored with
    tierfs.torch (device to device where libtierfs has the vectored GPU
    call), the parameters also with tierfs.save_gpu / load_gpu (libtierfs's
    ioctl); every checkpoint restored identical."""
    r = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                       capture_output=True, timeout=300)
    if r.returncode:
        pytest.skip("torch with CUDA cannot be imported here")
    lib = glob.glob(os.path.join(os.path.dirname(util.tierfs_bin()), ".libs", "libtierfs.so.*"))
    if not lib:
        pytest.skip("no libtierfs.so next to the daemon")
    m = mount(gpu_cache="256M", host_cache="256M")
    d = os.path.join(m.mnt, "train")
    env = dict(os.environ, OMP_NUM_THREADS="1", TIERFS_LIB=sorted(lib)[0],
               CUDA_VISIBLE_DEVICES=util.GPU)
    r = subprocess.run([sys.executable, os.path.join(util.REPO_DIR, "examples",
                                                     "torch_checkpoint.py"),
                        d, "--steps", "30", "--every", "5", "--width", "256",
                        "--device", "cuda", "--gpu-io"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all 6 checkpoints restored identical" in r.stdout, r.stdout
    assert r.stdout.count("(parameters through the GPU ioctl): identical") == 6, r.stdout
    moved = re.search(r"CUDA tensor bytes device to device: (\d+)", r.stdout)
    assert moved, r.stdout
    if hasattr(tierfs, "pwritev_gpu"):
        assert int(moved.group(1)) > 0, r.stdout
    for step in range(5, 31, 5):
        assert os.path.isfile(os.path.join(m.backing, "train", f"ckpt-{step:05d}.gpu"))
        assert os.path.isfile(os.path.join(m.backing, "train",
                                           f"ckpt-{step:05d}.safetensors"))
