// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * memtrace NCCL sensor: uprobes on libnccl.so.2's collectives and group calls.
 *
 * Two generic programs (entry, return) serve every symbol; the bpf_cookie
 * says which collective it is and where its arguments are (nccl.h). Each
 * completed call is one record on the `events` ring, submitted without
 * wakeup (user space drains it on a timer: wakeups from uprobe context
 * lose hits); a call the ring cannot take is counted in `lost`.
 *
 * A probed call made inside another (an all-to-all built of a group of
 * sends and receives, ncclBcast calling ncclBroadcast) is the outer call's
 * own work: it is counted once, as the outer call.
 *
 * Calls between ncclGroupStart and ncclGroupEnd are only enqueued; NCCL
 * launches them at the outermost ncclGroupEnd. The group depth is kept per
 * thread (as NCCL keeps it, thread-local), each collective carries it, and
 * the group end is an event of its own: user space takes its return as the
 * moment the grouped work was issued.
 *
 * Communicators (nccl.h, enum nc_comm_kind) have a pair of programs of
 * their own and a ring of their own (`comms`): the calls that make one
 * are rare, and their record (the 128-byte ncclUniqueId) stays off the
 * collectives' path. The handle NCCL made is read through the call's
 * output argument at return; user space names the communicator and ties
 * later collectives to it by that handle.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "nccl.h"
#define STAT_SLOTS NC_STAT_COUNT
#include "common.bpf.h"
#include "uargs.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile bool filter_pids = false; /* only processes in `traced` (and their children) */

#define MAX_THREADS 65536

struct inflight {
	__u64 ts_ns;
	__u64 cookie;
	__u64 count;
	__u64 bytes;
	__u64 stream;
	__u64 comm;
	__s32 peer;
	__u32 depth;
	__u32 nested; /* probed calls now running inside this one */
	__u8 dtype;
	__u8 flags;
};

/* An entry older than this is stale (its return probe went away with a
 * detach mid-call), not an outer call: a new call replaces it. */
#define STALE_NS (60ULL * 1000000000ULL)

/* The outermost probed call in flight, by tid; LRU keeps it bounded. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_THREADS);
	__type(key, __u32);
	__type(value, struct inflight);
} inflight SEC(".maps");

/* ncclGroupStart depth per thread (NCCL's own is thread-local). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_THREADS);
	__type(key, __u32);
	__type(value, __u32);
} group_depth SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct nc_totals_key);
	__type(value, struct nc_totals);
} lost SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

/* The processes traced when filter_pids is set (nccl.h): tgid -> its
 * start; children join on fork. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, __u64);
} traced SEC(".maps");

static __always_inline bool is_traced(__u32 tgid, __u64 start)
{
	return !filter_pids || traced_as(&traced, tgid, start);
}

/* Bytes per element of an ncclDataType_t; 0 for a value NCCL did not define. */
static __always_inline __u64 dtype_size(__u32 dt)
{
	switch (dt) {
	case NC_INT8:
	case NC_UINT8:
	case NC_FLOAT8E4M3:
	case NC_FLOAT8E5M2:
		return 1;
	case NC_FLOAT16:
	case NC_BFLOAT16:
		return 2;
	case NC_INT32:
	case NC_UINT32:
	case NC_FLOAT32:
		return 4;
	case NC_INT64:
	case NC_UINT64:
	case NC_FLOAT64:
		return 8;
	}
	return 0;
}

static __always_inline __u32 depth_of(__u32 tid)
{
	__u32 *d = bpf_map_lookup_elem(&group_depth, &tid);

	return d ? *d : 0;
}

