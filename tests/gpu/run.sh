#!/bin/bash
#
# tests/gpu/run.sh - run tierfs's tests on a GPU machine from a prebuilt tree.
#
# Two halves, both run from anywhere (they cd to the top of the tree):
#
#   tests/gpu/run.sh prep   on the build machine (autotools, CUDA headers,
#                           libfuse3/liburing dev files): builds build-gpu/
#                           (../configure NVCC_ARCH=sm_90, make, then
#                           `make check TESTS=`, which builds the check
#                           programs without running them), builds
#                           build-gpu/tests/unit/test_gpu_tier if the
#                           Makefile does not, and copies libfuse3.so.3,
#                           liburing.so.2 and libxxhash.so.0 into .devlibs/
#                           (git-ignored).
#
#   tests/gpu/run.sh        on the GPU machine (root, /dev/fuse, CUDA driver,
#                           python3 with pytest; no autotools, no package
#                           installs, maybe no fusermount3: the tests then
#                           unmount with umount), with build-gpu/ and
#                           .devlibs/ carried along: records nvidia-smi, runs
#                           every program in build-gpu/tests/unit/,
#                           build-gpu/tests/gpu/gpu_selftest and
#                           build-gpu/tests/gpu/test_gpu_hash, then the pytest
#                           suites against build-gpu/tierfs with a GPU tier,
#                           and prints a summary.  Exit 0 when nothing failed.
#
# Output ($OUT, default /tmp/out): nvidia-smi.txt, env.txt, unit.log (each
# program's output and rc), pytest.log, summary.txt.
#
# Environment of the GPU half (defaults in brackets):
#   OUT=/tmp/out            where the logs go
#   BUDGET=560              seconds for the whole run; pytest gets what the
#                           unit programs leave (minus a margin) and is
#                           stopped when it runs out
#   UNIT_TIMEOUT=180        seconds per unit program
#   PYTEST_K=               pytest -k expression (default: every test)
#   PYTEST_ARGS=            more pytest arguments
#   TIERFS_GPU=0            device for the daemon (-o gpu=N) and the programs
#   TIERFS_OPTIONS=gpu_cache=256M   extra mount options for every mount
#   TIERFS_OPS=20000        exerciser operations per main run (shortened from
#                           the default 50,000 so that the suite fits)
#   TIERFS_TEST_TIMEOUT     per-test hang guard of conftest.py [BUDGET]
#   TIERFS_XFS_IMAGE        a gzipped empty XFS image for the tests that
#                           need XFS with reflink where mkfs.xfs is missing
#                           [build-gpu/xfs-empty.img.gz, made by prep]
#   SKIP_UNIT=1, SKIP_PYTEST=1   leave a half out
#   UNITS=                  run only these unit programs (space-separated,
#                           paths under build-gpu/, e.g.
#                           UNITS=tests/gpu/test_gpu_hash)
#
# usage: tests/gpu/run.sh [prep]
#
set -uo pipefail

TOP=$(cd "$(dirname "$0")/../.." && pwd)
cd "$TOP" || exit 1
BUILD=build-gpu
LIBDIR=.devlibs

say() { printf '==> %s\n' "$*"; }
die() { printf 'run.sh: %s\n' "$*" >&2; exit 1; }

