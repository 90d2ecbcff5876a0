#!/bin/sh
# bench_sparse.sh - sparse files through tierfs, against a local directory
# on the same file system in the same run.
#
# usage: bench/bench_sparse.sh [REPEATS]       (root: loop mount for XFS)
#
# TIERFS_BIN (default ./tierfs); HOST_CACHE (default 1G, as in issue 38);
# FS="ext4 xfs": the backing file systems (ext4: a directory under TMPDIR,
# /tmp by default, which must be ext4; xfs: a 4 GiB loop image, skipped
# without mkfs.xfs).
#
# Cases, each in a new file, REPEATS times (default 5), medians [min-max]:
#  far      a 4-byte pwrite 512 MiB past the end of an empty file: the
#           call's time, and the host cache's use right after it;
#  blocks   one 4 KiB block written at offset 500 MiB, the file closed and
#           flushed (tierfs: until its flush backlog is empty and the
#           version is in place; local: fsync): blocks (512 B) allocated
#           in the backing file;
#  punch    a 64 MiB file, flushed; fallocate --punch-hole of 48 MiB in its
#           middle, fsynced and flushed: blocks allocated before and after,
#           the fsync's time, and (tierfs) the bytes the daemon wrote to
#           the disk from the punch on;
#  small    a 2 GiB file with 16 MiB of data in 16 places and a rewrite of
#           100 bytes, through a 64 MiB host cache: time to durable, bytes
#           the daemon wrote to the disk (/proc/PID/io), blocks allocated.
set -eu

reps=${1:-5}
tierfs=${TIERFS_BIN:-./tierfs}
[ -x "$tierfs" ] || { echo "no tierfs binary at $tierfs (set TIERFS_BIN)" >&2; exit 77; }
. "$(dirname "$0")/work_fs.sh"
work_roots bench_sparse 4G

python3 - "$tierfs" "$work" "$reps" "${HOST_CACHE:-1G}" $roots <<'EOF'
import ctypes, json, os, shutil, statistics, subprocess, sys, time

tierfs, work, reps, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
roots = dict(a.split("=", 1) for a in sys.argv[5:])
MiB, GiB = 1 << 20, 1 << 30
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
PUNCH = 0x02 | 0x01


class Tierfs:
    def __init__(self, root, cache):
        self.back = os.path.join(root, "b")
        self.mnt = os.path.join(work, "mnt")
        shutil.rmtree(self.back, ignore_errors=True)
        os.makedirs(self.back)
        os.makedirs(self.mnt, exist_ok=True)
        self.log = open(os.path.join(work, "log"), "ab")
        self.p = subprocess.Popen([tierfs, self.back, self.mnt, "-f", "-o",
                                   f"host_cache={cache},gpu=none"],
                                  stdout=self.log, stderr=self.log)
        t = time.time()
        while not os.path.ismount(self.mnt):
            if self.p.poll() is not None or time.time() - t > 20:
                sys.exit("tierfs did not mount: see " + self.log.name)
            time.sleep(0.02)

    def stats(self):
        return json.loads(os.getxattr(self.mnt, "user.tierfs.stats"))

    def settle(self, name, size):
        """Until the flushes are done and name's version is in place."""
        b = os.path.join(self.back, name)
        t = time.time()
        while True:
            os.setxattr(self.mnt, "user.tierfs.flush", b"")
            st = self.stats()["ssd"]
            if (not st["flush_backlog"] and not st["flushes_running"] and
                    os.path.exists(b) and os.path.getsize(b) == size):
                return b
            if time.time() - t > 120:
                sys.exit(f"{b} not flushed: see {self.log.name}")
            time.sleep(0.01)

    def written(self):
        with open(f"/proc/{self.p.pid}/io") as f:
            return dict((k, int(v)) for k, _, v in
                        (l.partition(":") for l in f))["write_bytes"]

    def stop(self):
        subprocess.run(["umount", self.mnt], check=True)
        self.p.wait()


class Local:
    def __init__(self, root):
        self.mnt = self.back = os.path.join(root, "l")
        shutil.rmtree(self.back, ignore_errors=True)
        os.makedirs(self.back)

    def settle(self, name, size):
        return os.path.join(self.back, name)

    def stop(self):
        pass


