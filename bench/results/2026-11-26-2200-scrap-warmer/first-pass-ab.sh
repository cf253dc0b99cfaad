#!/bin/bash
# A/B: first pass of 64 KiB±10% partial writes on a fresh scrap mount, old vs new build.
set -e
IMG=/var/tmp/thp-ab.img; MNT=/tmp/thp-ab/mnt; mkdir -p $MNT
B=/tmp/alignfs-old
$B mkfs --profile scrap --ssd $IMG:3G --force >/dev/null
$B mount --ssd $IMG --scrap-mem 4G --log /tmp/thp-ab/m.log $MNT
dd if=/dev/urandom of=$MNT/partial bs=1M count=1024 oflag=direct status=none; sync $MNT/partial
fusermount3 -u $MNT; sleep 1
for round in 3 4 5 6; do
 for b in old new; do
  /tmp/alignfs-$b mount --ssd $IMG --scrap-mem 4G --log /tmp/thp-ab/m.log $MNT
  bw=$(fio --name=w --filename=$MNT/partial --output-format=json --ioengine=psync --rw=randwrite --invalidate=0 \
      --randrepeat=1 --randseed=$((7+round)) --size=1G --io_size=384M --bsrange=58982-72090 --bs_unaligned=1 --end_fsync=0 \
      | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"]/2**20))')
  rss=$(ps -o rss= -C alignfs-$b 2>/dev/null || ps -o rss= -p $(pgrep -f "alignfs-$b mount" | head -1))
  ahp=$(grep AnonHugePages /proc/meminfo | awk '{print $2}')
  echo "round $round $b ${bw} MiB/s rss_kib=$rss anonhuge_kib=$ahp"
  python3 -c "import os; fd=os.open('$MNT/partial', os.O_RDONLY); os.fsync(fd)"
  fusermount3 -u $MNT; sleep 2
 done
done
