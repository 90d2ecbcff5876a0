#!/bin/bash
#
# run-all.sh - the test command of tierfs (CI runs exactly this).
#
# From the top of the source tree: autoreconf -fi, then three out-of-tree
# builds, each configured, built and checked with `make check` (C unit
# tests of tiers/, then the pytest suites that mount a real tierfs):
#
#   build/        ../configure                           (the default build)
#   build-asan/   ../configure --enable-sanitizers       (ASan + UBSan)
#   build-tsan/   ../configure --enable-sanitizers=thread (ThreadSanitizer:
#                 the unit tests with threads of their own, and of the
#                 pytest suites the torture runs and the integrity and
#                 restore-hint tests)
#
# Each build runs the torture harness (tests/torture.py, via
# tests/test_torture.py) for a few minutes: runs of 20 s (12 s under the
# sanitizers), with and without kills, each followed by its final checks.
#
# Time: the first build is compiled here; the others compile in the
# background, one after the other at a lower priority, while the first
# one's tests run (which wait on FUSE requests, fsync and daemons more than
# on the CPU).  The pytest suites run in PYTEST_JOBS workers (pytest-xdist:
# 4, and 2 under TSan; 1 where xdist is missing), and the unit tests beside
# them (make -jJOBS check: run-pytest.sh starts first).  Measured on the
# 2-core VM from a fresh clone (commit 34a9b90): build/ compiled in 70 s,
# checked in 537 s; build-asan/ checked in 587 s and build-tsan/ in 359 s,
# both compiled meanwhile: 1,553 s in all (tests/README.md has the
# history).
#
# Seeds are fixed by default and printed by every randomised test (C unit
# programs, the exerciser, the torture runs, the crash states): two runs of
# this command run the same operation sequences.  TIERFS_RANDOM_SEED=1 draws
# each seed at random instead (a soak: new cases, still printed); a failing
# seed is replayed with the test's own variable below (or a unit program's
# argument).  The long torture run is behind TIERFS_TORTURE_LONG=1, never in
# the default command.  tests/README.md, "Seeds", has the list.
#
# The pytest suites mount FUSE file systems and a tmpfs: run as root, with
# /dev/fuse present.  Exits 0 when all builds pass, 1 otherwise; the
# test-suite.log of a failing build is printed.
#
# usage: sudo tests/run-all.sh
#
# environment (defaults in brackets):
#   PYTEST_ARGS=        extra pytest arguments for every build, e.g. "-x -k posix"
#   TIERFS_OPS=50000    exerciser operations per main run, default build
#                       (and half of it in the 1 MiB cache: 75,000 operations)
#   TIERFS_ASAN_OPS=10000   the same for the sanitizer build (it runs slower)
#   TIERFS_RANDOM_SEED= 1: random seeds everywhere instead of the fixed ones
#   TIERFS_SEED=        the exerciser's seed (default: fixed per run, printed)
#   TIERFS_TORTURE_SECONDS=20       seconds per torture run, default build
#   TIERFS_ASAN_TORTURE_SECONDS=12  the same for the AddressSanitizer build
#   TIERFS_TSAN_TORTURE_SECONDS=12  the same for the ThreadSanitizer build
#   TIERFS_SCALE_FILES=10000        files of test_scale.py, default build
#   TIERFS_ASAN_SCALE_FILES=5000    the same under AddressSanitizer
#   TIERFS_CRASH_STATES=40          crash states checked per file system,
#                       default build (the daemon runs the same workload;
#                       the states are checked by mounting disk images)
#   TIERFS_ASAN_CRASH_STATES=10     the same under AddressSanitizer
#   TIERFS_TSAN_INTEGRITY_ROUNDS=8  rounds of test_integrity_engine.py's
#                       concurrent writers under ThreadSanitizer (15 elsewhere)
# The sanitizer builds leave out the install tests, the torture harness's
# own checks on a plain directory (no daemon runs in them), the call-graph
# check (tests/check-calls.sh: the same in every build) and the GPU hash
# kernel run on the CPU (compiled without the sanitizers: they do not
# follow its coroutines).
#   TIERFS_TORTURE_SEED=            the torture harness's seed (default 1)
#   BUILDS="build build-asan build-tsan"   the builds to run
#   PYTEST_JOBS=        pytest workers per build (4; 2 under TSan; 1: no xdist)
#   JOBS=$(nproc)       parallel make jobs
#
set -uo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-$(nproc)}

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'run-all.sh: %s\n' "$*" >&2; exit 1; }

case ${1:-} in
-h|--help)
	awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
	exit 0 ;;
'') ;;
*) die "unexpected argument '$1' (see --help)" ;;
esac

