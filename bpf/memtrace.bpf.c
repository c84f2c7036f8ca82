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
 * exact. Launches are counted in the kernel by an entry-only probe.
 *
 * A tracepoint on mmap holds a process (SIGSTOP) that maps the code of a
 * CUDA library whose inode has no probes yet (or whose executable was not
 * yet checked for a statically linked runtime), so user space can attach
 * before the library's first instruction runs; user space then continues it
 * (once no other agent holds it), and a guardian process continues every
 * hold older than the limit, and all of them if the agent dies. A
 * terminal's foreground job is never held (a shell would report it stopped).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "memtrace.h"
#include "uargs.h"
#include "maps.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SIGSTOP 19

/* Set by user space before load. */
const volatile bool filter_pids = false; /* only processes in `traced` */
const volatile bool hold_libraries = true;
/* Hold for a newly mapped libnccl too (the NCCL sensor is on): its probes
 * go in before the library's first collective. */
const volatile bool hold_nccl = false;
/* The agent's own tgid: never held, since a stopped agent could not
 * continue itself (it may map a CUDA library, e.g. through NVML). */
const volatile __u32 agent_tgid = 0;
/* The agent's pid namespace (nsfs dev, inode); 0: the host's. Processes are
 * named by their pids there, and a process it cannot name is not traced
 * (nor held: the agent could not continue it). */
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;
/* Take the caller's stack at copies and memory calls (memtrace.h). */
const volatile bool capture_stacks = false;

#define MAX_PROCESSES 10240
#define MAX_INFLIGHT 65536

struct inflight {
	__u64 ts_ns;
	__u64 cookie;
	__u64 bytes;
	__u64 stream; /* or the auxiliary argument (mem) */
	__u64 dst;    /* or the pointer/handle argument (mem) */
	__u64 src;    /* or the output pointer's address (mem) */
	__u8 direction;
	__u64 sp;    /* stack pointer at entry: tells a nested call from a stale entry */
	__u64 sizes; /* batch copies: the sizes array (bytes holds the count) */
	__u64 stack; /* key in `stack_frames`; 0: none */
};

/*
 * Calls in flight, keyed by tid << 1 | layer. The hot path uses `slots`, an
 * array indexed by the key's low bits: a slot is claimed with one
 * compare-and-swap and released with a store, no lock and no allocation
 * (a hash update and delete per call cost more than the rest of the
 * program). Two threads whose keys share a slot at the same moment are
 * rare; the second one goes to the `inflight` hash, and `overflow` says
 * whether any entry is there at all, so the common path never looks.
 */
#define NSLOTS 65536

struct mt_slot {
	__u64 owner; /* key + 1; 0: free */
	struct inflight f;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NSLOTS);
	__type(key, __u32);
	__type(value, struct mt_slot);
} slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INFLIGHT);
	__type(key, __u64); /* tid << 1 | layer */
	__type(value, struct inflight);
} inflight SEC(".maps");

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

/* Entries now in `inflight` (slot collisions), one counter. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __s64);
} overflow SEC(".maps");

static __always_inline struct mt_slot *slot_of(__u64 key)
{
	__u32 i = key & (NSLOTS - 1);

	return bpf_map_lookup_elem(&slots, &i);
}

static __always_inline __s64 *overflow_count(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&overflow, &zero);
}

/* The call in flight on this thread and layer, or NULL. */
static __always_inline struct inflight *find_inflight(__u64 key)
{
	struct mt_slot *s = slot_of(key);
	__s64 *n;

	if (s && s->owner == key + 1)
		return &s->f;
	n = overflow_count();
	if (n && *n > 0)
		return bpf_map_lookup_elem(&inflight, &key);
	return NULL;
}

/* Record a call in flight; false if there was no room. */
static __always_inline bool put_inflight(__u64 key, const struct inflight *f)
{
	struct mt_slot *s = slot_of(key);
	__s64 *n;
	__u64 was;

	if (s) {
		was = __sync_val_compare_and_swap(&s->owner, 0, key + 1);
		if (was == 0 || was == key + 1) {
			s->f = *f;
			return true;
		}
	}
	n = overflow_count();
	if (bpf_map_update_elem(&inflight, &key, f, BPF_ANY))
		return false;
	if (n)
		__sync_fetch_and_add(n, 1);
	return true;
}

/* Release this thread's call on this layer; true if there was one. */
static __always_inline bool drop_inflight(__u64 key)
{
	struct mt_slot *s = slot_of(key);
	__s64 *n;

	if (s && s->owner == key + 1) {
		s->owner = 0;
		return true;
	}
	n = overflow_count();
	if (n && *n > 0 && bpf_map_delete_elem(&inflight, &key) == 0) {
		__sync_fetch_and_add(n, -1);
		return true;
	}
	return false;
}

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, struct mt_totals_key);
	__type(value, struct mt_totals);
} lost SEC(".maps");

