"""Diagnosis: notice that a process slowed down, within seconds, and name
why, with the numbers that show it and a fix.

A diagnosis is a change: a slowdown that starts. Standing conditions
(pageable copies, growth) are findings (analysis/findings.py).

Input: windows. Every WINDOW_S the runtime hands `observe()` one
ProcWindow per traced process (what changed in it during the window: its
steps, its copies, its CPU time from the sched sensor, its time in
collectives) and one HostWindow (the GPUs, the memory pressure, the
network interfaces). Everything here is a difference of counters the
sensors keep exactly; the engine keeps a bounded history per process.

Symptom: the process's mean step time in a window against its baseline,
the median of its last BASELINE normal windows (robust to the odd slow
step, a checkpoint, a GC pause). A server's iterations are no training
steps: their length follows their load (a batch of 40 requests takes longer
than one of 4). A server is judged per unit of work instead: each
iteration's busy time (from its first call to its end, not the wait for
requests before it) against the baseline of its class of work (bytes in and
out, each within a quarter octave: model/steps.work_class), so a window's
symptom is its busy time over what its iterations' classes took before,
and its baseline is 1. A load change brings more iterations, or classes
never seen (those are learned, not judged); only the same work taking
longer is a slowdown. A window is slow past SLOW_RATIO times the
baseline (past CLEAR_RATIO while its GPU newly reports a fault outright:
throttling, a link trained narrower; the higher bar is against noise, and
the report is none); DETECT_AFTER slow windows in a row are a slowdown, whose onset is
the first of them (so a single slow window, which any job has, never is).
While a slowdown lasts, the baseline is frozen; it ends after CLEAR_AFTER
windows back under CLEAR_RATIO times the baseline (hysteresis: no
flapping). A slowdown in progress that deepens DEEPER times past the ratio
it was diagnosed at is a second one: diagnosed again, from its own windows.
Processes without steps have no symptom (no made-up one).
A job's ranks are the processes of one job identity (memtrace.job.id, from
the launcher's variables) or, without one, of one executable and parent.

Cause: each cause compares its signal over the slow windows with the same
signal over the baseline windows, and scores how far it moved against a
margin. The highest score at or above 1 names the cause; hardware faults
NVML reports (thermal or power throttling, a link trained narrower) are
categorical and score high. If none scores, the cause is `unknown`, and
the evidence still says what was looked at, and which cause came closest.
If two causes score past 1 within AMBIGUOUS_WITHIN of each other, the
evidence fits both: the cause is `ambiguous`, with the candidates and
their scores (never one of them picked by a hair). A diagnosis made with one
cause may be re-named within REFINE_WINDOWS windows if the evidence for
another grows stronger (its first name is kept in `evidence`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from memtrace.core.ids import ProcessKey
from memtrace.core.tcp import TcpPath
from memtrace.model.steps import OTHER_WORK, WORK_CLASSES_PER_OCTAVE

WINDOW_S = 0.5
BASELINE = 20  # normal windows in a baseline
MIN_BASELINE = 6  # before this many, no judgement
# From this many normal windows on, a window slow against their median is held out of the
# baseline being built (a fault in a job's first seconds is not learnt as its normal), and
# enough of them in a row are a slowdown.
MIN_JUDGE = 4
HOLD_PHASES = 3  # a third window in a row of one step longer than a window is judged
TRIM_FROM = 4  # a training window of this many steps or more is judged without its longest
# ... where that step is LONE times the longest its normal windows hold (their median), or more: a
# one-off (a checkpoint's serialisation, a collection), not a step of the loop's own pattern
LONE = 3.0
MAIN_SHARE = 0.6  # a class of work of this share of a training loop's steps is its training steps
SHORTER = 0.7  # ... and the steps of a class under this share of theirs are left out of a window's mean
# A fault that halves one of three resources a step uses in equal parts slows
# it by a sixth to a third; a healthy job's half-second means stay within a
# few percent of its median (bench/diagnose prints the spread it saw).
SLOW_RATIO = 1.2
DETECT_AFTER = 2
CLEAR_RATIO = 1.1
# A window over CLEAR_RATIO (not normal) while its GPU newly reports a fault outright (throttling, a
# link trained narrower) is slow: the bar against noise is SLOW_RATIO, and the report is no noise. A
# throttle that slows a step by a tenth (one of three parts of an accumulated step) went unnamed.
REPORTED_SLOW_RATIO = CLEAR_RATIO
CLEAR_AFTER = 4
# A slowdown in progress whose windows grow DEEPER times the ratio it was diagnosed at, DETECT_AFTER
# in a row, is a second slowdown on the first: diagnosed again, its onset the first of those windows
# and its cause weighed over them alone (a server's noise named at 1.1x, then its CPU quota halved:
# 26x, and reported as nothing, the first slowdown never having ended).
DEEPER = 1.5
# The normal windows just before a slowdown are not what its cause's signals are weighed against:
# a fault shows on the host a window or two before the steps feel it (a flooded link drops at
# once while the job's replies are still on their way; a slow loader drains its prefetched
# batches first), and a baseline holding those windows hides the rise (the fleet rig's NIC fault:
# its drops fell into the baseline, and the slowdown was named input starvation).
ONSET_GUARD = 2
# A process that exited is kept as a peer while a live rank of its job is slow since before it
# ended, for no longer than a live process keeps its windows (Diagnoser.gone).
GONE_AFTER = BASELINE + 16
REFINE_WINDOWS = 20  # 10 s: NVML's slow readings (link width) come every second or so, a NIC's queue grows for seconds
MIN_CLASS_WINDOWS = 3  # a server's class of work is judged once its baseline holds this many windows
# A server's copies of one direction and size are judged once its baseline holds this many windows
# with them, and holds MIN_BASELINE windows: one copy's time is noisier than an iteration's (a
# wake-up late on a busy CPU), and two such windows in its first seconds read as a slowdown.
MIN_COPY_WINDOWS = 6
# A server's slowdown that no signal explains is named `unknown` once it held this many windows (2 s):
# its iterations at equal work are noisier than a training step (random arrivals mix batches; a copy's
# time rides on the time a wake-up takes), and nothing else corroborates a short one. A healthy zoo
# server read 1.23x at equal work, its copies 1.57x, for two windows, nothing else moving (seed 11);
# a cause's evidence names a slowdown at DETECT_AFTER, as before.
UNEXPLAINED_AFTER = 4
NOISE_Z = 3.0  # a server's window is slow only this many of its noise's deviations above the baseline
# A server's class of work never seen, larger than a known one, takes at most the known one's
# time times the ratio of their work to a power, if nothing slowed: the steepest growth its own
# known classes show (a batch's time grows less than linearly with its size, a prompt's attention
# quadratically with its length), at least 1 and at most GROWTH_POWER.
GROWTH_POWER = 2.0
AMBIGUOUS_WITHIN = 1.25  # the best cause scores less than this times the second: both fit
# A server's link carries this many times the bytes per unit of the server's own work it carried in
# its baseline (others' traffic: its own grows with its work), and holds more packets: contention.
OTHERS_ON_LINK = 1.25


@dataclass(frozen=True)
class Margins:
    """How far each cause's signal must move, from the baseline windows to
    the slow ones, to score 1 (a cause is named at a score of 1); faults
    NVML reports outright (throttling, a narrowed link) score a fixed amount.
    Every threshold of the scorers is here, by name."""

    named: float = 1.0  # the score that names a cause
    rename: float = 1.5  # a re-named cause needs this many times the first name's score
    most: float = 0.5  # a share of the slow windows that is most of them
    few: float = 0.25  # a share of the baseline windows that is few of them
    reported: float = 3.0  # a fault NVML reports: throttling, a link trained narrower
    onset_windows: int = 6  # a reported fault in the baseline's last windows, no more, began with the slowdown
    # cpu_interference: 5 points of the process's time more in the run queue, and at least double;
    # throttled by its own CPU quota is a clear cause.
    runq_rise: float = 0.05
    runq_times: float = 2.0
    # ... or 5 points more of its time stolen by the hypervisor (another VM) while on its CPUs, and
    # at least double.
    steal_rise: float = 0.05
    steal_times: float = 2.0
    quota_score: float = 2.0
    # pcie_contention: PCIe replays newly frequent (times the baseline's rate, and a floor per window) ...
    replays_score: float = 2.5
    replays_times: float = 4.0
    replays_per_window: float = 2.0
    # ... or a quarter of its copy bandwidth gone while the others copy half again as much, or while
    # its GPU's link carries half again as much that memtrace does not trace, by half the traced rate.
    copy_fell: float = 0.25
    others_times: float = 1.5
    untraced_times: float = 1.5
    untraced_of_traced: float = 0.5
    # host_memory_pressure: the memory stall share 5 points up, or its own memory limit newly hit
    # (at least this often a second, ten times its rate before), scored as a clear cause.
    stall_rise: float = 0.05
    limit_hits_per_s: float = 1.0
    limit_hits_times: float = 10.0
    limit_hits_score: float = 2.0
    # input_starvation: the GPU idles 10 points more of each step while the host's share grew; not
    # named where the run queue or the memory stall share rose this much (the host work was starved).
    idle_rise: float = 0.10
    host_starved: float = 0.05
    # ... and the run queue's growth per step at least half the step's growth (a job that does more
    # host work waits more for a shared CPU; that wait is not what slowed it).
    host_starved_of_growth: float = 0.5
    # nic_contention: a link at least this busy, 30 points busier than before, or 20 more packets a
    # window held or dropped by its qdisc, and half again as many as before (a job whose own
    # exchange keeps its shaper busy has it hold thousands a window, a few hundred either way);
    # a server's: and a fifth more than before, at its work.
    link_busy: float = 0.8
    link_rise: float = 0.3
    held_rise: float = 20.0
    held_over: float = 0.5
    held_times: float = 1.2
    # straggler: a rank waits for a peer (most of its step's growth in collectives, and a peer spends
    # 10 points less of its step there), or its peers wait for it (its own growth is hardly waiting).
    waited: float = 0.5
    share_gap: float = 0.1
    not_waiting: float = 0.25
    # nvlink_contention: its GPU's NVLinks newly down in most slow windows (scored as reported), or their
    # CRC/replay/recovery errors newly frequent; or half its step's growth in collectives while its
    # GPU's links carry half again as many bytes a second (others' traffic: it makes fewer steps).
    nvlink_errors_times: float = 4.0
    nvlink_errors_per_window: float = 2.0
    nvlink_errors_score: float = 2.5
    nvlink_waited: float = 0.5
    nvlink_times: float = 1.5
    # A wait for a peer across the network (what input_starvation would name): a connection of the
    # process that carried data in the last 2 s has a round trip twice its baseline's median and
    # 2 ms over the baseline's highest (replies queued on the path, or a slow peer), read at least
    # 3 times in the baseline.
    path_recent_ms: int = 2000
    path_rtt_times: float = 2.0
    path_rtt_over_us: int = 2000
    path_baseline_reads: int = 3
    # ... unless its own link's mean utilization rose this much (its own queue, filling).
    path_own_rise: float = 0.1


MARGINS = Margins()

# The causes a diagnosis names (besides `unknown`): the vocabulary of its
# `cause` field and the `cause` attribute memtrace.diagnoses carries.
CAUSES = (
    "cpu_interference",
    "nic_contention",
    "pcie_contention",
    "gpu_throttling",
    "host_memory_pressure",
    "input_starvation",
    "straggler",
    "nvlink_contention",
    "ambiguous",
)

FIXES = {
    "cpu_interference": "give the job CPUs of its own (Kubernetes: Guaranteed QoS with the static CPU "
    "manager; elsewhere taskset/cpusets), or move the noisy neighbour; if its own CPU quota throttles it, "
    "raise the quota (cpu.max, resources.limits.cpu)",
    "cpu_quota": "raise the job's CPU limit (cgroup cpu.max, Kubernetes resources.limits.cpu): the quota, "
    "not another process, is what stops it",
    "cpu_steal": "the VM's host is oversubscribed: the hypervisor runs other VMs on this one's CPUs (steal "
    "time). Move the job to a dedicated or larger instance, or ask the provider; nothing inside this VM "
    "can take the CPUs back",
    "nic_contention": "move the bulk flow off the job's link, give the job a link or traffic class of its "
    "own, or rate-limit the other traffic",
    "pcie_contention": "keep other copiers off this GPU's PCIe link (or schedule them apart); a link trained "
    "below its width or with replays is a hardware fault: reseat the GPU or riser",
    "gpu_throttling": "check the GPU's cooling and power limit (nvidia-smi -q -d PERFORMANCE,POWER,"
    "TEMPERATURE); the clocks come back when the cause goes",
    "host_memory_pressure": "give the job's cgroup more memory (memory.high/max, resources.limits.memory) "
    "or stop what fills the host's memory: the job stalls in reclaim",
    "input_starvation": "feed the GPU faster: more DataLoader workers, prefetching, pinned memory; the GPU "
    "idles while the host prepares the next batch",
    "straggler": "every rank waits for the slowest: look at that rank's host (CPU, NIC, GPU health); "
    "the others are healthy",
    "straggler_remote": "it waits for a peer across the network whose replies come late (the round trip "
    "to it rose: a queue on the path, most often a full link at the peer's side, or a slow peer): look at "
    "that peer's host and link (memtrace there names its cause); this process is healthy",
    "ambiguous": "two causes fit the evidence about equally (its candidates); check both",
    "unknown": "no host signal moved with the slowdown: look at the job itself (a data change, a new "
    "code path) or at what memtrace cannot see",
    "nvlink_contention": "keep other jobs' peer traffic off this GPU's NVLinks (place jobs on GPUs that do not "
    "share links or NVSwitch planes); a link down or counting CRC/replay errors is a hardware fault: "
    "drain the node and reset or service the GPU and its NVLink",
}


@dataclass
class ProcWindow:
    """What changed in one process during one window (deltas of its counters)."""

    key: ProcessKey
    name: str = ""
    exe: str = ""
    ppid: int = 0  # its parent: the processes of one executable and one parent are one job's ranks
    start_ns: int = 0  # the process's start, wall clock
    steps: int = 0
    step_ns: int = 0
    longest_ns: int = 0  # its longest step in the window, at least (0: not known)
    gpu_idle_ns: int = 0
    host_ns: int = 0  # the step's own work (on CPU, run queue, off CPU)
    copy_bytes: int = 0
    copy_ns: int = 0
    runq_ns: int | None = None  # None: no CPU sensor reading for it
    on_cpu_ns: int = 0
    off_cpu_ns: int = 0
    preemptors: dict[int, tuple[int, str, str]] = field(default_factory=dict)  # cgroup -> (wait ns, path, comm)
    quota_throttled_ns: int = 0
    # The share of the window the hypervisor ran another VM on the CPUs it may run on (steal
    # time, sources/steal.py; None: not read, or not a VM's kernel).
    steal_share: float | None = None
    # Its memory cgroup (or one above) reclaiming at its limit, times in the
    # window (None: no memory controller counts for it).
    memory_limit_hits: int | None = None
    collective_ns: int = 0  # time in NCCL calls and in the waits that followed them (charged to them)
    netns: int | None = None
    # Its established TCP connections at the window's end (core/tcp.py); None: not read. The
    # runtime reads a training loop's every few windows (runtime/diagnose.TCP_EVERY), and the
    # diagnosis asks for them where it would name input starvation (Diagnoser.tcp).
    tcp: tuple[TcpPath, ...] | None = None
    job: str = ""  # memtrace.job.id ("": none known)
    # A server (model/steps.Loop.SERVING): its iterations in the window by class of work
    # (model/steps.work_class) -> (iterations, busy ns: from each one's first call to its end).
    serving: bool = False
    work: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    # A server's copies in the window by (direction, size class: model/steps.CopySizeStats) ->
    # (calls, bytes, ns inside them).
    copies: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict)
    # A training loop's steps in the window by class of work (model/steps.work_class): (steps, step
    # ns); {}: not known (a server, or its first window).
    classes: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)


@dataclass
class GpuWindow:
    index: int
    uuid: str
    throttled: bool | None
    reasons: tuple[str, ...]
    replays: int | None  # PCIe replays during the window
    link_width: int | None
    max_link_width: int | None
    link_generation: int | None = None
    max_link_generation: int | None = None
    # Bytes the GPU sent and received over PCIe in the window, by the driver's counters (None: it has
    # none), and the processes NVML lists on it.
    pcie_bytes: int | None = None
    pids: tuple[int, ...] = ()
    # Its NVLinks: bytes sent and received over all of them in the window (None: not counted), links
    # down at the window's end, and their CRC, replay and recovery errors in the window.
    nvlink_bytes: int | None = None
    nvlinks_down: int = 0
    nvlink_errors: int | None = None


@dataclass
class LinkWindow:
    netns: int
    interface: str
    utilization: float | None  # busier direction over link speed
    drops: int  # interface and qdisc drops in the window
    overlimits: int  # qdisc overlimits (the shaper held packets back)
    backlog_bytes: int
    bytes: int | None = None  # received and sent in the window (None: not known)


@dataclass
class HostWindow:
    end_ns: int  # CLOCK_MONOTONIC
    wall_offset_ns: int  # wall clock - monotonic
    gpus: list[GpuWindow] = field(default_factory=list)
    memory_stall_ns: int | None = None  # PSI memory "some" stall time in the window (None: no PSI)
    links: list[LinkWindow] = field(default_factory=list)
    copy_bytes: dict[ProcessKey, int] = field(default_factory=dict)  # every traced process's, this window
    seconds: float = WINDOW_S


@dataclass
class Diagnosis:
    cause: str
    key: ProcessKey
    process: str
    symptom: str
    ratio: float  # the symptom's size: step time over its baseline
    onset_ns: int  # wall clock
    detected_ns: int
    evidence: dict[str, Any]
    fix: str
    named_ns: int = 0  # when the cause was named (wall clock)
    start_ns: int = 0  # the process's start, wall clock (0: unknown)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "pid": self.key.pid,
            "start_time_unix_nano": self.start_ns,
            "process": self.process,
            "symptom": self.symptom,
            "ratio": self.ratio,
            "onset_time_unix_nano": self.onset_ns,
            "detected_time_unix_nano": self.detected_ns,
            "named_time_unix_nano": self.named_ns,
            "evidence": self.evidence,
            "fix": self.fix,
        }


@dataclass
class _Seen:
    """One process's history: its windows, baseline, and the slowdown in progress."""

    windows: deque[tuple[ProcWindow, HostWindow]] = field(default_factory=lambda: deque(maxlen=GONE_AFTER))
    normal: deque[float] = field(default_factory=lambda: deque(maxlen=BASELINE))  # step means of normal windows
    normal_windows: deque[tuple[ProcWindow, HostWindow]] = field(default_factory=lambda: deque(maxlen=BASELINE))
    slow: list[tuple[ProcWindow, HostWindow]] = field(default_factory=list)
    # A server's busy ns per iteration of each class of work, in its normal windows.
    unit: dict[tuple[int, int], deque[float]] = field(default_factory=dict)
    serving: bool = False  # judged as a server (its baseline is in units of work)
    last: float | None = None  # its last window's symptom value (for a debug log)
    # The classes of work its normal windows' means leave out (_short_classes).
    short: frozenset[tuple[int, int]] = frozenset()
    # The shortest step its windows' means leave out as a one-off (_lone; None: any longest step).
    lone: float | None = None
    active: Diagnosis | None = None
    since_detect: int = 0
    calm: int = 0
    deeper: list[tuple[ProcWindow, HostWindow]] = field(default_factory=list)  # windows DEEPER past it, in a row
    held: int = 0  # windows in a row held out as one step longer than a window (_phase)
    # Those windows, kept until the hold runs out: then they were the loop's pace, and are judged.
    held_windows: list[tuple[ProcWindow, HostWindow]] = field(default_factory=list)
    # A server's link (_server_link): its baseline windows, its windows held in a row, the
    # diagnosis in progress and the windows since it calmed.
    link_normal: deque[tuple[ProcWindow, HostWindow]] = field(default_factory=lambda: deque(maxlen=BASELINE))
    link_slow: list[tuple[dict[str, Any], HostWindow]] = field(default_factory=list)
    link_active: Diagnosis | None = None
    link_calm: int = 0
    job: tuple[str, int] | None = None  # its job (_job_of), as its last window gave it
    gone: int | None = None  # the window it was found gone in (Diagnoser.gone)


