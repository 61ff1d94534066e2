// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Per-packet ClusterIP load balancing at tc, for traffic the socket hooks
 * never saw (pods in other network namespaces, other hosts).
 *
 * Ingress: a packet of a flow to a service (CT_FORWARD hit) is DNATed to
 * the flow's backend; else a reply of a translated flow (CT_REVERSE hit)
 * gets its source rewritten back to the VIP (a DNATed flow's that will
 * leave by a device with tc at that device's egress instead, where the
 * node's conntrack has seen it: rev_dnat); else a packet to a service
 * that may open a connection starts a flow to a backend (the order, and
 * why it is sound: tc_ingress), but a TCP packet netfilter opens none for
 * (a RST, a FIN, a SYN-ACK, neither SYN nor ACK: ct_tcp_stray) does not:
 * it is dropped, or, to a node address, passed up untranslated
 * (lb4_select); a new flow to a service without backends is answered
 * with ICMP port unreachable, or dropped when the service has backends
 * elsewhere (SVC_F_DROP_EMPTY; its established flows go on: conntrack
 * comes first). A packet to no frontend is rejected if its destination is
 * a ClusterIP (another port or protocol; a TCP stray is dropped), dropped
 * if it is another address of the service CIDR, and passed otherwise
 * (lb4_no_service), as kube-proxy's nftables mode does; so is a packet of
 * any other protocol that may open a connection (an ICMP echo, GRE, SCTP:
 * parse_ipv4_other).
 * Egress: replies leaving towards the client get their source rewritten
 * back to the VIP. Both: ICMP errors about translated flows are
 * translated back (icmp_xlate.h; a DNAT-only flow's error about its
 * request, as its replies, at the egress of a device with tc that the
 * route to the client leaves by), and later IPv4 fragments get their
 * first fragment's translation (frag.h). Everything else passes untouched,
 * a packet to 127.0.0.0/8 on lo too: the localhost NodePorts are the node's
 * own sockets' (tc_ingress); one to or from 127.0.0.0/8 on another device
 * is dropped (tc_loopback_martian).
 *
 * North-south (NodePort, ExternalIP and LoadBalancer frontends, flagged
 * SVC_F_EXTERNAL): a new flow whose backend is reached through one of the
 * node's devices (another node) is DNATed and SNATed to this node's
 * address on that device, with a source port reserved for the flow (see
 * ct_create_snat), and redirected to the next hop; its replies come back
 * to this node, are rewritten to <frontend -> client> and redirected to
 * the client. A backend on this node gets DNAT only; its replies are
 * rewritten at egress like ClusterIP ones. externalTrafficPolicy Local
 * (SVC_F_LOCAL) keeps the client's address; its internal clients (the
 * cluster CIDR) are served by the frontend's internal scope
 * (SVC_F_TWO_SCOPES: all endpoints, kube-proxy's short-circuit).
 * loadBalancerSourceRanges (SVC_F_SRC_RANGES) drop sources outside them,
 * new or unanswered flows'. Whether a new flow is also source-NATed to this
 * node (masqueraded) follows kube-proxy, with one deliberate deviation:
 * see lb4_masquerade.
 *
 * IPv6 (tc6.h): ClusterIP frontends of the IPv6 maps, by programs of
 * their own that the entries tail-call for an IPv6 packet.
 *
 * Dry runs (explain.h): a packet BPF_PROG_TEST_RUN brings with the
 * dry-run mark is sent to the program's dry twin (an IPv6 one to its
 * IPv6 program's), the same code built to
 * write no map (no conntrack entry, SNAT port, affinity, fragment record
 * or counter), which notes what it decided in sluice_expl_v1 for
 * `sluicectl explain`.
 */
#include "lib/consts.h"
#include "lib/config.h"
#include "lib/maps.h"
#include "lib/metrics.h"
#include "lib/svcstats.h"
#include "lib/parse.h"
#include "lib/frag.h"
#include "lib/csum.h"
#include "lib/lb.h"
#include "lib/affinity.h"
#define CT_SNAT_TRY_GLOBAL /* conntrack_fam.h: ct_snat_try */
#define CT_EST_OVERFLOW	   /* conntrack_fam.h: ct_overflow */
#define CT_SNAT_TAKE	   /* conntrack.h: CT_SNAT_TAKES */
#define CT_ASSURE_GLOBAL   /* conntrack_fam.h: ct_assure */
#define ICMP_RATE_LIMIT	   /* icmp.h: icmp_rl_allow and its maps, icmp_reject_src */
#include "lib/conntrack.h"
#include "lib/icmp.h"
#include "lib/nat.h"
#include "lib/icmp_xlate.h"
#include "lib/explain.h"

/* Whether a node device may be L3 (parse.h); the agent writes it. */
volatile __u8 dev_l3_maybe = 1;

/*
 * Whether new flows skip the half-open share (conntrack.h); the agent sets
 * it while it migrates sluice_conntrack. In .data with dev_l3_maybe (0
 * would put it in a .bss map of its own).
 */
volatile __u8 ct_admit_paused SEC(".data") = 0;

/* What the parse step found. */
enum pkt_kind {
	PKT_PASS,     /* nothing to translate */
	PKT_L4,	      /* a TCP/UDP packet (or a later fragment, given ports) */
	PKT_ICMP_ERR, /* an ICMP error, perhaps about a translated flow */
	PKT_OTHER,    /* another protocol's: refused if to a ClusterIP */
};

/*
 * parse_ipv4_tc - parse_ipv4 into @q, a global function, which the
 * verifier checks once, on its own. parse_ipv4 reads the common packet in
 * place (parse_ipv4_linear) and copies any other's headers: inlined, the
 * two ways' results (constants the one, ranges the other) are two sets of
 * states for the rest of the program, and sluice_ingress verified 422,319
 * instructions instead of 250,665. From here the rest sees one.
 */
__noinline int parse_ipv4_tc(struct __sk_buff *skb, struct pkt4 *q)
{
	if (!skb || !q)
		return PARSE_PASS;
	return parse_ipv4(skb, q);
}

/*
 * parse_tc - parse @skb, counting the reason when it is not translatable.
 * A first fragment's ports are recorded for the later ones, which take
 * them from there (frag.h). @p's dry stays the constant its program set
 * (parse_ipv4_tc fills a copy).
 */
static __always_inline enum pkt_kind parse_tc(struct __sk_buff *skb,
					      struct pkt4 *p)
{
	struct pkt4 q = {};
	int ret = parse_ipv4_tc(skb, &q);

	p->l3_off = q.l3_off;
	p->l3_len = q.l3_len;
	p->l4_off = q.l4_off;
	p->csum_off = q.csum_off;
	p->saddr = q.saddr;
	p->daddr = q.daddr;
	p->sport = q.sport;
	p->dport = q.dport;
	p->ip_id = q.ip_id;
	p->proto = q.proto;
	p->ihl_len = q.ihl_len;
	p->tcp_flags = q.tcp_flags;
	p->tcp_bare = q.tcp_bare;
	p->ttl = q.ttl;
	p->df = q.df;
	p->frag_first = q.frag_first;
	p->frag_later = q.frag_later;
	switch (ret) {
	case PARSE_OK:
		if (p->frag_first)
			frag_record(p);
		return PKT_L4;
	case PARSE_MALFORMED:
		metric_count(p, METRIC_TC_MALFORMED);
		return PKT_PASS;
	case PARSE_FRAGMENT:
		if (frag_follow(p)) {
			metric_count(p, METRIC_TC_FRAG_LATER);
			return PKT_L4;
		}
		metric_count(p, METRIC_TC_FRAGMENT);
		return PKT_PASS;
	case PARSE_ICMP_ERR:
		return PKT_ICMP_ERR;
	case PARSE_OTHER:
		return PKT_OTHER;
	default:
		return PKT_PASS;
	}
}

/* Where lb4_select sends a packet to a service. */
struct lb4_xlate {
	__be32 nat_addr;  /* the backend */
	__be32 snat_addr; /* snat: this node's address */
	__be16 nat_port;
	__be16 snat_port; /* snat: the flow's port on this node */
	bool snat;	  /* source-NATed to this node */
	/* snat to the client's own address, another port (lb4_remap): sent
	 * on as a DNATed flow's packet is
	 */
	bool remap;
	bool have_fib; /* fib is the route to the backend */
	/* in: the client is internal (the cluster CIDR) */
	bool internal;
	/* in: the client is external and came in through a node device
	 * with an address (not a pod of this node)
	 */
	bool outside;
	/* in: no conntrack entry at all under the flow's forward key
	 * (lb4_fwd_find; ct_create_snat's @fresh)
	 */
	bool fresh;
	struct fib4 fib;
};

/* The steps both families take alike (tc_fam.h): lb4_check_source, ... */
#define lb_xlate_t_4	       struct lb4_xlate
#define tc_have_cluster_cidr_4 have_cluster_cidr
#define tc_node_dev_of_4       node_dev_of
#define tc_port_unreachable_4  reply_port_unreachable
#define LB_FAMILY	       4
#include "lib/tc_fam.h"
#undef LB_FAMILY

/*
 * rev_dport4 - rewrite the destination port of @p, a reply, to @port. A
 * global function, which the verifier checks once, on its own, rather
 * than on every path of rev_dnat's (as ct_new4, below).
 */
__noinline int rev_dport4(struct __sk_buff *skb, const struct pkt4 *p,
			  __be16 port)
{
	if (!skb || !p)
		return -1;
	return rewrite_l4addr(skb, p, true, p->daddr, port);
}

/*
 * rev_at_egress4 - whether @p, the reply of a flow that was DNATed only
 * or an ICMP error about its request (icmp_xlate.h), at the ingress of a
 * device, will pass a Sluice egress program on its way to the client: the
 * route the stack takes for it as it came (from its own source, in at this
 * device) leaves by a device the agent attached tc to (dev_has_tc). Never at
 * a port of a bridge or bond (dev_is_port): the route names the master, but a
 * reply to a client on the same bridge is bridged at layer 2 to the client's
 * port, and passes no egress of the master's. A global function, which the
 * verifier checks once, on its own.
 */
__noinline int rev_at_egress4(struct __sk_buff *skb, const struct pkt4 *p)
{
	struct fib4 f = {};

	if (!skb || !p || dev_is_port(skb->ifindex))
		return 0;
	return !fib4_lookup(skb, skb->ifindex, p->saddr, p->daddr, &f) &&
	       dev_has_tc(f.ifindex);
}

/*
 * rev_dnat - the reply @p of a flow that was DNATed only gets the frontend
 * <@fe_addr, @fe_port> back as its source, and @cport as its destination
 * port (the client's, which a clash remap changed: lb4_remap; else @p's
 * own). Returns a TC verdict.
 *
 * At @ingress of a device (the pod's device, when --devices lists it),
 * a reply that will leave by a device running tc is passed up as it came
 * (rev_at_egress4), to be translated at that device's egress. Not while
 * a start migrates sluice_conntrack (ct_admit_paused): that egress may
 * still run the previous agent's program, which looks in the old table
 * only (mig_copy_back copies back source-NATed flows alone), and the
 * reply would leave untranslated; translated here, as before. The node's
 * netfilter conntrack, which saw the flow's packets DNATed <C -> B> (tc
 * ingress comes first), then sees its replies as <B -> C>, the reply
 * tuple it expects; rewritten here they would be <F -> C>, a tuple it
 * never saw, and it would mark them, and the client's packets after
 * them, INVALID, which many firewalls drop in FORWARD (Calico's workload
 * chains, kube-proxy's KUBE-FORWARD).
 *
 * Otherwise, a reply to an external frontend would carry the node's own
 * address as its source, and the stack drops such a packet as a martian:
 *
 *   C -> N:30080 (eth0)  DNAT  C -> P:8080 (stack, pod0)
 *   P:8080 -> C (pod0)   reverse NAT  N:30080 -> C, "from" N: martian
 *
 * So it is sent to the client directly (FIB lookup and redirect), unless
 * it does not fit or its TTL would expire: then it goes to the stack as it
 * came, to be forwarded or refused like any routed packet. Where no route
 * is found (a client on the node, which no egress program sees), it is
 * rewritten and passed up as before.
 */
static __always_inline int rev_dnat(struct __sk_buff *skb, const struct pkt4 *p,
				    __be32 fe_addr, __be16 fe_port,
				    __be16 cport, bool ingress)
{
	struct fib4 f = {};
	bool redirect;
	int ret;

	if (ingress && !ct_admit_paused && rev_at_egress4(skb, p)) {
		metric_count(p, METRIC_TC_REV_AT_EGRESS);
		return TC_ACT_OK;
	}
	redirect = ingress && fe_external(fe_addr, fe_port, p->proto) &&
		   !fib4_lookup(skb, skb->ifindex, fe_addr, p->daddr, &f);
	if (redirect) {
		ret = fwd_check(skb, p, &f, true);
		if (ret >= 0)
			return ret;
	}
	if (rewrite_l4addr(skb, p, false, fe_addr, fe_port) < 0 ||
	    (cport != p->dport && rev_dport4(skb, p, cport) < 0)) {
		metric_count(p, METRIC_TC_REWRITE_ERR);
		return TC_ACT_SHOT;
	}
	metric_count(p, METRIC_TC_REV_NAT);
	if (!redirect)
		return TC_ACT_OK;
	metric_count(p, METRIC_TC_REV_REDIRECT);
	return redirect_fib(skb, p, &f);
}

/*
 * rev_nat - if @p is a reply of a translated flow, rewrite its source back
 * to the frontend (and, for a source-NATed flow, its destination back to
 * the client, then send it to the client). @ingress: @p is at a device's
 * ingress. Returns a TC verdict, or -1 if @p is not such a reply.
 *
 * A flow remapped on a clash (lb4_remap) is source-NATed to the client's
 * own address: its reply <B:q -> C:p'> is already addressed to the client
 * and passes where a DNATed flow's does, so it is translated as one
 * (rev_dnat), its destination port back to the client's.
 */
static __always_inline int rev_nat(struct __sk_buff *skb, const struct pkt4 *p,
				   __u64 now, bool ingress)
{
	struct ct4_key key = {};
	struct ct4_entry *e;
	__be32 fe_addr, client;
	__be16 fe_port, cport;
	struct fib4 f = {};
	int ret;

	e = lb4_reply_ct(p, &key, now, &ret);
	if (!e)
		return ret;
	fe_addr = e->nat_addr;
	fe_port = e->nat_port;
	explain_reply(p, fe_addr, fe_port);
	client = p->daddr;
	cport = p->dport;
	if (e->flags & CT_F_SNAT) {
		client = e->snat_addr;
		cport = e->snat_port;
		explain_snat(p, EXPLAIN_F_SNAT, client, cport);
	}
	if (client == p->daddr)
		return rev_dnat(skb, p, fe_addr, fe_port, cport, ingress);

	/* <B -> N:sp> becomes <F -> C>. */
	if (fib4_lookup(skb, skb->ifindex, fe_addr, client, &f) < 0) {
		metric_count(p, METRIC_TC_FIB_ERR);
		return TC_ACT_SHOT;
	}
	ret = fwd_check(skb, p, &f, false);
	if (ret >= 0)
		return ret;
	if (rewrite_l4addr(skb, p, false, fe_addr, fe_port) < 0 ||
	    rewrite_l4addr(skb, p, true, client, cport) < 0) {
		metric_count(p, METRIC_TC_REWRITE_ERR);
		return TC_ACT_SHOT;
	}
	metric_count(p, METRIC_TC_REV_NAT);
	return redirect_fib(skb, p, &f);
}

/*
 * lb4_masquerade - whether a new flow of @p to backend @be of frontend
 * @svc is source-NATed to this node, when the backend is on this node
 * (@remote false) or on another (@remote true). kube-proxy's rules:
 *
 *   - a hairpin (the client is the backend) always is;
 *   - to a ClusterIP: with --masquerade-all, or from outside the cluster
 *     CIDR (when one is set), so that a router sending the service range
 *     here gets the replies back;
 *   - to an external frontend with externalTrafficPolicy Local (either
 *     scope): never, keeping the client's address is its point;
 *   - to one with Cluster: always. Except, Sluice's deliberate deviation
 *     (README, as Cilium does): an external client sent to a backend on
 *     this node keeps its address (the reply passes this node anyway),
 *     unless --masquerade-all.
 */
static __always_inline bool lb4_masquerade(const struct pkt4 *p,
					   const struct lb4_service *svc,
					   const struct lb4_backend *be,
					   bool remote,
					   const struct lb4_xlate *x)
{
	if (p->saddr == be->addr)
		return true;
	if (!(svc->flags & SVC_F_EXTERNAL))
		return masquerade_all || (have_cluster_cidr && !x->internal);
	if (svc->flags & SVC_F_LOCAL)
		return false;
	return masquerade_all || remote || !x->outside;
}

/*
 * ct_new4 and ct_snat4 - ct_create and ct_create_snat as global functions:
 * the verifier checks each once, on its own, instead of again for every
 * path of the program that reaches it (the port search's SNAT_TRIES
 * iterations; a masquerade and a clash remap both search). Their pointers
 * may be NULL as far as it knows. @ids carries the backend id (low 32
 * bits) and the rev NAT id (high), ct_new4's @fresh ct_create's, and
 * ct_snat4's @x the node address and the port it reserves: five arguments
 * at most. sluice_ingress verified
 * 424,897 instructions with both inlined, 127,963 then (with
 * conntrack_fam.h's ct_snat_try a global function too), 128,088 now
 * (lb4_remap and rev_dport4 global as well); the agent's start spends half
 * the CPU it did loading the programs (BenchmarkOpen).
 */
__noinline int ct_new4(const struct pkt4 *p, const struct lb4_backend *be,
		       __u64 ids, __u64 now, bool fresh)
{
	if (!p || !be)
		return -1;
	return ct_create(p, be, (__u32)ids, (__u32)(ids >> 32), now, fresh);
}

__noinline int ct_snat4(const struct pkt4 *p, const struct lb4_backend *be,
			__u64 ids, __u64 now, struct lb4_xlate *x)
{
	if (!p || !be || !x)
		return -1;
	return ct_create_snat(p, be, (__u32)ids, (__u32)(ids >> 32),
			      x->snat_addr, now, &x->snat_port, x->fresh);
}

/*
 * snat_refused - count why ct_snat4 refused a flow of @p with @err:
 * @exhausted if every port tried was taken, else the table that is full.
 */
static __always_inline void snat_refused(const struct pkt4 *p, int err,
					 enum metric_reason exhausted)
{
	if (err > 0)
		metric_count(p, exhausted);
	else if (err == -EEXIST) /* a claimed forward key (ct_create_snat) */
		metric_count(p, METRIC_TC_CT_CLASH);
	else if (err == -E2BIG)
		metric_count(p, METRIC_TC_CT_EST_FULL);
	else if (err == -ENOSPC) /* the half-open share full */
		metric_count(p, METRIC_TC_SNAT_HALF_OPEN_FULL);
	else
		metric_count(p, METRIC_TC_CT_FULL);
}

/*
 * nat_remote - source-NAT a new flow of @p to backend @be (@backend_id) if
 * lb4_masquerade says so: to the address of the node device its route
 * leaves through (a backend on another node), or to node_ip4 (one on this
 * node). A backend on this node is source-NATed only behind a device that
 * runs tc (dev_has_tc), where its reply comes back to be translated;
 * behind another its flow keeps the client's address. A source port on
 * that address is reserved for the flow (ct_create_snat), which also
 * records the flow.
 *
 * Returns 1 with @x's snat fields and route filled in; 0 if the flow is
 * not source-NATed (nothing recorded yet); or -1 if it must be dropped
 * (counted).
 */
static __always_inline int
nat_remote(struct __sk_buff *skb, const struct pkt4 *p,
	   const struct lb4_service *svc, const struct lb4_backend *be,
	   __u32 backend_id, __u64 now, struct lb4_xlate *x)
{
	enum svc_flags flags = svc->flags;
	bool masq = lb4_masquerade(p, svc, be, false, x);
	struct node_dev *dev;
	int err;

	/* Only an externalTrafficPolicy Cluster frontend needs the route
	 * to decide.
	 */
	if (!masq && (!(flags & SVC_F_EXTERNAL) || (flags & SVC_F_LOCAL)))
		return 0;
	if (fib4_lookup(skb, skb->ifindex, p->saddr, be->addr, &x->fib))
		return 0;
	dev = node_dev_of(x->fib.ifindex);
	if (dev) {
		x->snat_addr = dev->addr;
	} else {
		if (!masq || !node_ip4 || !dev_has_tc(x->fib.ifindex))
			return 0;
		x->snat_addr = node_ip4;
	}
	x->snat = true;
	x->have_fib = true;
	err = ct_snat4(p, be, (__u64)svc->rev_nat_id << 32 | backend_id, now,
		       x);
	if (err) {
		/* Without its reply entry the flow cannot work: refuse it
		 * rather than half-NAT it.
		 */
		snat_refused(p, err, METRIC_TC_SNAT_EXHAUSTED);
		return -1;
	}
	metric_count(p, dev ? METRIC_TC_SNAT_NEW : METRIC_TC_MASQ_LOCAL);
	return 1;
}

/*
 * lb4_ct_follow - send @p, a packet of the flow of the usable forward
 * entry @fwd (under @key), where the flow goes. Returns 0 with @x filled
 * in, or -1 if it must be dropped (counted).
 */
static __always_inline int lb4_ct_follow(const struct pkt4 *p,
					 const struct ct4_key *key,
					 struct ct4_entry *fwd, __u64 now,
					 struct lb4_xlate *x)
{
	bool refreshed = false;
	int err;

	x->nat_addr = fwd->nat_addr;
	x->nat_port = fwd->nat_port;
	if (fwd->flags & CT_F_SNAT) {
		x->snat = true;
		x->snat_addr = fwd->snat_addr;
		x->snat_port = fwd->snat_port;
		x->remap = fwd->snat_addr == p->saddr;
	}
	explain_flag(p, EXPLAIN_F_CT_HIT);
	explain_backend(p, fwd->backend_id, 0, x->nat_addr, x->nat_port);
	if (!explain_dry(p))
		refreshed = ct_refresh(fwd, p->proto, now);
	ct_track_tcp(p, key, fwd, now);
	err = ct_check_reverse_due(p, key, fwd, now, refreshed);
	if (err == -EEXIST) {
		/* Another flow holds the reply tuple (the SNAT port): its
		 * replies would go there. Never send from a tuple the flow
		 * does not own.
		 */
		metric_count(p, x->snat ? METRIC_TC_SNAT_LOST :
					  METRIC_TC_CT_CLASH);
		return -1;
	}
	if (err < 0) {
		if (x->snat) {
			/* The port is not reserved: the same. */
			metric_count(p, METRIC_TC_SNAT_LOST);
			return -1;
		}
		metric_count(p, METRIC_TC_CT_FULL);
	}
	metric_count(p, METRIC_TC_DNAT_CT);
	/* The client's ACK after the answer: assured (conntrack.h). Last,
	 * with nothing live across the call (the dry run's stack is at
	 * its limit).
	 */
	if (ct_assure_due(p, fwd))
		ct_assure(key, fwd, now);
	return 0;
}

/*
 * Session affinity for a new flow of @p (affinity.h), whose client is its
 * source as it arrived. BPF functions of their own rather than inlined:
 * the key and the entry then live in their frames, which the program's
 * stack, with icmp_build's frame on top, has no room for; and the
 * verifier's paths meet again after each call, whatever it found.
 */

/* lb4_aff_select - aff_select for the client of @p, a new flow to @svc. */
static __noinline struct lb4_backend *
lb4_aff_select(const struct pkt4 *p, const struct lb4_service *svc, __u64 now,
	       __u32 *backend_id, __u16 *slot)
{
	struct lb4_affinity_key key = {};
	struct lb4_backend *be;
	__u32 id;
	__u16 sl;

	aff_key(&key, p->saddr, AFFINITY_CLIENT_ADDR, p->daddr, p->dport,
		p->proto, svc->scope);
	be = aff_select(&key, svc, now, backend_id, slot);
	/* A dry run asks again whether the client's entry decided. */
	if (be && explain_dry(p) && (svc->flags & SVC_F_AFFINITY) &&
	    aff_lookup(&key, svc, now, &id, &sl) == be)
		explain_flag(p, EXPLAIN_F_AFFINITY_HIT);
	return be;
}

/*
 * lb4_aff_remember - aff_remember for the client of @p, as of @now (the
 * run's clock reading, not a second one). @ids: the backend id (low 32
 * bits) and its slot (the 16 above): five arguments at most. Its caller
 * asks only for a frontend with affinity: a call less on every other new
 * flow (as lb6_aff_remember).
 */
static __noinline int lb4_aff_remember(const struct pkt4 *p,
				       const struct lb4_service *svc,
				       const struct lb4_backend *be, __u64 ids,
				       __u64 now)
{
	struct lb4_affinity_key key = {};

	if (explain_dry(p))
		return 0;
	aff_key(&key, p->saddr, AFFINITY_CLIENT_ADDR, p->daddr, p->dport,
		p->proto, svc->scope);
	aff_remember(&key, svc, be, (__u32)ids, (__u16)(ids >> 32), now);
	return 0;
}

/*
 * lb4_remap - a new flow of @p to backend @be (@ids as ct_new4's) whose
 * reply tuple <B:q -> C:p> is a live flow's of another frontend (a client
 * port talking to two Services that share an endpoint: ct_create's
 * clash) is source-NATed to the client's own address C with another port
 * p', reserved as a masqueraded flow's is (ct_create_snat, whose search
 * also passes over the half-open flows' tuples, ct_snat_try): the endpoint
 * sees C:p', and rev_nat turns its replies back into <F -> C:p>.
 *
 * This is netfilter's answer, which kube-proxy gets: its DNAT rule picks
 * the endpoint, and the implicit source NAT of nf_nat (get_unique_tuple)
 * then finds the reply tuple taken and moves the source port, keeping the
 * endpoint. Only a packet that may open a connection (a pure TCP SYN, or
 * UDP) is remapped; any other clashes as before (a straggler of a flow
 * Sluice does not know would otherwise open one).
 *
 * Returns 0 with @x's snat fields set, or -1 if the flow must be dropped
 * (counted tc_ct_clash: no port left, or not an opening packet). A global
 * function, as ct_snat4.
 */
__noinline int lb4_remap(const struct pkt4 *p, const struct lb4_backend *be,
			 __u64 ids, __u64 now, struct lb4_xlate *x)
{
	int err;

	if (!p || !be || !x)
		return -1;
	if (!ct_opens(p)) {
		metric_count(p, METRIC_TC_CT_CLASH);
		return -1;
	}
	x->snat_addr = p->saddr;
	err = ct_snat4(p, be, ids, now, x);
	if (err) {
		snat_refused(p, err, METRIC_TC_CT_CLASH);
		return -1;
	}
	x->snat = true;
	x->remap = true;
	metric_count(p, METRIC_TC_CT_CLASH_REMAP);
	return 0;
}

/*
 * lb4_new_flow - select a backend for a new flow of @p to frontend @svc
 * and record the flow in conntrack (source-NATed when the backend is
 * remote, see nat_remote; or to another client port when its reply tuple
 * is another flow's, see lb4_remap).
 *
 * With session affinity (affinity.h), the client is the packet's source
 * as it arrived: the backend it is stuck to comes first, and the backend
 * the flow goes to is remembered for its next one.
 *
 * @fresh: lb4_fwd_find found no entry at all under the flow's forward
 * key (ct_create).
 *
 * Returns 0 with @x filled in, or -1 if the packet must be dropped
 * (counted).
 */
static __always_inline int lb4_new_flow(struct __sk_buff *skb,
					const struct pkt4 *p,
					const struct lb4_service *svc,
					__u64 now, bool fresh,
					struct lb4_xlate *x)
{
	__u64 ids = (__u64)svc->rev_nat_id << 32;
	__u32 backend_id = 0;
	struct lb4_backend *be;
	__u16 slot = 0;
	int ret;

	be = lb4_aff_select(p, svc, now, &backend_id, &slot);
	if (!be) {
		metric_count(p, METRIC_TC_BACKEND_MISSING);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_ERROR, 0);
		return -1;
	}
	ids |= backend_id;
	x->nat_addr = be->addr;
	x->nat_port = be->port;
	x->fresh = fresh;
	ret = nat_remote(skb, p, svc, be, backend_id, now, x);
	if (ret == 0) {
		ret = ct_new4(p, be, ids, now, fresh);
		if (ret == CT_CLASH) {
			ret = lb4_remap(p, be, ids, now, x);
		} else if (ret == -EEXIST) {
			/* A key of the flow is claimed by another deleter
			 * (ct_create): not recorded, so not sent.
			 */
			metric_count(p, METRIC_TC_CT_CLASH);
		} else {
			if (ret < 0)
				metric_count(p, METRIC_TC_CT_FULL);
			metric_count(p, METRIC_TC_DNAT_NEW);
			ret = 0;
		}
	}
	if (ret < 0) {
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_CONNTRACK, 0);
		return -1;
	}
	explain_flag(p, EXPLAIN_F_NEW_FLOW);
	explain_backend(p, backend_id, slot, be->addr, be->port);
	if (svc->flags & SVC_F_AFFINITY)
		lb4_aff_remember(p, svc, be, (__u64)slot << 32 | backend_id,
				 now);
	svc_count_pkt(p, svc->rev_nat_id, SVC_EV_FLOW, 0);
	return 0;
}

