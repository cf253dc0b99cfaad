#!/usr/bin/env bash
# Crash tests on a real mount. Each round kills the daemon with kill -9, checks that
# everything acknowledged before the crash survived, and runs fsck.
#   1. crates/alignfs-crash: a mixed file-system workload against a model kept outside
#      the mount;
#   2. SQLite (synchronous=FULL) in WAL and in DELETE journal mode: integrity_check, and
#      every committed transaction complete (tests/crash/sqlite_crash.py).
# Ends with "suite totals: N passed, N failed" (one per round).
#
# Environment: CRASH_ROUNDS (default 300), SQLITE_ROUNDS per journal mode (default 50),
# CRASH_SEED (default random, printed). Soak: CRASH_ROUNDS=10000 scripts/crash.sh
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
    passed=$rounds
    failed=0
else
    passed=$(grep -o '^  [0-9]* rounds' "$out" | tail -1 | awk '{print $1}')
    passed=${passed:-0}
    failed=1
fi

# --- SQLite -------------------------------------------------------------------------------
bin=$(pwd)/target/release/alignfs
sqlite_rounds=${SQLITE_ROUNDS:-50}
daemon_pid() { "$bin" stat "$1" --json | sed -n 's/.*"pid": \([0-9]*\).*/\1/p'; }
wait_gone() {
    for _ in $(seq 1000); do
        [[ -r /proc/$1/stat ]] || return 0
        [[ $(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1) == Z ]] && return 0
        sleep 0.01
    done
    return 1
}
sqlite_loop() {
    local mode=$1 work shm last=0 acked round pid runner
    work=$(mktemp -d /var/tmp/alignfs-crash-sqlite.XXXXXX)
    shm=$(mktemp -d /dev/shm/alignfs-crash-sqlite.XXXXXX)
    local devices=(--fast "$shm/fast" --ssd "$work/ssd.img") mnt=$work/mnt
    "$bin" mkfs --fast "$shm/fast:32M" --ssd "$work/ssd.img:1G" >/dev/null || return 1
    for round in $(seq "$sqlite_rounds"); do
        "$bin" mount "${devices[@]}" --log "$work/mount.log" "$mnt" >/dev/null || return 1
        if ! python3 tests/crash/sqlite_crash.py check "$mnt/db.sqlite" "$mode" "$last"; then
            echo "sqlite $mode round $round: acknowledged transactions lost (devices kept in $work)"
            return 1
        fi
        passed=$((passed + 1))
        pid=$(daemon_pid "$mnt")
        timeout 60 python3 tests/crash/sqlite_crash.py run "$mnt/db.sqlite" "$mode" >"$work/acked" &
        runner=$!
        sleep "0.$((RANDOM % 400 + 100))"
        kill -9 "$pid"
        wait "$runner"
        acked=$(tail -1 "$work/acked")
        [[ -n $acked ]] && last=$acked
        wait_gone "$pid" || return 1
        "$bin" fsck "${devices[@]}" >"$work/fsck.out" || { cat "$work/fsck.out"; return 1; }
    done
    "$bin" mount "${devices[@]}" --log "$work/mount.log" "$mnt" >/dev/null || return 1
    python3 tests/crash/sqlite_crash.py check "$mnt/db.sqlite" "$mode" "$last" || return 1
    "$bin" umount "$mnt" >/dev/null || return 1
    echo "sqlite $mode: $sqlite_rounds kill -9 rounds, $last transactions committed, none lost, integrity_check ok, fsck clean"
    rm -rf "$work" "$shm"
}
for mode in wal delete; do
    sqlite_loop "$mode" || { failed=$((failed + 1)); status=1; }
done
echo "suite totals: $passed passed, $failed failed"
exit "$status"
