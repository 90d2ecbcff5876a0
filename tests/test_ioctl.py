"""The GPU zero-copy ioctl (tierfs-gpu(7)) and libtierfs.

Everywhere (no GPU needed): the ABI (struct size, command numbers) and the
daemon's checks that come before any GPU work, on a mount without a GPU
tier.  The daemon checks, in this order:

    FUSE_IOCTL_COMPAT (32-bit caller)                     ENOSYS
    a command other than PWRITE_GPU / PREAD_GPU           ENOTTY
        (a wrong-size struct is another command number)
    not a regular file (a directory)                      EINVAL
    PWRITE_GPU on an O_RDONLY fd, PREAD_GPU on O_WRONLY   EBADF
    no GPU tier in the mount                              ENODEV
    flags != 0, ranges that wrap, past INT64_MAX          EINVAL
    then the IPC handle (EINVAL, EXDEV) and the range in its allocation.

With a built libtierfs (.libs/libtierfs.so next to TIERFS_BIN): its checks
that need no GPU, through ctypes.

On a GPU machine (TIERFS_GPU=N): tests/gpu/test_ioctl, the C test program,
against a mount with a GPU tier: data paths, then a remount and a read back
from the SSD, then bad inputs on a fresh mount.  The program is found at
$TIERFS_BUILD/tests/gpu/test_ioctl or next to TIERFS_BIN.  The data paths
run again on a mount with -o gpu_share, where libtierfs maps the GPU cache
and copies itself (fs/tierfs_share.h); the share protocol's own failure
cases (spans never ended, clients that exit, ids that are wrong, users
that may not map the cache) are driven from Python.
"""

import errno
import functools
import fcntl
import json
import os
import random
import socket
import sys
import struct
import subprocess
import termios
import threading
import time

import pytest

import util

pytestmark = pytest.mark.daemon

# struct tierfs_gpu_io: handle[64], handle_off, len, file_off (u64), flags,
# device (u32); no padding.
GPU_IO = struct.Struct("=64sQQQII")

_IOC_WRITE = 1


def _iow(typ, nr, size):
    return (_IOC_WRITE << 30) | (size << 16) | (ord(typ) << 8) | nr


PWRITE_GPU = _iow("T", 1, GPU_IO.size)
PREAD_GPU = _iow("T", 2, GPU_IO.size)

# fs/tierfs_share.h (libtierfs <-> daemon, -o gpu_share)
GPU_SHARE = struct.Struct("=64sQiI")            # socket, cache_id, device
GPU_SPAN = struct.Struct("=QQQIIQQQQ")          # conn_id, file_off, len, flags,
                                                # -, cache_id, token, cache_off, n
SHARE_HELLO = struct.Struct("=IIiiQQQQQ")       # magic, version, err, device,
                                                # cache_id, conn_id, size, chunk, n
SHARE_BATCH = struct.Struct("=II")
SHARE_END = struct.Struct("=QiI")
SHARE_RESULT = struct.Struct("=q")
SPAN_WRITE = 1


def _ior(typ, nr, size):
    return (2 << 30) | (size << 16) | (ord(typ) << 8) | nr


def _iowr(typ, nr, size):
    return (3 << 30) | (size << 16) | (ord(typ) << 8) | nr


GPU_SHARE_CMD = _ior("T", 3, GPU_SHARE.size)
GPU_SPAN_CMD = _iowr("T", 4, GPU_SPAN.size)


def gpu_io(handle=b"\0" * 64, handle_off=0, length=4096, file_off=0, flags=0,
           device=0):
    return bytearray(GPU_IO.pack(handle, handle_off, length, file_off, flags, device))


def ioctl_errno(fd, cmd, buf):
    """The errno of a failing ioctl (None if it succeeded)."""
    try:
        fcntl.ioctl(fd, cmd, buf)
    except OSError as e:
        return e.errno
    return None


def test_abi():
    assert GPU_IO.size == 64 + 8 + 8 + 8 + 4 + 4 == 96
    assert PWRITE_GPU == 0x40605401
    assert PREAD_GPU == 0x40605402
    assert GPU_SHARE.size == 80 and GPU_SPAN.size == 64


def span(fd, conn_id, off, length, flags=0):
    """TIERFS_IOC_GPU_SPAN: (cache_id, token, cache_off, n)."""
    buf = bytearray(GPU_SPAN.pack(conn_id, off, length, flags, 0, 0, 0, 0, 0))
    fcntl.ioctl(fd, GPU_SPAN_CMD, buf)
    return GPU_SPAN.unpack(buf)[5:]


def assert_share_refused(path, code):
    """Both share ioctls on path fail with code."""
    fd = os.open(path, os.O_RDWR)
    try:
        assert ioctl_errno(fd, GPU_SHARE_CMD, bytearray(GPU_SHARE.size)) == code
        buf = bytearray(GPU_SPAN.pack(1, 0, 16, SPAN_WRITE, 0, 0, 0, 0, 0))
        assert ioctl_errno(fd, GPU_SPAN_CMD, buf) == code
    finally:
        os.close(fd)


def test_share_without_gpu_tier(mount):
    m = mount(gpu="none", gpu_share=True)
    p = os.path.join(m.mnt, "f")
    util.write_file(p, b"s" * 4096)
    assert_share_refused(p, errno.ENODEV)
    assert util.read_file(p) == b"s" * 4096


