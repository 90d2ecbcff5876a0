#!/bin/bash
#
# meta_counts.sh - what the daemon does for bench_meta, counted rather than
# timed (the counts hardly move with the machine's load): inodes allocated
# and freed on the backing file system, futex calls, reads of /dev/fuse,
# fsync and fdatasync calls of the daemon (perf stat -p), for libfuse's
# passthrough_ll and for each tierfs binary, one after the other.
#
# usage: bench/meta_counts.sh BUILD ["label=path/to/tierfs" ...]
#
# environment: P=4 N=5000 (bench_meta), WORK=/var/tmp/tierfs-counts.PID
# needs: perf, ext4 tracepoints (the backing directory on ext4)
#
set -euo pipefail

BUILD=$(cd "${1:?usage: meta_counts.sh BUILD [label=tierfs ...]}" && pwd)
shift
HERE=$(cd "$(dirname "$0")" && pwd)
P=${P:-4}; N=${N:-5000}
WORK=${WORK:-/var/tmp/tierfs-counts.$$}
EX=/usr/share/doc/libfuse3-dev/examples
EV=ext4:ext4_allocate_inode,ext4:ext4_free_inode,syscalls:sys_enter_futex
EV=$EV,syscalls:sys_enter_read,syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync

mkdir -p "$WORK"
cleanup() {
	mountpoint -q "$WORK/mnt" 2>/dev/null && umount -l "$WORK/mnt"
	rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
cc -O2 -o "$WORK/bench_meta" "$HERE/bench_meta.c"
cc -O2 -o "$WORK/passthrough_ll" "$EX/passthrough_ll.c" $(pkg-config --cflags --libs fuse3)

printf "%-16s %10s %10s %10s %10s %8s %8s %10s\n" target "ops/s" "ino alloc" "ino free" \
	futex "fsync" "fdatasync" "fuse reads"
for cfg in passthrough_ll "tierfs=$BUILD/tierfs" "$@"; do
	label=${cfg%%=*}; bin=${cfg#*=}
	rm -rf "$WORK/data"; mkdir -p "$WORK/data" "$WORK/mnt"
	if [ "$label" = passthrough_ll ]; then
		"$WORK/passthrough_ll" -f -o source="$WORK/data" "$WORK/mnt" & pid=$!
	else
		"$bin" "$WORK/data" "$WORK/mnt" -f -o host_cache=256M >"$WORK/log" 2>&1 & pid=$!
	fi
	for _ in $(seq 100); do mountpoint -q "$WORK/mnt" && break; sleep 0.1; done
	perf stat -x, -e "$EV" -p "$pid" -o "$WORK/stat" & ps=$!
	sleep 0.5
	r=$("$WORK/bench_meta" "$WORK/mnt" -p "$P" -n "$N" | awk '{ print $(NF-1) }')
	sleep 1
	kill -INT "$ps"; wait "$ps" || true
	umount "$WORK/mnt"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	awk -F, -v l="$label" -v r="$r" '/^[0-9]/ { split($3, a, ":"); v[a[2]] = $1 }
		END { printf "%-16s %10s %10s %10s %10s %8s %8s %10s\n", l, r,
			v["ext4_allocate_inode"], v["ext4_free_inode"], v["sys_enter_futex"],
			v["sys_enter_fsync"], v["sys_enter_fdatasync"], v["sys_enter_read"] }' "$WORK/stat"
done
