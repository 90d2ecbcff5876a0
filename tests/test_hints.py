"""Restore hints: the user.tierfs.* xattr protocol (restore_order, prefetch,
restore_next, tier, state, stats) on a real mount with a small host cache.

The checkpoint set is 64 files of 512 KiB (32 MiB) over a 16 MiB host cache,
so about half of the files have to come back from the SSD.  Every read is
checked against a checksum; performance is judged by the stats counters
(hits, misses, files_prefetched), never by timings.

Reads must reach the daemon for it to count them and to mark files consumed,
so the kernel page cache of a file is dropped (POSIX_FADV_DONTNEED, after its
data has been written back) before it is read.

Before each read the tests wait, within a bounded budget, until the file is
resident in a cache tier (user.tierfs.state): the prefetcher gets the time it
needs, and a missing prefetch shows up as misses in the stats, not as a hang.
"""

import errno
import json
import os
import random
import time

import pytest

import util
from util import KiB, MiB, expect_errno, randbytes, sha, write_file

pytestmark = pytest.mark.daemon

ORDER = "user.tierfs.restore_order"
PREFETCH = "user.tierfs.prefetch"
NEXT = "user.tierfs.restore_next"
TIER = "user.tierfs.tier"
STATE = "user.tierfs.state"
STATS = "user.tierfs.stats"

NFILES = 64
FSIZE = 512 * KiB
CACHE = "16M"
GPU_CACHE = "8M"           # with TIERFS_GPU: 8 + 16 MiB of cache for 32 MiB of files

# states of a cached copy that a read can be served from
READABLE = {"WRITE_COMPLETE", "FLUSHED", "READ_COMPLETE", "CONSUMED"}

j = os.path.join


# ---------------------------------------------------------------- helpers

def small_mount(mount, **options):
    """A mount whose cache tiers together hold less than the checkpoint set."""
    options.setdefault("host_cache", CACHE)
    if util.GPU:
        options.setdefault("gpu_cache", GPU_CACHE)
    return mount(**options)


def stats(m):
    return json.loads(os.getxattr(m.mnt, STATS))


def cache_tiers(st):
    """Cache tier names, fastest first."""
    return list(st["tiers"])


def reads_hits_misses(st):
    hits = sum(t.get("hits", 0) for t in st["tiers"].values())
    misses = sum(t.get("misses", 0) for t in st["tiers"].values())
    return hits, misses


def prefetch_stats(st):
    return st.get("prefetch", {})


def states(path):
    """{'host': 'FLUSHED', 'ssd': 'CURRENT'} from user.tierfs.state."""
    raw = os.getxattr(path, STATE).decode()
    out = {}
    for item in filter(None, raw.split(",")):
        tier, _, state = item.partition(":")
        out[tier] = state
    return out


def resident(path, tiers):
    """True if a cache tier holds a copy of `path` that a read can use."""
    st = states(path)
    return any(st.get(t) in READABLE for t in tiers)


