#!/usr/bin/env bash
# The uhs profile served over NBD, tested by clients nobody here wrote: nbdinfo,
# qemu-img convert/compare, qemu-io patterns, nbdcopy, fio's nbd engine with crc32c
# verify, ext4 on the volume through nbdfuse and a loop device (fsx, fio verify,
# e2fsck), a read-only export, TLS with X.509 and pre-shared keys (and the clients it
# must refuse), and a kill -9 loop in which every acknowledged write must survive and
# fsck stay clean. Needs root (loop devices, mount) and /dev/fuse.
#
# Ends with "nbd totals: N passed, N failed". Environment: KEEP=1 keeps the work
# directory; NBD_KILL_ROUNDS (default 4) sets the kill -9 rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export DEBIAN_FRONTEND=noninteractive

packages=(libnbd-bin qemu-utils nbdkit fio fuse3 e2fsprogs python3)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null || { echo "apt-get install failed" >&2; exit 1; }
fi
command -v fsx >/dev/null || cargo install --locked -q fsx@0.3.2 || exit 1
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -q --workspace || exit 1
bin=$repo/target/release/alignfs
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

work=$(mktemp -d /var/tmp/alignfs-nbd.XXXXXX)
shm=$(mktemp -d /dev/shm/alignfs-nbd.XXXXXX)
port=$((20000 + RANDOM % 20000))
uri=nbd://127.0.0.1:$port/alignfs
devices=(--fast "$shm/nvm" --ssd "$work/ssd.img")
server=""
loopdev=""
cleanup() {
    mountpoint -q "$work/ext4" && umount "$work/ext4"
    [[ -n $loopdev ]] && losetup -d "$loopdev" 2>/dev/null
    mountpoint -q "$work/fuse" && fusermount3 -u "$work/fuse"
    [[ -n $server ]] && kill -9 "$server" 2>/dev/null
    [[ ${KEEP:-0} == 1 ]] && echo "kept $work and $shm" || rm -rf "$work" "$shm"
}
trap cleanup EXIT

start_server() {
    "$bin" nbd "${devices[@]}" --listen "127.0.0.1:$port" --socket "$work/nbd.sock" "$@" >>"$work/server.out" 2>>"$work/server.log" &
    server=$!
    for _ in $(seq 100); do
        nbdinfo --size "${probe_uri:-$uri}" >/dev/null 2>&1 && return 0
        kill -0 "$server" 2>/dev/null || break
        sleep 0.1
    done
    echo "the NBD server did not come up:" >&2
    tail -5 "$work/server.out" "$work/server.log" >&2
    return 1
}
stop_server() {
    kill -INT "$server" && wait "$server" && server="" && tail -1 "$work/server.out" | grep "closed cleanly" >/dev/null
}

passed=0
failed=0

# A 1 GiB volume whose first 64 MiB (ext4's packed metadata and journal, below) live in
# the NVM zone; a 128 MiB NVM device leaves the rest to metadata and the buffer.
"$bin" mkfs --profile uhs --fast "$shm/nvm:128M" --ssd "$work/ssd.img:1200M" --size 1G --nvm-range 0-64M >"$work/mkfs.out" || { cat "$work/mkfs.out"; exit 1; }
metrics=127.0.0.1:$((port + 1))
start_server --metrics "$metrics" || exit 1

nbdinfo_checks() {
    nbdinfo "$uri" | grep "export-size: 1073741824" >/dev/null &&
        nbdinfo "nbd+unix:///alignfs?socket=$work/nbd.sock" | grep "block_size_minimum: 512" >/dev/null &&
        nbdinfo --list "nbd://127.0.0.1:$port" | grep 'export="alignfs"' >/dev/null
}
check "nbdinfo (TCP, Unix socket, list)" nbdinfo_checks

head -c 48M /dev/urandom >"$work/src.raw"
check "qemu-img convert + compare" bash -c "qemu-img convert -n -f raw -O raw '$work/src.raw' '$uri' && qemu-img compare -q -f raw -F raw '$work/src.raw' '$uri'"

qemu_io_patterns() {
    local out
    out=$(qemu-io -f raw \
        -c "write -P 0xab 700M 64k" -c "read -P 0xab 700M 64k" \
        -c "write -P 0x5c 700M 512" -c "read -P 0x5c 700M 512" -c "read -P 0xab 734003712 63k" \
        -c "write -z 701M 8k" -c "read -P 0 701M 8k" \
        -c "discard 702M 1M" -c "read -P 0 702M 1M" \
        -c "aio_write -P 0x11 4k 4k" -c "aio_write -P 0x22 1073737728 4k" -c "aio_flush" \
        -c "read -P 0x11 4k 4k" -c "read -P 0x22 1073737728 4k" \
        -c "write -f 1M 4k" "$uri" 2>&1)
    echo "$out" | grep -iE "fail|error|mismatch" && return 1
    return 0
}
check "qemu-io patterns" qemu_io_patterns
check "qemu-io: a write past the end is refused" bash -c "! qemu-io -f raw -c 'write 1G 4k' '$uri' 2>/dev/null | grep '^wrote' >/dev/null"

