#!/usr/bin/env python3
"""Unmodified programs under the LD_PRELOAD shim (crates/alignfs-preload).

Formats a small volume, then runs with LD_PRELOAD=libalignfs_preload.so and
ALIGNFS_PREFIX=<work>/af:
  - Python's file API (this script, re-run as a child with --python-checks);
  - C stdio (fopen, fgets, fseek, fwrite …: glibc's stdio bypasses the interposed
    symbols) and coreutils ls, cat, rm;
  - the sqlite3 CLI: a table of 5,000 rows, PRAGMA integrity_check;
  - fio (psync, --thread, verify=crc32c) on random 4/32/100 KiB writes;
  - RocksDB db_bench (fillrandom with sync, verifychecksum, readrandom), which must find
    the same keys as the same seeded run on the host and on the mount;
  - the mount then reads what the shim wrote (sqlite integrity_check);
  - processes: a fork's child gets EIO on the parent's files, an exec'd child (sh -c)
    that touches the prefix gets EBUSY instead of hanging, helpers that do not touch it
    (timeout, sh -c true) are unaffected, and the prefix matches whole components only.
Afterwards `alignfs fsck` must find the volume clean. Prints one line per check and
`suite totals: N passed, M failed`.

usage: run.py ALIGNFS_BINARY PRELOAD_LIBRARY WORK_DIR
"""

import errno
import os
import subprocess
import sys

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)


