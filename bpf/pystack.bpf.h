/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Python frames (memtrace.bpf.c): the calling thread's frames walked from
 * its interpreter's thread states, and what a new stack's code objects say,
 * kept while the process lives (memtrace.h). The layout comes from user space.
 */
#ifndef __MEMTRACE_PYSTACK_BPF_H
#define __MEMTRACE_PYSTACK_BPF_H

#include "common.bpf.h"

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

#endif /* __MEMTRACE_PYSTACK_BPF_H */