def _short_classes(s: _Seen) -> frozenset[tuple[int, int]]:
    """The classes of work (bytes in and out, model/steps.work_class) of a training loop's
    steps, in its normal windows, that are shorter than its training steps: where one class
    holds MAIN_SHARE or more of the steps (its training steps) but not all, the others whose
    steps took under SHORTER of that class's. An evaluation's iterations (forward only, a count
    read back, not a loss), say; not the longer steps beside them (an optimizer step's
    all-reduce, a log line's synchronisation, a checkpoint), which a fault may slow alone.
    Empty where no class holds MAIN_SHARE (batches of varying length)."""
    per: dict[tuple[int, int], list[int]] = {}
    for w, _h in s.normal_windows:
        for wk, (n, ns) in w.classes.items():
            c = per.setdefault(wk, [0, 0])
            c[0] += n
            c[1] += ns
    total = sum(n for n, _ns in per.values())
    if not total:
        return frozenset()
    main, (n, ns) = max(per.items(), key=lambda t: t[1][0])
    if main == OTHER_WORK or not MAIN_SHARE * total <= n < total or ns <= 0:
        return frozenset()
    return frozenset(wk for wk, (m, mns) in per.items() if wk != main and m and mns / m < SHORTER * ns / n)


def _step_mean(
    w: ProcWindow, short: frozenset[tuple[int, int]] = frozenset(), lone: float | None = None
) -> float | None:
    """A window's mean step without its longest, where it holds TRIM_FROM steps or more and that
    step is `lone` or longer (_lone): a checkpoint's serialisation or a collection is one step,
    not the loop, and two of them in a row (or one beside a noisy window) read as a slowdown. A
    slowdown stretches every step: the others show it. A step of the loop's own pattern is kept:
    gradient accumulation's optimizer step (its all-reduce), two or three a window, was left out
    whatever it took, and a flooded link that doubled it read 1.0-1.26x, the window's mean
    swinging with how many of them it held (the zoo's accumulation shape: detected 2.6-5 s after
    the onset, or never). Steps of a class shorter than the loop's training steps (`short`,
    _short_classes) are left out where the window holds others: an evaluation's 20 iterations,
    each a third of a training step, pulled a window's mean to 0.55-0.77 of its baseline, and a
    fault starting beside one was detected a window or two later (the zoo's eval shape,
    2.1-2.3 s)."""
    if not w.steps:
        return None
    n, ns = w.steps, w.step_ns
    if short:
        left_n = sum(c for wk, (c, _x) in w.classes.items() if wk in short)
        left_ns = sum(x for wk, (_c, x) in w.classes.items() if wk in short)
        if 0 < left_n < n:
            n, ns = n - left_n, ns - left_ns
    # Its longest step is one of those left in (longer than their mean: a short class's is not).
    if n >= TRIM_FROM and ns / n <= w.longest_ns < ns and (lone is None or w.longest_ns >= lone):
        return (ns - w.longest_ns) / (n - 1)
    return ns / n


