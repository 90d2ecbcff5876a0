"""Helpers for the tierfs pytest suites: running the daemon, data, processes.

The central piece is `Mount`: it starts `$TIERFS_BIN BACKING MNT -f -o OPTIONS`
over a fresh backing directory, waits for the mount, and on unmount checks that
the daemon exited 0 and printed no error (see `BAD_LOG`).  With
TIERFS_TEST_PLAIN=1 no daemon is started: the "mount" is a plain directory and
mnt == backing, which lets the test logic be checked against an ordinary
filesystem.  Tests that need a real daemon call `require_daemon()`.
"""

import ctypes
import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import stat
import struct
import subprocess
import time
import traceback

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TESTS_DIR)

PLAIN = os.environ.get("TIERFS_TEST_PLAIN", "") not in ("", "0")
GPU = os.environ.get("TIERFS_GPU", "").strip()
if GPU.lower() in ("none", "no", "off"):
    GPU = ""

MOUNT_TIMEOUT = 10.0                     # seconds for the mount to appear
EXIT_TIMEOUT = float(os.environ.get("TIERFS_EXIT_TIMEOUT", "120"))  # flush on unmount

MiB = 1 << 20
KiB = 1 << 10

# Daemon output lines that fail a test.  Sanitizer reports can never be
# declared expected; "ERROR" lines can (Mount(expect_errors=...)).
SANITIZER_LOG = re.compile(r"AddressSanitizer|LeakSanitizer|ThreadSanitizer|"
                           r"MemorySanitizer|UndefinedBehaviorSanitizer|runtime error")
ERROR_LOG = re.compile(r"ERROR")


def tierfs_bin():
    return os.environ.get("TIERFS_BIN") or os.path.join(REPO_DIR, "tierfs")


def require_daemon(why="needs the tierfs daemon"):
    if PLAIN:
        pytest.skip(f"{why} (TIERFS_TEST_PLAIN)")


# ---------------------------------------------------------------- waiting, seeds, children

