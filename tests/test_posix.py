"""POSIX behaviour of a tierfs mount, checked with random contents and checksums.

Most tests also unmount at the end and check the backing directory, which must
hold a plain copy of what was written (names, contents, modes, owners, times,
xattrs, special files).
"""

import errno
import json
import mmap
import os
import random
import shutil
import socket
import stat
import subprocess
import threading
import time

import numpy as np
import pytest

import util
from util import KiB, MiB, assert_same, expect_errno, randbytes, read_file, sha, write_file

NOBODY = 65534


def j(*parts):
    return os.path.join(*parts)


# ------------------------------------------------------------ read / write

@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 65537, MiB + 13, 5 * MiB + 4321])
def test_create_write_read(tfs, size):
    rng = random.Random(size)
    data = randbytes(size, rng)
    p = j(tfs.mnt, "f")
    write_file(p, data, rng=rng)
    assert os.stat(p).st_size == size
    assert_same(read_file(p), data)
    # read back in odd-sized pieces through one fd
    fd = os.open(p, os.O_RDONLY)
    try:
        got = bytearray()
        while True:
            b = os.read(fd, rng.choice([1, 100, 4096, 70000]))
            if not b:
                break
            got += b
        assert_same(bytes(got), data)
        assert os.read(fd, 10) == b""            # at EOF
    finally:
        os.close(fd)
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "f")), data, "backing copy")


def test_many_small_files_roundtrip(tfs):
    rng = random.Random(7)
    files = {f"s{i:03d}": randbytes(rng.randrange(0, 20000), rng) for i in range(200)}
    for name, data in files.items():
        write_file(j(tfs.mnt, name), data)
    for name, data in files.items():
        assert_same(read_file(j(tfs.mnt, name)), data, name)
    tfs.umount()
    for name, data in files.items():
        assert_same(read_file(j(tfs.backing, name)), data, name)


def test_o_append(tfs):
    rng = random.Random(1)
    p = j(tfs.mnt, "log")
    first = randbytes(5000, rng)
    write_file(p, first)
    want = bytearray(first)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        for _ in range(50):
            chunk = randbytes(rng.randrange(1, 20000), rng)
            if rng.random() < 0.3:
                os.lseek(fd, 0, os.SEEK_SET)       # O_APPEND ignores the position
            os.write(fd, chunk)
            want += chunk
        assert os.fstat(fd).st_size == len(want)
    finally:
        os.close(fd)
    assert_same(read_file(p), bytes(want))
    # two appenders interleaved
    a = os.open(p, os.O_WRONLY | os.O_APPEND)
    b = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(40):
            chunk = randbytes(rng.randrange(1, 3000), rng)
            os.write(a if i % 2 else b, chunk)
            want += chunk
    finally:
        os.close(a)
        os.close(b)
    assert_same(read_file(p), bytes(want))
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "log")), bytes(want), "backing copy")


def test_o_trunc(tfs):
    rng = random.Random(2)
    p = j(tfs.mnt, "t")
    write_file(p, randbytes(3 * MiB, rng))
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0
        new = randbytes(100000, rng)
        os.write(fd, new)
    finally:
        os.close(fd)
    assert os.stat(p).st_size == len(new)
    assert_same(read_file(p), new)
    # O_TRUNC to nothing at all
    os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
    assert os.stat(p).st_size == 0
    assert read_file(p) == b""
    # and write again after an empty version
    write_file(p, new)
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "t")), new, "backing copy")


def test_pread_pwrite_random(tfs):
    rng = random.Random(3)
    p = j(tfs.mnt, "rw")
    model = bytearray(randbytes(2 * MiB, rng))
    write_file(p, bytes(model))
    fd = os.open(p, os.O_RDWR)
    try:
        for _ in range(400):
            off = rng.randrange(0, len(model) + 300000)
            n = rng.choice([1, 17, 4096, rng.randrange(1, 200000)])
            data = randbytes(n, rng)
            assert os.pwrite(fd, data, off) == n
            if off > len(model):
                model += bytes(off - len(model))
            model[off:off + n] = data
            if rng.random() < 0.5:
                roff = rng.randrange(0, len(model) + 1000)
                rn = rng.randrange(1, 300000)
                assert_same(os.pread(fd, rn, roff), bytes(model[roff:roff + rn]),
                            f"pread({rn}, {roff})")
        assert os.fstat(fd).st_size == len(model)
        assert_same(util.pread_all(fd, len(model)), bytes(model))
    finally:
        os.close(fd)
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "rw")), bytes(model), "backing copy")


def test_overwrite_keeps_rest(tfs):
    rng = random.Random(4)
    p = j(tfs.mnt, "o")
    data = bytearray(randbytes(4 * MiB, rng))
    write_file(p, bytes(data))
    for _ in range(5):
        fd = os.open(p, os.O_RDWR)          # no O_TRUNC: an overwrite in place
        off = rng.randrange(0, len(data) - 1000)
        patch = randbytes(rng.randrange(1, len(data) - off), rng)
        os.lseek(fd, off, os.SEEK_SET)
        os.write(fd, patch)
        os.close(fd)
        data[off:off + len(patch)] = patch
        assert os.stat(p).st_size == len(data)
        assert_same(read_file(p), bytes(data))
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "o")), bytes(data), "backing copy")


def test_sparse_holes_read_zeros(tfs):
    rng = random.Random(5)
    p = j(tfs.mnt, "sparse")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    model = bytearray()
    try:
        for off in [10 * MiB, 3 * MiB + 5, 100, 20 * MiB + 4096]:
            data = randbytes(rng.randrange(1, 9000), rng)
            os.pwrite(fd, data, off)
            if off + len(data) > len(model):
                model += bytes(off + len(data) - len(model))
            model[off:off + len(data)] = data
        # a hole at the end via lseek + write
        os.lseek(fd, 32 * MiB, os.SEEK_SET)
        os.write(fd, b"end")
        model += bytes(32 * MiB - len(model)) + b"end"
        assert os.fstat(fd).st_size == len(model)
        assert os.pread(fd, 4096, 5 * MiB) == bytes(4096)       # inside a hole
        assert os.pread(fd, 100, 0) == bytes(100)
    finally:
        os.close(fd)
    assert_same(read_file(p), bytes(model))
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "sparse")), bytes(model), "backing copy")


def test_truncate_up_and_down(tfs):
    rng = random.Random(6)
    p = j(tfs.mnt, "tr")
    model = bytearray(randbytes(MiB, rng))
    write_file(p, bytes(model))
    fd = os.open(p, os.O_RDWR)
    try:
        for size in [500000, 0, 4096, 3 * MiB + 7, 1, 2 * MiB, 2 * MiB, 12345]:
            if rng.random() < 0.5:
                os.ftruncate(fd, size)
            else:
                os.truncate(p, size)
            if size < len(model):
                del model[size:]
            else:
                model += bytes(size - len(model))
            assert os.fstat(fd).st_size == size
            assert os.stat(p).st_size == size
            assert_same(util.pread_all(fd, size + 10), bytes(model), f"after truncate {size}")
            # write past the new size and inside it
            data = randbytes(rng.randrange(1, 50000), rng)
            off = rng.randrange(0, size + 50000)
            os.pwrite(fd, data, off)
            if off + len(data) > len(model):
                model += bytes(off + len(data) - len(model))
            model[off:off + len(data)] = data
            assert_same(util.pread_all(fd, len(model) + 10), bytes(model), "after write")
        # truncate down then up must show zeros where the old data was
        os.ftruncate(fd, 100)
        os.ftruncate(fd, 200000)
        del model[100:]
        model += bytes(200000 - 100)
        assert_same(util.pread_all(fd, 200010), bytes(model), "down-up")
    finally:
        os.close(fd)
    assert_same(read_file(p), bytes(model))
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "tr")), bytes(model), "backing copy")


