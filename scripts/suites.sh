#!/usr/bin/env bash
# Suites nobody here wrote, run against a real alignfs mount: pjdfstest (and the host's
# ext4 for comparison), fsx, fio verify, stress-ng, dbench, real applications (tar, git,
# SQLite, RocksDB) and mount/unmount cycles that must keep every byte.
#
# Needs root and /dev/fuse. Installs its tools itself. Ends with one line
# "suite totals: N passed, N failed" (pjdfstest counts its individual tests).
#
# Environment: SUITES_QUICK=1 shortens the long runs (for iterating locally);
# FSX_OPS (default 20000) sets operations per fsx seed; KEEP=1 keeps the work directory.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

export DEBIAN_FRONTEND=noninteractive
quick=${SUITES_QUICK:-0}
fsx_ops=${FSX_OPS:-20000}

# --- tools -------------------------------------------------------------------------------
packages=(fuse3 fio stress-ng dbench rocksdb-tools sqlite3 libacl1-dev acl attr git pkg-config)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null || { echo "apt-get install failed" >&2; exit 1; }
fi
command -v pjdfstest >/dev/null || cargo install --locked -q pjdfstest@0.2.2 || exit 1
command -v fsx >/dev/null || cargo install --locked -q fsx@0.3.2 || exit 1
export PATH="$HOME/.cargo/bin:$PATH"
id tests >/dev/null 2>&1 || echo 'tests:x:::pjdfstest dummy user:/:/usr/sbin/nologin' | newusers
cargo build --release --locked -q --workspace || exit 1
bin=$repo/target/release/alignfs
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

# --- volumes -----------------------------------------------------------------------------
work=$(mktemp -d /var/tmp/alignfs-suites.XXXXXX)
shm=$(mktemp -d /dev/shm/alignfs-suites.XXXXXX)
chmod 0755 "$work" "$shm" # pjdfstest's other users must reach the mount points
mnt=$work/mnt
tiny=$work/tiny
scrap=$work/scrap
byte=$work/byte
cleanup() {
    # A failed export-device check may leave ext4, its loop device and the exporter behind.
    mountpoint -q "$work/exported-ext4" && umount -l "$work/exported-ext4"
    [[ -e $work/exported/disk ]] && losetup -j "$work/exported/disk" | cut -d: -f1 | xargs -r -n1 losetup -d
    [[ -n ${export_pid:-} ]] && kill "$export_pid" 2>/dev/null
    for m in "$mnt" "$tiny" "$scrap" "$byte"; do mountpoint -q "$m" && { "$bin" umount "$m" >/dev/null 2>&1 || umount -l "$m"; }; done
    [[ ${KEEP:-0} == 1 ]] && echo "kept $work and $shm" || rm -rf "$work" "$shm"
}
trap cleanup EXIT

# Both transports run the suites: the main mount requires io_uring where the kernel has
# it; the tiny and scrap mounts use /dev/fuse.
main_transport=io-uring
enable_fuse_uring || { main_transport=dev-fuse; echo "FUSE over io_uring unavailable: every mount uses /dev/fuse"; }
main_devices=(--fast "$shm/fast" --ssd "$work/ssd.img" --transport "$main_transport")
tiny_devices=(--fast "$shm/tiny-fast" --ssd "$work/tiny-ssd.img")
"$bin" mkfs --fast "$shm/fast:512M" --ssd "$work/ssd.img:6G" >/dev/null || exit 1
# A fast tier of 2 MiB keeps migration and the fast-tier-full path running all the time.
"$bin" mkfs --fast "$shm/tiny-fast:2M" --ssd "$work/tiny-ssd.img:512M" >/dev/null || exit 1
mount_main() { "$bin" mount "${main_devices[@]}" --log "$work/mount.log" -o allow_other "$mnt"; }
# The tiny volume stays on /dev/fuse with no page cache, so that mode runs the suites too.
mount_tiny() { "$bin" mount "${tiny_devices[@]}" --log "$work/tiny.log" --cache direct --transport dev-fuse -o allow_other "$tiny"; }
mount_main || { cat "$work/mount.log"; exit 1; }

passed=0
failed=0
# With the module parameter off, `--transport io-uring` refuses to mount and leaves nothing
# mounted, and `auto` falls back to /dev/fuse and tells the user how to turn it on.
uring_off() {
    [[ -e $fuse_uring_param ]] || { echo "no io_uring in this kernel: nothing to check"; return 0; }
    local was status=0
    was=$(cat "$fuse_uring_param")
    echo N >"$fuse_uring_param" || return 1
    if "$bin" mount "${tiny_devices[@]}" --transport io-uring --log "$work/tiny.log" "$tiny" 2>"$work/err"; then
        echo "mounted without io_uring"; status=1
    fi
    grep -q "FUSE over io_uring was required, but the transport is /dev/fuse; io_uring not enabled" "$work/err" || { cat "$work/err"; status=1; }
    mountpoint -q "$tiny" && { echo "the refused mount left a mount behind"; "$bin" umount "$tiny"; status=1; }
    "$bin" mount "${tiny_devices[@]}" --log "$work/tiny.log" "$tiny" >"$work/out" || status=1
    grep -q "requests go through /dev/fuse: this kernel has FUSE over io_uring, but $fuse_uring_param is N" "$work/out" ||
        { echo "the fallback was not reported:"; cat "$work/out"; status=1; }
    "$bin" stat "$tiny" | grep "transport: /dev/fuse; io_uring not enabled" || status=1
    "$bin" umount "$tiny" >/dev/null || status=1
    echo "$was" >"$fuse_uring_param"
    return $status
}
check "io_uring off: --transport io-uring refuses to mount, auto falls back and says why" uring_off
mount_tiny || exit 1

