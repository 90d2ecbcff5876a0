"""Integrity, miscellaneous (issue 13, items 10, 12, 13, 15, 16): symlink times,
one daemon per backing directory, errors reported to the right descriptor,
who may steer the mount's prefetching, reserved names, and the log file.

Each test failed before its fix.
"""

import errno
import json
import os
import re
import signal
import stat
import subprocess
import time

import pytest

import util
from util import MiB, expect_errno, randbytes, read_file, write_file

j = os.path.join

pytestmark = pytest.mark.daemon

NOBODY = 65534
PREFETCH = "user.tierfs.prefetch"
ORDER = "user.tierfs.restore_order"
LOCK = ".tierfs.lock"
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} ")


def stats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))


def daemon_cmd(backing, mnt, foreground=True, **options):
    opts = util.default_options()
    opts.update(options)
    cmd = [util.tierfs_bin(), backing, mnt]
    if foreground:
        cmd.append("-f")
    return cmd + ["-o", util.format_options(opts)]


def no_sanitizer_report(text):
    m = util.SANITIZER_LOG.search(text)
    assert not m, f"sanitizer report: {text[max(0, m.start() - 200):][:3000]}"


def run_refused(cmd, mnt, timeout=10):
    """Run a daemon that must refuse to start: (exit status, its output).
    One that mounts after all is unmounted again and fails the test."""
    before = util.is_mounted(mnt)
    proc = util.popen_with_default_signals(cmd, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # it mounted (stacked or elsewhere): take that mount away again
        if before:
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        else:
            util.lazy_umount(mnt)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"second daemon was not refused: {' '.join(cmd)}\n{out.decode()}")
    out = out.decode(errors="replace")
    no_sanitizer_report(out)
    return proc.returncode, out


def wait_gone(pid, timeout=util.EXIT_TIMEOUT):
    def gone():
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True
    util.wait_until(gone, f"daemon {pid} to exit", timeout)



# ------------------------------------------------------------ item 10

def test_utimensat_symlink_nofollow(tfs):
    target = j(tfs.mnt, "target")
    write_file(target, b"t")
    os.utime(target, ns=(5 * 10**9, 6 * 10**9))
    link = j(tfs.mnt, "link")
    os.symlink("target", link)
    dangling = j(tfs.mnt, "dangling")
    os.symlink("nowhere", dangling)
    for p in (link, dangling):
        os.utime(p, ns=(1_000_000_123, 2_000_000_456), follow_symlinks=False)
        st = os.lstat(p)
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_123, 2_000_000_456), p
    st = os.stat(target)                       # the target is untouched
    assert (st.st_atime_ns, st.st_mtime_ns) == (5 * 10**9, 6 * 10**9)
    # UTIME_NOW through the symlink itself
    before = time.time()
    os.utime(link, follow_symlinks=False)
    assert os.lstat(link).st_mtime >= before - 1
    assert os.stat(target).st_mtime_ns == 6 * 10**9
    tfs.umount()
    st = os.lstat(j(tfs.backing, "dangling"))
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_123, 2_000_000_456)


# ------------------------------------------------------------ item 12

def test_second_daemon_same_backing_refused(mount, tmp_path):
    m = mount()
    write_file(j(m.mnt, "f"), b"data")
    other = str(tmp_path / "other")
    os.mkdir(other)
    rc, out = run_refused(daemon_cmd(m.backing, other), other)
    assert rc != 0, out
    assert m.mnt in out and str(m.proc.pid) in out, out
    assert not util.is_mounted(other)
    # stacked on the first one's mount point
    rc, out = run_refused(daemon_cmd(m.backing, m.mnt), m.mnt)
    assert rc != 0, out
    assert m.mnt in out and str(m.proc.pid) in out, out
    assert read_file(j(m.mnt, "f")) == b"data"
    # the lock never shows through the mount
    assert LOCK not in os.listdir(m.mnt)
    assert not os.path.lexists(j(m.mnt, LOCK))
    m.umount()
    # released at unmount: the backing directory is a plain copy again
    assert sorted(os.listdir(m.backing)) == ["f"]
    m.start()
    assert read_file(j(m.mnt, "f")) == b"data"


