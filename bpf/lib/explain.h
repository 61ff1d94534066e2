/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Dry runs of the tc program, for `sluicectl explain`: the program itself
 * decides what it would do with a crafted packet, against the live maps,
 * and changes nothing.
 *
 * The mark. sluicectl runs the attached program with BPF_PROG_TEST_RUN and
 * sets cb[0] and cb[1] of the context to EXPLAIN_MAGIC0/1 (ctx_in, struct
 * __sk_buff). cb[] alone is not proof: it is the qdisc cb that every tc
 * program of a device may write, so another one could leave any value
 * there. So the mark also needs the skb's socket to be of type 0, which
 * only the dummy socket test_run gives its skb has (net/bpf/test_run.c:
 * sk_alloc of bpf_dummy_proto, zeroed, and sock_init_data(NULL, sk), which
 * sets no type). A real skb at tc has no socket (ingress), or the socket
 * that sent it (egress): a socket(2) socket, whose type is never 0.
 *
 * The bit. A marked packet is sent by a tail call (explain_divert,
 * sluice_dry_v1) to the program's dry twin: the same source built with
 * the packet's struct pkt4 .dry a constant true, which every function that
 * decides about the packet already takes; explain_dry() is the one check
 * every write site makes (the compiler removes the writes from the twin,
 * and the dry-run notes from the live program). The live program itself
 * never runs a marked packet: with no twin in the array (an agent that
 * did not set it up), the packet passes, untouched and unrecorded. The
 * bit is not a per-CPU flag: BPF_PROG_TEST_RUN runs with migration, not
 * preemption, disabled, so a task preempting the dry run on its CPU, or a
 * softirq interrupting it, would run the real datapath with that flag set
 * and leave real flows untracked.
 *
 * The record. What the dry run decided goes into sluice_expl_v1, a per-CPU
 * array of one struct explain_record, written only by a dry run: reset at
 * its start, filled as it decides. sluicectl pins itself to one CPU, runs
 * the program there and reads that CPU's record; cb[2] and cb[3] carry a
 * nonce the record keeps, so a record another dry run overwrote on the
 * same CPU meanwhile (sluicectl preempted by another sluicectl) is seen
 * and the run repeated. The map (maps.h) is not pinned: it is no state,
 * and sluicectl finds it among the attached program's maps by name, whose
 * version says its layout; an agent without it predates dry runs.
 *
 * IPv6. A marked IPv6 packet goes to the dry twin of the IPv6 program
 * (tc6.h, slots EXPLAIN_PROG_IPV6 up), built the same way from the same
 * source with struct pkt6 .dry true. Its record is sluice_expl_v1's as
 * well, with the address words zero: the addresses, 16 bytes each, go to
 * sluice_expl6_v1 (struct explain6_record, the same nonce, reset by the
 * entry: explain_divert), so that explain_record keeps its layout. The
 * notes below that name addresses are written once for both families
 * (explain_fam.h, family.h); the others take either packet.
 */
#ifndef SLUICE_EXPLAIN_H
#define SLUICE_EXPLAIN_H

#include "consts.h"
#include "structs.h"
#include "metrics.h"
#include "parse.h"
#include "parse6.h"
#include "svcstats.h"
#include "family.h"

/* cb[0] and cb[1] of a dry run ("slex", "plan"). */
#define EXPLAIN_MAGIC0 0x736c6578
#define EXPLAIN_MAGIC1 0x706c616e

/* The slots of sluice_dry_v1: IPv4's, then IPv6's (EXPLAIN_PROG_IPV6 on). */
#define EXPLAIN_PROG_INGRESS 0
#define EXPLAIN_PROG_EGRESS  1
#define EXPLAIN_PROG_IPV6    2

/* explain_rec6 - this CPU's IPv6 addresses. */
static __always_inline struct explain6_record *explain_rec6(void)
{
	__u32 key = 0;

	return bpf_map_lookup_elem(&sluice_expl6_v1, &key);
}

/*
 * explain_divert - run @skb, a marked packet, through the dry twin in
 * slot @prog, or its IPv6 twin's for an IPv6 packet. Returns only if
 * there is none: TC_ACT_OK, having done nothing (sluicectl finds no
 * record and says so).
 *
 * An IPv6 packet's address record is reset here, by the entry, with the
 * run's nonce (the twin resets the rest, explain_begin): the entry then
 * names sluice_expl6_v1, so the map is among the attached program's,
 * where sluicectl finds it; its IPv4 code never names it.
 */
static __always_inline int explain_divert(struct __sk_buff *skb, __u32 prog)
{
	struct explain6_record *r6;

	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		r6 = explain_rec6();
		if (r6) {
			__builtin_memset(r6, 0, sizeof(*r6));
			r6->nonce[0] = skb->cb[2];
			r6->nonce[1] = skb->cb[3];
		}
		prog += EXPLAIN_PROG_IPV6;
	}
	bpf_tail_call(skb, &sluice_dry_v1, prog);
	return TC_ACT_OK;
}

/*
 * explain_dry - whether @p, a struct pkt4 or pkt6, is a dry run's packet:
 * change nothing for it.
 */
#define explain_dry(p) ((p)->dry)

/*
 * explain_mark - whether @skb carries the dry-run mark (see the top).
 * Read by the program's entry only, into pkt4.dry.
 */
static __always_inline bool explain_mark(struct __sk_buff *skb)
{
	struct bpf_sock *sk;

	if (skb->cb[0] != EXPLAIN_MAGIC0 || skb->cb[1] != EXPLAIN_MAGIC1)
		return false;
	sk = skb->sk;
	if (!sk)
		return false;
	sk = bpf_sk_fullsock(sk);
	return sk && sk->type == 0;
}

