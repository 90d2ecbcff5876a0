#!/bin/bash
#
# bench_hints.sh - tierfs restore hints and eviction policies on the adjoint
# checkpoint workload (bench_hints.c: a forward pass writes K checkpoints,
# a backward pass reads them all back; see its header for the details).
#
# For each eviction policy P in POLICIES, mounts
#     BUILD/tierfs WORK/backing.P WORK/mnt.P -o host_cache=CACHE,evict=P
# (a fresh backing directory on the SSD; CACHE is smaller than the K*S
# checkpoints, so the cache must evict and prefetch) and runs the matrix
#     {uniform,var} sizes x {seq,rev,irr} restore order x {all,single,none} hints
# on every mount, each run in a fresh directory.  The policies are mounted
# together and their runs interleaved cell by cell (in a rotating order),
# so that the changing load of a shared machine does not favour one policy.
# Every run waits for the flush backlog to reach 0 before it starts and
# again after its forward pass, and drops the kernel page cache before its
# backward pass, so reads really come from tierfs.  At the end (and on any
# exit) the mounts are unmounted and the daemons waited for.
# The baseline is a plain directory on the same disk (WORK, /var/tmp by
# default), synced and its page cache dropped before the backward pass;
# hints don't apply there, so it runs once per (sizes, order) and its
# number is shown on every hints row.
#
# Prints, per (sizes, order, hints): restore GB/s per policy, plain dir,
# and the score/fifo ratio; the same for checkpoint GB/s; the prefetch
# distance and cache hits/misses per policy; then the target check (printed,
# not asserted): with all hints, restore score >= 5x fifo on irr+var, and
# score no worse than fifo anywhere (within NOISE); then the raw CSV.
# Throughput = bytes / time blocked in open+write+close (checkpoint) or
# open+read+close (restore), compute intervals excluded; GB = 10^9 bytes.
#
# usage: bench/bench_hints.sh BUILD [extra bench_hints options...]
#        bench/bench_hints.sh --table RESULTS.CSV   (the tables again)
#        (root: mount, umount and /proc/sys/vm/drop_caches)
#
# environment (defaults in brackets):
#   K=64 S=16M            checkpoints per run and their (mean) size
#   CACHE=256M            host_cache of every mount
#   INTERVAL=20           compute interval, milliseconds
#   POLICIES="score fifo lru"     eviction policies, score and fifo needed
#                                 for the ratio columns and the check
#   SIZES="uniform var"  ORDERS="seq rev irr"  HINTS="all single none"
#   SEED=1                sizes and irregular order (same for every policy)
#   REPEAT=1              runs per cell; the tables show medians
#   PLAIN=1               0: no plain-directory baseline
#   NOISE=0.10            "no worse" means ratio >= 1 - NOISE
#   WORK=/var/tmp/tierfs-hints.PID   backing dirs, mount points, plain dir
#   TIERFS_OPTS=          more -o options for tierfs (comma separated)
#   BENCH_HINTS=          a bench_hints binary; else bench_hints.c is
#                         compiled into WORK
#   FOREGROUND=0          1: run tierfs -f as a child of this script (its
#                         log in WORK) instead of letting it daemonise
#   TIMEOUT=300           give up a run when one call blocks this long
#   DRAIN_TIMEOUT=120     longest wait for the flush backlog; a policy
#                         whose backlog does not drain skips its other runs
#   KEEP=0                1: leave WORK (logs, CSV, backing files)
#   OUT=                  also write the output to this file
#
set -euo pipefail

die() { echo "bench_hints.sh: $*" >&2; exit 2; }
usage() { awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }

case ${1:-} in
-h|--help) usage; exit 0 ;;
--table) TABLE=${2:?--table needs a CSV file} ;;
'') usage >&2; exit 2 ;;
esac

HERE=$(cd "$(dirname "$0")" && pwd)
K=${K:-64}
S=${S:-16M}
CACHE=${CACHE:-256M}
INTERVAL=${INTERVAL:-20}
POLICIES=${POLICIES:-score fifo lru}
SIZES=${SIZES:-uniform var}
ORDERS=${ORDERS:-seq rev irr}
HINTS=${HINTS:-all single none}
SEED=${SEED:-1}
REPEAT=${REPEAT:-1}
PLAIN=${PLAIN:-1}
NOISE=${NOISE:-0.10}
TIMEOUT=${TIMEOUT:-300}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-120}
KEEP=${KEEP:-0}
FOREGROUND=${FOREGROUND:-0}
WORK=${WORK:-/var/tmp/tierfs-hints.$$}

