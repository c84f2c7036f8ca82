/* A stand-in for a training step, for bench/targets/step_time.py on a machine
 * without a GPU: the CUDA calls of one step of the recorded PyTorch loop,
 * made through the test libcuda, with a simulated GPU behind them.
 *
 *   trainstep LIBCUDA STEPS LAUNCHES CPU_US GPU_US
 *
 * Each step: two host-to-device copies (a batch and its labels), LAUNCHES
 * kernel launches, each after CPU_US of framework work on the CPU and each
 * queueing GPU_US of work on a simulated GPU that runs beside the CPU, one
 * device-to-host copy (the loss) and a stream synchronize that waits for the
 * simulated GPU to finish. Prints {"median_step_s": S, "steps": N} on stderr,
 * as examples/torch_train.py does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*copy_fn)(unsigned long long, const void *, size_t, void *);
typedef int (*dtoh_fn)(void *, unsigned long long, size_t, void *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
			 void **);
typedef int (*sync_fn)(void *);

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void spin_until(double t)
{
	while (now_us() < t)
		;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: trainstep LIBCUDA STEPS LAUNCHES CPU_US GPU_US\n");
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "trainstep: %s\n", dlerror());
		return 3;
	}
	copy_fn htod = (copy_fn)dlsym(h, "cuMemcpyHtoDAsync_v2");
	dtoh_fn dtoh = (dtoh_fn)dlsym(h, "cuMemcpyDtoHAsync_v2");
	launch_fn launch = (launch_fn)dlsym(h, "cuLaunchKernel");
	sync_fn sync = (sync_fn)dlsym(h, "cuStreamSynchronize");
	int steps = atoi(argv[2]), launches = atoi(argv[3]);
	double cpu_us = atof(argv[4]), gpu_us = atof(argv[5]);
	double *times = calloc(steps, sizeof(double));
	static char batch[64 * 3 * 32 * 32 * 4], labels[64 * 8], loss[4];
	for (int s = 0; s < steps; s++) {
		double t0 = now_us(), gpu_free = t0;
		htod(0x7f0000000000ULL, batch, sizeof(batch), 0);
		htod(0x7f0000100000ULL, labels, sizeof(labels), 0);
		for (int k = 0; k < launches; k++) {
			spin_until(now_us() + cpu_us); /* the framework's work for this op */
			launch(0, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0);
			double t = now_us();
			gpu_free = (gpu_free > t ? gpu_free : t) + gpu_us;
		}
		dtoh(loss, 0x7f0000200000ULL, sizeof(loss), 0);
		sync(0);
		spin_until(gpu_free); /* the wait the synchronize stands for */
		times[s] = (now_us() - t0) / 1e6;
	}
	qsort(times + steps / 10, steps - steps / 10, sizeof(double), cmp); /* the first tenth is warm-up */
	fprintf(stderr, "{\"median_step_s\": %.9f, \"steps\": %d}\n", times[steps / 10 + (steps - steps / 10) / 2], steps);
	return 0;
}
