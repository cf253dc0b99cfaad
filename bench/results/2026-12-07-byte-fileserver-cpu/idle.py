import os
here = os.path.dirname(os.path.abspath(__file__))
import re, sys
for dev in ["2G", "4G"]:
    log = open(f"{here}/device-{dev}/bench.log").read().splitlines()
    vm = [l.split() for l in open(f"{here}/device-{dev}/vmstat.log") if re.match(r"\s*\d", l)]
    samples = [(l[-1], int(l[14]), int(l[12]), int(l[13]), int(l[15])) for l in vm]  # time, id, us, sy, wa
    cells = []
    for i, l in enumerate(log):
        m = re.match(r"\[(\d\d:\d\d:\d\d)\] round \S+: fileserver on (\S+)", l)
        if m and i + 1 < len(log):
            e = re.match(r"\[(\d\d:\d\d:\d\d)\]\s+(\d+) ops/s", log[i + 1])
            if e:
                cells.append((m.group(2), m.group(1), e.group(1), e.group(2)))
    for sys_, t0, t1, ops in cells:
        s = [x for x in samples if t0 <= x[0] <= t1]
        if s:
            avg = lambda k: sum(x[k] for x in s) / len(s)
            busy = (avg(2) + avg(3)) / 100
            print(dev, sys_, ops, "ops/s", f"us {avg(2):.0f}% sy {avg(3):.0f}% idle {avg(1):.0f}% iowait {avg(4):.0f}%",
                  f"CPU per op {busy * 2 / int(ops) * 1e6:.0f} us", len(s), "s")
