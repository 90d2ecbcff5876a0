#!/bin/bash
#
# bench_persist.sh - the persistent tier (-o persist=DIR) against its
# baselines, in one run:
#   drain       N files of S MiB written through tierfs with persist=DIR
#               (a marked directory): the persister's bandwidth and the time
#               until all are in DIR, against `cp` of the same files from a
#               plain directory to DIR (+ `sync` of the copies)
#   checkpoint  the application's write time (open, write, close of the N
#               files) through tierfs without and with persist, R runs each,
#               interleaved
#   restart     reading the N files through a fresh mount over an empty
#               backing directory (fetched from DIR), then again (now local),
#               against reading DIR directly; page cache dropped before each
# Each cell is the median of R runs with the spread (min-max).
#
# usage: bench/bench_persist.sh BUILD
#
# environment (defaults in brackets):
#   N=8 S=64          files and MiB per file
#   R=3               runs per cell
#   WORK=/var/tmp/tierfs-persist.PID   PDIR=$WORK/shared (DIR: put it on
#                     the shared file system to measure that)
#   TIERFS_OPTS=host_cache=1G,gpu=none
#
set -euo pipefail

BUILD=$(cd "${1:?usage: bench_persist.sh BUILD}" && pwd)
N=${N:-8}; S=${S:-64}; R=${R:-3}
WORK=${WORK:-/var/tmp/tierfs-persist.$$}
PDIR=${PDIR:-$WORK/shared}
TIERFS_OPTS=${TIERFS_OPTS:-host_cache=1G,gpu=none}

