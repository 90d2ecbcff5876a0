"""Small changes made durable as journal records (-o journal_pct).

On ext4 (no reflink), a file changed in place by a few bytes is not flushed as
a whole new version: the fsync appends the changed ranges to
BACKING/.tierfs.journal, syncs it and returns; the ranges are written into the
backing file afterwards, and the record retired.  Between a crash and the next
mount (or `tierfs --recover BACKING`), the backing directory holds the older
version plus the journal; either of them applies it, with the same result.

The backing file system is ext4 on a loop device mounted with a long commit
interval, as in test_power_cut.py: a copy of its image taken the moment an
fsync returns is what a power cut would leave.  TIERFS_DELAY=journal_apply=MS
holds the apply back, so that the record is all there is when the daemon is
killed; TIERFS_FAULT=journal_apply_torn kills the daemon halfway through an
apply.  Seeds are fixed and printed.
"""

import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading

import pytest

import util

MiB = 1 << 20
SEED = 3801
HOLD = "journal_apply=600000"       # the apply waits (the daemon is killed first)


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture
def disk(tmp_path):
    """(image, root): ext4 on a loop device that commits only when asked."""
    util.require_daemon()
    if not shutil.which("mkfs.ext4"):
        pytest.skip("mkfs.ext4 not installed")
    img, root = tmp_path / "ext4.img", tmp_path / "ext4"
    with open(img, "wb") as f:
        f.truncate(256 * MiB)
    r = _run(["mkfs.ext4", "-q", "-F", str(img)])
    if r.returncode:
        pytest.skip(f"mkfs.ext4 failed: {r.stderr.strip()}")
    root.mkdir()
    r = _run(["mount", "-o", "loop,commit=600", str(img), str(root)])
    if r.returncode:
        pytest.skip(f"cannot mount ext4 on a loop device: {r.stderr.strip()}")
    yield img, str(root)
    if _run(["umount", str(root)]).returncode:
        _run(["umount", "-l", str(root)])


class Cut:
    """A copy of the disk image as it is now (what a power cut leaves),
    mounted (ext4's own journal replayed) while in the with block."""

    def __init__(self, img, tmp_path, name):
        self.copy, self.root = tmp_path / f"{name}.img", tmp_path / name
        with open(img, "rb") as src, open(self.copy, "wb") as dst:
            shutil.copyfileobj(src, dst, 4 * MiB)

    def __enter__(self):
        self.root.mkdir(exist_ok=True)
        r = _run(["mount", "-o", "loop", str(self.copy), str(self.root)])
        assert r.returncode == 0, f"the cut image does not mount: {r.stderr}"
        return str(self.root)

    def __exit__(self, *exc):
        if _run(["umount", str(self.root)]).returncode:
            _run(["umount", "-l", str(self.root)])
        os.unlink(self.copy)


def recover(backing):
    return _run([util.tierfs_bin(), "--recover", backing])


def journal(backing):
    return os.path.join(backing, ".tierfs.journal")


def contents(seed=SEED, size=MiB):
    """(old, new, changes): a file's durable content, the one after a small
    change, and that change as [(offset, bytes)] (a few KiB of 1 MiB)."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    old = rng.randbytes(size)
    changes = [(5000, rng.randbytes(100)), (700001, rng.randbytes(4096)),
               (size - 10, rng.randbytes(30))]          # grows the file by 20
    new = bytearray(old)
    for off, b in changes:
        new[off:off + len(b)] = b
    return old, bytes(new), changes


def durable_file(m, name, data):
    """name in mount m holding data, flushed and synced (the base)."""
    path = os.path.join(m.mnt, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    util.wait_flushed(m)
    os.sync()
    return path


def change(path, changes, close_error_ok=False):
    """The small change, acknowledged by fsync (close_error_ok: a flush that
    failed after it, reported by close, is expected)."""
    fd = os.open(path, os.O_WRONLY)
    for off, b in changes:
        os.pwrite(fd, b, off)
    os.fsync(fd)
    try:
        os.close(fd)
    except OSError:
        if not close_error_ok:
            raise


def read(path):
    with open(path, "rb") as f:
        return f.read()


def fsync_eio(fd):
    """fsync fd: False, or True where it failed with EIO (any other error
    fails the test)."""
    try:
        os.fsync(fd)
    except OSError as e:
        assert e.errno == errno.EIO, e
        return True
    return False


def backing_on(disk):
    """A new backing directory on the disk."""
    backing = os.path.join(disk[1], "b")
    os.mkdir(backing)
    return backing


def seeded(seed):
    """A random.Random of seed, printed."""
    print(f"seed {seed}")
    return random.Random(seed)


def journalled(disk, mount, monkeypatch, delay=HOLD, names=("f",)):
    """A mount over the disk whose file f got a small change that fsync
    acknowledged and that is in the journal only (the apply held back):
    (m, backing, old, new)."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    old, new, changes = contents()
    if delay:
        monkeypatch.setenv("TIERFS_DELAY", delay)
    m = mount(backing=backing, host_cache="64M", dedup="off")
    path = durable_file(m, "f", old)
    for n in names[1:]:
        os.link(path, os.path.join(m.mnt, n))
    os.sync()
    change(path, changes)
    monkeypatch.delenv("TIERFS_DELAY", raising=False)
    return m, backing, old, new


def test_small_change_is_a_journal_record_then_applied_in_place(disk, mount, monkeypatch):
    m, backing, old, new = journalled(disk, mount, monkeypatch, delay=None)
    ino = os.stat(os.path.join(backing, "f")).st_ino
    util.wait_flushed(m)
    m.umount()
    assert read(os.path.join(backing, "f")) == new
    assert os.stat(os.path.join(backing, "f")).st_ino == ino, "a new version was written"
    assert util.tierfs_internals(backing) == [], "a clean unmount leaves the journal"


def jstats(m):
    """The "journal" member of mount m's user.tierfs.stats."""
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["journal"]


