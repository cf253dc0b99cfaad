#!/bin/bash
set -euo pipefail
work=$(mktemp -d /var/tmp/uhs1m.XXXXXX) shm=$(mktemp -d /dev/shm/uhs1m.XXXXXX)
trap 'rm -rf "$work" "$shm"' EXIT
uri="nbd+unix:///x?socket=$work/sock"
for r in 1 2 3; do for v in old new2; do
  bin=/tmp/alignfs-$v
  rm -f "$shm/nvm" "$work/uhs.img"
  $bin mkfs --profile uhs --fast "$shm/nvm:256M" --ssd "$work/uhs.img:320M" --size 256M >/dev/null
  $bin nbd --fast "$shm/nvm" --ssd "$work/uhs.img" --socket "$work/sock" --no-tcp --export x >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do nbdinfo --size "$uri" >/dev/null 2>&1 && break; sleep 0.05; done
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --size=64M --iodepth=4 >/dev/null
  for wl in "--bs=1m --rw=randwrite --fsync=1 --iodepth=1" "--bs=1m --rw=randwrite --iodepth=4"; do
    bw=$(fio --name=w --ioengine=nbd --uri="$uri" $wl --size=64M --time_based --runtime=5 --output-format=json | python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["write"]["bw"]/1024,1))')
    echo "$r $v [$wl] $bw"
  done
  kill $pid; wait $pid 2>/dev/null || true
done; done
