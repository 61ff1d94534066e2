/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent half of socklb.h, a template (family.h) that
 * socklb.h includes once per family: sock4_select and the rest over the
 * IPv4 maps, sock6_select ... over the IPv6 ones. No include guard, on
 * purpose.
 */
/*
 * SOCK_FN(no_service) - the answer to a socket reaching @vip, where no
 * frontend is: -ECONNREFUSED for a ClusterIP (another port or protocol),
 * -EHOSTUNREACH for an unallocated address of the service CIDR, else 0.
 */
static __always_inline int SOCK_FN(no_service)(FAM(addr_t) vip,
					       struct sock_explain_ctx *x)
{
	if (FN(service_ip)(vip)) {
		sock_metric(x, METRIC_SOCK_UNKNOWN_PORT);
		return -ECONNREFUSED;
	}
	if (FN(node_cidr)(vip, NODE_CIDR_SERVICE)) {
		sock_metric(x, METRIC_SOCK_DROP);
		return -EHOSTUNREACH;
	}
	return 0;
}

/*
 * SOCK_FN(lookup) - the master that serves a socket (@ctx, or a dry run's
 * @x) of source @src at frontend <@vip, @port, @proto>, in @svc; or an
 * error to refuse it with. loadBalancerSourceRanges are checked against
 * @src. A two-scope frontend serves it from its internal scope if it is
 * an internal client (sock_internal_client), else from its default one.
 * A loopback destination is a frontend for the node's sockets only
 * (sock_loopback_served): for a pod's there is none.
 *
 * Returns 1 with @svc set, 0 if no frontend is there (nothing to do), or a
 * negative errno.
 */
static __always_inline int
SOCK_FN(lookup)(FAM(addr_t) vip, __be16 port, __u8 proto, FAM(addr_t) src,
		void *ctx, struct sock_explain_ctx *x, struct lb4_service **svc)
{
	struct lb4_service *s, *in;

	if (FAM(addr_loopback)(vip) && !sock_loopback_served(ctx, x))
		return 0;
	s = FN(lookup_live_service)(vip, port, proto);
	if (!s)
		return SOCK_FN(no_service)(vip, x);
	if (x) {
		x->flags |= EXPLAIN_F_FRONTEND;
		x->svc_flags = s->flags;
	}
	if ((s->flags & SVC_F_SRC_RANGES) &&
	    !FN(source_allowed)(vip, port, proto, src)) {
		sock_metric(x, METRIC_SOCK_DROP);
		sock_svc_count(x, s->rev_nat_id, SVC_DROP_SOURCE_RANGE);
		return -EHOSTUNREACH;
	}
	if ((s->flags & SVC_F_TWO_SCOPES) &&
	    sock_internal_client(ctx, x, FAM(sock_have_detector))) {
		in = FN(lookup_service_scope)(vip, port, proto,
					      LB_SCOPE_INTERNAL);
		if (in)
			s = in;
	}
	if (x) {
		x->flags |= EXPLAIN_F_SCOPE;
		x->scope = s->scope;
		x->count = s->count;
		x->rev_nat_id = s->rev_nat_id;
	}
	if (s->count == 0) {
		if (s->flags & SVC_F_DROP_EMPTY) {
			sock_metric(x, METRIC_SOCK_DROP);
			sock_svc_count(x, s->rev_nat_id,
				       SVC_DROP_NO_LOCAL_ENDPOINTS);
			return -EHOSTUNREACH;
		}
		sock_metric(x, METRIC_SOCK_NO_BACKEND);
		sock_svc_count(x, s->rev_nat_id, SVC_DROP_NO_ENDPOINTS);
		return -ECONNREFUSED;
	}
	*svc = s;
	return 1;
}

/*
 * SOCK_FN(aff_select) - FN(aff_select); a dry run notes whether the client's
 * affinity entry decided, or a fresh (random) selection.
 */
static __always_inline FAM(lb_backend) *
SOCK_FN(aff_select)(const FAM(aff_key_t) *akey, const struct lb4_service *svc,
		    __u64 now, __u32 *backend_id, __u16 *slot,
		    struct sock_explain_ctx *x)
{
	FAM(lb_backend) *be;

	if (!x)
		return FN(aff_select)(akey, svc, now, backend_id, slot);
	if (svc->flags & SVC_F_AFFINITY) {
		be = FN(aff_lookup)(akey, svc, now, backend_id, slot);
		if (be) {
			x->flags |= EXPLAIN_F_AFFINITY_HIT;
			return be;
		}
	}
	be = FN(select_backend_slot)(akey->master.vip, akey->master.port,
				     akey->master.proto, svc, backend_id, slot);
	if (be)
		x->flags |= EXPLAIN_F_NEW_FLOW;
	return be;
}

