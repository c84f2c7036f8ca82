"""The CPU sensor: run-queue latency, off-CPU and on-CPU time, context switches
and who took the CPU, per traced process, from the scheduler's tracepoints."""

from memtrace.sensors.sched.abi import SLOTS, SchedStat
from memtrace.sensors.sched.sensor import CpuStats, Preemptor, SchedSensor, object_path

__all__ = ["SLOTS", "CpuStats", "Preemptor", "SchedSensor", "SchedStat", "object_path"]