def test_errors_without_gpu_tier(mount):
    m = mount(gpu="none")
    p = os.path.join(m.mnt, "f")
    util.write_file(p, b"x" * 8192)

    fd = os.open(p, os.O_RDWR)
    try:
        # valid requests: no GPU tier
        assert ioctl_errno(fd, PWRITE_GPU, gpu_io()) == errno.ENODEV
        assert ioctl_errno(fd, PREAD_GPU, gpu_io()) == errno.ENODEV
        # ENODEV comes before the checks of the request's fields
        assert ioctl_errno(fd, PWRITE_GPU, gpu_io(flags=1)) == errno.ENODEV
        assert ioctl_errno(fd, PWRITE_GPU, gpu_io(length=0)) == errno.ENODEV
        # wrong size: another command number, so not ours
        assert ioctl_errno(fd, _iow("T", 1, 95), bytearray(95)) == errno.ENOTTY
        assert ioctl_errno(fd, _iow("T", 1, 97), bytearray(97)) == errno.ENOTTY
        assert ioctl_errno(fd, _iow("T", 3, 96), gpu_io()) == errno.ENOTTY
        # the tty ioctls that share the 'T' magic stay "not a tty"
        assert ioctl_errno(fd, termios.TCGETS, bytearray(64)) == errno.ENOTTY
        assert not os.isatty(fd)
    finally:
        os.close(fd)

    fd = os.open(p, os.O_RDONLY)
    try:
        assert ioctl_errno(fd, PWRITE_GPU, gpu_io()) == errno.EBADF
        assert ioctl_errno(fd, PREAD_GPU, gpu_io()) == errno.ENODEV
    finally:
        os.close(fd)

    fd = os.open(p, os.O_WRONLY)
    try:
        assert ioctl_errno(fd, PREAD_GPU, gpu_io()) == errno.EBADF
        assert ioctl_errno(fd, PWRITE_GPU, gpu_io()) == errno.ENODEV
    finally:
        os.close(fd)

    fd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert ioctl_errno(fd, PWRITE_GPU, gpu_io()) == errno.EINVAL
        assert ioctl_errno(fd, _iow("T", 3, 96), gpu_io()) == errno.ENOTTY
    finally:
        os.close(fd)

    # nothing happened to the file
    assert util.read_file(p) == b"x" * 8192


def build_dir():
    return os.environ.get("TIERFS_BUILD") or os.path.dirname(
        os.path.abspath(util.tierfs_bin()))


def libtierfs_path():
    for name in (".libs/libtierfs.so", "libtierfs.so"):
        path = os.path.join(build_dir(), name)
        if os.path.exists(path):
            return path
    pytest.skip(f"no libtierfs.so in {build_dir()}")


def sanitizer_preload(path):
    """The sanitizer runtimes a sanitizer build of the library needs loaded
    first (a plain python does not have them)."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    return [line.split("=>")[1].split()[0] for line in out.splitlines()
            if "=>" in line and ("libasan" in line or "libubsan" in line)]


# Runs in a child python, so that a sanitizer build of the library can have
# its runtime preloaded.  argv: library, file on tierfs, file elsewhere,
# the mount point.
LIBRARY_CHECKS = r"""
import ctypes, errno, os, sys
lib = ctypes.CDLL(sys.argv[1], use_errno=True)
lib.tierfs_pwrite_gpu.restype = ctypes.c_ssize_t
lib.tierfs_pwrite_gpu.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
lib.tierfs_pread_gpu.restype = ctypes.c_ssize_t
lib.tierfs_pread_gpu.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
lib.tierfs_is_tierfs.restype = ctypes.c_int
lib.tierfs_is_tierfs.argtypes = [ctypes.c_int]

def call(fn, *args):
    ctypes.set_errno(0)
    r = fn(*args)
    return r, ctypes.get_errno()

p, other, mnt = sys.argv[2:5]
fake = 0x7f0000001000          # no GPU memory here, whatever it is
fd = os.open(p, os.O_RDWR)
ofd = os.open(other, os.O_RDWR)
dfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
rofd = os.open(p, os.O_RDONLY)
assert lib.tierfs_is_tierfs(fd) == 1
assert lib.tierfs_is_tierfs(dfd) == 1
assert lib.tierfs_is_tierfs(ofd) == 0
assert call(lib.tierfs_is_tierfs, -1) == (-1, errno.EBADF)
# argument checks come first, then "is it tierfs?"
assert call(lib.tierfs_pwrite_gpu, fd, fake, 16, -1) == (-1, errno.EINVAL)
assert call(lib.tierfs_pwrite_gpu, ofd, fake, 16, 0) == (-1, errno.ENOTTY)
assert call(lib.tierfs_pread_gpu, ofd, fake, 16, 0) == (-1, errno.ENOTTY)
assert call(lib.tierfs_pwrite_gpu, -1, fake, 16, 0) == (-1, errno.EBADF)
# nothing to do
assert call(lib.tierfs_pwrite_gpu, fd, fake, 0, 0)[0] == 0
# a pointer that is not GPU memory: ENODEV without a CUDA driver, EINVAL with one
r, e = call(lib.tierfs_pwrite_gpu, fd, fake, 16, 0)
assert r == -1 and e in (errno.ENODEV, errno.EINVAL), (r, e)
r, e = call(lib.tierfs_pread_gpu, rofd, fake, 16, 0)
assert r == -1 and e in (errno.ENODEV, errno.EINVAL), (r, e)
for f in (fd, ofd, dfd, rofd):
    os.close(f)
