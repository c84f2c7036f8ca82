"""The shipped objects, proven on real kernels other than this host's:
Debian's arm64 kernel under qemu-system-aarch64 and Debian's amd64 kernel
under qemu-system-x86_64 (KVM when present). In each guest a static harness
loads the object the way the agent does (tests/kernels/harness.c) and runs
a workload whose copies use every argument position memtrace reads (the
7th-argument kind of cudaMemcpy2D: stack on x86-64, x6 on arm64), the
CUDA_MEMCPY2D descriptor read from user memory, runtime-inside-driver
nesting, failed calls, threads and a fork. The kernel's totals must equal
the workload's truth exactly, and the other architecture's object, booted
in the same guest, must not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REPO, truth_totals

from memtrace.core import apis
from memtrace.core.abi import Direction, Stat
from memtrace.core.nccl import CommKind
from memtrace.core.nccl import Stat as NcclStat

KERNELS = REPO / "tests" / "kernels"
CACHE = Path(os.environ.get("MEMTRACE_KERNEL_CACHE", Path.home() / ".cache" / "memtrace-kernels"))
QEMU = {
    "arm64": ["qemu-system-aarch64", "-M", "virt", "-cpu", "max", "-m", "1024"],
    "x86": ["qemu-system-x86_64", "-m", "1024"],
}
CONSOLE = {"arm64": "ttyAMA0", "x86": "ttyS0"}
BOOTED: list[str] = []  # reported at the end of the run (conftest)

pytestmark = pytest.mark.qemu


def parse(log: str) -> dict[str, dict]:
    runs: dict[str, dict] = {}
    cur: dict | None = None
    for raw in log.splitlines():
        # Consoles put escape sequences before some lines: find the marker.
        at = min((i for i in (raw.find("MT-"), raw.find('{"pid"')) if i >= 0), default=-1)
        if at < 0:
            continue
        line = raw[at:].strip()
        if line.startswith("MT-KERNEL "):
            runs["kernel"] = {"release": line.split(maxsplit=1)[1]}
        elif line.startswith("MT-LOAD "):
            _, path, err = line.split()
            runs.setdefault("loads", {})[Path(path).stem.split(".")[0]] = {"err": int(err)}
        elif line.startswith("MT-RUN "):
            cur = runs[line.split()[1]] = {
                "truth": [],
                "totals": {},
                "stats": {},
                "events": None,
                "exit": None,
                "comms": [],
                "nstats": {},
            }
        elif cur is None:
            continue
        elif line.startswith('{"pid"'):
            cur["truth"].append(json.loads(line))
        elif line.startswith("MT-TOTAL "):
            pid, api, d, calls, nbytes, errors = map(int, line.split()[1:])
            cur["totals"][(pid, apis.api_name(api), Direction(d).label)] = (calls, nbytes, errors)
        elif line.startswith("MT-STAT "):
            i, v = map(int, line.split()[1:])
            cur["stats"][Stat(i)] = v
        elif line.startswith("MT-COMM "):
            f = line.split()[1:]
            names = ("pid", "kind", "ret", "rank", "nranks", "color", "key", "comm", "parent")
            cur["comms"].append({**dict(zip(names, map(int, f[:9]), strict=True)), "unique_id": f[9]})
        elif line.startswith("MT-NSTAT "):
            i, v = map(int, line.split()[1:])
            cur["nstats"][NcclStat(i)] = v
        elif line.startswith("MT-EVENTS "):
            cur["events"] = int(line.split()[1])
        elif line.startswith("MT-EXIT "):
            cur["exit"] = int(line.split()[1])
    return runs


def boot(arch: str, tmp: Path) -> tuple[str, str]:
    guest = tmp / f"guest-{arch}"
    # plan.py imports memtrace (and numpy): the interpreter running the tests has them, a system python3 may not.
    b = subprocess.run(
        [str(KERNELS / "build_guest.sh"), arch, str(guest), str(CACHE)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHON=sys.executable),
    )
    assert b.returncode == 0, b.stderr
    cmd = [
        *QEMU[arch],
        "-nographic",
        "-no-reboot",
        "-kernel",
        str(guest / "vmlinuz"),
        "-initrd",
        str(guest / "initrd.gz"),
        "-append",
        f"console={CONSOLE[arch]} rdinit=/init panic=-1 quiet",
    ]
    if arch == "x86":
        cmd += ["-cpu", "max"]  # TCG: KVM is not reliable inside nested VMs, and TCG takes seconds here
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return p.stdout + p.stderr, (guest / "kernel").read_text().strip()


@pytest.mark.parametrize("arch", ["arm64", "x86"])
def test_shipped_object_counts_exactly_on_a_real_kernel(arch: str, tmp_path: Path) -> None:
    if shutil.which(QEMU[arch][0]) is None:
        pytest.fail(f"{QEMU[arch][0]} is missing: run scripts/setup.sh --dev")
    log, package = boot(arch, tmp_path)
    runs = parse(log)
    assert "kernel" in runs and "right" in runs and "wrong" in runs, log[-3000:]
    BOOTED.append(f"{arch}: {runs['kernel']['release']} ({package})")

    right = runs["right"]
    assert right["exit"] == 0, log[-3000:]
    truth = truth_totals(right["truth"])
    assert len({k[0] for k in truth}) == 2  # the workload forked
    assert right["totals"] == truth
    calls = sum(v[0] for v in truth.values())
    assert right["events"] == calls and right["stats"][Stat.DROPPED] == 0
    assert right["stats"][Stat.NESTED] > 0
    # Stacks were taken at the copies (the harness turns them on), none failed or was lost.
    assert right["stats"][Stat.STACKS] >= sum(v[0] for v in truth.values())
    assert right["stats"][Stat.STACK_FAILED] == right["stats"][Stat.STACKS_FULL] == 0
    # Every argument position and the descriptor path were exercised.
    got = defaultdict(int)
    for (_, api, _), v in right["totals"].items():
        got[api] += v[0]
    assert got["cudaMemcpy2D"] and got["cudaMemcpy2DAsync"] and got["cuMemcpy2D_v2"] and got["cuMemcpyPeerAsync"]

    # The other architecture's object reads the wrong registers: the kernel
    # refuses it or it miscounts; it must never pass.
    wrong = runs["wrong"]
    passed = wrong["exit"] == 0 and wrong["truth"] and wrong["totals"] == truth_totals(wrong["truth"])
    assert not passed, "a wrong-arch object counted exactly"

    # The other sensors' objects load there too, their tracepoints attached.
    assert runs.get("loads") == {"sched": {"err": 0}, "nccl": {"err": 0}}, log[-3000:]

    # The NCCL communicator probes read this arch's arguments: the
    # ncclUniqueId passed by value (the caller's stack on x86-64, a pointer
    # in x2 on arm64), the rank after it, and the handles NCCL wrote.
    nccl = runs["nccl"]
    assert nccl["exit"] == 0 and len(nccl["truth"]) == 1, log[-3000:]
    (t,) = nccl["truth"]
    by = defaultdict(list)
    for c in nccl["comms"]:
        assert c["pid"] == t["pid"]
        by[CommKind(c["kind"])].append(c)
    made, failed = by[CommKind.INIT_RANK]
    assert (made["ret"], made["comm"], made["rank"], made["nranks"]) == (0, t["comm"], t["rank"], t["nranks"])
    assert made["unique_id"] == t["id"] and failed["unique_id"] == t["id"]
    assert failed["ret"] != 0 and failed["rank"] == t["nranks"] + 3
    split, nocolor = by[CommKind.SPLIT]
    assert (split["comm"], split["parent"], split["color"], split["key"]) == (
        t["sub"],
        t["comm"],
        t["color"],
        t["rank"],
    )
    assert (nocolor["comm"], nocolor["color"]) == (0, -1)
    ((asked_rank,), (asked_count,)) = by[CommKind.USER_RANK], by[CommKind.COUNT]
    assert (asked_rank["comm"], asked_rank["rank"]) == (t["sub"], t["sub_rank"])
    assert (asked_count["comm"], asked_count["nranks"]) == (t["sub"], t["sub_nranks"])
    assert [(c["comm"], c["rank"], c["nranks"]) for c in by[CommKind.INIT_ALL]] == [
        (t["all"][0], 0, 2),
        (t["all"][1], 1, 2),
    ]
    assert nccl["nstats"][NcclStat.COMMS] == len(nccl["comms"]) == 8
