/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * North-south NAT helpers: which node device leads to a backend, and
 * forwarding a rewritten packet straight to its next hop.
 *
 * A packet of an external flow to a remote backend leaves this node with
 * the node's own address as its source (SNAT), and the replies arrive with
 * it as their destination. Handing either to the stack would not work: a
 * packet arriving with a local source address is a martian, and a reply
 * rewritten to the client would be routed like any forwarded packet only
 * if forwarding and rp_filter allowed it. So both are sent on from tc
 * directly: bpf_fib_lookup finds the egress device and next hop, and the
 * packet is redirected there (bpf_redirect_neigh when the neighbour is not
 * resolved yet, which lets the kernel resolve it). The same goes for the
 * reply of an external flow to a local backend when ingress of the pod's
 * device reverse-NATs it: its new source, the NodePort, is the node's own.
 *
 * Forwarding by redirect skips the stack's, so it does the stack's part
 * here (fwd_check, redirect_fib): the TTL is decremented, and a packet
 * whose TTL would expire (a routing loop) or that is larger than the egress
 * device's MTU is never sent: it gets the ICMP error the stack would send
 * (time exceeded; fragmentation needed when DF is set), or is dropped when
 * there is no answer to give (no DF: the stack would fragment it; tc
 * cannot), or, where the stack can take the packet as it came, is handed to
 * it. All counted.
 */
#ifndef SLUICE_NAT_H
#define SLUICE_NAT_H

#include "consts.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "lb.h"
#include "icmp.h"
#include "explain.h"

struct fib4 {
	__u32 ifindex;	/* egress device */
	__be32 nexthop; /* gateway, or the destination itself */
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
	bool have_neigh; /* dmac is valid */
};

/*
 * fib_ret_unusable - whether bpf_fib_lookup's return code @ret leaves no
 * route to forward by (fib4_result, fib6_result in nat6.h). Usable:
 * SUCCESS; NO_NEIGH, the route found but not the next hop's MAC (no
 * have_neigh); FRAG_NEEDED, the route and neighbour found, but the skb is
 * larger than the egress device's MTU: fwd_check decides what to do about
 * that (bpf_check_mtu knows GSO packets too).
 */
static __always_inline bool fib_ret_unusable(int ret)
{
	return ret != BPF_FIB_LKUP_RET_SUCCESS &&
	       ret != BPF_FIB_LKUP_RET_NO_NEIGH &&
	       ret != BPF_FIB_LKUP_RET_FRAG_NEEDED;
}

/*
 * fib4_result - @out from @fib, whose bpf_fib_lookup returned @ret.
 * Returns 0, or -1 if there is no usable route.
 */
static __always_inline int fib4_result(const struct bpf_fib_lookup *fib,
				       int ret, struct fib4 *out)
{
	if (fib_ret_unusable(ret))
		return -1;
	out->ifindex = fib->ifindex;
	out->nexthop = fib->ipv4_dst;
	out->have_neigh = ret != BPF_FIB_LKUP_RET_NO_NEIGH;
	__builtin_memcpy(out->smac, fib->smac, ETH_ALEN);
	__builtin_memcpy(out->dmac, fib->dmac, ETH_ALEN);
	return 0;
}

/*
 * fib4_lookup - route @daddr (from @saddr) as a packet arriving on
 * @ifindex would be routed. Returns 0, or -1 if there is no usable route.
 */
static __always_inline int fib4_lookup(void *ctx, __u32 ifindex, __be32 saddr,
				       __be32 daddr, struct fib4 *out)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET,
		.ipv4_src = saddr,
		.ipv4_dst = daddr,
		.ifindex = ifindex,
	};
	int ret = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);

	return fib4_result(&fib, ret, out);
}

/*
 * node_dev_of - the node device @ifindex, or NULL if it is not one the
 * agent attached to with an address (a pod's veth, say).
 */
static __always_inline struct node_dev *node_dev_of(__u32 ifindex)
{
	struct node_dev *dev =
		bpf_map_lookup_elem(&sluice_devices_v1, &ifindex);

	return dev && dev->addr ? dev : NULL;
}

/*
 * dev_is_port - whether @ifindex is a port of a bridge, bond, team or
 * OVS datapath (NODE_DEV_F_PORT). A reply (or an ICMP error about a
 * request) that came in at one may be bridged to the client's port at
 * layer 2, never passing the master's egress, though a route lookup names the
 * master (rev_at_egress4/6).
 */
