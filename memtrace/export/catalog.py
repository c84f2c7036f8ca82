"""What memtrace pushes, once: every metric (name, instrument kind, unit,
description, attributes, the signal it comes from, the resource it is on),
the events (OTLP log records) and the profiles' sample types.

The builders take their names, units and descriptions from here and from
nowhere else; docs/metrics.md is generated from it:

    python -m memtrace.export.catalog --write docs/metrics.md

tests/test_otlp.py proves that a rich build emits exactly these metrics,
kinds, units and attributes, and tests/test_rules.py that the committed
reference is the one this module makes.
"""

from __future__ import annotations

import enum
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from memtrace.analysis.diagnosis import CAUSES
from memtrace.core.nccl import Collective


class Kind(str, enum.Enum):
    """The OTLP data type: a monotonic sum (a counter), a gauge, or a histogram
    (exponential by default, explicit buckets with `--histogram explicit`)."""

    sum = "sum"
    gauge = "gauge"
    histogram = "histogram"


class Signal(str, enum.Enum):
    """Where a metric's values come from; the reference has a table for each."""

    copies = "CUDA memory copies"
    syncs = "Synchronisation waits"
    launches = "Kernel and graph launches"
    memory = "Device and pinned host memory"
    steps = "Steps"
    analysis = "Findings and diagnoses"
    overhead = "What memtrace costs the process"
    cpu = "CPU time"
    nccl = "NCCL collectives"
    gpu = "GPUs"
    network = "Network interfaces and queues"
    agent = "The agent's health"


SIGNAL_SOURCES: dict[Signal, str] = {
    Signal.copies: "uprobes on the CUDA runtime and driver copy functions, per process",
    Signal.syncs: "uprobes on the stream, device and event synchronisation functions, per process",
    Signal.launches: "uprobes on the kernel and graph launch functions (counted in the kernel), per process",
    Signal.memory: "uprobes on the allocation, free and host-registration functions, per process",
    Signal.steps: 'inferred from each process\'s own call stream, no code change (README, "Steps")',
    Signal.analysis: 'computed from the model and the host signals (README, "Findings" and "Diagnoses")',
    Signal.overhead: "the kernel's trap counts times this host's calibrated trap cost, per process",
    Signal.cpu: "the kernel's sched tracepoints, per traced process (host signals)",
    Signal.nccl: "uprobes on libnccl's collectives, per process (host signals)",
    Signal.gpu: "NVML, one series per GPU (host signals)",
    Signal.network: "rtnetlink: every interface and queue of the namespaces the traced processes live in",
    Signal.agent: "the agent itself",
}


class On(str, enum.Enum):
    """The resource a metric's series are on."""

    process = "process"  # one resource per traced process
    agent = "agent"  # the agent's own resource (service.name=memtrace)


@dataclass(frozen=True)
class Attribute:
    name: str
    meaning: str
    semconv: bool = False  # the name is one of OpenTelemetry's semantic conventions


@dataclass(frozen=True)
class SemConv:
    """Where a metric follows an OpenTelemetry semantic convention: its name
    and unit are the convention's; `differs` says what is not."""

    differs: str = ""


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    unit: str
    description: str
    signal: Signal
    on: On
    attributes: tuple[Attribute, ...] = ()
    semconv: SemConv | None = None

    @property
    def attribute_names(self) -> frozenset[str]:
        return frozenset(a.name for a in self.attributes)


# ---- attributes on the data points ----

DIRECTION = Attribute("direction", "h2d, d2h, d2d, h2h, peer, default or unknown: which way the copy went")
API = Attribute("api", "the CUDA function called, e.g. cudaMemcpyAsync, cuMemcpyHtoDAsync_v2")
LAYER = Attribute("layer", "runtime or driver: the library the call was made to")
MODE = Attribute(
    "mode", "sync or async: an async call's duration is its enqueue time, not the transfer's, so they are kept apart"
)
HOST_MEMORY = Attribute(
    "host_memory", "pinned, pageable, managed or unknown: the host memory the copy touched (absent on d2d and peer)"
)
SYNC_KIND = Attribute("kind", "stream, device, event or other: what the call waits for")
LAUNCH_KIND = Attribute("kind", "kernel or graph")
ESTIMATED = Attribute(
    "estimated",
    "true where the overhead budget sampled the process's launch probes: partly extrapolated, a series of its own",
)
CALIBRATED = Attribute("calibrated", "true when the trap cost was measured on this host, false when it is a default")
FINDING = Attribute("finding", 'the finding\'s code (README, "Findings"); its summary and fix are in its event')
CAUSE = Attribute("cause", ", ".join(CAUSES) + " or unknown (docs/diagnosis.md)")
OWN_CAUSE = Attribute(
    "own_cause",
    "on straggler diagnoses only: what slowed this rank itself (a cause above, or unknown) where its peers "
    "wait for it, `waiting` where it waits for a peer (on its host, or across the network); the fleet's rules "
    "name a slow rank's cause by it",
)
CONTEXT_SWITCH_TYPE = Attribute(
    "process.context_switch_type",
    "voluntary or involuntary (the conventions' older name: they now say process.context_switch.type)",
)
COLLECTIVE = Attribute(
    "collective",
    ", ".join(c.label for c in Collective if c not in (Collective.GROUP_START, Collective.GROUP_END)),
)
HW_ID = Attribute("hw.id", "the GPU's UUID", semconv=True)
HW_NAME = Attribute("hw.name", "the GPU's product name", semconv=True)
HW_TYPE = Attribute("hw.type", "gpu", semconv=True)
GPU_INDEX = Attribute("gpu.index", "the GPU's NVML index")
NVLINK = Attribute("memtrace.nvlink", "the NVLink's number on its GPU")
NVLINK_ERROR = Attribute("error.type", "crc (flit and data CRC), replay or recovery", semconv=True)
REMAP_CAUSE = Attribute("memtrace.remap.cause", "correctable or uncorrectable: the errors the rows were remapped for")
MIG_ID = Attribute("memtrace.mig.id", "the MIG instance's UUID (MIG-...)")
POD_UID = Attribute("k8s.pod.uid", "the pod, from its processes' cgroups", semconv=True)
NETWORK_DIRECTION = Attribute("network.io.direction", "receive or transmit", semconv=True)
INTERFACE = Attribute("network.interface.name", "the interface's name in its namespace", semconv=True)
NETNS = Attribute("memtrace.netns", "the inode of the interface's network namespace")
HOST_NAMESPACE = Attribute("memtrace.host_namespace", "true for the namespace memtrace itself runs in")
QDISC_KIND = Attribute("memtrace.qdisc.kind", "the queueing discipline, e.g. tbf, fq_codel, mq")
QDISC_HANDLE = Attribute("memtrace.qdisc.handle", "its handle, major:minor in hex")

