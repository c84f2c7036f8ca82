#!/usr/bin/env bash
# Pack what the GPU machine lacks into .devcarry/ (git-ignored), for
# scripts/gpu/run.sh there: Debian's libbpf.so.1 (the machine has libelf and
# zlib, not libbpf) and wheels of memtrace's pure-Python dependencies that its
# image may lack or hold at another version (perfetto for --timeline) (CPython 3.12, x86-64), for
# memtrace alone (run.sh keeps them off the traced commands; typer, click and
# rich are the image's: typer 0.29's wheel wants pydantic, which it lacks), and memtrace's C
# helpers built for CPython 3.12. PyTorch, JAX,
# CuPy, numpy and nvidia-ml-py are the image's own.
#   scripts/gpu/pack.sh        (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.devcarry
rm -rf "$out"; mkdir -p "$out/lib" "$out/whl"
lib=$(ls /usr/lib/x86_64-linux-gnu/libbpf.so.1.* | sort -V | tail -1)
cp "$lib" "$out/lib/libbpf.so.1"
pkgs=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | grep -i -E \
  '^(opentelemetry-[a-z-]+|pyelftools|pyroute2|googleapis-common-protos|protobuf|perfetto)==' )
# shellcheck disable=SC2086
.venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$out/whl" $pkgs
# memtrace's C helpers (the fast host sampler) for the machine's CPython 3.12:
# loaded through ctypes, so any 3.12 headers build them.
inc=$("${PY312:-$HOME/.pyenv/versions/3.12.1/bin/python3}" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
gcc -shared -fPIC -O2 -fvisibility=hidden -I"$inc" memtrace/native/fastsample.c -o "$out/_fastsample.cpython-312-x86_64-linux-gnu.so" -lpthread
du -sh "$out"
