/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ICMPv6 errors about translated IPv6 flows, translated back, as
 * icmp_xlate.h does ICMP's (its header says why and how):
 *
 *   about a request:  B -> C  [C:cp -> B:bp]  becomes  F -> C  [C:cp -> F:fp]
 *   about a reply:    C -> F  [F:fp -> C:cp]  becomes  C -> B  [B:bp -> C:cp]
 *
 * and for a source-NATed flow (icmp6_snat_xlate), whose errors arrive at
 * the node and are sent on where the flow goes (nat6.h), one hop less:
 *
 *   about a request:  R -> N  [N:sp -> B:bp]  becomes  R -> C  [C:cp -> F:fp]
 *   about a reply:    C -> F  [F:fp -> C:cp]  becomes  N -> B  [B:bp -> N:sp]
 *
 * The quote is an IPv6 header without extension headers and at least 8
 * bytes of TCP or UDP (anything else passes untouched). ICMPv6's checksum
 * covers a pseudo-header with the outer addresses, and the whole message:
 * it is updated for every field that changes, outer or quoted, and for
 * the quoted TCP or UDP checksum, when the quote holds it, which is
 * updated as the whole segment's or datagram's would be.
 * The error is rewritten in place and goes on through the stack; it
 * refreshes no conntrack entry. A DNATed flow's error about a request is
 * translated where the flow's replies are (icmp_xlate.h says why): at an
 * ingress whose route to the client leaves by a device with tc, at that
 * device's egress.
 */
#ifndef SLUICE_ICMP6_XLATE_H
#define SLUICE_ICMP6_XLATE_H

#include "consts.h"
#include "maps.h"
#include "metrics.h"
#include "conntrack.h"
#include "parse6.h"
#include "nat6.h"

int rev_at_egress6(struct __sk_buff *skb, const struct pkt6 *p); /* tc6.h */

/* The quote of an ICMPv6 error: an IPv6 header and 8 bytes of L4. */
struct icmp6_quote {
	struct ipv6hdr ip;
	__be16 sport;
	__be16 dport;
	__be16 w[2]; /* UDP: length and checksum; TCP: sequence number */
};

/* An address and a port, as a checksum sees them (20 bytes). */
struct csum_l4addr {
	union v6addr addr;
	__be16 port;
	__u16 pad;
};

/*
 * icmp6_set_addr - write @to over the address at @off (@old there now),
 * updating the ICMPv6 checksum at @csum_off: through the pseudo-header
 * for an outer address (@pseudo).
 */
static __always_inline int icmp6_set_addr(struct __sk_buff *skb, __u32 off,
					  __u32 csum_off, union v6addr *old,
					  union v6addr *to, bool pseudo)
{
	__s64 diff = bpf_csum_diff(old->p, sizeof(*old), to->p, sizeof(*to), 0);

	if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff,
					    pseudo ? BPF_F_PSEUDO_HDR : 0) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, to, sizeof(*to), 0);
}

/*
 * icmp6_rewrite_quote - make the quote @q of the error @p name <@to> in
 * place of its source (@src) or destination, and keep its TCP or UDP
 * checksum (when quoted) and the ICMPv6 checksum exact. Returns 0 or a
 * negative error.
 */
static __noinline int icmp6_rewrite_quote(struct __sk_buff *skb,
					  const struct pkt6 *p,
					  struct icmp6_quote *q, bool src,
					  struct csum_l4addr *to)
{
	__u32 q_off = p->l4_off + 8, csum_off = p->l4_off + 2;
	struct csum_l4addr from = {};
	__u32 addr_off = q_off + (src ? offsetof(struct ipv6hdr, saddr) :
					offsetof(struct ipv6hdr, daddr));
	__u32 port_off = q_off + sizeof(struct ipv6hdr) + (src ? 0 : 2);
	bool udp = q->ip.nexthdr == IPPROTO_UDP, have_check;
	__u32 check_off = q_off + sizeof(struct ipv6hdr) + (udp ? 6 : 16);
	__be16 check = 0, fixed;
	__s64 sum;

