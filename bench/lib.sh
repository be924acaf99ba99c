# bench/lib.sh — what the bench scripts share; sourced, never run. The script
# sourcing it sets REPO (the repository) and die() first, and LOGS (a
# directory for logs) before bench_butter, by hand or by bench_dirs.
#
#   bench_butter [TARGET...]
#                       sets BUTTER to a release butter binary: $BUTTER if the
#                       caller gave one, else $REPO/build-bench (release, no
#                       sanitizers) configured and built, with the further ninja
#                       TARGETs (bench/butter-nullfs); dies if none results
#   bench_butter_line   prints "== butter REV[+changes], BINARY"
#   bench_need CMD...   dies naming the first CMD not on PATH
#   bench_dirs          makes $BENCH_DIR (absolute from then on) and an empty
#                       $BENCH_DIR/logs as LOGS
#   bench_keep_best T REAL CPU
#                       the best (lowest) wall time of tool T so far in
#                       BEST[T], with its cpu time in CPU[T] (associative
#                       arrays the caller declares)
# shellcheck shell=bash

bench_butter() {
	if [[ -z ${BUTTER:-} ]]; then
		local build=$REPO/build-bench
		# werror=false: -O3 can raise -Wmaybe-uninitialized false positives that
		# the default debugoptimized build does not see; they must not stop the bench.
		if [[ ! -f $build/build.ninja ]]; then
			meson setup "$build" "$REPO" --buildtype=release -Db_sanitize=none -Dwerror=false >/dev/null
		else
			meson configure "$build" -Dbuildtype=release -Db_sanitize=none -Dwerror=false >/dev/null
		fi
		ninja -C "$build" cli/butter "$@" >"$LOGS/build.log" 2>&1 ||
			{ cat "$LOGS/build.log" >&2; die "build failed"; }
		BUTTER=$build/cli/butter
	fi
	[[ -x $BUTTER ]] || die "no butter binary at $BUTTER"
}

bench_butter_line() {
	echo "== butter $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo '+changes'), $BUTTER"
}

bench_need() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null || die "missing command: $c"
	done
}

bench_dirs() {
	mkdir -p "$BENCH_DIR"
	BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
	LOGS=$BENCH_DIR/logs
	rm -rf "$LOGS"
	mkdir -p "$LOGS"
}

# BEST and CPU are the caller's associative arrays
# shellcheck disable=SC2004,SC2034
bench_keep_best() {
	local t=$1 real=$2 cpu=$3
	if [[ -z ${BEST[$t]:-} ]] || (($(echo "$real < ${BEST[$t]}" | bc))); then
		BEST[$t]=$real
		CPU[$t]=$cpu
	fi
}
