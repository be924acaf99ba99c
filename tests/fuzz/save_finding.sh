#!/bin/sh
# save_finding.sh [--write] NAME INPUT [EXPECTED-MESSAGE]... — turn a fuzz
# finding into a regression case: tests/images/NNN-NAME/ with the input (its
# seed index made canonical), the seed it edits (name and sha256, checked on
# replay), the messages the walk must log (optional), and a README to fill in.
# --write: the finding is fuzz_write's (replayed with the write sequence; the
# folder gets a "harness" file). Minimize the input first: fuzz_open_walk (or
# fuzz_write) -minimize_crash=1 -runs=10000 INPUT (crashes) or keep the
# smallest input that shows the bug. run.sh replays every case.
set -eu
harness=open_walk
if [ "${1:-}" = --write ]; then
	harness=write
	shift
fi
[ $# -ge 2 ] || { echo "usage: $0 NAME INPUT [EXPECTED-MESSAGE]..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${BUTTER_FUZZ_BUILD:-$repo/build-fuzz}
name=$1
input=$2
shift 2

info=$("$build/tests/fuzz/fuzz_replay" --seed-info "$input")
idx=$(printf '%s\n' "$info" | sed -n 's/^seed-index //p')
seedline=$(printf '%s\n' "$info" | grep ' sha256:')
last=$(ls "$repo/tests/images" 2>/dev/null | sed -n 's/^\([0-9][0-9][0-9]\)-.*/\1/p' | sort -n | tail -n 1)
num=$(printf '%03d' $(( ${last:-0} + 1 )))
dir="$repo/tests/images/$num-$name"
mkdir -p "$dir"
python3 - "$input" "$dir/fuzz-input" "$idx" <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[0] = (int(sys.argv[3]) << 2) | (data[0] & 3)
open(sys.argv[2], "wb").write(data)
PY
printf '%s\n' "$seedline" > "$dir/seed"
[ "$harness" = write ] && printf 'write\n' > "$dir/harness"
: > "$dir/expect"
for m in "$@"; do printf '%s\n' "$m" >> "$dir/expect"; done
[ -s "$dir/expect" ] || rm "$dir/expect"
if [ ! -f "$dir/README" ]; then
	printf 'Fuzz finding (fuzz_%s): %s\n\nWhat broke:\nFix:\nReplay: build-fuzz/tests/fuzz/fuzz_replay -v tests/images/%s\n' \
		"$harness" "$name" "$num-$name" > "$dir/README"
fi
echo "$dir"
