"""The kernel/user ABI, mirrored from bpf/memtrace.h.

tests/test_abi.py compiles a C program against the header and checks every
constant, size and offset here, so the two cannot drift apart unseen.
"""

from __future__ import annotations

import ctypes
import enum

import numpy as np


class Direction(enum.IntEnum):
    H2H = 0
    H2D = 1
    D2H = 2
    D2D = 3
    DEFAULT = 4
    PEER = 5
    UNKNOWN = 6

    @property
    def label(self) -> str:
        return self.name.lower()


class Layer(enum.IntEnum):
    RUNTIME = 0
    DRIVER = 1

    @property
    def label(self) -> str:
        return self.name.lower()


class DirSrc(enum.IntEnum):
    FIXED = 0
    KIND = 1
    DESC2D = 2
    DESC3D = 3
    PARMS3D = 4
    BATCH = 5
    BATCH3D = 6


class Family(enum.IntEnum):
    COPY = 0
    MEM = 1
    SYNC = 2
    LAUNCH = 3


MEM_AUX_DEREF = 0x1
LAUNCH_STREAM_IN_CONFIG = 0x1  # a launch's STREAM is a CUlaunchConfig pointer: its hStream


class Stat(enum.IntEnum):
    EVENTS = 0
    DROPPED = 1
    TOTALS_FULL = 2
    INFLIGHT_FULL = 3
    NESTED = 4
    ABANDONED = 5
    HOLDS = 6
    HOLD_MISSED = 7
    CTL_DROPPED = 8
    COUNTS_FULL = 9
    NESTED_SAME = 10
    UNRETURNED = 11
    BATCH_TRUNCATED = 12
    STACKS = 13
    STACK_FAILED = 14
    STACKS_FULL = 15
    BATCH_ARRAY_COPIES = 16
    PY_FRAMES = 17
    PY_READS = 18
    PY_THREAD_READS = 19
    LAUNCH_EVENTS = 20
    LAUNCH_DROPPED = 21


STAT_COUNT = 22

# Batch copies (memtrace.h): the first BATCH_EACH copies one record each,
# the rest up to BATCH_MAX summed in one record; EV_MORE in an event's
# `layer` marks a further copy of a batch call (bytes, not a call).
BATCH_EACH = 32
BATCH_MAX = 1024
EV_MORE = 0x80
EV_SUM = 0x40
EV_LAYER = 0x01


class CtlType(enum.IntEnum):
    MAP = 1
    EXIT = 3
    PROC = 4


COMM_LEN = 16


class HoldState(enum.IntEnum):
    """enum mt_hold_state: whether a MAP notice's process was stopped."""

    NONE = 0
    HELD = 1
    NOT_HELD = 2  # the kernel refused the stop
    FOREGROUND = 3  # a terminal's foreground job: never stopped


CK_API_SHIFT = 0
CK_BYTES_SHIFT = 16
CK_MUL_SHIFT = 20
CK_DIRSRC_SHIFT = 24
CK_DIRARG_SHIFT = 28
CK_STREAM_SHIFT = 32
CK_LAYER_SHIFT = 36
CK_FAMILY_SHIFT = 37
CK_DST_SHIFT = 40
CK_SRC_SHIFT = 44
CK_OWN_SHIFT = 63  # a launch probe of one process's own link (the overhead budget's)


