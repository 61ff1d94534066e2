/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The family-dependent notes of a dry run (explain.h), a template
 * (family.h) that explain.h includes once per family: explain_frontend
 * and the rest for a struct pkt4, explain_frontend6 ... for a struct
 * pkt6, whose addresses go to sluice_expl6_v1. No include guard, on
 * purpose.
 */

/* FN(explain_frontend) - the frontend @p is for, whose default scope is
 * @svc.
 */
static __always_inline void FN(explain_frontend)(const FAM(pkt_t) *p,
						 const struct lb4_service *svc)
{
	if (!explain_dry(p))
		return;
	explain_set(EXPLAIN_F_FRONTEND, 1, FAM(explain_word)(p->daddr),
		    p->dport | (__u32)p->proto << 16, svc->flags);
	FAM(explain_addr6)(1, p->daddr);
}

/*
 * FN(explain_backend) - @p goes to <@addr, @port>, backend @backend_id,
 * named by @slot (0: its conntrack entry decided).
 */
static __always_inline void FN(explain_backend)(const FAM(pkt_t) *p,
						__u32 backend_id, __u16 slot,
						FAM(addr_t) addr, __be16 port)
{
	if (!explain_dry(p))
		return;
	explain_set(EXPLAIN_F_DNAT, 3, backend_id, slot | (__u32)port << 16,
		    FAM(explain_word)(addr));
	FAM(explain_addr6)(3, addr);
}

/*
 * FN(explain_snat) - @p is source-NATed to <@addr, @port> (a reply: its
 * destination becomes that); @flag says which.
 */
static __always_inline void FN(explain_snat)(const FAM(pkt_t) *p, __u32 flag,
					     FAM(addr_t) addr, __be16 port)
{
	if (!explain_dry(p))
		return;
	explain_set(flag, 4, FAM(explain_word)(addr), port, 0);
	FAM(explain_addr6)(4, addr);
}

/*
 * FN(explain_reply) - @p, a reply, gets <@addr, @port> (its frontend) as
 * its source.
 */
static __always_inline void FN(explain_reply)(const FAM(pkt_t) *p,
					      FAM(addr_t) addr, __be16 port)
{
	if (!explain_dry(p))
		return;
	explain_set(EXPLAIN_F_REPLY, 1, FAM(explain_word)(addr),
		    port | (__u32)p->proto << 16, 0);
	FAM(explain_addr6)(1, addr);
}
