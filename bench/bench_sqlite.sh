#!/bin/sh
# bench_sqlite.sh - sqlite's small transactions through tierfs on ext4:
# the bytes they make the disk write, against the same transactions on the
# same ext4 directly, in the same run.
#
# usage: bench/bench_sqlite.sh [TRANSACTIONS [ROWS]]     (root: loop mount)
#
# Makes ext4 on a loop file (IMG_MIB, default 1024) and, for each case,
# a database of ROWS (default 1400) rows of 1000 bytes (~1.4 MB) in a
# fresh directory, made durable (sync); then counts the sectors the loop
# device is asked to write (/sys/block/loopN/stat) over TRANSACTIONS
# (default 300) one-row transactions (an UPDATE of a random row, seed 1,
# journal_mode=DELETE, synchronous=FULL: sqlite's defaults) and, through
# tierfs, the unmount that writes back what is left, then a sync.
# Cases: ext4 directly; tierfs with journal_pct=0 (every fsync writes a
# whole new version); tierfs with journal_pct=PCT for each PCT of PCTS
# (default "25").  TIERFS_BIN: the daemon (default ./tierfs).
#
# Then (PS="1 5 10 25 50", empty: skip) the threshold: one file of FILE_MIB
# (default 64) MiB, flushed, then 6 times a share p of its 4 KiB blocks
# rewritten (random blocks, seed 2) and fsynced, the last 5 measured; journal_pct=0 (whole
# versions) against journal_pct=100 (every change a journal record): disk
# bytes (to the end of the unmount), the time to durable (writes and
# fsync, summed) and the fsyncs alone (the flush: the writes through FUSE
# are the same in both).
set -eu

tx=${1:-300}
rows=${2:-1400}
tierfs=${TIERFS_BIN:-./tierfs}
[ -x "$tierfs" ] || { echo "no tierfs binary at $tierfs (set TIERFS_BIN)" >&2; exit 77; }
command -v mkfs.ext4 >/dev/null || { echo "mkfs.ext4 missing" >&2; exit 77; }