static __always_inline bool dev_is_port(__u32 ifindex)
{
	struct node_dev *dev =
		bpf_map_lookup_elem(&sluice_devices_v1, &ifindex);

	return dev && (dev->flags & NODE_DEV_F_PORT);
}

/*
 * dev_has_tc - whether the agent attached tc to @ifindex (with an address
 * or not): what leaves through it comes back through sluice_ingress.
 */
static __always_inline bool dev_has_tc(__u32 ifindex)
{
	struct node_dev *dev =
		bpf_map_lookup_elem(&sluice_devices_v1, &ifindex);

	return dev && (dev->flags & NODE_DEV_F_TC);
}

/*
 * fwd_check - whether @p may be forwarded by redirect to the next hop @f
 * names: its TTL must not expire, and it must fit the egress device's MTU
 * (each segment of a GSO packet). Call it before rewriting @p, so that what
 * goes back or on to the stack is the packet as it came.
 *
 * Returns -1 if it may. Else a TC verdict, counted: with @to_stack,
 * TC_ACT_OK (the stack forwards the packet, or refuses it with the ICMP
 * error, itself; the caller's egress program translates what it forwards);
 * without, an ICMP time exceeded, an ICMP fragmentation needed if DF is
 * set (both from @p's destination), or a drop.
 */
static __always_inline int fwd_check(struct __sk_buff *skb,
				     const struct pkt4 *p, const struct fib4 *f,
				     bool to_stack)
{
	__u64 flags = BPF_MTU_CHK_SEGS;
	__u32 mtu = 0; /* 0: the skb's length, link-layer header included */
	int ret;

	/* From an L3 device, the skb has no link-layer header to count:
	 * check the IPv4 length (and not a GSO packet's segments: the
	 * helper checks those only against the skb's length).
	 */
	if (p->l3_off == 0) {
		mtu = p->l3_len;
		flags = 0;
	}
	if (p->ttl > 1 && !bpf_check_mtu(skb, f->ifindex, &mtu, 0, flags))
		return -1;
	if (to_stack) {
		metric_count(p, METRIC_TC_FWD_TO_STACK);
		return TC_ACT_OK;
	}
	if (p->ttl <= 1) {
		metric_count(p, METRIC_TC_TTL_EXCEEDED);
		ret = icmp_reply(skb, p,
				 ICMP_ERR(ICMP_TIME_EXCEEDED, ICMP_EXC_TTL, 0),
				 false);
	} else if (p->df) {
		metric_count(p, METRIC_TC_FRAG_NEEDED);
		ret = icmp_reply(skb, p,
				 ICMP_ERR(ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED,
					  mtu),
				 false);
	} else {
		metric_count(p, METRIC_TC_MTU_DROP);
		return TC_ACT_SHOT;
	}
	/* (ICMP_NOT_SENT: dropped, counted above as the error it is not) */
	if (ret == TC_ACT_SHOT && !p->frag_later)
		metric_count(p, METRIC_TC_REWRITE_ERR);
	return icmp_verdict(ret);
}

/*
 * redirect_hop - the end of redirect_fib and redirect_fib6 (nat6.h): send
 * @skb, an IPv4 (@v4) or IPv6 packet at @l3_off, out of @ifindex: with
 * the MACs @dmac and @smac (@have_neigh), else through the neighbour
 * subsystem, to the next hop @nexthop. Returns a TC verdict.
 *
 * A packet from an L3 device has no Ethernet header to write the MACs
 * into, and bpf_redirect_neigh, which has the neighbour subsystem build
 * the egress device's header (none for an L3 device), drops a packet
 * without one: it gets an empty one first (bpf_skb_change_head, made for
 * this), which bpf_redirect_neigh takes off again. To an L3 device from
 * an Ethernet one, bpf_redirect drops the Ethernet header itself.
 */
