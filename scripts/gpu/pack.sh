#!/usr/bin/env bash
# Pack what the GPU machine lacks into .devcarry/ (git-ignored), for
# scripts/gpu/run.sh there: Debian's libbpf.so.1 (the machine has libelf and
# zlib, not libbpf) and wheels of memtrace's pure-Python dependencies that its
# image may lack or hold at another version (CPython 3.12, x86-64), for
# memtrace alone (run.sh keeps them off the traced commands). PyTorch, JAX,
# CuPy, numpy and nvidia-ml-py are the image's own.
#   scripts/gpu/pack.sh        (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.devcarry
rm -rf "$out"; mkdir -p "$out/lib" "$out/whl"
lib=$(ls /usr/lib/x86_64-linux-gnu/libbpf.so.1.* | sort -V | tail -1)
cp "$lib" "$out/lib/libbpf.so.1"
pkgs=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | grep -i -E \
  '^(opentelemetry-[a-z-]+|pyelftools|pyroute2|googleapis-common-protos|protobuf|typer|click|rich|shellingham|markdown-it-py|mdurl|pygments)==' )
# shellcheck disable=SC2086
.venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$out/whl" $pkgs
du -sh "$out"
