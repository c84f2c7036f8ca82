"""Ids, enums, the kernel/user ABI, histograms and units: shared by every layer, no I/O."""
