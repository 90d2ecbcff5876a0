"""tierfs - steer and observe a tierfs mount from Python.

A thin layer over the extended attributes of tierfs-hints(7); only the
standard library is used.  Example, an adjoint computation that writes its
checkpoints forwards and reads them back backwards::

    import tierfs

    names = [f"ckpt-{i:04d}" for i in range(100)]
    with tierfs.prefetch(d, False):          # forward: no prefetch
        for n in names:
            write_checkpoint(os.path.join(d, n))
    with tierfs.restore_order(d, reversed(names)):
        for n in reversed(names):            # backward: prefetched
            read_checkpoint(os.path.join(d, n))

    tierfs.wait_flushed(d)                   # everything on the SSD

PyTorch checkpoints (the safetensors layout, CUDA tensors device to device,
a torch.distributed.checkpoint writer and reader) are in tierfs.torch, a
separate module: importing tierfs does not import torch.

Errors are OSError subclasses: NotTierfsError for a path that is not on a
tierfs mount, BadNameError (also a ValueError) for a restore-order name the
daemon would refuse; it names the bad line.  Other failures of the calls
(ENOENT, EPERM, ...) are raised as the OSError of the system call.
"""

import errno
import json
import os
import select
import stat as _stat
import struct
import threading
import time

__all__ = [
    "TierfsError", "NotTierfsError", "BadNameError",
    "restore_order", "queued", "clear", "restore_next", "prefetch",
    "tier", "state", "shared", "stats", "wait_flushed", "evict", "is_tierfs", "mount_of",
    "daemon_pid", "check_names", "persist", "persist_sync",
    "commit", "set_state", "sets", "latest", "wait_set", "keep", "LEVELS",
    "pwrite_gpu", "pread_gpu", "pwritev_gpu", "preadv_gpu", "save_gpu", "load_gpu",
]

__version__ = "0.1.0"

PREFIX = "user.tierfs."
XATTR_RESTORE_ORDER = PREFIX + "restore_order"
XATTR_RESTORE_ORDER_PAGE = PREFIX + "restore_order."     # + N: from the N-th entry
XATTR_PREFETCH = PREFIX + "prefetch"
XATTR_RESTORE_NEXT = PREFIX + "restore_next"
XATTR_TIER = PREFIX + "tier"
XATTR_STATE = PREFIX + "state"
XATTR_SHARED = PREFIX + "shared"
XATTR_STATS = PREFIX + "stats"
XATTR_EVICT = PREFIX + "evict"
XATTR_PERSIST = PREFIX + "persist"
XATTR_FLUSH = PREFIX + "flush"
XATTR_COMMIT = PREFIX + "commit"
XATTR_SET = PREFIX + "set"
XATTR_KEEP = PREFIX + "keep"
LEVELS = ("cache", "ssd", "pfs")    # checkpoint sets' levels, in order

HIDDEN_PREFIX = b".tierfs"      # names tierfs keeps to itself (fs/fs.h)
LOCK_NAME = ".tierfs.lock"      # in the backing directory: "PID MOUNTPOINT", ...
                                # (fs_start.c fs_lock_note_exit)
NAME_MAX = 255
VALUE_MAX = 64 * 1024           # the kernel's limit on an attribute value

FSTYPE = "fuse.tierfs"


class TierfsError(OSError):
    """Base class of the errors this module raises itself."""


class NotTierfsError(TierfsError):
    """The path is not on a tierfs mount (or not its root, where one is
    needed)."""


class BadNameError(TierfsError, ValueError):
    """A restore-order name that tierfs would refuse.

    Attributes: line (1-based line of the list), name (as given), reason."""

    def __init__(self, line, name, reason):
        self.line, self.name, self.reason = line, name, reason
        super().__init__(errno.EINVAL, f"restore order line {line}: {name!r}: {reason}")

    def __str__(self):
        return self.strerror


# ---------------------------------------------------------------- mounts

