// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Terminating the connected UDP sockets of backends that left (an iter/udp
 * program calling the bpf_sock_destroy kfunc, Linux 6.5+).
 *
 * connect4 and connect6 translate a socket once (sock.c). A connected UDP
 * socket (statsd, DNS forwarders, QUIC) then sends to its backend for as
 * long as it lives, even after the backend has left its Service: nothing
 * of ours sees its datagrams again. So after a flush (the backends in
 * sluice_ct_flush_v1, or sluice6_ct_flush_v1 for IPv6 ones: the set the
 * conntrack flush forgets in the same pass, bpf/ctgc.c), the agent runs
 * this iterator in each network namespace, and a socket is destroyed (the
 * application's next call fails with ECONNABORTED, and it connects again:
 * through connect4 or connect6, to a backend that is there) when all of
 * these hold:
 *
 *   - it is connected: an unconnected socket picks its backend again at
 *     every sendmsg4 (sock.c's stickiness drops a backend that left), so
 *     destroying it would only change its source port under the
 *     application (cilium#48564);
 *   - its peer is one of the flushed UDP backends;
 *   - sluice_sock_rev_v1 (sluice6_sock_rev_v1) says connect4 (connect6)
 *     translated it there from a VIP (a socket connected to the pod's own
 *     address is none of ours);
 *   - and that VIP's Service no longer has the backend (a backend that
 *     left one Service may still be another's).
 *
 * The rules are the same for both families, written once
 * (lib/sockdestroy_fam.h) and judged by the family of the backend, not of
 * the socket: an AF_INET6 socket connected to ::ffff:a.b.c.d went through
 * the IPv4 Service (connect6 translates a mapped address with the IPv4
 * maps and sluice_sock_rev_v1), so it is judged, and destroyed, as an
 * AF_INET socket to that backend would be.
 *
 * Every socket of ours that talked to a flushed backend is written to the
 * iterator's output (struct sock_term_rec, or sock_term6_rec for an IPv6
 * backend) with what was done, for the agent to count: destroyed, or
 * spared because it is unconnected or its Service still has the backend.
 * TCP is left alone: a TCP connection to a pod that went away fails by
 * itself (a RST or a timeout), and one to a pod that is terminating
 * should drain, as kube-proxy lets it.
 */
#include "lib/consts.h"
#include "lib/config.h"
#include "lib/maps.h"
#include "lib/lb.h"

/*
 * The kernel's types this program reads, as far as it reads them. Field
 * offsets are relocated against the running kernel's BTF at load (CO-RE),
 * so only names and types matter here, not the layout.
 */
struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	void *udp_sk; /* struct udp_sock *, NULL at the end */
} __attribute__((preserve_access_index));

struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	/* struct in6_addr: one composite is as good as another to CO-RE */
	union v6addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup;

struct cgroup_subsys_state {
	struct cgroup *cgroup;
	struct cgroup_subsys_state *parent;
} __attribute__((preserve_access_index));

