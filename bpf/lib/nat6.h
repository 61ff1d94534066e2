/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The IPv6 twins of nat.h's north-south helpers, for tc6.h: which node
 * device leads to a backend (sluice6_devices_v1 holds their IPv6
 * addresses), and forwarding a rewritten packet straight to its next hop,
 * for the reasons nat.h gives (a packet with the node's own source is a
 * martian to the stack).
 *
 * Forwarding by redirect does the stack's part, as nat.h's does: the hop
 * limit is decremented (IPv6 has no header checksum, and the L4
 * pseudo-header leaves it out), and a packet whose hop limit would expire
 * or that is larger than the egress device's MTU is never sent: it gets
 * the ICMPv6 error the stack would send (time exceeded, hop limit; packet
 * too big, whatever the packet: IPv6 routers never fragment), or, where
 * the stack can take the packet as it came, is handed to it. All counted.
 */
#ifndef SLUICE_NAT6_H
#define SLUICE_NAT6_H

#include "consts.h"
#include "config.h"
#include "maps.h"
#include "metrics.h"
#include "parse6.h"
#include "icmp6.h"
#include "nat.h"
#include "explain.h"

#ifndef AF_INET6
#define AF_INET6 10
#endif

struct fib6 {
	__u32 ifindex;	      /* egress device */
	union v6addr nexthop; /* gateway, or the destination itself */
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
	bool have_neigh; /* dmac is valid */
};

/* fib6_result - fib4_result (nat.h) for IPv6. */
static __always_inline int fib6_result(const struct bpf_fib_lookup *fib,
				       int ret, struct fib6 *out)
{
	if (fib_ret_unusable(ret))
		return -1;
	out->ifindex = fib->ifindex;
	__builtin_memcpy(&out->nexthop, fib->ipv6_dst, sizeof(out->nexthop));
	out->have_neigh = ret != BPF_FIB_LKUP_RET_NO_NEIGH;
	__builtin_memcpy(out->smac, fib->smac, ETH_ALEN);
	__builtin_memcpy(out->dmac, fib->dmac, ETH_ALEN);
	return 0;
}

/*
 * fib6_lookup - route @daddr (from @saddr) as a packet arriving on
 * @ifindex would be routed (@ctx: the program's, tc's or XDP's). Returns
 * 0, or -1 if there is no usable route. A BPF function of its own: the
 * lookup's parameters (64 bytes) live in its frame, not in its callers'
 * (tc6.h, xdp.c).
 */
static __noinline int fib6_lookup(void *ctx, __u32 ifindex,
				  const union v6addr *saddr,
				  const union v6addr *daddr, struct fib6 *out)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET6,
		.ifindex = ifindex,
	};
	int ret;

	__builtin_memcpy(fib.ipv6_src, saddr, sizeof(*saddr));
	__builtin_memcpy(fib.ipv6_dst, daddr, sizeof(*daddr));
	ret = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	return fib6_result(&fib, ret, out);
}

/*
 * node6_dev_of - the IPv6 address of node device @ifindex, or NULL if it
 * is not one the agent attached to with a global IPv6 address.
 */
static __always_inline union v6addr *node6_dev_of(__u32 ifindex)
{
	return bpf_map_lookup_elem(&sluice6_devices_v1, &ifindex);
}

/* node_ip6_of - node_ip6 into @out; returns whether it is set. */
static __always_inline bool node_ip6_of(union v6addr *out)
{
	out->p[0] = node_ip6.p[0];
	out->p[1] = node_ip6.p[1];
	out->p[2] = node_ip6.p[2];
	out->p[3] = node_ip6.p[3];
	return (out->p[0] | out->p[1] | out->p[2] | out->p[3]) != 0;
}

/*
 * The ICMPv6 error fwd_check6 asks for, as a verdict of its own that the
 * program's entry answers (tc6_answer), where icmp6_build's large frame
 * is the only one on top of the entry's: from deeper in, the frames would
 * not fit the stack together.
 */
#define TC6_ICMP_TIME_EXCEEDED (-2)
#define TC6_ICMP_TOO_BIG       (-3)

/*
 * fwd_check6 - fwd_check (nat.h) for IPv6: whether @p may be forwarded by
 * redirect to the next hop @f names. Call it before rewriting @p. Returns
 * -1 if it may. Else: with @to_stack, TC_ACT_OK (the stack forwards or
 * refuses the packet itself); without, TC6_ICMP_TIME_EXCEEDED or
 * TC6_ICMP_TOO_BIG (the MTU in @mtu), counted.
 */
static __always_inline int fwd_check6(struct __sk_buff *skb,
				      const struct pkt6 *p,
				      const struct fib6 *f, bool to_stack,
				      __u32 *mtu)
{
	__u64 flags = BPF_MTU_CHK_SEGS;

	*mtu = 0; /* 0: the skb's length, link-layer header included */
	/* From an L3 device: see fwd_check. */
	if (p->l3_off == 0) {
		*mtu = p->l3_len;
		flags = 0;
	}
	if (p->hop_limit > 1 && !bpf_check_mtu(skb, f->ifindex, mtu, 0, flags))
		return -1;
	if (to_stack) {
		metric_count(p, METRIC_TC_FWD_TO_STACK);
		return TC_ACT_OK;
	}
	if (p->hop_limit <= 1) {
		metric_count(p, METRIC_TC_TTL_EXCEEDED);
		return TC6_ICMP_TIME_EXCEEDED;
	}
	metric_count(p, METRIC_TC_FRAG_NEEDED);
	return TC6_ICMP_TOO_BIG;
}

/*
 * tc6_answer - the TC verdict for @ret, a verdict or one of fwd_check6's
 * ICMPv6 errors about @p (MTU @mtu), which it sends from @p's
 * destination.
 */
static __always_inline int tc6_answer(struct __sk_buff *skb,
				      const struct pkt6 *p, int ret, __u32 mtu)
{
	if (ret == TC6_ICMP_TIME_EXCEEDED)
		ret = icmp6_reply(skb, p, ICMPV6_TIME_EXCEED,
				  ICMPV6_EXC_HOPLIMIT, 0, false);
	else if (ret == TC6_ICMP_TOO_BIG)
		ret = icmp6_reply(skb, p, ICMPV6_PKT_TOOBIG, 0, bpf_htonl(mtu),
				  false);
	else
		return ret;
	/* (ICMP_NOT_SENT: dropped, counted above as the error it is not) */
	if (ret == TC_ACT_SHOT && !p->frag_later)
		metric_count(p, METRIC_TC_REWRITE_ERR);
	return icmp_verdict(ret);
}

/*
 * redirect_fib6 - send @skb, the packet @p (already rewritten, and checked
 * by fwd_check6), to the next hop @f names, one hop less (redirect_hop,
 * nat.h). Returns a TC verdict.
 */
static __always_inline int
redirect_fib6(struct __sk_buff *skb, const struct pkt6 *p, const struct fib6 *f)
{
	__u8 hops = p->hop_limit - 1;

	if (bpf_skb_store_bytes(skb,
				p->l3_off + offsetof(struct ipv6hdr, hop_limit),
				&hops, 1, 0) < 0)
		return TC_ACT_SHOT;
	return redirect_hop(skb, p->l3_off, false, &f->nexthop, f->ifindex,
			    f->have_neigh, f->dmac, f->smac);
}

#endif /* SLUICE_NAT6_H */
