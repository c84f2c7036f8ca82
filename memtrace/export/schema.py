"""The JSON summary (`memtrace run --format json`), typed: one class per
section and per row, each field's meaning said once, here.

Every builder of the document (export/report.py for the CUDA sections,
export/host.py for `host` and `collectives`, export/callsites.py for
`stacks`) returns these classes, so mypy --strict checks each row it makes
against its class: a misspelt, missing or extra key fails the check.
docs/json.md is rendered from this module (export/schemadoc.py), and a test
runs a real `memtrace run` and holds its output to these classes both ways.

Layout: `Summary` is the document; the classes above it are its parts,
leaves first (so the module reads bottom-up). A field is
`Annotated[type, "what it means"]`; `NotRequired[...]` is a field that is
present only where its description says. A class's docstring describes its
section as a whole and is its section's prose in docs/json.md.

SCHEMA_VERSION changes only when a field changes meaning; a new field adds
to version 1.
"""

# No `from __future__ import annotations` here: TypedDict's NotRequired
# keys are only told at runtime (docs/json.md, the conformance test) when
# the annotations are real objects, not strings.

from typing import Annotated, Any

from typing_extensions import NotRequired, TypedDict

SCHEMA_VERSION = 1

# ---- shared by every per-process row ----

_PID = "the process id (the host's tgid)"
_START = (
    "when the process started, wall-clock ns since the Unix epoch (the kernel's start time of its "
    "thread group leader; 0: unknown). With `pid` it names one process: pids are reused, start times are not"
)
_PROCESS = "the command name, taken in BPF at the process's first event"


# ---- memcpy ----


class CopyDurations(TypedDict):
    """A copy row's call durations, in seconds."""

    p50: Annotated[float, "median"]
    p95: Annotated[float, "95th percentile"]
    p99: Annotated[float, "99th percentile"]
    max: Annotated[float, "the longest call (0 with no timed call)"]
    sum: Annotated[float, "every call's duration added up"]


class CopyRow(TypedDict):
    """One row per (process, api, direction, host_memory): every CUDA copy
    of the run. Calls whose event the ring could not take are counted by
    the kernel and added here with host memory `unknown`, so the totals are
    exact.

    Directions: `default` is a copy whose direction the API leaves to
    unified addressing (`cudaMemcpyDefault`, `cuMemcpy`, `cuMemcpyAsync`, a
    unified descriptor side) and that memtrace could not resolve from the
    pointers (managed memory, or a process it joined late); `unknown` is a
    kind value outside `cudaMemcpyKind`."""

    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, _PROCESS]
    layer: Annotated[str, "`runtime` or `driver`: the CUDA library whose call this is"]
    api: Annotated[str, "the API called; its `_ptds`/`_ptsz` variants are folded in"]
    direction: Annotated[
        str, "`h2d`, `d2h`, `d2d`, `h2h`, `peer`, `default` or `unknown` (unified copies resolved where they can be)"
    ]
    host_memory: Annotated[
        str | None,
        "`pinned`, `pageable`, `managed` or `unknown`; null when the copy touches no host memory (d2d, peer)",
    ]
    synchronous: Annotated[bool, "false: the call returns once the copy is queued, its duration is the enqueue time"]
    calls: Annotated[int, "calls made"]
    bytes: Annotated[int, "bytes those calls copied, exactly"]
    errors: Annotated[int, "calls that returned an error"]
    duration_seconds: Annotated[CopyDurations, "the calls' durations"]
    bandwidth_bytes_per_second: Annotated[
        float | None, "bytes over the calls' summed durations; null when no time was measured"
    ]


class DirectionTotals(TypedDict):
    """Every process's copies in one direction, added up."""

    calls: Annotated[int, "calls made"]
    bytes: Annotated[int, "bytes copied"]
    errors: Annotated[int, "calls that returned an error"]


# ---- device_memory ----


class SizeQuantiles(TypedDict):
    """The sizes of a process's device allocations, in bytes."""

    p50: Annotated[float, "median allocation size"]
    max: Annotated[float, "the largest allocation (0 with none)"]


class DeviceMemoryRow(TypedDict):
    """One row per process that allocated, freed or pinned memory, or that NVML lists on a GPU."""

    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, _PROCESS]
    allocations: Annotated[int, "device allocations that succeeded"]
    allocated_bytes: Annotated[int, "their bytes"]
    frees: Annotated[int, "frees of allocations memtrace saw"]
    freed_bytes: Annotated[int, "their bytes"]
    unknown_frees: Annotated[int, "frees of addresses never seen allocated (not subtracted)"]
    failed_allocations: Annotated[int, "allocation calls that returned an error"]
    in_use_bytes: Annotated[int, "allocated and not freed, now"]
    peak_bytes: Annotated[int, "the most in use at once"]
    outstanding: Annotated[int, "allocations not freed; at exit, the leak"]
    exited: Annotated[bool, "the process has exited"]
    allocation_size_bytes: Annotated[SizeQuantiles, "the sizes of its allocations"]
    pinned_host_bytes: Annotated[int, "page-locked host memory allocated or registered now"]
    lost_calls: Annotated[int, "memory calls whose event was lost (its address book may be incomplete)"]
    traced_from_start: Annotated[
        bool,
        "true: traced from its first CUDA call (run's command and its children, a process held as it "
        "mapped CUDA): its unknown_frees were of addresses never allocated, or freed twice; false: "
        "attached to while it ran, they may be of memory allocated before",
    ]
    nvml_used_bytes: Annotated[
        int | None,
        "what NVML counts for it (usedGpuMemory) over its GPUs at their last sample: its CUDA context, "
        "memory its allocator holds, memory allocated through calls memtrace does not probe (null: NVML "
        "does not list it, or cannot say)",
    ]
    unattributed_bytes: Annotated[
        int | None,
        "nvml_used_bytes less in_use_bytes: what no probed allocation explains, mostly the CUDA context "
        "(below zero for a moment: NVML's figure is up to a sample old; null: no NVML figure)",
    ]


class PodMemoryRow(TypedDict):
    """A Kubernetes pod's device memory: its traced processes' (`device_memory` rows with its
    `pod_uid`), summed. A process NVML gives no figure for counts in `in_use_bytes` only."""

    pod_uid: Annotated[str, "the pod (k8s.pod.uid, from its processes' cgroups)"]
    pids: Annotated[list[int], "its processes that allocated device memory or that NVML lists"]
    in_use_bytes: Annotated[int, "allocated through the probed calls and not freed, now"]
    nvml_used_bytes: Annotated[int | None, "what NVML counts for them (null: it gave no figure for any)"]
    unattributed_bytes: Annotated[int | None, "the sum of its processes' unattributed_bytes"]


