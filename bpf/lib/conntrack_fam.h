/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent half of conntrack.h (its design is there), a
 * template (family.h) that conntrack.h includes once per family:
 * LB_FAMILY 4 defines ct_create and the rest over sluice_conntrack_v2 and
 * sluice_ct_new_v1, LB_FAMILY 6 their twins ct_create6, ... over
 * sluice6_conntrack_v1 and sluice6_ct_new_v1. No include guard, on
 * purpose.
 */
/*
 * ct_refresh - push the expiry of the live entry @e to @now plus its
 * lifetime, if that moves it forward by CT_REFRESH_NS or more. Returns
 * whether it stored.
 */
static __always_inline bool FN(ct_refresh)(FAM(ct_entry_t) *e, __u8 proto,
					   __u64 now)
{
	__u64 seen = READ_ONCE(e->expires);
	__u64 want;

	if (!ct_alive(seen, now))
		return false;
	want = now + ct_lifetime(proto, READ_ONCE(e->flags));
	if ((__s64)(want - seen) < (__s64)CT_REFRESH_NS)
		return false;
	return __sync_val_compare_and_swap(&e->expires, seen, want) == seen;
}

/*
 * ct_mark - set @bits in the flags of @e atomically (the two ends of a
 * flow closing at once on two CPUs must both leave their mark), and move
 * its expiry to its closed lifetime from @now if this closes the flow, or
 * ends its TIME_WAIT extension (a RST: ct_snat_held) (ct_lifetime: the
 * close timeout, or a FIN-closed source-NATed flow's TIME_WAIT): closer
 * for an established flow; further for one whose lifetime was shorter,
 * one that closes unassured (CT_F_AWAIT: its client's FIN came before
 * any ACK) or challenged (CT_F_CHAL_ANY), whose SYN timeout is shorter
 * than the TIME_WAIT a source-NATed flow holds its port for. Further is
 * what the refresh by the closed flags gives the flow's next packet, and
 * a source-NATed flow's reservation this packet's (ct_check_reverse):
 * both entries get it at once so. Written with the expiry seen even when
 * it is the one wanted (a no-op): one branch less to verify.
 */
static __always_inline void FN(ct_mark)(FAM(ct_entry_t) *e, __u32 bits,
					__u8 proto, __u64 now)
{
	__u32 old;
	__u64 seen, want;

	if ((READ_ONCE(e->flags) & bits) == bits)
		return;
	old = __sync_fetch_and_or(&e->flags, bits);
	/* Also a RST on a flow in its TIME_WAIT extension: it ends it. */
	if (proto != IPPROTO_TCP || !ct_closed(old | bits) ||
	    (ct_closed(old) && ct_snat_held(old) == ct_snat_held(old | bits)))
		return;
	seen = READ_ONCE(e->expires);
	want = now + ct_lifetime(IPPROTO_TCP, old | bits);
	if (ct_alive(seen, now))
		__sync_val_compare_and_swap(&e->expires, seen, want);
}

/*
 * ct_unmark - take @clears (ct_tcp_clears) back from the flags of @e, a
 * TCP flow's entry, and turn @chal (ct_tcp_challenges: a RST mark, or 0)
 * into its challenged mark (CT_F_CHAL_*), atomically each, and refresh it
 * (ct_refresh: by the flags it has now, so a flow that this reopens goes
 * back to its lifetime from @now: the established timeout if answered,
 * ct_timeout_syn_ns while challenged). The challenged mark is set before
 * the RST's is cleared: between the two the flow is closed still.
 *
 * Not ordered against a RST on another CPU (known limitation, README):
 * a RST whose or (ct_mark) falls between this read and the and below,
 * when its bit was set already, is undone here. A challenge ACK's own
 * answer cannot race it (tc and XDP update the entries before the ACK
 * leaves the node); a RST crossing a bare ACK leaves the flow challenged
 * (ct_timeout_syn_ns, not the close timeout); a RST racing its own
 * sender's earlier packet (one direction of a flow, on two CPUs) leaves
 * it open.
 */
static __always_inline void FN(ct_unmark)(FAM(ct_entry_t) *e, __u32 clears,
					  __u32 chal, __u64 now)
{
	__u32 f = READ_ONCE(e->flags);

	if (!(f & (clears | chal)))
		return;
	if (f & chal)
		__sync_fetch_and_or(&e->flags, chal == CT_F_RST_FWD ?
						       CT_F_CHAL_FWD :
						       CT_F_CHAL_REV);
	__sync_fetch_and_and(&e->flags, ~(clears | chal));
	FN(ct_refresh)(e, IPPROTO_TCP, now);
}

/*
 * ct_new_live - whether this family's sluice_ct_new may hold an entry
 * (conntrack.h): while not, none of its lookups is made.
 */
static __always_inline bool FN(ct_new_live)(void)
{
	return ct_new_live_at(LB_FAMILY == 6);
}

/*
 * ct_uncount - after a claim of @e (under @key in @map): if it is an entry
 * of sluice_conntrack that holds a place in the half-open count
 * (ct_counts: the forward entry of a flow half-open or unassured, a port
 * reservation counted), take it off the count, unless its flow's
 * assurance or promotion (or another claimer) did first: whoever sets
 * CT_F_COUNTED first does (conntrack.h). ct_assure sets CT_F_COUNTED
 * before CT_F_ASSURED, so no value of the flags this or reads says
 * "assured" before the assurance has had its or.
 */
static __always_inline void FN(ct_uncount)(void *map, const FAM(ct_key_t) *key,
					   FAM(ct_entry_t) *e)
{
	if (map != (void *)FAM(ct_est) ||
	    !ct_counts(key->dir, READ_ONCE(e->flags)))
		return;
	if (ct_counts(key->dir, __sync_fetch_and_or(&e->flags, CT_F_COUNTED)))
		ct_admit_add(LB_FAMILY == 6, -1);
}

/*
 * ct_reap - delete @e, found under @key in @map, if its expiry is still
 * @seen: claim it by a compare-and-swap to CT_DEAD first, so that of two
 * deleters only one deletes, and an entry that was refreshed since is
 * left alone. The claimer of a half-open flow's forward entry takes the
 * flow off the half-open count (ct_uncount). Returns whether this call
 * deleted it.
 */
static __always_inline bool FN(ct_reap)(void *map, const FAM(ct_key_t) *key,
					FAM(ct_entry_t) *e, __u64 seen)
{
	if (seen == CT_DEAD ||
	    __sync_val_compare_and_swap(&e->expires, seen, CT_DEAD) != seen)
		return false;
	FN(ct_uncount)(map, key, e);
	bpf_map_delete_elem(map, key);
	return true;
}

/* ct_reap_now - ct_reap whatever @e's expiry is (a flow ended on purpose). */
static __always_inline bool FN(ct_reap_now)(void *map, const FAM(ct_key_t) *key,
					    FAM(ct_entry_t) *e)
{
	if (__sync_lock_test_and_set(&e->expires, CT_DEAD) == CT_DEAD)
		return false;
	FN(ct_uncount)(map, key, e);
	bpf_map_delete_elem(map, key);
	return true;
}

/*
 * ct_reap_plain and ct_reap_now_plain - ct_reap and ct_reap_now of an
 * entry that carries no count (ct_uncount): a reply entry not a counted
 * port reservation, or one a promotion inserted with CT_F_COUNTED (the
 * promotions' deletes), which need not look.
 */
static __always_inline bool FN(ct_reap_plain)(void *map,
					      const FAM(ct_key_t) *key,
					      FAM(ct_entry_t) *e, __u64 seen)
{
	if (seen == CT_DEAD ||
	    __sync_val_compare_and_swap(&e->expires, seen, CT_DEAD) != seen)
		return false;
	bpf_map_delete_elem(map, key);
	return true;
}

static __always_inline bool
FN(ct_reap_now_plain)(void *map, const FAM(ct_key_t) *key, FAM(ct_entry_t) *e)
{
	if (__sync_lock_test_and_set(&e->expires, CT_DEAD) == CT_DEAD)
		return false;
	bpf_map_delete_elem(map, key);
	return true;
}

/* ct_key_of - the conntrack key of @p's packet as it is on the wire. */
static __always_inline void FN(ct_key_of)(FAM(ct_key_t) *key,
					  const FAM(pkt_t) *p, __u8 dir)
{
	key->saddr = p->saddr;
	key->daddr = p->daddr;
	key->sport = p->sport;
	key->dport = p->dport;
	key->proto = p->proto;
	key->dir = dir;
	key->pad = 0;
}

/*
 * ct_peer_key - the key of the other direction's entry of the flow @e
 * (found under @key) belongs to.
 */
static __always_inline void FN(ct_peer_key)(FAM(ct_key_t) *peer,
					    const FAM(ct_key_t) *key,
					    const FAM(ct_entry_t) *e)
{
	bool snat = e->flags & CT_F_SNAT;

	peer->proto = key->proto;
	peer->pad = 0;
	if (key->dir == CT_FORWARD) {
		/* <C -> F> names B (and N:sp): the reply, <B -> N:sp or C>. */
		peer->dir = CT_REVERSE;
		peer->saddr = e->nat_addr;
		peer->sport = e->nat_port;
		peer->daddr = snat ? e->snat_addr : key->saddr;
		peer->dport = snat ? e->snat_port : key->sport;
	} else {
		/* <B -> X> names F (and C): the request is <C -> F>. */
		peer->dir = CT_FORWARD;
		peer->saddr = snat ? e->snat_addr : key->daddr;
		peer->sport = snat ? e->snat_port : key->dport;
		peer->daddr = e->nat_addr;
		peer->dport = e->nat_port;
	}
}

/*
 * ct_is_peer - whether @pe, found under the ct_peer_key of @e (under
 * @key), is the other entry of the same flow: it names back what @key
 * holds. A tuple reused by a new flow to another backend, say, leaves the
 * old flow's reply entry <B_old -> C> naming the frontend of a forward
 * entry <C -> F> that now names B_new: they are no longer one flow.
 */
static __always_inline bool FN(ct_is_peer)(const FAM(ct_key_t) *key,
					   const FAM(ct_entry_t) *e,
					   const FAM(ct_entry_t) *pe)
{
	bool snat = e->flags & CT_F_SNAT;

	if ((pe->flags ^ e->flags) & CT_F_SNAT)
		return false;
	if (key->dir == CT_FORWARD)
		return FAM(addr_eq)(pe->nat_addr, key->daddr) &&
		       pe->nat_port == key->dport &&
		       (!snat || (FAM(addr_eq)(pe->snat_addr, key->saddr) &&
				  pe->snat_port == key->sport));
	return FAM(addr_eq)(pe->nat_addr, key->saddr) &&
	       pe->nat_port == key->sport &&
	       (!snat || (FAM(addr_eq)(pe->snat_addr, key->daddr) &&
			  pe->snat_port == key->dport));
}

