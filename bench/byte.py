#!/usr/bin/env python3
"""ByteFS's measurements (issue 21, item 5): host-to-device write traffic, split by
interface and into metadata and data, flash programs, and throughput, on

  byte        a `byte` mount (byte interface on), with the device's latency model, its
              metadata in place (ByteFS's layout: 64-byte lines, one device transaction
              per commit)
  byte-journal  the same with the journal and checkpoints (mkfs --meta-store journal)
  block-only  the same profile with --no-byte-interface (the paper's block-only baseline)
  ext4        ext4 on a loop device over an image on this disk: its block-layer
              counters give its real host-to-device traffic
  ext4-mssd   ext4 on the same emulated device as the byte systems, with the same latency
              model (a loop device over `alignfs export-device`), the device's DRAM given
              to it as a block cache as large as byte's write log, as ByteFS runs its
              baselines (§5.1): its throughput and flash programs compare with byte's

for ByteFS's micro workloads (create, mkdir, unlink, rmdir, each durable), the macro ones
(fileserver, varmail, webproxy, webserver from alignfs-macro with ByteFS's file sizes,
128 KiB and 16 KiB, and 16 KiB appends; every write phase fsynced; --threads writers,
where the paper runs 12) and RocksDB db_bench fillrandom with sync=1. Every cell runs on a fresh file system, and only the
workload itself is counted (a macro file set is prepared and synced first).

The byte systems and ext4-mssd run with `--device-latency` (ByteFS's Table 4) and the
16 MB FTL write buffer of ByteFS's prototype, where the paper's Figure 6 runs
(`--write-buffer 0`: Table 4's emulator, every block write waiting for its program), so their
throughput is that of the modelled device; plain ext4's is this machine's disk, so only
its traffic compares. Each cell also reports the device's log cleanings and the share of
the cell's time stores (or cached block writes) waited on a full write log. They run twice: through the mount, and in the workload's own process through
the LD_PRELOAD shim (no FUSE round trip per request; throughput only). Where the bytes go: for the byte systems, data = whole blocks written
(ssd_write_bytes) + residue bytes; metadata = the rest of the host-to-device traffic
(in-place metadata lines, or journal records and checkpoints). For ext4, the journal's logged blocks
(/proc/fs/jbd2, from its per-transaction averages) are shown as its metadata; the
checkpointed copies of that metadata are in the rest.

    sudo bench/byte.py                 # 3 rounds, about 5 min
    sudo bench/byte.py --flash-on-disk # the emulated flash on this disk (below)
    sudo bench/byte.py --quick         # smoke run (CI), about 1 min

The latency model makes each device operation take at least Table 4's time, and the real
IO on the flash image counts toward it. The byte systems' flash images are in /dev/shm,
as FEMU keeps its flash in DRAM, so that the device takes the model's times alone
(ext4 stays on this disk). On this machine's disk a 4 KiB O_DIRECT read takes about
96 µs and a write about 108 µs at queue depth 1, more than Table 4's 40 and 60 µs, so
with --flash-on-disk flash operations take the disk's time.
    bench/byte.py --from bench/results/DATE-byte        # rebuild the report
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ALIGNFS, REPO, Exporter, enable_fuse_uring, fs_on, log, med, mount_alignfs, mount_transport, run, umount_alignfs  # noqa: E402
from run import ensure_tools  # noqa: E402

MACRO = REPO / "target" / "release" / "alignfs-macro"
SYSTEMS = ["byte", "byte-journal", "block-only", "ext4", "ext4-mssd"]
# The systems whose metadata is a journal of whole blocks (jbd2) and whose data traffic the
# counters do not split out.
EXT4 = ("ext4", "ext4-mssd")
# The same two byte volumes opened in the workload's own process through the LD_PRELOAD
# shim, no FUSE: what the device saves, without a kernel round trip per request diluting
# it. Throughput only (the device's counters live in that process).
IN_PROCESS = ["byte in-process", "block-only in-process"]
PRELOAD = REPO / "target" / "release" / "libalignfs_preload.so"
SHIM_PREFIX = Path("/alignfs-byte-bench")
WORKLOADS = ["micro", "fileserver", "varmail", "webproxy", "webserver", "rocksdb"]
SEED = 7
# ByteFS's file sets (its Table: filebench's own shapes, not OrchFS's larger Table 3 ones):
# mean file size and append size in bytes, scaled down in count only.
SHAPES = {"fileserver": (128 << 10, 16 << 10), "varmail": (16 << 10, 16 << 10), "webproxy": (16 << 10, 16 << 10),
          "webserver": (16 << 10, 16 << 10)}


class System:
    """One file system under test, made fresh for every cell."""

    def __init__(self, name: str, work: Path, args):
        self.name, self.work, self.device = name, work, args.device
        flash_on_disk = args.flash_on_disk
        # The device's write log (for ext4-mssd its block cache, as large), and its latency
        # model with the flash latencies scaled.
        self.device_log = ["--device-log", args.device_log] if args.device_log else []
        self.latency = [f"--device-latency={args.flash_latency:g}"]
        self.latency_env = {"ALIGNFS_DEVICE_LATENCY": f"{args.flash_latency:g}"}
        if args.write_buffer != "0":
            self.latency.append(f"--device-write-buffer={args.write_buffer}")
            self.latency_env["ALIGNFS_DEVICE_WRITE_BUFFER"] = args.write_buffer
        self.slug = name.replace(" ", "-")
        self.in_process = name in IN_PROCESS
        self.block_only = name.startswith("block-only")
        self.mnt = SHIM_PREFIX if self.in_process else work / f"m-{self.slug}"
        self.dram = Path("/dev/shm") / f"{work.name}-{self.slug}"
        self.image = work / f"{self.slug}.img" if flash_on_disk else Path("/dev/shm") / f"{work.name}-{self.slug}.img"
        self.loop = ""
        # How the mount receives requests (`alignfs stat`); none for ext4 and the shim.
        self.transport = None
        # ext4-mssd: the exporter serving the device as a file.
        self.exporter = Exporter(self.image, self.dram, work / f"x-{self.slug}", work / f"{self.slug}.log", [*self.latency, *self.device_log])

    def env(self) -> dict:
        """The environment a workload runs in: the shim's, for an in-process system."""
        if not self.in_process:
            return {}
        return {"LD_PRELOAD": str(PRELOAD), "ALIGNFS_PREFIX": str(SHIM_PREFIX), "ALIGNFS_FAST": str(self.dram),
                "ALIGNFS_SSD": str(self.image), **self.latency_env,
                "ALIGNFS_NO_BYTE_INTERFACE": "1" if self.block_only else "0"}

    def make(self) -> Path:
        if not self.in_process:
            self.mnt.mkdir(parents=True, exist_ok=True)
        # Initialise inode tables and the journal now, not in the background during a cell.
        lazy_init_off = ["-E", "lazy_itable_init=0,lazy_journal_init=0"]
        if self.name == "ext4":
            image = self.work / "ext4.img"
            image.unlink(missing_ok=True)
            run(["fallocate", "-l", self.device, image])
            self.loop = run(["losetup", "-f", "--show", image]).strip()
            fs_on(self.loop, self.mnt, mkfs_options=lazy_init_off)
        elif self.name == "ext4-mssd":
            self.image.unlink(missing_ok=True)
            self.dram.unlink(missing_ok=True)
            if "--metadata-ranges" not in self.exporter.options:
                ranges = self.work / "ext4-metadata-ranges"
                ranges.write_text(ext4_metadata_ranges(self.device, lazy_init_off, self.work))
                self.exporter.options += ["--metadata-ranges", str(ranges)]
            self.exporter.start(self.device)
            self.loop = run(["losetup", "-f", "--show", "--direct-io=on", self.exporter.mnt / "disk"]).strip()
            fs_on(self.loop, self.mnt, mkfs_options=lazy_init_off)
        else:
            self.image.unlink(missing_ok=True)
            self.dram.unlink(missing_ok=True)
            store = ["--meta-store", "journal"] if self.name == "byte-journal" else []
            run([ALIGNFS, "mkfs", "--profile", "byte", *store, *self.device_log, "--ssd", f"{self.image}:{self.device}", "--fast", self.dram])
            if not self.in_process:
                options = self.latency + (["--no-byte-interface"] if self.block_only else [])
                mount_alignfs(["--ssd", self.image, "--fast", self.dram], self.mnt, options, self.work / f"{self.slug}.log")
                self.transport = mount_transport(self.mnt)
        return self.mnt

    def remove(self) -> None:
        if self.name in EXT4:
            run(["umount", self.mnt], check=False)
            if self.loop:
                run(["losetup", "-d", self.loop], check=False)
                self.loop = ""
            (self.work / "ext4.img").unlink(missing_ok=True)
            if self.name == "ext4-mssd":
                self.exporter.stop()
                self.image.unlink(missing_ok=True)
                self.dram.unlink(missing_ok=True)
        else:
            if not self.in_process:
                umount_alignfs(self.mnt)
            self.image.unlink(missing_ok=True)
            self.dram.unlink(missing_ok=True)

    def counters(self) -> dict:
        """Cumulative host-to-device write bytes and where they went."""
        if self.in_process:
            return {}
        if self.name == "ext4":
            os.sync()
            dev = Path(self.loop).name
            sectors = int(Path(f"/sys/block/{dev}/stat").read_text().split()[6])
            return {"host_write": sectors * 512, "journal": jbd2_logged_bytes(dev)}
        if self.name == "ext4-mssd":
            os.sync()
            device = self.exporter.stats()
            return {**device_traffic(device), "journal": jbd2_logged_bytes(Path(self.loop).name)}
        report = json.loads(run([ALIGNFS, "stat", self.mnt, "--json"]))
        c = dict(report["counters"])
        device = {d["name"]: d["value"] for d in report["device_counters"]}
        return {**device_traffic(device), "data": c["ssd_write_bytes"] + c["page_write_bytes"] + c["upage_write_bytes"]}


