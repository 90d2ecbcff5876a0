"""Inode numbers (st_ino, d_ino) through a tierfs mount.

A file keeps one st_ino for as long as it exists: whatever the kernel
forgets (drop_caches), whatever name is used (hard links), across new
versions of its backing file (a rewrite and its flush) and across restarts
of the daemon.  No two live objects share one.  readdir's d_ino is stat's
st_ino.  The attribute that holds a file's number in the backing
directory never shows through the mount.
"""

import errno
import os
import random

import pytest

import util
from util import expect_errno, randbytes, write_file

INO_XATTR = "user.tierfs.ino"


def j(*parts):
    return os.path.join(*parts)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


def numbers(root):
    """{relpath: st_ino} of everything under root (root itself as "")."""
    out = {"": os.lstat(root).st_ino}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = j(d, n)
            out[os.path.relpath(p, root)] = os.lstat(p).st_ino
    return out


def dirent_numbers(root):
    """{relpath: d_ino} of everything under root, from readdir."""
    out = {}

    def walk(d):
        with os.scandir(d) as it:
            for e in it:
                out[os.path.relpath(e.path, root)] = e.inode()
                if e.is_dir(follow_symlinks=False):
                    walk(e.path)
    walk(root)
    return out


def make_tree(root):
    """Files, a directory, a symlink, a fifo, a file with three names."""
    os.makedirs(j(root, "d/e"))
    write_file(j(root, "f"), b"one")
    write_file(j(root, "d/g"), randbytes(70000, random.Random(1)))
    write_file(j(root, "d/e/h"), b"")
    os.symlink("f", j(root, "s"))
    os.mkfifo(j(root, "d/fifo"))
    write_file(j(root, "l1"), b"linked")
    os.link(j(root, "l1"), j(root, "d/l2"))
    os.link(j(root, "l1"), j(root, "d/e/l3"))


def assert_unique(nums, what, linked=({"l1", "d/l2", "d/e/l3"},)):
    """No two objects (other than names of one hard-linked file, a set in
    `linked`) share a number."""
    seen = {}
    for rel, ino in nums.items():
        seen.setdefault(ino, set()).add(rel)
    for ino, rels in seen.items():
        if len(rels) > 1:
            assert rels in linked, f"{what}: {sorted(rels)} share st_ino {ino:#x}"


def test_stable_across_forgets(tfs):
    util.require_daemon()
    make_tree(tfs.mnt)
    before = numbers(tfs.mnt)
    assert before["l1"] == before["d/l2"] == before["d/e/l3"]
    assert_unique(before, "fresh tree")
    for _ in range(3):
        drop_caches()
        assert numbers(tfs.mnt) == before
    assert dirent_numbers(tfs.mnt) == {k: v for k, v in before.items() if k}
    drop_caches()
    assert dirent_numbers(tfs.mnt) == {k: v for k, v in before.items() if k}


def test_stable_across_versions(tfs):
    util.require_daemon()
    make_tree(tfs.mnt)
    util.wait_flushed(tfs)
    before = numbers(tfs.mnt)
    seen = {os.stat(j(tfs.backing, "d/g")).st_ino}
    rng = random.Random(2)
    for i in range(4):
        for rel in ("f", "d/g", "d/e/h", "l1"):
            write_file(j(tfs.mnt, rel), randbytes(rng.randrange(1, 200000), rng))
        util.wait_flushed(tfs)
        seen.add(os.stat(j(tfs.backing, "d/g")).st_ino)
        drop_caches()
        assert numbers(tfs.mnt) == before, f"after rewrite {i}"
        assert dirent_numbers(tfs.mnt) == {k: v for k, v in before.items() if k}
    # the rewrites did make new backing files (otherwise this proves nothing);
    # the backing file system may hand a freed number out again, so the last
    # version's number can be the first one's
    assert len(seen) > 1, seen


def test_stable_across_restarts(tfs):
    util.require_daemon()
    make_tree(tfs.mnt)
    before = numbers(tfs.mnt)
    tfs.remount()
    assert numbers(tfs.mnt) == before
    rng = random.Random(3)
    write_file(j(tfs.mnt, "d/g"), randbytes(100000, rng))
    tfs.remount()
    assert numbers(tfs.mnt) == before
    assert dirent_numbers(tfs.mnt) == {k: v for k, v in before.items() if k}