/*
 * lb4_fwd_find - the usable forward entry (ct_fwd_usable) of @p's flow,
 * @p being a packet to a frontend, its key in @key; NULL if there is none
 * (@p starts a flow, or is a reply whose destination is a frontend's:
 * tc_ingress). @gone: ct_fwd_usable's, the entry's backend has left.
 * @fresh: ct_find_any's @none, no entry at all under @key.
 */
static __always_inline struct ct4_entry *lb4_fwd_find(const struct pkt4 *p,
						      struct ct4_key *key,
						      __u64 now, bool *gone,
						      bool *fresh)
{
	struct ct4_entry *fwd;
	bool half_open;

	ct_key_of(key, p, CT_FORWARD);
	fwd = ct_find_any(key, now, &half_open, fresh);
	if (fwd && ct_fwd_usable(fwd, p, gone))
		return fwd;
	return NULL;
}

/*
 * tcp_stray_local - whether a TCP stray (ct_tcp_stray) from @saddr to
 * @daddr, an external frontend's address, that came in on @skb's device
 * goes up to the node's stack: whether the stack would not forward it.
 * kube-proxy leaves netfilter's INVALID untranslated: to a node address
 * it goes up to the node's stack, which answers a FIN or an ACK with a
 * RST (no socket), so the client stops retransmitting; to any other
 * address it is routed on, and iptables mode's KUBE-FORWARD drops it
 * (ctstate INVALID). bpf_fib_lookup (net/core/filter.c) tells which:
 * BPF_FIB_LKUP_RET_NOT_FWDED, a route not RTN_UNICAST (RTN_LOCAL: a node
 * address; also a broadcast or multicast one), or no route at all (a FIB
 * error other than blackhole, unreachable, prohibit), which the lookup
 * cannot tell apart from a local one: up, where the stack drops an
 * unroutable packet as it would kube-proxy's untranslated one; and
 * BPF_FIB_LKUP_RET_FWD_DISABLED, forwarding off on the device (IPv6: off
 * for all), returned before any route lookup: up too, the stack delivers
 * it if the address is local and otherwise, forwarding nothing, drops it
 * (ip_error, no ICMP), as it would kube-proxy's. Routed on (SUCCESS,
 * NO_NEIGH), a blackhole, unreachable or prohibit route, or a failed
 * lookup: dropped. Flags 0, not BPF_FIB_LOOKUP_SKIP_NEIGH (Linux 6.3,
 * -EINVAL before): a route not forwarded returns before any neighbour
 * step. On the stray's path only; a global function, verified once, its
 * lookup's frame beside the caller's (as icmp_reject_src).
 */
