"""What a new user meets first, run through the real CLI as a subprocess:
exit codes, errors without tracebacks, output that never mixes with the
traced command's, and tables readable at 80 columns."""

from __future__ import annotations

import io
import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, memtrace_cmd, python_as_nobody, top_over_a_released_workload


def memtrace(*args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*memtrace_cmd(), *args], capture_output=True, text=True, env=dict(os.environ, **(env or {})), **kw
    )


def shell(cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A pipeline as a user types it, memtrace being `$MT`."""
    mt = " ".join(memtrace_cmd())
    return subprocess.run(
        ["bash", "-c", "set -o pipefail; " + cmd.replace("$MT", mt)],
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        timeout=120,
    )


@pytest.mark.parametrize("size", ["nan", "inf", "-inf", "NaN"])
def test_ring_size_not_a_number_is_a_clear_error(size: str) -> None:
    p = memtrace("run", "--ring-size", size, "--", "true")
    assert p.returncode == 2, p.stderr
    assert "--ring-size" in p.stderr and "fix:" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.bpf
def test_doctor_as_non_root_reports_instead_of_crashing(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *site.getsitepackages()]))
    p = subprocess.run(
        [*python_as_nobody(), "-m", "memtrace", "doctor"], capture_output=True, text=True, env=env, cwd="/", timeout=120
    )
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL  privileges: uid 65534" in p.stdout
    assert "cannot run here" in p.stdout


@pytest.mark.bpf
@pytest.mark.parametrize(
    "pipeline",
    [
        "$MT run -- sh -c 'exit 5' | head -1",
        "$MT run -- sh -c 'exit 5' 2>&1 | true",
        "$MT run --format json -- sh -c 'exit 5' | true",
        "$MT run --format json -- sh -c 'exit 5' 2>&1 | true",
    ],
)
def test_run_exits_with_the_command_code_when_its_reader_has_gone(pipeline: str) -> None:
    # The reader (`true`) is gone long before the summary is written: a broken pipe.
    p = shell(pipeline + "; echo status=$? >&2")
    assert p.stderr.strip().endswith("status=5"), p.stderr
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


@pytest.mark.bpf
def test_unwritable_output_fails_before_the_command_runs(tmp_path: Path) -> None:
    mark = tmp_path / "ran"
    for bad in (tmp_path / "no" / "such" / "dir.json", Path("/proc/memtrace.json"), tmp_path):
        p = memtrace("run", "-o", str(bad), "--", "sh", "-c", f"touch {mark}")
        assert p.returncode == 2, p.stderr
        assert "cannot write the summary" in p.stderr and "fix:" in p.stderr
        assert "Traceback" not in p.stderr
        assert not mark.exists(), "the command ran although its summary could not be written"
    kept = tmp_path / "kept.json"
    kept.write_text("keep me")
    p = memtrace("run", "-o", str(kept), "--", "/no/such/program")
    assert p.returncode == 2 and kept.read_text() == "keep me"


@pytest.mark.bpf
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_output_to_a_device_or_a_pipe_is_written_not_truncated(fakecuda: Path, fmt: str) -> None:
    # -o /dev/null (the summary thrown away) and -o /dev/stdout into a pipe:
    # neither can be truncated; the summary is written all the same.
    wl = fakecuda / "workload"
    p = memtrace("run", "--format", fmt, "-o", "/dev/null", "--", str(wl), "-n", "20")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    # With -o, stdout stays the command's: it prints nothing here.
    p = shell(f"$MT run --format {fmt} -o /dev/stdout -- {wl} -n 20 | cat", env={"WORKLOAD_TRUTH": "/dev/null"})
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    if fmt == "json":
        agent = json.loads(p.stdout)["agent"]
        assert (agent["events"], agent["dropped"]) == (20, 0)
    else:
        assert "agent: events 20, dropped 0" in p.stdout, p.stdout


@pytest.mark.bpf
def test_the_summary_is_written_before_the_agent_takes_its_probes_away(fakecuda: Path, tmp_path: Path) -> None:
    """Removing the probes and tracepoints waits out the kernel's grace
    periods (bench/exit_time.py: about half the time memtrace takes after
    its command on the 2-vCPU VM). The summary is written before that
    begins: what the agent's close finds in the -o file is the summary."""
    out = tmp_path / "summary.json"
    script = f"""
import json, sys
from memtrace.runtime.agent import Agent
close = Agent.close
def closing(self):
    try:
        said = json.load(open({str(out)!r}))["agent"]["events"]
    except ValueError:
        said = "nothing"
    sys.stderr.write(f"AT CLOSE {{said}}\\n")
    close(self)
Agent.close = closing
sys.argv = ["memtrace", "run", "--format", "json", "-o", {str(out)!r}, "--", {str(fakecuda / "workload")!r}, "-n", "20"]
from memtrace.cli import entry
entry()
"""
    p = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=dict(os.environ, WORKLOAD_TRUTH="/dev/null"),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    at_close = [line for line in p.stderr.splitlines() if line.startswith("AT CLOSE ")]
    assert at_close == ["AT CLOSE 20"], p.stderr
    assert json.loads(out.read_text())["agent"]["events"] == 20


@pytest.mark.bpf
def test_json_on_stdout_never_mixes_with_the_command_output(fakecuda: Path) -> None:
    wl = fakecuda / "workload"
    p = shell(f"$MT run --format json -- sh -c 'echo hello; exec {wl} -n 50 -e' | {sys.executable} -m json.tool")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["command"]["exit_code"] == 0 and doc["totals"]["h2d"]["calls"] > 0
    assert "hello" in p.stderr  # the command's stdout went to stderr, not lost


@pytest.mark.bpf
def test_a_command_without_cuda_is_said_plainly() -> None:
    p = memtrace("run", "--", "sh", "-c", "exit 3")
    assert p.returncode == 3
    assert "loaded no CUDA library" in p.stderr
    assert "libraries: none" not in p.stderr and "direction" not in p.stderr


def _exact_per_process_direction(lines: list[dict]) -> dict[tuple[int, str], int]:
    out: dict[tuple[int, str], int] = {}
    for line in lines:
        for c in line["copies"]:
            k = (line["pid"], c["direction"])
            out[k] = out.get(k, 0) + c["bytes"]
    return out


@pytest.mark.bpf
@pytest.mark.parametrize("how", ["stderr-piped", "output-file"])
def test_the_table_fits_80_columns_and_shows_every_exact_byte_total(fakecuda: Path, tmp_path: Path, how: str) -> None:
    truth = tmp_path / "truth.jsonl"
    out = tmp_path / "table.txt"
    args = ["-o", str(out)] if how == "output-file" else []
    p = memtrace(
        "run",
        *args,
        "--",
        str(fakecuda / "workload"),
        "-n",
        "300",
        "-f",
        env={"WORKLOAD_TRUTH": str(truth), "COLUMNS": "80"},
    )
    assert p.returncode == 0, p.stderr
    text = out.read_text() if how == "output-file" else p.stderr
    # memtrace's own log lines (warnings) may precede the summary on stderr.
    text = text[text.index("memtrace: CUDA memory copies") :]
    lines = [json.loads(l) for l in truth.read_text().splitlines()]
    exact = _exact_per_process_direction(lines)
    assert len({pid for pid, _ in exact}) == 2  # parent and forked child
    rows = text.splitlines()
    for (pid, direction), n in exact.items():
        if n == 0:
            continue
        block = text[text.index(f"pid {pid} ") :]
        row = next(r for r in block.splitlines() if r.split()[:1] == [direction])
        assert f"{n:,}" in row.split(), (pid, direction, n, row)
    assert max(len(r) for r in rows) <= 80, max(rows, key=len)
    assert "…" not in text


@pytest.mark.bpf
def test_the_detail_table_is_never_cut_when_piped(fakecuda: Path, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    p = memtrace(
        "run",
        "--detail",
        "--",
        str(fakecuda / "workload"),
        "-n",
        "300",
        env={"WORKLOAD_TRUTH": str(truth), "COLUMNS": "80"},
    )
    assert p.returncode == 0, p.stderr
    # Rows are per API, direction and host memory: sum the exact bytes of each API and direction.
    shown: dict[tuple[str, str], int] = {}
    for r in p.stderr.splitlines():
        tok = r.split()
        nums = [t for t in tok if re.fullmatch(r"[\d,]+", t)]
        if len(tok) > 2 and tok[0].startswith("cu") and len(nums) >= 2:
            shown[(tok[0], tok[1])] = shown.get((tok[0], tok[1]), 0) + int(nums[1].replace(",", ""))
    want: dict[tuple[str, str], int] = {}
    for line in truth.read_text().splitlines():
        for c in json.loads(line)["copies"]:
            want[(c["api"], c["direction"])] = want.get((c["api"], c["direction"]), 0) + c["bytes"]
    assert shown == want
    assert "…" not in p.stderr


_ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[()][A-Za-z0-9]|[=>])")


def on_a_terminal(argv: list[str], env: dict[str, str], feed: object = None, timeout: float = 120) -> str:
    """Run `argv` on a pseudo-terminal of 80x24 (a real terminal: rich folds
    what does not fit) and return what it showed, escapes and returns taken
    out. `feed(seen)` is called with the output so far, until it returns True."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child: the command on the pty
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        os.execvpe(argv[0], argv, dict(os.environ, COLUMNS="80", LINES="24", TERM="xterm", **env))
    seen = b""
    fed = feed is None
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not fed and feed(seen.decode(errors="replace")):  # type: ignore[operator]
                fed = True
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child is gone: EIO
                    break
                if not chunk:
                    break
                seen += chunk
        else:
            pytest.fail(f"{argv} did not finish: {seen[-2000:]!r}")
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    return _ESCAPES.sub("", seen.decode(errors="replace")).replace("\r", "")


def _blocks(text: str, first: str, row: str) -> list[tuple[str, list[str]]]:
    """The tables whose header starts with `first`: (header, rows) each, a
    row being each line that follows it starting with `row`."""
    out: list[tuple[str, list[str]]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith(first + " "):
            out.append((line, []))
            inside = True
        elif inside and line.startswith(row):
            out[-1][1].append(line)
        else:
            inside = False
    return out


@pytest.mark.bpf
def test_the_detail_table_on_an_80_column_terminal_never_cuts_a_number(fakecuda: Path, tmp_path: Path) -> None:
    """`run --detail` on a terminal of 80 columns: the columns in groups that
    fit, each led by api, dir and host, rather than cells folded in two."""
    truth = tmp_path / "truth.jsonl"
    shown = on_a_terminal(
        [*memtrace_cmd(), "run", "--detail", "--", str(fakecuda / "workload"), "-n", "300"],
        {"WORKLOAD_TRUTH": str(truth)},
    )
    text = shown[shown.index("memtrace: CUDA memory copies") :]
    assert max(len(l) for l in text.splitlines()) <= 80, text
    assert "…" not in text
    got: dict[tuple[str, str], int] = {}
    blocks = _blocks(text, "api", "cu")  # the test libraries' APIs: cuda* and cu*
    assert len(blocks) >= 2  # the table in groups of columns
    # Every figure with a thousands separator whole: never `48,308,4` then `94`.
    numbers = [t for _, rows in blocks for r in rows for t in r.split() if "," in t]
    assert numbers and all(re.fullmatch(r"\d{1,3}(,\d{3})+", n) for n in numbers), numbers
    for header, rows in blocks:
        assert header.split()[:3] == ["api", "dir", "host"], header
        if " bytes" not in header:
            continue
        end = header.index(" bytes") + len(" bytes")
        for r in rows:
            api, direction = r.split()[:2]
            got[(api, direction)] = got.get((api, direction), 0) + int(r[:end].split()[-1].replace(",", ""))
    want: dict[tuple[str, str], int] = {}
    for line in truth.read_text().splitlines():
        for c in json.loads(line)["copies"]:
            want[(c["api"], c["direction"])] = want.get((c["api"], c["direction"]), 0) + c["bytes"]
    assert got == want


@pytest.mark.bpf
def test_top_detail_on_an_80_column_terminal_shows_its_columns_in_groups(fakecuda: Path) -> None:
    """`top --detail` needs about 160 columns: at 80, its columns come in
    groups that fit, each led by pid and process, every header whole."""
    w = subprocess.Popen(
        [str(fakecuda / "workload"), "-w", "-n", "2000", "-e"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"WORKLOAD_TRUTH": "/dev/null"},
    )
    assert w.stdout is not None and w.stdout.readline().strip() == "ready"
    lib = str(fakecuda / "lib" / "libcudart")

    def release(seen: str) -> bool:
        if not any("attached" in l and lib in l for l in seen.splitlines()):
            return False
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
        return True

    try:
        shown = on_a_terminal([*memtrace_cmd(), "top", "-v", "--detail", "-n", "3", "-i", "1"], {}, feed=release)
    finally:
        w.wait(timeout=60)
    text = shown[shown.rindex("memtrace top: CUDA processes") :]  # the last refresh
    assert max(len(l) for l in text.splitlines()) <= 80, text
    assert "…" not in text
    from memtrace.export.top import TopView

    headers = [l for l in text.splitlines() if l.split()[:2] == ["pid", "process"]]
    assert len(headers) >= 2, text
    every = " ".join(" ".join(h.split()) for h in headers)
    for c in (*TopView.COLUMNS, *TopView.DETAIL):
        assert c in every, (c, text)
    rows = [l for l in text.splitlines() if l.split()[:2] == [str(w.pid), "workload"]]
    assert len(rows) == len(headers), text  # the process in every group


def test_help_reads_well_at_80_columns() -> None:
    env = {"COLUMNS": "80"}
    p = memtrace("run", "--help", env=env)
    assert p.returncode == 0
    assert p.stdout.splitlines()[0].endswith(" run [OPTIONS] -- CMD [ARGS]..."), p.stdout
    p = memtrace("run", env=env)
    assert p.returncode == 2 and " run [OPTIONS] -- CMD [ARGS]...\n" in p.stderr, p.stderr
    for cmd in ("run", "top", "push", "doctor"):
        p = memtrace(cmd, "--help", env=env)
        assert p.returncode == 0, p.stderr
        for odd in ("<bool>", "{", "…", "<list"):
            assert odd not in p.stdout, (cmd, odd, p.stdout)
        assert all(len(l) <= 80 for l in p.stdout.splitlines()), p.stdout
        if cmd in ("run", "top", "push"):
            verbose = next(l for l in p.stdout.splitlines() if "--verbose" in l)
            assert "Log " in verbose, verbose
    p = memtrace("push", "--help", env=env)
    assert "(OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT)" in p.stdout
    p = memtrace("--help", env=env)
    assert "..." not in p.stdout.split("Commands:")[1], p.stdout


@pytest.mark.bpf
def test_verbose_names_libbpf_once() -> None:
    p = memtrace("run", "-v", "--", "true")
    assert p.returncode == 0, p.stderr
    assert "memtrace: libbpf: " in p.stderr
    assert "libbpf: libbpf:" not in p.stderr


@pytest.mark.bpf
def test_a_library_replaced_on_disk_is_listed_once(fakecuda: Path, tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from memtrace.export.report import print_table

    # A real summary; then the runtime attached a second time under the same
    # path, as the agent records a file replaced on disk (a new inode; see
    # test_reliability's replaced-library test, whose attach can race).
    out = tmp_path / "summary.json"
    p = memtrace(
        "run",
        "-f",
        "json",
        "-o",
        str(out),
        "--",
        str(fakecuda / "workload"),
        "-n",
        "20",
        env={"WORKLOAD_TRUTH": "/dev/null"},
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    libs = doc["agent"]["libraries"]
    runtime = next(l for l in libs if l["layer"] == "runtime")
    libs.append(dict(runtime))
    text = io.StringIO()
    print_table(doc, Console(file=text, width=300))
    line = next(l for l in text.getvalue().splitlines() if l.startswith("libraries: "))
    assert line.count(runtime["path"] + " (") == 1, line
    assert f"{runtime['path']} (runtime, {runtime['probes']} symbols, replaced on disk" in line, line


@pytest.mark.bpf
def test_a_run_through_the_test_libraries_is_labelled_simulated(fakecuda: Path, tmp_path: Path) -> None:
    """The test libraries export memtrace_simulated_cuda: the JSON and the
    table say the figures are not a GPU's; a real CUDA library's run says nothing."""
    from rich.console import Console

    from memtrace.export.report import print_table

    out = tmp_path / "summary.json"
    p = memtrace("run", "-f", "json", "-o", str(out), "--", str(fakecuda / "workload"), "-n", "20")
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["simulated"] is True
    assert doc["agent"]["libraries"] and all(l["simulated"] for l in doc["agent"]["libraries"])

    def table() -> str:
        text = io.StringIO()
        print_table(doc, Console(file=text, width=80))
        return text.getvalue()

    said = table()
    assert said.splitlines()[1].startswith("simulated: the CUDA library traced is memtrace's test library"), said
    assert "not a GPU's" in " ".join(said.split())
    doc["simulated"] = False
    for l in doc["agent"]["libraries"]:
        l["simulated"] = False
    assert "simulated" not in table()


@pytest.mark.bpf
def test_q_quits_top_on_a_terminal() -> None:
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - child: top on the pty, until q
        os.execvpe(memtrace_cmd()[0], [*memtrace_cmd(), "top", "-i", "0.5"], dict(os.environ, COLUMNS="80"))
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"memtrace top" not in seen and time.monotonic() < deadline:
            if select.select([fd], [], [], 1)[0]:
                seen += os.read(fd, 4096)
        assert b"memtrace top" in seen, seen
        os.write(fd, b"q")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    seen += os.read(fd, 4096)
                except OSError:
                    pass
        else:
            pytest.fail("top did not quit on q")
        assert os.waitstatus_to_exitcode(status) == 0, seen
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def test_the_pageable_share_of_a_process_attached_to_is_unknown_never_0() -> None:
    """Attached to a running process (top, profile --pid), a pointer never
    seen allocated is of unknown kind: top's pageable column and the table's
    host memory say unknown, or a bound, where they said 0%."""
    from rich.console import Console
    from test_findings import COPY, events

    from memtrace.core.abi import Direction
    from memtrace.export.report import print_table, summary
    from memtrace.export.top import TopView
    from memtrace.model import Model

    driver = 0x7E00_0000_0000
    copy = {"api": COPY, "direction": Direction.H2D, "bytes": 64 << 20, "duration_ns": 5_000_000}
    unknown, pinned = [{**copy, "src": 0x1000}] * 3, [{**copy, "src": driver + 4096}]

    def said(m: Model) -> tuple[str, str]:
        (cell,) = TopView(1.0).render(m, 1.0).renderables[0].column("pageable")
        text = io.StringIO()
        print_table(summary(m, {}, []), Console(file=text, width=200))
        (row,) = [r for r in text.getvalue().splitlines() if r.split()[:1] == ["h2d"]]
        return cell, " ".join(row.split()[5:-1])  # h2d, calls, bytes, "192.0 MiB", then it

    attached = Model(complete_after_ns=0, driver_mapped=lambda key: [(driver, driver + (64 << 20))])
    attached.add_events(events(unknown))
    assert said(attached) == ("unknown", "unknown")
    attached.add_events(events(pinned))
    assert said(attached) == ("≤75% h2d", "≤75% pageable")
    whole = Model(complete_after_ns=None)  # traced from its start: untracked memory is pageable
    whole.add_events(events([{"api": 66, "dst": driver, "bytes": 64 << 20}]))  # cuMemHostAlloc: pinned
    whole.add_events(events(unknown + pinned))
    assert said(whole) == ("75% h2d", "75% pageable")


@pytest.mark.parametrize("cpu_s", [0.05, 1.0])
def test_over_budget_says_what_it_costs_and_why_a_finding_is_missing(cpu_s: float) -> None:
    """The overhead line says whose CPU the share is of (the process's, spent
    in memtrace's traps), and an over-budget process with no finding says
    why (under 0.1 s of CPU): the table agrees with the JSON's findings."""
    from rich.console import Console
    from test_json_schema import _events

    from memtrace.core.ids import ProcessKey
    from memtrace.core.overhead import TrapCost
    from memtrace.export.report import print_table, summary
    from memtrace.model import Model

    key = ProcessKey(4242, 5_000_000_000)
    m = Model()
    m.add_events(_events([(key, 22, 4096, 0)]))
    m.introduce(key, "trainer", 11)
    m.set_traps(key, 40_000)  # 40 ms at 2 us a pair
    m.trap_cost = TrapCost(1e-6, 2e-6, kind="emulated")
    m.process_exited(key, int(cpu_s * 1e9))
    doc = summary(m, {}, [])
    (o,) = doc["overhead"]
    assert o["over_budget"]
    text = io.StringIO()
    print_table(doc, Console(file=text, width=400))
    (line,) = [l for l in text.getvalue().splitlines() if l.startswith("overhead: ")]
    share = 0.04 / cpu_s
    assert f"4242 trainer: memtrace's probes took about {share:.1%} of its CPU time (40,000 traps" in line, line
    assert "over the 1.0% budget" in line, line
    found = [f for f in doc["findings"] if f["code"] == "overhead_budget_exceeded"]
    if cpu_s < 0.1:
        assert not found
        assert line.endswith("no finding: it used 0.05 s of CPU, a finding waits for 0.1 s"), line
    else:
        assert found and "no finding" not in line, line


@pytest.mark.parametrize("agent", [True, False])
def test_the_root_cgroup_and_memtrace_s_own_threads_are_named_as_such(agent: bool) -> None:
    """Once, "preempted most by / (memtrace-ctl)" said neither that / is the
    root cgroup nor that memtrace-ctl is memtrace: the JSON marks memtrace's
    own preemptions (by its pid), the table names both."""
    from rich.console import Console

    from memtrace.core.cpu import CpuStats, Preemptor
    from memtrace.core.ids import ProcessKey
    from memtrace.export import schema
    from memtrace.export.host import host_section
    from memtrace.export.report import print_host
    from memtrace.model.host import HostBook, SensorState

    key = ProcessKey(4242, 5_000_000_000)
    hist = (1, 2, 3) + (0,) * 23
    me = os.getpid() if agent else os.getpid() + 1
    preemptors = (Preemptor(7, 9, 3, me, "memtrace-ctl"), Preemptor(8, 1, 3, 99, "gz"))
    book = HostBook()
    book.set_sensor("cpu", SensorState(True))
    book.set_cpu({key: CpuStats(key.pid, key.start_ns, hist, hist, 10, 20, 30, 4, 5, 8, preemptors)})
    fast = schema.FastSampler(
        state="on", rate_hz=100.0, ticks=5, late_ticks=0, net_errors=0, interfaces_dropped=0, cpu_seconds=0.01
    )
    host = host_section(
        book,
        boot_wall_ns=0,
        cgroup_names={7: "/", 8: "/job"},
        pids=None,
        sample_interval_seconds=0.1,
        sample_errors=0,
        fast_sampler=fast,
        agent_pid=os.getpid(),
    )
    assert [p["memtrace"] for p in host["cpu"][0]["preempted_by"]] == [agent, False]
    text = io.StringIO()
    print_host({"host": host}, Console(file=text, width=400))
    (line,) = [l for l in text.getvalue().splitlines() if l.startswith("cpu pid 4242")]
    last = "memtrace's own threads" if agent else "memtrace-ctl"
    assert line.endswith(f"; preempted most by the root cgroup ({last})"), line


@pytest.mark.parametrize("from_start", [True, False])
def test_frees_memtrace_cannot_match_are_said_as_what_they_can_be(from_start: bool) -> None:
    """A process traced from its start (run's command) has no memory from
    before tracing began: its unmatched frees were never allocations, or
    were freed twice; only one attached to while running may free memory
    allocated before. The JSON says which process is which."""
    from rich.console import Console
    from test_findings import FREE, PID, allocations, events

    from memtrace.export.report import print_table, summary
    from memtrace.model import Model

    m = Model(complete_after_ns=None if from_start else 0)
    (addr,) = allocations(m, [(0, 1 << 20)])
    m.add_events(events([{"api": FREE, "dst": addr}, {"api": FREE, "dst": addr}, {"api": FREE, "dst": 0x1234000}]))
    doc = summary(m, {}, [])
    (row,) = doc["device_memory"]
    assert (row["frees"], row["unknown_frees"], row["traced_from_start"]) == (1, 2, from_start)
    text = io.StringIO()
    print_table(doc, Console(file=text, width=400))
    said = text.getvalue()
    if from_start:
        what = "frees of addresses that were not live allocations (never allocated, or already freed)"
        assert f"{what}: {PID}: 2" in said, said
        assert "before tracing began" not in said, said
    else:
        assert f"frees of memory allocated before tracing began, or not live allocations: {PID}: 2" in said, said


@pytest.mark.bpf
def test_top_fits_80_columns_when_piped(fakecuda: Path) -> None:
    pid, out = top_over_a_released_workload(fakecuda, 80)
    rows = [l for l in out.splitlines() if l.split()[:2] == [str(pid), "workload"]]
    assert rows, out
    row = rows[-1]
    # It ran before top attached, copying from a static buffer memtrace never
    # saw allocated: its pageable share is unknown, never 0%.
    assert "B/s" in row and " unknown " in row and "% h2d" not in row, row
    assert "…" not in out
    assert max(len(l) for l in out.splitlines()) <= 80, out


def test_demo_installs_only_what_the_main_job_needs() -> None:
    demo = (REPO / "scripts" / "demo.sh").read_text()
    levels = re.findall(r"scripts/setup\.sh( --\w+)?", demo)
    assert levels and all(l in ("", " --demo") for l in levels), levels

    def wants(level: str) -> set[str]:
        p = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), *level.split(), "--print"], capture_output=True)
        assert p.returncode == 0, p.stderr
        return set(p.stdout.decode().split())

    demo_pkgs = wants("--demo")
    assert {"libbpf1", "gcc", "make"} <= demo_pkgs
    assert not {p for p in demo_pkgs if p.startswith(("qemu", "clang", "bpftool")) or ":arm64" in p or "aarch64" in p}
    assert demo_pkgs < wants("--dev")


