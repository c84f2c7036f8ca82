"""memtrace's command line: one module per command, each wiring only."""

from memtrace.cli import doctor, profile, push, run, snapshot, top  # noqa: F401  (registers the commands)
from memtrace.cli.common import app


def entry() -> None:
    app()


__all__ = ["app", "entry"]
