/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Launches and traps counted in the kernel (memtrace.bpf.c), and the
 * overhead budget's launch sampling: per-process launch links, the windows
 * they are open, and the launches between two exact calls.
 */
#ifndef __MEMTRACE_LAUNCHES_BPF_H
#define __MEMTRACE_LAUNCHES_BPF_H

#include "common.bpf.h"
#include "inflight.bpf.h"

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

#endif /* __MEMTRACE_LAUNCHES_BPF_H */
