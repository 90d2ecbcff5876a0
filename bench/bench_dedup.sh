#!/bin/sh
# bench_dedup.sh - what -o dedup saves, against dedup=off in the same run.
#
# usage: bench/bench_dedup.sh [SIZE_MIB [CHECKPOINTS]]     (root: loop mount)
#
# LOOP_DIO=1: the loop device does direct I/O to its file (the disk below
# sees the writes); QUICK=1: only p = 1% (16K chunks) and the sqlite case;
# PS="0.01 1": the shares p of the QUICK runs (default 0.01);
# XFS_IMAGE=FILE[.gz]: an empty XFS image (reflink=1) to copy (sparse) where mkfs.xfs
# is missing (the file system is then the image's size);
# GPU=N: also the same series written through the ioctl from GPU memory
# (torch with CUDA, tierfs.pwrite_gpu; libtierfs via TIERFS_LIB), into a
# GPU cache on device N (GPU_OPTS, default gpu_cache=4G); such
# checkpoints are hashed on the GPU; ONLY=gpu: that series alone;
# ONLY=new: the series of new checkpoint files alone (no in-place, no sqlite);
# ONLY=inplace: the file changed in place alone (whole versions, journal
# records with dedup off and on, incremental flushes);
# REPEAT=N: each case of the series of new files (and of the GPU series) N
# times, off and on in turn (the table gives each run, then the medians);
# GPU_CHUNKS="4K 16K": its dedup chunk sizes (default 16K);
# STEP_S=0.5: seconds between a checkpoint's fsync and the next one's
# writes, as a training step's compute would be (default 0: back to back;
# the next checkpoint's update and copy to the GPU take ~0.15 s anyway);
# PLOT=FILE.png: a plot of the bytes the device took per checkpoint, per case.
#
# Makes an XFS file system with reflink on a loop file (IMG_GIB, default 6)
# and runs tierfs (TIERFS_BIN, default ./tierfs) over a directory in it:
#
#  1. series: CHECKPOINTS (default 6) checkpoints of SIZE_MIB (default 128),
#     each a new file; between two, a share p of the 4 KiB blocks is touched
#     by a 4-64 byte update at a random place (p = 100%: all new data);
#     dedup=off, and dedup=on with chunks of 4K .. 1M;
#  2. in place: one file of SIZE_MIB changed in place the same way and
#     fsynced, CHECKPOINTS times: whole versions (dedup=off, journal_pct=0:
#     the baseline), journal records (dedup=off), dedup's incremental
#     flushes (journal_pct=0) and dedup=on with the default journal_pct;
#  3. sqlite: 100 single-row commits on a ~7.4 MB database.
#
# Columns: SSD bytes written (what the loop device was asked to write,
# metadata included, after syncfs; in all and from the second checkpoint
# on, with its ratio to dedup=off), space used in the file system, the
# bytes flushed by tierfs as its statistics count them (written / cloned),
# time to durable (write + fsync of each checkpoint, summed; in all and
# from the second checkpoint on, with its ratio to dedup=off), the fsync
# alone (the flush: from the second checkpoint on), hashing
# bandwidth, the chunk index's memory, and whether every file read back
# byte-exact; then where the flushes spent their time, and how many fsyncs
# returned at a clone record (-o dedup with journal_pct: the chunks that
# differ from the base in the journal, the version made after).
set -eu

size=${1:-128}
n=${2:-6}
tierfs=${TIERFS_BIN:-./tierfs}
[ -x "$tierfs" ] || { echo "no tierfs binary at $tierfs (set TIERFS_BIN)" >&2; exit 77; }
command -v mkfs.xfs >/dev/null || [ -n "${XFS_IMAGE:-}" ] ||
	{ echo "mkfs.xfs missing (xfsprogs), and no XFS_IMAGE" >&2; exit 77; }

