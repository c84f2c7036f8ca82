"""The CUDA sensor: uprobes on the runtime and driver libraries, library
discovery, holds. The runtime reaches it through this face alone."""

from memtrace.sensors.cuda.control import CONTROL_QUIET_S
from memtrace.sensors.cuda.discovery import layer_of, mapped_libraries
from memtrace.sensors.cuda.launches import LaunchLinks
from memtrace.sensors.cuda.maps import KernelMaps
from memtrace.sensors.cuda.probes import Attachment, probe_plan
from memtrace.sensors.cuda.sensor import DEFAULT_RING_BYTES, CudaSensor, Hooks, Options

__all__ = [
    "CONTROL_QUIET_S",
    "DEFAULT_RING_BYTES",
    "Attachment",
    "CudaSensor",
    "Hooks",
    "KernelMaps",
    "LaunchLinks",
    "Options",
    "layer_of",
    "mapped_libraries",
    "probe_plan",
]
