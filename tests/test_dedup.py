"""-o dedup: incremental flushes that share unchanged extents (reflink).

The backing directory is an XFS file system made with reflink=1 on a loop
file by the `xfs` fixture (skipped cleanly where mkfs.xfs or loop devices
are missing).  What is checked:

- dedup=on refuses a backing directory that cannot share extents (tmpfs),
  auto turns it off there with one log line and the data is still right;
- a file changed in place is flushed as a new version that writes only the
  changed blocks (the statistics) and shares the rest with the old version
  (FIEMAP_EXTENT_SHARED), byte-exact; truncates, extensions, mmap writes
  and hard links against a model;
- a kill during an incremental flush leaves the old or the new version;
- a small change in place is a journal record under dedup too (the
  default journal_pct), and the file's version, written in place, keeps
  its chunks in the index but those of the changed chunks.
"""

import ctypes
import errno
import fcntl
import json
import mmap
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest

import conftest
import util
from util import MiB, KiB

pytestmark = pytest.mark.daemon


@pytest.fixture
def mount(mount):
    """conftest's mount, with -o journal_pct=0 where dedup is on and the
    test does not say otherwise: the tests here are of the incremental
    flush, which a small change in place would otherwise skip (a journal
    record; those are tested by the *_journal* tests below)."""
    def factory(*args, **options):
        if options.get("dedup") == "on":
            options.setdefault("journal_pct", "0")
        return mount(*args, **options)
    return factory


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture
def btrfs(tmp_path):
    """A btrfs file system on a loop file (reflink always on); yields its root."""
    util.require_daemon()
    if not shutil.which("mkfs.btrfs"):
        pytest.skip("mkfs.btrfs not installed (btrfs-progs)")
    img, root = tmp_path / "btrfs.img", tmp_path / "btrfs"
    with open(img, "wb") as f:
        f.truncate(512 * MiB)
    r = _run(["mkfs.btrfs", "-q", str(img)])
    if r.returncode:
        pytest.skip(f"mkfs.btrfs failed: {r.stderr.strip()}")
    yield from conftest.loop_mounted(img, root, "btrfs")


@pytest.fixture
def tmpfs(tmp_path):
    root = tmp_path / "tmpfs"
    root.mkdir()
    r = _run(["mount", "-t", "tmpfs", "-o", "size=256M", "tmpfs", str(root)])
    if r.returncode:
        pytest.skip(f"cannot mount tmpfs: {r.stderr.strip()}")
    yield str(root)
    if _run(["umount", str(root)]).returncode:
        _run(["umount", "-l", str(root)])


def backing_in(fsroot, name="b"):
    path = os.path.join(fsroot, name)
    os.makedirs(path, exist_ok=True)
    return path


SHARED = "user.tierfs.shared"


def dstats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["dedup"]


def flush_seconds(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["ssd"]["seconds"]


FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 1
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_SHARED = 0x2000


def extents(path):
    """[(logical, length, flags)] of path (FS_IOC_FIEMAP)."""
    out, start, n = [], 0, 256
    with open(path, "rb") as f:
        while True:
            buf = bytearray(struct.pack("QQIIII", start, (1 << 64) - 1 - start,
                                        FIEMAP_FLAG_SYNC, 0, n, 0) + b"\0" * 56 * n)
            fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf)
            mapped = struct.unpack_from("I", buf, 20)[0]
            if not mapped:
                return out
            for i in range(mapped):
                lo, _, ln, _, _, fl = struct.unpack_from("QQQQQI", buf, 32 + 56 * i)
                out.append((lo, ln, fl))
            if out[-1][2] & FIEMAP_EXTENT_LAST:
                return out
            start = out[-1][0] + out[-1][1]


def shared_bytes(path):
    return sum(ln for _, ln, fl in extents(path) if fl & FIEMAP_EXTENT_SHARED)


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- -o dedup

def test_dedup_on_refuses_a_backing_that_cannot_share(tmp_path, tmpfs):
    m = util.Mount(tmp_path / "m", {"dedup": "on"}, backing=backing_in(tmpfs))
    try:
        with pytest.raises(util.DaemonError) as ei:
            m.start()
        assert "dedup=on" in str(ei.value) and "cannot share extents" in str(ei.value)
    finally:
        m.finish()
    assert util.tierfs_internals(m.backing) == []


def test_dedup_auto_is_off_where_it_cannot(mount, tmpfs):
    m = mount(backing=backing_in(tmpfs))
    assert "dedup: off" in m.log(), m.log()
    assert dstats(m)["on"] is False
    data = util.randbytes(3 * MiB + 5, random.Random(1))
    path = os.path.join(m.mnt, "f")
    util.write_file(path, data)
    with open(path, "r+b") as f:
        f.seek(MiB + 3)
        f.write(b"changed")
        f.flush()
        os.fsync(f.fileno())
    want = data[:MiB + 3] + b"changed" + data[MiB + 10:]
    util.assert_same(util.read_file(os.path.join(m.backing, "f")), want)
    s = dstats(m)
    assert s["files_incremental"] == 0 and s["bytes_cloned"] == 0
    assert os.getxattr(path, SHARED) == b"0 %d" % len(want)     # tmpfs: no FIEMAP
    m.umount()
    assert util.tierfs_internals(m.backing) == []


def test_dedup_bad_value(tmp_path):
    util.require_daemon()
    m = util.Mount(tmp_path, {"dedup": "maybe"})
    try:
        with pytest.raises(util.DaemonError) as ei:
            m.start()
        assert "bad dedup" in str(ei.value)
    finally:
        m.finish()


# ---------------------------------------------------------------- in place

def test_change_in_place_writes_only_the_changed_blocks(xfs, mount):
    m = mount(backing=backing_in(xfs), dedup="on", host_cache="256M")
    assert "dedup: on" in m.log()
    size = 64 * MiB
    data = bytearray(util.randbytes(size, random.Random(2)))
    path, bpath = os.path.join(m.mnt, "ckpt"), os.path.join(m.backing, "ckpt")
    util.write_file(path, bytes(data))
    fsync_path(path)
    s0 = dstats(m)
    t0 = flush_seconds(m)
    old = os.open(bpath, os.O_RDONLY)   # keeps the old version's blocks referenced
    try:
        fd = os.open(path, os.O_RDWR)
        os.pwrite(fd, b"\xaa" * 4096, 10 * MiB)          # one aligned block
        os.pwrite(fd, b"\xbb" * 10, 30 * MiB + 4090)     # straddles two blocks
        os.fsync(fd)
        os.close(fd)
        data[10 * MiB:10 * MiB + 4096] = b"\xaa" * 4096
        data[30 * MiB + 4090:30 * MiB + 4100] = b"\xbb" * 10
        s1 = dstats(m)
        assert s1["files_incremental"] == s0["files_incremental"] + 1
        assert s1["bytes_written"] - s0["bytes_written"] == 3 * 4096
        assert s1["bytes_cloned"] - s0["bytes_cloned"] == size - 3 * 4096
        assert s1["bytes_logical"] - s0["bytes_logical"] == size
        assert shared_bytes(bpath) == size - 3 * 4096
        assert os.fstat(old).st_ino != os.stat(bpath).st_ino
        # the flush's stages: a clone, the version's fsync, its commit
        t1 = flush_seconds(m)
        d = {k: t1[k] - t0[k] for k in t1}
        assert d["clone"] > 0 and d["sync"] > 0 and d["commit"] > 0, d
        assert d["total"] >= d["clone"] + d["sync"] + d["commit"], d
    finally:
        os.close(old)
    util.assert_same(util.read_file(bpath), bytes(data), "backing file")
    util.assert_same(util.read_file(path), bytes(data), "through the mount")
    m.umount()
    util.assert_same(util.read_file(bpath), bytes(data), "after unmount")
    assert util.tierfs_internals(m.backing) == []


