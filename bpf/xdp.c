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
 * bpf_redirect to another); an established flow's next hops come from
 * the route cache below while it is fresh. Everything else, and anything
 * this path cannot finish (IP options, fragments, an unresolved
 * neighbour, a local backend, a full table), is XDP_PASSed untouched to
 * the tc program, which handles every case; the two share
 * sluice_conntrack, so a flow may start in tc and continue here. XDP
 * counts its outcomes under reasons of its own (METRIC_XDP_*), so that a
 * counter names the hook that saw the packet.
 *
 * Checksums are updated incrementally (RFC 1624). Packets from the wire
 * carry complete checksums; a packet a local stack handed over a veth with
 * CHECKSUM_PARTIAL would not, which is why Sluice attaches XDP only to the
 * node's external devices.
 *
 * Session affinity (affinity.h) is followed and kept as tc does; a new
 * flow passed to tc (its backend is local, say) is left for tc to
 * remember.
 *
 * IPv6 is served the same way, over the IPv6 maps (sluice6_*: the
 * conntrack entries and port reservations of tc6.h, ct_create_snat6, the
 * device addresses of sluice6_devices_v1): the steps are written once,
 * in xdp_fam.h, for both families. What differs is the parse (only TCP
 * or UDP right after the fixed header: extension headers, fragments, a
 * jumbogram and UDP without a checksum go to tc) and the rewrite (no
 * header checksum; the hop limit decremented). The IPv6 program is one of
 * its own (sluice6_xdp), which the attached entry tail-calls for an IPv6
 * frame (sluice6_xdp_v1), as tc.c does tc6.h's: the verifier checks it
 * apart, and IPv4 pays one comparison of the ethertype for it, on the
 * path of frames that are not IPv4. IPv6's steps are BPF functions of
 * their own (its keys, entries and routes do not fit the stack inlined
 * together), and its port search a global function, as in tc6.h.
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
#define CT_ASSURE_GLOBAL /* conntrack_fam.h: ct_assure */
#include "lib/conntrack.h"
#include "lib/nat.h"
#include "lib/nat6.h"

/* Whether a node device may be L3 (parse.h); the agent writes it. */
volatile __u8 dev_l3_maybe = 1;

/* Whether a node device may be an overlay tunnel (nat.h); the agent writes it. */
volatile __u8 dev_tunnel_maybe = 1;

/*
 * Whether new flows skip the half-open share (conntrack.h). XDP is
 * replaced by the shim while conntrack is migrated: it stays 0.
 */
volatile __u8 ct_admit_paused SEC(".data") = 0;

/*
 * The route cache: the next hop bpf_fib_lookup found for a packet of an
 * established flow, kept so that the flow's next packets skip the lookup
 * (for IPv6 the kernel searches the local table, then the main one:
 * about two thirds of what an IPv6 packet cost over an IPv4 one).
 *
 * An entry is used only while both hold:
 *  - it is of the current generation of the node's routing, fib_gen,
 *    which the agent bumps whenever netlink reports a change of a route,
 *    rule, neighbour, address, link, nexthop or forwarding setting
 *    (pkg/datapath FollowRouting); a packet reads the generation before
 *    its lookup and stores it with the answer, so an answer looked up
 *    before a change and stored after it is never used;
 *  - it is younger than fib_cache_ns (config.h; by the packet's
 *    clock): the bound
 *    on how stale an entry can be when no agent runs, or one missed an
 *    event.
 * Only a lookup that returned SUCCESS is kept (a resolved neighbour; no
 * local destination, unreachable route or forwarding disabled, which tc
 * handles), and each packet is still checked against the egress device's
 * MTU (xdp_fwd_ok), cached or not. A new flow's first packet routes
 * without the cache (its key names the client, a lookup the flow never
 * repeats): the cache holds the routes of established flows, to their
 * backends and back to their clients.
 *
 * The maps and the generation are this object's own, not pinned: an
 * agent that loads the programs starts with an empty cache.
 */