SEC("uprobe")
int BPF_KPROBE(nc_enter)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 tid = (__u32)id, coll = cookie & NC_CK_COLL_MASK, n, d;
	struct inflight f = {}, *outer;
	struct args a = {};
	__u64 size, now;

	if (!is_traced(id >> 32, current_start()))
		return 0;
	outer = bpf_map_lookup_elem(&inflight, &tid);
	now = bpf_ktime_get_ns();
	if (outer && now - outer->ts_ns < STALE_NS) {
		__sync_fetch_and_add(&outer->nested, 1);
		stat_inc(NC_STAT_NESTED);
		return 0;
	}
	load_args(ctx, &a);
	f.cookie = cookie;
	f.peer = -1;
	n = ck(cookie, NC_CK_COUNT_SHIFT);
	if (n) {
		f.count = arg_at(&a, n);
		/* An enum is 32 bits: the upper half of its slot is undefined. */
		f.dtype = (__u8)(__u32)arg_at(&a, ck(cookie, NC_CK_DTYPE_SHIFT));
		size = dtype_size((__u32)arg_at(&a, ck(cookie, NC_CK_DTYPE_SHIFT)));
		if (size)
			f.bytes = f.count * size;
		else
			f.flags |= NC_F_BYTES_UNKNOWN;
	}
	n = ck(cookie, NC_CK_PEER_SHIFT);
	if (n)
		f.peer = (__s32)arg_at(&a, n);
	f.comm = arg_at(&a, ck(cookie, NC_CK_COMM_SHIFT));
	f.stream = arg_at(&a, ck(cookie, NC_CK_STREAM_SHIFT));

	d = depth_of(tid);
	if (coll == NC_GROUP_START) {
		/* Counted at entry: a collective on this thread before this
		 * call returns belongs to the group. */
		__u32 nd = d + 1;

		bpf_map_update_elem(&group_depth, &tid, &nd, BPF_ANY);
	} else if (coll != NC_GROUP_END && d > 0) {
		f.flags |= NC_F_GROUPED;
	}
	f.depth = d;
	f.ts_ns = now;
	bpf_map_update_elem(&inflight, &tid, &f, BPF_ANY);
	return 0;
}

static __always_inline void count_lost(struct nc_totals_key *tk, const struct inflight *f, __s32 ret, __u64 dur)
{
	struct nc_totals zero = {}, *t;

	stat_inc(NC_STAT_DROPPED);
	t = lookup_or_try_init(&lost, tk, &zero);
	if (!t) {
		stat_inc(NC_STAT_LOST_FULL);
		return;
	}
	__sync_fetch_and_add(&t->calls, 1);
	if (ret == 0)
		__sync_fetch_and_add(&t->bytes, f->bytes);
	else
		__sync_fetch_and_add(&t->errors, 1);
	if (f->flags & NC_F_BYTES_UNKNOWN)
		__sync_fetch_and_add(&t->bytes_unknown, 1);
	__sync_fetch_and_add(&t->duration_ns, dur);
}

SEC("uretprobe")
int BPF_KRETPROBE(nc_return)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 id = bpf_get_current_pid_tgid();
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 tid = (__u32)id, coll = cookie & NC_CK_COLL_MASK;
	__s32 ret = (__s32)PT_REGS_RC(ctx);
	__u64 start = current_start();
	struct nc_totals_key tk = {};
	struct inflight *f;
	struct nc_event *e;

	if (!is_traced(id >> 32, start))
		return 0;
	f = bpf_map_lookup_elem(&inflight, &tid);
	if (!f) {
		stat_inc(NC_STAT_NO_ENTRY);
		return 0;
	}
	if (f->nested > 0) {
		/* the return of a call inside the outer one */
		__sync_fetch_and_add(&f->nested, -1);
		return 0;
	}
	if (f->cookie != cookie) {
		stat_inc(NC_STAT_NO_ENTRY);
		return 0;
	}
	if (coll == NC_GROUP_END) {
		/* NCCL leaves the group whatever the result. */
		__u32 d = depth_of(tid);

		if (d > 1) {
			d -= 1;
			bpf_map_update_elem(&group_depth, &tid, &d, BPF_ANY);
		} else {
			bpf_map_delete_elem(&group_depth, &tid);
		}
	}
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (e) {
		e->ts_ns = f->ts_ns;
		e->duration_ns = now - f->ts_ns;
		e->count = f->count;
		e->bytes = f->bytes;
		e->stream = f->stream;
		e->comm = f->comm;
		e->start_ns = start;
		e->pid = id >> 32;
		e->tid = tid;
		e->ret = ret;
		e->peer = f->peer;
		e->depth = f->depth;
		e->coll = coll;
		e->dtype = f->dtype;
		e->flags = f->flags;
		e->pad = 0;
		bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
		stat_inc(NC_STAT_EVENTS);
	} else {
		tk.start_ns = start;
		tk.pid = id >> 32;
		tk.coll = coll;
		count_lost(&tk, f, ret, now - f->ts_ns);
	}
	bpf_map_delete_elem(&inflight, &tid);
	return 0;
}

