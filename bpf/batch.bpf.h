/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The return of a batch copy (memtrace.bpf.c): one record per copy for the
 * first MT_BATCH_EACH, then one with the summed sizes (memtrace.h).
 */
#ifndef __MEMTRACE_BATCH_BPF_H
#define __MEMTRACE_BATCH_BPF_H

#include "common.bpf.h"
#include "inflight.bpf.h"
#include "events.bpf.h"
#include "copyargs.bpf.h"

/* A 3D batch's operation while it is read: mt_return's frame cannot spare
 * it (on 6.1 kernels its 200 bytes put mt_return over the 512-byte stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct desc);
} b3d_scratch SEC(".maps");

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
	if (queue_event(id, start, cookie, f->ts_ns, i ? 0 : dur, sz, f->stream, d, s, ret, MT_DIR_DEFAULT, more,
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
 * A batch call's walk, shared by the steps below: bpf_loop callbacks
 * (5.17+), each verified once, where plain loops had the verifier walk every
 * turn (about 550,000 instructions for mt_return, most of its load time).
 * Pointers and the call's facts live here, on the caller's stack.
 */
struct batch_walk {
	struct mt_totals_key tk;
	const struct inflight *f;
	struct desc *op; /* 3D: the operation being read (b3d_scratch) */
	__u64 id, start, cookie, dur;
	__u64 rest; /* summed sizes of copies MT_BATCH_EACH.. */
	__s32 ret;
};

/* Copy i of a 1D batch: its own record. 1 ends the walk. */
static __always_inline long batch_each_step(struct batch_walk *w, __u32 i)
{
	const struct inflight *f = w->f;
	__u64 dsts = f->dst, srcs = f->src, sizes = f->sizes, d = 0, s = 0, sz = 0;

	if (i >= f->bytes)
		return 1;
	bpf_probe_read_user(&d, sizeof(d), (void *)(dsts + 8 * i));
	bpf_probe_read_user(&s, sizeof(s), (void *)(srcs + 8 * i));
	bpf_probe_read_user(&sz, sizeof(sz), (void *)(sizes + 8 * i));
	batch_record(&w->tk, w->id, w->start, w->cookie, f, i, w->dur, sz, d, s, w->ret, i ? MT_EV_MORE : 0);
	return 0;
}

static __noinline long batch_each_cb(__u32 i, void *ctx)
{
	return batch_each_step(ctx, i);
}

/* Chunk c of the rest of a 1D batch, summed into w->rest: a whole chunk
 * with one read, the tail one by one. */
static __always_inline long batch_chunk_step(struct batch_walk *w, __u32 c)
{
	__u64 n = w->f->bytes, sizes = w->f->sizes, sz, chunk[BATCH_CHUNK];
	__u32 j, base = MT_BATCH_EACH + c * BATCH_CHUNK;

	if (base >= n)
		return 1;
	if (base + BATCH_CHUNK <= n) {
		if (bpf_probe_read_user(chunk, sizeof(chunk), (void *)(sizes + 8 * base)) == 0) {
			for (j = 0; j < BATCH_CHUNK; j++)
				w->rest += chunk[j];
		}
		return 0;
	}
	for (j = 0; j < BATCH_CHUNK; j++) {
		if (base + j >= n)
			break;
		sz = 0;
		bpf_probe_read_user(&sz, sizeof(sz), (void *)(sizes + 8 * (base + j)));
		w->rest += sz;
	}
	return 1;
}

static __noinline long batch_chunk_cb(__u32 c, void *ctx)
{
	return batch_chunk_step(ctx, c);
}

/*
 * Steps 0..n-1 of a walk, until one says 1: with bpf_loop where the kernel
 * has it, a plain loop before (5.15, 5.16). The plain loop's counter is
 * hidden from clang (barrier_var): knowing the first turn is taken, it
 * would jump into the loop's middle, and 6.1's check_cfg refuses a loop
 * head reached by falling through ("back-edge"); it checks this code even
 * where bpf_loop is there and the loop never runs.
 */
#define HAVE_BPF_LOOP bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_loop)
#define WALK(n, cb, w)                                         \
	do {                                                   \
		__u32 _i;                                      \
		if (HAVE_BPF_LOOP) {                           \
			bpf_loop((n), (cb), (w), 0);           \
		} else {                                       \
			for (_i = 0; _i < (n); _i++) {         \
				barrier_var(_i);               \
				if ((cb)(_i, (w)))             \
					break;                 \
			}                                      \
		}                                              \
	} while (0)

