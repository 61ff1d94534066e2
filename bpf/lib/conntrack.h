/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-packet connection tracking for translated flows.
 *
 * A flow from client C to VIP V translated to backend B has two entries in
 * sluice_conntrack: CT_FORWARD keyed <C -> V> naming B, so every packet of
 * the flow goes to the same backend; and CT_REVERSE keyed <B -> C> naming
 * V, so replies get V back as their source. Entries idle for longer than
 * their protocol's timeout count as absent; the LRU map reclaims them, and
 * the agent's garbage collector deletes them (Maps.GCConntrack).
 *
 * TCP close: a RST, or a FIN seen in both directions, marks both entries
 * of the flow closed; a closed entry lives ct_timeout_close_ns after its
 * last packet instead of the TCP idle timeout, and a new SYN on its tuple
 * starts a new flow.
 */
#ifndef SLUICE_CONNTRACK_H
#define SLUICE_CONNTRACK_H

#include "consts.h"
#include "config.h"
#include "maps.h"
#include "lb.h"
#include "parse.h"

static __always_inline __u64 ct_timeout(__u8 proto)
{
	return proto == IPPROTO_TCP ? ct_timeout_tcp_ns : ct_timeout_udp_ns;
}

/* ct_key_of - the conntrack key of @p's packet as it is on the wire. */
static __always_inline void ct_key_of(struct ct4_key *key, const struct pkt4 *p,
				      __u8 dir)
{
	key->saddr = p->saddr;
	key->daddr = p->daddr;
	key->sport = p->sport;
	key->dport = p->dport;
	key->proto = p->proto;
	key->dir = dir;
	key->pad = 0;
}

static __always_inline bool ct_closed(const struct ct4_entry *e)
{
	return (e->flags & CT_F_RST) ||
	       (e->flags & (CT_F_FIN_FWD | CT_F_FIN_REV)) ==
		       (CT_F_FIN_FWD | CT_F_FIN_REV);
}

/*
 * ct_fwd_usable - whether the live forward entry @fwd still decides where
 * @p, a packet of its flow, goes. tc and XDP both follow this rule, so a
 * flow may move between them.
 *
 * A UDP "flow" has no end: once its backend is gone (or its id reused for
 * another address), it is re-balanced rather than sent into the void. TCP
 * keeps its backend, as kube-proxy keeps established connections; but a new
 * connection (a pure SYN) on the tuple of a closed one starts afresh.
 */
