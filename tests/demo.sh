#!/bin/bash
#
# demo.sh - tierfs in two minutes: build it if needed, mount it, write a few
# checkpoints, watch them move from the host cache to the SSD, read them back
# in a declared order, and unmount, leaving a plain copy in the backing
# directory.
#
# usage: tests/demo.sh [BACKING_DIR [MOUNTPOINT]]
#
#   BACKING_DIR   the "SSD" side [/var/tmp/tierfs-demo/backing]; the demo
#                 writes into its subdirectory ckpt/ (ckpt-*.bin there are
#                 replaced)
#   MOUNTPOINT    where tierfs is mounted [a fresh /tmp/tierfs-demo.XXXXXX,
#                 removed at the end]
#
# environment (defaults in brackets):
#   N=8  MB=32       checkpoints and MiB per checkpoint
#   TIERFS_BIN=      the tierfs binary [build/tierfs, built if missing]
#   TIERFS_OPTS=     -o options for the mount [none: the defaults]
#
# Run it as root, or as a user who may mount FUSE file systems.
#
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
N=${N:-8}
MB=${MB:-32}
BACKING=${1:-/var/tmp/tierfs-demo/backing}
MNT=${2:-}

say()  { printf '\n==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die()  { printf 'demo.sh: %s\n' "$*" >&2; exit 1; }

case ${1:-} in
-h|--help)
	awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
	exit 0 ;;
esac
if [ "$N" -lt 2 ] || [ "$MB" -lt 1 ]; then
	die "N must be >= 2 and MB >= 1"
fi
for tool in getfattr setfattr python3 sha256sum mountpoint; do
	command -v "$tool" >/dev/null || die "'$tool' is missing (apt-get install attr python3 util-linux)"
done

# ---- 1. the binary -------------------------------------------------------
TIERFS=${TIERFS_BIN:-}
if [ -z "$TIERFS" ]; then
	if [ -x "$TOP/build/tierfs" ]; then
		TIERFS=$TOP/build/tierfs
	elif [ -f "$TOP/config.status" ]; then
		# configured in place (./configure in the source tree)
		say "building tierfs in place (make)"
		make -C "$TOP" -j"$(nproc)"
		TIERFS=$TOP/tierfs
	else
		say "building tierfs: autoreconf -fi; cd build; ../configure; make"
		(cd "$TOP" && autoreconf -fi)
		mkdir -p "$TOP/build"
		(cd "$TOP/build" && ../configure && make -j"$(nproc)")
		TIERFS=$TOP/build/tierfs
	fi
fi
[ -x "$TIERFS" ] || die "no tierfs binary at $TIERFS"
note "$("$TIERFS" --version)"

# ---- 2. mount --------------------------------------------------------------
WORK=$(mktemp -d /tmp/tierfs-demo-work.XXXXXX)
SUMS=$WORK/SHA256SUMS		# checksums of what was written
LOG=$WORK/tierfs.log		# the daemon's log
made_mnt=
if [ -z "$MNT" ]; then
	MNT=$(mktemp -d /tmp/tierfs-demo.XXXXXX)
	made_mnt=1
fi
mkdir -p "$BACKING/ckpt" "$MNT"
BACKING=$(cd "$BACKING" && pwd)
MNT=$(cd "$MNT" && pwd)
mountpoint -q "$MNT" && die "$MNT is already a mount point"
rm -f -- "$BACKING"/ckpt/ckpt-*.bin	# an earlier demo's checkpoints