# ---- prep: on the build machine ------------------------------------------
prep() {
	local jobs=${JOBS:-2} lib path

	if [ ! -x configure ] || [ ! -f Makefile.in ]; then
		say "autoreconf -fi"
		autoreconf -fi || die "autoreconf failed"
	fi
	mkdir -p "$BUILD" || die "cannot create $BUILD"
	(
		cd "$BUILD" || exit 1
		if [ ! -f Makefile ] || ! grep -q '^NVCC_ARCH = sm_90' Makefile; then
			say "configure NVCC_ARCH=sm_90 (in $BUILD/)"
			../configure NVCC_ARCH=sm_90 || exit 1
		fi
		grep -q '^#define HAVE_CUDA 1' config.h ||
			{ echo "run.sh: $BUILD is configured without CUDA" >&2; exit 1; }
		say "make -j$jobs"
		make -j"$jobs" || exit 1
		say "make check TESTS= (build the check programs, run none)"
		make -j"$jobs" check TESTS= || exit 1
		if [ ! -x tests/unit/test_gpu_tier ] ||
		   [ ../tests/unit/test_gpu_tier.c -nt tests/unit/test_gpu_tier ] ||
		   [ ../tiers/gpu_tier.c -nt tests/unit/test_gpu_tier ] ||
		   [ libtiers.a -nt tests/unit/test_gpu_tier ]; then
			say "build tests/unit/test_gpu_tier"
			mkdir -p tests/unit
			# shellcheck disable=SC2046
			gcc -std=gnu11 -D_GNU_SOURCE -O2 -g -Wall -Wextra \
			    -Wno-unused-parameter -pthread \
			    -I. -I../common -I../tiers -I../gpu \
			    -o tests/unit/test_gpu_tier \
			    ../tests/unit/test_gpu_tier.c ../tiers/gpu_tier.c \
			    libtiers.a libgpucuda.a libcommon.a -lxxhash -ldl -lpthread \
			    $(pkg-config --libs liburing) || exit 1
		fi
	) || die "building $BUILD failed"

	[ -x "$BUILD/tierfs" ] || die "$BUILD/tierfs was not built"
	mkdir -p "$LIBDIR" || die "cannot create $LIBDIR"
	for lib in libfuse3.so.3 liburing.so.2 libxxhash.so.0; do
		path=$(ldd "$BUILD/tierfs" | awk -v l="$lib" '$1 == l { print $3 }')
		if [ -z "$path" ] || [ ! -f "$path" ]; then
			die "$BUILD/tierfs does not load $lib from a file (ldd)"
		fi
		cp -L "$path" "$LIBDIR/$lib" || die "cannot copy $path"
		say "$LIBDIR/$lib <- $path"
	done
	# an empty XFS image with reflink for the tests that need one
	# (conftest.py's xfs fixture), where the GPU machine lacks xfsprogs
	if command -v mkfs.xfs >/dev/null 2>&1 && [ ! -f "$BUILD/xfs-empty.img.gz" ]; then
		rm -f "$BUILD/xfs-empty.img"
		truncate -s 1G "$BUILD/xfs-empty.img" &&
			mkfs.xfs -q -m reflink=1 "$BUILD/xfs-empty.img" &&
			gzip -n "$BUILD/xfs-empty.img" &&
			say "$BUILD/xfs-empty.img.gz: an empty XFS image (the xfs fixture)"
		rm -f "$BUILD/xfs-empty.img"
	fi
	say "ready to carry: $(du -sh "$BUILD" | cut -f1) in $BUILD/, \
$(du -sh "$LIBDIR" | cut -f1) in $LIBDIR/ (the carry limit is 64 MiB)"
}

# ---- the GPU machine -----------------------------------------------------
OUT=${OUT:-/tmp/out}
BUDGET=${BUDGET:-560}
UNIT_TIMEOUT=${UNIT_TIMEOUT:-180}
n_pass=0 n_fail=0 n_skip=0
failed_units=

# Run one unit program under a timeout, its output and rc into unit.log.
run_unit() {
	local prog=$1 name rc t0 t1

	name=${prog#"$BUILD"/}
	t0=$SECONDS
	{
		printf '\n===== %s\n' "$name"
		TIERFS_GPU_DEV=${TIERFS_GPU} timeout -k 10 "$UNIT_TIMEOUT" "$prog"
		rc=$?
		t1=$SECONDS
		printf '===== %s: rc=%d (%d s)\n' "$name" "$rc" $((t1 - t0))
	} >>"$OUT/unit.log" 2>&1
	case $rc in
	0) n_pass=$((n_pass + 1)); say "unit $name: pass" ;;
	77) n_skip=$((n_skip + 1)); say "unit $name: skipped (77)" ;;
	124|137) n_fail=$((n_fail + 1)); failed_units="$failed_units $name"
		say "unit $name: TIMEOUT after ${UNIT_TIMEOUT}s" ;;
	*) n_fail=$((n_fail + 1)); failed_units="$failed_units $name"
		say "unit $name: FAIL (rc=$rc)" ;;
	esac
}

# Unmount what an interrupted pytest left behind: only mounts under this
# run's own --basetemp $1, never anyone else's.
cleanup_mounts() {
	local m
	awk -v p="$1/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r |
	while read -r m; do
		umount -l "$m" 2>/dev/null && echo "run.sh: unmounted leftover $m"
	done
}

