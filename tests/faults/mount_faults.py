#!/usr/bin/env python3
"""Device faults and full devices through a live mount.

Mounts a small volume with `alignfs mount --inject-faults`, arms one fault at a time
through the root's `user.alignfs.inject` attribute, and checks that each reaches the
application as the right errno (EIO for a failed or short SSD read, write or flush;
ENOSPC for a full volume), that nothing acknowledged changes, and that after the faults
`alignfs fsck` finds the volume clean and a plain remount reads back every acknowledged
byte. Prints one line per check and `suite totals: N passed, M failed`.

usage: mount_faults.py ALIGNFS_BINARY WORK_DIR [SEED]   (or ALIGNFS_SEED=...)
"""

import errno
import os
import random
import subprocess
import sys
import time

KIB, MIB = 1 << 10, 1 << 20


def main() -> int:
    alignfs, work = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3] if len(sys.argv) > 3 else os.environ.get("ALIGNFS_SEED", int(time.time())))
    print(f"faults: seed {seed} (replay: ALIGNFS_SEED={seed} {sys.argv[0]} {alignfs} {work})")
    rng = random.Random(seed)
    shm = f"/dev/shm/alignfs-faults.{os.getpid()}"
    fast, ssd, mnt = f"{shm}/fast", f"{work}/ssd.img", f"{work}/mnt"
    os.makedirs(shm, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)

    def sh(*args, ok_codes=(0,)):
        p = subprocess.run([alignfs, *args], capture_output=True, text=True)
        if p.returncode not in ok_codes:
            raise RuntimeError(f"alignfs {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
        return p

    def arm(spec):
        os.setxattr(mnt, "user.alignfs.inject", spec.encode())

    def fails_with(code, fn):
        try:
            fn()
        except OSError as e:
            return e.errno == code, f"got {errno.errorcode.get(e.errno, e.errno)}"
        return False, "the call succeeded"

    def mount(*extra):
        sh("mount", "--fast", fast, "--ssd", ssd, "--log", f"{work}/mount.log", *extra, mnt)

    model = {}  # path -> bytearray of acknowledged contents

    def write_ack(path, offset, data):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        content = model.setdefault(path, bytearray())
        if len(content) < offset + len(data):
            content.extend(bytes(offset + len(data) - len(content)))
        content[offset : offset + len(data)] = data

    def matches(path):
        with open(path, "rb") as f:
            return f.read() == bytes(model[path])

    try:
        sh("mkfs", "--fast", f"{fast}:4M", "--ssd", f"{ssd}:64M")
        mount("--inject-faults")
        a = f"{mnt}/a"
        write_ack(a, 0, rng.randbytes(256 * KIB))
        write_ack(a, 300 * KIB + 17, rng.randbytes(5000))  # an unaligned piece in the fast tier

        fd = os.open(a, os.O_RDWR)
        try:
            for kind in ("write", "short-write"):
                arm(f"{kind}=1")
                ok, why = fails_with(errno.EIO, lambda: os.pwrite(fd, rng.randbytes(256 * KIB), 0))
                check(f"{kind} fault: pwrite fails with EIO", ok, why)
                check(f"{kind} fault: the file is unchanged", matches(a))
            arm("write=1")
            size = os.fstat(fd).st_size
            ok, why = fails_with(errno.EIO, lambda: os.pwrite(fd, rng.randbytes(64 * KIB), 1 * MIB))
            check("write fault on an extending write: EIO", ok, why)
            check("write fault on an extending write: size unchanged", os.fstat(fd).st_size == size, f"{size} -> {os.fstat(fd).st_size}")
            for kind in ("read", "short-read"):
                arm(f"{kind}=1")
                ok, why = fails_with(errno.EIO, lambda: os.pread(fd, 256 * KIB, 0))
                check(f"{kind} fault: pread fails with EIO", ok, why)
                check(f"{kind} fault: the next read returns the data", os.pread(fd, 256 * KIB, 0) == bytes(model[a][: 256 * KIB]))
            # A write flushes its SSD blocks before journaling the map edit that exposes
            # them, so a failed flush fails that write; the next fsync retries the flush.
            arm("flush=1")
            ok, why = fails_with(errno.EIO, lambda: os.pwrite(fd, rng.randbytes(128 * KIB), 0))
            check("flush fault: pwrite fails with EIO", ok, why)
            check("flush fault: the file is unchanged", matches(a))
            try:
                os.fsync(fd)
                check("flush fault: the next fsync flushes and succeeds", True)
            except OSError as e:
                check("flush fault: the next fsync flushes and succeeds", False, str(e))
            arm("write=1 read=1")
            arm("clear")
            check("clear disarms every fault", os.getxattr(mnt, "user.alignfs.inject") == b"none")
            ok, why = fails_with(errno.EINVAL, lambda: arm("write=x"))
            check("a malformed plan is refused with EINVAL", ok, why)
        finally:
            os.close(fd)

        # Fill the volume: large unaligned writes until the SSD is full, then small ones
        # until the fast tier is too. Both must end in ENOSPC, never EIO.
        big = f"{mnt}/big"

        def fill(paths, sizes, attempts):
            """Append until a write fails; the errnos seen (os-level writes: no buffer
            left to fail again at close)."""
            fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for p in paths]
            try:
                for i in range(attempts):
                    try:
                        os.write(fds[i % len(fds)], rng.randbytes(sizes()))
                    except OSError as e:
                        return [e.errno]
                return []
            finally:
                for fd in fds:
                    os.close(fd)

        errors = fill([big], lambda: MIB + rng.randrange(4096), 200)
        check("SSD full: writes end in ENOSPC", errors == [errno.ENOSPC], f"errors {errors}")
        errors = fill([f"{mnt}/s{i}" for i in range(64)], lambda: rng.randrange(1, 3000), 20000)
        check("fast tier full too: small writes end in ENOSPC", errors == [errno.ENOSPC], f"errors {errors}")
        check("after ENOSPC the acknowledged file is intact", matches(a))
        os.unlink(big)
        try:
            write_ack(f"{mnt}/after", 0, rng.randbytes(2 * MIB))
            check("space freed by unlink is writable again", True)
        except OSError as e:
            check("space freed by unlink is writable again", False, str(e))

        sh("umount", mnt)
        p = sh("fsck", "--fast", fast, "--ssd", ssd, ok_codes=(0, 1, 2))
        check("fsck after the faults is clean", p.returncode == 0, p.stdout.strip()[-500:])
        mount()
        check("a plain remount reads back every acknowledged byte", all(matches(path) for path in model))
        try:
            os.setxattr(mnt, "user.alignfs.inject", b"write=1")
            check("without --inject-faults the attribute is refused", False, "setxattr succeeded")
        except OSError as e:
            check("without --inject-faults the attribute is refused", e.errno == errno.EPERM, str(e))
        sh("umount", mnt)
    finally:
        if os.path.ismount(mnt):
            subprocess.run([alignfs, "umount", mnt], capture_output=True)
        subprocess.run(["rm", "-rf", shm])
    failed = results.count(False)
    print(f"suite totals: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
