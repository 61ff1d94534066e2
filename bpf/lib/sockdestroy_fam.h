/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent half of sockdestroy.c (its design is there), a
 * template (family.h) that sockdestroy.c includes once per family of
 * backend: sock_term over sluice_ct_flush_v1, sluice_sock_rev_v1 and the
 * IPv4 services, sock_term6 over their sluice6_* twins. The family is the
 * backend's, not the socket's: a dual-stack socket connected to
 * ::ffff:a.b.c.d is judged by the IPv4 half. No include guard, on
 * purpose.
 */

/* FN(slot_names)' bpf_loop state: is <addr, port> in slot 1..count? */
struct FN(slot_search) {
	struct lb4_service master; /* the frontend's, as read once */
	FAM(addr_t) addr;
	__be16 port;
	bool found;
};

static long FN(slot_names)(__u32 i, void *data)
{
	struct FN(slot_search) *s = data;
	FAM(lb_backend) *be;
	__u32 *id;

	id = FN(lookup_slot)(&s->master, i + 1);
	if (!id)
		return 0;
	be = FN(lookup_backend)(READ_ONCE(*id));
	if (be && FAM(addr_eq)(be->addr, s->addr) && be->port == s->port) {
		s->found = true;
		return 1;
	}
	return 0;
}

/*
 * still_backend - whether the Service of the VIP in @rev still has the UDP
 * backend <@addr, @port> in one of its slots.
 */
static __always_inline bool FN(still_backend)(const FAM(sock_rev_t) *rev,
					      FAM(addr_t) addr, __be16 port)
{
	struct FN(slot_search) s = {
		.addr = addr,
		.port = port,
	};
	struct lb4_service *master =
		FN(lookup_service)(rev->vip, rev->port, IPPROTO_UDP);

	if (!master || master->count == 0)
		return false;
	s.master = *master;
	bpf_loop(s.master.count, FN(slot_names), &s, 0);
	return s.found;
}

/* talked_to's state: the first flushed backend the socket talked to. */
struct FN(flushed_search) {
	__u64 cookie;
	FAM(addr_t) addr;
	__be16 port;
	bool found;
};

static long FN(talked_to)(void *map, const FAM(ct_backend_key_t) *b, __u8 *v,
			  void *data)
{
	struct FN(flushed_search) *s = data;
	FAM(sock_rev_key_t) rkey = {
		.cookie = s->cookie,
		.addr = b->addr,
		.port = b->port,
	};

	if (b->proto != IPPROTO_UDP ||
	    !bpf_map_lookup_elem(&FAM(sock_rev_map), &rkey))
		return 0;
	s->addr = b->addr;
	s->port = b->port;
	s->found = true;
	return 1;
}

/*
 * spare_unconnected - report the unconnected socket @cookie spared if it
 * was translated to one of the family's flushed backends (counted only:
 * it selects again by itself). Returns whether it was.
 */
static __always_inline bool FN(spare_unconnected)(struct bpf_iter__udp *ctx,
						  __u64 cookie)
{
	struct FN(flushed_search) s = { .cookie = cookie };

	bpf_for_each_map_elem(&FAM(ct_flush_map), FN(talked_to), &s, 0);
	if (s.found)
		FN(report)(ctx, cookie, s.addr, s.port,
			   SOCK_TERM_SPARED_UNCONNECTED);
	return s.found;
}

/*
 * sock_term - judge the connected socket @sk (cookie @cookie) whose peer
 * is <@daddr, @dport>: destroyed if that is a flushed backend it reached
 * through a VIP whose Service no longer has it (reported), spared if the
 * Service still has it (reported), else left alone.
 */
static __always_inline void FN(sock_term)(struct bpf_iter__udp *ctx,
					  struct sock *sk, __u64 cookie,
					  FAM(addr_t) daddr, __be16 dport)
{
	FAM(ct_backend_key_t) b = { .proto = IPPROTO_UDP };
	FAM(sock_rev_key_t) rkey = {};
	FAM(sock_rev_t) *rev;

	b.addr = daddr;
	b.port = dport;
	if (!bpf_map_lookup_elem(&FAM(ct_flush_map), &b))
		return;
	rkey.cookie = cookie;
	rkey.addr = b.addr;
	rkey.port = b.port;
	rev = bpf_map_lookup_elem(&FAM(sock_rev_map), &rkey);
	if (!rev)
		return;
	if (FN(still_backend)(rev, b.addr, b.port)) {
		FN(report)(ctx, cookie, b.addr, b.port,
			   SOCK_TERM_SPARED_STILL_BACKEND);
		return;
	}
	FN(report)(ctx, cookie, b.addr, b.port,
		   bpf_sock_destroy((struct sock_common *)sk) ?
			   SOCK_TERM_FAILED :
			   SOCK_TERM_DESTROYED);
}