COPY = (DIRECTION, API, LAYER, MODE, HOST_MEMORY)
SYNC = (API, LAYER, SYNC_KIND)
GPU = (HW_ID, HW_NAME, HW_TYPE, GPU_INDEX)
GPU_OR_MIG = (*GPU, MIG_ID)  # a MIG instance's series carry its UUID beside its GPU's attributes
LINK = (INTERFACE, NETNS, HOST_NAMESPACE)
QDISC = (INTERFACE, NETNS, QDISC_KIND, QDISC_HANDLE)

_S, _G, _H = Kind.sum, Kind.gauge, Kind.histogram
_P, _A = On.process, On.agent
CONVENTION = SemConv()


def _m(
    name: str,
    kind: Kind,
    unit: str,
    description: str,
    signal: Signal,
    on: On = _P,
    attributes: tuple[Attribute, ...] = (),
    semconv: SemConv | None = None,
) -> MetricSpec:
    return MetricSpec(name, kind, unit, description, signal, on, attributes, semconv)


# ---- the metrics ----

MEMCPY_CALLS = _m("gpu.memcpy.calls", _S, "{call}", "CUDA memory copy calls", Signal.copies, attributes=COPY)
MEMCPY_BYTES = _m(
    "gpu.memcpy.bytes", _S, "By", "Bytes moved by successful CUDA memory copies", Signal.copies, attributes=COPY
)
MEMCPY_ERRORS = _m(
    "gpu.memcpy.errors", _S, "{call}", "CUDA memory copy calls that returned an error", Signal.copies, attributes=COPY
)
MEMCPY_DURATION = _m(
    "gpu.memcpy.duration",
    _H,
    "s",
    "Duration of each copy call, entry to return (async: the enqueue time)",
    Signal.copies,
    attributes=COPY,
)
MEMCPY_SIZE = _m("gpu.memcpy.size", _H, "By", "Bytes of each successful copy call", Signal.copies, attributes=COPY)

SYNC_CALLS = _m(
    "gpu.sync.calls", _S, "{call}", "Synchronisation waits (stream, device, event)", Signal.syncs, attributes=SYNC
)
SYNC_WAIT_TIME = _m(
    "gpu.sync.wait_time", _S, "s", "Time spent blocked in synchronisation waits", Signal.syncs, attributes=SYNC
)
SYNC_DURATION = _m("gpu.sync.duration", _H, "s", "Duration of each synchronisation wait", Signal.syncs, attributes=SYNC)
SYNC_WALL_TIME_SHARE = _m(
    "gpu.sync.wall_time_share",
    _G,
    "1",
    "Share of the process's wall time spent in synchronisation waits",
    Signal.syncs,
)

LAUNCHES = _m(
    "gpu.launches",
    _S,
    "{launch}",
    "Kernel and graph launches, counted once across runtime and driver",
    Signal.launches,
    attributes=(API, LAUNCH_KIND, ESTIMATED),
)

