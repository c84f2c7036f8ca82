#!/usr/bin/env bash
# A collector and a metrics backend on this machine, for trying `memtrace push`:
# the OpenTelemetry Collector of deploy/otelcol (built with ocb, as the
# end-to-end tests build it) forwarding to VictoriaMetrics. Both listen on
# 127.0.0.1 only. ^C stops both (SIGTERM too: a script that starts it in the
# background with `&` must use SIGTERM, since such a job ignores SIGINT).
#
#   scripts/local-backend.sh
#
# Then, in another terminal:
#   .venv/bin/memtrace push --endpoint http://127.0.0.1:4318      (as root)
#   curl -s http://127.0.0.1:8428/api/v1/query \
#     --data-urlencode 'query=sum by (direction) (gpu_memcpy_bytes_total)'
#
# The first run fetches VictoriaMetrics (Debian trixie's package, through this
# system's apt mirror) and builds the collector (Go 1.24 or newer, and the Go
# module proxy). Both are cached under ~/.cache/memtrace-backends (or
# $MEMTRACE_BACKEND_CACHE), the cache tests/backends.py uses.
#
# Ports: VM_PORT (8428), OTLP_HTTP_PORT (4318), OTLP_GRPC_PORT (4317),
# HEALTH_PORT (13133). DATA=DIR keeps the data and the logs in DIR (default:
# a temporary folder, removed on exit).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
CACHE=${MEMTRACE_BACKEND_CACHE:-$HOME/.cache/memtrace-backends}
VM_PORT=${VM_PORT:-8428}
OTLP_HTTP_PORT=${OTLP_HTTP_PORT:-4318}
OTLP_GRPC_PORT=${OTLP_GRPC_PORT:-4317}
HEALTH_PORT=${HEALTH_PORT:-13133}
say() { echo "local-backend: $*" >&2; }

# VictoriaMetrics: the tests' fetch script, into the tests' cache.
vm=$CACHE/victoria-metrics/victoria-metrics
[ -x "$vm" ] || { say "fetching VictoriaMetrics"; tests/backends/fetch-victoria-metrics.sh "$CACHE/victoria-metrics" >&2; }

# The collector: built once per builder manifest, keyed by its hash as tests/backends.py keys it.
builder=deploy/otelcol/builder.yaml
digest=$(sha256sum "$builder" | cut -c1-12)
otelcol=$CACHE/otelcol-$digest/otelcol-memtrace
if [ ! -x "$otelcol" ]; then
  command -v go >/dev/null || { say "Go 1.24 or newer is needed to build the collector once (ocb)"; exit 1; }
  version=$(grep -m1 -E '^\s*version:' "$builder" | awk '{print $2}')
  say "building the collector with ocb v$version (once; a few minutes)"
  export GOBIN=$CACHE/gobin GOFLAGS=-mod=mod
  go install "go.opentelemetry.io/collector/cmd/builder@v$version"
  work=$(mktemp -d)
  cp "$builder" "$work/builder.yaml"
  (cd "$work" && "$GOBIN/builder" --config builder.yaml >"$work/build.log" 2>&1) \
    || { say "the collector build failed: $work/build.log"; exit 1; }
  mkdir -p "$(dirname "$otelcol")"
  mv "$work/_build/otelcol-memtrace" "$otelcol"
  rm -rf "$work"
fi

own_data=0
if [ -z "${DATA:-}" ]; then DATA=$(mktemp -d); own_data=1; fi
mkdir -p "$DATA"
pids=()
stop() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ $own_data = 1 ]; then rm -rf "$DATA"; fi
  say "stopped"
}
trap stop EXIT
trap 'exit 0' INT TERM

wait_port() {  # PORT PID NAME LOG
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { say "$3 exited; its log ($4):"; tail -20 "$4" >&2; exit 1; }
    sleep 0.1
  done
  say "$3 is not listening on 127.0.0.1:$1 after 30 s; its log: $4"; exit 1
}

# -search.latencyOffset=0s: a sample can be queried as soon as it arrives
# (the default, 30 s, leaves the first queries after a push empty).
"$vm" -storageDataPath="$DATA/vm" -httpListenAddr="127.0.0.1:$VM_PORT" \
  -opentelemetry.usePrometheusNaming -search.latencyOffset=0s >"$DATA/vm.log" 2>&1 &
pids+=($!)
wait_port "$VM_PORT" "${pids[-1]}" VictoriaMetrics "$DATA/vm.log"

# deploy/otelcol/agent.yaml, as the DaemonSet runs it, with VictoriaMetrics as
# its metrics backend. Its logs and profiles pipelines point at their defaults
# (VictoriaLogs on :9428, Pyroscope on :4040); with nothing there, the
# collector logs what it could not deliver.
MEMTRACE_EXPORT_ENDPOINT="http://127.0.0.1:$VM_PORT/opentelemetry" \
OTLP_HTTP_ENDPOINT="127.0.0.1:$OTLP_HTTP_PORT" OTLP_GRPC_ENDPOINT="127.0.0.1:$OTLP_GRPC_PORT" \
HEALTH_ENDPOINT="127.0.0.1:$HEALTH_PORT" \
  "$otelcol" --config "$repo/deploy/otelcol/agent.yaml" --feature-gates=service.profilesSupport \
  >"$DATA/otelcol.log" 2>&1 &
pids+=($!)
wait_port "$OTLP_HTTP_PORT" "${pids[-1]}" "the collector" "$DATA/otelcol.log"

cat >&2 <<EOF
local-backend: up (data and logs in $DATA)
  collector        OTLP/HTTP 127.0.0.1:$OTLP_HTTP_PORT, OTLP/gRPC 127.0.0.1:$OTLP_GRPC_PORT
  VictoriaMetrics  http://127.0.0.1:$VM_PORT (PromQL: /api/v1/query)
push:  .venv/bin/memtrace push --endpoint http://127.0.0.1:$OTLP_HTTP_PORT  (as root)
query: curl -s http://127.0.0.1:$VM_PORT/api/v1/query \\
         --data-urlencode 'query=sum by (direction) (gpu_memcpy_bytes_total)'
^C stops both (or kill $$).
EOF
wait -n "${pids[@]}" || true
say "a backend exited; logs in $DATA"
own_data=0
exit 1
