/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every map Sluice uses. All are pinned by name under the agent's pin path
 * (BPFFS/sluice/), so the socket and tc objects share them and they outlive
 * the agent. max_entries here are the defaults; the agent overrides them
 * from its Config before load, and refuses to reuse a pinned map of a
 * different size.
 */
#ifndef SLUICE_MAPS_H
#define SLUICE_MAPS_H

#include "consts.h"
#include "structs.h"

/* Key: struct lb4_key. Value: struct lb4_service. Written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb4_service);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_services SEC(".maps");

/* Key: __u32 backend id (host order). Value: struct lb4_backend. Agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_backends SEC(".maps");

/* Key: __u32 service id (host order). Value: struct lb4_rev_nat. Agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_rev_nat);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_rev_nat SEC(".maps");

/*
 * Key: struct ct4_key. Value: struct ct4_entry. Written by tc programs.
 * (The kernel keeps 15 characters of a name: bpftool shows
 * "sluice_conntrac"; the pin is sluice_conntrack.)
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct4_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_conntrack SEC(".maps");

/* Key: struct sock_rev_key. Value: struct sock_rev_entry. Socket programs. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_rev_key);
	__type(value, struct sock_rev_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_sock_rev SEC(".maps");

/*
 * Key: struct lb4_affinity_key. Value: struct lb4_affinity. sendmsg4.
 * Sized like sluice_sock_rev (Config.MaxSockRev).
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_affinity_key);
	__type(value, struct lb4_affinity);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_affinity SEC(".maps");

/* Key: __u32 enum metric_reason. Value: __u64 count per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, METRIC_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_metrics SEC(".maps");

/* Key: __u32 ifindex. Value: struct node_dev. The agent writes it on attach. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct node_dev);
	__uint(max_entries, 64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_devices SEC(".maps");

/* Key: struct src_range_key. Value: __u8 (1). Written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_range_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_src_ranges SEC(".maps");

#endif /* SLUICE_MAPS_H */