# --- pjdfstest ---------------------------------------------------------------------------
# Failures must be listed in tests/suites/pjdfstest-expected-failures.txt with a reason;
# anything else that fails counts against us, one per test.
pjdfstest_on() {
    local dir=$1 secondary=$2 out=$3
    mkdir -p "$dir" "$secondary"
    chmod 0777 "$dir"
    (cd "$dir" && pjdfstest -c "$repo/tests/suites/pjdfstest.toml" -p "$dir" -s "$secondary" >"$out" 2>&1)
    grep '^Summary:' "$out" || echo "Summary: missing (see $out)"
}
echo "== pjdfstest (alignfs)"
pjdfstest_on "$mnt/pjdfstest" "$shm/pjd-secondary" "$work/pjdfstest.out"
expected=$(grep -v '^#' tests/suites/pjdfstest-expected-failures.txt | awk 'NF { print $1 }' | sort -u)
actual=$(awk '$NF == "FAILED" { print $1 }' "$work/pjdfstest.out" | sort -u)
unexpected=$(comm -13 <(echo "$expected") <(echo "$actual") | grep -c . || true)
fixed=$(comm -23 <(echo "$expected") <(echo "$actual") | grep . || true)
pjd_passed=$(sed -n 's/^Summary: .* \([0-9]*\) passed.*/\1/p' "$work/pjdfstest.out")
passed=$((passed + ${pjd_passed:-0}))
failed=$((failed + unexpected))
if [[ -z $pjd_passed ]]; then failed=$((failed + 1)); fi
if ((unexpected)); then
    echo "unexpected pjdfstest failures:"
    comm -13 <(echo "$expected") <(echo "$actual")
    grep -A4 FAILED "$work/pjdfstest.out" | head -60
fi
[[ -n $fixed ]] && echo "listed as expected but passing now (drop them from the list): $fixed"
echo "== pjdfstest (host ext4, the baseline; not counted)"
pjdfstest_on "$work/pjdfstest-ext4" "$shm/pjd-secondary-ext4" "$work/pjdfstest-ext4.out"

# --- fsx ---------------------------------------------------------------------------------
run_fsx() {
    local file=$1 seed=$2
    mkdir -p "$work/fsx"
    fsx -q -f "$repo/tests/suites/fsx.toml" -N "$fsx_ops" -S "$seed" -P "$work/fsx" "$file" >"$work/fsx-$seed.out" 2>&1 \
        && grep -q "All operations completed A-OK" "$work/fsx-$seed.out" \
        || { tail -40 "$work/fsx-$seed.out"; return 1; }
}
# fsx reads, writes and maps through one read-write open; a second reader streaming the same
# file through a read-only open keeps the page cache full of it (`--cache reads`).
run_fsx_with_reader() {
    local file=$1 seed=$2
    run_fsx "$file" "$seed" &
    local fsx_pid=$!
    while kill -0 "$fsx_pid" 2>/dev/null; do cat "$file" >/dev/null 2>&1; done
    wait "$fsx_pid"
}
check "fsx seed 1 ($fsx_ops ops, $main_transport)" run_fsx "$mnt/fsx-1" 1
check "fsx seed 2 ($fsx_ops ops, a cached reader of the same file, $main_transport)" run_fsx_with_reader "$mnt/fsx-2" 2
check "fsx seed 3 ($fsx_ops ops, 2 MiB fast tier, --cache direct, dev-fuse)" run_fsx "$tiny/fsx-3" 3
rm -f "$tiny/fsx-3"

# --- page cache coherence: cached reads, direct writes and mappings of one file -----------
coherence() { "$repo/target/release/alignfs-coherence" --seed "$2" "$1" >"$work/coherence-$2.out" 2>&1 || { tail -5 "$work/coherence-$2.out"; return 1; }; }
check "page cache coherence (--cache reads, $main_transport)" coherence "$mnt/coherence" 1
check "page cache coherence (--cache direct)" coherence "$tiny/coherence" 2

