#!/usr/bin/env bash
# Set up alignfs on a fresh Debian/Ubuntu machine and run the main job: build the release
# binary, format the embedded default devices (a 1 GiB fast tier in /dev/shm/alignfs and
# an 8 GiB SSD image under $ALIGNFS_DATA_DIR, default /var/tmp/alignfs) unless they
# already hold a volume, and run the in-process benchmark against a plain file and the
# device limit.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: installing the Rust toolchain needs rustup (https://rustup.rs); cargo not found" >&2
    exit 1
fi
if ! command -v cc >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq build-essential >/dev/null
fi

cargo build --release --locked -p alignfs-cli
bin=target/release/alignfs
if ! "$bin" stat >/dev/null 2>&1; then
    echo "setup: formatting the default volume (writes the 8 GiB SSD image once; ~10 s)"
    "$bin" mkfs
fi
"$bin" stat | sed -n 1,8p
echo
echo "setup: running the benchmark (about 2 minutes; results also in target/bench.json)"
"$bin" bench --json target/bench.json "$@"
