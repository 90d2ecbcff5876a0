"""The Python package tierfs (python/tierfs) against a real tierfs mount.

The package is imported from the source tree (python/), as an installed one
would be from the site directory.
"""

import errno
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

import util
from util import MiB, randbytes, read_file, write_file

sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
import tierfs  # noqa: E402


# ---------------------------------------------------------------- names (no mount)

@pytest.mark.parametrize("names, line, what", [
    (["a", "b/c"], 2, "'/'"),
    (["."], 1, "'.' and '..'"),
    (["x", "y", ".."], 3, "'.' and '..'"),
    ([".tierfs-x"], 1, ".tierfs"),
    (["a" * 256], 1, "255 bytes"),
    ([b"ok", b"\xff\xfe"], 2, "UTF-8"),
    (["a\0b"], 1, "NUL"),
    (["a\nb"], 1, "newline"),
    (["a", ""], 2, "empty"),
])
def test_check_names_rejects_what_the_daemon_rejects(names, line, what):
    with pytest.raises(tierfs.BadNameError) as ei:
        tierfs.check_names(names)
    e = ei.value
    assert e.line == line and e.errno == errno.EINVAL
    assert f"line {line}" in str(e) and what in str(e)
    assert isinstance(e, ValueError) and isinstance(e, OSError)


def test_check_names_accepts():
    long = "é" * 127                                      # 254 bytes
    assert tierfs.check_names(["a", "ckpt-0001", long, b"raw", ".hidden"]) == [
        b"a", b"ckpt-0001", long.encode(), b"raw", b".hidden"]


def test_not_tierfs(tmp_path):
    assert not tierfs.is_tierfs(str(tmp_path))
    assert not tierfs.is_tierfs(str(tmp_path / "missing"))
    with pytest.raises(tierfs.NotTierfsError) as ei:
        tierfs.restore_order(str(tmp_path), ["a"])
    assert str(tmp_path) in str(ei.value)
    with pytest.raises(tierfs.NotTierfsError):
        tierfs.stats(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        tierfs.stats(str(tmp_path / "missing"))


# ---------------------------------------------------------------- against a mount

@pytest.mark.daemon
def test_is_tierfs_and_mount_of(tfs):
    d = os.path.join(tfs.mnt, "d")
    os.mkdir(d)
    write_file(os.path.join(d, "f"), b"x")
    for p in (tfs.mnt, d, os.path.join(d, "f")):
        assert tierfs.is_tierfs(p)
        assert tierfs.mount_of(p) == os.path.realpath(tfs.mnt)
    assert not tierfs.is_tierfs(tfs.backing)


@pytest.mark.daemon
def test_restore_order_queues_and_context_clears(tfs):
    d = os.path.join(tfs.mnt, "run")
    os.mkdir(d)
    names = [f"ckpt-{i:03d}" for i in range(5)]
    with tierfs.prefetch(d, False):
        assert not tierfs.prefetch(d)
        for n in names:
            write_file(os.path.join(d, n), randbytes(MiB))
        with tierfs.restore_order(d, reversed(names)) as order:
            assert tierfs.queued(d) == names[::-1]
            assert len(order.names) == 5
            assert tierfs.stats(tfs.mnt)["prefetch"]["queue"] == 5
            read_file(os.path.join(d, names[-1]))         # consumes its entry
            assert tierfs.queued(d) == names[-2::-1]
        assert tierfs.queued(d) == []                     # the rest dropped
    assert tierfs.prefetch(d)                             # back to start


@pytest.mark.daemon
def test_bad_name_sends_nothing(tfs):
    d = os.path.join(tfs.mnt, "run")
    os.mkdir(d)
    os.mkdir(os.path.join(d, "sub"))
    with pytest.raises(tierfs.BadNameError) as ei:
        tierfs.restore_order(d, ["a", "b", "sub"])       # a directory
    assert ei.value.line == 3 and "not a regular file" in str(ei.value)
    with pytest.raises(tierfs.BadNameError) as ei:
        tierfs.restore_order(d, ["a", "../x"])
    assert ei.value.line == 2
    assert tierfs.queued(d) == []
    with pytest.raises(TypeError):
        tierfs.restore_order(d, "one string")


@pytest.mark.daemon
def test_long_list_is_sent_in_pieces(tfs):
    """More than the kernel's 64 KiB per value: several writes, one queue,
    listed back whole in pages (the plain attribute cannot hold it)."""
    d = tfs.mnt
    names = [f"{i:0200d}" for i in range(600)]           # ~120 KiB
    tierfs.restore_order(d, names)
    assert tierfs.stats(d)["prefetch"]["queue"] == 600
    with pytest.raises(OSError) as ei:
        os.getxattr(d, tierfs.XATTR_RESTORE_ORDER)
    assert ei.value.errno == errno.E2BIG
    assert tierfs.queued(d) == names
    tierfs.clear(d)
    assert tierfs.queued(d) == []


@pytest.mark.daemon
def test_restore_next_tier_state_wait_flushed(tfs):
    p = os.path.join(tfs.mnt, "f")
    data = randbytes(2 * MiB)
    write_file(p, data)
    assert tierfs.tier(p)[0] in ("gpu", "host")
    st = tierfs.state(p)
    assert list(st)[-1] == "ssd" and ("host" in st or "gpu" in st)
    assert tierfs.wait_flushed(p, timeout=60)
    assert tierfs.state(p)["ssd"] == "CURRENT"
    assert "ssd" in tierfs.tier(p)
    tierfs.restore_next(p)
    assert tierfs.queued(tfs.mnt) == ["f"]
    assert read_file(p) == data
    assert tierfs.queued(tfs.mnt) == []
    with pytest.raises(OSError) as ei:
        tierfs.tier(tfs.mnt)                              # a directory
    assert ei.value.errno == errno.ENODATA


@pytest.mark.daemon
def test_wait_flushed_mount(tfs):
    for i in range(4):
        write_file(os.path.join(tfs.mnt, f"g{i}"), randbytes(4 * MiB))
    assert tierfs.wait_flushed(tfs.mnt, timeout=120)
    s = tierfs.stats(tfs.mnt)
    assert s["ssd"]["flush_backlog"] == 0 and s["ssd"]["files_flushed"] >= 4
    # stats from a subdirectory finds the mount root
    os.mkdir(os.path.join(tfs.mnt, "sub"))
    assert "tiers" in tierfs.stats(os.path.join(tfs.mnt, "sub"))


@pytest.mark.daemon
def test_wait_flushed_times_out(tfs):
    """A file held open and rewritten has a copy that is not flushed."""
    p = os.path.join(tfs.mnt, "f")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 4096)
        if tierfs.state(p).get("ssd") == "CURRENT":
            pytest.skip("flushed while open")
        with pytest.raises(TimeoutError):
            tierfs.wait_flushed(p, timeout=0.2)
    finally:
        os.close(fd)
    assert tierfs.wait_flushed(p, timeout=60)


