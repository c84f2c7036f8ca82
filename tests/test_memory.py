"""Memory intelligence against a workload's own truth: host memory kind of
every copy (pinned, pageable, managed), unified directions resolved from the
pointers, exact 2D/3D bytes, device memory in use and leaked, waits and
launches counted once, through real probes on the test libraries."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from conftest import run_traced

pytestmark = pytest.mark.bpf

BUILDS = {
    "runtime": ("memwork", "runtime"),  # libcudart.so calling libcuda, like PyTorch
    "static": ("memwork_static", "runtime"),  # cudart linked into the executable, like nvcc's default
    "driver": ("memwork_driver", "driver"),  # libcuda only, like JAX and CuPy
}


def copies_by_host(doc: dict, pid: int) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    out: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in doc["memcpy"]:
        if r["pid"] == pid:
            t = out[(r["api"], r["direction"], r["host_memory"] or "")]
            t[0] += r["calls"]
            t[1] += r["bytes"]
            t[2] += r["errors"]
    return {k: tuple(v) for k, v in out.items()}  # type: ignore[misc]


@pytest.mark.parametrize("links", ["multi", "single"])
@pytest.mark.parametrize("build", sorted(BUILDS))
def test_every_classification_and_total_matches_the_truth(
    build: str, links: str, fakecuda: Path, tmp_path: Path
) -> None:
    """Both ways of attaching: a multi-uprobe link per program and library
    (this kernel has them), and a link per probe (kernels before 6.6, and
    MEMTRACE_UPROBE_MULTI=0)."""
    exe, layer = BUILDS[build]
    env = {"MEMTRACE_UPROBE_MULTI": "0"} if links == "single" else {}
    doc, lines, p = run_traced([str(fakecuda / exe), "-r", "4"], tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    for lib in doc["agent"]["libraries"]:
        # Copies, memory calls and waits take an entry and a return; launches (driver only) an entry.
        launches = sum(s.startswith(("cuLaunch", "cuGraphLaunch")) for s in lib["symbols"])
        per_probe = 2 * (lib["probes"] - launches) + launches
        assert lib["links"] == ({"runtime": 2, "driver": 3}[lib["layer"]] if links == "multi" else per_probe), lib
    (truth,) = lines
    pid = truth["pid"]

    # Copies: api, resolved direction and host memory kind, call for call, byte for byte.
    want = {
        (c["api"], c["direction"], c["host_memory"]): (c["calls"], c["bytes"], c["errors"]) for c in truth["copies"]
    }
    assert copies_by_host(doc, pid) == want
    assert {r["layer"] for r in doc["memcpy"]} == {layer}
    # Unified copies were resolved; only the one touching managed memory stays default.
    defaults = {r["host_memory"] for r in doc["memcpy"] if r["direction"] == "default"}
    assert defaults == {"managed"}

    # Device memory: allocations, frees, unknown frees, what is still in use and leaked.
    (mem,) = [m for m in doc["device_memory"] if m["pid"] == pid]
    for k, v in truth["device_memory"].items():
        got = mem["outstanding"] if k == "outstanding" else mem[k]
        assert got == v, k
    assert mem["exited"] and mem["peak_bytes"] >= mem["in_use_bytes"]
    assert mem["pinned_host_bytes"] == 0  # all freed or unregistered before exit

    # Waits: one row per API that was called, counted once across the layers.
    waits = {w["api"]: w["calls"] for w in doc["synchronization"] if w["pid"] == pid}
    assert waits == truth["sync"]
    assert all(w["duration_seconds"]["sum"] > 0 for w in doc["synchronization"])

    # Launches: runtime launches reach the driver's, where each is counted once.
    kinds: dict[str, int] = defaultdict(int)
    for l in doc["launches"]:
        if l["pid"] == pid:
            kinds[l["kind"]] += l["launches"]
    assert dict(kinds) == truth["launches"]

    agent = doc["agent"]
    assert agent["dropped"] == 0 and agent["calls_without_event"] == 0
    if layer == "runtime":
        # Every runtime copy, allocation and wait made its driver twin, seen and not counted.
        assert agent["nested_driver_calls"] > 0
