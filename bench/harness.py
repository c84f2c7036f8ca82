"""What the benchmarks share.

- The checkout and the machine: root, the commit (and whether the tree is
  dirty), the machine's description.
- Building: the test fixtures (tests/fixtures: the test CUDA, NVML and NCCL
  libraries and workloads), the helper programs of bench/src, BPF objects,
  memtrace's C helpers in another checkout.
- Rounds: arms alternating round by round, medians with their spread
  (min-max and an interval for the median), ratios taken within a round.
- CPU: a process's threads' CPU time from /proc, and the window between
  two readings, by thread name; pinning to a CPU.
- memtrace's agent, built in one place (cuda_agent, run_agent), so that a
  change to how memtrace wires it is one edit here.
- Records: each target writes one JSON record (the machine, kernel, Python,
  memtrace's commit, the command, when, and its figures, each with its unit
  and the target it is held against) to bench/out, or $MEMTRACE_BENCH_OUT.

Module level is standard library only: scripts/gpu/agent_cpu.py imports it
on the GPU machine with nothing but memtrace's own packages beside it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import operator
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from memtrace.runtime.agent import Agent
    from memtrace.runtime.hostsignals import HostSignals

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SRC = REPO / "bench" / "src"
OUT = REPO / "bench" / "out"
CPUS = os.cpu_count() or 1
LAST_CPU = CPUS - 1
SCHEMA = 1  # a record's layout (check_record)

T = TypeVar("T")


# ---- the checkout and the machine ----


def need_root(bench: str, why: str = "memtrace loads BPF programs") -> None:
    """Exit with a word of why when not run as root."""
    if os.geteuid() != 0:
        sys.exit(f"{bench}: run as root ({why})")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _memory_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def machine() -> dict[str, Any]:
    """The machine a figure was measured on."""
    return {"arch": platform.machine(), "cpus": CPUS, "cpu_model": _cpu_model(), "memory_bytes": _memory_bytes()}


def describe() -> str:
    """The machine, kernel and Python on one line, for a benchmark's first."""
    m = machine()
    return (
        f"{m['arch']}, {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_bytes'] / 2**30:.1f} GiB, "
        f"kernel {platform.release()}, Python {platform.python_version()}"
    )


