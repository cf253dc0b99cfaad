#!/usr/bin/env bash
# Crash tests on a real mount. Each round kills the daemon with kill -9, checks that
# everything acknowledged before the crash survived, and runs fsck.
#   1. crates/alignfs-crash: a mixed file-system workload against a model kept outside
#      the mount, on an `orch` volume, then on a `scrap` and a `byte` volume;
#   2. SQLite (synchronous=FULL) in WAL and in DELETE journal mode: integrity_check, and
#      every committed transaction complete (tests/crash/sqlite_crash.py);
#   3. PostgreSQL (initdb --data-checksums) under pgbench: crash recovery, pg_amcheck
#      --heapallindexed, pgbench's balance invariants, every logged transaction present,
#      and pg_checksums --check after a clean stop;
#   4. fio's power-cut verification (verify_state_save / verify_only) with fio's trigger
#      killing the daemon.
# Ends with "suite totals: N passed, N failed" (one per round).
#
# Environment: CRASH_ROUNDS (default 300), SCRAP_CRASH_ROUNDS (default 150),
# BYTE_CRASH_ROUNDS (default 60), SQLITE_ROUNDS per journal mode (default 30),
# PG_ROUNDS (default 3), FIO_ROUNDS (default 10); 0 skips a loop. CRASH_SEED (default
# random, printed) replays the mixed workload. The soak is scripts/crash-soak.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${CRASH_ROUNDS:-300}
command -v fusermount3 >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 >/dev/null || exit 1; }
cargo build --release --locked -q --workspace || exit 1
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
# The same loop on another profile's volume, counted round by round.
profile_rounds() {
    local profile=$1 rounds=$2
    ((rounds > 0)) || return 0
    target/release/alignfs-crash --alignfs target/release/alignfs --profile "$profile" --rounds "$rounds" "${seed_args[@]}" "${@:3}" 2>&1 | tee "$out"
    if ((PIPESTATUS[0] == 0)); then
        passed=$((passed + rounds))
    else
        local done_rounds
        done_rounds=$(grep -o '^  [0-9]* rounds' "$out" | tail -1 | awk '{print $1}')
        passed=$((passed + ${done_rounds:-0}))
        failed=$((failed + 1))
        status=1
    fi
}
# `scrap` (DRAM scrap pages, 8 MiB of them): every fsynced byte must survive, and unsynced
# bytes may only go missing, never turn into others. Over /dev/fuse, so that both transports
# are killed mid-request (the others use what `auto` picks: io_uring where enabled).
profile_rounds scrap "${SCRAP_CRASH_ROUNDS:-150}" --transport dev-fuse
# `byte` (the emulated memory-semantic SSD, its firmware killed with the daemon): every
# acknowledged operation survives the device's own recovery and then the volume's.
profile_rounds byte "${BYTE_CRASH_ROUNDS:-60}"

# --- SQLite -------------------------------------------------------------------------------
bin=$(pwd)/target/release/alignfs
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
sqlite_rounds=${SQLITE_ROUNDS:-30}
sqlite_loop() {
    local mode=$1 transport=$2 work shm last=0 acked round pid runner
    work=$(mktemp -d /var/tmp/alignfs-crash-sqlite.XXXXXX)
    shm=$(mktemp -d /dev/shm/alignfs-crash-sqlite.XXXXXX)
    local devices=(--fast "$shm/fast" --ssd "$work/ssd.img") mnt=$work/mnt
    "$bin" mkfs --fast "$shm/fast:32M" --ssd "$work/ssd.img:1G" >/dev/null || return 1
    for round in $(seq "$sqlite_rounds"); do
        "$bin" mount "${devices[@]}" --transport "$transport" --log "$work/mount.log" "$mnt" >/dev/null || return 1
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
        wait_gone "$pid" 10 || return 1
        "$bin" fsck "${devices[@]}" >"$work/fsck.out" || { cat "$work/fsck.out"; return 1; }
    done
    "$bin" mount "${devices[@]}" --transport "$transport" --log "$work/mount.log" "$mnt" >/dev/null || return 1
    python3 tests/crash/sqlite_crash.py check "$mnt/db.sqlite" "$mode" "$last" || return 1
    "$bin" umount "$mnt" >/dev/null || return 1
    echo "sqlite $mode ($transport): $sqlite_rounds kill -9 rounds, $last transactions committed, none lost, integrity_check ok, fsck clean"
    rm -rf "$work" "$shm"
}
if ((sqlite_rounds > 0)); then
    sqlite_loop wal auto || { failed=$((failed + 1)); status=1; }
    sqlite_loop delete dev-fuse || { failed=$((failed + 1)); status=1; }
