"""tierfs's Slurm prolog, epilog and task prolog (tools/slurm; tierfs(8),
BATCH JOBS), run as slurmd runs them: as root (the task prolog as the job's
user), with the variables Slurm sets for a job.  No Slurm needed.

The job's user is the test user a of conftest.fuse_users (it may open
/dev/fuse); its node-local storage, persistent tier and state directory are
directories of the test.
"""

import os
import subprocess

import pytest

import util

pytestmark = pytest.mark.daemon

SLURM = os.path.join(util.REPO_DIR, "tools", "slurm")
TOOL = os.path.join(util.REPO_DIR, "tools", "tierfsctl")


class Node:
    """The scripts and a configuration for one test."""

    def __init__(self, user, top, **conf):
        self.user, self.top = user, top
        self.conf_path = os.path.join(top, "slurm.conf")
        self.conf = {"BACKING": f"{top}/local/%j/backing", "MOUNT": f"{top}/local/%j/mnt",
                     "LOGFILE": f"{top}/local/%j/tierfs.log",
                     "OPTIONS": "gpu=none,host_cache=16M", "DEADLINE": "30",
                     "STATE_DIR": f"{top}/state", "TIERFS": util.tierfs_bin(),
                     "TIERFSCTL": TOOL}
        self.conf.update(conf)
        self.write_conf()

    def write_conf(self, text=None):
        with open(self.conf_path, "w") as f:
            f.write(text if text is not None else
                    "# test\n" + "".join(f"{k}={v}\n" for k, v in self.conf.items()))

    def env(self, job):
        return {"PATH": os.environ["PATH"], "SLURM_JOB_ID": str(job),
                "SLURM_JOB_USER": self.user.name, "SLURM_JOB_UID": str(self.user.uid),
                "SLURM_JOB_GID": str(self.user.gid), "TIERFS_SLURM_CONF": self.conf_path}

    def run(self, script, job):
        return subprocess.run([os.path.join(SLURM, script)], env=self.env(job),
                              capture_output=True, text=True, timeout=120)

    def task_env(self, job):
        """What the task prolog exports, run as the job's user."""
        env = self.env(job)
        r = self.user.run(["env"] + [f"{k}={v}" for k, v in env.items()] +
                          [os.path.join(SLURM, "tierfs-taskprolog")])
        assert r.returncode == 0, r.stderr
        out = {}
        for line in r.stdout.splitlines():
            assert line.startswith("export "), line
            k, _, v = line[len("export "):].partition("=")
            out[k] = v
        return out

    def path(self, job, what):
        return self.conf[what].replace("%j", str(job))


@pytest.fixture
def node(fuse_users):
    a, _ = fuse_users
    top = a.home                        # under a world-searchable directory
    os.chown(top, 0, 0)
    os.chmod(top, 0o755)
    n = Node(a, top)
    yield n
    for job in os.listdir(os.path.join(top, "local")) if os.path.isdir(
            os.path.join(top, "local")) else []:
        util.lazy_umount(os.path.join(top, "local", job, "mnt"))


def test_job_mounts_writes_drains_unmounts(node):
    """The prolog mounts the job's tierfs as the job's user; the task sees
    it in TIERFS_MOUNT and writes a checkpoint; the epilog drains it to the
    persistent tier, unmounts and exits 0 (the backing directory goes)."""
    pdir = node.user.mkdir("pfs")
    work = node.user.mkdir("work")
    node.conf["PERSIST"] = pdir + "/%u/%j"
    node.write_conf()
    r = node.run("tierfs-prolog", 101)
    assert r.returncode == 0, r.stderr
    mnt, backing = node.path(101, "MOUNT"), node.path(101, "BACKING")
    assert util.is_mounted(mnt)
    env = node.task_env(101)
    assert env["TIERFS_MOUNT"] == mnt and env["TIERFS_BACKING"] == backing
    assert env["TIERFS_PERSIST"] == f"{pdir}/{node.user.name}/101"
    w = node.user.run(["sh", "-c", f"mkdir $TIERFS_MOUNT/step-1 && "
                       f"setfattr -n user.tierfs.persist -v 1 $TIERFS_MOUNT/step-1 && "
                       f"head -c 3000000 /dev/urandom > $TIERFS_MOUNT/step-1/rank0 && "
                       f"echo meta > $TIERFS_MOUNT/step-1/.metadata && "
                       f"cp $TIERFS_MOUNT/step-1/rank0 {work}/expected"],
                      env={"TIERFS_MOUNT": mnt})
    assert w.returncode == 0, w.stderr
    st = os.stat(os.path.join(backing))
    assert (st.st_uid, st.st_mode & 0o777) == (node.user.uid, 0o700)
    e = node.run("tierfs-epilog", 101)
    assert e.returncode == 0, e.stderr + open(node.path(101, "LOGFILE")).read()
    assert not util.is_mounted(mnt)
    out = os.path.join(env["TIERFS_PERSIST"], "step-1")
    with open(os.path.join(out, "rank0"), "rb") as f, \
            open(os.path.join(work, "expected"), "rb") as g:
        assert f.read() == g.read()
    assert os.stat(os.path.join(out, "rank0")).st_uid == node.user.uid
    assert not os.path.exists(backing)                  # KEEP_BACKING=auto
    assert not os.path.exists(os.path.join(node.top, "state", "101"))
    assert node.run("tierfs-epilog", 101).returncode == 0   # again: nothing to do