__noinline int tcp_stray_local(struct __sk_buff *skb, __be32 saddr,
			       __be32 daddr)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET,
		.tot_len = sizeof(struct iphdr),
		.ipv4_src = saddr,
		.ipv4_dst = daddr,
	};
	int ret;

	if (!skb)
		return 0;
	fib.ifindex = skb->ifindex;
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	return ret == BPF_FIB_LKUP_RET_NOT_FWDED ||
	       ret == BPF_FIB_LKUP_RET_FWD_DISABLED;
}

/*
 * lb4_select - where a packet to frontend @svc goes: the backend of its
 * flow's usable conntrack entry @fwd (under @key; lb4_fwd_find, which
 * set @gone and @fresh), else, when @fwd is NULL, a backend selected now
 * (lb4_new_flow). Conntrack comes first, so a Service that has dropped to
 * zero endpoints keeps its established flows, as kube-proxy does; only a
 * new flow is refused.
 *
 * Returns 0 with @x filled in, 1 if @p starts a flow to a frontend without
 * backends (to refuse), 2 if it goes up untranslated (a TCP stray to an
 * external frontend on a node address: tcp_stray_local; counted), or -1
 * if it must be dropped (counted).
 */
static __always_inline int
lb4_select(struct __sk_buff *skb, const struct pkt4 *p,
	   const struct lb4_service *svc, const struct ct4_key *key,
	   struct ct4_entry *fwd, bool gone, bool fresh, __u64 now,
	   struct lb4_xlate *x)
{
	if (fwd) {
		if (gone)
			metric_count(p, METRIC_TC_CT_BACKEND_GONE);
		if (lb4_ct_follow(p, key, fwd, now, x) < 0) {
			svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_CONNTRACK,
				      0);
			return -1;
		}
		return 0;
	}
	if (p->frag_later) {
		/* A later fragment follows its first fragment's flow, and
		 * never starts one: its datagram would be split between two
		 * backends (or, to a service without backends, it would be
		 * refused with an ICMP error about a packet that has no L4
		 * header to quote: RFC 1122 3.2.2).
		 */
		metric_count(p, METRIC_TC_FRAG_DROP);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_ERROR, 0);
		return -1;
	}
	if (p->proto == IPPROTO_TCP && ct_tcp_stray(p->tcp_flags)) {
		/* No flow, and this packet cannot open one (a RST, a FIN,
		 * ...): netfilter's INVALID, neither translated nor
		 * refused. To a backend chosen now it would be a stray.
		 * Up to the node's stack if for a node address (NodePort).
		 */
		if ((svc->flags & SVC_F_EXTERNAL) &&
		    tcp_stray_local(skb, p->saddr, p->daddr)) {
			metric_count(p, METRIC_TC_TCP_STRAY_UP);
			return 2;
		}
		metric_count(p, METRIC_TC_TCP_STRAY);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_CONNTRACK, 0);
		return -1;
	}
	if (svc->count == 0)
		return 1;
	return lb4_new_flow(skb, p, svc, now, fresh, x);
}

