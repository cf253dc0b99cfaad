#!/usr/bin/env python3
"""The benchmark: the OrchFS paper's workloads through the alignfs mount, the same engine
in-process under the LD_PRELOAD shim, ext4, a FUSE passthrough and the device's O_DIRECT
limit, interleaved in one run.

    bench/run.py                 # full run (about 40 minutes), report in bench/results/<date>/
    bench/run.py --quick         # smoke version (what CI runs)
    bench/run.py --groups overwrite,reads --rounds 5

See bench/README.md for what each system and workload is and how to read the report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import (ALIGNFS, REPO, drop_caches, enable_fuse_uring, install_missing, log, mount_transport,  # noqa: F401
                    need_matplotlib, run)

FIO_DIR = REPO / "bench" / "fio"
PASSTHROUGH = REPO / "target" / "release" / "alignfs-passthrough"
MACRO = REPO / "target" / "release" / "alignfs-macro"
PRELOAD = REPO / "target" / "release" / "libalignfs_preload.so"
SEED = 42
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# Write/read sizes of the paper's single-thread experiments: (name, min bytes, max bytes).
# Ranges use any byte as size and offset; the fixed sizes are written at multiples of
# themselves, as fio does by default.
SIZES = [
    ("1B-2MiB", 1, 2 * MIB),
    ("4KiB±10%", 3687, 4505),
    ("1MiB±10%", 943719, 1153433),
    ("32KiB", 32 * KIB, 32 * KIB),
    ("64KiB", 64 * KIB, 64 * KIB),
]
FS_SYSTEMS = ["alignfs", "preload", "ext4", "passthrough"]
ALL_SYSTEMS = ["alignfs", "preload", "ext4", "limit", "passthrough"]
GROUPS = ["overwrite", "reads", "threads", "macro", "rocksdb"]


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)i?B?", text.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (use e.g. 512M, 1G)")
    return int(m.group(1)) * {"": 1, "K": KIB, "M": MIB, "G": GIB}[m.group(2).upper()]


# --- setup ------------------------------------------------------------------------------


def ensure_tools() -> None:
    install_missing({"fio": "fio", "db_bench": "rocksdb-tools", "fusermount3": "fuse3"})
    need_matplotlib()


def build() -> None:
    log("building release binaries")
    run(["cargo", "build", "--release", "--locked", "-q", "--workspace"], capture=False)


@dataclass
class Systems:
    """Where each system keeps its files in this run."""

    work: Path
    fast: Path
    fast_size: int
    ssd_size: int
    cache: str = "reads"
    ring_threads: str = "pinned"
    dirs: dict = field(default_factory=dict)
    transport: str = "not mounted"

    def start(self) -> None:
        for d in ["ext4", "limit", "passthrough-src", "mnt/alignfs", "mnt/passthrough"]:
            (self.work / d).mkdir(parents=True, exist_ok=True)
        ssd = self.work / "ssd.img"
        run([str(ALIGNFS), "mkfs", "--fast", f"{self.fast}:{self.fast_size}", "--ssd", f"{ssd}:{self.ssd_size}"])
        # The preload system is a second volume of the same size: the mount holds the first.
        preload_fast, preload_ssd = Path(f"{self.fast}-preload"), self.work / "preload-ssd.img"
        run([str(ALIGNFS), "mkfs", "--fast", f"{preload_fast}:{self.fast_size}", "--ssd", f"{preload_ssd}:{self.ssd_size}"])
        self.preload_env = {
            "LD_PRELOAD": str(PRELOAD),
            "ALIGNFS_PREFIX": str(self.work / "preload"),
            "ALIGNFS_FAST": str(preload_fast),
            "ALIGNFS_SSD": str(preload_ssd),
        }
        run([str(ALIGNFS), "mount", "--fast", str(self.fast), "--ssd", str(ssd), "--cache", self.cache,
             "--ring-threads", self.ring_threads, "--log", str(self.work / "alignfs.log"), str(self.work / "mnt/alignfs")])
        self.transport = mount_transport(self.work / "mnt/alignfs")
        log(f"alignfs mount: {self.transport}")
        with open(self.work / "passthrough.log", "w") as log_file:
            subprocess.Popen(
                [str(PASSTHROUGH), "--source", str(self.work / "passthrough-src"), "--ring-threads", self.ring_threads,
                 str(self.work / "mnt/passthrough")],
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
            )
        for _ in range(100):
            if os.path.ismount(self.work / "mnt/passthrough"):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the FUSE passthrough did not mount; see " + str(self.work / "passthrough.log"))
        self.dirs = {
            "alignfs": self.work / "mnt/alignfs",
            # Under the shim's prefix; the directory does not exist on the host.
            "preload": self.work / "preload",
            "ext4": self.work / "ext4",
            "limit": self.work / "limit",
            "passthrough": self.work / "mnt/passthrough",
        }

    def stop(self) -> None:
        if os.path.ismount(self.work / "mnt/alignfs"):
            run([str(ALIGNFS), "umount", str(self.work / "mnt/alignfs")], check=False)
        if os.path.ismount(self.work / "mnt/passthrough"):
            run(["fusermount3", "-u", str(self.work / "mnt/passthrough")], check=False)

    def alignfs_counters(self) -> dict:
        out = run([str(ALIGNFS), "stat", str(self.dirs["alignfs"]), "--json"])
        report = json.loads(out)
        return dict(report["counters"], fast_pages_used=report["fast_pages_used"], ssd_blocks_used=report["ssd_blocks_used"])

    def env(self, system: str) -> dict:
        """What a program needs in its environment to run on `system`."""
        return dict(self.preload_env) if system == "preload" else {}

    def remove(self, system: str, path: Path) -> None:
        """Remove a file or a tree; the preload system's only through the shim."""
        if system == "preload":
            run([sys.executable, "-c", REMOVE_TREE, str(path)], env=self.env(system))
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()

    def clear(self, system: str) -> None:
        """Remove everything a workload left in the system's directory."""
        if system == "preload":
            run([sys.executable, "-c", REMOVE_TREE, str(self.dirs[system]), "--keep-top"], env=self.env(system))
            return
        for child in self.dirs[system].iterdir():
            self.remove(system, child)


