"""Seeded random-operation exerciser.

Applies the same random sequence of file operations to files in a tierfs mount
and to reference files on an ordinary file system, and compares every result
(bytes read, sizes, return values).  Everything random comes from one
random.Random(seed), so a failure replays with the same seed and op count:
the seed is in the failure message (TIERFS_SEED=...), and the sequence of a
seed is the same whatever the op count, so any longer run replays a failure.

    python3 tests/exerciser.py MNT_DIR REF_DIR [--seed S] [--ops N]
"""

import collections
import mmap
import os
import random
import stat
import sys

try:
    from util import fallocate
except ImportError:                                   # run as a script elsewhere
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from util import fallocate

KiB = 1 << 10
MiB = 1 << 20


class Mismatch(AssertionError):
    pass


class Handle:
    """One open file description on each side."""
    __slots__ = ("m", "r", "flags")

    def __init__(self, m, r, flags):
        self.m, self.r, self.flags = m, r, flags

    @property
    def writable(self):
        return (self.flags & os.O_ACCMODE) != os.O_RDONLY

    @property
    def append(self):
        return bool(self.flags & os.O_APPEND)


class File:
    def __init__(self, name, mdir, rdir):
        self.name = name
        self.mpath = os.path.join(mdir, name)
        self.rpath = os.path.join(rdir, name)
        self.handles = []


# (name, weight)
OPS = [
    ("write", 30), ("read", 22), ("truncate", 5), ("reopen", 6), ("fsync", 0.15),
    ("mmap", 6), ("fallocate", 3), ("stat", 6), ("compare", 1), ("recreate", 0.3),
]


