/* Calls the test CUDA runtime from DEPTH frames down (frame pointers on),
 * in a tight loop, and prints the ns per call.
 *
 *   stackloop copy|alloc CALLS DEPTH
 *
 * copy: cudaMemcpy of 256 bytes host to device; alloc: cudaMalloc of 256
 * bytes and its cudaFree (the pair's time).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int cudaError_t;
cudaError_t cudaMemcpy(void *, const void *, size_t, int);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);

static volatile int sink;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

__attribute__((noinline)) static double loop(int alloc, long calls)
{
	static char host[256];
	void *dev = NULL;
	double t0;

	cudaMalloc(&dev, sizeof(host));
	t0 = now();
	for (long i = 0; i < calls; i++) {
		if (alloc) {
			void *p = NULL;
			sink += cudaMalloc(&p, sizeof(host));
			sink += cudaFree(p);
		} else {
			sink += cudaMemcpy(dev, host, sizeof(host), 1);
		}
	}
	return (now() - t0) / calls;
}

__attribute__((noinline)) static double descend(int depth, int alloc, long calls)
{
	double r;

	if (depth <= 0)
		return loop(alloc, calls);
	r = descend(depth - 1, alloc, calls);
	sink++;
	return r;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	printf("%.1f\n", descend(atoi(argv[3]), !strcmp(argv[1], "alloc"), atol(argv[2])));
	return 0;
}
