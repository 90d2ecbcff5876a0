"""Sparse files (issue 38): a hole stays a hole in the caches and in the
backing directory, a punched hole frees its blocks there, and SEEK_DATA /
SEEK_HOLE see the holes through the mount.

Each test failed before its fix (test_sparse_big_file_small_cache guards the
write-through path, which already kept holes).  No timings: the tests look at
cache use, allocated blocks, the daemon's I/O and memory.
"""

import errno
import json
import os
import sys

import pytest

import util

sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
import tierfs  # noqa: E402
from util import MiB

j = os.path.join

pytestmark = pytest.mark.daemon

KiB = 1024
GiB = 1024 * MiB
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
SEEK_DATA, SEEK_HOLE = 3, 4


def stats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))


def host_used(m):
    return stats(m)["tiers"]["host"]["used"]


def allocated(path):
    return os.stat(path).st_blocks * 512


def backing_fs(request, kind):
    """A backing directory on ext4 (the test's own tmp_path is one) or on a
    fresh XFS loop image."""
    if kind == "ext4":
        return None
    root = request.getfixturevalue("xfs")
    b = j(root, "backing")
    os.mkdir(b)
    return b


def daemon_io(m):
    io = {}
    with open(f"/proc/{m.proc.pid}/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            io[k] = int(v)
    return io


def daemon_hwm(m):
    with open(f"/proc/{m.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * KiB
    raise AssertionError("no VmHWM")


def settled(m, name, size):
    """Wait until name's backing file is its flushed version of `size` bytes
    (a file written through is committed at its RELEASE, which the kernel
    sends after close returns)."""
    util.wait_flushed(m)
    b = j(m.backing, name)
    util.wait_until(lambda: os.path.exists(b) and os.path.getsize(b) == size,
                    f"{b} to be {size} bytes")
    return b


def pwrite_file(path, data, off, flags=os.O_WRONLY | os.O_CREAT):
    fd = os.open(path, flags, 0o644)
    try:
        assert os.pwrite(fd, data, off) == len(data)
    finally:
        os.close(fd)


def check_zero_hole(path, size, pieces):
    """path holds `size` bytes: pieces ({offset: bytes}), zeros elsewhere
    (read in pieces, its page cache dropped first)."""
    assert os.path.getsize(path) == size
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        pos = 0
        while pos < size:
            n = min(8 * MiB, size - pos)
            got = os.pread(fd, n, pos)
            want = bytearray(n)
            for off, data in pieces.items():
                a, b = max(off, pos), min(off + len(data), pos + n)
                if a < b:
                    want[a - pos:b - pos] = data[a - off:b - off]
            assert got == bytes(want), f"bytes at {pos} differ"
            pos += n
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["ext4", "xfs"])
def test_far_write_leaves_a_hole(mount, request, kind):
    """One 4 KiB block written 192 MiB past the end of an empty file, with a
    host cache that could hold all of it: the cache does not fill the hole
    (its use stays about the block), and the flushed version in the backing
    directory has about one block allocated, not 192 MiB."""
    m = mount(backing=backing_fs(request, kind), host_cache="256M")
    p, block, off = j(m.mnt, "sparse"), os.urandom(4 * KiB), 192 * MiB
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.pwrite(fd, block, off) == len(block)
        assert host_used(m) < 4 * MiB, stats(m)["tiers"]["host"]
    finally:
        os.close(fd)
    b = settled(m, "sparse", off + len(block))
    assert allocated(b) <= 256 * KiB, f"{allocated(b)} bytes allocated in the backing file"
    check_zero_hole(p, off + len(block), {off: block})
    # written again in place: the file is not read whole into the cache
    pwrite_file(p, block, 0, os.O_WRONLY)
    assert host_used(m) < 4 * MiB, stats(m)["tiers"]["host"]
    util.wait_flushed(m)
    assert allocated(b) <= 512 * KiB, f"{allocated(b)} bytes allocated"
    with open(p, "rb") as f:
        assert f.read(len(block)) == block
    m.umount()
    m.start()
    check_zero_hole(p, off + len(block), {0: block, off: block})
    assert allocated(b) <= 512 * KiB


def test_ftruncated_file_flushes_sparse(tfs):
    """A file sized by ftruncate and written in two places (inside the
    cache): the zeros between are not written to the backing file."""
    p = j(tfs.mnt, "sized")
    a, b = os.urandom(64 * KiB), os.urandom(64 * KiB)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 32 * MiB)
        os.pwrite(fd, a, 0)
        os.pwrite(fd, b, 20 * MiB)
    finally:
        os.close(fd)
    util.wait_flushed(tfs)
    bp = j(tfs.backing, "sized")
    assert os.path.getsize(bp) == 32 * MiB
    assert allocated(bp) <= 1 * MiB, f"{allocated(bp)} bytes allocated"
    data = util.read_uncached(p)
    want = bytearray(32 * MiB)
    want[0:len(a)] = a
    want[20 * MiB:20 * MiB + len(b)] = b
    assert data == bytes(want)


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["64M", "8M"])
def test_sparse_random_model(mount, cache):
    """Random writes at random offsets (some far past the end), truncates
    and punched holes, checked against a model through the mount, in the
    backing file after each flush and after a remount; the backing file's
    allocation stays near the bytes that hold data."""
    seed = util.pick_seed("TIERFS_SPARSE_SEED", 3801, "sparse model")
    rng = util.rng_for(seed)
    m = mount(host_cache=cache)
    p, bp = j(m.mnt, "model"), j(m.backing, "model")
    model = bytearray()
    for rnd in range(4):
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for _ in range(24):
                op = rng.random()
                if op < 0.7:
                    n = rng.choice([1, 100, 4 * KiB, 70 * KiB, 1 * MiB])
                    base = len(model)
                    far = rng.random() < 0.3
                    off = (base + rng.randrange(2 * MiB, 96 * MiB) if far else
                           rng.randrange(0, max(1, base + 64 * KiB)))
                    data = rng.randbytes(n)
                    assert os.pwrite(fd, data, off) == n
                    if off + n > len(model):
                        model.extend(bytes(off + n - len(model)))
                    model[off:off + n] = data
                elif op < 0.85 and model:
                    off = rng.randrange(0, len(model))
                    n = rng.randrange(1, 8 * MiB)
                    util.fallocate(fd, off, n, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
                    e = min(off + n, len(model))
                    model[off:e] = bytes(e - off)
                else:
                    size = rng.randrange(0, len(model) + 32 * MiB)
                    os.ftruncate(fd, size)
                    if size < len(model):
                        del model[size:]
                    else:
                        model.extend(bytes(size - len(model)))
            assert os.fstat(fd).st_size == len(model)
        finally:
            os.close(fd)
        got = util.read_uncached(p)
        assert got == model, f"seed {seed}, round {rnd}: mount differs"
        util.wait_flushed(m)
        with open(bp, "rb") as f:
            assert f.read() == model, f"seed {seed}, round {rnd}: backing differs"
        # data blocks: the 64 KiB pieces that hold a byte other than zero
        # (holes shorter than that may be written), plus slack
        piece = 64 * KiB
        pieces = sum(1 for i in range(0, len(model), piece)
                     if model.count(0, i, i + piece) < min(piece, len(model) - i))
        assert allocated(bp) <= pieces * piece + 2 * MiB, \
            f"seed {seed}: {allocated(bp)} allocated for {pieces} pieces of data"
    m.umount()
    m.start()
    assert util.read_uncached(p) == model, f"seed {seed}: after remount"


@pytest.mark.parametrize("kind", ["ext4", "xfs"])
def test_punch_hole_frees_backing_blocks(mount, request, kind):
    """fallocate --punch-hole of 6 of 8 MiB frees them in the backing file
    once flushed (on XFS the file is flushed incrementally, -o dedup=auto:
    the hole is punched over the clone of the old version); zero-range
    zeroes (and grows the file without KEEP_SIZE); SEEK_HOLE / SEEK_DATA
    through the mount see the hole."""
    tfs = mount(backing=backing_fs(request, kind))
    p, bp = j(tfs.mnt, "punch"), j(tfs.backing, "punch")
    data = os.urandom(8 * MiB)
    util.write_file(p, data)
    util.wait_flushed(tfs)
    assert allocated(bp) >= 8 * MiB
    fd = os.open(p, os.O_RDWR)
    try:
        util.fallocate(fd, 1 * MiB, 6 * MiB, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
        assert os.fstat(fd).st_size == 8 * MiB
    finally:
        os.close(fd)
    want = bytearray(data)
    want[1 * MiB:7 * MiB] = bytes(6 * MiB)
    assert util.read_uncached(p) == bytes(want)
    util.wait_flushed(tfs)
    assert allocated(bp) <= 2 * MiB + 256 * KiB, f"{allocated(bp)} bytes allocated"
    with open(bp, "rb") as f:
        assert f.read() == bytes(want)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, SEEK_HOLE) == 1 * MiB
        assert os.lseek(fd, 1 * MiB, SEEK_DATA) == 7 * MiB
        assert os.lseek(fd, 7 * MiB, SEEK_HOLE) == 8 * MiB
        with pytest.raises(OSError) as ei:
            os.lseek(fd, 8 * MiB, SEEK_DATA)
        assert ei.value.errno == errno.ENXIO
    finally:
        os.close(fd)
    fd = os.open(p, os.O_RDWR)
    try:
        util.fallocate(fd, 0, 512 * KiB, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE)
        util.fallocate(fd, 7 * MiB + 512 * KiB, 2 * MiB, FALLOC_FL_ZERO_RANGE)
        assert os.fstat(fd).st_size == 9 * MiB + 512 * KiB
        # a hole punched past the end changes nothing
        util.fallocate(fd, 20 * MiB, 1 * MiB, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
        assert os.fstat(fd).st_size == 9 * MiB + 512 * KiB
    finally:
        os.close(fd)
    want[0:512 * KiB] = bytes(512 * KiB)
    want[7 * MiB + 512 * KiB:] = bytes(512 * KiB)
    want += bytes(9 * MiB + 512 * KiB - len(want))
    assert util.read_uncached(p) == bytes(want)
    util.wait_flushed(tfs)
    assert allocated(bp) <= 1 * MiB + 256 * KiB, f"{allocated(bp)} bytes allocated"
    tfs.umount()
    tfs.start()
    assert util.read_uncached(p) == bytes(want)


@pytest.mark.parametrize("kind", ["ext4", "xfs"])
def test_hard_linked_sparse_file_stays_sparse(mount, request, kind):
    """A sparse file of 1 GiB with a second name: a new version of it is
    copied over it in place (a rename would leave the other name the old
    one).  That copy writes the version's data alone, not its holes, and
    frees the blocks of a range punched out of it: the backing file stays
    about its data, as a file with one name does."""
    m = mount(backing=backing_fs(request, kind), host_cache="64M")
    p, bp = j(m.mnt, "linked"), j(m.backing, "linked")
    a, b, c = (util.rng_for(3810 + i).randbytes(64 * KiB) for i in range(3))
    size = 1 * GiB + len(b)
    pwrite_file(p, a, 0)
    pwrite_file(p, b, 1 * GiB, os.O_WRONLY)
    os.link(p, j(m.mnt, "other"))
    fd = os.open(p, os.O_WRONLY)
    try:
        os.pwrite(fd, c, 300 * MiB)
        os.fsync(fd)
    finally:
        os.close(fd)
    util.wait_flushed(m)
    assert allocated(bp) <= 1 * MiB, f"{allocated(bp)} bytes allocated in the backing file"
    check_zero_hole(bp, size, {0: a, 300 * MiB: c, 1 * GiB: b})
    assert os.stat(j(m.backing, "other")).st_ino == os.stat(bp).st_ino
    # a punched range of the new version is a hole in the file it is copied over
    fd = os.open(j(m.mnt, "other"), os.O_WRONLY)
    try:
        util.fallocate(fd, 0, len(a), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
        os.fsync(fd)
    finally:
        os.close(fd)
    util.wait_flushed(m)
    check_zero_hole(bp, size, {300 * MiB: c, 1 * GiB: b})
    assert allocated(bp) <= 512 * KiB, f"{allocated(bp)} bytes allocated in the backing file"
    m.umount()
    m.start()
    check_zero_hole(p, size, {300 * MiB: c, 1 * GiB: b})


def test_written_through_file_reopened_shares_one_version(mount):
    """A sparse file (written through: it has no cache copy) opened, written
    and closed 24 times in a row, as fsstress and logs do: the closes of
    one moment share one new version instead of committing one each, so
    the daemon copies the file's 8 MiB of data into a new version a few
    times, not 24 (on ext4, which cannot share extents).  The content is
    right in the backing file once flushed and after a remount."""
    m = mount(host_cache="16M")
    p, bp = j(m.mnt, "reopened"), j(m.backing, "reopened")
    rng = util.rng_for(3811)
    data = rng.randbytes(8 * MiB)
    pieces = {0: bytearray(data)}
    pwrite_file(p, data, 0)
    far = rng.randbytes(4 * KiB)
    pwrite_file(p, far, 1 * GiB, os.O_WRONLY)
    pieces[1 * GiB] = far
    util.wait_flushed(m)
    io0 = daemon_io(m)
    for i in range(24):
        blk = rng.randbytes(4 * KiB)
        pwrite_file(p, blk, i * 64 * KiB, os.O_WRONLY)
        pieces[0][i * 64 * KiB:i * 64 * KiB + len(blk)] = blk
    util.wait_flushed(m)
    wrote = daemon_io(m)["write_bytes"] - io0["write_bytes"]
    assert wrote <= 4 * 8 * MiB, f"the daemon wrote {wrote} bytes for 24 writes of 4 KiB"
    size = 1 * GiB + len(far)
    check_zero_hole(bp, size, {k: bytes(v) for k, v in pieces.items()})
    m.umount()
    m.start()
    check_zero_hole(p, size, {k: bytes(v) for k, v in pieces.items()})


def test_a_close_is_pending_until_its_release_is_over(mount, monkeypatch):
    """user.tierfs.stats' closes_pending counts a writable handle from its
    close(2) (FLUSH) until the daemon's release of it is over, held back
    here (TIERFS_DELAY=release=3000): a written-through file's new version
    is queued only at that release, which the kernel sends after close
    returns.  A mount-wide wait (util.wait_flushed, tierfs.wait_flushed on
    the mount) waits for it, so it covers the close: the backing file then
    has the data.  A descriptor duplicated and still open after its twin's
    close is counted for five seconds only (fs/fs.h, FS_CLOSE_GRACE)."""
    monkeypatch.setenv("TIERFS_DELAY", "release=3000")
    m = mount(host_cache="16M")
    monkeypatch.delenv("TIERFS_DELAY")
    p, bp = j(m.mnt, "f"), j(m.backing, "f")
    data = util.rng_for(3813).randbytes(32 * MiB)      # over the cache: written through

    def pending():
        return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["closes_pending"]
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data)
    assert pending() == 0
    os.close(fd)
    assert pending() == 1, "the close is not pending while its release is held back"
    assert tierfs.wait_flushed(m.mnt, timeout=60)
    assert pending() == 0
    util.assert_same(util.read_file(bp), data, "the backing file after a mount-wide wait")
    # a duplicate still open: its twin's close counts for the grace only
    fd = os.open(p, os.O_WRONLY)
    dup = os.dup(fd)
    os.close(fd)
    assert pending() == 1
    util.wait_released(m, timeout=30)       # the grace, not the duplicate's close
    os.close(dup)


def test_seek_hole_in_cached_and_written_through_files(mount):
    """SEEK_DATA / SEEK_HOLE on a file still in the cache (dirty) and on one
    being written through (too big for the cache): the holes are seen."""
    m = mount(host_cache="16M")
    p = j(m.mnt, "seek")
    blk = os.urandom(64 * KiB)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, blk, 0)
        os.ftruncate(fd, 4 * MiB)
        os.pwrite(fd, blk, 2 * MiB)
        # in the cache, not flushed (the handle is open)
        assert os.lseek(fd, 0, SEEK_HOLE) == 64 * KiB
        assert os.lseek(fd, 64 * KiB, SEEK_DATA) == 2 * MiB
        assert os.lseek(fd, 2 * MiB, SEEK_HOLE) == 2 * MiB + 64 * KiB
        os.pwrite(fd, blk, 1 * GiB)     # far: written through
        assert os.lseek(fd, 2 * MiB + 64 * KiB, SEEK_DATA) == 1 * GiB
        assert os.lseek(fd, 1 * GiB, SEEK_HOLE) == 1 * GiB + 64 * KiB
    finally:
        os.close(fd)


def test_sparse_big_file_small_cache(mount):
    """A 4 GiB file with 16 MiB of data in 16 places, through a 16 MiB host
    cache: the daemon neither writes nor holds the holes (disk writes, the
    backing file's blocks and the daemon's peak memory stay near the data),
    and a small change later keeps it so."""
    m = mount(host_cache="16M")
    p, bp = j(m.mnt, "big"), j(m.backing, "big")
    rng = util.rng_for(util.pick_seed("TIERFS_SPARSE_SEED", 3802, "sparse big"))
    pieces = {}
    io0 = daemon_io(m)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for i in range(16):
            off = i * 256 * MiB + rng.randrange(0, 200 * MiB) // (4 * KiB) * (4 * KiB)
            pieces[off] = rng.randbytes(1 * MiB)
            os.pwrite(fd, pieces[off], off)
        os.ftruncate(fd, 4 * GiB)
    finally:
        os.close(fd)
    util.wait_flushed(m)
    pwrite_file(p, b"x" * 100, 0, os.O_WRONLY)
    pieces[0] = b"x" * 100 + pieces.get(0, b"")[100:]
    util.wait_flushed(m)
    io1 = daemon_io(m)
    assert os.path.getsize(bp) == 4 * GiB
    assert allocated(bp) <= 24 * MiB, f"{allocated(bp)} bytes allocated"
    wrote = io1["write_bytes"] - io0["write_bytes"]
    assert wrote <= 200 * MiB, f"the daemon wrote {wrote} bytes to disk"
    assert daemon_hwm(m) <= 512 * MiB, f"daemon peak RSS {daemon_hwm(m)}"
    with open(p, "rb") as f:
        for off, data in pieces.items():
            f.seek(off)
            assert f.read(len(data)) == data


def test_a_sparse_growth_and_a_zeroed_range_are_journalled_as_holes(mount, request):
    """ext4 (no shared extents: small changes are journal records).  A
    write far past the end of a flushed file is a small change (its data
    only, not the hole before it): one journal record, and the hole stays a
    hole in the backing file.  A range zeroed inside the file, also a small
    change, frees its blocks there (the record's zeros punched, as a whole
    version leaves them unwritten)."""
    tfs = mount(backing=backing_fs(request, "ext4"))
    p, bp = j(tfs.mnt, "grow"), j(tfs.backing, "grow")
    data = os.urandom(4 * MiB)
    util.write_file(p, data)
    util.wait_flushed(tfs)
    before = stats(tfs)["journal"]["records_appended"]
    tail = os.urandom(64 * KiB)
    fd = os.open(p, os.O_RDWR)
    try:
        os.pwrite(fd, tail, 24 * MiB)   # a hole of 20 MiB: still cached
        os.fsync(fd)
    finally:
        os.close(fd)
    util.wait_flushed(tfs)
    assert stats(tfs)["journal"]["records_appended"] > before, "not journalled"
    want = bytearray(data) + bytes(20 * MiB) + tail
    with open(bp, "rb") as f:
        assert f.read() == bytes(want)
    assert allocated(bp) <= 4 * MiB + 64 * KiB + 256 * KiB, f"{allocated(bp)} bytes allocated"
    before = stats(tfs)["journal"]["records_appended"]
    fd = os.open(p, os.O_RDWR)
    try:
        util.fallocate(fd, 1 * MiB, 2 * MiB, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE)
        os.fsync(fd)
    finally:
        os.close(fd)
    util.wait_flushed(tfs)
    assert stats(tfs)["journal"]["records_appended"] > before, "not journalled"
    want[1 * MiB:3 * MiB] = bytes(2 * MiB)
    with open(bp, "rb") as f:
        assert f.read() == bytes(want)
    assert allocated(bp) <= 2 * MiB + 64 * KiB + 256 * KiB, f"{allocated(bp)} bytes allocated"


def test_a_writable_copy_of_an_evicted_sparse_file_reads_its_data_not_its_holes(mount):
    """A change to a file whose cached copy was evicted fills a new copy
    from the backing file: its data runs are read, its holes zeroed in the
    cache without a read.  It read the whole length: for 2 MiB of data in
    a 32 MiB file, 32 MiB through the page cache, which the kernel fills
    with pages of zeros for the holes.  The daemon's read calls (rchar)
    stay near the data, and the file reads back exact."""
    m = mount(host_cache="64M")
    p = j(m.mnt, "s")
    rng = util.rng_for(util.pick_seed("TIERFS_SPARSE_SEED", 3803, "sparse fill"))
    pieces = {0: rng.randbytes(MiB), 31 * MiB: rng.randbytes(MiB)}
    for off, data in pieces.items():
        pwrite_file(p, data, off)
    util.wait_flushed(m)
    os.setxattr(p, "user.tierfs.evict", b"1")
    assert host_used(m) == 0, "the copy was not evicted"
    io0 = daemon_io(m)
    pwrite_file(p, b"y" * 100, 16 * MiB, os.O_WRONLY)
    io1 = daemon_io(m)
    pieces[16 * MiB] = b"y" * 100
    read = io1["rchar"] - io0["rchar"]
    assert read <= 6 * MiB, f"the daemon read {read} bytes to change 100 of a 2 MiB file"
    check_zero_hole(p, 32 * MiB, pieces)
