"""Scale: many files in one mount with a daemon short of descriptors.

The daemon used to keep one descriptor per known inode: about 20,000 files
exhausted RLIMIT_NOFILE and every later operation failed (EMFILE, ENOMEM,
EBADF, EPERM).  Here it runs with RLIMIT_NOFILE 1024 and serves 30,000 files
(tests/manyfiles.py: create, stat, read, rename, stat, unlink), and its
descriptor count never reaches the limit.  TIERFS_SCALE_FILES sets the number
of files.
"""

import os

import pytest

import manyfiles

pytestmark = pytest.mark.daemon

NOFILE = 1024
FILES = int(os.environ.get("TIERFS_SCALE_FILES", "30000"))


@pytest.mark.parametrize("files,per_dir", [(FILES, 10000), (FILES // 3, FILES // 3)],
                         ids=["dirs", "onedir"])
@pytest.mark.slow
def test_many_files_few_descriptors(mount, files, per_dir):
    m = mount(nofile=NOFILE)
    r = manyfiles.run(m.mnt, files, per_dir=per_dir, workers=4, pid=m.proc.pid,
                      subdir=f"many{per_dir}")
    assert not r["errors"], r["errors"][:10]
    assert [p["files"] for p in r["phases"]] == [files] * len(manyfiles.PHASES)
    assert r["peak_fds"] < NOFILE, r
    # the budget is half of what the limit leaves (see fs_fd.c), plus the
    # descriptors it does not count (/dev/fuse, io_uring, transfers)
    assert r["peak_fds"] < NOFILE * 5 // 8, r
