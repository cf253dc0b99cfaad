#!/bin/bash
# Two builds of `alignfs nbd`, measured alternately in one session (a refactor's A/B):
# each round formats a fresh 256 MiB uhs volume per build, fills 64 MiB, and runs fio's
# nbd engine on 4 KiB writes (flushed or not, queue depth 1 and 8), mixed 4k+64k flushed
# writes at depth 8, mixed 4k+1m flushed writes at depth 1 (after the random writes have
# scattered the free space) and 4 KiB reads at depth 8. Prints each cell, then medians and ratios.
#
#   bench/nbd-ab.sh OLD_ALIGNFS NEW_ALIGNFS [ROUNDS=4] [SECONDS=5]
#   TRANSPORT=unix|tcp (default unix); OLD_ARGS / NEW_ARGS: extra `alignfs nbd` options,
#   e.g. OLD_ARGS="--workers 2" NEW_ARGS="--workers 8" with the same binary twice.
set -euo pipefail
old=$1 new=$2 rounds=${3:-4} secs=${4:-5}
declare -A extra=([old]="${OLD_ARGS:-}" [new]="${NEW_ARGS:-}")
work=$(mktemp -d /var/tmp/nbd-ab.XXXXXX) shm=$(mktemp -d /dev/shm/nbd-ab.XXXXXX)
trap 'rm -rf "$work" "$shm"' EXIT
if [[ ${TRANSPORT:-unix} == tcp ]]; then
    listen=(--listen 127.0.0.1:31999) uri="nbd://127.0.0.1:31999/x"
else
    listen=(--socket "$work/sock" --no-tcp) uri="nbd+unix:///x?socket=$work/sock"
fi
workloads=(
    "--bs=4k --rw=randwrite --fsync=1 --iodepth=1"
    "--bs=4k --rw=randwrite --fsync=1 --iodepth=8"
    "--bs=4k --rw=randwrite --iodepth=1"
    "--bs=4k --rw=randwrite --iodepth=8"
    "--bssplit=4k/50:64k/50 --rw=randwrite --fsync=1 --iodepth=8"
    "--bssplit=4k/50:1m/50 --rw=randwrite --fsync=1 --iodepth=1"
    "--bs=4k --rw=randread --iodepth=8 --size=64M"
)
mib_s='import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; s=j["write"] if j["write"]["io_bytes"] else j["read"]; print(round(s["bw"]/1024,1))'
for r in $(seq "$rounds"); do
    for v in old new; do
        bin=${!v}
        rm -f "$shm/nvm" "$work/uhs.img"
        "$bin" mkfs --profile uhs --fast "$shm/nvm:256M" --ssd "$work/uhs.img:320M" --size 256M >/dev/null
        # shellcheck disable=SC2086 # extra options are words
        "$bin" nbd --fast "$shm/nvm" --ssd "$work/uhs.img" "${listen[@]}" --export x ${extra[$v]} >/dev/null 2>&1 &
        pid=$!
        for _ in $(seq 100); do nbdinfo --size "$uri" >/dev/null 2>&1 && break; sleep 0.05; done
        fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --size=64M --iodepth=4 >/dev/null
        for w in "${workloads[@]}"; do
            # shellcheck disable=SC2086 # a workload is several options
            bw=$(fio --name=b --ioengine=nbd --uri="$uri" --size=256M --time_based --runtime="$secs" --randrepeat=0 \
                --output-format=json $w | python3 -c "$mib_s")
            echo "$r $v [$w] $bw"
        done
        kill -INT $pid
        wait $pid
    done
done | tee "$work/cells"
python3 - "$work/cells" <<'PY'
import collections, statistics, sys
cells = collections.defaultdict(list)
for line in open(sys.argv[1]):
    workload = line[line.index("["):line.index("]") + 1]
    cells[(workload, line.split()[1])].append(float(line.split()[-1]))
print("\nmedian MiB/s")
for w in dict.fromkeys(k[0] for k in cells):
    old, new = statistics.median(cells[(w, "old")]), statistics.median(cells[(w, "new")])
    print(f"{w:62} old {old:7.1f}  new {new:7.1f}  {new / old:.2f}x")
PY
