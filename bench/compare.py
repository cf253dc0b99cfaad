#!/usr/bin/env python3
"""Five designs, one table: every alignfs profile and its peers on the same disk.

Each round runs every group once, and within a group every system takes its turn:

  engine    every profile in-process through the engine's file API (`alignfs bench
            --profiles all`): OrchFS's random overwrites, next to a buffered file on ext4
            and the device limit (O_DIRECT, rounded out to 4 KiB)
  files     the file-system profiles (orch, scrap, byte) through their FUSE mounts, ext4
            and the device limit: fio random overwrites of a prefilled file, fsync after each
  memlimit  WSBuffer's partial-page writes under a memory limit: scrap's daemon and ext4's
            writer in a memory cgroup capped at 70 % and 100 % of the bytes written
            (--scrap-mem = the cap less the daemon's own), and without a cap (4 GiB of
            scrap memory); each cell ends with an fsync, and uncapped once more without;
            caches dropped first; a 4 GiB file (--partial-file-size), as bench/scrap.py;
            each mount's first pass warms its memory (reported once, uncapped); and
            4 KiB-4 MiB random writes from 1, 2 and 4 writers, 2 GiB in all, the cap a
            fifth of that (WSBuffer Fig. 10a), ending with an fsync; and filebench's
            fileserver, webproxy (2 MiB files) and varmail (1 MiB) on 1 GiB file sets
            under a cap of 10, 20 and 50 % of the set (WSBuffer Fig. 12): ext4's
            workload, or scrap's workload and daemon together, in one cgroup of that
            share plus what the daemon needs besides its scrap memory
  macro     filebench's varmail, fileserver and createfiles (alignfs-macro), and RocksDB's
            fillrandom with every put synchronous (db_bench), on the mounts and ext4
  block     uhs over NBD against qemu-nbd (bench/uhs.py): 4 KiB and mixed writes, flushed
  blockfs   ext4 on the block volume (bench/uhs.py: nbdfuse + a loop device, uhs keeping
            ext4's packed metadata in its NVM zone) under varmail and fileserver, against
            ext4 on qemu-nbd and nbdkit
  objects   nvstore against Ceph BlueStore and one file per object on ext4
            (bench/nvstore.py): NVStore's unaligned appends and overwrites
  device    ByteFS's host-to-device write traffic (bench/byte.py): byte against the same
            emulated SSD without its byte interface and ext4 on the same emulated SSD's block
            interface (ext4-mssd, as ByteFS runs its baselines), on durable metadata
            operations, varmail and RocksDB; bytes per operation, lower is better

A profile that cannot run a group's front end shows "—" with the reason. Results go to
bench/results/DATE-compare/ (report.md, results.json, PNG plots); `--doc` writes the
decision guide (docs/COMPARE.md) from them, and `--from DIR` rebuilds both from a results
directory without measuring. Needs root (mounts, cgroups, cache drops, loop devices).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as mountbench  # noqa: E402  (fio and db_bench, shared with the mount benchmark)
import scrap as scrapbench  # noqa: E402  (its prefill)
from common import ALIGNFS, REPO, drop_caches, log, med, mount_alignfs, mount_transport, run, umount_alignfs  # noqa: E402

MACRO = REPO / "target" / "release" / "alignfs-macro"
PY = "/usr/bin/python3"  # Debian's: python3-rados (BlueStore) imports only there
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
PROFILES = ["orch", "scrap", "uhs", "nvstore", "byte"]
FILE_PROFILES = ["orch", "scrap", "byte"]
GROUPS = ["engine", "files", "memlimit", "macro", "block", "blockfs", "objects", "device"]
# Groups whose figure is a cost (bytes per operation): the smaller wins, and a ratio to a
# peer is the peer's figure over the profile's, so that above 1 still means better.
LOWER_IS_BETTER = {"device"}
MAX_PAGES = Path("/proc/sys/fs/fuse/max_pages_limit")
# What a scrap daemon holds besides its scrap memory: code, maps, IO buffers and the FUSE
# request buffers. Its peak was 68 MiB after 1 MiB writes to a 1 GiB file and 73 MiB to a
# 4 GiB one (--scrap-mem 8 MiB); with 64 MiB allowed, the cap killed it at 4 GiB. So 96 MiB.
DAEMON_BYTES = 96 * MIB
# Without a cap, scrap memory as bench/scrap.py gives it (the reference for scrap's headline):
# a 64 KiB write at any offset fills parts of up to three 32 KiB scrap pages, so a cell's
# pages outgrow its bytes, and with 1 GiB the cell ran at 260–406 MiB/s against 586–889.
# Memory is backed as it is used (plus the warmer's window), so the size costs nothing until then.
UNCAPPED_SCRAP_BYTES = 4 * GIB
# The same with several writers of up to 4 MiB: FUSE's request buffers (8 MiB each with
# fs.fuse.max_pages_limit 2048), the IO buffer pool (up to 64 MiB) and the writes in flight.
# With 96 MiB, two writers took the daemon to 208 MiB anonymous memory with 109 MiB of scrap
# memory, and the cap killed it.
WRITERS_DAEMON_BYTES = 160 * MIB

# Why a profile has no row in a group: its front end cannot run the workload at all.
NO_FILES = {
    "uhs": "a block volume: no files (ext4 on uhs is in bench/uhs.py)",
    "nvstore": "an object store: no files, and S3 has no partial overwrite",
}
ABSENT = {
    "engine": {},
    "files": NO_FILES,
    "macro": NO_FILES,
    "memlimit": dict(NO_FILES, orch="its residue is in persistent memory, not DRAM: nothing to cap",
                     byte="its residue is in the device's DRAM, not the host's: nothing to cap"),
    "block": {p: "`alignfs nbd` serves block volumes (uhs); the same IO in-process is in `engine`"
              for p in ["orch", "scrap", "nvstore", "byte"]},
    "blockfs": dict({p: "a file system of its own, not a block volume: the same workloads on it are in `macro`"
                     for p in ["orch", "scrap", "byte"]}, nvstore="an object store, not a block volume"),
    "objects": {p: "`alignfs s3` serves object stores (nvstore); the same IO in-process is in `engine`"
                for p in ["orch", "scrap", "uhs", "byte"]},
    "device": {p: "no device with a byte interface: its SSD traffic per byte written is in the other groups' traffic tables"
               for p in ["orch", "scrap", "uhs", "nvstore"]},
}
# The peer each group's ratios divide by, and the device limit where the group has one.
BEST_PEER = "best disk peer"  # the fastest of a group's peers in each workload
REFERENCE = {"engine": "ext4", "files": "ext4", "memlimit": "ext4", "macro": "ext4",
             "block": BEST_PEER, "blockfs": BEST_PEER, "objects": "ext4-files", "device": "ext4-mssd"}
LIMIT = {"engine": "limit", "files": "limit"}

# The decision guide's "why" and "costs", per profile.
MECHANISM = {
    "orch": "the sub-page residue goes to persistent memory and the aligned middle straight to the SSD, "
            "so no write reads before it writes (OrchFS)",
    "scrap": "partial pages wait in DRAM scrap pages and go out as whole pages, full ones first (WSBuffer's two-stage flush)",
    "uhs": "small writes land in an NVM buffer hashed by block, larger ones go straight to the volume (UHS)",
    "nvstore": "unaligned fragments become KV records instead of read-modify-written blocks (NVStore)",
    "byte": "sub-page updates are stores through the SSD's byte interface into its in-device write log (ByteFS)",
}
COSTS = {
    "orch": "persistent memory (here a tmpfs file) for pages and chunks; durable when a write returns",
    "scrap": "DRAM for the scrap buffer (--scrap-mem); durable at fsync, like ext4",
    "uhs": "an NVM buffer beside the block volume; durable when a write returns",
    "nvstore": "a KV store on a file system beside the SSD; durable when a write returns",
    "byte": "a memory-semantic SSD (byte interface, DRAM write log in the device); durable when a write returns",
}
# Each paper's headline workload here: (profile, group, workload, peer, the ratio the
# profile's own benchmark measured against that peer, and where).
HEADLINES = [
    ("orch", "files", "4KiB±10%, fsync each", "ext4", 3.91, "docs/BENCHMARKS.md, bench/run.py"),
    ("scrap", "memlimit", "64KiB±10% partial, no cap, no fsync", "ext4", 3.64, "docs/SCRAP.md, bench/scrap.py: 4 GiB file"),
    ("uhs", "block", "4k randwrite, flush each, 1 job, qd8", BEST_PEER, 4.16, "docs/UHS.md, bench/uhs.py"),
    ("nvstore", "objects", "append2k, 8 writers", "bluestore", 2.96, "docs/NVSTORE.md, bench/nvstore.py"),
    ("nvstore", "objects", "append2k, 1 writer", "bluestore", 4.32, "docs/NVSTORE.md, bench/nvstore.py"),
    ("byte", "device", "create/mkdir/unlink/rmdir, durable", "ext4-mssd", 146, "docs/BYTE.md, bench/byte.py: host-to-device bytes"),
    ("byte", "device", "varmail", "ext4-mssd", 3.66, "docs/BYTE.md, bench/byte.py: host-to-device bytes"),
]
# bench/byte.py's workloads in the device group, and their names here.
DEVICE_WORKLOADS = {"micro": "create/mkdir/unlink/rmdir, durable", "varmail": "varmail", "rocksdb": "RocksDB fillrandom sync=1"}




# --- memory cgroups ----------------------------------------------------------------------


class MemoryCap:
    """A memory cgroup capped at `limit` bytes: cgroup v2's memory.max where the memory
    controller is on a v2 hierarchy, else v1's memory.limit_in_bytes. `wrap(cmd)` runs a
    command inside it (its children too: a mount's daemon stays in)."""

    def __init__(self, name: str, limit: int):
        v2 = next((root for root in [Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")]
                   if (root / "cgroup.controllers").exists()
                   and "memory" in (root / "cgroup.controllers").read_text().split()), None)
        if v2 is not None:
            subtree = v2 / "cgroup.subtree_control"
            if "memory" not in subtree.read_text().split():
                subtree.write_text("+memory\n")
            self.dir, limit_file = v2 / name, "memory.max"
        elif Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists():
            self.dir, limit_file = Path("/sys/fs/cgroup/memory") / name, "memory.limit_in_bytes"
        else:
            raise SystemExit("bench/compare.py: no memory cgroup controller (v2 or v1) to cap memory with")
        self.dir.mkdir(exist_ok=True)
        (self.dir / limit_file).write_text(f"{limit}\n")
        self.limit = limit

    def wrap(self, cmd: list) -> list:
        return ["sh", "-c", f'echo $$ > {self.dir / "cgroup.procs"} && exec "$@"', "sh", *map(str, cmd)]

    def peak(self) -> int:
        for name in ["memory.peak", "memory.max_usage_in_bytes"]:
            if (self.dir / name).exists():
                return int((self.dir / name).read_text())
        return 0

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


# --- the file-system profiles through their mounts ----------------------------------------


class Mounts:
    """orch, scrap and byte volumes, each mounted (or not yet) under `work`."""

    def __init__(self, work: Path, shm: Path, ssd_bytes: int, fast_bytes: int, scrap_mem: int, scrap_ssd_bytes: int):
        self.work, self.shm, self.scrap_mem = work, shm, scrap_mem
        # What `alignfs stat` said of each mount's requests, for the report.
        self.transports: set[str] = set()
        self.devices = {
            "orch": ["--fast", shm / "orch-fast", "--ssd", work / "orch.img"],
            "scrap": ["--ssd", work / "scrap.img"],
            "byte": ["--fast", shm / "byte-dram", "--ssd", work / "byte.img"],
        }
        self.mkfs = {
            "orch": ["--fast", f"{shm / 'orch-fast'}:{fast_bytes}", "--ssd", f"{work / 'orch.img'}:{ssd_bytes}"],
            "scrap": ["--profile", "scrap", "--ssd", f"{work / 'scrap.img'}:{scrap_ssd_bytes}"],
            "byte": ["--profile", "byte", "--fast", shm / "byte-dram", "--ssd", f"{work / 'byte.img'}:{ssd_bytes}"],
        }

    def mnt(self, profile: str) -> Path:
        return self.work / "mnt" / profile

    def format(self, profile: str) -> None:
        run([ALIGNFS, "mkfs", "--force", *self.mkfs[profile]])

    def mount(self, profile: str, scrap_mem: int | None = None, cap: MemoryCap | None = None) -> Path:
        mnt = self.mnt(profile)
        extra = ["--scrap-mem", str(scrap_mem or self.scrap_mem)] if profile == "scrap" else []
        mount_alignfs(self.devices[profile], mnt, extra, self.work / f"{profile}.log", wrap=cap.wrap if cap else None)
        self.transports.add(mount_transport(mnt))
        return mnt

    def umount(self, profile: str) -> None:
        mnt = self.mnt(profile)
        # A daemon that died (an OOM kill under a cap) leaves a mount that only a lazy
        # unmount removes; umount_alignfs does that.
        if os.path.ismount(mnt):
            umount_alignfs(mnt)

    def settle(self, timeout: float = 120.0) -> None:
        """Wait until no mounted volume writes in the background (scrap's idle migration,
        the emulated device's log cleaning), so that the next group does not share the
        disk with work a previous cell left: `os.sync` writes back ext4 but does not
        reach a FUSE daemon (docs/SCRAP.md)."""
        os.sync()
        mounted = [p for p in FILE_PROFILES if os.path.ismount(self.mnt(p))]
        keys = ["ssd_write_bytes", "ssd_read_bytes", "flash_program_bytes"]

        def snapshot() -> dict:
            return {p: [self.counters(p).get(k, 0) for k in keys] for p in mounted}

        start, last = time.monotonic(), snapshot()
        while True:
            time.sleep(1.0)
            now = snapshot()
            if now == last:
                break
            if time.monotonic() - start > timeout:
                log(f"still writing in the background after {timeout:.0f} s: {', '.join(mounted)}")
                break
            last = now
        waited = time.monotonic() - start
        if waited > 1.5:
            log(f"waited {waited:.0f} s for the background writes of {', '.join(mounted)}")

    def counters(self, profile: str) -> dict:
        report = json.loads(run([ALIGNFS, "stat", self.mnt(profile), "--json"]))
        counters = dict(report["counters"])
        for c in report.get("device_counters") or []:
            counters[c["name"]] = c["value"]
        return counters


def traffic(before: dict, after: dict) -> dict:
    """Where the bytes a cell wrote went, per byte the application wrote."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    written = d.get("app_write_bytes", 0) or 1
    kv = sum(d.get(k, 0) for k in ["kv_block_bytes", "kv_fragment_bytes", "kv_onode_bytes", "kv_attr_bytes", "kv_name_bytes"])
    migrations = sum(d.get(k, 0) for k in ["migrations_watermark", "migrations_header_full", "migrations_fast_full",
                                           "migrations_full", "migrations_sync", "migrations_idle"])
    return {
        "app_write_bytes": d.get("app_write_bytes", 0),
        "ssd": d.get("ssd_write_bytes", 0) / written,
        "residue": (d.get("page_write_bytes", 0) + d.get("upage_write_bytes", 0)) / written,
        "kv": kv / written,
        "flash": d.get("flash_program_bytes", 0) / written,
        "migrations": migrations,
    }


def fio_cell(file: Path, size: int, system: str, lo: int, hi: int, durable: bool, seconds: float, seed: int) -> dict:
    env = {"FILE": file, "SIZE": size, "RUNTIME": seconds, "SEED": seed,
           **mountbench.size_env(system, lo, hi), **mountbench.sync_env(system, durable)}
    return write_result(mountbench.fio_metrics(mountbench.fio("overwrite.fio", env), "write"))


def write_result(m: dict) -> dict:
    """A cell's result from fio's write metrics: MiB/s, and the p99 of the write or its fsync."""
    return {"value": m["mib_s"], "unit": "MiB/s", "p99_us": max(m["io_p99_us"], m["fsync_p99_us"])}


# --- the run ----------------------------------------------------------------------------


class Compare:
    def __init__(self, args):
        self.args = args
        self.records: list[dict] = []
        self.work = Path(tempfile.mkdtemp(prefix="alignfs-compare.", dir=args.work))
        self.shm = Path(tempfile.mkdtemp(prefix="alignfs-compare.", dir="/dev/shm"))
        q = args.quick
        self.seconds = 1.0 if q else args.seconds
        self.file_bytes = 64 * MIB if q else args.file_size
        self.cap_written = 128 * MIB if q else 384 * MIB  # bytes one memlimit cell writes
        self.threads_written = 256 * MIB if q else 2 * GIB  # bytes one memlimit writers cell writes
        self.partial_bytes = 64 * MIB if q else args.partial_file_size  # the file memlimit writes into
        ssd_bytes = max(4 * self.file_bytes, self.file_bytes + GIB)
        self.mounts = Mounts(self.work, self.shm, ssd_bytes, 256 * MIB if q else GIB, 256 * MIB if q else GIB,
                             ssd_bytes + self.partial_bytes)
        self.ext4 = self.work / "ext4"
        self.limit = self.work / "limit"

    def record(self, group, workload, system, round_no, result, traffic_=None):
        rec = {"group": group, "workload": workload, "system": system, "round": round_no, **result}
        if traffic_ is not None:
            rec["traffic"] = traffic_
        self.records.append(rec)
        log(f"  round {round_no + 1} {group:8} {workload:38} {system:20} {result['value']:10.1f} {result['unit']}")

    def order(self, names: list, round_no: int) -> list:
        k = round_no % len(names)
        return names[k:] + names[:k]

    # engine: every profile in-process
    def engine(self, round_no: int) -> None:
        out = self.work / "engine.json"
        args = ["--quick"] if self.args.quick else ["--size", "256M", "--duration", str(self.seconds / 2)]
        run([ALIGNFS, "bench", "--profiles", "all", "--rounds", "1", "--no-reads", "--seed", str(42 + round_no),
             "--workloads", "4KiB±10%,1MiB±10%,1B-2MiB", "--dir", self.work / "engine", "--fast-dir", self.shm / "engine",
             "--json", out, *args])
        for r in json.loads(out.read_text()):
            system = {"plain": "ext4"}.get(r["system"], r["system"])
            workload = f"{r['workload']}, {'fsync each' if r['durable'] else 'one fsync at the end'}"
            # The counters are already the cell's deltas.
            t = traffic({}, r["counters"]) if r.get("counters") else None
            self.record("engine", workload, system, round_no, {"value": r["mib_s"], "unit": "MiB/s", "p99_us": r["p99_us"]}, t)

    FILE_WORKLOADS = [("4KiB±10%", 3687, 4505), ("1MiB±10%", 943719, 1153433), ("1B-2MiB", 1, 2 * MIB)]
    THREADS = [2, 4]  # one thread is the 1B-2MiB cell above

    # files: the mounts, ext4 and the limit
    def files(self, round_no: int) -> None:
        targets = {p: self.mounts.mnt(p) / "overwrite" for p in FILE_PROFILES}
        targets.update(ext4=self.ext4 / "overwrite", limit=self.limit / "overwrite")
        for i, (name, lo, hi) in enumerate(self.FILE_WORKLOADS):
            for system in self.order(list(targets), round_no):
                drop_caches()
                before = self.mounts.counters(system) if system in FILE_PROFILES else None
                result = fio_cell(targets[system], self.file_bytes, system, lo, hi, True, self.seconds, 42 + i + 100 * round_no)
                t = traffic(before, self.mounts.counters(system)) if before is not None else None
                self.record("files", f"{name}, fsync each", system, round_no, result, t)
        # The OrchFS paper's threads (Figure 14): 1 B–2 MiB, fsync each, each thread its own file.
        dirs = {system: file.parent / "threads" for system, file in targets.items()}
        for jobs in self.THREADS:
            for system in self.order(list(dirs), round_no):
                dirs[system].mkdir(parents=True, exist_ok=True)
                # Half the overwritten file's bytes in all, so that they fit beside it on every volume.
                env = {"DIR": dirs[system], "SIZE": self.file_bytes // (2 * jobs), "JOBS": jobs, "RUNTIME": self.seconds,
                       "SEED": 42 + jobs + 100 * round_no, **mountbench.size_env(system, 1, 2 * MIB),
                       **mountbench.sync_env(system, True)}
                # Lay the files out first, so that the counters and the timing cover only the run.
                run(["fio", "--thread", mountbench.FIO_DIR / "threads-own.fio", "--create_only=1"], env={k: str(v) for k, v in env.items()})
                drop_caches()
                before = self.mounts.counters(system) if system in FILE_PROFILES else None
                result = write_result(mountbench.fio_metrics(mountbench.fio("threads-own.fio", env), "write", jobs))
                t = traffic(before, self.mounts.counters(system)) if before is not None else None
                self.record("files", f"1B-2MiB, fsync each, {jobs} threads", system, round_no, result, t)
                shutil.rmtree(dirs[system])

    # memlimit: scrap and ext4 under one memory cap
    def memlimit(self, round_no: int) -> None:
        file = "partial"
        # scrap is mounted again inside each cap, with --scrap-mem to fit it.
        self.mounts.umount("scrap")
        # The cap as a share of the bytes a cell writes (None: no cap, the scrap buffer
        # larger than the cell), and whether the cell ends with an fsync. Without one,
        # both systems leave the data in memory: the scrap profile's own benchmark.
        for share, durable in ((0.7, True), (1.0, True), (None, True), (None, False)):
            cap_bytes = int(self.cap_written * share) if share else None
            label = (f"cap {share:.0%}" if share else "no cap") + ("" if durable else ", no fsync")
            for system in self.order(["scrap", "ext4"], round_no):
                cap = MemoryCap(f"alignfs-compare-{os.getpid()}-{system}", cap_bytes) if cap_bytes else None
                try:
                    if system == "scrap":
                        # The daemon's own memory (code, maps, FUSE buffers) is charged too.
                        scrap_mem = max(cap_bytes - DAEMON_BYTES, 8 * MIB) if cap_bytes else UNCAPPED_SCRAP_BYTES
                        target = self.mounts.mount("scrap", scrap_mem=scrap_mem, cap=cap) / file
                    else:
                        target = self.ext4 / file
                    # A first pass after mounting writes into scrap memory the daemon has
                    # never touched: a page fault per 4 KiB, which a long-running daemon
                    # has paid long before (docs/SCRAP.md). Every cell below is the second
                    # pass, as in bench/scrap.py's later rounds; the uncapped, unsynced
                    # cell's first pass is reported in a row of its own.
                    for pass_no, (size_name, size) in enumerate([("64KiB", 64 * KIB), ("64KiB", 64 * KIB), ("1MiB", MIB)]):
                        first_pass = pass_no == 0
                        lo, hi = int(size * 0.9), int(size * 1.1)
                        result, t = self.capped_write(system, target, cap, [
                            f"--randseed={7 + round_no + (1000 if first_pass else 0)}", f"--io_size={self.cap_written}",
                            f"--bsrange={lo}-{hi}", f"--end_fsync={int(durable)}"])
                        if first_pass and (share or durable):
                            continue
                        workload = f"{size_name}±10% partial, {label}" + (", first pass after mounting" if first_pass else "")
                        self.record("memlimit", workload, system, round_no, result, t)
                finally:
                    if system == "scrap":
                        self.mounts.umount("scrap")
                    if cap:
                        cap.remove()
        self.memlimit_writers(file, round_no)
        self.memlimit_macro(round_no)
        self.mounts.mount("scrap")

    def memlimit_writers(self, file: str, round_no: int) -> None:
        """WSBuffer's multi-threaded random writes (Fig. 10a) under a memory cap: 4 KiB–4 MiB
        at any offset from 1, 2 and 4 writers into one file, an fsync at the end, the cap a
        fifth of the bytes written (but never below what the daemon needs for itself)."""
        cap_bytes = max(self.threads_written // 5, WRITERS_DAEMON_BYTES + 32 * MIB)
        label = f"cap {cap_bytes / self.threads_written:.0%}"
        for system in self.order(["scrap", "ext4"], round_no):
            cap = MemoryCap(f"alignfs-compare-{os.getpid()}-{system}", cap_bytes)
            try:
                if system == "scrap":
                    target = self.mounts.mount("scrap", scrap_mem=cap_bytes - WRITERS_DAEMON_BYTES, cap=cap) / file
                else:
                    target = self.ext4 / file
                # One unmeasured writer first, as in the cells above: it warms a fresh mount.
                for writers, measured in ((1, False), (1, True), (2, True), (4, True)):
                    result, t = self.capped_write(system, target, cap, [
                        f"--randseed={11 + round_no}", f"--numjobs={writers}", "--group_reporting",
                        f"--io_size={self.threads_written // writers}", "--bsrange=4k-4m", "--end_fsync=1"])
                    if not measured:
                        continue
                    self.record("memlimit", f"4KiB-4MiB, {writers} writer{'s' if writers > 1 else ''}, {label}", system,
                                round_no, result, t)
            finally:
                if system == "scrap":
                    self.mounts.umount("scrap")
                cap.remove()

    def capped_write(self, system: str, target: Path, cap: MemoryCap | None, fio_args: list) -> tuple:
        """One fio job of random writes at any byte into `target`, after making the file
        durable and dropping the kernel's caches. The cap holds what keeps the written data
        in memory: ext4's writer (its page cache is charged to it) here, scrap's daemon
        (its scrap pages) where it was mounted. Returns the result to record and scrap's
        traffic (None for ext4)."""
        fd = os.open(target, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        drop_caches()
        before = self.mounts.counters("scrap") if system == "scrap" else None
        cmd = ["fio", "--name=w", f"--filename={target}", "--output-format=json", "--ioengine=psync", "--rw=randwrite",
               "--invalidate=0", "--randrepeat=1", f"--size={self.partial_bytes}", "--bs_unaligned=1", *fio_args]
        job = json.loads(run(cap.wrap(cmd) if cap and system == "ext4" else cmd))["jobs"][0]["write"]
        pct = {float(k): v / 1000 for k, v in job.get("clat_ns", {}).get("percentile", {}).items()}
        result = {"value": job["bw_bytes"] / MIB, "unit": "MiB/s", "p99_us": pct.get(99.0, 0.0),
                  "cap_bytes": cap.limit if cap else None, "cap_peak_bytes": cap.peak() if cap else None}
        return result, traffic(before, self.mounts.counters("scrap")) if before is not None else None

    # WSBuffer's Table 1 shapes for Fig. 12, scaled down from 10,000 files: files, mean
    # file size, write IO (reads are 1 MiB).
    CAPPED_MACRO = {"fileserver": (512, 2 * MIB, MIB), "webproxy": (512, 2 * MIB, MIB), "varmail": (1024, MIB, 64 * KIB)}

    def memlimit_macro(self, round_no: int) -> None:
        """Filebench under a memory cap of 10, 20 and 50 % of the file set (WSBuffer Fig. 12).
        Both systems get the same cap: ext4's workload runs in it (its page cache is charged
        to it); on scrap the workload and the daemon share it, the daemon's scrap memory
        being the share of the file set and the rest what the daemon needs besides."""
        scale = 16 if self.args.quick else 1
        for workload, (files, mean_file, write_io) in self.CAPPED_MACRO.items():
            files //= scale
            data_set = files * mean_file
            for system in self.order(["scrap", "ext4"], round_no):
                # scrap is mounted uncapped to prepare and clean up, and within each cap to run.
                scrap = system == "scrap"
                d = (self.mounts.mount("scrap") if scrap else self.ext4) / f"capped-{workload}"
                common = ["--workload", workload, "--dir", d, "--files", str(files), "--seed", str(7 + round_no),
                          "--mean-file", str(mean_file), "--write-io", str(write_io)]
                run([MACRO, "prepare", *common])
                if scrap:
                    self.mounts.umount("scrap")
                for share in (0.1, 0.2, 0.5):
                    cap_bytes = int(share * data_set) + WRITERS_DAEMON_BYTES
                    cap = MemoryCap(f"alignfs-compare-{os.getpid()}-{system}", cap_bytes)
                    try:
                        if scrap:
                            self.mounts.mount("scrap", scrap_mem=int(share * data_set), cap=cap)
                        drop_caches()
                        before = self.mounts.counters("scrap") if scrap else None
                        r = json.loads(run(cap.wrap([MACRO, "run", *common, "--seconds", str(self.seconds * 2)])))
                        t = traffic(before, self.mounts.counters("scrap")) if before is not None else None
                        self.record("memlimit", f"{workload}, cap {share:.0%} of {data_set // MIB} MiB", system, round_no,
                                    {"value": r["mib_per_s"], "unit": "MiB/s", "p99_us": r["flow_p99_us"],
                                     "cap_bytes": cap_bytes, "cap_peak_bytes": cap.peak()}, t)
                    finally:
                        if scrap:
                            self.mounts.umount("scrap")
                        cap.remove()
                if scrap:
                    self.mounts.mount("scrap")
                shutil.rmtree(d)
                if scrap:
                    self.mounts.umount("scrap")

    MACRO_FILES = {"varmail": 1000, "fileserver": 1000, "createfiles": 4000}

    # macro: filebench's personalities on the mounts and ext4
    def macro(self, round_no: int) -> None:
        dirs = {p: self.mounts.mnt(p) for p in FILE_PROFILES}
        dirs["ext4"] = self.ext4
        scale = 10 if self.args.quick else 1
        for workload, files in self.MACRO_FILES.items():
            for system in self.order(list(dirs), round_no):
                d = dirs[system] / f"macro-{workload}"
                common = ["--workload", workload, "--dir", d, "--files", str(files // scale), "--seed", str(7 + round_no)]
                run([MACRO, "prepare", *common])
                drop_caches()
                before = self.mounts.counters(system) if system in FILE_PROFILES else None
                r = json.loads(run([MACRO, "run", *common, "--seconds", str(self.seconds * 2)]))
                t = traffic(before, self.mounts.counters(system)) if before is not None else None
                if t is not None and r.get("ops"):
                    # Host-to-device bytes per operation: the byte interface's stores and
                    # block writes (byte), the SSD's writes (the others).
                    after = self.mounts.counters(system)
                    device = (after.get("byte_store_bytes", 0) - before.get("byte_store_bytes", 0)
                              + after.get("block_write_bytes", 0) - before.get("block_write_bytes", 0))
                    ssd = after.get("ssd_write_bytes", 0) - before.get("ssd_write_bytes", 0)
                    t["device_bytes_per_op"] = (device or ssd) / r["ops"]
                self.record("macro", workload, system, round_no,
                            {"value": r["ops_per_s"], "unit": "ops/s", "p99_us": r["flow_p99_us"]}, t)
                shutil.rmtree(d)
        self.rocksdb(dirs, round_no)

    # OrchFS's key-value workload, every put durable, run as bench/run.py runs it.
    ROCKSDB_KEYS = 20000

    def rocksdb(self, dirs: dict, round_no: int) -> None:
        keys = self.ROCKSDB_KEYS // 20 if self.args.quick else self.ROCKSDB_KEYS
        for system in self.order(list(dirs), round_no):
            d = dirs[system] / "rocksdb"
            before = self.mounts.counters(system) if system in FILE_PROFILES else None
            r = mountbench.parse_db_bench(run(mountbench.db_bench_cmd(d, "fillrandom", keys, 42 + round_no)))["fillrandom"]
            t = traffic(before, self.mounts.counters(system)) if before is not None else None
            self.record("macro", "RocksDB fillrandom, sync=1", system, round_no,
                        {"value": r["ops_per_s"], "unit": "ops/s", "p99_us": r["io_p99_us"]}, t)
            shutil.rmtree(d)

    # block: uhs.py's fio matrix, one round
    def block(self, round_no: int) -> None:
        out = self.work / f"block-{round_no}"
        cells = ["4k randwrite, flush each, 1 job, qd8", "4k+64k randwrite 1:1, flush each, 1 job, qd8", "4k randwrite, 1 job, qd8"]
        args = ["--quick"] if self.args.quick else ["--rounds", "1", "--seconds", str(int(self.seconds))]
        run([PY, REPO / "bench" / "uhs.py", "--transport", "unix", "--no-ext4", "--no-thresholds", "--no-migration",
             "--systems", "uhs+qemu-nbd cache=none+qemu-nbd writeback+nbdkit file cache=none", "--out", out, *args,
             *[x for c in cells for x in ("--cell", c)]])
        results = json.loads((out / "results.json").read_text())
        for cell, by_system in results["fio"].items():
            for system, rs in by_system.items():
                r = rs[0]
                self.record("block", cell, system, round_no, {"value": r["mib_s"], "unit": "MiB/s", "p99_us": r["p99"]})
        # uhs.py reads the counters offline, around its whole matrix: one figure for all cells.
        counters = results.get("counters", {}).get("uhs") or [{}]
        if counters[0]:
            self.records.append({"group": "block", "workload": "all cells above", "system": "uhs", "round": round_no,
                                 "traffic_only": True, "traffic": traffic({}, dict(counters[0]))})
        shutil.rmtree(out, ignore_errors=True)

    # blockfs: ext4 on the volume, bench/uhs.py, one round
    def blockfs(self, round_no: int) -> None:
        out = self.work / f"blockfs-{round_no}"
        q = self.args.quick
        args = ["--seconds", "1", "--volume-mib", "256"] if q else ["--seconds", str(int(self.seconds))]
        run([PY, REPO / "bench" / "uhs.py", "--transport", "unix", "--rounds", "1", "--no-fio", "--no-thresholds", "--no-migration",
             "--ext4-workloads", "varmail" if q else "varmail,fileserver",
             "--systems", "uhs+nbdkit file cache=none" if q else "uhs+qemu-nbd cache=none+nbdkit file cache=none",
             "--out", out, *args])
        for workload, by_system in json.loads((out / "results.json").read_text())["ext4"].items():
            for system, r in by_system.items():
                self.record("blockfs", f"{workload}, ext4 on the volume", system, round_no,
                            {"value": r["ops_per_s"], "unit": "ops/s", "p99_us": r["flow_p99_us"]})
        shutil.rmtree(out, ignore_errors=True)

    # objects: nvstore.py, one round
    def objects(self, round_no: int) -> None:
        out = self.work / f"objects-{round_no}"
        # Cells of at least 8 s, as nvstore.py's own (the headline's reference).
        seconds = max(self.seconds, 8.0)
        args = ["--quick"] if self.args.quick else ["--rounds", "1", "--seconds", str(seconds), "--device-size", "3G"]
        run([PY, REPO / "bench" / "nvstore.py", "--patterns", "append2k,random", "--jobs", "1,8", "--work", self.work / "nvstore",
             "--out", out, *args])
        for rec in json.loads((out / "results.json").read_text()):
            system = "nvstore" if rec["system"] == "alignfs" else rec["system"]
            for c in rec["cells"]:
                bytes_ = max(c["bytes"], 1)
                t = {"app_write_bytes": c["bytes"], "device": sum(c["traffic"].values()) / bytes_,
                     "device_metadata": c["traffic"].get("metadata", 0) / bytes_}
                self.record("objects", f"{rec['pattern']}, {rec['jobs']} writer{'s' if rec['jobs'] > 1 else ''}", system,
                            round_no, {"value": c["bytes"] / c["seconds"] / MIB, "unit": "MiB/s", "p99_us": 0.0}, t)
        shutil.rmtree(out, ignore_errors=True)

    # device: byte.py, one round (its in-process cells measure speed, not traffic: left out)
    def device(self, round_no: int) -> None:
        out = self.work / f"device-{round_no}"
        args = ["--quick"] if self.args.quick else ["--rounds", "1"]
        run([PY, REPO / "bench" / "byte.py", "--workloads", ",".join(DEVICE_WORKLOADS), "--systems", "byte,block-only,ext4-mssd",
             "--out", out, *args])
        for c in json.loads((out / "results.json").read_text())["cells"]:
            if c["system"] not in ("byte", "block-only", "ext4-mssd") or not c.get("ops"):
                continue
            self.record("device", DEVICE_WORKLOADS[c["workload"]], c["system"], round_no,
                        {"value": c["host_write"] / c["ops"], "unit": "host-to-device bytes per operation, lower is better",
                         "p99_us": 0.0})
        shutil.rmtree(out, ignore_errors=True)

    def setup(self, groups: list) -> None:
        for d in [self.ext4, self.limit]:
            d.mkdir(parents=True, exist_ok=True)
        if any(g in groups for g in ["files", "memlimit", "macro"]):
            for profile in FILE_PROFILES:
                self.mounts.format(profile)
                self.mounts.mount(profile)
            log(f"prefilling {self.file_bytes // MIB} MiB files")
            for target in [self.mounts.mnt(p) for p in FILE_PROFILES] + [self.ext4]:
                scrapbench.prefill(target / "overwrite", self.file_bytes)
            if "memlimit" in groups:
                log(f"prefilling {self.partial_bytes // MIB} MiB files for memlimit")
                scrapbench.prefill(self.mounts.mnt("scrap") / "partial", self.partial_bytes)
                scrapbench.prefill(self.ext4 / "partial", self.partial_bytes)
            # The limit writes with O_DIRECT into a preallocated file.
            run(["fallocate", "-l", str(self.file_bytes), self.limit / "overwrite"])

    def cleanup(self) -> None:
        for profile in FILE_PROFILES:
            self.mounts.umount(profile)
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.shm, ignore_errors=True)


# --- the report -------------------------------------------------------------------------


def summarize(records: list) -> dict:
    """{group: {workload: {system: {median, min, max, p99, traffic}}}} in the order measured."""
    out: dict = {}
    for r in records:
        if r.get("traffic_only"):
            continue
        cell = out.setdefault(r["group"], {}).setdefault(r["workload"], {}).setdefault(r["system"], {"runs": []})
        cell["runs"].append(r)
    for group in out.values():
        for systems in group.values():
            for cell in systems.values():
                runs = cell.pop("runs")
                values = [r["value"] for r in runs]
                cell.update(median=med(values), min=min(values), max=max(values), n=len(values), unit=runs[0]["unit"],
                            p99_us=med([r.get("p99_us", 0.0) for r in runs]))
                ts = [r["traffic"] for r in runs if r.get("traffic")]
                if ts:
                    cell["traffic"] = median_traffic(ts)
    return out


def median_traffic(ts: list) -> dict:
    return {k: med([t.get(k, 0) for t in ts]) for k in ts[0]}


def matrix_traffic(records: list, group: str) -> list:
    """Traffic measured around a whole group rather than per cell: [(label, system, traffic)]."""
    by: dict = {}
    for r in records:
        if r.get("traffic_only") and r["group"] == group:
            by.setdefault((r["workload"], r["system"]), []).append(r["traffic"])
    return [(w, s, median_traffic(ts)) for (w, s), ts in by.items()]


def systems_of(group: str, table: dict) -> list:
    """The group's columns: the five profiles (measured or absent) first, then its peers."""
    seen = []
    for systems in table.values():
        for s in systems:
            if s not in seen:
                seen.append(s)
    peers = [s for s in seen if s not in PROFILES]
    return [p for p in PROFILES if p in seen or p in ABSENT[group]] + peers


COUNTS = {"migrations", "device_bytes_per_op"}  # traffic figures that are counts, not ratios


def fmt(v: float) -> str:
    if v != v:
        return "—"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def ratio(cells: dict, system: str, peer: str, group: str) -> float:
    """How much better `system` does than `peer`: throughput over the peer's, or, in a
    group whose figure is a cost, the peer's cost over the system's."""
    lower = group in LOWER_IS_BETTER
    a = cells.get(system)
    if peer == BEST_PEER:
        peers = [c["median"] for s, c in cells.items() if s not in PROFILES and s != "limit"]
        b = {"median": (min if lower else max)(peers)} if peers else None
    else:
        b = cells.get(peer)
    if lower:
        a, b = b, a
    return a["median"] / b["median"] if a and b and b["median"] else float("nan")


def report(summary: dict, meta: dict, records: list) -> str:
    lines = ["# Five designs, one table", "",
             f"{meta['rounds']} round(s); {meta['seconds']} s cells; {meta['file_bytes'] // MIB} MiB files"
             + (f" ({meta['partial_bytes'] // MIB} MiB in memlimit)" if meta.get("partial_bytes") else "") + "; "
             f"seed 42 (+ round); {meta['date']}; `{meta['command']}`.",
             f"The mounts' requests: {meta.get('transport') or 'not recorded'}.",
             "Each cell: median over rounds [min–max]. Ratios divide medians from this run. "
             "\"—\": the profile's front end cannot run the workload (the reason is under the table).", ""]
    for f in meta.get("failures", []):
        lines += [f"**Round {f['round']} of `{f['group']}` failed** and is missing from its medians: "
                  f"`{f['error'].strip().splitlines()[-1] if f['error'].strip() else 'no message'}`", ""]
    for group in GROUPS:
        table = summary.get(group)
        if not table:
            continue
        systems = systems_of(group, table)
        unit = next(iter(next(iter(table.values())).values()))["unit"]
        ref, lim = REFERENCE[group], LIMIT.get(group)
        lines += [f"## {group} ({unit})", "", "| workload | " + " | ".join(systems) + " |", "|---" * (len(systems) + 1) + "|"]
        for workload, cells in table.items():
            row = []
            for s in systems:
                c = cells.get(s)
                row.append(f"{fmt(c['median'])} [{fmt(c['min'])}–{fmt(c['max'])}]" if c else "—")
            lines.append(f"| {workload} | " + " | ".join(row) + " |")
        measured = [s for s in systems if s in PROFILES and s not in ABSENT[group]]
        for peer in [p for p in [ref, lim] if p]:
            lines += ["", f"Ratio to {peer}:", "", "| workload | " + " | ".join(measured) + " |", "|---" * (len(measured) + 1) + "|"]
            for workload, cells in table.items():
                lines.append(f"| {workload} | " + " | ".join(fmt(ratio(cells, s, peer, group)) + "×" for s in measured) + " |")
        if group in LOWER_IS_BETTER:
            lines += ["", f"(A ratio is {ref}'s figure over the profile's: above 1, the profile costs less.)"]
        elif any(c.get("p99_us") for cells in table.values() for c in cells.values()):
            lines += ["", "p99 latency, µs (per operation: the write and its fsync, one macro flow, or one RocksDB put):", "",
                      "| workload | " + " | ".join(s for s in systems if s not in ABSENT[group]) + " |",
                      "|---" * (len([s for s in systems if s not in ABSENT[group]]) + 1) + "|"]
            for workload, cells in table.items():
                lines.append(f"| {workload} | " + " | ".join(fmt(cells[s]["p99_us"]) if s in cells else "—"
                                                             for s in systems if s not in ABSENT[group]) + " |")
        with_traffic = [(w, s, c["traffic"]) for w, cells in table.items() for s, c in cells.items() if c.get("traffic")]
        with_traffic += matrix_traffic(records, group)
        if with_traffic:
            keys = [k for k in ["ssd", "residue", "kv", "flash", "device", "device_metadata", "migrations", "device_bytes_per_op"]
                    if any(k in t for _, _, t in with_traffic)]
            lines += ["", "Write traffic per byte the application wrote, counted within the cell (residue merged "
                      "afterwards is not in it): to the SSD, to the residue store, to the KV store, flash programs "
                      "of the byte device, blocks merged (migrations), host-to-device bytes per operation (macro), "
                      "device bytes and metadata-device bytes (objects):", "", "| workload | system | " + " | ".join(keys) + " |",
                      "|---" * (len(keys) + 2) + "|"]
            for w, s, t in with_traffic:
                lines.append(f"| {w} | {s} | " + " | ".join(
                    "" if k not in t else f"{t[k]:.0f}" if k in COUNTS else fmt(t[k]) for k in keys) + " |")
        absent = [(p, ABSENT[group][p]) for p in systems if p in ABSENT[group]]
        if absent:
            lines += [""] + [f"- {p} —: {why}" for p, why in absent]
        lines.append("")
    lines += headline_lines(summary)
    return "\n".join(lines) + "\n"


def headline_lines(summary: dict) -> list:
    lines = ["## Each paper's headline workload", "",
             "Target: at least the ratio the profile's own benchmark measured, compared as the tables show them "
             "(to three significant figures at most).", "",
             "| profile | group | workload | ratio to | this run | its own benchmark | reached |", "|---|---|---|---|---|---|---|"]
    for profile, group, workload, peer, measured, where in HEADLINES:
        cells = summary.get(group, {}).get(workload, {})
        r = ratio(cells, profile, peer, group)
        own = f"{measured:.2f}× ({where})" if measured else where
        # At the precision shown: bytes per operation repeat to 0.1 %, and a target met in
        # every digit the report prints is met.
        reached = "—" if measured is None or r != r else ("yes" if float(fmt(r)) >= float(fmt(measured)) else "**no**")
        lines.append(f"| {profile} | {group} | {workload} | {peer} | {fmt(r)}× | {own} | {reached} |")
    return lines + [""]


def plot(out: Path, summary: dict, records: list) -> list:
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"orch": "#d62728", "scrap": "#ff7f0e", "uhs": "#9467bd", "nvstore": "#8c564b", "byte": "#e377c2"}
    made = []
    for group, table in summary.items():
        ref = REFERENCE[group]
        systems = [s for s in systems_of(group, table) if s not in ABSENT[group]]
        workloads = list(table)
        # A group of costs (bytes) has no latency: one panel.
        with_p99 = group not in LOWER_IS_BETTER
        fig, axes = plt.subplots(1, 2 if with_p99 else 1, figsize=(max(10 if with_p99 else 6, 2.2 * len(workloads) + 4), 4.5),
                                 squeeze=False)
        ax1, ax2 = axes[0][0], axes[0][1] if with_p99 else None
        width = 0.8 / max(len(systems), 1)
        for i, s in enumerate(systems):
            xs = [k + i * width for k in range(len(workloads))]
            ratios = [ratio(table[w], s, ref, group) for w in workloads]
            ax1.bar(xs, [r if r == r else 0 for r in ratios], width, label=s, color=colors.get(s))
            if ax2 is not None:
                p99 = [table[w][s]["p99_us"] if s in table[w] else 0 for w in workloads]
                ax2.bar(xs, [v if v > 0 else float("nan") for v in p99], width, label=s, color=colors.get(s))
        first = f"{ref}'s bytes ÷ the system's (log)" if group in LOWER_IS_BETTER else f"throughput ÷ {ref} (log)"
        panels = [(ax1, first)] + ([(ax2, "p99 latency, µs (log)")] if ax2 is not None else [])
        for ax, title in panels:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.tick_params(axis="y", which="minor", labelsize=6)
            ax.set_title(f"{group}: {title}")
            ax.set_xticks([k + 0.4 - width / 2 for k in range(len(workloads))])
            ax.set_xticklabels(workloads, rotation=20, ha="right", fontsize=7)
        ax1.axhline(1.0, color="black", linewidth=0.8)
        ax1.legend(fontsize=7)
        fig.tight_layout()
        name = f"{group}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)
    # Write traffic per byte written, every profile's cells together.
    rows = [(f"{g}: {w}", s, c["traffic"]) for g, table in summary.items() for w, cells in table.items()
            for s, c in cells.items() if c.get("traffic") and "ssd" in c["traffic"]]
    rows += [(f"block: {w}", s, t) for w, s, t in matrix_traffic(records, "block")]
    if rows:
        fig, ax = plt.subplots(figsize=(10, max(3, 0.28 * len(rows) + 1)))
        labels = [f"{s} · {w}" for w, s, _ in rows]
        left = [0.0] * len(rows)
        for key, color in [("ssd", "#1f77b4"), ("residue", "#ff7f0e"), ("kv", "#2ca02c")]:
            vals = [t.get(key, 0) for _, _, t in rows]
            ax.barh(labels, vals, left=left, label=key, color=color)
            left = [a + b for a, b in zip(left, vals)]
        # Flash programs happen inside the byte device, below the bytes the host wrote to
        # it: a mark, not a stacked segment.
        flash = [(y, t["flash"]) for y, (_, _, t) in enumerate(rows) if t.get("flash")]
        if flash:
            ax.plot([v for _, v in flash], [y for y, _ in flash], "k|", markersize=9, label="flash programs (byte)")
        # A few cells write tens of bytes per byte (scrap flushing a 256 KiB page per
        # fsynced 4 KiB write); the axis stops at 8 and those bars carry their total.
        axis_end = 8.0
        ax.set_xlim(0, min(max(left), axis_end) * 1.08)
        for y, total in enumerate(left):
            if total > axis_end:
                ax.text(axis_end * 1.07, y, f"{total:.0f}×", va="center", ha="right", fontsize=6, color="white")
        ax.set_xlabel("bytes written per application byte, within the cell")
        ax.tick_params(axis="y", labelsize=6)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "traffic.png", dpi=110)
        plt.close(fig)
        made.append("traffic.png")
    return made


