"""What every benchmark harness here needs: running commands, logging, medians, dropping
the page cache, installing missing tools, loop devices, and mounting alignfs and ext4.

The harnesses import it as `from common import ...` (they run from any directory: each
puts its own directory on sys.path first, which Python does for the script run)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# ALIGNFS_BIN runs another build (old/new A/B runs in one session).
ALIGNFS = Path(os.environ.get("ALIGNFS_BIN", REPO / "target" / "release" / "alignfs"))
FUSE_URING = Path("/sys/module/fuse/parameters/enable_uring")


def log(msg: str) -> None:
    """Progress, timestamped, on stderr: stdout carries the reports."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list, env: dict | None = None, check: bool = True, capture: bool = True, timeout: float | None = None,
        cwd=None) -> str:
    """Run `cmd` (any path-like arguments) and return its stdout. `env` adds to the
    environment. A failure raises with the tail of what the command printed."""
    full_env = dict(os.environ, **(env or {}))
    p = subprocess.run([str(c) for c in cmd], env=full_env, text=True, capture_output=capture, timeout=timeout, cwd=cwd)
    if check and p.returncode != 0:
        out = (p.stdout or "")[-2000:] + (p.stderr or "")[-2000:]
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited with {p.returncode}:\n{out}")
    return p.stdout or ""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(proc, port: int, what: str, logfile) -> None:
    """Wait up to 60 s for `proc` to listen on loopback `port`; raise if it exits first."""
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {logfile}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start listening; see {logfile}")


def med(values, empty: float = math.nan) -> float:
    """The median, or `empty` when there are no values (a system a run left out)."""
    values = list(values)
    return statistics.median(values) if values else empty