def test_the_counters_move_with_a_small_change(disk, mount):
    """A small change acknowledged by fsync is one record appended and
    synced, then retired once applied (one more record): user.tierfs.stats'
    "journal" says so, and nothing is left live."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    old, new, changes = contents()
    m = mount(backing=backing, host_cache="64M", dedup="off")
    path = durable_file(m, "f", old)
    before = jstats(m)
    assert before["on"] and before["records_replayed"] == 0, before
    change(path, changes)
    util.wait_until(lambda: jstats(m)["records_retired"] > before["records_retired"],
                    "the record's retirement")
    after = jstats(m)
    assert after["records_appended"] == before["records_appended"] + 2, (before, after)
    assert after["bytes_appended"] > before["bytes_appended"] + sum(len(b) for _, b in changes)
    assert after["syncs"] > before["syncs"], (before, after)
    assert after["records_retired"] == before["records_retired"] + 1, (before, after)
    assert after["records_live"] == 0 and after["records_replayed"] == 0, after
    m.umount()
    assert read(os.path.join(backing, "f")) == new


def test_the_next_mount_counts_the_records_it_replayed(disk, mount, monkeypatch):
    """A record left live by a killed daemon is applied by the next mount,
    which counts it in records_replayed (and starts its own counts at 0)."""
    m, backing, old, new = journalled(disk, mount, monkeypatch)
    assert jstats(m)["records_live"] == 1
    m.kill(signal.SIGKILL)
    m2 = mount(backing=backing, host_cache="64M", dedup="off")
    st = jstats(m2)
    assert st["records_replayed"] == 1 and st["records_live"] == 0, st
    assert st["records_appended"] == 0, st
    util.assert_same(read(os.path.join(m2.mnt, "f")), new, "f after the replay")
    m2.umount()


def assert_no_leftovers(backing):
    """Nothing of tierfs's own left in backing but the journal file and
    the temporary directory."""
    left = [p for p in util.tierfs_internals(backing)
            if os.path.basename(p) not in (".tierfs.journal", ".tierfs.journal.1",
                                           ".tierfs.tmp")]
    assert left == [], left


def same_names(root, names, want, what):
    """Every name of names under root reads want, and all are one inode."""
    for n in names:
        util.assert_same(read(os.path.join(root, n)), want, f"{n} {what}")
    assert len({os.stat(os.path.join(root, n)).st_ino for n in names}) == 1, \
        f"the names {names} are not one file {what}"


def both_ways(img, tmp_path, mount, want, what, names=("f",)):
    """The disk as it is now, recovered twice: by tierfs --recover on one
    copy of it and by the next mount on another; both give f (and every
    other name of names, one file) == want, and the same backing files."""
    os.sync()
    cut1, cut2 = Cut(img, tmp_path, "cut1"), Cut(img, tmp_path, "cut2")
    with cut1 as after:
        b = os.path.join(after, "b")
        assert os.path.getsize(journal(b)) > 0
        r = recover(b)
        assert r.returncode == 0, r.stderr
        by_recover = read(os.path.join(b, "f"))
        same_names(b, names, want, f"{what}, after tierfs --recover")
        assert not os.path.exists(journal(b)) or os.path.getsize(journal(b)) == 0
        r = recover(b)
        assert r.returncode == 0, r.stderr
        util.assert_same(read(os.path.join(b, "f")), want, "after a second --recover")
    with cut2 as after:
        b = os.path.join(after, "b")
        m2 = mount(backing=b, host_cache="64M", dedup="off")
        same_names(m2.mnt, names, want, f"{what}, through the next mount")
        m2.umount()
        util.assert_same(read(os.path.join(b, "f")), by_recover,
                         "the next mount against --recover")
        assert util.tierfs_internals(b) == [], "left after the next mount's unmount"


def test_after_a_kill_recover_and_the_next_mount_apply_the_record(disk, mount, monkeypatch,
                                                                 tmp_path):
    m, backing, old, new = journalled(disk, mount, monkeypatch)
    assert read(os.path.join(backing, "f")) == old, "the apply was held back"
    assert os.path.getsize(journal(backing)) > 0
    m.kill(signal.SIGKILL)
    # the backing directory holds the older version plus the journal
    both_ways(disk[0], tmp_path, mount, new, "after a kill")


def test_after_a_power_cut_recover_and_the_next_mount_apply_the_record(disk, mount,
                                                                      monkeypatch, tmp_path):
    m, backing, old, new = journalled(disk, mount, monkeypatch)
    img = disk[0]
    cut1, cut2 = Cut(img, tmp_path, "cut1"), Cut(img, tmp_path, "cut2")
    m.kill(signal.SIGKILL)
    with cut1 as after:
        b = os.path.join(after, "b")
        assert read(os.path.join(b, "f")) == old, "the cut came before the apply"
        r = recover(b)
        assert r.returncode == 0, r.stderr
        by_recover = read(os.path.join(b, "f"))
        util.assert_same(by_recover, new, "f after the cut and tierfs --recover")
    with cut2 as after:
        m2 = mount(backing=os.path.join(after, "b"), host_cache="64M", dedup="off")
        util.assert_same(read(os.path.join(m2.mnt, "f")), new, "f through the next mount")
        m2.umount()
        util.assert_same(read(os.path.join(after, "b", "f")), by_recover,
                         "the next mount against --recover")


def test_a_torn_tail_is_dropped(disk, mount, monkeypatch):
    m, backing, old, new = journalled(disk, mount, monkeypatch)
    m.kill(signal.SIGKILL)
    j, f = journal(backing), os.path.join(backing, "f")
    whole = read(j)
    # garbage after the record (a second record cut short): dropped, the
    # record before it applied
    with open(j, "ab") as out:
        out.write(b"\x54\x52\x4a\x31" + bytes(range(40)))
    r = recover(backing)
    assert r.returncode == 0, r.stderr
    util.assert_same(read(f), new, "f after a torn tail")
    # the record itself cut short (the fsync never returned): the older
    # version stays, whole
    with open(f, "wb") as out:
        out.write(old)
    with open(j, "wb") as out:
        out.write(whole[:len(whole) - 100])
    r = recover(backing)
    assert r.returncode == 0, r.stderr
    util.assert_same(read(f), old, "f after its record was torn")


def test_a_kill_during_the_apply(disk, mount, monkeypatch, tmp_path):
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    old, new, changes = contents(seed=SEED + 1)
    m = mount(backing=backing, host_cache="64M", dedup="off")
    path = durable_file(m, "f", old)
    m.umount()
    monkeypatch.setenv("TIERFS_FAULT", "journal_apply_torn")
    m.start()
    try:
        change(path, changes)       # acknowledged once the record is durable
    except OSError:
        pass                        # the daemon died first: nothing acknowledged
    m.wait_death()
    monkeypatch.delenv("TIERFS_FAULT")
    assert read(os.path.join(backing, "f")) not in (old, new), "the apply was not cut short"
    both_ways(img, tmp_path, mount, new, "after a kill in its apply")


def test_hard_linked_file_never_torn_after_recovery(disk, mount, monkeypatch):
    m, backing, old, new = journalled(disk, mount, monkeypatch, names=("f", "g"))
    m.kill(signal.SIGKILL)
    r = recover(backing)
    assert r.returncode == 0, r.stderr
    f, g = os.path.join(backing, "f"), os.path.join(backing, "g")
    assert os.stat(f).st_ino == os.stat(g).st_ino
    util.assert_same(read(g), new, "the other name after tierfs --recover")


def test_recover_refuses_a_backing_directory_in_use(disk, mount):
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    m = mount(backing=backing, host_cache="64M")
    r = recover(backing)
    assert r.returncode == 1 and "in use" in r.stderr, r
    m.umount()
    r = recover(backing)
    assert r.returncode == 0, r.stderr
    assert _run([util.tierfs_bin(), "--recover"]).returncode == 2


def test_a_copy_of_the_backing_directory_never_writes_the_original(disk, mount,
                                                                  monkeypatch):
    """A record names its file by path and inode (and file handle): replayed
    in a copy of the backing directory (other inodes), it is passed over,
    and never reaches the original through the handle."""
    m, backing, old, new = journalled(disk, mount, monkeypatch)
    m.kill(signal.SIGKILL)
    other = os.path.join(disk[1], "copy")
    shutil.copytree(backing, other, symlinks=True)
    r = recover(other)
    assert r.returncode == 0, r.stderr
    util.assert_same(read(os.path.join(backing, "f")), old, "the original, untouched")
    util.assert_same(read(os.path.join(other, "f")), old, "the copy, passed over")
    r = recover(backing)
    assert r.returncode == 0, r.stderr
    util.assert_same(read(os.path.join(backing, "f")), new, "the original, recovered")


def test_a_file_removed_before_its_apply_leaves_no_journal(disk, mount, monkeypatch):
    """A file removed right after an fsync that journalled its change (the
    flushes held back by TIERFS_DELAY): whether its record was applied or
    not, a clean unmount leaves no journal (a record of a removed file is
    retired with it, tfile_destroy)."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    old, new, changes = contents(size=200 << 10)
    monkeypatch.setenv("TIERFS_DELAY", "flush_start=1500")
    m = mount(backing=backing, host_cache="64M", dedup="off")
    path = durable_file(m, "f", old)
    change(path, changes[:1])
    assert os.path.getsize(journal(backing)) > 0
    os.unlink(path)
    monkeypatch.delenv("TIERFS_DELAY")
    m.umount()
    assert util.tierfs_internals(backing) == []


def unapplied(disk, mount, monkeypatch, seed):
    """f and g, two names of one durable file, then a small change of it
    acknowledged by fsync whose record cannot be applied
    (TIERFS_FAULT=journal_apply_eio, still set: the record stays):
    (m, img, backing, path of f, the file's content)."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    old, new, changes = contents(seed=seed)
    monkeypatch.setenv("TIERFS_FAULT", "journal_apply_eio")
    m = mount(backing=backing, host_cache="64M", dedup="off",
              expect_errors=["flush to SSD failed"])
    path = durable_file(m, "f", old)
    os.link(path, os.path.join(m.mnt, "g"))
    os.sync()
    change(path, changes, close_error_ok=True)  # a record, not applied
    assert os.path.getsize(journal(backing)) > 0
    return m, img, backing, path, new


def test_a_queued_flush_with_no_bytes_keeps_the_mount_unflushed(disk, mount, monkeypatch):
    """A file truncated to 0 and fsynced: a journal record, whose apply is
    a flush with no bytes in the backlog.  While it waits on the flush
    queue (here its apply fails, TIERFS_FAULT=journal_apply_eio, and is
    retried every second) the mount is not flushed: the statistics count it
    (flush_queued) and tierfs.wait_flushed of the mount goes on waiting
    (it once read flush_backlog 0 and nothing running as done)."""
    sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
    import tierfs
    backing = backing_on(disk)
    monkeypatch.setenv("TIERFS_FAULT", "journal_apply_eio")
    m = mount(backing=backing, host_cache="64M", dedup="off",
              expect_errors=["flush to SSD failed"])
    path = durable_file(m, "f", seeded(SEED + 5).randbytes(64 << 10))
    fd = os.open(path, os.O_WRONLY)
    os.ftruncate(fd, 0)
    os.fsync(fd)                    # the record is durable; its apply fails
    try:
        os.close(fd)                # which the close may report
    except OSError as e:
        assert e.errno == errno.EIO, e
    assert jstats(m)["records_live"] == 1
    util.wait_until(lambda: ssd_stats(m)["flush_errors"] > 0, "the apply to fail")
    st = ssd_stats(m)
    assert st["flush_backlog"] == 0 and st["flush_queued"] + st["flushes_running"] >= 1, st
    with pytest.raises(TimeoutError):
        tierfs.wait_flushed(m.mnt, timeout=2.5)
    assert os.path.getsize(os.path.join(backing, "f")) == 64 << 10   # not applied
    m.kill(signal.SIGKILL)


def ssd_stats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["ssd"]


def test_an_apply_whose_sync_waits_survives_a_power_cut(disk, mount, monkeypatch, tmp_path):
    """A record's apply is written into the backing file and its sync left
    to a flusher's pause (flush_journal.c's asettle), which syncs such files
    together and only then retires their records: while other flushes are
    due, and for every apply with TIERFS_FAULT=journal_settle_later.  Held
    there (TIERFS_DELAY=journal_settle_applied), the file reads its change
    through the backing directory's page cache, the record stays live and
    the mount is not flushed (ssd.flush_queued counts it); a power cut
    then leaves the record, and tierfs --recover and the next mount both
    give the file its change."""
    img, root = disk
    backing = backing_on(disk)
    old, new, changes = contents()
    monkeypatch.setenv("TIERFS_DELAY", "journal_settle_applied=600000")
    monkeypatch.setenv("TIERFS_FAULT", "journal_settle_later")
    m = mount(backing=backing, host_cache="64M", dedup="off")
    path = durable_file(m, "f", old)
    os.sync()
    change(path, changes)
    bpath = os.path.join(backing, "f")
    util.wait_until(lambda: read(bpath) == new, "the apply")
    assert jstats(m)["records_live"] >= 1, "retired before its sync"
    assert ssd_stats(m)["flush_queued"] >= 1, ssd_stats(m)
    cut1, cut2 = Cut(img, tmp_path, "cut1"), Cut(img, tmp_path, "cut2")
    m.kill(signal.SIGKILL)
    with cut1 as cut:
        r = recover(os.path.join(cut, "b"))
        assert r.returncode == 0, r.stderr
        util.assert_same(read(os.path.join(cut, "b", "f")), new, "f after tierfs --recover")
    with cut2 as cut:
        m2 = mount(backing=os.path.join(cut, "b"), host_cache="64M", dedup="off")
        util.assert_same(read(os.path.join(m2.mnt, "f")), new, "f through the next mount")
        m2.umount()


def test_bytes_flushed_counts_what_a_journal_flush_wrote(disk, mount):
    """ssd.bytes_flushed counts the bytes a flush wrote into the backing
    directory: for a small change made a journal record, the changed
    ranges applied to the file, not the file's length (it counted the
    length, 4 MiB for a few KiB changed).  One file alone (its fsync) and
    six closed together (a group, flush.c's journal_group)."""
    backing = backing_on(disk)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="2000")
    rng = seeded(SEED + 6)
    big = durable_file(m, "big", rng.randbytes(4 * MiB))
    small = [durable_file(m, f"s{i}", rng.randbytes(256 << 10)) for i in range(6)]
    os.sync()
    before, jb = ssd_stats(m), jstats(m)
    change(big, [(123456, rng.randbytes(4096))])
    for p in small:                 # closed a few milliseconds apart, no fsync
        with open(p, "r+b") as f:
            f.seek(rng.randrange(200 << 10))
            f.write(rng.randbytes(1000))
    util.wait_flushed(m)
    after, ja = ssd_stats(m), jstats(m)
    assert ja["records_appended"] >= jb["records_appended"] + 7, (jb, ja)
    assert after["files_flushed"] == before["files_flushed"] + 7, (before, after)
    wrote = after["bytes_flushed"] - before["bytes_flushed"]
    assert 4096 + 6 * 1000 <= wrote <= 7 * 64 * 1024, (before, after)
    m.umount()


