/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ICMP errors that tc sends itself, on the per-packet path: a port
 * unreachable for a flow to a service with no backends, and, where tc
 * forwards a packet itself (nat.h), a time exceeded or a fragmentation
 * needed in place of the stack's.
 *
 * Dropping would leave the client retrying until it times out. Instead the
 * packet is turned, in place, into the ICMP error to its source and sent
 * back out of the device it came in on: from its destination (the VIP, the
 * NodePort), or, for a reject, from the address the kernel's reject would
 * come from (icmp_reject_src: a node address, not a ClusterIP). Linux reports
 * a port unreachable as ECONNREFUSED to both a TCP connect and a connected
 * UDP socket, just as if the VIP had refused the port itself; a fragmentation
 * needed lowers the path MTU of the socket's route.
 *
 *   in:  eth | IPv4 C->V (+options) | TCP/UDP ... payload
 *   out: eth (MACs swapped) | IPv4 V (or N)->C | ICMP | IPv4 C->V (+options) | L4 header
 *
 * (On an L3 device there is no eth, in or out.)
 *
 * The tail is trimmed to the quote with bpf_skb_change_tail (which also
 * ends a GSO packet's segmentation state), room for the new IPv4 and ICMP
 * headers is made after the MAC header with bpf_skb_adjust_room, so the
 * quoted bytes never move or get copied back.
 *
 * The quote is the whole fixed L4 header (20 bytes for TCP, 8 for UDP;
 * another protocol's first 8 bytes, or what the packet has of them, as
 * the kernel quotes what there is: a GRE packet may carry only 4), more
 * than the 8 bytes RFC 792 asks for, as RFC 1812 allows. For TCP it has
 * to be: a TCP segment sent by a local stack over a veth (a pod) arrives with
 * CHECKSUM_PARTIAL, and the kernel refuses to trim such an skb before the
 * end of its L4 checksum field. That offload state stays on the reply; the
 * veth peer's stack trusts it, and it never reaches a physical NIC
 * (PARTIAL skbs only come from a local stack). Another protocol's packet
 * with CHECKSUM_PARTIAL (SCTP's CRC sits past the 8 bytes) makes the trim
 * fail, as does a GRE or IPIP skb with skb->encapsulation set: no error
 * is sent then (ICMP_NOT_SENT).
 *
 * Whom to answer is the kernel's choice too (icmp_link_answerable,
 * icmp_src_answerable): no error is sent about a frame addressed to a
 * link-layer broadcast or multicast group (icmp_send; and ip_forward
 * drops such a frame before netfilter's forward chain, where kube-proxy's
 * reject sits), nor to a source that names no single host (RFC 1122
 * 3.2.2, RFC 4443 2.4(e); the kernel's martian-source check drops those
 * on input): otherwise every node on a segment answers one broadcast
 * frame, and a spoofed source turns the nodes into reflectors. A frame
 * the device took in for another host's MAC (PACKET_OTHERHOST: a device
 * in promiscuous mode) is not answered either: the kernel drops it
 * before routing (ip_rcv_core, ipv6_rcv); but on a port of a bridge,
 * bond, team or Open vSwitch, whose frames go to its master, it may be
 * to the master's MAC, and is answered (not on a VRF's slave: IP runs on
 * the slave, which drops it).
 *
 * How often is the kernel's choice as well (icmp_rl_allow, below): the
 * error types the kernel rate-limits go through its two token buckets,
 * one per destination and one for the node, with its sysctls' values
 * (sluice_icmp_limits_v1, which the agent keeps up to date); an error
 * over either is not sent (ICMP_NOT_SENT), counted
 * as tc_icmp_ratelimited. Otherwise a flood to a ClusterIP's unserved
 * port gets as many errors back, at whatever source it names.
 */
#ifndef SLUICE_ICMP_H
#define SLUICE_ICMP_H

#include "consts.h"
#include "config.h"
#include "csum.h"
#include "parse.h"
#include "explain.h"

#define ICMP_QUOTE_MAX (60 + sizeof(struct tcphdr))
#define ICMP_ERR_TTL   64

/* The ICMP error icmp_reply sends: type, code and next-hop MTU. */
#define ICMP_ERR(type, code, mtu) \
	(((__u32)(type) << 24) | ((__u32)(code) << 16) | (__u16)(mtu))

