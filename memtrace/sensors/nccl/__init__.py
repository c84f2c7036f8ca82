"""The NCCL sensor: uprobes on libnccl.so.2's collectives and group calls."""

from memtrace.sensors.nccl.sensor import NcclSensor

__all__ = ["NcclSensor"]
