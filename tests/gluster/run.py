#!/usr/bin/env python3
"""GlusterFS on alignfs bricks: bring-up, a node failure in the middle of writes, recovery.

With deploy/gluster/cluster.sh (its own namespace names and state directory, so a
cluster someone left up is not touched):
  0. a bring-up that fails half-way must leave nothing behind;
  1. bring up 3 nodes with a replica-3 volume on alignfs bricks;
  2. run tests/gluster/brick_requirements.py on node 1's alignfs mount;
  3. fio (psync, verify=crc32c) writes through the client mount; two seconds in, node 2's
     alignfs daemon is killed with SIGKILL: its watchdog must take the brick out of
     service, and fio must finish and verify every block;
  4. the client writes a new file while node 2 is down;
  5. `cluster.sh recover 2`: remount, restart the brick, self-heal to completion;
  6. every file has the same checksum on all three bricks and through the client;
  7. node 3 loses its devices: `cluster.sh rebuild 3` formats a new volume, resets the
     brick and heals it in full; the checksums must match again;
  8. teardown leaves no namespace, mount, process or file behind.
Prints one line per check, the figures, and `suite totals: N passed, M failed`.

usage: run.py ALIGNFS_BINARY
"""

import hashlib
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.join(HERE, "..", "..", "deploy", "gluster", "cluster.sh")
NAME = "afgt"
STATE = "/var/tmp/alignfs-gluster-test"
SHM = "/dev/shm/alignfs-gluster-test"
CLIENT_MNT = f"{STATE}/client/mnt"

results = []
figures = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail and not ok else ''}", flush=True)
    return ok