/*
 * ICMP_NOT_SENT - what icmp_reply and icmp6_reply return when they send
 * nothing: a packet the kernel would not answer either (icmp_*_answerable),
 * an error over the kernel's rate limits (icmp_rl_allow), or a packet
 * whose tail could not be trimmed (the packet is untouched then). Not
 * a TC verdict: the caller drops the packet (icmp_verdict), counted under
 * the reason it would have answered, not as a rewrite error.
 */
#define ICMP_NOT_SENT 0x100

/* icmp_verdict - the TC verdict for @ret, icmp_reply's or icmp6_reply's. */
static __always_inline int icmp_verdict(int ret)
{
	return ret == ICMP_NOT_SENT ? TC_ACT_SHOT : ret;
}

/* skb->pkt_type (linux/if_packet.h) */
#define SL_PACKET_HOST	    0
#define SL_PACKET_OTHERHOST 3

/*
 * icmp_link_answerable - whether the kernel would send an ICMP error
 * about a packet that came in as @skb: only about a frame to this host's
 * MAC (PACKET_HOST, from eth_type_trans; an L3 device's packets are too),
 * as __icmp_send and icmp6_send check: not a frame to a link-layer
 * broadcast or multicast address, nor one to another host's MAC
 * (PACKET_OTHERHOST), which the kernel drops before routing anyway
 * (ip_rcv_core). Except on a port of a bridge, bond, team or Open
 * vSwitch (NODE_DEV_F_PORT): its frames go to its master, and one to the
 * master's MAC is PACKET_OTHERHOST here, PACKET_HOST once the master
 * takes it in; such
 * a frame is answered as before. BPF_PROG_TEST_RUN sets pkt_type as a
 * device would: eth_type_trans against the context's ifindex's device,
 * or the loopback device (whose address is 00:00:00:00:00:00) without
 * one.
 */
static __always_inline bool icmp_link_answerable(const struct __sk_buff *skb)
{
	__u32 type = skb->pkt_type, ifindex = skb->ifindex;
	struct node_dev *dev;

	if (type == SL_PACKET_HOST)
		return true;
	if (type != SL_PACKET_OTHERHOST)
		return false;
	dev = bpf_map_lookup_elem(&sluice_devices_v1, &ifindex);
	return dev && (dev->flags & NODE_DEV_F_PORT);
}

#ifdef ICMP_RATE_LIMIT
/*
 * The kernel's ICMP rate limits (net/ipv4/icmp.c, net/ipv6/icmp.c,
 * net/ipv4/inetpeer.c, Linux 6.18), for the errors of the types it
 * limits (icmp_ratemask, net.ipv6.icmp.ratemask: port unreachable and
 * time exceeded by default, never IPv4's fragmentation needed; packet
 * too big by default not). In its order:
 *
 * 1. The node's bucket (icmp_global_allow): an error may go while it has
 *    credit; without, it is refilled at icmp_msgs_per_sec for the time
 *    since its last refill (at most a second's worth, at least 20 ms
 *    since, up to icmp_msgs_burst), or the error is not sent.
 * 2. The destination's bucket (inet_peer_xrlim_allow): each error costs
 *    icmp_ratelimit ns of tokens (IPv6: net.ipv6.icmp.ratelimit, with
 *    no scaling by the route's prefix since 6.18's 0201eedb69b2), which
 *    refill one a ns up to 6 errors' worth (XRLIM_BURST_FACTOR); a new
 *    destination starts with 60 s of them (6 errors at 1000 ms: a burst
 *    of 6, then one a second). Ratelimit 0: no limit here.
 * 3. Only an error that passed both takes from the node's bucket
 *    (icmp_global_consume): 0, 1 or 2 credits at random (1 on average),
 *    the kernel's defence against the bucket as a side channel
 *    (CVE-2020-25705), so the node's burst is 50 errors on average.
 *
 * Both buckets are the kernel's kind, not its instances: the kernel's
 * own errors and Sluice's draw on separate buckets. The kernel keeps
 * them per network namespace, as the sysctls: here, the agent's (the
 * node's). The destinations' are an LRU of 8192 (the kernel's inetpeer
 * keeps up to 65536): a destination evicted starts again with a full
 * bucket, as it would after 6 s idle; only a flood of errors to more
 * than 8192 sources within that time evicts, and the node's bucket
 * bounds such a flood. Races between CPUs are the kernel's kind too:
 * two CPUs may pass one credit; a refill that races a consumer is lost
 * (fewer errors, never more).
 *
 * The tc object alone defines ICMP_RATE_LIMIT (tc.c): XDP includes this
 * header (nat.h) but sends no ICMP error, and has no use for the maps.
 * A dry run (explain.h) reads the buckets and changes neither.
 */

