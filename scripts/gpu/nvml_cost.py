"""What each NVML reading memtrace takes costs on a real GPU: the calling
thread's CPU time and the wall time per call (the host sampler's budget is
its CPU; issue 15, issue 16). nvidia-ml-py only.

    python3 scripts/gpu/nvml_cost.py OUT.json [CALLS]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import pynvml as n


def _fields(h: Any, ids: list[int]) -> Any:
    """nvmlDeviceGetFieldValues, raising the first field's own error as the call's."""
    values = n.nvmlDeviceGetFieldValues(h, ids)
    for v in values:
        if v.nvmlReturn != n.NVML_SUCCESS:
            raise n.NVMLError(v.nvmlReturn)
    return values


def main() -> int:
    out, calls = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    readings: dict[str, Callable[[], Any]] = {
        "utilization": lambda: n.nvmlDeviceGetUtilizationRates(h),
        "clock event reasons": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
        "memory": lambda: n.nvmlDeviceGetMemoryInfo(h),
        "pcie tx": lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES),
        "pcie rx": lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES),
        # What memtrace reads instead where the driver has them (555 or later): both byte counters.
        "pcie byte counters": lambda: _fields(
            h, [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
        ),
        "processes": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
        "ecc corrected": lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC
        ),
        "pcie replays": lambda: n.nvmlDeviceGetPcieReplayCounter(h),
        "link generation": lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "link width": lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h),
        "temperature": lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
        "power": lambda: n.nvmlDeviceGetPowerUsage(h),
        "handle by index": lambda: n.nvmlDeviceGetHandleByIndex(0),
    }
    rows: dict[str, dict[str, float | str]] = {}
    for name, fn in readings.items():
        try:
            fn()
        except n.NVMLError as e:
            rows[name] = {"error": str(e)}
            continue
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(calls):
            fn()
        cpu, wall = (time.thread_time() - c0) / calls, (time.perf_counter() - w0) / calls
        rows[name] = {"cpu_us": round(cpu * 1e6, 1), "wall_us": round(wall * 1e6, 1)}
        print(f"{name:20} cpu {cpu * 1e6:9.1f} us   wall {wall * 1e6:9.1f} us")
    n.nvmlShutdown()
    with open(out, "w") as f:
        json.dump({"calls": calls, "readings": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
