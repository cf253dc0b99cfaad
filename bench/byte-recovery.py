#!/usr/bin/env python3
"""Recovery time after a power cut with a full device write log (issue 67, item 4; ByteFS
§5.5 reports 4.2 s after YCSB): byte beside ext4 on the same emulated device.

byte: `alignfs-mssd-recovery` (crates/alignfs-bench), in-process, on a fresh device of
`--device` MiB with the write log such a device gets (1/32 of it, at most 256 MiB), the
device's cleaning held back: a data set written whole,
then random 64 B–1 KiB updates until the log is `--fill` % full, the volume stopped
without closing, then the device's recovery and the volume's open timed (docs/BYTE.md).

ext4-mssd: the same device exported (`alignfs export-device --device-latency --clean-at
100`: block writes cached in the device's DRAM, cleaning only when a write finds no
room), ext4 on a loop device over it, the same data set in 16 files written and synced,
then (the exporter restarted, so that the log starts empty, as byte's does: its whole
blocks go straight to flash) random 64 B–1 KiB updates, each followed by fdatasync, until
the log is `--fill` % full. The power cut: ext4 is shut down without flushing its journal (xfs_io's `shutdown`,
EXT4_IOC_SHUTDOWN with NOLOGFLUSH: nothing more reaches the device), and the exporter is
killed with SIGKILL (its DRAM file keeps what the battery would). Then the exporter is
started again (the device's recovery; the exporter reports its time), ext4 is mounted
(its journal replay: the mount's wall time), and e2fsck -fn checks it.

    sudo bench/byte-recovery.py               # 8 GiB device, 256 MiB log, 3 rounds (about 4 min)
    sudo bench/byte-recovery.py --quick       # smoke run (CI): 512 MiB device, 16 MiB log

Results: bench/results/<date>-byte-recovery/report.md and results.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, Exporter, log, med, run  # noqa: E402

RECOVERY_BIN = REPO / "target" / "release" / "alignfs-mssd-recovery"
MIB = 1 << 20


def byte_round(args) -> dict:
    """One round of the in-process byte measurement (alignfs-mssd-recovery's JSON)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        run([RECOVERY_BIN, "--log", args.log, "--device", args.device, "--data-set", args.data_set, "--files", "16",
             "--fill", args.fill, "--rounds", "1", "--json", out.name])
        r = json.loads(Path(out.name).read_text())[0]
    d = r["device_recovery"]
    return {"system": "byte", "log_used": r["log_used_bytes"], "updates": r["updates"], "device_s": d["total_us"] / 1e6,
            "pages_written": d["pages_written"], "fs_s": r["volume_open_seconds"],
            "total_s": d["total_us"] / 1e6 + r["volume_open_seconds"]}


def ext4_round(args, work: Path, rng: random.Random) -> dict:
    image, dram = Path("/dev/shm") / f"{work.name}.img", Path("/dev/shm") / f"{work.name}-dram"
    exporter = Exporter(image, dram, work / "exported", work / "export.log", ["--device-latency", "--clean-at", "100"])
    fs = work / "ext4"
    fs.mkdir(exist_ok=True)
    loop = ""
    try:
        exporter.start(f"{args.device}M")
        loop = run(["losetup", "-f", "--show", "--direct-io=on", exporter.mnt / "disk"]).strip()
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop])
        run(["mount", loop, fs])
        file_bytes = args.data_set * MIB // 16 // 4096 * 4096
        block = os.urandom(MIB)
        for f in range(16):
            fd = os.open(fs / f"data{f}", os.O_CREAT | os.O_RDWR, 0o644)
            for at in range(0, file_bytes, MIB):
                os.pwrite(fd, block[: min(MIB, file_bytes - at)], at)
            os.close(fd)
        # Start the updates from an empty log, as byte's do (its whole blocks go straight
        # to flash): stopped and started, the device writes its cached blocks back.
        run(["umount", fs])
        run(["losetup", "-d", loop])
        loop = ""
        exporter.stop()
        exporter.start(None)
        loop = run(["losetup", "-f", "--show", "--direct-io=on", exporter.mnt / "disk"]).strip()
        run(["mount", loop, fs])
        fds = [os.open(fs / f"data{f}", os.O_RDWR) for f in range(16)]
        capacity = exporter.stats()["log_capacity_bytes"]
        target = capacity * args.fill // 100
        updates = 0
        while True:
            if updates % 64 == 0 and exporter.stats()["log_used_bytes"] >= target:
                break
            fd = rng.choice(fds)
            length = rng.randint(64, 1024)
            os.pwrite(fd, os.urandom(length), rng.randrange(0, file_bytes - length))
            os.fdatasync(fd)
            updates += 1
        log_used = exporter.stats()["log_used_bytes"]
        # The power cut: ext4 stops writing with its journal as the device has it, then
        # the device's firmware stops.
        run(["xfs_io", "-x", "-c", "shutdown", fs])
        for fd in fds:
            os.close(fd)
        run(["umount", fs])
        run(["losetup", "-d", loop])
        loop = ""
        exporter.kill()
        device_s = exporter.start(None)
        loop = run(["losetup", "-f", "--show", "--direct-io=on", exporter.mnt / "disk"]).strip()
        # The cut must have left a journal to replay, or the mount below times nothing.
        if "needs_recovery" not in run(["dumpe2fs", "-h", loop]):
            raise RuntimeError("ext4 on the device needs no recovery after the power cut")
        started = time.monotonic()
        run(["mount", loop, fs])
        fs_s = time.monotonic() - started
        run(["umount", fs])
        fsck = subprocess.run(["e2fsck", "-fn", loop], capture_output=True, text=True)
        if fsck.returncode != 0:
            raise RuntimeError(f"e2fsck after recovery: {fsck.stdout[-2000:]}")
        return {"system": "ext4-mssd", "log_used": log_used, "updates": updates, "device_s": device_s, "fs_s": fs_s,
                "total_s": device_s + fs_s}
    finally:
        run(["umount", fs], check=False)
        if loop:
            run(["losetup", "-d", loop], check=False)
        exporter.stop()
        image.unlink(missing_ok=True)
        dram.unlink(missing_ok=True)


