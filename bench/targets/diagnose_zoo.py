"""Diagnosis across the workload zoo (issue 39): diagnose.py's faults and
trials, on the zoo's job shapes (tests/fixtures/zoo) instead of trainjob;
a confusion matrix and the accuracy per shape, each cause's recall,
detection latency, false diagnoses, and healthy runs of each shape.

    sudo .venv/bin/python bench/targets/diagnose_zoo.py [--shapes A,B] [--faults A,B]
        [--trials-per-fault N] [--seconds S] [--healthy-seconds S] [--seed N] [--keep FILE]

The shapes (each job's parameters drawn per trial from the seed: its step
length, 15 to 30 ms, split about evenly between CPU work, copies over the
emulated link and GPU time, the number of copies, and the shape's own):

  log          logging every 1, 10 or 50 steps (.item(), a sync and a copy,
               or a scalar read on the default stream; mid-step or after)
  checkpoint   a checkpoint every 40 to 80 steps (D2H copies, then 150 to
               400 ms of CPU serialisation); every fault starts during one
  eval         an evaluation phase every 50 to 100 steps
  accumulation gradient accumulation, 2 to 4 micro-batches a step
  streams      a compute stream and a copy stream
  graph        one CUDA graph replay per step
  pool         JAX's way: a pool of threads sharing one stream
  server       an inference server, random arrivals, load-dependent batches,
               0.3 to 1 ms of host work per request in each iteration
  server_load  the same, whose request rate doubles or triples: every fault
               starts as the load changes
  llm          an LLM server, prefill and decode iterations

What a job sends and copies is sized so that each fault can bite it as it bites the others
(issue 39): accumulation's job exchanges its gradients once an optimizer step, K micro-batches'
worth (ACCUMULATED); pool's batch is 2-6 arrays, each transferred on its own (POOL_ARRAYS); a
batching server replies to each request (REPLIES).

The faults are diagnose.py's (its docstring says what each does), applied
through the zoo's ZOO_ variables (tests/fixtures/zoo/zoo.h), plus two of
nic_contention with the job entering its network namespace after `memtrace
run` started it: nic_late (`memtrace run -- ip netns exec NS job`: the
namespace entered before the job's exec) and nic_setns (the job's own
setns, 0.3 s after its first iteration, before its first exchange). The servers get
the faults that fit a server (no data loader, no data set, no ranks); pool
has no ranks. Every trial is diagnose.py's: a fault at a random time
between 35% and 65% of the run, a prediction (the first diagnosis of the
job's process at or after the onset), its latency, and false diagnoses
(before the onset, of another process, or in a healthy run).

--healthy-seconds S adds one healthy run of S seconds of each shape
(false diagnoses per hour). --keep FILE appends each trial to FILE (JSON
lines) and reports on all the trials there: the benchmark can be run in
pieces (a shape or a few at a time), the last piece's record covering all.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import Record, Target
from bench.targets import diagnose
from bench.targets.diagnose import CAUSE, CPU, LINK_RATE, NIC_RATE, PEER, Job, Trial
from memtrace.model.steps import work_class

TRAINING = ("log", "checkpoint", "eval", "accumulation", "streams", "graph")
SERVING = ("server", "server_load", "llm")
SHAPES = (*TRAINING, "pool", *SERVING)
FAULTS = (*diagnose.EXPECTED, "nic_late", "nic_setns")
SHORT = {  # the causes in the matrices (80 columns)
    "cpu_interference": "cpu",
    "gpu_throttling": "gpu",
    "host_memory_pressure": "memory",
    "input_starvation": "input",
    "nic_contention": "nic",
    "pcie_contention": "pcie",
    "straggler": "straggler",
    "nvlink_contention": "nvlink",
    "unknown": "unknown",
    "ambiguous": "ambiguous",
}
# What a shape has not: a data loader and its data set, ranks. And nvlink_contention on none: its
# slowdown is trainjob's GPU work before the test NCCL's barrier (diagnose.py, where it is tried);
# a zoo job's three ranks on two CPUs run faster, not slower, with more GPU time (0.80x, log, seed 2).
# And pcie_degraded not on llm: an LLM server copies token ids (4 bytes a token: a prefill of eight
# 512-token prompts is 16 KiB, 7.6 us at the emulated link's 2 GiB/s, 15 us at x8) against at least
# 6 us of GPU time a prompt token and 0.3 ms a decode iteration: the narrower link adds under 0.1% to
# an iteration; its 5 jobs in the records ran 0.89-1.01x (median 1.01x), nothing there to diagnose.
NOT_ON = {
    **dict.fromkeys(TRAINING, {"nvlink_contention"}),
    "pool": {"slow_rank", "nvlink_contention"},
    **dict.fromkeys(SERVING, {"slow_loader", "memory_pressure", "slow_rank", "nvlink_contention"}),
    "llm": {"slow_loader", "memory_pressure", "slow_rank", "nvlink_contention", "pcie_degraded"},
}


# REPLIES: a batching server replies to each request, its replies together REPLY_SHARE of its NIC
# (diagnose.NIC_RATE) at its first request rate. Sending 1 MiB an iteration whatever its batch (as
# trainjob's exchange), the zoo's server ran its own link 95-96% busy with its shaper holding
# 1,100 packets a window, healthy: a flow that joined could make the link neither busier nor
# fuller; the server's iterations halved (23 to 11 a window), each of twice the requests, its
# copies as before (the memtrace -v log of server, nic_setns, seed 6): nothing on the link or in
# its work said another flow took it. An LLM server's streamed tokens are left at 1 MiB an iteration.
REPLY_SHARE = (0.1, 0.2)
# ACCUMULATED: a job that accumulates K micro-batches exchanges K times nic_contention's 1 MiB once an
# optimizer step (as much of its link a second as the other shapes' jobs: gradients of a model K
# times larger per micro-batch). At 1 MiB an optimizer step it used a Kth of its share of the
# 400 Mbit/s link, and a bulk flow beside it slowed it by nothing: 11 jobs with nic faults in the
# records to 2026-11-30 seed 6 ran 0.88-1.13x (median 1.00x), 10 missed; at K MiB, 1.25-1.91x.
# POOL_ARRAYS: pool's batch is as many arrays as a training job's copies (a pytree: inputs, labels,
# masks; device_put transfers each), -c. The emulated link (tests/fixtures/driver.c) serves a copy
# whole once its turn comes, so a copier's 8 MiB copies held pool's one transfer a step up by at
# most one of theirs (4 ms): 1.14x, and 1.59x with the batch in 4 arrays (the job alone, 8 s, the
# copier from 4 s; pool -p 4 -b 17171565 -k 7996 -w 7996). In the records to 2026-11-30 seed 6,
# competing and untraced copiers slowed 10 pool jobs 1.01-1.13x, all missed; in arrays, 1.55-1.98x.
NIC_BYTES_PER_S = int(NIC_RATE.removesuffix("mbit")) * 1_000_000 // 8


def faults_of(shape: str) -> list[str]:
    return [f for f in FAULTS if f not in NOT_ON.get(shape, set())]


@dataclass
class ZooJob(Job):
    """A zoo job: its faults through ZOO_ variables (zoo.h)."""

    phases: Path | None = None  # checkpoint: where the job says each checkpoint starts
    at_s: float | None = None  # server_load: the onset, from the job's start (the load change)
    serving: bool = False
    # Steps of its bytes exchanged at once: accumulation's job exchanges its gradients once per
    # optimizer step of K micro-batches, K times nic_contention's per-step bytes (ACCUMULATED).
    exchange_steps: int = 1
    reply_bytes: int | None = None  # a batching server's: the bytes of each request's reply (REPLIES)

    def reading(self, data: Path) -> None:
        self.env["ZOO_DATA"] = str(data)

    def exchanging(self, n: int) -> None:
        n = self.reply_bytes if self.reply_bytes is not None else n * self.exchange_steps
        self.env.update(ZOO_NET=str(n), ZOO_PEER=PEER)

    def entering(self, netns: Path) -> None:
        self.env.update(ZOO_NETNS=str(netns), ZOO_NETNS_AFTER="0.3")

    def onset_at(self, at: float) -> float:
        return self.at_s if self.at_s is not None else at

    def onset(self, began: float, at: float) -> None:
        super().onset(began, at)
        if self.phases is None:
            return
        seen = self.phases.read_text().count("\n") if self.phases.exists() else 0
        give_up = began + at + 3  # a checkpoint every 2 s or so
        while time.monotonic() < give_up:
            if self.phases.exists() and self.phases.read_text().count("\n") > seen:
                return  # a checkpoint started: its copies, then its serialisation
            time.sleep(0.005)
        print("  no checkpoint began within 3 s of the onset drawn: injected then", flush=True)

    def main(self, truth: list[dict]) -> dict:
        return next(x for x in truth if "shape" in x)  # trainjob's copier prints none

    def ends(self, line: dict) -> list[int]:
        return list(line["ends"])

    def slowdown(self, line: dict, onset_mono_ns: int) -> float | None:
        if not self.serving and "o" in line.get("kinds", ""):
            # Gradient accumulation: the job's progress is its optimizer steps. A fault on the
            # optimizer step's work alone (its exchange) slows one micro-batch in K: the median
            # micro-batch says 1.00x where each optimizer step took 1.2x.
            ends = [e for e, k in zip(line["ends"], line["kinds"], strict=True) if k == "o"]
            return diagnose.job_slowdown(ends, onset_mono_ns)
        if not self.serving:
            return super().slowdown(line, onset_mono_ns)
        return server_slowdown(line, onset_mono_ns)


def server_slowdown(line: dict, onset_mono_ns: int) -> float | None:
    """A server's slowdown at equal work, by its own clock: its iterations' busy time (from
    their first call to their end) after the onset (from a second on) over what iterations of
    the same kind and work (bytes in and out, each by its quarter octave: model/steps.work_class)
    took before it, the median of each. Per request it was not: a load change makes larger
    batches, whose time per request falls (a 2.8x load read a competing copier's 1.2x as 0.61x).
    None where no work was done both before and after."""
    ends, kinds, busy = line["ends"], line["kinds"], line["busy_ns"]
    work = [(k, work_class(i, o)) for k, i, o in zip(kinds, line["bytes_in"], line["bytes_out"], strict=True)]
    before: dict[tuple[str, tuple[int, int]], list[int]] = {}
    after: list[tuple[tuple[str, tuple[int, int]], int]] = []
    for e, wk, b in zip(ends, work, busy, strict=True):
        if e < onset_mono_ns:
            before.setdefault(wk, []).append(b)
        elif e > onset_mono_ns + 1_000_000_000:
            after.append((wk, b))
    base = {wk: statistics.median(bs) for wk, bs in before.items()}
    took = [(b, base[wk]) for wk, b in after if wk in base]
    return sum(b for b, _ in took) / sum(x for _, x in took) if took and sum(x for _, x in took) else None


def step_parts(fc: Path, rnd: random.Random) -> tuple[float, int, int, float]:
    """A training step drawn: its CPU work (us), copies and their bytes, GPU time (us)."""
    step_us = rnd.uniform(15_000, 30_000)
    copies = rnd.randint(2, 6)
    return step_us / 3, copies, int(step_us / 3 / 1e6 * LINK_RATE / copies), step_us / 3


def zoo_env(fc: Path, tmp: Path, seconds: float) -> dict[str, str]:
    return {
        "ZOO_SECONDS": str(seconds),
        "ZOO_ITERS_PER_US": f"{1000 / harness.ns_per_iter(fc):.3f}",  # host work: CPU work, as trainjob's
        "ZOO_CONTROL": str(tmp / "control"),
    }


def make_job(shape: str, fc: Path, tmp: Path, seconds: float, rnd: random.Random) -> ZooJob:
    """The shape's job, its parameters drawn from rnd."""
    zoo = fc / "zoo"
    env = zoo_env(fc, tmp, seconds)
    if shape in TRAINING:
        host, copies, nbytes, gpu = step_parts(fc, rnd)
        # six launches and the optimizer's (a third of them, at half the time): seven kernels' time
        base = ["-n", "1000000", "-s", str(rnd.randrange(1 << 30)), "-w", f"{host:.0f}", "-k", f"{gpu / 7:.0f}"]
        base += ["-c", str(copies), "-b", str(nbytes)]
        own: list[str] = {
            "log": ["-L", str(rnd.choice((1, 10, 50))), "-M", rnd.choice("isd"), "-P", rnd.choice("me")],
            "checkpoint": ["-C", str(rnd.randint(40, 80)), "-T", str(rnd.randint(8, 20)), "-B", str(1 << 20)]
            + ["-Z", str(rnd.randint(150_000, 400_000))],
            "eval": ["-E", str(rnd.randint(50, 100)), "-I", str(rnd.randint(10, 30))],
            "accumulation": ["-A", str(rnd.randint(2, 4)), rnd.choice(("-a", "-g"))],
            "streams": ["-X"],
            "graph": ["-G"],
        }[shape]
        argv = [str(zoo / "train"), *base, *own]
        # slow_rank's ranks: three of the same job, each all-reducing 4 MiB of gradients a step
        job = ZooJob("train", ["taskset", "-c", CPU, *argv], [f"ZOO_ALL_REDUCE={4 << 20}", *argv], env, shape)
        if shape == "accumulation":
            job.exchange_steps = int(own[own.index("-A") + 1])  # ACCUMULATED
        if shape == "checkpoint":
            job.phases = tmp / "phases"
            job.phases.unlink(missing_ok=True)
            job.env["ZOO_PHASES"] = str(job.phases)
        return job
    if shape == "pool":
        host, copies, nbytes, gpu = step_parts(fc, rnd)
        argv = [str(zoo / "pool"), "-n", "1000000", "-s", str(rnd.randrange(1 << 30)), "-p", str(rnd.randint(2, 8))]
        # The batch's arrays transferred one by one, as many as a training job's copies (POOL_ARRAYS)
        argv += ["-b", str(copies * nbytes), "-c", str(copies), "-k", f"{gpu:.0f}", "-w", f"{host:.0f}"]
        argv += ["-r", str(rnd.randint(5, 30))] if rnd.random() < 0.5 else []
        return ZooJob("pool", ["taskset", "-c", CPU, *argv], None, env, shape)
    # Servers: the requests for `seconds` at the rate drawn (a server stops when it has served them).
    if shape == "llm":
        rate = rnd.uniform(20, 50)
        own = ["-m", "llm", "-k", str(rnd.randint(300, 800)), "-K", str(rnd.randint(6, 12)), "-p", "512", "-d", "32"]
        own += ["-r", str(int(rate * seconds)), "-R", f"{rate:.1f}"]
        at_s = None
    else:
        rate = rnd.uniform(100, 250)
        nbytes = rnd.choice((256, 512, 1024)) << 10
        own = ["-i", str(nbytes), "-o", str(nbytes // 4), "-k", str(rnd.randint(400, 1000))]
        own += ["-K", str(rnd.randint(150, 400)), "-B", "8"]
        if shape == "server_load":
            factor = rnd.uniform(2, 3)
            first = max(seconds / 2, 3.5 * factor)  # the second half at factor x the rate: 3.5 s or more
            own += ["-r", str(int(2 * rate * first)), "-R", f"{rate:.1f}", "-F", f"{factor:.2f}"]
            at_s = 0.02 + first  # the server's 20 ms to settle, then the first half's arrivals
        else:
            own += ["-r", str(int(rate * seconds)), "-R", f"{rate:.1f}"]
            at_s = None
    # Host work per request (tokenising, pre- and post-processing) inside each iteration: a
    # server's CPU matters to it, as a real one's does (without it a CPU fault slows nothing).
    own += ["-c", str(rnd.randint(300, 1000))]
    seed = rnd.randrange(1 << 30)
    argv = [str(zoo / "server"), "-s", str(seed), *own]
    job = ZooJob("server", ["taskset", "-c", CPU, *argv], None, env, shape, at_s=at_s, serving=True)
    if shape != "llm":  # REPLIES: a share of its NIC drawn from its own seed (the trial's draws stay as they were)
        share = random.Random(seed).uniform(*REPLY_SHARE)
        job.reply_bytes = int(share * NIC_BYTES_PER_S / rate)
    return job


def run_trials(args: argparse.Namespace, keep: Path | None) -> list[Trial]:
    shapes = args.shapes.split(",")
    asked = args.faults.split(",") if args.faults else None
    plan = [
        (shape, fault, k, args.seconds)
        for shape in shapes
        for fault in faults_of(shape)
        if asked is None or fault in asked
        for k in range(args.trials_per_fault)
    ]
    plan += [(shape, "none", -1, args.healthy_seconds) for shape in shapes if args.healthy_seconds]
    random.Random(args.seed).shuffle(plan)
    trials = []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:  # a disk: memory_pressure reads from it
        tmp = Path(d)
        fc = tmp / "fc"
        harness.build_fixtures(fc)
        for i, (shape, fault, k, seconds) in enumerate(plan):
            rnd = random.Random(f"{args.seed}:{shape}:{fault}:{k}")  # the same trial in any piece
            job = make_job(shape, fc, tmp, seconds, rnd)
            t = diagnose.trial(fault, fc, fc / "nvml", tmp, seconds, rnd, job)
            trials.append(t)
            if keep is not None:
                with keep.open("a") as f:
                    f.write(json.dumps({"piece": harness._command(), "seed": args.seed, **asdict(t)}) + "\n")
            print(
                f"[{i + 1}/{len(plan)}] {shape:12s} {fault:17s} -> {t.predicted:20s}"
                + (f" job {t.slowdown:.2f}x" if t.slowdown is not None else "")
                + (f" detected {t.detect_s:.2f} s after onset" if t.detect_s is not None else "")
                + (f"; false: {t.false}" if t.false else "")
                + (f"; the hypervisor stole {t.steal_before:.0%} -> {t.steal_after:.0%}" if stole(t) else "")
                + f"\n    {t.job}"
                + (f"\n    evidence: {json.dumps(t.evidence)}" if t.evidence and t.predicted != CAUSE[fault] else ""),
                flush=True,
            )
    return trials


def kept(path: Path) -> list[Trial]:
    names = {f.name for f in fields(Trial)}
    return [
        Trial(**{k: v for k, v in json.loads(line).items() if k in names}) for line in path.read_text().splitlines()
    ]


SLOWED = 1.1  # a fault that slowed the job less (its own median step, diagnose.job_slowdown) may go unseen


STOLE = 0.05  # the engine's margin for steal (analysis/diagnosis.Margins.steal_rise)


def stole(t: Trial) -> bool:
    """The VM's steal rose by STOLE or more after the onset: another VM took its CPUs."""
    return t.steal_before is not None and t.steal_after is not None and t.steal_after - t.steal_before >= STOLE


def slowed(t: Trial) -> bool:
    return t.slowdown is not None and t.slowdown >= SLOWED


def scored(t: Trial) -> Trial:
    """A healthy run as the matrices count it: diagnosed with its first
    false diagnosis, if any (diagnose.py's matrix counts it "none", and
    only the false diagnoses' count says otherwise)."""
    return replace(t, predicted=t.false[0]) if t.fault == "none" and t.false else t


def report(trials: list[Trial], rec: Record, what: str) -> None:
    print()
    print(f"machine: {harness.describe()}; {what}")
    trials = [scored(t) for t in trials]
    every = [s for s in SHAPES if any(t.shape == s for t in trials)]
    add: Callable[..., object] = rec.add
    for shape in every:
        mine = [t for t in trials if t.shape == shape]
        m, rows = diagnose.confusion(mine)
        print()
        diagnose.print_confusion(m, rows, f"{shape}: {len(mine)} trials", SHORT)
        right = sum(m[r][r] for r in rows)
        print(f"{shape} accuracy: {right}/{len(mine)} = {right / len(mine):.0%}")
        add(
            f"zoo diagnosis accuracy, {shape}",
            100 * right / len(mine),
            "%",
            ".0f",
            Target(">=", 95),
            note=f"{len(mine)} trials",
        )
        felt = [t for t in mine if t.fault == "none" or slowed(t)]
        if felt and len(felt) < len(mine):
            got = sum(t.predicted == CAUSE[t.fault] for t in felt)
            print(f"  on the {len(felt)} healthy or slowed {SLOWED:g}x or more (own clock): {got / len(felt):.0%}")
        unslowed = [t for t in mine if t.fault != "none" and t.predicted != CAUSE[t.fault] and not slowed(t)]
        if unslowed:
            print(f"  missed, the job not slowed {SLOWED:g}x by its own clock: " + ", ".join(t.fault for t in unslowed))
        confounded = [t for t in mine if t.predicted != CAUSE.get(t.fault, "none") and stole(t)]
        if confounded:
            print(
                f"  wrong with the hypervisor's steal {STOLE:.0%} or more up after the onset (a noisy"
                " neighbour not injected): " + ", ".join(f"{t.fault} -> {t.predicted}" for t in confounded)
            )
    m, rows = diagnose.confusion(trials)
    print()
    diagnose.print_confusion(m, rows, f"all shapes: {len(trials)} trials", SHORT)
    felt = [t for t in trials if t.fault == "none" or slowed(t)]
    right = sum(t.predicted == CAUSE[t.fault] for t in felt)
    if felt:  # a piece of fault trials none of which slowed its job has none
        print(
            f"accuracy on the {len(felt)} trials healthy or whose job the fault slowed {SLOWED:g}x or more: "
            f"{right / len(felt):.0%}"
        )
        add(
            f"zoo diagnosis accuracy, all shapes, faults that slowed the job {SLOWED:g}x or more",
            100 * right / len(felt),
            "%",
            ".0f",
            Target(">=", 95),
            note=f"{len(felt)} of {len(trials)} trials",
        )
    else:
        print(f"no trial healthy or whose job the fault slowed {SLOWED:g}x or more")
    print()
    for cause in rows[:-1]:
        r = diagnose.recall(m, cause)
        on = sorted({t.shape for t in trials if CAUSE[t.fault] == cause})
        missed = sorted({t.shape for t in trials if CAUSE[t.fault] == cause and t.predicted != cause})
        print(
            f"  {cause:20s} recall {r:.2f} on {len(on)} shapes" + (f"; missed on {', '.join(missed)}" if missed else "")
        )
        add(f"zoo diagnosis recall, {cause}", r, "", ".2f", Target(">=", 0.9), note=f"{sum(m[cause].values())} trials")
    for fault, how in (("nic_late", "ip netns exec"), ("nic_setns", "setns")):
        late = [t for t in trials if t.fault == fault]
        if late:
            got = sum(t.predicted == "nic_contention" for t in late)
            print(f"  {fault} (namespace entered after start, {how}): {got}/{len(late)} named nic_contention")
            name = f"zoo diagnosis recall, nic_contention, namespace entered late ({how})"
            add(name, got / len(late), "", ".2f", Target(">=", 0.9), note=f"{len(late)} trials")
    det, name = diagnose.detection(trials)
    if det:
        print(f"detection after onset: p50 {statistics.median(det):.2f} s, p95 {diagnose.p95(det):.2f} s")
        add("zoo diagnosis, detection after onset, p50", statistics.median(det), "s", ".2f")
        add("zoo diagnosis, detection after onset, p95", diagnose.p95(det), "s", ".2f", Target("<=", 2))
    faulty = [t for t in trials if t.fault != "none"]
    wrong = sum(t.predicted not in ("none", CAUSE[t.fault]) for t in faulty)
    early = sum(len(t.false) for t in faulty)
    print(f"fault trials: {wrong} named another cause; {early} false diagnoses (before onset, or another process)")
    add("zoo fault trials diagnosed as another cause", wrong, "", ".0f", note=f"of {len(faulty)}")
    add("zoo false diagnoses in fault trials", early, "", ".0f", note="before the onset, or of another process")
    healthy = [t for t in trials if t.fault == "none"]
    for shape in every:
        mine = [t for t in healthy if t.shape == shape]
        if not mine:
            continue
        minutes = sum(t.wall_s for t in mine) / 60
        false = sum(len(t.false) for t in mine)
        causes = sorted({c for t in mine for c in t.false})
        print(
            f"  healthy {shape}: {false} false diagnoses in {minutes:.1f} min"
            + (f" ({', '.join(causes)})" if causes else "")
        )
        add(f"zoo false diagnoses, healthy {shape}", false, "", ".0f", note=f"in {minutes:.1f} min")
    if healthy:
        hours = sum(t.wall_s for t in healthy) / 3600
        false = sum(len(t.false) for t in healthy)
        print(f"healthy runs: {false} false diagnoses in {hours * 60:.1f} min ({false / hours:.1f} per hour)")
        add(
            "zoo false diagnoses per hour of healthy runs",
            false / hours,
            "per hour",
            ".1f",
            note=f"{false} in {hours * 60:.1f} min",
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--faults", help=f"of {', '.join(FAULTS)} (default: each that fits the shape)")
    ap.add_argument("--trials-per-fault", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--healthy-seconds", type=float, default=0.0, help="one healthy run this long of each shape")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="append the trials here (JSON lines) and report on all it holds")
    args = ap.parse_args()
    unknown = set(args.shapes.split(",")) - set(SHAPES)
    if unknown:
        ap.error(f"no shape {', '.join(sorted(unknown))}")
    harness.need_root("diagnose_zoo")
    rec = Record()
    trials = run_trials(args, args.keep)
    if args.keep is not None:
        trials = kept(args.keep)
        pieces = {json.loads(line)["piece"] for line in args.keep.read_text().splitlines()}
        what = f"{len(trials)} trials kept in {args.keep.name}, from {len(pieces)} runs"
    else:
        what = f"{len(trials)} trials of {args.seconds:g} s, seed {args.seed}"
    report(trials, rec, what)
    rec.write()


if __name__ == "__main__":
    main()