MEMORY_ALLOCATIONS = _m(
    "gpu.memory.allocations",
    _S,
    "{allocation}",
    "Device memory allocations (device, pitched, async, managed, VMM)",
    Signal.memory,
)
MEMORY_ALLOCATED = _m("gpu.memory.allocated", _S, "By", "Bytes of device memory allocated", Signal.memory)
MEMORY_FREES = _m("gpu.memory.frees", _S, "{free}", "Frees of device memory memtrace saw allocated", Signal.memory)
MEMORY_FREED = _m("gpu.memory.freed", _S, "By", "Bytes of device memory freed", Signal.memory)
MEMORY_UNKNOWN_FREES = _m(
    "gpu.memory.unknown_frees",
    _S,
    "{free}",
    "Frees of addresses memtrace never saw allocated (not subtracted)",
    Signal.memory,
)
MEMORY_FAILED_ALLOCATIONS = _m(
    "gpu.memory.failed_allocations",
    _S,
    "{allocation}",
    "Device memory allocations that returned an error",
    Signal.memory,
)
MEMORY_ALLOCATION_SIZE = _m(
    "gpu.memory.allocation.size", _H, "By", "Bytes of each device memory allocation", Signal.memory
)
MEMORY_IN_USE = _m("gpu.memory.in_use", _G, "By", "Device memory allocated and not yet freed", Signal.memory)
MEMORY_OUTSTANDING = _m(
    "gpu.memory.outstanding", _G, "{allocation}", "Device memory allocations not yet freed", Signal.memory
)
MEMORY_PINNED_HOST = _m(
    "gpu.memory.pinned_host", _G, "By", "Page-locked host memory allocated or registered now", Signal.memory
)
MEMORY_NVML_USED = _m(
    "gpu.memory.nvml_used",
    _G,
    "By",
    "Device memory NVML counts for the process (usedGpuMemory, over its GPUs, at the last detailed sample): "
    "its CUDA context, what its allocator holds, and memory allocated through calls memtrace does not probe",
    Signal.memory,
)
MEMORY_UNATTRIBUTED = _m(
    "gpu.memory.unattributed",
    _G,
    "By",
    "gpu.memory.nvml_used less gpu.memory.in_use: what no probed allocation explains, mostly the CUDA context "
    "(below zero for a moment: NVML's figure is up to a sample old)",
    Signal.memory,
)

STEPS = _m("memtrace.steps", _S, "{step}", "Steps (iterations) inferred from the process's call stream", Signal.steps)
STEP_DURATION = _m("memtrace.step.duration", _H, "s", "Duration of each inferred step", Signal.steps)
STEP_GPU_IDLE_SHARE = _m(
    "memtrace.step.gpu_idle_share",
    _G,
    "1",
    "Share of step time the GPU waited for the host: a wait's return to the next copy, wait or launch",
    Signal.steps,
)

FINDING_VALUE = _m(
    "memtrace.finding",
    _G,
    "1",
    "A finding about the process: its headline number (its summary and fix: the memtrace.finding event)",
    Signal.analysis,
    attributes=(FINDING,),
)
DIAGNOSES = _m(
    "memtrace.diagnoses",
    _S,
    "{diagnosis}",
    "Slowdowns diagnosed in the process, by cause (each also a memtrace.diagnosis event)",
    Signal.analysis,
    attributes=(CAUSE, OWN_CAUSE),
)

PROBE_TRAPS = _m(
    "memtrace.probe.traps",
    _S,
    "{trap}",
    "Traps memtrace's probes made the process take (entries, returns, launches)",
    Signal.overhead,
)
OVERHEAD = _m(
    "memtrace.overhead",
    _G,
    "1",
    "Share of the process's CPU time memtrace's probes cost it (estimated: traps x this host's trap cost)",
    Signal.overhead,
    attributes=(CALIBRATED,),
)

RUN_QUEUE_TIME = _m(
    "memtrace.process.run_queue.time",
    _S,
    "s",
    "Time the process's threads were runnable, waiting for a CPU",
    Signal.cpu,
)
OFF_CPU_TIME = _m(
    "memtrace.process.off_cpu.time",
    _S,
    "s",
    "Time the process's threads were blocked (sleeping, I/O, locks)",
    Signal.cpu,
)
ON_CPU_TIME = _m("memtrace.process.on_cpu.time", _S, "s", "Time the process's threads ran", Signal.cpu)
STOLEN_TIME = _m(
    "memtrace.process.stolen.time",
    _S,
    "s",
    "Time the process's threads held a CPU the hypervisor gave to another guest (steal, not in on-CPU time)",
    Signal.cpu,
)
CONTEXT_SWITCHES = _m(
    "process.context_switches",
    _S,
    "{context_switch}",
    "Context switches of the process's threads",
    Signal.cpu,
    attributes=(CONTEXT_SWITCH_TYPE,),
    semconv=SemConv("its attribute has the conventions' older name"),
)

NCCL_CALLS = _m("memtrace.nccl.calls", _S, "{call}", "NCCL collective calls", Signal.nccl, attributes=(COLLECTIVE,))
NCCL_BYTES = _m(
    "memtrace.nccl.bytes",
    _S,
    "By",
    "Bytes of successful NCCL collective calls (count x datatype size)",
    Signal.nccl,
    attributes=(COLLECTIVE,),
)
NCCL_TIME = _m(
    "memtrace.nccl.time",
    _S,
    "s",
    "Time inside NCCL collective calls (the enqueue)",
    Signal.nccl,
    attributes=(COLLECTIVE,),
)
NCCL_WAITS = _m(
    "memtrace.nccl.waits",
    _S,
    "{wait}",
    "Synchronisations that waited for a collective's work",
    Signal.nccl,
    attributes=(COLLECTIVE,),
)
NCCL_WAIT_TIME = _m(
    "memtrace.nccl.wait_time",
    _S,
    "s",
    "Time the process then waited for its collectives' work (long on the ranks that wait for a straggler)",
    Signal.nccl,
    attributes=(COLLECTIVE,),
)

