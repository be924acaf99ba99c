#!/usr/bin/env bash
# reliability.sh — the reliability report: power cuts, device faults, fuzzing.
#
#   bench/reliability.sh [-b BUILD] [-s SEEDS] [-o OPS] [-k KERNEL] [-f FUZZ_SECONDS] [-w DIR]
#
# 1. Power cuts: for each of SEEDS seeds (default 4) and each workload (mix with
#    16 KiB nodes, mix with 4 KiB nodes, large overwrites, ENOSPC on a small
#    prefilled image; fallocate and clone (the full profile, its reference on
#    kernel btrfs); snapshots and their deletion; compression (zlib, lzo, zstd
#    in turn) over the mix and the overwrites; raid1 over 2 devices, raid5 and
#    raid6 over 3; butter's replay of a kernel-made tree log; a balance that
#    converts profiles, a full balance under snapshots, and a shrink that moves
#    block groups, each after a mix workload; a device removed from raid1 over 3
#    and from single data with dup metadata over 2, and one replaced by a new
#    image on the same two layouts (its writes recorded too)), butter-workload
#    runs OPS operations (default 400; fewer for the heavier ones) with the
#    recorder under it, then crashreplay replays every cut point (prefixes,
#    torn writes, reorders between flushes) and checks each with butter, btrfs
#    check, and the kernel for KERNEL states per workload (default 10); every
#    snapshot and log-replay state is also opened read-write by butter on
#    copies (drops finished, the log replayed) and checked again; RAID states
#    are also read with one device missing (raid5: required only where a
#    commit completed, the write hole is counted); remove and replace states
#    are opened with the devices a scan finds, and a sample read-write. A
#    table per workload follows: cut points replayed and consistent.
# 2. Faults: EIO on writes, torn writes, failing flushes, a vanishing device,
#    each at several points of a workload, on one device and on a raid1 member,
#    plus ENOSPC at every write and flush of one commit; each must stop the
#    workload with a clear message and leave the last committed state
#    (crashreplay --verify: butter, btrfs check, kernel mount).
# 3. Fuzzing: tests/fuzz/run.sh FUZZ_SECONDS (default 600; 0 skips it; needs
#    clang): open+walk, write path and decompressor harnesses.
#
# Prints one line per workload and scenario, then the totals. Needs root, loop
# devices, kernel btrfs, btrfs-progs. BUILD (default build/) must hold
# tests/tools/butter-workload and tests/tools/crashreplay. The exit status is
# 1 if anything was inconsistent, failed or found.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=build
seeds=4
ops=400
ksample=10
fuzz_secs=600
work=${TMPDIR:-/tmp}
while getopts "b:s:o:k:f:w:h" opt; do
	case $opt in
	b) build=$OPTARG ;;
	s) seeds=$OPTARG ;;
	o) ops=$OPTARG ;;
	k) ksample=$OPTARG ;;
	f) fuzz_secs=$OPTARG ;;
	w) work=$OPTARG ;;
	*) sed -n '2,36p' "$0"; exit 2 ;;
	esac
done
W=$build/tests/tools/butter-workload
R=$build/tests/tools/crashreplay
for t in "$W" "$R"; do
	[ -x "$t" ] || { echo "reliability.sh: $t missing (ninja -C $build)" >&2; exit 2; }
