// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Conntrack garbage collection and flush, run by the agent
 * (BPF_PROG_TYPE_SYSCALL through BPF_PROG_RUN, see pkg/datapath).
 *
 * sluice_conntrack is a plain hash that nothing evicts: expired entries
 * stay until they are deleted here. Deciding in the kernel, next to the
 * entry, keeps the check and the delete together: an entry is deleted only
 * if a compare-and-swap of the expiry this pass saw to CT_DEAD succeeds
 * (ct_reap), so an entry the datapath refreshed or re-created meanwhile is
 * never lost, as it was when the agent listed expired keys and deleted
 * them later. An expired entry whose flow's other entry is still alive is
 * kept (above all a source-NATed flow's port reservation: deleting it
 * would free a port the flow still sends from).
 *
 * In flush mode the pass forgets the flows of the backends in
 * sluice_ct_flush, in both conntrack maps, in one pass for all of them.
 */
#include "lib/consts.h"
#include "lib/config.h"
#include "lib/maps.h"
#include "lib/conntrack.h"

static long ct_gc_one(void *map, const struct ct4_key *key, struct ct4_entry *e,
		      struct ct_gc_args *a)
{
	__u64 seen = READ_ONCE(e->expires);
	struct ct4_key pkey;

	if (ct_alive(seen, a->now)) {
		a->live++;
		if (!(READ_ONCE(e->flags) & CT_F_REPLIED))
			a->pending++;
		return 0;
	}
	if (ct_peer(key, e, a->now, &pkey)) {
		a->kept++;
		a->live++;
		return 0;
	}
	if (ct_reap(CT_EST, key, e, seen))
		a->deleted++;
	else
		a->claimed++;
	return 0;
}

/* ct_flush_one - forget @e if it is a flow of a backend in sluice_ct_flush. */
static __always_inline long ct_flush_one(void *map, const struct ct4_key *key,
					 struct ct4_entry *e,
					 struct ct_gc_args *a)
{
	struct ct_backend_key b = { .proto = key->proto };

	if (key->dir == CT_FORWARD) {
		b.addr = e->nat_addr;
		b.port = e->nat_port;
	} else {
		b.addr = key->saddr;
		b.port = key->sport;
	}
	if (!bpf_map_lookup_elem(&sluice_ct_flush_v1, &b))
		return 0;
	if (ct_reap_now(map, key, e))
		a->deleted++;
	return 0;
}

static long ct_flush_est(void *map, const struct ct4_key *key,
			 struct ct4_entry *e, struct ct_gc_args *a)
{
	return ct_flush_one(CT_EST, key, e, a);
}

static long ct_flush_new(void *map, const struct ct4_key *key,
			 struct ct4_entry *e, struct ct_gc_args *a)
{
	return ct_flush_one(CT_NEW, key, e, a);
}

SEC("syscall")
int sluice_ct_gc(struct ct_gc_args *args)
{
	struct ct_gc_args a = {
		.flush = args->flush,
		.now = bpf_ktime_get_ns(),
	};

	if (a.flush) {
		bpf_for_each_map_elem(CT_EST, ct_flush_est, &a, 0);
		bpf_for_each_map_elem(CT_NEW, ct_flush_new, &a, 0);
	} else {
		bpf_for_each_map_elem(CT_EST, ct_gc_one, &a, 0);
	}
	*args = a;
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
