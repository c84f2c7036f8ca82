"""Cgroups, for the CPU sensor's answers: the name of a cgroup the sensor saw
by id, and a process's CPU quota and throttling (cgroup v2 or v1).

A cgroup v2 id is the inode number of its directory in the cgroup2 mount, so
naming one is a walk of that tree. Throttling is read from ``cpu.stat`` of the
process's cpu cgroup and of each ancestor: a quota anywhere above the process
throttles it too, but is counted only where it is set.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
MOUNTS = Path("/proc/mounts")


MOUNTS_TTL_S = 10.0  # cgroup hierarchies are mounted at boot; each second's quota and memory reads share one look
_mounts_seen: dict[Path, tuple[float, list[tuple[str, str, list[str]]]]] = {}


def _mounts(mounts: Path = MOUNTS) -> list[tuple[str, str, list[str]]]:
    now = time.monotonic()
    seen = _mounts_seen.get(mounts)
    if seen is not None and now - seen[0] < MOUNTS_TTL_S:
        return seen[1]
    out = []
    for line in mounts.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out.append((parts[2], parts[1].replace("\\040", " "), parts[3].split(",")))
    _mounts_seen[mounts] = (now, out)
    return out


def cgroup2_root(mounts: Path = MOUNTS) -> Path | None:
    """Where the unified (v2) hierarchy is mounted, if it is."""
    for fstype, where, _ in _mounts(mounts):
        if fstype == "cgroup2":
            return Path(where)
    return None


def cgroup_v1_root(controller: str, mounts: Path = MOUNTS) -> Path | None:
    for fstype, where, opts in _mounts(mounts):
        if fstype == "cgroup" and controller in opts:
            return Path(where)
    return None


class CgroupNames:
    """cgroup v2 id -> path (relative to the mount, "/" for the root), cached."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else cgroup2_root()
        self._cache: dict[int, str] = {}

    def _scan(self) -> None:
        if self.root is None:
            return
        for dirpath, _dirs, _files in os.walk(self.root):
            try:
                ino = os.stat(dirpath).st_ino
            except OSError:
                continue
            rel = "/" + os.path.relpath(dirpath, self.root)
            self._cache[ino] = "/" if rel == "/." else rel

    def path(self, cgroup_id: int) -> str | None:
        """The cgroup's path, or None if it is gone (or was never in this mount)."""
        if cgroup_id not in self._cache:
            self._scan()
        return self._cache.get(cgroup_id)


def cgroup_id(path: str, root: Path | None = None) -> int | None:
    """The v2 id of a cgroup path (relative to the mount)."""
    base = root if root is not None else cgroup2_root()
    if base is None:
        return None
    try:
        return os.stat(base / path.lstrip("/")).st_ino
    except OSError:
        return None


@dataclass(frozen=True)
class CpuQuota:
    """One cpu cgroup's quota and how often it throttled its tasks."""

    path: str  # relative to the cpu hierarchy's mount
    version: int  # 1 or 2
    quota_us: int | None  # None: no limit
    period_us: int
    nr_periods: int
    nr_throttled: int
    throttled_ns: int


