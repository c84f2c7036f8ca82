"""The fast host sampler: NIC counters and NVML's instantaneous readings at 100 Hz, on a C thread.

Python cannot sample at 100 Hz cheaply: its timer loop alone costs more than
the 0.5% of a core the whole host sampling may use (bench/host_sampling.py).
So the readings whose value is in their resolution run in C
(memtrace/native/fastsample.c, built with the package as
memtrace._fastsample and called through ctypes, as libbpf is): each
interface's rtnl_link_stats64 (RTM_GETSTATS), folded into its busiest
tick's rates, and each GPU's clock-event reasons, folded into the ticks that
were throttled, with its utilisation at 10 Hz at most (NVML's utilisation
is the share of its own sample period, 1/6 s to 1 s, that kernels ran:
reading it faster reads the same value again) into sums and maxima. The runtime takes the
folded rows at its own slower rate (`take()`), with the counters as they
stood at the last tick; what is cumulative or queued (the counters' totals,
qdisc drops, XIDs) loses nothing at that rate and is read in Python.

The sampler reads only what the runtime hands it: a netlink socket opened
inside each namespace to sample (the C side keeps a duplicate) and the NVML
handles from nvidia-ml-py, with that library's own dlopen handle so the
very libnvidia-ml nvidia-ml-py loaded is called.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from dataclasses import dataclass

from memtrace.core import native
from memtrace.core.errors import MemtraceError

DEFAULT_RATE_HZ = 100.0


class FastSamplerUnavailable(MemtraceError):
    """The C sampler is not built: host readings are taken in Python, at the slower rate."""


class IfRow(ctypes.Structure):
    _fields_ = [
        ("netns", ctypes.c_uint64),
        ("ifindex", ctypes.c_int32),
        ("ticks", ctypes.c_uint32),
        ("time_ns", ctypes.c_uint64),
        ("counters", ctypes.c_uint64 * 8),
        ("peak_rx_bytes_per_s", ctypes.c_double),
        ("peak_tx_bytes_per_s", ctypes.c_double),
    ]


class GpuRow(ctypes.Structure):
    _fields_ = [
        ("slot", ctypes.c_uint32),
        ("ticks", ctypes.c_uint32),
        ("util_ticks", ctypes.c_uint32),
        ("clock_ticks", ctypes.c_uint32),
        ("throttled_ticks", ctypes.c_uint32),
        ("sm_max", ctypes.c_uint32),
        ("mem_max", ctypes.c_uint32),
        ("sm_last", ctypes.c_uint32),
        ("mem_last", ctypes.c_uint32),
        ("last_error", ctypes.c_int32),
        ("sm_sum", ctypes.c_uint64),
        ("mem_sum", ctypes.c_uint64),
        ("mask_or", ctypes.c_uint64),
        ("mask_last", ctypes.c_uint64),
        ("time_ns", ctypes.c_uint64),
        ("errors", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        ("ticks", ctypes.c_uint64),
        ("late", ctypes.c_uint64),
        ("net_errors", ctypes.c_uint64),
        ("cpu_ns", ctypes.c_uint64),
        ("last_errno", ctypes.c_int32),
        ("interfaces_dropped", ctypes.c_uint32),
        ("ring_wakes", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class IfWindow:
    """One interface since the previous take: its counters at the last tick and its busiest tick."""

    netns: int
    index: int
    ticks: int
    time_ns: int
    counters: tuple[int, ...]  # rx/tx packets, rx/tx bytes, rx/tx errors, rx/tx dropped
    peak_rx_bytes_per_s: float
    peak_tx_bytes_per_s: float


@dataclass(frozen=True)
class GpuFast:
    """One GPU's fast readings since the previous take."""

    slot: int
    ticks: int
    util_ticks: int
    clock_ticks: int
    throttled_ticks: int
    sm_mean: float | None
    mem_mean: float | None
    sm_max: int
    mem_max: int
    mask: int | None  # every clock-event reason seen (None: no reading)
    errors: int
    last_error: int
    time_ns: int


@dataclass(frozen=True)
class FastWindow:
    interfaces: dict[tuple[int, int], IfWindow]  # (netns inode, ifindex) ->
    gpus: dict[int, GpuFast]  # slot ->
    ticks: int  # since the sampler started
    late: int
    net_errors: int
    last_errno: int
    interfaces_dropped: int
    cpu_ns: int  # the sampling thread's CPU time since it started
    ring_wakes: int  # times it woke the watched ring's reader (watch_ring)

    def of_namespace(self, inode: int) -> dict[int, IfWindow]:
        return {w.index: w for (ns, _i), w in self.interfaces.items() if ns == inode and w.time_ns}


