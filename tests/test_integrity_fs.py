"""Integrity of the FUSE side: the daemon's descriptors, removed files' space,
file names across link()/unlink(), attributes of removed files, and readers
after a new version is committed.

The tests of items 6, 7, 9 and 11 of issue 13 failed before their fixes;
the stale-descriptor test (lead of item 3) and the written-through removed
file passed already and guard the paths that the fixes changed.
"""

import errno
import json
import mmap
import os
import stat
import threading
import time

import pytest

import util
from util import MiB

pytestmark = pytest.mark.daemon


def stats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))


def daemon_fds(m):
    """What the daemon's descriptors point at (readlink of /proc/PID/fd/*)."""
    d = f"/proc/{m.proc.pid}/fd"
    out = []
    for n in os.listdir(d):
        try:
            out.append(os.readlink(os.path.join(d, n)))
        except OSError:
            pass            # closed meanwhile
    return out


def removed_held(m):
    """Descriptors of the daemon on removed files of the backing directory."""
    return [t for t in daemon_fds(m)
            if t.startswith(m.backing + "/") and t.endswith(" (deleted)")]


def settle(m):
    """Wait until no flush is queued or running (the stats say so)."""
    util.wait_flushed(m, timeout=20)


# ------------------------------------------------------------ item 6

def test_descriptors_bounded_with_many_files(mount):
    """A daemon limited to 256 descriptors serves 3,000 files: create,
    stat, read, mmap write, rename, unlink all succeed, and the daemon never
    holds more descriptors than its limit allows (one per known inode
    exhausted them: EMFILE, ENOMEM, EBADF, EPERM and a SIGBUS)."""
    limit = 256
    m = mount(nofile=limit)
    n = 3000
    peak = 0
    d = os.path.join(m.mnt, "many")
    os.mkdir(d)
    for i in range(n):
        with open(os.path.join(d, f"f{i:05d}"), "wb") as f:
            f.write(b"%08d" % i)
        if i % 500 == 0:
            peak = max(peak, len(daemon_fds(m)))
    for i in range(n):
        st = os.stat(os.path.join(d, f"f{i:05d}"))
        assert st.st_size == 8
    peak = max(peak, len(daemon_fds(m)))
    for i in range(0, n, 7):
        with open(os.path.join(d, f"f{i:05d}"), "rb") as f:
            assert f.read() == b"%08d" % i
    # an mmap writer on a file looked up long ago
    with open(os.path.join(d, "f00001"), "r+b") as f:
        mm = mmap.mmap(f.fileno(), 8)
        mm[:8] = b"MMAPPED!"
        mm.flush()
        mm.close()
    with open(os.path.join(d, "f00001"), "rb") as f:
        assert f.read() == b"MMAPPED!"
    for i in range(0, n, 2):
        os.rename(os.path.join(d, f"f{i:05d}"), os.path.join(d, f"r{i:05d}"))
    peak = max(peak, len(daemon_fds(m)))
    names = os.listdir(d)
    assert len(names) == n
    for name in names:
        os.unlink(os.path.join(d, name))
    os.rmdir(d)
    peak = max(peak, len(daemon_fds(m)))
    assert peak < limit, f"daemon held {peak} descriptors (limit {limit})"


@pytest.mark.parametrize("threads", [2, 8])
def test_max_fds_option(mount, threads):
    """-o max_fds=N bounds the descriptors kept on known files and
    directories; the versions that flushes hold open meanwhile are at most
    N/8 more (tierfs(8)), however many flushers there are and however many
    small files are due at once.  Counted all along, not once at the end:
    the flushers' groups of small files held 64 descriptors each."""
    m = mount(max_fds=64, flush_threads=threads, flush_age=200)
    base = len(daemon_fds(m))
    peak, stop = [base], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], len(os.listdir(f"/proc/{m.proc.pid}/fd")))
            time.sleep(0.0005)

    t = threading.Thread(target=sample)
    t.start()
    try:
        d = os.path.join(m.mnt, "d")
        os.mkdir(d)
        for i in range(1000):
            with open(os.path.join(d, f"f{i}"), "wb") as f:
                f.write(b"x")
        for i in range(1000):
            os.stat(os.path.join(d, f"f{i}"))
        os.sync()
        settle(m)
    finally:
        stop.set()
        t.join()
    held = len(daemon_fds(m))
    bound = base + 64 + 64 // 8 + 8
    assert held <= bound, f"{held} descriptors with max_fds=64 ({base} at start)"
    assert peak[0] <= bound, f"{peak[0]} descriptors at the peak with max_fds=64 ({base} at start)"


