// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Socket-level ClusterIP load balancing (cgroup sock_addr hooks).
 *
 * connect4 and sendmsg4 rewrite a VIP:port destination to a backend before
 * any packet exists, so traffic from this node's sockets needs no per-packet
 * NAT at all. Each translation is remembered in sluice_sock_rev under the
 * socket's cookie and the backend, so that recvmsg4 and getpeername4 can
 * show the VIP again: the application never sees a backend address.
 *
 * The node's sockets are internal clients: a two-scope frontend
 * (externalTrafficPolicy Local) serves them from its internal scope, all
 * of its endpoints (kube-proxy's short-circuit of local traffic). A
 * frontend's loadBalancerSourceRanges apply to them too, checked against
 * the socket's bound address (or, unbound, the node's primary address,
 * the source its route to a LoadBalancer IP usually picks). NodePorts on
 * 127.0.0.1 are frontends like any other, which only this path sees.
 *
 * A frontend with session affinity (lib/affinity.h) sends every socket of
 * a network namespace to the backend that namespace's last connection
 * went to, while it is still one of the frontend's (in the scope that
 * serves the node).
 *
 * What the packet path would reject fails at once with ECONNREFUSED: a
 * service without backends, a ClusterIP on a port it does not serve, and a
 * service whose backend cannot be found even after reading the service
 * again (a connect is never left to the VIP). What the packet path would
 * drop (no backend for this client here, a source outside the ranges, an
 * unallocated address of the service CIDR) fails with EHOSTUNREACH: a
 * socket cannot be made to time out. The errno comes from bpf_set_retval,
 * which sock_addr programs may call only since Linux 6.1 (5.18 gave it to
 * other cgroup hooks). For older kernels each refusing hook has an eperm
 * twin without the call, refusing either way with the kernel's plain
 * EPERM: the agent probes the helper and loads one of the two
 * (pkg/datapath), so the kernel never sees a call it does not know.
 */
#include "lib/consts.h"
#include "lib/config.h"
#include "lib/maps.h"
#include "lib/metrics.h"
#include "lib/svcstats.h"
#include "lib/lb.h"
#include "lib/affinity.h"

#define SYS_REJECT  0
#define SYS_PROCEED 1

/*
 * lookup_sticky_backend - the backend of a UDP socket's stickiness entry,
 * if it is still one of this service's backends (slot_still_names).
 * @master: the service's slot 0.
 *
 * A service that shrinks moves backends down into holes, so a few sockets
 * then select again needlessly: a fresh backend of their own service.
 *
 * Returns the backend, or NULL if the socket must select again.
 */
static __always_inline struct lb4_backend *
lookup_sticky_backend(const struct sock_udp_stick *st, __be32 vip, __be16 port,
		      __u8 proto, const struct lb4_service *master)
{
	return slot_still_names(vip, port, proto, master, st->slot,
				st->backend_id, st->addr, st->port);
}

/*
 * select_sticky_backend - the backend an unconnected UDP socket used for
 * this frontend before, while it is still one of the service's backends
 * (lookup_sticky_backend); otherwise a fresh selection (aff_select: the
 * client's session affinity first) that the socket then keeps. A
 * datagram that follows the socket's backend is no new "connection": it
 * does not refresh the client's session affinity.
 */
static __always_inline struct lb4_backend *
select_sticky_backend(struct bpf_sock_addr *ctx,
		      const struct lb4_affinity_key *akey,
		      const struct lb4_service *svc, __u64 now)
{
	struct sock_udp_stick_key key = {
		.cookie = bpf_get_socket_cookie(ctx),
		.vip = akey->master.vip,
		.port = akey->master.port,
		.proto = akey->master.proto,
	};
	struct sock_udp_stick st = {};
	struct sock_udp_stick *cur;
	struct lb4_backend *be;

	cur = bpf_map_lookup_elem(&sluice_udp_stick_v1, &key);
	if (cur) {
		be = lookup_sticky_backend(cur, key.vip, key.port, key.proto,
					   svc);
		if (be)
			return be;
	}
	be = aff_select(akey, svc, now, &st.backend_id, &st.slot);
	if (be) {
		st.addr = be->addr;
		st.port = be->port;
		bpf_map_update_elem(&sluice_udp_stick_v1, &key, &st, BPF_ANY);
		aff_remember(akey, svc, be, st.backend_id, st.slot, now);
	}
	return be;
}