@pytest.mark.daemon
def test_daemon_pid(tfs):
    assert tierfs.daemon_pid(tfs.mnt) == tfs.proc.pid
    os.mkdir(os.path.join(tfs.mnt, "d"))
    assert tierfs.daemon_pid(os.path.join(tfs.mnt, "d")) == tfs.proc.pid


@pytest.mark.daemon
def test_daemon_pid_of_two_mounts(mount):
    a, b = mount(), mount()
    assert tierfs.daemon_pid(a.mnt) == a.proc.pid
    assert tierfs.daemon_pid(b.mnt) == b.proc.pid


@pytest.mark.daemon
def test_prefetch_context_restores_on_error(tfs):
    with pytest.raises(RuntimeError):
        with tierfs.prefetch(tfs.mnt, False):
            raise RuntimeError("boom")
    assert tierfs.prefetch(tfs.mnt)


@pytest.mark.daemon
def test_threads_share_a_mount(tfs):
    """The functions keep no state: threads may call them at once."""
    errors = []

    def work(k):
        try:
            d = os.path.join(tfs.mnt, f"t{k}")
            os.mkdir(d)
            names = [f"n{i}" for i in range(20)]
            tierfs.restore_order(d, names)
            assert tierfs.queued(d) == names
            tierfs.clear(d)
        except Exception as e:          # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def missing_fuse3_headers():
    """Why the libfuse 3 headers are not there to compile against (make
    install may rebuild the daemon), or None: `pkg-config --exists fuse3`
    and fuse_lowlevel.h in its include directories."""
    try:
        r = subprocess.run(["pkg-config", "--exists", "fuse3"], capture_output=True)
    except FileNotFoundError:
        return "no pkg-config"
    if r.returncode:
        return "pkg-config --exists fuse3 fails (no libfuse3-dev)"
    flags = subprocess.run(["pkg-config", "--cflags-only-I", "fuse3"], capture_output=True,
                           text=True).stdout.split()
    dirs = [f[2:] for f in flags if f.startswith("-I")] + ["/usr/include", "/usr/local/include"]
    if not any(os.path.isfile(os.path.join(d, "fuse_lowlevel.h")) for d in dirs):
        return f"no fuse_lowlevel.h in {' '.join(dirs)} (no libfuse3-dev)"
    return None


