"""Identity follows the process: a process that enters another network
namespace (`ip netns exec`, nsenter, `unshare --net`), is moved to another
cgroup (cgroup.procs written), or execs another program is measured where
it is from then on, and its host rows say where each span of it was
measured. The book's accounting first (no I/O), then the sensors' triggers
(the sched sensor's exec and cgroup-move counts) on real processes, then
`memtrace run` around a traced job (the test CUDA libraries) that the test
moves, with the kernel's own cgroup counters to hold its figures to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cgroups import make_limited
from conftest import memtrace_cmd, remove_cgroup
from test_diagnosis_traced import wait_for_job

from memtrace.core.ids import ProcessKey
from memtrace.export.host import placement_rows
from memtrace.model.host import MAX_PLACEMENTS, HostBook, Identity
from memtrace.sources.cgroup import cgroup2_root, cgroup_v1_root

KEY = ProcessKey(4242, 77)


# ---- the book: spans and the counters charged to each ----


def test_throttling_is_charged_to_the_cgroup_the_process_is_in_from_its_move_on() -> None:
    """cpu.stat counters are the cgroup's, from its creation: moving into a
    cgroup that was throttled for an hour must not charge that hour to the
    process, and leaving one must not take back what it counted there."""
    book = HostBook()
    book.read_quota(KEY, "/a", 100, 1)  # first reading in /a: from here
    book.read_quota(KEY, "/a", 160, 4)
    assert book.quota_throttled_ns[KEY] == ("/a", 60, 3)
    book.read_quota(KEY, "/b", 9_000_000, 500)  # /b's history: not the process's
    assert book.quota_throttled_ns[KEY] == ("/b", 60, 3)
    book.read_quota(KEY, "/b", 9_000_040, 502)
    book.read_quota(KEY, "/a", 170, 5)  # back in /a: from its reading now, not its first
    book.read_quota(KEY, "/a", 175, 6)
    assert book.quota_throttled_ns[KEY] == ("/a", 105, 6)
    book.read_quota(KEY, "/a", 3, 0)  # /a re-created: its counters start again, nothing is taken back
    book.read_quota(KEY, "/a", 13, 1)
    assert book.quota_throttled_ns[KEY] == ("/a", 115, 7)


def test_memory_limit_hits_of_a_cgroup_moved_into_are_not_the_processes() -> None:
    book = HostBook()
    book.read_limit_hits(KEY, "0::/a\n", 7)
    book.read_limit_hits(KEY, "0::/a\n", 9)
    book.read_limit_hits(KEY, "0::/b\n", 1_000)
    book.read_limit_hits(KEY, "0::/b\n", 1_003)
    assert book.memory_limit_hits[KEY] == 5


def test_each_namespace_and_cgroup_is_a_span_with_what_was_counted_in_it() -> None:
    book = HostBook()
    assert book.place(KEY, Identity(netns=1, cgroup="/", comm="sh", exe="/bin/sh"), 1_000)
    book.read_quota(KEY, "/a", 0, 0)
    # an exec: the same span, its command the new program's
    assert not book.place(KEY, Identity(netns=1, cgroup="/", comm="job", exe="/opt/job"), 2_000)
    # a sample that read nothing new keeps what it knew
    assert not book.place(KEY, Identity(), 2_500)
    book.read_quota(KEY, "/a", 50, 2)
    book.read_limit_hits(KEY, "x", 3)
    assert book.place(KEY, Identity(netns=2, cgroup="/", comm="job"), 3_000)  # setns
    book.read_quota(KEY, "/a", 80, 3)
    book.read_limit_hits(KEY, "x", 4)
    assert book.place(KEY, Identity(netns=2, cgroup="/b", cgroup_id=9), 4_000)  # moved
    book.read_quota(KEY, "/b", 1_000, 10)
    book.read_quota(KEY, "/b", 1_070, 11)
    rows = placement_rows(book, KEY)
    assert [(r["from_time_unix_nano"], r["to_time_unix_nano"]) for r in rows] == [
        (1_000, 3_000),
        (3_000, 4_000),
        (4_000, None),
    ]
    assert [(r["netns"], r["cgroup"], r["cgroup_id"]) for r in rows] == [(1, "/", 0), (2, "/", 0), (2, "/b", 9)]
    assert [(r["process"], r["executable"]) for r in rows] == [("job", "/opt/job")] * 3
    assert [r["cpu_quota_throttled_seconds"] * 1e9 for r in rows] == pytest.approx([50, 30, 70])
    assert [r["memory_limit_hits"] for r in rows] == [None, 1, 0]
    assert book.identity_of(KEY) == Identity(2, "/b", 9, "job", "/opt/job")


def test_spans_are_bounded_keeping_the_first_and_the_latest() -> None:
    book = HostBook()
    for i in range(MAX_PLACEMENTS + 5):
        book.place(KEY, Identity(netns=i, cgroup="/"), i)
    spans = book.placements[KEY]
    assert len(spans) == MAX_PLACEMENTS and book.placements_dropped[KEY] == 5
    assert [s.identity.netns for s in spans] == [0, *range(6, MAX_PLACEMENTS + 5)]
    book.forget(KEY)
    assert KEY not in book.placements and KEY not in book.placements_dropped


# ---- the sensors' triggers, on real processes ----


def cpu_cgroup_root() -> Path:
    """Where a process's CPU cgroup lives here: the v1 cpu hierarchy (a hybrid host), else the unified one."""
    root = cgroup_v1_root("cpu") or cgroup2_root()
    assert root is not None
    return root


