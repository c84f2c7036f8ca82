"""A training-like Python loop that calls a CUDA runtime through ctypes:
a data loader that collates batches in pageable memory and copies them to
the device, a model whose layers allocate activations, a periodic
checkpoint copied back. For `memtrace profile` without PyTorch: with the
test runtime (tests/fixtures, `make -C tests/fixtures OUT=DIR`) no memory
moves, so its sizes cost nothing.

    python examples/ctypes_train.py DIR/lib/libcudart.so.13 [STEPS]
"""

import ctypes
import sys

H2D, D2H, MIB = 1, 2, 1 << 20


class Runtime:
    def __init__(self, path: str) -> None:
        self.rt = ctypes.CDLL(path)
        vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        self.rt.cudaMemcpy.argtypes = [vp, vp, sz, ci]
        self.rt.cudaMalloc.argtypes = [ctypes.POINTER(vp), sz]
        self.rt.cudaFree.argtypes = [vp]
        self.host = ctypes.create_string_buffer(64)  # pageable; the test runtime reads none of it

    def copy(self, n: int, kind: int) -> None:
        self.rt.cudaMemcpy(self.host, self.host, n, kind)

    def malloc(self, n: int) -> ctypes.c_void_p:
        p = ctypes.c_void_p()
        self.rt.cudaMalloc(ctypes.byref(p), n)
        return p


class Loader:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def collate(self, step: int) -> None:
        self.rt.copy(8 * MIB, H2D)  # images
        self.rt.copy(MIB // 4, H2D)  # labels

    def __iter__(self):
        step = 0
        while True:
            self.collate(step)
            yield step
            step += 1


class Layer:
    def __init__(self, rt: Runtime, size: int) -> None:
        self.rt, self.size = rt, size
        self.weights = rt.malloc(size)

    def forward(self) -> ctypes.c_void_p:
        return self.rt.malloc(self.size // 2)  # activations


def train(rt: Runtime, steps: int) -> None:
    model = [Layer(rt, (4 << i) * MIB) for i in range(3)]
    activations = []
    for step in Loader(rt):
        if step >= steps:
            break
        for layer in model:
            activations.append(layer.forward())
        for a in activations:
            rt.rt.cudaFree(a)
        activations.clear()
        if step % 10 == 9:
            save_checkpoint(rt, model)


def save_checkpoint(rt: Runtime, model: list) -> None:
    for layer in model:
        rt.copy(layer.size, D2H)


if __name__ == "__main__":
    train(Runtime(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 50)