def report(cells: list, meta: dict) -> str:
    lines = [
        "# Recovery after a power cut with a full device write log",
        "",
        f"{meta['date']}, {meta['rounds']} round(s): a {meta['device']} MiB device with a {meta['log']} MiB write log, Table 4's",
        f"latencies, filled to {meta['fill']} % by random 64 B–1 KiB updates of a {meta['data_set']} MiB data set.",
        "",
        "| system | updates | log used MiB | device recovery s | file system open s (ext4: journal replay) | total s [min–max] |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for system in ("byte", "ext4-mssd"):
        cs = [c for c in cells if c["system"] == system]
        if not cs:
            continue
        totals = [c["total_s"] for c in cs]
        lines.append(
            f"| {system} | {med(c['updates'] for c in cs):,.0f} | {med(c['log_used'] for c in cs) / MIB:.1f} | "
            f"{med(c['device_s'] for c in cs):.3f} | {med(c['fs_s'] for c in cs):.3f} | "
            f"{med(totals):.3f} [{min(totals):.3f}–{max(totals):.3f}] |"
        )
    lines += ["", "Target (issue 67): a full 256 MiB log recovers in at most 5 s, beside ext4's figure.", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", type=int, default=8192, help="device capacity, MiB")
    p.add_argument("--data-set", type=int, default=1024, help="MiB, in 16 files")
    p.add_argument("--fill", type=int, default=90, help="cut the power at this log use, percent")
    p.add_argument("--quick", action="store_true", help="smoke run: a 512 MiB device, 16 MiB log, one round")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/byte-recovery.py needs root (loop devices, mounts)")
    if args.quick:
        args.rounds, args.device, args.data_set = 1, 512, 64
    # The write log a device of this capacity gets (alignfs mkfs and export-device alike).
    args.log = min(max(args.device // 32, 1), 256)
    if not 1 <= args.fill <= 90:
        raise SystemExit("--fill takes 1 to 90 (percent of the write log)")
    run(["cargo", "build", "--release", "--locked", "-q", "--workspace"], capture=False)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = args.out or REPO / "bench" / "results" / f"{stamp}-byte-recovery{'-quick' if args.quick else ''}"
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": stamp, "rounds": args.rounds, "device": args.device, "log": args.log, "data_set": args.data_set, "fill": args.fill}
    cells = []
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="alignfs-byte-recovery-") as tmp:
        for round_no in range(args.rounds):
            for system in ("byte", "ext4-mssd") if round_no % 2 == 0 else ("ext4-mssd", "byte"):
                log(f"round {round_no + 1}/{args.rounds}: {system}")
                c = byte_round(args) if system == "byte" else ext4_round(args, Path(tmp), rng)
                log(f"  {c['updates']} updates, {c['log_used'] / MIB:.1f} MiB of log; device {c['device_s']:.3f} s, "
                    f"file system {c['fs_s']:.3f} s")
                cells.append({**c, "round": round_no})
                (out / "results.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))
    text = report(cells, meta)
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