# ---- synchronization ----


class WaitDurations(TypedDict):
    """A wait row's call durations, in seconds."""

    p50: Annotated[float, "median"]
    p99: Annotated[float, "99th percentile"]
    max: Annotated[float, "the longest wait (0 with no timed call)"]
    sum: Annotated[float, "every wait's duration added up"]


class SyncRow(TypedDict):
    """One row per (process, api): the host waiting for the GPU."""

    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, _PROCESS]
    layer: Annotated[str, "`runtime` or `driver`"]
    api: Annotated[str, "the API called"]
    kind: Annotated[str, "what it waits for: `stream`, `device` or `event` (`other` for an API memtrace does not know)"]
    calls: Annotated[int, "calls made"]
    errors: Annotated[int, "calls that returned an error"]
    duration_seconds: Annotated[WaitDurations, "the waits' durations"]
    share_of_wall_time: Annotated[
        float | None,
        "all of the process's waits (every api) over the wall time memtrace watched it; null when not known",
    ]


# ---- launches ----


class LaunchRow(TypedDict):
    """One row per (process, api): kernel and graph launches, counted in the kernel."""

    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, _PROCESS]
    api: Annotated[str, "the API called"]
    kind: Annotated[str, "`kernel` or `graph`"]
    launches: Annotated[int, "launches made"]
    estimated: Annotated[
        bool,
        "true: the overhead budget sampled its launch probes; counted in their windows and extrapolated "
        "between them (per exact call, else per second)",
    ]
    partial: Annotated[
        bool,
        "true: it had launch probes of its own only after it may have launched (a child forked from a "
        "process that had mapped libcuda): a floor",
    ]
    error: NotRequired[
        Annotated[
            float | None,
            "estimated only: how far `launches` may be from the truth, relative (a 95% interval of the "
            "windows' mean rate by Student's t, and the trap cost's part); null: it cannot be bounded (a gap "
            "seen by one window only, as in a job that ended before its second window)",
        ]
    ]


# ---- overhead ----


class OverheadRow(TypedDict):
    """What memtrace's probes cost each process that took a trap
    (estimated: the kernel's trap counts times this host's calibrated trap
    cost), beside the budget. Empty when the cost was not measured."""

    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, _PROCESS]
    traps: Annotated[
        int,
        "traps counted by the kernel: launches 1 each; copies, memory calls and waits 2 each, a runtime "
        "call's own driver call included (4 for cudaMemcpyAsync); while `run --timeline` records, a "
        "probed launch's return 1 more (its slice's record)",
    ]
    launch_traps: Annotated[int, "the launches among them"]
    estimated_seconds: Annotated[
        float,
        "launch traps x trap_seconds + the other traps x pair_seconds / 2, at most cpu_seconds "
        "(the traps are part of it)",
    ]
    cpu_seconds: Annotated[
        float | None, "the process's CPU time: the kernel's at its exit, /proc while it runs; null: not read"
    ]
    cpu_final: Annotated[bool, "true: cpu_seconds was read at its exit"]
    share_of_cpu: Annotated[float | None, "estimated_seconds / cpu_seconds (null: CPU time unknown)"]
    trap_seconds: Annotated[
        float, "this host's cost of an entry probe, timed at start (or kept from the last hour, /run/memtrace)"
    ]
    pair_seconds: Annotated[float, "and of an entry and a return probe"]
    trap_entry_kind: Annotated[
        str,
        'the entry kind(s) those were timed at: "emulated" (a push, CUDA\'s), "stepped", or both '
        '("emulated+stepped": launches at one, the rest at the other)',
    ]
    calibrated: Annotated[bool, "false: not timed here, a fallback figure"]
    bounded: Annotated[
        bool,
        "true: the traps at that figure came to more than cpu_seconds (a figure timed on a busier host): "
        "estimated_seconds is capped",
    ]
    estimated: Annotated[bool, "always true: these figures are estimates"]
    budget: Annotated[float | None, "--overhead-budget / MEMTRACE_OVERHEAD_BUDGET, a share of CPU time (null: off)"]
    over_budget: Annotated[
        bool,
        "share_of_cpu > budget; the finding overhead_budget_exceeded follows once the process has used 0.1 s of CPU",
    ]
    launch_duty: Annotated[
        float | None,
        "the share of the time its launch probes were attached at the end (null: always; its launches are exact)",
    ]


# ---- steps ----


class StepDurations(TypedDict):
    """The steps' durations, in seconds."""

    p50: Annotated[float, "median"]
    p95: Annotated[float, "95th percentile"]
    p99: Annotated[float, "99th percentile"]
    max: Annotated[float, "the longest step"]


class StepBreakdown(TypedDict):
    """Where the stepping thread's step time went: shares of it, adding up to 1."""

    copy: Annotated[float, "inside copy calls"]
    sync_wait: Annotated[float, "inside waits: the host waited for the GPU"]
    collective: Annotated[float, "inside collectives (NCCL calls, the enqueue)"]
    host: Annotated[float, "the rest: the host's own work (on CPU, in the run queue or off CPU)"]


class StepRow(TypedDict):
    """Iterations inferred with no code change: one row per process with
    steps, of its stepping thread (the one with the most). No row: no
    steps found.

    A step boundary is the return of the wait (stream or device
    synchronisation, or synchronous copy; by api and stream or direction)
    that recurs most often at a regular cadence on a thread, so N
    iterations make N - 1 steps (the time before the first wait is setup).
    An extra wait every K steps on another symbol (a checkpoint, an eval)
    is time inside a step; one on the same stream closes no step when it
    falls less than half a step from a boundary. A process without a
    regular wait (a one-shot script) has no row. `gpu_idle_share` runs
    from each wait's return to the thread's next copy, wait or launch:
    launches are counted in the kernel, not sent as events, but the launch
    probe keeps the time of each thread's first launch since its last
    wait, and the next wait carries it. (Two threads whose ids share a
    slot of that table at once fall back to the next copy or wait entry,
    an upper bound.) A step with no regular wait of its own thread (JAX's
    transfers come from a pool of threads) has no row. Design and limits:
    `memtrace/model/steps.py`."""

    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, _PROCESS]
    tid: Annotated[int, "the thread whose steps these are (the one with the most)"]
    steps: Annotated[int, "intervals between returns of the loop's periodic wait"]
    duration_seconds: Annotated[StepDurations, "the steps' durations"]
    breakdown: Annotated[StepBreakdown, "shares of the thread's step time"]
    gpu_idle_share: Annotated[
        float, "from a wait's return to the next copy, wait or launch, over the step time: the GPU waiting for the host"
    ]
    loop: Annotated[
        str,
        "training: each step reads back the same few bytes (its loss); serving: a server's iterations, each "
        "reading back what its batch made (varying amounts), or replying to what it copied in after idling "
        "for requests. A server's `steps` are its iterations, judged per unit of work (docs/steps.md)",
    ]
    bytes_in: Annotated[int, "H2D bytes copied in the steps (a server: the requests' inputs)"]
    bytes_out: Annotated[int, "D2H bytes read back in the steps (a server: its replies)"]