def _lone(s: _Seen) -> float | None:
    """The shortest step a training window's mean leaves out as a one-off: LONE times the median
    of its normal windows' longest steps, once MIN_JUDGE of them are known; None before (any
    longest step is left out, as where the runtime does not know them)."""
    known = [w.longest_ns for w, _h in s.normal_windows if w.longest_ns and w.steps >= TRIM_FROM]
    return LONE * statistics.median(known) if len(known) >= MIN_JUDGE else None


def _phase(s: _Seen, w: ProcWindow) -> bool:
    """A training window of a step longer than a window, in a job that makes TRIM_FROM steps a
    window or more: a checkpoint's serialisation or an evaluation ended in it (its own window
    held no step), too few steps beside it to judge it without its longest. It is no evidence of
    the loop's pace, either way: held out, for up to HOLD_PHASES - 1 windows in a row (steps that
    long window after window are the loop's). A fault that starts with a checkpoint (the zoo's
    checkpoint shape) was otherwise judged with it: 8.4x for 1.35x, and its evidence weighed by
    that one step."""
    if w.serving or not w.steps or w.steps >= TRIM_FROM or len(s.normal_windows) < MIN_JUDGE:
        return False
    longest = w.longest_ns or w.step_ns // w.steps
    if longest < WINDOW_S * 1e9:
        return False
    return statistics.median(x.steps for x, _ in s.normal_windows) >= TRIM_FROM


def _work_ratio(s: _Seen, w: ProcWindow) -> float | None:
    """A server's busy time in the window over what its iterations' classes
    of work took in its normal windows (the median per iteration of each);
    None where none of its classes has a baseline yet."""
    busy = expected = 0.0
    for wk, (n, ns) in w.work.items():
        base = s.unit.get(wk)
        if n and base is not None and len(base) >= MIN_CLASS_WINDOWS:
            busy += ns
            expected += n * statistics.median(base)
    return busy / expected if expected else None


def _below(k: tuple[int, int], wk: tuple[int, int]) -> bool:
    """Class k is of no more work than wk in both directions, and moves bytes in each that wk does."""
    return k[0] <= wk[0] and k[1] <= wk[1] and (k[0] > 0 or not wk[0]) and (k[1] > 0 or not wk[1])


def _growth(known: dict[tuple[int, int], float]) -> float:
    """How steeply the server's time grows with its work: the steepest power its known classes
    show between any two an octave or more apart in work (log of their times' ratio over log of
    their work's, by their classes' quarter octaves), at least 1 (a larger batch takes no more
    time per unit of work than a smaller: sound for any server that batches) and at most
    GROWTH_POWER. A server of linear cost (host work per request, a decode step per sequence)
    slowed into batches larger than any seen was otherwise allowed the quadratic bound, and
    twice its time passed as their normal (the zoo's LLM server under a CPU hog)."""
    steepest = 1.0
    for a, na in known.items():
        for b, nb in known.items():
            octaves = max(b[0] - a[0], b[1] - a[1]) / WORK_CLASSES_PER_OCTAVE
            if octaves >= 1 and _below(a, b) and na > 0 and nb > na:
                steepest = max(steepest, math.log2(nb / na) / octaves)
    return min(steepest, GROWTH_POWER)


def _class_bound(wk: tuple[int, int], known: dict[tuple[int, int], float], power: float) -> float | None:
    """The most a class of work never seen may take per iteration if nothing slowed, from the
    known classes (busy ns per iteration): no more than a class of at least as much work in
    both directions, and no more than a class of less work times the ratio of the two (at
    most, by their quarter octaves) to `power` (_growth). None: no known class bounds it (a
    direction it moves bytes in that no known class does)."""
    best = math.inf
    for k, ns in known.items():
        if k[0] >= wk[0] and k[1] >= wk[1]:
            best = min(best, ns)
        elif _below(k, wk):
            octaves = (max(wk[0] - k[0], wk[1] - k[1]) + 1) / WORK_CLASSES_PER_OCTAVE
            best = min(best, ns * 2.0 ** (power * octaves))
    return None if best == math.inf else best


def _bounded_ratio(s: _Seen, w: ProcWindow) -> float | None:
    """A server's iterations of classes of work never seen (a slowdown that queues requests
    makes larger batches; so does a load that rises): their busy time over the most those
    classes could take if nothing slowed (_class_bound). At most the true ratio: above
    SLOW_RATIO by it they are slow, whatever the load. None where no known class bounds
    any of them."""
    known = {wk: statistics.median(b) for wk, b in s.unit.items() if len(b) >= MIN_CLASS_WINDOWS}
    if all(wk in known for wk, (n, _ns) in w.work.items() if n):
        return None
    power = _growth(known)
    busy = expected = 0.0
    for wk, (n, ns) in w.work.items():
        bound = _class_bound(wk, known, power) if n and wk not in known else None
        if bound is not None:
            busy += ns
            expected += n * bound
    return busy / expected if expected else None


def _keep_normal(s: _Seen, w: ProcWindow, host: HostWindow, mean: float) -> None:
    """A normal window into the baseline: a server's classes of work learnt from it; a training
    loop's short classes (_short_classes) and one-off steps (_lone) weighed again with it, and
    where they changed, the baseline's means made again, each normal window's as it would be
    judged now."""
    s.normal.append(mean)
    s.normal_windows.append((w, host))
    if w.serving:
        _learn_work(s, w)
        return
    short, lone = _short_classes(s), _lone(s)
    if short != s.short or lone != s.lone:
        s.short, s.lone = short, lone
        means = [_step_mean(x, short, lone) for x, _h in s.normal_windows]
        s.normal = deque((m for m in means if m is not None), maxlen=BASELINE)


def _learn_work(s: _Seen, w: ProcWindow) -> None:
    """Fold a normal window's iterations into their classes' baselines."""
    for wk, (n, ns) in w.work.items():
        if n:
            if wk not in s.unit and len(s.unit) >= 4 * BASELINE:
                continue  # bounded: a server's classes are few (model/steps.MAX_WORK)
            s.unit.setdefault(wk, deque(maxlen=BASELINE)).append(ns / n)


def _iterations(w: ProcWindow) -> int:
    return sum(n for n, _ns in w.work.values())


def _within_noise(s: _Seen, w: ProcWindow, value: float, base: float) -> bool:
    """A server's window of few iterations is noisy (one preempted iteration in ten moves its
    mean by a tenth of the preemption): it is slow only past NOISE_Z times what its normal
    windows' spread, per iteration, gives a window of its size (the spread per iteration:
    each normal window's deviation times the square root of its iterations, robustly, by the
    median). Training windows hold many steps: their threshold is SLOW_RATIO alone."""
    if not w.serving:
        return False
    dev = [(v - base) ** 2 * _iterations(x) for v, (x, _h) in zip(s.normal, s.normal_windows, strict=False)]
    if not dev:
        return False
    sigma = math.sqrt(statistics.median(dev)) / 0.6745  # the median absolute deviation of a normal spread
    return value - base <= NOISE_Z * sigma / math.sqrt(max(_iterations(w), 1))


def _copy_base(before: list[ProcWindow]) -> dict[tuple[int, int], tuple[float, float]]:
    """A server's copies in its normal windows, per (direction, size class) seen in at least
    MIN_COPY_WINDOWS of them: the median ns per byte and per call."""
    per: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for w in before:
        for ck, (n, b, ns) in w.copies.items():
            if n and b and ns > 0:
                per.setdefault(ck, []).append((ns / b, ns / n))
    return {
        ck: (statistics.median(x for x, _ in v), statistics.median(y for _, y in v))
        for ck, v in per.items()
        if len(v) >= MIN_COPY_WINDOWS
    }


def _copy_ratio(before: list[ProcWindow], after: list[ProcWindow]) -> float | None:
    """A server's copies' time in `after` over what copies of their direction and size took in
    `before` (its normal windows): a link narrowed or shared shows in each copy at equal size,
    whatever its load. A size never seen is bounded as _class_bound bounds work: a larger copy
    takes no more per byte than a smaller one of its direction, a smaller one no more per call
    than a larger (at most the true ratio). None: no copy of a known or bounded size."""
    base = _copy_base(before)
    took = expected = 0.0
    for w in after:
        for ck, (n, b, ns) in w.copies.items():
            if not n or not b:
                continue
            if ck in base:
                bound = b * base[ck][0]
            else:
                bounds = [b * per_byte for k, (per_byte, _c) in base.items() if k[0] == ck[0] and k[1] < ck[1]]
                bounds += [n * per_call for k, (_b, per_call) in base.items() if k[0] == ck[0] and k[1] > ck[1]]
                if not bounds:
                    continue
                bound = min(bounds)
            took += ns
            expected += bound
    return took / expected if expected else None


def _server_ratios(s: _Seen, w: ProcWindow) -> tuple[float | None, float | None]:
    """A server's window: its busy time at equal work over its baseline (the iterations of classes
    never seen over their bound where that is more), and its copies' time at equal size over theirs."""
    ratios = [r for r in (_work_ratio(s, w), _bounded_ratio(s, w)) if r is not None]
    normal = [x for x, _ in s.normal_windows]
    return (max(ratios) if ratios else None), (_copy_ratio(normal, [w]) if len(normal) >= MIN_BASELINE else None)


def _symptom_value(s: _Seen, w: ProcWindow) -> tuple[float | None, bool]:
    """What a window is judged by: a training job's mean step (ns), or a
    server's busy time at equal work over its baseline (1: as before), the
    iterations of classes never seen over their bound where that is more (a
    slowdown that queues requests makes batches of new classes: were they
    left out, the few iterations of known classes would judge the window),
    or its copies' time at equal size over theirs where that is more (a
    narrowed or shared PCIe link slows each copy, even where the iterations'
    busy time barely moves). And whether its work is only bounded (a server's
    window of no known class of work)."""
    if not w.serving:
        return _step_mean(w, s.short, s.lone), False
    busy, copies = _server_ratios(s, w)
    ratios = [r for r in (busy, copies) if r is not None]
    return (max(ratios) if ratios else None), _work_ratio(s, w) is None


# A server's measures of its work in a window: the bytes it copied, its iterations.
_SERVER_WORK: tuple[Callable[[ProcWindow], float], ...] = (lambda x: x.copy_bytes, _iterations)


