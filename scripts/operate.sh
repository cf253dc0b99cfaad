#!/usr/bin/env bash
# alignfs run as an operator runs it (docs/OPERATING.md): installed with
# scripts/install.sh (into a scratch prefix, and the /sbin mount helper), its systemd
# units verified and their commands run as systemd would (tests/service/units.py), mounted with
# `mount -t fuse.alignfs` and from an fstab line, unmounted with umount(8) and checked
# with fsck, a bad option refused with nothing mounted, and the metrics (`alignfs stat
# --prometheus` live and offline, and each daemon's --metrics endpoint) read by
# Prometheus's own parser (prometheus_client). Root and /dev/fuse; takes a few seconds.
# OPERATE_KEEP=1 keeps the scratch directory (and the helper link) of a run for a look.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

if ! /usr/bin/python3 -c "import prometheus_client" 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-prometheus-client >/dev/null
fi
work=$(mktemp -d /var/tmp/alignfs-operate.XXXXXX)
shm=$(mktemp -d /dev/shm/alignfs-operate.XXXXXX)
mnt=$work/mnt
helper=/sbin/mount.fuse.alignfs
cleanup() {
    mountpoint -q "$mnt" && umount "$mnt"
    # Only the link this run made goes; an installed alignfs's own stays.
    [[ -L $helper && $(readlink "$helper") == "$work/prefix/bin/alignfs" ]] && rm -f "$helper"
    rm -rf "$work" "$shm"
}
trap cleanup EXIT
[[ -n ${OPERATE_KEEP:-} ]] && trap - EXIT
[[ -e $helper && ! -L $helper ]] && { echo "operate: $helper exists and is not a link; not touching it" >&2; exit 1; }
[[ -L $helper ]] && { echo "operate: $helper already links to $(readlink "$helper"); not touching it" >&2; exit 1; }
PREFIX=$work/prefix SYSTEMD_DIR=$work/units ALIGNFS_ETC=$work/etc scripts/install.sh --no-build >/dev/null
bin=$work/prefix/bin/alignfs
mkdir -p "$mnt"

# The systemd units as installed: verified, and their commands run as systemd runs them
# (ready, watchdog, stop, kill -9 and restart).
/usr/bin/python3 tests/service/units.py "$work/units" "$work/etc" "$shm" "$work"
"$bin" mkfs --fast "$shm/fast:64M" --ssd "$work/ssd.img:512M" >/dev/null

# Prometheus's parser reads every family; the counters named are there and have moved.
# Further arguments name families that must be there too.
check_metrics() {
    /usr/bin/python3 - "$@" <<'EOF'
import sys
from prometheus_client.parser import text_string_to_metric_families
families = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
value = lambda family, suffix="": next(s.value for s in families[family].samples if s.name == family + suffix)
# The parser names a counter family without its _total.
for name in ("alignfs_app_write_bytes", "alignfs_ssd_write_bytes", "alignfs_journal_records"):
    assert families[name].type == "counter", name
assert value("alignfs_app_write_bytes", "_total") >= 1 << 20, "the megabyte written is counted"
assert families["alignfs_ssd_write_size_bytes"].type == "histogram"
assert value("alignfs_ssd_size_bytes") > 0 and value("alignfs_fast_tier_size_bytes") > 0
missing = [name for name in sys.argv[2:] if name not in families]
assert not missing, f"missing families: {missing}"
print(f"operate: {len(families)} metric families parsed")
EOF
}
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
scrape() { curl -sf --max-time 10 "http://$1/metrics"; }

# mount(8) with the helper, options as an fstab line would give them.
port=$(free_port)
mount -t fuse.alignfs "$work/ssd.img" "$mnt" -o "fast=$shm/fast,log=$work/mount.log,nofail,_netdev,noatime,defaults,metrics=127.0.0.1:$port" >/dev/null
mountpoint -q "$mnt"
head -c 1M /dev/urandom >"$work/data"
cp "$work/data" "$mnt/data"
pid=$(daemon_pid "$mnt")
"$bin" stat "$mnt" --prometheus >"$work/live.prom"
check_metrics "$work/live.prom" alignfs_daemon_uptime_seconds alignfs_requests alignfs_request_duration_seconds
# The daemon's own endpoint, scraped while a writer runs and after; each request kind
# has its histogram.
dd if=/dev/zero of="$mnt/busy" bs=4k count=2000 oflag=dsync status=none &
writer=$!
scrape "127.0.0.1:$port" >"$work/endpoint.prom"
wait "$writer"
scrape "127.0.0.1:$port" >"$work/endpoint.prom"
check_metrics "$work/endpoint.prom" alignfs_request_duration_seconds
grep -q '^alignfs_request_duration_seconds_count{.*kind="WRITE"} [1-9]' "$work/endpoint.prom"
umount "$mnt"
wait_gone "$pid" 30 || { echo "operate: the daemon did not exit after umount" >&2; exit 1; }
grep -q "volume closed cleanly" "$work/mount.log"
"$bin" fsck --fast "$shm/fast" --ssd "$work/ssd.img" | grep -q ': clean$'
"$bin" stat --fast "$shm/fast" --ssd "$work/ssd.img" --prometheus >"$work/offline.prom"
check_metrics "$work/offline.prom"

