"""memtrace/core/nccl.py mirrors bpf/nccl.h, and nccl.h's datatype enum
agrees with NCCL's (as the test library's nccl_fake.h declares it): a C
program compiled against both headers prints every size, offset and
constant. The shipped NCCL objects are the ones the sources build."""

from __future__ import annotations

import ctypes
import json
import subprocess

import pytest
from conftest import FIXTURES, REPO
from elftools.elf.elffile import ELFFile
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrace.core import nccl
from memtrace.core.nccl import Collective, CommKind, DataType, Stat
from memtrace.core.procfiles import lines_with
from memtrace.sensors.nccl.plan import COMM_SYMBOLS, SYMBOLS
from memtrace.sensors.nccl.sensor import object_path

PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include <linux/types.h>
#include "nccl.h"
#include "nccl_fake.h"
#define S(t) printf("\"sizeof %s\": %zu,\n", #t, sizeof(struct t))
#define O(t, f) printf("\"%s.%s\": %zu,\n", #t, #f, offsetof(struct t, f))
#define Z(t, f) printf("\"%s.%s size\": %zu,\n", #t, #f, sizeof(((struct t *)0)->f))
#define C(x) printf("\"%s\": %lld,\n", #x, (long long)(x))
int main(void) {
  printf("{\n");
  S(nc_event); O(nc_event, ts_ns); O(nc_event, duration_ns); O(nc_event, count); O(nc_event, bytes);
  O(nc_event, stream); O(nc_event, comm); O(nc_event, start_ns);
  O(nc_event, pid); O(nc_event, tid); O(nc_event, ret); O(nc_event, peer);
  O(nc_event, depth); O(nc_event, coll); O(nc_event, dtype); O(nc_event, flags); O(nc_event, pad);
  S(nc_totals_key); O(nc_totals_key, start_ns); O(nc_totals_key, pid); O(nc_totals_key, coll);
  Z(nc_totals_key, start_ns); Z(nc_totals_key, pid); Z(nc_totals_key, coll);
  S(nc_totals); O(nc_totals, calls); O(nc_totals, bytes); O(nc_totals, errors); O(nc_totals, bytes_unknown);
  O(nc_totals, duration_ns); Z(nc_totals, bytes_unknown);
  Z(nc_totals, calls); Z(nc_totals, bytes); Z(nc_totals, errors); Z(nc_totals, duration_ns);
  Z(nc_event, ts_ns); Z(nc_event, duration_ns); Z(nc_event, count); Z(nc_event, bytes); Z(nc_event, stream);
  Z(nc_event, comm); Z(nc_event, start_ns);
  Z(nc_event, pid); Z(nc_event, tid); Z(nc_event, ret); Z(nc_event, peer); Z(nc_event, depth);
  Z(nc_event, coll); Z(nc_event, dtype); Z(nc_event, flags); Z(nc_event, pad);
  C(NC_ALLREDUCE); C(NC_ALLGATHER); C(NC_REDUCESCATTER); C(NC_BROADCAST); C(NC_REDUCE); C(NC_SEND); C(NC_RECV);
  C(NC_ALLTOALL); C(NC_GROUP_START); C(NC_GROUP_END); C(NC_COLL_COUNT);
  C(NC_INT8); C(NC_UINT8); C(NC_INT32); C(NC_UINT32); C(NC_INT64); C(NC_UINT64); C(NC_FLOAT16); C(NC_FLOAT32);
  C(NC_FLOAT64); C(NC_BFLOAT16); C(NC_FLOAT8E4M3); C(NC_FLOAT8E5M2); C(NC_DTYPE_COUNT);
  C(ncclInt8); C(ncclUint8); C(ncclInt32); C(ncclUint32); C(ncclInt64); C(ncclUint64); C(ncclFloat16);
  C(ncclFloat32); C(ncclFloat64); C(ncclBfloat16); C(ncclFloat8e4m3); C(ncclFloat8e5m2);
  C(NC_F_BYTES_UNKNOWN); C(NC_F_GROUPED);
  C(NC_CK_COLL_SHIFT); C(NC_CK_COUNT_SHIFT); C(NC_CK_DTYPE_SHIFT); C(NC_CK_PEER_SHIFT); C(NC_CK_COMM_SHIFT);
  C(NC_CK_STREAM_SHIFT);
  C(NC_STAT_EVENTS); C(NC_STAT_DROPPED); C(NC_STAT_LOST_FULL); C(NC_STAT_NO_ENTRY); C(NC_STAT_ABANDONED);
  C(NC_STAT_NESTED); C(NC_STAT_COMMS); C(NC_STAT_COMMS_DROPPED); C(NC_STAT_COUNT);
  S(nc_comm_event); O(nc_comm_event, ts_ns); O(nc_comm_event, start_ns); O(nc_comm_event, comm);
  O(nc_comm_event, parent); O(nc_comm_event, unique_id); O(nc_comm_event, pid); O(nc_comm_event, tid);
  O(nc_comm_event, ret); O(nc_comm_event, rank); O(nc_comm_event, nranks); O(nc_comm_event, color);
  O(nc_comm_event, key); O(nc_comm_event, kind); O(nc_comm_event, pad);
  Z(nc_comm_event, ts_ns); Z(nc_comm_event, start_ns); Z(nc_comm_event, comm); Z(nc_comm_event, parent);
  Z(nc_comm_event, unique_id); Z(nc_comm_event, pid); Z(nc_comm_event, tid); Z(nc_comm_event, ret);
  Z(nc_comm_event, rank); Z(nc_comm_event, nranks); Z(nc_comm_event, color); Z(nc_comm_event, key);
  Z(nc_comm_event, kind); Z(nc_comm_event, pad);
  C(NC_COMM_INIT_RANK); C(NC_COMM_INIT_RANK_CONFIG); C(NC_COMM_INIT_ALL); C(NC_COMM_SPLIT); C(NC_COMM_COUNT);
  C(NC_COMM_USER_RANK); C(NC_COMM_KIND_COUNT); C(NC_UNIQUE_ID_BYTES); C(NC_INIT_ALL_MAX);
  C(sizeof(ncclUniqueId)); C(NCCL_UNIQUE_ID_BYTES);
  printf("\"end\": 0\n}\n");
  return 0;
}
"""

NCCL_NAMES = {
    DataType.INT8: "ncclInt8",
    DataType.UINT8: "ncclUint8",
    DataType.INT32: "ncclInt32",
    DataType.UINT32: "ncclUint32",
    DataType.INT64: "ncclInt64",
    DataType.UINT64: "ncclUint64",
    DataType.FLOAT16: "ncclFloat16",
    DataType.FLOAT32: "ncclFloat32",
    DataType.FLOAT64: "ncclFloat64",
    DataType.BFLOAT16: "ncclBfloat16",
    DataType.FLOAT8E4M3: "ncclFloat8e4m3",
    DataType.FLOAT8E5M2: "ncclFloat8e5m2",
}


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    d = tmp_path_factory.mktemp("nccl_abi")
    (d / "probe.c").write_text(PROBE)
    subprocess.run(
        ["cc", "-I", str(REPO / "bpf"), "-I", str(FIXTURES), "-o", str(d / "probe"), str(d / "probe.c")], check=True
    )
    out = subprocess.run([str(d / "probe")], capture_output=True, text=True, check=True).stdout
    doc: dict[str, int] = json.loads(out)
    return doc


def test_event_layout_matches_the_numpy_dtype(header: dict[str, int]) -> None:
    dt = nccl.EVENT_DTYPE
    assert dt.itemsize == header["sizeof nc_event"]
    assert dt.names is not None
    assert set(dt.names) == {k.split(".")[1].removesuffix(" size") for k in header if k.startswith("nc_event.")}
    for name in dt.names:
        assert dt.fields is not None
        assert dt.fields[name][1] == header[f"nc_event.{name}"], name
        assert dt.fields[name][0].itemsize == header[f"nc_event.{name} size"], name


def test_communicator_record_matches_the_numpy_dtype(header: dict[str, int]) -> None:
    dt = nccl.COMM_EVENT_DTYPE
    assert dt.itemsize == header["sizeof nc_comm_event"]
    assert dt.names is not None and dt.fields is not None
    assert set(dt.names) == {k.split(".")[1].removesuffix(" size") for k in header if k.startswith("nc_comm_event.")}
    for name in dt.names:
        assert dt.fields[name][1] == header[f"nc_comm_event.{name}"], name
        assert dt.fields[name][0].itemsize == header[f"nc_comm_event.{name} size"], name
    names = {
        CommKind.INIT_RANK: "NC_COMM_INIT_RANK",
        CommKind.INIT_RANK_CONFIG: "NC_COMM_INIT_RANK_CONFIG",
        CommKind.INIT_ALL: "NC_COMM_INIT_ALL",
        CommKind.SPLIT: "NC_COMM_SPLIT",
        CommKind.COUNT: "NC_COMM_COUNT",
        CommKind.USER_RANK: "NC_COMM_USER_RANK",
    }
    for k in CommKind:
        assert header[names[k]] == k.value
    assert header["NC_COMM_KIND_COUNT"] == nccl.COMM_KIND_COUNT == len(CommKind)
    # NCCL's ncclUniqueId (nccl_fake.h declares it as nccl.h does) is what BPF copies whole
    assert header["sizeof(ncclUniqueId)"] == header["NC_UNIQUE_ID_BYTES"] == nccl.UNIQUE_ID_BYTES
    assert header["NC_INIT_ALL_MAX"] == nccl.INIT_ALL_MAX
    assert {k: CommKind(v) for k, v in COMM_SYMBOLS.items()} == {
        "ncclCommInitRank": CommKind.INIT_RANK,
        "ncclCommInitRankConfig": CommKind.INIT_RANK_CONFIG,
        "ncclCommInitAll": CommKind.INIT_ALL,
        "ncclCommSplit": CommKind.SPLIT,
        "ncclCommCount": CommKind.COUNT,
        "ncclCommUserRank": CommKind.USER_RANK,
    }


def test_communicator_ids_are_fnv1a_64() -> None:
    # FNV-1a's published test vectors
    assert nccl.fnv1a64(b"") == 0xCBF29CE484222325
    assert nccl.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert nccl.fnv1a64(b"foobar") == 0x85944171F73967E8
    uid = bytes(range(128))
    assert nccl.comm_id_of_unique_id(uid) == nccl.fnv1a64(uid)
    child = nccl.comm_id_of_split(0x1122334455667788, 3)
    assert child == nccl.fnv1a64(bytes.fromhex("8877665544332211") + bytes.fromhex("03000000"))
    assert nccl.comm_id_of_split(0x1122334455667788, -1) != child
    assert nccl.comm_id_text(0xAB) == "00000000000000ab"


def test_map_structs_match(header: dict[str, int]) -> None:
    for cls, cname in ((nccl.TotalsKey, "nc_totals_key"), (nccl.Totals, "nc_totals")):
        assert ctypes.sizeof(cls) == header[f"sizeof {cname}"], cname
        assert {f for f, *_ in cls._fields_} == {
            k.split(".")[1].removesuffix(" size") for k in header if k.startswith(f"{cname}.")
        }, cname
        for f, *_ in cls._fields_:
            assert getattr(cls, f).offset == header[f"{cname}.{f}"], (cname, f)
            assert getattr(cls, f).size == header[f"{cname}.{f} size"], (cname, f)


def test_enums_and_constants_match(header: dict[str, int]) -> None:
    names = {
        Collective.ALLREDUCE: "NC_ALLREDUCE",
        Collective.ALLGATHER: "NC_ALLGATHER",
        Collective.REDUCESCATTER: "NC_REDUCESCATTER",
        Collective.BROADCAST: "NC_BROADCAST",
        Collective.REDUCE: "NC_REDUCE",
        Collective.SEND: "NC_SEND",
        Collective.RECV: "NC_RECV",
        Collective.ALLTOALL: "NC_ALLTOALL",
        Collective.GROUP_START: "NC_GROUP_START",
        Collective.GROUP_END: "NC_GROUP_END",
    }
    for c in Collective:
        assert header[names[c]] == c.value
    assert header["NC_COLL_COUNT"] == nccl.COLL_COUNT == len(Collective)
    for d in DataType:
        assert header[f"NC_{d.name}"] == d.value
        # ... and NCCL's own value for that type
        assert header[NCCL_NAMES[d]] == d.value
    assert header["NC_DTYPE_COUNT"] == nccl.DTYPE_COUNT == len(DataType) == len(nccl.DTYPE_SIZES)
    for s in Stat:
        assert header[f"NC_STAT_{s.name}"] == s.value
    assert header["NC_STAT_COUNT"] == nccl.STAT_COUNT == len(Stat)
    assert header["NC_F_BYTES_UNKNOWN"] == nccl.F_BYTES_UNKNOWN
    assert header["NC_F_GROUPED"] == nccl.F_GROUPED
    for name in ("COLL", "COUNT", "DTYPE", "PEER", "COMM", "STREAM"):
        assert header[f"NC_CK_{name}_SHIFT"] == getattr(nccl, f"CK_{name}_SHIFT")


def test_cookies_decode_to_the_signatures() -> None:
    def arg(c: int, shift: int) -> int:
        return (c >> shift) & 0xF

    # (count, dtype, peer/root, comm, stream) positions as nccl.h declares them
    expect = {
        "ncclAllReduce": (3, 4, 0, 6, 7),
        "ncclAllGather": (3, 4, 0, 5, 6),
        "ncclReduceScatter": (3, 4, 0, 6, 7),
        "ncclBroadcast": (3, 4, 5, 6, 7),
        "ncclReduce": (3, 4, 6, 7, 8),
        "ncclSend": (2, 3, 4, 5, 6),
        "ncclRecv": (2, 3, 4, 5, 6),
        "ncclAlltoAll": (3, 4, 0, 5, 6),
        "ncclGroupStart": (0, 0, 0, 0, 0),
        "ncclGroupEnd": (0, 0, 0, 0, 0),
    }
    for sym, args in expect.items():
        c = SYMBOLS[sym]
        got = tuple(arg(c, s) for s in (nccl.CK_COUNT_SHIFT, nccl.CK_DTYPE_SHIFT, nccl.CK_PEER_SHIFT))
        got += (arg(c, nccl.CK_COMM_SHIFT), arg(c, nccl.CK_STREAM_SHIFT))
        assert got == args, sym


@pytest.mark.parametrize("arch", ["x86", "arm64"])
def test_nccl_objects_carry_btf_and_the_programs(arch: str) -> None:
    with open(object_path(arch), "rb") as f:
        e = ELFFile(f)
        assert e["e_machine"] == "EM_BPF"
        names = {s.name for s in e.iter_sections()}
        assert {".BTF", ".maps", "uprobe", "uretprobe", "tp_btf/sched_process_fork"} <= names
        progs = {s.name for s in e.get_section_by_name(".symtab").iter_symbols() if s["st_info"]["type"] == "STT_FUNC"}
        assert {"nc_enter", "nc_return", "nc_comm_enter", "nc_comm_return"} <= progs


@given(st.lists(st.sampled_from(["", "a", "libnccl.so", "libnccl.so.2", " ", "/x/", "nccl", "\n"]), max_size=40))
@settings(max_examples=300, deadline=None)
def test_the_maps_search_finds_exactly_the_lines_splitting_would(parts: list[str]) -> None:
    """mapped_nccl searches /proc/PID/maps for its needle instead of splitting
    every line: the same lines, in order, whatever the text."""
    text = "".join(parts)
    assert list(lines_with(text, "libnccl.so")) == [l for l in text.split("\n") if "libnccl.so" in l]