# --- transports --------------------------------------------------------------------------
# Each mount's requests went where its --transport says: counted by the daemon per transport.
served() { "$bin" stat "$1" --json | python3 -c 'import json, sys; d = json.load(sys.stdin)["daemon"]; print(d["io_uring_requests"], d["dev_fuse_requests"], d["transport"])'; }
transports() {
    local ring dev what
    read -r ring dev what < <(served "$mnt") || return 1
    echo "main: $what; $ring requests through io_uring, $dev through /dev/fuse"
    if [[ $main_transport == io-uring ]]; then
        ((ring > 1000 && dev < ring / 100)) || return 1
    fi
    read -r ring dev what < <(served "$tiny") || return 1
    echo "tiny: $what; $ring requests through io_uring, $dev through /dev/fuse"
    ((ring == 0 && dev > 1000))
}
check "requests travel by each mount's transport" transports
# Over io_uring each request thread runs only on its queue's CPU (--ring-threads pinned).
ring_threads_pinned() {
    [[ $main_transport == io-uring ]] || { echo "main mount on /dev/fuse: no ring threads"; return 0; }
    local pid task name cpus threads=0
    pid=$("$bin" stat "$mnt" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["daemon"]["pid"])') || return 1
    "$bin" stat "$mnt" | grep "threads on their queue's CPU;" || return 1
    for task in /proc/"$pid"/task/*; do
        name=$(<"$task/comm")
        [[ $name == fuser-ring-* ]] || continue
        cpus=$(awk '/^Cpus_allowed_list:/ { print $2 }' "$task/status")
        echo "$name runs on CPU $cpus"
        [[ $cpus == "$(sed 's/^fuser-ring-\([0-9]*\)\..*/\1/' <<<"$name")" ]] || return 1
        threads=$((threads + 1))
    done
    ((threads > 0))
}
check "io_uring request threads run on their queue's CPU" ring_threads_pinned
# `alignfs stat` breaks the requests down by kind; the kinds add up to the transports' totals.
by_kind() {
    "$bin" stat "$mnt" | grep '^  requests:' || return 1
    "$bin" stat "$mnt" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)["daemon"]
kinds = dict(d["requests_by_kind"])
total = d["io_uring_requests"] + d["dev_fuse_requests"]
print("by kind", sum(kinds.values()), "in all", total)
sys.exit(not ({"LOOKUP", "CREATE", "WRITE", "READ", "GETXATTR"} <= kinds.keys() and abs(sum(kinds.values()) - total) <= 2))'
}
check "requests by kind add up to the requests served" by_kind

# --- set-ID bits -------------------------------------------------------------------------
# A write by a user without CAP_FSETID drops set-user-ID, and set-group-ID where group
# execute is set or the writer is not in the file's group, as on ext4; a write by root
# keeps them. The kernel leaves this to the daemon for the writes it sends past the page
# cache.
mode_after_write() { # file, user → octal mode after that user appends to the file
    su "$2" -s /bin/sh -c "echo x >>'$1'" || return 1
    stat -c %a "$1"
}
set_id_bits() {
    local f=$1/setid mode
    : >"$f" || return 1
    chmod 6777 "$f" && mode=$(mode_after_write "$f" root) || return 1
    [[ $mode == 6777 ]] || { echo "after root's write: $mode"; return 1; }
    mode=$(mode_after_write "$f" tests) || return 1
    [[ $mode == 777 ]] || { echo "after an unprivileged write: $mode, not 777"; return 1; }
    # Without group execute, set-group-ID marks mandatory locking: a member of the
    # file's group keeps it, anyone else drops it.
    chmod 6767 "$f" && mode=$(mode_after_write "$f" tests) || return 1
    [[ $mode == 767 ]] || { echo "after a write by a non-member: $mode, not 767"; return 1; }
    chgrp tests "$f" && chmod 6767 "$f" && mode=$(mode_after_write "$f" tests) || return 1
    [[ $mode == 2767 ]] || { echo "after a write by a member: $mode, not 2767"; return 1; }
    rm -f "$f"
}
# Truncation by a user without CAP_FSETID (ftruncate or an O_TRUNC open) and chown drop
# them too, and root's chown keeps set-group-ID without group execute, as on ext4. The
# kernel leaves all of these to the daemon (FUSE_HANDLE_KILLPRIV_V2).
set_id_bits_setattr() {
    local f=$1/setid-attr mode
    : >"$f" || return 1
    chmod 6777 "$f" && truncate -s 10 "$f" && mode=$(stat -c %a "$f") || return 1
    [[ $mode == 6777 ]] || { echo "after root's truncate: $mode, not 6777"; return 1; }
    su tests -s /bin/sh -c "truncate -s 5 '$f'" && mode=$(stat -c %a "$f") || return 1
    [[ $mode == 777 ]] || { echo "after an unprivileged truncate: $mode, not 777"; return 1; }
    chmod 6777 "$f" && su tests -s /bin/sh -c ": >'$f'" && mode=$(stat -c %a "$f") || return 1
    [[ $mode == 777 ]] || { echo "after an unprivileged O_TRUNC open: $mode, not 777"; return 1; }
    chmod 6777 "$f" && chown tests "$f" && mode=$(stat -c %a "$f") || return 1
    [[ $mode == 777 ]] || { echo "after root's chown: $mode, not 777"; return 1; }
    chmod 6767 "$f" && chown root "$f" && mode=$(stat -c %a "$f") || return 1
    [[ $mode == 2767 ]] || { echo "after root's chown without group execute: $mode, not 2767"; return 1; }
    rm -f "$f"
}
set_id_bits_all() { set_id_bits "$1" && set_id_bits_setattr "$1"; }
check "writes, truncates and chowns drop set-ID bits as on ext4 ($main_transport)" set_id_bits_all "$mnt"
check "writes, truncates and chowns drop set-ID bits as on ext4 (dev-fuse, --cache direct)" set_id_bits_all "$tiny"
# Under --cache all the writes go through the page cache, where the kernel leaves it to
# the daemon as well.
cache_all_set_id_bits() {
    "$bin" umount "$tiny" >/dev/null || return 1
    "$bin" mount "${tiny_devices[@]}" --log "$work/tiny.log" --cache all -o allow_other "$tiny" || return 1
    local status=0
    set_id_bits_all "$tiny" || status=1
    "$bin" umount "$tiny" >/dev/null || status=1
    mount_tiny || exit 1
    return $status
}
check "writes, truncates and chowns drop set-ID bits (--cache all)" cache_all_set_id_bits