def test_a_hard_linked_files_large_change_is_a_journal_record(disk, mount):
    """A new version of a file with several names is copied over it in
    place: its data written twice.  A record of a change writes the
    changed bytes twice, so that it costs less up to the whole file, and
    such a file's share is twice journal_pct (25%): half of a 4 MiB file
    changed, acknowledged by fsync, is one record and an apply of 2 MiB,
    not a version and a copy of 4 MiB each.  A file with one name still
    gets a new version.  Both names and the backing file read the change,
    before and after the unmount."""
    backing = backing_on(disk)
    m = mount(backing=backing, host_cache="64M", dedup="off")
    rng = seeded(SEED + 23)
    for name, linked in (("one", False), ("two", True)):
        old = rng.randbytes(4 * MiB)
        path = durable_file(m, name, old)
        names = [path]
        if linked:
            names.append(path + ".link")
            os.link(path, names[1])
        os.sync()
        changes = [(off, rng.randbytes(512 << 10)) for off in range(0, 4 * MiB, MiB)]
        new = bytearray(old)
        for off, b in changes:
            new[off:off + len(b)] = b
        before, jb = ssd_stats(m), jstats(m)
        ino = os.stat(os.path.join(backing, name)).st_ino
        change(path, changes)
        util.wait_flushed(m)
        after, ja = ssd_stats(m), jstats(m)
        wrote = after["bytes_flushed"] - before["bytes_flushed"]
        appended = ja["bytes_appended"] - jb["bytes_appended"]
        if linked:
            assert wrote == 2 * MiB, (name, before, after)
            assert 2 * MiB <= appended < 2 * MiB + (64 << 10), (name, jb, ja)
        else:
            assert wrote == 4 * MiB, (name, before, after)
            assert appended < 64 << 10, (name, jb, ja)
        assert (os.stat(os.path.join(backing, name)).st_ino == ino) == linked, name
        for p in names:
            util.assert_same(read(p), bytes(new), p)
        util.assert_same(read(os.path.join(backing, name)), bytes(new), "backing " + name)
    m.umount()
    util.assert_same(read(os.path.join(backing, "two.link")), bytes(new), "two.link")


def test_a_journal_flush_is_no_sample_of_the_flush_bandwidth(disk, mount):
    """ssd.flush_bandwidth, the rate eviction expects a whole copy to be
    flushed at, is measured on whole versions.  A journal flush of a large
    file wrote a few KiB in its time, and counted the file's length: one
    fsync of 4 KiB changed in 64 MiB made it many times what the disk
    does, and eviction then expected dirty copies to be free much sooner
    than they are."""
    backing = backing_on(disk)
    m = mount(backing=backing, host_cache="256M", dedup="off")
    rng = seeded(SEED + 10)
    path = durable_file(m, "big", rng.randbytes(64 * MiB))
    bw = ssd_stats(m)["flush_bandwidth"]
    records = jstats(m)["records_appended"]
    for i in range(3):
        change(path, [(rng.randrange(64 * MiB - 4096), rng.randbytes(4096))])
    util.wait_flushed(m)
    assert jstats(m)["records_appended"] >= records + 3, "not journal flushes"
    assert ssd_stats(m)["flush_bandwidth"] == bw, (bw, ssd_stats(m))
    m.umount()


def test_a_whole_version_after_a_pending_record_is_not_undone_by_it(disk, mount, monkeypatch,
                                                                   tmp_path):
    """A hard-linked file whose journalled change could not be applied
    (TIERFS_FAULT=journal_apply_eio: the record stays), then changed by more
    than journal_pct: its whole new version is copied over it in place.  The
    record must be applied and retired durably before that copy, or a replay
    after a power cut writes the older change back over the newer version."""
    m, img, backing, path, new = unapplied(disk, mount, monkeypatch, SEED + 2)
    rng = random.Random(SEED + 3)
    big = rng.randbytes(600 << 10)              # 60%: a whole new version
    latest = bytearray(new)
    latest[100:100 + len(big)] = big
    change(path, [(100, big)])
    util.assert_same(read(os.path.join(backing, "g")), bytes(latest), "g, flushed")
    with Cut(img, tmp_path, "cut") as after:
        b = os.path.join(after, "b")
        r = recover(b)
        assert r.returncode == 0, r.stderr
        util.assert_same(read(os.path.join(b, "g")), bytes(latest),
                         "g after a power cut and tierfs --recover")
    m.kill(signal.SIGKILL)


def test_a_written_through_version_after_a_pending_record_is_not_undone_by_it(
        disk, mount, monkeypatch, tmp_path):
    """The same, where the new version is written through (a write past a
    hole of more than 32 MiB does not load the file into a cache): its
    commit went around the pending record, which stayed live, and the next
    start wrote the older change back over the newer version, the file cut
    to the older size (a fsync-acknowledged version lost; the crash torture
    found it with a msync, then a rewrite under cache pressure)."""
    m, img, backing, path, new = unapplied(disk, mount, monkeypatch, SEED + 4)
    tail = random.Random(SEED + 5).randbytes(8192)
    off = 48 * MiB                              # written through
    change(path, [(off, tail)], close_error_ok=True)
    latest = new + bytes(off - len(new)) + tail
    m.kill(signal.SIGKILL)
    monkeypatch.delenv("TIERFS_FAULT")
    both_ways(img, tmp_path, mount, latest, "a written-through version, after a kill",
              names=("f", "g"))


# ------------------------------------ hard-linked files: commit intents

def hard_linked(disk, mount, monkeypatch, fault, seed):
    """f and g, two names of one durable file holding old; then the whole
    file rewritten (not a small change: a whole new version, copied over
    it in place) and fsynced under TIERFS_FAULT=fault, which kills the
    daemon: (m, backing, old, new)."""
    m, backing, path, old, new = linked_pair(disk, mount, seed)
    m.umount()
    os.sync()
    monkeypatch.setenv("TIERFS_FAULT", fault)
    m.start()
    try:
        change(path, [(0, new)])
    except OSError:
        pass                        # the daemon died under the fsync
    m.wait_death()
    monkeypatch.delenv("TIERFS_FAULT")
    return m, backing, old, new


def test_a_kill_during_a_hard_linked_copy(disk, mount, monkeypatch, tmp_path):
    """A file with two names cannot take a new version by a rename: it is
    copied over in place, under a commit intent in the journal (the file,
    the hidden version that holds the new content, its size), durable
    before the copy starts.  Killed halfway through the copy: tierfs
    --recover and the next mount both finish it; both names read the new
    version, one inode, and nothing of the intent is left."""
    m, backing, old, new = hard_linked(disk, mount, monkeypatch, "inplace_copy", SEED + 4)
    assert read(os.path.join(backing, "f")) not in (old, new), "the copy was not cut short"
    assert os.path.getsize(journal(backing)) > 0, "the intent is not in the journal"
    both_ways(disk[0], tmp_path, mount, new, "after a kill in its in-place copy",
              names=("f", "g"))


def test_a_power_cut_during_a_hard_linked_copy(disk, mount, monkeypatch, tmp_path):
    """The disk as a power cut in the middle of the copy leaves it (nothing
    synced after the intent): the intent and the version it names are
    durable, so tierfs --recover gives both names the new version."""
    m, backing, old, new = hard_linked(disk, mount, monkeypatch, "inplace_copy", SEED + 6)
    with Cut(disk[0], tmp_path, "cut") as after:
        b = os.path.join(after, "b")
        assert os.path.getsize(journal(b)) > 0, "the intent was not durable"
        r = recover(b)
        assert r.returncode == 0, r.stderr
        same_names(b, ("f", "g"), new, "after a power cut in its copy and tierfs --recover")
        assert_no_leftovers(b)


