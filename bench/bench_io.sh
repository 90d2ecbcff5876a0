#!/bin/bash
#
# bench_io.sh - the standard tierfs I/O comparison.
#
# Mounts tierfs (BUILD/tierfs BACKING MNT -o host_cache=CACHE) with its
# backing directory on the SSD, and runs bench_io, in one invocation, on:
#   tierfs  the tierfs mount root (its user.tierfs.stats xattr gives the
#           background-flush columns)
#   ssd     a plain directory on the same disk (/var/tmp)
#   shm     /dev/shm (the reference of the ratio columns)
#   raw     the O_DIRECT io_uring bandwidth of that disk (the reference
#           for "flush to SSD >= 90% of raw O_DIRECT bandwidth")
#   fuse    with FUSE_FLOOR=1: libfuse's passthrough_ll example over a
#           directory in /dev/shm with direct I/O (-o cache=never): one
#           FUSE request per write(2) and nothing else, the floor of any
#           FUSE file system that bypasses the page cache
# over block sizes B and writer counts J, and prints one table.  The mount
# is unmounted and the scratch directories removed on exit, errors and
# signals included.
#
# usage: bench/bench_io.sh BUILD [extra bench_io options...]
#
# environment (defaults in brackets):
#   N=64  S=64M           files per run and bytes per file
#   B=4K,64K,1M,16M       block sizes          J=1,4   writer threads
#   CACHE=5G              host_cache; raised to fit N*S if left unset
#   FSYNC=1               time fsync after close ("flush" column); 0: off
#   DROP=0                1: read the ssd files back from disk, not cache
#   REPEAT=1              runs per combination, the table shows medians
#                         (3 or more where fresh memory faults in slowly,
#                         as in virtual machines)
#   WORK=/var/tmp/tierfs-bench.PID   backing, plain and raw dirs (on SSD)
#   SHM=/dev/shm/tierfs-bench.PID    MNT=WORK/mnt
#   TIERFS_OPTS=          more -o options for tierfs (comma separated)
#   BENCH_IO=             a bench_io binary; else BUILD/bench/bench_io or
#                         BUILD/bench_io if not older than bench_io.c, or
#                         bench_io.c compiled into WORK
#   DRAIN_TIMEOUT=300     longest wait for the tierfs flush backlog
#   NO_TIERFS=0           1: run without tierfs (ssd, shm, raw only)
#   FUSE_FLOOR=0          1: add the fuse target (needs libfuse3-dev's
#                         examples and a C compiler)
#   KEEP=0                1: leave the scratch directories
#   OUT=                  also write the output to this file
#
set -euo pipefail

die() { echo "bench_io.sh: $*" >&2; exit 2; }
usage() { awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }

case ${1:-} in
-h|--help) usage; exit 0 ;;
'') usage >&2; exit 2 ;;
esac
BUILD=$(cd "$1" && pwd) || die "no build directory '$1'"
shift

HERE=$(cd "$(dirname "$0")" && pwd)
N=${N:-64}
S=${S:-64M}
B=${B:-4K,64K,1M,16M}
J=${J:-1,4}
FSYNC=${FSYNC:-1}
DROP=${DROP:-0}
REPEAT=${REPEAT:-1}
KEEP=${KEEP:-0}
NO_TIERFS=${NO_TIERFS:-0}
FUSE_FLOOR=${FUSE_FLOOR:-0}
PTMNT=
WORK=${WORK:-/var/tmp/tierfs-bench.$$}
SHM=${SHM:-/dev/shm/tierfs-bench.$$}
MNT=${MNT:-$WORK/mnt}
BACKING=$WORK/backing
PLAIN=$WORK/plain
RAW=$WORK/raw

