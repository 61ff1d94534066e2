/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-node settings: `volatile const` globals (.rodata) that the agent sets
 * before load (pkg/datapath configure), never #ifdefs, so one object serves
 * every node. The values here are the defaults, the same as pkg/datapath's
 * Default* (TestConfigDefaults checks that they agree).
 */
#ifndef SLUICE_CONFIG_H
#define SLUICE_CONFIG_H

#include "consts.h"
#include "structs.h"

/*
 * Conntrack idle timeouts. An entry idle for longer than its timeout is
 * treated as absent (and deleted later: conntrack.h). An established TCP
 * flow lives ct_timeout_tcp_ns, one that has seen no reply yet
 * ct_timeout_syn_ns (Cilium's SYN timeout), UDP ct_timeout_udp_ns.
 */
volatile const __u64 ct_timeout_tcp_ns = 6ULL * 3600 * NSEC_PER_SEC;
volatile const __u64 ct_timeout_syn_ns = 60ULL * NSEC_PER_SEC;
volatile const __u64 ct_timeout_udp_ns = 60ULL * NSEC_PER_SEC;
/* A TCP flow that saw a RST, or a FIN both ways, lives this much longer. */
volatile const __u64 ct_timeout_close_ns = 10ULL * NSEC_PER_SEC;
/*
 * ... unless it is source-NATed (CT_F_SNAT): then its entries, and so its
 * port, live this much, netfilter's TIME_WAIT (nf_conntrack_tcp_timeout_
 * time_wait, 120 s), for the backend may hold the tuple <node:port ->
 * backend> in TIME_WAIT (60 s on Linux) after it closed first. A port
 * search that finds no free port takes such a port over once the flow has
 * been closed for ct_timeout_close_ns (ct_create_snat).
 */
volatile const __u64 ct_timeout_snat_tw_ns = 120ULL * NSEC_PER_SEC;

/*
 * How many half-open flows of a family may be in its sluice_conntrack at
 * once (conntrack.h, ct_admit); the rest go to sluice_ct_new. 0: none
 * (every new flow goes to sluice_ct_new). The agent sets it to a quarter
 * of the table in entries (two a flow) unless told otherwise.
 */
volatile const __u32 ct_half_open_max = 32768;

/*
 * The keys of sluice_ct_admit_v1 and sluice_ct_pcpu_v1 (conntrack.h),
 * constants here, so that a lookup's key needs no room on the stack,
 * where the SNAT path's combined stack had none to spare (8 bytes of
 * frame per lookup site). Here rather than in conntrack.h for every
 * object's .rodata to be the same.
 */
volatile const __u32 ct_admit_keys[2] = { 0, 1 };

/*
 * Source ports for SNAT to the node's address, host order, inclusive. The
 * default stays above the kernel's default ephemeral range (32768-60999),
 * so the node's own connections do not compete for them.
 */
volatile const __u16 snat_port_min = 61000;
volatile const __u16 snat_port_max = 65535;

/*
 * Masquerade (kube-proxy's rules, lb4_masquerade in tc.c). node_ip4 is the
 * node's primary address (network order), what a flow to a backend behind
 * a device without an address (a pod's) is source-NATed to; 0: none.
 * have_cluster_cidr says --cluster-cidr is set (sluice_node_cidrs holds
 * it): without it no client is internal and ClusterIP traffic is never
 * masqueraded (kube-proxy without a local traffic detector).
 * masquerade_all is --masquerade-all.
 */
volatile const __be32 node_ip4 = 0;
volatile const __u8 have_cluster_cidr = 0;
volatile const __u8 masquerade_all = 0;

/*
 * The IPv6 family's node_ip4 and have_cluster_cidr: the node's primary
 * IPv6 address (zero: none), and whether --cluster-cidr has an IPv6 CIDR
 * (sluice6_node_cidrs holds it). have_cluster_cidr says the same of the
 * IPv4 CIDRs.
 */
volatile const union v6addr node_ip6 = {};
volatile const __u8 have_cluster_cidr6 = 0;

/*
 * How long XDP uses a route it looked up for an established flow at most
 * (xdp.c's route cache), when no change of the node's routing made it
 * look again sooner: the bound on how stale a cached route can be.
 */
volatile const __u64 fib_cache_ns = NSEC_PER_SEC;

/*
 * --service-metrics: count per Service (svcstats.h). A constant, so that
 * with it off the verifier removes the counting of every svc_count as
 * dead code: what is left of one is the read of this constant.
 */
volatile const __u8 service_metrics = 0;

#endif /* SLUICE_CONFIG_H */
