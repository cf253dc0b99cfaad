#!/usr/bin/env python3
"""GlusterFS with alignfs bricks against GlusterFS with ext4 bricks, same layout, same run.

Two 3-node replica-3 clusters (deploy/gluster/cluster.sh) are up side by side: one with
each brick on an alignfs mount, one with each brick a directory of the host's ext4 (the
same disk that holds alignfs's SSD images). Each fio workload runs through both clients,
alternating, for several rounds, and also on node 1's brick file system alone, so the
report separates what the brick file system costs from what GlusterFS costs. Around each
run the CPU time of every process of the cluster is sampled by role, which is where the
time goes.

    bench/gluster.py                # 3 rounds, 15 s cells (about 15 minutes)
    bench/gluster.py --quick        # 1 round, 2 s cells, small files (smoke run)

Results: bench/results/<date>-<time>-gluster/report.md and results.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ALIGNFS, REPO, drop_caches, log  # noqa: E402

CLUSTER = REPO / "deploy" / "gluster" / "cluster.sh"
MIB = 1 << 20
CLK_TCK = os.sysconf("SC_CLK_TCK")

# The files the workloads use, laid out once per cluster: name → size in a full run.
FILES = {"small": 64 * MIB, "large": 512 * MIB}
QUICK_FILE_BYTES = 16 * MIB
# name, fio arguments, the file it works on, whether it writes or reads.
WORKLOADS = [
    ("durable 4 KiB random writes", ["--rw=randwrite", "--bs=4k", "--fsync=1"], "small", "write"),
    ("durable 1 MiB random writes", ["--rw=randwrite", "--bs=1m", "--fsync=1"], "large", "write"),
    ("4 KiB random reads", ["--rw=randread", "--bs=4k"], "small", "read"),
    ("1 MiB random reads", ["--rw=randread", "--bs=1m"], "large", "read"),
]


def file_bytes(name: str, quick: bool) -> int:
    return min(FILES[name], QUICK_FILE_BYTES) if quick else FILES[name]


class Cluster:
    def __init__(self, bricks: str, tag: str):
        self.bricks = bricks
        self.env = dict(os.environ, ALIGNFS=str(ALIGNFS), AFG_NAME=f"afgb{tag}",
                        AFG_STATE=f"/var/tmp/alignfs-gluster-bench-{bricks}", AFG_SHM=f"/dev/shm/alignfs-gluster-bench-{bricks}")
        self.state = Path(self.env["AFG_STATE"])
        self.name = self.env["AFG_NAME"]

    def run(self, *args, check=True) -> str:
        p = subprocess.run([str(CLUSTER), *args], env=self.env, text=True, capture_output=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"cluster.sh {' '.join(args)} ({self.bricks}) failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
        return p.stdout

    @property
    def client_dir(self) -> str:
        return str(self.state / "client" / "mnt")

    @property
    def local_dir(self) -> str:
        """A directory on node 1's brick file system, outside the brick."""
        base = self.state / "n1" / ("mnt" if self.bricks == "alignfs" else "ext4")
        return str(base / "bench-local")

    def pids_by_role(self) -> dict:
        """pid → role for every process in the cluster's network namespaces."""
        roles = {}
        namespaces = subprocess.run(["ip", "netns", "list"], text=True, capture_output=True).stdout.split("\n")
        for line in namespaces:
            ns = line.split(" ")[0]
            if not ns.startswith(f"{self.name}-"):
                continue
            pids = subprocess.run(["ip", "netns", "pids", ns], text=True, capture_output=True).stdout.split()
            for pid in pids:
                roles[int(pid)] = role_of(int(pid), client=ns.endswith("-client"))
        return roles


def role_of(pid: int, client: bool) -> str:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if comm == "fio":
        return "fio"
    if comm.startswith("glusterfsd") or "--process-name brick" in cmdline:
        return "gluster brick"
    if "glustershd" in cmdline or "--process-name glustershd" in cmdline:
        return "gluster self-heal"
    if comm.startswith("glusterd"):
        return "glusterd"
    if comm.startswith("glusterfs"):
        return "gluster client" if client else "gluster other"
    if comm.startswith("alignfs") or "alignfs" in cmdline.split(" ")[0]:
        return "alignfs daemon"
    return "other"


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime are fields 14 and 15 of stat; after the comm they are 12 and 13.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / CLK_TCK


