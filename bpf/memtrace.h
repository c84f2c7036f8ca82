/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * memtrace: what the BPF programs and the Python control plane share.
 *
 * This header is the single source of truth for the event layouts, the
 * cookie encoding and every enum crossing the kernel/user boundary.
 * memtrace/core/abi.py mirrors it; tests/test_abi.py compiles a C program against
 * this file and fails if the two disagree.
 */
#ifndef __MEMTRACE_H
#define __MEMTRACE_H

/* Copy direction. 0..4 equal cudaMemcpyKind so the runtime's kind argument
 * maps directly; the driver's fixed-direction calls use the same values. */
enum mt_direction {
	MT_DIR_H2H = 0,
	MT_DIR_H2D = 1,
	MT_DIR_D2H = 2,
	MT_DIR_D2D = 3,
	MT_DIR_DEFAULT = 4, /* cudaMemcpyDefault / unified cuMemcpy: not resolved */
	MT_DIR_PEER = 5,
	MT_DIR_UNKNOWN = 6, /* a kind value outside the enum */
	MT_DIR_COUNT = 7,
};

enum mt_layer {
	MT_LAYER_RUNTIME = 0, /* libcudart (shared or linked into an executable) */
	MT_LAYER_DRIVER = 1,  /* libcuda */
	MT_LAYER_COUNT = 2,
};

/* Where the direction of a copy comes from. */
enum mt_dirsrc {
	MT_DIRSRC_FIXED = 0,  /* the API implies it (cuMemcpyHtoD...): value in DIRARG */
	MT_DIRSRC_KIND = 1,   /* a cudaMemcpyKind argument: its index in DIRARG */
	MT_DIRSRC_DESC2D = 2, /* a CUDA_MEMCPY2D pointer: its index in DIRARG */
	MT_DIRSRC_DESC3D = 3, /* a CUDA_MEMCPY3D pointer: its index in DIRARG */
	MT_DIRSRC_PARMS3D = 4, /* a cudaMemcpy3DParms pointer: its index in DIRARG */
	MT_DIRSRC_BATCH = 5,   /* arrays of copies: DST, SRC and BYTES index the dsts, srcs and
				* sizes arrays, DIRARG the count; each copy's direction comes
				* from its pointers (MT_DIR_DEFAULT), as for a unified copy */
	MT_DIRSRC_BATCH3D = 6, /* an array of 3D copy operations (CUDA_MEMCPY3D_BATCH_OP,
				* cudaMemcpy3DBatchOp): BYTES indexes it, DIRARG the count;
				* as MT_DIRSRC_BATCH, each copy's direction from its pointers */
};

/* What a probed symbol does; the generic programs branch on it. */
enum mt_family {
	MT_FAM_COPY = 0, /* a memory copy: bytes, direction, both pointers */
	MT_FAM_MEM = 1,  /* allocation, free, host registration, VMM map/unmap */
	MT_FAM_SYNC = 2, /* a synchronisation wait: its duration */
	MT_FAM_LAUNCH = 3, /* a kernel or graph launch: counted in the kernel, entry only; with
			    * launch_events a return probe too, and one record per launch (entry,
			    * host-side duration, stream, function or graph in dst, result) */
};

/* MT_FAM_MEM flags (the DIRSRC nibble). */
#define MT_MEM_AUX_DEREF 0x1 /* AUX is a pointer to a size_t written by the call (pitch) */

/* MT_FAM_LAUNCH flags (the DIRSRC nibble). */
#define MT_LAUNCH_STREAM_IN_CONFIG 0x1 /* STREAM is a CUlaunchConfig pointer: the stream is its hStream */

/* CUlaunchConfig (cuda.h, 64-bit; cuLaunchKernelEx's first argument): seven
 * unsigned ints, then hStream aligned to 8, attrs, numAttrs: 56 bytes. */
#define MT_LCFG_STREAM_OFF 32
#define MT_LCFG_SIZE 56

