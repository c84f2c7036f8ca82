#!/usr/bin/env bash
# Install what memtrace needs on a Debian/Ubuntu host into ./.venv.
# apt-get runs as root: directly when this runs as root, else through sudo.
#   scripts/setup.sh          runtime: libbpf1, gcc (the fast host sampler) and the Python package
#   scripts/setup.sh --demo   also make: to build the simulated workload (scripts/demo.sh)
#   scripts/setup.sh --dev    also clang, bpftool, qemu, cross compilers: to build objects and run the tests
#   scripts/setup.sh LEVEL --print   list the apt packages LEVEL wants, install nothing
set -euo pipefail
cd "$(dirname "$0")/.."
level=${1:-}; dev=0; demo=0
case $level in
  --dev) dev=1; demo=1 ;;
  --demo) demo=1 ;;
  ""|--print) ;;
  *) echo "usage: scripts/setup.sh [--demo|--dev] [--print]" >&2; exit 2 ;;
esac

want=(libbpf1 libelf1 zlib1g)
# The fast host sampler (memtrace/native/fastsample.c) is built at install: a C
# compiler, and the Python headers where this python3 has none.
want+=(gcc libc6-dev)
python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
  || want+=(python3-dev)
# The simulated workload's test CUDA libraries (tests/fixtures) are C.
[ $demo = 1 ] && want+=(make)
if [ $dev = 1 ]; then
  # Build the objects; boot other kernels (qemu) with an arm64 cross
  # toolchain for the portability tests.
  want+=(clang llvm libbpf-dev bpftool util-linux cpio busybox-static
         qemu-system-arm qemu-system-x86 gcc-aarch64-linux-gnu libc6-dev-arm64-cross
         libbpf-dev:arm64 libelf-dev:arm64 zlib1g-dev:arm64 libzstd-dev:arm64)
  # Open the flame graph as a user would, in a real browser (tests/browser.py).
  want+=(chromium-headless-shell)
fi
if [ "${1:-}" = --print ] || [ "${2:-}" = --print ]; then
  printf '%s\n' "${want[@]}"
  exit 0
fi

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else echo "setup: '$*' needs root: run this as root, or install sudo" >&2; exit 1
  fi
}
need_apt=()
have() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q 'install ok installed'; }
for p in "${want[@]}"; do have "$p" || need_apt+=("$p"); done
if [ $dev = 1 ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    as_root dpkg --add-architecture arm64
    need_apt+=(libbpf-dev:arm64)
  fi
fi
python3 -m venv --help >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
extras=""; [ $dev = 1 ] && extras="[test,dev]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras}"
echo "setup: memtrace installed in $(pwd)/.venv ($(.venv/bin/memtrace --version))" >&2
echo "setup: it is not on PATH; run it as root, e.g.: .venv/bin/memtrace doctor" >&2
