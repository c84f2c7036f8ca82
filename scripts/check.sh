#!/usr/bin/env bash
# Static checks, each failing the run when broken: lint and format (ruff),
# types (mypy --strict), and the import contract between stages (import-linter,
# contracts in pyproject.toml). Run by scripts/test.sh before the tests.
#   scripts/check.sh            (after scripts/setup.sh --dev)
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin
echo "check: ruff" >&2
$py/ruff check memtrace tests bench scripts examples
$py/ruff format --check -q memtrace tests bench scripts examples
echo "check: mypy --strict" >&2
$py/mypy --strict memtrace
echo "check: import contract" >&2
$py/lint-imports --no-cache >/dev/null || { $py/lint-imports --no-cache; exit 1; }
echo "check: all static checks pass" >&2
