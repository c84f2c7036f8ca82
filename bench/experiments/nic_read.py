"""What reading a namespace's NIC counters 100 times a second costs on this
host, against the timer wake alone (issue 16: the agent at most 1% of a
core with 100 Hz host sampling; issue 15: the sampler at most 0.5%).

    .venv/bin/python bench/experiments/nic_read.py [--seconds 8] [--rounds 3]

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
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import Record, Spread


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=8, help="per variant per round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rec = Record()
    exe = harness.build_c("nicread.c", Path(tempfile.mkdtemp(prefix="memtrace-nicread-")) / "nicread", ["-Wall"])
    # The variants alternate inside the C program, round by round.
    out = subprocess.run(
        harness.pinned([str(exe), str(a.seconds), str(a.rounds)], harness.LAST_CPU),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    share: dict[str, list[float]] = {}
    tick: dict[str, list[float]] = {}
    for line in out.splitlines():
        r, name, pct, us = line.split("\t")
        share.setdefault(name, []).append(float(pct))
        tick.setdefault(name, []).append(float(us))
        print(f"round {r} {name:14} {float(pct):.3f}% of a core, {float(us):.1f} us a tick", flush=True)
    links = len(os.listdir("/sys/class/net"))
    print(f"machine: {harness.describe()}; {links} interfaces here")
    wake = Spread.of(share["wake alone"]).median
    for name in share:
        s, t = Spread.of(share[name]), Spread.of(tick[name])
        extra = "" if name == "wake alone" else f"  (the read alone {s.median - wake:.3f}%)"
        print(f"{name:14} {s.median:.3f}% of a core ({s.range()}), {t.median:.1f} us a tick{extra}")
        rec.add(f"100 Hz tick in C, {name}", s.median, "% of a core", ".3f", spread=s)
    rec.write()


if __name__ == "__main__":
    main()
