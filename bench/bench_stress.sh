#!/bin/bash
#
# bench_stress.sh - bench_stress (fsstress's kind of random operation mix,
# sparse files of a GiB or two among them) on an ext4 image, in one run:
#   local           a directory of the image
#   passthrough_ll  libfuse's passthrough_ll example over a directory of it
#                   (compiled from libfuse3-dev's examples, with fallocate and
#                   -o xattr, so that it does the load's punches, zeroed
#                   ranges and setxattr calls as the other targets do)
#   tierfs          BUILD/tierfs over a directory of it
# Per target and run: the seconds until the processes are done and
# `sync -f` returned, the seconds until everything is on the disk (for a
# FUSE target, its unmount and the daemon's exit; locally a second sync),
# the bytes the operations wrote, the bytes the image's loop device took
# in that time, for the FUSE targets the daemon's own read and write bytes
# (/proc/PID/io) and CPU seconds (user + system, /proc/PID/stat, until the
# load's end), and the blocks the backing directory holds at the end
# against the local directory's, and the calls of the load that failed (an
# rmdir of a directory not empty, ...: the same on every target that does
# what the others do).  Medians of R runs [min-max]; the runs go
# round the targets in turn.
#
# usage: bench/bench_stress.sh BUILD
#
# environment (defaults in brackets):
#   P=4 N=20000 SEED=1    processes, operations each, seed (the same for all)
#   R=3                   runs per target
#   TIERFS_OPTS=gpu=none,host_cache=64M
#   IMAGE_FS=ext4         ext4 or xfs, a 32 GiB sparse image in WORK
#   WORK=/var/tmp/tierfs-stress.PID
#   BEFORE=               another tierfs binary, run as the target "before"
#   BEFORE_OPTS=          the options of "before" (TIERFS_OPTS); with
#                         BEFORE=BUILD/tierfs, two settings in one run
#   STATS=                a directory: each tierfs run's user.tierfs.stats
#                         (before its unmount) into STATS/KIND.RUN.json
#   TIMES=                a directory: each run's seconds per kind of
#                         operation (bench_stress -t) into TIMES/KIND.RUN.txt
#
set -euo pipefail

