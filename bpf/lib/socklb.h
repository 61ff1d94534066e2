/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The socket path's frontend lookup and backend selection (sock.c), one
 * function for its two callers: the cgroup connect4/sendmsg4 programs,
 * and sluice_sock_explain, the dry run `sluicectl explain --socket` runs
 * (a cgroup sock_addr program cannot be run by BPF_PROG_TEST_RUN; a
 * syscall program can, and calls this same code).
 *
 * The dry run is @x, its context: NULL for the live programs (a constant
 * after inlining, so the compiler removes the notes from them), else the
 * context the answer goes into. A dry run writes nothing but @x: no
 * counter, no affinity or stickiness entry (it reads them, and notes which
 * decided).
 */
#ifndef SLUICE_SOCKLB_H
#define SLUICE_SOCKLB_H

#include "consts.h"
#include "structs.h"
#include "maps.h"
#include "metrics.h"
#include "svcstats.h"
#include "lb.h"
#include "affinity.h"

/* sock_metric - count @reason; a dry run notes it in @x instead. */
static __always_inline void sock_metric(struct sock_explain_ctx *x,
					__u32 reason)
{
	if (x)
		x->reason = (__u8)reason;
	else
		metric_inc(reason);
}

/* sock_svc_count - svc_count, which a dry run skips. */
static __always_inline void sock_svc_count(struct sock_explain_ctx *x, __u32 id,
					   __u32 event)
{
	if (!x)
		svc_count(id, event, 0);
}

/*
 * sock4_no_service - the answer to a socket reaching @vip, where no
 * frontend is: -ECONNREFUSED for a ClusterIP (another port or protocol),
 * -EHOSTUNREACH for an unallocated address of the service CIDR, else 0.
 */
static __always_inline int sock4_no_service(__be32 vip,
					    struct sock_explain_ctx *x)
{
	if (service_ip(vip)) {
		sock_metric(x, METRIC_SOCK_UNKNOWN_PORT);
		return -ECONNREFUSED;
	}
	if (node_cidr(vip, NODE_CIDR_SERVICE)) {
		sock_metric(x, METRIC_SOCK_DROP);
		return -EHOSTUNREACH;
	}
	return 0;
}

/*
 * sock4_lookup - the master that serves a socket of source @src at
 * frontend <@vip, @port, @proto>, in @svc; or an error to refuse it with.
 * loadBalancerSourceRanges are checked against @src.
 *
 * Returns 1 with @svc set, 0 if no frontend is there (nothing to do), or a
 * negative errno.
 */
static __always_inline int sock4_lookup(__be32 vip, __be16 port, __u8 proto,
					__be32 src, struct sock_explain_ctx *x,
					struct lb4_service **svc)
{
	struct lb4_service *s, *in;

