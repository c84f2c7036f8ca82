"""Errors a user can act on: each names what happened and how to fix it."""

from __future__ import annotations


class MemtraceError(Exception):
    """Base class. ``fix`` says what the user should do."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class LibbpfMissing(MemtraceError):
    def __init__(self, detail: str) -> None:
        super().__init__(
            f"libbpf was not found ({detail})",
            "install libbpf 1.1 or newer (Debian/Ubuntu: apt-get install libbpf1; "
            "RHEL/Fedora: dnf install libbpf) or point MEMTRACE_LIBBPF at libbpf.so.1",
        )


class LibbpfTooOld(MemtraceError):
    def __init__(self, version: str) -> None:
        super().__init__(
            f"libbpf {version} is too old: memtrace needs 1.1 or newer",
            "upgrade libbpf (Debian bookworm ships 1.1.2) or point MEMTRACE_LIBBPF at a newer libbpf.so.1",
        )


class NotPrivileged(MemtraceError):
    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}: permission denied",
            "memtrace needs CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (CAP_KILL to hold processes): "
            "run it as root (sudo memtrace ...) or add the capabilities to the DaemonSet",
        )


class BTFMissing(MemtraceError):
    def __init__(self) -> None:
        super().__init__(
            "this kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing)",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution since 2020 "
            "ships one); memtrace's CO-RE programs cannot load without it",
        )


class TracefsMissing(MemtraceError):
    def __init__(self, detail: str) -> None:
        super().__init__(
            f"tracefs is not mounted and could not be mounted ({detail})",
            "mount it (mount -t tracefs nodev /sys/kernel/tracing) or, in Kubernetes, "
            "mount the host's /sys/kernel/tracing into the pod",
        )


class LoadError(MemtraceError):
    def __init__(self, what: str, err: int, log: str) -> None:
        import os

        tail = "\n".join(log.strip().splitlines()[-15:])
        super().__init__(
            f"the kernel refused to load memtrace's BPF programs ({what}: {os.strerror(err)})"
            + ("\n  libbpf said:\n    " + tail.replace("\n", "\n    ") if tail else ""),
            "run `memtrace doctor`; a kernel older than 5.15 or one without BTF cannot run memtrace",
        )


class AttachError(MemtraceError):
    pass


class CommandNotFound(MemtraceError):
    def __init__(self, cmd: str) -> None:
        super().__init__(
            f"command not found: {cmd}",
            "check the spelling and PATH, or give the full path to the program",
        )


class BadOption(MemtraceError):
    pass


class ProcMismatch(MemtraceError):
    def __init__(self, pid: int, proc_pid: int) -> None:
        super().__init__(
            f"/proc belongs to another pid namespace (this process is pid {pid} here, /proc names it "
            f"{proc_pid if proc_pid >= 0 else 'nothing'}): memtrace could not find or continue processes",
            "mount a /proc for this pid namespace (unshare --pid --fork --mount-proc, or the container's own "
            "/proc), or run memtrace in the host's pid namespace (hostPID: true for the DaemonSet)",
        )
