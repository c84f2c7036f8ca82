"""BPF: the libbpf binding, ring readers, and what the host must offer to load programs."""
