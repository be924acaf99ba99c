#!/usr/bin/env bash
# tsan.sh — the multithreaded stress test (tests/tools/stress.c) under
# ThreadSanitizer: configures build-tsan with -Db_sanitize=thread (set up
# again if it exists configured otherwise), builds only butter-stress, makes
# a 1 GiB image with mkfs.btrfs in a temporary directory, runs butter-stress
# on it for TSAN_SECONDS (default 60) seconds, then `btrfs check --readonly`.
# Exits non-zero on a TSan report, a stress failure or a check error; the
# temporary directory is removed either way (TSAN_KEEP=1 keeps it).
#
# usage: scripts/tsan.sh [BUTTER-STRESS ARGS...]   e.g. scripts/tsan.sh --app-lock
# Environment: TSAN_SECONDS, TSAN_SEED (default 1), STRESS_ARGS (more
# butter-stress arguments, word-split), TSAN_OPTIONS (added to the defaults
# below), TSAN_BUILD (default build-tsan), TSAN_KEEP.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${TSAN_BUILD:-build-tsan}
seconds=${TSAN_SECONDS:-60}
seed=${TSAN_SEED:-1}

# (Re)configure: a missing, broken or differently configured build dir.
sanitize=""
if [ -f "$build/meson-info/intro-buildoptions.json" ]; then
	sanitize=$(python3 -c 'import json,sys
for o in json.load(open(sys.argv[1])):
    if o["name"] == "b_sanitize":
        v = o["value"]
        print(",".join(v) if isinstance(v, list) else v)' \
		"$build/meson-info/intro-buildoptions.json" 2>/dev/null || true)
fi
if [ -z "$sanitize" ]; then
	rm -rf "$build"
	meson setup "$build" -Db_sanitize=thread >/dev/null
elif [ "$sanitize" != thread ]; then
	echo "tsan.sh: $build was configured with b_sanitize=$sanitize; reconfiguring" >&2
	meson configure "$build" -Db_sanitize=thread >/dev/null ||
		meson setup --wipe "$build" -Db_sanitize=thread >/dev/null
fi
ninja -C "$build" tests/tools/butter-stress >/dev/null
stress=$build/tests/tools/butter-stress

tmp=$(mktemp -d "${TMPDIR:-/tmp}/butter-tsan.XXXXXX")
cleanup() {
	if [ "${TSAN_KEEP:-0}" = 1 ]; then
		echo "tsan.sh: kept $tmp" >&2
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT
img=$tmp/stress.img
truncate -s 1G "$img"
mkfs.btrfs -q -f "$img" >/dev/null

# halt_on_error: the first report ends the run (exit status 66).
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=7 exitcode=66 ${TSAN_OPTIONS:-}"

# gcc's TSan maps its shadow at fixed addresses, which a kernel with more
# mmap randomisation bits (vm.mmap_rnd_bits > 28 or so) can collide with
# ("unexpected memory mapping"): run without address randomisation when
# setarch can turn it off here.
run=()
if setarch "$(uname -m)" -R true 2>/dev/null; then
	run=(setarch "$(uname -m)" -R)
fi

set +e
# shellcheck disable=SC2086 # STRESS_ARGS is meant to be split
"${run[@]}" "$stress" --seconds "$seconds" --seed "$seed" ${STRESS_ARGS:-} "$@" "$img" \
	2>&1 | tee "$tmp/stress.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
	if grep -q "WARNING: ThreadSanitizer" "$tmp/stress.log"; then
		echo "tsan.sh: FAIL: ThreadSanitizer report (exit status $rc)" >&2
	else
		echo "tsan.sh: FAIL: butter-stress exit status $rc" >&2
	fi
	exit 1
fi
if grep -q "ThreadSanitizer" "$tmp/stress.log"; then
	echo "tsan.sh: FAIL: ThreadSanitizer said something (see above)" >&2
	exit 1
fi
if ! btrfs check --readonly "$img" >"$tmp/check.log" 2>&1; then
	cat "$tmp/check.log" >&2
	echo "tsan.sh: FAIL: btrfs check --readonly" >&2
	exit 1
fi
echo "tsan.sh: ok: no ThreadSanitizer report, btrfs check clean"
