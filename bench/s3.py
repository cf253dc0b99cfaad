#!/usr/bin/python3
"""alignfs's S3 gateway against s3s-fs (an S3 server over a directory), one S3 client, this disk.

Three systems serve the same requests from the same client (boto3, one client per
writer thread), rounds interleaved so that the shared machine's noise falls on all:
  - alignfs: `alignfs s3` over an `nvstore` volume, its SSD on one loop device and its
    KV directory on XFS on another. A PUT is durable when acknowledged;
  - s3s-fs: `s3s-fs` over a directory on ext4 (one loop device), as a user would run it.
    It writes a temporary file and renames it, never syncing: its acknowledgements come
    before its data is durable, so its MiB/s are the page cache's;
  - s3s-fs-sync: the same on ext4 mounted `-o sync`, so that each write and rename is
    durable before the next, as alignfs's PUT is.
Every loop device is a preallocated file on the disk under test with direct IO, so its
sectors written are what the system sent to the disk.

The cells (the NVStore paper's object workloads as S3 can express them: S3 writes whole
objects, so an unaligned write is an object whose size is not a block multiple):
  put2k      PUT of 2 KiB objects (all residue: NVStore's fragment path)
  putrand    PUT of 512 B-64 KiB objects (a few blocks and a fragment)
  put4m      PUT of 4 MiB objects (aligned, large)
  get        GET of whole putrand objects written before the cell
  fileserver filebench's fileserver flow as object operations: a PUT of a new object
             (gamma-distributed, mean 128 KiB), a PUT of a small one (mean 16 KiB, its
             append), a GET of a whole object, a HEAD, a DELETE; a LIST of 100 keys
             every 10th round
The report: operations/s and MiB/s (PUT and GET bodies) per cell, median of rounds;
device bytes written per GiB PUT (after a `sync` and 3 s for write-back and alignfs's
idle fragment sync); ratios of alignfs to each peer.

  bench/s3.py [--quick] [--rounds N] [--seconds S] [--jobs 1,8] [--cells ...] [--out DIR]

Each cell's objects are deleted after its figures are taken.
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import free_port, wait_listening  # noqa: E402
from nvstore import (BIN, Loop, detach, fs_on, install_missing, log, med, report_dir, run, run_rounds,  # noqa: E402
                     run_threads, save_report, unmount, with_systems)

CELLS = ["put2k", "putrand", "put4m", "get", "fileserver"]
SYSTEMS = ["alignfs", "s3s-fs", "s3s-fs-sync"]
ACCESS, SECRET = "bench-access", "bench-secret-0123456789"
S3S_FS_VERSION = "0.14.1"  # the newest whose toolchain need this machine's Rust meets
PAYLOAD = os.urandom((8 << 20) + 65536)


class Server:
    """An S3 server on a loopback port; `start` sets `devices`, `proc` and `port`."""
    proc = None

    def client(self, jobs):
        import boto3
        from botocore.config import Config
        return boto3.session.Session().client(
            "s3", endpoint_url=f"http://127.0.0.1:{self.port}", aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, max_pool_connections=jobs + 1))

    def spawn(self, cmd, work):
        self.port = free_port()
        self.logfile = os.path.join(work, f"{self.name}.log")
        with open(self.logfile, "a") as out:
            self.proc = subprocess.Popen(cmd(self.port), stdout=out, stderr=out)
        wait_listening(self.proc, self.port, self.name, self.logfile)
        self.client(1).create_bucket(Bucket="bench")

    def stop_server(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Alignfs(Server):
    name = "alignfs"

    def start(self, work, size):
        self.ssd = Loop(os.path.join(work, "alignfs-ssd.img"), size)
        self.kv_dev = Loop(os.path.join(work, "alignfs-kv.img"), size // 2)
        self.mnt = fs_on(self.kv_dev, os.path.join(work, "alignfs-kv"), "xfs")
        kv = os.path.join(self.mnt, "store")
        run([BIN, "mkfs", "--profile", "nvstore", "--ssd", self.ssd.dev, "--kv", kv, "--force"])
        keys = os.path.join(work, "keys")
        with open(keys, "w") as f:
            f.write(f"{ACCESS} {SECRET}\n")
        os.chmod(keys, 0o600)
        self.devices = {"data": self.ssd, "metadata": self.kv_dev}
        self.spawn(lambda port: [BIN, "s3", "--ssd", self.ssd.dev, "--kv", kv, "--keys", keys,
                                 "--listen", f"127.0.0.1:{port}"], work)

    def stop(self):
        self.stop_server()
        unmount(getattr(self, "mnt", None))
        detach(getattr(self, "ssd", None), getattr(self, "kv_dev", None))


class S3sFs(Server):
    def __init__(self, synchronous):
        self.synchronous = synchronous
        self.name = "s3s-fs-sync" if synchronous else "s3s-fs"

    def start(self, work, size):
        self.dev = Loop(os.path.join(work, f"{self.name}.img"), size)
        self.mnt = fs_on(self.dev, os.path.join(work, self.name))
        if self.synchronous:
            run(["mount", "-o", "remount,sync", self.mnt])
        self.devices = {"data": self.dev}
        self.spawn(lambda port: [s3s_fs_binary(), "--host", "127.0.0.1", "--port", str(port), "--access-key", ACCESS,
                                 "--secret-key", SECRET, self.mnt], work)

    def stop(self):
        self.stop_server()
        unmount(getattr(self, "mnt", None))
        detach(getattr(self, "dev", None))


def s3s_fs_binary():
    found = shutil.which("s3s-fs") or os.path.expanduser("~/.cargo/bin/s3s-fs")
    if not os.path.exists(found):
        log(f"installing s3s-fs {S3S_FS_VERSION} (cargo install, about 3 minutes)")
        subprocess.run(["cargo", "install", "--locked", f"s3s-fs@{S3S_FS_VERSION}", "--features", "binary"], check=True)
    return found


# --- the cells ---------------------------------------------------------------------------

def gamma_size(rng, mean):
    """filebench's file sizes: gamma-distributed with shape 1.5."""
    return max(1, min(int(rng.gammavariate(1.5, mean / 1.5)), 8 << 20))


