"""Integrity of the engine's write, cascade and eviction paths under pressure.

Each test here reproduces a way tierfs once lost or mixed up data (see the
comment of each); they run several writers at once over small caches, where
eviction, flushes and the writers' waits interleave.
"""

import json
import os
import struct

import pytest

import util

MiB = util.MiB

pytestmark = pytest.mark.daemon


def block(writer, fileno, rnd, blk, size=MiB):
    """One block whose every 16 bytes say whose data it is."""
    return struct.pack("<IIII", writer, fileno, rnd, blk) * (size // 16)


def decode(data):
    return struct.unpack("<IIII", data[:16])


def check_file(path, writer, fileno, rnd, nblocks):
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == nblocks * MiB, f"{path}: {len(data)} bytes, want {nblocks * MiB}"
    for b in range(nblocks):
        want = block(writer, fileno, rnd, b)
        got = data[b * MiB:(b + 1) * MiB]
        if got != want:
            raise AssertionError(
                f"{path}: block {b} holds (writer, file, round, block) = "
                f"{decode(got)}, want {(writer, fileno, rnd, b)}")


def overwriter(mnt, writer, rounds, seed, min_mib, max_mib, nfiles, out):
    """Overwrite nfiles files of our own with O_TRUNC, 1 MiB writes, half of
    them fsync'd, and check each after its close.  With one file the reopen
    comes right after the close, while the file's flush runs."""
    rng = util.rng_for(seed)
    sizes = {}
    for rnd in range(rounds):
        for fileno in range(nfiles):
            path = os.path.join(mnt, f"w{writer}-f{fileno}")
            n = rng.randint(min_mib, max_mib)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for b in range(n):
                    os.write(fd, block(writer, fileno, rnd, b))
                if rng.random() < 0.5:
                    os.fsync(fd)
            finally:
                os.close(fd)
            sizes[fileno] = (rnd, n)
            check_file(path, writer, fileno, rnd, n)
    with open(out, "w") as f:
        json.dump(sizes, f)


def stats(mnt):
    return json.loads(os.getxattr(mnt, "user.tierfs.stats"))


@pytest.mark.slow
@pytest.mark.parametrize("policy,nfiles", [("score", 1), ("fifo", 1), ("score", 3)])
def test_concurrent_truncating_writers(mount, tmp_path, policy, nfiles):
    """Six writers overwriting their own files with O_TRUNC over a small
    host cache.  Once: a truncate waited for its copy's flush, the flushed
    copy was evicted meanwhile (room for another writer), and the old
    content (f->size bytes) was loaded into a one-block fragment, over other
    writers' copies: blocks of another file in a closed file, and EFAULT
    from open when the overrun passed the end of the cache.  Failed in
    every run before the fix (one file per writer, reopened at once)."""
    m = mount(host_cache="64M", evict=policy)
    writers = 6
    rounds = int(os.environ.get("TIERFS_INTEGRITY_ROUNDS", "15"))
    seed = util.pick_seed("TIERFS_INTEGRITY_SEED", 1, "overwriters")
    outs = [str(tmp_path / f"sizes{w}.json") for w in range(writers)]
    results = util.in_children([(overwriter, (m.mnt, w, rounds, seed + w, 8, 30, nfiles,
                                              outs[w]))
                                for w in range(writers)])
    failures = [text for ok, text in results if not ok]
    assert not failures, f"seed {seed} (TIERFS_INTEGRITY_SEED):\n" + "\n".join(failures)
    m.umount()
    for w in range(writers):
        with open(outs[w]) as f:
            sizes = json.load(f)
        for fileno, (rnd, n) in sizes.items():
            check_file(os.path.join(m.backing, f"w{w}-f{fileno}"), w, int(fileno), rnd, n)


def test_queued_then_deleted_frees_cache(mount):
    """A file queued in a restore order and deleted before it was read kept
    its cache space forever (the queue entry held the file, and its copy was
    protected as prefetched): 40 rounds filled a 64 MiB cache for good."""
    m = mount(host_cache="64M")
    for i in range(40):
        os.setxattr(m.mnt, "user.tierfs.restore_order", b"a\n")
        with open(os.path.join(m.mnt, "a"), "wb") as f:
            f.write(b"x" * (4 * MiB))
        os.unlink(os.path.join(m.mnt, "a"))
    def emptied():
        st = stats(m.mnt)
        return st if st["tiers"]["host"]["used"] == 0 else None
    st = util.wait_until(emptied, lambda: f"the host cache empty: it still holds "
                         f"{stats(m.mnt)['tiers']['host']['used']} bytes of deleted files",
                         20, 0.1)
    # the space is usable again: a file of nearly the cache's size fits
    # (once the cache is all faulted in: until then only part is usable)
    util.wait_until(lambda: stats(m.mnt)["host_touched"] >= st["tiers"]["host"]["capacity"],
                    "the host cache faulted in", 50, 0.1)
    with open(os.path.join(m.mnt, "b"), "wb") as f:
        f.write(b"y" * (60 * MiB))
    st = stats(m.mnt)
    assert st["ssd"]["files_written_through"] == 0, st


def test_deleted_files_room_comes_back_at_once(mount, monkeypatch):
    """The cache space of a file deleted after its last close came back
    only once the flusher thread got round to dropping the file's last
    references: a writer that filled the cache with short-lived files
    while the flusher was busy found it full of data nobody could read any
    more, and was written through to the SSD.  TIERFS_DELAY holds the
    flusher up at each flush (as a slow disk does)."""
    monkeypatch.setenv("TIERFS_DELAY", "flush_start=300")
    m = mount(host_cache="64M")
    monkeypatch.delenv("TIERFS_DELAY")
    for i in range(40):
        p = os.path.join(m.mnt, f"t{i % 3}")
        with open(p, "wb") as f:
            f.write(b"x" * (4 * MiB))
        os.unlink(p)
    st = stats(m.mnt)
    assert st["ssd"]["files_written_through"] == 0, st["ssd"]
    assert st["tiers"]["host"]["used"] == 0, st["tiers"]["host"]


def test_deleted_open_file_keeps_its_data(mount):
    """A file deleted while open is still read through its descriptor: its
    cached copy is not room to reuse until the last close, however full
    the cache gets meanwhile."""
    m = mount(host_cache="16M")
    p = os.path.join(m.mnt, "kept")
    data = os.urandom(6 * MiB)
    with open(p, "wb") as f:
        f.write(data)
    fd = os.open(p, os.O_RDONLY)
    try:
        os.unlink(p)
        for i in range(6):      # fill the cache several times over
            with open(os.path.join(m.mnt, f"fill{i}"), "wb") as f:
                f.write(bytes([i]) * (6 * MiB))
        assert os.pread(fd, len(data), 0) == data
    finally:
        os.close(fd)
    util.wait_until(lambda: stats(m.mnt)["tiers"]["host"]["used"] <= 3 * 6 * MiB,
                    lambda: f"at most 18 MiB in the host cache: {stats(m.mnt)['tiers']['host']}",
                    20, 0.1)


def reader_churn(mnt, worker, n):
    for i in range(n):
        p = os.path.join(mnt, f"r{worker}-{i % 4}")
        with open(p, "wb") as f:
            f.write(b"z" * 4096)
        fd = os.open(p, os.O_RDONLY)
        try:
            while os.read(fd, 65536):     # the last read is at the end: no copy pinned
                pass
        finally:
            os.close(fd)
        os.unlink(p)


def test_read_reply_outlived_by_inode(mount):
    """A read replied from the cache, then used the inode (tfile_read_end):
    meanwhile the reader could close the file and the kernel forget it, and
    the inode was freed under the read (AddressSanitizer: use after free in
    tfile_read_end, seen in the sanitizer build).  Readers that close and
    unlink right after their last read, from several processes."""
    m = mount()
    results = util.in_children([(reader_churn, (m.mnt, w, 400)) for w in range(4)])
    failures = [text for ok, text in results if not ok]
    assert not failures, "\n".join(failures)



def test_copy_discarded_while_its_flush_runs(mount, monkeypatch):
    """A file with a GPU copy and a host copy (cascaded, not yet flushed)
    is truncated past what both caches can hold: it goes write-through,
    which copies the newest content to a new version and drops every
    cached copy, the host copy too, although a flusher had meanwhile
    started flushing it.  That flush then ended by marking its copy FLUSHED
    while the writer had already dropped it (INIT): the daemon aborted on
    an illegal life-cycle transition (seen on the GPU machine under the
    crash torture).  TIERFS_DELAY orders the race: the flusher waits
    before it picks the host copy, the copy to the write-through version
    waits until that flush has started, and the flush waits until the
    copy has been dropped."""
    gpu = util.gpu_or_fake(monkeypatch)
    monkeypatch.setenv("TIERFS_DELAY", "flush_start=1000,shadow_copy=1200,flush_write=2000")
    m = mount(gpu=gpu, gpu_cache="32M", host_cache="16M")
    monkeypatch.delenv("TIERFS_DELAY")
    path = os.path.join(m.mnt, "f")
    data = util.randbytes(8 * MiB)
    util.write_file(path, data)        # to the GPU tier; its release cascades it
    util.wait_until(lambda: b"host" in os.getxattr(path, "user.tierfs.tier"),
                    lambda: f"the copy in host memory: {os.getxattr(path, 'user.tierfs.tier')}",
                    10, 0.01)
    os.truncate(path, 48 * MiB)       # room in neither cache: write-through
    want = data + bytes(40 * MiB)
    util.assert_same(util.read_file(path), want, "through the mount")
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    m.umount()
    util.assert_same(util.read_file(os.path.join(m.backing, "f")), want, "backing file")
