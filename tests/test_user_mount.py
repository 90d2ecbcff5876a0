"""An unprivileged user mounts tierfs (through fusermount3) and unmounts it
(tierfs(8), MOUNTING AS A USER): what works, and what the errors say when
the user may not mount.

The users are the suite's test users (conftest.fuse_users): a may open
/dev/fuse, b may not.  Their daemons run in the background, as a user
would run them, with a log file in the user's directory.
"""

import contextlib
import fcntl
import os
import re
import time

import pytest

import util

pytestmark = pytest.mark.daemon

TOOL = os.path.join(util.REPO_DIR, "tools", "tierfsctl")
OPTS = "gpu=none,host_cache=16M"


def user_mount(user, *extra, backing="b", mnt="m", log="tierfs.log"):
    """Run `tierfs BACKING MNT -o ...` as `user` (in the background, as a
    user would); returns the CompletedProcess of the starting command."""
    b, m = user.mkdir(backing, mode=0o700), user.mkdir(mnt)
    opts = ",".join([OPTS, f"logfile={os.path.join(user.home, log)}"] + list(extra))
    return user.run([util.tierfs_bin(), b, m, "-o", opts])


def user_umount(user, mnt, seconds=10):
    """fusermount3 -u as `user`, again while the mount is busy for a moment
    (a request still in flight); returns the last CompletedProcess."""
    deadline = time.monotonic() + seconds
    while True:
        u = user.run(["fusermount3", "-u", mnt])
        if u.returncode == 0 or "busy" not in u.stderr or time.monotonic() > deadline:
            return u
        time.sleep(0.1)


def user_log(user, log="tierfs.log"):
    try:
        with open(os.path.join(user.home, log)) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def one_line(r):
    """The starting command's stderr: exit 1 and one line of it."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1, (r.returncode, r.stderr)
    return lines[0]


def test_user_mounts_writes_and_unmounts(fuse_users):
    """As a user: mount, write, unmount with fusermount3 -u, wait for the
    daemon with tierfsctl wait (as the user); the lock file is in the
    backing directory, the files are the user's, and the log says nothing
    worse than a notice."""
    a, _ = fuse_users
    r = user_mount(a)
    assert r.returncode == 0, r.stderr + user_log(a)
    mnt = os.path.join(a.home, "m")
    try:
        assert util.is_mounted(mnt)
        lock = os.path.join(a.home, "b", ".tierfs.lock")
        assert os.stat(lock).st_uid == a.uid
        w = a.run(["sh", "-c", f"head -c 300000 /dev/urandom > {mnt}/ckpt && "
                   f"mkdir {mnt}/d && echo small > {mnt}/d/f && cmp {mnt}/ckpt {mnt}/ckpt"])
        assert w.returncode == 0, w.stderr
        u = user_umount(a, mnt)
        assert u.returncode == 0, u.stderr
        w = a.run([TOOL, "wait", mnt, "--timeout", "60"],
                  env={"PYTHONPATH": os.path.join(util.REPO_DIR, "python")})
        assert w.returncode == 0, w.stderr
    finally:
        util.lazy_umount(mnt)
    for p in ("ckpt", "d", "d/f"):
        st = os.lstat(os.path.join(a.home, "b", p))
        assert (st.st_uid, st.st_gid) == (a.uid, a.gid), p
    assert os.path.getsize(os.path.join(a.home, "b", "ckpt")) == 300000
    assert not os.path.exists(lock)
    log = user_log(a)
    assert "exited cleanly" in log, log
    bad = [ln for ln in log.splitlines() if re.search(r"WARNING|ERROR", ln)]
    assert not bad, log


def test_no_access_to_dev_fuse(fuse_users):
    """A user who may not open /dev/fuse is told so, and what it takes."""
    _, b = fuse_users
    line = one_line(user_mount(b))
    assert "/dev/fuse" in line and "read and write" in line, line
    assert "MOUNTING AS A USER" in line, line
    assert not util.is_mounted(os.path.join(b.home, "m"))
    assert not os.path.exists(os.path.join(b.home, "b", ".tierfs.lock"))


def test_mount_point_the_user_may_not_write(fuse_users):
    a, _ = fuse_users
    m = a.mkdir("m")
    os.chown(m, 0, 0)                   # root's, 0755
    line = one_line(user_mount(a))
    assert m in line and "owner root" in line and "0755" in line, line
    assert not util.is_mounted(m)


def test_sticky_mount_point_of_another_user(fuse_users):
    """fusermount3 wants a sticky mount point (a shared /tmp-like
    directory) to be the user's own, even where the user may write it."""
    a, _ = fuse_users
    m = a.mkdir("m")
    os.chown(m, 0, 0)
    os.chmod(m, 0o1777)
    line = one_line(user_mount(a))
    assert m in line and "sticky" in line and "owner root" in line, line


