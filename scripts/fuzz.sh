#!/usr/bin/env bash
# Coverage-guided fuzzing of every on-media parser (fuzz/fuzz_targets): superblock,
# checkpoint payload, journal record ops, journal replay, map entry / upage header, a
# block volume's layout attribute, what an NBD client sends, what an S3 client sends (HTTP
# parsing, SigV4 and the gateway's operations), nvstore's KV records, and
# the recovery of nvstore's KV journal (vendor/fjall's, with our sync markers), and the
# recovery of the emulated memory-semantic SSD (`byte`) from its device DRAM, and
# `byte`'s in-place metadata area (records, bitmap, header). Each must
# never panic, loop or disagree with its own encoder. Ends with "suite totals: ...".
#
# FUZZ_SECONDS per target (default 8; CI). Long run: FUZZ_SECONDS=3600 scripts/fuzz.sh
# Each target starts from the seeds crates/alignfs/examples/fuzz_seeds.rs writes (valid
# checkpoints, op lists, journals, map entries, layouts, KV records), plus what earlier
# runs here kept in fuzz/corpus/<target>/.
# Crashes land in fuzz/artifacts/<target>/; replay one with
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/<file>
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-8}
rustup toolchain list | grep '^nightly' >/dev/null || rustup toolchain install nightly --profile minimal >/dev/null || exit 1
command -v cargo-fuzz >/dev/null || cargo install --locked -q cargo-fuzz@0.13.2 || exit 1
targets=(superblock checkpoint journal_ops journal_replay map_entry block_layout nbd_messages nbd_connection s3_request kv_records kv_journal mssd_recovery lines_area)
build_log=$(mktemp)
cargo +nightly fuzz build -O >"$build_log" 2>&1 || { tail -30 "$build_log"; exit 1; }
rm -f "$build_log"
# Seeds from the engine's own encoders (crates/alignfs/examples/fuzz_seeds.rs), made fresh
# so they follow the format: a target starts from inputs that decode and mutates those.
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
build_log=$(mktemp)
cargo build -q --locked -p alignfs --example fuzz_seeds >"$build_log" 2>&1 || { tail -30 "$build_log"; exit 1; }
target/debug/examples/fuzz_seeds "$seeds" || exit 1
# Whole NBD conversations for nbd_connection, from the protocol's own encoder.
cargo run -q --locked -p alignfs-nbd --example fuzz_seeds -- "$seeds" >"$build_log" 2>&1 || { tail -30 "$build_log"; exit 1; }
# S3 requests signed now by botocore (SigV4 allows 15 minutes of skew) for s3_request.
/usr/bin/python3 -c 'import botocore' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-boto3 >/dev/null; } || exit 1
/usr/bin/python3 tests/s3/fuzz_seeds.py "$seeds" || exit 1
rm -f "$build_log"
passed=0
failed=0
for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target"
    # The first directory takes what the run finds; the seeds are only read.
    corpora=("fuzz/corpus/$target")
    [[ -d $seeds/$target ]] && corpora+=("$seeds/$target")
    log=$(mktemp)
    if cargo +nightly fuzz run -O "$target" "${corpora[@]}" -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 >"$log" 2>&1; then
        passed=$((passed + 1))
        echo "fuzz $target: ok ($(grep -o 'Done [0-9]* runs' "$log" | tail -1), ${seconds} s)"
    else
        failed=$((failed + 1))
        echo "fuzz $target: FAILED"
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -10
    fi
    rm -f "$log"
done
echo "suite totals: $passed passed, $failed failed"
((failed == 0))
