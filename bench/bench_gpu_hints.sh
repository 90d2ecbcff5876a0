#!/bin/bash
#
# bench_gpu_hints.sh - GPU checkpoints restored through tierfs (all restore
# hints) against the unified-memory baseline of hpdc23 §5.2.2 and a raw
# device-copy ceiling, on one GPU (bench_gpu_hints.c: see its header).
#
# Mounts, in the background (-f, its log in WORK),
#     BUILD/tierfs WORK/backing WORK/mnt -f \
#         -o gpu=GPU,gpu_cache=GPU_CACHE,host_cache=HOST_CACHE[,TIERFS_OPTS]
# waits for the mount and for its GPU tier (user.tierfs.stats shows a "gpu"
# tier, fully mapped), then for each restore order in ORDERS runs
#     BUILD/bench/bench_gpu_hints --mode MODES --dir WORK/mnt/run.ORDER ...
# (tierfs, um and raw one after the other on the same sizes and order; um
# is bounded by the same GPU_CACHE), then unmounts (umount; fusermount3 -u
# where umount is refused) and waits for the daemon to exit.  Last, a
# summary: restore and checkpoint GB/s per order and mode, the tierfs/um
# restore ratio, and the target (printed, not asserted): tierfs restore >=
# TARGET x um.  GB = 10^9 bytes; throughput = bytes / time blocked in the
# checkpoint or restore calls.
#
# usage: bench/bench_gpu_hints.sh BUILD [extra bench_gpu_hints options...]
#        (root: mount and umount; a GPU and its driver)
#
# environment (defaults in brackets):
#   K=32 S=64M            checkpoints per shot and their mean size (2 GiB)
#   SIZES=var             uniform or var (bench_hints' size spread)
#   ORDERS="seq rev irr"  restore orders (ORDER= is taken as ORDERS=)
#   MODES=tierfs,um,raw   modes of every run
#   GPU=0                 CUDA device of the mount and of the benchmark
#   GPU_CACHE=1G          the mount's gpu_cache and um's GPU-resident bound
#   HOST_CACHE=4G         the mount's host_cache
#   INTERVAL=10           compute interval, milliseconds (hpdc23: 10 ms)
#   SEED=1                sizes and irregular order
#   TARGET=10             the restore ratio the target line asks for
#   TIERFS_OPTS=          more -o options for tierfs (comma separated)
#   WORK=/var/tmp/tierfs-gpu-hints.PID   backing dir, mount point, logs
#   KEEP=0                1: leave WORK (backing files, tierfs log)
#   OUT=                  also append the output to this file
#
set -euo pipefail

die() { echo "bench_gpu_hints.sh: $*" >&2; exit 2; }
usage() { awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }

case ${1:-} in
-h|--help) usage; exit 0 ;;
'') usage >&2; exit 2 ;;
esac

BUILD=$(cd "$1" && pwd) || die "no build directory '$1'"
shift
TIERFS=$BUILD/tierfs
BIN=$BUILD/bench/bench_gpu_hints

K=${K:-32}
S=${S:-64M}
SIZES=${SIZES:-var}
ORDERS=${ORDERS:-${ORDER:-seq rev irr}}
MODES=${MODES:-tierfs,um,raw}
GPU=${GPU:-0}
GPU_CACHE=${GPU_CACHE:-1G}
HOST_CACHE=${HOST_CACHE:-4G}
INTERVAL=${INTERVAL:-10}
SEED=${SEED:-1}
TARGET=${TARGET:-10}
KEEP=${KEEP:-0}
GPU_WAIT=${GPU_WAIT:-120}
WORK=${WORK:-/var/tmp/tierfs-gpu-hints.$$}

[ -x "$TIERFS" ] || die "no tierfs binary at $TIERFS"
[ -x "$BIN" ] || die "no $BIN (make bench/bench_gpu_hints in $BUILD; needs CUDA at configure)"
[ -e /dev/fuse ] || die "no /dev/fuse"

# the benchmark binary runs (the GPU is checked by the mount and the runs)
rc=0
"$BIN" -k 1 -s 64K --print-sizes > /dev/null || rc=$?
[ "$rc" = 0 ] || die "$BIN does not run (exit $rc)"

BACKING=$WORK/backing
MNT=$WORK/mnt
LOG=$WORK/tierfs.log
RESULTS=$WORK/results.csv
DPID=