/*
 * bpf_cookie layout: one generic program serves every copy symbol, and the
 * cookie set at attach time says where this symbol keeps its arguments.
 * Argument indices are 1-based; 0 means "none".
 *
 *   bits  0..15  api id (memtrace/apis.py)
 *   bits 16..19  index of the byte-count argument
 *   bits 20..23  index of a multiplier of the byte count (2D height)
 *   bits 24..27  enum mt_dirsrc
 *   bits 28..31  direction value (FIXED) or argument index (KIND, DESC2D)
 *   bits 32..35  index of the stream argument
 *   bit  36      layer (enum mt_layer)
 *   bits 37..39  enum mt_family
 *   bits 40..43  index of the destination pointer argument
 *   bits 44..47  index of the source pointer argument
 *
 * Argument indices go up to 15: past the registers (6 on x86-64, 8 on
 * arm64) arguments are read from the caller's stack at entry.
 *
 * MT_FAM_MEM reuses the copy nibbles: BYTES is the size, DIRSRC holds
 * MT_MEM_* flags, DIRARG the index of an output pointer argument (the call
 * writes the new address or handle there; read at return), DST the index
 * of a pointer or handle argument (free, unregister, map), and STREAM an
 * auxiliary argument (a stream, a VMM handle, or with MT_MEM_AUX_DEREF
 * the pitch a pitched allocation writes back).
 */
#define MT_CK_API_SHIFT 0
#define MT_CK_BYTES_SHIFT 16
#define MT_CK_MUL_SHIFT 20
#define MT_CK_DIRSRC_SHIFT 24
#define MT_CK_DIRARG_SHIFT 28
#define MT_CK_STREAM_SHIFT 32
#define MT_CK_LAYER_SHIFT 36
#define MT_CK_FAMILY_SHIFT 37
#define MT_CK_DST_SHIFT 40
#define MT_CK_SRC_SHIFT 44
#define MT_CK_NIBBLE 0xfULL
/* A launch cookie's bit 63: the probe belongs to one process's own launch
 * link (the overhead budget's), not to the library's link for every process. */
#define MT_CK_OWN_SHIFT 63

/* `attached` values (memtrace/sensors/cuda/source.py). PER_PROCESS: a
 * library whose launch probes are attached per process (the overhead
 * budget): a process that maps it needs its own launch link first. */
#define MT_ATTACHED_LIBRARY 1
#define MT_ATTACHED_EXECUTABLE 2
#define MT_ATTACHED_OTHER 3
#define MT_ATTACHED_PER_PROCESS 4

/* CUDA_MEMCPY2D (cuda.h, 64-bit): the offsets BPF reads. The struct is
 * 128 bytes; CUmemorytype is a 4-byte enum padded to 8. */
#define MT_M2D_SRC_MEMTYPE_OFF 16
#define MT_M2D_DST_MEMTYPE_OFF 72
#define MT_M2D_WIDTH_OFF 112
#define MT_M2D_HEIGHT_OFF 120
#define MT_M2D_SIZE 128
#define MT_M2D_SRC_HOST_OFF 24
#define MT_M2D_SRC_DEVICE_OFF 32
#define MT_M2D_DST_HOST_OFF 80
#define MT_M2D_DST_DEVICE_OFF 88

/* CUDA_MEMCPY3D (cuda.h, 64-bit): 200 bytes; WidthInBytes is in bytes. */
#define MT_M3D_SRC_MEMTYPE_OFF 32
#define MT_M3D_SRC_HOST_OFF 40
#define MT_M3D_SRC_DEVICE_OFF 48
#define MT_M3D_DST_MEMTYPE_OFF 120
#define MT_M3D_DST_HOST_OFF 128
#define MT_M3D_DST_DEVICE_OFF 136
#define MT_M3D_WIDTH_OFF 176
#define MT_M3D_HEIGHT_OFF 184
#define MT_M3D_DEPTH_OFF 192
#define MT_M3D_SIZE 200

/* struct cudaMemcpy3DParms (cuda_runtime_api.h, 64-bit): 160 bytes. The
 * extent's width is in bytes when no CUDA array takes part. */
#define MT_P3D_SRC_ARRAY_OFF 0
#define MT_P3D_SRC_PTR_OFF 32
#define MT_P3D_DST_ARRAY_OFF 64
#define MT_P3D_DST_PTR_OFF 96
#define MT_P3D_WIDTH_OFF 128
#define MT_P3D_HEIGHT_OFF 136
#define MT_P3D_DEPTH_OFF 144
#define MT_P3D_KIND_OFF 152
#define MT_P3D_SIZE 160

