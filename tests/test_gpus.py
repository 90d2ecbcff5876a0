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
    def mapped():
        g = stats(m)["tiers"].get("gpu")
        return g if g and g["fully_mapped"] else None
    return util.wait_until(mapped, lambda: f"a mapped GPU tier: {m.log(20)}", timeout, 0.02)


def wait_log(m, text, timeout=30):
    util.wait_until(lambda: text in m.log(), lambda: f"'{text}' in the log: {m.log(20)}",
                    timeout)


DEV = "user.tierfs.restore_device"


def write_for(path, data, dev=None):
    """Create path, name the GPU it belongs to (restore_device) before its
    first byte, then write it."""
    with open(path, "wb") as f:
        if dev is not None:
            os.setxattr(path, DEV, str(dev).encode())
        f.write(data)


def hold_open(m, n=3, size=20 * MiB):
    """n files of `size` bytes written on the mount's first GPU (the default)
    and kept open for writing: their copies are not evictable.  Returns the
    open files and {path: data}."""
    held, data = [], {}
    for i in range(n):
        path = os.path.join(m.mnt, f"open{i}")
        data[path] = randbytes(size)
        f = open(path, "wb")
        f.truncate(size)        # one placement of the whole size
        f.write(data[path])
        f.flush()
        held.append(f)
    return held, data


def assert_everywhere(m, data):
    """Every file of {path: data} reads back byte-exact through the mount
    (not from the page cache), and after unmounting from the backing
    directory."""
    for path, d in data.items():
        assert_same(read_uncached(path), d, path)
    m.umount()
    for path, d in data.items():
        assert_same(read_file(os.path.join(m.backing, os.path.basename(path))), d, path)