@pytest.fixture
def two_cgroups() -> Iterator[tuple[Path, Path]]:
    """Two CPU cgroups with quotas of 30% and 10% of a CPU."""
    tag = uuid.uuid4().hex[:8]
    made = []
    try:
        for name, quota in ((f"memtrace-move-a-{tag}", 30_000), (f"memtrace-move-b-{tag}", 10_000)):
            d = make_limited(
                "cpu",
                {"cpu.max": f"{quota} 100000"},
                {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(quota)},
                name,
            )
            if d is None:
                pytest.skip("no cpu cgroup controller")
            made.append(d)
        yield made[0], made[1]
    finally:
        for d in made:
            remove_cgroup(d)


def throttled_ns(d: Path) -> int:
    st = dict(line.split() for line in (d / "cpu.stat").read_text().splitlines())
    return int(st["throttled_usec"]) * 1000 if "throttled_usec" in st else int(st["throttled_time"])


@pytest.mark.bpf
def test_an_exec_and_a_cgroup_move_are_read_at_the_next_sample(tmp_path: Path, two_cgroups: tuple[Path, Path]) -> None:
    """With the periodic reads an hour apart, only the sched sensor's counts
    (its exec and cgroup-move tracepoints) can tell the sampler that a
    process now runs another program in another cgroup: the next sample
    must say so."""
    from memtrace.runtime.hostsignals import HostOptions, HostSignals

    a, _b = two_cgroups
    go = tmp_path / "go"
    # It wakes every 10 ms (the sensor has it from its first switch), then execs.
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
    code += "os.execv('/bin/sleep', ['sleep', '60'])"
    child = subprocess.Popen([sys.executable, "-c", code])
    hs = HostSignals(HostOptions(nccl=False, gpu=False, network=False, fast_hz=0, quota_s=3600), set)
    try:
        hs.start([child.pid])
        for _ in range(500):  # until the sensor has the process (its first switch)
            hs.sample()
            if hs.view()["cpu"]:
                break
            time.sleep(0.01)
        (row,) = hs.view()["cpu"]
        (first,) = row["placements"]
        assert first["executable"] == os.path.realpath(sys.executable)
        go.touch()
        for _ in range(500):  # until it runs sleep
            if Path(f"/proc/{child.pid}/comm").read_text().strip() == "sleep":
                break
            time.sleep(0.01)
        hs.sample()
        (row,) = hs.view()["cpu"]
        (span,) = row["placements"]
        assert (span["process"], span["executable"]) == ("sleep", os.path.realpath("/bin/sleep"))
        (a / "cgroup.procs").write_text(str(child.pid))
        hs.sample()
        (row,) = hs.view()["cpu"]
        assert [p["cgroup"] for p in row["placements"]] == [first["cgroup"], "/" + a.name]
        assert row["placements"][1]["process"] == "sleep"
    finally:
        hs.close()
        child.kill()
        child.wait()