def test_make_install_puts_the_package_where_python_finds_it(tmp_path):
    """`make install` (DESTDIR) installs the package, tierfsctl and its man
    page; the installed tierfsctl finds the installed package."""
    build = os.path.dirname(util.tierfs_bin())
    if not os.path.isfile(os.path.join(util.REPO_DIR, "build-aux", "missing")):
        pytest.skip("the source tree is not bootstrapped (autoreconf): a build "
                    "directory carried without it")
    if not os.path.isfile(os.path.join(build, "Makefile")):
        pytest.skip("TIERFS_BIN is not in a configured build directory")
    why = missing_fuse3_headers()
    if why:
        pytest.skip(f"the libfuse 3 headers are missing ({why}): make install may "
                    f"compile the daemon")
    dest = str(tmp_path / "dest")
    r = subprocess.run(["make", "-s", "-C", build, "install-exec", "install-data",
                        f"DESTDIR={dest}"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    found = {}
    for root, _, files in os.walk(dest):
        for n in files:
            found.setdefault(n, []).append(os.path.join(root, n))
    assert "tierfsctl" in found and "tierfs-stat" in found and "tierfsctl.1" in found
    inits = [p for p in found["__init__.py"] if p.endswith("/tierfs/__init__.py")]
    assert len(inits) == 1, found["__init__.py"]
    pkgdir = os.path.dirname(os.path.dirname(inits[0]))
    tool = [p for p in found["tierfsctl"] if "/bin/" in p][0]
    with open(tool) as f:
        text = f.read()
    pythondir = pkgdir[len(dest):]
    assert f'PYTHONDIR = "{pythondir}"' in text
    # the installed tool, its PYTHONDIR pointed into DESTDIR
    local = str(tmp_path / "tierfsctl")
    with open(local, "w") as f:
        f.write(text.replace(f'"{pythondir}"', f'"{pkgdir}"'))
    r = subprocess.run([sys.executable, "-S", local, "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"tierfsctl {tierfs.__version__}", r


@pytest.mark.slow
@pytest.mark.parametrize("base", ["this", "path"])
def test_configure_python_installs_for_that_interpreter(tmp_path, base):
    """./configure PYTHON=X --prefix=P: the package goes where X imports
    from under P (here a virtual environment's site-packages, made from the
    Python running the tests or from python3 on PATH), and the installed
    tools run under X: their first line is #!X.  With a prefix X imports
    nothing from, configure says so."""
    if not os.path.isfile(os.path.join(util.REPO_DIR, "configure")):
        pytest.skip("the source tree is not bootstrapped (autoreconf)")
    if os.path.isfile(os.path.join(util.REPO_DIR, "config.status")):
        pytest.skip("the source tree is configured in place: no build beside it")
    why = missing_fuse3_headers()
    if why:
        pytest.skip(f"the libfuse 3 headers are missing ({why}): configure fails")
    interp = sys.executable
    if base == "path":
        interp = shutil.which("python3")
        # the same interpreter under another name (/usr/bin/python3 is a
        # link to python3.11): compare where both names lead
        if not interp or os.path.realpath(subprocess.run(
                [interp, "-c", "import sys; print(sys.executable)"], capture_output=True,
                text=True).stdout.strip()) == os.path.realpath(sys.executable):
            pytest.skip("python3 on PATH is the Python running the tests")
    venv = str(tmp_path / "venv")
    r = subprocess.run([interp, "-m", "venv", "--without-pip", venv],
                       capture_output=True, text=True, timeout=120)
    if r.returncode:
        pytest.skip(f"no venv from {interp}: {r.stderr.strip()}")
    py = os.path.join(venv, "bin", "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    build = tmp_path / "build"
    build.mkdir()
    # the second configure reuses the first one's tests of the compiler and
    # libraries (a configure costs a minute of a 2-core machine); what it
    # finds of the prefix and the interpreter's paths is not cached
    cache = f"--cache-file={tmp_path / 'config.cache'}"
    r = subprocess.run([os.path.join(util.REPO_DIR, "configure"), "--without-cuda", cache,
                        f"--prefix={venv}", f"PYTHON={py}"], cwd=build, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"^ +Python \.+ " + re.escape(py) + "$", r.stdout, re.M), r.stdout
    assert "WARNING" not in r.stderr, r.stderr
    r = subprocess.run(["make", "-s", "-C", str(build), "install-python"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    # that interpreter imports the installed package, from its site-packages
    r = subprocess.run([py, "-c", "import tierfs; print(tierfs.__file__)"], env=env,
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, timeout=60).stdout.strip()
    assert r.stdout.strip() == os.path.join(site, "tierfs", "__init__.py")
    # the installed tools run under it
    for name in ("tierfsctl", "tierfs-stat"):
        tool = os.path.join(venv, "bin", name)
        with open(tool) as f:
            assert f.readline() == f"#!{py}\n", name
    r = subprocess.run([os.path.join(venv, "bin", "tierfsctl"), "--version"], env=env,
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"tierfsctl {tierfs.__version__}", r
    # a prefix the interpreter does not import from: said, and the tools
    # still find the package there
    other = tmp_path / "other"
    build2 = tmp_path / "build2"
    build2.mkdir()
    r = subprocess.run([os.path.join(util.REPO_DIR, "configure"), "--without-cuda", cache,
                        f"--prefix={other}", f"PYTHON={py}"], cwd=build2, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"WARNING: {py} imports nothing under {other}" in r.stderr, r.stderr
    assert "NOT on that Python's path" in r.stdout
    r = subprocess.run(["make", "-s", "-C", str(build2), "install-python"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([str(other / "bin" / "tierfsctl"), "--version"], env=env,
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"tierfsctl {tierfs.__version__}", r


@pytest.mark.daemon
def test_evict_xattr(tfs):
    """user.tierfs.evict: EBUSY while the file's data is only in the cache
    is never seen here (evict() waits for the flush); on a directory
    EINVAL."""
    p = os.path.join(tfs.mnt, "f")
    data = randbytes(3 * MiB)
    write_file(p, data)
    tierfs.evict(p, timeout=60)
    assert tierfs.tier(p) == ["ssd"]
    assert read_file(p) == data
    with pytest.raises(OSError) as ei:
        os.setxattr(tfs.mnt, "user.tierfs.evict", b"")
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(OSError) as ei:
        os.getxattr(p, "user.tierfs.evict")
    assert ei.value.errno == errno.ENODATA


@pytest.mark.daemon
def test_evict_races_reads_writes_and_flushes(mount):
    """Evictions asked for over and over while files are written, flushed,
    prefetched and read: every read returns the file's data, and the
    backing directory ends up with every file."""
    m = mount(host_cache="16M")
    d = os.path.join(m.mnt, "race")
    os.mkdir(d)
    published = []
    lock = threading.Lock()
    done = threading.Event()
    errors = []

    def content(i):
        return util.randbytes(512 * 1024 + 4096 * (i % 7), util.rng_for(i))

    def writer():
        try:
            for i in range(60):
                p = os.path.join(d, f"w{i:03d}")
                write_file(p, content(i))
                if i % 3 == 0:
                    tierfs.restore_next(p)
                with lock:
                    published.append(i)
        except Exception as e:          # noqa: BLE001
            errors.append(e)
        finally:
            done.set()

    def reader(k):
        try:
            n = 0
            while not done.is_set() or n < 40:
                with lock:
                    have = list(published)
                if not have:
                    continue
                i = have[(n * 7 + k) % len(have)]
                got = read_file(os.path.join(d, f"w{i:03d}"))
                assert got == content(i), f"w{i:03d}: wrong data"
                n += 1
        except Exception as e:          # noqa: BLE001
            errors.append(e)

    evicted = []

    def evictor():
        try:
            while not done.is_set():
                for n in os.listdir(d):
                    try:
                        os.setxattr(os.path.join(d, n), "user.tierfs.evict", b"")
                        evicted.append(n)
                    except OSError as e:
                        assert e.errno == errno.EBUSY, e
        except Exception as e:          # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=writer), threading.Thread(target=evictor)] + \
        [threading.Thread(target=reader, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=600)
    assert not errors, errors
    assert evicted, "no eviction request succeeded"
    m.umount()
    for i in range(60):
        with open(os.path.join(m.backing, "race", f"w{i:03d}"), "rb") as f:
            assert f.read() == content(i), f"w{i:03d} in the backing directory"