# ---- collectives ----


class CollectiveRow(TypedDict):
    """NCCL calls per process and collective (the NCCL sensor).

    Collectives are counted from the first: a process that maps libnccl is
    stopped at the mapping, as for the CUDA libraries, until the NCCL
    probes are in. A library memtrace could not catch that way (already
    loaded when the agent started, or mapped by a terminal's foreground
    job, which is never stopped) is attached when a sample finds it
    mapped: calls made before that are not seen, and those rows say
    `"counted_from": "attach"`.

    The wait after a collective: NCCL returns once the work is queued on
    its stream, and the rank pays at its next synchronisation on that
    stream (or a device-wide or event wait). Each such wait is charged to
    the last collective issued on the waited stream before the wait began
    (a grouped call is issued at its outermost `ncclGroupEnd`), each
    collective at most once (`memtrace/model/collectives.py`). A wait is
    judged once the NCCL sensor's poll has seen every collective that
    returned before the wait began, so the attribution does not depend on
    which sensor was read first. On the ranks of one job, the straggler's
    waits are short and everyone else's long: `wait_seconds` here,
    `memtrace.nccl.wait_time` in OTLP. Waits of two threads of one process
    that overlap may be judged out of order."""

    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    collective: Annotated[
        str, "`all_reduce`, `all_gather`, `reduce_scatter`, `broadcast`, `reduce`, `send`, `recv` or `all_to_all`"
    ]
    calls: Annotated[int, "calls made"]
    bytes: Annotated[int, "count x the datatype's size, of the successful calls"]
    bytes_unknown_calls: Annotated[int, "calls with a datatype NCCL does not define: their bytes are not known"]
    errors: Annotated[int, "calls that returned an error"]
    seconds: Annotated[float, "time inside the calls (the enqueue; the wait is in the next synchronisation)"]
    counted_from: Annotated[
        str, '"start": every call was seen; "attach": libnccl was found already loaded, calls before then not seen'
    ]
    attached_time_unix_nano: NotRequired[
        Annotated[int, 'with "attach" only: when memtrace attached to libnccl, wall-clock ns since the Unix epoch']
    ]
    waits_attributed: Annotated[int, "synchronisations that then waited for this collective's work"]
    wait_seconds: Annotated[float, "their time: long on the ranks that wait for a straggler"]


# ---- host ----


class SensorState(TypedDict):
    """One host sensor: on, or off with the reason and the fix. A sensor
    that cannot run on this host is off, and its section is empty, not zero."""

    state: Annotated[str, "`on` or `off`"]
    reason: NotRequired[Annotated[str, "off only: why, in words"]]
    fix: NotRequired[Annotated[str, "off only: what to do about it"]]


class Latency(TypedDict):
    """A log2 histogram's count and quantiles, interpolated inside its slots, in microseconds."""

    count: Annotated[int, "intervals measured"]
    p50: Annotated[float, "median"]
    p99: Annotated[float, "99th percentile"]


class CpuQuota(TypedDict):
    """The CPU quota (cgroup cpu.max) over the process, since memtrace first read it."""

    cgroup: Annotated[str, "the cgroup read: the nearest with a quota, from the process's own up (else its own)"]
    throttled_seconds: Annotated[float, "time the cgroup was throttled"]
    throttled_periods: Annotated[int, "quota periods in which it was throttled"]


class Preemptor(TypedDict):
    """Who took the CPU from the process: one cgroup, by preempting it or by holding the CPU while
    the process, woken, waited for it."""

    cgroup_id: Annotated[int, "the cgroup (v2 id); 0: nobody, the CPU idled (the process's own quota throttled it)"]
    cgroup: Annotated[str | None, "its path (null: not known)"]
    switches: Annotated[int, "involuntary switches of the process in its favour"]
    run_queue_seconds: Annotated[
        float,
        "the process's run-queue wait that followed them, and after its wakeups while that cgroup's task"
        " held the CPU (the task that ran last before it: another process's)",
    ]
    pid: Annotated[
        int,
        "the user process of that cgroup the traced threads waited on longest (a majority vote weighted by time:"
        " one taking over is named once 20 ms ahead; a kernel thread only while no user process was seen; 0: idle)",
    ]
    process: Annotated[str, "that process's command name"]
    memtrace: Annotated[bool, "true: that process is memtrace itself (its own threads took the CPU)"]


class Placement(TypedDict):
    """One span of a process's run in one network namespace and one cgroup.
    A process that enters another namespace (`ip netns exec`, nsenter, a
    CNI plugin) or is moved to another cgroup (systemd-run --scope, a CPU
    manager) has one span per place, in order; its quota throttling and
    memory limit hits in each are those of the cgroup it was in then."""

    from_time_unix_nano: Annotated[
        int,
        "the first sample that found it there, wall-clock ns (the change came after the sample before it, "
        "at most one sampling interval earlier; the first span's: memtrace's first reading of it)",
    ]
    to_time_unix_nano: Annotated[int | None, "the next span's start (null: the last span, to the run's end)"]
    netns: Annotated[int | None, "its network namespace, by inode (null: not read, the network sensor off)"]
    cgroup: Annotated[
        str | None, "the cgroup its CPU is charged to: the v1 cpu hierarchy's on a host with one, else the v2 path"
    ]
    cgroup_id: Annotated[int, "that cgroup's v2 id (0: not known, or v1)"]
    process: Annotated[str, "its command name, as last read in this span (after an exec, the new program's)"]
    executable: Annotated[str, "its executable's path, likewise (empty: not read)"]
    cpu_quota_throttled_seconds: Annotated[float, "time the CPU quota over it throttled during this span"]
    memory_limit_hits: Annotated[int | None, "its memory cgroups' limit hits during this span (null: not read)"]