/*
 * SOCK_FN(sticky_select) - the backend an unconnected UDP socket (cookie
 * @cookie) used for this frontend before, while it is still one of the
 * service's backends (slot_still_names; a service that shrinks moves
 * backends down into holes, so a few sockets then select again
 * needlessly); otherwise a fresh selection (aff_select: the client's
 * session affinity first) that the socket then keeps. A datagram that
 * follows the socket's backend is no new "connection": it does not
 * refresh the client's session affinity.
 */
static __always_inline FAM(lb_backend) *SOCK_FN(sticky_select)(
	__u64 cookie, const FAM(aff_key_t) *akey, const struct lb4_service *svc,
	__u64 now, __u32 *backend_id, __u16 *slot, struct sock_explain_ctx *x)
{
	FAM(udp_stick_key_t) key = {
		.cookie = cookie,
		.vip = akey->master.vip,
		.port = akey->master.port,
		.proto = akey->master.proto,
	};
	FAM(udp_stick_t) st = {};
	FAM(udp_stick_t) *cur;
	FAM(lb_backend) *be;

	cur = bpf_map_lookup_elem(&FAM(udp_stick_map), &key);
	if (cur) {
		be = FN(slot_still_names)(key.vip, key.port, key.proto, svc,
					  cur->slot, cur->backend_id, cur->addr,
					  cur->port);
		if (be) {
			*backend_id = cur->backend_id;
			*slot = cur->slot;
			if (x)
				x->flags |= EXPLAIN_F_STICKY_HIT;
			return be;
		}
	}
	be = SOCK_FN(aff_select)(akey, svc, now, &st.backend_id, &st.slot, x);
	if (be) {
		*backend_id = st.backend_id;
		*slot = st.slot;
		if (x)
			return be;
		st.addr = be->addr;
		st.port = be->port;
		bpf_map_update_elem(&FAM(udp_stick_map), &key, &st, BPF_ANY);
		FN(aff_remember)(akey, svc, be, st.backend_id, st.slot, now);
	}
	return be;
}

/*
 * SOCK_FN(select) - the backend for a socket (@ctx: its sock_addr context)
 * of source @src (its bound address, or the node's) reaching <@vip,
 * @port, @proto>: the frontend's master in @svc, the backend in @be.
 * @sticky: keep the socket's previous backend (per-datagram sendmsg4).
 * @x: a dry run's context (the top), NULL live; a dry run has no socket
 * (@ctx NULL) and gives its network namespace and cookie in @x.
 *
 * The client of session affinity is the socket's network namespace
 * (affinity.h): a connect is a new connection of that client. What only
 * affinity and stickiness read (the namespace's cookie, the socket's, the
 * clock) is read only for a frontend with affinity or a sticky send: a
 * connect to a frontend without affinity, the common case, makes no
 * helper call for them.
 *
 * Returns 1 with @svc and @be set, 0 (not a service: nothing to do),
 * -ECONNREFUSED or -EHOSTUNREACH (SOCK_FN(lookup)).
 */
static __always_inline int
SOCK_FN(select)(FAM(addr_t) vip, __be16 port, __u8 proto, FAM(addr_t) src,
		void *ctx, bool sticky, struct sock_explain_ctx *x,
		struct lb4_service **svcp, FAM(lb_backend) **bep)
{
	FAM(aff_key_t) akey = {};
	struct lb4_service *svc = NULL;
	FAM(lb_backend) *be;
	__u32 backend_id = 0;
	__u64 netns = 0;
	__u16 slot = 0;
	__u64 now = 0;
	int ret;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	ret = SOCK_FN(lookup)(vip, port, proto, src, ctx, x, &svc);
	if (ret <= 0 || !svc)
		return ret;

