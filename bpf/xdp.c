// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * XDP fast path for north-south flows to remote backends.
 *
 * On the node's devices, before any skb exists: a packet of a NodePort,
 * ExternalIP or LoadBalancer flow whose backend is on another node is
 * DNATed and SNATed (the same conntrack entries and SNAT port reservation
 * as the tc path, see ct_create_snat), and a reply of such a flow is
 * rewritten back to <frontend -> client>; both are sent straight to their
 * next hop (bpf_fib_lookup, then XDP_TX out of the same device or
 * bpf_redirect to another). Everything else, and anything this path cannot
 * finish (IP options, fragments, an unresolved neighbour, a local backend,
 * a full table), is XDP_PASSed untouched to the tc program, which handles
 * every case; the two share sluice_conntrack, so a flow may start in tc and
 * continue here. XDP counts its outcomes under reasons of its own
 * (METRIC_XDP_*), so that a counter names the hook that saw the packet.
 *
 * Checksums are updated incrementally (RFC 1624). Packets from the wire
 * carry complete checksums; a packet a local stack handed over a veth with
 * CHECKSUM_PARTIAL would not, which is why Sluice attaches XDP only to the
 * node's external devices.
 *
 * Session affinity (affinity.h) is followed and kept as tc does; a new
 * flow passed to tc (its backend is local, say) is left for tc to
 * remember.
 */
#include "lib/consts.h"
#include "lib/config.h"
#include "lib/maps.h"
#include "lib/metrics.h"
#include "lib/svcstats.h"
#include "lib/parse.h"
#include "lib/csum.h"
#include "lib/lb.h"
#include "lib/affinity.h"
#include "lib/conntrack.h"
#include "lib/nat.h"

/*
 * xdp_rewrite - set both L4 addresses of @x and decrement its TTL, fixing
 * the checksums.
 */
static __always_inline void xdp_rewrite(struct xdp_pkt4 *x, __be32 saddr,
					__be16 sport, __be32 daddr,
					__be16 dport)
{
	struct iphdr *ip = x->ip;
	__u16 c = *x->l4csum;

	/* Forwarded: one TTL less (xdp_fwd_ok checked it is over 1). The
	 * TTL is the high byte of its 16-bit word.
	 */
	ip->check = csum_replace16(ip->check, bpf_htons((__u16)ip->ttl << 8),
				   bpf_htons((__u16)(ip->ttl - 1) << 8));
	ip->ttl--;
	ip->check = csum_replace32(csum_replace32(ip->check, ip->saddr, saddr),
				   ip->daddr, daddr);
	/* A UDP checksum of zero means none: it stays zero. */
	if (!(x->p.proto == IPPROTO_UDP && c == 0)) {
		c = csum_replace32(c, ip->saddr, saddr);
		c = csum_replace32(c, ip->daddr, daddr);
		c = csum_replace16(c, x->ports[0], sport);
		c = csum_replace16(c, x->ports[1], dport);
		if (x->p.proto == IPPROTO_UDP && c == 0)
			c = 0xffff;
		*x->l4csum = c;
	}
	ip->saddr = saddr;
	ip->daddr = daddr;
	x->ports[0] = sport;
	x->ports[1] = dport;
}

/*
 * xdp_send - send the rewritten packet to the next hop @f names: XDP_TX
 * if that is out of the device it came in on, else a redirect. Returns -1
 * if the neighbour is not resolved (the caller passes the packet to tc
 * before rewriting it, so this is checked first).
 */
