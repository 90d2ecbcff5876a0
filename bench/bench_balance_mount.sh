#!/bin/bash
#
# bench/bench_balance_mount.sh - bench_balance_mount against one mount over
# the GPUs per balance policy (host, greedy, maxflow), made one after the
# other in one run, and a mount on GPU 0 alone as the baseline.
#
# usage: bench/bench_balance_mount.sh BUILD_DIR [CKPT_MIB FILL_MIB REPS GPU_CACHE]
#   defaults: 1024 MiB checkpoints, 1792 MiB held open on GPU 0, 5 runs,
#   gpu_cache=2G per GPU.  TIERFS_GPUS=0:1 names the GPUs (default 0:1).
#   Logs go to $OUT (default /tmp/out).
#
set -euo pipefail
B=${1:?usage: $0 BUILD_DIR [CKPT_MIB FILL_MIB REPS GPU_CACHE]}
CK=${2:-1024}; FILL=${3:-1792}; REPS=${4:-5}; GC=${5:-2G}
GPUS=${TIERFS_GPUS:-0:1}; N=$(awk -F: '{print NF}' <<<"$GPUS")
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/bbm.XXXXXX)
cleanup() { umount "$W/m" 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
run() {		# name, mount options
	rm -rf "$W/b" "$W/m"; mkdir -p "$W/b" "$W/m"
	"$B/tierfs" "$W/b" "$W/m" -f -o "$2",host_cache=8G,log=info \
		>"$OUT/bbm-$1.log" 2>&1 &
	for _ in $(seq 600); do
		python3 -c 'import os,sys; sys.exit(b"\"fully_mapped\":true" not in
			os.getxattr(sys.argv[1], "user.tierfs.stats"))' "$W/m" 2>/dev/null && break
		sleep 0.1
	done
	echo "== $1 ($2)"
	"$B/bench/bench_balance_mount" "$W/m" "$N" "$CK" "$FILL" "$REPS" | tail -1
	umount "$W/m"; wait
}
for pol in host greedy maxflow; do
	run "$pol" "gpu=$GPUS,gpu_cache=$GC,balance=$pol"
done