print("library checks passed")
"""


def test_library_without_gpu(mount, tmp_path):
    path = libtierfs_path()
    m = mount(gpu="none")
    p = os.path.join(m.mnt, "f")
    util.write_file(p, b"y" * 4096)
    other = tmp_path / "not-tierfs"
    other.write_bytes(b"z")
    env = dict(os.environ)
    pre = sanitizer_preload(path)
    if pre:
        env["LD_PRELOAD"] = " ".join(pre)
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    r = subprocess.run([sys.executable, "-c", LIBRARY_CHECKS, path, p, str(other), m.mnt],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "library checks passed" in r.stdout
    assert util.read_file(p) == b"y" * 4096


# ---------------------------------------------------------------- GPU

def ioctl_program():
    prog = os.path.join(build_dir(), "tests", "gpu", "test_ioctl")
    if not os.access(prog, os.X_OK):
        pytest.fail(f"{prog} not built (make check TESTS= in a CUDA build)")
    return prog


def run_program(prog, mnt, mode, timeout=600):
    env = dict(os.environ)
    env.setdefault("TIERFS_GPU", util.GPU)
    r = subprocess.run([prog, mnt, mode], capture_output=True, text=True,
                       timeout=timeout, env=env)
    out = r.stdout + r.stderr
    print(out)
    if r.returncode == 77:
        pytest.skip(f"test_ioctl {mode}: skipped: {out.strip().splitlines()[-1:]}")
    assert r.returncode == 0, f"test_ioctl {mode} failed (rc {r.returncode}):\n{out}"
    return out


@pytest.mark.gpu
def test_gpu_ioctl_data(mount):
    prog = ioctl_program()
    m = mount()
    run_program(prog, m.mnt, "good")
    m.remount()                    # sizes/ now comes from the SSD
    run_program(prog, m.mnt, "verify")


@pytest.mark.gpu
def test_gpu_ioctl_bad_inputs(mount):
    prog = ioctl_program()
    # refused handles are logged; what matters is that the daemon survives
    # them, serves requests after them and exits cleanly
    m = mount(expect_errors=True)
    run_program(prog, m.mnt, "bad")
    p = os.path.join(m.mnt, "after")
    util.write_file(p, b"still fine")
    assert util.read_file(p) == b"still fine"


def stats(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))


@pytest.mark.gpu
def test_gpu_share_data(mount):
    """The same data checks with the client copying through the shared cache;
    the GPU tier's counters show the shared path carried them."""
    prog = ioctl_program()
    m = mount(gpu_share=True)
    run_program(prog, m.mnt, "good")
    g = stats(m)["tiers"]["gpu"]
    assert g["client_writes"] > 0 and g["client_reads"] > 0, g
    m.remount()
    run_program(prog, m.mnt, "verify")


@pytest.mark.gpu
def test_gpu_share_off_by_default(mount):
    prog = ioctl_program()
    m = mount()
    p = os.path.join(m.mnt, "f")
    util.write_file(p, b"d" * 4096)
    assert_share_refused(p, errno.EOPNOTSUPP)
    run_program(prog, m.mnt, "good")
    g = stats(m)["tiers"]["gpu"]
    assert g["client_writes"] == 0 and g["client_reads"] == 0, g


def share_info(fd, timeout=60):
    """TIERFS_IOC_GPU_SHARE, waiting while the cache is still mapped."""
    end = time.monotonic() + timeout
    while True:
        buf = bytearray(GPU_SHARE.size)
        try:
            fcntl.ioctl(fd, GPU_SHARE_CMD, buf)
        except OSError as e:
            if e.errno != errno.EAGAIN or time.monotonic() > end:
                raise
            time.sleep(0.1)
            continue
        name, cache_id, device, _ = GPU_SHARE.unpack(buf)
        return name.rstrip(b"\0"), cache_id, device