def linked_pair(disk, mount, seed, **options):
    """f and g, two names of one durable file: (m, backing, path, old, new)."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    print(f"seed {seed}")
    rng = random.Random(seed)
    old, new = rng.randbytes(2 * MiB), rng.randbytes(2 * MiB)
    m = mount(backing=backing, host_cache="64M", dedup="off", **options)
    path = durable_file(m, "f", old)
    os.link(path, os.path.join(m.mnt, "g"))
    os.sync()
    return m, backing, path, old, new


def test_an_acknowledged_copy_survives_a_power_cut_before_it_is_settled(
        disk, mount, monkeypatch, tmp_path):
    """The fsync of a hard-linked file returns once its commit intent is
    durable and the copy is made, before the file itself is synced: the
    settler syncs it and retires the intent a moment later, with others.
    TIERFS_DELAY holds the settler 30 s; the disk as a power cut leaves it
    then holds the live intent and its version, and tierfs --recover (and
    the next mount) give both names the acknowledged version."""
    monkeypatch.setenv("TIERFS_DELAY", "settle=30000")
    m, backing, path, old, new = linked_pair(disk, mount, SEED + 8)
    monkeypatch.delenv("TIERFS_DELAY")
    change(path, [(0, new)])
    assert jstats(m)["records_live"] >= 1, "no intent left for the settler"
    both_ways(disk[0], tmp_path, mount, new, "after a power cut before the settler",
              names=("f", "g"))


def test_a_small_change_after_an_unsettled_copy_survives_a_kill(disk, mount, monkeypatch):
    """A hard-linked file copied over under an intent that the settler has
    not retired yet (TIERFS_DELAY holds it), then a small change of it,
    fsynced and flushed: killed then, the next start must not replay the
    intent alone over the change (a journal record of the change, applied
    and retired, would be undone by the intent's replay of the older
    version; torture found it)."""
    monkeypatch.setenv("TIERFS_DELAY", "settle=30000")
    m, backing, path, old, new = linked_pair(disk, mount, SEED + 10)
    monkeypatch.delenv("TIERFS_DELAY")
    change(path, [(0, new)])
    tail = random.Random(SEED + 10).randbytes(40960)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, tail)
    os.fsync(fd)
    os.close(fd)
    util.wait_flushed(m)
    m.kill(signal.SIGKILL)
    r = recover(backing)
    assert r.returncode == 0, r.stderr
    same_names(backing, ("f", "g"), new + tail, "after a kill and tierfs --recover")


def test_the_settler_syncs_a_file_before_it_retires_its_intent(disk, mount, tmp_path):
    """Once the settler is done (no record live), the disk as a power cut
    leaves it holds the new version in the file itself, under both names,
    with nothing to replay and no version kept: the file was synced before
    its intent's retirement was."""
    m, backing, path, old, new = linked_pair(disk, mount, SEED + 9)
    change(path, [(0, new)])
    util.wait_until(lambda: jstats(m)["records_live"] == 0, "the settler", 60)
    with Cut(disk[0], tmp_path, "cut") as after:
        b = os.path.join(after, "b")
        same_names(b, ("f", "g"), new, "after the settler, before any recovery")
        r = recover(b)
        assert r.returncode == 0, r.stderr
        assert "finished an update" not in r.stderr, r.stderr
        same_names(b, ("f", "g"), new, "after tierfs --recover")
        assert_no_leftovers(b)


def test_a_torn_commit_intent_is_dropped(disk, mount, monkeypatch):
    """Killed once the intent is appended and before it is synced (before
    the copy): the record cut short, as a power cut may leave it, is
    dropped; both names keep the old version, whole, and its hidden new
    version is removed."""
    m, backing, old, new = hard_linked(disk, mount, monkeypatch, "redo_appended", SEED + 5)
    j = journal(backing)
    whole = read(j)
    assert len(whole) > 0, "the intent is not in the journal"
    same_names(backing, ("f", "g"), old, "before recovery (the copy never began)")
    with open(j, "wb") as out:
        out.write(whole[:len(whole) - 100])
    r = recover(backing)
    assert r.returncode == 0, r.stderr
    same_names(backing, ("f", "g"), old, "after its intent was torn")
    assert_no_leftovers(backing)


def test_a_failed_copy_is_superseded_by_the_next_version(disk, mount, monkeypatch):
    """The copy of a hard-linked file's new version fails
    (TIERFS_FAULT=inplace_copy_eio: the first copy, the file untouched): its
    intent stays live, for a restart to finish.  The file's next version,
    copied, retires it with its own: killed after that, tierfs --recover
    must not copy the older version back over the newer one."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    print(f"seed {SEED + 7}")
    rng = random.Random(SEED + 7)
    old, v1, v2 = (rng.randbytes(MiB) for _ in range(3))
    m = mount(backing=backing, host_cache="64M", dedup="off")
    path = durable_file(m, "f", old)
    os.link(path, os.path.join(m.mnt, "g"))
    m.umount()
    monkeypatch.setenv("TIERFS_FAULT", "inplace_copy_eio")
    m.expect_errors("copying its new version in place failed", "flush to SSD failed")
    m.start()
    try:
        change(path, [(0, v1)], close_error_ok=True)
    except OSError:
        pass                        # its flush failed: fsync says so
    change(path, [(0, v2)], close_error_ok=True)
    util.wait_flushed(m)
    assert "copying its new version in place failed" in m.log(), "no copy failed"
    same_names(backing, ("f", "g"), v2, "flushed")
    m.kill(signal.SIGKILL)
    monkeypatch.delenv("TIERFS_FAULT")
    r = recover(backing)
    assert r.returncode == 0, r.stderr
    same_names(backing, ("f", "g"), v2, "after tierfs --recover")
    assert_no_leftovers(backing)


def test_a_rewrite_of_the_journal_cut_short_is_removed(mount):
    """BACKING/.tierfs.journal.new, a rewrite of the journal that a crash
    cut short (before its rename): the next start removes it."""
    util.require_daemon()
    m = mount()
    m.umount()
    stale = os.path.join(m.backing, ".tierfs.journal.new")
    with open(stale, "wb") as f:
        f.write(b"TRJ1")
    m.start()
    assert not os.path.exists(stale)
    m.umount()


def test_small_changes_due_together_share_their_syncs_and_survive_a_power_cut(
        disk, mount, monkeypatch, tmp_path):
    """Small changes of several files closed within a moment of each other,
    without fsync, are flushed as one group (flush.c's journal_group): their
    records are appended and the journal synced once for them all before any
    file is written in place (syncs grow by fewer than one a file).  A power
    cut with the group's apply held back leaves the older files plus the
    records; tierfs --recover and the next mount both give every file its
    change."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    n, size = 12, 256 << 10
    rng = random.Random(SEED + 2)
    print(f"seed {SEED + 2}")
    old = [rng.randbytes(size) for _ in range(n)]
    new = []
    monkeypatch.setenv("TIERFS_DELAY", HOLD)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="2000")
    for i in range(n):
        durable_file(m, f"f{i}", old[i])
    os.sync()
    before = jstats(m)
    for i in range(n):            # closed a few milliseconds apart, no fsync
        off, b = rng.randrange(size - 4096), rng.randbytes(4096)
        with open(os.path.join(m.mnt, f"f{i}"), "r+b") as f:
            f.seek(off)
            f.write(b)
        data = bytearray(old[i])
        data[off:off + len(b)] = b
        new.append(bytes(data))
    util.wait_until(lambda: jstats(m)["records_appended"] >= before["records_appended"] + n,
                    lambda: f"the {n} records: {jstats(m)}")
    after = jstats(m)
    assert after["syncs"] - before["syncs"] < n // 2, (before, after)
    for i in range(n):
        assert read(os.path.join(backing, f"f{i}")) == old[i], "the apply was held back"
    monkeypatch.delenv("TIERFS_DELAY")
    os.sync()
    cut1, cut2 = Cut(img, tmp_path, "cut1"), Cut(img, tmp_path, "cut2")
    m.kill(signal.SIGKILL)
    with cut1 as cut:
        b = os.path.join(cut, "b")
        r = recover(b)
        assert r.returncode == 0, r.stderr
        for i in range(n):
            util.assert_same(read(os.path.join(b, f"f{i}")), new[i],
                             f"f{i} after the cut and tierfs --recover")
    with cut2 as cut:
        m2 = mount(backing=os.path.join(cut, "b"), host_cache="64M", dedup="off")
        for i in range(n):
            util.assert_same(read(os.path.join(m2.mnt, f"f{i}")), new[i],
                             f"f{i} through the next mount")
        m2.umount()


@pytest.mark.parametrize("how", ["fsync", "background"])
def test_a_record_whose_sync_failed_is_not_replayed_over_later_changes(disk, mount,
                                                                       monkeypatch, how):
    """TIERFS_FAULT=journal_sync_eio: the journal's first sync runs, then
    reports EIO, so the record it was for may be durable.  That record is
    retired: the fsync reports EIO, the flush's retry journals the change
    again, and no replay applies the
    failed record over what the file is given later.  Before, it stayed
    live until the unmount: a later change, applied and retired, was undone
    by the next start's replay after a kill.  fsync: the record of an fsync
    (flush_journal.c's eng_jf_flush); background: small files closed together without fsync
    (journal_group's shared sync)."""
    backing = backing_on(disk)
    rng = seeded(SEED + 3)
    size, off = 200 << 10, 40960
    old = rng.randbytes(size)
    first, second = rng.randbytes(4096), rng.randbytes(4096)
    monkeypatch.setenv("TIERFS_FAULT", "journal_sync_eio")
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="200",
              expect_errors=[r"f: flush to SSD failed: Input/output error",
                             r"journal \S+: cannot sync it \(Input/output error\)"])
    monkeypatch.delenv("TIERFS_FAULT")
    assert jstats(m)["syncs"] == 0, "a journal sync before the test's"
    path = durable_file(m, "f", old)
    if how == "fsync":
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, first, off)
        if not fsync_eio(fd):
            pytest.fail("the fsync whose journal sync failed returned 0")
        util.wait_flushed(m)        # the retry: journalled again
        os.fsync(fd)
        os.close(fd)
    else:
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(first)
    util.wait_flushed(m)
    assert "f: flush to SSD failed: Input/output error" in m.log(), "the sync did not fail"
    change(path, [(off, second)])   # later: applied and retired
    want = bytearray(old)
    want[off:off + 4096] = second
    util.wait_flushed(m)            # applied, its record retired
    util.assert_same(read(os.path.join(backing, "f")), bytes(want), "f before the kill")
    live = jstats(m)["records_live"]
    m.kill(signal.SIGKILL)
    m2 = mount(backing=backing, host_cache="64M", dedup="off")
    util.assert_same(read(os.path.join(m2.mnt, "f")), bytes(want),
                     "f after the next start's replay")
    assert jstats(m2)["records_replayed"] == 0, jstats(m2)
    assert live == 0, f"{live} record(s) live once every flush was done"
    m2.umount()