static __always_inline int xdp_send(struct xdp_md *ctx, struct xdp_pkt4 *x,
				    const struct fib4 *f)
{
	__builtin_memcpy(x->eth->h_dest, f->dmac, ETH_ALEN);
	__builtin_memcpy(x->eth->h_source, f->smac, ETH_ALEN);
	if (f->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(f->ifindex, 0);
}

/* xdp_rev - the reply of a source-NATed flow. -1: not one. */
static __always_inline int xdp_rev(struct xdp_md *ctx, struct xdp_pkt4 *x,
				   __u64 now)
{
	struct ct4_key key = {};
	struct ct4_entry *e;
	struct fib4 f = {};
	__be32 fe_addr, client;
	__be16 fe_port, cport;

	/* Source-NATed flows only: their reply entries (the port
	 * reservations) are always in sluice_conntrack.
	 */
	ct_key_of(&key, &x->p, CT_REVERSE);
	e = bpf_map_lookup_elem(&sluice_conntrack_v2, &key);
	if (!e || !(e->flags & CT_F_SNAT) ||
	    !ct_alive(READ_ONCE(e->expires), now))
		return -1;
	fe_addr = e->nat_addr;
	fe_port = e->nat_port;
	client = e->snat_addr;
	cport = e->snat_port;
	if (fib4_lookup(ctx, ctx->ingress_ifindex, fe_addr, client, &f) < 0 ||
	    !f.have_neigh || !xdp_fwd_ok(ctx, x->ip, &f))
		return XDP_PASS;
	/* The first reply promotes the flow; if that fails, tc tries again
	 * and refuses the flow (counted).
	 */
	if (!(READ_ONCE(e->flags) & CT_F_REPLIED) &&
	    ct_promote_snat(&key, e, now))
		return XDP_PASS;
	ct_touch(&key, e, now);
	ct_track_tcp(&x->p, &key, e, now);
	xdp_rewrite(x, fe_addr, fe_port, client, cport);
	metric_inc(METRIC_XDP_REV);
	return xdp_send(ctx, x, &f);
}

/* xdp_fwd - a packet to an external frontend with a remote backend. */
static __always_inline int xdp_fwd(struct xdp_md *ctx, struct xdp_pkt4 *x,
				   __u64 now)
{
	const struct pkt4 *p = &x->p;
	struct lb4_affinity_key akey = {};
	struct lb4_service *svc;
	struct lb4_backend *be;
	struct node_dev *dev;
	struct ct4_key key = {};
	struct ct4_entry *fwd;
	struct fib4 f = {};
	__u32 backend_id = 0;
	__be32 nat_addr, snat_addr;
	__be16 nat_port, snat_port = 0;
	__u16 slot = 0;
	bool half_open, gone;
	__u8 flags;

	svc = lookup_service(p->daddr, p->dport, p->proto);
	if (!svc)
		return XDP_PASS;
	flags = svc->flags;
	if ((flags & (SVC_F_EXTERNAL | SVC_F_LOCAL)) != SVC_F_EXTERNAL ||
	    svc->count == 0)
		return XDP_PASS;
	if ((flags & SVC_F_SRC_RANGES) &&
	    !source_allowed(p->daddr, p->dport, p->proto, p->saddr)) {
		metric_inc(METRIC_XDP_SRC_RANGE_DENY);
		svc_count(svc->rev_nat_id, SVC_DROP_SOURCE_RANGE, 0);
		return XDP_DROP;
	}

	ct_key_of(&key, p, CT_FORWARD);
	fwd = ct_find(&key, now, &half_open);
	if (fwd) {
		/* Not source-NATed: a local backend, tc's to DNAT. Not
		 * usable: tc re-balances it, or starts it afresh. Its
		 * backend gone: tc counts the draining flow.
		 */
		if (!(fwd->flags & CT_F_SNAT) ||
		    !ct_fwd_usable(fwd, p, &gone) || gone)
			return XDP_PASS;
		nat_addr = fwd->nat_addr;
		nat_port = fwd->nat_port;
		snat_addr = fwd->snat_addr;
		snat_port = fwd->snat_port;
		if (fib4_lookup(ctx, ctx->ingress_ifindex, snat_addr, nat_addr,
				&f) < 0 ||
		    !f.have_neigh || !xdp_fwd_ok(ctx, x->ip, &f))
			return XDP_PASS;
		/* A port reservation lost (and maybe taken): tc drops and
		 * counts, never sends from a port the flow does not own.
		 */
		if (ct_check_reverse(p, &key, fwd, now) < 0)
			return XDP_PASS;
		ct_refresh(fwd, p->proto, now);
		ct_track_tcp(p, &key, fwd, now);
	} else {
		aff_key(&akey, p->saddr, AFFINITY_CLIENT_ADDR, p->daddr,
			p->dport, p->proto, svc->scope);
		be = aff_select(&akey, svc, now, &backend_id, &slot);
		if (!be)
			return XDP_PASS;
		nat_addr = be->addr;
		nat_port = be->port;
		if (fib4_lookup(ctx, ctx->ingress_ifindex, p->saddr, nat_addr,
				&f) < 0 ||
		    !f.have_neigh)
			return XDP_PASS;
		dev = node_dev_of(f.ifindex);
		if (!dev)
			return XDP_PASS; /* local backend: tc DNATs */
		if (!xdp_fwd_ok(ctx, x->ip, &f))
			return XDP_PASS;
		snat_addr = dev->addr;
		if (ct_create_snat(p, be, backend_id, svc->rev_nat_id,
				   snat_addr, now, &snat_port))
			return XDP_PASS; /* tc counts and drops */
		aff_remember(&akey, svc, be, backend_id, slot, now);
		metric_inc(METRIC_XDP_SNAT_NEW);
		svc_count(svc->rev_nat_id, SVC_EV_FLOW, 0);
	}
	svc_count(svc->rev_nat_id, SVC_EV_PACKET, p->l3_len);
	xdp_rewrite(x, snat_addr, snat_port, nat_addr, nat_port);
	metric_inc(METRIC_XDP_FWD);
	return xdp_send(ctx, x, &f);
}

SEC("xdp")
int sluice_xdp(struct xdp_md *ctx)
{
	struct xdp_pkt4 x = {};
	__u64 now;
	int ret;

	if (!parse_ipv4_xdp(ctx, &x))
		return XDP_PASS;
	now = bpf_ktime_get_ns();
	ret = xdp_rev(ctx, &x, now);
	if (ret >= 0)
		return ret;
	return xdp_fwd(ctx, &x, now);
}

char __license[] SEC("license") = "Dual BSD/GPL";
