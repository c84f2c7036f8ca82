// SPDX-License-Identifier: Apache-2.0
/*
 * memtrace's fast host sampler: the readings that are instantaneous (NIC
 * counters for their per-tick rates, NVML utilisation and clock-event
 * reasons) taken on a thread of its own at 100 Hz or more, outside Python,
 * and folded into one row per interface and per GPU until the agent takes
 * them (memtrace/sources/fastsample.py, through ctypes, at its own slower
 * rate). What is cumulative or queued (counters' totals, XIDs, qdisc drops)
 * loses nothing at the slower rate and stays in Python.
 *
 * The agent keeps everything that needs a decision in Python: which
 * namespaces are sampled (it hands over a netlink socket opened inside each
 * one, by pyroute2), which GPUs (NVML handles from nvidia-ml-py, whose
 * library handle it passes so the same libnvidia-ml is called), which
 * reasons count as throttling. This file only reads and folds.
 *
 * Never harmful to the agent: the thread blocks every signal, a netlink or
 * NVML failure is counted in its row and the thread goes on, a tick that
 * comes late is skipped and counted, never made up.
 *
 * Built by setuptools as the extension module memtrace._fastsample (an
 * empty module: the functions below are reached through ctypes, as libbpf
 * is). Without a C compiler the package installs without it and samples
 * in Python at the slower rate.
 */
#define _GNU_SOURCE
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MT_MAX_NS 64
#define MT_MAX_IF 4096
#define MT_MAX_GPU 64
/* The receive buffer of a dump. The kernel sizes each reply buffer of a dump from the largest
 * buffer its reader has passed (up to 32 KiB; this socket is the sampler's alone): at 64 KiB every
 * tick paid a 32 KiB allocation (docs/design/evidence.md#wake-cost). A reply holds as many interfaces' messages (about 200 bytes each) as fit;
 * the next recv takes the rest. */
#define MT_RECV_BYTES (8 * 1024)
#define MT_NVML_SUCCESS 0
#define MT_NVML_NOT_SUPPORTED 3
#define MT_NVML_FUNCTION_NOT_FOUND 13
#define MT_UTIL_HZ 10 /* the most often utilisation is worth reading */
#define MT_MAX_WATCH 2 /* rings watched: the agent's events ring and its control ring */

/* One interface's readings since the last take. The counters are the first
 * eight of rtnl_link_stats64 (rx/tx packets, rx/tx bytes, rx/tx errors,
 * rx/tx dropped) at the last tick; the peaks are the busiest tick's rates. */
struct mt_if_row {
	uint64_t netns;
	int32_t ifindex;
	uint32_t ticks;  /* ticks that read it since the last take */
	uint64_t time_ns; /* CLOCK_MONOTONIC of the last reading */
	uint64_t counters[8];
	double peak_rx_bytes_per_s;
	double peak_tx_bytes_per_s;
};

/* One GPU's readings since the last take. */
struct mt_gpu_row {
	uint32_t slot;  /* the order the agent gave the handles in */
	uint32_t ticks;
	uint32_t util_ticks; /* ticks with a utilisation reading */
	uint32_t clock_ticks; /* ticks with a clock-event reading */
	uint32_t throttled_ticks; /* ... with a throttling reason set */
	uint32_t sm_max, mem_max, sm_last, mem_last;
	int32_t last_error; /* the last NVML error other than not-supported, 0 if none */
	uint64_t sm_sum, mem_sum;
	uint64_t mask_or; /* every reason seen */
	uint64_t mask_last;
	uint64_t time_ns;
	uint32_t errors; /* failed readings (not-supported excepted) */
	uint32_t pad;
};

struct mt_stats {
	uint64_t ticks;
	uint64_t late; /* ticks skipped because the thread woke after the next was due */
	uint64_t net_errors;
	uint64_t cpu_ns; /* the sampling thread's own CPU time, read when taken */
	int32_t last_errno;
	uint32_t interfaces_dropped; /* readings of interfaces past MT_MAX_IF */
	uint64_t ring_wakes; /* times a watched ring's reader was woken */
};

typedef struct {
	unsigned int gpu, memory;
} mt_nvml_util;
typedef int (*mt_util_fn)(void *, mt_nvml_util *);
typedef int (*mt_mask_fn)(void *, unsigned long long *);