def _server_link(before: list[tuple[ProcWindow, HostWindow]], w: ProcWindow, h: HostWindow) -> dict[str, Any] | None:
    """A server's link (in its network namespace now, not lo) held by traffic that is not its own,
    against its baseline windows in that namespace. Its own work: its copied bytes and its
    iterations (its requests and replies grow with them, at most as fast as the faster). The
    link's shaper holds or drops MARGINS.held_rise packets a window more than its baseline, grown
    with the server's work past the most it did in a baseline window (random arrivals vary a
    window's work by a tenth or more; the queue does not follow them), and MARGINS.held_times as
    many; or it is MARGINS.link_busy busy, MARGINS.link_rise more than before. And the extra is
    others' traffic: the link carries OTHERS_ON_LINK times the bytes per unit of the server's
    work (against its baseline's median) it carried; or it was at its limit already (most
    baseline windows held MARGINS.held_rise packets: more traffic cannot pass, only the queue
    grows), and holds MARGINS.held_times what its most held baseline window did. A server whose
    own load grows fills its link with its own traffic: the bytes per unit of its work stay, and
    its queue grows no faster than its work. The evidence of the link most held; None: none is,
    or too few baseline windows in its namespace."""
    ns = w.netns
    if ns is None:
        return None
    base = [x for x, _ in before if x.netns == ns]
    if len(base) < MIN_BASELINE:
        return None
    growth, past = [], []
    for work in _SERVER_WORK:
        now, was = work(w), [work(x) for x in base]
        if statistics.median(was) > 0:
            growth.append(now / statistics.median(was))
            past.append(now / max(was))
    if not growth:
        return None
    grew, grew_past = max(growth), max(past)
    best: dict[str, Any] | None = None
    for link in h.links:
        if link.netns != ns or link.interface == "lo":
            continue
        pairs = [
            (x, y)
            for x, hx in before
            if x.netns == ns
            for y in hx.links
            if y.netns == ns and y.interface == link.interface
        ]
        xs = [y for _, y in pairs]
        if len(xs) < MIN_BASELINE:
            continue
        held_b = statistics.median(y.overlimits + y.drops for y in xs)
        held = link.overlimits + link.drops
        util_b = statistics.median(y.utilization or 0.0 for y in xs)
        util = link.utilization or 0.0
        if link.bytes is not None and all(y.bytes is not None for y in xs):
            carried_b, carried = statistics.median(y.bytes or 0 for y in xs), float(link.bytes)
        else:
            carried_b, carried = util_b, util
        per_work = carried / max(grew, 1e-9) / carried_b if carried_b > 0 else (math.inf if carried > 0 else 0.0)
        expect = held_b * max(grew_past, 1.0)
        by_held = held - expect >= MARGINS.held_rise and held >= MARGINS.held_times * expect
        by_util = util >= MARGINS.link_busy and util - util_b >= MARGINS.link_rise
        # At its limit now, carrying more bytes per unit of its work: others take the
        # link's capacity (a server paced by its link: a flow joins, its queue cannot grow, TCP
        # backs off, and the server's work falls while the link stays full; _shared_link).
        by_share = _shared_link(util, _most_per_work(pairs, w, link))
        at_limit = _share(sum(y.overlimits + y.drops >= MARGINS.held_rise for y in xs), len(xs)) >= MARGINS.most
        most_held = max(y.overlimits + y.drops for y in xs)
        others = per_work >= OTHERS_ON_LINK or (at_limit and held >= MARGINS.held_times * most_held)
        if not others or not (by_held or by_util or by_share):
            continue
        score = max(
            (held - expect) / MARGINS.held_rise,
            (util - util_b) / MARGINS.link_rise if by_util else 0.0,
            by_share,
        )
        if best is None or score > best["score"]:
            best = {
                "score": round(score, 3),
                "interface": link.interface,
                "held_or_dropped_per_window": held,
                "held_or_dropped_per_window_before": held_b,
                "utilization": round(util, 3),
                "utilization_before": round(util_b, 3),
                "bytes_per_work_over_baseline": round(min(per_work, 1e6), 3),
                "work_over_baseline": round(grew, 3),
            }
    return best


def _most_per_work(pairs: list[tuple[ProcWindow, LinkWindow]], w: ProcWindow, link: LinkWindow) -> float:
    """What the server's link carries now per unit of its work (_SERVER_WORK: each, the lesser
    ratio) over the most it carried in a baseline window (`pairs`: each with its reading of the
    link): random arrivals vary a window's work by a fifth, and a baseline's median would read a
    quiet window as others' traffic."""

    def carried(y: LinkWindow) -> float:
        return float(y.bytes) if y.bytes is not None and link.bytes is not None else y.utilization or 0.0

    ratios = []
    for work in _SERVER_WORK:
        now = work(w)
        most = max((carried(y) / work(x) for x, y in pairs if work(x) > 0), default=0.0)
        if now > 0 and most > 0:
            ratios.append(carried(link) / now / most)
    return min(ratios, default=0.0)


def _shared_link(util: float, per_work: float) -> float:
    """A link at its limit (MARGINS.link_busy) that carries OTHERS_ON_LINK times the bytes, or is
    busy that much longer, per unit of the process's own work (a step, a server's work) than in its
    baseline: others' traffic takes its capacity. Its own traffic paced by the link (an exchange
    each step, a server's replies) cannot show it otherwise: a flow that joins cannot raise the
    link's bytes or its queue much (TCP backs off), only the process's share falls (the zoo's LLM
    server paced by its link: half its iterations, its link as full and as held as before). Nor
    can a link its own exchange kept busy short of the limit, by less than MARGINS.link_rise (a
    job accumulating gradients, its link 0.78 busy: 0.96 with a flow beside it, its queue 45%
    longer, its steps 1.3-1.8x). However busy before: the process's own traffic grows a step's
    link time only with its own bytes a step, and whatever else slows its steps leaves it as it
    was. Scored 1 at OTHERS_ON_LINK, each further such step 1 more; 0: not so."""
    if util < MARGINS.link_busy or per_work < OTHERS_ON_LINK:
        return 0.0
    return (per_work - 1) / (OTHERS_ON_LINK - 1)


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _stall_share(ws: list[tuple[ProcWindow, HostWindow]]) -> float | None:
    """The share of the windows' time in which some task stalled on memory (PSI); None: no PSI."""
    ns = _per_second(ws, lambda _w, h: h.memory_stall_ns)
    return None if ns is None else ns / 1e9


def _limit_hits_per_s(ws: list[tuple[ProcWindow, HostWindow]]) -> float | None:
    """How often per second the process's memory cgroup hit its limit over the windows; None: not known."""
    return _per_second(ws, lambda w, _h: w.memory_limit_hits)


def _per_second(
    ws: list[tuple[ProcWindow, HostWindow]], count: Callable[[ProcWindow, HostWindow], int | None]
) -> float | None:
    """A count's rate over the windows that have it; None: none has it."""
    xs = [(n, h.seconds) for w, h in ws if (n := count(w, h)) is not None]
    secs = sum(t for _, t in xs)
    return sum(n for n, _ in xs) / secs if xs and secs else None


def _memory_limit_newly_hit(
    before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]]
) -> tuple[float, float] | None:
    """(hits a second before, after) where the job's memory limit began to
    be hit: at least MARGINS.limit_hits_per_s now and MARGINS.limit_hits_times its own rate
    before (a job that always runs at its limit has no new cause there)."""
    hb, ha = _limit_hits_per_s(before), _limit_hits_per_s(after)
    if hb is None or ha is None or ha < MARGINS.limit_hits_per_s or ha < MARGINS.limit_hits_times * hb:
        return None
    return hb, ha


def _summed(w: ProcWindow, ws: list[ProcWindow]) -> ProcWindow:
    """`w` with the steps, step time and collective time of the windows `ws` summed: a rank
    over a slowdown, as the straggler scorer compares ranks."""
    return replace(
        w,
        steps=sum(x.steps for x in ws),
        step_ns=sum(x.step_ns for x in ws),
        collective_ns=sum(x.collective_ns for x in ws),
    )


def _runq_per_step(ws: list[tuple[ProcWindow, HostWindow]]) -> tuple[float, float] | None:
    """Run-queue ns and step ns per step over the windows whose run queue is known (None: none)."""
    known = [w for w, _ in ws if w.runq_ns is not None and w.steps]
    n = sum(w.steps for w in known)
    return (sum(w.runq_ns or 0 for w in known) / n, sum(w.step_ns for w in known) / n) if n else None


def _runq_explains(before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]]) -> bool:
    """The run queue's growth per step is at least MARGINS.host_starved_of_growth of the step's own
    growth (True where the steps or the run queue are not known: the share's rise alone decides)."""
    b, a = _runq_per_step(before), _runq_per_step(after)
    if b is None or a is None or a[1] <= b[1]:
        return True
    return a[0] - b[0] >= MARGINS.host_starved_of_growth * (a[1] - b[1])


def _runq_growth(
    before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]]
) -> float | None:
    """How much longer, in ns a step, it waited for a CPU after than before (at least 0; None:
    its run queue not known on one side)."""
    b, a = _runq_per_step(before), _runq_per_step(after)
    return None if b is None or a is None else max(a[0] - b[0], 0.0)


def _unseen_idle(
    before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]]
) -> float | None:
    """The GPU's idle share after, at least, where most of the step's growth is the host's own
    work (MARGINS.most): the rest of the step (copies, waits, collectives) grew by less, so the
    GPU's work per step grew by no more than that, and it idled through the host's growth. Its
    idle is measured only from a wait's return to the next work given it: a loop that gives it
    work between waits (micro-batches accumulated with no loss read, each loaded while the last
    one's kernels ran) idles unseen between them. None: the host did not make most of the growth."""

    def per_step(ws: list[tuple[ProcWindow, HostWindow]]) -> tuple[float, float, float] | None:
        n = sum(w.steps for w, _ in ws)
        if not n:
            return None
        return (
            sum(w.step_ns for w, _ in ws) / n,
            sum(w.gpu_idle_ns for w, _ in ws) / n,
            sum(w.host_ns for w, _ in ws) / n,
        )

    b, a = per_step(before), per_step(after)
    if b is None or a is None:
        return None
    grew, host_grew = a[0] - b[0], a[2] - b[2]
    if grew <= 0 or host_grew < MARGINS.most * grew:
        return None
    return (b[1] + min(grew, host_grew)) / a[0]


def _steal_share(ws: list[ProcWindow]) -> float | None:
    """The share of a process's time the hypervisor took from it: the steal share of its CPUs
    over the time it was on them (a GPU-bound job that is seldom on a CPU loses little to it),
    of its time on CPU, off CPU and in the run queue, as _cpu_share's; where the sched sensor
    has no reading for it, its CPUs' steal share."""
    known = [w for w in ws if w.steal_share is not None]
    if not known:
        return None
    timed = [w for w in known if w.runq_ns is not None]
    if len(timed) < len(known):
        return sum(w.steal_share or 0.0 for w in known) / len(known)
    whole = sum((w.runq_ns or 0) + w.on_cpu_ns + w.off_cpu_ns for w in timed)
    return _share(int(sum((w.steal_share or 0.0) * w.on_cpu_ns for w in timed)), whole)


def _cpu_share(ws: list[ProcWindow]) -> float | None:
    known = [w for w in ws if w.runq_ns is not None]
    if not known:
        return None
    runq = sum(w.runq_ns or 0 for w in known)
    return _share(runq, runq + sum(w.on_cpu_ns + w.off_cpu_ns for w in known))