def test_a_file_emptied_by_a_record_then_written_in_place_survives_a_power_cut(
        disk, mount, tmp_path):
    """A truncation to 0 is a small change: a record of size 0, applied
    (the backing file emptied) and retired.  The file's next content, a
    few KiB, is then written into that same empty inode (version_small)
    and acknowledged by fsync.  A power cut right after: the record must
    not come back in the replay (its retirement is durable before anything
    is written in place), or it empties the file again."""
    img = disk[0]
    backing = backing_on(disk)
    rng = seeded(SEED + 4)
    old, new = rng.randbytes(64 << 10), rng.randbytes(3000)
    m = mount(backing=backing, host_cache="64M", dedup="off")
    path = durable_file(m, "f", old)
    ino = os.stat(os.path.join(backing, "f")).st_ino
    before = jstats(m)
    fd = os.open(path, os.O_WRONLY)
    os.ftruncate(fd, 0)
    os.fsync(fd)
    os.close(fd)
    util.wait_flushed(m)
    st = jstats(m)
    assert st["records_appended"] > before["records_appended"], "not journalled"
    assert st["records_live"] == 0 and os.path.getsize(os.path.join(backing, "f")) == 0, st
    fd = os.open(path, os.O_WRONLY)
    os.write(fd, new)
    os.fsync(fd)
    os.close(fd)
    cut = Cut(img, tmp_path, "cut")     # the power cut, as the fsync returns
    assert os.stat(os.path.join(backing, "f")).st_ino == ino, "not written in place"
    m.kill(signal.SIGKILL)
    with cut as after:
        b = os.path.join(after, "b")
        r = recover(b)
        assert r.returncode == 0, r.stderr
        util.assert_same(read(os.path.join(b, "f")), new, "f after the cut and tierfs --recover")


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


class Model:
    """A file's bytes as the writes through fd should leave them."""

    def __init__(self, fd, base):
        self.fd, self.b = fd, bytearray(base)

    def write(self, off, data):
        os.pwrite(self.fd, data, off)
        if off + len(data) > len(self.b):
            self.b.extend(bytes(off + len(data) - len(self.b)))
        self.b[off:off + len(data)] = data

    def truncate(self, size):
        os.ftruncate(self.fd, size)
        del self.b[size:]
        self.b.extend(bytes(size - len(self.b)))

    def punch(self, off, n):
        util.fallocate(self.fd, off, n, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
        self.b[off:off + n] = bytes(n)


def written_through(m, rng, name="s"):
    """(path, model, base): a durable file of 256 KiB, open, then written
    40 MiB past its end: from there written through (a new version of its
    backing file, the shadow, takes its writes)."""
    base = rng.randbytes(256 << 10)
    path = durable_file(m, name, base)
    f = Model(os.open(path, os.O_RDWR), base)
    f.write(40 * MiB, rng.randbytes(4096))
    return path, f, base


def test_fsyncs_of_a_file_written_through_are_journal_records(disk, mount, tmp_path):
    """A file written through (a sparse one: a write far past its end) had
    its shadow committed as a whole new version at each fsync (fdatasync,
    rename, a sync of its directory), and its next write copied the whole
    file into a new shadow.  Now each fsync appends a record of what
    changed since the last one (writes, a shrink and a growth again, a
    punched hole) and the shadow stays; the backing file is still the
    base.  After a power cut, tierfs --recover and the next mount give the
    file as of its last fsync (the records applied in order over the
    base), sparse, without the write that came after."""
    img, root = disk
    backing = backing_on(disk)
    rng = seeded(SEED + 8)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="60000")
    path, f, base = written_through(m, rng)
    before = ssd_stats(m)
    assert before["files_written_through"] == 1, before
    os.fsync(f.fd)
    f.write(1000, rng.randbytes(3000))          # the base's bytes
    os.fsync(f.fd)
    f.truncate(100 << 10)                        # below the base's size
    f.write(36 * MiB, rng.randbytes(5000))       # and past it again: zeros between
    f.write(50 << 10, rng.randbytes(20 << 10))
    os.fsync(f.fd)
    f.punch(40 << 10, 32 << 10)
    os.fsync(f.fd)
    synced = bytes(f.b)
    f.write(2000, rng.randbytes(100))            # never synced
    st = ssd_stats(m)
    assert st["files_written_through"] == 1, "a shadow was made again"
    assert st["write_through_records"] == before["write_through_records"] + 4, st
    assert st["files_flushed"] == before["files_flushed"], "a version was committed"
    assert jstats(m)["records_live"] >= 4, jstats(m)
    util.assert_same(read(os.path.join(backing, "s")), base, "the backing file (the base)")
    cut1, cut2 = Cut(img, tmp_path, "cut1"), Cut(img, tmp_path, "cut2")
    m.kill(signal.SIGKILL)
    try:
        os.close(f.fd)
    except OSError:
        pass
    with cut1 as cut:
        r = recover(os.path.join(cut, "b"))
        assert r.returncode == 0, r.stderr
        p = os.path.join(cut, "b", "s")
        util.assert_same(read(p), synced, "s after tierfs --recover")
        assert os.stat(p).st_blocks * 512 < 2 * MiB, "its holes were written"
    with cut2 as cut:
        m2 = mount(backing=os.path.join(cut, "b"), host_cache="64M", dedup="off")
        util.assert_same(read(os.path.join(m2.mnt, "s")), synced, "s through the next mount")
        m2.umount()


def test_a_file_written_through_is_committed_and_its_records_retired(disk, mount):
    """The shadow whose fsyncs are journal records is committed after its
    last close (-o flush_age), durably, and its records are retired then:
    none stays live, and a clean unmount removes the journal.  A hard link
    made while it is written through has the commit copy it over the
    file in place (under a commit intent, which retires the records):
    both names read the last content, holes kept."""
    backing = backing_on(disk)
    rng = seeded(SEED + 9)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="200")
    path, f, _ = written_through(m, rng)
    os.fsync(f.fd)
    f.write(7, rng.randbytes(70000))
    os.fsync(f.fd)
    assert jstats(m)["records_live"] >= 2, jstats(m)
    os.link(path, path + ".2")
    f.write(30 * MiB, rng.randbytes(9000))
    os.fsync(f.fd)
    os.close(f.fd)
    util.wait_flushed(m)
    util.wait_until(lambda: jstats(m)["records_live"] == 0, "the records retired")
    for name in ("s", "s.2"):
        p = os.path.join(backing, name)
        util.assert_same(read(p), bytes(f.b), f"{name} in the backing directory")
        assert os.stat(p).st_blocks * 512 < 2 * MiB, "its holes were written"
    m.umount()
    assert not os.path.exists(journal(backing)), "the journal outlived a clean unmount"


def linked_written_through(m, rng):
    """f, written through and given a second name g: two fsyncs (records),
    then a write past them that no fsync acknowledged.  (path, model)."""
    path, f, _ = written_through(m, rng, name="f")
    os.link(path, os.path.join(m.mnt, "g"))
    os.fsync(f.fd)
    f.write(7, rng.randbytes(70000))
    f.punch(100 << 10, 64 << 10)
    os.fsync(f.fd)
    f.write(30 * MiB, rng.randbytes(9000))
    return path, f


def test_a_hard_linked_file_written_through_is_applied_in_place(disk, mount):
    """A file with several names written through had its shadow copied
    over it in place at its commit, under a commit intent: all its data
    written a second time (a GiB-sized sparse file for a few blocks
    changed, under fsstress's load).  Now the commit makes one more
    record of what no fsync recorded and writes the change into the file
    in place (ssd.write_through_applies): the records retired, both names
    and the backing file read the last content, holes kept, and a clean
    unmount leaves no journal."""
    backing = backing_on(disk)
    rng = seeded(SEED + 24)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="200")
    path, f = linked_written_through(m, rng)
    ino = os.stat(os.path.join(backing, "f")).st_ino
    os.close(f.fd)
    util.wait_flushed(m)
    util.wait_until(lambda: jstats(m)["records_live"] == 0, "the records retired")
    st = ssd_stats(m)
    assert st["write_through_applies"] == 1, st
    assert st["files_written_through"] == 1, st
    same_names(m.mnt, ("f", "g"), bytes(f.b), "through the mount")
    same_names(backing, ("f", "g"), bytes(f.b), "in the backing directory")
    assert os.stat(os.path.join(backing, "f")).st_ino == ino
    assert os.stat(os.path.join(backing, "f")).st_blocks * 512 < 2 * MiB, "holes written"
    m.umount()
    assert util.tierfs_internals(backing) == [], "left after a clean unmount"


