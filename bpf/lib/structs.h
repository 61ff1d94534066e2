/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Map layouts shared by every Sluice program and by the Go agent.
 *
 * These structs are an ABI: the agent writes them, the datapath reads them,
 * and pinned maps outlive both. Fields are fixed width with explicit padding
 * (padding is hashed as part of a key, so the agent always zeroes it), and
 * every field says its byte order. Each map's name in maps.h carries the
 * version of its layout (sluice_services_v1): a change of a key or value
 * here bumps it, with a conversion in pkg/datapath (pins.go), so that an
 * upgrade keeps the pinned state. Go types are generated from these by
 * bpf2go (-type), never copied by hand; so are the values of the enums
 * here, which is why flag and reason families are enums and not #defines
 * (see BTF_EXPORT at the end).

 */
#ifndef SLUICE_STRUCTS_H
#define SLUICE_STRUCTS_H

#include "consts.h"

/*
 * sluice_services_v2: key -> struct lb4_service, the frontends' masters.
 * sluice_slots_v1 (array): __u32 index (host order) -> __u32 backend id
 * (host order; 0: empty), the frontends' backend slots.
 *
 * One service frontend <vip, port, proto> has, per scope, one master entry
 * (key slot 0) holding the backend count, the service id and where its
 * slots are: slot i (1..count) is sluice_slots_v1[slots_base + i - 1], in
 * a range of the array the agent allocated to the frontend (at least count
 * entries; pkg/datapath slotalloc.go). The agent writes backends, then
 * slots, then the master, so a reader never sees a slot that names a
 * backend that does not exist yet. A frontend that outgrows its range gets
 * a larger one: the agent copies its slots there, writes the master with
 * the new base, and reuses the old range only a second later, so that a
 * program that read the old master finds its slots, or empty ones (id 0:
 * no backend), never another frontend's.
 *
 * Until v1 the slots were entries of the services hash under slot 1..count
 * (96 bytes of kernel memory and a hash insert each): the key keeps its
 * slot field, always 0 now, so that the keys that embed it (session
 * affinity's) keep their layout.
 *
 * Most frontends have one scope, LB_SCOPE_DEFAULT. One whose master says
 * SVC_F_TWO_SCOPES (externalTrafficPolicy Local) has a second master and
 * range under LB_SCOPE_INTERNAL, for internal clients (the cluster CIDR,
 * the node's sockets), written before the flag that names it.
 */
struct lb4_key {
	__be32 vip;  /* network order */
	__be16 port; /* network order */
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 scope;  /* enum lb_scope; pinned before scopes existed: 0 */
	__u16 slot;  /* host order; always 0 (a master) in sluice_services_v2 */
	__u16 pad1;
};

/* lb4_key.scope: which clients of a frontend a master and its slots serve. */
enum lb_scope {
	/* every client of a one-scope frontend, external ones of two */
	LB_SCOPE_DEFAULT = 0,
	/* internal clients of a two-scope frontend */
	LB_SCOPE_INTERNAL = 1,
};

struct lb4_service {
	union {
		/* host order; unused (0): v1's slots held their backend
		 * here
		 */
		__u32 backend_id;
		/* host order; with SVC_F_AFFINITY: the sessionAffinity
		 * ClientIP timeout, in seconds
		 */
		__u32 affinity_timeout;
	};
	__u32 count;	  /* host order; number of backend slots */
	__u32 rev_nat_id; /* host order; service id, index in sluice_rev_nat_v2 */
	__u8 flags;	  /* enum svc_flags */
	__u8 scope;	  /* its key's scope */
	__u8 pad[2];
	__u32 slots_base; /* host order; index of slot 1 in sluice_slots_v1 */
};

/*
 * sluice_backends_v2 (array): __u32 backend id (host order) -> struct
 * lb4_backend. An array has an entry under every index: the ids no backend
 * holds are entries whose flags lack BE_F_PRESENT. A new array is all zero,
 * all absent; the agent deletes a backend by writing its entry back with
 * BE_F_PRESENT cleared and the rest kept, so that a program reading it
 * while it is written (an array's update copies in place) reads it present
 * or absent, never half an address. Readers treat an absent entry as a
 * hash's missing key (lookup_backend).
 */
struct lb4_backend {
	__be32 addr; /* network order */
	__be16 port; /* network order */
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 flags;  /* enum backend_flags */
};

/* Flags of a backend entry (lb4_backend.flags, lb6_backend.flags). */
enum backend_flags {
	/* a backend holds the id: without it the entry is absent */
	BE_F_PRESENT = 1,
};

/*
 * sluice_rev_nat_v2 (array): __u32 service id (host order) -> struct
 * lb4_rev_nat. Each scope of a frontend has its own service id; the
 * datapath reads only the frontend, the agent restores which scope an id
 * is from. As in sluice_backends_v2, every index has an entry: the ids no
 * service holds are entries whose flags lack RN_F_PRESENT, and readers
 * treat them as a hash's missing key. The flags byte is the value's last,
 * so that the agent makes an entry present or absent with one store of
 * the value's last word (pkg/datapath/bemem.go).
 */
struct lb4_rev_nat {
	__be32 vip;  /* network order */
	__be16 port; /* network order */
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 scope;  /* enum lb_scope of the id's master */
	__u8 pad[3];
	__u8 flags; /* enum rev_nat_flags */
};

/* Flags of a reverse-NAT entry (lb4_rev_nat.flags, lb6_rev_nat.flags). */
enum rev_nat_flags {
	/* a service holds the id: without it the entry is absent */
	RN_F_PRESENT = 1,
};

/*
 * The per-packet path keeps two entries per translated flow: CT_FORWARD keyed
 * by the client's tuple to the frontend (saddr=client, daddr=frontend),
 * whose nat_* fields name the backend; and CT_REVERSE keyed by the reply's
 * tuple as it arrives, whose nat_* fields name the frontend.
 *
 * A flow to a backend on another node (CT_F_SNAT) is also source-NATed to
 * this node's address and a port reserved for it: the forward entry's
 * snat_* fields name that <node, port>, the reverse entry is keyed by
 * <backend -> node:port> (which is what makes the port reserved: it is
 * inserted with BPF_NOEXIST) and its snat_* fields name the client.
 *
 * Two maps hold them (conntrack.h says how entries move between them):
 *
 * sluice_ct_new_v1 (LRU): struct ct4_key -> struct ct4_entry. Flows that
 * have seen no reply yet (half-open), or TCP flows no client ACK has
 * assured yet, beyond the share of sluice_conntrack they may take
 * (ct_half_open_max): a flood of them can only evict each other.
 *
 * sluice_conntrack_v2 (hash): struct ct4_key -> struct ct4_entry. Flows
 * that have seen a reply (established), up to ct_half_open_max half-open
 * ones (without CT_F_REPLIED, or TCP ones answered but not yet assured:
 * CT_F_AWAIT), and the port reservations of source-NATed flows (the
 * unanswered or unassured ones within that share too). Nothing evicts
 * them: entries leave when they have expired (the agent's GC,
 * sluice_ct_gc) or when the agent flushes a backend. When it is full, new
 * flows are refused.
 */
struct ct4_key {
	__be32 saddr; /* network order */
	__be32 daddr; /* network order */
	__be16 sport; /* network order */
	__be16 dport; /* network order */
	__u8 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 dir;     /* enum ct_dir */
	__u16 pad;
};

