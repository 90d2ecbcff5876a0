"""The torture harness (tests/torture.py) against tierfs.

Short runs by default (about 2-3 minutes in all): 16M and 64M host caches,
score and fifo eviction, and one crash-mode run; the harness also checks
itself on a plain directory.  Each run is a subprocess:
`python3 tests/torture.py ...`; on a failure its report (seed, file, offset,
expected vs found, the last operations) is the test's failure message, and
the command that replays it is in it.

Environment
  TIERFS_TORTURE_SECONDS  seconds per daemon run (default 25)
  TIERFS_TORTURE_RATE     MiB/s written + read per run (default 64: at most
                          ~2.5 GiB a run; 0: as fast as it goes)
  TIERFS_TORTURE_SEED     the seed (default 1; TIERFS_RANDOM_SEED=1: a random
                          one per run; printed either way)
  TIERFS_TORTURE_LONG=1   also the long run: one hour or 1,000,000 operations
                          (TIERFS_TORTURE_LONG_SECONDS, TIERFS_TORTURE_LONG_OPS)
  TIERFS_TORTURE_ARGS     more harness arguments for every daemon run,
                          e.g. "--skip-ops link --procs 2"
"""

import faulthandler
import json
import os
import shlex
import subprocess
import sys

import pytest

import util

pytestmark = pytest.mark.slow

HARNESS = os.path.join(util.TESTS_DIR, "torture.py")
SECONDS = float(os.environ.get("TIERFS_TORTURE_SECONDS", "25"))
RATE = os.environ.get("TIERFS_TORTURE_RATE", "64")
LONG = os.environ.get("TIERFS_TORTURE_LONG", "") not in ("", "0")
LONG_SECONDS = float(os.environ.get("TIERFS_TORTURE_LONG_SECONDS", "3600"))
LONG_OPS = int(os.environ.get("TIERFS_TORTURE_LONG_OPS", "1000000"))
EXTRA = shlex.split(os.environ.get("TIERFS_TORTURE_ARGS", ""))


def seed_args():
    return ["--seed", str(util.pick_seed("TIERFS_TORTURE_SEED", 1, "torture"))]


def run_harness(args, tmp_path, timeout):
    """Run the harness; fail the test with its report unless it passes."""
    cmd = [sys.executable, HARNESS, "--workdir", str(tmp_path / "work"),
           "--report-every", "20"] + args
    env = dict(os.environ, TIERFS_BIN=util.tierfs_bin())
    print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"torture harness did not end within {timeout:.0f}s:\n{out[-20000:]}",
                    pytrace=False)
    print(r.stdout[-20000:])
    if r.returncode != 0:
        pytest.fail(f"torture harness failed (status {r.returncode}):\n{r.stdout[-30000:]}",
                    pytrace=False)
    assert "torture: PASS" in r.stdout
    return r.stdout


def daemon_run(args, tmp_path, seconds=SECONDS):
    # the run itself, the final checks, a clean unmount (flushing everything)
    return run_harness(["--seconds", str(seconds), "--rate", RATE] + seed_args() + args + EXTRA,
                       tmp_path,
                       timeout=seconds * 3 + 600)


# label, harness arguments
CONFIGS = [
    ("cache16M-score", ["--host-cache", "16M", "--policy", "score"]),
    ("cache64M-fifo", ["--host-cache", "64M", "--policy", "fifo"]),
    # hard links included: a file with several names gets its new versions
    # copied over it under a commit intent in the journal (fs_version.c)
    ("crash-cache16M", ["--host-cache", "16M", "--crash"]),
    # the small writers' setting: writable handles in the page cache, the
    # kernel's writeback cache, read-only handles direct
    ("writeback-cache16M", ["--host-cache", "16M", "--mount-opts", "writeback,no_direct_writes"]),
]