/*
 * sock4_no_service - the answer to a socket reaching @vip, where no
 * frontend is: -ECONNREFUSED for a ClusterIP (another port or protocol),
 * -EHOSTUNREACH for an unallocated address of the service CIDR, else 0.
 */
static __always_inline int sock4_no_service(__be32 vip)
{
	if (service_ip(vip)) {
		metric_inc(METRIC_SOCK_UNKNOWN_PORT);
		return -ECONNREFUSED;
	}
	if (node_cidr(vip, NODE_CIDR_SERVICE)) {
		metric_inc(METRIC_SOCK_DROP);
		return -EHOSTUNREACH;
	}
	return 0;
}

/*
 * sock4_source_allowed - whether the socket of @ctx may reach frontend
 * <@vip, @port, @proto>, whose master checks loadBalancerSourceRanges: by
 * its bound address, or unbound, the node's primary address.
 */
static __always_inline bool sock4_source_allowed(struct bpf_sock_addr *ctx,
						 __be32 vip, __be16 port,
						 __u8 proto)
{
	struct bpf_sock *sk = ctx->sk;
	__be32 src = 0;

	if (sk)
		src = sk->src_ip4;
	if (!src)
		src = node_ip4;
	return source_allowed(vip, port, proto, src);
}

/*
 * sock4_lookup - the master that serves the socket of @ctx at frontend
 * <@vip, @port, @proto>, in @svc; or an error to refuse it with.
 *
 * Returns 1 with @svc set, 0 if no frontend is there (nothing to do), or a
 * negative errno.
 */
static __always_inline int sock4_lookup(struct bpf_sock_addr *ctx, __be32 vip,
					__be16 port, __u8 proto,
					struct lb4_service **svc)
{
	struct lb4_service *s, *in;

	s = lookup_service(vip, port, proto);
	if (!s)
		return sock4_no_service(vip);
	if ((s->flags & SVC_F_SRC_RANGES) &&
	    !sock4_source_allowed(ctx, vip, port, proto)) {
		metric_inc(METRIC_SOCK_DROP);
		svc_count(s->rev_nat_id, SVC_DROP_SOURCE_RANGE, 0);
		return -EHOSTUNREACH;
	}
	if (s->flags & SVC_F_TWO_SCOPES) {
		in = lookup_service_scope(vip, port, proto, LB_SCOPE_INTERNAL);
		if (in)
			s = in;
	}
	if (s->count == 0) {
		if (s->flags & SVC_F_DROP_EMPTY) {
			metric_inc(METRIC_SOCK_DROP);
			svc_count(s->rev_nat_id, SVC_DROP_NO_LOCAL_ENDPOINTS,
				  0);
			return -EHOSTUNREACH;
		}
		metric_inc(METRIC_SOCK_NO_BACKEND);
		svc_count(s->rev_nat_id, SVC_DROP_NO_ENDPOINTS, 0);
		return -ECONNREFUSED;
	}
	*svc = s;
	return 1;
}

/*
 * sock4_xlate_fwd - rewrite a VIP destination of @ctx to a backend.
 * @sticky: keep the socket's previous backend (per-datagram sendmsg4).
 *
 * The client of session affinity is the socket's network namespace
 * (affinity.h): a connect is a new connection of that client.
 *
 * Returns 0 (translated or not a service), -ECONNREFUSED or -EHOSTUNREACH
 * (sock4_lookup).
 */
