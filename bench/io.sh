#!/usr/bin/env bash
# bench/io.sh — file I/O and metadata through `butter mount`, side by side with the
# kernel's btrfs, ext4 and a plain file, in one run on the same disk:
#
#   butter   butter mount (release build) of a fresh mkfs.btrfs image file
#   btrfs    the kernel's btrfs on a loop device over an image file
#   ext4     ext4 on a loop device over an image file
#   dd       dd to and from a plain file in $BENCH_DIR (anchor: the disk through the host fs)
#   nullfs   bench/nullfs.c: a FUSE daemon with butter's FUSE settings (and its request loop:
#            fuse/pollloop.c with butter's spin=, libfuse's with spin=0, fuse/uring.c with
#            BUTTER_OPTS=uring) that keeps names and
#            attributes in memory and does nothing else; metadata only. Its rate is the
#            most any daemon on this libfuse and kernel can reach (the round trips alone):
#            null/btrfs is that ceiling, b/null how close butter comes to it
#
# All image files and the plain file live in $BENCH_DIR (one disk). Workloads, each on
# every target in turn, page caches dropped (`echo 3 > drop_caches`) before each read:
#
#   seq-write   fio: write a SIZE file (default 1 GiB) in 1 MiB blocks, fsync at the end
#   seq-read    fio: read it back in 1 MiB blocks
#   rand-read   fio: 4 KiB random reads of that file for RUNTIME seconds (default 30)
#   rand-write  fio: 4 KiB random overwrites of that file for RUNTIME seconds, fsync at the end
#   meta-*      N small files (default 100000, 100 bytes each) in 100 directories: create,
#               stat, rename (within the directory), unlink; then a commit (fsync of the
#               mount's root: butter commits, the kernel's btrfs and ext4 sync), timed apart;
#               all targets stay mounted and take turns (butter, btrfs, ext4, nullfs, then
#               again), so load from elsewhere falls on all alike; with -r R there are R
#               rounds (a fresh directory each time) and the best of each phase counts, so
#               one burst of load (or butter's 30 s commit landing in a phase) does not
#               decide the ratio
#
# dd does the sequential pair only (`dd bs=1M conv=fdatasync`, then a cold read).
# Results: MiB/s for bandwidth, IOPS for random I/O, files/s for metadata; then the
# ratios butter/btrfs and butter/ext4 with the targets of issue 4 (sequential >= 0.8x
# kernel btrfs; random and metadata >= 0.5x), butter/nullfs and nullfs/btrfs (a target
# above nullfs/btrfs is out of reach of any daemon here), the daemon's peak RSS (VmHWM),
# and the FUSE requests each common operation costs on butter and on nullfs, as the
# kernel counts them (bench/fusereqs.py; kernels with fuse trace events, 6.14+).
#
# Usage: sudo bench/io.sh [-s SIZE] [-t RUNTIME] [-n FILES] [-r RUNS] [--meta-only] [--pin CPU] [--keep]
#   -s SIZE     sequential file size for fio (default 1G; fio syntax: 256M, 1G)
#   -t SECONDS  random I/O runtime per target (default 30)
#   -n FILES    metadata run file count (default 100000; a multiple of 100 is used)
#   -r RUNS     metadata runs per target, best of each phase counts (default 1)
#   --meta-only the metadata workload alone (no fio, no dd)
#   --pin CPU   run the FUSE daemons and the metadata runs on CPU alone (taskset): each
#               request then runs between the caller's steps on one CPU, and a rate is
#               the work the caller, the kernel and the daemon do, without the
#               scheduler's placement and the wake-ups of idle CPUs, which on a VM
#               swing unpinned rates by a quarter from run to run
#   --keep      keep $BENCH_DIR's images and logs afterwards
# Environment: BENCH_DIR (default /tmp/butter-io-bench), BUTTER (a butter binary instead
#   of building $REPO/build-bench, release, no sanitizers), BUTTER_OPTS (-o options).
# Needs root (loop devices, mounts, drop_caches), mkfs.btrfs, mkfs.ext4, fusermount3,
# python3; fio is installed with apt-get if missing.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/butter-io-bench}
BUTTER=${BUTTER:-}
BUTTER_OPTS=${BUTTER_OPTS:-}
SIZE=1G RUNTIME=30 NFILES=100000 META_RUNS=1 KEEP=0 META_ONLY=0 PIN=