work=$(mktemp -d /tmp/bench_sqlite.XXXXXX)
loopdev=
cleanup() {
	fusermount3 -u "$work/mnt" 2>/dev/null || true
	umount "$work/ext4" 2>/dev/null || umount -l "$work/ext4" 2>/dev/null || true
	[ -z "$loopdev" ] || losetup -d "$loopdev" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT INT TERM
truncate -s "${IMG_MIB:-1024}M" "$work/ext4.img"
mkfs.ext4 -q -F "$work/ext4.img"
loopdev=$(losetup -f --show "$work/ext4.img")
mkdir "$work/ext4" "$work/mnt"
mount "$loopdev" "$work/ext4"

python3 - "$tierfs" "$work" "$loopdev" "$tx" "$rows" "${PCTS:-25}" "${PS-1 5 10 25 50}" \
	"${FILE_MIB:-64}" <<'PY'
import os, random, sqlite3, subprocess, sys, time
tierfs, work, dev, tx, rows, pcts, ps, file_mib = sys.argv[1:9]
tx, rows = int(tx), int(rows)
stat = "/sys/block/%s/stat" % os.path.basename(dev)
ext4, mnt = os.path.join(work, "ext4"), os.path.join(work, "mnt")

def sectors():
    os.sync()
    return int(open(stat).read().split()[6])

def make_db(d):
    con = sqlite3.connect(os.path.join(d, "db.sqlite"))
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
    rng = random.Random(0)
    con.executemany("INSERT INTO t VALUES (?, ?)",
                    ((i, rng.randbytes(1000)) for i in range(rows)))
    con.commit()
    con.close()

def transactions(d):
    con = sqlite3.connect(os.path.join(d, "db.sqlite"), isolation_level=None)
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("PRAGMA synchronous=FULL")
    rng = random.Random(1)
    t0 = time.monotonic()
    for _ in range(tx):
        con.execute("BEGIN")
        con.execute("UPDATE t SET v = ? WHERE id = ?", (rng.randbytes(1000), rng.randrange(rows)))
        con.execute("COMMIT")
    dt = time.monotonic() - t0
    con.close()
    return dt

def check(d):
    con = sqlite3.connect(os.path.join(d, "db.sqlite"))
    ok = con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    return ok

results = []
def umount_wait(back):
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    for _ in range(600):        # the daemon writes back, then exits
        if subprocess.run(["pgrep", "-f", "^%s %s " % (tierfs, back)],
                          capture_output=True).returncode:
            break
        time.sleep(0.1)

def case(name, opts):
    back = os.path.join(ext4, name.replace(" ", "_").replace("=", ""))
    os.mkdir(back)
    make_db(back)
    size = os.path.getsize(os.path.join(back, "db.sqlite"))
    d = back
    if opts is not None:
        subprocess.run([tierfs, back, mnt, "-o", "host_cache=256M," + opts], check=True)
        d = mnt
    s0 = sectors()
    dt = transactions(d)
    if opts is not None:
        umount_wait(back)
    s1 = sectors()
    ok = check(back)
    results.append((name, (s1 - s0) * 512, dt, size, ok))

case("ext4", None)
case("tierfs journal_pct=0", "journal_pct=0")
for p in pcts.split():
    case("tierfs journal_pct=%s" % p, "journal_pct=%s" % p)

base = results[0][1]
print("sqlite: %d one-row transactions on a %.2f MB database, ext4 on %s" %
      (tx, results[0][3] / 1e6, dev))
print("%-24s %12s %8s %10s %6s" % ("case", "disk MiB", "x ext4", "time s", "ok"))
for name, b, dt, size, ok in results:
    print("%-24s %12.1f %8.1f %10.2f %6s" % (name, b / 2**20, b / base, dt, ok))
if not ps.split():
    sys.exit(0)
size = int(file_mib) << 20
blocks = size // 4096
print("\nin place: a %d MiB file, 5 times (after a first) a share p of its 4 KiB blocks rewritten and fsynced"
      % int(file_mib))
print("%6s %14s %14s %8s %12s %12s %8s %12s %12s %10s" % (
    "p %", "whole MiB", "journal MiB", "ratio", "whole s", "journal s", "ratio",
    "fsync whole", "fsync jnl", "x shorter"))
for p in ps.split():
    row = []
    for pct in ("0", "100"):
        back = os.path.join(ext4, "inplace_%s_%s" % (p, pct))
        os.mkdir(back)
        subprocess.run([tierfs, back, mnt, "-o", "host_cache=512M,journal_pct=" + pct],
                       check=True, capture_output=True)
        path = os.path.join(mnt, "f")
        with open(path, "wb") as f:
            f.write(random.Random(0).randbytes(size))
            f.flush()
            os.fsync(f.fileno())
        rng = random.Random(2)
        fd = os.open(path, os.O_WRONLY)
        dt = ft = 0.0
        for i in range(6):          # the first: the file comes back from the SSD
            if i == 1:
                s0 = sectors()
            pick = rng.sample(range(blocks), max(1, int(blocks * float(p) / 100)))
            data = rng.randbytes(4096)
            t0 = time.monotonic()
            for b in pick:
                os.pwrite(fd, data, b * 4096)
            t1 = time.monotonic()
            os.fsync(fd)
            if i:
                dt += time.monotonic() - t0
                ft += time.monotonic() - t1
        os.close(fd)
        umount_wait(back)
        row.append(((sectors() - s0) * 512, dt, ft))
    (wb, wt, wf), (jb, jt, jf) = row
    print("%6s %14.1f %14.1f %8.2f %12.3f %12.3f %8.2f %12.3f %12.3f %10.1f" %
          (p, wb / 2**20, jb / 2**20, jb / wb, wt, jt, jt / wt, wf, jf, wf / jf))
PY