# --- fio verify --------------------------------------------------------------------------
run_fio() {
    local dir=$1 size=$2
    mkdir -p "$dir"
    DIR=$dir SIZE=$size fio "$repo/tests/suites/fio-verify.fio" --output="$work/fio.out" \
        --aux-path="$work" \
        && ! grep -q 'verify: bad\|err= *[1-9]' "$work/fio.out" \
        || { grep -i 'err\|bad' "$work/fio.out" | head -20; return 1; }
}
check "fio verify (crc32c buffered + direct, 1 B pattern)" run_fio "$mnt/fio" 256m
# The tiny volume's 128 KiB checkpoint slots map about 100 MiB of data in all.
check "fio verify on the 2 MiB fast tier" run_fio "$tiny/fio" 8m
rm -rf "$mnt/fio" "$tiny/fio"

# --- large requests ----------------------------------------------------------------------
# The mount, run as root, raised fs.fuse.max_pages_limit before mounting: a 4 MiB direct
# write reaches the engine as one write call, not four.
app_writes() { "$bin" stat "$mnt" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["counters"]["app_writes"])'; }
one_request() {
    local limit before after
    limit=$(cat /proc/sys/fs/fuse/max_pages_limit)
    ((limit >= 2048)) || { echo "fs.fuse.max_pages_limit is $limit"; return 1; }
    before=$(app_writes) || return 1
    dd if=/dev/urandom of="$mnt/one-request" bs=4M count=1 oflag=direct status=none || return 1
    after=$(app_writes) || return 1
    rm -f "$mnt/one-request"
    ((after - before == 1)) || { echo "a 4 MiB write arrived as $((after - before)) write calls"; return 1; }
}
check "a 4 MiB direct write arrives whole (max_pages_limit raised by the mount)" one_request
# Files advertise a 1 MiB preferred IO size, so cp hands the engine 1 MiB writes, not
# 128 KiB ones each made durable on its own.
cp_in_large_pieces() {
    local before after
    head -c 8M /dev/urandom >"$work/cp-src" || return 1
    before=$(app_writes) || return 1
    cp "$work/cp-src" "$mnt/cp-dst" || return 1
    after=$(app_writes) || return 1
    [[ $(stat -c %o "$mnt/cp-dst") == 1048576 ]] || { echo "st_blksize $(stat -c %o "$mnt/cp-dst")"; return 1; }
    cmp "$work/cp-src" "$mnt/cp-dst" || return 1
    rm -f "$work/cp-src" "$mnt/cp-dst"
    ((after - before == 8)) || { echo "cp of 8 MiB arrived as $((after - before)) write calls"; return 1; }
}
check "st_blksize is 1 MiB, and cp of 8 MiB arrives as 8 writes" cp_in_large_pieces
# A missing name is a negative entry the kernel keeps for the TTL, so SQLite's journal
# checks and git's probes cost no round trip each; every way of creating the name must
# still replace it.
negative_entries() {
    python3 - "$mnt" "$bin" <<'EOF'
import json, os, subprocess, sys
mnt, alignfs = sys.argv[1], sys.argv[2]
d = f"{mnt}/negative"
lookups = lambda: dict(json.loads(subprocess.check_output([alignfs, "stat", mnt, "--json"]))["daemon"]["requests_by_kind"]).get("LOOKUP", 0)
before = lookups()
os.mkdir(d)
for _ in range(200):
    assert not os.path.exists(f"{d}/missing")
spent = lookups() - before
assert spent <= 3, f"200 stats of a missing name cost {spent} LOOKUPs"
creators = {"file": lambda p: open(p, "w").close(), "dir": os.mkdir, "link": lambda p: os.link(f"{d}/missing-target", p),
            "symlink": lambda p: os.symlink("t", p), "node": os.mknod, "rename": lambda p: os.rename(f"{d}/moved", p)}
open(f"{d}/missing-target", "w").close()
open(f"{d}/moved", "w").close()
for name, create in creators.items():
    path = f"{d}/{name}"
    assert not os.path.lexists(path)
    create(path)
    assert os.path.lexists(path), f"{name} created over a negative entry is not seen"
os.unlink(f"{d}/file")
assert not os.path.exists(f"{d}/file")
assert not os.path.exists(f"{d}/moved")
EOF
    local status=$?
    rm -rf "$mnt/negative"
    return $status
}
check "a missing name is looked up once, and creating it in every way is seen" negative_entries

