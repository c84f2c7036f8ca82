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

#endif /* __MEMTRACE_BATCH_BPF_H */