PID=
unmount() {
	if [ "$(id -u)" -eq 0 ]; then
		umount "$@" "$MNT"
	else
		fusermount3 -u "$@" "$MNT"
	fi
}
cleanup() {
	local rc=$?
	if [ -n "$PID" ] && mountpoint -q "$MNT"; then
		echo "demo.sh: unmounting $MNT after an error" >&2
		unmount 2>/dev/null || unmount -z 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
	fi
	if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
		wait "$PID" 2>/dev/null || true
	fi
	if [ "$rc" -ne 0 ] && [ -s "$LOG" ]; then
		echo "demo.sh: the daemon's log:" >&2
		sed 's/^/    /' "$LOG" >&2
	fi
	[ -n "$made_mnt" ] && rmdir "$MNT" 2>/dev/null
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "mounting: $TIERFS $BACKING $MNT${TIERFS_OPTS:+ -o $TIERFS_OPTS}"
note "(-f keeps the daemon attached to this script, which can then wait for it"
note " and show its log; without -f tierfs detaches and logs to syslog)"
# shellcheck disable=SC2086
"$TIERFS" "$BACKING" "$MNT" -f ${TIERFS_OPTS:+-o "$TIERFS_OPTS"} >"$LOG" 2>&1 &
PID=$!
for _ in $(seq 100); do
	mountpoint -q "$MNT" && break
	kill -0 "$PID" 2>/dev/null || die "tierfs exited before mounting"
	sleep 0.1
done
mountpoint -q "$MNT" || die "tierfs did not mount $MNT within 10 s"
note "mounted (daemon pid $PID):"
sed 's/^/    | /' "$LOG"

CK=$MNT/ckpt
# xattr NAME PATH: the value of one attribute
xattr() { getfattr --absolute-names --only-values -n "$1" "$2"; }
# tier FILE: "tier=... state=..." from tierfs's read-only attributes.  They
# are two reads; a flush that ends between them would pair an old tier with
# a new state, so read the state on both sides and retry until it holds.
tier() {
	local s1 t s2
	for _ in 1 2 3 4 5; do
		s1=$(xattr user.tierfs.state "$1")
		t=$(xattr user.tierfs.tier "$1")
		s2=$(xattr user.tierfs.state "$1")
		[ "$s1" = "$s2" ] && break
	done
	printf 'tier=%-9s state=%s' "$t" "$s2"
}

# ---- 3. write checkpoints --------------------------------------------------
say "writing $N checkpoints of $MB MiB into $CK (the first half with dd, the rest with Python)"
note "each line shows tier and state right after close(): close returns once the"
note "data is in the host cache; the flush to the SSD runs in the background"
mkfifo "$WORK/fifo"
for ((i = 0; i < N; i++)); do
	f=ckpt-$i.bin
	if ((i < N / 2)); then
		# dd writes 1 MiB blocks; tee hands the same bytes to sha256sum
		sha256sum <"$WORK/fifo" >"$WORK/sum" &
		dd if=/dev/urandom bs=1M count="$MB" iflag=fullblock status=none |
			tee "$WORK/fifo" |
			dd of="$CK/$f" bs=1M iflag=fullblock status=none
		wait $!		# the sha256sum
		sed "s|-\$|$f|" "$WORK/sum" >>"$SUMS"
		printf '    %-12s %-6s  %s\n' "$f" dd "$(tier "$CK/$f")"
	else
		# Python reads tier and state with os.getxattr right after close()
		python3 - "$CK/$f" "$MB" "$SUMS" <<'EOF'
import hashlib, os, sys
path, mb, sums = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = os.urandom(mb << 20)
with open(path, "wb") as f:     # one write; close() returns once it is cached
    f.write(data)
for _ in range(5):              # a consistent pair, as tier() does
    s1 = os.getxattr(path, "user.tierfs.state").decode()
    tier = os.getxattr(path, "user.tierfs.tier").decode()
    state = os.getxattr(path, "user.tierfs.state").decode()
    if s1 == state:
        break
name = os.path.basename(path)
print(f"    {name:12s} {'python':6s}  tier={tier:9s} state={state}")
with open(sums, "a") as s:
    print(f"{hashlib.sha256(data).hexdigest()}  {name}", file=s)
EOF
	fi
done

# ---- 4. fsync: durable on the SSD -----------------------------------------
say "fsync (sync FILE...): returns once every checkpoint is durable on the SSD"
t0=$(date +%s.%N)
(cd "$CK" && sync -- ckpt-*.bin)
t1=$(date +%s.%N)
note "fsync of $N files took $(python3 -c "print(f'{$t1 - $t0:.3f}')") s"
for ((i = 0; i < N; i++)); do
	printf '    %-12s %s\n' "ckpt-$i.bin" "$(tier "$CK/ckpt-$i.bin")"
done

# ---- 5. restore hints --------------------------------------------------------
order=$(for ((i = N - 1; i >= 0; i--)); do echo "ckpt-$i.bin"; done)
say "restore order (newest first), one name per line, on the directory:"
note "setfattr -n user.tierfs.restore_order -v \"\$(printf '%s\\n' ckpt-$((N - 1)).bin ... ckpt-0.bin)\" $CK"
if err=$(setfattr -n user.tierfs.restore_order -v "$order" "$CK" 2>&1); then
	note "queued; getfattr -n user.tierfs.restore_order now lists:"
	xattr user.tierfs.restore_order "$CK" | paste -sd' ' | sed 's/^/    /'
	note "prefetch: $(xattr user.tierfs.prefetch "$CK")"
else
	note "this tierfs refused the hint: ${err##*: }"
	note "(hints are advice: reading without them is correct, only not prefetched)"
fi

# ---- 6. read back ------------------------------------------------------------
say "reading the checkpoints back in reverse order and checking them against what was written"
cap=$(xattr user.tierfs.stats "$MNT" | python3 -c 'import json, sys; print(json.load(sys.stdin)["tiers"]["host"]["capacity"])')
if [ "$cap" -ge $((N * MB << 20)) ]; then
	note "(all $N fit in the host cache, so the reads are host-cache hits; with more"
	note " checkpoints than cache, the restore order lets tierfs prefetch them from the SSD)"
fi
python3 - "$CK" "$SUMS" <<'EOF'
import hashlib, os, sys, time
d, sums = sys.argv[1], sys.argv[2]
want = dict(reversed(line.split()) for line in open(sums))
names = sorted(want, key=lambda n: int(n[5:-4]), reverse=True)
bad = 0
for name in names:
    path = os.path.join(d, name)
    fd = os.open(path, os.O_RDONLY)
    # drop the kernel's page cache of this file: the reads must reach tierfs
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    h, n, t0 = hashlib.sha256(), 0, time.perf_counter()
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        h.update(b)
        n += len(b)
    dt = time.perf_counter() - t0
    os.close(fd)
    ok = h.hexdigest() == want[name]
    bad += not ok
    print(f"    {name:12s} {n >> 20} MiB  {n / dt / 1e9:5.2f} GB/s  "
          f"{'checksum OK' if ok else 'CHECKSUM MISMATCH'}")
sys.exit(1 if bad else 0)
EOF

# ---- 7. statistics -----------------------------------------------------------
say "statistics: tools/tierfsctl stats $MNT (getfattr -n user.tierfs.stats $MNT as a table)"
python3 "$TOP/tools/tierfsctl" stats "$MNT" | sed 's/^/    /'

# ---- 8. unmount ----------------------------------------------------------------
say "unmounting: umount returns at once; the daemon writes whatever is still cached, then exits"
t0=$(date +%s.%N)
unmount
rc=0
wait "$PID" || rc=$?
t1=$(date +%s.%N)
PID=
note "daemon exited with status $rc, $(python3 -c "print(f'{$t1 - $t0:.3f}')") s after umount; its log:"
sed 's/^/    | /' "$LOG"
[ "$rc" -eq 0 ] || die "tierfs exited with status $rc"

# ---- 9. the backing directory ------------------------------------------------
say "the backing directory holds a plain, complete copy (no tierfs needed to read it)"
# shellcheck disable=SC2012
ls -l "$BACKING/ckpt" | sed 's/^/    /'
extra=$(find "$BACKING/ckpt" -mindepth 1 ! -regex '.*/ckpt-[0-9]+\.bin' -printf '%f ')
[ -z "$extra" ] || die "unexpected files in $BACKING/ckpt: $extra"
note "sha256sum -c against the checksums taken while writing:"
(cd "$BACKING/ckpt" && sha256sum -c "$SUMS") | sed 's/^/    /'

say "done: $N checkpoints written, read back and verified; the copies stay in $BACKING/ckpt"
