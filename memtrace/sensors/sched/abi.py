"""Mirror of bpf/sched.h (checked against the header by tests/test_sched_abi.py)."""

from __future__ import annotations

import ctypes
import enum

SLOTS = 26
COMM_LEN = 16
FILTER_BITS = 65536
FILTER_WORDS = FILTER_BITS // 64


class ProcKey(ctypes.Structure):
    """struct sc_proc_key: a process, its tgid and its start (the key of `procs`)."""

    _fields_ = [("start_ns", ctypes.c_uint64), ("tgid", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class Proc(ctypes.Structure):
    _fields_ = [
        ("runq_hist", ctypes.c_uint64 * SLOTS),
        ("offcpu_hist", ctypes.c_uint64 * SLOTS),
        ("runq_ns", ctypes.c_uint64),
        ("offcpu_ns", ctypes.c_uint64),
        ("oncpu_ns", ctypes.c_uint64),
        ("nvcsw", ctypes.c_uint64),
        ("nivcsw", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("execs", ctypes.c_uint64),
        ("moves", ctypes.c_uint64),
        ("stolen_ns", ctypes.c_uint64),
    ]


class PreemptKey(ctypes.Structure):
    _fields_ = [
        ("cgroup_id", ctypes.c_uint64),
        ("start_ns", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class Preempt(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_uint64),
        ("wait_ns", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("comm", ctypes.c_char * COMM_LEN),
        ("kthread", ctypes.c_uint32),
        ("votes", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class SchedStat(enum.IntEnum):
    """The sensor's health counters (enum sc_stat)."""

    SWITCHES = 0
    PROCS_FULL = 1
    THREADS_FULL = 2
    PREEMPT_FULL = 3
    UNTRACKED = 4
    UNSEEN = 5


STAT_COUNT = 6


class ThreadState(enum.IntEnum):
    """enum sc_tstate: the state kept per traced thread."""

    RUNNING = 1
    QUEUED = 2
    PREEMPTED = 3
    BLOCKED = 4