/* Key: struct fib4_key. Value: struct fib_hop. Written by XDP. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct fib4_key);
	__type(value, struct fib_hop);
	__uint(max_entries, 16384);
} sluice_fib_v1 SEC(".maps");

/* Key: struct fib6_key. Value: struct fib_hop. Written by XDP. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct fib6_key);
	__type(value, struct fib_hop);
	__uint(max_entries, 16384);
} sluice6_fib_v1 SEC(".maps");

/* The generation of the node's routing; the agent bumps it. */
volatile __u32 fib_gen = 0;

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
 * xdp_rewrite6 - xdp_rewrite for IPv6: set both L4 addresses of @x and
 * decrement its hop limit, fixing the L4 checksum (IPv6 has no header
 * checksum, and the pseudo-header leaves the hop limit out).
 *
 * The addresses are passed by reference (xdp_fam.h's xdp_out names them
 * as xdp_rewrite's, by value, through the macro below): read where they
 * are used, they do not all sit in registers at once, which spilled them
 * to the stack of xdp_out6, whose frame is on the program's deepest path.
 */
static __always_inline void
xdp_rewrite6_at(struct xdp_pkt6 *x, const union v6addr *saddr, __be16 sport,
		const union v6addr *daddr, __be16 dport)
{
	struct ipv6hdr *ip = x->ip;
	__u16 c = *x->l4csum;

	/* Forwarded: one hop less (xdp_fwd_ok checked it is over 1). */
	ip->hop_limit--;
	c = csum_replace_v6(c, &x->p.saddr, saddr);
	c = csum_replace_v6(c, &x->p.daddr, daddr);
	c = csum_replace16(c, x->ports[0], sport);
	c = csum_replace16(c, x->ports[1], dport);
	/* (UDP without a checksum never gets here: parse_ipv6_xdp.) */
	if (x->p.proto == IPPROTO_UDP && c == 0)
		c = 0xffff;
	*x->l4csum = c;
	__builtin_memcpy(&ip->saddr, saddr, sizeof(*saddr));
	__builtin_memcpy(&ip->daddr, daddr, sizeof(*daddr));
	x->ports[0] = sport;
	x->ports[1] = dport;
}

#define xdp_rewrite6(x, saddr, sport, daddr, dport) \
	xdp_rewrite6_at(x, &(saddr), sport, &(daddr), dport)

/*
 * Where a translated packet goes (xdp_fam.h's xdp_out): <saddr:sport ->
 * daddr:dport>, to the next hop of route f.
 */
struct xdp_out4 {
	struct fib4 f;
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};

struct xdp_out6 {
	struct fib6 f;
	union v6addr saddr;
	union v6addr daddr;
	__be16 sport;
	__be16 dport;
};

/*
 * xdp6_snat_port - reserve a source port on @node for a new flow of @p to
 * @be (ct_create_snat6, which also records the flow). Returns the port
 * (network order), or 0 if none was reserved (the range holds no 0).
 *
 * A global function, as nat_snat6 (tc6.h) is, for the same reason: the
 * verifier checks its port search once, on its own. So its pointers may
 * be NULL as far as it knows; and it has five arguments at most, so the
 * port is its result.
 */
__noinline __u32 xdp6_snat_port(const struct pkt6 *p,
				const struct lb6_backend *be, __u32 backend_id,
				__u32 rev_nat_id, const union v6addr *node)
{
	__be16 port = 0;

	if (!p || !be || !node ||
	    ct_create_snat6(p, be, backend_id, rev_nat_id, *node, now_ns(),
			    &port, false))
		return 0;
	return port;
}

/*
 * xdp6_create_snat - ct_create_snat6 by xdp6_snat_port (which reads the
 * clock itself, @now unused): 0, or 1 (no port). @fresh is unused too:
 * passed on, it made the combined stack of xdp6_snat_port's calls 528
 * bytes, over the verifier's 512, so ct_create_snat6 looks as if it were
 * not fresh (three more lookups for a new flow, the result the same).
 */
static __always_inline int xdp6_create_snat(const struct pkt6 *p,
					    const struct lb6_backend *be,
					    __u32 backend_id, __u32 rev_nat_id,
					    union v6addr node, __u64 now,
					    __be16 *port, bool fresh)
{
	*port = (__be16)xdp6_snat_port(p, be, backend_id, rev_nat_id, &node);
	return *port ? 0 : 1;
}

/*
 * xdp6_check_reverse - ct_check_reverse_snat6, in a frame of its own (its
 * entry and key would not fit xdp_fwd6's on the stack with the calls
 * under it).
 */
static __noinline int xdp6_check_reverse(const struct pkt6 *p,
					 const struct ct6_key *key,
					 const struct ct6_entry *fwd, __u64 now)
{
	return ct_check_reverse_snat6(p, key, fwd, now);
}

/*
 * xdp6_promote_snat - ct_promote_snat6, in a frame of its own: its
 * forward entry and key, and the call that takes a counted port
 * reservation off the half-open count (conntrack.h), would not fit
 * xdp_rev6's on the stack with the calls under it (8 bytes over the
 * combined 512).
 */
static __noinline int xdp6_promote_snat(const struct ct6_key *rkey,
					struct ct6_entry *rev, __u64 now)
{
	return ct_promote_snat6(rkey, rev, now);
}

/*
 * What xdp_fam.h names per family (see there). IPv6's keys, entries and
 * routes are wider than the stack takes inlined together: its steps are
 * BPF functions of their own, as tc6.h's are; IPv4's are inlined, as
 * before IPv6.
 */
#define xdp_step_4	    __always_inline
#define xdp_step_6	    __noinline
#define xdp_create_snat_4   ct_create_snat
#define xdp_create_snat_6   xdp6_create_snat
#define xdp_check_reverse_4 ct_check_reverse_snat
#define xdp_check_reverse_6 xdp6_check_reverse
#define xdp_promote_snat_4  ct_promote_snat
#define xdp_promote_snat_6  xdp6_promote_snat
#define xdp_pkt_t_4	    struct xdp_pkt4
#define xdp_pkt_t_6	    struct xdp_pkt6
#define xdp_ttl_4(x)	    ((x)->ip->ttl)
#define xdp_ttl_6(x)	    ((x)->ip->hop_limit)
#define xdp_out_t_4	    struct xdp_out4
#define xdp_out_t_6	    struct xdp_out6
#define fib_t_4		    struct fib4
#define fib_t_6		    struct fib6
#define fib_lookup_4(ctx, ifindex, saddr, daddr, f) \
	fib4_lookup(ctx, ifindex, saddr, daddr, f)
#define fib_lookup_6(ctx, ifindex, saddr, daddr, f) \
	fib6_lookup(ctx, ifindex, &(saddr), &(daddr), f)
#define fib_result_4 fib4_result
#define fib_result_6 fib6_result
#define fib_key_t_4  struct fib4_key
#define fib_key_t_6  struct fib6_key
#define fib_cache_4  sluice_fib_v1
#define fib_cache_6  sluice6_fib_v1
#define fib_params_4(fib, key)                   \
	do {                                     \
		(fib)->family = AF_INET;         \
		(fib)->ifindex = (key)->ifindex; \
		(fib)->ipv4_src = (key)->saddr;  \
		(fib)->ipv4_dst = (key)->daddr;  \
	} while (0)
#define fib_params_6(fib, key)                                        \
	do {                                                          \
		(fib)->family = AF_INET6;                             \
		(fib)->ifindex = (key)->ifindex;                      \
		__builtin_memcpy((fib)->ipv6_src, &(key)->saddr, 16); \
		__builtin_memcpy((fib)->ipv6_dst, &(key)->daddr, 16); \
	} while (0)
#define node_dev_t_4	       struct node_dev
#define node_dev_t_6	       union v6addr
#define node_dev_of_4(ifindex) node_dev_of(ifindex)
#define node_dev_of_6(ifindex) node6_dev_of(ifindex)
#define dev_addr_4(dev)	       ((dev)->addr)
#define dev_addr_6(dev)	       (*(dev))

#define LB_FAMILY 4
#include "lib/xdp_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "lib/xdp_fam.h"
#undef LB_FAMILY

/*
 * xdp6_divert - run @ctx, an IPv6 frame, through the IPv6 program
 * (sluice6_xdp_v1). Returns only if there is none (an agent that did not
 * set it up, or is gone): XDP_PASS, tc serving IPv6 meanwhile.
 */
static __always_inline int xdp6_divert(struct xdp_md *ctx)
{
	bpf_tail_call(ctx, &sluice6_xdp_v1, 0);
	return XDP_PASS;
}

/*
 * The entry dispatches on the ethertype: IPv6 to its program, the rest to
 * the IPv4 path (the compiler tests for IPv4 first).
 */
SEC("xdp")
int sluice_xdp(struct xdp_md *ctx)
{
	struct xdp_pkt4 x = {};

	if (xdp_eth(ctx, bpf_htons(ETH_P_IPV6)))
		return xdp6_divert(ctx);
	if (!parse_ipv4_xdp(ctx, &x))
		return XDP_PASS;
	return xdp_translate(ctx, &x);
}

/* The IPv6 program: never attached, only tail-called. */
SEC("xdp")
int sluice6_xdp(struct xdp_md *ctx)
{
	struct xdp_pkt6 x = {};

	if (!parse_ipv6_xdp(ctx, &x))
		return XDP_PASS;
	return xdp_translate6(ctx, &x);
}

char __license[] SEC("license") = "Dual BSD/GPL";
