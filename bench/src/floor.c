/* The floor of the agent's host sampling: a bare sampler doing what
 * memtrace's C sampler does each tick (memtrace/native/fastsample.c), and
 * nothing else: a wake on an absolute 100 Hz timer, one RTM_GETSTATS dump
 * of every interface's rtnl_link_stats64 (an 8 KiB receive buffer, as the
 * sampler's), and, where an NVML library is given, the clock-event reasons
 * of each GPU every tick and its utilisation every tenth tick (the
 * sampler's MT_UTIL_HZ). No folding, no Python, no BPF.
 *
 * usage: floor SECONDS [LIBNVIDIA_ML]
 * Prints one line: ticks, late ticks, NIC messages, NVML calls and failures. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HZ 100
#define UTIL_EVERY 10
#define MAX_GPU 64

static char buf[8 * 1024];
static unsigned long long messages;

static int dump(int fd)
{
	struct {
		struct nlmsghdr h;
		struct if_stats_msg m;
	} req = {0};
	static unsigned int seq;

	req.h.nlmsg_len = sizeof(req);
	req.h.nlmsg_type = RTM_GETSTATS;
	req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	req.h.nlmsg_seq = ++seq;
	req.m.filter_mask = IFLA_STATS_FILTER_BIT(IFLA_STATS_LINK_64);
	if (send(fd, &req, sizeof(req), 0) < 0)
		return -1;
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);

		if (n <= 0)
			return -1;
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (unsigned int)n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type == NLMSG_DONE)
				return 0;
			if (h->nlmsg_type == NLMSG_ERROR)
				return -1;
			messages++;
		}
	}
}

typedef int (*nvml_init_t)(void);
typedef int (*nvml_count_t)(unsigned int *);
typedef int (*nvml_handle_t)(unsigned int, void **);
typedef int (*nvml_reasons_t)(void *, unsigned long long *);
typedef int (*nvml_util_t)(void *, unsigned int *);

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	double seconds = atof(argv[1]);
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	struct sockaddr_nl sa = {.nl_family = AF_NETLINK};

	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)))
		return 1;
	nvml_reasons_t reasons = NULL;
	nvml_util_t util = NULL;
	void *gpus[MAX_GPU];
	unsigned int ngpu = 0;

	if (argc > 2) {
		void *lib = dlopen(argv[2], RTLD_NOW);
		nvml_init_t init = lib ? (nvml_init_t)dlsym(lib, "nvmlInit_v2") : NULL;
		nvml_count_t count = lib ? (nvml_count_t)dlsym(lib, "nvmlDeviceGetCount_v2") : NULL;
		nvml_handle_t handle = lib ? (nvml_handle_t)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2") : NULL;

		reasons = lib ? (nvml_reasons_t)dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons") : NULL;
		if (lib && !reasons)
			reasons = (nvml_reasons_t)dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
		util = lib ? (nvml_util_t)dlsym(lib, "nvmlDeviceGetUtilizationRates") : NULL;
		if (!init || !count || !handle || !reasons || !util || init() || count(&ngpu)) {
			fprintf(stderr, "floor: NVML at %s not usable\n", argv[2]);
			return 1;
		}
		if (ngpu > MAX_GPU)
			ngpu = MAX_GPU;
		for (unsigned int i = 0; i < ngpu; i++)
			if (handle(i, &gpus[i]))
				return 1;
	}
	struct timespec next;
	unsigned long long ticks = 0, late = 0, calls = 0, failed = 0, total = (unsigned long long)(seconds * HZ);

	clock_gettime(CLOCK_MONOTONIC, &next);
	while (ticks < total) {
		next.tv_nsec += 1000000000L / HZ;
		if (next.tv_nsec >= 1000000000L)
			next.tv_sec++, next.tv_nsec -= 1000000000L;
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
		struct timespec now;

		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - next.tv_sec) * 1000000000LL + (now.tv_nsec - next.tv_nsec) > 1000000000LL / HZ)
			late++;
		ticks++;
		if (dump(fd))
			failed++;
		for (unsigned int i = 0; i < ngpu; i++) {
			unsigned long long mask;
			unsigned int u[2];

			failed += reasons(gpus[i], &mask) != 0;
			calls++;
			if (ticks % UTIL_EVERY == 0) {
				failed += util(gpus[i], u) != 0;
				calls++;
			}
		}
	}
	printf("ticks %llu late %llu nic_messages %llu nvml_calls %llu failures %llu\n", ticks, late, messages, calls,
	       failed);
	return 0;
}
