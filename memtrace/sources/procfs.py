"""OTLP resource attributes for a traced process: who it is, where it runs.

container.id and k8s.pod.uid come from the process's cgroup path, which
names both under every common runtime (containerd, CRI-O, Docker; cgroupfs
and systemd drivers). Values are sanitised so that odd process names cannot
break an exporter or a backend's label rules.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

from memtrace.core.ids import ProcessInfo

_CONTAINER = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
MAX_VALUE = 128


def clean(value: str, limit: int = MAX_VALUE) -> str:
    """Printable, bounded, never empty."""
    s = "".join(c if c.isprintable() else "?" for c in value)[:limit]
    return s or "?"


def from_cgroup(text: str) -> dict[str, str]:
    """container.id and k8s.pod.uid from /proc/PID/cgroup contents."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            m = _CONTAINER.search(part)
            if m and "container.id" not in out:
                out["container.id"] = m.group(1)
            p = _POD.search(part)
            if p and "k8s.pod.uid" not in out:
                out["k8s.pod.uid"] = p.group(1).replace("_", "-")
    return out


def host_attributes(env: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    attrs = {"host.name": clean(socket.gethostname())}
    node = env.get("NODE_NAME", "").strip()
    if node:
        attrs["k8s.node.name"] = clean(node)
    return attrs


def process_attributes(pid: int, name: str = "", exe: str = "", proc: Path = Path("/proc")) -> dict[str, str | int]:
    attrs: dict[str, str | int] = {"process.pid": pid}
    exe_name = os.path.basename(exe) if exe else name
    if exe_name:
        attrs["process.executable.name"] = clean(exe_name)
    try:
        attrs.update(from_cgroup((proc / str(pid) / "cgroup").read_text()))
    except OSError:
        pass
    return attrs


def process_start_ticks(pid: int) -> int:
    """When a process started, in clock ticks since boot (/proc/PID/stat), 0 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def boot_ticks_now() -> int:
    """Now, in the clock ticks /proc/PID/stat counts process starts in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def start_ns_of(ticks: int) -> int:
    """Wall-clock time of a start in ticks since boot (0 if unknown)."""
    if not ticks:
        return 0
    boot_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return boot_ns + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def process_start_ns(pid: int) -> int:
    """Wall-clock start of a process, 0 if gone."""
    return start_ns_of(process_start_ticks(pid))


def read_process(pid: int, proc: Path = Path("/proc")) -> ProcessInfo:
    """Read what identifies a process now: it may be gone by export time."""
    name = exe = ""
    try:
        name = (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        pass
    try:
        exe = str((proc / str(pid) / "exe").readlink())
    except OSError:
        pass
    ticks = process_start_ticks(pid)
    return ProcessInfo(name, exe, ticks, start_ns_of(ticks), process_attributes(pid, name, exe, proc))