# The clients above read, wrote, zeroed, trimmed and flushed: each command has its
# service-time histogram on the server's metrics endpoint.
command_histograms() {
    local text
    text=$(curl -sf --max-time 10 "http://$metrics/metrics") || return 1
    for kind in READ WRITE FLUSH TRIM WRITE_ZEROES; do
        grep -q "^alignfs_request_duration_seconds_count{.*kind=\"$kind\"} [1-9]" <<<"$text" || { echo "no $kind histogram" >&2; return 1; }
    done
}
check "metrics: a service-time histogram per NBD command" command_histograms

check "nbdcopy round trip" bash -c "nbdcopy '$work/src.raw' '$uri' && nbdcopy '$uri' - | head -c 48M | cmp -s - '$work/src.raw'"

fio_verify() {
    fio --name=nbd-verify --ioengine=nbd --uri="$uri" --rw=randwrite --bsrange=512-256k --bs_unaligned=0 \
        --blockalign=512 --offset=256M --size=128M --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --output="$work/fio-nbd.out" && grep -q "err= 0" "$work/fio-nbd.out"
}
check "fio nbd engine, mixed sizes, iodepth 8, crc32c verify" fio_verify

# ext4 on the volume: nbdfuse exposes the export as a file, a loop device makes it a disk.
ext4_on_volume() {
    mkdir -p "$work/fuse" "$work/ext4"
    nbdfuse "$work/fuse/nbd" "$uri" &
    for _ in $(seq 50); do [[ -e $work/fuse/nbd ]] && break; sleep 0.1; done
    loopdev=$(losetup -f --show "$work/fuse/nbd") || return 1
    mkfs.ext4 -q -F -E packed_meta_blocks=1,lazy_itable_init=0,lazy_journal_init=0 "$loopdev" || return 1
    # The static range must hold what packed_meta_blocks put at the front.
    local journal_end
    journal_end=$(debugfs -R "stat <8>" "$loopdev" 2>/dev/null | grep -oE '[0-9]+-[0-9]+' | tail -1 | cut -d- -f2)
    echo "ext4 metadata and journal end at block $journal_end (the NVM range holds 16384)"
    ((journal_end < 16384)) || return 1
    mount "$loopdev" "$work/ext4" || return 1
    fsx -N 10000 "$work/ext4/fsx.dat" >"$work/fsx.out" 2>&1 || { tail -5 "$work/fsx.out"; return 1; }
    fio --name=ext4-verify --directory="$work/ext4" --rw=randwrite --bs=4k --size=64M --ioengine=psync --fsync=32 \
        --verify=crc32c --verify_fatal=1 --do_verify=1 --output="$work/fio-ext4.out" || return 1
    grep -q "err= 0" "$work/fio-ext4.out" || return 1
    umount "$work/ext4" && e2fsck -fn "$loopdev" >"$work/e2fsck.out" 2>&1 || { cat "$work/e2fsck.out"; return 1; }
    losetup -d "$loopdev" && loopdev=""
    fusermount3 -u "$work/fuse"
}
check "ext4 on the volume (nbdfuse + loop): mkfs, fsx, fio verify, e2fsck -fn" ext4_on_volume

clean_stop() { stop_server && "$bin" fsck "${devices[@]}" | grep ': clean$' >/dev/null; }
check "clean stop (SIGINT) and fsck" clean_stop

start_server --read-only --export alignfs || exit 1
check "read-only export refuses writes" bash -c "! qemu-io -f raw -c 'write 0 4k' '$uri' 2>/dev/null | grep '^wrote' >/dev/null && qemu-io -r -f raw -c 'read -P 0x11 4k 4k' '$uri' | grep '^read' >/dev/null"
kill -INT "$server"; wait "$server"; server=""

