# TIERFS_CHECK_PYTHON: the interpreter of the Python package tierfs and of
# the installed tools (tierfsctl, tierfs-stat), and where the package goes.
#
# PYTHON (./configure PYTHON=/usr/bin/python3), else the first python3 on
# PATH, is kept as the executable it runs (sys.executable: a pyenv shim
# becomes the interpreter behind it; a virtual environment's python stays
# itself).  pythondir is the first of that interpreter's site directories
# (site.getsitepackages(), then the user's) under PREFIX/lib*: Debian's
# /usr/local/lib/python3.X/dist-packages for /usr/local,
# /usr/lib/python3/dist-packages for /usr, a venv's site-packages for the
# venv.  Where the interpreter imports nothing under PREFIX (a pyenv Python
# and /usr/local), pythondir is its posix_prefix scheme under PREFIX and
# configure warns: the installed tools still find the package there, other
# programs need PYTHONPATH.  --with-python-sys-prefix (automake's) installs
# into the interpreter's own site directory whatever PREFIX is.
#
# Sets PYTHON (":" without one), pythondir, PYTHON_SHEBANG (the installed
# tools' first line), tierfs_py_summary; AM_CONDITIONAL HAVE_PYTHON.
AC_DEFUN([TIERFS_CHECK_PYTHON], [
  AS_IF([test -z "$PYTHON"], [AC_PATH_PROG([PYTHON], [python3], [])])
  AM_PATH_PYTHON([3.7], [], [PYTHON=:])
  PYTHON_SHEBANG='/usr/bin/env python3'
  tierfs_py_summary="not installed (no Python 3.7 or later)"
  AS_IF([test "x$PYTHON" != x:], [
    tierfs_py_exe=`$PYTHON -c 'import sys; print(sys.executable)' 2>/dev/null`
    AS_IF([test -n "$tierfs_py_exe" && test -x "$tierfs_py_exe"], [PYTHON=$tierfs_py_exe])
    PYTHON_SHEBANG=$PYTHON
    tierfs_py_prefix=$prefix
    AS_IF([test "x$tierfs_py_prefix" = xNONE], [tierfs_py_prefix=$ac_default_prefix])
    tierfs_py_code='
import os, site, sys, sysconfig
p = os.path.normpath(os.environ.get("TIERFS_PY_PREFIX"))
def out(d, imported):
    d = os.path.normpath(d)
    r = os.path.relpath(d, p)
    print(d)
    print("yes" if imported else "no")
    print(r if r.startswith("lib") else "")
    sys.exit(0)
if os.environ.get("TIERFS_PY_SYS_PREFIX") == "yes":
    out(sysconfig.get_path("purelib"), True)
dirs = list(getattr(site, "getsitepackages", list)())
if site.ENABLE_USER_SITE:
    dirs.append(site.getusersitepackages())
for d in dirs:
    if os.path.relpath(os.path.normpath(d), p).startswith("lib"):
        out(d, True)
scheme = "posix_prefix" if "posix_prefix" in sysconfig.get_scheme_names() else None
out(sysconfig.get_path("purelib", scheme, vars=dict(base=p, platbase=p)), False)'
    AC_MSG_CHECKING([where $PYTHON imports packages from under $tierfs_py_prefix])
    tierfs_py_out=`TIERFS_PY_PREFIX=$tierfs_py_prefix TIERFS_PY_SYS_PREFIX=$with_python_sys_prefix $PYTHON -c "$tierfs_py_code"`
    tierfs_py_dir=`echo "$tierfs_py_out" | sed -n 1p`
    tierfs_py_imports=`echo "$tierfs_py_out" | sed -n 2p`
    tierfs_py_rel=`echo "$tierfs_py_out" | sed -n 3p`
    AS_IF([test -z "$tierfs_py_dir"], [AC_MSG_ERROR([$PYTHON cannot tell its site directories])])
    AS_IF([test "x$tierfs_py_imports" = xyes],
      [AC_MSG_RESULT([$tierfs_py_dir])
       tierfs_py_summary=$tierfs_py_dir],
      [AC_MSG_RESULT([nowhere: $tierfs_py_dir is not on its path])
       AC_MSG_WARN([$PYTHON imports nothing under $tierfs_py_prefix: the package goes to $tierfs_py_dir, where the installed tierfsctl and tierfs-stat find it but other programs need PYTHONPATH.  Configure with PYTHON=/usr/bin/python3 (an interpreter that does import from there) or --with-python-sys-prefix (into $PYTHON's own site directory).])
       tierfs_py_summary="$tierfs_py_dir (NOT on that Python's path: see the warning)"])
    dnl relative to ${prefix}, as automake's own: `make prefix=...` follows
    AS_IF([test -n "$tierfs_py_rel"],
      [pythondir='${prefix}'/$tierfs_py_rel],
      [pythondir=$tierfs_py_dir])
  ])
  AC_SUBST([PYTHON_SHEBANG])
  AM_CONDITIONAL([HAVE_PYTHON], [test "x$PYTHON" != x:])
])
