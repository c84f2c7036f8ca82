/* The floor of reading a namespace's NIC counters 100 times a second, as
 * the C sampler does (memtrace/native/fastsample.c): a timer wake every
 * 10 ms and then, by variant, nothing (the wake alone), one RTM_GETSTATS
 * dump of every interface's rtnl_link_stats64 (the sampler's read; with a
 * 64 KiB receive buffer and an 8 KiB one, which sizes the kernel's reply
 * buffer), or one read of /proc/self/net/dev kept open (the text
 * alternative). Rounds alternate the variants; each prints the thread's
 * CPU as a share of one core and per tick.
 * usage: nicread SECONDS ROUNDS */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static char buf[65536];
static unsigned long long sink;

static int dump(int fd, int room)
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
		int n = recv(fd, buf, room, 0);

		if (n <= 0)
			return -1;
		for (struct nlmsghdr *h = (void *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR)
				return 0;
			sink += h->nlmsg_len;
		}
	}
}

static int procnet(int fd)
{
	int n = pread(fd, buf, sizeof(buf) - 1, 0);
	char *p;

	if (n <= 0)
		return -1;
	buf[n] = 0;
	p = strchr(buf, '\n'); /* two header lines */
	p = p ? strchr(p + 1, '\n') : NULL;
	while (p && *++p) {
		char *q = strchr(p, ':');

		if (!q)
			break;
		q++;
		for (int i = 0; i < 16; i++)
			sink += strtoull(q, &q, 10);
		p = strchr(q, '\n');
	}
	return 0;
}

static double cpu_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	static const char *names[] = {"wake alone", "netlink 64k", "netlink 8k", "/proc/net/dev"};
	int secs = argc > 1 ? atoi(argv[1]) : 8, rounds = argc > 2 ? atoi(argv[2]) : 3;
	int nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	int pf = open("/proc/self/net/dev", O_RDONLY | O_CLOEXEC);

	if (nl < 0 || pf < 0 || secs <= 0) {
		perror("nicread");
		return 1;
	}
	for (int r = 0; r < rounds; r++)
		for (int k = 0; k < 4; k++) {
			int v = (k + r) % 4, ticks = secs * 100;
			struct timespec next;
			double c0 = cpu_s(), c;

			clock_gettime(CLOCK_MONOTONIC, &next);
			for (int i = 0; i < ticks; i++) {
				next.tv_nsec += 10000000;
				if (next.tv_nsec >= 1000000000) {
					next.tv_nsec -= 1000000000;
					next.tv_sec++;
				}
				clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
				if ((v == 1 && dump(nl, 65536)) || (v == 2 && dump(nl, 8192)) || (v == 3 && procnet(pf))) {
					perror(names[v]);
					return 1;
				}
			}
			c = cpu_s() - c0;
			printf("%d\t%s\t%.4f\t%.1f\n", r + 1, names[v], c / secs * 100, c / ticks * 1e6);
			fflush(stdout);
		}
	return 0;
}