static __always_inline int redirect_hop(struct __sk_buff *skb, __u32 l3_off,
					bool v4, const void *nexthop,
					__u32 ifindex, bool have_neigh,
					const __u8 *dmac, const __u8 *smac)
{
	if (!have_neigh || l3_off == 0) {
		struct bpf_redir_neigh nh = {
			.nh_family = v4 ? AF_INET : AF_INET6,
		};
		__be16 proto = bpf_htons(v4 ? ETH_P_IP : ETH_P_IPV6);

		if (v4)
			nh.ipv4_nh = *(const __be32 *)nexthop;
		else
			__builtin_memcpy(nh.ipv6_nh, nexthop,
					 sizeof(nh.ipv6_nh));
		if (l3_off == 0 &&
		    (bpf_skb_change_head(skb, ETH_HLEN, 0) < 0 ||
		     bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto),
					 &proto, sizeof(proto), 0) < 0))
			return TC_ACT_SHOT;
		return bpf_redirect_neigh(ifindex, &nh, sizeof(nh), 0);
	}
	if (bpf_skb_store_bytes(skb, 0, dmac, ETH_ALEN, 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, smac, ETH_ALEN, 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(ifindex, 0);
}

/*
 * redirect_fib - send @skb, the packet @p (already rewritten, and checked
 * by fwd_check), to the next hop @f names, one TTL less (redirect_hop).
 * Returns a TC verdict.
 */
static __always_inline int
redirect_fib(struct __sk_buff *skb, const struct pkt4 *p, const struct fib4 *f)
{
	__u8 ttl = p->ttl - 1;

	/* The TTL is the high byte of the 16-bit word it shares with the
	 * protocol, which the checksum difference leaves out.
	 */
	if (bpf_l3_csum_replace(skb, p->l3_off + IP_CSUM_OFF,
				bpf_htons((__u16)p->ttl << 8),
				bpf_htons((__u16)ttl << 8), 2) < 0 ||
	    bpf_skb_store_bytes(skb, p->l3_off + offsetof(struct iphdr, ttl),
				&ttl, 1, 0) < 0)
		return TC_ACT_SHOT;
	return redirect_hop(skb, p->l3_off, true, &f->nexthop, f->ifindex,
			    f->have_neigh, f->dmac, f->smac);
}

/*
 * fe_external - whether <@addr, @port, @proto> is an external frontend
 * (NodePort, ExternalIP, LoadBalancer), whose address may be the node's.
 */
static __always_inline bool fe_external(__be32 addr, __be16 port, __u8 proto)
{
	struct lb4_service *svc = lookup_service(addr, port, proto);

	return svc && (svc->flags & SVC_F_EXTERNAL);
}

/*
 * xdp_fwd_ok - whether XDP may send its frame, whose TTL (or IPv6 hop
 * limit) is @ttl, out of *@ifindex itself: not through an overlay tunnel
 * (NODE_DEV_F_TUNNEL, which has no ndo_xdp_xmit: left to tc, uncounted),
 * the TTL must not expire and the frame must fit the egress MTU. Otherwise
 * it is left to tc (counted), which answers it as fwd_check (fwd_check6)
 * says. @ifindex points into the caller's route, the key of the device
 * lookup: a copy on the stack would take room the verifier's 512 bytes do
 * not leave.
 */
/*
 * dev_tunnel_maybe - whether sluice_devices_v1 may hold a device flagged
 * NODE_DEV_F_TUNNEL: 0 once the agent has seen it hold none, so that
 * xdp_fwd_ok costs no device lookup on a node without an overlay tunnel
 * among its devices. As dev_l3_maybe (parse.h): in .data, 1 until the
 * agent writes it, set before a tunnel's entry is written and cleared only
 * once none is left (devices.go). Only xdp.c defines it (the one object
 * calling xdp_fwd_ok).
 */
extern volatile __u8 dev_tunnel_maybe;

static __always_inline bool xdp_fwd_ok(struct xdp_md *ctx, __u8 ttl,
				       const __u32 *ifindex)
{
	__u32 mtu = 0; /* 0: check the frame's length */

	if (dev_tunnel_maybe) {
		struct node_dev *dev =
			bpf_map_lookup_elem(&sluice_devices_v1, ifindex);

		if (dev && (dev->flags & NODE_DEV_F_TUNNEL))
			return false;
	}
	if (ttl <= 1) {
		metric_inc(METRIC_XDP_TTL_EXCEEDED);
		return false;
	}
	if (bpf_check_mtu(ctx, *ifindex, &mtu, 0, 0)) {
		metric_inc(METRIC_XDP_MTU_EXCEEDED);
		return false;
	}
	return true;
}

#endif /* SLUICE_NAT_H */