def wait_until(cond, what, timeout=60, interval=0.05):
    """Call cond() every `interval` seconds until it returns something true,
    and return that.  After `timeout` seconds raise AssertionError naming
    `what` (what was waited for; a callable is called then, for a message
    with the state at that moment).  For liveness only: a test never
    asserts how fast something happens."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for "
                                 f"{what() if callable(what) else what}")
        time.sleep(interval)


def random_seed_wanted():
    """TIERFS_RANDOM_SEED set, non-empty and not "0": seeds from the clock."""
    return os.environ.get("TIERFS_RANDOM_SEED", "") not in ("", "0")


def pick_seed(env, default, what):
    """The seed of a randomised test (tests/README.md, "Seeds"): $env if
    set, else one drawn at random with TIERFS_RANDOM_SEED=1, else
    `default`, so that the default test command runs the same cases each
    time.  Printed either way (pytest shows it with a failure)."""
    given = os.environ.get(env, "") if env else ""
    if given:
        seed, src = int(given, 0), env
    elif random_seed_wanted():
        seed, src = int.from_bytes(os.urandom(4), "little"), "TIERFS_RANDOM_SEED"
    else:
        seed, src = default, "the fixed default; TIERFS_RANDOM_SEED=1 for a random one"
    print(f"{what}: seed {seed} ({src}{'; ' + env + '=' + str(seed) + ' replays it' if env else ''})")
    return seed


_DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP,
                    signal.SIGPIPE)


def default_signals():
    """In a child before exec: the signals a test may send back to their
    default dispositions, and none blocked.  The test runner may have been
    started with some ignored (`nohup` ignores SIGHUP; a shell's `cmd &`
    without job control ignores SIGINT and SIGQUIT) or blocked, and a child
    inherits both: a SIGINT sent to it would then do nothing."""
    for sig in _DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def popen_with_default_signals(cmd, **kw):
    """subprocess.Popen(cmd, **kw) for a child the test will signal: its
    SIGINT, SIGTERM, SIGQUIT, SIGHUP and SIGPIPE at their defaults, nothing
    blocked (default_signals), whatever this process inherited.  (Popen's
    restore_signals resets only SIGPIPE, SIGXFZ and SIGXFSZ.)  A caller's
    own preexec_fn runs after."""
    extra = kw.pop("preexec_fn", None)

    def preexec():
        default_signals()
        if extra:
            extra()
    return subprocess.Popen(cmd, preexec_fn=preexec, **kw)


# ---------------------------------------------------------------- mounts

def is_mounted(path):
    """True if `path` is a mount point in /proc/self/mountinfo.

    Unlike os.path.ismount this also sees a FUSE mount whose daemon is dead
    (stat on it fails with ENOTCONN)."""
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), mp)
            if mp == path:
                return True
    return False


def _umount_cmd(path, lazy=False):
    if shutil.which("fusermount3"):
        cmd = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [path]
    elif shutil.which("fusermount"):
        cmd = ["fusermount", "-u"] + (["-z"] if lazy else []) + [path]
    else:
        cmd = ["umount"] + (["-l"] if lazy else []) + [path]
    return cmd


def lazy_umount(path):
    """Detach `path` whatever state its daemon is in (no error if not mounted)."""
    if not is_mounted(path):
        return
    r = subprocess.run(["umount", "-l", path], capture_output=True, text=True)
    if r.returncode != 0 and is_mounted(path):
        subprocess.run(_umount_cmd(path, lazy=True), capture_output=True, text=True)


def format_options(opts):
    out = []
    for k, v in opts.items():
        if v is None or v is False:
            continue
        out.append(k if v is True else f"{k}={v}")
    return ",".join(out)


def gpu_or_fake(monkeypatch):
    """A device for -o gpu= in a test of the GPU tier's logic: the real GPU
    where the suite runs with one (TIERFS_GPU), else the build's fake
    libcuda (tests/gpu/fake_libcuda.c: "device" memory is host memory,
    copies are memcpy), put on LD_LIBRARY_PATH for the daemons this test
    starts.  Skips where neither is there (a build without CUDA headers)."""
    import pytest
    if GPU:
        return GPU
    fake = os.path.join(os.path.dirname(tierfs_bin()), "tests", "gpu", "fakecuda")
    if not os.path.exists(os.path.join(fake, "libcuda.so.1")):
        pytest.skip("no GPU and no fake libcuda (a build without CUDA headers)")
    old = os.environ.get("LD_LIBRARY_PATH")
    monkeypatch.setenv("LD_LIBRARY_PATH", fake + (":" + old if old else ""))
    return "0"


def gpus_or_fake(monkeypatch, n=2):
    """-o gpu= for a mount whose one GPU cache spans n devices: the real ones
    named by TIERFS_GPUS (e.g. "0:1") where the suite runs on a machine with
    several; on a one-GPU machine (TIERFS_GPU only) the test is skipped; else
    the build's fake libcuda with n devices (TIERFS_FAKE_CUDA_DEVICES)."""
    import pytest
    real = os.environ.get("TIERFS_GPUS", "").strip()
    if real:
        if len(real.split(":")) < n:
            pytest.skip(f"TIERFS_GPUS={real}: fewer than {n} GPUs")
        return ":".join(real.split(":")[:n])
    if GPU:
        pytest.skip("one GPU here (TIERFS_GPU); several need TIERFS_GPUS=0:1...")
    gpu_or_fake(monkeypatch)
    monkeypatch.setenv("TIERFS_FAKE_CUDA_DEVICES", str(n))
    return ":".join(str(i) for i in range(n))


def default_options():
    opts = {"host_cache": "64M", "gpu": GPU or "none"}
    extra = os.environ.get("TIERFS_OPTIONS", "")       # e.g. "log=debug"
    for item in filter(None, extra.split(",")):
        k, _, v = item.partition("=")
        opts[k] = v if v else True
    if os.environ.get("TIERFS_LOG"):
        opts["log"] = os.environ["TIERFS_LOG"]
    return opts


