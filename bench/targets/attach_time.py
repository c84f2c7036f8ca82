"""Time to attach (issue 6, target 4).

    sudo .venv/bin/python bench/targets/attach_time.py [--rounds R]

Side by side in one run:
  start to tracing     from creating the agent to its probes being live on a
                       process that already has libcudart and libcuda mapped
                       (load, attach, scan), as `memtrace push` starts
  library to probes    how long a process's dlopen() of a CUDA library it has
                       never mapped takes with the agent running (the process
                       is held at the mmap, the probes attached, the process
                       continued) against the same dlopen() with no agent
Medians over the rounds; each round maps a fresh copy of the library (a new
inode), so every round pays the whole attach.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import Record, Spread

DLOPEN = "import ctypes,sys,time; t=time.perf_counter(); ctypes.CDLL(sys.argv[1]); print(time.perf_counter()-t)"


def dlopen_seconds(lib: Path) -> float:
    out = subprocess.run([sys.executable, "-c", DLOPEN, str(lib)], capture_output=True, text=True, check=True)
    return float(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    harness.need_root("attach_time")
    rec = Record()
    import memtrace.runtime.agent  # noqa: F401 - imported before the clock starts, as a running agent has it

    tmp = Path(tempfile.mkdtemp(prefix="memtrace-attach-"))
    fx = harness.build_fixtures(tmp / "fx")
    start, with_agent, without = [], [], []
    w = subprocess.Popen(
        [str(fx / "workload"), "-w", "-n", "1"], stdin=subprocess.PIPE, env={"WORKLOAD_TRUTH": "/dev/null"}
    )
    time.sleep(0.3)
    try:
        for i, arm in harness.alternating(("with the agent", "without"), a.rounds):
            lib = harness.fresh_copy(fx / "lib" / "libcuda.so.1", tmp / f"{'n' if arm == 'without' else 'r'}{i}")
            if arm == "without":
                without.append(dlopen_seconds(lib))
                continue
            t = time.perf_counter()
            with harness.cuda_agent(detach_in_background=False) as agent:
                agent.scan([w.pid])
                start.append(time.perf_counter() - t)
                assert len(agent.libraries) == 2
                with harness.draining(agent, every_s=0.001):
                    with_agent.append(dlopen_seconds(lib))
                assert any(Path(x.name).parent == lib.parent or str(lib.parent) in x.name for x in agent.libraries)
    finally:
        w.kill()
        w.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    held = [x - y for x, y in zip(with_agent, without, strict=True)]  # each round's
    print(f"machine: {harness.describe()}; {a.rounds} rounds, medians")
    print(f"start to tracing (load, attach 2 libraries, scan): {med(start) * 1e3:8.1f} ms")
    print(
        f"dlopen of a new CUDA library: {med(with_agent) * 1e3:.2f} ms with the agent, "
        f"{med(without) * 1e3:.2f} ms without"
        f" -> held for {(med(with_agent) - med(without)) * 1e3:.2f} ms while its probes were attached"
    )
    rec.add("start to tracing", med(start) * 1e3, "ms", ".0f", spread=Spread.of(x * 1e3 for x in start))
    rec.add(
        "new CUDA library mapped to probes live",
        (med(with_agent) - med(without)) * 1e3,
        "ms",
        ".1f",
        spread=Spread.of(x * 1e3 for x in held),
    )
    rec.write()


if __name__ == "__main__":
    main()