/* Launches per (pid, api): counted here, no event (the hot path). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, struct mt_totals_key);
	__type(value, __u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MT_STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} events SEC(".maps");

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

/* Inodes user space has dealt with: CUDA libraries with probes, and
 * executables checked for a statically linked runtime. A process opening
 * an attached library from a checked executable needs no hold. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct mt_inode_key);
	__type(value, __u8);
} attached SEC(".maps");

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

/* The stacks of calls, by the hash of their frames (memtrace.h); user space
 * reads and deletes them. Allocated as used, not up front. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_STACKS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, struct mt_stack);
} stack_frames SEC(".maps");

/* Where a stack is taken: half a KB is more than the BPF stack can spare. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mt_stack);
} stack_scratch SEC(".maps");

/* Processes whose interpreter user space has found (memtrace.h), by tgid. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct mt_py_proc);
} py_procs SEC(".maps");

/* Code objects of new stacks, named in the kernel while their process
 * lives (memtrace.h); user space reads and deletes them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_PY_CODES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mt_py_code_key);
	__type(value, struct mt_py_code);
} py_codes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mt_py_code);
} py_code_scratch SEC(".maps");

/* Each calling thread's state, as the last walk found it: a thread then
 * takes two or three reads to find it again (py_thread_check), not two for
 * each thread state listed before it (a process's main thread comes last,
 * after every thread it started). Checked at each use: a state deleted
 * since, or a pid used again, is looked for afresh. */
struct py_thread {
	__u64 start_ns; /* the process's (struct mt_proc_key) */
	__u64 tstate;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MT_PY_THREADS_KEPT);
	__type(key, __u64); /* pid_tgid, the kernel's own ids */
	__type(value, struct py_thread);
} py_threads SEC(".maps");

/* The Python walk's state: in a map, not on the BPF stack (a uprobe
 * program and the calls below it share 512 bytes of stack). */
struct py_scratch {
	__u64 want;  /* the calling thread's id */
	__u64 cur;   /* the thread state looked at, then the frame */
	__u64 found; /* the calling thread's state */
	__u64 base;  /* the address of win[0]; 0: win holds nothing */
	__u32 have;  /* the bytes of win read from there */
	__u32 size;  /* bytes read of a frame */
	__u32 reads; /* of the process's memory, this walk */
	__u32 frames; /* frames walked, this walk */
	__u64 thread_key;
	struct py_thread thread;
	__u32 thread_reads; /* of the process's memory to find the thread's state, this walk */
	__u32 pad;
	struct mt_py_code_key key;
	/* Frames read from the process: one, or (3.11+) a frame's page up to
	 * its end, where its callers' frames lie. Fields are taken at
	 * (offset & (MT_PY_WINDOW - 1)) + (field & 0x7f): the slack keeps every
	 * such read inside. */
	__u8 win[MT_PY_WINDOW + 128 + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_scratch);
} py_scratch_map SEC(".maps");

static __always_inline __u64 mix(__u64 h, __u64 w)
{
	h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
	return h ^ (h >> 29);
}

/* The return address of a function at its entry: the caller's frame. */
static __always_inline __u64 entry_return_address(struct pt_regs *ctx)
{
#if defined(__TARGET_ARCH_x86)
	__u64 ret = 0;

	bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP(ctx));
	return ret;
#else
	return PT_REGS_RET(ctx); /* the link register */
#endif
}

static __always_inline __u64 current_start(void);

/* Read a pointer-sized word of the interpreter's state; 0 when unreadable. */
static __always_inline __u64 py_word(__u64 base, __u16 off)
{
	__u64 v = 0;

	if (bpf_probe_read_user(&v, sizeof(v), (void *)(base + off)))
		return 0;
	return v;
}

/* The calling thread's id as its interpreter recorded it (enum mt_py_match). */
static __always_inline __u64 py_thread_id(__u8 match)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct pid *p;
	struct upid u;
	__u32 level;

	if (match == MT_PY_MATCH_NATIVE_TID) {
		/* gettid() as the process sees it: its own (innermost) pid namespace */
		p = BPF_CORE_READ(task, thread_pid);
		if (!p)
			return 0;
		level = BPF_CORE_READ(p, level);
		if (bpf_core_read(&u, sizeof(u), &p->numbers[level & 7]))
			return 0;
		return u.nr;
	}
#if defined(__TARGET_ARCH_x86)
	if (match == MT_PY_MATCH_PTHREAD)
		return BPF_CORE_READ(task, thread.fsbase); /* glibc's pthread_self() */
#endif
	return 0;
}

/* The calling thread's Python frames into `s`, when its process runs an
 * interpreter user space has described (memtrace.h). Reads the thread
 * states and frames of the interpreter, never the memory being copied. */
/* What the walk's steps (bpf_loop callbacks, or a loop) share: pointers,
 * which only the stack may hold. */
struct py_walk {
	struct mt_py_proc *py;
	struct mt_stack *s;
	struct py_scratch *x;
};

/* One thread state: the calling thread's? 1 stops the search. */
static __always_inline long py_find_step(struct py_walk *w)
{
	struct py_scratch *x = w->x;

	if (!x->cur)
		return 1;
	x->thread_reads += 1;
	if (py_word(x->cur, w->py->tstate_id) == x->want) {
		x->found = x->cur;
		return 1;
	}
	x->thread_reads += 1;
	x->cur = py_word(x->cur, w->py->tstate_next);
	return 0;
}

static long py_find_cb(__u32 i, void *ctx)
{
	return py_find_step(ctx);
}

/* Is `ts`, remembered, still the calling thread's listed state? One read of
 * its first bytes (its id, its neighbour, its frame), then one or two to see
 * that its neighbour (or, for the newest, the interpreter) still points at
 * it: a deleted state is unlinked, though its freed memory may still hold
 * the thread's id. Its frame (3.11, 3.12: its _PyCFrame) into *frame. */