# "64M" -> bytes (binary suffixes, as bench_io takes them)
to_bytes() {
	local v=${1%[iI][bB]}
	v=${v%[bB]}
	v=${v%[iI]}
	case $v in
	*[kK]) echo $(( ${v%?} << 10 )) ;;
	*[mM]) echo $(( ${v%?} << 20 )) ;;
	*[gG]) echo $(( ${v%?} << 30 )) ;;
	*[tT]) echo $(( ${v%?} << 40 )) ;;
	*[0-9]) echo $(( v )) ;;
	*) die "bad size '$1'" ;;
	esac
}
gib() { awk -v b="$1" 'BEGIN { printf "%.1f GiB", b / 2^30 }'; }

DATA=$(( N * $(to_bytes "$S") ))
MEM=$(( $(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) * 1024 ))

# host_cache: the whole data set plus 10% must fit, else tierfs evicts or
# writes through and the run measures something else
if [ -z "${CACHE:-}" ]; then
	CACHE=5G
	need=$(( DATA + DATA / 10 ))
	if [ "$(to_bytes $CACHE)" -lt "$need" ]; then
		CACHE=$(( (need + (1 << 30) - 1) >> 30 ))G
	fi
fi
CACHE_B=$(to_bytes "$CACHE")
[ "$CACHE_B" -ge "$DATA" ] || [ "$NO_TIERFS" = 1 ] ||
	echo "bench_io.sh: warning: host_cache $CACHE < data set $(gib $DATA):" \
	     "tierfs will evict or write through" >&2
# resident at once: the host cache, a shm data set, and some slack
if [ "$NO_TIERFS" != 1 ] && [ $(( CACHE_B + DATA + (2 << 30) )) -gt "$MEM" ]; then
	die "host_cache $CACHE + data set $(gib "$DATA") do not fit in $(gib "$MEM") of RAM"
fi

TIERFS=$BUILD/tierfs
if [ "$NO_TIERFS" != 1 ]; then
	[ -x "$TIERFS" ] || die "no tierfs binary at $TIERFS (NO_TIERFS=1 runs without it)"
fi

# the daemonised tierfs: the process whose arguments start TIERFS BACKING MNT
daemon_pid() {
	local p want
	want=$(printf '%s\n' "$TIERFS" "$BACKING" "$MNT")
	for p in /proc/[0-9]*; do
		[ "$( { tr '\0' '\n' < "$p/cmdline"; } 2>/dev/null | head -n 3)" = "$want" ] &&
			{ echo "${p#/proc/}"; return; }
	done
	return 0
}

mounted=0
dpid=
# shellcheck disable=SC2317  # runs from the EXIT trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ "$mounted" = 1 ] || mountpoint -q "$MNT" 2>/dev/null; then
		if [ "$(id -u)" = 0 ]; then
			umount "$MNT" 2>/dev/null || umount -l "$MNT" || true
		else
			fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" || true
		fi
		# unmount flushes: let the daemon finish before removing its files
		if [ -n "$dpid" ]; then
			for _ in $(seq 600); do
				[ -d "/proc/$dpid" ] || break
				sleep 0.1
			done
			if [ -d "/proc/$dpid" ]; then
				echo "bench_io.sh: tierfs (pid $dpid) still running 60 s after unmount: stopping it" >&2
				kill "$dpid" 2>/dev/null || true
			fi
		fi
	fi
	if [ -n "$PTMNT" ] && mountpoint -q "$PTMNT" 2>/dev/null; then
		umount "$PTMNT" 2>/dev/null || umount -l "$PTMNT" || true
	fi
	if [ "$KEEP" != 1 ]; then
		rm -rf -- "$SHM"
		# never delete the backing directory under a live mount
		mountpoint -q "$MNT" 2>/dev/null || rm -rf -- "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$BACKING" "$PLAIN" "$RAW" "$MNT" "$SHM"

# bench_io: a given binary, a built one that is not older than its
# source, else compile it here
SRC=$HERE/bench_io.c
if [ -n "${BENCH_IO:-}" ]; then
	BIN=$BENCH_IO
elif [ -x "$BUILD/bench/bench_io" ] && ! [ "$SRC" -nt "$BUILD/bench/bench_io" ]; then
	BIN=$BUILD/bench/bench_io
