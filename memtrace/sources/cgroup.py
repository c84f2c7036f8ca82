"""Cgroups, for the CPU sensor's answers: the name of a cgroup the sensor saw
by id, and a process's CPU quota and throttling (cgroup v2 or v1).

A cgroup v2 id is the inode number of its directory in the cgroup2 mount, so
naming one is a walk of that tree. Throttling is read from ``cpu.stat`` of the
process's cpu cgroup and of each ancestor: a quota anywhere above the process
throttles it too, but is counted only where it is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
MOUNTS = Path("/proc/mounts")


def _mounts(mounts: Path = MOUNTS) -> list[tuple[str, str, list[str]]]:
    out = []
    for line in mounts.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out.append((parts[2], parts[1].replace("\\040", " "), parts[3].split(",")))
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


def cpu_quotas(pid: int, mounts: Path = MOUNTS, proc: Path = PROC) -> list[CpuQuota]:
    """The process's cpu cgroup and its ancestors (own first, the root left out):
    their quotas and throttling. Empty if the process is gone or has no cpu cgroup."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return []
    v1 = v2 = None
    for line in lines:
        hid, ctrls, path = line.split(":", 2)
        if hid == "0" and ctrls == "":
            v2 = path
        elif "cpu" in ctrls.split(","):
            v1 = path
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
    out = []
    p = Path(rel)
    while str(p) not in ("/", "."):
        q = read(base, str(p))
        if q is not None:
            out.append(q)
        p = p.parent
    return out