class CpuRow(TypedDict):
    """The CPU each traced process got, from the scheduler's tracepoints
    (`bpf/sched.bpf.c`): `run`'s command from its first instruction, every
    other process from its first CUDA call."""

    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, "the command name, as the CUDA model knows it (empty: a process it never met)"]
    on_cpu_seconds: Annotated[float, "time its threads ran"]
    off_cpu_seconds: Annotated[float, "time they were blocked"]
    run_queue_seconds: Annotated[float, "time they were runnable, waiting for a CPU"]
    stolen_seconds: Annotated[
        float, "time they held a CPU the hypervisor gave to another guest (steal: not in on_cpu_seconds)"
    ]
    run_queue_share: Annotated[float, "run_queue_seconds over on + off CPU + run queue"]
    run_queue_latency_us: Annotated[Latency | None, "each wait for a CPU (null: none)"]
    off_cpu_us: Annotated[Latency | None, "each blocked interval (null: none)"]
    voluntary_switches: Annotated[int, "its threads' voluntary context switches"]
    involuntary_switches: Annotated[int, "and involuntary ones (preempted)"]
    cgroup_id: Annotated[int, "its own cgroup (v2 id), as last seen at a switch"]
    cgroup: Annotated[str | None, "that cgroup's path (null: not known)"]
    cpu_quota: Annotated[CpuQuota | None, "the CPU quota over it (null: not read)"]
    preempted_by: Annotated[list[Preemptor], "who took the CPU from it, most run-queue wait first (the top 5)"]
    netns: Annotated[int | None, "the network namespace it was in at the last sample, by inode (null: not read)"]
    placements: Annotated[
        list[Placement], "where it was measured: a span per network namespace and cgroup it was in, oldest first"
    ]
    placements_dropped: Annotated[int, "spans left out between the first and the latest 15 (a process moved often)"]


class MeanMax(TypedDict):
    """The mean and the maximum of a reading over the samples that had it."""

    mean: Annotated[float, "mean"]
    max: Annotated[float, "maximum"]


class LinkWidth(TypedDict):
    """A PCIe link's generation and width."""

    generation: Annotated[int, "PCIe generation"]
    width: Annotated[int, "lanes"]


class PcieLink(TypedDict):
    """A GPU's PCIe link at the last detailed sample."""

    generation: Annotated[int | None, "its generation now"]
    width: Annotated[int | None, "its width now (lanes)"]
    max_generation: Annotated[int | None, "the most the GPU and its slot can do"]
    max_width: Annotated[int, "the widest it can be"]
    lowest_seen: Annotated[LinkWidth | None, "the narrowest it was during the run (null: never read)"]
    degraded_share: Annotated[float | None, "of the readings, those below its maximum while busy (null: none)"]


class GpuProcess(TypedDict):
    """A traced process on a GPU, as NVML lists it."""

    pid: Annotated[int, _PID]
    used_memory_bytes: Annotated[int | None, "GPU memory it used at its last sample (null: NVML could not say)"]
    mig_uuid: Annotated[str | None, "the MIG instance it ran on (null: the whole GPU)"]
    sm_percent: Annotated[
        MeanMax | None, "its share of the GPU's SMs (nvmlDeviceGetProcessUtilization; null: NVML gave none)"
    ]


class GpuActivity(TypedDict):
    """What the GPU's SMs and memory did, from NVML's GPU performance monitoring (GPM, Hopper and
    later), over the intervals between detailed samples (about a second each). Unlike
    `sm_utilization_percent` (a kernel ran at all), these tell a starved GPU from a busy one."""

    sm_active_percent: Annotated[MeanMax | None, "SMs busy, of all SMs"]
    sm_occupancy_percent: Annotated[MeanMax | None, "warps resident, of the most the SMs can hold"]
    tensor_active_percent: Annotated[MeanMax | None, "SM cycles with any tensor pipe busy"]
    dram_bandwidth_percent: Annotated[MeanMax | None, "DRAM bandwidth used, of its peak"]


class NvLinkRow(TypedDict):
    """One NVLink of a GPU over the run, from the driver's counters (`nvidia-smi nvlink -gt d`, `-e`)."""

    link: Annotated[int, "its number"]
    active: Annotated[bool, "up at the last detailed sample"]
    down_share: Annotated[float | None, "of the detailed samples, those in which it was down"]
    tx_bytes: Annotated[int | None, "payload bytes it sent over the run (null: not counted)"]
    rx_bytes: Annotated[int | None, "and received"]
    tx_bytes_per_second: Annotated[MeanMax | None, "sent per second, and the busiest interval"]
    rx_bytes_per_second: Annotated[MeanMax | None, "received per second"]
    crc_errors: Annotated[int | None, "CRC errors (flit and data) over the run"]
    replay_errors: Annotated[int | None, "replays over the run"]
    recovery_errors: Annotated[int | None, "link recoveries over the run"]
    counter_resets: Annotated[int, "times its byte counters went down (a driver reload): counted from zero"]


class RemappedRowsRow(TypedDict):
    """HBM row remapping at the last detailed sample (Ampere and later), over the GPU's life."""

    correctable: Annotated[int, "rows remapped for correctable errors"]
    uncorrectable: Annotated[int, "rows remapped for uncorrectable errors: drain the node and reset the GPU"]
    pending: Annotated[bool, "a remapping waits for the next GPU reset"]
    failed: Annotated[bool, "a remapping failed: no spare row was left (replace the GPU)"]


class MigInstanceRow(TypedDict):
    """A MIG instance of the GPU at the last detailed sample: its own device."""

    slot: Annotated[int, "its index among the GPU's MIG devices"]
    uuid: Annotated[str, "its UUID (MIG-...)"]
    gpu_instance_id: Annotated[int | None, "its GPU instance"]
    compute_instance_id: Annotated[int | None, "its compute instance"]
    memory_used_bytes: Annotated[int | None, "its memory in use"]
    memory_total_bytes: Annotated[int | None, "its memory in all"]
    pids: Annotated[list[int], "the processes on it"]
    memory_used_over_run: Annotated[MeanMax | None, "its memory in use over the detailed samples"]
    processes: Annotated[
        list[GpuProcess], "the traced processes seen on it during the run, with NVML's count of their memory there"
    ]
    activity: Annotated[
        GpuActivity | None,
        "its own SM, tensor and DRAM activity (nvmlGpmMigSampleGet by its GPU instance; null: its GPU has no GPM)",
    ]