def test_daemonized_second_daemon_refused(mount, tmp_path):
    """The lock survives the daemon's fork: the PID named is the daemon's."""
    backing = str(tmp_path / "bk")
    mnt = str(tmp_path / "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    logfile = str(tmp_path / "tierfs.log")
    r = subprocess.run(daemon_cmd(backing, mnt, foreground=False, logfile=logfile),
                       capture_output=True, text=True, timeout=30)
    try:
        assert r.returncode == 0, r.stderr
        pid = int(read_file(j(backing, LOCK)).split()[0])
        assert os.path.exists(f"/proc/{pid}"), pid
        other = str(tmp_path / "other")
        os.mkdir(other)
        rc, out = run_refused(daemon_cmd(backing, other), other)
        assert rc != 0 and str(pid) in out and mnt in out, out
    finally:
        util.lazy_umount(mnt)
    wait_gone(pid)
    no_sanitizer_report(read_file(logfile).decode())
    assert "exited cleanly" in read_file(logfile).decode()
    assert not os.path.exists(j(backing, LOCK))


def test_mount_point_inside_backing_refused(tmp_path):
    util.require_daemon()
    backing = str(tmp_path / "bk")
    os.makedirs(j(backing, "sub", "deeper"))
    alias = str(tmp_path / "alias")
    os.symlink(backing, alias)
    for mnt in (backing, j(backing, "sub"), j(backing, "sub", "deeper"),
                j(alias, "sub")):
        rc, out = run_refused(daemon_cmd(backing, mnt), mnt)
        assert rc != 0, (mnt, out)
        assert "inside" in out or "is the backing" in out, (mnt, out)
        assert not util.is_mounted(mnt)
    assert not os.path.exists(j(backing, LOCK))


# ------------------------------------------------------------ item 16

def check_stamped(text):
    lines = text.splitlines()
    assert lines, "empty log file"
    for line in lines:
        assert STAMP.match(line), f"no timestamp: {line!r}"
    return lines


def test_logfile_foreground(mount, tmp_path):
    logfile = str(tmp_path / "log" / "tierfs.log")
    os.makedirs(os.path.dirname(logfile))
    with open(logfile, "w") as f:
        f.write("earlier line\n")
    m = mount(logfile=logfile, log="info")
    write_file(j(m.mnt, "f"), b"x")
    m.umount()
    text = read_file(logfile).decode()
    no_sanitizer_report(text)
    assert text.startswith("earlier line\n")            # appended
    lines = check_stamped(text.split("\n", 1)[1])
    assert any("mounted" in ln for ln in lines), lines
    assert "exited cleanly" in lines[-1], lines
    assert "mounted" not in m.log()                      # not on stderr


def test_logfile_daemonized(tmp_path):
    util.require_daemon()
    backing = str(tmp_path / "bk")
    mnt = str(tmp_path / "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    logfile = "tierfs.log"                                 # relative to the caller
    r = subprocess.run(daemon_cmd(backing, mnt, foreground=False,
                                  logfile=logfile, log="info"),
                       capture_output=True, text=True, timeout=30, cwd=str(tmp_path))
    try:
        assert r.returncode == 0, r.stderr
        pid = int(read_file(j(backing, LOCK)).split()[0])
        write_file(j(mnt, "f"), b"x" * 4096)
    finally:
        util.lazy_umount(mnt)
    wait_gone(pid)
    no_sanitizer_report(read_file(j(str(tmp_path), logfile)).decode())
    lines = check_stamped(read_file(j(str(tmp_path), logfile)).decode())
    assert any("mounted" in ln for ln in lines), lines
    assert any("unmounting" in ln for ln in lines), lines
    assert "exited cleanly" in lines[-1], lines
    assert all(f"[{pid}]" in ln for ln in lines
               if "unmounting" in ln or "exited" in ln), lines


def test_no_syslog_warns_on_stderr(tmp_path):
    util.require_daemon()
    if os.path.exists("/dev/log"):
        pytest.skip("this machine has a syslog socket")
    backing = str(tmp_path / "bk")
    mnt = str(tmp_path / "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    r = subprocess.run(daemon_cmd(backing, mnt, foreground=False),
                       capture_output=True, text=True, timeout=30)
    try:
        assert r.returncode == 0, r.stderr
        pid = int(read_file(j(backing, LOCK)).split()[0])
    finally:
        util.lazy_umount(mnt)
    wait_gone(pid)
    no_sanitizer_report(r.stderr)
    assert "syslog" in r.stderr and "logfile" in r.stderr, r.stderr
    assert "mounted" in r.stderr, r.stderr        # start-up messages still shown


def test_bad_logfile_refused(tmp_path):
    util.require_daemon()
    backing = str(tmp_path / "bk")
    mnt = str(tmp_path / "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    bad = str(tmp_path / "no" / "such" / "dir" / "log")
    rc, out = run_refused(daemon_cmd(backing, mnt, logfile=bad), mnt)
    assert rc != 0 and bad in out, out


# ------------------------------------------------------------ item 13

def close_quiet(fd):
    try:
        os.close(fd)
    except OSError:
        pass


def test_flush_error_not_reported_to_readers(mount, small_tmpfs):
    write_file(j(small_tmpfs, "filler"), randbytes(5 * MiB))   # 5 of 8 MiB used
    m = mount(backing=small_tmpfs, host_cache="64M", expect_errors=True)
    a = randbytes(6 * MiB)
    try:
        fd = os.open(j(m.mnt, "a"), os.O_WRONLY | os.O_CREAT, 0o644)
        assert os.write(fd, a) == len(a)
        close_quiet(fd)                          # may already report ENOSPC
        util.wait_until(lambda: stats(m)["ssd"].get("flush_errors", 0), "the flush to fail", 30)

        # readers: right data, and close() succeeds
        for _ in range(3):
            fd = os.open(j(m.mnt, "a"), os.O_RDONLY)
            assert util.pread_all(fd, len(a) + 1) == a
            os.close(fd)                         # no ENOSPC here
        r = subprocess.run(["md5sum", j(m.mnt, "a")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["cat", j(m.mnt, "a")], capture_output=True)
        assert r.returncode == 0 and r.stdout == a, r.stderr

        # fsync reports it, whatever the descriptor
        fd = os.open(j(m.mnt, "a"), os.O_RDONLY)
        try:
            expect_errno(errno.ENOSPC, os.fsync, fd)
        finally:
            os.close(fd)
        # so does close() of a descriptor opened for writing
        fd = os.open(j(m.mnt, "a"), os.O_RDWR)
        os.pwrite(fd, a[:4096], 0)
        expect_errno(errno.ENOSPC, os.close, fd)
    finally:
        os.unlink(j(small_tmpfs, "filler"))     # room again: it goes through
    fd = os.open(j(m.mnt, "a"), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    m.umount()
    assert read_file(j(small_tmpfs, "a")) == a


def test_write_through_error_reported_by_fsync(mount, small_tmpfs):
    m = mount(backing=small_tmpfs, host_cache="4M", expect_errors=True)
    chunk = randbytes(MiB)
    fd = os.open(j(m.mnt, "big"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        failed = None
        for i in range(32):                      # bigger than cache and SSD
            try:
                os.write(fd, chunk)
            except OSError as e:
                failed = e
                break
        assert failed is not None and failed.errno == errno.ENOSPC, failed
        assert stats(m)["ssd"]["files_written_through"] >= 1
        expect_errno(errno.ENOSPC, os.fsync, fd)
    finally:
        close_quiet(fd)
    os.unlink(j(m.mnt, "big"))


# ------------------------------------------------------------ item 15

def _stop_prefetch(path):
    os.setxattr(path, PREFETCH, b"stop")


def _stop_prefetch_refused(path):
    expect_errno(errno.EPERM, os.setxattr, path, PREFETCH, b"stop")
    expect_errno(errno.EPERM, os.setxattr, path, PREFETCH, b"start")
    assert os.getxattr(path, PREFETCH) == b"start"     # reading is fine
    # a directory's own restore order is its writers' business
    os.setxattr(path, ORDER, b"x\n")


def _as_nobody(m, fn, *args):
    """fn(*args) as nobody, in the mount's root (paths relative to it: the
    test's directories above the mount are root's only)."""
    dfd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ok, out = util.in_child(fn, *args, uid=NOBODY, gid=NOBODY, cwd_fd=dfd)
    finally:
        os.close(dfd)
    assert ok, out


def test_prefetch_control_needs_mount_owner(mount):
    m = mount(allow_other=True)
    os.chmod(m.mnt, 0o755)
    shared = j(m.mnt, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    assert os.getxattr(m.mnt, PREFETCH) == b"start"
    _as_nobody(m, _stop_prefetch_refused, "shared")
    assert os.getxattr(m.mnt, PREFETCH) == b"start"
    # root may
    os.setxattr(shared, PREFETCH, b"stop")
    assert os.getxattr(m.mnt, PREFETCH) == b"stop"
    os.setxattr(m.mnt, PREFETCH, b"start")
    # and so may the owner of the mount's root
    os.chown(m.mnt, NOBODY, NOBODY)
    _as_nobody(m, _stop_prefetch, "shared")
    assert os.getxattr(m.mnt, PREFETCH) == b"stop"


def test_reserved_names_never_show(mount, tmp_path):
    backing = str(tmp_path / "bk")
    os.makedirs(j(backing, "d"))
    reserved = [".tierfs", ".tierfs-x", ".tierfsfoo", ".tierfs.new.1", ".tierfs.lock"]
    for n in reserved[:-1]:
        write_file(j(backing, n), b"internal")
        write_file(j(backing, "d", n), b"internal")
    write_file(j(backing, "d", ".tierfs.lock"), b"internal")
    os.mkdir(j(backing, "d", ".tierfsdir"))
    write_file(j(backing, "d", "visible"), b"v")
    m = mount(backing=backing)
    assert sorted(os.listdir(m.mnt)) == ["d"]
    assert sorted(os.listdir(j(m.mnt, "d"))) == ["visible"]
    for d in (m.mnt, j(m.mnt, "d")):
        for n in reserved + [".tierfsdir"]:
            p = j(d, n)
            assert not os.path.lexists(p), p
            expect_errno(errno.ENOENT, os.open, p, os.O_RDONLY)
            expect_errno(errno.ENOENT, os.unlink, p)
            expect_errno(errno.ENOENT, os.rename, p, j(d, "stolen"))
        # making such a name: EPERM, whichever way
        p = j(d, ".tierfs-new")
        expect_errno(errno.EPERM, os.open, p, os.O_CREAT | os.O_WRONLY, 0o644)
        expect_errno(errno.EPERM, os.mkdir, p)
        expect_errno(errno.EPERM, os.symlink, "x", p)
        expect_errno(errno.EPERM, os.mknod, p, 0o644 | stat.S_IFIFO)
        expect_errno(errno.EPERM, os.link, j(m.mnt, "d", "visible"), p)
        expect_errno(errno.EPERM, os.rename, j(m.mnt, "d", "visible"), p)
        expect_errno(errno.EPERM, os.open, j(d, ".tierfs"), os.O_CREAT | os.O_WRONLY, 0o644)
    assert read_file(j(m.mnt, "d", "visible")) == b"v"
    m.umount()
    for n in reserved[:-1]:
        assert read_file(j(backing, "d", n)) == b"internal"     # left alone


# ------------------------------------------------------------ item 8 (fs side)

def test_unmount_ends_when_backing_full(tmp_path, small_tmpfs):
    """Files that cannot be written at unmount are retried for exit_timeout
    seconds, then logged with their sizes; the daemon exits 1."""
    write_file(j(small_tmpfs, "filler"), randbytes(5 * MiB))   # 5 of 8 MiB used
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)
    logfile = str(tmp_path / "tierfs.log")
    proc = subprocess.Popen(daemon_cmd(small_tmpfs, mnt, exit_timeout=2, logfile=logfile),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        def mounted():
            assert proc.poll() is None, f"the daemon exited with {proc.returncode}"
            return os.path.ismount(mnt)
        util.wait_until(mounted, "the mount", 10, 0.02)
        sizes = {"a": 6 * MiB, "b": 4 * MiB + 123}
        for name, size in sizes.items():
            fd = os.open(j(mnt, name), os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, randbytes(size))
            close_quiet(fd)
        t0 = time.monotonic()
        subprocess.run(["umount", mnt], check=True)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the daemon did not exit after unmount with a full backing "
                        "directory\n" + read_file(logfile).decode()[-3000:])
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        util.lazy_umount(mnt)
    log = read_file(logfile).decode()
    no_sanitizer_report(log)
    assert rc == 1, log
    assert took >= 2, f"gave up after {took:.1f} s, before exit_timeout\n{log}"
    for name, size in sizes.items():
        assert re.search(rf"{name}: not written to the backing directory \({size} bytes\)",
                         log), log
    assert "2 file(s) could not be written" in log, log
    assert "exited with errors" in log.splitlines()[-1], log
    assert not os.path.exists(j(small_tmpfs, LOCK))