# Removes a tree by path (argv[1]); with --keep-top only what is inside it. Runs under the
# shim, so it sticks to calls the shim covers.
REMOVE_TREE = """
import os, sys
def remove(p, keep=False):
    if os.path.isdir(p):
        for name in os.listdir(p):
            remove(os.path.join(p, name))
        if not keep:
            os.rmdir(p)
    elif os.path.exists(p):
        os.unlink(p)
remove(sys.argv[1], keep="--keep-top" in sys.argv)
"""


def counter_delta(before: dict, after: dict) -> dict:
    d = {k: after[k] - before.get(k, 0) for k in after}
    written = d["app_write_bytes"] or 1
    direct = d["ssd_write_bytes"] - d["migration_write_bytes"]
    return {
        "app_write_bytes": d["app_write_bytes"],
        "to_ssd_share": direct / written,
        "to_fast_share": (d["page_write_bytes"] + d["upage_write_bytes"]) / written,
        "ssd_ios": {k[len("ssd_io_") :]: d[k] for k in ["ssd_io_le_4k", "ssd_io_le_32k", "ssd_io_le_128k", "ssd_io_le_1m", "ssd_io_gt_1m"]},
        "fg_rmw_reads": d["fg_rmw_reads"],
        "migrations": d["migrations_watermark"] + d["migrations_header_full"] + d["migrations_fast_full"],
        "migration_write_bytes": d["migration_write_bytes"],
        "ssd_read_bytes": d["ssd_read_bytes"],
        "app_read_bytes": d["app_read_bytes"],
        "ssd_flushes": d["ssd_flushes"],
        "fast_pages_used": after["fast_pages_used"],
    }


# --- fio --------------------------------------------------------------------------------


