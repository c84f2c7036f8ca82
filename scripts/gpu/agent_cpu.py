"""What `memtrace run` itself costs in CPU while it traces a steady job on the
GPU machine (issue 16: the agent at most 1% of a core; issue 15: host
sampling at most 0.5% at 100 Hz).

    python3 scripts/gpu/agent_cpu.py OUT.json SETTLE_S -- AGENT_CMD...

AGENT_CMD is the agent itself (memtrace run ... -- JOB), started here so its
pid is known. Its threads' CPU is read every half second from SETTLE_S
after its start (programs loaded, probes attached, calibrated) to its last
reading that still holds every thread (bench/harness.py, watch_threads).
Written: each thread's CPU seconds over the window by name, the total, and
both as a share of one core.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.harness import watch_threads


def main() -> int:
    out, settle = Path(sys.argv[1]), float(sys.argv[2])
    rc, wall_s, window = watch_threads(sys.argv[sys.argv.index("--") + 1 :], settle)
    doc: dict[str, object] = {"rc": rc, "wall_s": wall_s}
    if window is not None:
        doc.update(
            window_s=round(window.wall_s, 2),
            cpu_s=round(window.cpu_s, 3),
            share_of_one_core=round(window.share, 4),
            threads={
                k: {"cpu_s": round(v, 3), "share": round(v / window.wall_s, 4)}
                for k, v in sorted(window.by_name.items())
            },
        )
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
