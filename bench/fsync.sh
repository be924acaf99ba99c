#!/usr/bin/env bash
# bench/fsync.sh — small files written and made durable one by one, through `butter mount`
# (tree log), side by side with the kernel's btrfs and ext4 on loop devices over image files
# in the same directory (one disk). Workloads, each in a fresh directory on every target:
#
#   fsync    N files: create, write 4 KiB, fsync(2), close (what a mail spool or a
#            package manager does); butter logs each file (lib/treelog/writer.c)
#   commit   the same, but butter commits instead of fsync (BUTTER_IOC_SYNC on the file:
#            what butter's fsync did before the tree log); the kernel targets fsync
#   many     N files written and closed, then `butter fsync FILE...` (one tree log sync
#            per 128 files on butter; fsync(2) file by file on the kernel targets)
#   overwrite  a 64 MiB file (written and committed first, not timed), then N random
#            4 KiB overwrites, each followed by fdatasync(2) (a database's pattern)
#   after    512 MiB written to an unrelated file and left unsynced, then a 100-byte file
#            created, written and fsync'ed: only the fsync is timed (ext3 flushed everything
#            there; btrfs forces out only that file). 3 rounds; fsyncs/s
#
# Prints files/s per target and the ratios butter/btrfs and butter/ext4, and the bytes the
# butter daemon wrote per file (wchar of /proc/PID/io: data, tree blocks, superblocks).
#
# Usage: sudo bench/fsync.sh [-n FILES] [--keep]
#   -n FILES    files per workload (default 1000)
#   --keep      keep $BENCH_DIR's images and logs afterwards
# Environment: BENCH_DIR (default /tmp/butter-fsync-bench), BUTTER (a butter binary instead
#   of building $REPO/build-bench, release, no sanitizers).
# Needs root (loop devices, mounts), mkfs.btrfs, mkfs.ext4, fusermount3, python3.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/butter-fsync-bench}
BUTTER=${BUTTER:-}
NFILES=1000 KEEP=0
IMG_BYTES=$((2 << 30))

die() { echo "fsync.sh: $*" >&2; exit 2; }

