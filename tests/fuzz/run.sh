#!/bin/sh
# run.sh [SECONDS] — build the fuzz harnesses (clang, ASan + UBSan) and run
# them for a bounded time: SECONDS in all (default 60): 45% to fuzz_open_walk
# (open + full walk of mutated images), 25% to fuzz_write (open + a fixed
# sequence of writes and commits on mutated images, copy-on-write in memory),
# 15% to fuzz_receive (mutated send streams received into a seed image), the
# rest to fuzz_decompress (the zlib/lzo/zstd extent decoders). Before
# fuzzing, every saved finding (tests/images/*/fuzz-input) is replayed.
#
# Exits non-zero on any crash, sanitizer report, leak, timeout (-timeout=10 s
# per input) or memory blow-up (-rss_limit_mb=2048); the input that did it is
# saved in tests/fuzz/crashes/ (gitignored). Inputs that found new coverage
# accumulate in tests/fuzz/work/ (gitignored), which starts from the committed
# corpus: corpus.tar.gz (a merged corpus from earlier runs, unpacked here) plus
# the hand-written inputs in corpus-images/ (for both image harnesses),
# corpus-receive/ and corpus-decompress/. To
# refresh the archive after a long run: fuzz_open_walk -merge=1 NEW corpus
# work/open_walk (likewise write and decompress), then tar NEW dirs as
# open_walk/, write/ and decompress/.
# Environment: BUTTER_FUZZ_BUILD (build directory, default <repo>/build-fuzz),
# BUTTER_FUZZ_JOBS (parallel fuzzing processes, default 1).
set -eu

secs=${1:-60}
case "$secs" in
''|*[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${BUTTER_FUZZ_BUILD:-$repo/build-fuzz}
jobs=${BUTTER_FUZZ_JOBS:-1}

if [ ! -f "$build/build.ninja" ]; then
	CC=clang meson setup "$build" "$repo" -Dfuzz=true -Db_sanitize=address,undefined \
		-Db_lundef=false
fi
ninja -C "$build" tests/fuzz/fuzz_open_walk tests/fuzz/fuzz_write tests/fuzz/fuzz_decompress \
	tests/fuzz/fuzz_receive tests/fuzz/fuzz_replay

mkdir -p "$here/crashes" "$here/work/open_walk" "$here/work/write" "$here/work/decompress" \
	"$here/work/receive"
tar -xzf "$here/corpus.tar.gz" -C "$here/work"
status=0

# 1. Every finding so far must stay fixed.
echo "run.sh: replaying saved findings (tests/images/*/fuzz-input)"
if ! "$build/tests/fuzz/fuzz_replay" "$repo/tests/images" > "$here/work/replay.log" 2>&1; then
	tail -n 40 "$here/work/replay.log" >&2
	echo "run.sh: FAIL: a saved finding crashes again (log: tests/fuzz/work/replay.log)" >&2
	status=1
fi
tail -n 1 "$here/work/replay.log"

# 2. Fuzz. $1 harness, $2 seconds, $3 work corpus, $4 committed corpus.
fuzz() {
	name=$1
	t=$2
	log="$here/work/$name.log"
	[ "$t" -gt 0 ] || return 0
	echo "run.sh: fuzzing $name for $t s"
	set +e
	if [ "$jobs" -gt 1 ]; then
		"$build/tests/fuzz/$name" -max_total_time="$t" -timeout=10 -rss_limit_mb=2048 \
			-max_len=4096 -print_final_stats=1 -artifact_prefix="$here/crashes/" \
			-jobs="$jobs" -workers="$jobs" "$3" "$4" > "$log" 2>&1
	else
		"$build/tests/fuzz/$name" -max_total_time="$t" -timeout=10 -rss_limit_mb=2048 \
			-max_len=4096 -print_final_stats=1 -artifact_prefix="$here/crashes/" \
			"$3" "$4" > "$log" 2>&1
	fi
	rc=$?
	set -e
	execs=$(grep -h 'stat::number_of_executed_units' "$log" "$here"/work/fuzz-*.log 2>/dev/null |
		awk '{ n += $2 } END { print n + 0 }')
	if [ "$rc" -ne 0 ]; then
		grep -E 'ERROR|SUMMARY|runtime error|Test unit written|contract' "$log" | head -n 20 >&2
		echo "run.sh: FAIL: $name exited $rc after $execs executions (log: tests/fuzz/work/$name.log)" >&2
		status=1
	else
		echo "run.sh: $name: $execs executions in $t s, no findings"
	fi
}

cd "$here/work"
walk_t=$((secs * 45 / 100))
write_t=$((secs * 25 / 100))
recv_t=$((secs * 15 / 100))
fuzz fuzz_open_walk "$walk_t" "$here/work/open_walk" "$here/corpus-images"
fuzz fuzz_write "$write_t" "$here/work/write" "$here/corpus-images"
fuzz fuzz_receive "$recv_t" "$here/work/receive" "$here/corpus-receive"
fuzz fuzz_decompress "$((secs - walk_t - write_t - recv_t))" "$here/work/decompress" \
	"$here/corpus-decompress"
exit $status
