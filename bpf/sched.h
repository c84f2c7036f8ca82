/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The CPU sensor's shared layout: what bpf/sched.bpf.c writes into its maps
 * and memtrace/sensors/sched/abi.py reads (tests/test_sched_abi.py compiles
 * this header and checks the Python mirror against it).
 */
#ifndef MEMTRACE_SCHED_H
#define MEMTRACE_SCHED_H

/* log2 slots of microseconds: slot i counts waits of [2^i, 2^(i+1)) us
 * (slot 0 also takes 0 us); the last slot takes everything longer. */
#define SC_SLOTS 26
#define SC_COMM_LEN 16
#define SC_PF_KTHREAD 0x00200000 /* task_struct.flags: a kernel thread (include/linux/sched.h) */

/* A bitmap in front of the `traced` hash: bit (tgid % SC_FILTER_BITS) is set
 * when some traced process has that remainder, so the switches of untraced
 * processes (nearly all on a host) cost one inlined array load, no hash lookup. */
#define SC_FILTER_BITS 65536
#define SC_FILTER_WORDS (SC_FILTER_BITS / 64)

/* A process: its tgid and its start (the thread group leader's
 * start_boottime, CLOCK_BOOTTIME ns, as the CUDA sensor's struct
 * mt_proc_key): pids are reused, start times are not. `traced` maps a tgid
 * to the start of the process traced under it (__u64); user space may write
 * 0 for a process whose start it does not know, and the first process seen
 * with that tgid takes the entry. */
struct sc_proc_key {
	__u64 start_ns;
	__u32 tgid;
	__u32 pad;
};

/* Per traced process (key: struct sc_proc_key). */
struct sc_proc {
	__u64 runq_hist[SC_SLOTS];   /* run-queue latency: wakeup or preemption to switch-in */
	__u64 offcpu_hist[SC_SLOTS]; /* off-CPU: switch-out while blocked to wakeup */
	__u64 runq_ns;               /* total time runnable but waiting for a CPU */
	__u64 offcpu_ns;             /* total time blocked (sleeping, waiting for I/O or a lock) */
	__u64 oncpu_ns;              /* total time running: the kernel's se.sum_exec_runtime */
	__u64 nvcsw;                 /* voluntary switches out (blocked) */
	__u64 nivcsw;                /* involuntary switches out (preempted while runnable) */
	__u64 cgroup_id;             /* the process's own cgroup (v2), last seen */
	__u64 execs;                 /* execs since tracing began: its command and executable changed */
	__u64 moves;                 /* moves to another cgroup (any hierarchy) since tracing began */
	__u64 stolen_ns;             /* time it held a CPU without running: the hypervisor's steal, which
				      * the kernel leaves out of its runtime (switch-in to switch-out, less
				      * what its runtime grew by) */
};

/* Who took the CPU from a traced process: key (traced process, cgroup of the
 * task switched in when a traced thread was preempted; 0 when that task is the
 * CPU's idle task, as when the thread's own CPU quota throttled it; or of the
 * task of another process that held the CPU while a woken traced thread
 * waited for it). */
struct sc_preempt_key {
	__u64 cgroup_id;
	__u64 start_ns; /* the traced process's (struct sc_proc_key) */
	__u32 tgid;
	__u32 pad;
};

/* The most one vote weighs, and the most a name's margin reaches (us). */
#define SC_VOTE_CAP_US 20000

struct sc_preempt {
	__u64 count;   /* involuntary switches of the traced process in favour of this cgroup */
	__u64 wait_ns; /* run-queue wait of the traced threads that followed them, and after their
			* wakeups while this cgroup's task held the CPU */
	/* The process the cgroup is named by: of its processes seen holding the
	 * CPU a traced thread waited for, the one it waited on longest. A
	 * majority vote weighted by time (Boyer-Moore's, in us): a holder votes
	 * what it ran of the wait (its stint, at most the wait), a preemptor 1 us
	 * for taking the CPU; one vote weighs at most SC_VOTE_CAP_US, and the
	 * margin reaches at most that, so one taking over is named once it is
	 * 20 ms ahead. A shared cgroup's frequent, brief waker (a shell, an
	 * agent, a sandbox's tool) never names a spinner's share by switching
	 * more often.
	 * 0: the idle task. */
	__u32 tgid;
	char comm[SC_COMM_LEN];
	__u32 kthread; /* it is a kernel thread: named only until a user process is seen */
	__u32 votes;   /* its margin, us: 0 while no one is named */
	__u32 pad;
};

/* Health counters, one slot each in the per-CPU `stats` array. */
enum sc_stat {
	SC_STAT_SWITCHES = 0,      /* sched_switch events involving a traced thread */
	SC_STAT_PROCS_FULL = 1,    /* updates lost: `procs` map full */
	SC_STAT_THREADS_FULL = 2,  /* thread state lost: `threads` map full (LRU: an old thread evicted instead) */
	SC_STAT_PREEMPT_FULL = 3,  /* preemptions not attributed: `preempts` map full */
	SC_STAT_UNTRACKED = 4,     /* switch-ins of a traced thread with no state (started before tracing, or evicted) */
	SC_STAT_UNSEEN = 5,        /* switches of traced threads the tracepoint never delivered (at least): the
				    * switch-outs their own nvcsw/nivcsw show, or one where only a thread's state
				    * shows it (switched in twice in a row): CPU time and switch counts stay exact;
				    * the wait across the switches the counts show joins the totals, not the
				    * histograms (it is not one interval) */
	SC_STAT_COUNT = 6,
};

/* Thread states kept in `threads`. */
enum sc_tstate {
	SC_T_RUNNING = 1, /* on a CPU since ts */
	SC_T_QUEUED = 2,  /* woken at ts, waiting for a CPU */
	SC_T_PREEMPTED = 3, /* preempted at ts, waiting for a CPU */
	SC_T_BLOCKED = 4, /* switched out while not runnable at ts */
};

#endif
