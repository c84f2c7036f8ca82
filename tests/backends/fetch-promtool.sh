#!/usr/bin/env bash
# Fetch promtool (Prometheus's rule checker and rule unit tester) from this
# system's own Debian `prometheus` package, without installing it (the
# package would also install and start a Prometheus server):
#   tests/backends/fetch-promtool.sh DEST     -> DEST/promtool
set -euo pipefail
dest=$1
[ -x "$dest/promtool" ] && exit 0
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/archives/partial"
cd "$work"
if ! apt-get download -q prometheus >/dev/null 2>&1; then
  apt-get update -qq
  apt-get download -q prometheus >/dev/null
fi
dpkg-deb -x prometheus_*.deb x
mkdir -p "$dest"
cp x/usr/bin/promtool "$dest/promtool"
"$dest/promtool" --version | head -1