def test_two_jobs_on_one_node(node):
    """A second job on the node gets its own mount; each epilog takes its own."""
    for job in (201, 202):
        r = node.run("tierfs-prolog", job)
        assert r.returncode == 0, r.stderr
    m1, m2 = node.path(201, "MOUNT"), node.path(202, "MOUNT")
    assert util.is_mounted(m1) and util.is_mounted(m2)
    assert node.task_env(202)["TIERFS_MOUNT"] == m2
    for job, mnt in ((201, m1), (202, m2)):
        w = node.user.run(["sh", "-c", f"echo {job} > {mnt}/ckpt"])
        assert w.returncode == 0, w.stderr
    assert node.run("tierfs-epilog", 201).returncode == 0
    assert not util.is_mounted(m1) and util.is_mounted(m2)
    r = node.user.run(["cat", os.path.join(m2, "ckpt")])   # not root's: no allow_root
    assert r.stdout == "202\n", r.stderr
    e = node.run("tierfs-epilog", 202)
    assert e.returncode == 0, e.stderr
    # without PERSIST the backing directory stays (KEEP_BACKING=auto)
    with open(os.path.join(node.path(202, "BACKING"), "ckpt")) as f:
        assert f.read() == "202\n"


def test_prolog_twice_for_one_job_refused(node):
    assert node.run("tierfs-prolog", 301).returncode == 0
    r = node.run("tierfs-prolog", 301)
    assert r.returncode == 1 and "mounted already" in r.stderr, r.stderr
    assert node.run("tierfs-epilog", 301).returncode == 0


def test_epilog_persistent_tier_incomplete(node):
    """What cannot reach the persistent tier by the deadline fails the
    epilog, which says so; the backing directory is kept."""
    pdir = node.user.mkdir("pfs-ro")
    node.conf.update(PERSIST=pdir, DEADLINE="1")
    node.conf["OPTIONS"] += ",persist_all"
    node.write_conf()
    assert node.run("tierfs-prolog", 401).returncode == 0
    os.chmod(pdir, 0o555)               # the job's user may not write it
    mnt = node.path(401, "MOUNT")
    w = node.user.run(["sh", "-c", f"echo data > {mnt}/ckpt"])
    assert w.returncode == 0, w.stderr
    e = node.run("tierfs-epilog", 401)
    assert e.returncode == 1, e.stderr
    assert "job 401" in e.stderr and ("did not reach" in e.stderr or
                                      "deadline" in e.stderr), e.stderr
    assert not util.is_mounted(mnt)
    with open(os.path.join(node.path(401, "BACKING"), "ckpt")) as f:
        assert f.read() == "data\n"


def test_epilog_daemon_killed(node):
    """A daemon that was killed lost what it had cached: the epilog says so."""
    assert node.run("tierfs-prolog", 501).returncode == 0
    mnt = node.path(501, "MOUNT")
    w = node.user.run(["sh", "-c", f"echo data > {mnt}/ckpt"])
    assert w.returncode == 0, w.stderr
    import sys
    sys.path.insert(0, os.path.join(util.REPO_DIR, "python"))
    import tierfs
    pid = tierfs._find_daemon(mnt)
    assert pid
    os.kill(pid, 9)
    util.wait_until(lambda: not os.path.exists(f"/proc/{pid}"), "the daemon's death")
    e = node.run("tierfs-epilog", 501)
    assert e.returncode == 1 and "killed" in e.stderr, e.stderr
    assert not util.is_mounted(mnt)


