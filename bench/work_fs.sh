# work_fs.sh - sourced by bench_meta.sh and bench_create.sh: their work
# directory, optionally on a file system image of its own, and its cleanup.
#
# work_fs NAME SIZE: WORK (made if missing) becomes the directory to work
# in: with IMAGE_FS=ext4 or xfs, a SIZE sparse image in WORK made with that
# file system and loop-mounted on WORK/fs (a journalled file system of known
# options, whatever the disk's own is).  On exit (or a signal), mounts left
# under it are detached, a daemon whose pid is in WORK/fs/pid is waited for,
# the image unmounted and the directory removed.
work_fs() {
	local name=$1 size=$2
	mkdir -p "$WORK"
	ROOT=$WORK
	trap work_fs_cleanup EXIT INT TERM
	[ -n "${IMAGE_FS:-}" ] || return 0
	truncate -s "$size" "$WORK/fs.img"
	case $IMAGE_FS in
	ext4) mkfs.ext4 -q -F "$WORK/fs.img" ;;
	xfs) mkfs.xfs -q -f "$WORK/fs.img" ;;
	*) echo "$name: IMAGE_FS is ext4 or xfs" >&2; exit 2 ;;
	esac
	mkdir -p "$WORK/fs"
	mount -o loop "$WORK/fs.img" "$WORK/fs"
	echo "on $IMAGE_FS ($(findmnt -no OPTIONS "$WORK/fs")), a loop-mounted image"
	WORK=$WORK/fs
}

work_fs_cleanup() {
	for m in "$ROOT"/fs/mnt* "$ROOT"/mnt*; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
	if mountpoint -q "$ROOT/fs" 2>/dev/null; then
		[ -f "$ROOT/fs/pid" ] && while kill -0 "$(cat "$ROOT/fs/pid")" 2>/dev/null; do sleep 0.1; done
		umount "$ROOT/fs" || umount -l "$ROOT/fs"
	fi
	rm -rf "$ROOT"
}
