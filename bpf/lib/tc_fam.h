/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The steps of the tc path that both families take alike, a template
 * (family.h) that tc.c includes for IPv4 and tc6.h for IPv6: LB_FAMILY 4
 * defines lb4_check_source and the rest over struct pkt4, lb4_xlate and
 * the IPv4 maps; LB_FAMILY 6 lb6_check_source ... over struct pkt6,
 * lb6_xlate and the IPv6 maps. Its includer defines the family's
 * lb_xlate_t_N, tc_have_cluster_cidr_N, tc_node_dev_of_N and
 * tc_port_unreachable_N(skb, p) (an ICMP port unreachable about @p:
 * icmp_reply, icmp6_reply). No include guard, on
 * purpose.
 */
#ifndef LB_FN
/* LB_FN(x) - lb4_x or lb6_x, after LB_FAMILY. */
#define LB_FN(x) FAM_CAT(FAM_CAT(lb, LB_FAMILY), _##x)
#endif

/*
 * check_source - a frontend's loadBalancerSourceRanges, for @p, a packet
 * of the flow of the usable forward entry @fwd (NULL: a new flow).
 * Returns a TC verdict to end with, or -1 if @p may go on.
 *
 * Only a flow that has seen no reply is checked (no entry, or one without
 * CT_F_REPLIED), as kube-proxy checks netfilter's `ct state new` only: so
 * narrowing the ranges leaves an established connection from a source
 * now excluded alone (kube-proxy's nftables mode jumps to firewall-check
 * on `ct state new`; its iptables mode filters in the nat table, which
 * only a connection's first packet walks, and in KUBE-PROXY-FIREWALL on
 * `--ctstate NEW`), and a flow admitted but not yet answered is refused
 * from then on: a retransmitted SYN, or a datagram before any reply, is
 * netfilter's NEW, which nftables mode checks again before DNAT. (Its
 * iptables mode lets it through: the packet is DNATed already when
 * KUBE-PROXY-FIREWALL matches the LoadBalancer IP; the newer mode's rule
 * is the one followed, and the stricter.) The flag is read only for a
 * frontend with ranges, from the entry conntrack found anyway: no lookup
 * more, and one less (the trie) for an established flow to such a
 * frontend. XDP checks alike (xdp_fwd).
 */
static __always_inline int LB_FN(check_source)(const FAM(pkt_t) *p,
					       const struct lb4_service *svc,
					       const FAM(ct_entry_t) *fwd)
{
	if ((svc->flags & SVC_F_SRC_RANGES) &&
	    !(fwd && (READ_ONCE(fwd->flags) & CT_F_REPLIED)) &&
	    !FN(source_allowed)(p->daddr, p->dport, p->proto, p->saddr)) {
		metric_count(p, METRIC_TC_SRC_RANGE_DENY);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_SOURCE_RANGE, 0);
		return TC_ACT_SHOT;
	}
	return -1;
}

/*
 * unreachable - answer @p with an ICMP port unreachable from the address
 * the kernel's reject would come from (icmp_reject_src, icmp6_reject_src:
 * the destination if it is the node's, else the node's address for the
 * route back to the client), counted as @reason; a packet the kernel would
 * not answer (ICMP_NOT_SENT: a broadcast frame, a source of no single host, a
 * tail that cannot be trimmed) is dropped, counted as @reason too. Returns a
 * TC verdict, or ICMP_NOT_SENT (icmp_verdict).
 */
static __always_inline int LB_FN(unreachable)(struct __sk_buff *skb,
					      const FAM(pkt_t) *p,
					      enum metric_reason reason)
{
	int ret = FAM(tc_port_unreachable)(skb, p);

	metric_count(p, ret == TC_ACT_SHOT ? METRIC_TC_REWRITE_ERR : reason);
	return ret;
}

/*
 * refuse - the answer to a new flow to frontend @svc, which has no
 * backends: ICMP port unreachable, or a drop when the service has usable
 * endpoints elsewhere (SVC_F_DROP_EMPTY: a Local traffic policy on a node
 * without a local endpoint, as kube-proxy decides). Returns a TC verdict.
 */