	__builtin_memcpy(&from.addr, src ? &q->ip.saddr : &q->ip.daddr,
			 sizeof(from.addr));
	from.port = src ? q->sport : q->dport;
	/* The quoted L4 checksum, if quoted: UDP's always (zero: none);
	 * TCP's when the quote goes past RFC 4443's minimum, as a stack's
	 * does (as much of the packet as fits in 1280 bytes).
	 */
	if (udp) {
		check = q->w[1];
		have_check = check != 0;
	} else {
		have_check = check_off + 2 <= p->l3_off + p->l3_len &&
			     !bpf_skb_load_bytes(skb, check_off, &check, 2);
	}
	if (have_check) {
		sum = bpf_csum_diff((__be32 *)&from, sizeof(from), (__be32 *)to,
				    sizeof(*to), (__u16)~check);
		if (sum < 0)
			return -1;
		fixed = csum_fold((__u32)sum);
		if (udp && !fixed)
			fixed = 0xffff;
		if (bpf_l4_csum_replace(skb, csum_off, check, fixed, 2) < 0 ||
		    bpf_skb_store_bytes(skb, check_off, &fixed, 2, 0) < 0)
			return -1;
		/* For a second rewrite of the same quote. */
		if (udp)
			q->w[1] = fixed;
	}
	if (icmp6_set_addr(skb, addr_off, csum_off, &from.addr, &to->addr,
			   false) < 0)
		return -1;
	if (bpf_l4_csum_replace(skb, csum_off, from.port, to->port, 2) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, port_off, &to->port, 2, 0);
}

/*
 * icmp6_find - the conntrack entry that the packet @p, an ICMPv6 error,
 * is about (its quote in @q, the entry's key in @key): the quoted
 * packet's reply entry (a request's error), or its own (@about_reply: a
 * reply's), or NULL.
 */
static __always_inline struct ct6_entry *
icmp6_find(struct __sk_buff *skb, const struct pkt6 *p, struct icmp6_quote *q,
	   struct ct6_key *key, bool *about_reply)
{
	__u64 now = now_ns();
	struct ct6_entry *e;
	bool half_open;

	*about_reply = false;
	if (bpf_skb_load_bytes(skb, p->l4_off + 8, q, sizeof(*q)) < 0 ||
	    q->ip.version != 6 ||
	    (q->ip.nexthdr != IPPROTO_TCP && q->ip.nexthdr != IPPROTO_UDP))
		return NULL;
	/* An error goes to the quoted packet's source (as icmp_xlate.h):
	 * one sent elsewhere is about no flow of ours, and is not routed
	 * (rev_at_egress6, icmp6_snat_xlate) by a destination the flow
	 * never had.
	 */
	if (!lb6_addr_eq(&p->daddr, (const union v6addr *)&q->ip.saddr))
		return NULL;
	/* The quoted packet's reply: its key is the quote swapped. */
	__builtin_memcpy(&key->saddr, &q->ip.daddr, sizeof(key->saddr));
	__builtin_memcpy(&key->daddr, &q->ip.saddr, sizeof(key->daddr));
	key->sport = q->dport;
	key->dport = q->sport;
	key->proto = q->ip.nexthdr;
	key->dir = CT_REVERSE;
	/* Live entries, established or half-open, not refreshed (as
	 * icmp_err_xlate).
	 */
	e = ct_find6(key, now, &half_open);
	if (e)
		return e;
	key->dir = CT_FORWARD;
	*about_reply = true;
	return ct_find6(key, now, &half_open);
}

/*
 * icmp6_err_xlate's verdict for an error about a source-NATed flow, which
 * the entry of the ingress program translates and sends on
 * (icmp6_snat_xlate): its frames do not fit on top of icmp6_err_xlate's.
 */
#define TC6_ICMP_SNAT (-5)

/*
 * icmp6_snat_xlate - translate @p, an ICMPv6 error at a device's ingress,
 * if it is about a request (or a reply) of a source-NATed flow, and send
 * it on where the flow goes: the quote gets the addresses and ports of the
 * flow's other side, the outer destination the quote's new source, and an
 * outer source that was the quote's destination (the peer itself) its new
 * destination. Returns a TC verdict. A BPF function of its own, for its
 * route.
 */