# The fixed metadata in dumpe2fs's per-group lines, and the journal's extents in debugfs's.
EXT4_GROUP_METADATA = re.compile(r"(?:superblock|Group descriptors|Reserved GDT blocks|Block bitmap|Inode bitmap|Inode table) at (\d+)(?:-(\d+))?")
EXT4_EXTENT = re.compile(r"\((?:ETB\d+|\d+(?:-\d+)?)\):(\d+)(?:-(\d+))?")


def ext4_metadata_ranges(size: str, mkfs_options: list, work: Path) -> str:
    """Where ext4 keeps its fixed metadata on a device of `size`, as the byte ranges
    `export-device --metadata-ranges` reads: superblocks and group descriptors with their
    reserve, bitmaps, inode tables and the journal. mkfs places them from the size and
    options alone, so a scratch file of the same size shows where they will be. Directory
    and extent blocks are allocated among the data and count as data there (their copies
    in the journal count as metadata)."""
    scratch = work / "ext4-layout.img"
    scratch.unlink(missing_ok=True)
    run(["truncate", "-s", size, scratch])
    try:
        run(["mkfs.ext4", "-q", "-F", *mkfs_options, scratch])
        groups = run(["dumpe2fs", scratch])
        journal = run(["debugfs", "-R", "stat <8>", scratch])
    finally:
        scratch.unlink(missing_ok=True)
    block = int(re.search(r"^Block size:\s+(\d+)", groups, re.M).group(1))
    blocks = [(int(a), int(b or a)) for a, b in EXT4_GROUP_METADATA.findall(groups)]
    blocks += [(int(a), int(b or a)) for a, b in EXT4_EXTENT.findall(journal.split("EXTENTS:")[-1])]
    if not blocks:
        raise RuntimeError("dumpe2fs and debugfs named no ext4 metadata")
    return "".join(f"{first * block} {(last + 1) * block}\n" for first, last in sorted(blocks))