# report CSV: the tables and the target check
report() {
awk -F, -v policies="$POLICIES" -v sizes="$SIZES" -v orders="$ORDERS" -v hints="$HINTS" \
    -v noise="$NOISE" -v plain="$PLAIN" '
function median(key,    i, j, m, t, a) {
	m = cnt[key]
	if (m == 0)
		return ""
	for (i = 1; i <= m; i++)
		a[i] = val[key, i]
	for (i = 2; i <= m; i++) {	# insertion sort (mawk has no asort)
		t = a[i]
		for (j = i - 1; j >= 1 && a[j] > t; j--)
			a[j + 1] = a[j]
		a[j + 1] = t
	}
	return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
function add(key, v) {
	cnt[key]++
	val[key, cnt[key]] = v
}
function fmt(v) { return v == "" ? "-" : sprintf("%.3f", v) }
function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "" : a / b }
NR == 1 { next }
{
	lab = $1; key = $2 SUBSEP $3 SUBSEP $4
	if ($5 ~ /^ERR/) { err[lab, key]++; next }
	if (lab == "plain") {
		add("ckpt" SUBSEP lab SUBSEP $2 SUBSEP $3, $8)
		add("rest" SUBSEP lab SUBSEP $2 SUBSEP $3, $9)
		next
	}
	add("ckpt" SUBSEP lab SUBSEP key, $8)
	add("rest" SUBSEP lab SUBSEP key, $9)
	if ($10 != "-") add("dist" SUBSEP lab SUBSEP key, $10)
	if ($12 != "-") add("hits" SUBSEP lab SUBSEP key, $12)
	if ($13 != "-") add("miss" SUBSEP lab SUBSEP key, $13)
	if ($23 > 0) rejected++
	if ($20 == "timeout" || $21 == "timeout") undrained++
}
BEGIN {
	np = split(policies, PL, " "); ns = split(sizes, SZ, " ")
	no = split(orders, OR, " "); nh = split(hints, H, " ")
}
function cell(what, lab, s, o, h) {
	if (lab == "plain")
		return median(what SUBSEP "plain" SUBSEP s SUBSEP o)
	return median(what SUBSEP lab SUBSEP s SUBSEP o SUBSEP h)
}
function table(what, title,    s, o, h, p, line, v, sc, fi) {
	printf "%s\n", title
	line = sprintf("%-8s %-5s %-6s", "sizes", "order", "hints")
	for (p = 1; p <= np; p++) line = line sprintf(" %8s", PL[p])
	if (plain) line = line sprintf(" %8s", "plain")
	line = line sprintf(" %11s", "score/fifo")
	print line
	for (s = 1; s <= ns; s++) for (o = 1; o <= no; o++) for (h = 1; h <= nh; h++) {
		line = sprintf("%-8s %-5s %-6s", SZ[s], OR[o], H[h])
		for (p = 1; p <= np; p++) {
			v = cell(what, PL[p], SZ[s], OR[o], H[h])
			line = line sprintf(" %8s", (PL[p] SUBSEP SZ[s] SUBSEP OR[o] SUBSEP H[h]) in err && v == "" ? "ERR" : fmt(v))
		}
		if (plain) line = line sprintf(" %8s", fmt(cell(what, "plain", SZ[s], OR[o], H[h])))
		sc = cell(what, "score", SZ[s], OR[o], H[h])
		fi = cell(what, "fifo", SZ[s], OR[o], H[h])
		v = ratio(sc, fi)
		line = line sprintf(" %10s", v == "" ? "-" : sprintf("%.2fx", v))
		print line
		if (v != "" && v < 1 - noise)
			worse[++nworse] = sprintf("%s %s %s %s: score/fifo %.2fx", what == "rest" ? "restore" : "checkpoint", SZ[s], OR[o], H[h], v)
	}
	print ""
}
END {
	table("rest", "restore throughput, GB/s (open+read+close; median of runs)")
	table("ckpt", "checkpoint throughput, GB/s (open+write+close; median of runs)")

	print "prefetch distance (mean before each read) / cache hits / misses over the backward pass"
	line = sprintf("%-8s %-5s %-6s", "sizes", "order", "hints")
	for (p = 1; p <= np; p++) line = line sprintf(" %20s", PL[p])
	print line
	for (s = 1; s <= ns; s++) for (o = 1; o <= no; o++) for (h = 1; h <= nh; h++) {
		line = sprintf("%-8s %-5s %-6s", SZ[s], OR[o], H[h])
		for (p = 1; p <= np; p++) {
			d = cell("dist", PL[p], SZ[s], OR[o], H[h])
			a = cell("hits", PL[p], SZ[s], OR[o], H[h])
			b = cell("miss", PL[p], SZ[s], OR[o], H[h])
			line = line sprintf(" %20s", sprintf("%s/%s/%s", d == "" ? "-" : sprintf("%.1f", d),
				a == "" ? "-" : a, b == "" ? "-" : b))
		}
		print line
	}
	print ""

	print "target (printed, not asserted):"
	sc = cell("rest", "score", "var", "irr", "all")
	fi = cell("rest", "fifo", "var", "irr", "all")
	v = ratio(sc, fi)
	if (v == "")
		print "  restore score >= 5x fifo on var+irr+all hints: n/a (no score or fifo result)"
	else
		printf "  restore score >= 5x fifo on var+irr+all hints: %.2fx  %s\n", v, (v >= 5 ? "PASS" : "FAIL")
	if (nworse == 0)
		printf "  score no worse than fifo anywhere (ratio >= %.2f): PASS\n", 1 - noise
	else {
		printf "  score no worse than fifo anywhere (ratio >= %.2f): FAIL (%d cells)\n", 1 - noise, nworse
		for (i = 1; i <= nworse; i++) print "    " worse[i]
	}
	if (rejected)
		printf "  note: tierfs rejected hints in %d runs: those rows measure no-hint behaviour\n", rejected
	if (undrained)
		printf "  note: the flush backlog did not drain in %d runs\n", undrained
}' "$1"
}

