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


def run_refused(cmd, mnt, timeout=10):
    """Run a daemon that must refuse to start: (exit status, its output).
    One that mounts after all is unmounted again and fails the test."""
    before = util.is_mounted(mnt)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
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
    return proc.returncode, out.decode(errors="replace")


def wait_gone(pid, timeout=util.EXIT_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"daemon {pid} did not exit within {timeout}s")



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


