/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ICMP errors that tc sends itself, on the per-packet path: a port
 * unreachable for a flow to a service with no backends, and, where tc
 * forwards a packet itself (nat.h), a time exceeded or a fragmentation
 * needed in place of the stack's.
 *
 * Dropping would leave the client retrying until it times out. Instead the
 * packet is turned, in place, into the ICMP error from its destination (the
 * VIP, the NodePort) to its source and sent back out of the device it came
 * in on. Linux reports a port unreachable as ECONNREFUSED to both a TCP
 * connect and a connected UDP socket, just as if the VIP had refused the
 * port itself; a fragmentation needed lowers the path MTU of the socket's
 * route.
 *
 *   in:  eth | IPv4 C->V (+options) | TCP/UDP ... payload
 *   out: eth (MACs swapped) | IPv4 V->C | ICMP | IPv4 C->V (+options) | L4 header
 *
 * (On an L3 device there is no eth, in or out.)
 *
 * The tail is trimmed to the quote with bpf_skb_change_tail (which also
 * ends a GSO packet's segmentation state), room for the new IPv4 and ICMP
 * headers is made after the MAC header with bpf_skb_adjust_room, so the
 * quoted bytes never move or get copied back.
 *
 * The quote is the whole fixed L4 header (20 bytes for TCP, 8 for UDP;
 * another protocol's first 8 bytes, or what the packet has of them, as
 * the kernel quotes what there is: a GRE packet may carry only 4), more
 * than the 8 bytes RFC 792 asks for, as RFC 1812 allows. For TCP it has
 * to be: a TCP segment sent by a local stack over a veth (a pod) arrives with
 * CHECKSUM_PARTIAL, and the kernel refuses to trim such an skb before the
 * end of its L4 checksum field. That offload state stays on the reply; the
 * veth peer's stack trusts it, and it never reaches a physical NIC
 * (PARTIAL skbs only come from a local stack). Another protocol's packet
 * with CHECKSUM_PARTIAL (SCTP's CRC sits past the 8 bytes) makes the trim
 * fail, as does a GRE or IPIP skb with skb->encapsulation set: no error
 * is sent then (ICMP_NOT_SENT).
 *
 * Whom to answer is the kernel's choice too (icmp_link_answerable,
 * icmp_src_answerable): no error is sent about a frame addressed to a
 * link-layer broadcast or multicast group (icmp_send; and ip_forward
 * drops such a frame before netfilter's forward chain, where kube-proxy's
 * reject sits), nor to a source that names no single host (RFC 1122
 * 3.2.2, RFC 4443 2.4(e); the kernel's martian-source check drops those
 * on input): otherwise every node on a segment answers one broadcast
 * frame, and a spoofed source turns the nodes into reflectors. Unlike
 * the kernel, which rate-limits its errors (README, Limitations), tc
 * sends one error per packet.
 */
#ifndef SLUICE_ICMP_H
#define SLUICE_ICMP_H

#include "consts.h"
#include "csum.h"
#include "parse.h"

#define ICMP_QUOTE_MAX (60 + sizeof(struct tcphdr))
#define ICMP_ERR_TTL   64

/* The ICMP error icmp_reply sends: type, code and next-hop MTU. */
#define ICMP_ERR(type, code, mtu) \
	(((__u32)(type) << 24) | ((__u32)(code) << 16) | (__u16)(mtu))

/*
 * ICMP_NOT_SENT - what icmp_reply and icmp6_reply return when they send
 * nothing: a packet the kernel would not answer either (icmp_*_answerable)
 * or whose tail could not be trimmed (the packet is untouched then). Not
 * a TC verdict: the caller drops the packet (icmp_verdict), counted under
 * the reason it would have answered, not as a rewrite error.
 */
#define ICMP_NOT_SENT 0x100

/* icmp_verdict - the TC verdict for @ret, icmp_reply's or icmp6_reply's. */
static __always_inline int icmp_verdict(int ret)
{
	return ret == ICMP_NOT_SENT ? TC_ACT_SHOT : ret;
}

/* skb->pkt_type (linux/if_packet.h) */
#define SL_PACKET_BROADCAST 1
#define SL_PACKET_MULTICAST 2

/*
 * icmp_link_answerable - whether the kernel would send an ICMP error
 * about a packet that came in as @skb: not about a frame to a link-layer
 * broadcast or multicast address (pkt_type, from eth_type_trans). A
 * frame to another host's MAC (PACKET_OTHERHOST, a promiscuous device's)
 * is not excluded: the kernel drops it, but BPF_PROG_TEST_RUN marks
 * every frame not to its device's MAC so, and so would every test frame
 * be. See the README's Limitations.
 */
static __always_inline bool icmp_link_answerable(const struct __sk_buff *skb)
{
	__u32 type = skb->pkt_type;

	return type != SL_PACKET_BROADCAST && type != SL_PACKET_MULTICAST;
}

/*
 * icmp_src_answerable - whether @saddr names a single host the kernel
 * would answer: not 0.0.0.0/8 ("this network"), 127.0.0.0/8 (loopback,
 * which never comes in off a wire), 224.0.0.0/4 (multicast) or
 * 255.255.255.255 (limited broadcast); RFC 1122 3.2.2, and the kernel's
 * martian sources (ip_route_input_slow).
 */
static __always_inline bool icmp_src_answerable(__be32 saddr)
{
	__u32 a = bpf_ntohl(saddr);

	return (a >> 24) != 0 && (a >> 24) != 127 && (a >> 28) != 0xe &&
	       a != 0xffffffff;
}

struct icmp_err_hdr {
	struct iphdr ip;
	struct icmphdr icmp;
};

/*
 * icmp_send_back - the end of icmp_reply and icmp6_reply (icmp6.h): turn
 * @skb into the error, the @hdr_len bytes at @hdr (its IP and ICMP
 * headers) followed by the first @quote_len bytes of the packet at
 * @l3_off, with @eth (the packet's Ethernet header, if @l3_off is not 0)
 * sent back where it came from, and redirect it out of its ingress
 * device. Returns TC_ACT_REDIRECT, ICMP_NOT_SENT if the trim failed (the
 * packet is untouched: the MACs are swapped in @eth, a copy), or
 * TC_ACT_SHOT if a later helper failed.
 */
static __always_inline int icmp_send_back(struct __sk_buff *skb, __u32 l3_off,
					  __u32 quote_len, struct ethhdr *eth,
					  const void *hdr, __u32 hdr_len)
{
	__u8 mac[ETH_ALEN];

	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);

	if (bpf_skb_change_tail(skb, l3_off + quote_len, 0) < 0)
		return ICMP_NOT_SENT;
	if (bpf_skb_adjust_room(skb, hdr_len, BPF_ADJ_ROOM_MAC, 0) < 0)
		return TC_ACT_SHOT;
	if (l3_off && bpf_skb_store_bytes(skb, 0, eth, sizeof(*eth),
					  BPF_F_RECOMPUTE_CSUM) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, l3_off, hdr, hdr_len,
				BPF_F_RECOMPUTE_CSUM) < 0)
		return TC_ACT_SHOT;

	return bpf_redirect(skb->ifindex, 0);
}

