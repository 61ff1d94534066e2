/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The IPv6 per-packet path of tc.c: what the IPv4 path does, for IPv6
 * frontends (sluice6_services_v2).
 *
 * Ingress (in tc.c's order, lb6_dnat): a packet to a frontend is DNATed
 * to a backend, its flow's conntrack entry (ct6) deciding while it is
 * usable; else a reply of a translated flow (a CT_REVERSE hit in the IPv6
 * conntrack) gets its source rewritten back to the frontend; else a
 * packet to a frontend starts a flow to a random slot; a new flow to a
 * frontend without backends is answered with ICMPv6 port unreachable
 * (dropped with SVC_F_DROP_EMPTY); a packet to a ClusterIP no frontend
 * serves (sluice6_service_ips_v1) is answered the same way, one to
 * another address of the IPv6 service CIDR (sluice6_node_cidrs_v1) is
 * dropped. Egress: replies get the frontend back as their source. Both:
 * ICMPv6 errors about translated flows are translated back
 * (icmp6_xlate.h). Everything else passes untouched: other protocols and
 * ICMPv6 messages, later fragments whose first was not seen (parse6.h),
 * extension header chains it does not walk (parse6.h), UDP without a
 * checksum.
 *
 * North-south and masquerade, as tc.c says for IPv4 (lb6_masquerade is
 * lb4_masquerade): a new flow that kube-proxy's rules source-NAT (an
 * external client to a backend behind one of the node's devices, a
 * hairpin, a ClusterIP client outside the IPv6 cluster CIDR when one is
 * set) is DNATed and SNATed to the node's IPv6 address on the device its
 * route leaves through (sluice6_devices_v1), or to node_ip6 for a backend
 * on this node, with a source port reserved for the flow
 * (ct_create_snat6), and sent to the next hop by bpf_fib_lookup and a
 * redirect (nat6.h: one hop less; ICMPv6 time exceeded or packet too big
 * when it cannot go). Its replies come back to this node and are sent to
 * the client <frontend -> client> the same way, and so are ICMPv6 errors
 * about its packets (icmp6_xlate.h). An internal client (the
 * IPv6 cluster CIDR) of a two-scope frontend is served by its internal
 * scope.
 *
 * rev_nat6, nat6_forward, lb6_follow, lb6_new_flow, nat_need6,
 * the affinity steps, rewrite6_l4addr and icmp6_build are BPF functions
 * of their own: their conntrack and affinity keys and entries, routes
 * and the quote live in their own frames, which the stack has no room
 * for at once; and
 * nat_snat6, the SNAT port search, and ct_new6 are global functions,
 * which the verifier checks once, on their own.
 *
 * A DNATed flow's reply at the ingress of a device (a pod's, in
 * --devices) that will leave by a device with tc is translated at that
 * device's egress, as IPv4's (rev_dnat): the node's conntrack sees it as
 * the flow's reply. Not here: the direct send to the client of a reply
 * that a pod's device reverse-NATs at ingress (rev_dnat), which IPv6
 * does not need: its stack forwards a packet from the node's own address,
 * which IPv4's drops as a martian.
 *
 * Dry runs (explain.h): tc6_body is built twice, as tc.c's tc_body is,
 * the dry twins with pkt6.dry true: they write no map and note what they
 * decide, the addresses in sluice_expl6_v1. The BPF
 * functions of their own read the bit from the packet. A dry run is a
 * TCP or UDP packet (sluicectl crafts no other): the twins pass ICMPv6
 * errors untouched.
 *
 * The IPv6 path is programs of their own (sluice6_ingress, sluice6_egress
 * in tc.c), which the IPv4 entries reach by a tail call (tc6_divert,
 * sluice6_tc_v1): the verifier checks them apart from the IPv4 programs,
 * each within its own limit, and their stacks do not add up.
 */
#ifndef SLUICE_TC6_H
#define SLUICE_TC6_H

#include "consts.h"
#include "maps.h"
#include "metrics.h"
#include "svcstats.h"
#include "lb.h"
#include "affinity.h"
#include "conntrack.h"
#include "parse6.h"
#include "icmp6.h"
#include "icmp6_xlate.h"
#include "nat6.h"
#include "explain.h"

#define IP6_SADDR_OFF offsetof(struct ipv6hdr, saddr)
#define IP6_DADDR_OFF offsetof(struct ipv6hdr, daddr)

