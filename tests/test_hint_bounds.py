"""Bounds on the restore queue (tierfs-hints(7), -o hint_max, -o hint_max_user).

Any user may append to user.tierfs.restore_order of a directory they may
write, so the daemon (root, -o allow_other) bounds the entries it holds: per
user (the uid of the request) and per mount.  A write past a bound fails with
EDQUOT and appends nothing; entries leave the count when they are consumed,
cleared, or their directory goes.

The option values here are small so that the bounds are reached in a few
writes.  Functional checks only: no timings.
"""

import errno
import json
import os
import subprocess

import pytest

import util
from util import KiB, expect_errno, randbytes, sha, write_file

pytestmark = pytest.mark.daemon

ORDER = "user.tierfs.restore_order"
STATS = "user.tierfs.stats"
NEXT = "user.tierfs.restore_next"
USER_A = 65534          # nobody
USER_B = 65533

j = os.path.join


def queue_len(m):
    return json.loads(os.getxattr(m.mnt, STATS))["prefetch"]["queue"]


def queued(path):
    return [n for n in os.getxattr(path, ORDER).split(b"\n") if n]


def names(prefix, n):
    return b"".join(b"%s%d\n" % (prefix.encode(), i) for i in range(n))


def as_user(m, uid, fn, *args):
    """fn(*args) as uid, in the mount's root (paths relative to it)."""
    dfd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ok, out = util.in_child(fn, *args, uid=uid, gid=uid, cwd_fd=dfd)
    finally:
        os.close(dfd)
    assert ok, out


def user_dir(m, name, uid):
    """A directory of the mount owned by uid."""
    os.chmod(m.mnt, 0o755)
    d = j(m.mnt, name)
    os.mkdir(d)
    os.chown(d, uid, uid)
    return d


def tierfs_stats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))


