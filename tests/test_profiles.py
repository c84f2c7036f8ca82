"""`memtrace profile -- CMD`: the call sites as a pprof profile that the
real pprof (`go tool pprof`) reads with the JSON summary's exact totals,
an SVG flame graph whose frames weigh the copied bytes, and folded stacks,
from a real CPython calling the test CUDA runtime."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import FIXTURES, memtrace_cmd
from test_stacks import interpreters

SVG = "{http://www.w3.org/2000/svg}"


def profile(tmp_path: Path, fakecuda: Path) -> tuple[Path, dict]:
    out = tmp_path / "prof"
    env = dict(
        os.environ, WORKLOAD_TRUTH=str(tmp_path / "truth.jsonl"), FAKE_LIBCUDA=str(fakecuda / "lib" / "libcuda.so.1")
    )
    python = interpreters()[-1]
    p = subprocess.run(
        [
            *memtrace_cmd(),
            "profile",
            "-o",
            str(out),
            "--",
            python,
            str(FIXTURES / "ctypes_sites.py"),
            str(fakecuda / "lib"),
            "5",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(out)) == ["copies.folded", "copies.svg", "memtrace.pb.gz", "summary.json", "timeline.html"]
    # It says what it measured (the table run prints) and every file it wrote, with its size.
    assert "memcpy" in p.stderr.lower() or "h2d" in p.stderr, p.stderr
    for name in os.listdir(out):
        assert f"memtrace: wrote {out / name} ({(out / name).stat().st_size:,} bytes)" in p.stderr, p.stderr
    return out, json.loads((out / "summary.json").read_text())


def pprof_raw(path: Path) -> tuple[list[str], list[list[int]]]:
    """The sample types and each sample's values, as `go tool pprof -raw` reads the file."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    text = subprocess.run([go, "tool", "pprof", "-raw", str(path)], capture_output=True, text=True, check=True).stdout
    lines = text.splitlines()
    at = lines.index("Samples:")
    types = [t.split("/")[0] for t in lines[at + 1].split()]
    values = []
    for line in lines[at + 2 :]:
        m = re.match(r"^\s+(\d[\d ]*):", line)
        if m:
            values.append([int(v) for v in m.group(1).split()])
        elif line and not line.startswith(" "):
            break
    return types, values


@pytest.mark.bpf
def test_pprof_holds_the_summarys_exact_totals(fakecuda: Path, tmp_path: Path) -> None:
    out, doc = profile(tmp_path, fakecuda)
    types, samples = pprof_raw(out / "memtrace.pb.gz")
    assert types == ["copies", "copy_bytes", "allocations", "allocated_bytes", "in_use_bytes"]
    total = dict(zip(types, (sum(col) for col in zip(*samples, strict=True)), strict=True))
    copies = [s for s in doc["stacks"] if s["kind"] == "copy"]
    allocs = [s for s in doc["stacks"] if s["kind"] == "alloc"]
    assert total["copies"] == sum(r["calls"] for r in doc["memcpy"]) == sum(s["calls"] for s in copies)
    assert total["copy_bytes"] == sum(r["bytes"] for r in doc["memcpy"]) == sum(s["bytes"] for s in copies)
    assert total["allocations"] == sum(s["calls"] for s in allocs) > 0
    assert total["allocated_bytes"] == sum(s["bytes"] for s in allocs)
    assert total["in_use_bytes"] == sum(s["in_use_bytes"] for s in allocs) == 1 << 16
    assert len(samples) == len(doc["stacks"])