@pytest.mark.parametrize("how", ["ftruncate", "fallocate", "fallocate_small"])
def test_size_hint_before_writing(tfs, how):
    """Checkpoint writers often size a file first: ftruncate/fallocate, then write."""
    rng = random.Random(how)
    size = 6 * MiB + 1234
    data = randbytes(size, rng)
    p = j(tfs.mnt, "hint")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if how == "ftruncate":
            os.ftruncate(fd, size)
            hint = size
        elif how == "fallocate":
            util.fallocate(fd, 0, size)
            hint = size
        else:                                   # a hint smaller than what is written
            util.fallocate(fd, 0, MiB)
            hint = MiB
        assert os.fstat(fd).st_size == hint
        pos = 0
        while pos < size:
            n = min(rng.choice([4096, 65536, MiB]), size - pos)
            os.write(fd, data[pos:pos + n])
            pos += n
            assert os.fstat(fd).st_size == max(hint, pos)
    finally:
        os.close(fd)
    assert_same(read_file(p), data)
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "hint")), data, "backing copy")


def test_fallocate_ranges(tfs):
    p = j(tfs.mnt, "fa")
    rng = random.Random(8)
    data = randbytes(100000, rng)
    write_file(p, data)
    fd = os.open(p, os.O_RDWR)
    try:
        util.fallocate(fd, 50000, 10000)          # inside: nothing changes
        assert os.fstat(fd).st_size == 100000
        util.fallocate(fd, 90000, 200000)         # past EOF: grows, zeros
        assert os.fstat(fd).st_size == 290000
        assert_same(util.pread_all(fd, 300000), data + bytes(190000))
    finally:
        os.close(fd)


def test_copy_with_sendfile(tfs):
    rng = random.Random(9)
    data = randbytes(3 * MiB + 17, rng)
    write_file(j(tfs.mnt, "src"), data)
    shutil.copyfile(j(tfs.mnt, "src"), j(tfs.mnt, "dst"))     # sendfile / copy_file_range
    assert_same(read_file(j(tfs.mnt, "dst")), data)


# ------------------------------------------------------------ namespace

def test_rename(tfs):
    rng = random.Random(10)
    m = tfs.mnt
    a, b = randbytes(300000, rng), randbytes(200000, rng)
    write_file(j(m, "a"), a)
    write_file(j(m, "b"), b)
    os.rename(j(m, "a"), j(m, "b"))                     # over an existing file
    assert not os.path.exists(j(m, "a"))
    assert_same(read_file(j(m, "b")), a)
    os.mkdir(j(m, "d1"))
    os.mkdir(j(m, "d2"))
    os.rename(j(m, "b"), j(m, "d1", "x"))               # across directories
    assert_same(read_file(j(m, "d1", "x")), a)
    c = randbytes(5 * MiB, rng)
    write_file(j(m, "d1", "big"), c)
    os.makedirs(j(m, "d1", "sub", "deeper"))
    write_file(j(m, "d1", "sub", "deeper", "y"), b)
    os.rename(j(m, "d1"), j(m, "d2", "moved"))          # a directory with contents
    assert not os.path.exists(j(m, "d1"))
    assert_same(read_file(j(m, "d2", "moved", "x")), a)
    assert_same(read_file(j(m, "d2", "moved", "big")), c)
    assert_same(read_file(j(m, "d2", "moved", "sub", "deeper", "y")), b)
    os.mkdir(j(m, "empty"))
    os.rename(j(m, "empty"), j(m, "d2", "moved", "sub", "deeper", "e"))
    assert sorted(os.listdir(j(m, "d2", "moved", "sub", "deeper"))) == ["e", "y"]
    # a directory over an empty directory; over a non-empty one fails
    os.mkdir(j(m, "d3"))
    os.rename(j(m, "d3"), j(m, "d2", "moved", "sub", "deeper", "e"))
    os.mkdir(j(m, "d4"))
    expect_errno(errno.ENOTEMPTY, os.rename, j(m, "d4"), j(m, "d2", "moved"))
    os.rmdir(j(m, "d4"))
    # rename of an open file: the fd follows it
    fd = os.open(j(m, "d2", "moved", "x"), os.O_RDWR)
    try:
        os.rename(j(m, "d2", "moved", "x"), j(m, "x2"))
        os.pwrite(fd, b"HELLO", 0)
    finally:
        os.close(fd)
    a2 = b"HELLO" + a[5:]
    assert_same(read_file(j(m, "x2")), a2)
    want = util.tree_snapshot(m)
    tfs.umount()
    assert util.tree_snapshot(tfs.backing) == want
    assert_same(read_file(j(tfs.backing, "x2")), a2)


def test_rename_right_after_write_lands_under_new_name(tfs):
    """A rename while the data may still be flushing: the backing copy must end up
    under the new name only, with the complete data."""
    rng = random.Random(11)
    datas = {}
    for i in range(8):
        datas[i] = randbytes(rng.randrange(MiB, 6 * MiB), rng)
        write_file(j(tfs.mnt, f"tmp{i}"), datas[i])
        os.rename(j(tfs.mnt, f"tmp{i}"), j(tfs.mnt, f"ckpt{i}"))
    tfs.umount()
    names = sorted(n for n in os.listdir(tfs.backing) if not n.startswith(".tierfs"))
    assert names == [f"ckpt{i}" for i in range(8)]
    for i, d in datas.items():
        assert_same(read_file(j(tfs.backing, f"ckpt{i}")), d, f"ckpt{i}")