done
dir=$(mktemp -d "$work/butter-reliability-XXXXXX")
loops=()
cleanup() {
	findmnt -rn -o TARGET | grep "^$dir/" | sort -r | while read -r m; do umount "$m"; done
	for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT INT TERM
status=0
start_time=$(date +%s)

# ---- 1. power cuts --------------------------------------------------------------
states=0 consistent=0 failed=0 checked=0 kmounted=0 kagreed=0 durable=0 records=0
workload_failures=0

mkimage() { # mkimage PATH SIZE NODESIZE
	rm -f "$1"
	truncate -s "$2" "$1"
	mkfs.btrfs -q -f -n "$3" "$1" >/dev/null
}

prefill() { # prefill IMAGE BYTES: the kernel takes BYTES with a preallocated file
	local l
	l=$(losetup -f --show "$1")
	loops+=("$l")
	mkdir -p "$dir/mnt"
	mount "$l" "$dir/mnt"
	fallocate -l "$2" "$dir/mnt/filler"
	umount "$dir/mnt"
	btrfs device scan --forget "$l" 2>/dev/null || true
	losetup -d "$l"
	unset 'loops[-1]'
}

declare -A wl_states wl_consistent wl_failed wl_runs
wl_order=()
rw_opened=0 rw_agreed=0 rw_drops=0 rw_logs=0 deg_opened=0 deg_agreed=0 deg_tolerated=0

# replay_case NAME SEED OPS SYNC_EVERY: the workload on copies of $d/start0.img...
# (with "${wargs[@]}"), then crashreplay with "${rargs[@]}"; d, wargs, rargs set by the caller,
# and refdir if the reference is not to be a new directory
replay_case() {
	local name=$1 seed=$2 n=$3 sync_every=$4 line i=0 starts=() copies=() extra=()
	local ref=${refdir:-$d/ref}
	for img in "$d"/start*.img; do
		starts+=("$img")
		copies+=("$d/dev$i.img")
		cp --sparse=always "$img" "$d/dev$i.img"
		[ $i -gt 0 ] && extra+=(--device "$d/dev$i.img")
		i=$((i + 1))
	done
	mkdir -p "$d/ref"
	if ! "$W" "${extra[@]}" --record "$d/log" --manifest "$d/manifest" "${wargs[@]}" \
		"${copies[0]}" "$ref" "$seed" "$n" "$sync_every" > "$d/workload.out" 2>&1; then
		# still replay what it logged: every state up to the failure must be consistent
		echo "crash $name seed $seed: the workload failed:"; tail -n 5 "$d/workload.out"
		workload_failures=$((workload_failures + 1))
		status=1
	fi
	"$R" --work "$d" --kernel "$ksample" --seed "$seed" "${rargs[@]}" "$d/log" "$d/manifest" \
		"${starts[@]}" > "$d/replay.out" 2> "$d/replay.err" || status=1
	line=$(grep '^crashreplay:' "$d/replay.out" || echo "crashreplay: no summary")
	echo "crash $name seed $seed: ${line#crashreplay: }"
	if grep -q '^FAIL' "$d/replay.err"; then
		head -n 20 "$d/replay.err"
	fi
	set -- $(echo "$line" | sed -E 's/[^0-9]+/ /g')
	if [ $# -ge 21 ]; then
		records=$((records + $1)); states=$((states + $4)); consistent=$((consistent + $8))
		failed=$((failed + $9)); checked=$((checked + ${10})); kmounted=$((kmounted + ${11}))
		kagreed=$((kagreed + ${12})); durable=$((durable + ${13}))
		rw_opened=$((rw_opened + ${14})); rw_agreed=$((rw_agreed + ${15}))
		rw_drops=$((rw_drops + ${16})); rw_logs=$((rw_logs + ${17}))
		deg_opened=$((deg_opened + ${18})); deg_agreed=$((deg_agreed + ${19}))
		deg_tolerated=$((deg_tolerated + ${20}))
		[ -n "${wl_runs[$name]:-}" ] || wl_order+=("$name")
		wl_runs[$name]=$((${wl_runs[$name]:-0} + 1))
		wl_states[$name]=$((${wl_states[$name]:-0} + $4))
		wl_consistent[$name]=$((${wl_consistent[$name]:-0} + $8))
		wl_failed[$name]=$((${wl_failed[$name]:-0} + $9))
	else
		status=1
	fi
	rm -rf "$d"
}

crash_case() { # crash_case NAME SIZE NODESIZE SEED OPS SYNC_EVERY WORKLOAD-ARGS...
	local name=$1 size=$2 nodesize=$3 seed=$4 n=$5 sync_every=$6
	shift 6
	d="$dir/$name-$seed"
	mkdir -p "$d"
	mkimage "$d/start0.img" "$size" "$nodesize"
	[ "$name" = enospc ] && prefill "$d/start0.img" $((22 << 20))
	wargs=("$@")
	rargs=()
	[ "$name" = snapshot ] && rargs=(--rw-check 100000)
	replay_case "$name" "$seed" "$n" "$sync_every"
}

full_case() { # full_case SEED OPS: fallocate and clone too, the reference on kernel btrfs
	local seed=$1 l m="$dir/refmnt-$1"
	d="$dir/full-$seed"
	mkdir -p "$d" "$m"
	mkimage "$d/start0.img" $((128 << 20)) 16384
	mkimage "$dir/ref-$seed.img" $((512 << 20)) 16384
	l=$(losetup -f --show "$dir/ref-$seed.img")
	loops+=("$l")
	mount "$l" "$m"
	wargs=(--profile full --max-file $((1 << 20)))
	rargs=()
	refdir=$m replay_case full "$seed" "$2" 10
	umount "$m"
	btrfs device scan --forget "$l" 2>/dev/null || true
	losetup -d "$l"
	unset 'loops[-1]'
	rm -rf "$m" "$dir/ref-$seed.img"
}

raid_case() { # raid_case PROFILE DEVICES DEGRADED-OPTION SEED OPS
	local profile=$1 ndev=$2 i imgs=()
	d="$dir/$profile-$4"
	mkdir -p "$d"
	for i in $(seq 0 $((ndev - 1))); do
		truncate -s 256M "$d/start$i.img"
		imgs+=("$d/start$i.img")
	done
	mkfs.btrfs -q -f -d "$profile" -m "$profile" "${imgs[@]}" > /dev/null 2>&1 ||
		{ echo "mkfs.btrfs -d $profile failed" >&2; exit 2; }
	wargs=(--profile mix --max-file $((1 << 20)))
	rargs=("$3")
	replay_case "$profile" "$4" "$5" 15
}

# device_case NAME DATA META DEVICES remove|replace SEED OPS: a mix workload on a
# multi-device filesystem, then the device with the highest devid removed, or replaced
# by a new image (which joins the record log as the next device)
device_case() {
	local name=$1 ndev=$4 i imgs=()
	d="$dir/$name-$6"
	mkdir -p "$d"
	for i in $(seq 0 $((ndev - 1))); do
		truncate -s 256M "$d/start$i.img"
		imgs+=("$d/start$i.img")
	done
	mkfs.btrfs -q -f -d "$2" -m "$3" "${imgs[@]}" > /dev/null 2>&1 ||
		{ echo "mkfs.btrfs -d $2 -m $3 failed" >&2; exit 2; }
	truncate -s 256M "$d/new.img"
	wargs=(--profile mix --max-file $((1 << 20)) --balance "$5" --new-device "$d/new.img")
	rargs=(--rw-check 60)
	replay_case "$name" "$6" "$7" 15
}

logreplay_case() { # logreplay_case SEED: a kernel-made image with a tree log, butter's replay
	local seed=$1 l
	d="$dir/logreplay-$seed"
	mkdir -p "$d/mnt"
	mkimage "$d/base.img" $((256 << 20)) 16384
	l=$(losetup -f --show "$d/base.img")
	loops+=("$l")
	mount -o commit=300 "$l" "$d/mnt"
	python3 - "$d/mnt" "$seed" <<'PY'
import os, random, subprocess, sys
mnt, rnd = sys.argv[1], random.Random(int(sys.argv[2]))
def put(path, data, fsync=True):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data)
    if fsync:
        os.fsync(fd)
    os.close(fd)
for d in ("d", "e"):
    os.makedirs(os.path.join(mnt, d))
for i in range(30):
    put(os.path.join(mnt, "e", f"f{i}"), rnd.randbytes(rnd.randrange(200000)), False)
subprocess.run(["btrfs", "filesystem", "sync", mnt], check=True)
os.rename(os.path.join(mnt, "e", "f3"), os.path.join(mnt, "d", "f3moved"))
put(os.path.join(mnt, "d", "f3moved"), b"renamed")
for i in range(40):
    put(os.path.join(mnt, "d", f"new{i}"), rnd.randbytes(rnd.randrange(300000)))
    if i % 7 == 0 and i != 7:
        os.unlink(os.path.join(mnt, "e", f"f{i // 2}"))
PY
	cp --sparse=always "$d/base.img" "$d/start0.img"
	umount "$d/mnt"
	btrfs device scan --forget "$l" 2>/dev/null || true
	losetup -d "$l"
	unset 'loops[-1]'
	rm -f "$d/base.img"
	if ! btrfs inspect-internal dump-super "$d/start0.img" |
		grep -Eq '^log_root[[:space:]]+[1-9]'; then
		echo "crash logreplay seed $seed: skipped (the kernel committed instead of logging)"
		rm -rf "$d"
		return
	fi
	wargs=(--log-replay --profile mix)
	rargs=(--rw-check 100000)
	replay_case logreplay "$seed" 0 50
}

for seed in $(seq 1 "$seeds"); do
	crash_case mix $((128 << 20)) 16384 "$seed" "$ops" 20 --profile mix --max-file $((1 << 20))
	crash_case mix-4k $((128 << 20)) 4096 "$seed" "$ops" 7 --profile mix --max-file $((1 << 20))
	crash_case overwrite $((128 << 20)) 16384 "$seed" $((ops / 4)) 4 --profile overwrite \
		--max-file $((4 << 20))
	crash_case enospc $((110 << 20)) 16384 "$seed" $((ops / 2)) 5 --profile fill \
		--max-file $((2 << 20)) --enospc-ok
	full_case "$seed" "$ops"
	crash_case snapshot $((128 << 20)) 16384 "$seed" $((ops / 2)) 10 --profile snapshot \
		--max-file $((1 << 18))
	crash_case compress-mix $((128 << 20)) 16384 "$seed" "$ops" 20 --profile mix \
		--max-file $((1 << 20)) --compress cycle
	crash_case compress-overwrite $((128 << 20)) 16384 "$seed" $((ops / 8)) 4 \
		--profile overwrite --max-file $((2 << 20)) --compress cycle
	# relocation: a workload, then a balance (conversion; full under snapshots) or a shrink
	crash_case balance-convert $((256 << 20)) 16384 "$seed" "$ops" 20 --profile mix \
		--max-file $((1 << 20)) --balance convert
	crash_case balance-snapshots $((256 << 20)) 16384 "$seed" $((ops / 2)) 10 --profile snapshot \
		--max-file $((1 << 18)) --balance full
	crash_case shrink $((256 << 20)) 16384 "$seed" "$ops" 20 --profile mix \
		--max-file $((1 << 20)) --balance shrink
	# device remove and replace on multi-device filesystems
	device_case remove-raid1 raid1 raid1 3 remove "$seed" $((ops / 2))
	device_case remove-dup single dup 2 remove "$seed" $((ops / 2))
	device_case replace-raid1 raid1 raid1 3 replace "$seed" $((ops / 2))
	device_case replace-dup single dup 2 replace "$seed" $((ops / 2))
	raid_case raid1 2 --degraded "$seed" $((ops / 2))
	raid_case raid5 3 --degraded-commits "$seed" $((ops / 2))
	raid_case raid6 3 --degraded "$seed" $((ops / 2))
	logreplay_case "$seed"
done

# ---- 2. device faults -----------------------------------------------------------
fault_total=0 fault_passed=0

count() { # count LOG DEV TYPE: records of TYPE (2 write, 3 flush) of device DEV
	python3 - "$1" "$2" "$3" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
dev, typ, pos, n = int(sys.argv[2]), int(sys.argv[3]), 16, 0
while pos + 24 <= len(data):
    t, d, _, ln = data[pos], *struct.unpack_from("<IQQ", data, pos + 4)
    n += t == typ and d == dev
    pos += 24 + ln
print(n)
PY
}

fault_case() { # fault_case LABEL SPEC EXPECT OPS SYNC IMAGES...
	local label=$1 spec=$2 expect=$3 n=$4 sync_every=$5 i=0 d extra=() copies=()
	shift 5
	fault_total=$((fault_total + 1))
	d="$dir/fault-$fault_total"
	mkdir -p "$d/ref"
	for img in "$@"; do
		cp --sparse=always "$img" "$d/dev$i.img"
		copies+=("$d/dev$i.img")
		[ $i -gt 0 ] && extra+=(--device "$d/dev$i.img")
		i=$((i + 1))
	done
	local rc=0
	"$W" "${extra[@]}" --profile mix --fault "$spec" --manifest "$d/manifest" \
		--max-file $((1 << 20)) \
		"${copies[0]}" "$d/ref" 3 "$n" "$sync_every" > "$d/out" 2> "$d/err" || rc=$?
	if [ $rc -ne 3 ] || ! grep -q "stopped: .*$expect" "$d/out"; then
		echo "fault $label ($spec): FAIL: the fault did not stop the workload as expected (exit $rc)"
		tail -n 3 "$d/out" "$d/err"
		status=1
	elif ! "$R" --verify --work "$d" --kernel 1 "$d/manifest" "${copies[@]}" > "$d/verify.out" \
		2> "$d/verify.err"; then
		echo "fault $label ($spec): FAIL: the image is not the last committed state"
		head -n 20 "$d/verify.err"
		status=1
	else
		fault_passed=$((fault_passed + 1))
		echo "fault $label ($spec): ok: $(grep -m1 'stopped:' "$d/out" | cut -c10-)"
	fi
	rm -rf "$d"
}

mkimage "$dir/single.img" $((128 << 20)) 16384
truncate -s 256M "$dir/r1a.img" "$dir/r1b.img"
mkfs.btrfs -q -f -d raid1 -m raid1 "$dir/r1a.img" "$dir/r1b.img" >/dev/null
for layout in single raid1; do
	if [ $layout = single ]; then imgs=("$dir/single.img"); dev=0; sel=""
	else imgs=("$dir/r1a.img" "$dir/r1b.img"); dev=1; sel=",dev=1"; fi
	mkdir -p "$dir/clean/ref"
	extra=()
	[ $layout = raid1 ] && { cp --sparse=always "${imgs[1]}" "$dir/clean/b.img"; extra=(--device "$dir/clean/b.img"); }
	cp --sparse=always "${imgs[0]}" "$dir/clean/a.img"
	"$W" "${extra[@]}" --profile mix --record "$dir/clean/log" --max-file $((1 << 20)) \
		"$dir/clean/a.img" "$dir/clean/ref" 3 100 10 > /dev/null
	writes=$(count "$dir/clean/log" $dev 2)
	flushes=$(count "$dir/clean/log" $dev 3)
	rm -rf "$dir/clean"
	for pct in 5 20 35 50 65 80 95; do
		fault_case "$layout write-eio" "write-eio=$((writes * pct / 100))$sel" "Input/output error" \
			100 10 "${imgs[@]}"
	done
	for pct in 15 45 75; do
		fault_case "$layout torn" "torn=$((writes * pct / 100))$sel" "Input/output error" \
			100 10 "${imgs[@]}"
	done
	for k in 1 $((flushes / 3)) $((flushes * 2 / 3)) $((flushes - 1)); do
		fault_case "$layout flush-eio" "flush-eio=$k$sel" "Input/output error" 100 10 "${imgs[@]}"
	done
	for pct in 10 50 90; do
		fault_case "$layout vanish" "vanish=$(((writes + flushes) * pct / 100))$sel,err=ENXIO" \
			"No such device or address" 100 10 "${imgs[@]}"
	done
done
# ENOSPC at every write and flush of one commit
mkdir -p "$dir/one/ref"
cp --sparse=always "$dir/single.img" "$dir/one/a.img"
"$W" --profile mix --record "$dir/one/log" --max-file $((1 << 20)) "$dir/one/a.img" "$dir/one/ref" 3 8 8 \
	> /dev/null
writes=$(count "$dir/one/log" 0 2)
flushes=$(count "$dir/one/log" 0 3)
for n in $(seq 0 $((writes - 1))); do
	fault_case "enospc commit" "write-eio=$n,err=ENOSPC" "No space left on device" 8 8 \
		"$dir/single.img"
done
for k in $(seq 0 $((flushes - 1))); do
	fault_case "enospc commit" "flush-eio=$k,err=ENOSPC" "No space left on device" 8 8 \
		"$dir/single.img"
done

# ---- 3. fuzzing -----------------------------------------------------------------
fuzz_execs=0 fuzz_findings=0 fuzz_line="skipped"
if [ "$fuzz_secs" -gt 0 ]; then
	if command -v clang >/dev/null; then
		if tests/fuzz/run.sh "$fuzz_secs" > "$dir/fuzz.out" 2>&1; then
			fuzz_line="no findings"
		else
			fuzz_findings=$(ls tests/fuzz/crashes 2>/dev/null | wc -l)
			[ "$fuzz_findings" -gt 0 ] || fuzz_findings=1
			fuzz_line="FINDINGS (tests/fuzz/crashes/)"
			status=1
		fi
		grep '^run.sh:' "$dir/fuzz.out" || true
		fuzz_execs=$(sed -n 's/^run.sh: .*: \([0-9]*\) executions.*/\1/p' "$dir/fuzz.out" |
			awk '{ n += $1 } END { print n + 0 }')
	else
		fuzz_line="skipped (no clang)"
	fi
fi

end_time=$(date +%s)
echo
echo "== reliability report ($(git -C "$repo" rev-parse --short HEAD), $((end_time - start_time)) s)"
printf 'power cuts:   %d cut points replayed from %d records, %d consistent, %d inconsistent\n' \
	"$states" "$records" "$consistent" "$failed"
printf '              %d checked by btrfs check, %d mounted by the kernel (%d agreed)\n' \
	"$checked" "$kmounted" "$kagreed"
printf '              %d workloads failed by themselves (their logs were replayed too)\n' \
	"$workload_failures"
printf '              %d fsynced bytes verified (%s MiB)\n' "$durable" \
	"$(awk -v b="$durable" 'BEGIN { printf "%.1f", b / 1048576 }')"
printf '              %d states opened read-write on copies, %d agreed (%d finished a subvolume\n' \
	"$rw_opened" "$rw_agreed" "$rw_drops"
printf '              drop, %d replayed a tree log)\n' "$rw_logs"
printf '              %d states opened degraded, %d agreed, %d unreadable mid-commit\n' \
	"$deg_opened" "$deg_agreed" "$deg_tolerated"
printf '              (raid5: the write hole)\n'
printf '              %-20s %5s %10s %10s %6s\n' workload runs cut-points consistent failed
for w in "${wl_order[@]}"; do
	printf '              %-20s %5d %10d %10d %6d\n' "$w" "${wl_runs[$w]}" "${wl_states[$w]}" \
		"${wl_consistent[$w]}" "${wl_failed[$w]}"
done
printf 'faults:       %d of %d scenarios passed\n' "$fault_passed" "$fault_total"
printf 'fuzzing:      %d executions in %d s, %s (%d)\n' "$fuzz_execs" "$fuzz_secs" "$fuzz_line" \
	"$fuzz_findings"
exit $status