class Diagnoser:
    def __init__(self, tcp: Callable[[ProcessKey], tuple[TcpPath, ...] | None] | None = None) -> None:
        self.seen: dict[ProcessKey, _Seen] = {}
        self.diagnoses: list[Diagnosis] = []
        self.windows = 0
        # Reads a live process's TCP connections (sources/tcp.py), asked only where a slowdown
        # would be named input starvation (_remote); None: only what the windows carry.
        self.tcp = tcp

    def gone(self, key: ProcessKey) -> None:
        """A process that exited. Its history stays while it can still be a live rank's peer:
        over a slowdown, its peers are read over the windows it ran in (_over_slowdown), and a
        straggler that ended first (a job's ranks end in turn) is still the one they waited
        for. Dropped once its windows are older than any kept (GONE_AFTER)."""
        s = self.seen.get(key)
        if s is not None and s.gone is None:
            s.gone = self.windows

    def _drop_gone(self) -> None:
        """Drop the processes gone that no live one's slowdown can read: none of their job's
        live ranks slow since before they ended, or gone GONE_AFTER windows ago."""
        since: dict[tuple[str, int], int] = {}  # a job's earliest slow window among its live ranks
        for x in self.seen.values():
            if x.gone is None and x.slow and x.job is not None:
                t = x.slow[0][1].end_ns
                since[x.job] = min(since.get(x.job, t), t)
        for key, x in list(self.seen.items()):
            if x.gone is None:
                continue
            slow_since = since.get(x.job) if x.job is not None else None
            if (
                slow_since is None
                or not x.windows
                or x.windows[-1][1].end_ns < slow_since
                or self.windows - x.gone > GONE_AFTER
            ):
                del self.seen[key]

    def state(self, key: ProcessKey) -> str:
        """Where a process stands, for a debug log: its baseline, slow windows, slowdown."""
        s = self.seen.get(key)
        if s is None:
            return "not seen"
        active = f", slowdown ({s.active.cause})" if s.active is not None else ""
        if s.serving:
            last = "not judged" if s.last is None else f"{s.last:.3g}x"
            base = f"baseline {statistics.median(s.normal):.3g}x" if s.normal else "no baseline"
            classes = sum(len(b) >= MIN_CLASS_WINDOWS for b in s.unit.values())
            known = f"{len(s.normal)} windows, {classes} classes known"
            link = f"; link baseline {len(s.link_normal)} windows, {len(s.link_slow)} held"
            if s.link_active is not None:
                link += " (nic_contention)"
            return f"serving, at equal work {last}; {base} of {known}, {len(s.slow)} slow{active}{link}"
        base = f"baseline {statistics.median(s.normal) * 1e-6:.3g} ms" if s.normal else "no baseline"
        held = f", {len(s.held_windows)} held (a step longer than a window)" if s.held_windows else ""
        return f"{base} of {len(s.normal)} windows, {len(s.slow)} slow{held}{active}"

    def observe(self, procs: list[ProcWindow], host: HostWindow) -> list[Diagnosis]:
        """Fold one window; returns the diagnoses made (or re-named) in it."""
        self.windows += 1
        out: list[Diagnosis] = []
        self._drop_gone()
        # A job's ranks: one executable, one parent (torchrun, mpirun's daemon,
        # a pod's launcher); another job of the same executable is not a peer.
        # Where the launcher named the job, its ranks are that job's, on any parent.
        jobs: dict[tuple[str, int], list[ProcWindow]] = {}
        for w in procs:
            jobs.setdefault(_job_of(w), []).append(w)
        for w in procs:  # every process's window first: a rank's peers' are read with its own
            s = self.seen.setdefault(w.key, _Seen())
            s.windows.append((w, host))
            s.job, s.gone = _job_of(w), None
        for w in procs:
            s = self.seen[w.key]
            d = self._symptom(s, w, host, jobs.get(_job_of(w), []))
            if d is not None:
                out.append(d)
            d = self._link(s, w, host)
            if d is not None:
                out.append(d)
        return out

    def _over_slowdown(self, s: _Seen, peers: list[ProcWindow]) -> list[ProcWindow]:
        """Each peer's windows over this process's slow ones, summed into one: a rank judged by
        one window's peers misses a peer that made no step in it (a checkpoint's serialisation,
        an evaluation) and compares a peer's noise, not its slowdown."""
        t0, t1 = s.slow[0][1].end_ns, s.slow[-1][1].end_ns
        out = []
        for p in peers:
            seen = self.seen.get(p.key)
            ws = [w for w, h in seen.windows if t0 <= h.end_ns <= t1] if seen is not None else []
            out.append(_summed(p, ws or [p]))
        # Its job's ranks that ended since the slowdown began, over the windows they ran in.
        present = {p.key for p in peers}
        for key, seen in self.seen.items():
            if seen.gone is not None and seen.job == s.job and key not in present:
                ws = [w for w, h in seen.windows if t0 <= h.end_ns <= t1]
                if ws:
                    out.append(_summed(ws[-1], ws))
        return out

    # ---- the symptom ----

    def _symptom(self, s: _Seen, w: ProcWindow, host: HostWindow, peers: list[ProcWindow]) -> Diagnosis | None:
        if w.serving != s.serving:
            # Its steps turned out to be a server's iterations (model/steps.Loop): a baseline in
            # step times is no baseline in units of work; it starts again.
            s.normal.clear()
            s.normal_windows.clear()
            s.unit.clear()
            s.short, s.lone = frozenset(), None
            s.slow, s.serving = [], w.serving
        if _phase(s, w):
            s.held += 1
            if s.held < HOLD_PHASES:
                s.held_windows.append((w, host))
                return None  # neither slow nor normal: the slow windows around it stay in a row
        elif s.held and not w.steps and not w.serving and len(s.held_windows) < 2 * HOLD_PHASES:
            # A step still in progress between steps longer than a window: the hold goes on (a loop
            # at one step in two windows was otherwise held for good, never judged again).
            s.held_windows.append((w, host))
            return None
        else:
            s.held, s.held_windows = 0, []
        # The hold ran out (steps that long window after window): the windows held were the loop's
        # pace too. Slow with this one, they are slow windows: counted, and their signals evidence
        # (a job slowed past one step a window had its first seconds of evidence dropped).
        held, s.held_windows = s.held_windows, []
        # Only classes of work never seen (bounded): judged against their bound, never learnt as a ratio.
        mean, bounded = _symptom_value(s, w)
        s.last = mean
        if mean is None or (bounded and s.active is None and not self._slow(s, w, mean, host)):
            if w.serving and s.active is None:
                _learn_work(s, w)  # classes never seen, not slow by their bound: learnt
            if mean is not None:
                s.slow = []  # judged, and not slow
            return None
        if len(s.normal) < MIN_BASELINE and not (len(s.normal) >= MIN_JUDGE and self._slow(s, w, mean, host)):
            s.slow = []
            _keep_normal(s, w, host, mean)
            return None
        base = statistics.median(s.normal)
        if s.active is not None:
            s.since_detect += 1
            if s.since_detect <= REFINE_WINDOWS:  # judged over no more (a slowdown of hours held them all)
                s.slow += [*held, (w, host)]
            if mean <= CLEAR_RATIO * base:
                s.calm += 1
                s.deeper = []
                if s.calm >= CLEAR_AFTER:
                    s.active, s.slow, s.calm = None, [], 0
                return None
            s.calm = 0
            was = s.active.ratio * base
            if mean > DEEPER * was and not _within_noise(s, w, mean, was):
                s.deeper += [*held, (w, host)]
                if len(s.deeper) >= DETECT_AFTER:
                    return self._deepened(s, base, host, peers)
            else:
                s.deeper = []
            if s.since_detect <= REFINE_WINDOWS:
                return self._refine(s, base, host, peers)
            return None
        if self._slow(s, w, mean, host):
            s.slow += [*held, (w, host)]
            if len(s.slow) >= DETECT_AFTER:
                return self._detect(s, base, host, peers)
            return None
        s.slow = []
        _keep_normal(s, w, host, mean)
        return None

    def _link(self, s: _Seen, w: ProcWindow, host: HostWindow) -> Diagnosis | None:
        """A server's link held by others' traffic (_server_link) DETECT_AFTER windows in a row is
        nic_contention, whatever its iterations' time: its requests and replies queue before and
        after them (its clients wait; its CUDA calls do not). Not while a slowdown of its
        iterations is in progress (its causes' scoring reads the link too); cleared after
        CLEAR_AFTER windows not held. Its baseline: the windows neither held nor in a diagnosis."""
        if not w.serving:
            s.link_normal.clear()
            s.link_slow, s.link_active, s.link_calm = [], None, 0
            return None
        # Judged without its baseline's last ONSET_GUARD windows (as causes are, _cause): a flow's
        # first window holds part of it, too little to be held, and learnt it raised the most the
        # baseline held past the windows that followed (the zoo's server at its link's limit: 1,204
        # packets, then 1,448 and 1,430 against 1.2x that, where 1.2x 1,138 before it).
        held = _server_link(_guarded(list(s.link_normal), MIN_BASELINE), w, host)
        if s.link_active is not None:
            s.link_calm = s.link_calm + 1 if held is None else 0
            if s.link_calm >= CLEAR_AFTER:
                s.link_active, s.link_calm, s.link_slow = None, 0, []
            return None
        if s.active is not None:
            s.link_slow = []
            return None
        if held is None:
            s.link_slow = []
            s.link_normal.append((w, host))
            return None
        s.link_slow.append((held, host))
        if len(s.link_slow) < DETECT_AFTER:
            return None
        first = s.link_slow[0][1]
        ev = dict(held)
        ev["held_or_dropped_per_window"] = statistics.median(e["held_or_dropped_per_window"] for e, _ in s.link_slow)
        busy = _work_ratio(s, w)
        symptom = (
            f"its link {ev['interface']} held {ev['held_or_dropped_per_window']:.0f} packets a window "
            f"({ev['held_or_dropped_per_window_before']:.0f} before), carrying "
            f"{ev['bytes_per_work_over_baseline']:.1f}x the bytes per unit of its own work: "
            "its requests and replies queue behind other traffic"
            + ("" if busy is None else f" (a server: iteration time at equal work {busy:.1f}x)")
        )
        now = host.end_ns + host.wall_offset_ns
        d = Diagnosis(
            cause="nic_contention",
            key=w.key,
            process=w.name,
            symptom=symptom,
            ratio=ev["bytes_per_work_over_baseline"],
            onset_ns=first.end_ns - int(first.seconds * 1e9) + first.wall_offset_ns,
            detected_ns=now,
            evidence={"unit": "iteration", "score": ev.pop("score"), **ev},
            fix=FIXES["nic_contention"],
            named_ns=now,
            start_ns=w.start_ns,
        )
        s.link_active, s.link_calm = d, 0
        self.diagnoses.append(d)
        return d

    @staticmethod
    def _slow(s: _Seen, w: ProcWindow, mean: float, host: HostWindow) -> bool:
        """A window SLOW_RATIO over the normal ones' median (REPORTED_SLOW_RATIO while its GPU
        newly reports a fault: _newly_reported) and past a server's noise; never before
        MIN_JUDGE normal windows."""
        if len(s.normal) < MIN_JUDGE:
            return False
        base = statistics.median(s.normal)
        bar = REPORTED_SLOW_RATIO if _newly_reported(s, w, host) else SLOW_RATIO
        return mean > bar * base and not _within_noise(s, w, mean, base)

    def _detect(self, s: _Seen, base: float, host: HostWindow, peers: list[ProcWindow]) -> Diagnosis | None:
        first, first_host = s.slow[0]
        w = s.slow[-1][0]
        slow_mean = statistics.median(m for m, _ in (_symptom_value(s, x) for x, _ in s.slow) if m is not None)
        ratio = slow_mean / base
        onset = first_host.end_ns - int(first_host.seconds * 1e9) + first_host.wall_offset_ns
        now = host.end_ns + host.wall_offset_ns
        cause, evidence = self._cause(s, self._over_slowdown(s, peers))
        if w.serving:
            normal = [x for x, _ in s.normal_windows]
            copies = _copy_ratio(normal, [x for x, _ in s.slow])
            busy = [b for b, _c in (_server_ratios(s, x) for x, _ in s.slow) if b is not None]
            at_work = statistics.median(busy) / base if busy else None
            measured: dict[str, Any] = {
                "unit": "iteration",
                "iterations": sum(n for x, _ in s.slow for n, _ns in x.work.values()),
                "busy_over_baseline": round(at_work if at_work is not None else ratio, 3),
            }
            unexplained = at_work is not None and at_work > SLOW_RATIO and len(s.slow) >= UNEXPLAINED_AFTER
            if cause == "unknown" and not unexplained:
                # Its copies alone, and no cause: one copy's time is noisier than an iteration's
                # (the zoo's healthy servers had copies 1.3-1.9x for two windows, nothing else
                # moved). Not a diagnosis; judged again next window while slow, named once a
                # cause's evidence comes (a narrowed link, another copier), or as unknown once
                # slow at equal work UNEXPLAINED_AFTER windows.
                return None
            if copies is not None and copies > SLOW_RATIO and (at_work is None or copies > at_work):
                # Its copies slowed more than its iterations: said so, with both.
                measured["copies_over_baseline"] = round(copies, 3)
                work = "" if at_work is None else f"; iteration time at equal work {at_work:.1f}x"
                symptom = f"copies {copies:.1f}x slower at equal size (a server: per direction and size){work}"
            else:
                symptom = f"iteration time at equal work {ratio:.1f}x its baseline (a server: per class of work)"
        else:
            symptom = f"step time {ratio:.1f}x its baseline ({base * 1e-6:.3g} ms -> {slow_mean * 1e-6:.3g} ms)"
            measured = {"baseline_step_seconds": base / 1e9, "step_seconds": slow_mean / 1e9}
        d = Diagnosis(
            cause=cause,
            key=w.key,
            process=w.name,
            symptom=symptom,
            ratio=ratio,
            onset_ns=onset,
            detected_ns=now,
            evidence={**measured, **evidence},
            fix=_fix(cause, evidence),
            named_ns=now,
            start_ns=w.start_ns,
        )
        d.evidence.pop("fix_key", None)
        s.active, s.since_detect, s.calm = d, 0, 0
        self.diagnoses.append(d)
        return d

    def _deepened(self, s: _Seen, base: float, host: HostWindow, peers: list[ProcWindow]) -> Diagnosis | None:
        """A second slowdown on the one in progress (DEEPER): diagnosed from its own windows
        against the baseline, the first named in its evidence. Where it is not named yet (a
        server's copies alone, no cause), it is a slowdown being judged, as any first one."""
        first = s.active
        assert first is not None
        s.slow, s.deeper, s.active = s.deeper, [], None
        d = self._detect(s, base, host, peers)
        if d is not None:
            d.evidence["deepened_from"] = {
                "cause": first.cause,
                "ratio": round(first.ratio, 3),
                "onset_time_unix_nano": first.onset_ns,
            }
        return d

    def _refine(self, s: _Seen, base: float, host: HostWindow, peers: list[ProcWindow]) -> Diagnosis | None:
        """A window or two later, with more evidence: re-name an unknown or weakly named cause."""
        d = s.active
        assert d is not None
        cause, evidence = self._cause(s, self._over_slowdown(s, peers))
        if cause == d.cause or cause == "unknown":
            return None
        # Against the first name's score now, over the same windows: evidence that came later (a
        # memory limit's hits, read once a second) may withdraw it (its scorer then says 0).
        first_now = evidence.get("candidates", {}).get(d.cause, d.evidence.get("score", 0))
        if d.cause != "unknown" and evidence.get("score", 0) < first_now * MARGINS.rename:
            return None
        first = d.cause
        d.cause = cause
        d.evidence = {**{k: v for k, v in d.evidence.items() if k in _SYMPTOM_KEYS}, **evidence}
        d.evidence["first_named"] = first
        d.fix = _fix(cause, d.evidence)
        d.evidence.pop("fix_key", None)
        d.named_ns = host.end_ns + host.wall_offset_ns
        return d

    # ---- the cause ----

    def _remote(
        self,
        before: list[tuple[ProcWindow, HostWindow]],
        after: list[tuple[ProcWindow, HostWindow]],
        scores: list[tuple[float, str, dict[str, Any]]],
    ) -> list[tuple[float, str, dict[str, Any]]]:
        """Input starvation that is a wait for a peer across the network: the host's share grew
        while the process waited on a connection whose replies come late (its round trip over
        the slow windows stood well above its round trips in the baseline: TcpPath.queued).
        Named a straggler it waits for, as a rank that waits for a local peer is (evidence
        `waits_for_peer`): a rank whose exchange crosses
        a link flooded at the far side, a parameter server's client, a loader reading from a
        storage server behind a queue. Where its own link got busier (path_own_rise), the queue
        may be its own, filling: left to the NIC scorer, which names it as it fills (the fleet
        rig's flooded host's ranks were called waiting for their peers without this)."""
        w = after[-1][0]
        starved = next((t for t in scores if t[1] == "input_starvation" and t[0] >= MARGINS.named), None)
        if starved is None or any(c == "nic_contention" and sc >= MARGINS.named for sc, c, _e in scores):
            return scores
        if _own_link_rise(before, after) >= MARGINS.path_own_rise:
            return scores
        if w.tcp is None and self.tcp is not None:
            w.tcp = self.tcp(w.key)
            if w.tcp is None:  # said, not silent: the wait may be the network's (sources/tcp.py counts it)
                at = scores.index(starved)
                scores = [
                    *scores[:at],
                    (starved[0], starved[1], {**starved[2], "connections_read": False}),
                    *scores[at + 1 :],
                ]
                return scores

        # Each connection against its own round trips in the baseline (their median and highest:
        # the runtime reads them every TCP_EVERY windows), over the slow windows' readings.
        def readings(ws: list[tuple[ProcWindow, HostWindow]]) -> dict[int, list[int]]:
            out: dict[int, list[int]] = {}
            for x, _h in ws:
                for p in x.tcp or ():
                    out.setdefault(p.inode, []).append(p.srtt_us)
            return out

        base, slow = readings(before), readings(after)
        queued = []
        for p in w.tcp or ():
            if len(base.get(p.inode, ())) < MARGINS.path_baseline_reads:
                continue  # a connection new since the baseline, or too few readings: not judged
            now = replace(p, srtt_us=int(statistics.median(slow[p.inode])))
            b = statistics.median(base[p.inode])
            if now.queued(
                b, max(base[p.inode]), MARGINS.path_recent_ms, MARGINS.path_rtt_times, MARGINS.path_rtt_over_us
            ):
                queued.append((now, b))
        if not queued:
            return scores
        worst, b = max(queued, key=lambda t: t[0].srtt_us - t[1])
        ev = {
            **starved[2],
            "waits_for_peer": worst.peer,
            "round_trip_seconds": worst.srtt_us / 1e6,
            "baseline_round_trip_seconds": round(b / 1e6, 6),
            "least_round_trip_seconds": worst.min_rtt_us / 1e6,
            "queued_connections": len(queued),
            "fix_key": "straggler_remote",
        }
        return [t for t in scores if t is not starved] + [(starved[0], "straggler", ev)]

    def _cause(self, s: _Seen, peers: list[ProcWindow]) -> tuple[str, dict[str, Any]]:
        before = _guarded(list(s.normal_windows), MIN_JUDGE)
        after = s.slow
        scores: list[tuple[float, str, dict[str, Any]]] = []
        scorers = [self._cpu, self._gpu, self._pcie, self._memory, self._input, self._nic, self._straggler, _nvlink]
        if after[-1][0].serving:
            # A server idles between requests: its GPU's idle share is its load, not a starved input.
            scorers.remove(self._input)
        for fn in scorers:
            r = fn(before, after, peers)
            if r is not None:
                scores.append(r)
        if not scores:
            return "unknown", {"score": 0.0}
        scores = self._remote(before, after, scores)
        candidates: dict[str, float] = {}
        for sc, c, _ev in sorted(scores, key=lambda t: -t[0]):
            candidates.setdefault(c, round(sc, 3))  # a cause's best (two scorers may name a straggler)
        # A straggler is the job's cause: its peers wait for it (or this rank
        # waits for one). What slowed the straggler itself, if a signal says,
        # is its evidence: the fix is on that rank's host.
        straggler = [t for t in scores if t[1] == "straggler" and t[0] >= MARGINS.named]
        if straggler:
            score, cause, ev = straggler[0]
            own = max((t for t in scores if t[1] != "straggler"), key=lambda t: t[0], default=None)
            if own is not None and own[0] >= MARGINS.named and not ev.keys() & {"waits_for_pid", "waits_for_peer"}:
                ev = {**ev, "own_cause": own[1], "own_evidence": {k: v for k, v in own[2].items() if k != "fix_key"}}
            return cause, {"score": round(score, 3), **ev, "candidates": candidates}
        # Input starvation is what is left when the host's growing share has no signal of its own: where
        # the job's link saturated, its steps waited on the network, not on a loader (a ring exchange
        # or a parameter server's reply: the GPU idles meanwhile, as when input is slow).
        if any(c == "nic_contention" and sc >= MARGINS.named for sc, c, _e in scores):
            scores = [t for t in scores if t[1] != "input_starvation"]
        ranked = sorted(scores, key=lambda t: -t[0])
        score, cause, ev = ranked[0]
        if score < MARGINS.named:
            return "unknown", {
                "score": 0.0,
                "closest": cause,
                "closest_score": round(score, 3),
                "candidates": candidates,
            }
        if len(ranked) > 1 and ranked[1][0] >= MARGINS.named and score < AMBIGUOUS_WITHIN * ranked[1][0]:
            both = {c: {k: v for k, v in e.items() if k != "fix_key"} for _sc, c, e in ranked[:2]}
            fixes = [FIXES[e.get("fix_key", c)] for _sc, c, e in ranked[:2]]
            return "ambiguous", {
                "score": round(score, 3),
                "candidates": candidates,
                "evidence_of": both,
                "fix_key": fixes,
            }
        return cause, {"score": round(score, 3), **ev, "candidates": candidates}

    @staticmethod
    def _cpu(
        before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]], _p: list[ProcWindow]
    ) -> tuple[float, str, dict[str, Any]] | None:
        b, a = _cpu_share([w for w, _ in before]), _cpu_share([w for w, _ in after])
        sb, sa = _steal_share([w for w, _ in before]), _steal_share([w for w, _ in after])
        if (a is None or b is None) and (sa is None or sb is None):
            return None
        throttled = sum(w.quota_throttled_ns for w, _ in after)
        waits: dict[int, list[Any]] = {}
        for w, _ in after:
            for cg, (ns, path, comm) in w.preemptors.items():
                v = waits.setdefault(cg, [0, path, comm])
                v[0] += ns
        ev: dict[str, Any] = {}
        score = 0.0
        fix_key = "cpu_interference"
        if a is not None and b is not None:
            ev = {"run_queue_share_before": round(b, 4), "run_queue_share": round(a, 4)}
            score = (a - b) / MARGINS.runq_rise if a >= MARGINS.runq_times * b else 0.0
            if waits:
                cg, (ns, path, comm) = max(waits.items(), key=lambda kv: kv[1][0])
                if cg == 0:
                    ev["taken_by"] = "its own CPU quota (the CPU went idle while it waited)"
                    fix_key = "cpu_quota"
                else:
                    ev["taken_by"] = {"cgroup_id": cg, "cgroup": path, "process": comm}
        if sa is not None and sb is not None and sa > 0:
            # The hypervisor ran another VM on its CPUs: its task stayed on them (no run queue, no
            # preemptor), its work took longer. Its share of the process's time.
            ev["stolen_share_before"], ev["stolen_share"] = round(sb, 4), round(sa, 4)
            cpus = [w.steal_share for w, _ in after if w.steal_share is not None]
            ev["cpu_steal_share"] = round(sum(cpus) / len(cpus), 4)
            stolen = (sa - sb) / MARGINS.steal_rise if sa >= MARGINS.steal_times * sb else 0.0
            if stolen > score:
                score = stolen
                ev["taken_by"] = "the hypervisor: another VM on this machine (steal time)"
                fix_key = "cpu_steal"
        if throttled:
            ev["quota_throttled_seconds"] = throttled / 1e9
            ev["taken_by"] = "its own CPU quota"
            fix_key = "cpu_quota"
        ev["fix_key"] = fix_key
        if throttled:
            score = max(score, MARGINS.quota_score)
        return score, "cpu_interference", ev

    @staticmethod
    def _gpu(
        before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]], _p: list[ProcWindow]
    ) -> tuple[float, str, dict[str, Any]] | None:
        # Throttled in most slow windows and in few normal ones (the window the fault began in may
        # have been normal still: a share, not any).
        now: dict[str, set[str]] = {}
        idx: dict[str, int] = {}
        for uuid in {g.uuid for _, h in after for g in h.gpus}:
            if _share_of(after, uuid, lambda g: bool(g.throttled)) >= MARGINS.most and (
                _share_of(_before_onset(before, uuid), uuid, lambda g: bool(g.throttled)) <= MARGINS.few
            ):
                for _, h in after:
                    for g in h.gpus:
                        if g.uuid == uuid and g.throttled:
                            now.setdefault(uuid, set()).update(g.reasons)
                            idx[uuid] = g.index
        if not now:
            return None
        uuid, reasons = sorted(now.items())[0]
        return (
            MARGINS.reported,
            "gpu_throttling",
            {"gpu": idx[uuid], "uuid": uuid, "clock_event_reasons": sorted(reasons)},
        )

    @staticmethod
    def _pcie(
        before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]], _p: list[ProcWindow]
    ) -> tuple[float, str, dict[str, Any]] | None:
        for _, h in after[-1:]:
            for g in h.gpus:
                if (
                    _share_of(after, g.uuid, _narrow) >= MARGINS.most
                    and _share_of(before, g.uuid, _narrow) <= MARGINS.few
                ):
                    return (
                        MARGINS.reported,
                        "pcie_contention",
                        {
                            "gpu": g.index,
                            "link": f"gen{g.link_generation} x{g.link_width}",
                            "max_link": f"gen{g.max_link_generation} x{g.max_link_width}",
                            "degraded": True,
                        },
                    )
        replays_b = sum(g.replays or 0 for _, h in before for g in h.gpus) / max(len(before), 1)
        replays_a = sum(g.replays or 0 for _, h in after for g in h.gpus)
        if replays_a / len(after) > MARGINS.replays_times * replays_b and replays_a >= MARGINS.replays_per_window * len(
            after
        ):
            return (
                MARGINS.replays_score,
                "pcie_contention",
                {"pcie_replays": replays_a, "pcie_replays_per_window_before": replays_b},
            )
        # Copy bandwidth of this process fell while other processes' copies rose.
        own_b = _rate([w for w, _ in before])
        own_a = _rate([w for w, _ in after])
        if own_b is None or own_a is None or own_b <= 0:
            return None
        others_b, others_a = _others(before), _others(after)
        fell = 1 - own_a / own_b
        ev: dict[str, Any] = {
            "copy_bytes_per_second_before": round(own_b),
            "copy_bytes_per_second": round(own_a),
            "other_processes_copy_bytes_per_second_before": round(others_b),
            "other_processes_copy_bytes_per_second": round(others_a),
        }
        link = _link_rates(before, after)
        if link is not None:
            ev.update(gpu_pcie_bytes_per_second_before=round(link[0]), gpu_pcie_bytes_per_second=round(link[1]))
        if after[-1][0].serving:
            # A server's bandwidth follows its load's copy sizes (larger batches copy faster per
            # byte): its copies at equal size say what the link lost.
            slower = _copy_ratio([w for w, _ in before], [w for w, _ in after])
            if slower is not None:
                ev["copies_slower_at_equal_size"] = round(slower, 3)
                fell = max(fell, 1 - 1 / slower)
        if fell <= 0:
            return 0.0, "pcie_contention", ev
        # Its copy bandwidth fell while the others copy more (or start to).
        if others_a >= MARGINS.others_times * others_b and others_a > 0:
            return fell / MARGINS.copy_fell, "pcie_contention", ev
        # Or while its GPU's link carries more that memtrace does not trace (a process outside
        # `run`'s command, another container, GPUDirect): where the driver counts the link's bytes,
        # what they hold past every traced copy rose.
        # Device-to-device copies, which cross no link, count as traced: the untraced share is
        # never overstated.
        if link is None:
            return 0.0, "pcie_contention", ev
        traced_b, traced_a = _per_second(before, _all_copies) or 0.0, _per_second(after, _all_copies) or 0.0
        ub, ua = max(0.0, link[0] - traced_b), max(0.0, link[1] - traced_a)
        ev.update(untraced_pcie_bytes_per_second_before=round(ub), untraced_pcie_bytes_per_second=round(ua))
        if ua < MARGINS.untraced_times * ub or ua - ub < MARGINS.untraced_of_traced * traced_b or ua <= 0:
            return 0.0, "pcie_contention", ev
        return fell / MARGINS.copy_fell, "pcie_contention", ev

    @staticmethod
    def _memory(
        before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]], _p: list[ProcWindow]
    ) -> tuple[float, str, dict[str, Any]] | None:
        share_b, share_a = _stall_share(before), _stall_share(after)
        hits = _memory_limit_newly_hit(before, after)
        if (share_a is None or share_b is None) and hits is None:
            return None
        ev: dict[str, Any] = {}
        score = 0.0
        if share_a is not None and share_b is not None:
            ev.update(memory_stall_share_before=round(share_b, 4), memory_stall_share=round(share_a, 4))
            score = (share_a - share_b) / MARGINS.stall_rise
        if hits is not None:
            # Its own limit, newly hit while it slowed: the host work it waits for is
            # reclaim and refaults (on a v1 host barely in PSI's memory line).
            ev.update(limit_hits_per_second_before=round(hits[0], 1), limit_hits_per_second=round(hits[1], 1))
            score = max(score, MARGINS.limit_hits_score)
        return score, "host_memory_pressure", ev

    @staticmethod
    def _input(
        before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]], _p: list[ProcWindow]
    ) -> tuple[float, str, dict[str, Any]] | None:
        def idle_host(ws: list[tuple[ProcWindow, HostWindow]]) -> tuple[float, float]:
            steps = sum(w.step_ns for w, _ in ws)
            return _share(sum(w.gpu_idle_ns for w, _ in ws), steps), _share(sum(w.host_ns for w, _ in ws), steps)

        (ib, hb), (ia, ha) = idle_host(before), idle_host(after)
        cpu_b, cpu_a = _cpu_share([w for w, _ in before]), _cpu_share([w for w, _ in after])
        if (
            cpu_a is not None
            and cpu_b is not None
            and cpu_a - cpu_b >= MARGINS.host_starved
            and _runq_explains(before, after)
        ):
            return 0.0, "input_starvation", {}  # the host work slowed for want of a CPU: not the input
        stall_b, stall_a = _stall_share(before), _stall_share(after)
        if stall_a is not None and stall_b is not None and stall_a - stall_b >= MARGINS.host_starved:
            return 0.0, "input_starvation", {}  # the host work stalled on memory (reclaim, refaults): not the input
        if _memory_limit_newly_hit(before, after) is not None:
            return 0.0, "input_starvation", {}  # the same, at the job's own memory limit
        ev = {
            "gpu_idle_share_before": round(ib, 4),
            "gpu_idle_share": round(ia, 4),
            "host_share_before": round(hb, 4),
            "host_share": round(ha, 4),
        }
        unseen = _unseen_idle(before, after)
        if unseen is not None and unseen > ia:
            ev["gpu_idle_share_at_least"] = round(unseen, 4)
            ia = unseen
        return ((ia - ib) / MARGINS.idle_rise if ha > hb else 0.0), "input_starvation", ev

    @staticmethod
    def _nic(
        before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]], _p: list[ProcWindow]
    ) -> tuple[float, str, dict[str, Any]] | None:
        ns = after[-1][0].netns
        if ns is None:
            return None

        def links(ws: list[tuple[ProcWindow, HostWindow]]) -> dict[str, list[LinkWindow]]:
            out: dict[str, list[LinkWindow]] = {}
            for _, h in ws:
                for link in h.links:
                    if link.netns == ns and link.interface != "lo":
                        out.setdefault(link.interface, []).append(link)
            return out

        def per_step(ws: list[tuple[ProcWindow, HostWindow]], name: str) -> tuple[float, float] | None:
            """The link's mean utilization over the windows, and its busy time per step of the process."""
            busy = seconds = steps = 0.0
            for w, h in ws:
                for link in h.links:
                    if link.netns == ns and link.interface == name:
                        busy += (link.utilization or 0.0) * h.seconds
                        seconds += h.seconds
                        steps += w.steps
            return (busy / seconds, busy / steps) if steps and seconds else None

        lb, la = links(before), links(after)
        best: tuple[float, str, dict[str, Any]] | None = None
        for name, ws in la.items():
            pb, pa = per_step(before, name), per_step(after, name)
            per_step_over = pa[1] / pb[1] if pb and pa and pb[1] > 0 else None
            shared = _shared_link(pa[0], per_step_over) if pb and pa and per_step_over else 0.0
            bs = lb.get(name, [])
            held = sum(x.overlimits + x.drops for x in ws) / len(ws)
            held_b = sum(x.overlimits + x.drops for x in bs) / len(bs) if bs else 0.0
            util = max((x.utilization or 0.0) for x in ws)
            util_b = max(((x.utilization or 0.0) for x in bs), default=0.0)
            # Drops apart: a shaper the job's own exchange keeps busy holds thousands of packets a
            # window and drops none; a flow beside it overflows its queue (and TCP then backs off, so
            # fewer are held: the sum can fall while the drops climb from nothing).
            dropped = sum(x.drops for x in ws) / len(ws)
            dropped_b = sum(x.drops for x in bs) / len(bs) if bs else 0.0
            score = max(
                (util - util_b) / MARGINS.link_rise if util >= MARGINS.link_busy else 0.0,
                (held - held_b) / max(MARGINS.held_rise, MARGINS.held_over * held_b),
                (dropped - dropped_b) / max(MARGINS.held_rise, MARGINS.held_over * dropped_b),
                shared,
            )
            ev = {
                "interface": name,
                "utilization": round(util, 3),
                "utilization_before": round(util_b, 3),
                "held_or_dropped_per_window": held,
                "held_or_dropped_per_window_before": held_b,
                "dropped_per_window": dropped,
                "dropped_per_window_before": dropped_b,
            }
            if shared and per_step_over is not None:
                ev["link_time_per_step_over_baseline"] = round(per_step_over, 3)
            if best is None or score > best[0]:
                best = (score, "nic_contention", ev)
        return best

    @staticmethod
    def _straggler(
        before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]], peers: list[ProcWindow]
    ) -> tuple[float, str, dict[str, Any]] | None:
        # Itself over the slowdown, as its peers are (_over_slowdown): its last window alone may be
        # one in which it made no step (a checkpoint's serialisation).
        me = _summed(after[-1][0], [w for w, _ in after])
        # Its peers: its job's other ranks (observe) that step and make collectives.
        others = [p for p in peers if p.key != me.key and p.steps and p.collective_ns]
        if not others or not any(w.collective_ns for w, _ in before):
            return None

        def per_step(ws: list[ProcWindow]) -> tuple[float, float]:
            steps = sum(w.steps for w in ws)
            return (sum(w.step_ns for w in ws) / steps, sum(w.collective_ns for w in ws) / steps) if steps else (0, 0)

        def coll_share(w: ProcWindow) -> float:
            return _share(w.collective_ns, w.step_ns)

        (step_b, coll_b), (step_a, coll_a) = per_step([w for w, _ in before]), per_step([w for w, _ in after])
        grew = step_a - step_b
        if grew <= 0:
            return 0.0, "straggler", {}
        waited = (coll_a - coll_b) / grew  # the share of its extra step time spent waiting in collectives
        ev: dict[str, Any] = {
            "collective_seconds_per_step_before": round(coll_b / 1e9, 6),
            "collective_seconds_per_step": round(coll_a / 1e9, 6),
        }
        # A rank whose run queue grew by most of its step's growth (MARGINS.host_starved_of_growth)
        # waits for its CPU: starved of it, it is woken late in its collectives too, and that lands
        # in their time, so only their growth past its run queue's is a wait for a peer (a CI run's
        # fleet rig: the rank a hog sat on was said to wait for its neighbour, and its fleet left
        # it out). A rank that waits for a peer on a busy host has its run queue grow too, by less
        # (the zoo's slow rank's peers): its waits are taken whole, as before.
        starved = _runq_growth(before, after)
        if starved is not None and starved >= MARGINS.host_starved_of_growth * grew:
            ev["run_queue_growth_seconds_per_step"] = round(starved / 1e9, 6)
            waited = max(coll_a - coll_b - starved, 0.0) / grew
        # It waits for a peer: most of its step's growth is time in collectives, and a peer
        # spends a smaller share of the (shared) step there: the one it waits for. If every
        # rank waits alike, the collectives themselves slowed (their network): no straggler.
        slow = min(others, key=coll_share)
        if waited >= MARGINS.waited and coll_share(me) - coll_share(slow) >= MARGINS.share_gap:
            return waited / MARGINS.waited, "straggler", {**ev, "waits_for_pid": slow.key.pid}
        # The peers wait for it: they spend a larger share of their steps in collectives than it does
        # now (ranks in lockstep share one step time), while its own growth is not waiting.
        mine, theirs = coll_share(me), statistics.median(coll_share(p) for p in others)
        if waited <= MARGINS.not_waiting and theirs - mine >= MARGINS.share_gap:
            return (
                (theirs - mine) / MARGINS.share_gap,
                "straggler",
                {**ev, "collective_share": round(mine, 4), "peers_collective_share": round(theirs, 4)},
            )
        return 0.0, "straggler", ev


