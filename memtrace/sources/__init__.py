"""Sources: what memtrace reads from the host outside BPF: procfs, GPUs through NVML (nvml.py) and NICs
over rtnetlink (netdev.py)."""