/*
 * ct_find_any - ct_find, which also says whether it found no entry under
 * @key at all, live or lapsed, in either map (@none): a new flow on a
 * forward key so found has no earlier flow to supersede (ct_create).
 */
static __always_inline FAM(ct_entry_t) *
FN(ct_find_any)(const FAM(ct_key_t) *key, __u64 now, bool *half_open,
		bool *none)
{
	FAM(ct_entry_t) *e = bpf_map_lookup_elem(FAM(ct_est), key);

	*half_open = false;
	*none = false;
	if (e) {
		if (ct_alive(READ_ONCE(e->expires), now))
			return e;
	} else {
		*none = true;
	}
	if (!FN(ct_new_live)())
		return NULL;
	e = bpf_map_lookup_elem(FAM(ct_new), key);
	if (!e)
		return NULL;
	*none = false;
	if (!ct_alive(READ_ONCE(e->expires), now))
		return NULL;
	*half_open = true;
	return e;
}

/*
 * ct_find - the live entry under @key: the one in sluice_conntrack
 * (established or half-open), else the one in sluice_ct_new (@half_open
 * says which), or NULL.
 */
static __always_inline FAM(ct_entry_t) *FN(ct_find)(const FAM(ct_key_t) *key,
						    __u64 now, bool *half_open)
{
	bool none;

	return FN(ct_find_any)(key, now, half_open, &none);
}

/*
 * ct_peer - the live other entry of the flow of @e (under @key), or NULL;
 * its key in @pkey.
 */
static __always_inline FAM(ct_entry_t) *FN(ct_peer)(const FAM(ct_key_t) *key,
						    const FAM(ct_entry_t) *e,
						    __u64 now,
						    FAM(ct_key_t) *pkey)
{
	FAM(ct_entry_t) *pe;
	bool half_open;

	FN(ct_peer_key)(pkey, key, e);
	pe = FN(ct_find)(pkey, now, &half_open);
	if (!pe || !FN(ct_is_peer)(key, e, pe))
		return NULL;
	return pe;
}

/*
 * ct_touch - refresh @e (under @key) and, when that stored, the other
 * entry of its flow too, so that a flow whose packets go one way only
 * (a server pushing UDP) keeps both.
 */
static __always_inline void FN(ct_touch)(const FAM(ct_key_t) *key,
					 FAM(ct_entry_t) *e, __u64 now)
{
	FAM(ct_key_t) pkey;
	FAM(ct_entry_t) *pe;

	if (!FN(ct_refresh)(e, key->proto, now))
		return;
	pe = FN(ct_peer)(key, e, now, &pkey);
	if (pe)
		FN(ct_refresh)(pe, key->proto, now);
}

/*
 * ct_fwd_usable - whether the live forward entry @fwd still decides where
 * @p, a packet of its flow, goes. tc and XDP both follow this rule, so a
 * flow may move between them. @gone is set if the entry's backend has
 * left (its id is missing or names another address).
 *
 * A UDP "flow" has no end: once its backend is gone, it is re-balanced
 * rather than sent into the void. TCP keeps its backend, as kube-proxy
 * keeps established connections (a terminating endpoint drains them); but
 * a new connection (a pure SYN) on the tuple of a closed flow, or of one
 * whose backend is gone (a client that crashed and reuses its port),
 * starts afresh.
 */
static __always_inline bool FN(ct_fwd_usable)(const FAM(ct_entry_t) *fwd,
					      const FAM(pkt_t) *p, bool *gone)
{
	const FAM(lb_backend) *be = FN(lookup_backend)(fwd->backend_id);

	*gone = !be || !FAM(addr_eq)(be->addr, fwd->nat_addr) ||
		be->port != fwd->nat_port;
	if (p->proto == IPPROTO_UDP)
		return !*gone;
	if (p->proto == IPPROTO_TCP &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN &&
	    (*gone || ct_closed(READ_ONCE(fwd->flags))))
		return false;
	return true;
}

/*
 * ct_track_tcp - note a FIN or RST of @p (a packet of the flow @e, found
 * under @key) in both of the flow's entries. The other entry is marked only
 * if it is this flow's (ct_is_peer): a straggler of an old flow on a reused
 * tuple, or a RST from a backend the flow does not use, must not close the
 * flow that now holds the tuple.
 *
 * A RST is marked with its side (CT_F_RST_FWD from the client,
 * CT_F_RST_REV from the backend): the flow is closed (the close timeout).
 * Sluice keeps no sequence numbers, which netfilter judges a RST by (an
 * out-of-window RST is INVALID, an inexact one in the window keeps the
 * flow open "to allow a possible challenge ACK"), so it reads the RST's
 * fate from what each side sends after it (ct_unmark):
 *
 * - a later packet of the RST's sender, neither a RST nor a SYN, takes
 *   the mark back (ct_tcp_clears): the sender is alive, so the RST was
 *   not its own (spoofed, or a middlebox's), or its stack sends on. Its
 *   packets sent before the RST are ahead of it on the path.
 * - a bare ACK of the RST's receiver (ACK alone, no payload:
 *   ct_tcp_challenges) turns the mark into a challenged one (CT_F_CHAL_*):
 *   open, but living ct_timeout_syn_ns idle, until the sender sends more
 *   (the mark goes: established again) or a RST (the exact RST that
 *   answers a challenge ACK: closed again). It is the challenge ACK of an
 *   inexact RST the receiver ignored (RFC 5961); but it may be an ACK the
 *   receiver sent before the RST reached it (a client aborting an upload
 *   while the server acknowledges it), hence the short lifetime.
 * - the receiver's other packets change nothing: data (or a FIN) it sent
 *   before the RST reached it (a server streaming to a client that
 *   aborts) must not reopen a flow whose client is gone, or its entries
 *   would live the established timeout where the close timeout was due.
 *
 * Without any of this, a connection that outlived a stray or spoofed RST
 * lost its entries after the close timeout idle, and its next packet
 * went to a backend chosen afresh.
 */
static __always_inline void FN(ct_track_tcp)(const FAM(pkt_t) *p,
					     const FAM(ct_key_t) *key,
					     FAM(ct_entry_t) *e, __u64 now)
{
	FAM(ct_key_t) pkey;
	FAM(ct_entry_t) *pe;

	/* A later fragment has no TCP header (tcp_flags 0): it must not
	 * count as its sender's packet that takes a RST's mark back.
	 */
	if (explain_dry(p) || p->proto != IPPROTO_TCP || p->frag_later)
		return;
	if (!ct_tcp_sets(p->tcp_flags, key->dir) &&
	    !(READ_ONCE(e->flags) &
	      (ct_tcp_clears(p->tcp_flags, key->dir) |
	       ct_tcp_challenges(p->tcp_flags, p->tcp_bare, key->dir))))
		return;
	FN(ct_unmark)(e, ct_tcp_clears(p->tcp_flags, key->dir),
		      ct_tcp_challenges(p->tcp_flags, p->tcp_bare, key->dir),
		      now);
	FN(ct_mark)(e, ct_tcp_sets(p->tcp_flags, key->dir), p->proto, now);
	pe = FN(ct_peer)(key, e, now, &pkey);
	if (!pe)
		return;
	/* The marks worked out again from @p, not kept: a value live
	 * across ct_peer's lookups is a stack slot, and IPv6's XDP reply
	 * step has none to spare (the 512-byte limit of its call chain).
	 */
	FN(ct_unmark)(pe, ct_tcp_clears(p->tcp_flags, key->dir),
		      ct_tcp_challenges(p->tcp_flags, p->tcp_bare, key->dir),
		      now);
	FN(ct_mark)(pe, ct_tcp_sets(p->tcp_flags, key->dir), IPPROTO_TCP, now);
}

/*
 * ct_est_insert - insert @val under @key into sluice_conntrack, deleting a
 * dead entry in the way (ct_reap); with @keep_peer, not one whose flow's
 * other entry is alive (the GC's rule, for port reservations: the flow
 * still sends from that port). A dead entry that another deleter has
 * claimed already (ct_reap fails) is its to delete: the insert is tried
 * once more all the same, which succeeds if that delete came meanwhile
 * (a BPF program cannot wait for it; BPF_NOEXIST never overwrites it).
 * Returns 0, -EEXIST if a live entry (or one kept, or one still claimed,
 * ct_est_claimed) holds the key, or another negative error (-E2BIG: the
 * table is full).
 */
static __always_inline int FN(ct_est_insert)(const FAM(ct_key_t) *key,
					     const FAM(ct_entry_t) *val,
					     __u64 now, bool keep_peer)
{
	FAM(ct_entry_t) *old;
	FAM(ct_key_t) pkey;
	__u64 seen;
	int err;

	err = bpf_map_update_elem(FAM(ct_est), key, val, BPF_NOEXIST);
	if (err != -EEXIST)
		return err;
	old = bpf_map_lookup_elem(FAM(ct_est), key);
	if (old) {
		seen = READ_ONCE(old->expires);
		if (ct_alive(seen, now) ||
		    (keep_peer && FN(ct_peer)(key, old, now, &pkey)))
			return -EEXIST;
		FN(ct_reap)(FAM(ct_est), key, old, seen);
	}
	return bpf_map_update_elem(FAM(ct_est), key, val, BPF_NOEXIST);
}

/*
 * ct_est_free - whether ct_est_insert under @key would succeed, asked by a
 * dry run (explain.h), which inserts nothing: 0 or -EEXIST. A full table
 * is not foreseen.
 */
static __always_inline int FN(ct_est_free)(const FAM(ct_key_t) *key, __u64 now,
					   bool keep_peer)
{
	FAM(ct_entry_t) *old = bpf_map_lookup_elem(FAM(ct_est), key);
	FAM(ct_key_t) pkey;

	if (old && (ct_alive(READ_ONCE(old->expires), now) ||
		    (keep_peer && FN(ct_peer)(key, old, now, &pkey))))
		return -EEXIST;
	return 0;
}

/*
 * ct_est_same - whether the live entry under @key in sluice_conntrack is
 * @want (as another CPU promoting the same flow would have written it).
 */
static __always_inline bool FN(ct_est_same)(const FAM(ct_key_t) *key,
					    const FAM(ct_entry_t) *want,
					    __u64 now)
{
	FAM(ct_entry_t) *e = bpf_map_lookup_elem(FAM(ct_est), key);

	return e && ct_alive(READ_ONCE(e->expires), now) &&
	       FAM(addr_eq)(e->nat_addr, want->nat_addr) &&
	       e->nat_port == want->nat_port &&
	       FAM(addr_eq)(e->snat_addr, want->snat_addr) &&
	       e->snat_port == want->snat_port;
}