def body(rng, size):
    at = rng.randrange(len(PAYLOAD) - size)
    return PAYLOAD[at:at + size]


def drive(server, jobs, seconds, op):
    """Run `jobs` threads, each calling `op(client, job, n, rng)` (returns bytes moved) until
    time runs out; returns (ops, bytes, seconds)."""
    clients = [server.client(jobs) for _ in range(jobs)]
    started = time.monotonic()

    def worker(job):
        rng = random.Random(1000 + job)
        ops = moved = 0
        while time.monotonic() - started < seconds:
            moved += op(clients[job], job, ops, rng)
            ops += 1
        return ops, moved

    ops, moved = run_threads(jobs, worker)
    return ops, moved, time.monotonic() - started


def put_cell(size_of):
    def op(s3, job, n, rng):
        data = body(rng, size_of(rng))
        s3.put_object(Bucket="bench", Key=f"{CELL_PREFIX[0]}/{job}/{n}", Body=data)
        return len(data)
    return op


def prepare_get(server, prefix, jobs, rng):
    """Objects for the GET cell: 64 per writer, 512 B-64 KiB."""
    s3 = server.client(1)
    for job in range(jobs):
        for n in range(64):
            s3.put_object(Bucket="bench", Key=f"{prefix}/{job}/{n}", Body=body(rng, rng.randint(512, 65536)))


def get_op(s3, job, n, rng):
    return len(s3.get_object(Bucket="bench", Key=f"{CELL_PREFIX[0]}/{job}/{rng.randrange(64)}")["Body"].read())


def fileserver_op(s3, job, n, rng):
    """One round of filebench's fileserver flow on this writer's own objects."""
    prefix = f"{CELL_PREFIX[0]}/{job}"
    live = FILESETS[job]
    moved = 0
    new = f"{prefix}/{n}"
    data = body(rng, gamma_size(rng, 128 << 10))
    s3.put_object(Bucket="bench", Key=new, Body=data)
    live.append(new)
    moved += len(data)
    small = body(rng, gamma_size(rng, 16 << 10))
    s3.put_object(Bucket="bench", Key=f"{new}.append", Body=small)
    live.append(f"{new}.append")
    moved += len(small)
    moved += len(s3.get_object(Bucket="bench", Key=rng.choice(live))["Body"].read())
    s3.head_object(Bucket="bench", Key=rng.choice(live))
    if len(live) > 50:
        s3.delete_object(Bucket="bench", Key=live.pop(rng.randrange(len(live))))
    if n % 10 == 9:
        s3.list_objects_v2(Bucket="bench", Prefix=prefix + "/", MaxKeys=100)
    return moved


CELL_PREFIX = [""]  # the running cell's key prefix, read by the operations
FILESETS = {}


def one_cell(server, cell, jobs, seconds, tag):
    CELL_PREFIX[0] = f"{cell}-{jobs}-{tag}"
    rng = random.Random(7)
    if cell == "get":
        prepare_get(server, CELL_PREFIX[0], jobs, rng)
    FILESETS.clear()
    FILESETS.update({j: [] for j in range(jobs)})
    settle()
    before = {k: d.written() for k, d in server.devices.items()}
    op = {
        "put2k": put_cell(lambda r: 2048),
        "putrand": put_cell(lambda r: r.randint(512, 65536)),
        "put4m": put_cell(lambda r: 4 << 20),
        "get": get_op,
        "fileserver": fileserver_op,
    }[cell]
    ops, moved, took = drive(server, jobs, seconds, op)
    settle()
    traffic = {k: d.written() - before[k] for k, d in server.devices.items()}
    remove_prefix(server, CELL_PREFIX[0] + "/")
    return {"ops": ops, "bytes": moved, "seconds": took, "traffic": traffic}


