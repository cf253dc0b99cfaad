#!/usr/bin/env python3
"""ByteFS's sensitivity runs (issue 67, item 5; the paper's Figs. 13-14): `byte` and ext4
on the same emulated device (ext4-mssd) with the device's write log at 16, 64 and 256 MiB
(flash at Table 4's latencies), and with the flash latencies at 0.5x, 1x and 2x Table 4's
(the log at 64 MiB), on the micro workload and two macro ones. Like the paper's, these
run on Table 4's emulator, with no FTL write buffer. Each setting is one
`bench/byte.py` run; this script runs them, alternating nothing across settings (each run
alternates its systems), and tabulates throughput, the byte ÷ ext4 ratio, flash programs
per operation, log cleanings and the time stores waited on a full log.

    sudo bench/byte-sensitivity.py                # 2 rounds per setting, about 25 min
    sudo bench/byte-sensitivity.py --quick        # smoke run: one small round per setting
    bench/byte-sensitivity.py --from bench/results/DATE-byte-sensitivity
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, log, med, run  # noqa: E402

WORKLOADS = ["micro", "fileserver", "varmail"]
SYSTEMS = ["byte", "ext4-mssd"]
# (label, --device-log, --flash-latency): the log sizes at 1x, then the latencies at 64M.
SETTINGS = [("log 16M", "16M", 1.0), ("log 64M", "64M", 1.0), ("log 256M", "256M", 1.0),
            ("flash 0.5x", "64M", 0.5), ("flash 2x", "64M", 2.0)]


def slug(label: str) -> str:
    return label.replace(" ", "-")


def medians(cells: list) -> dict:
    groups: dict = {}
    for c in cells:
        groups.setdefault((c["workload"], c["system"]), []).append(c)
    return {key: {k: med(c[k] for c in cs) for k, v in cs[0].items() if isinstance(v, (int, float))}
            for key, cs in groups.items()}


def report(out: Path, meta: dict) -> str:
    lines = ["# ByteFS's sensitivity runs: the write log's size and the flash latency", "",
             f"{meta['date']}, {meta['rounds']} round(s) per setting, medians; sizes: {meta['sizes']}.",
             "Each setting is a bench/byte.py run of `byte` and ext4 on the same emulated device",
             "(ext4-mssd: its block writes cached in the device's DRAM, the cache as large as the log).", "",
             "| setting | workload | byte ops/s | ext4-mssd ops/s | byte ÷ ext4 | flash programs B/op, byte / ext4 | log cleanings, byte / ext4 | waited on a full log, byte / ext4 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    table = {}
    for label, _, _ in SETTINGS:
        results = out / slug(label) / "results.json"
        if not results.exists():
            continue
        m = medians(json.loads(results.read_text())["cells"])
        for workload in WORKLOADS:
            b, e = m.get((workload, "byte")), m.get((workload, "ext4-mssd"))
            if not (b and e):
                continue
            ratio = b["ops_per_s"] / e["ops_per_s"]
            table[(label, workload)] = ratio

            def wait(x):
                return f"{x['full_log_wait_us'] / 1e6 / x['seconds'] * 100:.1f} %"
            lines.append(f"| {label} | {workload} | {b['ops_per_s']:,.0f} | {e['ops_per_s']:,.0f} | {ratio:.2f}× | "
                         f"{b['flash_program'] / b['ops']:,.0f} / {e['flash_program'] / e['ops']:,.0f} | "
                         f"{b['cleanings']:.0f} / {e['cleanings']:.0f} | {wait(b)} / {wait(e)} |")
    plot(out, table)
    return "\n".join(lines + [""])


def plot(out: Path, table: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    groups = [("write log (flash 1×)", ["log 16M", "log 64M", "log 256M"], ["16 MiB", "64 MiB", "256 MiB"]),
              ("flash latency (log 64M)", ["flash 0.5x", "log 64M", "flash 2x"], ["0.5×", "1×", "2×"])]
    for ax, (title, labels, ticks) in zip(axes, groups):
        for workload in WORKLOADS:
            ys = [table.get((label, workload)) for label in labels]
            if any(y is not None for y in ys):
                ax.plot(ticks, [y or 0 for y in ys], marker="o", label=workload)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(title)
        ax.set_ylabel("throughput, byte ÷ ext4 on the same device")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "byte-sensitivity.png", dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ops", type=int, default=4000, help="micro: operations of each kind")
    p.add_argument("--files", type=int, default=2000, help="macro: files in the set")
    p.add_argument("--flows", type=int, default=20000, help="macro: flows run")
    p.add_argument("--quick", action="store_true", help="smoke run: one small round per setting")
    p.add_argument("--out", type=Path)
    p.add_argument("--from", dest="from_dir", type=Path, help="rebuild the report from a results directory")
    args = p.parse_args()
    if args.from_dir:
        meta = json.loads((args.from_dir / "meta.json").read_text())
        text = report(args.from_dir, meta)
        (args.from_dir / "report.md").write_text(text)
        print(text)
        return 0
    if os.geteuid() != 0:
        raise SystemExit("bench/byte-sensitivity.py needs root (loop devices, mounts)")
    if args.quick:
        args.rounds, args.ops, args.files, args.flows = 1, 100, 100, 200
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = args.out or REPO / "bench" / "results" / f"{stamp}-byte-sensitivity{'-quick' if args.quick else ''}"
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": stamp, "rounds": args.rounds,
            "sizes": f"micro {args.ops} of each op, macro {args.files} files x {args.flows} flows, 1 writer"}
    (out / "meta.json").write_text(json.dumps(meta))
    for label, device_log, latency in SETTINGS:
        log(f"setting {label}")
        run([sys.executable, REPO / "bench" / "byte.py", "--systems", ",".join(SYSTEMS), "--workloads", ",".join(WORKLOADS),
             "--rounds", str(args.rounds), "--ops", str(args.ops), "--files", str(args.files), "--flows", str(args.flows),
             "--device-log", device_log, "--flash-latency", str(latency), "--write-buffer", "0", "--out", out / slug(label)])
    text = report(out, meta)
    (out / "report.md").write_text(text)
    print(text)
    log(f"report: {out / 'report.md'}, plot: {out / 'byte-sensitivity.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
