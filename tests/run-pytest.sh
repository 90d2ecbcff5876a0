#!/bin/sh
# Run the pytest suites against the tierfs binary that `make check` built.
# Exit 77 (skip) only when pytest is missing; pytest's own "no tests ran"
# (5) counts as a failure.
: "${TIERFS_SRCDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${PYTEST:=pytest-3}"
if ! command -v "$PYTEST" >/dev/null 2>&1; then
	echo "pytest not found: skipping the mount tests" >&2
	exit 77
fi
# PYTEST_K: a -k expression (it may hold spaces; PYTEST_ARGS is split on them)
exec "$PYTEST" -v -rfE -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS} \
	"$TIERFS_SRCDIR/tests"
