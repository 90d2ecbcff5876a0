"""tierfs.torch - PyTorch checkpoints on tierfs, in the safetensors layout.

Importable only where PyTorch is; ``import tierfs`` never imports torch.

    import tierfs.torch as tt

    tt.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 7},
            "/mnt/ckpt/ckpt-0007.st")
    ck = tt.load("/mnt/ckpt/ckpt-0007.st", map_location="cuda")
    # or in place, into tensors that exist already:
    tt.load(path, into={"model": model.state_dict(), "optim": opt.state_dict()})

The file
    One file per state dict, in the safetensors layout: 8 bytes (little-endian
    length N of the header), N bytes of JSON header (padded with spaces so that
    the data starts at a multiple of 8), then the tensors' raw bytes, packed
    back to back from the first byte after the header (the strict reference
    reader wants the tensors to tile the data exactly: no gaps, no overlaps,
    nothing after the last one).  Entries are ordered by decreasing element
    size, so every tensor is aligned to its own element size.  Any safetensors
    reader reads the file, from the mount or from the backing directory.

    The header's "__metadata__" holds {"format": "pt", "tierfs.structure":
    JSON text}: the structure of the saved object (nested dicts with their key
    types, lists, tuples, torch.Size, None, bools, ints, floats, strings,
    bytes) with each tensor as a reference to its entry.  Tensors are named by
    their dotted path ("model.0.weight", "optim.state.0.exp_avg"), made unique
    with a "#N" suffix where two paths give one name.  A file written by
    another safetensors writer loads as a flat dict {name: tensor}.

Shared storage
    Tensors of the object that are the same view of one storage (tied weights:
    same storage, offset, shape, strides and dtype) are written once and come
    back as one tensor object, as torch.load gives them.  Different views of
    one storage (of one dtype) are written once, as the span of the storage
    they cover (an entry named "__shared__.K"), and come back as views of one
    new storage with their offsets, shapes and strides.  Views of one storage
    with different dtypes are written as separate copies.  A lone tensor that
    is not contiguous (a transposed weight) is written contiguous and comes
    back contiguous, equal in value; its strides are not kept.

Devices
    Each tensor's device is recorded; load(map_location=None) puts it back
    there (like torch.load), map_location="cpu" / "cuda:1" / a torch.device /
    a dict {"cuda:1": "cuda:0"} moves it.  CUDA tensors move device to device
    through libtierfs's vectored GPU call (tierfs.pwritev_gpu / preadv_gpu)
    when the file is on a tierfs mount with a GPU tier; without a mount,
    without a GPU tier or without libtierfs the same calls copy them through
    host memory and plain POSIX I/O, writing the same file: user code needs no
    branch.  CPU tensors always go through os.pwritev / os.preadv, straight
    from and into their memory.

Safety
    save() writes a temporary file in the same directory and renames it over
    `path` (os.replace) once complete: a save that fails (an unsupported
    dtype, a full disk) leaves the previous file as it was.  Everything is
    checked before the temporary file is created.  On tierfs the close
    already puts the file in the cache; its SSD copy follows in the background
    (tierfs.wait_flushed waits for it), so save() does not fsync there; on
    other file systems it fsyncs the file before the rename (fsync=True/False
    overrides).

    load() checks the header strictly (FormatError, a ValueError): the length,
    the JSON, each entry's dtype, shape and offsets (inside the data, not
    overlapping, size matching dtype x shape), the file's size, and the
    structure's references.

Repeated saves
    A training loop saves the same object again and again, its tensors
    changed in place.  On tierfs, save() keeps the plan of its last few saves
    (the header, each GPU's packed segment list, the host writes) under a
    fingerprint of the object: each container's type, length and keys, each
    other value's type and value, each tensor's device, dtype, shape,
    strides, storage offset and address.  A save with the same fingerprint
    writes from the plan, without walking the object's tensors again; any
    difference (a step count, a tensor replaced or reshaped) makes a new
    plan.  Tensors written from copies (non-contiguous, or staged through
    host memory) are never planned.  io_stats counts the saves from plans.
    The save of an object saved before starts from that object's last plan
    at once and takes the fingerprint in a thread of the module's while the
    GPU copies (the vectored call releases the GIL); when it differs, the
    temporary file is started again (io_stats plans_missed).
    load() keeps the checked form of its last few headers: checkpoints of
    one run share theirs while their other values are equal.

Tracing
    TIERFS_TRACE=1 in the environment prints each save's and load's phases
    on stderr (and libtierfs prints its vectored calls').

torch.distributed.checkpoint (torch >= 2.0)
    FileSystemWriter and FileSystemReader here are drop-in replacements of
    torch's, for dcp.save, dcp.async_save and dcp.load: each rank's data file
    is in the same safetensors layout (byte items as U8 entries), its tensor
    bytes go device to device where the mount has a GPU tier, and the reader
    sets the mount's restore order (tierfs.restore_order) to the files in the
    order it reads them.  On torch 1.x the classes exist but raise
    RuntimeError when made.
"""

import base64
import collections
import ctypes
import errno
import json
import math
import os
import struct
import sys
import threading
import time

import torch

import tierfs as _tierfs

__all__ = ["save", "load", "FormatError", "MismatchError", "io_stats",
           "FileSystemWriter", "FileSystemReader", "DTYPES"]

if sys.byteorder != "little":           # the layout is little-endian
    raise ImportError("tierfs.torch needs a little-endian machine")

STRUCTURE_KEY = "tierfs.structure"
STRUCTURE_VERSION = 1
MAX_HEADER = 100 * 1000 * 1000          # the reference reader's limit
_IOV_MAX = 1024
_CHUNK = 64 << 20                       # bytes a fallback CUDA copy stages at once


class FormatError(ValueError):
    """A file that is not in this layout, truncated, or whose header lies."""


class MismatchError(ValueError):
    """load(into=...): a tensor of the file does not fit the tensor (or the
    container) at its place in `into` (shape, dtype, kind), or with
    strict=True a tensor of `into` that the file does not have."""


# safetensors names and element sizes; the torch dtype where this torch has it
_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
          "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
          "U16": 2, "U32": 4, "U64": 8}
_TORCH_NAMES = [("float64", "F64"), ("float32", "F32"), ("float16", "F16"),
                ("bfloat16", "BF16"), ("int64", "I64"), ("int32", "I32"),
                ("int16", "I16"), ("int8", "I8"), ("uint8", "U8"), ("bool", "BOOL"),
                ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
                ("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")]
DTYPES = {getattr(torch, a): s for a, s in _TORCH_NAMES if hasattr(torch, a)}
"""torch dtype -> safetensors dtype name, for the dtypes this torch has."""
_FROM_NAME = {s: d for d, s in DTYPES.items()}

io_stats = collections.Counter()
"""Bytes moved by each path since import: gpu_write, gpu_read (the vectored
GPU calls), posix_write, posix_read; gpu_fallbacks counts the GPU calls that
fell back to host memory (no GPU tier, not tierfs, no libtierfs);
saves_from_plan the saves that reused the plan of an earlier one,
plans_missed the saves that guessed a plan their fingerprint then refused,
headers_reused the loads that reused the checked header of an earlier one
(see "Repeated saves" in the module's documentation)."""
_stats_lock = threading.Lock()

_TRACE = os.environ.get("TIERFS_TRACE", "").strip() not in ("", "0")