# ---- preconditions: checked first, so that nothing is built in vain -------
if [ "$(id -u)" -ne 0 ]; then
	die "the tests mount FUSE file systems and tmpfs and need root: run 'sudo $0'"
fi
if [ ! -c /dev/fuse ]; then
	modprobe fuse >/dev/null 2>&1 || true
fi
if [ ! -c /dev/fuse ]; then
	die "/dev/fuse is missing: load the fuse module (modprobe fuse), or in a
container pass the device through (docker run --device /dev/fuse --cap-add SYS_ADMIN)"
fi
if [ -f "$TOP/config.status" ]; then
	die "$TOP is configured in place (./config.status exists); the out-of-tree
builds need a clean source tree: run 'make distclean' in $TOP first"
fi

cd "$TOP" || exit 1
say "autoreconf -fi"
autoreconf -fi || die "autoreconf failed"

failed=()

BUILDS=${BUILDS:-build build-asan build-tsan}
want() { case " $BUILDS " in *" $1 "*) return 0 ;; esac; return 1; }

# The configure arguments of each build.
args_of() {
	case $1 in
	build) ;;
	build-asan) echo --enable-sanitizers ;;
	build-tsan) echo --enable-sanitizers=thread ;;
	esac
}

# compile DIR: configure and make one build dir (in a subshell); its
# outcome is left in DIR/.compiled (ok or failed), for a check waiting on it.
compile() {
	local dir=$1
	(
		mkdir -p "$TOP/$dir" && cd "$TOP/$dir" || exit 1
		rm -f .compiled
		say "$dir: ../configure $(args_of "$dir")"
		# shellcheck disable=SC2046
		if ! ../configure $(args_of "$dir"); then
			echo "configure failed in $dir; the end of $dir/config.log:" >&2
			tail -n 40 config.log >&2
			echo failed >.compiled
			exit 1
		fi
		say "$dir: make -j$JOBS"
		if ! make -j"$JOBS"; then
			echo failed >.compiled
			exit 1
		fi
		echo ok >.compiled
	)
}

# tests_of KEEP|DROP NAME...: the build's tests (make print-tests, in the
# build dir) whose file names are among NAMEs (KEEP) or are not (DROP).
tests_of() {
	local how=$1 t n keep out=()
	shift
	for t in $(make -s print-tests); do
		keep=$([ "$how" = KEEP ] && echo 0 || echo 1)
		for n in "$@"; do
			if [ "${t##*/}" = "$n" ]; then
				keep=$((1 - keep))
				break
			fi
		done
		if [ "$keep" = 1 ]; then
			out+=("$t")
		fi
	done
	echo "${out[*]}"
}

# check DIR OPS [KEEP|DROP NAME...]: `make check` of a compiled build dir,
# all of its tests or those tests_of picks.  A dir compiled in the
# background is waited for, and its compile log shown first.
check() {
	local dir=$1 ops=$2 t0=$SECONDS
	shift 2
	if [ -f "$TOP/$dir.compile.log" ]; then
		while [ ! -f "$TOP/$dir/.compiled" ]; do
			sleep 2
		done
		say "$dir: compiled in the background (waited $((SECONDS - t0)) s); its log:"
		tail -n 30 "$TOP/$dir.compile.log"
	fi
	[ "$(cat "$TOP/$dir/.compiled" 2>/dev/null)" = ok ] || return 1
	cd "$TOP/$dir" || return 1
	local tests=()
	if [ $# -gt 0 ]; then
		tests=("TESTS=$(tests_of "$@")")
	fi
	say "$dir: make -j$JOBS check (TIERFS_OPS=$ops, PYTEST_JOBS=$PYTEST_JOBS${PYTEST_ARGS:+, PYTEST_ARGS=$PYTEST_ARGS}${tests:+, ${tests[*]}})"
	if ! TIERFS_OPS=$ops make -j"$JOBS" check "${tests[@]}"; then
		echo
		echo "==> $dir: make check failed; $dir/test-suite.log follows"
		cat test-suite.log 2>/dev/null || echo "(no test-suite.log in $dir)"
		say "$dir: failed after $((SECONDS - t0)) s"
		return 1
	fi
	say "$dir: checked in $((SECONDS - t0)) s"
	return 0
}

# The first build is compiled here; the others in the background, one
# after the other at a lower priority, while the first one's tests run
# (they wait on FUSE requests, fsync and the daemons more than on the CPU).
first=
later=()
for dir in $BUILDS; do
	case $dir in
	build|build-asan|build-tsan) ;;
	*) die "unknown build '$dir' (build, build-asan, build-tsan)" ;;
	esac
	if [ -z "$first" ]; then first=$dir; else later+=("$dir"); fi
