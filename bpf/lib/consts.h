/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Includes and constants shared by every Sluice program.
 *
 * Only UAPI headers and libbpf's helper headers are used (no vmlinux.h),
 * vendored in bpf/vendor (update.sh) and built with -nostdinc, so the
 * objects build the same on any machine with the pinned clang. Per-node
 * settings are not constants: they are in config.h.
 */
#ifndef SLUICE_CONSTS_H
#define SLUICE_CONSTS_H

#include <stdbool.h>
#include <stddef.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/icmp.h>
#include <linux/icmpv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* errno values returned to user space (linux/errno.h is not a UAPI header). */
#define EPERM	     1
#define ENOENT	     2
#define E2BIG	     7
#define EEXIST	     17
#define ENOSPC	     28
#define ECONNREFUSED 111
#define EHOSTUNREACH 113

/*
 * The values stored in maps (conntrack directions and flags, service
 * flags, metric reasons) are enums in structs.h: they are part of the ABI
 * with the agent, which gets them from the BTF.
 */

/* TCP header flag bits (byte 13 of the header). */
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#define AF_INET	 2
#define AF_INET6 10

/* IPv4 fragment bits of iphdr.frag_off (host order). */
#define IP_DF	  0x4000
#define IP_MF	  0x2000
#define IP_OFFSET 0x1fff

#define NSEC_PER_SEC 1000000000ULL

/*
 * now_ns - the clock every expiry, stamp and last_seen in Sluice's maps is
 * kept in: CLOCK_MONOTONIC_COARSE (Linux 5.11+), the timekeeper's reading
 * at the last tick. It is CLOCK_MONOTONIC's base, behind it by less than
 * one tick (1-10 ms), so entries written with bpf_ktime_get_ns() (by an
 * older release, or by one still running during an upgrade) keep their
 * meaning: timeouts are seconds, and an entry expiring within a tick of
 * "now" is taken for alive a tick longer at most. Every program run reads
 * it, where bpf_ktime_get_ns() read the clock source (an ordered TSC read
 * here, ~34 ns a call against ~5: BenchmarkClock; half a microsecond of
 * the ~6.5 us the tc programs took per new connection, issue 14's
 * sixty-fourth pass); this reads a variable. It does not go back between
 * CPUs (one timekeeper), which the signed comparisons do not rely on
 * anyway. The agent reads the same clock (pkg/datapath monotonicNow), so
 * that what it plants or judges a nanosecond either side of "now" agrees
 * with the programs; the conntrack GC, a syscall program, which may not
 * call the helper, takes the agent's reading (ctgc.c).
 */
static __always_inline __u64 now_ns(void)
{
	return bpf_ktime_get_coarse_ns();
}

#endif /* SLUICE_CONSTS_H */
