/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent body of xdp.c, a template (family.h) that xdp.c
 * includes once per family: xdp_translate and its steps over the IPv4
 * maps, xdp_translate6 ... over the IPv6 ones. xdp.c defines, per family,
 * the packet (xdp_pkt_t), its rewrite (xdp_rewrite), its TTL or hop limit
 * (xdp_ttl), where it goes (xdp_out_t), the route (fib_t, fib_lookup;
 * for the route cache: fib_params, fib_result, fib_key_t, fib_cache),
 * the node device the backend's route leaves through (node_dev_t,
 * node_dev_of, dev_addr), how a flow's port is reserved
 * (xdp_create_snat) and its reply entry checked (xdp_check_reverse), and
 * whether the steps are inlined or BPF functions of their own (xdp_step).
 *
 * The steps: xdp_rev (a reply), xdp_fwd (a packet to a frontend, of a
 * flow conntrack knows), xdp_new (one that starts a flow), each handing
 * the packet to xdp_out; xdp_new is called from the top (xdp_translate),
 * not from xdp_fwd, so that the port search under it (xdp_create_snat)
 * has the stack that IPv6's frames leave.
 * No include guard, on purpose.
 */

/*
 * xdp_send - send the rewritten packet to the next hop @f names: XDP_TX
 * if that is out of the device it came in on, else a redirect.
 */
