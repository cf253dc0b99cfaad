#!/bin/bash
# Old and new builds alternating: cold sequential read of a 1 GiB file, cold 4 KiB random reads
# (fio, read-only open), and the memory both caches hold afterwards.
: "${OLD:?OLD=path of the old alignfs}" "${NEW:?NEW=path of the new alignfs}"
mkdir -p "${WORK:=/var/tmp/stream-reads}/mnt" && cd "$WORK"
head -c 1G /dev/urandom > /dev/shm/src1g 2>/dev/null || true
for profile in orch scrap; do
for round in 1 2 3; do
  for b in old new; do
    A=$( [ $b = old ] && echo "$OLD" || echo "$NEW" )
    if [ $profile = orch ]; then $A mkfs --force --fast /dev/shm/stream-reads-fast:1G --ssd ssd.img:4G >/dev/null 2>&1; $A mount --fast /dev/shm/stream-reads-fast --ssd ssd.img mnt >/dev/null 2>&1
    else $A mkfs --force --profile scrap --ssd ssd.img:4G >/dev/null 2>&1; $A mount --ssd ssd.img --scrap-mem 256M mnt >/dev/null 2>&1; fi
    cp /dev/shm/src1g mnt/f; $A sync mnt >/dev/null 2>&1
    sync; echo 3 > /proc/sys/vm/drop_caches
    s=$(date +%s.%N); cat mnt/f > /dev/null; e=$(date +%s.%N)
    seq=$(echo "1024/($e-$s)" | bc)
    img=$(fincore -b -n -o RES ssd.img | tr -d ' '); file=$(fincore -b -n -o RES mnt/f | tr -d ' ')
    sync; echo 3 > /proc/sys/vm/drop_caches
    rr=$(fio --name=r --filename=mnt/f --readonly --rw=randread --bs=4k --ioengine=psync --runtime=5 --time_based --output-format=json 2>/dev/null | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw"]/1024,1))')
    echo "$profile round $round $b: cold seq $seq MiB/s, file cached $((file>>20)) MiB, image cached $((img>>20)) MiB; cold 4k randread $rr MiB/s"
    $A umount mnt >/dev/null
  done
done
done
