/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Launches and traps counted in the kernel (memtrace.bpf.c), the overhead
 * budget's launch sampling: per-process launch links, the windows they are
 * open, and the launches between two exact calls; and, while a timeline is
 * recorded, each launch's record: its entry, stream and function, made a
 * record with its host-side duration by the return probe.
 */
#ifndef __MEMTRACE_LAUNCHES_BPF_H
#define __MEMTRACE_LAUNCHES_BPF_H

#include "common.bpf.h"
#include "inflight.bpf.h"
#include "uargs.h"
#include "events.bpf.h"

/* Launches per (pid, api): counted here, no event (the hot path). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, struct mt_totals_key);
	__type(value, __u64);
} counts SEC(".maps");

/* The overhead budget's launch probes per process. A library in
 * per-process mode (`attached` MT_ATTACHED_PER_PROCESS) has no launch link
 * for every process: each process that maps it gets its own, pid-filtered
 * (the kernel writes the breakpoints into that process's memory alone), so
 * a process over its budget can have them detached for a while without
 * blinding the others. `launch_own`: processes whose launches their own
 * links count (the library-wide link, until it is gone, skips them);
 * deleted at exit, so a reused pid is never taken for one. `launch_linked`:
 * which libraries a process has its own link to; a process mapping one it
 * has none for is held like one mapping a new library. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct mt_launch_sample);
} launch_own SEC(".maps");

/* 1 once the budget has given any process its own launch links (set by
 * user space before the first): until then no launch_own lookup is made,
 * one inlined array load where a hash lookup costs every exact call and
 * every launch about 50 ns on a small VM. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} launch_sampling SEC(".maps");

static __always_inline struct mt_launch_sample *launch_own_of(__u32 tgid)
{
	__u32 zero = 0, *any = bpf_map_lookup_elem(&launch_sampling, &zero);

	if (!any || !*any)
		return NULL;
	return bpf_map_lookup_elem(&launch_own, &tgid);
}

/* Processes whose budget window is open: their own launch links attached. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, __u8);
} launch_window SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, struct mt_launch_lib);
	__type(value, __u8);
} launch_linked SEC(".maps");

/*
 * The first launch each thread made since its last synchronisation
 * returned (CLOCK_MONOTONIC ns; 0: none yet), by the tid's low bits as
 * `slots`. The next synchronisation's event carries it (`src`): from a
 * wait's return to that launch the GPU had nothing of this thread's to do.
 * Two threads sharing a slot at once overwrite each other's: the model then
 * falls back to the next copy or wait, an upper bound, as without it.
 */
struct mt_first_launch {
	__u64 tid;
	__u64 ts;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NSLOTS);
	__type(key, __u32);
	__type(value, struct mt_first_launch);
} first_launch SEC(".maps");

/* A traced process's entry and return traps, in `counts` under
 * MT_API_TRAPS: one lookup, an atomic add once the key exists. */
static __always_inline void count_traps(__u64 id, __u64 n)
{
	struct mt_totals_key tk = {};
	__u64 *c;

	tk.start_ns = current_start();
	tk.pid = id >> 32;
	tk.api = MT_API_TRAPS;
	c = bpf_map_lookup_elem(&counts, &tk);
	if (c) {
		__sync_fetch_and_add(c, n);
		return;
	}
	if (bpf_map_update_elem(&counts, &tk, &n, BPF_NOEXIST)) {
		c = bpf_map_lookup_elem(&counts, &tk); /* another thread made it */
		if (c)
			__sync_fetch_and_add(c, n);
		else
			stat_inc(MT_STAT_COUNTS_FULL);
	}
}

/* An exact call of a process whose launches the budget samples: it closes
 * the interval of launches since its last one (struct mt_launch_sample). */
static __always_inline void launch_interval(__u32 tgid)
{
	struct mt_launch_sample *s = launch_own_of(tgid);
	__u64 p;

	if (!s)
		return;
	p = s->pending;
	__sync_fetch_and_sub(&s->pending, p); /* launches made meanwhile stay pending */
	if (!bpf_map_lookup_elem(&launch_window, &tgid)) {
		s->primed = 0;
		return;
	}
	if (s->primed) {
		__sync_fetch_and_add(&s->launches, p);
		__sync_fetch_and_add(&s->calls, 1);
	} else {
		s->primed = 1;
	}
}

/*
 * A timeline's launch slices. Set by user space before load when a
 * timeline is recorded (`run --timeline`): each launch of a process whose
 * launches are all probed (not sampled by the budget) is stashed at entry,
 * and its return probe (mt_launch_return, attached only then) queues it as
 * one record: entry time, host-side duration, stream, function or graph
 * (`dst`), result. Off, the verifier drops these branches and a launch is
 * the one entry trap and the counter it always was. The count in `counts`
 * stays the truth; a record the ring cannot take is counted in
 * MT_STAT_LAUNCH_DROPPED.
 */
const volatile bool launch_events = false;

struct mt_launch_entry {
	__u64 ts;
	__u64 cookie;
	__u64 start_ns; /* the process's (struct mt_proc_key) */
	__u64 stream;
	__u64 function; /* or the graph */
};

/* Launches in flight, by thread id: one at a time per thread. LRU, and
 * deleted at return and at the thread's exit: nothing grows. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct mt_launch_entry);
} launch_entries SEC(".maps");

/* The launch's stream: its argument, or (MT_LAUNCH_STREAM_IN_CONFIG,
 * cuLaunchKernelEx) the hStream of the CUlaunchConfig it points to. */
static __always_inline __u64 launch_stream(const struct args *a, __u64 cookie)
{
	__u64 v = arg_at(a, ck(cookie, MT_CK_STREAM_SHIFT)), stream = 0;

	if (!(ck(cookie, MT_CK_DIRSRC_SHIFT) & MT_LAUNCH_STREAM_IN_CONFIG))
		return v;
	if (!v || bpf_probe_read_user(&stream, sizeof(stream), (void *)(v + MT_LCFG_STREAM_OFF)))
		return 0;
	return stream;
}

/* At a launch's entry (launch_events on, its process not sampled). */
static __always_inline void launch_enter(struct pt_regs *ctx, __u64 id, __u64 start, __u64 cookie)
{
	struct mt_launch_entry e = {};
	struct args a = {};
	__u32 tid = (__u32)id;

	load_args(ctx, &a);
	e.cookie = cookie;
	e.start_ns = start;
	e.stream = launch_stream(&a, cookie);
	e.function = arg_at(&a, ck(cookie, MT_CK_DST_SHIFT));
	e.ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&launch_entries, &tid, &e, BPF_ANY);
}

/* At its return: the record, with the result the call returned. */
static __always_inline void launch_return(__u64 now, __u64 id, __u64 cookie, __s32 ret)
{
	__u32 tid = (__u32)id;
	struct mt_launch_entry *e = bpf_map_lookup_elem(&launch_entries, &tid);

	if (!e)
		return; /* entered before the return probe was attached, or sampled */
	if ((e->cookie & 0xffff) == (cookie & 0xffff)) {
		if (queue_event(id, e->start_ns, e->cookie, e->ts, now - e->ts, 0, e->stream, e->function, 0, ret, 0,
				0, 0))
			stat_inc(MT_STAT_LAUNCH_EVENTS);
		else
			stat_inc(MT_STAT_LAUNCH_DROPPED);
	}
	bpf_map_delete_elem(&launch_entries, &tid);
}

#endif /* __MEMTRACE_LAUNCHES_BPF_H */
