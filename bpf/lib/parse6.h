/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * IPv6 parsing for tc (parse_ipv6) and XDP (parse_ipv6_xdp): the IPv6
 * twins of parse_ipv4 and parse_ipv4_xdp, filling a struct pkt6 with what
 * lookup, conntrack (conntrack_fam.h) and the rewrite need.
 *
 * Extension headers (RFC 8200 4) between the fixed header and TCP/UDP are
 * skipped: hop-by-hop and destination options and routing headers by
 * their length, a fragment header by its 8 bytes. The walk is a bounded
 * loop of IPV6_EXT_MAX headers; a chain longer than that, or one holding a
 * header it does not skip (AH, mobility, HIP, shim6, experimental) is
 * PARSE_EXT: passed untouched and counted, never guessed at. (ESP ends
 * the chain: an encrypted packet passes like any other protocol.)
 *
 * Fragments, as frag.h does IPv4's: an atomic fragment (offset 0, no more
 * fragments: a whole datagram, RFC 6946) is translated like any packet; a
 * first fragment too, its ports recorded in sluice6_fragments_v1 under
 * (source, destination, identification, protocol); a later fragment takes
 * them from there (frag_later: only its addresses are rewritten, the L4
 * checksum being in the first), or, its first not seen, is
 * PARSE_FRAGMENT and passes untouched.
 *
 * Unlike parse_ipv4 (parse.h), tc's parse reads the common packet in
 * place (parse_ipv6_linear): TCP or UDP right after the fixed header,
 * all in the skb's linear data. Every other packet is copied out by
 * bpf_skb_load_bytes, as IPv4's are; both ways decide alike.
 */
#ifndef SLUICE_PARSE6_H
#define SLUICE_PARSE6_H

#include "consts.h"
#include "maps.h"
#include "parse.h"

/* Extension headers parse_ipv6 walks at most. */
#define IPV6_EXT_MAX 6

/* parse_ipv6's results beyond enum parse_result's. */
#define PARSE_EXT	  16 /* an extension header chain not walked */
#define PARSE_UDP_NO_CSUM 17 /* UDP with checksum 0: invalid in IPv6 */

/* What the programs need of a parsed IPv6 TCP/UDP packet. */
struct pkt6 {
	__u32 l3_off; /* offset of the IPv6 header: ETH_HLEN, or 0 (L3 device) */
	__u32 l3_len; /* 40 + payload length (from the skb for BIG TCP) */
	__u32 l4_off; /* offset of the TCP/UDP header, after extension headers */
	__u32 csum_off; /* offset of the TCP/UDP checksum field */
	union v6addr saddr;
	union v6addr daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 tcp_flags; /* byte 13 of the TCP header (flags); 0 for UDP */
	__u8 hop_limit;
	/* A later fragment: no L4 header, its ports its first fragment's
	 * (frag6_follow); only its addresses are rewritten.
	 */
	bool frag_later;
	/* A dry run's packet (explain.h), as pkt4.dry. */
	bool dry;
	/* TCP without payload, as pkt4.tcp_bare (in pkt6's padding). */
	bool tcp_bare;
};

/* A fragment header's fields (after its next header and reserved byte). */
struct ipv6_frag {
	__be16 off; /* offset << 3 | M */
	__be32 id;
	__u8 nexthdr; /* a later fragment's: set by ipv6_skip_ext */
};

/*
 * ipv6_skip_ext - walk the extension headers of @skb from @off, the first
 * being @nexthdr. Returns the upper-layer protocol with @off at its
 * header, or -PARSE_EXT, -PARSE_FRAGMENT (a later fragment, @frag
 * filled in) or -PARSE_MALFORMED. A first fragment's header is in @frag.
 */
static __always_inline int ipv6_skip_ext(struct __sk_buff *skb, __u32 *off,
					 __u32 end, __u8 nexthdr,
					 struct ipv6_frag *frag)
{
	struct ipv6_opt_hdr h;
	int i;

