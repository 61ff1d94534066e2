/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * One source for both address families. The family-dependent code of
 * lb.h, affinity.h and socklb.h is written once, in their *_fam.h
 * templates, which those headers include twice: with LB_FAMILY 4 and with
 * LB_FAMILY 6. A template names its types, maps and helpers through FAM()
 * (the instance of the family being built, defined below) and its
 * functions through FN(): an IPv4 function keeps its name, its IPv6 twin
 * takes a 6 suffix (select_backend_slot, select_backend_slot6); or
 * SOCK_FN(): sock4_x, sock6_x. The IPv4 code the compiler sees is the code
 * it saw before the templates: the families share text, not instructions.
 */
#ifndef SLUICE_FAMILY_H
#define SLUICE_FAMILY_H

#include "consts.h"
#include "structs.h"
#include "maps.h"

#define FAM_CAT_(a, b) a##b
#define FAM_CAT(a, b)  FAM_CAT_(a, b)

/* FAM(x) - x_4 or x_6, after LB_FAMILY. */
#define FAM(x) FAM_CAT(x##_, LB_FAMILY)

#define FN_4(x) x
#define FN_6(x) x##6
/* FN(x) - an IPv4 function's name x, or its IPv6 twin's x6. */
#define FN(x) FAM_CAT(FN_, LB_FAMILY)(x)

/* SOCK_FN(x) - sock4_x or sock6_x. */
#define SOCK_FN(x) FAM_CAT(FAM_CAT(sock, LB_FAMILY), _##x)

/* lb6_addr_eq - whether two IPv6 addresses are the same. */
static __always_inline bool lb6_addr_eq(const union v6addr *a,
					const union v6addr *b)
{
	return ((a->p[0] ^ b->p[0]) | (a->p[1] ^ b->p[1]) |
		(a->p[2] ^ b->p[2]) | (a->p[3] ^ b->p[3])) == 0;
}

/* Parsed packets (parse.h, parse6.h). */
#define pkt_t_4 struct pkt4
#define pkt_t_6 struct pkt6
/* Addresses (network order), by value. */
#define addr_t_4	__be32
#define addr_t_6	union v6addr
#define addr_eq_4(a, b) ((a) == (b))
#define addr_eq_6(a, b) lb6_addr_eq(&(a), &(b))
/* Frontends and backends (lb.h). */
#define lb_key_4	  struct lb4_key
#define lb_key_6	  struct lb6_key
#define lb_backend_4	  struct lb4_backend
#define lb_backend_6	  struct lb6_backend
#define services_map_4	  sluice_services_v2
#define services_map_6	  sluice6_services_v2
#define slots_map_4	  sluice_slots_v1
#define slots_map_6	  sluice6_slots_v1
#define backends_map_4	  sluice_backends_v2
#define backends_map_6	  sluice6_backends_v2
#define service_ips_map_4 sluice_service_ips_v1
#define service_ips_map_6 sluice6_service_ips_v1
#define src_range_key_4	  struct src_range_key
#define src_range_key_6	  struct src_range6_key
#define src_range_map_4	  sluice_src_ranges_v1
#define src_range_map_6	  sluice6_src_ranges_v1
/* prefixlen of a source range key of a whole address: the frontend, the
 * address */
#define src_range_bits_4 (64 + 32)
#define src_range_bits_6 (160 + 128)
#define node_cidr_key_4	 struct node_cidr_key
#define node_cidr_key_6	 struct node_cidr6_key
#define node_cidrs_map_4 sluice_node_cidrs_v1
#define node_cidrs_map_6 sluice6_node_cidrs_v1
/* prefixlen of a node CIDR key of a whole address: the kind, the address */
#define node_cidr_bits_4 (32 + 32)
#define node_cidr_bits_6 (32 + 128)
/* Session affinity (affinity.h). */
#define aff_client_t_4 __u64
#define aff_client_t_6 union v6addr
#define aff_key_t_4    struct lb4_affinity_key
#define aff_key_t_6    struct lb6_affinity_key
#define aff_t_4	       struct lb4_affinity
#define aff_t_6	       struct lb6_affinity
#define aff_map_4      sluice_session_affinity_v1
#define aff_map_6      sluice6_affinity_v1
/* The socket path (socklb.h). */
#define udp_stick_key_t_4 struct sock_udp_stick_key
#define udp_stick_key_t_6 struct sock6_udp_stick_key
#define udp_stick_t_4	  struct sock_udp_stick
#define udp_stick_t_6	  struct sock6_udp_stick
#define udp_stick_map_4	  sluice_udp_stick_v1
#define udp_stick_map_6	  sluice6_udp_stick_v1
#define sock_rev_key_t_4  struct sock_rev_key
#define sock_rev_key_t_6  struct sock6_rev_key
#define sock_rev_t_4	  struct sock_rev_entry
#define sock_rev_t_6	  struct sock6_rev_entry
#define sock_rev_map_4	  sluice_sock_rev_v1
#define sock_rev_map_6	  sluice6_sock_rev_v1
/* The conntrack flush sets (ctgc.c, sockdestroy.c). */
#define ct_backend_key_t_4 struct ct_backend_key
#define ct_backend_key_t_6 struct ct6_backend_key
#define ct_flush_map_4	   sluice_ct_flush_v1
#define ct_flush_map_6	   sluice6_ct_flush_v1

/*
 * lb6_v4_mapped - whether @a is an IPv4-mapped address (::ffff:0:0/96),
 * which a dual-stack socket reaches an IPv4 address by.
 */
static __always_inline bool lb6_v4_mapped(const union v6addr *a)
{
	return a->p[0] == 0 && a->p[1] == 0 && a->p[2] == bpf_htonl(0x0000ffff);
}

/*
 * addr_loopback - whether @a is a loopback address (127.0.0.0/8), which
 * is no frontend of a packet from a device (tc_ingress, xdp_fwd): the
 * localhost NodePorts there serve the node's own sockets only, at the
 * socket (socklb.h, sock_loopback_served, asked for such a destination
 * only). IPv6 has none: ::1 is never a frontend (the agent
 * writes none), nor is an IPv4-mapped address one of the IPv6 maps.
 */
#define addr_loopback_4(a) \
	(((a) & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000))
#define addr_loopback_6(a) false

#endif /* SLUICE_FAMILY_H */