static __always_inline int LB_FN(refuse)(struct __sk_buff *skb,
					 const FAM(pkt_t) *p,
					 const struct lb4_service *svc)
{
	int ret;

	if (svc->flags & SVC_F_DROP_EMPTY) {
		/* An external load balancer health-checks nodes and stops
		 * sending here; a client of the ClusterIP times out, as
		 * with kube-proxy.
		 */
		metric_count(p, METRIC_TC_LOCAL_NO_BACKEND);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_NO_LOCAL_ENDPOINTS,
			      0);
		return TC_ACT_SHOT;
	}
	ret = LB_FN(unreachable)(skb, p, METRIC_TC_NO_BACKEND);
	svc_count_pkt(
		p, svc->rev_nat_id,
		ret == TC_ACT_SHOT ? SVC_DROP_ERROR : SVC_DROP_NO_ENDPOINTS, 0);
	return icmp_verdict(ret);
}

/*
 * no_service - the answer to @p, a packet to no frontend: ICMP port
 * unreachable if its destination is a ClusterIP (a port or protocol it
 * does not serve: a TCP or UDP port, or any other protocol, PKT_OTHER),
 * a drop if it is another address of the service CIDR (unallocated),
 * else TC_ACT_OK: the packet is not for a service. kube-proxy's nftables
 * mode does the same (its cluster-ips-check chain: `reject`, whose
 * default is ICMP port unreachable, ICMPv6 port unreachable in the ip6
 * family); its iptables mode lets both through untranslated. A later
 * fragment to a ClusterIP is dropped, counted METRIC_TC_UNKNOWN_PORT: it
 * has no L4 header to quote or to read flags from, and its first fragment
 * got the error (RFC 1122 3.2.2) or was dropped as a stray (below).
 *
 * A TCP stray to a ClusterIP (ct_tcp_stray: a RST, a FIN, a SYN-ACK,
 * neither SYN nor ACK) is dropped, counted METRIC_TC_TCP_STRAY, not
 * answered: netfilter opens no connection for it (INVALID), and
 * kube-proxy's chains that reject or drop for a ClusterIP match `ct state
 * new` only (nftables: filter-forward and filter-output jump to
 * cluster-ips-check on it), so neither mode answers it; iptables mode's
 * KUBE-FORWARD drops it (ctstate INVALID), nftables mode routes it on
 * untranslated. To a frontend's port it is dropped alike (lb4_select,
 * lb6_dnat). So is a FIN or RST of a flow whose frontend was removed
 * since, once its retired master (SVC_F_RETIRED, tc_ingress) is gone
 * too: its entry is looked up only under a master.
 */