while (($#)); do
	case $1 in
	-n) [[ $# -ge 2 ]] || die "-n needs a number"; NFILES=$2; shift 2 ;;
	--keep) KEEP=1; shift ;;
	-h|--help) sed -n '2,/^# Needs root/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (try --help)" ;;
	esac
done
[[ $NFILES =~ ^[1-9][0-9]*$ ]] || die "-n must be a positive integer"
[[ $(id -u) -eq 0 ]] || die "must run as root (loop devices, mounts)"
for c in mkfs.btrfs mkfs.ext4 losetup mount umount mountpoint fusermount3 python3; do
	command -v "$c" >/dev/null || die "missing command: $c"
done
mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
LOGS=$BENCH_DIR/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"

if [[ -z $BUTTER ]]; then
	BUILD=$REPO/build-bench
	if [[ ! -f $BUILD/build.ninja ]]; then
		meson setup "$BUILD" "$REPO" --buildtype=release -Db_sanitize=none -Dwerror=false >/dev/null
	fi
	ninja -C "$BUILD" cli/butter >"$LOGS/build.log" 2>&1 || { cat "$LOGS/build.log" >&2; die "build failed"; }
	BUTTER=$BUILD/cli/butter
fi
[[ -x $BUTTER ]] || die "no butter binary at $BUTTER"

declare -A MNT LOOP RES
DAEMON_PID=
TARGETS=(butter btrfs ext4)
WORKLOADS=(fsync commit many overwrite after)

cleanup() {
	set +e
	for t in "${TARGETS[@]}"; do
		m=${MNT[$t]:-}
		[[ -n $m ]] && mountpoint -q "$m" && { if [[ $t == butter ]]; then fusermount3 -u "$m"; else umount "$m"; fi; }
		[[ -n ${LOOP[$t]:-} ]] && losetup -d "${LOOP[$t]}"
	done
	[[ -n $DAEMON_PID ]] && wait "$DAEMON_PID" 2>/dev/null
	if ((KEEP)); then echo "kept $BENCH_DIR"; else rm -rf "$BENCH_DIR"/*.img "$BENCH_DIR"/mnt-*; fi
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
		"$BUTTER" mount -f "$img" "${MNT[$t]}" >"$LOGS/daemon.log" 2>&1 &
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
	esac
}

teardown() {
	local t=$1
	if [[ $t == butter ]]; then
		fusermount3 -u "${MNT[$t]}"
		wait "$DAEMON_PID"
		DAEMON_PID=
	else
		umount "${MNT[$t]}"
		losetup -d "${LOOP[$t]}"
		LOOP[$t]=
	fi
}

# files/s of workload $2 in directory $1 (target $3)
run_workload() {
	python3 - "$1" "$NFILES" "$2" "$3" "$BUTTER" "${DAEMON_PID:-0}" <<'EOF'
import ctypes, fcntl, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
d, n, mode, target, butter = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
pid = int(sys.argv[6])

def wchar():
    if target != "butter":
        return 0
    with open(f"/proc/{pid}/io") as f:
        return int(next(l for l in f if l.startswith("wchar")).split()[1])
BUTTER_IOC_SYNC = 0xB706  # _IO(0xB7, 6), include/butter/control.h
os.makedirs(d)
buf = os.urandom(4096)
names = [os.path.join(d, f"f{i:06d}") for i in range(n)]
if mode == "after":
    rounds, spent = 3, 0.0
    chunk = os.urandom(1 << 20)
    w0 = wchar()
    for r in range(rounds):
        big = os.path.join(d, f"unrelated{r}")
        fd = os.open(big, os.O_CREAT | os.O_WRONLY, 0o644)
        for i in range(512):
            os.write(fd, chunk)
        os.close(fd)
        t0 = time.monotonic()
        fd = os.open(os.path.join(d, f"small{r}"), os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"x" * 100)
        os.fsync(fd)
        os.close(fd)
        spent += time.monotonic() - t0
        os.unlink(big)
        os.sync()
    print(f"{rounds / spent:.1f}:{(wchar() - w0) / rounds:.0f}")
    sys.exit(0)
if mode == "overwrite":
    import random
    big = os.path.join(d, "big")
    fd = os.open(big, os.O_CREAT | os.O_WRONLY, 0o644)
    for i in range(64 * 256):
        os.write(fd, buf)
    os.fsync(fd)
    if target == "butter":
        fcntl.ioctl(fd, BUTTER_IOC_SYNC)
    rng = random.Random(1)
    w0 = wchar()
    t0 = time.monotonic()
    for i in range(n):
        os.pwrite(fd, buf, rng.randrange(64 * 256) * 4096)
        os.fdatasync(fd)
    os.close(fd)
    print(f"{n / (time.monotonic() - t0):.1f}:{(wchar() - w0) / n:.0f}")
    sys.exit(0)
w0 = wchar()
t0 = time.monotonic()
for name in names:
    fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, buf)
    if mode == "fsync" or (mode == "commit" and target != "butter"):
        os.fsync(fd)
    elif mode == "commit":
        # the kernel's dirty pages (writeback cache) reach the daemon first, as fsync sends them
        libc.sync_file_range(fd, ctypes.c_longlong(0), ctypes.c_longlong(0), 7)  # wait, write, wait
        fcntl.ioctl(fd, BUTTER_IOC_SYNC)
    os.close(fd)
if mode == "many":
    subprocess.run([butter, "fsync"] + names, check=True)
print(f"{n / (time.monotonic() - t0):.1f}:{(wchar() - w0) / n:.0f}")
EOF
}

for t in "${TARGETS[@]}"; do
	setup "$t"
	sync
	for w in "${WORKLOADS[@]}"; do
		r=$(run_workload "${MNT[$t]}/$w" "$w" "$t")
		RES[$t.$w]=${r%%:*}
		[[ $t == butter ]] && RES[wchar.$w]=${r##*:}
		sync
	done
	teardown "$t"
done

echo "fsync.sh: $NFILES files of 4 KiB (overwrite: $NFILES writes) per workload, per second (higher is better)"
printf "%-8s %10s %10s %10s %14s %14s %18s\n" workload butter btrfs ext4 butter/btrfs butter/ext4 \
	"butter bytes/file"
for w in "${WORKLOADS[@]}"; do
	python3 - "$w" "${RES[butter.$w]}" "${RES[btrfs.$w]}" "${RES[ext4.$w]}" "${RES[wchar.$w]}" <<'EOF'
import sys
w, b, k, e, wc = sys.argv[1], *map(float, sys.argv[2:])
print(f"{w:<8} {b:10.1f} {k:10.1f} {e:10.1f} {b / k:13.2f}x {b / e:13.2f}x {wc:18.0f}")
EOF
done