fi
# --- fio power-cut verification --------------------------------------------------------
# fio's own checker, independent of ours: a verifying random write job (O_SYNC, so every
# completed write is acknowledged) on a preallocated file. A trigger file makes fio stop,
# save its verify state (which writes completed) and run the trigger command, which kills
# the daemon. After a remount, `--verify_only --verify_state_load` reads back and checks
# every block whose write completed.
fio_rounds=${FIO_ROUNDS:-10}
command -v fio >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null
fio_loop() {
    local work shm mnt round pid verified=0 blocks mid_run=0
    work=$(mktemp -d /var/tmp/alignfs-crash-fio.XXXXXX)
    shm=$(mktemp -d /dev/shm/alignfs-crash-fio.XXXXXX)
    mnt=$work/mnt
    local devices=(--fast "$shm/fast" --ssd "$work/ssd.img")
    "$bin" mkfs --fast "$shm/fast:64M" --ssd "$work/ssd.img:2G" >/dev/null || return 1
    for round in $(seq "$fio_rounds"); do
        "$bin" mount "${devices[@]}" --log "$work/mount.log" "$mnt" >/dev/null || return 1
        [[ -f $mnt/fio.dat ]] || fallocate -l 512M "$mnt/fio.dat" || return 1
        pid=$(daemon_pid "$mnt")
        mkdir -p "$work/state" && rm -f "$work/state"/* "$work/trigger"
        local job=(--name=powercut "--filename=$mnt/fio.dat" --size=512M --rw=randwrite
            --bssplit=4k/40:32k/30:100k/30 --ioengine=psync --sync=1 --verify=crc32c
            "--randseed=$round" "--aux-path=$work/state")
        (sleep "0.$((RANDOM % 900 + 100))" && touch "$work/trigger") &
        fio "${job[@]}" --do_verify=0 --verify_state_save=1 "--trigger-file=$work/trigger" \
            "--trigger=kill -9 $pid" >"$work/write.out" 2>&1
        wait
        if wait_gone "$pid" 1; then
            mid_run=$((mid_run + 1))
        else
            # fio finished before the trigger: kill the daemon anyway.
            kill -9 "$pid" 2>/dev/null
            wait_gone "$pid" 10 || return 1
        fi
        "$bin" fsck "${devices[@]}" >"$work/fsck.out" || { cat "$work/fsck.out"; return 1; }
        "$bin" mount "${devices[@]}" --log "$work/mount.log" "$mnt" >/dev/null || return 1
        if ! fio "${job[@]}" --verify_only --verify_state_load=1 >"$work/verify.out" 2>&1; then
            grep -iE "bad|error" "$work/verify.out" | head -5
            echo "fio power-cut round $round: acknowledged blocks failed verification (kept in $work)"
            return 1
        fi
        blocks=$(sed -n 's/.*issued rwts: total=\([0-9]*\),.*/\1/p' "$work/verify.out" | head -1)
        verified=$((verified + ${blocks:-0}))
        passed=$((passed + 1))
        "$bin" umount "$mnt" >/dev/null || return 1
    done
    "$bin" fsck "${devices[@]}" >/dev/null || return 1
    echo "fio power-cut: $fio_rounds rounds ($mid_run killed mid-run by fio's trigger), $verified acknowledged blocks verified (crc32c), none bad, fsck clean"
    rm -rf "$work" "$shm"
}
if ((fio_rounds > 0)); then
    fio_loop || { failed=$((failed + 1)); status=1; }