@pytest.mark.parametrize("text,want", [
    (None, "no such file"),
    ("BACKING=/x/%j\nFOO=1\n", ":2: unknown key FOO"),
    ("DEADLINE=soon\n", ":1: DEADLINE must be a number"),
    ("RUN_AS=nobody\n", ":1: RUN_AS must be user or root"),
    ("MOUNT=relative/%j\n", ":1: MOUNT must be an absolute path"),
    ("just words\n", ":1: not KEY=VALUE"),
    ("MOUNT=/x/%q\n", "unknown escape %q"),
])
def test_bad_configuration(node, text, want):
    if text is None:
        os.unlink(node.conf_path)
    else:
        node.write_conf(text)
    r = node.run("tierfs-prolog", 601)
    assert r.returncode == 1 and want in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert node.conf_path in r.stderr or "escape" in want, r.stderr


def test_prolog_without_job_variables(node):
    env = node.env(701)
    del env["SLURM_JOB_UID"]
    r = subprocess.run([os.path.join(SLURM, "tierfs-prolog")], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "SLURM_JOB_UID" in r.stderr, r.stderr


def test_prolog_says_why_tierfs_failed(node):
    node.conf["OPTIONS"] = "host_cache=lots"
    node.write_conf()
    r = node.run("tierfs-prolog", 801)
    assert r.returncode == 1 and "bad host_cache" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(node.top, "state", "801"))


def test_modulefiles(tmp_path):
    """The module files name the installed paths (make's substitutions)."""
    build = os.path.dirname(util.tierfs_bin())
    for name in ("tierfs.lua", "tierfs.tcl"):
        path = os.path.join(build, name)
        if not os.path.exists(path):
            pytest.skip(f"{path}: not built (make)")
        text = open(path).read()
        assert "@" not in text.replace("@VERSION", ""), text
        for var in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "MANPATH", "TIERFS_"):
            assert var in text, (name, var)


def test_run_as_root(node):
    """RUN_AS=root: a root daemon with allow_other; the job's files are the
    user's all the same."""
    node.conf["RUN_AS"] = "root"
    node.write_conf()
    assert node.run("tierfs-prolog", 901).returncode == 0
    mnt, backing = node.path(901, "MOUNT"), node.path(901, "BACKING")
    w = node.user.run(["sh", "-c", f"echo data > {mnt}/ckpt"])
    assert w.returncode == 0, w.stderr
    e = node.run("tierfs-epilog", 901)
    assert e.returncode == 0, e.stderr
    st = os.stat(os.path.join(backing, "ckpt"))
    assert (st.st_uid, st.st_gid) == (node.user.uid, node.user.gid)


def test_epilog_waits_for_each_set_to_reach_the_persistent_tier(node):
    """The epilog waits for every committed set under the mount to be
    complete in the persistent tier (its files there, then its record);
    a set that cannot be (a file changed after its commit) fails the
    epilog, which names it."""
    pdir = node.user.mkdir("pfs-sets")
    node.conf["PERSIST"] = pdir + "/%j"
    node.write_conf()
    for job, bad in ((1001, False), (1002, True)):
        assert node.run("tierfs-prolog", job).returncode == 0
        mnt = node.path(job, "MOUNT")
        script = (f"set -e; mkdir -p {mnt}/run; setfattr -n user.tierfs.persist -v 1 {mnt}/run; "
                  f"for s in step-1 step-2; do mkdir {mnt}/run/$s; "
                  f"head -c 200000 /dev/urandom > {mnt}/run/$s/rank0; "
                  f"echo meta > {mnt}/run/$s/.metadata; "
                  f"setfattr -n user.tierfs.commit -v '' {mnt}/run/$s; done")
        if bad:
            script += f"; echo more >> {mnt}/run/step-2/rank0"
        w = node.user.run(["sh", "-c", script])
        assert w.returncode == 0, w.stderr
        e = node.run("tierfs-epilog", job)
        if bad:
            assert e.returncode == 1, e.stderr
            assert "job 1002" in e.stderr and "run/step-2" in e.stderr, e.stderr
            assert "step-1" not in e.stderr.replace("run/step-2", ""), e.stderr
            assert not util.is_mounted(mnt)
            assert os.path.isdir(node.path(job, "BACKING"))     # kept
        else:
            assert e.returncode == 0, e.stderr + open(node.path(job, "LOGFILE")).read()
            for s in ("step-1", "step-2"):
                assert os.path.exists(os.path.join(pdir, str(job), "run", s, ".tierfs.set")), s
