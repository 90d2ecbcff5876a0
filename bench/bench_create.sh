#!/bin/bash
#
# bench_create.sh - how long a checkpoint's create (open with O_CREAT) takes
# while the previous checkpoints are still going to the disk, tierfs
# against a plain directory of the same disk, in one run.
#
# The loop of a checkpointing application: create ckI, write S MiB, close,
# compute for GAP ms, next.  tierfs takes the write into its host cache
# and flushes it to the disk behind the application's back, so the next
# create meets a busy disk; the plain directory's page cache writes back
# the same way.  Reported per target: the create's latency (median, 90th
# and 99th percentile, max, in ms; medians over R runs) and how many
# creates of the run took over 2 ms.  The runs go round the targets in turn.
#
# usage: bench/bench_create.sh BUILD
#
# environment (defaults in brackets):
#   N=60 S=64 GAP=10   checkpoints per run, MiB each, ms between them
#   R=3                runs per target
#   WORK=/var/tmp/tierfs-create.PID    TIERFS_OPTS=host_cache=2G
#   TIERFS_BINS=       more tierfs binaries to compare ("label=path ...")
#   IMAGE_FS=          ext4 or xfs: on that file system, made on a 16 GiB
#                      sparse image in WORK and loop-mounted
#
set -euo pipefail

BUILD=$(cd "${1:?usage: bench_create.sh BUILD}" && pwd)
N=${N:-60}; S=${S:-64}; GAP=${GAP:-10}; R=${R:-3}
WORK=${WORK:-/var/tmp/tierfs-create.$$}
TIERFS_OPTS=${TIERFS_OPTS:-host_cache=2G}

. "$(dirname "$0")/work_fs.sh"
work_fs bench_create.sh 16G

cat >"$WORK/loop.py" <<'EOF'
import os, sys, time
d, n, size, gap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) << 20, float(sys.argv[4])
buf = os.urandom(size)
lat = []
for i in range(n):
    t0 = time.perf_counter()
    fd = os.open(os.path.join(d, f"ck{i}"), os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    lat.append((time.perf_counter() - t0) * 1e3)
    os.write(fd, buf)
    os.close(fd)
    time.sleep(gap / 1e3)
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
print(f"{q(0.5):.3f} {q(0.9):.3f} {q(0.99):.3f} {lat[-1]:.3f} {sum(x > 2 for x in lat)}")
EOF

mount_it() {
	local kind=$1 bin=${2:-} dir="$WORK/data" mnt="$WORK/mnt"
	rm -rf "$dir"; mkdir -p "$dir" "$mnt"
	case $kind in
	plain) echo "$dir"; return ;;
	tierfs) "$bin" "$dir" "$mnt" -f -o "$TIERFS_OPTS" >"$WORK/tierfs.log" 2>&1 &
		echo $! >"$WORK/pid" ;;
	esac
	for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
	mountpoint -q "$mnt" || { echo "bench_create.sh: $kind did not mount" >&2; exit 1; }
	sleep 1		# the host cache is touched in the background
	echo "$mnt"
}
unmount_it() {
	local mnt="$WORK/mnt"
	if mountpoint -q "$mnt"; then
		umount "$mnt"
		while kill -0 "$(cat "$WORK/pid")" 2>/dev/null; do sleep 0.1; done
		rm -f "$WORK/pid"
	fi
	sync
}

configs="plain tierfs=$BUILD/tierfs ${TIERFS_BINS:-}"
declare -A RES
for _ in $(seq "$R"); do
	for cfg in $configs; do
		label=${cfg%%=*}; bin=${cfg#*=}
		kind=$label; case $cfg in *=*) kind=tierfs ;; esac
		dir=$(mount_it "$kind" "$bin")
		RES[$label]="${RES[$label]:-}$(python3 "$WORK/loop.py" "$dir" "$N" "$S" "$GAP")
"
		unmount_it
	done
done

echo "# N=$N checkpoints of $S MiB, $GAP ms apart; medians of R=$R runs"
printf "%-12s %8s %8s %8s %8s  %s\n" target "p50 ms" "p90 ms" "p99 ms" "max ms" "creates > 2 ms (each run)"
med() { sort -g | awk '{ v[NR] = $1 } END { printf " %8.3f", v[int((NR + 1) / 2)] }'; }
for cfg in $configs; do
	label=${cfg%%=*}
	printf "%-12s" "$label"
	for col in 1 2 3 4; do
		printf '%s' "${RES[$label]}" | awk -v c=$col '{ print $c }' | med
	done
	printf "  %s\n" "$(printf '%s' "${RES[$label]}" | awk '{ print $5 }' | tr '\n' ' ')"
done