static __always_inline int LB_FN(no_service)(struct __sk_buff *skb,
					     const FAM(pkt_t) *p)
{
	if (FN(service_ip)(p->daddr)) {
		if (p->frag_later) {
			metric_count(p, METRIC_TC_UNKNOWN_PORT);
			return TC_ACT_SHOT;
		}
		if (p->proto == IPPROTO_TCP && ct_tcp_stray(p->tcp_flags)) {
			metric_count(p, METRIC_TC_TCP_STRAY);
			return TC_ACT_SHOT;
		}
		return icmp_verdict(
			LB_FN(unreachable)(skb, p, METRIC_TC_UNKNOWN_PORT));
	}
	if (FN(node_cidr)(p->daddr, NODE_CIDR_SERVICE)) {
		metric_count(p, METRIC_TC_SERVICE_CIDR_DROP);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

/*
 * scope - the master that serves @p's client at frontend @svc (its
 * default scope), having set @x->internal (the client is in the cluster
 * CIDR) and @x->outside (it is external and came in through a node device
 * with an address): the internal scope of a two-scope frontend for an
 * internal client, else @svc. The agent writes the internal scope before
 * the flag that names it; should a reader miss it anyway, the default
 * scope serves.
 *
 * Only an external frontend's masquerade reads @x->outside
 * (lb4_masquerade, lb6_masquerade; an internal client, the only one
 * another scope serves, is never outside): for any other frontend it is
 * left false, without the device lookup, except in a dry run, which
 * reports it.
 */
static __always_inline struct lb4_service *LB_FN(scope)(struct __sk_buff *skb,
							const FAM(pkt_t) *p,
							struct lb4_service *svc,
							FAM(lb_xlate_t) *x)
{
	struct lb4_service *in;

	x->internal = FAM(tc_have_cluster_cidr) &&FN(
		node_cidr)(p->saddr, NODE_CIDR_CLUSTER);
	x->outside = !x->internal &&
		     ((svc->flags & SVC_F_EXTERNAL) || explain_dry(p)) &&
		     FAM(tc_node_dev_of)(skb->ifindex);
	if ((svc->flags & SVC_F_TWO_SCOPES) && x->internal) {
		in = FN(lookup_service_scope)(p->daddr, p->dport, p->proto,
					      LB_SCOPE_INTERNAL);
		if (in) {
			metric_count(p, METRIC_TC_SHORT_CIRCUIT);
			svc = in;
		}
	}
	explain_flag(p, (x->internal ? EXPLAIN_F_INTERNAL : 0) |
				(x->outside ? EXPLAIN_F_OUTSIDE : 0));
	explain_scope(p, svc);
	return svc;
}

/*
 * scope_skipped - whether frontend skips scope for @p to @svc, @follow as
 * there.
 */
static __always_inline bool LB_FN(scope_skipped)(const FAM(pkt_t) *p,
						 const struct lb4_service *svc,
						 bool follow)
{
	return follow && !explain_dry(p) && !(svc->flags & SVC_F_TWO_SCOPES);
}

/*
 * frontend - frontend @svc, which @p is for (its caller looked it up:
 * tc_ingress), in the scope that serves @p's client (scope, which fills
 * in @x->internal and @x->outside). NULL if its source ranges refuse @p
 * (@ret: check_source's verdict).
 *
 * @fwd: the usable forward entry of @p's flow, which decides where it
 * goes, or NULL. Only a new flow needs @x->internal and @x->outside
 * (whether it is masqueraded), so a packet with an entry to a frontend of
 * one scope skips scope's lookups (the client's CIDR, its device:
 * scope_skipped); of two, the scope is still found, whose id its packets
 * are counted under (svcstats.h). A dry run (explain.h) finds it anyway,
 * to report it. The source ranges check a flow not yet answered only
 * (check_source).
 */
static __always_inline struct lb4_service *
LB_FN(frontend)(struct __sk_buff *skb, const FAM(pkt_t) *p,
		struct lb4_service *svc, FAM(lb_xlate_t) *x,
		const FAM(ct_entry_t) *fwd, int *ret)
{
	FN(explain_frontend)(p, svc);
	*ret = LB_FN(check_source)(p, svc, fwd);
	if (*ret >= 0)
		return NULL;
	if (LB_FN(scope_skipped)(p, svc, fwd != NULL))
		return svc;
	return LB_FN(scope)(skb, p, svc, x);
}

/*
 * reply_ct - the conntrack entry of the flow @p is a reply of, its key in
 * @key, tracked (ct_track_tcp). NULL if there is none, with @ret -1; or
 * with @ret TC_ACT_SHOT if @p is the first reply of a flow that cannot
 * become established: the flow is refused (see conntrack.h), counted.
 */
static __always_inline FAM(ct_entry_t) *
LB_FN(reply_ct)(const FAM(pkt_t) *p, FAM(ct_key_t) *key, __u64 now, int *ret)
{
	FAM(ct_entry_t) *e;
	int err;

	e = FN(ct_reply)(p, key, now, &err);
	if (err) {
		metric_count(p, err == -EEXIST ? METRIC_TC_CT_CLASH :
						 METRIC_TC_CT_EST_FULL);
		*ret = TC_ACT_SHOT;
		return NULL;
	}
	if (!e) {
		*ret = -1;
		return NULL;
	}
	FN(ct_track_tcp)(p, key, e, now);
	return e;
}
