#!/usr/bin/env bash
# Builds of alignfs (or wrappers of them), and ext4, taking turns on run.py's durable
# large-write cells through the mount: 1 B–2 MiB and 1 MiB ±10 % random overwrites of a
# 1 GiB file, fsync after each, 5 s each, a fresh volume per system and round.
#   sudo ab.sh ROUNDS BIN|ext4 ...       (ext4: the same fio jobs on a plain directory)
# Prints MiB/s per round, and the daemon's transparent huge pages.
set -euo pipefail
rounds=$1; shift
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=/var/tmp/ab; shm=/dev/shm/ab
for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    rm -rf "$work" "$shm"; mkdir -p "$work/mnt" "$shm"
    if [[ $bin != ext4 ]]; then
      "$bin" mkfs --fast "$shm/fast:1G" --ssd "$work/ssd.img:4G" >/dev/null
      "$bin" mount --fast "$shm/fast" --ssd "$work/ssd.img" --log "$work/mount.log" "$work/mnt" >/dev/null
    fi
    FILE=$work/mnt/f SIZE=1g BSRANGE=1m-1m UNALIGNED=0 DIRECT=0 SEED=42 fio --thread "$repo/bench/fio/prefill.fio" >/dev/null
    for cell in "1-2097152" "943719-1153433"; do
      sync; echo 3 > /proc/sys/vm/drop_caches
      out=$(FILE=$work/mnt/f SIZE=1g BSRANGE=$cell UNALIGNED=1 DIRECT=0 FSYNC=1 FDATASYNC=0 RUNTIME=5 SEED=42 \
        fio --thread "$repo/bench/fio/overwrite.fio" --output-format=json |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["jobs"][0]["write"]["bw_bytes"]/2**20,1))')
      pid=$(pgrep -f "mount --fast $shm" | head -1 || true)
      thp=$(grep AnonHuge "/proc/$pid/smaps_rollup" 2>/dev/null | awk '{print $2}' || echo "?")
      echo "round $r $(basename "$bin") $cell $out MiB/s thp=${thp:-?}kB"
    done
    [[ $bin == ext4 ]] || "$bin" umount "$work/mnt" >/dev/null
  done
done
rm -rf "$work" "$shm"
