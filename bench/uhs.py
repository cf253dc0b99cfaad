#!/usr/bin/env python3
"""The uhs profile against what a user would run instead, through the same client.

Every system serves one export on this disk (or in memory, for the protocol's floor) and
fio's nbd engine drives it: uhs, uhs without its NVM buffer (UHS-NB), qemu-nbd on a raw
image (--cache=none --aio=native, and the default writeback cache), nbdkit's file plugin
(with cache=none, and default), and nbdkit's memory plugin. Rounds interleave the systems
so that the shared machine's noise falls on all of them; the report gives the median
MiB/s per cell and the ratio of uhs to the best disk-backed peer, UHS-NB and the floor.

  bench/uhs.py [--quick] [--rounds N] [--seconds S] [--out DIR]
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(REPO, "target/release/alignfs")

# (name, fio options): 4 KiB random writes with a flush after each or not, mixed 4 KiB
# + 64 KiB writes (1:1), 4 KiB random reads; queue depth 1 and 8.
WORKLOADS = [
    ("4k randwrite, flush each, qd1", ["--rw=randwrite", "--bs=4k", "--fsync=1", "--iodepth=1"]),
    ("4k randwrite, flush each, qd8", ["--rw=randwrite", "--bs=4k", "--fsync=1", "--iodepth=8"]),
    ("4k randwrite, qd1", ["--rw=randwrite", "--bs=4k", "--iodepth=1"]),
    ("4k randwrite, qd8", ["--rw=randwrite", "--bs=4k", "--iodepth=8"]),
    ("4k+64k randwrite 1:1, flush each, qd1", ["--rw=randwrite", "--bssplit=4k/50:64k/50", "--fsync=1", "--iodepth=1"]),
    ("4k randread, qd8", ["--rw=randread", "--bs=4k", "--iodepth=8"]),
]


def wait_for(uri, proc):
    for _ in range(200):
        if subprocess.run(["nbdinfo", "--size", uri], capture_output=True).returncode == 0:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.args}")
        time.sleep(0.05)
    raise RuntimeError(f"server did not come up: {proc.args}")


class System:
    def __init__(self, name, start):
        self.name, self.start = name, start


def systems(work, shm, size):
    image = os.path.join(work, "peer.raw")
    port = 30000 + os.getpid() % 20000

    def uhs(extra):
        def start():
            nvm, ssd = os.path.join(shm, "nvm"), os.path.join(work, "uhs.img")
            for p in (nvm, ssd):
                if os.path.exists(p):
                    os.remove(p)
            subprocess.run([BIN, "mkfs", "--profile", "uhs", "--fast", f"{nvm}:256M", "--ssd", f"{ssd}:{size * 2}",
                            "--size", str(size)], check=True, capture_output=True)
            return [BIN, "nbd", "--fast", nvm, "--ssd", ssd, "--listen", f"127.0.0.1:{port}", "--export", "x"] + extra, "x"
        return start

    def peer(cmd):
        def start():
            if not os.path.exists(image):
                subprocess.run(["fallocate", "-l", str(size), image], check=True)
            return cmd, ""
        return start

    return port, [
        System("uhs", uhs([])),
        System("UHS-NB", uhs(["--no-nvm-buffer"])),
        System("qemu-nbd cache=none", peer(["qemu-nbd", "-f", "raw", "--cache=none", "--aio=native", "-p", str(port), "-b", "127.0.0.1", "-t", image])),
        System("qemu-nbd writeback", peer(["qemu-nbd", "-f", "raw", "-p", str(port), "-b", "127.0.0.1", "-t", image])),
        System("nbdkit file cache=none", peer(["nbdkit", "-f", "-p", str(port), "-i", "127.0.0.1", "file", image, "cache=none"])),
        System("nbdkit file", peer(["nbdkit", "-f", "-p", str(port), "-i", "127.0.0.1", "file", image])),
        System("nbdkit memory (floor)", lambda: (["nbdkit", "-f", "-p", str(port), "-i", "127.0.0.1", "memory", str(size)], "")),
    ]


def run_fio(uri, options, seconds, size):
    out = subprocess.run(["fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", f"--size={size}", "--time_based",
                          f"--runtime={seconds}", "--output-format=json", "--randrepeat=0"] + options,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-500:])
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    side = job["write"] if job["write"]["io_bytes"] else job["read"]
    return side["bw"] / 1024, side.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round of 2 s cells on a small volume")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2
    size = (256 if args.quick else 1024) << 20
    work = tempfile.mkdtemp(dir="/var/tmp", prefix="bench-uhs.")
    shm = tempfile.mkdtemp(dir="/dev/shm", prefix="bench-uhs.")
    port, all_systems = systems(work, shm, size)
    results = {}
    try:
        for round_ in range(args.rounds):
            for system in all_systems:
                cmd, export = system.start()
                uri = f"nbd://127.0.0.1:{port}/{export}"
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    wait_for(uri, proc)
                    # Reads need data: fill the volume's first part once per start.
                    subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1m",
                                    f"--size={size // 4}", "--iodepth=4"], capture_output=True, check=True)
                    for name, options in WORKLOADS:
                        opts = options + ([f"--size={size // 4}"] if "randread" in options[0] else [])
                        bw, p99 = run_fio(uri, opts, args.seconds, size)
                        results.setdefault(name, {}).setdefault(system.name, []).append((bw, p99))
                        print(f"round {round_ + 1}/{args.rounds} {system.name:24} {name:40} {bw:9.1f} MiB/s  p99 {p99:8.0f} us", flush=True)
                finally:
                    proc.send_signal(signal.SIGINT)
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    disk_peers = [s.name for s in all_systems if s.name not in ("uhs", "UHS-NB", "nbdkit memory (floor)")]
    lines = ["| workload | " + " | ".join(s.name for s in all_systems) + " | uhs / best disk peer | uhs / UHS-NB | uhs / floor |",
             "|---" * (len(all_systems) + 4) + "|"]
    for name, _ in WORKLOADS:
        med = {s: statistics.median(b for b, _ in results[name][s]) for s in results[name]}
        best = max(med[p] for p in disk_peers)
        cells = [f"{med[s.name]:.1f}" for s in all_systems]
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {med['uhs'] / best:.2f}x | {med['uhs'] / med['UHS-NB']:.2f}x | {med['uhs'] / med['nbdkit memory (floor)']:.2f}x |")
    lines.append("")
    lines.append("p99 latency (us): | workload | " + " | ".join(s.name for s in all_systems) + " |")
    for name, _ in WORKLOADS:
        lines.append(f"| {name} | " + " | ".join(f"{statistics.median(p for _, p in results[name][s.name]):.0f}" for s in all_systems) + " |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "README.md"), "w") as f:
            f.write(f"# uhs over NBD vs its peers ({args.rounds} rounds of {args.seconds} s cells, MiB/s medians)\n\n{report}\n")


if __name__ == "__main__":
    sys.exit(main())