/*
 * ct_est_claimed - whether the entry under @key in sluice_conntrack is
 * dead: after ct_est_insert's -EEXIST, one claimed by another deleter (the
 * agent's GC, a flush, another CPU's new flow) between its compare-and-swap
 * and its delete, so that the key is free an instant later.
 */
static __always_inline bool FN(ct_est_claimed)(const FAM(ct_key_t) *key,
					       __u64 now)
{
	FAM(ct_entry_t) *e = bpf_map_lookup_elem(FAM(ct_est), key);

	return e && !ct_alive(READ_ONCE(e->expires), now);
}

/*
 * ct_new_insert - insert @val under @key into sluice_ct_new in place of
 * whatever entry is there (its caller has decided that this flow takes
 * the key: an earlier flow of the tuple, a lapsed entry), but never over
 * one that another deleter has claimed: the claimer deletes by key after
 * its claim, and would take @val with it (a flush of the entry's backend,
 * a new flow superseding it; the new entry was lost until the flow's next
 * packet, which went to a backend selected again). So the update is
 * BPF_NOEXIST, as sluice_conntrack's inserts are; an entry in the way is
 * claimed here first (ct_reap_now, whatever its expiry: BPF_ANY took it
 * just as well) and deleted, and one claimed already is its claimer's to
 * delete: the insert is tried once more all the same, which succeeds if
 * that delete came meanwhile (ct_est_insert). Nothing under @key, the
 * common case, costs the one update BPF_ANY did. An insert sets the LRU's
 * new_live word (ct_new_inserted).
 * Returns 0, -EEXIST if a claimed entry (or one another CPU inserted in
 * between) holds the key, or another map update error.
 */
static __always_inline int FN(ct_new_insert)(const FAM(ct_key_t) *key,
					     const FAM(ct_entry_t) *val)
{
	FAM(ct_entry_t) *old;
	int err;

	err = bpf_map_update_elem(FAM(ct_new), key, val, BPF_NOEXIST);
	if (err == -EEXIST) {
		old = bpf_map_lookup_elem(FAM(ct_new), key);
		if (old)
			FN(ct_reap_now)(FAM(ct_new), key, old);
		err = bpf_map_update_elem(FAM(ct_new), key, val, BPF_NOEXIST);
	}
	if (!err)
		ct_new_inserted(LB_FAMILY == 6);
	return err;
}

/*
 * ct_supersede_in - ct_supersede for the forward entry under @fkey in @map
 * (sluice_conntrack or sluice_ct_new).
 */
static __always_inline void FN(ct_supersede_in)(void *map,
						const FAM(ct_key_t) *fkey)
{
	FAM(ct_entry_t) *old, *pe;
	FAM(ct_key_t) pkey;

	old = bpf_map_lookup_elem(map, fkey);
	if (!old)
		return;
	FN(ct_peer_key)(&pkey, fkey, old);
	pe = bpf_map_lookup_elem(FAM(ct_est), &pkey);
	if (pe && FN(ct_is_peer)(fkey, old, pe))
		FN(ct_reap_now)(FAM(ct_est), &pkey, pe);
	if (FN(ct_new_live)()) {
		pe = bpf_map_lookup_elem(FAM(ct_new), &pkey);
		if (pe && FN(ct_is_peer)(fkey, old, pe))
			FN(ct_reap_now)(FAM(ct_new), &pkey, pe);
	}
	FN(ct_reap_now)(map, fkey, old);
}

/*
 * ct_supersede - a new flow takes the tuple @fkey: delete the entries of
 * an earlier flow on it (the caller found it unusable: closed, or its
 * backend gone), its forward entry and the reply entry (or port
 * reservation) that points back at it, so that neither the new flow's
 * packets nor a straggler of the old backend find them.
 */
static __always_inline void FN(ct_supersede)(const FAM(ct_key_t) *fkey)
{
	FN(ct_supersede_in)(FAM(ct_est), fkey);
	if (FN(ct_new_live)())
		FN(ct_supersede_in)(FAM(ct_new), fkey);
}

/*
 * ct_opens - whether @p may open a connection: a pure TCP SYN, or any UDP
 * datagram (UDP has no opening packet).
 */
