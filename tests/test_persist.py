"""The persistent tier (-o persist=DIR): draining marked files to a shared
directory, removals and renames in order, restart on another "node" (a second
mount over an empty backing directory), faults of DIR (full, removed,
read-only)."""

import errno
import re
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

import util
from util import MiB, assert_same, randbytes, read_file, write_file

PX = "user.tierfs.persist"


def j(*parts):
    return os.path.join(*parts)


def pstats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["persist"]


def xattr(path, name):
    return os.getxattr(path, name).decode()


def first_copies(m):
    """Until what was written is on the SSD and copied to DIR (the daemon
    is killed next: what only the cache held would be lost)."""
    util.wait_flushed(m)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the first copies")


def leftovers(top):
    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        out += [j(dirpath, n) for n in dirnames + filenames if n.startswith(".tierfs")]
    return out


def tree(top):
    """{relpath: bytes} of the regular files under top (no .tierfs*)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if not d.startswith(".tierfs")]
        for n in filenames:
            if not n.startswith(".tierfs"):
                p = j(dirpath, n)
                out[os.path.relpath(p, top)] = read_file(p)
    return out


@pytest.fixture
def pdir(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    return str(d)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs (a shared file system that fills up or turns read-only)."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4M", "tierfs-test", str(d)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    yield str(d)
    subprocess.run(["umount", "-l", str(d)])


def test_bad_persist_dir(mount, tmp_path):
    util.require_daemon()
    f = tmp_path / "file"
    f.write_text("x")
    for bad, msg in [(str(tmp_path / "missing"), "must exist"),
                     (str(f), "not a directory")]:
        with pytest.raises(util.DaemonError) as ei:
            mount(persist=bad)
        assert msg in str(ei.value)


def test_marked_files_drain(mount, pdir):
    util.require_daemon()
    m = mount(persist=pdir)
    os.mkdir(j(m.mnt, "ck"))
    os.mkdir(j(m.mnt, "scratch"))
    os.setxattr(j(m.mnt, "ck"), PX, b"1")
    os.makedirs(j(m.mnt, "ck", "sub", "deep"))
    want = {}
    for i, size in enumerate([0, 1, 4096, 3 * MiB + 17, 9 * MiB]):
        rel = f"ck/sub/deep/f{i}" if i % 2 else f"ck/f{i}"
        want[rel] = randbytes(size)
        write_file(j(m.mnt, rel), want[rel])
    write_file(j(m.mnt, "scratch", "tmp"), b"local only")
    fd = os.open(j(m.mnt, "ck", "excluded"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.setxattr(j(m.mnt, "ck", "excluded"), PX, b"0")     # before anything reached DIR
    os.close(fd)
    write_file(j(m.mnt, "ck", "excluded"), b"not this one")
    write_file(j(m.mnt, "lone"), b"a marked file")
    os.setxattr(j(m.mnt, "lone"), PX, b"1")
    want["lone"] = b"a marked file"
    assert xattr(j(m.mnt, "ck", "sub", "deep"), PX) == "1"      # inherited
    assert xattr(j(m.mnt, "scratch", "tmp"), PX) == "0"
    for rel in want:
        os.setxattr(j(m.mnt, rel), PX, b"sync")
        assert_same(read_file(j(pdir, rel)), want[rel], rel)
        assert "pfs:PERSISTED" in xattr(j(m.mnt, rel), "user.tierfs.state")
        assert "pfs" in xattr(j(m.mnt, rel), "user.tierfs.tier").split(",")
    st = pstats(m)
    assert st["files_persisted"] >= len(want) and st["errors"] == 0
    assert st["backlog_files"] == 0
    m.umount()
    assert tree(pdir) == want
    assert leftovers(pdir) == []


def test_persist_all_and_namespace_order(mount, pdir):
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True)
    os.makedirs(j(m.mnt, "a", "b"))
    data = {f"a/b/f{i}": randbytes(100000 + i) for i in range(6)}
    for rel, d in data.items():
        write_file(j(m.mnt, rel), d)
    for rel in data:
        os.setxattr(j(m.mnt, rel), PX, b"sync")
    # renames and removals, and new versions between them
    os.rename(j(m.mnt, "a/b/f0"), j(m.mnt, "a/g0"))
    os.unlink(j(m.mnt, "a/b/f1"))
    os.rename(j(m.mnt, "a/b/f2"), j(m.mnt, "a/b/f3"))      # over a persisted file
    os.rename(j(m.mnt, "a/b"), j(m.mnt, "c"))              # a directory
    write_file(j(m.mnt, "c/f4"), b"new version of f4")
    os.mkdir(j(m.mnt, "e"))
    os.rmdir(j(m.mnt, "e"))
    m.umount()
    want = {"a/g0": data["a/b/f0"], "c/f3": data["a/b/f2"], "c/f4": b"new version of f4",
            "c/f5": data["a/b/f5"]}
    assert tree(pdir) == want
    assert tree(m.backing) == want
    assert leftovers(pdir) == []


def test_a_file_written_through_and_fsynced_reaches_dir_at_the_unmount(mount, pdir):
    """A file written through (a write far past its end) whose fsyncs are
    journal records keeps its new version open (tiers/shadow.c).  The
    unmount's sync made one more record of it instead of committing it, so
    it was committed only when the engine stopped, after the persister had:
    DIR kept the file's older copy (test_torture_then_dir_matches_backing
    [kills] found a file so).  The unmount commits it, and DIR gets it."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True, flush_age="60000")
    print("seed 41")
    rng = util.rng_for(41)
    base = randbytes(256 << 10, rng)
    write_file(j(m.mnt, "s"), base)
    os.setxattr(j(m.mnt, "s"), PX, b"sync")
    want = bytearray(base)
    fd = os.open(j(m.mnt, "s"), os.O_RDWR)
    tail = randbytes(4096, rng)
    os.pwrite(fd, tail, 40 * MiB)          # 40 MiB past its end: written through
    want.extend(bytes(40 * MiB - len(want)))
    want.extend(tail)
    os.fsync(fd)
    os.close(fd)                           # its commit waits flush_age
    m.umount()
    assert tree(m.backing)["s"] == bytes(want)
    assert tree(pdir)["s"] == bytes(want), "DIR holds an older copy"


