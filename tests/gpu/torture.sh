#!/bin/bash
#
# tests/gpu/torture.sh - the torture harness (tests/torture.py) against a
# daemon with a real GPU tier, several seeded runs at once, on the GPU
# machine, from a tree prepared by `tests/gpu/run.sh prep`.
#
# Each run mounts build-gpu/tierfs with -o gpu=$TIERFS_GPU and a small GPU
# cache and host cache (cache pressure: copies cascade and are evicted all
# the time); half the runs also SIGKILL the daemon at random moments.  A run
# passes when the model checks of torture.py pass.
#
# Environment (defaults in brackets):
#   OUT=/tmp/out        logs: torture-SEED.log, summary (torture.txt)
#   RUNS=8              runs, all at once
#   SECONDS_EACH=120    seconds per run
#   SEED0=100           seeds SEED0 .. SEED0+RUNS-1 (odd seeds crash)
#   TIERFS_GPU=0        device
#   GPU_CACHE=64M HOST_CACHE=16M
#   EXTRA_OPTS=         more -o options for every run
#
# usage: tests/gpu/torture.sh     (exit 0 when every run passed)
#
set -uo pipefail

TOP=$(cd "$(dirname "$0")/../.." && pwd)
cd "$TOP" || exit 1
: "${OUT:=/tmp/out}" "${RUNS:=8}" "${SECONDS_EACH:=120}" "${SEED0:=100}"
: "${TIERFS_GPU:=0}" "${GPU_CACHE:=64M}" "${HOST_CACHE:=16M}" "${EXTRA_OPTS:=}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$TOP/.devlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TIERFS_BIN="$TOP/build-gpu/tierfs"
[ -x "$TIERFS_BIN" ] || { echo "torture.sh: no $TIERFS_BIN (run tests/gpu/run.sh prep)" >&2; exit 1; }

opts="gpu=$TIERFS_GPU,gpu_cache=$GPU_CACHE${EXTRA_OPTS:+,$EXTRA_OPTS}"
pids=()
for ((i = 0; i < RUNS; i++)); do
	seed=$((SEED0 + i))
	crash=()
	((seed % 2)) && crash=(--crash)
	python3 tests/torture.py --seed "$seed" --seconds "$SECONDS_EACH" \
		--host-cache "$HOST_CACHE" --mount-opts "$opts" "${crash[@]}" \
		--workdir "/tmp/torture-$seed" > "$OUT/torture-$seed.log" 2>&1 &
	pids+=($!)
done
fail=0
for ((i = 0; i < RUNS; i++)); do
	seed=$((SEED0 + i))
	if wait "${pids[$i]}"; then
		r=PASS
	else
		r=FAIL
		fail=1
	fi
	printf '%s seed %d%s: %s\n' "$r" "$seed" "$(((seed % 2)) && echo ' (kills)')" \
		"$(grep -E 'operations|PASS|FAIL' "$OUT/torture-$seed.log" | tail -1)" |
		tee -a "$OUT/torture.txt"
done
exit $fail