	s = lookup_service(vip, port, proto);
	if (!s)
		return sock4_no_service(vip, x);
	if (x) {
		x->flags |= EXPLAIN_F_FRONTEND;
		x->svc_flags = s->flags;
	}
	if ((s->flags & SVC_F_SRC_RANGES) &&
	    !source_allowed(vip, port, proto, src)) {
		sock_metric(x, METRIC_SOCK_DROP);
		sock_svc_count(x, s->rev_nat_id, SVC_DROP_SOURCE_RANGE);
		return -EHOSTUNREACH;
	}
	if (s->flags & SVC_F_TWO_SCOPES) {
		in = lookup_service_scope(vip, port, proto, LB_SCOPE_INTERNAL);
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
 * sock4_aff_select - aff_select; a dry run notes whether the client's
 * affinity entry decided, or a fresh (random) selection.
 */
static __always_inline struct lb4_backend *
sock4_aff_select(const struct lb4_affinity_key *akey,
		 const struct lb4_service *svc, __u64 now, __u32 *backend_id,
		 __u16 *slot, struct sock_explain_ctx *x)
{
	struct lb4_backend *be;

	if (!x)
		return aff_select(akey, svc, now, backend_id, slot);
	if (svc->flags & SVC_F_AFFINITY) {
		be = aff_lookup(akey, svc, now, backend_id, slot);
		if (be) {
			x->flags |= EXPLAIN_F_AFFINITY_HIT;
			return be;
		}
	}
	be = select_backend_slot(akey->master.vip, akey->master.port,
				 akey->master.proto, svc, backend_id, slot);
	if (be)
		x->flags |= EXPLAIN_F_NEW_FLOW;
	return be;
}

/*
 * select_sticky_backend - the backend an unconnected UDP socket (cookie
 * @cookie) used for this frontend before, while it is still one of the
 * service's backends (slot_still_names; a service that shrinks moves
 * backends down into holes, so a few sockets then select again
 * needlessly); otherwise a fresh selection (aff_select: the client's
 * session affinity first) that the socket then keeps. A datagram that
 * follows the socket's backend is no new "connection": it does not
 * refresh the client's session affinity.
 */
static __always_inline struct lb4_backend *
select_sticky_backend(__u64 cookie, const struct lb4_affinity_key *akey,
		      const struct lb4_service *svc, __u64 now,
		      __u32 *backend_id, __u16 *slot,
		      struct sock_explain_ctx *x)
{
	struct sock_udp_stick_key key = {
		.cookie = cookie,
		.vip = akey->master.vip,
		.port = akey->master.port,
		.proto = akey->master.proto,
	};
	struct sock_udp_stick st = {};
	struct sock_udp_stick *cur;
	struct lb4_backend *be;

	cur = bpf_map_lookup_elem(&sluice_udp_stick_v1, &key);
	if (cur) {
		be = slot_still_names(key.vip, key.port, key.proto, svc,
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
	be = sock4_aff_select(akey, svc, now, &st.backend_id, &st.slot, x);
	if (be) {
		*backend_id = st.backend_id;
		*slot = st.slot;
		if (x)
			return be;
		st.addr = be->addr;
		st.port = be->port;
		bpf_map_update_elem(&sluice_udp_stick_v1, &key, &st, BPF_ANY);
		aff_remember(akey, svc, be, st.backend_id, st.slot, now);
	}
	return be;
}

/*
 * sock4_select - the backend for a socket of source @src (its bound
 * address, or the node's) in network namespace @netns, cookie @cookie,
 * reaching <@vip, @port, @proto>: the frontend's master in @svc, the
 * backend in @be. @sticky: keep the socket's previous backend
 * (per-datagram sendmsg4). @x: a dry run's context (the top), NULL live.
 *
 * The client of session affinity is the socket's network namespace
 * (affinity.h): a connect is a new connection of that client.
 *
 * Returns 1 with @svc and @be set, 0 (not a service: nothing to do),
 * -ECONNREFUSED or -EHOSTUNREACH (sock4_lookup).
 */
static __always_inline int sock4_select(__be32 vip, __be16 port, __u8 proto,
					__be32 src, __u64 netns, __u64 cookie,
					bool sticky, struct sock_explain_ctx *x,
					struct lb4_service **svcp,
					struct lb4_backend **bep)
{
	struct lb4_affinity_key akey = {};
	struct lb4_service *svc = NULL;
	struct lb4_backend *be;
	__u32 backend_id = 0;
	__u16 slot = 0;
	__u64 now;
	int ret;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	ret = sock4_lookup(vip, port, proto, src, x, &svc);
	if (ret <= 0 || !svc)
		return ret;

	now = bpf_ktime_get_ns();
	aff_key(&akey, netns, AFFINITY_CLIENT_NETNS, vip, port, proto,
		svc->scope);
	if (sticky) {
		be = select_sticky_backend(cookie, &akey, svc, now, &backend_id,
					   &slot, x);
	} else {
		be = sock4_aff_select(&akey, svc, now, &backend_id, &slot, x);
		if (be && !x)
			aff_remember(&akey, svc, be, backend_id, slot, now);
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
		x->be_addr = be->addr;
		x->be_port = be->port;
	}
	*svcp = svc;
	*bep = be;
	return 1;
}

#endif /* SLUICE_SOCKLB_H */