static __always_inline int sock4_xlate_fwd(struct bpf_sock_addr *ctx,
					   bool sticky)
{
	__u8 proto = ctx->protocol;
	__be32 vip = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;
	struct lb4_affinity_key akey = {};
	struct lb4_service *svc = NULL;
	struct lb4_backend *be;
	struct sock_rev_key rkey = {};
	struct sock_rev_entry rval = {};
	__u32 backend_id = 0;
	__u16 slot = 0;
	__u64 now;
	int ret;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	ret = sock4_lookup(ctx, vip, port, proto, &svc);
	if (ret <= 0 || !svc)
		return ret;

	now = bpf_ktime_get_ns();
	aff_key(&akey, bpf_get_netns_cookie(ctx), AFFINITY_CLIENT_NETNS, vip,
		port, proto, svc->scope);
	if (sticky) {
		be = select_sticky_backend(ctx, &akey, svc, now);
	} else {
		be = aff_select(&akey, svc, now, &backend_id, &slot);
		if (be)
			aff_remember(&akey, svc, be, backend_id, slot, now);
	}
	if (!be) {
		/* Even after reading the service again (select_backend_slot):
		 * refuse rather than leave the VIP, which nothing answers
		 * (a TCP connect would hang).
		 */
		metric_inc(METRIC_SOCK_BACKEND_MISSING);
		svc_count(svc->rev_nat_id, SVC_DROP_ERROR, 0);
		return -ECONNREFUSED;
	}

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = be->addr;
	rkey.port = be->port;
	rval.vip = vip;
	rval.port = port;
	rval.rev_nat_id = svc->rev_nat_id;
	/* If this fails the socket still works; only its peer name shows
	 * the backend.
	 */
	bpf_map_update_elem(&sluice_sock_rev_v1, &rkey, &rval, BPF_ANY);

	ctx->user_ip4 = be->addr;
	ctx->user_port = (__u32)be->port;
	metric_inc(METRIC_SOCK_XLATE);
	svc_count(svc->rev_nat_id, SVC_EV_FLOW, 0);
	return 0;
}

/* sock4_xlate_rev - show the VIP, not the backend the socket was sent to. */
static __always_inline void sock4_xlate_rev(struct bpf_sock_addr *ctx)
{
	struct sock_rev_key key = {
		.cookie = bpf_get_socket_cookie(ctx),
		.addr = ctx->user_ip4,
		.port = (__be16)ctx->user_port,
	};
	struct sock_rev_entry *e;

	e = bpf_map_lookup_elem(&sluice_sock_rev_v1, &key);
	if (!e)
		return;
	ctx->user_ip4 = e->vip;
	ctx->user_port = (__u32)e->port;
	metric_inc(METRIC_SOCK_REV_XLATE);
}

SEC("cgroup/connect4")
int sluice_connect4(struct bpf_sock_addr *ctx)
{
	int err = sock4_xlate_fwd(ctx, false);

	if (err < 0) {
		bpf_set_retval(err);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

/* sluice_connect4 for kernels before 6.1: a refusal is EPERM. */
SEC("cgroup/connect4")
int sluice_eperm_connect4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_fwd(ctx, false) < 0 ? SYS_REJECT : SYS_PROCEED;
}

SEC("cgroup/sendmsg4")
int sluice_sendmsg4(struct bpf_sock_addr *ctx)
{
	int err = sock4_xlate_fwd(ctx, true);

	if (err < 0) {
		bpf_set_retval(err);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

/* sluice_sendmsg4 for kernels before 6.1: a refusal is EPERM. */
SEC("cgroup/sendmsg4")
int sluice_eperm_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_fwd(ctx, true) < 0 ? SYS_REJECT : SYS_PROCEED;
}

SEC("cgroup/recvmsg4")
int sluice_recvmsg4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername4")
int sluice_getpeername4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx);
	return SYS_PROCEED;
}

char __license[] SEC("license") = "Dual BSD/GPL";