struct cgroup {
	struct cgroup_subsys_state self;
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct sock_cgroup_data {
	struct cgroup *cgroup;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	struct sock_cgroup_data sk_cgrp_data;
} __attribute__((preserve_access_index));

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

/* __builtin_preserve_field_info's kind: whether the field exists. */
#define BPF_FIELD_EXISTS 2

/* skc_state of a connected UDP socket (include/net/tcp_states.h). */
#define TCP_ESTABLISHED 1

/* What happened to a socket (sock_term_rec.verdict). */
enum sock_term_verdict {
	/* connected to a backend that left its VIP's Service: destroyed */
	SOCK_TERM_DESTROYED = 1,
	/* the same, but bpf_sock_destroy failed */
	SOCK_TERM_FAILED = 2,
	/* unconnected, and translated to a flushed backend before */
	SOCK_TERM_SPARED_UNCONNECTED = 3,
	/* connected to a flushed backend its VIP's Service still has */
	SOCK_TERM_SPARED_STILL_BACKEND = 4,
};

/*
 * One socket the iterator reports, of an IPv4 backend; of an IPv6 one, a
 * struct sock_term6_rec, which begins as this record does with v6 set.
 * The reader tells them apart by that byte (the last of this record).
 */
struct sock_term_rec {
	__u64 cookie; /* bpf_get_socket_cookie() */
	__be32 addr;  /* network order: the flushed backend; 0 if v6 */
	__be16 port;  /* network order */
	__u8 verdict; /* enum sock_term_verdict */
	__u8 v6;      /* 0; 1: the head of a struct sock_term6_rec */
};

struct sock_term6_rec {
	struct sock_term_rec head; /* v6 1, addr 0 */
	union v6addr addr;	   /* network order: the flushed backend */
};

BTF_EXPORT(struct sock_term_rec, sock_term_rec);
BTF_EXPORT(struct sock_term6_rec, sock_term6_rec);
BTF_EXPORT(enum sock_term_verdict, sock_term_verdict);
_Static_assert(sizeof(struct sock_term_rec) == 16, "sock_term_rec size");
_Static_assert(sizeof(struct sock_term6_rec) == 32, "sock_term6_rec size");

/*
 * report - write the socket @cookie of the IPv4 backend <@addr, @port>
 * and @verdict to the iterator's output; report6 for an IPv6 backend.
 */
static __always_inline void report(struct bpf_iter__udp *ctx, __u64 cookie,
				   __be32 addr, __be16 port, __u8 verdict)
{
	struct sock_term_rec rec = {
		.cookie = cookie,
		.addr = addr,
		.port = port,
		.verdict = verdict,
	};

	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
}

static __always_inline void report6(struct bpf_iter__udp *ctx, __u64 cookie,
				    union v6addr addr, __be16 port,
				    __u8 verdict)
{
	struct sock_term6_rec rec = {
		.head = { .cookie = cookie,
			  .port = port,
			  .verdict = verdict,
			  .v6 = 1 },
		.addr = addr,
	};

	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
}

#define LB_FAMILY 4
#include "lib/sockdestroy_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "lib/sockdestroy_fam.h"
#undef LB_FAMILY

/*
 * sock_term_in6 - sluice_sock_destroy for an AF_INET6 socket @sk (cookie
 * @cookie). Its peer is an IPv6 backend (sock_term6), or an IPv4 one that
 * it reached as ::ffff:a.b.c.d through an IPv4 VIP (connect6 translated it
 * with the IPv4 maps, sock.c): judged as an AF_INET socket to that backend
 * would be (sock_term), and destroyed alike. Unconnected, it may have
 * sent to VIPs of both families.
 */
static __always_inline void sock_term_in6(struct bpf_iter__udp *ctx,
					  struct sock *sk, __u64 cookie)
{
	union v6addr daddr;

