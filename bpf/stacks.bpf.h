/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Call stacks (memtrace.bpf.c): the caller's user stack at a call's entry,
 * with its Python frames, kept by hash in `stack_frames` (memtrace.h).
 */
#ifndef __MEMTRACE_STACKS_BPF_H
#define __MEMTRACE_STACKS_BPF_H

#include "common.bpf.h"
#include "pystack.bpf.h"

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

#endif /* __MEMTRACE_STACKS_BPF_H */