# TLS (NBD_OPT_STARTTLS) with X.509 and with pre-shared keys, through nbdinfo, nbdcopy,
# qemu-img and qemu-io; clients with the wrong CA or key, and plaintext clients, refused.
tls=$work/tls
scripts/tls-credentials.sh "$tls" && scripts/tls-credentials.sh "$work/other" || exit 1
x509="tls-certificates=$tls/client"
qemu_tls() { # CREDS-OBJECT QEMU-COMMAND...: run a qemu tool against the export over TLS
    local creds=$1
    shift
    "$@" --object "$creds,id=tls0,endpoint=client" --image-opts "driver=nbd,host=127.0.0.1,port=$port,export=alignfs,tls-creds=tls0"
}
# A client refused for the reason given (a grep pattern of its output), not for another.
refused() {
    local why=$1
    shift
    ! "$@" >"$work/refused.out" 2>&1 && grep -E "$why" "$work/refused.out" >/dev/null
}
tls_x509() {
    nbdinfo "nbds://localhost:$port/alignfs?$x509" | grep 'with TLS' >/dev/null &&
        nbdcopy "$work/src.raw" "nbds://localhost:$port/alignfs?$x509" &&
        cmp -s -n $((48 << 20)) <(nbdcopy "nbds://localhost:$port/alignfs?$x509" -) "$work/src.raw" &&
        qemu_tls "tls-creds-x509,dir=$tls/client" qemu-io -c 'write -P 0x5a 1M 64k' -c 'read -P 0x5a 1M 64k' | grep '^read' >/dev/null &&
        refused 'certificate verification' nbdinfo "nbds://localhost:$port/alignfs?tls-certificates=$work/other/client" &&
        refused 'known issuer' qemu_tls "tls-creds-x509,dir=$work/other/client" qemu-img info &&
        refused 'nbd_opt_go' nbdinfo "$uri" && refused 'requires TLS' qemu-img info "$uri"
}
probe_uri="nbds://localhost:$port/alignfs?$x509" start_server --tls-certificates "$tls" || exit 1
check "TLS X.509: nbdinfo, nbdcopy and qemu-io over TLS; another CA and plaintext refused" tls_x509
stop_server || exit 1
# Under TLS 1.3 the client's handshake is over before the server checks its certificate,
# so the refusal reaches the client as the server's alert or, 7 times in 30 here, as the
# closed connection its next write finds; the server's log names the reason.
tls_peer() {
    nbdinfo --size "nbds://localhost:$port/alignfs?$x509" >/dev/null &&
        mkdir -p "$work/anonymous" && cp "$tls/ca-cert.pem" "$work/anonymous/" &&
        refused 'TLS fatal alert|gnutls_record_send: Error in the push function' \
            nbdinfo "nbds://localhost:$port/alignfs?tls-certificates=$work/anonymous" &&
        grep 'peer did not return a certificate' "$work/server.log" >/dev/null
}
probe_uri="nbds://localhost:$port/alignfs?$x509" start_server --tls-certificates "$tls" --tls-verify-peer || exit 1
check "TLS X.509 --tls-verify-peer: a client without a certificate is refused" tls_peer
stop_server || exit 1
psk_uri="nbds://alice@localhost:$port/alignfs?tls-psk-file=$tls/keys.psk"
tls_psk() {
    mkdir -p "$work/psk-right" "$work/psk-wrong" && cp "$tls/keys.psk" "$work/psk-right/" && cp "$work/other/keys.psk" "$work/psk-wrong/" &&
        nbdcopy "$work/src.raw" "$psk_uri" && cmp -s -n $((48 << 20)) <(nbdcopy "$psk_uri" -) "$work/src.raw" &&
        qemu_tls "tls-creds-psk,dir=$work/psk-right,username=alice" qemu-img info | grep 'virtual size' >/dev/null &&
        refused 'TLS fatal alert' nbdinfo "nbds://alice@localhost:$port/alignfs?tls-psk-file=$work/other/keys.psk" &&
        refused 'TLS handshake failed' qemu_tls "tls-creds-psk,dir=$work/psk-wrong,username=alice" qemu-img info &&
        refused 'nbd_opt_go' nbdinfo "$uri"
}
probe_uri=$psk_uri start_server --tls-psk "$tls/keys.psk" || exit 1
check "TLS-PSK: nbdcopy and qemu-img with the key; a wrong key and plaintext refused" tls_psk
check "after the TLS clients: clean stop and fsck" clean_stop
beyond_loopback() {
    refused 'TLS is off.*--insecure-listen' timeout 20 "$bin" nbd "${devices[@]}" --listen "0.0.0.0:$port" &&
        refused 'plaintext clients' timeout 20 "$bin" nbd "${devices[@]}" --listen "0.0.0.0:$port" --tls on --tls-psk "$tls/keys.psk" &&
        refused 'need credentials' timeout 20 "$bin" nbd "${devices[@]}" --tls require
}
check "listening beyond loopback without required TLS is refused, with how to allow it" beyond_loopback

# kill -9 during writes, restart, check every acknowledged write, repeat.
kill_loop() {
    local rounds=${NBD_KILL_ROUNDS:-4} log=$work/acked.log
    : >"$log"
    for round in $(seq "$rounds"); do
        start_server || return 1
        tests/nbd/acked_writes.py write 127.0.0.1 "$port" "$log" "$round" 30 &
        local client=$!
        sleep $((2 + RANDOM % 3))
        kill -9 "$server"
        wait "$server" 2>/dev/null
        server=""
        wait "$client"
        "$bin" fsck "${devices[@]}" >"$work/fsck.out" || { cat "$work/fsck.out"; return 1; }
        start_server || return 1
        tests/nbd/acked_writes.py check 127.0.0.1 "$port" "$log" || return 1
        kill -INT "$server"
        wait "$server"
        server=""
    done
    echo "$(grep -c '^A ' "$log") acknowledged writes over $rounds kills"
}
check "kill -9 during writes: every acknowledged write survives, fsck clean" kill_loop

echo "nbd totals: $passed passed, $failed failed"
((failed == 0))
