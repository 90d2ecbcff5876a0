"""The random-operation exerciser (tests/exerciser.py) against tierfs.

TIERFS_SEED fixes the seed (default: a fixed one per run, from its label;
TIERFS_RANDOM_SEED=1: a random one; printed either way);
TIERFS_OPS sets the operations of the main run (default 50,000; half of it in
the 1 MiB host cache, whose every operation evicts or writes through, and
shorter runs with other eviction policies).
"""

import hashlib
import os
import subprocess
import zlib

import pytest

import util
from exerciser import Exerciser, Mismatch

OPS = int(os.environ.get("TIERFS_OPS", "50000"))
def seed_for(label):
    return util.pick_seed("TIERFS_SEED", zlib.crc32(label.encode()), f"exerciser {label}")


def compare_dirs(ex, root, what):
    for f in ex.files:
        with open(os.path.join(root, f.name), "rb") as a, open(f.rpath, "rb") as b:
            got, want = a.read(), b.read()
        if got != want:
            raise AssertionError(f"{what}: {f.name} differs from the reference "
                                 f"({len(got)} vs {len(want)} bytes); "
                                 f"TIERFS_SEED={ex.seed} TIERFS_OPS={ex.nops}")


@pytest.fixture
def ref_dir(tmp_path):
    """The reference side on a private tmpfs: fast, and never a FUSE file system."""
    ref = tmp_path / "ref"
    ref.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256M", "tmpfs", str(ref)],
                       capture_output=True)
    yield str(ref)
    if r.returncode == 0:
        util.lazy_umount(str(ref))


CONFIGS = [
    # label, mount options, ops, files, max file size
    ("default", {}, OPS, 4, util.MiB),
    ("cache1M", {"host_cache": "1M"}, OPS // 2, 4, util.MiB),
    ("cache1M-lru", {"host_cache": "1M", "evict": "lru"}, OPS // 5, 6, 512 * util.KiB),
    ("cache1M-fifo", {"host_cache": "1M", "evict": "fifo"}, OPS // 5, 6, 512 * util.KiB),
]


def run_exerciser(m, ref, label, ops, nfiles, max_size):
    seed = seed_for(label)
    print(f"exerciser {label}: TIERFS_SEED={seed} TIERFS_OPS={ops} options={m.options}")
    ex = Exerciser(m.mnt, ref, seed, ops, nfiles=nfiles, max_size=max_size,
                   label=label)
    counts = ex.run()
    print(dict(counts))
    # the SSD copy after unmount, and the mount again after a remount
    m.umount()
    compare_dirs(ex, m.backing, f"backing dir after unmount ({label})")
    m.start()
    compare_dirs(ex, m.mnt, f"mount after remount ({label})")
    return ex


@pytest.mark.parametrize("label,options,ops,nfiles,max_size", CONFIGS,
                         ids=[c[0] for c in CONFIGS])
@pytest.mark.slow
def test_exerciser(mount, ref_dir, label, options, ops, nfiles, max_size):
    m = mount(**options)
    run_exerciser(m, ref_dir, label, ops, nfiles, max_size)


@pytest.mark.gpu
def test_exerciser_gpu(mount, ref_dir):
    m = mount(gpu=util.GPU, host_cache="1M")
    run_exerciser(m, ref_dir, "gpu", OPS // 2, 4, util.MiB)


# ------------------------------------------------ the exerciser checks itself

class Corrupting(Exerciser):
    """Flips one byte of one write on the mount side."""
    def m_pwrite(self, fd, data, off):
        if self.opno > 300 and not getattr(self, "done", False) and len(data) > 1:
            self.done = True
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return super().m_pwrite(fd, data, off)


def test_exerciser_detects_corruption(ref_dir):
    a, b = os.path.join(ref_dir, "a"), os.path.join(ref_dir, "b")
    os.mkdir(a)
    os.mkdir(b)
    ex = Corrupting(a, b, 1234, 5000)
    with pytest.raises(Mismatch) as ei:
        ex.run()
    assert "TIERFS_SEED=1234" in str(ei.value)
    assert ex.done


def test_exerciser_is_deterministic(ref_dir):
    digests = []
    for run in range(2):
        a, b = os.path.join(ref_dir, f"a{run}"), os.path.join(ref_dir, f"b{run}")
        os.mkdir(a)
        os.mkdir(b)
        ex = Exerciser(a, b, 99, 3000)
        counts = ex.run()
        h = hashlib.sha256()
        for f in ex.files:
            with open(f.mpath, "rb") as fh:
                h.update(fh.read())
        digests.append((dict(counts), h.hexdigest()))
    assert digests[0] == digests[1]
