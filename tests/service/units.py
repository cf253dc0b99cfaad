#!/usr/bin/env python3
"""The systemd units as installed, checked without a booted systemd.

    tests/service/units.py UNIT_DIR ETC_DIR SHM_DIR WORK_DIR

For each of alignfs-mount@, alignfs-nbd@ and alignfs-s3@ (installed by
scripts/install.sh into UNIT_DIR, with instance files read from ETC_DIR):
`systemd-analyze verify` accepts an instance of it with no warning; then its ExecStart
runs as systemd would run it (environment file, $VAR split into words, ${VAR} kept
whole, NOTIFY_SOCKET and WATCHDOG_USEC set): it must say READY=1, the mount must ping
the watchdog, KillSignal must stop it cleanly (exit 0, volume closed), and after a
kill -9 the same command (Restart=on-failure) must come back ready with the data.
"""

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

UNIT_DIR, ETC, SHM, WORK = (Path(a) for a in sys.argv[1:5])


def fail(msg):
    print(f"units: {msg}", file=sys.stderr)
    sys.exit(1)


def verify(template: str, instance: str) -> None:
    link = UNIT_DIR / template.replace("@.", f"@{instance}.")
    if not link.exists():
        link.symlink_to(template)
    out = subprocess.run(["systemd-analyze", "verify", str(link)], capture_output=True, text=True)
    said = (out.stdout + out.stderr).strip()
    if out.returncode != 0 or said:
        fail(f"systemd-analyze verify {link.name}: exit {out.returncode}: {said}")


def service_section(unit: Path) -> dict:
    keys = {}
    for line in unit.read_text().splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line)
        if m:
            keys[m.group(1)] = m.group(2)
    return keys


def environment(path: Path) -> dict:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def command_line(exec_start: str, env: dict) -> list:
    """systemd's expansion: ${VAR} is one word, $VAR its value split at whitespace."""
    words = []
    for word in shlex.split(exec_start):
        whole = re.fullmatch(r"\$\{(\w+)\}", word)
        split = re.fullmatch(r"\$(\w+)", word)
        if whole:
            words.append(env.get(whole.group(1), ""))
        elif split:
            words.extend(env.get(split.group(1), "").split())
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    return words


class Service:
    """One run of a unit's ExecStart, with a notify socket of its own."""

    def __init__(self, name: str, argv: list, watchdog: bool, unit_env: dict):
        self.name = name
        self.sock_path = WORK / f"{name}.notify"
        self.sock_path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.sock_path))
        env = dict(os.environ, NOTIFY_SOCKET=str(self.sock_path), **unit_env)
        if watchdog:
            env["WATCHDOG_USEC"] = "2000000"
        self.log = open(WORK / f"{name}.log", "ab")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=self.log, start_new_session=True)

    def expect(self, message: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                fail(f"{self.name} exited ({self.proc.returncode}) before {message}: {self.tail()}")
            self.sock.settimeout(0.2)
            try:
                got = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            if message in got.split("\n"):
                return
        fail(f"{self.name}: no {message} within {seconds} s: {self.tail()}")

    def stop(self, sig=signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=120)
        self.sock.close()
        self.log.close()
        return code

    def tail(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (WORK / f"{self.name}.log").read_text(errors="replace")[-1500:]


def run(cmd: list) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{' '.join(cmd)}: {out.stdout}{out.stderr}")
    return out.stdout


def check(template: str, conf: str, prepare, check_up, closed: str, log: Path | None = None) -> None:
    """`closed` is what the service's output (or `log`, its log file) says once it has
    closed the volume cleanly."""
    instance = template.split("@")[0].removeprefix("alignfs-") + "-test"
    (ETC / f"{instance}.conf").write_text(conf)
    verify(template, instance)
    keys = service_section(UNIT_DIR / template)
    assert keys["Type"] == "notify" and keys["KillSignal"] == "SIGTERM" and keys["Restart"] == "on-failure", keys
    env_file = Path(keys["EnvironmentFile"].replace("%i", instance))
    argv = command_line(keys["ExecStart"], environment(env_file))
    unit_env = dict([keys["Environment"].split("=", 1)])
    prepare()
    watchdog = "WatchdogSec" in keys
    name = instance
    # Start, serve, stop as systemd would.
    service = Service(name, argv, watchdog, unit_env)
    service.expect("READY=1", 60)
    if watchdog:
        service.expect("WATCHDOG=1", 10)
    check_up(first=True)
    if service.stop() != 0:
        fail(f"{name}: SIGTERM did not stop it cleanly: {service.tail()}")
    said = (log or WORK / f"{name}.log").read_text(errors="replace")
    if said.count(closed) != 1:
        fail(f"{name}: '{closed}' said {said.count(closed)} times after one SIGTERM")
    # A crash, then the restart systemd would make.
    service = Service(name, argv, watchdog, unit_env)
    service.expect("READY=1", 60)
    service.stop(signal.SIGKILL)
    service = Service(name, argv, watchdog, unit_env)
    service.expect("READY=1", 60)
    check_up(first=False)
    if service.stop() != 0:
        fail(f"{name}: the restarted service did not stop cleanly: {service.tail()}")
    print(f"units: {template}: verified; started, ready, stopped, killed and restarted")


def main():
    alignfs = service_section(UNIT_DIR / "alignfs-mount@.service")["ExecStart"].split()[0]
    mnt = WORK / "unit-mnt"
    mnt.mkdir(exist_ok=True)

    def mount_up(first):
        if first:
            (mnt / "kept").write_bytes(b"k" * 10000)
        elif (mnt / "kept").read_bytes() != b"k" * 10000:
            fail("the mount's file did not survive a kill -9 and restart")
        run([alignfs, "health", str(mnt), "--quiet"])

    check(
        "alignfs-mount@.service",
        f"ALIGNFS_DEVICES=--fast {SHM}/unit-fast --ssd {WORK}/unit-ssd.img\n"
        f"ALIGNFS_OPTIONS=\nMOUNTPOINT={mnt}\n",
        lambda: run([alignfs, "mkfs", "--fast", f"{SHM}/unit-fast:64M", "--ssd", f"{WORK}/unit-ssd.img:512M"]),
        mount_up,
        "volume closed cleanly",
    )
    run([alignfs, "fsck", "--fast", f"{SHM}/unit-fast", "--ssd", f"{WORK}/unit-ssd.img"])

    sock = WORK / "unit-nbd.sock"
    check(
        "alignfs-nbd@.service",
        f"ALIGNFS_DEVICES=--fast {SHM}/unit-uhs --ssd {WORK}/unit-uhs.img\nALIGNFS_OPTIONS=--no-tcp --socket {sock}\n",
        lambda: run([alignfs, "mkfs", "--profile", "uhs", "--fast", f"{SHM}/unit-uhs:64M", "--ssd", f"{WORK}/unit-uhs.img:256M"]),
        lambda first: sock.exists() or fail("the NBD socket is missing"),
        "closed cleanly",
    )
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()

    def s3_up(first):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if not c.recv(64).startswith(b"HTTP/1.1 "):
                fail("the S3 endpoint does not answer")

    check(
        "alignfs-s3@.service",
        f"ALIGNFS_DEVICES=--ssd {WORK}/unit-nv.img\nALIGNFS_OPTIONS=--anonymous --listen 127.0.0.1:{port}\n",
        lambda: run([alignfs, "mkfs", "--profile", "nvstore", "--ssd", f"{WORK}/unit-nv.img:256M"]),
        s3_up,
        "closed cleanly",
    )


if __name__ == "__main__":
    main()