class _Marks:
    """TIERFS_TRACE=1: the phases of one save or load, printed on stderr
    when it ends (as libtierfs prints its vectored calls')."""

    def __init__(self, what):
        self.what, self.t = what, [time.perf_counter()]
        self.names = []

    def __call__(self, name):
        self.t.append(time.perf_counter())
        self.names.append(name)

    def done(self):
        parts = ", ".join(f"{n} {(b - a) * 1e6:.0f} us" for n, a, b in
                          zip(self.names, self.t, self.t[1:]))
        print(f"tierfs.torch: {self.what}: {parts}, in all "
              f"{(self.t[-1] - self.t[0]) * 1e6:.0f} us", file=sys.stderr)


def _no_mark(name):
    pass


def _marks(what):
    return _Marks(what) if _TRACE else _no_mark


def _count(key, n):
    with _stats_lock:
        io_stats[key] += n


# ---------------------------------------------------------------- raw I/O

def _cpu_buffer(t, n=None):
    """A writable byte view of the n bytes of contiguous CPU tensor t (the
    tensor must outlive the view)."""
    if n is None:
        n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")


def _vec_io(fn, fd, bufs, offset, what):
    """os.pwritev / os.preadv of all of bufs at offset, in batches of at most
    IOV_MAX buffers, resumed after short transfers."""
    bufs = [b for b in bufs if len(b)]
    i, total = 0, 0
    while i < len(bufs):
        n = fn(fd, bufs[i:i + _IOV_MAX], offset)
        if n <= 0:
            if what == "read":
                raise FormatError(f"file ends early (at byte {offset}): truncated meanwhile?")
            raise OSError(errno.EIO, "write returned 0")
        offset += n
        total += n
        while n and i < len(bufs):
            if n >= len(bufs[i]):
                n -= len(bufs[i])
                i += 1
            else:
                bufs[i] = bufs[i][n:]
                n = 0
    return total


def _gpu_fallback(e):
    """True when a GPU call's failure means "use host memory instead"."""
    if isinstance(e, _tierfs.TierfsError) and e.errno is None:
        return True                     # libtierfs missing
    return e.errno in (errno.ENODEV, errno.ENOTTY, errno.EOPNOTSUPP, errno.ENOSYS)


def _split(jobs):
    """[(tensor, offset)] by device: (CPU jobs, {CUDA device: jobs}, other
    jobs) of (tensor, offset, bytes), each tensor asked once."""
    cpu, cuda, other = [], {}, []
    for t, o in jobs:
        d, j = t.device, (t, o, t.numel() * t.element_size())
        if d.type == "cpu":
            cpu.append(j)
        elif d.type == "cuda":
            cuda.setdefault(d, []).append(j)
        else:
            other.append(j)
    return cpu, cuda, other