if [ -n "${TABLE:-}" ]; then
	report "$TABLE"
	exit 0
fi
BUILD=$(cd "$1" && pwd) || die "no build directory '$1'"
shift
TIERFS=$BUILD/tierfs

[ "$(id -u)" = 0 ] || die "needs root (mount, umount, drop_caches)"
[ -x "$TIERFS" ] || die "no tierfs binary at $TIERFS"
[ -e /dev/fuse ] || die "no /dev/fuse"

to_bytes() {
	local v=${1%[iI][bB]}
	v=${v%[bB]}
	v=${v%[iI]}
	case $v in
	*[kK]) echo $(( ${v%?} << 10 )) ;;
	*[mM]) echo $(( ${v%?} << 20 )) ;;
	*[gG]) echo $(( ${v%?} << 30 )) ;;
	*[0-9]) echo $(( v )) ;;
	*) die "bad size '$1'" ;;
	esac
}
gib() { awk -v b="$1" 'BEGIN { printf "%.2f GiB", b / 2^30 }'; }
DATA=$(( K * $(to_bytes "$S") ))
CACHE_B=$(to_bytes "$CACHE")
[ "$CACHE_B" -lt "$DATA" ] ||
	echo "bench_hints.sh: warning: host_cache $CACHE holds all $(gib "$DATA") of checkpoints:" \
	     "nothing is evicted or prefetched" >&2

# the daemonised tierfs: the process whose arguments start TIERFS BACKING MNT
daemon_pid() {
	local p want
	want=$(printf '%s\n' "$TIERFS" "$1" "$2")
	for p in /proc/[0-9]*; do
		[ "$( { tr '\0' '\n' < "$p/cmdline"; } 2>/dev/null | head -n 3)" = "$want" ] &&
			{ echo "${p#/proc/}"; return; }
	done
	return 0
}

# running, not a zombie
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

declare -A DPID=()	# policy -> tierfs pid
mnt_of() { echo "$WORK/mnt.$1"; }

# mount P: a fresh backing directory, tierfs -o host_cache=CACHE,evict=P
mount_policy() {
	local P=$1 mnt backing opts log pid=
	mnt=$(mnt_of "$P")
	backing=$WORK/backing.$P
	log=$WORK/tierfs.$P.log
	opts=host_cache=$CACHE,evict=$P${TIERFS_OPTS:+,$TIERFS_OPTS}
	mkdir -p "$mnt" "$backing"
	if [ "$FOREGROUND" = 1 ]; then
		"$TIERFS" "$backing" "$mnt" -f -o "$opts" >> "$log" 2>&1 &
		pid=$!
	else
		"$TIERFS" "$backing" "$mnt" -o "$opts" 2>> "$log" ||
			die "tierfs failed to start (-o $opts): $(tail -n 3 "$log")"
	fi
	for _ in $(seq 300); do
		mountpoint -q "$mnt" && break
		[ -z "$pid" ] || alive "$pid" || break
		sleep 0.1
	done
	mountpoint -q "$mnt" || die "tierfs did not mount $mnt within 30 s: $(tail -n 3 "$log")"
	[ "$FOREGROUND" = 1 ] || pid=$(daemon_pid "$backing" "$mnt")
	DPID[$P]=$pid
}

