// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * memtrace: uprobes on the CUDA runtime and driver: copies, allocations,
 * host registrations, synchronisation waits and launches.
 *
 * Two generic programs (entry, return) serve every symbol of both layers
 * but launches; the bpf_cookie says what each symbol is and where it keeps
 * its arguments (memtrace.h). Each completed call is one record on the
 * `events` ring, submitted without wakeup (user space drains it on a
 * timer: wakeups from uprobe context lose hits on current kernels); a call
 * the ring cannot take is counted in `lost`, so user space's totals stay
 * exact. Launches are counted in the kernel by an entry-only probe (and,
 * while a timeline is recorded, timed by a return probe: launches.bpf.h).
 *
 * A tracepoint on mmap holds a process (SIGSTOP) that maps the code of a
 * CUDA library whose inode has no probes yet (or whose executable was not
 * yet checked for a statically linked runtime), so user space can attach
 * before the library's first instruction runs; user space then continues it
 * (once no other agent holds it), and a guardian process continues every
 * hold older than the limit, and all of them if the agent dies. A
 * terminal's foreground job is never held (a shell would report it stopped).
 *
 * This file holds the programs; each concern's maps and helpers are in a
 * header of its own: inflight.bpf.h (entry/return pairing), process.bpf.h
 * (who a process is, its notice), launches.bpf.h (launch and trap counts,
 * launch sampling), events.bpf.h (the ring and `lost`), copyargs.bpf.h
 * (a copy's arguments and descriptors), batch.bpf.h (batch copies),
 * stacks.bpf.h and pystack.bpf.h (call stacks, Python frames), holds.bpf.h
 * (holding a process at mmap, the exit notice). memtrace.h is the layout
 * user space reads; common.bpf.h what every sensor shares.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "memtrace.h"
#define STAT_SLOTS MT_STAT_COUNT
#include "common.bpf.h"
#include "uargs.h"
#include "inflight.bpf.h"
#include "process.bpf.h"
#include "launches.bpf.h"
#include "events.bpf.h"
#include "copyargs.bpf.h"
#include "batch.bpf.h"
#include "stacks.bpf.h"
#include "holds.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by user space before load: take the caller's stack at copies and memory calls (memtrace.h). */
const volatile bool capture_stacks = false;

/*
 * Entry of every probed call but launches: stash what the return needs.
 * A driver call made by the runtime on the same thread is the runtime
 * call's own work: it is counted once, at the runtime layer.
 */
SEC("uprobe")
int BPF_KPROBE(mt_enter)
{
	__u64 id = current_id();
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 layer = ck(cookie, MT_CK_LAYER_SHIFT) & 1;
	__u32 family = ck(cookie, MT_CK_FAMILY_SHIFT) & 7;
	__u64 sp = PT_REGS_SP(ctx);
	__u32 n;
	__u64 key, rkey;
	struct inflight f = {}, *outer;
	struct args a = {};

	if (!is_traced(id >> 32))
		return 0;
	count_traps(id, 2); /* this entry, and the return probe's */
	launch_interval(id >> 32);
	if (layer == MT_LAYER_DRIVER) {
		rkey = ((__u64)(__u32)id << 1) | MT_LAYER_RUNTIME;
		if (find_inflight(rkey)) {
			stat_inc(MT_STAT_NESTED);
			return 0;
		}
	}
	/* A call of this layer already in flight on this thread: if its frame
	 * is above ours (the stack grows down) we run inside it, as its own
	 * work (a cudaMemcpy made of cudaMemcpyAsync and a wait): count the
	 * outer call once and leave its entry alone. Otherwise its return was
	 * never seen (probes attached while it ran): replace it, counted. */
	key = ((__u64)(__u32)id << 1) | layer;
	outer = find_inflight(key);
	if (outer) {
		if (sp < outer->sp) {
			stat_inc(MT_STAT_NESTED_SAME);
			return 0;
		}
		stat_inc(MT_STAT_UNRETURNED);
	}

	load_args(ctx, &a);
	f.cookie = cookie;
	n = ck(cookie, MT_CK_BYTES_SHIFT);
	if (n)
		f.bytes = arg_at(&a, n);
	n = ck(cookie, MT_CK_MUL_SHIFT);
	if (n)
		f.bytes *= arg_at(&a, n);
	f.stream = arg_at(&a, ck(cookie, MT_CK_STREAM_SHIFT));
	if (family == MT_FAM_COPY) {
		f.direction = copy_args(&f, &a, cookie);
	} else if (family == MT_FAM_MEM) {
		f.dst = arg_at(&a, ck(cookie, MT_CK_DST_SHIFT));
		f.src = arg_at(&a, ck(cookie, MT_CK_DIRARG_SHIFT)); /* output pointer */
	}

	/* Copies and allocations (the memory calls that write an address or
	 * handle back): frees and the like have no site worth a stack. */
	if (capture_stacks && (family == MT_FAM_COPY || (family == MT_FAM_MEM && ck(cookie, MT_CK_DIRARG_SHIFT))))
		f.stack = take_stack(ctx, id >> 32);
	f.sp = sp;
	f.ts_ns = bpf_ktime_get_ns();
	if (!put_inflight(key, &f))
		stat_inc(MT_STAT_INFLIGHT_FULL);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(mt_return)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 id = current_id();
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 key = ((__u64)(__u32)id << 1) | (ck(cookie, MT_CK_LAYER_SHIFT) & 1);
	__s32 ret = (__s32)PT_REGS_RC(ctx);
	struct mt_totals_key tk = {};
	struct inflight *f;
	__u64 dst, aux, src, start;

	f = find_inflight(key);
	if (!f)
		return 0; /* nested driver call, or entry not seen */
	if (f->cookie != cookie || PT_REGS_SP(ctx) < f->sp)
		return 0; /* a call nested in the one in flight (below its frame): leave it */
	start = current_start();
	introduce(id, start);
	if (ck(cookie, MT_CK_DIRSRC_SHIFT) == MT_DIRSRC_BATCH && (ck(cookie, MT_CK_FAMILY_SHIFT) & 7) == MT_FAM_COPY) {
		batch_return(id, start, cookie, f, ret, now - f->ts_ns);
		drop_inflight(key);
		return 0;
	}
	if (ck(cookie, MT_CK_DIRSRC_SHIFT) == MT_DIRSRC_BATCH3D && (ck(cookie, MT_CK_FAMILY_SHIFT) & 7) == MT_FAM_COPY) {
		batch3d_return(id, start, cookie, f, ret, now - f->ts_ns);
		drop_inflight(key);
		return 0;
	}
	dst = f->dst;
	aux = f->stream;
	src = (ck(cookie, MT_CK_FAMILY_SHIFT) & 7) == MT_FAM_COPY ? f->src : 0;
	if ((ck(cookie, MT_CK_FAMILY_SHIFT) & 7) == MT_FAM_SYNC) {
		__u32 i = (__u32)id & (NSLOTS - 1);
		struct mt_first_launch *fl = bpf_map_lookup_elem(&first_launch, &i);

		if (fl && fl->tid == (__u32)id) {
			src = fl->ts; /* launched since its last wait: when it began */
			fl->ts = 0;
		}
	}
	if ((ck(cookie, MT_CK_FAMILY_SHIFT) & 7) == MT_FAM_MEM && ret == 0) {
		/* What the call wrote back: the new address or handle, and
		 * the pitch of a pitched allocation. */
		if (f->src)
			bpf_probe_read_user(&dst, sizeof(dst), (void *)f->src);
		if (ck(cookie, MT_CK_DIRSRC_SHIFT) & MT_MEM_AUX_DEREF)
			bpf_probe_read_user(&aux, sizeof(aux), (void *)f->stream);
	}

	if (queue_event(id, start, cookie, f->ts_ns, now - f->ts_ns, f->bytes, aux, dst, src, ret, f->direction, 0,
		       f->stack)) {
		stat_inc(MT_STAT_EVENTS);
	} else {
		tk.start_ns = start;
		tk.pid = id >> 32;
		tk.api = cookie & 0xffff;
		tk.direction = f->direction;
		count_lost(&tk, f->bytes, ret, now - f->ts_ns, true);
	}
	drop_inflight(key);
	return 0;
}

/*
 * Kernel and graph launches: the hottest calls of a training loop. One
 * entry probe on the driver's launch symbols and a counter here: every
 * runtime launch reaches the driver's (the recorded traces show each
 * cudaLaunchKernel making exactly one cuLaunchKernel), so counting there
 * counts each launch once without a probe on the runtime or a return.
 */
SEC("uprobe")
int BPF_KPROBE(mt_launch)
{
	__u64 id = current_id();
	struct mt_totals_key tk = {};
	__u64 one = 1, *c;

	__u32 slot = (__u32)id & (NSLOTS - 1), tgid = id >> 32;
	struct mt_first_launch *fl;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	bool own_link = (cookie >> MT_CK_OWN_SHIFT) & 1;
	struct mt_launch_sample *sample;

	if (!is_traced(tgid))
		return 0;
	/* Each launch is counted by one link: the process's own once it has one. */
	sample = launch_own_of(tgid);
	if (own_link != (sample != NULL))
		return 0;
	if (sample)
		__sync_fetch_and_add(&sample->pending, 1);
	fl = bpf_map_lookup_elem(&first_launch, &slot);
	if (fl && (fl->tid != (__u32)id || !fl->ts)) {
		fl->tid = (__u32)id;
		fl->ts = bpf_ktime_get_ns();
	}
	tk.start_ns = current_start();
	tk.pid = id >> 32;
	tk.api = cookie & 0xffff;
	c = bpf_map_lookup_elem(&counts, &tk);
	if (c) {
		__sync_fetch_and_add(c, 1);
		if (launch_events && !sample) /* a sampled process's launches stay an estimate: no slices */
			launch_enter(ctx, id, tk.start_ns, cookie);
		return 0;
	}
	introduce(id, tk.start_ns); /* its first launch of this api: maybe its first event */
	if (launch_events && !sample)
		launch_enter(ctx, id, tk.start_ns, cookie);
	if (bpf_map_update_elem(&counts, &tk, &one, BPF_NOEXIST)) {
		c = bpf_map_lookup_elem(&counts, &tk); /* another thread made it */
		if (c)
			__sync_fetch_and_add(c, 1);
		else
			stat_inc(MT_STAT_COUNTS_FULL);
	}
	return 0;
}

/* A launch's return, attached only while a timeline is recorded
 * (launch_events): its record, with its host-side duration. */
SEC("uretprobe")
int BPF_KRETPROBE(mt_launch_return)
{
	__u64 now = bpf_ktime_get_ns();

	if (launch_events)
		launch_return(now, current_id(), bpf_get_attach_cookie(ctx), (__s32)PT_REGS_RC(ctx));
	return 0;
}

/* Attached by the agent to a function of its own, filtered to itself, to
 * time what a trap costs on this host (memtrace/runtime/overhead.py). */
SEC("uprobe")
int BPF_KPROBE(mt_calibrate)
{
	return 0;
}

/*
 * ld.so maps a library's code with PROT_EXEC before running any of it.
 * When that file is a CUDA library, or libnccl with hold_nccl (by its own
 * name, not the path that led to it), and either it or the executable is
 * new to user space, stop the process: the stop lands as mmap returns,
 * before the library's code runs, and user space attaches and continues it.
 */
SEC("tracepoint/syscalls/sys_enter_mmap")
int mt_mmap(struct trace_event_raw_sys_enter *ctx)
{
	__u64 id = current_id();
	long prot = ctx->args[2], fd = ctx->args[4];
	struct task_struct *task;
	struct file **fds, *file = NULL;
	const unsigned char *name;
	char base[16] = {};

	if (!hold_libraries || !(prot & PROT_EXEC) || fd < 0 || !is_traced(id >> 32))
		return 0;
	if (agent_tgid && id >> 32 == agent_tgid)
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	fds = BPF_CORE_READ(task, files, fdt, fd);
	if (!fds || bpf_core_read(&file, sizeof(file), &fds[fd & 0xfffff]) || !file)
		return 0;
	name = BPF_CORE_READ(file, f_path.dentry, d_name.name);
	if (bpf_probe_read_kernel_str(base, sizeof(base), name) <= 0)
		return 0;
	if (!has_prefix(base, "libcuda.so", 10) && !has_prefix(base, "libcudart.so", 12) &&
	    !(hold_nccl && has_prefix(base, "libnccl.so", 10)))
		return 0;
	if (known(file, id >> 32) && known(BPF_CORE_READ(task, mm, exe_file), id >> 32))
		return 0;
	/* `memtrace run` waits for its command without job control, so its
	 * own processes are held even in the foreground. */
	hold(MT_CTL_MAP, id, fd, !filter_pids && in_foreground(task) ? MT_HOLD_FOREGROUND : MT_HOLD_HELD);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(mt_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid, ctgid;
	__u8 one = 1;

	if (BPF_CORE_READ(parent, tgid) == BPF_CORE_READ(child, tgid))
		return 0; /* a thread */
	ptgid = ns_tgid_of(parent);
	ctgid = ns_tgid_of(child);
	if (!ctgid)
		return 0; /* outside the agent's pid namespace */
	bpf_map_update_elem(&fresh, &ctgid, &one, BPF_ANY);
	if (!filter_pids)
		return 0;
	if (bpf_map_lookup_elem(&traced, &ptgid))
		bpf_map_update_elem(&traced, &ctgid, &one, BPF_ANY);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(mt_exit, struct task_struct *p)
{
	__u64 id = current_id();
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u32 tgid = id >> 32, tid = (__u32)id, host_tgid;
	struct mt_proc_key pk = {};
	__u64 key;

	/* A thread that dies inside a call never returns: release its
	 * entries and count the calls that will never complete. */
	key = ((__u64)tid << 1) | MT_LAYER_RUNTIME;
	if (drop_inflight(key))
		stat_inc(MT_STAT_ABANDONED);
	key = ((__u64)tid << 1) | MT_LAYER_DRIVER;
	if (drop_inflight(key))
		stat_inc(MT_STAT_ABANDONED);
	if (launch_events)
		bpf_map_delete_elem(&launch_entries, &tid);

	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0; /* other threads of the process live on */
	if (!is_traced(tgid))
		return 0;
	hold(MT_CTL_EXIT, id, -1, MT_HOLD_NONE);
	pk.start_ns = current_start();
	pk.pid = tgid;
	bpf_map_delete_elem(&seen, &pk); /* its notice is out: keep the room for the living */
	bpf_map_delete_elem(&launch_own, &tgid);
	bpf_map_delete_elem(&launch_window, &tgid);
	host_tgid = bpf_get_current_pid_tgid() >> 32;
	bpf_map_delete_elem(&mt_held, &host_tgid);
	if (filter_pids)
		bpf_map_delete_elem(&traced, &tgid);
	return 0;
}
