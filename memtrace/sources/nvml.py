"""GPUs through NVML (nvidia-ml-py's pynvml): PCIe, utilisation, memory, power, throttling, ECC, XIDs, processes,
and the GPU's own side without DCGM: compute activity (GPM), NVLink, remapped rows, MIG instances and
per-process utilisation.

The runtime opens the source once and calls `poll()` at its sampling rate
from one thread. Without an NVIDIA driver (no libnvidia-ml.so.1) the source is
off: `open()` returns None and says why. A reading NVML does not support on a
GPU is None. A GPU that falls off the bus is reported `lost` (and counted in
`lost_count`) instead of raising; it is probed again at each sample and
reported normally if NVML answers again.

GPM (GPU performance monitoring, Hopper and later) is sampled at each detailed
sample (about once a second): the activity between this sample and the
previous one. A GPU without GPM says so (`gpm_supported` False) and its
activity is None, never 0. NVLinks are found once, at connect (the links whose
state NVML answers); each detailed sample reads their state, byte counters
and error counters.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from memtrace.core.errors import MemtraceError
from memtrace.core.gpu import GpuProcess, GpuSample, MigInstance, NvLink, ProcessUtilization, RemappedRows
from memtrace.sources.fastsample import FastSampler, FastWindow, GpuFast

T = TypeVar("T")

# NVML return codes (nvml.h) that mean the GPU itself is gone, not one reading.
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_GPU_NOT_FOUND = 28
LOST_ERRORS = frozenset({_GPU_IS_LOST, _RESET_REQUIRED, _GPU_NOT_FOUND})
_INVALID_ARGUMENT = 2
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_FUNCTION_NOT_FOUND = 13
_TIMEOUT = 10
_XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
# NVML_FI_DEV_PCIE_COUNT_TX_BYTES and _RX_BYTES (nvml.h, drivers from 555 on): bytes the GPU sent and
# received over PCIe since the driver loaded, read through nvmlDeviceGetFieldValues.
PCIE_COUNTER_FIELDS = (197, 198)
_VALUE_UNSIGNED_LONG_LONG = 3  # nvmlValueType_t: the counters' type; any other is not trusted
_VALUE_SIGNED_LONG_LONG = 4
MAX_XIDS_PER_SAMPLE = 256  # a storm of XIDs must not stall a sample
# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and _RX: a link's payload bytes (in KiB) since the driver
# loaded, the link as scopeId. The older nvmlDeviceGetNvLinkUtilizationCounter is deprecated and not
# counted on Hopper; these are what `nvidia-smi nvlink -gt d` reads.
NVLINK_DATA_FIELDS = (138, 139)
# GPM metrics (nvmlGpmMetricId_t): SM activity, SM occupancy, any-tensor-pipe activity, DRAM bandwidth.
GPM_METRICS = {
    2: "sm_active_percent",  # NVML_GPM_METRIC_SM_UTIL: SMs busy
    3: "sm_occupancy_percent",  # NVML_GPM_METRIC_SM_OCCUPANCY: warps resident of the most possible
    5: "tensor_active_percent",  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    10: "dram_bandwidth_percent",  # NVML_GPM_METRIC_DRAM_BW_UTIL
}
# nvmlNvLinkErrorCounter_t: DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA.
_NVLINK_REPLAY, _NVLINK_RECOVERY, _NVLINK_CRC_FLIT, _NVLINK_CRC_DATA = 0, 1, 2, 3


class NvmlUnavailable(MemtraceError):
    """NVML cannot be used on this host: GPU signals are off, CUDA tracing is not affected."""


class _Lost(Exception):
    """Internal: the GPU answered with one of LOST_ERRORS."""


@dataclass
class _GpmState:
    """Two GPM sample buffers of one device (a GPU, or a MIG instance by its GPU instance id),
    allocated once: the previous sample and the next."""

    samples: list[Any]
    ready: bool = False  # samples[0] holds a sample of this device


@dataclass
class _Gpu:
    index: int
    handle: Any  # None: lost before it could be opened
    uuid: str
    name: str
    bus_id: str
    max_link_generation: int | None
    max_link_width: int | None
    address: int | None  # the handle's pointer value, to match XID events to GPUs
    lost: bool = False
    # The driver counts this GPU's PCIe bytes (PCIE_COUNTER_FIELDS): read those, exact between two
    # samples, instead of nvmlDeviceGetPcieThroughput's 20 ms window (which also blocks 20 ms a call).
    pcie_counters: bool = False
    gpm: bool = False  # the GPU has GPM (nvmlGpmQueryDeviceSupport)
    gpm_state: _GpmState | None = None  # the GPU's GPM buffers
    mig_gpm: dict[int, _GpmState] = field(default_factory=dict)  # each MIG instance's, by GPU instance id
    links: tuple[int, ...] = ()  # its NVLinks
    util_seen: int = 0  # the newest per-process utilisation sample read (microseconds since 1970)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _field_count(value: Any) -> int | None:
    """One 64-bit counter from an nvmlFieldValue_t that answered NVML_SUCCESS, or None."""
    if value.valueType == _VALUE_UNSIGNED_LONG_LONG:
        return int(value.value.ullVal)
    if value.valueType == _VALUE_SIGNED_LONG_LONG and value.value.sllVal >= 0:
        return int(value.value.sllVal)
    return None


def _pcie_counters_work(nvml: Any, handle: Any) -> bool:
    """The driver answers both PCIe byte counters for this GPU, as 64-bit integers."""
    try:
        values = nvml.nvmlDeviceGetFieldValues(handle, list(PCIE_COUNTER_FIELDS))
    except (nvml.NVMLError, AttributeError):  # an older driver (function not found) or nvidia-ml-py
        return False
    return all(v.nvmlReturn == 0 and _field_count(v) is not None for v in values)


def _gpm_supported(nvml: Any, handle: Any) -> bool:
    try:
        return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except (nvml.NVMLError, AttributeError):  # a driver older than 520, or an older nvidia-ml-py
        return False


def _nvlinks(nvml: Any, handle: Any) -> tuple[int, ...]:
    """The links whose state NVML answers (up or down): the GPU's NVLinks."""
    links = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as e:
            if e.value == _INVALID_ARGUMENT:
                break  # past the most links this driver knows
            continue
        except AttributeError:
            break
        links.append(link)
    return tuple(links)


