"""A malformed hint written with a raw setxattr (setfattr(1)) gets a bare
EINVAL; the daemon says why in its log, rate-limited (issue 37)."""

import errno
import os
import re
import time

import pytest

import util
from util import expect_errno, write_file

pytestmark = pytest.mark.daemon

ORDER = "user.tierfs.restore_order"


def refusals(m):
    return [ln for ln in m.log().splitlines() if "refused (EINVAL)" in ln]


def wait_for_line(m, what):
    util.wait_until(lambda: any(what in ln for ln in refusals(m)), f"a log line with {what!r}",
                    10, 0.02)
    return [ln for ln in refusals(m) if what in ln][-1]


@pytest.mark.parametrize("value, why", [
    (b"a\nsub/x\n", "line 2 'sub/x': contains '/'"),
    (b"..\n", "line 1 '..': '.' and '..' are not files"),
    (b".tierfs.x", "names beginning with '.tierfs'"),
    (b"ok\n\xff\xfe\n", "line 2 '??': not valid UTF-8"),
    (b"x" * 256, "longer than 255 bytes"),
    (b"\n\n", "no names, only empty lines"),
    (b"a\nb\x00c", "line 2: contains a NUL byte"),
    (b"d", "'d': exists and is not a regular file"),
])
def test_bad_restore_order_is_logged(mount, value, why):
    util.require_daemon()
    m = mount()
    d = os.path.join(m.mnt, "run")
    os.mkdir(d)
    os.mkdir(os.path.join(d, "d"))
    time.sleep(1.1)             # past any earlier line's second
    expect_errno(errno.EINVAL, os.setxattr, d, ORDER, value)
    line = wait_for_line(m, why)
    assert "NOTICE" in line and ORDER in line and " on run " in line, line


def test_other_attributes_are_logged(mount):
    util.require_daemon()
    m = mount()
    f = os.path.join(m.mnt, "f")
    write_file(f, b"x")
    expect_errno(errno.EINVAL, os.setxattr, m.mnt, "user.tierfs.prefetch", b"go")
    assert "user.tierfs.prefetch on . refused" in wait_for_line(m, "\"start\" or \"stop\"")
    time.sleep(1.1)
    expect_errno(errno.EINVAL, os.setxattr, f, "user.tierfs.restore_device", b"x")
    assert "on f refused" in wait_for_line(m, "GPU number")
    time.sleep(1.1)
    expect_errno(errno.EINVAL, os.setxattr, f, "user.tierfs.nonesuch", b"1")
    wait_for_line(m, "no such tierfs attribute")


def test_a_flood_is_bounded(mount):
    util.require_daemon()
    m = mount()
    d = os.path.join(m.mnt, "run")
    os.mkdir(d)
    time.sleep(1.1)
    t0 = time.monotonic()
    for i in range(1000):
        expect_errno(errno.EINVAL, os.setxattr, d, ORDER, f"bad/{i}".encode())
    secs = time.monotonic() - t0
    time.sleep(1.1)
    expect_errno(errno.EINVAL, os.setxattr, d, ORDER, b"last/one")
    line = wait_for_line(m, "last/one")
    lines = refusals(m)
    # one line a second at most, and the last says how many were left out
    assert len(lines) <= secs + 3, (secs, lines)
    more = sum(int(x) for ln in lines
               for x in re.findall(r"and (\d+) more refused value\(s\) not logged", ln))
    assert len(lines) + more == 1001, (more, lines)     # each one said or counted
    assert "more refused" in line
