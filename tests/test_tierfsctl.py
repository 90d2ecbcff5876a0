"""tools/tierfsctl against real tierfs mounts.

The tool is run with the interpreter running pytest; it imports the tierfs
package from the source tree (python/).
"""

import json
import os
import re
import subprocess
import sys

import pytest

import util
from util import MiB, randbytes, read_file, write_file

TOOL = os.path.join(util.REPO_DIR, "tools", "tierfsctl")
STAT_TOOL = os.path.join(util.REPO_DIR, "tools", "tierfs-stat")

sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
import tierfs  # noqa: E402


def ctl(*args, timeout=120, tool=TOOL):
    return subprocess.run([sys.executable, tool, *args], capture_output=True,
                          text=True, timeout=timeout)


def ok(*args, **kw):
    r = ctl(*args, **kw)
    assert r.returncode == 0, f"tierfsctl {' '.join(args)}: rc {r.returncode}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    return r


def one_line_error(r, *words):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tierfsctl: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_executable_and_help():
    with open(TOOL, "rb") as f:
        assert f.readline() == b"#!/usr/bin/env python3\n"
    assert os.access(TOOL, os.X_OK)
    r = ok("--help")
    for c in ("order", "next", "prefetch", "info", "wait", "stats", "warmup",
              "record", "plot"):
        assert c in r.stdout
    assert ctl().returncode == 2
    assert ctl("stats", "/", "--watch", "0").returncode == 2


def test_not_tierfs(tmp_path):
    one_line_error(ctl("order", str(tmp_path), "a"), str(tmp_path), "not on a tierfs")
    one_line_error(ctl("info", str(tmp_path / "nothing")), "No such file")
    one_line_error(ctl("stats", str(tmp_path)), "not a tierfs mount")