static __always_inline bool py_thread_check(struct py_walk *w, __u64 ts, __u64 *frame)
{
	struct mt_py_proc *py = w->py;
	struct py_scratch *x = w->x;
	__u64 prev, interp;

	x->thread_reads += 1;
	if (bpf_probe_read_user(x->win, py->tstate_size, (void *)ts))
		return false;
	if (*(__u64 *)&x->win[py->tstate_id & 0xff] != x->want)
		return false;
	prev = *(__u64 *)&x->win[py->tstate_prev & 0xff];
	*frame = *(__u64 *)&x->win[py->tstate_frame & 0xff];
	if (prev) {
		x->thread_reads += 1;
		return py_word(prev, py->tstate_next) == ts;
	}
	x->thread_reads += 2;
	interp = py_word(py->runtime, py->interpreters_head);
	return interp && py_word(interp, py->interp_threads) == ts;
}

/* Where the frame at x->cur lies in x->win, read from the process unless an
 * earlier read holds it; -1 when it cannot be read. Every field walked lies
 * in a frame's first `size` bytes.
 *
 * From 3.11 a thread's frames are pushed on its own stack of memory, each
 * caller's below its callee's, so one read from the start of a frame's page
 * to its end holds a run of its callers (a read each cost about 0.35 us in
 * a VM). The read never leaves the frame's page: memory below it may be
 * another mapping, a device's registers among them, where a read is not
 * harmless. Frames elsewhere (an entry shim on the C stack, the previous
 * page, another chunk) take another read. */
static __always_inline long py_frame_at(struct py_walk *w)
{
	struct py_scratch *x = w->x;
	__u64 cur = x->cur, end = x->cur + x->size, base, len;

	if (x->base && cur >= x->base && end <= x->base + x->have)
		return cur - x->base;
	x->base = 0;
	x->reads++;
	base = cur;
	if (w->py->frames_window) {
		base = cur & ~(__u64)(MT_PY_WINDOW - 1); /* the page's start: 4 KiB or larger pages */
		if (end - base > MT_PY_WINDOW)
			base = end - MT_PY_WINDOW; /* a frame across two pages: still inside its first */
	}
	len = end - base;
	if (len > MT_PY_WINDOW || bpf_probe_read_user(x->win, len, (void *)base))
		return -1;
	x->base = base;
	x->have = len;
	return cur - base;
}

/* One frame, into the stack; 1 ends the walk (py_state says how). */
static __always_inline long py_frame_step(struct py_walk *w)
{
	struct mt_py_proc *py = w->py;
	struct mt_stack *s = w->s;
	struct py_scratch *x = w->x;
	__u64 code, instr, prev;
	__u8 *b;
	long at;
	__u32 n;

	if (!x->cur)
		return 1;
	/* The count lives in the map value, not a register, so the verifier
	 * meets one state per turn, not one per count. */
	n = s->py_nframes;
	if (n >= MT_PY_DEPTH) {
		s->py_state = MT_PY_TRUNCATED;
		return 1;
	}
	at = py_frame_at(w);
	if (at < 0) {
		s->py_state = MT_PY_FAULT;
		return 1;
	}
	x->frames++;
	b = &x->win[at & (MT_PY_WINDOW - 1)];
	prev = *(__u64 *)&b[py->frame_previous & 0x7f];
	if (py->frame_owner != MT_PY_NONE && b[py->frame_owner & 0x7f] == py->owner_cstack) {
		/* an entry shim: the frame inside it began a C call into the interpreter */
		if (n > 0)
			s->py_instr[(n - 1) & (MT_PY_DEPTH - 1)] |= MT_PY_ENTRY;
		x->cur = prev;
		return 0;
	}
	code = *(__u64 *)&b[py->frame_code & 0x7f];
	if (py->instr_size == 4)
		instr = *(__u32 *)&b[py->frame_instr & 0x7f];
	else
		instr = *(__u64 *)&b[py->frame_instr & 0x7f];
	if (!code) {
		s->py_state = MT_PY_FAULT;
		return 1;
	}
	if (py->frame_is_entry != MT_PY_NONE && b[py->frame_is_entry & 0x7f])
		instr |= MT_PY_ENTRY;
	s->py_code[n & (MT_PY_DEPTH - 1)] = code;
	s->py_instr[n & (MT_PY_DEPTH - 1)] = instr;
	s->py_nframes = n + 1;
	x->cur = prev;
	return 0;
}

static long py_frame_cb(__u32 i, void *ctx)
{
	return py_frame_step(ctx);
}

/* Without bpf_loop (before 5.17) the walk is a plain loop, shorter. */
#define MT_PY_THREADS_LOOP 32
#define MT_PY_WALK_LOOP 40
#define MT_PY_KEEP_LOOP 8

/* The calling thread's Python frames into `s`, when its process runs an
 * interpreter user space has described (memtrace.h). Reads the thread
 * states and frames of the interpreter, never the memory being copied. */
