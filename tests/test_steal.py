"""Steal time (sources/steal.py): each CPU's from /proc/stat, and a process's
share of a window from the CPUs it may run on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memtrace.sources.steal import Steal, parse, share

STAT = """cpu  2675977 20773 541824 5835953 13699 0 98047 82758 0 0
cpu0 1264307 10492 256749 3005808 5720 0 62035 40892 0 0
cpu1 1411670 10280 285074 2830144 7978 0 36011 41865 0 0
cpu2 1411670 10280 285074 2830144 7978 0 36011
intr 1 2 3
"""


def test_each_cpus_steal_is_its_eighth_column_in_ns() -> None:
    assert parse(STAT, 10_000_000) == {0: 408_920_000_000, 1: 418_650_000_000}  # cpu2: no steal column


def test_a_process_is_charged_the_mean_steal_of_the_cpus_it_may_run_on() -> None:
    before = {0: 0, 1: 0, 2: 0}
    after = {0: 500_000_000, 1: 100_000_000, 2: 0}
    assert share(before, after, {0}, 1.0) == pytest.approx(0.5)
    assert share(before, after, {0, 1}, 1.0) == pytest.approx(0.3)
    assert share(before, after, {1, 2}, 0.5) == pytest.approx(0.1)
    assert share(before, after, {7}, 1.0) is None and share(before, after, {0}, 0.0) is None


def test_the_reader_reads_this_hosts_proc_stat_again_and_again(tmp_path: Path) -> None:
    f = tmp_path / "stat"
    f.write_text(STAT)
    r = Steal(f)
    tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    assert r.read() == {0: 40892 * tick, 1: 41865 * tick}
    f.write_text(STAT.replace("40892", "40992"))  # the same file, new content (as /proc/stat is)
    assert r.read() == {0: 40992 * tick, 1: 41865 * tick}
    live = Steal().read()
    assert live is not None and set(live) == set(range(os.cpu_count() or 0))
    f.unlink()
    r.close()
    assert Steal(f).read() is None
