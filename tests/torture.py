#!/usr/bin/env python3
"""torture.py - a seeded, model-checked torture test of a tierfs mount.

Several processes (--procs), each with several threads (--threads), run
random file operations on a real tierfs mount, and a model of every file
checks every byte read.  Each worker thread owns a directory of files
(w<N>/) and a region of each shared file (shared/s<K>); nobody else touches
them, so the model is exact:

  rewrite     open(O_WRONLY|O_CREAT|O_TRUNC), 1 MiB or odd-sized write()s,
              half of them fsync()ed, close()
  open/close  a descriptor held across operations (O_RDWR, O_RDWR|O_APPEND,
              O_RDONLY); the other operations use it or open their own
  pwrite, append, pread, full-file verify (fstat + sequential read), punch
  hole, zero range, fallocate, ftruncate, truncate(path), mmap write+read,
  fsync, rename (also over another file), link, unlink (also of open
  files), stat, restore orders (user.tierfs.restore_order on the worker's
  directory, then the files read in that order), drop_caches, copy (a
  file's content, read back and checked, written as another file's: with
  -o dedup its chunks are cloned from the source's version).

Data identifies itself: each 8-byte word at file offset o (o % 8 == 0) is

    fid << 46 | version << 24 | o / 8          (little-endian)

where fid (18 bits, never 0) names the file (inode) and version (22 bits)
the write that put it there.  A hole reads as zero words.  A mismatch is
reported decoded: which file's data, which write, from which offset.

Crash mode (--crash): the daemon is SIGKILLed at random moments, the dead
mount detached (umount -l) and tierfs started again over the same backing
directory.  What tierfs promises (DESIGN.md, "Semantics promised") and what
is checked then, per file:

  * A *version* of a file is its content at a commit point: when the file
    is created (empty), when a descriptor that may write it is closed
    (mmap included), when truncate(path) changes it with no writable
    descriptor open, and when fsync() is called.  Content between two
    commit points (a rewrite half done, the zeros of its O_TRUNC) is never
    a version.
  * After the crash, each file reads back as exactly one of its versions:
    never torn (a mix of versions), never another file's data, never
    zeros where data was.
  * That version is the last fsync-acknowledged one or a later one: a
    version whose fsync() returned 0 is never lost.
  * The namespace (names, hard links) is what the completed operations
    made; an operation cut by the kill may have happened or not.
  Shared files are only checked weakly after a crash (every word is zero
  or this file's data at its own offset); each owner then rewrites its
  region, and its model is exact again.

Without --crash every read must return exactly the model's content; at the
end every worker verifies its files, tierfs is unmounted cleanly (its log
must show no error or sanitizer report) and the backing directory must hold
exactly the model's files.

Seeded and replayable: each worker's operations come from random.Random of
(seed, worker), independent of timing.  On a failure the seed, the file,
the offset, expected vs found (decoded) and the worker's last operations
are printed, and the exit status is 1.  Every operation is also logged to
WORKDIR/ops.w<N>.log (kept on failure, or with --keep).

Validate the harness itself with --plain DIR (the same operations on an
ordinary directory, no daemon): it must pass.

usage:
  TIERFS_BIN=build/tierfs python3 tests/torture.py --seconds 60
  python3 tests/torture.py --seed 1234 --ops 20000 --host-cache 16M --policy fifo
  python3 tests/torture.py --crash --seconds 120
  python3 tests/torture.py --mount-opts gpu=0,gpu_cache=64M    (GPU machine)
  python3 tests/torture.py --plain /tmp/x --seconds 30          (self-check)
"""

import argparse
import array
import collections
import errno
import json
import mmap
import multiprocessing
import os
import queue
import random
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS_DIR)
try:
    import util
except ImportError:          # util needs pytest only for pytest.fail/skip
    import types
    _stub = types.ModuleType("pytest")

    def _fail(msg="", pytrace=True):
        raise AssertionError(msg)

    def _skip(msg=""):
        raise SystemExit(f"skipped: {msg}")
    _stub.fail, _stub.skip = _fail, _skip
    sys.modules["pytest"] = _stub
    import util

KiB = 1 << 10
MiB = 1 << 20

FID_BITS, VER_BITS, IDX_BITS = 18, 22, 24
FID_SHIFT = VER_BITS + IDX_BITS           # 46
VER_MASK = (1 << VER_BITS) - 1
IDX_MASK = (1 << IDX_BITS) - 1
MAX_FILE = 80 * MiB                       # no file grows past this
HISTORY = 30                              # operations shown on a failure

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10

RESTORE_XATTR = "user.tierfs.restore_order"

# ---------------------------------------------------------------- data

TEMPLATE = b""        # word i = i (the offset part), built before the fork

try:                  # gen at memory speed where numpy is (CI installs it)
    import numpy
except ImportError:
    numpy = None


def build_template():
    global TEMPLATE
    words = (MAX_FILE + 8 * MiB) // 8
    if len(TEMPLATE) < words * 8:
        if numpy is not None:
            TEMPLATE = numpy.arange(words, dtype=numpy.uint64)
        else:
            TEMPLATE = array.array("Q", range(words)).tobytes()


def stamp(fid, ver):
    """The high 40 bits of a word: which file, which write."""
    return (fid << VER_BITS) | (ver & VER_MASK)


def gen(hi, start, end):
    """The bytes [start, end) of write `hi` (0: zeros)."""
    if hi == 0:
        return bytes(end - start)
    if numpy is not None:
        return gen_view(hi, start, end).tobytes()
    w0, w1 = start >> 3, (end + 7) >> 3
    n = w1 - w0
    s = start - w0 * 8
    b = bytearray(memoryview(TEMPLATE)[w0 * 8:w1 * 8])
    hb = hi.to_bytes(5, "little")
    for k in range(5):
        if hb[k]:
            b[3 + k::8] = bytes((hb[k],)) * n
    return b[s:s + end - start] if (s or end - start != len(b)) else b


def gen_view(hi, start, end):
    """gen's bytes as a buffer (a numpy array of bytes where numpy is: no
    copy into a bytes object)."""
    if hi == 0 or numpy is None:
        return gen(hi, start, end)
    w0, w1 = start >> 3, (end + 7) >> 3
    s = start - w0 * 8
    # the offset part is below 1 << IDX_BITS: hi goes above it
    words = TEMPLATE[w0:w1] | numpy.uint64(hi << IDX_BITS)
    return words.view(numpy.uint8)[s:s + end - start]


def decode(word):
    """(fid, version, offset) of a data word; None for a zero word."""
    if word == 0:
        return None
    return word >> FID_SHIFT, (word >> IDX_BITS) & VER_MASK, (word & IDX_MASK) * 8


def weak_word_ok(word, fid, pos):
    """Could `word` at pos be a mix of zeros and writes of file fid?  (A write
    that starts or ends inside a word leaves a word of two versions.)"""
    good = (fid << FID_SHIFT) | (pos >> 3)
    mask = (0xFFFFFF | (((1 << FID_BITS) - 1) << FID_SHIFT))
    for k in range(8):
        m = (mask >> (8 * k)) & 0xFF
        if not m:
            continue
        b = (word >> (8 * k)) & m
        if b and b != (good >> (8 * k)) & m:
            return False
    return True


# ------------------------------------------------------- extent maps
#
# A file's content: a tuple of (start, end, hi) covering [0, size) without
# gaps (hi 0 = zeros).  Operations return new tuples, so versions kept for
# the crash check share them.

def _norm(pieces):
    out = []
    for s, e, h in pieces:
        if e <= s:
            continue
        if out and out[-1][2] == h and out[-1][1] == s:
            out[-1] = (out[-1][0], e, h)
        else:
            out.append((s, e, h))
    return tuple(out)


def ext_write(ext, size, start, end, hi):
    if end <= start:
        return ext, size
    if start > size:
        ext = ext + ((size, start, 0),)
    before, after = [], []
    for s, e, h in ext:
        if s < start:
            before.append((s, min(e, start), h))
        if e > end:
            after.append((max(s, end), e, h))
    return _norm(before + [(start, end, hi)] + after), max(size, end)


def ext_truncate(ext, size, new):
    if new >= size:
        return _norm(list(ext) + [(size, new, 0)]), new
    return _norm([(s, min(e, new), h) for s, e, h in ext if s < new]), new


def ext_content(ext, start, end):
    buf = bytearray(end - start)
    for s, e, h in ext:
        if e <= start or s >= end or h == 0:
            continue
        a, b = max(s, start), min(e, end)
        buf[a - start:b - start] = gen(h, a, b)
    return buf


def ext_equal(ext, got, start=0):
    """Does got (bytes-like) hold ext_content(ext, start, start + len(got))?
    Compared a range at a time: no copy of the whole expected content."""
    mv = memoryview(got).cast("B")
    end = start + len(mv)
    at = start
    for s, e, h in sorted(ext) + [(end, end, 0)]:
        if e <= start or s > end:
            continue
        a, b = max(s, start), min(e, end)
        if a > at and mv[at - start:a - start] != bytes(a - at):
            return False            # a gap reads as zeros
        if b > a and mv[a - start:b - start] != memoryview(gen_view(h, a, b)):
            return False
        at = max(at, b)
    return True


def ext_hi_at(ext, off):
    for s, e, h in ext:
        if s <= off < e:
            return h
    return None


