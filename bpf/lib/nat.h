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
 * resolved yet, which lets the kernel resolve it).
 */
#ifndef SLUICE_NAT_H
#define SLUICE_NAT_H

#include "consts.h"
#include "maps.h"
#include "parse.h"

struct fib4 {
	__u32 ifindex;	/* egress device */
	__be32 nexthop; /* gateway, or the destination itself */
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
	bool have_neigh; /* dmac is valid */
};

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

	if (ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;
	out->ifindex = fib.ifindex;
	out->nexthop = fib.ipv4_dst;
	out->have_neigh = ret == BPF_FIB_LKUP_RET_SUCCESS;
	__builtin_memcpy(out->smac, fib.smac, ETH_ALEN);
	__builtin_memcpy(out->dmac, fib.dmac, ETH_ALEN);
	return 0;
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
 * redirect_fib - send @skb, the packet @p (already rewritten), to the
 * next hop @f names. Returns a TC verdict.
 *
 * A packet from an L3 device has no Ethernet header to write the MACs
 * into: the neighbour subsystem builds the egress device's header
 * (bpf_redirect_neigh). To an L3 device, bpf_redirect drops the Ethernet
 * header itself.
 */
static __always_inline int
redirect_fib(struct __sk_buff *skb, const struct pkt4 *p, const struct fib4 *f)
{
	if (!f->have_neigh || p->l3_off == 0) {
		struct bpf_redir_neigh nh = {
			.nh_family = AF_INET,
			.ipv4_nh = f->nexthop,
		};

		return bpf_redirect_neigh(f->ifindex, &nh, sizeof(nh), 0);
	}
	if (bpf_skb_store_bytes(skb, 0, f->dmac, ETH_ALEN, 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, f->smac, ETH_ALEN, 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(f->ifindex, 0);
}

/*
 * source_allowed - whether @saddr may reach frontend <@vip, @port, @proto>
 * (one of its loadBalancerSourceRanges contains it).
 */
static __always_inline bool source_allowed(__be32 vip, __be16 port, __u8 proto,
					   __be32 saddr)
{
	struct src_range_key key = {
		.prefixlen = 64 + 32,
		.vip = vip,
		.port = port,
		.proto = proto,
		.saddr = saddr,
	};

	return bpf_map_lookup_elem(&sluice_src_ranges_v1, &key) != NULL;
}

#endif /* SLUICE_NAT_H */
