#!/bin/bash
: "${OLD:?OLD=path of the old alignfs}" "${NEW:?NEW=path of the new alignfs}"
mkdir -p "${WORK:=/var/tmp/stream-reads}/mnt" && cd "$WORK"
for round in 1 2; do for b in old new; do
  A=$( [ $b = old ] && echo "$OLD" || echo "$NEW" )
  $A mkfs --force --fast /dev/shm/stream-reads-fast:1G --ssd ssd.img:4G >/dev/null 2>&1; $A mount --fast /dev/shm/stream-reads-fast --ssd ssd.img mnt >/dev/null 2>&1
  db_bench --db=mnt/db --benchmarks=fillrandom --num=100000 --write_buffer_size=4194304 --cache_size=8388608 --value_size=1024 --sync=0 --seed=1 --compression_type=none --threads=1 >/dev/null 2>&1
  $A umount mnt >/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches
  $A mount --fast /dev/shm/stream-reads-fast --ssd ssd.img mnt >/dev/null 2>&1
  r=$(db_bench --db=mnt/db --use_existing_db=1 --benchmarks=readrandom --num=100000 --reads=100000 --cache_size=8388608 --value_size=1024 --seed=2 --threads=1 2>/dev/null | grep "^readrandom" | awk '{print $5}')
  img=$(fincore -b -n -o RES ssd.img | tr -d ' ')
  echo "round $round $b: readrandom cold $r ops/s, image cached $((img>>20)) MiB"
  $A umount mnt >/dev/null
done; done
