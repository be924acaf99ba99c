#!/usr/bin/env bash
# bench/relocate.sh — moving what is on disk, butter beside the kernel's btrfs and dd, in one
# run on the same disk (image files in $BENCH_DIR). Three experiments:
#
#   replace   raid1 over two 4 GiB images holding DATA_MIB of data (written by the kernel);
#             device 2 is replaced by a new image three ways, each on its own copy:
#             `butter replace start` (offline), the kernel's `btrfs replace start -B` (loop
#             devices, mounted), and `dd` of the whole old image (what MD's rebuild does).
#             Prints seconds, the bytes written to the new device, and the ratio of those
#             bytes to what the old device held (used bytes, one copy).
#   balance   a 6 GiB image holding BAL_MIB of data with 5 snapshots (rewrites between them)
#             and reflinks: a full balance by `butter balance start` (offline) and by the
#             kernel (`btrfs balance start --full-balance`, mounted); seconds, the ratio
#             butter/kernel, and data used before and after on each (sharing kept: 1.00).
#   shrink    a 4 GiB image holding 500 MiB: `butter filesystem resize` down to the smallest
#             size one command accepts on the image as filled (binary search in 16 MiB steps,
#             each try on a fresh copy), that command's time, the size, btrfs check's verdict.
#
# Page caches are dropped before every timed step. Usage: sudo bench/relocate.sh [--keep]
# Environment: BENCH_DIR (default /tmp/butter-relocate-bench), BUTTER (a butter binary
# instead of building $REPO/build-bench), DATA_MIB (1024), BAL_MIB (2048).
# Needs root (loop devices, mounts), mkfs.btrfs, btrfs, python3.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/butter-relocate-bench}
DATA_MIB=${DATA_MIB:-1024}
BAL_MIB=${BAL_MIB:-2048}
KEEP=0
die() { echo "relocate.sh: $*" >&2; exit 2; }
while (($#)); do
	case $1 in
	--keep) KEEP=1; shift ;;
	-h|--help) sed -n '2,/^# Needs root/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (try --help)" ;;
	esac
done
[[ $(id -u) -eq 0 ]] || die "must run as root (loop devices, mounts)"
for c in mkfs.btrfs btrfs losetup mount umount python3; do
	command -v "$c" >/dev/null || die "missing command: $c"
