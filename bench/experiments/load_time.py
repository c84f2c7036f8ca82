"""How long the kernel takes to load (verify) each sensor's object, and how
many instructions its verifier walked.

    sudo .venv/bin/python bench/experiments/load_time.py [--rounds R] [--object OLD.o ...]

Each round loads every object once, in turn (the CUDA sensor's twice: with
call stacks off, as by default, and on, where the Python frame walk is
verified too), with the options the sensors set; medians over the rounds.
`--object` adds another build of an object (a copy from an earlier commit)
to the same rounds, so a change is measured side by side.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.harness import REPO, need_root  # noqa: E402

# struct bpf_prog_info (linux/bpf.h): the field after recursion_misses.
PROG_INFO_SIZE = 232
VERIFIED_INSNS_OFF = 216


def verified_insns(obj: object) -> int:
    """Instructions the verifier processed, summed over the object's loaded programs."""
    from memtrace.bpf.libbpf import Libbpf

    lib = Libbpf.get().lib
    lib.bpf_object__next_program.restype = ctypes.c_void_p
    lib.bpf_object__next_program.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.bpf_program__fd.argtypes = [ctypes.c_void_p]
    lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    total, prog = 0, lib.bpf_object__next_program(obj.obj, None)  # type: ignore[attr-defined]
    while prog:
        fd = lib.bpf_program__fd(prog)
        if fd >= 0:
            info = ctypes.create_string_buffer(PROG_INFO_SIZE)
            n = ctypes.c_uint32(PROG_INFO_SIZE)
            if lib.bpf_obj_get_info_by_fd(fd, info, ctypes.byref(n)) == 0:
                total += int.from_bytes(info.raw[VERIFIED_INSNS_OFF : VERIFIED_INSNS_OFF + 4], "little")
        prog = lib.bpf_object__next_program(obj.obj, prog)  # type: ignore[attr-defined]
    return total


def load_once(path: Path, rodata: dict[str, int | bool]) -> tuple[float, int]:
    from memtrace.bpf.libbpf import BpfObject

    obj = BpfObject(path)
    try:
        obj.set_rodata(rodata)
        t = time.perf_counter()
        obj.load()
        return time.perf_counter() - t, verified_insns(obj)
    finally:
        obj.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--object", type=Path, action="append", default=[], help="another memtrace object to compare")
    a = ap.parse_args()
    need_root("load_time")
    from memtrace.bpf.host import bpf_arch

    arch = bpf_arch()
    objs = REPO / "memtrace" / "bpf"
    cases: list[tuple[str, Path, dict[str, int | bool]]] = []
    for label, path in [("memtrace", objs / f"memtrace.{arch}.bpf.o")] + [(str(p), p) for p in a.object]:
        cases.append((f"{label} (stacks off)", path, {"filter_pids": True}))
        cases.append((f"{label} (stacks on)", path, {"filter_pids": True, "capture_stacks": True}))
    cases.append(("sched", objs / f"sched.{arch}.bpf.o", {"filter_pids": True}))
    cases.append(("nccl", objs / f"nccl.{arch}.bpf.o", {"filter_pids": True}))
    times: dict[str, list[float]] = {c[0]: [] for c in cases}
    insns: dict[str, int] = {}
    for _ in range(a.rounds):
        for label, path, rodata in cases:
            dt, n = load_once(path, rodata)
            times[label].append(dt)
            insns[label] = n
    print(f"{a.rounds} rounds, medians (min-max) of the load, instructions the verifier processed")
    for label, ts in times.items():
        print(
            f"  {label:60s} {statistics.median(ts) * 1e3:7.1f} ms ({min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f})  "
            f"{insns[label]:,} insns"
        )


if __name__ == "__main__":
    main()
