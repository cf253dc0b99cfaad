#!/usr/bin/env bash
# The nvstore object store served over S3 (`alignfs s3`), tested by clients nobody here
# wrote: boto3, awscli, s3cmd and rclone, the errors and limits S3 defines, and a kill -9
# loop with PUTs and multipart uploads in flight (tests/s3/run.py, docs/S3.md).
#
# Ends with "suite totals: N passed, N failed". Environment: KEEP=1 keeps the work
# directory; S3_KILL_ROUNDS (default 3) sets the kill -9 rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

packages=(python3-boto3 awscli s3cmd rclone)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null || { echo "apt-get install failed" >&2; exit 1; }
fi
cargo build --release --locked -q --workspace || exit 1
work=$(mktemp -d /var/tmp/alignfs-s3.XXXXXX)
# The Debian clients run on the system Python, whatever python3 comes first in PATH.
export PATH="/usr/bin:$PATH"
/usr/bin/python3 tests/s3/run.py target/release/alignfs "$work" --kill-rounds "${S3_KILL_ROUNDS:-3}"
status=$?
if ((status)); then
    # The gateway's own account of the failure (errors it answered, and why).
    for log in "$work"/*/s3.log; do echo "== $log (last 40 lines)"; tail -n 40 "$log"; done
fi
pkill -f "alignfs s3 --ssd $work" 2>/dev/null
[[ ${KEEP:-0} == 1 ]] && echo "kept $work" || rm -rf "$work"
exit $status