def share_connect(name):
    """Connect as libtierfs does; returns (socket, hello fields, chunk fds)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(b"\0" + name)
    hello = SHARE_HELLO.unpack(s.recv(SHARE_HELLO.size))
    fds = []
    if hello[2] == 0:
        while len(fds) < hello[8]:
            msg, anc, _, _ = s.recvmsg(SHARE_BATCH.size, socket.CMSG_SPACE(64 * 4))
            first, count = SHARE_BATCH.unpack(msg)
            assert first == len(fds)
            got = []
            for level, typ, data in anc:
                assert (level, typ) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
                got += list(struct.unpack(f"{len(data) // 4}i", data))
            assert len(got) == count
            fds += got
    return s, hello, fds


SHARE_END_NOREPLY = 1


def share_end(s, token, ok, flags=0):
    s.send(SHARE_END.pack(token, 1 if ok else 0, flags))
    if flags & SHARE_END_NOREPLY:
        return None
    return SHARE_RESULT.unpack(s.recv(SHARE_RESULT.size))[0]


@pytest.mark.gpu
def test_gpu_share_protocol(mount):
    """Spans that fail, are never ended, or come with wrong ids change no
    accepted data and block nothing for good."""
    m = mount(gpu_share=True, allow_other=True, expect_errors=True)
    p = os.path.join(m.mnt, "f")
    util.write_file(p, b"a" * 4096)
    os.chmod(p, 0o644)
    fd = os.open(p, os.O_RDWR)
    rofd = os.open(p, os.O_RDONLY)
    try:
        name, cache_id, device = share_info(fd)
        assert name.startswith(b"tierfs-share-") and device == int(util.GPU)
        s, hello, fds = share_connect(name)
        magic, version, err, hdev, hcache, conn, size, chunk, nchunks = hello
        assert (magic, version, err, hdev, hcache) == (0x48534654, 3, 0, device, cache_id)
        assert nchunks == (size + chunk - 1) // chunk == len(fds) and size > 0
        for f in fds:
            os.close(f)

        # wrong ids and bad requests
        with pytest.raises(OSError) as e:
            span(fd, conn ^ 1, 0, 16, SPAN_WRITE)
        assert e.value.errno == errno.ESTALE
        with pytest.raises(OSError) as e:
            span(rofd, conn, 0, 16, SPAN_WRITE)
        assert e.value.errno == errno.EBADF
        with pytest.raises(OSError) as e:
            span(fd, conn, 0, 16, 2)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(OSError) as e:
            span(fd, conn, 1 << 63, 16, SPAN_WRITE)
        assert e.value.errno == errno.EINVAL
        assert share_end(s, 12345, True) == -errno.EINVAL
        # reads at or past the end: nothing to copy, no span
        assert span(rofd, conn, 4096, 16) == (cache_id, 0, 0, 0)
        # a read span of cached bytes
        cid, token, off, n = span(rofd, conn, 100, 10000)
        assert (cid, n) == (cache_id, 3996) and token
        assert share_end(s, token, True) == 3996
        # a span ended late, after the worker that began it stopped
        # polling for its end: the socket thread ends it
        cid, token, off, n = span(rofd, conn, 0, 4096)
        assert n == 4096 and token
        time.sleep(0.05)
        assert share_end(s, token, True) == 4096
        # a read's end without an answer (version 2): it still unpins
        # the range, and the next end gets its own answer, not that one's
        cid, token, off, n = span(rofd, conn, 0, 4096)
        assert n == 4096 and token
        assert share_end(s, token, True, SHARE_END_NOREPLY) is None
        cid, token2, off, n = span(rofd, conn, 0, 100)
        assert n == 100 and token2 != token
        s.settimeout(5)
        assert share_end(s, token2, True) == 100
        s.settimeout(None)

        # a write span that fails: the size stays, and a write() to the
        # file waits for the span, then goes through
        cid, token, off, n = span(fd, conn, 4096, 8192, SPAN_WRITE)
        assert n == 8192 and token
        done = threading.Event()

        def posix_write():
            os.pwrite(fd, b"b" * 10, 0)
            done.set()

        t = threading.Thread(target=posix_write)
        t.start()
        assert not done.wait(0.5), "a write went ahead of an open span"
        assert share_end(s, token, False) == -errno.EIO
        t.join(30)
        assert done.is_set()
        assert os.stat(p).st_size == 4096
        assert util.read_file(p) == b"b" * 10 + b"a" * 4086

        # a span left open by a client that goes away: ended as failed
        cid, token, off, n = span(fd, conn, 4096, 4096, SPAN_WRITE)
        s.close()
        os.pwrite(fd, b"c" * 10, 0)        # would wait forever otherwise
        assert os.stat(p).st_size == 4096
        with pytest.raises(OSError) as e:   # that connection is gone
            span(fd, conn, 0, 16, SPAN_WRITE)
        assert e.value.errno == errno.ESTALE
    finally:
        os.close(fd)
        os.close(rofd)

    # another user may not map the cache (the mount is reached through a
    # directory fd: the test's own directories are root's alone)
    def other_user():
        f = os.open("f", os.O_RDONLY)
        try:
            fcntl.ioctl(f, GPU_SHARE_CMD, bytearray(GPU_SHARE.size))
        except OSError as e:
            assert e.errno == errno.EPERM, e
        else:
            raise AssertionError("uid 65534 got the share socket")
        finally:
            os.close(f)

    dfd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ok, tb = util.in_child(other_user, uid=65534, gid=65534, cwd_fd=dfd)
    finally:
        os.close(dfd)
    assert ok, tb
    assert util.read_file(p) == b"c" * 10 + b"a" * 4086


# ------------------------------------------------- vectored calls (no GPU)
#
# TIERFS_IOC_PWRITEV_GPU / PREADV_GPU and tierfs_pwritev_gpu/preadv_gpu,
# over the fake libcuda where there is no GPU (util.gpu_or_fake): its
# cuMemAlloc memory is a shared memfd mapping whose IPC handle the daemon
# opens, so the daemon-copy path runs end to end.  (The fake has no VMM
# export: -o gpu_share falls back to the ioctl there; tests/gpu/test_ioctl
# covers the shared path on a GPU.)

# struct tierfs_gpu_vec: nhandles, nsegs, flags, reserved (u32), moved (u64,
# out), reserved2 (u64); 128 handles of (handle[64], device, reserved); 192
# segments of (handle_off, len, file_off (u64), handle, flags (u32)); read
# and write commands: the daemon writes the struct back, the count in
# `moved`.  The earlier layouts (no moved/reserved2, 16 or 64 handles and
# 256 segments, write-only commands, the count as the result) are still
# taken.
VEC_HANDLES, VEC_SEGS, VEC_OLD_SEGS = 128, 192, 256
VEC_HEAD = struct.Struct("=IIIIQQ")
VEC_OLD_HEAD = struct.Struct("=IIII")
VEC_HANDLE = struct.Struct("=64sII")
VEC_SEG = struct.Struct("=QQQII")
LAYOUTS = ["now", 64, 16]       # today's, and the earlier ones by their room


def vec_room(layout):
    """(handles, segments) a layout holds."""
    return (VEC_HANDLES, VEC_SEGS) if layout == "now" else (layout, VEC_OLD_SEGS)


def vec_size(layout):
    head = VEC_HEAD if layout == "now" else VEC_OLD_HEAD
    room, segs = vec_room(layout)
    return head.size + room * VEC_HANDLE.size + segs * VEC_SEG.size


VEC_SIZE = vec_size("now")
PWRITEV_GPU = _iowr("T", 5, VEC_SIZE)
PREADV_GPU = _iowr("T", 6, VEC_SIZE)
VEC_OLD_CMDS = {n: (_iow("T", 5, vec_size(n)), _iow("T", 6, vec_size(n))) for n in (64, 16)}
GPU_IO_MAX = 1 << 30
GPU_VEC_MAX = 1 << 40


def test_vec_abi():
    assert (VEC_HANDLE.size, VEC_SEG.size) == (72, 32)
    assert (VEC_SIZE, vec_size(64), vec_size(16)) == (15392, 12816, 9360)
    assert PWRITEV_GPU == 0xfc205405 and PREADV_GPU == 0xfc205406
    assert VEC_OLD_CMDS[64] == (0x72105405, 0x72105406)
    assert VEC_OLD_CMDS[16] == (0x64905405, 0x64905406)


def gpu_vec(handles, segs, flags=0, nhandles=None, nsegs=None, layout="now", reserved2=0):
    """A struct tierfs_gpu_vec of `layout`: handles [(bytes, device)], segs
    [(handle_off, len, file_off, handle index, flags)]."""
    buf = bytearray(vec_size(layout))
    nh = len(handles) if nhandles is None else nhandles
    ns = len(segs) if nsegs is None else nsegs
    room, _ = vec_room(layout)
    if layout == "now":
        VEC_HEAD.pack_into(buf, 0, nh, ns, flags, 0, 0, reserved2)
        head = VEC_HEAD.size
    else:
        VEC_OLD_HEAD.pack_into(buf, 0, nh, ns, flags, 0)
        head = VEC_OLD_HEAD.size
    for i, (h, dev) in enumerate(handles):
        VEC_HANDLE.pack_into(buf, head + i * VEC_HANDLE.size, h, dev, 0)
    base = head + room * VEC_HANDLE.size
    for i, s in enumerate(segs):
        VEC_SEG.pack_into(buf, base + i * VEC_SEG.size, *s)
    return buf


def test_vec_errors_without_gpu_tier(mount):
    m = mount(gpu="none")
    p = os.path.join(m.mnt, "f")
    util.write_file(p, b"x" * 8192)
    fd = os.open(p, os.O_RDWR)
    rfd = os.open(p, os.O_RDONLY)
    try:
        good = gpu_vec([(b"\0" * 64, 0)], [(0, 4096, 0, 0, 0)])
        assert ioctl_errno(fd, PWRITEV_GPU, good) == errno.ENODEV
        assert ioctl_errno(fd, PREADV_GPU, good) == errno.ENODEV
        assert ioctl_errno(rfd, PWRITEV_GPU, good) == errno.EBADF
        dfd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert ioctl_errno(dfd, PWRITEV_GPU, good) in (errno.EINVAL, errno.ENOTTY)
        finally:
            os.close(dfd)
    finally:
        os.close(fd)
        os.close(rfd)
    assert util.read_file(p) == b"x" * 8192


@pytest.mark.parametrize("layout", LAYOUTS)
def test_vec_ioctl_checks(mount, monkeypatch, layout):
    """The daemon's checks of a vectored request, each before any byte
    moves: garbage handles are only opened once the list is sound.  The
    layouts of the earlier versions are checked the same way (their limit
    on the total is the int result's)."""
    m = mount(gpu=util.gpu_or_fake(monkeypatch), gpu_cache="32M", expect_errors=True)
    p = os.path.join(m.mnt, "f")
    util.write_file(p, b"o" * 65536)
    h = [(b"\0" * 64, 0)]
    PWRITEV_GPU, PREADV_GPU = ((globals()["PWRITEV_GPU"], globals()["PREADV_GPU"])
                               if layout == "now" else VEC_OLD_CMDS[layout])
    room, segs = vec_room(layout)
    most = GPU_VEC_MAX if layout == "now" else GPU_IO_MAX
    gpu_vec = functools.partial(globals()["gpu_vec"], layout=layout)
    fd = os.open(p, os.O_RDWR)
    try:
        cases = [
            (gpu_vec(h, [(0, 16, 0, 0, 0)], flags=1), errno.EINVAL),
            (gpu_vec(h, [], nsegs=0), errno.EINVAL),
            (gpu_vec(h, [(0, 16, 0, 0, 0)], nsegs=segs + 1), errno.EINVAL),
            (gpu_vec([], [(0, 16, 0, 0, 0)]), errno.EINVAL),
            (gpu_vec(h, [(0, 16, 0, 0, 0)], nhandles=room + 1), errno.EINVAL),
            (gpu_vec(h, [(0, 16, 0, 1, 0)]), errno.EINVAL),          # handle index
            (gpu_vec(h * 2, [(0, 16, 0, 0, 0)]), errno.EINVAL),      # unused handle
            (gpu_vec(h, [(0, 16, 0, 0, 2)]), errno.EINVAL),          # segment flags
            (gpu_vec(h, [(0, 16, 0, 0, 0), (0, 0, 64, 0, 0)]), errno.EINVAL),
            (gpu_vec(h, [(0, 16, 2**63 - 8, 0, 0)]), errno.EINVAL),
            (gpu_vec(h, [(2**64 - 8, 16, 0, 0, 0)]), errno.EINVAL),
            (gpu_vec(h, [(0, most, 0, 0, 0), (0, 1, most, 0, 0)]), errno.E2BIG),
            (gpu_vec(h, [(0, 16, 100, 0, 0), (64, 16, 0, 0, 0), (0, 16, 108, 0, 0)]),
             errno.EINVAL),                                         # overlap
            (gpu_vec(h, [(0, 16, 0, 0, 0)]), errno.EINVAL),          # garbage handle
        ]
        if layout == "now":
            cases += [(gpu_vec(h, [(0, 16, 0, 0, 0)], reserved2=1), errno.EINVAL),
                      # the old limit is no longer one: past it, the handle
                      (gpu_vec(h, [(0, GPU_IO_MAX, 0, 0, 0), (0, 1, GPU_IO_MAX, 0, 0)]),
                       errno.EINVAL)]
        for i, (buf, code) in enumerate(cases):
            assert ioctl_errno(fd, PWRITEV_GPU, buf) == code, i
        # reads may overlap: only the garbage handle is wrong
        buf = gpu_vec(h, [(0, 16, 100, 0, 0), (64, 16, 108, 0, 0)])
        assert ioctl_errno(fd, PREADV_GPU, buf) == errno.EINVAL
    finally:
        os.close(fd)
    assert util.read_file(p) == b"o" * 65536


# Runs in a child python (LD_LIBRARY_PATH reaches its loader: the fake
# libcuda where there is no GPU).  argv: mode, file on tierfs.
VEC_CHILD = r"""
import ctypes, errno, os, random, sys, threading, time
import tierfs

cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    assert r == 0, f"{what}: CUresult {r}"
ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
ck(cu.cuDeviceGet(ctypes.byref(dev), int(os.environ.get("TIERFS_GPU") or 0)), "cuDeviceGet")
ctx = ctypes.c_void_p()
ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

def alloc(n):
    p = ctypes.c_uint64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
    return p.value
def put(p, data):
    ck(cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(p), data, ctypes.c_size_t(len(data)), None), "htod")
    ck(cu.cuStreamSynchronize(None), "sync")
def get(p, n):
    b = ctypes.create_string_buffer(n)
    ck(cu.cuMemcpyDtoHAsync_v2(b, ctypes.c_uint64(p), ctypes.c_size_t(n), None), "dtoh")
    ck(cu.cuStreamSynchronize(None), "sync")
    return b.raw

def pread_all(fd, n):
    out = b""
    while len(out) < n:
        c = os.pread(fd, n - len(out), len(out))
        if not c:
            break
        out += c
    return out

def errno_of(fn, *a):
    try:
        fn(*a)
    except OSError as e:
        return e.errno
    return None

mode, path = sys.argv[1], sys.argv[2]
rng = random.Random(36)

def layout(nallocs, sizes, gap=0):
    # segments cut from nallocs allocations, laid out at shuffled file
    # offsets: [(ptr, n, off)], the expected file, the allocations
    allocs = [alloc(sum(sizes) + 4096) for _ in range(nallocs)]
    used = [0] * nallocs
    segs = []
    for i, n in enumerate(sizes):
        a = i % nallocs
        segs.append([allocs[a] + used[a], n])
        used[a] += n + 64 * (i % 3)       # gaps between tensors too
    order = list(range(len(segs)))
    rng.shuffle(order)
    off = 0
    for i in order:
        segs[i].append(off)
        off += segs[i][1] + gap
    size = off - gap
    want = bytearray(size)
    for p, n, o in segs:
        data = rng.randbytes(n)
        put(p, data)
        want[o:o + n] = data
    return [tuple(s) for s in segs], bytes(want), allocs

if mode == "data":
    sizes = [rng.choice([4, 256, 4096, 65536, 1000003, 3 << 20]) for _ in range(62)]
    segs, want, allocs = layout(3, sizes, gap=512)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    rng.shuffle(segs)
    assert tierfs.pwritev_gpu(fd, segs) == sum(sizes)
    got = pread_all(fd, len(want) + 10)
    exp = bytearray(len(want))            # the gaps are holes: zeros
    for p, n, o in segs:
        exp[o:o + n] = want[o:o + n]
    assert got == bytes(exp), "file differs from the segments"
    # read back into other buffers, another order
    dst = alloc(len(want))
    back = [(dst + o, n, o) for p, n, o in segs]
    rng.shuffle(back)
    assert tierfs.preadv_gpu(fd, back) == sum(sizes)
    for p, n, o in back:
        assert get(p, n) == want[o:o + n], f"segment at {o}"
    # overlapping reads are fine; past end of file reads short
    end = len(want)
    r = tierfs.preadv_gpu(fd, [(dst, 100, 0), (dst + 4096, 100, 50), (dst + 8192, 100, end - 40)])
    assert r == 240, r
    assert get(dst, 100) == exp[0:100] and get(dst + 4096, 100) == exp[50:150]
    os.close(fd)
    print("vec data passed")

elif mode == "many":
    # 700 segments from 80 allocations: several ioctls (192 segments, 128
    # allocations each)
    sizes = [rng.randrange(1, 3000) for _ in range(700)]
    segs, want, allocs = layout(80, sizes)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    assert tierfs.pwritev_gpu(fd, segs) == len(want)
    assert pread_all(fd, len(want) + 1) == want
    dst = alloc(len(want))
    back = [(dst + o, n, o) for p, n, o in segs]
    rng.shuffle(back)
    assert tierfs.preadv_gpu(fd, back) == len(want)
    assert get(dst, len(want)) == want
    os.close(fd)
    print("vec many passed")

elif mode == "bad":
    fd = os.open(path, os.O_RDWR)
    old = pread_all(fd, 1 << 22)
    a = alloc(1 << 16)
    b = alloc(1 << 16)
    put(a, b"A" * (1 << 16))
    host = ctypes.create_string_buffer(4096)
    hp = ctypes.addressof(host)
    big = 1 << 62
    cases = [
        ("overlap", [(a, 100, 0), (b, 100, 4000), (a + 200, 100, 4050)], errno.EINVAL),
        ("zero length", [(a, 100, 0), (b, 0, 200)], errno.EINVAL),
        ("host pointer in the middle", [(a, 100, 0), (hp, 100, 200), (b, 100, 400)],
         errno.EINVAL),
        ("null pointer", [(a, 100, 0), (0, 100, 200)], errno.EINVAL),
        ("leaves its allocation", [(a, 100, 0), (b + 60000, 8192, 200)], errno.EINVAL),
        ("negative offset", [(a, 100, -4096)], errno.EINVAL),
        ("past INT64_MAX", [(a, 100, 2**63 - 50)], errno.EINVAL),
        ("total past SSIZE_MAX", [(a, big, 0), (b, big, big), (a, big, 2 * big)],
         errno.EINVAL),
        ("empty list", [], errno.EINVAL),
        ("too many", [(a, 1, i) for i in range(65537)], errno.EINVAL),
    ]
    for what, segs, code in cases:
        assert errno_of(tierfs.pwritev_gpu, fd, segs) == code, what
        assert pread_all(fd, 1 << 22) == old, what + ": file changed"
    rfd = os.open(path, os.O_RDONLY)
    assert errno_of(tierfs.pwritev_gpu, rfd, [(a, 100, 0)]) == errno.EBADF
    assert errno_of(tierfs.preadv_gpu, fd, [(a, 100, 0), (hp, 100, 200)]) == errno.EINVAL
    assert errno_of(tierfs.preadv_gpu, fd, [(a, 0, 0)]) == errno.EINVAL
    assert pread_all(fd, 1 << 22) == old
    # the handle checks of the daemon come before any byte moves too: a
    # freed allocation's cached handle is re-exported (EINVAL, not data)
    os.close(rfd)
    os.close(fd)
    print("vec bad passed")

elif mode == "over":
    # 64 segments over a whole file, in reverse file order, then fsync
    n, seg = 64, 1 << 20
    src = alloc(n * seg)
    put(src, bytes([0x4e]) * (n * seg))
    fd = os.open(path, os.O_RDWR)
    assert tierfs.pwritev_gpu(fd, [(src + i * seg, seg, (n - 1 - i) * seg)
                                   for i in range(n)]) == n * seg
    os.fsync(fd)
    os.close(fd)
    print("vec over passed")

elif mode == "shadow":
    # a file written through whose shadow holds only what was written since
    # (the parent's set-up): read into GPU memory in pieces that cross from
    # its own ranges to the backing file's, against read(2)
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    want = pread_all(fd, size)
    dst = alloc(size)
    segs, off = [], 0
    while off < size:
        n = min(size - off, rng.choice([1, 4095, 65536, 1 << 20, 3 << 20]))
        segs.append((dst + off, n, off))
        off += n
    rng.shuffle(segs)
    for i in range(0, len(segs), 64):
        part = segs[i:i + 64]
        assert tierfs.preadv_gpu(fd, part) == sum(n for _, n, _ in part)
    for p, n, o in segs:
        assert get(p, n) == want[o:o + n], f"segment at {o}"
    os.close(fd)
    print("vec shadow passed")

elif mode == "kill":
    # a long vectored write (slow fake device copies) while another thread
    # fsyncs the file: the parent kills the daemon meanwhile
    n, seg = 64, 1 << 20
    src = alloc(n * seg)
    put(src, bytes([0x4e]) * (n * seg))
    segs = [(src + i * seg, seg, (n - 1 - i) * seg) for i in range(n)]
    fd = os.open(path, os.O_RDWR)
    stop = False
    def syncer():
        while not stop:
            try:
                os.fsync(fd)
            except OSError:
                return
    t = threading.Thread(target=syncer, daemon=True)
    t.start()
    print("writing", flush=True)
    try:
        tierfs.pwritev_gpu(fd, segs)
        print("written", flush=True)
    except OSError as e:
        print("failed", e.errno, flush=True)
    stop = True
    os._exit(0)
"""


def vec_child(mode, path, timeout=300, wait=True):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["TIERFS_LIB"] = libtierfs_path()
    env["PYTHONPATH"] = os.path.join(os.path.dirname(here), "python") + (
        ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TIERFS_GPU", util.GPU or "")
    pre = sanitizer_preload(env["TIERFS_LIB"])
    if pre:
        env["LD_PRELOAD"] = " ".join(pre)
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    args = [sys.executable, "-c", VEC_CHILD, mode, path]
    if not wait:
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"vec {mode} passed" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_vec_read_of_a_hard_linked_file_written_through(mount, monkeypatch):
    """A file of several names written through gets none of its content
    copied into its shadow: a read of it into GPU memory takes what was
    written since from the shadow and the rest from the backing file, in
    pieces that cross between the two (the daemon's device read path);
    byte-exact against read(2), and against the content written."""
    m = mount(gpu=util.gpu_or_fake(monkeypatch), gpu_cache="64M", host_cache="64M",
              flush_age="60000", dedup="off")
    rng = random.Random(37)
    path = os.path.join(m.mnt, "f")
    want = bytearray(rng.randbytes(3 << 20))
    util.write_file(path, bytes(want))
    fd = os.open(path, os.O_RDWR)
    os.fsync(fd)
    util.wait_flushed(m)
    os.link(path, os.path.join(m.mnt, "g"))
    for off, n in ((40 << 20, 4096), (1000, 5000), (2 << 20, 70000), (3 << 20, 123)):
        data = rng.randbytes(n)
        os.pwrite(fd, data, off)
        want.extend(bytes(max(0, off + n - len(want))))
        want[off:off + n] = data
    os.close(fd)
    st = stats(m)["ssd"]
    assert st["files_written_through"] == 1 and st["write_through_copy_bytes"] == 0, st
    vec_child("shadow", path)
    util.assert_same(util.read_file(os.path.join(m.mnt, "g")), bytes(want), "g")


@pytest.mark.parametrize("gpu_cache", ["64M", "4M"])
def test_vec_data(mount, monkeypatch, gpu_cache):
    """62 segments of state-dict-like sizes from 3 allocations, at shuffled
    file offsets with holes between them: written in one vectored call and
    read back with another order; byte-exact against read(2).  With a 4 MiB
    GPU cache the file lives in the host cache (copies to and from host
    memory)."""
    m = mount(gpu=util.gpu_or_fake(monkeypatch), gpu_cache=gpu_cache)
    vec_child("data", os.path.join(m.mnt, "sd"))
    # after a remount (from the SSD) the file is the same
    want = util.read_file(os.path.join(m.mnt, "sd"))
    m.remount()
    util.assert_same(util.read_file(os.path.join(m.mnt, "sd")), want, "after remount")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["data", "many"])
def test_vec_gpu_share(mount, mode):
    """The vectored calls through a shared GPU cache: the library copies in
    its own context, a list of ranges per span (TIERFS_IOC_GPU_SPANV), not
    a span per segment: 62 (700) segments take 1 (3) write spans and as
    many read spans, and the data is byte-exact."""
    m = mount(gpu_share=True, gpu_cache="256M")
    vec_child(mode, os.path.join(m.mnt, "sd"))
    g = stats(m)["tiers"]["gpu"]
    print("gpu tier counters:", g)
    assert 0 < g["client_writes"] <= (1 if mode == "data" else 3), g
    assert 0 < g["client_reads"] <= (3 if mode == "data" else 4), g
    want = util.read_file(os.path.join(m.mnt, "sd"))
    m.remount()
    util.assert_same(util.read_file(os.path.join(m.mnt, "sd")), want, "after remount")


def test_vec_many_segments(mount, monkeypatch):
    """More segments and allocations than one ioctl carries: split."""
    m = mount(gpu=util.gpu_or_fake(monkeypatch), gpu_cache="32M")
    vec_child("many", os.path.join(m.mnt, "many"))


def test_vec_bad_segments(mount, monkeypatch):
    m = mount(gpu=util.gpu_or_fake(monkeypatch), gpu_cache="32M", expect_errors=True)
    p = os.path.join(m.mnt, "f")
    util.write_file(p, util.randbytes(300000, util.rng_for(36)))
    vec_child("bad", p)


def test_vec_overwrite_reaches_the_backing_file_whole(mount, monkeypatch):
    """A vectored write over a file already on the SSD, fsynced: after a
    clean unmount the backing file holds every segment.  Each segment's
    change used to restart the file's set of changed ranges (the file was
    not dirty yet while the segments were noted), so the flush saw only
    the last: the journal recorded and applied 1 MiB of 64 (the dedup
    flush wrote as little)."""
    gpu = util.gpu_or_fake(monkeypatch)
    n, seg = 64, 1 << 20
    m = mount(gpu=gpu, gpu_cache="256M")
    p = os.path.join(m.mnt, "f")
    util.write_file(p, util.randbytes(n * seg, util.rng_for(38)))
    util.wait_flushed(m)
    vec_child("over", p)
    m.umount()
    with open(os.path.join(m.backing, "f"), "rb") as f:
        got = f.read()
    new = bytes([0x4e]) * (n * seg)
    assert got == new, (f"{sum(1 for i in range(0, len(got), seg) if got[i:i + seg] == new[:seg])}"
                        f" of {n} segments new in the backing file")


def test_vec_kill_during_write(mount, monkeypatch):
    """SIGKILL of the daemon during a long vectored write, while another
    thread fsyncs the file: after the restart the file is its old content
    or the whole new one, never a mix."""
    gpu = util.gpu_or_fake(monkeypatch)
    if not util.GPU:
        monkeypatch.setenv("TIERFS_FAKE_CUDA_DTOD_GBPS", "0.2")   # ~0.35 s
    n, seg = 64, 1 << 20
    m = mount(gpu=gpu, gpu_cache="256M", expect_errors=True)
    p = os.path.join(m.mnt, "f")
    old = util.randbytes(n * seg, util.rng_for(36))
    util.write_file(p, old)
    util.wait_flushed(m)
    child = vec_child("kill", p, wait=False)
    assert child.stdout.readline().strip() == "writing"
    time.sleep(0.15)
    m.kill()
    out = child.communicate(timeout=120)[0]
    m.start()
    got = util.read_file(p)
    print("child:", out.strip().replace("\n", "; "), "- file:",
          "old" if got == old else "new" if got == bytes([0x4e]) * (n * seg) else "mix")
    new = bytes([0x4e]) * (n * seg)
    assert got == old or got == new, (
        f"torn file after the kill ({out.strip()}): "
        f"{sum(1 for i in range(0, len(got), seg) if got[i:i + seg] == new[:seg])} "
        f"of {n} segments new")
