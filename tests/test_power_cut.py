"""What fsync acknowledged survives a power cut, not only a daemon kill.

A power cut is simulated on a loop device: the backing file system (ext4 or
XFS, made by the test on a sparse image) is mounted with a long commit
interval, so that nothing reaches its journal unless something forces it; the
image is copied the moment an fsync through the mount returns, which is
exactly what the "disk" holds then; the copy is mounted (its journal
replayed) and must hold what fsync acknowledged.

A flush replaces a file by renaming its new version over the old one.  The
version's data is synced before the rename, but the rename itself is durable
only once its directory is: an fsync that returned before that would come
back, after a power cut, as the file's previous content (or none).

A small change may be durable as a record of BACKING/.tierfs.journal only
(-o journal_pct): the copy is checked as the promise stands, after
`tierfs --recover` has applied that journal (test_journal.py checks the
record against the next mount).
"""

import json
import os
import shutil
import signal
import subprocess

import pytest

import util

MiB = 1 << 20


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture(params=["ext4", "xfs"])
def disk(request, tmp_path):
    """(image, root): a file system on a loop device that commits only when
    asked (ext4 commit=600; XFS forces its log on its own only every 30 s)."""
    util.require_daemon()
    kind = request.param
    mkfs = {"ext4": ["mkfs.ext4", "-q", "-F"], "xfs": ["mkfs.xfs", "-q", "-f"]}[kind]
    if not shutil.which(mkfs[0]):
        pytest.skip(f"{mkfs[0]} not installed")
    img, root = tmp_path / f"{kind}.img", tmp_path / kind
    with open(img, "wb") as f:
        f.truncate(512 * MiB)
    r = _run(mkfs + [str(img)])
    if r.returncode:
        pytest.skip(f"{mkfs[0]} failed: {r.stderr.strip()}")
    root.mkdir()
    opts = "loop,commit=600" if kind == "ext4" else "loop"
    r = _run(["mount", "-o", opts, str(img), str(root)])
    if r.returncode:
        pytest.skip(f"cannot mount {kind} on a loop device: {r.stderr.strip()}")
    yield img, str(root)
    if _run(["umount", str(root)]).returncode:
        _run(["umount", "-l", str(root)])


def cut(img, tmp_path):
    """The disk as it is now, as a power cut would leave it: a copy of the
    image.  Returns a context manager mounting that copy (journal replayed)."""
    copy = tmp_path / "after-cut.img"
    with open(img, "rb") as src, open(copy, "wb") as dst:
        shutil.copyfileobj(src, dst, 4 * MiB)
    return _Mounted(copy, tmp_path / "after-cut")


def cut_stopped(m, img, tmp_path):
    """cut(), m's daemon stopped (SIGSTOP) while the image is copied, so
    that the copy is of one moment."""
    os.kill(m.proc.pid, signal.SIGSTOP)
    try:
        return cut(img, tmp_path)
    finally:
        os.kill(m.proc.pid, signal.SIGCONT)


class _Mounted:
    def __init__(self, img, root):
        self.img, self.root = img, root

    def __enter__(self):
        self.root.mkdir(exist_ok=True)
        # nouuid: XFS refuses a second mount of the same file system's UUID
        kind = _run(["blkid", "-o", "value", "-s", "TYPE", str(self.img)]).stdout.strip()
        opts = "loop,nouuid" if kind == "xfs" else "loop"
        r = _run(["mount", "-o", opts, str(self.img), str(self.root)])
        assert r.returncode == 0, f"the cut image does not mount: {r.stderr}"
        # what the promise covers: the backing directory once recovered
        # (small changes may be journal records not yet in their files)
        b = os.path.join(str(self.root), "b")
        if os.path.exists(os.path.join(b, ".tierfs.journal")):
            r = _run([util.tierfs_bin(), "--recover", b])
            assert r.returncode == 0, f"tierfs --recover after the cut: {r.stderr}"
        return str(self.root)

    def __exit__(self, *exc):
        if _run(["umount", str(self.root)]).returncode:
            _run(["umount", "-l", str(self.root)])
        os.unlink(self.img)


