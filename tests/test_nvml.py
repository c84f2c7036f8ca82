"""The NVML source against a test libnvidia-ml.so.1 (tests/fixtures/nvml.c) loaded by the real nvidia-ml-py.

Every value is scripted, so every value memtrace reports is checked exactly.
The source runs in a child process (tests/fixtures/nvml_sampler.py) whose
LD_LIBRARY_PATH holds the test library: that is how pynvml finds a driver's
libnvidia-ml.so.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, REPO

GIB = 1 << 30


def script(**values: Any) -> str:
    return "".join(f"{k.replace('__', '.')}={v}\n" for k, v in values.items())


def gpu(i: int, **fields: Any) -> dict[str, Any]:
    return {f"gpu{i}__{k}": v for k, v in fields.items()}


HEALTHY = dict(
    name="Fake H100 80GB HBM3",
    bus="00000000:17:00.0",
    pcie_tx=12500,
    pcie_rx=3000000,
    replay=7,
    link_gen=5,
    link_width=16,
    max_link_gen=5,
    max_link_width=16,
    util_gpu=97,
    util_mem=41,
    mem_total=80 * GIB,
    mem_free=60 * GIB,
    mem_used=20 * GIB,
    temp=64,
    power=412345,
    reasons=0,
    ecc_corrected=2,
    ecc_uncorrected=0,
)


def sample(tmp_path: Path, scripts: list[str], lib: Path | None, env: dict[str, str] | None = None) -> dict[str, Any]:
    steps = tmp_path / "scripts.json"
    steps.write_text(json.dumps(scripts))
    e = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    e.update(PYTHONPATH=str(REPO), FAKE_NVML_SCRIPT=str(tmp_path / "nvml.script"), **(env or {}))
    if lib is not None:
        e["LD_LIBRARY_PATH"] = str(lib)
    p = subprocess.run(
        [sys.executable, str(FIXTURES / "nvml_sampler.py"), str(steps)],
        env=e,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_every_reading_is_the_drivers_value(tmp_path: Path, fakenvml: Path) -> None:
    s = script(
        count=2,
        driver="580.159.04",
        **gpu(0, uuid="GPU-aaaa", procs=f"4242:{3 * GIB},777:-", **HEALTHY),
        **gpu(1, uuid="GPU-bbbb", **{**HEALTHY, "pcie_tx": 1, "temp": 31, "power": 70000}, procs=f"4242:{GIB}"),
    )
    out = sample(tmp_path, [s, s], fakenvml)
    assert out["driver"] == "580.159.04" and out["gpu_count"] == 2
    g0, g1 = out["steps"][0]["gpus"]
    assert g0["uuid"] == "GPU-aaaa" and g0["name"] == "Fake H100 80GB HBM3" and g0["bus_id"] == "00000000:17:00.0"
    assert g0["pcie_tx_bytes_per_s"] == 12500 * 1024 and g0["pcie_rx_bytes_per_s"] == 3000000 * 1024
    assert (g0["link_generation"], g0["link_width"], g0["max_link_generation"], g0["max_link_width"]) == (5, 16, 5, 16)
    assert g0["pcie_replay_count"] == 7
    assert (g0["sm_utilization_percent"], g0["memory_utilization_percent"]) == (97, 41)
    assert (g0["memory_used_bytes"], g0["memory_total_bytes"]) == (20 * GIB, 80 * GIB)
    assert (g0["temperature_celsius"], g0["power_milliwatts"]) == (64, 412345)
    assert (g0["ecc_corrected_volatile"], g0["ecc_uncorrected_volatile"]) == (2, 0)
    assert g0["clock_event_mask"] == 0 and g0["throttled"] is False and g0["clock_event_reasons"] == []
    assert g0["link_degraded"] is False and g0["lost"] is False
    assert [(p["pid"], p["used_memory_bytes"]) for p in g0["processes"]] == [(4242, 3 * GIB), (777, None)]
    assert (g1["uuid"], g1["temperature_celsius"], g1["power_milliwatts"]) == ("GPU-bbbb", 31, 70000)
    # Neither driver counts PCIe bytes: one GPU's throughput is estimated per sample (each estimate
    # blocks 20 ms), in turn.
    later0, later1 = out["steps"][1]["gpus"]
    assert (g1["pcie_tx_bytes_per_s"], later0["pcie_tx_bytes_per_s"]) == (None, None)
    assert later1["pcie_tx_bytes_per_s"] == 1024 and later1["pcie_rx_bytes_per_s"] == 3000000 * 1024
    # Which GPU each process runs on: 4242 on both, 777 on the first.
    assert out["steps"][0]["by_pid"] == {"4242": [0, 1], "777": [0]}
    assert out["steps"][0]["errors"] == {} and out["steps"][0]["lost_count"] == 0
    assert out["after_close"] == 0


def test_faults_show_between_samples(tmp_path: Path, fakenvml: Path) -> None:
    """Replays rise, the link drops to x8, thermal and power throttling start, ECC errors and XIDs arrive."""
    healthy = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY))
    faulty = script(
        count=1,
        **gpu(
            0,
            uuid="GPU-aaaa",
            **{**HEALTHY, "replay": 7 + 130, "link_width": 8, "reasons": 0x20 | 0x4, "ecc_corrected": 5},
            xids="79,48",
        ),
    )
    later = script(count=1, **gpu(0, uuid="GPU-aaaa", **{**HEALTHY, "replay": 3, "ecc_corrected": 5}, xids="79,48,13"))
    out = sample(tmp_path, [healthy, faulty, later], fakenvml)
    s0, s1, s2 = (step["gpus"][0] for step in out["steps"])
    assert s0["link_degraded"] is False and s0["throttled"] is False and s0["xids"] == []
    assert s1["link_width"] == 8 and s1["link_degraded"] is True
    assert s1["throttled"] is True and s1["clock_event_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert s1["xids"] == [79, 48]  # each XID once, in order
    r1 = out["steps"][1]["rates"][0]
    assert r1["pcie_replays"] == 130 and r1["ecc_corrected"] == 3 and r1["ecc_uncorrected"] == 0
    assert r1["pcie_replays_per_s"] == pytest.approx(130 / r1["interval_s"])
    assert r1["counter_resets"] == 0 and r1["xids"] == [79, 48]
    # The replay counter went down (driver reloaded): counted from zero, never negative.
    assert s2["xids"] == [13]
    r2 = out["steps"][2]["rates"][0]
    assert r2["pcie_replays"] == 3 and r2["counter_resets"] == 1


def test_pcie_bytes_come_from_the_drivers_counters_where_it_has_them(tmp_path: Path, fakenvml: Path) -> None:
    """GPU 0's driver counts its PCIe bytes (NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES): memtrace reads those,
    and never the 20 ms throughput sample (scripted to fail here, so a call would be counted as an
    error). GPU 1's does not: the throughput sample, as before. Between samples the bytes are the
    counters' exact differences; a counter that went down (the driver reloaded) counts from zero."""
    start = 10**12
    moved = [(0, 0), (3 * GIB + 5, 17), (7 * GIB, 4096)]  # each sample's (tx, rx) since the first
    steps = []
    for i, (tx, rx) in enumerate(moved):
        steps.append(
            script(
                count=2,
                **gpu(
                    0,
                    uuid="GPU-aaaa",
                    **{**HEALTHY, "pcie_tx": "E999", "pcie_rx": "E999"},
                    pcie_tx_count=start + tx,
                    pcie_rx_count=start + rx,
                ),  # fmt: skip
                **gpu(1, uuid="GPU-bbbb", **{**HEALTHY, "pcie_tx": 100 + i}),
            )
        )
    # The driver reloaded: its counters start again at 1 MiB and 2 bytes.
    steps.append(script(count=2, **gpu(0, uuid="GPU-aaaa", **HEALTHY, pcie_tx_count=1 << 20, pcie_rx_count=2),
                        **gpu(1, uuid="GPU-bbbb", **HEALTHY)))  # fmt: skip
    # One counter answers "no permission" (4): that reading is None and counted, the other stands.
    steps.append(script(count=2, **gpu(0, uuid="GPU-aaaa", **HEALTHY, pcie_tx_count="E4", pcie_rx_count=9),
                        **gpu(1, uuid="GPU-bbbb", **HEALTHY)))  # fmt: skip
    out = sample(tmp_path, steps, fakenvml)
    g0 = [step["gpus"][0] for step in out["steps"]]
    g1 = [step["gpus"][1] for step in out["steps"]]
    assert [(g["pcie_tx_bytes"], g["pcie_rx_bytes"]) for g in g0] == [
        *((start + tx, start + rx) for tx, rx in moved),
        (1 << 20, 2),
        (None, 9),
    ]
    assert all(g["pcie_tx_bytes_per_s"] is None and g["pcie_rx_bytes_per_s"] is None for g in g0)
    assert [g["pcie_tx_bytes_per_s"] for g in g1] == [100 * 1024, 101 * 1024, 102 * 1024, 12500 * 1024, 12500 * 1024]
    assert all(g["pcie_tx_bytes"] is None and g["pcie_rx_bytes"] is None for g in g1)
    rates = [step["rates"][0] for step in out["steps"][1:]]
    assert [(r["pcie_tx_bytes"], r["pcie_rx_bytes"], r["counter_resets"]) for r in rates] == [
        (3 * GIB + 5, 17, 0),
        (7 * GIB - (3 * GIB + 5), 4096 - 17, 0),
        (1 << 20, 2, 2),  # both went down: counted from zero
        (None, 7, 0),
    ]
    assert all(step["rates"][1]["pcie_tx_bytes"] is None for step in out["steps"][1:])
    assert out["steps"][4]["errors"] == {"pcie tx counter: Insufficient Permissions": 1}
    assert all(step["errors"] == {} for step in out["steps"][:4])


