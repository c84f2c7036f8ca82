/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Who a process is (memtrace.bpf.c): its ids as the agent's pid namespace
 * names them, whether it is traced, and its identity notice on the control
 * ring, sent once at its first event.
 */
#ifndef __MEMTRACE_PROCESS_BPF_H
#define __MEMTRACE_PROCESS_BPF_H

#include "common.bpf.h"
#include "inflight.bpf.h"

/* Set by user space before load. */
const volatile bool filter_pids = false; /* only processes in `traced` */
/* The agent's pid namespace (nsfs dev, inode); 0: the host's. Processes are
 * named by their pids there, and a process it cannot name is not traced
 * (nor held: the agent could not continue it). */
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;

/* Control notices (struct mt_ctl_event): a process's identity here, holds and exits (holds.bpf.h). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} ctl_events SEC(".maps");

/* tgids traced when filter_pids is set; children join on fork. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, __u8);
} traced SEC(".maps");

/* Processes forked since the programs were attached: user space saw them
 * from their first instruction, so an address their own calls did not make
 * pinned or device memory is ordinary host memory. LRU: bounded, and the
 * entry outlives the process until user space has decoded its events. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} fresh SEC(".maps");

/* Processes whose identity notice (MT_CTL_PROC) is on the control ring:
 * one notice per (pid, start), the first time either is seen. LRU: bounded;
 * an evicted process is introduced again, which user space takes as a
 * repeat. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct mt_proc_key);
	__type(value, __u8);
} seen SEC(".maps");

/* The process each thread slot (tid's low bits) last knew introduced: a
 * return checks it before `seen`, one inlined array load where the hash
 * lookup costs a probe about 80 ns on a small VM. A slot two threads share
 * only misses, and a miss asks `seen`. */
struct mt_introduced {
	__u64 id; /* tgid << 32 | tid */
	__u64 start;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NSLOTS);
	__type(key, __u32);
	__type(value, struct mt_introduced);
} introduced SEC(".maps");

/* tgid << 32 | tid of the current thread as the agent's pid namespace
 * names them; 0 if the thread has no pid there. */
static __always_inline __u64 current_id(void)
{
	struct bpf_pidns_info ns = {};

	if (!pidns_ino)
		return bpf_get_current_pid_tgid();
	if (bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)))
		return 0;
	return ((__u64)ns.tgid << 32) | ns.pid;
}

static __always_inline bool is_traced(__u32 tgid)
{
	if (!tgid)
		return false; /* outside the agent's pid namespace */
	if (!filter_pids)
		return true;
	return bpf_map_lookup_elem(&traced, &tgid) != NULL;
}

/* The first event of a process: say who it is (command name and cgroup,
 * as they are now) on the control ring, once. If the ring is full the
 * process is introduced at a later event. */
static __always_inline void introduce(__u64 id, __u64 start)
{
	__u32 slot = (__u32)id & (NSLOTS - 1);
	struct mt_introduced *known = bpf_map_lookup_elem(&introduced, &slot);
	struct mt_proc_key pk = {};
	struct mt_ctl_event *e;
	struct task_struct *task;
	__u8 one = 1;

	if (known && known->id == id && known->start == start)
		return;
	pk.start_ns = start;
	pk.pid = id >> 32;
	if (bpf_map_lookup_elem(&seen, &pk))
		goto known;
	if (bpf_map_update_elem(&seen, &pk, &one, BPF_NOEXIST))
		return; /* another thread of it was first (its notice may yet fail: not remembered) */
	e = bpf_ringbuf_reserve(&ctl_events, sizeof(*e), 0);
	if (!e) {
		bpf_map_delete_elem(&seen, &pk);
		stat_inc(MT_STAT_CTL_DROPPED);
		return;
	}
	task = (struct task_struct *)bpf_get_current_task();
	e->ts_ns = bpf_ktime_get_ns();
	e->type = MT_CTL_PROC;
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->fd = -1;
	e->held = MT_HOLD_NONE;
	e->host_pid = bpf_get_current_pid_tgid() >> 32;
	e->start_ns = start;
	e->cgroup_id = bpf_get_current_cgroup_id();
	/* The process's name is its leader's: threads may rename themselves. */
	__builtin_memset(e->comm, 0, sizeof(e->comm));
	BPF_CORE_READ_STR_INTO(&e->comm, task, group_leader, comm);
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
known:
	if (known) {
		known->id = id;
		known->start = start;
	}
}

/* A task's tgid as the agent's pid namespace names it; 0 if it has none there. */
static __always_inline __u32 ns_tgid_of(struct task_struct *t)
{
	struct pid *p;
	struct upid u;
	__u32 level;

	if (!pidns_ino)
		return BPF_CORE_READ(t, tgid);
	p = BPF_CORE_READ(t, group_leader, thread_pid);
	if (!p)
		return 0;
	level = BPF_CORE_READ(p, level);
	for (__u32 i = 0; i < 8; i++) {
		if (i > level)
			break;
		if (bpf_core_read(&u, sizeof(u), &p->numbers[i]))
			return 0;
		if (BPF_CORE_READ(u.ns, ns.inum) == pidns_ino)
			return u.nr;
	}
	return 0;
}

#endif /* __MEMTRACE_PROCESS_BPF_H */