mkdir -p "$WORK" "$PDIR"
cleanup() {
	for m in "$WORK"/mnt*; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
	rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

export BIN="$BUILD/tierfs" N S R WORK PDIR TIERFS_OPTS
python3 - <<'EOF'
import json, os, shutil, signal, statistics, subprocess, sys, time

BIN, WORK, PDIR = os.environ["BIN"], os.environ["WORK"], os.environ["PDIR"]
N, S, R = int(os.environ["N"]), int(os.environ["S"]), int(os.environ["R"])
OPTS = os.environ["TIERFS_OPTS"]
MiB = 1 << 20
TOTAL = N * S * MiB
data = [os.urandom(S * MiB) for _ in range(min(N, 4))]


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


def mount(backing, mnt, extra=""):
    os.makedirs(backing, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    opts = OPTS + ("," + extra if extra else "")
    log = open(os.path.join(WORK, "tierfs.log"), "ab")
    p = subprocess.Popen([BIN, backing, mnt, "-f", "-o", opts], stdout=log, stderr=log)
    for _ in range(200):
        if os.path.ismount(mnt):
            return p
        time.sleep(0.05)
    p.kill()
    sys.exit("bench_persist.sh: tierfs did not mount (see %s/tierfs.log)" % WORK)


def umount(p, mnt):
    subprocess.run(["umount", mnt], check=True)
    p.wait()


def write_files(top):
    t0 = time.monotonic()
    for i in range(N):
        fd = os.open(os.path.join(top, "ckpt-%03d" % i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        mv = memoryview(data[i % len(data)])
        for off in range(0, len(mv), MiB):
            os.write(fd, mv[off:off + MiB])
        os.close(fd)
    return time.monotonic() - t0


def read_files(top):
    t0 = time.monotonic()
    n = 0
    for i in range(N):
        with open(os.path.join(top, "ckpt-%03d" % i), "rb", buffering=0) as f:
            while True:
                b = f.read(4 * MiB)
                if not b:
                    break
                n += len(b)
    assert n == TOTAL, (n, TOTAL)
    return time.monotonic() - t0


def pstats(mnt):
    return json.loads(os.getxattr(mnt, "user.tierfs.stats"))["persist"]


def med(v, unit=1.0, fmt="%.2f"):
    v = sorted(x * unit for x in v)
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(v), v[0], v[-1])


mnt, backing = os.path.join(WORK, "mnt"), os.path.join(WORK, "backing")
res = {k: [] for k in ("cp", "cp_bw", "drain", "drain_bw", "persist_bw", "ck_plain",
                       "ck_persist", "rs_dir", "rs_fetch", "rs_again")}
for r in range(R):
    # -- cp baseline: plain local files to DIR
    src = os.path.join(WORK, "src")
    fresh(src)
    write_files(src)
    os.sync()
    drop_caches()
    dst = os.path.join(PDIR, "cp")
    fresh(dst)
    t0 = time.monotonic()
    subprocess.run("cp %s/* %s/ && sync %s/*" % (src, dst, dst), shell=True, check=True)
    dt = time.monotonic() - t0
    res["cp"].append(dt)
    res["cp_bw"].append(TOTAL / dt)
    shutil.rmtree(dst)
    shutil.rmtree(src)

    # -- checkpoint without persist
    fresh(backing)
    p = mount(backing, mnt)
    os.mkdir(os.path.join(mnt, "run"))
    res["ck_plain"].append(write_files(os.path.join(mnt, "run")))
    umount(p, mnt)
    shutil.rmtree(backing)
    drop_caches()

    # -- checkpoint with persist, and its drain
    fresh(backing)
    fresh(os.path.join(PDIR, "t"))
    p = mount(backing, mnt, "persist=" + os.path.join(PDIR, "t"))
    os.mkdir(os.path.join(mnt, "run"))
    os.setxattr(os.path.join(mnt, "run"), "user.tierfs.persist", b"1")
    t0 = time.monotonic()
    res["ck_persist"].append(write_files(os.path.join(mnt, "run")))
    while True:
        st = pstats(mnt)
        if st["files_persisted"] >= N and st["backlog_files"] == 0:
            break
        time.sleep(0.01)
    dt = time.monotonic() - t0
    res["drain"].append(dt)
    res["drain_bw"].append(TOTAL / dt)
    res["persist_bw"].append(st["bandwidth"])
    # node A dies, its SSD with it
    p.send_signal(signal.SIGKILL)
    p.wait()
    subprocess.run(["umount", "-l", mnt])
    shutil.rmtree(backing)

    # -- restart: DIR directly, then a fresh mount that fetches, then again
    drop_caches()
    res["rs_dir"].append(read_files(os.path.join(PDIR, "t", "run")))
    drop_caches()
    fresh(backing)
    p = mount(backing, mnt, "persist=" + os.path.join(PDIR, "t"))
    res["rs_fetch"].append(read_files(os.path.join(mnt, "run")))
    drop_caches()
    res["rs_again"].append(read_files(os.path.join(mnt, "run")))
    umount(p, mnt)
    shutil.rmtree(backing)
    shutil.rmtree(os.path.join(PDIR, "t"))

G = 1 / (1 << 30)
print("bench_persist: N=%d files x %d MiB (%.2f GiB), R=%d, DIR=%s, options %s"
      % (N, S, TOTAL * G, R, PDIR, OPTS))
print("%-52s %s" % ("measure", "median (min-max)"))
print("%-52s %s" % ("cp to DIR + sync: seconds", med(res["cp"])))
print("%-52s %s" % ("cp to DIR + sync: GiB/s", med(res["cp_bw"], G)))
print("%-52s %s" % ("tierfs persist: first write -> all in DIR, s", med(res["drain"])))
print("%-52s %s" % ("tierfs persist: first write -> all in DIR, GiB/s", med(res["drain_bw"], G)))
print("%-52s %s" % ("tierfs persist: persister's own GiB/s (stats)", med(res["persist_bw"], G)))
print("%-52s %s" % ("checkpoint write+close, no persist: s", med(res["ck_plain"], 1, "%.3f")))
print("%-52s %s" % ("checkpoint write+close, persist: s", med(res["ck_persist"], 1, "%.3f")))
print("%-52s %s" % ("restart: read DIR directly: s", med(res["rs_dir"])))
print("%-52s %s" % ("restart: fresh mount, fetched from DIR: s", med(res["rs_fetch"])))
print("%-52s %s" % ("restart: same mount, second read (local): s", med(res["rs_again"])))
EOF
