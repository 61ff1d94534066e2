/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent half of migrate.c (its design is there), a
 * template (family.h) that migrate.c includes once per family: mig_packet
 * carries an IPv4 packet's entries over from the old sluice_conntrack_v2
 * and sluice_ct_new_v1 (and release 0's map), mig_packet6 an IPv6
 * packet's from the old sluice6_conntrack_v1 and sluice6_ct_new_v1. No
 * include guard, on purpose.
 */

/* mig_seen - when @e was last seen: its expiry less its lifetime (to
 * within CT_REFRESH_NS, earlier rather than later).
 */
static __always_inline __u64 FN(mig_seen)(const FAM(ct_entry_t) *e, __u8 proto)
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
static __always_inline bool FN(mig_supersedes)(__u8 proto,
					       const FAM(ct_entry_t) *o,
					       const FAM(ct_entry_t) *n)
{
	if (FAM(addr_eq)(o->nat_addr, n->nat_addr) &&
	    o->nat_port == n->nat_port && o->backend_id == n->backend_id &&
	    ct_closed(o->flags) == ct_closed(READ_ONCE(n->flags)))
		return false;
	return (__s64)(FN(mig_seen)(o, proto) - FN(mig_seen)(n, proto)) > 0;
}

/*
 * mig_put_counted - put @e, an entry of the old sluice_conntrack under
 * @key that holds a place in the half-open count (ct_counts), into the
 * new one, its place with it. The count is the one both builds' programs
 * share (sluice_ct_admit_v1, sluice_ct_pcpu_v1: the same maps across a
 * migration), and it holds the flow once: so the copy takes the place
 * over, as a claimer takes it off, by setting CT_F_COUNTED on @e first
 * (an old program's assurance or claim that comes later finds it set and
 * takes nothing off; one that came first leaves the copy uncounted), and
 * goes in counted only if it took the place. A copy that does not go in
 * gives the place up (the flow is off the count: its entry in the old
 * map no longer holds it). Before, the copy went in counted as well, and
 * both entries were taken off, each once: the count drifted down (and,
 * the old entry's place lost with its map at the end of the migration
 * when nothing took it off there, up).
 */
static __always_inline bool
FN(mig_put_counted)(void *to, const FAM(ct_key_t) *key, FAM(ct_entry_t) *e)
{
	FAM(ct_entry_t) c = *e;
	bool took = ct_counts(key->dir,
			      __sync_fetch_and_or(&e->flags, CT_F_COUNTED));
	__u32 f = READ_ONCE(e->flags);
	/* Taken, but no longer counting (assured meanwhile): given up. */
	bool keep = took && ct_counts(key->dir, f & ~CT_F_COUNTED);
	bool ok;

	c.flags = keep ? f & ~CT_F_COUNTED : f;
	ok = bpf_map_update_elem(to, key, &c, BPF_NOEXIST) == 0;
	if (took && !(ok && keep))
		ct_admit_add(LB_FAMILY == 6, -1);
	return ok;
}

/*
 * mig_put - put @e, found under @key in the old map, into @to (the
 * established map if @est) if it is alive and the new maps have nothing
 * under @key, or (into the established map) an established entry it
 * supersedes. A half-open entry in the new maps is a new flow's, made by
 * the new programs: it stays. Returns whether it put @e.
 *
 * The new maps' entries are judged as the live path judges them
 * (conntrack.h): a lapsed entry (dead, not claimed) counts as absent, in
 * either map, whoever's flow it is; in @to it is reaped (ct_reap) to make
 * room, as ct_est_insert and ct_new_insert do. Before, a lapsed entry of
 * the same flow kept @e out (it does not supersede its own flow), and the
 * flow's next packet met by a new program found nothing alive: balanced
 * afresh, a reset. An entry another deleter has claimed, in either map,
 * is its claimer's to delete, now: @e waits for that, and the flow's next
 * packet carries it over. It was overwritten before (BPF_ANY: a claimed
 * entry is seen earliest of all, so @e superseded it), and the claimer's
 * delete, by key, then took @e; in @to the insert is tried once more, in
 * case that delete came meanwhile. A live established entry that @e
 * supersedes is claimed (ct_reap) and deleted first, not overwritten, for
 * the same reason: an entry is deleted only by whoever claimed it.
 */
static __always_inline bool FN(mig_put)(void *to, bool est,
					const FAM(ct_key_t) *key,
					FAM(ct_entry_t) *e, __u64 now)
{
	FAM(ct_entry_t) *n;
	__u64 seen;

	if (!ct_alive(READ_ONCE(e->expires), now))
		return false;
	n = bpf_map_lookup_elem(FAM(ct_new), key);
	if (n) {
		seen = READ_ONCE(n->expires);
		if (seen == CT_DEAD || ct_alive(seen, now))
			return false;
		if (!est)
			FN(ct_reap)(FAM(ct_new), key, n, seen);
	}
	n = bpf_map_lookup_elem(FAM(ct_est), key);
	if (n) {
		seen = READ_ONCE(n->expires);
		if (ct_alive(seen, now) &&
		    (!est || !FN(mig_supersedes)(key->proto, e, n)))
			return false;
		if (est)
			FN(ct_reap)(FAM(ct_est), key, n, seen);
		else if (seen == CT_DEAD)
			return false;
	}
	if (!est || !ct_counts(key->dir, READ_ONCE(e->flags)))
		return bpf_map_update_elem(to, key, e, BPF_NOEXIST) == 0;
	return FN(mig_put_counted)(to, key, e);
}

/*
 * mig_copy - copy the entry under @key in @from into @to (see above), and
 * then the other entry of its flow; neither if a new flow took @key.
 */
static __always_inline void FN(mig_copy)(void *from, void *to, bool est,
					 const FAM(ct_key_t) *key, __u64 now)
{
	FAM(ct_entry_t) *e = bpf_map_lookup_elem(from, key);
	FAM(ct_key_t) pkey;

	if (!e || !FN(mig_put)(to, est, key, e, now))
		return;
	FN(ct_peer_key)(&pkey, key, e);
	e = bpf_map_lookup_elem(from, &pkey);
	if (e)
		FN(mig_put)(to, est, &pkey, e, now);
}

/*
 * mig_reap_old - ct_reap of @o, under @key in the old sluice_conntrack,
 * if its expiry is still @seen: the claimer takes it off the count the
 * two builds share if it holds a place there (ct_uncount's rule; an old
 * program's flow, lapsed, never taken off), before deleting it.
 */
static __always_inline bool FN(mig_reap_old)(const FAM(ct_key_t) *key,
					     FAM(ct_entry_t) *o, __u64 seen)
{
	if (seen == CT_DEAD ||
	    __sync_val_compare_and_swap(&o->expires, seen, CT_DEAD) != seen)
		return false;
	if (ct_counts(key->dir, READ_ONCE(o->flags)) &&
	    ct_counts(key->dir, __sync_fetch_and_or(&o->flags, CT_F_COUNTED)))
		ct_admit_add(LB_FAMILY == 6, -1);
	bpf_map_delete_elem(&FAM(mig_old_est), key);
	return true;
}

/*
 * mig_copy_back - the other way, for port reservations only: put the
 * live reply entry of a source-NATed flow (CT_F_SNAT) not seen closed
 * under @key, which a new program put into the new sluice_conntrack (or
 * the start copied there), into the old one if that has nothing alive
 * there (a lapsed entry is reaped, one another deleter has claimed left
 * to it).
 *
 * A new flow's port reservation must go into the new sluice_conntrack
 * (a port's uniqueness needs the one map, which the new programs search),
 * where an old program that its first reply meets (another device's
 * ingress, an egress not switched yet) found nothing before: the reply
 * went on untranslated. An old program that finds the reservation
 * promotes the flow as its own (ct_promote_snat): the forward entry,
 * rebuilt from the reservation, into the old sluice_conntrack; the
 * half-open one, in sluice_ct_new, let go if that map is shared. The old
 * entries come back forward as any
 * others (mig_copy: the forward entry the new maps then lack), and the
 * new sluice_conntrack's reservation, the same flow, stays, promoted in
 * turn by the flow's next reply met by a new program. While it is in the
 * old map, the old programs' port search passes over it too. Only a
 * reservation: the new programs' other new flows go to sluice_ct_new,
 * shared, while sluice_conntrack alone is migrated (ct_admit_paused);
 * with sluice_ct_new migrated too, egress goes first (pkg/datapath,
 * migrate.go: migrating), and a half-open flow is not copied back.
 */
static __always_inline void FN(mig_copy_back)(const FAM(ct_key_t) *key,
					      __u64 now)
{
	FAM(ct_entry_t) *n = bpf_map_lookup_elem(FAM(ct_est), key), *o;
	FAM(ct_entry_t) e;
	__u64 seen;

	if (!n)
		return;
	e = *n;
	/* A closed flow's reservation stays out: an old program's new flow
	 * on the client's port superseded it in the old map on purpose
	 * (ct_supersede), so that the closed flow's stragglers find nothing.
	 */
	if (!(e.flags & CT_F_SNAT) || ct_closed(e.flags) ||
	    !ct_alive(e.expires, now))
		return;
	o = bpf_map_lookup_elem(&FAM(mig_old_est), key);
	if (o) {
		seen = READ_ONCE(o->expires);
		if (ct_alive(seen, now) || !FN(mig_reap_old)(key, o, seen))
			return;
	}
	/* The reservation in the new map keeps its place in the count,
	 * which both builds share: the copy goes in taken off (an old
	 * program's promotion of it takes nothing off; the new map's is
	 * promoted, or reaped, in turn). Before, it went in counted, and
	 * the flow came off twice, or (the old map let go with it
	 * unanswered there) its copy's place was never added to begin with.
	 */
	e.flags |= CT_F_COUNTED;
	if (bpf_map_update_elem(&FAM(mig_old_est), key, &e, BPF_NOEXIST))
		return;
	/* Checked after the insert (as ct_promote's): a deleter that
	 * claimed the reservation in the new map meanwhile ended the flow,
	 * and its copy goes too, before an old program promotes it.
	 */
	n = bpf_map_lookup_elem(FAM(ct_est), key);
	if (n && ct_alive(READ_ONCE(n->expires), now))
		return;
	o = bpf_map_lookup_elem(&FAM(mig_old_est), key);
	if (o)
		FN(ct_reap_plain)(&FAM(mig_old_est), key, o, e.expires);
}

/* mig_packet - carry over the entries of @p's tuple, both directions. */
static __always_inline void FN(mig_packet)(const FAM(pkt_t) *p)
{
	FAM(ct_key_t) key = {};
	__u64 now = now_ns();
	__u8 dir;

	for (dir = CT_FORWARD; dir <= CT_REVERSE; dir++) {
		FN(ct_key_of)(&key, p, dir);
		if (FN(mig_from_est))
			FN(mig_copy)(&FAM(mig_old_est), FAM(ct_est), true, &key,
				     now);
		if (FN(mig_from_new))
			FN(mig_copy)(&FAM(mig_old_new), FAM(ct_new), false,
				     &key, now);
		FAM(mig_copy_r0)(&key, now);
	}
	/* @p as a reply: its tuple is a reservation's key. */
	if (FN(mig_from_est)) {
		FN(ct_key_of)(&key, p, CT_REVERSE);
		FN(mig_copy_back)(&key, now);
	}
}