def test_truncate_extend_mmap_against_a_model(xfs, mount):
    """Random in-place changes, cuts and extensions, flushed after each
    round: the backing file is byte-exact every time, and most flushes are
    incremental."""
    m = mount(backing=backing_in(xfs), dedup="on", host_cache="128M")
    rng = random.Random(3)
    path, bpath = os.path.join(m.mnt, "f"), os.path.join(m.backing, "f")
    model = bytearray(util.randbytes(6 * MiB + 123, rng))
    util.write_file(path, bytes(model))
    fsync_path(path)
    for rnd in range(24):
        fd = os.open(path, os.O_RDWR)
        try:
            for _ in range(rng.randint(1, 6)):
                op = rng.choice(["write", "write", "write", "shrink", "grow", "append",
                                 "mmap"])
                if op == "write" and model:
                    off = rng.randrange(len(model))
                    buf = util.randbytes(rng.choice([1, 17, 4096, 5000, 70000]), rng)
                    os.pwrite(fd, buf, off)
                    end = off + len(buf)
                    if end > len(model):
                        model.extend(b"\0" * (end - len(model)))
                    model[off:end] = buf
                elif op == "shrink" and model:
                    n = rng.randrange(len(model))
                    os.ftruncate(fd, n)
                    del model[n:]
                elif op == "grow":
                    n = len(model) + rng.randrange(1, 3 * MiB)
                    os.ftruncate(fd, n)
                    model.extend(b"\0" * (n - len(model)))
                elif op == "append":
                    buf = util.randbytes(rng.randrange(1, 200000), rng)
                    os.pwrite(fd, buf, len(model) + rng.randrange(0, 9000))
                    at = os.fstat(fd).st_size - len(buf)
                    model.extend(b"\0" * (at - len(model)))
                    model.extend(buf)
                elif op == "mmap" and len(model) > 8192:
                    with mmap.mmap(fd, len(model)) as mm:
                        off = rng.randrange(len(model) - 100)
                        buf = util.randbytes(100, rng)
                        mm[off:off + 100] = buf
                        model[off:off + 100] = buf
                        mm.flush()
            os.fsync(fd)
        finally:
            os.close(fd)
        util.assert_same(util.read_file(bpath), bytes(model), f"backing after round {rnd}")
    util.assert_same(util.read_file(path), bytes(model), "through the mount")
    s = dstats(m)
    assert s["files_incremental"] >= 12, s
    assert s["bytes_written"] < s["bytes_logical"] // 2, s
    m.umount()
    util.assert_same(util.read_file(bpath), bytes(model), "after unmount")


def test_hard_linked_file_changed_in_place(xfs, mount):
    """A hard-linked file's new version is copied over the file in place
    (under a commit intent in the journal): both names read the new
    content."""
    m = mount(backing=backing_in(xfs), dedup="on")
    a, b = os.path.join(m.mnt, "a"), os.path.join(m.mnt, "b")
    data = bytearray(util.randbytes(5 * MiB, random.Random(4)))
    util.write_file(a, bytes(data))
    os.link(a, b)
    fsync_path(a)
    for i in range(3):
        with open(b, "r+b") as f:
            f.seek(i * MiB + 7)
            f.write(b"linked%d" % i)
            f.flush()
            os.fsync(f.fileno())
        data[i * MiB + 7:i * MiB + 14] = b"linked%d" % i
        for p in (a, b, os.path.join(m.backing, "a"), os.path.join(m.backing, "b")):
            util.assert_same(util.read_file(p), bytes(data), p)
    assert os.stat(os.path.join(m.backing, "a")).st_ino == \
        os.stat(os.path.join(m.backing, "b")).st_ino
    m.umount()
    assert util.tierfs_internals(m.backing) == []


def test_rename_over_and_reload(xfs, mount):
    """A file replaced by a rename, and a file whose cached copy was
    dropped at unmount and reloaded: each flush is byte-exact."""
    m = mount(backing=backing_in(xfs), dedup="on")
    rng = random.Random(5)
    a, b = os.path.join(m.mnt, "a"), os.path.join(m.mnt, "b")
    da, db = bytearray(util.randbytes(3 * MiB, rng)), util.randbytes(2 * MiB, rng)
    util.write_file(a, bytes(da))
    util.write_file(b, db)
    fsync_path(a)
    fsync_path(b)
    os.rename(b, a)
    with open(a, "r+b") as f:
        f.seek(4096)
        f.write(b"x" * 10)
        f.flush()
        os.fsync(f.fileno())
    want = db[:4096] + b"x" * 10 + db[4106:]
    util.assert_same(util.read_file(os.path.join(m.backing, "a")), want)
    m.remount()
    with open(a, "r+b") as f:
        f.seek(MiB)
        f.write(b"y" * 5000)
        f.flush()
        os.fsync(f.fileno())
    want = want[:MiB] + b"y" * 5000 + want[MiB + 5000:]
    util.assert_same(util.read_file(os.path.join(m.backing, "a")), want)
    assert dstats(m)["files_incremental"] >= 1


# ---------------------------------------------------------------- kills

@pytest.mark.parametrize("point", ["incr_write", "new_linked"])
def test_kill_during_incremental_flush(xfs, tmp_path, monkeypatch, point):
    """SIGKILL in an incremental flush (after the clone and the first range;
    after the version is linked, before the rename): after the restart the
    file is the old or the new version, whole, and nothing is left over."""
    size = 16 * MiB
    old = util.randbytes(size, random.Random(6))
    new = old[:8 * MiB] + b"\x02" * 4096 + old[8 * MiB + 4096:12 * MiB] + \
        b"\x03" * 100 + old[12 * MiB + 100:]
    backing = backing_in(xfs)
    with open(os.path.join(backing, "f"), "wb") as f:     # made without tierfs
        f.write(old)
    m = util.Mount(tmp_path / "m", {"dedup": "on", "journal_pct": "0"}, backing=backing)
    try:
        monkeypatch.setenv("TIERFS_FAULT", point)
        m.start()
        path = os.path.join(m.mnt, "f")
        try:
            fd = os.open(path, os.O_RDWR)
            os.pwrite(fd, b"\x02" * 4096, 8 * MiB)
            os.pwrite(fd, b"\x03" * 100, 12 * MiB)
            os.fsync(fd)
            os.close(fd)
        except OSError:
            pass                # the daemon died under the fsync
        assert m.wait_death() == -9, m.log(tail=50)
        monkeypatch.delenv("TIERFS_FAULT")
        got = util.read_file(os.path.join(backing, "f"))
        assert got in (old, new), "torn after the kill"
        m.start()
        got = util.read_file(path)
        assert got in (old, new), "torn after the restart"
        m.umount()
        assert util.tierfs_internals(backing) == []
    finally:
        m.finish()


# ---------------------------------------------------------------- whole new files

def jstats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["journal"]


def test_a_small_change_in_place_is_a_journal_record_under_dedup_too(xfs, mount):
    """With the default journal_pct, a change of a few blocks of a file is
    made durable by one journal record (the fsync returns then) and written
    into the backing file in place, not made a new version by an
    incremental flush (journal_pct=0 keeps those).  The file's flushed
    version has its chunks in the index, and written in place it keeps
    them as after an incremental flush: the entries of the two changed
    chunks are no longer found (cloned, they would copy the new bytes into
    a file that wants the old ones), those chunks are indexed with their
    new content, and every other entry stays."""
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="256M",
              journal_pct="25")
    C, size = 64 * KiB, 8 * MiB
    old = util.randbytes(size, random.Random(11))
    path, bpath = os.path.join(m.mnt, "a"), os.path.join(m.backing, "a")
    write_sync(path, old)
    util.wait_flushed(m)
    ino = os.stat(bpath).st_ino
    s0, j0 = dstats(m), jstats(m)
    new = bytearray(old)
    fd = os.open(path, os.O_RDWR)
    for off in (3 * C + 100, 77 * C + 4000):            # two blocks of two chunks
        os.pwrite(fd, b"\x5a" * 64, off)
        new[off:off + 64] = b"\x5a" * 64
    os.fsync(fd)
    os.close(fd)
    j1 = jstats(m)
    assert j1["records_appended"] > j0["records_appended"], "not journalled"
    assert j1["bytes_appended"] - j0["bytes_appended"] < 64 * KiB, j1
    util.wait_flushed(m)
    s1 = dstats(m)
    assert s1["files_incremental"] == s0["files_incremental"], s1
    assert s1["files_full"] == s0["files_full"], s1
    assert jstats(m)["records_live"] == 0
    assert os.stat(bpath).st_ino == ino, "not written in place"
    util.assert_same(util.read_file(bpath), bytes(new), "a, applied in place")
    assert s1["versions_carried"] == s0["versions_carried"] + 1, s1
    n = size // C
    # the old content again, as a new file: all but the two changed chunks
    # are found in a
    write_sync(os.path.join(m.mnt, "b"), old)
    util.wait_flushed(m)    # its fsync returned at a clone record: its version after
    s2 = dstats(m)          # (the flush counts its lookups: in the GPU tier, after)
    util.assert_same(util.read_file(os.path.join(m.backing, "b")), old, "b (a's old content)")
    assert s2["chunks_found"] - s1["chunks_found"] == n - 2, s2
    # and the new content: every chunk (the changed ones with their new hashes)
    write_sync(os.path.join(m.mnt, "c"), bytes(new))
    util.wait_flushed(m)
    s3 = dstats(m)
    util.assert_same(util.read_file(os.path.join(m.backing, "c")), bytes(new),
                     "c (a's new content)")
    assert s3["chunks_found"] - s2["chunks_found"] == n, s3
    m.umount()
    util.assert_same(util.read_file(bpath), bytes(new), "a after the unmount")
    util.assert_same(util.read_file(os.path.join(m.backing, "b")), old, "b after the unmount")
    util.assert_same(util.read_file(os.path.join(m.backing, "c")), bytes(new),
                     "c after the unmount")


