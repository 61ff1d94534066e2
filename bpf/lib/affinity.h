/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Session affinity (Kubernetes sessionAffinity: ClientIP), shared by the
 * socket, tc and XDP paths.
 *
 * kube-proxy keeps, for each endpoint of a ClientIP Service port, a set of
 * client addresses that time out after the Service's timeoutSeconds. A new
 * connection from an address in an endpoint's set goes to that endpoint,
 * and every new connection puts its client in the set of the endpoint it
 * went to, restarting the timeout; packets of established connections
 * touch nothing (its rules only see a connection's first packet). Here a
 * frontend flagged SVC_F_AFFINITY keeps one entry per client in
 * sluice_session_affinity: a new connection takes the entry's backend if
 * the entry is alive and its backend is still one of the frontend's
 * (aff_select, before the random pick), and once the connection is sent,
 * the entry names the backend it went to and expires a timeout from now
 * (aff_remember). So the same client reaches the same backend until it
 * makes no new connection for the timeout, and a backend that leaves the
 * frontend ends the affinity to it at once (slot_still_names): the
 * client's next connection selects afresh among those left.
 *
 * A client is its address as the packet arrived (tc, XDP: before any
 * source NAT), or on the socket path its network namespace: every socket
 * of a pod (one address) or of the node (whose processes kube-proxy sees
 * under the node's address) is one client (Cilium does the same).
 *
 * Entries are per frontend (its master key, scope included), where
 * kube-proxy's sets are per Service port and shared by its ClusterIP,
 * NodePort, ExternalIP and LoadBalancer frontends: a client that reaches
 * one Service port through two of them may be sent to two backends.
 *
 * Expiry is absolute (bpf_ktime_get_ns()), compared signed and moved
 * forward only, by compare-and-swap, as conntrack's (conntrack.h): a CPU
 * whose clock reading predates another CPU's refresh never takes the entry
 * for dead, nor moves it back.
 */
#ifndef SLUICE_AFFINITY_H
#define SLUICE_AFFINITY_H

#include "consts.h"
#include "maps.h"
#include "lb.h"

#ifndef READ_ONCE
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#endif

/* aff_alive - whether an entry expiring at @expires is alive at @now. */
static __always_inline bool aff_alive(__u64 expires, __u64 now)
{
	return (__s64)(expires - now) > 0;
}

/*
 * aff_key - the affinity key of client @client (enum affinity_client
 * @kind) of frontend <@vip, @port, @proto> in @scope (enum lb_scope, the
 * scope whose master serves the client): every field set, padding
 * included (it is hashed).
 */
static __always_inline void aff_key(struct lb4_affinity_key *key, __u64 client,
				    __u32 kind, __be32 vip, __be16 port,
				    __u8 proto, __u8 scope)
{
	key->client = client;
	key->master.vip = vip;
	key->master.port = port;
	key->master.proto = proto;
	key->master.scope = scope;
	key->master.slot = 0;
	key->master.pad1 = 0;
	key->kind = kind;
}

/*
 * aff_lookup - the backend the client of @key is stuck to, if its entry
 * is alive at @now and the backend is still one of frontend @svc's
 * (slot_still_names); its id and slot in @backend_id and @slot. NULL
 * otherwise.
 */
static __always_inline struct lb4_backend *
aff_lookup(const struct lb4_affinity_key *key, const struct lb4_service *svc,
	   __u64 now, __u32 *backend_id, __u16 *slot)
{
	struct lb4_affinity *a;
	struct lb4_backend *be;
	__u32 id;
	__u16 sl;

	a = bpf_map_lookup_elem(&sluice_session_affinity_v1, key);
	if (!a || !aff_alive(READ_ONCE(a->expires), now))
		return NULL;
	/* Read once: the agent may move the entry to another slot
	 * (sluice_aff_fix) while it is read; a slot and id that do not
	 * belong together fail the check.
	 */
	id = READ_ONCE(a->backend_id);
	sl = READ_ONCE(a->slot);
	be = slot_still_names(key->master.vip, key->master.port,
			      key->master.proto, svc, sl, id, a->addr, a->port);
	if (!be)
		return NULL;
	*backend_id = id;
	*slot = sl;
	return be;
}

/*
 * aff_select - the backend for a new connection of the client of @key to
 * frontend @svc (slot 0, as the caller read it): the one the client is
 * stuck to (aff_lookup) if @svc has affinity, else one picked at random
 * (select_backend_slot). Its id and slot in @backend_id and @slot.
 */
static __always_inline struct lb4_backend *
aff_select(const struct lb4_affinity_key *key, const struct lb4_service *svc,
	   __u64 now, __u32 *backend_id, __u16 *slot)
{
	struct lb4_backend *be;

	if (svc->flags & SVC_F_AFFINITY) {
		be = aff_lookup(key, svc, now, backend_id, slot);
		if (be)
			return be;
	}
	return select_backend_slot(key->master.vip, key->master.port,
				   key->master.proto, svc, backend_id, slot);
}

/*
 * aff_store - keep the client of @key on backend @be (@backend_id, from
 * @slot) until @expires. An entry that names the backend already is
 * refreshed in place (forward only); any other is replaced.
 */
static __always_inline int aff_store(const struct lb4_affinity_key *key,
				     const struct lb4_backend *be,
				     __u32 backend_id, __u16 slot,
				     __u64 expires)
{
	struct lb4_affinity v = {};
	struct lb4_affinity *a;
	__u64 seen;

	a = bpf_map_lookup_elem(&sluice_session_affinity_v1, key);
	if (a && READ_ONCE(a->backend_id) == backend_id &&
	    READ_ONCE(a->slot) == slot && a->addr == be->addr &&
	    a->port == be->port) {
		/* Another CPU's refresh may be further ahead: keep it. */
		seen = READ_ONCE(a->expires);
		if ((__s64)(expires - seen) > 0)
			__sync_val_compare_and_swap(&a->expires, seen, expires);
		return 0;
	}
	v.expires = expires;
	v.backend_id = backend_id;
	v.addr = be->addr;
	v.port = be->port;
	v.slot = slot;
	/* If this fails (no memory) the connection still goes; only the
	 * client's next one may go elsewhere.
	 */
	return bpf_map_update_elem(&sluice_session_affinity_v1, key, &v,
				   BPF_ANY);
}

/* aff_expiry - when an entry of frontend @svc refreshed at @now expires. */
static __always_inline __u64 aff_expiry(const struct lb4_service *svc,
					__u64 now)
{
	return now + (__u64)svc->affinity_timeout * NSEC_PER_SEC;
}

/*
 * aff_remember - a new connection of the client of @key to frontend @svc
 * was sent to backend @be (@backend_id, from @slot) at @now: if @svc has
 * affinity, the client stays there until the frontend's timeout passes
 * without another (aff_store).
 */
static __always_inline void aff_remember(const struct lb4_affinity_key *key,
					 const struct lb4_service *svc,
					 const struct lb4_backend *be,
					 __u32 backend_id, __u16 slot,
					 __u64 now)
{
	if (svc->flags & SVC_F_AFFINITY)
		aff_store(key, be, backend_id, slot, aff_expiry(svc, now));
}

#endif /* SLUICE_AFFINITY_H */