# ------------------------------------------------------------ item 7

def test_unlinked_file_space_returned(mount):
    """A removed file that had data is not held open by the daemon once
    nobody has it open: its space comes back (it stayed held until
    unmount)."""
    m = mount()
    a = os.path.join(m.mnt, "a")
    util.write_file(a, util.randbytes(4 * MiB))
    fd = os.open(a, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.stat(a)
    settle(m)
    os.unlink(a)
    util.wait_until(lambda: not removed_held(m), lambda: f"no removed file held: {removed_held(m)}")


def test_renamed_over_file_space_returned(mount):
    m = mount()
    b, c = os.path.join(m.mnt, "b"), os.path.join(m.mnt, "c")
    util.write_file(b, util.randbytes(4 * MiB))
    fd = os.open(b, os.O_RDONLY)
    os.fsync(fd)
    assert os.read(fd, 10)
    os.close(fd)
    new = util.randbytes(1 * MiB)
    util.write_file(c, new)
    settle(m)
    os.rename(c, b)
    util.wait_until(lambda: not removed_held(m), lambda: f"no removed file held: {removed_held(m)}")
    util.assert_same(util.read_file(b), new)


def test_open_unlinked_file_kept_until_close(mount):
    """An open file stays readable after its name is removed, and its space
    comes back at the last close."""
    m = mount()
    d = os.path.join(m.mnt, "d")
    data = util.randbytes(3 * MiB)
    util.write_file(d, data)
    fd = os.open(d, os.O_RDONLY)
    os.fsync(fd)
    settle(m)
    os.unlink(d)
    util.assert_same(util.pread_all(fd, len(data)), data)
    os.close(fd)
    util.wait_until(lambda: not removed_held(m), lambda: f"no removed file held: {removed_held(m)}")


def test_many_removed_files_not_held(mount):
    """Rotating checkpoints (write, then remove old ones) leaves nothing held."""
    m = mount()
    for i in range(40):
        util.write_file(os.path.join(m.mnt, f"ck{i}"), util.randbytes(256 * 1024))
        if i >= 4:
            os.unlink(os.path.join(m.mnt, f"ck{i - 4}"))
    settle(m)
    util.wait_until(lambda: not removed_held(m), lambda: f"no removed file held: {removed_held(m)}")
    assert sorted(os.listdir(m.mnt)) == sorted(f"ck{i}" for i in range(36, 40))


# ------------------------------------------------------------ item 9

@pytest.mark.parametrize("keep", ["new", "old"])
def test_link_then_unlink_flushes(mount, keep):
    """git's way of storing an object (write a temp file, link() it to its
    name, unlink() the temp name) flushes without error; the flush used to
    fail with EINVAL for an "(unlinked file)" and count flush_errors."""
    m = mount()
    for i in range(6):
        tmp = os.path.join(m.mnt, f"tmp_obj_{i}")
        obj = os.path.join(m.mnt, f"obj_{i}")
        data = util.randbytes(100 + 5000 * i)
        util.write_file(tmp, data, mode=0o444)
        os.link(tmp, obj)
        os.unlink(tmp if keep == "new" else obj)
        left = obj if keep == "new" else tmp
        fd = os.open(left, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        util.assert_same(util.read_file(left), data)
    settle(m)
    assert stats(m)["ssd"]["flush_errors"] == 0
    m.umount()
    for i in range(6):
        left = f"obj_{i}" if keep == "new" else f"tmp_obj_{i}"
        st = os.stat(os.path.join(m.backing, left))
        assert st.st_size == 100 + 5000 * i
        assert stat.S_IMODE(st.st_mode) == 0o444


# ------------------------------------------------------------ item 11

def test_opath_fstat_of_unlinked_file_keeps_mode(mount):
    """fstat of an O_PATH descriptor of an open, removed file reports the
    file's mode and owner (a version committed after the removal reported
    0600)."""
    m = mount()
    for i in range(8):
        p = os.path.join(m.mnt, f"u{i}")
        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o640)
        os.write(fd, util.randbytes((4 + 4 * i) * MiB))
        os.close(fd)            # its flush starts now ...
        rfd = os.open(p, os.O_RDONLY)
        pfd = os.open(p, os.O_PATH)
        os.unlink(p)            # ... and is often running still
        settle(m)
        time.sleep(1.1)         # past the attribute timeout
        for f in (rfd, pfd):
            st = os.fstat(f)
            assert stat.S_IMODE(st.st_mode) == 0o640, (i, oct(st.st_mode))
            assert st.st_uid == os.getuid()
        os.close(pfd)
        os.close(rfd)


# ------------------------------------------------------------ item 3 (lead)

def test_no_read_from_old_version_after_commit(mount):
    """Once a new version is committed (fsync returned), a read never comes
    from a descriptor of the version it replaced, whatever readers were
    using that descriptor at the time.  (swap_fd kept a borrowed read
    descriptor of the replaced version as the file's; the engine's locking
    made the window narrow: this test did not catch it before the fix.)"""
    m = mount(host_cache="16M")
    p = os.path.join(m.mnt, "big")
    size = 24 * MiB                 # larger than the cache: written through
    util.write_file(p, bytes([0]) * size)
    stop = threading.Event()
    errors = []

    def reader():
        try:
            while not stop.is_set():
                fd = os.open(p, os.O_RDONLY)
                try:
                    for off in range(0, size, 4 * MiB):
                        os.pread(fd, 64 * 1024, off)
                finally:
                    os.close(fd)
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for v in range(1, 16):
            fd = os.open(p, os.O_WRONLY)
            os.pwrite(fd, bytes([v]) * size, 0)
            os.fsync(fd)
            os.close(fd)
            fd = os.open(p, os.O_RDONLY)
            for off in range(0, size, 4 * MiB):
                got = os.pread(fd, 4096, off)
                assert got == bytes([v]) * 4096, (v, off, got[:4])
            os.close(fd)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors


def test_written_through_unlinked_file_space_returned(mount):
    """A file too big for the cache (written through to a new version on
    the SSD) and removed while open: its space comes back at the last
    close, version included."""
    m = mount(host_cache="16M")
    p = os.path.join(m.mnt, "big")
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    data = util.randbytes(32 * MiB)
    os.write(fd, data)
    os.unlink(p)
    util.assert_same(util.pread_all(fd, len(data)), data)
    os.close(fd)
    util.wait_until(lambda: not removed_held(m), lambda: f"no removed file held: {removed_held(m)}")


def test_daemon_out_of_descriptors_is_emfile(mount):
    """Directories held open count against the daemon's descriptors and are
    never closed under their user; when the daemon runs out, the caller
    gets EMFILE (not ENOMEM or EBADF), and all works again once they are
    closed."""
    m = mount(nofile=96)
    d = os.path.join(m.mnt, "dirs")
    os.mkdir(d)
    for i in range(200):
        os.mkdir(os.path.join(d, f"d{i}"))
    held, errs = [], set()
    for i in range(200):
        try:
            held.append(os.open(os.path.join(d, f"d{i}"), os.O_RDONLY | os.O_DIRECTORY))
        except OSError as e:
            errs.add(e.errno)
    assert errs, "the daemon never ran out of descriptors"
    assert errs <= {errno.EMFILE, errno.ENFILE}, [errno.errorcode[e] for e in errs]
    for fd in held:
        os.close(fd)
    for i in range(200):
        p = os.path.join(d, f"d{i}", "f")
        util.write_file(p, b"x" * i)
        assert util.read_file(p) == b"x" * i


def test_hardlinked_rewrite_survives_kill(tmp_path, monkeypatch):
    """A file with two names cannot be replaced by a rename: its new version
    is copied over it in place.  A kill in the middle of that copy must not
    leave it torn (half new, half old): after the restart both names read
    one whole version (the new one: it was journalled before the copy), and
    the journal is gone from the backing directory."""
    util.require_daemon("kills the daemon")
    size = 8 * MiB
    old, new = b"\x01" * size, b"\x02" * size
    m = util.Mount(tmp_path).start()
    a, b = os.path.join(m.mnt, "a"), os.path.join(m.mnt, "b")
    with open(a, "wb") as f:
        f.write(old)
        os.fsync(f.fileno())
    os.link(a, b)
    m.umount()

    monkeypatch.setenv("TIERFS_FAULT", "inplace_copy")
    m.start()
    try:
        with open(a, "r+b") as f:
            f.write(new)
            os.fsync(f.fileno())
    except OSError:
        pass                    # the daemon died under the fsync
    assert m.wait_death() == -9, m.log(tail=50)
    monkeypatch.delenv("TIERFS_FAULT")

    m.start()
    for path in (a, b):
        with open(path, "rb") as f:
            got = f.read()
        assert len(got) == size
        ones = got.count(1)
        assert got == new, (f"{os.path.basename(path)} after the kill: {ones} bytes of "
                            f"the old version, {size - ones} of the new one")
    assert os.stat(a).st_ino == os.stat(b).st_ino
    assert "finished an update cut short" in m.log(), m.log(tail=20)
    m.umount()
    left = [n for n in os.listdir(m.backing) if n.startswith(".tierfs")]
    assert left == [], left


def test_kill_before_rename_leaves_nothing_behind(tmp_path, monkeypatch):
    """A new version is linked under a temporary name, then renamed over the
    file.  A kill in between must leave the old version under the file's
    name and, after the restart, no temporary name anywhere in the backing
    directory (its blocks would be lost for good)."""
    util.require_daemon("kills the daemon")
    m = util.Mount(tmp_path).start()
    os.mkdir(os.path.join(m.mnt, "d"))
    path = os.path.join(m.mnt, "d", "a")
    with open(path, "wb") as f:
        f.write(b"\x01" * MiB)
    m.umount()
    monkeypatch.setenv("TIERFS_FAULT", "new_linked")
    m.start()
    try:
        with open(path, "r+b") as f:
            f.write(b"\x02" * MiB)
            os.fsync(f.fileno())
    except OSError:
        pass
    assert m.wait_death() == -9, m.log(tail=50)
    monkeypatch.delenv("TIERFS_FAULT")
    m.start()
    with open(path, "rb") as f:
        assert f.read() == b"\x01" * MiB
    m.umount()
    left = [os.path.join(d, n) for d, _, names in os.walk(m.backing)
            for n in names if n.startswith(".tierfs")]
    assert left == [], left


def test_startup_drops_uncommitted_journal_entries(tmp_path):
    """What a previous daemon left half done: a version whose record was
    never written, a record that cannot be read, a record for a file that
    has been replaced since.  None of it may touch a file; all of it goes."""
    util.require_daemon("reads the daemon log")
    m = util.Mount(tmp_path)
    b = m.backing
    with open(os.path.join(b, "f"), "wb") as f:
        f.write(b"keep")
    st = os.stat(os.path.join(b, "f"))
    with open(os.path.join(b, ".tierfs.redo.1.1"), "wb") as f:
        f.write(b"orphan version")
    with open(os.path.join(b, ".tierfs.redo.1.2.h"), "wb") as f:
        f.write(b"garbage\n")
    with open(os.path.join(b, ".tierfs.redo.1.3"), "wb") as f:
        f.write(b"XXXX")
    with open(os.path.join(b, ".tierfs.redo.1.3.h"), "wb") as f:
        f.write(f"tierfs-redo 1\n{st.st_dev} {st.st_ino + 12345} 4\nf".encode())
    with open(os.path.join(b, ".tierfs.new.1.1"), "wb") as f:
        f.write(b"never renamed")
    m.expect_errors()
    m.start()
    with open(os.path.join(m.mnt, "f"), "rb") as f:
        assert f.read() == b"keep"
    log = m.log()
    assert "unreadable record" in log and "no longer the file" in log, log
    m.umount()
    left = sorted(n for n in os.listdir(b) if n.startswith(".tierfs"))
    assert left == [], left


def test_startup_keeps_journal_entry_it_cannot_finish(tmp_path):
    """A journalled update that start-up cannot finish (here: the file is
    immutable) stays journalled, version included, and the next start-up
    finishes it."""
    util.require_daemon("reads the daemon log")
    m = util.Mount(tmp_path)
    b = m.backing
    target = os.path.join(b, "f")
    with open(target, "wb") as f:
        f.write(b"old!")
    os.link(target, os.path.join(b, "g"))
    st = os.stat(target)
    with open(os.path.join(b, ".tierfs.redo.1.1"), "wb") as f:
        f.write(b"new!")
    with open(os.path.join(b, ".tierfs.redo.1.1.h"), "wb") as f:
        f.write(f"tierfs-redo 1\n{st.st_dev} {st.st_ino} 4\nf".encode())
    import subprocess
    if subprocess.run(["chattr", "+i", target], capture_output=True).returncode:
        pytest.skip("chattr +i does not work here")
    try:
        m.expect_errors("cannot finish the update")
        m.start()
        m.umount()
    finally:
        subprocess.run(["chattr", "-i", target], check=True)
    left = sorted(n for n in os.listdir(b) if n.startswith(".tierfs"))
    assert left == [".tierfs.redo.1.1", ".tierfs.redo.1.1.h"], left
    m.start()
    with open(os.path.join(m.mnt, "g"), "rb") as f:
        assert f.read() == b"new!"
    m.umount()
    assert not [n for n in os.listdir(b) if n.startswith(".tierfs")]


# ------------------------------------------- small first versions, in place

def backing_stat(m, name):
    return os.stat(os.path.join(m.backing, name))


def wait_flushed(m, name, size):
    """Wait until the backing file has its new size (the kernel sends the
    release that queues the flush after close() returned), then settle."""
    util.wait_until(lambda: backing_stat(m, name).st_size == size, f"{name}'s size in the backing directory")
    settle(m)


def test_small_first_version_written_in_place(mount):
    """A new file whose first version fits in one page is written into the
    empty backing file that its create made: the same inode, its mode and
    xattrs, the cached mtime, no new version (no second inode)."""
    m = mount()
    p = os.path.join(m.mnt, "small")
    data = util.randbytes(3000)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    ino = backing_stat(m, "small").st_ino
    os.setxattr(p, "user.k", b"v")
    os.write(fd, data)
    os.close(fd)
    mtime = os.stat(p).st_mtime_ns
    wait_flushed(m, "small", len(data))
    st = backing_stat(m, "small")
    assert st.st_ino == ino, "a new inode for a one-page first version"
    assert (st.st_size, st.st_nlink, stat.S_IMODE(st.st_mode)) == (len(data), 1, 0o640)
    assert st.st_mtime_ns == mtime
    assert os.getxattr(os.path.join(m.backing, "small"), "user.k") == b"v"
    with open(os.path.join(m.backing, "small"), "rb") as f:
        assert f.read() == data
    m.umount()
    assert backing_stat(m, "small").st_ino == ino


def test_flushes_keep_a_file_capability_set_after_the_write(mount):
    """A file capability set after the last write stays through the flush of
    that write, also where the flush writes into the backing file itself (a
    one-page first version into its empty backing file, a hard-linked file's
    journalled copy): a write there takes the capability away (any write
    does), so tierfs must not lose the one the user set."""
    cap = bytes([1, 0, 0, 2, 0, 32] + [0] * 14)        # cap_net_raw=ep
    m = mount()
    small, linked = (os.path.join(m.mnt, n) for n in ("small", "linked"))
    for p in (small, linked):
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o755))
    util.write_file(linked, b"first" * 100)
    os.link(linked, os.path.join(m.mnt, "other"))
    settle(m)
    for p, data in ((small, b"abc"), (linked, b"second" * 100)):
        fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, data)
        os.setxattr(p, "security.capability", cap)   # after the write: kept
        os.fsync(fd)
        os.close(fd)
        assert os.getxattr(p, "security.capability") == cap, p
    m.umount()
    for n, data in (("small", b"abc"), ("linked", b"second" * 100), ("other", b"second" * 100)):
        p = os.path.join(m.backing, n)
        assert os.getxattr(p, "security.capability") == cap, n
        with open(p, "rb") as f:
            assert f.read() == data, n