/*
 * icmp_reply - rewrite @skb, the packet @p, into the ICMP error @err
 * (ICMP_ERR: type, code, and the next-hop MTU of a fragmentation needed)
 * about it, and redirect it back out of its ingress device.
 *
 * Returns TC_ACT_REDIRECT; ICMP_NOT_SENT for a packet the kernel would not
 * answer (icmp_link_answerable, icmp_src_answerable) or that cannot be
 * trimmed (icmp_send_back); or TC_ACT_SHOT if a helper failed (by then the
 * packet may be half rewritten and must not go on) or @p is a later
 * fragment: there is no ICMP error about one (RFC 1122 3.2.2), whose first
 * fragment got it, and it has no L4 header to quote.
 *
 * A BPF function of its own rather than inlined: several paths call it,
 * and it is large.
 */
static __noinline int icmp_reply(struct __sk_buff *skb, const struct pkt4 *p,
				 __u32 err)
{
	/* ICMP header and quote, summed together for the ICMP checksum.
	 * Bytes past the quote stay zero and add nothing to the sum.
	 */
	struct {
		struct icmphdr icmp;
		__u8 quote[ICMP_QUOTE_MAX];
	} body = {};
	struct icmp_err_hdr hdr = {};
	struct ethhdr eth = {};
	__u32 quote_len = p->ihl_len;

	if (p->frag_later)
		return TC_ACT_SHOT;
	if (!icmp_link_answerable(skb) || !icmp_src_answerable(p->saddr))
		return ICMP_NOT_SENT;
	/* ihl_len is a multiple of 4 in 20..60 (parse_ipv4). Mask it in asm,
	 * where clang cannot fold the mask away, so that the verifier sees
	 * 8..80 as the bound of the variable-size load below. parse_ipv4
	 * checked that the whole TCP or UDP header is in the packet; another
	 * protocol's may hold less than 8 bytes: the quote ends with the
	 * packet (l3_len, at least ihl_len), as the kernel's does.
	 */
	asm volatile("%0 &= 0x3c" : "+r"(quote_len));
	quote_len += p->proto == IPPROTO_TCP ? sizeof(struct tcphdr) :
					       sizeof(struct udphdr);
	if (p->l3_len < quote_len)
		quote_len = p->l3_len;
	if (quote_len < sizeof(struct iphdr) || quote_len > ICMP_QUOTE_MAX)
		return ICMP_NOT_SENT;

	if (p->l3_off && bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, p->l3_off, body.quote, quote_len) < 0)
		return TC_ACT_SHOT;

	body.icmp.type = err >> 24;
	body.icmp.code = err >> 16;
	body.icmp.un.frag.mtu = bpf_htons((__u16)err);
	body.icmp.checksum = csum_buf(&body, sizeof(body));

	hdr.ip.version = 4;
	hdr.ip.ihl = sizeof(struct iphdr) / 4;
	hdr.ip.tot_len = bpf_htons(sizeof(hdr) + quote_len);
	hdr.ip.ttl = ICMP_ERR_TTL;
	hdr.ip.protocol = IPPROTO_ICMP;
	hdr.ip.saddr = p->daddr;
	hdr.ip.daddr = p->saddr;
	hdr.ip.check = csum_buf(&hdr.ip, sizeof(hdr.ip));
	hdr.icmp = body.icmp;

	return icmp_send_back(skb, p->l3_off, quote_len, &eth, &hdr,
			      sizeof(hdr));
}

/*
 * reply_port_unreachable - answer @p, a packet to a service with no
 * backends, with an ICMP port unreachable from the VIP (icmp_reply;
 * ICMP_NOT_SENT too).
 */
static __always_inline int reply_port_unreachable(struct __sk_buff *skb,
						  const struct pkt4 *p)
{
	return icmp_reply(skb, p,
			  ICMP_ERR(ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0));
}

#endif /* SLUICE_ICMP_H */
