#!/usr/bin/env python3
"""Many files in one tierfs mount: create, stat, read, rename, unlink.

    python3 tests/manyfiles.py MOUNTPOINT [-n FILES] [--per-dir N] [--workers W]
                               [--pid PID] [--max-fds N] [--keep]

Each phase runs over every file with W processes and prints its time, rate,
and the daemon's resident memory and open descriptors (sampled every 0.2 s
from /proc/PID: the peak of the phase).  Every file holds its own number,
checked when read back.  Exit status 1 if any operation failed or the
daemon ever held more than --max-fds descriptors.

The daemon's PID is found from the mount point (the tierfs process whose
command line names it) unless --pid is given.  tests/test_scale.py runs this
with 30,000 files; the 1,000,000-file run is by hand (README, TESTING).
"""

import argparse
import multiprocessing
import os
import sys
import threading
import time


def find_daemon(mnt):
    mnt = os.path.realpath(mnt)
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and b"tierfs" in os.path.basename(args[0]) and \
                any(os.path.realpath(a.decode(errors="replace")) == mnt for a in args[1:] if a):
            return int(p)
    return None


def daemon_usage(pid):
    """(RSS in KiB, open descriptors) of pid, or (0, 0) if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(l.split()[1]) for l in f if l.startswith("VmRSS:")), 0)
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return 0, 0


class Sampler(threading.Thread):
    """Peak RSS and descriptor count of the daemon while a phase runs."""

    def __init__(self, pid, every=0.2):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak_rss = self.peak_fds = 0
        self.stop = threading.Event()

    def sample(self):
        rss, fds = daemon_usage(self.pid)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_fds = max(self.peak_fds, fds)

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.every)

    def finish(self):
        self.stop.set()
        self.join()
        self.sample()
        return self.peak_rss, self.peak_fds


def path_of(root, i, per_dir, prefix="f"):
    return os.path.join(root, f"d{i // per_dir:05d}", f"{prefix}{i:08d}")


def content(i):
    return b"tierfs manyfiles %010d\n" % i


def _work(args):
    phase, root, lo, hi, per_dir = args
    errors = []
    for i in range(lo, hi):
        p = path_of(root, i, per_dir)
        try:
            if phase == "create":
                fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                try:
                    os.write(fd, content(i))
                finally:
                    os.close(fd)
            elif phase == "stat":
                st = os.stat(p)
                if st.st_size != len(content(i)):
                    errors.append(f"{p}: size {st.st_size}")
            elif phase == "read":
                fd = os.open(p, os.O_RDONLY)
                try:
                    data = os.read(fd, 4096)
                finally:
                    os.close(fd)
                if data != content(i):
                    errors.append(f"{p}: read {data!r}")
            elif phase == "rename":
                os.rename(p, path_of(root, i, per_dir, "r"))
            elif phase == "restat":
                st = os.stat(path_of(root, i, per_dir, "r"))
                if st.st_size != len(content(i)):
                    errors.append(f"{p}: size {st.st_size} after rename")
            elif phase == "unlink":
                os.unlink(path_of(root, i, per_dir, "r"))
        except OSError as e:
            errors.append(f"{phase} {p}: {e}")
        if len(errors) > 20:
            break
    return hi - lo, errors


PHASES = ["create", "stat", "read", "rename", "restat", "unlink"]


def run(mnt, n, per_dir=10000, workers=4, pid=None, max_fds=None, out=sys.stdout,
        subdir="manyfiles"):
    """Run every phase; returns {"phases": [...], "errors": [...], "peak_fds": N,
    "peak_rss_kib": N}."""
    root = os.path.join(mnt, subdir)
    pid = pid or find_daemon(mnt)
    os.makedirs(root, exist_ok=True)
    for d in range((n + per_dir - 1) // per_dir):
        os.makedirs(os.path.join(root, f"d{d:05d}"), exist_ok=True)
    chunk = max(1, min(2000, n // (workers * 4) or 1))
    result = {"phases": [], "errors": [], "peak_fds": 0, "peak_rss_kib": 0, "pid": pid}

    def say(msg):
        if out:
            print(msg, file=out, flush=True)

    rss0, fds0 = daemon_usage(pid) if pid else (0, 0)
    say(f"manyfiles: {n} files in {root} ({per_dir} per directory), {workers} workers, "
        f"daemon pid {pid}: RSS {rss0 / 1024:.1f} MiB, {fds0} descriptors at start")
    with multiprocessing.Pool(workers) as pool:
        for phase in PHASES:
            sampler = Sampler(pid) if pid else None
            if sampler:
                sampler.start()
            t0 = time.monotonic()
            jobs = [(phase, root, lo, min(n, lo + chunk), per_dir) for lo in range(0, n, chunk)]
            done = 0
            for cnt, errs in pool.imap_unordered(_work, jobs):
                done += cnt
                result["errors"] += errs
            dt = time.monotonic() - t0
            rss, fds = sampler.finish() if sampler else (0, 0)
            result["peak_fds"] = max(result["peak_fds"], fds)
            result["peak_rss_kib"] = max(result["peak_rss_kib"], rss)
            result["phases"].append({"phase": phase, "files": done, "seconds": dt,
                                     "peak_rss_kib": rss, "peak_fds": fds})
            say(f"  {phase:7s} {done:9d} files {dt:8.1f} s {done / dt if dt else 0:9.0f}/s   "
                f"daemon RSS {rss / 1024:8.1f} MiB, descriptors {fds}")
            if result["errors"]:
                break
    for d in range((n + per_dir - 1) // per_dir):
        try:
            os.rmdir(os.path.join(root, f"d{d:05d}"))
        except OSError as e:
            if not result["errors"]:
                result["errors"].append(f"rmdir: {e}")
    try:
        os.rmdir(root)
    except OSError as e:
        if not result["errors"]:
            result["errors"].append(f"rmdir: {e}")
    rss1, fds1 = daemon_usage(pid) if pid else (0, 0)
    result["end_rss_kib"], result["end_fds"] = rss1, fds1
    say(f"manyfiles: peak RSS {result['peak_rss_kib'] / 1024:.1f} MiB, peak descriptors "
        f"{result['peak_fds']}; at the end RSS {rss1 / 1024:.1f} MiB, {fds1} descriptors; "
        f"{len(result['errors'])} errors")
    for e in result["errors"][:20]:
        say(f"  error: {e}")
    if max_fds and result["peak_fds"] > max_fds:
        result["errors"].append(f"daemon held {result['peak_fds']} descriptors (> {max_fds})")
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mountpoint")
    ap.add_argument("-n", "--files", type=int, default=100000)
    ap.add_argument("--per-dir", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--max-fds", type=int, help="fail if the daemon held more descriptors")
    a = ap.parse_args()
    r = run(a.mountpoint, a.files, per_dir=a.per_dir, workers=a.workers, pid=a.pid,
            max_fds=a.max_fds)
    sys.exit(1 if r["errors"] else 0)


if __name__ == "__main__":
    main()
