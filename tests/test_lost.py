"""Data that could not be written to the backing directory at exit (issue 37).

A daemon whose backing directory is full at unmount retries for
exit_timeout seconds, then gives the files up, logs them and exits 1.
`tierfsctl wait` and tierfs.wait_flushed must not report success then, and
must name what was lost; the backing directory keeps what it had.
"""

import errno
import os
import subprocess
import sys

import pytest

import util
from util import MiB, randbytes, read_file, write_file

TOOL = os.path.join(util.REPO_DIR, "tools", "tierfsctl")
sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
import tierfs  # noqa: E402

pytestmark = pytest.mark.daemon


@pytest.fixture
def tmpfs64(tmp_path):
    """A 64 MiB tmpfs as the backing directory."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64M", "tierfs-test", str(d)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    yield str(d)
    subprocess.run(["umount", "-l", str(d)])


def ctl(*args, timeout=120):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True,
                          text=True, timeout=timeout)


def too_big(mount, backing, old=None):
    """A mount over `backing` with a 100 MiB file `big` that cannot be
    flushed (and `old`, if given, written and flushed first as `big`)."""
    util.require_daemon()
    m = mount(backing=backing, exit_timeout=1, host_cache="256M",
              expect_errors=[r"big", r"could not be written", r"flush to SSD failed"])
    path = os.path.join(m.mnt, "big")
    if old is not None:
        write_file(path, old)
        tierfs.wait_flushed(path, timeout=60)
    write_file(path, randbytes(100 * MiB))
    return m


def test_wait_after_umount_names_the_lost_file(mount, tmpfs64):
    m = too_big(mount, tmpfs64)
    proc = m.proc
    r = m.umount_now()
    assert r.returncode == 0, r.stderr
    w = ctl("wait", m.mnt)
    assert proc.poll() is not None, "wait returned before the daemon exited"
    assert proc.returncode == 1
    assert w.returncode == 1, (w.returncode, w.stdout, w.stderr)
    assert "big" in w.stderr and "not written" in w.stderr, w.stderr
    assert "Traceback" not in w.stderr
    assert "big: not written" in m.log()
    # a name that never had a version is left empty
    assert os.path.getsize(os.path.join(tmpfs64, "big")) == 0
    m.finished = True


def test_wait_during_exit_names_the_lost_file(mount, tmpfs64):
    """wait started while the mount is still up follows it through the
    unmount to the daemon's end."""
    m = too_big(mount, tmpfs64)
    proc = m.proc
    w = subprocess.Popen([sys.executable, TOOL, "wait", m.mnt], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    util.wait_until(lambda: tierfs.stats(m.mnt)["ssd"]["flush_errors"] > 0,
                    "a failed flush", 60)
    r = m.umount_now()
    assert r.returncode == 0, r.stderr
    out, err = w.communicate(timeout=120)
    assert proc.wait(timeout=60) == 1
    assert w.returncode == 1, (w.returncode, out, err)
    assert "big" in err and "not written" in err, err
    m.finished = True


def test_wait_flushed_python_raises(mount, tmpfs64):
    """tierfs.wait_flushed on a mount that is unmounted while it waits
    raises EIO naming the file given up."""
    m = too_big(mount, tmpfs64)
    import threading
    res = {}

    def waiter():
        try:
            res["ok"] = tierfs.wait_flushed(m.mnt, timeout=120)
        except Exception as e:          # noqa: BLE001
            res["exc"] = e
    t = threading.Thread(target=waiter)
    t.start()
    util.wait_until(lambda: tierfs.stats(m.mnt)["ssd"]["flush_errors"] > 0,
                    "a failed flush", 60)
    proc = m.proc
    r = m.umount_now()
    assert r.returncode == 0, r.stderr
    t.join(120)
    assert proc.wait(timeout=60) == 1
    e = res.get("exc")
    assert isinstance(e, OSError) and e.errno == errno.EIO, res
    assert "big" in str(e), e
    m.finished = True


def test_previous_version_kept(mount, tmpfs64):
    """A file that had a version in the backing directory keeps it when its
    new content is given up."""
    old = randbytes(4 * MiB)
    m = too_big(mount, tmpfs64, old=old)
    proc = m.proc
    r = m.umount_now()
    assert r.returncode == 0, r.stderr
    assert ctl("wait", m.mnt).returncode == 1
    assert proc.wait(timeout=60) == 1
    assert read_file(os.path.join(tmpfs64, "big")) == old
    m.finished = True


def test_wait_unmount_names_the_lost_file(mount, tmpfs64):
    """wait --unmount finds the daemon before it unmounts, so that its end
    is read however soon it comes (the epilog of a batch job)."""
    m = too_big(mount, tmpfs64)
    proc = m.proc
    w = ctl("wait", "--unmount", m.mnt)
    assert proc.poll() is not None and proc.returncode == 1
    assert not util.is_mounted(m.mnt)
    assert w.returncode == 1, (w.returncode, w.stdout, w.stderr)
    assert "big" in w.stderr and "not written" in w.stderr, w.stderr
    m.finished = True


def test_wait_unmount_clean(mount):
    m = mount()
    write_file(os.path.join(m.mnt, "f"), randbytes(MiB))
    proc = m.proc
    w = ctl("wait", "--unmount", m.mnt)
    assert w.returncode == 0, w.stderr
    assert proc.poll() == 0 and not util.is_mounted(m.mnt)
    assert os.path.getsize(os.path.join(m.backing, "f")) == MiB
    m.proc = None
    m.runs[-1][3] = "unmount"


def test_wait_reports_what_did_not_reach_dir(mount, tmp_path, tmpfs64):
    """-o persist: operations left out of DIR at the daemon's exit (DIR
    read-only, persist_wait over) fail tierfsctl wait, which names DIR."""
    pdir = tmpfs64
    m = mount(persist=pdir, persist_all=True, persist_wait=1,
              expect_errors=["persist: .*Read-only", "persist: .*not in ",
                             "persist: .*not applied"])
    subprocess.run(["mount", "-o", "remount,ro", pdir], check=True)
    try:
        write_file(os.path.join(m.mnt, "y"), b"data of y")
        util.wait_flushed(m)
        proc = m.proc
        w = ctl("wait", "--unmount", m.mnt)
        assert proc.poll() == 0         # BACKING_DIR has everything
        assert w.returncode == 1, (w.returncode, w.stdout, w.stderr)
        assert "did not reach" in w.stderr and pdir in w.stderr, w.stderr
        m.proc = None
        m.runs[-1][3] = "unmount"
    finally:
        subprocess.run(["mount", "-o", "remount,rw", pdir])