def _unescape(s):
    """mountinfo's octal escapes (\\040 for a space, ...)."""
    if "\\" not in s:
        return s
    out, i = bytearray(), 0
    b = s.encode("utf-8", "surrogateescape")
    while i < len(b):
        if b[i:i + 1] == b"\\" and i + 3 < len(b) and b[i + 1:i + 4].isdigit():
            out.append(int(b[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(b[i])
            i += 1
    return out.decode("utf-8", "surrogateescape")


# The mount table, parsed once and kept until it changes: /proc/self/mountinfo
# is pollable (proc(5)): a mount or unmount marks an open descriptor of it
# with POLLPRI until it is read again.  A save or load asks which file system
# it is on each time; parsing the table each time cost about a millisecond
# with a few dozen mounts.
_mtab = {"pid": None, "file": None, "poll": None, "table": None}
_mtab_lock = threading.Lock()


def _read_mounts(f):
    out = []
    f.seek(0)
    for line in f:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        r = right.split()
        out.append((_unescape(fields[4]), r[0] if r else "",
                    _unescape(r[1]) if len(r) > 1 else ""))
    return out


def _mounts():
    """[(mount point, fstype, source)] of /proc/self/mountinfo, in order."""
    return list(_mount_table())


def _mount_table():
    """The table _mounts() copies: the same object until the mount table
    changes (callers may key what they decided on it)."""
    with _mtab_lock:
        m = _mtab
        try:
            if m["pid"] != os.getpid():         # a forked child: its own table
                if m["file"] is not None:
                    m["file"].close()
                m.update(pid=None, file=None, table=None)
                m["file"] = open("/proc/self/mountinfo", encoding="utf-8",
                                 errors="surrogateescape")
                m["poll"] = select.poll()
                m["poll"].register(m["file"].fileno(), select.POLLPRI | select.POLLERR)
                m["pid"] = os.getpid()
            if m["table"] is None or m["poll"].poll(0):
                m["table"] = None
                m["table"] = _read_mounts(m["file"])
            return m["table"]
        except (OSError, ValueError):
            m.update(pid=None, table=None)
            with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
                return _read_mounts(f)


def mount_of(path):
    """The mount point of the tierfs mount holding `path`.

    Raises NotTierfsError if `path` is on another file system, and the
    OSError of stat(2) if it does not exist."""
    os.stat(path)                       # ENOENT, EACCES, ... as they are
    real = os.path.realpath(path)
    best, fstype = "", ""
    for mp, fst, _ in _mounts():        # the last mount over a place wins
        if real == mp or real.startswith(mp.rstrip("/") + "/"):
            if len(mp) >= len(best):
                best, fstype = mp, fst
    if fstype != FSTYPE:
        raise NotTierfsError(errno.ENOTSUP, f"{path} is not on a tierfs mount"
                             + (f" (it is on {best}, {fstype})" if best else ""))
    return best


def is_tierfs(path):
    """True if `path` (a file or directory) is on a tierfs mount."""
    try:
        mount_of(path)
        return True
    except OSError:
        return False


def _need_tierfs(path):
    mount_of(path)


# ---------------------------------------------------------------- names

def _as_bytes(name):
    if isinstance(name, bytes):
        return name
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
        if isinstance(name, bytes):
            return name
    if not isinstance(name, str):
        raise TypeError(f"a name must be str or bytes, not {type(name).__name__}")
    return os.fsencode(name)


def check_names(names, dir=None):
    """Check restore-order names as the daemon does (fs/fs_hints.c) and
    return them as a list of bytes.

    A name must be a plain name inside the directory: no "/", not "." or
    "..", not beginning with ".tierfs", at most 255 bytes, valid UTF-8, no
    NUL byte, no newline.  Empty names are refused here (the daemon skips
    empty lines; here they are mistakes).  With `dir`, a name that exists
    there must be a regular file (names of files not written yet are fine).
    Raises BadNameError naming the first bad line (1-based)."""
    out = []
    for i, name in enumerate(names, 1):
        b = _as_bytes(name)
        if not b:
            reason = "empty name"
        elif b"\n" in b:
            reason = "contains a newline"
        elif b"\0" in b:
            reason = "contains a NUL byte"
        elif b"/" in b:
            reason = "contains '/': only plain names inside the directory"
        elif b in (b".", b".."):
            reason = "'.' and '..' are not files"
        elif b.startswith(HIDDEN_PREFIX):
            reason = "names beginning with '.tierfs' are tierfs's own"
        elif len(b) > NAME_MAX:
            reason = f"longer than {NAME_MAX} bytes ({len(b)})"
        else:
            try:
                b.decode("utf-8", "strict")
                reason = None
            except UnicodeDecodeError:
                reason = "not valid UTF-8"
            if reason is None and dir is not None:
                try:
                    st = os.lstat(os.path.join(os.fsencode(dir), b))
                    if not _stat.S_ISREG(st.st_mode):
                        reason = "exists and is not a regular file"
                except FileNotFoundError:
                    pass
        if reason:
            raise BadNameError(i, name, reason)
        out.append(b)
    return out


def _chunks(names):
    """Newline-separated values of at most VALUE_MAX bytes."""
    chunk, size = [], 0
    for b in names:
        if chunk and size + len(b) + 1 > VALUE_MAX:
            yield b"\n".join(chunk) + b"\n"
            chunk, size = [], 0
        chunk.append(b)
        size += len(b) + 1
    if chunk:
        yield b"\n".join(chunk) + b"\n"


# ---------------------------------------------------------------- hints

class _Order:
    """What restore_order() returns: usable as a context manager, whose
    exit drops what is left of the directory's restore queue."""

    def __init__(self, dir, names):
        self.dir, self.names = dir, names

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            clear(self.dir)
        except OSError:
            if exc[0] is None:
                raise
        return False

    def __repr__(self):
        return f"<tierfs.restore_order {self.dir!r}: {len(self.names)} names>"


def restore_order(dir, names):
    """Append `names` (files of directory `dir`, in the order they will be
    read back) to the mount's restore queue; tierfs prefetches them ahead
    of the reads.

    Names are checked first (see check_names): a bad one raises
    BadNameError and nothing is queued.  Names of files that do not exist
    yet are fine.  Lists longer than the kernel's 64 KiB per attribute are
    sent in several writes.  OSError EDQUOT: a write would pass a bound on
    the queue (-o hint_max_user, -o hint_max; tierfs-hints(7)); it appends
    nothing, but the writes of a long list before it stay queued.

    Returns an object that can be used in a `with` statement: leaving it
    drops what is left of this directory's queue (clear(dir)), including
    entries queued by earlier calls."""
    _need_tierfs(dir)
    if not os.path.isdir(dir):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", dir)
    if isinstance(names, (str, bytes)):
        raise TypeError("names must be a list of names, not one string")
    checked = check_names(list(names), dir)
    if not checked:
        raise BadNameError(0, "", "no names")
    for value in _chunks(checked):
        os.setxattr(dir, XATTR_RESTORE_ORDER, value)
    return _Order(dir, checked)


def queued(dir):
    """The names of `dir` still in the restore queue, in order (str), the
    whole list however long: it is read in pages of at most 64 KiB
    (user.tierfs.restore_order.N, from the N-th entry on; tierfs-hints(7)).
    Entries consumed while it is read move the ones after them forward,
    so such a listing may leave names out."""
    _need_tierfs(dir)
    out, at = [], 0
    while True:
        try:
            v = os.getxattr(dir, XATTR_RESTORE_ORDER_PAGE + str(at))
        except OSError as e:
            if e.errno != errno.ENODATA or at or not os.path.isdir(dir):
                raise
            v = os.getxattr(dir, XATTR_RESTORE_ORDER)   # a daemon without pages
            return [os.fsdecode(n) for n in v.split(b"\n") if n]
        page = [n for n in v.split(b"\n") if n]
        if not page:
            return out
        out += [os.fsdecode(n) for n in page]
        at += len(page)


def clear(dir):
    """Drop the restore-queue entries of directory `dir`."""
    _need_tierfs(dir)
    os.removexattr(dir, XATTR_RESTORE_ORDER)


def restore_next(path):
    """Append file `path` to the restore queue (single-hint mode)."""
    _need_tierfs(path)
    os.setxattr(path, XATTR_RESTORE_NEXT, b"")


class _Prefetch:
    """What prefetch() returns: truthy when prefetching is on; as a context
    manager it restores the previous setting on exit."""

    def __init__(self, dir, before, now):
        self.dir, self.before, self.now = dir, before, now

    def __bool__(self):
        return self.now

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.before != self.now:
            try:
                _set_prefetch(self.dir, self.before)
            except OSError:
                if exc[0] is None:
                    raise
        return False

    def __repr__(self):
        return f"<tierfs.prefetch {'start' if self.now else 'stop'}>"


def _get_prefetch(dir):
    return os.getxattr(dir, XATTR_PREFETCH).strip() == b"start"


def _set_prefetch(dir, on):
    os.setxattr(dir, XATTR_PREFETCH, b"start" if on else b"stop")


def prefetch(dir, on=None):
    """Start (on=True) or hold (on=False) prefetching, mount-wide; `dir` is
    any directory of the mount.  With on=None only reads the setting.

    Returns an object that is true when prefetching is on, and that as a
    context manager puts the previous setting back on exit::

        with tierfs.prefetch(d, False):   # forward pass: flushes first
            ...

    Setting it needs root or the owner of the mount's root (EPERM)."""
    _need_tierfs(dir)
    before = _get_prefetch(dir)
    if on is None:
        return _Prefetch(dir, before, before)
    _set_prefetch(dir, bool(on))
    return _Prefetch(dir, before, bool(on))


# ---------------------------------------------------------------- reports

def tier(path):
    """The tiers holding a copy of file `path`, fastest first, e.g.
    ["host", "ssd"] or ["gpu", "host"]."""
    _need_tierfs(path)
    v = os.getxattr(path, XATTR_TIER).decode()
    return [t for t in v.strip().split(",") if t]


def shared(path):
    """(shared, size) of file `path`: the bytes of its backing file that
    share extents with other files (-o dedup: reflinks), and its size."""
    _need_tierfs(path)
    a, b = os.getxattr(path, XATTR_SHARED).decode().split()
    return int(a), int(b)


def state(path):
    """The life-cycle state of each tier's copy of file `path`, fastest
    first: {"host": "FLUSHED", "ssd": "CURRENT"} (see tierfs-hints(7))."""
    _need_tierfs(path)
    v = os.getxattr(path, XATTR_STATE).decode()
    out = {}
    for item in v.strip().split(","):
        t, sep, s = item.partition(":")
        if sep:
            out[t] = s
    return out


def stats(mount):
    """The statistics of the mount as a dict (user.tierfs.stats).  `mount`
    may be any path on the mount: its mount point is found."""
    root = mount_of(mount)
    return json.loads(os.getxattr(root, XATTR_STATS))


def daemon_pid(mount):
    """The process id of the daemon serving the tierfs mount holding
    `mount`, or None if it cannot be found (not root, daemon gone).

    The daemon holds BACKING/.tierfs.lock open and writes "PID MOUNTPOINT"
    into it: processes holding such a file are matched against the mount
    point."""
    return _find_daemon(os.path.realpath(mount_of(mount)))


def _find_daemon(mnt):
    found = _open_daemon(mnt)
    if found is None:
        return None
    found[1].close()
    return found[0]


def _open_daemon(mnt):
    """(pid, file) of the daemon serving mount point `mnt` (resolved), the
    file its lock file opened for reading (kept readable after the daemon
    has exited: _daemon_end reads how it ended); None if not found."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        d = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(d)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{d}/{fd}")
            except OSError:
                continue
            # an exiting daemon keeps its lock file's descriptor, unlinked,
            # until the process has ended (fs_start.c fs_unlock_backing)
            if not target.endswith(("/" + LOCK_NAME, "/" + LOCK_NAME + " (deleted)")):
                continue
            try:
                f = open(f"{d}/{fd}", "rb")     # the daemon's own open file
            except OSError:
                continue
            try:
                first = f.read(8192).decode("utf-8", "surrogateescape").split("\n", 1)[0]
            except OSError:
                f.close()
                continue
            who, _, where = first.strip().partition(" ")
            # the daemon wrote its mount point resolved; never resolve it
            # here: another mount may hang (a stuck daemon) and stat with it
            if who == pid and where == mnt:
                return int(pid), f
            f.close()
    return None


def _wait_pid(pid, timeout):
    """Wait for process `pid` (not our child) to end: True if it did."""
    import select
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _daemon_end(f):
    """How the daemon whose lock file `f` is (see _open_daemon) ended,
    read once it has: None if it cannot be told (a daemon older than this
    record), else (status, lost, names): its exit status (None: it ended
    without saying, killed), how many files it gave up and the paths of the
    first of them, relative to the mount point."""
    lines = os.pread(f.fileno(), 8192, 0).decode("utf-8", "surrogateescape").split("\n")
    if len(lines) < 2 or not (lines[1] == "running" or lines[1].startswith("exit ")):
        return None                     # an older daemon: "PID MOUNTPOINT" alone
    if lines[1] == "running":
        return None, 0, []
    try:
        status = int(lines[1][5:])
        lost = int(lines[2][5:]) if lines[2].startswith("lost ") else 0
    except (ValueError, IndexError):
        return None, 0, []
    names = lines[3:]
    if _unpersisted_line(lines):
        names = names[:-2]              # the last line, and the "" after it
    return status, lost, [n for n in names[:lost] if n]


def _unpersisted_line(lines):
    """The "unpersisted M DIR" line that ends an exit record, or None."""
    if len(lines) >= 5 and lines[-1] == "" and lines[-2].startswith("unpersisted ") \
            and lines[1].startswith("exit "):
        return lines[-2]
    return None


def _daemon_unpersisted(f):
    """(M, DIR) of the daemon whose lock file `f` is, once it has ended:
    the operations that did not reach -o persist's DIR (its journal keeps
    them for the next mount, or copies it gave up).  (0, None) without
    DIR, or where the record does not say (a daemon older than it)."""
    lines = os.pread(f.fileno(), 8192, 0).decode("utf-8", "surrogateescape").split("\n")
    line = _unpersisted_line(lines)
    if not line:
        return 0, None
    _, n, pdir = (line.split(" ", 2) + ["-"])[:3]
    try:
        return int(n), (None if pdir == "-" else pdir)
    except ValueError:
        return 0, None


def _lost_error(what, end, rel=None):
    """An OSError EIO saying what the daemon's end `end` (_daemon_end)
    lost, or None if it lost nothing (of file `rel`, relative to the mount
    point, when given)."""
    if end is None:
        return None
    status, lost, names = end
    if status is None:
        return OSError(errno.EIO, f"{what}: its daemon was killed before it had "
                       f"written everything (see its log)")
    if rel is not None and lost and rel not in names and len(names) == lost:
        return None                     # others were lost, not this one
    if lost:
        more = f" and {lost - len(names)} more" if lost > len(names) else ""
        return OSError(errno.EIO, f"{what}: {lost} file(s) not written to the backing "
                       f"directory: {', '.join(names)}{more}")
    if status:
        return OSError(errno.EIO, f"{what}: its daemon exited with status {status} "
                       f"(see its log)")
    return None


def _file_flushed(path):
    st = state(path)
    ssd = st.get("ssd")
    dirty = ("INIT", "WRITE_IN_PROGRESS", "WRITE_COMPLETE")
    return ssd == "CURRENT" and not any(s in dirty for s in st.values())


def _mount_flushed(root):
    st = json.loads(os.getxattr(root, XATTR_STATS))
    s = st.get("ssd", {})
    # flush_queued: a queued flush may have no bytes in the backlog (a file
    # truncated to 0, a journal record's apply); closes_pending: files
    # closed whose release (sent after close returns) is not over, which
    # may queue their flush yet
    return s.get("flush_backlog") == 0 and not s.get("flushes_running") and \
        not s.get("flush_queued") and not st.get("closes_pending")


def _ask_flush(path):
    """Ask for the flush of what waits for its age (-o flush_age): asked
    again at each look, for what was closed meanwhile.  Older daemons
    refuse it (EINVAL), and it needs write permission (EACCES): the wait
    is then one age longer."""
    try:
        os.setxattr(path, XATTR_FLUSH, b"")
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EPERM,
                           errno.EACCES, errno.EROFS):
            raise


def wait_flushed(path_or_mount, timeout=None, interval=0.05):
    """Wait until what was written is on the SSD.

    For a regular file: until its SSD copy is current (state ssd:CURRENT).
    For a directory (the mount point or any directory of the mount): until
    the whole mount's flush backlog is empty, no flush is running, and the
    releases of the files closed before the call are over (the kernel sends
    them after close returns: "closes_pending" in the statistics).
    Small files closed moments ago are flushed now, not after their age
    (-o flush_age).  Returns True; raises TimeoutError after `timeout`
    seconds (None: wait for ever).  A file written again meanwhile is
    waited for again.

    A mount unmounted while it waits is followed to its daemon's end (where
    its lock file can be read: root or the daemon's user): OSError EIO if
    the daemon gave data up (the file, or for a directory any file; the
    message names them) or was killed, True if it wrote everything."""
    st = os.stat(path_or_mount)
    root = mount_of(path_or_mount)
    if _stat.S_ISREG(st.st_mode):
        target = path_or_mount
        done = lambda: _file_flushed(path_or_mount)     # noqa: E731
        rel = os.path.relpath(os.path.realpath(path_or_mount), os.path.realpath(root))
    else:
        target = root
        done = lambda: _mount_flushed(root)             # noqa: E731
        rel = None
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = min(interval, 0.005)
    while True:
        try:
            _ask_flush(target)
            if done():
                return True
        except OSError:
            if not _unmounted(root):
                raise
            return _follow_exit(path_or_mount, os.path.realpath(root), rel, deadline)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(errno.ETIMEDOUT,
                               f"{path_or_mount}: not flushed after {timeout} s")
        time.sleep(pause)
        pause = min(pause * 2, interval)


def _unmounted(root):
    try:
        return mount_of(root) != root
    except OSError:
        return True


def _follow_exit(what, mnt, rel, deadline):
    """The mount `mnt` is gone: wait for its daemon's end and say what it
    lost (wait_flushed).  Without a daemon to follow, NotTierfsError."""
    found = _open_daemon(mnt)
    if found is None:
        raise NotTierfsError(errno.ENOTCONN, f"{what}: unmounted while waiting, and its "
                             f"daemon cannot be followed to its end")
    pid, f = found
    with f:
        left = None if deadline is None else max(deadline - time.monotonic(), 0)
        if not _wait_pid(pid, left):
            raise TimeoutError(errno.ETIMEDOUT, f"{what}: still flushing at its unmount")
        e = _lost_error(what, _daemon_end(f), rel)
    if e:
        raise e
    return True


def evict(path, wait=True, timeout=None):
    """Drop the cached copies of file `path` (GPU and host caches); the
    file stays on the SSD and reads come from there until it is cached
    again.

    With wait=True (the default) first waits until the file is flushed
    (wait_flushed, with `timeout`): a copy that is not on the SSD yet is
    never dropped.  A copy in use (being read, or prefetched for the
    restore queue and not read yet) stays: OSError EBUSY."""
    _need_tierfs(path)
    if wait:
        wait_flushed(path, timeout=timeout)
    os.setxattr(path, XATTR_EVICT, b"")


def persist(path, on=None):
    """Mark file or directory `path` persistent (on=True: copied to the
    mount's -o persist=DIR after its SSD flush; a directory's mark covers
    what is created under it) or not (on=False).  Returns the mark in
    effect (True or False) after the change, or now when on is None.
    OSError ENOTSUP where the mount has no persist=DIR."""
    _need_tierfs(path)
    if on is not None:
        os.setxattr(path, XATTR_PERSIST, b"1" if on else b"0")
    return os.getxattr(path, XATTR_PERSIST).strip() == b"1"


def persist_sync(path):
    """Return once file `path` is complete in the mount's persist=DIR (its
    current content flushed and copied there), or raise the OSError DIR
    gave (ENOSPC, EROFS, EIO, ...)."""
    _need_tierfs(path)
    os.setxattr(path, XATTR_PERSIST, b"sync")


# ---- checkpoint sets (tierfs-hints(7), CHECKPOINT SETS) -------------------

def commit(path):
    """Commit directory `path` as a checkpoint set: every regular file in it
    is written and closed; tierfs records them and flushes them now.
    OSError EBUSY while a file in it is open for writing (the daemon's log
    names it); EINVAL for a directory without files."""
    _need_tierfs(path)
    os.setxattr(path, XATTR_COMMIT, b"")


def _parse_state(text):
    out = {"files_not_done": []}
    for line in text.splitlines():
        key, _, val = line.partition(" ")
        if key == "committed":
            out["committed"] = float(val)
        elif key in ("files", "bytes", "more"):
            out[key] = int(val)
        elif key in LEVELS:
            word, _, rest = val.partition(" ")
            out[key] = word
            if word == "complete" and rest:
                out[key + "_at"] = float(rest)
            elif word in ("pending", "incomplete"):
                out[key + "_files"] = int(rest or 0)
        elif key == "level":
            out["level"] = None if val == "none" else val
        elif key == "file":
            parts = val.split(" ")
            # "file NAME WHAT [DETAIL...]": WHAT is the first word that
            # is one of the known ones, from the right end of the name
            for i in range(len(parts) - 1, 0, -1):
                if parts[i] in _FILE_WHATS:
                    out["files_not_done"].append((" ".join(parts[:i]), " ".join(parts[i:])))
                    break
    return out


_FILE_WHATS = ("missing", "changed", "open-for-writing", "flush-failed", "persist-failed",
               "some-files-not-persistent", "only-in-pfs", "missing-in-pfs", "record-pending")


def set_state(path):
    """The state of checkpoint set `path` (user.tierfs.set) as a dict:
    committed (seconds since the epoch), files, bytes; for each level of
    LEVELS its word ("complete", "pending", "incomplete" or "off"), with
    LEVEL_at (when it was recorded complete) or LEVEL_files (how many files
    are not there); level (the last complete level, or None);
    files_not_done: [(name, what)] for files that keep a level from being
    complete ("flush-failed ENOSPC", "missing", "changed ...",
    "open-for-writing", "persist-failed").  None if `path` is not a
    committed set."""
    _need_tierfs(path)
    try:
        text = os.getxattr(path, XATTR_SET).decode("utf-8", "surrogateescape")
    except OSError as e:
        if e.errno == errno.ENODATA:
            return None
        raise
    return _parse_state(text)


def sets(parent):
    """The committed sets directly under directory `parent`, oldest first:
    [(path, state)] with state as set_state gives it."""
    _need_tierfs(parent)
    out = []
    with os.scandir(parent) as it:
        for e in it:
            if not e.is_dir(follow_symlinks=False):
                continue
            try:
                st = set_state(e.path)
            except OSError:
                continue                # removed meanwhile
            if st is not None:
                out.append((e.path, st))
    out.sort(key=lambda x: (x[1]["committed"], x[0]))
    return out


def latest(parent, level="ssd"):
    """The path of the newest set under `parent` complete at `level` (one
    of LEVELS): the restart target; None if there is none."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}")
    done = [p for p, st in sets(parent) if st.get(level) == "complete"]
    return done[-1] if done else None