done
t_all=$SECONDS
rm -f "$TOP"/build*.compile.log
if [ ${#later[@]} -gt 0 ]; then
	for dir in "${later[@]}"; do
		mkdir -p "$TOP/$dir" && rm -f "$TOP/$dir/.compiled"
	done
	(
		for dir in "${later[@]}"; do
			nice -n 10 bash -c "$(declare -f say args_of compile); TOP='$TOP' JOBS='$JOBS' compile '$dir'" \
				>"$TOP/$dir.compile.log" 2>&1 || true
			[ -f "$TOP/$dir/.compiled" ] || echo failed >"$TOP/$dir/.compiled"
		done
	) &
	for dir in "${later[@]}"; do
		: >"$TOP/$dir.compile.log"
	done
fi
t0=$SECONDS
compile "$first" || failed+=("$first")
say "$first: compiled in $((SECONDS - t0)) s"

# run DIR: check one build with its own settings.
run() {
	local dir=$1
	case $dir in
	build)
		# The default build runs the full exerciser, and every test.
		TIERFS_TORTURE_SECONDS=${TIERFS_TORTURE_SECONDS:-20} \
		TIERFS_SCALE_FILES=${TIERFS_SCALE_FILES:-10000} \
		TIERFS_CRASH_STATES=${TIERFS_CRASH_STATES:-40} \
		PYTEST_JOBS=${PYTEST_JOBS:-4} check build "${TIERFS_OPS:-50000}"
		;;
	build-asan)
		# Leaks at exit are not reported (the daemon exits right after its
		# final flush and leaves its tables to the kernel); the daemon must
		# not abort on a report, so that the test that triggered it sees
		# the report in the daemon's log and fails with it.
		# The build's configure and install tests (test_python.py's
		# configure runs and make install) run in the default build
		# only: they run no daemon code, and a configure costs minutes
		# of the 2 cores.
		ASAN_OPTIONS="detect_leaks=0:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
		UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
		TIERFS_TORTURE_SECONDS=${TIERFS_ASAN_TORTURE_SECONDS:-12} \
		TIERFS_SCALE_FILES=${TIERFS_ASAN_SCALE_FILES:-5000} \
		TIERFS_CRASH_STATES=${TIERFS_ASAN_CRASH_STATES:-10} \
		PYTEST_K="not install and not test_torture_plain and not test_torture_detects_corruption" \
		PYTEST_JOBS=${PYTEST_JOBS:-4} check build-asan "${TIERFS_ASAN_OPS:-10000}" \
			DROP check-calls.sh test_hash_kernel_cpu
		;;
	build-tsan)
		# The unit tests, the torture runs and the integrity and
		# restore-hint suites (the concurrent writers, readers, evictions
		# and prefetches), not the rest (the daemon runs 5-15 times slower
		# under TSan, and they add little there).  Reports go to the
		# daemon's stderr, which the tests read (util.SANITIZER_LOG): a
		# report fails the test, and the daemon exits with status 66.  A
		# suppression goes to tests/tsan.supp with its reason.
		TSAN_OPTIONS="halt_on_error=0:exitcode=66:second_deadlock_stack=1:suppressions=$TOP/tests/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}" \
		TIERFS_TORTURE_SECONDS=${TIERFS_TSAN_TORTURE_SECONDS:-12} \
		TIERFS_INTEGRITY_ROUNDS=${TIERFS_TSAN_INTEGRITY_ROUNDS:-8} \
		PYTEST_K="(torture or integrity or hints) and not test_torture_plain and not test_torture_detects_corruption" \
		PYTEST_JOBS=${PYTEST_JOBS:-2} check build-tsan 0 \
			KEEP test_engine test_evict gpu_selftest test_gpu_hash_fake.sh run-pytest.sh
		;;
	esac
}

for dir in $BUILDS; do
	case " ${failed[*]} " in *" $dir "*) continue ;; esac
	run "$dir" || failed+=("$dir")
done
wait
say "all builds: $((SECONDS - t_all)) s"

# The names of the failing tests come last, where a log cut to its head and
# tail still shows them: pytest's short summary (-rfE) and the assertion
# lines ("E   ...") of each failing build's pytest run.
if [ ${#failed[@]} -ne 0 ]; then
	for dir in "${failed[@]}"; do
		log=$TOP/$dir/test-suite.log
		[ -f "$log" ] || continue
		say "$dir: failing tests"
		grep -E '^(FAIL|ERROR): ' "$log" | sort -u
		grep -E '^(FAILED|ERROR) ' "$log" | cut -c1-300
		grep -E '^E   ' "$log" | head -n 40 | cut -c1-300
	done
	say "FAILED: ${failed[*]}"
	exit 1
fi
say "all tests passed ($BUILDS)"
exit 0