/* ct4_key.dir */
enum ct_dir {
	CT_FORWARD = 0,
	CT_REVERSE = 1,
};

struct ct4_entry {
	/*
	 * now_ns() (consts.h) from which on the entry is dead, compared
	 * signed (so a clock read before another CPU's refresh never makes
	 * it look expired); moved with compare-and-swap, forward only and
	 * by at least a second at a time, except to CT_DEAD (0: claimed for
	 * deletion) or closer when the flow closes.
	 */
	__u64 expires;
	__u32 flags;	  /* enum ct_flags, set with atomic or */
	__be32 nat_addr;  /* network order: backend (fwd) or frontend (rev) */
	__be16 nat_port;  /* network order */
	__be16 snat_port; /* network order, CT_F_SNAT: node or client port */
	__be32 snat_addr; /* network order, CT_F_SNAT: node or client */
	__u32 backend_id; /* host order */
	__u32 rev_nat_id; /* host order */
};

/* ct4_entry.flags */
enum ct_flags {
	/* source-NATed flow to a remote backend */
	CT_F_SNAT = 0x01,
	/* TCP FIN seen from the client */
	CT_F_FIN_FWD = 0x02,
	/* TCP FIN seen from the backend */
	CT_F_FIN_REV = 0x04,
	/*
	 * TCP RST seen from the client (before CT_F_RST_REV, from either
	 * side: an entry of an earlier release with it is closed all the
	 * same). Taken back (ct_track_tcp) by a later packet of the client
	 * (not a RST or a SYN), or turned into CT_F_CHAL_FWD by a bare ACK
	 * of the backend.
	 */
	CT_F_RST_FWD = 0x08,
	/*
	 * a reply seen: the flow is established (a TCP flow with CT_F_AWAIT
	 * once assured: CT_F_ASSURED)
	 */
	CT_F_REPLIED = 0x10,
	/*
	 * a forward entry in sluice_conntrack whose flow no longer counts
	 * against the half-open share (conntrack.h, ct_admit), or a port
	 * reservation that no longer does (CT_F_ADMITTED): set by the
	 * assurance of a TCP flow (ct_assure, before CT_F_ASSURED), by the
	 * promotion in place of a UDP flow (with CT_F_REPLIED), by the
	 * deleter that claims the entry of a flow that ends half-open or
	 * unassured, or at the insert of an entry that was never counted;
	 * whoever sets it first takes the flow off the count
	 */
	CT_F_COUNTED = 0x20,
	/* TCP RST seen from the backend (CT_F_RST_FWD's twin) */
	CT_F_RST_REV = 0x40,
	/*
	 * The client's RST answered by a bare ACK of the backend (the
	 * challenge ACK of a RST it ignored, RFC 5961; or an ACK it sent
	 * before the RST reached it): open again, but living
	 * ct_timeout_syn_ns idle, until the client sends more (it is alive:
	 * the mark goes) or a RST (closed again). ct_track_tcp.
	 */
	CT_F_CHAL_FWD = 0x80,
	/* The backend's RST answered by the client's bare ACK (twin) */
	CT_F_CHAL_REV = 0x100,
	/*
	 * a source-NATed flow's port reservation (its reply entry in
	 * sluice_conntrack) counted against the half-open share at its
	 * insert (ct_create_snat), until CT_F_COUNTED is set on it: by its
	 * flow's assurance (TCP, ct_assure) or promotion (UDP, with
	 * CT_F_REPLIED, ct_promote_snat) or by the deleter that claims it
	 * unanswered or unassured; whoever sets CT_F_COUNTED first takes
	 * it off the count. A reservation without it (an earlier release's,
	 * or one ct_check_reverse re-created) was never counted
	 */
	CT_F_ADMITTED = 0x200,
	/*
	 * a TCP flow answered (set with CT_F_REPLIED, in one atomic or, by
	 * the first reply) whose client has not acknowledged the answer yet:
	 * netfilter's SYN_RECV, not IPS_ASSURED. It lives ct_timeout_syn_ns
	 * idle and stays counted in the half-open share (its forward entry
	 * in sluice_conntrack, or its port reservation) until CT_F_ASSURED
	 * is set (ct_assure, conntrack.h). An entry of an earlier release,
	 * which has CT_F_REPLIED without it, is established (assured).
	 */
	CT_F_AWAIT = 0x400,
	/*
	 * the client's ACK after the answer seen (ct_assure): the flow of
	 * a CT_F_AWAIT entry is established. Set only, never taken back:
	 * a second promotion racing the first (a retransmitted SYN-ACK)
	 * may set CT_F_AWAIT again, which this bit outweighs
	 */
	CT_F_ASSURED = 0x800,
};

/*
 * sluice_ct_flush_v1: struct ct_backend_key -> __u8 (1). The backends
 * whose flows the next sluice_ct_gc run in flush mode forgets; written
 * and emptied by the agent around that run.
 */
