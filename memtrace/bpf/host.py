"""What the host must offer to load memtrace's BPF objects: the arch's
object, BTF, privileges, tracefs; and the object's load-time options.
"""

from __future__ import annotations

import os
import platform
from importlib import resources
from pathlib import Path

from memtrace.bpf.libbpf import BpfObject, RodataVar
from memtrace.core.errors import BTFMissing, MemtraceError, NotPrivileged, ProcMismatch, TracefsMissing

ARCHES = {"x86_64": "x86", "aarch64": "arm64", "arm64": "arm64"}
TRACEFS = Path("/sys/kernel/tracing")
BTF_PATH = Path("/sys/kernel/btf/vmlinux")


def bpf_arch() -> str:
    m = platform.machine()
    if m not in ARCHES:
        raise MemtraceError(f"unsupported architecture {m}", "memtrace runs on x86_64 and aarch64")
    return ARCHES[m]


def object_path(arch: str | None = None) -> Path:
    return Path(str(resources.files("memtrace") / "bpf" / f"memtrace.{arch or bpf_arch()}.bpf.o"))


def rodata_options(path: Path) -> dict[str, RodataVar]:
    """The object's `const volatile` options (offset, size, signedness),
    from its BTF as libbpf reads it; opening an object loads nothing."""
    obj = BpfObject(path)
    try:
        return obj.rodata_vars()
    finally:
        obj.close()


def ensure_tracefs() -> None:
    if (TRACEFS / "events").is_dir():
        return
    import subprocess

    r = subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True, text=True)
    if r.returncode != 0 or not (TRACEFS / "events").is_dir():
        raise TracefsMissing(r.stderr.strip() or "mount failed")


CAP_KILL, CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 5, 21, 38, 39


def effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def can_load_bpf(caps: int) -> bool:
    """CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON (uprobes are perf events)."""
    return bool((caps >> CAP_SYS_ADMIN) & 1 or ((caps >> CAP_BPF) & 1 and (caps >> CAP_PERFMON) & 1))


def check_kernel() -> None:
    if not BTF_PATH.exists():
        raise BTFMissing()
    # Root without capabilities (a dropped bounding set, a restricted
    # container) is as unprivileged as anyone: look at what is effective.
    if not can_load_bpf(effective_caps()):
        raise NotPrivileged("loading BPF programs")


_INIT_PIDNS_INO = 0xEFFFFFFC  # PROC_PID_INIT_INO: the host's pid namespace


def pid_namespace() -> tuple[int, int]:
    """(nsfs dev in the kernel's encoding, inode) of this process's pid
    namespace, or (0, 0) for the host's. Raises ProcMismatch when /proc
    belongs to another pid namespace (pids read there would be wrong)."""
    st = os.stat("/proc/self/ns/pid")
    try:
        proc_self = int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        proc_self = -1
    if proc_self != os.getpid():
        raise ProcMismatch(os.getpid(), proc_self)
    if st.st_ino == _INIT_PIDNS_INO:
        return 0, 0
    return (os.major(st.st_dev) << 20) | os.minor(st.st_dev), st.st_ino