done
mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
LOGS=$BENCH_DIR/logs
rm -rf "$LOGS" "$BENCH_DIR"/*.img "$BENCH_DIR"/mnt
mkdir -p "$LOGS" "$BENCH_DIR/mnt"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
bench_butter
MNT=$BENCH_DIR/mnt
LOOPS=()

cleanup() {
	set +e
	mountpoint -q "$MNT" && umount "$MNT"
	for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null; done
	((KEEP)) || rm -rf "$BENCH_DIR"/*.img
}
trap cleanup EXIT

attach() { # attach IMAGE...: loop devices in LOOPS, scanned
	LOOPS=()
	for i in "$@"; do LOOPS+=("$(losetup -f --show "$i")"); done
	btrfs device scan "${LOOPS[@]}" >/dev/null
}
detach() {
	for l in "${LOOPS[@]}"; do losetup -d "$l"; done
	LOOPS=()
	btrfs device scan --forget >/dev/null 2>&1 || true
}
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.2f}')"; }
fill() { # fill DIR MIB SEED: random files of 1-64 MiB
	python3 - "$@" <<'EOF'
import os, random, sys
d, mib, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
left, i = mib << 20, 0
while left > 0:
    n = min(left, rng.randint(1, 64) << 20)
    with open(os.path.join(d, f"f{seed}-{i}"), "wb") as f:
        f.write(os.urandom(n))
    left -= n
    i += 1
EOF
}
data_used() { btrfs filesystem df --raw "$1" | awk -F'used=' '/^Data/ {s += $2} END {print s}'; }

bench_butter_line
echo "== $(nproc) cpus, $(uname -r), btrfs-progs $(btrfs --version | awk '{print $2}')"

# ---- replace ------------------------------------------------------------------------
echo
echo "replace: raid1 on two 4 GiB images, ${DATA_MIB} MiB of data, device 2 replaced"
A=$BENCH_DIR/r-a.img B=$BENCH_DIR/r-b.img
truncate -s 4G "$A" "$B"
mkfs.btrfs -q -f -d raid1 -m raid1 "$A" "$B" >/dev/null
attach "$A" "$B"
mount "${LOOPS[0]}" "$MNT"
fill "$MNT" "$DATA_MIB" 1
btrfs filesystem sync "$MNT"
used=$(btrfs filesystem df --raw "$MNT" | awk -F'used=' '/^(Data|Metadata|System)/ {s += $2} END {print s}')
umount "$MNT"
detach
for who in butter kernel dd; do
	cp --sparse=always "$A" "$BENCH_DIR/$who-a.img"
	cp --sparse=always "$B" "$BENCH_DIR/$who-b.img"
	truncate -s 4G "$BENCH_DIR/$who-new.img"
done
drop
t0=$(now)
"$BUTTER" replace start --device "$BENCH_DIR/butter-b.img" 2 "$BENCH_DIR/butter-new.img" \
	"$BENCH_DIR/butter-a.img" >"$LOGS/butter-replace.log" 2>&1 || { cat "$LOGS/butter-replace.log"; die "butter replace failed"; }
t1=$(now)
bw=$(du -B1 "$BENCH_DIR/butter-new.img" | cut -f1)
attach "$BENCH_DIR/kernel-a.img" "$BENCH_DIR/kernel-b.img"
NEW=$(losetup -f --show "$BENCH_DIR/kernel-new.img")
LOOPS+=("$NEW")
mount "${LOOPS[0]}" "$MNT"
drop
t2=$(now)
btrfs replace start -B -f 2 "$NEW" "$MNT" >"$LOGS/kernel-replace.log" 2>&1
t3=$(now)
umount "$MNT"
detach
kw=$(du -B1 "$BENCH_DIR/kernel-new.img" | cut -f1)
drop
t4=$(now)
dd if="$BENCH_DIR/dd-b.img" of="$BENCH_DIR/dd-new.img" bs=4M conv=fsync,notrunc status=none
t5=$(now)
printf "  %-22s %8s s  %12s bytes written  %5s x used (%s bytes used on the old device)\n" \
	"butter replace" "$(secs "$t0" "$t1")" "$bw" "$(python3 -c "print(f'{$bw/$used:.2f}')")" "$used"
printf "  %-22s %8s s  %12s bytes written  %5s x used\n" \
	"kernel btrfs replace" "$(secs "$t2" "$t3")" "$kw" "$(python3 -c "print(f'{$kw/$used:.2f}')")"
printf "  %-22s %8s s  %12s bytes written  %5s x used\n" \
	"dd (whole device)" "$(secs "$t4" "$t5")" "$((4 << 30))" "$(python3 -c "print(f'{(4<<30)/$used:.2f}')")"
echo "  (bytes written: blocks allocated in the new sparse image)"
rm -f "$BENCH_DIR"/*-new.img "$BENCH_DIR"/r-*.img "$BENCH_DIR"/butter-?.img "$BENCH_DIR"/kernel-?.img "$BENCH_DIR"/dd-?.img

# ---- full balance -------------------------------------------------------------------------
echo
echo "balance: 6 GiB image, ${BAL_MIB} MiB of data, 5 snapshots, reflinks; full balance"
I=$BENCH_DIR/bal.img
truncate -s 6G "$I"
mkfs.btrfs -q -f "$I" >/dev/null
attach "$I"
mount "${LOOPS[0]}" "$MNT"
fill "$MNT" $((BAL_MIB / 2)) 2
for s in 1 2 3 4 5; do
	btrfs subvolume snapshot -r "$MNT" "$MNT/snap$s" >/dev/null
	fill "$MNT" $((BAL_MIB / 10)) $((10 + s))
	for f in "$MNT"/f2-*; do cp --reflink=always "$f" "$f.r$s"; break; done
done
btrfs filesystem sync "$MNT"
before=$(data_used "$MNT")
umount "$MNT"
detach
cp --sparse=always "$I" "$BENCH_DIR/bal-k.img"
drop
t0=$(now)
"$BUTTER" balance start "$I" >"$LOGS/butter-balance.log" 2>&1 || { cat "$LOGS/butter-balance.log"; die "butter balance failed"; }
t1=$(now)
attach "$I"
mount -o ro "${LOOPS[0]}" "$MNT"
bafter=$(data_used "$MNT")
umount "$MNT"
detach
btrfs check --readonly "$I" >"$LOGS/check-balance.log" 2>&1 && bcheck=clean || bcheck=ERRORS
attach "$BENCH_DIR/bal-k.img"
mount "${LOOPS[0]}" "$MNT"
drop
t2=$(now)
btrfs balance start --full-balance "$MNT" >"$LOGS/kernel-balance.log" 2>&1
t3=$(now)
kafter=$(data_used "$MNT")
umount "$MNT"
detach
bt=$(secs "$t0" "$t1") kt=$(secs "$t2" "$t3")
printf "  %-22s %8s s  data used %s -> %s (%s x)  btrfs check: %s\n" "butter balance" "$bt" \
	"$before" "$bafter" "$(python3 -c "print(f'{$bafter/$before:.3f}')")" "$bcheck"
printf "  %-22s %8s s  data used %s -> %s (%s x)\n" "kernel balance" "$kt" \
	"$before" "$kafter" "$(python3 -c "print(f'{$kafter/$before:.3f}')")"
echo "  speed butter/kernel: $(python3 -c "print(f'{$kt/$bt:.2f}')")x (above 1: butter faster)"
rm -f "$I" "$BENCH_DIR/bal-k.img"

# ---- offline shrink ----------------------------------------------------------------------
echo
echo "shrink: a 4 GiB image holding 500 MiB, offline, to the smallest size accepted"
S=$BENCH_DIR/shrink.img
truncate -s 4G "$S"
mkfs.btrfs -q -f "$S" >/dev/null
attach "$S"
mount "${LOOPS[0]}" "$MNT"
fill "$MNT" 500 3
btrfs filesystem sync "$MNT"
used=$(btrfs filesystem df --raw "$MNT" | awk -F'used=' '/^(Data|Metadata|System)/ {s += $2} END {print s}')
umount "$MNT"
detach
# the smallest size one `resize` accepts on the image as it was: a binary search in 16 MiB
# steps between the used bytes and 4 GiB, each try on a fresh copy (a refused try may already
# have moved groups); the time is that of the accepted command alone
cp --sparse=always "$S" "$S.orig"
lo=$(( used / (16 << 20) )) hi=$(( 4 << 6 )) tries=0 best_t=""
while ((lo < hi)); do
	mid=$(( (lo + hi) / 2 ))
	tries=$((tries + 1))
	cp --sparse=always "$S.orig" "$S"
	drop
	t0=$(now)
	if "$BUTTER" filesystem resize "$((mid << 24))" "$S" >"$LOGS/shrink.log" 2>&1; then
		t1=$(now)
		hi=$mid best_t=$(secs "$t0" "$t1")
	else
		lo=$((mid + 1))
	fi
done
size=$((hi << 24))
cp --sparse=always "$S.orig" "$S"
"$BUTTER" filesystem resize "$size" "$S" >"$LOGS/shrink.log" 2>&1 || die "shrink to $size failed"
rm -f "$S.orig"
truncate -s "$size" "$S"
btrfs check --readonly "$S" >"$LOGS/check-shrink.log" 2>&1 && scheck=clean || scheck=ERRORS
printf "  %-22s %8s s  4 GiB -> %s MiB (%s MiB used; smallest of %d tries)  btrfs check: %s\n" \
	"butter resize" "${best_t:-?}" "$((size >> 20))" "$((used >> 20))" "$tries" "$scheck"
