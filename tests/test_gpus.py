"""One mount over several GPUs (-o gpu=0:1, gpu=all): one GPU cache whose
address range has a part on each device, copies placed across a part's end,
the statistics per device, and what happens when the GPUs cannot reach each
other's memory or a listed GPU is missing.

On a machine with several GPUs set TIERFS_GPUS=0:1 (the devices to use);
elsewhere the build's fake libcuda plays several devices
(TIERFS_FAKE_CUDA_DEVICES), so that the option handling, the range's layout
and the whole data path run on every machine."""

import json
import os
import subprocess

import pytest

import util
from util import MiB, assert_same, randbytes, read_file, read_uncached, write_file

pytestmark = [pytest.mark.daemon]


def stats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))


def wait_mapped(m, timeout=60):
    """Until the GPU tier exists and its cache is mapped."""
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        g = stats(m)["tiers"].get("gpu")
        if g and g["fully_mapped"]:
            return g
        time.sleep(0.02)
    raise AssertionError(f"no mapped GPU tier: {m.log(20)}")


def wait_log(m, text, timeout=30):
    import time
    end = time.monotonic() + timeout
    while text not in m.log():
        assert time.monotonic() < end, f"no '{text}' in the log: {m.log(20)}"
        time.sleep(0.05)


def test_one_cache_over_two_gpus(mount, monkeypatch):
    """gpu=0:1 with 64 MiB per GPU: one 128 MiB cache, its first half on
    GPU 0 and its second on GPU 1.  Five 24 MiB checkpoints fill it past the
    first part's end (one of them lies across it, or wholly on GPU 1): every
    one reads back byte-exact from the GPU tier, both devices hold data and
    their shares add up to the tier's use; after unmount the backing files
    are whole."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    m = mount(gpu=gpus, gpu_cache="64M", host_cache="32M")
    g = wait_mapped(m)
    devs = g["devices"]
    assert [d["device_id"] for d in devs] == [int(x) for x in gpus.split(":")]
    assert devs[0]["offset"] == 0 and devs[1]["offset"] == devs[0]["size"]
    assert devs[0]["size"] >= 64 * MiB and devs[1]["size"] >= 64 * MiB
    assert g["capacity"] == devs[0]["size"] + devs[1]["size"]
    assert "2 GPUs" in m.log() and "one " in m.log()

    data = {f"ck{i}": randbytes(24 * MiB + 4096 * i) for i in range(5)}
    for name, d in data.items():
        write_file(os.path.join(m.mnt, name), d)
    for name, d in data.items():
        tier = os.getxattr(os.path.join(m.mnt, name), "user.tierfs.tier").decode()
        assert tier.startswith("gpu"), (name, tier)
        assert_same(read_uncached(os.path.join(m.mnt, name)), d, name + " from the GPU tier")
    g = stats(m)["tiers"]["gpu"]
    used = [d["used"] for d in g["devices"]]
    assert used[0] > 0 and used[1] > 0, g
    assert sum(used) == g["used"], g
    m.umount()
    for name, d in data.items():
        assert_same(read_file(os.path.join(m.backing, name)), d, name + " backing file")


def test_cache_over_gpus_under_pressure(mount, monkeypatch):
    """Twice the cache's size written, then overwritten in place and read
    back: eviction and the cascade run over the whole range, both parts."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    m = mount(gpu=gpus, gpu_cache="32M", host_cache="16M")
    wait_mapped(m)
    data = {}
    for i in range(8):
        name = os.path.join(m.mnt, f"f{i}")
        data[name] = randbytes(7 * MiB + 512 * i)
        write_file(name, data[name])
    for i, name in enumerate(sorted(data)):
        patch = randbytes(MiB)
        with open(name, "r+b") as f:
            f.seek(3 * MiB)
            f.write(patch)
        data[name] = data[name][:3 * MiB] + patch + data[name][4 * MiB:]
    for name, d in data.items():
        assert_same(read_uncached(name), d, name)
    m.umount()
    for name, d in data.items():
        assert_same(read_file(os.path.join(m.backing, os.path.basename(name))), d, name)


def test_gpu_all_spans_every_device(mount, monkeypatch):
    """gpu=all: one part per device of the machine (three fake ones)."""
    if os.environ.get("TIERFS_GPUS") or util.GPU:
        pytest.skip("counts the fake devices")
    util.gpus_or_fake(monkeypatch, 3)
    m = mount(gpu="all", gpu_cache="32M")
    g = wait_mapped(m)
    assert [d["device_id"] for d in g["devices"]] == [0, 1, 2]
    write_file(os.path.join(m.mnt, "x"), b"y" * (70 * MiB))
    assert read_uncached(os.path.join(m.mnt, "x")) == b"y" * (70 * MiB)


def test_gpus_without_peer_access(mount, monkeypatch):
    """GPUs that cannot reach each other's memory cannot share one cache:
    the log says why and the mount serves from host memory and the SSD."""
    if os.environ.get("TIERFS_GPUS") or util.GPU:
        pytest.skip("needs the fake devices")
    util.gpus_or_fake(monkeypatch, 2)
    monkeypatch.setenv("TIERFS_FAKE_CUDA_NO_PEER", "1")
    m = mount(gpu="0:1", gpu_cache="32M", log="info")
    path = os.path.join(m.mnt, "f")
    write_file(path, b"z" * MiB)
    assert read_file(path) == b"z" * MiB
    wait_log(m, "GPU tier: not available")
    log = m.log()
    assert "GPU 0 cannot access the memory of GPU 1 (no peer access)" in log, log
    assert "gpu" not in stats(m)["tiers"]


def test_gpu_list_naming_a_missing_device(mount, monkeypatch):
    """gpu=0:5 on a two-GPU machine: no GPU tier, a log line naming the
    device, and a working mount."""
    if os.environ.get("TIERFS_GPUS") or util.GPU:
        pytest.skip("needs the fake devices")
    util.gpus_or_fake(monkeypatch, 2)
    m = mount(gpu="0:5", log="info")
    write_file(os.path.join(m.mnt, "f"), b"q")
    wait_log(m, "GPU tier: not available")
    assert "no device 5" in m.log()
    assert "gpu" not in stats(m)["tiers"]


@pytest.mark.parametrize("spec", ["0:0", "0:", ":1", "a", "1:x", "-1", "0:-1",
                                  "0:1:2:3:4:5:6:7:8", "0::1", "+1"])
def test_bad_gpu_lists(tmp_path, spec):
    """A malformed gpu= stops the mount before anything starts, saying what
    is accepted."""
    util.require_daemon()
    b, m = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    m.mkdir()
    r = subprocess.run([util.tierfs_bin(), str(b), str(m), "-f", "-o", f"gpu={spec}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, r
    assert f"bad gpu '{spec}'" in r.stderr and "joined by ':'" in r.stderr, r.stderr
