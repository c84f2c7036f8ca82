"""`memtrace doctor`: can this host run memtrace, and if not, what to fix."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from memtrace.core.errors import MemtraceError
from memtrace.core.procfiles import pids
from memtrace.export.text import say
from memtrace.sensors.cuda import layer_of, mapped_libraries

MIN_KERNEL = (5, 15)  # bpf_cookie for uprobes (5.15), ring buffers, tp_btf
PROVEN_KERNEL = (6, 1)  # the oldest kernel the tests boot (tests/test_kernels.py)
TESTED_KERNELS = "Debian 6.1 (arm64 and x86-64, booted by the tests under qemu) and 6.18 (x86-64)"
BTF = Path("/sys/kernel/btf/vmlinux")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False  # a problem that does not stop memtrace


def kernel_version(release: str | None = None) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release or platform.release())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def check_kernel(release: str | None = None, arch: str | None = None) -> Check:
    v = kernel_version(release)
    arch = arch or platform.machine()
    ok = v >= MIN_KERNEL and arch in ("x86_64", "aarch64")
    detail = f"Linux {release or platform.release()} on {arch}"
    if ok and v < PROVEN_KERNEL:
        return Check(
            "kernel",
            True,
            detail + f": supported, but older than any kernel memtrace is proven on ({TESTED_KERNELS})",
            "if totals look wrong here, run the portability tests (tests/test_kernels.py) on this kernel",
            warn=True,
        )
    return Check(
        "kernel",
        ok,
        detail,
        f"memtrace needs Linux {MIN_KERNEL[0]}.{MIN_KERNEL[1]} or newer (uprobe bpf_cookie) on x86_64 or "
        f"aarch64; proven on {TESTED_KERNELS}",
    )


def check_btf() -> Check:
    ok = BTF.exists()
    return Check(
        "BTF",
        ok,
        str(BTF) if ok else f"{BTF} is missing",
        "use a kernel built with CONFIG_DEBUG_INFO_BTF=y",
    )


def check_privileges() -> Check:
    from memtrace.bpf.host import CAP_BPF, CAP_KILL, CAP_PERFMON, CAP_SYS_ADMIN, can_load_bpf, effective_caps

    caps = effective_caps()
    names = [
        n
        for n, bit in (
            ("CAP_SYS_ADMIN", CAP_SYS_ADMIN),
            ("CAP_BPF", CAP_BPF),
            ("CAP_PERFMON", CAP_PERFMON),
            ("CAP_KILL", CAP_KILL),
        )
        if (caps >> bit) & 1
    ]
    ok = can_load_bpf(caps)
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    return Check(
        "privileges",
        ok,
        f"{who} with {', '.join(names) or 'no relevant capabilities'}",
        "run as root, or grant CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN and CAP_KILL",
    )


def check_libbpf() -> Check:
    try:
        from memtrace.bpf.libbpf import Libbpf

        lib = Libbpf.get()
        return Check("libbpf", True, f"{lib.path} version {lib.version[0]}.{lib.version[1]}")
    except MemtraceError as e:
        return Check("libbpf", False, e.message, e.fix)


def check_tracefs() -> Check:
    from memtrace.bpf.host import TRACEFS

    try:
        mounted = (TRACEFS / "events").is_dir()
    except PermissionError:
        # Only root may look inside tracefs; memtrace itself runs as root.
        return Check(
            "tracefs",
            True,
            f"{TRACEFS} cannot be read as uid {os.geteuid()}",
            "run memtrace (and this check) as root",
            warn=True,
        )
    if mounted:
        return Check("tracefs", True, f"mounted at {TRACEFS}")
    return Check(
        "tracefs",
        True,
        f"not mounted at {TRACEFS}; memtrace mounts it when it starts (needs CAP_SYS_ADMIN)",
        "or mount it yourself: mount -t tracefs nodev /sys/kernel/tracing",
        warn=True,
    )


def check_load() -> Check:
    """Load (not attach) the real object: the verifier's verdict on this kernel."""
    try:
        from memtrace.bpf.host import object_path
        from memtrace.bpf.libbpf import BpfObject

        path = object_path()
        obj = BpfObject(path)
        try:
            obj.load()
        finally:
            obj.close()
        return Check("BPF programs", True, f"{path.name} loads on this kernel")
    except MemtraceError as e:
        return Check("BPF programs", False, e.message, e.fix)