def _set_lost(st, level):
    """The files of set state `st` that will not reach `level` by
    themselves (missing, changed, persist-failed), or []."""
    bad = ("missing", "changed", "persist-failed", "missing-in-pfs") if level == "pfs" else \
        ("missing", "changed", "persist-failed") if level == "ssd" else ("missing", "changed")
    return [(n, w) for n, w in st["files_not_done"] if w.split(" ")[0] in bad]


def wait_set(path, level="ssd", timeout=None, interval=0.05):
    """Wait until checkpoint set `path` is complete at `level` (one of
    LEVELS).  Returns its state.  OSError EIO when a file of it is lost
    (missing, changed since the commit, failed to reach DIR; the message
    names them) or the daemon gave data up while the mount went away;
    TimeoutError after `timeout` seconds (the message names files whose
    flush fails: those are retried, e.g. until space is freed); OSError
    ENODATA if `path` is not a committed set; EINVAL for pfs where the set
    does not go to DIR ("off")."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}")
    root = mount_of(path)
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = min(interval, 0.005)
    while True:
        try:
            st = set_state(path)
        except OSError:
            if not _unmounted(root):
                raise
            return _follow_exit(path, os.path.realpath(root), None, deadline)
        if st is None:
            raise OSError(errno.ENODATA, f"{path}: not a committed checkpoint set")
        if st.get(level) == "complete":
            return st
        if st.get(level) == "off":
            raise OSError(errno.EINVAL, f"{path}: its files do not go to a persistent "
                          f"tier (-o persist=DIR, user.tierfs.persist)")
        lost = _set_lost(st, level)
        if lost:
            raise OSError(errno.EIO, f"{path}: not complete at {level}: " +
                          ", ".join(f"{n} ({w})" for n, w in lost))
        if deadline is not None and time.monotonic() >= deadline:
            why = [f"{n} ({w})" for n, w in st["files_not_done"]]
            raise TimeoutError(errno.ETIMEDOUT, f"{path}: not complete at {level} after "
                               f"{timeout} s" + (": " + ", ".join(why) if why else ""))
        time.sleep(pause)
        pause = min(pause * 2, interval)


def keep(parent, n=None):
    """Keep the `n` newest sets complete at ssd under directory `parent` on
    the SSD (0: all), older complete ones are removed from the caches and
    the backing directory (see tierfs-hints(7)).  Returns the number in
    effect (n None: only read it; -o keep_sets where none was set)."""
    _need_tierfs(parent)
    if n is not None:
        if int(n) < 0:
            raise ValueError("keep: a number of sets, 0 or more")
        os.setxattr(parent, XATTR_KEEP, str(int(n)).encode())
    return int(os.getxattr(parent, XATTR_KEEP))


# ---- GPU memory through the ioctl (libtierfs, tierfs-gpu(7)) -------------

_lib = None


def _libtierfs():
    """libtierfs (the GPU ioctl's C library): $TIERFS_LIB, else the system's."""
    global _lib
    if _lib is None:
        import ctypes
        import ctypes.util
        tried = []
        for name in (os.environ.get("TIERFS_LIB"), ctypes.util.find_library("tierfs"),
                     "libtierfs.so.0"):
            if not name:
                continue
            try:
                lib = ctypes.CDLL(name, use_errno=True)
            except OSError as e:
                tried.append(f"{name}: {e}")
                continue
            for fn in (lib.tierfs_pwrite_gpu, lib.tierfs_pread_gpu):
                fn.restype = ctypes.c_ssize_t
                fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                               ctypes.c_longlong]
            for name in ("tierfs_pwritev_gpu", "tierfs_preadv_gpu"):
                fn = getattr(lib, name, None)   # an older library lacks them
                if fn is not None:
                    fn.restype = ctypes.c_ssize_t
                    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
            _lib = lib
            break
        if _lib is None:
            raise TierfsError("libtierfs not found (set TIERFS_LIB): " + "; ".join(tried))
    return _lib


def _gpu_io(write, fd, ptr, nbytes, offset):
    import ctypes
    lib = _libtierfs()
    fn = lib.tierfs_pwrite_gpu if write else lib.tierfs_pread_gpu
    done = 0
    while done < nbytes:
        r = fn(fd, ptr + done, nbytes - done, offset + done)
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        if r == 0:
            break               # a read at end of file
        done += r
    return done


def pwrite_gpu(fd, ptr, nbytes, offset=0):
    """Write nbytes of GPU memory at device address ptr to fd at offset,
    device to device where the file is in the GPU cache.  Returns nbytes."""
    return _gpu_io(True, fd, ptr, nbytes, offset)


def pread_gpu(fd, ptr, nbytes, offset=0):
    """Read up to nbytes of fd at offset into GPU memory at ptr.  Returns the
    bytes read (fewer at end of file)."""
    return _gpu_io(False, fd, ptr, nbytes, offset)


_IOV = struct.Struct("=QQq")       # struct tierfs_gpu_iovec: dev_ptr, len, off


def _pack_iov(segments):
    """A list of (device_ptr, nbytes, file_offset) as an array of struct
    tierfs_gpu_iovec (a bytearray).  OSError EINVAL for a value out of range,
    as the library says for its own checks."""
    segs = segments if isinstance(segments, list) else list(segments)
    buf = bytearray(_IOV.size * max(len(segs), 1))
    pack = _IOV.pack_into
    i = 0
    try:
        for i, (ptr, nbytes, offset) in enumerate(segs):
            pack(buf, i * _IOV.size, ptr, nbytes, offset)
    except struct.error:
        raise OSError(errno.EINVAL, f"segment {i}: {os.strerror(errno.EINVAL)}") from None
    return buf, len(segs)


def _gpu_iov_packed(write, fd, buf, n):
    """tierfs_pwritev_gpu / preadv_gpu of n segments packed by _pack_iov."""
    import ctypes

    lib = _libtierfs()
    name = "tierfs_pwritev_gpu" if write else "tierfs_preadv_gpu"
    fn = getattr(lib, name, None)
    if fn is None:
        raise TierfsError(f"libtierfs has no {name} (too old)")
    r = fn(fd, (ctypes.c_char * len(buf)).from_buffer(buf), n)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def _gpu_iov(write, fd, segments):
    buf, n = _pack_iov(segments)
    return _gpu_iov_packed(write, fd, buf, n)


def pwritev_gpu(fd, segments):
    """Write a list of GPU buffers to fd in one call: segments is a sequence
    of (device_ptr, nbytes, file_offset) tuples, file ranges not overlapping,
    in any order.  Every segment is checked before any byte moves.  Returns
    the total bytes; raises OSError (EINVAL: a bad segment, an overlap, an
    empty or too long list; see tierfs-gpu(7))."""
    return _gpu_iov(True, fd, segments)


def preadv_gpu(fd, segments):
    """Read file ranges of fd into GPU buffers in one call: segments as for
    pwritev_gpu (ranges may overlap).  Returns the total bytes read (less
    than asked only where segments reach past end of file)."""
    return _gpu_iov(False, fd, segments)


def _tensor_span(t):
    if not getattr(t, "is_cuda", False) or not t.is_contiguous():
        raise ValueError("a contiguous CUDA tensor is needed")
    return t.data_ptr(), t.numel() * t.element_size()


def save_gpu(path, tensor):
    """Write the bytes of a contiguous CUDA tensor (PyTorch, or anything with
    data_ptr/numel/element_size/is_cuda/is_contiguous) to a new file `path`
    through the ioctl: no copy through host memory.  The tensor's producers
    are synchronised first (torch.cuda.synchronize)."""
    ptr, n = _tensor_span(tensor)
    _sync(tensor)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        pwrite_gpu(fd, ptr, n)
    finally:
        os.close(fd)


def load_gpu(path, tensor):
    """Fill a contiguous CUDA tensor from file `path` (written by save_gpu:
    the same number of bytes) through the ioctl.  Returns the tensor."""
    ptr, n = _tensor_span(tensor)
    _sync(tensor)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size != n:
            raise ValueError(f"{path}: {size} bytes, the tensor has {n}")
        if pread_gpu(fd, ptr, n) != n:
            raise OSError(errno.EIO, f"{path}: short read")
    finally:
        os.close(fd)
    return tensor


def _sync(tensor):
    mod = type(tensor).__module__
    if mod.startswith("torch"):
        import torch
        torch.cuda.synchronize(tensor.device)
