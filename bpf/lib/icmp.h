/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Refusing a flow to a service with no backends, on the per-packet path.
 *
 * Dropping would leave the client retrying until it times out. Instead the
 * packet is turned, in place, into an ICMP destination unreachable (port
 * unreachable) from the VIP to the client and sent back out of the device
 * it came in on. Linux reports it as ECONNREFUSED to both a TCP connect and
 * a connected UDP socket, just as if the VIP had refused the port itself.
 *
 *   in:  eth | IPv4 C->V (+options) | TCP/UDP ... payload
 *   out: eth (MACs swapped) | IPv4 V->C | ICMP 3/3 | IPv4 C->V (+options) | L4 header
 *
 * (On an L3 device there is no eth, in or out.)
 *
 * The tail is trimmed to the quote with bpf_skb_change_tail, room for the
 * new IPv4 and ICMP headers is made after the MAC header with
 * bpf_skb_adjust_room, so the quoted bytes never move or get copied back.
 *
 * The quote is the whole fixed L4 header (20 bytes for TCP, 8 for UDP),
 * more than the 8 bytes RFC 792 asks for, as RFC 1812 allows. It has to be:
 * a TCP segment sent by a local stack over a veth (a pod) arrives with
 * CHECKSUM_PARTIAL, and the kernel refuses to trim such an skb before the
 * end of its L4 checksum field. That offload state stays on the reply; the
 * veth peer's stack trusts it, and it never reaches a physical NIC
 * (PARTIAL skbs only come from a local stack).
 */
#ifndef SLUICE_ICMP_H
#define SLUICE_ICMP_H

#include "consts.h"
#include "csum.h"
#include "parse.h"

#define ICMP_QUOTE_MAX (60 + sizeof(struct tcphdr))
#define ICMP_ERR_TTL   64

struct icmp_err_hdr {
	struct iphdr ip;
	struct icmphdr icmp;
};

/*
 * reply_port_unreachable - rewrite @skb into an ICMP port unreachable for
 * @p and redirect it back out of its ingress device.
 *
 * Returns TC_ACT_REDIRECT, or TC_ACT_SHOT if a helper failed (by then the
 * packet may be half rewritten and must not go on).
 */
static __always_inline int reply_port_unreachable(struct __sk_buff *skb,
						  const struct pkt4 *p)
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
	__u8 mac[ETH_ALEN];
	__u32 quote_len = p->ihl_len;

	/* ihl_len is a multiple of 4 in 20..60 (parse_ipv4). Mask it in asm,
	 * where clang cannot fold the mask away, so that the verifier sees
	 * 8..80 as the bound of the variable-size load below. parse_ipv4
	 * checked that the whole L4 header is in the packet.
	 */
	asm volatile("%0 &= 0x3c" : "+r"(quote_len));
	quote_len += p->proto == IPPROTO_TCP ? sizeof(struct tcphdr) :
					       sizeof(struct udphdr);

	if (p->l3_off && bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, p->l3_off, body.quote, quote_len) < 0)
		return TC_ACT_SHOT;

	body.icmp.type = ICMP_DEST_UNREACH;
	body.icmp.code = ICMP_PORT_UNREACH;
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

	__builtin_memcpy(mac, eth.h_dest, ETH_ALEN);
	__builtin_memcpy(eth.h_dest, eth.h_source, ETH_ALEN);
	__builtin_memcpy(eth.h_source, mac, ETH_ALEN);

	if (bpf_skb_change_tail(skb, p->l3_off + quote_len, 0) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_adjust_room(skb, sizeof(hdr), BPF_ADJ_ROOM_MAC, 0) < 0)
		return TC_ACT_SHOT;
	if (p->l3_off && bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth),
					     BPF_F_RECOMPUTE_CSUM) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, p->l3_off, &hdr, sizeof(hdr),
				BPF_F_RECOMPUTE_CSUM) < 0)
		return TC_ACT_SHOT;

	return bpf_redirect(skb->ifindex, 0);
}

#endif /* SLUICE_ICMP_H */
