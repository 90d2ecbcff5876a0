"""Checkpoint sets (tierfs-hints(7), CHECKPOINT SETS): user.tierfs.commit on
a directory, its state per level (user.tierfs.set), the newest complete set
(latest), waiting for one, and retention (user.tierfs.keep, -o keep_sets),
in their xattr, Python, tierfsctl and libtierfs forms."""

import ctypes
import errno
import json
import os
import random
import signal
import subprocess
import sys
import threading

import pytest

import util
from util import MiB, randbytes, write_file

sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
import tierfs  # noqa: E402

TOOL = os.path.join(util.REPO_DIR, "tools", "tierfsctl")
SEED = util.pick_seed("TIERFS_SETS_SEED", 3911, "sets")
j = os.path.join

pytestmark = pytest.mark.daemon


def ctl(*args, timeout=120):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True,
                          timeout=timeout)


def persisted_parent(mount, tmp_path, **opts):
    """A mount with -o persist=TMP/shared (and opts) and a persistent
    directory ck on it: (mount, DIR, ck)."""
    pdir = tmp_path / "shared"
    pdir.mkdir()
    m = mount(persist=str(pdir), **opts)
    top = j(m.mnt, "ck")
    os.mkdir(top)
    tierfs.persist(top, True)
    return m, pdir, top


def make_set(d, nfiles=3, size=64 * 1024, rng=None, commit=True):
    os.makedirs(d, exist_ok=True)
    rng = rng or random.Random(SEED)
    want = {}
    for i in range(nfiles):
        want[f"rank{i}"] = randbytes(size + i, rng)
        write_file(j(d, f"rank{i}"), want[f"rank{i}"])
    if commit:
        tierfs.commit(d)
    return want


def lib():
    path = os.environ.get("TIERFS_LIB") or j(util.REPO_DIR, "build", ".libs", "libtierfs.so")
    if not os.path.exists(path):
        pytest.skip(f"{path}: libtierfs not built (set TIERFS_LIB)")
    lt = ctypes.CDLL(path, use_errno=True)
    lt.tierfs_latest.restype = ctypes.c_void_p
    lt.tierfs_latest.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lt.tierfs_wait_set.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lt.tierfs_commit.argtypes = [ctypes.c_char_p]
    return lt


def c_latest(lt, parent, level):
    p = lt.tierfs_latest(parent.encode(), level.encode())
    if not p:
        return None, ctypes.get_errno()
    s = ctypes.string_at(p).decode()
    ctypes.CDLL(None).free(ctypes.c_void_p(p))
    return s, 0


def test_commit_state_latest_in_every_form(mount):
    m = mount()
    top = j(m.mnt, "ckpt")
    os.mkdir(top)
    lt = lib()
    rng = random.Random(SEED)
    make_set(j(top, "s0"), rng=rng, commit=False)
    os.setxattr(j(top, "s0"), "user.tierfs.commit", b"")        # the xattr
    make_set(j(top, "s1"), rng=rng, commit=False)
    r = ctl("commit", j(top, "s1"))                             # tierfsctl
    assert r.returncode == 0, r.stderr
    make_set(j(top, "s2"), rng=rng, commit=False)
    assert lt.tierfs_commit(j(top, "s2").encode()) == 0         # libtierfs
    make_set(j(top, "s3"), rng=rng)                             # Python
    os.mkdir(j(top, "not-a-set"))
    for s in ("s0", "s1", "s2", "s3"):
        st = tierfs.wait_set(j(top, s), "ssd", timeout=60)
        assert st["files"] == 3 and st["bytes"] == 3 * 64 * 1024 + 3, st
        assert st["cache"] == "complete" and st["pfs"] == "off" and st["level"] == "ssd"
        assert st["files_not_done"] == []
    text = os.getxattr(j(top, "s1"), "user.tierfs.set").decode()
    assert text.startswith("committed ") and "\nssd complete " in text, text
    assert tierfs.set_state(j(top, "not-a-set")) is None
    assert [os.path.basename(p) for p, _ in tierfs.sets(top)] == ["s0", "s1", "s2", "s3"]
    assert tierfs.latest(top, "ssd") == j(top, "s3")
    assert tierfs.latest(top, "pfs") is None
    r = ctl("latest", top, "--level", "ssd")
    assert r.returncode == 0 and r.stdout.strip() == j(top, "s3"), r
    assert c_latest(lt, top, "ssd") == (j(top, "s3"), 0)
    assert c_latest(lt, top, "pfs") == (None, errno.ENOENT)
    assert lt.tierfs_wait_set(j(top, "s2").encode(), b"ssd", 60000) == 0
    r = ctl("sets", top)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["SET", "SIZE", "COMMITTED", "LEVEL"]
    assert [ln.split()[0] for ln in lines[1:]] == ["s0", "s1", "s2", "s3"], r.stdout
    r = ctl("wait", "--level", "ssd", j(top, "s0"))
    assert r.returncode == 0, r.stderr
    r = ctl("wait", "--level", "pfs", j(top, "s0"))     # no persist=DIR
    assert r.returncode == 1 and "persistent tier" in r.stderr, r.stderr
    # a set's own record never shows through the mount, and it goes with rmdir
    assert sorted(os.listdir(j(top, "s0"))) == ["rank0", "rank1", "rank2"]
    for n in os.listdir(j(top, "s0")):
        os.unlink(j(top, "s0", n))
    os.rmdir(j(top, "s0"))
    # a file changed after the commit is said so
    write_file(j(top, "s1", "rank1"), b"rewritten")
    util.wait_released(m)       # "pending" while its release is under way
    st = tierfs.set_state(j(top, "s1"))
    assert st["cache"] == "incomplete" and st["ssd"] == "incomplete", st
    assert [n for n, w in st["files_not_done"]] == ["rank1"], st
    with pytest.raises(OSError) as ei:
        tierfs.wait_set(j(top, "s1"), "ssd", timeout=10)
    assert ei.value.errno == errno.EIO and "rank1" in str(ei.value)
    # latest after a restart finds the records
    m.remount()
    assert tierfs.latest(top, "ssd") == j(top, "s3")
    assert tierfs.set_state(j(top, "s1"))["ssd"] == "incomplete"