def checkout(tree: Path = REPO) -> tuple[str | None, bool | None]:
    """The tree's commit and whether it differs from it (files changed, or
    untracked and not ignored); (None, None) outside a git checkout."""
    git = ["git", "-c", "safe.directory=*", "-C", str(tree)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return None, None
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    return head.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


# ---- building ----


def build_fixtures(out: Path, *targets: str, quiet: bool = False) -> Path:
    """tests/fixtures built into `out` (every target, or these): `out`."""
    subprocess.run(["make", "-s", "-C", str(FIXTURES), f"OUT={out}", *targets], check=True, capture_output=quiet)
    return out


def build_c(src: str | Path, out: Path, cflags: Sequence[str] = (), libs: Sequence[str] = ()) -> Path:
    """A helper program (bench/src/NAME, or a path) built with -O2 into `out`."""
    path = SRC / src if isinstance(src, str) else src
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-O2", *cflags, "-o", str(out), str(path), *libs], check=True)
    return out


def build_bpf(src: Path, out: Path, *includes: Path) -> Path:
    """A BPF object for this machine's arch from `src` (vmlinux.h of the repo's)."""
    from memtrace.bpf.host import bpf_arch

    arch = bpf_arch()
    inc = [a for d in (REPO / "vmlinux" / arch, *includes) for a in ("-I", str(d))]
    cmd = ["clang", "-O2", "-g", "-target", "bpf", f"-D__TARGET_ARCH_{arch}", *inc, "-c", str(src), "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def build_helper(tree: Path) -> None:
    """The C helpers (memtrace._fastsample) in a tree that has none built."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = tree / "memtrace" / f"_fastsample{suffix}"
    if out.exists():
        return
    inc = sysconfig.get_paths()["include"]
    src = tree / "memtrace" / "native" / "fastsample.c"
    cmd = ["gcc", "-O2", "-fvisibility=hidden", "-shared", "-fPIC", f"-I{inc}", "-o", str(out), str(src), "-ldl"]
    subprocess.run([*cmd, "-lpthread"], check=True)


def old_checkout(bench: str, path: Path) -> Path:
    """The other commit's worktree a bench compares this checkout with (--old), its C helpers
    built; exits with how to make one when it holds no memtrace."""
    old = path.resolve()
    if not (old / "memtrace" / "__init__.py").exists():
        sys.exit(f"{bench}: {old} holds no memtrace checkout (git worktree add {old} COMMIT)")
    build_helper(old)
    return old


def trees(bench: str, old: Path | None) -> dict[str, Path]:
    """The arms of a comparison between commits: this checkout ("new") and,
    given --old, that worktree first ("old")."""
    return {"new": REPO} if old is None else {"old": old_checkout(bench, old), "new": REPO}


def fresh_copy(lib: Path, into: Path) -> Path:
    """A copy of a library in `into` (made), an inode of its own: probes a previous
    run's agent is still detaching from the original cannot reach it."""
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(lib, into / lib.name)
    return into / lib.name


def loop_seconds(stdout: str) -> float:
    """The seconds a launch loop (tests/fixtures/launchloop.c) says it took."""
    words = stdout.split()
    return float(words[words.index("seconds") + 1])


def training_job(fx: Path, seconds: float) -> list[str]:
    """The training-like job bench/targets/diagnose.py shapes (tests/fixtures/trainjob.c):
    real CPU work per step, four 4 MiB copies over the emulated PCIe link,
    three kernels; it runs for `seconds`."""
    job = [str(fx / "trainjob"), "-t", str(seconds), "-L", "2000000", "-w", "1000000", "-k", "3000"]
    return [*job, "-c", "4", "-b", str(4 << 20)]


def idle_pcie_link(path: Path, rate: int = 8 << 30) -> Path:
    """The test driver's emulated PCIe link (FAKE_PCIE, tests/fixtures/driver.c):
    free now, `rate` bytes a second."""
    path.write_bytes((0).to_bytes(8, "little") + rate.to_bytes(8, "little"))
    return path


_ns_per_iter: dict[Path, float] = {}


def ns_per_iter(fx: Path) -> float:
    """What one iteration of trainjob's CPU work takes here, on the last CPU (timed once)."""
    if fx not in _ns_per_iter:
        iters = 10_000_000
        truth = fx / "calibrate.jsonl"
        env = dict(os.environ, WORKLOAD_TRUTH=str(truth))
        argv = pinned([str(fx / "trainjob"), "-t", "1", "-c", "0", "-k", "0", "-w", "0", "-L", str(iters)], LAST_CPU)
        subprocess.run(argv, env=env, check=True)
        ends = json.loads(truth.read_text().splitlines()[0])["step_end_ns"]
        truth.unlink()
        _ns_per_iter[fx] = statistics.median(b - a for a, b in zip(ends, ends[1:], strict=False)) / iters
        print(f"job: {_ns_per_iter[fx]:.3f} ns per work iteration here", flush=True)
    return _ns_per_iter[fx]


def work_iterations(fx: Path, ms: float) -> int:
    """trainjob's CPU work iterations for `ms` here."""
    return int(ms * 1e6 / ns_per_iter(fx))


# ---- pinning ----


def pinned(argv: list[str], cpu: int | str) -> list[str]:
    """`argv` held to one CPU (taskset), where there is more than one."""
    return ["taskset", "-c", str(cpu), *argv] if CPUS > 1 else argv


def pin_self(cpus: Iterable[int]) -> None:
    """This thread (and the threads it starts from now on) held to `cpus`, where there is more than one."""
    if CPUS > 1:
        os.sched_setaffinity(0, set(cpus))


# ---- rounds and their statistics ----


def alternating(
    arms: Sequence[T], rounds: int, order: Literal["same", "rotate", "reverse"] = "same"
) -> Iterator[tuple[int, T]]:
    """(round, arm) in the order they run: every arm once a round, in the same
    order each round, rotated by one each round, or reversed every other round."""
    for r in range(rounds):
        if order == "rotate":
            k = r % len(arms)
            seq = [*arms[k:], *arms[:k]]
        elif order == "reverse" and r % 2:
            seq = list(reversed(arms))
        else:
            seq = list(arms)
        for arm in seq:
            yield r, arm


def _median_interval(n: int, want: float = 0.95) -> tuple[int, float]:
    """The order statistic k (1-based) whose [x_k, x_(n+1-k)] holds the median
    with the highest confidence short of none below `want`, and that
    confidence, 1 - 2 P(Binomial(n, 1/2) < k); k = 1 (min-max) where no k reaches it."""
    best = (1, 1 - 2 * 0.5**n)
    for k in range(1, n // 2 + 1):
        tail = sum(math.comb(n, i) for i in range(k)) / 2**n
        if 1 - 2 * tail >= want:
            best = (k, 1 - 2 * tail)
    return best


@dataclass(frozen=True)
class Spread:
    """A median over rounds with its spread: min-max, and an interval for
    the median from order statistics (distribution-free) at `confidence`."""

    median: float
    lo: float
    hi: float
    ci: tuple[float, float]
    confidence: float
    n: int

    @classmethod
    def of(cls, xs: Iterable[float]) -> Spread:
        s = sorted(xs)
        k, conf = _median_interval(len(s))
        return cls(statistics.median(s), s[0], s[-1], (s[k - 1], s[len(s) - k]), conf, len(s))

    def range(self, fmt: str = ".3f", scale: float = 1.0) -> str:
        return f"{self.lo * scale:{fmt}}-{self.hi * scale:{fmt}}"

    def __str__(self) -> str:
        return f"{self.median:.4g} ({self.lo:.4g}-{self.hi:.4g} over {self.n})"

    def to_json(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": self.lo,
            "max": self.hi,
            "interval": list(self.ci),
            "confidence": round(self.confidence, 4),
            "n": self.n,
        }


def ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Each round's ratio (num over den, measured minutes apart at most): its
    median is steadier than the ratio of medians where the machine drifts.
    A round whose denominator measured nothing is left out."""
    return [a / b for a, b in zip(num, den, strict=True) if b]


def ratio_spread(num: Sequence[float], den: Sequence[float]) -> Spread | None:
    """The spread of the rounds' ratios (None where no round has one)."""
    r = ratios(num, den)
    return Spread.of(r) if r else None


def over(a: float, b: float) -> float:
    """a / b; NaN where b measured nothing (a window too short for a CPU clock tick)."""
    return a / b if b else math.nan


# ---- CPU ----


def thread_cpu_seconds(pid: int, proc: Path = Path("/proc")) -> dict[int, tuple[str, float]]:
    """Each thread of a process: its name and its user and system CPU
    seconds so far (memtrace names its own threads: memtrace-drain, ...).
    Empty if the process is gone; a thread that ends meanwhile is left out."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(proc / str(pid) / "task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = (proc / str(pid) / "task" / tid / "stat").read_text()
            name, f = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
            out[int(tid)] = (name, (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"))
        except (OSError, ValueError, IndexError):
            continue
    return out


GUARDIAN = "memtrace-guard"  # memtrace/sensors/cuda/holds.GUARDIAN_NAME


def guardians(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The child processes of `pid` (forked from any of its threads) that are
    the agent's own: named as memtrace's guardian is, or forked and never
    exec'd (its command line is the agent's: the guardian of a memtrace from
    before it was named). A traced job, the agent's child under `memtrace
    run`, ran a program of its own."""
    out = []
    try:
        tids = os.listdir(proc / str(pid) / "task")
        own = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return out
    for tid in tids:
        try:
            kids = (proc / str(pid) / "task" / tid / "children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            try:
                named = (proc / kid / "comm").read_text().strip() == GUARDIAN
                if named or (proc / kid / "cmdline").read_bytes() == own:
                    out.append(int(kid))
            except OSError:
                continue
    return out


def process_cpu_seconds(pid: int) -> float | None:
    """A process's user and system CPU seconds so far (every thread); None if it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def agent_cpu_seconds(pid: int) -> float | None:
    """A memtrace agent's CPU seconds so far: its process's and its guardian's; None if it is gone."""
    own = process_cpu_seconds(pid)
    if own is None:
        return None
    return own + sum(process_cpu_seconds(g) or 0.0 for g in guardians(pid))


@dataclass(frozen=True)
class Reading:
    """A process's threads' CPU (thread_cpu_seconds) at a time.monotonic()."""

    at: float
    threads: dict[int, tuple[str, float]]

    @classmethod
    def of(cls, pid: int) -> Reading:
        """The process's threads, and its guardian's (memtrace's child that
        bounds its holds, a process of its own): the agent's CPU is both."""
        threads = thread_cpu_seconds(pid)
        for child in guardians(pid):
            threads.update(thread_cpu_seconds(child))
        return cls(time.monotonic(), threads)

    def keeping(self, earlier: Reading) -> Reading:
        """This reading, with the threads that ended since `earlier` at their last CPU there."""
        return Reading(self.at, {**earlier.threads, **self.threads})


@dataclass(frozen=True)
class CpuWindow:
    """A process's CPU over a window, by thread name (threads of one name summed)."""

    wall_s: float
    by_name: dict[str, float] = field(default_factory=dict)

    @classmethod
    def between(cls, first: Reading, last: Reading) -> CpuWindow:
        """A thread new since `first` counts from its start."""
        per: dict[str, float] = {}
        for tid, (name, cpu) in last.threads.items():
            per[name] = per.get(name, 0.0) + cpu - first.threads.get(tid, (name, 0.0))[1]
        return cls(last.at - first.at, per)

    @property
    def cpu_s(self) -> float:
        return sum(self.by_name.values())

    @property
    def share(self) -> float:
        """The CPU as a share of one core."""
        return self.cpu_s / self.wall_s

    def shares(self) -> dict[str, float]:
        return {k: v / self.wall_s for k, v in self.by_name.items()}

    def busiest(self, prefix: str = "memtrace-", at_least: float = 0.0005, only: bool = False) -> str:
        """The busiest threads, `prefix` dropped from their names: "drain 0.63%, fold 0.47%"."""
        top = sorted(self.shares().items(), key=lambda kv: -kv[1])
        keep = [(k.removeprefix(prefix), v) for k, v in top if v >= at_least and (not only or k.startswith(prefix))]
        return ", ".join(f"{k} {v:.2%}" for k, v in keep)


def watch_threads(
    cmd: list[str], settle_s: float, every_s: float = 0.5, **popen: Any
) -> tuple[int, float, CpuWindow | None]:
    """Run `cmd`, reading its threads' CPU every `every_s`: the window runs
    from `settle_s` after its start (a memtrace agent: programs loaded,
    probes attached, calibrated) to the last reading that still holds every
    thread the first one did (an agent shutting down joins its threads, and
    a thread's CPU leaves /proc/PID/task with it). Returns the exit status,
    the wall seconds, and the window (None if it ended before one)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, **popen)
    first: Reading | None = None
    last: Reading | None = None
    while p.poll() is None:
        time.sleep(every_s)
        now = Reading.of(p.pid)
        if not now.threads:
            continue
        if first is None and now.at - t0 >= settle_s:
            first = now
        elif first is not None and set(first.threads) <= set(now.threads):
            last = now
    rc = p.wait()
    window = CpuWindow.between(first, last) if first is not None and last is not None else None
    return rc, time.monotonic() - t0, window


def rss_mb() -> float:
    """This process's resident memory, MB."""
    return _proc_mb("/proc/self/status", "VmRSS")


def pss_mb() -> float:
    """This process's proportional set size, MB: each page once, however
    many times it is mapped (libbpf maps a ring's data pages twice, so RSS
    counts the event ring twice; a cgroup charges it once)."""
    return _proc_mb("/proc/self/smaps_rollup", "Pss")


def _proc_mb(path: str, fieldname: str) -> float:
    for line in Path(path).read_text().splitlines():
        if line.startswith(fieldname + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


# ---- memtrace's agent: every benchmark builds it here ----


def cuda_agent(*, only_traced: bool = False, detach_in_background: bool = True, launch_events: bool = False) -> Agent:
    """memtrace's agent in this process with its CUDA sensor alone (no host
    signals, no diagnosis, no budget): host-wide as `memtrace push` traces,
    or, `only_traced`, only the processes given to trace_pid and their
    children, as `memtrace run` does. `detach_in_background=False`: closing
    it waits until its probes are gone, so the next round finds none.
    `launch_events`: a record per launch, as `run --timeline` has it."""
    from memtrace.bpf import detach
    from memtrace.runtime.agent import Agent
    from memtrace.sensors.cuda import Options

    detach.DETACH_IN_BACKGROUND = detach_in_background
    return Agent(Options(only_traced=only_traced, launch_events=launch_events))


@contextlib.contextmanager
def run_agent(host_interval_s: float = 0.5) -> Iterator[tuple[Agent, HostSignals]]:
    """memtrace's agent as `memtrace run` has it by default, started: only
    traced processes, NCCL held, the overhead measured and kept under 1%,
    host signals sampled every `host_interval_s` (run's and push's default
    0.5 s) with the live diagnosis on their tick. The signals are not
    started: start(pids) and sampling() them, and close() them."""
    from memtrace.runtime.hostsignals import HostOptions
    from memtrace.runtime.pipeline import Options, Pipeline, PipelineOptions

    opts = PipelineOptions(
        cuda=Options(only_traced=True, hold_nccl=True),
        host=HostOptions(interval_s=host_interval_s),
        budget=0.01,
        from_exec=True,
    )
    with Pipeline(opts) as pipe:
        assert pipe.host is not None
        yield pipe.agent, pipe.host


def draining(
    agent: Agent, every_s: float = 0.005, away_from: int | None = None
) -> contextlib.AbstractContextManager[None]:
    """A thread that drains the agent (poll) every `every_s`, and once more at
    the end, for the block's life; on another CPU than `away_from`."""
    return polling(agent.poll, every_s, away_from)


@contextlib.contextmanager
def polling(poll: Callable[[], object], every_s: float, away_from: int | None = None) -> Iterator[None]:
    """`poll` called on a thread of its own every `every_s` while the block
    runs, and once more after it; the thread kept off CPU `away_from`."""
    import threading

    stop = threading.Event()

    def run() -> None:
        others = os.sched_getaffinity(0) - {away_from}
        if away_from is not None and others:
            os.sched_setaffinity(0, others)  # this thread only
        while not stop.wait(every_s):
            poll()
        poll()

    t = threading.Thread(target=run)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


# ---- records ----

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
    "==": operator.eq,
}


@dataclass(frozen=True)
class Target:
    """What a figure is held against: `op` `bound`, in the figure's unit."""

    op: str
    bound: float

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"a target's comparison is one of {', '.join(_OPS)}, not {self.op!r}")

    def met(self, value: float) -> bool:
        return _OPS[self.op](value, self.bound)

    def __str__(self) -> str:
        b = self.bound
        return f"{self.op} {int(b):,}" if b == int(b) and abs(b) >= 1e4 else f"{self.op} {b:g}"

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "bound": self.bound}


@dataclass(frozen=True)
class Figure:
    """One measured figure: its name, value, unit and how it is shown, the
    target it is held against (None: none), its spread over rounds."""

    name: str
    value: float
    unit: str
    fmt: str = ".3g"
    target: Target | None = None
    spread: Spread | None = None
    note: str = ""

    @property
    def shown(self) -> str:
        return format(self.value, self.fmt)

    @property
    def met(self) -> bool | None:
        return None if self.target is None or math.isnan(self.value) else self.target.met(self.value)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "shown": self.shown,
            "target": self.target.to_json() if self.target else None,
            "met": self.met,
            "spread": self.spread.to_json() if self.spread else None,
            "note": self.note,
        }


def _command() -> str:
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(REPO))
    except ValueError:
        shown = str(script)
    return " ".join(shlex.quote(a) for a in [shown, *sys.argv[1:]])


