/* Two processes on one CPU passing a byte back and forth over two pipes:
 * every round trip is two context switches and two wakeups. Prints both
 * pids, waits for a byte on stdin (so the benchmark can trace them first),
 * then prints the wall time of N round trips in ns. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	int cpu = argc > 2 ? atoi(argv[2]) : 0;
	int ab[2], ba[2];
	cpu_set_t set;
	char c = 'x';
	pid_t child;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) || pipe(ab) || pipe(ba))
		return 1;
	child = fork();
	if (child == 0) {
		for (long i = 0; i < n; i++)
			if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1)
				return 1;
		return 0;
	}
	printf("%d %d\n", getpid(), child);
	fflush(stdout);
	if (read(0, &c, 1) != 1)
		return 1;
	long long t0 = now_ns();
	for (long i = 0; i < n; i++)
		if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1)
			return 1;
	long long t1 = now_ns();
	waitpid(child, NULL, 0);
	printf("%lld\n", t1 - t0);
	return 0;
}