struct mt_ns {
	uint64_t inode;
	int fd;
	uint32_t seq;
};

struct mt_fast {
	pthread_mutex_t lock; /* the rows and stats: held for copies only */
	pthread_mutex_t cfg; /* the namespace and GPU lists: held by the thread over a tick */
	pthread_t thread;
	int running;
	volatile int stop;
	uint64_t period_ns;
	uint64_t throttle_mask;
	struct mt_ns ns[MT_MAX_NS];
	int n_ns;
	struct mt_if_row ifs[MT_MAX_IF];
	int n_if;
	void *gpus[MT_MAX_GPU];
	struct mt_gpu_row gpu_rows[MT_MAX_GPU];
	int n_gpu;
	mt_util_fn util_fn;
	uint32_t util_every;
	uint32_t read_every; /* the NICs and GPUs read every read_every-th tick (the rings watched every tick) */
	mt_mask_fn mask_fn;
	mt_mask_fn mask_old_fn;
	struct mt_stats stats;
	/* The agent's rings, watched each tick (mt_fast_watch_ring). */
	struct mt_watch {
		const uint64_t *cons, *prod;
		uint64_t bytes;
		int fd; /* an eventfd (ours, dup'ed); meaningful while cons is set */
	} watch[MT_MAX_WATCH];
	clockid_t cpu_clock;
	int clock_ready; /* cpu_clock is the thread's, and the thread is alive (under lock) */
	unsigned char buf[MT_RECV_BYTES];
};

static uint64_t now_ns(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct mt_if_row *if_row(struct mt_fast *f, uint64_t netns, int32_t ifindex)
{
	for (int i = 0; i < f->n_if; i++)
		if (f->ifs[i].ifindex == ifindex && f->ifs[i].netns == netns)
			return &f->ifs[i];
	if (f->n_if >= MT_MAX_IF) {
		f->stats.interfaces_dropped++;
		return NULL;
	}
	struct mt_if_row *r = &f->ifs[f->n_if++];
	memset(r, 0, sizeof(*r));
	r->netns = netns;
	r->ifindex = ifindex;
	return r;
}

static double rate(uint64_t now, uint64_t before, uint64_t dt_ns)
{
	return now >= before ? (double)(now - before) * 1e9 / (double)dt_ns : 0.0; /* a reset counts from zero */
}

/* Fold one rtnl_link_stats64 reading in, under the lock. */
static void fold_if(struct mt_fast *f, uint64_t netns, int32_t ifindex, const uint64_t *c, uint64_t t)
{
	struct mt_if_row *r = if_row(f, netns, ifindex);
	if (r == NULL)
		return;
	if (r->time_ns && t > r->time_ns) {
		uint64_t dt = t - r->time_ns;
		double rx = rate(c[2], r->counters[2], dt), tx = rate(c[3], r->counters[3], dt);
		if (rx > r->peak_rx_bytes_per_s)
			r->peak_rx_bytes_per_s = rx;
		if (tx > r->peak_tx_bytes_per_s)
			r->peak_tx_bytes_per_s = tx;
	}
	memcpy(r->counters, c, sizeof(r->counters));
	r->time_ns = t;
	r->ticks++;
}

/* Forget the interfaces of a namespace that a whole dump begun at t0 did not list: they are gone. */
static void drop_gone(struct mt_fast *f, uint64_t netns, uint64_t t0)
{
	pthread_mutex_lock(&f->lock);
	int k = 0;
	for (int i = 0; i < f->n_if; i++)
		if (f->ifs[i].netns != netns || f->ifs[i].time_ns >= t0)
			f->ifs[k++] = f->ifs[i];
	f->n_if = k;
	pthread_mutex_unlock(&f->lock);
}

/* One RTM_GETSTATS dump of a namespace, folded as it is read. 0 or an errno. */
static int read_ns(struct mt_fast *f, struct mt_ns *ns)
{
	struct {
		struct nlmsghdr h;
		struct if_stats_msg m;
	} req;
	memset(&req, 0, sizeof(req));
	req.h.nlmsg_len = sizeof(req);
	req.h.nlmsg_type = RTM_GETSTATS;
	req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	req.h.nlmsg_seq = ++ns->seq;
	req.m.family = AF_UNSPEC;
	req.m.filter_mask = IFLA_STATS_FILTER_BIT(IFLA_STATS_LINK_64);
	uint64_t t0 = now_ns(CLOCK_MONOTONIC);
	if (send(ns->fd, &req, sizeof(req), 0) < 0)
		return errno;
	for (;;) {
		ssize_t n = recv(ns->fd, f->buf, sizeof(f->buf), MSG_TRUNC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		if ((size_t)n > sizeof(f->buf))
			return EMSGSIZE; /* a reply larger than the buffer: its rest is lost (counted, never misread) */
		uint64_t t = now_ns(CLOCK_MONOTONIC);
		int len = (int)n;
		for (struct nlmsghdr *h = (struct nlmsghdr *)f->buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
			if (h->nlmsg_seq != ns->seq)
				continue; /* a late answer to an earlier request */
			if (h->nlmsg_type == NLMSG_DONE) {
				drop_gone(f, ns->inode, t0);
				return 0;
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				struct nlmsgerr *e = NLMSG_DATA(h);
				return h->nlmsg_len >= NLMSG_LENGTH(sizeof(*e)) && e->error ? -e->error : 0;
			}
			if (h->nlmsg_type != RTM_NEWSTATS || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct if_stats_msg)))
				continue;
			struct if_stats_msg *m = NLMSG_DATA(h);
			int alen = (int)h->nlmsg_len - (int)NLMSG_LENGTH(sizeof(*m));
			struct rtattr *a = (struct rtattr *)((char *)m + NLMSG_ALIGN(sizeof(*m)));
			for (; RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
				if (a->rta_type != IFLA_STATS_LINK_64 || RTA_PAYLOAD(a) < 8 * sizeof(uint64_t))
					continue;
				uint64_t c[8];
				memcpy(c, RTA_DATA(a), sizeof(c));
				pthread_mutex_lock(&f->lock);
				fold_if(f, ns->inode, (int32_t)m->ifindex, c, t);
				pthread_mutex_unlock(&f->lock);
			}
		}
	}
}

