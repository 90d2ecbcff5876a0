"""torch.distributed.checkpoint storage for tierfs (torch >= 2.0); used
through tierfs.torch.FileSystemWriter / FileSystemReader.

Each rank's data file (__R_K.distcp, named as torch names them) is in the
safetensors layout of tierfs.torch: the write items' tensors as entries
named "FQN" or "FQN@OFFSETS", the byte items (torch.save'd objects) as U8
entries; the metadata file (.metadata) is torch's own.  A _StorageInfo's
offset is the absolute file offset of the entry's bytes, its length their
count.  The reader reads these files itself and hands files of torch's own
format (a checkpoint written by torch's FileSystemWriter) to torch's reader.
"""

import collections
import copy
import dataclasses
import inspect
import io
import os

import torch

import tierfs as _tierfs

FORMAT = "tierfs.dcp"
_TEMP_LIMIT = 1 << 30                   # bytes of resharding temporaries read at once


def _resolve_sync(sync_files, path):
    if sync_files is None:              # tierfs: the close caches; wait_flushed for the SSD
        d = os.fspath(path)
        return not any(_tierfs.is_tierfs(p) for p in (d, os.path.dirname(d))
                       if os.path.exists(p))
    return bool(sync_files)


def _entry_name(index, taken):
    name = index.fqn
    if index.offset is not None and any(index.offset):
        name += "@" + ",".join(str(int(o)) for o in index.offset)
    base, k = name, 1
    while name in taken or name == "__metadata__":
        k += 1
        name = f"{base}#{k}"
    taken.add(name)
    return name


