#!/usr/bin/env bash
# Crash tests on a real mount: the kill -9 loop (crates/alignfs-crash). Each round checks
# that every acknowledged operation survived the previous crash and that fsck is clean.
# Ends with "suite totals: N passed, N failed" (one per round).
#
# Environment: CRASH_ROUNDS (default 300), CRASH_SEED (default random, printed).
# Soak: CRASH_ROUNDS=10000 scripts/crash.sh
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${CRASH_ROUNDS:-300}
command -v fusermount3 >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 >/dev/null || exit 1; }
cargo build --release --locked -q -p alignfs-cli -p alignfs-crash || exit 1
seed_args=()
[[ -n ${CRASH_SEED:-} ]] && seed_args=(--seed "$CRASH_SEED")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
target/release/alignfs-crash --alignfs target/release/alignfs --rounds "$rounds" "${seed_args[@]}" 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
if ((status == 0)); then
    echo "suite totals: $rounds passed, 0 failed"
else
    done_rounds=$(grep -o '^  [0-9]* rounds' "$out" | tail -1 | awk '{print $1}')
    echo "suite totals: ${done_rounds:-0} passed, 1 failed"
fi
exit "$status"
