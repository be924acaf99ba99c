#!/usr/bin/env bash
# The main job, end to end: install dependencies, build butter, make a demo
# btrfs image with mkfs.btrfs (no root needed: --rootdir), then list, read and
# extract it with butter. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[ -d build ] || meson setup build >/dev/null
ninja -C build >/dev/null

work=${DEMO_DIR:-/tmp/butter-demo}
rm -rf "$work"; mkdir -p "$work/src/docs" "$work/src/bin"
echo "hello from butter" > "$work/src/README"
seq 1 100000 > "$work/src/docs/numbers.txt"
ln -sf ../README "$work/src/docs/readme-link"
head -c 3000000 /dev/urandom > "$work/src/bin/blob"
truncate -s 200M "$work/demo.img"
mkfs.btrfs -q -f -L butter-demo --rootdir "$work/src" "$work/demo.img" >/dev/null

B=build/cli/butter
echo "== butter info"; $B info "$work/demo.img"
echo "== butter ls -l /"; $B ls -l "$work/demo.img" /
echo "== butter cat /README"; $B cat "$work/demo.img" /README
echo "== butter extract"; $B extract "$work/demo.img" / "$work/out"
diff -r "$work/src" "$work/out" && echo "extracted tree matches the source"
