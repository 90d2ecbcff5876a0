"""libtierfs's hint and statistics calls (tierfs_restore_order,
tierfs_restore_queue, tierfs_stats, tierfs_wait_flushed) against a real
tierfs mount: tests/lib/test_libtierfs, built by `make check`, run with the
mount as its argument."""

import os
import subprocess

import pytest

import util


@pytest.mark.daemon
def test_libtierfs_hints(mount, tmp_path):
    exe = os.path.join(os.path.dirname(util.tierfs_bin()), "tests", "lib", "test_libtierfs")
    if not os.access(exe, os.X_OK):
        pytest.skip(f"{exe} not built (make check builds it)")
    tfs = mount(flush_age=60000)        # small files: the waits ask for them
    plain = tmp_path / "plain"
    plain.mkdir()
    r = subprocess.run([exe, tfs.mnt, str(plain)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not ok" not in r.stdout
    assert "0 of 24 checks failed" in r.stdout, r.stdout