def mount_refused(tmp_path, option):
    """Run the daemon with -o option: it must refuse to mount.  Returns the
    finished process (its stderr says why)."""
    util.require_daemon()
    b, m = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    m.mkdir()
    r = subprocess.run([util.tierfs_bin(), str(b), str(m), "-f", "-o", option],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, r
    return r


def test_one_cache_over_two_gpus(mount, monkeypatch):
    """gpu=0:1 with 64 MiB per GPU: one 128 MiB cache, its first half on
    GPU 0 and its second on GPU 1.  Four 24 MiB checkpoints, two named for
    each GPU (restore_device), land each in its GPU's part; every one reads
    back byte-exact from the GPU tier, the devices' shares are what was
    written to each and add up to the tier's use; after unmount the backing
    files are whole."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    ids = [int(x) for x in gpus.split(":")]
    m = mount(gpu=gpus, gpu_cache="64M", host_cache="32M")
    g = wait_mapped(m)
    devs = g["devices"]
    assert [d["device_id"] for d in devs] == ids
    assert devs[0]["offset"] == 0 and devs[1]["offset"] == devs[0]["size"]
    assert devs[0]["size"] >= 64 * MiB and devs[1]["size"] >= 64 * MiB
    assert g["capacity"] == devs[0]["size"] + devs[1]["size"]
    assert "2 GPUs" in m.log() and "one " in m.log()

    data = {f"ck{i}": randbytes(24 * MiB + 4096 * i) for i in range(4)}
    want = [0, 0]
    for i, (name, d) in enumerate(data.items()):
        write_for(os.path.join(m.mnt, name), d, ids[i % 2])
        want[i % 2] += len(d)
    for i, (name, d) in enumerate(data.items()):
        path = os.path.join(m.mnt, name)
        tier = os.getxattr(path, "user.tierfs.tier").decode()
        assert tier.startswith("gpu"), (name, tier)
        assert os.getxattr(path, DEV) == str(ids[i % 2]).encode()
        assert_same(read_uncached(path), d, name + " from the GPU tier")
    g = stats(m)["tiers"]["gpu"]
    used = [d["used"] for d in g["devices"]]
    for i in range(2):          # whole 4 KiB blocks per copy
        assert want[i] <= used[i] < want[i] + 2 * 4096, (want, g)
    assert sum(used) == g["used"], g
    m.umount()
    for name, d in data.items():
        assert_same(read_file(os.path.join(m.backing, name)), d, name + " backing file")


@pytest.mark.parametrize("policy", ["greedy", "host", "maxflow"])
def test_full_gpu_sends_its_checkpoint_by_the_balance_policy(mount, monkeypatch, policy):
    """GPU 0's part (64 MiB) holds three 20 MiB files still open for writing
    (not evictable: nothing of them is safe anywhere else), so 4 MiB of it
    are free, next to GPU 1's empty part.  A fourth 20 MiB checkpoint for
    GPU 0 does not fit.  balance=greedy splits it: 4 MiB in GPU 0's part and
    16 MiB across the boundary in GPU 1's (one copy on two GPUs);
    balance=host sends it to host memory; maxflow takes whichever of those
    (or GPU 1's part whole) the measured links make fastest.  The counters
    and the devices' use say which; every byte reads back and reaches the
    backing directory."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    m = mount(gpu=gpus, gpu_cache="64M", host_cache="128M", balance=policy)
    wait_mapped(m)
    held, data = hold_open(m)
    g = stats(m)["tiers"]["gpu"]
    assert g["devices"][0]["used"] == 60 * MiB and g["devices"][1]["used"] == 0, g
    extra = os.path.join(m.mnt, "extra")
    data[extra] = randbytes(20 * MiB)
    with open(extra, "wb") as f:
        f.truncate(20 * MiB)    # one placement of the whole size
        f.write(data[extra])
    st = stats(m)
    g, bal = st["tiers"]["gpu"], st["tiers"]["gpu"]["balance"]
    used = [x["used"] for x in g["devices"]]
    tier = os.getxattr(extra, "user.tierfs.tier").decode()
    assert bal["policy"] == policy, bal
    assert bal["links_measured"] and len(bal["links"]) == 2, bal
    what = (tier, used, bal)
    if policy == "greedy" or (policy == "maxflow" and bal["split"]):
        assert bal["to_peer"] == 1 and bal["split"] == 1 and bal["to_host"] == 0, what
        assert bal["to_peer_bytes"] == 16 * MiB, what
        assert tier.startswith("gpu") and used == [64 * MiB, 16 * MiB], what
    elif policy == "maxflow" and bal["to_peer"]:
        assert bal["to_peer_bytes"] == 20 * MiB and used == [60 * MiB, 20 * MiB], what
    else:
        assert bal["to_host"] >= 1 and bal["to_peer"] == 0, what
        assert tier.startswith("host") and used == [60 * MiB, 0], what
    for path, d in data.items():
        assert_same(read_uncached(path), d, path)
    for f in held:
        f.close()
    assert_everywhere(m, data)


def test_a_growing_copy_stays_in_its_gpus_part(mount, monkeypatch):
    """GPU 0's part holds three open 20 MiB files, 4 MiB free at its top,
    next to GPU 1's empty part.  A file for GPU 0 written without its size
    known up front grows copy by copy: once past GPU 0's 4 MiB it must not
    grow on into GPU 1's memory in place (a copy that grows stays in its
    GPU's part; the balance policy places the larger copy), so with greedy
    it ends wholly in GPU 1's part."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    m = mount(gpu=gpus, gpu_cache="64M", host_cache="128M", balance="greedy")
    wait_mapped(m)
    held, data = hold_open(m)
    extra = os.path.join(m.mnt, "extra")
    data[extra] = randbytes(20 * MiB)
    with open(extra, "wb") as f:
        for at in range(0, len(data[extra]), MiB):
            f.write(data[extra][at:at + MiB])
    g = stats(m)["tiers"]["gpu"]
    used = [x["used"] for x in g["devices"]]   # GPU 1's: the copy's capacity
    assert used[0] == 60 * MiB and used[1] >= 20 * MiB, g
    assert "gpu" in os.getxattr(extra, "user.tierfs.tier").decode()
    for f in held:
        f.close()
    assert_everywhere(m, data)


def test_maxflow_sends_to_host_memory_when_its_links_are_faster(mount, monkeypatch):
    """Device copies slower than host copies (the fake's
    TIERFS_FAKE_CUDA_DTOD_GBPS; as under a sanitizer): with GPU 0's part
    full of open files, maxflow sends the next checkpoint to host memory,
    neither across the boundary nor to GPU 1 by evicting or filling its
    part, and the links it measured say why."""
    if os.environ.get("TIERFS_GPUS") or util.GPU:
        pytest.skip("needs the fake devices")
    gpus = util.gpus_or_fake(monkeypatch, 2)
    monkeypatch.setenv("TIERFS_FAKE_CUDA_DTOD_GBPS", "0.5")
    m = mount(gpu=gpus, gpu_cache="64M", host_cache="128M", balance="maxflow")
    wait_mapped(m)
    held, _ = hold_open(m)
    extra = os.path.join(m.mnt, "extra")
    d = randbytes(20 * MiB)
    with open(extra, "wb") as f:
        f.truncate(len(d))
        f.write(d)
    g = stats(m)["tiers"]["gpu"]
    bal, link = g["balance"], g["balance"]["links"][0]
    assert link["host"] > link["peer"][1], link
    assert bal["to_host"] >= 1 and bal["to_peer"] == 0 and bal["split"] == 0, bal
    assert os.getxattr(extra, "user.tierfs.tier").decode().startswith("host")
    assert [x["used"] for x in g["devices"]] == [60 * MiB, 0], g
    assert_same(read_uncached(extra), d, "extra")
    for f in held:
        f.close()


def test_copies_across_the_boundary_under_pressure(mount, monkeypatch):
    """Both GPUs write in turns into small parts (24 MiB each) while files
    stay open, so that checkpoints split across the boundary, go whole to
    the peer or to host memory, and are evicted, cascaded and overwritten
    there: every file reads back byte-exact at each step and reaches the
    backing directory."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    ids = [int(x) for x in gpus.split(":")]
    m = mount(gpu=gpus, gpu_cache="24M", host_cache="32M", balance="greedy")
    wait_mapped(m)
    rng = util.rng_for(7)
    data, held = {}, []
    for i in range(24):
        path = os.path.join(m.mnt, f"f{i}")
        size = (1 + rng.randrange(7)) * MiB + rng.randrange(4096)
        data[path] = randbytes(size, rng)
        f = open(path, "wb")
        os.setxattr(path, DEV, str(ids[i % 2]).encode())
        f.truncate(size)
        f.write(data[path])
        if i % 3 == 0:
            held.append(f)      # still being written: not evictable
        else:
            f.close()
        if len(held) > 3:
            held.pop(0).close()
        if i % 5 == 4:          # overwrite an earlier one in place
            victim = os.path.join(m.mnt, f"f{rng.randrange(i)}")
            patch = randbytes(4096, rng)
            with open(victim, "r+b") as v:
                v.seek(8192)
                v.write(patch)
            data[victim] = data[victim][:8192] + patch + data[victim][8192 + 4096:]
        for p, d in data.items():
            assert_same(read_uncached(p), d, p)
    bal = stats(m)["tiers"]["gpu"]["balance"]
    assert bal["split"] >= 1, bal
    for f in held:
        f.close()
    assert_everywhere(m, data)


def test_eviction_follows_the_restore_order_across_gpus(mount, monkeypatch):
    """Checkpoints for GPU 0, needed back in reverse order (restore_order set
    first), twice as many as the two 32 MiB parts hold: when GPU 0's part is
    full, the copies needed last go wherever they are, on GPU 1 too, so the
    GPU tier ends holding the files needed first (the newest), over both
    GPUs, and not older ones that overflowed into GPU 1's part early."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    # greedy: GPU 1's free room is taken whatever the links measured
    m = mount(gpu=gpus, gpu_cache="32M", host_cache="48M", balance="greedy")
    wait_mapped(m)
    d = os.path.join(m.mnt, "ck")
    os.mkdir(d)
    os.setxattr(d, "user.tierfs.prefetch", b"stop")
    k = stats(m)["tiers"]["gpu"]["capacity"] // (8 * MiB)     # 8 files fit
    n = 2 * k
    names = [f"c{i:02d}" for i in range(n)]
    os.setxattr(d, "user.tierfs.restore_order",
                "".join(x + "\n" for x in reversed(names)).encode())
    data = [randbytes(8 * MiB) for _ in range(n)]
    for x, b in zip(names, data):
        with open(os.path.join(d, x), "wb") as f:
            f.truncate(len(b))
            f.write(b)
        util.wait_flushed(m, timeout=30)    # each safe on the SSD before the next
    tiers = {x: os.getxattr(os.path.join(d, x), "user.tierfs.tier").decode() for x in names}
    gpu = [x for x in names if "gpu" in tiers[x]]
    g = stats(m)["tiers"]["gpu"]
    assert g["devices"][1]["used"] > 0, g
    assert len(gpu) >= k - 1 and set(gpu) <= set(names[n - k - 1:]), (gpu, tiers)
    for x, b in zip(names, data):
        assert_same(read_uncached(os.path.join(d, x)), b, x)


def test_restore_device_prefetches_into_that_gpu(mount, monkeypatch):
    """A checkpoint written for GPU 0, dropped from the caches, then named
    for GPU 1 (restore_device) and hinted: the prefetcher brings it into
    GPU 1's part, and it reads back byte-exact."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    ids = [int(x) for x in gpus.split(":")]
    m = mount(gpu=gpus, gpu_cache="64M", host_cache="64M")
    wait_mapped(m)
    path = os.path.join(m.mnt, "ck")
    d = randbytes(16 * MiB)
    write_for(path, d, ids[0])
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)                # on the SSD: the caches may drop it
    os.close(fd)
    os.setxattr(path, "user.tierfs.evict", b"1")
    assert os.getxattr(path, "user.tierfs.tier").decode() == "ssd"
    os.setxattr(path, DEV, f"{ids[1]}\n".encode())
    os.setxattr(path, "user.tierfs.restore_next", b"1")
    util.wait_until(lambda: os.getxattr(path, "user.tierfs.tier").decode().startswith("gpu"),
                    lambda: f"the copy on a GPU: {os.getxattr(path, 'user.tierfs.tier')} "
                    f"{m.log(20)}", 30, 0.02)
    g = stats(m)["tiers"]["gpu"]
    assert g["devices"][1]["used"] >= 16 * MiB and g["devices"][0]["used"] == 0, g
    assert_same(read_uncached(path), d, "prefetched into GPU 1")


def test_restore_device_bad_values(mount, monkeypatch):
    """restore_device takes a GPU the mount spans, or "none"; anything else
    is refused with a clear errno and changes nothing."""
    import errno
    gpus = util.gpus_or_fake(monkeypatch, 2)
    ids = [int(x) for x in gpus.split(":")]
    m = mount(gpu=gpus, gpu_cache="32M")
    wait_mapped(m)
    path = os.path.join(m.mnt, "f")
    write_file(path, b"x" * 4096)
    with pytest.raises(OSError) as e:
        os.getxattr(path, DEV)
    assert e.value.errno == errno.ENODATA
    for bad in [b"", b"x", b"-1", b"1.5", b"99", b"64", b" 1", b"1 ", b"01234567", b"\xff"]:
        with pytest.raises(OSError) as e:
            os.setxattr(path, DEV, bad)
        assert e.value.errno == errno.EINVAL, bad
    missing = max(ids) + 1
    with pytest.raises(OSError) as e:
        os.setxattr(path, DEV, str(missing).encode())
    assert e.value.errno == errno.ENODEV
    with pytest.raises(OSError) as e:
        os.setxattr(m.mnt, DEV, b"0")
    assert e.value.errno == errno.EINVAL     # files only
    os.setxattr(path, DEV, str(ids[1]).encode())
    assert os.getxattr(path, DEV) == str(ids[1]).encode()
    os.setxattr(path, DEV, b"none")
    with pytest.raises(OSError) as e:
        os.getxattr(path, DEV)
    assert e.value.errno == errno.ENODATA
    os.setxattr(path, DEV, str(ids[0]).encode())
    os.removexattr(path, DEV)
    with pytest.raises(OSError) as e:
        os.getxattr(path, DEV)
    assert e.value.errno == errno.ENODATA
    assert read_file(path) == b"x" * 4096


def test_restore_device_without_a_gpu_tier(mount):
    """On a mount without a GPU tier there is no GPU to name."""
    import errno
    m = mount(gpu="none")
    path = os.path.join(m.mnt, "f")
    write_file(path, b"y")
    with pytest.raises(OSError) as e:
        os.setxattr(path, DEV, b"0")
    assert e.value.errno == errno.ENODEV


@pytest.mark.parametrize("policy", ["mincost", "fast", "", "host:greedy"])
def test_bad_balance_policy(tmp_path, policy):
    """A malformed balance= stops the mount, naming what is accepted."""
    r = mount_refused(tmp_path, f"balance={policy}")
    assert "maxflow, greedy or host" in r.stderr, r.stderr


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
    assert_everywhere(m, data)


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
    r = mount_refused(tmp_path, f"gpu={spec}")
    assert f"bad gpu '{spec}'" in r.stderr and "joined by ':'" in r.stderr, r.stderr
