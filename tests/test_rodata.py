"""Load-time options (`const volatile` globals in .rodata) are written with
the width their BTF gives them, read back from the loaded object as set,
and refused when unknown or too wide for their type."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memtrace.bpf.host import ensure_tracefs, object_path, rodata_options
from memtrace.bpf.libbpf import BpfObject
from memtrace.core.abi import Hold
from memtrace.core.errors import BadOption
from memtrace.sensors.cuda.holds import HELD_MAP

pytestmark = pytest.mark.bpf


@pytest.fixture
def obj() -> Iterator[BpfObject]:
    o = BpfObject(object_path())
    yield o
    o.close()


@pytest.mark.parametrize("arch", ["x86", "arm64"])
def test_options_have_the_offsets_and_widths_their_btf_gives(arch: str) -> None:
    opts = rodata_options(object_path(arch))
    assert (opts["filter_pids"].size, opts["filter_pids"].boolean) == (1, True)
    assert (opts["hold_libraries"].size, opts["hold_libraries"].boolean) == (1, True)
    tgid = opts["agent_tgid"]
    assert (tgid.size, tgid.signed, tgid.boolean) == (4, False, False)
    assert tgid.offset % 4 == 0
    assert len({o.offset for o in opts.values()}) == len(opts)


def test_a_four_byte_option_round_trips_through_the_loaded_rodata(obj: BpfObject) -> None:
    value = 0x8765_4321  # every byte differs: a one-byte write would leave three at 0
    obj.set_rodata({"agent_tgid": value, "filter_pids": True, "hold_libraries": False})
    obj.set_autoload("mt_mmap", False)
    obj.load()
    data = obj.rodata()  # looked up in the kernel's .rodata map
    opts = obj.rodata_vars()
    tgid = opts["agent_tgid"]
    assert int.from_bytes(data[tgid.offset : tgid.offset + 4], "little") == value
    assert data[opts["filter_pids"].offset] == 1
    assert data[opts["hold_libraries"].offset] == 0


@pytest.mark.parametrize(
    "values",
    [{"agent_tgid": 1 << 32}, {"agent_tgid": -1}, {"filter_pids": 2}, {"agent_tgid": 1.5}],
    ids=["too-wide", "negative-unsigned", "bool-not-0-or-1", "not-an-integer"],
)
def test_a_value_its_option_cannot_hold_is_refused_and_nothing_is_written(
    obj: BpfObject, values: dict[str, int]
) -> None:
    before = obj.rodata()
    with pytest.raises(BadOption, match="agent_tgid|filter_pids"):
        obj.set_rodata({"hold_libraries": False, **values})
    assert obj.rodata() == before


def test_an_unknown_option_is_refused(obj: BpfObject) -> None:
    with pytest.raises(BadOption, match="no option hold_limit_ns"):
        obj.set_rodata({"hold_limit_ns": 5})


# ---- the option's use: the agent's own process is never held ----

CHILD = """
import mmap, os, sys
sys.stdin.readline()
fd = os.open(sys.argv[1], os.O_RDONLY)
mmap.mmap(fd, 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC)
print("mapped", flush=True)
"""


def _map_code_of_a_cuda_library(tmp_path: Path, agent_tgid: int | None) -> bool:
    """A child maps the code of a `libcuda.so.1` (new to the object); the
    object holds only that child. True if the child was held."""
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\0" * 4096)
    ensure_tracefs()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(lib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    # A one-byte option would keep only the low byte of the pid: make sure it matters.
    assert child.pid > 0xFF
    o = BpfObject(object_path())
    link = None
    try:
        o.set_rodata(
            {"filter_pids": True, "hold_libraries": True, "agent_tgid": child.pid if agent_tgid is None else agent_tgid}
        )
        o.load()
        link = o.attach("mt_mmap")
        o.map("traced").update(ctypes.c_uint32(child.pid), ctypes.c_uint8(1))
        child.stdin.write("go\n")
        child.stdin.flush()
        held = o.map(HELD_MAP)
        was_held = False
        deadline = time.monotonic() + 30
        while child.poll() is None and time.monotonic() < deadline:
            if held.lookup(ctypes.c_uint32(child.pid), Hold()):
                # Our program stopped it (another agent on this host may
                # hold and continue it too: only our map says what ours did).
                was_held = True
                os.kill(child.pid, signal.SIGCONT)
            time.sleep(0.01)
        assert child.poll() == 0, "the child did not finish"
        assert child.stdout.read() == "mapped\n"
        return was_held or held.lookup(ctypes.c_uint32(child.pid), Hold())
    finally:
        if link is not None:
            link.destroy()
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)  # never leave it stopped
        child.stdin.close()
        child.wait(timeout=30)
        o.close()


def test_the_agent_process_named_by_its_tgid_is_never_held(tmp_path: Path) -> None:
    assert _map_code_of_a_cuda_library(tmp_path, agent_tgid=None) is False


def test_another_process_mapping_a_new_cuda_library_is_held(tmp_path: Path) -> None:
    # The control: the same mapping is held when the option names someone else.
    assert _map_code_of_a_cuda_library(tmp_path, agent_tgid=0) is True


def test_the_cuda_sensor_names_its_own_process_as_the_agent() -> None:
    from memtrace.sensors.cuda import CudaSensor, Options

    src = CudaSensor(Options(only_traced=True, hold_libraries=False))
    src.start()
    try:
        assert src.obj is not None
        tgid = src.obj.rodata_vars()["agent_tgid"]
        data = src.obj.rodata()
        assert int.from_bytes(data[tgid.offset : tgid.offset + tgid.size], "little") == os.getpid()
    finally:
        src.close()


def test_a_map_buffer_smaller_than_the_maps_values_is_refused_not_overrun() -> None:
    """The kernel writes a map's whole value into the buffer it is given: a
    buffer sized from a stale mirror of a struct that grew (struct inflight
    did, for batch copies) overran the heap, and the agent crashed later in
    unrelated code. Every map access checks the sizes the kernel reports."""
    import ctypes

    import pytest

    from memtrace.sensors.cuda import CudaSensor, Options

    src = CudaSensor(Options(only_traced=True, hold_libraries=False))
    src.start()
    try:
        assert src.obj is not None
        slots = src.obj.map("slots")
        assert slots.value_size > 64  # struct mt_slot: the owner word and a call in flight
        with pytest.raises(TypeError, match="64-byte buffer"):
            slots.lookup(ctypes.c_uint32(0), (ctypes.c_uint64 * 8)())
        with pytest.raises(TypeError, match="key"):
            slots.lookup(ctypes.c_uint64(0), (ctypes.c_uint8 * slots.value_size)())
        assert slots.lookup(ctypes.c_uint32(0), (ctypes.c_uint8 * slots.value_size)())
        assert src.maps is not None and src.maps.inflight_count() == 0  # sized from the map: every slot, no overrun
    finally:
        src.close()
