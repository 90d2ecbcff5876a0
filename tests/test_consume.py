"""When a queued file counts as consumed, and what a queue that goes lets go
of (issue 36, parts 4 and 5; tierfs-hints(7)).

- A queued file is consumed once its reader is done with it: read to its
  end, or its last descriptor closed after a read, or its mapping released
  (munmap, then the last close); whichever comes first.  An open and close
  without a read (a stat, a tool) does not count.
- Copies prefetched for entries that leave the queue other than by being
  consumed (cleared, replaced, the directory removed, a `with
  tierfs.restore_order()` block left) are evictable at once.
- Restore orders longer than the kernel's 64 KiB per attribute are appended
  and listed back whole through every interface (the attribute in pages,
  tierfsctl, Python; libtierfs in tests/lib/test_libtierfs.c).

Counters, states and queue listings are checked, never timings.  A FUSE
release reaches the daemon after close() has returned, so a check that
follows a close waits (boundedly) for the queue to say it.
"""

import errno
import json
import mmap
import os
import subprocess
import sys
import time

import pytest

import util
from util import KiB, MiB, expect_errno, randbytes, read_file, sha, write_file

sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
import tierfs  # noqa: E402

pytestmark = pytest.mark.daemon

ORDER = "user.tierfs.restore_order"
STATS = "user.tierfs.stats"
EVICT = "user.tierfs.evict"
TOOL = os.path.join(util.REPO_DIR, "tools", "tierfsctl")
VALUE_MAX = 64 * KiB
BIG = 16 * MiB          # far past the kernel's readahead (-o readahead_kb, 1 MiB)

j = os.path.join


# ---------------------------------------------------------------- helpers

def stats(m):
    return json.loads(os.getxattr(m.mnt, STATS))


def qlen(m):
    return stats(m)["prefetch"]["queue"]


def listed(d):
    v = os.getxattr(d, ORDER)
    return [n.decode() for n in v.split(b"\n") if n]


def hits_misses(m):
    t = stats(m)["tiers"].values()
    return (sum(x.get("hits", 0) for x in t), sum(x.get("misses", 0) for x in t),
            sum(x.get("late", 0) for x in t))


def wait_for(cond, what, timeout=20):
    """Wait until cond() is true; a bounded wait, not a timing check."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def cached(p):
    """A cache tier holds a copy of p that a read can use."""
    return any(s in ("WRITE_COMPLETE", "FLUSHED", "READ_COMPLETE", "CONSUMED")
               for t, s in tierfs.state(p).items() if t != "ssd")


def wait_cached(m, p, quiet=5.0):
    """Wait while the prefetcher makes progress (at most `quiet` seconds
    without any) for p to be cached; True if it is."""
    last, until = None, time.monotonic() + quiet
    while time.monotonic() < until:
        if cached(p):
            return True
        cur = stats(m)["prefetch"]["files_prefetched"]
        if cur != last:
            last, until = cur, time.monotonic() + quiet
        time.sleep(0.01)
    return cached(p)


def cold_set(m, d, n, size):
    """n files of `size` in d, flushed, and a remount: every cache empty."""
    os.mkdir(d)
    data = {}
    for i in range(n):
        p = j(d, f"f{i}")
        data[p] = randbytes(size)
        write_file(p, data[p])
    util.wait_flushed(m)
    m.remount()
    for p in data:
        assert tierfs.tier(p) == ["ssd"], tierfs.tier(p)
    return data


def small(mount, cache="16M"):
    return mount(host_cache=cache, gpu="none")      # one cache tier: the host's


# ---------------------------------------------------------------- consumed

def test_partial_readers_consume(mount):
    """8 files queued, the first MiB of each read and the file closed (a
    header scan, h5py): each close consumes, the window moves on, and the
    later files are prefetched: hits, no misses."""
    m = small(mount, "32M")
    d = j(m.mnt, "ck")
    data = cold_set(m, d, 8, 8 * MiB)               # 64 MiB over a 32 MiB cache
    names = sorted(data, key=lambda p: int(p.rsplit("f", 1)[1]))
    tierfs.restore_order(d, [os.path.basename(p) for p in names])
    assert qlen(m) == 8
    h0, m0, _ = hits_misses(m)
    late = []
    for i, p in enumerate(names):
        if not wait_cached(m, p):
            late.append(os.path.basename(p))
        with open(p, "rb") as f:
            assert f.read(MiB) == data[p][:MiB]
        wait_for(lambda: qlen(m) == 7 - i, f"the close of {p} consumes it "
                 f"(queue {qlen(m)}, want {7 - i})")
    h1, m1, _ = hits_misses(m)
    assert listed(d) == []
    assert stats(m)["prefetch"]["consumed"] >= 8
    assert not late, f"not prefetched before their reads: {late}"
    assert m1 - m0 == 0, f"{m1 - m0} misses, {h1 - h0} hits"
    assert h1 - h0 > 0


def test_mmap_reader_consumes(mount):
    """mmap, touch a page, munmap, close: consumed (the last release)."""
    m = small(mount, "64M")
    d = j(m.mnt, "mm")
    os.mkdir(d)
    want = randbytes(BIG)
    write_file(j(d, "a"), want)
    write_file(j(d, "b"), want)
    tierfs.restore_order(d, ["a", "b"])
    fd = os.open(j(d, "a"), os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)                                # the mapping keeps it open
    try:
        assert mm[4096:4100] == want[4096:4100]
    finally:
        mm.close()
    wait_for(lambda: listed(d) == ["b"], f"munmap + close consume a: {listed(d)}")


def test_open_close_without_read_does_not_consume(mount):
    """A stat, an open and close, an fstat: no read, not consumed.  b, read
    after them, is: once it is gone, a's releases were seen long before."""
    m = small(mount, "64M")
    d = j(m.mnt, "oc")
    os.mkdir(d)
    for n in ("a", "b"):
        write_file(j(d, n), randbytes(BIG))
    tierfs.restore_order(d, ["a", "b"])
    os.stat(j(d, "a"))
    for _ in range(3):
        fd = os.open(j(d, "a"), os.O_RDONLY)
        os.fstat(fd)
        os.close(fd)
    fd = os.open(j(d, "a"), os.O_RDWR)
    os.close(fd)
    with open(j(d, "b"), "rb") as f:
        f.read(4096)
    wait_for(lambda: listed(d) == ["a"], f"b consumed, a kept: {listed(d)}")
    assert qlen(m) == 1


