#!/usr/bin/env bash
# Set up memtrace and trace a workload, showing what it copied.
#   sudo scripts/demo.sh
# With an NVIDIA GPU and PyTorch: a real PyTorch job. Without: a SIMULATED
# workload making copies through the test CUDA libraries (tests/fixtures),
# which export the real CUDA symbols but move no memory.
set -euo pipefail
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
echo "== No GPU here: SIMULATED workload. The test CUDA libraries in tests/fixtures"
echo "== export the real libcudart/libcuda copy symbols but move no memory."
echo "== The workload's own ground truth follows memtrace's summary."
WORKLOAD_TRUTH="$out/truth.jsonl" .venv/bin/memtrace run -- "$out/workload" -n 2000 -t 2 -f
echo "== ground truth (per process, as the workload counted it):"
.venv/bin/python - "$out/truth.jsonl" <<'PY'
import json, sys
from collections import defaultdict
t = defaultdict(lambda: [0, 0])
for line in open(sys.argv[1]):
    for c in json.loads(line)["copies"]:
        t[c["direction"]][0] += c["calls"]
        t[c["direction"]][1] += c["bytes"]
for d, (calls, nbytes) in sorted(t.items()):
    print(f"  {d:8} calls {calls:6}  bytes {nbytes:,}")
PY
echo
echo "== SIMULATED memory workload: pinned, registered, pageable and managed host"
echo "== memory, device allocations (some leaked), unified copies, waits and"
echo "== launches. memtrace tells pinned from pageable and resolves the unified"
echo "== copies from the pointers; the workload's own truth follows."
WORKLOAD_TRUTH="$out/memtruth.jsonl" .venv/bin/memtrace run -- "$out/memwork" -r 40
echo "== ground truth (as the workload counted it):"
.venv/bin/python - "$out/memtruth.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)
    for c in t["copies"]:
        print(f"  {c['api']:14} {c['direction']:8} {c['host_memory'] or '-':9} calls {c['calls']:4}  bytes {c['bytes']:,}")
    print("  device memory:", t["device_memory"])
    print("  waits:", t["sync"], " launches:", t["launches"])
PY