def decision_guide(summary: dict, results_dir: str) -> str:
    """docs/COMPARE.md: for each workload, which profile won here, by how much and why."""
    lines = ["# Which design for which workload", "",
             f"Generated by `bench/compare.py --doc` from [`{results_dir}`](../{results_dir}/report.md); every "
             "number below is a median from that run on this machine (2 cores, one virtual disk, persistent "
             "memory emulated on tmpfs). Re-run it on yours: the ranking depends on the disk and the CPU.", "",
             "| group | workload | best profile | ÷ the best other system | ÷ the next profile | why |", "|---|---|---|---|---|---|"]
    for group in GROUPS:
        for workload, cells in summary.get(group, {}).items():
            lower = group in LOWER_IS_BETTER
            # Best first; `better(a, b)` is how many times a beats b.
            ranked = sorted(((c["median"], s) for s, c in cells.items() if s in PROFILES), reverse=not lower)
            peers = sorted(((c["median"], s) for s, c in cells.items() if s not in PROFILES and s != "limit"), reverse=not lower)
            if not ranked:
                continue

            def better(a: float, b: float) -> float:
                return (b / a if a else float("nan")) if lower else (a / b if b else float("nan"))

            best_v, best = ranked[0]
            nxt = f"{better(best_v, ranked[1][0]):.2f}× {ranked[1][1]}" if len(ranked) > 1 and ranked[1][0] else "— (the only one)"
            vs_peer, why = "—", MECHANISM[best]
            if peers and peers[0][0]:
                vs_peer = f"{better(best_v, peers[0][0]):.2f}× {peers[0][1]}"
                if better(best_v, peers[0][0]) < 1:
                    why = f"no profile beats {peers[0][1]} here" + (f"; {best} comes closest" if len(ranked) > 1 else "")
            lines.append(f"| {group} | {workload} | **{best}** | {vs_peer} | {nxt} | {why} |")
    lines += ["", "## What each costs", "", "| profile | needs, and when a write is durable |", "|---|---|"]
    lines += [f"| {p} | {COSTS[p]} |" for p in PROFILES]
    lines += ["", "## How to read it", "",
              "- `engine` runs every profile without its front end, so it isolates the design; the other groups add "
              "the front end a user would run (FUSE, NBD, S3 semantics) and that front end's own cost.",
              "- A profile absent from a group has no front end for that workload (the report says why).",
              "- `device` counts bytes, not speed: its ratios are the peer's bytes over the profile's, so above 1 "
              "the profile sends less to the device.",
              "- Ratios near 1 are within this machine's noise (single cells vary by ±20 %); the report gives every "
              "cell's spread over rounds.", ""]
    lines += headline_lines(summary)
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round, 1 s cells, small files (CI runs it)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="seconds per cell")
    p.add_argument("--file-size", type=mountbench.parse_size, default=GIB, help="the overwritten file (files)")
    p.add_argument("--partial-file-size", type=mountbench.parse_size, default=4 * GIB,
                   help="the file memlimit writes into (4 GiB, as bench/scrap.py, the reference for scrap's headline)")
    p.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated, from {','.join(GROUPS)}")
    p.add_argument("--work", type=Path, default=Path("/var/tmp"), help="directory on the disk under test")
    p.add_argument("--out", type=Path, default=None, help="results directory (default bench/results/DATE-compare)")
    p.add_argument("--doc", type=Path, default=None, help="also write the decision guide here (docs/COMPARE.md)")
    p.add_argument("--from", dest="source", type=Path, default=None, help="rebuild report, plots and --doc from this results directory")
    args = p.parse_args()
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    if unknown := [g for g in groups if g not in GROUPS]:
        p.error(f"unknown group(s) {unknown}; known: {GROUPS}")

    if args.source:
        if not (args.source / "results.json").is_file():
            p.error(f"{args.source} holds no results.json from bench/compare.py")
        data = json.loads((args.source / "results.json").read_text())
        out = args.source
    else:
        if os.geteuid() != 0:
            raise SystemExit("bench/compare.py: run as root (mounts, memory cgroups, cache drops, loop devices)")
        mountbench.ensure_tools()
        mountbench.enable_fuse_uring()
        log("building release binaries")
        run(["cargo", "build", "--release", "--locked", "-q", "--workspace"])
        rounds = 1 if args.quick else args.rounds
        stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
        out = args.out or REPO / "bench" / "results" / f"{stamp}-compare"
        cmp = Compare(args)
        failures: list[dict] = []
        started = time.monotonic()

        def save(rounds_done: int) -> dict:
            # After every group, so that a run cut short keeps what it measured.
            meta = {"date": stamp, "rounds": rounds_done, "seconds": cmp.seconds, "file_bytes": cmp.file_bytes,
                    "partial_bytes": cmp.partial_bytes,
                    "groups": groups, "minutes": round((time.monotonic() - started) / 60, 1), "failures": failures,
                    "transport": "; ".join(sorted(cmp.mounts.transports)),
                    "command": " ".join(["bench/compare.py", *sys.argv[1:]])}
            data = {"meta": meta, "records": cmp.records}
            out.mkdir(parents=True, exist_ok=True)
            (out / "results.json").write_text(json.dumps(data, indent=1))
            return data

        pages_before = MAX_PAGES.read_text().strip() if MAX_PAGES.exists() else None
        try:
            if pages_before is not None:
                MAX_PAGES.write_text("2048\n")  # writes of up to 8 MiB reach the engine whole (docs/FUSE.md)
            cmp.setup(groups)
            for round_no in range(rounds):
                for group in groups:
                    log(f"round {round_no + 1}/{rounds}: {group}")
                    try:
                        cmp.mounts.settle()
                        getattr(cmp, group)(round_no)
                    except Exception as e:  # one peer failing loses that group's round, not the run
                        log(f"round {round_no + 1}: {group} failed: {e}")
                        failures.append({"round": round_no + 1, "group": group, "error": str(e)[-2000:]})
                    save(round_no + 1)
        finally:
            cmp.cleanup()
            if pages_before is not None:
                MAX_PAGES.write_text(pages_before + "\n")
        data = save(rounds)
    summary = summarize(data["records"])
    text = report(summary, data["meta"], data["records"])
    try:
        plots = plot(out, summary, data["records"])
        text += "\nPlots: " + ", ".join(f"[{n}]({n})" for n in plots) + "\n"
    except ImportError:
        log("matplotlib is missing: no plots")
    (out / "report.md").write_text(text)
    print(text)
    if args.doc:
        rel = os.path.relpath(out, REPO)
        args.doc.write_text(decision_guide(summary, rel))
        log(f"decision guide: {args.doc}")
    log(f"report: {out / 'report.md'}")
    if failed := data["meta"].get("failures"):
        log(f"{len(failed)} group round(s) failed; see the top of the report")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