def test_second_open_reads_reach_tierfs(mount):
    """A file queued twice, read in part through two opens: each close
    consumes one entry (no kernel page cache is kept across opens, so the
    second open's read reaches tierfs)."""
    m = small(mount, "64M")
    d = j(m.mnt, "two")
    os.mkdir(d)
    want = randbytes(BIG)
    write_file(j(d, "a"), want)
    tierfs.restore_order(d, ["a", "a"])
    for left in (["a"], []):
        with open(j(d, "a"), "rb") as f:
            assert f.read(8192) == want[:8192]
        wait_for(lambda: listed(d) == left, f"queue {listed(d)}, want {left}")


def test_full_read_consumes_once(mount):
    """Read to its end, then closed: one entry goes, not two."""
    m = small(mount, "64M")
    d = j(m.mnt, "once")
    os.mkdir(d)
    want = randbytes(3 * MiB)
    write_file(j(d, "a"), want)
    write_file(j(d, "z"), b"z")
    tierfs.restore_order(d, ["a", "a", "z"])
    assert read_file(j(d, "a")) == want
    assert read_file(j(d, "z")) == b"z"             # after a's release
    wait_for(lambda: listed(d) == ["a"], f"queue {listed(d)}")


def test_read_before_queued_does_not_consume(mount):
    """A descriptor that read the file before it was queued, closed after:
    its read was not one the queue asked for."""
    m = small(mount, "64M")
    d = j(m.mnt, "pre")
    os.mkdir(d)
    write_file(j(d, "a"), randbytes(BIG))
    write_file(j(d, "b"), randbytes(BIG))
    fd = os.open(j(d, "a"), os.O_RDONLY)
    os.pread(fd, 4096, 0)
    tierfs.restore_order(d, ["a", "b"])
    os.close(fd)
    with open(j(d, "b"), "rb") as f:
        f.read(4096)
    wait_for(lambda: listed(d) == ["a"], f"queue {listed(d)}")


# ---------------------------------------------------------------- pins

def prefetched(m, d, n, size=8 * MiB):
    """n cold files of d queued and prefetched (held for the queue)."""
    data = cold_set(m, d, n, size)
    names = sorted(os.path.basename(p) for p in data)
    tierfs.restore_order(d, names)
    for nm in names:
        assert wait_cached(m, j(d, nm)), f"{nm} never prefetched: {tierfs.state(j(d, nm))}"
        assert tierfs.state(j(d, nm)).get("host") == "READ_COMPLETE"
    expect_errno(errno.EBUSY, os.setxattr, j(d, names[0]), EVICT, b"")  # held
    return data


def released(m, paths, newdir):
    """paths may be evicted now, and new writes land in the cache."""
    for p in paths:
        assert tierfs.state(p).get("host") in ("CONSUMED", None), tierfs.state(p)
        os.setxattr(p, EVICT, b"")
        assert tierfs.tier(p) == ["ssd"], tierfs.tier(p)
    os.makedirs(newdir, exist_ok=True)
    before = stats(m)["ssd"]["files_written_through"]
    for i in range(3):
        p = j(newdir, f"new{i}")
        write_file(p, randbytes(8 * MiB))
        assert tierfs.tier(p)[0] == "host", (p, tierfs.tier(p))
    assert stats(m)["ssd"]["files_written_through"] == before