def _prototypes(lib: ctypes.CDLL) -> None:
    u64, i32, vp = ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p
    lib.mt_fast_open.argtypes, lib.mt_fast_open.restype = [u64, u64], vp
    lib.mt_fast_add_netns.argtypes, lib.mt_fast_add_netns.restype = [vp, u64, i32], i32
    lib.mt_fast_remove_netns.argtypes, lib.mt_fast_remove_netns.restype = [vp, u64], i32
    lib.mt_fast_set_gpus.argtypes, lib.mt_fast_set_gpus.restype = [vp, vp, ctypes.POINTER(vp), i32], i32
    lib.mt_fast_start.argtypes, lib.mt_fast_start.restype = [vp], i32
    lib.mt_fast_watch_ring.argtypes, lib.mt_fast_watch_ring.restype = [vp, i32, vp, vp, u64, i32], i32
    lib.mt_fast_take.argtypes = [
        vp,
        ctypes.POINTER(IfRow),
        i32,
        ctypes.POINTER(i32),
        ctypes.POINTER(GpuRow),
        i32,
        ctypes.POINTER(i32),
        ctypes.POINTER(Stats),
    ]
    lib.mt_fast_take.restype = i32
    lib.mt_fast_close.argtypes, lib.mt_fast_close.restype = [vp], None
    lib.mt_fast_ticks.argtypes, lib.mt_fast_ticks.restype = [vp], u64
    lib.mt_fast_set_period.argtypes, lib.mt_fast_set_period.restype = [vp, u64], u64
    lib.mt_fast_set_read_every.argtypes, lib.mt_fast_set_read_every.restype = [vp, ctypes.c_uint32], None
    lib.mt_fast_sizes.argtypes, lib.mt_fast_sizes.restype = [ctypes.POINTER(ctypes.c_uint32)], None


def _library() -> tuple[ctypes.CDLL, tuple[int, int]]:
    """The C sampler's library and the most interface and GPU rows it holds."""
    try:
        lib = native.library()
    except native.NativeUnavailable as e:
        raise FastSamplerUnavailable(
            f"{e.reason}: NIC and GPU readings are taken in Python at the host interval, not at 100 Hz", e.fix
        ) from e
    try:
        _prototypes(lib)
    except AttributeError as e:  # a library built from another version of this file
        raise FastSamplerUnavailable(
            f"memtrace's C sampler does not match this version ({e})",
            "reinstall memtrace so the C sampler is built from the same source",
        ) from e
    sizes = (ctypes.c_uint32 * 5)()
    lib.mt_fast_sizes(sizes)
    mine = (ctypes.sizeof(IfRow), ctypes.sizeof(GpuRow), ctypes.sizeof(Stats))
    if tuple(sizes[:3]) != mine:
        raise FastSamplerUnavailable(
            f"memtrace's C sampler does not match this version (row sizes {tuple(sizes[:3])}, expected {mine})",
            "reinstall memtrace so the C sampler is built from the same source",
        )
    return lib, (int(sizes[3]), int(sizes[4]))


def _check(err: int, what: str) -> None:
    if err:
        raise OSError(err, f"fast sampler: {what}: {os.strerror(err)}")


