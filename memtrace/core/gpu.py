"""What memtrace knows about a GPU at one instant (from NVML), and the rates between two instants.

Pure data: the NVML source (memtrace.sources.nvml) fills these; the model and
the diagnosis read them. A field NVML does not support on a GPU is None, never
0, and a GPU that fell off the bus is `lost` with every reading None.
"""

from __future__ import annotations

from dataclasses import dataclass

# NVML clock-event reasons (nvmlClocksEventReason*, formerly *ThrottleReason*): bit -> name.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# The reasons that cost a busy job speed: power and thermal limits, hardware slowdowns.
THROTTLE_REASONS = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)
# The same reasons as an NVML clock-event mask (what the fast sampler tests each reading with).
THROTTLE_MASK = sum(bit for bit, name in CLOCK_EVENT_REASONS.items() if name in THROTTLE_REASONS)


def clock_event_names(mask: int) -> tuple[str, ...]:
    """Names of the bits set in an NVML clock-event mask, unknown bits as hex."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return tuple(names)


@dataclass(frozen=True)
class GpuProcess:
    """A process with a context on a GPU, as NVML lists it (host pid namespace)."""

    pid: int
    gpu_index: int
    gpu_uuid: str
    used_memory_bytes: int | None  # None: NVML cannot tell (e.g. no permission, WDDM)
    mig_uuid: str | None = None  # the MIG instance it runs on (None: the whole GPU)


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU at a sample. Counters are the driver's, cumulative since it loaded.

    Bytes are NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (the link as scopeId): payload only, counted
    by the driver in KiB (Ampere and later; what `nvidia-smi nvlink -gt d` prints). Errors are
    nvmlDeviceGetNvLinkErrorCounter's: CRC (flit and data CRC together), replays, recoveries.
    None: the driver does not count it on this link."""

    link: int
    active: bool
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    crc_errors: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None


@dataclass(frozen=True)
class RemappedRows:
    """HBM row remapping (Ampere and later, nvmlDeviceGetRemappedRows): rows remapped for
    correctable and uncorrectable errors since the GPU was made; `pending`: a remapping waits for
    the next GPU reset; `failed`: a remapping failed (the GPU has no spare rows left there)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True)
class MigInstance:
    """A MIG device (a GPU instance and compute instance) of a GPU in MIG mode: its own device,
    with its own memory and processes."""

    slot: int  # its index among the GPU's MIG devices
    uuid: str
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    processes: tuple[GpuProcess, ...] = ()
    # Its own GPM activity over the interval between detailed samples (nvmlGpmMigSampleGet), as the
    # GPU's: None where its GPU has no GPM, or at the first sample.
    sm_active_percent: float | None = None
    sm_occupancy_percent: float | None = None
    tensor_active_percent: float | None = None
    dram_bandwidth_percent: float | None = None


@dataclass(frozen=True)
class ProcessUtilization:
    """A process's share of the GPU over NVML's last sampling window (nvmlDeviceGetProcessUtilization)."""

    pid: int
    sm_percent: int
    memory_percent: int


@dataclass(frozen=True)
class GpuSample:
    """One GPU's readings at time_ns (CLOCK_MONOTONIC). None: not supported or not readable."""

    index: int
    uuid: str
    name: str
    bus_id: str
    time_ns: int
    lost: bool = False  # fell off the bus (NVML_ERROR_GPU_IS_LOST or alike): nothing else is valid
    detail: bool = True  # False: only utilisation, clock events and XIDs were read (see NvmlSource.poll)
    # PCIe bytes the GPU sent (tx) and received (rx): where the driver counts them, cumulative since
    # it loaded (exact between two samples); else NVML's estimate over its own 20 ms window, per second.
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    pcie_tx_bytes_per_s: int | None = None
    pcie_rx_bytes_per_s: int | None = None
    pcie_replay_count: int | None = None  # cumulative since the driver loaded
    link_generation: int | None = None
    link_width: int | None = None
    max_link_generation: int | None = None  # the most this GPU and this slot can do together
    max_link_width: int | None = None
    sm_utilization_percent: float | None = None
    memory_utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: int | None = None
    power_milliwatts: int | None = None
    clock_event_mask: int | None = None
    sm_clock_mhz: int | None = None  # the SM and memory clocks now (nvmlDeviceGetClockInfo), at every sample
    memory_clock_mhz: int | None = None
    ecc_corrected_volatile: int | None = None  # since the driver loaded
    ecc_uncorrected_volatile: int | None = None
    xids: tuple[int, ...] = ()  # XID critical errors raised since the previous sample, in order
    # Read by the fast sampler (100 Hz) since the previous sample: the utilisations above are then
    # the means of utilization_readings readings (these the maxima), the clock-event mask every reason
    # seen in clock_readings readings, throttled_readings of them with a throttling reason.
    # None: read once, at the sample.
    sm_utilization_max: int | None = None
    memory_utilization_max: int | None = None
    utilization_readings: int | None = None
    clock_readings: int | None = None
    throttled_readings: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    # GPU performance monitoring (GPM, Hopper and later), over the interval between two detailed
    # samples: SMs busy, warps resident of the most possible, SM cycles in tensor pipes, DRAM
    # bandwidth of its peak (percent). gpm_supported False: this GPU has no GPM (older than Hopper),
    # and these are None, never 0; None: not asked (lost, or a sample between details).
    gpm_supported: bool | None = None
    sm_active_percent: float | None = None
    sm_occupancy_percent: float | None = None
    tensor_active_percent: float | None = None
    dram_bandwidth_percent: float | None = None
    nvlinks: tuple[NvLink, ...] = ()  # the links the driver reports (none: no NVLink)
    remapped_rows: RemappedRows | None = None
    mig_enabled: bool | None = None  # None: MIG not supported (or not read)
    mig_instances: tuple[MigInstance, ...] = ()
    process_utilization: tuple[ProcessUtilization, ...] = ()

    @property
    def nvlinks_down(self) -> int:
        """Links the driver reports inactive: traffic that needs them takes the others, or PCIe."""
        return sum(not link.active for link in self.nvlinks)

    @property
    def clock_event_reasons(self) -> tuple[str, ...] | None:
        return None if self.clock_event_mask is None else clock_event_names(self.clock_event_mask)

    @property
    def throttled(self) -> bool | None:
        """Power or thermal limits (or a hardware slowdown) hold the clocks down."""
        reasons = self.clock_event_reasons
        return None if reasons is None else bool(THROTTLE_REASONS.intersection(reasons))

    @property
    def link_degraded(self) -> bool | None:
        """The PCIe link trained below what this GPU and slot can do.

        A narrower link is always a fault. A lower generation is one only while
        the GPU is busy: NVIDIA GPUs drop the link generation when idle to save
        power and raise it again under load. None: NVML cannot tell.
        """
        if self.link_width is not None and self.max_link_width is not None and self.link_width < self.max_link_width:
            return True
        if self.link_generation is None or self.max_link_generation is None:
            return None if self.link_width is None or self.max_link_width is None else False
        if self.link_generation < self.max_link_generation:
            if self.sm_utilization_percent is None:
                return None
            return self.sm_utilization_percent > 0
        return False