def test_unlink_open_file(tfs):
    rng = random.Random(12)
    p = j(tfs.mnt, "gone")
    data = randbytes(2 * MiB, rng)
    write_file(p, data)
    fd = os.open(p, os.O_RDWR)
    try:
        os.unlink(p)
        assert not os.path.exists(p)
        assert "gone" not in os.listdir(tfs.mnt)
        assert_same(util.pread_all(fd, len(data) + 1), data, "via fd after unlink")
        more = randbytes(300000, rng)
        os.pwrite(fd, more, len(data))                  # keeps working
        assert os.fstat(fd).st_size == len(data) + len(more)
        assert_same(util.pread_all(fd, len(data) + len(more)), data + more)
        # a new file with the same name is a different file
        write_file(p, b"new")
        assert read_file(p) == b"new"
        assert_same(util.pread_all(fd, len(data) + len(more)), data + more)
    finally:
        os.close(fd)
    assert read_file(p) == b"new"
    # a file written and unlinked while open never shows up in the backing dir
    fd = os.open(j(tfs.mnt, "scratch"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, randbytes(3 * MiB, rng))
        os.unlink(j(tfs.mnt, "scratch"))
        os.write(fd, randbytes(MiB, rng))
    finally:
        os.close(fd)
    tfs.umount()
    names = sorted(n for n in os.listdir(tfs.backing) if not n.startswith(".tierfs"))
    assert names == ["gone"]
    assert read_file(j(tfs.backing, "gone")) == b"new"


def test_renamed_over_while_open(tfs):
    rng = random.Random(13)
    m = tfs.mnt
    old, new = randbytes(MiB + 3, rng), randbytes(700000, rng)
    write_file(j(m, "x"), old)
    fd = os.open(j(m, "x"), os.O_RDWR)
    try:
        write_file(j(m, "y"), new)
        os.rename(j(m, "y"), j(m, "x"))
        assert_same(read_file(j(m, "x")), new, "name after rename")
        assert_same(util.pread_all(fd, len(old) + 1), old, "old fd")
        os.pwrite(fd, b"stale writer", 0)               # goes to the orphan only
        assert_same(read_file(j(m, "x")), new, "name after write via old fd")
    finally:
        os.close(fd)
    assert_same(read_file(j(m, "x")), new)
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "x")), new, "backing copy")
    assert sorted(n for n in os.listdir(tfs.backing) if not n.startswith(".tierfs")) == ["x"]


def test_dirs_and_readdir(tfs):
    m = tfs.mnt
    os.mkdir(j(m, "d"))
    expect_errno(errno.EEXIST, os.mkdir, j(m, "d"))
    names = set()
    for i in range(1500):
        n = f"entry-{i:05d}-" + "x" * (i % 40)
        names.add(n)
        if i % 10 == 0:
            os.mkdir(j(m, "d", n))
        else:
            os.close(os.open(j(m, "d", n), os.O_CREAT | os.O_WRONLY, 0o644))
    assert set(os.listdir(j(m, "d"))) == names
    with os.scandir(j(m, "d")) as it:
        for e in it:
            assert e.is_dir() == (int(e.name[6:11]) % 10 == 0), e.name
            assert e.is_file() != e.is_dir()
            assert not e.is_symlink()
    expect_errno(errno.ENOTEMPTY, os.rmdir, j(m, "d"))
    os.rmdir(j(m, "d", "entry-00000-"))
    expect_errno(errno.ENOENT, os.rmdir, j(m, "d", "entry-00000-"))
    expect_errno(errno.ENOTDIR, os.rmdir, j(m, "d", "entry-00001-x"))
    expect_errno(errno.EISDIR, os.unlink, j(m, "d", "entry-00010-" + "x" * 10))
    names.discard("entry-00000-")
    # readdir after removals and with a concurrent create
    for n in sorted(names)[:500]:
        p = j(m, "d", n)
        (os.rmdir if os.path.isdir(p) else os.unlink)(p)
        names.discard(n)
    assert set(os.listdir(j(m, "d"))) == names
    for n in list(names):
        p = j(m, "d", n)
        (os.rmdir if os.path.isdir(p) else os.unlink)(p)
    assert os.listdir(j(m, "d")) == []
    os.rmdir(j(m, "d"))
    assert not os.path.exists(j(m, "d"))