class GpuRow(TypedDict):
    """One GPU as NVML gave it, sampled every --host-interval (the slow
    readings about every second, the fast ones by the fast sampler). A
    reading NVML could not give is null, and left out of the means and
    maxima.

    A GPU's PCIe traffic comes from the driver's byte counters (NVML's
    `NVML_FI_DEV_PCIE_COUNT_TX_BYTES` and `_RX_BYTES`, drivers 555 and
    later), exact between two samples, and only on older drivers from
    NVML's throughput estimate over a 20 ms window, which each call also
    blocks for: there one GPU is estimated per detailed sample (about a
    second), in turn, so that the sampling thread blocks 40 ms a second at
    most on a host of any size (`pcie_throughput_from` says which;
    `doctor` says it per host)."""

    index: Annotated[int, "NVML's index"]
    uuid: Annotated[str, "the GPU's UUID"]
    name: Annotated[str, "its product name"]
    bus_id: Annotated[str, "its PCI bus id"]
    samples: Annotated[int, "samples taken"]
    lost_samples: Annotated[int, "samples in which it had fallen off the bus"]
    sm_utilization_percent: Annotated[
        MeanMax | None, "SM utilisation, read at 10 Hz at most (null: NVML could not say)"
    ]
    memory_utilization_percent: Annotated[MeanMax | None, "memory controller utilisation"]
    sm_clock_mhz: Annotated[
        MeanMax | None, "SM clock (MHz) at each sample: low under load means throttling (null: NVML could not say)"
    ]
    memory_clock_mhz: Annotated[MeanMax | None, "memory clock (MHz) at each sample"]
    memory_used_bytes: Annotated[MeanMax | None, "GPU memory in use"]
    memory_total_bytes: Annotated[int | None, "GPU memory in all"]
    temperature_celsius: Annotated[MeanMax | None, "temperature"]
    power_watts: Annotated[MeanMax | None, "power draw"]
    pcie_throughput_from: Annotated[
        str | None,
        '"byte_counters": the driver\'s PCIe byte counters (driver 555 or later), exact; "20ms_samples": '
        "NVML's estimate over 20 ms (older drivers: one GPU a second, in turn); null: neither",
    ]
    pcie_tx_bytes_per_second: Annotated[
        MeanMax | None,
        "PCIe bytes sent by the GPU per second; from counters: bytes over seconds, and the busiest "
        "interval (about 1 s)",
    ]
    pcie_rx_bytes_per_second: Annotated[MeanMax | None, "and received"]
    pcie_tx_bytes: Annotated[int | None, "counters only: every byte the GPU sent over the run, traced or not"]
    pcie_rx_bytes: Annotated[int | None, "counters only: every byte it received"]
    pcie_counter_resets: Annotated[int, "times the counters went down (a driver reload): counted from zero again"]
    pcie_link: Annotated[PcieLink | None, "its PCIe link (null: not read)"]
    pcie_replays: Annotated[int | None, "PCIe replays over the run"]
    ecc_corrected_errors: Annotated[int | None, "corrected ECC errors over the run"]
    ecc_uncorrected_errors: Annotated[int | None, "uncorrected ECC errors over the run"]
    clock_event_reasons: Annotated[list[str], "every clock event reason seen: sw_power_cap, hw_thermal_slowdown, ..."]
    throttled_share: Annotated[
        float | None, "of the readings (at --host-rate), those with power or thermal throttling (null: none)"
    ]
    xids: Annotated[list[int], "XID errors raised during the run, in order"]
    processes: Annotated[list[GpuProcess], "the traced processes on this GPU"]
    gpm: Annotated[
        bool | None,
        "the GPU has GPM (Hopper and later): true, `activity` is measured; false: it is not (never zeros); "
        "null: not read",
    ]
    activity: Annotated[GpuActivity | None, "SM, tensor and DRAM activity (null: no GPM)"]
    nvlinks: Annotated[list[NvLinkRow], "its NVLinks (empty: none)"]
    remapped_rows: Annotated[RemappedRowsRow | None, "HBM row remapping (null: not supported or not read)"]
    mig_enabled: Annotated[bool | None, "MIG mode is on (null: MIG not supported)"]
    mig_instances: Annotated[list[MigInstanceRow], "its MIG instances at the last detailed sample"]


class NamespaceRow(TypedDict):
    """A network namespace memtrace sampled."""

    netns: Annotated[int, "its inode"]
    host_namespace: Annotated[bool, "memtrace's own namespace"]
    pids: Annotated[list[int], "the traced processes that live in it"]


class InterfaceRow(TypedDict):
    """A network interface, its kernel counters (IFLA_STATS64) over the run."""

    netns: Annotated[int, "its network namespace's inode"]
    host_namespace: Annotated[bool, "that is memtrace's own namespace"]
    interface: Annotated[str, "its name"]
    operstate: Annotated[str | None, "up, down, ... (null: not said)"]
    speed_bits_per_second: Annotated[int | None, "its speed (null: the driver does not say: lo, tunnels, a link down)"]
    shaped_bits_per_second: Annotated[
        int | None, "the rate its root shaper (a tbf qdisc) holds it to, utilization's base where lower (null: none)"
    ]
    rx_bytes: Annotated[int, "bytes received over the run"]
    tx_bytes: Annotated[int, "bytes sent"]
    rx_packets: Annotated[int, "packets received"]
    tx_packets: Annotated[int, "packets sent"]
    rx_errors: Annotated[int, "receive errors"]
    tx_errors: Annotated[int, "send errors"]
    rx_dropped: Annotated[int, "packets dropped on receive"]
    tx_dropped: Annotated[int, "packets dropped on send"]
    seconds: Annotated[float, "between its first and last samples"]
    rx_bytes_per_second: Annotated[float | None, "rx_bytes over seconds (null: one sample)"]
    tx_bytes_per_second: Annotated[float | None, "tx_bytes over seconds (null: one sample)"]
    peak_utilization: Annotated[
        float | None, "the busiest 1/--host-rate second's share of its speed or shaped rate (null: neither known)"
    ]
    peak_rx_bytes_per_second: Annotated[float | None, "that busiest tick's receive rate (null: no fast sampler)"]
    peak_tx_bytes_per_second: Annotated[float | None, "and its send rate"]
    counter_resets: Annotated[int, "times its counters went down (the interface was re-created)"]


