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
  fuse_users  (a, b): those users as conftest.User (run a command as the
          user, a home directory of the test's); a may open /dev/fuse, b
          may not (named entries in the device's ACL, left in place).

Markers
  gpu     skip unless TIERFS_GPU names a device number.
  daemon  skip under TIERFS_TEST_PLAIN=1 (no daemon started there).

Environment
  TIERFS_BIN         daemon binary (default: <repo>/tierfs)
  TIERFS_GPU         GPU device for gpu=N (default: gpu=none, gpu tests skipped)
  TIERFS_TEST_PLAIN  1: no daemon, the "mount" is a plain directory
  TIERFS_OPTIONS     extra -o options for every mount, e.g. log=debug
  TIERFS_TEST_TIMEOUT  seconds before a hung test aborts the run (default 900),
                     after writing hang-report-PID.txt (stacks of the test and of
                     its daemons, their logs) into TIERFS_HANG_DIR (default: the
                     current directory; run-pytest.sh prints the reports)
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
    config.addinivalue_line("markers", "slow: runs for tens of seconds; scheduled first, so "
                            "that parallel workers (pytest-xdist) do not end on it alone")


def pytest_report_header(config):
    if util.PLAIN:
        return "tierfs: PLAIN mode (no daemon; mount == backing directory)"
    return f"tierfs: {util.tierfs_bin()} gpu={util.GPU or 'none'}"


def spread_slow(items, workers):
    """items reordered so that the slow ones start at once, spread over the
    workers: pytest-xdist (load scheduling) gives each worker a first chunk
    of consecutive tests (a quarter of its share) and then one or two at a
    time as it finishes them.  A slow test handed out last keeps one worker
    busy while the others wait; all of them in one first chunk make that
    worker run them one after another.  So the first chunk of worker k
    starts with slow tests k, k + workers, ...  The order depends only on
    the collection and the number of workers: every worker computes the
    same one."""
    slow = [it for it in items if it.get_closest_marker("slow")]
    fast = [it for it in items if not it.get_closest_marker("slow")]
    if workers < 2 or not slow:
        return slow + fast
    chunk = max(len(items) // workers // 4, 2)
    out, rest = [], []
    for k in range(workers):
        mine = slow[k::workers]
        rest += mine[chunk:]
        mine = mine[:chunk]
        out += mine
        while len(mine) < chunk and fast:
            mine.append(fast.pop(0))
            out.append(mine[-1])
    return out + rest + fast


@pytest.hookimpl(trylast=True)     # after -k and -m have deselected
def pytest_collection_modifyitems(config, items):
    items[:] = spread_slow(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
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
    # nouuid: the copies of one image share its UUID, which XFS refuses to
    # mount twice at once (tests in parallel: "wrong fs type")
    yield from loop_mounted(img, root, "XFS", "loop,nouuid" if made else "loop")


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def loop_mounted(img, root, what, opts="loop"):
    """For fixtures: mount the image img on the new directory root through a
    loop device (skip the test if that fails), yield root, unmount."""
    root.mkdir()
    r = _run(["mount", "-o", opts, str(img), str(root)])
    if r.returncode:
        pytest.skip(f"cannot mount {what} on a loop device: {r.stderr.strip()}")
    yield str(root)
    if _run(["umount", str(root)]).returncode:
        _run(["umount", "-l", str(root)])


@pytest.fixture
def full_tmpfs(tmp_path):
    """full_tmpfs(name, options): a backing directory on a tmpfs of its own
    ("size=8M", "nr_inodes=24": an "SSD" that fills up), unmounted after
    the test."""
    util.require_daemon("ENOSPC must come from the daemon's flush")
    made = []

    def make(name, options):
        d = tmp_path / name
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"{options},mode=0755", "tmpfs",
                        str(d)], check=True)
        made.append(str(d))
        return str(d)
    try:
        yield make
    finally:
        for d in made:
            util.lazy_umount(d)


@pytest.fixture
def small_tmpfs(full_tmpfs):
    """A backing directory on an 8 MiB tmpfs (the "SSD" that fills up).
    test_persist.py has its own, of 4 MiB, for DIR."""
    return full_tmpfs("ssd", "size=8M")


HANG_DIR = os.environ.get("TIERFS_HANG_DIR") or os.getcwd()


def _sh(cmd, timeout=60):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{cmd[0]}: {e}\n"


def _kernel_stacks(pid):
    """What each thread of pid waits in, from /proc (wchan and the kernel stack)."""
    out = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError as e:
        return f"  pid {pid}: {e}\n"
    for tid in tids:
        def rd(name):
            try:
                with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                    return f.read().strip()
            except OSError as e:
                return f"({e.strerror})"
        out.append(f"  thread {tid} {rd('comm')} state={(rd('stat').rsplit(')', 1)[-1].split() or ['?'])[0]} "
                   f"wchan={rd('wchan')}\n" + "".join(f"    {ln}\n" for ln in
                                                    rd("stack").splitlines()))
    return "".join(out)


def _hang_report(item, timeout):
    """Written when a test runs past the timeout, before the run is aborted:
    the test's Python stacks, its daemons' threads (kernel stacks, and gdb's
    backtraces where gdb is installed) and log tails, and every process in
    uninterruptible sleep.  run-pytest.sh prints the file after the run."""
    path = os.path.join(HANG_DIR, f"hang-report-{os.getpid()}.txt")
    with open(path, "w") as f:
        f.write(f"=== {item.nodeid}: still running after {timeout:.0f} s "
                f"(TIERFS_TEST_TIMEOUT)\n\n--- the test's threads\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.write(_kernel_stacks(os.getpid()))
        for m in item.stash.get(MOUNTS, []):
            proc = getattr(m, "proc", None)
            f.write(f"\n--- daemon of {m.mnt}: "
                    f"{'pid %d' % proc.pid if proc else 'not running'}\n")
            if proc and proc.poll() is None:
                f.write(_kernel_stacks(proc.pid))
                if shutil.which("gdb"):
                    f.write(_sh(["gdb", "-p", str(proc.pid), "-batch", "-nx",
                                 "-ex", "thread apply all bt"]))
            f.write(m.log(tail=150) + "\n")
        f.write("\n--- processes in uninterruptible sleep (D)\n")
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as st:
                    fields = st.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "D":
                f.write(_sh(["ps", "-o", "pid,ppid,stat,wchan:32,args", "-p", pid]))
                f.write(_kernel_stacks(pid))


@pytest.fixture(autouse=True)
def _watchdog(request):
    """A hung FUSE call cannot be interrupted: write a hang report (above)
    and abort the run.  faulthandler's own timer, a minute later, is the
    backstop should the report itself hang."""
    import threading
    timeout = float(os.environ.get("TIERFS_TEST_TIMEOUT", "900"))
    done = threading.Event()

    def watch():
        if done.wait(timeout):
            return
        try:
            _hang_report(request.node, timeout)
        finally:
            faulthandler.dump_traceback(all_threads=True)
            os._exit(70)
    threading.Thread(target=watch, name="tierfs-watchdog", daemon=True).start()
    faulthandler.dump_traceback_later(timeout + 120, exit=True)
    yield
    done.set()
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


# ---------------------------------------------------------------- users who mount

def _acl_with_users(path, users):
    """The system.posix_acl_access of `path` with named-user entries
    `users` ({uid: rwx bits}) added or changed, the rest as it was (or, on
    a file without an ACL, as its mode says; the mask lets rw through)."""
    import struct
    und = 0xffffffff
    try:
        v = os.getxattr(path, "system.posix_acl_access")
        ents = [struct.unpack_from("<HHI", v, off) for off in range(4, len(v), 8)]
    except OSError:
        mode = os.stat(path).st_mode & 0o777
        ents = [(0x01, (mode >> 6) & 7, und), (0x04, (mode >> 3) & 7, und),
                (0x10, 6, und), (0x20, mode & 7, und)]
    ents = [e for e in ents if not (e[0] == 0x02 and e[2] in users)]
    ents += [(0x02, p, u) for u, p in users.items()]
    ents = [(t, (p | 6) if t == 0x10 else p, i) for t, p, i in ents]
    ents.sort(key=lambda e: (e[0], e[2] if e[0] in (0x02, 0x08) else 0))
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in ents)


def _acl_users(path):
    """{uid: bits} of the named-user entries of path's access ACL."""
    import struct
    try:
        v = os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return {}
    out = {}
    for off in range(4, len(v), 8):
        t, p, i = struct.unpack_from("<HHI", v, off)
        if t == 0x02:
            out[i] = p
    return out


class User:
    """An unprivileged user of the tests: run(cmd) runs cmd as that user
    (setpriv, the user's own groups), with a working directory `home`
    (made for the test, the user's own, under a world-searchable one)."""

    def __init__(self, name, uid, gid, home):
        self.name, self.uid, self.gid, self.home = name, uid, gid, home

    def cmd(self, argv):
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
                "--reset-env", "--"] + list(argv)

    def run(self, argv, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        env = kw.pop("env", None)
        if env:
            argv = ["env"] + [f"{k}={v}" for k, v in env.items()] + list(argv)
        return subprocess.run(self.cmd(argv), cwd=self.home, **kw)

    def mkdir(self, *parts, mode=0o755):
        """The directory home/parts..., made the user's (mode `mode`) if
        missing, else left as it is."""
        p = os.path.join(self.home, *parts)
        if not os.path.isdir(p):
            os.makedirs(p)
            os.chown(p, self.uid, self.gid)
            os.chmod(p, mode)
        return p


@pytest.fixture
def fuse_users(test_users, tmp_path):
    """(a, b): the two test users as User objects; a may read and write
    /dev/fuse, b may not (named entries of the device's access ACL, so that
    the device's mode and its other users are left alone: b's entry denies
    b even where the mode lets everybody in, as Debian's 0666 does).  The
    entries stay after the test (other workers may be using them); skipped
    where the device takes no ACL.  Each user's `home` is a new directory
    under /tmp, removed after the test."""
    import pwd
    import tempfile
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    for tool in ("setpriv", "fusermount3"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} not installed")
    (ua, ga), (ub, gb) = test_users
    want = {ua: 6, ub: 0}
    have = _acl_users("/dev/fuse")
    if any(have.get(u) != p for u, p in want.items()):
        try:
            os.setxattr("/dev/fuse", "system.posix_acl_access",
                        _acl_with_users("/dev/fuse", want))
        except OSError as e:
            pytest.skip(f"cannot give a test user access to /dev/fuse (ACL): {e}")
    users = []
    top = tempfile.mkdtemp(prefix="tierfs-users-", dir="/tmp")
    os.chmod(top, 0o755)
    for (uid, gid) in test_users:
        name = pwd.getpwuid(uid).pw_name
        home = os.path.join(top, name)
        os.mkdir(home)
        os.chown(home, uid, gid)
        users.append(User(name, uid, gid, home))
    yield tuple(users)
    for u in users:             # a mount left behind by a failed test
        with open("/proc/self/mountinfo") as f:
            mps = [ln.split()[4] for ln in f]
        for mp in mps:
            if mp.startswith(u.home + "/"):
                util.lazy_umount(mp)
    shutil.rmtree(top, ignore_errors=True)