def drop_page_cache(path):
    """Make the next read of `path` reach the daemon."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_whole(path):
    """Read `path` to its end (this marks it consumed) and return the data."""
    drop_page_cache(path)
    with open(path, "rb") as f:
        return f.read()


def check(path, want_sha):
    got = read_whole(path)
    assert len(got) == FSIZE and sha(got) == want_sha, \
        f"{os.path.basename(path)}: wrong data (length {len(got)})"


def queue(d):
    return os.getxattr(d, ORDER)


def set_order(d, names):
    os.setxattr(d, ORDER, "".join(n + "\n" for n in names).encode())


def write_set(m, d, names, seed):
    """Write the checkpoints (random data); return {name: sha}.  Waits until all
    are flushed and drops their page cache so that reads go to the daemon."""
    rng = random.Random(seed)
    shas = {}
    for n in names:
        data = randbytes(FSIZE, rng)
        write_file(j(d, n), data)
        shas[n] = sha(data)
    util.wait_flushed(m)
    for n in names:
        drop_page_cache(j(d, n))
    return shas


class Waiter:
    """Waits before each read until the file is resident in a cache tier.

    Bounded: gives up on a file after `per_file` seconds without any prefetch
    progress (files_prefetched/bytes_prefetched unchanged), and waits at most
    `budget` seconds in all, so a daemon that does not prefetch makes the test
    fail on its counters, quickly."""

    def __init__(self, m, per_file=3.0, budget=20.0):
        self.m = m
        self.per_file = per_file
        self.budget = budget
        self.tiers = cache_tiers(stats(m))
        self.late = []              # files not resident when read

    def progress(self):
        p = prefetch_stats(stats(self.m))
        return p.get("files_prefetched"), p.get("bytes_prefetched")

    def wait(self, path):
        if resident(path, self.tiers):
            return True
        start = time.monotonic()
        quiet_until = start + self.per_file
        last = self.progress()
        ok = False
        while True:
            now = time.monotonic()
            if now >= quiet_until or now - start >= self.budget:
                break
            time.sleep(0.005)
            if resident(path, self.tiers):
                ok = True
                break
            cur = self.progress()
            if cur != last:
                last = cur
                quiet_until = time.monotonic() + self.per_file
        self.budget -= time.monotonic() - start
        if not ok:
            self.late.append(os.path.basename(path))
        return ok


def orders(kind, names):
    if kind == "sequential":
        return list(names)
    if kind == "reverse":
        return list(reversed(names))
    order = list(names)
    random.Random(20240611).shuffle(order)
    return order


NAMES = [f"ckpt.{i:03d}" for i in range(NFILES)]


# ---------------------------------------------------------------- all hints

@pytest.mark.parametrize("kind,policy", [
    ("sequential", "score"), ("reverse", "score"), ("irregular", "score"),
    ("irregular", "fifo"), ("irregular", "lru"),
])
def test_all_hints(mount, kind, policy):
    """Listing 1 of the paper: prefetching held during the forward pass, the
    whole restore order given, prefetching started, files read in that order."""
    m = small_mount(mount, evict=policy)
    d = j(m.mnt, "ckpt")
    os.mkdir(d)
    order = orders(kind, NAMES)
    os.setxattr(d, PREFETCH, b"stop")
    assert os.getxattr(d, PREFETCH) == b"stop"
    if policy == "score" and kind != "irregular":
        # hints after the forward pass ...
        shas = write_set(m, d, NAMES, seed=1)
        set_order(d, order)
    else:
        # ... or before it, as in the paper's Listing 1
        set_order(d, order)
        shas = write_set(m, d, NAMES, seed=1)
    assert queue(d) == "".join(n + "\n" for n in order).encode()
    before = stats(m)
    assert prefetch_stats(before)["queue"] == NFILES
    assert prefetch_stats(before)["state"] == "stop"
    evicted = [n for n in NAMES if not resident(j(d, n), cache_tiers(before))]
    assert evicted, "every file still cached: the cache is not small enough"

    os.setxattr(d, PREFETCH, b"start")
    assert os.getxattr(m.mnt, PREFETCH) == b"start"       # mount-wide
    w = Waiter(m)
    for n in order:
        w.wait(j(d, n))
        check(j(d, n), shas[n])
    after = stats(m)

    h0, m0 = reads_hits_misses(before)
    h1, m1 = reads_hits_misses(after)
    hits, misses = h1 - h0, m1 - m0
    reads = hits + misses
    assert reads >= NFILES, f"only {reads} read requests reached the daemon"
    pf = prefetch_stats(after)
    print(f"{kind}/{policy}: {reads} reads, {misses} misses, {len(evicted)} files "
          f"evicted before the restore, prefetch {pf}, late {w.late}")
    assert pf["files_prefetched"] > 0
    assert pf["files_prefetched"] >= len(evicted) // 2, \
        f"{pf['files_prefetched']} prefetched, {len(evicted)} files were evicted"
    assert misses <= reads // 10, \
        f"{misses} of {reads} read requests missed the cache; " \
        f"files not resident when read: {w.late[:10]} ({len(w.late)})"
    assert queue(d) == b""
    assert pf["queue"] == 0


# ---------------------------------------------------------------- single hint

def test_single_hint(mount):
    """One hint at a time: restore_next on the next file before reading each."""
    m = small_mount(mount)
    d = j(m.mnt, "ckpt")
    os.mkdir(d)
    shas = write_set(m, d, NAMES, seed=2)
    before = stats(m)
    w = Waiter(m)
    os.setxattr(j(d, NAMES[0]), NEXT, b"")
    assert queue(d) == (NAMES[0] + "\n").encode()
    for i, n in enumerate(NAMES):
        if i + 1 < NFILES:
            os.setxattr(j(d, NAMES[i + 1]), NEXT, b"1")    # the value is ignored
        w.wait(j(d, n))
        check(j(d, n), shas[n])
    after = stats(m)
    assert prefetch_stats(after)["files_prefetched"] > \
        prefetch_stats(before).get("files_prefetched", 0)
    assert queue(d) == b""


# ---------------------------------------------------------------- no hints

def test_no_hints_baseline(mount):
    m = small_mount(mount)
    d = j(m.mnt, "ckpt")
    os.mkdir(d)
    shas = write_set(m, d, NAMES, seed=3)
    for n in NAMES:
        check(j(d, n), shas[n])
    st = stats(m)
    hits, misses = reads_hits_misses(st)
    assert misses > 0, "files evicted by the writes must come from the SSD"
    assert prefetch_stats(st).get("files_prefetched", 0) == 0
    assert prefetch_stats(st).get("bytes_prefetched", 0) == 0


def test_reading_out_of_hint_order(mount):
    """Hints are advice: any read order returns the right data, and each read
    removes the file's first queue entry wherever it is."""
    m = small_mount(mount)
    d = j(m.mnt, "ckpt")
    os.mkdir(d)
    shas = write_set(m, d, NAMES, seed=4)
    set_order(d, NAMES)                                   # hinted: sequential
    actual = orders("irregular", NAMES)                   # read: shuffled
    for i, n in enumerate(actual):
        check(j(d, n), shas[n])
        if i == NFILES // 2:
            left = set(actual[i + 1:])
            assert queue(d) == "".join(x + "\n" for x in NAMES if x in left).encode()
    assert queue(d) == b""
    # and read again, unhinted, in yet another order
    for n in reversed(actual):
        check(j(d, n), shas[n])


