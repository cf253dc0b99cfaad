#!/usr/bin/env python3
"""The uhs profile against what a user would run instead, through the same client.

Every system serves one export on this disk (or in memory, for the protocol's floor) and
fio's nbd engine drives it: uhs, uhs without its NVM buffer (UHS-NB), qemu-nbd on a raw
image (--cache=none --aio=native, and the default writeback cache), nbdkit's file plugin
(with cache=none, and default), and nbdkit's memory plugin. Rounds interleave the systems
so that the shared machine's noise falls on all of them; the report gives the median
MiB/s and latency percentiles per cell, the ratios of uhs to the best disk-backed peer,
UHS-NB and the floor, and uhs's own counters (bytes to the NVM buffer and to the SSD,
migrations).

The full run adds, after the fio matrix:
  - ext4 on each block system (nbdfuse + a loop device, `mkfs.ext4 -E packed_meta_blocks`,
    uhs with the front 64 MiB as its NVM range) under the createfiles, fileserver and
    varmail workloads of target/release/alignfs-macro;
  - small-write thresholds for uhs (--request-threshold) on mixed sizes;
  - migration time against NVM buffer size (target/release/alignfs-uhs-migrate).

  bench/uhs.py [--quick] [--rounds N] [--seconds S] [--transport tcp|unix] [--out DIR]
               [--no-ext4] [--no-thresholds] [--no-migration] [--no-fio]
               [--ext4-workloads LIST] [--systems A+B] [--volume-mib N]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ALIGNFS, REPO, install_missing, log, med, need_matplotlib, run  # noqa: E402

BIN = str(ALIGNFS)
MACRO = str(REPO / "target/release/alignfs-macro")
MIGRATE = str(REPO / "target/release/alignfs-uhs-migrate")

W4K = ["--rw=randwrite", "--bs=4k"]
MIXED_64K = ["--rw=randwrite", "--bssplit=4k/50:64k/50"]
MIXED_1M = ["--rw=randwrite", "--bssplit=4k/50:1m/50"]
READ4K = ["--rw=randread", "--bs=4k"]
FLUSH = ["--fsync=1"]


def cell(label, options, jobs=1, depth=1):
    name = f"{label}, {jobs} job{'s' if jobs > 1 else ''}, qd{depth}"
    return name, options + [f"--numjobs={jobs}", f"--iodepth={depth}"]


# The paper's shapes scaled to this machine: 4 KiB and mixed 4 KiB + larger (1:1), with and
# without a flush after each write, 1–8 client threads (one connection each) and queue
# depth 8; 4 KiB reads.
QUICK = [
    cell("4k randwrite, flush each", W4K + FLUSH),
    cell("4k randwrite, flush each", W4K + FLUSH, depth=8),
    cell("4k randwrite", W4K),
    cell("4k randwrite", W4K, depth=8),
    cell("4k+64k randwrite 1:1, flush each", MIXED_64K + FLUSH),
    cell("4k randread, warm cache", READ4K, depth=8),
]
FULL = [
    cell("4k randwrite, flush each", W4K + FLUSH),
    cell("4k randwrite, flush each", W4K + FLUSH, jobs=2),
    cell("4k randwrite, flush each", W4K + FLUSH, jobs=4),
    cell("4k randwrite, flush each", W4K + FLUSH, jobs=8),
    cell("4k randwrite, flush each", W4K + FLUSH, depth=8),
    cell("4k randwrite", W4K),
    cell("4k randwrite", W4K, jobs=8),
    cell("4k randwrite", W4K, depth=8),
    cell("4k+64k randwrite 1:1, flush each", MIXED_64K + FLUSH),
    cell("4k+64k randwrite 1:1, flush each", MIXED_64K + FLUSH, jobs=4),
    cell("4k+64k randwrite 1:1, flush each", MIXED_64K + FLUSH, depth=8),
    cell("4k+1m randwrite 1:1, flush each", MIXED_1M + FLUSH),
    cell("4k randread, cold cache", READ4K),
    cell("4k randread, cold cache", READ4K, depth=8),
    cell("4k randread, warm cache", READ4K),
    cell("4k randread, warm cache", READ4K, jobs=4),
    cell("4k randread, warm cache", READ4K, depth=8),
]
THRESHOLD_CELLS = [
    cell("4k randwrite, flush each", W4K + FLUSH),
    cell("4k+64k randwrite 1:1, flush each", MIXED_64K + FLUSH),
    cell("4k+64k randwrite 1:1, flush each", MIXED_64K + FLUSH, depth=8),
    cell("16k+64k randwrite 1:1, flush each", ["--rw=randwrite", "--bssplit=16k/50:64k/50"] + FLUSH),
]
MACRO_FILES = {"createfiles": 4000, "fileserver": 1000, "varmail": 1000}
UHS = ("uhs", "UHS-NB")
FLOOR = "nbdkit memory (floor)"


class System:
    """How to (re)create one system's export and the command that serves it."""

    def __init__(self, name, prepare, serve, devices=None):
        self.name, self.prepare, self.serve, self.devices = name, prepare, serve, devices


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = tempfile.mkdtemp(dir="/var/tmp", prefix="bench-uhs.")
        self.shm = tempfile.mkdtemp(dir="/dev/shm", prefix="bench-uhs.")
        self.port = 30000 + os.getpid() % 20000
        self.socket = os.path.join(self.work, "nbd.sock")
        self.size = args.size

    def uri(self, export):
        if self.args.transport == "unix":
            return f"nbd+unix:///{export}?socket={self.socket}"
        return f"nbd://127.0.0.1:{self.port}/{export}"

    def listen(self, kind):
        """The listening options of one server kind for the chosen transport."""
        unix = self.args.transport == "unix"
        return {
            "alignfs": ["--socket", self.socket, "--no-tcp"] if unix else ["--listen", f"127.0.0.1:{self.port}"],
            "qemu": ["-k", self.socket] if unix else ["-p", str(self.port), "-b", "127.0.0.1"],
            "nbdkit": ["-U", self.socket] if unix else ["-p", str(self.port), "-i", "127.0.0.1"],
        }[kind]

    def uhs(self, name, extra, nvm_range=None):
        nvm, ssd = os.path.join(self.shm, "nvm"), os.path.join(self.work, "uhs.img")

        def prepare():
            for p in (nvm, ssd):
                if os.path.exists(p):
                    os.remove(p)
            ranges = ["--nvm-range", nvm_range] if nvm_range else []
            run([BIN, "mkfs", "--profile", "uhs", "--fast", f"{nvm}:256M", "--ssd", f"{ssd}:{self.size * 5 // 4}",
                 "--size", str(self.size)] + ranges)
            return "x"

        serve = [BIN, "nbd", "--fast", nvm, "--ssd", ssd, "--export", "x"] + self.listen("alignfs") + extra
        return System(name, prepare, serve, devices=["--fast", nvm, "--ssd", ssd])

    def peers(self, with_floor=True):
        image = os.path.join(self.work, "peer.raw")

        def fresh_image():
            if os.path.exists(image):
                os.remove(image)
            run(["fallocate", "-l", str(self.size), image])
            return ""

        # -e: qemu-nbd serves one client unless told otherwise; fio's jobs are one each.
        qemu = ["qemu-nbd", "-f", "raw", "-e", "16", "-t"] + self.listen("qemu")
        nbdkit = ["nbdkit", "-f"] + self.listen("nbdkit")
        systems = [
            System("qemu-nbd cache=none", fresh_image, qemu + ["--cache=none", "--aio=native", image]),
            System("qemu-nbd writeback", fresh_image, qemu + [image]),
            System("nbdkit file cache=none", fresh_image, nbdkit + ["file", image, "cache=none"]),
            System("nbdkit file", fresh_image, nbdkit + ["file", image]),
        ]
        if with_floor:
            systems.append(System(FLOOR, lambda: "", nbdkit + ["memory", str(self.size)]))
        return systems

    def start(self, system):
        export = system.prepare()
        if os.path.exists(self.socket):
            os.remove(self.socket)
        uri = self.uri(export)
        return self.serve(system, uri, "did not come up"), uri

    def restart(self, system):
        """Serve the same export again (no re-format)."""
        return self.serve(system, self.uri("x"), "did not come back")

    @staticmethod
    def serve(system, uri, not_ready):
        """Start the server and wait until it answers at `uri`. On any failure (it exits,
        never answers, or the probe itself fails) the server is stopped before the error
        goes up, so no server outlives the run."""
        proc = subprocess.Popen(system.serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(400):
                if subprocess.run(["nbdinfo", "--size", uri], capture_output=True).returncode == 0:
                    return proc
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited: {' '.join(system.serve)}")
                time.sleep(0.05)
            raise RuntimeError(f"server {not_ready}: {' '.join(system.serve)}")
        except BaseException:
            proc.kill()
            proc.wait()
            raise

    def counters(self, system):
        out = run([BIN, "stat", "--json"] + system.devices)
        return json.loads(out)["counters"]

    def fio_matrix(self, systems, cells, rounds, results, counters):
        for round_ in range(rounds):
            for system in systems:
                proc, uri = self.start(system)
                try:
                    # Reads need data: fill the volume's first quarter once per start.
                    run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1m",
                         f"--size={self.size // 4}", "--iodepth=4"])
                    before = None
                    if system.devices:
                        # Counters from here on cover the workloads only.
                        stop(proc)
                        before = self.counters(system)
                        proc = self.restart(system)
                    for name, options in cells:
                        opts = options + ([f"--size={self.size // 4}"] if "--rw=randread" in options else [])
                        self.prepare_cache(name, uri)
                        r = run_fio(uri, opts, self.args.seconds, self.size)
                        results.setdefault(name, {}).setdefault(system.name, []).append(r)
                        log(f"round {round_ + 1}/{rounds} {system.name:24} {name:46} {r['mib_s']:8.1f} MiB/s"
                            f"  p50 {r['p50']:7.0f}  p99 {r['p99']:7.0f} us")
                finally:
                    stop(proc)
                if before is not None:
                    after = self.counters(system)
                    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                    counters.setdefault(system.name, []).append(delta)

    def prepare_cache(self, cell_name, uri):
        """Read cells state what every system's caches hold: nothing (the kernel's caches
        dropped), or the whole range read (one sequential pass). Otherwise a system whose
        writes went through the page cache would read warm data while one that wrote with
        O_DIRECT reads cold."""
        if "cold cache" in cell_name:
            subprocess.run(["sync"], check=True)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        elif "warm cache" in cell_name:
            run(["fio", "--name=warm", "--ioengine=nbd", f"--uri={uri}", "--rw=read", "--bs=1m",
                 f"--size={self.size // 4}", "--iodepth=4"])

    def ext4(self, systems, results, workloads):
        """ext4 on each block system through nbdfuse and a loop device."""
        fuse, mnt = os.path.join(self.work, "fuse"), os.path.join(self.work, "ext4")
        os.makedirs(fuse, exist_ok=True)
        os.makedirs(mnt, exist_ok=True)
        for system in systems:
            proc, uri = self.start(system)
            nbdfuse, loop = None, None
            try:
                nbdfuse = subprocess.Popen(["nbdfuse", os.path.join(fuse, "nbd"), uri], stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
                for _ in range(100):
                    if os.path.exists(os.path.join(fuse, "nbd")):
                        break
                    time.sleep(0.05)
                loop = run(["losetup", "-f", "--show", os.path.join(fuse, "nbd")]).strip()
                run(["mkfs.ext4", "-q", "-F", "-E", "packed_meta_blocks=1,lazy_itable_init=0,lazy_journal_init=0", loop])
                run(["mount", loop, mnt])
                for workload in workloads:
                    files = MACRO_FILES[workload]
                    d = os.path.join(mnt, workload)
                    common = ["--workload", workload, "--dir", d, "--files", str(files), "--seed", "7"]
                    run([MACRO, "prepare"] + common)
                    subprocess.run(["sync"], check=True)
                    r = json.loads(run([MACRO, "run"] + common + ["--seconds", str(self.args.seconds * 2)]))
                    results.setdefault(workload, {})[system.name] = r
                    log(f"ext4 on {system.name:24} {workload:12} {r['ops_per_s']:8.0f} ops/s  {r['mib_per_s']:7.1f} MiB/s"
                        f"  flow p99 {r['flow_p99_us']:8.0f} us")
                    shutil.rmtree(d)
                run(["umount", mnt])
                fsck = subprocess.run(["e2fsck", "-fn", loop], capture_output=True, text=True)
                if fsck.returncode != 0:
                    raise RuntimeError(f"e2fsck on {system.name}: {fsck.stdout[-400:]}")
            finally:
                subprocess.run(["umount", mnt], capture_output=True)
                if loop:
                    subprocess.run(["losetup", "-d", loop], capture_output=True)
                if nbdfuse:
                    subprocess.run(["fusermount3", "-u", fuse], capture_output=True)
                    nbdfuse.wait(timeout=30)
                stop(proc)

    def cleanup(self):
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.shm, ignore_errors=True)


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_fio(uri, options, seconds, size):
    out = subprocess.run(["fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", f"--size={size}", "--time_based",
                          f"--runtime={seconds}", "--output-format=json", "--randrepeat=0", "--group_reporting",
                          "--percentile_list=50:99:99.9"] + options, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-500:])
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    side = job["write"] if job["write"]["io_bytes"] else job["read"]
    pct = side.get("clat_ns", {}).get("percentile", {})
    sync = job.get("sync", {}).get("lat_ns", {}).get("percentile", {}) if job.get("sync") else {}
    return {
        "mib_s": side["bw"] / 1024,
        "p50": pct.get("50.000000", 0) / 1000,
        "p99": pct.get("99.000000", 0) / 1000,
        "p999": pct.get("99.900000", 0) / 1000,
        "flush_p99": sync.get("99.000000", 0) / 1000,
    }


