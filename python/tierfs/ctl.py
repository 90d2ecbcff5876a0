"""tierfs.ctl - the command line of tierfsctl(1) (and tierfs-stat).

    tierfsctl order DIR [NAME...] [--clear] [--from FILE]
    tierfsctl next FILE...
    tierfsctl prefetch start|stop|status [PATH]
    tierfsctl info PATH...
    tierfsctl wait MOUNT [--timeout SECONDS] [--unmount]
    tierfsctl wait --level cache|ssd|pfs SET [--timeout SECONDS]
    tierfsctl commit SET...
    tierfsctl sets PARENT [--json]
    tierfsctl latest PARENT [--level cache|ssd|pfs]
    tierfsctl keep PARENT [N]
    tierfsctl stats MOUNT [--watch [SECONDS]] [--json | --prometheus]
    tierfsctl warmup PATH... [--stall SECONDS] [--no-progress]
    tierfsctl evict PATH... [--timeout SECONDS]
    tierfsctl record MOUNT FILE [--interval SECONDS] [--count N]
    tierfsctl plot FILE OUT.png

Exit status: 0; 1 on an error (one line on stderr); 2 on a usage error;
3 when `wait` or `warmup` stops before it is done (timeout, cache full).
"""

import argparse
import errno
import json
import os
import re
import select
import signal
import stat as _stat
import subprocess
import sys
import time

import tierfs
from tierfs import statview

CLEAR = "\x1b[H\x1b[2J"        # cursor home + clear screen (ANSI)


class Fail(Exception):
    """One line for stderr; exit status `code`."""

    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.code = code


def positive_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {s!r}")
    return v


def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {s!r}")
    return v


def oserr(path, e):
    return Fail(f"{path}: {e.strerror or e}")


# ---------------------------------------------------------------- hints

def cmd_order(a):
    names = list(a.names)
    if a.from_file:
        f = sys.stdin if a.from_file == "-" else open(a.from_file, encoding="utf-8",
                                                     errors="surrogateescape")
        with f:
            names += [ln.rstrip("\n") for ln in f if ln.strip("\n")]
    if a.clear:
        tierfs.clear(a.dir)
    if names:
        tierfs.restore_order(a.dir, names)
    elif not a.clear:
        for n in tierfs.queued(a.dir):
            print(n)
    return 0


def cmd_next(a):
    for p in a.files:
        tierfs.restore_next(p)
    return 0


def cmd_prefetch(a):
    if a.action == "status":
        print("start" if tierfs.prefetch(a.path) else "stop")
    else:
        tierfs.prefetch(a.path, a.action == "start")
    return 0


def files_under(paths):
    """Regular files of `paths`, directories walked (sorted), in order."""
    for p in paths:
        st = os.stat(p)
        if _stat.S_ISREG(st.st_mode):
            yield p, st.st_size
        elif _stat.S_ISDIR(st.st_mode):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for n in sorted(files):
                    q = os.path.join(root, n)
                    try:
                        st = os.lstat(q)
                    except FileNotFoundError:
                        continue
                    if _stat.S_ISREG(st.st_mode):
                        yield q, st.st_size


def cmd_info(a):
    rows = []
    for p, size in files_under(a.paths):
        try:
            tiers = tierfs.tier(p)
            states = tierfs.state(p)
        except FileNotFoundError:
            continue                    # removed meanwhile
        rows.append((p, statview.human(size), ",".join(tiers) or "-",
                     " ".join(f"{t}:{s}" for t, s in states.items()) or "-"))
    if not rows:
        return 0
    rows.insert(0, ("file", "size", "tiers", "states"))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:<{w[2]}}  {r[3]}".rstrip())
    return 0


# ---------------------------------------------------------------- wait

def _pid_gone(pid, timeout):
    """Wait for process `pid` (not our child) to exit: True if it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        r, _, _ = select.select([fd], [], [], timeout)
        return bool(r)
    finally:
        os.close(fd)


def _exiting_daemons_gone(timeout):
    """Wait for the tierfs daemons that are exiting (their first thread a
    zombie, others still ending) to be gone.  Such a daemon has closed its
    files already, its lock file among them, so which mount it served
    cannot be read any more; yet it is not gone: a GPU tier's driver
    threads can take seconds to end and give the device's memory back.
    An unmounted mount whose daemon is not found may be one of them; the
    others are waited for too, being at their end anyway."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                st = dict(line.split(":\t", 1) for line in f.read().splitlines()
                          if ":\t" in line)
        except OSError:
            continue
        if st.get("Name", "").strip() in ("tierfs", "lt-tierfs") and \
                st.get("State", "").startswith("Z") and int(st.get("Threads", "1")) > 1:
            pids.append(int(pid))
    end = None if timeout is None else time.monotonic() + timeout
    for pid in pids:
        _pid_gone(pid, None if end is None else max(end - time.monotonic(), 0))