def cluster(*args, check_status=True, capture=True, timeout=600, env=None):
    proc = subprocess.run([CLUSTER, *args], capture_output=capture, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
    if check_status and proc.returncode != 0:
        raise RuntimeError(f"cluster.sh {' '.join(args)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc


def online_bricks():
    out = cluster("exec", "1", "gluster", "--mode=script", "volume", "status", "gv0", "detail", check_status=False).stdout
    return len(re.findall(r"^Online\s*:\s*Y", out, re.M))


def drill():
    # A bring-up that fails half-way (mkfs refuses a 1 KiB SSD, after the namespaces
    # exist) must take down what it made.
    failed = cluster("up", check_status=False, env={"AFG_SSD_SIZE": "1K"})
    left = leftovers()
    check("a bring-up failing half-way removes what it made", failed.returncode != 0 and not left, left or failed.stdout)
    start = time.monotonic()
    cluster("up", "--nodes", "3")
    figures.append(f"bring-up of 3 nodes: {time.monotonic() - start:.1f} s")
    check("cluster up: 3 bricks online", online_bricks() == 3)

    req = cluster("exec", "1", "python3", os.path.join(HERE, "brick_requirements.py"), f"{STATE}/n1/mnt/requirements",
                  check_status=False)
    print(req.stdout, end="")
    results.extend(line.startswith("ok ") for line in req.stdout.splitlines() if line.startswith(("ok ", "FAIL")))
    check("brick requirements on node 1's alignfs mount", req.returncode == 0, req.stderr)

    fio = subprocess.Popen(
        [CLUSTER, "exec", "client", "fio", "--name=replicated", f"--directory={CLIENT_MNT}", "--rw=randwrite",
         "--bs=64k", "--size=256M", "--ioengine=psync", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1",
         "--output-format=terse", "--terse-version=3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    writing = fio.poll() is None
    check("fio was still writing when the node failed", writing)
    killed = time.monotonic()
    cluster("kill-alignfs", "2")
    offline_after = None
    while time.monotonic() - killed < 30:
        if online_bricks() == 2:
            offline_after = time.monotonic() - killed
            break
        time.sleep(0.05)
    check("the watchdog took node 2's brick out of service", offline_after is not None)
    if offline_after is not None:
        figures.append(f"brick out of service {offline_after:.2f} s after its alignfs daemon was killed")
    out, err = fio.communicate(timeout=600)
    fields = out.strip().split(";")
    ok = fio.returncode == 0 and len(fields) > 48
    check("fio finished through the failure and verified every block", ok, err or out[-500:])
    if ok:
        figures.append(f"fio 64 KiB random writes through the failure: {int(fields[47]) / 1024:.1f} MiB/s, "
                       f"verify read {int(fields[6]) / 1024:.1f} MiB/s")

    # A file created while node 2 is down: self-heal must create it there.
    payload = os.urandom(3 << 20)
    writer = subprocess.run([CLUSTER, "exec", "client", "sh", "-c", f"cat > {CLIENT_MNT}/written-while-down"],
                            input=payload, capture_output=True)
    check("the client writes while a node is down", writer.returncode == 0, writer.stderr)

    start = time.monotonic()
    rec = cluster("recover", "2", check_status=False)
    print(rec.stdout, end="")
    check("recover node 2: remount, brick online, heal complete", rec.returncode == 0, rec.stderr)
    figures.append(f"recovery of node 2 (remount, brick restart, self-heal of what was written while it was down): "
                   f"{time.monotonic() - start:.1f} s")
    check("3 bricks online after recovery", online_bricks() == 3)

    same_on_all_bricks("after recovery")

    # Node 3 loses its devices: a new volume, reset-brick, a full heal from the others.
    start = time.monotonic()
    rebuilt = cluster("rebuild", "3", check_status=False)
    print(rebuilt.stdout, end="")
    check("rebuild node 3 on a new volume: reset-brick, full heal", rebuilt.returncode == 0, rebuilt.stderr)
    figures.append(f"rebuild of node 3 from nothing (new volume, full heal): {time.monotonic() - start:.1f} s")
    same_on_all_bricks("after rebuilding node 3")
    through_client = cluster("exec", "client", "md5sum", f"{CLIENT_MNT}/written-while-down").stdout.split()[0]
    check("the client reads the file written while node 2 was down", through_client == hashlib.md5(payload).hexdigest())


def same_on_all_bricks(when):
    # `heal info` lists pending entries, but a full heal's crawl is not among them: give
    # the copies up to a minute to converge.
    deadline = time.monotonic() + 60
    while True:
        sums = [cluster("brick-sums", str(n)).stdout for n in (1, 2, 3)]
        if sums[0] == sums[1] == sums[2] or time.monotonic() > deadline:
            break
        time.sleep(1)
    files = len(sums[0].splitlines())
    check(f"{when}: every file has the same checksum on all three bricks", files >= 2 and sums[0] == sums[1] == sums[2],
          f"{files} files; differ: {[n + 1 for n in range(3) if sums[n] != sums[0]]}")


def leftovers():
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"namespace {line.split()[0]}" for line in netns.splitlines() if line.startswith(f"{NAME}-")]
    with open("/proc/self/mountinfo") as f:
        found += [f"mount {line.split()[4]}" for line in f if STATE in line or SHM in line]
    procs = subprocess.run(["pgrep", "-af", STATE], capture_output=True, text=True).stdout
    found += [f"process {line}" for line in procs.splitlines() if "run.py" not in line]
    found += [f"file {p}" for p in (STATE, SHM) if os.path.exists(p)]
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    os.environ.update(ALIGNFS=os.path.abspath(sys.argv[1]), AFG_NAME=NAME, AFG_STATE=STATE, AFG_SHM=SHM)
    cluster("down", check_status=False)
    try:
        drill()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        check("drill", False, e)
    finally:
        down = cluster("down", check_status=False)
        check("teardown succeeded", down.returncode == 0, down.stderr)
        left = leftovers()
        check("teardown left nothing behind", not left, left)
    for line in figures:
        print(f"gluster: {line}")
    failed = results.count(False)
    print(f"suite totals: {len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
