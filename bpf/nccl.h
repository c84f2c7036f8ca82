/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * memtrace NCCL sensor: what nccl.bpf.c and the Python control plane share.
 *
 * The single source of truth for the event layout, the cookie encoding and
 * the enums of the NCCL sensor. memtrace/core/nccl.py mirrors it;
 * tests/test_nccl_abi.py compiles a C program against this file and fails
 * if the two disagree.
 */
#ifndef __MEMTRACE_NCCL_H
#define __MEMTRACE_NCCL_H

/* What a probed symbol is. */
enum nc_coll {
	NC_ALLREDUCE = 0,
	NC_ALLGATHER = 1,
	NC_REDUCESCATTER = 2,
	NC_BROADCAST = 3,
	NC_REDUCE = 4,
	NC_SEND = 5,
	NC_RECV = 6,
	NC_ALLTOALL = 7,
	NC_GROUP_START = 8,
	NC_GROUP_END = 9,
	NC_COLL_COUNT = 10,
};

/* ncclDataType_t (nccl.h, NCCL 2.x) and their sizes in bytes. */
enum nc_dtype {
	NC_INT8 = 0,
	NC_UINT8 = 1,
	NC_INT32 = 2,
	NC_UINT32 = 3,
	NC_INT64 = 4,
	NC_UINT64 = 5,
	NC_FLOAT16 = 6,
	NC_FLOAT32 = 7,
	NC_FLOAT64 = 8,
	NC_BFLOAT16 = 9,
	NC_FLOAT8E4M3 = 10,
	NC_FLOAT8E5M2 = 11,
	NC_DTYPE_COUNT = 12,
};

/* Event flags. */
#define NC_F_BYTES_UNKNOWN 0x1 /* datatype outside enum nc_dtype: bytes is 0 */
#define NC_F_GROUPED 0x2       /* called inside ncclGroupStart/End: issued at the group's end */

/*
 * bpf_cookie layout: one pair of generic programs serves every symbol.
 * Argument indices are 1-based; 0 means "none".
 *
 *   bits  0..7   enum nc_coll
 *   bits  8..11  index of the element count argument
 *   bits 12..15  index of the datatype argument
 *   bits 16..19  index of the peer or root argument
 *   bits 20..23  index of the communicator argument
 *   bits 24..27  index of the stream argument
 */
#define NC_CK_COLL_SHIFT 0
#define NC_CK_COUNT_SHIFT 8
#define NC_CK_DTYPE_SHIFT 12
#define NC_CK_PEER_SHIFT 16
#define NC_CK_COMM_SHIFT 20
#define NC_CK_STREAM_SHIFT 24
#define NC_CK_NIBBLE 0xfULL
#define NC_CK_COLL_MASK 0xffULL

/* Agent health counters, one slot each in the per-CPU `stats` array. */
enum nc_stat {
	NC_STAT_EVENTS = 0,     /* events queued on the ring */
	NC_STAT_DROPPED = 1,    /* events the ring could not take (counted in `lost`) */
	NC_STAT_LOST_FULL = 2,  /* events lost and not counted: `lost` map full */
	NC_STAT_NO_ENTRY = 3,   /* returns whose entry was not seen (probe attached mid-call) */
	NC_STAT_ABANDONED = 4,  /* calls whose thread exited before returning */
	NC_STAT_NESTED = 5,     /* probed calls made by a probed call (counted once, as the outer) */
	NC_STAT_COUNT = 6,
};

/* One completed call, queued on the `events` ring. */
struct nc_event {
	__u64 ts_ns;       /* entry, CLOCK_MONOTONIC */
	__u64 duration_ns; /* entry to return: the enqueue cost */
	__u64 count;       /* element count argument */
	__u64 bytes;       /* count x datatype size (0 with NC_F_BYTES_UNKNOWN) */
	__u64 stream;      /* cudaStream_t */
	__u64 comm;        /* ncclComm_t */
	__u64 start_ns;    /* the process's start (struct nc_totals_key), taken at the call */
	__u32 pid;
	__u32 tid;
	__s32 ret;         /* ncclResult_t */
	__s32 peer;        /* peer (send/recv) or root (broadcast/reduce); -1: none */
	__u32 depth;       /* group depth at the call (group end: before it returns) */
	__u8 coll;         /* enum nc_coll */
	__u8 dtype;        /* ncclDataType_t as passed (truncated to 8 bits) */
	__u8 flags;        /* NC_F_* */
	__u8 pad;
};

/* A process is its tgid and its start (the thread group leader's
 * start_boottime, CLOCK_BOOTTIME ns, as the CUDA sensor's struct
 * mt_proc_key): pids are reused, start times are not. `traced` maps a tgid
 * to the start of the process traced under it (__u64); user space may write
 * 0 for a process whose start it does not know, and the first process seen
 * with that tgid takes the entry. */
struct nc_totals_key {
	__u64 start_ns;
	__u32 pid;
	__u32 coll;
};

/* Calls whose event the ring could not take, keyed like the events. */
struct nc_totals {
	__u64 calls;
	__u64 bytes;       /* bytes of successful calls with a known datatype */
	__u64 errors;
	__u64 bytes_unknown; /* calls with a datatype outside enum nc_dtype */
	__u64 duration_ns;   /* sum over all calls */
};

#endif /* __MEMTRACE_NCCL_H */