def test_a_kill_during_a_hard_linked_written_through_files_apply(disk, mount, monkeypatch,
                                                                  tmp_path):
    """The apply in place of a hard-linked file's shadow (above), cut short
    by a kill (TIERFS_FAULT=journal_apply_torn): the file in the backing
    directory is neither its base nor its last content, and its records
    are live.  tierfs --recover and the next mount both give the last
    content (the records applied in order over what the file holds, the
    last one made at the commit), under both names, one inode."""
    img, root = disk
    backing = backing_on(disk)
    rng = seeded(SEED + 25)
    monkeypatch.setenv("TIERFS_FAULT", "journal_apply_torn")
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="200")
    path, f = linked_written_through(m, rng)
    base = read(os.path.join(backing, "f"))
    os.close(f.fd)                  # committed at its age: the apply kills
    m.wait_death()
    monkeypatch.delenv("TIERFS_FAULT")
    assert read(os.path.join(backing, "f")) not in (base, bytes(f.b)), \
        "the apply was not cut short"
    both_ways(img, tmp_path, mount, bytes(f.b), "after a kill in a shadow's apply",
              names=("f", "g"))


def check_against(f, rng, paths, what, n=6):
    """n ranges of f's model read back through each of paths, and its size."""
    for p in paths:
        assert os.path.getsize(p) == len(f.b), (p, what)
        with open(p, "rb") as r:
            for _ in range(n):
                off = rng.randrange(len(f.b))
                ln = rng.choice([1, 4096, 100000, 1 << 20])
                r.seek(off)
                util.assert_same(r.read(ln), bytes(f.b[off:off + ln]),
                                 f"{p} [{off}, +{ln}) {what}")


def lazy_written_through(m, rng, size):
    """f, a durable file of size bytes given a second name g, then written
    40 MiB past its end: written through, into a shadow that holds none of
    its content (write_through_copy_bytes 0).  (path, model)."""
    base = rng.randbytes(size)
    path = durable_file(m, "f", base)
    os.link(path, os.path.join(m.mnt, "g"))
    f = Model(os.open(path, os.O_RDWR), base)
    f.write(40 * MiB, rng.randbytes(4096))
    st = ssd_stats(m)
    assert st["files_written_through"] == 1 and st["write_through_copy_bytes"] == 0, st
    return path, f


def test_a_hard_linked_file_written_through_is_read_from_its_backing_file(disk, mount):
    """A file of several names written through, whose shadow is applied in
    place at its commit, gets no copy of its content in the shadow (a
    GiB-sized sparse file: its data written once more for nothing): the
    shadow holds what is written from then on, and the rest is read from
    the backing file (ssd.write_through_copy_bytes 0).  300 seeded
    operations against a model (writes inside, across and past the base,
    truncations down and up, punched holes, fsyncs), each checked through
    both names; its last name but the open one removed halfway (the
    backing file's name is gone, its content still read); SEEK_DATA (the
    shadow made whole first), and more operations after it; then the
    commit, and the backing file against the model."""
    backing = backing_on(disk)
    rng = seeded(SEED + 26)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="60000")
    path, f = lazy_written_through(m, rng, 3 * MiB)
    other = os.path.join(m.mnt, "g")
    paths = [path, other]
    for i in range(300):
        op = rng.randrange(10)
        size = len(f.b)
        if op < 5:
            off = rng.randrange(min(size, 4 * MiB) + MiB)
            f.write(off, rng.randbytes(rng.choice([1, 100, 4096, 70000])))
        elif op == 5:
            f.truncate(rng.randrange(2 * MiB, 5 * MiB) if rng.random() < 0.5 else
                       size + rng.randrange(MiB))
        elif op == 6 and size > 2 * MiB:
            f.punch(rng.randrange(2 * MiB), rng.choice([4096, 65536, 300000]))
        elif op == 7:
            os.fsync(f.fd)
        if i == 150:                    # its other name goes: open by f.fd alone
            os.unlink(path)
            paths = [other]
        check_against(f, rng, paths, f"after operation {i}", n=2)
    assert ssd_stats(m)["files_written_through"] == 1, "committed meanwhile"
    data = os.lseek(f.fd, 0, os.SEEK_DATA)
    assert data == 0 or any(f.b[:data]) is False, data
    for i in range(50):
        f.write(rng.randrange(len(f.b)), rng.randbytes(5000))
        check_against(f, rng, paths, f"after SEEK_DATA, operation {i}", n=2)
    os.fsync(f.fd)
    os.close(f.fd)
    util.wait_flushed(m)
    check_against(f, rng, paths, "after its commit", n=20)
    util.assert_same(read(os.path.join(backing, "g")), bytes(f.b), "g in the backing directory")
    m.umount()
    util.assert_same(read(os.path.join(backing, "g")), bytes(f.b), "g after the unmount")


def test_a_hard_linked_file_written_through_and_changed_whole_is_copied_over_it(disk, mount):
    """The same shadow (no copy of the file's content in it), changed by
    more than twice journal_pct of the file: its commit is a version copied
    over the file in place, the backing file's bytes copied into the shadow
    first (write_through_copy_bytes counts them); both names and the
    backing file read the last content."""
    backing = backing_on(disk)
    rng = seeded(SEED + 27)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="200")
    path, f = lazy_written_through(m, rng, 2 * MiB)
    f.truncate(2 * MiB)
    f.write(300000, rng.randbytes(1600000))         # 76% of it
    os.fsync(f.fd)
    os.close(f.fd)
    util.wait_flushed(m)
    st = ssd_stats(m)
    assert st["write_through_applies"] == 0, st
    assert st["write_through_copy_bytes"] > 0, st
    same_names(m.mnt, ("f", "g"), bytes(f.b), "through the mount")
    same_names(backing, ("f", "g"), bytes(f.b), "in the backing directory")
    m.umount()
    same_names(backing, ("f", "g"), bytes(f.b), "after the unmount")


def test_a_failed_write_to_a_hard_linked_written_through_file_keeps_its_bytes(disk, mount):
    """A write into that shadow (no copy of the file's content in it) that
    the full backing disk refuses (ENOSPC) leaves the bytes it was to
    replace as they were, read from the backing file, not the shadow's
    holes: the range is the shadow's own only once written.  The disk
    freed again, the file reads its old bytes there, and a write there
    then succeeds and is read back."""
    img, root = disk
    backing = backing_on(disk)
    rng = seeded(SEED + 28)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="60000")
    path, f = lazy_written_through(m, rng, 2 * MiB)
    os.sync()
    filler = os.path.join(root, "filler")
    st = os.statvfs(root)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = st.f_bfree * st.f_frsize
        while size > 4096:
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                size //= 2
        new = rng.randbytes(MiB)
        try:
            n = os.pwrite(f.fd, new, 500000)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            n = 0
        print(f"{n} of {len(new)} bytes written on a full disk")
        assert n < len(new), "the disk was not full"
        f.b[500000:500000 + n] = new[:n]
    finally:
        os.close(fd)
        os.unlink(filler)
    check_against(f, rng, [path, os.path.join(m.mnt, "g")], "after a write refused")
    with open(path, "rb") as r:
        r.seek(500000)
        util.assert_same(r.read(MiB), bytes(f.b[500000:500000 + MiB]), "the range refused")
    f.write(500000, new)
    try:
        os.fsync(f.fd)          # reports the refused write, as write-back would
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    os.fsync(f.fd)
    check_against(f, rng, [path, os.path.join(m.mnt, "g")], "after the write again")
    os.close(f.fd)
    m.umount()
    same_names(backing, ("f", "g"), bytes(f.b), "after the unmount")


def test_the_journal_ring_turns_past_a_file_written_through(disk, mount, monkeypatch):
    """The journal is two files taken in turn, each written over once the
    records in it are retired (a record's sync then changes no metadata).
    A written-through file's fsync records stay live until its shadow is
    committed, which waits for -o flush_age after its last close; the
    ring, past its length (TIERFS_JOURNAL_RING=128K), waited for them too,
    and its other file grew meanwhile: under fsstress's load both files
    grew to 150-200 MiB, every record's sync a commit of the backing log.
    Now the ring's wait commits the shadows that wait for their age
    (write_through_early_commits): with flush_age=60000, 60 small records
    of another file (1.2 MiB) leave both files near the ring's length, the
    written-through file's records retired, and every byte where it
    belongs."""
    monkeypatch.setenv("TIERFS_JOURNAL_RING", str(128 << 10))
    backing = backing_on(disk)
    rng = seeded(SEED + 19)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="60000")
    monkeypatch.delenv("TIERFS_JOURNAL_RING")
    gdata = rng.randbytes(4 * MiB)
    g = Model(os.open(durable_file(m, "g", gdata), os.O_RDWR), gdata)
    path, f, _ = written_through(m, rng)
    os.fsync(f.fd)
    f.write(5000, rng.randbytes(3000))
    os.fsync(f.fd)
    os.close(f.fd)                      # its shadow waits for its age
    st = ssd_stats(m)
    assert st["write_through_records"] >= 1, st
    assert jstats(m)["records_live"] >= 1, jstats(m)
    for _ in range(60):                 # small changes: one record each
        g.write(rng.randrange(4 * MiB - 20000), rng.randbytes(20000))
        os.fsync(g.fd)
    os.close(g.fd)
    sizes = [os.path.getsize(journal(backing) + sfx) for sfx in ("", ".1")]
    assert max(sizes) < 512 << 10, f"the ring's files grew: {sizes} bytes"
    assert ssd_stats(m)["write_through_early_commits"] >= 1, ssd_stats(m)
    util.assert_same(read(path), bytes(f.b), "s through the mount")
    util.assert_same(read(os.path.join(m.mnt, "g")), bytes(g.b), "g through the mount")
    m.umount()
    util.assert_same(read(os.path.join(backing, "s")), bytes(f.b), "s in the backing directory")
    util.assert_same(read(os.path.join(backing, "g")), bytes(g.b), "g in the backing directory")


