"""OTLP resource attributes for a traced process: who it is, where it runs.

container.id and k8s.pod.uid come from the process's cgroup path, which
names both under every common runtime (containerd, CRI-O, Docker; cgroupfs
and systemd drivers). Values are sanitised so that odd process names cannot
break an exporter or a backend's label rules.
"""

from __future__ import annotations

import os
import re
import socket
import time
import weakref
from pathlib import Path

from memtrace.core.ids import ProcessInfo, ProcessKey

_CONTAINER = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
MAX_VALUE = 128


def clean(value: str, limit: int = MAX_VALUE) -> str:
    """Printable, bounded, never empty."""
    s = "".join(c if c.isprintable() else "?" for c in value)[:limit]
    return s or "?"


def from_cgroup(text: str) -> dict[str, str]:
    """container.id and k8s.pod.uid from /proc/PID/cgroup contents."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            m = _CONTAINER.search(part)
            if m and "container.id" not in out:
                out["container.id"] = m.group(1)
            p = _POD.search(part)
            if p and "k8s.pod.uid" not in out:
                out["k8s.pod.uid"] = p.group(1).replace("_", "-")
    return out


def host_attributes(env: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    attrs = {"host.name": clean(socket.gethostname())}
    node = env.get("NODE_NAME", "").strip()
    if node:
        attrs["k8s.node.name"] = clean(node)
    return attrs


def process_attributes(pid: int, exe: str = "", proc: Path = Path("/proc")) -> dict[str, str | int]:
    """Its OTLP resource as the host says it: the executable's path, the
    container and pod. Its name is the one BPF took, as the table says it
    (export/otlp.resource_of), never this file's: `python3` runs `python3.11`."""
    attrs: dict[str, str | int] = {"process.pid": pid}
    if exe:
        attrs["process.executable.path"] = clean(exe, 4096)
    try:
        attrs.update(from_cgroup((proc / str(pid) / "cgroup").read_text()))
    except OSError:
        pass
    try:
        attrs.update(job_identity(environ((proc / str(pid) / "environ").read_bytes())))
    except OSError:
        pass
    return attrs


# ---- a process's job, from what its launcher put in its environment ----

# Where a rank's number, the ranks' count and the rank on its host come
# from, by launcher, in the order one is believed over another: torchrun
# (torchelastic) and MPI set their own beside Slurm's when run under srun.
_RANKS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "torch"),  # torchrun, torch.distributed's env:// rendezvous
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "openmpi"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "mpich"),  # MPICH, Intel MPI
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "slurm"),  # srun
    ("JOB_COMPLETION_INDEX", "", "", "kubernetes-indexed-job"),  # a Kubernetes Indexed Job's pod
)
_LOOPBACK = ("localhost", "127.", "::1", "0.0.0.0")