class Exerciser:
    def __init__(self, mnt_dir, ref_dir, seed, ops, nfiles=4, max_size=MiB,
                 max_handles=2, history=40, label=""):
        self.mdir, self.rdir = mnt_dir, ref_dir
        self.seed, self.nops = seed, ops
        self.rng = random.Random(seed)
        self.max_size = max_size
        self.max_handles = max_handles
        self.label = label
        self.files = [File(f"x{i}", mnt_dir, ref_dir) for i in range(nfiles)]
        self.history = collections.deque(maxlen=history)
        self.counts = collections.Counter()
        self.opno = 0
        names, weights = zip(*OPS)
        self.op_names, self.op_weights = names, weights

    # --------------------------------------------------- mount side (overridable)
    def m_pwrite(self, fd, data, off):
        return os.pwrite(fd, data, off)

    def m_write(self, fd, data):
        return os.write(fd, data)

    # --------------------------------------------------- helpers
    def note(self, text):
        self.history.append(f"#{self.opno} {text}")

    def fail(self, what):
        raise Mismatch(
            f"exerciser{(' ' + self.label) if self.label else ''}: {what}\n"
            f"  at op #{self.opno} of {self.nops}; replay with TIERFS_SEED={self.seed} "
            f"(the op sequence of a seed does not depend on the op count: any "
            f"run of >= {self.opno} ops replays it)\n"
            f"  mount {self.mdir}, reference {self.rdir}\n"
            f"  last operations:\n    " + "\n    ".join(self.history))

    def same(self, got, want, what):
        if got != want:
            if isinstance(got, (bytes, bytearray)) and isinstance(want, (bytes, bytearray)):
                n = min(len(got), len(want))
                first = next((i for i in range(n) if got[i] != want[i]), n)
                self.fail(f"{what}: mount gave {len(got)} bytes, reference {len(want)}; "
                          f"first difference at +{first}")
            self.fail(f"{what}: mount {got!r} != reference {want!r}")

    def both(self, what, fn_m, fn_r):
        """Run an operation on both sides; errors must match too."""
        em = er = None
        rm = rr = None
        try:
            rm = fn_m()
        except OSError as e:
            em = e
        try:
            rr = fn_r()
        except OSError as e:
            er = e
        if (em is None) != (er is None) or (em and em.errno != er.errno):
            self.fail(f"{what}: mount -> {em or rm!r}, reference -> {er or rr!r}")
        return rm, rr

    def size(self, f):
        return os.stat(f.rpath).st_size

    def open_handle(self, f, flags, create=False):
        if create:
            flags |= os.O_CREAT
        m = os.open(f.mpath, flags, 0o644)
        try:
            r = os.open(f.rpath, flags, 0o644)
        except BaseException:
            os.close(m)
            raise
        h = Handle(m, r, flags)
        f.handles.append(h)
        return h

    def close_handle(self, f, h):
        f.handles.remove(h)
        os.close(h.m)
        os.close(h.r)

    def writable_handle(self, f):
        hs = [h for h in f.handles if h.writable]
        if hs:
            return self.rng.choice(hs)
        if len(f.handles) >= self.max_handles:
            self.close_handle(f, f.handles[0])
        return self.open_handle(f, os.O_RDWR)

    def readable_handle(self, f):
        hs = [h for h in f.handles if (h.flags & os.O_ACCMODE) != os.O_WRONLY]
        if hs:
            return self.rng.choice(hs)
        if len(f.handles) >= self.max_handles:
            self.close_handle(f, f.handles[0])
        return self.open_handle(f, os.O_RDONLY)

    def rand_len(self, limit):
        rng = self.rng
        k = rng.random()
        if k < 0.25:
            n = rng.randint(1, 16)
        elif k < 0.55:
            n = rng.randint(1, 4096)
        elif k < 0.70:
            n = 4096 * rng.randint(1, 16)
        elif k < 0.92:
            n = rng.randint(1, 64 * KiB)
        else:
            n = rng.randint(1, 256 * KiB)
        return max(0, min(n, limit))

    def rand_off(self, size, past=64 * KiB):
        rng = self.rng
        k = rng.random()
        if k < 0.15:
            off = size                                    # at EOF
        elif k < 0.25:
            off = 0
        elif k < 0.40:
            off = 4096 * rng.randint(0, (size + past) // 4096)
        elif k < 0.55:
            off = size + rng.randint(1, past)             # past EOF: a hole
        else:
            off = rng.randint(0, size + 16)
        return min(off, self.max_size)

    # --------------------------------------------------- operations
    def op_write(self, f):
        h = self.writable_handle(f)
        size = self.size(f)
        if h.append:
            n = self.rand_len(self.max_size - size)
            if n == 0:
                return self.op_truncate(f)
            data = self.rng.randbytes(n)
            self.note(f"{f.name} append {n} (size {size})")
            wm, wr = self.both("append", lambda: self.m_write(h.m, data),
                               lambda: os.write(h.r, data))
            self.same(wm, wr, "append return")
            return
        off = self.rand_off(size)
        n = self.rand_len(self.max_size - off)
        if n == 0:
            off, n = 0, self.rand_len(self.max_size)
        data = self.rng.randbytes(n)
        if self.rng.random() < 0.7:
            self.note(f"{f.name} pwrite {n}@{off} (size {size})")
            wm, wr = self.both("pwrite", lambda: self.m_pwrite(h.m, data, off),
                               lambda: os.pwrite(h.r, data, off))
        else:
            self.note(f"{f.name} lseek+write {n}@{off} (size {size})")
            os.lseek(h.m, off, os.SEEK_SET)
            os.lseek(h.r, off, os.SEEK_SET)
            wm, wr = self.both("write", lambda: self.m_write(h.m, data),
                               lambda: os.write(h.r, data))
            self.same(os.lseek(h.m, 0, os.SEEK_CUR), os.lseek(h.r, 0, os.SEEK_CUR),
                      "position after write")
        self.same(wm, wr, "write return")

    def op_read(self, f):
        h = self.readable_handle(f)
        size = self.size(f)
        off = self.rand_off(size, past=4096)
        n = self.rand_len(self.max_size + 4096)
        if n == 0:
            n = 1
        if self.rng.random() < 0.7:
            self.note(f"{f.name} pread {n}@{off} (size {size})")
            bm, br = os.pread(h.m, n, off), os.pread(h.r, n, off)
        else:
            self.note(f"{f.name} lseek+read {n}@{off} (size {size})")
            os.lseek(h.m, off, os.SEEK_SET)
            os.lseek(h.r, off, os.SEEK_SET)
            bm, br = os.read(h.m, n), os.read(h.r, n)
        self.same(bm, br, f"read {n}@{off}")

    def op_truncate(self, f):
        size = self.size(f)
        rng = self.rng
        k = rng.random()
        if k < 0.1:
            new = 0
        elif k < 0.5 and size:
            new = rng.randint(0, size)
        else:
            new = rng.randint(size, min(self.max_size, size + 256 * KiB))
        if rng.random() < 0.7:
            h = self.writable_handle(f)
            self.note(f"{f.name} ftruncate {size}->{new}")
            self.both("ftruncate", lambda: os.ftruncate(h.m, new),
                      lambda: os.ftruncate(h.r, new))
        else:
            self.note(f"{f.name} truncate(path) {size}->{new}")
            self.both("truncate", lambda: os.truncate(f.mpath, new),
                      lambda: os.truncate(f.rpath, new))

    def op_reopen(self, f):
        rng = self.rng
        if f.handles and (len(f.handles) >= self.max_handles or rng.random() < 0.6):
            h = rng.choice(f.handles)
            self.note(f"{f.name} close (flags {h.flags:#o})")
            self.close_handle(f, h)
        if rng.random() < 0.8 or not f.handles:
            k = rng.random()
            if k < 0.45:
                flags = os.O_RDWR
            elif k < 0.70:
                flags = os.O_RDWR | os.O_APPEND
            elif k < 0.80:
                flags = os.O_WRONLY | os.O_APPEND
            elif k < 0.95:
                flags = os.O_RDONLY
            else:
                flags = os.O_RDWR | os.O_TRUNC
            self.note(f"{f.name} open flags {flags:#o}")
            self.open_handle(f, flags)

    def op_fsync(self, f):
        h = self.rng.choice(f.handles) if f.handles else self.writable_handle(f)
        if self.rng.random() < 0.5:
            self.note(f"{f.name} fsync")
            os.fsync(h.m)
        else:
            self.note(f"{f.name} fdatasync")
            os.fdatasync(h.m)

    def op_mmap(self, f):
        size = self.size(f)
        if size == 0:
            return self.op_write(f)
        rng = self.rng
        writable = rng.random() < 0.7
        flags = os.O_RDWR if writable else os.O_RDONLY
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self.note(f"{f.name} mmap {'rw' if writable else 'ro'} len {size}")
        fm = os.open(f.mpath, flags)
        fr = os.open(f.rpath, flags)
        try:
            mm = mmap.mmap(fm, size, flags=mmap.MAP_SHARED, prot=prot)
            mr = mmap.mmap(fr, size, flags=mmap.MAP_SHARED, prot=prot)
            try:
                for _ in range(rng.randint(1, 4)):
                    off = rng.randrange(0, size)
                    n = max(1, self.rand_len(size - off))
                    if writable and rng.random() < 0.6:
                        data = rng.randbytes(n)
                        self.note(f"{f.name}   mmap write {n}@{off}")
                        mm[off:off + n] = data
                        mr[off:off + n] = data
                    else:
                        self.note(f"{f.name}   mmap read {n}@{off}")
                        self.same(mm[off:off + n], mr[off:off + n], f"mmap read {n}@{off}")
                if writable and rng.random() < 0.5:
                    self.note(f"{f.name}   msync")
                    mm.flush()
                    mr.flush()
            finally:
                mm.close()
                mr.close()
        finally:
            os.close(fm)
            os.close(fr)

    def op_fallocate(self, f):
        h = self.writable_handle(f)
        size = self.size(f)
        off = self.rng.randint(0, min(self.max_size - 1, size + 128 * KiB))
        n = max(1, min(self.rng.randint(1, 256 * KiB), self.max_size - off))
        self.note(f"{f.name} fallocate {n}@{off} (size {size})")
        self.both("fallocate", lambda: fallocate(h.m, off, n), lambda: fallocate(h.r, off, n))

    def op_stat(self, f):
        self.note(f"{f.name} stat")
        sm, sr = os.stat(f.mpath), os.stat(f.rpath)
        self.same(sm.st_size, sr.st_size, "stat size")
        self.same(stat.S_IFMT(sm.st_mode), stat.S_IFMT(sr.st_mode), "file type")
        for h in f.handles:
            self.same(os.fstat(h.m).st_size, os.fstat(h.r).st_size, "fstat size")

    def op_compare(self, f):
        self.note(f"{f.name} compare whole file")
        self.compare_file(f)

    def op_recreate(self, f):
        self.note(f"{f.name} close all, unlink, create")
        for h in list(f.handles):
            self.close_handle(f, h)
        os.unlink(f.mpath)
        os.unlink(f.rpath)
        self.open_handle(f, os.O_RDWR | os.O_EXCL, create=True)

    # --------------------------------------------------- driver
    def compare_file(self, f):
        with open(f.mpath, "rb") as a, open(f.rpath, "rb") as b:
            self.same(a.read(), b.read(), f"{f.name} whole content")

    def setup(self):
        for f in self.files:
            self.open_handle(f, os.O_RDWR | os.O_TRUNC, create=True)

    def run(self):
        self.setup()
        try:
            for self.opno in range(1, self.nops + 1):
                f = self.rng.choice(self.files)
                name = self.rng.choices(self.op_names, self.op_weights)[0]
                self.counts[name] += 1
                try:
                    getattr(self, "op_" + name)(f)
                except Mismatch:
                    raise
                except Exception as e:           # noqa: BLE001
                    self.fail(f"unexpected error in {name}: {e!r}")
            self.note("final compare")
            for f in self.files:
                self.op_stat(f)
                self.compare_file(f)
        finally:
            self.close_all()
        return self.counts

    def close_all(self):
        for f in self.files:
            for h in list(f.handles):
                try:
                    self.close_handle(f, h)
                except OSError:
                    pass


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mnt_dir")
    ap.add_argument("ref_dir")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    ap.add_argument("--ops", type=int, default=50000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--max-size", type=int, default=MiB)
    a = ap.parse_args(argv)
    ex = Exerciser(a.mnt_dir, a.ref_dir, a.seed, a.ops, nfiles=a.files, max_size=a.max_size)
    counts = ex.run()
    print(f"seed {a.seed}: {a.ops} ops ok: {dict(counts)}")


if __name__ == "__main__":
    main()