def cmd_wait(a):
    """Until the mount's flush backlog is empty; for an unmounted mount (or
    one unmounted meanwhile), until its daemon has flushed and exited.
    Fails (1) naming the files the daemon gave up, or if it was killed, or
    if operations did not reach its persistent tier.  --unmount: unmount
    it first (the daemon found before, so that its end is read whenever it
    comes).  With --level: until the set MOUNT is complete at that level
    (1: a file of it is lost)."""
    if a.level:
        if a.unmount:
            raise Fail("wait: --level waits for a set, --unmount for a mount: "
                       "give one of them", 2)
        return cmd_wait_set(a)
    mnt = os.path.realpath(a.mount)
    deadline = None if a.timeout is None else time.monotonic() + a.timeout

    def left():
        return None if deadline is None else max(deadline - time.monotonic(), 0)

    # (pid, its lock file), kept open to read how the daemon ended
    found = tierfs._open_daemon(mnt)
    if getattr(a, "unmount", False):
        try:
            _unmount(mnt, found)
        except Fail:
            if found:
                found[1].close()
            raise
    return _wait(a, mnt, found, left, deadline)


def _umount_cmd(mnt, lazy):
    for tool in ("fusermount3", "fusermount"):
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(":") + ["/usr/bin", "/bin"]:
            if d and os.access(os.path.join(d, tool), os.X_OK):
                return [os.path.join(d, tool), "-u"] + (["-z"] if lazy else []) + [mnt]
    return ["umount"] + (["-l"] if lazy else []) + [mnt]


def _is_mount_point(mnt):
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                        line.split()[4])
            if mp == mnt:
                return True
    return False


def _unmount(mnt, found, busy_for=5.0):
    """wait --unmount: fusermount3 -u MNT, again while it is busy (files
    still open) for busy_for seconds; then detach it lazily and ask the
    daemon (found: _open_daemon's) to finish with SIGTERM, as a stop does.
    Nothing mounted there: nothing to do."""
    until = time.monotonic() + busy_for
    why = ""
    while _is_mount_point(mnt):
        r = subprocess.run(_umount_cmd(mnt, False), capture_output=True, text=True)
        if r.returncode == 0 or not _is_mount_point(mnt):
            return
        why = (r.stderr.strip().splitlines() or ["busy"])[-1]
        if time.monotonic() >= until:
            r = subprocess.run(_umount_cmd(mnt, True), capture_output=True, text=True)
            if r.returncode and _is_mount_point(mnt):
                raise Fail(f"{mnt}: cannot unmount: {why}", 1)
            print(f"tierfsctl: {mnt}: busy ({why}): detached; its daemon is asked "
                  f"to finish (SIGTERM)", file=sys.stderr)
            if found:
                try:
                    os.kill(found[0], signal.SIGTERM)
                except ProcessLookupError:
                    pass
            return
        time.sleep(0.1)


def _wait(a, mnt, found, left, deadline):
    try:
        return _wait_loop(a, mnt, found, left, deadline)
    finally:
        if found:
            found[1].close()


def _wait_loop(a, mnt, found, left, deadline):
    while True:
        try:
            root = tierfs.mount_of(mnt)     # MOUNT, or a directory inside it
            mounted = True
        except OSError:
            mounted = False
        if mounted:
            try:
                if tierfs.wait_flushed(
                        root, timeout=1.0 if left() is None else min(left(), 1.0)):
                    return 0
            except TimeoutError:
                pass
            except OSError as e:
                if e.errno == errno.EIO:    # followed to its end: data lost
                    raise Fail(e.strerror, 1)
                                        # being unmounted: look again
        else:
            if found is None:
                found = tierfs._open_daemon(mnt)
                if found is not None:   # closed by _wait
                    return _wait(a, mnt, found, left, deadline)
                _exiting_daemons_gone(left())
                return 0                # no daemon serves it (any more)
            if _pid_gone(found[0], left()):
                e = tierfs._lost_error(a.mount, tierfs._daemon_end(found[1]))
                if e:
                    raise Fail(e.strerror, 1)
                n, pdir = tierfs._daemon_unpersisted(found[1])
                if n:
                    raise Fail(f"{a.mount}: {n} operation(s) did not reach the "
                               f"persistent tier {pdir or ''} (see the daemon's log; the "
                               f"next mount over its backing directory resumes them)", 1)
                return 0
        if deadline is not None and time.monotonic() >= deadline:
            raise Fail(f"{a.mount}: still flushing after {a.timeout:g} s", 3)
        if found is None:
            found = tierfs._open_daemon(mnt)
            if found is not None:       # closed by _wait
                return _wait(a, mnt, found, left, deadline)