static __always_inline bool FN(ct_opens)(const FAM(pkt_t) *p)
{
	if (p->proto == IPPROTO_UDP)
		return true;
	return p->proto == IPPROTO_TCP &&
	       (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
}

/*
 * ct_syn_only - whether @p is a pure TCP SYN, which tc never takes for a
 * reply of a flow addressed to a frontend (tc_ingress): a translated
 * flow's backend answers its client's SYN with a SYN-ACK, and a pure SYN
 * in the reply direction would be a simultaneous open, which a backend
 * answering on a Service's port does not make.
 */
static __always_inline bool FN(ct_syn_only)(const FAM(pkt_t) *p)
{
	return p->proto == IPPROTO_TCP &&
	       (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
}

/*
 * ct_reopens - whether @p, a new flow's packet, may take a tuple that @e,
 * a live entry of another flow, holds: @p is a pure TCP SYN and @e's flow
 * has closed. netfilter's rule: a new SYN reopens the tuple of a closed
 * TCP conntrack (TIME_WAIT, CLOSE).
 */
static __always_inline bool FN(ct_reopens)(const FAM(pkt_t) *p,
					   const FAM(ct_entry_t) *e)
{
	return p->proto == IPPROTO_TCP && FN(ct_opens)(p) &&
	       ct_closed(READ_ONCE(e->flags));
}

/*
 * ct_reap_closed - a new flow takes the reply tuple @key from @e, found in
 * @map with expiry @seen, an entry of a closed flow (ct_reopens): delete
 * that flow's forward entry if it still points back at @e, then @e
 * (ct_reap: not if it was refreshed or claimed since). The forward entry
 * goes first, so that a straggler of the closed flow does not find it and
 * re-create the reply entry (ct_check_reverse) under the new flow. Returns
 * whether @e was deleted.
 */
static __always_inline bool FN(ct_reap_closed)(void *map,
					       const FAM(ct_key_t) *key,
					       FAM(ct_entry_t) *e, __u64 seen)
{
	FAM(ct_entry_t) *pe;
	FAM(ct_key_t) pkey;

	FN(ct_peer_key)(&pkey, key, e);
	pe = bpf_map_lookup_elem(FAM(ct_est), &pkey);
	if (pe && FN(ct_is_peer)(key, e, pe))
		FN(ct_reap)(FAM(ct_est), &pkey, pe, READ_ONCE(pe->expires));
	if (FN(ct_new_live)()) {
		pe = bpf_map_lookup_elem(FAM(ct_new), &pkey);
		if (pe && FN(ct_is_peer)(key, e, pe))
			FN(ct_reap)(FAM(ct_new), &pkey, pe,
				    READ_ONCE(pe->expires));
	}
	return FN(ct_reap)(map, key, e, seen);
}

/*
 * ct_est_create - ct_create's inserts into sluice_conntrack: the reply
 * entry @e under @rkey, then the forward entry (@e naming @be under @p's
 * key), half-open (conntrack.h), and the flow counted (ct_admit_add). A
 * key held by a live entry, or a full table, leaves nothing there (the
 * reply entry inserted goes again, unless refreshed meanwhile): the flow
 * goes to sluice_ct_new instead, as beyond the half-open share. @rkey and
 * @e are as they came on return. Returns 0 or the refused insert's error.
 */
static __always_inline int FN(ct_est_create)(const FAM(pkt_t) *p,
					     const FAM(lb_backend) *be,
					     const FAM(ct_key_t) *rkey,
					     const FAM(ct_entry_t) *e,
					     __u64 now)
{
	FAM(ct_entry_t) f = *e;
	FAM(ct_entry_t) *r;
	FAM(ct_key_t) fkey;
	int err;

	err = FN(ct_est_insert)(rkey, e, now, false);
	if (err)
		return err;
	FN(ct_key_of)(&fkey, p, CT_FORWARD);
	f.nat_addr = be->addr;
	f.nat_port = be->port;
	err = FN(ct_est_insert)(&fkey, &f, now, false);
	if (!err) {
		ct_admit_add(LB_FAMILY == 6, 1);
		return 0;
	}
	r = bpf_map_lookup_elem(FAM(ct_est), rkey);
	if (r)
		FN(ct_reap)(FAM(ct_est), rkey, r, e->expires);
	return err;
}

/*
 * ct_create - record a new flow from @p's client to the service, translated
 * to backend @be (@backend_id) of service @rev_nat_id, as half-open entries
 * in sluice_conntrack while the half-open share has room (ct_admit_room,
 * ct_est_create), else in sluice_ct_new.
 *
 * The reply tuple <be -> client> must be free. Linux reuses a source port
 * towards different destinations, so a client may talk from one port to
 * two VIPs that share a backend: the reply entry of one would be
 * overwritten by the other's, and its replies would carry the wrong VIP
 * (both are the same tuple at the backend, too). So a live reply entry on
 * the tuple that names another frontend is a clash, left to the caller
 * (another backend, or a drop). One that names this frontend is an earlier
 * flow of this very tuple, which this one supersedes. A new TCP
 * connection also supersedes a closed flow to another frontend
 * (ct_reopens): a client that closed its connection to VIP1 and opens one
 * to VIP2 from the same port (Linux allows that at once: the 4-tuple
 * differs) would otherwise be refused until the old entry's close timeout.
 *
 * An earlier flow on @p's own tuple (its forward entry, closed, lapsed or
 * its backend gone) is superseded (ct_supersede), unless @fresh: the
 * caller's ct_find_any, looking for the flow's forward entry, found none
 * in either map, live or lapsed, so ct_supersede's lookups would find
 * nothing either (two cold lookups saved on nearly every new flow). An
 * entry another CPU makes in between is one ct_supersede could have
 * missed as well, had it been made just after: a second SYN of the same
 * tuple racing this one; the later insert wins its forward key either
 * way.
 *
 * In sluice_ct_new its entries go in by ct_new_insert, which never
 * overwrites an entry that another deleter has claimed (a flush of the
 * tuple's previous flow's backend, say): the flow is then not recorded, and
 * its packet is dropped (-EEXIST) as one of a flow whose reply entry is
 * claimed is (ct_check_reverse); the client sends it again, by when the
 * claimer has deleted the entry. A reply entry inserted before its forward
 * entry is refused goes again.
 *
 * Returns 0, CT_CLASH, -EEXIST (a claimed entry holds a key), or another
 * negative map update error.
 */
static __always_inline int FN(ct_create)(const FAM(pkt_t) *p,
					 const FAM(lb_backend) *be,
					 __u32 backend_id, __u32 rev_nat_id,
					 __u64 now, bool fresh)
{
	FAM(ct_key_t) key = {
		.saddr = be->addr,
		.sport = be->port,
		.daddr = p->saddr,
		.dport = p->sport,
		.proto = p->proto,
		.dir = CT_REVERSE,
	};
	FAM(ct_entry_t) e = {
		.expires = now + ct_lifetime(p->proto, 0),
		.nat_addr = p->daddr,
		.nat_port = p->dport,
		.backend_id = backend_id,
		.rev_nat_id = rev_nat_id,
	};
	FAM(ct_entry_t) *old, *half;
	__u64 seen = CT_DEAD, half_seen = CT_DEAD;
	bool reopen = false, half_reopen = false, live;
	int err;

	old = bpf_map_lookup_elem(FAM(ct_est), &key);
	if (old) {
		seen = READ_ONCE(old->expires);
		if (ct_alive(seen, now) &&
		    (!FAM(addr_eq)(old->nat_addr, p->daddr) ||
		     old->nat_port != p->dport || (old->flags & CT_F_SNAT))) {
			if (!FN(ct_reopens)(p, old))
				return CT_CLASH;
			reopen = true;
		}
	}
	live = FN(ct_new_live)();
	half = live ? bpf_map_lookup_elem(FAM(ct_new), &key) : NULL;
	if (half) {
		half_seen = READ_ONCE(half->expires);
		if (ct_alive(half_seen, now) &&
		    (!FAM(addr_eq)(half->nat_addr, p->daddr) ||
		     half->nat_port != p->dport)) {
			if (!FN(ct_reopens)(p, half))
				return CT_CLASH;
			half_reopen = true;
		}
	}
	if (explain_dry(p))
		return 0;

	if (half_reopen)
		FN(ct_reap_closed)(FAM(ct_new), &key, half, half_seen);
	/* A closed flow's reply entry that is refreshed meanwhile (by a
	 * straggler) stays, and its replies would find it first: a clash
	 * still, until the next retransmission of the SYN.
	 */
	if (reopen) {
		if (!FN(ct_reap_closed)(FAM(ct_est), &key, old, seen))
			return CT_CLASH;
		old = NULL;
	}
	if (!fresh) {
		FAM(ct_key_t) fkey;

		FN(ct_key_of)(&fkey, p, CT_FORWARD);
		FN(ct_supersede)(&fkey);
	}
	if (old)
		FN(ct_reap)(FAM(ct_est), &key, old, seen);

	if (ct_admit_room(LB_FAMILY == 6) &&
	    !FN(ct_est_create)(p, be, &key, &e, now))
		return 0;
	/* Reverse first: a reply never finds a forward entry without it. */
	err = FN(ct_new_insert)(&key, &e);
	if (err < 0)
		return err;
	FN(ct_key_of)(&key, p, CT_FORWARD);
	e.nat_addr = be->addr;
	e.nat_port = be->port;
	err = FN(ct_new_insert)(&key, &e);
	if (err < 0) {
		/* The reply entry goes again (unless refreshed meanwhile):
		 * it would hold the tuple for nothing.
		 */
		key.daddr = key.saddr;
		key.dport = key.sport;
		key.saddr = e.nat_addr;
		key.sport = e.nat_port;
		key.dir = CT_REVERSE;
		half = bpf_map_lookup_elem(FAM(ct_new), &key);
		if (half)
			FN(ct_reap)(FAM(ct_new), &key, half, e.expires);
	}
	return err;
}

/* ct_snat_try's result when the port is held by a flow ct_snat_tw names. */
#define CT_SNAT_TW 2

/*
 * ct_snat_try - one try of ct_create_snat's port search: -ENOSPC if the
 * half-open share is full (ct_snat_room), else ct_est_insert of
 * the reply entry @e under @key, or for a dry run (@dry) ct_est_free;
 * CT_SNAT_TW instead of -EEXIST when the entry that holds the port is a
 * closed flow's in its TIME_WAIT extension (ct_snat_tw), which the search
 * may take over if it finds no free port (with CT_SNAT_TAKES). At tc, a
 * live half-open flow's reply entry (sluice_ct_new) under @key holds the
 * tuple too: tc's clash remap (tc.c, lb4_remap) searches the
 * client's own address, whose other new flows have their reply entries
 * there. XDP never remaps (its flows are source-NATed to a node address,
 * which no half-open entry names) and skips the lookup.
 * With CT_SNAT_TRY_GLOBAL defined (tc.c) a global function, which the
 * verifier checks once, on its own, instead of in each of the SNAT_TRIES
 * iterations of every path that searches (its pointers may then be NULL
 * as far as it knows); XDP, whose IPv6 stack has no room for another
 * frame, inlines it.
 */
#ifdef CT_SNAT_TRY_GLOBAL
#define CT_SNAT_TRY_FN __noinline int
#else
#define CT_SNAT_TRY_FN static __always_inline int
#endif
CT_SNAT_TRY_FN FN(ct_snat_try)(const FAM(ct_key_t) *key,
			       const FAM(ct_entry_t) *e, __u64 now, bool dry)
{
#ifdef CT_SNAT_TRY_GLOBAL
	FAM(ct_entry_t) *half;
#endif
	FAM(ct_entry_t) *old;
	int err;

	if (!key || !e)
		return -ENOENT;
	/* Beyond the half-open share, refused (conntrack.h), a dry run as
	 * well: here rather than once in ct_create_snat, whose frame has no
	 * 8 bytes to spare for it (IPv6's tc path, at 512 combined).
	 */
	if (!ct_snat_room(LB_FAMILY == 6))
		return -ENOSPC;
#ifdef CT_SNAT_TRY_GLOBAL
	half = FN(ct_new_live)() ? bpf_map_lookup_elem(FAM(ct_new), key) : NULL;
	if (half && ct_alive(READ_ONCE(half->expires), now))
		return -EEXIST;
#endif
	if (dry)
		err = FN(ct_est_free)(key, now, true);
	else
		err = FN(ct_est_insert)(key, e, now, true);
	if (err != -EEXIST || !CT_SNAT_TAKES)
		return err;
	old = bpf_map_lookup_elem(FAM(ct_est), key);
	if (old && ct_alive(READ_ONCE(old->expires), now) &&
	    ct_snat_tw(key->proto, READ_ONCE(old->flags),
		       READ_ONCE(old->expires), now))
		return CT_SNAT_TW;
	return -EEXIST;
}
#undef CT_SNAT_TRY_FN

/*
 * ct_snat_take - take the port under @key over from the closed flow in
 * its TIME_WAIT extension that holds it (ct_snat_tw), for @p's new flow
 * whose port search found no free port: delete that flow's entries as a
 * new SYN on a closed tuple does (ct_reap_closed), then insert the reply
 * entry @e; counted tc_snat_tw_reuse. A dry run only counts. netfilter
 * reuses a TIME_WAIT tuple so when its range is exhausted
 * (nf_nat_used_tuple_harder, Linux 6.5). Returns 0, -EEXIST if the port
 * is no longer so held (refreshed, claimed, taken meanwhile), or another
 * ct_est_insert error.
 */
static __always_inline int FN(ct_snat_take)(const FAM(pkt_t) *p,
					    const FAM(ct_key_t) *key,
					    const FAM(ct_entry_t) *e, __u64 now)
{
	FAM(ct_entry_t) *old = bpf_map_lookup_elem(FAM(ct_est), key);
	__u64 seen;
	int err;

	if (!old)
		return -EEXIST;
	seen = READ_ONCE(old->expires);
	if (!ct_alive(seen, now) ||
	    !ct_snat_tw(key->proto, READ_ONCE(old->flags), seen, now))
		return -EEXIST;
	if (!explain_dry(p)) {
		if (!FN(ct_reap_closed)(FAM(ct_est), key, old, seen))
			return -EEXIST;
		err = FN(ct_est_insert)(key, e, now, true);
		if (err)
			return err;
	}
	metric_count(p, METRIC_TC_SNAT_TW_REUSE);
	return 0;
}

/*
 * ct_create_snat - record a flow from @p's client to an external frontend,
 * translated to remote backend @be and source-NATed to @node: reserve a
 * source port by inserting the reply entry <be -> node:port> into
 * sluice_conntrack with BPF_NOEXIST (so no two flows ever share a tuple),
 * trying up to SNAT_TRIES ports of [snat_port_min, snat_port_max], and
 * reclaiming a dead entry in the way. Then record the forward entry,
 * half-open. An earlier flow on @p's tuple (closed, or its backend gone:
 * the caller found it unusable) is superseded before the search, so its
 * port is free to this flow, unless it holds that port for the backend's
 * TIME_WAIT; and again after the search (ct_supersede).
 *
 * A range of SNAT_TRIES ports or fewer is searched whole, each port once,
 * in order (wrapping) from a random start: a free port is always found.
 * A larger one is cut into SNAT_TRIES stretches of range / SNAT_TRIES
 * ports (rounded down or up, together the whole range), and try i takes
 * a port of stretch i at random: SNAT_TRIES distinct ports, spread over
 * the range. In order from a random start (linear probing, the search
 * before), the ports taken gather in runs that a search starting inside
 * one walks along: with 4,536 ports, 80% of them taken, about 3% of new
 * flows found none (a simulation of that search under churn), where
 * tries at random miss with about 0.8^32, 0.08%; at 90%, 13% against
 * 3.4%. Drawn independently (with replacement) they would try fewer
 * distinct ports of a small range: with one port of 33 free, 37% of
 * searches would miss it; spread, only a port of the one stretch of two
 * is ever missed, and half the time: 1 search in 33 on average (as with
 * linear probing). With one of 64 free, half (every stretch has two),
 * against 61%.
 * netfilter's search (nf_nat_l4proto_unique_tuple) is in order too, over
 * 64,512 ports: 128 tries, then 64, 32, 16 and 8 from new random starts
 * (248 in all).
 *
 * A port whose reply entry is a closed flow's is held for the backend's
 * TIME_WAIT (ct_timeout_snat_tw_ns, conntrack.h) and passed over; only if
 * every try finds its port held, or the table full (-E2BIG), is the
 * first one held so past the close timeout taken over (ct_snat_tw,
 * ct_snat_take: its 2 entries deleted, 1 inserted), as netfilter does
 * only when its range is exhausted (nf_nat_used_tuple_harder) or its
 * table full (early_drop).
 *
 * The reservation counts in the half-open share until the flow's first
 * reply (CT_F_ADMITTED, conntrack.h); with the share full, the first try
 * finds so and the search stops: -ENOSPC (ct_snat_try, ct_snat_room).
 *
 * Returns the reserved port (network order) in @port, and 0; 1 if every
 * try found a live flow (none in its TIME_WAIT extension); -ENOSPC if the
 * half-open share is full; or a negative map update error (-E2BIG: the
 * established table is full; -EEXIST: ct_new_insert found the forward
 * key claimed by another deleter, and the port was given back).
 */
#define SNAT_TRIES 32
/* ct_create_snat: a try met the table full (above a port's 16 bits). */
#define CT_SNAT_FULL (1U << 16)

static __always_inline int
FN(ct_create_snat)(const FAM(pkt_t) *p, const FAM(lb_backend) *be,
		   __u32 backend_id, __u32 rev_nat_id, FAM(addr_t) node,
		   __u64 now, __be16 *port, bool fresh)
{
	FAM(ct_key_t) key = {
		.saddr = be->addr,
		.sport = be->port,
		.daddr = node,
		.proto = p->proto,
		.dir = CT_REVERSE,
	};
	FAM(ct_entry_t) e = {
		.expires = now + ct_lifetime(p->proto, CT_F_SNAT),
		.nat_addr = p->daddr,
		.nat_port = p->dport,
		.flags = CT_F_SNAT | CT_F_ADMITTED,
		.backend_id = backend_id,
		.rev_nat_id = rev_nat_id,
		.snat_addr = p->saddr,
		.snat_port = p->sport,
	};
	__u32 start, off, i;
	/* The first port held in TIME_WAIT (low 16 bits), and
	 * CT_SNAT_FULL if a try met the table full: one register (the
	 * stack is at its limit).
	 */
	__u32 tw = 0;
	bool ok = false;
	int err;

	/*
	 * The range's bounds are read where used (load-time constants, which
	 * the verifier knows): registers less to keep across the calls, the
	 * stack being near its limit.
	 */
#define SNAT_RANGE ((__u32)snat_port_max - snat_port_min + 1)
	if (snat_port_max < snat_port_min)
		return 1;
	/* An earlier flow on @p's own tuple goes before the search, so
	 * that the port its reply entry holds is free to this one: a
	 * client's SYN reopening its flow after the backend's RST (closed,
	 * living the close timeout) would find every port of a full range
	 * held, its own flow's among them, and be refused until that
	 * timeout. netfilter kills the closed conntrack a new SYN reopens
	 * (nf_conntrack_proto_tcp, nf_ct_kill) before NAT maps the SYN
	 * afresh. The caller found no usable forward entry, so whatever is
	 * there is a flow ct_supersede is for; but a flow closed by FINs
	 * keeps its port for the backend's TIME_WAIT (ct_snat_held) through
	 * the search, which passes it over as any port so held (or takes
	 * it over, ct_snat_take), and goes after it, as before. @key is the
	 * forward key for that, then the reply key again (no room for
	 * another on the stack). A dry run deletes nothing: its search may
	 * find the port held where the live packet would not. Nor does a
	 * @fresh flow look: the caller's ct_find_any found no entry at all
	 * under its forward key (ct_create's @fresh), three cold lookups
	 * saved on nearly every new flow.
	 */
	if (!explain_dry(p) && !fresh) {
		FAM(ct_entry_t) *old;

		FN(ct_key_of)(&key, p, CT_FORWARD);
		old = bpf_map_lookup_elem(FAM(ct_est), &key);
		if (!old || !ct_closed(READ_ONCE(old->flags)) ||
		    !ct_snat_held(READ_ONCE(old->flags)))
			FN(ct_supersede)(&key);
		key.saddr = be->addr;
		key.sport = be->port;
		key.daddr = node;
		key.dir = CT_REVERSE;
	}
	start = bpf_get_prandom_u32() % SNAT_RANGE;
	for (i = 0; i < SNAT_TRIES && i < SNAT_RANGE; i++) {
		if (SNAT_RANGE <= SNAT_TRIES) {
			off = (start + i) % SNAT_RANGE;
		} else {
			/* Stretch i: [i * range / N, (i + 1) * range / N). */
			off = bpf_get_prandom_u32();
			off = i * SNAT_RANGE / SNAT_TRIES +
			      off % ((i + 1) * SNAT_RANGE / SNAT_TRIES -
				     i * SNAT_RANGE / SNAT_TRIES);
		}
		key.dport = bpf_htons((__u16)(snat_port_min + off));
		err = FN(ct_snat_try)(&key, &e, now, explain_dry(p));
		if (!err) {
			ok = true;
			break;
		}
		if (CT_SNAT_TAKES && err == CT_SNAT_TW) {
			if (!(tw & 0xffff))
				tw |= key.dport;
			continue;
		}
		/* The table full: the search goes on for a port held in
		 * TIME_WAIT, whose entries the take-over frees.
		 */
		if (CT_SNAT_TAKES && err == -E2BIG) {
			tw |= CT_SNAT_FULL;
			continue;
		}
		if (err != -EEXIST)
			return err;
	}
#undef SNAT_RANGE
	if (!ok) {
		/* Every port tried held, or the table full: the first a
		 * closed flow holds only for the backend's TIME_WAIT, if any,
		 * is taken over (netfilter early-drops such a conntrack when
		 * its table is full).
		 */
		if (!CT_SNAT_TAKES || !(tw & 0xffff))
			return tw ? -E2BIG : 1;
		key.dport = (__be16)tw;
		err = FN(ct_snat_take)(p, &key, &e, now);
		if (err)
			return err == -EEXIST ? 1 : err;
	}
	*port = key.dport;
	if (explain_dry(p))
		return 0;
	/* The reservation is in (CT_F_ADMITTED): counted, as ct_create's
	 * flows are; whoever claims it, the give-back below included, or
	 * promotes it takes it off (ct_uncount, ct_promote_snat).
	 */
	ct_admit_add(LB_FAMILY == 6, 1);

	/* Again: another CPU's flow on the tuple (a racing copy of the
	 * SYN) may have taken it during the search; it goes with its port.
	 */
	FN(ct_key_of)(&key, p, CT_FORWARD);
	FN(ct_supersede)(&key);
	e.flags = CT_F_SNAT;
	e.nat_addr = be->addr;
	e.nat_port = be->port;
	e.snat_addr = node;
	e.snat_port = *port;
	err = FN(ct_new_insert)(&key, &e);
	if (err < 0) {
		/* The port goes back (its reservation, unless refreshed). */
		FAM(ct_entry_t) *r;

		key.saddr = be->addr;
		key.sport = be->port;
		key.daddr = node;
		key.dport = *port;
		key.dir = CT_REVERSE;
		r = bpf_map_lookup_elem(FAM(ct_est), &key);
		if (r)
			FN(ct_reap)(FAM(ct_est), &key, r, e.expires);
	}
	return err;
}

/*
 * ct_half_open_elsewhere - whether the tuple of the half-open flow whose
 * reply entry is @rev (under @rkey) is now held by a newer half-open flow
 * (its forward entry, under @fkey, points elsewhere): a late reply of the
 * old backend, which must not promote the old flow over the new one.
 */
static __always_inline bool
FN(ct_half_open_elsewhere)(const FAM(ct_key_t) *fkey, const FAM(ct_key_t) *rkey,
			   const FAM(ct_entry_t) *rev, __u64 now)
{
	FAM(ct_entry_t) *f = bpf_map_lookup_elem(FAM(ct_new), fkey);

	return f && ct_alive(READ_ONCE(f->expires), now) &&
	       !FN(ct_is_peer)(rkey, rev, f);
}

/*
 * ct_new_drop - delete the half-open entry under @key if it is still the
 * one @want describes (the same translation, as ct_est_same asks), as
 * every delete goes: claimed first (ct_reap_now), so one that another
 * deleter has claimed is left to it. A promotion drops its flow's
 * half-open entries so (ct_promote, ct_promote_snat): a plain delete by
 * key, as before, could take an entry another CPU had put there
 * meanwhile, a flow that superseded this one (ct_supersede claims and
 * deletes the forward entry, ct_create inserts its own), which lost its
 * forward entry and had its next packet balanced afresh; or delete an
 * entry a flush had claimed, whose own delete then took whatever was
 * inserted after it (ct_new_insert).
 * Returns whether the flow lost the key meanwhile: an entry is there
 * that another deleter has claimed (a flush ending the flow, a new flow
 * superseding it, between its claim and its delete), or another flow's
 * (the one that superseded it). Nothing under @key is not a loss: another
 * CPU promoting the same flow deleted it, or the LRU evicted it.
 */
static __always_inline bool FN(ct_new_drop)(const FAM(ct_key_t) *key,
					    const FAM(ct_entry_t) *want)
{
	FAM(ct_entry_t) *e = bpf_map_lookup_elem(FAM(ct_new), key);

	if (!e)
		return false;
	if (FAM(addr_eq)(e->nat_addr, want->nat_addr) &&
	    e->nat_port == want->nat_port &&
	    FAM(addr_eq)(e->snat_addr, want->snat_addr) &&
	    e->snat_port == want->snat_port)
		return !FN(ct_reap_now)(FAM(ct_new), key, e);
	return true;
}

/*
 * ct_est_unpromote - take back the entry a promotion inserted under @key
 * into sluice_conntrack (expiring at @expires, as it wrote it) when the
 * flow turned out to be ended or superseded (ct_new_drop): claimed, as
 * every delete is, so an entry refreshed meanwhile (another CPU's
 * promotion of the same flow, which ct_est_same accepted) stays.
 */
static __always_inline void FN(ct_est_unpromote)(const FAM(ct_key_t) *key,
						 __u64 expires)
{
	FAM(ct_entry_t) *e = bpf_map_lookup_elem(FAM(ct_est), key);

	if (e)
		FN(ct_reap_plain)(FAM(ct_est), key, e, expires);
}

/*
 * ct_overflow - keep the entry @e of a flow answered while sluice_conntrack
 * is full in sluice_ct_new, under @key, as it is (CT_F_REPLIED: it lives
 * as an established entry, and its packets no longer try to promote it).
 * So the flow works where it was refused before, and nothing established
 * is evicted for it; it is the evictable kind, as a half-open flow is,
 * until it ends. The table is full mostly of expired entries that only
 * the agent's GC deletes (a burst of short connections, in their close
 * timeout): the agent collects at once when this count grows.
 * It replaces the flow's half-open entry by ct_new_insert, so an entry
 * claimed by another deleter meanwhile (a flush ending the flow; or,
 * for a reply entry re-created by ct_check_reverse, another flow's) is
 * left to it: -EEXIST.
 */
static __always_inline int FN(ct_overflow)(const FAM(ct_key_t) *key,
					   const FAM(ct_entry_t) *e)
{
	return FN(ct_new_insert)(key, e);
}

/*
 * ct_promote - the first reply of the half-open UDP flow whose reply
 * entry @rev was found in sluice_ct_new under @rkey, or the assurance of
 * the answered TCP flow (CT_F_AWAIT, ct_assure_new) whose reply entry it
 * is: insert both of the flow's entries into sluice_conntrack
 * (established; CT_F_ASSURED on a TCP flow's), then drop the half-open
 * ones. (A TCP flow's first reply marks it answered where it is,
 * ct_answer: so a flood answered by its endpoints but never
 * acknowledged stays in the LRU beyond the half-open share.) The forward
 * entry is rebuilt from @rev, which names everything.
 * If the table is full, both stay in sluice_ct_new, established
 * (ct_overflow, counted tc_ct_est_overflow).
 *
 * A key held by a dead entry that another deleter claimed and has not
 * deleted yet (ct_est_claimed: the agent's GC reaping the tuple's previous
 * flow as this one is re-created) is not another flow's: the flow stays
 * half-open and the packet goes on (CT_DEFERRED); the next reply promotes
 * it. Dropping it, as before, lost a datagram or a SYN-ACK now and then
 * while the GC ran (TestCTGCKeepsRecreatedFlows under load).
 *
 * The half-open entries go as every other delete does, claimed first,
 * and only while they are still this flow's (ct_new_drop), the forward
 * one first; one claimed already is left to its claimer. If the forward
 * one is claimed by another deleter, or another flow's, the promotion
 * stops (the reply entry goes all the same: whoever claims the forward
 * entry ends the reply entry too) and takes back the established entries
 * it inserted
 * (ct_est_unpromote), and the reply is a stale one (-ENOENT, as for
 * ct_half_open_elsewhere): whoever claims a flow's entry while it lives
 * ends the flow (a flush of its backend) or takes its tuple (a new flow
 * superseding it, ct_supersede), and the flow must not live on in
 * sluice_conntrack. A flush's pass had perhaps gone over that table
 * already, and the entries escaped it for good; a new flow's half-open
 * forward entry was shadowed by the old flow's established one, which
 * every forward packet finds first. Deferring the promotion instead
 * would translate a reply of a flow that is gone. Checking after the
 * inserts, not before, catches a claim made while they were going in;
 * and a flush goes over sluice_ct_new before sluice_conntrack
 * (ctgc_fam.h), so a promotion that claimed its forward entry first has
 * its established entries in place before the flush's pass over
 * sluice_conntrack begins.
 *
 * Returns 0; CT_OVERFLOW if the flow stays in sluice_ct_new, established;
 * CT_DEFERRED if it stays there half-open; or a negative error: -EEXIST if
 * a live entry of another flow holds a key, -ENOENT if @rev is stale
 * (ct_half_open_elsewhere: it is deleted) or the flow was ended or
 * superseded during the promotion, another map update error.
 */
static __always_inline int FN(ct_promote)(const FAM(ct_key_t) *rkey,
					  const FAM(ct_entry_t) *rev, __u64 now)
{
	FAM(ct_entry_t) r = *rev, f;
	FAM(ct_entry_t) *ins;
	FAM(ct_key_t) fkey;
	bool lost;
	int err;

	FN(ct_peer_key)(&fkey, rkey, &r);
	if (FN(ct_half_open_elsewhere)(&fkey, rkey, &r, now)) {
		FN(ct_new_drop)(rkey, &r);
		return -ENOENT;
	}
	/* A TCP flow moves at its assurance (ct_assure), established. */
	r.flags |= CT_F_REPLIED | ((r.flags & CT_F_AWAIT) ? CT_F_ASSURED : 0);
	r.expires = now + ct_lifetime(rkey->proto, r.flags);
	f = r;
	f.nat_addr = rkey->saddr;
	f.nat_port = rkey->sport;
	/* Never counted as half-open in sluice_conntrack (ct_uncount). */
	f.flags |= CT_F_COUNTED;

	err = FN(ct_est_insert)(rkey, &r, now, false);
	if (err == -EEXIST && FN(ct_est_same)(rkey, &r, now))
		err = 0;
	if (err == -EEXIST && FN(ct_est_claimed)(rkey, now))
		return CT_DEFERRED;
	if (err)
		goto overflow;
	err = FN(ct_est_insert)(&fkey, &f, now, false);
	if (err == -EEXIST && FN(ct_est_same)(&fkey, &f, now))
		err = 0;
	if (err) {
		ins = bpf_map_lookup_elem(FAM(ct_est), rkey);
		if (ins)
			FN(ct_reap_plain)(FAM(ct_est), rkey, ins, r.expires);
		if (err == -EEXIST && FN(ct_est_claimed)(&fkey, now))
			return CT_DEFERRED;
		goto overflow;
	}
	lost = FN(ct_new_drop)(&fkey, &f);
	FN(ct_new_drop)(rkey, &r);
	if (lost) {
		FN(ct_est_unpromote)(&fkey, f.expires);
		FN(ct_est_unpromote)(rkey, r.expires);
		return -ENOENT;
	}
	return 0;

overflow:
#ifdef CT_EST_OVERFLOW
	if (err != -E2BIG)
		return err;
	/* Reverse first, as ct_create: a reply never finds a forward entry
	 * without it.
	 */
	err = FN(ct_overflow)(rkey, &r);
	if (!err)
		err = FN(ct_overflow)(&fkey, &f);
	if (err)
		return err;
	metric_inc(METRIC_TC_CT_EST_OVERFLOW);
	return CT_OVERFLOW;
#else
	return err;
#endif
}

/*
 * ct_promote_snat - the first reply of a source-NATed flow, whose
 * reservation @rev (under @rkey) is already in sluice_conntrack: insert the
 * forward entry there (rebuilt from @rev), mark the reservation
 * answered, drop the half-open forward entry; if the table is full,
 * the forward entry stays in sluice_ct_new, answered (ct_overflow).
 * A UDP flow is established so, its reservation taken off the half-open
 * count; a TCP flow's entries get CT_F_AWAIT too, and the reservation
 * stays counted, its lifetime ct_timeout_syn_ns, until the client's ACK
 * assures the flow (ct_assure).
 * If the forward key is held by a dead entry another deleter claimed and
 * has not deleted yet (ct_est_claimed: the tuple's previous flow, reaped
 * by the GC as the client reuses its port), the flow stays half-open, its
 * reservation unanswered, and the reply goes on (CT_DEFERRED), as in
 * ct_promote; it was dropped as a clash before. The half-open forward
 * entry goes as ct_promote's do: claimed first; if another deleter has
 * claimed it, or another flow holds it, the forward entry inserted is
 * taken back and the reservation left unanswered (-ENOENT), as in
 * ct_promote.
 * Returns as ct_promote.
 */
static __always_inline int FN(ct_promote_snat)(const FAM(ct_key_t) *rkey,
					       FAM(ct_entry_t) *rev, __u64 now)
{
	FAM(ct_entry_t) f = *rev;
	FAM(ct_key_t) fkey;
	__u32 flags;
	int err;

	FN(ct_peer_key)(&fkey, rkey, rev);
	if (FN(ct_half_open_elsewhere)(&fkey, rkey, rev, now)) {
		/* Its claimer takes a counted reservation off the count. */
		FN(ct_reap_now)(FAM(ct_est), rkey, rev);
		return -ENOENT;
	}
	f.flags = (f.flags & ~CT_F_ADMITTED) | CT_F_REPLIED | CT_F_COUNTED |
		  (rkey->proto == IPPROTO_TCP ? CT_F_AWAIT : 0);
	f.expires = now + ct_lifetime(rkey->proto, f.flags);
	f.nat_addr = rkey->saddr;
	f.nat_port = rkey->sport;
	f.snat_addr = rkey->daddr;
	f.snat_port = rkey->dport;
	err = FN(ct_est_insert)(&fkey, &f, now, false);
	if (err == -EEXIST && FN(ct_est_same)(&fkey, &f, now))
		err = 0;
	if (err == -EEXIST && FN(ct_est_claimed)(&fkey, now))
		return CT_DEFERRED;
#ifdef CT_EST_OVERFLOW
	if (err == -E2BIG) {
		err = FN(ct_overflow)(&fkey, &f);
		if (err)
			return err;
		metric_inc(METRIC_TC_CT_EST_OVERFLOW);
		err = CT_OVERFLOW;
	}
#endif
	if (err < 0)
		return err;
	if (!err && FN(ct_new_drop)(&fkey, &f)) {
		FN(ct_est_unpromote)(&fkey, f.expires);
		return -ENOENT;
	}
	/* Answered: a TCP flow's reservation stays counted until its
	 * assurance (ct_assure).
	 */
	if (rkey->proto == IPPROTO_TCP) {
		__sync_fetch_and_or(&rev->flags, CT_F_REPLIED | CT_F_AWAIT);
		FN(ct_refresh)(rev, IPPROTO_TCP, now);
		return err;
	}
	/* A UDP flow's counted reservation leaves the half-open count,
	 * unless a claimer set CT_F_COUNTED first (ct_uncount); after the
	 * refresh, so that nothing but @err is live across that call (the
	 * IPv6 XDP reply path's stack has no slot to spare).
	 */
	flags = __sync_fetch_and_or(&rev->flags, CT_F_REPLIED | CT_F_COUNTED);
	FN(ct_refresh)(rev, rkey->proto, now);
	if ((flags & (CT_F_ADMITTED | CT_F_COUNTED)) == CT_F_ADMITTED)
		ct_admit_add(LB_FAMILY == 6, -1);
	return err;
}

/*
 * ct_promote_here - the first reply of the half-open UDP flow whose reply
 * entry @rev was found in sluice_conntrack under @rkey (without
 * CT_F_REPLIED): promote it in place (the LRU's go by ct_promote). Its
 * forward entry must be there, alive and this flow's (ct_is_peer);
 * CT_F_REPLIED goes on both entries by atomic or (on the forward one with
 * CT_F_COUNTED: the one that sets it first takes the flow off the
 * half-open count, ct_uncount), and both expiries move to the established
 * lifetime (ct_refresh, forward only, never on a claimed entry). Nothing
 * is inserted or deleted. A TCP flow's first reply answers it in place
 * instead (ct_answer).
 *
 * A forward entry of another flow (a newer flow took the tuple; a late
 * reply of the old backend) makes the reply stale: the reply entry goes
 * (ct_reap_now), as ct_half_open_elsewhere's does in sluice_ct_new. One
 * missing or dead (a flush, a superseding flow, the GC ended the flow),
 * or found claimed after the flags were set (a deleter's claim between
 * the lookup and the refresh), makes it stale too: -ENOENT, the reply is
 * not translated, as when ct_promote finds its half-open forward entry
 * claimed (ct_new_drop). The claimer deletes both entries; its
 * CT_F_COUNTED race with this promotion's takes the flow off the count
 * once.
 * Returns 0, or -ENOENT.
 */
static __always_inline int FN(ct_promote_here)(const FAM(ct_key_t) *rkey,
					       FAM(ct_entry_t) *rev, __u64 now)
{
	FAM(ct_entry_t) *f;
	FAM(ct_key_t) fkey;

	FN(ct_peer_key)(&fkey, rkey, rev);
	f = bpf_map_lookup_elem(FAM(ct_est), &fkey);
	if (!f || !ct_alive(READ_ONCE(f->expires), now))
		return -ENOENT;
	if (!FN(ct_is_peer)(rkey, rev, f)) {
		FN(ct_reap_now_plain)(FAM(ct_est), rkey, rev);
		return -ENOENT;
	}
	if (!(__sync_fetch_and_or(&f->flags, CT_F_REPLIED | CT_F_COUNTED) &
	      (CT_F_REPLIED | CT_F_COUNTED)))
		ct_admit_add(LB_FAMILY == 6, -1);
	__sync_fetch_and_or(&rev->flags, CT_F_REPLIED);
	FN(ct_refresh)(f, rkey->proto, now);
	FN(ct_refresh)(rev, rkey->proto, now);
	if (READ_ONCE(f->expires) == CT_DEAD)
		return -ENOENT;
	return 0;
}

/*
 * ct_answer - the first reply (the SYN-ACK) of the half-open TCP flow
 * whose reply entry @rev was found in @map under @rkey (without
 * CT_F_REPLIED), in sluice_conntrack or in sluice_ct_new: answered in
 * place. Its forward entry must be in @map, alive and this flow's
 * (ct_is_peer); CT_F_REPLIED with CT_F_AWAIT goes on both, in one or
 * each, on the reply entry first and then the forward one, which
 * ct_assure looks at, and both are refreshed (still ct_timeout_syn_ns).
 * The flow stays counted until its client's ACK assures it (ct_assure),
 * where netfilter's conntrack is SYN_RECV. Nothing is inserted or
 * deleted; a stale reply is as ct_promote_here's. Returns 0, or -ENOENT.
 */
static __always_inline int FN(ct_answer)(void *map, const FAM(ct_key_t) *rkey,
					 FAM(ct_entry_t) *rev, __u64 now)
{
	FAM(ct_entry_t) *f;
	FAM(ct_key_t) fkey;

	FN(ct_peer_key)(&fkey, rkey, rev);
	f = bpf_map_lookup_elem(map, &fkey);
	if (!f || !ct_alive(READ_ONCE(f->expires), now))
		return -ENOENT;
	if (!FN(ct_is_peer)(rkey, rev, f)) {
		FN(ct_reap_now_plain)(map, rkey, rev);
		return -ENOENT;
	}
	__sync_fetch_and_or(&rev->flags, CT_F_REPLIED | CT_F_AWAIT);
	__sync_fetch_and_or(&f->flags, CT_F_REPLIED | CT_F_AWAIT);
	FN(ct_refresh)(f, IPPROTO_TCP, now);
	FN(ct_refresh)(rev, IPPROTO_TCP, now);
	if (READ_ONCE(f->expires) == CT_DEAD)
		return -ENOENT;
	return 0;
}

/*
 * ct_reply_dry - ct_reply for a dry run (explain.h): the live entry under
 * @key, established or half-open, which would translate the reply;
 * promoted and refreshed nothing. That a promotion could fail (a full
 * table) is not foreseen.
 */
static __always_inline FAM(ct_entry_t) *
FN(ct_reply_dry)(const FAM(ct_key_t) *key, __u64 now)
{
	FAM(ct_entry_t) *e = bpf_map_lookup_elem(FAM(ct_est), key);

	if (e && ct_alive(READ_ONCE(e->expires), now))
		return e;
	if (!FN(ct_new_live)())
		return NULL;
	e = bpf_map_lookup_elem(FAM(ct_new), key);
	if (e && ct_alive(READ_ONCE(e->expires), now))
		return e;
	return NULL;
}

/*
 * ct_reply - the entry that translates @p if it is a reply of a
 * translated flow (its key in @key): an established flow's, refreshed; or
 * that of a half-open one, which this first reply promotes (ct_promote).
 *
 * A half-open flow in sluice_conntrack is promoted in place
 * (ct_promote_here; TCP: answered, ct_answer), and so is a TCP flow in
 * sluice_ct_new (answered there, to move at its assurance: ct_assure); a
 * stale reply of one is not a reply (NULL, @err 0).
 * sluice_ct_new is looked in only while it may hold entries (ct_new_live).
 * There, a TCP reply with SYN set (the backend's SYN-ACK) is looked up
 * first: its flow is half-open but for a retransmitted
 * SYN-ACK, so the first reply saves sluice_conntrack's miss. A live
 * half-open entry found so is promoted (TCP: answered) at once; ct_create
 * keeps a live established entry of another frontend off its tuple (a
 * clash), and one of the same frontend that it could not reap (refreshed
 * meanwhile) names the same translation, which ct_promote's ct_est_same
 * accepts.
 * Anything else found there (an overflowed flow, a lapsed entry) is
 * looked up in the order below, as any reply's. A source-NATed flow's
 * SYN-ACK, whose port reservation is in sluice_conntrack from the start,
 * pays the miss in sluice_ct_new instead.
 *
 * Returns the entry (in sluice_conntrack; in sluice_ct_new for a flow
 * kept or answered there), or NULL with @err 0 if @p is not such a
 * reply, or NULL with a negative @err if the flow cannot be promoted
 * (-E2BIG: refused, the table is full): drop @p.
 */
static __always_inline FAM(ct_entry_t) *
FN(ct_reply)(const FAM(pkt_t) *p, FAM(ct_key_t) *key, __u64 now, int *err)
{
	FAM(ct_entry_t) *e;
	__u32 flags;

	*err = 0;
	FN(ct_key_of)(key, p, CT_REVERSE);
	if (explain_dry(p))
		return FN(ct_reply_dry)(key, now);
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & TCP_FLAG_SYN) &&
	    FN(ct_new_live)()) {
		e = bpf_map_lookup_elem(FAM(ct_new), key);
		if (e && ct_alive(READ_ONCE(e->expires), now) &&
		    !(READ_ONCE(e->flags) & CT_F_REPLIED))
			goto promote;
	}
	e = bpf_map_lookup_elem(FAM(ct_est), key);
	if (e && ct_alive(READ_ONCE(e->expires), now)) {
		flags = READ_ONCE(e->flags);
		/* A half-open flow there: promoted (TCP: answered) in
		 * place.
		 */
		if (!(flags & (CT_F_REPLIED | CT_F_SNAT))) {
			if (p->proto == IPPROTO_TCP)
				return FN(ct_answer)(FAM(ct_est), key, e, now) ?
					       NULL :
					       e;
			return FN(ct_promote_here)(key, e, now) ? NULL : e;
		}
		/* A port reservation whose flow has seen no reply yet. */
		if (!(flags & CT_F_REPLIED)) {
			*err = FN(ct_promote_snat)(key, e, now);
			if (*err == -ENOENT || *err > 0)
				*err = 0;
			if (*err)
				return NULL;
		}
		FN(ct_touch)(key, e, now);
		return e;
	}
	if (!FN(ct_new_live)())
		return NULL;
	e = bpf_map_lookup_elem(FAM(ct_new), key);
	if (!e || !ct_alive(READ_ONCE(e->expires), now))
		return NULL;
	/* A flow kept here while the table was full (ct_overflow), or a
	 * TCP flow answered and not yet assured (ct_answer).
	 */
	if (READ_ONCE(e->flags) & CT_F_REPLIED) {
		FN(ct_touch)(key, e, now);
		return e;
	}
promote:
	/* A TCP flow: answered in place, to move at its assurance. */
	if (p->proto == IPPROTO_TCP)
		return FN(ct_answer)(FAM(ct_new), key, e, now) ? NULL : e;
	*err = FN(ct_promote)(key, e, now);
	if (*err == -ENOENT)
		*err = 0;
	if (*err == CT_DEFERRED) {
		*err = 0;
		return e;
	}
	if (*err == CT_OVERFLOW) {
		*err = 0;
		return bpf_map_lookup_elem(FAM(ct_new), key);
	}
	if (*err)
		return NULL;
	return bpf_map_lookup_elem(FAM(ct_est), key);
}

