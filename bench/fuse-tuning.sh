#!/usr/bin/env bash
# Measure the FUSE front end's tuning choices with fio on a scratch volume: request threads
# (1, 2, 4, 8) and writes through the kernel page cache (`--cache all`) against direct writes
# (the default), with ext4 on the same disk as the baseline. bench/front-end.sh compares
# the cache modes on reads.
# Prints one line per (setting, workload) with MiB/s and the ratio to ext4.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p alignfs-cli
bin=target/release/alignfs
work=$(mktemp -d /var/tmp/alignfs-tuning.XXXXXX)
shm=$(mktemp -d /dev/shm/alignfs-tuning.XXXXXX)
trap 'mountpoint -q "$work/mnt" && "$bin" umount "$work/mnt" >/dev/null; rm -rf "$work" "$shm"' EXIT
runtime=${RUNTIME:-5}

# name: fio arguments
workloads=(
    "4k-randwrite-4jobs:--rw=randwrite --bs=4k --numjobs=4 --size=128m"
    "64k±unaligned-randwrite-4jobs:--rw=randwrite --bsrange=60k-68k --bs_unaligned=1 --numjobs=4 --size=128m"
    "1m-write-2jobs:--rw=write --bs=1m --numjobs=2 --size=512m"
    "4k-randread-4jobs:--rw=randread --bs=4k --numjobs=4 --size=128m"
)
mibs() { # dir, fio args → MiB/s (write or read, whichever ran)
    fio --name=t --directory="$1" --ioengine=psync --time_based --runtime="$runtime" --group_reporting \
        --output-format=json $2 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round((j["write"]["bw"]+j["read"]["bw"])/1024))'
}
declare -A base
mkdir -p "$work/ext4"
for w in "${workloads[@]}"; do base[${w%%:*}]=$(mibs "$work/ext4" "${w#*:}"); rm -rf "$work/ext4"/*; done
"$bin" mkfs --fast "$shm/fast:1G" --ssd "$work/ssd.img:4G" >/dev/null
printf '%-24s %-30s %8s %8s\n' setting workload MiB/s "÷ext4"
for w in "${workloads[@]}"; do printf '%-24s %-30s %8s %8s\n' ext4 "${w%%:*}" "${base[${w%%:*}]}" 1.00; done
for setting in "--threads 1" "--threads 2" "--threads 4" "--threads 8" "--threads 4 --cache all"; do
    # shellcheck disable=SC2086
    "$bin" mount --fast "$shm/fast" --ssd "$work/ssd.img" --log "$work/mount.log" $setting "$work/mnt" >/dev/null
    for w in "${workloads[@]}"; do
        v=$(mibs "$work/mnt" "${w#*:}")
        printf '%-24s %-30s %8s %8.2f\n' "$setting" "${w%%:*}" "$v" "$(echo "$v / ${base[${w%%:*}]}" | bc -l)"
        rm -rf "$work/mnt"/*
    done
    "$bin" umount "$work/mnt" >/dev/null
done
