// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * memtrace CPU sensor: where the threads of traced processes spend their
 * time, from the scheduler's BTF tracepoints (no kprobes needed).
 *
 * Each traced thread is in one state (sched.h): running, queued after a
 * wakeup, queued after a preemption, or blocked. sched_switch and the two
 * wakeup tracepoints move it between states and add the interval that ended
 * to its process: run-queue latency (queued to switch-in, as libbpf-tools
 * runqlat measures it) and off-CPU time (blocked to wakeup) as log2
 * histograms, and on-CPU time. A switch-out counts as involuntary exactly
 * when the kernel counts it in nivcsw (preempted, or still TASK_RUNNING),
 * and then the task switched in is charged as the preemptor: its cgroup (v2)
 * and process, with the run-queue wait that followed. A wait after a wakeup
 * is charged to the task that held the CPU until the thread got it (another
 * process's), as runqslower names it: on a kernel whose scheduler lets the
 * running task finish its slice before a woken one (EEVDF's run to parity),
 * a neighbour delays a thread that sleeps often mostly there, without ever
 * preempting it. Each cgroup is named by the process of its that traced
 * threads waited on longest (a majority vote weighted by time, sched.h).
 * A thread's exit settles what it ran too, as its last switch-out may
 * never be delivered.
 *
 * Two rare events keep user space's idea of who the process is current,
 * at no cost between them: an exec (its command and executable) and a move
 * to another cgroup are counted in the process's entry, which user space
 * reads at each sample anyway, and it reads /proc again only then.
 *
 * A process is its tgid and its start (sched.h): a task is charged to the
 * process traced under its tgid only if its thread group leader started
 * when that process did, so a reused pid is never taken for it.
 *
 * Every map is bounded; anything that does not fit is counted in `stats`.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "sched.h"
#define STAT_SLOTS SC_STAT_COUNT
#include "common.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TASK_RUNNING 0
#define TASK_DEAD 0x80

/* Set by user space before load. */
const volatile bool filter_pids = true; /* only processes in `traced` */

struct sc_thread {
	__u64 ts;
	__u64 exec; /* the task's se.sum_exec_runtime when its state was last set (0 for a new task) */
	__u64 preempt_cgroup; /* SC_T_PREEMPTED: who took the CPU */
	__u64 start; /* its process's start: a state left by an exited thread whose tid is reused is not its */
	__u32 tgid;
	__u32 state; /* enum sc_tstate */
	__u32 nvcsw; /* the task's own switch counts then (low 32 bits: their differences are what counts) */
	__u32 nivcsw;
};

/* The processes traced (sched.h): tgid -> its start; 0 binds to the first seen. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, __u64);
} traced SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SC_FILTER_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} traced_bits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, struct sc_proc_key);
	__type(value, struct sc_proc);
} procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32); /* tid */
	__type(value, struct sc_thread);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct sc_preempt_key);
	__type(value, struct sc_preempt);
} preempts SEC(".maps");

/* Never written: the zero values new entries start from (too big for the stack). */
struct zeroes {
	struct sc_proc proc;
	struct sc_preempt preempt;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct zeroes);
} zero SEC(".maps");

/* The start of the task's process if it is traced, else 0. Untraced
 * tasks (nearly all on a host) cost the bitmap's one array load. */
static __always_inline __u64 traced_start(struct task_struct *task)
{
	__u32 tgid = task->tgid, bit = tgid % SC_FILTER_BITS, word = bit / 64;
	__u64 *w, start;

	if (tgid == 0) /* the idle tasks */
		return 0;
	if (filter_pids) {
		w = bpf_map_lookup_elem(&traced_bits, &word);
		if (!w || !(*w & (1ULL << (bit % 64))))
			return 0;
	}
	start = task_start(task);
	if (filter_pids && !traced_as(&traced, tgid, start))
		return 0;
	return start;
}

