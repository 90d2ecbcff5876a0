"""Durability: unmount/remount, signals, crashes, tiny caches, a full SSD."""

import errno
import os
import random
import signal
import subprocess
import time

import pytest

import util
from util import MiB, assert_same, randbytes, read_file, sha, write_file


def j(*parts):
    return os.path.join(*parts)


def make_tree(root, rng, big=0):
    """Write a tree of files (sizes 0..3 MiB, plus `big` bytes in one file),
    directories, symlinks, modes, xattrs.  Returns {relpath: sha} of files."""
    want = {}
    dirs = ["", "a", "a/b", "a/b/c", "empty", "d e", "many"]
    for d in dirs:
        os.makedirs(j(root, d), exist_ok=True)
    for i in range(40):
        d = rng.choice(["", "a", "a/b", "a/b/c", "d e"])
        rel = j(d, f"file{i}.bin") if d else f"file{i}.bin"
        size = rng.choice([0, 1, 4096, rng.randrange(1, 64 * 1024),
                           rng.randrange(1, 3 * MiB)])
        data = randbytes(size, rng)
        write_file(j(root, rel), data, rng=rng)
        want[rel] = sha(data)
    for i in range(300):
        rel = f"many/m{i}"
        data = randbytes(rng.randrange(0, 3000), rng)
        write_file(j(root, rel), data)
        want[rel] = sha(data)
    if big:
        data = randbytes(big, rng)
        write_file(j(root, "a", "big.bin"), data)
        want["a/big.bin"] = sha(data)
    os.symlink("b/c", j(root, "a", "link"))
    os.chmod(j(root, "a", "b"), 0o750)
    some = sorted(want)[3]
    os.chmod(j(root, some), 0o600)
    os.setxattr(j(root, some), "user.ckpt", b"step=42")
    return want


def check_files(root, want):
    for rel, h in want.items():
        assert util.file_sha(j(root, rel)) == h, rel


@pytest.mark.parametrize("evict", ["score", "fifo", "lru"])
def test_remount_persistence(mount, evict):
    rng = random.Random(f"remount-{evict}")
    m = mount(evict=evict)
    big = 80 * MiB if evict == "score" else 0         # bigger than the host cache
    want = make_tree(m.mnt, rng, big=big)
    snap = util.tree_snapshot(m.mnt)
    m.umount()
    # the backing directory alone is a plain complete copy
    assert util.tree_snapshot(m.backing) == snap
    check_files(m.backing, want)
    assert os.readlink(j(m.backing, "a", "link")) == "b/c"
    some = sorted(want)[3]
    assert os.getxattr(j(m.backing, some), "user.ckpt") == b"step=42"
    assert util.tierfs_internals(m.backing) == [], "temporary versions left after unmount"
    # remount and read everything back through tierfs
    m.start()
    assert util.tree_snapshot(m.mnt) == snap
    check_files(m.mnt, want)
    assert os.getxattr(j(m.mnt, some), "user.ckpt") == b"step=42"
    # a second generation over files that exist in the backing dir
    for rel in sorted(want)[::3]:
        data = randbytes(rng.randrange(0, 2 * MiB), rng)
        if rng.random() < 0.5:
            write_file(j(m.mnt, rel), data)
        else:                                   # in place, no O_TRUNC
            fd = os.open(j(m.mnt, rel), os.O_WRONLY)
            os.write(fd, data)
            os.ftruncate(fd, len(data))
            os.close(fd)
        want[rel] = sha(data)
    for rel in sorted(want)[1::7]:
        os.unlink(j(m.mnt, rel))
        del want[rel]
    snap = util.tree_snapshot(m.mnt)
    m.remount()
    check_files(m.mnt, want)
    assert util.tree_snapshot(m.mnt) == snap
    m.umount()
    assert util.tree_snapshot(m.backing) == snap
    check_files(m.backing, want)


@pytest.mark.daemon
def test_sigterm_flushes(mount):
    rng = random.Random("sigterm")
    m = mount()
    want = make_tree(m.mnt, rng)
    fd = os.open(j(m.mnt, "last"), os.O_WRONLY | os.O_CREAT, 0o644)
    data = randbytes(20 * MiB, rng)
    os.write(fd, data)
    os.close(fd)
    want["last"] = sha(data)
    snap = util.tree_snapshot(m.mnt)
    m.kill(signal.SIGTERM)                    # must flush, unmount, exit 0
    assert not util.is_mounted(m.mnt)
    assert util.tree_snapshot(m.backing) == snap
    check_files(m.backing, want)
    m.start()
    check_files(m.mnt, want)