def size_env(system: str, lo: int, hi: int) -> dict:
    """fio's size settings. The limit system writes the same ranges rounded out to 4 KiB
    with O_DIRECT: the most the disk can do for that request stream."""
    if system == "limit":
        lo4 = max(4 * KIB, lo // (4 * KIB) * 4 * KIB)
        hi4 = max(lo4, -(-hi // (4 * KIB)) * 4 * KIB)
        return {"BSRANGE": f"{lo4}-{hi4}", "UNALIGNED": "0", "DIRECT": "1"}
    unaligned = "1" if lo != hi else "0"
    return {"BSRANGE": f"{lo}-{hi}", "UNALIGNED": unaligned, "DIRECT": "0"}


def sync_env(system: str, durable: bool) -> dict:
    if not durable:
        return {"FSYNC": "0", "FDATASYNC": "0"}
    # The device limit is O_DIRECT + fdatasync; file systems get fsync=1 as in the paper.
    return {"FSYNC": "0", "FDATASYNC": "1"} if system == "limit" else {"FSYNC": "1", "FDATASYNC": "0"}


def fio(job: str, env: dict) -> dict:
    # Threads, not processes, for every system: a forked job could not use the preload
    # system's volume, which belongs to the process that opened it.
    out = run(["fio", "--thread", str(FIO_DIR / job), "--output-format=json"], env={k: str(v) for k, v in env.items()})
    # fio may print warnings before the JSON document.
    return json.loads(out[out.index("{") :])


def fio_metrics(result: dict, direction: str, jobs: int = 1) -> dict:
    job = result["jobs"][0]
    side = job[direction]
    runtime_s = max(side["runtime"], 1) / 1000
    ios = side["total_ios"]
    clat = side.get("clat_ns", {})
    percentiles = {float(k): v / 1000 for k, v in clat.get("percentile", {}).items()}
    sync = job.get("sync", {}).get("lat_ns", {})
    sync_pct = {float(k): v / 1000 for k, v in sync.get("percentile", {}).items()}
    return {
        "mib_s": side["bw_bytes"] / MIB,
        "iops": side["iops"],
        # Wall time per operation as one thread sees it, fsync included.
        "op_mean_us": runtime_s * 1e6 * jobs / ios if ios else 0.0,
        "io_mean_us": clat.get("mean", 0) / 1000,
        "io_p99_us": percentiles.get(99.0, 0.0),
        "fsync_p99_us": sync_pct.get(99.0, 0.0),
        "cdf_us": sorted(percentiles.items()),
        "fsync_cdf_us": sorted(sync_pct.items()),
    }


def read_bw_log(prefix: Path) -> list:
    logs = sorted(prefix.parent.glob(prefix.name + "_bw*.log"))
    series = []
    for line in logs[0].read_text().splitlines() if logs else []:
        t_ms, kib_s = (int(x) for x in line.split(",")[:2])
        series.append((t_ms / 1000, kib_s / KIB))
    for f in logs:
        f.unlink()
    return series


# --- the benchmark ----------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    systems: Systems
    cells: list = field(default_factory=list)

    def order(self, names: list[str], round_no: int) -> list[str]:
        """A B C D in round 1, B C D A in round 2, …: no system always goes first."""
        k = round_no % len(names)
        return names[k:] + names[:k]

    def record(self, group: str, workload: str, system: str, round_no: int, metrics: dict, counters: dict | None) -> None:
        cell = {"group": group, "workload": workload, "system": system, "round": round_no, **metrics}
        if counters is not None:
            cell["alignfs_counters"] = counters
        self.cells.append(cell)
        unit = f"{metrics['mib_s']:8.1f} MiB/s" if "mib_s" in metrics else f"{metrics.get('ops_per_s', 0):8.0f} ops/s"
        log(f"  round {round_no + 1} {group:9} {workload:28} {system:11} {unit}")

    def measured(self, system: str, fn):
        """Run fn() with caches dropped; for alignfs also take its counters around it."""
        drop_caches()
        before = self.systems.alignfs_counters() if system == "alignfs" else None
        metrics = fn()
        counters = counter_delta(before, self.systems.alignfs_counters()) if before is not None else None
        return metrics, counters

    def data_file(self, system: str, name: str) -> Path:
        return self.systems.dirs[system] / name

    def prefill(self, system: str, path: Path, lo: int, hi: int) -> None:
        fio("prefill.fio", {"FILE": path, "SIZE": self.args.size, "SEED": SEED, **size_env(system, lo, hi), **self.systems.env(system)})

    def overwrite(self, round_no: int) -> None:
        for system in ALL_SYSTEMS:
            self.prefill(system, self.data_file(system, "overwrite.dat"), MIB, MIB)
        for durable in (True, False):
            for name, lo, hi in self.args.sizes:
                workload = f"{name} {'fsync' if durable else 'no fsync'}"
                for system in self.order(ALL_SYSTEMS, round_no):
                    env = {"FILE": self.data_file(system, "overwrite.dat"), "SIZE": self.args.size, "RUNTIME": self.args.runtime, "SEED": SEED}
                    env.update(size_env(system, lo, hi), **sync_env(system, durable), **self.systems.env(system))
                    metrics, counters = self.measured(system, lambda env=env: fio_metrics(fio("overwrite.fio", env), "write"))
                    self.record("overwrite", workload, system, round_no, metrics, counters)
        for system in ALL_SYSTEMS:
            self.systems.remove(system, self.data_file(system, "overwrite.dat"))

    def reads(self, round_no: int) -> None:
        for name, lo, hi in self.args.sizes:
            for system in self.order(ALL_SYSTEMS, round_no):
                path = self.data_file(system, "read.dat")
                self.prefill(system, path, lo, hi)
                bwlog = self.systems.work / "bwlog"
                env = {"FILE": path, "SIZE": self.args.size, "RUNTIME": self.args.runtime, "SEED": SEED, "BWLOG": bwlog}
                env.update(size_env(system, lo, hi), **self.systems.env(system))
                metrics, counters = self.measured(system, lambda env=env: fio_metrics(fio("randread.fio", env), "read"))
                metrics["over_time"] = read_bw_log(bwlog)
                self.record("reads", f"{name} randread", system, round_no, metrics, counters)
                self.systems.remove(system, path)

    def threads(self, round_no: int) -> None:
        lo, hi = SIZES[0][1], SIZES[0][2]
        for jobs in self.args.thread_counts:
            for layout in ("own", "shared"):
                workload = f"{jobs} thread{'s' if jobs > 1 else ''}, {layout} file{'s' if layout == 'own' else ''}"
                for system in self.order(ALL_SYSTEMS, round_no):
                    d = self.systems.dirs[system]
                    size = self.args.size // jobs if layout == "own" else self.args.size
                    env = {"DIR": d, "FILE": d / "shared.dat", "SIZE": size, "JOBS": jobs, "RUNTIME": self.args.runtime, "SEED": SEED}
                    env.update(size_env(system, lo, hi), **sync_env(system, True), **self.systems.env(system))
                    job = f"threads-{layout}.fio"
                    # Lay the files out first so the counters and the timing cover only the run.
                    run(["fio", "--thread", str(FIO_DIR / job), "--create_only=1"], env={k: str(v) for k, v in env.items()})
                    metrics, counters = self.measured(system, lambda env=env, job=job: fio_metrics(fio(job, env), "write", jobs))
                    self.record("threads", workload, system, round_no, metrics, counters)
                    self.systems.clear(system)

    def macro(self, round_no: int) -> None:
        for workload, files in self.args.macro_files.items():
            for system in self.order(FS_SYSTEMS, round_no):
                d = self.systems.dirs[system] / workload
                common = ["--workload", workload, "--dir", str(d), "--files", str(files), "--seed", str(SEED)]
                env = self.systems.env(system)
                run([str(MACRO), "prepare", *common], env=env)

                def go(common=common, env=env):
                    r = json.loads(run([str(MACRO), "run", *common, "--seconds", str(self.args.runtime)], env=env))
                    r["cdf_us"] = r.pop("flow_percentiles_us")
                    return r

                metrics, counters = self.measured(system, go)
                self.record("macro", workload, system, round_no, metrics, counters)
                self.systems.remove(system, d)

    def rocksdb(self, round_no: int) -> None:
        for system in self.order(FS_SYSTEMS, round_no):
            d = self.systems.dirs[system] / "rocksdb"

            def go(d=d, env=self.systems.env(system)):
                return parse_db_bench(run(db_bench_cmd(d, ROCKSDB_BENCHMARKS, self.args.rocksdb_keys, SEED), env=env))

            results, counters = self.measured(system, go)
            for bench_name, metrics in results.items():
                self.record("rocksdb", bench_name, system, round_no, metrics, counters if bench_name == "fillrandom" else None)
            shutil.rmtree(d, ignore_errors=True)


# readrandom runs twice. First straight after the writes, as an application would read, on
# whatever tables the compactions have left so far: that shape depends on how fast each
# system wrote (seven tables on alignfs, three on ext4, in one run), so `tables`
# records how many the reads saw. Then after a full compaction, on the same one-table
# database on every system: the comparison of the file systems' reads.
ROCKSDB_BENCHMARKS = "fillrandom,overwrite,levelstats,readrandom,compact,levelstats,readrandom"


def db_bench_cmd(db: Path, benchmarks: str, keys: int, seed: int) -> list:
    """db_bench with every put synchronous, one thread. A fixed number of operations, so
    every system ends with the same database; small memtables so it lives in SST files,
    not in memory."""
    return [
        "db_bench",
        f"--db={db}",
        f"--benchmarks={benchmarks}",
        f"--num={keys}",
        f"--reads={keys}",
        "--write_buffer_size=4194304",
        "--cache_size=8388608",
        "--value_size=1024",
        "--sync=1",
        f"--seed={seed}",
        "--compression_type=none",
        "--histogram=1",
        "--threads=1",
    ]


def parse_db_bench(out: str) -> dict:
    """ops/s and latency percentiles of each benchmark in db_bench's text output, `compact`
    left out. A benchmark run a second time is named `<name>-compacted` (ROCKSDB_BENCHMARKS);
    one after `levelstats` carries the table counts it printed (`tables`, `l0_tables`)."""
    results, current, levels, in_levels = {}, None, None, False
    for line in out.splitlines():
        if line.startswith("Level Files Size(MB)"):
            levels, in_levels = {}, True
            continue
        if in_levels:
            m = re.match(r"^\s*(\d+)\s+(\d+)\s+\d+\s*$", line)
            if m:
                levels[int(m.group(1))] = int(m.group(2))
            elif not line.startswith("---"):
                in_levels = False
            continue
        m = re.match(r"^(\w+)\s+:\s+([\d.]+) micros/op (\d+) ops/sec", line)
        if m:
            current = m.group(1) if m.group(1) not in results else m.group(1) + "-compacted"
            results[current] = {"ops_per_s": float(m.group(3)), "op_mean_us": float(m.group(2)), "cdf_us": []}
            if levels is not None:
                results[current].update(tables=sum(levels.values()), l0_tables=levels.get(0, 0))
                levels = None
            continue
        m = re.match(r"^Percentiles: (.*)", line)
        if m and current:
            pct = dict((float(k), float(v)) for k, v in re.findall(r"P([\d.]+): ([\d.]+)", m.group(1)))
            results[current]["cdf_us"] = sorted(pct.items())
            results[current]["io_p99_us"] = pct.get(99.0, 0.0)
    results.pop("compact", None)
    if not results:
        raise RuntimeError("db_bench printed no results:\n" + out[-2000:])
    return results


# --- report -----------------------------------------------------------------------------


def summarize(cells: list) -> list:
    """Median over rounds of each (group, workload, system), with the spread."""
    keyed: dict = {}
    for c in cells:
        keyed.setdefault((c["group"], c["workload"], c["system"]), []).append(c)
    rows = []
    for (group, workload, system), cs in keyed.items():
        metric = "mib_s" if "mib_s" in cs[0] else "ops_per_s"
        values = [c[metric] for c in cs]
        mid = sorted(cs, key=lambda c: c[metric])[len(cs) // 2]
        rows.append(
            {
                "group": group,
                "workload": workload,
                "system": system,
                "metric": metric,
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "rounds": len(values),
                "op_mean_us": statistics.median(c.get("op_mean_us", c.get("flow_mean_us", 0)) for c in cs),
                "p99_us": statistics.median(c.get("io_p99_us", c.get("flow_p99_us", 0)) for c in cs),
                "fsync_p99_us": statistics.median(c.get("fsync_p99_us", 0) for c in cs),
                "cdf_us": mid.get("cdf_us", []),
                "fsync_cdf_us": mid.get("fsync_cdf_us", []),
                "tables": [f"{c['tables']}/{c['l0_tables']}" for c in cs if "tables" in c],
                "over_time": mid.get("over_time", []),
                "alignfs_counters": mid.get("alignfs_counters"),
            }
        )
    return rows


# (group, workload) -> [(system measured, compared with, at least this ratio)].
TARGETS = {
    ("overwrite", "1B-2MiB fsync"): [("alignfs", "ext4", 1.3), ("alignfs", "limit", 0.8)],
    ("overwrite", "4KiB±10% fsync"): [("alignfs", "ext4", 4.0), ("preload", "ext4", 40.0)],
    ("overwrite", "1MiB±10% fsync"): [("alignfs", "ext4", 1.3)],
    ("overwrite", "1B-2MiB no fsync"): [("preload", "ext4", 1.3)],
    ("reads", "1MiB±10% randread"): [("alignfs", "ext4", 0.8)],
    ("rocksdb", "fillrandom"): [("alignfs", "ext4", 4.0)],
    ("rocksdb", "readrandom-compacted"): [("alignfs", "ext4", 0.8)],
    ("macro", "varmail"): [("alignfs", "ext4", 1.0)],
}


def ratio_table(rows: list) -> tuple[list, list]:
    by = {(r["group"], r["workload"], r["system"]): r for r in rows}
    workloads = []
    for r in rows:
        if (r["group"], r["workload"]) not in workloads:
            workloads.append((r["group"], r["workload"]))
    lines, targets = [], []
    for group, workload in workloads:
        a = by.get((group, workload, "alignfs"))
        if not a:
            continue

        def ratio(system, base="alignfs"):
            b, o = by.get((group, workload, base)), by.get((group, workload, system))
            return b["median"] / o["median"] if b and o and o["median"] else None

        ratios = {s: ratio(s) for s in ("ext4", "limit", "passthrough")}
        ratios["preload ÷ ext4"] = ratio("ext4", "preload")
        ratios["fuse tax"] = ratio("alignfs", "preload")
        lines.append((group, workload, a, ratios, {s: by.get((group, workload, s)) for s in ALL_SYSTEMS}))
        for system, base, want in TARGETS.get((group, workload), []):
            targets.append((workload, system, base, want, ratio(base, system)))
    return lines, targets


def fmt(v, digits=1):
    if v is None:
        return "–"
    if isinstance(v, float) and v >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}f}"


def write_report(out: Path, args, rows: list, meta: dict) -> None:
    lines, targets = ratio_table(rows)
    md = [f"# alignfs mount benchmark — {meta['date']}", ""]
    md += [
        f"Machine: {meta['machine']}. Command: `{meta['command']}`. {args.rounds} round(s), {args.runtime} s per cell, "
        f"files of {args.size // MIB} MiB, fast tier {args.fast_size // MIB} MiB (tmpfs), SSD image {args.ssd_size // MIB} MiB. "
        f"Wall time {meta['wall_minutes']:.1f} min. The alignfs mount's requests: {meta.get('transport', 'not recorded')}.",
        "",
        "Systems: **alignfs** = `orch` profile through FUSE; **ext4** = buffered files in a directory of the host ext4 on the same disk; "
        "**limit** = the same request sizes rounded out to 4 KiB, O_DIRECT (+ fdatasync when durable) on that ext4 — the device's ceiling; "
        "**passthrough** = a FUSE passthrough to that ext4 with alignfs's front-end settings (the FUSE tax); "
        "**preload** = the same engine on a second volume of the same size, in the benchmark program's own process through the LD_PRELOAD shim (no FUSE); "
        "`FUSE tax` = preload ÷ alignfs. "
        "Each figure is the median over rounds; `[min–max]` is the spread.",
        "",
    ]
    if targets:
        md += ["## Targets", "", "| workload | system | compared with | target | measured | met |", "| --- | --- | --- | --- | --- | --- |"]
        for workload, system, base, want, got in targets:
            md.append(f"| {workload} | {system} | {base} | ≥ {want}× | {fmt(got, 2)}× | {'yes' if got is not None and got >= want else '**no**'} |")
        md.append("")
    current = None
    for group, workload, a, ratios, cells in lines:
        if group != current:
            current = group
            unit = "MiB/s" if a["metric"] == "mib_s" else "ops/s"
            md += [
                "",
                f"## {group}",
                "",
                f"| workload | alignfs {unit} | preload | ext4 | limit | passthrough | ÷ ext4 | ÷ limit | ÷ passthrough | preload ÷ ext4 | FUSE tax | alignfs mean µs/op | alignfs p99 µs (io / fsync) | ext4 p99 µs (io / fsync) |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]

        def cell(system):
            c = cells.get(system)
            return f"{fmt(c['median'])} [{fmt(c['min'])}–{fmt(c['max'])}]" if c else "–"

        e = cells.get("ext4")
        md.append(
            f"| {workload} | {cell('alignfs')} | {cell('preload')} | {cell('ext4')} | {cell('limit')} | {cell('passthrough')} | "
            f"{fmt(ratios['ext4'], 2)} | {fmt(ratios['limit'], 2)} | {fmt(ratios['passthrough'], 2)} | "
            f"{fmt(ratios['preload ÷ ext4'], 2)} | {fmt(ratios['fuse tax'], 2)} | {fmt(a['op_mean_us'])} | "
            f"{fmt(a['p99_us'])} / {fmt(a['fsync_p99_us'])} | {fmt(e['p99_us']) if e else '–'} / {fmt(e['fsync_p99_us']) if e else '–'} |"
        )
    md += [
        "",
        "## alignfs traffic (Table 2 of the OrchFS paper, per cell; median round)",
        "",
        "`to SSD` = share of written bytes that went straight to the SSD; `to fast` = share written to fast pages and upage chunks; "
        "SSD write IOs by size (all SSD writes, migration included); `to SSD` counts zero blocks written for fallocate and for a truncate inside a block too, "
        "so it can pass 100 % (RocksDB preallocates its files); `rmw` = foreground read-modify-write reads (0 is the design); `migr.` = blocks merged back by migration.",
        "",
        "| group | workload | to SSD | to fast | SSD IOs ≤4K / ≤32K / ≤128K / ≤1M / >1M | rmw | migr. | SSD bytes read ÷ app bytes read |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        c = r["alignfs_counters"]
        if r["system"] != "alignfs" or not c:
            continue
        ios = " / ".join(str(c["ssd_ios"][k]) for k in ["le_4k", "le_32k", "le_128k", "le_1m", "gt_1m"])
        read_amp = c["ssd_read_bytes"] / c["app_read_bytes"] if c["app_read_bytes"] else None
        wrote = c["app_write_bytes"] > 0
        md.append(
            f"| {r['group']} | {r['workload']} | {fmt(100 * c['to_ssd_share']) + ' %' if wrote else '–'} | "
            f"{fmt(100 * c['to_fast_share']) + ' %' if wrote else '–'} | {ios} | {c['fg_rmw_reads']} | {c['migrations']} | {fmt(read_amp, 2)} |"
        )
    tables = {}
    for r in rows:
        if r["group"] == "rocksdb" and r["tables"]:
            tables.setdefault(r["workload"], []).append(f"{r['system']} {', '.join(r['tables'])}")
    if tables:
        md += ["", "## RocksDB tables each readrandom saw (per round: all / level 0)", ""]
        md += [f"- {workload}: {'; '.join(systems)}" for workload, systems in tables.items()]
    md += ["", "## Plots", ""]
    for png in sorted(out.glob("*.png")):
        md.append(f"![{png.stem}]({png.name})")
    (out / "report.md").write_text("\n".join(md) + "\n")


COLORS = {"alignfs": "#d62728", "preload": "#ff7f0e", "ext4": "#1f77b4", "limit": "#7f7f7f", "passthrough": "#2ca02c"}


def plot(out: Path, rows: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = []
    for r in rows:
        if r["group"] not in groups:
            groups.append(r["group"])
    for group in groups:
        rs = [r for r in rows if r["group"] == group]
        workloads = list(dict.fromkeys(r["workload"] for r in rs))
        systems = [s for s in ALL_SYSTEMS if any(r["system"] == s for r in rs)]
        fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(workloads)), 4))
        width = 0.8 / len(systems)
        for i, s in enumerate(systems):
            vals, lo, hi = [], [], []
            for w in workloads:
                r = next((r for r in rs if r["workload"] == w and r["system"] == s), None)
                vals.append(r["median"] if r else 0)
                lo.append(r["median"] - r["min"] if r else 0)
                hi.append(r["max"] - r["median"] if r else 0)
            xs = [x + i * width for x in range(len(workloads))]
            ax.bar(xs, vals, width, label=s, color=COLORS[s], yerr=[lo, hi], capsize=2)
        ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(workloads))])
        ax.set_xticklabels(workloads, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("MiB/s" if rs[0]["metric"] == "mib_s" else "ops/s")
        ax.set_title(f"{group}: throughput (median, min–max over rounds)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"throughput-{group}.png", dpi=110)
        plt.close(fig)

    # Latency CDFs of the durable overwrites (write call solid, fsync call dashed) and of
    # the macro flows.
    for group, pick in [("overwrite", lambda w: not w.endswith("no fsync")), ("macro", lambda w: True)]:
        rs = [r for r in rows if r["group"] == group and pick(r["workload"]) and r["cdf_us"]]
        workloads = list(dict.fromkeys(r["workload"] for r in rs))
        if not workloads:
            continue
        fig, axes = plt.subplots(1, len(workloads), figsize=(3.4 * len(workloads), 3.4), squeeze=False)
        for ax, w in zip(axes[0], workloads):
            for r in rs:
                if r["workload"] != w:
                    continue
                pts = r["cdf_us"]
                ax.plot([p[1] for p in pts], [p[0] for p in pts], marker=".", label=r["system"], color=COLORS[r["system"]])
                if r["fsync_cdf_us"]:
                    pts = r["fsync_cdf_us"]
                    ax.plot([p[1] for p in pts], [p[0] for p in pts], linestyle="--", color=COLORS[r["system"]])
            ax.set_xscale("log")
            ax.set_title(w, fontsize=9)
            ax.set_xlabel("µs" + (" (write solid, fsync dashed)" if group == "overwrite" else " (one flow)"), fontsize=8)
            ax.set_ylabel("percentile", fontsize=8)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"latency-cdf-{group}.png", dpi=110)
        plt.close(fig)

    rs = [r for r in rows if r["group"] == "reads" and r["over_time"]]
    workloads = list(dict.fromkeys(r["workload"] for r in rs))
    if workloads:
        fig, axes = plt.subplots(1, len(workloads), figsize=(3.2 * len(workloads), 3.2), squeeze=False)
        for ax, w in zip(axes[0], workloads):
            for r in rs:
                if r["workload"] == w:
                    ax.plot([p[0] for p in r["over_time"]], [p[1] for p in r["over_time"]], label=r["system"], color=COLORS[r["system"]])
            ax.set_title(w, fontsize=9)
            ax.set_xlabel("s", fontsize=8)
            ax.set_ylabel("MiB/s", fontsize=8)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "reads-over-time.png", dpi=110)
        plt.close(fig)