def counter_delta(before: int | None, after: int | None) -> tuple[int | None, bool]:
    """Increase of a cumulative counter; a counter that went down was reset (driver reload), so it counts from 0."""
    if before is None or after is None:
        return None, False
    if after < before:
        return after, True
    return after - before, False


@dataclass(frozen=True)
class GpuRates:
    """What changed on one GPU between two samples. None: not known for this interval."""

    index: int
    uuid: str
    interval_s: float
    pcie_replays: int | None
    pcie_replays_per_s: float | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    xids: tuple[int, ...]
    counter_resets: int  # counters that went down (and were counted from zero)
    pcie_tx_bytes: int | None = None  # from the driver's byte counters (None: it has none)
    pcie_rx_bytes: int | None = None
    nvlink_tx_bytes: int | None = None  # over all links (None: no link counts bytes)
    nvlink_rx_bytes: int | None = None
    nvlink_errors: int | None = None  # CRC, replay and recovery errors over all links


def _summed(deltas: list[tuple[int | None, bool]]) -> tuple[int | None, int]:
    """The sum of the counters that were read (None: none was), and how many were reset."""
    known = [d for d, _ in deltas if d is not None]
    return (sum(known) if known else None), sum(r for _, r in deltas)


def nvlink_deltas(before: GpuSample, after: GpuSample) -> tuple[int | None, int | None, int | None, int]:
    """Bytes sent and received over all NVLinks between two samples, their errors, and the counters
    that went down (a driver reload, or `nvidia-smi nvlink -r`): counted from zero."""
    earlier = {link.link: link for link in before.nvlinks}
    tx: list[tuple[int | None, bool]] = []
    rx: list[tuple[int | None, bool]] = []
    errors: list[tuple[int | None, bool]] = []
    for link in after.nvlinks:
        b = earlier.get(link.link)
        if b is None:
            continue
        tx.append(counter_delta(b.tx_bytes, link.tx_bytes))
        rx.append(counter_delta(b.rx_bytes, link.rx_bytes))
        for name in ("crc_errors", "replay_errors", "recovery_errors"):
            errors.append(counter_delta(getattr(b, name), getattr(link, name)))
    t, r1 = _summed(tx)
    r, r2 = _summed(rx)
    e, r3 = _summed(errors)
    return t, r, e, r1 + r2 + r3


def gpu_rates(before: GpuSample, after: GpuSample) -> GpuRates | None:
    """Rates between two samples of the same GPU; None if the GPU changed or either sample is lost."""
    if before.uuid != after.uuid or before.lost or after.lost or after.time_ns <= before.time_ns:
        return None
    interval = (after.time_ns - before.time_ns) / 1e9
    replays, r1 = counter_delta(before.pcie_replay_count, after.pcie_replay_count)
    corrected, r2 = counter_delta(before.ecc_corrected_volatile, after.ecc_corrected_volatile)
    uncorrected, r3 = counter_delta(before.ecc_uncorrected_volatile, after.ecc_uncorrected_volatile)
    tx, r4 = counter_delta(before.pcie_tx_bytes, after.pcie_tx_bytes)
    rx, r5 = counter_delta(before.pcie_rx_bytes, after.pcie_rx_bytes)
    nv_tx, nv_rx, nv_errors, r6 = nvlink_deltas(before, after)
    return GpuRates(
        index=after.index,
        uuid=after.uuid,
        interval_s=interval,
        pcie_replays=replays,
        pcie_replays_per_s=None if replays is None else replays / interval,
        ecc_corrected=corrected,
        ecc_uncorrected=uncorrected,
        xids=after.xids,
        counter_resets=r1 + r2 + r3 + r4 + r5 + r6,
        pcie_tx_bytes=tx,
        pcie_rx_bytes=rx,
        nvlink_tx_bytes=nv_tx,
        nvlink_rx_bytes=nv_rx,
        nvlink_errors=nv_errors,
    )