def write_ckpts(m, rng_seed=7, n=12):
    os.mkdir(j(m.mnt, "run"))
    os.setxattr(j(m.mnt, "run"), PX, b"1")
    want = {}
    for i in range(n):
        want[f"run/ckpt-{i:03d}"] = randbytes(((i * 7919) % 5 + 1) * MiB // 2 + i,
                                             util.rng_for(rng_seed + i))
        write_file(j(m.mnt, f"run/ckpt-{i:03d}"), want[f"run/ckpt-{i:03d}"])
    os.makedirs(j(m.mnt, "run", "meta"))
    want["run/meta/step"] = b"step=1200\n"
    write_file(j(m.mnt, "run/meta/step"), want["run/meta/step"])
    return want


def test_restart_on_another_node(mount, pdir):
    """Node A writes and persists, is killed and its SSD lost; node B (an
    empty backing directory, the same DIR) reads everything back."""
    util.require_daemon()
    a = mount(persist=pdir)
    want = write_ckpts(a)
    # drain without sync: poll the statistics
    util.wait_until(lambda: pstats(a)["files_persisted"] >= len(want) and
             pstats(a)["backlog_files"] == 0, "the drain")
    a.kill(signal.SIGKILL)
    shutil.rmtree(a.backing)
    b = mount(persist=pdir)
    assert sorted(os.listdir(j(b.mnt, "run"))) == sorted(
        [os.path.basename(r) for r in want if r.count("/") == 1] + ["meta"])
    for rel, d in want.items():
        assert_same(read_file(j(b.mnt, rel)), d, rel)
    assert pstats(b)["files_fetched"] == len(want)
    # fetched files are ordinary files of B now, and stay persistent
    write_file(j(b.mnt, "run", "ckpt-new"), b"written on B")
    os.setxattr(j(b.mnt, "run", "ckpt-new"), PX, b"sync")
    assert read_file(j(pdir, "run", "ckpt-new")) == b"written on B"
    b.umount()
    assert leftovers(pdir) == []
    assert leftovers(b.backing) == []


def test_restart_with_restore_order(mount, pdir):
    util.require_daemon()
    a = mount(persist=pdir)
    want = write_ckpts(a, rng_seed=99, n=8)
    for rel in want:
        os.setxattr(j(a.mnt, rel), PX, b"sync")
    a.kill(signal.SIGKILL)
    shutil.rmtree(a.backing)
    b = mount(persist=pdir)
    names = sorted(r for r in want if r.startswith("run/ckpt"))[::-1]
    os.setxattr(j(b.mnt, "run"), "user.tierfs.restore_order",
                "\n".join(os.path.basename(r) for r in names).encode())
    os.setxattr(j(b.mnt, "run"), "user.tierfs.prefetch", b"start")
    for rel in names:
        assert_same(read_file(j(b.mnt, rel)), want[rel], rel)
    st = json.loads(os.getxattr(b.mnt, "user.tierfs.stats"))
    assert st["persist"]["files_fetched"] >= len(names)


def test_removed_name_does_not_come_back(mount, pdir):
    util.require_daemon()
    a = mount(persist=pdir)
    want = write_ckpts(a, n=4)
    for rel in want:
        os.setxattr(j(a.mnt, rel), PX, b"sync")
    a.umount()
    shutil.rmtree(a.backing)
    # node B removes and renames names that it only has from DIR; the DIR is
    # slow (persist_bw), so its queue still holds them while we look
    b = mount(persist=pdir, persist_bw="1M", persist_wait=60)
    write_file(j(b.mnt, "run", "big"), randbytes(6 * MiB))
    fd = os.open(j(b.mnt, "run", "big"), os.O_RDONLY)
    os.fsync(fd)            # its copy is queued before what follows
    os.close(fd)
    os.unlink(j(b.mnt, "run", "ckpt-000"))
    os.rename(j(b.mnt, "run", "ckpt-001"), j(b.mnt, "run", "moved"))
    assert "ckpt-000" not in os.listdir(j(b.mnt, "run"))
    assert "ckpt-001" not in os.listdir(j(b.mnt, "run"))
    assert not os.path.exists(j(b.mnt, "run", "ckpt-000"))
    assert not os.path.exists(j(b.mnt, "run", "ckpt-001"))
    assert read_file(j(b.mnt, "run", "moved")) == want["run/ckpt-001"]
    # a directory that DIR still fills cannot be removed while it shows that
    with pytest.raises(OSError) as ei:
        os.rmdir(j(b.mnt, "run", "meta"))
    assert ei.value.errno == errno.ENOTEMPTY
    b.umount()
    assert not os.path.exists(j(pdir, "run", "ckpt-000"))
    assert not os.path.exists(j(pdir, "run", "ckpt-001"))
    assert read_file(j(pdir, "run", "moved")) == want["run/ckpt-001"]
    # and a third node sees the same
    shutil.rmtree(b.backing)
    c = mount(persist=pdir)
    names = sorted(os.listdir(j(c.mnt, "run")))
    assert names == sorted(["big", "meta", "moved", "ckpt-002", "ckpt-003"])