/* ---- communicators ---- */

struct comm_call {
	__u64 ts_ns;
	__u64 cookie;
	__u64 out;    /* where NCCL writes the handle(s), or the int answered (count, user_rank) */
	__u64 comm;   /* count, user_rank: the communicator asked about */
	__u64 parent; /* split: the parent communicator; init_all: the comms array */
	__s32 rank;
	__s32 nranks;
	__s32 color;
	__s32 key;
	__u32 nested;
	__u8 unique_id[NC_UNIQUE_ID_BYTES];
};

/* The outermost communicator call in flight, by tid (as `inflight`). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct comm_call);
} comm_inflight SEC(".maps");

/* Few records (one per communicator made or asked about). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} comms SEC(".maps");

/* The ncclUniqueId passed by value as the third argument of
 * ncclCommInitRank(Config) (nccl.h): in the caller's stack just above the
 * return address on x86-64, through a pointer in x2 on arm64. */
static __always_inline __u64 unique_id_addr(const struct args *a)
{
#if defined(__TARGET_ARCH_x86)
	return a->sp + 8;
#else
	return a->r[2];
#endif
}

/* The int argument after it (rank): the third integer register on x86-64
 * (the id took none), x3 on arm64. */
static __always_inline __s32 rank_after_unique_id(const struct args *a)
{
#if defined(__TARGET_ARCH_x86)
	return (__s32)a->r[2];
#else
	return (__s32)a->r[3];
#endif
}

SEC("uprobe")
int BPF_KPROBE(nc_comm_enter)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 tid = (__u32)id, kind = cookie & NC_CK_COLL_MASK;
	struct comm_call *outer, *c;
	struct comm_call zero = {};
	struct args a = {};
	__u64 now;

	if (!is_traced(id >> 32, current_start()))
		return 0;
	outer = bpf_map_lookup_elem(&comm_inflight, &tid);
	now = bpf_ktime_get_ns();
	if (outer && now - outer->ts_ns < STALE_NS) {
		__sync_fetch_and_add(&outer->nested, 1);
		stat_inc(NC_STAT_NESTED);
		return 0;
	}
	/* Built in the map, not on the stack: the record is larger than the
	 * stack wants to hold twice. */
	if (bpf_map_update_elem(&comm_inflight, &tid, &zero, BPF_ANY))
		return 0;
	c = bpf_map_lookup_elem(&comm_inflight, &tid);
	if (!c)
		return 0;
	load_args(ctx, &a);
	c->ts_ns = now;
	c->cookie = cookie;
	c->rank = c->nranks = c->color = c->key = -1;
	switch (kind) {
	case NC_COMM_INIT_RANK:
	case NC_COMM_INIT_RANK_CONFIG:
		c->out = a.r[0];
		c->nranks = (__s32)a.r[1];
		c->rank = rank_after_unique_id(&a);
		bpf_probe_read_user(c->unique_id, sizeof(c->unique_id), (void *)unique_id_addr(&a));
		break;
	case NC_COMM_INIT_ALL:
		c->out = c->parent = a.r[0];
		c->nranks = (__s32)a.r[1];
		break;
	case NC_COMM_SPLIT:
		c->parent = a.r[0];
		c->color = (__s32)a.r[1];
		c->key = (__s32)a.r[2];
		c->out = a.r[3];
		break;
	default: /* count, user_rank */
		c->comm = a.r[0];
		c->out = a.r[1];
		break;
	}
	return 0;
}