def _own_link_rise(before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]]) -> float:
    """How much the process's own busiest link's mean utilization rose, from the baseline's
    windows to the slow ones (its namespace's links but lo; 0 where none is known)."""
    ns = after[-1][0].netns

    def mean(ws: list[tuple[ProcWindow, HostWindow]]) -> dict[str, float]:
        busy: dict[str, list[float]] = {}
        for _w, h in ws:
            for x in h.links:
                if x.netns == ns and x.interface != "lo" and x.utilization is not None:
                    busy.setdefault(x.interface, []).append(x.utilization)
        return {k: sum(v) / len(v) for k, v in busy.items()}

    b, a = mean(before), mean(after)
    return max((a[k] - b[k] for k in a.keys() & b.keys()), default=0.0)


def _fix(cause: str, evidence: dict[str, Any]) -> str:
    """The fix of a cause (or of the variant its scorer named: fix_key); an
    ambiguous diagnosis's is each candidate's, in the order they scored."""
    key = evidence.get("fix_key", cause)
    if isinstance(key, list):
        return FIXES["ambiguous"] + ": " + "; or ".join(key)
    return FIXES.get(key, FIXES["unknown"])


_SYMPTOM_KEYS = (
    "baseline_step_seconds",
    "step_seconds",
    "unit",
    "iterations",
    "busy_over_baseline",
    "copies_over_baseline",
    "deepened_from",
)