def remove_prefix(server, prefix):
    """Delete the cell's objects (after its figures are taken), so the devices never fill."""
    s3 = server.client(1)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket="bench", Delete={"Objects": keys, "Quiet": True})


def settle():
    subprocess.run(["sync"])
    time.sleep(3)


# --- the report --------------------------------------------------------------------------

def report(results, jobs_list, cells, systems, out):
    lines = ["# alignfs's S3 gateway against s3s-fs", "",
             "Median of rounds, one boto3 client. ops/s and MiB/s of request bodies (PUT and GET); device bytes "
             "written per GiB PUT (all of a system's devices, after sync and 3 s). s3s-fs acknowledges before its "
             "data is durable; s3s-fs-sync (ext4 -o sync) and alignfs do not.", ""]
    header = "| cell | writers | " + " | ".join(f"{s} ops/s (MiB/s)" for s in systems) + " | " + \
             " | ".join(f"{s} device per GiB" for s in systems) + " | alignfs / " + ", / ".join(systems[1:]) + " ops/s |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for cell in cells:
        for jobs in jobs_list:
            runs = {s: results.get((cell, jobs, s), []) for s in systems}
            if not all(runs.values()):
                continue
            ops = {s: med([c["ops"] / c["seconds"] for c in runs[s]]) for s in systems}
            mibs = {s: med([c["bytes"] / c["seconds"] / 2**20 for c in runs[s]]) for s in systems}
            put_bytes = lambda c: c["bytes"] if cell != "get" else 0
            per_gib = {s: med([sum(c["traffic"].values()) / put_bytes(c) if put_bytes(c) else float("nan") for c in runs[s]])
                       for s in systems}
            row = [cell, str(jobs)] + [f"{ops[s]:.0f} ({mibs[s]:.2f})" for s in systems]
            row += ["-" if cell == "get" else f"{per_gib[s]:.2f} GiB" for s in systems]
            row.append(", ".join(f"{ops['alignfs'] / ops[s]:.2f}x" if ops[s] else "-" for s in systems[1:]))
            lines.append("| " + " | ".join(row) + " |")
    save_report(out, "\n".join(lines) + "\n",
                [{"cell": c, "jobs": j, "system": s, "runs": r} for (c, j, s), r in results.items()])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 s cells, 1 round: the harness works")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds per cell")
    ap.add_argument("--jobs", default="1,8", help="client threads, comma-separated")
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--work", default="/var/tmp/alignfs-s3bench", help="directory on the disk under test")
    ap.add_argument("--device-size", default="4G", help="each data device (alignfs's KV device is half)")
    ap.add_argument("--out", default=None, help="report directory (default: bench/results/DATE-s3; none with --quick)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/s3.py needs root (loop devices, mounts)")
    install_missing({"mkfs.xfs": "xfsprogs", "mkfs.ext4": "e2fsprogs"}, {"boto3": "python3-boto3"})
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} is missing: cargo build --release -p alignfs-cli")
    rounds, seconds = (1, 2.0) if args.quick else (args.rounds, args.seconds)
    jobs_list = [int(j) for j in args.jobs.split(",")]
    cells = args.cells.split(",")
    unknown = set(cells) - set(CELLS) | set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        sys.exit(f"unknown cells or systems: {', '.join(sorted(unknown))} (cells: {', '.join(CELLS)}; systems: {', '.join(SYSTEMS)})")
    size = int(args.device_size.rstrip("G")) << 30 if not args.quick else 1 << 30
    out = report_dir(args.out, args.quick, "s3")

    def measure(systems):
        results = run_rounds(systems, rounds, cells, jobs_list,
                             lambda system, cell, jobs, tag: one_cell(system, cell, jobs, seconds, tag),
                             lambda r: f"{r['ops'] / r['seconds']:8.0f} ops/s {r['bytes'] / r['seconds'] / 2**20:8.2f} MiB/s "
                                       f"traffic {r['traffic']}")
        report(results, jobs_list, cells, [s.name for s in systems], out)

    with_systems(args.work, (Alignfs(), S3sFs(False), S3sFs(True)), args.systems.split(","), size, measure,
                 lambda systems: [getattr(system, "logfile", None) for system in systems])

if __name__ == "__main__":
    main()
