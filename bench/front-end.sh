#!/usr/bin/env bash
# The mount's front end against ext4 on the same disk, in interleaved rounds: page-cache
# modes (`alignfs mount --cache direct|reads|all`) and transports (`--transport dev-fuse|
# io-uring`). Workloads: cold and warm random reads by a read-only reader, O_DIRECT 4 KiB
# random reads (each one a request to the daemon), durable 4 KiB random writes by one and by
# four writers, creating, stating and removing small files, and RocksDB's readrandom after a
# synchronous fillrandom.
# Prints one line per (workload, system): median MiB/s (or ops/s) over the rounds, the spread,
# and the ratio to ext4. docs/FUSE.md quotes it.
#
# Environment: ROUNDS (3), RUNTIME seconds per fio cell (5), SIZE of the file (512m),
# WORKLOADS to run, any of "fio metadata rocksdb" (default all),
# SYSTEMS to compare, each MODE[@TRANSPORT][=BINARY] (default "direct reads"; e.g.
# "reads@dev-fuse reads@io-uring", or "reads=/tmp/old/alignfs reads" to measure two builds
# alternately), ALIGNFS (default target/release/alignfs, built).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "run as root: it drops the page cache" >&2; exit 1; }
missing=()
for tool in fio:fio db_bench:rocksdb-tools fusermount3:fuse3; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
    echo "installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
rounds=${ROUNDS:-3}
runtime=${RUNTIME:-5}
size=${SIZE:-512m}
read -ra mounts <<<"${SYSTEMS:-direct reads}"
bin=${ALIGNFS:-target/release/alignfs}
[[ -n ${ALIGNFS:-} ]] || cargo build --release --locked -q -p alignfs-cli
work=$(mktemp -d /var/tmp/alignfs-front-end.XXXXXX)
shm=$(mktemp -d /dev/shm/alignfs-front-end.XXXXXX)
trap 'mountpoint -q "$work/mnt" && "$bin" umount "$work/mnt" >/dev/null; rm -rf "$work" "$shm"' EXIT
mkdir -p "$work/ext4" "$work/mnt"
"$bin" mkfs --fast "$shm/fast:1G" --ssd "$work/ssd.img:4G" >/dev/null