/*
 * lb4_dnat - translate @p, a packet to frontend @svc (of the flow of
 * @fwd, under @key, with @gone, as lb4_fwd_find found; or NULL: a new
 * one, with @fresh), to one of its backends (and, for a flow
 * lb4_masquerade source-NATs, source-NAT it and send it to the backend).
 * Returns a TC verdict.
 */
static __always_inline int lb4_dnat(struct __sk_buff *skb, const struct pkt4 *p,
				    struct lb4_service *svc,
				    const struct ct4_key *key,
				    struct ct4_entry *fwd, bool gone,
				    bool fresh, __u64 now)
{
	struct lb4_xlate x = {};
	int ret;

	svc = lb4_frontend(skb, p, svc, &x, fwd, &ret);
	if (!svc)
		return ret;
	ret = lb4_select(skb, p, svc, key, fwd, gone, fresh, now, &x);
	if (ret < 0)
		return TC_ACT_SHOT;
	if (ret == 2)
		return TC_ACT_OK;
	if (ret > 0)
		return lb4_refuse(skb, p, svc);

	if (x.snat)
		explain_snat(p, EXPLAIN_F_SNAT, x.snat_addr, x.snat_port);
	if (x.snat && !x.remap) {
		if (!x.have_fib && fib4_lookup(skb, skb->ifindex, x.snat_addr,
					       x.nat_addr, &x.fib) < 0) {
			metric_count(p, METRIC_TC_FIB_ERR);
			svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_ERROR, 0);
			return TC_ACT_SHOT;
		}
		ret = fwd_check(skb, p, &x.fib, false);
		if (ret >= 0)
			return ret;
	}
	if (rewrite_l4addr(skb, p, true, x.nat_addr, x.nat_port) < 0 ||
	    (x.snat &&
	     rewrite_l4addr(skb, p, false, x.snat_addr, x.snat_port) < 0)) {
		metric_count(p, METRIC_TC_REWRITE_ERR);
		svc_count_pkt(p, svc->rev_nat_id, SVC_DROP_ERROR, 0);
		return TC_ACT_SHOT;
	}
	/* Its first packet is also counted as a new flow (lb4_new_flow). */
	svc_count_pkt(p, svc->rev_nat_id, SVC_EV_PACKET, p->l3_len);
	if (!x.snat || x.remap)
		return TC_ACT_OK;
	return redirect_fib(skb, p, &x.fib);
}

