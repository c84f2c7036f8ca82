#!/usr/bin/env bash
# Set up everything and run the whole test suite (as root: the tests load
# real BPF programs into this kernel).
#   scripts/test.sh [pytest args...]     (as a user it runs itself through sudo)
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "test: the tests load BPF programs: run this as root" >&2; exit 1; }
  exec sudo -E -H env "PATH=$PATH" "$0" "$@"
fi
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
command -v go >/dev/null || { echo "test: Go 1.24+ is needed to build the OpenTelemetry Collector for the end-to-end tests" >&2; exit 1; }
make -s check-objects
scripts/check.sh
scripts/pythons.sh -q
exec .venv/bin/python -m pytest "$@"
