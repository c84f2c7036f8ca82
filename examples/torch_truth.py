"""PyTorch with its truth counted twice: by the script, and by CUPTI (the
PyTorch profiler), which sees every CUDA runtime and driver call the process
makes and every copy the GPU executes. For checking memtrace on a real GPU:

    memtrace run --stacks --format json -o out.json -- \\
        python3 examples/torch_truth.py TRUTH.json [TRACE.json.gz]

Copies: N pageable and N pinned H2D, N D2H, N D2D of 4 MiB, each from its own
function (so call sites can be checked by line). Launches: L small kernels, a
matrix product, a CUDA graph replayed G times. Waits: W device, stream and
event synchronisations. Memory: the caching allocator's own books
(torch.cuda.memory_stats) at the end. TRUTH.json gets the script's figures;
TRACE gets the profiler's chrome trace (runtime and driver calls by name,
GPU copies with their bytes and kind, Pinned or Pageable).
"""

import gzip
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

N, SIZE, L, G, W = 100, 4 << 20, 2000, 50, 50
SITES: dict[str, int] = {}


def site(name: str) -> None:
    """Remember the line of the caller's next line: the copy it makes."""
    SITES[name] = sys._getframe(1).f_lineno + 1


def upload_pageable(dst: torch.Tensor, src: torch.Tensor) -> None:
    site("upload_pageable")
    dst.copy_(src)


def upload_pinned(dst: torch.Tensor, src: torch.Tensor) -> None:
    site("upload_pinned")
    dst.copy_(src, non_blocking=True)


def download(dst: torch.Tensor, src: torch.Tensor) -> None:
    site("download")
    dst.copy_(src)


def device_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    site("device_copy")
    dst.copy_(src)


def main() -> None:
    dev = torch.device("cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        pageable = torch.empty(SIZE, dtype=torch.uint8)
        pinned = torch.empty(SIZE, dtype=torch.uint8).pin_memory()
        d1 = torch.empty(SIZE, dtype=torch.uint8, device=dev)
        d2 = torch.empty(SIZE, dtype=torch.uint8, device=dev)
        torch.cuda.synchronize()
        for _ in range(N):
            upload_pageable(d1, pageable)
        for _ in range(N):
            upload_pinned(d1, pinned)
        for _ in range(N):
            download(pageable, d1)
        for _ in range(N):
            device_copy(d2, d1)
        x = torch.ones(1024, device=dev)
        for _ in range(L):
            x.add_(1)
        a = torch.randn(512, 512, device=dev)
        (a @ a).sum()
        static = torch.zeros(1024, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static.add_(1)  # warm up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static.add_(1)
            static.mul_(2)
        for _ in range(G):
            graph.replay()
        for _ in range(W):
            torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        for _ in range(W):
            stream.synchronize()
        ev = torch.cuda.Event()
        for _ in range(W):
            ev.record()
            ev.synchronize()
        torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    truth = {
        "copies": {
            "h2d_pageable": {"calls": N, "bytes": N * SIZE},
            "h2d_pinned": {"calls": N, "bytes": N * SIZE},
            "d2h_pageable": {"calls": N, "bytes": N * SIZE},
            "d2d": {"calls": N, "bytes": N * SIZE},
        },
        "sites": SITES,
        "file": __file__,
        "explicit": {"small_kernels": L, "graph_replays": G, "device_syncs": W, "stream_syncs": W, "event_syncs": W},
        "memory": {
            "cuda_malloc_calls": stats.get("segment.all.allocated", 0),
            "cuda_free_calls": stats.get("segment.all.freed", 0),
            "reserved_bytes": stats.get("reserved_bytes.all.current", 0),
            "allocated_bytes": stats.get("allocated_bytes.all.current", 0),
        },
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(truth, f)
    if len(sys.argv) > 2:
        raw = sys.argv[2] + ".raw.json"
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as f, gzip.open(sys.argv[2], "wb") as g:
            g.write(f.read())


if __name__ == "__main__":
    main()