def test_commit_refused_while_a_file_is_open_for_writing(mount):
    m = mount()
    d = j(m.mnt, "s")
    make_set(d, commit=False)
    fd = os.open(j(d, "rank1"), os.O_WRONLY)
    try:
        with pytest.raises(OSError) as ei:
            tierfs.commit(d)
        assert ei.value.errno == errno.EBUSY
        r = ctl("commit", d)
        assert r.returncode == 1 and "open for writing" in r.stderr, r.stderr
        assert tierfs.set_state(d) is None          # nothing recorded
    finally:
        os.close(fd)
    assert "refused (EBUSY): rank1 is open for writing" in m.log()
    tierfs.commit(d)
    assert tierfs.wait_set(d, "cache", timeout=30)["cache"] == "complete"
    with pytest.raises(OSError) as ei:
        tierfs.commit(m.mnt)                        # the root is no set
    assert ei.value.errno == errno.EINVAL
    os.mkdir(j(m.mnt, "empty"))
    with pytest.raises(OSError) as ei:
        tierfs.commit(j(m.mnt, "empty"))
    assert ei.value.errno == errno.EINVAL


def test_commit_right_after_the_last_close_waits_for_its_release(mount, monkeypatch):
    """close(2) returns before the kernel's release of the file reaches the
    daemon: a commit right after the last close waits for the release
    instead of refusing the set (TIERFS_DELAY holds each writer's release
    200 ms); a file really open for writing is still refused."""
    monkeypatch.setenv("TIERFS_DELAY", "release=200")
    m = mount()
    monkeypatch.delenv("TIERFS_DELAY")
    d = j(m.mnt, "s")
    want = make_set(d, commit=False)
    tierfs.commit(d)                    # the last release is still held
    assert tierfs.wait_set(d, "ssd", timeout=60)["files"] == len(want)
    for name, data in want.items():
        util.assert_same(util.read_file(j(m.backing, "s", name)), data)
    fd = os.open(j(d, "rank1"), os.O_WRONLY)
    try:
        with pytest.raises(OSError) as ei:
            tierfs.commit(d)
        assert ei.value.errno == errno.EBUSY
    finally:
        os.close(fd)