def test_link_generation_below_max_is_degraded_only_when_busy(tmp_path: Path, fakenvml: Path) -> None:
    idle = script(count=1, **gpu(0, uuid="GPU-aaaa", **{**HEALTHY, "link_gen": 1, "util_gpu": 0}))
    busy = script(count=1, **gpu(0, uuid="GPU-aaaa", **{**HEALTHY, "link_gen": 3, "util_gpu": 80}))
    out = sample(tmp_path, [idle, busy], fakenvml)
    s0, s1 = (step["gpus"][0] for step in out["steps"])
    assert (s0["link_generation"], s0["link_degraded"]) == (1, False)
    assert (s1["link_generation"], s1["link_degraded"]) == (3, True)


def test_unsupported_readings_are_none_not_zero(tmp_path: Path, fakenvml: Path) -> None:
    # A GPU that supports nothing but its name and memory; ECC reads answer "no permission" (4).
    s = script(
        count=1,
        **gpu(0, uuid="GPU-cccc", mem_total=GIB, mem_free=GIB, mem_used=0, ecc_corrected="E4", ecc_uncorrected="E4"),
    )
    out = sample(tmp_path, [s, s], fakenvml)
    g = out["steps"][0]["gpus"][0]
    assert g["memory_used_bytes"] == 0 and g["memory_total_bytes"] == GIB
    for k in (
        "pcie_tx_bytes_per_s",
        "pcie_replay_count",
        "link_generation",
        "max_link_width",
        "sm_utilization_percent",
        "temperature_celsius",
        "power_milliwatts",
        "clock_event_mask",
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "link_degraded",
        "throttled",
    ):
        assert g[k] is None, k
    assert out["steps"][0]["rates"] == []
    r = out["steps"][1]["rates"][0]
    assert r["pcie_replays"] is None and r["pcie_replays_per_s"] is None and r["ecc_corrected"] is None
    # Not supported is silent; any other error is counted, per reading.
    assert out["steps"][1]["errors"] == {
        "ecc corrected: Insufficient Permissions": 2,
        "ecc uncorrected: Insufficient Permissions": 2,
    }


