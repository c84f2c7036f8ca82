"""memtrace: zero-code eBPF tracing of CUDA memory copies."""

__version__ = "0.1.0"
