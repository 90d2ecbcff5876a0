"""The persistent tier against its users: -o allow_other,persist=DIR with a
directory of DIR per user (the layout of a shared Lustre, GPFS or NFS tier),
each user able to change their own part of DIR behind the daemon's back.

The daemon runs as root.  Whatever a user plants in DIR (a symbolic link
where a directory was, before a copy or during it), nothing outside DIR is
created, read, renamed or removed; the failure is counted, logged and shown
in user.tierfs.state.  Owners, modes, times and user xattrs are kept in DIR
and given back by a restart on a fresh backing directory.  A path longer
than PATH_MAX is persisted or reported as failed, never skipped silently.
persist=sync of a file already in DIR copies nothing.
"""

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys

import pytest

import util
from util import MiB, assert_same, randbytes, read_file, write_file

PX = "user.tierfs.persist"
FAIL_LOG = [r"persist: .*(symbolic link|not a directory|Too many levels|"
            r"Not a directory|File name too long|longer than|could not be persisted|not a path beneath)"]


def j(*parts):
    return os.path.join(*parts)


def pstats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["persist"]


def state(path):
    return os.getxattr(path, "user.tierfs.state").decode()


def as_user(user, fn, *args, cwd):
    """fn(*args) as user (uid, gid), with cwd a directory it may not reach
    by path (opened here, as root)."""
    dfd = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ok, text = util.in_child(fn, *args, uid=user[0], gid=user[1], cwd_fd=dfd)
    finally:
        os.close(dfd)
    assert ok, text


