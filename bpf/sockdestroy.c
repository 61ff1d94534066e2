// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Terminating the connected UDP sockets of backends that left (an iter/udp
 * program calling the bpf_sock_destroy kfunc, Linux 6.5+).
 *
 * connect4 translates a socket once (sock.c). A connected UDP socket
 * (statsd, DNS forwarders, QUIC) then sends to its backend for as long as
 * it lives, even after the backend has left its Service: nothing of ours
 * sees its datagrams again. So after a flush (the backends in
 * sluice_ct_flush_v1, the set the conntrack flush forgets in the same
 * pass, bpf/ctgc.c), the agent runs this iterator in each network
 * namespace, and a socket is destroyed (the application's next call fails
 * with ECONNABORTED, and it connects again: through connect4, to a
 * backend that is there) when all of these hold:
 *
 *   - it is connected: an unconnected socket picks its backend again at
 *     every sendmsg4 (sock.c's stickiness drops a backend that left), so
 *     destroying it would only change its source port under the
 *     application (cilium#48564);
 *   - its peer is one of the flushed UDP backends;
 *   - sluice_sock_rev_v1 says connect4 translated it there from a VIP (a
 *     socket connected to the pod's own address is none of ours);
 *   - and that VIP's Service no longer has the backend (a backend that
 *     left one Service may still be another's).
 *
 * Every socket of ours that talked to a flushed backend is written to the
 * iterator's output (struct sock_term_rec) with what was done, for the
 * agent to count: destroyed, or spared because it is unconnected or its
 * Service still has the backend. TCP is left alone: a TCP connection to a
 * pod that went away fails by itself (a RST or a timeout), and one to a
 * pod that is terminating should drain, as kube-proxy lets it.
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
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

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

/* One socket the iterator reports. */
struct sock_term_rec {
	__u64 cookie; /* bpf_get_socket_cookie() */
	__be32 addr;  /* network order: the flushed backend */
	__be16 port;  /* network order */
	__u8 verdict; /* enum sock_term_verdict */
	__u8 pad;
};

BTF_EXPORT(struct sock_term_rec, sock_term_rec);
BTF_EXPORT(enum sock_term_verdict, sock_term_verdict);
_Static_assert(sizeof(struct sock_term_rec) == 16, "sock_term_rec size");

/* still_backend's bpf_loop state: is <addr, port> in slot 1..count? */
struct slot_search {
	struct lb4_key key; /* the frontend; slot set per iteration */
	__be32 addr;
	__be16 port;
	bool found;
};

static long slot_names(__u32 i, void *data)
{
	struct slot_search *s = data;
	struct lb4_service *slot;
	struct lb4_backend *be;

	s->key.slot = i + 1;
	slot = bpf_map_lookup_elem(&sluice_services_v1, &s->key);
	if (!slot)
		return 0;
	be = lookup_backend(slot->backend_id);
	if (be && be->addr == s->addr && be->port == s->port) {
		s->found = true;
		return 1;
	}
	return 0;
}

/*
 * still_backend - whether the Service of the VIP in @rev still has the UDP
 * backend <@addr, @port> in one of its slots.
 */
static __always_inline bool still_backend(const struct sock_rev_entry *rev,
					  __be32 addr, __be16 port)
{
	struct slot_search s = {
		.key = { .vip = rev->vip,
			 .port = rev->port,
			 .proto = IPPROTO_UDP },
		.addr = addr,
		.port = port,
	};
	struct lb4_service *master =
		lookup_service(rev->vip, rev->port, IPPROTO_UDP);

	if (!master || master->count == 0)
		return false;
	bpf_loop(master->count, slot_names, &s, 0);
	return s.found;
}

/* talked_to's state: the first flushed backend the socket talked to. */
struct flushed_search {
	__u64 cookie;
	__be32 addr;
	__be16 port;
	bool found;
};

static long talked_to(void *map, const struct ct_backend_key *b, __u8 *v,
		      struct flushed_search *s)
{
	struct sock_rev_key rkey = {
		.cookie = s->cookie,
		.addr = b->addr,
		.port = b->port,
	};

	if (b->proto != IPPROTO_UDP ||
	    !bpf_map_lookup_elem(&sluice_sock_rev_v1, &rkey))
		return 0;
	s->addr = b->addr;
	s->port = b->port;
	s->found = true;
	return 1;
}

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

SEC("iter/udp")
int sluice_sock_destroy(struct bpf_iter__udp *ctx)
{
	struct sock *sk = ctx->udp_sk;
	struct ct_backend_key b = { .proto = IPPROTO_UDP };
	struct sock_rev_key rkey = {};
	struct sock_rev_entry *rev;
	__u64 cookie;

	if (!sk || sk->__sk_common.skc_family != AF_INET)
		return 0;
	cookie = bpf_get_socket_cookie(sk);
	if (sk->__sk_common.skc_state != TCP_ESTABLISHED) {
		struct flushed_search s = { .cookie = cookie };

		/* Counted only: it selects again by itself. */
		bpf_for_each_map_elem(&sluice_ct_flush_v1, talked_to, &s, 0);
		if (s.found)
			report(ctx, cookie, s.addr, s.port,
			       SOCK_TERM_SPARED_UNCONNECTED);
		return 0;
	}
	b.addr = sk->__sk_common.skc_daddr;
	b.port = sk->__sk_common.skc_dport;
	if (!bpf_map_lookup_elem(&sluice_ct_flush_v1, &b))
		return 0;
	rkey.cookie = cookie;
	rkey.addr = b.addr;
	rkey.port = b.port;
	rev = bpf_map_lookup_elem(&sluice_sock_rev_v1, &rkey);
	if (!rev)
		return 0;
	if (still_backend(rev, b.addr, b.port)) {
		report(ctx, cookie, b.addr, b.port,
		       SOCK_TERM_SPARED_STILL_BACKEND);
		return 0;
	}
	report(ctx, cookie, b.addr, b.port,
	       bpf_sock_destroy((struct sock_common *)sk) ?
		       SOCK_TERM_FAILED :
		       SOCK_TERM_DESTROYED);
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
