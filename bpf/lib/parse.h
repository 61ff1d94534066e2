/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Ethernet/IPv4/TCP/UDP parsing, for tc (parse_ipv4) and XDP
 * (parse_ipv4_xdp). Both fill a struct pkt4, which is all the lookup,
 * conntrack and selection code needs of a packet.
 *
 * tc reads the common packet in place (parse_ipv4_linear: TCP or UDP
 * after a 20-byte IPv4 header, unfragmented, all in the skb's linear
 * data) and copies every other one's headers with bpf_skb_load_bytes,
 * which works on non-linear skbs; both ways decide alike, and yield
 * offsets, not pointers, which stay valid across the helpers that rewrite
 * the packet (and invalidate packet pointers). XDP
 * has no helpers to rewrite with: it keeps pointers into the frame and
 * rewrites through them, so it takes only what it can finish (no IP
 * options, no fragments) and leaves the rest to tc.
 *
 * On a device without a link-layer header (tun, wireguard, ipip: flagged
 * NODE_DEV_F_L3 by the agent) tc's packet starts at the IPv4 header, and
 * pkt4.l3_off is 0; elsewhere it is ETH_HLEN.
 */
#ifndef SLUICE_PARSE_H
#define SLUICE_PARSE_H

#include "consts.h"
#include "maps.h"

enum parse_result {
	PARSE_OK,	 /* IPv4 TCP/UDP with a full L4 header: translatable */
	PARSE_PASS,	 /* not for us: other ethertype, an ICMP reply */
	PARSE_MALFORMED, /* IPv4 but truncated or inconsistent */
	PARSE_FRAGMENT,	 /* non-first TCP/UDP fragment: no ports (frag.h) */
	PARSE_ICMP_ERR,	 /* ICMP error, whole: its quote may name a flow */
	PARSE_OTHER,	 /* another protocol, may open a connection */
};

/* What the programs need of a parsed IPv4 TCP/UDP packet. */
struct pkt4 {
	__u32 l3_off; /* offset of the IPv4 header: ETH_HLEN, or 0 (L3 device) */
	__u32 l3_len; /* IPv4 total length (from the skb for BIG TCP) */
	__u32 l4_off; /* offset of the TCP/UDP (or ICMP) header, after IP options */
	__u32 csum_off; /* offset of the TCP/UDP checksum field */
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__be16 ip_id; /* IP identification (fragments) */
	__u8 proto;
	__u8 ihl_len;	/* IPv4 header length in bytes, 20..60 */
	__u8 tcp_flags; /* byte 13 of the TCP header (flags); 0 for UDP */
	__u8 ttl;
	bool df; /* don't fragment */
	/*
	 * First fragment of a fragmented datagram (MF set, offset 0): its
	 * ports are recorded for the later fragments (frag.h).
	 */
	bool frag_first;
	/*
	 * A later fragment: no L4 header, so l4_off and csum_off mean
	 * nothing; its ports are its first fragment's, and only its
	 * addresses are rewritten (the first fragment carries the L4
	 * checksum, which covers the whole datagram).
	 */
	bool frag_later;
	/*
	 * A dry run's packet (explain.h): decide, but change no map. A
	 * constant true in the tc programs' dry twins, false everywhere
	 * else.
	 */
	bool dry;
	/*
	 * TCP without payload (its IP length ends where its header, by its
	 * data offset, does): with tcp_flags, whether it is a bare ACK, the
	 * shape of a challenge ACK (ct_tcp_challenges). In pkt4's padding.
	 */
	bool tcp_bare;
};

/*
 * dev_l3_maybe - whether sluice_devices_v1 may hold a device flagged
 * NODE_DEV_F_L3: 0 once the agent has seen it hold none. A frame whose
 * destination MAC starts with the IP version (1 in 16 locally administered
 * MACs: every pod veth's) would otherwise cost a lookup there in every
 * parse (issue 14, seventy-second pass). A mutable global (.data: the
 * verifier turns its read into a load, no helper call), its own in each
 * object that parses (tc.c, xdp.c, migrate.c define it), and 1 until the
 * agent writes it: a new load, before the agent has looked at the device
 * map, asks the map as before. The agent sets it before it records an L3
 * device and clears it only once no L3 entry is left (devices.go).
 */
extern volatile __u8 dev_l3_maybe;

/*
 * dev_is_l3 - whether @ifindex is a device without a link-layer header.
 */
