// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Socket-level ClusterIP load balancing (cgroup sock_addr hooks).
 *
 * connect4 and sendmsg4 rewrite a VIP:port destination to a backend before
 * any packet exists, so traffic from this node's sockets needs no per-packet
 * NAT at all. Each translation is remembered in sluice_sock_rev under the
 * socket's cookie and the backend, so that recvmsg4 and getpeername4 can
 * show the VIP again: the application never sees a backend address. The
 * cgroup's sock_release hook forgets it when the socket is closed, so the
 * map holds the live sockets' translations, not every closed one's.
 *
 * The node's sockets are internal clients: a two-scope frontend
 * (externalTrafficPolicy Local) serves them from its internal scope, all
 * of its endpoints (kube-proxy's short-circuit of local traffic); a pod's
 * socket (another network namespace) only with a local traffic detector
 * (agent_netns_cookie, lib/socklb.h). A frontend's
 * loadBalancerSourceRanges apply to them too, checked against the
 * socket's bound address (or, unbound, the node's primary address, the
 * source its route to a LoadBalancer IP usually picks; a pod's own
 * address, chosen after connect, is not known here: README). NodePorts on
 * 127.0.0.1, which only this path serves (tc drops a packet from a
 * device other than lo to or from 127.0.0.0/8: tc.c, tc_loopback_martian;
 * XDP passes it to tc), are frontends for
 * the node's sockets only, as kube-proxy's: a pod's loopback is its own
 * (sock_loopback_served, lib/socklb.h).
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
 *
 * With --socket-lb-host-netns-only (host_netns_cookie, lib/socklb.h)
 * connect and sendmsg translate the host's sockets only, as kube-proxy
 * does: a pod's reach the VIP, for tc to translate per packet.
 *
 * IPv6 sockets have the same hooks (connect6 ... getpeername6), over the
 * sluice6_* maps, with the same code (lib/socklb_fam.h); an unbound one's
 * source is the node's primary IPv6 address (node_ip6).
 */
#include "lib/consts.h"
#include "lib/config.h"
#include "lib/maps.h"
#include "lib/metrics.h"
#include "lib/svcstats.h"
#include "lib/lb.h"
#include "lib/affinity.h"
#include "lib/socklb.h"

#define SYS_REJECT  0
#define SYS_PROCEED 1

/* sock4_src - the source of the socket of @ctx: its bound address, or
 * unbound, the node's primary address (the top).
 */
static __always_inline __be32 sock4_src(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	__be32 src = 0;

	if (sk)
		src = sk->src_ip4;
	if (!src)
		src = node_ip4;
	return src;
}

/*
 * sock4_ctx_fwd - rewrite a VIP destination of @ctx to a backend
 * (sock4_xlate_fwd of lib/socklb_fam.h).
 * @sticky: keep the socket's previous backend (per-datagram sendmsg4).
 *
 * Returns 0 (translated or not a service), -ECONNREFUSED or -EHOSTUNREACH
 * (sock4_lookup).
 */
static __always_inline int sock4_ctx_fwd(struct bpf_sock_addr *ctx, bool sticky)
{
	__u8 proto = ctx->protocol;
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;
	int ret;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	ret = sock4_xlate_fwd(ctx, &addr, &port, proto, sock4_src(ctx), sticky);
	if (ret <= 0)
		return ret;
	ctx->user_ip4 = addr;
	ctx->user_port = (__u32)port;
	return 0;
}

/* sock4_ctx_rev - show the VIP, not the backend the socket was sent to. */
static __always_inline void sock4_ctx_rev(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;

	if (!sock4_xlate_rev(ctx, &addr, &port))
		return;
	ctx->user_ip4 = addr;
	ctx->user_port = (__u32)port;
}

/*
 * The IPv6 hooks. A destination of the socket's own family goes through
 * the IPv6 maps; an IPv4-mapped one (::ffff:a.b.c.d, a dual-stack socket
 * reaching an IPv4 address) is an IPv4 destination and goes through the
 * IPv4 maps and sluice_sock_rev_v1, the backend written back IPv4-mapped
 * (Cilium's sock6_xlate_v4_in_v6): the service is the same whichever
 * family of socket reaches it.
 */