GPU_UTILIZATION = _m(
    "hw.gpu.utilization",
    _G,
    "1",
    "Share of time a kernel ran on the GPU (NVML)",
    Signal.gpu,
    _A,
    GPU,
    SemConv("the conventions' hw.gpu.task attribute is not set"),
)
GPU_MEMORY_USAGE = _m(
    "hw.gpu.memory.usage",
    _G,
    "By",
    "GPU memory used (NVML)",
    Signal.gpu,
    _A,
    GPU,
    SemConv("a gauge: the conventions make it an up-down counter"),
)
GPU_MEMORY_LIMIT = _m(
    "hw.gpu.memory.limit",
    _G,
    "By",
    "GPU memory size (NVML)",
    Signal.gpu,
    _A,
    GPU,
    SemConv("a gauge: the conventions make it an up-down counter"),
)
GPU_POWER = _m("hw.power", _G, "W", "Power drawn by the GPU (NVML)", Signal.gpu, _A, GPU, CONVENTION)
GPU_TEMPERATURE = _m("memtrace.gpu.temperature", _G, "Cel", "GPU temperature (NVML)", Signal.gpu, _A, GPU)
GPU_LINK_WIDTH = _m("memtrace.gpu.pcie.link.width", _G, "{lane}", "PCIe link width now (lanes)", Signal.gpu, _A, GPU)
GPU_LINK_MAX_WIDTH = _m(
    "memtrace.gpu.pcie.link.max_width", _G, "{lane}", "PCIe link width the GPU and slot can do", Signal.gpu, _A, GPU
)
GPU_LINK_GENERATION = _m("memtrace.gpu.pcie.link.generation", _G, "1", "PCIe link generation now", Signal.gpu, _A, GPU)
GPU_LINK_MAX_GENERATION = _m(
    "memtrace.gpu.pcie.link.max_generation",
    _G,
    "1",
    "PCIe link generation the GPU and slot can do",
    Signal.gpu,
    _A,
    GPU,
)
GPU_PCIE_REPLAYS = _m(
    "memtrace.gpu.pcie.replays", _G, "{replay}", "PCIe replays since the agent started (NVML)", Signal.gpu, _A, GPU
)
GPU_THROTTLED = _m(
    "memtrace.gpu.throttled", _G, "1", "1 while power or thermal limits hold the clocks down", Signal.gpu, _A, GPU
)
GPU_LOST = _m("memtrace.gpu.lost", _G, "1", "1 while the GPU is off the bus", Signal.gpu, _A, GPU)
# No hw.gpu clock in the conventions: named as memtrace's other GPU gauges, in MHz as their hw.cpu.speed.
GPU_SM_CLOCK = _m("memtrace.gpu.sm.clock", _G, "MHz", "SM clock now (NVML)", Signal.gpu, _A, GPU)
GPU_MEMORY_CLOCK = _m("memtrace.gpu.memory.clock", _G, "MHz", "Memory clock now (NVML)", Signal.gpu, _A, GPU)
GPU_IO = _m(
    "hw.gpu.io",
    _S,
    "By",
    "Bytes the GPU received and transmitted over PCIe (the driver's byte counters)",
    Signal.gpu,
    _A,
    (*GPU, NETWORK_DIRECTION),
    CONVENTION,
)
GPU_GPM_SUPPORTED = _m(
    "memtrace.gpu.gpm.supported",
    _G,
    "1",
    "1: the GPU has GPM (Hopper and later) and its SM, tensor and DRAM activity are measured; 0: they are not",
    Signal.gpu,
    _A,
    GPU,
)
GPU_SM_ACTIVE = _m(
    "memtrace.gpu.sm.active",
    _G,
    "1",
    "Share of SMs busy over the last GPM interval (about 1 s): tells a starved GPU from a busy one",
    Signal.gpu,
    _A,
    GPU_OR_MIG,
)
GPU_SM_OCCUPANCY = _m(
    "memtrace.gpu.sm.occupancy",
    _G,
    "1",
    "Warps resident on the SMs, of the most they can hold, over the last GPM interval",
    Signal.gpu,
    _A,
    GPU_OR_MIG,
)
GPU_TENSOR_ACTIVE = _m(
    "memtrace.gpu.tensor.active",
    _G,
    "1",
    "Share of SM cycles with any tensor pipe busy over the last GPM interval",
    Signal.gpu,
    _A,
    GPU_OR_MIG,
)
GPU_DRAM_ACTIVE = _m(
    "memtrace.gpu.dram.active",
    _G,
    "1",
    "DRAM bandwidth used, of its peak, over the last GPM interval",
    Signal.gpu,
    _A,
    GPU_OR_MIG,
)
GPU_NVLINK_IO = _m(
    "memtrace.gpu.nvlink.io",
    _S,
    "By",
    "Payload bytes the GPU sent and received over each NVLink (the driver's counters)",
    Signal.gpu,
    _A,
    (*GPU, NVLINK, NETWORK_DIRECTION),
)
GPU_NVLINK_ERRORS = _m(
    "memtrace.gpu.nvlink.errors",
    _S,
    "{error}",
    "NVLink CRC errors, replays and recoveries, per link (the driver's counters)",
    Signal.gpu,
    _A,
    (*GPU, NVLINK, NVLINK_ERROR),
)
GPU_NVLINK_UP = _m(
    "memtrace.gpu.nvlink.up",
    _G,
    "1",
    "1 while the NVLink is active, 0 while it is down",
    Signal.gpu,
    _A,
    (*GPU, NVLINK),
)
GPU_REMAPPED_ROWS = _m(
    "memtrace.gpu.memory.remapped_rows",
    _G,
    "{row}",
    "HBM rows remapped over the GPU's life; any for uncorrectable errors: drain the node and reset the GPU",
    Signal.gpu,
    _A,
    (*GPU, REMAP_CAUSE),
)
GPU_REMAP_PENDING = _m(
    "memtrace.gpu.memory.remap_pending",
    _G,
    "1",
    "1 while a row remapping waits for a GPU reset",
    Signal.gpu,
    _A,
    GPU,
)
GPU_REMAP_FAILED = _m(
    "memtrace.gpu.memory.remap_failed",
    _G,
    "1",
    "1 once a row remapping has failed (no spare rows left: replace the GPU)",
    Signal.gpu,
    _A,
    GPU,
)
GPU_MIG_MEMORY_USAGE = _m(
    "memtrace.gpu.mig.memory.usage", _G, "By", "Memory used on the MIG instance", Signal.gpu, _A, (*GPU, MIG_ID)
)
GPU_MIG_MEMORY_LIMIT = _m(
    "memtrace.gpu.mig.memory.limit", _G, "By", "Memory size of the MIG instance", Signal.gpu, _A, (*GPU, MIG_ID)
)
POD_MEMORY_IN_USE = _m(
    "memtrace.pod.gpu.memory.in_use",
    _G,
    "By",
    "gpu.memory.in_use summed over the pod's traced processes",
    Signal.memory,
    _A,
    (POD_UID,),
)
POD_MEMORY_NVML_USED = _m(
    "memtrace.pod.gpu.memory.nvml_used",
    _G,
    "By",
    "gpu.memory.nvml_used summed over the pod's traced processes (those NVML gives a figure for)",
    Signal.memory,
    _A,
    (POD_UID,),
)
POD_MEMORY_UNATTRIBUTED = _m(
    "memtrace.pod.gpu.memory.unattributed",
    _G,
    "By",
    "gpu.memory.unattributed summed over the pod's traced processes: device memory no probed allocation explains",
    Signal.memory,
    _A,
    (POD_UID,),
)