gpu_run() {
	local prog left pyrc summary basetemp k_args=()

	export LD_LIBRARY_PATH=$TOP/$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	: "${TIERFS_GPU:=0}"
	mkdir -p "$OUT" || die "cannot create $OUT"
	rm -f "$OUT/unit.log" "$OUT/pytest.log" "$OUT/summary.txt"
	[ -x "$BUILD/tierfs" ] ||
		die "no $BUILD/tierfs: run 'tests/gpu/run.sh prep' on the build machine and carry $BUILD/ and $LIBDIR/"

	nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 ||
		say "nvidia-smi failed (see $OUT/nvidia-smi.txt)"
	{
		echo "date: $(date -u +%FT%TZ)"
		echo "uname: $(uname -a)"
		echo "id: $(id)"
		echo "/dev/fuse: $(ls -l /dev/fuse 2>&1)"
		echo "ulimit -l: $(ulimit -l)"
		echo "fusermount3: $(command -v fusermount3 || echo none)"
		echo "python3: $(python3 --version 2>&1)"
		echo "pytest: $(python3 -m pytest --version 2>&1 | head -1)"
		echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
		echo "ldd $BUILD/tierfs:"; ldd "$BUILD/tierfs" 2>&1
		echo "$BUILD/tierfs --version:"; "$BUILD/tierfs" --version 2>&1
	} >"$OUT/env.txt" 2>&1
	[ "$(id -u)" -eq 0 ] || say "warning: not root: the mount tests will fail"
	[ -c /dev/fuse ] || say "warning: no /dev/fuse: the mount tests will fail"

	if [ -z "${SKIP_UNIT:-}" ]; then
		: >"$OUT/unit.log"
		for prog in "$BUILD"/tests/unit/* "$BUILD"/tests/gpu/gpu_selftest \
			    "$BUILD"/tests/gpu/test_gpu_hash; do
			{ [ -f "$prog" ] && [ -x "$prog" ]; } || continue
			case $prog in *.o|*.a|*.sh|*.log|*.trs) continue ;; esac
			if [ -n "${UNITS:-}" ]; then
				case " $UNITS " in
				*" ${prog#"$BUILD"/} "*) ;;
				*) continue ;;
				esac
			fi
			run_unit "$prog"
		done
	fi

	pyrc=
	if [ -z "${SKIP_PYTEST:-}" ]; then
		left=$((BUDGET - SECONDS - 20))
		[ "$left" -ge 60 ] || left=60
		[ -n "${PYTEST_K:-}" ] && k_args=(-k "$PYTEST_K")
		basetemp=$(mktemp -d /tmp/tierfs-gpu-pytest.XXXXXX) ||
			die "mktemp failed"
		say "pytest (budget ${left}s, in $basetemp)${PYTEST_K:+, -k \"$PYTEST_K\"}"
		# shellcheck disable=SC2086
		[ -f "$BUILD/xfs-empty.img.gz" ] && [ -z "${TIERFS_XFS_IMAGE:-}" ] &&
			export TIERFS_XFS_IMAGE=$TOP/$BUILD/xfs-empty.img.gz
		TIERFS_BIN=$TOP/$BUILD/tierfs \
		TIERFS_GPU=$TIERFS_GPU \
		TIERFS_OPTIONS=${TIERFS_OPTIONS-gpu_cache=256M} \
		TIERFS_OPS=${TIERFS_OPS:-20000} \
		TIERFS_TEST_TIMEOUT=${TIERFS_TEST_TIMEOUT:-$left} \
		timeout -k 15 "$left" python3 -m pytest -x -q -ra -p no:cacheprovider \
			--basetemp="$basetemp" \
			${k_args[@]+"${k_args[@]}"} ${PYTEST_ARGS:-} tests/ >"$OUT/pytest.log" 2>&1
		pyrc=$?
		[ "$pyrc" -eq 124 ] || [ "$pyrc" -eq 137 ] &&
			echo "run.sh: pytest stopped after its budget of ${left}s" >>"$OUT/pytest.log"
		cleanup_mounts "$basetemp" >>"$OUT/pytest.log" 2>&1
	fi

	{
		echo "tierfs GPU run on: $(nvidia-smi --query-gpu=name,driver_version,memory.total \
			--format=csv,noheader 2>/dev/null | head -1)"
		echo "unit programs: $n_pass passed, $n_fail failed, $n_skip skipped${failed_units:+ (failed:$failed_units)}"
		if [ -n "$pyrc" ]; then
			summary=$(grep -E '[0-9]+ (passed|failed|error|errors|skipped|deselected)' "$OUT/pytest.log" | tail -1)
			echo "pytest: rc=$pyrc ${summary:-(no summary line: see pytest.log)}"
		fi
		echo "total time: ${SECONDS}s; logs in $OUT"
	} | tee "$OUT/summary.txt"

	[ "$n_fail" -eq 0 ] && { [ -z "$pyrc" ] || [ "$pyrc" -eq 0 ]; }
}

case ${1:-} in
prep) prep ;;
'') gpu_run ;;
-h|--help)
	awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0" ;;
*) die "unexpected argument '$1' (see --help)" ;;
esac
