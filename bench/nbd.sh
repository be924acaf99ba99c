#!/usr/bin/env bash
# bench/nbd.sh — sequential and random I/O through `butter mount` when the filesystem's
# bytes are behind an NBD server (lib/device/nbd.c, libnbd), beside the same image as a
# local file. Targets, each a fresh copy of one mkfs.btrfs image, all in $BENCH_DIR (one disk):
#
#   local       butter mount IMG                       (the daemon preads/pwrites the file)
#   nbd-unix    butter mount 'nbd+unix:///?socket=SOCK' over `nbdkit -U SOCK file IMG`
#   nbd-tcp     butter mount nbd://127.0.0.1:PORT over `nbdkit -i 127.0.0.1 -p PORT file IMG`
#   kernel-nbd  the kernel's btrfs on /dev/nbdN, the kernel's nbd client (`nbd-client -unix
#               SOCK`, 4 connections as butter opens to a multi-conn server) over the same
#               nbdkit; only where the nbd module exists and nbd-client is installed,
#               else skipped with the reason
#
# The same file on the same disk under both, so nbd-unix/local is the cost of the NBD hop:
# libnbd in butter's daemon, the socket, nbdkit, one more copy of each byte. (One difference
# in the path stays: on a local file butter writes large writebacks past the host's page
# cache, O_DIRECT (lib/device/file.c); nbdkit's file plugin writes through it and syncs at
# NBD_CMD_FLUSH. Reads go through the host's page cache in both.) Workloads, on every target,
# as bench/io.sh runs them (fio, psync), page caches dropped (`echo 3 > drop_caches`: the
# mount's, and the image file's under the daemon or nbdkit) before each read:
#
#   seq-write   fio: write a SIZE file (default 256M) in 1 MiB blocks, fsync at the end
#   seq-read    fio: read it back in 1 MiB blocks
#   rand-read   fio: 4 KiB random reads of that file for RUNTIME seconds (default 10)
#   rand-write  fio: 4 KiB random overwrites of that file for RUNTIME seconds, fsync at the end
#   rand-read-direct, rand-write-direct
#               the same two with O_DIRECT (fio --direct=1), caches dropped before each:
#               the buffered pair soon reads the mount's page cache (a 4 KiB miss that
#               finds the page once leaves it cached), so on nbd it says little about the
#               device; with O_DIRECT every read is a round trip to the daemon, and from
#               there to the image file or the NBD server: the hop's latency shows.
#               Writes still end in the daemon's write buffer; the closing fsync sends
#               them to the device. --no-direct leaves them out
#
# There are ROUNDS rounds (default 2); the targets take turns in each, in the opposite order
# in every other round (local, nbd-unix, nbd-tcp, kernel-nbd; then backwards), so load from
# elsewhere falls on all alike. Each round's figures are printed as it ends; the table has
# the best (highest) of the rounds for each target: MiB/s for bandwidth, IOPS for random
# I/O; then the ratios nbd-unix/local, nbd-tcp/local and nbd-unix/kernel-nbd, and the goal
# of the issue: sequential over a Unix socket >= 0.8x the local file ("met" or "NOT met";
# random I/O has no goal). A ratio near 1 says the NBD hop costs little; the kernel-nbd
# column (when present) says what the kernel's own stack does over the same server.
# After each butter target, `btrfs check --readonly` judges the image it left.
#
# Usage: sudo bench/nbd.sh [-s SIZE] [-t RUNTIME] [-r ROUNDS] [--no-tcp] [--no-kernel]
#                          [--no-direct] [--keep]
#   -s SIZE     sequential file size for fio (default 256M; fio syntax: 256M, 1G)
#   -t SECONDS  random I/O runtime per target and round (default 10)
#   -r ROUNDS   rounds, the best of each workload counts (default 2)
#   --no-tcp    leave out nbd-tcp
#   --no-kernel leave out kernel-nbd
#   --no-direct leave out the O_DIRECT random workloads
#   --keep      keep $BENCH_DIR's images and logs afterwards
# Environment: BENCH_DIR (default /tmp/butter-nbd-bench), BUTTER (a butter binary built
#   with libnbd, instead of building $REPO/build-bench, release, no sanitizers),
#   BUTTER_OPTS (-o options for every butter mount), NBDKIT_FILE_OPTS (parameters for
#   nbdkit's file plugin, e.g. "cache=none": the server then writes past its page cache,
#   as butter does on a local image file, instead of syncing everything at the flush).
# Needs root (mounts, drop_caches), nbdkit (file plugin), mkfs.btrfs, btrfs, fusermount3,
# python3; fio is installed with apt-get if missing; kernel-nbd also needs nbd-client.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/butter-nbd-bench}
BUTTER=${BUTTER:-}
BUTTER_OPTS=${BUTTER_OPTS:-}
NBDKIT_FILE_OPTS=${NBDKIT_FILE_OPTS:-}
SIZE=256M RUNTIME=10 ROUNDS=2 TCP=1 KERNEL=1 DIRECT=1 KEEP=0
GOAL=0.8

