// A plain CUDA program (nvcc links cudart statically by default) with known copies.
//   nvcc -o cuda_copies examples/cuda_copies.cu && memtrace run -- ./cuda_copies
#include <cstdio>
#include <cuda_runtime.h>
int main() {
  const int N = 300; const size_t SIZE = 1 << 20;
  char *h = (char *)malloc(SIZE), *d1, *d2;
  cudaMalloc(&d1, SIZE); cudaMalloc(&d2, SIZE);
  for (int i = 0; i < N; i++) cudaMemcpy(d1, h, SIZE, cudaMemcpyHostToDevice);
  for (int i = 0; i < N; i++) cudaMemcpy(h, d1, SIZE, cudaMemcpyDeviceToHost);
  for (int i = 0; i < N; i++) cudaMemcpy(d2, d1, SIZE, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  fprintf(stderr, "{\"truth\": {\"h2d\": {\"calls\": %d, \"bytes\": %zu}, \"d2h\": {\"calls\": %d, \"bytes\": %zu}, "
          "\"d2d\": {\"calls\": %d, \"bytes\": %zu}}}\n", N, N * SIZE, N, N * SIZE, N, N * SIZE);
  return 0;
}