# --- stress-ng ---------------------------------------------------------------------------
# Excluded, because they test something FUSE file systems cannot offer: binderfs (a kernel
# file system of its own), fiemap (no FIEMAP ioctl over FUSE), verity (fs-verity is
# kernel-side). stress-ng skips them by itself on FUSE; excluding them keeps the log clean.
# procfs reads /proc, not the mount, and its /proc/kmsg reader can wait forever for a
# kernel message at exit (it hung a CI run for 15 minutes); the timeout is a last guard.
run_stress_ng() {
    local per=$1 dir=${2:-$mnt}/stress-ng
    mkdir -p "$dir"
    (cd "$dir" && timeout -k 10 600 stress-ng --class filesystem --sequential 1 --verify -t "$per" \
        --exclude binderfs,fiemap,verity,procfs --temp-path "$dir" >"$work/stress-ng.out" 2>&1)
    local status=$?
    if grep -q 'fail:' "$work/stress-ng.out" || ((status != 0)); then
        grep -E 'fail:|error:' "$work/stress-ng.out" | head -20
        return 1
    fi
}
check "stress-ng --class filesystem --verify ($main_transport)" run_stress_ng "$([[ $quick == 1 ]] && echo 1s || echo 2s)"
rm -rf "$mnt/stress-ng"

run_dbench() {
    mkdir -p "$mnt/dbench"
    dbench -D "$mnt/dbench" -t "$1" 2 >"$work/dbench.out" 2>&1 || { tail -20 "$work/dbench.out"; return 1; }
    grep Throughput "$work/dbench.out"
}
check "dbench" run_dbench "$([[ $quick == 1 ]] && echo 10 || echo 20)"
rm -rf "$mnt/dbench"

