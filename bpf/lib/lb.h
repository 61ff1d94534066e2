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

#include "common.h"
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

	return bpf_map_lookup_elem(&sluice_services, &key);
}

static __always_inline struct lb4_backend *lookup_backend(__u32 backend_id)
{
	return bpf_map_lookup_elem(&sluice_backends, &backend_id);
}

/*
 * select_backend - pick one of a service's backends uniformly at random.
 * @master: the service's slot 0; master->count must be non-zero.
 * @backend_id: set to the id of the chosen backend.
 *
 * Returns the backend, or NULL if the chosen slot or backend is missing.
 */
static __always_inline struct lb4_backend *
select_backend(__be32 vip, __be16 port, __u8 proto,
	       const struct lb4_service *master, __u32 *backend_id)
{
	struct lb4_key key = {
		.vip = vip,
		.port = port,
		.proto = proto,
	};
	struct lb4_service *slot;
	__u32 count = master->count;

	if (count == 0)
		return NULL;
	/* Slots are 16 bits wide: a service has at most 65535 backends. */
	if (count > 0xffff)
		count = 0xffff;
	key.slot = (__u16)(bpf_get_prandom_u32() % count + 1);
	slot = bpf_map_lookup_elem(&sluice_services, &key);
	if (!slot)
		return NULL;
	*backend_id = slot->backend_id;
	return lookup_backend(slot->backend_id);
}

#endif /* SLUICE_LB_H */
