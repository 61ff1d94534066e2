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
#include "family.h"

/*
 * host_netns_cookie - --socket-lb-host-netns-only: the cookie of the
 * agent's network namespace (the host's, SO_NETNS_COOKIE), the one whose
 * sockets alone the forward hooks translate; 0 (the default): every
 * namespace's, each pod's too. Set before load (pkg/datapath hostns.go).
 *
 * kube-proxy translates in the host's namespace only (its prerouting and
 * output hooks), after whatever a pod does to its own traffic: an Istio
 * sidecar's REDIRECT must see the ClusterIP, and a cluster nested in a pod
 * (kind) its own ClusterIPs, which the outer cluster's Services would
 * otherwise capture. With it set, a pod's socket reaches the VIP
 * untranslated and its packets are translated where tc runs (the pod's
 * host-side device, a bridge), as kube-proxy's would be. Here, not in
 * config.h: only sock.c's programs read it.
 */
volatile const __u64 host_netns_cookie = 0;

/*
 * sock_netns_served - whether the forward hooks translate the socket of
 * @ctx: every socket, or with host_netns_cookie set, the host's only.
 * Unset, the verifier knows the constant and removes the cookie read.
 *
 * Only connect and sendmsg ask. The reverse hooks and sock_release need
 * not: their entries are keyed by the socket's cookie, which only a
 * translated socket has, so what was not translated is never shown as a
 * VIP; and a pod's socket an earlier agent (without the option)
 * translated keeps its VIP as peer and is forgotten at release.
 */
static __always_inline bool sock_netns_served(void *ctx)
{
	return !host_netns_cookie ||
	       bpf_get_netns_cookie(ctx) == host_netns_cookie;
}

/*
 * agent_netns_cookie - the cookie of the agent's network namespace (the
 * host's, SO_NETNS_COOKIE), set whatever --socket-lb-host-netns-only
 * says (pkg/datapath hostns.go): the namespace whose sockets are the
 * node's. 0 (an agent that did not set it): every socket is taken for
 * the node's, as before it was.
 *
 * It decides the scope of a two-scope frontend (externalTrafficPolicy
 * Local: NodePort, ExternalIP, LoadBalancer IP) for a socket, as
 * kube-proxy's per-packet rule does (nftables proxier.go, the external
 * chain): the node's own traffic always goes to every endpoint (the
 * internal scope); a pod's only when a local traffic detector is set
 * (--cluster-cidr, or --detect-local-mode NodeCIDR: the family's
 * have_cluster_cidr), which at the socket, before the pod's source is
 * chosen, is taken to hold it; without one a pod's goes to this node's
 * endpoints only, dropped if there are none, as tc does (lib/tc_fam.h).
 */
volatile const __u64 agent_netns_cookie = 0;

/*
 * sock_internal_client - whether the socket of @ctx (a dry run's: the
 * client namespace of @x) is served by a two-scope frontend's internal
 * scope: @detector (the family's have_cluster_cidr), or the socket is in
 * the agent's namespace. Only a two-scope frontend asks, and with a
 * detector the verifier knows the constant and removes the cookie read.
 */
static __always_inline bool
sock_internal_client(void *ctx, const struct sock_explain_ctx *x, bool detector)
{
	__u64 netns;

	if (detector || !agent_netns_cookie)
		return true;
	netns = x ? x->netns_cookie : bpf_get_netns_cookie(ctx);
	return netns == agent_netns_cookie;
}

/*
 * sock_loopback_served - whether a socket (@ctx, a dry run's: the client
 * namespace of @x) reaching a loopback destination (127.0.0.0/8) is
 * served: the node's (agent_netns_cookie) only, as kube-proxy serves
 * localhost NodePorts (--localhost-nodeports) in the host's namespace
 * only (iptables mode's route_localnet, its nat OUTPUT rules): a pod's
 * loopback is its own. Were a pod's served, any tenant who creates a
 * NodePort Service would take over every pod's 127.0.0.1:<nodePort> (a
 * sidecar, a local agent listening there) for its own backends. A pod's
 * socket is left alone: it reaches whatever listens in the pod, or is
 * refused there, as without Sluice; nothing is counted (no frontend).
 * Without agent_netns_cookie (0) every socket is the node's, as before.
 *
 * Only a loopback destination asks (addr_loopback_4, family.h), so no other
 * connect reads the cookie. ::1 never serves NodePorts (kube-proxy's
 * never do: the agent writes no frontend there, cmd/sluice nodecfg.go),
 * so IPv6 asks nothing (addr_loopback_6); an IPv4-mapped 127.0.0.1 is
 * the IPv4 path's and asks.
 */
static __always_inline bool
sock_loopback_served(void *ctx, const struct sock_explain_ctx *x)
{
	__u64 netns;

	if (!agent_netns_cookie)
		return true;
	netns = x ? x->netns_cookie : bpf_get_netns_cookie(ctx);
	return netns == agent_netns_cookie;
}

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

/* What differs between the families beyond family.h's types. */
#define sock_have_detector_4	 have_cluster_cidr
#define sock_have_detector_6	 have_cluster_cidr6
#define netns_client_4(netns)	 (netns)
#define netns_client_6(netns)	 netns_client6(netns)
#define explain_be_addr_4(x, be) ((x)->be_addr = (be)->addr)
#define explain_be_addr_6(x, be) ((x)->be_addr6 = (be)->addr)

/* netns_client6 - an IPv6 affinity key's client for netns cookie @netns:
 * the cookie in the first 8 bytes (host order), the rest zero.
 */
static __always_inline union v6addr netns_client6(__u64 netns)
{
	union v6addr c = {};

	__builtin_memcpy(&c, &netns, sizeof(netns));
	return c;
}

#define LB_FAMILY 4
#include "socklb_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "socklb_fam.h"
#undef LB_FAMILY
#endif /* SLUICE_SOCKLB_H */
