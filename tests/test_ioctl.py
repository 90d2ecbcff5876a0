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
$TIERFS_BUILD/tests/gpu/test_ioctl or next to TIERFS_BIN.
"""

import errno
import fcntl
import os
import sys
import struct
import subprocess
import termios

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