/* explain_rec - this CPU's record. */
static __always_inline struct explain_record *explain_rec(void)
{
	__u32 key = 0;

	return bpf_map_lookup_elem(&sluice_expl_v1, &key);
}

/* explain_begin - reset the record for a dry run from @skb (@dry). */
static __always_inline void explain_begin(struct __sk_buff *skb, bool dry)
{
	struct explain_record *r;

	if (!dry)
		return;
	r = explain_rec();
	if (!r)
		return;
	__builtin_memset(r, 0, sizeof(*r));
	r->nonce[0] = skb->cb[2];
	r->nonce[1] = skb->cb[3];
	r->flags = EXPLAIN_F_DRY;
}

/*
 * The writers of the record are global functions, which the verifier
 * checks once, on their own, rather than at each of the dozens of places
 * a dry run notes something (each would add its map lookup's two ways to
 * the program's states). They take plain values, as global functions
 * must; the inline wrappers below call them for a dry run's packet only.
 */

__noinline int explain_set(__u32 flags, __u32 field, __u32 a, __u32 b, __u32 c)
{
	struct explain_record *r = explain_rec();
	__u8 n;

	if (!r)
		return 0;
	r->flags |= flags;
	switch (field) {
	case 1: /* frontend: a vip, b port | proto << 16, c svc flags */
		r->vip = a;
		r->vport = (__u16)b;
		r->proto = (__u8)(b >> 16);
		r->svc_flags = c;
		break;
	case 2: /* scope: a scope, b count, c rev_nat_id */
		r->scope = (__u8)a;
		r->count = b;
		r->rev_nat_id = c;
		break;
	case 3: /* backend: a id, b slot | port << 16, c addr */
		r->backend_id = a;
		r->slot = (__u16)b;
		r->be_port = (__u16)(b >> 16);
		r->be_addr = c;
		break;
	case 4: /* snat: a addr, b port */
		r->snat_addr = a;
		r->snat_port = (__u16)b;
		break;
	case 5: /* a metric reason counted */
		n = r->n_reasons;
		if (n < EXPLAIN_REASONS)
			r->reasons[n] = (__u8)a;
		if (n < 255)
			r->n_reasons = n + 1;
		break;
	}
	return 0;
}

/*
 * explain_set6 - the IPv6 address @a0..@a3 (network order words) of the
 * record's @field (explain_set's numbers: 1 the frontend, 3 the backend,
 * 4 the source NAT), in sluice_expl6_v1. A global function, as
 * explain_set.
 */
__noinline int explain_set6(__u32 field, __u32 a0, __u32 a1, __u32 a2, __u32 a3)
{
	struct explain6_record *r = explain_rec6();
	union v6addr *a;

	if (!r)
		return 0;
	switch (field) {
	case 1:
		a = &r->vip;
		break;
	case 3:
		a = &r->be_addr;
		break;
	case 4:
		a = &r->snat_addr;
		break;
	default:
		return 0;
	}
	a->p[0] = a0;
	a->p[1] = a1;
	a->p[2] = a2;
	a->p[3] = a3;
	return 0;
}

/*
 * The notes below take a struct pkt4 or pkt6 (@p): they read only its
 * dry bit, and are macros over functions of that bit.
 */

/* explain_flag - note @flags in the record of @p's dry run. */
#define explain_flag(p, flags) explain_flag_if(explain_dry(p), flags)

static __always_inline void explain_flag_if(bool dry, __u32 flags)
{
	if (dry)
		explain_set(flags, 0, 0, 0, 0);
}

/* explain_scope - the scope @svc (its master) serves @p's client. */
#define explain_scope(p, svc) explain_scope_if(explain_dry(p), svc)

static __always_inline void explain_scope_if(bool dry,
					     const struct lb4_service *svc)
{
	if (dry)
		explain_set(EXPLAIN_F_SCOPE, 2, svc->scope, svc->count,
			    svc->rev_nat_id);
}

/*
 * metric_count - count @reason for @p (metric_inc); a dry run records it
 * in its record instead, so that no counter moves.
 */
#define metric_count(p, reason) metric_count_if(explain_dry(p), reason)

static __always_inline void metric_count_if(bool dry, enum metric_reason reason)
{
	if (dry)
		explain_set(0, 5, reason, 0, 0);
	else
		metric_inc(reason);
}

/*
 * svc_count_pkt - svc_count for @p, a packet to service @id; a dry run
 * counts nothing (what it would count is in its reasons).
 */
#define svc_count_pkt(p, id, event, bytes) \
	svc_count_if(explain_dry(p), id, event, bytes)

static __always_inline void svc_count_if(bool dry, __u32 id, __u32 event,
					 __u32 bytes)
{
	if (!dry)
		svc_count(id, event, bytes);
}

/*
 * What differs between the families' notes: an IPv4 address is a word of
 * the record (explain_set's), an IPv6 one goes to sluice_expl6_v1 under
 * the same field, the word left zero.
 */
#define explain_word_4(a)	  (a)
#define explain_word_6(a)	  0
#define explain_addr6_4(field, a) ((void)0)
#define explain_addr6_6(field, a) \
	explain_set6(field, (a).p[0], (a).p[1], (a).p[2], (a).p[3])

#define LB_FAMILY 4
#include "explain_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "explain_fam.h"
#undef LB_FAMILY

#endif /* SLUICE_EXPLAIN_H */
