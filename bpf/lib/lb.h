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
 *
 * Each family has its own maps: the functions over them are written once,
 * in lb_fam.h, and built for both (family.h): lookup_service over the
 * IPv4 maps, lookup_service6 over the IPv6 ones, and so on.
 */
#ifndef SLUICE_LB_H
#define SLUICE_LB_H

#include "consts.h"
#include "maps.h"
#include "family.h"

#ifndef READ_ONCE
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#endif

/* random_slot - a slot in 1..@count (@count >= 1), uniformly. */
static __always_inline __u16 random_slot(__u32 count)
{
	/* Slots are 16 bits wide: a service has at most 65535 backends. */
	if (count > 0xffff)
		count = 0xffff;
	return (__u16)(bpf_get_prandom_u32() % count + 1);
}

#define LB_FAMILY 4
#include "lb_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "lb_fam.h"
#undef LB_FAMILY

#endif /* SLUICE_LB_H */