class QdiscRow(TypedDict):
    """A queueing discipline, its kernel counters (TCA_STATS2) over the run."""

    netns: Annotated[int, "its network namespace's inode"]
    interface: Annotated[str, "the interface it queues for"]
    kind: Annotated[str, "mq, fq_codel, tbf, htb, ..."]
    handle: Annotated[str, "its handle, major:minor in hex"]
    root: Annotated[bool, "it is the interface's root qdisc"]
    bytes: Annotated[int, "bytes it sent over the run"]
    packets: Annotated[int, "packets it sent"]
    drops: Annotated[int, "packets it dropped"]
    overlimits: Annotated[int, "times it held a packet back for its rate (tbf, htb): the link is saturated"]
    requeues: Annotated[int, "packets requeued"]
    backlog_bytes: Annotated[int, "bytes queued at the last sample"]
    peak_backlog_bytes: Annotated[int, "the most queued at a sample"]


class Network(TypedDict):
    """The interfaces of memtrace's namespace and of the traced processes'
    (rtnetlink), from before the command starts to after it exits."""

    samples: Annotated[int, "samples taken"]
    namespaces: Annotated[list[NamespaceRow], "the namespaces sampled"]
    interfaces: Annotated[list[InterfaceRow], "their interfaces"]
    qdiscs: Annotated[list[QdiscRow], "their queueing disciplines"]
    errors: Annotated[list[str], "what could not be read (a namespace that went away), in words"]


class CpuSensorGaps(TypedDict):
    """What the CPU sensor could not keep or was never told."""

    switch_gaps: Annotated[
        int,
        "switches of traced threads the kernel's sched tracepoints never delivered (at least; from the threads' own "
        "counts): CPU time and switch counts stay exact, the waits across them join the totals only",
    ]
    processes_not_kept: Annotated[int, "processes its map had no room for"]
    threads_not_kept: Annotated[int, "threads its map had no room for"]
    preemptions_not_attributed: Annotated[int, "preemptions its map had no room for"]


class FastSampler(TypedDict):
    """The fast sampler: a C thread (`memtrace/native/fastsample.c`) that
    reads what is worth its resolution at --host-rate (each interface's
    counters, for the busiest tick's rates; each GPU's clock events and
    utilisation) and folds it until each sample takes it. While `push` or
    `top` traces no process (an idle node) it ticks at 20 Hz, watching the
    agent's rings, and reads the interfaces and GPUs at 2 Hz. Installed
    without a C compiler, memtrace reads those in Python at each sample
    instead: then it is off."""

    state: Annotated[str, "`on` or `off`"]
    reason: NotRequired[Annotated[str, "off only: why, in words"]]
    fix: NotRequired[Annotated[str, "off only: what to do about it"]]
    rate_hz: NotRequired[Annotated[float, "on, once it has ticked: its rate now"]]
    read_hz: NotRequired[Annotated[float, "on, once it has ticked: how often it reads interfaces and GPUs now"]]
    ticks: NotRequired[Annotated[int, "on, once it has ticked: ticks so far"]]
    late_ticks: NotRequired[Annotated[int, "ticks that came late and were skipped"]]
    net_errors: NotRequired[Annotated[int, "netlink reads that failed"]]
    interfaces_dropped: NotRequired[
        Annotated[int, "interface readings past its row limit (then every counter is read at the sample)"]
    ]
    cpu_seconds: NotRequired[Annotated[float, "its own CPU time"]]


class Host(TypedDict):
    """What the host did around the traced processes (`--no-host`: null;
    `--host-interval` sets the sampling period, `--host-rate` the fast
    sampler's). Every figure is a sensor's own reading or the difference
    of two of its cumulative counters, never an estimate. The CPU figures
    come from the scheduler's tracepoints for the command and every
    process that makes a CUDA call; network counters are the kernel's
    (IFLA_STATS64, TCA_STATS2 through rtnetlink); GPU readings are NVML's.
    What is cumulative or queued (the counters' totals, qdisc drops, XIDs)
    loses nothing at the sampling period."""

    sensors: Annotated[dict[str, SensorState], "each sensor by name: `cpu`, `gpu`, `network`, `nccl`"]
    cpu: Annotated[list[CpuRow], "per traced process"]
    gpus: Annotated[list[GpuRow], "per GPU, by index"]
    nvidia_driver: Annotated[str | None, "the NVIDIA driver's version (null: no driver)"]
    network: Annotated[Network, "the network interfaces"]
    processes_dropped: Annotated[int, "processes past the bound (4096), oldest first"]
    cpu_sensor: Annotated[CpuSensorGaps | None, "what the CPU sensor missed (null: it is off)"]
    sample_interval_seconds: Annotated[float, "--host-interval"]
    sample_errors: Annotated[int, "samples that failed (logged once)"]
    fast_sampler: Annotated[FastSampler, "the fast sampler"]


# ---- findings and diagnoses ----


class Finding(TypedDict):
    """A problem memtrace found in a process, with the evidence and the fix."""

    code: Annotated[
        str,
        "`pageable_h2d`, `sync_wait`, `device_memory_growth`, `overhead_budget_exceeded` or `gpu_memory_uncorrectable`",
    ]
    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, _PROCESS]
    value: Annotated[float, "the headline number: a share, or bytes"]
    summary: Annotated[str, "the evidence, in words (with --stacks: where the bytes came from)"]
    fix: Annotated[str, "what to change"]
    evidence: Annotated[
        dict[str, Any], "the figures behind it, by code (with --stacks: `sites`, the call sites that made most of it)"
    ]