class DaemonError(AssertionError):
    pass


class Mount:
    """One tierfs instance over one backing directory (possibly restarted).

    Attributes: mnt, backing, proc (the current daemon's Popen, or None),
    options (dict), plain (bool)."""

    def __init__(self, base, options=None, backing=None, expect_errors=False,
                 wait_gpu=True, nofile=None):
        self.base = str(base)
        os.makedirs(self.base, exist_ok=True)
        self.plain = PLAIN
        if self.plain:
            self.backing = backing or os.path.join(self.base, "plain")
            self.mnt = self.backing
        else:
            self.backing = backing or os.path.join(self.base, "backing")
            self.mnt = os.path.join(self.base, "mnt")
            os.makedirs(self.mnt, exist_ok=True)
        os.makedirs(self.backing, exist_ok=True)
        self.options = default_options()
        self.options.update(options or {})
        self.wait_gpu = wait_gpu
        self.nofile = nofile    # the daemon's RLIMIT_NOFILE (soft = hard), None: ours
        self.proc = None
        self.runs = []          # [(cmd, logpath, Popen, how_it_ended)]
        self.expected = []      # regexes of "ERROR" lines that are fine
        self.any_error_ok = False
        self.finished = False
        if expect_errors is True:
            self.any_error_ok = True
        elif expect_errors:
            self.expect_errors(*expect_errors)

    # -- declarations
    def expect_errors(self, *patterns):
        """Declare daemon "ERROR" lines as expected; without patterns: any."""
        if not patterns:
            self.any_error_ok = True
        self.expected += [re.compile(p) for p in patterns]

    # -- life cycle
    def start(self, **options):
        """Start the daemon (again) and wait until the mount is up."""
        self.options.update(options)
        self.finished = False
        if self.plain:
            return self
        assert self.proc is None, "daemon already running"
        binary = tierfs_bin()
        if not os.access(binary, os.X_OK):
            pytest.fail(f"tierfs binary {binary!r} not found or not executable "
                        f"(set TIERFS_BIN, or TIERFS_TEST_PLAIN=1)")
        cmd = [binary, self.backing, self.mnt, "-f"]
        opts = format_options(self.options)
        if opts:
            cmd += ["-o", opts]
        logpath = os.path.join(self.base, f"daemon.{len(self.runs)}.log")
        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "abort_on_error=0:detect_leaks=1")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
        preexec = None
        if self.nofile:
            def preexec(n=int(self.nofile)):
                import resource
                resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
        with open(logpath, "wb") as logf:
            # Mount.kill() signals it (libfuse keeps an ignored SIGINT,
            # SIGTERM or SIGHUP ignored)
            proc = popen_with_default_signals(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                              stderr=subprocess.STDOUT, env=env,
                                              preexec_fn=preexec)
        self.proc = proc
        run = [cmd, logpath, proc, None]
        self.runs.append(run)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while True:
            if proc.poll() is not None:
                run[3] = "start failed"
                self.proc = None
                raise DaemonError(f"tierfs exited with {proc.returncode} before the "
                                  f"mount appeared: {' '.join(cmd)}\n{self.log()}")
            if os.path.ismount(self.mnt):
                self.wait_gpu_tier()
                return self
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                lazy_umount(self.mnt)
                run[3] = "start failed"
                self.proc = None
                raise DaemonError(f"mount did not appear within {MOUNT_TIMEOUT}s: "
                                  f"{' '.join(cmd)}\n{self.log()}")
            time.sleep(0.02)

    def wait_gpu_tier(self, timeout=60):
        """With gpu=N the GPU tier is built in the background after the mount
        appears (writes go to the host tier meanwhile, or past the part of
        the GPU cache mapped so far).  Tests that use the GPU tier wait until
        it is fully mapped, or for the daemon's word that there is none.
        A test that wants the moment before asks with wait_gpu=False."""
        spec = str(self.options.get("gpu", "none"))
        is_gpu = spec == "all" or (spec and all(x.isdigit() for x in spec.split(":")))
        if not is_gpu or not self.wait_gpu:     # "1", "0:1", "all"
            return
        def up():
            try:
                if b'"fully_mapped":true' in os.getxattr(self.mnt, "user.tierfs.stats"):
                    return True
            except OSError:
                pass
            return "GPU tier: not available" in self.log()
        try:
            wait_until(up, "the GPU tier up and mapped", timeout, 0.02)
        except AssertionError as e:
            raise DaemonError(f"{e}\n{self.log()}") from None

    def log(self, tail=None):
        """The daemon output of every run of this mount, oldest first."""
        parts = []
        for i, (cmd, logpath, proc, _) in enumerate(self.runs):
            try:
                with open(logpath, "rb") as f:
                    text = f.read().decode(errors="replace")
            except FileNotFoundError:
                text = ""
            if tail:
                text = "\n".join(text.splitlines()[-tail:])
            parts.append(f"--- run {i}: {' '.join(cmd)} (rc {proc.returncode})\n{text}")
        return "\n".join(parts)

    def umount_now(self, seconds=10):
        """umount(8) the mount, again while it is busy for a moment (a call
        of the test's own, such as a wait_flushed poll, in flight on it), for
        at most `seconds`; the daemon is not waited for.  Returns the last
        CompletedProcess."""
        deadline = time.monotonic() + seconds
        while True:
            r = subprocess.run(["umount", self.mnt], capture_output=True, text=True)
            if r.returncode == 0 or "busy" not in r.stderr or time.monotonic() > deadline:
                return r
            time.sleep(0.05)

    def umount(self, timeout=EXIT_TIMEOUT):
        """Unmount cleanly, wait for the daemon to exit; raise if it failed."""
        if self.plain or self.proc is None:
            return
        proc = self.proc
        deadline = time.monotonic() + 5
        busy = None
        while True:
            r = subprocess.run(_umount_cmd(self.mnt), capture_output=True, text=True)
            if r.returncode == 0 or not is_mounted(self.mnt):
                break
            if time.monotonic() > deadline:
                busy = r.stderr.strip() or "busy"
                break
            time.sleep(0.1)          # busy: the kernel may still be releasing files
        if busy:
            # Something (a file left open by the test) keeps it busy.  Detach
            # it, and since the daemon would only see the last release when
            # that file is closed, ask it to flush and exit with SIGTERM.
            lazy_umount(self.mnt)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
            self._wait_exit(proc, timeout, "lazy unmount (busy)")
            raise DaemonError(f"unmount failed: {busy} (files left open?)\n"
                              f"{self.log(tail=200)}")
        self._wait_exit(proc, timeout, "unmount")
        self._check_run(self.runs[-1])

    def _wait_exit(self, proc, timeout, what):
        try:
            proc.wait(timeout=timeout)
            self.runs[-1][3] = what
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            lazy_umount(self.mnt)
            self.runs[-1][3] = f"hung after {what}"
            self.proc = None
            raise DaemonError(f"tierfs did not exit within {timeout}s after {what}\n"
                              f"{self.log(tail=200)}")
        finally:
            if self.proc is proc and proc.poll() is not None:
                self.proc = None

    def remount(self, **options):
        """Unmount (checking the daemon) and mount again over the same backing dir."""
        self.umount()
        return self.start(**options)

    def kill(self, sig=signal.SIGKILL, timeout=EXIT_TIMEOUT):
        """Signal the daemon and wait for it.  SIGKILL: the mount is detached
        (umount -l) and the death is not held against the daemon.  Other
        signals: the daemon must flush, unmount and exit 0."""
        require_daemon("kills the daemon")
        proc = self.proc
        assert proc is not None, "daemon not running"
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait()
            self.runs[-1][3] = "SIGKILL"
            self.proc = None
            lazy_umount(self.mnt)
            return
        self._wait_exit(proc, timeout, f"signal {signal.Signals(sig).name}")
        problems = self._run_problems(self.runs[-1])
        if is_mounted(self.mnt):
            lazy_umount(self.mnt)
            problems.append(f"mount still present after the daemon exited on "
                            f"{signal.Signals(sig).name}")
        if problems:
            raise DaemonError("\n".join(problems) + "\n" + self.log(tail=200))

    def wait_death(self, timeout=60):
        """Wait for the daemon to kill itself (a TIERFS_FAULT point) and detach
        the dead mount; its death is not held against it."""
        require_daemon("kills the daemon")
        proc = self.proc
        assert proc is not None, "daemon not running"
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.runs[-1][3] = "SIGKILL"
            self.proc = None
            lazy_umount(self.mnt)
            raise DaemonError(f"the daemon did not reach its fault point in {timeout}s\n"
                              f"{self.log(tail=50)}")
        self.runs[-1][3] = "SIGKILL"
        self.proc = None
        lazy_umount(self.mnt)
        return proc.returncode

    # -- checks
    def _run_problems(self, run):
        cmd, logpath, proc, how = run
        problems = []
        rc = proc.returncode
        if how == "start failed":
            return []                    # already raised by start()
        if how == "SIGKILL":
            pass
        elif rc is None:
            problems.append("daemon still running")
        elif rc < 0:
            problems.append(f"daemon died of signal {signal.Signals(-rc).name} ({how})")
        elif rc != 0:
            problems.append(f"daemon exited with status {rc} ({how})")
        try:
            with open(logpath, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            if SANITIZER_LOG.search(line):
                problems.append(f"sanitizer report in daemon log: {line}")
            elif ERROR_LOG.search(line) and not self.any_error_ok and \
                    not any(p.search(line) for p in self.expected):
                problems.append(f"unexpected error in daemon log: {line}")
        return problems

    def _check_run(self, run):
        problems = self._run_problems(run)
        if problems:
            raise DaemonError("\n".join(problems[:20]) + "\n" + self.log(tail=200))

    def finish(self):
        """Teardown: unmount if still mounted, return a list of problems."""
        if self.finished or self.plain:
            self.finished = True
            return []
        self.finished = True
        problems = []
        if self.proc is not None:
            try:
                self.umount()
            except DaemonError as e:
                return [str(e)]
        elif is_mounted(self.mnt):
            lazy_umount(self.mnt)
        for run in self.runs:
            problems += self._run_problems(run)
        if problems:
            return ["\n".join(problems[:20]) + "\n" + self.log(tail=200)]
        return []

    def __repr__(self):
        return f"<Mount {self.mnt} backing={self.backing} opts={format_options(self.options)}>"


# ---------------------------------------------------------------- data

def wait_released(m, timeout=60):
    """Until mount m has finished the releases of the files closed so far
    ("closes_pending" in user.tierfs.stats): the kernel sends a release
    after close(2) has returned, and the version a written-through file's
    last close makes due is queued only then.  (A handle whose descriptor
    was duplicated and is still open is not waited for past a grace of
    five seconds.)"""
    def pending():
        return json.loads(os.getxattr(m.mnt, "user.tierfs.stats")).get("closes_pending")
    wait_until(lambda: not pending(), lambda: f"the releases of closed files ({pending()})",
               timeout)


def wait_flushed(m, timeout=60):
    """Until mount m has no flush queued or running and no close whose
    release is not over (user.tierfs.stats: wait_released).  What waits
    for its age (-o flush_age) is asked for at each look."""
    def drained():
        os.setxattr(m.mnt, "user.tierfs.flush", b"")
        st = json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))
        s = st["ssd"]
        # flush_queued: a queued flush may have no bytes in the backlog (a
        # file truncated to 0, a journal record's apply)
        return s["flush_backlog"] == 0 and not s["flushes_running"] and not s["flush_queued"] \
            and not st.get("closes_pending")
    wait_until(drained, "the flush backlog to drain", timeout)


