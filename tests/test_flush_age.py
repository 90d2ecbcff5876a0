"""-o flush_age: a small file's background flush waits a while after its close.

A file of at most 256 KiB is flushed to the SSD flush_age milliseconds after
its last close, so that one rewritten or removed by then costs the disk no
write at all.  Nothing may be lost or late for it: an fsync flushes it at
once, a writer that needs its cache room gets it flushed at once, an evict
request flushes it, and unmounting flushes everything that waits.  The
mounts here use an age of a minute, longer than any of these may take.
"""

import errno
import json
import os
import sys
import threading

import pytest

import util

KiB = 1024
MiB = util.MiB
AGE = 60000           # ms: anything that waits it out shows as a failure

pytestmark = pytest.mark.daemon


def ssd(m):
    return json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["ssd"]


def settled(m, key, want, timeout=30):
    """ssd statistic key of m once it equals want (a close's release reaches
    the daemon after close(2) has returned)."""
    def matching():
        st = ssd(m)
        return st if st[key] == want else None
    return util.wait_until(matching, lambda: f"{key} == {want}: {ssd(m)}", timeout, 0.02)


def backing_bytes(m, name):
    with open(os.path.join(m.backing, name), "rb") as f:
        return f.read()


def test_short_lived_small_files_are_never_written(mount):
    """Small files removed or rewritten within the age are not flushed;
    those left are flushed by the unmount, each with its last content."""
    m = mount(flush_age=AGE)
    want = {}
    for rnd in range(3):
        for i in range(40):
            name = f"s{i}"
            data = os.urandom(8 * KiB + 37 * i + rnd)
            util.write_file(os.path.join(m.mnt, name), data)
            want[name] = data
    for i in range(0, 40, 2):
        os.unlink(os.path.join(m.mnt, f"s{i}"))
        del want[f"s{i}"]
    st = settled(m, "flush_aging", 40)        # every file once, at its first close's age
    assert st["files_flushed"] == 0 and st["flush_aging"] == 40, st
    for name, data in want.items():
        assert util.read_file(os.path.join(m.mnt, name)) == data, name
    m.umount(timeout=AGE / 2e3)               # the unmount does not wait the age out
    for name, data in want.items():
        assert backing_bytes(m, name) == data, name
    assert sorted(n for n in os.listdir(m.backing) if not n.startswith(".tierfs")) == \
        sorted(want)


@pytest.mark.parametrize("tier", ["host", "gpu"])
def test_fsync_flushes_an_aging_file_at_once(mount, monkeypatch, tier):
    """A file closed (aging), then opened again and fsynced: the fsync
    flushes it before it returns, as it would have without the age, and
    the file waits no more.  gpu: written to the GPU cache, the file ages
    once its copy has cascaded to the host cache (a flush of a copy that
    the fsync did not queue)."""
    if tier == "gpu":
        m = mount(flush_age=AGE, gpu=util.gpu_or_fake(monkeypatch), gpu_cache="32M")
    else:
        m = mount(flush_age=AGE)
    p = os.path.join(m.mnt, "f")
    data = os.urandom(100 * KiB)
    util.write_file(p, data)
    assert settled(m, "flush_aging", 1)["flush_aging"] == 1
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    st = ssd(m)
    assert st["files_flushed"] == 1 and st["flush_aging"] == 0, st
    assert backing_bytes(m, "f") == data


def test_evict_request_flushes_an_aging_file(mount):
    """user.tierfs.evict on a file waiting for its age says EBUSY (its data
    is only in the cache) and has it flushed now; asked again, it goes."""
    m = mount(flush_age=AGE)
    p = os.path.join(m.mnt, "e")
    data = os.urandom(64 * KiB)
    util.write_file(p, data)
    assert settled(m, "flush_aging", 1)["flush_aging"] == 1
    with pytest.raises(OSError) as ei:
        os.setxattr(p, "user.tierfs.evict", b"1")
    assert ei.value.errno == errno.EBUSY
    # not util.wait_flushed: it asks for the flush itself
    assert settled(m, "files_flushed", 1)["files_flushed"] == 1
    os.setxattr(p, "user.tierfs.evict", b"1")
    assert backing_bytes(m, "e") == data
    assert util.read_file(p) == data