def out_dir() -> Path:
    """Where records go: $MEMTRACE_BENCH_OUT, else bench/out (ignored by git)."""
    return Path(os.environ.get("MEMTRACE_BENCH_OUT") or OUT)


class Record:
    """A target's one record: start it when the benchmark starts, add its
    figures, write it at the end."""

    def __init__(self, target: str | None = None) -> None:
        self.target = target or Path(sys.argv[0]).stem
        self.started = time.time()
        self.commit, self.dirty = checkout()  # the code that runs: read at the start
        self.figures: list[Figure] = []

    def add(
        self,
        name: str,
        value: float,
        unit: str,
        fmt: str = ".3g",
        target: Target | None = None,
        spread: Spread | None = None,
        note: str = "",
    ) -> Figure | None:
        """The figure, added; None, and said, where nothing was measured (NaN)."""
        if math.isnan(value):
            print(f"  {name}: not measured (not recorded)")
            return None
        f = Figure(name, float(value), unit, fmt, target, spread, note)
        self.figures.append(f)
        return f

    def to_json(self) -> dict[str, Any]:
        when = datetime.datetime.fromtimestamp(self.started, datetime.timezone.utc)
        return {
            "schema": SCHEMA,
            "target": self.target,
            "when": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "seconds": round(time.time() - self.started, 1),
            "command": _command(),
            "smoke": os.environ.get("MEMTRACE_BENCH_SMOKE") == "1",
            "machine": machine(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "commit": self.commit,
            "dirty": self.dirty,
            "figures": [f.to_json() for f in self.figures],
        }

    def write(self) -> Path:
        """Write the record and print its figures; returns its path."""
        doc = self.to_json()
        out = out_dir()
        out.mkdir(parents=True, exist_ok=True)
        stamp = doc["when"].replace("-", "").replace(":", "")
        path = out / f"{self.target}-{stamp}.json"
        n = 1
        while path.exists():
            n += 1
            path = out / f"{self.target}-{stamp}-{n}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"record: {path}")
        for line in figure_lines(doc):
            print(line)
        return path


def verdict(fig: dict[str, Any]) -> str:
    return "-" if fig.get("met") is None else "met" if fig["met"] else "not met"


def target_text(fig: dict[str, Any]) -> str:
    t = fig.get("target")
    return "-" if not t else str(Target(t["op"], t["bound"]))


def figure_lines(doc: dict[str, Any], width: int = 80) -> list[str]:
    """A record's figures, a line each where it fits in `width`, else two."""
    lines = []
    for f in doc["figures"]:
        value = f"{f['shown']} {f['unit']}".strip()
        held = "" if not f.get("target") else f"  {target_text(f)}: {verdict(f)}"
        one = f"  {f['name']}: {value}{held}"
        lines += [one] if len(one) <= width else [f"  {f['name']}:", f"      {value}{held}"]
    return lines


def check_record(doc: Any) -> list[str]:
    """What is wrong with a record (nothing: an empty list)."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    bad = []
    kinds: dict[str, type | tuple[type, ...]] = {
        "schema": int,
        "target": str,
        "when": str,
        "command": str,
        "smoke": bool,
        "machine": dict,
        "kernel": str,
        "python": str,
        "commit": (str, type(None)),
        "dirty": (bool, type(None)),
        "figures": list,
    }
    for key, kind in kinds.items():
        if not isinstance(doc.get(key, ...), kind):
            bad.append(f"{key}: missing or not {kind}")
    if bad:
        return bad
    if doc["schema"] != SCHEMA:
        bad.append(f"schema {doc['schema']}, not {SCHEMA}")
    try:
        datetime.datetime.strptime(doc["when"], "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        bad.append(f"when: {doc['when']!r} is not a UTC time")
    for key in ("arch", "cpus", "cpu_model", "memory_bytes"):
        if key not in doc["machine"]:
            bad.append(f"machine: no {key}")
    if not doc["figures"]:
        bad.append("no figures")
    for f in doc["figures"]:
        bad += [f"figure {f.get('name')!r}: {p}" for p in _check_figure(f)]
    return bad


def _check_figure(f: Any) -> list[str]:
    if not isinstance(f, dict):
        return ["not an object"]
    bad = []
    if not isinstance(f.get("name"), str) or not f["name"]:
        bad.append("no name")
    if not isinstance(f.get("value"), (int, float)):
        bad.append("no value")
    for key in ("unit", "shown"):
        if not isinstance(f.get(key), str):
            bad.append(f"no {key}")
    t = f.get("target")
    if t is not None:
        if not isinstance(t, dict) or t.get("op") not in _OPS or not isinstance(t.get("bound"), (int, float)):
            bad.append(f"target {t!r} is not a comparison")
        elif isinstance(f.get("value"), (int, float)) and not math.isnan(f["value"]):
            if f.get("met") is not _OPS[t["op"]](f["value"], t["bound"]):
                bad.append(f"met is {f.get('met')}, but {f['value']} {t['op']} {t['bound']} says otherwise")
    elif f.get("met") is not None:
        bad.append("met without a target")
    return bad


def load_record(path: Path) -> dict[str, Any]:
    """A record as written (check_record says whether it is a valid one)."""
    doc = json.loads(path.read_text())
    return doc if isinstance(doc, dict) else {}


def records(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every record in `directory` (JSON files that parse), oldest first."""
    out = []
    for p in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            out.append((p, load_record(p)))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda pd: str(pd[1].get("when", "")))