static void read_gpu(struct mt_fast *f, int i, uint64_t t)
{
	mt_nvml_util u;
	unsigned long long mask = 0;
	/* Utilisation is the share of NVML's own sample period (1/6 s to 1 s) that kernels ran: read every
	 * util_every-th tick (10 Hz), more would read the same value again; at every read where reads are
	 * sparser (read_every). Clock events are instantaneous. */
	int read_util = f->util_fn && (f->read_every > 1 || f->stats.ticks % f->util_every == 0);
	int ru = read_util ? f->util_fn(f->gpus[i], &u) : MT_NVML_NOT_SUPPORTED;
	int rm = MT_NVML_NOT_SUPPORTED;
	if (f->mask_fn) {
		rm = f->mask_fn(f->gpus[i], &mask);
		if (rm == MT_NVML_FUNCTION_NOT_FOUND) /* a driver older than 535: the older name */
			f->mask_fn = NULL;
	}
	if (!f->mask_fn && f->mask_old_fn)
		rm = f->mask_old_fn(f->gpus[i], &mask);
	pthread_mutex_lock(&f->lock);
	struct mt_gpu_row *r = &f->gpu_rows[i];
	r->ticks++;
	r->time_ns = t;
	if (read_util && ru == MT_NVML_SUCCESS) {
		r->util_ticks++;
		r->sm_sum += u.gpu;
		r->mem_sum += u.memory;
		r->sm_last = u.gpu;
		r->mem_last = u.memory;
		if (u.gpu > r->sm_max)
			r->sm_max = u.gpu;
		if (u.memory > r->mem_max)
			r->mem_max = u.memory;
	} else if (ru != MT_NVML_NOT_SUPPORTED) {
		r->errors++;
		r->last_error = ru;
	}
	if (rm == MT_NVML_SUCCESS) {
		r->clock_ticks++;
		r->mask_or |= mask;
		r->mask_last = mask;
		r->throttled_ticks += (mask & f->throttle_mask) != 0;
	} else if (rm != MT_NVML_NOT_SUPPORTED) {
		r->errors++;
		r->last_error = rm;
	}
	pthread_mutex_unlock(&f->lock);
}

