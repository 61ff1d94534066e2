/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-packet connection tracking for translated flows.
 *
 * A flow from client C to VIP V translated to backend B has two entries:
 * CT_FORWARD keyed <C -> V> naming B, so every packet of the flow goes to
 * the same backend; and CT_REVERSE keyed <B -> C> naming V, so replies get
 * V back as their source.
 *
 * Half-open and established. A new flow's entries go to sluice_ct_new, an
 * LRU with a short timeout for TCP (ct_timeout_syn_ns). Its first reply
 * promotes both to sluice_conntrack, a plain hash that nothing evicts: so a
 * flood of new flows (a SYN flood, a scan, a burst of connections) can
 * only evict half-open flows, never established ones. When sluice_conntrack
 * is full, the flow stays in sluice_ct_new, marked established
 * (ct_overflow): it works, but is of the kind a flood may evict, and so
 * no established flow is ever pushed out to make room for it. A table
 * full of expired entries (closed flows in their close timeout, which
 * only the agent's GC deletes) then costs no refused connection, where
 * netfilter reclaims them on insert; the agent collects at once when it
 * sees the overflow counted. Only a port reservation (SNAT), which needs
 * the one table, is refused when it is full: the SYN is dropped and
 * counted.
 * A source-NATed flow's port reservation (its reply entry) lives in
 * sluice_conntrack from the start, since uniqueness of a port needs one
 * map, and an LRU must never evict it apart from its flow; its
 * CT_F_REPLIED flag says whether the flow is established yet.
 *
 * Expiry. An entry holds the absolute time it dies (expires), compared
 * signed with a clock reading: another CPU that refreshed the entry after
 * this program read the clock only moves it further away. Refreshes move
 * it forward only, by compare-and-swap and only by a second or more, which
 * also keeps CPUs from writing the shared cache line on every packet. A
 * dead entry counts as absent. It is deleted by whoever claims it first by
 * a compare-and-swap of the expiry it saw to CT_DEAD: the agent's GC
 * (sluice_ct_gc, which keeps the entries of a flow whose other entry is
 * alive), a new flow that needs the key, or a flush; so nobody ever
 * deletes an entry that was refreshed or re-created meanwhile. For that
 * the claimer must be the only one to delete the key, for its delete is
 * by key: entries are never overwritten, only inserted (BPF_NOEXIST), in
 * sluice_ct_new as in sluice_conntrack (ct_new_insert, ct_est_insert),
 * and an entry in the way, or a flow's own half-open entry on its
 * promotion, is claimed before it is deleted. An entry claimed by another
 * is left to it: the insert that meets one fails, and its packet waits
 * (a reply: CT_DEFERRED) or is dropped to be sent again; a promotion
 * whose own half-open forward entry another has claimed (the flow ended
 * or superseded) takes back what it inserted (ct_promote). Only the LRU's
 * evictions in sluice_ct_new delete without a claim.
 *
 * TCP close: a RST, or a FIN seen in both directions, marks both entries
 * of the flow closed (flags set atomically; only entries that point back
 * at each other are one flow); a closed entry lives ct_timeout_close_ns
 * after its last packet, and a new SYN on its tuple starts a new flow.
 *
 * IPv6 flows are tracked the same way in maps of their own: the functions
 * below ct_lifetime are written once, in conntrack_fam.h, and built for
 * both families (family.h): ct_create over the IPv4 maps, ct_create6
 * over the IPv6 ones, and so on.
 */
#ifndef SLUICE_CONNTRACK_H
#define SLUICE_CONNTRACK_H

#include "consts.h"
#include "config.h"
#include "maps.h"
#include "metrics.h"
#include "lb.h"
#include "parse.h"
#include "explain.h"
#include "family.h"
#include "parse6.h"

#define CT_EST (&sluice_conntrack_v2)
#define CT_NEW (&sluice_ct_new_v1)

/* ct4_entry.expires of an entry claimed for deletion. */
#define CT_DEAD 0
/* Refreshes move an expiry by at least this much (or not at all). */
#define CT_REFRESH_NS NSEC_PER_SEC

/* ct_create's result when the reply tuple belongs to another flow. */
#define CT_CLASH 1
/* ct_promote's result when the flow stays in sluice_ct_new (ct_overflow). */
#define CT_OVERFLOW 1
/*
 * ct_promote's (and ct_promote_snat's) result when a key it needs in
 * sluice_conntrack is held by a dead entry another deleter claimed and
 * has not deleted yet: the flow stays half-open this once, and its next
 * reply promotes it.
 */
#define CT_DEFERRED 2

#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))

static __always_inline bool ct_closed(__u32 flags)
{
	return (flags & CT_F_RST) || (flags & (CT_F_FIN_FWD | CT_F_FIN_REV)) ==
					     (CT_F_FIN_FWD | CT_F_FIN_REV);
}

/* ct_alive - whether an entry expiring at @expires is alive at @now. */
static __always_inline bool ct_alive(__u64 expires, __u64 now)
{
	return (__s64)(expires - now) > 0;
}

/* ct_lifetime - how long an entry of @proto with @flags lives idle. */
static __always_inline __u64 ct_lifetime(__u8 proto, __u32 flags)
{
	if (proto != IPPROTO_TCP)
		return ct_timeout_udp_ns;
	if (ct_closed(flags))
		return ct_timeout_close_ns;
	return (flags & CT_F_REPLIED) ? ct_timeout_tcp_ns : ct_timeout_syn_ns;
}

/* The conntrack types and maps of each family, for conntrack_fam.h. */
#define ct_key_t_4   struct ct4_key
#define ct_key_t_6   struct ct6_key
#define ct_entry_t_4 struct ct4_entry
#define ct_entry_t_6 struct ct6_entry
#define ct_est_4     CT_EST
#define ct_est_6     (&sluice6_conntrack_v1)
#define ct_new_4     CT_NEW
#define ct_new_6     (&sluice6_ct_new_v1)

#define LB_FAMILY 4
#include "conntrack_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "conntrack_fam.h"
#undef LB_FAMILY

#endif /* SLUICE_CONNTRACK_H */
