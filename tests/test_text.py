"""What memtrace says on stderr and in `doctor`, piped: at most 80 columns,
every continuation line indented (never back at column 0), no line padded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from memtrace.export.text import say


def _lines(cmd: list[str]) -> list[str]:
    p = subprocess.run(
        [sys.executable, "-m", "memtrace", *cmd],
        capture_output=True,
        text=True,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"},
    )
    return (p.stdout + p.stderr).splitlines()


def _check(lines: list[str], starts: tuple[str, ...]) -> None:
    assert lines
    for line in lines:
        assert len(line) <= 80 or len(line.split()) == 1, line  # only a word longer than a line (never cut)
        assert line == line.rstrip(), f"padded: {line!r}"
        assert line.startswith(starts) or line.startswith(" "), f"a continuation back at column 0: {line!r}"


def test_an_error_wraps_under_itself_at_80_columns() -> None:
    lines = _lines(["push", "--endpoint", "ftp://" + "x" * 120])
    assert lines[0].startswith("memtrace: endpoint")
    assert any(line.startswith("  fix:") for line in lines)
    _check(lines, ("memtrace:",))


@pytest.mark.bpf  # doctor loads the object to check it
def test_doctor_wraps_each_check_under_itself_at_80_columns() -> None:
    lines = _lines(["doctor"])
    assert len(lines) > 8
    _check(lines, ("  ok", "warn", "FAIL", "memtrace "))


def test_a_long_word_is_never_cut() -> None:
    from rich.console import Console

    c = Console(width=40, record=True, file=open("/dev/null", "w"))  # noqa: SIM115 - closed with the console
    say(c, "fix:", "set NVIDIA_DRIVER_CAPABILITIES=utility,compute in the pod spec", lead=2, indent=7)
    text = c.export_text()
    assert "NVIDIA_DRIVER_CAPABILITIES=utility,compute" in text
    assert all(line.startswith("  fix:") or line.startswith(" " * 7) for line in text.splitlines())