/* XRLIM_BURST_FACTOR: a destination's burst, in errors */
#define ICMP_RL_BURST 6
/* the tokens a new destination starts with (inet_getpeer's rate_last) */
#define ICMP_RL_NEW_TOKENS (60 * NSEC_PER_SEC)

/* Key: struct icmp_rl_key. Value: struct icmp_rl_peer. Not pinned: the
 * buckets start full when the agent loads anew, as after a reboot.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct icmp_rl_key);
	__type(value, struct icmp_rl_peer);
	__uint(max_entries, 8192);
} sluice_icmp_peers_v1 SEC(".maps");

/* Key: __u32 0. Value: struct icmp_rl_global. Not pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct icmp_rl_global);
	__uint(max_entries, 1);
} sluice_icmp_global_v1 SEC(".maps");

/*
 * icmp_rl_global_allow - icmp_global_allow: whether the node's bucket
 * @g lets an error go at @now, refilling it if it is empty (not in a
 * dry run, @dry) at @c's rate, up to its burst.
 */
static __always_inline bool icmp_rl_global_allow(struct icmp_rl_global *g,
						 const struct icmp_rl_conf *c,
						 __u64 now, bool dry)
{
	__u64 per_sec = READ_ONCE(c->msgs_per_sec);
	__s64 burst = READ_ONCE(c->msgs_burst);
	__u64 stamp, delta, incr;
	__s64 credit, want;

	if (READ_ONCE(g->credit) > 0)
		return true;
	stamp = READ_ONCE(g->stamp);
	delta = now - stamp;
	/* Another CPU read the clock after @now was and stored its stamp
	 * first: no time has passed (unsigned, it would be a full second). */
	if ((__s64)delta < 0)
		delta = 0;
	if (delta > NSEC_PER_SEC)
		delta = NSEC_PER_SEC;
	if (delta < NSEC_PER_SEC / 50)
		return false;
	incr = per_sec * delta / NSEC_PER_SEC;
	if (!incr)
		return false;
	if (dry)
		return true;
	if (__sync_val_compare_and_swap(&g->stamp, stamp, now) == stamp) {
		credit = READ_ONCE(g->credit);
		want = credit + (__s64)incr;
		if (want > burst)
			want = burst;
		__sync_val_compare_and_swap(&g->credit, credit, want);
	}
	return true;
}

/*
 * icmp_rl_peer_allow - inet_peer_xrlim_allow: whether the bucket of the
 * destination @key lets an error that costs @tmo ns go at @now, taking
 * them (not in a dry run, @dry).
 */
static __always_inline bool icmp_rl_peer_allow(const struct icmp_rl_key *key,
					       __u64 tmo, __u64 now, bool dry)
{
	struct icmp_rl_peer *b =
		bpf_map_lookup_elem(&sluice_icmp_peers_v1, key);
	struct icmp_rl_peer fresh = {};
	__u64 tokens = 0, delta = ICMP_RL_NEW_TOKENS;
	bool ok = false;

	if (b) {
		tokens = READ_ONCE(b->tokens);
		delta = now - READ_ONCE(b->last);
		/* As above: a later stamp is no time passed, not a burst. */
		if ((__s64)delta < 0)
			delta = 0;
	}
	if (delta) {
		tokens += delta;
		if (tokens > ICMP_RL_BURST * tmo)
			tokens = ICMP_RL_BURST * tmo;
	}
	if (tokens >= tmo) {
		tokens -= tmo;
		ok = true;
	}
	if (dry)
		return ok;
	if (b) {
		WRITE_ONCE(b->tokens, tokens);
		WRITE_ONCE(b->last, now);
	} else {
		fresh.tokens = tokens;
		fresh.last = now;
		bpf_map_update_elem(&sluice_icmp_peers_v1, key, &fresh,
				    BPF_NOEXIST);
	}
	return ok;
}

/*
 * icmp_rl_limited - whether the kernel rate-limits an error of @type and
 * @code (ICMPv6's if @v6) with the ratemasks of @c: IPv4's types of
 * icmp_ratemask (icmpv4_mask_allow), never a fragmentation needed (path
 * MTU discovery must not stall); ICMPv6's of net.ipv6.icmp.ratemask
 * (icmpv6_mask_allow; tc sends types 1 to 3).
 */