class Diagnosis(TypedDict):
    """A slowdown that started during the run, and why (live: also in
    `top`; `push` sends each as an OTLP event).

    Every 0.5 s, each process's mean step time is compared with its
    baseline (the median of its last 20 normal windows); two windows in a
    row 1.2x over it are a slowdown, whose onset is the first of them. It
    ends after four windows back within 1.1x (no flapping, and a fault
    that comes back after that is a new diagnosis). The cause is the
    signal that moved most against the same windows' baseline, each
    against a margin: the run-queue share of the process's time (and who
    took the CPU, or its own quota), NVML's throttling and link width and
    replays, other processes' copy bytes while its own copy bandwidth fell
    (with, where the driver counts them, the PCIe bytes its GPU's link
    moved before and after, traced or not) or, where the driver counts
    them, while the link carried more than every traced copy, PSI memory
    stalls or its own memory cgroup newly reclaiming at its limit, the
    GPU's idle share while the host's own work grew, its network
    namespace's link utilisation and shaper drops, and collective waits
    against the job's other ranks (one job identity, or without one the
    processes of the same executable and the same parent). None past its
    margin: `unknown`, never a guess (the evidence names the closest,
    and every cause's score as `candidates`); two within 1.25x of each
    other: `ambiguous`, with both. A straggler is a job's cause, so it is
    named before a rank's own signals. A server (its step row's `loop`) is
    judged per unit of work: its iterations' busy time over what the same
    classes of work (bytes in and out) took before, so a load change is no
    slowdown (`docs/diagnosis.md`). Design: `memtrace/analysis/diagnosis.py`."""

    cause: Annotated[
        str,
        "`cpu_interference`, `nic_contention`, `pcie_contention`, `gpu_throttling`, `host_memory_pressure`, "
        "`input_starvation`, `straggler`, `nvlink_contention`, `ambiguous` (two fit: see `evidence.candidates`) "
        "or `unknown`",
    ]
    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, _PROCESS]
    symptom: Annotated[str, "what slowed, in words"]
    ratio: Annotated[float, "the step time over its baseline (a server: its busy time at equal work over its baseline)"]
    onset_time_unix_nano: Annotated[int, "the first slow window's start, wall-clock ns"]
    detected_time_unix_nano: Annotated[int, "the second slow window's end"]
    named_time_unix_nano: Annotated[int, "when the cause was named (a window or two later if re-named)"]
    evidence: Annotated[dict[str, Any], "the figures behind the cause, by cause"]
    fix: Annotated[str, "what to change"]


# ---- stacks (--stacks) ----


class Frame(TypedDict):
    """One frame of a call site's stack: a native frame (`module`,
    `function`, `offset`, `build_id`) or a Python frame (`function`,
    `file`, `line`)."""

    module: NotRequired[
        Annotated[str, "native: the file the frame lies in (`[unknown]`: no map held the address, then offset is it)"]
    ]
    function: Annotated[
        str | None, "the function (native: null where the file has no symbol for it; Python: its qualified name)"
    ]
    offset: NotRequired[Annotated[int, "native: the offset in the file"]]
    build_id: NotRequired[Annotated[str, "native, where the file has one: its GNU build id, hex"]]
    file: NotRequired[Annotated[str, "Python: the source file"]]
    line: NotRequired[Annotated[int | None, "Python: the line being executed (null: the line table has none)"]]


class CallSite(TypedDict):
    """With --stacks: copies and device allocations by the stack that made
    them, most bytes first. The copy sites add up to the copies seen as
    events: calls whose event the ring could not take are in `memcpy`
    (host memory `unknown`) but have no stack."""

    pid: Annotated[int, _PID]
    process: Annotated[str, _PROCESS]
    kind: Annotated[str, "`copy` or `alloc` (device allocations)"]
    api: Annotated[str, "the API called"]
    direction: Annotated[str | None, "a copy's direction (null for alloc)"]
    host_memory: Annotated[str | None, "a copy's host memory (null for alloc and where it touches none)"]
    calls: Annotated[int, "calls made there"]
    bytes: Annotated[int, "their bytes"]
    errors: Annotated[int, "calls that returned an error"]
    frames: Annotated[list[Frame], "innermost first: the CUDA call itself, then its callers"]
    python_frames: NotRequired[
        Annotated[
            str,
            "a Python process's sites only: `taken`, `truncated`, `not taken`, `no thread state`, `unnamed`, "
            "`fault` or `unsupported`",
        ]
    ]
    in_use_bytes: NotRequired[Annotated[int, "alloc only: what the site allocated and is still allocated"]]
    frames_missing: NotRequired[Annotated[str, 'only when frames is empty: "no stack taken" or "stack not kept"']]


# ---- agent ----


class LibraryRow(TypedDict):
    """A file memtrace attached probes to."""

    path: Annotated[str, "its path as the process mapped it"]
    layer: Annotated[str, "`runtime` or `driver`"]
    probes: Annotated[int, "symbols probed"]
    links: Annotated[
        int, "kernel links: one per program with multi-uprobes (Linux 6.6+), else one per probe and program"
    ]
    symbols: Annotated[list[str], "the symbols probed"]
    simulated: Annotated[bool, "memtrace's own test CUDA library (tests/fixtures), not CUDA's"]


class Drain(TypedDict):
    """How punctual the agent's drains of its rings were."""

    interval_seconds: Annotated[float, "the period drains are scheduled at (0: no drain thread ran)"]
    drains: Annotated[int, "drains started"]
    gap_max_seconds: Annotated[float, "the worst interval between the starts of two drains (less any put off)"]
    gap_p99_seconds: Annotated[float, "the 99th percentile of those intervals (to within 19%)"]
    folds_deferred: Annotated[int, "times the fold thread found the model busy (an export, a report) and waited"]
    reads_deferred: Annotated[
        int, "drains that left the events ring unread because the pending events reached their bound"
    ]
    pending_events_max: Annotated[int, "the most events ever waiting for the model at once"]


class StackCounts(TypedDict):
    """With --stacks: what became of the stacks asked for."""

    taken: Annotated[int, "stacks the kernel took"]
    not_taken: Annotated[int, "stacks it could not take"]
    not_kept: Annotated[int, "stacks taken but not kept (a table full, or gone before they were read)"]
    distinct: Annotated[int, "distinct stacks kept"]
    frames_unplaced: Annotated[int, "addresses no map of their process covered"]
    python_frames_unnamed: Annotated[int, "Python frames whose code object could not be read"]
    python_frames_walked: Annotated[int, "Python frames the kernel walked"]
    python_frame_reads: Annotated[int, "the kernel's reads of Python frames"]
    python_thread_reads: Annotated[int, "the kernel's reads of Python thread states"]
    python_unsupported: Annotated[dict[str, int], "interpreters not walked, by why: processes each"]


