#!/bin/bash
# usage: [ALIGNFS=BIN] history.sh WAIT_SECONDS — a 1 GiB uhs volume: fill 256 MiB, 20 s (HIST) of
# 4 KiB random writes from 8 jobs, wait, then three 5 s cells of flushed 4k+1m writes with
# the counters read (server stopped) around each.
set -e
B=${ALIGNFS:-target/release/alignfs}
W=/var/tmp/ux; S=/dev/shm/ux; mkdir -p $W $S
rm -f $W/ssd $S/nvm $W/sock
$B mkfs --profile uhs --fast $S/nvm:256M --ssd $W/ssd:1280M --size 1G >/dev/null
U="nbd+unix:///x?socket=$W/sock"
start() { $B nbd --fast $S/nvm --ssd $W/ssd --export x --socket $W/sock --no-tcp >/dev/null 2>&1 & P=$!
  for i in $(seq 100); do nbdinfo --size "$U" >/dev/null 2>&1 && break; sleep 0.05; done; }
stopit() { kill $P; wait $P || true; }
snap() { $B stat --json --fast $S/nvm --ssd $W/ssd > $W/$1.json; }
F="fio --name=b --ioengine=nbd --uri=$U --size=1G --randrepeat=0 --group_reporting --minimal"
start
fio --name=fill --ioengine=nbd --uri=$U --rw=write --bs=1m --size=256M --iodepth=4 >/dev/null
$F --rw=randwrite --bs=4k --numjobs=8 --time_based --runtime=${HIST:-20} >/dev/null
sleep $1
stopit
for k in 1 2 3; do
snap a$k; start
$F --rw=randwrite --bssplit=4k/50:1m/50 --fsync=1 --time_based --runtime=5 | grep -v "^$" | awk -F";" "NF>50{print \"4k+1m\", \$48/1024, \"MiB/s\"}"
stopit; snap b$k
python3 - $k $W <<'PY'
import json,sys
k, w = sys.argv[1], sys.argv[2]
a=json.load(open(f"{w}/a{k}.json"))["counters"]; b=json.load(open(f"{w}/b{k}.json"))["counters"]
for n in b:
    d=b[n]-a.get(n,0)
    if d and ("ssd" in n or "migra" in n): print(f"  {n} {d}")
PY
done
rm -rf $W $S