def test_guest_build_uses_the_project_python_not_the_system_one() -> None:
    # plan.py imports memtrace and numpy: a bare `python3` on a fresh machine has neither.
    script = (REPO / "tests" / "kernels" / "build_guest.sh").read_text()
    line = next(l for l in script.splitlines() if "plan.py" in l and not l.startswith("#"))
    assert '"${PYTHON:-' in line and " python3 " not in line, line
    assert "PYTHON=sys.executable" in (REPO / "tests" / "test_kernels.py").read_text()


@pytest.mark.bpf
def test_the_cpu_sensors_gaps_are_said_under_the_table(fakecuda: Path, tmp_path: Path) -> None:
    """A real run's summary, as the table prints it at 80 columns: nothing
    about the CPU sensor while it kept everything; its gaps and drops in
    words once it has some (a VM's kernel skipped switches: test_sched)."""
    from rich.console import Console

    from memtrace.export.report import print_table

    out = tmp_path / "summary.json"
    env = {"WORKLOAD_TRUTH": "/dev/null"}
    p = memtrace("run", "-f", "json", "-o", str(out), "--", str(fakecuda / "workload"), "-n", "5", env=env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())

    def table() -> str:
        text = io.StringIO()
        print_table(doc, Console(file=text, width=80))
        assert max(len(l) for l in text.getvalue().splitlines()) <= 80
        return " ".join(text.getvalue().split())

    assert doc["host"]["cpu_sensor"]["switch_gaps"] == 0, doc["host"]["cpu_sensor"]
    assert "sched tracepoints" not in table() and "maps were full" not in table()
    doc["host"]["cpu_sensor"].update(switch_gaps=3, threads_not_kept=2)
    said = table()
    assert "the kernel's sched tracepoints skipped 3 switches of the traced threads" in said, said
    assert "the CPU sensor's maps were full: 2 threads not kept." in said, said