def fio(cluster: Cluster, node: str, directory: str, workload: int, runtime: float, quick: bool) -> dict:
    _, args, file, kind = WORKLOADS[workload]
    cmd = ["exec", node, "fio", "--name=bench", f"--directory={directory}", f"--filename={file}",
           f"--size={file_bytes(file, quick)}", "--ioengine=psync", "--time_based", f"--runtime={runtime}", "--randrepeat=0",
           "--output-format=json", *args]
    if kind == "read":
        cmd.append("--direct=1")  # past the client's page cache: every read reaches the bricks
    roles = cluster.pids_by_role()
    before = {pid: cpu_seconds(pid) for pid in roles}
    busy_before = machine_busy_seconds()
    out = cluster.run(*cmd)
    busy = machine_busy_seconds() - busy_before
    cpu: dict[str, float] = {}
    for pid, role in roles.items():
        cpu[role] = cpu.get(role, 0.0) + max(cpu_seconds(pid) - before[pid], 0.0)
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write" if kind == "write" else "read"]
    seconds = side["runtime"] / 1000
    cpu["fio"] = (job["usr_cpu"] + job["sys_cpu"]) / 100 * seconds
    ios = max(side["total_ios"], 1)
    return {
        "mib_s": side["bw_bytes"] / MIB,
        "iops": side["iops"],
        "op_us": seconds * 1e6 / ios,
        "cpu_ms_per_op": {role: 1e3 * s / ios for role, s in cpu.items() if role != "gone"},
        "busy_ms_per_op": 1e3 * busy / ios,
    }


