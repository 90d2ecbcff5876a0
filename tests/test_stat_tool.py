"""tools/tierfs-stat against a real tierfs mount.

The tool is run with the interpreter running pytest (it needs only the
standard library); its numbers are checked against the user.tierfs.stats
attribute read around it.
"""

import json
import os
import re
import select
import signal
import subprocess
import sys

import pytest

import util
from util import MiB, randbytes, sha, write_file

TOOL = os.path.join(util.REPO_DIR, "tools", "tierfs-stat")
STATS = "user.tierfs.stats"

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def run_tool(*args, timeout=30):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True,
                          text=True, timeout=timeout)


def stats_of(m):
    return json.loads(os.getxattr(m.mnt, STATS))


def drop_page_cache(path):
    """Make the next read of `path` reach the daemon (the kernel keeps pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def wait_touched(m, timeout=60):
    """Wait until the host cache is faulted in (the background toucher
    changes host_touched while it runs) and, with a GPU tier, pinned
    (tiers/host.c pins it once touched: "pinned" changes then)."""
    def touched():
        s = stats_of(m)
        return (s.get("host_touched", 0) >= s["tiers"]["host"]["capacity"] and
                ("gpu" not in s["tiers"] or s["tiers"]["host"].get("pinned")))
    util.wait_until(touched, lambda: f"the host cache touched: {stats_of(m)}", timeout, 0.02)


def parse_size(text):
    """'1.5 MiB' -> (1572864.0, unit bytes)."""
    m = re.fullmatch(r"(-?[0-9.]+) (B|KiB|MiB|GiB|TiB)", text.strip())
    assert m, f"not a human size: {text!r}"
    unit = UNITS[m.group(2)]
    return float(m.group(1)) * unit, unit


def assert_size(text, want, what):
    got, unit = parse_size(text)
    # one decimal of the unit shown; the unit must be the natural one
    assert abs(got - want) <= 0.051 * unit, f"{what}: tool says {text!r}, stats say {want}"
    if want >= 1024:
        assert unit <= want < unit * 1024, f"{what}: {text!r} is not in the natural unit"


SIZE = r"(?:[0-9.]+ (?:B|KiB|MiB|GiB|TiB)|-)"
ROW = re.compile(rf"^(?P<tier>\S+)\s+(?P<capacity>{SIZE})\s+(?P<used>{SIZE})\s+"
                 r"(?P<usedpct>[0-9.]+%|-)\s+(?P<frags>\d+|-)\s+(?P<gaps>\d+|-)\s+"
                 r"(?P<hits>\d+|-)\s+(?P<late>\d+|-)\s+(?P<misses>\d+|-)\s+"
                 r"(?P<hitpct>[0-9.]+%|-)\s+"
                 r"(?P<evictions>\d+|-)\s+(?P<policy>\S+)(?:\s+(?P<notes>.*))?$")


def tier_rows(out):
    rows = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m and m.group("tier") != "tier":
            rows[m.group("tier")] = m.groupdict()
    return rows


def line_starting(out, word):
    lines = [ln for ln in out.splitlines() if ln.split()[:1] == [word]]
    assert len(lines) == 1, f"expected one {word!r} line in:\n{out}"
    return lines[0]


# ---------------------------------------------------------------- tests

def test_tool_is_an_executable_python3_script():
    with open(TOOL, "rb") as f:
        assert f.readline() == b"#!/usr/bin/env python3\n"
    assert os.access(TOOL, os.X_OK)


@pytest.mark.daemon
def test_table_after_write(tfs):
    path = os.path.join(tfs.mnt, "f")
    data = randbytes(2 * MiB)
    write_file(path, data)
    util.wait_flushed(tfs)
    wait_touched(tfs)
    drop_page_cache(path)
    with open(path, "rb") as f:
        assert sha(f.read()) == sha(data)
    before = stats_of(tfs)
    r = run_tool(tfs.mnt)
    after = stats_of(tfs)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert before == after, "mount not idle while the tool ran"
    st = after
    out = r.stdout
    assert out.startswith(f"tierfs {tfs.mnt}\n")

    rows = tier_rows(out)
    assert list(rows) == list(st["tiers"]), f"tier rows {list(rows)} in:\n{out}"
    assert "host" in rows
    total_reads = sum(t["hits"] + t["late"] + t["misses"] for t in st["tiers"].values())
    assert total_reads >= 1, "the read of f never reached the daemon"
    for name, row in rows.items():
        t = st["tiers"][name]
        assert_size(row["capacity"], t["capacity"], f"{name} capacity")
        assert_size(row["used"], t["used"], f"{name} used")
        assert float(row["usedpct"][:-1]) == pytest.approx(100 * t["used"] / t["capacity"],
                                                           abs=0.051)
        for k in ("fragments", "gaps", "hits", "late", "misses", "evictions"):
            col = {"fragments": "frags"}.get(k, k)
            assert int(row[col]) == t[k], f"{name} {k}: {row[col]} vs {t[k]}"
        assert float(row["hitpct"][:-1]) == pytest.approx(100 * t["hits"] / total_reads,
                                                          abs=0.051)
        assert row["policy"] == t["policy"]
        if name == "gpu":
            assert "mapped " in (row["notes"] or "")
        if name == "host" and "pinned" in t:
            assert "pinned" in (row["notes"] or "")

    host = rows["host"]
    assert host["capacity"] == "64.0 MiB"                  # default test host_cache
    assert st["tiers"]["host"]["used"] >= 2 * MiB            # f is cached
    assert int(host["frags"]) >= 1

    ssd = line_starting(out, "ssd")
    s = st["ssd"]
    m = re.search(rf"flushed ({SIZE}) \((\d+) files\)", ssd)
    assert m, ssd
    assert s["bytes_flushed"] >= 2 * MiB and s["files_flushed"] >= 1
    assert_size(m.group(1), s["bytes_flushed"], "bytes flushed")
    assert int(m.group(2)) == s["files_flushed"]
    assert re.search(r"backlog 0 B\b", ssd), ssd
    assert re.search(r"running 0\b", ssd), ssd
    # where the flushes spent their time (stats' ssd.seconds)
    m = re.search(r"time ([\d.]+) s \(sync (\d+)%, clone (\d+)%, commit (\d+)%\)", ssd)
    assert m, ssd
    assert abs(float(m.group(1)) - s["seconds"]["total"]) < 0.01
    assert int(m.group(2)) + int(m.group(3)) + int(m.group(4)) <= 101
    m = re.search(rf"bandwidth ({SIZE})/s", ssd)
    assert m, ssd
    assert_size(m.group(1), s["flush_bandwidth"], "flush bandwidth")
    assert re.search(rf"errors {s['flush_errors']}\b", ssd), ssd
    assert re.search(rf"written-through {SIZE} \({s['files_written_through']} files\)", ssd), ssd
    line_starting(out, "prefetch")


@pytest.mark.daemon
def test_prefetch_line(tfs):
    """The daemon reports "prefetch" (restore-hint protocol); the tool shows it."""
    st = stats_of(tfs)
    assert "prefetch" in st, f"daemon stats have no prefetch section: {sorted(st)}"
    r = run_tool(tfs.mnt)
    assert r.returncode == 0, r.stderr
    line = line_starting(r.stdout, "prefetch")
    p = st["prefetch"]
    assert f"state {p['state']}," in line, line
    assert p["state"] == "start"                            # the default at mount
    assert re.search(rf"queue {p['queue']}\b", line), line
    assert re.search(rf"prefetched {p['files_prefetched']} files / {SIZE}", line), line
    assert re.search(rf"distance {p['distance']}\b", line), line

    # with hints queued (for files not written yet) and prefetching held
    os.setxattr(tfs.mnt, "user.tierfs.restore_order", b"x\ny\n")
    os.setxattr(tfs.mnt, "user.tierfs.prefetch", b"stop")
    r = run_tool(tfs.mnt)
    assert r.returncode == 0, r.stderr
    line = line_starting(r.stdout, "prefetch")
    assert "state stop," in line and re.search(r"queue 2\b", line), line


@pytest.mark.daemon
def test_json(tfs):
    write_file(os.path.join(tfs.mnt, "g"), randbytes(MiB))
    util.wait_flushed(tfs)
    r = run_tool(tfs.mnt, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert "host" in got["tiers"]
    assert got["ssd"]["files_flushed"] >= 1
    assert "\n  " in r.stdout, "JSON not pretty-printed"
    assert set(got) == set(stats_of(tfs))


@pytest.mark.daemon
def test_watch_redraws_until_interrupted(tfs):
    # it is sent SIGINT: whatever this process ignores, the tool must not
    p = util.popen_with_default_signals([sys.executable, TOOL, tfs.mnt, "--watch", "0.1"],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    raw = b""

    def three_frames():
        nonlocal raw
        ready, _, _ = select.select([p.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(p.stdout.fileno(), 65536)
            assert chunk, f"tool exited: {raw!r} {p.stderr.read()!r}"
            raw += chunk
        return raw.count(b"\x1b[2J") >= 3

    try:
        # wait for at least three frames, judged by the output, not by time
        util.wait_until(three_frames, lambda: f"three redraws: {raw!r}", 20, 0)
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=10)
        raw += rest
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    buf, err = raw.decode(), err.decode()
    assert p.returncode == 0, err
    frames = [f for f in buf.split("\x1b[H\x1b[2J") if f]
    assert len(frames) >= 3
    for f in frames[:-1]:
        assert "host" in tier_rows(f), f
        assert f.splitlines()[0].startswith(f"tierfs {tfs.mnt}")
    assert "Traceback" not in err


def test_plain_directory(tmp_path):
    d = tmp_path / "plain"
    d.mkdir()
    r = run_tool(str(d))
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.splitlines()[0] == f"tierfs-stat: {d} is not a tierfs mount"


def test_missing_path(tmp_path):
    d = tmp_path / "nothing-here"
    r = run_tool(str(d))
    assert r.returncode == 1
    assert r.stdout == ""
    assert str(d) in r.stderr and "No such file or directory" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.daemon
def test_directory_inside_mount(tfs):
    """Any path on the mount gives the mount's statistics (as
    tierfs.stats() and tierfs_stats() do)."""
    sub = os.path.join(tfs.mnt, "sub")
    os.mkdir(sub)
    r = run_tool(sub, "--json")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)) == set(stats_of(tfs))


def test_bad_watch_interval(tmp_path):
    r = run_tool(str(tmp_path), "--watch", "0")
    assert r.returncode == 2 and "positive" in r.stderr


def load_tool():
    """The script as a module (it has no .py suffix), compiled without
    writing tools/__pycache__ into the source tree."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("tierfs_stat", TOOL)
    spec = importlib.util.spec_from_loader("tierfs_stat", loader)
    mod = importlib.util.module_from_spec(spec)
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = saved
    return mod