def test_a_hard_linked_files_commit_holds_no_names_lock(disk, mount, monkeypatch):
    """A new version of a hard-linked file is copied over it in place under
    a commit intent.  The commit held its directory's names lock (and
    fs.nslock) across the intent's journal sync and the copy, and every
    create, link, unlink and rename in that directory waited for it (a
    rename took 1.5 ms against 0.3 ms in bench_stress.sh).  The intent names
    the file by its handle, so no names lock is held: with the copy held
    back (TIERFS_DELAY=intent_copy), a rename in the directory returns
    while the backing file still holds the old content; then the fsync
    returns and both names read the new content."""
    monkeypatch.setenv("TIERFS_DELAY", "intent_copy=8000")
    backing = backing_on(disk)
    m = mount(backing=backing, host_cache="64M", dedup="off")
    rng = seeded(SEED + 11)
    os.mkdir(os.path.join(m.mnt, "d"))
    old = rng.randbytes(MiB)
    path = durable_file(m, "d/a", old)
    os.link(path, os.path.join(m.mnt, "d", "a2"))
    open(os.path.join(m.mnt, "d", "x"), "wb").close()
    new = rng.randbytes(MiB)                    # all of it: a whole version
    err = []

    def writer():
        try:
            fd = os.open(path, os.O_WRONLY)
            os.pwrite(fd, new, 0)
            os.fsync(fd)
            os.close(fd)
        except OSError as e:
            err.append(e)

    t = threading.Thread(target=writer)
    t.start()
    util.wait_until(lambda: any(n.startswith(".tierfs.version.") for n in os.listdir(backing)),
                    "the commit intent's version")
    os.rename(os.path.join(m.mnt, "d", "x"), os.path.join(m.mnt, "d", "y"))
    assert read(os.path.join(backing, "d", "a")) == old, "the rename waited for the copy"
    t.join(60)
    assert not t.is_alive() and not err, err
    for name in ("a", "a2"):
        util.assert_same(read(os.path.join(backing, "d", name)), new, f"d/{name}")
    m.umount()


def test_a_shadow_holds_sixteen_records_then_its_fsync_commits_it(disk, mount):
    """A written-through file's shadow holds SLOG_MAX (16) records at most:
    the 17th fsync commits it as a new version, durably, and retires its
    records; the next write makes a new shadow, whose fsyncs are records
    again.  The backing file reads the content of the commit."""
    backing = backing_on(disk)
    rng = seeded(SEED + 12)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="60000")
    path, f, base = written_through(m, rng)
    before = ssd_stats(m)
    for i in range(16):
        f.write(i * 8192, rng.randbytes(100))
        os.fsync(f.fd)
    util.assert_same(read(os.path.join(backing, "s")), base, "s before the 17th fsync")
    assert jstats(m)["records_live"] >= 16, jstats(m)
    for i in range(16, 17):
        f.write(i * 8192, rng.randbytes(100))
        os.fsync(f.fd)
    st = ssd_stats(m)
    assert st["write_through_records"] == before["write_through_records"] + 16, st
    assert jstats(m)["records_live"] == 0, jstats(m)
    util.assert_same(read(os.path.join(backing, "s")), bytes(f.b), "s, committed")
    f.write(1 << 20, rng.randbytes(5000))
    os.fsync(f.fd)
    st2 = ssd_stats(m)
    assert st2["files_written_through"] == st["files_written_through"] + 1, st2
    assert st2["write_through_records"] == st["write_through_records"] + 1, st2
    os.close(f.fd)
    m.umount()
    util.assert_same(read(os.path.join(backing, "s")), bytes(f.b), "s after the unmount")


def power_cut_gives(disk, tmp_path, mount, m, want):
    """Kill m after a copy of the disk image (a power cut): tierfs --recover
    on one copy, the next mount on another, both give files want ({name:
    content}); the next mount's clean unmount removes the journal."""
    cut1, cut2 = Cut(disk[0], tmp_path, "cut1"), Cut(disk[0], tmp_path, "cut2")
    m.kill(signal.SIGKILL)
    with cut1 as cut:
        b = os.path.join(cut, "b")
        r = recover(b)
        assert r.returncode == 0, r.stderr
        for n, data in want.items():
            util.assert_same(read(os.path.join(b, n)), data, f"{n} after the cut and --recover")
    with cut2 as cut:
        m2 = mount(backing=os.path.join(cut, "b"), host_cache="64M", dedup="off")
        for n, data in want.items():
            util.assert_same(read(os.path.join(m2.mnt, n)), data, f"{n} through the next mount")
        m2.umount()
        assert not [n for n in os.listdir(os.path.join(cut, "b"))
                    if n.startswith(".tierfs.journal")], "the journal left by a clean unmount"


def small_changes(m, name, rng, count=200):
    """name in mount m: 1 MiB made durable, then count small changes (4 KiB
    at random offsets, each acknowledged by fsync, each a journal record):
    (path, its content now, the journal's statistics before the changes)."""
    data = bytearray(rng.randbytes(MiB))
    path = durable_file(m, name, bytes(data))
    before = jstats(m)
    for _ in range(count):
        off, b = rng.randrange(MiB - 4096), rng.randbytes(4096)
        change(path, [(off, b)])
        data[off:off + 4096] = b
    return path, bytes(data), before


def test_the_journal_takes_its_two_files_in_turn_and_stops_growing(
        disk, mount, monkeypatch, tmp_path):
    """Without the persistent tier the journal is two files taken in turn
    (store/journal.c, jnl_ring): past TIERFS_JOURNAL_RING bytes the records
    go to the other file, written again from its start once none of its
    records is live, so the files stop growing (their blocks are written
    over: a record's sync commits no metadata).  After 200 fsyncs of small
    changes and a power cut, tierfs --recover and the next mount give the
    file as of its last fsync (no record of an earlier round in a file
    written again is taken for a live one)."""
    backing = backing_on(disk)
    rng = seeded(SEED + 13)
    ring = 64 << 10
    monkeypatch.setenv("TIERFS_JOURNAL_RING", str(ring))
    m = mount(backing=backing, host_cache="64M", dedup="off")
    path, data, before = small_changes(m, "f", rng)
    st = jstats(m)
    appended = st["bytes_appended"] - before["bytes_appended"]
    assert appended > 12 * ring and st["resets"] - before["resets"] >= 4, st
    sizes = [os.path.getsize(journal(backing) + s) for s in ("", ".1")]
    assert sum(sizes) < appended // 3, (sizes, appended)
    power_cut_gives(disk, tmp_path, mount, m, {"f": data})


def test_a_commit_intent_in_a_journal_written_over_survives_a_power_cut(
        disk, mount, monkeypatch, tmp_path):
    """A hard-linked file's new version is copied over it in place under a
    commit intent that names the version by a hidden link.  Once the
    journal's two files are written over (TIERFS_JOURNAL_RING, 200 small
    changes of another file), a record's sync commits no metadata of the
    backing file system: the version's link and allocation must be made
    durable by a sync of their own before the record.  The whole file
    rewritten in place and fsynced, its copy's settling held back
    (TIERFS_DELAY=settle), then a power cut: tierfs --recover and the next
    mount give both names the new content."""
    backing = backing_on(disk)
    rng = seeded(SEED + 17)
    monkeypatch.setenv("TIERFS_JOURNAL_RING", str(64 << 10))
    monkeypatch.setenv("TIERFS_DELAY", "settle=600000")
    m = mount(backing=backing, host_cache="64M", dedup="off")
    monkeypatch.delenv("TIERFS_DELAY")
    old = rng.randbytes(MiB)
    path = durable_file(m, "f", old)
    os.link(path, path + ".other")           # from now on: versions under intents
    _, gdata, before = small_changes(m, "g", rng)
    util.wait_flushed(m)
    os.sync()                               # both journal files allocated, durable
    st = jstats(m)
    assert st["resets"] - before["resets"] >= 4, st
    new = rng.randbytes(MiB)
    change(path, [(0, new)])                # past journal_pct: a whole version
    assert jstats(m)["records_live"] >= 1, "the intent was retired: settle not held"
    power_cut_gives(disk, tmp_path, mount, m,
                    {"f": new, "f.other": new, "g": gdata})


def test_records_live_in_both_journal_files_survive_a_power_cut(
        disk, mount, monkeypatch, tmp_path):
    """Small changes of 40 files, each acknowledged by fsync, their applies
    held back (TIERFS_DELAY=journal_apply): the records fill the first
    journal file, then the second, and stay live in both.  After a power
    cut, tierfs --recover and the next mount apply the records of both
    files."""
    backing = backing_on(disk)
    rng = seeded(SEED + 14)
    n, size = 40, 128 << 10
    monkeypatch.setenv("TIERFS_JOURNAL_RING", str(64 << 10))
    monkeypatch.setenv("TIERFS_DELAY", HOLD)
    # the host cache alone: an fsync makes a small file's record itself
    # (from GPU memory a flusher would, and the held ones are all there are)
    m = mount(backing=backing, host_cache="64M", dedup="off", gpu="none")
    monkeypatch.delenv("TIERFS_DELAY")     # the next mount's own applies go on
    want = {}
    for i in range(n):
        want[f"f{i}"] = bytearray(rng.randbytes(size))
        durable_file(m, f"f{i}", bytes(want[f"f{i}"]))
    for i in range(n):
        off, b = rng.randrange(size - 4096), rng.randbytes(4096)
        change(os.path.join(m.mnt, f"f{i}"), [(off, b)])
        want[f"f{i}"][off:off + 4096] = b
    st = jstats(m)
    assert st["resets"] >= 1 and st["records_live"] >= n - 4, st
    assert all(os.path.getsize(journal(backing) + s) > 0 for s in ("", ".1")), st
    for i in range(n):
        assert read(os.path.join(backing, f"f{i}")) != want[f"f{i}"], f"f{i}: applied"
    power_cut_gives(disk, tmp_path, mount, m, {k: bytes(v) for k, v in want.items()})