def fuse_conf_allows_other():
    try:
        with open("/etc/fuse.conf") as f:
            return any(ln.strip() == "user_allow_other" for ln in f)
    except OSError:
        return False


@pytest.mark.parametrize("opt", ["allow_other", "allow_root"])
def test_allow_other_without_user_allow_other(fuse_users, opt):
    a, _ = fuse_users
    with fuse_conf_lock():
        if fuse_conf_allows_other():
            pytest.skip("/etc/fuse.conf has user_allow_other here")
        line = one_line(user_mount(a, opt))
    assert opt in line and "user_allow_other" in line and "/etc/fuse.conf" in line, line
    assert not util.is_mounted(os.path.join(a.home, "m"))


@contextlib.contextmanager
def fuse_conf_lock():
    """Held while a test reads or changes /etc/fuse.conf (pytest-xdist runs
    tests side by side)."""
    with open("/run/lock/tierfs-test-fuse-conf.lock" if os.path.isdir("/run/lock")
              else "/tmp/tierfs-test-fuse-conf.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def user_allow_other():
    """/etc/fuse.conf with user_allow_other (read by fusermount3 when it
    mounts) while the block runs; put back after."""
    path = "/etc/fuse.conf"
    with fuse_conf_lock():
        try:
            with open(path) as f:
                old = f.read()
        except FileNotFoundError:
            old = None
        if old is None or not any(ln.strip() == "user_allow_other"
                                  for ln in old.splitlines()):
            with open(path, "a") as f:
                f.write("\nuser_allow_other\n")
        try:
            yield
        finally:
            if old is None:
                os.unlink(path)
            else:
                with open(path, "w") as f:
                    f.write(old)


def test_allow_other_files_of_other_users(fuse_users):
    """With user_allow_other, a user's mount with allow_other takes files
    from other users; a daemon that is not root cannot give them away, so
    they are the mount's user's (said once in the log, not per file)."""
    a, b = fuse_users
    a.mkdir("b", mode=0o755)            # b may look in
    with user_allow_other():
        r = user_mount(a, "allow_other")
    assert r.returncode == 0, r.stderr + user_log(a)
    mnt = os.path.join(a.home, "m")
    try:
        d = a.run(["mkdir", "-m", "1777", f"{mnt}/shared"])
        assert d.returncode == 0, d.stderr
        w = b.run(["sh", "-c", f"for i in 1 2 3; do echo $i > {mnt}/shared/f$i; done; "
                   f"cat {mnt}/shared/f2; stat -c %u {mnt}/shared/f1 {mnt}/shared/f3"])
        assert w.returncode == 0, w.stderr
        assert w.stdout.split() == ["2", str(a.uid), str(a.uid)], w.stdout
        u = user_umount(a, mnt)
        assert u.returncode == 0, u.stderr
        util.wait_until(lambda: "exited" in user_log(a), "the daemon's exit")
    finally:
        util.lazy_umount(mnt)
    log = user_log(a)
    assert "exited cleanly" in log, log
    assert not re.search(r"WARNING|ERROR", log), log
    assert len(re.findall(r"NOTICE: .*other users", log)) == 1, log


def test_second_user_daemon_same_backing_refused(fuse_users):
    """The backing directory's lock works for a user's daemons too."""
    a, _ = fuse_users
    r = user_mount(a)
    assert r.returncode == 0, r.stderr + user_log(a)
    try:
        line = one_line(user_mount(a, mnt="m2", log="second.log"))
        assert "in use by another tierfs daemon" in line, line
    finally:
        u = user_umount(a, os.path.join(a.home, "m"))
        util.wait_until(lambda: "exited" in user_log(a), lambda: (
            f"the daemon's exit (fusermount3 -u: rc {u.returncode} {u.stderr.strip()}; "
            f"log: {user_log(a)[-600:]})"))
        util.lazy_umount(os.path.join(a.home, "m"))