/* sock6_ctx_addr - the address of @ctx (user_ip6, read word by word). */
static __always_inline union v6addr sock6_ctx_addr(struct bpf_sock_addr *ctx)
{
	union v6addr a;

	a.p[0] = ctx->user_ip6[0];
	a.p[1] = ctx->user_ip6[1];
	a.p[2] = ctx->user_ip6[2];
	a.p[3] = ctx->user_ip6[3];
	return a;
}

static __always_inline void sock6_ctx_set(struct bpf_sock_addr *ctx,
					  const union v6addr *a, __be16 port)
{
	ctx->user_ip6[0] = a->p[0];
	ctx->user_ip6[1] = a->p[1];
	ctx->user_ip6[2] = a->p[2];
	ctx->user_ip6[3] = a->p[3];
	ctx->user_port = (__u32)port;
}

/* sock6_src_or_node - @src, or if it is unset (::), node_ip6. */
static __always_inline union v6addr sock6_src_or_node(union v6addr src)
{
	if (!(src.p[0] | src.p[1] | src.p[2] | src.p[3])) {
		src.p[0] = node_ip6.p[0];
		src.p[1] = node_ip6.p[1];
		src.p[2] = node_ip6.p[2];
		src.p[3] = node_ip6.p[3];
	}
	return src;
}

/* sock6_src - sock4_src for an IPv6 socket: its bound address, or
 * unbound, the node's primary IPv6 address (node_ip6).
 */
static __always_inline union v6addr sock6_src(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	union v6addr src = {};

	if (sk) {
		src.p[0] = sk->src_ip6[0];
		src.p[1] = sk->src_ip6[1];
		src.p[2] = sk->src_ip6[2];
		src.p[3] = sk->src_ip6[3];
	}
	return sock6_src_or_node(src);
}

/* sock6_ctx_fwd - sock4_ctx_fwd for connect6 and sendmsg6. */
static __always_inline int sock6_ctx_fwd(struct bpf_sock_addr *ctx, bool sticky)
{
	__u8 proto = ctx->protocol;
	union v6addr addr = sock6_ctx_addr(ctx);
	__be16 port = (__be16)ctx->user_port;
	int ret;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	if (lb6_v4_mapped(&addr))
		ret = sock4_xlate_fwd(ctx, &addr.p[3], &port, proto,
				      sock4_src(ctx), sticky);
	else
		ret = sock6_xlate_fwd(ctx, &addr, &port, proto, sock6_src(ctx),
				      sticky);
	if (ret <= 0)
		return ret;
	sock6_ctx_set(ctx, &addr, port);
	return 0;
}

/* sock6_ctx_rev - sock4_ctx_rev for recvmsg6 and getpeername6. */
static __always_inline void sock6_ctx_rev(struct bpf_sock_addr *ctx)
{
	union v6addr addr = sock6_ctx_addr(ctx);
	__be16 port = (__be16)ctx->user_port;
	bool found;

	if (lb6_v4_mapped(&addr))
		found = sock4_xlate_rev(ctx, &addr.p[3], &port);
	else
		found = sock6_xlate_rev(ctx, &addr, &port);
	if (found)
		sock6_ctx_set(ctx, &addr, port);
}

/*
 * sock_verdict - a forward hook's verdict after sock4_ctx_fwd or
 * sock6_ctx_fwd returned @err: a refusal carries its errno
 * (bpf_set_retval, 6.1).
 */
