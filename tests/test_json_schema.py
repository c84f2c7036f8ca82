"""The JSON summary has one description, memtrace/export/schema.py:
docs/json.md is rendered from it, and the documents memtrace writes hold to
it both ways (no key the schema lacks, no required key missing, every value
of its field's type), a real `memtrace run` and one of every section built
from the model's own values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, memtrace_cmd
from test_nvml import HEALTHY, gpu, script

from memtrace.analysis.diagnosis import Diagnosis
from memtrace.core.abi import EVENT_DTYPE, Direction
from memtrace.core.cpu import CpuStats, Preemptor
from memtrace.core.gpu import GpuProcess, GpuSample
from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import CallTotals, Collective
from memtrace.core.overhead import TrapCost
from memtrace.export import schema
from memtrace.export.host import collective_rows, host_section
from memtrace.export.report import summary
from memtrace.export.schemadoc import fields, members, render
from memtrace.model import Model
from memtrace.model.host import HostBook, SensorState

GIB = 1 << 30


def mismatches(value: Any, tp: Any, path: str = "$") -> list[str]:
    """Where a document (as JSON gives it back) departs from a schema type."""
    if tp is Any:
        return []
    if value is None:
        return [] if type(None) in members(tp) else [f"{path}: null, where {tp} allows none"]
    (t,) = [t for t in members(tp) if t is not type(None)]
    if hasattr(t, "__required_keys__"):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object ({t.__name__})"]
        described = {f.name: f for f in fields(t)}
        out = [f"{path}.{k}: a key {t.__name__} does not have" for k in value if k not in described]
        out += [f"{path}.{k}: missing from {t.__name__}" for k, f in described.items() if f.required and k not in value]
        for k, v in value.items():
            if k in described:
                out += mismatches(v, described[k].type, f"{path}.{k}")
        return out
    origin = getattr(t, "__origin__", None)
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not an array"]
        return [m for i, v in enumerate(value) for m in mismatches(v, t.__args__[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object"]
        return [m for k, v in value.items() for m in mismatches(v, t.__args__[1], f"{path}.{k}")]
    # A number may be written without a fraction; a boolean is no number.
    ok = {float: (int, float), int: (int,), bool: (bool,), str: (str,)}[t]
    if isinstance(value, bool) != (t is bool) or not isinstance(value, ok):
        return [f"{path}: {value!r} is not a {t.__name__}"]
    return []


def test_docs_json_md_is_the_schema_rendered() -> None:
    """Each field is described once, in the schema: the page users read is made from it."""
    assert (REPO / "docs" / "json.md").read_text() == render(), (
        "docs/json.md is not the schema's: python -m memtrace.export.schemadoc > docs/json.md"
    )


def test_the_checker_finds_keys_on_either_side_and_wrong_types() -> None:
    row = {"pid": 1, "start_time_unix_nano": 0, "process": "p", "api": "cuLaunchKernel", "kind": "kernel"}
    row |= {"launches": 3, "estimated": False, "partial": False}
    assert mismatches(row, schema.LaunchRow) == []
    assert mismatches({**row, "extra": 1}, schema.LaunchRow) == ["$.extra: a key LaunchRow does not have"]
    assert mismatches({k: v for k, v in row.items() if k != "partial"}, schema.LaunchRow) == [
        "$.partial: missing from LaunchRow"
    ]
    assert mismatches({**row, "launches": 1.5}, schema.LaunchRow) == ["$.launches: 1.5 is not a int"]
    assert mismatches({**row, "estimated": 0}, schema.LaunchRow) == ["$.estimated: 0 is not a bool"]


def _events(rows: list[tuple[ProcessKey, int, int, int]]) -> np.ndarray:
    """(process, api, bytes, stream) rows, each a millisecond after the last."""
    b = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, (key, api, nbytes, stream) in enumerate(rows):
        b[i]["pid"] = b[i]["tid"] = key.pid
        b[i]["start_ns"], b[i]["api"], b[i]["bytes"], b[i]["stream"] = key.start_ns, api, nbytes, stream
        b[i]["direction"], b[i]["duration_ns"], b[i]["ts_ns"] = Direction.H2D, 1000, (i + 1) * 1_000_000
        b[i]["dst"] = 0x7000_0000_0000 + i * (1 << 30)
    return b


def test_a_summary_of_every_section_holds_to_the_schema() -> None:
    """Every section built from the model's values, with the keys a real run
    seldom has: a diagnosis, an attached libnccl, a CPU quota, a preemptor,
    GPU counters and a lost GPU sample."""
    key = ProcessKey(4242, 5_000_000_000)
    m = Model()
    m.boot_wall_ns = 1_700_000_000 * 10**9
    copies = [(key, 22, 4096, 0)] * 3 + [(key, 60, 1 << 20, 0)] + [(key, 80, 0, 7)] * 3  # copies, alloc, waits
    m.add_events(_events(copies))
    m.introduce(key, "trainer", 11)
    m.set_launches(key, {100: 12})
    m.set_traps(key, 40)
    m.trap_cost = TrapCost(1e-6, 2e-6, kind="emulated")
    book = HostBook()
    book.set_sensor("cpu", SensorState(True))
    book.set_sensor("gpu", SensorState(False, "no NVIDIA driver here", "install one"))
    hist = (1, 2, 3) + (0,) * 23
    preemptors = (Preemptor(0, 2, 7, 0, ""), Preemptor(98, 1, 3, 8, "gz"))
    book.set_cpu({key: CpuStats(key.pid, key.start_ns, hist, hist, 10, 20, 30, 4, 5, 99, preemptors)})
    book.set_quota(key, "/job", 5_000_000, 3)
    sample = dict(index=0, uuid="GPU-a", name="G", bus_id="b", pcie_tx_bytes=10, pcie_rx_bytes=20)
    sample |= dict(link_generation=5, link_width=8, max_link_generation=5, max_link_width=16, temperature_celsius=60)
    sample |= dict(clock_event_mask=0x4, sm_utilization_percent=90.0)
    book.add_gpus([GpuSample(time_ns=10**9, processes=(GpuProcess(key.pid, 0, "GPU-a", GIB),), **sample)])
    book.add_gpus([GpuSample(time_ns=2 * 10**9, **{**sample, "pcie_tx_bytes": 99})])
    book.add_gpus([GpuSample(time_ns=3 * 10**9, lost=True, xids=(79,), **sample)])
    book.cpu_gaps = {"switch_gaps": 1}
    book.set_collectives({(key, Collective.ALLREDUCE): CallTotals(3, 300, 0, 0, 9000)}, ["libnccl.so.2"])
    fast = schema.FastSampler(
        state="on", rate_hz=100.0, ticks=5, late_ticks=0, net_errors=0, interfaces_dropped=0, cpu_seconds=0.01
    )
    host = host_section(
        book,
        boot_wall_ns=m.boot_wall_ns,
        cgroup_names={99: "/job/own", 98: "/other"},
        pids=None,
        sample_interval_seconds=0.1,
        sample_errors=0,
        fast_sampler=fast,
    )
    coll = collective_rows(
        book, boot_wall_ns=m.boot_wall_ns, attached={key: 1.5}, waits={(key, Collective.ALLREDUCE): (2, 10**6)}
    )
    diag = Diagnosis("cpu_interference", key, "trainer", "slow", 2.0, 1, 2, {"score": 8.0}, "fix it", 3, 4)
    command = schema.Command(argv=["t"], exit_code=0, wall_seconds=1.0)
    built = summary(m, {}, [], command, host=host, collectives=coll, diagnoses=[diag], stacks=[])
    doc = json.loads(json.dumps(built))
    assert mismatches(doc, schema.Summary) == []
    for section in ("memcpy", "device_memory", "synchronization", "launches", "overhead", "collectives", "diagnoses"):
        assert doc[section], section  # each was checked, not only its absence
    assert doc["collectives"][0]["attached_time_unix_nano"] == 1_500_000_000
    assert doc["host"]["cpu"][0]["start_time_unix_nano"] == m.boot_wall_ns + key.start_ns
    assert [p["cgroup"] for p in doc["host"]["cpu"][0]["preempted_by"]] == ["(idle: own CPU quota)", "/other"]
    assert doc["host"]["gpus"][0]["pcie_link"]["lowest_seen"] == {"generation": 5, "width": 8}


@pytest.mark.bpf
def test_a_real_run_holds_to_the_schema_both_ways(fakecuda: Path, fakenvml: Path, tmp_path: Path) -> None:
    """`memtrace run --stacks` around copies and allocations, a stepping
    loop and collectives, with a GPU (the test NVML) and the host's network:
    every key it writes is the schema's, every key the schema requires is
    there, and each value is of its field's type."""
    nvml_script = tmp_path / "nvml.script"
    counters = {"pcie_tx_count": 10**12, "pcie_rx_count": 0}
    nvml_script.write_text(script(count=1, driver="580.65.06", **gpu(0, uuid="GPU-aaaa", **HEALTHY, **counters)))
    lib = fakecuda / "lib"
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=f"{fakenvml}:{lib}",
        FAKE_NVML_SCRIPT=str(nvml_script),
        NCCL_CUDART=str(lib / "libcudart.so.13"),
        WORKLOAD_TRUTH=str(tmp_path / "truth.jsonl"),
    )
    nccl = f"{fakecuda}/nccl_workload {fakecuda}/nccl/libnccl.so.2 20"
    work = f"{fakecuda}/memwork -r 2 && {fakecuda}/steploop -n 60 -k 2000 -w 1000 && {nccl}"
    out = tmp_path / "summary.json"
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--stacks", "--host-interval", "0.05", "--format", "json", "-o", str(out)]
        + ["--", "sh", "-c", work],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert mismatches(doc, schema.Summary) == []
    # The check covered every kind of row: none of these was empty.
    for path in (
        "memcpy",
        "device_memory",
        "synchronization",
        "launches",
        "steps",
        "collectives",
        "stacks",
        "host.cpu",
        "host.gpus",
        "host.network.interfaces",
    ):
        part: Any = doc
        for k in path.split("."):
            part = part[k]
        assert part, path
    assert {"drain", "stacks"} <= doc["agent"].keys() and "command" in doc


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