static __always_inline bool icmp_rl_limited(const struct icmp_rl_conf *c,
					    bool v6, __u8 type, __u8 code)
{
	if (v6)
		return type < 32 && ((READ_ONCE(c->ratemask6) >> type) & 1);
	if (type > NR_ICMP_TYPES ||
	    (type == ICMP_DEST_UNREACH && code == ICMP_FRAG_NEEDED))
		return false;
	return (READ_ONCE(c->ratemask) >> type) & 1;
}

/*
 * icmp_rl_allow - whether the kernel's rate limits let an error of
 * @type and @code (ICMPv6's if @v6) go to @dst, an IPv6 address if @v6,
 * else IPv4's in p[0] (the rest zero): any error of a type they do not
 * limit (icmp_rl_limited); else the node's bucket, then the
 * destination's (if its family's ratelimit is not 0), then the node's
 * credit taken. The values are sluice_icmp_limits_v1's, the sysctls as
 * the agent last read them; one it writes while an error is decided may
 * be seen half old, half new (each field whole). An error they stop is
 * counted as tc_icmp_ratelimited. A dry run (@dry) changes neither
 * bucket and notes the count in its record.
 *
 * A global BPF function, called by icmp_reply and icmp6_reply, which are
 * inlined into their callers, on the error path only: its frame sits
 * beside icmp_build's (icmp6_build's), not on top of it, where the
 * entry's stack has no room for it; and the limits' map is read there
 * only, never on the way of a packet that gets no error. Global, the
 * verifier walks it once, with its arguments unknown, not once for each
 * call (as a static function's), where constant limits pruned its
 * branches: with the limits in a map, the tc programs' verified
 * instructions went from 379,390 to 339,025 (412,801 static). As a
 * global function's pointer may be NULL, @dst is checked.
 */
__noinline bool icmp_rl_allow(const union v6addr *dst, bool v6, __u8 type,
			      __u8 code, bool dry)
{
	struct icmp_rl_key key = {};
	const struct icmp_rl_conf *c;
	struct icmp_rl_global *g;
	__u64 now, tmo;
	__u32 zero = 0, n;

	if (!dst)
		return true;
	c = bpf_map_lookup_elem(&sluice_icmp_limits_v1, &zero);
	if (!c || !icmp_rl_limited(c, v6, type, code))
		return true;
	g = bpf_map_lookup_elem(&sluice_icmp_global_v1, &zero);
	if (!g)
		return true;
	now = now_ns();
	tmo = v6 ? READ_ONCE(c->ratelimit6_ns) : READ_ONCE(c->ratelimit_ns);
	if (!icmp_rl_global_allow(g, c, now, dry))
		goto limited;
	if (tmo) {
		key.family = v6 ? 6 : 4;
		key.addr = *dst;
		if (!icmp_rl_peer_allow(&key, tmo, now, dry))
			goto limited;
	}
	if (!dry) {
		n = bpf_get_prandom_u32() % 3;
		if (n)
			__sync_fetch_and_sub(&g->credit, (__s64)n);
	}
	return true;
limited:
	metric_count_if(dry, METRIC_TC_ICMP_RATELIMITED);
	return false;
}
#else
/* An object that sends no ICMP error (XDP) has no limiter. */
static __always_inline bool icmp_rl_allow(const union v6addr *dst, bool v6,
					  __u8 type, __u8 code, bool dry)
{
	return true;
}
#endif /* ICMP_RATE_LIMIT */

