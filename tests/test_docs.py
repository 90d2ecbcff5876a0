"""Documentation against the program: the README's option list is
`tierfs --help`'s, section names cited from tools/ and the README exist in
the man pages, and what the daemon and the tools say matches what they do
(the mount point's errors, the syslog warning, statistics of any path on
a mount, in Python, tierfsctl and libtierfs)."""

import ctypes
import errno
import glob
import json
import os
import re
import subprocess
import sys

import pytest

import util
from util import write_file

sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
import tierfs  # noqa: E402

TOOL = os.path.join(util.REPO_DIR, "tools", "tierfsctl")


def need_binary():
    if not os.access(util.tierfs_bin(), os.X_OK):
        pytest.skip(f"{util.tierfs_bin()} not built")


# ---------------------------------------------------------------- text only

def test_readme_option_list_is_tierfs_help():
    need_binary()
    r = subprocess.run([util.tierfs_bin(), "--help"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    text = r.stdout + r.stderr
    m = re.search(r"^tierfs options:\n(.*?)\n\n", text, re.S | re.M)
    assert m, text
    helped = m.group(1).splitlines()
    with open(os.path.join(util.REPO_DIR, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    m = re.search(r"`tierfs --help`[^\n]*\n[^\n]*\n\n```\n(.*?)\n```", readme, re.S)
    assert m, "README: no option list after the sentence citing `tierfs --help`"
    listed = m.group(1).splitlines()
    assert listed == helped, "\n".join(
        f"README: {a!r}\nhelp:   {b!r}" for a, b in zip(listed + [""] * len(helped),
                                                      helped + [""] * len(listed))
        if a != b)


# PAGE(N) followed by a section name in capitals: `tierfs(8)` ("MOUNTING AT
# BOOT"), (tierfs-gpu(7), VECTORED CALLS), tierfs(8),\n# MOUNTING AT BOOT
SECTION_REF = re.compile(r"\b(tierfs(?:-hints|-gpu)?|tierfsctl)\\?\(([178])\\?\)`?"
                         r"(?:,\s*#?\s*| \(\"?)\"?([A-Z][A-Z]+(?:\s+[A-Z]+)*)\b")


def man_sections(page, n):
    with open(os.path.join(util.REPO_DIR, "man", f"{page}.{n}"), encoding="utf-8") as f:
        return {line[4:].strip().strip('"') for line in f if line.startswith(".SH ")}


def test_cited_man_sections_exist():
    files = [os.path.join(util.REPO_DIR, "README.md"),
             os.path.join(util.REPO_DIR, "fs", "tierfs.h")]
    # the tools' sources, not what Python compiled of them (__pycache__)
    files += [p for p in glob.glob(os.path.join(util.REPO_DIR, "tools", "**", "*"),
                                   recursive=True)
              if os.path.isfile(p) and "__pycache__" not in p.split(os.sep)]
    files += glob.glob(os.path.join(util.REPO_DIR, "man", "*.[178]"))
    files += glob.glob(os.path.join(util.REPO_DIR, "python", "tierfs", "*.py"))
    cited, bad = 0, []
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for m in SECTION_REF.finditer(text):
            page, n, section = m.group(1), m.group(2), re.sub(r"\s+#?\s*", " ", m.group(3))
            cited += 1
            if section not in man_sections(page, n):
                bad.append(f"{os.path.relpath(path, util.REPO_DIR)}: {page}({n}) "
                           f"\"{section}\": no such section")
    assert not bad, "\n".join(bad)
    assert cited >= 3                   # the pattern still finds them


# ---------------------------------------------------------------- the daemon

@pytest.mark.daemon
def test_mount_point_missing_or_not_a_directory(tmp_path):
    need_binary()
    backing = tmp_path / "backing"
    backing.mkdir()
    missing = tmp_path / "nothing-here"
    r = subprocess.run([util.tierfs_bin(), str(backing), str(missing), "-f",
                        "-o", "host_cache=16M,gpu=none"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and not util.is_mounted(str(missing))
    assert f"mount point {missing}: No such file or directory" in r.stderr, r.stderr
    assert "not a directory" not in r.stderr, r.stderr
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    r = subprocess.run([util.tierfs_bin(), str(backing), str(afile), "-f",
                        "-o", "host_cache=16M,gpu=none"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert f"mount point {afile} is not a directory" in r.stderr, r.stderr


SYSLOG_WARNING = "syslog cannot be reached"


@pytest.mark.daemon
def test_syslog_warning_only_where_messages_go_to_syslog(mount, tmp_path):
    """-f (stderr) and -o logfile=PATH do not log to syslog: no warning;
    a daemon in the background without a log file does, and warns where
    /dev/log cannot be reached."""
    need_binary()
    m = mount()                                           # -f
    m.umount()
    assert SYSLOG_WARNING not in m.log(), m.log()

    def background(*opts):
        b, mnt = tmp_path / f"b{len(opts)}", tmp_path / f"m{len(opts)}"
        b.mkdir()
        mnt.mkdir()
        r = subprocess.run([util.tierfs_bin(), str(b), str(mnt), "-o",
                            ",".join(("host_cache=16M", "gpu=none") + opts)],
                           capture_output=True, text=True, timeout=60)
        try:
            assert r.returncode == 0, r.stderr
            assert util.is_mounted(str(mnt))
        finally:
            subprocess.run(util._umount_cmd(str(mnt)), capture_output=True, timeout=60)
            util.wait_until(lambda: not os.path.exists(b / ".tierfs.lock"),
                            "the daemon's exit", timeout=60)
        return r.stderr

    log = tmp_path / "daemon.log"
    err = background(f"logfile={log}")
    assert SYSLOG_WARNING not in err, err
    assert SYSLOG_WARNING not in log.read_text(), log.read_text()
    if not os.path.exists("/dev/log"):
        err = background()
        assert SYSLOG_WARNING in err, err


# ---------------------------------------------------------------- statistics

def libtierfs():
    """libtierfs.so of the build, or None."""
    libs = sorted(glob.glob(os.path.join(os.path.dirname(util.tierfs_bin()), ".libs",
                                         "libtierfs.so*")))
    return libs[0] if libs else None


# In a child python, so that a sanitizer build of the library can have its
# runtime preloaded (a plain python does not have it).  argv: the library,
# then paths; prints one JSON line per path: its keys, or its errno.
C_STATS = r"""
import ctypes, json, os, sys
lib = ctypes.CDLL(sys.argv[1], use_errno=True)
lib.tierfs_stats.restype = ctypes.c_void_p
lib.tierfs_stats.argtypes = [ctypes.c_char_p]
libc = ctypes.CDLL(None)
for path in sys.argv[2:]:
    p = lib.tierfs_stats(os.fsencode(path))
    if not p:
        print(json.dumps({"errno": ctypes.get_errno()}))
        continue
    keys = sorted(json.loads(ctypes.string_at(p).decode()))
    libc.free(ctypes.c_void_p(p))
    print(json.dumps({"keys": keys}))
"""


def c_stats(lib, *paths):
    """tierfs_stats() of each path: [{"keys": [...]} or {"errno": N}]."""
    out = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    pre = [ln.split("=>")[1].split()[0] for ln in out.splitlines()
           if "=>" in ln and ("libasan" in ln or "libubsan" in ln or "libtsan" in ln)]
    env = dict(os.environ)
    if pre:
        env["LD_PRELOAD"] = " ".join(pre)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    r = subprocess.run([sys.executable, "-c", C_STATS, lib, *paths], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return [json.loads(ln) for ln in r.stdout.splitlines()]


@pytest.mark.daemon
def test_stats_of_any_path_on_the_mount(tfs, tmp_path):
    """The mount point, a subdirectory and a file give the mount's
    statistics, in Python, in tierfsctl and in libtierfs alike; another
    file system is refused by all three."""
    sub = os.path.join(tfs.mnt, "sub", "deeper")
    os.makedirs(sub)
    f = os.path.join(sub, "f")
    write_file(f, b"x" * 4096)
    keys = set(json.loads(os.getxattr(tfs.mnt, "user.tierfs.stats")))
    lib = libtierfs()
    paths = (tfs.mnt, os.path.dirname(sub), sub, f)
    for p in paths:
        assert set(tierfs.stats(p)) == keys, p
        r = subprocess.run([sys.executable, TOOL, "stats", "--json", p],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (p, r.stderr)
        assert set(json.loads(r.stdout)) == keys, p
    if lib:
        for p, got in zip(paths, c_stats(lib, *paths)):
            assert set(got.get("keys", ())) == keys, (p, got)
    plain = str(tmp_path)
    with pytest.raises(tierfs.NotTierfsError):
        tierfs.stats(plain)
    r = subprocess.run([sys.executable, TOOL, "stats", plain], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "not a tierfs mount" in r.stderr
    if lib:
        assert c_stats(lib, plain) == [{"errno": errno.ENOTSUP}]
    if not lib:
        pytest.skip("libtierfs.so not built: its part not checked")