# The fast sampler (memtrace's C thread, at 500 Hz here) reading utilisation and clock events, or not.
# It reads clock events at every tick and utilisation at 10 Hz (every 50th tick here), so a sample
# folds 50 ticks: one utilisation reading at least.
FAST = pytest.mark.parametrize("fast", [{}, {"FAST_HZ": "500", "FAST_TICKS": "50"}], ids=["python", "fast"])


def test_the_fast_sampler_folds_utilisation_and_throttling_exactly(tmp_path: Path, fakenvml: Path) -> None:
    """Every tick of a sample's window saw one script (tests/fixtures/nvml_sampler.py), so the means,
    maxima and throttled ticks the C thread folded are exact; gpu_idle alone is not throttling."""
    calm = script(
        count=2,
        **gpu(0, uuid="GPU-aaaa", **HEALTHY),
        **gpu(1, uuid="GPU-bbbb", **{**HEALTHY, "util_gpu": 13, "util_mem": 2}),
    )
    hot = script(
        count=2,
        **gpu(0, uuid="GPU-aaaa", **{**HEALTHY, "reasons": 0x20 | 0x1}),
        **gpu(1, uuid="GPU-bbbb", **{**HEALTHY, "util_gpu": 0, "util_mem": 0, "reasons": 0x1}),
    )
    out = sample(tmp_path, [calm, hot], fakenvml, env={"FAST_HZ": "500", "FAST_TICKS": "120"})
    (c0, c1), (h0, h1) = (step["gpus"] for step in out["steps"])
    for g in (c0, c1, h0, h1):
        # Clock events at every tick; utilisation every 50th (10 Hz: NVML's own period is 1/6 s or more).
        assert g["clock_readings"] >= 120, g
        assert g["utilization_readings"] in (g["clock_readings"] // 50, g["clock_readings"] // 50 + 1), g
    assert (c0["sm_utilization_percent"], c0["memory_utilization_percent"], c0["sm_utilization_max"]) == (97, 41, 97)
    assert (c1["sm_utilization_percent"], c1["memory_utilization_percent"], c1["memory_utilization_max"]) == (13, 2, 2)
    assert c0["throttled_readings"] == c1["throttled_readings"] == 0 and c0["clock_event_mask"] == 0
    assert h0["throttled_readings"] == h0["clock_readings"] and h0["clock_event_mask"] == 0x21
    assert h0["throttled"] is True and h0["clock_event_reasons"] == ["gpu_idle", "sw_thermal_slowdown"]
    assert h1["throttled_readings"] == 0 and h1["throttled"] is False and h1["sm_utilization_percent"] == 0
    assert out["steps"][1]["errors"] == {}


@FAST
def test_gpu_lost_mid_run_is_reported_not_raised(tmp_path: Path, fakenvml: Path, fast: dict[str, str]) -> None:
    both = script(count=2, **gpu(0, uuid="GPU-aaaa", **HEALTHY), **gpu(1, uuid="GPU-bbbb", **HEALTHY))
    lost = script(count=2, **gpu(0, uuid="GPU-aaaa", **HEALTHY), **gpu(1, uuid="GPU-bbbb", lost=1, **HEALTHY))
    out = sample(tmp_path, [both, lost, lost, both], fakenvml, env=fast)
    steps = out["steps"]
    assert [s["gpus"][1]["lost"] for s in steps] == [False, True, True, False]
    gone = steps[1]["gpus"][1]
    assert gone["uuid"] == "GPU-bbbb"
    assert all(gone[k] is None for k in ("memory_used_bytes", "temperature_celsius", "pcie_replay_count"))
    assert steps[1]["rates"][1] is None  # no rate across a lost sample
    assert [s["lost_count"] for s in steps] == [0, 1, 1, 1]  # one loss, counted once
    assert steps[3]["errors"] == {}  # a lost GPU is a loss, not a pile of failed readings
    assert steps[1]["gpus"][0]["lost"] is False and steps[1]["gpus"][0]["temperature_celsius"] == 64
    assert steps[3]["gpus"][1]["temperature_celsius"] == 64  # answers again: read again


@FAST
def test_details_every_nth_sample_and_the_rest_every_sample(
    tmp_path: Path, fakenvml: Path, fast: dict[str, str]
) -> None:
    calm = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY))
    hot = script(count=1, **gpu(0, uuid="GPU-aaaa", **{**HEALTHY, "util_gpu": 12, "reasons": 0x40}, xids="31"))
    lost = script(count=1, **gpu(0, uuid="GPU-aaaa", lost=1, **HEALTHY))
    out = sample(tmp_path, [calm, hot, lost, calm], fakenvml, env={"DETAIL_EVERY": "3", **fast})
    s0, s1, s2, s3 = (step["gpus"][0] for step in out["steps"])
    assert [s["detail"] for s in (s0, s1, s2, s3)] == [True, False, False, True]
    assert s0["temperature_celsius"] == 64 and s3["memory_used_bytes"] == 20 * GIB
    # Between details: utilisation, throttling and XIDs at once; the slow readings None, not stale.
    assert (s1["sm_utilization_percent"], s1["clock_event_reasons"], s1["xids"]) == (12, ["hw_thermal_slowdown"], [31])
    assert s1["temperature_celsius"] is None and s1["memory_used_bytes"] is None and s1["processes"] == []
    assert s2["lost"] is True and out["steps"][2]["lost_count"] == 1  # loss is seen between details too
    assert out["steps"][1]["rates"][0]["pcie_replays"] is None