def python_checks(prefix):
    """Runs inside the shim."""
    data = os.urandom(3_000_000)
    os.mkdir(f"{prefix}/dir")
    with open(f"{prefix}/dir/big", "wb") as f:
        f.write(data)
    with open(f"{prefix}/dir/big", "rb") as f:
        check("python: write and read back 3 MB", f.read() == data)
    with open(f"{prefix}/dir/big", "r+b") as f:
        f.seek(1_000_001)
        f.write(b"patch")
        f.seek(-5, os.SEEK_END)
        tail = f.read()
    check("python: seek, overwrite, read the tail", tail == data[-5:])
    with open(f"{prefix}/dir/lines.txt", "w") as f:
        f.writelines(f"line {i}\n" for i in range(1000))
    with open(f"{prefix}/dir/lines.txt", "a") as f:
        f.write("appended\n")
    with open(f"{prefix}/dir/lines.txt") as f:
        lines = f.readlines()
    check("python: text lines, append mode", len(lines) == 1001 and lines[-1] == "appended\n")
    check("python: listdir", sorted(os.listdir(f"{prefix}/dir")) == ["big", "lines.txt"])
    st = os.stat(f"{prefix}/dir/big")
    check("python: stat size and mode", st.st_size == len(data) and (st.st_mode & 0o170000) == 0o100000)
    fd = os.open(f"{prefix}/dir/raw", os.O_CREAT | os.O_RDWR, 0o600)
    os.pwrite(fd, b"x" * 5000, 70_000)
    os.fsync(fd)
    os.ftruncate(fd, 70_100)
    check("python: os.pwrite/pread/ftruncate/fstat", os.pread(fd, 100, 70_000) == b"x" * 100 and os.fstat(fd).st_size == 70_100)
    os.close(fd)
    os.rename(f"{prefix}/dir/raw", f"{prefix}/dir/renamed")
    check("python: rename", os.path.exists(f"{prefix}/dir/renamed") and not os.path.exists(f"{prefix}/dir/raw"))
    try:
        open(f"{prefix}/missing")
        check("python: a missing file raises FileNotFoundError", False)
    except FileNotFoundError:
        check("python: a missing file raises FileNotFoundError", True)
    try:
        os.rmdir(f"{prefix}/dir")
        check("python: rmdir of a non-empty directory fails", False)
    except OSError as e:
        check("python: rmdir of a non-empty directory fails", e.errno == errno.ENOTEMPTY, str(e))
    os.chdir(os.path.dirname(prefix))
    with open(os.path.basename(prefix) + "/relative.txt", "w") as f:
        f.write("relative")
    check("python: relative paths resolve against the real cwd", os.path.exists(f"{prefix}/relative.txt"))
    sibling = prefix + "x"
    with open(sibling, "w") as f:
        f.write("host")
    check("python: the prefix matches whole components (…x stays on the host)", os.path.exists(sibling))
    try:
        import mmap

        with open(f"{prefix}/dir/big", "rb") as f:
            mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)
        check("python: mmap of an alignfs file fails clearly", False)
    except OSError as e:
        check("python: mmap of an alignfs file fails clearly", e.errno == errno.ENODEV, str(e))
    # Processes.
    keep = os.open(f"{prefix}/dir/big", os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        try:
            os.pread(keep, 10, 0)
            os._exit(1)
        except OSError as e:
            os._exit(0 if e.errno == errno.EIO else 2)
    _, status = os.waitpid(pid, 0)
    check("processes: a fork's child gets EIO on the parent's files", os.waitstatus_to_exitcode(status) == 0)
    check("processes: the parent still reads after the fork", len(os.pread(keep, 10, 0)) == 10)
    os.close(keep)
    try:
        child = subprocess.run(["sh", "-c", f"ls {prefix}"], capture_output=True, timeout=20)
        check("processes: an exec'd child touching the prefix gets EBUSY, no hang",
              child.returncode != 0 and b"in use" in child.stderr, child.stderr.decode()[-200:])
    except subprocess.TimeoutExpired:
        check("processes: an exec'd child touching the prefix gets EBUSY, no hang", False, "timed out")
    helper = subprocess.run(["timeout", "5", "sh", "-c", "true"], timeout=20)
    check("processes: helpers that stay off the prefix are unaffected", helper.returncode == 0)
    with open(f"{prefix}/dir/big", "rb") as f:
        check("processes: the parent still owns the volume", len(f.read(100)) == 100)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--python-checks":
        python_checks(sys.argv[2])
        sys.exit(0 if all(results) else 1)
    binary, library, work = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    os.makedirs(work, exist_ok=True)
    fast = f"/dev/shm/alignfs-preload-{os.getpid()}"
    ssd = f"{work}/ssd.img"
    prefix = f"{work}/af"
    subprocess.run([binary, "mkfs", "--force", "--fast", f"{fast}:64M", "--ssd", f"{ssd}:1G"], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, LD_PRELOAD=library, ALIGNFS_PREFIX=prefix, ALIGNFS_FAST=fast, ALIGNFS_SSD=ssd)

    def run(name, argv, expect=None, timeout=300, absent=None):
        try:
            r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            check(name, False, "timed out")
            return
        ok = r.returncode == 0 and (expect is None or expect in r.stdout) and (absent is None or absent not in r.stdout)
        check(name, ok, (r.stdout + r.stderr)[-400:])

    try:
        child = subprocess.run([sys.executable, __file__, "--python-checks", prefix], env=env, timeout=300, capture_output=True, text=True)
        sys.stdout.write(child.stdout)
        sys.stdout.flush()
        results.extend(line.startswith("ok") for line in child.stdout.splitlines() if line[:4] in ("ok  ", "FAIL"))
        check("python: the checks ran to the end", child.returncode == 0, child.stderr[-400:])
        stdio = f"{work}/stdio"
        subprocess.run(["cc", "-O2", "-Wall", "-o", stdio, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stdio.c")], check=True)
        run("c stdio: fopen/fprintf/fputs/fflush/fseek/ftell/fgets/fread/fwrite/fclose", [stdio, f"{prefix}/dir/stdio.txt"], expect="stdio ok")
        run("coreutils: ls -l lists the volume's files", ["ls", "-l", f"{prefix}/dir"], expect="stdio.txt")
        run("coreutils: cat reads a file", ["cat", f"{prefix}/dir/lines.txt"], expect="line 999\nappended")
        run("coreutils: rm removes it", ["rm", f"{prefix}/dir/lines.txt"])
        run("coreutils: it is gone", ["ls", f"{prefix}/dir"], expect="stdio.txt", absent="lines.txt")
        bad = subprocess.run(["ls", f"{prefix}/dir"], env=dict(env, ALIGNFS_DEVICE_LATENCY="yes"), capture_output=True, text=True, timeout=20)
        check("config: ALIGNFS_DEVICE_LATENCY=yes is refused by name and the shim stays off",
              "ALIGNFS_DEVICE_LATENCY=yes: not a number; use 0, 1 or a flash latency scale; the shim is off" in bad.stderr
              and bad.returncode != 0, bad.stderr[-300:])
        bad = subprocess.run(["ls", f"{prefix}/dir"], env=dict(env, ALIGNFS_CLEAN_CACHE="lots"), capture_output=True, text=True, timeout=20)
        check("config: ALIGNFS_CLEAN_CACHE=lots is refused by name and the shim stays off",
              'ALIGNFS_CLEAN_CACHE=lots: cannot parse size "lots"' in bad.stderr and "the shim is off" in bad.stderr
              and bad.returncode != 0, bad.stderr[-300:])
        sql = ("create table t(a integer primary key, b text);"
               "insert into t(b) select hex(randomblob(100)) from generate_series(1,5000);"
               "delete from t where a % 7 = 0; pragma integrity_check; select count(*) from t;")
        run("sqlite3: 5,000 rows, integrity_check ok", ["sqlite3", f"{prefix}/db.sqlite", sql], expect="ok\n4286")
        run("sqlite3: reopened, integrity_check ok", ["sqlite3", f"{prefix}/db.sqlite", "pragma integrity_check; select count(*) from t;"], expect="ok\n4286")
        run("fio: psync random writes verified with crc32c",
            ["fio", "--thread", "--name=verify", f"--filename={prefix}/fio.dat", "--size=128M", "--rw=randwrite",
             "--bssplit=4k/40:32k/30:100k/30", "--ioengine=psync", "--verify=crc32c", "--fsync=16", "--verify_fatal=1"])
        # RocksDB: the same seeded workload on the shim and on the host must find the same keys.
        bench = ["db_bench", "--benchmarks=fillrandom,verifychecksum,readrandom", "--num=20000", "--reads=20000",
                 "--seed=42", "--compression_type=none", "--sync=1"]

        def found(db, environment):
            r = subprocess.run(bench + [f"--db={db}"], env=environment, capture_output=True, text=True, timeout=600)
            line = next((l for l in r.stdout.splitlines() if l.startswith("readrandom")), "")
            return r.returncode, line[line.find("("):] if "(" in line else "", r.stdout + r.stderr

        code, on_shim, output = found(f"{prefix}/rocks", env)
        _, on_host, _ = found(f"{work}/rocks-host", dict(os.environ))
        check("rocksdb db_bench: fillrandom, verifychecksum, readrandom on the shim", code == 0 and "verifychecksum" in output, output[-400:])
        check("rocksdb db_bench: finds the same keys as on the host", on_shim != "" and on_shim == on_host, f"{on_shim} vs {on_host}")
        # The same volume through the mount, now that no shim process holds it.
        mnt = f"{work}/mnt"
        subprocess.run([binary, "mount", "--fast", fast, "--ssd", ssd, "--log", f"{work}/mount.log", mnt], check=True, stdout=subprocess.DEVNULL)
        try:
            _, on_mount, _ = found(f"{mnt}/rocks-mount", dict(os.environ))
            check("rocksdb db_bench: finds the same keys as on the mount", on_shim == on_mount, f"{on_shim} vs {on_mount}")
            r = subprocess.run(["sqlite3", f"{mnt}/db.sqlite", "pragma integrity_check; select count(*) from t;"], capture_output=True, text=True)
            check("the mount reads what the shim wrote (sqlite integrity_check)", r.stdout == "ok\n4286\n", r.stdout + r.stderr)
        finally:
            subprocess.run([binary, "umount", mnt], stdout=subprocess.DEVNULL)
        status = subprocess.run([binary, "fsck", "--fast", fast, "--ssd", ssd], capture_output=True, text=True)
        check("fsck after the programs exited: clean", status.returncode == 0 and status.stdout.strip().endswith("clean"), status.stdout[-300:])
    finally:
        if os.path.exists(fast):
            os.remove(fast)
    failed = results.count(False)
    print(f"suite totals: {len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
