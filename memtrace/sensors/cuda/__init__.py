"""The CUDA sensor: uprobes on the runtime and driver libraries, library discovery, holds."""

from memtrace.sensors.cuda.probes import Attachment, probe_plan
from memtrace.sensors.cuda.sensor import DEFAULT_RING_BYTES, CudaSensor, Hooks, Options

__all__ = ["DEFAULT_RING_BYTES", "Attachment", "CudaSensor", "Hooks", "Options", "probe_plan"]
