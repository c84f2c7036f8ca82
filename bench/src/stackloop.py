"""Calls the test CUDA runtime through ctypes from DEPTH Python frames
down, in a loop, and prints the ns per call (the Python twin of
stackloop.c, for bench/targets/stack_cost.py --python).

    python stackloop.py copy|alloc CALLS DEPTH [THREADS]

THREADS idle Python threads are started first (default 0): the
interpreter lists its threads newest first, so the looping main thread
comes after all of them, as a training script's main thread comes after
the threads its libraries start.

The runtime is found as libcudart.so.13 on LD_LIBRARY_PATH.
"""

import ctypes
import sys
import threading
import time


def main() -> None:
    kind, calls, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    done = threading.Event()
    for _ in range(threads):
        threading.Thread(target=done.wait, daemon=True).start()
    rt = ctypes.CDLL("libcudart.so.13")
    vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    rt.cudaMemcpy.argtypes = [vp, vp, sz, ci]
    rt.cudaMalloc.argtypes = [ctypes.POINTER(vp), sz]
    rt.cudaFree.argtypes = [vp]
    host = ctypes.create_string_buffer(256)
    dev = vp()
    rt.cudaMalloc(ctypes.byref(dev), 256)

    def loop() -> float:
        t0 = time.perf_counter_ns()
        if kind == "alloc":
            p = vp()
            for _ in range(calls):
                rt.cudaMalloc(ctypes.byref(p), 256)
                rt.cudaFree(p)
        else:
            for _ in range(calls):
                rt.cudaMemcpy(dev, host, 256, 1)
        return (time.perf_counter_ns() - t0) / calls

    def down(k: int) -> float:
        return down(k - 1) if k > 0 else loop()

    print(f"{down(depth):.1f}")
    done.set()


main()