def test_without_byte_counters_one_gpu_is_estimated_per_detailed_sample_in_turn(tmp_path: Path, fakenvml: Path) -> None:
    """Four GPUs whose driver counts no PCIe bytes, details every second sample: each detailed
    sample estimates one GPU's throughput (a 20 ms block each), the next in turn by index. GPU 3,
    lost from the fifth sample to the seventh, is passed over at its turn; samples between details
    estimate none."""
    gpus = {k: v for i in range(4) for k, v in gpu(i, uuid=f"GPU-{i}", **{**HEALTHY, "pcie_tx": 10 + i}).items()}
    lost3 = {**gpus, "gpu3__lost": 1}
    steps = [gpus, gpus, gpus, gpus, lost3, lost3, lost3, gpus, gpus]
    out = sample(tmp_path, [script(count=4, **g) for g in steps], fakenvml, env={"DETAIL_EVERY": "2"})
    estimated = [[g["index"] for g in step["gpus"] if g["pcie_tx_bytes_per_s"] is not None] for step in out["steps"]]
    assert estimated == [[0], [], [1], [], [2], [], [0], [], [1]]
    assert all(g["pcie_tx_bytes_per_s"] == (10 + g["index"]) * 1024 for s in out["steps"] for g in s["gpus"]
               if g["pcie_tx_bytes_per_s"] is not None)  # fmt: skip


