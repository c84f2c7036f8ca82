"""memtrace/sensors/sched/abi.py mirrors bpf/sched.h: a C program compiled
against the header prints every size, offset and constant, and they must
agree. The shipped sched objects are the ones the sources build, and carry
the programs and options the loader expects."""

from __future__ import annotations

import ctypes
import json
import subprocess

import pytest
from conftest import REPO
from elftools.elf.elffile import ELFFile

from memtrace.bpf.host import rodata_options
from memtrace.sensors.sched import abi
from memtrace.sensors.sched.sensor import PROGRAMS, object_path, quantile_us

PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include <linux/types.h>
#include "sched.h"
#define S(t) printf("\"sizeof %s\": %zu,\n", #t, sizeof(struct t))
#define O(t, f) printf("\"%s.%s\": %zu,\n", #t, #f, offsetof(struct t, f))
#define C(x) printf("\"%s\": %lld,\n", #x, (long long)(x))
int main(void) {
  printf("{\n");
  S(sc_proc); O(sc_proc, runq_hist); O(sc_proc, offcpu_hist); O(sc_proc, runq_ns); O(sc_proc, offcpu_ns);
  O(sc_proc, oncpu_ns); O(sc_proc, nvcsw); O(sc_proc, nivcsw); O(sc_proc, cgroup_id);
  O(sc_proc, execs); O(sc_proc, moves);
  S(sc_proc_key); O(sc_proc_key, start_ns); O(sc_proc_key, tgid); O(sc_proc_key, pad);
  S(sc_preempt_key); O(sc_preempt_key, cgroup_id); O(sc_preempt_key, start_ns); O(sc_preempt_key, tgid);
  O(sc_preempt_key, pad);
  S(sc_preempt); O(sc_preempt, count); O(sc_preempt, wait_ns); O(sc_preempt, tgid); O(sc_preempt, comm);
  O(sc_preempt, kthread); O(sc_preempt, votes); O(sc_preempt, pad);
  C(SC_STAT_SWITCHES); C(SC_STAT_PROCS_FULL); C(SC_STAT_THREADS_FULL); C(SC_STAT_PREEMPT_FULL);
  C(SC_STAT_UNTRACKED); C(SC_STAT_UNSEEN); C(SC_T_RUNNING); C(SC_T_QUEUED); C(SC_T_PREEMPTED); C(SC_T_BLOCKED);
  C(SC_STAT_COUNT); C(SC_COMM_LEN); C(SC_FILTER_BITS); C(SC_FILTER_WORDS);
  printf("\"SC_SLOTS\": %d\n}\n", SC_SLOTS);
  return 0;
}
"""


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    d = tmp_path_factory.mktemp("sched_abi")
    (d / "probe.c").write_text(PROBE)
    subprocess.run(["cc", "-I", str(REPO / "bpf"), "-o", str(d / "probe"), str(d / "probe.c")], check=True)
    return dict(json.loads(subprocess.run([str(d / "probe")], capture_output=True, text=True, check=True).stdout))


def test_map_structs_match(header: dict[str, int]) -> None:
    for cls, cname in (
        (abi.ProcKey, "sc_proc_key"),
        (abi.Proc, "sc_proc"),
        (abi.PreemptKey, "sc_preempt_key"),
        (abi.Preempt, "sc_preempt"),
    ):
        assert ctypes.sizeof(cls) == header[f"sizeof {cname}"], cname
        fields = [f for f, *_ in cls._fields_ if f"{cname}.{f}" in header]
        assert len(fields) == sum(1 for k in header if k.startswith(f"{cname}.")), cname
        for f in fields:
            assert getattr(cls, f).offset == header[f"{cname}.{f}"], (cname, f)


def test_constants_and_enums_match(header: dict[str, int]) -> None:
    assert header["SC_SLOTS"] == abi.SLOTS
    assert header["SC_COMM_LEN"] == abi.COMM_LEN
    assert header["SC_FILTER_BITS"] == abi.FILTER_BITS
    assert header["SC_FILTER_WORDS"] == abi.FILTER_WORDS
    for s in abi.SchedStat:
        assert header[f"SC_STAT_{s.name}"] == s.value
    assert header["SC_STAT_COUNT"] == abi.STAT_COUNT == len(abi.SchedStat)
    for t in abi.ThreadState:
        assert header[f"SC_T_{t.name}"] == t.value


@pytest.mark.parametrize("arch", ["x86", "arm64"])
def test_objects_carry_btf_the_programs_and_the_options(arch: str) -> None:
    path = object_path(arch)
    with open(path, "rb") as f:
        e = ELFFile(f)
        assert e["e_machine"] == "EM_BPF"
        names = {s.name for s in e.iter_sections()}
        progs = {s.name for s in e.get_section_by_name(".symtab").iter_symbols() if s["st_info"]["type"] == "STT_FUNC"}
    assert {".BTF", ".BTF.ext", ".maps", "tp_btf/sched_switch", "tp_btf/sched_wakeup"} <= names
    assert set(PROGRAMS) <= progs
    assert "filter_pids" in rodata_options(path)


def test_quantiles_interpolate_inside_log2_slots() -> None:
    hist = tuple([0] * 12 + [10] + [0] * 13)  # ten waits in [4096, 8192) us
    assert quantile_us(hist, 0.5) == 4096 + 4096 * 0.5
    assert quantile_us(tuple([0] * abi.SLOTS), 0.5) is None
