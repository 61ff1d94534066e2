/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent half of ctgc.c (its design is there), a template
 * (family.h) that ctgc.c includes once per family: ct_gc_run over the
 * IPv4 conntrack maps, ct_gc_run6 over the IPv6 ones; the program
 * sluice_aff_fix over sluice_session_affinity, sluice_aff_fix6 over
 * sluice6_affinity. No include guard, on purpose.
 */
/*
 * ct_gc_counted - whether the entry of sluice_conntrack under @key, with
 * @flags, holds a place in the family's half-open count: what ct_uncount
 * would take off (ct_counts), a half-open or answered-but-unassured
 * flow's forward entry (not source-NATed) or a port reservation counted
 * at its insert (CT_F_ADMITTED), neither taken off yet (CT_F_COUNTED).
 * The agent compares the entries a collection leaves so with the count
 * (GCConntrack), alive or kept for a live peer alike: the count holds
 * both until their claimer takes them off.
 */
static __always_inline bool FN(ct_gc_counted)(const FAM(ct_key_t) *key,
					      __u32 flags)
{
	return ct_counts(key->dir, flags);
}

static long FN(ct_gc_one)(void *map, const FAM(ct_key_t) *key,
			  FAM(ct_entry_t) *e, struct ct_gc_args *a)
{
	__u64 seen = READ_ONCE(e->expires);
	FAM(ct_key_t) pkey;
	__u32 flags;

	if (ct_alive(seen, a->now)) {
		a->live++;
		flags = READ_ONCE(e->flags);
		if (!(flags & CT_F_REPLIED))
			a->pending++;
		if (FN(ct_gc_counted)(key, flags))
			a->half_open++;
		return 0;
	}
	if (FN(ct_peer)(key, e, a->now, &pkey)) {
		a->kept++;
		a->live++;
		if (FN(ct_gc_counted)(key, READ_ONCE(e->flags)))
			a->half_open++;
		return 0;
	}
	if (FN(ct_reap)(FAM(ct_est), key, e, seen))
		a->deleted++;
	else
		a->claimed++;
	return 0;
}

/* ct_flush_one - forget @e if it is a flow of a backend in sluice_ct_flush. */
static __always_inline long FN(ct_flush_one)(void *map,
					     const FAM(ct_key_t) *key,
					     FAM(ct_entry_t) *e,
					     struct ct_gc_args *a)
{
	FAM(ct_backend_key_t) b = { .proto = key->proto };

	if (key->dir == CT_FORWARD) {
		b.addr = e->nat_addr;
		b.port = e->nat_port;
	} else {
		b.addr = key->saddr;
		b.port = key->sport;
	}
	if (!bpf_map_lookup_elem(&FAM(ct_flush_map), &b))
		return 0;
	if (FN(ct_reap_now)(map, key, e))
		a->deleted++;
	return 0;
}

static long FN(ct_flush_est)(void *map, const FAM(ct_key_t) *key,
			     FAM(ct_entry_t) *e, struct ct_gc_args *a)
{
	return FN(ct_flush_one)(FAM(ct_est), key, e, a);
}

static long FN(ct_flush_new)(void *map, const FAM(ct_key_t) *key,
			     FAM(ct_entry_t) *e, struct ct_gc_args *a)
{
	return FN(ct_flush_one)(FAM(ct_new), key, e, a);
}

/*
 * ct_gc_run - one pass of @a's mode (collect or flush) over the maps; a
 * collection then sets the LRU's new_live word as ct_new_gate says, but
 * for one while an agent's start holds the word set (CT_GC_HELD after
 * CT_GC_HOLD, ct_new_hold). CT_GC_ADJUST passes over nothing: it adds
 * @a->adjust to the family's half-open count (ct_admit_fix), or clears
 * it if the count's word is missing.
 * A flush goes over sluice_ct_new first: a half-open flow promoted while
 * it runs inserts its established entries before it claims its half-open
 * forward entry, and stops (takes them back) if the flush claimed that
 * first (ct_promote); so either the promotion sees the flush's claim, or
 * its entries are in sluice_conntrack before this pass reaches it. The
 * other way round, a flow promoted between the two passes escaped them.
 */
static __always_inline void FN(ct_gc_run)(struct ct_gc_args *a)
{
	if (a->flush == CT_GC_FLUSH) {
		bpf_for_each_map_elem(FAM(ct_new), FN(ct_flush_new), a, 0);
		bpf_for_each_map_elem(FAM(ct_est), FN(ct_flush_est), a, 0);
		return;
	}
	if (a->flush == CT_GC_HOLD) {
		ct_new_hold(LB_FAMILY == 6);
		return;
	}
	if (a->flush == CT_GC_ADJUST) {
		if (!ct_admit_fix(LB_FAMILY == 6, a->adjust))
			a->adjust = 0;
		return;
	}
	if (a->flush != CT_GC_COLLECT && a->flush != CT_GC_HELD)
		return;
	bpf_for_each_map_elem(FAM(ct_est), FN(ct_gc_one), a, 0);
	if (a->flush == CT_GC_COLLECT)
		ct_new_gate(FAM(ct_new), LB_FAMILY == 6);
}

/* aff_fix_one - aff_fix_apply (ctgc.c) over the family's affinity map. */
static long FN(aff_fix_one)(void *map, const FAM(aff_key_t) *key, FAM(aff_t) *a,
			    struct affinity_fix_args *args)
{
	FAM(aff_fix_key_t)
	fk = {
		.master = key->master,
		.backend_id = READ_ONCE(a->backend_id),
	};

	return aff_fix_apply(&FAM(aff_fix_map), &fk, &fk.backend_id, &a->slot,
			     map, key, args);
}

/*
 * sluice_aff_fix - one pass over the family's session affinity map for
 * the frontends and backends in its fix set (sluice_aff_fix,
 * sluice6_aff_fix): the agent's upkeep when backends leave a frontend
 * with session affinity or move to another of its slots
 * (pkg/reconciler), which would otherwise end or revive clients'
 * affinity wrongly.
 */
SEC("syscall")
int FN(sluice_aff_fix)(struct affinity_fix_args *args)
{
	struct affinity_fix_args a = {};

	bpf_for_each_map_elem(&FAM(aff_map), FN(aff_fix_one), &a, 0);
	*args = a;
	return 0;
}