def prepare_files(cluster: Cluster, node: str, directory: str, quick: bool) -> None:
    """Write each workload's file once, so every cell starts from a laid-out file."""
    cluster.run("exec", node, "mkdir", "-p", directory)
    for file in FILES:
        cluster.run("exec", node, "fio", "--name=layout", f"--directory={directory}", f"--filename={file}",
                    f"--size={file_bytes(file, quick)}", "--rw=write", "--bs=1m", "--ioengine=psync", "--end_fsync=1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtime", type=float, default=15.0, help="seconds per cell")
    parser.add_argument("--quick", action="store_true", help="1 round, 2 s cells, 16 MiB files")
    parser.add_argument("--out", type=Path, help="results directory (default bench/results/<date>-<time>-gluster)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.runtime = 1, 2.0
    if os.geteuid() != 0:
        sys.exit("bench/gluster.py: needs root (namespaces, mounts, drop_caches)")
    if not ALIGNFS.exists():
        subprocess.run(["cargo", "build", "--release", "--locked", "-q", "--workspace"], cwd=REPO, check=True)
    out = args.out or REPO / "bench" / "results" / (datetime.datetime.now().strftime("%Y-%m-%d-%H%M") + "-gluster")
    out.mkdir(parents=True, exist_ok=True)

    clusters = [Cluster("alignfs", "a"), Cluster("ext4", "e")]
    cells = []
    started = time.monotonic()
    try:
        for c in clusters:
            c.run("down", check=False)
            log(f"bringing up 3 nodes with {c.bricks} bricks")
            c.run("up", "--nodes", "3", "--bricks", c.bricks)
            prepare_files(c, "client", c.client_dir, args.quick)
            prepare_files(c, "1", c.local_dir, args.quick)
        for rnd in range(args.rounds):
            for w, (name, *_) in enumerate(WORKLOADS):
                for where in ("gluster", "brick alone"):
                    for c in clusters if rnd % 2 == 0 else reversed(clusters):
                        node, directory = ("client", c.client_dir) if where == "gluster" else ("1", c.local_dir)
                        drop_caches()
                        cell = fio(c, node, directory, w, args.runtime, args.quick)
                        cell.update(round=rnd, workload=name, where=where, bricks=c.bricks)
                        cells.append(cell)
                        log(f"round {rnd + 1}/{args.rounds} {name:30} {where:12} {c.bricks:8} "
                            f"{cell['mib_s']:8.1f} MiB/s {cell['op_us']:9.0f} us/op")
    finally:
        for c in clusters:
            c.run("down", check=False)
    meta = {"rounds": args.rounds, "runtime_s": args.runtime, "quick": args.quick, "minutes": (time.monotonic() - started) / 60,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
    (out / "results.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))
    report = write_report(out, cells, meta)
    print(report)
    return 0


def median_cell(cells: list, workload: str, where: str, bricks: str) -> dict:
    chosen = [c for c in cells if c["workload"] == workload and c["where"] == where and c["bricks"] == bricks]
    roles = sorted({r for c in chosen for r in c["cpu_ms_per_op"]})
    return {
        "mib_s": statistics.median(c["mib_s"] for c in chosen),
        "op_us": statistics.median(c["op_us"] for c in chosen),
        "busy": statistics.median(c["busy_ms_per_op"] for c in chosen),
        "cpu": {r: statistics.median(c["cpu_ms_per_op"].get(r, 0.0) for c in chosen) for r in roles},
    }


def write_report(out: Path, cells: list, meta: dict) -> str:
    lines = [
        "# GlusterFS: alignfs bricks vs ext4 bricks",
        "",
        f"{meta['date']}; 3 nodes, replica 3, one machine (network namespaces); medians of {meta['rounds']} "
        f"round(s) of {meta['runtime_s']:g} s cells; {meta['minutes']:.1f} min. fio psync, one job; reads use "
        "O_DIRECT on the client; the page cache is dropped before every cell.",
        "",
        "| workload | through GlusterFS: alignfs bricks | ext4 bricks | ratio | brick file system alone: alignfs | ext4 | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, *_ in WORKLOADS:
        g = [median_cell(cells, name, "gluster", b) for b in ("alignfs", "ext4")]
        a = [median_cell(cells, name, "brick alone", b) for b in ("alignfs", "ext4")]
        lines.append(f"| {name} | {g[0]['mib_s']:.1f} MiB/s | {g[1]['mib_s']:.1f} | **{g[0]['mib_s'] / g[1]['mib_s']:.2f}×** "
                     f"| {a[0]['mib_s']:.1f} | {a[1]['mib_s']:.1f} | {a[0]['mib_s'] / a[1]['mib_s']:.2f}× |")
    lines += [
        "",
        "## Where the time goes",
        "",
        "Per operation through GlusterFS: wall time of one operation as fio sees it, the CPU time each role spent "
        "on it (summed over the three nodes), and the machine's busy CPU time; what the roles do not account for "
        "is kernel work done outside them (the network stack in softirq, writeback, kworkers).",
        "",
        "| workload | bricks | µs per op | fio | gluster client | gluster bricks | alignfs daemons | other gluster | machine busy | CPU µs per op unattributed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, *_ in WORKLOADS:
        for bricks in ("alignfs", "ext4"):
            m = median_cell(cells, name, "gluster", bricks)
            cpu = m["cpu"]
            other = sum(v for r, v in cpu.items() if r in ("glusterd", "gluster self-heal", "gluster other", "other"))
            attributed = sum(cpu.values())
            us = lambda v: f"{v * 1e3:.0f}"  # noqa: E731
            lines.append(f"| {name} | {bricks} | {m['op_us']:.0f} | {us(cpu.get('fio', 0))} | {us(cpu.get('gluster client', 0))} "
                         f"| {us(cpu.get('gluster brick', 0))} | {us(cpu.get('alignfs daemon', 0))} | {us(other)} "
                         f"| {us(m['busy'])} | {us(max(m['busy'] - attributed, 0))} |")
    lines += ["", "CPU columns are µs of CPU per operation.", ""]
    report = "\n".join(lines)
    (out / "report.md").write_text(report)
    return report


if __name__ == "__main__":
    sys.exit(main())