def test_versions_that_cannot_go_in_place_are_renamed(mount):
    """Only an empty, singly linked backing file takes a one-page version in
    place: a larger first version, a rewrite of a non-empty file and a file
    with two names get a new version (renamed over it, or the journalled
    copy), and every name reads the whole new content."""
    m = mount()
    big, again, linked = (os.path.join(m.mnt, n) for n in ("big", "again", "linked"))
    for path in (big, again, linked):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    settle(m)
    ino = {n: backing_stat(m, n).st_ino for n in ("big", "again", "linked")}
    os.link(linked, os.path.join(m.mnt, "other"))
    util.write_file(big, b"b" * 5000)
    util.write_file(again, b"a" * 100)
    wait_flushed(m, "big", 5000)
    wait_flushed(m, "again", 100)
    assert backing_stat(m, "big").st_ino != ino["big"]
    assert backing_stat(m, "again").st_ino == ino["again"]
    util.write_file(again, b"A" * 50)          # non-empty now: a new version
    util.write_file(linked, b"l" * 200)        # two names: the journalled copy
    wait_flushed(m, "again", 50)
    wait_flushed(m, "linked", 200)
    assert backing_stat(m, "again").st_ino != ino["again"]
    assert backing_stat(m, "linked").st_ino == backing_stat(m, "other").st_ino
    m.umount()
    for name, want in (("big", b"b" * 5000), ("again", b"A" * 50),
                       ("linked", b"l" * 200), ("other", b"l" * 200)):
        with open(os.path.join(m.backing, name), "rb") as f:
            assert f.read() == want, name


