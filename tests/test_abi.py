"""memtrace/abi.py mirrors bpf/memtrace.h: a C program compiled against the
header prints every size, offset and constant, and they must agree."""

from __future__ import annotations

import ctypes
import json
import subprocess

import pytest
from conftest import FIXTURES, REPO

from memtrace.core import abi, apis
from memtrace.core.abi import CtlType, Direction, Layer, Stat

PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include <linux/types.h>
#include "memtrace.h"
#include "cuda_fake.h"
#define S(t) printf("\"sizeof %s\": %zu,\n", #t, sizeof(struct t))
#define O(t, f) printf("\"%s.%s\": %zu,\n", #t, #f, offsetof(struct t, f))
#define C(x) printf("\"%s\": %lld,\n", #x, (long long)(x))
int main(void) {
  printf("{\n");
  S(mt_event); O(mt_event, ts_ns); O(mt_event, duration_ns); O(mt_event, bytes); O(mt_event, stream);
  O(mt_event, dst); O(mt_event, src); O(mt_event, start_ns);
  O(mt_event, pid); O(mt_event, tid); O(mt_event, ret); O(mt_event, api); O(mt_event, direction); O(mt_event, layer);
  O(mt_event, stack); S(mt_stack); O(mt_stack, nframes); O(mt_stack, pid); O(mt_stack, ips);
  O(mt_stack, py_state); O(mt_stack, py_nframes); O(mt_stack, py_code); O(mt_stack, py_instr);
  C(MT_PY_DEPTH); C(MT_PY_NONE); C(MT_PY_NOT_PYTHON); C(MT_PY_WALKED); C(MT_PY_NO_THREAD); C(MT_PY_FAULT);
  C(MT_PY_TRUNCATED); C(MT_PY_MATCH_NATIVE_TID); C(MT_PY_MATCH_PTHREAD);
  printf("\"MT_PY_ENTRY\": %llu,\n", (unsigned long long)MT_PY_ENTRY);
  S(mt_py_proc); O(mt_py_proc, start_ns); O(mt_py_proc, runtime); O(mt_py_proc, interpreters_head);
  O(mt_py_proc, interp_threads); O(mt_py_proc, tstate_next); O(mt_py_proc, tstate_id);
  O(mt_py_proc, tstate_frame); O(mt_py_proc, cframe_frame); O(mt_py_proc, frame_previous); O(mt_py_proc, frame_code);
  O(mt_py_proc, frame_instr); O(mt_py_proc, frame_owner); O(mt_py_proc, frame_is_entry); O(mt_py_proc, match);
  O(mt_py_proc, instr_size); O(mt_py_proc, owner_cstack); O(mt_py_proc, frame_size); O(mt_py_proc, frames_window);
  O(mt_py_proc, tstate_prev);
  O(mt_py_proc, tstate_size);
  C(MT_PY_FRAME_READ); C(MT_PY_TSTATE_READ);
  O(mt_py_proc, code_name); O(mt_py_proc, code_filename); O(mt_py_proc, code_firstlineno);
  O(mt_py_proc, code_linetable); O(mt_py_proc, ascii_size); O(mt_py_proc, compact_size);
  C(MT_PY_NAME_LEN); C(MT_PY_FILE_LEN); C(MT_PY_TABLE_LEN); C(MT_PY_CODES_MAX);
  S(mt_py_code_key); O(mt_py_code_key, start_ns); O(mt_py_code_key, pid); O(mt_py_code_key, code);
  S(mt_py_code); O(mt_py_code, type); O(mt_py_code, firstlineno); O(mt_py_code, name_size);
  O(mt_py_code, file_size); O(mt_py_code, table_size); O(mt_py_code, name_kind); O(mt_py_code, file_kind);
  O(mt_py_code, name); O(mt_py_code, file); O(mt_py_code, table);
  C(MT_STACK_DEPTH); C(MT_STACKS_MAX);
  C(MT_STAT_STACKS); C(MT_STAT_STACK_FAILED); C(MT_STAT_STACKS_FULL);
  S(mt_proc_key); O(mt_proc_key, start_ns); O(mt_proc_key, pid);
  S(mt_totals_key); O(mt_totals_key, start_ns); O(mt_totals_key, pid);
  O(mt_totals_key, api); O(mt_totals_key, direction);
  S(mt_totals); O(mt_totals, calls); O(mt_totals, bytes); O(mt_totals, errors); O(mt_totals, duration_ns);
  S(mt_ctl_event); O(mt_ctl_event, type); O(mt_ctl_event, pid); O(mt_ctl_event, fd); O(mt_ctl_event, held);
  O(mt_ctl_event, host_pid);
  S(mt_hold); O(mt_hold, ts_ns); O(mt_hold, pid);
  O(mt_ctl_event, start_ns); O(mt_ctl_event, cgroup_id); O(mt_ctl_event, comm); O(mt_ctl_event, cpu_ns); C(MT_COMM_LEN);
  S(mt_inode_key); S(mt_launch_lib); S(mt_launch_sample); O(mt_launch_sample, pending);
  O(mt_launch_sample, launches); O(mt_launch_sample, calls); O(mt_launch_sample, primed); O(mt_launch_lib, lib);
  C(MT_CK_OWN_SHIFT);
  C(MT_ATTACHED_LIBRARY); C(MT_ATTACHED_EXECUTABLE); C(MT_ATTACHED_OTHER); C(MT_ATTACHED_PER_PROCESS);
  C(MT_DIR_H2H); C(MT_DIR_H2D); C(MT_DIR_D2H); C(MT_DIR_D2D); C(MT_DIR_DEFAULT); C(MT_DIR_PEER); C(MT_DIR_UNKNOWN);
  C(MT_LAYER_RUNTIME); C(MT_LAYER_DRIVER); C(MT_DIRSRC_FIXED); C(MT_DIRSRC_KIND); C(MT_DIRSRC_DESC2D);
  C(MT_DIRSRC_DESC3D); C(MT_DIRSRC_PARMS3D); C(MT_FAM_COPY); C(MT_FAM_MEM); C(MT_FAM_SYNC); C(MT_FAM_LAUNCH);
  C(MT_MEM_AUX_DEREF); C(MT_STAT_COUNTS_FULL); C(MT_API_TRAPS);
  C(MT_LAUNCH_STREAM_IN_CONFIG); C(MT_LCFG_STREAM_OFF); C(MT_LCFG_SIZE);
  C(MT_STAT_EVENTS); C(MT_STAT_DROPPED); C(MT_STAT_TOTALS_FULL); C(MT_STAT_INFLIGHT_FULL); C(MT_STAT_NESTED);
  C(MT_STAT_ABANDONED); C(MT_STAT_HOLDS); C(MT_STAT_HOLD_MISSED); C(MT_STAT_CTL_DROPPED); C(MT_STAT_COUNT);
  C(MT_STAT_NESTED_SAME); C(MT_STAT_UNRETURNED); C(MT_STAT_BATCH_TRUNCATED); C(MT_DIRSRC_BATCH);
  C(MT_BATCH_EACH); C(MT_BATCH_MAX); C(MT_EV_MORE); C(MT_EV_SUM); C(MT_EV_LAYER);
  C(MT_HOLD_NONE); C(MT_HOLD_HELD); C(MT_HOLD_NOT_HELD); C(MT_HOLD_FOREGROUND);
  C(MT_CTL_MAP); C(MT_CTL_EXIT); C(MT_CTL_PROC);
  C(MT_CK_API_SHIFT); C(MT_CK_BYTES_SHIFT); C(MT_CK_MUL_SHIFT); C(MT_CK_DIRSRC_SHIFT); C(MT_CK_DIRARG_SHIFT);
  C(MT_CK_STREAM_SHIFT); C(MT_CK_LAYER_SHIFT); C(MT_CK_FAMILY_SHIFT); C(MT_CK_DST_SHIFT); C(MT_CK_SRC_SHIFT);
  C(MT_M2D_SRC_MEMTYPE_OFF); C(MT_M2D_DST_MEMTYPE_OFF); C(MT_M2D_WIDTH_OFF); C(MT_M2D_HEIGHT_OFF); C(MT_M2D_SIZE);
  C(MT_M2D_SRC_HOST_OFF); C(MT_M2D_SRC_DEVICE_OFF); C(MT_M2D_DST_HOST_OFF); C(MT_M2D_DST_DEVICE_OFF);
  C(MT_M3D_SRC_MEMTYPE_OFF); C(MT_M3D_SRC_HOST_OFF); C(MT_M3D_SRC_DEVICE_OFF); C(MT_M3D_DST_MEMTYPE_OFF);
  C(MT_M3D_DST_HOST_OFF); C(MT_M3D_DST_DEVICE_OFF); C(MT_M3D_WIDTH_OFF); C(MT_M3D_HEIGHT_OFF); C(MT_M3D_DEPTH_OFF);
  C(MT_M3D_SIZE); C(MT_P3D_SRC_ARRAY_OFF); C(MT_P3D_SRC_PTR_OFF); C(MT_P3D_DST_ARRAY_OFF); C(MT_P3D_DST_PTR_OFF);
  C(MT_P3D_WIDTH_OFF); C(MT_P3D_HEIGHT_OFF); C(MT_P3D_DEPTH_OFF); C(MT_P3D_KIND_OFF); C(MT_P3D_SIZE);
  C(MT_DIRSRC_BATCH3D); C(MT_STAT_BATCH_ARRAY_COPIES); C(MT_STAT_PY_FRAMES); C(MT_STAT_PY_READS);
  C(MT_STAT_PY_THREAD_READS); C(MT_STAT_LAUNCH_EVENTS); C(MT_STAT_LAUNCH_DROPPED);
  C(MT_OPERAND_POINTER); C(MT_B3D_OP_SIZE); C(MT_B3D_READ);
  C(MT_B3D_SRC_TYPE_OFF); C(MT_B3D_SRC_PTR_OFF); C(MT_B3D_DST_TYPE_OFF); C(MT_B3D_DST_PTR_OFF);
  C(MT_B3D_WIDTH_OFF); C(MT_B3D_HEIGHT_OFF); C(MT_B3D_DEPTH_OFF);
  /* The offsets BPF reads, against the struct as cuda.h declares it. */
  printf("\"cuda srcMemoryType\": %zu,\n", offsetof(CUDA_MEMCPY2D, srcMemoryType));
  printf("\"cuda dstMemoryType\": %zu,\n", offsetof(CUDA_MEMCPY2D, dstMemoryType));
  printf("\"cuda WidthInBytes\": %zu,\n", offsetof(CUDA_MEMCPY2D, WidthInBytes));
  printf("\"cuda Height\": %zu,\n", offsetof(CUDA_MEMCPY2D, Height));
  printf("\"cuda sizeof\": %zu,\n", sizeof(CUDA_MEMCPY2D));
  printf("\"cuda M2D srcHost\": %zu,\n", offsetof(CUDA_MEMCPY2D, srcHost));
  printf("\"cuda M2D srcDevice\": %zu,\n", offsetof(CUDA_MEMCPY2D, srcDevice));
  printf("\"cuda M2D dstHost\": %zu,\n", offsetof(CUDA_MEMCPY2D, dstHost));
  printf("\"cuda M2D dstDevice\": %zu,\n", offsetof(CUDA_MEMCPY2D, dstDevice));
  printf("\"cuda M3D srcMemoryType\": %zu,\n", offsetof(CUDA_MEMCPY3D, srcMemoryType));
  printf("\"cuda M3D srcHost\": %zu,\n", offsetof(CUDA_MEMCPY3D, srcHost));
  printf("\"cuda M3D srcDevice\": %zu,\n", offsetof(CUDA_MEMCPY3D, srcDevice));
  printf("\"cuda M3D dstMemoryType\": %zu,\n", offsetof(CUDA_MEMCPY3D, dstMemoryType));
  printf("\"cuda M3D dstHost\": %zu,\n", offsetof(CUDA_MEMCPY3D, dstHost));
  printf("\"cuda M3D dstDevice\": %zu,\n", offsetof(CUDA_MEMCPY3D, dstDevice));
  printf("\"cuda M3D WidthInBytes\": %zu,\n", offsetof(CUDA_MEMCPY3D, WidthInBytes));
  printf("\"cuda M3D Height\": %zu,\n", offsetof(CUDA_MEMCPY3D, Height));
  printf("\"cuda M3D Depth\": %zu,\n", offsetof(CUDA_MEMCPY3D, Depth));
  printf("\"cuda M3D sizeof\": %zu,\n", sizeof(CUDA_MEMCPY3D));
  printf("\"cuda P3D srcArray\": %zu,\n", offsetof(struct cudaMemcpy3DParms, srcArray));
  printf("\"cuda P3D srcPtr\": %zu,\n", offsetof(struct cudaMemcpy3DParms, srcPtr.ptr));
  printf("\"cuda P3D dstArray\": %zu,\n", offsetof(struct cudaMemcpy3DParms, dstArray));
  printf("\"cuda P3D dstPtr\": %zu,\n", offsetof(struct cudaMemcpy3DParms, dstPtr.ptr));
  printf("\"cuda P3D width\": %zu,\n", offsetof(struct cudaMemcpy3DParms, extent.width));
  printf("\"cuda P3D height\": %zu,\n", offsetof(struct cudaMemcpy3DParms, extent.height));
  printf("\"cuda P3D depth\": %zu,\n", offsetof(struct cudaMemcpy3DParms, extent.depth));
  printf("\"cuda P3D kind\": %zu,\n", offsetof(struct cudaMemcpy3DParms, kind));
  printf("\"cuda P3D sizeof\": %zu,\n", sizeof(struct cudaMemcpy3DParms));
  /* 3D batch operations: the driver's and the runtime's, the same layout. */
  printf("\"cuda B3D src.type\": %zu,\n", offsetof(CUDA_MEMCPY3D_BATCH_OP, src.type));
  printf("\"cuda B3D src.ptr\": %zu,\n", offsetof(CUDA_MEMCPY3D_BATCH_OP, src.op.ptr.ptr));
  printf("\"cuda B3D dst.type\": %zu,\n", offsetof(CUDA_MEMCPY3D_BATCH_OP, dst.type));
  printf("\"cuda B3D dst.ptr\": %zu,\n", offsetof(CUDA_MEMCPY3D_BATCH_OP, dst.op.ptr.ptr));
  printf("\"cuda B3D width\": %zu,\n", offsetof(CUDA_MEMCPY3D_BATCH_OP, extent.width));
  printf("\"cuda B3D height\": %zu,\n", offsetof(CUDA_MEMCPY3D_BATCH_OP, extent.height));
  printf("\"cuda B3D depth\": %zu,\n", offsetof(CUDA_MEMCPY3D_BATCH_OP, extent.depth));
  printf("\"cuda B3D extent end\": %zu,\n", offsetof(CUDA_MEMCPY3D_BATCH_OP, srcAccessOrder));
  printf("\"cuda B3D sizeof\": %zu,\n", sizeof(CUDA_MEMCPY3D_BATCH_OP));
  printf("\"cudart B3D src.type\": %zu,\n", offsetof(struct cudaMemcpy3DBatchOp, src.type));
  printf("\"cudart B3D src.ptr\": %zu,\n", offsetof(struct cudaMemcpy3DBatchOp, src.op.ptr.ptr));
  printf("\"cudart B3D dst.type\": %zu,\n", offsetof(struct cudaMemcpy3DBatchOp, dst.type));
  printf("\"cudart B3D dst.ptr\": %zu,\n", offsetof(struct cudaMemcpy3DBatchOp, dst.op.ptr.ptr));
  printf("\"cudart B3D width\": %zu,\n", offsetof(struct cudaMemcpy3DBatchOp, extent.width));
  printf("\"cudart B3D height\": %zu,\n", offsetof(struct cudaMemcpy3DBatchOp, extent.height));
  printf("\"cudart B3D depth\": %zu,\n", offsetof(struct cudaMemcpy3DBatchOp, extent.depth));
  printf("\"cudart B3D extent end\": %zu,\n", offsetof(struct cudaMemcpy3DBatchOp, srcAccessOrder));
  printf("\"cudart B3D sizeof\": %zu,\n", sizeof(struct cudaMemcpy3DBatchOp));
  printf("\"cuda LCFG hStream\": %zu,\n", offsetof(CUlaunchConfig, hStream));
  printf("\"cuda LCFG sizeof\": %zu,\n", sizeof(CUlaunchConfig));
  printf("\"cuda operand pointer\": %d,\n", (int)CU_MEMCPY_OPERAND_TYPE_POINTER);
  printf("\"cudart operand pointer\": %d\n}\n", (int)cudaMemcpyOperandTypePointer);
  return 0;
}
"""


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    d = tmp_path_factory.mktemp("abi")
    (d / "probe.c").write_text(PROBE)
    subprocess.run(
        ["cc", "-I", str(REPO / "bpf"), "-I", str(FIXTURES), "-o", str(d / "probe"), str(d / "probe.c")], check=True
    )
    return json.loads(subprocess.run([str(d / "probe")], capture_output=True, text=True, check=True).stdout)


def test_event_layout_matches_the_numpy_dtype(header: dict[str, int]) -> None:
    dt = abi.EVENT_DTYPE
    assert dt.itemsize == header["sizeof mt_event"]
    for name in dt.names:
        assert dt.fields[name][1] == header[f"mt_event.{name}"], name


def test_map_structs_match(header: dict[str, int]) -> None:
    for cls, cname in (
        (abi.ProcKey, "mt_proc_key"),
        (abi.TotalsKey, "mt_totals_key"),
        (abi.Totals, "mt_totals"),
        (abi.CtlEvent, "mt_ctl_event"),
        (abi.Hold, "mt_hold"),
        (abi.Stack, "mt_stack"),
        (abi.PyProc, "mt_py_proc"),
        (abi.PyCodeKey, "mt_py_code_key"),
        (abi.PyCode, "mt_py_code"),
        (abi.LaunchSample, "mt_launch_sample"),
    ):
        assert ctypes.sizeof(cls) == header[f"sizeof {cname}"], cname
        for f, _ in cls._fields_:
            if f"{cname}.{f}" in header:
                assert getattr(cls, f).offset == header[f"{cname}.{f}"], (cname, f)
    assert ctypes.sizeof(abi.InodeKey) == header["sizeof mt_inode_key"]
    assert ctypes.sizeof(abi.LaunchLib) == header["sizeof mt_launch_lib"]
    assert abi.LaunchLib.lib.offset == header["mt_launch_lib.lib"]
    for name in ("LIBRARY", "EXECUTABLE", "OTHER", "PER_PROCESS"):
        assert getattr(abi, f"ATTACHED_{name}") == header[f"MT_ATTACHED_{name}"], name
    assert (abi.PY_DEPTH, abi.PY_NONE, abi.PY_ENTRY) == (
        header["MT_PY_DEPTH"],
        header["MT_PY_NONE"],
        header["MT_PY_ENTRY"],
    )
    for st in abi.PyState:
        assert header[f"MT_PY_{st.name}"] == st.value, st
    for m in abi.PyMatch:
        assert header[f"MT_PY_MATCH_{m.name}"] == m.value, m
    assert (
        abi.PY_NAME_LEN, abi.PY_FILE_LEN, abi.PY_TABLE_LEN, abi.PY_CODES_MAX, abi.PY_FRAME_READ, abi.PY_TSTATE_READ
    ) == tuple(
        header[k]
        for k in (
            "MT_PY_NAME_LEN", "MT_PY_FILE_LEN", "MT_PY_TABLE_LEN", "MT_PY_CODES_MAX", "MT_PY_FRAME_READ",
            "MT_PY_TSTATE_READ",
        )
    )  # fmt: skip
    for cls, cname in (
        (abi.Stack, "mt_stack"),
        (abi.PyProc, "mt_py_proc"),
        (abi.PyCodeKey, "mt_py_code_key"),
        (abi.PyCode, "mt_py_code"),
    ):
        for k in header:
            if k.startswith(f"{cname}."):
                assert k.split(".", 1)[1] in dict(cls._fields_), k
    assert abi.COMM_LEN == header["MT_COMM_LEN"]
    assert abi.TRAPS_API == header["MT_API_TRAPS"]
    assert abi.TRAPS_API not in apis.BY_ID  # a trap count is never read as a launch count
    # Every field the header declares is in the mirror, at its offset.
    for cls, cname in ((abi.TotalsKey, "mt_totals_key"), (abi.CtlEvent, "mt_ctl_event"), (abi.ProcKey, "mt_proc_key")):
        for k in header:
            if k.startswith(f"{cname}."):
                assert k.split(".", 1)[1] in dict(cls._fields_), k


def test_enums_match(header: dict[str, int]) -> None:
    for d in Direction:
        assert header[f"MT_DIR_{d.name}"] == d.value
    for l in Layer:
        assert header[f"MT_LAYER_{l.name}"] == l.value
    for s in Stat:
        assert header[f"MT_STAT_{s.name}"] == s.value
    assert header["MT_STAT_COUNT"] == abi.STAT_COUNT == len(Stat)
    for h in abi.HoldState:
        assert header[f"MT_HOLD_{h.name}"] == h.value
    for c in CtlType:
        assert header[f"MT_CTL_{c.name}"] == c.value
    for src in abi.DirSrc:
        assert header[f"MT_DIRSRC_{src.name}"] == src.value
    for fam in abi.Family:
        assert header[f"MT_FAM_{fam.name}"] == fam.value
    assert header["MT_MEM_AUX_DEREF"] == abi.MEM_AUX_DEREF
    assert header["MT_LAUNCH_STREAM_IN_CONFIG"] == abi.LAUNCH_STREAM_IN_CONFIG
    for name in ("STACK_DEPTH", "STACKS_MAX", "BATCH_EACH", "BATCH_MAX", "EV_MORE", "EV_SUM", "EV_LAYER"):
        assert header[f"MT_{name}"] == getattr(abi, name), name


def test_cookie_and_descriptor_constants_match(header: dict[str, int]) -> None:
    for name in ("API", "BYTES", "MUL", "DIRSRC", "DIRARG", "STREAM", "LAYER", "FAMILY", "DST", "SRC", "OWN"):
        assert header[f"MT_CK_{name}_SHIFT"] == getattr(abi, f"CK_{name}_SHIFT")
    # The offsets BPF reads, against the structs as cuda.h and cuda_runtime_api.h declare them
    # (user space reads none of them: no Python mirror), every one the header defines.
    descriptors = (
        ("MT_M2D_SRC_MEMTYPE_OFF", "cuda srcMemoryType"),
        ("MT_M2D_DST_MEMTYPE_OFF", "cuda dstMemoryType"),
        ("MT_M2D_WIDTH_OFF", "cuda WidthInBytes"),
        ("MT_M2D_HEIGHT_OFF", "cuda Height"),
        ("MT_M2D_SIZE", "cuda sizeof"),
        ("MT_M2D_SRC_HOST_OFF", "cuda M2D srcHost"),
        ("MT_M2D_SRC_DEVICE_OFF", "cuda M2D srcDevice"),
        ("MT_M2D_DST_HOST_OFF", "cuda M2D dstHost"),
        ("MT_M2D_DST_DEVICE_OFF", "cuda M2D dstDevice"),
        ("MT_M3D_SRC_MEMTYPE_OFF", "cuda M3D srcMemoryType"),
        ("MT_M3D_SRC_HOST_OFF", "cuda M3D srcHost"),
        ("MT_M3D_SRC_DEVICE_OFF", "cuda M3D srcDevice"),
        ("MT_M3D_DST_MEMTYPE_OFF", "cuda M3D dstMemoryType"),
        ("MT_M3D_DST_HOST_OFF", "cuda M3D dstHost"),
        ("MT_M3D_DST_DEVICE_OFF", "cuda M3D dstDevice"),
        ("MT_M3D_WIDTH_OFF", "cuda M3D WidthInBytes"),
        ("MT_M3D_HEIGHT_OFF", "cuda M3D Height"),
        ("MT_M3D_DEPTH_OFF", "cuda M3D Depth"),
        ("MT_M3D_SIZE", "cuda M3D sizeof"),
        ("MT_P3D_SRC_ARRAY_OFF", "cuda P3D srcArray"),
        ("MT_P3D_SRC_PTR_OFF", "cuda P3D srcPtr"),
        ("MT_P3D_DST_ARRAY_OFF", "cuda P3D dstArray"),
        ("MT_P3D_DST_PTR_OFF", "cuda P3D dstPtr"),
        ("MT_P3D_WIDTH_OFF", "cuda P3D width"),
        ("MT_P3D_HEIGHT_OFF", "cuda P3D height"),
        ("MT_P3D_DEPTH_OFF", "cuda P3D depth"),
        ("MT_P3D_KIND_OFF", "cuda P3D kind"),
        ("MT_P3D_SIZE", "cuda P3D sizeof"),
        ("MT_LCFG_STREAM_OFF", "cuda LCFG hStream"),
        ("MT_LCFG_SIZE", "cuda LCFG sizeof"),
    )
    for mine, theirs in descriptors:
        assert header[mine] == header[theirs], mine
    prefixes = ("MT_M2D_", "MT_M3D_", "MT_P3D_", "MT_LCFG_")
    assert {mine for mine, _ in descriptors} == {k for k in header if k.startswith(prefixes)}
    for lib in ("cuda", "cudart"):  # 3D batch operations: one layout for both
        for mine, theirs in (
            ("MT_B3D_SRC_TYPE_OFF", "src.type"),
            ("MT_B3D_SRC_PTR_OFF", "src.ptr"),
            ("MT_B3D_DST_TYPE_OFF", "dst.type"),
            ("MT_B3D_DST_PTR_OFF", "dst.ptr"),
            ("MT_B3D_WIDTH_OFF", "width"),
            ("MT_B3D_HEIGHT_OFF", "height"),
            ("MT_B3D_DEPTH_OFF", "depth"),
            ("MT_B3D_READ", "extent end"),
            ("MT_B3D_OP_SIZE", "sizeof"),
        ):
            assert header[mine] == header[f"{lib} B3D {theirs}"], (lib, mine)
        assert header["MT_OPERAND_POINTER"] == header[f"{lib} operand pointer"]


def test_cookies_decode_to_the_table() -> None:
    for a in apis.APIS:
        c = a.cookie()
        mem = a.family == abi.Family.MEM
        assert c & 0xFFFF == a.id
        assert (c >> abi.CK_BYTES_SHIFT) & 0xF == a.bytes_arg
        assert (c >> abi.CK_MUL_SHIFT) & 0xF == a.mul_arg
        launch = a.family == abi.Family.LAUNCH
        assert (c >> abi.CK_DIRSRC_SHIFT) & 0xF == (a.mem_flags if mem else a.launch_flags if launch else a.dirsrc)
        assert (c >> abi.CK_DIRARG_SHIFT) & 0xF == (a.out_arg if mem else a.dirval)
        assert (c >> abi.CK_STREAM_SHIFT) & 0xF == a.stream_arg
        assert (c >> abi.CK_LAYER_SHIFT) & 1 == a.layer
        assert (c >> abi.CK_FAMILY_SHIFT) & 7 == a.family
        assert (c >> abi.CK_DST_SHIFT) & 0xF == a.dst_arg
        assert (c >> abi.CK_SRC_SHIFT) & 0xF == a.src_arg
        # Copies keep ids below 40 (the kernel tests' harness relies on it).
        assert (a.id < 40) == (a.family == abi.Family.COPY)
        # Launches are counted at the driver by an entry probe, all else needs its return.
        assert a.needs_return == (a.family != abi.Family.LAUNCH)
        assert a.family != abi.Family.LAUNCH or a.layer == abi.Layer.DRIVER
    assert len({a.id for a in apis.APIS}) == len(apis.APIS)
    syms = [s for a in apis.APIS for s in a.symbols]
    assert len(syms) == len(set(syms))
