/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What every sensor's BPF side shares (memtrace.bpf.c, sched.bpf.c,
 * nccl.bpf.c): health counters, map helpers (as libbpf-tools' maps.bpf.h),
 * cookie fields, and who a process is. A sensor defines STAT_SLOTS, the
 * count of its health counters (its header's enum), before including it.
 */
#ifndef __MEMTRACE_COMMON_BPF_H
#define __MEMTRACE_COMMON_BPF_H

#ifndef STAT_SLOTS
#error "define STAT_SLOTS (the sensor's count of health counters) before including common.bpf.h"
#endif

#define MAX_PROCESSES 10240

/* Health counters, one slot each (the sensor's enum), summed over CPUs by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void stat_add(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);

	if (v)
		*v += n;
}

static __always_inline void stat_inc(__u32 idx)
{
	stat_add(idx, 1);
}

/* The value at key, inserting init first if the key is absent (another CPU
 * may insert it meanwhile: BPF_NOEXIST, then look again); NULL when the map
 * is full. */
static __always_inline void *lookup_or_try_init(void *map, const void *key, const void *init)
{
	void *v = bpf_map_lookup_elem(map, key);

	if (v)
		return v;
	bpf_map_update_elem(map, key, init, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* A 4-bit field of a bpf_cookie (MT_CK_NIBBLE, NC_CK_NIBBLE): an argument
 * index or a small enum, at `shift`. */
static __always_inline __u32 ck(__u64 cookie, __u32 shift)
{
	return (cookie >> shift) & 0xfULL;
}

/* When the current process started (its thread group leader's start,
 * CLOCK_BOOTTIME ns): with the tgid, who the process is. Read through the
 * task's BTF pointer (5.11+; memtrace needs 5.15): two plain loads, where
 * two probe-read helper calls cost each probe about 100 ns on a small VM. */
static __always_inline __u64 current_start(void)
{
	return bpf_get_current_task_btf()->group_leader->start_boottime;
}

/* When a task's process started (as current_start), from a BTF pointer
 * (a tracepoint's task argument). */
static __always_inline __u64 task_start(struct task_struct *task)
{
	return task->group_leader->start_boottime;
}

/* Is the process (tgid, start) the one traced under tgid? `traced` maps a
 * tgid to the start of that process; 0: user space did not know it, and the
 * first process BPF sees with that tgid takes the entry (its start is
 * written in, once). A reused pid is then another process: not traced. */
static __always_inline bool traced_as(void *traced, __u32 tgid, __u64 start)
{
	__u64 *want = bpf_map_lookup_elem(traced, &tgid), was;

	if (!want)
		return false;
	if (*want == start)
		return true;
	if (*want)
		return false;
	was = __sync_val_compare_and_swap(want, 0, start);
	return was == 0 || was == start;
}

#endif /* __MEMTRACE_COMMON_BPF_H */
