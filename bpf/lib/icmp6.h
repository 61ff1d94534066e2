/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ICMPv6 errors that tc sends itself (icmp.h is IPv4's): a destination
 * unreachable, port unreachable (type 1, code 4), for a new flow to an
 * IPv6 service without backends, or to a ClusterIP on a port no frontend
 * serves; what kube-proxy's `reject` sends for IPv6 (ip6tables REJECT's
 * default icmp6-port-unreachable; nftables' reject in the ip6 family).
 * And the errors of forwarding by redirect (nat6.h): time exceeded (hop
 * limit) and packet too big.
 *
 *   in:  eth | IPv6 C->V | ext headers | TCP/UDP ... payload
 *   out: eth (MACs swapped) | IPv6 V (or N)->C | ICMPv6 | IPv6 C->V | ext | L4 header
 *
 * Built as icmp.h builds ICMP errors (trim to the quote, room after the
 * MAC header, redirect back out of the ingress device), and for the same
 * reason the quote is the packet up to its whole fixed L4 header (or 8
 * bytes after the extension headers, or what there is of them: a packet
 * with next header 59 and no payload is quoted whole). The same packets
 * go unanswered (icmp_link_answerable, icmp6_src_answerable): a frame
 * not to this host's MAC (broadcast, multicast, another host's), or a
 * source that is no single host's (RFC 4443 2.4(e)); and the same rate
 * limits apply (icmp_rl_allow, with net.ipv6.icmp's values), and a reject
 * comes from the same kind of address (icmp6_reject_src: N, a node's
 * address, for a ClusterIP). Unlike ICMP, ICMPv6's checksum covers a
 * pseudo-header (RFC 4443 2.3), the source included.
 */
#ifndef SLUICE_ICMP6_H
#define SLUICE_ICMP6_H

#include "consts.h"
#include "csum.h"
#include "parse6.h"
#include "icmp.h"

/* The longest quote: headers and extension headers up to 160 bytes, and
 * a TCP header. A packet whose L4 header ends further in is dropped
 * rather than answered.
 */
#define ICMP6_QUOTE_MAX (160 + sizeof(struct tcphdr))
#define ICMP6_ERR_HOPS	64

/*
 * icmp6_src_answerable - whether @a names a single host the kernel would
 * answer: not :: (unspecified), ::1 (loopback, never off a wire) or
 * ff00::/8 (multicast); RFC 4443 2.4(e).
 */
static __always_inline bool icmp6_src_answerable(const union v6addr *a)
{
	if ((bpf_ntohl(a->p[0]) >> 24) == 0xff)
		return false;
	return a->p[0] | a->p[1] | a->p[2] ||
	       (a->p[3] != 0 && a->p[3] != bpf_htonl(1));
}

struct icmp6_err_hdr {
	struct ipv6hdr ip;
	struct icmp6hdr icmp;
};

#ifdef ICMP_RATE_LIMIT
/*
 * icmp6_reject_src - the source of the ICMPv6 port unreachable about a
 * packet from @client to *@addr that came in on @skb's device, written to
 * @addr: itself if it is one of the node's addresses, else the source the
 * route to @client picks (its prefsrc, else the address
 * ipv6_dev_get_saddr picks on its device), whatever its device, as
 * icmp_reject_src (icmp.h) for IPv4: see there for the lookups, their
 * flags (no BPF_FIB_LOOKUP_SKIP_NEIGH; NO_NEIGH taken as SUCCESS) and
 * what they do not follow. (A global function's pointers may be NULL:
 * checked.)
 */
__noinline int icmp6_reject_src(struct __sk_buff *skb,
				const union v6addr *client, union v6addr *addr)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET6,
		.tot_len = sizeof(struct ipv6hdr),
		.ifindex = skb->ifindex,
	};
	int ret;

	if (!client || !addr)
		return 0;
	__builtin_memcpy(fib.ipv6_src, client, sizeof(*client));
	__builtin_memcpy(fib.ipv6_dst, addr, sizeof(*addr));
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (ret == BPF_FIB_LKUP_RET_NOT_FWDED)
		return 0;
	__builtin_memset(&fib, 0, sizeof(fib));
	fib.family = AF_INET6;
	fib.l4_protocol = IPPROTO_ICMPV6;
	fib.dport = bpf_htons(ICMPV6_DEST_UNREACH << 8 | ICMPV6_PORT_UNREACH);
	fib.tot_len = sizeof(struct ipv6hdr);
	__builtin_memcpy(fib.ipv6_dst, client, sizeof(*client));
	fib.ifindex = skb->ifindex;
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SRC);
	if ((ret == BPF_FIB_LKUP_RET_SUCCESS ||
	     ret == BPF_FIB_LKUP_RET_NO_NEIGH) &&
	    (fib.ipv6_src[0] | fib.ipv6_src[1] | fib.ipv6_src[2] |
	     fib.ipv6_src[3]))
		__builtin_memcpy(addr, fib.ipv6_src, sizeof(*addr));
	return 0;
}
#else
static __always_inline int icmp6_reject_src(struct __sk_buff *skb,
					    const union v6addr *client,
					    union v6addr *addr)
{
	return 0;
}
#endif /* ICMP_RATE_LIMIT */