/*
 * rewrite6_l4addr - replace one <address, port> of @p's packet (@to_dst:
 * the destination, else the source), updating the TCP/UDP checksum, whose
 * pseudo-header covers the address (IPv6 has no header checksum).
 * Returns 0 or a negative error (the packet may be half rewritten).
 *
 * A BPF function of its own: inlined, its checksum arithmetic took 16
 * bytes more of the entry's frame, which with icmp6_build's on top has
 * none to give.
 */
static __noinline int rewrite6_l4addr(struct __sk_buff *skb,
				      const struct pkt6 *p, bool to_dst,
				      const union v6addr *addr, __be16 port)
{
	union v6addr *old = (union v6addr *)(to_dst ? &p->daddr : &p->saddr);
	__be16 old_port = to_dst ? p->dport : p->sport;
	__u64 l4_flags = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	int err;

	if (!lb6_addr_eq(old, addr)) {
		/* A later fragment has no L4 header: its first fragment's
		 * rewrite fixes the checksum of the whole datagram.
		 */
		err = p->frag_later ?
			      0 :
			      bpf_l4_csum_replace(skb, p->csum_off, 0,
						  csum_diff_v6(old, addr),
						  l4_flags | BPF_F_PSEUDO_HDR);
		if (err < 0)
			return err;
		err = bpf_skb_store_bytes(skb,
					  p->l3_off + (to_dst ? IP6_DADDR_OFF :
								IP6_SADDR_OFF),
					  addr, sizeof(*addr), 0);
		if (err < 0)
			return err;
	}
	if (old_port != port && !p->frag_later)
		return rewrite_port(skb, p->csum_off, l4_flags,
				    p->l4_off + (to_dst ? L4_DPORT_OFF :
							  L4_SPORT_OFF),
				    old_port, port);
	return 0;
}

/*
 * parse_tc6 - parse @skb into @p, counting why it is not translatable. A
 * BPF function of its own (see the top): its headers and fragment record
 * key live in its frame.
 */
static __noinline enum pkt_kind parse_tc6(struct __sk_buff *skb, struct pkt6 *p)
{
	switch (parse_ipv6(skb, p)) {
	case PARSE_OK:
		if (p->frag_later)
			metric_count(p, METRIC_TC_FRAG_LATER);
		return PKT_L4;
	case PARSE_ICMP_ERR:
		return PKT_ICMP_ERR;
	case PARSE_OTHER:
		return PKT_OTHER;
	case PARSE_MALFORMED:
		metric_count(p, METRIC_TC_MALFORMED);
		return PKT_PASS;
	case PARSE_FRAGMENT:
		metric_count(p, METRIC_TC_FRAGMENT);
		return PKT_PASS;
	case PARSE_EXT:
		metric_count(p, METRIC_TC6_EXT_HDR);
		return PKT_PASS;
	case PARSE_UDP_NO_CSUM:
		metric_count(p, METRIC_TC6_UDP_NO_CSUM);
		return PKT_PASS;
	default:
		return PKT_PASS;
	}
}

/*
 * Where a packet goes: lb4_xlate's IPv6 twin. For a packet to a service,
 * its backend (and, source-NATed, this node's address and port); for a
 * reply of a source-NATed flow (rev_nat6), <snat_addr:snat_port ->
 * addr:port> is <frontend -> client>.
 */
struct lb6_xlate {
	union v6addr addr;	/* the backend */
	union v6addr snat_addr; /* snat: this node's address */
	__be16 port;
	__be16 snat_port; /* snat: the flow's port on this node */
	__u16 slot;	  /* new flow: the slot that named it */
	bool snat;	  /* source-NATed to this node */
	/* in: the client is internal (the IPv6 cluster CIDR) */
	bool internal;
	__u32 backend_id; /* new flow: its id */
	/* in: the client is external and came in through a node device
	 * with an IPv6 address (not a pod of this node)
	 */
	bool outside;
	/* snat to the client's own address, another port (a clash remap,
	 * lb4_remap in tc.c): sent on as a DNATed flow's packet is
	 */
	bool remap;
	/* in: new flow: no entry at all under its forward key (lb6_has_flow;
	 * ct_create's @fresh)
	 */
	bool fresh;
	/* in: the usable forward entry's backend has left (lb6_has_flow;
	 * ct_fwd_usable's @gone)
	 */
	bool gone;
};

/* The steps both families take alike (tc_fam.h): lb6_check_source, ... */
#define lb_xlate_t_6	       struct lb6_xlate
#define tc_have_cluster_cidr_6 have_cluster_cidr6
#define tc_node_dev_of_6       node6_dev_of
#define tc_port_unreachable_6(skb, p) \
	icmp6_reply(skb, p, ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH, 0, true)