/*
 * tc_ingress - @p at a device's ingress: a packet of a flow to a
 * frontend, a reply of a translated flow, or neither. Returns a TC
 * verdict.
 *
 * The order saves a client packet of an established flow the reply
 * lookup (its tuple as a CT_REVERSE key, in both conntrack maps: two
 * misses): the frontend first, then the flow's forward entry; only a
 * packet with no usable forward entry is looked up as a reply, and only
 * if it is not one is it taken for a new flow to the frontend (or for no
 * service's). A reply costs one frontend lookup (a miss) more.
 *
 * A packet can be a reply and addressed to a frontend: its destination,
 * the flow's client <C:p> or the node address and port the flow was
 * source-NATed to <N:sp>, may be a frontend's. An ExternalIP or
 * LoadBalancer IP that is a node address may have a port of the SNAT
 * range (snat_port_min-max, 61000-65535 by default; a NodePort, in
 * 30000-32767 by default, has not), and a client's address and port may
 * be any frontend's. Unless its tuple is also another flow's forward key
 * (below), such a reply has no forward entry, so it is still found as a
 * reply before anything takes it for a new flow: a packet conntrack knows
 * as a reply is never translated as a request, in this order as in the
 * one before.
 *
 * What the order changes is which of two live flows gets a packet whose
 * tuple is one flow's forward key <S:s -> F> and the other's reply key
 * (the other's backend is S:s, and its client, or its SNAT address and
 * port, F). The forward entry is the older: when it was made, its first
 * packet was looked up as a reply and found none; ct_create and
 * ct_create_snat check a new reply key against other reply keys only.
 * netfilter keeps a tuple to one connection in both directions
 * (nf_nat_used_tuple; the clash check at confirm): the newcomer gets
 * another source port or is refused, and the older flow keeps its
 * packets. Here the older flow now keeps them too (the reply lookup first
 * gave them to the newcomer); the newcomer's replies go to it, as before
 * the older flow's packets went astray. (XDP, which looks a packet up as
 * a reply only at a port of the SNAT range, let the forward entry decide
 * already.) TestTCReplyToFrontend checks both cases.
 *
 * A pure TCP SYN to a frontend is not looked up as a reply at all
 * (ct_syn_only): it starts a flow, or follows the one it retransmits.
 * That saves the first packet of every TCP connection the reply lookup's
 * two misses. A backend does not send a pure SYN to its client's
 * address and port: its answer to the client's SYN is a SYN-ACK, which
 * is still looked up as a reply first. TestTCSynToFrontendIsNotAReply
 * checks that such a SYN starts a flow.
 *
 * A retired frontend (SVC_F_RETIRED: removed, see structs.h) is followed
 * only by a packet with a usable forward entry; any other is taken as to
 * no frontend at all (a reply, lb4_no_service or routed on untranslated),
 * as kube-proxy's conntrack translates an established flow whose Service
 * port went, and only that.
 *
 * A loopback destination (127.0.0.0/8) is no frontend here, though the
 * localhost NodePorts (--localhost-nodeports) are in the services map:
 * they serve the node's own sockets, at connect (lib/socklb.h). A packet
 * from a device to 127.0.0.1:<nodePort> is a martian: tc_body drops it
 * before this (tc_loopback_martian, counted), as kube-proxy's
 * KUBE-FIREWALL does (CVE-2020-8558), whatever route_localnet says.
 * Translated, it would let any L2 neighbour reach the backends, even with
 * NodePorts kept to localhost (--nodeport-addresses localhost). What
 * reaches here is on lo (tc on lo, --devices lo: the node's own traffic):
 * it passes untouched and uncounted, before any lookup: neither
 * translated nor rejected nor dropped as a ClusterIP's or the service
 * CIDR's (lb4_no_service), nor a reply (no flow's client or SNAT address
 * is a loopback one); nor is another protocol's packet there (PKT_OTHER,
 * tc_body). The agent writes no ClusterIP or service CIDR there either:
 * this holds whatever the maps say. TestTCLoopbackFrontendFromWire checks
 * both, and XDP's (xdp_fwd).
 */