def test_flush_request_on_a_file_flushes_it_alone(mount):
    """user.tierfs.flush on a file flushes it now; the other files keep
    waiting for their age."""
    m = mount(flush_age=AGE)
    data = {n: os.urandom(48 * KiB) for n in ("a", "b", "c")}
    for n, d in data.items():
        util.write_file(os.path.join(m.mnt, n), d)
    assert settled(m, "flush_aging", 3)["flush_aging"] == 3
    os.setxattr(os.path.join(m.mnt, "b"), "user.tierfs.flush", b"")
    st = settled(m, "files_flushed", 1)
    assert st["files_flushed"] == 1 and st["flush_aging"] == 2
    assert backing_bytes(m, "b") == data["b"]
    assert backing_bytes(m, "a") != data["a"]


def test_flush_request_on_a_directory_flushes_the_mount(mount):
    """user.tierfs.flush on any directory flushes every waiting file of the
    mount, in other directories too."""
    m = mount(flush_age=AGE)
    os.mkdir(os.path.join(m.mnt, "d"))
    os.mkdir(os.path.join(m.mnt, "e"))
    data = {}
    for i in range(20):
        n = os.path.join("d" if i % 2 else "e", f"f{i}")
        data[n] = os.urandom(4 * KiB + i)
        util.write_file(os.path.join(m.mnt, n), data[n])
    assert settled(m, "flush_aging", 20)["flush_aging"] == 20
    os.setxattr(os.path.join(m.mnt, "d"), "user.tierfs.flush", b"1")
    st = settled(m, "files_flushed", 20)
    assert st["files_flushed"] == 20 and st["flush_aging"] == 0
    for n, d in data.items():
        assert backing_bytes(m, n) == d, n


