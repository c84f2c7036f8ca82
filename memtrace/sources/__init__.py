"""Sources: what memtrace reads from the host outside BPF (procfs, and later NVML, netlink)."""
