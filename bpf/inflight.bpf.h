/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Calls in flight (memtrace.bpf.c): what an entry stashes for its return,
 * by thread and layer, in lock-free slots with a hash for collisions.
 */
#ifndef __MEMTRACE_INFLIGHT_BPF_H
#define __MEMTRACE_INFLIGHT_BPF_H

#include "common.bpf.h"

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

#endif /* __MEMTRACE_INFLIGHT_BPF_H */