def device_traffic(device: dict) -> dict:
    """What the emulated device counted: host traffic per interface, flash programs, and
    its write log's cleanings and the time stores waited for one."""
    return {
        "host_write": device["byte_store_bytes"] + device["block_write_bytes"],
        "byte_interface": device["byte_store_bytes"],
        "block_interface": device["block_write_bytes"],
        "flash_program": device["flash_program_bytes"],
        # Of those programs (and reads): the pages the system's layout names as metadata.
        "flash_metadata": device["flash_program_metadata_bytes"],
        "flash_read_metadata": device["flash_read_metadata_bytes"],
        # Of those programs: pages cleaning wrote back from the log, and pages garbage
        # collection moved; the rest are block writes sent straight to flash.
        "flash_cleaning": device["log_cleaned_pages"] * 4096,
        "flash_gc": device["gc_moves"] * 4096,
        "flash_read": device["flash_read_bytes"],
        "cleanings": device["log_cleanings"],
        "full_log_wait_us": device["log_full_wait_us"],
    }


def jbd2_logged_bytes(dev: str) -> int:
    """Bytes ext4's journal has logged since mount: transactions x logged blocks each."""
    info = Path(f"/proc/fs/jbd2/{dev}-8/info").read_text()
    transactions = int(re.search(r"^(\d+) transactions", info, re.M).group(1))
    logged = re.search(r"(\d+) logged blocks per transaction", info)
    return transactions * (int(logged.group(1)) if logged else 0) * 4096