def _clone_tree(obj):
    """A copy of a state dict whose tensors are cloned where they are (CUDA
    tensors stay on their GPU) and whose other values are deep copies."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) in (dict, collections.OrderedDict) else {}
        for k, v in obj.items():
            out[k] = _clone_tree(v)
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_clone_tree(v) for v in obj)
    return copy.deepcopy(obj)


def _narrow(t, offsets, lengths):
    for dim, (o, n) in enumerate(zip(offsets, lengths)):
        if o != 0 or n != t.shape[dim]:
            t = t.narrow(dim, int(o), int(n))
    return t


def build(_fs, LoadItemType, WriteItemType, WriteResult, Future, tt):  # noqa: N803
    """The classes, on the installed torch's filesystem module `_fs`."""
    base_init = inspect.signature(_fs.FileSystemWriter.__init__).parameters

    class FileSystemWriter(_fs.FileSystemWriter):
        """torch.distributed.checkpoint's FileSystemWriter, writing each
        rank's file in the safetensors layout with tierfs.torch's I/O: CUDA
        tensors device to device where the directory is on a tierfs mount
        with a GPU tier, through host memory elsewhere.

        Arguments as torch's (those the installed torch lacks are ignored;
        thread_count and per_thread_copy_ahead are accepted and unused: one
        writer per rank, vectored calls).  sync_files=None (the default)
        fsyncs the files except on tierfs.  stage_on_device=True makes
        dcp.async_save (torch >= 2.4, which asks the writer to stage) clone
        the state dict where its tensors are, CUDA tensors on their GPU, so
        that the background write still goes device to device; False stages
        in host memory as torch does.

        Read such a checkpoint with tierfs.torch.FileSystemReader."""

        def __init__(self, path, single_file_per_rank=True, sync_files=None, thread_count=1,
                     per_thread_copy_ahead=10_000_000, cache_staged_state_dict=False,
                     overwrite=True, stage_on_device=True):
            want = dict(single_file_per_rank=single_file_per_rank, sync_files=True,
                        thread_count=thread_count, per_thread_copy_ahead=per_thread_copy_ahead,
                        cache_staged_state_dict=cache_staged_state_dict, overwrite=overwrite)
            super().__init__(path, **{k: v for k, v in want.items() if k in base_init})
            self.single_file_per_rank = single_file_per_rank
            self._sync_arg = sync_files
            self.stage_on_device = stage_on_device

        def stage(self, state_dict):
            """AsyncStager.stage (dcp.async_save, torch >= 2.4)."""
            if not self.stage_on_device:
                return super().stage(state_dict)
            return _clone_tree(state_dict)

        def write_data(self, plan, planner):
            d = os.fspath(self.path)
            os.makedirs(d, exist_ok=True)
            self.sync_files = _resolve_sync(self._sync_arg, d)
            prefix = plan.storage_data.prefix
            buckets = [plan.items] if self.single_file_per_rank else [[i] for i in plan.items]
            results = []
            for k, items in enumerate(buckets):
                name = f"{prefix}{k}{getattr(_fs, 'DEFAULT_SUFFIX', '.distcp')}"
                results += self._write_file(d, name, items, planner)
            fut = Future()
            fut.set_result(results)
            return fut

        def _write_file(self, d, name, items, planner):
            taken, ents = set(), []     # (entry, dtype name, shape, nbytes, payload, item)
            for item in items:
                data = planner.resolve_data(item)
                ename = _entry_name(item.index, taken)
                if item.type == WriteItemType.BYTE_IO:
                    buf = data.getbuffer() if isinstance(data, io.BytesIO) else memoryview(data)
                    buf = memoryview(buf).cast("B")
                    ents.append((ename, "U8", [len(buf)], len(buf), buf, item))
                else:
                    t = data.detach()
                    st = tt._st_name(t, item.index.fqn)
                    t = t.contiguous()
                    ents.append((ename, st, list(t.shape), t.numel() * t.element_size(), t,
                                 item))
            ents.sort(key=lambda e: -tt._SIZES[e[1]])
            header, offs = tt._build_header([e[:4] for e in ents], {"format": FORMAT})
            path = os.path.join(d, name)
            on_tfs = tt._on_tierfs(d)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                jobs, raw = [], []
                for e, o in zip(ents, offs):
                    if isinstance(e[4], torch.Tensor):
                        jobs.append((e[4], len(header) + o))
                    else:
                        raw.append((e[4], len(header) + o))
                # the tensors first, as tierfs.torch.save writes (see its
                # _write_file): the device tensors' one vectored call gives
                # the file its size and its copy's place
                tt._write_tensors(fd, jobs, on_tfs)
                for buf, o in raw:
                    tt._count("posix_write", tt._vec_io(os.pwritev, fd, [buf], o, "write"))
                tt._vec_io(os.pwritev, fd, [memoryview(header)], 0, "write")
                if self.sync_files:
                    os.fsync(fd)
            finally:
                os.close(fd)
            return [WriteResult(index=e[5].index, size_in_bytes=e[3],
                                storage_data=_fs._StorageInfo(name, len(header) + o, e[3]))
                    for e, o in zip(ents, offs)]

    class FileSystemReader(_fs.FileSystemReader):
        """torch.distributed.checkpoint's FileSystemReader for checkpoints
        of tierfs.torch.FileSystemWriter (and of torch's own writer, whose
        files it hands to torch's reader).  Before reading it sets the
        mount's restore order (tierfs.restore_order) to this rank's files in
        the order it reads them, so tierfs prefetches them; reading a file
        consumes its entry (restore_order=False: no hint).  Tensors are read
        straight into the planner's destination tensors where a stored chunk
        fills one (CUDA ones device to device where the mount has a GPU
        tier), else into a temporary on the destination's device and copied
        from there."""

        def __init__(self, path, restore_order=True):
            super().__init__(path)
            self.restore_order = restore_order

        def read_data(self, plan, planner):
            d = os.fspath(self.path)
            per_file = collections.OrderedDict()
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                per_file.setdefault(info.relative_path, []).append(item)
            ours, theirs = collections.OrderedDict(), []
            for rel, reqs in per_file.items():
                if _is_ours(os.path.join(d, rel)):
                    ours[rel] = reqs
                else:
                    theirs += reqs
            if theirs:
                super().read_data(dataclasses.replace(plan, items=theirs), planner).wait()
            if ours and self.restore_order and tt._on_tierfs(d):
                try:
                    _tierfs.restore_order(d, list(ours))
                except (OSError, ValueError):
                    pass                # advice only
            on_tfs = tt._on_tierfs(d)
            for rel, reqs in ours.items():
                self._read_file(os.path.join(d, rel), reqs, planner, on_tfs)
            fut = Future()
            fut.set_result(None)
            return fut

        def _read_file(self, path, reqs, planner, on_tfs):
            fd, hdr = tt._open_read(path)
            try:
                at = {b: (name, dt, shape, e - b) for name, (dt, shape, b, e)
                      in hdr.entries.items()}
                reqs = sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset)
                pending, temp = [], 0
                for req in reqs:
                    info = self.storage_data[req.storage_index]
                    ent = at.get(info.offset)
                    if ent is None or ent[3] != info.length:
                        raise tt.FormatError(f"{path}: no entry of {info.length} bytes at "
                                             f"offset {info.offset} for {req.storage_index}")
                    if req.type == LoadItemType.BYTE_IO:
                        buf = bytearray(info.length)
                        n = tt._vec_io(os.preadv, fd, [memoryview(buf)], info.offset, "read")
                        tt._count("posix_read", n)
                        planner.load_bytes(req, io.BytesIO(bytes(buf)))
                        continue
                    name, dt, shape, _ = ent
                    dtype = tt._FROM_NAME.get(dt)
                    if dtype is None:
                        raise TypeError(f"{path}: {name!r} is {dt}, which this torch lacks")
                    target = planner.resolve_tensor(req).detach()
                    full = (all(o == 0 for o in req.storage_offsets)
                            and list(req.lengths) == list(shape))
                    if (full and target.is_contiguous() and target.dtype == dtype
                            and list(target.shape) == list(shape)
                            and target.device.type in ("cpu", "cuda")):
                        pending.append((req, target, target, info.offset))
                    else:
                        src = torch.empty(shape, dtype=dtype, device=target.device)
                        pending.append((req, target, src, info.offset))
                        temp += info.length
                    if temp >= _TEMP_LIMIT:
                        self._finish(fd, pending, planner, on_tfs)
                        pending, temp = [], 0
                self._finish(fd, pending, planner, on_tfs)
            finally:
                os.close(fd)

        def _finish(self, fd, pending, planner, on_tfs):
            with torch.no_grad():
                tt._read_tensors(fd, [(src, off) for _, _, src, off in pending], on_tfs)
                for req, target, src, _ in pending:
                    if src is not target:
                        part = _narrow(src, req.storage_offsets, req.lengths)
                        if list(part.shape) != list(target.shape):
                            raise tt.FormatError(f"{req.storage_index}: stored "
                                                 f"{list(part.shape)}, wanted "
                                                 f"{list(target.shape)}")
                        target.copy_(part)
                    planner.commit_tensor(req, target)

    return FileSystemWriter, FileSystemReader, True


def _is_ours(path):
    """True if path is a data file of tierfs.torch.FileSystemWriter."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                return False
            n = int.from_bytes(head, "little")
            if n > 1 << 20:
                return False
            text = f.read(min(n, 4096))
    except OSError:
        return False
    return text.startswith(b'{"__metadata__":{"format":"' + FORMAT.encode() + b'"')