def test_sets_committed_by_several_writers_at_once(mount):
    """Eight writers: each writes its rank of a shared set and its own set,
    commits its own; the shared one is committed once all ranks are in.
    Every set reaches ssd with its files as written."""
    m = mount()
    top = j(m.mnt, "run")
    os.mkdir(top)
    os.mkdir(j(top, "shared"))
    n = 8
    errors, written = [], {}
    barrier = threading.Barrier(n)

    def writer(k):
        try:
            rng = random.Random(SEED * 100 + k)
            data = randbytes(200 * 1024 + k, rng)
            write_file(j(top, "shared", f"rank{k}"), data)
            written[k] = make_set(j(top, f"own{k}"), nfiles=2, rng=rng)
            barrier.wait(timeout=60)
            if k == 0:
                tierfs.commit(j(top, "shared"))
        except Exception as e:              # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=writer, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    st = tierfs.wait_set(j(top, "shared"), "ssd", timeout=120)
    assert st["files"] == n
    for k in range(n):
        assert tierfs.wait_set(j(top, f"own{k}"), "ssd", timeout=120)["files"] == 2
        for name, data in written[k].items():
            util.assert_same(util.read_file(j(m.backing, "run", f"own{k}", name)), data)
    assert len(tierfs.sets(top)) == n + 1