def rss_kib(m):
    with open(f"/proc/{m.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


# ------------------------------------------------------------ run as a user

def _append(d, value):
    os.setxattr(d, ORDER, value)


def _append_refused(d, value, code=errno.EDQUOT):
    expect_errno(code, os.setxattr, d, ORDER, value)


def _next_refused(path):
    expect_errno(errno.EDQUOT, os.setxattr, path, NEXT, b"1")


def _fill_then_refused(d, per_write, writes, refused):
    """writes appends of per_write names, then `refused` appends refused."""
    for w in range(writes):
        os.setxattr(d, ORDER, names(f"f{w}-", per_write))
    big = names("x" * 200, 250)                 # ~52 KiB per refused write
    for _ in range(refused):
        expect_errno(errno.EDQUOT, os.setxattr, d, ORDER, big)


def _write_read(d, n, size):
    rng = util.rng_for(35)
    files = {}
    for i in range(n):
        data = randbytes(size, rng)
        write_file(j(d, f"w{i}"), data)
        files[f"w{i}"] = sha(data)
    for name, want in files.items():
        with open(j(d, name), "rb") as f:
            assert sha(f.read()) == want, name


# ------------------------------------------------------------ the tests

def test_user_bound(mount):
    m = mount(allow_other=True, hint_max_user=100, hint_max=1000)
    da = user_dir(m, "a", USER_A)
    db = user_dir(m, "b", USER_B)
    as_user(m, USER_A, _append, "a", names("f", 60))
    # past the bound: refused whole, nothing appended
    as_user(m, USER_A, _append_refused, "a", names("g", 41))
    assert len(queued(da)) == 60 and queue_len(m) == 60
    # up to the bound exactly, then not one more (restore_next too)
    as_user(m, USER_A, _append, "a", names("g", 40))
    assert len(queued(da)) == 100
    as_user(m, USER_A, _append_refused, "a", b"h\n")
    write_file(j(da, "n"), b"x")
    os.chown(j(da, "n"), USER_A, USER_A)
    as_user(m, USER_A, _next_refused, "a/n")
    assert len(queued(da)) == 100 and queue_len(m) == 100
    # the other user has a bound of their own
    as_user(m, USER_B, _append, "b", names("f", 100))
    as_user(m, USER_B, _append_refused, "b", b"h\n")
    assert len(queued(db)) == 100 and queue_len(m) == 200


def test_mount_bound(mount):
    m = mount(allow_other=True, hint_max_user=100, hint_max=150)
    da = user_dir(m, "a", USER_A)
    db = user_dir(m, "b", USER_B)
    as_user(m, USER_A, _append, "a", names("f", 100))
    as_user(m, USER_B, _append_refused, "b", names("f", 51))
    as_user(m, USER_B, _append, "b", names("f", 50))
    assert queue_len(m) == 150
    as_user(m, USER_B, _append_refused, "b", b"h\n")
    # root too is held by the mount's bound
    expect_errno(errno.EDQUOT, os.setxattr, m.mnt, ORDER, b"r\n")
    assert queue_len(m) == 150 and len(queued(da)) == 100 and len(queued(db)) == 50
    assert os.getxattr(m.mnt, ORDER) == b""


def test_root_and_mount_owner_not_held_by_user_bound(mount):
    m = mount(allow_other=True, hint_max_user=10, hint_max=1000)
    os.setxattr(m.mnt, ORDER, names("r", 300))
    d = user_dir(m, "o", USER_A)
    as_user(m, USER_A, _append_refused, "o", names("f", 11))
    os.chown(m.mnt, USER_A, USER_A)             # now USER_A owns the mount
    as_user(m, USER_A, _append, "o", names("f", 500))
    assert len(queued(d)) == 500
    as_user(m, USER_A, _append_refused, "o", names("g", 201))
    assert queue_len(m) == 800


def test_budget_freed(mount):
    m = mount(allow_other=True, hint_max_user=10, hint_max=1000)
    da = user_dir(m, "a", USER_A)
    as_user(m, USER_A, _append, "a", names("f", 10))
    as_user(m, USER_A, _append_refused, "a", b"g\n")
    # consumed: the file f0 read to its end leaves the queue
    write_file(j(da, "f0"), b"data" * 1000)
    util.wait_flushed(m)
    with open(j(da, "f0"), "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert f.read() == b"data" * 1000
    assert b"f0" not in queued(da) and len(queued(da)) == 9
    as_user(m, USER_A, _append, "a", b"g\n")
    # cleared by the user
    as_user(m, USER_A, os.removexattr, "a", ORDER)
    assert queue_len(m) == 0
    as_user(m, USER_A, _append, "a", names("h", 10))
    # the directory goes
    sub = user_dir(m, "a/sub", USER_A)
    os.unlink(j(da, "f0"))
    as_user(m, USER_A, os.removexattr, "a", ORDER)
    as_user(m, USER_A, _append, "a/sub", names("h", 10))
    assert queue_len(m) == 10
    as_user(m, USER_A, os.rmdir, "a/sub")
    assert queue_len(m) == 0
    # a new directory (perhaps of the same inode number) starts empty
    sub = user_dir(m, "a/sub", USER_A)
    assert queued(sub) == []
    as_user(m, USER_A, _append, "a/sub", names("h", 10))


def test_rejected_appends_keep_memory_flat(mount, monkeypatch):
    """Many refused appends leave the daemon's memory as it was, and another
    user's writes and reads go on.  (Under AddressSanitizer, freed memory
    waits in its quarantine, 256 MiB by default, before it is reused: the
    quarantine is off for this daemon, so that its size is the daemon's.)"""
    asan = os.environ.get("ASAN_OPTIONS", "abort_on_error=0:detect_leaks=1")
    monkeypatch.setenv("ASAN_OPTIONS",
                       asan + ":quarantine_size_mb=0:thread_local_quarantine_size_kb=0")
    m = mount(allow_other=True, hint_max_user=2000, hint_max=3000, host_cache="64M")
    user_dir(m, "a", USER_A)
    user_dir(m, "b", USER_B)
    as_user(m, USER_A, _fill_then_refused, "a", 1000, 2, 20)
    # the host cache's pages are touched in the background: measure once
    # they all are (64 MiB of resident memory otherwise grows meanwhile)
    util.wait_until(lambda: tierfs_stats(m)["host_touched"]
                    >= tierfs_stats(m)["tiers"]["host"]["capacity"],
                    "the host cache faulted in", 60, 0.1)
    before = rss_kib(m)
    as_user(m, USER_A, _fill_then_refused, "a", 0, 0, 400)   # ~20 MiB refused
    grown = rss_kib(m) - before
    assert grown < 8 * 1024, f"daemon grew {grown} KiB over refused appends"
    assert queue_len(m) == 2000
    as_user(m, USER_B, _write_read, "b", 50, 100 * KiB)


def test_queue_of_one_user_other_users_io(mount):
    """A full queue of unbound names (the case that had every lookup walk
    the whole queue) and another user's creates, reads, unlinks."""
    m = mount(allow_other=True, hint_max_user=20000, hint_max=30000)
    user_dir(m, "a", USER_A)
    user_dir(m, "b", USER_B)
    as_user(m, USER_A, _fill_then_refused, "a", 5000, 4, 1)
    as_user(m, USER_B, _write_read, "b", 50, 100 * KiB)
    for i in range(50):
        os.unlink(j(m.mnt, "b", f"w{i}"))
    assert queue_len(m) == 20000
    # and the queue of the other directory binds and is consumed as before
    os.setxattr(j(m.mnt, "b"), ORDER, b"late\n")
    write_file(j(m.mnt, "b", "late"), b"z" * 4096)
    util.wait_flushed(m)
    with open(j(m.mnt, "b", "late"), "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert f.read() == b"z" * 4096
    assert queued(j(m.mnt, "b")) == []
    assert queue_len(m) == 20000


@pytest.mark.parametrize("opt", ["hint_max=0", "hint_max_user=0", "hint_max=-5"])
def test_bad_bound_refused(tmp_path, opt):
    b, mnt = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    mnt.mkdir()
    r = subprocess.run([util.tierfs_bin(), str(b), str(mnt), "-f", "-o", opt],
                       capture_output=True, text=True, timeout=60)
    if util.is_mounted(str(mnt)):
        util.lazy_umount(str(mnt))
        pytest.fail(f"mounted with {opt}")
    assert r.returncode != 0
    assert opt.split("=")[0] + " must be 1 or more" in r.stderr, r.stderr