/*
 * The source of a reject. kube-proxy's `reject` (nf_send_unreach) has the
 * kernel send the port unreachable (__icmp_send, icmp6_send), whose
 * source is the rejected packet's destination only if that is one of the
 * node's addresses (its route is local, RTCF_LOCAL; IPv6: ipv6_chk_addr
 * or an anycast address): a NodePort, or an ExternalIP the node holds,
 * rejected in the input hook. A ClusterIP is no local address (nor, as
 * a rule, a LoadBalancer IP): rejected in the forward hook, its error
 * comes from the address the node's output route to the client picks
 * (its preferred source, else the device's address for the gateway or
 * the client: fib_result_prefsrc; IPv6: the route's prefsrc, else
 * ipv6_dev_get_saddr), not from the VIP, which anti-spoofing (a cloud's
 * source/destination check, strict uRPF) may drop. Not followed:
 * net.ipv4.icmp_errors_use_inbound_ifaddr (default 0), with which the
 * kernel starts from the inbound device's address.
 *
 * Both with bpf_fib_lookup, on the error path only: a lookup of the
 * packet's own route (from the client on its device, BPF_FIB_LKUP_RET_
 * NOT_FWDED: a local address, or no route at all, where the kernel would
 * not forward the packet to be rejected either); then, if it is routed,
 * the route to the client with BPF_FIB_LOOKUP_SRC (Linux 6.7, commit
 * dab4e1f06cab; backported to some stable branches), whose source it
 * picks (fib_result_prefsrc; IPv6: the route's prefsrc, else
 * ipv6_dev_get_saddr on its device). That lookup is an input one from
 * the ingress device (flowi4_iif, flowi6_iif: bpf_ipv4_fib_lookup and
 * bpf_ipv6_fib_lookup set the oif only in output mode, and fill the
 * source in either), so it is not pinned to a device: the route the
 * kernel's icmp_route_lookup would take (an output route with no oif),
 * whatever its device, with the flow of the kernel's ICMP route: protocol
 * ICMP, the type and code (flowi4's icmpt, in the bytes of its dport),
 * and, IPv4, the tos __icmp_send gives an error (the packet's TOS bits
 * with IPTOS_PREC_INTERNETCONTROL); IPv6's flow label 0, as icmp6_send's.
 * The error itself still leaves by the ingress device (icmp_send_back),
 * whatever device that route goes through. Not followed: ip rules on
 * iif (the lookup's iif is the ingress device, the kernel's output route
 * has lo's), on fwmark with net.ipv4.fwmark_reflect=1 (the lookup's mark
 * is 0, the kernel's the packet's), on uid; and IPv6 without a prefsrc
 * on a route through another device, where icmp6_send picks the address
 * by ipv6_dev_get_saddr on the ingress device, the FIB on the route's.
 * Neither lookup passes BPF_FIB_LOOKUP_SKIP_NEIGH, as tcp_stray_local
 * (tc.c) does not, for one rule where both look up (no kernel gains: the
 * second's BPF_FIB_LOOKUP_SRC, Linux 6.7, implies SKIP_NEIGH's 6.3): the
 * first is read only for NOT_FWDED, which a route not
 * RTN_UNICAST (a local one) returns before any neighbour step; the
 * second fills the source in before that step, so a route whose next hop
 * has no valid neighbour entry (BPF_FIB_LKUP_RET_NO_NEIGH) gives the
 * same source as SUCCESS, and both are taken. Where the lookups cannot
 * say (a kernel without BPF_FIB_LOOKUP_SRC refuses the flag: -EINVAL; no
 * route to the client; forwarding off on the ingress device, which
 * bpf_fib_lookup requires: BPF_FIB_LKUP_RET_FWD_DISABLED; no address to
 * pick; IPv6: a link-local, multicast or loopback source or destination,
 * which the first lookup refuses at once, rt6_need_strict), the error
 * comes from the packet's destination, as before.
 *
 * The tc object alone defines them (ICMP_RATE_LIMIT, above: XDP sends no
 * error). Global functions, verified once each, not per call, and called
 * from icmp_reply and icmp6_reply (inlined), as icmp_rl_allow is: their
 * frames sit beside icmp_build's (icmp6_build's), not on top of it, where
 * sluice6_ingress's stack has no room for them.
 */
#ifdef ICMP_RATE_LIMIT
/*
 * icmp_reject_src - the source of the port unreachable about a packet
 * from @client to @daddr, its IPv4 header at @l3_off, that came in on
 * @skb's device (above).
 */
