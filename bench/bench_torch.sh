#!/bin/bash
#
# bench_torch.sh - PyTorch checkpoints through tierfs against torch.save,
# DCP and a raw device copy (bench_torch.py: see its header).
#
# Mounts, in the background (-f, its log in WORK),
#     BUILD/tierfs WORK/backing WORK/mnt -f \
#         -o gpu=GPU,gpu_cache=GPU_CACHE,host_cache=HOST_CACHE[,TIERFS_OPTS]
# waits for the mount and its GPU tier, runs
#     python3 bench/bench_torch.py --mount WORK/mnt --local WORK/local \
#         --gib GIB --saves SAVES [--methods METHODS]
# with TIERFS_LIB=BUILD/.libs/libtierfs.so (the vectored GPU call), then
# unmounts and waits for the daemon to exit.  WORK/local is on the same disk
# as the backing directory.
#
# usage: bench/bench_torch.sh BUILD   (root: mount; a GPU, torch 2.x with CUDA)
#
# environment (defaults in brackets):
#   GIB=4 SAVES=5          the state dict's size and the saves per method
#   METHODS=               bench_torch.py's --methods (default: all)
#   GPU=0  GPU_CACHE=32G  HOST_CACHE=32G  TIERFS_OPTS=
#   WORK=/var/tmp/tierfs-torch.PID   backing dir, mount point, local dir, log
#   OUT=                   also append the output to this file
#
set -euo pipefail

die() { echo "bench_torch.sh: $*" >&2; exit 2; }
usage() { awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }

case ${1:-} in
-h|--help) usage; exit 0 ;;
'') usage >&2; exit 2 ;;
esac

BUILD=$(cd "$1" && pwd) || die "no build directory '$1'"
TOP=$(cd "$(dirname "$0")/.." && pwd)
GIB=${GIB:-4}
SAVES=${SAVES:-5}
GPU=${GPU:-0}
GPU_CACHE=${GPU_CACHE:-32G}
HOST_CACHE=${HOST_CACHE:-32G}
WORK=${WORK:-/var/tmp/tierfs-torch.$$}
OUT=${OUT:-}

[ -x "$BUILD/tierfs" ] || die "$BUILD/tierfs not built"
mkdir -p "$WORK/backing" "$WORK/mnt" "$WORK/local"
opts="gpu=$GPU,gpu_cache=$GPU_CACHE,host_cache=$HOST_CACHE${TIERFS_OPTS:+,$TIERFS_OPTS}"
"$BUILD/tierfs" "$WORK/backing" "$WORK/mnt" -f -o "$opts" >"$WORK/tierfs.log" 2>&1 &
pid=$!
cleanup() {
	umount "$WORK/mnt" 2>/dev/null || fusermount3 -u "$WORK/mnt" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 200); do
	mountpoint -q "$WORK/mnt" && break
	kill -0 "$pid" 2>/dev/null || die "tierfs exited: $(cat "$WORK/tierfs.log")"
	sleep 0.1
done
mountpoint -q "$WORK/mnt" || die "no mount after 20 s"
for _ in $(seq 600); do
	python3 -c 'import os, sys; sys.exit(b"\"gpu\"" not in os.getxattr(sys.argv[1], "user.tierfs.stats"))' "$WORK/mnt" 2>/dev/null && break
	grep -q "GPU tier: not available\|GPU tier: disabled" "$WORK/tierfs.log" && break
	sleep 0.1
done
echo "bench_torch.sh: tierfs $opts, $(nvidia-smi --query-gpu=name --format=csv,noheader -i "$GPU" 2>/dev/null)"
export TIERFS_LIB=$BUILD/.libs/libtierfs.so
set +e
python3 "$TOP/bench/bench_torch.py" --mount "$WORK/mnt" --local "$WORK/local" --gib "$GIB" \
	--saves "$SAVES" ${METHODS:+--methods "$METHODS"} 2>&1 | { if [ -n "$OUT" ]; then tee -a "$OUT"; else cat; fi; }
rc=${PIPESTATUS[0]}
set -e
tail -5 "$WORK/tierfs.log"
exit "$rc"