@pytest.mark.daemon
@pytest.mark.parametrize("label,args", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_torture(tmp_path, label, args):
    daemon_run(args, tmp_path)


@pytest.mark.daemon
@pytest.mark.gpu
def test_torture_gpu(tmp_path):
    """The GPU tier and the cascade share the allocation code: a small GPU cache."""
    daemon_run(["--host-cache", "16M", "--mount-opts", f"gpu={util.GPU},gpu_cache=64M"],
               tmp_path)


@pytest.mark.daemon
def test_torture_gpu_tier_crash(tmp_path, monkeypatch):
    """The GPU tier's paths (the cascade, copies in two tiers that writers
    replace and drop while flushers work on them) under kills, small
    caches: on the GPU where there is one, else on the build's fake
    libcuda, so that every machine runs them."""
    gpu = util.gpu_or_fake(monkeypatch)
    out = daemon_run(["--host-cache", "16M", "--crash",
                      "--mount-opts", f"gpu={gpu},gpu_cache=64M"], tmp_path)
    assert "GPU tier: GPU" in out, "the daemon ran without a GPU tier"


@pytest.mark.daemon
def test_torture_gpus_crash(tmp_path, monkeypatch):
    """One GPU cache over two GPUs (-o gpu=0:1): copies on either part and
    across the parts' boundary, the cascade and eviction over the whole
    range, under kills; real GPUs with TIERFS_GPUS=0:1, else the fake
    libcuda's two devices."""
    gpus = util.gpus_or_fake(monkeypatch, 2)
    out = daemon_run(["--host-cache", "16M", "--crash",
                      "--mount-opts", f"gpu={gpus},gpu_cache=32M"], tmp_path)
    assert "GPU tier: 2 GPUs" in out, "the daemon ran without a GPU tier over two GPUs"


@pytest.mark.daemon
@pytest.mark.skipif(not LONG, reason="the long run: TIERFS_TORTURE_LONG=1")
def test_torture_long(tmp_path):
    """An hour or 1,000,000 operations, whichever comes first, at full speed
    (no --rate), 16 MiB host cache."""
    faulthandler.dump_traceback_later(LONG_SECONDS + 1800, exit=True)   # the watchdog
    run_harness(["--seconds", str(LONG_SECONDS), "--ops", str(LONG_OPS), "--host-cache",
                 "16M", "--report-every", "60"] + seed_args() + EXTRA,
                tmp_path, timeout=LONG_SECONDS + 1500)


# ---------------------------------------------- the harness checks itself

def test_torture_plain(tmp_path):
    """The same operations on a plain directory (no daemon) must pass: the
    model is right.  Crash mode too (no kill: the protocol and the checks)."""
    plain = tmp_path / "plain"
    run_harness(["--plain", str(plain), "--seconds", "5", "--seed", "7"], tmp_path, 300)
    run_harness(["--plain", str(plain), "--seconds", "5", "--seed", "8", "--crash",
                 "--crash-interval", "1"], tmp_path, 300)


def test_torture_detects_corruption(tmp_path):
    """A write of another file's data behind the model's back is reported,
    decoded, with the seed and the worker's last operations."""
    cmd = [sys.executable, HARNESS, "--plain", str(tmp_path / "plain"), "--seconds", "30",
           "--seed", "99", "--procs", "2", "--threads", "1", "--inject-corruption", "200",
           "--workdir", str(tmp_path / "work")]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    print(r.stdout[-5000:])
    assert r.returncode == 1
    assert "torture: FAIL seed 99" in r.stdout
    assert "(worker 1's inode" in r.stdout          # whose data was found
    assert "last " in r.stdout and "operations of worker 0" in r.stdout
    assert "--seed 99" in r.stdout                  # the replay command


@pytest.mark.daemon
@pytest.mark.parametrize("crash", [False, True], ids=["clean", "kills"])
def test_torture_dedup(tmp_path, xfs, crash):
    """The harness over an XFS reflink file system with -o dedup=on: files
    changed in place flush as incremental versions that clone the unchanged
    ranges, new checkpoints by chunks against the index, under hard links,
    truncates, holes, mmap and (kills) SIGKILLs: every read matches the
    model, and dedup did share extents (its statistics)."""
    args = ["--host-cache", "16M", "--backing", xfs, "--mount-opts", "dedup=on"]
    out = daemon_run(args + (["--crash"] if crash else []), tmp_path, seconds=min(SECONDS, 30))
    stats = [json.loads(line.split("dedup: ", 1)[1]) for line in out.splitlines()
             if line.startswith("torture: dedup: ")]
    assert stats and all(s["on"] for s in stats), out[-3000:]
    # one line per daemon life (each counts from zero): with kills the last
    # life may be too short to clone anything, so over all of them
    assert sum(s["bytes_cloned"] for s in stats) > 0, stats
