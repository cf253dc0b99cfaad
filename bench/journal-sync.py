#!/usr/bin/python3
"""What a KV store's journal sync costs on the file system under it, by how the journal
file was prepared: durable 2,100-byte appends (one nvstore 2 KiB append's record), each
followed by fdatasync, into a file that is
  sparse   set_len to 64 MiB (what fjall 3.1 does for a new journal),
  extend   empty, each append growing it (fjall's journal after a reopen: recovery
           truncates it to its last record and reopens it for appending),
  falloc   fallocate'd (unwritten extents),
  zeroed   64 MiB of zeros written and synced first.
On a loop device with direct IO over a file on the disk under test, set up as
bench/nvstore.py sets up its KV store's. Prints syncs/s and device KiB written per append.

  sudo bench/journal-sync.py [xfs|ext4 ...]   (default: xfs ext4)
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvstore import Loop, detach, fs_on, unmount  # noqa: E402  (its loop devices and file systems)

JOURNAL = 64 << 20


def zero(fd):
    chunk = bytes(1 << 20)
    for at in range(0, JOURNAL, len(chunk)):
        os.pwrite(fd, chunk, at)


PREPARE = {"sparse": lambda fd: os.ftruncate(fd, JOURNAL), "extend": lambda fd: None,
           "falloc": lambda fd: os.posix_fallocate(fd, 0, JOURNAL), "zeroed": zero}


def measure(loop, mnt, fs):
    for name, prepare in PREPARE.items():
        fd = os.open(os.path.join(mnt, name), os.O_RDWR | os.O_CREAT, 0o644)
        prepare(fd)
        os.fsync(fd)
        record, n, at = b"r" * 2100, 4000, 0
        before, started = loop.written(), time.monotonic()
        for _ in range(n):
            os.pwrite(fd, record, at)
            at += len(record)
            os.fdatasync(fd)
        took = time.monotonic() - started
        print(f"{fs:5} {name:7} {n / took:7.0f} syncs/s {(loop.written() - before) / n / 1024:6.1f} KiB per append", flush=True)
        os.close(fd)


def main():
    if os.geteuid() != 0:
        sys.exit("needs root (loop devices, mkfs, mount)")
    for fs in sys.argv[1:] or ["xfs", "ext4"]:
        with tempfile.TemporaryDirectory(prefix="alignfs-journal-sync.", dir="/var/tmp") as work:
            loop = mnt = None
            try:
                loop = Loop(os.path.join(work, "img"), 1 << 30)
                mnt = fs_on(loop, os.path.join(work, "mnt"), fs)
                measure(loop, mnt, fs)
            finally:
                unmount(mnt)
                detach(loop)


if __name__ == "__main__":
    main()