#define LB_FAMILY 6
#include "tc_fam.h"
#undef LB_FAMILY

/*
 * The verdict of rev_nat6 and lb6_dnat for a packet of a source-NATed
 * flow, which the entry sends on by nat6_forward: the route and its
 * checks live in that function's frame, which the stack has no room for
 * on top of theirs.
 */
#define TC6_FORWARD (-4)

/*
 * lb6_new_flow's answer for a flow to remap to another client port (after
 * nat_need6's 1 and 2), which nat_snat6 then records.
 */
#define TC6_NEED_REMAP 3

/*
 * rev_at_egress6 - rev_at_egress4 (tc.c) for IPv6: whether @p, the reply
 * of a flow that was DNATed only or an ICMPv6 error about its request
 * (icmp6_xlate.h), at the ingress of a device, will leave
 * by a device the agent attached tc to (dev_has_tc), as the stack routes
 * it as it came; never at a bridge or bond port (dev_is_port). A global
 * function, as rev_at_egress4, that asks
 * bpf_fib_lookup itself: its frame is the only one on top of rev_nat6's
 * (with fib6_lookup's on top of one of its own, the four would not fit
 * the stack together).
 */
__noinline int rev_at_egress6(struct __sk_buff *skb, const struct pkt6 *p)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET6,
	};
	struct node_dev *dev;

	if (!skb || !p)
		return 0;
	/* dev_is_port, its key in @fib: a stack slot more would not fit. */
	fib.ifindex = skb->ifindex;
	dev = bpf_map_lookup_elem(&sluice_devices_v1, &fib.ifindex);
	if (dev && (dev->flags & NODE_DEV_F_PORT))
		return 0;
	__builtin_memcpy(fib.ipv6_src, &p->saddr, sizeof(p->saddr));
	__builtin_memcpy(fib.ipv6_dst, &p->daddr, sizeof(p->daddr));
	if (fib_ret_unusable(bpf_fib_lookup(skb, &fib, sizeof(fib), 0)))
		return 0;
	dev = bpf_map_lookup_elem(&sluice_devices_v1, &fib.ifindex);
	return dev && (dev->flags & NODE_DEV_F_TC);
}

/*
 * tcp_stray_local6 - tcp_stray_local (tc.c) for IPv6: whether @p, a TCP
 * stray to an external frontend, goes up to the node's stack (the
 * lookup's answers, and its flags 0, as there).
 */
__noinline int tcp_stray_local6(struct __sk_buff *skb, const struct pkt6 *p)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET6,
		.tot_len = sizeof(struct ipv6hdr),
	};
	int ret;

	if (!skb || !p)
		return 0;
	fib.ifindex = skb->ifindex;
	__builtin_memcpy(fib.ipv6_src, &p->saddr, sizeof(p->saddr));
	__builtin_memcpy(fib.ipv6_dst, &p->daddr, sizeof(p->daddr));
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	return ret == BPF_FIB_LKUP_RET_NOT_FWDED ||
	       ret == BPF_FIB_LKUP_RET_FWD_DISABLED;
}

/*
 * rev_nat6 - if @p is a reply of a translated flow, rewrite its source
 * back to the frontend. Returns a TC verdict, -1 if @p is not such a
 * reply, or TC6_FORWARD for a reply of a source-NATed flow, with @x
 * saying where it goes (<frontend -> client>, as rev_nat does it). A
 * remapped flow's reply <B:q -> C:p'> (lb6_new_flow) is addressed to the
 * client already: it gets its destination port back, and goes on as a
 * DNATed flow's reply, which at @ingress is passed up as it came when it
 * will leave by a device with tc (rev_at_egress6), to be translated at
 * that device's egress, where the node's conntrack has seen it (rev_dnat
 * in tc.c says why; and why not while ct_admit_paused).
 */
