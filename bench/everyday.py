#!/usr/bin/env python3
"""Everyday work on the mount against ext4 on the same disk (issue 66).

What people do on a file system all day, timed by the wall clock on an `orch` mount (one
or more mount variants), on a directory of the host's ext4 (the same disk as the mount's
SSD image), and, where it applies, under the LD_PRELOAD shim. Systems alternate within
each round; every round starts from empty directories and dropped caches.

  cp        copy a file from tmpfs, then `sync -f`                      (1 GiB; quick 64 MiB)
  untar     unpack a tar of /usr/include, then `sync -f`                 (quick: include/linux)
  read      read every file of the unpacked tree, caches dropped         (find | xargs cat)
  clone     `git clone --no-local` of this repository, then `sync -f`
  status    `git status` and `git log --stat -200` in the clone, caches dropped
  sqlite    transactions of one INSERT each, rollback journal, synchronous=FULL (3000; quick 300)
  build     configure and make of SQLite's autoconf tree, then `sync -f` (full runs only;
            the tarball comes from npm's `sqlite3` package, fetched once)
  rm        `rm -rf` of everything above, then `sync -f`

The shim (`libalignfs_preload.so`, its own volume) runs the tasks whose calls it
intercepts: cp and sqlite. For each mount task the report gives the FUSE requests it cost,
from `alignfs stat --json` (each snapshot itself costs one GETXATTR, subtracted).

    bench/everyday.py                      # 3 rounds, full sizes, C build (about 6 minutes)
    bench/everyday.py --quick              # 1 round, small sizes, no C build (smoke, CI)
    bench/everyday.py --variant cache-all='--cache all'   # another mount beside the default

Results: bench/results/<date>-<time>-everyday/report.md, results.json and ratios.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (ALIGNFS, REPO, drop_caches, enable_fuse_uring, install_missing, log, med, mount_alignfs,  # noqa: E402
                    mount_transport, need_matplotlib, run, umount_alignfs)

MIB, GIB = 1 << 20, 1 << 30
TASKS = ["cp", "untar", "read", "clone", "status", "sqlite", "build", "rm"]
SHIM_TASKS = {"cp", "sqlite"}
SQLITE_NPM = "sqlite3@6.0.1"
CACHE = Path(os.environ.get("ALIGNFS_BENCH_CACHE", "/var/tmp/alignfs-bench-cache"))

SQLITE_SCRIPT = r"""
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("pragma journal_mode=delete")
db.execute("pragma synchronous=full")
db.execute("create table if not exists t (k integer primary key, v blob)")
for i in range(int(sys.argv[2])):
    db.execute("begin")
    db.execute("insert into t (v) values (randomblob(100))")
    db.execute("commit")
assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
"""


class System:
    """Where the tasks run: a directory, and for mounts its `alignfs stat` snapshots."""

    def __init__(self, name: str, root: Path, mount: Path | None = None, env: dict | None = None):
        self.name, self.root, self.mount, self.env = name, root, mount, env

    def requests(self) -> dict:
        if self.mount is None:
            return {}
        report = json.loads(run([ALIGNFS, "stat", self.mount, "--json"]))
        return dict(report["daemon"]["requests_by_kind"])

    def sync(self) -> None:
        # The shim's volume is not a kernel file system, and its writes are durable on return.
        if self.env is None:
            run(["sync", "-f", self.root])


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def sqlite_tarball() -> Path | None:
    """SQLite's autoconf tarball, from npm's sqlite3 package (cached), or None with a reason."""
    CACHE.mkdir(parents=True, exist_ok=True)
    cached = sorted(CACHE.glob("sqlite-autoconf-*.tar.gz"))
    if cached:
        return cached[-1]
    if not shutil.which("npm"):
        log("C build left out: npm is not installed (apt-get install npm)")
        return None
    try:
        pack = run(["npm", "pack", SQLITE_NPM, "--silent"], cwd=CACHE, timeout=300).strip().splitlines()[-1]
        with tarfile.open(CACHE / pack) as t:
            member = next(m for m in t.getmembers() if Path(m.name).name.startswith("sqlite-autoconf-"))
            (CACHE / Path(member.name).name).write_bytes(t.extractfile(member).read())
        (CACHE / pack).unlink()
    except (RuntimeError, StopIteration, OSError, tarfile.TarError) as e:
        log(f"C build left out: cannot fetch SQLite's sources from npm ({e})")
        return None
    return sorted(CACHE.glob("sqlite-autoconf-*.tar.gz"))[-1]


def run_task(task: str, system: System, inputs: dict, sizes: dict, rnd: int) -> None:
    """Run one task of round `rnd` in `system.root`; raise if it fails. The shim's files
    carry the round in their names: it runs no `rm`, so each round starts afresh."""
    root, env = system.root, system.env
    if task == "cp":
        run(["cp", inputs["big"], root / f"big{rnd}"], env=env)
        system.sync()
    elif task == "untar":
        (root / "tree").mkdir()
        run(["tar", "-xf", inputs["tar"], "-C", root / "tree"])
        system.sync()
    elif task == "read":
        run(["sh", "-c", 'find "$1" -type f -print0 | xargs -0 cat > /dev/null', "-", root / "tree"])
    elif task == "clone":
        run(["git", "clone", "-q", "--no-local", REPO, root / "clone"])
        system.sync()
    elif task == "status":
        run(["git", "-C", root / "clone", "status", "--porcelain"])
        run(["git", "-C", root / "clone", "log", "--stat", "-200"])
    elif task == "sqlite":
        run([sys.executable, "-c", SQLITE_SCRIPT, root / f"db{rnd}.sqlite", sizes["sqlite"]], env=env)
    elif task == "build":
        build = root / "build"
        build.mkdir()
        run(["tar", "-xzf", inputs["build"], "-C", build, "--strip-components=1"])
        run(["./configure", "--quiet"], cwd=build)
        run(["make", "-s", f"-j{os.cpu_count() or 2}"], cwd=build)
        system.sync()
    elif task == "rm":
        for name in [f"big{rnd}", "tree", "clone", f"db{rnd}.sqlite", "build"]:
            path = root / name
            if path.is_dir():
                run(["rm", "-rf", path])
            elif path.exists():
                path.unlink()
        system.sync()
    else:
        raise ValueError(task)


def cold(task: str) -> bool:
    """Tasks that start with every cache dropped: the ones that read what is there."""
    return task in {"read", "status"}


def make_inputs(work: Path, quick: bool, tasks: list) -> dict:
    """The copied file on tmpfs, the tar of headers, the build tarball."""
    inputs = {}
    src = Path(tempfile.mkdtemp(prefix="alignfs-everyday.", dir="/dev/shm"))
    inputs["tmpfs"] = src
    if "cp" in tasks:
        big, size = src / "big", (64 * MIB if quick else GIB)
        with open(big, "wb") as f:
            chunk = os.urandom(MIB)
            for _ in range(size // MIB):
                f.write(chunk)
        inputs["big"] = big
    if "untar" in tasks:
        inputs["tar"] = work / "headers.tar"
        tree = "include/linux" if quick else "include"
        run(["tar", "-cf", inputs["tar"], "-C", "/usr", tree])
        with tarfile.open(inputs["tar"]) as t:
            members = t.getmembers()
        inputs["tar_entries"] = len(members)
        inputs["tar_bytes"] = sum(m.size for m in members)
    if "build" in tasks:
        inputs["build"] = sqlite_tarball()
    return inputs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round, small inputs, no C build")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--tasks", default=None, help=f"comma-separated subset of {','.join(TASKS)}")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=OPTIONS",
                   help="another mount, with these `alignfs mount` options (repeatable); the default mount always runs")
    p.add_argument("--baseline", type=Path, default=None, metavar="ALIGNFS",
                   help="also mount with this alignfs binary (an older build), as `baseline`: old and new alternate in one run")
    p.add_argument("--no-shim", action="store_true", help="leave out the LD_PRELOAD shim")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--work", type=Path, default=Path("/var/tmp"), help="where the SSD images and the ext4 directory go")
    p.add_argument("--alignfs", type=Path, default=None, help="run this alignfs binary instead of building the tree's")
    args = p.parse_args()
    global ALIGNFS
    if os.geteuid() != 0:
        raise SystemExit("bench/everyday.py: run as root (it mounts and drops caches)")
    tasks = args.tasks.split(",") if args.tasks else [t for t in TASKS if not (args.quick and t == "build")]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise SystemExit(f"bench/everyday.py: unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    tools = {"git": "git", "fusermount3": "fuse3", "tar": "tar"}
    if "build" in tasks:
        tools.update({"make": "make", "cc": "build-essential"})
    install_missing(tools)
    enable_fuse_uring()
    if args.alignfs:
        ALIGNFS = args.alignfs.resolve()
        preload = ALIGNFS.parent / "libalignfs_preload.so"
    else:
        run(["cargo", "build", "--release", "--locked", "-q", "-p", "alignfs-cli", "-p", "alignfs-preload"])
        preload = REPO / "target" / "release" / "libalignfs_preload.so"
    variants = [("alignfs", [])]
    binaries = {"alignfs": ALIGNFS}
    if args.baseline:
        variants.append(("baseline", []))
        binaries["baseline"] = args.baseline.resolve()
    for v in args.variant:
        name, _, options = v.partition("=")
        if not name or name in {"alignfs", "baseline", "ext4", "shim"}:
            raise SystemExit(f"bench/everyday.py: --variant needs NAME=OPTIONS with a new name, got {v!r}")
        variants.append((name, shlex.split(options)))
    rounds = args.rounds or (1 if args.quick else 3)
    sizes = {"sqlite": 300 if args.quick else 3000}
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = args.out or REPO / "bench" / "results" / f"{stamp}-everyday"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="alignfs-bench-everyday.", dir=args.work))
    fast_dir = Path(tempfile.mkdtemp(prefix="alignfs-everyday-fast.", dir="/dev/shm"))
    inputs: dict = {}
    mounts: list = []
    cells = []
    try:
        inputs = make_inputs(work, args.quick, tasks)
        if "build" in tasks and inputs.get("build") is None:
            tasks.remove("build")
        systems = []
        for name, options in variants:
            fast, ssd, mnt = fast_dir / f"{name}.fast", work / f"{name}.ssd.img", work / f"{name}.mnt"
            # Each build formats the volume it mounts: an older build need not read a newer format.
            binary = binaries.get(name, ALIGNFS)
            run([binary, "mkfs", "--fast", f"{fast}:2G", "--ssd", f"{ssd}:4G"])
            mount_alignfs(["--fast", fast, "--ssd", ssd], mnt, options, work / f"{name}.log", alignfs=binary)
            mounts.append(mnt)
            systems.append(System(name, mnt, mount=mnt))
        ext4 = work / "ext4"
        ext4.mkdir()
        systems.append(System("ext4", ext4))
        shim_tasks = [t for t in tasks if t in SHIM_TASKS]
        if not args.no_shim and shim_tasks and preload.exists():
            fast, ssd = fast_dir / "shim.fast", work / "shim.ssd.img"
            run([ALIGNFS, "mkfs", "--fast", f"{fast}:2G", "--ssd", f"{ssd}:4G"])
            prefix = work / "shim"
            env = {"LD_PRELOAD": str(preload), "ALIGNFS_PREFIX": str(prefix), "ALIGNFS_FAST": str(fast),
                   "ALIGNFS_SSD": str(ssd)}
            systems.append(System("shim", prefix, env=env))
        transport = mount_transport(mounts[0], ALIGNFS)
        for rnd in range(rounds):
            for system in systems:
                for task in tasks:
                    if system.name == "shim" and task not in SHIM_TASKS:
                        continue
                    if cold(task):
                        drop_caches()
                    before = system.requests()
                    took = timed(lambda: run_task(task, system, inputs, sizes, rnd))
                    after = system.requests()
                    cell = {"round": rnd, "system": system.name, "task": task, "seconds": took}
                    if system.mount is not None:
                        spent = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
                        spent["GETXATTR"] = spent.get("GETXATTR", 0) - 1
                        cell["requests"] = {k: n for k, n in spent.items() if n > 0}
                    cells.append(cell)
                    log(f"round {rnd + 1}/{rounds} {system.name:10} {task:7} {took:8.3f} s"
                        + (f"  {sum(cell['requests'].values())} requests" if "requests" in cell else ""))
        meta = {"date": stamp, "rounds": rounds, "tasks": tasks, "variants": {n: o for n, o in variants},
                "binaries": {n: str(b) for n, b in binaries.items()},
                "transport": transport, "alignfs": str(ALIGNFS), "quick": args.quick, "sqlite_transactions": sizes["sqlite"],
                "cp_bytes": inputs["big"].stat().st_size if "big" in inputs else 0,
                "tar_entries": inputs.get("tar_entries", 0), "tar_bytes": inputs.get("tar_bytes", 0),
                "build": inputs["build"].name if inputs.get("build") else None}
    finally:
        for mnt in mounts:
            if os.path.ismount(mnt):
                umount_alignfs(mnt, ALIGNFS)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(fast_dir, ignore_errors=True)
        if inputs.get("tmpfs"):
            shutil.rmtree(inputs["tmpfs"], ignore_errors=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))
    report, ratios = write_report(cells, meta, [s.name for s in systems])
    (out / "report.md").write_text(report)
    plot(ratios, out / "ratios.png", args.quick)
    print(report)
    log(f"report: {out / 'report.md'}")
    return 0


def median_seconds(cells: list, system: str, task: str) -> float:
    return med(c["seconds"] for c in cells if c["system"] == system and c["task"] == task)


def geomean(values: list) -> float:
    values = [v for v in values if v > 0 and not math.isnan(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def describe(task: str, meta: dict) -> str:
    return {
        "cp": f"cp {meta['cp_bytes'] // MIB} MiB from tmpfs + sync",
        "untar": f"tar -x of {meta['tar_entries']:,} entries ({meta['tar_bytes'] / 1e6:.0f} MB) + sync",
        "read": "read every file of the tree, cold",
        "clone": "git clone --no-local of this repository + sync",
        "status": "git status + git log --stat -200, cold",
        "sqlite": f"{meta['sqlite_transactions']:,} SQLite transactions (rollback journal, synchronous=full)",
        "build": f"configure + make of {meta['build']} + sync",
        "rm": "rm -rf of all of it + sync",
    }[task]


def write_report(cells: list, meta: dict, systems: list) -> tuple:
    """The report, and per variant the ratios plotted."""
    others = [s for s in systems if s != "ext4"]
    lines = [
        f"# Everyday work: alignfs against ext4 ({meta['date']})",
        "",
        f"Wall time, medians of {meta['rounds']} round(s), systems alternating; speed ratio = ext4's time ÷ the system's. "
        f"ext4 is a directory of the host file system on the same disk as the SSD images. Mount variants: "
        + "; ".join(f"`{n}` ({' '.join(o) or 'defaults'})" for n, o in meta["variants"].items())
        + f". Requests: {meta['transport']}.",
        "",
        "| task | ext4 s | " + " | ".join(f"{s} s | {s} ÷ ext4" for s in others) + " |",
        "| --- | ---: | " + " | ".join("---: | ---:" for _ in others) + " |",
    ]
    ratios = {s: {} for s in others}
    for task in meta["tasks"]:
        e = median_seconds(cells, "ext4", task)
        row = f"| {describe(task, meta)} | {e:.2f} |"
        for s in others:
            t = median_seconds(cells, s, task)
            if math.isnan(t):
                row += " — | — |"
                continue
            ratios[s][task] = e / t
            row += f" {t:.2f} | {e / t:.2f}× |"
        lines.append(row)
    lines.append("| **geometric mean** | |" + "".join(
        f" | {geomean(list(ratios[s].values())):.2f}× |" for s in others))
    mounts = [s for s in meta["variants"]]
    lines += ["", "FUSE requests per task (median round), the four most frequent kinds:", "",
              "| task | " + " | ".join(mounts) + " |", "| --- | " + " | ".join("---" for _ in mounts) + " |"]
    for task in meta["tasks"]:
        row = f"| {task} |"
        for s in mounts:
            runs = sorted((c for c in cells if c["system"] == s and c["task"] == task), key=lambda c: c["seconds"])
            if not runs:
                row += " — |"
                continue
            req = runs[len(runs) // 2]["requests"]
            top = sorted(req.items(), key=lambda kv: -kv[1])[:4]
            row += f" {sum(req.values()):,}: " + ", ".join(f"{k} {n:,}" for k, n in top) + " |"
        lines.append(row)
    lines.append("")
    return "\n".join(lines), ratios


def plot(ratios: dict, path: Path, quick: bool) -> None:
    if quick:
        return
    need_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    systems = list(ratios)
    tasks = [t for t in TASKS if any(t in ratios[s] for s in systems)]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(1, len(systems))
    for i, s in enumerate(systems):
        xs = [j + i * width for j in range(len(tasks))]
        ax.bar(xs, [ratios[s].get(t, 0) for t in tasks], width, label=s)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(tasks))], tasks)
    ax.set_ylabel("speed ÷ ext4")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