# ---------------------------------------------------------------- queue read-back

def test_restore_order_read_back(mount):
    m = small_mount(mount)
    d = j(m.mnt, "q")
    sub = j(d, "sub")
    os.makedirs(sub)
    data = {}
    for n in ("a", "b", "c"):
        data[n] = randbytes(64 * KiB)
        write_file(j(d, n), data[n])
    write_file(j(sub, "x"), b"x" * 4096)
    util.wait_flushed(m)

    assert queue(d) == b""
    os.setxattr(d, ORDER, b"a\nb\nc\n")
    assert queue(d) == b"a\nb\nc\n"
    assert queue(sub) == b""                               # per directory
    assert read_whole(j(d, "a")) == data["a"]
    assert queue(d) == b"b\nc\n"

    # no trailing newline, empty lines, a duplicate: each is one future read
    os.setxattr(d, ORDER, b"\nc\n\nb")
    assert queue(d) == b"b\nc\nc\nb\n"
    assert read_whole(j(d, "c")) == data["c"]              # its FIRST entry goes
    assert queue(d) == b"b\nc\nb\n"

    # entries of another directory are kept apart
    os.setxattr(sub, ORDER, b"x\n")
    assert queue(sub) == b"x\n"
    assert queue(d) == b"b\nc\nb\n"
    assert prefetch_stats(stats(m))["queue"] == 4

    # removexattr drops this directory's entries only
    os.removexattr(d, ORDER)
    assert queue(d) == b""
    assert queue(sub) == b"x\n"
    assert read_whole(j(sub, "x")) == b"x" * 4096
    assert queue(sub) == b""
    assert prefetch_stats(stats(m))["queue"] == 0