static __noinline int rev_nat6(struct __sk_buff *skb, const struct pkt6 *p,
			       __u64 now, struct lb6_xlate *x, bool ingress)
{
	struct ct6_key key = {};
	struct ct6_entry *e;
	union v6addr fe;
	__be16 fe_port;
	int ret;

	e = lb6_reply_ct(p, &key, now, &ret);
	if (!e)
		return ret;
	fe = e->nat_addr;
	fe_port = e->nat_port;
	explain_reply6(p, fe, fe_port);
	x->port = p->dport;
	if (e->flags & CT_F_SNAT) {
		explain_snat6(p, EXPLAIN_F_SNAT, e->snat_addr, e->snat_port);
		x->port = e->snat_port;
		if (!lb6_addr_eq(&e->snat_addr, &p->daddr)) {
			/* <B -> N:sp> becomes <F -> C>. */
			metric_count(p, METRIC_TC_REV_NAT);
			x->snat_addr = fe;
			x->snat_port = fe_port;
			x->addr = e->snat_addr;
			return TC6_FORWARD;
		}
	}
	if (ingress && !ct_admit_paused && rev_at_egress6(skb, p)) {
		metric_count(p, METRIC_TC_REV_AT_EGRESS);
		return TC_ACT_OK;
	}
	metric_count(p, METRIC_TC_REV_NAT);
	if (rewrite6_l4addr(skb, p, false, &fe, fe_port) < 0 ||
	    rewrite6_l4addr(skb, p, true, &p->daddr, x->port) < 0) {
		metric_count(p, METRIC_TC_REWRITE_ERR);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

/*
 * nat6_forward - rewrite @p to <@x->snat_addr:snat_port -> @x->addr:port>
 * and send it to its next hop: a source-NATed flow's packet to its
 * backend, or its reply to the client. Returns a TC verdict, or one of
 * fwd_check6's ICMPv6 errors (the MTU in @mtu) for the entry to answer
 * (tc6_answer).
 */
static __noinline int nat6_forward(struct __sk_buff *skb, const struct pkt6 *p,
				   const struct lb6_xlate *x, __u32 *mtu)
{
	struct fib6 f = {};
	int ret;

	if (fib6_lookup(skb, skb->ifindex, &x->snat_addr, &x->addr, &f) < 0) {
		metric_count(p, METRIC_TC_FIB_ERR);
		return TC_ACT_SHOT;
	}
	ret = fwd_check6(skb, p, &f, false, mtu);
	if (ret != -1)
		return ret;
	if (rewrite6_l4addr(skb, p, true, &x->addr, x->port) < 0 ||
	    rewrite6_l4addr(skb, p, false, &x->snat_addr, x->snat_port) < 0) {
		metric_count(p, METRIC_TC_REWRITE_ERR);
		return TC_ACT_SHOT;
	}
	return redirect_fib6(skb, p, &f);
}

/*
 * Session affinity for a new flow of @p to @svc (affinity.h), the client
 * being the packet's source: functions of their own, whose key lives in
 * their frames (see the top), as the IPv4 path's.
 */

/* lb6_aff_select - aff_select6 for the client of @p (@x: id and slot). */
static __noinline struct lb6_backend *
lb6_aff_select(const struct pkt6 *p, const struct lb4_service *svc, __u64 now,
	       struct lb6_xlate *x)
{
	struct lb6_affinity_key key = {};
	__u32 id = 0;
	__u16 slot = 0;
	struct lb6_backend *be;

	aff_key6(&key, p->saddr, AFFINITY_CLIENT_ADDR, p->daddr, p->dport,
		 p->proto, svc->scope);
	be = aff_select6(&key, svc, now, &id, &slot);
	/* A dry run asks again whether the client's entry decided. */
	if (be && explain_dry(p) && (svc->flags & SVC_F_AFFINITY) &&
	    aff_lookup6(&key, svc, now, &id, &slot) == be)
		explain_flag(p, EXPLAIN_F_AFFINITY_HIT);
	x->backend_id = id;
	x->slot = slot;
	return be;
}

/*
 * lb6_aff_remember - aff_remember6 for the client of @p, sent to @x, as of
 * @now (the run's clock reading, not a second one). It returns at once
 * for a frontend without affinity: a backend lookup less on every other
 * new flow.
 */
static __noinline int lb6_aff_remember(const struct pkt6 *p,
				       const struct lb4_service *svc,
				       const struct lb6_xlate *x, __u64 now)
{
	struct lb6_affinity_key key = {};
	struct lb6_backend *be;

	if (explain_dry(p) || !(svc->flags & SVC_F_AFFINITY))
		return 0;
	be = lookup_backend6(x->backend_id);
	if (!be)
		return 0;
	aff_key6(&key, p->saddr, AFFINITY_CLIENT_ADDR, p->daddr, p->dport,
		 p->proto, svc->scope);
	aff_remember6(&key, svc, be, x->backend_id, x->slot, now);
	return 0;
}

/*
 * lb6_masquerade - lb4_masquerade for IPv6: whether a new flow of @p to
 * backend @be (on this node, or wherever the route says) of frontend @svc
 * is source-NATed to this node, by kube-proxy's rules and Sluice's one
 * deviation (see there).
 */
static __always_inline bool lb6_masquerade(const struct pkt6 *p,
					   const struct lb4_service *svc,
					   const struct lb6_backend *be,
					   const struct lb6_xlate *x)
{
	if (lb6_addr_eq(&p->saddr, &be->addr))
		return true;
	if (!(svc->flags & SVC_F_EXTERNAL))
		return masquerade_all || (have_cluster_cidr6 && !x->internal);
	if (svc->flags & SVC_F_LOCAL)
		return false;
	return masquerade_all || !x->outside;
}

/*
 * nat_need6 - nat_remote's decision (tc.c) for IPv6: whether a new flow of
 * @p to backend @be of frontend @svc is source-NATed (lb6_masquerade), and
 * to what (@x->snat_addr): the IPv6 address of the node device its route
 * leaves through (sluice6_devices), or node_ip6 behind a device that runs
 * tc. Returns 0 (not source-NATed), 1 (to a device's address: a remote
 * backend) or 2 (to node_ip6). A BPF function of its own, for its route.
 */
static __noinline int nat_need6(struct __sk_buff *skb, const struct pkt6 *p,
				const struct lb4_service *svc,
				const struct lb6_backend *be,
				struct lb6_xlate *x)
{
	bool masq = lb6_masquerade(p, svc, be, x);
	struct fib6 f = {};
	union v6addr *dev;

	if (!masq &&
	    (!(svc->flags & SVC_F_EXTERNAL) || (svc->flags & SVC_F_LOCAL)))
		return 0;
	if (fib6_lookup(skb, skb->ifindex, &p->saddr, &be->addr, &f))
		return 0;
	dev = node6_dev_of(f.ifindex);
	if (dev) {
		x->snat_addr = *dev;
		return 1;
	}
	if (!masq || !node_ip6_of(&x->snat_addr) || !dev_has_tc(f.ifindex))
		return 0;
	return 2;
}

/*
 * nat_snat6 - record a new flow of @p to frontend @svc, sent to the
 * backend @x names, source-NATed to @x->snat_addr (nat_need6 said so, as
 * @need; or lb6_new_flow, TC6_NEED_REMAP: the client's own address):
 * reserve a source port for it (ct_create_snat6), which also records the
 * flow, as of @now. Returns 0 with @x->snat_port set, or -1 if the flow
 * must be dropped (counted): as nat_remote, rather than half-NAT it; a
 * remap without a free port is counted as the clash it is.
 *
 * A global function (as ct_new6): the verifier checks it
 * once, on its own, not again for every path of the program that reaches
 * it, which with its port search (SNAT_TRIES) would not fit its limit. So
 * its pointers may be NULL as far as it knows.
 */
__noinline int nat_snat6(const struct pkt6 *p, const struct lb4_service *svc,
			 struct lb6_xlate *x, int need, __u64 now)
{
	struct lb6_backend be = {};
	int err;

	if (!p || !svc || !x)
		return -1;
	be.addr = x->addr;
	be.port = x->port;
	err = ct_create_snat6(p, &be, x->backend_id, svc->rev_nat_id,
			      x->snat_addr, now, &x->snat_port, x->fresh);
	if (err) {
		if (err > 0)
			metric_count(p, need == TC6_NEED_REMAP ?
						METRIC_TC_CT_CLASH :
						METRIC_TC_SNAT_EXHAUSTED);
		else if (err == -E2BIG)
			metric_count(p, METRIC_TC_CT_EST_FULL);
		else if (err == -ENOSPC) /* the half-open share full */
			metric_count(p, METRIC_TC_SNAT_HALF_OPEN_FULL);
		else if (err == -EEXIST) /* a claimed forward key */
			metric_count(p, METRIC_TC_CT_CLASH);
		else
			metric_count(p, METRIC_TC_CT_FULL);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_CONNTRACK, 0);
		return -1;
	}
	x->snat = true;
	x->remap = need == TC6_NEED_REMAP;
	metric_count(p, need == 1 ? METRIC_TC_SNAT_NEW :
			need == 2 ? METRIC_TC_MASQ_LOCAL :
				    METRIC_TC_CT_CLASH_REMAP);
	svc_count_pkt(p, svc->rev_nat_id, SVC_EV_FLOW, 0);
	return 0;
}

/*
 * ct_new6 - ct_create6 of a new flow of @p to @be (@x: its backend id,
 * and whether its forward key is fresh), in a frame of its own (its keys
 * and entries would not fit lb6_new_flow's on the stack with nat_need6's
 * route). A global function, as nat_snat6: checked once rather than for
 * every path of the program that reaches it (69,041 of the program's
 * 246,350 instructions verified, 2,158 then).
 */
__noinline int ct_new6(const struct pkt6 *p, const struct lb6_backend *be,
		       const struct lb6_xlate *x, __u32 rev_nat_id, __u64 now)
{
	if (!p || !be || !x)
		return -1;
	return ct_create6(p, be, x->backend_id, rev_nat_id, now, x->fresh);
}

/*
 * lb6_new_flow - send a new flow of @p to @svc to the backend
 * lb6_aff_select chooses (a random slot, or the client's backend with
 * session affinity: the backend it returns is used, not looked up again
 * by its id), and record the flow in conntrack; unless nat_need6 says
 * the flow is source-NATed, which the caller then records (nat_snat6),
 * or its reply tuple is another flow's (ct_create6's clash): then it is
 * source-NATed to the client's own address with another port, as
 * lb4_remap (tc.c) does and says why, which the caller records too.
 * Returns 0 with @x filled in, nat_need6's 1 or 2 or TC6_NEED_REMAP with
 * @x filled in but nothing recorded, or -1 if the packet must be dropped
 * (counted).
 */
static __noinline int lb6_new_flow(struct __sk_buff *skb, const struct pkt6 *p,
				   const struct lb4_service *svc, __u64 now,
				   struct lb6_xlate *x)
{
	struct lb6_backend *be = lb6_aff_select(p, svc, now, x);
	int ret;

	if (!be) {
		metric_count(p, METRIC_TC_BACKEND_MISSING);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_ERROR, 0);
		return -1;
	}
	x->addr = be->addr;
	x->port = be->port;
	ret = nat_need6(skb, p, svc, be, x);
	if (ret)
		return ret;
	ret = ct_new6(p, be, x, svc->rev_nat_id, now);
	if (ret == CT_CLASH) {
		if (!ct_opens6(p)) {
			/* Not an opening packet: see lb4_remap. */
			metric_count(p, METRIC_TC_CT_CLASH);
			svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_CONNTRACK,
				      0);
			return -1;
		}
		x->snat_addr = p->saddr;
		return TC6_NEED_REMAP;
	}
	if (ret == -EEXIST) {
		/* A key of the flow is claimed (ct_create): not sent. */
		metric_count(p, METRIC_TC_CT_CLASH);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_CONNTRACK, 0);
		return -1;
	}
	if (ret < 0)
		metric_count(p, METRIC_TC_CT_FULL);
	metric_count(p, METRIC_TC_DNAT_NEW);
	svc_count_pkt(p, svc->rev_nat_id, SVC_EV_FLOW, 0);
	return 0;
}