def snapshot(top):
    """{relpath: (mode, uid, gid, bytes or link target)} of everything under top."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            p = j(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                data = read_file(p)
            elif stat.S_ISLNK(st.st_mode):
                data = os.readlink(p)
            else:
                data = None
            out[os.path.relpath(p, top)] = (st.st_mode, st.st_uid, st.st_gid, data)
    return out


@pytest.fixture(params=["openat2", "walk"])
def resolve(request, monkeypatch):
    """Both ways of resolving a path beneath DIR: openat2 where the kernel
    has it, and the walk from directory descriptors of older kernels."""
    if request.param == "walk":
        monkeypatch.setenv("TIERFS_FAULT", "no_openat2")
    return request.param


@pytest.fixture
def layout(tmp_path, test_users, resolve):
    """DIR with a directory per user, and a root-only directory outside DIR
    that the users must never reach through the daemon."""
    a, b = test_users
    top = tmp_path / "site"
    top.mkdir()
    os.chmod(top, 0o755)
    pdir = top / "pfs"
    pdir.mkdir()
    os.chmod(pdir, 0o755)
    for name, (uid, gid) in (("a", a), ("b", b)):
        d = pdir / name
        d.mkdir()
        os.chown(d, uid, gid)
        os.chmod(d, 0o755)
    secret = top / "secret"
    secret.mkdir()
    os.chmod(secret, 0o700)
    for n in ("victim", "other1", "other2", "s"):
        (secret / n).write_bytes(b"root's own " + n.encode())
        os.chmod(secret / n, 0o600)
    return {"dir": str(pdir), "secret": str(secret), "a": a, "b": b}


def mount_shared(mount, lay, **options):
    opts = dict(persist=lay["dir"], persist_all=True, allow_other=True,
                default_permissions=True)
    opts.update(options)
    m = mount(expect_errors=FAIL_LOG, **opts)
    os.chmod(m.mnt, 0o755)
    for name in ("a", "b"):
        uid, gid = lay[name]
        p = j(m.mnt, name)
        if not os.path.isdir(p):
            os.mkdir(p)
        os.chown(p, uid, gid)
    return m


def _b_plants_link(dirpath, name, target):
    """As user b, in DIR/b: replace name (if any) by a symlink to target."""
    if os.path.isdir(name) and not os.path.islink(name):
        shutil.rmtree(name)
    elif os.path.lexists(name):
        os.unlink(name)
    os.symlink(target, name)


def _b_write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _b_sync_fails(path):
    try:
        os.setxattr(path, PX, b"sync")
    except OSError as e:
        assert e.errno in (errno.ELOOP, errno.ENOTDIR), e
    else:
        raise AssertionError(f"persist=sync of {path} through a symlink succeeded")


def test_symlinked_directory_is_not_followed(mount, layout):
    """b makes DIR/b/evil a link to a root-only directory and works in
    MOUNT/b/evil: nothing is created, removed or pruned there."""
    util.require_daemon()
    before = snapshot(layout["secret"])
    m = mount_shared(mount, layout, persist_keep=1)
    b = layout["b"]
    mb = j(m.mnt, "b")
    db = j(layout["dir"], "b")
    # a file persisted first, so that DIR/b/evil exists as b's directory
    as_user(b, os.mkdir, "evil", cwd=mb)
    as_user(b, _b_write, "evil/victim", b"b's victim", cwd=mb)
    as_user(b, os.setxattr, "evil/victim", PX, b"sync", cwd=mb)
    assert read_file(j(db, "evil", "victim")) == b"b's victim"
    errors0 = pstats(m)["errors"]
    as_user(b, _b_plants_link, db, "evil", layout["secret"], cwd=db)
    # a new file there: its copy must not land in the root-only directory
    as_user(b, _b_write, "evil/pwned", b"x" * 4096, cwd=mb)
    as_user(b, _b_sync_fails, "evil/pwned", cwd=mb)
    assert "pfs:FAILED" in state(j(mb, "evil", "pwned"))
    # removing b's own file must not remove root's file of that name
    as_user(b, os.unlink, "evil/victim", cwd=mb)
    # persist_keep=1 must not prune the linked directory
    as_user(b, _b_write, "evil/newest", b"y", cwd=mb)
    as_user(b, _b_sync_fails, "evil/newest", cwd=mb)
    util.wait_flushed(m)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the backlog")
    st = pstats(m)
    assert st["errors"] > errors0 and st["failed"] >= 2, st
    out = subprocess.run([sys.executable, j(util.REPO_DIR, "tools", "tierfs-stat"), m.mnt],
                         capture_output=True, text=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("persist"))
    assert "given up" in line, line
    m.umount()
    assert snapshot(layout["secret"]) == before
    assert os.path.islink(j(db, "evil"))
    assert "evil/pwned" in m.log() or "evil/newest" in m.log(), m.log(tail=40)


def test_rename_through_a_symlinked_directory(mount, layout):
    util.require_daemon()
    before = snapshot(layout["secret"])
    m = mount_shared(mount, layout)
    b = layout["b"]
    mb, db = j(m.mnt, "b"), j(layout["dir"], "b")
    as_user(b, os.mkdir, "r1", cwd=mb)
    as_user(b, _b_write, "r1/victim", b"b's file", cwd=mb)
    as_user(b, os.setxattr, "r1/victim", PX, b"sync", cwd=mb)
    as_user(b, _b_plants_link, db, "r1", layout["secret"], cwd=db)
    # rename out of the linked directory, and into it
    as_user(b, os.rename, "r1/victim", "moved", cwd=mb)
    as_user(b, _b_write, "into", b"z", cwd=mb)
    as_user(b, os.setxattr, "into", PX, b"sync", cwd=mb)
    as_user(b, os.rename, "into", "r1/other1", cwd=mb)
    util.wait_flushed(m)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the backlog")
    m.umount()
    assert snapshot(layout["secret"]) == before
    assert not os.path.exists(j(db, "moved")) or read_file(j(db, "moved")) != b"root's own victim"


def test_fetch_through_a_symlinked_directory(mount, layout):
    """DIR/b/leak links to a root-only directory: a lookup of MOUNT/b/leak/s
    (leak a directory of the backing directory) must not bring root's file
    into the mount, nor must a restart's lookup of MOUNT/b/direct (a link
    to root's file)."""
    util.require_daemon()
    b = layout["b"]
    db = j(layout["dir"], "b")
    as_user(b, os.symlink, j(layout["secret"], "s"), "direct", cwd=db)
    m = mount_shared(mount, layout)
    mb = j(m.mnt, "b")
    as_user(b, os.mkdir, "leak", cwd=mb)
    as_user(b, os.symlink, layout["secret"], "leak", cwd=db)

    def b_reads():
        for p in ("leak/s", "leak/victim", "direct"):
            try:
                with open(p, "rb") as f:
                    data = f.read()
            except OSError as e:
                assert e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR), (p, e)
            else:
                raise AssertionError(f"b read {p}: {data[:40]!r}")
        assert os.listdir("leak") == [], os.listdir("leak")
    as_user(b, b_reads, cwd=mb)
    assert not os.path.lexists(j(m.backing, "b", "leak", "s"))
    assert not os.path.lexists(j(m.backing, "b", "direct"))
    st = pstats(m)
    assert st["files_fetched"] == 0 and st["refused"] >= 1, st
    m.umount()