def test_restore_next_single_file(mount):
    m = small_mount(mount)
    d = j(m.mnt, "q")
    os.mkdir(d)
    write_file(j(d, "f"), b"f" * 8192)
    util.wait_flushed(m)
    os.setxattr(j(d, "f"), NEXT, b"")
    os.setxattr(j(d, "f"), NEXT, b"anything")
    assert queue(d) == b"f\nf\n"
    assert read_whole(j(d, "f")) == b"f" * 8192
    assert queue(d) == b"f\n"


def test_hints_before_files_exist(mount):
    """Hints usually come first: names of files not written yet are accepted;
    prefetching stays on while the files are written (it competes with the
    flushes), and they read back right."""
    m = small_mount(mount)
    d = j(m.mnt, "ckpt")
    os.mkdir(d)
    names = NAMES[:40]                                    # 20 MiB > the cache
    set_order(d, names)
    assert queue(d) == "".join(n + "\n" for n in names).encode()
    for n in names:
        assert not os.path.exists(j(d, n))
    shas = write_set(m, d, names, seed=5)
    assert queue(d) == "".join(n + "\n" for n in names).encode()
    w = Waiter(m, budget=10.0)
    for n in names:
        w.wait(j(d, n))
        check(j(d, n), shas[n])
    assert queue(d) == b""
    assert prefetch_stats(stats(m))["queue"] == 0


# ---------------------------------------------------------------- consumed

@pytest.mark.parametrize("how", ["prefetched", "cached"])
def test_consumed_state(mount, how):
    """A file read to its end is consumed: its cached copy says CONSUMED."""
    m = small_mount(mount)
    d = j(m.mnt, "ckpt")
    os.mkdir(d)
    if how == "cached":
        names = ["one"]                                  # stays in the cache
    else:
        names = NAMES                                    # the first ones are evicted
        os.setxattr(d, PREFETCH, b"stop")
    shas = write_set(m, d, names, seed=6)
    tiers = cache_tiers(stats(m))
    if how == "prefetched":
        out = [n for n in names if not resident(j(d, n), tiers)]
        assert out, "every file still cached: the cache is not small enough"
        name = out[0]
    else:
        name = names[0]
    target = j(d, name)
    if how == "prefetched":
        os.setxattr(target, NEXT, b"")
        os.setxattr(d, PREFETCH, b"start")
        assert Waiter(m).wait(target), f"never prefetched: {states(target)}"
        st = states(target)
        assert any(st.get(t) == "READ_COMPLETE" for t in tiers), st
    else:
        assert resident(target, tiers), states(target)
    check(target, shas[name])
    st = states(target)
    cached = {t: st[t] for t in tiers if t in st}
    if cached:                                           # if still cached
        assert "CONSUMED" in cached.values(), f"after a full read: {st}"
        assert "READ_COMPLETE" not in cached.values(), st
    assert st.get("ssd") == "CURRENT", st
    assert queue(d) == b""


# ---------------------------------------------------------------- malformed

def expect_einval_unchanged(d, value, want_queue):
    e = None
    try:
        os.setxattr(d, ORDER, value)
    except OSError as err:
        e = err
    assert e is not None, f"restore_order {value[:40]!r}: accepted"
    assert e.errno == errno.EINVAL, f"restore_order {value[:40]!r}: {e}"
    assert queue(d) == want_queue, f"queue changed by the rejected {value[:40]!r}"