static __always_inline __u32 log2_32(__u32 v)
{
	__u32 r, shift;

	r = (v > 0xFFFF) << 4; v >>= r;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

/* floor(log2(us)) (0 for 0), capped to the last slot. 64-bit: a 32-bit index
 * is zero-extended into a register copy whose bound older verifiers (6.1)
 * lose, and they refuse the histogram's store. */
static __always_inline __u64 log2_slot(__u64 us)
{
	__u32 hi = us >> 32;
	__u64 slot = hi ? log2_32(hi) + 32 : log2_32((__u32)us);

	return slot < SC_SLOTS ? slot : SC_SLOTS - 1;
}

static __always_inline struct sc_proc *proc_of(__u32 tgid, __u64 start)
{
	struct sc_proc_key key = { .start_ns = start, .tgid = tgid };
	struct zeroes *z;
	struct sc_proc *p;
	__u32 zk = 0;

	z = bpf_map_lookup_elem(&zero, &zk);
	if (!z)
		return NULL;
	p = lookup_or_try_init(&procs, &key, &z->proc);
	if (!p)
		stat_inc(SC_STAT_PROCS_FULL);
	return p;
}

static __always_inline void add_runq(struct sc_proc *p, __u64 ns)
{
	__u64 slot = log2_slot(ns / 1000);

	if (slot < SC_SLOTS)
		__sync_fetch_and_add(&p->runq_hist[slot], 1);
	__sync_fetch_and_add(&p->runq_ns, ns);
}

static __always_inline void add_offcpu(struct sc_proc *p, __u64 ns)
{
	__u64 slot = log2_slot(ns / 1000);

	if (slot < SC_SLOTS)
		__sync_fetch_and_add(&p->offcpu_hist[slot], 1);
	__sync_fetch_and_add(&p->offcpu_ns, ns);
}

/* The thread's state; NULL where the state is another process's, left by
 * an exited thread whose tid this one now has (its exit not seen). */
static __always_inline struct sc_thread *thread_of(__u32 tid, __u32 tgid, __u64 start)
{
	struct sc_thread *t = bpf_map_lookup_elem(&threads, &tid);

	return t && t->tgid == tgid && t->start == start ? t : NULL;
}

static __always_inline void put_thread(__u32 tid, struct sc_thread *t)
{
	if (bpf_map_update_elem(&threads, &tid, t, BPF_ANY))
		stat_inc(SC_STAT_THREADS_FULL);
}

/* The entry of the cgroup `cgid` in a traced process's table (created at
 * zero if new; NULL if the map is full). */
static __always_inline struct sc_preempt *holder(__u32 tgid, __u64 start, __u64 cgid)
{
	struct sc_preempt_key key = { .cgroup_id = cgid, .start_ns = start, .tgid = tgid };
	struct sc_preempt *v;
	struct zeroes *z;
	__u32 zk = 0;

	z = bpf_map_lookup_elem(&zero, &zk);
	if (!z)
		return NULL;
	v = lookup_or_try_init(&preempts, &key, &z->preempt);
	if (!v)
		stat_inc(SC_STAT_PREEMPT_FULL);
	return v;
}

/* `who`'s vote, weighing `us`, for the process that names the cgroup's
 * entry (sched.h: a majority vote weighted by time). The cgroup is named by
 * a user process: kernel threads sharing it (kworkers, rcu, some of them
 * doing uprobe work for memtrace itself) are the host's housekeeping, named
 * only until one is seen, and have no vote against it. Concurrent votes
 * from two CPUs can lose one: the name is a vote, the counts stay exact
 * (atomic, by the callers). */
static __always_inline void vote(struct sc_preempt *v, struct task_struct *who_task, __u64 us)
{
	__u32 kthread = (BPF_CORE_READ(who_task, flags) & SC_PF_KTHREAD) ? 1 : 0;
	__u32 who = BPF_CORE_READ(who_task, tgid), w, margin = v->votes;

	w = us < 1 ? 1 : us > SC_VOTE_CAP_US ? SC_VOTE_CAP_US : (__u32)us;
	if (margin && !v->kthread && kthread)
		return;
	if (margin && who == v->tgid) {
		v->votes = margin + w < SC_VOTE_CAP_US ? margin + w : SC_VOTE_CAP_US;
	} else if (margin > w && (kthread || !v->kthread)) {
		v->votes = margin - w;
		return;
	} else {
		/* Nobody named yet, or a user process after a kernel thread: named
		 * by its vote. Outvoted: named by what it is ahead, at least 1 us
		 * (0 is "nobody"). */
		v->votes = !margin || kthread != v->kthread ? w : w > margin ? w - margin : 1;
		v->tgid = who;
		v->kthread = kthread;
	}
	BPF_CORE_READ_STR_INTO(&v->comm, who_task, comm); /* current: it may have exec'd */
}

/* `next` preempted a traced thread: counted, and a vote of 1 us (what it
 * then runs of the thread's wait votes at the thread's switch-in). */
static __always_inline void charge_preemptor(__u32 tgid, __u64 start, struct task_struct *next, __u64 cgid)
{
	struct sc_preempt *v = holder(tgid, start, cgid);

	if (!v)
		return;
	__sync_fetch_and_add(&v->count, 1);
	vote(v, next, 1);
}

/* Switches a task made since its thread's last event that never reached
 * the tracepoint: what its own counts (the kernel's nvcsw and nivcsw, which
 * __schedule raises before it traces the switch) grew by, less `seen` (1 for
 * the switch-out being traced now, of that kind). They join its process's
 * counts, which stay the kernel's whatever was missed. */
struct sc_missed {
	__u32 v, iv;
};

static __always_inline struct sc_missed missed_switches(struct sc_proc *p, struct sc_thread *t,
						       struct task_struct *task, __u32 seen_v, __u32 seen_iv)
{
	__u32 dv = (__u32)task->nvcsw - t->nvcsw, div = (__u32)task->nivcsw - t->nivcsw;
	struct sc_missed m = { .v = dv > seen_v ? dv - seen_v : 0, .iv = div > seen_iv ? div - seen_iv : 0 };

	if (m.v)
		__sync_fetch_and_add(&p->nvcsw, m.v);
	if (m.iv)
		__sync_fetch_and_add(&p->nivcsw, m.iv);
	return m;
}

/* The gap's switches into the health counter: those the counts show, or one
 * (a switch-in: they never count it) where only the thread's state shows it. */
static __always_inline void count_gap(struct sc_missed m, bool state_says)
{
	if (m.v || m.iv)
		stat_add(SC_STAT_UNSEEN, (__u64)m.v + m.iv);
	else if (state_says)
		stat_inc(SC_STAT_UNSEEN);
}

/* What a thread did since its last event (at t->ts, its runtime then
 * t->exec), settled at this one: it ran for what its runtime grew by (the
 * kernel's own figure, exact even when switches were never delivered); the
 * rest of the interval it waited, where its state says, if it was waiting:
 * off CPU, or queued (after a preemption: charged to the preemptor too;
 * after a wakeup: for on_cpu to charge to who held the CPU). A queued wait
 * is returned, of either kind, for on_cpu's vote on who held the CPU.
 * Across switches never delivered (`m`) it was off CPU in stretches between
 * its runs, in states never seen: blocked if one of those switches was
 * voluntary, else queued; the time joins the totals, not the histograms
 * (it is not one interval) nor a preemptor (never seen). */
static __always_inline __u64 settle(struct sc_proc *p, struct sc_thread *t, __u64 exec, __u64 now, struct sc_missed m,
				    bool switched_out)
{
	struct sc_preempt_key key = { .cgroup_id = t->preempt_cgroup, .start_ns = t->start, .tgid = t->tgid };
	__u64 ran = exec > t->exec ? exec - t->exec : 0, wait;
	struct sc_preempt *v;

	if (ran)
		__sync_fetch_and_add(&p->oncpu_ns, ran);
	if (now <= t->ts + ran)
		return 0;
	wait = now - t->ts - ran;
	if (m.v || m.iv) {
		__sync_fetch_and_add(m.v ? &p->offcpu_ns : &p->runq_ns, wait);
		return 0;
	}
	if (t->state == SC_T_RUNNING) {
		/* Not a wait: it held the CPU, and its runtime (rq_clock_task) grew
		 * less than the clock. What is left is the hypervisor's steal (and
		 * the clocks' jitter): counted where its runtime is current, at a
		 * switch-out (put_prev_task updated it), so the process's time adds
		 * up to the wall clock. */
		if (switched_out)
			__sync_fetch_and_add(&p->stolen_ns, wait);
		return 0;
	}
	if (t->state == SC_T_BLOCKED) {
		add_offcpu(p, wait);
		return 0;
	}
	add_runq(p, wait);
	if (t->state == SC_T_PREEMPTED) {
		v = bpf_map_lookup_elem(&preempts, &key);
		if (v)
			__sync_fetch_and_add(&v->wait_ns, wait);
		return wait;
	}
	return wait; /* queued after a wakeup: for the caller to charge to who held the CPU */
}

static __always_inline void switch_out(struct task_struct *prev, __u64 start, struct task_struct *next, bool preempt,
				       unsigned int prev_state, __u64 now)
{
	__u32 tid = prev->pid, tgid = prev->tgid;
	struct sc_thread *t = thread_of(tid, tgid, start);
	__u64 exec = prev->se.sum_exec_runtime;
	struct sc_thread n = {
		.ts = now, .exec = exec, .start = start, .tgid = tgid, .nvcsw = prev->nvcsw, .nivcsw = prev->nivcsw
	};
	struct sc_proc *p = proc_of(tgid, start);
	/* The kernel's own rule (__schedule): nivcsw unless it blocked (a dead task's last switch is voluntary). */
	bool involuntary = !(prev_state & TASK_DEAD) && (preempt || prev_state == TASK_RUNNING);
	struct sc_missed m;

	stat_inc(SC_STAT_SWITCHES);
	if (!p)
		return;
	/* On-CPU time is the kernel's own runtime: put_prev_task brought prev's
	 * se.sum_exec_runtime up to date before this tracepoint, so what it grew
	 * by since the thread's last event is exactly what /proc/PID/schedstat
	 * and getrusage add, whether or not every switch was delivered. A gap
	 * (seen on a VM: perf and BPF alike miss a few switches and wakeups
	 * around one guest daemon's) is counted: a thread not running by its
	 * state (its switch-in never reached the tracepoint), or switches in its
	 * own counts that were never traced. */
	if (t) {
		m = missed_switches(p, t, prev, !involuntary, involuntary);
		count_gap(m, t->state != SC_T_RUNNING);
		settle(p, t, exec, now, m, true);
	}
	/* prev is still current here */
	p->cgroup_id = bpf_get_current_cgroup_id();
	if (prev_state & TASK_DEAD) {
		/* its last switch: the kernel counts it, the thread is gone */
		__sync_fetch_and_add(&p->nvcsw, 1);
		bpf_map_delete_elem(&threads, &tid);
		return;
	}
	if (involuntary) {
		__sync_fetch_and_add(&p->nivcsw, 1);
		n.state = SC_T_PREEMPTED;
		/* 0 for the idle task: nobody took the CPU (a throttled quota, or a migration) */
		if (next->pid)
			n.preempt_cgroup = BPF_CORE_READ(next, cgroups, dfl_cgrp, kn, id);
		charge_preemptor(tgid, start, next, n.preempt_cgroup);
	} else {
		__sync_fetch_and_add(&p->nvcsw, 1);
		n.state = SC_T_BLOCKED;
	}
	if (t) /* in place: an LRU update costs more than the rest of the program */
		*t = n;
	else
		put_thread(tid, &n);
}

/* The thread is on a CPU now: switched in after `prev`, or (prev NULL)
 * exiting. Its interval since its last event is settled; it runs from here.
 * A wait in the run queue after a wakeup is charged to who held the CPU:
 * the task that ran last before it (prev, as runqslower names it), unless
 * that is the idle task or a thread of its own process. Its wait joins that
 * cgroup's entry, not its count of switches (the kernel's nivcsw, exact).
 * prev votes for naming its cgroup by what it ran of the wait (its stint:
 * its runtime since it was last switched in, at most the wait), after a
 * wakeup, or after a preemption by its own cgroup: the process a thread
 * waited on longest names the cgroup, not the one that switched most. */
static __always_inline void on_cpu(struct task_struct *task, __u64 start, __u64 now, struct task_struct *prev)
{
	__u32 tid = task->pid, tgid = task->tgid;
	struct sc_thread *t = thread_of(tid, tgid, start);
	__u64 exec = task->se.sum_exec_runtime;
	struct sc_thread n = { .ts = now, .exec = exec, .start = start, .tgid = tgid, .state = SC_T_RUNNING,
			       .nvcsw = task->nvcsw, .nivcsw = task->nivcsw };
	struct sc_preempt *v = NULL;
	struct sc_missed m;
	struct sc_proc *p;
	__u64 queued, cgid, stint;

	if (!t) {
		if (prev) {
			stat_inc(SC_STAT_UNTRACKED);
			put_thread(tid, &n);
		}
		return;
	}
	p = proc_of(tgid, start);
	if (p) {
		/* Switched in while running (a switch-out never traced), or running
		 * at exit while switched out (a switch-in never traced): a gap. */
		m = missed_switches(p, t, task, 0, 0);
		count_gap(m, (t->state == SC_T_RUNNING) != !prev);
		queued = settle(p, t, exec, now, m, false);
		if (queued && prev && prev->pid && prev->tgid != tgid) {
			cgid = BPF_CORE_READ(prev, cgroups, dfl_cgrp, kn, id);
			if (t->state == SC_T_QUEUED) {
				v = holder(tgid, start, cgid);
				if (v)
					__sync_fetch_and_add(&v->wait_ns, queued);
			} else if (t->state == SC_T_PREEMPTED && cgid == t->preempt_cgroup) {
				v = holder(tgid, start, cgid);
			}
			if (v) {
				stint = prev->se.sum_exec_runtime - prev->se.prev_sum_exec_runtime;
				vote(v, prev, (stint < queued ? stint : queued) / 1000);
			}
		}
	}
	*t = n; /* its preemptor, if any, had its wait in settle */
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sc_switch, bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
{
	/* BTF pointers: plain (CO-RE relocated) loads, no probe-read helper calls */
	__u64 out = traced_start(prev), in = traced_start(next), now;

	if (!out && !in) /* the common case on a busy host: a few ns */
		return 0;
	now = bpf_ktime_get_ns();
	if (out)
		switch_out(prev, out, next, preempt, prev_state, now);
	if (in)
		on_cpu(next, in, now, prev);
	return 0;
}

static __always_inline void wakeup(struct task_struct *p, bool fresh)
{
	__u32 tid, tgid = p->tgid;
	struct sc_thread n = {
		.state = SC_T_QUEUED, .exec = p->se.sum_exec_runtime, .nvcsw = p->nvcsw, .nivcsw = p->nivcsw
	};
	struct sc_missed m = {};
	struct sc_thread *t;
	struct sc_proc *proc;
	__u64 now, start = traced_start(p);

	if (!start)
		return;
	tid = p->pid;
	now = bpf_ktime_get_ns();
	t = fresh ? NULL : thread_of(tid, tgid, start);
	if (t) {
		proc = proc_of(tgid, start);
		if (proc) /* switches since its last event, never traced */
			m = missed_switches(proc, t, p, 0, 0);
		/* A wakeup of a running or already queued thread (one still on its
		 * CPU as it blocks, or runnable) changes nothing, unless it switched
		 * out unseen since its last event. */
		if (t->state != SC_T_BLOCKED && !m.v && !m.iv)
			return;
		count_gap(m, n.exec > t->exec); /* it blocked, or ran, unseen */
		if (proc)
			settle(proc, t, n.exec, now, m, false);
	}
	n.ts = now;
	n.start = start;
	n.tgid = tgid;
	if (t)
		*t = n;
	else
		put_thread(tid, &n);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sc_wakeup, struct task_struct *p)
{
	wakeup(p, false);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(sc_wakeup_new, struct task_struct *p)
{
	wakeup(p, true);
	return 0;
}

/* A thread exits: what it ran is settled now, its runtime as of the kernel's
 * last update (a tick behind at most). Its last switch-out, when delivered,
 * adds the rest; were it not delivered (the tracepoint skips some switches),
 * all the thread ran since its last event would be lost. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(sc_exit, struct task_struct *task)
{
	__u64 start = traced_start(task);

	if (start)
		on_cpu(task, start, bpf_ktime_get_ns(), NULL);
	return 0;
}

/* An exec: the process runs another program now (its cgroup read again
 * too: a launcher may have moved itself just before). */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(sc_exec, struct task_struct *task)
{
	__u64 start = traced_start(task);
	struct sc_proc *p;

	if (!start)
		return 0;
	p = proc_of(task->tgid, start);
	if (p) {
		__sync_fetch_and_add(&p->execs, 1);
		p->cgroup_id = bpf_get_current_cgroup_id();
	}
	return 0;
}

/* A move to another cgroup (cgroup.procs written: systemd-run --scope, a
 * CPU manager, a container runtime), traced once per process moved with
 * its leader, or per thread moved alone. */
SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(sc_cgroup_move, struct cgroup *dst, const char *path, struct task_struct *task, bool threadgroup)
{
	__u64 start = traced_start(task);
	struct sc_proc *p;

	if (!start)
		return 0;
	p = proc_of(task->tgid, start);
	if (p)
		__sync_fetch_and_add(&p->moves, 1);
	return 0;
}