def verify(groups: list, args, cells: list, out: Path) -> list:
    """What a complete run must contain; returns the problems found."""
    expected = {
        "overwrite": 2 * len(args.sizes) * len(ALL_SYSTEMS),
        "reads": len(args.sizes) * len(ALL_SYSTEMS),
        "threads": 2 * len(args.thread_counts) * len(ALL_SYSTEMS),
        "macro": len(args.macro_files) * len(FS_SYSTEMS),
        "rocksdb": 4 * len(FS_SYSTEMS),
    }
    problems = []
    for group in groups:
        got = [c for c in cells if c["group"] == group]
        if len(got) != expected[group] * args.rounds:
            problems.append(f"{group}: {len(got)} cells, expected {expected[group] * args.rounds}")
        for c in got:
            value = c.get("mib_s", c.get("ops_per_s", 0))
            if not value > 0:
                problems.append(f"{group} / {c['workload']} / {c['system']}: throughput {value}")
            if c["system"] == "alignfs" and "alignfs_counters" not in c and not (group == "rocksdb" and c["workload"] != "fillrandom"):
                problems.append(f"{group} / {c['workload']}: no alignfs counters")
    for name in ["report.md", "results.json"] + [f"throughput-{g}.png" for g in groups]:
        if not (out / name).is_file():
            problems.append(f"{name} was not written")
    return problems