def test_error_codes(tfs):
    m = tfs.mnt
    write_file(j(m, "f"), b"x")
    os.mkdir(j(m, "dir"))
    expect_errno(errno.ENOENT, os.open, j(m, "nope"), os.O_RDONLY)
    expect_errno(errno.EEXIST, os.open, j(m, "f"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    expect_errno(errno.EISDIR, os.open, j(m, "dir"), os.O_WRONLY)
    expect_errno(errno.ENOTDIR, os.open, j(m, "f", "x"), os.O_RDONLY)
    expect_errno(errno.ENOENT, os.unlink, j(m, "nope"))
    expect_errno(errno.ENOENT, os.rename, j(m, "nope"), j(m, "n2"))
    expect_errno(errno.ENOTDIR, os.rename, j(m, "dir"), j(m, "f"))
    expect_errno(errno.EISDIR, os.rename, j(m, "f"), j(m, "dir"))
    expect_errno(errno.ENOENT, os.stat, j(m, "nope"))
    expect_errno(errno.EEXIST, os.symlink, "t", j(m, "f"))
    expect_errno(errno.EEXIST, os.link, j(m, "f"), j(m, "dir"))


def test_symlink_readlink(tfs):
    m = tfs.mnt
    data = randbytes(10000)
    os.mkdir(j(m, "d"))
    write_file(j(m, "d", "target"), data)
    os.symlink("d/target", j(m, "rel"))
    os.symlink("/nonexistent/dangling", j(m, "dangling"))
    os.symlink("d", j(m, "dirlink"))
    long_target = "a/" * 1000 + "b"
    os.symlink(long_target, j(m, "long"))
    assert os.readlink(j(m, "rel")) == "d/target"
    assert os.readlink(j(m, "dangling")) == "/nonexistent/dangling"
    assert os.readlink(j(m, "long")) == long_target
    assert stat.S_ISLNK(os.lstat(j(m, "rel")).st_mode)
    assert_same(read_file(j(m, "rel")), data)
    assert_same(read_file(j(m, "dirlink", "target")), data)
    assert not os.path.exists(j(m, "dangling"))
    assert os.path.lexists(j(m, "dangling"))
    # writing through the link writes the target
    with open(j(m, "rel"), "r+b") as f:
        f.write(b"via link")
    data = b"via link" + data[8:]
    assert_same(read_file(j(m, "d", "target")), data)
    tfs.umount()
    for name, t in [("rel", "d/target"), ("dangling", "/nonexistent/dangling"),
                    ("dirlink", "d"), ("long", long_target)]:
        assert os.readlink(j(tfs.backing, name)) == t
    assert_same(read_file(j(tfs.backing, "d", "target")), data)


def test_hard_links(tfs):
    rng = random.Random(14)
    m = tfs.mnt
    data = bytearray(randbytes(MiB, rng))
    write_file(j(m, "a"), bytes(data))
    os.mkdir(j(m, "sub"))
    os.link(j(m, "a"), j(m, "sub", "b"))
    sa, sb = os.stat(j(m, "a")), os.stat(j(m, "sub", "b"))
    assert sa.st_ino == sb.st_ino
    assert sa.st_nlink == sb.st_nlink == 2
    # write via one name, read via the other: open, then after close
    fa = os.open(j(m, "a"), os.O_RDWR)
    fb = os.open(j(m, "sub", "b"), os.O_RDONLY)
    try:
        for _ in range(20):
            off = rng.randrange(0, len(data) + 10000)
            patch = randbytes(rng.randrange(1, 20000), rng)
            os.pwrite(fa, patch, off)
            if off + len(patch) > len(data):
                data += bytes(off + len(patch) - len(data))
            data[off:off + len(patch)] = patch
            assert_same(util.pread_all(fb, len(data) + 1), bytes(data), "via other name")
    finally:
        os.close(fa)
        os.close(fb)
    assert_same(read_file(j(m, "sub", "b")), bytes(data))
    os.link(j(m, "sub", "b"), j(m, "c"))
    assert os.stat(j(m, "a")).st_nlink == 3
    os.unlink(j(m, "a"))
    assert os.stat(j(m, "c")).st_nlink == 2
    assert_same(read_file(j(m, "c")), bytes(data))
    tail = randbytes(5000, rng)
    with open(j(m, "c"), "ab") as f:
        f.write(tail)
    data += tail
    tfs.umount()
    # the backing copy keeps the link (one inode, both names, new content)
    sb, sc = os.stat(j(tfs.backing, "sub", "b")), os.stat(j(tfs.backing, "c"))
    assert_same(read_file(j(tfs.backing, "sub", "b")), bytes(data), "backing sub/b")
    assert_same(read_file(j(tfs.backing, "c")), bytes(data), "backing c")
    assert sb.st_ino == sc.st_ino and sb.st_nlink == 2
    assert not os.path.exists(j(tfs.backing, "a"))
    tfs.start()
    assert os.stat(j(tfs.mnt, "c")).st_nlink == 2
    with open(j(tfs.mnt, "c"), "r+b") as f:
        f.write(b"after remount")
    assert read_file(j(tfs.mnt, "sub", "b"))[:13] == b"after remount"


def test_chmod_chown_utimens(tfs):
    rng = random.Random(15)
    m = tfs.mnt
    data = randbytes(2 * MiB, rng)
    write_file(j(m, "f"), data)
    os.mkdir(j(m, "d"))
    os.chmod(j(m, "f"), 0o640)
    os.chown(j(m, "f"), 1234, 5678)
    os.chmod(j(m, "d"), 0o1750)
    os.chown(j(m, "d"), 4321, 8765)
    atime_ns, mtime_ns = 1_000_000_000_123_456_789, 1_100_000_000_987_654_321
    os.utime(j(m, "f"), ns=(atime_ns, mtime_ns))
    st = os.stat(j(m, "f"))
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    assert st.st_mtime_ns == mtime_ns and st.st_atime_ns == atime_ns
    sd = os.stat(j(m, "d"))
    assert stat.S_IMODE(sd.st_mode) == 0o1750 and (sd.st_uid, sd.st_gid) == (4321, 8765)
    # fchmod/fchown on an open fd; times set right after a write must stick
    # even if the data is flushed to the SSD later.
    fd = os.open(j(m, "g"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
        os.fchmod(fd, 0o604)
        os.fchown(fd, 111, 222)
        os.utime(fd, ns=(atime_ns, mtime_ns))
    finally:
        os.close(fd)
    sg = os.stat(j(m, "g"))
    assert stat.S_IMODE(sg.st_mode) == 0o604 and (sg.st_uid, sg.st_gid) == (111, 222)
    assert sg.st_mtime_ns == mtime_ns
    # symlink times (utimensat AT_SYMLINK_NOFOLLOW) are loose: not checked
    # a write moves mtime forward from an old value
    os.utime(j(m, "f"), ns=(atime_ns, mtime_ns))
    with open(j(m, "f"), "r+b") as f:
        f.write(b"touch")
    assert os.stat(j(m, "f")).st_mtime_ns > mtime_ns
    os.utime(j(m, "f"), ns=(atime_ns, mtime_ns))
    tfs.umount()
    for name, mode, uid, gid in [("f", 0o640, 1234, 5678), ("g", 0o604, 111, 222),
                                 ("d", 0o1750, 4321, 8765)]:
        st = os.stat(j(tfs.backing, name))
        assert stat.S_IMODE(st.st_mode) == mode, name
        assert (st.st_uid, st.st_gid) == (uid, gid), name
    for name in ["f", "g"]:
        st = os.stat(j(tfs.backing, name))
        assert st.st_mtime_ns == mtime_ns, name
        assert st.st_atime_ns == atime_ns, name
    assert_same(read_file(j(tfs.backing, "f")), b"touch" + data[5:])


@pytest.mark.parametrize("option", [None, "noatime", "strictatime"])
def test_atime_follows_mount_option(mount, option):
    """Reads served from the cache set the access time as the mount's atime
    option says: relatime by default (when atime <= mtime, or a day old),
    never with noatime, on every read open with strictatime."""
    m = mount(**({option: True} if option else {}))
    p = j(m.mnt, "a")
    write_file(p, b"hello" * 1000)
    old = 1_000_000_000 * 10**9
    os.utime(p, ns=(old, old + 10**9))                 # atime < mtime
    assert os.stat(p).st_atime_ns == old               # an explicit atime is kept

    def atime_after_read(timeout=5.0):
        read_file(p)                                    # set at release: async
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = os.stat(p)
            if st.st_atime_ns != before:
                return st.st_atime_ns
            time.sleep(0.02)
        return os.stat(p).st_atime_ns

    before = old
    got = atime_after_read(timeout=1.0 if option == "noatime" else 5.0)
    if option == "noatime":
        assert got == old
        return
    assert got > old + 10**9                           # now: newer than mtime
    # relatime: atime is newer than mtime now, so another read leaves it
    before = got
    again = atime_after_read(timeout=1.0 if option is None else 5.0)
    if option is None:
        assert again == got
    else:
        assert again > got                             # strictatime: every time


def test_reads_by_tierfs_itself_leave_the_access_time(mount):
    """tierfs keeps the access time itself (test_atime_follows_mount_option);
    its own reads of a backing file (a prefetch, a read that missed the
    caches, the copy of a file's unchanged bytes into its next version) must
    not move it.  They did: the backing file system saw an ordinary read and,
    with atime older than mtime, set atime to the time of that read
    (test_chmod_chown_utimens failed now and then when a fetch ran after its
    last utime)."""
    old = 1_000_000_000 * 10**9
    m = mount(host_cache="16M")
    names = ("prefetched", "missed", "rewritten")
    for n in names:
        write_file(j(m.mnt, n), randbytes(4 * MiB, random.Random(n)))
    m.umount()
    m = mount(backing=m.backing, host_cache="16M", noatime=True)
    for n in names:     # atime < mtime: relatime would move it at any read
        os.utime(j(m.mnt, n), ns=(old, old + 10**9))
    # a prefetch by restore order, no read by the user
    os.setxattr(m.mnt, "user.tierfs.restore_order", b"prefetched\n")
    deadline = time.monotonic() + 30
    while "host" not in os.getxattr(j(m.mnt, "prefetched"), "user.tierfs.state").decode():
        assert time.monotonic() < deadline, "never prefetched"
        time.sleep(0.02)
    # a read that misses the caches (noatime: the user's read moves nothing)
    read_file(j(m.mnt, "missed"))
    # a change of 5 bytes: the rest of the next version is read from the last
    with open(j(m.mnt, "rewritten"), "r+b") as f:
        f.write(b"touch")
    os.utime(j(m.mnt, "rewritten"), ns=(old, old + 10**9))
    for n in names:
        assert os.stat(j(m.mnt, n)).st_atime_ns == old, n
    m.umount()
    for n in names:
        st = os.stat(j(m.backing, n))
        assert (st.st_atime_ns, st.st_mtime_ns) == (old, old + 10**9), n


def test_statfs(tfs):
    s = os.statvfs(tfs.mnt)
    assert s.f_bsize > 0 and s.f_frsize > 0
    assert s.f_blocks > 0
    assert 0 <= s.f_bavail <= s.f_bfree <= s.f_blocks
    assert s.f_namemax >= 255
    fd = os.open(tfs.mnt, os.O_RDONLY)
    try:
        assert os.fstatvfs(fd).f_blocks == s.f_blocks
    finally:
        os.close(fd)


def test_user_xattrs(tfs):
    rng = random.Random(16)
    m = tfs.mnt
    write_file(j(m, "f"), randbytes(100000, rng))
    os.mkdir(j(m, "d"))
    # within ext4's room for a file's xattrs (one 4 KiB block and the
    # inode's spare bytes), which the file's inode number shares
    # (user.tierfs.ino, about 32 bytes)
    big = randbytes(3900, rng)
    for p in [j(m, "f"), j(m, "d")]:
        os.setxattr(p, "user.one", b"1")
        os.setxattr(p, "user.bin", b"\0\xff\0binary\n")
        os.setxattr(p, "user.big", big)
        os.setxattr(p, "user.empty", b"")
        assert os.getxattr(p, "user.one") == b"1"
        assert os.getxattr(p, "user.bin") == b"\0\xff\0binary\n"
        assert os.getxattr(p, "user.big") == big
        assert os.getxattr(p, "user.empty") == b""
        assert {"user.one", "user.bin", "user.big", "user.empty"} <= set(os.listxattr(p))
        expect_errno(errno.ENODATA, os.getxattr, p, "user.missing")
        expect_errno(errno.EEXIST, os.setxattr, p, "user.one", b"2", os.XATTR_CREATE)
        expect_errno(errno.ENODATA, os.setxattr, p, "user.missing", b"2", os.XATTR_REPLACE)
        os.setxattr(p, "user.one", b"replaced", os.XATTR_REPLACE)
        assert os.getxattr(p, "user.one") == b"replaced"
        os.removexattr(p, "user.empty")
        expect_errno(errno.ENODATA, os.removexattr, p, "user.empty")
        expect_errno(errno.ENODATA, os.getxattr, p, "user.empty")
        assert "user.empty" not in os.listxattr(p)
    # through an fd; then new data after the xattr: the flushed version keeps it
    fd = os.open(j(m, "f"), os.O_RDWR)
    try:
        os.setxattr(fd, "user.fd", b"via fd")
        assert os.getxattr(fd, "user.fd") == b"via fd"
        os.pwrite(fd, randbytes(2 * MiB, rng), 0)
    finally:
        os.close(fd)
    tfs.umount()
    for p in [j(tfs.backing, "f"), j(tfs.backing, "d")]:
        assert os.getxattr(p, "user.one") == b"replaced"
        assert os.getxattr(p, "user.big") == big
        assert os.getxattr(p, "user.bin") == b"\0\xff\0binary\n"
        expect_errno(errno.ENODATA, os.getxattr, p, "user.empty")
    assert os.getxattr(j(tfs.backing, "f"), "user.fd") == b"via fd"


def test_fsync_fdatasync_reach_backing(tfs):
    """fsync/fdatasync return once the data is durable: the backing file holds it
    while the file system is still mounted."""
    rng = random.Random(17)
    p = j(tfs.mnt, "durable")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        data = randbytes(5 * MiB, rng)
        os.write(fd, data)
        os.fsync(fd)
        assert_same(read_file(j(tfs.backing, "durable")), data, "backing after fsync")
        patch = randbytes(100000, rng)
        os.pwrite(fd, patch, 12345)
        data = data[:12345] + patch + data[12345 + len(patch):]
        os.fdatasync(fd)
        # a change this small (2% of the file) is durable as a journal
        # record when fdatasync returns (-o journal_pct; test_journal.py
        # kills and cuts the power there); a flusher writes it into the
        # backing file itself after
        util.wait_until(lambda: read_file(j(tfs.backing, "durable")) == data,
                        "the journalled change applied to the backing file", 30, 0.05)
        os.fsync(fd)                                       # nothing dirty: fine too
    finally:
        os.close(fd)
    # fsync through a read-only fd and on a directory
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(tfs.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    # a file written and closed, fsync'ed through a fresh fd
    q = j(tfs.mnt, "later")
    d2 = randbytes(3 * MiB, rng)
    write_file(q, d2)
    fd = os.open(q, os.O_WRONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    assert_same(read_file(j(tfs.backing, "later")), d2, "backing after late fsync")


def test_mmap_read_and_shared_write(tfs):
    rng = random.Random(18)
    p = j(tfs.mnt, "mm")
    data = bytearray(randbytes(3 * MiB + 100, rng))
    write_file(p, bytes(data))
    with open(p, "rb") as f:
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            assert_same(mm[:], bytes(data), "mmap read")
            assert mm[5 * 4096:5 * 4096 + 10] == data[5 * 4096:5 * 4096 + 10]
    with open(p, "r+b") as f:
        with mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED) as mm:
            for _ in range(50):
                off = rng.randrange(0, len(data))
                patch = randbytes(min(rng.randrange(1, 100000), len(data) - off), rng)
                mm[off:off + len(patch)] = patch
                data[off:off + len(patch)] = patch
            mm.flush()
            # coherent with read() through another fd
            assert_same(read_file(p), bytes(data), "read() after msync")
            more = randbytes(4096, rng)
            mm[:4096] = more
            data[:4096] = more
        # munmap without msync: the data still reaches the file
    assert_same(read_file(p), bytes(data), "after munmap")
    # write() then mmap read sees it
    with open(p, "r+b") as f:
        f.write(b"written")
        f.flush()
        data[:7] = b"written"
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            assert mm[:7] == b"written"
    tfs.umount()
    assert_same(read_file(j(tfs.backing, "mm")), bytes(data), "backing copy")


def test_mmap_coherent_with_read_and_write(tfs):
    """A shared mapping and read()/write() through other descriptors see each
    other without msync, as on a local filesystem (reads and writes bypass
    the page cache where the kernel allows it: the kernel must still keep
    them coherent with mapped pages)."""
    p = j(tfs.mnt, "co")
    write_file(p, bytes(64 * KiB))
    fd = os.open(p, os.O_RDWR)
    try:
        with mmap.mmap(fd, 0, flags=mmap.MAP_SHARED) as mm:
            mm[100:105] = b"hello"                  # a store, no msync
            assert read_file(p)[100:105] == b"hello"
            wfd = os.open(p, os.O_WRONLY)
            try:
                assert os.pwrite(wfd, b"world", 200) == 5
            finally:
                os.close(wfd)
            assert mm[200:205] == b"world"
            os.pwrite(fd, b"again", 300)            # the mapped descriptor
            assert mm[300:305] == b"again"
    finally:
        os.close(fd)
    data = read_file(p)
    assert (data[100:105], data[200:205], data[300:305]) == (b"hello", b"world", b"again")


def test_writes_move_mtime(tfs):
    """Every kind of handle moves the modification time on write."""
    p = j(tfs.mnt, "t")
    write_file(p, b"x")
    old = 1_000_000_000_000_000_000
    for flags in (os.O_WRONLY | os.O_APPEND, os.O_RDWR, os.O_WRONLY | os.O_TRUNC):
        os.utime(p, ns=(old, old))
        fd = os.open(p, flags)
        try:
            os.write(fd, b"more")
        finally:
            os.close(fd)
        assert os.stat(p).st_mtime_ns > old, f"flags {flags:#o}"


def test_preferred_io_size(tfs):
    """st_blksize is 1 MiB, so stdio and cp move files in large calls."""
    p = j(tfs.mnt, "b")
    write_file(p, b"x")
    assert os.stat(p).st_blksize == MiB


def test_numpy_memmap_roundtrip(tfs):
    p = j(tfs.mnt, "arr.f64")
    n = 1_000_003
    want = np.random.default_rng(19).standard_normal(n)
    a = np.memmap(p, dtype=np.float64, mode="w+", shape=(n,))
    a[:] = want
    a.flush()
    del a
    assert os.stat(p).st_size == n * 8
    np.testing.assert_array_equal(np.fromfile(p, dtype=np.float64), want)
    b = np.memmap(p, dtype=np.float64, mode="r+", shape=(n,))
    b[1000:2000] = -1.0
    b.flush()
    del b
    want[1000:2000] = -1.0
    c = np.memmap(p, dtype=np.float64, mode="r", shape=(n,))
    np.testing.assert_array_equal(np.asarray(c), want)
    del c
    tfs.umount()
    np.testing.assert_array_equal(np.fromfile(j(tfs.backing, "arr.f64"), dtype=np.float64),
                                  want)


def test_setgid_directory_inheritance(tfs):
    m = tfs.mnt
    os.mkdir(j(m, "sg"))
    os.chown(j(m, "sg"), 0, 4242)
    os.chmod(j(m, "sg"), 0o2775)
    assert os.stat(j(m, "sg")).st_mode & stat.S_ISGID
    write_file(j(m, "sg", "f"), b"data")
    os.mkdir(j(m, "sg", "sub"))
    os.mknod(j(m, "sg", "fifo"), 0o644 | stat.S_IFIFO)
    os.symlink("f", j(m, "sg", "ln"))
    for name in ["f", "sub", "fifo"]:
        assert os.stat(j(m, "sg", name)).st_gid == 4242, name
    assert os.lstat(j(m, "sg", "ln")).st_gid == 4242
    assert os.stat(j(m, "sg", "sub")).st_mode & stat.S_ISGID      # subdirs inherit the bit
    assert not os.stat(j(m, "sg", "f")).st_mode & stat.S_ISGID
    tfs.umount()
    for name in ["f", "sub", "fifo"]:
        assert os.stat(j(tfs.backing, "sg", name)).st_gid == 4242, name
    assert os.stat(j(tfs.backing, "sg", "sub")).st_mode & stat.S_ISGID


def test_special_files(tfs):
    m = tfs.mnt
    os.mkfifo(j(m, "fifo"), 0o640)
    assert stat.S_ISFIFO(os.stat(j(m, "fifo")).st_mode)
    # data through the fifo (served by the kernel, not the file system)
    got = []

    def reader():
        with open(j(m, "fifo"), "rb") as f:
            got.append(f.read())
    t = threading.Thread(target=reader)
    t.start()
    with open(j(m, "fifo"), "wb") as f:
        f.write(b"through the pipe")
    t.join(30)
    assert got == [b"through the pipe"]

    # a unix socket bound inside the mount (relative path: sun_path is short)
    cwd = os.getcwd()
    os.chdir(m)
    try:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind("sock")
        srv.listen(1)
        cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        cli.connect("sock")
        conn, _ = srv.accept()
        cli.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        for s in (conn, cli, srv):
            s.close()
    finally:
        os.chdir(cwd)
    assert stat.S_ISSOCK(os.stat(j(m, "sock")).st_mode)

    # device nodes (root): created, not opened (FUSE mounts are nodev)
    os.mknod(j(m, "null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(j(m, "loop"), 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    os.mknod(j(m, "fifo2"), 0o600 | stat.S_IFIFO)
    sc, sb = os.stat(j(m, "null")), os.stat(j(m, "loop"))
    assert stat.S_ISCHR(sc.st_mode) and sc.st_rdev == os.makedev(1, 3)
    assert stat.S_ISBLK(sb.st_mode) and sb.st_rdev == os.makedev(7, 200)
    assert stat.S_ISFIFO(os.stat(j(m, "fifo2")).st_mode)
    tfs.umount()
    b = tfs.backing
    assert stat.S_ISFIFO(os.stat(j(b, "fifo")).st_mode)
    assert stat.S_IMODE(os.stat(j(b, "fifo")).st_mode) == 0o640
    assert stat.S_ISSOCK(os.stat(j(b, "sock")).st_mode)
    sc, sb = os.stat(j(b, "null")), os.stat(j(b, "loop"))
    assert stat.S_ISCHR(sc.st_mode) and sc.st_rdev == os.makedev(1, 3)
    assert stat.S_ISBLK(sb.st_mode) and sb.st_rdev == os.makedev(7, 200)


# ------------------------------------------------------------ permissions

def _as_nobody_checks():
    """Runs as nobody with cwd at the mount root."""
    def eacces(fn, *args):
        try:
            fn(*args)
        except PermissionError:
            return
        raise AssertionError(f"{fn.__name__}{args} did not fail with EACCES")
    assert os.getuid() == NOBODY
    eacces(os.open, "secret", os.O_RDONLY)
    eacces(os.open, "secret", os.O_WRONLY)
    eacces(os.open, "public", os.O_WRONLY)
    with open("public", "rb") as f:
        assert f.read() == b"everyone may read this"
    eacces(os.open, "rootdir/new", os.O_CREAT | os.O_WRONLY, 0o644)
    eacces(os.unlink, "rootdir/file")
    eacces(os.listdir, "privdir")
    eacces(os.chmod, "public", 0o777)              # not the owner: EPERM is a PermissionError
    with open("shared/mine", "wb") as f:
        f.write(b"by nobody")
    st = os.stat("shared/mine")
    assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)
    os.chmod("shared/mine", 0o600)                 # the owner may


def test_permissions_other_user(mount, tmp_path):
    m = mount(allow_other=True, default_permissions=True)
    mn = m.mnt
    write_file(j(mn, "secret"), b"root only", mode=0o600)
    os.chmod(j(mn, "secret"), 0o600)
    write_file(j(mn, "public"), b"everyone may read this")
    os.chmod(j(mn, "public"), 0o644)
    os.mkdir(j(mn, "rootdir"), 0o755)
    os.chmod(j(mn, "rootdir"), 0o755)
    write_file(j(mn, "rootdir", "file"), b"x")
    os.mkdir(j(mn, "privdir"))
    os.chmod(j(mn, "privdir"), 0o700)
    os.mkdir(j(mn, "shared"))
    os.chmod(j(mn, "shared"), 0o777)
    os.chmod(mn, 0o755)
    dfd = os.open(mn, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ok, out = util.in_child(_as_nobody_checks, uid=NOBODY, gid=NOBODY, cwd_fd=dfd)
    finally:
        os.close(dfd)
    assert ok, out
    assert read_file(j(mn, "shared", "mine")) == b"by nobody"
    m.umount()
    st = os.stat(j(m.backing, "shared", "mine"))
    assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(j(m.backing, "secret")).st_mode) == 0o600


# A file capability (security.capability, VFS_CAP_REVISION_2: cap_net_raw=ep).
FILE_CAP = bytes([1, 0, 0, 2, 0, 32] + [0] * 14)


def _change_as_nobody(how):
    if how == "write":
        with open("f", "ab") as f:
            f.write(b"more")
    elif how == "truncate":
        os.truncate("f", 1)
    else:                                          # "O_TRUNC"
        os.close(os.open("f", os.O_WRONLY | os.O_TRUNC))


@pytest.mark.parametrize("cache", ["direct", "writeback"])
def test_changes_clear_set_id_bits_and_capabilities(mount, cache):
    """A write, truncate or O_TRUNC open by a user without CAP_FSETID clears
    the set-user-ID bit and the set-group-ID bit of a group-executable file
    (not of a group-inexecutable one); root's keep them; any write removes
    security.capability.  Through the mount and in the backing directory."""
    opts = {} if cache == "direct" else dict(writeback=True, no_direct_writes=True,
                                             no_direct_reads=True)
    m = mount(allow_other=True, default_permissions=True, **opts)
    f = j(m.mnt, "f")
    write_file(f, b"x")
    os.chown(f, NOBODY, NOBODY)
    os.chmod(m.mnt, 0o755)
    dfd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for how in ("write", "truncate", "O_TRUNC"):
            for before, after in ((0o4755, 0o755), (0o2775, 0o775), (0o6775, 0o775),
                                  (0o2745, 0o2745)):
                os.chmod(f, before)
                ok, out = util.in_child(_change_as_nobody, how, uid=NOBODY, gid=NOBODY,
                                        cwd_fd=dfd)
                assert ok, out
                got = stat.S_IMODE(os.stat(f).st_mode)
                assert got == after, f"{how} of a {before:o} file: {got:o}, not {after:o}"
                if not m.plain:
                    got = stat.S_IMODE(os.stat(j(m.backing, "f")).st_mode)
                    assert got == after, f"{how} of {before:o}: backing {got:o}"
    finally:
        os.close(dfd)
    # root (CAP_FSETID) keeps the bits
    os.chmod(f, 0o4755)
    with open(f, "ab") as fp:
        fp.write(b"root")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o4755
    # a capability goes with any write, root's too, and every time
    for _ in range(2):
        os.setxattr(f, "security.capability", FILE_CAP)
        assert os.getxattr(f, "security.capability") == FILE_CAP
        with open(f, "ab") as fp:
            fp.write(b"root")
        expect_errno(errno.ENODATA, os.getxattr, f, "security.capability")
    m.umount()
    if not m.plain:
        expect_errno(errno.ENODATA, os.getxattr, j(m.backing, "f"), "security.capability")
        assert stat.S_IMODE(os.stat(j(m.backing, "f")).st_mode) == 0o4755


# ------------------------------------------------------------ scale / concurrency

def test_thousands_of_open_files(tfs):
    n = 3000
    old = util.raise_nofile(n + 200)
    fds = []
    try:
        rng = random.Random(20)
        datas = [randbytes(rng.randrange(0, 5000), rng) for _ in range(n)]
        for i in range(n):
            fds.append(os.open(j(tfs.mnt, f"f{i:04d}"), os.O_RDWR | os.O_CREAT, 0o644))
        for fd, d in zip(fds, datas):
            os.write(fd, d)
        for fd, d in zip(reversed(fds), reversed(datas)):
            assert_same(util.pread_all(fd, len(d) + 1), d)
        for fd in fds:
            os.close(fd)
        fds = []
        for i in range(n):
            fds.append(os.open(j(tfs.mnt, f"f{i:04d}"), os.O_RDONLY))
        for i in rng.sample(range(n), n):
            assert_same(util.pread_all(fds[i], len(datas[i]) + 1), datas[i], f"f{i:04d}")
        for fd in fds:
            os.close(fd)
        fds = []
    finally:
        for fd in fds:
            os.close(fd)
        util.restore_nofile(old)
    tfs.umount()
    for i in range(0, n, 37):
        assert_same(read_file(j(tfs.backing, f"f{i:04d}")), datas[i])


def _writer_reader(mnt, wid, nfiles, seed):
    """Write own files with seeded random content, then read everyone's."""
    rng = random.Random(seed * 1000 + wid)
    for k in range(nfiles):
        data = randbytes(rng.randrange(1, 3 * MiB), rng)
        name = j(mnt, f"w{wid}", f"f{k}")
        write_file(name, data, rng=rng)
        with open(name + ".tmp", "w") as f:        # others read .sha files: publish atomically
            f.write(sha(data))
        os.rename(name + ".tmp", name + ".sha")
        got = read_file(name)
        assert sha(got) == sha(data), f"{name}: read back differs"
    # read what the others have finished so far (and own again)
    for other in os.listdir(mnt):
        for fn in os.listdir(j(mnt, other)):
            if fn.endswith(".sha"):
                with open(j(mnt, other, fn)) as f:
                    want = f.read()
                assert sha(read_file(j(mnt, other, fn[:-4]))) == want, f"{other}/{fn}"


def test_concurrent_processes(tfs):
    nproc, nfiles = 4, 6
    for w in range(nproc):
        os.mkdir(j(tfs.mnt, f"w{w}"))
    res = util.in_children([(_writer_reader, (tfs.mnt, w, nfiles, 1)) for w in range(nproc)])
    for ok, out in res:
        assert ok, out
    _check_sha_tree(tfs.mnt)
    tfs.umount()
    _check_sha_tree(tfs.backing)


def _writer_reader_threads(mnt, nthreads, nfiles):
    """nthreads threads of _writer_reader in mnt/w0.., at once."""
    for w in range(nthreads):
        os.mkdir(j(mnt, f"w{w}"))
    errors = []

    def run(w):
        try:
            _writer_reader(mnt, w, nfiles, 2)
        except BaseException as e:           # noqa: BLE001
            errors.append(f"thread {w}: {e!r}")
    threads = [threading.Thread(target=run, args=(w,)) for w in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_concurrent_threads(tfs):
    _writer_reader_threads(tfs.mnt, 6, 4)
    _check_sha_tree(tfs.mnt)


def test_concurrent_readers_one_file(tfs):
    """Many readers of one big file at random offsets while it is being flushed."""
    rng = random.Random(21)
    data = randbytes(24 * MiB, rng)
    write_file(j(tfs.mnt, "big"), data)
    errors = []

    def run(seed):
        r = random.Random(seed)
        fd = os.open(j(tfs.mnt, "big"), os.O_RDONLY)
        try:
            for _ in range(200):
                off = r.randrange(0, len(data))
                n = r.randrange(1, 512 * KiB)
                if os.pread(fd, n, off) != data[off:off + n]:
                    errors.append(f"mismatch at {off}+{n}")
        finally:
            os.close(fd)
    threads = [threading.Thread(target=run, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


def _check_sha_tree(root):
    n = 0
    for dirpath, _, files in os.walk(root):
        for fn in files:
            if fn.endswith(".sha"):
                with open(j(dirpath, fn)) as f:
                    want = f.read()
                assert util.file_sha(j(dirpath, fn[:-4])) == want, j(dirpath, fn)
                n += 1
    assert n > 0


# ------------------------------------------------------------ daemon only

@pytest.mark.daemon
def test_tierfs_internals_hidden(mount, tmp_path):
    backing = str(tmp_path / "bk")
    os.makedirs(backing)
    write_file(j(backing, "visible"), b"v")
    write_file(j(backing, ".tierfs-leftover.123"), b"internal")
    os.mkdir(j(backing, "d"))
    write_file(j(backing, "d", ".tierfs.tmp"), b"internal")
    m = mount(backing=backing)
    assert sorted(os.listdir(m.mnt)) == ["d", "visible"]
    assert os.listdir(j(m.mnt, "d")) == []
    assert read_file(j(m.mnt, "visible")) == b"v"
    assert not os.path.lexists(j(m.mnt, ".tierfs-leftover.123"))


@pytest.mark.daemon
def test_stats_xattr(tfs):
    write_file(j(tfs.mnt, "f"), randbytes(MiB))
    read_file(j(tfs.mnt, "f"))
    stats = os.getxattr(tfs.mnt, "user.tierfs.stats")
    assert len(stats) > 0
    stats.decode()                                                # text


def test_flush_stage_seconds(tfs):
    """user.tierfs.stats' ssd.seconds: where the flushes spent their time;
    an fsynced file was flushed, so its version's sync and commit took time,
    and the whole flush at least their sum (no clone: no dedup here)."""
    def secs():
        return json.loads(os.getxattr(tfs.mnt, "user.tierfs.stats"))["ssd"]["seconds"]
    t0 = secs()
    path = j(tfs.mnt, "staged")
    with open(path, "wb") as f:
        f.write(randbytes(4 * MiB))
        os.fsync(f.fileno())
    t1 = secs()
    d = {k: t1[k] - t0[k] for k in t1}
    assert d["sync"] > 0 and d["commit"] > 0, d
    assert d["total"] >= d["sync"] + d["commit"] + d["clone"], d


@pytest.mark.daemon
def test_mount_is_fuse(tfs):
    with open("/proc/self/mountinfo") as f:
        lines = [ln for ln in f if f" {os.path.realpath(tfs.mnt)} " in ln]
    assert lines, "mount not in mountinfo"
    assert " - fuse" in lines[-1], lines[-1]


@pytest.mark.parametrize("poll_us", [0, 5000])
def test_request_polling(mount, poll_us):
    """-o poll_us: with a worker polling for requests (5 ms, so that it is
    still polling when the next request comes, even on a small machine) and
    without, concurrent writers and readers get their data back, through the
    mount and from the backing directory."""
    m = mount(poll_us=poll_us)
    _writer_reader_threads(m.mnt, 4, 4)
    for i in range(200):                     # small requests, back to back
        p = j(m.mnt, f"s{i}")
        write_file(p, i.to_bytes(4, "little") * 100)
        assert os.stat(p).st_size == 400
        assert read_file(p) == i.to_bytes(4, "little") * 100
    _check_sha_tree(m.mnt)
    m.umount()
    _check_sha_tree(m.backing)


@pytest.mark.parametrize("value", ["-5", "100001", "x"])
def test_bad_poll_us_refused(tmp_path, value):
    """A poll_us out of range (or not a number) stops the start with a
    message that names the option; nothing is mounted."""
    backing, mnt = tmp_path / "b", tmp_path / "m"
    backing.mkdir()
    mnt.mkdir()
    r = subprocess.run([util.tierfs_bin(), str(backing), str(mnt), "-f", "-o",
                        f"poll_us={value},gpu=none"], capture_output=True, text=True,
                       timeout=30)
    try:
        assert r.returncode != 0
        assert "poll_us" in r.stderr, r.stderr
        assert not util.is_mounted(str(mnt))
    finally:
        util.lazy_umount(str(mnt))


def test_flushes_leave_the_directory_times(tfs):
    """A flush replaces a file's backing version under its name (a new
    inode renamed over the old one), which is no change of the directory as
    the user sees it: the mtime of the file's directory and of the mount's
    root stay what they were, through the mount and in the backing
    directory after unmount.  A create in the directory still moves it."""
    m = tfs.mnt
    rng = random.Random(31)
    d = j(m, "d")
    os.mkdir(d)
    f = j(d, "f")
    write_file(f, randbytes(2 * MiB, rng))
    fd = os.open(f, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    past = 1_200_000_000_000_000_000
    os.utime(d, ns=(past, past))
    os.utime(m, ns=(past, past))
    # changed in place and rewritten with O_TRUNC, each flushed by fsync
    with open(f, "r+b") as h:
        h.seek(MiB)
        h.write(b"changed")
        h.flush()
        os.fsync(h.fileno())
    with open(f, "wb") as h:
        h.write(randbytes(MiB + 5, rng))
        h.flush()
        os.fsync(h.fileno())
    time.sleep(1.2)     # the kernel's cached attributes (1 s) have expired
    assert os.stat(d).st_mtime_ns == past, "the flush moved the directory's mtime"
    assert os.stat(m).st_mtime_ns == past, "the flush moved the root's mtime"
    # a hard-linked file is copied in place, journalled in the backing root
    os.link(f, j(d, "g"))
    os.utime(d, ns=(past, past))
    os.utime(m, ns=(past, past))
    with open(f, "r+b") as h:
        h.write(b"linked")
        h.flush()
        os.fsync(h.fileno())
    with open(f, "r+b") as h:       # all of it: a whole version, under an intent
        h.write(randbytes(MiB + 5, rng))
        h.flush()
        os.fsync(h.fileno())
    time.sleep(1.2)     # the settler has removed the intent's version
    assert os.stat(d).st_mtime_ns == past and os.stat(m).st_mtime_ns == past
    backing = tfs.backing
    tfs.umount()
    assert os.stat(os.path.join(backing, "d")).st_mtime_ns == past
    assert os.stat(backing).st_mtime_ns == past
    tfs.start()     # mounting leaves the root's mtime too
    assert os.stat(m).st_mtime_ns == past
    write_file(j(d, "new"), b"x")
    assert os.stat(d).st_mtime_ns > past


def test_atime_not_moved_by_a_handle_that_only_wrote(tfs):
    """A handle opened for reading and writing that only wrote leaves the
    access time alone at its release (which the kernel sends after close
    returns): a utimensat made meanwhile stays.  A read still moves it."""
    p = j(tfs.mnt, "w")
    write_file(p, b"x" * 8192)
    old = 1_000_000_000 * 10**9
    fd = os.open(p, os.O_RDWR)
    try:
        os.pwrite(fd, b"touch", 0)
        os.utime(p, ns=(old, old + 10**9))             # atime < mtime: relatime would move it
    finally:
        os.close(fd)
    tfs.umount()                                       # after every release
    assert os.stat(j(tfs.backing, "w")).st_atime_ns == old
    tfs.start()
    read_file(p)
    tfs.umount()
    assert os.stat(j(tfs.backing, "w")).st_atime_ns > old + 10**9