# --- applications ------------------------------------------------------------------------
run_tar() {
    local crate dir=${1:-$mnt}/tar
    crate=$(ls -S "$HOME"/.cargo/registry/cache/*/*.crate | head -1)
    echo "extracting $(basename "$crate")"
    rm -rf "$work/tar-ref"
    mkdir -p "$dir" "$work/tar-ref"
    tar -xzf "$crate" -C "$dir" && tar -xzf "$crate" -C "$work/tar-ref" && diff -r "$work/tar-ref" "$dir"
}
check "tar extract + diff -r" run_tar

run_git() {
    local dir=${1:-$mnt}/git
    git clone -q --no-local "$repo" "$dir" && git -C "$dir" fsck --full --strict \
        && git -C "$dir" status --porcelain | (! grep .)
}
check "git clone --no-local + fsck --full --strict" run_git

run_sqlite() {
    local db=$mnt/sqlite/test.db
    mkdir -p "$mnt/sqlite"
    sqlite3 "$db" <<'SQL' >/dev/null || return 1
PRAGMA journal_mode=WAL;
CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v BLOB);
CREATE INDEX t_k ON t(k);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000)
INSERT INTO t(k, v) SELECT hex(randomblob(8)), randomblob(abs(random()) % 3000) FROM n;
UPDATE t SET v = randomblob(abs(random()) % 5000) WHERE id % 7 = 0;
DELETE FROM t WHERE id % 11 = 0;
PRAGMA wal_checkpoint(TRUNCATE);
VACUUM;
SQL
    local check
    check=$(sqlite3 "$db" 'PRAGMA integrity_check; SELECT count(*), sum(length(v)) FROM t;')
    echo "$check"
    [[ $(head -1 <<<"$check") == ok ]] && sqlite3 "$db" 'SELECT count(*), sum(length(v)) FROM t;' >"$work/sqlite.sum"
}
check "SQLite workload + PRAGMA integrity_check" run_sqlite

run_rocksdb() {
    local num=$1 dir=${2:-$mnt}
    db_bench --db="$dir/rocksdb" --benchmarks=fillrandom,overwrite,readrandom,verifychecksum --num="$num" \
        --value_size=400 --threads=1 --compression_type=none >"$work/rocksdb.out" 2>&1 \
        && ! grep -qi 'corrupt\|error' "$work/rocksdb.out" \
        || { tail -20 "$work/rocksdb.out"; return 1; }
    grep -E '^(fillrandom|overwrite|readrandom|verifychecksum)' "$work/rocksdb.out"
}
check "RocksDB db_bench fillrandom/overwrite/readrandom + verifychecksum" run_rocksdb "$([[ $quick == 1 ]] && echo 20000 || echo 200000)"

# --- health probe ------------------------------------------------------------------------
# What a watchdog relies on: 0 for a served mount, 1 for one that is not (a plain
# directory, a daemon that stopped answering), 2 for a usage mistake.
health() {
    "$bin" health "$mnt" | grep ': healthy' >/dev/null || return 1
    local status=0
    "$bin" health "$work" >/dev/null || status=$?
    [[ $status == 1 ]] || { echo "health of a plain directory exited $status"; return 1; }
    status=0
    "$bin" health --timeout 0 "$mnt" 2>/dev/null || status=$?
    [[ $status == 2 ]] || { echo "a bad --timeout exited $status"; return 1; }
    local pid
    pid=$(daemon_pid "$mnt")
    kill -STOP "$pid"
    status=0
    "$bin" health --timeout 1 "$mnt" >"$work/health.out" || status=$?
    kill -CONT "$pid"
    [[ $status == 1 ]] && grep -q 'did not answer within 1.0 s' "$work/health.out" || { cat "$work/health.out"; return 1; }
    "$bin" health "$mnt" >/dev/null
}
check "alignfs health: served, plain directory, hung daemon, bad usage" health

# --- mount cycles ------------------------------------------------------------------------
# Unmount three ways (alignfs umount, fusermount3 -u, SIGTERM to the daemon); every file's
# checksum must survive and the reopened volume must have nothing left to replay.
tree_sums() { (cd "$mnt" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
cycle() {
    local how=$1 before after pid
    before=$(tree_sums) || return 1
    pid=$(daemon_pid "$mnt")
    case $how in
        umount) "$bin" umount "$mnt" ;;
        fusermount3) fusermount3 -u "$mnt" && wait_gone "$pid" ;;
        sigterm) kill -TERM "$pid" && wait_gone "$pid" ;;
    esac || return 1
    mountpoint -q "$mnt" && { echo "still mounted after $how"; return 1; }
    mount_main || return 1
    after=$(tree_sums) || return 1
    [[ $before == "$after" ]] || { diff <(echo "$before") <(echo "$after") | head; return 1; }
    "$bin" stat "$mnt" --json | grep '"records_replayed": 0' >/dev/null || {
        echo "journal records left after a clean $how:"
        "$bin" stat "$mnt" --json | grep -E '"records_replayed"|"checkpoint_generation"|"journal_used_bytes"'
        tail -12 "$work/mount.log"
        return 1
    }
    echo "$(wc -l <<<"$after") files identical after $how and remount"
}
for how in umount fusermount3 sigterm; do
    check "unmount ($how), remount, compare checksums" cycle "$how"
done
read_only() {
    local before
    before=$(tree_sums) || return 1
    "$bin" umount "$mnt" >/dev/null || return 1
    "$bin" mount "${main_devices[@]}" --log "$work/mount.log" -o ro,allow_other "$mnt" >/dev/null || return 1
    local refused=0
    touch "$mnt/ro-probe" 2>"$work/ro.err" || refused=1
    local same=0
    [[ $(tree_sums) == "$before" ]] && same=1
    "$bin" umount "$mnt" >/dev/null && mount_main >/dev/null || return 1
    ((refused)) && grep -q "Read-only file system" "$work/ro.err" && ((same))
}
check "mount -o ro: everything readable, writes refused with EROFS" read_only
check "SQLite data after remounts" bash -c "[[ \$(sqlite3 '$mnt/sqlite/test.db' 'PRAGMA integrity_check; SELECT count(*), sum(length(v)) FROM t;' | tail -1) == \$(cat '$work/sqlite.sum') ]]"

# --- the scrap profile -------------------------------------------------------------------
# Two SSDs with residue in 32 MiB of DRAM scrap pages (so flushing runs all the time),
# mounted with writes through the page cache (`--cache all`): pjdfstest (counted test by
# test), fsx, fio verify, page cache coherence, and a remount that keeps every byte.
"$bin" mkfs --profile scrap --ssd "$work/scrap-a.img:1G" --ssd "$work/scrap-b.img:1G" >/dev/null || exit 1
mount_scrap() {
    "$bin" mount --ssd "$work/scrap-b.img" --ssd "$work/scrap-a.img" --scrap-mem 32M --cache all --transport dev-fuse \
        --log "$work/scrap.log" -o allow_other "$scrap" >/dev/null
}
mount_scrap || { cat "$work/scrap.log"; exit 1; }
# pjdfstest on another profile's mount, counted test by test against the main list of
# expected failures.
pjdfstest_counted() {
    local dir=$1 name=$2 out=$work/pjdfstest-$2.out
    echo "== pjdfstest ($name)"
    pjdfstest_on "$dir/pjdfstest" "$shm/pjd-secondary-$name" "$out"
    local actual unexpected pjd_passed
    actual=$(awk '$NF == "FAILED" { print $1 }' "$out" | sort -u)
    unexpected=$(comm -13 <(echo "$expected") <(echo "$actual") | grep -c . || true)
    pjd_passed=$(sed -n 's/^Summary: .* \([0-9]*\) passed.*/\1/p' "$out")
    passed=$((passed + ${pjd_passed:-0}))
    failed=$((failed + unexpected))
    if [[ -z $pjd_passed ]]; then failed=$((failed + 1)); fi
    ((unexpected)) && grep -A4 FAILED "$out" | head -60
}
pjdfstest_counted "$scrap" scrap
# The main mount ran stress-ng and the applications over io_uring; here they run (shorter)
# over /dev/fuse.
check "stress-ng --class filesystem --verify (scrap, dev-fuse)" run_stress_ng 1s "$scrap"
check "tar extract + diff -r (scrap, dev-fuse)" run_tar "$scrap"
check "git clone --no-local + fsck --full --strict (scrap, dev-fuse)" run_git "$scrap"
check "RocksDB db_bench + verifychecksum (scrap, dev-fuse)" run_rocksdb 20000 "$scrap"
rm -rf "$scrap/stress-ng" "$scrap/tar" "$scrap/git" "$scrap/rocksdb"
check "fsx seed 4 ($fsx_ops ops, scrap)" run_fsx "$scrap/fsx-4" 4
check "fio verify (scrap)" run_fio "$scrap/fio" 256m
rm -rf "$scrap/fio"
check "page cache coherence (scrap, --cache all)" coherence "$scrap/coherence" 3
scrap_cycle() {
    local before after
    # The peak is per daemon: read it before unmounting.
    "$bin" stat "$scrap" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
peak, total = r["fast_pages_peak"], r["fast_pages_total"]
assert peak <= total, "scrap pages above --scrap-mem"
print(peak, "of", total, "scrap pages at most in use")' || return 1
    before=$(cd "$scrap" && find . -type f -print0 | sort -z | xargs -0 sha256sum) || return 1
    "$bin" umount "$scrap" >/dev/null && mount_scrap || return 1
    after=$(cd "$scrap" && find . -type f -print0 | sort -z | xargs -0 sha256sum) || return 1
    [[ $before == "$after" ]] || { diff <(echo "$before") <(echo "$after") | head; return 1; }
    # Reading every file back went through the SSD images' page cache: stat reports it.
    "$bin" stat "$scrap" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["records_replayed"] == 0, r["records_replayed"]
cached = r["ssd_cached_bytes"]
assert cached, f"the SSD images page cache is not reported: {cached}"
print(cached >> 20, "MiB of the SSD images in the page cache after reading every file")'
}
check "scrap: unmount, remount, compare checksums, memory within --scrap-mem, SSD cache reported" scrap_cycle
# `sync` does not reach a FUSE daemon; `alignfs sync` does: a new directory and file
# (namespace ops waiting for a commit, data in scrap pages) survive a kill -9 after it.
scrap_sync() {
    local sum pid
    mkdir "$scrap/synced" && head -c 300000 /dev/urandom >"$scrap/synced/f" || return 1
    sum=$(sha256sum <"$scrap/synced/f")
    "$bin" sync "$scrap" | grep -q 'durable' || return 1
    pid=$("$bin" stat "$scrap" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["daemon"]["pid"])') || return 1
    kill -9 "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    umount -l "$scrap"
    mount_scrap || return 1
    [[ $(sha256sum <"$scrap/synced/f") == "$sum" ]]
}
check "scrap: alignfs sync, kill -9, remount: the new directory and file are back" scrap_sync
"$bin" umount "$scrap" >/dev/null

# --- the byte profile --------------------------------------------------------------------
# The emulated memory-semantic SSD (a 1 GiB flash image, its DRAM on tmpfs, a 32 MiB write
# log that cleans during the suites), used through the byte interface, then through the
# block interface alone: pjdfstest, fsx, fio verify, and remounts that keep every byte.
"$bin" mkfs --profile byte --ssd "$work/byte.img:1G" --fast "$shm/byte-dram" >/dev/null || exit 1
mount_byte() {
    "$bin" mount --ssd "$work/byte.img" --fast "$shm/byte-dram" --log "$work/byte.log" -o allow_other "$@" "$byte" >/dev/null
}
mount_byte || { cat "$work/byte.log"; exit 1; }
pjdfstest_counted "$byte" byte
check "fsx seed 5 ($fsx_ops ops, byte)" run_fsx "$byte/fsx-5" 5
check "fio verify (byte)" run_fio "$byte/fio" 64m
rm -rf "$byte/fio"
# Check the device's counters for the interface this mount used ($1: byte or block; on the
# block interface alone nothing may be stored through the byte interface after the
# mount's own recovery), then remount with the options that follow and compare every
# file's checksum.
byte_cycle() {
    local used=$1 before after stat
    shift
    stat=$("$bin" stat "$byte" --json) || return 1
    python3 -c '
import json, sys
r, used = json.loads(sys.argv[1]), sys.argv[2]
device = {c["name"]: c["value"] for c in r["device_counters"]}
if used == "byte":
    assert device["byte_store_bytes"] > 0 and device["log_cleanings"] > 0, device
else:
    mounted = {c["name"]: c["value"] for c in json.load(open(sys.argv[3]))["device_counters"]}
    assert device["byte_store_bytes"] == mounted["byte_store_bytes"], (mounted, device)
    assert device["block_write_bytes"] > mounted["block_write_bytes"], (mounted, device)
print(device["byte_store_payload"], "bytes stored through the byte interface,", device["block_write_bytes"],
      "written through the block interface,", device["log_cleanings"], "log cleanings")' "$stat" "$used" "$work/byte-mounted.json" || return 1
    before=$(cd "$byte" && find . -type f -print0 | sort -z | xargs -0 sha256sum) || return 1
    "$bin" umount "$byte" >/dev/null && mount_byte "$@" || return 1
    "$bin" stat "$byte" --json >"$work/byte-mounted.json" || return 1
    # The remount recovered the device's write log: what it scanned and wrote back is in
    # the report (a mount that stored through the byte interface left entries to recover).
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))["device_recovery"]
assert d["total_us"] >= d["clean_us"] and d["total_us"] >= d["scan_us"], d
assert sys.argv[2] != "byte" or (d["log_bytes"] > 0 and d["pages_written"] > 0), d' "$work/byte-mounted.json" "$used" || return 1
    # Through a file: under pipefail, grep -q quitting early can fail stat with SIGPIPE.
    "$bin" stat "$byte" >"$work/byte-stat.txt" && grep -q "device:    recovered in" "$work/byte-stat.txt" || return 1
    after=$(cd "$byte" && find . -type f -print0 | sort -z | xargs -0 sha256sum) || return 1
    [[ $before == "$after" ]] || { diff <(echo "$before") <(echo "$after") | head; return 1; }
}
check "byte: counters, remount on the block interface alone, compare checksums" byte_cycle byte --no-byte-interface
check "fsx seed 6 ($fsx_ops ops, byte, block interface only)" run_fsx "$byte/fsx-6" 6
check "byte: counters, remount with the byte interface, compare checksums" byte_cycle block
# The device's latency model (ByteFS Table 4, for bench/byte.py's throughput) is on when
# asked for, and the volume still keeps every byte under it.
byte_with_latency() {
    local fsx_ops=2000
    "$bin" umount "$byte" >/dev/null && mount_byte --device-latency || return 1
    grep -q "latency model on (ByteFS Table 4)" "$work/byte.log" || { tail -5 "$work/byte.log"; return 1; }
    run_fsx "$byte/fsx-7" 7
}
check "byte: remount with the device latency model, fsx seed 7 (2000 ops)" byte_with_latency
"$bin" umount "$byte" >/dev/null