# --- main -------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: tiny files, 1 s cells, one round (CI)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--runtime", type=float, default=5, help="seconds per cell (default 5)")
    p.add_argument("--size", type=parse_size, default=GIB, help="file size per workload (default 1G)")
    p.add_argument("--fast-size", type=parse_size, default=GIB, help="alignfs fast tier (default 1G, in /dev/shm)")
    p.add_argument("--ssd-size", type=parse_size, default=8 * GIB, help="alignfs SSD image (default 8G)")
    p.add_argument("--cache", choices=["reads", "direct", "all"], default="reads",
                   help="the alignfs mount's page-cache mode (alignfs mount --cache; default reads)")
    p.add_argument("--ring-threads", choices=["pinned", "unpinned"], default="pinned",
                   help="where the alignfs and passthrough mounts' io_uring request threads run "
                        "(alignfs mount --ring-threads; default pinned)")
    p.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated subset of {','.join(GROUPS)}")
    p.add_argument("--out", type=Path, help="result directory (default bench/results/<date>)")
    p.add_argument("--work", type=Path, help="scratch directory on the disk under test (default /var/tmp)")
    p.add_argument("--no-build", action="store_true", help="use the binaries already in target/release")
    p.add_argument("--verify", action="store_true", help="exit 1 unless every cell ran and every file was written (CI)")
    args = p.parse_args()
    args.sizes, args.thread_counts = SIZES, [1, 2, 4]
    if args.quick:
        args.rounds, args.runtime, args.size, args.fast_size, args.ssd_size = 1, 1, 32 * MIB, 64 * MIB, 512 * MIB
        # The smoke run keeps every group and system but fewer cells: the 32 and 64 KiB
        # sizes and four threads take the same paths as the sizes and counts kept.
        args.sizes, args.thread_counts = SIZES[:3], [1, 2]
    scale = 0.01 if args.quick else 0.1
    # Table 3 of the paper has 10,000 files of each kind; webproxy's 2 MiB files get a
    # quarter of the others' count so its set stays near 1 GiB like the other files here.
    args.macro_files = {"fileserver": int(10000 * scale), "webproxy": int(2500 * scale), "varmail": int(10000 * scale)}
    args.rocksdb_keys = 2000 if args.quick else 50000
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    unknown = set(groups) - set(GROUPS)
    if unknown:
        p.error(f"unknown group(s) {', '.join(sorted(unknown))}; choose from {', '.join(GROUPS)}")
    if os.geteuid() != 0:
        p.error("run as root: the benchmark mounts FUSE file systems and drops the page cache")

    started = time.time()
    date = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = args.out or REPO / "bench" / "results" / (date + ("-quick" if args.quick else ""))
    out.mkdir(parents=True, exist_ok=True)
    ensure_tools()
    enable_fuse_uring()
    if not args.no_build:
        build()
    missing = [str(path) for path in (ALIGNFS, PASSTHROUGH, MACRO, PRELOAD) if not path.exists()]
    if missing:
        raise SystemExit(f"bench: {', '.join(missing)} not built; run without --no-build")
    work = Path(tempfile.mkdtemp(prefix="alignfs-bench.", dir=args.work or "/var/tmp"))
    fast = Path(tempfile.mkdtemp(prefix="alignfs-bench.", dir="/dev/shm")) / "fast"
    systems = Systems(work, fast, args.fast_size, args.ssd_size, args.cache, args.ring_threads)
    bench = Bench(args, systems)
    log(f"scratch in {work}, fast tier {fast}; results to {out}")
    try:
        systems.start()
        for round_no in range(args.rounds):
            for group in groups:
                log(f"round {round_no + 1}/{args.rounds}: {group}")
                getattr(bench, group)(round_no)
    finally:
        systems.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(fast.parent, ignore_errors=True)

    rows = summarize(bench.cells)
    meta = {
        "date": date,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) or "bench/run.py",
        "machine": f"{os.cpu_count()} CPUs, {os.uname().release}",
        "wall_minutes": (time.time() - started) / 60,
        "transport": systems.transport,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": rows, "cells": bench.cells}, indent=1))
    plot(out, rows)
    write_report(out, args, rows, meta)
    log(f"report: {out / 'report.md'} ({(time.time() - started) / 60:.1f} min)")
    if args.verify:
        problems = verify(groups, args, bench.cells, out)
        for problem in problems:
            print(f"bench: {problem}", file=sys.stderr)
        print(f"suite totals: {0 if problems else 1} passed, {1 if problems else 0} failed")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