/*
 * The return of a batch copy: one record per copy for the first
 * MT_BATCH_EACH, then one with the summed sizes of the copies up to
 * MT_BATCH_MAX (memtrace.h). The arrays are the caller's, unchanged
 * during the call; read here, once the call has succeeded.
 */
static __always_inline void batch_return(__u64 id, __u64 start, __u64 cookie, const struct inflight *f, __s32 ret,
					 __u64 dur)
{
	struct batch_walk w = {};
	__u64 n = f->bytes;

	batch_key(&w.tk, id, start, cookie);
	if (ret != 0 || n == 0) {
		batch_record(&w.tk, id, start, cookie, f, 0, dur, 0, 0, 0, ret, 0);
		return;
	}
	w.f = f;
	w.id = id;
	w.start = start;
	w.cookie = cookie;
	w.dur = dur;
	w.ret = ret;
	WALK(MT_BATCH_EACH, batch_each_cb, &w);
	if (n <= MT_BATCH_EACH)
		return;
	WALK((MT_BATCH_MAX - MT_BATCH_EACH) / BATCH_CHUNK, batch_chunk_cb, &w);
	batch_rest(&w.tk, id, start, cookie, f, n, w.rest, ret);
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

/* Operation i of a 3D batch: its own record. */
static __always_inline long b3d_each_step(struct batch_walk *w, __u32 i)
{
	const struct inflight *f = w->f;
	struct desc *op = w->op;
	__u64 ops = f->sizes, d = 0, s = 0, sz = 0;

	if (i >= f->bytes)
		return 1;
	if (bpf_probe_read_user(op, MT_B3D_READ, (void *)(ops + MT_B3D_OP_SIZE * i)) == 0)
		sz = b3d_op(op, &d, &s);
	batch_record(&w->tk, w->id, w->start, w->cookie, f, i, w->dur, sz, d, s, w->ret, i ? MT_EV_MORE : 0);
	return 0;
}

static __noinline long b3d_each_cb(__u32 i, void *ctx)
{
	return b3d_each_step(ctx, i);
}

/* Operation MT_BATCH_EACH + k of a 3D batch, summed into w->rest. */
static __always_inline long b3d_rest_step(struct batch_walk *w, __u32 k)
{
	struct desc *op = w->op;
	__u32 i = MT_BATCH_EACH + k;
	__u64 ops = w->f->sizes, d, s;

	if (i >= w->f->bytes)
		return 1;
	if (bpf_probe_read_user(op, MT_B3D_READ, (void *)(ops + MT_B3D_OP_SIZE * i)) == 0)
		w->rest += b3d_op(op, &d, &s);
	return 0;
}

static __noinline long b3d_rest_cb(__u32 k, void *ctx)
{
	return b3d_rest_step(ctx, k);
}

/*
 * The return of a 3D batch copy: as batch_return, from the operations
 * array, each operation read into a per-CPU buffer (b3d_scratch).
 */
static __always_inline void batch3d_return(__u64 id, __u64 start, __u64 cookie, const struct inflight *f, __s32 ret,
					   __u64 dur)
{
	struct batch_walk w = {};
	__u64 n = f->bytes;
	__u32 zero = 0;

	batch_key(&w.tk, id, start, cookie);
	w.op = bpf_map_lookup_elem(&b3d_scratch, &zero);
	if (ret != 0 || n == 0 || !w.op) {
		batch_record(&w.tk, id, start, cookie, f, 0, dur, 0, 0, 0, ret, 0);
		return;
	}
	w.f = f;
	w.id = id;
	w.start = start;
	w.cookie = cookie;
	w.dur = dur;
	w.ret = ret;
	WALK(MT_BATCH_EACH, b3d_each_cb, &w);
	if (n <= MT_BATCH_EACH)
		return;
	WALK(MT_BATCH_MAX - MT_BATCH_EACH, b3d_rest_cb, &w);
	batch_rest(&w.tk, id, start, cookie, f, n, w.rest, ret);
}

#endif /* __MEMTRACE_BATCH_BPF_H */