def environ(raw: bytes) -> dict[str, str]:
    """/proc/PID/environ's text: the environment the process was started
    with (what its launcher gave it), not what it set since."""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            out[name.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _number(env: dict[str, str], name: str) -> int | None:
    """A variable's value as a rank or a count (None: unset, or not one)."""
    value = env.get(name, "").strip() if name else ""
    if not value.isdigit() or len(value) > 9:
        return None
    return int(value)


def job_identity(env: dict[str, str], host: str = "") -> dict[str, str | int]:
    """Which job a process belongs to and which rank it is, from its
    launcher's variables, with no change to the job: `memtrace.job.id`
    (the launcher's name for the run, the same in every rank on every host),
    `memtrace.job.launcher` (whose variables said so), `memtrace.job.rank`,
    `memtrace.job.world_size`, `memtrace.job.local_rank`. Empty for a process
    no launcher started. The job's id, by precedence: torchelastic's run id
    (TORCHELASTIC_RUN_ID; not its default `none`), Slurm's job and step
    (SLURM_JOB_ID, SLURM_STEP_ID), the rendezvous address
    (MASTER_ADDR:MASTER_PORT; a loopback address is one host's alone, so
    the host's name is added). A Kubernetes Indexed Job's pod gives its
    index as its rank; the job itself comes from the collector's
    k8sattributes processor, by the pod."""
    out: dict[str, str | int] = {}
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    slurm = env.get("SLURM_JOB_ID", "").strip()
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if run_id and run_id != "none":
        out["memtrace.job.launcher"], out["memtrace.job.id"] = "torchelastic", clean(run_id)
    elif slurm:
        step = env.get("SLURM_STEP_ID", "").strip()
        out["memtrace.job.launcher"] = "slurm"
        out["memtrace.job.id"] = clean(f"{slurm}.{step}" if step else slurm)
    elif addr and port:
        where = f"{addr}:{port}"
        if addr.startswith(_LOOPBACK):
            where = f"{host or socket.gethostname()}/{where}"
        out["memtrace.job.launcher"], out["memtrace.job.id"] = "rendezvous", clean(where)
    for rank_var, size_var, local_var, launcher in _RANKS:
        rank = _number(env, rank_var)
        if rank is None:
            continue
        out["memtrace.job.rank"] = rank
        size, local = _number(env, size_var), _number(env, local_var)
        if size is not None and size > rank:
            out["memtrace.job.world_size"] = size
        if local is not None:
            out["memtrace.job.local_rank"] = local
        out.setdefault("memtrace.job.launcher", launcher)
        break
    return out


def _stat_fields(pid: int, proc: Path) -> list[str]:
    """/proc/PID/stat's fields after the command name (the state is [0]);
    raises OSError if the process is gone."""
    return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def _ns_per_tick() -> int:
    return 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def process_start_ticks(pid: int, proc: Path = Path("/proc")) -> int:
    """When a process started, in clock ticks since boot (/proc/PID/stat), 0 if gone."""
    try:
        return int(_stat_fields(pid, proc)[19])
    except (OSError, ValueError, IndexError):
        return 0


def start_ticks_of(key: ProcessKey) -> int:
    """A process key's start in the ticks /proc/PID/stat counts (the kernel
    rounds its boot-clock ns down to them)."""
    return key.start_ns // _ns_per_tick()


def is_running(key: ProcessKey, proc: Path = Path("/proc")) -> bool:
    """Is this process (not merely its pid, which may be reused) still there?"""
    ticks = process_start_ticks(key.pid, proc)
    return ticks != 0 and (key.start_ns == 0 or ticks == start_ticks_of(key))


def boot_wall_ns(proc: Path = Path("/proc")) -> int:
    """When the host booted, as wall-clock ns: the kernel's own `btime`
    (/proc/stat), the same for every agent on the host, so a process's
    start (boot-clock ns + this) names it alike in all of them. Sampling
    the two clocks instead jitters by microseconds between agents."""
    try:
        for line in (proc / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) * 1_000_000_000
    except (OSError, ValueError, IndexError):
        pass
    return time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def read_process(key: ProcessKey, proc: Path = Path("/proc")) -> ProcessInfo:
    """What the host adds to a process's BPF identity: its executable and
    its container and pod (from its cgroup path), read now. Nothing if the
    pid is no longer this process: then it keeps what BPF said alone."""
    if not is_running(key, proc):
        return ProcessInfo()
    name = exe = ""
    ppid = 0
    try:
        name = (proc / str(key.pid) / "comm").read_text().strip()
    except OSError:
        pass
    try:
        exe = str((proc / str(key.pid) / "exe").readlink())
    except OSError:
        pass
    try:
        ppid = int(_stat_fields(key.pid, proc)[1])
    except (OSError, ValueError, IndexError):
        pass
    attrs = process_attributes(key.pid, exe, proc)
    if not is_running(key, proc):  # replaced while being read
        return ProcessInfo()
    return ProcessInfo(name, exe, attrs, ppid=ppid)


def command_of(key: ProcessKey, proc: Path = Path("/proc")) -> tuple[str, str] | None:
    """The process's command name and executable now (after an exec, the
    new program's); None if it is gone or its pid is another process's."""
    try:
        name = (proc / str(key.pid) / "comm").read_text().strip()
    except OSError:
        return None
    try:
        exe = str((proc / str(key.pid) / "exe").readlink())
    except OSError:
        exe = ""
    return (name, exe) if is_running(key, proc) else None


# The GPU driver's device files: host memory mapped from them is the
# driver's (pinned allocations, mapped with cudaHostAlloc and the like).
DRIVER_DEVICE_PREFIX = "/dev/nvidia"


def driver_ranges(maps: str) -> list[tuple[int, int]]:
    """The address ranges of a /proc/PID/maps text mapped from the GPU driver's device files."""
    out = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(DRIVER_DEVICE_PREFIX):
            lo, hi = parts[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def driver_mapped(key: ProcessKey, proc: Path = Path("/proc")) -> list[tuple[int, int]]:
    """The host memory ranges the GPU driver has mapped into a running
    process (none if it is gone, or the pid is another process's now)."""
    try:
        text = (proc / str(key.pid) / "maps").read_text()
    except OSError:
        return []
    return driver_ranges(text) if is_running(key, proc) else []


class KeptFile:
    """A /proc (or cgroup) file read again and again: kept open, each reading preads from its
    start (such a file is made anew at offset 0), several times cheaper than an open, read and
    close (docs/design/evidence.md#pread). One that fails is closed, and opened again at the next
    reading; its descriptor is closed with the reader too."""

    CHUNK = 65536

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._closer: weakref.finalize[[int], KeptFile] | None = None

    def read(self) -> bytes | None:
        """The file's content now; None where it cannot be opened or read."""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                self._closer = weakref.finalize(self, os.close, self._fd)
            chunks = [os.pread(self._fd, self.CHUNK, 0)]
            while len(chunks[-1]) == self.CHUNK:  # a large one (/proc/stat of many CPUs)
                chunks.append(os.pread(self._fd, self.CHUNK, self.CHUNK * len(chunks)))
        except OSError:
            self.close()
            return None
        return b"".join(chunks)

    def close(self) -> None:
        if self._closer is not None:
            self._closer()  # closes the fd once, however often it is called
        self._fd = self._closer = None


class CpuReader:
    """Processes' CPU time read again and again (the overhead budget weighs
    each launching process twice a second): each process's /proc/PID/stat
    kept open and read from its start, one pread a reading, several times
    cheaper than an open, read and close (docs/design/evidence.md#pread).
    An open file stays the process it was opened for (a pid
    taken again is another /proc entry), so a key is checked against the
    process's start once, when its file is opened. forget() a process that
    exited; close() at the end."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._fds: dict[ProcessKey, int] = {}

    def cpu_ns(self, key: ProcessKey) -> int | None:
        """As process_cpu_ns: None if the process is gone or its pid is now another's."""
        fd = self._fds.get(key)
        first = fd is None
        try:
            if fd is None:
                fd = self._fds[key] = os.open(self.proc / str(key.pid) / "stat", os.O_RDONLY | os.O_CLOEXEC)
            fields = os.pread(fd, 4096, 0).decode("ascii", "replace").rsplit(")", 1)[1].split()
            ticks, utime, stime = int(fields[19]), int(fields[11]), int(fields[12])
        except (OSError, ValueError, IndexError):
            self.forget(key)
            return None
        if first and key.start_ns and ticks != start_ticks_of(key):
            self.forget(key)
            return None
        return (utime + stime) * _ns_per_tick()

    def forget(self, key: ProcessKey) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for key in list(self._fds):
            self.forget(key)


def process_cpu_ns(key: ProcessKey, proc: Path = Path("/proc")) -> int | None:
    """A process's user and system CPU time so far, all its threads
    (/proc/PID/stat, in clock ticks), None if it is gone or its pid is now
    another process's."""
    try:
        fields = _stat_fields(key.pid, proc)
        ticks, utime, stime = int(fields[19]), int(fields[11]), int(fields[12])
    except (OSError, ValueError, IndexError):
        return None
    if key.start_ns and ticks != start_ticks_of(key):
        return None
    return (utime + stime) * _ns_per_tick()