def cmd_wait_set(a):
    try:
        st = tierfs.wait_set(a.mount, a.level, timeout=a.timeout)
    except TimeoutError as e:
        raise Fail(e.strerror, 3)
    except OSError as e:
        if e.errno in (errno.EIO, errno.ENODATA, errno.EINVAL):
            raise Fail(e.strerror, 1)
        raise
    print(f"{a.mount}: complete at {a.level}")
    return 0 if st else 1


# ---------------------------------------------------------------- sets

def cmd_commit(a):
    for p in a.sets:
        try:
            tierfs.commit(p)
        except OSError as e:
            if e.errno == errno.EBUSY:
                raise Fail(f"{p}: a file in it is still open for writing (the daemon's "
                           f"log names it)", 1)
            if e.errno == errno.EINVAL:
                raise Fail(f"{p}: cannot be committed (no file in it, or the mount's "
                           f"root; the daemon's log says why)", 1)
            raise
    return 0


def _when(t):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def cmd_sets(a):
    found = tierfs.sets(a.parent)
    if a.json:
        print(json.dumps([dict(st, path=p) for p, st in found], indent=1))
        return 0
    if not found:
        print(f"{a.parent}: no committed set")
        return 0
    rows = [("SET", "SIZE", "COMMITTED", "LEVEL", "CACHE", "SSD", "PFS")]
    for p, st in found:
        lv = [st.get(x, "-") + (f" {st[x + '_files']}" if x + "_files" in st else "")
              for x in tierfs.LEVELS]
        rows.append((os.path.basename(p), statview.human(st.get("bytes", 0)),
                     _when(st.get("committed")), st.get("level") or "none", *lv))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
    for p, st in found:
        for n, what in st["files_not_done"]:
            print(f"{os.path.basename(p)}/{n}: {what}")
    return 0


def cmd_latest(a):
    p = tierfs.latest(a.parent, a.level)
    if p is None:
        raise Fail(f"{a.parent}: no set complete at {a.level}", 1)
    print(p)
    return 0


def cmd_keep(a):
    print(tierfs.keep(a.parent, a.n))
    return 0


# ---------------------------------------------------------------- stats

def add_stats_args(ap):
    ap.add_argument("mountpoint", metavar="MOUNT",
                    help="the tierfs mount point (or any path on the mount)")
    ap.add_argument("--watch", nargs="?", const=1.0, default=None, type=positive_float,
                    metavar="SECONDS", help="redraw every SECONDS (default 1) until Ctrl-C")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="print the raw statistics as JSON")
    g.add_argument("--prometheus", action="store_true",
                   help="print them in the Prometheus text format")


def stats_text(a, prog, prev=None, dt=0.0):
    s = statview.read_stats(a.mountpoint, prog)
    if a.json:
        return s, json.dumps(s, indent=2) + "\n"
    real = os.path.realpath(a.mountpoint)
    root = statview._mount_of(a.mountpoint)[0] or real      # for a path inside it
    if a.prometheus:
        return s, statview.prometheus(root, s)
    return s, statview.render(a.mountpoint if root == real else root, s, prev, dt,
                              watch=a.watch is not None)


def cmd_stats(a, prog="tierfsctl"):
    try:
        if a.watch is None:
            sys.stdout.write(stats_text(a, prog)[1])
            return 0
        prev, then = None, None
        while True:
            now = time.monotonic()
            s, text = stats_text(a, prog, prev, now - then if then is not None else 0.0)
            sys.stdout.write(CLEAR + text)
            sys.stdout.flush()
            prev, then = s, now
            time.sleep(a.watch)
    except statview.StatError as e:
        sys.stdout.flush()
        raise Fail(str(e)) from None


# ---------------------------------------------------------------- warmup