/*
 * lb6_follow - where a packet to frontend @svc goes, @fwd being its
 * flow's usable conntrack entry (lb6_has_flow found it, and set
 * @x->gone): its backend. Returns 0 with @x filled in, or -1 to drop
 * (counted).
 *
 * The entry is the one lb6_has_flow found, as tc.c's lb4_ct_follow
 * follows lb4_fwd_find's: looked up again here, as it was before, every
 * packet of an established IPv6 flow paid a second conntrack lookup (and
 * a half-open one's two, the established table's miss again) and a
 * second backend read. Only the key is made again (ct_key_of6, no
 * lookup): it lives in this frame, which the program's stack has room
 * for, not in lb6_dnat's.
 */
static __noinline int lb6_follow(const struct pkt6 *p,
				 const struct lb4_service *svc, __u64 now,
				 struct lb6_xlate *x, struct ct6_entry *fwd)
{
	struct ct6_key key = {};
	bool refreshed = false;
	int err;

	ct_key_of6(&key, p, CT_FORWARD);
	if (fwd) {
		if (x->gone)
			metric_count(p, METRIC_TC_CT_BACKEND_GONE);
		x->addr = fwd->nat_addr;
		x->port = fwd->nat_port;
		x->backend_id = fwd->backend_id;
		x->slot = 0;
		explain_flag(p, EXPLAIN_F_CT_HIT);
		if (fwd->flags & CT_F_SNAT) {
			x->snat = true;
			x->snat_addr = fwd->snat_addr;
			x->snat_port = fwd->snat_port;
			x->remap = lb6_addr_eq(&fwd->snat_addr, &p->saddr);
		}
		if (!explain_dry(p))
			refreshed = ct_refresh6(fwd, p->proto, now);
		ct_track_tcp6(p, &key, fwd, now);
		err = ct_check_reverse_due6(p, &key, fwd, now, refreshed);
		if (err == -EEXIST || (err < 0 && x->snat)) {
			/* Another flow holds the reply tuple (the SNAT port),
			 * or the port is not reserved: never send from a
			 * tuple the flow does not own (lb4_ct_follow).
			 */
			metric_count(p, x->snat ? METRIC_TC_SNAT_LOST :
						  METRIC_TC_CT_CLASH);
			svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_CONNTRACK,
				      0);
			return -1;
		}
		if (err < 0)
			metric_count(p, METRIC_TC_CT_FULL);
		metric_count(p, METRIC_TC_DNAT_CT);
		return 0;
	}
	return -1;
}