def _read_int(p: Path) -> int | None:
    try:
        return int(p.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _kv(p: Path) -> dict[str, int]:
    out = {}
    try:
        text = p.read_text()
    except OSError:
        return {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


def _quota_v2(base: Path, rel: str) -> CpuQuota | None:
    d = base / rel.lstrip("/")
    try:
        quota, period = (d / "cpu.max").read_text().split()
    except (OSError, ValueError):
        quota, period = "max", "100000"
    st = _kv(d / "cpu.stat")
    if not st:
        return None
    return CpuQuota(
        path=rel,
        version=2,
        quota_us=None if quota == "max" else int(quota),
        period_us=int(period),
        nr_periods=st.get("nr_periods", 0),
        nr_throttled=st.get("nr_throttled", 0),
        throttled_ns=st.get("throttled_usec", 0) * 1000,
    )


def _quota_v1(base: Path, rel: str) -> CpuQuota | None:
    d = base / rel.lstrip("/")
    st = _kv(d / "cpu.stat")
    if not st:
        return None
    quota = _read_int(d / "cpu.cfs_quota_us")
    return CpuQuota(
        path=rel,
        version=1,
        quota_us=None if quota is None or quota < 0 else quota,
        period_us=_read_int(d / "cpu.cfs_period_us") or 100000,
        nr_periods=st.get("nr_periods", 0),
        nr_throttled=st.get("nr_throttled", 0),
        throttled_ns=st.get("throttled_time", 0),
    )


def read_cgroups(pid: int, proc: Path = PROC) -> str | None:
    """/proc/PID/cgroup's text (read once a second for both the quota and the
    memory limit: pass it to each); None if the process is gone."""
    try:
        return (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None


def _cgroup_of(
    pid: int, controller: str, proc: Path = PROC, text: str | None = None
) -> tuple[str | None, str | None] | None:
    """The process's cgroup in `controller`'s v1 hierarchy and in the unified
    one (/proc/PID/cgroup, or its `text` already read), None for either it
    has no line in; None if it is gone."""
    if text is None:
        text = read_cgroups(pid, proc)
        if text is None:
            return None
    v1 = v2 = None
    for line in text.splitlines():
        hid, ctrls, path = line.split(":", 2)
        if hid == "0" and ctrls == "":
            v2 = path
        elif controller in ctrls.split(","):
            v1 = path
    return v1, v2


def cpu_cgroup(text: str) -> str | None:
    """The cgroup a /proc/PID/cgroup text charges the process's CPU to: its
    v1 cpu hierarchy's where the host has one (a hybrid host's unified
    hierarchy then holds no controller), else its unified (v2) path; None:
    neither."""
    v1, v2 = _cgroup_of(0, "cpu", text=text) or (None, None)
    return v1 if v1 is not None else v2


def cpu_quotas(pid: int, mounts: Path = MOUNTS, proc: Path = PROC, cgroups: str | None = None) -> list[CpuQuota]:
    """The process's cpu cgroup and its ancestors (own first, the root left out):
    their quotas and throttling. Empty if the process is gone or has no cpu cgroup.
    `cgroups`: its /proc/PID/cgroup text, if already read (read_cgroups)."""
    paths = _cgroup_of(pid, "cpu", proc, cgroups)
    if paths is None:
        return []
    v1, v2 = paths
    if v1 is not None:
        base = cgroup_v1_root("cpu", mounts)
        read = _quota_v1
        rel = v1
    else:
        base = cgroup2_root(mounts)
        read = _quota_v2
        rel = v2 or "/"
    if base is None:
        return []
    return [q for path in _chain(rel) if (q := read(base, path)) is not None]


def _chain(rel: str) -> list[str]:
    """A cgroup path and its ancestors, own first, the root left out."""
    out, p = [], Path(rel)
    while str(p) not in ("/", "."):
        out.append(str(p))
        p = p.parent
    return out


def memory_limit_hits(pid: int, mounts: Path = MOUNTS, proc: Path = PROC, cgroups: str | None = None) -> int | None:
    """How often the process's memory cgroup, or one above it, has had to
    reclaim at its limit so far: cgroup v2 memory.events `high` + `max`, or
    v1 memory.failcnt, summed over the chain (a pod's limit is on the pod's
    cgroup, above the container's). A job thrashing its page cache under
    its limit shows here first: it stalls on refaults and reads (I/O), and
    barely in PSI's memory line on a v1 host. 0 for a process under no
    limit (the root cgroup); None if it is gone or this host has no memory
    controller. `cgroups`: its /proc/PID/cgroup text, if already read."""
    paths = _cgroup_of(pid, "memory", proc, cgroups)
    if paths is None:
        return None
    v1, v2 = paths
    total = 0
    if v1 is not None:
        v1_base = cgroup_v1_root("memory", mounts)
        if v1_base is None:
            return None
        for rel in _chain(v1):
            total += _read_int(v1_base / rel.lstrip("/") / "memory.failcnt") or 0
        return total
    base = cgroup2_root(mounts)
    if base is None or v2 is None or "memory" not in _controllers(base):
        return None
    for rel in _chain(v2):
        ev = _kv(base / rel.lstrip("/") / "memory.events")
        total += ev.get("high", 0) + ev.get("max", 0)
    return total


_controllers_seen: dict[Path, tuple[float, list[str]]] = {}


def _controllers(root: Path) -> list[str]:
    """The unified hierarchy's controllers (looked at every MOUNTS_TTL_S, as the mounts are)."""
    now = time.monotonic()
    seen = _controllers_seen.get(root)
    if seen is not None and now - seen[0] < MOUNTS_TTL_S:
        return seen[1]
    try:
        names = (root / "cgroup.controllers").read_text().split()
    except OSError:
        names = []
    _controllers_seen[root] = (now, names)
    return names