def _handle_address(handle: Any) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class NvmlSource:
    """The GPUs NVML sees. Not thread-safe across poll() calls: one sampling thread calls it."""

    name = "gpu"

    def __init__(self, nvml: Any, driver_version: str, gpus: list[_Gpu], event_set: Any, detail_every: int = 1) -> None:
        self._nvml = nvml
        self.detail_every = max(1, detail_every)
        self._count = 0
        self.driver_version = driver_version
        self._gpus = gpus
        self._events = event_set
        self._lock = threading.Lock()
        self._closed = False
        # Times a GPU was found lost (a GPU that comes back and is lost again counts twice).
        self.lost_count = sum(g.lost for g in gpus)
        self.errors: Counter[str] = Counter()  # "<reading>: <NVML error>" -> count, for readings left None
        self._use_event_reasons = True
        self._fast_slot: dict[int, int] = {}  # GPU index -> its slot in the fast sampler (hand_to)
        self._estimated_last = -1  # index of the GPU without byte counters whose PCIe throughput was estimated last

    # --- lifecycle ---------------------------------------------------------

    @classmethod
    def connect(cls, detail_every: int = 1) -> NvmlSource:
        """Initialise NVML and list the GPUs; raises NvmlUnavailable with what it means and the fix."""
        try:
            import pynvml
        except ImportError as e:
            raise NvmlUnavailable(
                f"nvidia-ml-py is not installed ({e})", "pip install nvidia-ml-py (memtrace depends on it)"
            ) from e
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            if e.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise NvmlUnavailable(
                    "no NVIDIA driver here (libnvidia-ml.so.1 not found): GPU health signals are off; "
                    "CUDA tracing is unaffected",
                    "on a GPU host, install the NVIDIA driver; in a container, mount the driver's libraries "
                    "(NVIDIA container toolkit: NVIDIA_DRIVER_CAPABILITIES=utility)",
                ) from e
            raise NvmlUnavailable(
                f"NVML did not initialise ({e}): GPU signals are off",
                "check the NVIDIA driver with nvidia-smi; a driver/library version mismatch needs a reboot "
                "or a driver reload",
            ) from e
        try:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            driver = "unknown"
        gpus: list[_Gpu] = []
        try:
            count = pynvml.nvmlDeviceGetCount()
            for i in range(count):
                try:
                    gpus.append(cls._describe(pynvml, i))
                except pynvml.NVMLError as e:
                    if e.value not in LOST_ERRORS:
                        raise
                    # Lost before we met it: reported lost at every sample, never read.
                    gpus.append(_Gpu(i, None, f"index-{i}", "", "", None, None, None, lost=True))
        except pynvml.NVMLError as e:
            pynvml.nvmlShutdown()
            raise NvmlUnavailable(
                f"NVML could not list the GPUs ({e}): GPU signals are off", "check the GPUs with nvidia-smi"
            ) from e
        event_set = cls._register_xids(pynvml, gpus)
        return cls(pynvml, driver, gpus, event_set, detail_every)

    @classmethod
    def open(cls, detail_every: int = 1, report: Callable[[NvmlUnavailable], None] | None = None) -> NvmlSource | None:
        """The source, or None (after report(why)) when NVML cannot be used here."""
        try:
            return cls.connect(detail_every)
        except NvmlUnavailable as e:
            if report is not None:
                report(e)
            return None

    @staticmethod
    def _describe(nvml: Any, index: int) -> _Gpu:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)

        def static(fn: Callable[[Any], T]) -> T | None:
            try:
                return fn(handle)
            except nvml.NVMLError:
                return None

        uuid = static(nvml.nvmlDeviceGetUUID)
        name = static(nvml.nvmlDeviceGetName)
        pci = static(nvml.nvmlDeviceGetPciInfo)
        return _Gpu(
            index=index,
            handle=handle,
            uuid=_text(uuid) if uuid is not None else f"index-{index}",
            name=_text(name) if name is not None else "",
            bus_id=_text(pci.busId) if pci is not None else "",
            max_link_generation=static(nvml.nvmlDeviceGetMaxPcieLinkGeneration),
            max_link_width=static(nvml.nvmlDeviceGetMaxPcieLinkWidth),
            address=_handle_address(handle),
            pcie_counters=_pcie_counters_work(nvml, handle),
            gpm=_gpm_supported(nvml, handle),
            links=_nvlinks(nvml, handle),
        )

    @staticmethod
    def _register_xids(nvml: Any, gpus: list[_Gpu]) -> Any:
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return None
        for g in gpus:
            try:
                nvml.nvmlDeviceRegisterEvents(g.handle, _XID_CRITICAL_ERROR, event_set)
            except nvml.NVMLError:
                pass  # this GPU reports no XIDs (not supported, or no permission)
        return event_set

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for g in self._gpus:
                for state in [*([g.gpm_state] if g.gpm_state else []), *g.mig_gpm.values()]:
                    for buf in state.samples:
                        try:
                            self._nvml.nvmlGpmSampleFree(buf)
                        except self._nvml.NVMLError:
                            pass
                g.gpm_state = None
                g.mig_gpm.clear()
            try:
                if self._events is not None:
                    self._nvml.nvmlEventSetFree(self._events)
            except self._nvml.NVMLError:
                pass
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sampling ----------------------------------------------------------

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    @property
    def gpm_gpus(self) -> int:
        """GPUs with GPU performance monitoring (SM, tensor and DRAM activity): Hopper and later."""
        return sum(g.gpm for g in self._gpus)

    @property
    def nvlink_count(self) -> int:
        """NVLinks over all GPUs."""
        return sum(len(g.links) for g in self._gpus)

    @property
    def pcie_counted_gpus(self) -> int:
        """GPUs whose driver counts their PCIe bytes (the rest: NVML's 20 ms throughput estimates)."""
        return sum(g.pcie_counters for g in self._gpus)

    def hand_to(self, fast: FastSampler) -> None:
        """Let the fast sampler read utilisation and clock events (through nvidia-ml-py's own
        libnvidia-ml); poll() then takes them from its window. GPUs lost before they were
        opened stay here."""
        lib = getattr(self._nvml, "nvmlLib", None)
        handle = getattr(lib, "_handle", None)
        if not handle:
            raise OSError("nvidia-ml-py's library handle is not reachable")
        slots = [g for g in self._gpus if g.handle is not None and g.address is not None]
        fast.set_gpus(handle, [g.address for g in slots if g.address is not None])
        self._fast_slot = {g.index: slot for slot, g in enumerate(slots)}

    def poll(self, detail: bool | None = None, fast: FastWindow | None = None) -> list[GpuSample]:
        """One reading of every GPU, with the XIDs raised since the previous call.

        Utilisation, clock-event reasons, the SM and memory clocks, XIDs and loss are read at every
        call; the rest (PCIe, memory, temperature, power, ECC, processes) at every detail_every-th
        call, starting with the first:
        NVML itself refreshes those at about 1 Hz or slower. Where the driver has no PCIe byte
        counters, NVML estimates PCIe throughput over 20 ms per call and blocks that long
        (docs/design/evidence.md#nvml-pcie): one such GPU is estimated per detailed sample, in turn, so the
        thread blocks 40 ms a second at most whatever the number of GPUs. Between, `detail` is
        False and they are None.
        `detail` True or False overrides the cadence for this call (a run's last sample reads all).
        With `fast` (the fast sampler's window, after hand_to), utilisation and clock events are its
        readings since the previous call: means, maxima and the ticks throttled.
        """
        with self._lock:
            if self._closed:
                return []
            if detail is None:
                detail = self._count % self.detail_every == 0
            self._count += 1
            now = time.monotonic_ns()
            xids = self._drain_xids()
            estimate = self._estimated_next() if detail else None
            out = []
            for g in self._gpus:
                slot = self._fast_slot.get(g.index)
                row = None if fast is None or slot is None else fast.gpus.get(slot)
                out.append(self._sample_gpu(g, now, tuple(xids.get(g.index, ())), detail, row, g is estimate))
            return out

    def _estimated_next(self) -> _Gpu | None:
        """The GPU without byte counters whose PCIe throughput this detailed sample estimates."""
        todo = [g for g in self._gpus if g.handle is not None and not g.pcie_counters and not g.lost]
        if not todo:
            return None
        g = ([g for g in todo if g.index > self._estimated_last] or todo)[0]
        self._estimated_last = g.index
        return g

    def _read(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            if e.value in LOST_ERRORS:
                raise _Lost from e
            if e.value != _NOT_SUPPORTED:
                self.errors[f"{what}: {e}"] += 1
            return None

    def _pcie_counts(self, handle: Any) -> tuple[int | None, int | None]:
        """The GPU's PCIe byte counters (transmitted, received); a counter that answered an error is None."""
        nvml = self._nvml
        try:
            values = nvml.nvmlDeviceGetFieldValues(handle, list(PCIE_COUNTER_FIELDS))
        except nvml.NVMLError as e:
            if e.value in LOST_ERRORS:
                raise _Lost from e
            self.errors[f"pcie counters: {e}"] += 1
            return None, None
        out: list[int | None] = []
        for what, v in zip(("tx", "rx"), values, strict=True):
            if v.nvmlReturn in LOST_ERRORS:
                raise _Lost
            count = _field_count(v) if v.nvmlReturn == 0 else None
            if v.nvmlReturn not in (0, _NOT_SUPPORTED):
                self.errors[f"pcie {what} counter: {nvml.NVMLError(v.nvmlReturn)}"] += 1
            elif v.nvmlReturn == 0 and count is None:
                self.errors[f"pcie {what} counter: NVML value type {v.valueType}, not a 64-bit count"] += 1
            out.append(count)
        return out[0], out[1]

    def _clock_events(self, handle: Any) -> int | None:
        nvml = self._nvml
        if self._use_event_reasons:
            try:
                return int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
            except nvml.NVMLError as e:
                if e.value != _FUNCTION_NOT_FOUND:
                    if e.value in LOST_ERRORS:
                        raise _Lost from e
                    if e.value != _NOT_SUPPORTED:
                        self.errors[f"clock event reasons: {e}"] += 1
                    return None
                self._use_event_reasons = False  # a driver older than 535: the older name
        return self._read("clock event reasons", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)

    def _fast_readings(self, row: GpuFast, out: dict[str, Any]) -> None:
        """The fast sampler's utilisation and clock events since the previous sample, into out."""
        if row.last_error in LOST_ERRORS and not row.util_ticks and not row.clock_ticks:
            raise _Lost
        if row.errors:
            self.errors[f"fast readings: NVML error {row.last_error}"] += row.errors
        if row.sm_mean is not None and row.mem_mean is not None:
            out.update(
                sm_utilization_percent=row.sm_mean,
                memory_utilization_percent=row.mem_mean,
                sm_utilization_max=row.sm_max,
                memory_utilization_max=row.mem_max,
                utilization_readings=row.util_ticks,
            )
        if row.mask is not None:
            out.update(
                clock_event_mask=row.mask, clock_readings=row.clock_ticks, throttled_readings=row.throttled_ticks
            )

    def _sample_gpu(
        self,
        g: _Gpu,
        now: int,
        xids: tuple[int, ...],
        detail: bool,
        fast: GpuFast | None = None,
        estimate: bool = False,
    ) -> GpuSample:
        nvml = self._nvml
        h = g.handle
        base: dict[str, Any] = dict(
            index=g.index, uuid=g.uuid, name=g.name, bus_id=g.bus_id, time_ns=now, xids=xids, detail=detail
        )
        if h is None:
            return GpuSample(**base, lost=True)
        try:
            if fast is not None:
                self._fast_readings(fast, base)
            else:
                util = self._read("utilization", nvml.nvmlDeviceGetUtilizationRates, h)
                if util is not None:
                    base.update(sm_utilization_percent=int(util.gpu), memory_utilization_percent=int(util.memory))
                base["clock_event_mask"] = self._clock_events(h)
            base["sm_clock_mhz"] = self._read("sm clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
            base["memory_clock_mhz"] = self._read("memory clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)
            if detail:
                self._detail(g, base, estimate)
        except _Lost:
            for state in [*([g.gpm_state] if g.gpm_state else []), *g.mig_gpm.values()]:
                state.ready = False  # the next GPM sample starts a new interval
            if not g.lost:
                g.lost = True
                self.lost_count += 1
            return GpuSample(
                **{k: base[k] for k in ("index", "uuid", "name", "bus_id", "time_ns", "xids", "detail")}, lost=True
            )
        g.lost = False
        return GpuSample(**base)

    def _detail(self, g: _Gpu, out: dict[str, Any], estimate: bool) -> None:
        """The readings that change slowly, into out (GpuSample's fields); with `estimate`, NVML's
        20 ms PCIe throughput estimate of a GPU without byte counters."""
        nvml = self._nvml
        h = g.handle
        mem = self._read("memory", nvml.nvmlDeviceGetMemoryInfo, h)
        tx = rx = tx_count = rx_count = None
        if g.pcie_counters:
            tx_count, rx_count = self._pcie_counts(h)
        elif estimate:
            tx = self._read("pcie tx", nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = self._read("pcie rx", nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_RX_BYTES)
        procs = self._read("processes", nvml.nvmlDeviceGetComputeRunningProcesses, h)
        corrected, uncorrected = (
            self._read(f"ecc {name}", nvml.nvmlDeviceGetTotalEccErrors, h, kind, nvml.NVML_VOLATILE_ECC)
            for name, kind in (
                ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            )
        )
        out.update(
            pcie_tx_bytes_per_s=None if tx is None else tx * 1024,  # NVML counts KB/s
            pcie_rx_bytes_per_s=None if rx is None else rx * 1024,
            pcie_tx_bytes=tx_count,
            pcie_rx_bytes=rx_count,
            pcie_replay_count=self._read("pcie replays", nvml.nvmlDeviceGetPcieReplayCounter, h),
            link_generation=self._read("link generation", nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
            link_width=self._read("link width", nvml.nvmlDeviceGetCurrPcieLinkWidth, h),
            max_link_generation=g.max_link_generation,
            max_link_width=g.max_link_width,
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            temperature_celsius=self._read("temperature", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
            power_milliwatts=self._read("power", nvml.nvmlDeviceGetPowerUsage, h),
            ecc_corrected_volatile=corrected,
            ecc_uncorrected_volatile=uncorrected,
        )
        self._gpm(g, out)
        out["nvlinks"] = tuple(self._nvlink(h, link) for link in g.links)
        rows = self._read("remapped rows", nvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            out["remapped_rows"] = RemappedRows(int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3]))
        mode = self._read("mig mode", nvml.nvmlDeviceGetMigMode, h)
        instances: tuple[MigInstance, ...] = ()
        if mode is not None:
            out["mig_enabled"] = bool(mode[0])
            if mode[0]:
                instances = self._mig_instances(g)
        out["mig_instances"] = instances
        out["processes"] = _attributed(g, procs or (), instances)
        out["process_utilization"] = self._process_utilization(g)

    def _gpm(self, g: _Gpu, out: dict[str, Any]) -> None:
        """GPM activity between the previous detailed sample and this one, into out."""
        out["gpm_supported"] = g.gpm
        if not g.gpm:
            return
        if g.gpm_state is None:
            g.gpm_state = self._gpm_state()
        if g.gpm_state is not None:
            out.update(self._gpm_interval(g.gpm_state, lambda buf: self._nvml.nvmlGpmSampleGet(g.handle, buf)))

    def _gpm_state(self) -> _GpmState | None:
        nvml = self._nvml
        try:
            return _GpmState([nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()])
        except nvml.NVMLError as e:
            self.errors[f"gpm: {e}"] += 1
            return None

    def _gpm_interval(self, state: _GpmState, take: Callable[[Any], Any]) -> dict[str, float]:
        """Take a sample into the next buffer (`take(buffer)`); the metrics between the previous
        sample and it (none at the first)."""
        nvml = self._nvml
        previous, current = state.samples
        if self._read("gpm sample", take, current) is None:
            state.ready = False
            return {}
        out: dict[str, float] = {}
        if state.ready:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = previous, current
            for i, metric in enumerate(GPM_METRICS):
                request.metrics[i].metricId = metric
            if self._read("gpm metrics", nvml.nvmlGpmMetricsGet, request) is not None:
                for i, name in enumerate(GPM_METRICS.values()):
                    m = request.metrics[i]
                    if m.nvmlReturn == 0:
                        out[name] = float(m.value)
                    elif m.nvmlReturn != _NOT_SUPPORTED:
                        self.errors[f"gpm {name}: {nvml.NVMLError(m.nvmlReturn)}"] += 1
        state.samples = [current, previous]
        state.ready = True
        return out

    def _mig_gpm(self, g: _Gpu, gpu_instance: int | None) -> dict[str, float]:
        """A MIG instance's own GPM activity since the previous detailed sample
        (nvmlGpmMigSampleGet on its GPU, by its GPU instance id)."""
        if not g.gpm or gpu_instance is None:
            return {}
        state = g.mig_gpm.get(gpu_instance)
        if state is None:
            state = self._gpm_state()
            if state is None:
                return {}
            g.mig_gpm[gpu_instance] = state
        return self._gpm_interval(state, lambda buf: self._nvml.nvmlGpmMigSampleGet(g.handle, gpu_instance, buf))

    def _nvlink(self, h: Any, link: int) -> NvLink:
        nvml = self._nvml
        state = self._read("nvlink state", nvml.nvmlDeviceGetNvLinkState, h, link)

        def errors(name: str, counter: int) -> int | None:
            v = self._read(f"nvlink {name} errors", nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            return None if v is None else int(v)

        flit, data = errors("crc flit", _NVLINK_CRC_FLIT), errors("crc data", _NVLINK_CRC_DATA)
        tx = rx = None
        try:
            values = nvml.nvmlDeviceGetFieldValues(h, [(f, link) for f in NVLINK_DATA_FIELDS])
        except nvml.NVMLError as e:
            if e.value in LOST_ERRORS:
                raise _Lost from e
            self.errors[f"nvlink bytes: {e}"] += 1
        else:
            counts = []
            for v in values:
                if v.nvmlReturn in LOST_ERRORS:
                    raise _Lost
                if v.nvmlReturn not in (0, _NOT_SUPPORTED):
                    self.errors[f"nvlink bytes: {nvml.NVMLError(v.nvmlReturn)}"] += 1
                count = _field_count(v) if v.nvmlReturn == 0 else None
                counts.append(None if count is None else count * 1024)  # counted in KiB
            tx, rx = counts
        return NvLink(
            link=link,
            active=bool(state),
            tx_bytes=tx,
            rx_bytes=rx,
            crc_errors=None if flit is None and data is None else (flit or 0) + (data or 0),
            replay_errors=errors("replay", _NVLINK_REPLAY),
            recovery_errors=errors("recovery", _NVLINK_RECOVERY),
        )

    def _mig_instances(self, g: _Gpu) -> tuple[MigInstance, ...]:
        nvml = self._nvml
        count = self._read("mig devices", nvml.nvmlDeviceGetMaxMigDeviceCount, g.handle) or 0
        out = []
        for slot in range(int(count)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(g.handle, slot)
            except nvml.NVMLError as e:
                if e.value in LOST_ERRORS:
                    raise _Lost from e
                if e.value not in (_NOT_FOUND, _INVALID_ARGUMENT, _NOT_SUPPORTED):
                    self.errors[f"mig device: {e}"] += 1
                continue  # an empty slot
            uuid = self._read("mig uuid", nvml.nvmlDeviceGetUUID, mig)
            mig_uuid = _text(uuid) if uuid is not None else f"{g.uuid}/mig-{slot}"
            gi = self._read("mig gpu instance", nvml.nvmlDeviceGetGpuInstanceId, mig)
            ci = self._read("mig compute instance", nvml.nvmlDeviceGetComputeInstanceId, mig)
            mem = self._read("mig memory", nvml.nvmlDeviceGetMemoryInfo, mig)
            procs = self._read("mig processes", nvml.nvmlDeviceGetComputeRunningProcesses, mig) or ()
            out.append(
                MigInstance(
                    slot=slot,
                    uuid=mig_uuid,
                    gpu_instance_id=None if gi is None else int(gi),
                    compute_instance_id=None if ci is None else int(ci),
                    memory_used_bytes=None if mem is None else int(mem.used),
                    memory_total_bytes=None if mem is None else int(mem.total),
                    processes=tuple(_process(p, g, mig_uuid) for p in procs),
                    **self._mig_gpm(g, None if gi is None else int(gi)),
                )
            )
        return tuple(out)

    def _process_utilization(self, g: _Gpu) -> tuple[ProcessUtilization, ...]:
        """Each process's SM and memory utilisation in NVML's samples newer than the last read."""
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(g.handle, g.util_seen)
        except nvml.NVMLError as e:
            if e.value in LOST_ERRORS:
                raise _Lost from e
            if e.value not in (_NOT_FOUND, _NOT_SUPPORTED):  # not found: no sample since the last
                self.errors[f"process utilization: {e}"] += 1
            return ()
        latest: dict[int, Any] = {}
        for u in samples:
            if u.pid not in latest or u.timeStamp >= latest[u.pid].timeStamp:
                latest[int(u.pid)] = u
            g.util_seen = max(g.util_seen, int(u.timeStamp))
        return tuple(
            ProcessUtilization(pid=pid, sm_percent=int(u.smUtil), memory_percent=int(u.memUtil))
            for pid, u in sorted(latest.items())
        )

    def _drain_xids(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        by_address = {g.address: g.index for g in self._gpus if g.address is not None}
        nvml = self._nvml
        for _ in range(MAX_XIDS_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError as e:
                if e.value != _TIMEOUT:
                    self.errors[f"xid events: {e}"] += 1
                break
            if not data.eventType & _XID_CRITICAL_ERROR:
                continue
            address = _handle_address(data.device)
            index = None if address is None else by_address.get(address)
            if index is None:
                self.errors["xid events: event from an unknown GPU"] += 1
                continue
            out.setdefault(index, []).append(int(data.eventData))
        return out


def _process(p: Any, g: _Gpu, mig_uuid: str | None = None) -> GpuProcess:
    return GpuProcess(
        pid=int(p.pid),
        gpu_index=g.index,
        gpu_uuid=g.uuid,
        used_memory_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
        mig_uuid=mig_uuid,
    )


def _attributed(g: _Gpu, procs: Any, instances: tuple[MigInstance, ...]) -> tuple[GpuProcess, ...]:
    """The GPU's processes, each on the MIG instance that lists it (with that instance's count of
    its memory), and the processes only an instance lists."""
    on_mig: dict[int, GpuProcess | None] = {p.pid: p for m in instances for p in m.processes}
    out = [on_mig.pop(int(p.pid), None) or _process(p, g) for p in procs]
    return (*out, *(p for p in on_mig.values() if p is not None))


def processes_by_pid(samples: list[GpuSample]) -> dict[int, list[GpuProcess]]:
    """Which GPUs each pid has a context on, and its memory there."""
    out: dict[int, list[GpuProcess]] = {}
    for s in samples:
        for p in s.processes:
            out.setdefault(p.pid, []).append(p)
    return out