def _gpu_io(write, fd, by_dev, use_gpu):
    """Move CUDA tensors: by_dev = {device: [(contiguous CUDA tensor on it,
    file offset, bytes)]}.  Device to device through tierfs.pwritev_gpu /
    preadv_gpu where use_gpu and they work; else through host memory.
    Returns True when the device path moved them all (or there were none)."""
    if not by_dev:
        return True
    fn = getattr(_tierfs, "pwritev_gpu" if write else "preadv_gpu", None) if use_gpu else None
    if fn is not None:
        try:
            for dev, js in by_dev.items():
                with torch.cuda.device(dev):
                    torch.cuda.synchronize(dev)
                    segs = [(t.data_ptr(), n, off) for t, off, n in js if n]
                    want = sum(s[1] for s in segs)
                    if not segs:
                        continue
                    got = fn(fd, segs)
                    if got != want:
                        if write:
                            raise OSError(errno.EIO, f"GPU write: {got} of {want} bytes")
                        raise FormatError(f"file ends early: {got} of {want} bytes read")
                    _count("gpu_write" if write else "gpu_read", want)
            return True
        except OSError as e:
            if not _gpu_fallback(e):
                raise
            _count("gpu_fallbacks", 1)
    for t, off, _ in (j for js in by_dev.values() for j in js):   # through host memory
        flat = t.view(-1)
        per = max(1, _CHUNK // max(1, t.element_size()))
        for a in range(0, flat.numel(), per):
            part = flat[a:a + per]
            o = off + a * t.element_size()
            if write:
                host = part.cpu()
                n = _vec_io(os.pwritev, fd, [_cpu_buffer(host)], o, "write")
                _count("posix_write", n)
            else:
                host = torch.empty(part.shape, dtype=t.dtype)
                n = _vec_io(os.preadv, fd, [_cpu_buffer(host)], o, "read")
                _count("posix_read", n)
                part.copy_(host)
    return False


_ON_TIERFS_MAX = 64
_on_tierfs_seen = {}                    # path -> the mount table it was found on tierfs under


def _on_tierfs(path):
    """Whether path is on a tierfs mount.  A path found there is not asked
    again (a stat and a realpath: FUSE round trips at every save) while the
    mount table stays the same; a symlink changed meanwhile is not seen,
    and a GPU call through it then fails over to host memory."""
    try:
        table = _tierfs._mount_table()
        if _on_tierfs_seen.get(path) is table:
            return True
        if not _tierfs.is_tierfs(path):
            return False
        if len(_on_tierfs_seen) >= _ON_TIERFS_MAX:
            _on_tierfs_seen.clear()
        _on_tierfs_seen[path] = table
        return True
    except Exception:                   # noqa: BLE001 - a hint only
        return False


def _host_runs(jobs):
    """CPU tensors [(tensor, offset, bytes)] as runs that lie end to end in
    the file: [(offset, [(tensor, bytes), ...])], by offset."""
    runs, end = [], None
    for t, o, n in sorted(jobs, key=lambda j: j[1]):
        if runs and o == end:
            runs[-1][1].append((t, n))
        else:
            runs.append((o, [(t, n)]))
            end = o
        end += n
    return runs


def _cpu_io(fn, fd, jobs, what):
    """CPU tensors [(tensor, offset, bytes)] through fn (os.pwritev or
    os.preadv): one call per run of tensors that lie end to end in the
    file."""
    for start, run in _host_runs(jobs):
        n = _vec_io(fn, fd, [_cpu_buffer(t, n) for t, n in run], start, what)
        _count("posix_" + what, n)


def _write_tensors(fd, jobs, use_gpu):
    """Write [(tensor, offset)]: CUDA ones through _gpu_io first, then CPU
    ones in vectored writes.  Returns True when every tensor was written
    from its own memory (the CUDA ones device to device, no other device)."""
    cpu, cuda, other = _split(jobs)
    direct = _gpu_io(True, fd, cuda, use_gpu)
    _cpu_io(os.pwritev, fd, cpu, "write")
    for t, o, _ in other:               # mps, xpu, ...: through host memory
        _count("posix_write", _vec_io(os.pwritev, fd, [_cpu_buffer(t.cpu())], o, "write"))
    return direct and not other


def _read_tensors(fd, jobs, use_gpu):
    """Fill [(contiguous destination tensor, offset)] from the file."""
    _read_split(fd, *_split(jobs), use_gpu)


def _read_split(fd, cpu, cuda, other, use_gpu):
    """_read_tensors of jobs split by device (see _split)."""
    _cpu_io(os.preadv, fd, cpu, "read")
    _gpu_io(False, fd, cuda, use_gpu)
    for t, o, _ in other:
        host = torch.empty(t.shape, dtype=t.dtype)
        _count("posix_read", _vec_io(os.preadv, fd, [_cpu_buffer(host)], o, "read"))
        t.copy_(host)


# ---------------------------------------------------------------- the header

def _st_name(t, where):
    name = DTYPES.get(t.dtype)
    if name is None:
        raise TypeError(f"{where}: dtype {t.dtype} has no safetensors equivalent "
                        f"(supported: {', '.join(sorted(DTYPES.values()))})")
    return name


def _build_header(entries, metadata):
    """entries: [(name, dtype name, shape, nbytes)] in file order.  Returns
    (header bytes including the 8-byte length, [data offset of each])."""
    hdr = {"__metadata__": metadata}
    offs, pos = [], 0
    for name, dt, shape, nbytes in entries:
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        offs.append(pos)
        pos += nbytes
    text = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, offs


def _no_dups(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise FormatError(f"header: key {k!r} appears twice")
        d[k] = v
    return d


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


class _Header:
    """A checked header: entries {name: (dtype name, shape, begin, end)}
    with begin/end absolute file offsets, in file order; metadata dict."""

    @staticmethod
    def read_raw(path, fd):
        """((the length and header bytes, the file's size), the file's first
        bytes as read), with one pread where the header is under 64 KiB (the
        first bytes then go on past the header: a load takes the host
        tensors that lie there from them)."""
        size = os.fstat(fd).st_size
        if size < 8:
            raise FormatError(f"{path}: {size} bytes: not a safetensors file (truncated?)")
        first = os.pread(fd, min(size, 1 << 16), 0)
        n = struct.unpack("<Q", first[:8])[0] if len(first) >= 8 else 0
        if n > MAX_HEADER:
            raise FormatError(f"{path}: header length {n} is over {MAX_HEADER} bytes: "
                              "not a safetensors file")
        if n > size - 8:
            raise FormatError(f"{path}: header of {n} bytes but the file has {size}: "
                              "truncated, or not a safetensors file")
        raw = first[8:8 + n]
        if len(raw) < n:
            raw += os.pread(fd, n - len(raw), 8 + len(raw))
        if len(raw) != n:
            raise FormatError(f"{path}: file ends inside the header")
        return (first[:8] + raw, size), first

    def __init__(self, path, fd, got=None):
        head_raw, size = got if got is not None else self.read_raw(path, fd)[0]
        raw, n = head_raw[8:], len(head_raw) - 8
        try:
            text = raw.decode("utf-8")
            if not text.startswith("{"):
                raise ValueError("does not begin with '{'")
            obj = json.loads(text, object_pairs_hook=_no_dups)
        except FormatError as e:
            raise FormatError(f"{path}: {e}") from None
        except ValueError as e:
            raise FormatError(f"{path}: header is not JSON text: {e}") from None
        if not isinstance(obj, dict):
            raise FormatError(f"{path}: header is not a JSON object")
        meta = obj.pop("__metadata__", None)
        if meta is not None and (not isinstance(meta, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
            raise FormatError(f"{path}: __metadata__ must map strings to strings")
        self.metadata = meta or {}
        ents = []
        for name, info in obj.items():
            where = f"{path}: tensor {name!r}"
            if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
                raise FormatError(f"{where}: needs exactly dtype, shape and data_offsets")
            dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
            if dt not in _SIZES:
                raise FormatError(f"{where}: unknown dtype {dt!r}")
            if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
                raise FormatError(f"{where}: shape {shape!r} is not a list of sizes")
            if (not isinstance(offs, list) or len(offs) != 2 or not all(map(_is_int, offs))
                    or not 0 <= offs[0] <= offs[1]):
                raise FormatError(f"{where}: data_offsets {offs!r} are not [begin, end]")
            want = math.prod(shape) * _SIZES[dt]
            if offs[1] - offs[0] != want:
                raise FormatError(f"{where}: {offs[1] - offs[0]} bytes in data_offsets, "
                                  f"{dt} x {shape} needs {want}")
            ents.append((offs[0], offs[1], name, dt, tuple(shape)))
        ents.sort(key=lambda e: (e[0], e[1]))
        pos, data = 0, size - 8 - n
        for b, e, name, _, _ in ents:
            if b != pos:
                what = "overlaps the one before" if b < pos else f"leaves a gap at {pos}"
                raise FormatError(f"{path}: tensor {name!r} at [{b}, {e}) {what}")
            if e > data:
                raise FormatError(f"{path}: tensor {name!r} ends at {e}, past the "
                                  f"{data} bytes of data: truncated")
            pos = e
        if pos != data:
            raise FormatError(f"{path}: the tensors cover {pos} bytes, the file has "
                              f"{data} after the header")
        base = 8 + n
        self.entries = collections.OrderedDict(
            (name, (dt, shape, base + b, base + e)) for b, e, name, dt, shape in ents)


# ---------------------------------------------------------------- structure

_TAGS = ("tensor", "view", "dict", "tuple", "size", "float", "bytes")


def _path_name(path):
    return ".".join(str(p) for p in path) or "tensor"


class _Saver:
    """Walks the object: the structure (JSON-able), the tensor leaves, then
    the entries (one per tensor, or per shared storage)."""

    def __init__(self):
        self.leaves = []                # [(path name, tensor, node to fill)]
        self.copied = False             # a tensor is written from a copy

    def key(self, k, path):
        if k is None or isinstance(k, (bool, int, str)):
            return k
        if isinstance(k, float):
            return self.node(k, path)
        if type(k) is tuple:
            return {"tuple": [self.key(x, path) for x in k]}
        raise TypeError(f"{_path_name(path)}: a key of type {type(k).__name__} cannot be saved")

    def node(self, obj, path):
        if isinstance(obj, torch.Tensor):
            if obj.layout != torch.strided:
                raise TypeError(f"{_path_name(path)}: {obj.layout} tensors cannot be saved")
            if obj.device.type == "meta":
                raise TypeError(f"{_path_name(path)}: a meta tensor has no data to save")
            _st_name(obj, _path_name(path))
            n = {}
            self.leaves.append((_path_name(path), obj.detach(), n))
            return n
        if obj is None or isinstance(obj, (bool, str)) or _is_int(obj):
            if type(obj) not in (type(None), bool, str, int):
                obj = int(obj) if _is_int(obj) else str(obj)    # IntEnum, str subclasses
            return obj
        if isinstance(obj, float):
            if math.isfinite(obj):
                return float(obj)
            return {"float": repr(float(obj))}
        if isinstance(obj, torch.Size):
            return {"size": list(obj)}
        if isinstance(obj, (bytes, bytearray)):
            return {"bytes": base64.b64encode(bytes(obj)).decode("ascii")}
        if isinstance(obj, dict):
            out = {"dict": [[self.key(k, path), self.node(v, path + (k,))]
                            for k, v in obj.items()]}
            if isinstance(obj, collections.OrderedDict):
                out["ordered"] = True
                md = getattr(obj, "_metadata", None)    # nn.Module.state_dict's versions
                if md is not None:
                    out["_metadata"] = self.node(md, path + ("_metadata",))
            return out
        if type(obj) is list:
            return [self.node(v, path + (i,)) for i, v in enumerate(obj)]
        if type(obj) is tuple:
            return {"tuple": [self.node(v, path + (i,)) for i, v in enumerate(obj)]}
        raise TypeError(f"{_path_name(path)}: a {type(obj).__name__} cannot be saved "
                        "(tensors, dicts, lists, tuples, None, bool, int, float, str, bytes)")

    def entries(self):
        """Group the leaves by storage; fill their nodes; return
        [(name, contiguous tensor to write)] and the devices map."""
        names = set()

        def unique(n):
            m, k = n, 1
            while m in names or m == "__metadata__":
                k += 1
                m = f"{n}#{k}"
            names.add(m)
            return m

        groups = collections.OrderedDict()
        for i, (name, t, node) in enumerate(self.leaves):
            if t.numel() == 0:
                key = ("empty", i)
            else:
                key = (str(t.device), t.data_ptr() - t.storage_offset() * t.element_size())
            groups.setdefault(key, []).append(i)
        out, devices, shared = [], {}, 0
        for idx in groups.values():
            ls = [self.leaves[i] for i in idx]
            t0 = ls[0][1]
            sig = lambda t: (t.dtype, t.storage_offset(), tuple(t.shape), t.stride())  # noqa: E731
            if len(ls) == 1 or all(sig(t) == sig(t0) for _, t, _ in ls):
                name = unique(ls[0][0])
                c = t0.contiguous()
                self.copied |= c is not t0
                out.append((name, c))
                for _, _, node in ls:
                    node["tensor"] = name
            elif all(t.dtype == t0.dtype for _, t, _ in ls):
                lo = min(t.storage_offset() for _, t, _ in ls)
                hi = max(t.storage_offset() + 1 + sum((s - 1) * st for s, st in
                                                      zip(t.shape, t.stride()))
                         for _, t, _ in ls)
                name = unique(f"__shared__.{shared}")
                shared += 1
                out.append((name, t0.as_strided((hi - lo,), (1,), lo)))
                for _, t, node in ls:
                    node.update(view=name, offset=t.storage_offset() - lo,
                                shape=list(t.shape), stride=list(t.stride()))
            else:                       # views of one storage as different dtypes
                for lname, t, node in ls:
                    name = unique(lname)
                    c = t.contiguous()
                    self.copied |= c is not t
                    out.append((name, c))
                    node["tensor"] = name
        for name, t in out:
            if t.device.type != "cpu":
                devices[name] = str(t.device)
        return out, devices


def _decode_key(k, where):
    """A key of the structure; `where` (a name, or a path made a name only
    for an error) says where it is."""
    if isinstance(k, dict):
        if not isinstance(where, str):
            where = _path_name(where)
        if set(k) == {"tuple"} and isinstance(k["tuple"], list):
            return tuple(_decode_key(x, where) for x in k["tuple"])
        if set(k) == {"float"}:
            return _decode_leaf(k, where)
        raise FormatError(f"{where}: bad key {k!r}")
    if isinstance(k, list):
        raise FormatError(f"{where if isinstance(where, str) else _path_name(where)}: "
                          f"bad key {k!r}")
    return k


def _decode_leaf(n, where):
    try:
        if "float" in n:
            v = float(n["float"])
            if math.isfinite(v):
                raise ValueError
            return v
        if "bytes" in n:
            return base64.b64decode(n["bytes"].encode("ascii"), validate=True)
        if "size" in n:
            if not all(_is_int(x) and x >= 0 for x in n["size"]):
                raise ValueError
            return torch.Size(n["size"])
    except (ValueError, TypeError, AttributeError):
        pass
    raise FormatError(f"{where}: bad value {n!r}")


class _Loader:
    """Rebuilds the saved object from the structure and the loaded entries."""

    def __init__(self, path, entries, tensors):
        self.path, self.entries, self.tensors = path, entries, tensors
        self.views = {}

    def bad(self, msg):
        raise FormatError(f"{self.path}: {STRUCTURE_KEY}: {msg}")

    def check_view(self, n, where):
        base = n.get("view")
        if base not in self.entries:
            self.bad(f"{where}: no tensor {base!r} in the file")
        off, shape, stride = n.get("offset"), n.get("shape"), n.get("stride")
        if (not _is_int(off) or off < 0 or not isinstance(shape, list)
                or not isinstance(stride, list) or len(shape) != len(stride)
                or not all(_is_int(x) and x >= 0 for x in shape + stride)):
            self.bad(f"{where}: bad view {n!r}")
        numel = math.prod(self.entries[base][1])
        if math.prod(shape) and off + 1 + sum((s - 1) * st for s, st in zip(shape, stride)) > numel:
            self.bad(f"{where}: view reaches past the {numel} elements of {base!r}")
        return base

    def check(self, n, where="root"):
        """The entries the structure references, checked; raises FormatError."""
        if isinstance(n, list):
            for i, v in enumerate(n):
                self.check(v, f"{where}.{i}")
            return
        if not isinstance(n, dict):
            if not (n is None or isinstance(n, (bool, int, float, str))):
                self.bad(f"{where}: bad value {n!r}")
            return
        tag = [t for t in _TAGS if t in n]
        if len(tag) != 1:
            self.bad(f"{where}: bad node {str(n)[:80]}")
        tag = tag[0]
        if tag == "tensor":
            if n["tensor"] not in self.entries:
                self.bad(f"{where}: no tensor {n['tensor']!r} in the file")
        elif tag == "view":
            self.check_view(n, where)
        elif tag == "dict":
            if not isinstance(n["dict"], list):
                self.bad(f"{where}: bad dict")
            for kv in n["dict"]:
                if not isinstance(kv, list) or len(kv) != 2:
                    self.bad(f"{where}: bad dict item {kv!r}")
                k = _decode_key(kv[0], where)
                try:
                    hash(k)
                except TypeError:
                    self.bad(f"{where}: bad key {kv[0]!r}")
                self.check(kv[1], f"{where}.{k}")
            if "_metadata" in n:
                self.check(n["_metadata"], f"{where}._metadata")
        elif tag == "tuple":
            if not isinstance(n["tuple"], list):
                self.bad(f"{where}: bad tuple")
            for i, v in enumerate(n["tuple"]):
                self.check(v, f"{where}.{i}")
        else:
            _decode_leaf(n, where)

    def build(self, c):
        """The value of compiled node c (see _compile), with the loaded
        tensors; containers are new objects."""
        k = c[0]
        if k is _X:
            return c[1]
        if k is _T:
            return self.tensors[c[1]]
        if k is _D:
            d = collections.OrderedDict() if c[2] else {}
            for key, v in c[1]:
                d[key] = self.build(v)
            if c[3] is not None:
                d._metadata = self.build(c[3])
            return d
        if k is _L:
            return [self.build(v) for v in c[1]]
        if k is _U:
            return tuple(self.build(v) for v in c[1])
        v = self.views.get(c)           # one object per distinct view, like torch.load
        if v is None:
            shape, stride, off = c[2]
            v = self.views[c] = self.tensors[c[1]].as_strided(shape, stride, off)
        return v


# A checked structure compiled for loading: nested tuples with the keys and
# leaves decoded, so that a load walks it without parsing anything again.
#   (_T, entry)                         a tensor
#   (_V, entry, (shape, stride, offset)) a view of an entry
#   (_D, [(key, node)], ordered, _metadata node or None, number of keys)
#   (_L, [node]) a list, (_U, [node]) a tuple
#   (_X, value)                         None, bool, int, float, str, bytes,
#                                       torch.Size: immutable, shared by loads
_T, _V, _D, _L, _U, _X = range(6)


def _compile(n, uses):
    """Compile checked structure node n; count each entry's references in
    uses {entry: [tensor refs, view refs]}."""
    if isinstance(n, list):
        return (_L, [_compile(v, uses) for v in n])
    if not isinstance(n, dict):
        return (_X, n)
    if "tensor" in n:
        uses.setdefault(n["tensor"], [0, 0])[0] += 1
        return (_T, n["tensor"])
    if "view" in n:
        uses.setdefault(n["view"], [0, 0])[1] += 1
        return (_V, n["view"], (tuple(n["shape"]), tuple(n["stride"]), n["offset"]))
    if "dict" in n:
        items = [(_decode_key(k, ""), _compile(v, uses)) for k, v in n["dict"]]
        md = _compile(n["_metadata"], uses) if "_metadata" in n else None
        return (_D, items, bool(n.get("ordered")), md, len({k for k, _ in items}))
    if "tuple" in n:
        return (_U, [_compile(v, uses) for v in n["tuple"]])
    return (_X, _decode_leaf(n, ""))


# ---------------------------------------------------------------- save / load

def _write_file(fd, header, jobs, use_gpu):
    """The tensors, then the header: the device tensors' vectored call goes
    first and gives the file its size, so that the host writes land inside
    it (a write far past the end makes a file system fill the hole; tierfs's
    host cache fills it in memory).  Returns _write_tensors's answer."""
    direct = _write_tensors(fd, jobs, use_gpu)
    _vec_io(os.pwritev, fd, [memoryview(header)], 0, "write")
    return direct


def _tmp_name(path):
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{base}.tmp-{os.getpid()}-{os.urandom(4).hex()}")


# ---------------------------------------------------------------- repeated saves
#
# A training loop saves the same state dict again and again: the same
# structure and the same tensors (updated in place: same storage, shape and
# dtype), other bytes.  save() keeps the plans of its last few saves on
# tierfs (the header, the packed segment list of each GPU's vectored call,
# the host writes) under a fingerprint of the object that covers everything
# the file's layout and the plan depend on: each container's type, length
# and keys, each other leaf's type and value, each tensor's type, device,
# dtype, shape, strides, storage offset and address.  A save whose
# fingerprint matches writes from the plan; any difference makes a new one.
# Plans are made only where every tensor is written from its own memory
# (no contiguous copy, no staging through host memory).

_PLAN_MAX = 4
_plans = collections.OrderedDict()
_plans_lock = threading.Lock()


_FP_BIG = 1 << 16                       # longer str/bytes leaves: no plan


def _scalar_fp(x):
    """A plain value's part of the fingerprint; for anything that is not a
    plain value (or is too long) an unhashable one: no plan (the save itself
    then says whether it can be saved)."""
    tp = type(x)
    if tp is float:
        return (float, x.hex())         # tells -0.0 from 0.0
    if tp is tuple:
        return (tuple, tuple(_scalar_fp(e) for e in x))
    if (tp is bytes or tp is str) and len(x) > _FP_BIG:
        return [x]                      # a plan would keep it alive
    if x is None or isinstance(x, (bool, int, str, bytes, torch.Size)):
        return (tp, x)
    return [x]


def _fingerprint(obj, out):
    """Append obj's fingerprint to out (tensors and plain values of a
    container inline: one call per container, not per leaf)."""
    Tensor = torch.Tensor
    if isinstance(obj, Tensor):
        out.append((type(obj), obj.device, obj.dtype, obj.shape, obj.stride(),
                    obj.storage_offset(), obj.data_ptr(), obj.layout))
        return
    if isinstance(obj, dict):
        out.append((type(obj), len(obj)))
        if type(obj) is not dict:       # an OrderedDict's _metadata
            _fingerprint(getattr(obj, "_metadata", None), out)
        items = obj.items()
    elif type(obj) is list or type(obj) is tuple:
        out.append((type(obj), len(obj)))
        items = enumerate(obj)
    else:
        out.append(_scalar_fp(obj))
        return
    keyed = type(obj) is not list and type(obj) is not tuple
    for k, v in items:
        if keyed:
            out.append(k if type(k) is str else _scalar_fp(k))
        if isinstance(v, Tensor):
            out.append((type(v), v.device, v.dtype, v.shape, v.stride(),
                        v.storage_offset(), v.data_ptr(), v.layout))
        elif isinstance(v, (dict, list, tuple)):
            _fingerprint(v, out)
        else:
            out.append(_scalar_fp(v))


class _Key:
    """A fingerprint as a dict key: its hash taken once (a fingerprint is a
    tuple of a few thousand items, and a tuple hashes them all each time)."""
    __slots__ = ("fp", "h")

    def __init__(self, fp):
        self.fp, self.h = fp, hash(fp)

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        return self is other or (isinstance(other, _Key) and self.h == other.h
                                 and self.fp == other.fp)


def _plan_key(obj):
    """The fingerprint of obj as a dict key, or None (unhashable leaves)."""
    fp = []
    _fingerprint(obj, fp)
    try:
        return _Key(tuple(fp))
    except TypeError:
        return None


def _check_guess(obj, gkey):
    """(obj's plan key, whether it is gkey): the background half of a
    guessed save."""
    key = _plan_key(obj)
    return key, key == gkey


def _make_plan(header, jobs):
    """The plan of a save whose tensors were all written from their own
    memory: {"gpu": [(device, packed segments, n, bytes)], "host": [(file
    offset, (byte views of the header and the host tensors' memory))] (runs
    of adjacent ranges, the header first).  The views are used only once a
    save's fingerprint has matched: the tensors are the same, where they
    were."""
    cpu, cuda, _ = _split(jobs)
    plan = {"gpu": [], "host": []}
    for dev, js in cuda.items():
        segs = [(t.data_ptr(), n, off) for t, off, n in js if n]
        if not segs:
            continue
        buf, n = _tierfs._pack_iov(segs)
        plan["gpu"].append((dev, buf, n, sum(x[1] for x in segs)))
    host, end = [(0, [memoryview(header)])], len(header)
    for off, run in _host_runs(cpu):
        views = [_cpu_buffer(t, n) for t, n in run if n]
        if not views:
            continue
        if off == end:
            host[-1][1].extend(views)   # the header's run, or the last one
        else:
            host.append((off, views))
        end = off + sum(len(v) for v in views)
    plan["host"] = [(off, tuple(views)) for off, views in host]
    return plan


def _write_plan_gpu(fd, plan, first=None):
    """The GPU part of a plan: each GPU's segments in one vectored call;
    first() is called just before the first call (which releases the GIL
    while the GPU copies: the moment for another thread's Python).  Returns
    False when a GPU call is refused in a way that means "use host memory"
    (the caller writes the slow way)."""
    for dev, buf, n, want in plan["gpu"]:
        try:
            with torch.cuda.device(dev):
                torch.cuda.synchronize(dev)
                if first is not None:
                    first()
                    first = None
                got = _tierfs._gpu_iov_packed(True, fd, buf, n)
        except OSError as e:
            if _gpu_fallback(e):
                return False
            raise
        if got != want:
            raise OSError(errno.EIO, f"GPU write: {got} of {want} bytes")
        _count("gpu_write", want)
    return True


def _write_plan_host(fd, plan):
    """The host part of a plan: the header with the host tensors after it,
    and the other runs of host tensors."""
    for off, views in plan["host"]:
        _count("posix_write", _vec_io(os.pwritev, fd, list(views), off, "write"))
    _count("saves_from_plan", 1)


# A save from a plan checks the object's fingerprint while the plan's GPU
# calls run: the fingerprint is taken in a thread of the module's own (the
# GPU calls release the GIL), and a save whose fingerprint turns out to
# differ from its plan's starts its file again (only the guess was wasted:
# the GPU calls read memory and wrote the temporary file).  The guess is
# the plan last used for the same object (by id).

_GUESS_MAX = 16
_guesses = collections.OrderedDict()    # id(obj) -> plan key
_worker = [None, None]                  # [pid, executor]


def _in_background(fn, *args):
    """A concurrent.futures.Future of fn(*args) run by the module's thread."""
    with _plans_lock:
        if _worker[0] != os.getpid():   # none yet, or made before a fork
            import concurrent.futures
            _worker[:] = [os.getpid(), concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="tierfs.torch")]
        return _worker[1].submit(fn, *args)


def _guess(obj):
    """(key, plan) of the plan last used for obj, or None."""
    with _plans_lock:
        key = _guesses.get(id(obj))
        plan = _plans.get(key) if key is not None else None
    return (key, plan) if plan is not None else None


def _remember(obj, key, plan=None):
    """Keep plan (if given) under key and key as obj's guess."""
    with _plans_lock:
        if plan is not None:
            _plans[key] = plan
            while len(_plans) > _PLAN_MAX:
                _plans.popitem(last=False)
        else:
            _plans.move_to_end(key)
        _guesses[id(obj)] = key
        _guesses.move_to_end(id(obj))
        while len(_guesses) > _GUESS_MAX:
            _guesses.popitem(last=False)


def _prepare(obj):
    """Walk obj: (header bytes, [(tensor, file offset)], whether a tensor is
    written from a copy).  Raises TypeError for what cannot be saved."""
    s = _Saver()
    root = s.node(obj, ())
    ents, devices = s.entries()
    # largest elements first: every tensor aligned to its element size, no
    # gaps; within a size, host tensors before device ones, so that the host
    # bytes are a few runs (one write each) inside the range that the device
    # tensors' one vectored call covers first (see _write_file)
    order = sorted(range(len(ents)), key=lambda i: (-ents[i][1].element_size(),
                                                    ents[i][1].device.type == "cuda"))
    ents = [ents[i] for i in order]
    structure = {"version": STRUCTURE_VERSION, "root": root}
    if devices:
        structure["devices"] = devices
    meta = {"format": "pt",
            STRUCTURE_KEY: json.dumps(structure, separators=(",", ":"), ensure_ascii=False,
                                      allow_nan=False)}
    header, offs = _build_header(
        [(name, DTYPES[t.dtype], t.shape, t.numel() * t.element_size()) for name, t in ents],
        meta)
    jobs = [(t, len(header) + o) for (_, t), o in zip(ents, offs)]
    return header, jobs, s.copied


def save(obj, path, fsync=None):
    """Save `obj` (a state dict: tensors in nested dicts, lists and tuples,
    with None, bool, int, float, str and bytes leaves) to file `path` in the
    safetensors layout (see the module's documentation).

    The file is written under a temporary name in the same directory and
    renamed over `path` when complete; a save that fails leaves the previous
    file as it was.  fsync: None (the default) fsyncs the file before the
    rename except on tierfs (whose close already caches it; wait_flushed for
    the SSD copy), True or False to choose.

    CUDA tensors are written device to device on a tierfs mount with a GPU
    tier, else through host memory; their producers are synchronised first.
    Non-contiguous tensors are written as contiguous copies.  Saving the same
    object again (same structure, tensors updated in place) on tierfs reuses
    the last save's header and segment lists.

    Raises TypeError for what cannot be saved (a dtype safetensors lacks, an
    object that is not a tensor, container or plain value), before any file
    is touched; OSError for I/O errors."""
    path = os.fspath(path)
    mark = _marks(f"save {path}")
    d = os.path.dirname(os.path.abspath(path))
    on_tfs = _on_tierfs(d)
    if fsync is None:
        fsync = not on_tfs
    guess = _guess(obj) if on_tfs else None
    key = _plan_key(obj) if on_tfs and guess is None else None
    prep = None
    if guess is None:
        with _plans_lock:
            if key is None or key not in _plans:
                prep = _prepare(obj)    # TypeError before any file is touched
    mark("guessed" if guess is not None else "planned" if prep is None else "walked")
    tmp = _tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    mark("open")
    try:
        try:
            if guess is not None:
                _save_guessed(fd, obj, guess, mark)
            else:
                _save_keyed(fd, obj, key, on_tfs, prep, mark)
            if fsync:
                os.fsync(fd)
                mark("fsync")
        finally:
            os.close(fd)
        mark("close")
        os.replace(tmp, path)
        mark("rename")
        if mark is not _no_mark:
            mark.done()
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _save_guessed(fd, obj, guess, mark):
    """Write obj to fd from the plan guessed for it while its fingerprint
    is taken in the background; start again when the fingerprint differs."""
    gkey, plan = guess
    pending = []

    def start():
        pending.append(_in_background(_check_guess, obj, gkey))
    try:
        ok, err = _write_plan_gpu(fd, plan, start), None
    except OSError as e:
        ok, err = False, e
    mark("gpu")
    key, same = pending[0].result() if pending else _check_guess(obj, gkey)
    mark("fingerprint")
    if same:
        if err is not None:
            raise err
        if ok:
            _write_plan_host(fd, plan)
            _remember(obj, gkey)
            mark("host")
            return
        with _plans_lock:               # refused: the slow way, no plan
            _plans.pop(key, None)
    else:
        _count("plans_missed", 1)
    os.ftruncate(fd, 0)
    _save_keyed(fd, obj, key, True, None, mark)


def _save_keyed(fd, obj, key, on_tfs, prep, mark):
    """Write obj to fd: from the plan kept under key if there is one, else
    from prep (_prepare's answer, made here if None), keeping the plan where
    one can be made."""
    with _plans_lock:
        plan = _plans.get(key) if key is not None else None
    if plan is not None:
        if _write_plan_gpu(fd, plan):
            mark("gpu")
            _write_plan_host(fd, plan)
            _remember(obj, key)
            mark("host")
            return
        with _plans_lock:
            _plans.pop(key, None)
        os.ftruncate(fd, 0)
    header, jobs, copied = prep or _prepare(obj)
    direct = _write_file(fd, header, jobs, on_tfs)
    mark("written")
    if key is not None and direct and not copied:
        _remember(obj, key, _make_plan(header, jobs))
    elif key is not None:
        with _plans_lock:               # no plan: no guess either
            _guesses.pop(id(obj), None)


def _device_for(saved, map_location):
    """The device a tensor saved on `saved` loads to."""
    if map_location is None:
        dev = torch.device(saved)
    elif isinstance(map_location, dict):
        dev = torch.device(map_location.get(saved, saved))
    elif isinstance(map_location, (str, torch.device)):
        dev = torch.device(map_location)
    else:
        raise TypeError("map_location must be None, a device, a device name or a dict "
                        "{saved device: device}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"a tensor was saved on {saved} and CUDA is not available here: "
                           "load with map_location='cpu'")
    if dev.type == "cuda" and dev.index is None:    # as its tensors will say
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _open_read(path):
    path = os.fspath(path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fd, _Header(path, fd)
    except BaseException:
        os.close(fd)
        raise


# Checkpoints of one training run have one header as long as their other
# values are equal (the tensors' bytes are not in it): load() keeps the
# checked form of its last few headers, keyed by their bytes and the file's
# size, and skips parsing and checking one it has seen (every check depends
# on nothing else).
_HEADERS_MAX = 4
_headers = collections.OrderedDict()


def _checked(path, fd):
    """((header, structure, compiled root, uses, the entries referenced once
    as a whole tensor, {entry: (dtype, shape, offset, bytes, referenced
    once as a whole tensor)}) of the file open at fd, checked; the file's
    first bytes, as read)."""
    got, first = _Header.read_raw(path, fd)
    with _plans_lock:
        hit = _headers.get(got)
        if hit is not None:
            _headers.move_to_end(got)
    if hit is not None:
        _count("headers_reused", 1)
        return hit, first
    hdr = _Header(path, fd, got)
    st = _structure(path, hdr)
    _Loader(path, hdr.entries, {}).check(st["root"])
    uses = {}
    root = _compile(st["root"], uses)
    for name, (dt, _, _, _) in hdr.entries.items():
        if dt not in _FROM_NAME:
            raise TypeError(f"{path}: tensor {name!r} is {dt}, which this torch "
                            f"({torch.__version__}) has no dtype for")
    single = frozenset(n for n, u in uses.items() if u == [1, 0])
    tinfo = {name: (_FROM_NAME[dt], shape, b, e - b, name in single)
             for name, (dt, shape, b, e) in hdr.entries.items()}
    hit = (hdr, st, root, uses, single, tinfo)
    with _plans_lock:
        _headers[got] = hit
        while len(_headers) > _HEADERS_MAX:
            _headers.popitem(last=False)
    return hit, first


def _structure(path, hdr):
    """The decoded and checked structure of a tierfs file, or a flat one
    for another writer's file."""
    text = hdr.metadata.get(STRUCTURE_KEY)
    if text is None:
        return {"version": STRUCTURE_VERSION,
                "root": {"dict": [[n, {"tensor": n}] for n in hdr.entries]}}
    try:
        st = json.loads(text)
    except ValueError as e:
        raise FormatError(f"{path}: {STRUCTURE_KEY} is not JSON: {e}") from None
    if not isinstance(st, dict) or st.get("version") != STRUCTURE_VERSION or "root" not in st:
        raise FormatError(f"{path}: {STRUCTURE_KEY}: unknown version or no root")
    devs = st.get("devices", {})
    if not isinstance(devs, dict) or not all(
            k in hdr.entries and isinstance(v, str) for k, v in devs.items()):
        raise FormatError(f"{path}: {STRUCTURE_KEY}: bad devices")
    for v in devs.values():
        try:
            torch.device(v)
        except RuntimeError:
            raise FormatError(f"{path}: {STRUCTURE_KEY}: bad device {v!r}") from None
    return st


_MISSING = object()
_SAME = object()                        # a slot keeps its object (changed in place)


def _has_tensor(x):
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, dict):
        return any(_has_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(v) for v in x)
    return False


def _path_of(link):
    """The path tuple of a (parent link, key) chain."""
    out = []
    while link:
        link, k = link
        out.append(k)
    return tuple(reversed(out))


class _Into:
    """One walk of the compiled structure against load(into=)'s object: it
    checks everything (MismatchError) and collects, changing nothing, what
    the load then does: the tensors to read straight into (direct: {entry:
    tensor}, with their jobs in cpu and cuda), the devices to load the other entries to (hint),
    the tensors to copy into once loaded (copies: [(tensor, compiled
    node)]), and the slots to set afterwards (sets: [(container, key,
    compiled node or _Seq)]).  Paths are (parent, key) chains, made names
    only for an error."""

    def __init__(self, strict, entries, tinfo):
        self.strict, self.entries, self.tinfo = strict, entries, tinfo
        self.direct, self.hint, self.copies, self.sets = {}, {}, [], []
        self.cpu, self.cuda = [], {}    # the direct reads' jobs, CUDA ones by index
        self.top = self.error = None

    @staticmethod
    def bad(link, msg):
        raise MismatchError(f"{_path_name(_path_of(link))}: {msg}")

    def leaf(self, target, link, value):
        if self.strict and isinstance(target, torch.Tensor):
            self.bad(link, f"`into` has a tensor, the file a {type(value).__name__}")

    def tensor(self, c, t, link):
        """Tensor or view node c against tensor t of `into`.  The common
        case (a whole entry read in place) asks t as little as it can: a
        load walks every tensor of the state dict."""
        if c[0] is _T:
            name = c[1]
            dtype, shape, b, n, single = self.tinfo[name]
        else:
            dtype, shape = _FROM_NAME[self.entries[c[1]][0]], c[2][0]
        if t.shape != shape:
            self.bad(link, f"the file has shape {list(shape)}, `into` {list(t.shape)}")
        if t.dtype is not dtype:
            self.bad(link, f"the file has dtype {dtype}, `into` {t.dtype}")
        if c[0] is _T:
            if single and t.is_contiguous():
                if t.is_cuda:
                    self.cuda.setdefault(t.get_device(), []).append((t, b, n))
                    self.direct[name] = t
                    return
                if t.is_cpu:
                    self.cpu.append((t, b, n))
                    self.direct[name] = t
                    return
            self.hint[name] = t.device
        self.copies.append((t, c))

    def walk(self, c, t, link):
        """Check node c against target t; returns _SAME when t stays in its
        slot (filled or changed in place), else what the slot gets: a
        compiled node to build, or a _Seq."""
        k = c[0]
        if k is _X:
            self.leaf(t, link, c[1])
            return c
        if t is _MISSING or t is None:
            return c
        if k is _T or k is _V:
            if not isinstance(t, torch.Tensor):
                self.bad(link, f"the file has a tensor, `into` a {type(t).__name__}")
            self.tensor(c, t, link)
            return _SAME
        sets = self.sets
        if k is _D:
            if not isinstance(t, dict):
                self.bad(link, f"the file has a dict, `into` a {type(t).__name__}")
            found = 0
            Tensor = torch.Tensor
            for key, v in c[1]:
                tv = t.get(key, _MISSING)
                if tv is _MISSING:
                    sets.append((t, key, v))    # built, whatever it is
                    continue
                found += 1
                vk = v[0]
                if vk is _X:
                    if self.strict and isinstance(tv, Tensor):
                        self.leaf(tv, (link, key), v[1])
                    sets.append((t, key, v))
                elif vk is _T and isinstance(tv, Tensor):
                    self.tensor(v, tv, (link, key))
                else:
                    r = self.walk(v, tv, (link, key))
                    if r is not _SAME:
                        sets.append((t, key, r))
            if self.strict and found < len(t):
                keys = {key for key, _ in c[1]}
                for key, v in t.items():
                    if key not in keys and _has_tensor(v):
                        self.bad((link, key), "in `into`, not in the file")
            return _SAME
        items = c[1]
        if not isinstance(t, (list, tuple)) or len(t) != len(items):
            what = type(t).__name__ + (f" of {len(t)}" if isinstance(t, (list, tuple)) else "")
            self.bad(link, f"the file has a sequence of {len(items)}, `into` {what}")
        if isinstance(t, list):         # changed in place
            for i, v in enumerate(items):
                r = self.walk(v, t[i], (link, i))
                if r is not _SAME:
                    sets.append((t, i, r))
            return _SAME
        if k is _L:                     # a list where `into` has a tuple: a new list
            for i, v in enumerate(items):
                self.walk(v, t[i], (link, i))
            return c
        return _Seq(type(t), [(self.walk(v, t[i], (link, i)), t[i])
                              for i, v in enumerate(items)])


class _Seq:
    """A tuple of `into` rebuilt: [(what the element gets, its old value)]."""
    __slots__ = ("kind", "parts")

    def __init__(self, kind, parts):
        self.kind, self.parts = kind, parts

    def value(self, loader):
        return self.kind(old if r is _SAME else _value(r, loader) for r, old in self.parts)


def _value(r, loader):
    return r.value(loader) if type(r) is _Seq else loader.build(r)


def _from_first(first, jobs):
    """Fill the CPU jobs [(tensor, offset, bytes)] whose bytes lie in
    `first` (the file's first bytes, read with the header: save() puts the
    host tensors right after it) from there; returns the other jobs."""
    if not jobs:
        return jobs
    lim, rest, base, n_in = len(first), [], None, 0
    for job in jobs:
        t, b, n = job
        if b + n > lim:
            rest.append(job)
        elif n:
            if base is None:
                base = ctypes.cast(ctypes.c_char_p(first), ctypes.c_void_p).value
            ctypes.memmove(t.data_ptr(), base + b, n)
            n_in += n
    if n_in:
        _count("host_from_header", n_in)
    return rest


# A load into an object walks it against the file's structure.  The walk
# reads `into` only, so a load into an object loaded into before starts
# walking it (in the module's thread) against the structure of the file it
# was loaded from last time, while this file is opened and its header read
# (FUSE round trips, the GIL released); the walk is used when the header
# turns out the same (the same checked structure), else it is done again.

_INTO_MAX = 16
_into_last = collections.OrderedDict()  # id(into) -> the _checked entry of its last load


def _walk(hit, into, strict):
    """The _Into walk of `into` against the checked header `hit`, its
    MismatchError kept in .error."""
    w = _Into(strict, hit[0].entries, hit[5])
    try:
        w.top = w.walk(hit[2], into, ())
    except MismatchError as e:
        w.error = e
    return w


def _walk_ahead(into, strict):
    """(checked header, Future of its walk) for an object loaded into
    before, else None."""
    with _plans_lock:
        hit = _into_last.get(id(into))
    return (hit, _in_background(_walk, hit, into, strict)) if hit is not None else None


def _walked(ahead, hit, into, strict):
    """The walk of `into` against `hit`: the one started ahead where it was
    against this header, else one done now.  Raises its MismatchError."""
    w = None
    if ahead is not None:
        try:
            w = ahead[1].result()
        except Exception:               # noqa: BLE001 - done again below
            w = None
        if ahead[0] is not hit:
            w = None
    if w is None:
        w = _walk(hit, into, strict)
    if w.error is not None:
        raise w.error
    with _plans_lock:
        _into_last[id(into)] = hit
        _into_last.move_to_end(id(into))
        while len(_into_last) > _INTO_MAX:
            _into_last.popitem(last=False)
    return w


def load(path, map_location=None, into=None, strict=True):
    """Load what save() wrote to `path` (or any safetensors file: a flat dict
    {name: tensor}).

    map_location: None puts each tensor back on the device it was saved
    from; "cpu", "cuda:0", a torch.device, or a dict {"cuda:1": "cuda:0"}
    (saved device -> device) moves them.

    into: an object of the same structure whose tensors already exist
    (model.state_dict(), an optimizer's state_dict(), or a dict of both):
    the saved tensors are copied into them in place (CUDA ones device to
    device where the mount has a GPU tier), non-tensor values are put in
    their containers, and what `into` lacks (a fresh optimizer's empty
    "state") is added, loaded as map_location says.  Every tensor's shape and
    dtype is checked before anything is read or changed: MismatchError (a
    ValueError) names the first that differs; with strict=True also a tensor
    of `into` that the file does not have.  Returns `into`.  Then
    model.load_state_dict / optimizer.load_state_dict apply it, or, for a
    model's own state_dict(), nothing more is needed: its tensors are the
    model's.

    Tied tensors come back as one object, views of one storage as views of
    one new storage (see the module's documentation).

    Raises FormatError (a ValueError) for a file that is not in this layout,
    truncated, or whose header lies; TypeError for a dtype this torch lacks."""
    path = os.fspath(path)
    mark = _marks(f"load {path}")
    ahead = _walk_ahead(into, strict) if into is not None else None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    mark("open")
    try:
        hit, first = _checked(path, fd)
        hdr, st, root, uses = hit[:4]
        mark("header")
        entries = hdr.entries
        devs = st.get("devices", {})
        if into is not None:
            walk = _walked(ahead, hit, into, strict)
            direct, hint, tensors = walk.direct, walk.hint, dict(walk.direct)
            cpu, other = walk.cpu, []
            cuda = {torch.device("cuda", i): js for i, js in walk.cuda.items()}
            mark("into")
        else:
            direct, hint, tensors = {}, {}, {}
            cpu, cuda, other = [], {}, []   # the jobs by device (see _split)
        where = {}
        if len(direct) < len(uses):     # else every tensor is read in place
            for name, (dt, shape, b, e) in entries.items():
                if name in direct or name not in uses:
                    continue            # read in place, or written but not referenced
                dev = hint.get(name)
                if dev is None:
                    saved = devs.get(name, "cpu")
                    dev = where.get(saved)
                    if dev is None:
                        dev = where[saved] = _device_for(saved, map_location)
                t = torch.empty(shape, dtype=_FROM_NAME[dt], device=dev)
                tensors[name] = t
                job = (t, b, e - b)     # bytes in place: no autograd (no_grad below)
                if dev.type == "cpu":
                    cpu.append(job)
                elif dev.type == "cuda":
                    cuda.setdefault(dev, []).append(job)
                else:
                    other.append(job)
        mark("tensors")
        with torch.no_grad():
            cpu = _from_first(first, cpu)
            mark("host")
            # asked of the directory, as save does: one answer for every
            # checkpoint in it, not a stat and a realpath per new file
            _read_split(fd, cpu, cuda, other,
                        _on_tierfs(os.path.dirname(os.path.abspath(path))))
        mark("read")
    finally:
        os.close(fd)
    loader = _Loader(path, entries, tensors)
    if into is None:
        out = loader.build(root)
    else:
        with torch.no_grad():
            for target, c in walk.copies:
                target.copy_(loader.build(c))
            for container, key, r in walk.sets:
                container[key] = _value(r, loader)
        out = into if walk.top is _SAME else _value(walk.top, loader)
    if mark is not _no_mark:
        mark("close, build")
        mark.done()
    return out


# ---------------------------------------------------------------- DCP

def _dcp_classes():
    """(FileSystemWriter, FileSystemReader) built on torch's, or stand-ins
    that raise where torch.distributed.checkpoint is missing (torch 1.x)."""
    try:
        from torch.distributed.checkpoint import filesystem as _fs
        from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
        from torch.distributed.checkpoint.storage import WriteResult
        from torch.futures import Future
        _fs.FileSystemWriter, _fs.FileSystemReader, _fs._StorageInfo  # noqa: B018
    except (ImportError, AttributeError) as e:
        why = (f"tierfs.torch.FileSystemWriter/Reader need torch.distributed.checkpoint "
               f"(torch >= 2.0); this torch is {torch.__version__} ({e})")

        class FileSystemWriter:         # noqa: D401 - a stand-in
            """Needs torch >= 2.0 (torch.distributed.checkpoint)."""

            def __init__(self, *a, **k):
                raise RuntimeError(why)

        class FileSystemReader:
            """Needs torch >= 2.0 (torch.distributed.checkpoint)."""

            def __init__(self, *a, **k):
                raise RuntimeError(why)

        return FileSystemWriter, FileSystemReader, False
    from . import _dcp
    return _dcp.build(_fs, LoadItemType, WriteItemType, WriteResult, Future,
                      sys.modules[__name__])


FileSystemWriter, FileSystemReader, HAVE_DCP = _dcp_classes()