def _job_of(w: ProcWindow) -> tuple[str, int]:
    """A process's job: its launcher's job identity, or its executable and parent."""
    return (w.job, -1) if w.job else (w.exe or w.name, w.ppid)


def _share_of(ws: list[tuple[ProcWindow, HostWindow]], uuid: str, pred: Callable[[GpuWindow], bool]) -> float:
    """The share of these windows in which this GPU met pred."""
    seen = [pred(g) for _, h in ws for g in h.gpus if g.uuid == uuid]
    return sum(seen) / len(seen) if seen else 0.0


def _before_onset(before: list[tuple[ProcWindow, HostWindow]], uuid: str) -> list[tuple[ProcWindow, HostWindow]]:
    """The normal windows before this GPU's throttling began: without their last ones throttled
    where those are at most MARGINS.onset_windows (a throttle that began a few windows before the
    slowdown, whose windows were not slow enough to hold out: an evaluation's shorter steps, a
    slowdown under 1.2x at first). A throttle longer than that is a standing one: all are kept."""

    def throttled(h: HostWindow) -> bool:
        return any(g.uuid == uuid and g.throttled for g in h.gpus)

    tail = 0
    while tail < len(before) and throttled(before[-1 - tail][1]):
        tail += 1
    return before[:-tail] if 0 < tail <= MARGINS.onset_windows and tail < len(before) else before