static __always_inline bool ct_fwd_usable(const struct ct4_entry *fwd,
					  const struct pkt4 *p)
{
	const struct lb4_backend *be;

	if (p->proto == IPPROTO_UDP) {
		be = lookup_backend(fwd->backend_id);
		return be && be->addr == fwd->nat_addr &&
		       be->port == fwd->nat_port;
	}
	if (p->proto == IPPROTO_TCP && ct_closed(fwd) &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return false;
	return true;
}

/* ct_expired - whether @e (of protocol @proto) is dead at @now. */
static __always_inline bool ct_expired(const struct ct4_entry *e, __u8 proto,
				       __u64 now)
{
	__u64 life = ct_timeout(proto);

	if (proto == IPPROTO_TCP && ct_closed(e))
		life = ct_timeout_close_ns;
	return now - e->last_seen > life;
}

/*
 * ct_lookup - a live entry for @key, with its last_seen refreshed to @now,
 * or NULL if there is none or it has expired.
 */
static __always_inline struct ct4_entry *ct_lookup(const struct ct4_key *key,
						   __u64 now)
{
	struct ct4_entry *e = bpf_map_lookup_elem(&sluice_conntrack_v1, key);

	if (!e)
		return NULL;
	if (ct_expired(e, key->proto, now))
		return NULL;
	e->last_seen = now;
	return e;
}

/*
 * ct_peer_key - the key of the other direction's entry of the flow @e
 * (found under @key) belongs to.
 */
static __always_inline void ct_peer_key(struct ct4_key *peer,
					const struct ct4_key *key,
					const struct ct4_entry *e)
{
	bool snat = e->flags & CT_F_SNAT;

	peer->proto = key->proto;
	peer->pad = 0;
	if (key->dir == CT_FORWARD) {
		/* <C -> F> names B (and N:sp): the reply, <B -> N:sp or C>. */
		peer->dir = CT_REVERSE;
		peer->saddr = e->nat_addr;
		peer->sport = e->nat_port;
		peer->daddr = snat ? e->snat_addr : key->saddr;
		peer->dport = snat ? e->snat_port : key->sport;
	} else {
		/* <B -> X> names F (and C): the request is <C -> F>. */
		peer->dir = CT_FORWARD;
		peer->saddr = snat ? e->snat_addr : key->daddr;
		peer->sport = snat ? e->snat_port : key->dport;
		peer->daddr = e->nat_addr;
		peer->dport = e->nat_port;
	}
}

/*
 * ct_track_tcp - note a FIN or RST of @p (a packet of the flow @e, found
 * under @key) in both of the flow's entries.
 */
static __always_inline void ct_track_tcp(const struct pkt4 *p,
					 const struct ct4_key *key,
					 struct ct4_entry *e)
{
	struct ct4_key peer = {};
	struct ct4_entry *pe;
	__u8 bits;

	if (p->proto != IPPROTO_TCP ||
	    !(p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
		return;
	if (p->tcp_flags & TCP_FLAG_RST)
		bits = CT_F_RST;
	else
		bits = key->dir == CT_FORWARD ? CT_F_FIN_FWD : CT_F_FIN_REV;
	e->flags |= bits;
	ct_peer_key(&peer, key, e);
	pe = bpf_map_lookup_elem(&sluice_conntrack_v1, &peer);
	if (pe)
		pe->flags |= bits;
}

/*
 * ct_create - record a flow from @p's client to the service, translated to
 * backend @be (@backend_id) of service @rev_nat_id: both directions.
 *
 * Returns 0 or the first map update error.
 */
static __always_inline int ct_create(const struct pkt4 *p,
				     const struct lb4_backend *be,
				     __u32 backend_id, __u32 rev_nat_id,
				     __u64 now)
{
	struct ct4_key key = {};
	struct ct4_entry e = {
		.last_seen = now,
		.backend_id = backend_id,
		.rev_nat_id = rev_nat_id,
	};
	int err;

	/* Reverse first: a reply never finds a forward entry without it. */
	key.saddr = be->addr;
	key.sport = be->port;
	key.daddr = p->saddr;
	key.dport = p->sport;
	key.proto = p->proto;
	key.dir = CT_REVERSE;
	e.nat_addr = p->daddr;
	e.nat_port = p->dport;
	err = bpf_map_update_elem(&sluice_conntrack_v1, &key, &e, BPF_ANY);
	if (err < 0)
		return err;

	ct_key_of(&key, p, CT_FORWARD);
	e.nat_addr = be->addr;
	e.nat_port = be->port;
	return bpf_map_update_elem(&sluice_conntrack_v1, &key, &e, BPF_ANY);
}

/*
 * ct_create_snat - record a flow from @p's client to an external frontend,
 * translated to remote backend @be and source-NATed to @node: reserve a
 * source port by inserting the reply entry <be -> node:port> with
 * BPF_NOEXIST (so no two flows ever share a tuple), trying up to
 * SNAT_TRIES ports from a random start in [snat_port_min, snat_port_max],
 * and reclaiming an expired entry in the way. Then record the forward
 * entry.
 *
 * Returns the reserved port (network order) in @port, and 0; 1 if every
 * try found a live flow; or a negative map update error.
 */
#define SNAT_TRIES 32

static __always_inline int ct_create_snat(const struct pkt4 *p,
					  const struct lb4_backend *be,
					  __u32 backend_id, __u32 rev_nat_id,
					  __be32 node, __u64 now, __be16 *port)
{
	struct ct4_key key = {
		.saddr = be->addr,
		.sport = be->port,
		.daddr = node,
		.proto = p->proto,
		.dir = CT_REVERSE,
	};
	struct ct4_entry e = {
		.last_seen = now,
		.nat_addr = p->daddr,
		.nat_port = p->dport,
		.flags = CT_F_SNAT,
		.backend_id = backend_id,
		.rev_nat_id = rev_nat_id,
		.snat_addr = p->saddr,
		.snat_port = p->sport,
	};
	__u32 lo = snat_port_min, hi = snat_port_max, range, start, i;
	struct ct4_entry *old;
	bool ok = false;

	if (hi < lo)
		return 1;
	range = hi - lo + 1;
	start = bpf_get_prandom_u32();
	for (i = 0; i < SNAT_TRIES; i++) {
		key.dport = bpf_htons((__u16)(lo + (start + i) % range));
		if (!bpf_map_update_elem(&sluice_conntrack_v1, &key, &e,
					 BPF_NOEXIST)) {
			ok = true;
			break;
		}
		old = bpf_map_lookup_elem(&sluice_conntrack_v1, &key);
		if (old && ct_expired(old, p->proto, now)) {
			bpf_map_delete_elem(&sluice_conntrack_v1, &key);
			if (!bpf_map_update_elem(&sluice_conntrack_v1, &key, &e,
						 BPF_NOEXIST)) {
				ok = true;
				break;
			}
		}
	}
	if (!ok)
		return 1;
	*port = key.dport;

	ct_key_of(&key, p, CT_FORWARD);
	e.nat_addr = be->addr;
	e.nat_port = be->port;
	e.snat_addr = node;
	e.snat_port = *port;
	return bpf_map_update_elem(&sluice_conntrack_v1, &key, &e, BPF_ANY);
}

/*
 * ct_refresh_reverse - keep the reply entry of an existing forward flow
 * alive, re-creating it if the LRU evicted it or it expired while the
 * client kept sending.
 */
static __always_inline int
ct_refresh_reverse(const struct pkt4 *p, const struct ct4_entry *fwd, __u64 now)
{
	struct ct4_key key = {
		.saddr = fwd->nat_addr,
		.daddr = p->saddr,
		.sport = fwd->nat_port,
		.dport = p->sport,
		.proto = p->proto,
		.dir = CT_REVERSE,
	};
	struct ct4_entry *rev;
	struct ct4_entry e = {
		.last_seen = now,
		.nat_addr = p->daddr,
		.nat_port = p->dport,
		.flags = fwd->flags,
		.backend_id = fwd->backend_id,
		.rev_nat_id = fwd->rev_nat_id,
	};

	if (fwd->flags & CT_F_SNAT) {
		key.daddr = fwd->snat_addr;
		key.dport = fwd->snat_port;
		e.snat_addr = p->saddr;
		e.snat_port = p->sport;
	}
	rev = ct_lookup(&key, now);
	if (rev && rev->nat_addr == p->daddr && rev->nat_port == p->dport &&
	    rev->snat_addr == e.snat_addr && rev->snat_port == e.snat_port)
		return 0;
	/* An SNAT port whose reservation lapsed may belong to another flow
	 * by now: take it back only if it is still free.
	 */
	return bpf_map_update_elem(&sluice_conntrack_v1, &key, &e,
				   (fwd->flags & CT_F_SNAT) ? BPF_NOEXIST :
							      BPF_ANY);
}

#endif /* SLUICE_CONNTRACK_H */