def check_uprobe_multi() -> Check:
    """Multi-uprobe links (Linux 6.6+): a library's probes attach and go in
    one operation each way; without them, one by one."""
    from memtrace.bpf.libbpf import uprobe_multi_supported

    if uprobe_multi_supported():
        return Check(
            "uprobes",
            True,
            "multi-uprobe links: a library's probes are attached and removed at once, and the overhead budget "
            "is kept (launch probes per process, sampled)",
        )
    return Check(
        "uprobes",
        True,
        "single uprobes (this kernel has no multi-uprobe links, or MEMTRACE_UPROBE_MULTI=0): a library's "
        "hundred probes are removed one by one, about 0.1 s each, after an agent exits, and processes "
        "mapping it take their traps until then; the overhead budget is reported, not kept (sampling "
        "launch probes needs links attached and removed in milliseconds)",
        "Linux 6.6 or later attaches and removes them at once",
        warn=True,
    )


SLOW_TRAP_S = 2e-6  # over twice what a GPU host's trap costs (docs/design/evidence.md#trap-cost)


def check_probe_cost() -> Check:
    """Time what one probe's trap costs a process here (runtime/overhead.py),
    and keep the figure for the agents that start within the hour."""
    from memtrace.bpf.host import object_path
    from memtrace.bpf.libbpf import BpfObject
    from memtrace.core.overhead import EntryKind
    from memtrace.runtime.overhead import calibrate, save_cached

    try:
        obj = BpfObject(object_path())
        try:
            obj.load()
            cost, links = calibrate(obj)
            for link in links:
                link.destroy()
        finally:
            obj.close()
    except MemtraceError as e:
        return Check("probe cost", False, f"cannot time a probe: {e.message}", e.fix)
    save_cached(cost)
    # Judged at the kind CUDA's entry points are (push first: emulated) where it could be timed.
    timed = (
        cost.by_kind.get(EntryKind.EMULATED) or cost.by_kind.get(EntryKind.STEPPED) or next(iter(cost.by_kind.values()))
    )
    us, pair_us = timed.entry_seconds * 1e6, timed.pair_seconds * 1e6
    where = " at an entry the kernel emulates, as CUDA's (a push)" if timed.kind == EntryKind.EMULATED.value else ""
    stepped = cost.by_kind.get(EntryKind.STEPPED)
    also = (
        f"; {stepped.entry_seconds * 1e6:.1f} us at one it single-steps (endbr64, mov)"
        if stepped is not None and stepped is not timed
        else ""
    )
    detail = (
        f"a trap costs {us:.1f} us here{where}, {pair_us:.1f} us with its return{also}. The traced process pays "
        f"it per launch, copy, memory call and wait: at 10,000 launches/s, {us * 1e4 / 1e6:.1%} of a core"
    )
    if timed.entry_seconds <= SLOW_TRAP_S:
        return Check("probe cost", True, detail)
    return Check(
        "probe cost",
        True,
        detail,
        "traps are slow on this machine (a VM?): launch-heavy processes pay more here; `memtrace run` and "
        "`top --detail` show each process's overhead, and --overhead-budget samples launch probes to keep it",
        warn=True,
    )


def check_pid_namespace() -> Check:
    """memtrace names processes as its own pid namespace does; /proc must agree."""
    from memtrace.bpf.host import pid_namespace

    try:
        _, ino = pid_namespace()
    except MemtraceError as e:
        return Check("pid namespace", False, e.message, e.fix)
    if not ino:
        return Check("pid namespace", True, "the host's: every process on the host is seen")
    return Check(
        "pid namespace",
        True,
        f"not the host's (pid:[{ino}]): memtrace sees and holds only the processes of this namespace",
        "to trace the whole host, run memtrace in the host's pid namespace (hostPID: true for the DaemonSet)",
        warn=True,
    )


def find_cuda_libraries() -> list[str]:
    found: set[str] = set()
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            path = line.rsplit("=>", 1)[-1].strip()
            if layer_of(path) is not None:
                found.add(path)
    except (OSError, subprocess.SubprocessError):
        pass
    for pid in pids():
        for c in mapped_libraries(pid):
            found.add(c.name)
    return sorted(found)


def check_cuda() -> Check:
    libs = find_cuda_libraries()
    if libs:
        return Check("CUDA libraries", True, ", ".join(libs[:6]) + (" ..." if len(libs) > 6 else ""))
    return Check(
        "CUDA libraries",
        True,
        "none found on the library path or in running processes",
        "memtrace attaches when a process loads libcuda.so or libcudart.so; nothing to trace yet",
        warn=True,
    )


