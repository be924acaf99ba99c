#!/bin/sh
# Soak of the tree log replay: many seeded random crash cases made by the kernel
# (tests/integration/test_log_replay.py), each replayed by butter and compared with
# the kernel's own replay. Needs root, loop devices and kernel btrfs.
#   scripts/logreplay-soak.sh [FIRST-LAST] [BUTTER_BIN]
# About 0.8 s per seed on a 2-core machine; CI runs seeds 1-12 only.
set -eu
seeds=${1:-13-400}
bin=${2:-${BUTTER_BIN:-build/cli/butter}}
cd "$(dirname "$0")/.."
LOG_REPLAY_SEEDS=$seeds BUTTER_BIN=$(realpath "$bin") exec /usr/bin/python3 -m pytest -q \
    -p no:cacheprovider tests/integration/test_log_replay.py -k random