static __noinline void take_python(struct mt_stack *s, __u32 pid)
{
	struct py_walk w = {};
	struct py_scratch *x;
	struct py_thread *t;
	__u64 interp, frame;
	__u32 i, zero = 0;

	s->py_state = MT_PY_NOT_PYTHON;
	s->py_nframes = 0;
	w.py = bpf_map_lookup_elem(&py_procs, &pid);
	x = bpf_map_lookup_elem(&py_scratch_map, &zero);
	if (!w.py || !x || w.py->start_ns != current_start())
		return;
	w.s = s;
	w.x = x;
	x->want = py_thread_id(w.py->match);
	x->found = 0;
	if (!x->want) {
		s->py_state = MT_PY_NO_THREAD;
		return;
	}
	x->thread_key = bpf_get_current_pid_tgid();
	x->thread_reads = 0;
	frame = 0;
	t = bpf_map_lookup_elem(&py_threads, &x->thread_key);
	if (t && t->start_ns == w.py->start_ns && t->tstate && py_thread_check(&w, t->tstate, &frame)) {
		x->found = t->tstate;
	} else {
		/* The main interpreter's threads (subinterpreters' are not looked at). */
		interp = py_word(w.py->runtime, w.py->interpreters_head);
		x->cur = interp ? py_word(interp, w.py->interp_threads) : 0;
		x->thread_reads += interp ? 2 : 1;
		if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_loop)) {
			bpf_loop(MT_PY_THREADS, py_find_cb, &w, 0);
		} else {
			for (i = 0; i < MT_PY_THREADS_LOOP; i++)
				if (py_find_step(&w))
					break;
		}
		if (!x->found) {
			stat_add(MT_STAT_PY_THREAD_READS, x->thread_reads);
			s->py_state = MT_PY_NO_THREAD;
			return;
		}
		x->thread.start_ns = w.py->start_ns;
		x->thread.tstate = x->found;
		bpf_map_update_elem(&py_threads, &x->thread_key, &x->thread, BPF_ANY);
		x->thread_reads += 1;
		frame = py_word(x->found, w.py->tstate_frame);
	}
	stat_add(MT_STAT_PY_THREAD_READS, x->thread_reads);
	if (frame && w.py->cframe_frame != MT_PY_NONE)
		frame = py_word(frame, w.py->cframe_frame);
	x->cur = frame;
	x->base = 0;
	x->reads = 0;
	x->frames = 0;
	x->size = w.py->frame_size;
	if (x->size > MT_PY_FRAME_READ)
		x->size = MT_PY_FRAME_READ;
	s->py_state = MT_PY_WALKED;
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_loop)) {
		bpf_loop(MT_PY_WALK, py_frame_cb, &w, 0);
	} else {
		for (i = 0; i < MT_PY_WALK_LOOP; i++)
			if (py_frame_step(&w))
				break;
	}
	if (x->cur && s->py_state == MT_PY_WALKED)
		s->py_state = MT_PY_TRUNCATED;
	stat_add(MT_STAT_PY_FRAMES, x->frames);
	stat_add(MT_STAT_PY_READS, x->reads);
}

/* A str object's characters: the first (or, `tail`, the last) `cap` bytes;
 * its size in bytes and its kind into *size and *kind (0: unreadable). */
static __always_inline void py_str(struct mt_py_proc *py, __u64 str, char *dst, __u32 cap, bool tail,
				   __u32 *size, __u8 *kind)
{
	__u64 len = 0, skip = 0, n;
	__u32 state = 0, k;

	*size = 0;
	*kind = 0;
	if (!str || bpf_probe_read_user(&len, sizeof(len), (void *)(str + 16)))
		return;
	if (bpf_probe_read_user(&state, sizeof(state), (void *)(str + 32)))
		return;
	k = (state >> 2) & 7;
	if (!((state >> 5) & 1) || (k != 1 && k != 2 && k != 4) || len > (1 << 20))
		return; /* not a compact str */
	n = len * k;
	if (n > cap) {
		if (tail)
			skip = n - cap;
		n = cap;
	}
	str += ((state >> 6) & 1) ? py->ascii_size : py->compact_size;
	if (n && bpf_probe_read_user(dst, n & (2 * MT_PY_FILE_LEN - 1), (void *)(str + skip)))
		return;
	*size = len * k;
	*kind = k;
}

/* Keep what the i-th frame's code object says, unless it is kept already. */
static __always_inline long keep_step(struct py_walk *w, __u32 i)
{
	struct mt_py_proc *py = w->py;
	struct py_scratch *x = w->x;
	struct mt_py_code *c;
	__u64 code, table, n = 0;
	__u32 zero = 0;

	if (i >= w->s->py_nframes)
		return 1;
	code = w->s->py_code[i & (MT_PY_DEPTH - 1)];
	x->key.code = code;
	if (bpf_map_lookup_elem(&py_codes, &x->key))
		return 0;
	c = bpf_map_lookup_elem(&py_code_scratch, &zero);
	if (!c)
		return 1;
	c->type = py_word(code, 8);
	c->firstlineno = 0;
	bpf_probe_read_user(&c->firstlineno, sizeof(c->firstlineno), (void *)(code + py->code_firstlineno));
	py_str(py, py_word(code, py->code_name), c->name, MT_PY_NAME_LEN, false, &c->name_size, &c->name_kind);
	py_str(py, py_word(code, py->code_filename), c->file, MT_PY_FILE_LEN, true, &c->file_size, &c->file_kind);
	table = py_word(code, py->code_linetable);
	c->table_size = 0;
	if (table && !bpf_probe_read_user(&n, sizeof(n), (void *)(table + 16)) && n <= (1 << 24)) {
		c->table_size = n;
		if (n > MT_PY_TABLE_LEN)
			n = MT_PY_TABLE_LEN;
		if (n && bpf_probe_read_user(c->table, n & (2 * MT_PY_TABLE_LEN - 1), (void *)(table + 32)))
			c->table_size = 0;
	}
	bpf_map_update_elem(&py_codes, &x->key, c, BPF_NOEXIST);
	return 0;
}

