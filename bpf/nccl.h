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
	NC_STAT_COMMS = 6,      /* communicator records queued on the `comms` ring */
	NC_STAT_COMMS_DROPPED = 7, /* communicator records the ring could not take */
	NC_STAT_COUNT = 8,
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

/*
 * Communicators: the calls that make one, and the two that say a
 * communicator's rank and size. A second pair of generic programs serves
 * them (nc_comm_enter, nc_comm_return), off the collectives' hot path; the
 * cookie is the enum below. Signatures (nccl.h, NCCL 2.x):
 *   ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
 *   ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
 *                          ncclConfig_t *config)
 *   ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
 *   ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
 *   ncclCommCount(const ncclComm_t comm, int *count)
 *   ncclCommUserRank(const ncclComm_t comm, int *rank)
 * ncclUniqueId (`struct { char internal[128]; }`) is passed by value: on
 * x86-64 (SysV, a MEMORY-class aggregate) in the caller's stack above the
 * return address, taking no register, so `rank` is in the third integer
 * register; on arm64 (AAPCS64, a composite over 16 bytes) the caller passes
 * a pointer to a copy in x2, and `rank` is in x3.
 */
enum nc_comm_kind {
	NC_COMM_INIT_RANK = 0,
	NC_COMM_INIT_RANK_CONFIG = 1,
	NC_COMM_INIT_ALL = 2,
	NC_COMM_SPLIT = 3,
	NC_COMM_COUNT = 4,     /* ncclCommCount: a communicator's size */
	NC_COMM_USER_RANK = 5, /* ncclCommUserRank: this process's rank in it */
	NC_COMM_KIND_COUNT = 6,
};

#define NC_UNIQUE_ID_BYTES 128
/* ncclCommInitAll makes one communicator per device in one call: the first
 * this many handles are read. */
#define NC_INIT_ALL_MAX 8

/* One completed communicator call, queued on the `comms` ring (one per
 * handle for ncclCommInitAll). */
struct nc_comm_event {
	__u64 ts_ns;     /* return, CLOCK_MONOTONIC */
	__u64 start_ns;  /* the process's start, as struct nc_totals_key */
	__u64 comm;      /* the ncclComm_t made (read through the comm/newcomm argument at return), or asked about */
	__u64 parent;    /* split: the parent ncclComm_t; init_all: the comms array's address */
	__u8 unique_id[NC_UNIQUE_ID_BYTES]; /* init: the ncclUniqueId as passed (else zero) */
	__u32 pid;
	__u32 tid;
	__s32 ret;       /* ncclResult_t */
	__s32 rank;      /* init: rank; init_all: the handle's index; user_rank: the answer; else -1 */
	__s32 nranks;    /* init: nranks; init_all: ndev; count: the answer; else -1 */
	__s32 color;     /* split: color (NCCL_SPLIT_NOCOLOR -1: no communicator made) */
	__s32 key;       /* split: key */
	__u8 kind;       /* enum nc_comm_kind */
	__u8 pad[3];
};

#endif /* __MEMTRACE_NCCL_H */