NETWORK_IO = _m(
    "system.network.io",
    _S,
    "By",
    "Bytes received and sent by the interface",
    Signal.network,
    _A,
    (*LINK, NETWORK_DIRECTION),
    CONVENTION,
)
NETWORK_PACKETS = _m(
    "system.network.packet.count",
    _S,
    "{packet}",
    "Packets received and sent by the interface",
    Signal.network,
    _A,
    (*LINK, NETWORK_DIRECTION),
    CONVENTION,
)
NETWORK_DROPPED = _m(
    "system.network.packet.dropped",
    _S,
    "{packet}",
    "Packets the interface dropped",
    Signal.network,
    _A,
    (*LINK, NETWORK_DIRECTION),
    CONVENTION,
)
NETWORK_ERRORS = _m(
    "system.network.errors",
    _S,
    "{error}",
    "Receive and transmit errors of the interface",
    Signal.network,
    _A,
    (*LINK, NETWORK_DIRECTION),
    CONVENTION,
)
NETWORK_LINK_SPEED = _m(
    "memtrace.network.link.speed",
    _G,
    "bit/s",
    "Link speed the driver reports (absent: it does not say)",
    Signal.network,
    _A,
    LINK,
)
NETWORK_UTILIZATION = _m(
    "memtrace.network.utilization",
    _G,
    "1",
    "The busier direction's share of the link speed (or of its root shaper's rate, where lower) over the last "
    "sampling interval",
    Signal.network,
    _A,
    LINK,
)
QDISC_BYTES = _m("memtrace.qdisc.bytes", _S, "By", "Bytes the queueing discipline sent", Signal.network, _A, QDISC)
QDISC_DROPS = _m(
    "memtrace.qdisc.drops", _S, "{packet}", "Packets the queueing discipline dropped", Signal.network, _A, QDISC
)
QDISC_OVERLIMITS = _m(
    "memtrace.qdisc.overlimits",
    _S,
    "{event}",
    "Times the queueing discipline held a packet back for its rate (the link is saturated)",
    Signal.network,
    _A,
    QDISC,
)
QDISC_BACKLOG = _m(
    "memtrace.qdisc.backlog", _G, "By", "Bytes queued in the queueing discipline now", Signal.network, _A, QDISC
)