# From an fstab line (mount -T reads another fstab than /etc/fstab).
echo "$work/ssd.img $mnt fuse.alignfs fast=$shm/fast,log=$work/mount.log,nofail 0 0" >"$work/fstab"
mount -T "$work/fstab" "$mnt" >/dev/null
cmp "$work/data" "$mnt/data"
umount "$mnt"

# A bad option: refused, saying which, nothing mounted.
if mount -t fuse.alignfs "$work/ssd.img" "$mnt" -o "fast=$shm/fast,bogus" 2>"$work/err"; then
    echo "operate: an unknown mount option was accepted" >&2; exit 1
fi
grep -q 'unknown mount option "bogus"' "$work/err"
if mountpoint -q "$mnt"; then echo "operate: mounted despite a refused option" >&2; exit 1; fi
"$bin" fsck --fast "$shm/fast" --ssd "$work/ssd.img" | grep -q ': clean$'

# SIGHUP (a closed terminal) stops the network daemons cleanly, as SIGTERM does; their
# metrics endpoints answer while they run.
# With --metrics: the endpoint is scraped first, and must not keep the volume open.
hangup_closes() {
    local what=$1 out=$work/$1.out port
    shift
    port=$(free_port)
    "$@" --metrics "127.0.0.1:$port" >"$out" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do grep -q '^serving' "$out" && break; sleep 0.05; done
    if [[ $what == s3 ]]; then
        # A few anonymous requests, for the per-operation histograms.
        local s3=http://$(sed -n 's|.* on http://\([^ ]*\) .*|\1|p' "$out")
        curl -sf -X PUT "$s3/bucket" >/dev/null
        curl -sf -X PUT --data-binary @"$work/data" "$s3/bucket/key" >/dev/null
        curl -sf "$s3/bucket/key" | cmp - "$work/data"
        curl -s -o /dev/null "$s3/bucket/missing" || true
    fi
    scrape "127.0.0.1:$port" >"$work/$what.prom"
    /usr/bin/python3 -c "import sys; from prometheus_client.parser import text_string_to_metric_families as p; list(p(open(sys.argv[1]).read()))" "$work/$what.prom"
    grep -q '^alignfs_ssd_size_bytes{' "$work/$what.prom"
    kill -HUP "$pid"
    wait "$pid" || { echo "operate: $what exited with an error after SIGHUP:" >&2; cat "$out" >&2; exit 1; }
    grep -q 'closed cleanly' "$out" || { echo "operate: $what did not close cleanly on SIGHUP:" >&2; cat "$out" >&2; exit 1; }
}
"$bin" mkfs --profile uhs --fast "$shm/uhs:64M" --ssd "$work/uhs.img:256M" >/dev/null
hangup_closes nbd "$bin" nbd --fast "$shm/uhs" --ssd "$work/uhs.img" --no-tcp --socket "$work/nbd.sock"
grep -q '^alignfs_nbd_requests_total ' "$work/nbd.prom"
grep -q '^# TYPE alignfs_daemon_uptime_seconds gauge' "$work/nbd.prom"
"$bin" mkfs --profile nvstore --ssd "$work/nv.img:256M" >/dev/null
hangup_closes s3 "$bin" s3 --ssd "$work/nv.img" --anonymous --listen 127.0.0.1:0
for operation in CreateBucket PutObject GetObject; do
    grep -q "^alignfs_request_duration_seconds_count{.*kind=\"$operation\"} [1-9]" "$work/s3.prom" || { echo "operate: no $operation histogram" >&2; exit 1; }
done
grep -q '^alignfs_s3_client_errors_total 1$' "$work/s3.prom"
# The Grafana dashboard queries only series the three daemons export.
tests/service/dashboard.py deploy/grafana/alignfs.json "$work/endpoint.prom" "$work/nbd.prom" "$work/s3.prom"
echo "operate: mount -t fuse.alignfs, fstab, umount, fsck, metrics endpoints and SIGHUP: ok"
