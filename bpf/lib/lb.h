/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Service lookup and backend selection, shared by the socket and tc paths.
 *
 * A frontend <vip, port, proto> owns slot 0 (the master: backend count and
 * service id) and slots 1..count (backend ids), in each of its scopes (a
 * master knows its own, lb4_service.scope). Selection is uniform: a random
 * slot in 1..count. The agent writes backends before slots and slot 0
 * last, and shrinks in the reverse order, so a slot or backend that is
 * missing is a reader racing a shrink: selection then reads the service
 * again (select_backend_slot) rather than fail.
 *
 * Also here, the lookups that decide about a packet before selection: a
 * frontend's loadBalancerSourceRanges, the service IPs and the node's
 * CIDRs (cluster, service).
 */
#ifndef SLUICE_LB_H
#define SLUICE_LB_H

#include "consts.h"
#include "maps.h"

/*
 * lookup_service_scope - the master entry of a frontend in @scope (enum
 * lb_scope), or NULL.
 */
static __always_inline struct lb4_service *
lookup_service_scope(__be32 vip, __be16 port, __u8 proto, __u8 scope)
{
	struct lb4_key key = {
		.vip = vip,
		.port = port,
		.proto = proto,
		.scope = scope,
		.slot = 0,
	};

	return bpf_map_lookup_elem(&sluice_services_v1, &key);
}

/*
 * lookup_service - the master entry of a frontend (its default scope), or
 * NULL if not a service.
 */
static __always_inline struct lb4_service *
lookup_service(__be32 vip, __be16 port, __u8 proto)
{
	return lookup_service_scope(vip, port, proto, LB_SCOPE_DEFAULT);
}

static __always_inline struct lb4_backend *lookup_backend(__u32 backend_id)
{
	return bpf_map_lookup_elem(&sluice_backends_v1, &backend_id);
}

/* lookup_slot - slot @slot (>= 1) of a frontend in @scope, or NULL. */
static __always_inline struct lb4_service *
lookup_slot(__be32 vip, __be16 port, __u8 proto, __u8 scope, __u16 slot)
{
	struct lb4_key key = {
		.vip = vip,
		.port = port,
		.proto = proto,
		.scope = scope,
		.slot = slot,
	};

	return bpf_map_lookup_elem(&sluice_services_v1, &key);
}

/*
 * slot_backend - the backend slot @slot (>= 1) of a frontend in @scope
 * names, with its id in @backend_id; NULL if the slot or the backend is
 * missing.
 */
static __always_inline struct lb4_backend *slot_backend(__be32 vip, __be16 port,
							__u8 proto, __u8 scope,
							__u16 slot,
							__u32 *backend_id)
{
	struct lb4_service *s = lookup_slot(vip, port, proto, scope, slot);

	if (!s)
		return NULL;
	*backend_id = s->backend_id;
	return lookup_backend(s->backend_id);
}

/* random_slot - a slot in 1..@count (@count >= 1), uniformly. */
static __always_inline __u16 random_slot(__u32 count)
{
	/* Slots are 16 bits wide: a service has at most 65535 backends. */
	if (count > 0xffff)
		count = 0xffff;
	return (__u16)(bpf_get_prandom_u32() % count + 1);
}

/*
 * select_backend_slot - pick one of a service's backends uniformly at random.
 * @master: the service's slot 0 (in the scope that serves the client), as
 * the caller read it.
 * @backend_id: set to the id of the chosen backend.
 * @slot: set to the slot that named it.
 *
 * The count the caller read may be stale: the agent shrinks a service by
 * writing the master with the new count, then deleting the slots above it
 * (and later the backends nobody names), so a reader between those writes
 * can pick a slot, or a backend, that is gone. It then reads the master
 * again and picks once more; should that miss too (the agent changed the
 * service again in between), it takes slot 1, which exists whenever the
 * count is not 0.
 *
 * Returns the backend, or NULL if the service has no backends now (or its
 * slots name backends that do not exist, which the agent never writes).
 */
static __always_inline struct lb4_backend *
select_backend_slot(__be32 vip, __be16 port, __u8 proto,
		    const struct lb4_service *master, __u32 *backend_id,
		    __u16 *slot)
{
	struct lb4_backend *be;
	__u32 count = master->count;
	__u8 scope = master->scope;

	if (count == 0)
		return NULL;
	*slot = random_slot(count);
	be = slot_backend(vip, port, proto, scope, *slot, backend_id);
	if (be)
		return be;

	master = lookup_service_scope(vip, port, proto, scope);
	if (!master || master->count == 0)
		return NULL;
	*slot = random_slot(master->count);
	be = slot_backend(vip, port, proto, scope, *slot, backend_id);
	if (be)
		return be;
	*slot = 1;
	return slot_backend(vip, port, proto, scope, 1, backend_id);
}

/*
 * slot_still_names - the backend that slot @slot of a frontend named when
 * a client was last sent there (id @backend_id, then at <@be_addr,
 * @be_port>), if that is still one of the frontend's backends: the slot is
 * within @master's count and still names the id, and the id still names
 * that address and port. NULL otherwise: the client must select again.
 *
 * The id alone is not enough: once a backend leaves its frontends its id
 * is freed and, after a quarantine, handed out again, possibly for another
 * service's backend. Say a client's entry names id 7, 10.0.1.5:53 of the
 * DNS service; the endpoint goes away, and later id 7 is reused for
 * 10.0.9.9:8125 of a metrics service. Followed blindly, the client's DNS
 * queries would go to the metrics backend. Nor is the id's address: a
 * backend that left this frontend may still serve another one (the same
 * endpoint behind another Service), and keep its id.
 */
static __always_inline struct lb4_backend *
slot_still_names(__be32 vip, __be16 port, __u8 proto,
		 const struct lb4_service *master, __u16 slot, __u32 backend_id,
		 __be32 be_addr, __be16 be_port)
{
	struct lb4_service *s;
	struct lb4_backend *be;

	if (slot == 0 || slot > master->count)
		return NULL;
	s = lookup_slot(vip, port, proto, master->scope, slot);
	if (!s || s->backend_id != backend_id)
		return NULL;
	be = lookup_backend(backend_id);
	if (!be || be->addr != be_addr || be->port != be_port)
		return NULL;
	return be;
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

/* service_ip - whether @addr is a ClusterIP (sluice_service_ips). */
static __always_inline bool service_ip(__be32 addr)
{
	return bpf_map_lookup_elem(&sluice_service_ips_v1, &addr) != NULL;
}

/*
 * node_cidr - whether @addr is in one of the node's CIDRs of @kind (enum
 * node_cidr_kind).
 */
static __always_inline bool node_cidr(__be32 addr, __u32 kind)
{
	struct node_cidr_key key = {
		.prefixlen = 32 + 32,
		.kind = kind,
		.addr = addr,
	};

	return bpf_map_lookup_elem(&sluice_node_cidrs_v1, &key) != NULL;
}

#endif /* SLUICE_LB_H */
