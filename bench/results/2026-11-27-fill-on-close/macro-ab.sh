#!/usr/bin/env bash
# The macro flows (fileserver, webproxy, varmail; bench/run.py's file counts) on a fresh
# orch mount of each build in turn, alternating, 3 s cells. Prints ops/s per cell.
# Usage: macro-ab.sh OLD_BIN NEW_BIN [ROUNDS]
set -euo pipefail
old=$1 new=$2 rounds=${3:-3}
macro=$(dirname "$0")/../../../target/release/alignfs-macro
work=$(mktemp -d /var/tmp/macro-ab.XXXXXX) shm=$(mktemp -d /dev/shm/macro-ab.XXXXXX)
trap 'mountpoint -q "$work/mnt" && "$new" umount "$work/mnt" >/dev/null; rm -rf "$work" "$shm"' EXIT
mkdir -p "$work/mnt"
declare -A files=([fileserver]=1000 [webproxy]=250 [varmail]=1000)
for r in $(seq "$rounds"); do
  for build in old new; do
    bin=${!build}
    "$bin" mkfs --fast "$shm/fast:1G" --ssd "$work/ssd.img:8G" --force >/dev/null
    "$bin" mount --fast "$shm/fast" --ssd "$work/ssd.img" --log "$work/mount.log" "$work/mnt" >/dev/null
    for w in fileserver webproxy varmail; do
      common=(--workload "$w" --dir "$work/mnt/$w" --files "${files[$w]}" --seed 7)
      "$macro" prepare "${common[@]}"
      ops=$("$macro" run "${common[@]}" --seconds 3 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["ops_per_s"]))')
      echo "round $r $build $w $ops"
      rm -rf "${work:?}/mnt/$w"
    done
    "$bin" umount "$work/mnt" >/dev/null
  done
done
