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
 *
 * sluice_aff_fix does the same kind of upkeep for session affinity
 * (lib/affinity.h): the entries of backends that left a frontend, or moved
 * to another of its slots, are deleted or moved in one pass.
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

/*
 * aff_fix_one - apply sluice_aff_fix to the session affinity entry @a of
 * a frontend (under @key): move it to the slot its backend now has, or
 * delete it (the backend left the frontend, or the frontend its
 * affinity).
 *
 * A move writes the slot in place: a reader that sees the new slot with
 * the old backend, or the other way round, finds them not to belong
 * together and selects again (affinity.h). A datapath that replaces the
 * entry meanwhile (a fresh selection) may lose its entry to a delete:
 * that client selects again once.
 */
static long aff_fix_one(void *map, const struct lb4_affinity_key *key,
			struct lb4_affinity *a, struct affinity_fix_args *args)
{
	struct affinity_fix_key fk = {
		.master = key->master,
		.backend_id = READ_ONCE(a->backend_id),
	};
	__u32 *slot = bpf_map_lookup_elem(&sluice_aff_fix_v1, &fk);

	if (!slot) {
		fk.backend_id = 0;
		slot = bpf_map_lookup_elem(&sluice_aff_fix_v1, &fk);
		if (!slot)
			return 0;
	}
	if (*slot && fk.backend_id) {
		a->slot = (__u16)*slot;
		args->moved++;
		return 0;
	}
	if (!bpf_map_delete_elem(map, key))
		args->deleted++;
	return 0;
}

/*
 * sluice_aff_fix - one pass over sluice_session_affinity for the
 * frontends and backends in sluice_aff_fix: the agent's upkeep when
 * backends leave a frontend with session affinity or move to another of
 * its slots (pkg/reconciler), which would otherwise end or revive
 * clients' affinity wrongly.
 */
SEC("syscall")
int sluice_aff_fix(struct affinity_fix_args *args)
{
	struct affinity_fix_args a = {};

	bpf_for_each_map_elem(&sluice_session_affinity_v1, aff_fix_one, &a, 0);
	*args = a;
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
