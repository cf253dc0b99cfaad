#!/usr/bin/env bash
# Long soak outside CI: fsx for 10 million operations (FSX_OPS to change) on a mounted
# volume with a small fast tier, so migration runs throughout. Takes several hours.
# Usage: scripts/soak.sh [seed]
set -euo pipefail
cd "$(dirname "$0")/.."
seed=${1:-$RANDOM}
ops=${FSX_OPS:-10000000}
command -v fsx >/dev/null || cargo install --locked -q fsx@0.3.2
cargo build --release --locked -q --workspace
bin=$(pwd)/target/release/alignfs
work=$(mktemp -d /var/tmp/alignfs-soak.XXXXXX)
shm=$(mktemp -d /dev/shm/alignfs-soak.XXXXXX)
trap '"$bin" umount "$work/mnt" >/dev/null 2>&1; rm -rf "$work" "$shm"' EXIT
"$bin" mkfs --fast "$shm/fast:16M" --ssd "$work/ssd.img:2G" >/dev/null
"$bin" mount --fast "$shm/fast" --ssd "$work/ssd.img" --log "$work/mount.log" "$work/mnt"
echo "soak: fsx seed $seed, $ops operations (log: $work/fsx.out)"
status=0
fsx -f tests/suites/fsx.toml -N "$ops" -S "$seed" -P "$work" "$work/mnt/soak" >"$work/fsx.out" 2>&1 || status=$?
tail -5 "$work/fsx.out"
grep -q "All operations completed A-OK" "$work/fsx.out" || { KEEP_LOG=$(mktemp /var/tmp/alignfs-soak-fail.XXXXXX); cp "$work/fsx.out" "$KEEP_LOG"; echo "soak FAILED (status $status); fsx log kept in $KEEP_LOG" >&2; exit 1; }
"$bin" stat "$work/mnt" | sed -n 1,9p