def rng_for(seed):
    return random.Random(seed)


def read_uncached(path):
    """The whole file, its kernel page cache dropped first (so that the read
    reaches the daemon and is served from a cache tier or the SSD)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        left, chunks = os.fstat(fd).st_size, []
        while True:         # the whole file in one read, as a rule: one copy
            b = os.read(fd, max(left, MiB))
            if not b:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.append(b)
            left -= len(b)
    finally:
        os.close(fd)


def randbytes(n, rng=None):
    if n == 0:
        return b""
    if rng is None:
        return os.urandom(n)
    if n >= MiB:
        # the same bytes for the same rng state, three times faster than
        # Random.randbytes (the tests write GiBs of them)
        return hashlib.shake_128(rng.getrandbits(128).to_bytes(16, "little")).digest(n)
    return rng.randbytes(n)


def sha(data):
    return hashlib.sha256(data).hexdigest()


def file_sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(4 * MiB)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def write_file(path, data, chunk=None, rng=None, mode=0o644):
    """Write `data` with os.write in chunks (random sizes when rng is given)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        pos = 0
        mv = memoryview(data)
        while pos < len(data):
            if rng is not None:
                n = rng.choice([1, 7, 512, 4096, 4097, 65536, 131072, 1 << 20])
            else:
                n = chunk or (1 << 20)
            pos += os.write(fd, mv[pos:pos + n])
    finally:
        os.close(fd)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def pread_all(fd, size):
    """Read exactly `size` bytes from offset 0 (short reads retried)."""
    out = bytearray()
    while len(out) < size:
        b = os.pread(fd, size - len(out), len(out))
        if not b:
            break
        out += b
    return bytes(out)