# --- workloads: each returns (operations, seconds, bytes the application wrote) ------------

MICRO = r"""
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
fd = os.open(d, os.O_RDONLY)
start = time.monotonic()
for i in range(n):
    os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    os.fsync(fd)
    os.mkdir(f"{d}/d{i}")
    os.fsync(fd)
for i in range(n):
    os.unlink(f"{d}/f{i}")
    os.fsync(fd)
    os.rmdir(f"{d}/d{i}")
    os.fsync(fd)
print(time.monotonic() - start)
"""


def in_parallel(commands: list, env: dict) -> list:
    """Run the commands at once, one process each; their stdouts, in order."""
    full_env = dict(os.environ, **env)
    procs = [subprocess.Popen([str(c) for c in cmd], env=full_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for cmd in commands]
    outs = [p.communicate() for p in procs]
    for cmd, p, (_, err) in zip(commands, procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, cmd))} exited with {p.returncode}:\n{err[-2000:]}")
    return [out for out, _ in outs]


def thread_dirs(d: Path, args) -> list:
    """One directory per writer: with several, each works in its own (as ByteFS's threads
    each take their own files)."""
    if args.threads == 1:
        return [d]
    dirs = [d / f"t{k}" for k in range(args.threads)]
    for t in dirs:
        t.mkdir()
    return dirs


def micro(d: Path, args, env: dict) -> tuple[int, float, int]:
    """ByteFS's metadata micro workloads, each operation durable (fsync of the directory:
    what every alignfs operation already is); each writer runs them in its own directory."""
    outs = in_parallel([[sys.executable, "-c", MICRO, t, str(args.ops)] for t in thread_dirs(d, args)], env)
    return 4 * args.ops * args.threads, max(float(o) for o in outs), 0


def macro_set(workload: str, d: Path, args, writer: int) -> list:
    mean_file, write_io = SHAPES[workload]
    return ["--workload", workload, "--dir", d, "--files", str(args.files), "--seed", str(SEED + writer),
            "--mean-file", str(mean_file), "--write-io", str(write_io)]


def macro_prepare(workload: str, d: Path, args, env: dict) -> None:
    """A file set per writer (each writer's own, as `thread_dirs`)."""
    in_parallel([[MACRO, "prepare", *macro_set(workload, t, args, k)] for k, t in enumerate(thread_dirs(d, args))], env)


def macro(workload: str, d: Path, args, env: dict) -> tuple[int, float, int]:
    dirs = [d] if args.threads == 1 else [d / f"t{k}" for k in range(args.threads)]
    outs = in_parallel([[MACRO, "run", *macro_set(workload, t, args, k), "--flows", str(args.flows), "--seconds", "600"]
                        for k, t in enumerate(dirs)], env)
    results = [json.loads(o) for o in outs]
    return sum(r["ops"] for r in results), max(r["seconds"] for r in results), sum(r["write_bytes"] for r in results)