/*
 * lb6_assure - ct_assure6 of the flow of @p, which lb6_follow followed by
 * its forward entry @fwd: called from lb6_dnat, after lb6_follow, whose
 * frame with ct_assure6's on top is more than the stack has; the key
 * lives in this frame. ct_assure6 refreshes @fwd again, by its
 * established lifetime.
 */
static __noinline int lb6_assure(const struct pkt6 *p, struct ct6_entry *fwd,
				 __u64 now)
{
	struct ct6_key key = {};

	if (!p || !fwd)
		return 0;
	ct_key_of6(&key, p, CT_FORWARD);
	ct_assure6(&key, fwd, now);
	return 0;
}

/*
 * lb6_has_flow - the usable forward entry (ct_fwd_usable6) of @p, a
 * packet to a frontend, which lb6_follow then follows, with @x->gone set
 * if its backend has left; else NULL, with @x->fresh set if there is no
 * entry at all under its key (ct_find_any6). A BPF function of its own,
 * as lb6_follow: the key lives in its frame.
 */
static __noinline struct ct6_entry *lb6_has_flow(const struct pkt6 *p,
						 __u64 now, struct lb6_xlate *x)
{
	struct ct6_key key = {};
	struct ct6_entry *fwd;
	bool half_open, gone, none;

	ct_key_of6(&key, p, CT_FORWARD);
	fwd = ct_find_any6(&key, now, &half_open, &none);
	x->fresh = none;
	if (!fwd || !ct_fwd_usable6(fwd, p, &gone))
		return NULL;
	x->gone = gone;
	return fwd;
}