def assert_same(got, want, what="data"):
    """Compare two byte strings; report the first difference, not the bytes."""
    if got == want:
        return
    n = min(len(got), len(want))
    first = next((i for i in range(n) if got[i] != want[i]), n)
    raise AssertionError(f"{what}: length {len(got)} vs expected {len(want)}, first "
                         f"difference at offset {first} (sha {sha(got)[:12]} vs "
                         f"{sha(want)[:12]})")


def tree_snapshot(root, with_data=True):
    """{relpath: info} of a tree, skipping tierfs internals (.tierfs*)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".tierfs"))
        for name in sorted(dirnames + filenames):
            if name.startswith(".tierfs"):
                continue
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            info = {"mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid}
            if stat.S_ISREG(st.st_mode):
                info["size"] = st.st_size
                if with_data:
                    info["sha"] = file_sha(p)
            elif stat.S_ISLNK(st.st_mode):
                info["target"] = os.readlink(p)
            out[rel] = info
    return out


def tierfs_internals(root):
    """Paths under root whose name starts with .tierfs."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if name.startswith(".tierfs"):
                found.append(os.path.join(dirpath, name))
    return found


# ---------------------------------------------------------------- the journal

# BACKING/.tierfs.journal, as store/journal.h lays it out: each record a
# header (magic "TRJ1", type, header length, seq, payload length, XXH3-64 of
# the header with sum 0 and the payload), then the payload.
JOURNAL = ".tierfs.journal"
JNL_MAGIC, JNL_RETIRE, JNL_DELTA, JNL_REDO, JNL_NOTE = 0x314a5254, 1, 2, 3, 4
JNL_CLONE = 6
_JNL_HEAD = "<IHHQQQ"