def test_prose_lines_wrap_at_80_columns_with_their_continuations_indented() -> None:
    from rich.console import Console

    from memtrace.export.report import say

    finding = (
        "[bold yellow]finding[/bold yellow] (train.py): 100% of H2D bytes (97.7 MiB of 97.7 MiB) came from "
        "pageable memory at 11.5 GB/s.\n  [bold]fix[/bold]: copy from page-locked memory: "
        "DataLoader(pin_memory=True) or tensor.pin_memory() in PyTorch, cudaHostAlloc elsewhere"
    )
    text = io.StringIO()
    say(Console(file=text, width=80), finding)
    lines = text.getvalue().splitlines()
    assert len(lines) > 2 and max(len(l) for l in lines) <= 80, lines
    fix = next(i for i, l in enumerate(lines) if l.startswith("  fix: "))
    assert lines[0].startswith("finding (train.py): ")
    assert all(l.startswith("  ") and not l.startswith("   ") for l in lines[1:fix])  # the finding's own
    assert fix < len(lines) - 1 and all(l.startswith("    ") for l in lines[fix + 1 :])  # the fix's
    plain = finding.replace("[bold yellow]", "").replace("[/bold yellow]", "").replace("[bold]", "")
    assert " ".join(text.getvalue().split()) == " ".join(plain.replace("[/bold]", "").split())  # every word, in order
    wide = io.StringIO()
    say(Console(file=wide, width=300), finding)
    assert len(wide.getvalue().splitlines()) == 2  # on a wide terminal: a line each
