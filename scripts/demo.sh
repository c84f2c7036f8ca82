#!/usr/bin/env bash
# Set up memtrace and trace a workload, showing what it copied.
#   scripts/demo.sh      (as root; as a user it runs itself through sudo)
# With an NVIDIA GPU and PyTorch: a real PyTorch job. Without: a SIMULATED
# workload making copies through the test CUDA libraries (tests/fixtures),
# which export the real CUDA symbols but move no memory.
set -euo pipefail
# memtrace loads BPF programs: root, or sudo where there is one.
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "demo: memtrace needs root (it loads BPF programs): run this as root" >&2; exit 1; }
  exec sudo -E -H env "PATH=$PATH" "$0" "$@"
fi
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if command -v nvidia-smi >/dev/null 2>&1 && $PY -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  scripts/setup.sh
  echo "== memtrace run: a real PyTorch job on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  exec .venv/bin/memtrace run -- "$PY" examples/torch_copies.py
fi
scripts/setup.sh --demo
out=$(mktemp -d)
make -s -C tests/fixtures OUT="$out" >/dev/null
cat <<'EOF'
== No GPU here: a SIMULATED workload. The test CUDA libraries in tests/fixtures
== export the real libcudart/libcuda symbols with their real signatures, but
== they move no memory and take no time. The calls, bytes and memory kinds are
== real: memtrace must match the workload's own truth, printed after it. The
== durations and GB/s figures are not: no GPU moved those bytes (on a GPU they
== are the real ones).
== The "overhead" lines are real for these libraries but overstate CUDA's cost:
== the kernel single-steps a probe at their entry points, about ten times the
== cost of one at CUDA's, whose entries it emulates (docs/design/overhead.md).
EOF
WORKLOAD_TRUTH="$out/truth.jsonl" .venv/bin/memtrace run -- "$out/workload" -n 2000 -t 2 -f
echo "== ground truth (all processes together, as the workload counted them):"
.venv/bin/python - "$out/truth.jsonl" <<'PY'
import json, sys
from collections import defaultdict
t = defaultdict(lambda: [0, 0])
for line in open(sys.argv[1]):
    for c in json.loads(line)["copies"]:
        t[c["direction"]][0] += c["calls"]
        t[c["direction"]][1] += c["bytes"]
for d, (calls, nbytes) in sorted(t.items()):
    print(f"  {d:8} calls {calls:6,}  bytes {nbytes:,}")
PY
echo
cat <<'EOF'
== SIMULATED memory workload: pinned, registered, pageable and managed host
== memory, device allocations (some leaked), unified copies, waits and
== launches. memtrace tells pinned from pageable and resolves the unified
== copies from the pointers; the workload's own truth follows. Durations and
== GB/s are simulated here too.
EOF
WORKLOAD_TRUTH="$out/memtruth.jsonl" .venv/bin/memtrace run -- "$out/memwork" -r 40
echo "== ground truth (as the workload counted it):"
.venv/bin/python - "$out/memtruth.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)
    for c in t["copies"]:
        print(f"  {c['api']:14} {c['direction']:8} {c['host_memory'] or '-':9} calls {c['calls']:4}  bytes {c['bytes']:,}")
    m = t["device_memory"]
    print(f"  device memory: {m['allocations']} allocations ({m['failed_allocations']} failed),"
          f" {m['frees']} frees, {m['unknown_frees']} unknown frees,")
    print(f"    {m['in_use_bytes']:,} bytes in use in {m['outstanding']} allocations")
    print("  waits:")
    for k, v in t["sync"].items():
        print(f"    {k:22} {v}")
    print("  launches:", ", ".join(f"{k} {v}" for k, v in t["launches"].items()))
PY