def write_fsync(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def with_durable_file(disk, mount, data):
    """A mount over the disk and its file "f" holding data, all durable."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    m = mount(backing=backing, host_cache="64M")
    path = os.path.join(m.mnt, "f")
    write_fsync(path, data)
    durable_base(m, backing, ["f"])
    return m, path


def durable_base(m, backing, names):
    """Everything so far made durable: the starting point of each case."""
    util.wait_flushed(m)
    for n in names:
        fd = os.open(os.path.join(m.mnt, n), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    os.sync()


def test_rewrite_acknowledged_by_fsync_survives_a_power_cut(disk, mount, tmp_path):
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    m = mount(backing=backing, host_cache="64M")
    small, large = os.path.join(m.mnt, "small"), os.path.join(m.mnt, "ckpt")
    write_fsync(small, b"old small\n")
    write_fsync(large, b"o" * (3 * MiB))
    durable_base(m, backing, ["small", "ckpt"])

    # replaced (O_TRUNC) and rewritten in place (pwrite), each fsynced
    write_fsync(small, b"new small content\n")
    fd = os.open(large, os.O_WRONLY)
    os.pwrite(fd, b"N" * MiB, MiB)
    os.fsync(fd)
    os.close(fd)
    with cut(img, tmp_path) as after:
        with open(os.path.join(after, "b", "small"), "rb") as f:
            assert f.read() == b"new small content\n", "fsync acknowledged, power cut lost it"
        with open(os.path.join(after, "b", "ckpt"), "rb") as f:
            got = f.read()
        util.assert_same(got, b"o" * MiB + b"N" * MiB + b"o" * MiB, "ckpt after the cut")


def test_fsync_after_close_makes_the_background_flush_durable(disk, mount, tmp_path):
    """close() hands the file to a background flush; a later fsync (any
    descriptor, here a reader's) must make that flush's rename durable too."""
    img = disk[0]
    m, path = with_durable_file(disk, mount, b"v1" * 5000)

    with open(path, "wb") as f:
        f.write(b"v2" * 6000)
    util.wait_flushed(m)                     # renamed by a flusher, on its own
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    with cut(img, tmp_path) as after:
        with open(os.path.join(after, "b", "f"), "rb") as f:
            assert f.read() == b"v2" * 6000, "fsync acknowledged, power cut lost it"


def test_new_file_fsynced_with_its_directory_survives_a_power_cut(disk, mount, tmp_path):
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    m = mount(backing=backing, host_cache="64M")
    os.mkdir(os.path.join(m.mnt, "d"))
    durable_base(m, backing, [])

    data = os.urandom(300 * 1024)
    write_fsync(os.path.join(m.mnt, "d", "new"), data)
    dfd = os.open(os.path.join(m.mnt, "d"), os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    with cut(img, tmp_path) as after:
        with open(os.path.join(after, "b", "d", "new"), "rb") as f:
            util.assert_same(f.read(), data, "new file after the cut")


def test_unmount_leaves_every_file_durable(disk, mount, tmp_path):
    """Once the daemon has exited after an unmount, a power cut loses
    nothing: every file's last version, renamed in the background, too."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    m = mount(backing=backing, host_cache="64M")
    for i in range(20):
        write_fsync(os.path.join(m.mnt, f"f{i}"), b"old %d\n" % i)
    durable_base(m, backing, [])

    want = {}
    for i in range(20):                 # rewritten, closed, never fsynced
        want[f"f{i}"] = os.urandom(8192 + 4096 * i)
        with open(os.path.join(m.mnt, f"f{i}"), "wb") as f:
            f.write(want[f"f{i}"])
    m.umount()                          # returns once the daemon exited
    with cut(img, tmp_path) as after:
        for name, data in want.items():
            with open(os.path.join(after, "b", name), "rb") as f:
                util.assert_same(f.read(), data, f"{name} after unmount and a cut")


def test_attribute_changes_acknowledged_by_fsync_survive_a_power_cut(disk, mount, tmp_path):
    """fsync(2) makes a file's metadata durable too: a chmod, an extended
    attribute and the times set before it survive a cut."""
    img = disk[0]
    m, path = with_durable_file(disk, mount, b"data" * 3000)

    os.chmod(path, 0o600)
    os.setxattr(path, "user.checksum", b"sha256:1234")
    os.utime(path, ns=(1_600_000_000_000_000_000, 1_500_000_000_000_000_000))
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    with cut(img, tmp_path) as after:
        p = os.path.join(after, "b", "f")
        st = os.stat(p)
        assert oct(st.st_mode & 0o7777) == oct(0o600), "chmod acknowledged by fsync lost"
        assert os.getxattr(p, "user.checksum") == b"sha256:1234"
        assert st.st_mtime_ns == 1_500_000_000_000_000_000


def test_fsync_of_a_removed_file_after_chmod(mount):
    """Nothing left to make durable: fsync of an open, removed file whose
    mode changed succeeds (not ENOENT)."""
    m = mount(host_cache="64M")
    path = os.path.join(m.mnt, "gone")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"x" * 10000)
    os.fsync(fd)
    os.unlink(path)
    os.fchmod(fd, 0o600)
    os.setxattr(fd, "user.k", b"v")
    os.fsync(fd)
    os.close(fd)


@pytest.mark.parametrize("disk", ["ext4"], indirect=True)
@pytest.mark.parametrize("seed", [1, 2])
def test_random_power_cuts_keep_every_acknowledged_version(disk, mount, tmp_path, seed):
    """Rewrites (O_TRUNC), changes in place and fsyncs at random over a few
    files, with a small host cache (flushes in the background, evictions);
    now and then the power is cut: the daemon is stopped (SIGSTOP) while the
    image is copied.  In the copy every file must hold one of its versions
    (its content at a close or an fsync) from the last one fsync
    acknowledged on: never torn, never older.
    On ext4 only: XFS writes its logged metadata back in place in the
    background, and a copy of a live image taken over a second or more of
    that can be torn (a real power cut is not); under load the XFS cases
    lost names that were durable before the first round."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    m = mount(backing=backing, host_cache="16M")
    rng = util.rng_for(seed)
    names = [f"c{i}" for i in range(6)]
    cands = {}                      # name -> acceptable contents, oldest first
    content = {}
    for n in names:
        content[n] = rng.randbytes(rng.randrange(1, 300 * 1024))
        write_fsync(os.path.join(m.mnt, n), content[n])
        cands[n] = [content[n]]
    dfd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)

    def version(n, data, acked):
        content[n] = data
        if acked:
            cands[n] = [data]
        elif cands[n][-1] != data:
            cands[n].append(data)

    for rnd in range(5):
        for _ in range(30):
            n = rng.choice(names)
            path = os.path.join(m.mnt, n)
            sync = rng.random() < 0.35
            kind = rng.random()
            if kind < 0.4:                  # a new checkpoint over the old
                data = rng.randbytes(rng.randrange(0, 2 * MiB))
                if data and rng.random() < 0.5:     # mostly the old content
                    old = content[n][:len(data)]
                    data = old + data[len(old):]
                    off = rng.randrange(len(data))
                    data = data[:off] + rng.randbytes(64) + data[off + 64:]
                    data = data[:len(data)]
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
                os.write(fd, data)
            elif kind < 0.85:               # changed in place
                data = bytearray(content[n])
                fd = os.open(path, os.O_WRONLY)
                for _ in range(rng.randrange(1, 6)):
                    off = rng.randrange(len(data) + 4096)
                    piece = rng.randbytes(rng.randrange(1, 20000))
                    os.pwrite(fd, piece, off)
                    if off > len(data):
                        data += bytes(off - len(data))
                    data[off:off + len(piece)] = piece
                data = bytes(data)
            else:                           # an fsync of what is there
                data, sync = content[n], True
                fd = os.open(path, os.O_RDONLY)
            if sync:
                os.fsync(fd)
                version(n, data, True)
            os.close(fd)
            version(n, data, False)
        with cut_stopped(m, img, tmp_path) as a:
            for n in names:
                with open(os.path.join(a, "b", n), "rb") as f:
                    got = f.read()
                ok = [i for i, c in enumerate(cands[n]) if c == got]
                assert ok, (f"round {rnd}: {n} after the cut ({len(got)} bytes) is none of "
                            f"its {len(cands[n])} versions since the last fsync "
                            f"(sizes {[len(c) for c in cands[n]]})")


@pytest.mark.parametrize("disk", ["xfs"], indirect=True)
def test_a_clone_record_of_a_new_file_survives_a_power_cut(disk, mount, tmp_path, monkeypatch):
    """With dedup on XFS, a new checkpoint like the one before it is
    durable at a clone record: the journal holds its changed chunks and
    names its base (the backing file of the checkpoint before) and its own
    new backing file.  Once the journal's two files are written over
    (TIERFS_JOURNAL_RING=128K) a record's sync may change no metadata and
    force no log: what makes the base's hidden link, and the new file's
    own name, durable is the sync of the backing root after the link (a
    fsync of a new file that returned at its record, the name not durable,
    would come back as no file at all).  The power is cut right after the
    fourth checkpoint's fsync, before its version is made (each held 3 s
    after its record, TIERFS_DELAY=clone_recorded; the daemon stopped
    while the image is copied): after --recover every checkpoint is
    exact."""
    img, root = disk
    backing = os.path.join(root, "b")
    os.mkdir(backing)
    monkeypatch.setenv("TIERFS_DELAY", "clone_recorded=3000")
    monkeypatch.setenv("TIERFS_JOURNAL_RING", str(128 * 1024))
    m = mount(backing=backing, dedup="on", dedup_chunk="64K", host_cache="256M",
              journal_pct="25", gpu="none")
    monkeypatch.delenv("TIERFS_DELAY")
    monkeypatch.delenv("TIERFS_JOURNAL_RING")
    rng = util.rng_for(util.pick_seed("TIERFS_CUT_SEED", 4201, "a clone record's power cut"))
    C, size = 64 * 1024, 16 * MiB + 1000
    ck = [rng.randbytes(size)]
    # each the one before but for a few chunks: the fourth's record is
    # smaller than the second's, so that it is written over that one's
    # blocks in the first file (its sync changes no metadata)
    for chunks in ((3, 50, 99, 100, 180, 200), (4, 60, 98, 101, 190, 210), (5, 97, 102)):
        nxt = bytearray(ck[-1])
        for c in chunks:
            nxt[c * C + 5:c * C + 9] = rng.randbytes(4)
        ck.append(bytes(nxt))
    names = [f"ckpt.{i + 1}" for i in range(4)]
    write_fsync(os.path.join(m.mnt, names[0]), ck[0])
    durable_base(m, backing, names[:1])
    for i in (1, 2, 3):                 # records 1 and 2 fill the two files
        write_fsync(os.path.join(m.mnt, names[i]), ck[i])
        stats = json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["dedup"]
        assert stats["records"] == i, stats
        if i < 3:
            util.wait_flushed(m)
    with cut_stopped(m, img, tmp_path) as a:
        for name, data in zip(names, ck):
            with open(os.path.join(a, "b", name), "rb") as f:
                util.assert_same(f.read(), data, f"{name} after the cut and --recover")
