#!/usr/bin/env bash
# Profile one fio workload on an alignfs mount with `perf record -a -g` and print where the
# machine's CPU time went (per thread kind and per symbol), plus a flame graph when
# `inferno-flamegraph` is installed (cargo install inferno).
#   bench/profile.sh [fio arguments...]   default: durable random writes of 1 B–2 MiB
# Output: bench/results/profile-<time>/ (perf.data, report.txt, flame.svg).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p alignfs-cli
command -v perf >/dev/null || { echo "profile: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
bin=$(pwd)/target/release/alignfs
out=bench/results/profile-$(date +%Y-%m-%d-%H%M)
mkdir -p "$out"
work=$(mktemp -d /var/tmp/alignfs-profile.XXXXXX)
shm=$(mktemp -d /dev/shm/alignfs-profile.XXXXXX)
trap 'mountpoint -q "$work/mnt" && "$bin" umount "$work/mnt" >/dev/null; rm -rf "$work" "$shm"' EXIT
"$bin" mkfs --fast "$shm/fast:1G" --ssd "$work/ssd.img:4G" >/dev/null
"$bin" mount --fast "$shm/fast" --ssd "$work/ssd.img" --log "$work/mount.log" "$work/mnt" >/dev/null
fio --name=prefill --filename="$work/mnt/f" --size=1g --rw=write --bs=1m --end_fsync=1 >/dev/null
args=("$@")
((${#args[@]})) || args=(--rw=randwrite --bsrange=1-2m --bs_unaligned=1 --fsync=1)
fio --name=profile --filename="$work/mnt/f" --size=1g --ioengine=psync --time_based --runtime=12 \
    --randseed=42 "${args[@]}" --output="$out/fio.txt" &
fio_pid=$!
sleep 2
perf record -a -g -o "$out/perf.data" -- sleep 8 2>/dev/null
wait "$fio_pid"
# `head` closes the pipes early; that is not a failure.
set +o pipefail
{
    echo "# fio ${args[*]}"
    grep -E "WRITE:|READ:|clat \(|sync \(" "$out/fio.txt" || true
    echo
    echo "# CPU samples by thread name (2 CPUs x 8 s; swapper = idle)"
    perf report -i "$out/perf.data" --no-children --sort comm -g none --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -15
    echo
    echo "# top symbols"
    perf report -i "$out/perf.data" --no-children --sort comm,symbol -g none --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
} | tee "$out/report.txt"
if command -v inferno-collapse-perf >/dev/null && command -v inferno-flamegraph >/dev/null; then
    perf script -i "$out/perf.data" 2>/dev/null | inferno-collapse-perf | inferno-flamegraph > "$out/flame.svg"
    echo "flame graph: $out/flame.svg"
fi
echo "profile: $out"