class ProcKey(ctypes.Structure):
    _fields_ = [("start_ns", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class TotalsKey(ctypes.Structure):
    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("api", ctypes.c_uint16),
        ("direction", ctypes.c_uint8),
        ("pad", ctypes.c_uint8),
    ]


class Totals(ctypes.Structure):
    _fields_ = [
        ("calls", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("errors", ctypes.c_uint64),
        ("duration_ns", ctypes.c_uint64),
    ]


class CtlEvent(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("type", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("fd", ctypes.c_int32),
        ("held", ctypes.c_uint32),
        ("host_pid", ctypes.c_uint32),
        ("start_ns", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("comm", ctypes.c_char * COMM_LEN),
        ("cpu_ns", ctypes.c_uint64),
    ]


# The `counts` key's api under which a process's entry and return traps are
# counted (MT_API_TRAPS); every other api there is a launch count.
TRAPS_API = 0xFFFF


class Hold(ctypes.Structure):
    """struct mt_hold: a `mt_held` value (the key is the host tgid)."""

    _fields_ = [("ts_ns", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class InodeKey(ctypes.Structure):
    _fields_ = [("dev", ctypes.c_uint64), ("ino", ctypes.c_uint64)]


class LaunchLib(ctypes.Structure):
    """struct mt_launch_lib: a process with its own launch link to a library."""

    _fields_ = [("pid", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("lib", InodeKey)]


class LaunchSample(ctypes.Structure):
    """struct mt_launch_sample: a `launch_own` value."""

    _fields_ = [
        ("pending", ctypes.c_uint64),
        ("launches", ctypes.c_uint64),
        ("calls", ctypes.c_uint64),
        ("primed", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


# `attached` map values (bpf/memtrace.h MT_ATTACHED_*).
ATTACHED_LIBRARY = 1
ATTACHED_EXECUTABLE = 2
ATTACHED_OTHER = 3  # another sensor's library (libnccl)
ATTACHED_PER_PROCESS = 4  # launch probes per process: a process mapping it needs its own first


# struct mt_event, decoded in batches (80 bytes).
EVENT_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"),
        ("duration_ns", "<u8"),
        ("bytes", "<u8"),
        ("stream", "<u8"),
        ("dst", "<u8"),
        ("src", "<u8"),
        ("start_ns", "<u8"),
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("ret", "<i4"),
        ("api", "<u2"),
        ("direction", "u1"),
        ("layer", "u1"),
        ("stack", "<u8"),
    ]
)

# Call stacks (memtrace.h): struct mt_stack, the `stack_frames` value.
STACK_DEPTH = 64
STACKS_MAX = 16384


PY_DEPTH = 32  # Python frames kept per stack
PY_ENTRY = 1 << 63  # in py_instr: the frame a C call into the interpreter began
PY_NONE = 0xFFFF  # an interpreter offset that does not exist
PY_FRAME_READ = 120  # the most bytes BPF reads of one frame
PY_TSTATE_READ = 248  # the most bytes BPF reads of one thread state


class PyState(enum.IntEnum):
    """enum mt_py_state: what became of a stack's Python frames."""

    NOT_PYTHON = 0
    WALKED = 1
    NO_THREAD = 2
    FAULT = 3
    TRUNCATED = 4


class PyMatch(enum.IntEnum):
    """enum mt_py_match: how BPF finds the calling thread's state."""

    NATIVE_TID = 1
    PTHREAD = 2


class Stack(ctypes.Structure):
    """struct mt_stack: a `stack_frames` value, return addresses innermost
    first, then the thread's Python frames (code object, where in it)."""

    _fields_ = [
        ("nframes", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("ips", ctypes.c_uint64 * STACK_DEPTH),
        ("py_state", ctypes.c_uint32),
        ("py_nframes", ctypes.c_uint32),
        ("py_code", ctypes.c_uint64 * PY_DEPTH),
        ("py_instr", ctypes.c_uint64 * PY_DEPTH),
    ]


class PyProc(ctypes.Structure):
    """struct mt_py_proc: a `py_procs` value, where a process's interpreter
    keeps its state (offsets in bytes; PY_NONE: absent)."""

    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("runtime", ctypes.c_uint64),
        ("interpreters_head", ctypes.c_uint16),
        ("interp_threads", ctypes.c_uint16),
        ("tstate_next", ctypes.c_uint16),
        ("tstate_id", ctypes.c_uint16),
        ("tstate_frame", ctypes.c_uint16),
        ("cframe_frame", ctypes.c_uint16),
        ("frame_previous", ctypes.c_uint16),
        ("frame_code", ctypes.c_uint16),
        ("frame_instr", ctypes.c_uint16),
        ("frame_owner", ctypes.c_uint16),
        ("frame_is_entry", ctypes.c_uint16),
        ("code_name", ctypes.c_uint16),
        ("code_filename", ctypes.c_uint16),
        ("code_firstlineno", ctypes.c_uint16),
        ("code_linetable", ctypes.c_uint16),
        ("ascii_size", ctypes.c_uint16),
        ("compact_size", ctypes.c_uint16),
        ("match", ctypes.c_uint8),
        ("instr_size", ctypes.c_uint8),
        ("owner_cstack", ctypes.c_uint8),
        ("frame_size", ctypes.c_uint8),
        ("frames_window", ctypes.c_uint8),
        ("tstate_size", ctypes.c_uint8),
        ("tstate_prev", ctypes.c_uint16),
        ("pad2", ctypes.c_uint8 * 4),
    ]


PY_NAME_LEN = 128
PY_FILE_LEN = 256
PY_TABLE_LEN = 1024
PY_CODES_MAX = 16384


class PyCodeKey(ctypes.Structure):
    """struct mt_py_code_key: a code object of a process."""

    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("code", ctypes.c_uint64),
    ]


class PyCode(ctypes.Structure):
    """struct mt_py_code: what a code object said when its first stack was taken."""

    _fields_ = [
        ("type", ctypes.c_uint64),
        ("firstlineno", ctypes.c_int32),
        ("name_size", ctypes.c_uint32),
        ("file_size", ctypes.c_uint32),
        ("table_size", ctypes.c_uint32),
        ("name_kind", ctypes.c_uint8),
        ("file_kind", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 6),
        # bytes, not c_char: a UTF-16 or UTF-32 name holds NULs, where c_char would stop
        ("name", ctypes.c_uint8 * PY_NAME_LEN),
        ("file", ctypes.c_uint8 * PY_FILE_LEN),
        ("table", ctypes.c_uint8 * PY_TABLE_LEN),
    ]