/*
 * ct_check_reverse_as - before a packet of the live forward entry @fwd
 * (under @key), whose flags its caller read as @flags, is sent, make sure
 * the flow's reply entry is there and is this flow's: refresh it, or
 * re-create it if it was deleted (a flush) or has lapsed.
 *
 * A reply tuple held by a dead entry another deleter claimed and has not
 * deleted yet is not deferred, unlike ct_promote's: the flow's replies
 * would go out untranslated meanwhile (a TCP client answers such a reply
 * with a RST to the backend, which ends the connection there), where a
 * dropped packet is sent again. Who claims a reply entry while its
 * flow's forward entry lives ends the flow (a flush; a new flow that
 * supersedes it, ct_supersede) or takes the tuple (a new flow with the
 * same reply tuple: a clash); the GC keeps it. ct_est_insert tries once
 * more after a claimed entry, in case its delete came meanwhile.
 *
 * Returns 0; -EEXIST if a live entry of another flow holds the reply
 * tuple (for a source-NATed flow: its port was lost and taken), or one
 * claimed by another deleter, and the packet must not be sent, for its
 * replies would go to that flow or nowhere; or another negative error if
 * the entry cannot be re-created (-E2BIG: the table is full).
 */
static __always_inline int FN(ct_check_reverse_as)(const FAM(pkt_t) *p,
						   const FAM(ct_key_t) *key,
						   const FAM(ct_entry_t) *fwd,
						   __u32 flags, __u64 now)
{
	/* Answered but unassured is half-open here: its entries may be in
	 * sluice_ct_new, whose LRU may evict the reply entry alone; it is
	 * re-created there, beside the forward entry, and moves with it at
	 * the assurance (ct_assure_new). Without a branch (in bit 0): one
	 * less for the verifier to walk on every path.
	 */
	bool half_open = ~(flags / CT_F_SNAT) &
			 (~(flags / CT_F_REPLIED) | ct_awaiting_bit(flags)) & 1;
	FAM(ct_entry_t) e = {
		.expires = now + ct_lifetime(p->proto, flags),
		.nat_addr = key->daddr,
		.nat_port = key->dport,
		.flags = flags,
		.backend_id = fwd->backend_id,
		.rev_nat_id = fwd->rev_nat_id,
	};
	FAM(ct_entry_t) *rev, *old;
	FAM(ct_key_t) rkey;
	__u64 seen, got;
	bool in_est = false;
	int err;

	FN(ct_peer_key)(&rkey, key, fwd);
	if (half_open) {
		/* In the table its forward entry is in (in_est). */
		rev = bpf_map_lookup_elem(FAM(ct_est), &rkey);
		if (!rev && FN(ct_new_live)())
			rev = bpf_map_lookup_elem(FAM(ct_new), &rkey);
	} else {
		rev = bpf_map_lookup_elem(FAM(ct_est), &rkey);
#ifdef CT_EST_OVERFLOW
		/* An established flow kept in sluice_ct_new (ct_overflow). */
		if (!rev && !(flags & CT_F_SNAT) && FN(ct_new_live)())
			rev = bpf_map_lookup_elem(FAM(ct_new), &rkey);
#endif
	}
	if (rev) {
		seen = READ_ONCE(rev->expires);
		if (FN(ct_is_peer)(key, fwd, rev)) {
			if (ct_alive(seen, now)) {
				if (!explain_dry(p))
					FN(ct_refresh)(rev, p->proto, now);
				return 0;
			}
			if (explain_dry(p))
				return 0; /* it would be revived */
			/* This flow's, lapsed: revive it, unless a deleter
			 * has claimed it already. If another CPU with a
			 * packet of this flow revived it first, it is alive:
			 * as good. (This packet went on to the insert then,
			 * which found it alive: dropped as a clash.)
			 */
			if (seen != CT_DEAD) {
				got = __sync_val_compare_and_swap(
					&rev->expires, seen, e.expires);
				if (got == seen || ct_alive(got, now))
					return 0;
			}
		} else if (ct_alive(seen, now)) {
			return -EEXIST;
		}
	}
	if (flags & CT_F_SNAT) {
		e.snat_addr = key->saddr;
		e.snat_port = key->sport;
	}
	if (half_open) {
		/* Into the table its forward entry is in. */
		old = bpf_map_lookup_elem(FAM(ct_est), key);
		in_est = old && ct_alive(READ_ONCE(old->expires), now);
	}
	if (explain_dry(p))
		return half_open && !in_est ?
			       0 :
			       FN(ct_est_free)(&rkey, now, false);
	if (half_open && !in_est)
		return FN(ct_new_insert)(&rkey, &e);
	err = FN(ct_est_insert)(&rkey, &e, now, false);
#ifdef CT_EST_OVERFLOW
	if (err == -E2BIG && !(flags & CT_F_SNAT))
		err = FN(ct_overflow)(&rkey, &e);
#endif
	return err;
}