static __always_inline bool dev_is_l3(__u32 ifindex)
{
	struct node_dev *dev;

	if (!dev_l3_maybe)
		return false;
	dev = bpf_map_lookup_elem(&sluice_devices_v1, &ifindex);

	return dev && (dev->flags & NODE_DEV_F_L3);
}

/*
 * frag_ports_take - the ports @ports (NULL: none recorded) into @sport and
 * @dport; whether there were. (The end of frag_follow,
 * frag.h, and frag6_follow, parse6.h.)
 */
static __always_inline bool frag_ports_take(const struct frag4_ports *ports,
					    __be16 *sport, __be16 *dport)
{
	if (!ports)
		return false;
	*sport = ports->sport;
	*dport = ports->dport;
	return true;
}

/*
 * skb_l3_at - whether @skb holds an IP packet of @version (ethertype
 * @proto), its header at @l3_off: ETH_HLEN as the caller set it, or 0 on
 * a device without a link-layer header. @eth: room for the Ethernet
 * header, the caller's (a frame of its own costs the stack more). Without one
 * the packet starts with the IP version. A destination MAC can start so too
 * (46:... for IPv4), so the device decides, and is asked only then.
 */
static __always_inline bool skb_l3_at(struct __sk_buff *skb, __u8 version,
				      __be16 proto, struct ethhdr *eth,
				      __u32 *l3_off)
{
	if (bpf_skb_load_bytes(skb, 0, eth, sizeof(*eth)) < 0)
		return false;
	if ((eth->h_dest[0] >> 4) == version && dev_is_l3(skb->ifindex))
		*l3_off = 0;
	else if (eth->h_proto != proto)
		return false;
	return true;
}

/*
 * skb_l3_in_place - the IP header of @version (ethertype @proto) of @skb,
 * read in place (parse_ipv4_linear, parse_ipv6_linear): a packet pointer
 * to its first @len bytes, where skb_l3_at would find it (ETH_HLEN, or 0
 * on a device without a link-layer header, in @l3_off). NULL with @ret
 * PARSE_PASS if the frame is of another ethertype, or -1 if those bytes
 * are not all in the linear data.
 */
static __always_inline void *skb_l3_in_place(struct __sk_buff *skb,
					     __u8 version, __be16 proto,
					     __u32 len, __u32 *l3_off, int *ret)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	void *l3;

	*ret = -1;
	if ((void *)(eth + 1) > data_end)
		return NULL;
	if ((eth->h_dest[0] >> 4) == version && dev_is_l3(skb->ifindex)) {
		*l3_off = 0;
		l3 = data;
	} else if (eth->h_proto != proto) {
		*ret = PARSE_PASS;
		return NULL;
	} else {
		*l3_off = ETH_HLEN;
		l3 = eth + 1;
	}
	if (l3 + len > data_end)
		return NULL;
	return l3;
}

/*
 * l4_in_place - the TCP or UDP header (IP protocol @proto) at @l4, read in
 * place up to @data_end: a pointer to its ports if the whole header is
 * there, with its length in @l4_min, its TCP flags in @flags and its
 * header length (data offset) in @doff (0 for UDP) and, for UDP, its
 * checksum in @check (1 for TCP); else NULL (another protocol, or a
 * header beyond the linear data).
 */
static __always_inline __be16 *l4_in_place(void *l4, void *data_end, __u8 proto,
					   __u32 *l4_min, __u8 *flags,
					   __u8 *doff, __u16 *check)
{
	if (proto == IPPROTO_TCP) {
		struct tcphdr *th = l4;

		if ((void *)(th + 1) > data_end)
			return NULL;
		*l4_min = sizeof(*th);
		*flags = ((__u8 *)l4)[13];
		*doff = (((__u8 *)l4)[12] >> 4) * 4;
		*check = 1;
	} else if (proto == IPPROTO_UDP) {
		struct udphdr *uh = l4;

		if ((void *)(uh + 1) > data_end)
			return NULL;
		*l4_min = sizeof(*uh);
		*flags = 0;
		*doff = 0;
		*check = uh->check;
	} else {
		return NULL;
	}
	return l4;
}

/*
 * parse_ipv4_linear - parse_ipv4 for the common packet, read in place: TCP
 * or UDP right after a 20-byte IPv4 header, not a fragment, its headers
 * all in the skb's linear data. Returns what parse_ipv4 would, having
 * filled in @p as it would; or -1 for any other packet (IP options, a
 * fragment, ICMP, other protocols, headers beyond the linear data), which
 * parse_ipv4 then reads by copies.
 *
 * Reading in place saves parse_ipv4's four bpf_skb_load_bytes calls, a
 * helper call and a copy each (issue 14's attribution: 0.44 us of a
 * connection's 7.35 us of programs), as parse_ipv6_linear does IPv6's.
 * The packet pointers are used here only, before any helper that could
 * move the data.
 */
