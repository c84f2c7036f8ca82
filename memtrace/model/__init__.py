"""The domain model: processes, their copies, device memory, waits and
launches, built from the sensors' event batches. No I/O."""

from memtrace.model.aggregate import Model, describe
from memtrace.model.book import AddressBook, BookChanges
from memtrace.model.process import CopyKey, CopyStats, DeviceMemory, Process, SyncStats

__all__ = [
    "AddressBook",
    "BookChanges",
    "CopyKey",
    "CopyStats",
    "DeviceMemory",
    "Model",
    "Process",
    "SyncStats",
    "describe",
]