def write_sync(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def test_second_checkpoint_shares_the_chunks_it_repeats(xfs, mount):
    """ckpt.2 is ckpt.1 with a few chunks changed: its flush clones the
    others from ckpt.1 (shared extents) and writes only those chunks."""
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="256M")
    C, size = 64 * KiB, 32 * MiB + 1000          # a partial last chunk
    one = bytearray(util.randbytes(size, random.Random(7)))
    write_sync(os.path.join(m.mnt, "ckpt.1"), bytes(one))
    s0 = dstats(m)
    two = bytearray(one)
    two[3 * C + 5:3 * C + 9] = b"abcd"                       # chunk 3
    two[100 * C - 2:100 * C + 2] = b"wxyz"                   # chunks 99 and 100
    write_sync(os.path.join(m.mnt, "ckpt.2"), bytes(two))
    s1 = dstats(m)
    n = size // C
    assert s1["files_dedup"] == s0["files_dedup"] + 1, s1
    assert s1["chunks_found"] - s0["chunks_found"] == n - 3, s1
    assert s1["bytes_cloned"] - s0["bytes_cloned"] == (n - 3) * C, s1
    assert s1["bytes_written"] - s0["bytes_written"] == 3 * C + (size - n * C + 4095) // 4096 * 4096
    b1, b2 = os.path.join(m.backing, "ckpt.1"), os.path.join(m.backing, "ckpt.2")
    assert shared_bytes(b2) >= (n - 3) * C
    # the file's own report: what its backing file shares, and its size
    sh, sz = map(int, os.getxattr(os.path.join(m.mnt, "ckpt.2"), SHARED).split())
    assert sz == size and (n - 3) * C <= sh <= size, (sh, sz)
    write_sync(os.path.join(m.mnt, "other"), util.randbytes(MiB, random.Random(8)))
    assert os.getxattr(os.path.join(m.mnt, "other"), SHARED) == b"0 %d" % MiB
    util.expect_errno(errno.EPERM, os.setxattr, os.path.join(m.mnt, "other"), SHARED, b"1")
    util.expect_errno(errno.ENODATA, os.getxattr, m.mnt, SHARED)
    util.assert_same(util.read_file(b2), bytes(two), "ckpt.2")
    util.assert_same(util.read_file(b1), bytes(one), "ckpt.1")
    # a third one like the second: found in ckpt.2 and ckpt.1
    write_sync(os.path.join(m.mnt, "ckpt.3"), bytes(two))
    s2 = dstats(m)
    assert s2["chunks_found"] - s1["chunks_found"] == n
    out = _run([sys.executable, os.path.join(util.REPO_DIR, "tools", "tierfs-stat"), m.mnt])
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("dedup"))
    assert "2 by chunks" in line and "found" in line, line
    m.umount()
    for name, want in (("ckpt.1", one), ("ckpt.2", two), ("ckpt.3", two)):
        util.assert_same(util.read_file(os.path.join(m.backing, name)), bytes(want), name)
    assert util.tierfs_internals(m.backing) == []


def live_records(backing, typ):
    """The seqs of backing's journal records of type typ not retired."""
    recs = util.journal_records(backing)
    retired = {struct.unpack("<Q", p)[0] for t, _, p in recs if t == util.JNL_RETIRE}
    return [s for t, s, _ in recs if t == typ and s not in retired]


def base_links(backing):
    return [n for n in os.listdir(backing) if n.startswith(".tierfs.version.b")]


def series_of_three(seed):
    """A checkpoint (16 MiB and a partial chunk) and two more, each the one
    before it with three 64 KiB chunks changed (chunks 3, 99 and 100)."""
    rng = random.Random(seed)
    C, size = 64 * KiB, 16 * MiB + 1000
    out = [bytearray(rng.randbytes(size))]
    for _ in range(2):
        nxt = bytearray(out[-1])
        nxt[3 * C + 5:3 * C + 9] = rng.randbytes(4)
        nxt[100 * C - 2:100 * C + 2] = rng.randbytes(4)
        out.append(nxt)
    return C, size, [bytes(x) for x in out]


def second_recorded_on_the_first(m, seed, what):
    """series_of_three(seed)'s first checkpoint written, fsynced and
    indexed as ckpt.1, then the second as ckpt.2, whose fsync returns at a
    clone record based on ckpt.1 (one base link).  Returns C, size, ck and
    the two paths."""
    C, size, ck = series_of_three(util.pick_seed("TIERFS_DEDUP_SEED", seed, what))
    one, two = os.path.join(m.mnt, "ckpt.1"), os.path.join(m.mnt, "ckpt.2")
    write_sync(one, ck[0])
    util.wait_flushed(m)
    write_sync(two, ck[1])
    assert dstats(m)["records"] == 1
    assert len(base_links(m.backing)) == 1
    return C, size, ck, one, two


def kill_and_start(m, then):
    """SIGKILL m's daemon; then ("recover") tierfs --recover its backing
    directory; start it again (its own replay, where nothing was recovered)."""
    m.kill(signal.SIGKILL)
    if then == "recover":
        r = _run([util.tierfs_bin(), "--recover", m.backing])
        assert r.returncode == 0, r.stderr
    m.start()


def recording_mount(mount, monkeypatch, xfs, delay, **opts):
    """A mount on xfs with dedup (64 KiB chunks) and clone records
    (journal_pct=25), its daemon started with TIERFS_DELAY=delay; with a
    GPU tier where opts ask for one (ready when this returns)."""
    monkeypatch.setenv("TIERFS_DELAY", delay)
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="256M",
              journal_pct="25", **opts)
    monkeypatch.delenv("TIERFS_DELAY")
    if "gpu_cache" in opts:
        m.wait_gpu_tier()
    return m


@pytest.mark.parametrize("then", ["mount", "recover"])
def test_a_checkpoint_like_its_predecessor_is_durable_as_a_clone_record(xfs, mount,
                                                                      monkeypatch, then):
    """With a journal (journal_pct), the fsync of a new file that is an
    indexed version but for a few chunks (a checkpoint of a series)
    returns once a clone record is durable: those chunks and the tail in
    the journal, the version linked under a hidden name.  The new version
    is made after, from the same base; its durable commit retires the
    record and removes the link.  Then the flush of the third is held
    after its record (TIERFS_DELAY=clone_recorded), its base (the second)
    removed through the mount, and the daemon killed: the next mount, or
    tierfs --recover, applies the record: the file is whole and exact, and
    nothing hidden is left."""
    util.require_daemon()
    m = recording_mount(mount, monkeypatch, xfs, "clone_recorded=3000")
    C, size, ck = series_of_three(util.pick_seed("TIERFS_DEDUP_SEED", 4101, "clone record"))
    n = size // C
    write_sync(os.path.join(m.mnt, "ckpt.1"), ck[0])
    s0 = dstats(m)
    assert s0["records"] == 0, s0       # no base: a version
    write_sync(os.path.join(m.mnt, "ckpt.2"), ck[1])
    s1 = dstats(m)
    assert s1["records"] == 1, s1
    assert s1["bytes_recorded"] == 3 * C + (size - n * C), s1
    assert live_records(m.backing, util.JNL_CLONE), "no clone record"
    util.wait_flushed(m)                # its version, 3 s later
    assert live_records(m.backing, util.JNL_CLONE) == [], "the record stays live"
    assert base_links(m.backing) == []
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.2")), ck[1], "ckpt.2")
    assert shared_bytes(os.path.join(m.backing, "ckpt.2")) >= (n - 3) * C
    # the third: its version held back, its base removed, a kill
    write_sync(os.path.join(m.mnt, "ckpt.3"), ck[2])
    assert dstats(m)["records"] == 2
    assert os.path.getsize(os.path.join(m.backing, "ckpt.3")) == 0, "not held back"
    assert len(base_links(m.backing)) == 1
    os.unlink(os.path.join(m.mnt, "ckpt.2"))
    kill_and_start(m, then)
    util.assert_same(util.read_file(os.path.join(m.mnt, "ckpt.3")), ck[2], "ckpt.3 after " + then)
    assert sorted(os.listdir(m.mnt)) == ["ckpt.1", "ckpt.3"]
    m.umount()
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.3")), ck[2], "its backing file")
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.1")), ck[0], "ckpt.1")
    assert util.tierfs_internals(m.backing) == []