def ext_summary(ext, size, limit=6):
    parts = []
    for s, e, h in ext[:limit]:
        who = "zeros" if h == 0 else f"v{h & VER_MASK}"
        parts.append(f"[{s},{e}) {who}")
    more = f" +{len(ext) - limit} more" if len(ext) > limit else ""
    return f"size {size}: " + ", ".join(parts) + more


# ------------------------------------------------------ mismatch reports

def _first_diff(a, b):
    n = min(len(a), len(b))
    ma, mb = memoryview(a), memoryview(b)
    lo, hi = 0, n
    if ma[:n] == mb[:n]:
        return n
    while hi - lo > 256:
        mid = (lo + hi) // 2
        if ma[lo:mid] == mb[lo:mid]:
            lo = mid
        else:
            hi = mid
    for i in range(lo, hi):
        if a[i] != b[i]:
            return i
    return hi


class Names:
    """fid -> what it is, for reports (filled by whoever knows)."""

    def __init__(self, nworkers, nshared):
        self.nworkers, self.nshared = nworkers, nshared

    def fid(self, fid):
        if 1 <= fid <= self.nshared:
            return f"fid {fid} (shared/s{fid - 1})"
        k = fid - self.nshared - 1
        if k >= 0 and self.nworkers:
            return f"fid {fid} (worker {k % self.nworkers}'s inode #{k // self.nworkers})"
        return f"fid {fid} (unknown)"


def describe_word(word, pos, names, base=0):
    d = decode(word)
    if d is None:
        return "zeros"
    fid, ver, off = d
    if fid == 0:
        return f"a word of zeros and data mixed ({word:#018x})"
    text = f"{names.fid(fid)} v{ver} offset {off}"
    if off != pos:
        text += f" (shifted {off - pos:+d})"
    return text


def diff_report(got, exp, names, base=0, max_runs=12):
    """Lines describing where `got` differs from `exp` (both read from file
    offset `base`), decoded, by runs of 4 KiB pages with the same story."""
    lines = []
    if len(got) != len(exp):
        lines.append(f"length {len(got)}, expected {len(exp)}")
    first = _first_diff(got, exp)
    n = min(len(got), len(exp))
    if first >= n:
        if len(got) > n:          # the same up to the expected end: what follows?
            tail = diff_report(memoryview(got)[n:], bytes(len(got) - n), names,
                               base + n, max_runs)
            lines.append(f"the first {n} bytes as expected; beyond them:")
            lines += tail[1:]
        return lines
    PAGE = 4096
    runs = []
    mg, me = memoryview(got), memoryview(exp)

    def word(mv, i):
        return int.from_bytes(bytes(mv[i:i + 8]).ljust(8, b"\0"), "little")

    p = first - (base + first) % PAGE            # page-aligned in the file
    while p < n and len(runs) <= max_runs:
        q = min(p - (base + p) % PAGE + PAGE, n)
        lo = max(p, 0)
        if mg[lo:q] == me[lo:q]:
            key, text = ("ok",), "as expected"
        else:
            i = lo + _first_diff(mg[lo:q], me[lo:q])
            i -= (base + i) % 8                     # the file's word holding it
            if i < 0:
                i += 8
            if i + 8 > q:                           # no whole word here: the bytes
                key = ("bytes", bytes(mg[lo:q]), bytes(me[lo:q]))
                text = f"found bytes {bytes(mg[lo:q]).hex()}, expected {bytes(me[lo:q]).hex()}"
            else:
                gw, ew = word(mg, i), word(me, i)
                gd, ed = decode(gw), decode(ew)
                pos = base + i
                gkey = ("z",) if gd is None else (gd[0], gd[1], gd[2] - pos)
                ekey = ("z",) if ed is None else (ed[0], ed[1])
                key = (gkey, ekey)
                text = (f"found {describe_word(gw, pos, names)}; "
                        f"expected {describe_word(ew, pos, names)}")
        if runs and runs[-1][2] == key:
            runs[-1][1] = q
        else:
            runs.append([lo, q, key, text])
        p = q
    for s, e, key, text in runs[:max_runs]:
        lines.append(f"  file [{base + s}, {base + e}) ({e - s} bytes): {text}")
    if p < n:
        lines.append(f"  ... (not scanned past file offset {base + p})")
    lines.insert(0, f"first difference at file offset {base + first}")
    return lines


# ---------------------------------------------------------------- model

class Inode:
    __slots__ = ("fid", "ext", "size", "ver", "names", "nwfd", "cands", "shared")

    def __init__(self, fid, shared=False):
        self.fid = fid
        self.ext, self.size = (), 0
        self.ver = 0
        self.names = set()
        self.nwfd = 0              # writable descriptors open (held + transient)
        self.cands = [((), 0)]     # crash mode: acceptable versions, oldest first
        self.shared = shared

    def next_hi(self):
        self.ver += 1
        return stamp(self.fid, self.ver)

    def write(self, start, end, hi):
        self.ext, self.size = ext_write(self.ext, self.size, start, end, hi)

    def truncate(self, new):
        self.ext, self.size = ext_truncate(self.ext, self.size, new)

    def content(self, start=0, end=None):
        end = self.size if end is None else min(end, self.size)
        return ext_content(self.ext, start, max(start, end))

    def commit(self):
        """A commit point: the current content is a version."""
        v = (self.ext, self.size)
        if self.cands[-1] != v:
            self.cands.append(v)

    def acked(self, v):
        """fsync of version v returned: nothing older is acceptable."""
        if v in self.cands:
            self.cands = self.cands[self.cands.index(v):]
        else:
            self.cands = [v]


class Failure(Exception):
    pass


class Crashed(Exception):
    pass


class Handle:
    __slots__ = ("fd", "flags", "ino")

    def __init__(self, fd, flags, ino):
        self.fd, self.flags, self.ino = fd, flags, ino

    @property
    def writable(self):
        return (self.flags & os.O_ACCMODE) != os.O_RDONLY

    @property
    def readable(self):
        return (self.flags & os.O_ACCMODE) != os.O_WRONLY

    @property
    def append(self):
        return bool(self.flags & os.O_APPEND)


def pwrite_all(fd, data, off):
    mv = memoryview(data)
    done = 0
    while done < len(mv):
        n = os.pwrite(fd, mv[done:], off + done)
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite returned {n}")
        done += n


def write_all(fd, data):
    mv = memoryview(data)
    done = 0
    while done < len(mv):
        n = os.write(fd, mv[done:])
        if n <= 0:
            raise OSError(errno.EIO, f"write returned {n}")
        done += n


def pread_all(fd, n, off, chunk=None):
    out = bytearray()
    while len(out) < n:
        want = n - len(out) if chunk is None else min(chunk, n - len(out))
        b = os.pread(fd, want, off + len(out))
        if not b:
            break
        out += b
    return out


def read_seq(fd, chunk):
    out = bytearray()
    while True:
        b = os.read(fd, chunk)
        if not b:
            return out
        out += b


def fallocate(fd, mode, off, length):
    util.fallocate(fd, off, length, mode)


# ---------------------------------------------------------------- sync

class Sync:
    """What the main process shares with every worker."""

    def __init__(self, ctx, nworkers, crash):
        self.stop = ctx.Event()           # everybody stops
        self.failed = ctx.Event()         # ... because of a failure
        self.crash = ctx.Event()          # a kill is coming / happened
        self.barrier = ctx.Barrier(nworkers + 1) if crash else None
        self.mmap_sem = ctx.BoundedSemaphore(nworkers) if crash else None
        self.finished = ctx.Value("i", 0, lock=True)
        self.stats = ctx.Array("q", nworkers * 4, lock=False)  # ops, written, read, phase
        self.results = ctx.Queue()


# ---------------------------------------------------------------- worker

OPS_MIXED = [
    ("rewrite", 9), ("open", 6), ("close", 6), ("pwrite", 12), ("append", 5),
    ("pread", 12), ("verify", 6), ("punch", 3), ("zero", 1), ("falloc", 1),
    ("ftruncate", 4), ("truncate", 1), ("mmap", 4), ("fsync", 3), ("rename", 3),
    ("link", 1.5), ("unlink", 2), ("restore", 2), ("stat", 3), ("dropcache", 0.2),
    ("sh_write", 3), ("sh_read", 3), ("sh_verify", 0.5), ("sh_mmap", 0.5),
    ("copy", 1),
]
OPS_OVERWRITE = [("rewrite", 7), ("verify", 3)]


