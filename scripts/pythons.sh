#!/usr/bin/env bash
# Run the Python-level tests (those that load no BPF and boot no kernel) under
# every other CPython memtrace supports (pyproject: 3.10+), each in its own
# environment under .venvs/. The interpreters come from pyenv, as on this
# machine kind; CI fails rather than skips when one is missing.
#   scripts/pythons.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
versions=(${MEMTRACE_PYTHONS:-3.10 3.13})
for v in "${versions[@]}"; do
  interp=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python3 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$interp" ]; then
    interp=$(command -v "python$v" || true)
  fi
  if [ -z "$interp" ]; then
    echo "pythons: CPython $v not found (looked in pyenv and PATH); install it, or set MEMTRACE_PYTHONS" >&2
    exit 1
  fi
  env=.venvs/$v
  [ -x "$env/bin/python" ] || "$interp" -m venv "$env"
  "$env/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]"
  echo "pythons: Python-level tests on $("$env/bin/python" --version)" >&2
  "$env/bin/python" -m pytest -p no:cacheprovider -m "not bpf and not qemu" "$@"
done