def check_nvml() -> Check:
    """GPU signals (PCIe, utilisation, throttling, ECC, XIDs, GPM activity, NVLink) come from NVML; copy
    tracing does not need it."""
    from memtrace.sources.nvml import NvmlSource, NvmlUnavailable

    try:
        source = NvmlSource.connect()
    except NvmlUnavailable as e:
        return Check("NVML", True, e.message, e.fix, warn=True)
    try:
        n, counted = source.gpu_count, source.pcie_counted_gpus
        pcie = ""
        if n and counted == n:
            pcie = "; PCIe bytes from driver counters (exact)"
        elif n and counted:
            pcie = f"; PCIe bytes from driver counters on {counted} of {n} GPUs, NVML 20 ms estimates on the rest"
        elif n:
            pcie = "; PCIe throughput as NVML 20 ms estimates (exact byte counters need driver 555 or later)"
        gpm = source.gpm_gpus
        if n and gpm == n:
            activity = "; SM, tensor and DRAM activity from GPM"
        elif n and gpm:
            activity = f"; SM, tensor and DRAM activity from GPM on {gpm} of {n} GPUs (the rest are older than Hopper)"
        elif n:
            activity = "; no GPM (GPUs older than Hopper): SM, tensor and DRAM activity are not measured"
        else:
            activity = ""
        links = source.nvlink_count
        nvlink = f"; {links} NVLink{'' if links == 1 else 's'}" if links else ""
        detail = f"driver {source.driver_version}, {n} GPU{'' if n == 1 else 's'}{pcie}{activity}{nvlink}"
        return Check("NVML", True, detail)
    finally:
        source.close()


def check_netlink() -> Check:
    """NIC signals (interface counters, qdisc queues, link speed) come from rtnetlink."""
    from memtrace.bpf.host import CAP_SYS_ADMIN, effective_caps
    from memtrace.sources.netdev import NetdevSource, NetlinkUnavailable

    why: list[NetlinkUnavailable] = []
    source = NetdevSource.open(report=why.append)
    if source is None:
        return Check("netlink", True, why[0].message, why[0].fix, warn=True)
    try:
        snap = source.poll()
    finally:
        source.close()
    if snap.errors:
        return Check(
            "netlink", True, "; ".join(snap.errors), "run memtrace as root in the host network namespace", True
        )
    n = len(snap.interfaces)
    speeds = sum(i.speed_bits_per_s is not None for i in snap.interfaces)
    detail = f"{n} interface{'' if n == 1 else 's'} here ({speeds} with a known link speed)"
    if not (effective_caps() >> CAP_SYS_ADMIN) & 1:
        return Check(
            "netlink",
            True,
            detail + "; cannot enter other network namespaces (pods)",
            "grant CAP_SYS_ADMIN to see the interfaces of traced processes in other network namespaces",
            warn=True,
        )
    return Check("netlink", True, detail)


def check_fast_sampler() -> Check:
    """memtrace's C helpers: the thread that reads NICs and GPUs at 100 Hz
    and the events ring's reader; without them NICs and GPUs are read at the
    host interval and the ring by numpy (the same figures, more CPU)."""
    from memtrace.sources.fastsample import FastSampler, FastSamplerUnavailable

    try:
        with FastSampler():
            return Check(
                "fast sampler",
                True,
                "built: NICs and GPUs are read at up to 1 kHz (--host-rate), the events ring in C",
            )
    except FastSamplerUnavailable as e:
        return Check("fast sampler", True, e.message + "; the events ring is read by numpy", e.fix, warn=True)


CHECKS: list[Callable[[], Check]] = [
    check_kernel,
    check_btf,
    check_privileges,
    check_libbpf,
    check_tracefs,
    check_pid_namespace,
    check_load,
    check_uprobe_multi,
    check_probe_cost,
    check_cuda,
    check_nvml,
    check_netlink,
    check_fast_sampler,
]


def run_checks(console: Console) -> bool:
    ok = True
    for fn in CHECKS:
        try:
            c = fn()
        except OSError as e:  # a non-root user cannot read everything a check looks at
            c = Check(fn.__name__.removeprefix("check_"), False, f"could not check: {e}", "run as root")
        # A failed prerequisite makes the load check's message redundant.
        if fn in (check_load, check_uprobe_multi, check_probe_cost) and not ok:
            continue
        mark = (
            "[green]  ok[/green]" if c.ok and not c.warn else ("[yellow]warn[/yellow]" if c.ok else "[red]FAIL[/red]")
        )
        say(console, f"{mark}  [bold]{c.name}[/bold]:", c.detail)
        if c.fix and (not c.ok or c.warn):
            say(console, "fix:", c.fix, lead=6, indent=11)
        ok &= c.ok
    console.print("memtrace can run here." if ok else "memtrace cannot run here until the failures above are fixed.")
    return ok