static __always_inline void comm_emit(const struct comm_call *c, __u32 kind, __s32 ret, __u64 comm, __s32 rank,
				      __s32 nranks)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct nc_comm_event *e;

	e = bpf_ringbuf_reserve(&comms, sizeof(*e), 0);
	if (!e) {
		stat_inc(NC_STAT_COMMS_DROPPED);
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->start_ns = current_start();
	e->comm = comm;
	e->parent = c->parent;
	__builtin_memcpy(e->unique_id, c->unique_id, sizeof(e->unique_id));
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->ret = ret;
	e->rank = rank;
	e->nranks = nranks;
	e->color = c->color;
	e->key = c->key;
	e->kind = kind;
	e->pad[0] = e->pad[1] = e->pad[2] = 0;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	stat_inc(NC_STAT_COMMS);
}

SEC("uretprobe")
int BPF_KRETPROBE(nc_comm_return)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 tid = (__u32)id, kind = cookie & NC_CK_COLL_MASK;
	__s32 ret = (__s32)PT_REGS_RC(ctx), answer = -1;
	struct comm_call *c;
	__u64 handle = 0;

	if (!is_traced(id >> 32, current_start()))
		return 0;
	c = bpf_map_lookup_elem(&comm_inflight, &tid);
	if (!c) {
		stat_inc(NC_STAT_NO_ENTRY);
		return 0;
	}
	if (c->nested > 0) {
		__sync_fetch_and_add(&c->nested, -1);
		return 0;
	}
	if (c->cookie != cookie) {
		stat_inc(NC_STAT_NO_ENTRY);
		return 0;
	}
	switch (kind) {
	case NC_COMM_INIT_ALL:
		for (__s32 i = 0; i < NC_INIT_ALL_MAX; i++) {
			if (i >= c->nranks)
				break;
			handle = 0;
			if (ret == 0)
				bpf_probe_read_user(&handle, sizeof(handle), (void *)(c->out + 8 * i));
			comm_emit(c, kind, ret, handle, i, c->nranks);
		}
		break;
	case NC_COMM_COUNT:
	case NC_COMM_USER_RANK:
		if (ret == 0)
			bpf_probe_read_user(&answer, sizeof(answer), (void *)c->out);
		comm_emit(c, kind, ret, c->comm, kind == NC_COMM_USER_RANK ? answer : -1,
			  kind == NC_COMM_COUNT ? answer : -1);
		break;
	default: /* init_rank, init_rank_config, split: the handle written through `out` */
		if (ret == 0 && c->out)
			bpf_probe_read_user(&handle, sizeof(handle), (void *)c->out);
		comm_emit(c, kind, ret, handle, c->rank, c->nranks);
		break;
	}
	bpf_map_delete_elem(&comm_inflight, &tid);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(nc_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, ctgid = child->tgid;
	__u64 cstart = task_start(child);

	if (!filter_pids || ptgid == ctgid)
		return 0;
	if (traced_as(&traced, ptgid, task_start(parent)))
		bpf_map_update_elem(&traced, &ctgid, &cstart, BPF_ANY);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(nc_exit, struct task_struct *p)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u32 tgid = id >> 32, tid = (__u32)id;

	if (bpf_map_delete_elem(&inflight, &tid) == 0)
		stat_inc(NC_STAT_ABANDONED);
	if (bpf_map_delete_elem(&comm_inflight, &tid) == 0)
		stat_inc(NC_STAT_ABANDONED);
	bpf_map_delete_elem(&group_depth, &tid);
	if (filter_pids && BPF_CORE_READ(task, signal, live.counter) == 0)
		bpf_map_delete_elem(&traced, &tgid);
	return 0;
}
