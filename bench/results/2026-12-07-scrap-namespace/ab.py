#!/usr/bin/env python3
"""Old and new builds of `scrap`, alternately, against ext4 on the same disk: what
committing namespace ops at fsync (instead of before each returns) changes.

    sudo bench/results/2026-12-07-scrap-namespace/ab.py --old OLD/alignfs --new target/release/alignfs

Each round runs every system in turn (the order rotates): filebench's createfiles, varmail
and fileserver (alignfs-macro, the files bench/compare.py's macro group uses), and
`tar -x` of a 5,000-file tree followed by an fsync of the last file. Each alignfs cell
gets a fresh volume; the counters give the journal records per operation.
"""
import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common import REPO, drop_caches, enable_fuse_uring, log, med, mount_alignfs, run, umount_alignfs  # noqa: E402

MACRO = REPO / "target" / "release" / "alignfs-macro"
FILES = {"createfiles": 4000, "varmail": 1000, "fileserver": 1000}


def make_tree(path: Path, files: int) -> None:
    """A source-tree-like tarball: 50 directories of small files (1–16 KiB)."""
    with tarfile.open(path, "w") as tar:
        for i in range(files):
            data = os.urandom(1024 + (i * 2654435761) % (15 * 1024))
            info = tarfile.TarInfo(f"tree/d{i % 50}/f{i}.c")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def untar(tarball: Path, d: Path) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    run(["tar", "-xf", tarball, "-C", d])
    # The unpacked tree made durable the way a careful installer does: one fsync.
    last = sorted((d / "tree" / "d49").iterdir())[-1]
    fd = os.open(last, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    secs = time.monotonic() - start
    return {"ops_per_s": 5000 / secs}


def counters(mnt: Path, alignfs: Path) -> dict:
    return dict(json.loads(run([alignfs, "stat", mnt, "--json"]))["counters"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True)
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/alignfs-ab"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args()
    enable_fuse_uring()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    (work / "ext4").mkdir(parents=True)
    tarball = work / "tree.tar"
    make_tree(tarball, 5000)
    systems = {"old": args.old, "new": args.new, "ext4": None}
    results: dict = {}
    for round_no in range(args.rounds):
        order = list(systems)
        order = order[round_no % 3:] + order[:round_no % 3]
        for workload in [*FILES, "tar -x + fsync"]:
            for system in order:
                alignfs = systems[system]
                if alignfs:
                    img = work / "scrap.img"
                    run([alignfs, "mkfs", "--force", "--profile", "scrap", "--ssd", f"{img}:8G"])
                    d = mount_alignfs(["--ssd", img], work / "mnt", ["--scrap-mem", "1G"], work / f"{system}.log", alignfs=alignfs)
                else:
                    d = work / "ext4"
                cell = d / "cell"
                before = counters(d, alignfs) if alignfs else None
                if workload in FILES:
                    common = ["--workload", workload, "--dir", cell, "--files", str(FILES[workload]), "--seed", str(7 + round_no)]
                    run([MACRO, "prepare", *common])
                    drop_caches()
                    before = counters(d, alignfs) if alignfs else None
                    r = json.loads(run([MACRO, "run", *common, "--seconds", str(args.seconds)]))
                    ops = r["ops"]
                else:
                    drop_caches()
                    r = untar(tarball, cell)
                    ops = 5000
                row = {"ops_per_s": r["ops_per_s"]}
                if alignfs:
                    after = counters(d, alignfs)
                    for k in ["journal_records", "ssd_flushes", "namespace_ops_deferred", "deferred_namespace_commits"]:
                        row[k + "_per_op"] = (after.get(k, 0) - before.get(k, 0)) / ops
                    umount_alignfs(d, alignfs=alignfs)
                else:
                    shutil.rmtree(cell)
                    os.sync()
                log(f"round {round_no} {workload} {system}: {row}")
                results.setdefault(workload, {}).setdefault(system, []).append(row)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    lines = ["| workload | old ops/s | new ops/s | ext4 ops/s | old ÷ ext4 | new ÷ ext4 | new ÷ old | journal records/op old → new | SSD flushes/op old → new |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for workload, by in results.items():
        m = {s: med([r["ops_per_s"] for r in rows]) for s, rows in by.items()}
        jr = {s: med([r["journal_records_per_op"] for r in by[s]]) for s in ("old", "new")}
        fl = {s: med([r["ssd_flushes_per_op"] for r in by[s]]) for s in ("old", "new")}
        lines.append(f"| {workload} | {m['old']:.0f} | {m['new']:.0f} | {m['ext4']:.0f} | {m['old'] / m['ext4']:.2f} | "
                     f"{m['new'] / m['ext4']:.2f} | {m['new'] / m['old']:.2f} | {jr['old']:.2f} → {jr['new']:.2f} | "
                     f"{fl['old']:.2f} → {fl['new']:.2f} |")
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