static long keep_cb(__u32 i, void *ctx)
{
	return keep_step(ctx, i);
}

/* A new stack's code objects, kept while its process lives. */
static __noinline void keep_codes(struct mt_stack *s, __u32 pid)
{
	struct py_walk w = {};
	__u32 i, zero = 0;

	w.py = bpf_map_lookup_elem(&py_procs, &pid);
	w.x = bpf_map_lookup_elem(&py_scratch_map, &zero);
	if (!w.py || !w.x)
		return;
	w.s = s;
	w.x->key.start_ns = w.py->start_ns;
	w.x->key.pid = pid;
	w.x->key.pad = 0;
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_loop)) {
		bpf_loop(MT_PY_DEPTH, keep_cb, &w, 0);
	} else {
		/* the innermost few; the rest are read from the process while it lives */
		for (i = 0; i < MT_PY_KEEP_LOOP; i++)
			if (keep_step(&w, i))
				break;
	}
}

/* The caller's user stack, kept in `stack_frames`; its key, or 0 when none
 * could be taken or kept (counted). */
static __always_inline __u64 take_stack(struct pt_regs *ctx, __u32 pid)
{
	__u32 zero = 0, i, n;
	struct mt_stack *s = bpf_map_lookup_elem(&stack_scratch, &zero);
	__u64 h, ret;
	long got;
	int err;

	if (!s)
		return 0;
	/* The walk lands one slot up: ips[1] is the function itself, then
	 * its caller's caller; the caller goes back in between. */
	got = bpf_get_stack(ctx, &s->ips[1], sizeof(s->ips) - sizeof(s->ips[0]), BPF_F_USER_STACK);
	if (got <= 0) {
		stat_inc(MT_STAT_STACK_FAILED);
		return 0;
	}
	n = got / sizeof(__u64);
	ret = entry_return_address(ctx);
	s->ips[0] = s->ips[1];
	s->ips[1] = ret;
	n += 1;
	if (n > 2 && s->ips[2] == ret) {
		/* A kernel that puts the caller back itself (a function
		 * starting with push %rbp): keep one. */
		for (i = 2; i < MT_STACK_DEPTH - 1; i++) {
			if (i + 1 >= n)
				break;
			s->ips[i] = s->ips[i + 1];
		}
		n -= 1;
	}
	if (n > MT_STACK_DEPTH)
		n = MT_STACK_DEPTH;
	s->nframes = n;
	s->pid = pid;
	take_python(s, pid);
	h = mix(0x6d656d7472616365ULL, ((__u64)pid << 32) | n);
	for (i = 0; i < MT_STACK_DEPTH; i++) {
		if (i >= n)
			break;
		h = mix(h, s->ips[i]);
	}
	h = mix(h, ((__u64)s->py_state << 32) | s->py_nframes);
	for (i = 0; i < MT_PY_DEPTH; i++) {
		if (i >= s->py_nframes)
			break;
		h = mix(mix(h, s->py_code[i]), s->py_instr[i]);
	}
	if (h == 0)
		h = 1;
	stat_inc(MT_STAT_STACKS);
	if (bpf_map_lookup_elem(&stack_frames, &h))
		return h;
	/* Slots past n are left from an earlier stack: user space reads n. */
	err = bpf_map_update_elem(&stack_frames, &h, s, BPF_NOEXIST);
	if (err && err != -17 /* EEXIST: another CPU put it */) {
		stat_inc(MT_STAT_STACKS_FULL);
		return 0;
	}
	if (!err && s->py_nframes)
		keep_codes(s, pid);
	return h;
}

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

/* When the current process started (its thread group leader's start,
 * CLOCK_BOOTTIME ns): with the tgid, who the process is. Read through the
 * task's BTF pointer (5.11+; memtrace needs 5.15): two plain loads, where
 * two probe-read helper calls cost each probe about 100 ns on a small VM. */