def test_no_driver_turns_the_source_off_with_the_reason(tmp_path: Path) -> None:
    out = sample(tmp_path, [script(count=1)], lib=None)
    (why,) = out["unavailable"]
    assert "no NVIDIA driver here (libnvidia-ml.so.1 not found)" in why and "fix:" in why


def test_driver_that_fails_to_initialise_turns_the_source_off(tmp_path: Path, fakenvml: Path) -> None:
    out = sample(tmp_path, [script(init=9)], fakenvml)
    (why,) = out["unavailable"]
    assert "NVML did not initialise (Driver Not Loaded)" in why


DOCTOR = "from memtrace.runtime.doctor import CHECKS, check_nvml; assert check_nvml in CHECKS; print(check_nvml())"


def doctor_nvml(tmp_path: Path, lib: Path | None, **gpus: Any) -> str:
    (tmp_path / "nvml.script").write_text(script(count=2, driver="580.159.04", **gpus))
    e = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    e.update(PYTHONPATH=str(REPO), FAKE_NVML_SCRIPT=str(tmp_path / "nvml.script"))
    if lib is not None:
        e["LD_LIBRARY_PATH"] = str(lib)
    p = subprocess.run([sys.executable, "-c", DOCTOR], env=e, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize(
    ("counted", "pcie"),
    [
        ((), "PCIe throughput as NVML 20 ms estimates (exact byte counters need driver 555 or later)"),
        ((1,), "PCIe bytes from driver counters on 1 of 2 GPUs, NVML 20 ms estimates on the rest"),
        ((0, 1), "PCIe bytes from driver counters (exact)"),
    ],
)
def test_doctor_reports_the_driver_and_gpus(
    tmp_path: Path, fakenvml: Path, counted: tuple[int, ...], pcie: str
) -> None:
    counters = {k: v for i in counted for k, v in gpu(i, pcie_tx_count=1, pcie_rx_count=2).items()}
    out = doctor_nvml(tmp_path, fakenvml, **counters)
    assert f"name='NVML', ok=True, detail='driver 580.159.04, 2 GPUs; {pcie};" in out and "warn=False" in out


@pytest.mark.parametrize(
    ("gpm", "says"),
    [
        ((), "; no GPM (GPUs older than Hopper): SM, tensor and DRAM activity are not measured'"),
        ((1,), "; SM, tensor and DRAM activity from GPM on 1 of 2 GPUs (the rest are older than Hopper)'"),
        ((0, 1), "; SM, tensor and DRAM activity from GPM; 36 NVLinks'"),
    ],
)
def test_doctor_says_which_gpus_have_gpm_and_nvlink(
    tmp_path: Path, fakenvml: Path, gpm: tuple[int, ...], says: str
) -> None:
    fields = {k: v for i in gpm for k, v in gpu(i, gpm=1).items()}
    if len(gpm) == 2:
        fields.update(gpu0__nvlinks=18, gpu1__nvlinks=18)
    out = doctor_nvml(tmp_path, fakenvml, **fields)
    assert says in out


def test_doctor_warns_without_nvml_and_says_what_it_means(tmp_path: Path) -> None:
    out = doctor_nvml(tmp_path, None)
    assert "ok=True" in out and "warn=True" in out  # a warning: memtrace still runs
    assert "no NVIDIA driver here" in out and "GPU health signals are off" in out and "install the NVIDIA driver" in out


# ---- the GPU's own side: GPM, NVLink, remapped rows, MIG, per-process utilisation ----


def test_gpm_activity_is_the_interval_between_detailed_samples_and_none_without_gpm(
    tmp_path: Path, fakenvml: Path
) -> None:
    """GPU 0 has GPM (Hopper): each detailed sample after the first carries the SM, occupancy, tensor
    and DRAM activity of the interval that ended at it; a metric the GPU does not count is None, not
    an error. GPU 1 has none (older than Hopper): it says so, and its activity is None, never 0."""
    steps = []
    for sm, occ, tensor in ((10.0, 5.0, 0.0), (87.5, 43.25, 61.0), (0.5, 0.25, 0.0)):
        steps.append(
            script(
                count=2,
                **gpu(0, uuid="GPU-aaaa", **HEALTHY, gpm=1, gpm_sm=sm, gpm_occupancy=occ, gpm_tensor=tensor),
                **gpu(1, uuid="GPU-bbbb", **HEALTHY, gpm_sm=99),  # scripted, but the GPU has no GPM
            )
        )
    out = sample(tmp_path, steps, fakenvml)
    assert out["gpm_gpus"] == 1
    g0 = [step["gpus"][0] for step in out["steps"]]
    g1 = [step["gpus"][1] for step in out["steps"]]
    assert all(g["gpm_supported"] is True for g in g0) and all(g["gpm_supported"] is False for g in g1)
    activity = ("sm_active_percent", "sm_occupancy_percent", "tensor_active_percent", "dram_bandwidth_percent")
    assert [tuple(g[k] for k in activity) for g in g0] == [
        (None, None, None, None),  # the first sample begins the first interval
        (87.5, 43.25, 61.0, None),
        (0.5, 0.25, 0.0, None),  # an idle GPU reads 0: a measurement, not a gap
    ]
    assert all(g[k] is None for g in g1 for k in activity)
    assert all(step["errors"] == {} for step in out["steps"])


def test_gpm_is_read_only_at_detailed_samples(tmp_path: Path, fakenvml: Path) -> None:
    s = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, gpm=1, gpm_sm=50, gpm_dram=20))
    out = sample(tmp_path, [s, s, s], fakenvml, env={"DETAIL_EVERY": "2"})
    g = [step["gpus"][0] for step in out["steps"]]
    assert [(x["detail"], x["gpm_supported"], x["sm_active_percent"]) for x in g] == [
        (True, True, None),
        (False, None, None),
        (True, True, 50.0),
    ]
    assert g[2]["dram_bandwidth_percent"] == 20.0


