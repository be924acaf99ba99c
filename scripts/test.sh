#!/usr/bin/env bash
# The whole test suite: install dependencies, build with ASan + UBSan, run the
# unit tests, the integration tests (kernel as oracle: needs root, loop devices
# and btrfs; under CI=true a skipped test fails the run), a bounded fuzz run,
# the layering check (scripts/check-layers.py) and the threaded stress test
# under ThreadSanitizer (scripts/tsan.sh).
# Idempotent. FUZZ_SECONDS (default 120) bounds the fuzzing, TSAN_SECONDS
# (default 30 here) the stress test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
modprobe btrfs 2>/dev/null || true

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# meson_dir DIR NAME=VALUE...: make DIR a meson build directory with these
# options. A missing or unconfigured DIR is set up; a configured one whose
# options differ (say a build made earlier without sanitizers) is
# reconfigured, never silently reused; one that matches is left alone.
meson_dir() {
	local dir=$1 opt name want have
	shift
	if [ ! -f "$dir/meson-private/coredata.dat" ]; then
		local args=()
		for opt in "$@"; do args+=("-D$opt"); done
		meson setup "$dir" "${args[@]}" >/dev/null
		return
	fi
	for opt in "$@"; do
		name=${opt%%=*}
		want=${opt#*=}
		# the value as meson holds it (a string, or a list in newer meson), comma-joined
		have=$(meson introspect "$dir" --buildoptions | /usr/bin/python3 -c '
import json, sys
name = sys.argv[1]
for o in json.load(sys.stdin):
    if o["name"] == name:
        v = o["value"]
        print(",".join(v) if isinstance(v, list) else str(v))
        break
' "$name")
		if [ "$have" != "$want" ]; then
			echo "$dir: $name is '$have', want '$want': reconfiguring"
			meson configure "$dir" "-D$opt" >/dev/null
		fi
	done
}

meson_dir build b_sanitize=address,undefined
ninja -C build
# an optimised build too: -O3 finds warnings (-Werror) the sanitizer build does not
meson_dir build-release buildtype=release
# quiet when it builds; its compiler's messages when it does not
if ! release_log=$(ninja -C build-release 2>&1); then
	printf '%s\n' "$release_log" | grep -v '^\[' | tail -60 || true
	echo "the optimised build (build-release) failed" >&2
	exit 1
fi
meson test -C build --print-errorlogs
# no folder of lib/ uses a symbol of a folder above it
/usr/bin/python3 scripts/check-layers.py build
# many threads on one handle, the library's own lock only (ThreadSanitizer build)
TSAN_SECONDS=${TSAN_SECONDS:-30} scripts/tsan.sh

if [ -x tests/fuzz/run.sh ]; then
	tests/fuzz/run.sh "${FUZZ_SECONDS:-120}"
fi

export BUTTER_BIN=$PWD/build/cli/butter
/usr/bin/python3 -m pytest -q -rs tests/integration "$@"