def med(xs, fmt="{:.0f}"):
    xs = sorted(xs)
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(xs[0])}-{fmt.format(xs[-1])}]"


def sync_close(fd):
    os.fsync(fd)
    os.close(fd)


def far(fs, i):
    p = os.path.join(fs.mnt, f"far{i}")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    t = time.perf_counter()
    os.pwrite(fd, b"abcd", 512 * MiB)
    dt = time.perf_counter() - t
    used = fs.stats()["tiers"]["host"]["used"] if isinstance(fs, Tierfs) else 0
    os.close(fd)
    os.unlink(p)
    return dt * 1e3, used / MiB


def blocks(fs, i):
    name = f"blk{i}"
    fd = os.open(os.path.join(fs.mnt, name), os.O_WRONLY | os.O_CREAT, 0o644)
    os.pwrite(fd, os.urandom(4096), 500 * MiB)
    sync_close(fd)
    n = os.stat(fs.settle(name, 500 * MiB + 4096)).st_blocks
    os.unlink(os.path.join(fs.mnt, name))
    return n


def punch(fs, i):
    name = f"punch{i}"
    p = os.path.join(fs.mnt, name)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, os.urandom(64 * MiB))
    sync_close(fd)
    before = os.stat(fs.settle(name, 64 * MiB)).st_blocks
    w0 = fs.written() if isinstance(fs, Tierfs) else 0
    fd = os.open(p, os.O_RDWR)
    if libc.fallocate(fd, PUNCH, 8 * MiB, 48 * MiB):
        sys.exit(f"fallocate: {os.strerror(ctypes.get_errno())}")
    t = time.perf_counter()
    os.fsync(fd)
    dt = time.perf_counter() - t
    os.close(fd)
    time.sleep(0.05)    # a write-through version commits at RELEASE
    after = os.stat(fs.settle(name, 64 * MiB)).st_blocks
    w = (fs.written() - w0) if isinstance(fs, Tierfs) else 0
    os.unlink(p)
    return before, after, dt * 1e3, w / MiB


def small(fs, i):
    name = f"small{i}"
    p = os.path.join(fs.mnt, name)
    w0 = fs.written() if isinstance(fs, Tierfs) else 0
    t = time.perf_counter()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    for k in range(16):
        os.pwrite(fd, os.urandom(MiB), k * 128 * MiB + 4096 * k)
    os.ftruncate(fd, 2 * GiB)
    sync_close(fd)
    fd = os.open(p, os.O_WRONLY)
    os.pwrite(fd, b"x" * 100, 0)
    sync_close(fd)
    b = fs.settle(name, 2 * GiB)
    dt = time.perf_counter() - t
    w = (fs.written() - w0) if isinstance(fs, Tierfs) else 0
    n = os.stat(b).st_blocks
    os.unlink(p)
    return dt, w / MiB, n


print(f"{reps} runs each, host cache {cache} (small: 64M); medians [min-max]")
print(f"{'fs':5} {'where':7} {'far ms':>22} {'cache MiB':>9} {'blocks @500M':>14} "
      f"{'punch before':>13} {'after':>7} {'fsync ms':>18} {'MiB':>5} "
      f"{'small s':>18} {'daemon MiB':>10} {'blocks':>8}")
for fsname, root in roots.items():
    for kind in ("local", "tierfs"):
        fs = Local(root) if kind == "local" else Tierfs(root, cache)
        r = [far(fs, i) for i in range(reps)]
        bl = [blocks(fs, i) for i in range(reps)]
        pu = [punch(fs, i) for i in range(reps)]
        fs.stop()
        fs = Local(root) if kind == "local" else Tierfs(root, "64M")
        sm = [small(fs, i) for i in range(max(1, reps // 2))]
        fs.stop()
        print(f"{fsname:5} {kind:7} {med([x[0] for x in r], '{:.2f}'):>22} "
              f"{max(x[1] for x in r):9.1f} {med(bl):>14} {med([x[0] for x in pu]):>13} "
              f"{med([x[1] for x in pu]):>7} {med([x[2] for x in pu], '{:.1f}'):>18} "
              f"{max(x[3] for x in pu):5.1f} {med([x[0] for x in sm], '{:.2f}'):>18} "
              f"{max(x[1] for x in sm):10.1f} {med([x[2] for x in sm]):>8}")
EOF