def test_dir_full(mount, small_tmpfs):
    """DIR fills up: reported, writes unaffected, retried once there is room."""
    util.require_daemon()
    filler = j(small_tmpfs, "filler")
    write_file(filler, b"\0" * (3 * MiB))
    m = mount(persist=small_tmpfs, expect_errors=["persist: .*No space left",
                                                  "persist: not in ",
                                                  "persist: .* not applied"])
    os.mkdir(j(m.mnt, "ck"))
    os.setxattr(j(m.mnt, "ck"), PX, b"1")
    data = randbytes(2 * MiB)
    write_file(j(m.mnt, "ck", "a"), data)
    with pytest.raises(OSError) as ei:
        os.setxattr(j(m.mnt, "ck", "a"), PX, b"sync")
    assert ei.value.errno == errno.ENOSPC
    st = pstats(m)
    assert st["errors"] >= 1 and "No space" in st["last_error"]
    assert "pfs:FAILED" in xattr(j(m.mnt, "ck", "a"), "user.tierfs.state")
    # the mount goes on as usual
    more = randbytes(5 * MiB)
    write_file(j(m.mnt, "ck", "b"), more)
    fd = os.open(j(m.mnt, "ck", "b"), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    assert read_file(j(m.mnt, "ck", "b")) == more
    os.unlink(filler)
    util.wait_until(lambda: os.path.exists(j(small_tmpfs, "ck", "a")), "the retry")
    assert read_file(j(small_tmpfs, "ck", "a")) == data
    util.wait_until(lambda: "pfs:PERSISTED" in xattr(j(m.mnt, "ck", "a"), "user.tierfs.state"),
             "the state")
    # b (5 MiB) can never fit: unmount gives up after persist_wait, says so
    m.umount()
    assert "not in " in m.log() and "ck/b" in m.log()
    assert leftovers(small_tmpfs) == []


def test_dir_removed(mount, tmp_path):
    util.require_daemon()
    d = str(tmp_path / "shared")
    os.mkdir(d)
    m = mount(persist=d, persist_all=True, expect_errors=["persist: .*No such file"])
    os.rmdir(d)
    write_file(j(m.mnt, "x"), b"data of x")
    with pytest.raises(OSError) as ei:
        os.setxattr(j(m.mnt, "x"), PX, b"sync")
    assert ei.value.errno == errno.ENOENT
    assert read_file(j(m.mnt, "x")) == b"data of x"
    os.mkdir(d)
    util.wait_until(lambda: os.path.exists(j(d, "x")), "the retry")
    assert read_file(j(d, "x")) == b"data of x"
    assert pstats(m)["errors"] >= 1
    m.umount()


def test_dir_read_only(mount, small_tmpfs):
    util.require_daemon()
    m = mount(persist=small_tmpfs, persist_all=True, persist_wait=1,
              expect_errors=["persist: .*Read-only", "persist: .*not in ",
                             "persist: .*not applied"])
    subprocess.run(["mount", "-o", "remount,ro", small_tmpfs], check=True)
    write_file(j(m.mnt, "y"), b"data of y")
    with pytest.raises(OSError) as ei:
        os.setxattr(j(m.mnt, "y"), PX, b"sync")
    assert ei.value.errno == errno.EROFS
    write_file(j(m.mnt, "z"), b"z")          # writes and fsync go on
    fd = os.open(j(m.mnt, "z"), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    assert pstats(m)["state"] == "retrying"
    # unmount does not wait for ever: it says what is missing
    m.umount()
    assert "operations not applied" in m.log() or "operation not applied" in m.log()
    assert read_file(j(m.backing, "y")) == b"data of y"
    # what is not in DIR stays in the backing directory's journal
    assert {p for _, p, _ in util.persist_notes(m.backing)} >= {"y", "z"}
    subprocess.run(["mount", "-o", "remount,rw", small_tmpfs], check=True)
    # the next mount over this backing directory resumes them (its journal)
    m.start()
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed copies")
    assert read_file(j(small_tmpfs, "y")) == b"data of y"
    assert read_file(j(small_tmpfs, "z")) == b"z"
    m.umount()
    assert not os.path.exists(j(m.backing, ".tierfs.persist.journal"))
    assert not os.path.exists(j(m.backing, util.JOURNAL))   # all done: removed


def test_kill_resumes_from_journal(mount, pdir):
    """Killed with copies and a removal queued: the next daemon over the same
    backing directory finishes them, the removed name stays removed, and the
    temporary of the copy that the kill cut short does not stay in DIR."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True, persist_bw="1M")
    write_file(j(m.mnt, "old"), b"old file")
    os.setxattr(j(m.mnt, "old"), PX, b"sync")
    assert os.path.exists(j(pdir, "old"))
    want = {"big": randbytes(6 * MiB), "small": b"small file"}
    for name, d in want.items():
        write_file(j(m.mnt, name), d)
        fd = os.open(j(m.mnt, name), os.O_RDONLY)
        os.fsync(fd)                   # queued: big first (6 s at 1 MiB/s)
        os.close(fd)
    os.unlink(j(m.mnt, "old"))
    m.kill(signal.SIGKILL)
    # the queue is in the backing directory's one journal, checksummed
    notes = util.persist_notes(m.backing)
    assert ("U0", "old", "") in notes and ("C0", "small", "") in notes, notes
    assert not os.path.exists(j(m.backing, ".tierfs.persist.journal"))
    m.start(persist_bw=None)
    assert not os.path.exists(j(m.mnt, "old"))
    assert "old" not in os.listdir(m.mnt)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0 and
             not os.path.exists(j(pdir, "old")), "the resumed queue")
    m.umount()
    assert tree(pdir) == want
    assert leftovers(pdir) == []       # the killed daemon's temporary of "big"
    assert not os.path.exists(j(m.backing, util.JOURNAL))


def killed_with_a_queue(mount, pdir):
    """A daemon killed with copies of "a" (6 MiB, at 1 MiB/s) and "b"
    queued: its journal holds them (the mount, stopped)."""
    m = mount(persist=pdir, persist_all=True, persist_bw="1M")
    want = {"a": randbytes(6 * MiB), "b": b"file b"}
    for name, d in want.items():
        write_file(j(m.mnt, name), d)
        fd = os.open(j(m.mnt, name), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    m.kill(signal.SIGKILL)
    assert ("C0", "b", "") in util.persist_notes(m.backing)
    return m, want


def resumed(m, pdir, want):
    m.start(persist_bw=None)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed queue")
    m.umount()
    assert tree(pdir) == want
    assert leftovers(pdir) == []


def test_a_resumed_copy_follows_its_file_renamed_before_it_ran(mount, pdir):
    """A copy resumed from the journal names its file by path.  Renamed
    through the mount before the copy's turn (here behind 6 s of another
    copy), the file still reaches DIR, under its new name, and the name it
    left does not stay there."""
    util.require_daemon()
    m, want = killed_with_a_queue(mount, pdir)
    m.start()                      # persist_bw=1M still: "a" first, 6 s
    os.rename(j(m.mnt, "b"), j(m.mnt, "c"))
    want["c"] = want.pop("b")
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed queue")
    m.umount()
    assert tree(pdir) == want


def test_a_new_file_renamed_over_a_copied_one_reaches_dir_after_a_kill(mount, pdir):
    """A file created (its intent in the journal), still open and never
    flushed, renamed over a name that DIR holds, the rename done in DIR (a
    no-op there: the new file has no copy yet), then a kill: the next
    daemon copies the new file to the name it has now.  DIR does not keep
    the old file under it (found by the persistent torture under ASan:
    the replay dropped the done rename before the intent's copy could
    follow it)."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True)
    write_file(j(m.mnt, "f0"), b"the old f0" * 1000)
    os.setxattr(j(m.mnt, "f0"), PX, b"sync")
    assert read_file(j(pdir, "f0")) == b"the old f0" * 1000
    fd = os.open(j(m.mnt, "f5"), os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.rename(j(m.mnt, "f5"), j(m.mnt, "f0"))
        util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the rename in DIR")
        notes = util.persist_notes(m.backing)
        assert ("I0", "f5", "") in notes and ("R0", "f5", "f0") in notes, notes
        m.kill(signal.SIGKILL)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    m.start()
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed queue")
    m.umount()
    assert tree(pdir) == {"f0": b""}
    assert leftovers(pdir) == []


def test_a_small_change_journalled_before_a_kill_reaches_dir(mount, pdir, monkeypatch):
    """A small change made durable as a journal record (ext4 here: no
    reflink), the daemon killed before the record is written into the
    file (TIERFS_DELAY=journal_apply holds it): the next daemon applies the
    record, and DIR gets the changed file.  (Found by the persistent
    torture under ASan: the copy's intent was journalled at the apply, after
    the record, so a kill between them left DIR the old file.)"""
    util.require_daemon()
    monkeypatch.setenv("TIERFS_DELAY", "journal_apply=600000")
    m = mount(persist=pdir, persist_all=True, dedup="off")
    old = randbytes(MiB)
    new = bytearray(old)
    new[4096:4096 + 100] = b"n" * 100
    write_file(j(m.mnt, "f"), old)
    os.setxattr(j(m.mnt, "f"), PX, b"sync")
    assert read_file(j(pdir, "f")) == old
    fd = os.open(j(m.mnt, "f"), os.O_WRONLY)
    os.pwrite(fd, b"n" * 100, 4096)
    os.fsync(fd)                        # a journal record, its apply held
    m.kill(signal.SIGKILL)
    try:
        os.close(fd)
    except OSError:
        pass
    monkeypatch.delenv("TIERFS_DELAY")
    assert read_file(j(m.backing, "f")) == old, "the apply was not held back"
    m.start()
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed queue")
    m.umount()
    assert read_file(j(m.backing, "f")) == bytes(new)
    util.assert_same(read_file(j(pdir, "f")), bytes(new), "DIR's f")


def test_a_listing_never_shows_a_name_dir_loses_while_it_looks(mount, pdir, monkeypatch):
    """A listing merges DIR's names that the backing directory lacks and no
    queued removal or rename hides.  A rename that the persister makes in
    DIR between the listing's read of DIR and that check (TIERFS_DELAY=
    persist_extras holds the listing between them) must not show the old
    name: it is in neither place by then.  (Found by the persistent
    torture under ASan: a name renamed away came back in a listing after
    a restart.)"""
    util.require_daemon()
    monkeypatch.setenv("TIERFS_DELAY", "persist_extras=4000")
    m = mount(persist=pdir, persist_all=True, persist_bw="1M")
    write_file(j(m.mnt, "b"), b"file b")
    os.setxattr(j(m.mnt, "b"), PX, b"sync")
    assert read_file(j(pdir, "b")) == b"file b"
    write_file(j(m.mnt, "a"), randbytes(2 * MiB))
    fd = os.open(j(m.mnt, "a"), os.O_RDONLY)
    os.fsync(fd)                        # queued: "a" first, 2 s at 1 MiB/s
    os.close(fd)
    os.rename(j(m.mnt, "b"), j(m.mnt, "c"))     # queued behind it
    assert "b" in os.listdir(pdir), "the rename reached DIR before the listing"
    names = sorted(os.listdir(m.mnt))   # reads DIR's "b", held 4 s meanwhile
    assert "b" not in os.listdir(pdir), "the rename did not reach DIR meanwhile"
    assert names == ["a", "c"], names
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the queue")
    m.umount()
    assert sorted(tree(pdir)) == ["a", "c"]


def test_a_torn_tail_after_the_queue_is_dropped_and_the_queue_resumed(mount, pdir):
    """A record cut short at the journal's end (a kill inside its write):
    the next mount drops it, says so, and resumes the whole records before
    it."""
    util.require_daemon()
    m, want = killed_with_a_queue(mount, pdir)
    with open(j(m.backing, util.JOURNAL), "ab") as f:
        f.write(b"TRJ1" + bytes(20))   # a header, torn
    resumed(m, pdir, want)
    assert "not whole, valid records" in m.log()
    assert not os.path.exists(j(m.backing, util.JOURNAL))


def test_recover_keeps_the_queue_for_the_next_mount(mount, pdir):
    """tierfs --recover applies the journal's changes and keeps the
    persistent tier's queue in it: the next mount resumes it."""
    util.require_daemon()
    m, want = killed_with_a_queue(mount, pdir)
    r = subprocess.run([util.tierfs_bin(), "--recover", m.backing], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert ("C0", "b", "") in util.persist_notes(m.backing)
    resumed(m, pdir, want)


def test_a_mount_without_persist_keeps_the_queue(mount, pdir):
    """A mount without -o persist over a backing directory whose journal
    holds a queue leaves it there: changes made durable as records come and
    go, and each emptying of the journal keeps the queue's records alone
    (the journal does not grow with the records after them); the next
    mount with persist resumes the queue."""
    util.require_daemon()
    m, want = killed_with_a_queue(mount, pdir)
    m.start(persist=None, persist_all=None, persist_bw=None)
    write_file(j(m.mnt, "c"), randbytes(32 * MiB))
    fd = os.open(j(m.mnt, "c"), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    for i in range(3):     # 5 MiB of 32 each: journal records of 4 MiB or more
        fd = os.open(j(m.mnt, "c"), os.O_WRONLY)
        os.pwrite(fd, randbytes(5 * MiB), i * 5 * MiB)
        os.fsync(fd)
        os.close(fd)
    util.wait_flushed(m)
    st = json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["journal"]
    assert st["records_appended"] >= 3 and st["resets"] >= 1, st
    m.umount()
    assert ("C0", "b", "") in util.persist_notes(m.backing)
    assert os.path.getsize(j(m.backing, util.JOURNAL)) < MiB
    want["c"] = read_file(j(m.backing, "c"))
    m.start(persist=pdir, persist_all=True)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed queue")
    os.setxattr(j(m.mnt, "c"), PX, b"sync")
    m.umount()
    assert tree(pdir) == want


def with_old_journal_file(mount, pdir):
    """A stopped mount whose "e" is in DIR no more, and whose backing
    directory holds the journal file of earlier releases with its copy."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True)
    write_file(j(m.mnt, "e"), b"file e")
    util.wait_flushed(m)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the copy")
    m.umount()
    os.unlink(j(pdir, "e"))
    with open(j(m.backing, ".tierfs.persist.journal"), "wb") as f:
        f.write(b"C0\0e\0\0")
    return m


def test_a_resumed_queue_in_the_journal_supersedes_the_old_journal_file(mount, pdir):
    """The queue a replay wrote back (a note beginning with S) holds what
    the journal file of earlier releases held, when that file could not be
    removed after it: the next start does not resume the file's records
    again."""
    m = with_old_journal_file(mount, pdir)
    util.journal_append(m.backing, [(util.JNL_NOTE, b"S0\0\0\0")])    # an empty queue
    m.start()
    assert not os.path.exists(j(m.backing, ".tierfs.persist.journal"))
    m.umount()
    assert "resuming" not in m.log()
    assert not os.path.exists(j(pdir, "e"))


def test_the_journal_file_of_earlier_releases_is_resumed_once(mount, pdir):
    """BACKING/.tierfs.persist.journal, as releases before the one journal
    left it: its copies are resumed, and it is removed."""
    m = with_old_journal_file(mount, pdir)
    m.start()
    util.wait_until(lambda: os.path.exists(j(pdir, "e")), "the resumed copy")
    assert read_file(j(pdir, "e")) == b"file e"
    assert not os.path.exists(j(m.backing, ".tierfs.persist.journal"))
    m.umount()


@pytest.mark.slow
@pytest.mark.parametrize("crash", [False, True], ids=["clean", "kills"])
def test_torture_then_dir_matches_backing(tmp_path, crash):
    """Every operation of the torture harness (writes in place, truncates,
    renames over files, links, unlinks of open files...) with persist_all,
    with and without SIGKILLs of the daemon at random moments (each next
    daemon resumes the journal): after the last, clean unmount DIR holds
    what the backing directory holds (hard links as separate files), and no
    temporary (a killed daemon's are removed by the next)."""
    util.require_daemon()
    pdir = tmp_path / "shared"
    pdir.mkdir()
    work = tmp_path / "work"
    seconds = os.environ.get("TIERFS_TORTURE_SECONDS", "20")
    cmd = [sys.executable, j(util.TESTS_DIR, "torture.py"), "--workdir", str(work),
           "--seconds", seconds, "--rate", "64", "--host-cache", "16M", "--keep",
           "--mount-opts", f"persist={pdir},persist_all,persist_wait=300"]
    if crash:
        cmd += ["--crash"]
    cmd += ["--seed", str(util.pick_seed("TIERFS_TORTURE_SEED", 1, "torture"))]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600, env=dict(os.environ, TIERFS_BIN=util.tierfs_bin()))
    assert r.returncode == 0, r.stdout[-20000:]
    backing = j(str(work), "tierfs", "backing")
    got, want = tree(str(pdir)), tree(backing)
    assert sorted(got) == sorted(want), (
        f"only in DIR: {sorted(set(got) - set(want))}, only in the backing directory: "
        f"{sorted(set(want) - set(got))}; the run:\n{r.stdout[-6000:]}")
    for rel in want:
        assert_same(got[rel], want[rel], rel)
    assert leftovers(str(pdir)) == []


def test_versions_never_mixed(mount, pdir):
    """A file rewritten again and again while it drains: DIR's copy is always
    one whole version (every byte of a version is its number)."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True, persist_bw="64M")
    path, copy = j(m.mnt, "ck"), j(pdir, "ck")
    size = 3 * MiB
    seen = set()
    for v in range(1, 40):
        with open(path, "r+b" if v > 1 else "wb") as f:
            f.write(bytes([v]) * size)          # in place: the same file
            os.fsync(f.fileno())
        if v == 20:
            util.wait_until(lambda: os.path.exists(copy), "a first copy")
        try:
            got = read_file(copy)
        except FileNotFoundError:
            continue
        assert len(got) == size and got == bytes([got[0]]) * size, "a mixed copy"
        seen.add(got[0])
    os.setxattr(path, PX, b"sync")
    assert read_file(copy) == bytes([39]) * size
    assert seen, "no copy was seen while writing"


def test_small_first_versions_drain_without_asking(mount, pdir):
    """A new file of at most a page is flushed into its empty backing file in
    place (no new version inode): it reaches DIR all the same, without a
    persist=sync to push it."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True)
    want = {f"s{i}": randbytes(n) for i, n in enumerate([1, 100, 4096])}
    for rel, data in want.items():
        write_file(j(m.mnt, rel), data)

    def drained():
        return all(os.path.exists(j(pdir, rel)) and read_file(j(pdir, rel)) == data
                   for rel, data in want.items())

    util.wait_until(drained, "the small files in DIR", timeout=30)
    m.umount()
    assert tree(pdir) == want


def test_python_persist_helpers(mount, pdir):
    """tierfs.persist() marks and reads the mark; tierfs.persist_sync()
    returns once the file is in DIR."""
    util.require_daemon()
    sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
    import tierfs
    m = mount(persist=pdir)
    os.mkdir(j(m.mnt, "ck"))
    assert tierfs.persist(j(m.mnt, "ck")) is False
    assert tierfs.persist(j(m.mnt, "ck"), True) is True
    data = randbytes(3 * MiB + 5)
    write_file(j(m.mnt, "ck", "a"), data)
    assert tierfs.persist(j(m.mnt, "ck", "a")) is True          # inherited
    tierfs.persist_sync(j(m.mnt, "ck", "a"))
    assert_same(read_file(j(pdir, "ck", "a")), data, "ck/a")
    out = subprocess.run([sys.executable, j(util.REPO_DIR, "tools", "tierfs-stat"), m.mnt],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("persist"))
    assert pdir in line and " files / " in line, line
    m.umount()


def test_stats_are_json_whatever_dir_is_called(mount, tmp_path):
    """DIR's path and the last error's file name go into user.tierfs.stats
    as JSON strings: quotes and backslashes in them are escaped."""
    util.require_daemon()
    odd = tmp_path / 'p"q'          # (a backslash would be an -o escape)
    odd.mkdir()
    m = mount(persist=str(odd), persist_all=True)
    write_file(j(m.mnt, 'f"\\'), b"x" * 5000)
    os.setxattr(j(m.mnt, 'f"\\'), PX, b"sync")
    st = pstats(m)                  # json.loads inside
    assert st["dir"] == str(odd) and st["files_persisted"] >= 1, st
    m.umount()


@pytest.fixture
def passthrough(tmp_path):
    """A directory served by libfuse's passthrough_ll example (built from
    libfuse3-dev's examples): a file system whose server can be stopped.
    Yields (mount point, pid)."""
    src = "/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c"
    if not os.path.exists(src):
        pytest.skip(f"{src} missing (libfuse3-dev)")
    exe, data, mnt = tmp_path / "passthrough_ll", tmp_path / "pt-data", tmp_path / "pt-mnt"
    data.mkdir()
    mnt.mkdir()
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"],
                           capture_output=True, text=True, check=True).stdout.split()
    subprocess.run(["cc", "-O2", "-o", str(exe), src] + flags, check=True)
    proc = subprocess.Popen([str(exe), "-f", "-o", f"source={data}", str(mnt)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        util.wait_until(lambda: util.is_mounted(str(mnt)), "passthrough_ll's mount", 20)
        yield str(mnt), proc.pid
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        subprocess.run(["umount", "-l", str(mnt)])
        proc.kill()
        proc.wait()


def test_dir_hangs(mount, passthrough):
    """DIR stops answering (a shared file system that hangs: here a FUSE
    file system whose server is stopped).  Writes, fsync, reads, creates and
    lookups of names that do not exist go on without waiting for it;
    unmount ends within persist_wait and a bounded grace, and says what was
    not persisted.  When DIR answers again, a new mount finishes the job."""
    util.require_daemon()
    pmnt, pid = passthrough
    pdir = j(pmnt, "shared")
    os.mkdir(pdir)
    m = mount(persist=pdir, persist_all=True, persist_wait=1, persist_timeout=2,
              expect_errors=[r"persist"])
    write_file(j(m.mnt, "before"), b"before the hang")
    os.setxattr(j(m.mnt, "before"), PX, b"sync")
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        data = randbytes(2 * MiB)
        write_file(j(m.mnt, "during"), data)
        fd = os.open(j(m.mnt, "during"), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        assert_same(read_file(j(m.mnt, "during")), data, "during")
        assert not os.path.exists(j(m.mnt, "never-made"))   # a lookup miss
        os.mkdir(j(m.mnt, "sub"))
        write_file(j(m.mnt, "sub", "f"), b"in a new directory")
        assert sorted(os.listdir(m.mnt)) == ["before", "during", "sub"]
        st = pstats(m)
        assert st["dir_answers"] is False and st["timeouts"] >= 1, st
        assert st["state"] == "not answering", st
        with pytest.raises(OSError) as e:       # bounded, and says why
            os.setxattr(j(m.mnt, "during"), PX, b"sync")
        assert e.value.errno == errno.ETIMEDOUT
        elapsed = time.monotonic() - t0
        assert elapsed < 30, f"the mount waited {elapsed:.1f} s for a hung DIR"
        t0 = time.monotonic()
        m.umount(timeout=30)
        assert time.monotonic() - t0 < 30
        assert re.search(r"not in .*: copy during|not applied|does not answer",
                         m.log()), m.log(tail=40)
    finally:
        os.kill(pid, signal.SIGCONT)
    m.start(persist_wait=60)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed queue")
    m.umount()
    assert tree(pdir) == {"before": b"before the hang", "during": data,
                          "sub/f": b"in a new directory"}


def test_persist_keep_rotates_checkpoints(mount, pdir):
    """-o persist_keep=3: each directory of DIR keeps the three newest files
    (checkpoint rotation); the mount keeps all of them, subdirectories are
    not counted, and the statistics count what was removed."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True, persist_keep=3)
    os.mkdir(j(m.mnt, "run"))
    os.mkdir(j(m.mnt, "run", "logs"))
    want = {}
    for i in range(7):
        name = f"run/ckpt-{i:03d}"
        want[name] = randbytes(64 * 1024 + i)
        write_file(j(m.mnt, name), want[name])
        os.setxattr(j(m.mnt, name), PX, b"sync")        # in order of mtime
        time.sleep(0.01)
    write_file(j(m.mnt, "run", "logs", "a"), b"a log")
    os.setxattr(j(m.mnt, "run", "logs", "a"), PX, b"sync")
    st = pstats(m)
    assert st["keep"] == 3 and st["pruned"] == 4, st
    got = tree(pdir)
    assert sorted(got) == ["run/ckpt-004", "run/ckpt-005", "run/ckpt-006", "run/logs/a"]
    for name in ("run/ckpt-004", "run/ckpt-005", "run/ckpt-006"):
        assert_same(got[name], want[name], name)
    assert sorted(os.listdir(j(m.mnt, "run"))) == sorted(
        [f"ckpt-{i:03d}" for i in range(7)] + ["logs"])
    for name, data in want.items():
        assert_same(read_file(j(m.mnt, name)), data, name)
    out = subprocess.run([sys.executable, j(util.REPO_DIR, "tools", "tierfs-stat"), m.mnt],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("persist"))
    assert "4 pruned (keep 3)" in line, line
    m.umount()


def test_persist_keep_needs_a_number(tmp_path, pdir):
    util.require_daemon()
    for bad in ("0", "-1", "x", "3x"):
        r = subprocess.run([util.tierfs_bin(), str(tmp_path), str(tmp_path / "m"), "-o",
                            f"persist={pdir},persist_keep={bad}"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "persist_keep" in r.stderr, (bad, r.stderr)


def test_hard_linked_names_a_restarted_daemon_does_not_know(mount, pdir):
    """A file with two names, the daemon restarted (it knows no name), then
    known by a third name that is renamed away and removed: a new version
    written through one name reaches both remaining names in DIR."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True)
    os.mkdir(j(m.mnt, "w"))
    write_file(j(m.mnt, "w", "other"), b"other")
    write_file(j(m.mnt, "w", "f1"), b"a" * 36864)
    os.link(j(m.mnt, "w", "f1"), j(m.mnt, "w", "f4"))
    os.link(j(m.mnt, "w", "f4"), j(m.mnt, "w", "f3"))
    first_copies(m)
    m.kill(signal.SIGKILL)
    m.start()
    read_file(j(m.mnt, "w", "f3"))
    os.stat(j(m.mnt, "w", "f4"))
    os.rename(j(m.mnt, "w", "f4"), j(m.mnt, "w", "other"))
    os.unlink(j(m.mnt, "w", "other"))
    data = randbytes(MiB + 5)
    with open(j(m.mnt, "w", "f1"), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the copies")
    m.umount()
    got = tree(pdir)
    assert sorted(got) == ["w/f1", "w/f3"]
    assert_same(got["w/f1"], data, "w/f1")
    assert_same(got["w/f3"], data, "w/f3")


def test_created_file_killed_before_its_first_flush(mount, pdir):
    """A file created through the mount and the daemon killed before the
    file's first flush: the next daemon copies it (as it is in the backing
    directory) to DIR; DIR has every name the backing directory has."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True, persist_bw="1M")
    write_file(j(m.mnt, "big"), randbytes(4 * MiB))     # keeps the persister busy
    fd = os.open(j(m.mnt, "big"), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.close(os.open(j(m.mnt, "empty"), os.O_WRONLY | os.O_CREAT, 0o644))
    m.kill(signal.SIGKILL)
    m.start(persist_bw=None)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed queue")
    m.umount()
    assert sorted(tree(pdir)) == sorted(tree(m.backing)) == ["big", "empty"]


@pytest.mark.parametrize("how", ["create", "mknod", "link"])
def test_kill_right_after_a_name_is_made(mount, pdir, monkeypatch, how):
    """The daemon killed right after a create, a mknod or a link made its name in the backing directory, before anything else
    (TIERFS_FAULT=name_made): the next daemon still brings DIR to what the
    backing directory holds (the name's copy was journalled before the
    backing directory changed)."""
    util.require_daemon("kills the daemon")
    m = mount(persist=pdir, persist_all=True)
    write_file(j(m.mnt, "a"), b"first file")
    os.setxattr(j(m.mnt, "a"), PX, b"sync")
    m.umount()
    monkeypatch.setenv("TIERFS_FAULT", "name_made")
    m.start()
    try:
        if how == "create":
            os.close(os.open(j(m.mnt, "b"), os.O_WRONLY | os.O_CREAT, 0o644))
        elif how == "mknod":
            os.mknod(j(m.mnt, "b"), 0o644 | stat.S_IFREG)
        else:
            os.link(j(m.mnt, "a"), j(m.mnt, "b"))
    except OSError:
        pass                    # the daemon died under the call
    assert m.wait_death() == -9, m.log(tail=50)
    monkeypatch.delenv("TIERFS_FAULT")
    m.start()
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed queue")
    m.umount()
    want = tree(m.backing)
    assert sorted(want) == ["a", "b"]
    assert tree(pdir) == want


def test_copy_queued_again_after_a_rename_of_its_name(mount, pdir):
    """A name copied, renamed away and made again while its first copy still
    waits in the queue (link a b; mv b c; link a b): the second copy is not
    the first one's (which the rename moves to c): DIR gets b too."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True, persist_bw="1M", persist_wait="120")
    write_file(j(m.mnt, "a"), b"linked file")
    os.setxattr(j(m.mnt, "a"), PX, b"sync")
    write_file(j(m.mnt, "big"), randbytes(2 * MiB))     # keeps the persister busy
    fd = os.open(j(m.mnt, "big"), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.link(j(m.mnt, "a"), j(m.mnt, "b"))
    os.rename(j(m.mnt, "b"), j(m.mnt, "c"))
    os.link(j(m.mnt, "a"), j(m.mnt, "b"))
    assert pstats(m)["backlog_files"] > 0      # the first copy of b still waits
    m.umount()
    want = tree(m.backing)
    assert sorted(want) == ["a", "b", "big", "c"]
    assert tree(pdir) == want


@pytest.mark.parametrize("what", ["dir", "file"])
def test_kill_after_a_rename_whose_source_was_made_again(mount, pdir, what):
    """mv A B, then A made again, then a kill before the persister got to the
    rename: the next daemon must still apply the rename to DIR (the journal
    says it was made), not take the new A for a sign that it was not: DIR
    then equals the backing directory (B's content under B, A's under A)."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True, persist_bw="1M")
    a, b = j(m.mnt, "A"), j(m.mnt, "B")
    if what == "dir":
        os.mkdir(a)
        write_file(j(a, "f"), b"moved with its directory")
        os.setxattr(j(a, "f"), PX, b"sync")
    else:
        write_file(a, b"renamed file")
        os.setxattr(a, PX, b"sync")
    write_file(j(m.mnt, "big"), randbytes(4 * MiB))     # keeps the persister busy
    fd = os.open(j(m.mnt, "big"), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.rename(a, b)
    if what == "dir":
        os.mkdir(a)
    else:
        write_file(a, b"a new file A")
        fd = os.open(a, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    assert pstats(m)["backlog_files"] > 0      # the rename still waits
    m.kill(signal.SIGKILL)
    m.start(persist_bw=None)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the resumed queue")
    m.umount()
    want = tree(m.backing)
    assert sorted(want) == (["B/f", "big"] if what == "dir" else ["A", "B", "big"])
    assert tree(pdir) == want


def test_file_made_and_closed_empty_reaches_dir(mount, pdir):
    """`touch` through the mount: an empty file has no flush, and still
    reaches DIR (at its close); one marked 0 meanwhile does not."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True)
    os.close(os.open(j(m.mnt, "marker"), os.O_WRONLY | os.O_CREAT, 0o644))
    fd = os.open(j(m.mnt, "not-this"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.setxattr(j(m.mnt, "not-this"), PX, b"0")
    os.close(fd)
    util.wait_until(lambda: os.path.exists(j(pdir, "marker")), "the empty file in DIR")
    m.umount()
    assert tree(pdir) == {"marker": b""}


def test_file_made_by_mknod_reaches_dir(mount, pdir):
    """A regular file made by mknod(2) (os.mknod, never opened) reaches DIR,
    empty, and so does what is written into it later; a FIFO does not (only
    regular files are persisted)."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True)
    os.mknod(j(m.mnt, "made"), 0o644 | stat.S_IFREG)
    os.mkfifo(j(m.mnt, "fifo"))
    util.wait_until(lambda: os.path.exists(j(pdir, "made")), "the mknod'ed file in DIR")
    assert read_file(j(pdir, "made")) == b""
    write_file(j(m.mnt, "made"), b"now with data")
    m.umount()
    assert tree(pdir) == {"made": b"now with data"}


def test_hard_linked_file_written_through_a_removed_name(mount, pdir):
    """A hard-linked file, the daemon restarted (it knows no name), opened by
    one name that is then removed: a new version written through that open
    file reaches its other names in DIR (the removed name's directory is
    searched even though the descriptor's own name is gone)."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True)
    os.mkdir(j(m.mnt, "w"))
    write_file(j(m.mnt, "w", "f6"), b"a" * 40000)
    os.link(j(m.mnt, "w", "f6"), j(m.mnt, "w", "f7"))
    os.link(j(m.mnt, "w", "f7"), j(m.mnt, "w", "f0"))
    first_copies(m)
    m.kill(signal.SIGKILL)
    m.start()
    data = randbytes(MiB + 7)
    fd = os.open(j(m.mnt, "w", "f6"), os.O_RDWR)
    try:
        os.unlink(j(m.mnt, "w", "f6"))
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the copies")
    m.umount()
    got = tree(pdir)
    assert sorted(got) == ["w/f0", "w/f7"]
    assert_same(got["w/f7"], data, "w/f7")
    assert_same(got["w/f0"], data, "w/f0")


def test_hard_link_in_another_directory_a_restarted_daemon_does_not_know(mount, pdir):
    """A file with names in two directories, the daemon restarted (it knows
    no name): a new version written through the name in one directory
    reaches the name in the other directory, which the daemon never looked
    up, in DIR too (the backing tree is searched for the missing links)."""
    util.require_daemon()
    m = mount(persist=pdir, persist_all=True)
    for d in ("a", "b", "b/deep"):
        os.mkdir(j(m.mnt, d))
    write_file(j(m.mnt, "a", "ck"), b"a" * 40000)
    os.link(j(m.mnt, "a", "ck"), j(m.mnt, "b", "deep", "ck-link"))
    write_file(j(m.mnt, "b", "other"), b"other")
    first_copies(m)
    m.kill(signal.SIGKILL)
    m.start()
    data = randbytes(MiB + 9)
    with open(j(m.mnt, "a", "ck"), "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the copies")
    m.umount()
    got = tree(pdir)
    assert sorted(got) == ["a/ck", "b/deep/ck-link", "b/other"]
    assert_same(got["a/ck"], data, "a/ck")
    assert_same(got["b/deep/ck-link"], data, "b/deep/ck-link")
    assert got["b/other"] == b"other"