struct ct_backend_key {
	__be32 addr; /* network order */
	__be16 port; /* network order */
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

/* The context of sluice_ct_gc (BPF_PROG_RUN): its mode in, counts out. */
struct ct_gc_args {
	__u32 flush;   /* CT_GC_COLLECT, CT_GC_FLUSH, ... (ctgc.c) */
	__u32 family;  /* 4 (or 0): the IPv4 conntrack maps; 6: the IPv6 ones */
	__u64 now;     /* in: now_ns() to judge by, read by the agent */
	__u64 deleted; /* out: entries deleted */
	__u64 live;    /* out: entries left in sluice_conntrack */
	__u64 pending; /* out: of them, reservations of half-open flows */
	__u64 kept;    /* out: expired, kept for a live peer entry */
	__u64 claimed; /* out: expired, but claimed by another deleter */
	__u64 half_open; /* out: entries left that the half-open count holds */
	__s64 adjust;	 /* in (CT_GC_ADJUST): added to the family's count */
};

/*
 * sluice_ct_admit_v1 (array, index 0: IPv4, 1: IPv6): the share of
 * sluice_conntrack that half-open flows hold (conntrack.h, ct_admit).
 * pending is the folded count of half-open flows there, new_live
 * whether sluice_ct_new may hold an entry (set by a program after it
 * inserts one, cleared and set again by the agent's GC).
 */
struct ct_admit {
	__s64 pending;
	__u32 new_live;
	__u32 pad;
};

/*
 * sluice_ct_pcpu_v1 (per-CPU array, indexed as sluice_ct_admit_v1): each
 * CPU's part of the count not folded yet (within +-CT_ADMIT_BATCH), and
 * its inserts into sluice_ct_new.
 */
struct ct_admit_pcpu {
	__s64 pending;
	__u64 new_inserts;
};

/*
 * sluice_sock_rev_v1 (LRU): struct sock_rev_key -> struct sock_rev_entry.
 * Written by connect4/sendmsg4, read by recvmsg4/getpeername4 so that a socket
 * translated to a backend still reports the VIP as its peer.
 */
struct sock_rev_key {
	__u64 cookie; /* bpf_get_socket_cookie() */
	__be32 addr;  /* network order: backend address */
	__be16 port;  /* network order: backend port */
	__u16 pad;
};

struct sock_rev_entry {
	__be32 vip;  /* network order */
	__be16 port; /* network order */
	__u16 pad;
	__u32 rev_nat_id; /* host order */
};

/*
 * sluice_metrics_v1 (per-CPU array): __u32 reason (host order) -> __u64 count.
 * Append new reasons before METRIC_MAX, never renumber: pinned counters
 * outlive the agent. The agent labels each reason with its name,
 * lower-cased, without METRIC_ (METRIC_TC_DNAT_NEW counts as tc_dnat_new),
 * taken from the BTF: a new reason needs nothing on the Go side.
 */
enum metric_reason {
	/* connect4/sendmsg4 translated VIP -> backend */
	METRIC_SOCK_XLATE = 0,
	/* connect4/sendmsg4 refused: service has no backends */
	METRIC_SOCK_NO_BACKEND,
	/* recvmsg4/getpeername4 translated backend -> VIP */
	METRIC_SOCK_REV_XLATE,
	/* connect4/sendmsg4 refused: no backend found, even after reading
	 * the service again (a slot or backend vanished under the reader)
	 */
	METRIC_SOCK_BACKEND_MISSING,
	/* new flow to a VIP, backend selected */
	METRIC_TC_DNAT_NEW,
	/* flow to a VIP, backend reused from conntrack */
	METRIC_TC_DNAT_CT,
	/* reply rewritten back to the VIP */
	METRIC_TC_REV_NAT,
	/* ICMP port unreachable sent for a service with no backends */
	METRIC_TC_NO_BACKEND,
	/* dropped: no backend found, even after reading the service again
	 * (a slot or backend vanished under the reader)
	 */
	METRIC_TC_BACKEND_MISSING,
	/* IPv4 packet too short or inconsistent: passed untouched */
	METRIC_TC_MALFORMED,
	/* non-first IPv4 fragment whose first was not seen: passed untouched */
	METRIC_TC_FRAGMENT,
	/* conntrack update failed: packet translated without state */
	METRIC_TC_CT_FULL,
	/* a helper failed while rewriting: dropped */
	METRIC_TC_REWRITE_ERR,
	/* new external flow to a remote backend: DNAT and SNAT */
	METRIC_TC_SNAT_NEW,
	/* no free SNAT source port for a new flow: dropped */
	METRIC_TC_SNAT_EXHAUSTED,
	/* no route or neighbour for a redirected packet: dropped */
	METRIC_TC_FIB_ERR,
	/* externalTrafficPolicy Local, no local endpoint: dropped */
	METRIC_TC_LOCAL_NO_BACKEND,
	/* a new or not yet answered flow's source not in
	 * loadBalancerSourceRanges: dropped
	 */
	METRIC_TC_SRC_RANGE_DENY,
	/* XDP: external flow translated and transmitted */
	METRIC_XDP_FWD,
	/* XDP: reply of an external flow translated and transmitted */
	METRIC_XDP_REV,
	/* XDP: a new or not yet answered flow's source not in
	 * loadBalancerSourceRanges: dropped
	 */
	METRIC_XDP_SRC_RANGE_DENY,
	/* XDP: conntrack update failed: packet translated without state */
	METRIC_XDP_CT_FULL,
	/* XDP: new external flow to a remote backend: DNAT and SNAT */
	METRIC_XDP_SNAT_NEW,

	/* Packet edges (issue 11: fragments, ICMP errors, forwarding). */
	/* non-first IPv4 fragment, given the ports of its first (frag.h) */
	METRIC_TC_FRAG_LATER,
	/* non-first fragment of a datagram refused or without a flow: dropped */
	METRIC_TC_FRAG_DROP,
	/* reply reverse-NATed at ingress to an external frontend (the node's
	 * address): redirected to the client, not passed up as a martian
	 */
	METRIC_TC_REV_REDIRECT,
	/* redirect path, TTL would expire: ICMP time exceeded */
	METRIC_TC_TTL_EXCEEDED,
	/* redirect path, over the egress MTU with DF: ICMP frag needed */
	METRIC_TC_FRAG_NEEDED,
	/* redirect path, over the egress MTU without DF: dropped */
	METRIC_TC_MTU_DROP,
	/* redirect path, TTL or MTU: passed to the stack as it came */
	METRIC_TC_FWD_TO_STACK,
	/* XDP: TTL would expire: passed to tc */
	METRIC_XDP_TTL_EXCEEDED,
	/* XDP: over the egress MTU: passed to tc */
	METRIC_XDP_MTU_EXCEEDED,
	/* ICMP error about a translated flow: translated back */
	METRIC_TC_ICMP_XLATE,

	/* Conntrack (issue 11: races, floods, reuse). */
	/* established conntrack table full: a new flow refused (its first
	 * reply, or the SYN of a source-NATed flow, dropped)
	 */
	METRIC_TC_CT_EST_FULL,
	/* a new flow's reply tuple is a live flow's of another frontend
	 * (two VIPs sharing a backend), and the flow cannot be remapped to
	 * another client port (no free port, or not a TCP SYN or UDP):
	 * dropped; or a packet of a flow whose reply tuple another holds; or
	 * a packet of a new or half-open flow one of whose keys holds an
	 * entry another deleter has claimed and not deleted yet (a flush,
	 * the GC, a new flow on the tuple): dropped, and the client's next
	 * try, once the claimer's delete is done, goes through
	 */
	METRIC_TC_CT_CLASH,
	/* a packet of a source-NATed flow whose port another flow now
	 * holds: dropped, never sent from a port the flow does not own
	 */
	METRIC_TC_SNAT_LOST,
	/* a packet of an established TCP flow whose backend left its
	 * service: kept on it (draining); a new SYN selects again
	 */
	METRIC_TC_CT_BACKEND_GONE,

