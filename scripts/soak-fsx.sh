#!/usr/bin/env bash
# The file exerciser as a soak: millions of operations through `butter mount`.
#
#   scripts/soak-fsx.sh [-b BUILD] [-n OPS_PER_RUN] [-s FIRST_SEED] [-r RUNS] [-j JOBS] [-k]
#
# Each round mounts a fresh image, runs JOBS fsx processes at once (each on its own
# file, its own seed, a file size limit cycling through 8K, 256K, 1M and 4M), unmounts,
# runs `btrfs check --readonly`, mounts the image with the kernel and compares every
# file with fsx's model (-g). RUNS rounds (default: until stopped with Ctrl-C). A failing
# fsx leaves its operation log (NAME.fsxlog) in the work directory, which is kept (-k
# keeps it always) and printed. Defaults: BUILD=build, OPS_PER_RUN=1000000, JOBS=2.
# Needs root, /dev/fuse, fusermount3, btrfs-progs and loop devices.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build ops=1000000 seed=1 runs=0 jobs=2 keep=0
while getopts "b:n:s:r:j:k" opt; do
	case $opt in
	b) build=$OPTARG ;;
	n) ops=$OPTARG ;;
	s) seed=$OPTARG ;;
	r) runs=$OPTARG ;;
	j) jobs=$OPTARG ;;
	k) keep=1 ;;
	*) sed -n '2,13p' "$0"; exit 2 ;;
	esac
done
butter=$build/cli/butter
fsx=$build/tests/tools/butter-fsx
[ -x "$butter" ] && [ -x "$fsx" ] || { echo "build first: ninja -C $build" >&2; exit 2; }
butter=$(realpath "$butter") fsx=$(realpath "$fsx")

work=$(mktemp -d /tmp/butter-soak-fsx-XXXXXX)
mnt=$work/mnt kmnt=$work/kmnt img=$work/img
mkdir -p "$mnt" "$kmnt"
daemon= loop=
cleanup() {
	mountpoint -q "$mnt" && { fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -uz "$mnt"; }
	[ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
	mountpoint -q "$kmnt" && umount "$kmnt"
	[ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
	if [ "$keep" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

sizes=(8K 256K 1M 4M) opsizes=(3K 64K 128K 1M)
round=0 total=0
while [ "$runs" = 0 ] || [ "$round" -lt "$runs" ]; do
	round=$((round + 1))
	rm -f "$img"; truncate -s 8G "$img"
	mkfs.btrfs -q -f "$img" >/dev/null
	"$butter" mount -f "$img" "$mnt" >"$work/daemon-$round.log" 2>&1 &
	daemon=$!
	for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
	mountpoint -q "$mnt" || { cat "$work/daemon-$round.log"; exit 1; }
	pids=() names=()
	for j in $(seq "$jobs"); do
		s=$((seed++)) i=$(( (s - 1) % 4 ))
		name=fsx-$s
		(cd "$work" && exec "$fsx" -q -S "$s" -N "$ops" -l "${sizes[$i]}" -o "${opsizes[$i]}" \
			-c 10000 -g "$work/$name.good" "$mnt/$name") &
		pids+=($!) names+=("$name")
	done
	failed=0
	for k in "${!pids[@]}"; do
		wait "${pids[$k]}" || { echo "round $round: ${names[$k]} FAILED (log: $work/${names[$k]}.fsxlog)"; failed=1; }
	done
	fusermount3 -u "$mnt"
	wait "$daemon" || { echo "round $round: the daemon exited with an error"; failed=1; }
	daemon=
	if grep -E "Sanitizer|runtime error|aborted" "$work/daemon-$round.log"; then failed=1; fi
	[ "$failed" = 0 ] || { keep=1; exit 1; }
	btrfs check --readonly "$img" >"$work/check.log" 2>&1 || { cat "$work/check.log"; keep=1; exit 1; }
	loop=$(losetup -f --show "$img")
	mount -o ro "$loop" "$kmnt"
	for name in "${names[@]}"; do
		cmp "$kmnt/$name" "$work/$name.good" || { echo "round $round: $name differs on the kernel mount"; keep=1; exit 1; }
		rm -f "$work/$name.good"
	done
	umount "$kmnt"; losetup -d "$loop"; loop=
	total=$((total + jobs * ops))
	echo "round $round: $((jobs * ops)) operations passed (total $total), btrfs check clean, kernel view equal"
done