	for (i = 0; i < IPV6_EXT_MAX; i++) {
		switch (nexthdr) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
		case IPPROTO_FRAGMENT:
			break;
		case IPPROTO_AH:
		case 135: /* mobility */
		case 139: /* HIP */
		case 140: /* shim6 */
		case 253: /* experimental */
		case 254:
			return -PARSE_EXT;
		default:
			return nexthdr;
		}
		if (*off + 8 > end || bpf_skb_load_bytes(skb, *off, &h, 2) < 0)
			return -PARSE_MALFORMED;
		if (nexthdr == IPPROTO_FRAGMENT) {
			/* Offset (13 bits) and M (bit 0); the rest of the
			 * chain is in the first fragment only.
			 */
			if (bpf_skb_load_bytes(skb, *off + 2, frag, 6) < 0)
				return -PARSE_MALFORMED;
			*off += 8;
			if (bpf_ntohs(frag->off) & 0xfff8) {
				frag->nexthdr = h.nexthdr;
				return -PARSE_FRAGMENT;
			}
		} else {
			*off += ((__u32)h.hdrlen + 1) * 8;
		}
		nexthdr = h.nexthdr;
	}
	return -PARSE_EXT;
}

/* frag6_key_of - the fragment record key of @p, of datagram @id. */
static __always_inline void frag6_key_of(struct frag6_key *key,
					 const struct pkt6 *p, __be32 id)
{
	key->saddr = p->saddr;
	key->daddr = p->daddr;
	key->id = id;
	key->proto = p->proto;
	key->pad[0] = key->pad[1] = key->pad[2] = 0;
}

/* frag6_record - frag_record (frag.h) for @p, first fragment of @id. */
static __always_inline void frag6_record(const struct pkt6 *p, __be32 id)
{
	struct frag6_key key;
	struct frag4_ports ports = {
		.sport = p->sport,
		.dport = p->dport,
	};

	if (p->dry)
		return;
	frag6_key_of(&key, p, id);
	bpf_map_update_elem(&sluice6_fragments_v1, &key, &ports, BPF_ANY);
}

/* frag6_follow - frag_follow (frag.h) for @p, a later fragment of @id. */
static __always_inline bool frag6_follow(struct pkt6 *p, __be32 id)
{
	struct frag6_key key;

	frag6_key_of(&key, p, id);
	return frag_ports_take(bpf_map_lookup_elem(&sluice6_fragments_v1, &key),
			       &p->sport, &p->dport);
}

/*
 * parse_icmp6_err - an ICMPv6 message at @off of @skb (its IPv6 header at
 * @l3_off, its end at @end): PARSE_ICMP_ERR, with l3_off, l4_off (at the
 * ICMPv6 header) and the outer addresses filled in, if it is an error
 * (destination unreachable, packet too big, time exceeded, parameter
 * problem) long enough to quote an IPv6 header and 8 bytes of L4;
 * PARSE_OTHER, the same filled in, if it is a query that may open a
 * connection (icmp_opens, parse.h: an echo request); else PARSE_PASS
 * (neighbour discovery, an echo reply, ...).
 */
static __always_inline int parse_icmp6_err(struct __sk_buff *skb,
					   struct pkt6 *p, __u32 l3_off,
					   __u32 off, __u32 end)
{
	int ret = PARSE_ICMP_ERR;
	__u8 type;

	if (off + 8 > end || bpf_skb_load_bytes(skb, off, &type, 1) < 0)
		return PARSE_PASS;
	if (icmp_opens(type, true))
		ret = PARSE_OTHER;
	else if (type < ICMPV6_DEST_UNREACH || type > ICMPV6_PARAMPROB ||
		 off + 8 + sizeof(struct ipv6hdr) + 8 > end)
		return PARSE_PASS;
	p->l3_off = l3_off;
	p->l3_len = end - l3_off;
	p->l4_off = off;
	p->proto = IPPROTO_ICMPV6;
	if (bpf_skb_load_bytes(skb, l3_off + offsetof(struct ipv6hdr, saddr),
			       &p->saddr, 2 * sizeof(p->saddr)) < 0)
		return PARSE_PASS;
	return ret;
}