	/* Service semantics (issue 9: traffic policies, masquerade, rejects). */
	/* packet of an internal client (cluster CIDR) to a two-scope
	 * frontend: served by its internal scope (kube-proxy's short-circuit)
	 */
	METRIC_TC_SHORT_CIRCUIT,
	/* new flow source-NATed to this node towards a backend on this
	 * node (masquerade: --masquerade-all, a client outside the cluster
	 * CIDR, an internal client of an external frontend, a hairpin)
	 */
	METRIC_TC_MASQ_LOCAL,
	/* packet to a service IP on a port or protocol no frontend serves:
	 * ICMP port unreachable sent
	 */
	METRIC_TC_UNKNOWN_PORT,
	/* packet to an unallocated address of the service CIDR: dropped */
	METRIC_TC_SERVICE_CIDR_DROP,
	/* connect4/sendmsg4 refused: a service IP on a port or protocol no
	 * frontend serves (ECONNREFUSED)
	 */
	METRIC_SOCK_UNKNOWN_PORT,
	/* connect4/sendmsg4 refused where a packet would be dropped
	 * (EHOSTUNREACH): no backend for this client here, a source range,
	 * an unallocated address of the service CIDR
	 */
	METRIC_SOCK_DROP,
	/* IPv6 at tc: an extension header it does not skip (AH, mobility,
	 * ...), or a chain longer than it walks: passed untouched
	 */
	METRIC_TC6_EXT_HDR,
	/* IPv6 UDP with checksum 0 (invalid, RFC 8200 8.1; the stack
	 * drops it): passed untouched
	 */
	METRIC_TC6_UDP_NO_CSUM,
	/* a new flow's reply tuple is a live flow's of another frontend
	 * (one client port to two Services sharing an endpoint): the flow
	 * is source-NATed to the client's own address with another port,
	 * as netfilter's NAT makes a tuple unique
	 */
	METRIC_TC_CT_CLASH_REMAP,
	/* a new flow answered while the established conntrack table is
	 * full: kept in sluice_ct_new, the LRU, as established (the agent's
	 * GC is due), instead of refused (ct_overflow)
	 */
	METRIC_TC_CT_EST_OVERFLOW,
	/* an ICMP (ICMPv6) error tc would send over the kernel's rate limits
	 * (icmp.h, icmp_rl_allow): not sent, the packet dropped, counted
	 * under its own reason too (tc_unknown_port, tc_ttl_exceeded, ...)
	 */
	METRIC_TC_ICMP_RATELIMITED,
	/* a DNAT-only flow's reply, or an ICMP error about its request, at
	 * a device's ingress whose route leaves by a device with tc: passed
	 * up untranslated, for that device's egress to translate (tc.c,
	 * rev_at_egress4; tc6.h, rev_at_egress6; icmp_xlate.h, icmp6_xlate.h)
	 */
	METRIC_TC_REV_AT_EGRESS,
	/* a TCP packet to a frontend, or to a port a ClusterIP does not
	 * serve, that has no conntrack entry and cannot open one (a RST, a
	 * FIN, a SYN-ACK, or neither SYN nor ACK): dropped untranslated, not
	 * answered, as netfilter finds it INVALID and opens nothing (only a
	 * SYN, or an ACK by loose pickup, opens a flow); also a FIN or RST of
	 * a flow whose frontend port was removed since
	 */
	METRIC_TC_TCP_STRAY,
	/* a TCP packet as METRIC_TC_TCP_STRAY's, to an external frontend
	 * (NodePort, ExternalIP, LoadBalancer) on one of the node's own
	 * addresses: passed up untranslated, as kube-proxy leaves netfilter's
	 * INVALID there, for the node's stack (which answers a FIN or an ACK
	 * with a RST: no socket); not counted METRIC_TC_TCP_STRAY
	 */
	METRIC_TC_TCP_STRAY_UP,
	/* a new source-NATed flow whose port search found every port tried
	 * held, given the port of a closed flow still held for the
	 * backend's TIME_WAIT (--conntrack-tcp-snat-time-wait), past its
	 * close timeout: that flow's entries deleted (ct_snat_take), as
	 * netfilter reuses such a tuple when its range is exhausted
	 */
	METRIC_TC_SNAT_TW_REUSE,
	/* a packet from a device other than the loopback one to or from a
	 * loopback address (127.0.0.0/8): dropped, whatever route_localnet
	 * says, as kube-proxy's KUBE-FIREWALL drops one to it
	 * (CVE-2020-8558) and the kernel's martian checks one from it
	 * (tc.c, tc_loopback_martian)
	 */
	METRIC_TC_LOOPBACK_DROP,
	/* a new source-NATed flow (or a clash remap) refused, its SYN or
	 * datagram dropped: the half-open share of sluice_conntrack
	 * (ct_half_open_max) is full, and an unanswered port reservation
	 * counts in it (ct_create_snat), so that a flood of new flows to a
	 * source-NATed frontend cannot fill the table nothing evicts
	 */
	METRIC_TC_SNAT_HALF_OPEN_FULL,
	METRIC_MAX,
};

/*
 * sluice_metrics has room for this many reasons, so that appending one
 * changes no map layout.
 */
#define METRIC_SLOTS 256
_Static_assert(METRIC_MAX <= METRIC_SLOTS, "sluice_metrics too small");

/*
 * sluice_udp_stick_v1 (LRU): struct sock_udp_stick_key -> struct
 * sock_udp_stick. Keeps an unconnected UDP socket that sends to a VIP over
 * and over on the backend it got first (sendmsg4 is called per datagram):
 * per-socket stickiness, not Kubernetes sessionAffinity (which is per
 * client address, with a timeout). The entry is followed only while the
 * slot it was chosen from still names the backend id and that id still
 * names the same address and port: ids are reused (after a quarantine) for
 * other backends, possibly of other services. Otherwise the socket selects
 * again.
 */
struct sock_udp_stick_key {
	__u64 cookie; /* bpf_get_socket_cookie() */
	__be32 vip;   /* network order */
	__be16 port;  /* network order */
	__u8 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

struct sock_udp_stick {
	__u32 backend_id; /* host order */
	__be32 addr;	  /* network order: the backend's address when chosen */
	__be16 port;	  /* network order: the backend's port when chosen */
	__u16 slot;	  /* host order: the slot (>= 1) it came from */
};

/*
 * sluice_session_affinity_v1 (LRU): struct lb4_affinity_key -> struct
 * lb4_affinity. Kubernetes sessionAffinity ClientIP: the backend a client
 * of a frontend flagged SVC_F_AFFINITY was last sent to, until the
 * frontend's timeout passes without a new connection of that client
 * (kube-proxy's per-endpoint "affinity" sets). Not sluice_udp_stick,
 * which keeps one unconnected UDP socket on its backend.
 *
 * A client is a network namespace on the socket path (its cookie: every
 * socket of a pod, or of the node, is one client) and a source address
 * per packet (as the packet arrived, before any source NAT). An entry is
 * followed only while the slot it was chosen from is within the master's
 * count and still names the backend id, and the id still names the
 * address and port it did (as sluice_udp_stick): a backend that left the
 * frontend ends the affinity to it at once. The agent deletes the entries
 * of backends that left, and moves those of backends that move to
 * another slot (sluice_aff_fix, bpf/ctgc.c).
 */
struct lb4_affinity_key {
	/* AFFINITY_CLIENT_NETNS: bpf_get_netns_cookie() (host order);
	 * AFFINITY_CLIENT_ADDR: the client's IPv4 address as a __be32
	 * (network order bytes in the low-addressed half), zero-extended
	 */
	__u64 client;
	/* the master key (slot 0) of the frontend's scope that served the
	 * client: a two-scope frontend keeps its scopes' clients apart
	 */
	struct lb4_key master;
	__u32 kind; /* host order: enum affinity_client */
};

/* lb4_affinity_key.kind */
enum affinity_client {
	AFFINITY_CLIENT_ADDR = 0,
	AFFINITY_CLIENT_NETNS = 1,
};

struct lb4_affinity {
	/*
	 * now_ns() (consts.h) from which on the entry is dead, compared
	 * signed; every new connection of the client moves it forward with
	 * compare-and-swap (never back: a CPU whose clock reading is older
	 * than another's refresh leaves it), as ct4_entry.expires.
	 */
	__u64 expires;
	__u32 backend_id; /* host order */
	__be32 addr;	  /* network order: the backend's address when chosen */
	__be16 port;	  /* network order: the backend's port when chosen */
	__u16 slot;	  /* host order: the slot (>= 1) it came from */
	__u32 pad;
};

/*
 * sluice_aff_fix_v1: struct affinity_fix_key -> __u32 slot (host
 * order). What the next sluice_aff_fix run does with the entries of
 * sluice_session_affinity of a frontend that name a backend: move them to
 * that slot, or delete them (0). backend_id 0 stands for every backend of
 * the frontend (deleted only). Written and emptied by the agent around the
 * run.
 */
struct affinity_fix_key {
	struct lb4_key master; /* a frontend's master key (slot 0, scope) */
	__u32 backend_id;      /* host order; 0: every backend */
};

/* The context of sluice_aff_fix (BPF_PROG_RUN): counts out. */
struct affinity_fix_args {
	__u64 moved;   /* out: entries moved to another slot */
	__u64 deleted; /* out: entries deleted */
};

/*
 * sluice_devices_v1: __u32 ifindex (host order) -> struct node_dev.
 * The devices the agent attached to (the node's external devices) that
 * have an IPv4 address or a flag. A backend whose route leaves through one
 * with an address is on another node: an external flow to it is
 * source-NATed to that address. A device without one (addr 0) is listed
 * only for its flags.
 */
struct node_dev {
	__be32 addr; /* network order: the node's address on the device, or 0 */
	__u32 flags; /* host order: enum node_dev_flags */
};

/* node_dev.flags */
enum node_dev_flags {
	/*
	 * No link-layer header (tun, wireguard, ipip): tc's packet starts at
	 * the IPv4 header.
	 */
	NODE_DEV_F_L3 = 1,
	/*
	 * The agent attached tc here: packets leaving through it come back
	 * through sluice_ingress, so a flow to a backend behind it may be
	 * source-NATed to this node (the reply is translated back).
	 */
	NODE_DEV_F_TC = 2,
	/*
	 * A port of another device (its master a bridge, a bond, a team,
	 * an OVS datapath; not a VRF, whose slave runs IP itself: devices.go,
	 * isPortMaster): what it takes in goes to its master, not to its
	 * own IP stack, and a frame to a MAC not its own (PACKET_OTHERHOST)
	 * may be to the master's, which takes it in. So tc answers such a
	 * frame here (icmp_link_answerable), where on any other device the
	 * kernel drops it before routing.
	 */
	NODE_DEV_F_PORT = 4,
	/*
	 * An overlay tunnel (vxlan, geneve, ipip, wireguard...: devices.go,
	 * isTunnel), through which another node's pods are routed. XDP
	 * sends nothing out of it (it has no ndo_xdp_xmit: a redirect
	 * there is dropped): such a packet goes to tc (xdp_fwd_ok).
	 */
	NODE_DEV_F_TUNNEL = 8,
	/*
	 * A tunnel the agent follows (devices.go, PinnedTunnelDevices): its
	 * default overlay listing at start or its tunnel watch attached it,
	 * not --devices nor a node address. BPF never reads it: it is the
	 * agent's record of why it attached the device, so that a restart
	 * keeps this one only.
	 */
	NODE_DEV_F_FOLLOWED = 16,
};

/*
 * sluice_service_ips_v1: __be32 address (network order) -> __u8 (1). The
 * addresses of ClusterIP frontends (kube-proxy nftables' cluster-ips):
 * a packet to one that no frontend serves is rejected. Written by the
 * agent's reconciler, an address only while a master at it exists.
 */

/*
 * sluice_node_cidrs_v1 (LPM trie): struct node_cidr_key -> __u8 (1). The
 * node's CIDRs by kind (--cluster-cidr, --service-cidr), written by the
 * agent at start. prefixlen counts the 32 bits of kind plus the CIDR's.
 */
struct node_cidr_key {
	__u32 prefixlen; /* host order: 32 + CIDR bits */
	__u32 kind;	 /* host order: enum node_cidr_kind */
	__be32 addr;	 /* network order */
};

/* node_cidr_key.kind */
enum node_cidr_kind {
	/* --cluster-cidr: what counts as a pod (an internal client) */
	NODE_CIDR_CLUSTER = 1,
	/* --service-cidr: unallocated addresses in it are dropped */
	NODE_CIDR_SERVICE = 2,
};

/*
 * sluice_src_ranges_v1 (LPM trie): struct src_range_key -> __u8 (1).
 * loadBalancerSourceRanges of a frontend with SVC_F_SRC_RANGES: a new or
 * unanswered flow's source matching no prefix is dropped. prefixlen: the
 * 64 bits of frontend (vip, port, proto, pad) plus the prefix's own bits.
 */
struct src_range_key {
	__u32 prefixlen; /* host order: 64 + prefix bits */
	__be32 vip;	 /* network order */
	__be16 port;	 /* network order */
	__u8 proto;	 /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
	__be32 saddr; /* network order: the allowed prefix */
};

/*
 * sluice_fragments_v1 (LRU): struct frag4_key -> struct frag4_ports.
 * The ports of the first fragment of a fragmented TCP/UDP datagram, under
 * the fields reassembly keys the datagram by, as the packet was on the
 * wire at the hook that saw it. Written and read by tc (frag.h).
 */
struct frag4_key {
	__be32 saddr; /* network order */
	__be32 daddr; /* network order */
	__be16 id;    /* network order: the IP identification */
	__u8 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

struct frag4_ports {
	__be16 sport; /* network order */
	__be16 dport; /* network order */
};

/*
 * sluice_svc_stats_v1 (per-CPU array): __u32 service id (host order, the
 * rev-NAT id of a frontend's scope) -> struct svc_stats. Per-Service
 * counters, written only with --service-metrics (svcstats.h). The agent
 * zeroes an id's slot when it allocates the id, so a reused id starts from
 * nothing, and sums the CPUs, and a two-scope frontend's two ids, at
 * scrape time.
 */
#define SVC_DROP_SLOTS 8

struct svc_stats {
	/* new flows: a backend selected for a flow's first packet (tc,
	 * XDP), or a socket's connect or sendmsg translated (sock)
	 */
	__u64 new_flows;
	/* packets to the frontend translated to a backend (tc, XDP) */
	__u64 packets;
	/* their bytes: the IPv4 total length, without link-layer headers */
	__u64 bytes;
	/* refused, by enum svc_drop_reason; room for SVC_DROP_SLOTS */
	__u64 drops[SVC_DROP_SLOTS];
};

/*
 * svc_stats.drops: why a packet or a connect to a frontend was refused.
 * Append new reasons before SVC_DROP_MAX, never renumber (pinned counters
 * outlive the agent). The agent labels each with its name lower-cased,
 * without SVC_DROP_, from the BTF.
 */
enum svc_drop_reason {
	/* rejected: the frontend has no endpoints (ICMP port unreachable,
	 * ECONNREFUSED)
	 */
	SVC_DROP_NO_ENDPOINTS = 0,
	/* dropped: no endpoint for this client on this node (a Local
	 * traffic policy: SVC_F_DROP_EMPTY; EHOSTUNREACH)
	 */
	SVC_DROP_NO_LOCAL_ENDPOINTS,
	/* dropped: source not in loadBalancerSourceRanges */
	SVC_DROP_SOURCE_RANGE,
	/* dropped: conntrack full, a reply tuple clash, no free SNAT port,
	 * or a source-NATed flow's port lost
	 */
	SVC_DROP_CONNTRACK,
	/* dropped: a backend vanished under the reader, a rewrite or route
	 * failed, a later fragment without its flow
	 */
	SVC_DROP_ERROR,
	SVC_DROP_MAX,
};

_Static_assert(SVC_DROP_MAX <= SVC_DROP_SLOTS, "svc_stats.drops too small");

/* Flags of a frontend's master entry (lb4_service.flags). */
enum svc_flags {
	/* NodePort, ExternalIP or LoadBalancer frontend */
	SVC_F_EXTERNAL = 1,
	/* externalTrafficPolicy Local: the client's address is kept */
	SVC_F_LOCAL = 2,
	/* check the source against sluice_src_ranges (default scope) */
	SVC_F_SRC_RANGES = 4,
	/* internal clients go to the LB_SCOPE_INTERNAL master (default scope) */
	SVC_F_TWO_SCOPES = 8,
	/* without backends, drop new flows instead of rejecting them */
	SVC_F_DROP_EMPTY = 16,
	/* sessionAffinity ClientIP: a client keeps its backend
	 * (sluice_session_affinity) for lb4_service.affinity_timeout seconds
	 * after its last new connection
	 */
	SVC_F_AFFINITY = 32,
	/* a retired frontend (count 0, with at most SVC_F_EXTERNAL besides):
	 * the agent removed it, but flows it translated may live on. A
	 * packet or socket that would start a flow treats it as absent
	 * (lookup_live_service, tc_ingress); one with a usable forward entry
	 * follows its flow (tc_ingress), as kube-proxy's conntrack keeps
	 * translating an established flow whose Service went. The agent
	 * deletes it after the TCP established timeout
	 * (pkg/reconciler/retired.go).
	 */
	SVC_F_RETIRED = 64,
};

/*
 * IPv6 (and dual stack). Each family has its own maps, as Cilium's: an
 * IPv4 packet never pays for IPv6's wider keys, and the IPv4 maps keep
 * their pinned layout. The service and backend id spaces are shared: a
 * service id (rev-NAT id) or backend id names one frontend or backend of
 * either family, in the map of its family (sluice_svc_stats_v1 is keyed
 * by the same ids for both). A frontend's backends are of its family.
 *
 * union v6addr is an address in network order; Go sees its first member,
 * 16 bytes; C reads it as four words. The lb6_* and *6 structs mirror
 * their IPv4 twins field by field; where a twin's value holds no address
 * (struct lb4_service) both families share it.
 */
union v6addr {
	__u8 addr[16]; /* network order */
	__be32 p[4];
};

/*
 * XDP's route cache (xdp.c): sluice_fib_v1, struct fib4_key -> struct
 * fib_hop, and sluice6_fib_v1, struct fib6_key -> struct fib_hop. The key
 * is what XDP asks bpf_fib_lookup (its answer depends on nothing else:
 * no mark, no ports, no TOS, no packet length); the value is the next hop
 * it answered, with when and in which generation of the node's routing
 * (fib_gen).
 */
struct fib4_key {
	__u32 ifindex; /* host order: the device the packet came in on */
	__be32 saddr;  /* network order */
	__be32 daddr;  /* network order */
};

struct fib6_key {
	__u32 ifindex; /* host order, as fib4_key.ifindex */
	union v6addr saddr;
	union v6addr daddr;
};

struct fib_hop {
	__u64 stamp;   /* now_ns() of the packet that looked it up */
	__u32 gen;     /* fib_gen when it was looked up */
	__u32 ifindex; /* host order: the egress device */
	__u8 smac[6];  /* the egress device's address */
	__u8 dmac[6];  /* the next hop's (resolved: only SUCCESS is kept) */
	__u8 pad[4];
};

/*
 * The rate limits of the ICMP errors tc sends (icmp.h, icmp_rl_allow),
 * the kernel's: sluice_icmp_peers_v1, struct icmp_rl_key -> struct
 * icmp_rl_peer, the per-destination token buckets (the kernel's
 * inet_peer), and sluice_icmp_global_v1, __u32 0 -> struct
 * icmp_rl_global, the node's (netns_ipv4.icmp_global_credit and _stamp).
 */
struct icmp_rl_key {
	__u8 family;	   /* 4 or 6 */
	__u8 pad[3];	   /* zero */
	union v6addr addr; /* network order; IPv4's in p[0], the rest zero */
};

struct icmp_rl_peer {
	__u64 tokens; /* ns of credit (inet_peer.rate_tokens, in jiffies) */
	__u64 last;   /* now_ns() of the last refill (inet_peer.rate_last) */
};

struct icmp_rl_global {
	__s64 credit; /* errors left; below 0 after a race, as the kernel's */
	__u64 stamp;  /* now_ns() of the last refill */
};

/*
 * sluice_icmp_limits_v1, __u32 0 -> struct icmp_rl_conf: the values of
 * the kernel's ICMP rate limit sysctls that the agent last read (pkg/
 * datapath icmprl.go), which the limits above follow. ratelimit_ns is
 * net.ipv4.icmp_ratelimit (ratelimit6_ns net.ipv6.icmp.ratelimit), the
 * tokens one error to a destination costs, 0: no per-destination limit;
 * ratemask the ICMP types limited (bit t: type t; net.ipv4.icmp_ratemask),
 * ratemask6 ICMPv6 types 0-31's bits of net.ipv6.icmp.ratemask;
 * msgs_per_sec and msgs_burst the node's bucket (net.ipv4.icmp_msgs_per_sec
 * and icmp_msgs_burst), both families'.
 */
struct icmp_rl_conf {
	__u64 ratelimit_ns;
	__u64 ratelimit6_ns;
	__u32 ratemask;
	__u32 ratemask6;
	__u32 msgs_per_sec;
	__u32 msgs_burst;
};

/* The metric reasons an explain_record keeps, in the order counted. */
#define EXPLAIN_REASONS 8

/* What a dry run found (explain_record.flags, explain.h). */
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
	/* A UDP socket's stickiness entry decided the backend (sock.c). */
	EXPLAIN_F_STICKY_HIT = 2048,
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

/*
 * sluice_expl6_v1: __u32 0 -> struct explain6_record, per CPU: the IPv6
 * addresses of an IPv6 dry run, whose explain_record (of the same run,
 * the same nonce) holds the rest, its address words zero. A record of
 * its own, so that explain_record keeps the layout older agents have.
 */
struct explain6_record {
	__u32 nonce[2];		/* as explain_record.nonce */
	union v6addr vip;	/* network order, as explain_record.vip */
	union v6addr be_addr;	/* network order, as explain_record.be_addr */
	union v6addr snat_addr; /* network order, as explain_record.snat_addr */
};

_Static_assert(sizeof(struct explain6_record) == 56, "explain6_record size");

/*
 * The record of sluice_sock_explain (sock.c, sluice_sockx_v1), the dry run
 * of the socket path: the connect (or sendmsg) it explains, and what the
 * socket path would do with it. Addresses and ports in network order, the
 * rest host order.
 */
struct sock_explain_ctx {
	__u64 netns_cookie; /* in: the client (affinity.h), its netns */
	__u64 sock_cookie;  /* in: an unconnected UDP socket's, or 0 */
	__be32 src;	    /* in: the socket's source address */
	__be32 vip;	    /* in: the destination */
	__be16 port;
	__u8 proto;
	__u8 sticky;	  /* in: sendmsg4 of an unconnected socket */
	__s32 err;	  /* out: 0, or the errno that refuses it */
	__u32 flags;	  /* out: enum explain_flags */
	__u32 svc_flags;  /* out: the frontend's default scope's */
	__u32 count;	  /* out: backends of the scope that served */
	__u32 rev_nat_id; /* out: the service id */
	__u32 backend_id; /* out: the backend (EXPLAIN_F_DNAT) */
	__be32 be_addr;
	__be16 be_port;
	__u16 slot;  /* out: the slot that named it */
	__u8 scope;  /* out: the scope that served (enum lb_scope) */
	__u8 reason; /* out: the metric reason it would count */
	__u8 v6;     /* in: an IPv6 socket (connect6, sendmsg6) */
	__u8 pad;
	/* An IPv6 socket's addresses (v6), network order; the IPv4 ones
	 * above are zero, unless the destination is IPv4-mapped: then the
	 * socket reaches the IPv4 service (sock.c), and they are its.
	 */
	union v6addr src6;     /* in: the socket's source address */
	union v6addr vip6;     /* in: the destination */
	union v6addr be_addr6; /* out: the backend (EXPLAIN_F_DNAT) */
};

_Static_assert(sizeof(struct sock_explain_ctx) == 112, "sock_explain_ctx size");

/*
 * IPv6 conntrack (the per-packet path's, tc.c), as IPv4's above and in
 * maps of its own: sluice6_conntrack_v1 (hash, established) and
 * sluice6_ct_new_v1 (LRU, half-open), struct ct6_key -> struct ct6_entry;
 * sluice6_ct_flush_v1, struct ct6_backend_key -> __u8 (1). The fields
 * are ct4_key's and ct4_entry's, by the same names (conntrack_fam.h is
 * written once for both), with union v6addr addresses; ct_gc_args counts
 * both families' entries.
 */
struct ct6_key {
	union v6addr saddr; /* network order */
	union v6addr daddr; /* network order */
	__be16 sport;	    /* network order */
	__be16 dport;	    /* network order */
	__u8 proto;	    /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 dir;	    /* enum ct_dir */
	__u16 pad;
};

struct ct6_entry {
	__u64 expires;	  /* as ct4_entry.expires */
	__u32 flags;	  /* enum ct_flags, set with atomic or */
	__u32 backend_id; /* host order */
	__u32 rev_nat_id; /* host order */
	__be16 nat_port;  /* network order */
	__be16 snat_port; /* network order, CT_F_SNAT */
	union v6addr
		nat_addr; /* network order: backend (fwd) or frontend (rev) */
	union v6addr snat_addr; /* network order, CT_F_SNAT */
};

struct ct6_backend_key {
	union v6addr addr; /* network order */
	__be16 port;	   /* network order */
	__u8 proto;	   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

_Static_assert(sizeof(struct ct6_key) == 40, "ct6_key size");
_Static_assert(sizeof(struct ct6_entry) == 56, "ct6_entry size");
_Static_assert(sizeof(struct ct6_backend_key) == 20, "ct6_backend_key size");

/*
 * sluice6_fragments_v1 (LRU): struct frag6_key -> struct frag4_ports. As
 * sluice_fragments_v1, for IPv6 datagrams: keyed by the fields reassembly
 * keys them by (the fragment header's identification); the value holds
 * no address and is shared.
 */
struct frag6_key {
	union v6addr saddr; /* network order */
	union v6addr daddr; /* network order */
	__be32 id;	    /* network order: the fragment header's */
	__u8 proto;	    /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad[3];
};

_Static_assert(sizeof(struct frag6_key) == 40, "frag6_key size");

/* sluice6_services_v2: struct lb6_key -> struct lb4_service (as IPv4); its
 * slots are in sluice6_slots_v1. */
struct lb6_key {
	union v6addr vip; /* network order */
	__be16 port;	  /* network order */
	__u8 proto;	  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 scope;	  /* enum lb_scope */
	__u16 slot;	  /* host order; always 0 (a master) */
	__u16 pad1;
};

/*
 * sluice6_backends_v2 (array): __u32 backend id (host order) -> struct
 * lb6_backend, as sluice_backends_v2 (absent without BE_F_PRESENT).
 */
struct lb6_backend {
	union v6addr addr; /* network order */
	__be16 port;	   /* network order */
	__u8 proto;	   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 flags;	   /* enum backend_flags */
};

/*
 * sluice6_rev_nat_v2 (array): __u32 service id (host order) -> struct
 * lb6_rev_nat, as sluice_rev_nat_v2 (absent without RN_F_PRESENT).
 */
struct lb6_rev_nat {
	union v6addr vip; /* network order */
	__be16 port;	  /* network order */
	__u8 proto;	  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 scope;	  /* enum lb_scope of the id's master */
	__u8 pad[3];
	__u8 flags; /* enum rev_nat_flags */
};

/*
 * sluice6_service_ips_v1: union v6addr (network order) -> __u8 (1). The
 * IPv6 addresses of ClusterIP frontends, as sluice_service_ips_v1.
 */

/*
 * sluice6_src_ranges_v1 (LPM trie): struct src_range6_key -> __u8 (1).
 * As sluice_src_ranges_v1: prefixlen counts the 160 bits of frontend
 * (vip, port, proto, pad) plus the prefix's own bits.
 */
struct src_range6_key {
	__u32 prefixlen;  /* host order: 160 + prefix bits */
	union v6addr vip; /* network order */
	__be16 port;	  /* network order */
	__u8 proto;	  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
	union v6addr saddr; /* network order: the allowed prefix */
};

/*
 * sluice6_node_cidrs_v1 (LPM trie): struct node_cidr6_key -> __u8 (1).
 * The node's IPv6 CIDRs by kind, as sluice_node_cidrs_v1: prefixlen
 * counts the 32 bits of kind plus the CIDR's.
 */
struct node_cidr6_key {
	__u32 prefixlen;   /* host order: 32 + CIDR bits */
	__u32 kind;	   /* host order: enum node_cidr_kind */
	union v6addr addr; /* network order */
};

/*
 * sluice6_devices_v1: __u32 ifindex (host order) -> union v6addr (network
 * order). The IPv6 address of each node device (sluice_devices_v1) that
 * has a global one: what an external IPv6 flow leaving through it is
 * source-NATed to, as node_dev.addr is for IPv4. The device's flags stay
 * in sluice_devices_v1, whose layout is left as it was.
 */

/*
 * sluice6_affinity_v1 (LRU): struct lb6_affinity_key -> struct
 * lb6_affinity. Session affinity of IPv6 frontends, as
 * sluice_session_affinity_v1. A client is a network namespace (its
 * cookie in the first 8 bytes of client, host order, the rest zero) or
 * an IPv6 source address.
 */
struct lb6_affinity_key {
	union v6addr client;
	struct lb6_key master; /* the master key of the scope that served */
	__u32 kind;	       /* host order: enum affinity_client */
};

struct lb6_affinity {
	__u64 expires;	   /* as lb4_affinity.expires */
	__u32 backend_id;  /* host order */
	__be16 port;	   /* network order: the backend's port when chosen */
	__u16 slot;	   /* host order: the slot (>= 1) it came from */
	union v6addr addr; /* network order: the backend's address */
};

/*
 * sluice6_aff_fix_v1: struct affinity_fix6_key -> __u32 slot (host
 * order), as sluice_aff_fix_v1.
 */
struct affinity_fix6_key {
	struct lb6_key master; /* a frontend's master key (slot 0, scope) */
	__u32 backend_id;      /* host order; 0: every backend */
};

/*
 * The IPv6 socket path (sock.c connect6/sendmsg6/recvmsg6/getpeername6),
 * as its IPv4 twins above. An IPv4-mapped destination (::ffff:a.b.c.d) of
 * a dual-stack socket is an IPv4 one: it uses the IPv4 maps.
 *
 * sluice6_sock_rev_v1 (LRU): struct sock6_rev_key -> struct
 * sock6_rev_entry, as sluice_sock_rev_v1.
 */
struct sock6_rev_key {
	__u64 cookie;	   /* bpf_get_socket_cookie() */
	union v6addr addr; /* network order: backend address */
	__be16 port;	   /* network order: backend port */
	__u16 pad1;
	__u32 pad2;
};

struct sock6_rev_entry {
	union v6addr vip; /* network order */
	__be16 port;	  /* network order */
	__u16 pad;
	__u32 rev_nat_id; /* host order */
};

/*
 * sluice6_udp_stick_v1 (LRU): struct sock6_udp_stick_key -> struct
 * sock6_udp_stick, as sluice_udp_stick_v1.
 */
struct sock6_udp_stick_key {
	__u64 cookie;	  /* bpf_get_socket_cookie() */
	union v6addr vip; /* network order */
	__be16 port;	  /* network order */
	__u8 proto;	  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad1;
	__u32 pad2;
};

struct sock6_udp_stick {
	__u32 backend_id;  /* host order */
	__be16 port;	   /* network order: the backend's port when chosen */
	__u16 slot;	   /* host order: the slot (>= 1) it came from */
	union v6addr addr; /* network order: the backend's address when chosen */
};

/*
 * BTF_EXPORT - put @type in the object's BTF although no map or global
 * names it, so that bpf2go -type can generate it for Go. The enums above
 * are stored in narrower fields or used as plain integers, which clang
 * does not describe in BTF. The pointer is placed in a section of its own,
 * which neither the kernel nor cilium/ebpf loads (in .bss it would make
 * every object create a map for it).
 */
#define BTF_EXPORT(type, name)          \
	const type *__btf_export_##name \
		__attribute__((used, section(".sluice.btf")))

BTF_EXPORT(enum ct_dir, ct_dir);
BTF_EXPORT(enum ct_flags, ct_flags);
BTF_EXPORT(struct ct_gc_args, ct_gc_args);
BTF_EXPORT(enum svc_flags, svc_flags);
BTF_EXPORT(enum backend_flags, backend_flags);
BTF_EXPORT(enum rev_nat_flags, rev_nat_flags);
BTF_EXPORT(enum lb_scope, lb_scope);
BTF_EXPORT(enum node_dev_flags, node_dev_flags);
BTF_EXPORT(enum affinity_client, affinity_client);
BTF_EXPORT(struct affinity_fix_args, affinity_fix_args);
BTF_EXPORT(enum node_cidr_kind, node_cidr_kind);
BTF_EXPORT(enum metric_reason, metric_reason);
BTF_EXPORT(enum svc_drop_reason, svc_drop_reason);
BTF_EXPORT(enum explain_flags, explain_flags);
BTF_EXPORT(struct sock_explain_ctx, sock_explain_ctx);

/* The layouts above are an ABI: a size change must be deliberate. */
_Static_assert(sizeof(struct lb4_key) == 12, "lb4_key size");
_Static_assert(sizeof(struct lb4_service) == 20, "lb4_service size");
_Static_assert(sizeof(struct lb4_backend) == 8, "lb4_backend size");
_Static_assert(sizeof(struct lb4_rev_nat) == 12, "lb4_rev_nat size");
_Static_assert(sizeof(struct ct4_key) == 16, "ct4_key size");
_Static_assert(sizeof(struct ct4_entry) == 32, "ct4_entry size");
_Static_assert(sizeof(struct ct_backend_key) == 8, "ct_backend_key size");
_Static_assert(sizeof(struct ct_gc_args) == 72, "ct_gc_args size");
_Static_assert(sizeof(struct ct_admit) == 16, "ct_admit size");
_Static_assert(sizeof(struct ct_admit_pcpu) == 16, "ct_admit_pcpu size");
_Static_assert(sizeof(struct sock_rev_key) == 16, "sock_rev_key size");
_Static_assert(sizeof(struct sock_rev_entry) == 12, "sock_rev_entry size");
_Static_assert(sizeof(struct sock_udp_stick_key) == 16,
	       "sock_udp_stick_key size");
_Static_assert(sizeof(struct sock_udp_stick) == 12, "sock_udp_stick size");
_Static_assert(sizeof(struct lb4_affinity_key) == 24, "lb4_affinity_key size");
_Static_assert(sizeof(struct lb4_affinity) == 24, "lb4_affinity size");
_Static_assert(sizeof(struct affinity_fix_key) == 16, "affinity_fix_key size");
_Static_assert(sizeof(struct affinity_fix_args) == 16,
	       "affinity_fix_args size");
_Static_assert(sizeof(struct node_dev) == 8, "node_dev size");
_Static_assert(sizeof(struct src_range_key) == 16, "src_range_key size");
_Static_assert(sizeof(struct node_cidr_key) == 12, "node_cidr_key size");
_Static_assert(sizeof(struct frag4_key) == 12, "frag4_key size");
_Static_assert(sizeof(struct frag4_ports) == 4, "frag4_ports size");
_Static_assert(sizeof(struct svc_stats) == 88, "svc_stats size");
_Static_assert(sizeof(union v6addr) == 16, "v6addr size");
_Static_assert(sizeof(struct lb6_key) == 24, "lb6_key size");
_Static_assert(sizeof(struct lb6_backend) == 20, "lb6_backend size");
_Static_assert(sizeof(struct lb6_rev_nat) == 24, "lb6_rev_nat size");
_Static_assert(sizeof(struct src_range6_key) == 40, "src_range6_key size");
_Static_assert(sizeof(struct node_cidr6_key) == 24, "node_cidr6_key size");
_Static_assert(sizeof(struct lb6_affinity_key) == 44, "lb6_affinity_key size");
_Static_assert(sizeof(struct lb6_affinity) == 32, "lb6_affinity size");
_Static_assert(sizeof(struct affinity_fix6_key) == 28,
	       "affinity_fix6_key size");
_Static_assert(sizeof(struct sock6_rev_key) == 32, "sock6_rev_key size");
_Static_assert(sizeof(struct sock6_rev_entry) == 24, "sock6_rev_entry size");
_Static_assert(sizeof(struct sock6_udp_stick_key) == 32,
	       "sock6_udp_stick_key size");
_Static_assert(sizeof(struct sock6_udp_stick) == 24, "sock6_udp_stick size");
_Static_assert(sizeof(struct fib4_key) == 12, "fib4_key size");
_Static_assert(sizeof(struct fib6_key) == 36, "fib6_key size");
_Static_assert(sizeof(struct fib_hop) == 32, "fib_hop size");
_Static_assert(sizeof(struct icmp_rl_key) == 20, "icmp_rl_key size");
_Static_assert(sizeof(struct icmp_rl_peer) == 16, "icmp_rl_peer size");
_Static_assert(sizeof(struct icmp_rl_global) == 16, "icmp_rl_global size");
_Static_assert(sizeof(struct icmp_rl_conf) == 32, "icmp_rl_conf size");

#endif /* SLUICE_STRUCTS_H */