def _b_swaps_during_copy(target):
    """Wait until the copy of slow/big has its temporary in DIR/b/slow, then
    move the directory away and put a symlink to the secret in its place."""
    util.wait_until(lambda: os.path.isdir("slow") and
                    any(n.startswith(".tierfs") for n in os.listdir("slow")),
                    "a copy in progress", 30, 0.005)
    os.rename("slow", "slow.moved")
    os.symlink(target, "slow")


def test_directory_swapped_for_a_symlink_during_a_copy(mount, layout):
    util.require_daemon()
    before = snapshot(layout["secret"])
    m = mount_shared(mount, layout, persist_bw="8M")
    b = layout["b"]
    mb, db = j(m.mnt, "b"), j(layout["dir"], "b")
    as_user(b, os.mkdir, "slow", cwd=mb)
    data = randbytes(16 * MiB)
    as_user(b, _b_write, "slow/big", data, cwd=mb)
    as_user(b, _b_swaps_during_copy, layout["secret"], cwd=db)
    util.wait_flushed(m)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the backlog")
    m.umount()
    assert snapshot(layout["secret"]) == before
    # the copy went where the directory went, as b's file
    got = j(db, "slow.moved", "big")
    assert_same(read_file(got), data, "the moved copy")
    assert os.stat(got).st_uid == b[0]


def test_owners_modes_times_and_xattrs_survive_a_restart(mount, layout):
    util.require_daemon()
    a, b = layout["a"], layout["b"]
    m = mount_shared(mount, layout)
    ma = j(m.mnt, "a")

    def a_writes():
        os.mkdir("private", 0o700)
        with open("private/ckpt", "wb") as f:
            f.write(b"a's checkpoint")
        os.chmod("private/ckpt", 0o600)
        os.setxattr("private/ckpt", "user.note", b"epoch 7")
        os.utime("private/ckpt", ns=(1_600_000_000_123_456_789, 1_600_000_000_987_654_321))
        os.setxattr("private/ckpt", PX, b"sync")
    as_user(a, a_writes, cwd=ma)
    da = j(layout["dir"], "a")
    st = os.stat(j(da, "private"))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (a[0], a[1], 0o700)
    st = os.stat(j(da, "private", "ckpt"))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (a[0], a[1], 0o600)
    assert st.st_mtime_ns == 1_600_000_000_987_654_321
    assert os.getxattr(j(da, "private", "ckpt"), "user.note") == b"epoch 7"
    m.kill(signal.SIGKILL)
    # another node: a fresh backing directory, the same DIR
    n = mount_shared(mount, layout)
    p = j(n.mnt, "a", "private", "ckpt")

    def a_reads():
        assert read_file("private/ckpt") == b"a's checkpoint"
        assert os.getxattr("private/ckpt", "user.note") == b"epoch 7"

    def b_cannot():
        for path in ("private/ckpt", "private"):
            try:
                os.listdir(path) if path == "private" else read_file(path)
            except PermissionError:
                continue
            raise AssertionError(f"b reached a's {path}")
    as_user(a, a_reads, cwd=j(n.mnt, "a"))
    as_user(b, b_cannot, cwd=j(n.mnt, "a"))
    st = os.stat(p)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (a[0], a[1], 0o600)
    assert st.st_mtime_ns == 1_600_000_000_987_654_321
    st = os.stat(j(n.mnt, "a", "private"))
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (a[0], 0o700)
    n.umount()


