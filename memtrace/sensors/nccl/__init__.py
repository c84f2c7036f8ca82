"""The NCCL sensor: uprobes on libnccl.so.2's collectives and group calls.
The runtime reaches it through this face alone."""

from memtrace.sensors.nccl.discovery import is_nccl, mapped_nccl
from memtrace.sensors.nccl.sensor import NcclSensor

__all__ = ["NcclSensor", "is_nccl", "mapped_nccl"]
