"""Cgroups with limits, made by the tests and by bench/diagnose (a CPU
quota, a memory limit): in the unified hierarchy where the controller is
there, else in the controller's v1 hierarchy."""

from __future__ import annotations

from pathlib import Path

from memtrace.sources.cgroup import cgroup2_root, cgroup_v1_root


def make_limited(controller: str, v2: dict[str, str], v1: dict[str, str], name: str) -> Path | None:
    """A new cgroup `name` of `controller`, its limit files written (`v2` or
    `v1`, whichever hierarchy it is made in); None where this host has no
    such controller."""
    root = cgroup2_root()
    if root is not None and controller in (root / "cgroup.controllers").read_text().split():
        (root / "cgroup.subtree_control").write_text(f"+{controller}")
        limits = v2
    else:
        v1_root = cgroup_v1_root(controller)
        if v1_root is None:
            return None
        root, limits = v1_root, v1
    d = root / name
    d.mkdir()
    for f, value in limits.items():
        (d / f).write_text(value)
    return d
