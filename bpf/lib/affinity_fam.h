/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent half of affinity.h, a template (family.h) that
 * affinity.h includes once per family: aff_select and the rest over
 * sluice_session_affinity_v1, aff_select6 ... over sluice6_affinity_v1.
 * No include guard, on purpose.
 */
/*
 * aff_key - the affinity key of client @client (enum affinity_client
 * @kind) of frontend <@vip, @port, @proto> in @scope (enum lb_scope, the
 * scope whose master serves the client): every field set, padding
 * included (it is hashed).
 */
static __always_inline void FN(aff_key)(FAM(aff_key_t) *key,
					FAM(aff_client_t) client, __u32 kind,
					FAM(addr_t) vip, __be16 port,
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
static __always_inline FAM(lb_backend) *
FN(aff_lookup)(const FAM(aff_key_t) *key, const struct lb4_service *svc,
	       __u64 now, __u32 *backend_id, __u16 *slot)
{
	FAM(aff_t) *a;
	FAM(lb_backend) *be;
	__u32 id;
	__u16 sl;

	a = bpf_map_lookup_elem(&FAM(aff_map), key);
	if (!a || !aff_alive(READ_ONCE(a->expires), now))
		return NULL;
	/* Read once: the agent may move the entry to another slot
	 * (sluice_aff_fix) while it is read; a slot and id that do not
	 * belong together fail the check.
	 */
	id = READ_ONCE(a->backend_id);
	sl = READ_ONCE(a->slot);
	be = FN(slot_still_names)(key->master.vip, key->master.port,
				  key->master.proto, svc, sl, id, a->addr,
				  a->port);
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
static __always_inline FAM(lb_backend) *
FN(aff_select)(const FAM(aff_key_t) *key, const struct lb4_service *svc,
	       __u64 now, __u32 *backend_id, __u16 *slot)
{
	FAM(lb_backend) *be;

	if (svc->flags & SVC_F_AFFINITY) {
		be = FN(aff_lookup)(key, svc, now, backend_id, slot);
		if (be)
			return be;
	}
	return FN(select_backend_slot)(key->master.vip, key->master.port,
				       key->master.proto, svc, backend_id,
				       slot);
}

/*
 * aff_store - keep the client of @key on backend @be (@backend_id, from
 * @slot) until @expires. An entry that names the backend already is
 * refreshed in place (forward only); any other is replaced.
 */
static __always_inline int FN(aff_store)(const FAM(aff_key_t) *key,
					 const FAM(lb_backend) *be,
					 __u32 backend_id, __u16 slot,
					 __u64 expires)
{
	FAM(aff_t) v = {};
	FAM(aff_t) *a;
	__u64 seen;

	a = bpf_map_lookup_elem(&FAM(aff_map), key);
	if (a && READ_ONCE(a->backend_id) == backend_id &&
	    READ_ONCE(a->slot) == slot && FAM(addr_eq)(a->addr, be->addr) &&
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
	return bpf_map_update_elem(&FAM(aff_map), key, &v, BPF_ANY);
}

/*
 * aff_remember - a new connection of the client of @key to frontend @svc
 * was sent to backend @be (@backend_id, from @slot) at @now: if @svc has
 * affinity, the client stays there until the frontend's timeout passes
 * without another (aff_store).
 */
static __always_inline void FN(aff_remember)(const FAM(aff_key_t) *key,
					     const struct lb4_service *svc,
					     const FAM(lb_backend) *be,
					     __u32 backend_id, __u16 slot,
					     __u64 now)
{
	if (svc->flags & SVC_F_AFFINITY)
		FN(aff_store)(key, be, backend_id, slot, aff_expiry(svc, now));
}
