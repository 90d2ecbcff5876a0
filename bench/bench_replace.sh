#!/bin/sh
# bench_replace.sh - a checkpoint saved under a fixed name: the time of
# the rename of the new file over the old one, and of an unlink, through
# tierfs and in a local directory on the same file system, in one run.
#
# usage: bench/bench_replace.sh [REPEATS]       (root: mounts)
#
# TIERFS_BIN (default ./tierfs); SIZE (default 1G: each checkpoint's size);
# HOST_CACHE (default 4G); FS="ext4 xfs": the file systems (ext4: a
# directory under TMPDIR, /tmp by default, which must be ext4; xfs: an
# image of 4 x SIZE on a loop device, skipped without mkfs.xfs).
#
# Each repeat writes a checkpoint (SIZE bytes of 1 MiB writes) and fsyncs
# it, writes the next one under a temporary name and fsyncs it, then times
# rename(temporary, name) (the old checkpoint's last name goes: the file
# system frees its blocks) and unlink(name).  Medians [min-max] in ms.
set -eu

reps=${1:-5}
tierfs=${TIERFS_BIN:-./tierfs}
[ -x "$tierfs" ] || { echo "no tierfs binary at $tierfs (set TIERFS_BIN)" >&2; exit 77; }
size=$(numfmt --from=iec "${SIZE:-1G}")
. "$(dirname "$0")/work_fs.sh"
work_roots bench_replace $((size * 4 + (256 << 20)))

python3 - "$tierfs" "$work" "$reps" "$size" "${HOST_CACHE:-4G}" $roots <<'EOF'
import os, statistics, subprocess, sys, time

tierfs, work, reps, size, cache = sys.argv[1:6]
reps, size = int(reps), int(size)
roots = dict(a.split("=", 1) for a in sys.argv[6:])
chunk = os.urandom(1 << 20)


def write(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(size >> 20):
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(f, *a):
    t = time.perf_counter()
    f(*a)
    return (time.perf_counter() - t) * 1e3


def run(d):
    ren, unl = [], []
    for _ in range(reps):
        name, tmp = os.path.join(d, "ckpt"), os.path.join(d, "ckpt.tmp")
        write(name)
        write(tmp)
        ren.append(timed(os.rename, tmp, name))
        unl.append(timed(os.unlink, name))
        time.sleep(1)       # what is still freeing settles before the next
    return ren, unl


def cell(v):
    return f"{statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}]"


print(f"checkpoints of {size >> 20} MiB, {reps} repeats; ms, medians [min-max]")
print(f"{'fs':5} {'where':8} {'rename over':>24} {'unlink':>24}")
for fs, root in roots.items():
    local = os.path.join(root, "local")
    os.mkdir(local)
    r, u = run(local)
    print(f"{fs:5} {'local':8} {cell(r):>24} {cell(u):>24}", flush=True)
    back, mnt = os.path.join(root, "backing"), os.path.join(work, "mnt-" + fs)
    os.mkdir(back)
    os.mkdir(mnt)
    r = subprocess.run([tierfs, back, mnt, "-o", f"gpu=none,host_cache={cache}"],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"tierfs did not mount: {r.stderr}")
    try:
        r, u = run(mnt)
    finally:
        subprocess.run(["umount", mnt], check=True)
    print(f"{fs:5} {'tierfs':8} {cell(r):>24} {cell(u):>24}", flush=True)
EOF
