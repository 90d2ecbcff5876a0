"""pytest glue for the tierfs suites.

Fixtures
  mount   factory: mount(**options, backing=None, expect_errors=False, nofile=None)
          -> util.Mount (nofile: the daemon's RLIMIT_NOFILE),
          started and mounted.  All mounts of a test are unmounted right after the
          test body; a daemon that crashed, exited non-zero or printed an
          unexpected "ERROR"/sanitizer line fails the test itself.
  tfs     one default mount (host_cache=64M, gpu=$TIERFS_GPU or none).
  test_users  [(uid, gid), (uid, gid)] of two unprivileged users,
          tierfs-test-a and tierfs-test-b, made with useradd if missing.

Markers
  gpu     skip unless TIERFS_GPU names a device number.
  daemon  skip under TIERFS_TEST_PLAIN=1 (no daemon started there).

Environment
  TIERFS_BIN         daemon binary (default: <repo>/tierfs)
  TIERFS_GPU         GPU device for gpu=N (default: gpu=none, gpu tests skipped)
  TIERFS_TEST_PLAIN  1: no daemon, the "mount" is a plain directory
  TIERFS_OPTIONS     extra -o options for every mount, e.g. log=debug
  TIERFS_TEST_TIMEOUT  seconds before a hung test aborts the run (default 900)
"""

import faulthandler
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import util  # noqa: E402

MOUNTS = pytest.StashKey[list]()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a GPU (TIERFS_GPU=N)")
    config.addinivalue_line("markers", "daemon: needs the tierfs daemon (skipped in plain mode)")


def pytest_report_header(config):
    if util.PLAIN:
        return "tierfs: PLAIN mode (no daemon; mount == backing directory)"
    return f"tierfs: {util.tierfs_bin()} gpu={util.GPU or 'none'}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gpu") and not util.GPU.isdigit():
            item.add_marker(pytest.mark.skip(reason="no GPU (set TIERFS_GPU=N)"))
        if item.get_closest_marker("daemon") and util.PLAIN:
            item.add_marker(pytest.mark.skip(reason="needs the daemon (TIERFS_TEST_PLAIN)"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Unmount this test's mounts right after its body, so that a daemon failure
    (crash, bad exit, error in its log) fails the test and not only its teardown."""
    outcome = yield
    mounts = item.stash.get(MOUNTS, [])
    problems = []
    for m in reversed(mounts):
        problems += m.finish()
    for m in mounts:
        if m.runs:
            item.add_report_section("call", f"tierfs log {m.base}", m.log(tail=300))
    if problems and outcome.excinfo is None:
        # pluggy 1.0: an exception raised here becomes the call's outcome.
        raise util.DaemonError("\n\n".join(problems))


@pytest.fixture
def xfs(tmp_path):
    """An XFS file system with reflink (-o dedup's backing) on a 1 GiB
    sparse loop file made for the test (the dedup torture's working set, its
    new versions beside the old ones, reached 512 MiB with some seeds);
    yields its root.  Skipped cleanly where
    mkfs.xfs or loop devices are missing (TIERFS_XFS_IMAGE: a gzipped empty
    image, for machines without xfsprogs)."""
    util.require_daemon()
    img, root = tmp_path / "xfs.img", tmp_path / "xfs"
    made = os.environ.get("TIERFS_XFS_IMAGE")
    if made and not shutil.which("mkfs.xfs"):
        r = subprocess.run(f"gzip -dc {made} > {img}", shell=True, capture_output=True,
                           text=True)
        if r.returncode:
            pytest.skip(f"cannot unpack {made}: {r.stderr.strip()}")
    else:
        if not shutil.which("mkfs.xfs"):
            pytest.skip("mkfs.xfs not installed (xfsprogs)")
        with open(img, "wb") as f:
            f.truncate(1024 * util.MiB)
        r = _run(["mkfs.xfs", "-q", "-m", "reflink=1", str(img)])
        if r.returncode:
            pytest.skip(f"mkfs.xfs -m reflink=1 failed: {r.stderr.strip()}")
    yield from loop_mounted(img, root, "XFS")


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def loop_mounted(img, root, what):
    """For fixtures: mount the image img on the new directory root through a
    loop device (skip the test if that fails), yield root, unmount."""
    root.mkdir()
    r = _run(["mount", "-o", "loop", str(img), str(root)])
    if r.returncode:
        pytest.skip(f"cannot mount {what} on a loop device: {r.stderr.strip()}")
    yield str(root)
    if _run(["umount", str(root)]).returncode:
        _run(["umount", "-l", str(root)])


@pytest.fixture(autouse=True)
def _watchdog():
    """A hung FUSE call cannot be interrupted: dump stacks and abort the run."""
    timeout = float(os.environ.get("TIERFS_TEST_TIMEOUT", "900"))
    faulthandler.dump_traceback_later(timeout, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def mount(request, tmp_path):
    mounts = []
    request.node.stash[MOUNTS] = mounts

    def factory(backing=None, expect_errors=False, wait_gpu=True, nofile=None, **options):
        base = tmp_path / f"tierfs{len(mounts)}"
        m = util.Mount(base, options, backing=backing, expect_errors=expect_errors,
                       wait_gpu=wait_gpu, nofile=nofile)
        mounts.append(m)
        m.start()
        return m

    yield factory
    # Normally done by pytest_runtest_call; here for setup failures and the like.
    problems = []
    for m in reversed(mounts):
        problems += m.finish()
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def tfs(mount):
    return mount()


TEST_USERS = ("tierfs-test-a", "tierfs-test-b")


@pytest.fixture(scope="session")
def test_users():
    """Two real unprivileged users (useradd --system, no home, no login)."""
    import pwd
    out = []
    for name in TEST_USERS:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            r = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                                "--shell", "/usr/sbin/nologin", name],
                               capture_output=True, text=True)
            if r.returncode not in (0, 9):      # 9: made meanwhile by another run
                pytest.skip(f"cannot make test user {name}: {r.stderr.strip()}")
            pw = pwd.getpwnam(name)
        out.append((pw.pw_uid, pw.pw_gid))
    return out