def rocksdb(d: Path, args, env: dict) -> tuple[int, float, int]:
    start = time.monotonic()
    # db_bench's fillrandom: every thread puts --num keys.
    run(["db_bench", f"--db={d / 'db'}", "--benchmarks=fillrandom", f"--num={args.keys}", "--value_size=1024",
         "--sync=1", "--write_buffer_size=4194304", "--compression_type=none", f"--seed={SEED}", f"--threads={args.threads}"],
        env=env)
    # db_bench's keys are 16 bytes; every put reaches the WAL.
    puts = args.keys * args.threads
    return puts, time.monotonic() - start, puts * (16 + 1024)


def cell(system: System, workload: str, args) -> dict:
    d = system.make()
    try:
        env = system.env()
        if workload in SHAPES:
            macro_prepare(workload, d, args, env)
        before = system.counters()
        if workload == "micro":
            ops, seconds, app_write = micro(d, args, env)
        elif workload == "rocksdb":
            ops, seconds, app_write = rocksdb(d, args, env)
        else:
            ops, seconds, app_write = macro(workload, d, args, env)
        after = system.counters()
    finally:
        system.remove()
    delta = {k: after[k] - before[k] for k in after}
    transport = {"transport": system.transport} if system.transport else {}
    return {"system": system.name, "workload": workload, "ops": ops, "seconds": seconds, "ops_per_s": ops / seconds,
            "app_write": app_write, **transport, **delta}


# --- report ------------------------------------------------------------------------------


def median_cells(cells: list) -> dict:
    """(workload, system) -> medians of each numeric field over the rounds."""
    groups: dict = {}
    for c in cells:
        groups.setdefault((c["workload"], c["system"]), []).append(c)
    out = {}
    for key, cs in groups.items():
        fields = [k for k, v in cs[0].items() if isinstance(v, (int, float))]
        out[key] = {k: med(c[k] for c in cs) for k in fields}
        out[key]["rounds"] = len(cs)
        out[key]["ops_per_s_range"] = (min(c["ops_per_s"] for c in cs), max(c["ops_per_s"] for c in cs))
    return out


def per_op(m: dict, field: str) -> float | None:
    return m[field] / m["ops"] if field in m and m["ops"] else None


def fmt(v, unit: str = "") -> str:
    if v is None:
        return "—"
    if abs(v) >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:.1f}{unit}"