def test_path_longer_than_path_max_is_not_skipped_silently(mount, layout):
    util.require_daemon()
    m = mount_shared(mount, layout)
    deep = m.mnt
    fd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    depth = 22
    for i in range(depth):
        name = f"{i:02d}" + "d" * 198
        os.mkdir(name, dir_fd=fd)
        nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    deep = None
    wfd = os.open("ckpt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(wfd, b"deep data")
    os.close(wfd)
    util.wait_flushed(m)
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the backlog")
    st = pstats(m)
    copied = False
    # in DIR, or reported: state, statistics, log, the unmount's summary
    try:
        dfd = os.open(layout["dir"], os.O_RDONLY | os.O_DIRECTORY)
        for i in range(depth):
            nfd = os.open(f"{i:02d}" + "d" * 198, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
        rfd = os.open("ckpt", os.O_RDONLY, dir_fd=dfd)
        copied = os.read(rfd, 100) == b"deep data"
        os.close(rfd)
        os.close(dfd)
    except FileNotFoundError:
        pass
    if not copied:
        assert st["failed"] >= 1 and st["errors"] >= 1, st
        sfd = os.open("ckpt", os.O_RDONLY | os.O_PATH | os.O_NOFOLLOW, dir_fd=fd)
        assert "pfs:FAILED" in os.getxattr(f"/proc/self/fd/{sfd}", "user.tierfs.state").decode()
        os.close(sfd)
    os.close(fd)
    m.umount()
    if not copied:
        log = m.log()
        assert "longer than" in log, m.log(tail=30)
        assert "everything is in" not in log, m.log(tail=30)
        assert "could not be persisted" in log, m.log(tail=30)


def test_persist_sync_of_a_file_already_in_dir_copies_nothing(mount, layout):
    util.require_daemon()
    m = mount_shared(mount, layout)
    p = j(m.mnt, "a", "one")
    write_file(p, randbytes(4 * MiB))
    os.setxattr(p, PX, b"sync")
    ino = os.stat(j(layout["dir"], "a", "one")).st_ino
    st0 = pstats(m)
    os.setxattr(p, PX, b"sync")
    os.setxattr(p, PX, b"sync")
    st1 = pstats(m)
    assert os.stat(j(layout["dir"], "a", "one")).st_ino == ino
    assert st1["bytes_persisted"] == st0["bytes_persisted"], (st0, st1)
    assert st1["files_persisted"] == st0["files_persisted"], (st0, st1)
    # a new version is copied again
    write_file(p, b"new")
    os.setxattr(p, PX, b"sync")
    assert read_file(j(layout["dir"], "a", "one")) == b"new"
    m.umount()


@pytest.mark.parametrize("where", ["notes", "legacy"])
def test_dotdot_in_journal_paths_is_refused(mount, layout, where):
    """Records left in the backing directory whose paths climb out with
    '..' (or start at /), as notes of its journal or in the persist journal
    file of earlier releases: their operations touch nothing outside
    DIR."""
    util.require_daemon()
    before = snapshot(layout["secret"])
    secret = layout["secret"]
    m = mount_shared(mount, layout)
    m.umount()
    recs = [("U0", "a/../../secret/victim", ""),
            ("U0", secret + "/other1", ""),
            ("R0", "a/../../secret/other2", "a/stolen"),
            ("D0", "../secret", ""),
            ("T0", "../secret/.tierfs.persist.x", ""),
            ("C0", "../secret/s", "")]
    raw = [kf.encode() + b"\0" + p1.encode() + b"\0" + p2.encode() + b"\0"
           for kf, p1, p2 in recs]
    if where == "notes":
        util.journal_append(m.backing, [(util.JNL_NOTE, r) for r in raw])
        assert len(util.persist_notes(m.backing)) == len(recs)
    else:
        with open(j(m.backing, ".tierfs.persist.journal"), "wb") as f:
            f.write(b"".join(raw))
    m.start()
    util.wait_until(lambda: pstats(m)["backlog_files"] == 0, "the backlog")
    util.wait_flushed(m)
    m.umount()
    assert "resuming" in m.log()       # the records were read
    assert snapshot(layout["secret"]) == before
    assert not os.path.lexists(j(layout["dir"], "a", "stolen"))