_xxh3 = None


def _xxh3_64(data):
    global _xxh3
    if _xxh3 is None:
        _xxh3 = ctypes.CDLL("libxxhash.so.0").XXH3_64bits    # what tierfs links
        _xxh3.restype = ctypes.c_uint64
        _xxh3.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return _xxh3(data, len(data))


def journal_records(backing):
    """[(type, seq, payload)] of the whole, valid records of backing's
    journal, up to the first that is not ([] where there is none)."""
    try:
        with open(os.path.join(backing, JOURNAL), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    hl, off, out = struct.calcsize(_JNL_HEAD), 0, []
    while off + hl <= len(data):
        magic, typ, hlen, seq, ln, s = struct.unpack_from(_JNL_HEAD, data, off)
        payload = data[off + hl:off + hl + ln]
        if magic != JNL_MAGIC or hlen != hl or len(payload) != ln or \
                (out and seq != out[-1][1] + 1) or \
                _xxh3_64(struct.pack(_JNL_HEAD, magic, typ, hlen, seq, ln, 0) + payload) != s:
            break
        out.append((typ, seq, payload))
        off += hl + ln
    return out


def journal_append(backing, records):
    """Append records [(type, payload)] to backing's journal, whole and
    valid, their seqs following its last one."""
    have = journal_records(backing)
    seq = have[-1][1] if have else 0
    with open(os.path.join(backing, JOURNAL), "ab") as f:
        for typ, payload in records:
            seq += 1
            head = struct.pack(_JNL_HEAD, JNL_MAGIC, typ, struct.calcsize(_JNL_HEAD), seq,
                               len(payload), 0)
            s = _xxh3_64(head + payload)
            f.write(struct.pack(_JNL_HEAD, JNL_MAGIC, typ, struct.calcsize(_JNL_HEAD), seq,
                                len(payload), s) + payload)


def persist_notes(backing):
    """The persistent tier's records in backing's journal, in order:
    [(kind+flags, path, path2)]."""
    out = []
    for typ, _, payload in journal_records(backing):
        if typ == JNL_NOTE:
            parts = payload.split(b"\0")
            for i in range(0, len(parts) - 2, 3):
                out.append(tuple(x.decode() for x in parts[i:i + 3]))
    return out


# ---------------------------------------------------------------- syscalls

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_libc.fallocate.restype = ctypes.c_int

FALLOC_FL_KEEP_SIZE = 0x01


def fallocate(fd, offset, length, mode=0):
    """fallocate(2) itself (os.posix_fallocate would hide EOPNOTSUPP)."""
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


# ---------------------------------------------------------------- processes

def in_child(fn, *args, uid=None, gid=None, cwd_fd=None):
    """Run fn(*args) in a forked child; return (ok, traceback text).

    cwd_fd: fchdir there first (before dropping privileges, so that the
    child can reach a mount under a directory it could not traverse)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(r)
            if cwd_fd is not None:
                os.fchdir(cwd_fd)
            if gid is not None:
                os.setgroups([])
                os.setgid(gid)
            if uid is not None:
                os.setuid(uid)
            fn(*args)
            status = 0
        except BaseException:
            try:
                os.write(w, traceback.format_exc().encode())
            except BaseException:
                pass
        finally:
            os._exit(status)
    os.close(w)
    return _collect(pid, r)


def _collect(pid, r):
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    text = b"".join(chunks).decode(errors="replace")
    if not ok and not text:
        text = f"child status {status:#x}"
    return ok, text


def in_children(calls):
    """Run [(fn, args), ...] each in its own forked child, concurrently.

    Returns [(ok, text)] in order."""
    started = []
    for fn, args in calls:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.close(r)
                fn(*args)
                status = 0
            except BaseException:
                try:
                    os.write(w, traceback.format_exc().encode())
                except BaseException:
                    pass
            finally:
                os._exit(status)
        os.close(w)
        started.append((pid, r))
    return [_collect(pid, r) for pid, r in started]


def raise_nofile(n):
    """Raise RLIMIT_NOFILE to at least n; return the old limits."""
    import resource
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = old
    if soft != resource.RLIM_INFINITY and soft < n:
        if hard != resource.RLIM_INFINITY and hard < n:
            hard = n          # root may raise the hard limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    return old


def restore_nofile(old):
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, old)


def expect_errno(code, fn, *args, **kw):
    """Call fn and require an OSError with errno `code`."""
    try:
        fn(*args, **kw)
    except OSError as e:
        assert e.errno == code, f"{fn.__name__}: expected {errno.errorcode[code]}, " \
                                f"got {errno.errorcode.get(e.errno, e.errno)} ({e})"
        return e
    raise AssertionError(f"{fn.__name__}{args}: expected {errno.errorcode[code]}, "
                         f"but it succeeded")