/* ct_check_reverse - ct_check_reverse_as by @fwd's flags now. */
static __always_inline int FN(ct_check_reverse)(const FAM(pkt_t) *p,
						const FAM(ct_key_t) *key,
						const FAM(ct_entry_t) *fwd,
						__u64 now)
{
	return FN(ct_check_reverse_as)(p, key, fwd, READ_ONCE(fwd->flags), now);
}

/*
 * ct_check_reverse_snat - ct_check_reverse of a source-NATed flow's
 * forward entry @fwd (XDP follows no other): CT_F_SNAT, set at the
 * entry's creation and never taken off, is known to the compiler and the
 * verifier, which then neither build nor explore the branches of the
 * flows it does not follow (half-open, unassured, kept in sluice_ct_new).
 */
static __always_inline int FN(ct_check_reverse_snat)(const FAM(pkt_t) *p,
						     const FAM(ct_key_t) *key,
						     const FAM(ct_entry_t) *fwd,
						     __u64 now)
{
	return FN(ct_check_reverse_as)(p, key, fwd,
				       READ_ONCE(fwd->flags) | CT_F_SNAT, now);
}

/*
 * ct_check_reverse_due - ct_check_reverse for a packet of the live
 * forward entry @fwd (under @key), whose refresh by this packet stored
 * (@refreshed) or not; skipped for an established flow that is not
 * source-NATed while its forward entry needs no refresh. Returns as
 * ct_check_reverse.
 *
 * Such a flow's reply entry was checked whenever its forward entry's
 * expiry last moved: by the promotion, which inserted both; by a client
 * packet whose refresh stored (this check); by a reply, whose ct_touch
 * refreshes the reply entry first. So it lives until a second before the
 * forward entry at the earliest, and once the forward entry is due again
 * its next packet checks. Deleted alone it is not: the GC keeps an entry
 * whose flow's other entry lives, and a flush, a deletion by sluicectl,
 * a superseding or reopening flow take both. A source-NATed flow
 * (its reply entry holds its port) and a half-open or answered but
 * unassured one (an LRU may evict its reply entry alone) are checked on
 * every packet, as is a dry run's.
 */