/*
 * lb6_dnat - @p at a device's ingress: translate a packet to an IPv6
 * frontend to one of its backends (and, for a flow lb6_masquerade
 * source-NATs, source-NAT it and have the entry send it to the backend),
 * refuse it, or, if it is a reply of a translated flow, rewrite it back
 * (rev_nat6). Returns a TC verdict, -1 for a packet of neither, or
 * TC6_FORWARD with @x saying where to (nat6_forward).
 *
 * In tc.c's order (tc_ingress says why it is sound): the frontend, then
 * the flow's forward entry; a packet without one is looked up as a reply
 * before it is taken for a new flow. A packet of an established flow
 * saves the reply lookup's two misses, and to a frontend of one scope,
 * scope's lookups (lb6_frontend); lb6_follow follows the entry
 * lb6_has_flow found. A pure TCP SYN to a frontend is never looked up as
 * a reply (ct_syn_only6, tc_ingress).
 */
static __always_inline int lb6_dnat(struct __sk_buff *skb, const struct pkt6 *p,
				    __u64 now, struct lb6_xlate *x)
{
	struct ct6_entry *fwd = NULL;
	struct lb4_service *svc;
	int ret, flow;

	svc = lookup_service6(p->daddr, p->dport, p->proto);
	if (svc) {
		fwd = lb6_has_flow(p, now, x);
		/* Retired: followed by its flows only (tc_ingress). */
		if (!fwd && (svc->flags & SVC_F_RETIRED))
			svc = NULL;
	}
	flow = fwd != NULL;
	if (!flow && !(svc && ct_syn_only6(p))) {
		ret = rev_nat6(skb, p, now, x, true);
		if (ret != -1)
			return ret;
		if (!svc)
			return lb6_no_service(skb, p);
	}
	svc = lb6_frontend(skb, p, svc, x, fwd, &ret);
	if (!svc)
		return ret;
	/* Conntrack first: a Service that has dropped to zero endpoints
	 * keeps its established flows, as kube-proxy does.
	 */
	ret = flow ? lb6_follow(p, svc, now, x, fwd) : 2;
	/* The client's ACK after the answer: assured (conntrack.h). */
	if (ret == 0 && ct_assure_due6(p, fwd))
		lb6_assure(p, fwd, now);
	if (ret == 2 && p->frag_later) {
		/* A later fragment follows its flow and never starts one
		 * (see lb4_select).
		 */
		metric_count(p, METRIC_TC_FRAG_DROP);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_ERROR, 0);
		return TC_ACT_SHOT;
	}
	if (ret == 2 && p->proto == IPPROTO_TCP && ct_tcp_stray(p->tcp_flags)) {
		/* No flow, and it cannot open one (see lb4_select). */
		if ((svc->flags & SVC_F_EXTERNAL) && tcp_stray_local6(skb, p)) {
			metric_count(p, METRIC_TC_TCP_STRAY_UP);
			return TC_ACT_OK;
		}
		metric_count(p, METRIC_TC_TCP_STRAY);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_CONNTRACK, 0);
		return TC_ACT_SHOT;
	}
	if (ret == 2 && svc->count) {
		ret = lb6_new_flow(skb, p, svc, now, x);
		if (ret > 0)
			ret = nat_snat6(p, svc, x, ret, now);
		if (!ret) {
			explain_flag(p, EXPLAIN_F_NEW_FLOW);
			lb6_aff_remember(p, svc, x, now);
		}
	}
	if (ret < 0)
		return TC_ACT_SHOT;
	if (ret > 0)
		return lb6_refuse(skb, p, svc);
	explain_backend6(p, x->backend_id, x->slot, x->addr, x->port);
	svc_count_pkt(p, svc->rev_nat_id, SVC_EV_PACKET, p->l3_len);
	if (x->snat) {
		explain_snat6(p, EXPLAIN_F_SNAT, x->snat_addr, x->snat_port);
		if (!x->remap)
			return TC6_FORWARD;
	}
	if (rewrite6_l4addr(skb, p, true, &x->addr, x->port) < 0 ||
	    (x->remap &&
	     rewrite6_l4addr(skb, p, false, &x->snat_addr, x->snat_port) < 0)) {
		metric_count(p, METRIC_TC_REWRITE_ERR);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_ERROR, 0);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