/*
 * Batch copies (cudaMemcpyBatchAsync, cuMemcpyBatchAsync): one call, many
 * copies. The return program reads the arrays (bounded loops) and queues
 * one record per copy for the first MT_BATCH_EACH copies, so each copy's
 * direction and host memory are resolved from its own pointers; then one
 * record with the summed sizes of copies MT_BATCH_EACH..MT_BATCH_MAX-1 and
 * no pointers (direction left default, host memory unknown). Copies past
 * MT_BATCH_MAX are not counted: the call is counted in
 * MT_STAT_BATCH_TRUNCATED. The first record of a call carries the call
 * (its duration, its result); the others have MT_EV_MORE in `layer` and
 * carry bytes only, the summed one MT_EV_SUM as well. A failed call queues one record, with no bytes.
 */
/*
 * 3D batch copies (cuMemcpy3DBatchAsync, cudaMemcpy3DBatchAsync, CUDA
 * 12.8+): the same records as above, from an array of operations, each a
 * source and a destination operand (a pointer, or a CUDA array) and an
 * extent in elements. Between two pointers an element is a byte; a copy to
 * or from a CUDA array moves elements of the array's format, which memtrace
 * does not read: such a copy is counted with no bytes and in
 * MT_STAT_BATCH_ARRAY_COPIES, so the bytes not known are said, not guessed.
 * The driver's and the runtime's layouts are the same (112 bytes).
 */
#define MT_B3D_OP_SIZE 112
#define MT_B3D_SRC_TYPE_OFF 0
#define MT_B3D_SRC_PTR_OFF 8
#define MT_B3D_DST_TYPE_OFF 40
#define MT_B3D_DST_PTR_OFF 48
#define MT_B3D_WIDTH_OFF 80
#define MT_B3D_HEIGHT_OFF 88
#define MT_B3D_DEPTH_OFF 96
#define MT_B3D_READ 104 /* what is read of each operation: up to the extent's end */
#define MT_OPERAND_POINTER 1 /* CU_MEMCPY_OPERAND_TYPE_POINTER, cudaMemcpyOperandTypePointer */

#define MT_BATCH_EACH 32
#define MT_BATCH_MAX 1024
#define MT_EV_MORE 0x80 /* mt_event.layer: a further copy of a batch call, not a call */
#define MT_EV_SUM 0x40  /* mt_event.layer: the summed sizes of many copies, no pointers */
#define MT_EV_LAYER 0x01 /* mt_event.layer: the layer bit */

/* CUmemorytype */
#define MT_CU_MEMORYTYPE_HOST 1
#define MT_CU_MEMORYTYPE_DEVICE 2
#define MT_CU_MEMORYTYPE_ARRAY 3
#define MT_CU_MEMORYTYPE_UNIFIED 4

/* Agent health counters, one slot each in the per-CPU `stats` array. */
enum mt_stat {
	MT_STAT_EVENTS = 0,        /* events queued on the ring */
	MT_STAT_DROPPED = 1,       /* events lost: ring full (counted in `lost`) */
	MT_STAT_TOTALS_FULL = 2,   /* events lost and not counted: `lost` map full */
	MT_STAT_INFLIGHT_FULL = 3, /* copies not measured: in-flight map full */
	MT_STAT_NESTED = 4,        /* driver calls inside a runtime call (not counted twice) */
	MT_STAT_ABANDONED = 5,     /* calls whose thread exited before returning */
	MT_STAT_HOLDS = 6,         /* processes held while their CUDA library was attached */
	MT_STAT_HOLD_MISSED = 7,   /* could not hold: control ring full */
	MT_STAT_CTL_DROPPED = 8,   /* control events lost (exit notices) */
	MT_STAT_COUNTS_FULL = 9,   /* launches not counted: `counts` map full */
	MT_STAT_NESTED_SAME = 10,  /* calls inside a call of the same layer on the same thread
				    * (the outer call's own work: counted once, as the outer call) */
	MT_STAT_UNRETURNED = 11,   /* entries replaced whose return never came (probes attached
				    * mid-call): the call is not counted */
	MT_STAT_BATCH_TRUNCATED = 12, /* batch calls with more than MT_BATCH_MAX copies: the
				       * bytes of copies past the bound are not counted */
	MT_STAT_STACKS = 13,          /* call stacks taken (copies and memory calls, with stacks on) */
	MT_STAT_STACK_FAILED = 14,    /* stacks the kernel could not take: the call has none */
	MT_STAT_STACKS_FULL = 15,     /* stacks not kept: `stack_frames` full; the call has none */
	MT_STAT_BATCH_ARRAY_COPIES = 16, /* copies of 3D batches to or from a CUDA array: counted,
					  * their bytes not known (the array's element size) */
	MT_STAT_PY_FRAMES = 17,       /* Python frames walked (entry shims included) */
	MT_STAT_PY_READS = 18,        /* reads of a process's memory for them: fewer where one
				       * read holds many frames (3.11+, MT_PY_WINDOW) */
	MT_STAT_PY_THREAD_READS = 19, /* reads of a process's memory to find the calling thread's
				       * state and its frame: two or three where the thread's
				       * last walk found it */
	MT_STAT_LAUNCH_EVENTS = 20,   /* launch events queued (launch_events on: a timeline is recorded) */
	MT_STAT_LAUNCH_DROPPED = 21,  /* launch events the ring could not take: counted, no slice */
	MT_STAT_COUNT = 22,
};

