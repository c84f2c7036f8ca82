/* The traced side of bench/targets/probe_cost.py: calls three libcuda entry points
 * in a tight loop, one kind at a time, and prints nanoseconds per call.
 *
 *   callloop LIBCUDA N
 *
 * Pinned to one CPU. For each line read on stdin it runs N calls of each
 * kind and prints "copy NS launch NS sync NS": cuMemcpyHtoDAsync_v2 (a copy:
 * entry and return probes), cuLaunchKernel (a launch: an entry probe) and
 * cuStreamSynchronize (a wait: entry and return probes).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*copy_fn)(unsigned long long, const void *, size_t, void *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
			 void **);
typedef int (*sync_fn)(void *);

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(1, &set);
	sched_setaffinity(0, sizeof(set), &set);
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h)
		return 3;
	copy_fn copy = (copy_fn)dlsym(h, "cuMemcpyHtoDAsync_v2");
	launch_fn launch = (launch_fn)dlsym(h, "cuLaunchKernel");
	sync_fn sync = (sync_fn)dlsym(h, "cuStreamSynchronize");
	long n = atol(argv[2]);
	static char buf[64];
	char line[64];
	printf("ready\n");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		double t0 = now();
		for (long i = 0; i < n; i++)
			copy(0x7f0000000000ULL, buf, 4, 0);
		double t1 = now();
		for (long i = 0; i < n; i++)
			launch(0, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0);
		double t2 = now();
		for (long i = 0; i < n; i++)
			sync(0);
		double t3 = now();
		printf("copy %.1f launch %.1f sync %.1f\n", (t1 - t0) / n, (t2 - t1) / n, (t3 - t2) / n);
		fflush(stdout);
	}
	return 0;
}