/* The slots of sluice6_tc_v1, which the agent fills (pkg/datapath). */
#define TC6_PROG_INGRESS 0
#define TC6_PROG_EGRESS	 1

/*
 * tc6_divert - run @skb, an IPv6 packet, through the IPv6 program in slot
 * @prog. Returns only if there is none (an agent that did not set it
 * up): TC_ACT_OK, the packet untouched, as before IPv6 was handled.
 */
static __always_inline int tc6_divert(struct __sk_buff *skb, __u32 prog)
{
	bpf_tail_call(skb, &sluice6_tc_v1, prog);
	return TC_ACT_OK;
}

/*
 * tc6_body - the body of the IPv6 programs, at a device's @ingress or
 * egress, and with @dry true of their dry twins (see the top).
 */
static __always_inline int tc6_body(struct __sk_buff *skb, bool dry,
				    bool ingress)
{
	struct pkt6 p = { .dry = dry };
	struct lb6_xlate x = {};
	__u32 mtu = 0;
	__u64 now;
	int ret;

	explain_begin(skb, dry);
	switch (parse_tc6(skb, &p)) {
	case PKT_L4:
		break;
	case PKT_ICMP_ERR:
		if (dry)
			return TC_ACT_OK;
		ret = icmp6_err_xlate(skb, &p, ingress);
		if (ret != TC6_ICMP_SNAT)
			return ret;
		/* A source-NATed flow's errors arrive at the node, at
		 * ingress.
		 */
		return ingress ? icmp6_snat_xlate(skb, &p) : TC_ACT_OK;
	case PKT_OTHER:
		/* No frontend serves it (tc_body). */
		return ingress ? lb6_no_service(skb, &p) : TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
	now = now_ns();
	if (ingress)
		ret = lb6_dnat(skb, &p, now, &x);
	else
		ret = rev_nat6(skb, &p, now, &x, false);
	if (ret == -1)
		return TC_ACT_OK;
	if (ret == TC6_FORWARD)
		ret = nat6_forward(skb, &p, &x, &mtu);
	return tc6_answer(skb, &p, ret, mtu);
}

#endif /* SLUICE_TC6_H */
