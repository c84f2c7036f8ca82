"""The memory pressure the live diagnosis reads: PSI twice a second
(sources/psi.py: one file kept open and read again from its start, which
must give what a fresh read gives, hold one descriptor, and come back when
the file does), and how often a job's own memory cgroup reclaims at its
limit (sources/cgroup.py), in a real cgroup."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import limited_cgroup, remove_cgroup

from memtrace.sources.cgroup import memory_limit_hits
from memtrace.sources.psi import PROC, Stall


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def some_total(text: str) -> int:
    line = next(x for x in text.splitlines() if x.startswith("some "))
    return int(line.rsplit("total=", 1)[1])


@pytest.mark.skipif(not (PROC / "cpu").exists(), reason="this kernel has no PSI")
def test_a_held_pressure_file_reads_what_a_fresh_read_does_on_one_descriptor() -> None:
    """Read through a kept descriptor while the total moves (more busy
    loops than CPUs: tasks wait for a CPU, so the cpu line's total grows),
    each reading is the file's as of then: never less than a fresh read
    just before, and it moves on. The memory line is read the same way."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range((os.cpu_count() or 1) + 2)]
    try:
        before = fds()
        s = Stall("cpu")
        first = s.read_us()
        readings = []
        for _ in range(5):
            fresh = some_total((PROC / "cpu").read_text())
            mine = s.read_us()
            assert mine is not None and fresh <= mine
            readings.append(mine)
            time.sleep(0.1)
        assert first is not None and readings == sorted(readings) and readings[-1] > first
        assert fds() == before + 1  # one descriptor, kept
        s.close()
        s.close()
        assert fds() == before
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def test_a_missing_pressure_file_reads_none_and_is_opened_once_it_is_there(tmp_path: Path) -> None:
    p = tmp_path / "memory.pressure"
    s = Stall(path=p)
    assert s.read_us() is None
    p.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=10\n")
    assert s.read_us() == 1234
    s.close()


@pytest.mark.root
def test_a_job_reading_past_its_memory_limit_is_counted_hitting_it(tmp_path: Path) -> None:
    """A process reads a 128 MiB file (on disk, page cache charged to it)
    over and over in a cgroup limited to 32 MiB: its limit is hit, and
    counted for it. (At 8 MiB the interpreter's own allocations in the
    cgroup met its OOM killer once in a CI run, under Python 3.13.)"""
    data = tmp_path / "dataset"
    data.write_bytes(os.urandom(128 << 20))
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys\n"
            "print('ready', flush=True); sys.stdin.readline()\n"
            f"fd = os.open({str(data)!r}, os.O_RDONLY)\n"
            "os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # its pages charged to it anew\n"
            "for _ in range(4):\n"
            "    while os.read(fd, 1 << 20): pass\n"
            "    os.lseek(fd, 0, 0)\n"
            "print('done', flush=True); sys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    d = limited_cgroup("memory", {"memory.max": str(32 << 20)}, {"memory.limit_in_bytes": str(32 << 20)})
    try:
        assert reader.stdout is not None and reader.stdin is not None
        assert reader.stdout.readline().strip() == "ready"
        (d / "cgroup.procs").write_text(str(reader.pid))
        before = memory_limit_hits(reader.pid)  # its new cgroup's, and those above it
        assert before is not None
        reader.stdin.write("go\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "done"
        after = memory_limit_hits(reader.pid)
        assert after is not None and after > before, (before, after)
    finally:
        reader.kill()
        reader.wait()
        remove_cgroup(d)