# running, not a zombie
alive() { [ -n "$1" ] && [ -d "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

# the stats JSON of the mount on stdout; fails without a tool to read it
stats() {
	if command -v getfattr > /dev/null; then
		getfattr --absolute-names --only-values -n user.tierfs.stats "$MNT" 2>/dev/null
	elif command -v python3 > /dev/null; then
		python3 -c 'import os, sys; sys.stdout.write(os.getxattr(sys.argv[1], "user.tierfs.stats").decode())' \
			"$MNT" 2>/dev/null
	else
		return 1
	fi
}

# unmount (if mounted) and wait for the daemon to write back and exit
unmount() {
	local rc=0
	if mountpoint -q "$MNT" 2>/dev/null; then
		umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" 2>/dev/null ||
			umount -l "$MNT" || true
	fi
	[ -n "$DPID" ] || return 0
	for _ in $(seq 3000); do
		alive "$DPID" || break
		sleep 0.1
	done
	if alive "$DPID"; then
		echo "bench_gpu_hints.sh: tierfs (pid $DPID) still running 300 s after unmount: stopping it" >&2
		kill "$DPID" 2>/dev/null || true
		sleep 2
		if alive "$DPID"; then kill -9 "$DPID" 2>/dev/null || true; fi
	fi
	wait "$DPID" 2>/dev/null || rc=$?
	[ "$rc" = 0 ] || echo "bench_gpu_hints.sh: tierfs (pid $DPID) exited with status $rc" >&2
	DPID=
}

# shellcheck disable=SC2317  # runs from the EXIT trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	unmount
	if [ "$KEEP" != 1 ] && ! mountpoint -q "$MNT" 2>/dev/null; then
		rm -rf -- "$WORK"
	else
		echo "bench_gpu_hints.sh: kept $WORK" >&2
	fi
	exit "$rc"
}

mkdir -p "$BACKING" "$MNT"
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[ -z "${OUT:-}" ] || exec > >(tee -a "$OUT") 2>&1

echo "# tierfs bench_gpu_hints: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  $(uname -r)  $(nproc) cpus" \
     "$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 2^20 }' /proc/meminfo)"
if command -v nvidia-smi > /dev/null; then
	echo "# GPU: $(nvidia-smi -i "$GPU" --query-gpu=name,driver_version,memory.total,memory.used \
		--format=csv,noheader 2>/dev/null || echo '?')"
fi
OPTS=gpu=$GPU,gpu_cache=$GPU_CACHE,host_cache=$HOST_CACHE${TIERFS_OPTS:+,$TIERFS_OPTS}
echo "# K=$K S=$S SIZES=$SIZES ORDERS=\"$ORDERS\" MODES=$MODES INTERVAL=${INTERVAL}ms SEED=$SEED"
echo "# tierfs: $TIERFS $BACKING $MNT -f -o $OPTS"

"$TIERFS" "$BACKING" "$MNT" -f -o "$OPTS" >> "$LOG" 2>&1 &
DPID=$!
for _ in $(seq 300); do
	mountpoint -q "$MNT" && break
	alive "$DPID" || break
	sleep 0.1
done
mountpoint -q "$MNT" || die "tierfs did not mount $MNT within 30 s: $(tail -n 5 "$LOG")"

# the GPU tier is built in the background after the mount appears
t=0
while :; do
	if grep -q "GPU tier: not available" "$LOG"; then
		die "tierfs has no GPU tier: $(grep "GPU tier" "$LOG" | tail -n 1)"
	fi
	js=$(stats) || { echo "# (no getfattr or python3: bench_gpu_hints waits for the GPU tier)"; break; }
	case $js in *'"fully_mapped":true'*) break ;; esac
	[ "$t" -lt $(( GPU_WAIT * 10 )) ] || die "the GPU tier did not come up in ${GPU_WAIT}s: $(tail -n 5 "$LOG")"
	t=$(( t + 1 ))
	sleep 0.1
done
echo "# GPU tier up after $(awk -v t="$t" 'BEGIN { printf "%.1f", t / 10 }') s"

failed=0
: > "$RESULTS"
for ord in $ORDERS; do
	echo
	echo "## order $ord"
	alive "$DPID" || die "tierfs (pid $DPID) is gone: $(tail -n 5 "$LOG")"
	rc=0
	"$BIN" --mode "$MODES" --dir "$MNT/run.$ord" -k "$K" -s "$S" --sizes "$SIZES" \
		-o "$ord" -c "$INTERVAL" --seed "$SEED" -g "$GPU_CACHE" --device "$GPU" \
		--target "$TARGET" "$@" > "$WORK/run.$ord.out" 2>&1 || rc=$?
	cat "$WORK/run.$ord.out"
	grep '^result,' "$WORK/run.$ord.out" >> "$RESULTS" || true
	if [ "$rc" != 0 ]; then
		failed=$(( failed + 1 ))
		echo "bench_gpu_hints.sh: order $ord: bench_gpu_hints exited with status $rc"
	fi
done

unmount
echo
echo "# tierfs log (last lines):"
tail -n 5 "$LOG" | sed 's/^/#   /'

# result,MODE,SIZES,ORDER,K,S_bytes,ckpt_GBps,restore_GBps,restore_vs_um,fwd_wall_s,bwd_wall_s
echo
echo "summary: GB/s (10^9 B/s of time blocked in checkpoint / restore calls), sizes $SIZES"
awk -F, -v orders="$ORDERS" -v target="$TARGET" '
function get(a, o, m) { return ((o, m) in a) ? a[o, m] : "-" }
function ratio(o) {
	if (!((o, "tierfs") in rs) || !((o, "um") in rs) || rs[o, "um"] <= 0)
		return ""
	return rs[o, "tierfs"] / rs[o, "um"]
}
{ ck[$4, $2] = $7; rs[$4, $2] = $8 }
END {
	n = split(orders, O, " ")
	printf "%-6s %12s %12s %12s %12s %12s %12s %18s\n", "order", "tierfs ckpt",
		"um ckpt", "raw ckpt", "tierfs rest", "um rest", "raw rest", "restore tierfs/um"
	for (i = 1; i <= n; i++) {
		o = O[i]
		v = ratio(o)
		printf "%-6s %12s %12s %12s %12s %12s %12s %18s\n", o,
			get(ck, o, "tierfs"), get(ck, o, "um"), get(ck, o, "raw"),
			get(rs, o, "tierfs"), get(rs, o, "um"), get(rs, o, "raw"),
			(v == "" ? "-" : sprintf("%.2fx", v))
	}
	print ""
	print "target (printed, not asserted): tierfs restore >= " target "x um, all hints:"
	for (i = 1; i <= n; i++) {
		v = ratio(O[i])
		if (v == "")
			printf "  %-4s n/a\n", O[i]
		else
			printf "  %-4s %.2fx  %s\n", O[i], v, (v >= target ? "PASS" : "FAIL")
	}
}' "$RESULTS"

[ "$failed" = 0 ] || { echo "bench_gpu_hints.sh: $failed runs failed" >&2; exit 1; }