def test_render_tolerates_missing_and_unknown_keys():
    """Older or newer daemons: missing keys show as "-", unknown ones are ignored."""
    ts = load_tool()
    full = {
        "tiers": {
            "gpu": {"capacity": 1 << 30, "usable": 1 << 29, "used": 3 << 20,
                    "fragments": 3, "gaps": 1, "hits": 30, "misses": 10,
                    "evictions": 2, "evicted_bytes": 1 << 20, "policy": "score",
                    "mapped": 1 << 29},
            "host": {"capacity": 64 << 20, "usable": 64 << 20, "used": 1536,
                     "fragments": 1, "gaps": 1, "hits": 60, "misses": 0,
                     "evictions": 0, "evicted_bytes": 0, "policy": "lru",
                     "pinned": 64 << 20, "future_key": [1, 2]},
        },
        "host_touched": 32 << 20,
        "ssd": {"bytes_flushed": 5 << 30, "files_flushed": 7, "flush_errors": 1,
                "flush_backlog": 1536, "flushes_running": 2,
                "flush_bandwidth": 2.5 * (1 << 30), "bytes_written_through": 0,
                "files_written_through": 0},
        "prefetch": {"state": "stop", "queue": 12, "files_prefetched": 3,
                     "bytes_prefetched": 3 << 20, "distance": 4, "consumed": 5},
        "something_new": {"x": 1},
    }
    out = ts.render("/m", full)
    rows = tier_rows(out)
    assert list(rows) == ["gpu", "host"]
    g, h = rows["gpu"], rows["host"]
    assert (g["capacity"], g["used"], g["usedpct"]) == ("1.0 GiB", "3.0 MiB", "0.3%")
    assert g["hitpct"] == "30.0%" and h["hitpct"] == "60.0%"      # of 100 reads
    assert "mapped 512.0 MiB" in g["notes"] and "usable 512.0 MiB" in g["notes"]
    assert "pinned 64.0 MiB" in h["notes"] and "touched 50.0%" in h["notes"]
    assert (h["used"], h["policy"]) == ("1.5 KiB", "lru")
    ssd = line_starting(out, "ssd")
    for part in ("flushed 5.0 GiB (7 files)", "backlog 1.5 KiB", "running 2",
                 "bandwidth 2.5 GiB/s", "errors 1", "written-through 0 B (0 files)"):
        assert part in ssd, ssd
    assert line_starting(out, "prefetch") == (
        "prefetch  state stop, queue 12, prefetched 3 files / 3.0 MiB, distance 4, "
        "consumed 5")
    assert "100 requests, 90.0% from a cache tier" in line_starting(out, "reads")

    # GPU-tier keys: cascade to the host, queued evictions, host -> GPU promotions
    full["tiers"]["gpu"].update({"bytes_to_host": 3 << 30, "to_host_bandwidth": 50 << 30,
                                 "evicted_queued": 4})
    full["prefetch"].update({"files_to_gpu": 2, "bytes_to_gpu": 2 << 20})
    out = ts.render("/m", full)
    g = tier_rows(out)["gpu"]
    assert "to host 3.0 GiB at 50.0 GiB/s" in g["notes"], g["notes"]
    assert "4 evicted while queued" in g["notes"], g["notes"]
    assert "to the GPU 2 files / 2.0 MiB" in line_starting(out, "prefetch")

    # an old daemon: no prefetch section, tiers with few keys, odd values
    old = {"tiers": {"host": {"capacity": 1 << 20, "hits": "many"}},
           "ssd": {"bytes_flushed": 10}}
    out = ts.render("/m", old)
    h = tier_rows(out)["host"]
    assert h["capacity"] == "1.0 MiB" and h["used"] == "-" and h["hits"] == "-"
    assert line_starting(out, "prefetch") == "prefetch  -"
    assert "flushed 10 B (- files)" in line_starting(out, "ssd")
    out = ts.render("/m", {})
    assert "(no cache tiers reported)" in out
    assert line_starting(out, "ssd") == "ssd       -"


