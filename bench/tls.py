#!/usr/bin/python3
"""What TLS costs the network front ends, plaintext and TLS alternating in one session.

NBD: one `alignfs nbd --tls on` server (TLS offered, plaintext served too) per kind of
credential (X.509, PSK); a libnbd client (python3-libnbd) alternates plaintext and TLS
connections against it: 4 KiB random writes each followed by a FLUSH at queue depth 1 (the durable
small write), and 1 MiB sequential writes at queue depth 8 (where encryption's
bytes-per-second cost shows).
S3: `alignfs s3` over the same store, restarted with and without HTTPS in turn; one boto3
client PUTs 4 KiB objects, then 4 MiB objects (a new connection is not made per request:
boto3 keeps them alive, as clients do).

Reports each cell's median over rounds and the TLS ÷ plaintext ratio of each round.
usage: bench/tls.py [--rounds N] [--seconds S] [--quick]   (root: /dev/shm, /var/tmp)
"""

import argparse
import importlib.util
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ALIGNFS, REPO, apt_install, free_port, log, med, run, wait_listening  # noqa: E402

ACCESS, SECRET = "bench-access", "bench-secret-key-0123"


def stop(proc):
    proc.terminate()
    if proc.wait(timeout=120) != 0:
        raise RuntimeError(f"the server exited with {proc.returncode} at SIGTERM")


# --- NBD -------------------------------------------------------------------------------

NBD_CELLS = ["4 KiB write + FLUSH, QD1 (IOPS)", "1 MiB sequential write, QD8 (MiB/s)"]


def nbd_handle(port, tls):
    """A libnbd connection: plaintext, or TLS with `tls` = ("X.509", client dir) or
    ("PSK", key file). libnbd's Python API, as fio's nbd engine refuses URIs that name
    local files (certificates, keys)."""
    import nbd
    h = nbd.NBD()
    if tls:
        kind, path = tls
        h.set_tls(nbd.TLS_REQUIRE)
        if kind == "X.509":
            h.set_tls_certificates(path)
        else:
            h.set_tls_psk_file(path)
            h.set_tls_username("alice")
    h.connect_tcp("localhost", str(port))
    return h