AGENT_EVENTS = _m("memtrace.agent.events", _S, "{event}", "Per-call events received from the kernel", Signal.agent, _A)
AGENT_DROPPED_EVENTS = _m(
    "memtrace.agent.dropped_events", _S, "{event}", "Events lost to a full ring (totals stay exact)", Signal.agent, _A
)
AGENT_ABANDONED_CALLS = _m(
    "memtrace.agent.abandoned_calls", _S, "{call}", "Calls whose thread exited before returning", Signal.agent, _A
)
AGENT_UNTRACKED_CALLS = _m(
    "memtrace.agent.untracked_calls",
    _S,
    "{call}",
    "Calls not measured because a kernel map was full",
    Signal.agent,
    _A,
)
AGENT_EXPORT_FAILURES = _m("memtrace.agent.export_failures", _S, "{push}", "Pushes that failed", Signal.agent, _A)
AGENT_UNSENT_PROCESSES = _m(
    "memtrace.agent.unsent_processes",
    _S,
    "{process}",
    "Exited processes dropped unsent during an outage (memory bound)",
    Signal.agent,
    _A,
)
AGENT_CPU_SWITCH_GAPS = _m(
    "memtrace.agent.cpu_switch_gaps",
    _S,
    "{gap}",
    "Times the kernel's sched tracepoints skipped a traced thread's switch (its CPU time stays exact)",
    Signal.agent,
    _A,
)
AGENT_LIBRARIES = _m(
    "memtrace.agent.libraries", _G, "{library}", "CUDA libraries and executables with probes", Signal.agent, _A
)
AGENT_PROCESSES = _m("memtrace.agent.processes", _G, "{process}", "CUDA processes traced now", Signal.agent, _A)
AGENT_DRAIN_GAP = _m(
    "memtrace.agent.drain_gap",
    _G,
    "s",
    "Worst interval between the starts of two ring drains since the previous export",
    Signal.agent,
    _A,
)


def _specs() -> Iterator[MetricSpec]:
    for value in list(globals().values()):
        if isinstance(value, MetricSpec):
            yield value


METRICS: tuple[MetricSpec, ...] = tuple(_specs())
BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


# ---- resources ----

PROCESS_RESOURCE = (
    Attribute("process.pid", "the process's id", semconv=True),
    Attribute(
        "process.creation.time",
        "its start, ISO 8601 in UTC to the nanosecond: a pid reused while memtrace runs is two resources, never one",
        semconv=True,
    ),
    Attribute(
        "process.executable.name",
        "the command name BPF took at the process's first event (/proc/PID/status's Name): the name the table, "
        "the JSON and the events say (`python3`, where the executable is python3.11)",
        semconv=True,
    ),
    Attribute(
        "process.executable.path",
        "its executable's path (/proc/PID/exe), where memtrace could read it before the process was gone",
        semconv=True,
    ),
    Attribute("container.id", "from the process's cgroup", semconv=True),
    Attribute("k8s.pod.uid", "from the process's cgroup", semconv=True),
    Attribute(
        "memtrace.job.id",
        "the job it belongs to, the same in every rank on every host, from its launcher's variables: "
        "TORCHELASTIC_RUN_ID, else SLURM_JOB_ID.SLURM_STEP_ID, else MASTER_ADDR:MASTER_PORT (a loopback "
        "address prefixed with the host's name); where no launcher named it, its NCCL communicator: "
        "`nccl-` and `memtrace.nccl.comm_id`; absent when neither did",
    ),
    Attribute(
        "memtrace.job.id.source",
        "where the process has an NCCL communicator, which named the job: `launcher` or `nccl`",
    ),
    Attribute(
        "memtrace.job.launcher",
        "whose variables said so: `torchelastic`, `slurm`, `rendezvous` (MASTER_ADDR), or where only a rank "
        "was given `torch`, `openmpi`, `mpich`, `kubernetes-indexed-job`; `nccl` where only its NCCL "
        "communicator said",
    ),
    Attribute(
        "memtrace.job.rank",
        "its rank: RANK, else OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, JOB_COMPLETION_INDEX",
    ),
    Attribute("memtrace.job.world_size", "the job's ranks: WORLD_SIZE or its launcher's equivalent"),
    Attribute("memtrace.job.local_rank", "its rank on its host: LOCAL_RANK or its launcher's equivalent"),
    Attribute(
        "memtrace.nccl.comm_id",
        "its NCCL communicator, read from the calls that made it: 16 hex digits of the 64-bit FNV-1a hash of "
        "the 128-byte ncclUniqueId given to ncclCommInitRank(Config), the same in every rank on every host; "
        "for ncclCommSplit, the parent's id continued with the color (32-bit little-endian); of a process's "
        "communicators, the one with the most ranks (the first made among equals)",
    ),
    Attribute(
        "memtrace.nccl.rank",
        "its rank in that communicator: ncclCommInitRank's argument, or for a split the answer of "
        "ncclCommUserRank where the process asked (absent: not known)",
    ),
    Attribute(
        "memtrace.nccl.nranks",
        "that communicator's ranks: ncclCommInitRank's argument, or ncclCommCount's answer for a split",
    ),
    Attribute("host.name", "the host's name", semconv=True),
    Attribute("k8s.node.name", "from NODE_NAME (the DaemonSet sets it)", semconv=True),
    Attribute("service.name", "memtrace", semconv=True),
)
AGENT_RESOURCE = (
    Attribute("service.name", "memtrace", semconv=True),
    Attribute("service.version", "memtrace's version", semconv=True),
    Attribute("host.name", "the host's name", semconv=True),
    Attribute("k8s.node.name", "from NODE_NAME", semconv=True),
)
RESOURCES_NOTE = (
    "Both also carry OTEL_RESOURCE_ATTRIBUTES. A counter series starts with a true zero at the process's "
    "start (or the agent's, if later), so a process shorter than one interval still shows a rate. The series "
    "of a process that exits are sent a final time and then dropped: cardinality stays bounded."
)