def test_malformed_hints(mount):
    m = small_mount(mount)
    d = j(m.mnt, "q")
    os.mkdir(d)
    os.mkdir(j(d, "subdir"))
    write_file(j(d, "f"), b"data")

    os.setxattr(d, ORDER, b"q1\nq2\n")                 # not written yet: allowed
    want = b"q1\nq2\n"
    assert queue(d) == want

    bad = [
        b"x/y", b"/abs", b"..", b".", b"./f", b"",      # empty value
        b"\n", b"\n\n\n",                               # only newlines
        b"a\x00b", b"f\x00",                            # a NUL byte
        b"\xff\xfe", b"ok\n\xc3\x28\n",                 # not UTF-8
        b"n" * 256, b"n" * 300,                         # longer than NAME_MAX
        b".tierfs-x", b".tierfs",                       # tierfs's own names
        b"subdir", b"subdir\n",                         # not a regular file
        # all-or-nothing: one bad name rejects the whole value
        b"good1\ngood2\n../x\n", b"good1\nsubdir\n", b"f\n" + b"n" * 300 + b"\n",
    ]
    for value in bad:
        expect_einval_unchanged(d, value, want)

    # the kernel's limit on a value
    expect_errno(errno.E2BIG, os.setxattr, d, ORDER, b"f\n" * 40000)
    assert queue(d) == want

    # a 255-byte name is fine, and so is a UTF-8 one
    long_name = "l" * 255
    os.setxattr(d, ORDER, long_name.encode() + "\nsnö\nf".encode())
    want += long_name.encode() + "\nsnö\nf\n".encode()
    assert queue(d) == want

    # prefetch accepts start/stop (and a trailing newline) only
    expect_errno(errno.EINVAL, os.setxattr, d, PREFETCH, b"go")
    expect_errno(errno.EINVAL, os.setxattr, d, PREFETCH, b"")
    expect_errno(errno.EINVAL, os.setxattr, d, PREFETCH, b"START")
    assert os.getxattr(d, PREFETCH) == b"start"
    os.setxattr(d, PREFETCH, b"stop\n")
    assert os.getxattr(d, PREFETCH) == b"stop"
    expect_errno(errno.EINVAL, os.setxattr, d, PREFETCH, b"stopp")
    assert os.getxattr(d, PREFETCH) == b"stop"
    os.setxattr(d, PREFETCH, b"start")
    assert os.getxattr(m.mnt, PREFETCH) == b"start"

    # restore_next is for regular files
    expect_errno(errno.EINVAL, os.setxattr, j(d, "subdir"), NEXT, b"")
    expect_errno(errno.EINVAL, os.setxattr, d, NEXT, b"")
    assert queue(d) == want

    # read-only attributes
    for target, name in [(j(d, "f"), TIER), (j(d, "f"), STATE), (m.mnt, STATS),
                         (d, STATS)]:
        expect_errno(errno.EPERM, os.setxattr, target, name, b"host")
    assert os.getxattr(j(d, "f"), TIER)                  # still readable
    # unknown tierfs names
    for target in (j(d, "f"), d, m.mnt):
        expect_errno(errno.ENODATA, os.getxattr, target, "user.tierfs.bogus")
        expect_errno(errno.EINVAL, os.setxattr, target, "user.tierfs.bogus", b"1")
    assert queue(d) == want
    assert prefetch_stats(stats(m))["queue"] == want.count(b"\n")


def test_tierfs_names_not_listed(mount):
    m = small_mount(mount)
    d = j(m.mnt, "q")
    os.mkdir(d)
    f = j(d, "f")
    write_file(f, b"data")
    os.setxattr(f, "user.other", b"v")                  # a positive control
    os.setxattr(d, ORDER, b"f\n")
    os.setxattr(f, NEXT, b"")
    for target in (f, d, m.mnt):
        names = os.listxattr(target)
        assert not [n for n in names if n.startswith("user.tierfs.")], names
    assert "user.other" in os.listxattr(f)
    assert os.getxattr(f, "user.other") == b"v"


# ---------------------------------------------------------------- flushes

