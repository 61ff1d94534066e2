/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every map Sluice uses. All are pinned by name under the agent's pin path
 * (BPFFS/sluice/), so the socket, tc and XDP objects share them and they
 * outlive the agent. max_entries here are the defaults; the agent overrides
 * them from its Config before load, and refuses to reuse a pinned map of a
 * different size.
 *
 * The _vN suffix of a name is the version of the map's layout (its type,
 * key and value, structs.h). A change of layout bumps it, so that the new
 * agent finds no pin of the old layout under the new name: it converts the
 * old map into the new one at Open (pkg/datapath pins.go says how) instead
 * of refusing to start until `sluice cleanup`. The kernel keeps 15
 * characters of a name (bpftool shows "sluice_conntrac"); the pin has all
 * of it.
 */
#ifndef SLUICE_MAPS_H
#define SLUICE_MAPS_H

#include "consts.h"
#include "structs.h"

/*
 * Key: struct lb4_key. Value: struct lb4_service. Written by the agent.
 * The masters of the frontends; their slots are in sluice_slots_v1. Sized
 * by --max-services: each frontend has a service id.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb4_service);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_services_v2 SEC(".maps");

/*
 * Key: __u32 index (host order). Value: __u32 backend id (host order, 0:
 * empty). Agent. The backend slots of the frontends, each frontend's in a
 * range its master names (structs.h). Mmapable: the agent writes the
 * slots as memory, plain 32-bit stores where a hash took an insert per
 * slot (a third of a second at 30,000 Services x 10). Sized by the agent
 * (twice --max-service-entries: ranges are powers of two).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1 << 21);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_slots_v1 SEC(".maps");

/*
 * Key: __u32 backend id (host order). Value: struct lb4_backend. Agent. An
 * array indexed by the id, so that the per-packet lookup is a bounds check
 * and an address computation the verifier inlines: no hashing, no helper
 * call. An id no backend holds is an entry without BE_F_PRESENT (structs.h).
 * Sized by the agent for every id it may hand out (backendSlots).
 * Mmapable: the agent reads it whole (a dump) as memory, where a batch
 * lookup of its hundreds of thousands of entries takes a third of a second.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, 525313);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_backends_v2 SEC(".maps");

/*
 * Key: __u32 service id (host order). Value: struct lb4_rev_nat. Agent.
 * An array indexed by the id, as the backends are, sized for every id the
 * reconciler hands out (Config.MaxServices, plus its quarantine, plus id
 * 0): the agent writes it as memory (BPF_F_MMAPABLE), no hash insert per
 * service. An entry without RN_F_PRESENT is an id no service holds.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb4_rev_nat);
	__uint(max_entries, 65793);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_rev_nat_v2 SEC(".maps");

/*
 * Key: struct ct4_key. Value: struct ct4_entry. Established flows and SNAT
 * port reservations, written by tc and XDP; a plain hash, so that nothing
 * evicts a live flow: sluice_ct_gc deletes expired entries. Preallocated:
 * inserts from the datapath never allocate. Sized by Config.MaxConntrack.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct4_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_conntrack_v2 SEC(".maps");

/*
 * Key: struct ct4_key. Value: struct ct4_entry. Half-open flows (no reply
 * yet), written by tc and XDP; an LRU, so a flood of new flows evicts only
 * its own kind. Sized by Config.MaxConntrackNew.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct4_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_ct_new_v1 SEC(".maps");

/*
 * Key: __u32 family index (0: IPv4, 1: IPv6). Value: struct ct_admit. The
 * half-open share of each family's sluice_conntrack (conntrack.h,
 * ct_admit) and whether its sluice_ct_new may hold entries.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_admit);
	__uint(max_entries, 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_ct_admit_v1 SEC(".maps");

/* Key and index as sluice_ct_admit_v1. Value: struct ct_admit_pcpu. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_admit_pcpu);
	__uint(max_entries, 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_ct_pcpu_v1 SEC(".maps");

/*
 * Key: struct ct_backend_key. Value: __u8 (1). Written by the agent just
 * before a flush run of sluice_ct_gc, emptied after it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_backend_key);
	__type(value, __u8);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_ct_flush_v1 SEC(".maps");

/*
 * IPv6 conntrack (tc.c), as sluice_conntrack_v2, sluice_ct_new_v1 and
 * sluice_ct_flush_v1: keys struct ct6_key and struct ct6_backend_key,
 * values struct ct6_entry; sized by Config.MaxConntrack and
 * MaxConntrackNew like their IPv4 twins.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct6_key);
	__type(value, struct ct6_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_conntrack_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct6_key);
	__type(value, struct ct6_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_ct_new_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct6_backend_key);
	__type(value, __u8);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_ct_flush_v1 SEC(".maps");

/* Key: struct frag6_key. Value: struct frag4_ports. As sluice_fragments_v1. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag6_key);
	__type(value, struct frag4_ports);
	__uint(max_entries, 8192);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_fragments_v1 SEC(".maps");

/*
 * Key: __u32 slot (TC6_PROG_*). Value: a program. The IPv6 tc programs
 * (tc6.h), which the IPv4 entries tail-call for an IPv6 packet; put there
 * by the agent when it loads them (a new agent replaces them). Pinned, as
 * the links of the entries that call it are: the kernel empties a program
 * array when the last reference from user space goes, so an unpinned one
 * would stop IPv6 translation (and reverse NAT of established IPv6 flows)
 * whenever the agent stops or restarts.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_tc_v1 SEC(".maps");

/*
 * Key: __u32 slot (0). Value: a program. The IPv6 XDP program (xdp.c),
 * which the IPv4 entry tail-calls for an IPv6 frame; put there by the
 * agent when it loads them. Pinned, as sluice6_tc_v1 is; with XDP off the
 * agent removes the pin (Prune) with the XDP links.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_xdp_v1 SEC(".maps");

/* Key: struct sock_rev_key. Value: struct sock_rev_entry. Socket programs. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_rev_key);
	__type(value, struct sock_rev_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_sock_rev_v1 SEC(".maps");

/*
 * Key: struct sock_udp_stick_key. Value: struct sock_udp_stick. sendmsg4.
 * Sized like sluice_sock_rev_v1 (Config.MaxSockRev).
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_udp_stick_key);
	__type(value, struct sock_udp_stick);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_udp_stick_v1 SEC(".maps");

/*
 * Key: struct lb4_affinity_key. Value: struct lb4_affinity. Session
 * affinity (sessionAffinity ClientIP), written by connect4/sendmsg4, tc
 * and XDP; an LRU, so that clients nobody has seen for long make room.
 * Sized by Config.MaxAffinity.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_affinity_key);
	__type(value, struct lb4_affinity);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_session_affinity_v1 SEC(".maps");

/*
 * Key: struct affinity_fix_key. Value: __u32 slot (host order). Written by
 * the agent just before a run of sluice_aff_fix, emptied after it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct affinity_fix_key);
	__type(value, __u32);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_aff_fix_v1 SEC(".maps");

/*
 * Key: __u32 enum metric_reason. Value: __u64 count per CPU. Sized for
 * METRIC_SLOTS reasons, so that appending one is no change of layout.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, METRIC_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_metrics_v1 SEC(".maps");

/* Key: __u32 ifindex. Value: struct node_dev. The agent writes it on attach. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct node_dev);
	__uint(max_entries, 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_devices_v1 SEC(".maps");

/* Key: struct src_range_key. Value: __u8 (1). Written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_range_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_src_ranges_v1 SEC(".maps");

/*
 * Key: __be32 address. Value: __u8 (1). The service IPs, written by the
 * agent's reconciler. Sized by Config.MaxServices, as sluice_rev_nat_v2:
 * every ClusterIP has a frontend.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __be32);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_service_ips_v1 SEC(".maps");

/* Key: struct node_cidr_key. Value: __u8 (1). The agent writes it at start. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct node_cidr_key);
	__type(value, __u8);
	__uint(max_entries, 64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_node_cidrs_v1 SEC(".maps");

/*
 * Key: struct frag4_key. Value: struct frag4_ports. Written by tc. A
 * record is needed only while its datagram's fragments pass (Linux gives
 * up reassembly after 30 s): the LRU reclaims it. Cilium sizes its
 * IPV4_FRAGMENTS map the same.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag4_key);
	__type(value, struct frag4_ports);
	__uint(max_entries, 8192);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_fragments_v1 SEC(".maps");

/*
 * Key: __u32 service id (host order). Value: struct svc_stats per CPU.
 * Per-Service counters (svcstats.h). Sized by the agent: the ids it hands
 * out (Config.MaxServices plus the reconciler's id quarantine) with
 * --service-metrics, one entry without (the programs never touch it then,
 * and an array's memory is allocated whole, per CPU).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct svc_stats);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_svc_stats_v1 SEC(".maps");

/*
 * Key: __u32 0. Value: struct icmp_rl_conf. The kernel's ICMP rate limit
 * sysctls as the agent last read them (icmp.h, icmp_rl_allow, on tc's
 * error path only): written when it starts, before a program is
 * attached, and whenever it sees them changed (pkg/datapath icmprl.go):
 * a sysctl changed takes effect without a reload. An agent upgraded onto
 * pins without it (the previous release's programs had the values as
 * constants) creates it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct icmp_rl_conf);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_icmp_limits_v1 SEC(".maps");

/*
 * Key: __u32 0. Value: struct explain_record, per CPU. What a dry run of
 * the tc program decided (explain.h), written by dry runs only. Not
 * pinned: it is no state, every object has its own, and only tc's is
 * used (sluicectl finds it among that program's maps). The name fits the
 * kernel's 15 characters whole, so its version shows in the map's info.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct explain_record);
	__uint(max_entries, 1);
} sluice_expl_v1 SEC(".maps");

/*
 * Key: __u32 0. Value: struct explain6_record, per CPU: the IPv6
 * addresses of an IPv6 dry run, beside its sluice_expl_v1 record. Not
 * pinned, as sluice_expl_v1.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct explain6_record);
	__uint(max_entries, 1);
} sluice_expl6_v1 SEC(".maps");

/*
 * Key: __u32 EXPLAIN_PROG_*. Value: a program fd: the dry twins of the tc
 * programs, IPv4's and IPv6's (explain.h), put there by the agent when it
 * loads them. Not pinned, like sluice_expl_v1.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 4);
} sluice_dry_v1 SEC(".maps");

/*
 * IPv6 twins of the maps above (structs.h says how the families share
 * ids). Sized by the agent like their IPv4 twins. The names start
 * sluice6_ so that the kernel's 15 characters tell the families apart.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb6_key);
	__type(value, struct lb4_service);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_services_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1 << 21);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_slots_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb6_backend);
	__uint(max_entries, 525313);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_backends_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb6_rev_nat);
	__uint(max_entries, 65793);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_rev_nat_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, union v6addr);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_service_ips_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_range6_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_src_ranges_v1 SEC(".maps");

/* Key: struct node_cidr6_key. Value: __u8 (1). The agent writes it at start. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct node_cidr6_key);
	__type(value, __u8);
	__uint(max_entries, 64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_node_cidrs_v1 SEC(".maps");

/*
 * Key: __u32 ifindex. Value: union v6addr. The agent writes it on attach,
 * beside sluice_devices_v1, and sizes it as that.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, union v6addr);
	__uint(max_entries, 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_devices_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_affinity_key);
	__type(value, struct lb6_affinity);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_affinity_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct affinity_fix6_key);
	__type(value, __u32);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_aff_fix_v1 SEC(".maps");

/*
 * The IPv6 socket path's (sock.c), as sluice_sock_rev_v1 and
 * sluice_udp_stick_v1: both sized by Config.MaxSockRev.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock6_rev_key);
	__type(value, struct sock6_rev_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_sock_rev_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock6_udp_stick_key);
	__type(value, struct sock6_udp_stick);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice6_udp_stick_v1 SEC(".maps");

#endif /* SLUICE_MAPS_H */
