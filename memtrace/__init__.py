"""memtrace: a zero-code, always-on eBPF agent for CUDA jobs. It measures
CUDA copies, allocations, launches and waits in every process on a host, and
the host signals around them (CPU interference, NICs, GPUs through NVML, NCCL
collectives); it finds steps with no code change, diagnoses slowdowns, takes
call stacks on request, and keeps its own cost within an overhead budget."""

__version__ = "0.1.0"