static __always_inline __u64 current_start(void)
{
	return bpf_get_current_task_btf()->group_leader->start_boottime;
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

static __always_inline __u32 ck(__u64 cookie, __u32 shift)
{
	return (cookie >> shift) & MT_CK_NIBBLE;
}

static __always_inline __u8 dir_of_memtypes(__u32 src, __u32 dst)
{
	bool sh = src == MT_CU_MEMORYTYPE_HOST, dh = dst == MT_CU_MEMORYTYPE_HOST;
	bool sd = src == MT_CU_MEMORYTYPE_DEVICE || src == MT_CU_MEMORYTYPE_ARRAY;
	bool dd = dst == MT_CU_MEMORYTYPE_DEVICE || dst == MT_CU_MEMORYTYPE_ARRAY;

	if (src == MT_CU_MEMORYTYPE_UNIFIED || dst == MT_CU_MEMORYTYPE_UNIFIED)
		return MT_DIR_DEFAULT;
	if (sh && dd)
		return MT_DIR_H2D;
	if (sd && dh)
		return MT_DIR_D2H;
	if (sd && dd)
		return MT_DIR_D2D;
	if (sh && dh)
		return MT_DIR_H2H;
	return MT_DIR_UNKNOWN;
}

static __always_inline __u8 dir_of_kind(__u32 kind)
{
	return kind <= MT_DIR_DEFAULT ? kind : MT_DIR_UNKNOWN;
}

/* A 2D/3D descriptor, read once from user memory (only the descriptor,
 * never the memory it describes). Big enough for the largest. */
#define DESC_WORDS (MT_M3D_SIZE / 8)
struct desc {
	__u64 w[DESC_WORDS];
};

#define W(d, off) ((d)->w[(off) / 8])
#define W32(d, off) ((__u32)W(d, off)) /* a 4-byte enum at an 8-aligned offset */

/* A 3D batch's operation while it is read: mt_return's frame cannot spare
 * it (on 6.1 kernels its 200 bytes put mt_return over the 512-byte stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct desc);
} b3d_scratch SEC(".maps");

/* The host or device pointer a descriptor side names, by its memory type. */
static __always_inline __u64 side_ptr(__u32 type, __u64 host, __u64 dev)
{
	if (type == MT_CU_MEMORYTYPE_HOST)
		return host;
	if (type == MT_CU_MEMORYTYPE_DEVICE || type == MT_CU_MEMORYTYPE_UNIFIED)
		return dev;
	return 0; /* an array: no address */
}

/* Direction and pointers of a driver descriptor (CUDA_MEMCPY2D/3D), whose
 * two sides each name a memory type, a host and a device address. */
static __always_inline void desc_sides(struct inflight *f, const struct desc *d, __u32 smt, __u32 shost,
				       __u32 sdev, __u32 dmt, __u32 dhost, __u32 ddev)
{
	f->direction = dir_of_memtypes(W32(d, smt), W32(d, dmt));
	f->src = side_ptr(W32(d, smt), W(d, shost), W(d, sdev));
	f->dst = side_ptr(W32(d, dmt), W(d, dhost), W(d, ddev));
}

/* Not inlined: its descriptor buffer is then not part of mt_enter's frame,
 * which the stack walk's calls share 512 bytes of stack with. It returns
 * the direction it set, which the caller stores again: a subprogram whose
 * result is unused becomes void, and may leave a stack pointer in r0,
 * which the verifier refuses. */
static __noinline __u8 copy_args(struct inflight *f, const struct args *a, __u64 cookie)
{
	__u32 n = ck(cookie, MT_CK_DIRARG_SHIFT);
	struct desc d;

	f->dst = arg_at(a, ck(cookie, MT_CK_DST_SHIFT));
	f->src = arg_at(a, ck(cookie, MT_CK_SRC_SHIFT));
	switch (ck(cookie, MT_CK_DIRSRC_SHIFT)) {
	case MT_DIRSRC_FIXED:
		f->direction = n;
		return f->direction;
	case MT_DIRSRC_KIND:
		/* An enum is 32 bits: the ABI leaves the upper half of its
		 * register or stack slot undefined (ctypes leaves garbage). */
		f->direction = dir_of_kind((__u32)arg_at(a, n));
		return f->direction;
	case MT_DIRSRC_DESC2D:
		if (bpf_probe_read_user(&d, MT_M2D_SIZE, (void *)arg_at(a, n)))
			break;
		desc_sides(f, &d, MT_M2D_SRC_MEMTYPE_OFF, MT_M2D_SRC_HOST_OFF, MT_M2D_SRC_DEVICE_OFF,
			   MT_M2D_DST_MEMTYPE_OFF, MT_M2D_DST_HOST_OFF, MT_M2D_DST_DEVICE_OFF);
		f->bytes = W(&d, MT_M2D_WIDTH_OFF) * W(&d, MT_M2D_HEIGHT_OFF);
		return f->direction;
	case MT_DIRSRC_DESC3D:
		if (bpf_probe_read_user(&d, MT_M3D_SIZE, (void *)arg_at(a, n)))
			break;
		desc_sides(f, &d, MT_M3D_SRC_MEMTYPE_OFF, MT_M3D_SRC_HOST_OFF, MT_M3D_SRC_DEVICE_OFF,
			   MT_M3D_DST_MEMTYPE_OFF, MT_M3D_DST_HOST_OFF, MT_M3D_DST_DEVICE_OFF);
		f->bytes = W(&d, MT_M3D_WIDTH_OFF) * W(&d, MT_M3D_HEIGHT_OFF) * W(&d, MT_M3D_DEPTH_OFF);
		return f->direction;
	case MT_DIRSRC_PARMS3D:
		if (bpf_probe_read_user(&d, MT_P3D_SIZE, (void *)arg_at(a, n)))
			break;
		f->direction = dir_of_kind(W32(&d, MT_P3D_KIND_OFF));
		f->bytes = W(&d, MT_P3D_WIDTH_OFF) * W(&d, MT_P3D_HEIGHT_OFF) * W(&d, MT_P3D_DEPTH_OFF);
		f->src = W(&d, MT_P3D_SRC_PTR_OFF);
		f->dst = W(&d, MT_P3D_DST_PTR_OFF);
		return f->direction;
	case MT_DIRSRC_BATCH:
	case MT_DIRSRC_BATCH3D:
		/* dst and src are the arrays (none for 3D); BYTES named the sizes (operations) array. */
		f->sizes = f->bytes;
		f->bytes = arg_at(a, n); /* the count */
		f->direction = MT_DIR_DEFAULT;
		return f->direction;
	}
	f->direction = MT_DIR_UNKNOWN;
	return f->direction;
}

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

/* The ring could not take an event: count the call where user space
 * will add it to what it saw, so no call and no byte goes missing. */
static __always_inline void count_lost(struct mt_totals_key *tk, __u64 bytes, __s32 ret, __u64 dur, bool call)
{
	struct mt_totals zero = {}, *t;

	stat_inc(MT_STAT_DROPPED);
	t = lookup_or_try_init(&lost, tk, &zero);
	if (!t) {
		stat_inc(MT_STAT_TOTALS_FULL);
		return;
	}
	if (ret == 0)
		__sync_fetch_and_add(&t->bytes, bytes);
	if (!call)
		return; /* a further copy of a batch call: its bytes only */
	__sync_fetch_and_add(&t->calls, 1);
	if (ret != 0)
		__sync_fetch_and_add(&t->errors, 1);
	__sync_fetch_and_add(&t->duration_ns, dur);
}

/* Queue one copy record of a call; false if the ring had no room. */
static __always_inline bool queue_copy(__u64 id, __u64 start, __u64 cookie, __u64 ts, __u64 dur, __u64 bytes,
				       __u64 stream, __u64 dst, __u64 src, __s32 ret, __u8 direction, __u8 more,
				       __u64 stack)
{
	struct mt_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e)
		return false;
	e->ts_ns = ts;
	e->duration_ns = dur;
	e->bytes = bytes;
	e->stream = stream;
	e->dst = dst;
	e->src = src;
	e->start_ns = start;
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->ret = ret;
	e->api = cookie & 0xffff;
	e->direction = direction;
	e->layer = (ck(cookie, MT_CK_LAYER_SHIFT) & 1) | more;
	e->stack = stack;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return true;
}

