// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Carrying conntrack over to a new map while traffic flows: a resize of
 * sluice_conntrack_v2 or sluice_ct_new_v1 (and of their IPv6 twins,
 * sized with them), or an upgrade from release 0's sluice_conntrack.
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
 * and neither is the other entry of its flow. The new maps' entries are
 * judged as the datapath judges them (conntrack.h): a lapsed one counts as
 * absent, whoever's flow it is, and one another deleter has claimed is
 * left to it, the flow carried over by its next packet once it is gone
 * (migrate_fam.h, mig_put).
 *
 * One kind of entry goes the other way: a source-NATed flow's port
 * reservation (its reply entry), which a new program can only put into
 * the new sluice_conntrack, where its uniqueness is checked. Its first
 * reply may meet an old program (another device's ingress, or an
 * egress, not switched yet), which would find nothing: so the live
 * reservation under a packet's tuple that the old sluice_conntrack lacks
 * is copied into it (mig_copy_back), and the old program answers the flow
 * as its own. (The shim in front of a new program copies it too, which
 * changes nothing for that program.)
 *
 * IPv6 flows are carried over from the old sluice6_conntrack_v1 and
 * sluice6_ct_new_v1 alike, by the same code (migrate_fam.h: mig_packet6).
 * The IPv6 programs are tail-called through the pinned sluice6_tc_v1 (and
 * sluice6_xdp_v1), which switches every device at once: while those maps
 * are migrated, the agent puts its IPv6 programs there only once these
 * shims are attached and every link runs its entry programs (attach.go),
 * and until then the previous agent's IPv6 programs write the old maps.
 */
#include "lib/consts.h"
#include "lib/config.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/parse6.h"
#include "lib/conntrack.h"

/*
 * Whether a node device may be L3 (parse.h). The agent leaves the shim's
 * at 1: it runs only while the agent migrates, and asks the map as before.
 */
volatile __u8 dev_l3_maybe = 1;

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
#define MIG_OLD_MAP(name, map_type, key_type, value_type) \
	struct {                                          \
		__uint(type, map_type);                   \
		__type(key, key_type);                    \
		__type(value, value_type);                \
		__uint(max_entries, 1);                   \
	} name SEC(".maps")

MIG_OLD_MAP(sluice_mig_old_est, BPF_MAP_TYPE_HASH, struct ct4_key,
	    struct ct4_entry);
MIG_OLD_MAP(sluice_mig_old_new, BPF_MAP_TYPE_LRU_HASH, struct ct4_key,
	    struct ct4_entry);
MIG_OLD_MAP(sluice_mig_old_r0, BPF_MAP_TYPE_LRU_HASH, struct ct4_key,
	    struct ct4_entry_r0);
MIG_OLD_MAP(sluice6_mig_old_est, BPF_MAP_TYPE_HASH, struct ct6_key,
	    struct ct6_entry);
MIG_OLD_MAP(sluice6_mig_old_new, BPF_MAP_TYPE_LRU_HASH, struct ct6_key,
	    struct ct6_entry);

/* Which old maps are passed in (set by the agent before load). */
volatile const __u8 mig_from_est = 0;
volatile const __u8 mig_from_new = 0;
volatile const __u8 mig_from_r0 = 0;
volatile const __u8 mig_from_est6 = 0;
volatile const __u8 mig_from_new6 = 0;

/* The old maps of each family, for migrate_fam.h. */
#define mig_old_est_4 sluice_mig_old_est
#define mig_old_est_6 sluice6_mig_old_est
#define mig_old_new_4 sluice_mig_old_new
#define mig_old_new_6 sluice6_mig_old_new
/* Release 0 had IPv4 conntrack only. */
#define mig_copy_r0_4(key, now)                \
	do {                                   \
		if (mig_from_r0)               \
			mig_copy_r0(key, now); \
	} while (0)
#define mig_copy_r0_6(key, now) \
	do {                    \
	} while (0)

static __always_inline void mig_copy_r0(const struct ct4_key *key, __u64 now);

#define LB_FAMILY 4
#include "lib/migrate_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "lib/migrate_fam.h"
#undef LB_FAMILY

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

SEC("tc")
int sluice_mig_tc(struct __sk_buff *skb)
{
	struct pkt4 p = {};
	struct pkt6 p6 = {};

	if (parse_ipv4(skb, &p) == PARSE_OK)
		mig_packet(&p);
	else if (parse_ipv6(skb, &p6) == PARSE_OK)
		mig_packet6(&p6);
	return TC_ACT_UNSPEC;
}

SEC("xdp")
int sluice_mig_xdp(struct xdp_md *ctx)
{
	struct xdp_pkt4 x = {};
	struct xdp_pkt6 x6 = {};

	if (parse_ipv4_xdp(ctx, &x))
		mig_packet(&x.p);
	else if (parse_ipv6_xdp(ctx, &x6))
		mig_packet6(&x6.p);
	return XDP_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