/* The thread's CPU time into its stats (under lock), read by whoever takes
 * them: a CPU clock read is a system call, too dear for every tick. */
static void cpu_time(struct mt_fast *f)
{
	struct timespec ts;
	if (f->clock_ready && clock_gettime(f->cpu_clock, &ts) == 0)
		f->stats.cpu_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void tick(struct mt_fast *f)
{
	for (int i = 0; i < f->n_ns; i++) {
		int err = read_ns(f, &f->ns[i]);
		if (err) {
			pthread_mutex_lock(&f->lock);
			f->stats.net_errors++;
			f->stats.last_errno = err;
			pthread_mutex_unlock(&f->lock);
		}
	}
	uint64_t t = now_ns(CLOCK_MONOTONIC);
	for (int i = 0; i < f->n_gpu; i++)
		read_gpu(f, i, t);
}

/*
 * The agent reads its rings on timers where records come without a wakeup
 * (uprobes submit so: a wakeup there loses later hits, docs/design/evidence.md), and a
 * quiet ring lets it sleep long. This thread is awake every tick anyway:
 * if a watched ring now holds its share, it wakes that ring's reader, so
 * a burst is read within a tick however long the reader meant to sleep.
 * Two loads a ring, no syscall, on a quiet tick.
 */
static void watch_rings(struct mt_fast *f)
{
	for (int i = 0; i < MT_MAX_WATCH; i++) {
		struct mt_watch *w = &f->watch[i];
		if (w->cons == NULL)
			continue;
		uint64_t prod = __atomic_load_n(w->prod, __ATOMIC_ACQUIRE);
		uint64_t cons = __atomic_load_n(w->cons, __ATOMIC_ACQUIRE);
		if (prod - cons < w->bytes)
			continue;
		uint64_t one = 1;
		if (write(w->fd, &one, sizeof(one)) == (ssize_t)sizeof(one)) {
			pthread_mutex_lock(&f->lock);
			f->stats.ring_wakes++;
			pthread_mutex_unlock(&f->lock);
		}
	}
}

static void *loop(void *arg)
{
	struct mt_fast *f = arg;
	clockid_t clock;
	int have_clock = pthread_getcpuclockid(pthread_self(), &clock) == 0;
	pthread_mutex_lock(&f->lock);
	f->cpu_clock = clock;
	f->clock_ready = have_clock;
	pthread_mutex_unlock(&f->lock);
	uint64_t next = now_ns(CLOCK_MONOTONIC);
	while (!f->stop) {
		pthread_mutex_lock(&f->cfg);
		if (f->read_every <= 1 || f->stats.ticks % f->read_every == 0) /* ticks: this thread's own */
			tick(f);
		watch_rings(f);
		uint64_t period = f->period_ns; /* mt_fast_set_period changes it under cfg */
		pthread_mutex_unlock(&f->cfg);
		pthread_mutex_lock(&f->lock);
		f->stats.ticks++;
		pthread_mutex_unlock(&f->lock);
		next += period;
		uint64_t now = now_ns(CLOCK_MONOTONIC);
		if (next < now) { /* fell behind (a stopped agent, a slow call): skip, do not burst */
			uint64_t missed = (now - next) / period + 1;
			pthread_mutex_lock(&f->lock);
			f->stats.late += missed;
			pthread_mutex_unlock(&f->lock);
			next += missed * period;
		}
		struct timespec ts = {.tv_sec = (time_t)(next / 1000000000ull), .tv_nsec = (long)(next % 1000000000ull)};
		while (!f->stop && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
	}
	/* Its CPU time, last: a thread's CPU clock is gone once it has exited. */
	pthread_mutex_lock(&f->lock);
	cpu_time(f);
	f->clock_ready = 0;
	pthread_mutex_unlock(&f->lock);
	return NULL;
}

/* ---- the ctypes API (memtrace/sources/fastsample.py) ---- */

/* The tick's period (1 ms at least), and the ticks between utilisation reads (MT_UTIL_HZ). Under cfg, or before start. */
static void set_period(struct mt_fast *f, uint64_t period_ns)
{
	if (period_ns < 1000000) /* 1 kHz at most */
		period_ns = 1000000;
	f->period_ns = period_ns;
	f->util_every = (uint32_t)(1000000000ull / MT_UTIL_HZ / period_ns);
	if (f->util_every == 0)
		f->util_every = 1;
}

__attribute__((visibility("default"))) struct mt_fast *mt_fast_open(uint64_t period_ns, uint64_t throttle_mask)
{
	struct mt_fast *f = calloc(1, sizeof(*f));
	if (f == NULL)
		return NULL;
	pthread_mutex_init(&f->lock, NULL);
	pthread_mutex_init(&f->cfg, NULL);
	set_period(f, period_ns);
	f->throttle_mask = throttle_mask;
	return f;
}

/* Tick every period_ns from the tick after the one now awaited; returns the period in force. */
__attribute__((visibility("default"))) uint64_t mt_fast_set_period(struct mt_fast *f, uint64_t period_ns)
{
	pthread_mutex_lock(&f->cfg);
	set_period(f, period_ns);
	period_ns = f->period_ns;
	pthread_mutex_unlock(&f->cfg);
	return period_ns;
}

/* Read the NICs and GPUs every `every`-th tick only (1: every tick), from the next; the rings are
 * watched every tick. An idle agent's rings want a short wait, its counters no fresh reading. */
__attribute__((visibility("default"))) void mt_fast_set_read_every(struct mt_fast *f, uint32_t every)
{
	pthread_mutex_lock(&f->cfg);
	f->read_every = every ? every : 1;
	pthread_mutex_unlock(&f->cfg);
}

/* Sample the namespace whose rtnetlink socket is fd (dup'ed: the caller keeps its own). 0 or an errno. */
__attribute__((visibility("default"))) int mt_fast_add_netns(struct mt_fast *f, uint64_t inode, int fd)
{
	int err = 0;
	pthread_mutex_lock(&f->cfg);
	for (int i = 0; i < f->n_ns; i++)
		if (f->ns[i].inode == inode)
			goto out;
	if (f->n_ns >= MT_MAX_NS) {
		err = ENOSPC;
		goto out;
	}
	int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (dup_fd < 0) {
		err = errno;
		goto out;
	}
	struct timeval tv = {.tv_sec = 1}; /* a dump never blocks the thread for long */
	setsockopt(dup_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	f->ns[f->n_ns++] = (struct mt_ns){.inode = inode, .fd = dup_fd};
out:
	pthread_mutex_unlock(&f->cfg);
	return err;
}

/* Stop sampling a namespace; its interfaces' rows go. 0, or ENOENT. */
__attribute__((visibility("default"))) int mt_fast_remove_netns(struct mt_fast *f, uint64_t inode)
{
	int err = ENOENT;
	pthread_mutex_lock(&f->cfg);
	for (int i = 0; i < f->n_ns; i++) {
		if (f->ns[i].inode != inode)
			continue;
		close(f->ns[i].fd);
		f->ns[i] = f->ns[--f->n_ns];
		err = 0;
		break;
	}
	pthread_mutex_lock(&f->lock);
	int k = 0;
	for (int i = 0; i < f->n_if; i++)
		if (f->ifs[i].netns != inode)
			f->ifs[k++] = f->ifs[i];
	f->n_if = k;
	pthread_mutex_unlock(&f->lock);
	pthread_mutex_unlock(&f->cfg);
	return err;
}

/* Read these GPUs through the libnvidia-ml already loaded at `lib` (a dlopen handle). 0 or an errno. */
__attribute__((visibility("default"))) int mt_fast_set_gpus(struct mt_fast *f, void *lib, void **handles, int n)
{
	if (n < 0 || n > MT_MAX_GPU || lib == NULL)
		return EINVAL;
	pthread_mutex_lock(&f->cfg);
	pthread_mutex_lock(&f->lock);
	f->util_fn = (mt_util_fn)dlsym(lib, "nvmlDeviceGetUtilizationRates");
	f->mask_fn = (mt_mask_fn)dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons");
	f->mask_old_fn = (mt_mask_fn)dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
	for (int i = 0; i < n; i++) {
		f->gpus[i] = handles[i];
		memset(&f->gpu_rows[i], 0, sizeof(f->gpu_rows[i]));
		f->gpu_rows[i].slot = (uint32_t)i;
	}
	f->n_gpu = n;
	pthread_mutex_unlock(&f->lock);
	pthread_mutex_unlock(&f->cfg);
	return 0;
}

/*
 * Watch a ring laid out as the kernel maps it (its consumer and producer
 * positions at cons and prod) in slot 0 or 1: each tick that finds `bytes`
 * or more unread, write 1 to the eventfd `fd` (dup'ed: the caller keeps its
 * own). A NULL cons stops the slot's watch. Synchronous with the thread
 * (it holds cfg over a tick): once this returns, the thread no longer
 * reads the old positions, and their memory may be unmapped. 0 or an errno.
 */
__attribute__((visibility("default"))) int mt_fast_watch_ring(struct mt_fast *f, int slot, const uint64_t *cons,
							      const uint64_t *prod, uint64_t bytes, int fd)
{
	int dup_fd = -1;
	if (slot < 0 || slot >= MT_MAX_WATCH || (cons != NULL && (prod == NULL || bytes == 0)))
		return EINVAL;
	if (cons != NULL) {
		dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (dup_fd < 0)
			return errno;
	}
	pthread_mutex_lock(&f->cfg);
	struct mt_watch *w = &f->watch[slot];
	if (w->cons != NULL)
		close(w->fd);
	*w = (struct mt_watch){.cons = cons, .prod = prod, .bytes = bytes, .fd = dup_fd};
	pthread_mutex_unlock(&f->cfg);
	return 0;
}

/* Start the sampling thread. 0 or an errno. */
__attribute__((visibility("default"))) int mt_fast_start(struct mt_fast *f)
{
	if (f->running)
		return 0;
	f->stop = 0;
	/* Signals are the agent's main thread's: the thread starts with every one blocked. */
	sigset_t all, was;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &was);
	int err = pthread_create(&f->thread, NULL, loop, f);
	pthread_sigmask(SIG_SETMASK, &was, NULL);
	if (err == 0)
		pthread_setname_np(f->thread, "memtrace-fast"); /* for top -H and ps -L */
	if (err == 0)
		f->running = 1;
	return err;
}

/*
 * Copy out every row (at most the caps; the counts say how many there were)
 * and start the next window: the counters and last readings stay, the
 * tick counts, sums and peaks start again.
 */
__attribute__((visibility("default"))) int mt_fast_take(struct mt_fast *f, struct mt_if_row *ifs, int if_cap,
							int *n_if, struct mt_gpu_row *gpus, int gpu_cap, int *n_gpu,
							struct mt_stats *stats)
{
	pthread_mutex_lock(&f->lock);
	*n_if = f->n_if;
	*n_gpu = f->n_gpu;
	for (int i = 0; i < f->n_if && i < if_cap; i++) {
		ifs[i] = f->ifs[i];
		f->ifs[i].ticks = 0;
		f->ifs[i].peak_rx_bytes_per_s = f->ifs[i].peak_tx_bytes_per_s = 0;
	}
	for (int i = 0; i < f->n_gpu && i < gpu_cap; i++) {
		struct mt_gpu_row *r = &f->gpu_rows[i];
		gpus[i] = *r;
		r->ticks = r->util_ticks = r->clock_ticks = r->throttled_ticks = r->errors = 0;
		r->sm_sum = r->mem_sum = r->mask_or = 0;
		r->sm_max = r->mem_max = 0;
	}
	cpu_time(f);
	*stats = f->stats;
	pthread_mutex_unlock(&f->lock);
	return 0;
}

/* Ticks done since the start, without taking the window. */
__attribute__((visibility("default"))) uint64_t mt_fast_ticks(struct mt_fast *f)
{
	pthread_mutex_lock(&f->lock);
	uint64_t n = f->stats.ticks;
	pthread_mutex_unlock(&f->lock);
	return n;
}

/* Stop the thread (within one tick), close the sockets, free. */
__attribute__((visibility("default"))) void mt_fast_close(struct mt_fast *f)
{
	if (f == NULL)
		return;
	if (f->running) {
		f->stop = 1;
		pthread_join(f->thread, NULL);
	}
	for (int i = 0; i < f->n_ns; i++)
		close(f->ns[i].fd);
	for (int i = 0; i < MT_MAX_WATCH; i++)
		if (f->watch[i].cons != NULL)
			close(f->watch[i].fd);
	pthread_mutex_destroy(&f->lock);
	pthread_mutex_destroy(&f->cfg);
	free(f);
}

/* The sizes of the structures, checked by the binding against its own, and the most rows of each. */
__attribute__((visibility("default"))) void mt_fast_sizes(uint32_t *out)
{
	out[0] = sizeof(struct mt_if_row);
	out[1] = sizeof(struct mt_gpu_row);
	out[2] = sizeof(struct mt_stats);
	out[3] = MT_MAX_IF;
	out[4] = MT_MAX_GPU;
}

/*
 * The events ring's reader (memtrace/bpf/ringbuf.py's EventRing, which maps
 * the ring as libbpf does: the data twice, so a record that wraps is
 * contiguous). libbpf's own loop (ringbuf_process_ring), with a copy in
 * place of its callback: the producer position and each header are read with
 * acquire loads, the consumer position stored with a release store, so a
 * committed header never comes with stale data, on arm64 as on x86. Copies
 * at most `cap` events of `itemsize` bytes to `out`; a committed record of
 * another size is skipped and counted in *malformed; stops at the first
 * record still being written (BUSY). Returns the events copied.
 *
 * In C because the same steps in numpy cost several times more CPU a drain
 * once the caches have gone cold between drains, and a drain of a trickling
 * job reads a few dozen records (docs/design/evidence.md#wake-cost).
 */
#define MT_RB_BUSY (1U << 31)
#define MT_RB_DISCARD (1U << 30)
#define MT_RB_HDR 8

__attribute__((visibility("default"))) uint64_t mt_ring_read(uint64_t *cons_pos, const uint64_t *prod_pos,
							     const uint8_t *data, uint64_t mask, uint32_t itemsize,
							     uint8_t *out, uint64_t cap, uint64_t *malformed)
{
	uint64_t cons = __atomic_load_n(cons_pos, __ATOMIC_RELAXED); /* ours: no other writer */
	uint64_t prod = __atomic_load_n(prod_pos, __ATOMIC_ACQUIRE);
	uint64_t n = 0;

	while (cons < prod && n < cap) {
		const uint8_t *rec = data + (cons & mask);
		uint32_t hdr = __atomic_load_n((const uint32_t *)rec, __ATOMIC_ACQUIRE);
		if (hdr & MT_RB_BUSY)
			break;
		uint32_t len = hdr & ~(MT_RB_BUSY | MT_RB_DISCARD);
		if (!(hdr & MT_RB_DISCARD)) {
			if (len == itemsize)
				memcpy(out + n++ * itemsize, rec + MT_RB_HDR, itemsize);
			else
				(*malformed)++;
		}
		cons += (MT_RB_HDR + (uint64_t)len + 7) & ~(uint64_t)7;
	}
	__atomic_store_n(cons_pos, cons, __ATOMIC_RELEASE);
	return n;
}

/*
 * Calibration targets (memtrace/runtime/overhead.py). What a uprobe trap
 * costs depends on the probed function's first instruction: one the kernel
 * carries out itself (x86-64: the push of a register, how every CUDA entry
 * point begins) takes one exception; any other (endbr64, mov, sub: how most
 * functions built with -O2 or CET begin) is run out of line and single-
 * stepped, a second exception, about ten times the cost in a VM. The agent
 * times a trap at each kind and charges each probe by the kind it is.
 */
#if defined(__x86_64__)
__asm__(".text\n"
	".globl mt_cal_push\n"
	".type mt_cal_push,@function\n"
	"mt_cal_push:\n"
	"\tpush %rbp\n"
	"\tmov %rsp,%rbp\n"
	"\tmov %rdi,%rax\n"
	"\tpop %rbp\n"
	"\tret\n"
	".size mt_cal_push, .-mt_cal_push\n");
#endif

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT,
	"_fastsample",
	"memtrace's fast host sampler: a C thread reached through ctypes (memtrace.sources.fastsample).",
	-1,
	NULL,
};

PyMODINIT_FUNC PyInit__fastsample(void)
{
	return PyModule_Create(&module);
}
