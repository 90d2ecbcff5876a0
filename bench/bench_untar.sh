#!/bin/bash
#
# bench_untar.sh - N tar extractions at once into a small host cache, against
# the same into a local directory on the backing directory's file system.
#
# usage: bench/bench_untar.sh [RUNS]            (root: mount)
#
# environment (defaults in brackets):
#   TIERFS_BIN=./build/tierfs   the daemon
#   SRC=/usr/share/doc          what the tarball holds (made once, in WORK)
#   N=6                         extractions at once
#   HOST_CACHE=64M              -o host_cache (gpu=none)
#   TIERFS_OPTS=                more mount options
#   WORK=/var/tmp/tierfs-untar  tarball, backing directory, mount point, local directory
#
# Per run: the wall time of the N extractions into the local directory, into
# libfuse's passthrough_ll example over a directory of the same file system
# (built from /usr/share/doc/libfuse3-dev/examples when that is there; its
# default options), then into the mount (each extraction a directory of its
# own, removed after),
# and, for tierfs, the longest a writer waited for room (the daemon's log
# line "... ms to make room ...") and the warnings "no room after".  Prints
# medians [min-max] of RUNS (default 3).
set -euo pipefail

RUNS=${1:-3}
TIERFS_BIN=${TIERFS_BIN:-./build/tierfs}
SRC=${SRC:-/usr/share/doc}
N=${N:-6}
HOST_CACHE=${HOST_CACHE:-64M}
WORK=${WORK:-/var/tmp/tierfs-untar}
TIERFS_BIN=$(cd "$(dirname "$TIERFS_BIN")" && pwd)/$(basename "$TIERFS_BIN")

mkdir -p "$WORK/backing" "$WORK/mnt" "$WORK/local" "$WORK/ptsrc" "$WORK/ptmnt"
EX=/usr/share/doc/libfuse3-dev/examples
PT=""
if [ -f "$EX/passthrough_ll.c" ]; then
	${CC:-cc} -O2 -o "$WORK/passthrough_ll" "$EX/passthrough_ll.c" \
		$(pkg-config --cflags --libs fuse3) && PT="$WORK/passthrough_ll"
fi
tarball=$WORK/src.tar
[ -s "$tarball" ] || tar -cf "$tarball" -C "$(dirname "$SRC")" "$(basename "$SRC")"
files=$(tar -tf "$tarball" | grep -vc '/$')
# passthrough_ll holds a descriptor for each inode the kernel knows: all
# N x entries of the extraction at once.  Where the limit cannot be raised
# that far, it is left out (a smaller SRC or N brings it back).
entries=$(tar -tf "$tarball" | wc -l)
ulimit -n $((N * entries + 1024)) 2>/dev/null || true
if [ -n "$PT" ] && [ "$(ulimit -n)" -lt $((N * entries + 1024)) ]; then
	echo "bench_untar: passthrough_ll left out: it needs $((N * entries + 1024)) descriptors" \
	     "and the limit is $(ulimit -n)"
	PT=""
fi
echo "bench_untar: $N x $(du -m "$tarball" | cut -f1) MiB, $files files each (from $SRC);" \
     "host_cache=$HOST_CACHE"

untar_all() {	# dir -> seconds
	local d=$1 t0 t1 i
	t0=$(date +%s%N)
	for i in $(seq "$N"); do
		mkdir -p "$d/x$i"
		tar -xf "$tarball" -C "$d/x$i" &
	done
	wait
	sync -f "$d/x1"
	t1=$(date +%s%N)
	rm -rf "$d"/x*
	echo $(( (t1 - t0) / 1000000 ))
}

med() { sort -n | awk '{a[NR]=$1} END {printf "%.1f [%.1f-%.1f]", a[int((NR+1)/2)]/1000, a[1]/1000, a[NR]/1000}'; }

loc=() pts=() tfs=() longest=() warns=()
for r in $(seq "$RUNS"); do
	loc+=("$(untar_all "$WORK/local")")
	if [ -n "$PT" ]; then
		"$PT" -o source="$WORK/ptsrc" "$WORK/ptmnt"
		pts+=("$(untar_all "$WORK/ptmnt")")
		umount "$WORK/ptmnt"
	fi
	"$TIERFS_BIN" "$WORK/backing" "$WORK/mnt" -f \
		-o gpu=none,host_cache="$HOST_CACHE"${TIERFS_OPTS:+,$TIERFS_OPTS} \
		>"$WORK/tierfs.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do mountpoint -q "$WORK/mnt" && break; sleep 0.1; done
	tfs+=("$(untar_all "$WORK/mnt")")
	umount "$WORK/mnt"
	wait "$pid" || true
	longest+=("$( { grep -o "[0-9]* ms to make room" "$WORK/tierfs.log" || true; } | sort -n | tail -1 | cut -d" " -f1)")
	warns+=("$(grep -c 'no room after' "$WORK/tierfs.log" || true)")
	rm -rf "$WORK/backing"/x*
done
printf '%-15s %s\n' "local" "$(printf '%s\n' "${loc[@]}" | med) s"
[ -z "$PT" ] || printf '%-15s %s\n' "passthrough_ll" "$(printf '%s\n' "${pts[@]}" | med) s"
printf '%-15s %s\n' "tierfs" "$(printf '%s\n' "${tfs[@]}" | med) s"
echo "tierfs: longest wait for room per run (ms): ${longest[*]:-none}; \"no room after\" warnings: ${warns[*]}"