def test_unlink_during_pending_flush(mount):
    """A file unlinked before its flush finished never reaches the backing
    directory, its flush is dropped from the backlog, and the daemon stays
    healthy.  (Whether a given flush was caught pending is up to timing: the
    test never fails because of that, only catches more or less.)"""
    m = mount()                                          # 64 MiB host cache
    names = [f"doomed{i}" for i in range(12)]
    for n in names:
        write_file(j(m.mnt, n), randbytes(4 * MiB))
        os.unlink(j(m.mnt, n))                           # at once after close
    keep = randbytes(MiB)
    write_file(j(m.mnt, "kept"), keep)
    for n in names:
        assert not os.path.lexists(j(m.mnt, n))
    util.wait_until(lambda: stats(m)["ssd"].get("flush_backlog") == 0 and
                    not stats(m)["ssd"].get("flushes_running"),
                    lambda: f"the flushes to end after unlinking files with pending "
                    f"flushes: {stats(m)['ssd']}", 60, 0.02)
    for n in names:
        assert not os.path.lexists(j(m.backing, n)), f"{n} resurrected by its flush"
    assert util.read_file(j(m.mnt, "kept")) == keep
    m.umount()
    assert sorted(os.listdir(m.backing)) == ["kept"], os.listdir(m.backing)
    assert util.read_file(j(m.backing, "kept")) == keep


def test_consumed_while_flush_pending(mount):
    """Reading a file to its end consumes it even if its flush is still
    pending (reading a checkpoint before it reached the SSD is allowed)."""
    m = mount()                                          # 64 MiB host cache
    d = j(m.mnt, "q")
    os.mkdir(d)
    caught = 0
    for i in range(4):
        # a flush backlog ahead of the file keeps its own flush pending
        write_file(j(d, f"filler{i}"), randbytes(8 * MiB))
        p = j(d, f"f{i}")
        data = randbytes(MiB)
        write_file(p, data)
        os.setxattr(p, NEXT, b"")
        pending = states(p).get("ssd") == "PENDING"
        got = read_whole(p)
        assert sha(got) == sha(data)
        caught += pending
        assert queue(d) == b"", f"f{i} read to its end (flush pending: {pending}) " \
                                f"but still queued: {states(p)}"
    if not caught:
        pytest.skip("every flush finished before its read: nothing checked")


def test_read_while_flushing(mount):
    """A file can be read while its flush is still pending."""
    m = mount()
    for i in range(4):
        p = j(m.mnt, f"fresh{i}")
        data = randbytes(8 * MiB)
        write_file(p, data)
        got = read_whole(p)                              # right after close
        assert sha(got) == sha(data), f"fresh{i}: wrong data while flushing"
    util.wait_flushed(m)
    m.umount()
    for i in range(4):
        assert os.path.getsize(j(m.backing, f"fresh{i}")) == 8 * MiB


def test_read_that_waited_for_a_prefetch_is_late_not_a_hit(mount, monkeypatch):
    """A read of a file whose prefetch is still copying it in waits for the
    SSD: the statistics count it as late, never as a hit (issue 18: the
    counters said every restore was a hit while restores ran at SSD speed).
    The prefetch is held for 2 s once it has begun (TIERFS_DELAY), so that
    the read surely finds it running: a read after it ended is a hit, and
    a slow daemon (ThreadSanitizer) let it end first."""
    monkeypatch.setenv("TIERFS_DELAY", "prefetch_read=2000")
    m = mount(host_cache="1G")
    d = j(m.mnt, "ck")
    os.mkdir(d)
    size = 64 * MiB
    with open(j(d, "big"), "wb") as f:
        block = randbytes(MiB, random.Random(7))
        for _ in range(size // MiB):
            f.write(block)
    m.remount()                                 # empty caches, flushed file
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")                          # the prefetch reads the disk
    set_order(d, ["big"])
    before = stats(m)["tiers"]
    os.setxattr(d, PREFETCH, b"start")
    def started():
        st = states(j(d, "big")).values()
        if "READ_IN_PROGRESS" in st:
            return True
        if any(s in READABLE for s in st):
            raise AssertionError(f"the prefetch ended within its 2 s delay: {st}")
        return False
    util.wait_until(started, "the prefetch to start", 30, 0.001)
    fd = os.open(j(d, "big"), os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == block[:4096]
    finally:
        os.close(fd)
    after = stats(m)["tiers"]
    delta = {k: sum(after[t].get(k, 0) - before[t].get(k, 0) for t in after)
             for k in ("hits", "late", "misses")}
    assert delta["hits"] == 0, f"a read that waited for the prefetch counted as a hit: {delta}"
    assert delta["late"] == 1, delta