def _narrow(g: GpuWindow) -> bool:
    return g.link_width is not None and g.max_link_width is not None and g.link_width < g.max_link_width


_W = TypeVar("_W")


def _guarded(normal: list[_W], least: int) -> list[_W]:
    """A baseline less its last ONSET_GUARD windows, where more than `least` stay: what a
    slowdown's signals are weighed against (a fault shows on the host before the steps feel it)."""
    return normal[:-ONSET_GUARD] if len(normal) > ONSET_GUARD + least else normal


def _reported(g: GpuWindow) -> bool:
    """A fault the GPU reports outright: throttling, or its link trained narrower."""
    return bool(g.throttled) or _narrow(g)


def _newly_reported(s: _Seen, w: ProcWindow, h: HostWindow) -> bool:
    """The process's GPU (the one NVML lists it on, or the host's only GPU) reports a fault
    (_reported) in this window, in at most MARGINS.few of its normal windows: one that began
    now, not a standing one."""
    mine = [g for g in h.gpus if w.key.pid in g.pids] or (h.gpus if len(h.gpus) == 1 else [])
    return any(_reported(g) and _share_of(list(s.normal_windows), g.uuid, _reported) <= MARGINS.few for g in mine)


def _link_rates(
    before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]]
) -> tuple[float, float] | None:
    """What the driver counted on the process's GPU's PCIe link, bytes per second before and
    after: all traffic on it, traced or not. Its GPU: the one NVML lists it on, or the host's only
    GPU; None when that is not one GPU with byte counters in every window."""
    pid = after[-1][0].key.pid
    gpus = after[-1][1].gpus
    mine = [g.uuid for g in gpus if pid in g.pids] or [g.uuid for g in gpus if len(gpus) == 1]
    if len(mine) != 1:
        return None

    def link(_w: ProcWindow, h: HostWindow) -> int | None:
        return next((g.pcie_bytes for g in h.gpus if g.uuid == mine[0]), None)

    if any(link(w, h) is None for w, h in (*before, *after)):
        return None
    b, a = _per_second(before, link), _per_second(after, link)
    return None if b is None or a is None else (b, a)


def _all_copies(_w: ProcWindow, h: HostWindow) -> int:
    """Bytes every traced process copied in the window."""
    return sum(h.copy_bytes.values())


def _rate(ws: list[ProcWindow]) -> float | None:
    ns = sum(w.copy_ns for w in ws)
    return sum(w.copy_bytes for w in ws) / (ns / 1e9) if ns else None


def _others(ws: list[tuple[ProcWindow, HostWindow]]) -> float:
    """Bytes per second the other traced processes copied in these windows."""
    return _per_second(ws, lambda w, h: _all_copies(w, h) - h.copy_bytes.get(w.key, 0)) or 0.0


def _nvlink(
    before: list[tuple[ProcWindow, HostWindow]], after: list[tuple[ProcWindow, HostWindow]], _p: list[ProcWindow]
) -> tuple[float, str, dict[str, Any]] | None:
    """nvlink_contention: the NVLinks of the process's GPU (the one NVML lists it on, or the host's
    only GPU) went down or began to count errors, or carry others' traffic while its collectives
    slowed. None: its GPU has no NVLink readings."""
    pid = after[-1][0].key.pid
    gpus = after[-1][1].gpus
    mine = [g for g in gpus if pid in g.pids] or (gpus if len(gpus) == 1 else [])
    mine = [g for g in mine if g.nvlink_bytes is not None or g.nvlinks_down or g.nvlink_errors is not None]
    if not mine:
        return None
    for g in mine:

        def down(x: GpuWindow) -> bool:
            return x.nvlinks_down > 0

        if _share_of(after, g.uuid, down) >= MARGINS.most and _share_of(before, g.uuid, down) <= MARGINS.few:
            return (
                MARGINS.reported,
                "nvlink_contention",
                {"gpu": g.index, "uuid": g.uuid, "nvlinks_down": g.nvlinks_down},
            )

    def on(uuid: str, what: Callable[[GpuWindow], int | None]) -> Callable[[ProcWindow, HostWindow], int | None]:
        return lambda _w, h: next((what(x) for x in h.gpus if x.uuid == uuid), None)

    for g in mine:
        eb = _per_second(before, on(g.uuid, lambda x: x.nvlink_errors)) or 0.0
        ea = _per_second(after, on(g.uuid, lambda x: x.nvlink_errors)) or 0.0
        n_after = sum(on(g.uuid, lambda x: x.nvlink_errors)(w, h) or 0 for w, h in after)
        if ea > MARGINS.nvlink_errors_times * eb and n_after >= MARGINS.nvlink_errors_per_window * len(after):
            ev = {"gpu": g.index, "uuid": g.uuid, "nvlink_errors": n_after, "nvlink_errors_per_second_before": eb}
            return MARGINS.nvlink_errors_score, "nvlink_contention", ev
    # Contention: most of its step's growth is time in collectives, while its GPU's links carry half
    # again as many bytes a second as before, though it makes fewer steps: the extra is others'.
    steps_b, steps_a = sum(w.steps for w, _ in before), sum(w.steps for w, _ in after)
    if not steps_b or not steps_a:
        return None
    step_b = sum(w.step_ns for w, _ in before) / steps_b
    step_a = sum(w.step_ns for w, _ in after) / steps_a
    coll_b = sum(w.collective_ns for w, _ in before) / steps_b
    coll_a = sum(w.collective_ns for w, _ in after) / steps_a
    grew = step_a - step_b
    waited = (coll_a - coll_b) / grew if grew > 0 else 0.0
    g = mine[0]
    rate_b = _per_second(before, on(g.uuid, lambda x: x.nvlink_bytes))
    rate_a = _per_second(after, on(g.uuid, lambda x: x.nvlink_bytes))
    if rate_b is None or rate_a is None:
        return None
    ev = {
        "gpu": g.index,
        "uuid": g.uuid,
        "collective_seconds_per_step_before": round(coll_b / 1e9, 6),
        "collective_seconds_per_step": round(coll_a / 1e9, 6),
        "nvlink_bytes_per_second_before": round(rate_b),
        "nvlink_bytes_per_second": round(rate_a),
    }
    if waited < MARGINS.nvlink_waited or rate_a < MARGINS.nvlink_times * rate_b or rate_a <= 0:
        return 0.0, "nvlink_contention", ev
    return waited / MARGINS.nvlink_waited, "nvlink_contention", ev
