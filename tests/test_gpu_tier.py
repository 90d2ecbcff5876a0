"""The GPU cache tier (run on a GPU machine with TIERFS_GPU=N; skipped
elsewhere): data through GPU, host and SSD, eviction from the GPU tier, a
mount serving writes before its GPU cache is mapped, and two instances
taking turns to pin their host caches."""

import hashlib
import json
import os
import re
import time

import pytest

import util

pytestmark = [pytest.mark.gpu, pytest.mark.daemon]
MiB = 1 << 20


def stats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


read_nocache = util.read_uncached


def wait_backlog(m, timeout=60):
    util.wait_flushed(m, timeout)
    return stats(m)


def wait_gpu_tier(m, timeout=60):
    util.wait_until(lambda: "gpu" in stats(m)["tiers"], lambda: f"a GPU tier: {m.log()}",
                    timeout, 0.02)


def mount_for_hints(mount, **opts):
    """A mount whose GPU cache is fully mapped (so it may evict), and a
    directory "ck" on it with prefetching held: (mount, directory)."""
    m = mount(**opts)
    wait_gpu_tier(m)
    util.wait_until(lambda: stats(m)["tiers"]["gpu"]["fully_mapped"],
                    lambda: f"the GPU cache mapped: {stats(m)}", 60, 0.02)
    d = os.path.join(m.mnt, "ck")
    os.mkdir(d)
    os.setxattr(d, "user.tierfs.prefetch", b"stop")
    return m, d


def test_data_through_gpu_host_ssd(mount):
    m = mount(gpu_cache="512M", host_cache="1G")
    wait_gpu_tier(m)
    files = {f"c{i}": os.urandom((8 + i) * MiB + i) for i in range(12)}
    for n, d in files.items():
        write(os.path.join(m.mnt, n), d)
        assert "gpu" in os.getxattr(os.path.join(m.mnt, n), "user.tierfs.tier").decode()
    s = wait_backlog(m)
    assert s["tiers"]["gpu"]["bytes_to_host"] >= sum(map(len, files.values()))
    for n, d in files.items():
        assert hashlib.sha256(read_nocache(os.path.join(m.mnt, n))).digest() == \
            hashlib.sha256(d).digest(), n
    t = stats(m)["tiers"]
    # served from a cache tier (host copies are read in place when both exist)
    assert t["gpu"]["hits"] + t["host"]["hits"] > 0 and t["host"]["misses"] == 0, t
    m.umount()
    for n, d in files.items():
        with open(os.path.join(m.backing, n), "rb") as f:
            assert f.read() == d, n


def test_gpu_cache_fills_and_evicts(mount):
    m = mount(gpu_cache="64M", host_cache="256M")
    wait_gpu_tier(m)
    data = [os.urandom(16 * MiB) for _ in range(16)]       # 256 MiB > 64 MiB
    for i, d in enumerate(data):
        write(os.path.join(m.mnt, f"f{i}"), d)
    wait_backlog(m)
    g = stats(m)["tiers"]["gpu"]
    assert g["evictions"] > 0, g
    assert g["used"] <= g["capacity"]
    for i, d in enumerate(data):
        assert read_nocache(os.path.join(m.mnt, f"f{i}")) == d


def test_prefetch_goes_up_to_the_gpu(mount):
    """Restore hints bring files SSD -> host -> GPU ahead of the reads."""
    m, d = mount_for_hints(mount, gpu_cache="64M", host_cache="256M")
    data = [os.urandom(16 * MiB) for _ in range(12)]       # 192 MiB > 64 MiB
    for i, x in enumerate(data):
        write(os.path.join(d, f"c{i}"), x)
    wait_backlog(m)

    def tier(n):
        return os.getxattr(os.path.join(d, n), "user.tierfs.tier").decode()

    first = [f"c{i}" for i in range(3)]                    # evicted from the GPU
    assert not any("gpu" in tier(n) for n in first), [tier(n) for n in first]
    os.setxattr(d, "user.tierfs.restore_order", "".join(n + "\n" for n in first).encode())
    os.setxattr(d, "user.tierfs.prefetch", b"start")
    # a copy shows in user.tierfs.tier from the start of its promotion, and
    # is counted in files_to_gpu once the promotion is done: wait for both
    util.wait_until(lambda: all("gpu" in tier(n) for n in first) and
                    stats(m)["prefetch"]["files_to_gpu"] >= 3,
                    lambda: f"3 files prefetched to the GPU: {[tier(n) for n in first]} "
                    f"{stats(m)['prefetch']}", 30)
    p = stats(m)["prefetch"]
    assert p["files_to_gpu"] >= 3 and p["bytes_to_gpu"] >= 3 * 16 * MiB, p
    for i, n in enumerate(first):
        assert read_nocache(os.path.join(d, n)) == data[i], n
    assert stats(m)["prefetch"]["queue"] == 0


