"""The CUDA sensor: uprobes on the runtime and driver libraries, library discovery, holds."""