def links(**per_link: dict[str, Any]) -> dict[str, Any]:
    """gpu() fields of NVLinks: links(l0={"tx": 5}) is nvlink0.tx=5."""
    return {f"nvlink{k[1:]}__{f}": v for k, fields in per_link.items() for f, v in fields.items()}


def test_nvlink_bytes_errors_and_state_per_link_with_resets_and_a_link_down(tmp_path: Path, fakenvml: Path) -> None:
    """Four links. Bytes are the driver's KiB counters; between samples their differences over all
    links. A counter that goes down (nvidia-smi nvlink -r, a driver reload) counts from zero; a link
    that goes down says so."""

    def step(l0: tuple[int, int], l2_tx: int, crc: int, replay: int, l3_state: int = 1) -> str:
        fields = links(
            l0={"tx": l0[0], "rx": l0[1], "crc_flit": crc, "replay": replay},
            l2={"tx": l2_tx},
            l3={"state": l3_state},
        )
        return script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, nvlinks=4, **fields))

    out = sample(
        tmp_path,
        [
            step((1000, 2000), 10, crc=0, replay=0),
            step((1000 + 4096, 2000 + 1), 10 + 7, crc=3, replay=1),
            step((5, 9), 10 + 7 + 2, crc=1, replay=1),  # link 0's counters were reset
            step((6, 9), 20, crc=1, replay=1, l3_state=0),  # link 3 went down
        ],
        fakenvml,
    )
    assert out["nvlink_count"] == 4
    s = [st["gpus"][0] for st in out["steps"]]
    assert [len(x["nvlinks"]) for x in s] == [4, 4, 4, 4]
    first = s[0]["nvlinks"]
    assert first[0] == {
        "link": 0,
        "active": True,
        "tx_bytes": 1000 * 1024,
        "rx_bytes": 2000 * 1024,
        "crc_errors": 0,
        "replay_errors": 0,
        "recovery_errors": 0,
    }
    assert first[2]["tx_bytes"] == 10 * 1024 and first[1]["tx_bytes"] == 0
    assert [x["nvlinks_down"] for x in s] == [0, 0, 0, 1]
    assert s[3]["nvlinks"][3]["active"] is False
    r = [st["rates"][0] for st in out["steps"][1:]]
    assert [(x["nvlink_tx_bytes"], x["nvlink_rx_bytes"], x["nvlink_errors"], x["counter_resets"]) for x in r] == [
        ((4096 + 7) * 1024, 1 * 1024, 4, 0),
        ((5 + 2) * 1024, 9 * 1024, 1, 3),  # link 0's tx, rx and CRC counters went down: from zero
        ((1 + 1) * 1024, 0, 0, 0),
    ]
    assert all(st["errors"] == {} for st in out["steps"])


