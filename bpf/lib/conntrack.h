/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-packet connection tracking for translated flows.
 *
 * A flow from client C to VIP V translated to backend B has two entries in
 * sluice_conntrack: CT_FORWARD keyed <C -> V> naming B, so every packet of
 * the flow goes to the same backend; and CT_REVERSE keyed <B -> C> naming
 * V, so replies get V back as their source. Entries idle for longer than
 * their protocol's timeout count as absent; the LRU map reclaims them.
 */
#ifndef SLUICE_CONNTRACK_H
#define SLUICE_CONNTRACK_H

#include "common.h"
#include "maps.h"
#include "parse.h"

static __always_inline __u64 ct_timeout(__u8 proto)
{
	return proto == IPPROTO_TCP ? ct_timeout_tcp_ns : ct_timeout_udp_ns;
}

/* ct_key_of - the conntrack key of @p's packet as it is on the wire. */
static __always_inline void ct_key_of(struct ct4_key *key,
				      const struct pkt4 *p, __u8 dir)
{
	key->saddr = p->saddr;
	key->daddr = p->daddr;
	key->sport = p->sport;
	key->dport = p->dport;
	key->proto = p->proto;
	key->dir = dir;
	key->pad = 0;
}

/*
 * ct_lookup - a live entry for @key, with its last_seen refreshed to @now,
 * or NULL if there is none or it has expired.
 */
static __always_inline struct ct4_entry *ct_lookup(const struct ct4_key *key,
						   __u64 now)
{
	struct ct4_entry *e = bpf_map_lookup_elem(&sluice_conntrack, key);

	if (!e)
		return NULL;
	if (now - e->last_seen > ct_timeout(key->proto))
		return NULL;
	e->last_seen = now;
	return e;
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

	ct_key_of(&key, p, CT_FORWARD);
	e.nat_addr = be->addr;
	e.nat_port = be->port;
	err = bpf_map_update_elem(&sluice_conntrack, &key, &e, BPF_ANY);
	if (err < 0)
		return err;

	key.saddr = be->addr;
	key.sport = be->port;
	key.daddr = p->saddr;
	key.dport = p->sport;
	key.dir = CT_REVERSE;
	e.nat_addr = p->daddr;
	e.nat_port = p->dport;
	return bpf_map_update_elem(&sluice_conntrack, &key, &e, BPF_ANY);
}

/*
 * ct_refresh_reverse - keep the reply entry of an existing forward flow
 * alive, re-creating it if the LRU evicted it or it expired while the
 * client kept sending.
 */
static __always_inline int ct_refresh_reverse(const struct pkt4 *p,
					      const struct ct4_entry *fwd,
					      __u64 now)
{
	struct ct4_key key = {
		.saddr = fwd->nat_addr,
		.daddr = p->saddr,
		.sport = fwd->nat_port,
		.dport = p->sport,
		.proto = p->proto,
		.dir = CT_REVERSE,
	};
	struct ct4_entry *rev = ct_lookup(&key, now);
	struct ct4_entry e = {
		.last_seen = now,
		.nat_addr = p->daddr,
		.nat_port = p->dport,
		.backend_id = fwd->backend_id,
		.rev_nat_id = fwd->rev_nat_id,
	};

	if (rev && rev->nat_addr == p->daddr && rev->nat_port == p->dport)
		return 0;
	return bpf_map_update_elem(&sluice_conntrack, &key, &e, BPF_ANY);
}

#endif /* SLUICE_CONNTRACK_H */