def test_files_made_outside(mount, tmp_path):
    """Files the backing directory had before the mount keep their number
    through their first new versions, and their names' links."""
    util.require_daemon()
    backing = tmp_path / "pre"
    backing.mkdir()
    os.makedirs(backing / "d")
    for n in ("a", "b", "d/c"):
        (backing / n).write_bytes(b"old " + n.encode())
    os.link(backing / "b", backing / "d/b2")
    m = mount(backing=str(backing))
    before = numbers(m.mnt)
    assert before["b"] == before["d/b2"]
    assert_unique(before, "made outside", linked=({"b", "d/b2"},))
    assert dirent_numbers(m.mnt) == {k: v for k, v in before.items() if k}
    rng = random.Random(4)
    for i in range(3):
        for rel in ("a", "b", "d/c"):
            write_file(j(m.mnt, rel), randbytes(rng.randrange(1, 100000), rng))
        util.wait_flushed(m)
        drop_caches()
        assert numbers(m.mnt) == before, f"after rewrite {i}"
        assert dirent_numbers(m.mnt) == {k: v for k, v in before.items() if k}
        m.remount()
        assert numbers(m.mnt) == before, f"after rewrite {i} and a restart"


def test_links_and_renames_while_forgetting(tfs):
    """A second process links and renames while the kernel forgets: every
    name of a file shows its one number."""
    util.require_daemon()
    root = tfs.mnt
    os.mkdir(j(root, "a"))
    os.mkdir(j(root, "b"))
    files = [f"f{i}" for i in range(20)]
    for n in files:
        write_file(j(root, "a", n), n.encode())
    want = {n: os.stat(j(root, "a", n)).st_ino for n in files}
    assert len(set(want.values())) == len(files)

    def churn():
        for r in range(30):
            for n in files:
                src = j(root, "a" if r % 2 == 0 else "b", n)
                dst = j(root, "b" if r % 2 == 0 else "a", n)
                os.link(src, dst + ".l")
                os.rename(src, dst)
                if os.stat(dst).st_ino != want[n] or os.stat(dst + ".l").st_ino != want[n]:
                    raise AssertionError(f"{n}: number changed in round {r}")
                os.unlink(dst + ".l")

    def forget():
        for _ in range(40):
            drop_caches()
            for d in ("a", "b"):
                for n in os.listdir(j(root, d)):
                    if n in want:
                        try:
                            ino = os.stat(j(root, d, n)).st_ino
                        except FileNotFoundError:
                            continue        # moved meanwhile
                        if ino != want[n]:
                            raise AssertionError(f"{d}/{n}: {ino:#x}, not {want[n]:#x}")

    res = util.in_children([(churn, ()), (forget, ())])
    for ok, text in res:
        assert ok, text
    got = {n: os.stat(j(root, "a", n)).st_ino for n in files}
    assert got == want


def test_no_collisions_after_churn(tfs):
    """Many files made, rewritten, flushed and removed, directories among
    them: no two live objects ever share a number, before or after a
    restart, and numbers stay as they were."""
    util.require_daemon()
    root = tfs.mnt
    rng = random.Random(5)
    live = {}
    for rnd in range(6):
        for i in range(40):
            rel = f"f{rnd}_{i}"
            write_file(j(root, rel), randbytes(rng.randrange(0, 9000), rng))
            live[rel] = None
        for i in range(5):
            os.mkdir(j(root, f"d{rnd}_{i}"))
            os.symlink("x", j(root, f"s{rnd}_{i}"))
        util.wait_flushed(tfs)
        for rel in rng.sample(sorted(live), 30):
            write_file(j(root, rel), randbytes(rng.randrange(1, 9000), rng))
        util.wait_flushed(tfs)
        for rel in rng.sample(sorted(live), 25):
            os.unlink(j(root, rel))
            del live[rel]
        nums = numbers(root)
        assert_unique(nums, f"round {rnd}")
        for rel in live:
            if live[rel] is None:
                live[rel] = nums[rel]
            assert nums[rel] == live[rel], f"{rel} in round {rnd}"
    drop_caches()
    before = numbers(root)
    tfs.remount()
    assert numbers(root) == before
    assert_unique(before, "after the churn")


def test_number_xattr_hidden(tfs):
    util.require_daemon()
    p = j(tfs.mnt, "f")
    write_file(p, b"x")
    util.wait_flushed(tfs)
    ino = os.stat(p).st_ino
    assert INO_XATTR not in os.listxattr(p)
    expect_errno(errno.ENODATA, os.getxattr, p, INO_XATTR)
    with pytest.raises(OSError):
        os.setxattr(p, INO_XATTR, b"12345")
    with pytest.raises(OSError):
        os.removexattr(p, INO_XATTR)
    drop_caches()
    assert os.stat(p).st_ino == ino
    tfs.remount()
    assert os.stat(p).st_ino == ino