static __always_inline int FN(ct_check_reverse_due)(const FAM(pkt_t) *p,
						    const FAM(ct_key_t) *key,
						    const FAM(ct_entry_t) *fwd,
						    __u64 now, bool refreshed)
{
	__u32 flags = READ_ONCE(fwd->flags);

	if (!refreshed && !explain_dry(p) &&
	    ((flags / CT_F_REPLIED) & ~(flags / CT_F_SNAT) &
	     ~ct_awaiting_bit(flags) & 1))
		return 0;
	return FN(ct_check_reverse)(p, key, fwd, now);
}

/*
 * ct_assure_due - whether @p, a packet of the flow whose live forward
 * entry @fwd it found, assures that flow (ct_assure): a TCP client's
 * packet with ACK and without SYN, FIN or RST (the handshake's ACK, or
 * any later one) to a flow answered but not yet assured (ct_awaiting).
 * A retransmitted SYN does not (netfilter keeps SYN_RECV), nor a RST, a
 * FIN (FIN_WAIT there, not ESTABLISHED), a later fragment (no TCP
 * header) or a dry run.
 */
static __always_inline bool FN(ct_assure_due)(const FAM(pkt_t) *p,
					      const FAM(ct_entry_t) *fwd)
{
	return p->proto == IPPROTO_TCP && !p->frag_later && !explain_dry(p) &&
	       (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_FIN |
				TCP_FLAG_RST)) == TCP_FLAG_ACK &&
	       ct_awaiting(READ_ONCE(fwd->flags));
}