def progress(done, total, nfiles, of_files, width=30):
    frac = done / total if total else 1.0
    bar = "#" * int(frac * width)
    return (f"\r[{bar:<{width}}] {100 * frac:5.1f}%  {statview.human(done)} of "
            f"{statview.human(total)}, {nfiles}/{of_files} files")


# a cache copy in these states holds the file's data (tierfs-hints(7)); an
# INIT copy is only reserved, a READ_IN_PROGRESS one is being prefetched
CACHED_STATES = frozenset(("WRITE_IN_PROGRESS", "WRITE_COMPLETE", "FLUSHED",
                           "READ_COMPLETE", "CONSUMED"))


def cached(p):
    """Is file p's data in a cache tier (gpu or host)?  A file whose
    prefetch has begun is listed in user.tierfs.tier already: not yet."""
    try:
        st = tierfs.state(p)
    except FileNotFoundError:
        return True                     # gone: nothing to wait for
    return any(t in ("gpu", "host") and s in CACHED_STATES for t, s in st.items())


def cmd_warmup(a):
    """Queue the files for restore (in the order given) and wait while the
    prefetcher reads them into the caches."""
    files = list(files_under(a.paths))
    if not files:
        return 0
    for p, _ in files:
        tierfs.mount_of(p)
    by_dir = {}
    for p, _ in files:                  # one restore_order per directory, in order
        d, n = os.path.split(p)
        by_dir.setdefault(d or ".", []).append(n)
    if not tierfs.prefetch(files[0][0] if os.path.isdir(files[0][0])
                           else os.path.dirname(files[0][0]) or "."):
        print("tierfsctl: warning: prefetching is stopped (tierfsctl prefetch start)",
              file=sys.stderr)
    todo = [(p, s) for p, s in files if not cached(p)]
    for d, names in by_dir.items():
        want = {os.path.join(d, n) for n in names} & {p for p, _ in todo}
        ns = [n for n in names if os.path.join(d, n) in want]
        if ns:
            tierfs.restore_order(d, ns)
    total = sum(s for _, s in files)
    show = a.progress if a.progress is not None else sys.stderr.isatty()
    last_change, last_done = time.monotonic(), -1
    while True:
        todo = [(p, s) for p, s in todo if not cached(p)]
        done = total - sum(s for _, s in todo)
        if show:
            sys.stderr.write(progress(done, total, len(files) - len(todo), len(files)))
            sys.stderr.flush()
        if not todo:
            break
        if done != last_done:
            last_change, last_done = time.monotonic(), done
        elif time.monotonic() - last_change > a.stall:
            if show:
                sys.stderr.write("\n")
            raise Fail(f"warmup: {len(todo)} of {len(files)} files not cached after "
                       f"{a.stall:g} s without progress (cache full, or prefetching "
                       "stopped); they stay queued", 3)
        time.sleep(0.05)
    if show:
        sys.stderr.write("\n")
    return 0


# ---------------------------------------------------------------- evict

def cmd_evict(a):
    """Drop the cached copies of files (after their flush); files in use or
    queued for restore stay, and are named."""
    busy = 0
    for p, _ in files_under(a.paths):
        try:
            tierfs.evict(p, timeout=a.timeout)
        except TimeoutError:
            raise Fail(f"{p}: not flushed after {a.timeout:g} s", 3) from None
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            busy += 1
            print(f"tierfsctl: {p}: in use (being read, or prefetched for the restore "
                  "queue): left cached", file=sys.stderr)
    return 1 if busy else 0


# ---------------------------------------------------------------- record, plot