def med_or_zero(values):
    return med(values, 0.0)


def fio_report(title, cells, systems, results, with_ratios=True):
    names = [s.name for s in systems]
    disk_peers = [n for n in names if n not in UHS and n != FLOOR]
    head = "| workload | " + " | ".join(names)
    ratios = with_ratios and "uhs" in names and disk_peers
    if ratios:
        head += " | uhs / best disk peer | uhs / UHS-NB | uhs / floor"
    lines = [f"### {title}: MiB/s (median over rounds)", "", head + " |", "|---" * (head.count("|")) + "|"]
    for name, _ in cells:
        m = {n: med_or_zero([r["mib_s"] for r in results[name][n]]) for n in names}
        row = f"| {name} | " + " | ".join(f"{m[n]:.1f}" for n in names)
        if ratios:
            best = max(disk_peers, key=lambda n: m[n])
            nb = f"{m['uhs'] / m['UHS-NB']:.2f}x" if m.get("UHS-NB") else "—"
            floor = f"{m['uhs'] / m[FLOOR]:.2f}x" if m.get(FLOOR) else "—"
            row += f" | {m['uhs'] / m[best]:.2f}x ({best}) | {nb} | {floor}"
        lines.append(row + " |")
    lines += ["", f"### {title}: write (or read) completion latency p50 / p99 / p99.9, µs; flushed cells add the flush's p99",
              "", "| workload | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for name, _ in cells:
        parts = []
        for n in names:
            rs = results[name][n]
            text = f"{med_or_zero([r['p50'] for r in rs]):.0f} / {med_or_zero([r['p99'] for r in rs]):.0f} / {med_or_zero([r['p999'] for r in rs]):.0f}"
            if "flush" in name:
                text += f" (+{med_or_zero([r['flush_p99'] for r in rs]):.0f})"
            parts.append(text)
        lines.append(f"| {name} | " + " | ".join(parts) + " |")
    return lines


def counter_report(counters):
    mib = 1 << 20
    lines = ["### uhs counters over the fio matrix (per start, median; MiB unless named)", "",
             "| system | written by clients | to the NVM buffer | to the SSD directly | migrated to the SSD | blocks migrated | RMW reads |",
             "|---|---|---|---|---|---|---|"]
    for name, deltas in counters.items():
        def m(key):
            return med_or_zero([d.get(key, 0) for d in deltas])
        migrated = med_or_zero([sum(v for k, v in d.items() if k.startswith("migrations_") and k != "migrations_dropped") for d in deltas])
        direct = med_or_zero([d.get("ssd_write_bytes", 0) - d.get("migration_write_bytes", 0) for d in deltas])
        lines.append(f"| {name} | {m('app_write_bytes') / mib:.0f} | {m('page_write_bytes') / mib:.0f} | {direct / mib:.0f}"
                     f" | {m('migration_write_bytes') / mib:.0f} | {migrated:.0f} | {m('fg_rmw_read_bytes') / mib:.0f} |")
    return lines


def plot(out, cells, systems, results, ext4):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s.name for s in systems]
    labels = [c for c, _ in cells]
    if names:
        plot_fio(out, plt, names, labels, results)
    if ext4:
        plot_ext4(out, plt, ext4)