#ifdef CT_EST_OVERFLOW
/*
 * ct_assure_new - ct_assure of a flow (not source-NATed) whose entries are
 * in sluice_ct_new, its forward entry @fwd under @key: beyond the
 * half-open share when it started, answered there (ct_answer). It
 * moves to sluice_conntrack, established (ct_promote: the LRU-to-table
 * move a UDP flow makes at its first reply), or stays in sluice_ct_new,
 * established, if the table is full (ct_overflow). A flow whose move
 * waits for a claimed key (CT_DEFERRED) is assured by its next packet; one
 * that cannot move otherwise (its reply entry evicted since the packet's
 * ct_check_reverse, which re-creates it in sluice_ct_new; a key held) is
 * assured where it is, as an overflowed one. At tc only: XDP follows
 * source-NATed flows only.
 */
static __always_inline void FN(ct_assure_new)(const FAM(ct_key_t) *key,
					      FAM(ct_entry_t) *fwd, __u64 now)
{
	FAM(ct_entry_t) *pe;
	FAM(ct_key_t) pkey;
	int err = -ENOENT;

	pe = FN(ct_peer)(key, fwd, now, &pkey);
	if (pe && bpf_map_lookup_elem(FAM(ct_new), &pkey) == pe)
		err = FN(ct_promote)(&pkey, pe, now);
	if (err == 0 || err == CT_OVERFLOW || err == CT_DEFERRED)
		return;
	if (pe)
		__sync_fetch_and_or(&pe->flags, CT_F_ASSURED);
	__sync_fetch_and_or(&fwd->flags, CT_F_ASSURED);
}
#endif

/*
 * ct_assure - the client's ACK (ct_assure_due) after the answer of the
 * TCP flow whose forward entry @fwd it found under @key: the flow is
 * established (netfilter's IPS_ASSURED). It leaves the half-open count:
 * by an atomic or of CT_F_COUNTED on the entry that holds its place (the
 * forward entry in sluice_conntrack, or a source-NATed flow's port
 * reservation), whoever sets it first taking it off (two ACKs racing,
 * or a deleter claiming the entry: ct_uncount); then CT_F_ASSURED goes
 * on both entries (after CT_F_COUNTED: ct_counts must never read an
 * assured entry as counted) and their expiries move to the established
 * lifetime (ct_refresh). A flow whose entries are in sluice_ct_new moves
 * to sluice_conntrack (ct_assure_new).
 * The other entry is found live (ct_peer) even if it had lapsed and was
 * kept (the GC keeps a port reservation beside its live forward entry):
 * every caller runs the packet's ct_check_reverse first, which revives
 * it, or drops a source-NATed flow's packet when it cannot; so a kept
 * reservation is taken off the count here as ct_uncount, which goes by
 * the flags alone, would take it off when claimed.
 * A global function with CT_ASSURE_GLOBAL defined (tc.c, xdp.c), which
 * the verifier checks once, on its own, and whose frame is not added to
 * every packet's path: it runs once a flow (its pointers may be NULL as
 * far as the verifier knows). Returns 0.
 */
#ifdef CT_ASSURE_GLOBAL
__noinline int FN(ct_assure)(const FAM(ct_key_t) *key, FAM(ct_entry_t) *fwd,
			     __u64 now)
{
	FAM(ct_entry_t) *pe;
	FAM(ct_key_t) pkey;

	if (!key || !fwd)
		return 0;
	if (!(READ_ONCE(fwd->flags) & CT_F_SNAT) &&
	    bpf_map_lookup_elem(FAM(ct_est), key) != fwd) {
#ifdef CT_EST_OVERFLOW
		FN(ct_assure_new)(key, fwd, now);
#endif
		return 0;
	}
	if (!(READ_ONCE(fwd->flags) & CT_F_SNAT) &&
	    ct_counts(CT_FORWARD,
		      __sync_fetch_and_or(&fwd->flags, CT_F_COUNTED)))
		ct_admit_add(LB_FAMILY == 6, -1);
	pe = FN(ct_peer)(key, fwd, now, &pkey);
	if (pe) {
		if (ct_counts(CT_REVERSE,
			      __sync_fetch_and_or(&pe->flags, CT_F_COUNTED)))
			ct_admit_add(LB_FAMILY == 6, -1);
		__sync_fetch_and_or(&pe->flags, CT_F_ASSURED);
		FN(ct_refresh)(pe, IPPROTO_TCP, now);
	}
	__sync_fetch_and_or(&fwd->flags, CT_F_ASSURED);
	FN(ct_refresh)(fwd, IPPROTO_TCP, now);
	return 0;
}
#endif
