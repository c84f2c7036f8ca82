"""What reading a namespace's NIC counters 100 times a second costs on this
host, against the timer wake alone (issue 16: the agent at most 1% of a
core with 100 Hz host sampling; issue 15: the sampler at most 0.5%).

    .venv/bin/python bench/nic_read.py [--seconds 8] [--rounds 3]

bench/src/nicread.c, pinned to one CPU, ticks at 100 Hz on an absolute
timer, as the C sampler does, and per tick does one of: nothing; one
RTM_GETSTATS dump of every interface's 64-bit counters (the sampler's read)
with a 64 KiB receive buffer, or an 8 KiB one (the kernel sizes its reply
buffer from the reader's); or one read of /proc/self/net/dev, kept open
(the text alternative). The variants alternate round by round. Printed:
each variant's median share of one core and CPU per tick, and each read's
cost over the wake's. Where the wake and one read already pass 1%, no
agent sampling NICs at 100 Hz meets 1% on this host.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
from pathlib import Path

from common import REPO


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=8, help="per variant per round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    exe = Path(tempfile.mkdtemp(prefix="memtrace-nicread-")) / "nicread"
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(exe), str(REPO / "bench" / "src" / "nicread.c")], check=True)
    cpu = str((os.cpu_count() or 1) - 1)
    out = subprocess.run(
        ["taskset", "-c", cpu, str(exe), str(a.seconds), str(a.rounds)], capture_output=True, text=True, check=True
    ).stdout
    share: dict[str, list[float]] = {}
    tick: dict[str, list[float]] = {}
    for line in out.splitlines():
        r, name, pct, us = line.split("\t")
        share.setdefault(name, []).append(float(pct))
        tick.setdefault(name, []).append(float(us))
        print(f"round {r} {name:14} {float(pct):.3f}% of a core, {float(us):.1f} us a tick", flush=True)
    links = len(os.listdir("/sys/class/net"))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, kernel {platform.release()}; {links} interfaces here")
    wake = statistics.median(share["wake alone"])
    for name in share:
        s, t = statistics.median(share[name]), statistics.median(tick[name])
        extra = "" if name == "wake alone" else f"  (the read alone {s - wake:.3f}%)"
        print(f"{name:14} {s:.3f}% of a core, {t:.1f} us a tick{extra}")
    best = min(statistics.median(share[n]) for n in share if n != "wake alone")
    print(f"SUMMARY | 100 Hz NIC reads, the wake and the cheapest read | {best:.2f}% of one core | - | -")


if __name__ == "__main__":
    main()