	if (sk->__sk_common.skc_state != TCP_ESTABLISHED) {
		if (!spare_unconnected6(ctx, cookie))
			spare_unconnected(ctx, cookie);
		return;
	}
	daddr.p[0] = sk->__sk_common.skc_v6_daddr.p[0];
	daddr.p[1] = sk->__sk_common.skc_v6_daddr.p[1];
	daddr.p[2] = sk->__sk_common.skc_v6_daddr.p[2];
	daddr.p[3] = sk->__sk_common.skc_v6_daddr.p[3];
	if (lb6_v4_mapped(&daddr))
		sock_term(ctx, sk, cookie, daddr.p[3],
			  sk->__sk_common.skc_dport);
	else
		sock_term6(ctx, sk, cookie, daddr, sk->__sk_common.skc_dport);
}

SEC("iter/udp")
int sluice_sock_destroy(struct bpf_iter__udp *ctx)
{
	struct sock *sk = ctx->udp_sk;
	__u64 cookie;

	if (!sk)
		return 0;
	if (sk->__sk_common.skc_family == AF_INET6) {
		/* A kernel without IPv6 has neither such sockets nor
		 * skc_v6_daddr: the branch is then dead, and its read, which
		 * CO-RE cannot relocate, is never verified.
		 */
		if (__builtin_preserve_field_info(sk->__sk_common.skc_v6_daddr,
						  BPF_FIELD_EXISTS))
			sock_term_in6(ctx, sk, bpf_get_socket_cookie(sk));
		return 0;
	}
	if (sk->__sk_common.skc_family != AF_INET)
		return 0;
	cookie = bpf_get_socket_cookie(sk);
	if (sk->__sk_common.skc_state != TCP_ESTABLISHED) {
		spare_unconnected(ctx, cookie);
		return 0;
	}
	sock_term(ctx, sk, cookie, sk->__sk_common.skc_daddr,
		  sk->__sk_common.skc_dport);
	return 0;
}

/*
 * Ending the connected UDP sockets whose peer is still a UDP frontend (run
 * once, at the agent's start: sockdestroy.go's endFrontendSockets). Such a
 * socket was connected before socket load balancing covered it (kube-proxy
 * served the node then): connect4 (connect6) translates at connect only,
 * so its datagrams go on leaving for the VIP, and only the conntrack entry
 * kube-proxy's DNAT left sends them anywhere. Ended, the application
 * connects again, through connect4 (connect6). A socket connect4
 * (connect6) translated is left alone, though its peer, the backend, be a
 * frontend too (translated4). Only the sockets socket
 * load balancing covers: of a process in the cgroup it is attached to
 * (frontends_cgroup_id, or a descendant); the agent runs this in the
 * network namespaces it covers (all, or the host's only).
 */
volatile __u64 frontends_cgroup_id;

/* How many levels up from a socket's cgroup are searched for that one. */
#define FRONTENDS_CGROUP_DEPTH 64

/* in_lb_cgroup - whether @sk's cgroup is frontends_cgroup_id or below it. */
static __always_inline bool in_lb_cgroup(struct sock *sk)
{
	struct cgroup *cg = sk->sk_cgrp_data.cgroup;
	__u64 want = frontends_cgroup_id;

	for (int i = 0; i < FRONTENDS_CGROUP_DEPTH && cg; i++) {
		struct cgroup_subsys_state *parent;

		if (cg->kn->id == want)
			return true;
		parent = cg->self.parent;
		if (!parent)
			return false;
		cg = parent->cgroup;
	}
	return false;
}

/*
 * translated4 - whether connect4 (or connect6, for an IPv4-mapped peer)
 * translated the socket @cookie to <@addr, @port>: its peer is then the
 * backend Sluice picked, not a frontend left untranslated, even when that
 * backend's address and port are also a UDP frontend (an ExternalIP equal
 * to a hostNetwork backend's node address and port; an EndpointSlice that
 * names another Service's VIP). translated6 for an IPv6 peer.
 */
static __always_inline bool translated4(__u64 cookie, __be32 addr, __be16 port)
{
	struct sock_rev_key key = {
		.cookie = cookie,
		.addr = addr,
		.port = port,
	};

	return bpf_map_lookup_elem(&sluice_sock_rev_v1, &key);
}

static __always_inline bool translated6(__u64 cookie, union v6addr addr,
					__be16 port)
{
	struct sock6_rev_key key = {
		.cookie = cookie,
		.addr = addr,
		.port = port,
	};

	return bpf_map_lookup_elem(&sluice6_sock_rev_v1, &key);
}

SEC("iter/udp")
int sluice_sock_destroy_frontends(struct bpf_iter__udp *ctx)
{
	struct sock *sk = ctx->udp_sk;
	__be16 dport;
	__u64 cookie;
	__u8 verdict;

	if (!sk || sk->__sk_common.skc_state != TCP_ESTABLISHED)
		return 0;
	dport = sk->__sk_common.skc_dport;
	if (sk->__sk_common.skc_family == AF_INET) {
		__be32 daddr = sk->__sk_common.skc_daddr;

		if (!lookup_service(daddr, dport, IPPROTO_UDP) ||
		    !in_lb_cgroup(sk))
			return 0;
		cookie = bpf_get_socket_cookie(sk);
		if (translated4(cookie, daddr, dport))
			return 0;
		verdict = bpf_sock_destroy((struct sock_common *)sk) ?
				  SOCK_TERM_FAILED :
				  SOCK_TERM_DESTROYED;
		report(ctx, cookie, daddr, dport, verdict);
		return 0;
	}
	if (sk->__sk_common.skc_family != AF_INET6 ||
	    !__builtin_preserve_field_info(sk->__sk_common.skc_v6_daddr,
					   BPF_FIELD_EXISTS))
		return 0;
	{
		union v6addr daddr;

		daddr.p[0] = sk->__sk_common.skc_v6_daddr.p[0];
		daddr.p[1] = sk->__sk_common.skc_v6_daddr.p[1];
		daddr.p[2] = sk->__sk_common.skc_v6_daddr.p[2];
		daddr.p[3] = sk->__sk_common.skc_v6_daddr.p[3];
		if (lb6_v4_mapped(&daddr)) {
			if (!lookup_service(daddr.p[3], dport, IPPROTO_UDP))
				return 0;
		} else if (!lookup_service6(daddr, dport, IPPROTO_UDP)) {
			return 0;
		}
		if (!in_lb_cgroup(sk))
			return 0;
		cookie = bpf_get_socket_cookie(sk);
		if (lb6_v4_mapped(&daddr) ?
			    translated4(cookie, daddr.p[3], dport) :
			    translated6(cookie, daddr, dport))
			return 0;
		verdict = bpf_sock_destroy((struct sock_common *)sk) ?
				  SOCK_TERM_FAILED :
				  SOCK_TERM_DESTROYED;
		if (lb6_v4_mapped(&daddr))
			report(ctx, cookie, daddr.p[3], dport, verdict);
		else
			report6(ctx, cookie, daddr, dport, verdict);
	}
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
