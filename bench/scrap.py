#!/usr/bin/env python3
"""The `scrap` profile against ext4's buffered I/O, same disk, same run (WSBuffer §4.2, §4.6).

A scrap volume (an SSD image on the host disk, residue in DRAM scrap pages) is mounted
next to a directory of the host's ext4. Both hold a prefilled file. Each cell first makes
every file of both systems durable (so neither writes back the last cell's data during
this one) and drops the kernel's caches (so ext4 must read a partly written page before
writing it, and alignfs starts with an empty scrap buffer). Then fio writes a fixed
amount at random offsets (WSBuffer Figs. 7, 8 and 10a):

  - full-page writes: exact sizes, offsets on scrap-page (256 KiB) boundaries, no fsync;
  - partial-page writes: sizes ±10 %, offsets at any byte, no fsync;
  - the same partial-page writes with one fsync at the end (`partial-fsync`);
  - 4 KiB ±10 % writes with an fsync after each (`fsync-each`, a quarter of the bytes);
  - threads: 1, 2 and 4 writers, each on its own file, partial-page sizes, no fsync.

For every alignfs cell the counters give the share of written bytes that passed through
DRAM (scrap pages), WSBuffer's Table 4. The scrap memory's peak must stay under
`--scrap-mem`. The run raises fs.fuse.max_pages_limit to 2048 (restored afterwards) so
writes of up to 8 MiB reach the engine whole (docs/FUSE.md).

    bench/scrap.py            # 3 rounds, 4 GiB files, 512 MiB per cell (about 6 minutes)
    bench/scrap.py --quick    # 1 round, small files (smoke run, what CI runs)
    bench/scrap.py --kinds partial-fsync,fsync-each --alignfs OLD   # some cells, another build

Results: bench/results/<date>-<time>-scrap/report.md and results.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (ALIGNFS, REPO, drop_caches, enable_fuse_uring, install_missing, log, med, mount_alignfs,  # noqa: E402
                    mount_transport, run, umount_alignfs)

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
SCRAP_PAGE = 256 * KIB
SIZES = [("4KiB", 4 * KIB), ("64KiB", 64 * KIB), ("256KiB", 256 * KIB), ("1MiB", MIB), ("2MiB", 2 * MIB), ("4MiB", 4 * MIB)]
THREAD_SIZES = [("64KiB", 64 * KIB), ("1MiB", MIB), ("4MiB", 4 * MIB)]
THREADS = [1, 2, 4]
MAX_PAGES = Path("/proc/sys/fs/fuse/max_pages_limit")


def fsync_tree(directory: Path) -> None:
    """Make every file durable: empties alignfs's scrap buffer, writes back ext4's pages."""
    for f in directory.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def counters(mnt: Path) -> dict:
    report = json.loads(run([ALIGNFS, "stat", mnt, "--json"]))
    return dict(report["counters"], fast_pages_peak=report["fast_pages_peak"], fast_pages_total=report["fast_pages_total"])


KINDS = ["full-page", "partial-page", "partial-fsync", "fsync-each", "threads"]
# A cell stops after this long even if it has not written its bytes (fsync-each on a slow disk).
CELL_SECONDS = 60


def fio_write(files: list, file_size: int, io_size: int, lo: int, hi: int, partial: bool, fsync: str = "",
              daemon_pid: int | None = None) -> dict:
    """One random-write cell: a job per file, `io_size` bytes each; MiB/s, mean µs, and CPU
    seconds per GiB of the writer and of the daemon `daemon_pid` if given.
    `fsync`: "end" (one fsync when done), "each" (after every write) or "" (none)."""
    args = ["fio", "--output-format=json", "--ioengine=psync", "--rw=randwrite", "--invalidate=0", "--randrepeat=1",
            "--randseed=42", f"--size={file_size}", f"--io_size={io_size}", "--group_reporting", f"--runtime={CELL_SECONDS}"]
    args += {"end": ["--end_fsync=1"], "each": ["--fsync=1"], "": []}[fsync]
    if partial:
        args += [f"--bsrange={lo}-{hi}", "--bs_unaligned=1"]
    else:
        args += [f"--bs={lo}", f"--blockalign={max(lo, SCRAP_PAGE)}"]
    for i, f in enumerate(files):
        args += [f"--name=w{i}", f"--filename={f}"]
    daemon_before = process_cpu_seconds(daemon_pid) if daemon_pid else 0.0
    job = json.loads(run(args))["jobs"][0]
    daemon = process_cpu_seconds(daemon_pid) - daemon_before if daemon_pid else 0.0
    # fio's own figure for its jobs (not its start-up): percentages of the job's run time.
    writer = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000
    write = job["write"]
    return {"mib_s": write["bw_bytes"] / MIB, "mean_us": write["lat_ns"]["mean"] / 1000,
            "cpu_s_per_gib": (writer + daemon) / (write["io_bytes"] / GIB) if write["io_bytes"] else 0.0}


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU time of every thread of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prefill(path: Path, size: int) -> None:
    run(["fio", "--name=prefill", f"--filename={path}", f"--size={size}", "--rw=write", "--bs=1m", "--ioengine=psync",
         "--end_fsync=1", "--output=/dev/null"])


def cell_sizes(size: int) -> tuple:
    """Sizes ±10 % for partial-page writes."""
    return int(size * 0.9), int(size * 1.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round, 64 MiB files, 8 MiB per cell")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--work", type=Path, default=Path("/var/tmp"), help="where the SSD image and the ext4 files go")
    p.add_argument("--alignfs", type=Path, default=None, help="run this alignfs binary instead of building the tree's (old/new A/B runs)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated cells to run, from {','.join(KINDS)}")
    p.add_argument("--file-size", type=int, default=None, help="bytes of the main file (default 4 GiB, 64 MiB with --quick)")
    p.add_argument("--cell-bytes", type=int, default=None, help="bytes written per cell (default 512 MiB, 8 MiB with --quick)")
    args = p.parse_args()
    kinds = args.kinds.split(",")
    if not kinds or any(k not in KINDS for k in kinds):
        raise SystemExit(f"bench/scrap.py: --kinds takes a comma-separated list from {','.join(KINDS)}")
    global ALIGNFS
    if os.geteuid() != 0:
        raise SystemExit("bench/scrap.py: run as root (it mounts and drops caches)")
    install_missing({"fio": "fio", "fusermount3": "fuse3"})
    enable_fuse_uring()
    if args.alignfs:
        ALIGNFS = args.alignfs.resolve()
    else:
        run(["cargo", "build", "--release", "--locked", "-q", "--workspace"], check=True)
    rounds = args.rounds or (1 if args.quick else 3)
    file_size = args.file_size or (64 * MIB if args.quick else 4 * GIB)
    io_size = args.cell_bytes or (8 * MIB if args.quick else 512 * MIB)
    thread_io = 4 * MIB if args.quick else 256 * MIB
    scrap_mem = 256 * MIB if args.quick else 4 * GIB
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = args.out or REPO / "bench" / "results" / f"{stamp}-scrap"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="alignfs-bench-scrap.", dir=args.work))
    mnt, ext4 = work / "mnt", work / "ext4"
    ext4.mkdir()
    pages_before = MAX_PAGES.read_text().strip() if MAX_PAGES.exists() else None
    cells = []
    try:
        if pages_before is not None:
            MAX_PAGES.write_text("2048\n")
        ssd_size = file_size * 2 + max(THREADS) * file_size // 4 + GIB
        run([ALIGNFS, "mkfs", "--profile", "scrap", "--ssd", f"{work / 'ssd.img'}:{ssd_size}"])
        mount_alignfs(["--ssd", work / "ssd.img"], mnt, ["--scrap-mem", str(scrap_mem)], work / "mount.log", alignfs=ALIGNFS)
        transport = mount_transport(mnt, ALIGNFS)
        daemon_pid = json.loads(run([ALIGNFS, "stat", mnt, "--json"]))["daemon"]["pid"]
        dirs = {"alignfs": mnt, "ext4": ext4}
        log(f"prefilling {file_size // MIB} MiB files on alignfs (scrap) and ext4 under {work}")
        for d in dirs.values():
            prefill(d / "main", file_size)
            for t in range(max(THREADS)):
                prefill(d / f"t{t}", file_size // 4)
        plan = [("full-page", name, size, size, 1) for name, size in SIZES]
        plan += [("partial-page", name, *cell_sizes(size), 1) for name, size in SIZES]
        plan += [("partial-fsync", name, *cell_sizes(size), 1) for name, size in SIZES]
        plan += [("fsync-each", "4KiB", *cell_sizes(4 * KIB), 1)]
        plan += [("threads", f"{name} x{n}", *cell_sizes(size), n) for name, size in THREAD_SIZES for n in THREADS]
        plan = [cell for cell in plan if cell[0] in kinds]
        for rnd in range(rounds):
            for kind, name, lo, hi, threads in plan:
                for system, d in dirs.items():
                    # Both systems start idle: without the fsync of the other one, ext4's
                    # cell ran while scrap's flusher merged the last cell's residue on the
                    # same disk (os.sync in drop_caches does not reach the FUSE daemon).
                    for other in dirs.values():
                        fsync_tree(other)
                    drop_caches()
                    before = counters(mnt) if system == "alignfs" else None
                    files = [d / "main"] if kind != "threads" else [d / f"t{t}" for t in range(threads)]
                    size = file_size if kind != "threads" else file_size // 4
                    cell_io = {"threads": thread_io, "fsync-each": io_size // 4}.get(kind, io_size)
                    fsync = {"partial-fsync": "end", "fsync-each": "each"}.get(kind, "")
                    result = fio_write(files, size, cell_io, lo, hi, kind != "full-page", fsync,
                                       daemon_pid if system == "alignfs" else None)
                    cell = {"round": rnd, "kind": kind, "size": name, "system": system, **result}
                    if before is not None:
                        after = counters(mnt)
                        written = after["app_write_bytes"] - before["app_write_bytes"]
                        dram = sum(after[c] - before[c] for c in ["page_write_bytes", "upage_write_bytes"])
                        cell["dram_share"] = dram / written if written else 0.0
                    cells.append(cell)
                    log(f"round {rnd + 1}/{rounds} {kind:12} {name:10} {system:8} {result['mib_s']:8.1f} MiB/s"
                        + (f"  {100 * cell['dram_share']:5.1f}% through DRAM" if "dram_share" in cell else ""))
        final = counters(mnt)
        meta = {"date": stamp, "rounds": rounds, "file_bytes": file_size, "cell_bytes": io_size, "thread_cell_bytes": thread_io,
                "scrap_mem_bytes": scrap_mem, "scrap_pages_peak": final["fast_pages_peak"], "scrap_pages_total": final["fast_pages_total"],
                "fuse_max_pages_limit": 2048 if pages_before is not None else None, "counters": final,
                "alignfs": str(ALIGNFS), "transport": transport}
    finally:
        if mnt.exists() and os.path.ismount(mnt):
            umount_alignfs(mnt, ALIGNFS)
        if pages_before is not None:
            MAX_PAGES.write_text(pages_before + "\n")
        shutil.rmtree(work, ignore_errors=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))
    report, ok = write_report(cells, meta)
    (out / "report.md").write_text(report)
    print(report)
    log(f"report: {out / 'report.md'}")
    return 0 if ok or args.quick else 1


def median(cells: list, kind: str, size: str, system: str, key: str = "mib_s") -> float:
    return med(c[key] for c in cells if (c["kind"], c["size"], c["system"]) == (kind, size, system) and key in c)


def write_report(cells: list, meta: dict) -> tuple:
    """The report, and whether the targets were met."""
    lines = [
        f"# scrap vs ext4 buffered I/O ({meta['date']})",
        "",
        f"Medians of {meta['rounds']} round(s). Files of {meta['file_bytes'] // MIB} MiB, prefilled; caches dropped before "
        f"every cell; {meta['cell_bytes'] // MIB} MiB written per cell ({meta['thread_cell_bytes'] // MIB} MiB per thread "
        f"in the thread cells, a quarter in fsync-each), one fio psync job per thread; an fsync only in the fsync cells. ext4 is a directory of the host file system on the "
        f"same disk as alignfs's SSD image. fs.fuse.max_pages_limit: {meta['fuse_max_pages_limit']}. "
        f"The mount's requests: {meta.get('transport', 'not recorded')}.",
        "",
        "CPU s/GiB: CPU time per GiB written of the writer (fio's jobs) and, for alignfs, of its daemon, while the "
        "cell ran; the kernel's own writeback threads are not in it, nor work left for after a cell without an fsync.",
        "",
        "| writes | size | alignfs MiB/s | ext4 MiB/s | alignfs ÷ ext4 | alignfs mean µs | ext4 mean µs | alignfs CPU s/GiB "
        "| ext4 CPU s/GiB | through DRAM |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    seen = []
    for c in cells:
        if (c["kind"], c["size"]) not in seen:
            seen.append((c["kind"], c["size"]))
    ratios = {}
    for kind, size in seen:
        a, e = median(cells, kind, size, "alignfs"), median(cells, kind, size, "ext4")
        ratios[(kind, size)] = a / e if e else float("nan")
        lines.append(
            f"| {kind} | {size} | {a:.1f} | {e:.1f} | {ratios[(kind, size)]:.2f}× | {median(cells, kind, size, 'alignfs', 'mean_us'):.0f} "
            f"| {median(cells, kind, size, 'ext4', 'mean_us'):.0f} | {median(cells, kind, size, 'alignfs', 'cpu_s_per_gib'):.2f} "
            f"| {median(cells, kind, size, 'ext4', 'cpu_s_per_gib'):.2f} | {100 * median(cells, kind, size, 'alignfs', 'dram_share'):.1f}% |"
        )
    peak_bytes = meta["scrap_pages_peak"] * SCRAP_PAGE
    partial = [ratios[("partial-page", s)] for s in ["64KiB", "256KiB", "1MiB", "2MiB", "4MiB"] if ("partial-page", s) in ratios]
    small = [ratios[("partial-page", s)] for s in ["4KiB", "64KiB"] if ("partial-page", s) in ratios]
    checks = []
    if partial:
        checks.append(("partial-page writes of 64 KiB–4 MiB ≥ 2× ext4", min(partial) >= 2.0, f"lowest {min(partial):.2f}×"))
    if small:
        checks.append(("partial-page writes of 4–64 KiB, no fsync, ≥ 3× ext4", min(small) >= 3.0, f"lowest {min(small):.2f}×"))
    if ("fsync-each", "4KiB") in ratios:
        each = ratios[("fsync-each", "4KiB")]
        checks.append(("4 KiB ±10 % with an fsync after each ≥ 0.8× ext4", each >= 0.8, f"{each:.2f}×"))
    if ("partial-page", "2MiB") in ratios:
        dram_2m = median(cells, "partial-page", "2MiB", "alignfs", "dram_share")
        checks.append(("≤ 25 % of bytes through DRAM for 2 MiB ±10 % writes", dram_2m <= 0.25, f"{100 * dram_2m:.1f}%"))
    checks.append(("scrap memory never above --scrap-mem", meta["scrap_pages_peak"] <= meta["scrap_pages_total"],
                   f"peak {peak_bytes // MIB} MiB of {meta['scrap_mem_bytes'] // MIB} MiB"))
    lines += ["", "| target | met | measured |", "| --- | --- | --- |"]
    lines += [f"| {what} | {'yes' if ok else 'no'} | {measured} |" for what, ok, measured in checks]
    counters = meta["counters"]
    lines += ["", "Flushing over the whole run (blocks): "
              + ", ".join(f"{k} {counters.get(k, 0)}" for k in ["migrations_full", "migrations_idle", "migrations_watermark",
                                                               "migrations_fast_full", "migrations_sync", "migrations_in_place"])
              + "; bytes: " + ", ".join(f"{k} {counters.get(k, 0)}" for k in ["migration_read_bytes", "migration_sector_read_bytes",
                                                                            "migration_write_bytes", "migration_sector_write_bytes"])
              + f"; foreground read-modify-write reads {counters.get('fg_rmw_reads', 0)}.", ""]
    return "\n".join(lines), all(ok for _, ok, _ in checks)


if __name__ == "__main__":
    sys.exit(main())
