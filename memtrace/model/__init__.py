"""The domain model: processes, their copies, device memory, waits and
launches, built from the sensors' event batches. No I/O."""

from memtrace.model.aggregate import Model, describe
from memtrace.model.book import AddressBook, BookChanges
from memtrace.model.process import (
    ApiKey,
    CopyKey,
    CopyStats,
    DeviceMemory,
    LaunchKey,
    LostKey,
    Process,
    SyncKey,
    SyncStats,
)

__all__ = [
    "AddressBook",
    "ApiKey",
    "BookChanges",
    "CopyKey",
    "CopyStats",
    "DeviceMemory",
    "LaunchKey",
    "LostKey",
    "Model",
    "Process",
    "SyncKey",
    "SyncStats",
    "describe",
]