work=$(mktemp -d /tmp/bench_dedup.XXXXXX)
loopdev=
cleanup() {
	umount "$work/xfs" 2>/dev/null || umount -l "$work/xfs" 2>/dev/null || true
	[ -z "$loopdev" ] || losetup -d "$loopdev" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT INT TERM
if command -v mkfs.xfs >/dev/null; then
	truncate -s "${IMG_GIB:-6}G" "$work/xfs.img"
	mkfs.xfs -q -m reflink=1 "$work/xfs.img"
else
	case $XFS_IMAGE in
	*.gz) gzip -dc "$XFS_IMAGE" | cp --sparse=always /dev/stdin "$work/xfs.img" ;;
	*) cp --sparse=always "$XFS_IMAGE" "$work/xfs.img" ;;
	esac
fi
mkdir "$work/xfs" "$work/mnt"
if [ -n "${LOOP_DIO:-}" ]; then
	# the loop device writes to its file with O_DIRECT: the bytes reach the
	# disk under the file, not only the host's page cache
	loopdev=$(losetup --direct-io=on -f --show "$work/xfs.img")
	mount "$loopdev" "$work/xfs"
else
	mount -o loop "$work/xfs.img" "$work/xfs"
fi
dev=$(findmnt -n -o SOURCE "$work/xfs")

TOP=$(cd "$(dirname "$0")/.." && pwd) python3 - "$tierfs" "$work" "$dev" "$size" "$n" <<'EOF'
import json, os, random, shutil, sqlite3, subprocess, sys, time

tierfs, work, dev, size_mib, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
MiB = 1 << 20
SIZE = size_mib * MiB
xfs, mnt = os.path.join(work, "xfs"), os.path.join(work, "mnt")
sysstat = f"/sys/block/{os.path.basename(dev)}/stat"


def dev_written():
    fd = os.open(xfs, os.O_RDONLY)
    os.syncfs(fd) if hasattr(os, "syncfs") else os.sync()
    os.close(fd)
    os.sync()
    with open(sysstat) as f:
        return int(f.read().split()[6]) * 512


def used():
    s = os.statvfs(xfs)
    return (s.f_blocks - s.f_bfree) * s.f_frsize


class Tierfs:
    def __init__(self, opts):
        self.back = os.path.join(xfs, "b")
        shutil.rmtree(self.back, ignore_errors=True)
        os.makedirs(self.back)
        self.log = open(os.path.join(work, "log"), "ab")
        full = "host_cache=2G," + (opts if "gpu=" in opts else "gpu=none," + opts)
        self.p = subprocess.Popen([tierfs, self.back, mnt, "-f", "-o", full],
                                  stdout=self.log, stderr=self.log)
        t = time.time()
        while not os.path.ismount(mnt):
            if self.p.poll() is not None or time.time() - t > 20:
                sys.exit("tierfs did not mount: see " + self.log.name)
            time.sleep(0.02)
        while "gpu=" in opts and b'"fully_mapped":true' not in os.getxattr(mnt, "user.tierfs.stats"):
            if time.time() - t > 120:
                sys.exit("the GPU tier did not come up: see " + self.log.name)
            time.sleep(0.05)

    def stats(self):
        return json.loads(os.getxattr(mnt, "user.tierfs.stats"))

    def stop(self):
        um = ["fusermount3", "-u", mnt] if shutil.which("fusermount3") else ["umount", mnt]
        subprocess.run(um, check=True)
        self.p.wait()


def rbytes(rng, n):
    """rng.randbytes in pieces (one call takes less than 256 MiB)."""
    return b"".join(rng.randbytes(min(64 * MiB, n - i)) for i in range(0, n, 64 * MiB))


def touch(data, p, rng):
    """p of the 4 KiB blocks get a 4-64 byte update (p = 1: all new)."""
    if p >= 1:
        return bytearray(rbytes(rng, len(data)))
    nblk = len(data) // 4096
    for b in rng.sample(range(nblk), max(1, int(nblk * p))):
        ln = rng.randint(4, 64)
        at = b * 4096 + rng.randrange(4096 - ln)
        data[at:at + ln] = rng.randbytes(ln)
    return data


def flushed(st):
    d, s = st.get("dedup", {}), st["ssd"]
    if d.get("on"):         # versions, write-through and journal records
        return (d["bytes_written"] + s["bytes_written_through"] +
                st.get("journal", {}).get("bytes_appended", 0)), d["bytes_cloned"]
    return s["bytes_flushed"] + s["bytes_written_through"], 0