static __noinline int icmp6_snat_xlate(struct __sk_buff *skb,
				       const struct pkt6 *p)
{
	__u32 csum_off = p->l4_off + 2;
	struct csum_l4addr qs = {}, qd = {};
	union v6addr osrc = p->saddr, odst = p->daddr;
	struct icmp6_quote quote, *q = &quote;
	struct ct6_key key = {};
	struct ct6_entry *e;
	struct fib6 f = {};
	bool about_reply;

	e = icmp6_find(skb, p, q, &key, &about_reply);
	if (!e || !(e->flags & CT_F_SNAT))
		return TC_ACT_OK;

	/* About a request: [N:sp -> B:bp] becomes [C:cp -> F:fp]; about a
	 * reply: [F:fp -> C:cp] becomes [B:bp -> N:sp].
	 */
	qs.addr = about_reply ? e->nat_addr : e->snat_addr;
	qs.port = about_reply ? e->nat_port : e->snat_port;
	qd.addr = about_reply ? e->snat_addr : e->nat_addr;
	qd.port = about_reply ? e->snat_port : e->nat_port;
	if (p->hop_limit <= 1) {
		/* No error about an error. */
		metric_inc(METRIC_TC_TTL_EXCEEDED);
		return TC_ACT_SHOT;
	}
	if (lb6_addr_eq(&p->saddr, (const union v6addr *)&q->ip.daddr))
		osrc = qd.addr;
	if (fib6_lookup(skb, skb->ifindex, &osrc, &qs.addr, &f) < 0) {
		metric_inc(METRIC_TC_FIB_ERR);
		return TC_ACT_SHOT;
	}
	if (icmp6_set_addr(skb, p->l3_off + offsetof(struct ipv6hdr, daddr),
			   csum_off, &odst, &qs.addr, true) < 0 ||
	    icmp6_set_addr(skb, p->l3_off + offsetof(struct ipv6hdr, saddr),
			   csum_off, (union v6addr *)&p->saddr, &osrc,
			   true) < 0 ||
	    icmp6_rewrite_quote(skb, p, q, true, &qs) < 0 ||
	    icmp6_rewrite_quote(skb, p, q, false, &qd) < 0) {
		metric_inc(METRIC_TC_REWRITE_ERR);
		return TC_ACT_SHOT;
	}
	metric_inc(METRIC_TC_ICMP_XLATE);
	return redirect_fib6(skb, p, &f);
}

/*
 * icmp6_err_xlate - translate @p, an ICMPv6 error (parse_icmp6_err) at a
 * device's @ingress or egress, back if it is about a translated flow; one
 * about a DNATed flow's request at an ingress whose route to the client
 * leaves by a device with tc goes up as it came, as the flow's replies
 * do (rev_at_egress6), for that device's egress. Returns a TC verdict,
 * or TC6_ICMP_SNAT if the flow is source-NATed. A BPF function of its
 * own, like the steps of tc6.h, for its stack.
 */
static __noinline int icmp6_err_xlate(struct __sk_buff *skb, struct pkt6 *p,
				      bool ingress)
{
	__u32 csum_off = p->l4_off + 2;
	struct csum_l4addr to = {};
	struct icmp6_quote q;
	struct ct6_key key = {};
	struct ct6_entry *e;
	bool about_reply, remap;

	e = icmp6_find(skb, p, &q, &key, &about_reply);
	if (!e)
		return TC_ACT_OK;
	/* A flow remapped to another port of the client (tc.c, lb4_remap)
	 * is a DNATed flow's, its quote getting the client's port back too.
	 */
	remap = (e->flags & CT_F_SNAT) &&
		lb6_addr_eq(&e->snat_addr,
			    about_reply ? &key.saddr : &key.daddr);
	if ((e->flags & CT_F_SNAT) && !remap)
		return TC6_ICMP_SNAT;
	/* About a request, at an ingress: where the flow's replies go up
	 * as they came (rev_nat6), so does its error (icmp_xlate.h).
	 */
	if (ingress && !about_reply && !ct_admit_paused &&
	    rev_at_egress6(skb, p)) {
		metric_inc(METRIC_TC_REV_AT_EGRESS);
		return TC_ACT_OK;
	}
	to.addr = e->nat_addr;
	to.port = e->nat_port;

	/* About a request, from the backend itself: it comes from the
	 * frontend. About a reply, to the frontend: it goes to the backend.
	 */
	if (!about_reply && lb6_addr_eq(&p->saddr, &key.saddr)) {
		if (icmp6_set_addr(skb,
				   p->l3_off + offsetof(struct ipv6hdr, saddr),
				   csum_off, &p->saddr, &to.addr, true) < 0)
			goto err;
	} else if (about_reply && lb6_addr_eq(&p->daddr, &key.daddr)) {
		if (icmp6_set_addr(skb,
				   p->l3_off + offsetof(struct ipv6hdr, daddr),
				   csum_off, &p->daddr, &to.addr, true) < 0)
			goto err;
	}
	if (icmp6_rewrite_quote(skb, p, &q, about_reply, &to) < 0)
		goto err;
	if (remap) {
		/* [C:p' -> B] names C:p, [F -> C:p] C:p'. */
		to.addr = e->snat_addr;
		to.port = e->snat_port;
		if (icmp6_rewrite_quote(skb, p, &q, !about_reply, &to) < 0)
			goto err;
	}
	metric_inc(METRIC_TC_ICMP_XLATE);
	return TC_ACT_OK;
err:
	metric_inc(METRIC_TC_REWRITE_ERR);
	return TC_ACT_SHOT;
}

#endif /* SLUICE_ICMP6_XLATE_H */
