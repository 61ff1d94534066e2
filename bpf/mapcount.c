// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * How many entries each hash map holds, without walking it (an iter/bpf_map
 * program calling the bpf_map_sum_elem_count kfunc, Linux 6.6+).
 *
 * sluice_map_fill_ratio (a Prometheus scrape, sluicectl status) wants the
 * entries of every hash map of ours. The kernel keeps a per-CPU count of
 * the elements of every hash map (LRU and per-CPU ones included), but no
 * system call reads it: walking a map with batch lookups copies every key
 * and value out, 87 ms of CPU per scrape at 10,000 Services. This
 * iterator visits every map of the system instead and writes, for each,
 * its id and that count (struct map_count_rec); the agent keeps the
 * records of its own maps. The cost is one record per map on the node,
 * whatever the maps hold.
 *
 * A map without the count (arrays, LPM tries) reads 0: the agent asks
 * this only for hash maps, and walks the rest.
 */
#include "lib/consts.h"
#include "lib/structs.h"

/*
 * The kernel's types this program reads, as far as it reads them, relocated
 * against the running kernel's BTF at load (CO-RE).
 */
struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_map {
	__u32 id;
} __attribute__((preserve_access_index));

struct bpf_iter__bpf_map {
	struct bpf_iter_meta *meta;
	struct bpf_map *map; /* NULL at the end */
} __attribute__((preserve_access_index));

extern __s64 bpf_map_sum_elem_count(const struct bpf_map *map) __ksym;

/* One map the iterator reports. */
struct map_count_rec {
	__u32 id;
	__u32 pad;
	__s64 count; /* elements, summed over CPUs */
};

BTF_EXPORT(struct map_count_rec, map_count_rec);
_Static_assert(sizeof(struct map_count_rec) == 16, "map_count_rec size");

SEC("iter/bpf_map")
int sluice_map_count(struct bpf_iter__bpf_map *ctx)
{
	struct bpf_map *map = ctx->map;
	struct map_count_rec rec = {};

	if (!map)
		return 0;
	rec.id = map->id;
	rec.count = bpf_map_sum_elem_count(map);
	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
