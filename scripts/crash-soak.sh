#!/usr/bin/env bash
# The crash soak, outside CI (about an hour here):
#   1. every sequence of 1-3 operations crashed at every persistence point (power-loss
#      images, crates/alignfs/tests/power_loss.rs with ALIGNFS_EXHAUSTIVE_DEPTH=3), and
#      25x the random power-loss workloads;
#   2. 10,000 kill -9 rounds of the mount workload (scripts/crash.sh without the database
#      and fio loops; CRASH_ROUNDS to change).
# Usage: scripts/crash-soak.sh   (ALIGNFS_SEED and CRASH_SEED replay as in CI)
set -euo pipefail
cd "$(dirname "$0")/.."
ALIGNFS_EXHAUSTIVE_DEPTH=3 ALIGNFS_TEST_SCALE=25 cargo test --release --locked -p alignfs --test power_loss -- --nocapture 2>&1 |
    grep -E "power loss|seed|panicked|test result"
CRASH_ROUNDS=${CRASH_ROUNDS:-10000} SQLITE_ROUNDS=0 PG_ROUNDS=0 FIO_ROUNDS=0 scripts/crash.sh