static __always_inline int FN(xdp_send)(struct xdp_md *ctx, FAM(xdp_pkt_t) *x,
					const FAM(fib_t) *f)
{
	__builtin_memcpy(x->eth->h_dest, f->dmac, ETH_ALEN);
	__builtin_memcpy(x->eth->h_source, f->smac, ETH_ALEN);
	if (f->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(f->ifindex, 0);
}

/*
 * xdp_out - rewrite @x to <@t->saddr:sport -> @t->daddr:dport> and send it
 * to the next hop @t->f names (whose neighbour is resolved: the caller
 * passes the packet to tc before rewriting it otherwise).
 */
static __always_inline int FN(xdp_out)(struct xdp_md *ctx, FAM(xdp_pkt_t) *x,
				       const FAM(xdp_out_t) *t)
{
	FN(xdp_rewrite)(x, t->saddr, t->sport, t->daddr, t->dport);
	return FN(xdp_send)(ctx, x, &t->f);
}

/*
 * xdp_out_new - xdp_out for xdp_new, a step of its own for IPv6: inlined
 * there, it would grow the frame of the program's deepest path (to the
 * port search); inlined in xdp_rev and xdp_fwd, it saves a call on every
 * packet of an established flow.
 */
static FAM(xdp_step) int FN(xdp_out_new)(struct xdp_md *ctx, FAM(xdp_pkt_t) *x,
					 const FAM(xdp_out_t) *t)
{
	return FN(xdp_out)(ctx, x, t);
}

/*
 * xdp_fib - fib_lookup of <@saddr -> @daddr> for a packet of an
 * established flow that came in on @ctx's device, into @f, through the
 * route cache (xdp.c says when an entry is used): a packet of @now.
 * Returns 0, or -1 if there is no usable route.
 */
static FAM(xdp_step) int FN(xdp_fib)(struct xdp_md *ctx,
				     const FAM(addr_t) *saddr,
				     const FAM(addr_t) *daddr, FAM(fib_t) *f,
				     __u64 now)
{
	__u32 gen = READ_ONCE(fib_gen);
	FAM(fib_key_t) key = {};
	union {
		struct bpf_fib_lookup fib;
		struct fib_hop hop;
	} u;
	struct fib_hop *hop;
	int ret;

	key.ifindex = ctx->ingress_ifindex;
	key.saddr = *saddr;
	key.daddr = *daddr;
	hop = bpf_map_lookup_elem(&FAM(fib_cache), &key);
	if (hop && hop->gen == gen && now - hop->stamp < fib_cache_ns) {
		f->ifindex = hop->ifindex;
		__builtin_memcpy(f->smac, hop->smac, ETH_ALEN);
		__builtin_memcpy(f->dmac, hop->dmac, ETH_ALEN);
		f->have_neigh = true;
		return 0;
	}
	__builtin_memset(&u, 0, sizeof(u)); /* a miss: zeroed only now */
	FAM(fib_params)(&u.fib, &key);
	ret = bpf_fib_lookup(ctx, &u.fib, sizeof(u.fib), 0);
	if (FAM(fib_result)(&u.fib, ret, f) < 0)
		return -1;
	if (ret != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	u.hop.stamp = now;
	u.hop.gen = gen;
	u.hop.ifindex = f->ifindex;
	__builtin_memcpy(u.hop.smac, f->smac, ETH_ALEN);
	__builtin_memcpy(u.hop.dmac, f->dmac, ETH_ALEN);
	__builtin_memset(u.hop.pad, 0, sizeof(u.hop.pad));
	bpf_map_update_elem(&FAM(fib_cache), &key, &u.hop, BPF_ANY);
	return 0;
}

/*
 * xdp_route - where @x, a packet of the source-NATed flow of conntrack
 * entry @e, goes (into @t): to the flow's backend (@to_backend: <node:port
 * -> backend>) or back to its client (<frontend -> client>), and the next
 * hop (xdp_fib: a packet of @now). Returns whether XDP may send it there
 * itself (a route, its neighbour resolved, a TTL and size xdp_fwd_ok
 * takes: the size is checked on every packet, the route cached or not).
 */
static __always_inline bool FN(xdp_route)(struct xdp_md *ctx, FAM(xdp_pkt_t) *x,
					  const FAM(ct_entry_t) *e,
					  bool to_backend, FAM(xdp_out_t) *t,
					  __u64 now)
{
	if (to_backend) {
		t->saddr = e->snat_addr;
		t->sport = e->snat_port;
		t->daddr = e->nat_addr;
		t->dport = e->nat_port;
	} else {
		t->saddr = e->nat_addr;
		t->sport = e->nat_port;
		t->daddr = e->snat_addr;
		t->dport = e->snat_port;
	}
	if (FN(xdp_fib)(ctx, &t->saddr, &t->daddr, &t->f, now) < 0 ||
	    !t->f.have_neigh)
		return false;
	return xdp_fwd_ok(ctx, FAM(xdp_ttl)(x), &t->f.ifindex);
}

/* xdp_rev - the reply of a source-NATed flow. -1: not one. */
static FAM(xdp_step) int FN(xdp_rev)(struct xdp_md *ctx, FAM(xdp_pkt_t) *x,
				     __u64 now)
{
	FAM(ct_key_t) key = {};
	FAM(ct_entry_t) *e;
	FAM(xdp_out_t) t = {};

	/* Source-NATed flows only: their reply entries (the port
	 * reservations) are always in the established table. Not one
	 * remapped to another client port (tc.c, lb4_remap): its reply is
	 * addressed to the client already, and tc translates it.
	 */
	FN(ct_key_of)(&key, &x->p, CT_REVERSE);
	e = bpf_map_lookup_elem(FAM(ct_est), &key);
	if (!e || !(e->flags & CT_F_SNAT) ||
	    FAM(addr_eq)(e->snat_addr, key.daddr) ||
	    !ct_alive(READ_ONCE(e->expires), now))
		return -1;
	/* <B -> N:sp> becomes <F -> C>. */
	if (!FN(xdp_route)(ctx, x, e, false, &t, now))
		return XDP_PASS;
	/* The first reply promotes the flow; if that fails, tc tries again
	 * and refuses the flow (counted).
	 */
	if (!(READ_ONCE(e->flags) & CT_F_REPLIED) &&
	    FAM(xdp_promote_snat)(&key, e, now))
		return XDP_PASS;
	FN(ct_touch)(&key, e, now);
	FN(ct_track_tcp)(&x->p, &key, e, now);
	metric_inc(METRIC_XDP_REV);
	return FN(xdp_out)(ctx, x, &t);
}

/*
 * The verdicts of xdp_fwd for a packet that starts a flow, which the
 * caller hands to xdp_new: XDP_NEW_FRESH when there is no conntrack
 * entry at all under its forward key (ct_find_any's @none; ct_create_snat's
 * @fresh).
 */
#define XDP_NEW_FLOW  (-2)
#define XDP_NEW_FRESH (-3)

/*
 * xdp_src_denied - whether the loadBalancerSourceRanges of frontend @svc
 * (which has them) refuse @p; counted. A step of its own for IPv6: its
 * key (40 bytes) then lives in its frame, beside xdp_fib's, not in
 * xdp_fwd's, under which the route lookup's frame sits.
 */
static FAM(xdp_step) bool FN(xdp_src_denied)(const FAM(pkt_t) *p,
					     const struct lb4_service *svc)
{
	if (FN(source_allowed)(p->daddr, p->dport, p->proto, p->saddr))
		return false;
	metric_inc(METRIC_XDP_SRC_RANGE_DENY);
	svc_count(svc->rev_nat_id, SVC_DROP_SOURCE_RANGE, 0);
	return true;
}

/*
 * xdp_fwd - a packet to an external frontend with a remote backend: the
 * frontend's checks, and a flow conntrack knows. Returns an XDP verdict,
 * or XDP_NEW_FLOW with the frontend in @svcp.
 */
static FAM(xdp_step) int FN(xdp_fwd)(struct xdp_md *ctx, FAM(xdp_pkt_t) *x,
				     __u64 now, struct lb4_service **svcp)
{
	const FAM(pkt_t) *p = &x->p;
	struct lb4_service *svc;
	FAM(ct_key_t) key = {};
	FAM(ct_entry_t) *fwd;
	FAM(xdp_out_t) t = {};
	bool half_open, gone, none;
	__u8 flags;

	/* 127.0.0.0/8 is no frontend from a device, nor a client: tc drops
	 * and counts such a packet (tc.c, tc_loopback_martian).
	 */
	if (FAM(addr_loopback)(p->daddr) || FAM(addr_loopback)(p->saddr))
		return XDP_PASS;
	svc = FN(lookup_service)(p->daddr, p->dport, p->proto);
	if (!svc)
		return XDP_PASS;
	flags = svc->flags;
	if ((flags & (SVC_F_EXTERNAL | SVC_F_LOCAL)) != SVC_F_EXTERNAL ||
	    svc->count == 0)
		return XDP_PASS;

	FN(ct_key_of)(&key, p, CT_FORWARD);
	fwd = FN(ct_find_any)(&key, now, &half_open, &none);
	/* The source ranges check a flow not yet answered only, as tc's
	 * check_source says; an entry tc would not follow (not usable,
	 * below) is passed to it, which checks the flow it starts.
	 */
	if ((flags & SVC_F_SRC_RANGES) &&
	    !(fwd && (READ_ONCE(fwd->flags) & CT_F_REPLIED)) &&
	    FN(xdp_src_denied)(p, svc))
		return XDP_DROP;
	if (!fwd) {
		/* A packet that cannot open a flow: tc drops it, counted. */
		if (p->proto == IPPROTO_TCP && ct_tcp_stray(p->tcp_flags))
			return XDP_PASS;
		*svcp = svc;
		return none ? XDP_NEW_FRESH : XDP_NEW_FLOW;
	}
	/* Not source-NATed (or remapped to another port of the client,
	 * lb4_remap): a local backend, tc's to DNAT. Not usable: tc
	 * re-balances it, or starts it afresh. Its backend gone: tc counts
	 * the draining flow.
	 */
	if (!(fwd->flags & CT_F_SNAT) ||
	    FAM(addr_eq)(fwd->snat_addr, p->saddr) ||
	    !FN(ct_fwd_usable)(fwd, p, &gone) || gone)
		return XDP_PASS;
	if (!FN(xdp_route)(ctx, x, fwd, true, &t, now))
		return XDP_PASS;
	/* A port reservation lost (and maybe taken): tc drops and counts,
	 * never sends from a port the flow does not own.
	 */
	if (FAM(xdp_check_reverse)(p, &key, fwd, now) < 0)
		return XDP_PASS;
	/* The client's ACK after the answer: assured (conntrack.h). */
	if (FN(ct_assure_due)(p, fwd))
		FN(ct_assure)(&key, fwd, now);
	FN(ct_refresh)(fwd, p->proto, now);
	FN(ct_track_tcp)(p, &key, fwd, now);
	svc_count(svc->rev_nat_id, SVC_EV_PACKET, p->l3_len);
	metric_inc(METRIC_XDP_FWD);
	return FN(xdp_out)(ctx, x, &t);
}

/*
 * Session affinity for a new flow of @p to @svc, the client being the
 * packet's source: steps of their own, whose key lives in their frames.
 */

/* xdp_aff_select - aff_select for the client of @p. */
static FAM(xdp_step) FAM(lb_backend) *
FN(xdp_aff_select)(const FAM(pkt_t) *p, const struct lb4_service *svc,
		   __u64 now, __u32 *backend_id, __u16 *slot)
{
	FAM(aff_key_t) key = {};

	FN(aff_key)(&key, p->saddr, AFFINITY_CLIENT_ADDR, p->daddr, p->dport,
		    p->proto, svc->scope);
	return FN(aff_select)(&key, svc, now, backend_id, slot);
}

/*
 * xdp_aff_remember - aff_remember for the client of @p, sent to @be (of
 * @svc, which has affinity). (Five arguments at most: it reads the clock.)
 */
static FAM(xdp_step) int FN(xdp_aff_remember)(const FAM(pkt_t) *p,
					      const struct lb4_service *svc,
					      const FAM(lb_backend) *be,
					      __u32 backend_id, __u16 slot)
{
	FAM(aff_key_t) key = {};

	FN(aff_key)(&key, p->saddr, AFFINITY_CLIENT_ADDR, p->daddr, p->dport,
		    p->proto, svc->scope);
	FN(aff_remember)(&key, svc, be, backend_id, slot, now_ns());
	return 0;
}

/*
 * xdp_new - a packet of @x that starts a flow to external frontend @svc:
 * to a backend on another node, DNATed and SNATed with a port reserved
 * for the flow; else XDP_PASS. @fresh: no entry at all under its forward
 * key (XDP_NEW_FRESH).
 */
static FAM(xdp_step) int FN(xdp_new)(struct xdp_md *ctx, FAM(xdp_pkt_t) *x,
				     const struct lb4_service *svc, __u64 now,
				     bool fresh)
{
	const FAM(pkt_t) *p = &x->p;
	FAM(lb_backend) *be;
	FAM(node_dev_t) *dev;
	FAM(xdp_out_t) t = {};
	__u32 backend_id = 0;
	__u16 slot = 0;

	be = FN(xdp_aff_select)(p, svc, now, &backend_id, &slot);
	if (!be)
		return XDP_PASS;
	t.daddr = be->addr;
	t.dport = be->port;
	if (FAM(fib_lookup)(ctx, ctx->ingress_ifindex, p->saddr, t.daddr,
			    &t.f) < 0 ||
	    !t.f.have_neigh)
		return XDP_PASS;
	dev = FAM(node_dev_of)(t.f.ifindex);
	if (!dev)
		return XDP_PASS; /* local backend: tc DNATs */
	if (!xdp_fwd_ok(ctx, FAM(xdp_ttl)(x), &t.f.ifindex))
		return XDP_PASS;
	t.saddr = FAM(dev_addr)(dev);
	if (FAM(xdp_create_snat)(p, be, backend_id, svc->rev_nat_id, t.saddr,
				 now, &t.sport, fresh))
		return XDP_PASS; /* tc counts and drops */
	if (svc->flags & SVC_F_AFFINITY)
		FN(xdp_aff_remember)(p, svc, be, backend_id, slot);
	metric_inc(METRIC_XDP_SNAT_NEW);
	svc_count(svc->rev_nat_id, SVC_EV_FLOW, 0);
	svc_count(svc->rev_nat_id, SVC_EV_PACKET, p->l3_len);
	metric_inc(METRIC_XDP_FWD);
	return FN(xdp_out_new)(ctx, x, &t);
}

/* xdp_translate - the reply or request @x, parsed, or XDP_PASS. */
static __always_inline int FN(xdp_translate)(struct xdp_md *ctx,
					     FAM(xdp_pkt_t) *x)
{
	__u64 now = now_ns();
	struct lb4_service *svc = NULL;
	__u16 dport = bpf_ntohs(x->p.dport);
	int ret;

	/* A reply of a source-NATed flow comes back to a port SNAT
	 * reserved, from snat_port_min to snat_port_max (ct_create_snat):
	 * a packet to another port (a NodePort's, a frontend's) is none,
	 * and skips the reverse lookup. (A flow reserved by an agent with
	 * another range has its replies passed to tc, which serves them.)
	 */
	if (dport >= snat_port_min && dport <= snat_port_max) {
		ret = FN(xdp_rev)(ctx, x, now);
		if (ret >= 0)
			return ret;
	}
	ret = FN(xdp_fwd)(ctx, x, now, &svc);
	if ((ret != XDP_NEW_FLOW && ret != XDP_NEW_FRESH) || !svc)
		return ret;
	return FN(xdp_new)(ctx, x, svc, now, ret == XDP_NEW_FRESH);
}