def test_a_clone_records_base_link_is_no_name_of_its_file(xfs, mount, monkeypatch):
    """While a clone record is live its base, the backing file of the
    checkpoint before, is linked under a hidden name in the backing root
    (its st_nlink there is one more).  That link is the journal's, not a
    name of the file: stat through the mount counts the file's names only,
    and the removal of its one name leaves no name (the file is gone, the
    base stays for the record).  (A second name waits for the record:
    test_a_hard_linked_file_is_no_live_base_to_write_over.)  The version is
    held 3 s after its record (TIERFS_DELAY=clone_recorded)."""
    util.require_daemon()
    m = recording_mount(mount, monkeypatch, xfs, "clone_recorded=3000", gpu="none")
    C, size, ck, one, two = second_recorded_on_the_first(m, 4121, "a clone record's base link")
    assert os.stat(os.path.join(m.backing, "ckpt.1")).st_nlink == 2, "the base is not ckpt.1"
    time.sleep(1.2)                     # the kernel's attributes of ckpt.1 expire
    assert os.stat(one).st_nlink == 1, "the journal's link counted as a name"
    os.unlink(one)
    assert not os.path.exists(one)
    assert not os.path.exists(os.path.join(m.backing, "ckpt.1"))
    assert live_records(m.backing, util.JNL_CLONE), "the record was retired before the checks"
    assert len(base_links(m.backing)) == 1, "the base went with its name"
    util.wait_flushed(m)
    assert base_links(m.backing) == []
    util.assert_same(util.read_file(two), ck[1], "ckpt.2")
    m.umount()
    assert sorted(os.listdir(m.backing)) == ["ckpt.2"]
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.2")), ck[1], "its backing file")


@pytest.mark.parametrize("change", ["whole", "small"])
def test_a_live_clone_records_base_is_never_written_in_place(xfs, mount, monkeypatch, change):
    """A clone record names its base, the backing file of the checkpoint
    before, by a hidden link to its inode: the replay clones that inode
    and writes the record's chunks over the clone.  So while the record is
    live, that inode must keep the content the record was made against.
    The first checkpoint is changed in place through the mount and fsynced
    while the second's record is live (its version held 5 s after the
    record, TIERFS_DELAY=clone_recorded): all of it rewritten ("whole":
    a new version, which the link must not make a hard-linked file's copy
    in place) or a few bytes ("small": a journal record, applied after).
    Then the daemon is killed and tierfs --recover run: both checkpoints
    read back as their last fsync left them."""
    util.require_daemon()
    m = recording_mount(mount, monkeypatch, xfs, "clone_recorded=5000", gpu="none")
    C, size, ck, one, two = second_recorded_on_the_first(m, 4131, "a live base changed in place")
    if change == "whole":
        new1 = util.randbytes(size, random.Random(4132))
    else:
        new1 = bytearray(ck[0])
        new1[5 * C + 10:5 * C + 74] = b"\xa5" * 64
        new1 = bytes(new1)
    fd = os.open(one, os.O_RDWR)
    try:
        if change == "whole":
            os.pwrite(fd, new1, 0)
        else:
            os.pwrite(fd, new1[5 * C + 10:5 * C + 74], 5 * C + 10)
        os.fsync(fd)
    finally:
        os.close(fd)
    # the small change's apply in place follows its fsync: give it the time
    deadline = time.monotonic() + 2
    while (change == "small" and time.monotonic() < deadline and
           util.read_file(os.path.join(m.backing, "ckpt.1")) != new1):
        time.sleep(0.05)
    assert live_records(m.backing, util.JNL_CLONE), "the record was retired before the kill"
    base = os.path.join(m.backing, base_links(m.backing)[0])
    assert os.stat(base).st_ino != os.stat(os.path.join(m.backing, "ckpt.1")).st_ino, \
        "ckpt.1 changed in its base's inode"
    kill_and_start(m, "recover")
    util.assert_same(util.read_file(two), ck[1], "ckpt.2, whose record's base was ckpt.1")
    util.assert_same(util.read_file(one), new1, "ckpt.1")
    m.umount()
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.2")), ck[1], "its backing file")
    assert util.tierfs_internals(m.backing) == []


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_hard_linked_file_is_no_live_base_to_write_over(xfs, mount, monkeypatch, when):
    """A file of several names is changed by copying its new version over
    its inode, so it is never taken as a clone record's base ("before":
    the second checkpoint's fsync makes a version, no record).  Linked
    while it is a live base ("after"), the link returns once the record's
    version (held 3 s, TIERFS_DELAY=clone_recorded) has retired it, and the
    file's next version is copied over an inode that nothing depends on: a
    kill right after its fsync, then tierfs --recover, leaves both files as
    their fsyncs left them."""
    util.require_daemon()
    m = recording_mount(mount, monkeypatch, xfs, "clone_recorded=3000", gpu="none")
    C, size, ck = series_of_three(util.pick_seed("TIERFS_DEDUP_SEED", 4141,
                                                 "a hard-linked base"))
    one, two = os.path.join(m.mnt, "ckpt.1"), os.path.join(m.mnt, "ckpt.2")
    write_sync(one, ck[0])
    util.wait_flushed(m)
    if when == "before":
        os.link(one, one + ".b")
    write_sync(two, ck[1])
    assert dstats(m)["records"] == (0 if when == "before" else 1)
    new1 = util.randbytes(size, random.Random(4142))
    if when == "after":
        os.link(one, one + ".b")
        assert live_records(m.backing, util.JNL_CLONE) == [], "linked while a live base"
        with open(one, "r+b") as f:
            f.write(new1)
            f.flush()
            os.fsync(f.fileno())
        assert live_records(m.backing, util.JNL_CLONE) == [], \
            "copied over a live record's base"
    kill_and_start(m, "recover")
    util.assert_same(util.read_file(two), ck[1], "ckpt.2")
    util.assert_same(util.read_file(one + ".b"), new1 if when == "after" else ck[0], "ckpt.1.b")
    assert os.stat(one).st_ino == os.stat(one + ".b").st_ino
    m.umount()
    assert util.tierfs_internals(m.backing) == []