@pytest.mark.daemon
def test_fsync_survives_sigkill(mount):
    rng = random.Random("fsync-kill")
    m = mount()
    datas = {}
    for i in range(4):
        data = randbytes(rng.randrange(1, 8 * MiB), rng)
        fd = os.open(j(m.mnt, f"f{i}"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        datas[i] = data
    m.kill(signal.SIGKILL)
    for i, d in datas.items():
        assert_same(read_file(j(m.backing, f"f{i}")), d, f"backing f{i}")
    m.start()
    for i, d in datas.items():
        assert_same(read_file(j(m.mnt, f"f{i}")), d, f"f{i}")


def _gen(seed, size):
    return util.randbytes(size, random.Random(seed))


@pytest.mark.slow
@pytest.mark.daemon
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3])
def test_sigkill_never_torn(mount, delay):
    """Kill the daemon while large flushes are in flight: every file is afterwards
    its old complete version or its new complete version, never a mix."""
    nfiles, size = 4, 64 * MiB
    m = mount(host_cache="768M")
    old, new = {}, {}
    for i in range(nfiles):
        data = _gen(f"old{i}", size)
        fd = os.open(j(m.mnt, f"ck{i}"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, data)
        os.fsync(fd)                                  # the old version is durable
        os.close(fd)
        old[i] = sha(data)
    for i in range(nfiles):
        if i % 2 == 0:                                # overwrite in place, same size
            data = _gen(f"new{i}", size)
            fd = os.open(j(m.mnt, f"ck{i}"), os.O_WRONLY)
        else:                                         # truncate, different size
            data = _gen(f"new{i}", size - 16 * MiB + 4097)
            fd = os.open(j(m.mnt, f"ck{i}"), os.O_WRONLY | os.O_TRUNC)
        pos = 0
        while pos < len(data):
            pos += os.write(fd, data[pos:pos + 8 * MiB])
        os.close(fd)
        new[i] = sha(data)
    # a brand-new file never fsync'ed: absent, empty or complete
    fresh = _gen("fresh", 32 * MiB)
    write_file(j(m.mnt, "fresh"), fresh)
    if delay:
        time.sleep(delay)
    m.kill(signal.SIGKILL)

    def verdict(root):
        out = {}
        for i in range(nfiles):
            h = util.file_sha(j(root, f"ck{i}"))
            assert h in (old[i], new[i]), f"{root}/ck{i} is torn (neither old nor new)"
            out[i] = "new" if h == new[i] else "old"
        p = j(root, "fresh")
        if os.path.exists(p):
            h = util.file_sha(p)
            assert h in (sha(b""), sha(fresh)), f"{p} is torn"
        return out

    in_backing = verdict(m.backing)
    print("after SIGKILL:", in_backing)
    m.start()
    through_mount = verdict(m.mnt)
    assert through_mount == in_backing
    # and the file system still works normally over that backing dir
    write_file(j(m.mnt, "ck0"), b"after crash")
    m.umount()
    assert read_file(j(m.backing, "ck0")) == b"after crash"


def test_tiny_cache_eviction_and_write_through(mount):
    rng = random.Random("tiny")
    m = mount(host_cache="4M")
    want = {}
    for i in range(14):
        size = rng.randrange(1, 16 * MiB + 1)
        data = randbytes(size, rng)
        write_file(j(m.mnt, f"f{i}"), data, rng=rng)
        want[f"f{i}"] = sha(data)
        # re-read an earlier file (likely evicted) while writing the next ones
        k = f"f{rng.randrange(0, i + 1)}"
        assert util.file_sha(j(m.mnt, k)) == want[k], k
    # overwrite parts of some files in place
    for i in rng.sample(range(14), 5):
        p = j(m.mnt, f"f{i}")
        data = bytearray(read_file(p))
        off = rng.randrange(0, len(data))
        patch = randbytes(rng.randrange(1, 5 * MiB), rng)
        fd = os.open(p, os.O_WRONLY)
        os.pwrite(fd, patch, off)
        os.close(fd)
        data[off:off + len(patch)] = patch
        want[f"f{i}"] = sha(bytes(data))
    for name, h in want.items():
        assert util.file_sha(j(m.mnt, name)) == h, name
    m.umount()
    for name, h in want.items():
        assert util.file_sha(j(m.backing, name)) == h, f"backing {name}"
    m.start()
    for name, h in want.items():
        assert util.file_sha(j(m.mnt, name)) == h, name


@pytest.mark.gpu
def test_gpu_tier_roundtrip(mount):
    """With a GPU tier and a small host cache, data cascades GPU -> host -> SSD."""
    rng = random.Random("gpu")
    m = mount(gpu=util.GPU, host_cache="8M")
    want = {}
    for i in range(12):
        data = randbytes(rng.randrange(1, 24 * MiB), rng)
        write_file(j(m.mnt, f"g{i}"), data)
        want[f"g{i}"] = sha(data)
    for name, h in want.items():
        assert util.file_sha(j(m.mnt, name)) == h, name
    m.remount()
    for name, h in want.items():
        assert util.file_sha(j(m.mnt, name)) == h, name
    m.umount()
    for name, h in want.items():
        assert util.file_sha(j(m.backing, name)) == h, name


# ------------------------------------------------------------ ENOSPC

def _close_tolerant(fd):
    """close(); while the SSD is full close may also report the failed flush."""
    try:
        os.close(fd)
    except OSError as e:
        assert e.errno == errno.ENOSPC, e


def _fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        _close_tolerant(fd)


def _read_tolerant(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return util.pread_all(fd, os.fstat(fd).st_size)
    finally:
        _close_tolerant(fd)


def _deleted_fds(pid, backing):
    """The daemon's descriptors on removed files of the backing directory."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith(backing + "/") and t.endswith(" (deleted)"):
            out.append(t)
    return out


@pytest.mark.daemon
@pytest.mark.parametrize("op", ["unlink", "rename"])
def test_removal_answers_before_the_space_comes_back_and_enospc_waits_for_it(
        mount, full_tmpfs, monkeypatch, op):
    """The last close of a big removed file frees its blocks, which takes a
    backing file system a while (ext4 with discard: most of a second a GiB):
    unlink and rename over it answer first, and the closer thread closes it
    (here held for a long time by TIERFS_DELAY).  Until then the space is not
    back; an fsync that fails with ENOSPC meanwhile waits for those closes
    and is tried again, so freeing space and then syncing still works."""
    ssd = full_tmpfs("ssd32", "size=32M")
    rng = random.Random(f"close-later-{op}")
    filler = randbytes(20 * MiB, rng)
    monkeypatch.setenv("TIERFS_DELAY", "gone_close=4000")
    m = mount(backing=ssd, host_cache="64M", expect_errors=True)
    monkeypatch.delenv("TIERFS_DELAY")
    write_file(j(m.mnt, "filler"), filler)
    _fsync_path(j(m.mnt, "filler"))
    assert_same(read_file(j(m.mnt, "filler")), filler)
    a = randbytes(16 * MiB, rng)
    write_file(j(m.mnt, "a"), a)
    with pytest.raises(OSError) as ei:
        _fsync_path(j(m.mnt, "a"))
    assert ei.value.errno == errno.ENOSPC
    if op == "unlink":
        os.unlink(j(m.mnt, "filler"))
    else:
        write_file(j(m.mnt, "small"), b"x")
        os.rename(j(m.mnt, "small"), j(m.mnt, "filler"))
    # answered while the filler's blocks are still held (the closer
    # sleeps 4 s before closing): its descriptors are open, removed
    held = _deleted_fds(m.proc.pid, ssd)
    assert any("/filler" in t for t in held), held
    _fsync_path(j(m.mnt, "a"))                      # waits for the close
    assert not _deleted_fds(m.proc.pid, ssd)
    assert_same(read_file(j(ssd, "a")), a, "backing a")
    m.umount()
    assert_same(read_file(j(ssd, "a")), a, "backing a after unmount")


@pytest.mark.daemon
@pytest.mark.parametrize("make", ["create", "mkdir"])
def test_a_new_name_on_a_full_backing_directory_waits_for_the_closer(
        mount, full_tmpfs, monkeypatch, make):
    """Out of inodes (a tmpfs with few): a big file removed gives its inode
    back only at its last close, which the closer does later (held here by
    TIERFS_DELAY); creating a name meanwhile waits for it instead of failing
    with ENOSPC."""
    ssd = full_tmpfs("ssd-inodes", "size=64M,nr_inodes=24")
    monkeypatch.setenv("TIERFS_DELAY", "gone_close=3000")
    m = mount(backing=ssd, host_cache="64M", expect_errors=True)
    monkeypatch.delenv("TIERFS_DELAY")
    write_file(j(m.mnt, "big"), randbytes(12 * MiB, random.Random(5)))
    _fsync_path(j(m.mnt, "big"))
    n = 0
    with pytest.raises(OSError) as ei:      # the inodes used up
        while n < 100:
            os.close(os.open(j(m.mnt, f"f{n}"), os.O_WRONLY | os.O_CREAT, 0o644))
            n += 1
    assert ei.value.errno == errno.ENOSPC and n < 100, n
    os.unlink(j(m.mnt, "big"))
    assert any("/big" in t for t in _deleted_fds(m.proc.pid, ssd))
    if make == "create":
        os.close(os.open(j(m.mnt, "new"), os.O_WRONLY | os.O_CREAT, 0o644))
    else:
        os.mkdir(j(m.mnt, "new"))
    assert os.path.exists(j(ssd, "new"))
    m.umount()


@pytest.mark.daemon
@pytest.mark.parametrize("cache", ["direct", "writeback"])
@pytest.mark.parametrize("free_by", ["unlink", "grow"])
def test_enospc_on_fsync_then_recovers(mount, small_tmpfs, free_by, cache):
    rng = random.Random(f"enospc-{free_by}")
    filler = randbytes(5 * MiB, rng)
    write_file(j(small_tmpfs, "filler"), filler)        # 5 of 8 MiB used
    # writeback: the writes reach tierfs from the kernel's page cache
    opts = dict(writeback=True, no_direct_writes=True) if cache == "writeback" else {}
    m = mount(backing=small_tmpfs, host_cache="64M", expect_errors=True, **opts)
    assert_same(read_file(j(m.mnt, "filler")), filler)

    # A: written and closed; close may succeed (cached) or already report ENOSPC
    a = randbytes(6 * MiB, rng)
    size_a = len(a)
    fd = os.open(j(m.mnt, "a"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        n = os.write(fd, a)
    finally:
        _close_tolerant(fd)
    assert n == size_a, "a write must not fail or come up short: the cache has room"
    # fsync must report the failure: the data is not on the SSD
    fd = os.open(j(m.mnt, "a"), os.O_RDWR)
    try:
        with pytest.raises(OSError) as ei:
            os.fsync(fd)
        assert ei.value.errno == errno.ENOSPC
        # accepted data is still there (served from the cache)
        assert_same(util.pread_all(fd, len(a) + 1), a, "a via fd after ENOSPC")
    finally:
        _close_tolerant(fd)
    assert_same(_read_tolerant(j(m.mnt, "a")), a, "a after ENOSPC")
    assert os.stat(j(m.mnt, "a")).st_size == len(a)
    # a second fsync without freeing anything still fails (no silent drop)
    with pytest.raises(OSError) as ei:
        _fsync_path(j(m.mnt, "a"))
    assert ei.value.errno == errno.ENOSPC
    assert_same(_read_tolerant(j(m.mnt, "a")), a, "a after second ENOSPC")

    # free space on the SSD
    if free_by == "unlink":
        os.unlink(j(m.mnt, "filler"))
    else:
        subprocess.run(["mount", "-o", "remount,size=64M", small_tmpfs], check=True)
    _fsync_path(j(m.mnt, "a"))                          # now it succeeds
    assert_same(read_file(j(small_tmpfs, "a")), a, "backing a after recovery")
    assert_same(read_file(j(m.mnt, "a")), a)
    m.umount()
    assert_same(read_file(j(small_tmpfs, "a")), a, "backing a after unmount")
    if free_by == "grow":
        assert_same(read_file(j(small_tmpfs, "filler")), filler)
    else:
        assert not os.path.exists(j(small_tmpfs, "filler"))
