/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent half of lb.h, a template (family.h) that lb.h
 * includes once per family: LB_FAMILY 4 defines lookup_service and the
 * rest over the IPv4 maps, LB_FAMILY 6 their twins lookup_service6, ...
 * over the sluice6_* maps. No include guard, on purpose.
 */
/*
 * lookup_service_scope - the master entry of a frontend in @scope (enum
 * lb_scope), or NULL.
 */
static __always_inline struct lb4_service *
FN(lookup_service_scope)(FAM(addr_t) vip, __be16 port, __u8 proto, __u8 scope)
{
	FAM(lb_key)
	key = {
		.vip = vip,
		.port = port,
		.proto = proto,
		.scope = scope,
	};

	return bpf_map_lookup_elem(&FAM(services_map), &key);
}

/*
 * lookup_slot - the entry of slot @slot (1..count) of the frontend whose
 * master is @master, in the slots array (structs.h), or NULL: a slot
 * beyond the count, or a range beyond the array (which the agent never
 * writes). The array's lookup checks the bound.
 */
static __always_inline __u32 *FN(lookup_slot)(const struct lb4_service *master,
					      __u32 slot)
{
	__u32 idx;

	if (slot == 0 || slot > master->count)
		return NULL;
	idx = master->slots_base + slot - 1;
	return bpf_map_lookup_elem(&FAM(slots_map), &idx);
}

/*
 * lookup_service - the master entry of a frontend (its default scope), or
 * NULL if not a service. It may be a retired one (SVC_F_RETIRED: count 0),
 * which only a packet of an established flow follows (tc_ingress,
 * lb6_dnat); XDP passes it to tc as any frontend without backends, and a
 * reply's lookup (fe_external) wants it. A socket looks up
 * lookup_live_service.
 */
static __always_inline struct lb4_service *
FN(lookup_service)(FAM(addr_t) vip, __be16 port, __u8 proto)
{
	return FN(lookup_service_scope)(vip, port, proto, LB_SCOPE_DEFAULT);
}

/*
 * lookup_live_service - lookup_service, but NULL for a retired master: no
 * service for a socket that would start a flow.
 */
static __always_inline struct lb4_service *
FN(lookup_live_service)(FAM(addr_t) vip, __be16 port, __u8 proto)
{
	struct lb4_service *svc = FN(lookup_service)(vip, port, proto);

	if (svc && (svc->flags & SVC_F_RETIRED))
		return NULL;
	return svc;
}

/*
 * lookup_backend - the backend of id @backend_id, or NULL if no backend
 * holds it: out of the array, or an absent entry (no BE_F_PRESENT). Every
 * reader of the backends maps goes through here.
 */
static __always_inline FAM(lb_backend) *FN(lookup_backend)(__u32 backend_id)
{
	FAM(lb_backend) *be =
		bpf_map_lookup_elem(&FAM(backends_map), &backend_id);

	if (!be || !(be->flags & BE_F_PRESENT))
		return NULL;
	return be;
}

/*
 * slot_backend - the backend slot @slot (>= 1) of the frontend whose master
 * is @master names, with its id in @backend_id; NULL if the slot is beyond
 * the count, empty, or names a backend that is missing.
 */
static __always_inline FAM(lb_backend) *
FN(slot_backend)(const struct lb4_service *master, __u32 slot,
		 __u32 *backend_id)
{
	__u32 *id = FN(lookup_slot)(master, slot);

	if (!id)
		return NULL;
	*backend_id = READ_ONCE(*id);
	return FN(lookup_backend)(*backend_id);
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
static __always_inline FAM(lb_backend) *
FN(select_backend_slot)(FAM(addr_t) vip, __be16 port, __u8 proto,
			const struct lb4_service *master, __u32 *backend_id,
			__u16 *slot)
{
	FAM(lb_backend) *be;
	__u32 count = master->count;
	__u8 scope = master->scope;

	if (count == 0)
		return NULL;
	*slot = random_slot(count);
	be = FN(slot_backend)(master, *slot, backend_id);
	if (be)
		return be;

	master = FN(lookup_service_scope)(vip, port, proto, scope);
	if (!master || master->count == 0)
		return NULL;
	*slot = random_slot(master->count);
	be = FN(slot_backend)(master, *slot, backend_id);
	if (be)
		return be;
	*slot = 1;
	return FN(slot_backend)(master, 1, backend_id);
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
static __always_inline FAM(lb_backend) *
FN(slot_still_names)(FAM(addr_t) vip, __be16 port, __u8 proto,
		     const struct lb4_service *master, __u16 slot,
		     __u32 backend_id, FAM(addr_t) be_addr, __be16 be_port)
{
	__u32 *id = FN(lookup_slot)(master, slot);
	FAM(lb_backend) *be;

	if (!id || READ_ONCE(*id) != backend_id)
		return NULL;
	be = FN(lookup_backend)(backend_id);
	if (!be || !FAM(addr_eq)(be->addr, be_addr) || be->port != be_port)
		return NULL;
	return be;
}

/*
 * source_allowed - whether @saddr may reach frontend <@vip, @port, @proto>
 * (one of its loadBalancerSourceRanges contains it).
 */
static __always_inline bool FN(source_allowed)(FAM(addr_t) vip, __be16 port,
					       __u8 proto, FAM(addr_t) saddr)
{
	FAM(src_range_key)
	key = {
		.prefixlen = FAM(src_range_bits),
		.vip = vip,
		.port = port,
		.proto = proto,
		.saddr = saddr,
	};

	return bpf_map_lookup_elem(&FAM(src_range_map), &key) != NULL;
}

/* service_ip - whether @addr is a ClusterIP (sluice_service_ips). */
static __always_inline bool FN(service_ip)(FAM(addr_t) addr)
{
	return bpf_map_lookup_elem(&FAM(service_ips_map), &addr) != NULL;
}

/*
 * node_cidr - whether @addr is in one of the node's CIDRs of @kind (enum
 * node_cidr_kind).
 */
static __always_inline bool FN(node_cidr)(FAM(addr_t) addr, __u32 kind)
{
	FAM(node_cidr_key) key = {
		.prefixlen = FAM(node_cidr_bits),
		.kind = kind,
		.addr = addr,
	};

	return bpf_map_lookup_elem(&FAM(node_cidrs_map), &key) != NULL;
}