fi
# --- PostgreSQL ---------------------------------------------------------------------------
pg_rounds=${PG_ROUNDS:-3}
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if ((pg_rounds > 0)) && [[ -z $pg_bin ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null && pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
pg_loop() {
    local work shm mnt round pid total=0 acked history
    work=$(mktemp -d /var/tmp/alignfs-crash-pg.XXXXXX)
    shm=$(mktemp -d /dev/shm/alignfs-crash-pg.XXXXXX)
    chmod 0755 "$work"
    mnt=$work/mnt
    local devices=(--fast "$shm/fast" --ssd "$work/ssd.img") sock=$work/sock
    local pg=(runuser -u postgres --) data=$mnt/pg/data
    local pgopts="-k $sock -p 5499 -c listen_addresses= -c fsync=on -c full_page_writes=on"
    mkdir -p "$sock" "$work/pgbench" && chown postgres "$sock" "$work/pgbench"
    "$bin" mkfs --fast "$shm/fast:64M" --ssd "$work/ssd.img:2G" >/dev/null || return 1
    "$bin" mount "${devices[@]}" --log "$work/mount.log" -o allow_other "$mnt" >/dev/null || return 1
    mkdir -p "$mnt/pg" && chown postgres "$mnt/pg"
    "${pg[@]}" "$pg_bin/initdb" -D "$data" --data-checksums -A trust >"$work/initdb.log" 2>&1 || { tail "$work/initdb.log"; return 1; }
    "${pg[@]}" "$pg_bin/pg_ctl" -D "$data" -o "$pgopts" -l "$work/pgbench/server.log" -w start >/dev/null || return 1
    "${pg[@]}" "$pg_bin/pgbench" -h "$sock" -p 5499 -i -s 4 -q postgres >/dev/null 2>&1 || return 1
    pg_check() {
        local sums
        "${pg[@]}" "$pg_bin/pg_amcheck" -h "$sock" -p 5499 --install-missing --heapallindexed --all >"$work/amcheck.out" 2>&1 || { cat "$work/amcheck.out"; return 1; }
        sums=$("${pg[@]}" "$pg_bin/psql" -h "$sock" -p 5499 -At postgres -c "select (select sum(abalance) from pgbench_accounts) = (select coalesce(sum(delta),0) from pgbench_history) and (select sum(bbalance) from pgbench_branches) = (select coalesce(sum(delta),0) from pgbench_history) and (select sum(tbalance) from pgbench_tellers) = (select coalesce(sum(delta),0) from pgbench_history), (select count(*) from pgbench_history)") || return 1
        [[ ${sums%%|*} == t ]] || { echo "pgbench balances disagree: $sums"; return 1; }
        history=${sums##*|}
        ((history >= total)) || { echo "$((total - history)) acknowledged pgbench transactions are missing"; return 1; }
    }
    for round in $(seq "$pg_rounds"); do
        pid=$(daemon_pid "$mnt")
        rm -f "$work"/pgbench/pgbench_log.*
        (cd "$work/pgbench" && "${pg[@]}" "$pg_bin/pgbench" -h "$sock" -p 5499 -c 2 -T 30 -n -l postgres >"$work/pgbench.out" 2>&1) &
        local runner=$!
        sleep "$((RANDOM % 3 + 2)).$((RANDOM % 10))"
        kill -9 "$pid"
        wait "$runner"
        # pgbench logs a transaction once its COMMIT returned.
        acked=$(cat "$work"/pgbench/pgbench_log.* 2>/dev/null | wc -l)
        total=$((total + acked))
        local postmaster
        postmaster=$(head -1 "$data/postmaster.pid" 2>/dev/null || pgrep -u postgres -f "postgres -D $data" | head -1)
        wait_gone "$pid" 10 || return 1
        pkill -9 -u postgres -f "$data" || true
        [[ -n $postmaster ]] && { kill -9 "$postmaster" 2>/dev/null || true; }
        sleep 0.5
        "$bin" fsck "${devices[@]}" >"$work/fsck.out" || { cat "$work/fsck.out"; return 1; }
        "$bin" mount "${devices[@]}" --log "$work/mount.log" -o allow_other "$mnt" >/dev/null || return 1
        # The dead postmaster may linger as an unreaped zombie here, which postgres would
        # take for a live one; it is dead, so its lock files go.
        rm -f "$data/postmaster.pid" "$sock"/.s.PGSQL.5499*
        "${pg[@]}" "$pg_bin/pg_ctl" -D "$data" -o "$pgopts" -l "$work/pgbench/server.log" -w start >/dev/null || { tail "$work/pgbench/server.log"; return 1; }
        pg_check || { echo "postgres round $round failed (kept in $work)"; return 1; }
        passed=$((passed + 1))
        echo "postgres round $round: $acked transactions acknowledged before the kill; recovered, amcheck clean, $history in history"
    done
    "${pg[@]}" "$pg_bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null || return 1
    "${pg[@]}" "$pg_bin/pg_checksums" --check -D "$data" >"$work/checksums.out" 2>&1 || { cat "$work/checksums.out"; return 1; }
    "$bin" umount "$mnt" >/dev/null || return 1
    "$bin" fsck "${devices[@]}" >/dev/null || return 1
    echo "postgres: $pg_rounds kill -9 rounds under pgbench, $total transactions acknowledged, none lost; pg_checksums clean"
    rm -rf "$work" "$shm"
}
if ((pg_rounds > 0)); then
    pg_loop || { failed=$((failed + 1)); status=1; }
fi
echo "suite totals: $passed passed, $failed failed"
exit "$status"