def test_small_files_flushed_together_share_their_syncs(mount):
    """Small files due at once are flushed in groups: a flusher writes a
    group's versions, makes them durable together (one round of syncs
    submitted at once, "ssd":"syncs" counts the rounds) and then commits
    each.  First versions written in place (a page at most), new versions
    renamed over an older one, and removed files are mixed; every file
    holds its content in the backing directory, none is flushed twice."""
    m = mount(flush_age=AGE)
    n = 96
    data = {}
    for i in range(n // 2):          # older versions, flushed now
        data[f"r{i}"] = os.urandom(3 * KiB + i)
        util.write_file(os.path.join(m.mnt, f"r{i}"), data[f"r{i}"])
    # all of them waiting (each close's release reaches the daemon after
    # close(2) returns: a flush asked for earlier misses the last ones)
    settled(m, "flush_aging", n // 2)
    os.setxattr(m.mnt, "user.tierfs.flush", b"1")
    before = settled(m, "files_flushed", n // 2)
    for i in range(n // 2):          # rewritten: new versions, renamed
        data[f"r{i}"] = os.urandom(2 * KiB + 97 * i)
        util.write_file(os.path.join(m.mnt, f"r{i}"), data[f"r{i}"])
    for i in range(n // 2):          # first versions, in place or not
        data[f"s{i}"] = os.urandom(1 * KiB + 211 * i)
        util.write_file(os.path.join(m.mnt, f"s{i}"), data[f"s{i}"])
    util.wait_released(m)            # each close's release made it wait
    for i in range(0, n // 2, 7):    # removed while they wait
        os.unlink(os.path.join(m.mnt, f"s{i}"))
        del data[f"s{i}"]
    left = len(data)
    assert settled(m, "flush_aging", n)["flush_aging"] == n    # the removed too
    os.setxattr(m.mnt, "user.tierfs.flush", b"1")
    st = settled(m, "files_flushed", before["files_flushed"] + left)
    assert st["flush_aging"] == 0 and st["flush_errors"] == 0, st
    rounds = st["syncs"] - before["syncs"]
    assert 0 < rounds <= left // 8, (rounds, left, st)
    for name, d in data.items():
        assert backing_bytes(m, name) == d, name
    m.umount()
    for name, d in data.items():
        assert backing_bytes(m, name) == d, name


def test_flush_request_on_other_files_is_refused(mount):
    """Only regular files and directories take it (a FIFO: EINVAL);
    reading it says there is no such value."""
    m = mount(flush_age=AGE)
    fifo = os.path.join(m.mnt, "fifo")
    os.mkfifo(fifo)
    with pytest.raises(OSError) as ei:
        os.setxattr(fifo, "user.tierfs.flush", b"")
    assert ei.value.errno in (errno.EINVAL, errno.EPERM)
    with pytest.raises(OSError) as ei:
        os.getxattr(m.mnt, "user.tierfs.flush")
    assert ei.value.errno == errno.ENODATA


@pytest.mark.parametrize("what", ["file", "mount"])
def test_wait_flushed_does_not_wait_out_the_age(mount, what):
    """tierfs.wait_flushed (Python) asks for the flush of what waits, so it
    returns long before an age of a minute (its timeout is a third of it)."""
    sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
    import tierfs
    m = mount(flush_age=AGE)
    p = os.path.join(m.mnt, "w")
    data = os.urandom(100 * KiB)
    util.write_file(p, data)
    assert settled(m, "flush_aging", 1)["flush_aging"] == 1
    assert tierfs.wait_flushed(p if what == "file" else m.mnt, timeout=AGE / 3e3)
    assert backing_bytes(m, "w") == data


@pytest.mark.parametrize("writers", [1, 4])
def test_aging_files_give_their_room_to_writers(mount, writers):
    """A host cache full of small files waiting for their age: a writer that
    needs room has them flushed now instead of waiting out the age (30 s at
    most, then written through to the SSD).  Several writers, four times
    the cache in all; every file keeps its content.  The host cache is the
    only one (a GPU tier's would hold them all, with no need for room)."""
    m = mount(host_cache="4M", flush_age=AGE, gpu="none")
    size = 192 * KiB
    per = 4 * 4 * MiB // size // writers
    errors = []

    def writer(w):
        try:
            for i in range(per):
                util.write_file(os.path.join(m.mnt, f"w{w}-{i}"),
                                bytes([w * 31 + i & 0xff]) * size)
        except Exception as ex:          # noqa: BLE001 - reported below
            errors.append(ex)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    st = ssd(m)
    assert st["files_written_through"] == 0, st
    assert st["files_flushed"] > 0, st
    for w in range(writers):
        for i in range(per):
            got = util.read_file(os.path.join(m.mnt, f"w{w}-{i}"))
            assert got == bytes([w * 31 + i & 0xff]) * size, (w, i)
    m.umount(timeout=AGE / 2e3)
    for w in range(writers):
        for i in range(per):
            assert backing_bytes(m, f"w{w}-{i}") == bytes([w * 31 + i & 0xff]) * size


def test_large_files_are_not_aged(mount):
    """A checkpoint-sized file is flushed at its close: the cache room it
    holds comes back only once it is on the SSD."""
    m = mount(flush_age=AGE)
    data = os.urandom(2 * MiB)
    util.write_file(os.path.join(m.mnt, "big"), data)
    assert ssd(m)["flush_aging"] == 0
    util.wait_flushed(m, timeout=AGE / 2e3)
    assert backing_bytes(m, "big") == data


def test_flush_age_zero_flushes_at_close(mount):
    m = mount(flush_age=0)
    data = os.urandom(4 * KiB)
    util.write_file(os.path.join(m.mnt, "z"), data)
    assert ssd(m)["flush_aging"] == 0
    util.wait_flushed(m, timeout=30)
    assert backing_bytes(m, "z") == data