die() { echo "io.sh: $*" >&2; exit 2; }
# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"

while (($#)); do
	case $1 in
	-s) [[ $# -ge 2 ]] || die "-s needs a size"; SIZE=$2; shift 2 ;;
	-t) [[ $# -ge 2 ]] || die "-t needs seconds"; RUNTIME=$2; shift 2 ;;
	-n) [[ $# -ge 2 ]] || die "-n needs a number"; NFILES=$2; shift 2 ;;
	-r) [[ $# -ge 2 ]] || die "-r needs a number"; META_RUNS=$2; shift 2 ;;
	--keep) KEEP=1; shift ;;
	--meta-only) META_ONLY=1; shift ;;
	--pin) [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || die "--pin needs a CPU number"; PIN=$2; shift 2 ;;
	-h|--help) sed -n '2,/^# python3; fio/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (try --help)" ;;
	esac
done
[[ $RUNTIME =~ ^[1-9][0-9]*$ ]] || die "-t must be a positive integer"
[[ $NFILES =~ ^[1-9][0-9]*$ ]] || die "-n must be a positive integer"
[[ $META_RUNS =~ ^[1-9][0-9]*$ ]] || die "-r must be a positive integer"
[[ $(id -u) -eq 0 ]] || die "must run as root (loop devices, mounts, drop_caches)"
if ! command -v fio >/dev/null; then
	echo "io.sh: installing fio" >&2
	apt-get install -y fio >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y fio >/dev/null; }
fi
for c in fio mkfs.btrfs mkfs.ext4 losetup mount umount mountpoint fusermount3 python3 dd flock; do
	command -v "$c" >/dev/null || die "missing command: $c"
done

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
exec 9>"$BENCH_DIR/.lock"
flock -n 9 || die "another io.sh is using $BENCH_DIR"
LOGS=$BENCH_DIR/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"

SIZE_BYTES=$(python3 -c "
import sys; s = sys.argv[1].upper(); m = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
print(int(float(s[:-1]) * m[s[-1]]) if s[-1] in m else int(s))" "$SIZE")
IMG_BYTES=$(( SIZE_BYTES * 3 + (4 << 30) ))      # room for COW of random overwrites

# ---- the butter binary ----------------------------------------------------------
bench_butter bench/butter-nullfs
NULLFS=${NULLFS:-$(dirname "$(dirname "$BUTTER")")/bench/butter-nullfs}
[[ -x $NULLFS ]] || die "no nullfs binary at $NULLFS (set NULLFS=)"

# ---- targets: set up and tear down -----------------------------------------------
declare -A MNT LOOP
DAEMON_PID= NULL_PID=
TARGETS=(butter btrfs ext4 nullfs)

cleanup() {
	set +e
	for t in "${TARGETS[@]}"; do
		m=${MNT[$t]:-}
		[[ -n $m ]] && mountpoint -q "$m" &&
			{ if [[ $t == butter || $t == nullfs ]]; then fusermount3 -u "$m"; else umount "$m"; fi; }
		[[ -n ${LOOP[$t]:-} ]] && losetup -d "${LOOP[$t]}"
	done
	[[ -n $DAEMON_PID ]] && kill "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
	[[ -n $NULL_PID ]] && kill "$NULL_PID" 2>/dev/null && wait "$NULL_PID" 2>/dev/null
	if ((KEEP)); then echo "kept $BENCH_DIR"; else rm -rf "$BENCH_DIR"/*.img "$BENCH_DIR"/mnt-* "$BENCH_DIR"/dd.file; fi
}
trap cleanup EXIT

setup() {
	local t=$1 img=$BENCH_DIR/$1.img
	MNT[$t]=$BENCH_DIR/mnt-$t
	mkdir -p "${MNT[$t]}"
	rm -f "$img"
	truncate -s "$IMG_BYTES" "$img"
	case $t in
	butter)
		mkfs.btrfs -q -f "$img" >/dev/null
		pinned "$BUTTER" mount -f ${BUTTER_OPTS:+-o "$BUTTER_OPTS"} "$img" "${MNT[$t]}" >"$LOGS/daemon.log" 2>&1 &
		DAEMON_PID=$!
		for _ in $(seq 200); do mountpoint -q "${MNT[$t]}" && break; sleep 0.05; done
		mountpoint -q "${MNT[$t]}" || { cat "$LOGS/daemon.log" >&2; die "butter mount failed"; }
		;;
	btrfs)
		mkfs.btrfs -q -f "$img" >/dev/null
		LOOP[$t]=$(losetup -f --show "$img")
		mount -o noatime "${LOOP[$t]}" "${MNT[$t]}"
		;;
	ext4)
		mkfs.ext4 -q -F "$img" >/dev/null
		LOOP[$t]=$(losetup -f --show "$img")
		mount -o noatime "${LOOP[$t]}" "${MNT[$t]}"
		;;
	nullfs)
		rm -f "$img"
		# the request loop butter runs: spin=US from BUTTER_OPTS, else its default (50)
		spin=50
		[[ ,$BUTTER_OPTS, =~ ,spin=([0-9]+), ]] && spin=${BASH_REMATCH[1]}
		# and butter's choice of FUSE_HANDLE_KILLPRIV_V2
		nokill=()
		[[ ,$BUTTER_OPTS, == *,no_killpriv_v2,* ]] && nokill=(-K)
		if [[ ,$BUTTER_OPTS, == *,uring,* ]]; then
			pinned "$NULLFS" "${nokill[@]}" -u "${MNT[$t]}" >"$LOGS/nullfs.log" 2>&1 &
		elif ((spin)); then
			pinned "$NULLFS" "${nokill[@]}" -p "$spin" "${MNT[$t]}" >"$LOGS/nullfs.log" 2>&1 &
		else
			pinned "$NULLFS" "${nokill[@]}" "${MNT[$t]}" >"$LOGS/nullfs.log" 2>&1 &
		fi
		NULL_PID=$!
		for _ in $(seq 200); do mountpoint -q "${MNT[$t]}" && break; sleep 0.05; done
		mountpoint -q "${MNT[$t]}" || { cat "$LOGS/nullfs.log" >&2; die "nullfs mount failed"; }
		;;
	esac
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# pinned CMD...: CMD on CPU $PIN with --pin, else as it is
pinned() {
	if [[ -n $PIN ]]; then taskset -c "$PIN" "$@"; else "$@"; fi
}

# ---- measurements ----------------------------------------------------------------
declare -A RESULT    # RESULT[workload,target] = number

# fio JOB_NAME TARGET FIELD fio-args...: run fio, record read/write bw (MiB/s) or iops
run_fio() {
	local name=$1 t=$2 field=$3; shift 3
	local out=$LOGS/fio-$name-$t.json
	fio --output-format=json --output="$out" --name="$name" --filename="${MNT[$t]}/fio.data" \
		--ioengine=psync "$@" >/dev/null
	RESULT[$name,$t]=$(python3 - "$out" "$field" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
kind, what = sys.argv[2].split(".")
v = job[kind]["bw_bytes"] / 2**20 if what == "bw" else job[kind]["iops"]
print(f"{v:.1f}")
PY
)
}

# meta_round TARGET R: metadata run R on TARGET; the best of the runs counts (the
# highest rate, the shortest commit)
meta_round() {
	local t=$1 r=$2 k v
	meta_once "${MNT[$t]}/meta$r" "$LOGS/meta-$t.$r.txt"
	while read -r k v; do
		if [[ -z ${RESULT[$k,$t]:-} ]] || python3 -c "
import sys; k, v, old = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
sys.exit(0 if (v < old if k.endswith('-s') else v > old) else 1)" "$k" "$v" "${RESULT[$k,$t]}"; then
			RESULT[$k,$t]=$v
		fi
	done <"$LOGS/meta-$t.$r.txt"
}

# meta_once DIR LOG: one metadata run in the new directory DIR, results in LOG
meta_once() {
	pinned python3 - "$1" "$NFILES" >"$2" <<'PY'
import os, sys, time
root, n = sys.argv[1], int(sys.argv[2])
dirs, per = 100, max(1, int(sys.argv[2]) // 100)
os.makedirs(root)
for d in range(dirs):
    os.mkdir(f"{root}/d{d:03d}")
data = b"x" * 100
def phase(name, fn):
    t0 = time.perf_counter()
    for d in range(dirs):
        for i in range(per):
            fn(f"{root}/d{d:03d}", i)
    dt = time.perf_counter() - t0
    print(f"{name} {dirs * per / dt:.1f}")
def create(d, i):
    fd = os.open(f"{d}/f{i:06d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.close(fd)
phase("meta-create", create)
phase("meta-stat", lambda d, i: os.stat(f"{d}/f{i:06d}"))
phase("meta-rename", lambda d, i: os.rename(f"{d}/f{i:06d}", f"{d}/g{i:06d}"))
phase("meta-unlink", lambda d, i: os.unlink(f"{d}/g{i:06d}"))
t0 = time.perf_counter()
fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
os.fsync(fd)                      # butter: a commit
os.close(fd)
import ctypes
fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
ctypes.CDLL(None).syncfs(fd)      # the kernel's filesystems: a commit / journal flush
os.close(fd)
print(f"meta-commit-s {time.perf_counter() - t0:.3f}")
PY
}

bench_butter_line
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== size $SIZE, random runtime ${RUNTIME}s, metadata $(( NFILES / 100 * 100 )) files x $META_RUNS run(s), $BENCH_DIR on $(df --output=source "$BENCH_DIR" | tail -1)"
[[ -n $PIN ]] && echo "== FUSE daemons and metadata runs pinned to CPU $PIN"

for t in "${TARGETS[@]}"; do
	setup "$t"
done
for t in butter btrfs ext4; do
	((META_ONLY)) && break
	echo "-- $t"
	run_fio seq-write "$t" write.bw --rw=write --bs=1M --size="$SIZE" --end_fsync=1
	drop_caches
	run_fio seq-read "$t" read.bw --rw=read --bs=1M --size="$SIZE"
	drop_caches
	run_fio rand-read "$t" read.iops --rw=randread --bs=4k --size="$SIZE" --runtime="$RUNTIME" \
		--time_based --norandommap
	run_fio rand-write "$t" write.iops --rw=randwrite --bs=4k --size="$SIZE" --runtime="$RUNTIME" \
		--time_based --norandommap --end_fsync=1
	rm -f "${MNT[$t]}/fio.data"
done
# The metadata runs take turns across the targets, so that load from elsewhere
# falls on all of them alike.
echo "-- metadata: ${TARGETS[*]} in turn, $META_RUNS round(s)"
for ((r = 1; r <= META_RUNS; r++)); do
	for t in "${TARGETS[@]}"; do
		meta_round "$t" "$r"
	done
done
# Requests per operation, counted by the kernel (bench/fusereqs.py; fuse trace events, 6.14+)
REQS=
if [[ -d /sys/kernel/tracing/events/fuse ]]; then
	echo "-- FUSE requests per operation: butter, nullfs"
	REQS=$(python3 "$REPO/bench/fusereqs.py" -n 200 "butter=${MNT[butter]}" "nullfs=${MNT[nullfs]}" 2>&1) ||
		REQS="fusereqs.py failed: $REQS"
else
	REQS="(no fuse trace events in this kernel: requests per operation not counted)"
fi
for t in "${TARGETS[@]}"; do
	case $t in
	butter)
		RSS_KB=$(awk '/VmHWM/ {print $2}' "/proc/$DAEMON_PID/status")
		fusermount3 -u "${MNT[$t]}"
		wait "$DAEMON_PID" || die "the butter daemon exited with an error (log: $LOGS/daemon.log)"
		DAEMON_PID=
		grep -q "aborted" "$LOGS/daemon.log" && die "the daemon aborted a transaction: $LOGS/daemon.log"
		;;
	nullfs)
		fusermount3 -u "${MNT[$t]}"
		wait "$NULL_PID" || die "nullfs exited with an error (log: $LOGS/nullfs.log)"
		NULL_PID=
		;;
	*)
		umount "${MNT[$t]}"
		losetup -d "${LOOP[$t]}"
		LOOP[$t]=
		;;
	esac
	rm -f "$BENCH_DIR/$t.img"
done

if ((!META_ONLY)); then
	echo "-- dd"
	DDF=$BENCH_DIR/dd.file
	DD_COUNT=$(( SIZE_BYTES >> 20 ))
	dd_rate() { python3 -c "import sys; print(f'{$DD_COUNT * 1e9 / int(sys.argv[1]):.1f}')" "$1"; }
	t0=$(date +%s%N)
	dd if=/dev/zero of="$DDF" bs=1M count="$DD_COUNT" conv=fdatasync status=none
	RESULT[seq-write,dd]=$(dd_rate $(( $(date +%s%N) - t0 )))
	drop_caches
	t0=$(date +%s%N)
	dd if="$DDF" of=/dev/null bs=1M status=none
	RESULT[seq-read,dd]=$(dd_rate $(( $(date +%s%N) - t0 )))
	rm -f "$DDF"
fi

# ---- the table ------------------------------------------------------------------------
WORKLOADS=(seq-write seq-read rand-read rand-write meta-create meta-stat meta-rename meta-unlink meta-commit-s)
declare -A UNIT=([seq-write]="MiB/s" [seq-read]="MiB/s" [rand-read]="IOPS" [rand-write]="IOPS"
	[meta-create]="files/s" [meta-stat]="files/s" [meta-rename]="files/s" [meta-unlink]="files/s"
	[meta-commit-s]="s (lower is better)")
declare -A TARGET=([seq-write]=0.8 [seq-read]=0.8 [rand-read]=0.5 [rand-write]=0.5
	[meta-create]=0.5 [meta-stat]=0.5 [meta-rename]=0.5 [meta-unlink]=0.5)
echo
printf "%-14s %10s %10s %10s %10s %10s  %-9s %9s %9s %9s %9s  %s\n" workload butter btrfs ext4 dd \
	nullfs unit "b/btrfs" "b/ext4" "b/null" "null/btrfs" "target (vs btrfs)"
for w in "${WORKLOADS[@]}"; do
	b=${RESULT[$w,butter]:--} k=${RESULT[$w,btrfs]:--} e=${RESULT[$w,ext4]:--} d=${RESULT[$w,dd]:--}
	n=${RESULT[$w,nullfs]:--}
	read -r rk re rn nk verdict < <(python3 - "$w" "$b" "$k" "$e" "$n" "${TARGET[$w]:-}" <<'PY'
import sys
w, b, k, e, n, target = sys.argv[1:7]
def ratio(x, y):
    try:
        x, y = float(x), float(y)
    except ValueError:
        return None
    if w.endswith("-s"):            # a time: lower is better, so the ratio is y/x
        x, y = y, x
    return x / y if y else None
rk, re, rn, nk = ratio(b, k), ratio(b, e), ratio(b, n), ratio(n, k)
fmt = lambda r: "-" if r is None else f"{r:.2f}x"
verdict = "-" if not target or rk is None else \
    (f">= {target}x: met" if rk >= float(target) else f">= {target}x: NOT met")
if verdict.endswith("NOT met") and nk is not None and nk < float(target):
    verdict += " (a do-nothing daemon, same loop: %.2fx)" % nk
print(fmt(rk), fmt(re), fmt(rn), fmt(nk), verdict)
PY
)
	printf "%-14s %10s %10s %10s %10s %10s  %-9s %9s %9s %9s %9s  %s\n" "$w" "$b" "$k" "$e" "$d" \
		"$n" "${UNIT[$w]%% *}" "$rk" "$re" "$rn" "$nk" "$verdict"
done
echo
echo "butter daemon peak RSS (VmHWM): $(( RSS_KB / 1024 )) MiB"
echo
echo "$REQS"