#define BATCH_CHUNK 16

/* A batch call's key in the kernel's `lost` totals (its records' direction is default). */
static __always_inline void batch_key(struct mt_totals_key *tk, __u64 id, __u64 start, __u64 cookie)
{
	tk->start_ns = start;
	tk->pid = id >> 32;
	tk->api = cookie & 0xffff;
	tk->direction = MT_DIR_DEFAULT;
}

/* Record i of a batch call (memtrace.h): the first carries the call (its
 * duration, counted as an event queued), the others bytes only. A record the
 * ring cannot take is counted in `lost` the same way. */
static __always_inline void batch_record(struct mt_totals_key *tk, __u64 id, __u64 start, __u64 cookie,
					 const struct inflight *f, __u32 i, __u64 dur, __u64 sz, __u64 d, __u64 s,
					 __s32 ret, __u8 more)
{
	if (queue_copy(id, start, cookie, f->ts_ns, i ? 0 : dur, sz, f->stream, d, s, ret, MT_DIR_DEFAULT, more,
		       f->stack)) {
		if (i == 0)
			stat_inc(MT_STAT_EVENTS); /* calls queued: the further copies are not calls */
	} else {
		count_lost(tk, sz, ret, i ? 0 : dur, i == 0);
	}
}

/* The summed record of copies MT_BATCH_EACH..MT_BATCH_MAX-1, and the call
 * counted as truncated if it had more. */
static __always_inline void batch_rest(struct mt_totals_key *tk, __u64 id, __u64 start, __u64 cookie,
				       const struct inflight *f, __u64 n, __u64 rest, __s32 ret)
{
	if (n > MT_BATCH_MAX)
		stat_inc(MT_STAT_BATCH_TRUNCATED);
	batch_record(tk, id, start, cookie, f, MT_BATCH_EACH, 0, rest, 0, 0, ret, MT_EV_MORE | MT_EV_SUM);
}

/*
 * The return of a batch copy: one record per copy for the first
 * MT_BATCH_EACH, then one with the summed sizes of the copies up to
 * MT_BATCH_MAX (memtrace.h). The arrays are the caller's, unchanged
 * during the call; read here, once the call has succeeded.
 */