# --- the device alone, exported as a disk -------------------------------------------------
# ext4 on a loop device over `alignfs export-device`, as ByteFS's baselines run on its
# device: a tree copied in, fsck clean, the export stopped and started again (the device
# recovers the write log its cache left), the tree read back, a discard; and the exporter
# refuses a byte volume's device.
exported=$work/exported
export_start() {
    "$bin" export-device --ssd "$work/export.img$1" --fast "$shm/export-dram" "$exported" 2>>"$work/export.log" &
    export_pid=$!
    for _ in $(seq 100); do [[ -e $exported/disk ]] && return 0; sleep 0.1; done
    cat "$work/export.log"
    return 1
}
export_stop() { kill -TERM "$export_pid" && wait "$export_pid"; }
fsck_quiet() { fsck.ext4 -fn "$1" >"$work/fsck.out" 2>&1 || { cat "$work/fsck.out"; return 1; }; }
ext4_on_exported_device() {
    local loop sums fs=$work/exported-ext4
    mkdir -p "$fs"
    export_start :512M || return 1
    loop=$(losetup --find --show --direct-io=on "$exported/disk") || return 1
    mkfs.ext4 -q "$loop" && mount "$loop" "$fs" && cp -r "$repo/crates" "$fs/" && sync || return 1
    sums=$(cd "$fs" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
    umount "$fs" && fsck_quiet "$loop" && losetup -d "$loop" && export_stop || return 1
    export_start "" || return 1
    grep -q "device recovered in" "$work/export.log" || { echo "no recovery reported"; cat "$work/export.log"; return 1; }
    loop=$(losetup --find --show --direct-io=on "$exported/disk") && mount "$loop" "$fs" || return 1
    [[ $(cd "$fs" && find . -type f -print0 | sort -z | xargs -0 sha256sum) == "$sums" ]] || { echo "the tree differs after the restart"; return 1; }
    rm -rf "$fs/crates" && fstrim "$fs" && umount "$fs" && fsck_quiet "$loop" || return 1
    losetup -d "$loop" && export_stop || return 1
    if "$bin" export-device --ssd "$work/byte.img" --fast "$shm/byte-dram" "$exported" 2>"$work/err"; then
        echo "a byte volume's device was exported"
        return 1
    fi
    grep -q "holds an alignfs volume" "$work/err" || { cat "$work/err"; return 1; }
}
check "export-device: ext4 on a loop device over the emulated device, restarted, fsck clean, byte volume refused" ext4_on_exported_device

echo "counters of the main volume after the suites:"
"$bin" stat "$mnt" | sed -n 1,9p
echo "suite totals: $passed passed, $failed failed"
((failed == 0))