class Worker:
    def __init__(self, cfg, widx, sync, shared):
        self.cfg, self.w, self.sync = cfg, widx, sync
        self.rng = random.Random(f"{cfg.seed}:{widx}")
        self.names_info = Names(cfg.nworkers, len(shared))
        self.dirname = f"w{widx}"
        self.dir = os.path.join(cfg.root, self.dirname)
        self.made_dir = False    # its directory made (run)
        self.files = {}          # name -> Inode
        self.held = {}           # fid -> Handle
        self.orphans = {}        # fid -> Inode: unlinked, held open
        self.nfid = 0
        self.hist = collections.deque(maxlen=HISTORY)
        self.opno = 0
        self.inflight = None     # a namespace operation not known to be done
        self.crashes = 0
        self.moved = 0
        self.t0 = time.monotonic()
        self.rate_share = cfg.rate * MiB / cfg.nworkers if cfg.rate else 0
        # shared files: fid, path, region start, region size, our Inode view
        self.shared = []
        for k, (fid, path, region) in enumerate(shared):
            ino = Inode(fid, shared=True)
            ino.ext, ino.size = ((0, region * cfg.nworkers, 0),), region * cfg.nworkers
            self.shared.append([fid, path, widx * region, region, ino, 0])
        ops = OPS_OVERWRITE if cfg.workload == "overwrite" else OPS_MIXED
        if not shared:
            ops = [(n, wt) for n, wt in ops if not n.startswith("sh_")]
        ops = [(n, wt) for n, wt in ops if n not in cfg.skip_ops]
        self.op_names = [n for n, _ in ops]
        self.op_weights = [wt for _, wt in ops]
        self.log = open(os.path.join(cfg.workdir, f"ops.w{widx}.log"), "w", buffering=1)
        self.max_files = cfg.files
        self.pool = [f"f{i}" for i in range(cfg.files * 2)]

    # -- bookkeeping
    def note(self, text):
        line = f"#{self.opno} {text}"
        self.hist.append(line)
        self.log.write(line + "\n")

    def stat_add(self, i, n):
        self.sync.stats[self.w * 4 + i] += n
        self.moved += n

    def throttle(self):
        """--rate: keep this worker's bytes moved (written + read) at its
        share of the rate, sleeping between operations when ahead."""
        if not self.cfg.rate:
            return
        ahead = self.moved / self.rate_share - (time.monotonic() - self.t0)
        if ahead > 0:
            time.sleep(min(ahead, 1.0))

    def path(self, name):
        return os.path.join(self.dir, name)

    def new_inode(self):
        fid = len(self.shared) + 1 + self.w + self.cfg.nworkers * self.nfid
        self.nfid += 1
        if fid >= 1 << FID_BITS:
            raise Failure(f"worker {self.w} created more than {self.nfid - 1} files: "
                          f"file ids exhausted")
        return Inode(fid)

    def live_inodes(self):
        seen = {}
        for ino in self.files.values():
            seen[ino.fid] = ino
        for fid, ino in self.orphans.items():
            seen[fid] = ino
        return seen

    def pick_size(self):
        r = self.rng.random()
        mx = self.cfg.max_size
        if self.cfg.workload == "overwrite":
            size = self.rng.randint(MiB, mx)
        elif r < 0.55:
            size = self.rng.randint(4 * KiB, 128 * KiB)
        elif r < 0.85:
            size = self.rng.randint(128 * KiB, 2 * MiB)
        elif r < 0.98:
            size = self.rng.randint(2 * MiB, 16 * MiB)
        else:
            size = self.rng.randint(16 * MiB, mx)
        size = min(size, mx)
        if self.rng.random() < 0.5:
            size = max(4 * KiB, size // (4 * KiB) * (4 * KiB))
        return size

    def pick_len(self, small=False):
        r = self.rng.random()
        if r < 0.35:
            n = self.rng.randint(1, 4096)
        elif r < 0.6:
            n = 4096 * self.rng.randint(1, 16)
        elif r < 0.9 or small:
            n = self.rng.randint(1, 256 * KiB)
        elif r < 0.98:
            n = MiB
        else:
            n = self.rng.randint(MiB, 4 * MiB)
        return n

    def pick_file(self):
        if not self.files:
            return None, None
        name = self.rng.choice(sorted(self.files))
        return name, self.files[name]

    def pick_inode(self):
        """Any live inode, orphans (unlinked, held open) included."""
        live = self.live_inodes()
        if not live:
            return None
        return live[self.rng.choice(sorted(live))]

    def expect_model(self, got, ino, start, end, what, base=0):
        """expect(got, ino.content(start, end), ...), compared without a
        copy of the expected bytes while they match."""
        end = max(start, min(end, ino.size))
        if len(got) == end - start and ext_equal(ino.ext, got, start):
            return
        self.expect(got, ino.content(start, end), what, ino, base)

    def expect(self, got, want, what, ino, base=0):
        if got == want:
            return
        if self.sync.crash.is_set():
            raise Crashed()
        lines = [f"{what}: {self.ino_text(ino)} read wrong data"]
        lines += diff_report(got, want, self.names_info, base)
        raise Failure("\n".join(lines))

    def ino_text(self, ino):
        names = sorted(ino.names)
        where = ", ".join(f"{self.dirname}/{n}" for n in names) if names else "(unlinked)"
        if ino.shared:
            where = "shared file"
        return f"{where} [{self.names_info.fid(ino.fid)}], model {ext_summary(ino.ext, ino.size)}"

    # -- descriptors
    def open_fd(self, ino, flags, name=None):
        """A transient descriptor of ino (by one of its names, else the held one)."""
        if name is None:
            if not ino.names:
                return None
            name = self.rng.choice(sorted(ino.names))
        fd = os.open(self.path(name), flags)
        if (flags & os.O_ACCMODE) != os.O_RDONLY:
            ino.nwfd += 1
        return fd

    def close_fd(self, fd, ino, writable):
        if writable:
            ino.commit()           # a writable descriptor's close: a version
            os.close(fd)
            ino.nwfd -= 1
        else:
            os.close(fd)

    def fd_for(self, ino, need_write=False, need_read=False, no_append=False):
        """(fd, Handle or None): the held descriptor when usable, else a new one."""
        h = self.held.get(ino.fid)
        if h and (not need_write or h.writable) and (not need_read or h.readable) \
                and not (no_append and h.append) and self.rng.random() < 0.7:
            return h.fd, h
        if not ino.names:
            if h and (not need_write or h.writable) and (not need_read or h.readable):
                return h.fd, h
            return None, None
        if need_write and need_read:
            flags = os.O_RDWR
        elif need_write:
            flags = os.O_WRONLY
        else:
            flags = os.O_RDONLY
        return self.open_fd(ino, flags), None

    def done_fd(self, fd, h, ino, writable):
        if h is None:
            self.close_fd(fd, ino, writable)

    def forget_if_dead(self, ino):
        if not ino.names and ino.fid not in self.held:
            self.orphans.pop(ino.fid, None)
        elif not ino.names:
            self.orphans[ino.fid] = ino

    def open_trunc(self, name, ino):
        """open(O_WRONLY|O_CREAT|O_TRUNC) of name (ino: its inode, None
        when new, then made): (fd, ino), counted as a writable descriptor."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        if ino is None:
            ino = self.new_inode()
            self.inflight = ("create", name, ino)
            fd = os.open(self.path(name), flags, 0o644)
            self.inflight = None
            ino.names.add(name)
            self.files[name] = ino
            self.note(f"  created {name} fid {ino.fid}")
        else:
            fd = os.open(self.path(name), flags, 0o644)
        ino.nwfd += 1
        return fd, ino

    def write_new(self, name, ino, do_fsync, body):
        """name's content replaced: opened with O_TRUNC (made if new), the
        new bytes written by body(fd, ino), fsynced if asked, closed; the
        model follows, also when an operation fails half way."""
        fd, ino = self.open_trunc(name, ino)
        try:
            ino.truncate(0)
            body(fd, ino)
            if do_fsync:
                self.fsync_fd(fd, ino)
        except BaseException:
            self.fd_lost(fd, ino, True)
            raise
        self.close_fd(fd, ino, True)

    # -- operations
    def op_rewrite(self):
        exists = [n for n in self.pool if n in self.files]
        if exists and (len(exists) >= self.max_files or self.rng.random() < 0.7):
            name = self.rng.choice(sorted(exists))
        else:
            name = self.rng.choice([n for n in self.pool if n not in self.files])
        size = self.pick_size()
        chunking = self.rng.choice(["1M", "1M", "odd", "mixed"])
        do_fsync = self.rng.random() < 0.5
        ino = self.files.get(name)
        self.note(f"rewrite {name} ({'fid %d' % ino.fid if ino else 'new'}) size {size} "
                  f"chunks {chunking}{' fsync' if do_fsync else ''}")

        def body(fd, ino):
            hi = ino.next_hi()
            pos = 0
            while pos < size:
                if chunking == "1M":
                    n = MiB
                elif chunking == "odd":
                    n = self.rng.randint(1, 2 * MiB) | 1
                else:
                    n = self.rng.choice([MiB, 4097, 65536, 131071, 3 * MiB + 5, 512])
                n = min(n, size - pos)
                write_all(fd, gen(hi, pos, pos + n))
                ino.write(pos, pos + n, hi)
                pos += n
                self.stat_add(1, n)
        self.write_new(name, ino, do_fsync, body)

    def op_copy(self):
        """A file's content (read through the mount, checked) written as
        another file's new content at the same offsets, like a checkpoint
        that repeats an earlier one: with -o dedup its chunks are found in
        the source's version and cloned, while the source goes on being
        changed in place."""
        # small sources: a copy adds a file as large as its source, and
        # after each kill every file is read back
        small = sorted(n for n, i in self.files.items() if i.size <= 2 * MiB)
        if not small:
            return self.op_rewrite()
        src_name = self.rng.choice(small)
        src = self.files[src_name]
        fd = os.open(self.path(src_name), os.O_RDONLY)
        try:
            got = read_seq(fd, MiB)
        finally:
            os.close(fd)
        self.stat_add(2, len(got))
        self.expect(got, bytes(src.content()), f"copy source {src_name}", src)
        ext, size = src.ext, src.size
        exists = [n for n in self.pool if n in self.files and n != src_name]
        if exists and (len(exists) >= self.max_files or self.rng.random() < 0.5):
            name = self.rng.choice(sorted(exists))
        else:
            free = [n for n in self.pool if n not in self.files]
            if not free:
                return
            name = self.rng.choice(free)
        do_fsync = self.rng.random() < 0.5
        ino = self.files.get(name)
        self.note(f"copy {src_name} (fid {src.fid}, size {size}) to {name} "
                  f"({'fid %d' % ino.fid if ino else 'new'}){' fsync' if do_fsync else ''}")

        def body(fd, ino):
            pos = 0
            while pos < size:
                n = min(self.rng.choice([MiB, MiB, 65536, 3 * MiB + 5]), size - pos)
                write_all(fd, got[pos:pos + n])
                for s0, e0, h in ext:       # the source's pieces in [pos, pos + n)
                    a, b = max(s0, pos), min(e0, pos + n)
                    if a < b:
                        ino.write(a, b, h)
                pos += n
                self.stat_add(1, n)
        self.write_new(name, ino, do_fsync, body)

    def fd_lost(self, fd, ino, writable):
        try:
            os.close(fd)
        except OSError:
            pass
        if writable:
            ino.nwfd -= 1

    def fsync_fd(self, fd, ino):
        ino.commit()
        v = (ino.ext, ino.size)
        os.fsync(fd)
        ino.acked(v)

    def op_open(self):
        cands = [ino for ino in self.files.values() if ino.fid not in self.held]
        if not cands:
            return self.op_rewrite()
        ino = self.rng.choice(sorted(cands, key=lambda i: i.fid))
        r = self.rng.random()
        flags = os.O_RDWR if r < 0.6 else (os.O_RDWR | os.O_APPEND if r < 0.8 else os.O_RDONLY)
        name = self.rng.choice(sorted(ino.names))
        self.note(f"open {name} fid {ino.fid} flags {flags:#o}")
        fd = self.open_fd(ino, flags, name)
        self.held[ino.fid] = Handle(fd, flags, ino)

    def op_close(self):
        if not self.held:
            return self.op_open()
        fid = self.rng.choice(sorted(self.held))
        h = self.held.pop(fid)
        self.note(f"close fid {fid} (flags {h.flags:#o})")
        try:
            self.close_fd(h.fd, h.ino, h.writable)
        finally:
            self.forget_if_dead(h.ino)

    def op_pwrite(self):
        ino = self.pick_inode()
        if ino is None:
            return self.op_rewrite()
        fd, h = self.fd_for(ino, need_write=True)
        if fd is None:
            return
        n = self.pick_len()
        r = self.rng.random()
        if r < 0.1:
            off = ino.size + self.rng.randint(0, 2 * MiB)      # past EOF: a hole
        elif r < 0.2:
            off = max(0, ino.size - self.rng.randint(0, n))    # across EOF
        else:
            off = self.rng.randint(0, max(0, ino.size - 1))
        if self.rng.random() < 0.3:
            off &= ~4095
        if h is not None and h.append:
            off = ino.size                 # pwrite on O_APPEND appends (Linux)
        off = min(off, MAX_FILE - 1)
        n = max(1, min(n, MAX_FILE - off))
        hi = ino.next_hi()
        self.note(f"pwrite fid {ino.fid} {n}@{off} v{ino.ver} "
                  f"({'held' if h else 'own fd'}{' append' if h and h.append else ''})")
        try:
            pwrite_all(fd, gen(hi, off, off + n), off)
            ino.write(off, off + n, hi)
            self.stat_add(1, n)
        except BaseException:
            if h is None:
                self.fd_lost(fd, ino, True)
            raise
        self.done_fd(fd, h, ino, True)

    def op_append(self):
        ino = self.pick_inode()
        if ino is None or ino.size >= MAX_FILE - 4 * MiB:
            return self.op_rewrite()
        h = self.held.get(ino.fid)
        own = not (h and h.append)
        if own:
            if not ino.names:
                return
            fd = self.open_fd(ino, os.O_WRONLY | os.O_APPEND)
        else:
            fd = h.fd
        n = self.pick_len()
        off = ino.size
        hi = ino.next_hi()
        self.note(f"append fid {ino.fid} {n}@{off} v{ino.ver} ({'own fd' if own else 'held'})")
        try:
            write_all(fd, gen(hi, off, off + n))
            ino.write(off, off + n, hi)
            self.stat_add(1, n)
        except BaseException:
            if own:
                self.fd_lost(fd, ino, True)
            raise
        if own:
            self.close_fd(fd, ino, True)

    def op_pread(self):
        ino = self.pick_inode()
        if ino is None:
            return self.op_rewrite()
        fd, h = self.fd_for(ino, need_read=True)
        if fd is None:
            return
        n = self.pick_len()
        off = self.rng.randint(0, ino.size + 4096)
        self.note(f"pread fid {ino.fid} {n}@{off} ({'held' if h else 'own fd'})")
        try:
            got = pread_all(fd, n, off, chunk=self.rng.choice([None, 4096, 128 * KiB]))
        except BaseException:
            if h is None:
                self.fd_lost(fd, ino, False)
            raise
        self.done_fd(fd, h, ino, False)
        self.stat_add(2, len(got))
        self.expect_model(got, ino, off, off + n, f"pread {n}@{off}", base=off)

    def verify_name(self, name, ino, what="verify"):
        fd = os.open(self.path(name), os.O_RDONLY)
        try:
            st = os.fstat(fd)
            chunk = self.rng.choice([MiB, 128 * KiB, 65537, 4 * MiB])
            got = read_seq(fd, chunk)
        finally:
            os.close(fd)
        self.stat_add(2, len(got))
        if st.st_size != ino.size and not self.sync.crash.is_set():
            raise Failure(f"{what} {self.dirname}/{name}: fstat size {st.st_size}, expected "
                          f"{ino.size}; {self.ino_text(ino)}")
        self.expect_model(got, ino, 0, ino.size, f"{what} {self.dirname}/{name}")

    def op_verify(self):
        name, ino = self.pick_file()
        if ino is None:
            return self.op_rewrite()
        self.note(f"verify {name} fid {ino.fid} size {ino.size}")
        self.verify_name(name, ino)

    def op_punch(self, mode=FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, what="punch"):
        ino = self.pick_inode()
        if ino is None or ino.size == 0:
            return self.op_rewrite()
        fd, h = self.fd_for(ino, need_write=True)
        if fd is None:
            return
        off = self.rng.randint(0, ino.size - 1)
        if self.rng.random() < 0.5:
            off &= ~4095
        n = self.pick_len()
        if not mode & FALLOC_FL_KEEP_SIZE:
            n = min(n, MAX_FILE - off)
        self.note(f"{what} fid {ino.fid} {n}@{off} (size {ino.size})")
        try:
            fallocate(fd, mode, off, n)
        except BaseException:
            if h is None:
                self.fd_lost(fd, ino, True)
            raise
        end = off + n
        if mode & FALLOC_FL_KEEP_SIZE:
            end = min(end, ino.size)
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            ino.write(off, end, 0)
        elif end > ino.size:             # plain fallocate: grows, zeros
            ino.truncate(end)
        self.done_fd(fd, h, ino, True)

    def op_zero(self):
        mode = FALLOC_FL_ZERO_RANGE | (FALLOC_FL_KEEP_SIZE if self.rng.random() < 0.5 else 0)
        return self.op_punch(mode, "zero_range")

    def op_falloc(self):
        return self.op_punch(0, "fallocate")

    def new_size(self, ino):
        r = self.rng.random()
        if r < 0.15:
            return 0
        if r < 0.6 and ino.size:
            return self.rng.randint(0, ino.size)
        return min(MAX_FILE, ino.size + self.rng.randint(1, 2 * MiB))

    def op_ftruncate(self):
        ino = self.pick_inode()
        if ino is None:
            return self.op_rewrite()
        fd, h = self.fd_for(ino, need_write=True)
        if fd is None:
            return
        size = self.new_size(ino)
        self.note(f"ftruncate fid {ino.fid} {ino.size} -> {size} ({'held' if h else 'own fd'})")
        try:
            os.ftruncate(fd, size)
        except BaseException:
            if h is None:
                self.fd_lost(fd, ino, True)
            raise
        ino.truncate(size)
        self.done_fd(fd, h, ino, True)

    def op_truncate(self):
        name, ino = self.pick_file()
        if ino is None:
            return self.op_rewrite()
        size = self.new_size(ino)
        self.note(f"truncate {name} fid {ino.fid} {ino.size} -> {size}")
        quiet = ino.nwfd == 0
        old = (ino.ext, ino.size)
        ino.truncate(size)
        if quiet:
            ino.commit()               # no writer open: the new size is a version
        new = (ino.ext, ino.size)
        ino.ext, ino.size = old
        os.truncate(self.path(name), size)
        ino.ext, ino.size = new

    def op_mmap(self):
        ino = self.pick_inode()
        if ino is None or ino.size == 0 or not ino.names:
            return self.op_rewrite()
        sem = self.sync.mmap_sem
        if sem is not None:
            self.mmap_permit(sem)
        try:
            self._mmap(ino, None, 0, ino.size)
        finally:
            if sem is not None:
                sem.release()

    def mmap_permit(self, sem):
        """No kill while a file is mapped (a fault on a dead mount is SIGBUS)."""
        if self.sync.crash.is_set():
            raise Crashed()
        sem.acquire()
        if self.sync.crash.is_set():
            sem.release()
            raise Crashed()

    def _mmap(self, ino, shared, lo, hi_end):
        """Map ino whole; write [lo, hi_end) ranges, read back, flush, unmap."""
        size = ino.size
        if shared is None:
            self.note(f"mmap fid {ino.fid} size {size}")
        fd = self.open_fd(ino, os.O_RDWR, name=shared)
        try:
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                for _ in range(self.rng.randint(1, 3)):
                    off = self.rng.randint(lo, hi_end - 1)
                    n = min(self.pick_len(small=True), hi_end - off)
                    if self.rng.random() < 0.5:
                        hi = ino.next_hi() if not ino.shared else self.shared_hi(ino)
                        self.note(f"  mmap write fid {ino.fid} {n}@{off} v{hi & VER_MASK}")
                        mm[off:off + n] = gen(hi, off, off + n)
                        ino.write(off, off + n, hi)
                        self.stat_add(1, n)
                    else:
                        self.note(f"  mmap read fid {ino.fid} {n}@{off}")
                        got = mm[off:off + n]
                        self.stat_add(2, n)
                        self.expect(got, ino.content(off, off + n), f"mmap read {n}@{off}",
                                    ino, base=off)
                mm.flush()
            finally:
                mm.close()
        except BaseException:
            self.fd_lost(fd, ino, True)
            raise
        self.close_fd(fd, ino, True)

    def op_fsync(self):
        ino = self.pick_inode()
        if ino is None:
            return self.op_rewrite()
        fd, h = self.fd_for(ino)
        if fd is None:
            return
        self.note(f"fsync fid {ino.fid} ({'held' if h else 'own fd'}) size {ino.size}")
        try:
            self.fsync_fd(fd, ino)
        except BaseException:
            if h is None:
                self.fd_lost(fd, ino, False)
            raise
        self.done_fd(fd, h, ino, False)

    def drop_name(self, name):
        ino = self.files.pop(name)
        ino.names.discard(name)
        self.forget_if_dead(ino)

    def op_rename(self):
        name, ino = self.pick_file()
        if ino is None:
            return self.op_rewrite()
        target = self.rng.choice([n for n in self.pool if n != name])
        over = self.files.get(target)
        self.note(f"rename {name} (fid {ino.fid}) -> {target}"
                  + (f" over fid {over.fid}" if over else ""))
        self.inflight = ("rename", name, target)
        os.rename(self.path(name), self.path(target))
        self.inflight = None
        self.apply_rename(name, target)

    def apply_rename(self, name, target):
        ino = self.files[name]
        if target in self.files:
            if self.files[target] is ino:     # hard links of one inode: no-op
                return
            self.drop_name(target)
        del self.files[name]
        ino.names.discard(name)
        ino.names.add(target)
        self.files[target] = ino

    def op_link(self):
        name, ino = self.pick_file()
        free = [n for n in self.pool if n not in self.files]
        if ino is None or not free:
            return self.op_unlink() if ino else self.op_rewrite()
        target = self.rng.choice(free)
        self.note(f"link {name} (fid {ino.fid}) -> {target}")
        self.inflight = ("link", name, target)
        os.link(self.path(name), self.path(target))
        self.inflight = None
        ino.names.add(target)
        self.files[target] = ino

    def op_unlink(self):
        name, ino = self.pick_file()
        if ino is None or len(self.files) < 2:
            return self.op_rewrite()
        self.note(f"unlink {name} (fid {ino.fid}{', held open' if ino.fid in self.held else ''})")
        self.inflight = ("unlink", name)
        os.unlink(self.path(name))
        self.inflight = None
        self.drop_name(name)

    def op_restore(self):
        if not self.files:
            return self.op_rewrite()
        names = sorted(self.files)
        k = self.rng.randint(1, min(4, len(names)))
        order = self.rng.sample(names, k)
        self.note(f"restore_order {order}")
        value = ("\n".join(order) + "\n").encode()
        try:
            os.setxattr(self.dir, RESTORE_XATTR, value)
        except OSError as e:
            if not (self.cfg.plain and e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP)):
                raise
        for name in order:
            self.verify_name(name, self.files[name], "restore read")

    def op_stat(self):
        name, ino = self.pick_file()
        if ino is None:
            return self.op_rewrite()
        self.note(f"stat {name} fid {ino.fid}")
        st = os.stat(self.path(name))
        if (st.st_size, st.st_nlink) != (ino.size, len(ino.names)) and \
                not self.sync.crash.is_set():
            raise Failure(f"stat {self.dirname}/{name}: size {st.st_size} nlink {st.st_nlink}, "
                          f"expected size {ino.size} nlink {len(ino.names)}; "
                          f"{self.ino_text(ino)}")

    def op_dropcache(self):
        self.note("drop_caches")
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError:
            pass

    # -- shared files: our region only
    def shared_hi(self, ino):
        for sh in self.shared:
            if sh[4] is ino:
                sh[5] += 1
                return stamp(ino.fid, (self.w << 16) | (sh[5] & 0xFFFF))
        raise AssertionError("not a shared inode")

    def pick_shared(self):
        return self.rng.choice(self.shared)

    def op_sh_write(self):
        fid, path, lo, region, ino, _ = self.pick_shared()
        off = self.rng.randint(lo, lo + region - 1)
        n = min(self.pick_len(small=True), lo + region - off)
        hi = self.shared_hi(ino)
        self.note(f"shared write s{fid - 1} {n}@{off} v{hi & VER_MASK}")
        fd = os.open(path, os.O_WRONLY)
        try:
            pwrite_all(fd, gen(hi, off, off + n), off)
            ino.write(off, off + n, hi)
            self.stat_add(1, n)
        finally:
            os.close(fd)

    def op_sh_read(self):
        fid, path, lo, region, ino, _ = self.pick_shared()
        off = self.rng.randint(lo, lo + region - 1)
        n = min(self.pick_len(small=True), lo + region - off)
        self.note(f"shared read s{fid - 1} {n}@{off}")
        fd = os.open(path, os.O_RDONLY)
        try:
            got = pread_all(fd, n, off)
        finally:
            os.close(fd)
        self.stat_add(2, len(got))
        self.expect_model(got, ino, off, off + n, f"shared read {n}@{off}", base=off)

    def op_sh_verify(self, weak_all=False):
        fid, path, lo, region, ino, _ = self.pick_shared()
        self.note(f"shared verify s{fid - 1}")
        self.shared_check(fid, path, lo, region, ino, exact=not weak_all)

    def shared_check(self, fid, path, lo, region, ino, exact=True):
        with open(path, "rb") as f:
            got = f.read()
        self.stat_add(2, len(got))
        if len(got) != ino.size and not self.sync.crash.is_set():
            raise Failure(f"shared file s{fid - 1}: size {len(got)}, expected {ino.size}")
        if exact:
            self.expect(got[lo:lo + region], ino.content(lo, lo + region),
                        f"shared s{fid - 1} region of worker {self.w}", ino, base=lo)
        # everybody's regions, weakly: each page's first and last word is
        # zero or this file's data at its own offset
        for p in range(0, len(got), 4096):
            for i in (p, min(p + 4088, len(got) - 8)):
                if i < 0:
                    continue
                word = int.from_bytes(got[i:i + 8], "little")
                if weak_word_ok(word, fid, i):
                    continue
                if self.sync.crash.is_set():
                    raise Crashed()
                raise Failure(f"shared file s{fid - 1}: offset {i} holds "
                              f"{describe_word(word, i, self.names_info)}")

    def op_sh_mmap(self):
        fid, path, lo, region, ino, _ = self.pick_shared()
        sem = self.sync.mmap_sem
        if sem is not None:
            self.mmap_permit(sem)
        self.note(f"shared mmap s{fid - 1} region [{lo}, {lo + region})")
        try:
            self._mmap(ino, path, lo, lo + region)
        finally:
            if sem is not None:
                sem.release()

    # -- the loop
    def run(self, quota, deadline):
        try:
            os.makedirs(self.dir, exist_ok=True)
            self.made_dir = True
        except OSError:
            pass                # a kill came first: made after the remount
        self.note(f"worker {self.w} seed {self.cfg.seed} quota {quota}")
        done = 0
        while done < quota and time.monotonic() < deadline and not self.sync.stop.is_set():
            if self.sync.crash.is_set():
                self.crash_protocol()
                continue
            self.opno += 1
            if self.cfg.inject_corruption and self.w == 0 and \
                    self.opno >= self.cfg.inject_corruption and self.inject():
                self.cfg.inject_corruption = 0
                continue
            op = self.rng.choices(self.op_names, self.op_weights)[0]
            try:
                getattr(self, "op_" + op)()
            except Crashed:
                self.crash_protocol()
            except OSError as e:
                if self.sync.crash.is_set():
                    self.note(f"  -> {e} (crash)")
                    self.crash_protocol()
                else:
                    raise Failure(f"{self.hist[-1] if self.hist else op}: failed "
                                  f"unexpectedly: {e!r}\n"
                                  f"{traceback.format_exc(limit=3)}")
            done += 1
            self.sync.stats[self.w * 4] += 1
            self.throttle()
        return done

    def inject(self):
        """Self-test: put worker 1's data into one of our files behind the
        model's back, then verify that file (which must fail)."""
        names = [n for n in sorted(self.files) if self.files[n].size >= 8192]
        if not names:
            return False
        name = names[0]
        ino = self.files[name]
        fid = self.new_inode().fid + 1          # the next worker's
        off = ino.size // 2 & ~7
        self.note(f"inject: fid {fid} data into {name} at {off} (self-test)")
        fd = os.open(self.path(name), os.O_WRONLY)
        try:
            pwrite_all(fd, gen(stamp(fid, 1), off + 4096, off + 8192), off)
        finally:
            os.close(fd)
        self.verify_name(name, ino)
        return True

    def idle(self):
        """Done: take part in the crashes still to come, until stop."""
        while not self.sync.stop.is_set():
            if self.sync.crash.is_set():
                self.crash_protocol()
            time.sleep(0.05)

    def finish(self):
        """Close everything and verify every file; return the final model."""
        self.opno += 1
        self.note("final: close all, verify all")
        for fid in sorted(self.held):
            h = self.held.pop(fid)
            self.close_fd(h.fd, h.ino, h.writable)
            self.forget_if_dead(h.ino)
        for name in sorted(self.files):
            self.verify_name(name, self.files[name], "final verify")
        for fid, path, lo, region, ino, _ in self.shared:
            self.shared_check(fid, path, lo, region, ino)
        return self.dump()

    def dump(self):
        files = {name: (ino.fid, ino.ext, ino.size) for name, ino in self.files.items()}
        shared = {fid: (lo, region, ino.ext) for fid, path, lo, region, ino, _ in self.shared}
        return {"dir": self.dirname, "files": files, "shared": shared}

    # -- crashes
    def crash_protocol(self):
        """The daemon was (is being) killed: drop descriptors, wait for the
        remount, check every file against its versions, go on.  A kill
        during the check (the next one may come at any time) starts over:
        what was checked stays valid, the rest is checked after the next
        remount."""
        while True:
            self.crashes += 1
            self.note(f"crash {self.crashes}: in-flight namespace op "
                      f"{self.inflight[:2] if self.inflight else None}")
            self.sync.barrier.wait(timeout=self.cfg.hang_timeout)       # all stopped
            # the held descriptors are closed once the daemon is dead: the
            # crash flag is raised just before the kill, and a close that
            # reached the live daemon would be a commit point the model
            # never saw (a version made by rename is durable at once)
            for fid in sorted(self.held):
                h = self.held.pop(fid)
                try:
                    os.close(h.fd)
                except OSError:
                    pass
            for ino in self.live_inodes().values():
                ino.nwfd = 0
            self.orphans.clear()
            self.sync.barrier.wait(timeout=self.cfg.hang_timeout)       # remounted
            try:
                self.check_after_crash()
                return
            except (OSError, Crashed, Failure) as e:
                if not self.sync.crash.is_set():
                    raise
                self.note(f"  killed again during the check: {e!r}")

    def check_after_crash(self):
        if not self.made_dir:
            # the kill came before this worker's directory was made
            os.makedirs(self.dir, exist_ok=True)
            self.made_dir = True
        listing = {n for n in os.listdir(self.dir) if not n.startswith(".tierfs")}
        if self.inflight:
            kind = self.inflight[0]
            if kind == "create":
                _, name, ino = self.inflight
                if name in listing:
                    ino.names.add(name)
                    self.files[name] = ino
            elif kind == "rename":
                _, a, b = self.inflight
                if a not in listing and a in self.files:
                    self.apply_rename(a, b)
            elif kind == "link":
                _, a, b = self.inflight
                if b in listing and b not in self.files:
                    self.files[b] = self.files[a]
                    self.files[a].names.add(b)
            elif kind == "unlink":
                _, a = self.inflight
                if a not in listing and a in self.files:
                    self.drop_name(a)
            self.note(f"  in-flight {kind} resolved from the listing")
            self.inflight = None
        want = set(self.files)
        if listing != want:
            raise Failure(f"after crash {self.crashes}: {self.dirname}/ holds "
                          f"{sorted(listing)}, expected {sorted(want)} "
                          f"(missing {sorted(want - listing)}, extra {sorted(listing - want)})")
        for name in sorted(self.files):
            ino = self.files[name]
            with open(self.path(name), "rb") as f:
                got = f.read()
            self.stat_add(2, len(got))
            match = None
            for v in reversed(ino.cands):
                if v[1] == len(got) and ext_equal(v[0], got):
                    match = v
                    break
            if match is None and self.cfg.plain:
                cur = (ino.ext, ino.size)            # nothing is lost without a daemon
                if cur[1] == len(got) and ext_equal(cur[0], got):
                    match = cur
            if match is None:
                lines = [f"after crash {self.crashes}: {self.dirname}/{name} "
                         f"[{self.names_info.fid(ino.fid)}] is none of its "
                         f"{len(ino.cands)} acceptable versions (the first is the last "
                         f"fsync-acknowledged one, or the creation)"]
                for i, (ext, size) in enumerate(ino.cands):
                    lines.append(f"  version {i}: {ext_summary(ext, size)}")
                best = ino.cands[-1]
                for v in ino.cands:
                    if v[1] == len(got):
                        best = v
                lines.append(f"  compared with version {ino.cands.index(best)}:")
                lines += diff_report(got, ext_content(best[0], 0, best[1]), self.names_info)
                raise Failure("\n".join(lines))
            ino.ext, ino.size = match
            ino.cands = [match]
        for sh in self.shared:
            fid, path, lo, region, ino, _ = sh
            self.shared_check(fid, path, lo, region, ino, exact=False)
            # our region's content is not known: write it whole again
            hi = self.shared_hi(ino)
            self.note(f"  shared s{fid - 1}: rewrite region [{lo}, {lo + region}) v{hi & VER_MASK}")
            fd = os.open(path, os.O_WRONLY)
            try:
                pwrite_all(fd, gen(hi, lo, lo + region), lo)
            finally:
                os.close(fd)
            ino.write(lo, lo + region, hi)
        self.note(f"crash {self.crashes}: all {len(self.files)} files are complete versions")


def worker_thread(cfg, widx, sync, shared, quota, deadline):
    wk = None
    try:
        wk = Worker(cfg, widx, sync, shared)
        done = wk.run(quota, deadline)
        with sync.finished.get_lock():
            sync.finished.value += 1
        if cfg.crash:
            wk.idle()
        if sync.failed.is_set():
            sync.results.put(("aborted", widx, "another worker failed", []))
            return
        model = wk.finish()
        sync.results.put(("done", widx, done, model))
    except BaseException as e:
        hist = list(wk.hist) if wk else []
        if sync.failed.is_set() and not isinstance(e, Failure):
            sync.results.put(("aborted", widx, repr(e), hist))
            return
        text = str(e) if isinstance(e, Failure) else \
            f"unexpected exception: {traceback.format_exc()}"
        sync.results.put(("fail", widx, text, hist))
        sync.failed.set()
        sync.stop.set()
        if sync.barrier is not None:
            sync.barrier.abort()


def worker_process(cfg, pidx, sync, shared, quotas, deadline):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads = []
    for t in range(cfg.threads):
        widx = pidx * cfg.threads + t
        th = threading.Thread(target=worker_thread,
                              args=(cfg, widx, sync, shared, quotas[widx], deadline))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()


# ---------------------------------------------------------------- main

class Run:
    def __init__(self, cfg):
        self.cfg = cfg
        self.mount = None
        self.rng = random.Random(f"{cfg.seed}:main")
        self.failures = []
        self.crashes = 0

    def out(self, text):
        print(text, flush=True)

    def fail(self, text):
        self.failures.append(text)

    # -- set-up
    def start(self):
        cfg = self.cfg
        if cfg.plain:
            cfg.root = os.path.join(cfg.plain, f"torture-{cfg.seed}")
            if os.path.exists(cfg.root):
                shutil.rmtree(cfg.root)
            os.makedirs(cfg.root)
            return
        opts = {"host_cache": cfg.host_cache, "evict": cfg.policy}
        for item in filter(None, cfg.mount_opts.split(",")):
            k, _, v = item.partition("=")
            opts[k] = v if v else True
        util.PLAIN = False          # a daemon, whatever TIERFS_TEST_PLAIN says
        backing = None
        if cfg.backing:             # e.g. on a reflink file system, for -o dedup
            backing = os.path.join(cfg.backing, f"torture.{os.getpid()}")
            os.makedirs(backing)
        self.mount = util.Mount(os.path.join(cfg.workdir, "tierfs"), opts, backing=backing)
        self.mount.start()
        cfg.root = self.mount.mnt

    def make_shared(self):
        cfg = self.cfg
        shared = []
        if cfg.shared == 0:
            return shared
        os.makedirs(os.path.join(cfg.root, "shared"), exist_ok=True)
        for k in range(cfg.shared):
            region = self.rng.choice([64 * KiB, 256 * KiB, MiB, 2 * MiB])
            path = os.path.join(cfg.root, "shared", f"s{k}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.ftruncate(fd, region * cfg.nworkers)
            os.fsync(fd)
            os.close(fd)
            shared.append((k + 1, path, region))
        return shared

    # -- the run
    def run(self):
        cfg = self.cfg
        build_template()
        self.start()
        shared = self.make_shared()
        ctx = multiprocessing.get_context("fork")
        sync = Sync(ctx, cfg.nworkers, cfg.crash)
        W = cfg.nworkers
        total = cfg.ops if cfg.ops else 1 << 62
        quotas = [total // W + (1 if i < total % W else 0) for i in range(W)]
        t0 = time.monotonic()
        deadline = t0 + cfg.seconds if cfg.seconds else float("inf")
        procs = [ctx.Process(target=worker_process,
                             args=(cfg, p, sync, shared, quotas, deadline))
                 for p in range(cfg.procs)]
        for p in procs:
            p.start()
        self.results, self.aborted = {}, {}
        next_kill = t0 + self.kill_delay()
        last_report = t0
        last_ops, last_change = -1, t0
        failed_at = None
        try:
            while len(self.results) + len(self.aborted) < W:
                self.receive(sync, 0.2)
                now = time.monotonic()
                if sync.failed.is_set() or sync.stop.is_set() and not cfg.crash:
                    failed_at = failed_at or now
                    if not any(p.is_alive() for p in procs):
                        break
                    if now - failed_at > 30 and self.mount and self.mount.proc:
                        self.out("torture: workers still busy 30s after the failure: "
                                 "killing the daemon")
                        self.mount.kill(signal.SIGKILL)
                    continue
                if cfg.crash and not sync.stop.is_set():
                    if sync.finished.value >= W:
                        sync.stop.set()       # all idle: final checks, reports
                    elif now >= next_kill and now < deadline:
                        # no kills past the run's time: a slow daemon (a
                        # sanitizer build) must not keep the workers in
                        # their after-crash checks for ever
                        self.crash(sync)
                        next_kill = time.monotonic() + self.kill_delay()
                        continue
                # progress: operations done or bytes moved (final checks read)
                ops = sum(sync.stats[i] for i in range(4 * W))
                if ops != last_ops:
                    last_ops, last_change = ops, now
                elif now - last_change > cfg.hang_timeout:
                    self.fail(self.hang_text() + self.daemon_stacks())
                    sync.failed.set()
                    sync.stop.set()
                    if sync.barrier is not None:
                        sync.barrier.abort()
                    if self.mount and self.mount.proc:
                        self.mount.kill(signal.SIGKILL)
                if now - last_report >= cfg.report_every:
                    last_report = now
                    self.progress(sync, now - t0)
        except KeyboardInterrupt:
            self.fail("interrupted")
            sync.failed.set()
            sync.stop.set()
            if sync.barrier is not None:
                sync.barrier.abort()
        # drain the queue while the workers end (a full pipe blocks their exit)
        end_by = time.monotonic() + 60
        while any(p.is_alive() for p in procs) and time.monotonic() < end_by:
            self.receive(sync, 0.2)
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        self.receive(sync, 0)
        elapsed = time.monotonic() - t0
        self.progress(sync, elapsed)
        if not self.failures and len(self.results) < W:
            self.fail(f"only {len(self.results)} of {W} workers finished: {self.aborted}")
        self.end(self.results)
        return self.verdict(sync, elapsed)

    def receive(self, sync, timeout):
        while True:
            try:
                msg = sync.results.get(timeout=timeout) if timeout else \
                    sync.results.get_nowait()
            except queue.Empty:
                return
            kind, widx, a, b = msg
            if kind == "done":
                self.results[widx] = b
            elif kind == "aborted":
                self.aborted[widx] = a
            else:
                self.fail(self.failure_text(widx, a, b))
                self.aborted[widx] = "failed"
                sync.failed.set()
                sync.stop.set()
            timeout = 0

    def kill_delay(self):
        return self.rng.uniform(0.3, 2 * self.cfg.crash_interval)

    def crash(self, sync):
        """SIGKILL the daemon with nobody inside an mmap, remount."""
        W = self.cfg.nworkers
        deadline = time.monotonic() + self.cfg.hang_timeout
        for got in range(W):
            if not sync.mmap_sem.acquire(timeout=max(0.1, deadline - time.monotonic())):
                # a worker is stuck inside an mmap: the daemon hangs
                for _ in range(got):
                    sync.mmap_sem.release()
                self.fail(f"crash {self.crashes + 1}: a worker stayed inside an mmap "
                          f"operation for {self.cfg.hang_timeout}s\n" + self.hang_text()
                          + self.daemon_stacks())
                sync.failed.set()
                sync.stop.set()
                sync.barrier.abort()
                if self.mount and self.mount.proc:
                    self.mount.kill(signal.SIGKILL)
                return
        self.crashes += 1
        self.say_dedup()            # this daemon life's, before it ends
        sync.crash.set()
        try:
            if self.mount:
                self.mount.kill(signal.SIGKILL)
        finally:
            for _ in range(W):
                sync.mmap_sem.release()
        try:
            sync.barrier.wait(timeout=self.cfg.hang_timeout)    # all workers stopped
            if self.mount:
                self.keep_journal()
                self.mount.start()
            sync.crash.clear()
            sync.barrier.wait(timeout=self.cfg.hang_timeout)    # go on
        except threading.BrokenBarrierError:
            sync.crash.clear()
            if not sync.failed.is_set():
                self.fail(f"crash {self.crashes}: workers did not all stop within "
                          f"{self.cfg.hang_timeout}s\n" + self.hang_text())
            sync.failed.set()
            sync.stop.set()
        except util.DaemonError as e:
            self.fail(f"remount after crash {self.crashes} failed: {e}")
            sync.failed.set()
            sync.stop.set()
            sync.barrier.abort()

    def keep_journal(self):
        """The journal that the killed daemon left (with -o persist, its
        queue too), as WORKDIR/journal.<crash> (and its second file,
        journal.<crash>.1): what the next daemon will replay and resume."""
        for suffix in ("", ".1"):
            src = os.path.join(self.mount.backing, ".tierfs.journal" + suffix)
            try:
                shutil.copyfile(src, os.path.join(self.cfg.workdir,
                                                  f"journal.{self.crashes}{suffix}"))
            except OSError:
                pass

    def progress(self, sync, t):
        W = self.cfg.nworkers
        ops = sum(sync.stats[i * 4] for i in range(W))
        wr = sum(sync.stats[i * 4 + 1] for i in range(W))
        rd = sum(sync.stats[i * 4 + 2] for i in range(W))
        self.out(f"torture: {t:6.1f}s {ops} ops, {wr / MiB:.0f} MiB written, "
                 f"{rd / MiB:.0f} MiB read" + (f", {self.crashes} crashes" if self.cfg.crash else ""))

    @staticmethod
    def failure_head(text, most=8):
        """A failure's first lines, before its worker's operations."""
        head = []
        for line in text.splitlines()[:most]:
            if line.startswith("last ") and head:
                break
            head.append(line)
        return head

    def failure_text(self, widx, text, hist):
        lines = [f"worker {widx} ({self.cfg.root}/w{widx}): {text}",
                 f"last {len(hist)} operations of worker {widx}:"]
        lines += [f"    {h}" for h in hist]
        return "\n".join(lines)

    def hang_text(self):
        lines = [f"no operation finished for {self.cfg.hang_timeout}s (hung?); "
                 f"last operations:"]
        for w in range(self.cfg.nworkers):
            path = os.path.join(self.cfg.workdir, f"ops.w{w}.log")
            try:
                with open(path) as f:
                    tail = f.readlines()[-3:]
            except OSError:
                tail = []
            lines += [f"  w{w}: {t.rstrip()}" for t in tail]
        return "\n".join(lines)

    def daemon_stacks(self):
        """The hung daemon's threads: gdb backtraces where gdb is installed,
        else each thread's kernel wait channel and stack."""
        if not self.mount or not self.mount.proc:
            return ""
        pid = self.mount.proc.pid
        out = [f"\ndaemon threads (pid {pid}):"]
        if shutil.which("gdb"):
            import subprocess
            try:
                r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex",
                                    "thread apply all bt"], capture_output=True,
                                   text=True, timeout=120)
                out += [line for line in r.stdout.splitlines()
                        if line.startswith(("Thread ", "#"))]
                return "\n".join(out)
            except (OSError, subprocess.SubprocessError) as e:
                out.append(f"(gdb failed: {e})")
        try:
            for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                base = f"/proc/{pid}/task/{tid}"
                with open(f"{base}/comm") as f:
                    comm = f.read().strip()
                with open(f"{base}/wchan") as f:
                    wchan = f.read().strip()
                try:
                    with open(f"{base}/stack") as f:
                        kstack = " <- ".join(l.split()[-1] for l in f.read().splitlines()[:6])
                except OSError:
                    kstack = ""
                out.append(f"  {tid} {comm}: {wchan} {kstack}")
        except OSError as e:
            out.append(f"({e})")
        return "\n".join(out)

    def say_dedup(self):
        """What -o dedup did in this daemon's life (a line each life)."""
        if not self.mount or self.mount.proc is None:
            return
        try:
            d = json.loads(os.getxattr(self.mount.mnt, "user.tierfs.stats"))
            if d.get("dedup", {}).get("on"):
                self.out(f"torture: dedup: {json.dumps(d['dedup'])}")
        except (OSError, ValueError):
            pass

    def end(self, results):
        """Unmount cleanly; the backing directory must hold the models' files."""
        if self.mount is None:
            if not self.failures:
                self.check_tree(self.cfg.root, results, "plain directory")
                if not self.failures and not self.cfg.keep:
                    shutil.rmtree(self.cfg.root, ignore_errors=True)
            return
        try:
            if self.mount.proc is not None:
                self.say_dedup()
                self.mount.umount()
            else:
                problems = self.mount.finish()
                if problems:
                    raise util.DaemonError("\n".join(problems))
        except util.DaemonError as e:
            self.fail(f"tierfs unmount: {e}")
            return
        if not self.failures:
            self.check_tree(self.mount.backing, results, "backing directory after unmount")
        if not self.failures:
            # tierfs's own names (new versions, the journal, the lock) are
            # gone after a clean unmount, kills before it or not
            left = [os.path.join(d, n) for d, _, names in os.walk(self.mount.backing)
                    for n in names if n.startswith(".tierfs")]
            if left:
                self.fail(f"backing directory after unmount: tierfs left {sorted(left)[:10]}"
                          f" ({len(left)} names)")

    def check_tree(self, root, results, what):
        names = Names(self.cfg.nworkers, self.cfg.shared)
        shared_ext = {}
        for widx, model in sorted(results.items()):
            d = os.path.join(root, model["dir"])
            listing = {n for n in os.listdir(d) if not n.startswith(".tierfs")}
            if listing != set(model["files"]):
                self.fail(f"{what}: {model['dir']}/ holds {sorted(listing)}, expected "
                          f"{sorted(model['files'])}")
                return
            for name, (fid, ext, size) in sorted(model["files"].items()):
                with open(os.path.join(d, name), "rb") as f:
                    got = f.read()
                if len(got) != size or not ext_equal(ext, got):
                    want = ext_content(ext, 0, size)
                    self.fail(f"{what}: {model['dir']}/{name} [{names.fid(fid)}], model "
                              f"{ext_summary(ext, size)}\n"
                              + "\n".join(diff_report(got, want, names)))
                    return
            for fid, (lo, region, ext) in model["shared"].items():
                shared_ext.setdefault(fid, []).append((lo, region, ext))
        for fid, regions in sorted(shared_ext.items()):
            path = os.path.join(root, "shared", f"s{fid - 1}")
            with open(path, "rb") as f:
                got = f.read()
            size = sum(r for _, r, _ in regions)
            if len(regions) != self.cfg.nworkers:
                continue
            if len(got) == size and all(ext_equal(ext, memoryview(got)[lo:lo + region], lo)
                                        for lo, region, ext in regions):
                continue
            want = bytearray(size)
            for lo, region, ext in regions:
                want[lo:lo + region] = ext_content(ext, lo, lo + region)
            if got != want:
                self.fail(f"{what}: shared/s{fid - 1}\n" + "\n".join(diff_report(got, want, names)))
                return

    def verdict(self, sync, elapsed):
        cfg = self.cfg
        W = cfg.nworkers
        ops = sum(sync.stats[i * 4] for i in range(W))
        if not self.failures:
            if self.mount is not None and self.mount.runs:
                with open(self.mount.runs[0][1], errors="replace") as f:
                    for line in f:
                        if "GPU tier" in line or "host cache:" in line:
                            self.out("torture: daemon: " + line.strip())
            self.out(f"torture: PASS seed {cfg.seed}: {ops} operations in {elapsed:.0f}s"
                     + (f", {self.crashes} crashes" if cfg.crash else ""))
            if not cfg.keep:
                shutil.rmtree(cfg.workdir, ignore_errors=True)
                if cfg.backing and self.mount is not None:
                    shutil.rmtree(self.mount.backing, ignore_errors=True)
            return 0
        head = (f"torture: FAIL seed {cfg.seed} after {ops} operations, {elapsed:.0f}s"
                + (f", {self.crashes} crashes" if cfg.crash else ""))
        replay = "replay: " + " ".join(shlex.quote(a) for a in cfg.replay)
        text = "\n\n".join([head] + self.failures + [replay, f"operation logs: {cfg.workdir}"])
        if self.mount is not None:
            text += "\n\ndaemon log (tail):\n" + self.mount.log(tail=40)
        # what failed, again at the end: a report cut to its tail keeps it
        text += "\n\n" + head + ":\n" + "\n".join(
            "  " + "\n  ".join(self.failure_head(f)) for f in self.failures)
        print(text, file=sys.stderr, flush=True)
        if cfg.findings:
            with open(cfg.findings, "a") as f:
                f.write(f"\n## torture failure, seed {cfg.seed} "
                        f"({time.strftime('%Y-%m-%d %H:%M:%S')})\n\n```\n{text}\n```\n")
        return 1


def parse_size(text):
    text = text.strip().upper()
    mult = {"K": KiB, "M": MiB, "G": 1 << 30}
    if text and text[-1] in mult:
        return int(float(text[:-1]) * mult[text[-1]])
    return int(text)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="see the module docstring for the semantics checked")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    ap.add_argument("--ops", type=int, default=0, help="operations in all (0: no limit)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="run time (default 60 when --ops is not given)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="worker threads per process")
    ap.add_argument("--files", type=int, default=4, help="files per worker")
    ap.add_argument("--shared", type=int, default=2, help="shared files (0: none)")
    ap.add_argument("--max-size", default="64M", help="largest file (default 64M)")
    ap.add_argument("--workload", choices=["mixed", "overwrite"], default="mixed",
                    help="overwrite: only O_TRUNC rewrites (half fsynced) and verifies")
    ap.add_argument("--rate", type=float, default=0, metavar="MIB_S",
                    help="at most this many MiB/s written + read, all workers together "
                    "(0: as fast as it goes)")
    ap.add_argument("--host-cache", default="16M")
    ap.add_argument("--policy", choices=["score", "fifo", "lru"], default="score")
    ap.add_argument("--mount-opts", default="", help="more -o options, e.g. gpu=0,gpu_cache=64M")
    ap.add_argument("--skip-ops", default="", metavar="OP,OP",
                    help="leave these operations out (names as in the op logs: "
                    + ",".join(n for n, _ in OPS_MIXED) + ")")
    ap.add_argument("--crash", action="store_true", help="SIGKILL the daemon at random moments")
    ap.add_argument("--crash-interval", type=float, default=3.0,
                    help="mean seconds between kills (default 3)")
    ap.add_argument("--plain", metavar="DIR", help="no daemon: run on an ordinary directory")
    ap.add_argument("--backing", metavar="DIR",
                    help="make the backing directory inside DIR (default: in the work dir), "
                    "e.g. on an XFS reflink file system with --mount-opts dedup=on")
    ap.add_argument("--workdir", help="operation logs and the mount (default: a new dir in /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir after a pass")
    ap.add_argument("--findings", metavar="FILE", help="append a failure report to FILE")
    ap.add_argument("--inject-corruption", type=int, default=0, metavar="N",
                    help=argparse.SUPPRESS)     # self-test: worker 0 corrupts at op N
    ap.add_argument("--hang-timeout", type=float, default=180.0)
    ap.add_argument("--report-every", type=float, default=10.0)
    cfg = ap.parse_args(argv)
    if cfg.seed is None:
        cfg.seed = int.from_bytes(os.urandom(4), "little")
    if cfg.seconds is None and not cfg.ops:
        cfg.seconds = 60.0
    cfg.max_size = min(parse_size(cfg.max_size), 64 * MiB)
    cfg.nworkers = cfg.procs * cfg.threads
    cfg.skip_ops = set(filter(None, cfg.skip_ops.split(",")))
    unknown = cfg.skip_ops - {n for n, _ in OPS_MIXED}
    if unknown:
        ap.error(f"unknown operations in --skip-ops: {sorted(unknown)}")
    if cfg.nworkers > 63:
        ap.error("at most 63 workers")
    # the replay command: the same arguments, the seed last
    rp, skip = [], False
    for a in [sys.argv[0]] + list(argv):
        if skip:
            skip = False
            continue
        if a == "--seed":
            skip = True
            continue
        if a.startswith("--seed="):
            continue
        rp.append(a)
    cfg.replay = ["python3"] + rp + ["--seed", str(cfg.seed)]
    if cfg.workdir:
        os.makedirs(cfg.workdir, exist_ok=True)
    else:
        cfg.workdir = tempfile.mkdtemp(prefix=f"torture-{cfg.seed}-")
    if cfg.plain:
        cfg.plain = os.path.abspath(cfg.plain)
        os.makedirs(cfg.plain, exist_ok=True)
    print(f"torture: seed {cfg.seed}, {cfg.procs} procs x {cfg.threads} threads, "
          f"{'plain ' + cfg.plain if cfg.plain else 'host_cache=' + cfg.host_cache}, "
          f"policy {cfg.policy}{', crash mode' if cfg.crash else ''}, "
          f"{cfg.workload}, work dir {cfg.workdir}", flush=True)
    return Run(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
