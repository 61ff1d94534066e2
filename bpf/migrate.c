// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Carrying conntrack over to a new map while traffic flows: a resize of
 * sluice_conntrack_v2 or sluice_ct_new_v1, or an upgrade from release 0's
 * sluice_conntrack.
 *
 * The agent builds the new map, copies the old one's entries into it and
 * swaps the pin before it loads its programs (pkg/datapath, migrate.go).
 * The previous agent's programs keep using the old map until their links
 * are updated, and keep adding flows to it meanwhile. The next packet of
 * such a flow, met by the new programs, would find nothing and be
 * balanced afresh: a reset. So for the time of the switch these programs
 * run first: before the tc program on each device (and in place of the
 * XDP program), they copy, for the packet's tuple in each direction, the
 * entry the old map has and the new one lacks, with the other entry of its
 * flow (converted from release 0's layout when that is the old one); then
 * the packet goes on to the tc program (TC_ACT_UNSPEC, which is tcx's
 * TCX_NEXT and the next clsact filter; XDP_PASS from XDP). Once every link
 * runs the new programs, nothing writes the old map any more: the agent
 * copies what is left and detaches these.
 *
 * An entry is carried over only while it is alive and the new maps have
 * nothing under its key, or an established entry of an earlier flow on
 * the same tuple (client ports come round again quickly under load): the
 * copy made at the start holds the flows of that moment, and a flow the
 * old programs made on a reused tuple afterwards must replace it, or its
 * next packet met by a new program goes to the finished flow's backend.
 * Which is later is told by when each was last seen. A half-open entry in
 * the new maps is a new flow the new programs made: it is never replaced,
 * and neither is the other entry of its flow.
 */
#include "lib/consts.h"
#include "lib/config.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/conntrack.h"

/* struct ct4_entry as release 0 stored it in its sluice_conntrack (LRU). */
struct ct4_entry_r0 {
	__u64 last_seen; /* bpf_ktime_get_ns() of the last packet */
	__be32 nat_addr; /* network order */
	__be16 nat_port; /* network order */
	__u8 flags;	 /* enum ct_flags, the first four */
	__u8 pad;
	__u32 backend_id; /* host order */
	__u32 rev_nat_id; /* host order */
	__be32 snat_addr; /* network order */
	__be16 snat_port; /* network order */
	__u16 pad2;
};
_Static_assert(sizeof(struct ct4_entry_r0) == 32, "ct4_entry_r0 size");

/*
 * The old maps, which the agent passes in at load in place of these (they
 * are not pinned; their size is the old map's). A map that is not being
 * replaced is left as declared, and its mig_from_* is 0.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct4_entry);
	__uint(max_entries, 1);
} sluice_mig_old_est SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct4_entry);
	__uint(max_entries, 1);
} sluice_mig_old_new SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct4_entry_r0);
	__uint(max_entries, 1);
} sluice_mig_old_r0 SEC(".maps");

/* Which old maps are passed in (set by the agent before load). */
volatile const __u8 mig_from_est = 0;
volatile const __u8 mig_from_new = 0;
volatile const __u8 mig_from_r0 = 0;

/* mig_seen - when @e was last seen: its expiry less its lifetime (to
 * within CT_REFRESH_NS, earlier rather than later).
 */
static __always_inline __u64 mig_seen(const struct ct4_entry *e, __u8 proto)
{
	return READ_ONCE(e->expires) - ct_lifetime(proto, READ_ONCE(e->flags));
}

/*
 * mig_supersedes - whether the old entry @o is to replace @n, the new
 * map's entry under the same key: they are of different flows (another
 * backend, or one closed and the other not) and @o was seen later. That
 * is a tuple reused since the copy at the start (the new map's entry is
 * the finished flow's, copied then; the old map's is the flow the old
 * programs made on it afterwards), or since the shim carried it over.
 */
static __always_inline bool
mig_supersedes(__u8 proto, const struct ct4_entry *o, const struct ct4_entry *n)
{
	if (o->nat_addr == n->nat_addr && o->nat_port == n->nat_port &&
	    o->backend_id == n->backend_id &&
	    ct_closed(o->flags) == ct_closed(READ_ONCE(n->flags)))
		return false;
	return (__s64)(mig_seen(o, proto) - mig_seen(n, proto)) > 0;
}

/*
 * mig_put - put @e, found under @key in the old map, into @to (CT_EST if
 * @est) if it is alive and the new maps have nothing under @key, or (into
 * CT_EST) an established entry it supersedes. A half-open entry in the
 * new maps is a new flow's, made by the new programs: it stays. Returns
 * whether it put @e.
 */
static __always_inline bool mig_put(void *to, bool est,
				    const struct ct4_key *key,
				    const struct ct4_entry *e, __u64 now)
{
	const struct ct4_entry *n;
	__u64 flags = BPF_NOEXIST;

	if (!ct_alive(READ_ONCE(e->expires), now) ||
	    bpf_map_lookup_elem(CT_NEW, key))
		return false;
	n = bpf_map_lookup_elem(CT_EST, key);
	if (n) {
		if (!est || !mig_supersedes(key->proto, e, n))
			return false;
		flags = BPF_ANY;
	}
	return bpf_map_update_elem(to, key, e, flags) == 0;
}

/*
 * mig_copy - copy the entry under @key in @from into @to (see above), and
 * then the other entry of its flow; neither if a new flow took @key.
 */
static __always_inline void mig_copy(void *from, void *to, bool est,
				     const struct ct4_key *key, __u64 now)
{
	struct ct4_entry *e = bpf_map_lookup_elem(from, key);
	struct ct4_key pkey;

	if (!e || !mig_put(to, est, key, e, now))
		return;
	ct_peer_key(&pkey, key, e);
	e = bpf_map_lookup_elem(from, &pkey);
	if (e)
		mig_put(to, est, &pkey, e, now);
}

/*
 * mig_convert_r0 - release 0's entry @o as an established entry of today
 * (release 0 did not tell half-open flows apart), expiring when release 0
 * would have let it go. Returns whether it is alive.
 */
static __always_inline bool mig_convert_r0(const struct ct4_entry_r0 *o,
					   __u8 proto, __u64 now,
					   struct ct4_entry *e)
{
	e->flags = o->flags | CT_F_REPLIED;
	e->expires = o->last_seen + ct_lifetime(proto, e->flags);
	e->nat_addr = o->nat_addr;
	e->nat_port = o->nat_port;
	e->snat_addr = o->snat_addr;
	e->snat_port = o->snat_port;
	e->backend_id = o->backend_id;
	e->rev_nat_id = o->rev_nat_id;
	return ct_alive(e->expires, now);
}

/* mig_copy_r0 - mig_copy from release 0's map into sluice_conntrack. */
static __always_inline void mig_copy_r0(const struct ct4_key *key, __u64 now)
{
	struct ct4_entry_r0 *o = bpf_map_lookup_elem(&sluice_mig_old_r0, key);
	struct ct4_entry e = {};
	struct ct4_key pkey;

	if (!o || !mig_convert_r0(o, key->proto, now, &e) ||
	    !mig_put(CT_EST, true, key, &e, now))
		return;
	ct_peer_key(&pkey, key, &e);
	o = bpf_map_lookup_elem(&sluice_mig_old_r0, &pkey);
	if (o && mig_convert_r0(o, pkey.proto, now, &e))
		mig_put(CT_EST, true, &pkey, &e, now);
}

/* mig_packet - carry over the entries of @p's tuple, both directions. */
static __always_inline void mig_packet(const struct pkt4 *p)
{
	struct ct4_key key = {};
	__u64 now = bpf_ktime_get_ns();
	__u8 dir;

	for (dir = CT_FORWARD; dir <= CT_REVERSE; dir++) {
		ct_key_of(&key, p, dir);
		if (mig_from_est)
			mig_copy(&sluice_mig_old_est, CT_EST, true, &key, now);
		if (mig_from_new)
			mig_copy(&sluice_mig_old_new, CT_NEW, false, &key, now);
		if (mig_from_r0)
			mig_copy_r0(&key, now);
	}
}

SEC("tc")
int sluice_mig_tc(struct __sk_buff *skb)
{
	struct pkt4 p = {};

	if (parse_ipv4(skb, &p) == PARSE_OK)
		mig_packet(&p);
	return TC_ACT_UNSPEC;
}

SEC("xdp")
int sluice_mig_xdp(struct xdp_md *ctx)
{
	struct xdp_pkt4 x = {};

	if (parse_ipv4_xdp(ctx, &x))
		mig_packet(&x.p);
	return XDP_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