def test_host_cache_keeps_what_the_gpu_tier_will_not(mount):
    """With restore hints set before the forward pass, the host cache ends
    it holding the files needed after the GPU tier's, not second copies of
    the GPU tier's own (which no read would use)."""
    m, d = mount_for_hints(mount, gpu_cache="64M", host_cache="96M")
    if len(stats(m)["tiers"]["gpu"].get("devices", [])) > 1:
        # over two GPUs (TIERFS_OPTIONS=gpu=0:1) the GPU tier keeps the
        # files needed first here too (tests/test_gpus.py checks it), but
        # this test's host-cache counts are sized for one 64 MiB GPU part
        pytest.skip("sized for one GPU; TIERFS_OPTIONS spans several GPUs")
    n = 12                                                 # 192 MiB > 64 + 96 MiB
    names = [f"c{i}" for i in range(n)]
    os.setxattr(d, "user.tierfs.restore_order",
                "".join(x + "\n" for x in reversed(names)).encode())
    data = [os.urandom(16 * MiB) for _ in range(n)]
    for x, b in zip(names, data):
        write(os.path.join(d, x), b)
    wait_backlog(m)
    tiers = {x: os.getxattr(os.path.join(d, x), "user.tierfs.tier").decode().split(",")
             for x in names}
    gpu = [x for x in names if "gpu" in tiers[x]]
    host_only = [x for x in names if "host" in tiers[x] and "gpu" not in tiers[x]]
    doubles = [x for x in names if "host" in tiers[x] and "gpu" in tiers[x]]
    print("gpu:", gpu, "host only:", host_only, "both:", doubles)
    # the GPU tier holds the newest (needed first); the host cache (six
    # 16 MiB files) mostly holds those needed right after them.  Filled with
    # the last files written, as a plain cascade leaves it, it would hold
    # two (c6, c7) and four doubles.
    assert gpu and set(gpu) <= set(names[n // 2:]), tiers
    assert len(host_only) >= 4 and len(doubles) <= 2, tiers
    cached = set(gpu) | set(host_only)
    first = [x for x in reversed(names)][:len(cached)]
    assert len(cached & set(first)) >= len(cached) - 1, (first, tiers)
    for x, b in zip(names, data):
        assert read_nocache(os.path.join(d, x)) == b, x


def test_writes_served_before_gpu_cache_is_mapped(mount):
    t0 = time.monotonic()
    m = mount(gpu_cache="4G", host_cache="1G", wait_gpu=False)
    p = os.path.join(m.mnt, "first")
    d = os.urandom(MiB)
    write(p, d)
    first = time.monotonic() - t0
    g = stats(m)["tiers"].get("gpu")
    state = "not built yet" if g is None else \
        f"mapped {g['mapped'] >> 20} of {g['capacity'] >> 20} MiB"
    print(f"first write accepted {first * 1e3:.0f} ms after the mount started; GPU cache {state}")
    assert g is None or g["mapped"] < g["capacity"], \
        "the first write waited for the whole GPU cache"
    util.wait_until(lambda: (stats(m)["tiers"].get("gpu") or {}).get("fully_mapped"),
                    "the GPU cache mapped", 60)
    g = stats(m)["tiers"]["gpu"]
    assert g["mapped"] == g["capacity"]
    assert read_nocache(p) == d
    # the GPU tier takes writes once it is there
    write(os.path.join(m.mnt, "second"), d)
    assert "gpu" in os.getxattr(os.path.join(m.mnt, "second"), "user.tierfs.tier").decode()


def test_two_instances_take_turns_pinning(mount):
    a = mount(gpu_cache="256M", host_cache="4G", log="info")
    b = mount(gpu_cache="256M", host_cache="4G", log="info")
    util.wait_until(lambda: stats(a)["tiers"]["host"].get("pinned") and
                    stats(b)["tiers"]["host"].get("pinned"), "both host caches pinned", 120, 0.1)
    logs = a.log() + b.log()
    pinned = re.findall(r"host cache pinned: .*\(waited ([0-9.]+) s for the pin lock\)", logs)
    assert len(pinned) == 2, logs
    print("pin-lock waits:", pinned)