die() { echo "nbd.sh: $*" >&2; exit 2; }
# shellcheck source=bench/lib.sh
source "$REPO/bench/lib.sh"

while (($#)); do
	case $1 in
	-s) [[ $# -ge 2 ]] || die "-s needs a size"; SIZE=$2; shift 2 ;;
	-t) [[ $# -ge 2 ]] || die "-t needs seconds"; RUNTIME=$2; shift 2 ;;
	-r) [[ $# -ge 2 ]] || die "-r needs a number"; ROUNDS=$2; shift 2 ;;
	--no-tcp) TCP=0; shift ;;
	--no-kernel) KERNEL=0; shift ;;
	--no-direct) DIRECT=0; shift ;;
	--keep) KEEP=1; shift ;;
	-h|--help) sed -n '2,/^# python3; fio/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (try --help)" ;;
	esac
done
[[ $SIZE =~ ^[0-9]+(\.[0-9]+)?[KMGkmg]?$ ]] || die "-s must be a size (256M, 1G)"
[[ $RUNTIME =~ ^[1-9][0-9]*$ ]] || die "-t must be a positive integer"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "-r must be a positive integer"
[[ $(id -u) -eq 0 ]] || die "must run as root (mounts, drop_caches)"
if ! command -v fio >/dev/null; then
	echo "nbd.sh: installing fio" >&2
	apt-get install -y fio >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y fio >/dev/null; }
fi
for c in fio nbdkit mkfs.btrfs btrfs mountpoint fusermount3 python3 flock bc; do
	command -v "$c" >/dev/null || die "missing command: $c"
