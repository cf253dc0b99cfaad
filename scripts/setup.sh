#!/usr/bin/env bash
# Set up alignfs on a fresh Debian/Ubuntu machine and run the main job: install fuse3 if
# missing, build the release binary, turn on FUSE over io_uring where the kernel has it
# (root), and mount the default volume at /mnt/alignfs (its
# devices — a 1 GiB fast tier in /dev/shm/alignfs and an 8 GiB SSD image under
# $ALIGNFS_DATA_DIR, default /var/tmp/alignfs — are formatted on first use).
# Arguments are passed to `alignfs mount` (e.g. another mount point, -o allow_other).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: installing the Rust toolchain needs rustup (https://rustup.rs); cargo not found" >&2
    exit 1
fi
need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
if ((${#need[@]})) && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[[ -e /dev/fuse ]] || { echo "setup: /dev/fuse is missing (load the fuse module: modprobe fuse)" >&2; exit 1; }

cargo build --release --locked -p alignfs-cli
bin=$(pwd)/target/release/alignfs
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
# The mount serves requests through FUSE over io_uring when the kernel allows it.
enable_fuse_uring || echo "setup: FUSE over io_uring unavailable (Linux 6.14+ as root has it); requests go through /dev/fuse"
mountpoint=/mnt/alignfs
for arg in "$@"; do [[ $arg == /* ]] && mountpoint=$arg; done
if mountpoint -q "$mountpoint"; then
    echo "setup: $mountpoint is already mounted"
else
    "$bin" mount "$@"
fi
echo
"$bin" stat "$mountpoint" | sed -n 1,10p
cat <<EOT

Use $mountpoint like any directory. Then:
  $bin stat $mountpoint      live counters (bytes to the SSD vs the fast tier, ...)
  $bin umount $mountpoint    flush, checkpoint and unmount
  $bin bench                 in-process benchmark against a plain file and the device limit
EOT
