/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The records of completed calls (memtrace.bpf.c): the `events` ring, and
 * `lost`, where a call the ring cannot take is counted so totals stay exact.
 */
#ifndef __MEMTRACE_EVENTS_BPF_H
#define __MEMTRACE_EVENTS_BPF_H

#include "common.bpf.h"

/* Calls whose record the ring could not take, keyed like the records (memtrace.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, struct mt_totals_key);
	__type(value, struct mt_totals);
} lost SEC(".maps");

/* One record per completed call (struct mt_event); user space sets its size. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} events SEC(".maps");

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

/* Queue one record of a call (or one copy of a batch call); false if the ring had no room. */
static __always_inline bool queue_event(__u64 id, __u64 start, __u64 cookie, __u64 ts, __u64 dur, __u64 bytes,
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

#endif /* __MEMTRACE_EVENTS_BPF_H */