done

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
SOCK=$BENCH_DIR/nbd.sock
((${#SOCK} < 100)) || die "BENCH_DIR is too long for a Unix socket path: $SOCK"
exec 9>"$BENCH_DIR/.lock"
flock -n 9 || die "another nbd.sh is using $BENCH_DIR"
LOGS=$BENCH_DIR/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"

SIZE_BYTES=$(python3 -c "
import sys; s = sys.argv[1].upper(); m = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
print(int(float(s[:-1]) * m[s[-1]]) if s[-1] in m else int(s))" "$SIZE")
IMG_BYTES=$(( SIZE_BYTES * 3 + (4 << 30) ))      # room for COW of random overwrites (sparse)

# ---- the butter binary -------------------------------------------------------------
# shellcheck disable=SC2119  # no further ninja targets
bench_butter

# ---- which targets -------------------------------------------------------------------
TARGETS=(local nbd-unix)
((TCP)) && TARGETS+=(nbd-tcp)
KERNEL_SKIP=
if ((!KERNEL)); then
	KERNEL_SKIP="left out (--no-kernel)"
elif ! command -v nbd-client >/dev/null; then
	KERNEL_SKIP="nbd-client is not installed"
else
	if [[ ! -e /dev/nbd0 ]] && command -v modprobe >/dev/null; then
		modprobe nbd >/dev/null 2>&1 &&
			for _ in $(seq 50); do [[ -e /dev/nbd0 ]] && break; sleep 0.1; done
	fi
	[[ -e /dev/nbd0 && -d /sys/block/nbd0 ]] || KERNEL_SKIP="no nbd module in this kernel"
fi
[[ -z $KERNEL_SKIP ]] && TARGETS+=(kernel-nbd)

# ---- targets: set up and tear down -------------------------------------------------
MNT=$BENCH_DIR/mnt
DAEMON_PID='' NBDKIT_PID='' NBDDEV='' KMOUNTED=0 CUR_LOG=''

# stop PID (a child of ours): TERM, up to 30 s to go, then KILL
stop_pid() {
	local pid=$1
	kill "$pid" 2>/dev/null || return 0
	for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

cleanup() {
	set +e
	if [[ -n $DAEMON_PID ]]; then
		mountpoint -q "$MNT" && { fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -uz "$MNT"; }
		# the daemon writes what it holds and exits once unmounted; the server must outlive it
		for _ in $(seq 300); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
		stop_pid "$DAEMON_PID"
	fi
	((KMOUNTED)) && { umount "$MNT" 2>/dev/null || umount -l "$MNT"; }
	[[ -n $NBDDEV ]] && nbd-client -d "$NBDDEV" >/dev/null 2>&1
	[[ -n $NBDKIT_PID ]] && stop_pid "$NBDKIT_PID"
	rm -f "$SOCK"
	if ((KEEP)); then
		echo "kept $BENCH_DIR"
	else
		rm -rf "$BENCH_DIR"/*.img "$MNT" "$BENCH_DIR"/nbdkit.pid
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
set -E
trap 'printf "\nnbd.sh: line %s failed: %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_nbdkit IMG unix|tcp LOG: nbdkit's file plugin serving IMG; sets NBDKIT_PID and URI
start_nbdkit() {
	local img=$1 how=$2 log=$3 port
	rm -f "$SOCK" "$BENCH_DIR/nbdkit.pid"
	if [[ $how == unix ]]; then
		# shellcheck disable=SC2086 # NBDKIT_FILE_OPTS: several key=value words
		nbdkit -f --exit-with-parent -P "$BENCH_DIR/nbdkit.pid" -U "$SOCK" file "$img" \
			$NBDKIT_FILE_OPTS >"$log" 2>&1 &
		URI="nbd+unix:///?socket=$SOCK"
	else
		port=$(free_port)
		# shellcheck disable=SC2086
		nbdkit -f --exit-with-parent -P "$BENCH_DIR/nbdkit.pid" -i 127.0.0.1 -p "$port" \
			file "$img" $NBDKIT_FILE_OPTS >"$log" 2>&1 &
		URI="nbd://127.0.0.1:$port"
	fi
	NBDKIT_PID=$!
	# nbdkit writes the pid file once it listens
	for _ in $(seq 200); do [[ -s $BENCH_DIR/nbdkit.pid ]] && break; sleep 0.05; done
	[[ -s $BENCH_DIR/nbdkit.pid ]] || { cat "$log" >&2; die "nbdkit did not start ($how)"; }
}

# butter_mount DEV LOG
butter_mount() {
	"$BUTTER" mount -f ${BUTTER_OPTS:+-o "$BUTTER_OPTS"} "$1" "$MNT" >"$2" 2>&1 &
	DAEMON_PID=$!
	for _ in $(seq 400); do mountpoint -q "$MNT" && break; sleep 0.05; done
	mountpoint -q "$MNT" || { cat "$2" >&2; die "butter mount $1 failed"; }
}

# setup TARGET ROUND: a fresh copy of the template image, served and mounted at $MNT
setup() {
	local t=$1 r=$2 img=$BENCH_DIR/$1.img d
	mkdir -p "$MNT"
	rm -f "$img"
	cp --sparse=always "$BENCH_DIR/template.img" "$img"
	sync
	CUR_LOG=$LOGS/daemon-$t.$r.log
	case $t in
	local)
		butter_mount "$img" "$CUR_LOG"
		;;
	nbd-unix|nbd-tcp)
		start_nbdkit "$img" "${t#nbd-}" "$LOGS/nbdkit-$t.$r.log"
		butter_mount "$URI" "$CUR_LOG"
		;;
	kernel-nbd)
		start_nbdkit "$img" unix "$LOGS/nbdkit-$t.$r.log"
		NBDDEV=
		for d in /sys/block/nbd*; do
			[[ -e $d/pid ]] || { NBDDEV=/dev/${d##*/}; break; }
		done
		[[ -n $NBDDEV ]] || die "every /dev/nbd* is in use"
		nbd-client -unix "$SOCK" "$NBDDEV" -block-size 4096 -connections 4 >"$CUR_LOG" 2>&1 ||
			{ cat "$CUR_LOG" >&2; NBDDEV=; die "nbd-client could not connect"; }
		for _ in $(seq 100); do
			[[ $(blockdev --getsize64 "$NBDDEV" 2>/dev/null || echo 0) -gt 0 ]] && break
			sleep 0.05
		done
		mount -o noatime "$NBDDEV" "$MNT"
		KMOUNTED=1
		;;
	esac
}

# teardown TARGET: unmount, the daemon gone, the server gone; the image judged and removed
teardown() {
	local t=$1 img=$BENCH_DIR/$1.img
	if [[ $t == kernel-nbd ]]; then
		umount "$MNT"
		KMOUNTED=0
		# the next round's copy has the same fsid on another /dev/nbdN
		btrfs device scan --forget "$NBDDEV" >/dev/null 2>&1 || true
		nbd-client -d "$NBDDEV" >>"$CUR_LOG" 2>&1
		NBDDEV=''
	else
		"$BUTTER" umount "$MNT" >>"$LOGS/umount.log" 2>&1 ||
			{ cat "$LOGS/umount.log" >&2; die "butter umount failed ($t)"; }
		wait "$DAEMON_PID" || die "the butter daemon exited with an error (log: $CUR_LOG)"
		DAEMON_PID=
		! grep -q "aborted" "$CUR_LOG" || die "the daemon aborted a transaction: $CUR_LOG"
	fi
	if [[ -n $NBDKIT_PID ]]; then
		stop_pid "$NBDKIT_PID"
		NBDKIT_PID=
	fi
	if [[ $t != kernel-nbd ]]; then
		btrfs check --readonly "$img" >"$LOGS/check-$t.log" 2>&1 ||
			{ tail -20 "$LOGS/check-$t.log" >&2; die "btrfs check finds errors in the image $t left"; }
	fi
	rm -f "$img"
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# ---- measurements --------------------------------------------------------------------
declare -A RESULT    # RESULT[workload,target] = the best of the rounds
WORKLOADS=(seq-write seq-read rand-read rand-write)
((DIRECT)) && WORKLOADS+=(rand-read-direct rand-write-direct)
declare -A UNIT=([seq-write]="MiB/s" [seq-read]="MiB/s" [rand-read]="IOPS" [rand-write]="IOPS"
	[rand-read-direct]="IOPS" [rand-write-direct]="IOPS")

# run_fio JOB_NAME TARGET ROUND FIELD fio-args...: run fio, print read/write bw (MiB/s) or
# iops, and keep the best of the rounds in RESULT
run_fio() {
	local name=$1 t=$2 r=$3 field=$4 v; shift 4
	local out=$LOGS/fio-$name-$t.$r.json
	fio --output-format=json --output="$out" --name="$name" --filename="$MNT/fio.data" \
		--ioengine=psync "$@" >/dev/null
	v=$(python3 - "$out" "$field" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
kind, what = sys.argv[2].split(".")
v = job[kind]["bw_bytes"] / 2**20 if what == "bw" else job[kind]["iops"]
print(f"{v:.1f}")
PY
)
	if [[ -z ${RESULT[$name,$t]:-} ]] || (($(echo "$v > ${RESULT[$name,$t]}" | bc))); then
		RESULT[$name,$t]=$v
	fi
	printf " %s %s %s" "$name" "$v" "${UNIT[$name]}"
}

bench_butter_line
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $(nbdkit --version) file ${NBDKIT_FILE_OPTS:-(defaults)}, fio $(fio --version | sed 's/^fio-//'), size $SIZE, random runtime ${RUNTIME}s, $ROUNDS round(s), $BENCH_DIR on $(df --output=source "$BENCH_DIR" | tail -1)"
[[ -n $KERNEL_SKIP ]] && echo "kernel nbd: skipped ($KERNEL_SKIP)"

rm -f "$BENCH_DIR/template.img"
truncate -s "$IMG_BYTES" "$BENCH_DIR/template.img"
mkfs.btrfs -q -f "$BENCH_DIR/template.img" >/dev/null

for ((r = 1; r <= ROUNDS; r++)); do
	order=("${TARGETS[@]}")
	if ((r % 2 == 0)); then
		order=()
		for ((i = ${#TARGETS[@]} - 1; i >= 0; i--)); do order+=("${TARGETS[i]}"); done
	fi
	for t in "${order[@]}"; do
		setup "$t" "$r"
		printf -- "-- round %d %-10s" "$r" "$t"
		run_fio seq-write "$t" "$r" write.bw --rw=write --bs=1M --size="$SIZE" --end_fsync=1
		drop_caches
		run_fio seq-read "$t" "$r" read.bw --rw=read --bs=1M --size="$SIZE"
		drop_caches
		run_fio rand-read "$t" "$r" read.iops --rw=randread --bs=4k --size="$SIZE" \
			--runtime="$RUNTIME" --time_based --norandommap
		run_fio rand-write "$t" "$r" write.iops --rw=randwrite --bs=4k --size="$SIZE" \
			--runtime="$RUNTIME" --time_based --norandommap --end_fsync=1
		if ((DIRECT)); then
			drop_caches
			run_fio rand-read-direct "$t" "$r" read.iops --rw=randread --bs=4k --size="$SIZE" \
				--runtime="$RUNTIME" --time_based --norandommap --direct=1
			drop_caches
			run_fio rand-write-direct "$t" "$r" write.iops --rw=randwrite --bs=4k --size="$SIZE" \
				--runtime="$RUNTIME" --time_based --norandommap --direct=1 --end_fsync=1
		fi
		echo
		rm -f "$MNT/fio.data"
		teardown "$t"
	done
done
rm -f "$BENCH_DIR/template.img"

# ---- the table -----------------------------------------------------------------------
echo
printf "%-17s %10s %10s %10s %10s  %-6s %10s %10s %12s  %s\n" workload local nbd-unix nbd-tcp \
	kernel-nbd unit unix/local tcp/local unix/kernel "goal (nbd-unix vs local)"
for w in "${WORKLOADS[@]}"; do
	l=${RESULT[$w,local]:--} u=${RESULT[$w,nbd-unix]:--} c=${RESULT[$w,nbd-tcp]:--}
	k=${RESULT[$w,kernel-nbd]:--}
	goal=
	[[ $w == seq-* ]] && goal=$GOAL
	read -r ru rc rk verdict < <(python3 - "$l" "$u" "$c" "$k" "$goal" <<'PY'
import sys
l, u, c, k, goal = sys.argv[1:6]
def ratio(x, y):
    try:
        x, y = float(x), float(y)
    except ValueError:
        return None
    return x / y if y else None
ru, rc, rk = ratio(u, l), ratio(c, l), ratio(u, k)
fmt = lambda r: "-" if r is None else f"{r:.2f}x"
verdict = "-" if not goal or ru is None else \
    (f">= {goal}x: met" if ru >= float(goal) else f">= {goal}x: NOT met")
print(fmt(ru), fmt(rc), fmt(rk), verdict)
PY
)
	printf "%-17s %10s %10s %10s %10s  %-6s %10s %10s %12s  %s\n" "$w" "$l" "$u" "$c" "$k" \
		"${UNIT[$w]}" "$ru" "$rc" "$rk" "$verdict"
done
