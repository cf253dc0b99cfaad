#!/usr/bin/env bash
# The project's tests: formatting, lints, unit + integration + doc tests, a smoke run of
# the CLI (mkfs, stat, fsck, bench --quick) on throwaway devices, then the POSIX suites and
# applications against a real mount (scripts/suites.sh), the kill -9 crash loop
# (scripts/crash.sh; both need root and /dev/fuse), the uhs block volume through real NBD
# clients (scripts/nbd.sh), the nvstore object store through real S3 clients
# (scripts/s3.sh), mounts through mount(8) and metrics (scripts/operate.sh), device
# faults through a mount, programs
# under the LD_PRELOAD shim, a GlusterFS cluster on alignfs bricks, a short run of every
# fuzz target (scripts/fuzz.sh; nightly Rust, installed if missing) and the smoke runs of
# the benchmarks (mount, GlusterFS, scrap, uhs, nvstore, S3, and the five-profile comparison).
set -euo pipefail
cd "$(dirname "$0")/.."
# Where the run's time goes (CI must finish in under an hour): each stage's start, in
# minutes and seconds since the tests began.
stage() { printf '== stage %s at %d:%02d\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }

stage "format, lints, unit tests"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The engine's imports run downwards only (docs/ARCHITECTURE.md, "Layers").
scripts/check-layers.py
cargo test --workspace --locked -- --skip power_loss
# The power-loss tests apart, so their figures (crash points, images) show in the log.
power_log=$(mktemp)
cargo test --locked -p alignfs power_loss -- --nocapture >"$power_log" 2>&1 || { cat "$power_log"; exit 1; }
grep -E "^power loss|seed|^test result" "$power_log"
rm -f "$power_log"

stage "CLI smoke checks"
# One command for the CLI and the C API: cargo resolves features per command, and the
# release builds below all name the whole workspace, so that no build compiles the engine
# again with another feature set.
cargo build --locked -p alignfs-cli -p alignfs-c
work=$(mktemp -d /var/tmp/alignfs-smoke.XXXXXX)
shm=$(mktemp -d /dev/shm/alignfs-smoke.XXXXXX)
trap 'rm -rf "$work" "$shm"' EXIT
bin=target/debug/alignfs
"$bin" --help >/dev/null
"$bin" mkfs --fast "$shm/fast:16M" --ssd "$work/ssd.img:64M"
if "$bin" mkfs --fast "$shm/fast" --ssd "$work/ssd.img" 2>"$work/err"; then
    echo "smoke: mkfs over an existing volume must refuse" >&2; exit 1
fi
grep -q "already holds the fast tier of orch volume" "$work/err"
"$bin" stat --fast "$shm/fast" --ssd "$work/ssd.img" --json | grep '"profile": "orch"' >/dev/null
"$bin" fsck --fast "$shm/fast" --ssd "$work/ssd.img" | grep ': clean$' >/dev/null
# A reader that closes the pipe early must not make stat panic (exit 141 is expected).
"$bin" stat --fast "$shm/fast" --ssd "$work/ssd.img" 2>"$work/err" | head -1 >/dev/null || true
if grep -q panicked "$work/err"; then echo "smoke: stat panicked on a closed pipe" >&2; exit 1; fi
printf 'garbage' | dd of="$shm/fast" bs=1 seek=40 conv=notrunc status=none
if "$bin" stat --fast "$shm/fast" --ssd "$work/ssd.img" 2>"$work/err"; then
    echo "smoke: a corrupt superblock must be refused" >&2; exit 1
fi
grep -q "superblock at byte 0" "$work/err"
status=0
"$bin" fsck --fast "$shm/fast" --ssd "$work/ssd.img" >"$work/out" || status=$?
if [[ $status != 2 ]] || ! grep -q "superblock at byte 0" "$work/out"; then
    echo "smoke: fsck must name the damaged superblock and exit 2 (got $status)" >&2; exit 1
fi
# mount refuses the damaged volume by name and leaves nothing mounted.
if "$bin" mount --fast "$shm/fast" --ssd "$work/ssd.img" --log "$work/mount.log" "$work/mnt" 2>"$work/err"; then
    echo "smoke: mount of a corrupt volume must fail" >&2; exit 1
fi
grep -q "superblock at byte 0" "$work/err"
if mountpoint -q "$work/mnt"; then echo "smoke: a refused mount left a mount behind" >&2; exit 1; fi
# An unknown page-cache mode is refused by name, with the modes there are, before anything mounts.
if "$bin" mount --cache page "$work/mnt" 2>"$work/err"; then echo "smoke: mount --cache page must fail" >&2; exit 1; fi
grep -q "unknown cache mode \"page\": one of direct, reads, all" "$work/err"
if mountpoint -q "$work/mnt"; then echo "smoke: a refused mount left a mount behind" >&2; exit 1; fi
# stat of a directory that is not an alignfs mount says so.
if "$bin" stat "$work" 2>"$work/err"; then echo "smoke: stat of a plain directory must fail" >&2; exit 1; fi
grep -q "is not the root of an alignfs mount" "$work/err"
# A scrap volume on two SSDs: a fast tier, too little scrap memory or a missing SSD is
# refused with a clear message and leaves nothing mounted.
if "$bin" mkfs --profile scrap --fast "$shm/scrap-fast:16M" --ssd "$work/scrap-a.img:64M" 2>"$work/err"; then
    echo "smoke: mkfs --profile scrap must refuse a fast tier" >&2; exit 1
fi
grep -q "drop --fast" "$work/err"
"$bin" mkfs --profile scrap --ssd "$work/scrap-a.img:64M" --ssd "$work/scrap-b.img:64M" >/dev/null
"$bin" fsck --ssd "$work/scrap-b.img" --ssd "$work/scrap-a.img" | grep ': clean$' >/dev/null
for bad in "--scrap-mem 100K --ssd $work/scrap-b.img" "--scrap-mem 64M"; do
    # shellcheck disable=SC2086 # word splitting wanted: each case is several arguments
    if "$bin" mount --ssd "$work/scrap-a.img" $bad --log "$work/mount.log" "$work/mnt" 2>"$work/err"; then
        echo "smoke: mount $bad must fail" >&2; exit 1
    fi
    grep -qE "fewer than two|spans 2 SSDs" "$work/err"
    if mountpoint -q "$work/mnt"; then echo "smoke: a refused mount left a mount behind" >&2; exit 1; fi
done
# A malformed size is refused by name, and nothing is mounted.
for flag in --fill-on-close --clean-cache; do
    if "$bin" mount --ssd "$work/scrap-a.img" --ssd "$work/scrap-b.img" "$flag" 12Q --log "$work/mount.log" "$work/mnt" 2>"$work/err"; then
        echo "smoke: mount $flag 12Q must fail" >&2; exit 1
    fi
    grep -q -- "$flag: cannot parse size \"12Q\"" "$work/err"
    if mountpoint -q "$work/mnt"; then echo "smoke: a refused mount left a mount behind" >&2; exit 1; fi
done
# Block-volume options: a malformed range, a bad sector size or a file-system profile is
# refused by name before any device file is created.
for bad in "--profile uhs --nvm-range 5M" "--profile uhs --nvm-range 8M-4M" "--profile uhs --sector-size 1000" "--size 1G"; do
    # shellcheck disable=SC2086 # word splitting wanted: each case is several arguments
    if "$bin" mkfs $bad --fast "$shm/uhs-nvm:16M" --ssd "$work/uhs.img:64M" 2>"$work/err"; then
        echo "smoke: mkfs $bad must fail" >&2; exit 1
    fi
    grep -qE "START-END|must be non-empty|512 or 4096|format block volumes" "$work/err"
    if [[ -e $work/uhs.img ]]; then echo "smoke: a refused mkfs $bad created a device" >&2; exit 1; fi
done
# An nvstore volume: its KV store beside the image by default or where --kv says; a
# directory holding other files is refused; stat and fsck read it; mount says what serves
# it instead.
"$bin" mkfs --profile nvstore --ssd "$work/nv.img:64M" | grep "KV store $work/nv.img.kv" >/dev/null
mkdir "$work/not-a-store" && touch "$work/not-a-store/keep"
if "$bin" mkfs --profile nvstore --force --ssd "$work/nv2.img:64M" --kv "$work/not-a-store" 2>"$work/err"; then
    echo "smoke: mkfs --kv over a directory of other files must refuse" >&2; exit 1
fi
grep -q "holds no alignfs KV store" "$work/err"
if [[ -e $work/nv2.img ]]; then echo "smoke: a refused mkfs created a device" >&2; exit 1; fi
"$bin" mkfs --profile nvstore --ssd "$work/nv3.img:64M" --kv "$work/nv3-kv" >/dev/null
"$bin" stat --ssd "$work/nv3.img" --kv "$work/nv3-kv" --json | grep '"profile": "nvstore"' >/dev/null
"$bin" stat --ssd "$work/nv3.img" --kv "$work/nv3-kv" | grep "(profile nvstore, format version 5)" >/dev/null
"$bin" fsck --ssd "$work/nv.img" | grep ': clean$' >/dev/null
if "$bin" fsck --ssd "$work/nv3.img" >"$work/out"; then echo "smoke: fsck without the volume's --kv must fail" >&2; exit 1; fi
if "$bin" mount --ssd "$work/nv.img" --log "$work/mount.log" "$work/mnt" 2>"$work/err"; then
    echo "smoke: mount of an object store must fail" >&2; exit 1
fi
grep -q "object store (nvstore profile), not a file system" "$work/err"
# A byte volume: the flash image and the device's DRAM (named as --fast, sized by mkfs);
# stat shows the device's own counters, fsck reads it, a second mkfs refuses, a block-only
# option on another profile is noted as unused.
"$bin" mkfs --profile byte --ssd "$work/byte.img:64M" --fast "$shm/byte-dram" | grep "write log" >/dev/null
"$bin" stat --ssd "$work/byte.img" --fast "$shm/byte-dram" | grep "^ flash_program_bytes" >/dev/null
"$bin" stat --ssd "$work/byte.img" --fast "$shm/byte-dram" | grep "format version 5, metadata in place)" >/dev/null
"$bin" fsck --ssd "$work/byte.img" --fast "$shm/byte-dram" | grep ': clean$' >/dev/null
# The journal instead of in-place metadata, by choice; a profile without byte stores refuses in place.
"$bin" mkfs --profile byte --meta-store journal --ssd "$work/byte-j.img:64M" --fast "$shm/byte-j-dram" >/dev/null
"$bin" stat --ssd "$work/byte-j.img" --fast "$shm/byte-j-dram" | grep "^  journal:" >/dev/null
if "$bin" mkfs --profile orch --meta-store in-place --ssd "$work/orch-ip.img:64M" --fast "$shm/orch-ip" 2>"$work/err"; then
    echo "smoke: in-place metadata needs a memory-semantic SSD" >&2; exit 1
fi
grep -q "cannot keep metadata in place" "$work/err"
if "$bin" mkfs --profile byte --ssd "$work/byte.img" --fast "$shm/byte-dram" 2>"$work/err"; then
    echo "smoke: mkfs over an existing byte volume must refuse" >&2; exit 1
fi
grep -q "already holds the DRAM of memory-semantic SSD" "$work/err"
# A mounted volume's devices: mkfs of any profile refuses them even with --force, naming
# the mount point; a second mount is refused at once; a program that sends the terminal
# ioctl on every open (CPython) leaves no lines in the log; a clean unmount writes no
# warning; fsck is clean.
"$bin" mkfs --fast "$shm/held.fast:16M" --ssd "$work/held.img:64M" >/dev/null
"$bin" mount --transport dev-fuse --fast "$shm/held.fast" --ssd "$work/held.img" --log "$work/held.log" "$work/held" >/dev/null
echo kept >"$work/held/kept"
for bad in "--profile byte --fast $shm/held.fast --ssd $work/new-flash.img:64M" "--profile scrap --ssd $work/held.img" \
           "--profile byte --fast $shm/new-dram --ssd $work/held.img"; do
    # shellcheck disable=SC2086 # word splitting wanted: each case is several arguments
    if "$bin" mkfs --force $bad 2>"$work/err"; then echo "smoke: mkfs --force $bad over a mounted volume must refuse" >&2; exit 1; fi
    grep -q "is in use: the volume is mounted at $work/held" "$work/err" || { cat "$work/err"; exit 1; }
    if [[ -e $work/new-flash.img || -e $shm/new-dram ]]; then echo "smoke: a refused mkfs created a device" >&2; exit 1; fi
done
started=$SECONDS
if "$bin" mount --fast "$shm/held.fast" --ssd "$work/held.img" --log "$work/held2.log" "$work/held2" 2>"$work/err"; then
    echo "smoke: a second mount of a mounted volume must refuse" >&2; exit 1
fi
grep -q "mounted at $work/held" "$work/err" || { cat "$work/err"; exit 1; }
if ((SECONDS - started > 5)); then echo "smoke: the second mount took $((SECONDS - started)) s to refuse" >&2; exit 1; fi
python3 -c "import sys; [open(f'{sys.argv[1]}/kept').read() for _ in range(500)]" "$work/held"
"$bin" umount "$work/held" >/dev/null
if grep -E "WARN|ERROR|\x1b\[" "$work/held.log"; then echo "smoke: the mount log has warnings or colour codes" >&2; exit 1; fi
"$bin" fsck --fast "$shm/held.fast" --ssd "$work/held.img" | grep ': clean$' >/dev/null
"$bin" bench --quick --dir "$work/bench" --fast-dir "$shm/bench" --json "$work/bench.json" >/dev/null
grep -q '"system": "limit"' "$work/bench.json"
echo "smoke: CLI checks passed"

# The C API's example, compiled against the header and the shared library, on a fresh volume.
"$bin" mkfs --fast "$shm/c-fast:16M" --ssd "$work/c-ssd.img:256M" >/dev/null
cc -Wall -Wextra -Werror -Icrates/alignfs-c/include crates/alignfs-c/examples/hello.c \
    -Ltarget/debug -lalignfs_c "-Wl,-rpath,$(pwd)/target/debug" -o "$work/hello"
"$work/hello" "$shm/c-fast" "$work/c-ssd.img" | tail -1
"$bin" fsck --fast "$shm/c-fast" --ssd "$work/c-ssd.img" | grep ': clean$' >/dev/null
# Its block half, on a uhs volume with an NVM range.
"$bin" mkfs --profile uhs --fast "$shm/c-uhs-fast:32M" --ssd "$work/c-uhs.img:256M" --nvm-range 0-1M >/dev/null
cc -Wall -Wextra -Werror -Icrates/alignfs-c/include crates/alignfs-c/examples/block.c \
    -Ltarget/debug -lalignfs_c "-Wl,-rpath,$(pwd)/target/debug" -o "$work/block"
"$work/block" "$shm/c-uhs-fast" "$work/c-uhs.img" | tail -1
"$bin" fsck --fast "$shm/c-uhs-fast" --ssd "$work/c-uhs.img" | grep ': clean$' >/dev/null

stage "suites on the mount"
suites=0
scripts/suites.sh || suites=$?
# An option the volume's profile does not use is named, and the mount goes ahead.
"$bin" mount --fast "$shm/c-fast" --ssd "$work/c-ssd.img" --scrap-mem 64M --clean-cache 8M --log "$work/c-mount.log" "$work/c-mnt" >"$work/out"
grep -q "scrap-mem has no effect: profile orch" "$work/out"
grep -q "clean-cache has no effect: profile orch" "$work/out"
"$bin" umount "$work/c-mnt" >/dev/null
# As an operator runs it: mount -t fuse.alignfs, an fstab line, umount(8), and the
# Prometheus text of `alignfs stat` through Prometheus's parser (docs/OPERATING.md).
stage "operating"
scripts/operate.sh || suites=1
stage "crash loops"
scripts/crash.sh || suites=1
# The uhs profile over NBD: nbdinfo, qemu-img/qemu-io, nbdcopy, fio verify, ext4 through
# nbdfuse + loop, a read-only export, and a kill -9 loop (docs/UHS.md).
stage "NBD"
scripts/nbd.sh || suites=1
# The nvstore object store over S3: boto3, awscli, s3cmd, rclone, limits, and a kill -9
# loop with multipart uploads in flight (docs/S3.md).
stage "S3"
scripts/s3.sh || suites=1
# Injected SSD faults and full devices through a mount.
stage "faults, preload, GlusterFS"
mkdir -p "$work/faults"
tests/faults/mount_faults.py target/release/alignfs "$work/faults" || suites=1
# Unmodified programs (Python, sqlite3, fio, RocksDB) under the LD_PRELOAD shim.
cargo build --release --locked -q --workspace
tests/preload/run.py target/release/alignfs target/release/libalignfs_preload.so "$work/preload" || suites=1
# GlusterFS with alignfs bricks: 3 nodes in network namespaces, a node's alignfs killed in
# the middle of writes, recovery and self-heal, teardown (deploy/gluster, docs/SCALE-OUT.md).
tests/gluster/run.py target/release/alignfs || suites=1
stage "fuzzing"
scripts/fuzz.sh
stage "benchmark smoke runs"
# The GlusterFS benchmark's smoke run (alignfs bricks vs ext4 bricks).
bench/gluster.py --quick --out "$work/bench-gluster" | sed -n '/^| workload/,/^$/p' || suites=1
# The mount benchmark's smoke run (tiny files, 1 s cells) so its harness cannot rot; its
# threads group is left out: the comparison below runs 1, 2 and 4 writers through the same
# fio helper.
bench/run.py --quick --verify --groups overwrite,reads,macro,rocksdb --out "$work/bench-mount" || suites=1
# Everyday work on the mount against ext4 (cp, tar, reading a tree, git, SQLite, rm), smoke
# run: small inputs, no C build (bench/everyday.py).
bench/everyday.py --quick --out "$work/bench-everyday" | sed -n '/^| task/,/^$/p' || suites=1
# The scrap profile's benchmarks, smoke runs: against ext4 through the mount, and its
# throughput on 1, 2 and 4 simulated SSDs.
bench/scrap.py --quick --out "$work/bench-scrap" | sed -n '/^| target/,/^$/p' || suites=1
target/release/alignfs-ssd-scaling --quick || suites=1
# The emulated memory-semantic SSD's log cleaning under sustained stores (docs/BYTE.md),
# one short cell so the instrument cannot rot.
target/release/alignfs-mssd-cleaning --logs 16 --threads 2 --seconds 1 | tail -1 || suites=1
# Recovery of a byte volume after a power cut with a full device write log (docs/BYTE.md),
# on a small device without the latency model, so the instrument cannot rot.
target/release/alignfs-mssd-recovery --log 8 --device 256 --data-set 64 --files 4 --no-latency | tail -1 || suites=1
# The uhs NBD benchmark's smoke run: uhs, UHS-NB and the NBD peers through fio, on the
# read cell (the comparison below runs its write cells).
bench/uhs.py --quick --cells randread | sed -n '/^| workload/,/^$/p' || suites=1
# The nvstore benchmark's smoke run: alignfs, Ceph BlueStore (installed if missing) and
# files on ext4, on loop devices, 1 s cells, on the filebench-like mix (the comparison
# below runs its appends and random writes).
/usr/bin/python3 bench/nvstore.py --quick --patterns fileserver | sed -n '/^| pattern/,/^$/p' || suites=1
# The S3 benchmark's smoke run: alignfs s3 and s3s-fs (cargo-installed if missing).
/usr/bin/python3 bench/s3.py --quick --jobs 2 --cells put2k,get,fileserver | sed -n '/^| cell/,/^$/p' || suites=1
# The TLS cost benchmark's smoke run: NBD (X.509, PSK) and S3 (HTTPS) against plaintext.
/usr/bin/python3 bench/tls.py --quick | grep '^|' || suites=1
# The byte profile's benchmark smoke run: host-to-device traffic and throughput of byte,
# its block-only baseline, ext4 on a loop device and ext4 on the same emulated device, on
# the workloads the comparison
# below does not run (it runs micro, varmail and RocksDB through this script).
bench/byte.py --quick --workloads fileserver,webserver --device-log 8M --flash-latency 0.5 --out "$work/bench-byte" | sed -n '/^| workload/,/^$/p' || suites=1
# Recovery after a power cut with a full device log, byte beside ext4 on the same emulated
# device (bench/byte-recovery.py), on a 512 MiB device: a few seconds.
bench/byte-recovery.py --quick --out "$work/bench-byte-recovery" | sed -n '/^| system/,/^$/p' || suites=1
# The five-profile comparison's smoke run: every group, 1 s cells, the report and the
# decision guide written (docs/COMPARE.md comes from a full run).
/usr/bin/python3 bench/compare.py --quick --out "$work/bench-compare" --doc "$work/COMPARE.md" \
    | sed -n '/^## Each paper/,/^Plots/p' || suites=1
grep -q "^| orch | files | 4KiB" "$work/COMPARE.md" || suites=1
stage "done"
exit "$suites"