/*
 * parse_ipv6_other - PARSE_OTHER for @p, of protocol @proto (neither TCP,
 * UDP nor ICMPv6), its header at @off.
 */
static __always_inline int parse_ipv6_other(struct pkt6 *p, __u32 off,
					    __u8 proto)
{
	p->l4_off = off;
	p->proto = proto;
	return PARSE_OTHER;
}

/*
 * parse_ipv6_linear - parse_ipv6 for the common packet, read in place: TCP
 * or UDP right after the fixed header, its headers all in the skb's
 * linear data. Returns what parse_ipv6 would, having filled in @p as it
 * would; or -1 for any other packet (an extension header, ICMPv6, headers
 * beyond the linear data), which parse_ipv6 then reads by copies.
 *
 * Reading in place saves parse_ipv6's four bpf_skb_load_bytes calls, a
 * copy each (issue 10: about a tenth of an established IPv6 flow's
 * packet). The packet pointers are used here only, before any helper
 * that could move the data.
 */
static __always_inline int parse_ipv6_linear(struct __sk_buff *skb,
					     struct pkt6 *p)
{
	void *data_end = (void *)(long)skb->data_end;
	__u32 l3_off, end, off, l4_min;
	struct ipv6hdr *ip;
	__u16 check;
	__be16 *ports;
	__u8 flags, doff;
	int ret;

	ip = skb_l3_in_place(skb, 6, bpf_htons(ETH_P_IPV6), sizeof(*ip),
			     &l3_off, &ret);
	if (!ip)
		return ret;
	if (ip->version != 6)
		return PARSE_MALFORMED;
	/* Each header's fields are read where its bounds are checked. */
	ports = l4_in_place(ip + 1, data_end, ip->nexthdr, &l4_min, &flags,
			    &doff, &check);
	if (!ports)
		return -1;
	end = l3_off + sizeof(*ip) + bpf_ntohs(ip->payload_len);
	if (!ip->payload_len && ip->nexthdr == IPPROTO_TCP && skb->gso_size)
		end = skb->len;
	if (end > skb->len)
		return PARSE_MALFORMED;

	off = l3_off + sizeof(*ip);
	__builtin_memcpy(&p->saddr, &ip->saddr, sizeof(p->saddr));
	__builtin_memcpy(&p->daddr, &ip->daddr, sizeof(p->daddr));
	p->l3_off = l3_off;
	p->l3_len = end - l3_off;
	p->hop_limit = ip->hop_limit;
	if (off + l4_min > end)
		return PARSE_MALFORMED;
	p->l4_off = off;
	p->proto = ip->nexthdr;
	p->sport = ports[0];
	p->dport = ports[1];
	p->tcp_flags = flags;
	p->tcp_bare = doff && end - off == doff;
	p->csum_off = off + (p->proto == IPPROTO_TCP ?
				     offsetof(struct tcphdr, check) :
				     offsetof(struct udphdr, check));
	return check ? PARSE_OK : PARSE_UDP_NO_CSUM;
}

/*
 * ipv6_big_tcp - whether @skb, an IPv6 packet at @l3_off with payload
 * length 0 and first next header @nexthdr, is a BIG TCP GSO packet, whose
 * length is the skb's. Linux 6.0 to 6.19 mark one with a hop-by-hop
 * header holding only a jumbo payload option (RFC 2675), inserted by
 * ip6_xmit on the way out and by GRO (ipv6_gro_complete) on the way in,
 * so tc sees it both ways (ipv6_has_hopopt_jumbo); Linux 7.0 dropped that
 * header, and the TCP header follows the fixed one, as IPv4 BIG TCP's
 * follows a tot_len of 0. Both are taken. A jumbogram that is not a GSO
 * packet is not: it is PARSE_MALFORMED, passed untouched, as a payload
 * length of 0 was.
 */