/* Control events: what user space must act on. */
enum mt_ctl_type {
	MT_CTL_MAP = 1,  /* a process maps a CUDA library's code (fd); stopped if `held` */
	MT_CTL_EXIT = 3, /* the last thread of a process exited */
	MT_CTL_PROC = 4, /* a process's first event: who it is (comm, cgroup), taken at the event */
};

/* A process is its tgid and its start time: pids are reused, start times
 * are not. start_ns is the thread group leader's start_boottime
 * (CLOCK_BOOTTIME ns, what /proc/PID/stat's starttime counts in ticks). */
struct mt_proc_key {
	__u64 start_ns;
	__u32 pid;
	__u32 pad;
};

struct mt_totals_key {
	__u64 start_ns; /* the process's, as in struct mt_proc_key */
	__u32 pid;
	__u16 api;
	__u8 direction;
	__u8 pad;
};

/* Calls whose event the ring could not take (`lost`), keyed like the
 * events: user space adds them to what it counted, so totals stay exact. */
struct mt_totals {
	__u64 calls;
	__u64 bytes; /* bytes of successful calls only */
	__u64 errors;
	__u64 duration_ns; /* sum over all calls */
};

/* One completed call, queued on the `events` ring. */
struct mt_event {
	__u64 ts_ns;       /* entry, CLOCK_MONOTONIC */
	__u64 duration_ns; /* entry to return */
	__u64 bytes;       /* copy: requested bytes (moved only if ret == 0); mem: size */
	__u64 stream;      /* copy, sync: stream or event; mem: the auxiliary argument */
	__u64 dst;         /* copy: destination pointer; mem: the address or handle */
	__u64 src;         /* copy: source pointer; sync: the thread's first launch since its last sync (ns, 0: none) */
	__u64 start_ns;    /* the process's start (struct mt_proc_key) */
	__u32 pid;
	__u32 tid;
	__s32 ret;
	__u16 api;
	__u8 direction;
	__u8 layer;
	__u64 stack; /* the caller's stack, a key of `stack_frames`; 0: none taken */
};

/*
 * Call stacks (copies and memory calls, when user space asks for them): the
 * user stack at the call's entry, return addresses innermost first (the
 * first is the called function itself), taken by the kernel's frame-pointer
 * walk. At a function's entry that walk starts from the caller's frame and
 * so misses the caller itself; its return address (at the stack pointer on
 * x86-64, in the link register on arm64) is put back as the second frame.
 * Stacks are keyed by a 64-bit hash of their addresses and the process:
 * the same stack always has the same key, so user space may delete what it
 * has read (the next call inserts it again).
 */
#define MT_STACK_DEPTH 64   /* frames kept; deeper stacks keep their innermost */
#define MT_STACKS_MAX 16384 /* stacks in `stack_frames` not yet read by user space */

/*
 * Python frames (when user space has told the process's interpreter, in
 * `py_procs`): the thread's own frames, innermost first, walked from the
 * interpreter's thread states at the call's entry. A frame is its code
 * object's address and where it was in it (the instruction pointer, or
 * 3.10's instruction index), so user space can name the function, its file
 * and the line being executed. The interpreter's layout comes from user
 * space (per version, or 3.13's _Py_DebugOffsets); BPF knows none.
 */