# unmount P (if mounted) and wait for its daemon to write everything back
# and exit; a daemon still running after 120 s is stopped (and said so)
unmount_policy() {
	local P=$1 mnt pid rc=0
	mnt=$(mnt_of "$P")
	pid=${DPID[$P]:-}
	if mountpoint -q "$mnt" 2>/dev/null; then
		umount "$mnt" 2>/dev/null || umount -l "$mnt" || true
	fi
	unset "DPID[$P]"
	[ -n "$pid" ] || return 0
	for _ in $(seq 1200); do
		alive "$pid" || break
		sleep 0.1
	done
	if alive "$pid"; then
		echo "bench_hints.sh: tierfs $P (pid $pid) still running 120 s after unmount: stopping it" >&2
		kill "$pid" 2>/dev/null || true
		sleep 2
		if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
	fi
	if [ "$FOREGROUND" = 1 ]; then
		wait "$pid" 2>/dev/null || rc=$?
		[ "$rc" = 0 ] || echo "bench_hints.sh: tierfs $P (pid $pid) exited with status $rc" >&2
	fi
}

# shellcheck disable=SC2317  # runs from the EXIT trap
cleanup() {
	local rc=$? P busy=0
	trap - EXIT INT TERM
	for P in $POLICIES; do
		unmount_policy "$P"
		mountpoint -q "$(mnt_of "$P")" 2>/dev/null && busy=1
	done
	# never delete a backing directory under a live mount
	if [ "$KEEP" != 1 ] && [ "$busy" = 0 ]; then
		rm -rf -- "$WORK"
	else
		echo "bench_hints.sh: kept $WORK" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

MEM=$(( $(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) * 1024 ))
npol=$(wc -w <<< "$POLICIES")
# resident at once: one host cache per policy, a read buffer, some slack
[ $(( npol * CACHE_B + 2 * DATA / K + (2 << 30) )) -le "$MEM" ] ||
	die "$npol host caches of $CACHE do not fit in $(gib "$MEM") of RAM"

mkdir -p "$WORK"
free_b=$(df -PB1 "$WORK" | awk 'NR == 2 { print $4 }')
[ "$free_b" -gt $(( 3 * DATA )) ] || die "need $(gib $(( 3 * DATA ))) free under $WORK"

if [ -n "${BENCH_HINTS:-}" ]; then
	BIN=$BENCH_HINTS
else
	BIN=$WORK/bench_hints
	${CC:-cc} -O2 -Wall -Wextra -std=gnu11 -pthread "$HERE/bench_hints.c" -o "$BIN" ||
		die "cannot build bench_hints"
fi

CSV=$WORK/results.csv
"$BIN" --csv -k 1 -s 64K --print-sizes >/dev/null	# the binary runs
HDR="label,sizes,order,hints,K,S,total_GB,ckpt_GBps,restore_GBps,dist_avg,dist_max,hits,misses,prefetched,evictions,ckpt_s,restore_s,fwd_wall_s,bwd_wall_s,drain_before_s,drain_s,hint_ms,hint_err,interval_ms,tierfs"
echo "$HDR" > "$CSV"

exec > >(tee ${OUT:+"$OUT"}) 2>&1

nsz=$(wc -w <<< "$SIZES"); nord=$(wc -w <<< "$ORDERS"); nh=$(wc -w <<< "$HINTS")
total_runs=$(( REPEAT * nsz * nord * (npol * nh + (PLAIN == 1 ? 1 : 0)) ))
echo "# tierfs bench_hints: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  $(uname -r)  $(nproc) cpus" \
     "$(gib "$MEM")"
echo "# disk: $(findmnt -no SOURCE,FSTYPE -T "$WORK" | tr -s ' ')  work $WORK"
echo "# K=$K S=$S ($(gib "$DATA") per run) CACHE=$CACHE INTERVAL=${INTERVAL}ms SEED=$SEED" \
     "REPEAT=$REPEAT policies: $POLICIES${TIERFS_OPTS:+  TIERFS_OPTS=$TIERFS_OPTS}"
echo "# tierfs: $TIERFS $WORK/backing.POLICY $WORK/mnt.POLICY$([ "$FOREGROUND" = 1 ] && echo ' -f') -o host_cache=$CACHE,evict=POLICY${TIERFS_OPTS:+,$TIERFS_OPTS}"
echo "# $BIN -k $K -s $S -c $INTERVAL --seed $SEED --drop-caches $*   ($total_runs runs)"

n=0
failed=0
stuck=0
# run LABEL DIR SIZES ORDER HINTS [extra...]: one bench_hints run -> CSV
run() {
	local label=$1 dir=$2 sz=$3 ord=$4 h=$5 line rc=0
	shift 5
	n=$(( n + 1 ))
	line=$("$BIN" --csv --no-header --label "$label" -k "$K" -s "$S" -c "$INTERVAL" \
		--seed "$SEED" --sizes "$sz" -o "$ord" -H "$h" --drop-caches \
		--timeout "$TIMEOUT" --drain-timeout "$DRAIN_TIMEOUT" "$@" "$dir") || rc=$?
	if [ "$rc" != 0 ] || [ -z "$line" ]; then
		failed=$(( failed + 1 ))
		echo "$label,$sz,$ord,$h,ERR$rc" >> "$CSV"
		printf '[%d/%d] %-6s %-7s %-3s %-6s  FAILED (exit %s)\n' "$n" "$total_runs" \
			"$label" "$sz" "$ord" "$h" "$rc"
		return 0
	fi
	echo "$line" >> "$CSV"
	# a backlog that never drains: tierfs is not flushing, the rest is moot
	case ,$line, in *,timeout,*) stuck=1 ;; esac
	awk -F, -v n="$n" -v t="$total_runs" '{
		printf "[%d/%d] %-6s %-7s %-3s %-6s  ckpt %6.3f  restore %6.3f GB/s  dist %s  hits %s  misses %s%s%s\n",
			n, t, $1, $2, $3, $4, $8, $9, $10, $12, $13,
			($23 > 0 ? "  hints rejected" : ""),
			($20 == "timeout" || $21 == "timeout" ? "  flush backlog did not drain" : "")
	}' <<< "$line"
}