__noinline __be32 icmp_reject_src(struct __sk_buff *skb, __be32 client,
				  __be32 daddr, __u32 l3_off)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET,
		.tot_len = sizeof(struct iphdr),
		.ipv4_src = client,
		.ipv4_dst = daddr,
		.ifindex = skb->ifindex,
	};
	int ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	__u8 tos = 0;

	if (ret == BPF_FIB_LKUP_RET_NOT_FWDED)
		return daddr;
	if (bpf_skb_load_bytes(skb, l3_off + 1, &tos, sizeof(tos)) < 0)
		tos = 0;
	__builtin_memset(&fib, 0, sizeof(fib));
	fib.family = AF_INET;
	fib.l4_protocol = IPPROTO_ICMP;
	fib.dport = bpf_htons(ICMP_DEST_UNREACH << 8 | ICMP_PORT_UNREACH);
	fib.tot_len = sizeof(struct iphdr);
	fib.tos = (tos & IPTOS_TOS_MASK) | IPTOS_PREC_INTERNETCONTROL;
	fib.ipv4_dst = client;
	fib.ifindex = skb->ifindex;
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SRC);
	if ((ret != BPF_FIB_LKUP_RET_SUCCESS &&
	     ret != BPF_FIB_LKUP_RET_NO_NEIGH) ||
	    !fib.ipv4_src)
		return daddr;
	return fib.ipv4_src;
}
#else
static __always_inline __be32 icmp_reject_src(struct __sk_buff *skb,
					      __be32 client, __be32 daddr,
					      __u32 l3_off)
{
	return daddr;
}
#endif /* ICMP_RATE_LIMIT */

/*
 * icmp_src_answerable - whether @saddr names a single host the kernel
 * would answer: not 0.0.0.0/8 ("this network"), 127.0.0.0/8 (loopback,
 * which never comes in off a wire), 224.0.0.0/4 (multicast) or
 * 255.255.255.255 (limited broadcast); RFC 1122 3.2.2, and the kernel's
 * martian sources (ip_route_input_slow).
 */
static __always_inline bool icmp_src_answerable(__be32 saddr)
{
	__u32 a = bpf_ntohl(saddr);

	return (a >> 24) != 0 && (a >> 24) != 127 && (a >> 28) != 0xe &&
	       a != 0xffffffff;
}

struct icmp_err_hdr {
	struct iphdr ip;
	struct icmphdr icmp;
};

/*
 * icmp_send_back - the end of icmp_build and icmp6_build (icmp6.h): turn
 * @skb into the error, the @hdr_len bytes at @hdr (its IP and ICMP
 * headers) followed by the first @quote_len bytes of the packet at
 * @l3_off, with @eth (the packet's Ethernet header, if @l3_off is not 0)
 * sent back where it came from, and redirect it out of its ingress
 * device. Returns TC_ACT_REDIRECT, ICMP_NOT_SENT if the trim failed (the
 * packet is untouched: the MACs are swapped in @eth, a copy), or
 * TC_ACT_SHOT if a later helper failed.
 */
static __always_inline int icmp_send_back(struct __sk_buff *skb, __u32 l3_off,
					  __u32 quote_len, struct ethhdr *eth,
					  const void *hdr, __u32 hdr_len)
{
	__u8 mac[ETH_ALEN];

	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);

	if (bpf_skb_change_tail(skb, l3_off + quote_len, 0) < 0)
		return ICMP_NOT_SENT;
	if (bpf_skb_adjust_room(skb, hdr_len, BPF_ADJ_ROOM_MAC, 0) < 0)
		return TC_ACT_SHOT;
	if (l3_off && bpf_skb_store_bytes(skb, 0, eth, sizeof(*eth),
					  BPF_F_RECOMPUTE_CSUM) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, l3_off, hdr, hdr_len,
				BPF_F_RECOMPUTE_CSUM) < 0)
		return TC_ACT_SHOT;

	return bpf_redirect(skb->ifindex, 0);
}

/*
 * icmp_build - rewrite @skb, the packet @p, into the ICMP error @err
 * (ICMP_ERR: type, code, and the next-hop MTU of a fragmentation needed)
 * about it, from @saddr, and redirect it back out of its ingress device:
 * icmp_reply once it has decided to send it.
 *
 * Returns TC_ACT_REDIRECT; ICMP_NOT_SENT for a packet that cannot be
 * trimmed (icmp_send_back) or is too short to quote; or TC_ACT_SHOT if a
 * helper failed (by then the packet may be half rewritten and must not
 * go on).
 *
 * A BPF function of its own rather than inlined: several paths call it,
 * and it is large.
 */
