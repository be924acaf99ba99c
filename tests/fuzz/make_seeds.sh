#!/bin/sh
# make_seeds.sh — rebuild the seed images the fuzz harness patches
# (tests/fuzz/seeds/*.img.gz). The images are committed, so this only runs
# when the seeds should change. Needs mkfs.btrfs; the kernel-made seeds also
# need root, loop devices and btrfs in the kernel (they are skipped, with a
# message, where those are missing).
#
# Seeds (each as small as mkfs.btrfs allows; gzip makes them a few tens of KiB):
#   rootdir-mixed   mkfs --rootdir of a small tree, mixed block groups, 4 KiB
#                   nodes, crc32c: inline and regular files, empty file,
#                   symlinks, hard links, xattrs, a fifo, nested directories
#   kernel-mixed    16 MiB mixed, filled by the kernel: zlib/lzo/zstd extents
#                   (inline and regular), holes, prealloc, reflink, partial
#                   overwrite, 300 entries in one directory (multi-level tree),
#                   a subvolume and a read-only snapshot, ACL xattr
#   kernel-single   114 MiB, metadata and data single, 16 KiB nodes, xxhash64
#                   csums, a compressed file, a subvolume
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out="$here/seeds"
work=$(mktemp -d)
mnt="$work/mnt"
loopdev=
cleanup() {
	if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" || true; fi
	rm -rf "$work"
}
trap cleanup EXIT INT TERM
mkdir -p "$out" "$mnt"

# A pattern file of $2 bytes: compressible text, deterministic.
pattern() {
	awk -v n="$2" 'BEGIN { s = ""; i = 0; while (length(s) < n) { s = s sprintf("line %06d of the butter fuzz seed\n", i++) } printf "%s", substr(s, 1, n) }' > "$1"
}

# Bytes that do not compress, deterministic: $2 bytes seeded by $3.
noise() {
	awk -v n="$2" -v seed="$3" 'BEGIN { srand(seed); for (i = 0; i < n; i++) printf "%c", int(rand() * 255) + 1 }' > "$1"
}

fill_common() {
	d=$1
	mkdir -p "$d/dir/sub/deeper"
	pattern "$d/inline.txt" 300
	pattern "$d/dir/regular.txt" 20000
	noise "$d/dir/noise.bin" 9000 7
	: > "$d/empty"
	ln -s inline.txt "$d/link-rel"
	ln -s /dir/sub/deeper "$d/link-abs"
	ln "$d/dir/regular.txt" "$d/dir/sub/hardlink"
	mkfifo "$d/fifo"
	pattern "$d/dir/sub/deeper/leaf.txt" 5000
	setfattr -n user.comment -v "a seed xattr" "$d/inline.txt"
	setfattr -n user.big -v "0x$(printf '%0200d' 0)" "$d/dir/regular.txt"
}

gz() {
	gzip -9 -n -c "$1" > "$out/$2.img.gz"
	echo "$2: $(stat -c %s "$1") bytes, $(stat -c %s "$out/$2.img.gz") gzipped"
}

# ---- rootdir-mixed: no kernel needed
mkdir "$work/tree"
fill_common "$work/tree"
truncate -s 64M "$work/rootdir.img"
mkfs.btrfs -q -f -M -U 62757474-6572-2d66-757a-7a2d73656564 --rootdir "$work/tree" --shrink \
	"$work/rootdir.img" 2>/dev/null || \
mkfs.btrfs -q -f -M --rootdir "$work/tree" --shrink "$work/rootdir.img"
gz "$work/rootdir.img" rootdir-mixed

can_mount=1
if [ "$(id -u)" != 0 ] || ! grep -qw btrfs /proc/filesystems; then
	can_mount=0
	echo "make_seeds: not root or no kernel btrfs: kernel-made seeds not rebuilt" >&2
fi

if [ "$can_mount" = 1 ]; then
	# ---- kernel-mixed
	img="$work/kmixed.img"
	truncate -s 16M "$img"
	mkfs.btrfs -q -f -M "$img"
	mount -o loop,compress=zlib "$img" "$mnt"
	fill_common "$mnt"
	pattern "$mnt/zlib.txt" 200000
	pattern "$mnt/zlib-inline.txt" 3000
	mount -o remount,compress=lzo "$mnt"
	pattern "$mnt/lzo.txt" 150000
	pattern "$mnt/lzo-inline.txt" 3000
	mount -o remount,compress=zstd "$mnt"
	pattern "$mnt/zstd.txt" 150000
	pattern "$mnt/zstd-inline.txt" 3000
	mount -o remount,compress=no "$mnt"
	truncate -s 1M "$mnt/sparse"
	printf 'middle' | dd of="$mnt/sparse" bs=1 seek=300000 conv=notrunc status=none
	fallocate -l 64K "$mnt/prealloc"
	noise "$mnt/base.bin" 40000 11
	cp --reflink=always "$mnt/base.bin" "$mnt/reflink.bin"
	printf 'overwritten' | dd of="$mnt/reflink.bin" bs=1 seek=8192 conv=notrunc status=none
	mkdir "$mnt/many"
	i=0
	while [ $i -lt 300 ]; do
		printf 'f%d\n' $i > "$mnt/many/file-with-a-longer-name-$i"
		i=$((i + 1))
	done
	btrfs -q subvolume create "$mnt/subvol"
	pattern "$mnt/subvol/in-subvol.txt" 7000
	mkdir "$mnt/subvol/d"
	btrfs -q subvolume snapshot -r "$mnt/subvol" "$mnt/snap"
	if command -v setfacl >/dev/null; then setfacl -m u:1234:rw "$mnt/inline.txt"; fi
	umount "$mnt"
	gz "$img" kernel-mixed

	# ---- kernel-single
	img="$work/ksingle.img"
	truncate -s 114294784 "$img"
	mkfs.btrfs -q -f -m single -d single -n 16384 --csum xxhash "$img"
	mount -o loop,compress=zstd "$img" "$mnt"
	fill_common "$mnt"
	pattern "$mnt/zstd.txt" 300000
	btrfs -q subvolume create "$mnt/sv"
	pattern "$mnt/sv/file" 9000
	umount "$mnt"
	gz "$img" kernel-single
fi