def test_a_gpu_without_nvlink_has_no_links(tmp_path: Path, fakenvml: Path) -> None:
    s = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY))
    out = sample(tmp_path, [s, s], fakenvml)
    assert out["nvlink_count"] == 0 and out["steps"][0]["gpus"][0]["nvlinks"] == []
    assert out["steps"][1]["rates"][0]["nvlink_tx_bytes"] is None and out["steps"][1]["errors"] == {}


def test_remapped_rows_are_the_drivers(tmp_path: Path, fakenvml: Path) -> None:
    ok = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, remapped="3,0,0,0"))
    bad = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, remapped="3,1,1,0"))
    failed = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, remapped="3,2,0,1"))
    none = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY))
    out = sample(tmp_path, [ok, bad, failed, none], fakenvml)
    assert [st["gpus"][0]["remapped_rows"] for st in out["steps"]] == [
        {"correctable": 3, "uncorrectable": 0, "pending": False, "failed": False},
        {"correctable": 3, "uncorrectable": 1, "pending": True, "failed": False},
        {"correctable": 3, "uncorrectable": 2, "pending": False, "failed": True},
        None,  # not supported (before Ampere): unknown, not zero
    ]


def test_mig_instances_are_devices_with_their_memory_and_processes(tmp_path: Path, fakenvml: Path) -> None:
    """A GPU in MIG mode with instances in slots 0 and 3. Each instance's processes are attributed to
    it, with the instance's count of their memory; a process only the whole GPU lists stays on it."""
    mig = dict(
        mig=1,
        mig0__uuid="MIG-1111",
        mig0__gi=1,
        mig0__ci=0,
        mig0__mem_total=20 * GIB,
        mig0__mem_free=15 * GIB,
        mig0__mem_used=5 * GIB,
        mig0__procs=f"501:{4 * GIB}",
        mig3__uuid="MIG-3333",
        mig3__gi=5,
        mig3__ci=0,
        mig3__mem_total=10 * GIB,
        mig3__mem_free=10 * GIB,
        mig3__mem_used=0,
        mig3__procs=f"503:{GIB}",
    )
    with_mig = script(
        count=2,
        **gpu(0, uuid="GPU-aaaa", **HEALTHY, procs="501:-,502:7", **mig),
        **gpu(1, uuid="GPU-bbbb", **HEALTHY, mig=0, procs="600:9"),
    )
    out = sample(tmp_path, [with_mig], fakenvml)
    g0, g1 = out["steps"][0]["gpus"]
    assert g0["mig_enabled"] is True and g1["mig_enabled"] is False and g1["mig_instances"] == []
    instances = [
        (m["slot"], m["uuid"], m["gpu_instance_id"], m["memory_used_bytes"], m["memory_total_bytes"])
        for m in g0["mig_instances"]
    ]
    assert instances == [(0, "MIG-1111", 1, 5 * GIB, 20 * GIB), (3, "MIG-3333", 5, 0, 10 * GIB)]
    assert [(p["pid"], p["mig_uuid"]) for p in g0["mig_instances"][0]["processes"]] == [(501, "MIG-1111")]
    assert [(p["pid"], p["used_memory_bytes"], p["mig_uuid"]) for p in g0["processes"]] == [
        (501, 4 * GIB, "MIG-1111"),
        (502, 7, None),
        (503, GIB, "MIG-3333"),
    ]
    assert [(p["pid"], p["mig_uuid"]) for p in g1["processes"]] == [(600, None)]
    assert out["steps"][0]["errors"] == {}