class FastSampler:
    """One C sampling thread. Configure (add_netns, set_gpus) before or after start(); poll() from one thread."""

    name = "fast"

    def __init__(self, rate_hz: float = DEFAULT_RATE_HZ, throttle_mask: int = 0) -> None:
        if not 1 <= rate_hz <= 1000:
            raise MemtraceError(f"a fast sampling rate of {rate_hz:g} Hz is out of range", "give 1 to 1000 Hz")
        self._lib, (max_ifs, max_gpus) = _library()
        self.rate_hz = rate_hz
        self.read_hz = rate_hz  # the NICs and GPUs read each tick (set_rate's read_hz)
        self._handle = self._lib.mt_fast_open(int(1e9 / rate_hz), throttle_mask)
        if not self._handle:
            raise MemtraceError("the fast sampler could not allocate its state", "free some memory")
        # Room for every row the C side can hold: a take copies them all.
        self._ifs = (IfRow * max_ifs)()
        self._gpus = (GpuRow * max_gpus)()
        self._stats = Stats()
        self._n_if = ctypes.c_int()
        self._n_gpu = ctypes.c_int()

    def _open(self) -> int:
        """The C state's address; OSError once closed (a NULL would crash the agent)."""
        if not self._handle:
            raise OSError(errno.EBADF, "fast sampler: closed")
        return int(self._handle)

    def add_netns(self, inode: int, sock: socket.socket) -> None:
        """Sample the namespace whose rtnetlink socket this is (the caller may close its own afterwards)."""
        _check(self._lib.mt_fast_add_netns(self._open(), inode, sock.fileno()), f"netns {inode}")

    def remove_netns(self, inode: int) -> None:
        if self._handle:
            self._lib.mt_fast_remove_netns(self._handle, inode)

    def set_gpus(self, nvml_library: int, handles: list[int]) -> None:
        """Read these NVML device handles (pointer values) through the libnvidia-ml loaded at nvml_library."""
        arr = (ctypes.c_void_p * max(1, len(handles)))(*handles)
        _check(self._lib.mt_fast_set_gpus(self._open(), nvml_library, arr, len(handles)), "GPUs")

    def start(self) -> None:
        _check(self._lib.mt_fast_start(self._open()), "thread")

    def set_rate(self, rate_hz: float, read_hz: float | None = None) -> float:
        """Tick at rate_hz (1 to 1000) from the tick after the one now awaited, watching the
        rings each tick and reading the NICs and GPUs at read_hz (None: each tick); returns
        the rate in force (read_hz in force: self.read_hz)."""
        if not 1 <= rate_hz <= 1000:
            raise ValueError(f"a fast sampling rate of {rate_hz:g} Hz is out of range (1 to 1000 Hz)")
        if read_hz is not None and not 0 < read_hz <= rate_hz:
            raise ValueError(f"a reading rate of {read_hz:g} Hz is out of range (above 0, at most {rate_hz:g} Hz)")
        handle = self._open()
        period = int(self._lib.mt_fast_set_period(handle, int(1e9 / rate_hz)))
        self.rate_hz = 1e9 / period
        every = 1 if read_hz is None else max(1, round(self.rate_hz / read_hz))
        self._lib.mt_fast_set_read_every(handle, every)
        self.read_hz = self.rate_hz / every
        return self.rate_hz

    def watch_ring(self, slot: int, cons: int, prod: int, nbytes: int, eventfd: int) -> None:
        """Each tick, write 1 to `eventfd` (duplicated) if the ring whose
        consumer and producer positions are at the addresses `cons` and
        `prod` holds `nbytes` or more unread. Two rings at most (slot 0 and
        1). The positions' memory must stay mapped until unwatch_ring(slot)
        or close() returns."""
        if not cons or not prod or nbytes <= 0:
            raise ValueError("watch_ring needs both positions' addresses and a positive size")
        _check(self._lib.mt_fast_watch_ring(self._open(), slot, cons, prod, nbytes, eventfd), f"ring watch {slot}")

    def unwatch_ring(self, slot: int) -> None:
        """Stop watching a slot (no-op once closed): on return the thread reads its positions no more."""
        if self._handle:
            self._lib.mt_fast_watch_ring(self._handle, slot, None, None, 0, -1)

    def ticks(self) -> int:
        """Ticks done since start(), leaving the window as it is."""
        return int(self._lib.mt_fast_ticks(self._open()))

    def poll(self) -> FastWindow:
        """Every row folded since the previous take; their windows start again."""
        self._lib.mt_fast_take(
            self._open(),
            self._ifs,
            len(self._ifs),
            ctypes.byref(self._n_if),
            self._gpus,
            len(self._gpus),
            ctypes.byref(self._n_gpu),
            ctypes.byref(self._stats),
        )
        ifs = {}
        for r in self._ifs[: self._n_if.value]:
            ifs[(r.netns, r.ifindex)] = IfWindow(
                r.netns,
                r.ifindex,
                r.ticks,
                r.time_ns,
                tuple(r.counters),
                r.peak_rx_bytes_per_s,
                r.peak_tx_bytes_per_s,
            )
        gpus = {}
        for g in self._gpus[: min(self._n_gpu.value, len(self._gpus))]:
            gpus[g.slot] = GpuFast(
                slot=g.slot,
                ticks=g.ticks,
                util_ticks=g.util_ticks,
                clock_ticks=g.clock_ticks,
                throttled_ticks=g.throttled_ticks,
                sm_mean=g.sm_sum / g.util_ticks if g.util_ticks else None,
                mem_mean=g.mem_sum / g.util_ticks if g.util_ticks else None,
                sm_max=g.sm_max,
                mem_max=g.mem_max,
                mask=g.mask_or if g.clock_ticks else None,
                errors=g.errors,
                last_error=g.last_error,
                time_ns=g.time_ns,
            )
        s = self._stats
        return FastWindow(
            ifs, gpus, s.ticks, s.late, s.net_errors, s.last_errno, s.interfaces_dropped, s.cpu_ns, s.ring_wakes
        )

    def close(self) -> None:
        if self._handle:
            self._lib.mt_fast_close(self._handle)
            self._handle = None

    def __enter__(self) -> FastSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