def test_kill_after_small_first_version(tmp_path, monkeypatch):
    """A kill right after a one-page first version went into its empty
    backing file (before the sync): the file reads the whole version."""
    util.require_daemon("kills the daemon")
    monkeypatch.setenv("TIERFS_FAULT", "small_written")
    m = util.Mount(tmp_path).start()
    p = os.path.join(m.mnt, "f")
    data = util.randbytes(4096)
    util.write_file(p, data)
    assert m.wait_death() == -9, m.log(tail=50)
    monkeypatch.delenv("TIERFS_FAULT")
    m.start()
    with open(p, "rb") as f:
        assert f.read() == data
    m.umount()


# ------------------------------------------------ concurrent commits and names

def test_attrs_and_names_under_concurrent_commits(mount):
    """Writers in several directories rewrite files (each close commits a new
    version in the background, in place or renamed over the name) while they
    chmod them, set xattrs, rename them to another directory and back, and
    hard-link them there: each commit copies the attributes onto the new
    version and renames it over the file's current name, and nothing of that
    may be lost or land on the wrong name, whatever order the flushers and
    the namespace changes take.  Checked through the mount and, after the
    unmount, in the backing directory (mode, xattr, content, link count)."""
    m = mount()
    workers, files, rounds = 4, 6, 2000
    os.mkdir(os.path.join(m.mnt, "x"))
    model = {}                      # (w, k) -> [data, mode, xattr, where, linked]
    errors = []

    def where(w, k, place):
        return os.path.join(m.mnt, f"d{w}", f"f{k}") if place == "home" else \
            os.path.join(m.mnt, "x", f"{w}-{k}")

    def worker(w):
        rng = util.rng_for(w)
        os.mkdir(os.path.join(m.mnt, f"d{w}"))
        mine = {}
        for k in range(files):
            data = util.randbytes(rng.randrange(1, 12000), rng)
            util.write_file(where(w, k, "home"), data)
            mine[k] = [data, 0o644, None, "home", False]
        try:
            for _ in range(rounds):
                k = rng.randrange(files)
                st = mine[k]
                p = where(w, k, st[3])
                op = rng.randrange(6)
                if op == 0:             # rewrite: a commit follows the close
                    st[0] = util.randbytes(rng.choice([100, 3000, 5000, 20000]), rng)
                    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
                    os.write(fd, st[0])
                    if rng.random() < 0.2:
                        os.fsync(fd)
                    os.close(fd)
                elif op == 1:
                    st[1] = rng.choice([0o600, 0o640, 0o644, 0o755, 0o711])
                    os.chmod(p, st[1])
                elif op == 2:
                    st[2] = util.randbytes(rng.randrange(1, 64), rng)
                    os.setxattr(p, "user.v", st[2])
                elif op == 3:           # to the shared directory and back
                    st[3] = "x" if st[3] == "home" else "home"
                    os.rename(p, where(w, k, st[3]))
                elif op == 4:           # a second name in the other directory
                    other = where(w, k, "x" if st[3] == "home" else "home") + ".l"
                    if st[4]:
                        os.unlink(st[4])
                        st[4] = False
                    else:
                        os.link(p, other)
                        st[4] = other
                else:                   # both names, if two, see the same file
                    with open(p, "rb") as f:
                        assert f.read() == st[0], (w, k, "read back")
                    if st[4]:
                        assert os.stat(st[4]).st_ino == os.stat(p).st_ino, (w, k)
        except Exception as e:      # noqa: BLE001 (reported below)
            errors.append(f"worker {w}: {e!r}")
        for k, st in mine.items():
            model[(w, k)] = st

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

    def check(root, label):
        for (w, k), (data, mode, xv, place, linked) in model.items():
            p = where(w, k, place).replace(m.mnt, root, 1)
            st = os.stat(p)
            what = f"{label}: d{w}/f{k} at {place}"
            assert stat.S_IMODE(st.st_mode) == mode, what + " mode"
            assert st.st_nlink == (2 if linked else 1), what + " links"
            with open(p, "rb") as f:
                assert f.read() == data, what + " content"
            got = os.getxattr(p, "user.v") if xv is not None else None
            assert got == xv, what + " xattr"
            if linked:
                q = linked.replace(m.mnt, root, 1)
                assert os.stat(q).st_ino == st.st_ino, what + " second name"

    check(m.mnt, "mount")
    m.umount()
    check(m.backing, "backing directory")
