#!/usr/bin/env bash
# bench/snapshots.sh — what snapshots cost a later overwrite: the seed's experiment, on
# butter's mount and on the kernel's btrfs (loop device) in one run, same disk.
#
# Each round, on each target, on a fresh filesystem (image files in $BENCH_DIR):
#   plain   write a SIZE file (random bytes), commit; then time: overwrite it in place
#           (dd bs=1M conv=notrunc) and commit
#   snap    the same, but SNAPS snapshots of the subvolume holding the file are taken
#           (and committed) before the timed overwrite: every leaf and extent of the file
#           is then shared SNAPS+1 ways, and the overwrite must unshare them
# "commit" is `butter filesystem sync` on butter's mount and `btrfs filesystem sync` on
# the kernel's. Page caches are dropped before each timed overwrite. Rounds interleave the
# targets and cases, so load from elsewhere falls on all alike.
#
# Prints each timed overwrite, then the medians and the ratio snap/plain per target (the
# cost snapshots add; the issue's goal for butter: <= 1.2x) and butter/kernel per case.
#
# Usage: sudo bench/snapshots.sh [-s SIZE_MIB] [-k SNAPS] [-r ROUNDS] [--keep]
#   -s SIZE_MIB  the file's size (default 400)
#   -k SNAPS     snapshots before the overwrite (default 10)
#   -r ROUNDS    rounds (default 5; medians are printed)
#   --keep       keep $BENCH_DIR's images and logs afterwards
# Environment: BENCH_DIR (default /tmp/butter-snapshots-bench), BUTTER (a butter binary
#   instead of building $REPO/build-bench, release, no sanitizers).
# Needs root (loop devices, mounts), mkfs.btrfs, btrfs, fusermount3, python3.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/butter-snapshots-bench}
SIZE_MIB=400 SNAPS=10 ROUNDS=5 KEEP=0
die() { echo "snapshots.sh: $*" >&2; exit 2; }
while (($#)); do
	case $1 in
	-s) [[ $# -ge 2 ]] || die "-s needs a size in MiB"; SIZE_MIB=$2; shift 2 ;;
	-k) [[ $# -ge 2 ]] || die "-k needs a number"; SNAPS=$2; shift 2 ;;
	-r) [[ $# -ge 2 ]] || die "-r needs a number"; ROUNDS=$2; shift 2 ;;
	--keep) KEEP=1; shift ;;
	-h|--help) sed -n '2,/^# Needs root/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (try --help)" ;;
	esac
done
for v in SIZE_MIB ROUNDS; do [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer"; done
[[ $SNAPS =~ ^[0-9]+$ ]] || die "-k must be a number"
[[ $(id -u) -eq 0 ]] || die "must run as root (loop devices, mounts)"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
bench_need mkfs.btrfs btrfs losetup mount umount mountpoint fusermount3 python3 dd
bench_dirs
mkdir -p "$BENCH_DIR/mnt"
bench_butter
MNT=$BENCH_DIR/mnt
IMG=$BENCH_DIR/fs.img
SRC=$BENCH_DIR/src.bin
LOOP= DAEMON_PID=
IMG_MIB=$((SIZE_MIB * 3 + 1024))

cleanup() {
	set +e
	if mountpoint -q "$MNT"; then fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT"; fi
	[[ -n $DAEMON_PID ]] && wait "$DAEMON_PID" 2>/dev/null
	[[ -n $LOOP ]] && losetup -d "$LOOP"
	((KEEP)) || rm -f "$IMG" "$SRC"
}
trap cleanup EXIT

now() { date +%s.%N; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# mount a fresh filesystem of target $1 on $MNT
fresh() {
	rm -f "$IMG"
	truncate -s "${IMG_MIB}M" "$IMG"
	mkfs.btrfs -q -f "$IMG" >/dev/null
	if [[ $1 == butter ]]; then
		"$BUTTER" mount -f "$IMG" "$MNT" >"$LOGS/daemon.log" 2>&1 &
		DAEMON_PID=$!
		for _ in $(seq 200); do mountpoint -q "$MNT" && break; sleep 0.05; done
		mountpoint -q "$MNT" || { cat "$LOGS/daemon.log" >&2; die "butter mount failed"; }
	else
		LOOP=$(losetup -f --show "$IMG")
		mount -o noatime "$LOOP" "$MNT"
	fi
}

gone() {
	if [[ $1 == butter ]]; then
		fusermount3 -u "$MNT"
		wait "$DAEMON_PID" || die "butter daemon failed (see $LOGS/daemon.log)"
		DAEMON_PID=
		# the oracle: what butter wrote passes btrfs check
		btrfs check --readonly "$IMG" >"$LOGS/check.log" 2>&1 ||
			{ cat "$LOGS/check.log" >&2; die "btrfs check failed on butter's image"; }
	else
		umount "$MNT"
		losetup -d "$LOOP"
		LOOP=
	fi
}

commit() {
	if [[ $1 == butter ]]; then "$BUTTER" filesystem sync "$MNT" >/dev/null; else btrfs -q filesystem sync "$MNT"; fi
}

snapshot() {
	if [[ $1 == butter ]]; then
		"$BUTTER" subvolume snapshot "$MNT" "$MNT/snap$2" >/dev/null
	else
		btrfs -q subvolume snapshot "$MNT" "$MNT/snap$2" >/dev/null
	fi
}

# seconds of one overwrite + commit on target $1, case $2
one() {
	local t=$1 c=$2 t0 t1 i
	fresh "$t"
	dd if="$SRC" of="$MNT/file" bs=1M status=none
	commit "$t"
	if [[ $c == snap ]]; then
		for ((i = 1; i <= SNAPS; i++)); do snapshot "$t" "$i"; done
		commit "$t"
	fi
	drop_caches
	t0=$(now)
	dd if="$SRC" of="$MNT/file" bs=1M conv=notrunc status=none
	commit "$t"
	t1=$(now)
	# the snapshots still hold the old bytes, the file the new ones (same bytes: cmp both)
	if [[ $c == snap ]]; then cmp -s "$SRC" "$MNT/snap1/file" || die "$t: snapshot changed"; fi
	cmp -s "$SRC" "$MNT/file" || die "$t: file differs after the overwrite"
	gone "$t"
	echo "$t1 - $t0" | bc
}

bench_butter_line
echo "== $SIZE_MIB MiB file, $SNAPS snapshots, $ROUNDS rounds; images in $BENCH_DIR"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$SRC"
declare -A T
for ((r = 1; r <= ROUNDS; r++)); do
	for t in butter kernel; do
		for c in plain snap; do
			s=$(one "$t" "$c")
			T[$t.$c]+="$s "
			printf "round %d  %-6s %-5s %8.3f s\n" "$r" "$t" "$c" "$s"
		done
	done
done

python3 - "${T[butter.plain]}" "${T[butter.snap]}" "${T[kernel.plain]}" "${T[kernel.snap]}" <<'EOF'
import statistics, sys
bp, bs, kp, ks = ([float(x) for x in a.split()] for a in sys.argv[1:])
m = statistics.median
print(f"\n{'target':8} {'plain (s)':>10} {'snap (s)':>10} {'snap/plain':>11}")
for name, p, s in (("butter", bp, bs), ("kernel", kp, ks)):
    print(f"{name:8} {m(p):10.3f} {m(s):10.3f} {m(s) / m(p):10.2f}x")
print(f"\nbutter/kernel time: plain {m(bp) / m(kp):.2f}x, snap {m(bs) / m(ks):.2f}x")
ratio = m(bs) / m(bp)
print(f"butter snap/plain {ratio:.2f}x (goal <= 1.2x: {'met' if ratio <= 1.2 else 'NOT met'})")
EOF
