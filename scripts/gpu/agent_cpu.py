"""What `memtrace run` itself costs in CPU while it traces a steady job on the
GPU machine (issue 16: the agent at most 1% of a core; issue 15: host
sampling at most 0.5% at 100 Hz).

    python3 scripts/gpu/agent_cpu.py OUT.json SETTLE_S -- AGENT_CMD...

AGENT_CMD is the agent itself (memtrace run ... -- JOB), started here so its
pid is known. Every half second each of its threads' CPU time is read from
/proc; the steady window runs from SETTLE_S after its start (programs loaded,
probes attached, calibrated) to the last reading that still holds every
thread the first one did (an agent shutting down joins its threads, and a
thread's CPU time leaves /proc/PID/task with it). Written:
each thread's CPU seconds over the window by name, the total, and both as a
share of one core. Needs memtrace on PYTHONPATH (run.sh sets it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from memtrace.sources.procfs import thread_cpu_seconds as threads


def main() -> int:
    out, settle = Path(sys.argv[1]), float(sys.argv[2])
    cmd = sys.argv[sys.argv.index("--") + 1 :]
    t0 = time.monotonic()
    agent = subprocess.Popen(cmd)
    first: tuple[float, dict[int, tuple[str, float]]] | None = None
    last: tuple[float, dict[int, tuple[str, float]]] | None = None
    while agent.poll() is None:
        time.sleep(0.5)
        now, seen = time.monotonic(), threads(agent.pid)
        if not seen:
            continue
        if first is None and now - t0 >= settle:
            first = (now, seen)
        elif first is not None and set(first[1]) <= set(seen):
            last = (now, seen)
    rc = agent.wait()
    doc: dict[str, object] = {"rc": rc, "wall_s": time.monotonic() - t0}
    if first is not None and last is not None:
        wall = last[0] - first[0]
        per: dict[str, float] = {}
        for tid, (name, cpu) in last[1].items():
            per[name] = per.get(name, 0.0) + cpu - (first[1].get(tid, (name, 0.0))[1])
        total = sum(per.values())
        doc.update(
            window_s=round(wall, 2),
            cpu_s=round(total, 3),
            share_of_one_core=round(total / wall, 4),
            threads={k: {"cpu_s": round(v, 3), "share": round(v / wall, 4)} for k, v in sorted(per.items())},
        )
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