elif [ -x "$BUILD/bench_io" ] && ! [ "$SRC" -nt "$BUILD/bench_io" ]; then
	BIN=$BUILD/bench_io
else
	BIN=$WORK/bench_io
	${CC:-cc} -O2 -Wall -std=gnu11 -pthread "$SRC" -luring -o "$BIN" ||
		die "cannot build bench_io"
fi

# space: raw + plain + backing copies of the data set on the SSD, one in shm
free_of() { df -PB1 "$1" | awk 'NR == 2 { print $4 }'; }
[ "$(free_of "$WORK")" -gt $(( 3 * DATA )) ] ||
	die "need $(gib $(( 3 * DATA ))) free under $WORK"
[ "$(free_of "$SHM")" -gt "$DATA" ] || die "need $(gib $DATA) free in $SHM"
[ "$(stat -c %d "$BACKING")" = "$(stat -c %d "$PLAIN")" ] ||
	echo "bench_io.sh: warning: $BACKING and $PLAIN are on different file systems" >&2

targets=()
if [ "$NO_TIERFS" != 1 ]; then
	opts=host_cache=$CACHE${TIERFS_OPTS:+,$TIERFS_OPTS}
	"$TIERFS" "$BACKING" "$MNT" -o "$opts" || die "tierfs failed to start"
	mounted=1
	for _ in $(seq 300); do
		mountpoint -q "$MNT" && break
		sleep 0.1
	done
	mountpoint -q "$MNT" || die "tierfs did not mount $MNT within 30 s"
	dpid=$(daemon_pid)
	targets+=(--label "tierfs=$MNT")
fi
targets+=(--label "ssd=$PLAIN" --label "shm=$SHM")
if [ "$FUSE_FLOOR" = 1 ]; then
	EX=/usr/share/doc/libfuse3-dev/examples
	[ -f "$EX/passthrough_ll.c" ] || die "FUSE_FLOOR=1: no $EX/passthrough_ll.c"
	# shellcheck disable=SC2046  # pkg-config's words are separate arguments
	${CC:-cc} -O2 -o "$WORK/passthrough_ll" "$EX/passthrough_ll.c" \
		$(pkg-config --cflags --libs fuse3) || die "cannot build passthrough_ll"
	PTMNT=$WORK/ptmnt
	mkdir -p "$SHM/ptsrc" "$PTMNT"
	"$WORK/passthrough_ll" -o "source=$SHM/ptsrc,cache=never" "$PTMNT" ||
		die "passthrough_ll failed to start"
	for _ in $(seq 100); do
		mountpoint -q "$PTMNT" && break
		sleep 0.1
	done
	targets+=(--label "fuse=$PTMNT")
fi

args=(-n "$N" -s "$S" -b "$B" -j "$J" -R "$REPEAT" --ref shm --raw "$RAW"
      --drain-timeout "${DRAIN_TIMEOUT:-300}")
[ "$FSYNC" = 1 ] && args+=(--fsync)
[ "$DROP" = 1 ] && args+=(--drop ssd)

{
	echo "# tierfs bench_io: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  $(uname -r)  $(nproc) cpus  $(gib "$MEM") RAM"
	echo "# disk: $(findmnt -no SOURCE,FSTYPE -T "$WORK" | tr -s ' ')  backing $BACKING  plain $PLAIN  raw $RAW"
	[ "$NO_TIERFS" = 1 ] && echo "# tierfs: not run (NO_TIERFS=1)" ||
		echo "# tierfs: $TIERFS $BACKING $MNT -o $opts"
	echo "# $BIN ${args[*]} ${targets[*]} $*"
} | tee ${OUT:+"$OUT"}

sync
rc=0
"$BIN" "${args[@]}" "${targets[@]}" "$@" 2>&1 | tee ${OUT:+-a "$OUT"} || rc=$?
exit "$rc"