/*
 * icmp6_build - rewrite @skb, the packet @p, into the ICMPv6 error of
 * type and code @tc (type << 8 | code: a BPF function takes five
 * arguments) about it (@info: the header's second word, a packet too
 * big's MTU), from *@saddr to its source, and redirect it back out of its
 * ingress device: icmp6_reply once it has decided to send it. Returns
 * TC_ACT_REDIRECT, ICMP_NOT_SENT as icmp_build does, or TC_ACT_SHOT if a
 * helper failed or the quote would be too long.
 */
static __noinline int icmp6_build(struct __sk_buff *skb, const struct pkt6 *p,
				  __u32 tc, __be32 info,
				  const union v6addr *saddr)
{
	/* The pseudo-header, ICMPv6 header and quote, summed together for
	 * the checksum; bytes past the quote stay zero and add nothing.
	 */
	struct {
		union v6addr saddr;
		union v6addr daddr;
		__be32 len;
		__be32 nexthdr;
		struct icmp6hdr icmp;
		__u8 quote[ICMP6_QUOTE_MAX];
	} body = {};
	struct icmp6_err_hdr hdr = {};
	struct ethhdr eth = {};
	__u32 quote_len = p->l4_off - p->l3_off;

	quote_len += p->proto == IPPROTO_TCP ? sizeof(struct tcphdr) :
					       sizeof(struct udphdr);
	/* Another protocol's packet may end before 8 bytes: quote what it
	 * has (l3_len), as the kernel does.
	 */
	if (p->l3_len < quote_len)
		quote_len = p->l3_len;
	/* (At least the IPv6 header: a bound the verifier sees for the
	 * variable-size load below.)
	 */
	if (quote_len < sizeof(struct ipv6hdr) || quote_len > ICMP6_QUOTE_MAX)
		return TC_ACT_SHOT;
	if (p->l3_off && bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, p->l3_off, body.quote, quote_len) < 0)
		return TC_ACT_SHOT;

	body.saddr = *saddr;
	body.daddr = p->saddr;
	body.len = bpf_htonl(sizeof(body.icmp) + quote_len);
	body.nexthdr = bpf_htonl(IPPROTO_ICMPV6);
	body.icmp.icmp6_type = tc >> 8;
	body.icmp.icmp6_code = tc;
	body.icmp.icmp6_mtu = info;
	body.icmp.icmp6_cksum = csum_buf(&body, sizeof(body));

	hdr.ip.version = 6;
	hdr.ip.payload_len = bpf_htons(sizeof(hdr.icmp) + quote_len);
	hdr.ip.nexthdr = IPPROTO_ICMPV6;
	hdr.ip.hop_limit = ICMP6_ERR_HOPS;
	__builtin_memcpy(&hdr.ip.saddr, saddr, sizeof(*saddr));
	__builtin_memcpy(&hdr.ip.daddr, &p->saddr, sizeof(p->saddr));
	hdr.icmp = body.icmp;

	return icmp_send_back(skb, p->l3_off, quote_len, &eth, &hdr,
			      sizeof(hdr));
}

/*
 * icmp6_reply - answer @p, the packet @skb, with the ICMPv6 error of
 * @type and @code (@info: a packet too big's MTU), if the kernel would
 * send it: to a packet it would answer (icmp_link_answerable,
 * icmp6_src_answerable), within its rate limits for the types of
 * net.ipv6.icmp.ratemask (icmpv6_mask_allow; tc sends types 1 to 3:
 * icmp_rl_allow). Then icmp6_build turns the packet into the error, from
 * its destination, or, for a @reject, from the address the kernel's
 * would come from (icmp6_reject_src), as icmp_reply does. Returns what
 * icmp_reply does.
 */
static __always_inline int icmp6_reply(struct __sk_buff *skb,
				       const struct pkt6 *p, __u8 type,
				       __u8 code, __be32 info, bool reject)
{
	union v6addr saddr = p->daddr;

	if (!icmp_link_answerable(skb) || !icmp6_src_answerable(&p->saddr))
		return ICMP_NOT_SENT;
	if (!icmp_rl_allow(&p->saddr, true, type, code, explain_dry(p)))
		return ICMP_NOT_SENT;
	if (reject)
		icmp6_reject_src(skb, &p->saddr, &saddr);
	return icmp6_build(skb, p, (__u32)type << 8 | code, info, &saddr);
}

#endif /* SLUICE_ICMP6_H */
