"""Bad input gets a clear, actionable message and an exit code, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import memtrace_cmd, top_over_a_released_workload

import memtrace.bpf.host as bpfhost
from memtrace.core.errors import BTFMissing, LibbpfMissing, LibbpfTooOld


def memtrace(*args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*memtrace_cmd(), *args], capture_output=True, text=True, env=dict(os.environ, **(env or {})), **kw
    )


@pytest.mark.bpf
def test_unknown_command() -> None:
    p = memtrace("run", "--", "/no/such/program")
    assert p.returncode == 2
    assert "command not found: /no/such/program" in p.stderr and "fix:" in p.stderr
    assert "Traceback" not in p.stderr


def test_missing_command_and_bad_options() -> None:
    p = memtrace("run")
    assert p.returncode == 2 and "Missing argument" in p.stderr
    p = memtrace("run", "--format", "xml", "--", "true")
    assert p.returncode == 2 and "xml" in p.stderr
    p = memtrace("run", "--ring-size", "0", "--", "true")
    assert p.returncode == 2 and "--ring-size" in p.stderr and "fix:" in p.stderr
    p = memtrace("top", "--interval", "0")
    assert p.returncode == 2


@pytest.mark.bpf  # it gets as far as loading libbpf only with the privileges to load BPF
def test_missing_libbpf_says_how_to_install_it() -> None:
    p = memtrace("run", "--", "true", env={"MEMTRACE_LIBBPF": "/nonexistent/libbpf.so.1"})
    assert p.returncode == 2
    assert "libbpf was not found" in p.stderr and "apt-get install libbpf1" in p.stderr
    assert "Traceback" not in p.stderr


def test_too_old_libbpf_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "old.c"
    src.write_text("int libbpf_major_version(void){return 0;}\nint libbpf_minor_version(void){return 8;}\n")
    lib = tmp_path / "libbpf.so.0"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    from memtrace.bpf.libbpf import Libbpf

    with pytest.raises(LibbpfTooOld, match="0.8 is too old"):
        Libbpf(str(lib))
    with pytest.raises(LibbpfMissing):
        Libbpf(str(tmp_path / "absent.so"))


def test_missing_btf_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bpfhost, "BTF_PATH", tmp_path / "vmlinux")
    with pytest.raises(BTFMissing, match="CONFIG_DEBUG_INFO_BTF"):
        bpfhost.check_kernel()


@pytest.mark.bpf
def test_unprivileged_user_is_told_what_to_grant(tmp_path: Path) -> None:
    # Root with every capability dropped: what a locked-down container gets.
    p = subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", *memtrace_cmd(), "run", "--", "true"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2, p.stderr
    assert "permission denied" in p.stderr and "CAP_BPF" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.bpf
def test_doctor_passes_here_and_fails_with_a_fix_without_libbpf() -> None:
    from memtrace.core.overhead import EntryKind
    from memtrace.runtime.overhead import CACHE, load_cached

    CACHE.unlink(missing_ok=True)
    p = memtrace("doctor", env={"COLUMNS": "300"})
    assert p.returncode == 0, p.stdout
    assert "BPF programs" in p.stdout and "loads on this kernel" in p.stdout
    # It times a probe's trap, says it, and keeps it for the agents that start next.
    (line,) = [l for l in p.stdout.splitlines() if "probe cost" in l]
    m = re.search(r"a trap costs (\d+\.\d) us here", line)
    assert m is not None, line
    kept = load_cached()
    assert kept is not None
    # Said at the kind CUDA's entries are (a push) where it was timed; the single-stepped kind beside it.
    said = kept.by_kind.get(EntryKind.EMULATED) or kept.by_kind[EntryKind.STEPPED]
    assert f"{said.entry_seconds * 1e6:.1f}" == m.group(1)
    if EntryKind.EMULATED in kept.by_kind:
        assert "at an entry the kernel emulates" in line
        assert f"{kept.by_kind[EntryKind.STEPPED].entry_seconds * 1e6:.1f} us at one it single-steps" in line
    p = memtrace("doctor", env={"MEMTRACE_LIBBPF": "/nonexistent.so"})
    assert p.returncode == 1
    assert "FAIL" in p.stdout and "libbpf" in p.stdout and "fix:" in p.stdout


@pytest.mark.bpf
def test_top_shows_a_process_started_before_it(fakecuda: Path) -> None:
    pid, out = top_over_a_released_workload(fakecuda, 200)
    assert str(pid) in out and "workload" in out


def test_version() -> None:
    p = memtrace("--version")
    assert p.returncode == 0 and p.stdout.startswith("memtrace ")


def test_help_lists_the_commands() -> None:
    p = memtrace("--help", env={"COLUMNS": "120"})
    for cmd in ("run", "top", "doctor"):
        assert cmd in p.stdout
    assert sys.executable


def test_doctor_judges_kernels_by_version_and_arch() -> None:
    from memtrace.runtime.doctor import check_kernel

    assert check_kernel("6.18.44-fc", "x86_64").ok and not check_kernel("6.18.44-fc", "x86_64").warn
    assert check_kernel("6.1.0-56-cloud-arm64", "aarch64").ok
    old = check_kernel("5.15.0-91-generic", "x86_64")
    assert old.ok and old.warn and "proven" in old.detail
    too_old = check_kernel("5.10.0-28-amd64", "x86_64")
    assert not too_old.ok and "5.15 or newer" in too_old.fix
    assert not check_kernel("6.1.0", "riscv64").ok