static __always_inline int tc_ingress(struct __sk_buff *skb,
				      const struct pkt4 *p, __u64 now)
{
	struct ct4_key key = {};
	struct ct4_entry *fwd = NULL;
	struct lb4_service *svc;
	bool gone = false, fresh = false;
	int ret;

	if (addr_loopback_4(p->daddr))
		return TC_ACT_OK;
	svc = lookup_service(p->daddr, p->dport, p->proto);
	if (svc)
		fwd = lb4_fwd_find(p, &key, now, &gone, &fresh);
	if (!fwd && svc && (svc->flags & SVC_F_RETIRED))
		svc = NULL;
	if (!fwd && !(svc && ct_syn_only(p))) {
		ret = rev_nat(skb, p, now, true);
		if (ret >= 0)
			return ret;
		if (!svc)
			return lb4_no_service(skb, p);
	}
	return lb4_dnat(skb, p, svc, &key, fwd, gone, fresh, now);
}

/*
 * tc_loopback_martian - whether @p, at the ingress of @skb's device, is to
 * or from a loopback address (127.0.0.0/8) and that device is not the
 * loopback one (its ifindex is 1 in every network namespace,
 * LOOPBACK_IFINDEX): counted, for the caller to drop. The kernel drops
 * such a martian only while net.ipv4.conf.*.route_localnet is 0, and
 * kube-proxy's iptables mode sets it to 1 for its localhost NodePorts and
 * leaves it so after `kube-proxy --cleanup`, which takes away the rule
 * that made up for it (KUBE-FIREWALL: `-d 127.0.0.0/8 ! -s 127.0.0.0/8
 * ... -j DROP`): a neighbour's packet to 127.0.0.1 would then reach the
 * node's loopback listeners (CVE-2020-8558). So Sluice drops it itself,
 * whatever route_localnet says; and one from 127.0.0.0/8 (spoofed: no
 * such packet comes from a device), which a SYN to a NodePort with a
 * remote backend would otherwise have source-NATed and forwarded, past
 * the kernel's martian source check. On lo both pass as before (the
 * node's own traffic; tc_ingress). XDP passes both to here (xdp_fwd).
 * Whatever the parser made of the packet: a fragment it passes (a first
 * too short for its L4 header, a later one without its first's record)
 * would be reassembled by the kernel, so it is dropped too.
 * IPv6 has no such setting: the kernel drops ::1 from a device, but only
 * a packet that reaches its stack; one from a spoofed ::1 (or
 * ::ffff:127.0.0.0/104) that tc6 or XDP6 source-NATs to a remote backend
 * is forwarded past that check (a stated limitation: README).
 */