GPU = os.environ.get("GPU")
STEP_S = float(os.environ.get("STEP_S", "0"))
if GPU:
    sys.path.insert(0, os.path.join(os.environ["TOP"], "python"))
    import torch
    import tierfs as tfs
    gbuf = torch.empty(SIZE, dtype=torch.uint8, device=f"cuda:{GPU}")
    GPU_OPTS = f"gpu={GPU}," + os.environ.get("GPU_OPTS", "gpu_cache=4G")


def series(opts, p, inplace=False, gpu=False):
    rng = random.Random(42)
    data = bytearray(rbytes(rng, SIZE))
    w0, u0 = dev_written(), used()
    t = Tierfs(opts)
    durable, kept, w1, d1, fs = 0.0, [], 0, 0.0, 0.0
    path = os.path.join(mnt, "f")
    per, prev = [], dev_written()     # bytes the device took per checkpoint
    times = []                        # and the seconds to durable of each
    for i in range(n):
        if i == 1:              # the first checkpoint is all new in every case
            w1, d1 = dev_written(), durable
        if i:
            data = touch(data, p, rng)
        if gpu:                 # the checkpoint is in GPU memory first
            gbuf.copy_(torch.frombuffer(data, dtype=torch.uint8))
            torch.cuda.synchronize()
        if i and STEP_S:        # the compute between two checkpoints
            time.sleep(STEP_S)
        if inplace and i:       # what changed, found before the clock starts
            mv, old = memoryview(data), kept[-1]
            blocks = [b for b in range(0, SIZE, 4096) if mv[b:b + 4096] != old[b:b + 4096]]
        t0 = time.perf_counter()
        if gpu:
            fd = os.open(os.path.join(mnt, f"ckpt.{i}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            assert tfs.pwrite_gpu(fd, gbuf.data_ptr(), SIZE, 0) == SIZE
        elif inplace:
            if i == 0:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, data)
            else:
                fd = os.open(path, os.O_RDWR)
                for b in blocks:    # rewrite only what changed
                    os.pwrite(fd, mv[b:b + 4096], b)
        else:
            fd = os.open(os.path.join(mnt, f"ckpt.{i}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, data)
        t1 = time.perf_counter()
        os.fsync(fd)
        os.close(fd)
        durable += time.perf_counter() - t0
        times.append(time.perf_counter() - t0)
        if i:
            fs += time.perf_counter() - t1
        now = dev_written()
        per.append(now - prev)
        prev = now
        if inplace:
            kept.append(bytes(data))
        if inplace and len(kept) > 2:
            kept.pop(0)
    copy = None
    st, w2, u2 = t.stats(), dev_written(), used()   # the series' figures
    if inplace:             # then the last content as a new checkpoint file
        c0, f0 = w2, flushed(st)[0]
        t0 = time.perf_counter()
        fd = os.open(os.path.join(mnt, "copy"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        copy = (dev_written() - c0, flushed(t.stats())[0] - f0, time.perf_counter() - t0)
    t.stop()
    wrote, cloned = flushed(st)
    ok = True
    if inplace:
        ok = open(os.path.join(t.back, "f"), "rb").read() == kept[-1] and \
            open(os.path.join(t.back, "copy"), "rb").read() == kept[-1]
    else:
        rng2 = random.Random(42)
        d2 = bytearray(rbytes(rng2, SIZE))
        for i in range(n):
            if i:
                d2 = touch(d2, p, rng2)
            ok = ok and open(os.path.join(t.back, f"ckpt.{i}"), "rb").read() == d2
    d = st.get("dedup", {})
    row = dict(dev=w2 - w0, later=w2 - w1, used=u2 - u0, wrote=wrote, cloned=cloned,
               durable=durable, dlater=durable - d1, fsync=fs, hash=d.get("hash_bandwidth", 0) if d.get("on") else 0,
               index=d.get("index_bytes", 0) if d.get("on") else 0, ok=ok,
               ghash=d.get("gpu_hash_bandwidth", 0) if d.get("on") else 0,
               found=d.get("chunks_found", 0), hashed=d.get("chunks_hashed", 0), per=per,
               stages=stages(st), copy=copy,
               records=d.get("records", 0) if d.get("on") else 0, times=times)
    shutil.rmtree(t.back)
    return row


def stages(st):
    """Where the flushes of a series spent their time (stats' ssd.seconds),
    and the GPU -> host cascade's copies (bytes over bandwidth)."""
    t = dict(st.get("ssd", {}).get("seconds", {}))
    g = st.get("tiers", {}).get("gpu", {})
    bw = g.get("to_host_bandwidth") or 0
    t["to_host"] = g.get("bytes_to_host", 0) / bw if bw else 0.0
    j = st.get("journal", {})
    t["jwrite"], t["jsync"] = j.get("append_seconds", 0.0), j.get("sync_seconds", 0.0)
    d = st.get("dedup", {})
    t["grec"], t["gather"] = d.get("records_from_gpu", 0), d.get("gpu_gather_seconds", 0.0)
    t["pwait"] = d.get("pending_wait_seconds", 0.0)
    t["gleft"] = d.get("gpu_records_left_to_flush", 0)
    return t


def fmt_b(x):
    for u, s in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if x >= u:
            return f"{x / u:.1f} {s}"
    return f"{x} B"


PLOT = os.environ.get("PLOT")       # a PNG: bytes written per checkpoint
plotted = []


def plot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = {}
    off_done = False
    for label, per in plotted:
        what, name = label.split(": ")
        p = name.split()[-1]
        ys = [max(b, 1) / MiB for b in per]
        xs = range(1, len(per) + 1)
        if name.startswith("off"):
            if not off_done:    # dedup off writes everything, whatever the case
                ax.plot(xs, ys, "k--", label="dedup off (every case)")
                off_done = True
            continue
        c = colors.setdefault(p, f"C{len(colors)}")
        ax.plot(xs, ys, {"new files": "-", "in place": ":", "ioctl": "-."}[what], color=c,
                marker="o" if what == "new files" else "s", label=f"{what}, {p}")
    ax.set_yscale("log")
    ax.set_xlabel("checkpoint")
    ax.set_ylabel("MiB written to the device (log)")
    ax.set_title(f"bench_dedup, dedup on: {n} checkpoints of {size_mib} MiB, "
                 "p = share of 4 KiB blocks touched")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    with open(PLOT + ".json", "w") as f:
        json.dump(plotted, f)
    print(f"\nplot: {PLOT}")


def table(title, rows):
    what = "in place" if title.startswith("one file") else \
        "ioctl" if title.startswith("series written through") else "new files"
    plotted.extend((f"{what}: {name}", r["per"]) for name, _, r in rows)
    print(f"\n{title}")
    print(f"{'case':<22} {'SSD written':>11} {'2nd..':>10} {'vs off':>6} {'space used':>10} "
          f"{'flushed':>10} {'cloned':>10} {'durable s':>9} {'2nd.. s':>7} {'vs off':>6} "
          f"{'fsync s':>7} {'vs off':>6} "
          f"{'hash GB/s':>9} {'index':>9} {'exact':>5}")
    base = {}
    for name, key, r in rows:
        if name.startswith("off"):
            base[key] = r
        b = base.get(key)
        ratio = f"{b['later'] / r['later']:.1f}x" if b and r["later"] else "-"
        tratio = f"{b['dlater'] / r['dlater']:.1f}x" if b and r["dlater"] else "-"
        fratio = f"{b['fsync'] / r['fsync']:.1f}x" if b and r["fsync"] else "-"
        print(f"{name:<22} {fmt_b(r['dev']):>11} {fmt_b(r['later']):>10} {ratio:>6} "
              f"{fmt_b(r['used']):>10} {fmt_b(r['wrote']):>10} {fmt_b(r['cloned']):>10} "
              f"{r['durable']:>9.2f} {r['dlater']:>7.2f} {tratio:>6} "
              f"{r['fsync']:>7.2f} {fratio:>6} "
              f"{(r['ghash'] or r['hash']) / 1e9:>9.1f} {fmt_b(r['index']):>9} "
              f"{'yes' if r['ok'] else 'NO':>5}")
    print("where the flushes spent their time, seconds for the whole series "
          "(data = flush - clone - sync - commit; records: fsyncs that returned at a "
          "clone record; jnl wr, jnl sync: the journal's record writes and syncs; gpu rec: "
          "records made in the cascade from the chunks that differ, gather: their copies "
          "out of the GPU; left: GPU files whose record was left to their flush, an earlier "
          "version pending; waited: records waiting for earlier versions to be indexed)")
    print(f"{'case':<22} {'flush':>7} {'data':>7} {'clone':>7} {'sync':>7} {'commit':>7} "
          f"{'to host':>7} {'records':>7} {'jnl wr':>7} {'jnl sync':>8} {'gpu rec':>7} "
          f"{'gather':>7} {'left':>5} {'waited':>7}")
    for name, key, r in rows:
        t = r["stages"]
        tot = t.get("total", 0)
        data = tot - t.get("clone", 0) - t.get("sync", 0) - t.get("commit", 0)
        print(f"{name:<22} {tot:>7.3f} {data:>7.3f} {t.get('clone', 0):>7.3f} "
              f"{t.get('sync', 0):>7.3f} {t.get('commit', 0):>7.3f} {t['to_host']:>7.3f} "
              f"{r['records']:>7} {t['jwrite']:>7.3f} {t['jsync']:>8.3f} {t['grec']:>7} "
              f"{t['gather']:>7.3f} {t['gleft']:>5} {t['pwait']:>7.3f}")
    if any(r.get("copy") for _, _, r in rows):
        print("then the last content written as a new file (a checkpoint under a new name)")
        print(f"{'case':<22} {'SSD written':>11} {'flushed':>10} {'durable s':>9}")
        for name, key, r in rows:
            w, f, d = r["copy"]
            print(f"{name:<22} {fmt_b(w):>11} {fmt_b(f):>10} {d:>9.2f}")
    sys.stdout.flush()


print(f"bench_dedup: {n} checkpoints of {size_mib} MiB on XFS reflink ({dev}), "
      f"{os.cpu_count()} CPUs" + (f", {STEP_S:g} s between checkpoints" if STEP_S else ""),
      flush=True)
chunks = ["4K", "16K", "64K", "256K", "1M"]
quick = bool(os.environ.get("QUICK"))
ps = tuple(float(x) for x in os.environ.get("PS", "0.01").split())
repeat = int(os.environ.get("REPEAT", "1"))


def medians(rows, keys):
    """Per case over the REPEAT runs: the medians from the second checkpoint
    on, and their ratio to dedup=off's medians."""
    print("medians over the runs, from the second checkpoint on (vs off: the median of off's / this)")
    med = lambda xs: sorted(xs)[len(xs) // 2]
    for key in keys:
        off = [r for n, k, r in rows if k == key and n.startswith("off ")]
        od, of = med([r["dlater"] for r in off]), med([r["fsync"] for r in off])
        for name in sorted({n.rsplit(" #", 1)[0] for n, k, _ in rows if k == key}):
            rs = [r for n, k, r in rows if k == key and n.rsplit(" #", 1)[0] == name]
            d, f = med([r["dlater"] for r in rs]), med([r["fsync"] for r in rs])
            runs = " ".join(f"{r['dlater']:.2f}" for r in rs)
            print(f"  {name:<22} durable 2nd.. {d:7.2f} s ({od / d:.2f}x)  "
                  f"fsync {f:7.2f} s ({of / f:.2f}x)  runs {runs}")


def case(rows, name, key, opts, p, gpu=False):
    """One series, added to rows and printed at once (a run cut short by
    a time limit still shows the cases it finished)."""
    r = series(opts, p, gpu=gpu)
    rows.append((name, key, r))
    print(f"  done: {name:<24} durable 2nd.. {r['dlater']:7.2f} s  fsync {r['fsync']:7.2f} s  "
          f"written 2nd.. {fmt_b(r['later'])}  exact {'yes' if r['ok'] else 'NO'}  each "
          + " ".join(f"{x * 1000:.0f}" for x in r["times"][1:]) + " ms", flush=True)


if GPU:
    rows = []
    for p in ps:
        key = f"p={p * 100:g}%"
        for r in range(repeat):     # off and on in turn
            tag = f" #{r + 1}" if repeat > 1 else ""
            case(rows, f"off {key}{tag}", key, GPU_OPTS + ",dedup=off", p, gpu=True)
            for c in os.environ.get("GPU_CHUNKS", "16K").split():
                case(rows, f"on chunk {c} {key}{tag}", key,
                     GPU_OPTS + f",dedup=on,dedup_chunk={c}", p, gpu=True)
    table(f"series written through the ioctl from GPU memory (tierfs.pwrite_gpu, {GPU_OPTS}): "
          "hash GB/s = the GPU's", rows)
    if repeat > 1:
        medians(rows, [f"p={p * 100:g}%" for p in ps])
    if os.environ.get("ONLY") == "gpu":
        if PLOT:
            plot()
        sys.exit(0)
rows = []
for p in (() if os.environ.get("ONLY") == "inplace" else ps if quick else (0.001, 0.01, 0.1, 1.0)):
    key = f"p={p * 100:g}%"
    for r in range(repeat):     # off and on in turn: each on row against the off before it
        tag = f" #{r + 1}" if repeat > 1 else ""
        case(rows, f"off {key}{tag}", key, "dedup=off", p)
        for c in (["16K"] if quick else ["4K", "16K", "64K"] if p not in (0.01, 0.1) else chunks):
            case(rows, f"on chunk {c} {key}{tag}", key, f"dedup=on,dedup_chunk={c}", p)
if rows:
    table("series of new checkpoint files (SSD written: by the loop device; 2nd..: from the "
          "second checkpoint on, the first being all new in every case; vs off: dedup=off's / "
          "this)", rows)
if rows and repeat > 1:
    medians(rows, [f"p={p * 100:g}%" for p in (ps if quick else (0.001, 0.01, 0.1, 1.0))])
if os.environ.get("ONLY") == "new":
    if PLOT:
        plot()
    sys.exit(0)

rows = []
for p in (ps if quick else (0.001, 0.01, 0.1)):
    if p >= 1:
        continue
    key = f"p={p * 100:g}%"
    for r in range(repeat):
        tag = f" #{r + 1}" if repeat > 1 else ""
        # off: a whole new version per fsync (journal_pct=0), the baseline
        rows.append((f"off {key}{tag}", key, series("dedup=off,journal_pct=0", p, inplace=True)))
        rows.append((f"journal {key}{tag}", key, series("dedup=off", p, inplace=True)))
        rows.append((f"on incr {key}{tag}", key,
                     series("dedup=on,journal_pct=0", p, inplace=True)))
        rows.append((f"on {key}{tag}", key, series("dedup=on", p, inplace=True)))
table("one file changed in place and fsynced (off: a whole version per fsync, journal_pct=0; "
      "journal: dedup off, journal_pct 25; on incr: dedup on, journal_pct=0, incremental "
      "flushes; on: dedup on, journal_pct 25)", rows)
if repeat > 1:
    medians(rows, [f"p={p * 100:g}%" for p in (ps if quick else (0.001, 0.01, 0.1)) if p < 1])
if os.environ.get("ONLY") == "inplace":
    sys.exit(0)

print("\nsqlite: 100 single-row commits (UPDATE of a 1000-byte row) on a database of "
      "7000 such rows")
for opts in ("dedup=off", "dedup=on"):
    t = Tierfs(opts)
    db = os.path.join(mnt, "db.sqlite")
    con = sqlite3.connect(db)
    con.execute("create table t (id integer primary key, v blob)")
    con.executemany("insert into t values (?, randomblob(1000))", [(i,) for i in range(7000)])
    con.commit()
    dbsize = os.path.getsize(db)
    w0, f0 = dev_written(), flushed(t.stats())[0]
    t0 = time.perf_counter()
    for i in range(100):
        con.execute("update t set v = randomblob(1000) where id = ?", (i * 61 % 7000,))
        con.commit()
    dt = time.perf_counter() - t0
    con.close()
    st = t.stats()
    f1 = flushed(st)[0]
    w1 = dev_written()
    t.stop()
    print(f"  {opts:<10} database {fmt_b(dbsize)}: flushed {fmt_b(f1 - f0)} "
          f"({fmt_b((f1 - f0) / 100)} a commit), SSD written {fmt_b(w1 - w0)}, "
          f"{dt:.2f} s for the 100 commits")
if PLOT:
    plot()
EOF
