#!/usr/bin/env python3
"""Write to an NBD export until killed or done, and log every write sent and every
write the server acknowledged; or check that every logged write reads back.

  acked_writes.py write HOST PORT LOG SEED SECONDS   (two connections, disjoint halves)
  acked_writes.py check HOST PORT LOG

Writes are 512 B-4 KiB (the uhs NVM buffer) or 64-256 KiB (straight to the SSD), some
with FUA, with a FLUSH now and then; each carries its own sequence number in every
512-byte sector, so a check names the exact write that was lost.
"""
import random
import socket
import struct
import sys
import threading
import time

IHAVEOPT = 0x49484156454F5054
REQUEST = 0x25609513
READ, WRITE, DISC, FLUSH = 0, 1, 2, 3
FUA = 1


def recv(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("server closed the connection")
        out += chunk
    return out


def connect(host, port):
    s = socket.create_connection((host, int(port)))
    hello = recv(s, 18)
    assert hello[:8] == b"NBDMAGIC", hello
    s.sendall(struct.pack(">I", 3))
    name = b"alignfs"
    s.sendall(struct.pack(">QII", IHAVEOPT, 7, 4 + len(name) + 2) + struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
    size = None
    while True:
        _, _, reply, length = struct.unpack(">QIII", recv(s, 20))
        data = recv(s, length) if length else b""
        if reply == 3 and struct.unpack(">H", data[:2])[0] == 0:
            size = struct.unpack(">Q", data[2:10])[0]
        if reply == 1:
            return s, size
        if reply >= 1 << 31:
            raise RuntimeError(f"GO refused: {reply:#x}")


def command(s, cmd, cookie, offset, length, payload=b"", flags=0):
    s.sendall(struct.pack(">IHHQQI", REQUEST, flags, cmd, cookie, offset, length) + payload)
    magic, error, got = struct.unpack(">IIQ", recv(s, 16))
    assert magic == 0x67446698 and got == cookie, (magic, got, cookie)
    if error:
        raise RuntimeError(f"command {cmd} at {offset} failed: errno {error}")
    return recv(s, length) if cmd == READ else b""


def pattern(seq, length):
    sector = struct.pack(">Q", seq) * 64
    return sector * (length // 512)


def writer(host, port, log, lock, rng, region, deadline):
    s, _ = connect(host, port)
    start, end = region
    seq = 0
    while time.time() < deadline:
        if rng.random() < 0.6:
            length = rng.randrange(1, 9) * 512
        else:
            length = rng.randrange(16, 65) * 4096
        offset = start + rng.randrange(0, (end - start - length) // 512) * 512
        seq = rng.getrandbits(62) | 1
        with lock:
            log.write(f"P {offset} {length} {seq}\n")
            log.flush()
        command(s, WRITE, seq, offset, length, pattern(seq, length), FUA if rng.random() < 0.2 else 0)
        with lock:
            log.write(f"A {seq}\n")
            log.flush()
        if rng.random() < 0.05:
            command(s, FLUSH, 0, 0, 0)


def main():
    mode, host, port, log_path = sys.argv[1:5]
    if mode == "write":
        seed, seconds = int(sys.argv[5]), float(sys.argv[6])
        _, size = connect(host, port)
        deadline = time.time() + seconds
        lock = threading.Lock()
        with open(log_path, "a") as log:
            threads = []
            for i in range(2):
                region = (i * size // 2, (i + 1) * size // 2)
                t = threading.Thread(target=lambda r=region, k=i: safe(writer, host, port, log, lock, random.Random(seed * 10 + k), r, deadline))
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
        return
    # check: replay the log into the latest write of each sector, then read back
    # A write sent but never acknowledged (in flight at the kill) may have landed in
    # part: its sectors may hold it instead of the last acknowledged write.
    latest, maybe, pending = {}, {}, {}
    with open(log_path) as log:
        for line in log:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "P":
                offset, length, seq = map(int, parts[1:])
                pending[seq] = (offset, length)
            elif len(parts) == 2 and parts[0] == "A" and int(parts[1]) in pending:
                seq = int(parts[1])
                offset, length = pending.pop(seq)
                for sector in range(offset, offset + length, 512):
                    latest[sector] = seq
                    maybe.pop(sector, None)
        for seq, (offset, length) in pending.items():
            for sector in range(offset, offset + length, 512):
                maybe.setdefault(sector, set()).add(seq)
    s, size = connect(host, port)
    bad = 0
    chunk = 4 << 20
    image = {}
    wanted = {sector // chunk for sector in latest}
    for base in sorted(wanted):
        image[base] = command(s, READ, 1, base * chunk, min(chunk, size - base * chunk))
    for sector, seq in sorted(latest.items()):
        block = image[sector // chunk]
        data = block[sector % chunk:sector % chunk + 512]
        if data != struct.pack(">Q", seq) * 64 and data[:8] not in {struct.pack(">Q", m) for m in maybe.get(sector, ())}:
            bad += 1
            if bad <= 5:
                print(f"sector {sector}: expected write {seq:#x}, found {data[:8].hex()}", file=sys.stderr)
    print(f"checked {len(latest)} sectors of acknowledged writes: {bad} lost")
    sys.exit(1 if bad else 0)


def safe(fn, *args):
    try:
        fn(*args)
    except (ConnectionError, OSError):
        pass  # the server was killed: what was acknowledged is in the log


if __name__ == "__main__":
    main()
