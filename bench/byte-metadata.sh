#!/usr/bin/env bash
# Host->device write traffic of durable metadata operations (ByteFS's micro workloads:
# create, mkdir, unlink, rmdir), on a `byte` mount, on the same profile with the byte
# interface off (--no-byte-interface, the block-only baseline), and on ext4 on a loop
# device over an image on this disk, whose block-layer counters give its real traffic.
#
# alignfs makes every metadata operation durable before it returns, so ext4 is measured
# twice: with an fsync of the directory after each operation (the same promise) and with
# one sync at the end (ext4's own batching, a weaker promise).
#
# Usage: bench/byte-metadata.sh [N]   (N operations of each kind, default 2000; root)
# Needs a release build: cargo build --release -p alignfs-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(pwd)/target/release/alignfs
n=${1:-2000}
[[ -x $bin ]] || { echo "build it first: cargo build --release -p alignfs-cli" >&2; exit 1; }
work=$(mktemp -d /var/tmp/alignfs-byte-meta.XXXXXX)
shm=$(mktemp -d /dev/shm/alignfs-byte-meta.XXXXXX)
loop=
cleanup() {
    for m in "$work"/m-*; do mountpoint -q "$m" && { "$bin" umount "$m" >/dev/null 2>&1 || umount -l "$m"; }; done
    [[ -n $loop ]] && losetup -d "$loop"
    rm -rf "$work" "$shm"
}
trap cleanup EXIT

# $1: directory; $2: 1 to fsync the directory after each operation.
workload() {
    python3 - "$1" "$n" "$2" <<'PY'
import os, sys
d, n, each = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
fd = os.open(d, os.O_RDONLY)
for i in range(n):
    os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    os.mkdir(f"{d}/d{i}")
    if each:
        os.fsync(fd)
for i in range(n):
    os.unlink(f"{d}/f{i}")
    os.rmdir(f"{d}/d{i}")
    if each:
        os.fsync(fd)
os.fsync(fd)
PY
}
ops=$((4 * n))
device_counters() {
    "$bin" stat "$1" --json | python3 -c '
import json, sys
d = {c["name"]: c["value"] for c in json.load(sys.stdin)["device_counters"]}
print(d["byte_store_bytes"], d["block_write_bytes"], d["flash_program_bytes"])'
}
report() { # name, host->device bytes, seconds, extra
    printf '%-34s %12d B  %8.1f B/op  %6.2f s  %s\n' "$1" "$2" "$(echo "$2 / $ops" | bc -l)" "$3" "$4"
}
echo "$ops durable metadata operations ($n each of create, mkdir, unlink, rmdir)"
for mode in byte block-only; do
    "$bin" mkfs --profile byte --ssd "$work/$mode.img:2G" --fast "$shm/$mode" >/dev/null
    mkdir -p "$work/m-$mode"
    options=()
    [[ $mode == block-only ]] && options=(--no-byte-interface)
    "$bin" mount --ssd "$work/$mode.img" --fast "$shm/$mode" "${options[@]}" --log "$work/$mode.log" "$work/m-$mode" >/dev/null
    read -r stores0 blocks0 flash0 < <(device_counters "$work/m-$mode")
    start=$(date +%s.%N)
    workload "$work/m-$mode" 0
    seconds=$(echo "$(date +%s.%N) - $start" | bc)
    read -r stores1 blocks1 flash1 < <(device_counters "$work/m-$mode")
    report "byte ($mode)" $((stores1 - stores0 + blocks1 - blocks0)) "$seconds" \
        "(byte interface $((stores1 - stores0)) B, block interface $((blocks1 - blocks0)) B, flash programs $((flash1 - flash0)) B)"
    "$bin" umount "$work/m-$mode" >/dev/null
done
truncate -s 2G "$work/ext4.img"
loop=$(losetup -f --show "$work/ext4.img")
mkfs.ext4 -q "$loop"
mkdir -p "$work/m-ext4"
for each in 1 0; do
    mount "$loop" "$work/m-ext4"
    sync
    written() { echo $(($(awk '{print $7}' "/sys/block/$(basename "$loop")/stat") * 512)); }
    before=$(written)
    start=$(date +%s.%N)
    workload "$work/m-ext4" "$each"
    sync
    seconds=$(echo "$(date +%s.%N) - $start" | bc)
    name="ext4 (fsync after each op)"
    ((each)) || name="ext4 (one sync at the end)"
    report "$name" $(($(written) - before)) "$seconds" ""
    umount "$work/m-ext4"
done