def nbd_cell(h, cell, seconds):
    size = h.get_size()
    rng = random.Random(3)
    started, n = time.monotonic(), 0
    if cell.startswith("4 KiB"):
        buf = rng.randbytes(4096)
        while time.monotonic() - started < seconds:
            h.pwrite(buf, rng.randrange(size // 4096) * 4096)
            h.flush()
            n += 1
        return n / (time.monotonic() - started)
    import nbd
    buf = nbd.Buffer.from_bytearray(bytearray(rng.randbytes(1 << 20)))
    at = 0
    while time.monotonic() - started < seconds:
        while h.aio_in_flight() < 8:
            # Returning 1 retires the command once it completes.
            h.aio_pwrite(buf, at, completion=lambda error: 1)
            at = (at + (1 << 20)) % (size - (1 << 20))
            n += 1
        h.poll(-1)
    while h.aio_in_flight():
        h.poll(-1)
    return n / (time.monotonic() - started)


def nbd_rounds(creds, kind, rounds, seconds, work, shm):
    fast, ssd = os.path.join(shm, "nbd-fast"), os.path.join(work, "nbd-ssd.img")
    run([ALIGNFS, "mkfs", "--profile", "uhs", "--force", "--fast", f"{fast}:256M", "--ssd", f"{ssd}:2G"])
    port = free_port()
    logfile = os.path.join(work, f"nbd-{kind}.log")
    tls_args = ["--tls-certificates", creds] if kind == "X.509" else ["--tls-psk", os.path.join(creds, "keys.psk")]
    with open(logfile, "a") as out:
        proc = subprocess.Popen([ALIGNFS, "nbd", "--fast", fast, "--ssd", ssd, "--listen", f"127.0.0.1:{port}", "--tls", "on",
                                 *tls_args], stdout=out, stderr=out)
    wait_listening(proc, port, "alignfs nbd", logfile)
    tls = (kind, os.path.join(creds, "client") if kind == "X.509" else os.path.join(creds, "keys.psk"))
    results = {cell: {"plain": [], kind: []} for cell in NBD_CELLS}
    try:
        for r in range(rounds):
            for cell in NBD_CELLS:
                # Alternate which goes first, so neither always meets a fresher device.
                order = [("plain", None), (kind, tls)] if r % 2 == 0 else [(kind, tls), ("plain", None)]
                for name, credentials in order:
                    h = nbd_handle(port, credentials)
                    value = nbd_cell(h, cell, seconds)
                    h.shutdown()
                    results[cell][name].append(value)
                    log(f"nbd {kind} round {r + 1}: {cell}: {name} {value:.0f}")
    finally:
        stop(proc)
    return results


# --- S3 --------------------------------------------------------------------------------

S3_CELLS = {"PUT 4 KiB (ops/s)": 4096, "PUT 4 MiB (MiB/s)": 4 << 20}


def s3_client(port, ca):
    import boto3
    from botocore.config import Config
    scheme = f"https://localhost:{port}" if ca else f"http://127.0.0.1:{port}"
    return boto3.client("s3", endpoint_url=scheme, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
                        region_name="us-east-1", verify=ca if ca else None,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def s3_cell(client, size, seconds, payload):
    rng = random.Random(size)
    started, n = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        at = rng.randrange(len(payload) - size)
        client.put_object(Bucket="bench", Key=f"o{size}/{n % 64}", Body=payload[at:at + size])
        n += 1
    took = time.monotonic() - started
    return n / took if size < (1 << 20) else n * size / took / (1 << 20)


def s3_rounds(creds, rounds, seconds, work):
    ssd = os.path.join(work, "s3-ssd.img")
    run([ALIGNFS, "mkfs", "--profile", "nvstore", "--force", "--ssd", f"{ssd}:2G"])
    keys = os.path.join(work, "keys")
    with open(keys, "w") as f:
        f.write(f"{ACCESS} {SECRET}\n")
    os.chmod(keys, 0o600)
    payload = random.Random(1).randbytes(16 << 20)
    results = {cell: {"plain": [], "HTTPS": []} for cell in S3_CELLS}
    tls_args = ["--tls-cert", os.path.join(creds, "server-cert.pem"), "--tls-key", os.path.join(creds, "server-key.pem")]
    for r in range(rounds):
        order = [("plain", None), ("HTTPS", os.path.join(creds, "ca-cert.pem"))]
        for name, ca in order if r % 2 == 0 else reversed(order):
            port = free_port()
            logfile = os.path.join(work, "s3.log")
            with open(logfile, "a") as out:
                proc = subprocess.Popen([ALIGNFS, "s3", "--ssd", ssd, "--keys", keys, "--listen", f"127.0.0.1:{port}",
                                         *(tls_args if ca else [])], stdout=out, stderr=out)
            try:
                wait_listening(proc, port, "alignfs s3", logfile)
                client = s3_client(port, ca)
                if r == 0 and name == order[0][0]:
                    client.create_bucket(Bucket="bench")
                for cell, size in S3_CELLS.items():
                    value = s3_cell(client, size, seconds, payload)
                    results[cell][name].append(value)
                    log(f"s3 round {r + 1}: {cell}: {name} {value:.1f}")
            finally:
                stop(proc)
    return results


def table(title, results, tls_name):
    lines = [f"### {title}", "", f"| cell | plaintext | {tls_name} | {tls_name} ÷ plaintext (median; per round) |",
             "| --- | ---: | ---: | --- |"]
    for cell, by in results.items():
        ratios = [t / p for p, t in zip(by["plain"], by[tls_name]) if p]
        lines.append(f"| {cell} | {med(by['plain']):.1f} | {med(by[tls_name]):.1f} | {med(ratios):.2f}; "
                     f"{', '.join(f'{x:.2f}' for x in ratios)} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--quick", action="store_true", help="one round of 2 s cells (CI's smoke run)")
    args = parser.parse_args()
    rounds, seconds = (1, 2) if args.quick else (args.rounds, args.seconds)
    if importlib.util.find_spec("nbd") is None:
        apt_install(["python3-libnbd"])
    if not ALIGNFS.exists():
        run(["cargo", "build", "--release", "--locked", "-q", "-p", "alignfs-cli"], cwd=REPO)
    shm = tempfile.mkdtemp(prefix="alignfs-tls.", dir="/dev/shm")
    work = tempfile.mkdtemp(prefix="alignfs-tls.", dir="/var/tmp")
    try:
        creds = os.path.join(work, "creds")
        run([REPO / "scripts" / "tls-credentials.sh", creds])
        report = [f"TLS cost, {rounds} round(s) of {seconds:g} s cells, alternating; {time.strftime('%Y-%m-%d %H:%M')}", ""]
        for kind in ["X.509", "PSK"]:
            report.append(table(f"NBD, TLS {kind} (libnbd)", nbd_rounds(creds, kind, rounds, seconds, work, shm), kind))
        report.append(table("S3, HTTPS (boto3, one client, kept-alive connection)", s3_rounds(creds, rounds, seconds, work), "HTTPS"))
        print("\n".join(report))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    main()
