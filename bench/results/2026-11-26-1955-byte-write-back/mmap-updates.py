#!/usr/bin/env python3
"""Small updates through a shared mapping, msync after each, on a `byte` mount with the
byte interface and on the same volume block-only: host-to-device bytes per update."""
import json, mmap, os, random, subprocess, sys, time
A = "/work/main/target/release/alignfs"
W = "/var/tmp/wbb"; DRAM = "/dev/shm/wbb-dram"; MNT = f"{W}/mnt"
subprocess.run(["rm", "-rf", W, DRAM]); os.makedirs(MNT)
subprocess.run([A, "mkfs", "--profile", "byte", "--ssd", f"{W}/byte.img:1G", "--fast", DRAM], check=True, capture_output=True)
SIZE, UPDATES = 64 << 20, int(sys.argv[1]) if len(sys.argv) > 1 else 3000
def stat():
    r = json.loads(subprocess.run([A, "stat", MNT, "--json"], check=True, capture_output=True, text=True).stdout)
    d = {x["name"]: x["value"] for x in r["device_counters"]}
    return d
def cell(label, extra, update_bytes, rounds):
    out = []
    for r in range(rounds):
        subprocess.run([A, "mount", "--ssd", f"{W}/byte.img", "--fast", DRAM, "--device-latency", *extra, MNT], check=True, capture_output=True)
        path = f"{MNT}/f"
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(os.urandom(SIZE)); os.fsync(f.fileno())
        fd = os.open(path, os.O_RDWR)
        m = mmap.mmap(fd, SIZE)
        rng = random.Random(7 + r)
        before = stat(); t = time.perf_counter()
        for _ in range(UPDATES):
            page = rng.randrange(SIZE // 4096); at = page * 4096 + rng.randrange(4096 - update_bytes)
            m[at:at + update_bytes] = os.urandom(update_bytes)
            m.flush(page * 4096, 4096)
        dt = time.perf_counter() - t; after = stat()
        m.close(); os.close(fd)
        subprocess.run([A, "umount", MNT], check=True, capture_output=True)
        d = {k: (after[k] - before[k]) / UPDATES for k in ["block_write_bytes", "byte_store_bytes", "flash_program_bytes"]}
        out.append((UPDATES / dt, d))
        print(f"{label} update {update_bytes} B round {r}: {UPDATES/dt:.0f} updates/s, per update: block {d['block_write_bytes']:.0f} B, byte stores {d['byte_store_bytes']:.0f} B, flash {d['flash_program_bytes']:.0f} B", flush=True)
    return out
for n in (16, 200, 1024):
    for label, extra in (("byte", []), ("block-only", ["--no-byte-interface"])):
        cell(label, extra, n, 2)
subprocess.run(["rm", "-rf", W, DRAM])