static __always_inline bool ipv6_big_tcp(struct __sk_buff *skb, __u32 l3_off,
					 __u8 nexthdr)
{
	__u8 hbh[4]; /* next header, length, option type and length */

	if (!skb->gso_size)
		return false;
	if (nexthdr == IPPROTO_TCP)
		return true;
	if (nexthdr != IPPROTO_HOPOPTS ||
	    bpf_skb_load_bytes(skb, l3_off + sizeof(struct ipv6hdr), hbh,
			       sizeof(hbh)) < 0)
		return false;
	return hbh[0] == IPPROTO_TCP && hbh[1] == 0 &&
	       hbh[2] == IPV6_TLV_JUMBO && hbh[3] == 4;
}

/*
 * parse_ipv6 - parse the Ethernet (unless on an L3 device), IPv6,
 * extension and L4 port headers of @skb, as parse_ipv4 does IPv4's: the
 * whole L4 header must be inside both the payload length and the skb.
 * An IPv6 BIG TCP packet (payload length 0, GSO, with or without a
 * hop-by-hop jumbo header: ipv6_big_tcp) takes its length from the skb,
 * as the kernel does (ipv6_payload_len).
 *
 * A UDP checksum of 0 is invalid in IPv6 (RFC 8200 8.1): the stack drops
 * such a datagram (udp6_csum_init) and netfilter's conntrack, which
 * kube-proxy's NAT rides on, never tracks it; it is PARSE_UDP_NO_CSUM,
 * passed untouched for the stack to drop.
 *
 * Returns PARSE_OK, PARSE_OTHER (another protocol than TCP and UDP, an
 * ICMPv6 echo request: parse_ipv4_other says why), PARSE_PASS (ICMPv6
 * other than errors and queries), PARSE_ICMP_ERR (parse_icmp6_err),
 * PARSE_MALFORMED, PARSE_FRAGMENT, PARSE_EXT or PARSE_UDP_NO_CSUM.
 */
static __always_inline int parse_ipv6(struct __sk_buff *skb, struct pkt6 *p)
{
	struct ethhdr eth;
	struct ipv6hdr ip;
	__u32 l3_off = ETH_HLEN, end, off, l4_min;
	struct ipv6_frag frag = {};
	__be16 ports[2];
	int proto;

	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return PARSE_PASS;
	proto = parse_ipv6_linear(skb, p);
	if (proto >= 0)
		return proto;
	if (!skb_l3_at(skb, 6, bpf_htons(ETH_P_IPV6), &eth, &l3_off))
		return PARSE_PASS;
	if (bpf_skb_load_bytes(skb, l3_off, &ip, sizeof(ip)) < 0)
		return PARSE_MALFORMED;
	if (ip.version != 6)
		return PARSE_MALFORMED;
	end = l3_off + sizeof(ip) + bpf_ntohs(ip.payload_len);
	if (!ip.payload_len && ipv6_big_tcp(skb, l3_off, ip.nexthdr))
		end = skb->len;
	if (end > skb->len)
		return PARSE_MALFORMED;

	off = l3_off + sizeof(ip);
	proto = ipv6_skip_ext(skb, &off, end, ip.nexthdr, &frag);
	__builtin_memcpy(&p->saddr, &ip.saddr, sizeof(p->saddr));
	__builtin_memcpy(&p->daddr, &ip.daddr, sizeof(p->daddr));
	p->l3_off = l3_off;
	p->l3_len = end - l3_off;
	p->hop_limit = ip.hop_limit;
	if (proto == -PARSE_FRAGMENT) {
		/* A later fragment: its ports are its first's; another
		 * protocol's is refused if to a ClusterIP (parse_ipv4_other).
		 */
		p->l4_off = off;
		p->proto = frag.nexthdr;
		p->frag_later = true;
		if (frag.nexthdr != IPPROTO_TCP && frag.nexthdr != IPPROTO_UDP)
			return PARSE_OTHER;
		return frag6_follow(p, frag.id) ? PARSE_OK : PARSE_FRAGMENT;
	}
	if (proto < 0)
		return -proto;
	if (proto == IPPROTO_TCP)
		l4_min = sizeof(struct tcphdr);
	else if (proto == IPPROTO_UDP)
		l4_min = sizeof(struct udphdr);
	else if (proto == IPPROTO_ICMPV6)
		return parse_icmp6_err(skb, p, l3_off, off, end);
	else
		/* Its packet may open a connection (parse_ipv4_other). */
		return parse_ipv6_other(p, off, proto);
	if (off + l4_min > end)
		return PARSE_MALFORMED;
	if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
		return PARSE_MALFORMED;

	p->l4_off = off;
	p->csum_off = off + (proto == IPPROTO_TCP ?
				     offsetof(struct tcphdr, check) :
				     offsetof(struct udphdr, check));
	p->proto = proto;
	p->sport = ports[0];
	p->dport = ports[1];
	if (bpf_ntohs(frag.off) & 1)
		frag6_record(p, frag.id);
	if (proto == IPPROTO_TCP) {
		__u8 th[2]; /* data offset, flags */

		if (bpf_skb_load_bytes(skb, off + 12, th, 2) < 0)
			return PARSE_MALFORMED;
		p->tcp_flags = th[1];
		/* A first fragment (MF) is never bare: its payload follows. */
		p->tcp_bare = !(bpf_ntohs(frag.off) & 1) &&
			      end - off == (__u32)(th[0] >> 4) * 4;
	}
	if (proto == IPPROTO_UDP) {
		__u16 check;

		if (bpf_skb_load_bytes(skb, p->csum_off, &check, 2) < 0)
			return PARSE_MALFORMED;
		if (!check)
			return PARSE_UDP_NO_CSUM;
	}
	return PARSE_OK;
}