static __always_inline bool tc_loopback_martian(const struct __sk_buff *skb,
						const struct pkt4 *p)
{
	if (skb->ifindex == 1 ||
	    (!addr_loopback_4(p->daddr) && !addr_loopback_4(p->saddr)))
		return false;
	metric_count(p, METRIC_TC_LOOPBACK_DROP);
	return true;
}

/* The IPv6 path (sluice6_ingress, sluice6_egress below). */
#include "lib/tc6.h"

/*
 * tc_body - the programs' body, at a device's @ingress or egress, with
 * pkt4.dry a constant (@dry): the live programs are built with false, so
 * the compiler drops every dry-run branch from them; their dry twins with
 * true, which drops every write. The twins are programs of their own
 * (reached by a tail call, explain_divert), not a second copy inside the
 * live ones: each copy costs the verifier as much as the whole program,
 * and two would not fit its limit. Egress only translates replies back.
 */
static __always_inline int tc_body(struct __sk_buff *skb, bool dry,
				   bool ingress)
{
	struct pkt4 p = { .dry = dry };
	enum pkt_kind kind;
	__u64 now;
	int ret;

	explain_begin(skb, p.dry);
	kind = parse_tc(skb, &p);
	if (ingress && tc_loopback_martian(skb, &p))
		return TC_ACT_SHOT;
	switch (kind) {
	case PKT_L4:
		break;
	case PKT_ICMP_ERR:
		return icmp_err_xlate(skb, &p, ingress);
	case PKT_OTHER:
		/* No frontend serves it (Sluice serves TCP and UDP); one to a
		 * loopback address on lo is not answered (tc_ingress).
		 */
		return ingress && !addr_loopback_4(p.daddr) ?
			       lb4_no_service(skb, &p) :
			       TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
	now = now_ns();
	if (ingress)
		return tc_ingress(skb, &p, now);
	ret = rev_nat(skb, &p, now, false);
	return ret >= 0 ? ret : TC_ACT_OK;
}

/*
 * tc_entry - the attached programs' body: a packet to explain goes to the
 * dry twin, an IPv6 one to the IPv6 program (tc6_divert), the rest
 * through tc_body.
 */
static __always_inline int tc_entry(struct __sk_buff *skb, bool ingress)
{
	if (explain_mark(skb))
		return explain_divert(skb, ingress ? EXPLAIN_PROG_INGRESS :
						     EXPLAIN_PROG_EGRESS);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return tc6_divert(skb,
				  ingress ? TC6_PROG_INGRESS : TC6_PROG_EGRESS);
	return tc_body(skb, false, ingress);
}

SEC("tc")
int sluice_ingress(struct __sk_buff *skb)
{
	return tc_entry(skb, true);
}

SEC("tc")
int sluice_egress(struct __sk_buff *skb)
{
	return tc_entry(skb, false);
}

/*
 * TC_BODY_PROG - the program @name: @body (tc_body or tc6_body) with
 * pkt.dry @dry, at ingress (@ingress) or egress. These are never
 * attached, only tail-called: the IPv6 programs (tc6.h) and the dry twins
 * (explain.h; the IPv6 ones' with EXPLAIN_PROG_IPV6 on).
 */
#define TC_BODY_PROG(name, body, dry, ingress)    \
	SEC("tc") int name(struct __sk_buff *skb) \
	{                                         \
		return body(skb, dry, ingress);   \
	}

TC_BODY_PROG(sluice6_ingress, tc6_body, false, true)
TC_BODY_PROG(sluice6_egress, tc6_body, false, false)
TC_BODY_PROG(sluice_ingress_dry, tc_body, true, true)
TC_BODY_PROG(sluice_egress_dry, tc_body, true, false)
TC_BODY_PROG(sluice6_ingress_dry, tc6_body, true, true)
TC_BODY_PROG(sluice6_egress_dry, tc6_body, true, false)

char __license[] SEC("license") = "Dual BSD/GPL";
