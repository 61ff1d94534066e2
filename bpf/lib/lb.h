/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Service lookup and backend selection, shared by the socket and tc paths.
 *
 * A frontend <vip, port, proto> owns slot 0 (the master: backend count and
 * service id) and slots 1..count (backend ids). Selection is uniform: a
 * random slot in 1..count. The agent writes backends before slots and slot 0
 * last, so a slot that names a missing backend is a transient state (or a
 * bug) that callers count and handle without translating.
 */
#ifndef SLUICE_LB_H
#define SLUICE_LB_H

#include "consts.h"
#include "maps.h"

/* lookup_service - the master entry of a frontend, or NULL if not a service. */
static __always_inline struct lb4_service *
lookup_service(__be32 vip, __be16 port, __u8 proto)
{
	struct lb4_key key = {
		.vip = vip,
		.port = port,
		.proto = proto,
		.slot = 0,
	};

	return bpf_map_lookup_elem(&sluice_services_v1, &key);
}

static __always_inline struct lb4_backend *lookup_backend(__u32 backend_id)
{
	return bpf_map_lookup_elem(&sluice_backends_v1, &backend_id);
}

/* lookup_slot - slot @slot (>= 1) of a frontend, or NULL. */
static __always_inline struct lb4_service *lookup_slot(__be32 vip, __be16 port,
						       __u8 proto, __u16 slot)
{
	struct lb4_key key = {
		.vip = vip,
		.port = port,
		.proto = proto,
		.slot = slot,
	};

	return bpf_map_lookup_elem(&sluice_services_v1, &key);
}

/*
 * select_backend_slot - pick one of a service's backends uniformly at random.
 * @master: the service's slot 0; master->count must be non-zero.
 * @backend_id: set to the id of the chosen backend.
 * @slot: set to the slot that named it.
 *
 * Returns the backend, or NULL if the chosen slot or backend is missing.
 */
static __always_inline struct lb4_backend *
select_backend_slot(__be32 vip, __be16 port, __u8 proto,
		    const struct lb4_service *master, __u32 *backend_id,
		    __u16 *slot)
{
	struct lb4_service *s;
	__u32 count = master->count;

	if (count == 0)
		return NULL;
	/* Slots are 16 bits wide: a service has at most 65535 backends. */
	if (count > 0xffff)
		count = 0xffff;
	*slot = (__u16)(bpf_get_prandom_u32() % count + 1);
	s = lookup_slot(vip, port, proto, *slot);
	if (!s)
		return NULL;
	*backend_id = s->backend_id;
	return lookup_backend(s->backend_id);
}

/* select_backend - select_backend_slot for callers that need no slot. */
static __always_inline struct lb4_backend *
select_backend(__be32 vip, __be16 port, __u8 proto,
	       const struct lb4_service *master, __u32 *backend_id)
{
	__u16 slot;

	return select_backend_slot(vip, port, proto, master, backend_id, &slot);
}

#endif /* SLUICE_LB_H */