def cmd_record(a):
    """Append {"t": seconds since the epoch, "stats": {...}} lines."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    n = 0
    with open(a.file, "a", encoding="utf-8") as out:
        try:
            while not stop and (a.count is None or n < a.count):
                t0 = time.monotonic()
                s = statview.read_stats(a.mount, "tierfsctl")
                out.write(json.dumps({"t": round(time.time(), 6), "stats": s},
                                     separators=(",", ":")) + "\n")
                out.flush()
                n += 1
                if a.count is not None and n >= a.count:
                    break
                time.sleep(max(a.interval - (time.monotonic() - t0), 0))
        except statview.StatError as e:
            if n == 0 or os.path.exists(a.mount) and tierfs.is_tierfs(a.mount):
                raise Fail(str(e)) from None
            # the mount went away: the recording ends there
        except KeyboardInterrupt:
            pass
    return 0


def load_record(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                rows.append((float(r["t"]), r["stats"]))
            except (ValueError, KeyError, TypeError):
                raise Fail(f"{path}:{i}: not a tierfsctl record line") from None
    if not rows:
        raise Fail(f"{path}: no samples")
    return rows


def rate(ts, vs):
    """Per-second differences of a counter (first point 0)."""
    out = [0.0]
    for i in range(1, len(ts)):
        dt = ts[i] - ts[i - 1]
        out.append(max(vs[i] - vs[i - 1], 0) / dt if dt > 0 else 0.0)
    return out


def cmd_plot(a):
    rows = load_record(a.file)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise Fail(f"plot needs matplotlib, which {sys.executable} cannot import "
                   "(Debian's /usr/bin/python3: apt-get install python3-matplotlib)")
    t0 = rows[0][0]
    ts = [t - t0 for t, _ in rows]
    n = statview.num

    def col(get):
        out = []
        for _, s in rows:
            v = n(get(s))
            out.append(v if v is not None else 0)
        return out

    tiers = []
    for _, s in rows:
        for name, _ in statview.tiers_of(s):
            if name not in tiers:
                tiers.append(name)
    MiB = float(1 << 20)
    fig, ax = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    for name in tiers:
        used = col(lambda s: statview.sub(statview.sub(s, "tiers"), name).get("used"))
        cap = col(lambda s: statview.sub(statview.sub(s, "tiers"), name).get("capacity"))
        line, = ax[0].plot(ts, [u / MiB for u in used], label=f"{name} used")
        ax[0].plot(ts, [c / MiB for c in cap], "--", color=line.get_color(), alpha=0.5,
                   label=f"{name} capacity")
    backlog = col(lambda s: statview.sub(s, "ssd").get("flush_backlog"))
    ax[0].plot(ts, [b / MiB for b in backlog], label="flush backlog")
    ax[0].set_ylabel("MiB")
    ax[0].set_title(f"tier occupancy ({os.path.basename(a.file)})")
    flushed = rate(ts, col(lambda s: statview.sub(s, "ssd").get("bytes_flushed")))
    prefetched = rate(ts, col(lambda s: statview.sub(s, "prefetch").get("bytes_prefetched")))
    written = rate(ts, col(lambda s: statview.sub(s, "ssd").get("bytes_written_through")))
    ax[1].plot(ts, [v / MiB for v in flushed], label="flushed to the SSD")
    ax[1].plot(ts, [v / MiB for v in prefetched], label="prefetched from the SSD")
    ax[1].plot(ts, [v / MiB for v in written], label="written through")
    ax[1].set_ylabel("MiB/s")
    ax[1].set_title("flush and prefetch bandwidth")
    for key in ("hits", "late", "misses"):
        tot = col(lambda s, k=key: sum(statview.num(t.get(k)) or 0
                                       for _, t in statview.tiers_of(s)))
        ax[2].plot(ts, rate(ts, tot), label=key)
    ax[2].set_ylabel("reads/s")
    ax[2].set_title("read requests: cache hits, late (waited for a prefetch), misses")
    queue = col(lambda s: statview.sub(s, "prefetch").get("queue"))
    dist = col(lambda s: statview.sub(s, "prefetch").get("distance"))
    ax[3].plot(ts, queue, label="restore queue")
    ax[3].plot(ts, dist, label="prefetch distance")
    ax[3].set_ylabel("entries")
    ax[3].set_title("restore queue")
    ax[3].set_xlabel("seconds")
    for x in ax:
        x.grid(True, alpha=0.3)
        x.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    plt.close(fig)
    return 0


# ---------------------------------------------------------------- main

def parser(prog="tierfsctl"):
    ap = argparse.ArgumentParser(
        prog=prog, description="Steer and observe tierfs mounts (see tierfsctl(1)).")
    ap.add_argument("--version", action="version", version=f"%(prog)s {tierfs.__version__}")
    sp = ap.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    p = sp.add_parser("order", help="queue files of DIR for restore, in order "
                      "(no names: list the queue)")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("names", metavar="NAME", nargs="*")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="read more names from FILE, one per line (- for stdin)")
    p.add_argument("--clear", action="store_true", help="drop DIR's queue first")
    p.set_defaults(fn=cmd_order)

    p = sp.add_parser("next", help="queue FILE for restore (single-hint mode)")
    p.add_argument("files", metavar="FILE", nargs="+")
    p.set_defaults(fn=cmd_next)

    p = sp.add_parser("prefetch", help="start, stop (hold) or show prefetching")
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("path", metavar="PATH", nargs="?", default=".",
                   help="any directory of the mount (default .)")
    p.set_defaults(fn=cmd_prefetch)

    p = sp.add_parser("info", help="tiers and states of files (directories: "
                      "their files, recursively)")
    p.add_argument("paths", metavar="PATH", nargs="+")
    p.set_defaults(fn=cmd_info)

    p = sp.add_parser("wait", help="until nothing is left to flush, or the daemon "
                      "of an unmounted mount has exited")
    p.add_argument("mount", metavar="MOUNT",
                   help="the mount (or, with --level, a checkpoint set)")
    p.add_argument("--timeout", type=positive_float, metavar="SECONDS")
    p.add_argument("--level", choices=tierfs.LEVELS,
                   help="wait until the set MOUNT is complete at this level")
    p.add_argument("--unmount", action="store_true",
                   help="unmount MOUNT first, then wait for its daemon's end")
    p.set_defaults(fn=cmd_wait)

    p = sp.add_parser("commit", help="commit directories as checkpoint sets")
    p.add_argument("sets", metavar="SET", nargs="+")
    p.set_defaults(fn=cmd_commit)

    p = sp.add_parser("sets", help="the checkpoint sets under PARENT: size, commit "
                      "time, level reached")
    p.add_argument("parent", metavar="PARENT")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_sets)

    p = sp.add_parser("latest", help="the newest set under PARENT complete at a level")
    p.add_argument("parent", metavar="PARENT")
    p.add_argument("--level", choices=tierfs.LEVELS, default="ssd",
                   help="cache, ssd (default) or pfs")
    p.set_defaults(fn=cmd_latest)

    p = sp.add_parser("keep", help="keep the N newest complete sets of PARENT on the "
                      "SSD (no N: show it)")
    p.add_argument("parent", metavar="PARENT")
    p.add_argument("n", metavar="N", type=int, nargs="?")
    p.set_defaults(fn=cmd_keep)

    p = sp.add_parser("stats", help="statistics (table, --json, --prometheus)")
    add_stats_args(p)
    p.set_defaults(fn=cmd_stats)

    p = sp.add_parser("warmup", help="read files into the caches (queued, "
                      "prefetched) with a progress bar")
    p.add_argument("paths", metavar="PATH", nargs="+")
    p.add_argument("--stall", type=positive_float, default=10.0, metavar="SECONDS",
                   help="give up after SECONDS without progress (default 10)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="show the progress bar (default: when stderr is a terminal)")
    g.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(fn=cmd_warmup)

    p = sp.add_parser("evict", help="drop files' cached copies (after their flush; "
                      "directories: their files)")
    p.add_argument("paths", metavar="PATH", nargs="+")
    p.add_argument("--timeout", type=positive_float, metavar="SECONDS",
                   help="give up waiting for a flush after SECONDS (exit status 3)")
    p.set_defaults(fn=cmd_evict)

    p = sp.add_parser("record", help="append a statistics sample to FILE (JSON "
                      "lines) every interval until Ctrl-C or the unmount")
    p.add_argument("mount", metavar="MOUNT")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--interval", type=positive_float, default=1.0, metavar="SECONDS")
    p.add_argument("--count", type=positive_int, metavar="N", help="stop after N samples")
    p.set_defaults(fn=cmd_record)

    p = sp.add_parser("plot", help="plot a record FILE into OUT.png (matplotlib)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("out", metavar="OUT.png")
    p.set_defaults(fn=cmd_plot)
    return ap


def run(fn, prog, *args):
    try:
        return fn(*args)
    except Fail as e:
        sys.stdout.flush()
        print(f"{prog}: {e}" if not str(e).startswith(prog) else str(e), file=sys.stderr)
        return e.code
    except tierfs.BadNameError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        where = e.filename if e.filename is not None else ""
        print(f"{prog}: {where}{': ' if where else ''}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


def main(argv=None, prog="tierfsctl"):
    a = parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    return run(a.fn, prog, a)


def stat_main(argv=None, prog="tierfs-stat"):
    """tierfs-stat MOUNT [--watch [SECONDS]] [--json | --prometheus]: the
    same as `tierfsctl stats`."""
    ap = argparse.ArgumentParser(
        prog=prog, description="Show the cache, flush and prefetch statistics of a "
        "tierfs mount (the same as tierfsctl stats).")
    add_stats_args(ap)
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    return run(cmd_stats, prog, a, prog)


if __name__ == "__main__":              # python3 -m tierfs.ctl ...
    sys.exit(main(prog="tierfsctl"))