static __always_inline int parse_ipv4_linear(struct __sk_buff *skb,
					     struct pkt4 *p)
{
	void *data_end = (void *)(long)skb->data_end;
	__u32 l3_off, tot_len, l4_min;
	__u16 frag, check;
	struct iphdr *ip;
	__be16 *ports;
	__u8 flags, doff;
	int ret;

	ip = skb_l3_in_place(skb, 4, bpf_htons(ETH_P_IP), sizeof(*ip), &l3_off,
			     &ret);
	if (!ip)
		return ret;
	if (ip->version != 4 || ip->ihl < 5)
		return PARSE_MALFORMED;
	frag = bpf_ntohs(ip->frag_off);
	if (ip->ihl != 5 || (frag & (IP_MF | IP_OFFSET)))
		return -1;
	/* Each header's fields are read where its bounds are checked. */
	ports = l4_in_place(ip + 1, data_end, ip->protocol, &l4_min, &flags,
			    &doff, &check);
	if (!ports)
		return -1;
	tot_len = bpf_ntohs(ip->tot_len);
	if (tot_len == 0 && ip->protocol == IPPROTO_TCP && skb->gso_size)
		tot_len = skb->len - l3_off;
	if (tot_len < sizeof(*ip) || l3_off + tot_len > skb->len)
		return PARSE_MALFORMED;

	p->l3_off = l3_off;
	p->l3_len = tot_len;
	p->l4_off = l3_off + sizeof(*ip);
	p->saddr = ip->saddr;
	p->daddr = ip->daddr;
	p->ip_id = ip->id;
	p->proto = ip->protocol;
	p->ihl_len = sizeof(*ip);
	p->ttl = ip->ttl;
	p->df = frag & IP_DF;
	if (tot_len < sizeof(*ip) + l4_min)
		return PARSE_MALFORMED;
	p->csum_off = p->l4_off + (p->proto == IPPROTO_TCP ?
					   offsetof(struct tcphdr, check) :
					   offsetof(struct udphdr, check));
	p->tcp_flags = flags;
	p->tcp_bare = doff && tot_len - sizeof(*ip) == doff;
	p->sport = ports[0];
	p->dport = ports[1];
	return PARSE_OK;
}

/*
 * icmp_opens - whether an ICMP (@v6 false) or ICMPv6 message of @type is
 * a query, the only kind netfilter's conntrack takes for a new connection
 * (icmp_new, icmpv6_new: echo, timestamp, information and address mask
 * requests; echo and node information queries). Any other (a reply, an
 * error, neighbour discovery) is never `ct state new`, so never matched by
 * kube-proxy's cluster-ips-check chain.
 */
static __always_inline bool icmp_opens(__u8 type, bool v6)
{
	if (v6)
		return type == 128 || type == 139;
	return type == ICMP_ECHO || type == ICMP_TIMESTAMP ||
	       type == ICMP_INFO_REQUEST || type == ICMP_ADDRESS;
}

/*
 * parse_ipv4_other - the end of parse_ipv4 for @p, of another protocol
 * than TCP and UDP, whose header fields parse_ipv4 filled in (not its
 * ports: it has none). PARSE_ICMP_ERR for an ICMP error that can quote a
 * flow; PARSE_OTHER for a packet that may open a connection (any protocol
 * but ICMP, an ICMP query: icmp_opens; and any later fragment, whose
 * protocol header is in its first), which tc_body refuses if it is for a
 * ClusterIP, as kube-proxy does every protocol (lb4_no_service); else
 * PARSE_PASS. Only these packets, never a TCP or UDP one, pay for it.
 */
static __always_inline enum parse_result
parse_ipv4_other(struct __sk_buff *skb, struct pkt4 *p, __u16 frag)
{
	__u8 type;

	if (frag & IP_OFFSET) {
		p->frag_later = true;
		return PARSE_OTHER;
	}
	if (p->proto != IPPROTO_ICMP)
		return PARSE_OTHER;
	/* An ICMP header is 8 bytes; conntrack takes no shorter one. */
	if (p->l3_len < p->ihl_len + sizeof(struct icmphdr) ||
	    bpf_skb_load_bytes(skb, p->l4_off, &type, 1) < 0)
		return PARSE_PASS;
	if (icmp_opens(type, false))
		return PARSE_OTHER;
	if (type != ICMP_DEST_UNREACH && type != ICMP_TIME_EXCEEDED &&
	    type != ICMP_PARAMETERPROB)
		return PARSE_PASS;
	/* (Errors are small: a fragmented one is none we make.) */
	if ((frag & IP_MF) || p->l3_len < p->ihl_len + sizeof(struct icmphdr) +
						  sizeof(struct iphdr) + 8)
		return PARSE_PASS;
	return PARSE_ICMP_ERR;
}