def plot_fio(out, plt, names, labels, results):
    fig, axes = plt.subplots(1, 2, figsize=(16, 6))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        xs = [x + i * width for x in range(len(labels))]
        axes[0].bar(xs, [med_or_zero([r["mib_s"] for r in results[c][n]]) for c in labels], width, label=n)
        axes[1].bar(xs, [med_or_zero([r["p99"] for r in results[c][n]]) for c in labels], width, label=n)
    for ax, title, unit in [(axes[0], "throughput", "MiB/s"), (axes[1], "p99 completion latency", "µs")]:
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(labels))])
        ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel(f"{unit} (log scale)")
        ax.set_title(f"uhs over NBD vs peers: {title}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "fio.png"), dpi=110)
    plt.close(fig)

    jobs_cells = [c for c in labels if c.startswith("4k randwrite, flush each") and c.endswith("qd1")]
    if len(jobs_cells) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        for n in names:
            xs = [int(c.split(", ")[2].split()[0]) for c in jobs_cells]
            ax.plot(xs, [med_or_zero([r["mib_s"] for r in results[c][n]]) for c in jobs_cells], marker="o", label=n)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("client threads (one connection each, qd1)")
        ax.set_ylabel("MiB/s")
        ax.set_title("4 KiB random writes, flush after each")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "threads.png"), dpi=110)
        plt.close(fig)