/* An IPv6 packet parsed at XDP (parse.h). */
XDP_PKT(xdp_pkt6, struct pkt6, struct ipv6hdr);

/*
 * parse_ipv6_xdp - parse_ipv4_xdp for IPv6: TCP or UDP right after the
 * fixed header (no extension header: a fragment has one), its whole L4
 * header present, a payload length set (not a jumbogram) and, for UDP, a
 * checksum (a datagram without one is invalid in IPv6: tc counts it).
 * Returns false for anything else (left to tc, which walks extension
 * headers).
 */
static __always_inline bool parse_ipv6_xdp(struct xdp_md *ctx,
					   struct xdp_pkt6 *x)
{
	struct ethhdr *eth = xdp_eth(ctx, bpf_htons(ETH_P_IPV6));
	void *end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip;
	__u32 len;

	if (!eth)
		return false;
	/* (Generic XDP on an L3 device: see parse_ipv4_xdp. The frame is an
	 * IPv6 packet, or an IPv4 one that the IPv4 entry sent here, its
	 * source address reading like the IPv6 ethertype.)
	 */
	if (((eth->h_dest[0] >> 4) == 6 || (eth->h_dest[0] >> 4) == 4) &&
	    dev_is_l3(ctx->ingress_ifindex))
		return false;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->version != 6)
		return false;
	/* (A frame shorter than the payload length is the stack's to drop:
	 * only the headers are rewritten, and they are bounds-checked.)
	 */
	len = bpf_ntohs(ip->payload_len);
	if (!xdp_l4(ip + 1, end, len, 0, ip->nexthdr, true, &x->l4csum,
		    &x->p.tcp_flags, &x->p.tcp_bare))
		return false;
	x->eth = eth;
	x->ip = ip;
	x->ports = (void *)(ip + 1);
	__builtin_memcpy(&x->p.saddr, &ip->saddr, sizeof(x->p.saddr));
	__builtin_memcpy(&x->p.daddr, &ip->daddr, sizeof(x->p.daddr));
	x->p.sport = x->ports[0];
	x->p.dport = x->ports[1];
	x->p.proto = ip->nexthdr;
	x->p.l3_off = ETH_HLEN;
	x->p.l4_off = ETH_HLEN + sizeof(*ip);
	x->p.l3_len = sizeof(*ip) + len;
	x->p.hop_limit = ip->hop_limit;
	return true;
}

#endif /* SLUICE_PARSE6_H */