BUILD=$(cd "${1:?usage: bench_stress.sh BUILD}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
P=${P:-4}; N=${N:-20000}; SEED=${SEED:-1}; R=${R:-3}
TIERFS_OPTS=${TIERFS_OPTS:-gpu=none,host_cache=64M}
IMAGE_FS=${IMAGE_FS:-ext4}
WORK=${WORK:-/var/tmp/tierfs-stress.$$}
EX=/usr/share/doc/libfuse3-dev/examples

. "$HERE/work_fs.sh"
work_fs bench_stress.sh 32G
loop=$(basename "$(findmnt -no SOURCE "$WORK")")

cc -O2 -o "$WORK/bench_stress" "$HERE/bench_stress.c"
PT=""
if [ -f "$EX/passthrough_ll.c" ]; then
	# HAVE_FALLOCATE: libfuse's own build defines it; without it the
	# example refuses every fallocate (the load's punches and zeroed ranges)
	cc -O2 -DHAVE_FALLOCATE -o "$WORK/passthrough_ll" "$EX/passthrough_ll.c" \
		$(pkg-config --cflags --libs fuse3) &&
		PT="$WORK/passthrough_ll"
fi

# bytes written to the image's device so far
dev_written() { awk '{ printf "%.0f\n", $7 * 512 }' "/sys/block/$loop/stat"; }
now() { date +%s.%N; }

# run KIND: one run; prints "sync_s done_s written dev_bytes dread dwrite blocks"
run() {
	local kind=$1 dir="$WORK/data" mnt="$WORK/mnt" pid="" out t0 t1 t2 d0 d1 io="0 0" cpu=0 bin opts
	rm -rf "$dir"; mkdir -p "$dir" "$mnt"
	sync -f "$WORK"
	case $kind in
	local) mnt=$dir ;;
	passthrough_ll)
		# xattr: the load's setxattr calls are refused without it
		"$PT" -o source="$dir",xattr "$mnt"	# it goes to the background
		pid=$(pgrep -nf "^$PT -o source=$dir") || pid="" ;;
	tierfs|before)
		bin=$BUILD/tierfs opts=$TIERFS_OPTS
		[ "$kind" = tierfs ] || { bin=$BEFORE; opts=${BEFORE_OPTS:-$TIERFS_OPTS}; }
		"$bin" "$dir" "$mnt" -f -o "$opts" >"$WORK/tierfs.log" 2>&1 &
		pid=$!; echo $pid >"$WORK/pid" ;;
	esac
	for _ in $(seq 100); do [ "$kind" = local ] || mountpoint -q "$mnt" && break; sleep 0.1; done
	d0=$(dev_written); t0=$(now)
	if [ -n "${TIMES:-}" ]; then
		mkdir -p "$TIMES"
		out=$("$WORK/bench_stress" "$mnt" -p "$P" -n "$N" -s "$SEED" -t \
			2>"$TIMES/$kind.$(date +%s).txt")
	else
		out=$("$WORK/bench_stress" "$mnt" -p "$P" -n "$N" -s "$SEED")
	fi
	sync -f "$mnt"
	t1=$(now)
	if [ "$kind" = local ]; then
		sync -f "$mnt"
	else
		if [ -n "${STATS:-}" ] && [ "$kind" != passthrough_ll ]; then
			mkdir -p "$STATS"
			getfattr --only-values -n user.tierfs.stats "$mnt" \
				>"$STATS/$kind.$(date +%s).json" 2>/dev/null || true
		fi
		if [ -n "$pid" ]; then
			io=$(awk '/^read_bytes/ { r = $2 } /^write_bytes/ { w = $2 } END { print r, w }' \
				"/proc/$pid/io")
			# the daemon's CPU seconds (user + system) until the load's end
			cpu=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' \
				"/proc/$pid/stat")
		fi
		umount "$mnt"
		[ -z "$pid" ] || while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
		rm -f "$WORK/pid"
		sync -f "$WORK"
	fi
	t2=$(now); d1=$(dev_written)
	echo "$(echo "$t1 - $t0" | bc) $(echo "$t2 - $t0" | bc)" \
	     "$(echo "$out" | awk '{ print $4 }') $((d1 - d0)) $io" \
	     "$(du -s --block-size=1 "$dir" | cut -f1) $cpu $(echo "$out" | awk '{ print $6 }')"
}

targets="local"
[ -n "$PT" ] && targets="$targets passthrough_ll"
[ -n "${BEFORE:-}" ] && targets="$targets before"
targets="$targets tierfs"
echo "bench_stress: P=$P N=$N SEED=$SEED, $IMAGE_FS image, tierfs -o $TIERFS_OPTS${BEFORE:+, before: $BEFORE -o ${BEFORE_OPTS:-$TIERFS_OPTS}}, R=$R"
declare -A res
for _ in $(seq "$R"); do
	for t in $targets; do
		res[$t]="${res[$t]:-}$(run "$t")"$'\n'
	done
done

med() {	# column -> median [min-max]
	awk -v c="$1" -v s="$2" 'NF { print $c / s }' | sort -g |
		awk '{ v[NR] = $1 } END { printf "%.1f [%.1f-%.1f]", v[int((NR + 1) / 2)], v[1], v[NR] }'
}
M=$((1 << 20))
printf "%-15s %-20s %-20s %-13s %-22s %-22s %-22s %-22s %-18s %s\n" target "synced s" "on disk s" \
	"wrote MiB" "device MiB" "daemon read MiB" "daemon wrote MiB" "blocks MiB" "daemon CPU s" failed
for t in $targets; do
	r=${res[$t]}
	printf "%-15s %-20s %-20s %-13s %-22s %-22s %-22s %-22s %-18s %s\n" "$t" "$(echo "$r" | med 1 1)" \
		"$(echo "$r" | med 2 1)" "$(echo "$r" | med 3 $M | cut -d' ' -f1)" \
		"$(echo "$r" | med 4 $M)" "$(echo "$r" | med 5 $M)" "$(echo "$r" | med 6 $M)" \
		"$(echo "$r" | med 7 $M)" "$(echo "$r" | med 8 1)" "$(echo "$r" | med 9 1 | cut -d' ' -f1)"
done
