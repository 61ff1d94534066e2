/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent half of ctgc.c (its design is there), a template
 * (family.h) that ctgc.c includes once per family: ct_gc_run over the
 * IPv4 conntrack maps, ct_gc_run6 over the IPv6 ones. No include guard,
 * on purpose.
 */
static long FN(ct_gc_one)(void *map, const FAM(ct_key_t) *key,
			  FAM(ct_entry_t) *e, struct ct_gc_args *a)
{
	__u64 seen = READ_ONCE(e->expires);
	FAM(ct_key_t) pkey;

	if (ct_alive(seen, a->now)) {
		a->live++;
		if (!(READ_ONCE(e->flags) & CT_F_REPLIED))
			a->pending++;
		return 0;
	}
	if (FN(ct_peer)(key, e, a->now, &pkey)) {
		a->kept++;
		a->live++;
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

/* ct_gc_run - one pass of @a's mode (collect or flush) over the maps. */
static __always_inline void FN(ct_gc_run)(struct ct_gc_args *a)
{
	if (a->flush) {
		bpf_for_each_map_elem(FAM(ct_est), FN(ct_flush_est), a, 0);
		bpf_for_each_map_elem(FAM(ct_new), FN(ct_flush_new), a, 0);
	} else {
		bpf_for_each_map_elem(FAM(ct_est), FN(ct_gc_one), a, 0);
	}
}
