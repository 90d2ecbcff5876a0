#!/bin/sh
# Run the pytest suites against the tierfs binary that `make check` built.
# Exit 77 (skip) only when pytest is missing; pytest's own "no tests ran"
# (5) counts as a failure.
#
# PYTEST_JOBS=N (default 1): N pytest workers (pytest-xdist, Debian's
# python3-pytest-xdist), each test in one of them; tests mount their own
# file systems in their own directories, so they run side by side.  Where
# xdist is missing the suites run in one process, and say so.
: "${TIERFS_SRCDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${PYTEST:=pytest-3}"
: "${PYTEST_JOBS:=1}"
if ! command -v "$PYTEST" >/dev/null 2>&1; then
	echo "pytest not found: skipping the mount tests" >&2
	exit 77
fi
XDIST=
if [ "$PYTEST_JOBS" -gt 1 ] 2>/dev/null; then
	if "$PYTEST" -p xdist --version >/dev/null 2>&1; then
		XDIST="-n $PYTEST_JOBS"
	else
		echo "run-pytest.sh: pytest-xdist missing: one worker, not $PYTEST_JOBS" >&2
	fi
fi
# A test that hangs past TIERFS_TEST_TIMEOUT leaves hang-report-PID.txt here
# (tests/conftest.py: its stacks, its daemons' stacks and logs): printed
# after the run, into the log that a failing `make check` shows.
rm -f hang-report-*.txt
# PYTEST_K: a -k expression (it may hold spaces; PYTEST_ARGS is split on them)
# --durations: the slowest tests, in the log for whoever trims the CI's time
"$PYTEST" -v -rfE -p no:cacheprovider --durations=25 $XDIST ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS} \
	"$TIERFS_SRCDIR/tests"
rc=$?
for f in hang-report-*.txt; do
	[ -e "$f" ] || continue
	echo "===== $f"
	cat "$f"
done
exit $rc
