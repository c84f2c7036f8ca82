// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The floor of the technique: programs that only return, attached the way
 * memtrace attaches its own (bench/targets/probe_cost.py). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("uprobe")
int BPF_KPROBE(bare_enter)
{
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(bare_return)
{
	return 0;
}
