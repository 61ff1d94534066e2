/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ICMP errors about translated flows, translated back, as Linux NAT
 * (nf_nat_icmp_reply_translation) and Cilium do.
 *
 * An ICMP error quotes the packet that caused it as that packet was where
 * it failed, that is, translated:
 *
 *   C:cp -> V:vp  DNAT  C:cp -> B:bp  --> R, whose next hop has MTU 1400:
 *   R -> C  ICMP fragmentation needed, quoting [C:cp -> B:bp]
 *
 * The client's socket is connected to V: the quote matches none of its
 * sockets and the error is ignored. Path MTU discovery then fails (a black
 * hole behind every smaller-MTU hop: overlays, tunnels), and a backend's
 * port unreachable never reaches a connected UDP socket. The quoted
 * packet's reply is what conntrack knows: its key is the quote with source
 * and destination swapped.
 *
 * About a request (the reply's entry, CT_REVERSE [B -> C], names the
 * frontend F and, if the flow is source-NATed, the client): the quote
 * becomes [C -> F]; the outer source, if it is the backend itself, F; and
 * a source-NATed flow's error, addressed to the node, goes on to the
 * client.
 *
 *   B -> C  [C:cp -> B:bp]     becomes  F -> C  [C:cp -> F:fp]
 *   R -> N  [N:sp -> B:bp]     becomes  R -> C  [C:cp -> F:fp], sent to C
 *
 * A DNATed flow's error is translated where the flow's replies are: at an
 * ingress whose route to the client leaves by a device with tc, it goes
 * up as it came (rev_at_egress4, counted tc_rev_at_egress; not while
 * ct_admit_paused, not at a bridge or bond port), and that device's
 * egress translates it. The node's netfilter conntrack saw the flow as
 * [C -> B] (tc ingress comes first), so it takes the error as it came for
 * RELATED; translated, it would quote [C -> F], a flow it never saw, and
 * be INVALID, which firewalls drop.
 *
 * About a reply, from the client's side (the request's entry, CT_FORWARD
 * [C -> F], names the backend and, if source-NATed, the node's port): the
 * quote becomes [B -> C] ([B -> N:sp]), the outer destination B (and the
 * client as outer source the node), and it goes on towards the backend.
 *
 *   C -> F  [F:fp -> C:cp]     becomes  C -> B  [B:bp -> C:cp]
 *                              or       N -> B  [B:bp -> N:sp], sent to B
 *
 * In both, the error is addressed to the quoted packet's source, and stays
 * so: the outer destination becomes the quote's new source, and an outer
 * source that was the quote's destination its new destination.
 *
 * Every checksum stays exact: the outer IPv4 header's, the ICMP message's,
 * the quoted IPv4 header's, and the quoted TCP/UDP checksum when the quote
 * holds it (a UDP quote always does; RFC 792's 8 bytes of TCP do not). That
 * one covers a datagram the quote may cut short: it is updated as the whole
 * datagram's would be, as Linux NAT does. An error refreshes no conntrack
 * entry (it keeps no flow alive). It is forwarded by redirect where its
 * flow is (nat.h), one TTL less; one whose TTL would expire is dropped:
 * there is no error about an error.
 */
#ifndef SLUICE_ICMP_XLATE_H
#define SLUICE_ICMP_XLATE_H

#include "consts.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "csum.h"
#include "conntrack.h"
#include "nat.h"

int rev_at_egress4(struct __sk_buff *skb, const struct pkt4 *p); /* tc.c */

/* The quote of an ICMP error: an IPv4 header and 8 bytes of L4. */
struct icmp_quote {
	struct iphdr ip; /* without options, which are left alone */
	__be16 sport;
	__be16 dport;
	__be16 w[2]; /* UDP: length and checksum; TCP: sequence number */
};

/* What an ICMP error's addresses and ports become. */
struct icmp_xlate {
	__be32 outer_saddr;
	__be32 outer_daddr;
	__be32 saddr; /* the quote's */
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};

/* rewrite_l3 - replace the IPv4 address at @off (the header at @l3_off). */
static __always_inline int rewrite_l3(struct __sk_buff *skb, __u32 l3_off,
				      __u32 off, __be32 from, __be32 to)
{
	if (from == to)
		return 0;
	if (bpf_l3_csum_replace(skb, l3_off + IP_CSUM_OFF, from, to,
				sizeof(to)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, l3_off + off, &to, sizeof(to), 0);
}

/*
 * icmp_rewrite - give the ICMP error @p, whose quote @q is at @q_off, the
 * addresses and ports of @x, with every checksum updated. Returns 0 or a
 * negative error (the packet may then be half rewritten: drop it).
 *
 * The stores leave skb->csum (CHECKSUM_COMPLETE) right: the outer header
 * and the ICMP message each sum to the same after as before, their
 * checksums compensating for the rest.
 */
static __always_inline int icmp_rewrite(struct __sk_buff *skb,
					const struct pkt4 *p,
					struct icmp_quote *q, __u32 q_off,
					const struct icmp_xlate *x)
{
	__u32 l4_off = q_off + q->ip.ihl * 4;
	__u32 icsum_off = p->l4_off + offsetof(struct icmphdr, checksum);
	bool udp = q->ip.protocol == IPPROTO_UDP, have_l4sum;
	__u16 icsum, l4sum = 0, c;

	if (rewrite_l3(skb, p->l3_off, IP_SADDR_OFF, p->saddr, x->outer_saddr) <
		    0 ||
	    rewrite_l3(skb, p->l3_off, IP_DADDR_OFF, p->daddr, x->outer_daddr) <
		    0)
		return -1;
	if (bpf_skb_load_bytes(skb, icsum_off, &icsum, sizeof(icsum)) < 0)
		return -1;

	/* The quoted L4 checksum, if quoted (UDP's zero: none). */
	if (udp) {
		l4sum = q->w[1];
		have_l4sum = l4sum != 0;
	} else {
		have_l4sum = l4_off + 18 <= p->l3_off + p->l3_len &&
			     !bpf_skb_load_bytes(skb, l4_off + 16, &l4sum, 2);
	}
	if (have_l4sum) {
		c = csum_replace32(l4sum, q->ip.saddr, x->saddr);
		c = csum_replace32(c, q->ip.daddr, x->daddr);
		c = csum_replace16(c, q->sport, x->sport);
		c = csum_replace16(c, q->dport, x->dport);
		if (udp && c == 0)
			c = 0xffff;
		icsum = csum_replace16(icsum, l4sum, c);
		l4sum = c;
		if (udp)
			q->w[1] = c;
	}

	/* The quoted IPv4 header, and what the ICMP checksum covers. */
	c = csum_replace32(q->ip.check, q->ip.saddr, x->saddr);
	c = csum_replace32(c, q->ip.daddr, x->daddr);
	icsum = csum_replace16(icsum, q->ip.check, c);
	icsum = csum_replace32(icsum, q->ip.saddr, x->saddr);
	icsum = csum_replace32(icsum, q->ip.daddr, x->daddr);
	icsum = csum_replace16(icsum, q->sport, x->sport);
	icsum = csum_replace16(icsum, q->dport, x->dport);
	q->ip.check = c;
	q->ip.saddr = x->saddr;
	q->ip.daddr = x->daddr;
	q->sport = x->sport;
	q->dport = x->dport;

	if (bpf_skb_store_bytes(skb, q_off, &q->ip, sizeof(q->ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, l4_off, &q->sport, 8, 0) < 0 ||
	    (!udp && have_l4sum &&
	     bpf_skb_store_bytes(skb, l4_off + 16, &l4sum, 2, 0) < 0) ||
	    bpf_skb_store_bytes(skb, icsum_off, &icsum, sizeof(icsum), 0) < 0)
		return -1;
	return 0;
}

/*
 * icmp_err_xlate - translate @p, an ICMP error (PARSE_ICMP_ERR) at a
 * device's @ingress or egress, if it is about a translated flow. Returns
 * a TC verdict.
 */
static __always_inline int icmp_err_xlate(struct __sk_buff *skb,
					  const struct pkt4 *p, bool ingress)
{
	__u32 q_off = p->l4_off + sizeof(struct icmphdr), l4_off;
	struct icmp_quote q;
	struct icmp_xlate x;
	struct ct4_key key = {};
	struct ct4_entry *e;
	struct fib4 f = {};
	bool snat, redirect, half_open;
	__u64 now;

	if (bpf_skb_load_bytes(skb, q_off, &q.ip, sizeof(q.ip)) < 0)
		return TC_ACT_OK;
	if (q.ip.version != 4 || q.ip.ihl < 5 ||
	    (q.ip.frag_off & bpf_htons(IP_OFFSET)) ||
	    (q.ip.protocol != IPPROTO_TCP && q.ip.protocol != IPPROTO_UDP) ||
	    p->daddr != q.ip.saddr)
		return TC_ACT_OK;
	l4_off = q_off + q.ip.ihl * 4;
	if (l4_off + 8 > p->l3_off + p->l3_len ||
	    bpf_skb_load_bytes(skb, l4_off, &q.sport, 8) < 0)
		return TC_ACT_OK;

	/* The quoted packet's reply, as conntrack keys it. */
	key.saddr = q.ip.daddr;
	key.daddr = q.ip.saddr;
	key.sport = q.dport;
	key.dport = q.sport;
	key.proto = q.ip.protocol;
	key.dir = CT_REVERSE;
	now = now_ns();
	x.saddr = q.ip.saddr;
	x.daddr = q.ip.daddr;
	x.sport = q.sport;
	x.dport = q.dport;
	/* The live entry, established or half-open, not refreshed: an ICMP
	 * error keeps no flow alive.
	 */
	e = ct_find(&key, now, &half_open);
	if (e) {
		/* About a request: [C or N:sp -> B] becomes [C -> F]. */
		snat = e->flags & CT_F_SNAT;
		x.daddr = e->nat_addr;
		x.dport = e->nat_port;
		if (snat) {
			x.saddr = e->snat_addr;
			x.sport = e->snat_port;
		}
		/* A flow remapped to another port of the client (lb4_remap)
		 * is a DNATed flow's, its quote getting the client's port
		 * back too.
		 */
		if (snat && e->snat_addr == key.daddr)
			snat = false;
		/* A DNATed flow's error goes up as it came where its reply
		 * does (rev_dnat), for the egress of the client's device to
		 * translate: the node's conntrack, which saw [C -> B], then
		 * finds it RELATED, where [C -> F] would be INVALID.
		 */
		if (ingress && !snat && !ct_admit_paused &&
		    rev_at_egress4(skb, p)) {
			metric_count(p, METRIC_TC_REV_AT_EGRESS);
			return TC_ACT_OK;
		}
		/* Replies to an external frontend go to the client from
		 * ingress, or the stack drops them (rev_dnat).
		 */
		redirect = ingress &&
			   (snat || fe_external(x.daddr, x.dport, key.proto));
	} else {
		key.dir = CT_FORWARD;
		e = ct_find(&key, now, &half_open);
		if (!e)
			return TC_ACT_OK;
		/* About a reply: [F -> C] becomes [B -> C or N:sp]. */
		snat = e->flags & CT_F_SNAT;
		x.saddr = e->nat_addr;
		x.sport = e->nat_port;
		if (snat) {
			x.daddr = e->snat_addr;
			x.dport = e->snat_port;
		}
		if (snat && e->snat_addr == key.saddr)
			snat = false; /* remapped: see above */
		redirect = snat;
	}
	/* A source-NATed flow's errors arrive at the node, at ingress. */
	if (snat && !ingress)
		return TC_ACT_OK;
	x.outer_daddr = x.saddr;
	x.outer_saddr = p->saddr == q.ip.daddr ? x.daddr : p->saddr;

	if (redirect) {
		if (p->ttl <= 1) {
			metric_count(p, METRIC_TC_TTL_EXCEEDED);
			return TC_ACT_SHOT;
		}
		if (fib4_lookup(skb, skb->ifindex, x.outer_saddr, x.outer_daddr,
				&f) < 0) {
			if (snat) {
				metric_count(p, METRIC_TC_FIB_ERR);
				return TC_ACT_SHOT;
			}
			redirect = false;
		}
	}
	if (icmp_rewrite(skb, p, &q, q_off, &x) < 0) {
		metric_count(p, METRIC_TC_REWRITE_ERR);
		return TC_ACT_SHOT;
	}
	metric_count(p, METRIC_TC_ICMP_XLATE);
	if (!redirect)
		return TC_ACT_OK;
	return redirect_fib(skb, p, &f);
}

#endif /* SLUICE_ICMP_XLATE_H */
