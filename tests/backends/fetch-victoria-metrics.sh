#!/usr/bin/env bash
# Fetch VictoriaMetrics (an OTLP-capable, Prometheus-compatible backend) from
# Debian trixie's `victoria-metrics` package, without installing it:
#   tests/backends/fetch-victoria-metrics.sh DEST     -> DEST/victoria-metrics
# The mirror is the one this system's apt already uses for Debian.
set -euo pipefail
dest=$1
[ -x "$dest/victoria-metrics" ] && exit 0
mirror=$(grep -hoE '^URIs: *\S+/debian$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$mirror" ] || mirror=$(grep -hoE '^deb +\S+/debian +' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$mirror" ] || { echo "no Debian mirror found in the apt sources" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
echo "deb $mirror trixie main" > "$work/sources.list"
o=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
   -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives" -o APT::Sandbox::User=root)
apt-get "${o[@]}" update -qq
(cd "$work" && apt-get "${o[@]}" download -q victoria-metrics >/dev/null)
dpkg-deb -x "$work"/victoria-metrics_*.deb "$work/x"
mkdir -p "$dest"
cp "$work/x/usr/bin/victoria-metrics" "$dest/victoria-metrics"
"$dest/victoria-metrics" -version
