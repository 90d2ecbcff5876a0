#!/bin/bash
#
# bench_meta.sh - metadata and small-file speed of tierfs against its
# baselines, in one run:
#   plain           a plain directory on the same disk
#   passthrough_ll  libfuse's passthrough_ll example over a directory of the
#                   same disk (compiled from libfuse3-dev's examples)
#   tierfs          BUILD/tierfs over a directory of the same disk
# Workloads: bench_meta (P processes of fsstress-like operations: create,
# mkdir, rmdir, rename, unlink, link, chmod, truncate, stat, append,
# readdir, write+fsync, read) and, where dbench is installed, dbench with C
# clients for T seconds.  Each cell is the median of R runs, with the
# spread (min-max); the runs go round the targets in turn.
#
# usage: bench/bench_meta.sh BUILD
#
# environment (defaults in brackets):
#   P=4 N=5000        bench_meta processes and operations per process
#   C=4 T=30          dbench clients and seconds (T=0: no dbench)
#   R=3               runs per cell
#   WORK=/var/tmp/tierfs-meta.PID    TIERFS_OPTS=host_cache=256M
#   TIERFS_BINS=      more tierfs binaries to compare ("label=path ...")
#   IMAGE_FS=         ext4 or xfs: run on that file system, made on an 8 GiB
#                     sparse image in WORK and loop-mounted (a journalled file
#                     system of known options, whatever the disk's own is)
#
set -euo pipefail

BUILD=$(cd "${1:?usage: bench_meta.sh BUILD}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
P=${P:-4}; N=${N:-5000}; C=${C:-4}; T=${T:-30}; R=${R:-3}
WORK=${WORK:-/var/tmp/tierfs-meta.$$}
TIERFS_OPTS=${TIERFS_OPTS:-host_cache=256M}
EX=/usr/share/doc/libfuse3-dev/examples

. "$(dirname "$0")/work_fs.sh"
work_fs bench_meta.sh 8G

cc -O2 -o "$WORK/bench_meta" "$HERE/bench_meta.c"
PT=""
if [ -f "$EX/passthrough_ll.c" ]; then
	cc -O2 -o "$WORK/passthrough_ll" "$EX/passthrough_ll.c" $(pkg-config --cflags --libs fuse3) &&
		PT="$WORK/passthrough_ll"
fi

# mount KIND LABEL: prints the directory to use
mount_it() {
	local kind=$1 bin=${2:-} dir="$WORK/data" mnt="$WORK/mnt"
	rm -rf "$dir"; mkdir -p "$dir" "$mnt"
	case $kind in
	plain) echo "$dir"; return ;;
	passthrough_ll) "$PT" -o source="$dir" "$mnt" ;;
	tierfs) "$bin" "$dir" "$mnt" -f -o "$TIERFS_OPTS" >"$WORK/tierfs.log" 2>&1 &
		echo $! >"$WORK/pid" ;;
	esac
	for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
	mountpoint -q "$mnt" || { echo "bench_meta.sh: $kind did not mount" >&2; exit 1; }
	echo "$mnt"
}
unmount_it() {
	local mnt="$WORK/mnt"
	mountpoint -q "$mnt" || return 0
	umount "$mnt"
	if [ -f "$WORK/pid" ]; then	# the daemon flushes, then exits
		while kill -0 "$(cat "$WORK/pid")" 2>/dev/null; do sleep 0.1; done
		rm -f "$WORK/pid"
	fi
	return 0
}

median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.0f (%.0f-%.0f)", v[int((NR + 1) / 2)], v[1], v[NR] }'; }

configs="plain"
[ -n "$PT" ] && configs="$configs passthrough_ll"
configs="$configs tierfs=$BUILD/tierfs ${TIERFS_BINS:-}"

# Round-robin: run r of every target before run r+1 of any, so that a
# change in the machine's load (it is shared) falls on all targets alike.
declare -A M D
for _ in $(seq "$R"); do
	for cfg in $configs; do
		label=${cfg%%=*}; bin=${cfg#*=}
		kind=$label; case $cfg in *=*) kind=tierfs ;; esac
		dir=$(mount_it "$kind" "$bin")
		M[$label]="${M[$label]:-} $("$WORK/bench_meta" "$dir" -p "$P" -n "$N" | awk '{ print $(NF-1) }')"
		unmount_it
		if [ "$T" -gt 0 ] && command -v dbench >/dev/null; then
			dir=$(mount_it "$kind" "$bin")
			D[$label]="${D[$label]:-} $(dbench -D "$dir" -t "$T" "$C" 2>/dev/null |
				awk '/^Throughput/ { print $2 }')"
			unmount_it
		fi
	done
done

printf "%-22s %-26s %s\n" "target" "bench_meta ops/s (P=$P)" "dbench MB/s (C=$C, ${T}s)"
for cfg in $configs; do
	label=${cfg%%=*}
	m=${M[$label]}; d=${D[$label]:-}
	printf "%-22s %-26s %s\n" "$label" "$(echo $m | tr ' ' '\n' | median)" \
		"$( [ -n "$d" ] && echo $d | tr ' ' '\n' | median || echo -)"
done