# ---- `memtrace run` around a traced job ----


def run_job(
    fakecuda: Path,
    tmp_path: Path,
    prefix: list[str],
    seconds: float,
    during: Any = None,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], int]:
    """`memtrace run --host-interval 0.1 -- PREFIX trainjob -t SECONDS`; during(pid) is called once the
    job runs. Returns the summary and the job's pid (its own truth)."""
    out, truth = tmp_path / "summary.json", tmp_path / "truth.jsonl"
    job = [str(fakecuda / "trainjob"), "-t", str(seconds), "-L", "300000", "-w", "150000", "-k", "500"]
    p = subprocess.Popen(
        [*memtrace_cmd(), "run", "--host-interval", "0.1", "--format", "json", "-o", str(out), "--", *prefix, *job],
        env=dict(os.environ, WORKLOAD_TRUTH=str(truth), **(env or {})),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if during is not None:
            during(wait_for_job(p.pid))
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    (line,) = truth.read_text().splitlines()
    return json.loads(out.read_text()), json.loads(line)["pid"]


def row_of(doc: dict[str, Any], pid: int) -> dict[str, Any]:
    (row,) = [r for r in doc["host"]["cpu"] if r["pid"] == pid]
    return row


def spans_in_order(row: dict[str, Any]) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = row["placements"]
    for before, after in zip(spans, spans[1:], strict=False):
        assert before["to_time_unix_nano"] == after["from_time_unix_nano"] > before["from_time_unix_nano"]
    assert spans[-1]["to_time_unix_nano"] is None
    return spans


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"mtid{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.bpf
@pytest.mark.parametrize("how", ["ip netns exec", "nsenter", "unshare"])
def test_a_job_that_enters_a_namespace_is_measured_there_and_its_rows_say_so(
    fakecuda: Path, tmp_path: Path, netns: str, how: str
) -> None:
    """memtrace's command starts in memtrace's namespace and enters another
    before its job runs (setns, or a new one): the CPU row's spans are the
    host's namespace, then the job's, with the job's command and executable,
    and the row names the namespace it ended in."""
    prefix = {
        "ip netns exec": ["ip", "netns", "exec", netns],
        "nsenter": ["nsenter", f"--net=/run/netns/{netns}", "--"],
        "unshare": ["unshare", "--net", "--"],
    }[how]
    doc, pid = run_job(fakecuda, tmp_path, prefix, 1.0)
    row = row_of(doc, pid)
    host = os.stat("/proc/self/ns/net").st_ino
    first, then = spans_in_order(row)
    assert first["netns"] == host != then["netns"] == row["netns"]
    if how != "unshare":
        assert then["netns"] == os.stat(f"/run/netns/{netns}").st_ino
    assert {n["netns"] for n in doc["host"]["network"]["namespaces"] if pid in n["pids"]} == {host, then["netns"]}
    assert (then["process"], then["executable"]) == ("trainjob", os.path.realpath(fakecuda / "trainjob"))
    assert first["cgroup"] == then["cgroup"] is not None
    assert row["process"] == "trainjob"  # as the CUDA model met it


@pytest.mark.bpf
def test_a_job_moved_between_cgroups_is_charged_to_each_from_its_move_on(
    fakecuda: Path, tmp_path: Path, two_cgroups: tuple[Path, Path]
) -> None:
    """The job starts in memtrace's cgroup, is moved into one with a 30%
    quota, then into one with 10%: three spans, each throttled by its own
    cgroup's quota only, never more than the kernel counted in that cgroup
    (it held the job alone), and the row's quota is the last one's."""
    a, b = two_cgroups
    moved: dict[str, int] = {}

    def move(pid: int) -> None:
        moved["a"] = time.time_ns()
        (a / "cgroup.procs").write_text(str(pid))
        time.sleep(1.5)
        moved["b"] = time.time_ns()
        (b / "cgroup.procs").write_text(str(pid))

    doc, pid = run_job(fakecuda, tmp_path, [], 3.5, during=move)
    row = row_of(doc, pid)
    home, in_a, in_b = spans_in_order(row)
    assert [s["cgroup"] for s in (in_a, in_b)] == ["/" + a.name, "/" + b.name]
    assert home["cgroup"] not in (in_a["cgroup"], in_b["cgroup"])
    assert moved["a"] <= in_a["from_time_unix_nano"] < moved["b"] <= in_b["from_time_unix_nano"]
    assert home["cpu_quota_throttled_seconds"] == 0
    for span, d in ((in_a, a), (in_b, b)):
        assert 0 < span["cpu_quota_throttled_seconds"] * 1e9 <= throttled_ns(d), (span, d)
    quota = row["cpu_quota"]
    assert quota is not None and quota["cgroup"] == "/" + b.name
    assert quota["throttled_seconds"] == pytest.approx(sum(s["cpu_quota_throttled_seconds"] for s in row["placements"]))
    assert (in_b["process"], in_b["executable"]) == ("trainjob", os.path.realpath(fakecuda / "trainjob"))


@pytest.mark.bpf
def test_a_process_that_execs_another_cuda_program_is_named_by_the_new_one(fakecuda: Path, tmp_path: Path) -> None:
    """A launcher that touches CUDA, then execs the job (one process: its pid
    and start stay): the CUDA model met it as the launcher, and from the exec
    on its rows name the job, its executable and all."""
    launcher = (
        "import ctypes, os, sys, time\n"
        f"rt = ctypes.CDLL({str(fakecuda / 'lib' / 'libcudart.so.13')!r})\n"
        "p = ctypes.c_void_p()\n"
        "assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)) == 0\n"
        "time.sleep(0.5)\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n"
    )
    lib = {"LD_LIBRARY_PATH": str(fakecuda / "lib")}  # the test libcudart opens the test libcuda
    doc, pid = run_job(fakecuda, tmp_path, [sys.executable, "-c", launcher], 1.0, env=lib)
    job = os.path.realpath(fakecuda / "trainjob")
    (proc,) = [p for p in doc["processes"] if p["pid"] == pid]
    assert (proc["process"], proc["executable"]) == ("trainjob", job)
    (span,) = spans_in_order(row_of(doc, pid))
    assert (span["process"], span["executable"]) == ("trainjob", job)
    assert row_of(doc, pid)["process"] == "trainjob"


@pytest.mark.bpf
def test_a_job_moved_under_a_cpu_quota_mid_run_is_diagnosed_with_that_cgroups_quota(
    fakecuda: Path, fakenvml: Path, tmp_path: Path, two_cgroups: tuple[Path, Path]
) -> None:
    """A CPU manager moves a running job into a cgroup whose quota is a tenth
    of a CPU: from the move on it is throttled there, and the diagnosis
    names its own quota and the cgroup it was moved into (not the one it
    started in, which had none)."""
    from test_diagnosis_traced import _ran_as_rank, diagnosed, scenario

    _a, b = two_cgroups
    moved: dict[str, int] = {}

    def move(paths: dict[str, Path]) -> None:
        (pid,) = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ran_as_rank(int(p), paths["control"])]
        moved["pid"] = pid
        (b / "cgroup.procs").write_text(str(pid))

    doc, pid, onset = scenario(fakecuda, fakenvml, tmp_path, move, "-k", "300")
    assert moved["pid"] == pid
    (d, *_) = diagnosed(doc, pid)
    assert d["cause"] == "cpu_interference", doc["diagnoses"]
    assert d["detected_time_unix_nano"] >= onset
    # Its quota's throttling (read every second), or the CPU idling while it waited (each switch)
    assert d["evidence"]["taken_by"].startswith("its own CPU quota")
    assert d["evidence"]["quota_cgroup"] == "/" + b.name
    (home, there) = spans_in_order(row_of(doc, pid))
    assert there["cgroup"] == "/" + b.name and there["from_time_unix_nano"] >= onset
    assert home["cpu_quota_throttled_seconds"] == 0 < there["cpu_quota_throttled_seconds"]