# ---- events (OTLP log records) ----


@dataclass(frozen=True)
class EventSpec:
    name: str
    severity: str
    body: str
    when: str
    attributes: tuple[Attribute, ...]


_PROCESS_OF_EVENT = (
    Attribute("process.pid", "the process's id", semconv=True),
    Attribute("process.creation.time", "its start (absent when unknown)", semconv=True),
    Attribute("process.executable.name", "its command name, as its resource says it", semconv=True),
)
_EVIDENCE = Attribute(
    "memtrace.evidence.*", "the evidence's numbers and words, one attribute each (nested evidence as JSON text)"
)

DIAGNOSIS_EVENT = EventSpec(
    "memtrace.diagnosis",
    "WARN",
    "the symptom",
    "when a slowdown is diagnosed; the record's time is the detection",
    (
        Attribute("memtrace.cause", "the cause, as memtrace.diagnoses counts it"),
        Attribute("memtrace.symptom", "the symptom, as the body says it"),
        Attribute("memtrace.ratio", "the symptom's size: step time over its baseline"),
        Attribute("memtrace.onset_time_unix_nano", "when the slowdown began"),
        Attribute("memtrace.fix", "what to do about it"),
        *_PROCESS_OF_EVENT,
        _EVIDENCE,
    ),
)
FINDING_EVENT = EventSpec(
    "memtrace.finding",
    "INFO",
    "the summary: the evidence in words, with its figures",
    "when a finding first appears in a process, and again when its text changes materially "
    "(its words or its fix change, its figures aside, or its headline number doubles or halves since its "
    "last record), a bounded number of times per finding and process (export/events.py, FindingNotes)",
    (
        Attribute("memtrace.finding", "the finding's code, as memtrace.finding's `finding` attribute names it"),
        Attribute("memtrace.value", "its headline number, as memtrace.finding's value"),
        Attribute("memtrace.fix", "what to do about it"),
        *_PROCESS_OF_EVENT,
        _EVIDENCE,
    ),
)
EVENTS = (DIAGNOSIS_EVENT, FINDING_EVENT)


# ---- profiles (`push --stacks`) ----


@dataclass(frozen=True)
class SampleType:
    name: str
    unit: str
    description: str


PROFILE_COPIES = SampleType("copies", "count", "copy calls at the call site since the last push that arrived")
PROFILE_COPY_BYTES = SampleType("copy_bytes", "bytes", "their bytes")
PROFILE_ALLOCATIONS = SampleType(
    "allocations", "count", "allocations at the call site since the last push that arrived"
)
PROFILE_ALLOCATED_BYTES = SampleType("allocated_bytes", "bytes", "their bytes")
PROFILE_IN_USE = SampleType("in_use_bytes", "bytes", "bytes allocated there and not freed, now")
SAMPLE_TYPES = (PROFILE_COPIES, PROFILE_COPY_BYTES, PROFILE_ALLOCATIONS, PROFILE_ALLOCATED_BYTES, PROFILE_IN_USE)
PROFILE_API = Attribute("memtrace.api", "the CUDA function called")
PROFILE_DIRECTION = Attribute("memtrace.direction", "the copy's direction (copies)")
PROFILE_HOST_MEMORY = Attribute("memtrace.host_memory", "the host memory it touched (where known)")
PROFILE_ATTRIBUTES = (PROFILE_API, PROFILE_DIRECTION, PROFILE_HOST_MEMORY)


# ---- Prometheus names ----

_UNIT_WORDS = {"By": "bytes", "s": "seconds", "W": "watts", "Cel": "celsius"}
_PER_UNIT_WORDS = {"s": "second"}