def plot_ext4(out, plt, ext4):
    workloads = list(ext4)
    ext4_names = [n for n in ext4[workloads[0]] if all(n in ext4[w] for w in workloads)]
    if ext4_names:
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / len(ext4_names)
        for i, n in enumerate(ext4_names):
            ax.bar([x + i * width for x in range(len(workloads))], [ext4[w][n]["ops_per_s"] for w in workloads], width, label=n)
        ax.set_xticks([x + width * (len(ext4_names) - 1) / 2 for x in range(len(workloads))])
        ax.set_xticklabels(workloads)
        ax.set_ylabel("ops/s")
        ax.set_title("ext4 on the volume (nbdfuse + loop)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "ext4.png"), dpi=110)
        plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round of 2 s cells on a small volume, fio matrix only")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--transport", choices=["tcp", "unix"], default="tcp")
    ap.add_argument("--no-ext4", action="store_true")
    ap.add_argument("--no-thresholds", action="store_true")
    ap.add_argument("--no-migration", action="store_true")
    ap.add_argument("--volume-mib", type=int, default=None, help="size of every volume (default 1024; 256 with --quick)")
    ap.add_argument("--no-fio", action="store_true", help="skip the fio matrix (bench/compare.py's ext4-on-the-volume group)")
    ap.add_argument("--ext4-workloads", default=",".join(MACRO_FILES),
                    help=f"comma-separated alignfs-macro workloads for ext4 on the volume, from {','.join(MACRO_FILES)}")
    ap.add_argument("--cells", default=None, help="only fio cells whose name contains one of these comma-separated words (e.g. randread)")
    ap.add_argument("--cell", action="append", default=[], help="only this fio cell, by its full name (repeatable; bench/compare.py)")
    ap.add_argument("--systems", default=None, help="only these systems (fio matrix and ext4), by name, separated by '+' (bench/compare.py)")
    ap.add_argument("--out", default=None, help="report directory (default: bench/results/DATE-uhs; none with --quick)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2
        args.no_ext4 = args.no_thresholds = args.no_migration = True
    args.size = (args.volume_mib or (256 if args.quick else 1024)) << 20
    if args.out is None and not args.quick:
        args.out = os.path.join(REPO, "bench", "results", time.strftime("%Y-%m-%d-%H%M") + "-uhs")
    install_missing({"nbdinfo": "libnbd-bin", "nbdfuse": "libnbd-bin", "qemu-nbd": "qemu-utils", "nbdkit": "nbdkit",
                     "fio": "fio", "mkfs.ext4": "e2fsprogs"})
    if args.out:
        need_matplotlib()
    cells = QUICK if args.quick else FULL
    if args.cells:
        cells = [c for c in cells if any(word in c[0] for word in args.cells.split(","))]
    if args.cell:
        known = {c[0]: c for c in QUICK + FULL}
        unknown = [name for name in args.cell if name not in known]
        if unknown:
            sys.exit(f"unknown cell(s) {unknown}; known: {sorted(known)}")
        cells = [known[name] for name in args.cell]
    bench = Bench(args)
    results, counters, ext4, thresholds = {}, {}, {}, {}
    systems = [bench.uhs("uhs", []), bench.uhs("UHS-NB", ["--no-nvm-buffer"])] + bench.peers()
    ext4_systems = [bench.uhs("uhs", [], "0-64M"), bench.uhs("UHS-NB", ["--no-nvm-buffer"], "0-64M")] + bench.peers(with_floor=False)
    if args.systems:
        wanted = args.systems.split("+")
        unknown = [name for name in wanted if name not in {s.name for s in systems}]
        if unknown:
            sys.exit(f"unknown system(s) {unknown}; known: {[s.name for s in systems]}")
        systems = [s for s in systems if s.name in wanted]
        ext4_systems = [s for s in ext4_systems if s.name in wanted]
    ext4_workloads = args.ext4_workloads.split(",")
    unknown = [w for w in ext4_workloads if w not in MACRO_FILES]
    if unknown:
        sys.exit(f"unknown ext4 workload(s) {unknown}; known: {list(MACRO_FILES)}")
    if args.no_fio:
        systems = []
    threshold_systems = [bench.uhs(f"uhs threshold {t}", ["--request-threshold", t]) for t in ("4k", "8k", "16k", "64k", "128k")]
    migration = ""
    try:
        bench.fio_matrix(systems, cells, args.rounds, results, counters)
        if not args.no_thresholds:
            bench.fio_matrix(threshold_systems, THRESHOLD_CELLS, args.rounds, thresholds, {})
        if not args.no_ext4:
            bench.ext4(ext4_systems, ext4, ext4_workloads)
        if not args.no_migration:
            migration = run([MIGRATE, "--buffers", "16,64,256", "--volume", "1024", "--dir", bench.work,
                             "--fast-dir", bench.shm])
    finally:
        bench.cleanup()

    transport = "a Unix socket" if args.transport == "unix" else "TCP on loopback"
    lines = ["# uhs over NBD vs its peers", "",
             f"{args.rounds} round(s) of {args.seconds} s cells, {args.size >> 20} MiB volumes, fio's nbd engine over {transport}; "
             "one job is one connection.", ""]
    if systems:
        lines += fio_report("fio", cells, systems, results)
    if counters:
        lines += [""] + counter_report(counters)
    if thresholds:
        lines += [""] + fio_report("uhs small-write threshold (--request-threshold)", THRESHOLD_CELLS, threshold_systems, thresholds,
                                   with_ratios=False)
    if ext4:
        ext4_names = [s.name for s in ext4_systems]
        peers = [n for n in ext4_names if n not in UHS]
        # `--systems` may leave out uhs or every peer: then there is no ratio to give.
        ratio = "uhs" in ext4_names and peers
        lines += ["", "### ext4 on the volume (nbdfuse + loop, packed_meta_blocks; uhs maps the first 64 MiB to NVM): ops/s (flow p99 ms)", "",
                  "| workload | " + " | ".join(ext4_names) + (" | uhs / best disk peer |" if ratio else " |"),
                  "|---" * (len(ext4_names) + 1 + bool(ratio)) + "|"]
        for w, by in ext4.items():
            row = f"| {w} | " + " | ".join(f"{by[n]['ops_per_s']:.0f} ({by[n]['flow_p99_us'] / 1000:.1f})" for n in ext4_names) + " |"
            if ratio:
                best = max(peers, key=lambda n: by[n]["ops_per_s"])
                row += f" {by['uhs']['ops_per_s'] / by[best]['ops_per_s']:.2f}x ({best}) |"
            lines.append(row)
    if migration:
        lines += ["", "### Migration time against NVM buffer size (in-process, alignfs-uhs-migrate)", "", migration.strip()]
    report = "\n".join(lines)
    print(report)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"fio": results, "counters": counters, "thresholds": thresholds, "ext4": ext4}, f, indent=1)
        with open(os.path.join(args.out, "README.md"), "w") as f:
            f.write(report + "\n\nPlots: fio.png (log scale), threads.png, ext4.png.\n")
        plot(args.out, cells, systems, results, ext4)


if __name__ == "__main__":
    sys.exit(main())