def test_gpus_line(mount, monkeypatch):
    """A mount over several GPUs (-o gpu=0:1; the fake libcuda's devices where
    there are no GPUs): `tierfs-stat` shows each GPU's part of the cache and
    how much of it holds data; a one-GPU layout has no such line."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    m = mount(gpu=gpus, gpu_cache="32M", host_cache="64M")
    util.wait_until(lambda: '"fully_mapped":true' in os.getxattr(m.mnt, "user.tierfs.stats").decode(),
                    "the GPU caches mapped")
    first, second = gpus.split(":")
    with open(os.path.join(m.mnt, "a"), "wb") as f:             # GPU 0's, the default
        f.truncate(20 * MiB)                                    # one copy of its size
        f.write(randbytes(20 * MiB))
    with open(os.path.join(m.mnt, "b"), "wb") as f:             # named for the second
        os.setxattr(f.name, "user.tierfs.restore_device", second.encode())
        f.truncate(12 * MiB)
        f.write(randbytes(12 * MiB))
    r = run_tool(m.mnt)
    assert r.returncode == 0, r.stderr
    line = line_starting(r.stdout, "gpus")
    assert re.search(rf"GPU {first}: 20\.0 MiB of 32\.0 MiB \(62\.5%\), "
                     rf"GPU {second}: 12\.0 MiB of 32\.0 MiB \(37\.5%\)", line), line
    line = line_starting(r.stdout, "balance")
    assert re.search(r"balance   maxflow: 2 in their GPU, 0 to peers \(0 across two GPUs, "
                     r"0 B on the peer\), 0 to host memory \(0 B\)", line), line
    ts = load_tool()
    out = ts.render("/m", {"tiers": {"gpu": {"capacity": 1}}})
    assert "gpus" not in out and "balance" not in out
