# work_fs.sh - sourced by the benchmarks: their work directory, on a file
# system image of its own where they ask for one, and its cleanup.
# bench_meta.sh and bench_create.sh: work_fs; bench_sparse.sh and
# bench_replace.sh, which compare file systems side by side: work_roots.
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

# work_roots NAME XFS_SIZE: work becomes a new directory under TMPDIR (/tmp
# by default), and roots the backing roots of the file systems in FS
# (default "ext4 xfs"), as "ext4=DIR xfs=DIR": ext4, a directory in work,
# which must be on ext4 (else skipped, said); xfs, an XFS_SIZE image
# (reflink on) loop-mounted in work (skipped without mkfs.xfs).  On exit
# (or a signal) mounts under work are detached and work is removed.
work_roots() {
	local name=$1 xfs_size=$2 fs
	work=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")
	trap work_roots_cleanup EXIT INT TERM
	roots=
	for fs in ${FS:-ext4 xfs}; do
		case $fs in
		ext4)
			[ "$(stat -f -c %T "$work")" = ext2/ext3 ] ||
				{ echo "$work is not on ext4: ext4 skipped" >&2; continue; }
			mkdir "$work/ext4"
			roots="$roots ext4=$work/ext4" ;;
		xfs)
			command -v mkfs.xfs >/dev/null ||
				{ echo "no mkfs.xfs: xfs skipped" >&2; continue; }
			truncate -s "$xfs_size" "$work/xfs.img"
			mkfs.xfs -q -m reflink=1 "$work/xfs.img"
			mkdir "$work/xfs"
			mount -o loop "$work/xfs.img" "$work/xfs"
			roots="$roots xfs=$work/xfs" ;;
		esac
	done
}

work_roots_cleanup() {
	for m in "$work"/mnt*; do
		umount "$m" 2>/dev/null || true
	done
	umount "$work/xfs" 2>/dev/null || umount -l "$work/xfs" 2>/dev/null || true
	rm -rf "$work"
}