static __always_inline void batch_return(__u64 id, __u64 start, __u64 cookie, const struct inflight *f, __s32 ret,
					 __u64 dur)
{
	struct mt_totals_key tk = {};
	__u64 n = f->bytes, dsts = f->dst, srcs = f->src, sizes = f->sizes;
	__u64 d, s, sz, rest = 0, chunk[BATCH_CHUNK];
	__u32 i, j, base;

	batch_key(&tk, id, start, cookie);
	if (ret != 0 || n == 0) {
		batch_record(&tk, id, start, cookie, f, 0, dur, 0, 0, 0, ret, 0);
		return;
	}
	for (i = 0; i < MT_BATCH_EACH; i++) {
		if (i >= n)
			break;
		d = s = sz = 0;
		bpf_probe_read_user(&d, sizeof(d), (void *)(dsts + 8 * i));
		bpf_probe_read_user(&s, sizeof(s), (void *)(srcs + 8 * i));
		bpf_probe_read_user(&sz, sizeof(sz), (void *)(sizes + 8 * i));
		batch_record(&tk, id, start, cookie, f, i, dur, sz, d, s, ret, i ? MT_EV_MORE : 0);
	}
	if (n <= MT_BATCH_EACH)
		return;
	/* The rest, summed: whole chunks with one read, the tail one by one. */
	for (i = 0; i < (MT_BATCH_MAX - MT_BATCH_EACH) / BATCH_CHUNK; i++) {
		base = MT_BATCH_EACH + i * BATCH_CHUNK;
		if (base >= n)
			break;
		if (base + BATCH_CHUNK <= n) {
			if (bpf_probe_read_user(chunk, sizeof(chunk), (void *)(sizes + 8 * base)) == 0) {
				for (j = 0; j < BATCH_CHUNK; j++)
					rest += chunk[j];
			}
			continue;
		}
		for (j = 0; j < BATCH_CHUNK; j++) {
			if (base + j >= n)
				break;
			sz = 0;
			bpf_probe_read_user(&sz, sizeof(sz), (void *)(sizes + 8 * (base + j)));
			rest += sz;
		}
	}
	batch_rest(&tk, id, start, cookie, f, n, rest, ret);
}

/* One operation of a 3D batch: its bytes (0 with a CUDA array, counted),
 * and its pointers (0 for an array side). */
static __always_inline __u64 b3d_op(const struct desc *d, __u64 *dst, __u64 *src)
{
	bool ptrs = W32(d, MT_B3D_SRC_TYPE_OFF) == MT_OPERAND_POINTER && W32(d, MT_B3D_DST_TYPE_OFF) == MT_OPERAND_POINTER;

	*src = W32(d, MT_B3D_SRC_TYPE_OFF) == MT_OPERAND_POINTER ? W(d, MT_B3D_SRC_PTR_OFF) : 0;
	*dst = W32(d, MT_B3D_DST_TYPE_OFF) == MT_OPERAND_POINTER ? W(d, MT_B3D_DST_PTR_OFF) : 0;
	if (!ptrs) {
		stat_inc(MT_STAT_BATCH_ARRAY_COPIES);
		return 0;
	}
	return W(d, MT_B3D_WIDTH_OFF) * W(d, MT_B3D_HEIGHT_OFF) * W(d, MT_B3D_DEPTH_OFF);
}

/*
 * The return of a 3D batch copy: as batch_return, from the operations
 * array, each operation read into a per-CPU buffer (b3d_scratch).
 */
static __always_inline void batch3d_return(__u64 id, __u64 start, __u64 cookie, const struct inflight *f, __s32 ret,
					   __u64 dur)
{
	struct mt_totals_key tk = {};
	__u64 n = f->bytes, ops = f->sizes;
	__u64 d, s, sz, rest = 0;
	__u32 i, zero = 0;
	struct desc *op = bpf_map_lookup_elem(&b3d_scratch, &zero);

	batch_key(&tk, id, start, cookie);
	if (ret != 0 || n == 0 || !op) {
		batch_record(&tk, id, start, cookie, f, 0, dur, 0, 0, 0, ret, 0);
		return;
	}
	for (i = 0; i < MT_BATCH_EACH; i++) {
		if (i >= n)
			break;
		d = s = sz = 0;
		if (bpf_probe_read_user(op, MT_B3D_READ, (void *)(ops + MT_B3D_OP_SIZE * i)) == 0)
			sz = b3d_op(op, &d, &s);
		batch_record(&tk, id, start, cookie, f, i, dur, sz, d, s, ret, i ? MT_EV_MORE : 0);
	}
	if (n <= MT_BATCH_EACH)
		return;
	for (i = MT_BATCH_EACH; i < MT_BATCH_MAX; i++) {
		if (i >= n)
			break;
		if (bpf_probe_read_user(op, MT_B3D_READ, (void *)(ops + MT_B3D_OP_SIZE * i)) == 0)
			rest += b3d_op(op, &d, &s);
	}
	batch_rest(&tk, id, start, cookie, f, n, rest, ret);
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
	struct mt_event *e;
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

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (e) {
		e->ts_ns = f->ts_ns;
		e->duration_ns = now - f->ts_ns;
		e->bytes = f->bytes;
		e->stream = aux;
		e->dst = dst;
		e->src = src;
		e->start_ns = start;
		e->pid = id >> 32;
		e->tid = (__u32)id;
		e->ret = ret;
		e->api = cookie & 0xffff;
		e->direction = f->direction;
		e->layer = ck(cookie, MT_CK_LAYER_SHIFT) & 1;
		e->stack = f->stack;
		bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
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
		return 0;
	}
	introduce(id, tk.start_ns); /* its first launch of this api: maybe its first event */
	if (bpf_map_update_elem(&counts, &tk, &one, BPF_NOEXIST)) {
		c = bpf_map_lookup_elem(&counts, &tk); /* another thread made it */
		if (c)
			__sync_fetch_and_add(c, 1);
		else
			stat_inc(MT_STAT_COUNTS_FULL);
	}
	return 0;
}

/* ---- holding processes until their CUDA (or NCCL) library has probes ---- */

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

/* Attached by the agent to a function of its own, filtered to itself, to
 * time what a trap costs on this host (memtrace/runtime/overhead.py). */
SEC("uprobe")
int BPF_KPROBE(mt_calibrate)
{
	return 0;
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
