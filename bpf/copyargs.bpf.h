/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * A copy's arguments at its entry (memtrace.bpf.c): the cookie says which
 * argument carries what (memtrace.h); direction, pointers and bytes come
 * from the arguments, a 2D/3D descriptor, or (batches) the arrays' addresses.
 */
#ifndef __MEMTRACE_COPYARGS_BPF_H
#define __MEMTRACE_COPYARGS_BPF_H

#include "common.bpf.h"
#include "uargs.h"
#include "inflight.bpf.h"

static __always_inline __u8 dir_of_memtypes(__u32 src, __u32 dst)
{
	bool sh = src == MT_CU_MEMORYTYPE_HOST, dh = dst == MT_CU_MEMORYTYPE_HOST;
	bool sd = src == MT_CU_MEMORYTYPE_DEVICE || src == MT_CU_MEMORYTYPE_ARRAY;
	bool dd = dst == MT_CU_MEMORYTYPE_DEVICE || dst == MT_CU_MEMORYTYPE_ARRAY;

	if (src == MT_CU_MEMORYTYPE_UNIFIED || dst == MT_CU_MEMORYTYPE_UNIFIED)
		return MT_DIR_DEFAULT;
	if (sh && dd)
		return MT_DIR_H2D;
	if (sd && dh)
		return MT_DIR_D2H;
	if (sd && dd)
		return MT_DIR_D2D;
	if (sh && dh)
		return MT_DIR_H2H;
	return MT_DIR_UNKNOWN;
}

static __always_inline __u8 dir_of_kind(__u32 kind)
{
	return kind <= MT_DIR_DEFAULT ? kind : MT_DIR_UNKNOWN;
}

/* A 2D/3D descriptor, read once from user memory (only the descriptor,
 * never the memory it describes). Big enough for the largest. */
#define DESC_WORDS (MT_M3D_SIZE / 8)
struct desc {
	__u64 w[DESC_WORDS];
};

#define W(d, off) ((d)->w[(off) / 8])
#define W32(d, off) ((__u32)W(d, off)) /* a 4-byte enum at an 8-aligned offset */

/* The host or device pointer a descriptor side names, by its memory type. */
static __always_inline __u64 side_ptr(__u32 type, __u64 host, __u64 dev)
{
	if (type == MT_CU_MEMORYTYPE_HOST)
		return host;
	if (type == MT_CU_MEMORYTYPE_DEVICE || type == MT_CU_MEMORYTYPE_UNIFIED)
		return dev;
	return 0; /* an array: no address */
}

/* Direction and pointers of a driver descriptor (CUDA_MEMCPY2D/3D), whose
 * two sides each name a memory type, a host and a device address. */
static __always_inline void desc_sides(struct inflight *f, const struct desc *d, __u32 smt, __u32 shost,
				       __u32 sdev, __u32 dmt, __u32 dhost, __u32 ddev)
{
	f->direction = dir_of_memtypes(W32(d, smt), W32(d, dmt));
	f->src = side_ptr(W32(d, smt), W(d, shost), W(d, sdev));
	f->dst = side_ptr(W32(d, dmt), W(d, dhost), W(d, ddev));
}

/* Not inlined: its descriptor buffer is then not part of mt_enter's frame,
 * which the stack walk's calls share 512 bytes of stack with. It returns
 * the direction it set, which the caller stores again: a subprogram whose
 * result is unused becomes void, and may leave a stack pointer in r0,
 * which the verifier refuses. */
static __noinline __u8 copy_args(struct inflight *f, const struct args *a, __u64 cookie)
{
	__u32 n = ck(cookie, MT_CK_DIRARG_SHIFT);
	struct desc d;

	f->dst = arg_at(a, ck(cookie, MT_CK_DST_SHIFT));
	f->src = arg_at(a, ck(cookie, MT_CK_SRC_SHIFT));
	switch (ck(cookie, MT_CK_DIRSRC_SHIFT)) {
	case MT_DIRSRC_FIXED:
		f->direction = n;
		return f->direction;
	case MT_DIRSRC_KIND:
		/* An enum is 32 bits: the ABI leaves the upper half of its
		 * register or stack slot undefined (ctypes leaves garbage). */
		f->direction = dir_of_kind((__u32)arg_at(a, n));
		return f->direction;
	case MT_DIRSRC_DESC2D:
		if (bpf_probe_read_user(&d, MT_M2D_SIZE, (void *)arg_at(a, n)))
			break;
		desc_sides(f, &d, MT_M2D_SRC_MEMTYPE_OFF, MT_M2D_SRC_HOST_OFF, MT_M2D_SRC_DEVICE_OFF,
			   MT_M2D_DST_MEMTYPE_OFF, MT_M2D_DST_HOST_OFF, MT_M2D_DST_DEVICE_OFF);
		f->bytes = W(&d, MT_M2D_WIDTH_OFF) * W(&d, MT_M2D_HEIGHT_OFF);
		return f->direction;
	case MT_DIRSRC_DESC3D:
		if (bpf_probe_read_user(&d, MT_M3D_SIZE, (void *)arg_at(a, n)))
			break;
		desc_sides(f, &d, MT_M3D_SRC_MEMTYPE_OFF, MT_M3D_SRC_HOST_OFF, MT_M3D_SRC_DEVICE_OFF,
			   MT_M3D_DST_MEMTYPE_OFF, MT_M3D_DST_HOST_OFF, MT_M3D_DST_DEVICE_OFF);
		f->bytes = W(&d, MT_M3D_WIDTH_OFF) * W(&d, MT_M3D_HEIGHT_OFF) * W(&d, MT_M3D_DEPTH_OFF);
		return f->direction;
	case MT_DIRSRC_PARMS3D:
		if (bpf_probe_read_user(&d, MT_P3D_SIZE, (void *)arg_at(a, n)))
			break;
		f->direction = dir_of_kind(W32(&d, MT_P3D_KIND_OFF));
		f->bytes = W(&d, MT_P3D_WIDTH_OFF) * W(&d, MT_P3D_HEIGHT_OFF) * W(&d, MT_P3D_DEPTH_OFF);
		f->src = W(&d, MT_P3D_SRC_PTR_OFF);
		f->dst = W(&d, MT_P3D_DST_PTR_OFF);
		return f->direction;
	case MT_DIRSRC_BATCH:
	case MT_DIRSRC_BATCH3D:
		/* dst and src are the arrays (none for 3D); BYTES named the sizes (operations) array. */
		f->sizes = f->bytes;
		f->bytes = arg_at(a, n); /* the count */
		f->direction = MT_DIR_DEFAULT;
		return f->direction;
	}
	f->direction = MT_DIR_UNKNOWN;
	return f->direction;
}

#endif /* __MEMTRACE_COPYARGS_BPF_H */