def report(medians: dict, meta: dict) -> str:
    lines = [
        "# ByteFS's measurements: byte, byte-journal, block-only, ext4, ext4 on the emulated device",
        "",
        f"{meta['date']}, {meta['rounds']} round(s), medians. Workload sizes: {meta['sizes']}; "
        f"{meta.get('threads', 1)} writer(s) per cell; device write log: {meta.get('device_log', 'the default')}; "
        f"flash latencies {meta.get('flash_latency', 1.0):g}× Table 4's; FTL write buffer: {meta.get('write_buffer', 'none')}.",
        "byte and block-only run on the emulated memory-semantic SSD with ByteFS's Table 4 latency model,",
        f"its flash image on {meta.get('flash', 'this disk')}, their mounts serving requests over",
        f"{meta.get('transport', 'a transport not recorded')};",
        "ext4-mssd runs on the same emulated device and model (a loop device over `alignfs export-device`,",
        "block writes cached in the device's DRAM); ext4 on a loop device over an image on this disk.",
        "Traffic is host-to-device write bytes per",
        "application operation; 'metadata' is, for byte systems, everything but whole data blocks and residue",
        "bytes, and for ext4 the journal's logged blocks (≈, from jbd2's averages; its checkpoint writes of",
        "the same metadata are in the total).",
        "",
        "Flash programs: all, then the share that went to metadata pages (byte's metadata area; ext4's",
        "superblocks, group descriptors, bitmaps, inode tables and journal, from its layout — its directory and",
        "extent blocks count as data), the share cleaning wrote back from the write log and the share garbage",
        "collection moved (the rest went straight from the block interface to flash). Flash reads likewise.",
        "",
        "| workload | system | ops/s [min–max] | application writes B/op | host→device B/op | byte interface | block interface | metadata B/op | data B/op | flash programs B/op | of them metadata / cleaning / gc | flash reads B/op (metadata) | total traffic ÷ byte's | log cleanings | waited on a full log |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload in WORKLOADS:
        base = medians.get((workload, "byte"))
        for system in SYSTEMS:
            m = medians.get((workload, system))
            if not m:
                continue
            total = per_op(m, "host_write")
            meta_bytes = per_op(m, "journal") if system in EXT4 else (m["host_write"] - m["data"]) / m["ops"]
            data = None if system in EXT4 else per_op(m, "data")
            ratio = total / per_op(base, "host_write") if base and per_op(base, "host_write") else None
            lo, hi = m["ops_per_s_range"]
            waited = f"{m['full_log_wait_us'] / 1e6 / m['seconds'] * 100:.1f} %" if "full_log_wait_us" in m and m["seconds"] else "—"
            cleanings = fmt(m["cleanings"]) if "cleanings" in m else "—"
            split, reads = "—", "—"
            if m.get("flash_program") and "flash_cleaning" in m:
                shares = [m.get("flash_metadata"), m["flash_cleaning"], m["flash_gc"]]
                split = " / ".join("—" if v is None else f"{v / m['flash_program'] * 100:.0f} %" for v in shares)
            if "flash_read" in m:
                reads = fmt(per_op(m, "flash_read"))
                if m.get("flash_read") and "flash_read_metadata" in m:
                    reads += f" ({m['flash_read_metadata'] / m['flash_read'] * 100:.0f} %)"
            lines.append(
                f"| {workload} | {system} | {fmt(m['ops_per_s'])} [{fmt(lo)}–{fmt(hi)}] | {fmt(per_op(m, 'app_write'))} | {fmt(total)} | "
                f"{fmt(per_op(m, 'byte_interface'))} | {fmt(per_op(m, 'block_interface'))} | {fmt(meta_bytes)} | {fmt(data)} | "
                f"{fmt(per_op(m, 'flash_program'))} | {split} | {reads} | {fmt(ratio, '×')} | {cleanings} | {waited} |"
            )
    lines += ["", "## Against the issue's targets", ""]
    for workload in WORKLOADS:
        b, j, k, e, d = (medians.get((workload, s)) for s in SYSTEMS)
        if b and d:
            flash_b, flash_d = per_op(b, "flash_program"), per_op(d, "flash_program")
            if flash_b:
                flash = f"programs {flash_d / flash_b:.1f}× byte's flash bytes"
            elif flash_d:
                flash = f"programs {fmt(flash_d)} flash B/op where byte programs none"
            else:
                flash = "neither programs flash (their logs never cleaned)"
            lines.append(
                f"- {workload}, on the same device: byte runs at {b['ops_per_s'] / d['ops_per_s']:.2f}× ext4-mssd's throughput; "
                f"ext4-mssd sends {per_op(d, 'host_write') / per_op(b, 'host_write'):.1f}× byte's host→device bytes and {flash} "
                f"({fmt(d.get('cleanings'))} and {fmt(b.get('cleanings'))} log cleanings)"
            )
        if not (b and k and e):
            continue
        traffic = per_op(e, "host_write") / per_op(b, "host_write") if per_op(b, "host_write") else float("inf")
        meta_b = (b["host_write"] - b["data"]) / b["ops"]
        meta_ratio = per_op(e, "journal") / meta_b if meta_b else float("inf")
        speed = b["ops_per_s"] / k["ops_per_s"]
        lines.append(
            f"- {workload}: ext4 writes {traffic:.1f}× byte's host→device bytes (metadata: ext4's journal alone "
            f"{meta_ratio:.1f}× byte's metadata); byte runs at {speed:.2f}× block-only's throughput"
        )
        if j:
            meta_j = (j["host_write"] - j["data"]) / j["ops"]
            lines.append(f"  - metadata in place: {meta_b:,.0f} B/op, against {meta_j:,.0f} with the journal and checkpoints; "
                         f"{b['ops_per_s'] / j['ops_per_s']:.2f}× the journal's throughput")
    if any((w, s) in medians for w in WORKLOADS for s in IN_PROCESS):
        lines += ["", "## In-process (LD_PRELOAD shim, no FUSE), on the modelled device", "",
                  "| workload | byte ops/s [min–max] | block-only ops/s [min–max] | byte ÷ block-only | through the mount |",
                  "| --- | --- | --- | --- | --- |"]
    for workload in WORKLOADS:
        b, k = (medians.get((workload, s)) for s in IN_PROCESS)
        mb, mk = (medians.get((workload, s)) for s in ("byte", "block-only"))
        if not (b and k):
            continue
        cells = [f"{fmt(m['ops_per_s'])} [{fmt(m['ops_per_s_range'][0])}–{fmt(m['ops_per_s_range'][1])}]" for m in (b, k)]
        mount = f"{mb['ops_per_s'] / mk['ops_per_s']:.2f}×" if mb and mk else "—"
        lines.append(f"| {workload} | {cells[0]} | {cells[1]} | {b['ops_per_s'] / k['ops_per_s']:.2f}× | {mount} |")
    lines += ["", "Targets (issue 21): metadata traffic ≥ 5× lower than ext4's on the micro workloads; total write",
              "traffic ≥ 2× lower on the macro ones; throughput with the latency model ≥ 1.5× block-only.",
              "Targets (issue 67), on the same device: throughput byte ÷ ext4 ≥ 2.0× on micro, ≥ 1.3× on each macro;",
              "flash write bytes ext4 ÷ byte ≥ 2.0× and host→device bytes ≥ 3× on average; stores waiting on a full log",
              "< 5 % of a cell's time.", ""]
    return "\n".join(lines)


def plot(out: Path, medians: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in WORKLOADS if any((w, s) in medians for s in SYSTEMS)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.16
    colors = {"byte": "#1f77b4", "byte-journal": "#2ca02c", "block-only": "#ff7f0e", "ext4": "#7f7f7f", "ext4-mssd": "#9467bd"}
    for i, system in enumerate(SYSTEMS):
        xs = [j + (i - (len(SYSTEMS) - 1) / 2) * width for j in range(len(workloads))]
        cells = [medians.get((w, system)) for w in workloads]
        total = [per_op(m, "host_write") or 0 if m else 0 for m in cells]
        # Metadata on top, hatched: for ext4 its journal, for the byte systems all but data.
        meta = [(per_op(m, "journal") if system in EXT4 else (m["host_write"] - m["data"]) / m["ops"]) if m else 0 for m in cells]
        rest = [t - mt for t, mt in zip(total, meta)]
        ax1.bar(xs, rest, width, label=f"{system}: data" if system not in EXT4 else f"{system}: data, checkpointed metadata", color=colors[system])
        ax1.bar(xs, meta, width, bottom=rest, color=colors[system], alpha=0.45, hatch="//", label=f"{system}: metadata" if system not in EXT4 else f"{system}: journal")
        if system != "ext4":
            speed = [medians[(w, system)]["ops_per_s"] if (w, system) in medians else 0 for w in workloads]
            ax2.bar([x + width / 2 for x in xs], speed, width, label=system, color=colors[system])
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    ax1.set_ylabel("host→device write bytes per operation (log)")
    ax1.set_title("write traffic")
    ax2.set_ylabel("operations/s (log)")
    ax2.set_title("throughput on the modelled device (Table 4)")
    fig.tight_layout()
    fig.savefig(out / "byte.png", dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--systems", default=",".join(SYSTEMS + IN_PROCESS), help="which systems to run (default: all)")
    p.add_argument("--ops", type=int, default=1000, help="micro: operations of each kind")
    p.add_argument("--files", type=int, default=2000, help="macro: files in the set")
    p.add_argument("--flows", type=int, default=2000, help="macro: flows run")
    p.add_argument("--keys", type=int, default=20000, help="rocksdb: keys put (sync=1)")
    p.add_argument("--device", default="2G", help="capacity of each file system's device (default 2G)")
    p.add_argument("--device-log", help="the device's write log (and ext4-mssd's block cache), e.g. 16M "
                   "(default: the device's, 1/32 of its capacity, at most 256M)")
    p.add_argument("--flash-latency", type=float, default=1.0, help="Table 4's flash latencies times this (default 1)")
    p.add_argument("--write-buffer", default="16M",
                   help="the device's FTL write buffer for block writes (default 16M, as on ByteFS's prototype, where its "
                   "Figure 6 runs; 0: none, every block write waits for its program, as on Table 4's emulator)")
    p.add_argument("--threads", type=int, default=1, help="writers per cell, each in its own directory (default 1)")
    p.add_argument("--flash-on-disk", action="store_true",
                   help="the byte systems' flash images on this disk (default /dev/shm, where the device takes Table 4's times)")
    p.add_argument("--quick", action="store_true", help="smoke run: one round of small workloads")
    p.add_argument("--out", type=Path)
    p.add_argument("--from", dest="from_dir", type=Path, help="rebuild the report from a results directory")
    args = p.parse_args()
    if args.from_dir:
        data = json.loads((args.from_dir / "results.json").read_text())
        medians = median_cells(data["cells"])
        (args.from_dir / "report.md").write_text(report(medians, data["meta"]))
        plot(args.from_dir, medians)
        print(report(medians, data["meta"]))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("bench/byte.py needs root (loop devices, mounts)")
    if not 1 <= args.threads <= 16:
        raise SystemExit("--threads must be 1–16")
    if args.quick:
        args.rounds, args.ops, args.files, args.flows, args.keys = 1, 100, 100, 100, 1000
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workload(s) {', '.join(sorted(unknown))}: one of {', '.join(WORKLOADS)}")
    chosen = [x for x in args.systems.split(",") if x]
    unknown = set(chosen) - set(SYSTEMS + IN_PROCESS)
    if unknown:
        raise SystemExit(f"unknown system(s) {', '.join(sorted(unknown))}: one of {', '.join(SYSTEMS + IN_PROCESS)}")
    if args.threads > 1 and set(chosen) & set(IN_PROCESS):
        # Each writer is a process of its own, and one volume opens in one process only.
        log("several writers run through the mounts only; the in-process systems are left out")
        chosen = [x for x in chosen if x not in IN_PROCESS]
    ensure_tools()
    enable_fuse_uring()
    run(["cargo", "build", "--release", "--locked", "-q", "--workspace"],
        capture=False)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = args.out or REPO / "bench" / "results" / f"{stamp}-byte{'-quick' if args.quick else ''}"
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": stamp,
        "rounds": args.rounds,
        "sizes": f"micro {args.ops} of each op, macro {args.files} files x {args.flows} flows, rocksdb {args.keys} keys",
        "device": args.device,
        "flash": "this disk" if args.flash_on_disk else "/dev/shm",
        "device_log": args.device_log or "the device's default (1/32 of it, at most 256M)",
        "flash_latency": args.flash_latency,
        "write_buffer": "none" if args.write_buffer == "0" else args.write_buffer,
        "threads": args.threads,
    }
    cells = []
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="alignfs-byte-") as tmp:
        work = Path(tmp)
        systems = [System(name, work, args) for name in SYSTEMS + IN_PROCESS if name in chosen]
        for round_no in range(args.rounds):
            for workload in workloads:
                # The first system rotates each round, so no system always runs first.
                first = round_no % len(systems)
                for system in systems[first:] + systems[:first]:
                    log(f"round {round_no + 1}/{args.rounds}: {workload} on {system.name}")
                    c = cell(system, workload, args)
                    traffic = f", {c['host_write'] / c['ops']:.0f} B/op to the device" if "host_write" in c else ""
                    log(f"  {c['ops_per_s']:.0f} ops/s{traffic}")
                    cells.append({**c, "round": round_no})
                    meta["transport"] = "; ".join(sorted({c["transport"] for c in cells if "transport" in c}))
                    (out / "results.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))
    medians = median_cells(cells)
    text = report(medians, meta)
    (out / "report.md").write_text(text)
    plot(out, medians)
    print(text)
    log(f"report: {out / 'report.md'}, plot: {out / 'byte.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
