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
 * The bit. The mark is read once, at the program's entry, into the
 * packet's struct pkt4 (dry), which every function that decides about the
 * packet already takes; explain_dry() is the one check every write site
 * makes. Not a per-CPU flag: BPF_PROG_TEST_RUN runs with migration, not
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
 * and the run repeated. The map is per program (not pinned): it is no
 * state, and a record of one program version is read only through that
 * program (sluicectl finds it among the program's maps by name, whose
 * version says its layout; an agent without it predates dry runs).
 */
#ifndef SLUICE_EXPLAIN_H
#define SLUICE_EXPLAIN_H

#include "consts.h"
#include "structs.h"
#include "metrics.h"
#include "parse.h"

/* cb[0] and cb[1] of a dry run ("slex", "plan"). */
#define EXPLAIN_MAGIC0 0x736c6578
#define EXPLAIN_MAGIC1 0x706c616e

/* The metric reasons an explain_record keeps, in the order counted. */
#define EXPLAIN_REASONS 8

/* What a dry run found (explain_record.flags). */
enum explain_flags {
	/* The program ran in dry-run mode (it knows the mark). */
	EXPLAIN_F_DRY = 1,
	/* The destination is a frontend: vip, port, proto, svc_flags. */
	EXPLAIN_F_FRONTEND = 2,
	/* The client is internal (in the cluster CIDR). */
	EXPLAIN_F_INTERNAL = 4,
	/* The client is external and came in through a node device. */
	EXPLAIN_F_OUTSIDE = 8,
	/* A live conntrack entry of the flow decided the backend. */
	EXPLAIN_F_CT_HIT = 16,
	/* The client's session affinity entry decided the backend. */
	EXPLAIN_F_AFFINITY_HIT = 32,
	/* A backend was selected for a new flow. */
	EXPLAIN_F_NEW_FLOW = 64,
	/* DNAT to be_addr:be_port. */
	EXPLAIN_F_DNAT = 128,
	/* SNAT to snat_addr:snat_port. */
	EXPLAIN_F_SNAT = 256,
	/* A reply of a translated flow: its source becomes vip:port. */
	EXPLAIN_F_REPLY = 512,
	/* A frontend scope served it: scope, count, rev_nat_id. */
	EXPLAIN_F_SCOPE = 1024,
};

/*
 * sluice_expl_v1: __u32 0 -> struct explain_record, per CPU. Addresses
 * and ports in network order, the rest host order.
 */
struct explain_record {
	__u32 nonce[2];	 /* cb[2], cb[3] of the dry run that wrote it */
	__u32 flags;	 /* enum explain_flags */
	__u32 svc_flags; /* the frontend's default scope's (enum svc_flags) */
	__be32 vip; /* the frontend (a reply: the one it is rewritten to) */
	__be16 vport;
	__u8 proto;
	__u8 scope;	  /* the scope that served the client (enum lb_scope) */
	__u32 count;	  /* that scope's backends */
	__u32 rev_nat_id; /* the service id */
	__u32 backend_id;
	__be32 be_addr; /* the backend (DNAT) */
	__be16 be_port;
	__u16 slot;	  /* the slot that named it (0: conntrack decided) */
	__be32 snat_addr; /* source NAT (a reply: its new destination) */
	__be16 snat_port;
	__u8 n_reasons; /* reasons counted, of which the first few kept */
	__u8 pad;
	__u8 reasons[EXPLAIN_REASONS]; /* enum metric_reason */
};

_Static_assert(sizeof(struct explain_record) == 60, "explain_record size");
BTF_EXPORT(enum explain_flags, explain_flags);

/*
 * Not in maps.h: only tc uses it, it is no shared state, and maps.h's
 * maps are pinned. The name fits the kernel's 15 characters whole, so its
 * version shows through the program's map info.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct explain_record);
	__uint(max_entries, 1);
} sluice_expl_v1 SEC(".maps");

/* explain_dry - whether @p is a dry run's packet: change nothing for it. */
static __always_inline bool explain_dry(const struct pkt4 *p)
{
	return p->dry;
}

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

/* explain_begin - reset the record for the dry run of @p from @skb. */
static __always_inline void explain_begin(struct __sk_buff *skb,
					  const struct pkt4 *p)
{
	struct explain_record *r;

	if (!explain_dry(p))
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

/* explain_flag - note @flags in the record of @p's dry run. */
static __always_inline void explain_flag(const struct pkt4 *p, __u32 flags)
{
	if (explain_dry(p))
		explain_set(flags, 0, 0, 0, 0);
}

/* explain_frontend - the frontend @p is for, whose default scope is @svc. */
static __always_inline void explain_frontend(const struct pkt4 *p,
					     const struct lb4_service *svc)
{
	if (explain_dry(p))
		explain_set(EXPLAIN_F_FRONTEND, 1, p->daddr,
			    p->dport | (__u32)p->proto << 16, svc->flags);
}

/* explain_scope - the scope @svc (its master) serves @p's client. */
static __always_inline void explain_scope(const struct pkt4 *p,
					  const struct lb4_service *svc)
{
	if (explain_dry(p))
		explain_set(EXPLAIN_F_SCOPE, 2, svc->scope, svc->count,
			    svc->rev_nat_id);
}

/*
 * explain_backend - @p goes to <@addr, @port>, backend @backend_id, named
 * by @slot (0: its conntrack entry decided).
 */
static __always_inline void explain_backend(const struct pkt4 *p,
					    __u32 backend_id, __u16 slot,
					    __be32 addr, __be16 port)
{
	if (explain_dry(p))
		explain_set(EXPLAIN_F_DNAT, 3, backend_id,
			    slot | (__u32)port << 16, addr);
}

/*
 * explain_snat - @p is source-NATed to <@addr, @port> (a reply: its
 * destination becomes that); @flag says which.
 */
static __always_inline void explain_snat(const struct pkt4 *p, __u32 flag,
					 __be32 addr, __be16 port)
{
	if (explain_dry(p))
		explain_set(flag, 4, addr, port, 0);
}

/*
 * explain_reply - @p, a reply, gets <@addr, @port> (its frontend) as its
 * source.
 */
static __always_inline void explain_reply(const struct pkt4 *p, __be32 addr,
					  __be16 port)
{
	if (explain_dry(p))
		explain_set(EXPLAIN_F_REPLY, 1, addr,
			    port | (__u32)p->proto << 16, 0);
}

/*
 * metric_count - count @reason for @p (metric_inc); a dry run records it
 * in its record instead, so that no counter moves.
 */
static __always_inline void metric_count(const struct pkt4 *p,
					 enum metric_reason reason)
{
	if (explain_dry(p))
		explain_set(0, 5, reason, 0, 0);
	else
		metric_inc(reason);
}

#endif /* SLUICE_EXPLAIN_H */