#define MT_PY_DEPTH 32          /* Python frames kept; deeper stacks keep their innermost */
#define MT_PY_WALK 64           /* frames looked at (entry shims are skipped, not kept) */
#define MT_PY_THREADS 256       /* thread states looked at to find the calling thread's */
#define MT_PY_THREADS_KEPT 8192 /* calling threads whose state BPF remembers (LRU) */
#define MT_PY_ENTRY (1ULL << 63) /* in py_instr: the frame a C call into the interpreter began */
#define MT_PY_NONE 0xffff       /* an offset the interpreter does not have */

enum mt_py_state {
	MT_PY_NOT_PYTHON = 0, /* no interpreter known for the process (or not yet) */
	MT_PY_WALKED = 1,     /* frames taken (none if the thread ran no Python code) */
	MT_PY_NO_THREAD = 2,  /* the calling thread has no Python thread state */
	MT_PY_FAULT = 3,      /* a read failed mid-walk: the frames before it are kept */
	MT_PY_TRUNCATED = 4,  /* deeper than MT_PY_DEPTH: the innermost are kept */
};

/* How the calling thread's state is found: by its thread id in its own pid
 * namespace (PyThreadState.native_thread_id, 3.11+) or by its pthread_t
 * (PyThreadState.thread_id: the thread pointer on x86-64 glibc, 3.10). */
enum mt_py_match {
	MT_PY_MATCH_NATIVE_TID = 1,
	MT_PY_MATCH_PTHREAD = 2,
};

/* A `py_procs` value, keyed by tgid: where the process's interpreter keeps
 * its state, and the offsets to walk it (bytes; MT_PY_NONE: absent). */
struct mt_py_proc {
	__u64 start_ns; /* the process (struct mt_proc_key): a reused pid is another */
	__u64 runtime;  /* the address of _PyRuntime */
	__u16 interpreters_head; /* _PyRuntimeState.interpreters.head */
	__u16 interp_threads;    /* PyInterpreterState: the first thread state */
	__u16 tstate_next;
	__u16 tstate_id;         /* native_thread_id or thread_id (match) */
	__u16 tstate_frame;      /* the current frame, or (cframe) the _PyCFrame */
	__u16 cframe_frame;      /* _PyCFrame.current_frame (3.11, 3.12) */
	__u16 frame_previous;
	__u16 frame_code;
	__u16 frame_instr;
	__u16 frame_owner;       /* 3.12+: FRAME_OWNED_BY_CSTACK frames are entry shims */
	__u16 frame_is_entry;    /* 3.11 */
	__u16 code_name;         /* co_qualname (3.11+) or co_name */
	__u16 code_filename;
	__u16 code_firstlineno;
	__u16 code_linetable;
	__u16 ascii_size;        /* sizeof(PyASCIIObject): an ASCII str's characters follow it */
	__u16 compact_size;      /* sizeof(PyCompactUnicodeObject): another compact str's follow it */
	__u8 match;              /* enum mt_py_match */
	__u8 instr_size;         /* 4: an int (3.10's f_lasti); 8: a pointer */
	__u8 owner_cstack;       /* FRAME_OWNED_BY_CSTACK */
	__u8 frame_size;         /* bytes read of a frame, one read each: every field above lies in them */
	__u8 frames_window;      /* 1: frames lie in a per-thread stack (3.11+), older ones below: read a window */
	__u8 tstate_size;        /* bytes of a thread state that hold its prev, id and frame (one read) */
	__u16 tstate_prev;       /* a listed thread state's neighbour points back at it */
	__u8 pad2[4];
};

#define MT_PY_FRAME_READ 120 /* the most bytes read of a frame */
#define MT_PY_TSTATE_READ 248 /* the most bytes read of a thread state */
#define MT_PY_WINDOW 4096    /* the most bytes read at once: a frame's page up to its end (3.11+) */

/*
 * What a new stack's code objects say, kept when the stack is first taken
 * (a process may exit before user space reads its stacks, and its memory
 * with it): names, the line table, by (process, code object). User space
 * reads and deletes them, and keeps what it read.
 */
#define MT_PY_NAME_LEN 128  /* bytes of the function's name kept */
#define MT_PY_FILE_LEN 256  /* bytes of the file name kept: its end, when longer */
#define MT_PY_TABLE_LEN 1024 /* bytes of the line table kept: its start */
#define MT_PY_CODES_MAX 16384