def test_the_zero_blocks_of_a_small_change_are_no_bytes_of_its_record(
        disk, mount, monkeypatch, tmp_path):
    """A cached file's small change that writes whole blocks of zeros (64
    KiB of them, beside 4 KiB of data) is recorded without their bytes
    (JNL_ZERO ranges, tiers/flush_journal.c's record_ranges): the record holds a
    few KiB.  With its apply held back and the power cut, tierfs --recover
    and the next mount give the file with its zeros and its data."""
    backing = backing_on(disk)
    rng = seeded(SEED + 15)
    monkeypatch.setenv("TIERFS_DELAY", HOLD)
    m = mount(backing=backing, host_cache="64M", dedup="off")
    monkeypatch.delenv("TIERFS_DELAY")     # the next mount's own applies go on
    data = bytearray(rng.randbytes(MiB))
    path = durable_file(m, "f", bytes(data))
    before = jstats(m)
    changes = [(128 << 10, bytes(64 << 10)), (512 << 10, rng.randbytes(4096))]
    change(path, changes)
    for off, b in changes:
        data[off:off + len(b)] = b
    st = jstats(m)
    grew = st["bytes_appended"] - before["bytes_appended"]
    assert st["records_appended"] == before["records_appended"] + 1, (before, st)
    assert grew < 16 << 10, f"the record holds {grew} bytes"
    assert read(os.path.join(backing, "f")) != data, "the apply was held back"
    power_cut_gives(disk, tmp_path, mount, m, {"f": bytes(data)})


def test_a_failed_sync_at_a_change_of_journal_file_takes_no_record_until_emptied(
        disk, mount, monkeypatch, tmp_path):
    """TIERFS_FAULT=journal_switch_eio: at the journal's first change of file
    (a 64 KiB ring) the sync of the file left runs, then reports EIO, so
    its records may be lost, and a replay would stop there.  The error is
    logged; from then on no record is taken (a small change is a whole new
    version instead, or EIO and the flush tried again) until every record
    is retired and both files are emptied, durably; then records are taken
    again, and after a power cut tierfs --recover and the next mount give
    the file as of its last fsync."""
    backing = backing_on(disk)
    rng = seeded(SEED + 16)
    monkeypatch.setenv("TIERFS_JOURNAL_RING", str(64 << 10))
    monkeypatch.setenv("TIERFS_FAULT", "journal_switch_eio")
    m = mount(backing=backing, host_cache="64M", dedup="off",
              expect_errors=[r"journal \S+: cannot sync it \(Input/output error\)",
                             r"flush to SSD failed: Input/output error"])
    monkeypatch.delenv("TIERFS_FAULT")
    data = bytearray(rng.randbytes(MiB))
    path = durable_file(m, "f", bytes(data))
    eio = 0
    for _ in range(60):
        off, b = rng.randrange(MiB - 4096), rng.randbytes(4096)
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, b, off)
        eio += fsync_eio(fd)
        try:
            os.close(fd)
        except OSError:
            pass            # the flush of an fsync that said EIO, again
        data[off:off + 4096] = b
    util.wait_flushed(m)
    change(path, [(0, data[:4096])])    # the journal works again
    st = jstats(m)
    log = m.log()
    assert re.search(r"journal \S+: cannot sync it \(Input/output error\): its records "
                     r"from seq \d+ may be lost", log), log
    assert "emptied, records are taken again" in log, log
    assert st["sync_failures"] == 1 and st["resets"] >= 1, st
    print(f"{eio} of 60 fsyncs said EIO; {st}")
    power_cut_gives(disk, tmp_path, mount, m, {"f": bytes(data)})


def test_a_failed_sync_with_a_record_live_makes_small_changes_whole_versions_until_it_retires(
        disk, mount, monkeypatch, tmp_path):
    """A written-through file's fsync records stay live while it is open
    (its shadow is not committed).  The journal's sync then fails, armed
    only now (TIERFS_FAULT_ARM): the fsync it was for says EIO.  While that
    file's record is live the journal is failed and takes no record: a
    small change of another file is made durable as a whole new version
    (its fsync returns 0, no record is appended, no reset).  The open
    file's next fsync commits its shadow whole, which retires its records:
    the next record empties the journal first, and is taken.  After a power cut,
    tierfs --recover and the next mount give every file as of its last
    acknowledged fsync."""
    backing = backing_on(disk)
    rng = seeded(SEED + 17)
    arm = str(tmp_path / "arm")
    monkeypatch.setenv("TIERFS_FAULT", "journal_sync_eio")
    monkeypatch.setenv("TIERFS_FAULT_ARM", arm)
    m = mount(backing=backing, host_cache="64M", dedup="off", flush_age="60000",
              expect_errors=[r"journal \S+: cannot sync it \(Input/output error\)",
                             r"flush to SSD failed: Input/output error"])
    monkeypatch.delenv("TIERFS_FAULT")
    monkeypatch.delenv("TIERFS_FAULT_ARM")
    _, w, _ = written_through(m, rng)
    w.write(1000, rng.randbytes(3000))
    os.fsync(w.fd)                              # a record, live while w is open
    small = bytearray(rng.randbytes(MiB))
    path = durable_file(m, "f", bytes(small))
    st = jstats(m)
    assert st["records_live"] >= 1 and st["sync_failures"] == 0, st
    open(arm, "w").close()                      # the next journal sync fails
    off, b = 4096, rng.randbytes(4096)
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, b, off)
    assert fsync_eio(fd), "the fsync whose journal sync failed returned 0"
    small[off:off + 4096] = b                   # in the cache: the retry may make it
    util.wait_flushed(m)
    failed = jstats(m)
    assert failed["sync_failures"] == 1 and failed["records_live"] >= 1, failed
    for _ in range(5):                          # whole versions, each acknowledged
        off, b = rng.randrange(MiB - 4096), rng.randbytes(4096)
        os.pwrite(fd, b, off)
        os.fsync(fd)
        small[off:off + 4096] = b
    try:
        os.close(fd)
    except OSError:
        pass                                    # the first flush's error, again
    st = jstats(m)
    assert st["records_appended"] == failed["records_appended"], \
        f"records taken while the journal was failed: {failed} -> {st}"
    assert st["resets"] == failed["resets"], "emptied with a record live"
    assert "emptied, records are taken again" not in m.log()
    util.assert_same(read(os.path.join(backing, "f")), bytes(small),
                     "f's backing file after its whole versions")
    w.write(2000, rng.randbytes(100))
    os.fsync(w.fd)                              # no record: its shadow committed
    util.wait_flushed(m)
    st = jstats(m)
    assert st["records_live"] == 0, st
    change(path, [(0, bytes(small[:4096]))])    # emptied first, then a record
    assert "emptied, records are taken again" in m.log(), m.log()
    assert jstats(m)["records_appended"] > st["records_appended"], jstats(m)
    synced_w = bytes(w.b)
    os.close(w.fd)
    power_cut_gives(disk, tmp_path, mount, m, {"f": bytes(small), "s": synced_w})


def test_a_hole_punched_or_zeroed_in_a_cached_file_is_a_small_change(disk, mount, tmp_path):
    """Half of a cached file punched (fallocate PUNCH_HOLE), then another
    quarter zeroed (ZERO_RANGE), then the file cut to a quarter and grown
    back to its size by a write at its end: each fsync's change is mostly
    whole blocks of zeros, which are no bytes of a record, so each is a
    journal record of a few KiB, not a whole new version (the backing
    file keeps its inode, and the punched blocks are freed there).  Before,
    the change was counted with its zeros, over the 25% of a small change,
    and each fsync wrote the whole file again.  After a power cut, tierfs
    --recover and the next mount give the file as of its last fsync."""
    backing = backing_on(disk)
    rng = seeded(SEED + 18)
    size = 4 * MiB
    data = bytearray(rng.randbytes(size))
    m = mount(backing=backing, host_cache="64M", dedup="off")
    path = durable_file(m, "f", bytes(data))
    bpath = os.path.join(backing, "f")
    ino = os.stat(bpath).st_ino
    before = jstats(m)
    f = Model(os.open(path, os.O_RDWR), data)
    f.punch(MiB, 2 * MiB)
    f.write(0, rng.randbytes(4096))
    os.fsync(f.fd)
    util.wait_flushed(m)
    st = os.stat(bpath)
    assert st.st_ino == ino, "a new version was written for a punched hole"
    assert st.st_blocks * 512 <= size - MiB, f"the hole holds blocks: {st.st_blocks}"
    util.assert_same(read(bpath), bytes(f.b), "f after the punch, applied")
    util.fallocate(f.fd, 3 * MiB, MiB, 0x10 | FALLOC_FL_KEEP_SIZE)   # ZERO_RANGE
    f.b[3 * MiB:] = bytes(MiB)
    os.fsync(f.fd)
    f.truncate(MiB)
    f.write(size - 4096, rng.randbytes(4096))
    os.fsync(f.fd)
    st = jstats(m)
    grew = st["bytes_appended"] - before["bytes_appended"]
    assert st["records_appended"] - before["records_appended"] >= 3, (before, st)
    assert grew < 64 << 10, f"the records hold {grew} bytes"
    assert os.stat(bpath).st_ino == ino, "a new version was written"
    want = bytes(f.b)
    os.close(f.fd)
    power_cut_gives(disk, tmp_path, mount, m, {"f": want})
