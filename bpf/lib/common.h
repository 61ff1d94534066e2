/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Includes, constants and small helpers shared by every Sluice program.
 *
 * Only UAPI headers and libbpf's helper headers are used (no vmlinux.h),
 * vendored in bpf/include (update.sh) and built with -nostdinc, so the
 * objects build the same on any machine with the pinned clang.
 * Per-node knobs are `volatile const` globals set by the agent before load,
 * never #ifdefs: one object serves every node.
 */
#ifndef SLUICE_COMMON_H
#define SLUICE_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/icmp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* errno values returned to user space (linux/errno.h is not a UAPI header). */
#define EPERM	     1
#define ECONNREFUSED 111

/* ct4_key.dir */
#define CT_FORWARD 0
#define CT_REVERSE 1

/* lb4_service.flags (slot 0): enum svc_flags in structs.h. */

/* ct4_entry.flags */
#define CT_F_SNAT    0x01 /* source-NATed flow to a remote backend */
#define CT_F_FIN_FWD 0x02 /* TCP FIN seen from the client */
#define CT_F_FIN_REV 0x04 /* TCP FIN seen from the backend */
#define CT_F_RST     0x08 /* TCP RST seen either way */

/* TCP header flag bits (byte 13 of the header). */
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#define AF_INET 2

/* IPv4 fragment bits of iphdr.frag_off (host order). */
#define IP_MF	  0x2000
#define IP_OFFSET 0x1fff

#define NSEC_PER_SEC 1000000000ULL

/*
 * Conntrack idle timeouts, set by the agent before load. An entry whose
 * last_seen is older than its timeout is treated as absent (the LRU map
 * reclaims it later).
 */
volatile const __u64 ct_timeout_tcp_ns = 6ULL * 3600 * NSEC_PER_SEC;
volatile const __u64 ct_timeout_udp_ns = 60ULL * NSEC_PER_SEC;
/* A TCP flow that saw a RST, or a FIN both ways, lives this much longer. */
volatile const __u64 ct_timeout_close_ns = 10ULL * NSEC_PER_SEC;

/*
 * Source ports for SNAT to the node's address, host order, inclusive. The
 * default stays above the kernel's default ephemeral range (32768-60999),
 * so the node's own connections do not compete for them.
 */
volatile const __u16 snat_port_min = 61000;
volatile const __u16 snat_port_max = 65535;

/* Fold a 32-bit one's complement sum into the 16-bit Internet checksum. */
static __always_inline __u16 csum_fold(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)~csum;
}

#endif /* SLUICE_COMMON_H */