	if (svc->flags & SVC_F_AFFINITY) {
		/*
		 * A dry run is sluice_sock_explain, a raw_tp program, which
		 * may not call bpf_ktime_get_coarse_ns: it reads
		 * CLOCK_MONOTONIC, less than a tick ahead of now_ns(), which
		 * cannot change what it explains.
		 */
		now = x ? bpf_ktime_get_ns() : now_ns();
		netns = x ? x->netns_cookie : bpf_get_netns_cookie(ctx);
	}
	FN(aff_key)(&akey, FAM(netns_client)(netns), AFFINITY_CLIENT_NETNS, vip,
		    port, proto, svc->scope);
	if (sticky) {
		__u64 cookie = x ? x->sock_cookie : bpf_get_socket_cookie(ctx);

		be = SOCK_FN(sticky_select)(cookie, &akey, svc, now,
					    &backend_id, &slot, x);
	} else {
		be = SOCK_FN(aff_select)(&akey, svc, now, &backend_id, &slot,
					 x);
		if (be && !x)
			FN(aff_remember)(&akey, svc, be, backend_id, slot, now);
	}
	if (!be) {
		/* Even after reading the service again (select_backend_slot):
		 * refuse rather than leave the VIP, which nothing answers
		 * (a TCP connect would hang).
		 */
		sock_metric(x, METRIC_SOCK_BACKEND_MISSING);
		sock_svc_count(x, svc->rev_nat_id, SVC_DROP_ERROR);
		return -ECONNREFUSED;
	}
	if (x) {
		x->flags |= EXPLAIN_F_DNAT;
		x->backend_id = backend_id;
		x->slot = slot;
		FAM(explain_be_addr)(x, be);
		x->be_port = be->port;
	}
	*svcp = svc;
	*bep = be;
	return 1;
}

/*
 * SOCK_FN(xlate_fwd) - the translation of a socket (@ctx: its sock_addr
 * context) of source @src reaching *@addr:*@port over @proto: the backend
 * SOCK_FN(select) picks, written over *@addr and *@port, and remembered
 * in the family's sock_rev map under the socket's cookie and the backend,
 * so that SOCK_FN(xlate_rev) shows the VIP again.
 * @sticky: keep the socket's previous backend (per-datagram sendmsg).
 *
 * Returns 1 (translated), 0 (not a service), -ECONNREFUSED or
 * -EHOSTUNREACH (SOCK_FN(lookup)).
 */
static __always_inline int SOCK_FN(xlate_fwd)(void *ctx, FAM(addr_t) *addr,
					      __be16 *port, __u8 proto,
					      FAM(addr_t) src, bool sticky)
{
	FAM(lb_backend) *be = NULL;
	struct lb4_service *svc = NULL;
	FAM(sock_rev_key_t) rkey = {};
	FAM(sock_rev_t) rval = {};
	int ret;

	ret = SOCK_FN(select)(*addr, *port, proto, src, ctx, sticky, NULL, &svc,
			      &be);
	if (ret <= 0 || !svc || !be)
		return ret;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = be->addr;
	rkey.port = be->port;
	rval.vip = *addr;
	rval.port = *port;
	rval.rev_nat_id = svc->rev_nat_id;
	/* If this fails the socket still works; only its peer name shows
	 * the backend.
	 */
	bpf_map_update_elem(&FAM(sock_rev_map), &rkey, &rval, BPF_ANY);

	*addr = be->addr;
	*port = be->port;
	metric_inc(METRIC_SOCK_XLATE);
	svc_count(svc->rev_nat_id, SVC_EV_FLOW, 0);
	return 1;
}

/*
 * SOCK_FN(xlate_rev) - the VIP a socket (@ctx) was translated from, if
 * *@addr:*@port is a backend SOCK_FN(xlate_fwd) sent it to: written over
 * them. Returns whether it was.
 */
static __always_inline bool SOCK_FN(xlate_rev)(void *ctx, FAM(addr_t) *addr,
					       __be16 *port)
{
	FAM(sock_rev_key_t) key = {
		.cookie = bpf_get_socket_cookie(ctx),
		.addr = *addr,
		.port = *port,
	};
	FAM(sock_rev_t) *e;

	e = bpf_map_lookup_elem(&FAM(sock_rev_map), &key);
	if (!e)
		return false;
	*addr = e->vip;
	*port = e->port;
	metric_inc(METRIC_SOCK_REV_XLATE);
	return true;
}

/*
 * SOCK_FN(xlate_forget) - a socket (cookie @cookie) whose peer is
 * *@addr:*@port is being released (sluice_sock_release): the sock_rev
 * entry SOCK_FN(xlate_fwd) wrote for it, if any, goes with it. Nothing can
 * ask for the socket's peer any more.
 */
static __always_inline void SOCK_FN(xlate_forget)(__u64 cookie,
						  FAM(addr_t) addr, __be16 port)
{
	FAM(sock_rev_key_t) key = {
		.cookie = cookie,
		.addr = addr,
		.port = port,
	};

	bpf_map_delete_elem(&FAM(sock_rev_map), &key);
}
