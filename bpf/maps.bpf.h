/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Map helpers every sensor shares (as libbpf-tools' maps.bpf.h). */
#ifndef __MEMTRACE_MAPS_BPF_H
#define __MEMTRACE_MAPS_BPF_H

/* The value at key, inserting init first if the key is absent (another CPU
 * may insert it meanwhile: BPF_NOEXIST, then look again); NULL when the map
 * is full. */
static __always_inline void *lookup_or_try_init(void *map, const void *key, const void *init)
{
	void *v = bpf_map_lookup_elem(map, key);

	if (v)
		return v;
	bpf_map_update_elem(map, key, init, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

#endif /* __MEMTRACE_MAPS_BPF_H */