def drop_caches() -> None:
    """Write back dirty pages, then drop the page cache, dentries and inodes."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        raise SystemExit(f"bench: cannot drop caches ({e}); run as root") from e


def apt_install(packages: list) -> None:
    log(f"installing {' '.join(packages)}")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", *packages], env=env)


def install_missing(tools: dict, modules: dict | None = None) -> None:
    """apt-get install what is missing: `tools` maps a command to its Debian package,
    `modules` a Python module to its. The modules must import afterwards."""
    modules = modules or {}
    absent = lambda m: importlib.util.find_spec(m) is None  # noqa: E731
    missing = sorted({p for tool, p in tools.items() if not shutil.which(tool)} | {p for m, p in modules.items() if absent(m)})
    if not missing:
        return
    apt_install(missing)
    importlib.invalidate_caches()
    for module, package in modules.items():
        if absent(module):
            sys.exit(f"{package} is installed and {module} does not import: run with /usr/bin/python3, Debian's")


def need_matplotlib() -> None:
    """matplotlib for the plots: from apt under Debian's python3 (which refuses pip
    installs), from pip under any other."""
    if importlib.util.find_spec("matplotlib") is not None:
        return
    if sys.executable.startswith("/usr/bin/"):
        apt_install(["python3-matplotlib"])
    else:
        log("installing matplotlib")
        run([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"])
    importlib.invalidate_caches()


# --- devices and mounts -----------------------------------------------------------------


class Loop:
    """A loop device over a preallocated file. With `direct_io` its sectors written are
    the bytes that reached the disk."""

    def __init__(self, path, size: int, direct_io: bool = True):
        self.path = str(path)
        run(["fallocate", "-l", str(size), self.path])
        self.dev = run(["losetup", "--find", "--show", *(["--direct-io=on"] if direct_io else []), self.path]).strip()
        self.name = os.path.basename(self.dev)

    def written(self) -> int:
        with open(f"/sys/block/{self.name}/stat") as f:
            return int(f.read().split()[6]) * 512

    def detach(self) -> None:
        run(["losetup", "-d", self.dev], check=False)


def detach(*loops) -> None:
    for loop in loops:
        if loop:
            loop.detach()


class Exporter:
    """`alignfs export-device` of the emulated device at `image`/`dram` (with `options`),
    serving it as `mnt`/disk, its counters in `mnt`/stats, its messages in `logfile`."""

    def __init__(self, image: Path, dram: Path, mnt: Path, logfile: Path, options: list):
        self.image, self.dram, self.mnt, self.logfile, self.options = image, dram, mnt, logfile, options
        self.proc: subprocess.Popen | None = None

    def start(self, size: str | None) -> float:
        """Start serving (a new device of `size`, or the one there); returns the recovery
        time the device reported (0 if it had nothing to recover)."""
        spec = f"{self.image}:{size}" if size else str(self.image)
        before = self.logfile.read_text() if self.logfile.exists() else ""
        with open(self.logfile, "a") as err:
            self.proc = subprocess.Popen([str(ALIGNFS), "export-device", "--ssd", spec, "--fast", str(self.dram), *self.options,
                                          str(self.mnt)], stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 600
        while not (self.mnt / "disk").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"alignfs export-device did not serve: {self.logfile.read_text()[-2000:]}")
            time.sleep(0.02)
        m = re.search(r"device recovered in ([0-9.]+) s", self.logfile.read_text()[len(before):])
        return float(m.group(1)) if m else 0.0

    def stats(self) -> dict:
        return json.loads((self.mnt / "stats").read_text())

    def kill(self) -> None:
        """The power cut: SIGKILL, the DRAM file left as it is."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        run(["umount", "-l", self.mnt], check=False)

    def stop(self) -> None:
        """A clean stop: the exporter flushes the device and exits."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=120)
        self.proc = None


def fs_on(dev: str, mnt, fs: str = "ext4", mkfs_options: list | None = None):
    """A fresh ext4 (or xfs) on `dev`, mounted at `mnt`."""
    if fs == "xfs":
        run(["mkfs.xfs", "-q", "-f", *(mkfs_options or []), dev])
    else:
        run(["mkfs.ext4", "-q", "-F", *(mkfs_options or []), dev])
    os.makedirs(mnt, exist_ok=True)
    run(["mount", dev, mnt])
    return mnt


def unmount(mnt) -> None:
    """Unmount a kernel file system, quietly if it is not mounted."""
    if mnt:
        run(["umount", mnt], check=False)


def mount_alignfs(devices: list, mnt, options: list | None = None, log_file=None, alignfs=ALIGNFS, wrap=None) -> Path:
    """Mount the volume on `devices` (`--fast …`/`--ssd …` arguments) at `mnt`; the
    command returns once the daemon serves. `wrap` turns the command into the one to run
    (under a memory cap, say)."""
    os.makedirs(mnt, exist_ok=True)
    cmd = [alignfs, "mount", *devices, *(options or [])]
    if log_file:
        cmd += ["--log", log_file]
    cmd.append(mnt)
    run(wrap(cmd) if wrap else cmd)
    return Path(mnt)


def umount_alignfs(mnt, alignfs=ALIGNFS) -> None:
    """Unmount an alignfs mount; a mount whose daemon died is detached lazily."""
    run([alignfs, "umount", mnt], check=False)
    if os.path.ismount(mnt):
        run(["fusermount3", "-u", "-z", mnt], check=False)


def enable_fuse_uring() -> None:
    """Serve the mounts over io_uring where the kernel offers it, as scripts/setup.sh does.
    The module parameter is off again after every boot, and a mount then serves over
    /dev/fuse, whose round trips cost far more here (webproxy on a `byte` mount ran at
    about 0.6× the io_uring figure): a run that measured that unnoticed would read as a
    slower mount. Each benchmark records the transport its mounts report."""
    if not FUSE_URING.exists() or FUSE_URING.read_text().strip() == "Y":
        return
    try:
        FUSE_URING.write_text("Y\n")
        log(f"turned on FUSE over io_uring: {FUSE_URING} = Y")
    except OSError as e:
        log(f"FUSE over io_uring stays off ({e}): the mounts serve over /dev/fuse")


def mount_transport(mountpoint, alignfs=ALIGNFS) -> str:
    """How a running alignfs mount receives its requests, as `alignfs stat` reports it."""
    report = json.loads(run([alignfs, "stat", mountpoint, "--json"]))
    return report["daemon"]["transport"]