# every policy mounted at once, and the runs interleaved: for each cell
# every policy (in an order rotated from cell to cell) and then the plain
# directory run one after the other, so that a shared machine's changing
# load hits them all alike
declare -A STUCK=()
for P in $POLICIES; do
	mount_policy "$P"
done
mkdir -p "$WORK/plain"
read -r -a PL <<< "$POLICIES"
run_no=0
cellno=0
for _ in $(seq "$REPEAT"); do
	for sz in $SIZES; do
		for ord in $ORDERS; do
			first_h=1
			for h in $HINTS; do
				for (( i = 0; i < npol; i++ )); do
					P=${PL[$(( (i + cellno) % npol ))]}
					run_no=$(( run_no + 1 ))
					if [ -n "${STUCK[$P]:-}" ]; then
						n=$(( n + 1 ))
						continue
					fi
					run "$P" "$(mnt_of "$P")/run.$run_no" "$sz" "$ord" "$h" "$@"
					if [ "$stuck" = 1 ]; then
						STUCK[$P]=1
						stuck=0
						failed=$(( failed + 1 ))
						echo "bench_hints.sh: $P: the flush backlog did not drain within" \
						     "${DRAIN_TIMEOUT}s: skipping its other runs (log:" \
						     "$WORK/tierfs.$P.log; KEEP=1 keeps it)"
					fi
				done
				cellno=$(( cellno + 1 ))
				# hints don't apply to a plain directory: once per (sizes, order)
				if [ "$PLAIN" = 1 ] && [ "$first_h" = 1 ]; then
					run_no=$(( run_no + 1 ))
					run plain "$WORK/plain/run.$run_no" "$sz" "$ord" none "$@"
				fi
				first_h=0
			done
		done
	done
done
for P in $POLICIES; do
	unmount_policy "$P"
done


echo
report "$CSV"

echo "# raw results (CSV; medians above)"
cat "$CSV"
[ "$failed" = 0 ] || { echo "bench_hints.sh: $failed runs failed" >&2; exit 1; }
