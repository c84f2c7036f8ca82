/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Holding a process (memtrace.bpf.c) that maps a CUDA (or NCCL) library's
 * code before user space has attached it: stopped with SIGSTOP, told on the
 * control ring, continued by user space; and the exit notice.
 */
#ifndef __MEMTRACE_HOLDS_BPF_H
#define __MEMTRACE_HOLDS_BPF_H

#include "common.bpf.h"
#include "process.bpf.h"
#include "launches.bpf.h"

#define SIGSTOP 19

/* Set by user space before load. */
const volatile bool hold_libraries = true;
/* Hold for a newly mapped libnccl too (the NCCL sensor is on): its probes
 * go in before the library's first collective. */
const volatile bool hold_nccl = false;
/* The agent's own tgid: never held, since a stopped agent could not
 * continue itself (it may map a CUDA library, e.g. through NVML). */
const volatile __u32 agent_tgid = 0;

/* Inodes user space has dealt with: CUDA libraries with probes, and
 * executables checked for a statically linked runtime. A process opening
 * an attached library from a checked executable needs no hold. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct mt_inode_key);
	__type(value, __u8);
} attached SEC(".maps");

/* Processes stopped by this agent and not yet continued, by host tgid (the
 * same key in every agent's map, so agents see each other's holds): when
 * held and the pid to continue it by. The agent continues a process once
 * its probes are in and no other agent's live hold remains; the guardian
 * continues any hold older than the limit, and all of them if the agent dies. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct mt_hold);
} mt_held SEC(".maps");

#define PROT_EXEC 0x4

static __always_inline bool has_prefix(const char *buf, const char *lit, __u32 len)
{
	for (__u32 j = 0; j < len; j++) {
		if (buf[j] != lit[j])
			return false;
	}
	return true;
}

/* Is the task in its terminal's foreground job? A job-control shell takes
 * a stopped foreground job for ^Z: it reports it `Stopped` and moves it to
 * the background, so such a process is never held. */
struct tty_struct___old {
	struct pid *pgrp;
};

static __always_inline bool in_foreground(struct task_struct *task)
{
	struct tty_struct *tty = BPF_CORE_READ(task, signal, tty);
	struct pid *fg;

	if (!tty)
		return false;
	if (bpf_core_field_exists(tty->ctrl))
		fg = BPF_CORE_READ(tty, ctrl.pgrp);
	else
		fg = BPF_CORE_READ((struct tty_struct___old *)tty, pgrp);
	return fg && fg == BPF_CORE_READ(task, signal, pids[PIDTYPE_PGID]);
}

/* At the exit of a process's last thread: its CPU time. Threads that
 * exited before were added to the signal struct's sum as they were
 * released; a leader that exited first is not released until the whole
 * group is: add its own. */
static __always_inline __u64 exit_cpu_ns(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct task_struct *leader = BPF_CORE_READ(task, group_leader);
	__u64 ns = BPF_CORE_READ(task, signal, sum_sched_runtime) + BPF_CORE_READ(task, se.sum_exec_runtime);

	if (leader != task)
		ns += BPF_CORE_READ(leader, se.sum_exec_runtime);
	return ns;
}

static __always_inline void hold(__u32 type, __u64 id, __s32 fd, __u32 stop)
{
	struct mt_ctl_event *e;
	__u32 host_tgid = bpf_get_current_pid_tgid() >> 32;
	struct mt_hold h = {};

	h.ts_ns = bpf_ktime_get_ns();
	h.pid = id >> 32;
	e = bpf_ringbuf_reserve(&ctl_events, sizeof(*e), 0);
	if (!e) {
		/* Never stop a process user space will not hear about. */
		stat_inc(stop == MT_HOLD_HELD ? MT_STAT_HOLD_MISSED : MT_STAT_CTL_DROPPED);
		return;
	}
	e->ts_ns = h.ts_ns;
	e->type = type;
	e->pid = h.pid;
	e->tid = (__u32)id;
	e->fd = fd;
	e->start_ns = current_start();
	e->cgroup_id = 0;
	__builtin_memset(e->comm, 0, sizeof(e->comm));
	e->held = stop;
	e->host_pid = host_tgid;
	e->cpu_ns = type == MT_CTL_EXIT ? exit_cpu_ns() : 0;
	if (stop == MT_HOLD_HELD) {
		e->held = MT_HOLD_NOT_HELD;
		if (bpf_map_update_elem(&mt_held, &host_tgid, &h, BPF_ANY) == 0) {
			if (bpf_send_signal(SIGSTOP) == 0) {
				e->held = MT_HOLD_HELD;
				stat_inc(MT_STAT_HOLDS);
			} else {
				bpf_map_delete_elem(&mt_held, &host_tgid);
			}
		}
	}
	/* Wake the control reader: these are rare, and a held process waits on it. */
	bpf_ringbuf_submit(e, 0);
}

/* Has user space dealt with this file, for this process? A library in
 * per-process mode is known to a process once it has its own launch link. */
static __always_inline bool known(struct file *file, __u32 tgid)
{
	struct mt_launch_lib ll = {};
	__u8 *v;

	if (!file)
		return false;
	ll.lib.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
	ll.lib.ino = BPF_CORE_READ(file, f_inode, i_ino);
	v = bpf_map_lookup_elem(&attached, &ll.lib);
	if (!v)
		return false;
	if (*v != MT_ATTACHED_PER_PROCESS)
		return true;
	ll.pid = tgid;
	return launch_own_of(tgid) && bpf_map_lookup_elem(&launch_linked, &ll);
}

#endif /* __MEMTRACE_HOLDS_BPF_H */