struct mt_py_code_key {
	__u64 start_ns;
	__u32 pid;
	__u32 pad;
	__u64 code; /* the code object's address */
};

struct mt_py_code {
	__u64 type;          /* its ob_type: user space checks it is PyCode_Type */
	__s32 firstlineno;
	__u32 name_size;     /* the name's size in bytes (kind x length) */
	__u32 file_size;
	__u32 table_size;    /* the line table's size in bytes */
	__u8 name_kind;      /* PyUnicode kind: bytes a character (1, 2, 4) */
	__u8 file_kind;
	__u8 pad[6];
	char name[MT_PY_NAME_LEN];  /* its first bytes */
	char file[MT_PY_FILE_LEN];  /* its last bytes */
	__u8 table[MT_PY_TABLE_LEN]; /* its first bytes */
};

struct mt_stack {
	__u32 nframes;
	__u32 pid; /* the process whose addresses these are */
	__u64 ips[MT_STACK_DEPTH];
	__u32 py_state;   /* enum mt_py_state */
	__u32 py_nframes;
	__u64 py_code[MT_PY_DEPTH];  /* code objects, innermost first */
	__u64 py_instr[MT_PY_DEPTH]; /* where each frame was; MT_PY_ENTRY marks entry frames */
};

#define MT_COMM_LEN 16 /* TASK_COMM_LEN */

struct mt_ctl_event {
	__u64 ts_ns;
	__u32 type; /* enum mt_ctl_type */
	__u32 pid;
	__u32 tid;
	__s32 fd; /* MT_CTL_MAP: the descriptor of the library being mapped */
	__u32 held;     /* enum mt_hold_state */
	__u32 host_pid; /* the tgid in the host's pid namespace: the key of `mt_held` */
	__u64 start_ns;  /* the process's start (struct mt_proc_key) */
	__u64 cgroup_id; /* MT_CTL_PROC: bpf_get_current_cgroup_id() at the event */
	char comm[MT_COMM_LEN]; /* MT_CTL_PROC: the command name at the event */
	__u64 cpu_ns; /* MT_CTL_EXIT: the process's CPU time, all its threads (scheduler runtime) */
};

/* The `counts` key's api under which a process's entry and return traps
 * are counted (launch traps are its launch counts): what the probes cost
 * it, in traps (memtrace/runtime/overhead.py). No api has this id. */
#define MT_API_TRAPS 0xffff

/* Whether a MT_CTL_MAP event's process was stopped. */
enum mt_hold_state {
	MT_HOLD_NONE = 0,       /* not a hold (exit notices) */
	MT_HOLD_HELD = 1,       /* stopped: continue it once attached */
	MT_HOLD_NOT_HELD = 2,   /* could not stop it (kernel refused): calls before attaching may be missed */
	MT_HOLD_FOREGROUND = 3, /* a terminal's foreground job, never stopped: calls before attaching may be missed */
};

/* A `mt_held` value: when the process was stopped, and its pid as the
 * agent's pid namespace names it. */
struct mt_hold {
	__u64 ts_ns; /* CLOCK_MONOTONIC */
	__u32 pid;
	__u32 pad;
};

/* Inode of an attached library, as the kernel names it (s_dev, i_ino). */
struct mt_inode_key {
	__u64 dev;
	__u64 ino;
};

/* A `launch_own` value: a process whose launches its own links count, and
 * what the overhead budget's extrapolation needs from its windows. Between
 * two exact calls (any traced entry) made while its launch window is open
 * (`launch_window`), every launch is counted: `launches` and `calls` hold
 * only such complete intervals, so the window's edges, which cut an
 * interval, never bias launches per exact call. */
struct mt_launch_sample {
	__u64 pending;	/* launches since its last exact call */
	__u64 launches; /* launches in complete intervals */
	__u64 calls;	/* exact calls that closed one */
	__u32 primed;	/* an exact call was seen since the window opened */
	__u32 pad;
};

/* A `launch_linked` key: a process (its tgid as the agent names it) that
 * has its own launch link to a library in per-process mode. */
struct mt_launch_lib {
	__u32 pid;
	__u32 pad;
	struct mt_inode_key lib;
};

#endif /* __MEMTRACE_H */
