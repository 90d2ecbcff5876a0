"""Mount integration: mount.tierfs (mount -t tierfs, fstab lines through
`mount -T FILE`), the mount's source and type, option errors.

mount(8) runs helpers from /sbin only: the helper tests run in a private
mount namespace (unshare -m) where an overlay puts tools/mount.tierfs into
/sbin, so nothing outside the test changes.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import util

HELPER = os.path.join(util.REPO_DIR, "tools", "mount.tierfs")
TOOL = os.path.join(util.REPO_DIR, "tools", "tierfsctl")


def findmnt(path, cols="SOURCE,FSTYPE"):
    r = subprocess.run(["findmnt", "-n", "-o", cols, "--mountpoint", path],
                       capture_output=True, text=True)
    return r.stdout.strip()


@pytest.mark.daemon
def test_source_is_the_backing_directory(tmp_path, mount):
    m = mount(backing=str(tmp_path / "ssd, with a comma"))
    line = findmnt(m.mnt)
    assert line.rsplit(None, 1) == [m.backing, "fuse.tierfs"], line


def run_daemon(tmp_path, *opts):
    b, mnt = tmp_path / "b", tmp_path / "m"
    b.mkdir(exist_ok=True)
    mnt.mkdir(exist_ok=True)
    r = subprocess.run([util.tierfs_bin(), str(b), str(mnt), "-o", ",".join(opts)],
                       capture_output=True, text=True, timeout=60)
    if util.is_mounted(str(mnt)):
        util.lazy_umount(str(mnt))
        pytest.fail(f"mounted with {opts}")
    return r


def count_mounts(path):
    with open("/proc/self/mountinfo") as f:
        return sum(ln.split()[4] == path for ln in f)


@pytest.mark.daemon
@pytest.mark.parametrize("where", ["mount point", "inside"])
def test_over_a_live_tierfs_is_refused(tmp_path, mount, where):
    """A second tierfs over a live tierfs mount (its mount point, or a
    directory inside it) is refused before anything is mounted (issue 37)."""
    m = mount()
    util.write_file(os.path.join(m.mnt, "f"), b"first")
    target = m.mnt
    if where == "inside":
        target = os.path.join(m.mnt, "sub")
        os.mkdir(target)
    b2 = tmp_path / "b2"
    b2.mkdir()
    before = count_mounts(target)
    r = subprocess.run([util.tierfs_bin(), str(b2), target, "-f", "-o", "host_cache=64M"],
                       capture_output=True, text=True, timeout=60)
    after = count_mounts(target)
    if after > before:
        util.lazy_umount(target)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert after == before, "mounted anyway"
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "live tierfs mount" in lines[0], r.stderr
    assert (target + " is a live tierfs mount already") in lines[0] if where == "mount point" \
        else ("inside the live tierfs mount " + m.mnt) in lines[0]
    assert util.read_file(os.path.join(m.mnt, "f")) == b"first"     # still served


@pytest.mark.daemon
def test_same_place_after_unmount_is_fine(mount):
    """Where the first mount is gone, the same place mounts again."""
    m = mount()
    m.umount()
    m.start()
    assert util.is_mounted(m.mnt)


@pytest.mark.daemon
def test_unknown_option_is_one_line(tmp_path):
    r = run_daemon(tmp_path, "host_cache=64M", "bogus=1")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "tierfs: unknown option(s): `-o bogus=1' (see tierfs --help)"], r.stderr


@pytest.mark.daemon
@pytest.mark.parametrize("opt, msg", [
    ("flush_threads=0", "flush_threads must be 1..64, not '0'"),
    ("flush_threads=65", "flush_threads must be 1..64, not '65'"),
    ("flush_threads=4x", "flush_threads must be 1..64, not '4x'"),
    ("queue_depth=0", "queue_depth must be 1..256, not '0'"),
    ("queue_depth=257", "queue_depth must be 1..256, not '257'"),
    ("flush_age=-1", "flush_age must be 0..60000 milliseconds, not '-1'"),
    ("flush_age=60001", "flush_age must be 0..60000 milliseconds, not '60001'"),
    ("exit_timeout=1.5", "exit_timeout must be 0..604800 seconds, not '1.5'"),
    ("hint_max=99999999999999999999",
     "hint_max must be 1 or more (at most 2147483647), not '99999999999999999999'"),
])
def test_option_ranges(tmp_path, opt, msg):
    r = run_daemon(tmp_path, "host_cache=64M", opt)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"tierfs: {msg}"], r.stderr


SIZE_OPTIONS = ["host_cache", "gpu_cache", "dedup_chunk", "dedup_index", "persist_bw"]


@pytest.mark.daemon
@pytest.mark.parametrize("opt", SIZE_OPTIONS)
@pytest.mark.parametrize("value, why", [
    ("12Q", None), ("-1", None), ("1e3", None), ("nan", None), ("", None),
    ("99999999999999999999G", "too large"),
])
def test_size_junk_refused(tmp_path, opt, value, why):
    """Every size option reads its value by the one parser (tierfs(8),
    OPTIONS): junk and overflow stop the start with one line naming the
    option and the value."""
    pdir = tmp_path / "pdir"
    pdir.mkdir()
    r = run_daemon(tmp_path, "gpu=none", f"persist={pdir}", f"{opt}={value}")
    assert r.returncode in (1, 2), (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tierfs: bad {opt} '{value}': "), r.stderr
    if why:
        assert lines[0].endswith(why), r.stderr


@pytest.mark.daemon
def test_size_forms_mean_the_same(tmp_path, mount):
    """One size, written in each accepted form, is one host cache; and every
    size option takes those forms."""
    sizes = set()
    for form in ["64M", "64MiB", "64MB", "64m", "65536K", "0.0625G", "67108864", "67108864B"]:
        m = mount(host_cache=form, gpu="none")
        sizes.add(json.loads(os.getxattr(m.mnt, "user.tierfs.stats"))["tiers"]["host"]
                  ["capacity"])
        m.umount()
    assert sizes == {64 << 20}, sizes
    pdir = tmp_path / "pdir"
    pdir.mkdir()
    m = mount(host_cache="64MiB", gpu_cache="0.5g", dedup_chunk="16KiB",
              dedup_index="1.5M", persist=str(pdir), persist_bw="1M/s", gpu="none")
    util.write_file(os.path.join(m.mnt, "f"), b"x" * 4096)


@pytest.mark.daemon
def test_option_range_ends_accepted(mount):
    m = mount(flush_threads=1, queue_depth=256, flush_age=60000)
    util.write_file(os.path.join(m.mnt, "f"), b"x" * 4096)


def test_helper_drops_mount_options(tmp_path):
    """-f (fake) -v prints the daemon command line without running it."""
    r = subprocess.run(["sh", HELPER, "/ssd/ckpt", "/mnt/ckpt", "-f", "-v", "-o",
                        "rw,defaults,noauto,nofail,_netdev,x-systemd.requires=a,"
                        "comment=z,host_cache=64G,ro,users"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "mount.tierfs: tierfs /ssd/ckpt /mnt/ckpt -o host_cache=64G,ro\n"
    r = subprocess.run(["sh", HELPER, "/a", "/b", "-f", "-v", "-o", "defaults"],
                       capture_output=True, text=True)
    assert r.stderr == "mount.tierfs: tierfs /a /b\n"
    r = subprocess.run(["sh", HELPER, "/a"], capture_output=True, text=True)
    assert r.returncode == 1 and "usage" in r.stderr


SCRIPT = r'''
set -u
# helpers: /sbin is searched by mount(8); put mount.tierfs there (overlay)
sbin=$(readlink -f /sbin)
mount -t overlay overlay -o "lowerdir=$HELPERS:$sbin" "$sbin" || exit 90
trap 'umount -l "$MNT" 2>/dev/null' EXIT
step() { echo "== $*"; }
step fstab
mount -T "$FSTAB" "$MNT" || exit 91
findmnt -n -o SOURCE,FSTYPE --mountpoint "$MNT"
head -c 3000000 /dev/urandom > "$MNT/f"
cmp "$MNT/f" "$MNT/f" || exit 92
"$PY" "$TOOL" info "$MNT/f" | tail -n 1 | awk '{print $1}'
umount "$MNT" || exit 93
"$PY" "$TOOL" wait "$MNT" || exit 94
test -s "$BACKING/f" || exit 95
step mount -t tierfs
mount -t tierfs "$BACKING" "$MNT" -o host_cache=64M,gpu=none,nofail || exit 96
findmnt -n -o SOURCE,FSTYPE --mountpoint "$MNT"
cmp "$MNT/f" "$BACKING/f" || exit 97
umount "$MNT" && "$PY" "$TOOL" wait "$MNT" || exit 98
step bad option
mount -t tierfs "$BACKING" "$MNT" -o host_cache=64M,bogus=1 2>&1
echo "rc $?"
step done
'''


@pytest.mark.daemon
def test_fstab_and_mount_t(tmp_path):
    if not shutil.which("unshare") or not shutil.which("findmnt"):
        pytest.skip("needs unshare and findmnt (util-linux)")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([util.tierfs_bin(), "--version"], env=env, capture_output=True,
                       text=True)
    if r.returncode:        # mount(8) runs helpers without LD_LIBRARY_PATH
        pytest.skip(f"tierfs needs LD_LIBRARY_PATH here: {r.stderr.strip()}")
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    with open(HELPER) as f:
        text = f.read()
    assert "\nTIERFS_DAEMON=tierfs " in text          # what make install rewrites
    text = text.replace("\nTIERFS_DAEMON=tierfs ", f"\nTIERFS_DAEMON={util.tierfs_bin()} ")
    (helpers / "mount.tierfs").write_text(text)
    os.chmod(helpers / "mount.tierfs", 0o755)
    backing, mnt = tmp_path / "ssd", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# test fstab\n{backing}  {mnt}  tierfs  "
                     "host_cache=64M,gpu=none,flush_threads=2,nofail,noauto  0 0\n")
    env = dict(os.environ, HELPERS=str(helpers), FSTAB=str(fstab), MNT=str(mnt),
               BACKING=str(backing), PY=sys.executable, TOOL=TOOL)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT],
                       capture_output=True, text=True, env=env, timeout=300)
    if r.returncode == 90:
        pytest.skip(f"no overlay mount here: {r.stderr.strip()}")
    assert r.returncode == 0, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    out = r.stdout.split("== ")
    assert out[1].splitlines()[1:] == [f"{backing} fuse.tierfs", f"{mnt}/f"], r.stdout
    assert out[2].splitlines()[1:] == [f"{backing} fuse.tierfs"], r.stdout
    bad = out[3].splitlines()[1:]
    assert bad[0] == "tierfs: unknown option(s): `-o bogus=1' (see tierfs --help)", r.stdout
    assert bad[-1] != "rc 0" and len(bad) == 2, r.stdout
    assert not util.is_mounted(str(mnt))


@pytest.mark.daemon
def test_read_only(tmp_path, mount):
    import errno
    backing = tmp_path / "ssd"
    backing.mkdir()
    (backing / "f").write_bytes(b"data")
    m = mount(backing=str(backing), ro=True, noexec=True)
    assert findmnt(m.mnt, "OPTIONS").split(",")[:1] == ["ro"]
    assert "noexec" in findmnt(m.mnt, "OPTIONS").split(",")
    assert util.read_file(os.path.join(m.mnt, "f")) == b"data"
    assert os.getxattr(os.path.join(m.mnt, "f"), "user.tierfs.tier") == b"ssd"
    for fn, args in ((open, (os.path.join(m.mnt, "g"), "wb")),
                     (os.setxattr, (m.mnt, "user.tierfs.restore_order", b"f"))):
        with pytest.raises(OSError) as ei:
            fn(*args)
        assert ei.value.errno == errno.EROFS


def test_readahead_is_set_without_a_request_to_itself(mount):
    """-o readahead_kb reaches the mount's bdi.  The daemon finds the mount's
    device in /proc/self/mountinfo: a stat() of its own mount point was a
    request to itself, and a daemon killed while that request was in flight
    could never exit (its answering threads died first)."""
    util.require_daemon()
    m = mount(readahead_kb=2048)
    st = os.stat(m.mnt)
    path = f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb"
    util.wait_until(lambda: open(path).read().strip() == "2048",
                    lambda: f"{path}: {open(path).read().strip()}")
    log = m.log()
    assert "cannot set readahead" not in log, log


def test_a_daemon_killed_while_its_root_is_looked_at_exits(mount, monkeypatch):
    """SIGKILL while a getattr of the root is in flight (TIERFS_DELAY holds
    it): the daemon exits.  Before, its main thread stat()ed its own mount
    point to set the readahead; killed with that request in flight, the
    threads that answer died and the waiting one never could, so the
    daemon never exited and its mount stayed."""
    util.require_daemon()
    monkeypatch.setenv("TIERFS_DELAY", "getattr_root=3000")
    m = mount()
    monkeypatch.delenv("TIERFS_DELAY")
    dev = os.stat(m.mnt).st_dev      # held too: the daemon's own look is in flight
    proc = m.proc
    proc.send_signal(signal.SIGKILL)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        # free it: abort the connection, whose answer never comes
        with open(f"/sys/fs/fuse/connections/{os.minor(dev)}/abort", "w") as f:
            f.write("1")
        proc.wait(timeout=30)
        pytest.fail("the killed daemon did not exit: a thread of it waited on its own mount")
    finally:
        m.runs[-1][3] = "SIGKILL"
        m.proc = None
        util.lazy_umount(m.mnt)