def prometheus_name(m: MetricSpec) -> str:
    """The name a Prometheus-compatible backend shows (OpenTelemetry's
    translation, as VictoriaMetrics' -opentelemetry.usePrometheusNaming and the
    collector's Prometheus exporters make it): dots to underscores, the unit's
    word (none for {annotations}; `ratio` for a gauge of unit 1; a/b as
    a_per_b), `_total` for a counter. A histogram adds `_bucket`, `_sum` and
    `_count`. tests/test_push.py checks them against VictoriaMetrics."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", m.name)
    main, _, per = m.unit.partition("/")
    if m.unit == "1":
        word = "ratio" if m.kind == Kind.gauge else ""
    else:
        word = "" if main.startswith("{") else _UNIT_WORDS.get(main, main)
        word += "_per_" + _PER_UNIT_WORDS.get(per, per) if per else ""
    if word and not name.endswith("_" + word):
        name += "_" + word
    if m.kind == Kind.sum:
        name += "_total"
    return name


def prometheus_series(m: MetricSpec) -> tuple[str, ...]:
    base = prometheus_name(m)
    if m.kind == Kind.histogram:
        return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
    return (base,)


# ---- the reference ----


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _semconv(m: MetricSpec) -> str:
    if m.semconv is None:
        return ""
    return " Semantic convention" + (f" ({m.semconv.differs})." if m.semconv.differs else ".")


def reference() -> str:
    """docs/metrics.md: a table per signal, then the resources, the events and the profiles."""
    out = [
        "# Metric reference",
        "",
        "<!-- Generated from memtrace/export/catalog.py by `python -m memtrace.export.catalog --write "
        "docs/metrics.md`; tests/test_rules.py fails when this file differs. Do not edit by hand. -->",
        "",
        "Everything `memtrace push` sends over OTLP: metrics (below, by signal), events as OTLP log",
        "records, and call sites as OTLP profiles with `--stacks`. Names are OTLP names; the Prometheus",
        "name is what a Prometheus-compatible backend shows after OpenTelemetry's usual translation",
        "(VictoriaMetrics with `-opentelemetry.usePrometheusNaming`, or the collector's Prometheus",
        "exporters); a histogram shows as its `_bucket`, `_sum` and `_count` series.",
        "",
        "Kinds: `sum` is a monotonic counter (cumulative by default, `--temporality delta` on request),",
        "`gauge` a reading, `histogram` a base-2 exponential histogram built from each event's exact",
        "value (`--histogram explicit`: fixed buckets at powers of two, exact as well). Where a metric",
        "follows an OpenTelemetry semantic convention its description says so, and what differs;",
        "attributes whose names are conventions are marked (semconv).",
        "",
    ]
    for signal in Signal:
        specs = [m for m in METRICS if m.signal == signal]
        on = {m.on for m in specs}
        where = "the agent's resource" if on == {On.agent} else "each process's resource"
        out += [f"## {signal.value}", "", f"From {SIGNAL_SOURCES[signal]}; on {where}.", ""]
        out += ["| metric | kind | unit | attributes | description | Prometheus name |", "|---|---|---|---|---|---|"]
        legend: dict[str, Attribute] = {}
        for m in specs:
            out.append(
                f"| `{m.name}` | {m.kind.value} | `{m.unit}` | {', '.join(f'`{a.name}`' for a in m.attributes)} | "
                f"{_cell(m.description)}.{_semconv(m)} | `{prometheus_name(m)}` |"
            )
            legend.update((a.name, a) for a in m.attributes)
        if legend:
            out += ["", "Attributes:", ""]
            out += [f"- `{a.name}`" + (" (semconv)" if a.semconv else "") + f": {a.meaning}" for a in legend.values()]
        out.append("")
    out += ["## Resources", ""]
    resources: tuple[tuple[str, tuple[Attribute, ...]], ...] = (
        ("Each traced process is one resource", PROCESS_RESOURCE),
        ("The agent's own series (its health, GPUs, interfaces) are on one resource", AGENT_RESOURCE),
    )
    for title, attrs in resources:
        out += [f"{title}:", "", "| attribute | meaning |", "|---|---|"]
        out += [f"| `{a.name}` (semconv) | {_cell(a.meaning)} |" for a in attrs]
        out.append("")
    out += [RESOURCES_NOTE, ""]
    out += [
        "## Events",
        "",
        "OTLP log records with an event name, on the agent's resource, sent to the collector's logs",
        "pipeline beside the metrics (OTLP/HTTP: `/v1/logs`). Text with live figures goes here, never",
        "into a metric's attributes: every change of a figure would make a new series.",
        "",
    ]
    for e in EVENTS:
        out += [
            f"### `{e.name}`",
            "",
            f"Severity {e.severity}; the body is {e.body}; sent {e.when}.",
            "",
            "| attribute | meaning |",
            "|---|---|",
        ]
        out += [
            f"| `{a.name}`" + (" (semconv)" if a.semconv else "") + f" | {_cell(a.meaning)} |" for a in e.attributes
        ]
        out.append("")
    out += [
        "## Profiles (`push --stacks`)",
        "",
        "OTLP profiles (`profiles/v1development`, OTLP/HTTP: `/v1development/profiles`), one resource per",
        "process as its metrics have it, one profile per sample type. A sample is a call site: its stack",
        "(the CUDA call, then its callers) and these attributes.",
        "",
        "| sample type | unit | what |",
        "|---|---|---|",
    ]
    out += [f"| `{t.name}` | {t.unit} | {_cell(t.description)} |" for t in SAMPLE_TYPES]
    out += ["", "| attribute | meaning |", "|---|---|"]
    out += [f"| `{a.name}` | {_cell(a.meaning)} |" for a in PROFILE_ATTRIBUTES]
    out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 2:
        with open(argv[1], "w") as f:
            f.write(reference())
        return 0
    if argv:
        print("usage: python -m memtrace.export.catalog [--write PATH]", file=sys.stderr)
        return 2
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