def test_process_utilisation_is_each_process_share(tmp_path: Path, fakenvml: Path) -> None:
    s = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, proc_util="4242:71:30,777:4:1"))
    quiet = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY))
    out = sample(tmp_path, [s, quiet], fakenvml)
    assert out["steps"][0]["gpus"][0]["process_utilization"] == [
        {"pid": 777, "sm_percent": 4, "memory_percent": 1},
        {"pid": 4242, "sm_percent": 71, "memory_percent": 30},
    ]
    assert out["steps"][1]["gpus"][0]["process_utilization"] == [] and out["steps"][1]["errors"] == {}


def test_sm_and_memory_clocks_are_read_at_every_sample_and_none_where_unsupported(
    tmp_path: Path, fakenvml: Path
) -> None:
    """The clocks are read at every sample, detailed or not (DETAIL_EVERY=3: the second and third
    are not); a GPU whose driver does not answer them has None, never 0."""
    steps = [
        script(count=2, **gpu(0, uuid="GPU-aaaa", **HEALTHY, clock_sm=sm, clock_mem=mem), **gpu(1, **HEALTHY))
        for sm, mem in ((1980, 2619), (1410, 2619), (345, 1593))
    ]
    out = sample(tmp_path, steps, fakenvml, env={"DETAIL_EVERY": "3"})
    got = [[(g["detail"], g["sm_clock_mhz"], g["memory_clock_mhz"]) for g in s["gpus"]] for s in out["steps"]]
    assert got == [
        [(True, 1980, 2619), (True, None, None)],
        [(False, 1410, 2619), (False, None, None)],
        [(False, 345, 1593), (False, None, None)],
    ]
    assert out["steps"][-1]["errors"] == {}


def test_each_mig_instance_has_its_own_gpm_activity_by_its_gpu_instance(tmp_path: Path, fakenvml: Path) -> None:
    """A GPM GPU in MIG mode: each instance's activity is its own (nvmlGpmMigSampleGet by its GPU
    instance id), from the second detailed sample on; an instance whose metrics the driver does not
    count has None. On a GPU without GPM, instances have none, and nothing is an error."""

    def step(sm0: float, sm3: float, gpm: int) -> str:
        return script(
            count=1,
            **gpu(
                0, uuid="GPU-aaaa", **HEALTHY, gpm=gpm, gpm_sm=90, mig=1,
                mig0__uuid="MIG-1111", mig0__gi=1, mig0__ci=0, mig0__gpm_sm=sm0, mig0__gpm_tensor=sm0 / 2,
                mig0__procs=f"501:{GIB}",
                mig3__uuid="MIG-3333", mig3__gi=5, mig3__ci=0, mig3__gpm_sm=sm3,
                mig5__uuid="MIG-5555", mig5__gi=7, mig5__ci=0,
            ),
        )  # fmt: skip

    out = sample(tmp_path, [step(10, 20, 1), step(70.5, 3.25, 1), step(1, 2, 1)], fakenvml)
    got = [
        [(m["uuid"], m["sm_active_percent"], m["tensor_active_percent"]) for m in s["gpus"][0]["mig_instances"]]
        for s in out["steps"]
    ]
    assert got == [
        [("MIG-1111", None, None), ("MIG-3333", None, None), ("MIG-5555", None, None)],
        [("MIG-1111", 70.5, 35.25), ("MIG-3333", 3.25, None), ("MIG-5555", None, None)],
        [("MIG-1111", 1.0, 0.5), ("MIG-3333", 2.0, None), ("MIG-5555", None, None)],
    ]
    assert [s["gpus"][0]["sm_active_percent"] for s in out["steps"]] == [None, 90.0, 90.0]  # the GPU's own
    assert all(s["errors"] == {} for s in out["steps"])
    off = sample(tmp_path, [step(10, 20, 0), step(70.5, 3.25, 0)], fakenvml)
    assert all(m["sm_active_percent"] is None for s in off["steps"] for m in s["gpus"][0]["mig_instances"])
    assert all(s["errors"] == {} for s in off["steps"])
