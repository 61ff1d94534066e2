/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Checksums, and address and port rewrites with incremental checksum
 * updates.
 *
 * The IPv4 header checksum covers the addresses; the TCP/UDP checksum covers
 * the ports and, through the pseudo-header, the addresses too
 * (BPF_F_PSEUDO_HDR). A UDP checksum of zero means "none" and must stay
 * zero: BPF_F_MARK_MANGLED_0 makes the kernel leave it alone, and write
 * 0xffff should an update ever produce zero.
 *
 * tc rewrites through the skb helpers (rewrite_l4addr), which know the
 * skb's checksum offload state. XDP has no skb and writes the headers
 * itself, updating the checksums with csum_replace32/16, and
 * csum_replace_v6 for an IPv6 address (RFC 1624).
 */
#ifndef SLUICE_CSUM_H
#define SLUICE_CSUM_H

#include "consts.h"
#include "parse.h"

/* csum_fold - fold a 32-bit one's complement sum into the 16-bit checksum. */
static __always_inline __u16 csum_fold(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)~csum;
}

/* csum_replace32 - RFC 1624 update of checksum @check for a 32-bit field. */
static __always_inline __u16 csum_replace32(__u16 check, __u32 from, __u32 to)
{
	__u32 sum = (__u16)~check;

	sum += (__u16)~(__u16)from + (__u16)~(__u16)(from >> 16);
	sum += (__u16)to + (__u16)(to >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* csum_replace16 - RFC 1624 update of checksum @check for a 16-bit field. */
static __always_inline __u16 csum_replace16(__u16 check, __u16 from, __u16 to)
{
	__u32 sum = (__u16)~check;

	sum += (__u16)~from + to;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/*
 * csum_diff_v6 - what bpf_csum_diff(@from, 16, @to, 16, 0) returns: the
 * 32-bit one's complement sum of @from's words complemented and @to's,
 * for bpf_l4_csum_replace (BPF_F_PSEUDO_HDR, size 0) to apply; computed
 * here rather than by the helper, whose call and scratch copy cost more
 * than these few instructions on every rewrite of an IPv6 address. Each
 * 64-bit term is under 2^33: eight fit, and two folds bring the carries
 * back in.
 */
static __always_inline __u32 csum_diff_v6(const union v6addr *from,
					  const union v6addr *to)
{
	__u64 sum = 0;
	int i;

#pragma unroll
	for (i = 0; i < 4; i++)
		sum += (__u64)(__u32)~from->p[i] + (__u32)to->p[i];
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	return (__u32)sum;
}

/*
 * csum_replace_v6 - RFC 1624 update of checksum @check for a 128-bit field
 * (an IPv6 address in a pseudo-header): csum_diff_v6's 32-bit sum (a
 * 32-bit word's halves are its two 16-bit terms, 2^16 being 1 to a one's
 * complement sum), with the old checksum, folded to 16 bits. The same
 * result as summing the sixteen 16-bit differences, in half the
 * instructions.
 */
static __always_inline __u16
csum_replace_v6(__u16 check, const union v6addr *from, const union v6addr *to)
{
	__u64 sum = (__u64)(__u16)~check + csum_diff_v6(from, to);

	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

#define IP_SADDR_OFF offsetof(struct iphdr, saddr)
#define IP_DADDR_OFF offsetof(struct iphdr, daddr)
#define IP_CSUM_OFF  offsetof(struct iphdr, check)
#define L4_SPORT_OFF 0 /* same for TCP and UDP */
#define L4_DPORT_OFF 2

/*
 * rewrite_port - write the port @to over @from at @off, and update the L4
 * checksum at @csum_off (@l4_flags: bpf_l4_csum_replace's flags, but the
 * size). The port half of rewrite_l4addr and rewrite6_l4addr (tc6.h).
 * Returns 0 or a negative error from a helper.
 */
static __always_inline int rewrite_port(struct __sk_buff *skb, __u32 csum_off,
					__u64 l4_flags, __u32 off, __be16 from,
					__be16 to)
{
	int err = bpf_l4_csum_replace(skb, csum_off, from, to,
				      l4_flags | sizeof(to));

	if (err < 0)
		return err;
	return bpf_skb_store_bytes(skb, off, &to, sizeof(to), 0);
}

/*
 * rewrite_l4addr - replace one <address, port> of @p's packet.
 * @to_dst: rewrite the destination if true, else the source.
 *
 * A later fragment (p->frag_later) gets only its address rewritten.
 *
 * Returns 0 or a negative error from a helper (the packet may then be half
 * rewritten: callers drop it).
 */
static __always_inline int rewrite_l4addr(struct __sk_buff *skb,
					  const struct pkt4 *p, bool to_dst,
					  __be32 new_addr, __be16 new_port)
{
	__be32 old_addr = to_dst ? p->daddr : p->saddr;
	__be16 old_port = to_dst ? p->dport : p->sport;
	__u32 addr_off = p->l3_off + (to_dst ? IP_DADDR_OFF : IP_SADDR_OFF);
	__u32 port_off = p->l4_off + (to_dst ? L4_DPORT_OFF : L4_SPORT_OFF);
	__u64 l4_flags = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	int err;

	if (old_addr != new_addr) {
		/* A later fragment has no L4 header: its first fragment's
		 * rewrite fixes the checksum of the whole datagram.
		 */
		if (!p->frag_later) {
			err = bpf_l4_csum_replace(
				skb, p->csum_off, old_addr, new_addr,
				l4_flags | BPF_F_PSEUDO_HDR | sizeof(new_addr));
			if (err < 0)
				return err;
		}
		err = bpf_l3_csum_replace(skb, p->l3_off + IP_CSUM_OFF,
					  old_addr, new_addr, sizeof(new_addr));
		if (err < 0)
			return err;
		err = bpf_skb_store_bytes(skb, addr_off, &new_addr,
					  sizeof(new_addr), 0);
		if (err < 0)
			return err;
	}
	if (old_port != new_port && !p->frag_later)
		return rewrite_port(skb, p->csum_off, l4_flags, port_off,
				    old_port, new_port);
	return 0;
}

/* csum_buf - the Internet checksum of @len bytes at @buf (len % 4 == 0). */
static __always_inline __u16 csum_buf(void *buf, __u32 len)
{
	return csum_fold((__u32)bpf_csum_diff(NULL, 0, buf, len, 0));
}

#endif /* SLUICE_CSUM_H */