/*
 * parse_ipv4 - parse the Ethernet (unless on an L3 device), IPv4 and L4
 * port headers of @skb.
 *
 * The whole L4 header (20 bytes for TCP, 8 for UDP) must be inside both the
 * IPv4 total length and the skb, so the rewrites that follow never touch
 * bytes beyond the packet. A truncated packet (tot_len beyond the skb) is
 * PARSE_MALFORMED; the stack drops it after we pass it untouched. So is a
 * tot_len of 0, except on a TCP GSO packet: IPv4 BIG TCP (Linux 6.3+)
 * sends those over 64k with tot_len 0, and the length is the skb's, as
 * for the kernel (iph_totlen).
 *
 * A non-first fragment of a TCP/UDP datagram is PARSE_FRAGMENT, with
 * everything but its ports (and TCP flags) filled in. An unfragmented ICMP
 * destination unreachable, time exceeded or parameter problem long enough
 * to quote an IPv4 header and 8 bytes of L4 is PARSE_ICMP_ERR, with
 * l4_off at its ICMP header and no ports (icmp_xlate.h reads the quote).
 * Another protocol's packet is PARSE_OTHER or PARSE_PASS
 * (parse_ipv4_other).
 */
static __always_inline enum parse_result parse_ipv4(struct __sk_buff *skb,
						    struct pkt4 *p)
{
	struct ethhdr eth;
	struct iphdr ip;
	__u32 l3_off = ETH_HLEN, ihl_len, tot_len, l4_min;
	__u16 frag;
	__be16 ports[2];
	int ret;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return PARSE_PASS;
	ret = parse_ipv4_linear(skb, p);
	if (ret >= 0)
		return ret;
	if (!skb_l3_at(skb, 4, bpf_htons(ETH_P_IP), &eth, &l3_off))
		return PARSE_PASS;
	if (bpf_skb_load_bytes(skb, l3_off, &ip, sizeof(ip)) < 0)
		return PARSE_MALFORMED;
	if (ip.version != 4 || ip.ihl < 5)
		return PARSE_MALFORMED;

	ihl_len = ip.ihl * 4;
	tot_len = bpf_ntohs(ip.tot_len);
	if (tot_len == 0 && ip.protocol == IPPROTO_TCP && skb->gso_size)
		tot_len = skb->len - l3_off;
	if (tot_len < ihl_len || l3_off + tot_len > skb->len)
		return PARSE_MALFORMED;

	p->l3_off = l3_off;
	p->l3_len = tot_len;
	p->l4_off = l3_off + ihl_len;
	p->saddr = ip.saddr;
	p->daddr = ip.daddr;
	p->ip_id = ip.id;
	p->proto = ip.protocol;
	p->ihl_len = ihl_len;
	p->ttl = ip.ttl;

	/* Only the first fragment has the L4 header. */
	frag = bpf_ntohs(ip.frag_off);
	p->df = frag & IP_DF;
	if (ip.protocol == IPPROTO_TCP)
		l4_min = sizeof(struct tcphdr);
	else if (ip.protocol == IPPROTO_UDP)
		l4_min = sizeof(struct udphdr);
	else
		return parse_ipv4_other(skb, p, frag);
	if (frag & IP_OFFSET) {
		p->frag_later = true;
		return PARSE_FRAGMENT;
	}
	p->frag_first = frag & IP_MF;
	if (tot_len < ihl_len + l4_min)
		return PARSE_MALFORMED;

	if (bpf_skb_load_bytes(skb, p->l4_off, ports, sizeof(ports)) < 0)
		return PARSE_MALFORMED;

	p->csum_off = p->l4_off + (ip.protocol == IPPROTO_TCP ?
					   offsetof(struct tcphdr, check) :
					   offsetof(struct udphdr, check));
	if (ip.protocol == IPPROTO_TCP) {
		__u8 th[2]; /* data offset, flags */

		if (bpf_skb_load_bytes(skb, p->l4_off + 12, th, 2) < 0)
			return PARSE_MALFORMED;
		p->tcp_flags = th[1];
		/* A first fragment is never bare: its payload follows. */
		p->tcp_bare = !p->frag_first &&
			      tot_len - ihl_len == (__u32)(th[0] >> 4) * 4;
	}
	p->sport = ports[0];
	p->dport = ports[1];
	return PARSE_OK;
}

