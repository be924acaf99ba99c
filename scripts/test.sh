#!/usr/bin/env bash
# The whole test suite: install dependencies, build with ASan + UBSan, run the
# unit tests, the integration tests (kernel as oracle: needs root, loop devices
# and btrfs; under CI=true a skipped test fails the run) and a bounded fuzz run.
# Idempotent. FUZZ_SECONDS (default 120) bounds the fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
modprobe btrfs 2>/dev/null || true

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

[ -d build ] || meson setup build -Db_sanitize=address,undefined >/dev/null
ninja -C build
# an optimised build too: -O3 finds warnings (-Werror) the sanitizer build does not
[ -d build-release ] || meson setup build-release --buildtype=release >/dev/null
ninja -C build-release >/dev/null
meson test -C build --print-errorlogs

if [ -x tests/fuzz/run.sh ]; then
	tests/fuzz/run.sh "${FUZZ_SECONDS:-120}"
fi

export BUTTER_BIN=$PWD/build/cli/butter
/usr/bin/python3 -m pytest -q -rs tests/integration "$@"