@pytest.mark.daemon
def test_order_next_prefetch(tfs):
    d = os.path.join(tfs.mnt, "run")
    os.mkdir(d)
    ok("order", d, "c", "b", "a")
    assert ok("order", d).stdout == "c\nb\na\n"
    r = ctl("order", d, "x", "y/z")
    one_line_error(r, "line 2", "y/z")
    assert tierfs.queued(d) == ["c", "b", "a"]                # nothing appended
    names = "".join(f"n{i}\n" for i in range(5))
    r = subprocess.run([sys.executable, TOOL, "order", d, "--clear", "--from", "-"],
                       input=names, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert tierfs.queued(d) == [f"n{i}" for i in range(5)]
    ok("order", d, "--clear")
    assert tierfs.queued(d) == []
    write_file(os.path.join(d, "f"), b"data")
    ok("next", os.path.join(d, "f"))
    assert tierfs.queued(d) == ["f"]
    assert ok("prefetch", "status", d).stdout == "start\n"
    ok("prefetch", "stop", d)
    assert ok("prefetch", "status", tfs.mnt).stdout == "stop\n"
    ok("prefetch", "start", tfs.mnt)
    assert tierfs.prefetch(d)


@pytest.mark.daemon
def test_info(tfs):
    d = os.path.join(tfs.mnt, "d")
    os.makedirs(os.path.join(d, "sub"))
    write_file(os.path.join(d, "a"), randbytes(MiB))
    write_file(os.path.join(d, "sub", "b"), randbytes(2 * MiB))
    tierfs.wait_flushed(tfs.mnt, timeout=60)
    out = ok("info", d).stdout.splitlines()
    assert out[0].split() == ["file", "size", "tiers", "states"]
    rows = {ln.split()[0]: ln.split() for ln in out[1:]}
    a, b = os.path.join(d, "a"), os.path.join(d, "sub", "b")
    assert set(rows) == {a, b}
    assert rows[a][1:3] == ["1.0", "MiB"] and rows[b][1:3] == ["2.0", "MiB"]
    assert rows[a][3] == ",".join(tierfs.tier(a))
    assert rows[a][4:] == [f"{t}:{s}" for t, s in tierfs.state(a).items()]
    assert "ssd:CURRENT" in rows[a]


@pytest.mark.daemon
def test_stats_json_prometheus_and_alias(tfs):
    write_file(os.path.join(tfs.mnt, "f"), randbytes(MiB))
    tierfs.wait_flushed(tfs.mnt, timeout=60)
    # two tables compared: once the host cache's background touching (a
    # number of the table) is over
    util.wait_until(lambda: tierfs.stats(tfs.mnt)["host_touched"]
                    >= tierfs.stats(tfs.mnt)["tiers"]["host"]["capacity"],
                    "the host cache faulted in", 60, 0.1)
    s = tierfs.stats(tfs.mnt)
    table = ok("stats", tfs.mnt).stdout
    assert table.startswith(f"tierfs {tfs.mnt}\n") and "\nssd " in table
    assert ctl(tfs.mnt, tool=STAT_TOOL).stdout == table       # the alias
    assert json.loads(ok("stats", tfs.mnt, "--json").stdout)["tiers"]["host"][
        "capacity"] == s["tiers"]["host"]["capacity"]
    prom = ok("stats", tfs.mnt, "--prometheus").stdout
    mnt = os.path.realpath(tfs.mnt)
    want = f'tierfs_tier_capacity{{mount="{mnt}",tier="host"}} {s["tiers"]["host"]["capacity"]}'
    assert want in prom.splitlines(), prom
    assert "# TYPE tierfs_ssd_files_flushed_total counter" in prom
    m = re.search(rf'^tierfs_ssd_files_flushed_total{{mount="{re.escape(mnt)}"}} (\d+)$',
                  prom, re.M)
    assert m and int(m.group(1)) >= 1
    assert f'tierfs_prefetch_running{{mount="{mnt}"}} 1' in prom
    for line in prom.splitlines():          # the text format, line by line
        assert line.startswith(("# HELP ", "# TYPE ")) or re.fullmatch(
            r'[a-z_]+\{[a-z]+="[^"]*"(,[a-z]+="[^"]*")*\} -?[0-9.e+-]+', line), line
    sub = os.path.join(tfs.mnt, "sub")
    os.mkdir(sub)
    r = ok("stats", sub)                    # a path inside: the mount's statistics
    assert r.stdout.startswith(f"tierfs {mnt}\n") and "\nssd " in r.stdout
    assert f'mount="{mnt}"' in ok("stats", sub, "--prometheus").stdout


@pytest.mark.daemon
def test_wait_mounted(tfs):
    for i in range(4):
        write_file(os.path.join(tfs.mnt, f"f{i}"), randbytes(8 * MiB))
    ok("wait", tfs.mnt)
    assert tierfs.stats(tfs.mnt)["ssd"]["flush_backlog"] == 0
    sub = os.path.join(tfs.mnt, "sub")           # a directory inside: its mount
    os.mkdir(sub)
    write_file(os.path.join(sub, "g"), randbytes(8 * MiB))
    ok("wait", sub)
    assert tierfs.stats(tfs.mnt)["ssd"]["flush_backlog"] == 0


@pytest.mark.daemon
def test_record_ends_with_the_mount(tfs, tmp_path):
    rec = str(tmp_path / "r.jsonl")
    p = subprocess.Popen([sys.executable, TOOL, "record", tfs.mnt, rec, "--interval", "0.05"],
                         stderr=subprocess.PIPE, text=True)
    try:
        def recorded():
            assert p.poll() is None, p.stderr.read()
            return os.path.exists(rec) and os.path.getsize(rec) > 0
        util.wait_until(recorded, "a first record", 30)
        tfs.umount()
        assert p.wait(timeout=60) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "Traceback" not in p.stderr.read()
    assert all("stats" in json.loads(ln) for ln in open(rec))


def check_help_and_type(prom):
    """Each metric family: "# HELP NAME TEXT", then "# TYPE NAME KIND", then
    its samples, and no family twice (the text exposition format)."""
    lines = prom.splitlines()
    seen, i = set(), 0
    assert lines
    while i < len(lines):
        h = re.fullmatch(r"# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (\S.*)", lines[i])
        assert h, f"line {i + 1}: no HELP before {lines[i]!r}"
        name = h.group(1)
        assert "\n" not in h.group(2)
        assert name not in seen, f"{name} twice"
        seen.add(name)
        t = re.fullmatch(rf"# TYPE {re.escape(name)} (counter|gauge)", lines[i + 1])
        assert t, f"line {i + 2}: {lines[i + 1]!r} is not {name}'s TYPE"
        assert (t.group(1) == "counter") == name.endswith("_total"), name
        i += 2
        n = 0
        while i < len(lines) and not lines[i].startswith("#"):
            assert lines[i].startswith(name + "{"), (name, lines[i])
            i, n = i + 1, n + 1
        assert n, f"{name}: no samples"
    return seen


def test_prometheus_help_unit():
    """Every family, known keys and unknown ones alike, without a daemon."""
    from tierfs import statview
    s = {"tiers": {"host": {"capacity": 1, "used": 0, "hits": 3, "new_key": 5,
                            "policy": "score"}},
         "ssd": {"files_flushed": 2, "seconds": {"total": 0.5}},
         "prefetch": {"state": "stop", "queue": 0}}
    names = check_help_and_type(statview.prometheus("/m", s))
    assert {"tierfs_tier_capacity", "tierfs_tier_hits_total", "tierfs_tier_new_key",
            "tierfs_ssd_files_flushed_total", "tierfs_prefetch_running"} <= names


@pytest.mark.daemon
def test_prometheus_help_and_type(tfs):
    write_file(os.path.join(tfs.mnt, "f"), randbytes(MiB))
    tierfs.wait_flushed(tfs.mnt, timeout=60)
    names = check_help_and_type(ok("stats", tfs.mnt, "--prometheus").stdout)
    assert "tierfs_ssd_flush_backlog" in names and "tierfs_tier_capacity" in names


@pytest.mark.daemon
def test_wait_follows_a_daemon_to_its_end(mount, monkeypatch):
    """A daemon that has flushed and given its lock file up, but is still
    exiting (as with a GPU driver's teardown: TIERFS_FAULT=slow_exit sleeps
    2 s there), is still waited for."""
    monkeypatch.setenv("TIERFS_FAULT", "slow_exit")
    a = mount()
    monkeypatch.delenv("TIERFS_FAULT")
    write_file(os.path.join(a.mnt, "f"), randbytes(MiB))
    proc = a.proc
    r = subprocess.run(["umount", a.mnt], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    util.wait_until(lambda: not os.path.exists(os.path.join(a.backing, ".tierfs.lock")),
                    "the lock file to go", 30, 0.01)
    assert proc.poll() is None, "exited at once: the fault point was not reached"
    ok("wait", a.mnt)
    assert proc.poll() is not None, "wait returned before the daemon exited"
    assert proc.returncode == 0


@pytest.mark.daemon
def test_wait_after_umount(mount):
    """umount returns before the daemon has flushed; wait follows the daemon
    of that mount (not another one) until it exits."""
    a, b = mount(), mount()
    for i in range(6):
        write_file(os.path.join(a.mnt, f"f{i}"), randbytes(8 * MiB))
    proc_a, proc_b = a.proc, b.proc
    r = subprocess.run(["umount", a.mnt], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ok("wait", a.mnt)
    assert proc_a.poll() is not None, "wait returned before the daemon exited"
    assert proc_a.returncode == 0
    assert proc_b.poll() is None
    for i in range(6):
        assert os.path.getsize(os.path.join(a.backing, f"f{i}")) == 8 * MiB
    ok("wait", a.mnt)                       # no daemon: nothing to wait for


@pytest.mark.daemon
def test_warmup(mount):
    m = mount(host_cache="32M", gpu="none")    # cold files: no GPU tier
    cold = cold_files(m, 8)                   # 64 MiB through a 32 MiB cache
    assert len(cold) >= 2
    paths = sorted(cold)[:2]
    r = ok("warmup", "--progress", *paths)
    assert "100.0%" in r.stderr and "2/2 files" in r.stderr, r.stderr
    for p in paths:
        assert tierfs.tier(p)[0] == "host", tierfs.tier(p)
    before = tierfs.stats(m.mnt)["tiers"]["host"]["hits"]
    for p in paths:
        assert read_file(p) == cold[p]
    assert tierfs.stats(m.mnt)["tiers"]["host"]["hits"] > before


@pytest.mark.daemon
def test_warmup_counts_files_read_in_not_begun(mount, monkeypatch):
    """A file whose prefetch has begun shows "host" in user.tierfs.tier
    (state READ_IN_PROGRESS): warmup counts it, and ends, only once it is
    read in (READ_COMPLETE).  TIERFS_DELAY holds each prefetch read."""
    monkeypatch.setenv("TIERFS_DELAY", "prefetch_read=1500")
    m = mount(host_cache="32M", gpu="none")
    monkeypatch.delenv("TIERFS_DELAY")
    cold = cold_files(m, 8)
    assert len(cold) >= 2
    paths = sorted(cold)[:2]
    r = ok("warmup", "--progress", *paths)
    for p in paths:
        assert tierfs.state(p)["host"] == "READ_COMPLETE", tierfs.state(p)
    shown = [line for line in re.split(r"[\r\n]", r.stderr) if "files" in line]
    assert "0/2 files" in shown[0] and "2/2 files" in shown[-1], shown
    assert not any("1/2 files" in line for line in shown[:3]), shown
    for p in paths:
        assert read_file(p) == cold[p]


def cold_files(m, n, size=8 * MiB):
    """Write n files through m's cache (32 MiB) and return those that were
    evicted from it (tier ssd only), with their data."""
    data = {}
    for i in range(n):
        p = os.path.join(m.mnt, f"c{i}")
        data[p] = randbytes(size)
        write_file(p, data[p])
    tierfs.wait_flushed(m.mnt, timeout=120)
    return {p: d for p, d in data.items() if tierfs.tier(p) == ["ssd"]}


@pytest.mark.daemon
def test_warmup_stalls_when_prefetch_is_held(mount):
    m = mount(host_cache="32M", gpu="none")    # cold files: no GPU tier
    cold = cold_files(m, 8)
    assert cold
    p = sorted(cold)[0]
    tierfs.prefetch(m.mnt, False)
    r = ctl("warmup", "--stall", "0.5", p)
    assert r.returncode == 3, r.stderr
    assert "warning: prefetching is stopped" in r.stderr
    assert "1 of 1 files not cached" in r.stderr
    assert tierfs.queued(m.mnt) == [os.path.basename(p)]     # left queued
    tierfs.prefetch(m.mnt, True)
    ok("warmup", p)                                         # now it comes in
    assert tierfs.tier(p)[0] == "host"


@pytest.mark.daemon
def test_record_and_plot(tfs, tmp_path):
    rec = str(tmp_path / "run.jsonl")
    p = util.popen_with_default_signals([sys.executable, TOOL, "record", tfs.mnt, rec,
                                         "--interval", "0.05"], stderr=subprocess.PIPE, text=True)
    try:
        for i in range(6):
            write_file(os.path.join(tfs.mnt, f"f{i}"), randbytes(4 * MiB))
        tierfs.restore_order(tfs.mnt, [f"f{i}" for i in range(6)])
        for i in range(6):
            read_file(os.path.join(tfs.mnt, f"f{i}"))
        def recorded():
            assert p.poll() is None, p.stderr.read()
            return os.path.exists(rec) and sum(1 for _ in open(rec)) >= 5
        util.wait_until(recorded, "five records", 30)
    finally:
        p.terminate()
        p.wait(timeout=30)
    assert p.returncode == 0, p.stderr.read()
    lines = [json.loads(ln) for ln in open(rec)]
    assert len(lines) >= 5
    ts = [ln["t"] for ln in lines]
    assert ts == sorted(ts)
    assert all("tiers" in ln["stats"] for ln in lines)
    assert lines[-1]["stats"]["ssd"]["bytes_flushed"] >= lines[0]["stats"]["ssd"]["bytes_flushed"]
    # --count
    rec2 = str(tmp_path / "two.jsonl")
    ok("record", tfs.mnt, rec2, "--count", "2", "--interval", "0.01")
    assert sum(1 for _ in open(rec2)) == 2

    pytest.importorskip("matplotlib")
    png = str(tmp_path / "run.png")
    ok("plot", rec, png)
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 10000


def test_plot_bad_record(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 1, "stats": {}}\nnot json\n')
    one_line_error(ctl("plot", str(bad), str(tmp_path / "x.png")), "bad.jsonl:2")


@pytest.mark.daemon
def test_evict(mount):
    m = mount(host_cache="32M", gpu="none")    # cold files: no GPU tier
    d = os.path.join(m.mnt, "d")
    os.mkdir(d)
    data = {}
    for i in range(3):
        p = os.path.join(d, f"e{i}")
        data[p] = randbytes(4 * MiB)
        write_file(p, data[p])
    used = tierfs.stats(m.mnt)["tiers"]["host"]["used"]
    ok("evict", d)                           # waits for the flushes first
    for p in data:
        assert tierfs.tier(p) == ["ssd"], tierfs.tier(p)
        assert tierfs.state(p) == {"ssd": "CURRENT"}
    s = tierfs.stats(m.mnt)["tiers"]["host"]
    assert s["used"] <= used - 12 * MiB and s["evictions"] >= 3
    for p, want in data.items():             # read back from the SSD
        assert read_file(p) == want
    ok("evict", d)                           # nothing cached: fine


@pytest.mark.daemon
def test_evict_refuses_a_copy_in_use(mount):
    """A file prefetched for the restore queue and not read yet stays."""
    m = mount(host_cache="32M", gpu="none")    # cold files: no GPU tier
    cold = cold_files(m, 8)
    p = sorted(cold)[0]
    ok("warmup", p)
    assert tierfs.tier(p)[0] == "host"
    r = ctl("evict", p)
    assert r.returncode == 1 and "in use" in r.stderr, r.stderr
    assert tierfs.tier(p)[0] == "host"
    assert read_file(p) == cold[p]           # consumes it: now it may go
    ok("evict", p)
    assert tierfs.tier(p) == ["ssd"]


def test_bash_completion_knows_every_command():
    comp = os.path.join(util.REPO_DIR, "tools", "tierfsctl.bash")
    script = (f"source {comp}; COMP_WORDS=(tierfsctl ''); COMP_CWORD=1; _tierfsctl; "
              "echo ${COMPREPLY[@]}")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    words = set(r.stdout.split()) - {"--help", "--version"}
    from tierfs import ctl
    sub = next(a for a in ctl.parser()._actions if a.dest == "cmd")
    assert words == set(sub.choices), (words, set(sub.choices))
