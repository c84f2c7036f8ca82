"""Time to attach (issue 6, target 4).

    sudo .venv/bin/python bench/attach_time.py [--rounds R]

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
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import REPO, build_fixtures, need_root

sys.path.insert(0, str(REPO))

DLOPEN = "import ctypes,sys,time; t=time.perf_counter(); ctypes.CDLL(sys.argv[1]); print(time.perf_counter()-t)"


def dlopen_seconds(lib: Path) -> float:
    out = subprocess.run([sys.executable, "-c", DLOPEN, str(lib)], capture_output=True, text=True, check=True)
    return float(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    need_root("attach_time")
    import memtrace.sensors.cuda.source as bpfsource
    from memtrace.runtime.agent import Agent
    from memtrace.sensors.cuda.source import Options

    bpfsource.DETACH_IN_BACKGROUND = False
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-attach-"))
    fx = tmp / "fx"
    build_fixtures(fx)
    start, with_agent, without = [], [], []
    w = subprocess.Popen(
        [str(fx / "workload"), "-w", "-n", "1"], stdin=subprocess.PIPE, env={"WORKLOAD_TRUTH": "/dev/null"}
    )
    time.sleep(0.3)
    try:
        for i in range(a.rounds):
            t = time.perf_counter()
            with Agent(Options()) as agent:
                agent.source.scan([w.pid])
                start.append(time.perf_counter() - t)
                assert len(agent.libraries) == 2
                lib = tmp / f"r{i}" / "libcuda.so.1"
                lib.parent.mkdir()
                shutil.copy(fx / "lib" / "libcuda.so.1", lib)
                stop = threading.Event()

                def drain(ag: Agent = agent, st: threading.Event = stop) -> None:
                    while not st.is_set():
                        ag.poll()
                        time.sleep(0.001)

                th = threading.Thread(target=drain)
                th.start()
                with_agent.append(dlopen_seconds(lib))
                stop.set()
                th.join()
                assert any(Path(x.name).parent == lib.parent or str(lib.parent) in x.name for x in agent.libraries)
            fresh = tmp / f"n{i}" / "libcuda.so.1"
            fresh.parent.mkdir()
            shutil.copy(fx / "lib" / "libcuda.so.1", fresh)
            without.append(dlopen_seconds(fresh))
    finally:
        w.kill()
        w.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, kernel {platform.release()}; {a.rounds} rounds, medians"
    )
    print(f"start to tracing (load, attach 2 libraries, scan): {med(start) * 1e3:8.1f} ms")
    print(
        f"dlopen of a new CUDA library: {med(with_agent) * 1e3:.2f} ms with the agent, "
        f"{med(without) * 1e3:.2f} ms without"
        f" -> held for {(med(with_agent) - med(without)) * 1e3:.2f} ms while its probes were attached"
    )
    print(f"SUMMARY | start to tracing | {med(start) * 1e3:.0f} ms | - | -")
    print(f"SUMMARY | new CUDA library mapped to probes live | {(med(with_agent) - med(without)) * 1e3:.1f} ms | - | -")


if __name__ == "__main__":
    main()
