/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The integer arguments of a probed function at its entry, for every
 * sensor's uprobes (memtrace.bpf.c, nccl.bpf.c): loaded once, then read by
 * 1-based index, past the registers from the stack.
 */
#ifndef __MEMTRACE_UARGS_H
#define __MEMTRACE_UARGS_H

/* The integer arguments at function entry, loaded once at constant ctx
 * offsets (the verifier refuses a ctx pointer the compiler has offset).
 * Arguments past the registers are on the stack on x86-64 (above the
 * return address); arm64 passes the first eight in x0..x7. */
struct args {
	__u64 r[8];
	__u64 sp;
};

static __always_inline void load_args(struct pt_regs *ctx, struct args *a)
{
	a->r[0] = PT_REGS_PARM1(ctx);
	a->r[1] = PT_REGS_PARM2(ctx);
	a->r[2] = PT_REGS_PARM3(ctx);
	a->r[3] = PT_REGS_PARM4(ctx);
	a->r[4] = PT_REGS_PARM5(ctx);
#if defined(__TARGET_ARCH_x86)
	a->r[5] = ctx->r9;
	a->sp = ctx->sp;
#elif defined(__TARGET_ARCH_arm64)
	a->r[5] = ((struct user_pt_regs *)ctx)->regs[5];
	a->r[6] = ((struct user_pt_regs *)ctx)->regs[6];
	a->r[7] = ((struct user_pt_regs *)ctx)->regs[7];
	a->sp = ((struct user_pt_regs *)ctx)->sp;
#else
#error "memtrace supports __TARGET_ARCH_x86 and __TARGET_ARCH_arm64"
#endif
}

/* Arguments passed in registers: past them, on the stack at entry. */
#if defined(__TARGET_ARCH_x86)
#define REG_ARGS 6
#define STACK_ARG(sp, n) ((sp) + 8 * ((n) - 6)) /* above the return address */
#else
#define REG_ARGS 8
#define STACK_ARG(sp, n) ((sp) + 8 * ((n) - 9)) /* x8 is not an argument register */
#endif

/* The n-th (1-based) argument; 0 when n is 0 or out of range. */
static __always_inline __u64 arg_at(const struct args *a, __u32 n)
{
	__u64 v = 0;

	if (n == 0 || n > 15)
		return 0;
	if (n > REG_ARGS) {
		bpf_probe_read_user(&v, sizeof(v), (void *)STACK_ARG(a->sp, n));
		return v;
	}
	return a->r[(n - 1) & 7];
}

#endif /* __MEMTRACE_UARGS_H */
