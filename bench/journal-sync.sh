#!/bin/bash
# What a KV store's journal sync costs on the file system under it, by how the journal
# file was prepared: durable 2,100-byte appends (one nvstore 2 KiB append's record), each
# followed by fdatasync, into a file that is
#   sparse   set_len to 64 MiB (what fjall 3.1 does for a new journal),
#   extend   empty, each append growing it (fjall's journal after a reopen: recovery
#            truncates it to its last record and reopens it for appending),
#   falloc   fallocate'd (unwritten extents),
#   zeroed   64 MiB of zeros written and synced first.
# On a loop device (direct IO) over an image on the disk under test, as bench/nvstore.py
# puts the KV store. Prints syncs/s and device KiB written per append.
#
#   sudo bench/journal-sync.sh [xfs|ext4 ...]   (default: xfs ext4)
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "needs root (loop devices, mkfs, mount)" >&2; exit 1; }
work=$(mktemp -d /var/tmp/alignfs-journal-sync.XXXXXX)
dev=""
cleanup() {
    mountpoint -q "$work/mnt" && umount "$work/mnt"
    [ -n "$dev" ] && losetup -d "$dev"
    rm -rf "$work"
}
trap cleanup EXIT
for fs in "${@:-xfs ext4}"; do
    for f in $fs; do
        truncate -s 1G "$work/img"
        dev=$(losetup --direct-io=on -f --show "$work/img")
        "mkfs.$f" -q "$dev" $([ "$f" = xfs ] && echo -f || echo -F) >/dev/null
        mkdir -p "$work/mnt" && mount "$dev" "$work/mnt"
        python3 - "$dev" "$work/mnt" "$f" <<'PY'
import os, sys, time
dev, mnt, fs = os.path.basename(sys.argv[1]), sys.argv[2], sys.argv[3]
def written():
    return int(open(f"/sys/block/{dev}/stat").read().split()[6]) * 512
def zero(fd):
    chunk = bytes(1 << 20)
    for i in range(64):
        os.pwrite(fd, chunk, i << 20)
prepare = {"sparse": lambda fd: os.ftruncate(fd, 64 << 20), "extend": lambda fd: None,
           "falloc": lambda fd: os.posix_fallocate(fd, 0, 64 << 20), "zeroed": zero}
for name, prep in prepare.items():
    fd = os.open(os.path.join(mnt, name), os.O_RDWR | os.O_CREAT, 0o644)
    prep(fd)
    os.fsync(fd)
    record, n, at = b"r" * 2100, 4000, 0
    before, started = written(), time.monotonic()
    for _ in range(n):
        os.pwrite(fd, record, at)
        at += len(record)
        os.fdatasync(fd)
    took = time.monotonic() - started
    print(f"{fs:5} {name:7} {n / took:7.0f} syncs/s {(written() - before) / n / 1024:6.1f} KiB per append", flush=True)
    os.close(fd)
PY
        umount "$work/mnt"; losetup -d "$dev"; dev=""; rm -f "$work/img"
    done
done