fio_cell() { # dir, rw, extra args → MiB/s
    fio --name=cell --directory="$1" --filename=data --size="$size" --ioengine=psync --time_based --runtime="$runtime" \
        --randrepeat=1 --invalidate=0 --group_reporting --rw="$2" "${@:3}" --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round((j["write"]["bw"]+j["read"]["bw"])/1024, 1))'
}
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
want() { [[ " ${WORKLOADS:-fio metadata rocksdb} " == *" $1 "* ]]; }
metadata() { # dir → files created, stated and removed per second
    python3 - "$1/meta" <<'PY'
import os, sys, time
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
n, start = 2000, time.monotonic()
for i in range(n):
    with open(f"{d}/f{i}", "wb") as f:
        f.write(b"x" * 100)
for i in range(n):
    os.stat(f"{d}/f{i}")
for i in range(n):
    os.unlink(f"{d}/f{i}")
print(round(n / (time.monotonic() - start)))
PY
}
rocksdb() { # dir, reads → "fillrandom-ops/s readrandom-ops/s"
    rm -rf "$1/db"
    db_bench --db="$1/db" --benchmarks=fillrandom,readrandom --num=20000 --reads="$2" --write_buffer_size=4194304 \
        --cache_size=8388608 --value_size=1024 --sync=1 --seed=42 --compression_type=none --threads=1 2>/dev/null |
        awk '$1 == "fillrandom" { w = $5 } $1 == "readrandom" { r = $5 } END { print w, r }'
}
results=$work/results
: >"$results"
systems=(ext4 "${mounts[@]}")
for ((r = 0; r < rounds; r++)); do
    for ((i = 0; i < ${#systems[@]}; i++)); do
        system=${systems[$(((i + r) % ${#systems[@]}))]}
        dir=$work/ext4
        if [[ $system != ext4 ]]; then
            spec=${system%%=*} transport=auto system_bin=$bin
            [[ $system == *=* ]] && system_bin=${system#*=}
            [[ $spec == *@* ]] && transport=${spec#*@}
            "$system_bin" mount --fast "$shm/fast" --ssd "$work/ssd.img" --log "$work/mount.log" --cache "${spec%@*}" \
                --transport "$transport" "$work/mnt" >/dev/null
            dir=$work/mnt
        fi
        if want fio; then
            fio --name=fill --directory="$dir" --filename=data --size="$size" --rw=write --bs=1m --end_fsync=1 \
                --output-format=json >/dev/null
            drop
            echo "$system cold-1MiB-randread $(fio_cell "$dir" randread --bs=1m --readonly)" >>"$results"
            cat "$dir/data" >/dev/null
            echo "$system warm-4KiB-randread $(fio_cell "$dir" randread --bs=4k --readonly)" >>"$results"
            echo "$system warm-1MiB-randread $(fio_cell "$dir" randread --bs=1m --readonly)" >>"$results"
            echo "$system direct-4KiB-randread $(fio_cell "$dir" randread --bs=4k --direct=1 --readonly)" >>"$results"
            echo "$system durable-4KiB-randwrite $(fio_cell "$dir" randwrite --bs=4k --fsync=1)" >>"$results"
            echo "$system durable-4KiB-randwrite-x4 $(fio_cell "$dir" randwrite --bs=4k --fsync=1 --numjobs=4)" >>"$results"
            echo "$system durable-1MiB-randwrite $(fio_cell "$dir" randwrite --bs=1m --fsync=1)" >>"$results"
        fi
        want metadata && echo "$system create-stat-unlink-ops/s $(metadata "$dir")" >>"$results"
        if want rocksdb; then
            ssd_written() { "$system_bin" stat "$work/mnt" | awk '$1 == "ssd_write_bytes" { print $2 }'; }
            [[ $system == ext4 ]] || before=$(ssd_written)
            read -r fill reads <<<"$(rocksdb "$dir" 200000)"
            echo "$system rocksdb-fillrandom-sync-ops/s $fill" >>"$results"
            echo "$system rocksdb-readrandom-ops/s $reads" >>"$results"
            # One read per key, as bench/run.py does: most blocks are read for the first time.
            read -r _ reads <<<"$(rocksdb "$dir" 20000)"
            echo "$system rocksdb-readrandom-1x-ops/s $reads" >>"$results"
            if [[ $system != ext4 ]]; then
                # SSD bytes per put (two fills of 20,000 keys), from the engine's own count.
                echo "$system rocksdb-ssd-KiB-per-put $(python3 -c "print(round(($(ssd_written) - $before) / 40000 / 1024, 2))")" >>"$results"
            fi
        fi
        rm -rf "${dir:?}"/*
        [[ $system == ext4 ]] || "$system_bin" umount "$work/mnt" >/dev/null
        echo "round $((r + 1))/$rounds: $system done" >&2
    done
done
python3 - "$results" "${systems[@]}" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 3]
systems = sys.argv[2:]
workloads = list(dict.fromkeys(w for _, w, _ in rows))
width = max(len(s) for s in systems)
print(f"{'workload':28} {'system':{width}} {'median':>10} {'spread':>22} {'÷ext4':>7}")
for w in workloads:
    med = {s: statistics.median([float(v) for s2, w2, v in rows if s2 == s and w2 == w] or [0]) for s in systems}
    for s in systems:
        vals = [float(v) for s2, w2, v in rows if s2 == s and w2 == w]
        if not vals:  # a figure only some systems have (the engine's own counters)
            continue
        ratio = med[s] / med["ext4"] if med["ext4"] else float("nan")
        print(f"{w:28} {s:{width}} {med[s]:10.1f} {f'[{min(vals):.1f}–{max(vals):.1f}]':>22} {ratio:7.2f}")
EOF