static __noinline int icmp_build(struct __sk_buff *skb, const struct pkt4 *p,
				 __u32 err, __be32 saddr)
{
	/* ICMP header and quote, summed together for the ICMP checksum.
	 * Bytes past the quote stay zero and add nothing to the sum.
	 */
	struct {
		struct icmphdr icmp;
		__u8 quote[ICMP_QUOTE_MAX];
	} body = {};
	struct icmp_err_hdr hdr = {};
	struct ethhdr eth = {};
	__u32 quote_len = p->ihl_len;

	/* ihl_len is a multiple of 4 in 20..60 (parse_ipv4). Mask it in asm,
	 * where clang cannot fold the mask away, so that the verifier sees
	 * 8..80 as the bound of the variable-size load below. parse_ipv4
	 * checked that the whole TCP or UDP header is in the packet; another
	 * protocol's may hold less than 8 bytes: the quote ends with the
	 * packet (l3_len, at least ihl_len), as the kernel's does.
	 */
	asm volatile("%0 &= 0x3c" : "+r"(quote_len));
	quote_len += p->proto == IPPROTO_TCP ? sizeof(struct tcphdr) :
					       sizeof(struct udphdr);
	if (p->l3_len < quote_len)
		quote_len = p->l3_len;
	if (quote_len < sizeof(struct iphdr) || quote_len > ICMP_QUOTE_MAX)
		return ICMP_NOT_SENT;

	if (p->l3_off && bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, p->l3_off, body.quote, quote_len) < 0)
		return TC_ACT_SHOT;

	body.icmp.type = err >> 24;
	body.icmp.code = err >> 16;
	body.icmp.un.frag.mtu = bpf_htons((__u16)err);
	body.icmp.checksum = csum_buf(&body, sizeof(body));

	hdr.ip.version = 4;
	hdr.ip.ihl = sizeof(struct iphdr) / 4;
	hdr.ip.tot_len = bpf_htons(sizeof(hdr) + quote_len);
	hdr.ip.ttl = ICMP_ERR_TTL;
	hdr.ip.protocol = IPPROTO_ICMP;
	hdr.ip.saddr = saddr;
	hdr.ip.daddr = p->saddr;
	hdr.ip.check = csum_buf(&hdr.ip, sizeof(hdr.ip));
	hdr.icmp = body.icmp;

	return icmp_send_back(skb, p->l3_off, quote_len, &eth, &hdr,
			      sizeof(hdr));
}

/*
 * icmp_reply - answer @p, the packet @skb, with the ICMP error @err
 * (ICMP_ERR), if the kernel would send it: to a packet it would answer
 * (icmp_link_answerable, icmp_src_answerable), within its rate limits
 * (icmp_rl_allow). Then icmp_build turns the packet into the error, from
 * the packet's destination, or, for a @reject (in place of kube-proxy's),
 * from the address the kernel's would come from (icmp_reject_src). The
 * errors of forwarding by redirect (nat.h) keep the frontend: kube-proxy
 * DNATs before the kernel forwards, and conntrack rewrites the outer
 * source of an error about an established flow back to the frontend
 * (nf_nat_icmp_reply_translation).
 *
 * Returns TC_ACT_REDIRECT; ICMP_NOT_SENT for a packet the kernel would not
 * answer, an error over its rate limits, or a packet icmp_build cannot
 * quote; or TC_ACT_SHOT if a helper failed, or @p is a later fragment:
 * there is no ICMP error about one (RFC 1122 3.2.2), whose first
 * fragment got it, and it has no L4 header to quote.
 */
static __always_inline int
icmp_reply(struct __sk_buff *skb, const struct pkt4 *p, __u32 err, bool reject)
{
	union v6addr dst = {};
	__be32 saddr = p->daddr;

	if (p->frag_later)
		return TC_ACT_SHOT;
	if (!icmp_link_answerable(skb) || !icmp_src_answerable(p->saddr))
		return ICMP_NOT_SENT;
	dst.p[0] = p->saddr;
	if (!icmp_rl_allow(&dst, false, err >> 24, err >> 16, explain_dry(p)))
		return ICMP_NOT_SENT;
	if (reject)
		saddr = icmp_reject_src(skb, p->saddr, p->daddr, p->l3_off);
	return icmp_build(skb, p, err, saddr);
}

/*
 * reply_port_unreachable - answer @p, a packet to a service with no
 * backends or to a ClusterIP's unserved port, with the ICMP port
 * unreachable of kube-proxy's reject (icmp_reply; ICMP_NOT_SENT too).
 */
static __always_inline int reply_port_unreachable(struct __sk_buff *skb,
						  const struct pkt4 *p)
{
	return icmp_reply(skb, p,
			  ICMP_ERR(ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0),
			  true);
}

#endif /* SLUICE_ICMP_H */