@pytest.mark.parametrize("how", ["removexattr", "tierfsctl-clear", "replaced", "python-with"])
def test_cleared_queue_releases(mount, how):
    m = small(mount, "32M")
    d = j(m.mnt, "ck")
    data = prefetched(m, d, 3)
    if how == "removexattr":
        os.removexattr(d, ORDER)
    elif how == "tierfsctl-clear":
        r = subprocess.run([sys.executable, TOOL, "order", d, "--clear"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    elif how == "replaced":
        write_file(j(d, "other"), b"o")
        r = subprocess.run([sys.executable, TOOL, "order", d, "other", "--clear"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert listed(d) == ["other"]
    else:
        with pytest.raises(KeyError):
            with tierfs.restore_order(d, ["f0", "f1"]):
                raise KeyError("left early")
    if how != "replaced":
        assert listed(d) == []
    released(m, list(data), j(m.mnt, "new"))


def test_removed_directory_releases(mount):
    """The queued files moved out, their directory removed: its entries go,
    and so do their pins."""
    m = small(mount, "32M")
    d = j(m.mnt, "ck")
    data = prefetched(m, d, 3)
    out = j(m.mnt, "kept")
    os.mkdir(out)
    moved = []
    for p in data:
        q = j(out, os.path.basename(p))
        os.rename(p, q)
        moved.append(q)
    os.rmdir(d)
    assert qlen(m) == 0
    released(m, moved, j(m.mnt, "new"))
    for p, q in zip(data, moved):
        assert sha(read_file(q)) == sha(data[p])


def test_consumed_entries_keep_the_rest_held(mount):
    """Clearing releases; consuming one entry of a file queued twice keeps
    it held for the other."""
    m = small(mount, "32M")
    d = j(m.mnt, "ck")
    data = cold_set(m, d, 1, 4 * MiB)
    p = next(iter(data))
    tierfs.restore_order(d, ["f0", "f0"])
    assert wait_cached(m, p)
    with open(p, "rb") as f:
        f.read(4096)
    wait_for(lambda: listed(d) == ["f0"], f"queue {listed(d)}")
    wait_for(lambda: tierfs.state(p).get("host") == "READ_COMPLETE",
             f"held again for its second entry: {tierfs.state(p)}")
    expect_errno(errno.EBUSY, os.setxattr, p, EVICT, b"")


# ---------------------------------------------------------------- long orders

N_LONG = 20000


def long_names():
    return [f"checkpoint-shard-{i:06d}.bin" for i in range(N_LONG)]     # 28 bytes a line


def test_long_order_attribute_pages(mount):
    """Over 64 KiB of names: the plain attribute cannot hold them (E2BIG);
    user.tierfs.restore_order.N lists them from the N-th, 64 KiB of whole
    lines at most a page, an empty value past the end."""
    m = small(mount, "64M")
    d = j(m.mnt, "long")
    os.mkdir(d)
    names = long_names()
    tierfs.restore_order(d, names)
    assert qlen(m) == N_LONG
    expect_errno(errno.E2BIG, os.getxattr, d, ORDER)
    got, at, pages = [], 0, 0
    while True:
        v = os.getxattr(d, f"{ORDER}.{at}")
        assert len(v) <= VALUE_MAX
        if not v:
            break
        assert v.endswith(b"\n")
        page = v.decode().split("\n")[:-1]
        got += page
        at += len(page)
        pages += 1
    assert got == names
    assert pages >= 2
    assert os.getxattr(d, f"{ORDER}.{N_LONG}") == b""
    assert os.getxattr(d, f"{ORDER}.{N_LONG + 5}") == b""
    assert os.getxattr(d, f"{ORDER}.{N_LONG - 1}") == (names[-1] + "\n").encode()
    for bad in ("x", "-1", "", "1x", "99999999999999999999999"):
        expect_errno(errno.ENODATA, os.getxattr, d, f"{ORDER}.{bad}")
    write_file(j(d, "file"), b"x")
    expect_errno(errno.ENODATA, os.getxattr, j(d, "file"), f"{ORDER}.0")
    # short lists: page 0 is the plain attribute
    os.mkdir(j(d, "sub"))
    tierfs.restore_order(j(d, "sub"), ["a", "b"])
    assert os.getxattr(j(d, "sub"), f"{ORDER}.0") == b"a\nb\n"
    assert os.getxattr(j(d, "sub"), f"{ORDER}.1") == b"b\n"


def test_long_order_python(mount):
    m = small(mount, "64M")
    d = j(m.mnt, "long")
    os.mkdir(d)
    names = long_names()
    tierfs.restore_order(d, names)
    tierfs.restore_order(d, ["last"])
    assert tierfs.queued(d) == names + ["last"]
    tierfs.clear(d)
    assert tierfs.queued(d) == []
    assert qlen(m) == 0


def test_long_order_tierfsctl(mount, tmp_path):
    m = small(mount, "64M")
    d = j(m.mnt, "long")
    os.mkdir(d)
    names = long_names()
    src = tmp_path / "names"
    src.write_text("".join(n + "\n" for n in names))
    r = subprocess.run([sys.executable, TOOL, "order", d, "--from", str(src)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert qlen(m) == N_LONG
    r = subprocess.run([sys.executable, TOOL, "order", d],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == names
