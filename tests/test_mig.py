"""MIG instances as devices of their own in `memtrace run`'s JSON, against the scripted test NVML
(tests/fixtures/nvml.c): their memory, the traced processes on them with their memory there, and
their own GPM activity; a process on an instance is attributed to it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_host_signals import GPU_SCRIPT, TEN_HZ, run
from test_nvml import HEALTHY, gpu, script

pytestmark = pytest.mark.bpf

GIB = 1 << 30


def test_run_reports_each_mig_instance_as_a_device_with_its_process_memory_and_activity(
    tmp_path: Path, fakenvml: Path
) -> None:
    """The traced command runs on instance MIG-1111 (the script lists it there mid-run with 3 GiB);
    another pid runs on MIG-3333. The GPU row attributes the command to its instance; the instance's
    row lists it with its memory there and has its own GPM activity, not the GPU's."""
    nvml_script = tmp_path / "nvml.script"

    def mig(procs0: str) -> dict[str, object]:
        return gpu(
            0, uuid="GPU-mig", **HEALTHY, gpm=1, gpm_sm=91, mig=1,
            mig0__uuid="MIG-1111", mig0__gi=1, mig0__ci=0, mig0__mem_total=40 * GIB, mig0__mem_free=36 * GIB,
            mig0__mem_used=4 * GIB, mig0__gpm_sm=62.5, mig0__gpm_occupancy=30, mig0__gpm_tensor=12, mig0__gpm_dram=7,
            mig0__procs=procs0,
            mig3__uuid="MIG-3333", mig3__gi=5, mig3__ci=0, mig3__mem_total=40 * GIB, mig3__mem_free=39 * GIB,
            mig3__mem_used=GIB, mig3__gpm_sm=4, mig3__procs=f"999999:{GIB}",
        )  # fmt: skip

    nvml_script.write_text(script(count=1, **mig("")))
    env = {"LD_LIBRARY_PATH": str(fakenvml), "FAKE_NVML_SCRIPT": str(nvml_script)}
    on_mig = script(count=1, **mig(f"PID:{3 * GIB}"), gpu0__procs=f"PID:{3 * GIB}")
    doc = run([sys.executable, "-c", GPU_SCRIPT, str(nvml_script), on_mig], tmp_path, env=env, opts=TEN_HZ)
    (g,) = doc["host"]["gpus"]
    (traced,) = [r["pid"] for r in doc["host"]["cpu"]]
    assert g["processes"] == [{"pid": traced, "used_memory_bytes": 3 * GIB, "mig_uuid": "MIG-1111", "sm_percent": None}]
    a, b = g["mig_instances"]
    assert (a["uuid"], a["memory_used_bytes"], a["memory_total_bytes"], a["pids"]) == (
        "MIG-1111",
        4 * GIB,
        40 * GIB,
        [traced],
    )
    assert a["memory_used_over_run"] == {"mean": 4 * GIB, "max": 4 * GIB}
    assert a["processes"] == [{"pid": traced, "used_memory_bytes": 3 * GIB, "mig_uuid": "MIG-1111", "sm_percent": None}]
    assert a["activity"] == {
        "sm_active_percent": {"mean": 62.5, "max": 62.5},
        "sm_occupancy_percent": {"mean": 30.0, "max": 30.0},
        "tensor_active_percent": {"mean": 12.0, "max": 12.0},
        "dram_bandwidth_percent": {"mean": 7.0, "max": 7.0},
    }
    # The other instance: its own activity; its process is not traced, so not listed.
    assert b["uuid"] == "MIG-3333" and b["processes"] == [] and b["pids"] == [999999]
    assert b["activity"]["sm_active_percent"] == {"mean": 4.0, "max": 4.0}
    assert b["activity"]["tensor_active_percent"] is None
    assert g["activity"]["sm_active_percent"] == {"mean": 91.0, "max": 91.0}  # the GPU's own