def test_a_file_that_fails_to_flush_is_named_never_complete(mount, small_tmpfs):
    m = mount(backing=small_tmpfs, host_cache="64M", expect_errors=True)
    top = j(m.mnt, "ck")
    os.mkdir(top)
    make_set(j(top, "good"), nfiles=2, size=256 * 1024)
    tierfs.wait_set(j(top, "good"), "ssd", timeout=60)
    d = j(top, "full")
    os.mkdir(d)
    write_file(j(d, "small"), b"x" * 1000)
    big = randbytes(10 * MiB, random.Random(SEED))
    fd = os.open(j(d, "big"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, big)
    finally:
        try:
            os.close(fd)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    # the commit writes its record into the full tmpfs too: once the flush
    # of big has failed (and given back what it had written), not while it
    # fills the disk
    util.wait_until(lambda: tierfs.state(j(d, "big")).get("ssd") == "FLUSH_FAILED",
                    lambda: f"big's flush to fail: {tierfs.state(j(d, 'big'))}")
    tierfs.commit(d)
    with pytest.raises(TimeoutError) as ei:
        tierfs.wait_set(d, "ssd", timeout=3)
    assert "big (flush-failed ENOSPC)" in str(ei.value), str(ei.value)
    st = tierfs.set_state(d)
    assert st["cache"] == "complete" and st["ssd"] == "incomplete", st
    assert ("big", "flush-failed ENOSPC") in st["files_not_done"], st
    r = ctl("wait", "--level", "ssd", "--timeout", "1", d)
    assert r.returncode == 3 and "big (flush-failed ENOSPC)" in r.stderr, r
    r = ctl("sets", top)
    assert "full/big: flush-failed ENOSPC" in r.stdout, r.stdout
    assert tierfs.latest(top, "ssd") == j(top, "good")
    assert tierfs.latest(top, "cache") == d
    os.unlink(j(d, "big"))                  # the data goes: so does the set's file
    st = tierfs.set_state(d)
    assert ("big", "missing") in st["files_not_done"] and st["ssd"] == "incomplete", st
    with pytest.raises(OSError) as ei:
        tierfs.wait_set(d, "ssd", timeout=30)
    assert ei.value.errno == errno.EIO


def test_kill_between_commit_and_durability(mount, monkeypatch):
    """SIGKILL after the commit returned, before the flush wrote anything:
    after the restart the set is reported incomplete, naming its files,
    never complete (the cache's data died with the daemon)."""
    monkeypatch.setenv("TIERFS_DELAY", "flush_write=3000")
    m = mount(expect_errors=True)
    top = j(m.mnt, "ck")
    d = j(top, "s")
    os.mkdir(top)
    make_set(d, nfiles=3, size=300 * 1024)
    assert tierfs.set_state(d)["ssd"] == "pending"
    m.kill(signal.SIGKILL)
    monkeypatch.delenv("TIERFS_DELAY")
    m.start()
    st = tierfs.set_state(d)
    assert st is not None, "the commit is durable"
    assert st["ssd"] == "incomplete" and st["cache"] == "incomplete", st
    assert st["level"] is None
    assert sorted(n for n, _ in st["files_not_done"]) == ["rank0", "rank1", "rank2"], st
    assert tierfs.latest(top, "ssd") is None and tierfs.latest(top, "cache") is None
    r = ctl("wait", "--level", "ssd", d)
    assert r.returncode == 1 and "rank0" in r.stderr, r


def test_retention_keeps_newest_and_sets_being_restored(mount):
    m = mount(keep_sets=5)
    top = j(m.mnt, "ck")
    os.mkdir(top)
    assert tierfs.keep(top) == 5                    # the mount's default
    assert tierfs.keep(top, 2) == 2
    rng = random.Random(SEED)
    for i in range(2):
        make_set(j(top, f"s{i}"), rng=rng, size=512 * 1024)
        tierfs.wait_set(j(top, f"s{i}"), "ssd", timeout=60)
    # a restore of s0 runs (open for reading), s1's files are queued for one
    reader = os.open(j(top, "s0", "rank0"), os.O_RDONLY)
    tierfs.restore_order(j(top, "s1"), ["rank2"])
    try:
        for i in range(2, 6):
            make_set(j(top, f"s{i}"), rng=rng, size=512 * 1024)
            tierfs.wait_set(j(top, f"s{i}"), "ssd", timeout=60)
        names = util.wait_until(
            lambda: (lambda s: s if "s3" not in s else None)(sorted(os.listdir(top))),
            "retention of s2, s3", timeout=60)
        assert names == ["s0", "s1", "s4", "s5"], names
        assert len(os.read(reader, 1 << 20)) > 0    # the restore goes on
        assert not os.path.exists(j(m.backing, "ck", "s2"))
    finally:
        os.close(reader)
        tierfs.clear(j(top, "s1"))
    make_set(j(top, "s6"), rng=rng, size=512 * 1024)
    tierfs.wait_set(j(top, "s6"), "ssd", timeout=60)

    def kept():
        tierfs.keep(top, 2)         # applies it again: the reader's release is
        s = sorted(os.listdir(top))  # the kernel's, after close returned
        return s if "s0" not in s and "s1" not in s and "s4" not in s else None

    names = util.wait_until(kept, "retention of s0, s1, s4", timeout=60)
    assert names == ["s5", "s6"], names
    assert tierfs.latest(top, "ssd") == j(top, "s6")
    assert "keep: removed ck/s2 from the SSD" in m.log()


def test_retention_never_drops_the_newest_set_in_dir(mount, tmp_path):
    """With -o persist: a set goes from the SSD only once it is in DIR, and
    DIR keeps it; the newest set complete at pfs stays on the SSD."""
    m, pdir, top = persisted_parent(mount, tmp_path, keep_sets=1)
    rng = random.Random(SEED)
    for i in range(3):
        make_set(j(top, f"s{i}"), rng=rng)
        st = tierfs.wait_set(j(top, f"s{i}"), "pfs", timeout=60)
        assert st["ssd"] == "complete" and st["level"] == "pfs", st
    r = ctl("latest", top, "--level", "pfs")
    assert r.returncode == 0 and r.stdout.strip() == j(top, "s2"), r
    # (a listing through the mount shows DIR's s0 and s1, and a look-up
    # makes their directories again, empty: their files stay in DIR)
    util.wait_until(lambda: not os.path.exists(j(m.backing, "ck", "s0", "rank0")) and
                    not os.path.exists(j(m.backing, "ck", "s1", "rank0")), "retention",
                    timeout=60)
    assert os.path.exists(j(m.backing, "ck", "s2", "rank0"))
    for i in range(3):                              # DIR keeps them all
        assert sorted(os.listdir(pdir / "ck" / f"s{i}")) == [".tierfs.set", "rank0", "rank1",
                                                             "rank2"]


def test_set_in_dir_found_after_restart_on_a_fresh_backing_directory(mount, tmp_path):
    """The commit record reaches DIR after the set's files: a daemon started
    over an empty backing directory (another node, the SSD lost) finds the
    sets that are in DIR, complete at pfs and not at ssd or cache until
    their files are fetched; they read back equal."""
    a, pdir, top = persisted_parent(mount, tmp_path)
    rng = random.Random(SEED)
    want = {}
    for i in range(2):
        want[i] = make_set(j(top, f"s{i}"), rng=rng)
        tierfs.wait_set(j(top, f"s{i}"), "pfs", timeout=60)
        assert (pdir / "ck" / f"s{i}" / ".tierfs.set").exists()
    a.umount()
    b = mount(persist=str(pdir))            # a fresh backing directory
    assert not os.path.exists(j(b.backing, "ck"))
    top = j(b.mnt, "ck")
    assert tierfs.latest(top, "pfs") == j(top, "s1")
    assert tierfs.latest(top, "ssd") is None and tierfs.latest(top, "cache") is None
    st = tierfs.set_state(j(top, "s1"))
    assert st["pfs"] == "complete" and st["ssd"] == "pending" and st["cache"] == "pending", st
    assert st["files"] == 3 and st["level"] == "pfs", st
    r = ctl("latest", top, "--level", "pfs")
    assert r.returncode == 0 and r.stdout.strip() == j(top, "s1"), r
    r = ctl("sets", top)
    assert r.returncode == 0 and "s0" in r.stdout and "s1" in r.stdout, r
    for name, data in want[1].items():              # fetched from DIR
        with open(j(top, "s1", name), "rb") as f:
            assert f.read() == data, name
    st = tierfs.wait_set(j(top, "s1"), "ssd", timeout=60)
    assert st["cache"] == "complete" and st["pfs"] == "complete", st
    assert tierfs.latest(top, "ssd") == j(top, "s1")
    assert os.path.exists(j(b.backing, "ck", "s1", ".tierfs.set"))
    st = tierfs.set_state(j(top, "s0"))             # still in DIR only
    assert st["pfs"] == "complete" and st["ssd"] == "pending", st
    # a set removed through the mount goes from DIR, its record with it
    import shutil
    shutil.rmtree(j(top, "s0"))
    util.wait_until(lambda: not (pdir / "ck" / "s0").exists(), "s0's removal from DIR",
                    timeout=60)


def test_set_whose_dir_copy_lacks_a_file_is_not_complete_at_pfs(mount, tmp_path):
    """DIR's record is checked against DIR's files when it is read: a file
    missing there, or of another size, keeps the set from pfs."""
    a, pdir, top = persisted_parent(mount, tmp_path)
    rng = random.Random(SEED)
    for i in range(3):
        make_set(j(top, f"s{i}"), rng=rng)
        tierfs.wait_set(j(top, f"s{i}"), "pfs", timeout=60)
    a.umount()
    os.unlink(pdir / "ck" / "s2" / "rank1")
    with open(pdir / "ck" / "s1" / "rank0", "r+b") as f:
        f.truncate(100)
    b = mount(persist=str(pdir))
    top = j(b.mnt, "ck")
    for s, name in (("s2", "rank1"), ("s1", "rank0")):
        st = tierfs.set_state(j(top, s))
        assert st is not None and st["pfs"] == "incomplete", (s, st)
        assert (name, "missing-in-pfs") in st["files_not_done"], (s, st)
    assert tierfs.latest(top, "pfs") == j(top, "s0")
    r = ctl("wait", "--level", "pfs", j(top, "s2"))
    assert r.returncode == 1 and "rank1" in r.stderr, r


def test_persist_keep_counts_sets(mount, tmp_path):
    """-o persist_keep=2 where sets are: DIR keeps the two newest sets
    complete at pfs (whole directories, records included); the mount keeps
    them all on the SSD."""
    m, pdir, top = persisted_parent(mount, tmp_path, persist_keep=2)
    rng = random.Random(SEED)
    for i in range(4):
        make_set(j(top, f"s{i}"), rng=rng)
        tierfs.wait_set(j(top, f"s{i}"), "pfs", timeout=60)
    util.wait_until(lambda: sorted(os.listdir(pdir / "ck")) == ["s2", "s3"],
                    "persist_keep of sets", timeout=60)
    for s in ("s2", "s3"):
        # the set's record may still be rewritten (its temporary name beside
        # it for a moment, then renamed over it): wait for the listing
        util.wait_until(lambda: sorted(os.listdir(pdir / "ck" / s)) ==
                        [".tierfs.set", "rank0", "rank1", "rank2"],
                        lambda: f"{s} in DIR: {sorted(os.listdir(pdir / 'ck' / s))}")
    assert sorted(os.listdir(top)) == ["s0", "s1", "s2", "s3"]
    assert tierfs.latest(top, "pfs") == j(top, "s3")
    st = json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["persist"]
    assert st["pruned"] == 2, st


def test_wait_set_sees_a_flush_that_ends_while_a_file_is_looked_at(mount, monkeypatch):
    """A file's flush may commit while the set's state looks at it: its
    backing file and its cached state must be read in an order that cannot
    pair the old version with a file already clean (that read "changed", a
    bad level, and wait_set failed).  TIERFS_DELAY holds each look 1 s
    between its two reads; the file is flushed half a second after its
    close, inside the first look."""
    monkeypatch.setenv("TIERFS_DELAY", "set_eval=1000")
    m = mount(flush_age=500)
    monkeypatch.delenv("TIERFS_DELAY")
    d = j(m.mnt, "s")
    want = make_set(d, nfiles=1)
    got = tierfs.wait_set(d, "ssd", timeout=60)
    assert got["files"] == len(want), got
    for name, data in want.items():
        util.assert_same(util.read_file(j(m.backing, "s", name)), data)