@pytest.mark.bpf
def test_pprof_names_the_python_lines(fakecuda: Path, tmp_path: Path) -> None:
    """pprof's own view by function: the Python call sites carry the bytes."""
    out, doc = profile(tmp_path, fakecuda)
    go = shutil.which("go") or "/usr/local/go/bin/go"
    top = subprocess.run(
        [go, "tool", "pprof", "-sample_index=copy_bytes", "-raw", str(out / "memtrace.pb.gz")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.search(r"main\.<locals>\.upload \S+ctypes_sites\.py:\d+", top), top
    assert "[module]" in top  # <module>, which pprof would print as nothing


@pytest.mark.bpf
def test_the_flame_graph_is_self_contained_and_weighs_the_copied_bytes(fakecuda: Path, tmp_path: Path) -> None:
    out, doc = profile(tmp_path, fakecuda)
    text = (out / "copies.svg").read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")  # nothing to fetch to view it
    root = ET.fromstring(text)
    frames = {}
    for g in root.iter(f"{SVG}g"):
        name, _, weight = g.find(f"{SVG}title").text.rpartition(": ")
        frames.setdefault(name, []).append((float(g.get("data-w")), int(weight.split()[0].replace(",", ""))))
    total = sum(r["bytes"] for r in doc["memcpy"])
    assert frames["all"] == [(1.0, total)]
    # Each copy site's leaf frame is as wide as its share of the bytes.
    for s in doc["stacks"]:
        if s["kind"] != "copy":
            continue
        leaf = f"{s['api']} {s['direction']} {s['host_memory']}"
        assert (round(s["bytes"] / total, 6), s["bytes"]) in [(round(w, 6), b) for w, b in frames[leaf]]
    assert any(name.startswith("main.<locals>.upload (ctypes_sites.py:") for name in frames)
    assert (out / "copies.folded").read_text().count("\n") == sum(1 for s in doc["stacks"] if s["kind"] == "copy")


FRAMES_JS = """JSON.stringify([].map.call(document.querySelectorAll('g.f'), function (g) {
  var r = g.querySelector('rect').getBoundingClientRect();
  return {n: g.dataset.n, w: +g.dataset.w, shown: g.style.display !== 'none', x: r.left, px: r.width,
          y: r.top + r.height / 2, label: g.querySelector('text').textContent};
}))"""


@pytest.mark.bpf
def test_the_flame_graph_opens_in_a_real_browser_and_zooms_where_it_is_clicked(fakecuda: Path, tmp_path: Path) -> None:
    """memtrace profile's SVG opened in headless Chromium, as a user opens
    it: its script runs without an error; every frame is drawn as wide as
    its share of the bytes; a real click on a call site zooms to it (it
    fills the width, its callees widen by the same factor, the frames
    beside it are hidden), and a click on the title puts everything back.
    Saves a screenshot of each view (tmp_path)."""
    from browser import Browser

    out, doc = profile(tmp_path, fakecuda)
    with Browser(width=1280, height=900) as b:
        b.open(out / "copies.svg")
        assert b.exceptions == []
        width = b.eval("document.documentElement.getBoundingClientRect().width")
        frames = json.loads(b.eval(FRAMES_JS))
        assert len(frames) == len(ET.fromstring((out / "copies.svg").read_text()).findall(f"{SVG}g"))
        for f in frames:
            assert f["shown"] and abs(f["px"] - f["w"] * width) <= 1.0, f
        b.screenshot(tmp_path / "flamegraph.png")

        # A Python call site that made part of the bytes, with a callee (its copies).
        site = next(f for f in frames if f["n"].startswith("main.<locals>.upload (ctypes_sites.py:") and f["w"] < 1)
        b.click(site["x"] + site["px"] / 2, site["y"])
        zoomed = json.loads(b.eval(FRAMES_JS))
        same = [f for f in zoomed if f["n"] == site["n"] and f["shown"]]
        assert len(same) == 1 and abs(same[0]["x"]) <= 1.0 and abs(same[0]["px"] - width) <= 1.0
        for before, after in zip(frames, zoomed, strict=True):
            inside = before["x"] + before["px"] > site["x"] + 0.5 and before["x"] < site["x"] + site["px"] - 0.5
            assert after["shown"] == inside, (before, after)
            if inside:  # its callers and callees scaled by the zoom (callers past the edges)
                assert abs(after["px"] - before["px"] * width / site["px"]) <= 1.0, (before, after)
        assert b.exceptions == []
        b.screenshot(tmp_path / "flamegraph-zoomed.png")

        title = b.eval("JSON.stringify(document.getElementById('title').getBoundingClientRect())")
        t = json.loads(title)
        b.click(t["left"] + 5, t["top"] + t["height"] / 2)
        reset = json.loads(b.eval(FRAMES_JS))
        assert [(f["n"], f["shown"], round(f["px"])) for f in reset] == [(f["n"], True, round(f["px"])) for f in frames]
    png = (tmp_path / "flamegraph.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") >= width


@pytest.mark.parametrize("flag", ["--pprof", "--flamegraph"])
def test_profile_outputs_without_stacks_are_refused_before_the_command_runs(flag: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    p = subprocess.run(
        [*memtrace_cmd(), "run", flag, str(tmp_path / "f"), "--", "touch", str(marker)], capture_output=True, text=True
    )
    assert p.returncode != 0
    assert f"{flag} needs --stacks" in p.stderr and "Traceback" not in p.stderr
    assert not marker.exists()


@pytest.mark.bpf
def test_memory_growth_names_where_what_is_in_use_was_allocated(fakecuda: Path, tmp_path: Path) -> None:
    """device_memory_growth (which needs minutes of growth to fire) is
    given the allocating sites of a real run's summary: the sites holding
    most of what is in use are named, Python line first."""
    from memtrace.export.callsites import name_the_lines

    _, doc = profile(tmp_path, fakecuda)
    allocs = [s for s in doc["stacks"] if s["kind"] == "alloc"]
    pid = allocs[0]["pid"]
    in_use = sum(s["in_use_bytes"] for s in allocs)
    finding = {
        "code": "device_memory_growth",
        "pid": pid,
        "summary": "device memory grew",
        "evidence": {"in_use_bytes": in_use},
    }
    name_the_lines([finding], doc["stacks"])
    (site,) = finding["evidence"]["sites"]
    assert site["in_use_bytes"] == in_use == 1 << 16 and site["share"] == 1.0
    assert re.fullmatch(r"ctypes_sites\.py:\d+ in main", site["site"]), site
    assert finding["summary"] == f"device memory grew; 100% of what is in use allocated at {site['site']}"


@pytest.mark.bpf
@pytest.mark.e2e
def test_push_sends_call_sites_as_otlp_profiles_through_the_real_collector(fakecuda: Path, tmp_path: Path) -> None:
    """`memtrace push --stacks` to the real collector (deploy/otelcol/agent.yaml,
    its profiles pipeline behind the feature gate the manifests set), which
    sends them on over OTLP/HTTP to a receiver here: every call site of a
    Python workload arrives with its Python frames (function, file, the
    line of the call), and its calls and bytes, summed over the pushes'
    deltas, are the workload's own, exactly; the bytes still in use too."""
    from backends import Collector, OtlpProfileSink
    from conftest import REPO
    from test_push import start_push, stop_push

    sink = OtlpProfileSink()
    col = Collector(
        tmp_path,
        REPO / "deploy" / "otelcol" / "agent.yaml",
        {"MEMTRACE_EXPORT_ENDPOINT": sink.endpoint, "MEMTRACE_PROFILES_ENDPOINT": sink.endpoint},
    )
    push = start_push(
        ["--endpoint", f"http://127.0.0.1:{col.http_port}", "--protocol", "http/protobuf", "--interval", "1"]
        + ["--no-host", "--stacks"]
    )
    try:
        truth_path = tmp_path / "truth.jsonl"
        env = dict(os.environ, WORKLOAD_TRUTH=str(truth_path), SITES_LINGER="1.5")
        python = interpreters()[-1]
        for rounds in ("3", "5"):  # two processes, the second across a push or two
            # Its own copy of the libraries: held on their mapping, so its Python frames are
            # known from its first call (a process mapping libraries already attached is
            # looked at after its first call, as README's known limits say).
            lib = tmp_path / f"lib{rounds}"
            shutil.copytree(fakecuda / "lib", lib)
            argv = [python, str(FIXTURES / "ctypes_sites.py"), str(lib), rounds]
            subprocess.run(argv, env=env, check=True, timeout=120)
        truths = [json.loads(line) for line in truth_path.read_text().splitlines()]
        time.sleep(2.5)
        rc, _, err = stop_push(push)
        assert rc == 0, err
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
            any(s["resource"].get("process.pid") == t["pid"] for s in sink.samples) for t in truths
        ):
            time.sleep(0.2)
        for t in truths:
            mine = [s for s in sink.samples if s["resource"].get("process.pid") == t["pid"]]
            assert mine, (t["pid"], col.log_path.read_text()[-3000:], err)
            assert {s["resource"]["process.executable.name"] for s in mine} <= {"python3", os.path.basename(python)}
            for site in t["sites"]:

                def at_site(s: dict, site: dict = site, file: str = t["file"]) -> bool:
                    py = [(f["function"].rsplit(".", 1)[-1], f["line"]) for f in s["frames"] if "file" in f]
                    return py[: len(site["python"])] == [tuple(x) for x in site["python"]] and all(
                        f["file"] == file for f in s["frames"] if "file" in f
                    )

                here = [s for s in mine if at_site(s)]
                assert here, (site, [(s["type"], s["frames"][:4]) for s in mine][:6])
                if site["kind"] == "copy":
                    calls = sum(s["value"] for s in here if s["type"] == "copies")
                    nbytes = sum(s["value"] for s in here if s["type"] == "copy_bytes")
                    assert {s["attributes"]["memtrace.direction"] for s in here} == {site["direction"]}
                else:
                    calls = sum(s["value"] for s in here if s["type"] == "allocations")
                    nbytes = sum(s["value"] for s in here if s["type"] == "allocated_bytes")
                    in_use = [s for s in here if s["type"] == "in_use_bytes"]
                    assert in_use and in_use[-1]["value"] == site["in_use_bytes"]
                assert (calls, nbytes) == (site["calls"], site["bytes"]), (site, here)
    finally:
        if push.poll() is None:
            push.kill()
        col.stop()
        sink.stop()


RUNNING = """
import ctypes, os, sys, time
lib, go, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.environ["FAKE_LIBCUDA"] = os.path.join(lib, "libcuda.so.1")
rt = ctypes.CDLL(os.path.join(lib, "libcudart.so.13"))
rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
host = ctypes.create_string_buffer(4096)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
rt.cudaMemcpy(ctypes.c_void_p(0x1000), host, 1, 1)  # the first call memtrace sees: it learns of the process
time.sleep(0.5)


def upload():
    for _ in range(n):
        assert rt.cudaMemcpy(ctypes.c_void_p(0x1000), host, 4096, 1) == 0  # site
upload()
print("done", flush=True)
"""


@pytest.mark.bpf
def test_profile_a_running_process_by_pid(fakecuda: Path, tmp_path: Path) -> None:
    """`memtrace profile --pid`: a Python process that was already running
    (its libraries mapped before memtrace started) is profiled until it
    exits: every copy it made from then on, exactly, the ones after its
    first with their Python call site; it runs on unharmed."""
    script = tmp_path / "running.py"
    script.write_text(RUNNING)
    go = tmp_path / "go"
    python = interpreters()[-1]
    work = subprocess.Popen(
        [python, str(script), str(fakecuda / "lib"), str(go), "40"], stdout=subprocess.PIPE, text=True
    )
    assert work.stdout is not None and work.stdout.readline().strip() == "ready"
    out = tmp_path / "prof"
    prof = subprocess.Popen(
        [*memtrace_cmd(), "profile", "-v", "--pid", str(work.pid), "--duration", "60", "-o", str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert prof.stderr is not None
        for line in prof.stderr:  # its libraries attached: the calls from now on are seen
            if "attached" in line and "libcudart" in line:
                break
        go.touch()
        assert work.stdout.readline().strip() == "done"
        assert work.wait(timeout=60) == 0
        prof.communicate(timeout=60)  # its stderr read to the end: a full pipe would stop it
        assert prof.returncode == 0
    finally:
        for p in (work, prof):
            if p.poll() is None:
                p.kill()
    doc = json.loads((out / "summary.json").read_text())
    assert doc["command"]["pid"] == work.pid
    assert doc["totals"]["h2d"]["calls"] == 41 and doc["totals"]["h2d"]["bytes"] == 40 * 4096 + 1
    (site,) = [s for s in doc["stacks"] if s["bytes"] == 40 * 4096]
    assert site["calls"] == 40
    py = [f for f in site["frames"] if "file" in f]
    line = next(i for i, text in enumerate(RUNNING.splitlines(), 1) if text.endswith("# site"))
    assert py and py[0]["file"] == str(script) and py[0]["line"] == line, site["frames"]
    assert py[0]["function"].endswith("upload")
    assert sorted(os.listdir(out)) == ["copies.folded", "copies.svg", "memtrace.pb.gz", "summary.json", "timeline.html"]


def test_profile_asks_for_a_command_or_a_pid(tmp_path: Path) -> None:
    for argv in ([], ["--pid", "1", "--", "true"], ["--pid", "999999999"]):
        p = subprocess.run(
            [*memtrace_cmd(), "profile", "-o", str(tmp_path / "p"), *argv], capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 2 and "fix:" in p.stderr and "Traceback" not in p.stderr, (argv, p.stderr)


ATTACHED = """
import ctypes, os, sys, time
lib, go, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.environ["FAKE_LIBCUDA"] = os.path.join(lib, "libcuda.so.1")
rt = ctypes.CDLL(os.path.join(lib, "libcudart.so.13"))
vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
rt.cudaMemcpy.argtypes = [vp, vp, sz, ci]
rt.cudaMallocHost.argtypes = [ctypes.POINTER(vp), sz]
MIB = 1 << 20
pinned_before = vp()
assert rt.cudaMallocHost(ctypes.byref(pinned_before), MIB) == 0  # pinned before memtrace attaches
pageable = ctypes.create_string_buffer(MIB)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
pinned_after = vp()
assert rt.cudaMallocHost(ctypes.byref(pinned_after), MIB) == 0  # pinned while memtrace watches
for _ in range(n):
    assert rt.cudaMemcpy(vp(0x1000), pinned_before, MIB, 1) == 0
    assert rt.cudaMemcpy(vp(0x1000), pageable, MIB, 1) == 0
    assert rt.cudaMemcpy(vp(0x1000), pinned_after, MIB, 1) == 0
print("done", flush=True)
"""


@pytest.mark.bpf
def test_attaching_to_a_running_process_never_calls_its_earlier_memory_pageable(fakecuda: Path, tmp_path: Path) -> None:
    """`memtrace profile --pid` on a process that allocated pinned memory
    before memtrace attached: what it did before is not seen, so a buffer
    memtrace never saw allocated is `unknown`, never `pageable` (the fix
    "pin it" would be wrong for the pinned one), and no pageable finding
    is made; memory allocated while memtrace watches is named exactly."""
    script = tmp_path / "attached.py"
    script.write_text(ATTACHED)
    go, n = tmp_path / "go", 100
    work = subprocess.Popen(
        [sys.executable, str(script), str(fakecuda / "lib"), str(go), str(n)], stdout=subprocess.PIPE, text=True
    )
    assert work.stdout is not None and work.stdout.readline().strip() == "ready"
    out = tmp_path / "prof"
    prof = subprocess.Popen(
        [*memtrace_cmd(), "profile", "-v", "--pid", str(work.pid), "--duration", "60", "-o", str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert prof.stderr is not None
        for line in prof.stderr:
            if "attached" in line and "libcudart" in line:
                break
        go.touch()
        assert work.stdout.readline().strip() == "done"
        assert work.wait(timeout=60) == 0
        prof.communicate(timeout=60)  # its stderr read to the end: a full pipe would stop it
        assert prof.returncode == 0
    finally:
        for p in (work, prof):
            if p.poll() is None:
                p.kill()
    doc = json.loads((out / "summary.json").read_text())
    kinds: dict[str, int] = {}
    for r in doc["memcpy"]:
        if r["direction"] == "h2d":
            kinds[r["host_memory"]] = kinds.get(r["host_memory"], 0) + r["calls"]
    assert kinds == {"unknown": 2 * n, "pinned": n}, kinds
    assert not [f for f in doc["findings"] if f["code"] == "pageable_h2d"], doc["findings"]