static __always_inline int sock_verdict(int err)
{
	if (err < 0) {
		bpf_set_retval(err);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

/*
 * SOCK_FWD_PROGS - the programs of the forward hook @hook (connect4,
 * sendmsg6, ...), over @fwd (sock4_ctx_fwd or sock6_ctx_fwd) with
 * @sticky: sluice_<hook>, and sluice_eperm_<hook> for kernels before 6.1,
 * where a refusal is EPERM. A socket of a namespace not served
 * (sock_netns_served) proceeds untouched, first of all.
 */
#define SOCK_FWD_PROGS(hook, fwd, sticky)                                 \
	SEC("cgroup/" #hook) int sluice_##hook(struct bpf_sock_addr *ctx) \
	{                                                                 \
		if (!sock_netns_served(ctx))                              \
			return SYS_PROCEED;                               \
		return sock_verdict(fwd(ctx, sticky));                    \
	}                                                                 \
	SEC("cgroup/" #hook)                                              \
	int sluice_eperm_##hook(struct bpf_sock_addr *ctx)                \
	{                                                                 \
		if (!sock_netns_served(ctx))                              \
			return SYS_PROCEED;                               \
		return fwd(ctx, sticky) < 0 ? SYS_REJECT : SYS_PROCEED;   \
	}

/* SOCK_REV_PROG - the program of the reverse hook @hook, over @rev. */
#define SOCK_REV_PROG(hook, rev)                                          \
	SEC("cgroup/" #hook) int sluice_##hook(struct bpf_sock_addr *ctx) \
	{                                                                 \
		rev(ctx);                                                 \
		return SYS_PROCEED;                                       \
	}

SOCK_FWD_PROGS(connect4, sock4_ctx_fwd, false)
SOCK_FWD_PROGS(sendmsg4, sock4_ctx_fwd, true)
SOCK_REV_PROG(recvmsg4, sock4_ctx_rev)
SOCK_REV_PROG(getpeername4, sock4_ctx_rev)
SOCK_FWD_PROGS(connect6, sock6_ctx_fwd, false)
SOCK_FWD_PROGS(sendmsg6, sock6_ctx_fwd, true)
SOCK_REV_PROG(recvmsg6, sock6_ctx_rev)
SOCK_REV_PROG(getpeername6, sock6_ctx_rev)

/*
 * sluice_sock_release - a socket of the cgroup is released (its last
 * descriptor closed): forget the translation connect4 (connect6) wrote
 * for its peer, under its cookie and the peer's address.
 *
 * Without it sluice_sock_rev_v1 (sluice6_sock_rev_v1) keeps every closed
 * socket's entry until the LRU evicts it: once the map is full (a
 * connection a second fills the default 262,144 in three days, a busy
 * node in minutes), every connect's insert first evicts, walking the
 * LRU's lists of cold entries (connect4 1.2 us a run with the map fresh,
 * 2.2 as it filled, in issue 14's seventieth pass), and a long-lived
 * socket's entry, if nothing reads it, is evicted by newer ones: its
 * getpeername then shows the backend. With it the map holds the live sockets'
 * entries. A socket never connected (no peer: an unconnected UDP socket's
 * per-datagram entries stay with the LRU) changes nothing; one connected but
 * never translated costs a missed delete. Always proceeds.
 */
SEC("cgroup/sock_release")
int sluice_sock_release(struct bpf_sock *ctx)
{
	__u32 proto = ctx->protocol;
	__be16 port = ctx->dst_port;
	union v6addr addr;

	if ((proto != IPPROTO_TCP && proto != IPPROTO_UDP) || !port)
		return SYS_PROCEED;
	if (ctx->family == AF_INET) {
		if (ctx->dst_ip4)
			sock4_xlate_forget(bpf_get_socket_cookie(ctx),
					   ctx->dst_ip4, port);
		return SYS_PROCEED;
	}
	if (ctx->family != AF_INET6)
		return SYS_PROCEED;
	addr.p[0] = ctx->dst_ip6[0];
	addr.p[1] = ctx->dst_ip6[1];
	addr.p[2] = ctx->dst_ip6[2];
	addr.p[3] = ctx->dst_ip6[3];
	if (lb6_v4_mapped(&addr))
		sock4_xlate_forget(bpf_get_socket_cookie(ctx), addr.p[3], port);
	else
		sock6_xlate_forget(bpf_get_socket_cookie(ctx), addr, port);
	return SYS_PROCEED;
}

/*
 * sluice_sockx_v1: __u32 0 -> struct sock_explain_ctx, per CPU: the
 * record of sluice_sock_explain. Not pinned, and not in maps.h: only the
 * load of sluicectl's own copy of the program creates it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sock_explain_ctx);
} sluice_sockx_v1 SEC(".maps");

/* sock_explain_addr6 - the IPv6 address in two arguments, as memory. */
static __always_inline union v6addr sock_explain_addr6(__u64 lo, __u64 hi)
{
	union v6addr a;

	__builtin_memcpy(&a.addr[0], &lo, sizeof(lo));
	__builtin_memcpy(&a.addr[8], &hi, sizeof(hi));
	return a;
}

/*
 * sluice_sock_explain - what connect4 (or, sticky, sendmsg4) would do for
 * a socket: the same selection (sock4_select), in its dry-run mode, which
 * writes nothing but this CPU's record in sluice_sockx_v1. For an IPv6
 * socket, connect6's (sendmsg6's): sock6_select over the IPv6 maps, or
 * for an IPv4-mapped destination sock4_select over the IPv4 ones, as
 * sock6_ctx_fwd chooses.
 *
 * BPF_PROG_TEST_RUN cannot run a cgroup sock_addr program, nor a syscall
 * program that reads an LPM trie (sluice_src_ranges_v1,
 * sluice_node_cidrs_v1): syscall programs are sleepable, and the verifier
 * (check_map_prog_compatibility) gives sleepable programs array, hash,
 * ringbuf and storage maps only, up to 6.18 at least. A raw tracepoint
 * program can be test-run with its arguments as context and reads any
 * map; it is attached to nothing. The agent never loads it: sluicectl
 * loads it from its own copy of this object against the pinned maps and
 * runs it once (pkg/datapath/sockexplain.go), so its node_ip4 is that
 * load's: the caller gives the source.
 *
 * Arguments (host order unless said): 0 the client's netns cookie, 1 the
 * socket cookie (0: a new socket), 2 the source (low 32 bits) and the
 * destination address (high), network order, 3 the destination port
 * (network order, bits 0-15), the protocol (16-23), sticky (24-31) and
 * an IPv6 socket (32-39), 4-5 the IPv6 source and 6-7 the IPv6
 * destination (their 16 bytes as memory; an IPv4-mapped destination's
 * source is argument 2's).
 */
SEC("raw_tp")
int sluice_sock_explain(struct bpf_raw_tracepoint_args *ctx)
{
	struct lb4_service *svc = NULL;
	struct lb4_backend *be = NULL;
	struct lb6_backend *be6 = NULL;
	struct sock_explain_ctx *x;
	__u32 zero = 0;
	__u64 addrs, rest;
	int ret;

	x = bpf_map_lookup_elem(&sluice_sockx_v1, &zero);
	if (!x)
		return 0;
	__builtin_memset(x, 0, sizeof(*x));
	addrs = ctx->args[2];
	rest = ctx->args[3];
	x->netns_cookie = ctx->args[0];
	x->sock_cookie = ctx->args[1];
	x->src = (__be32)addrs;
	x->vip = (__be32)(addrs >> 32);
	x->port = (__be16)rest;
	x->proto = (__u8)(rest >> 16);
	x->sticky = (__u8)(rest >> 24);
	x->v6 = (__u8)(rest >> 32);
	x->flags = EXPLAIN_F_DRY;
	if (x->v6) {
		x->src6 = sock_explain_addr6(ctx->args[4], ctx->args[5]);
		x->vip6 = sock_explain_addr6(ctx->args[6], ctx->args[7]);
		if (lb6_v4_mapped(&x->vip6))
			x->vip = x->vip6.p[3];
	}
	if (x->v6 && !x->vip) {
		x->src6 = sock6_src_or_node(x->src6);
		ret = sock6_select(x->vip6, x->port, x->proto, x->src6, NULL,
				   x->sticky != 0, x, &svc, &be6);
	} else {
		if (!x->src)
			x->src = node_ip4;
		ret = sock4_select(x->vip, x->port, x->proto, x->src, NULL,
				   x->sticky != 0, x, &svc, &be);
	}
	if (ret < 0)
		x->err = ret;
	else if (ret > 0)
		x->reason = METRIC_SOCK_XLATE;
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