class Agent(TypedDict):
    """What the agent itself saw and did: its events, what it could not
    count, and the libraries it probed."""

    events: Annotated[int, "per-call events received (copies, memory calls, waits)"]
    dropped: Annotated[int, "events lost to a full ring (counted by the kernel; totals stay exact)"]
    calls_without_event: Annotated[int, "calls counted only by the kernel (equals dropped)"]
    abandoned_calls: Annotated[int, "calls whose thread exited before returning"]
    untracked_calls: Annotated[int, "calls not measured: a kernel map was full"]
    nested_driver_calls: Annotated[int, "driver calls (copies, memory calls, waits) folded into their runtime call"]
    nested_same_layer_calls: Annotated[int, "calls made inside a probed call of the same layer, folded into it"]
    unreturned_calls: Annotated[int, "calls whose return was never seen (probes attached mid-call): not counted"]
    batch_truncated_calls: Annotated[
        int, "batch copies of more than 1024 copies: the bytes past the 1024th are not counted"
    ]
    batch_array_copies: Annotated[int, "copies of 3D batches to or from a CUDA array: counted, their bytes not known"]
    launch_events: Annotated[int, "launch records queued for `run --timeline` (each a launch's slice, entry to return)"]
    launch_events_dropped: Annotated[
        int, "launch records lost to a full ring: the launches counted, their slices missing from the timeline"
    ]
    holds: Annotated[int, "processes held until their library was attached"]
    hold_missed: Annotated[int, "processes that ran on before their library's probes were in"]
    malformed_records: Annotated[int, "ring records of the wrong size or type, skipped"]
    collective_events_unmatched: Annotated[
        int, "NCCL events of a process with no CUDA call seen yet: no wait charged to them"
    ]
    collective_waits_dropped: Annotated[
        int, "waits or grouped calls past the attribution's bound (65,536 waiting): not charged"
    ]
    communicators_dropped: Annotated[
        int,
        "processes whose NCCL communicators were forgotten unnamed: made with no CUDA call seen, "
        "past 1,024 such processes waiting to be met",
    ]
    libraries: Annotated[list[LibraryRow], "the files probed"]
    drain: NotRequired[Annotated[Drain, "`run`: how punctual its drains were"]]
    stacks: NotRequired[Annotated[StackCounts, "--stacks only: what became of the stacks"]]


class Command(TypedDict):
    """What `run` traced: a command it started, or a running process (--pid)."""

    argv: NotRequired[Annotated[list[str], "the command, as given (not with --pid)"]]
    pid: NotRequired[Annotated[int, "--pid only: the process watched"]]
    exit_code: Annotated[int | None, "the command's exit status (null with --pid); 128 + N when signal N ended it"]
    wall_seconds: Annotated[float, "how long it ran, or was watched"]
    signal: NotRequired[Annotated[str, "the signal that ended the command (SIGINT, SIGKILL, SIGSEGV, ...), if one did"]]
    interrupted: NotRequired[
        Annotated[bool, "true when ^C or SIGTERM reached memtrace while the command ran, and was passed on to it"]
    ]


class Job(TypedDict):
    """The job a process belongs to and its rank in it, read once from the
    environment its launcher gave it (torchrun, Slurm, MPI, a rendezvous
    address, a Kubernetes Indexed Job): no change to the job. docs/metrics.md
    says which variable gives each field."""

    id: NotRequired[Annotated[str, "the job, the same in every rank on every host (absent: only a rank was given)"]]
    launcher: Annotated[
        str,
        "whose variables said so: `torchelastic`, `slurm`, `rendezvous` (MASTER_ADDR), or where only a rank "
        "was given `torch`, `openmpi`, `mpich`, `kubernetes-indexed-job`",
    ]
    rank: NotRequired[Annotated[int, "its rank"]]
    world_size: NotRequired[Annotated[int, "the job's ranks"]]
    local_rank: NotRequired[Annotated[int, "its rank on its host"]]
    source: NotRequired[
        Annotated[
            str,
            "where the process has an NCCL communicator, which named the job: `launcher` (its variables) or "
            "`nccl` (no launcher named it: the communicator did, and `launcher` is `nccl` where none gave a rank)",
        ]
    ]


class NcclIdentity(TypedDict):
    """The NCCL communicator a process is in, read from the calls that made
    it (no change to the job): of its communicators, the one with the most
    ranks. docs/metrics.md says how the id is made."""

    comm_id: Annotated[str, "the communicator: 16 hex digits, the same in every rank on every host"]
    rank: NotRequired[Annotated[int, "its rank in it (absent: not known, a split NCCL was never asked about)"]]
    nranks: NotRequired[Annotated[int, "its ranks"]]


class ProcessRow(TypedDict):
    """One row per process memtrace met: who it is, where it runs, and,
    where a launcher said so, its job and rank."""

    pid: Annotated[int, _PID]
    start_time_unix_nano: Annotated[int, _START]
    process: Annotated[str, _PROCESS]
    executable: Annotated[str, "its executable's path, read when memtrace met it (empty: gone first)"]
    container_id: Annotated[str | None, "from its cgroup (null: not in a container)"]
    pod_uid: Annotated[str | None, "its Kubernetes pod, from its cgroup (null: none)"]
    job: Annotated[Job | None, "its job and rank (null: no launcher's variables and no NCCL communicator)"]
    nccl: NotRequired[Annotated[NcclIdentity, "its NCCL communicator (absent: it made none memtrace saw)"]]
    exited: Annotated[bool, "it has exited"]


class Summary(TypedDict):
    """The document `memtrace run --format json` writes."""

    schema: Annotated[int, "the schema version (1): later versions add fields and never rename these"]
    processes: Annotated[
        list[ProcessRow], "every process memtrace met: its identity, and its job where a launcher said"
    ]
    simulated: Annotated[
        bool,
        "a library traced is memtrace's own test CUDA library (`agent.libraries[].simulated`): the calls and "
        "bytes are the workload's, the durations and bandwidths are not a GPU's",
    ]
    memcpy: Annotated[list[CopyRow], "one row per (process, api, direction, host_memory)"]
    totals: Annotated[dict[str, DirectionTotals], "every process's copies, by direction"]
    device_memory: Annotated[list[DeviceMemoryRow], "per process: device allocations and pinned host memory"]
    pods: Annotated[list[PodMemoryRow], "per Kubernetes pod: its processes' device memory, by memtrace and NVML"]
    synchronization: Annotated[list[SyncRow], "per process and api: the host waiting for the GPU"]
    launches: Annotated[list[LaunchRow], "per process and api: kernel and graph launches"]
    overhead: Annotated[list[OverheadRow], "per process: what memtrace's probes cost it (estimated)"]
    steps: Annotated[list[StepRow], "per process: its iterations, inferred"]
    collectives: Annotated[list[CollectiveRow], "per process and collective: NCCL calls"]
    host: Annotated[Host | None, "what the host did around the processes (null with --no-host)"]
    findings: Annotated[list[Finding], "problems found, with the fix"]
    diagnoses: Annotated[list[Diagnosis], "slowdowns that started during the run, and why"]
    stacks: NotRequired[Annotated[list[CallSite], "--stacks only: the call sites, most bytes first"]]
    agent: Annotated[Agent, "the agent's own account"]
    command: NotRequired[Annotated[Command, "`run` only: what it traced"]]