/*
 * XDP_PKT - struct @name, a packet parsed at XDP: what the programs need
 * of it (@pkt_t: struct pkt4, or parse6.h's pkt6), with pointers into it
 * for the rewrite (to its IP header, an @iph_t).
 */
#define XDP_PKT(name, pkt_t, iph_t)                              \
	struct name {                                            \
		pkt_t p;                                         \
		struct ethhdr *eth;                              \
		iph_t *ip;                                       \
		__be16 *ports; /* [0] source, [1] destination */ \
		__u16 *l4csum;                                   \
	}

XDP_PKT(xdp_pkt4, struct pkt4, struct iphdr);

/*
 * xdp_eth - the Ethernet header of @ctx's frame if the frame holds one
 * and its ethertype is @proto (network order), else NULL.
 */
static __always_inline struct ethhdr *xdp_eth(struct xdp_md *ctx, __be16 proto)
{
	struct ethhdr *eth = (void *)(long)ctx->data;

	if ((void *)(eth + 1) > (void *)(long)ctx->data_end ||
	    eth->h_proto != proto)
		return NULL;
	return eth;
}

/*
 * xdp_l4 - the TCP or UDP header (IP protocol @proto) at @l4, after @hdr
 * bytes of IP header of the @len the IP header says, in a frame ending at
 * @end: whole in both, and with a checksum if @udp_csum and UDP. Sets
 * @l4csum to its checksum and, for TCP, @tcp_flags to its flags and
 * @bare to whether it has no payload. Returns false for anything else.
 */
static __always_inline bool xdp_l4(void *l4, void *end, __u32 len, __u32 hdr,
				   __u8 proto, bool udp_csum, __u16 **l4csum,
				   __u8 *tcp_flags, bool *bare)
{
	__u32 l4_min;
	__u16 check;
	__u8 flags, doff;

	if (!l4_in_place(l4, end, proto, &l4_min, &flags, &doff, &check) ||
	    len < hdr + l4_min || (udp_csum && !check))
		return false;
	if (proto == IPPROTO_TCP) {
		*l4csum = l4 + offsetof(struct tcphdr, check);
		*tcp_flags = flags;
		*bare = len - hdr == doff;
	} else {
		*l4csum = l4 + offsetof(struct udphdr, check);
	}
	return true;
}

/*
 * parse_ipv4_xdp - IPv4 TCP/UDP without options or fragmentation, whole L4
 * header present. Returns false for anything else (left to tc).
 */
static __always_inline bool parse_ipv4_xdp(struct xdp_md *ctx,
					   struct xdp_pkt4 *x)
{
	struct ethhdr *eth = xdp_eth(ctx, bpf_htons(ETH_P_IP));
	void *end = (void *)(long)ctx->data_end;
	struct iphdr *ip;
	__u32 tot_len;

	if (!eth)
		return false;
	/* (Generic XDP on an L3 device: the frame is an IPv4 packet, whose
	 * source address may read like an IPv4 ethertype.)
	 */
	if ((eth->h_dest[0] >> 4) == 4 && dev_is_l3(ctx->ingress_ifindex))
		return false;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->version != 4 || ip->ihl != 5)
		return false;
	if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return false;
	/* (A frame shorter than tot_len is the stack's to drop: only the
	 * headers are rewritten, and they are bounds-checked below.)
	 */
	tot_len = bpf_ntohs(ip->tot_len);
	if (!xdp_l4(ip + 1, end, tot_len, sizeof(*ip), ip->protocol, false,
		    &x->l4csum, &x->p.tcp_flags, &x->p.tcp_bare))
		return false;
	x->eth = eth;
	x->ip = ip;
	x->ports = (void *)(ip + 1);
	x->p.saddr = ip->saddr;
	x->p.daddr = ip->daddr;
	x->p.sport = x->ports[0];
	x->p.dport = x->ports[1];
	x->p.proto = ip->protocol;
	x->p.ihl_len = sizeof(*ip);
	x->p.l3_off = ETH_HLEN;
	x->p.l4_off = ETH_HLEN + sizeof(*ip);
	x->p.l3_len = tot_len;
	x->p.ttl = ip->ttl;
	return true;
}

#endif /* SLUICE_PARSE_H */