@pytest.mark.parametrize("tier", ["host", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_checkpoint_rewritten_under_its_name_is_not_its_own_base(xfs, mount, monkeypatch,
                                                                   tier):
    """A clone record's replay writes the file's backing inode: that inode
    is never the record's base, whose clone the replay starts from.  A
    checkpoint rewritten whole under the same name with a few chunks
    changed (the only indexed version like it is its own) gets no record,
    in the host tier (the flush takes its version out of the index first)
    and in the GPU tier (the cascade's record, eng_dd_gpu_record); killed
    while its version is held (TIERFS_DELAY=clone_recorded), it reads back
    as its fsync left it after tierfs --recover."""
    util.require_daemon()
    opts = {"gpu_cache": "256M"} if tier == "gpu" else {"gpu": "none"}
    m = recording_mount(mount, monkeypatch, xfs, "clone_recorded=3000", **opts)
    C, size, ck = series_of_three(util.pick_seed("TIERFS_DEDUP_SEED", 4151,
                                                 "rewritten under its name"))
    p = os.path.join(m.mnt, "latest")
    write_sync(p, ck[0])
    util.wait_flushed(m)
    write_sync(p, ck[1])
    assert dstats(m)["records"] == 0, "its own backing file taken as its base"
    kill_and_start(m, "recover")
    util.assert_same(util.read_file(p), ck[1], "latest")
    m.umount()
    assert util.tierfs_internals(m.backing) == []


def test_the_next_checkpoint_waits_for_the_version_of_a_clone_record(xfs, mount, monkeypatch):
    """The fsync of a checkpoint that returned at a clone record comes
    before its version is in the chunk index.  The next checkpoint of the
    series, written at once, waits for that version (a second at most:
    tiers/dedup_flush.c, ddf_wait_pending) instead of taking the one before
    as its base: its record holds the three chunks it changed and the
    tail, not six.  The versions are held 0.5 s after their records
    (TIERFS_DELAY=clone_recorded)."""
    util.require_daemon()
    m = recording_mount(mount, monkeypatch, xfs, "clone_recorded=500")
    rng = random.Random(util.pick_seed("TIERFS_DEDUP_SEED", 4101, "clone records in a row"))
    C, size = 64 * KiB, 16 * MiB + 1000
    tail = size - (size // C) * C
    ck = [bytearray(rng.randbytes(size))]
    for chunks in ([3, 99, 100], [40, 150, 200]):
        nxt = bytearray(ck[-1])
        for c in chunks:
            nxt[c * C + 7:c * C + 11] = rng.randbytes(4)
        ck.append(nxt)
    write_sync(os.path.join(m.mnt, "ckpt.1"), bytes(ck[0]))
    util.wait_flushed(m)
    for i in (1, 2):
        before = dstats(m)
        write_sync(os.path.join(m.mnt, f"ckpt.{i + 1}"), bytes(ck[i]))
        st = dstats(m)
        assert st["records"] == before["records"] + 1, (i, before, st)
        got = st["bytes_recorded"] - before["bytes_recorded"]
        assert got == 3 * C + tail, (f"ckpt.{i + 1}: {got} bytes recorded, "
                                     f"{(got - tail) // C} chunks: not its predecessor's base")
    util.wait_flushed(m)
    for i in range(3):
        util.assert_same(util.read_file(os.path.join(m.backing, f"ckpt.{i + 1}")), bytes(ck[i]),
                         f"ckpt.{i + 1}")
    assert live_records(m.backing, util.JNL_CLONE) == []


def test_a_kill_before_a_clone_record_is_synced_leaves_the_old_file_or_the_new(
        xfs, mount, monkeypatch):
    """Killed after the clone record of a checkpoint is appended and before
    its sync (TIERFS_FAULT=clone_appended; its fsync never returned): the
    next start finds the file empty (the record torn or dropped) or whole
    (the record applied), never torn, and nothing hidden left."""
    util.require_daemon()
    C, size, ck = series_of_three(util.pick_seed("TIERFS_DEDUP_SEED", 4101, "clone record"))
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="256M",
              journal_pct="25")
    write_sync(os.path.join(m.mnt, "ckpt.1"), ck[0])
    m.umount()
    monkeypatch.setenv("TIERFS_FAULT", "clone_appended")
    m.start()
    monkeypatch.delenv("TIERFS_FAULT")
    write_sync(os.path.join(m.mnt, "ckpt.1b"), ck[0])    # indexed in this mount
    try:
        write_sync(os.path.join(m.mnt, "ckpt.2"), ck[1])
    except OSError:
        pass
    assert m.wait_death() == -9, m.log(tail=50)
    m.start()
    got = util.read_file(os.path.join(m.mnt, "ckpt.2"))
    assert got in (b"", ck[1]), "torn after the kill"
    util.assert_same(util.read_file(os.path.join(m.mnt, "ckpt.1b")), ck[0], "ckpt.1b")
    m.umount()
    assert util.tierfs_internals(m.backing) == []


def change_sync(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def test_sources_that_change_or_go_are_not_cloned(xfs, mount):
    """Chunks of a version that was replaced (changed in place, O_TRUNC) or
    removed are never cloned: of a file changed in place, the changed chunk's
    old content is not found any more, the others are (its entries are
    carried over to the new version); the new files are byte-exact."""
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="256M")
    rng = random.Random(8)
    C, n = 64 * KiB, 8 * MiB // (64 * KiB)
    a = util.randbytes(8 * MiB, rng)
    pa = os.path.join(m.mnt, "a")
    write_sync(pa, a)
    # a's version is replaced by an in-place change of one chunk
    change_sync(pa, MiB, b"!" * 10)
    s0 = dstats(m)
    assert s0["files_incremental"] >= 1 and s0["versions_carried"] >= 1, s0
    write_sync(os.path.join(m.mnt, "b"), a)
    s1 = dstats(m)
    assert s1["chunks_found"] - s0["chunks_found"] == n - 1, \
        "b: the changed chunk's old content cloned, or a's new version lost its entries"
    assert s1["bytes_written"] - s0["bytes_written"] == C, s1
    util.assert_same(util.read_file(os.path.join(m.backing, "b")), a, "b")
    # a and b removed: a file like them finds nothing
    os.unlink(pa)
    os.unlink(os.path.join(m.mnt, "b"))
    write_sync(os.path.join(m.mnt, "c"), a)
    s2 = dstats(m)
    assert s2["chunks_found"] == s1["chunks_found"], "cloned from a removed file"
    # c rewritten with O_TRUNC and other content; d like old c finds nothing
    write_sync(os.path.join(m.mnt, "c"), util.randbytes(8 * MiB, rng))
    write_sync(os.path.join(m.mnt, "d"), a)
    s3 = dstats(m)
    assert s3["chunks_found"] == s2["chunks_found"]
    util.assert_same(util.read_file(os.path.join(m.backing, "d")), a, "d")
    # e like d: d followed all-new files, so only its first chunks were
    # hashed (and indexed); e finds those, then hashes all of itself
    write_sync(os.path.join(m.mnt, "e"), a)
    s4 = dstats(m)
    assert s4["chunks_found"] > s3["chunks_found"]
    # and g like e finds every chunk
    write_sync(os.path.join(m.mnt, "g"), a)
    assert dstats(m)["chunks_found"] == s4["chunks_found"] + n
    m.umount()
    for name in "deg":
        util.assert_same(util.read_file(os.path.join(m.backing, name)), a, name)


def test_file_changed_in_place_again_and_again_stays_in_the_index(xfs, mount):
    """A file changed in place many times (a database, a log, a checkpoint
    updated in place) keeps its chunks in the index: after every change a
    new file with its current content finds every full chunk (the changed
    ones by their new hashes), a copy of an older content finds all but the
    chunks changed since, and every file is byte-exact in the backing
    directory after unmount."""
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="256M")
    rng = random.Random(21)
    C = 64 * KiB
    pa = os.path.join(m.mnt, "a")
    cur = bytearray(util.randbytes(2 * MiB, rng))
    write_sync(pa, bytes(cur))
    copies = {}
    for step in range(12):
        old = bytes(cur)
        # a few 4-64 byte changes; now and then the file grows or shrinks
        touched = set()
        for _ in range(rng.randint(1, 3)):
            off = rng.randrange(len(cur) - 64)
            data = util.randbytes(rng.randint(4, 64), rng)
            cur[off:off + len(data)] = data
            touched.update(range(off // C, (off + len(data) - 1) // C + 1))
        if step % 4 == 3:
            extra = util.randbytes(rng.randint(1, 3) * C + rng.randrange(C), rng)
            touched.update(range(len(cur) // C, (len(cur) + len(extra)) // C + 1))
            cur += extra
        if step % 4 == 1:
            cut = len(cur) - rng.randint(1, 2) * C - rng.randrange(C)
            touched.update(range(cut // C, len(cur) // C + 1))
            del cur[cut:]
        with open(pa, "r+b") as f:
            f.write(cur)
            f.truncate(len(cur))
            f.flush()
            os.fsync(f.fileno())
        s0 = dstats(m)
        # the current content: every full chunk found
        name = f"now{step}"
        write_sync(os.path.join(m.mnt, name), bytes(cur))
        s1 = dstats(m)
        assert s1["chunks_found"] - s0["chunks_found"] == len(cur) // C, (step, s0, s1)
        copies[name] = bytes(cur)
        os.unlink(os.path.join(m.mnt, name))	# only a holds those chunks
        # the content before this change: its changed chunks are not found
        s1 = dstats(m)
        name = f"old{step}"
        write_sync(os.path.join(m.mnt, name), old)
        s2 = dstats(m)
        full = len(old) // C
        stale = len([k for k in touched if k < full])
        assert s2["chunks_found"] - s1["chunks_found"] == full - stale, (step, s1, s2)
        copies[name] = old
        os.unlink(os.path.join(m.mnt, name))
    s = dstats(m)
    assert s["versions_carried"] >= 12, s
    copies["a"] = bytes(cur)
    keep = os.path.join(m.mnt, "last")
    write_sync(keep, bytes(cur))
    m.umount()
    util.assert_same(util.read_file(os.path.join(m.backing, "a")), bytes(cur), "a")
    util.assert_same(util.read_file(os.path.join(m.backing, "last")), bytes(cur), "last")


def test_chunks_are_not_shared_between_owners(xfs, mount):
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", allow_other=True)
    d = os.path.join(m.mnt, "d")
    os.mkdir(d)
    os.chmod(d, 0o777)
    data = util.randbytes(4 * MiB, random.Random(9))

    def as_user(name):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)     # the child cannot
        try:                                                # traverse tmp_path
            ok, text = util.in_child(write_sync, name, data, uid=1000, gid=1000,
                                     cwd_fd=dfd)
        finally:
            os.close(dfd)
        assert ok, text
    as_user("theirs")
    assert os.stat(os.path.join(m.backing, "d", "theirs")).st_uid == 1000
    s0 = dstats(m)
    write_sync(os.path.join(d, "mine"), data)
    s1 = dstats(m)
    assert s1["chunks_found"] == s0["chunks_found"], "shared across owners"
    as_user("theirs.2")
    assert dstats(m)["chunks_found"] == s1["chunks_found"] + 4 * MiB // (64 * KiB)
    util.assert_same(util.read_file(os.path.join(m.backing, "d", "theirs.2")), data)


def test_all_new_series_stops_hashing(xfs, mount):
    """Files that are all new: after a few, each is sampled (a few chunks
    hashed) and written without hashing the rest.  (On the host: the GPU
    tier hashes everything, test_gpu_tier_checkpoints_are_hashed_on_the_gpu.)"""
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="256M",
              gpu="none")
    rng = random.Random(10)
    files = {}
    for i in range(8):
        files[i] = util.randbytes(4 * MiB, rng)
        write_sync(os.path.join(m.mnt, f"new.{i}"), files[i])
    s = dstats(m)
    assert s["sampled_out"] == 7, s          # all but the first
    assert s["chunks_found"] == 0 and s["bytes_cloned"] == 0
    # a repeat is still found by its first chunks
    write_sync(os.path.join(m.mnt, "again"), files[7])
    s2 = dstats(m)
    assert s2["chunks_found"] > 0, s2
    m.umount()
    for i, data in files.items():
        util.assert_same(util.read_file(os.path.join(m.backing, f"new.{i}")), data)
    util.assert_same(util.read_file(os.path.join(m.backing, "again")), files[7])


def test_kill_during_dedup_flush(xfs, tmp_path, monkeypatch):
    backing = backing_in(xfs)
    one = util.randbytes(8 * MiB, random.Random(11))
    two = one[:MiB] + b"\x07" * 64 * KiB + one[MiB + 64 * KiB:]
    m = util.Mount(tmp_path / "m", {"dedup": "on", "dedup_chunk": "64K", "journal_pct": "0"},
                   backing=backing)
    try:
        m.start()
        write_sync(os.path.join(m.mnt, "one"), one)
        m.umount()
        # the index lives in the mount: ckpt "one" is flushed again first
        monkeypatch.setenv("TIERFS_FAULT", "dedup_write")
        m.start()
        write_sync(os.path.join(m.mnt, "one.b"), one)
        try:
            write_sync(os.path.join(m.mnt, "two"), two)
        except OSError:
            pass
        assert m.wait_death() == -9, m.log(tail=50)
        monkeypatch.delenv("TIERFS_FAULT")
        got = util.read_file(os.path.join(backing, "two"))
        assert got in (b"", two), "torn after the kill"
        m.start()
        assert util.read_file(os.path.join(m.mnt, "one")) == one
        m.umount()
        assert util.tierfs_internals(backing) == []
    finally:
        m.finish()


def test_removed_and_replaced_versions_free_their_space(xfs, mount):
    """The index holds a descriptor of each version it may clone from; a
    version replaced or removed must let its blocks go (its descriptor is
    closed), or the backing file system would fill up."""
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="256M")

    def used():
        s = os.statvfs(xfs)
        return (s.f_blocks - s.f_bfree) * s.f_frsize

    def settle(want_open):                   # the flushers close them
        util.wait_until(lambda: dstats(m)["versions_open"] == want_open,
                        lambda: f"{want_open} versions open: {dstats(m)}", 15)

    def used_below(limit):                   # closes and XFS's inode
        util.wait_until(lambda: used() - base < limit,      # inactivation run
                        lambda: f"less than {limit / MiB} MiB used: "   # in the
                        f"{(used() - base) / MiB} MiB", 15)              # background
        return True

    base = used()
    rng = random.Random(12)
    for i in range(4):
        write_sync(os.path.join(m.mnt, f"f{i}"), util.randbytes(16 * MiB, rng))
    settle(4)
    assert used() - base >= 64 * MiB
    for i in range(2):                       # replaced: O_TRUNC, other data
        write_sync(os.path.join(m.mnt, f"f{i}"), util.randbytes(16 * MiB, rng))
    for i in range(2, 4):
        os.unlink(os.path.join(m.mnt, f"f{i}"))
    settle(2)                                # f0, f1's new versions
    assert used_below(40 * MiB), (used() - base) / MiB
    for i in range(2):
        os.unlink(os.path.join(m.mnt, f"f{i}"))
    settle(0)
    assert used_below(8 * MiB), (used() - base) / MiB


def test_chunk_churn_against_a_model(xfs, mount):
    """Threads write files made of chunks from a small pool (so most chunks
    are found), rewrite them (O_TRUNC), change them in place, rename and
    remove them while the index clones from their versions: every file is
    byte-exact through the mount and in the backing directory."""
    import threading
    C = 64 * KiB
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="128M")
    pool = [util.randbytes(C, random.Random(100 + i)) for i in range(24)]
    models, errors = [], []

    def worker(w):
        rng = random.Random(1000 + w)
        model = {}
        models.append(model)
        names = [f"w{w}.{i}" for i in range(5)]
        try:
            for _ in range(60):
                name = rng.choice(names)
                path = os.path.join(m.mnt, name)
                op = rng.choice(["new", "new", "inplace", "rename", "unlink"])
                if op == "new":
                    data = b"".join(rng.choice(pool) for _ in range(rng.randint(1, 40)))
                    data += rng.choice(pool)[:rng.randrange(C)]
                    write_sync(path, data) if rng.random() < 0.7 else util.write_file(path, data)
                    model[name] = data
                elif op == "inplace" and name in model and len(model[name]) >= C:
                    at = rng.randrange(len(model[name]) // C) * C + rng.choice([0, 100])
                    buf = rng.choice(pool)[:rng.choice([10, 4096, C])]
                    with open(path, "r+b") as f:
                        f.seek(at)
                        f.write(buf)
                        f.flush()
                        if rng.random() < 0.5:
                            os.fsync(f.fileno())
                    d = bytearray(model[name])
                    end = at + len(buf)
                    if end > len(d):
                        d.extend(b"\0" * (end - len(d)))
                    d[at:end] = buf
                    model[name] = bytes(d)
                elif op == "rename" and name in model:
                    to = rng.choice(names)
                    os.rename(path, os.path.join(m.mnt, to))
                    model[to] = model.pop(name)
                elif op == "unlink" and name in model:
                    os.unlink(path)
                    del model[name]
        except Exception as e:          # reported by the main thread
            errors.append(f"worker {w}: {e!r}")

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for model in models:
        for name, data in model.items():
            util.assert_same(util.read_file(os.path.join(m.mnt, name)), data, name)
    s = dstats(m)
    assert s["chunks_found"] > 0 and s["files_dedup"] > 0, s
    m.umount()
    names = set()
    for model in models:
        for name, data in model.items():
            util.assert_same(util.read_file(os.path.join(m.backing, name)), data,
                             f"backing {name}")
            names.add(name)
    assert set(os.listdir(m.backing)) == names


def test_btrfs_in_place_and_by_chunks(btrfs, mount):
    """The same on btrfs: an in-place change writes its blocks only, a
    repeated checkpoint is cloned, both byte-exact and sharing extents."""
    m = mount(backing=backing_in(btrfs), dedup="on", dedup_chunk="64K", host_cache="256M")
    assert "dedup: on" in m.log()
    size = 16 * MiB
    data = bytearray(util.randbytes(size, random.Random(13)))
    path, bpath = os.path.join(m.mnt, "f"), os.path.join(m.backing, "f")
    write_sync(path, bytes(data))
    s = dstats(m)
    write_sync(os.path.join(m.mnt, "g"), bytes(data))     # a repeat: cloned
    g = bytes(data)
    s0 = dstats(m)
    assert s0["chunks_found"] - s["chunks_found"] == size // (64 * KiB)
    assert shared_bytes(os.path.join(m.backing, "g")) == size
    old = os.open(bpath, os.O_RDONLY)
    try:
        with open(path, "r+b") as f:
            f.seek(5 * MiB)
            f.write(b"\x11" * 4096)
            f.flush()
            os.fsync(f.fileno())
        data[5 * MiB:5 * MiB + 4096] = b"\x11" * 4096
        s1 = dstats(m)
        assert s1["files_incremental"] == s0["files_incremental"] + 1
        assert s1["bytes_written"] - s0["bytes_written"] == 4096
        assert shared_bytes(bpath) >= size - 4096
    finally:
        os.close(old)
    m.umount()
    util.assert_same(util.read_file(bpath), bytes(data), "f")
    util.assert_same(util.read_file(os.path.join(m.backing, "g")), g, "g")
@pytest.mark.gpu
def test_gpu_tier_checkpoints_are_hashed_on_the_gpu(xfs, mount):
    """Checkpoints written into the GPU tier get their chunk hashes from the
    GPU kernel (in the cascade, or at a flush from the GPU copy): the second,
    with three chunks changed, clones the others from the first; both are
    byte-exact, and so is a third after a write that fails half way."""
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K",
              gpu_cache="256M", host_cache="256M")
    m.wait_gpu_tier()
    C, size = 64 * KiB, 32 * MiB + 1000
    n = size // C
    one = bytearray(util.randbytes(size, random.Random(11)))
    two = bytearray(one)
    two[3 * C + 5:3 * C + 9] = b"abcd"
    two[100 * C - 2:100 * C + 2] = b"wxyz"
    s0 = dstats(m)
    for name, data in (("ckpt.1", one), ("ckpt.2", two)):
        p = os.path.join(m.mnt, name)
        with open(p, "wb") as f:
            f.write(data)
        assert "gpu" in os.getxattr(p, "user.tierfs.tier").decode()
        util.wait_flushed(m)
    s1 = dstats(m)
    assert s1["gpu_chunks_hashed"] - s0["gpu_chunks_hashed"] >= 2 * n, s1
    assert s1["chunks_found"] - s0["chunks_found"] == n - 3, s1
    assert s1["bytes_cloned"] - s0["bytes_cloned"] == (n - 3) * C, s1
    b1, b2 = os.path.join(m.backing, "ckpt.1"), os.path.join(m.backing, "ckpt.2")
    assert shared_bytes(b2) >= (n - 3) * C
    util.assert_same(util.read_file(b2), bytes(two), "ckpt.2")
    util.assert_same(util.read_file(b1), bytes(one), "ckpt.1")
    # rewritten after its hashes were taken: the stale hashes are not used
    p3 = os.path.join(m.mnt, "ckpt.3")
    with open(p3, "wb") as f:
        f.write(bytes(one))
    with open(p3, "r+b") as f:
        f.seek(7 * C)
        f.write(b"Z" * C)
    three = bytearray(one)
    three[7 * C:8 * C] = b"Z" * C
    util.wait_flushed(m)
    m.umount()
    for name, want in (("ckpt.1", one), ("ckpt.2", two), ("ckpt.3", three)):
        util.assert_same(util.read_file(os.path.join(m.backing, name)), bytes(want), name)
    assert util.tierfs_internals(m.backing) == []


@pytest.mark.gpu
@pytest.mark.parametrize("then", ["mount", "recover"])
def test_gpu_checkpoint_is_recorded_from_its_changed_chunks(xfs, mount, monkeypatch, then):
    """A checkpoint in the GPU tier that is an indexed version but for a
    few chunks gets its clone record in the cascade, from those chunks
    alone copied out of GPU memory (records_from_gpu), before the rest of
    the file crosses to the host: its fsync returns at the record.  The
    version follows and retires it.  Then the third's cascade is held after
    its record (TIERFS_DELAY=clone_recorded), its base removed, the daemon
    killed: the next mount, or tierfs --recover, applies the record, whose
    bytes are the chunks copied out of the GPU: the file is exact."""
    util.require_daemon()
    m = recording_mount(mount, monkeypatch, xfs, "clone_recorded=3000", gpu_cache="256M")
    C, size, ck = series_of_three(util.pick_seed("TIERFS_DEDUP_SEED", 4107,
                                                 "GPU clone record"))
    n = size // C
    p1 = os.path.join(m.mnt, "ckpt.1")
    write_sync(p1, ck[0])
    assert "gpu" in os.getxattr(p1, "user.tierfs.tier").decode()
    assert dstats(m)["records"] == 0
    util.wait_flushed(m)                # indexed: the next one's base
    write_sync(os.path.join(m.mnt, "ckpt.2"), ck[1])
    s = dstats(m)
    assert s["records"] == 1 and s["records_from_gpu"] == 1, s
    assert s["bytes_recorded"] == 3 * C + (size - n * C), s
    util.wait_flushed(m)                # its version, 3 s later
    assert live_records(m.backing, util.JNL_CLONE) == [], "the record stays live"
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.2")), ck[1], "ckpt.2")
    # the third: held after its record, its base removed, a kill
    write_sync(os.path.join(m.mnt, "ckpt.3"), ck[2])
    assert dstats(m)["records_from_gpu"] == 2
    assert os.path.getsize(os.path.join(m.backing, "ckpt.3")) == 0, "not held back"
    os.unlink(os.path.join(m.mnt, "ckpt.2"))
    kill_and_start(m, then)
    util.assert_same(util.read_file(os.path.join(m.mnt, "ckpt.3")), ck[2], "ckpt.3 after " + then)
    m.umount()
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.3")), ck[2], "its backing file")
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.1")), ck[0], "ckpt.1")
    assert util.tierfs_internals(m.backing) == []


@pytest.mark.gpu
def test_gpu_checkpoint_rewritten_after_its_record_leaves_no_version_pending(xfs, mount,
                                                                          monkeypatch):
    """A GPU checkpoint's record made in the cascade counts its version as
    pending (the next record waits for it to be indexed) until the flush of
    that content takes it over.  Rewritten between its record and that
    flush (the cascade held 1 s after the record, the writer waiting for
    it; every flush held 1.5 s before it starts, so that the writer changes
    the host copy first), the file's next flush is of other content: the
    pending version is dropped there, not left to make every later record
    wait; the file ends exact and the record is retired."""
    util.require_daemon()
    m = recording_mount(mount, monkeypatch, xfs, "clone_recorded=1000,flush_start=1500",
                        gpu_cache="256M")
    C, size, ck = series_of_three(util.pick_seed("TIERFS_DEDUP_SEED", 4109,
                                                 "GPU record, then a rewrite"))
    write_sync(os.path.join(m.mnt, "ckpt.1"), ck[0])
    util.wait_flushed(m)
    p2 = os.path.join(m.mnt, "ckpt.2")
    write_sync(p2, ck[1])               # returns at the record, the cascade held
    s = dstats(m)
    assert s["records_from_gpu"] == 1 and s["versions_pending"] == 1, s
    want = bytearray(ck[1])
    want[5 * C:5 * C + 4] = b"WXYZ"
    fd = os.open(p2, os.O_WRONLY)
    try:
        os.pwrite(fd, b"WXYZ", 5 * C)   # waits for the cascade
        os.fsync(fd)
    finally:
        os.close(fd)
    util.wait_flushed(m)
    s = dstats(m)
    assert s["versions_pending"] == 0, s
    assert live_records(m.backing, util.JNL_CLONE) == [], "the record stays live"
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.2")), bytes(want), "ckpt.2")
    m.umount()
    util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.2")), bytes(want),
                     "ckpt.2 after the unmount")
    assert util.tierfs_internals(m.backing) == []


@pytest.mark.gpu
def test_gpu_checkpoint_after_a_pending_version_is_recorded_by_its_flush(xfs, mount,
                                                                        monkeypatch):
    """A GPU checkpoint whose fsync comes while an earlier record's version
    is not yet indexed (every flush held 1.5 s before it starts) does not
    make the cascade wait for that version, which serves every GPU file:
    its record is left to its flush (gpu_records_left_to_flush), which
    waits for the version in a flusher and records it from the host copy.
    Both files end exact, every record retired, nothing pending."""
    util.require_daemon()
    m = recording_mount(mount, monkeypatch, xfs, "flush_start=1500", gpu_cache="256M")
    C, size, ck = series_of_three(util.pick_seed("TIERFS_DEDUP_SEED", 4111,
                                                 "GPU record after a pending version"))
    write_sync(os.path.join(m.mnt, "ckpt.1"), ck[0])
    util.wait_flushed(m)
    write_sync(os.path.join(m.mnt, "ckpt.2"), ck[1])    # its record, from the GPU
    s = dstats(m)
    assert s["records_from_gpu"] == 1 and s["versions_pending"] == 1, s
    write_sync(os.path.join(m.mnt, "ckpt.3"), ck[2])    # ckpt.2's version held
    s = dstats(m)
    assert s["records_from_gpu"] == 1 and s["records"] == 2, s
    assert s["gpu_records_left_to_flush"] == 1, s
    util.wait_flushed(m)
    s = dstats(m)
    assert s["versions_pending"] == 0, s
    assert live_records(m.backing, util.JNL_CLONE) == [], "a record stays live"
    for i in (1, 2):
        util.assert_same(util.read_file(os.path.join(m.backing, "ckpt.%d" % (i + 1))), ck[i],
                         "ckpt.%d" % (i + 1))
    m.umount()
    assert util.tierfs_internals(m.backing) == []


@pytest.mark.gpu
def test_gpu_all_new_series_is_sampled_and_indexed_whole(xfs, mount):
    """GPU-hashed files after an all-new one are looked up by a sample of
    chunks first (as the host hashes them): an all-new one is not looked up
    further, yet all its GPU hashes are indexed, so a copy of it finds every
    chunk."""
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K",
              gpu_cache="256M", host_cache="256M")
    m.wait_gpu_tier()
    C, size = 64 * KiB, 8 * MiB
    n = size // C
    rng = random.Random(24)
    one, two = util.randbytes(size, rng), util.randbytes(size, rng)
    s = []
    for name, data in (("one", one), ("two", two), ("three", two)):
        p = os.path.join(m.mnt, name)
        with open(p, "wb") as f:
            f.write(data)
        assert "gpu" in os.getxattr(p, "user.tierfs.tier").decode()
        util.wait_flushed(m)
        s.append(dstats(m))
    assert s[1]["sampled_out"] == s[0]["sampled_out"] + 1, s[1]     # two: all new
    assert s[1]["chunks_found"] == s[0]["chunks_found"], s[1]
    assert s[2]["chunks_found"] - s[1]["chunks_found"] == n, s[2]   # three: two's
    assert s[2]["bytes_cloned"] - s[1]["bytes_cloned"] == size, s[2]
    m.umount()
    for name, want in (("one", one), ("two", two), ("three", two)):
        util.assert_same(util.read_file(os.path.join(m.backing, name)), want, name)


def test_copies_of_a_file_changed_in_place_meanwhile_are_exact(xfs, mount):
    """One thread changes a file in place and fsyncs, again and again (its
    version in the index is suspended and carried over each time); others
    write copies of what they read of it as new files, which clone their
    chunks from its versions meanwhile.  Every copy in the backing directory
    is what its writer wrote: no clone takes bytes the flush changed."""
    import threading
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="64K", host_cache="256M")
    C, size = 64 * KiB, 4 * MiB
    pa = os.path.join(m.mnt, "a")
    write_sync(pa, util.randbytes(size, random.Random(5)))
    stop = time.monotonic() + 8
    errors = []

    def changer():
        rng = random.Random(6)
        try:
            with open(pa, "r+b") as f:
                while time.monotonic() < stop:
                    for _ in range(rng.randint(1, 8)):
                        f.seek(rng.randrange(size - 64))
                        f.write(util.randbytes(rng.randint(4, 64), rng))
                    f.flush()
                    os.fsync(f.fileno())
        except Exception as ex:         # noqa: BLE001
            errors.append(f"changer: {ex!r}")

    def copier(k):
        i = 0
        try:
            while time.monotonic() < stop:
                data = util.read_file(pa)
                name = f"c{k}.{i}"
                write_sync(os.path.join(m.mnt, name), data)
                got = util.read_file(os.path.join(m.backing, name))
                if got != data:
                    bad = [j for j in range(0, len(data), C) if got[j:j + C] != data[j:j + C]]
                    errors.append(f"{name}: chunks {bad[:8]} differ from what was written")
                    return
                os.unlink(os.path.join(m.mnt, name))
                i += 1
        except Exception as ex:         # noqa: BLE001
            errors.append(f"copier {k}: {ex!r}")

    threads = [threading.Thread(target=changer)] + \
        [threading.Thread(target=copier, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    s = dstats(m)
    assert s["versions_carried"] >= 5 and s["chunks_found"] > 0, s
    m.umount()


def test_file_loaded_from_backing_and_changed_in_place_is_indexed(xfs, mount):
    """A file that was in the backing directory before the mount (a
    database or checkpoint after a restart) has no version in the index;
    its first incremental flush hashes it whole once, later ones carry the
    entries over and hash only what changed: a new file with its content
    finds every full chunk each time (before, none)."""
    C, size = 64 * KiB, 4 * MiB
    n = size // C
    b = backing_in(xfs)
    rng = random.Random(41)
    cur = bytearray(util.randbytes(size, rng))
    util.write_file(os.path.join(b, "db"), bytes(cur))
    m = mount(backing=b, dedup="on", dedup_chunk="64K", host_cache="256M")
    p = os.path.join(m.mnt, "db")
    for step in range(3):
        off = rng.randrange(size - 64)
        cur[off:off + 10] = util.randbytes(10, rng)
        change_sync(p, off, bytes(cur[off:off + 10]))
        s0 = dstats(m)
        assert s0["files_incremental"] == step + 1, s0
        write_sync(os.path.join(m.mnt, f"copy{step}"), bytes(cur))
        s1 = dstats(m)
        assert s1["chunks_found"] - s0["chunks_found"] == n, (step, s0, s1)
        os.unlink(os.path.join(m.mnt, f"copy{step}"))
        if step:
            assert s0["versions_carried"] >= step, s0
    s = dstats(m)
    # hashed whole once (n), then the changed chunk of each later change
    # (1 or 2), and the three copies (n each)
    assert s["chunks_hashed"] <= 4 * n + 2 * 2, s
    m.umount()
    util.assert_same(util.read_file(os.path.join(b, "db")), bytes(cur), "db")


# ---------------------------------------------------------------- a flush's progress

def flush_progress(m):
    s = json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["ssd"]
    return s["flushes_running"], s["flush_done_bytes"]


def progress_during(m, path, do):
    """Run do() (which ends with an fsync of path) in a thread; return the
    largest ssd.flush_done_bytes seen while that flush ran."""
    import threading
    err = []

    def run():
        try:
            do()
        except OSError as e:
            err.append(e)
    t = threading.Thread(target=run)
    t.start()
    seen = 0
    while t.is_alive():
        running, done = flush_progress(m)
        if running:
            seen = max(seen, done)
        time.sleep(0.02)
    t.join()
    assert not err, err
    return seen


@pytest.mark.parametrize("how", ["by_chunks", "incremental"])
def test_progress_visible_during_a_dedup_flush(xfs, tmp_path, monkeypatch, how):
    """A dedup flush publishes its progress (cp->flushed_bytes: what eviction
    estimates a copy's wait from, and ssd.flush_done_bytes in the stats) as
    it goes, the bytes it cloned included, not only when it ends.
    TIERFS_DELAY holds the flush right after it cloned its base."""
    size, C = 8 * MiB, 64 * KiB
    one = util.randbytes(size, random.Random(21))
    two = one[:MiB] + b"\x05" * C + one[MiB + C:]
    monkeypatch.setenv("TIERFS_DELAY", "dedup_cloned=1500")
    m = util.Mount(tmp_path / "m", {"dedup": "on", "dedup_chunk": "64K", "host_cache": "256M",
                                    "journal_pct": "0"},
                   backing=backing_in(xfs))
    try:
        m.start()
        monkeypatch.delenv("TIERFS_DELAY")
        write_sync(os.path.join(m.mnt, "one"), one)      # all new: no clone
        s0 = dstats(m)
        if how == "by_chunks":
            path = os.path.join(m.mnt, "two")
            seen = progress_during(m, path, lambda: write_sync(path, two))
            key = "files_dedup"
        else:
            path = os.path.join(m.mnt, "one")
            seen = progress_during(m, path, lambda: change_sync(path, MiB, b"\x05" * C))
            key = "files_incremental"
        s1 = dstats(m)
        assert s1[key] == s0[key] + 1, s1
        cloned = s1["bytes_cloned"] - s0["bytes_cloned"]
        assert cloned >= size - 2 * C, s1
        # held after its clone: the cloned bytes were counted then
        assert seen >= cloned, f"progress seen during the flush {seen}, cloned {cloned}"
        assert flush_progress(m) == (0, 0)
        m.umount()
        util.assert_same(util.read_file(os.path.join(m.backing, os.path.basename(path))), two)
    finally:
        m.finish()


def test_large_file_is_indexed_whole_after_its_fsync(xfs, mount):
    """The chunks of a new version go into the index after its fsync
    waiters are woken, in batches (e->lock taken in turns): every one of
    them gets there, and a copy of the file finds them all."""
    C, size = 4 * KiB, 40 * MiB               # 10,240 chunks: three batches
    m = mount(backing=backing_in(xfs), dedup="on", dedup_chunk="4K", host_cache="256M")
    data = util.randbytes(size, random.Random(23))
    write_sync(os.path.join(m.mnt, "one"), data)
    n = size // C
    util.wait_until(lambda: dstats(m)["index_entries"] == n,
                    lambda: f"{n} entries: {dstats(m)}", 15)
    s0 = dstats(m)
    write_sync(os.path.join(m.mnt, "two"), data)
    s1 = dstats(m)
    assert s1["chunks_found"] - s0["chunks_found"] == n, s1
    assert s1["bytes_cloned"] - s0["bytes_cloned"] == size, s1
    m.umount()
    util.assert_same(util.read_file(os.path.join(m.backing, "two")), data)


def test_a_hard_linked_file_written_through_is_copied_where_extents_are_shared(xfs, mount):
    """The new version of a written-through file of several names is
    written into it in place on ext4 (test_journal.py), where its copy over
    the file would write all its data again.  Where extents are shared, that
    copy shares them and an apply would write the changes twice (5% more
    bytes under bench_stress on XFS, RESULTS 18x): the copy stays, with
    -o dedup=off too (the mount still probes the backing file system).
    Both names and the backing file read the content."""
    m = mount(backing=backing_in(xfs), dedup="off", host_cache="64M", flush_age="200")
    a, b = os.path.join(m.mnt, "a"), os.path.join(m.mnt, "b")
    rng = random.Random(6)
    data = bytearray(util.randbytes(256 << 10, rng))
    util.write_file(a, bytes(data))
    fsync_path(a)
    util.wait_flushed(m)
    os.link(a, b)
    tail = util.randbytes(4096, rng)
    fd = os.open(a, os.O_RDWR)
    os.pwrite(fd, tail, 40 * MiB)           # far past its end: written through
    os.fsync(fd)
    os.close(fd)
    util.wait_flushed(m)
    st = json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["ssd"]
    assert st["files_written_through"] == 1, st
    assert st["write_through_applies"] == 0, st
    data += bytes(40 * MiB - len(data)) + tail
    for p in (a, b, os.path.join(m.backing, "a"), os.path.join(m.backing, "b")):
        util.assert_same(util.read_file(p), bytes(data), p)
    m.umount()
    assert util.tierfs_internals(m.backing) == []
