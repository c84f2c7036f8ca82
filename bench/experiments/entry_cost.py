"""What a uprobe trap costs by the instruction it replaced (issue 18: the
overhead memtrace publishes and budgets is traps x the calibrated cost).

    sudo .venv/bin/python bench/experiments/entry_cost.py [--calls N] [--rounds R]

x86-64 only. Five functions of one small library differ only in their first
instruction: a push of a register (how every libcuda and libcudart entry
point seen begins), a one-byte nop, endbr64 (how functions built with CET
begin: glibc's, Ubuntu's), a mov and a sub (how -O2 code often begins).
Each is called from this process unprobed and with an entry probe running
memtrace's calibration program (mt_calibrate, returns at once), filtered to
this pid; the rounds alternate the functions. Printed: each kind's cost per
trap (median over rounds of CPU time per call, probed less unprobed) and
its ratio to the push, then memtrace's own calibration of both kinds.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import Spread
from memtrace.bpf.elf import code_at
from memtrace.bpf.host import object_path
from memtrace.bpf.libbpf import BpfObject
from memtrace.core.overhead import entry_kind
from memtrace.runtime.overhead import _cpu_per_call, calibrate, file_offset, release

FUNCTIONS = {
    "push": "push %rbp\n mov %rsp,%rbp\n mov %rdi,%rax\n pop %rbp\n ret",
    "nop": "nop\n mov %rdi,%rax\n ret",
    "endbr64": "endbr64\n mov %rdi,%rax\n ret",
    "mov": "mov %rdi,%rax\n ret",
    "sub": "sub $8,%rsp\n mov %rdi,%rax\n add $8,%rsp\n ret",
}


def build(tmp: Path) -> Path:
    src = tmp / "entries.S"
    body = [".text"]
    for name, code in FUNCTIONS.items():
        body += [f".globl f_{name}", f".type f_{name},@function", f"f_{name}:", f" {code}"]
    body.append('.section .note.GNU-stack,"",@progbits')
    src.write_text("\n".join(body) + "\n")
    lib = tmp / "libentries.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if os.uname().machine != "x86_64":
        print("x86-64 only: arm64 single-steps every function entry")
        return 0
    with tempfile.TemporaryDirectory() as d:
        lib = ctypes.CDLL(str(build(Path(d))))
        obj = BpfObject(object_path())
        obj.load()
        fns = {}
        for name in FUNCTIONS:
            fn = getattr(lib, f"f_{name}")
            fn.restype, fn.argtypes = ctypes.c_long, [ctypes.c_long]
            addr = ctypes.cast(fn, ctypes.c_void_p).value
            assert addr is not None
            path, off = file_offset(addr)
            fns[name] = (fn, path, off)
        cost: dict[str, list[float]] = {n: [] for n in FUNCTIONS}
        for _, name in harness.alternating(list(fns), a.rounds):
            fn, path, off = fns[name]
            _cpu_per_call(fn, a.calls)
            bare = _cpu_per_call(fn, a.calls)
            link = obj.attach_uprobe("mt_calibrate", path, off, 0, False, pid=os.getpid())
            probed = _cpu_per_call(fn, a.calls)
            link.destroy()
            cost[name].append(probed - bare)
        print(
            f"machine: {harness.describe()}; {a.rounds} rounds of {a.calls} calls, CPU per call, probed less unprobed"
        )
        push = Spread.of(cost["push"]).median
        for name, (_fn, path, off) in fns.items():
            c = Spread.of(cost[name]).median
            with open(path, "rb") as f:
                kind = entry_kind(code_at(f, off, 2), "x86_64").value
            print(f"  {name:8} {c * 1e6:6.2f} us a trap  {c / push:5.1f}x the push   memtrace counts it {kind}")
        costs, links = calibrate(obj)
        release(links)
        for k, tc in costs.by_kind.items():
            us, pair_us = tc.entry_seconds * 1e6, tc.pair_seconds * 1e6
            print(f"memtrace's calibration, {k.value}: {us:.2f} us an entry, {pair_us:.2f} us with its return")
        obj.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
