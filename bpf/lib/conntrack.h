/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-packet connection tracking for translated flows.
 *
 * A flow from client C to VIP V translated to backend B has two entries:
 * CT_FORWARD keyed <C -> V> naming B, so every packet of the flow goes to
 * the same backend; and CT_REVERSE keyed <B -> C> naming V, so replies get
 * V back as their source.
 *
 * Half-open and established. A new flow's entries go into sluice_conntrack,
 * a plain hash that nothing evicts, half-open (without CT_F_REPLIED, with
 * the short lifetime for TCP, ct_timeout_syn_ns), and its first reply
 * promotes them in place (ct_promote_here: CT_F_REPLIED set on both,
 * their expiries pushed forward; nothing inserted or deleted; a TCP
 * flow's promotion is in two steps, below). But only ct_half_open_max
 * half-open flows of a family may be there at once (ct_admit_room: a
 * quarter of the table by default); beyond, a new flow's entries go to
 * sluice_ct_new, an LRU, and its first reply (TCP: its assurance) moves
 * them to sluice_conntrack (ct_promote). So a flood of new flows (a SYN
 * flood, a scan, a burst of connections) takes at most that share of the
 * established table, whose half-open flows the GC reaps once their
 * lifetime is over, and beyond it evicts only half-open flows in the LRU,
 * never established ones.
 *
 * Answered is not established for TCP (netfilter's SYN_RECV): a TCP
 * flow's first reply (the SYN-ACK) sets CT_F_REPLIED with CT_F_AWAIT, in
 * place, in sluice_conntrack or in sluice_ct_new (ct_answer): its
 * replies are translated, but it keeps ct_timeout_syn_ns and its place
 * in the share until its client's first ACK after the reply (no SYN, FIN
 * or RST: ct_assure_due) assures it (CT_F_ASSURED, netfilter's
 * IPS_ASSURED, ct_assure): then it leaves the count, lives the
 * established lifetime, and one in sluice_ct_new moves to
 * sluice_conntrack (ct_assure_new, ct_promote). So a SYN flood from
 * spoofed sources whose endpoints answer every SYN, whose clients never
 * acknowledge, is bounded as an unanswered one: the share's flows in
 * sluice_conntrack, the rest in the LRU, each living the SYN timeout.
 * A UDP flow, which has no handshake, is established by its first reply
 * (moved from the LRU by ct_promote). An entry of an earlier release with
 * CT_F_REPLIED and without CT_F_AWAIT is established (ct_awaiting).
 * Sluice keeps no sequence numbers: an ACK is not judged by its window,
 * as netfilter's tcp_in_window judges the one that assures.
 *
 * The share is counted per CPU and folded into one word every
 * CT_ADMIT_BATCH flows (ct_admit_add), as the kernel's percpu_counter
 * does: the bound holds within CT_ADMIT_BATCH a CPU. A flow is counted
 * when its entries go in (ct_create) and taken off exactly once, by
 * whoever first sets CT_F_COUNTED on its forward entry: its assurance
 * (TCP, ct_assure, before CT_F_ASSURED), the promotion in place of a UDP
 * flow (with CT_F_REPLIED, in one atomic or), or the deleter that claimed
 * the entry of a flow ending half-open or unassured (ct_reap, ct_reap_now:
 * the GC, a flush, a superseding flow, ct_est_insert's reclaim), which
 * reads whether it still counts from the flags its or returned
 * (ct_counts). An entry that enters sluice_conntrack uncounted (promoted
 * from the LRU) carries the bit from its insert.
 *
 * The LRU is looked in only while it may hold something: a word per
 * family (ct_admit.new_live) that a program sets after it inserts into
 * sluice_ct_new (read first, written only if clear) and the agent's GC
 * clears, then sets again if the LRU still holds a key (an insert after
 * the clear sets it again itself; one before it is found). While it is
 * clear, no lookup goes to sluice_ct_new. When sluice_conntrack
 * is full, the flow stays in sluice_ct_new, marked established
 * (ct_overflow): it works, but is of the kind a flood may evict, and so
 * no established flow is ever pushed out to make room for it. A table
 * full of expired entries (closed flows in their close timeout, which
 * only the agent's GC deletes) then costs no refused connection, where
 * netfilter reclaims them on insert; the agent collects at once when it
 * sees the overflow counted. Only a port reservation (SNAT), which needs
 * the one table, is refused when it is full: the SYN is dropped and
 * counted.
 * A source-NATed flow's port reservation (its reply entry) lives in
 * sluice_conntrack from the start, since uniqueness of a port needs one
 * map, and an LRU must never evict it apart from its flow; its
 * CT_F_REPLIED flag says whether the flow is answered yet (CT_F_AWAIT and
 * CT_F_ASSURED, for TCP, whether established). Until then it counts in
 * the half-open share as a flow of ct_create's does: counted at its
 * insert (ct_create_snat, CT_F_ADMITTED on it) and taken off exactly
 * once, by whoever first sets CT_F_COUNTED on the reservation (not on
 * the forward entry, which may be in the LRU and evicted): its flow's
 * assurance (TCP, ct_assure) or promotion (UDP, ct_promote_snat, with
 * CT_F_REPLIED), or the deleter that claims it unanswered or unassured
 * (ct_reap, ct_reap_now: the GC, a flush, a
 * superseding flow, a TIME_WAIT take-over, ct_est_insert's reclaim, the
 * port given back). Beyond the share a new source-NATed flow is refused
 * (ct_snat_room: its SYN dropped, counted tc_snat_half_open_full), for
 * its reservation has no LRU to go to: so a flood to a source-NATed
 * frontend (SYN-ACKs never answered) takes at most that share of the
 * table too (in entries: a reservation is one, so twice ct_half_open_max
 * of them), and refuses only new source-NATed flows meanwhile; answered
 * by its endpoints and never acknowledged, as well.
 *
 * Expiry. An entry holds the absolute time it dies (expires), compared
 * signed with a clock reading: another CPU that refreshed the entry after
 * this program read the clock only moves it further away. Refreshes move
 * it forward only, by compare-and-swap and only by a second or more, which
 * also keeps CPUs from writing the shared cache line on every packet. A
 * dead entry counts as absent. It is deleted by whoever claims it first by
 * a compare-and-swap of the expiry it saw to CT_DEAD: the agent's GC
 * (sluice_ct_gc, which keeps the entries of a flow whose other entry is
 * alive), a new flow that needs the key, or a flush; so nobody ever
 * deletes an entry that was refreshed or re-created meanwhile. For that
 * the claimer must be the only one to delete the key, for its delete is
 * by key: entries are never overwritten, only inserted (BPF_NOEXIST), in
 * sluice_ct_new as in sluice_conntrack (ct_new_insert, ct_est_insert),
 * and an entry in the way, or a flow's own half-open entry on its
 * promotion, is claimed before it is deleted. An entry claimed by another
 * is left to it: the insert that meets one fails, and its packet waits
 * (a reply: CT_DEFERRED) or is dropped to be sent again; a promotion
 * whose own half-open forward entry another has claimed (the flow ended
 * or superseded) takes back what it inserted (ct_promote). Only the LRU's
 * evictions in sluice_ct_new delete without a claim. A promotion in place
 * needs no rule of its own: its refresh never stores on a claimed entry,
 * and one that finds its forward entry claimed after setting its flags
 * takes the reply for a stale one (the flow was ended or superseded).
 *
 * TCP close: a RST, or a FIN seen in both directions, marks both entries
 * of the flow closed (flags set atomically; only entries that point back
 * at each other are one flow); a closed entry lives ct_timeout_close_ns
 * after its last packet, and a new SYN on its tuple starts a new flow.
 * A source-NATed flow's closed by FINs (no RST mark, ct_snat_held) live
 * ct_timeout_snat_tw_ns instead, netfilter's TIME_WAIT (a RST's, as
 * netfilter's CLOSE, the close timeout): a backend that closed first holds <node:port -> backend> in
 * TIME_WAIT (60 s), and a new flow given that port meanwhile would have
 * its SYN answered by an ACK (a challenge ACK: its sequence is another
 * client's) that its client resets, the connect done only at the SYN's
 * retransmission, 1 s later. A port search that finds no free port takes
 * over a port held so once the flow has been closed ct_timeout_close_ns
 * (ct_snat_tw, ct_create_snat), as netfilter reuses a TIME_WAIT tuple
 * only when it must (nf_nat_used_tuple_harder).
 * A RST's mark is taken back, or made a challenged one, by what the two
 * sides send after it (ct_track_tcp).
 *
 * IPv6 flows are tracked the same way in maps of their own: the functions
 * below ct_lifetime are written once, in conntrack_fam.h, and built for
 * both families (family.h): ct_create over the IPv4 maps, ct_create6
 * over the IPv6 ones, and so on.
 */
#ifndef SLUICE_CONNTRACK_H
#define SLUICE_CONNTRACK_H

#include "consts.h"
#include "config.h"
#include "maps.h"
#include "metrics.h"
#include "lb.h"
#include "parse.h"
#include "explain.h"
#include "family.h"
#include "parse6.h"

#define CT_EST (&sluice_conntrack_v2)
#define CT_NEW (&sluice_ct_new_v1)

/* ct4_entry.expires of an entry claimed for deletion. */
#define CT_DEAD 0
/* Refreshes move an expiry by at least this much (or not at all). */
#define CT_REFRESH_NS NSEC_PER_SEC

/*
 * Whether a SNAT port search that finds every port tried held takes over
 * one a closed flow holds for the backend's TIME_WAIT (ct_create_snat):
 * with CT_SNAT_TAKE defined (tc.c). XDP, whose IPv6 call chain has no
 * stack to spare for it, leaves such a flow to tc, as every flow it finds
 * no port for; tc searches again and takes one over.
 */
#ifdef CT_SNAT_TAKE
#define CT_SNAT_TAKES 1
#else
#define CT_SNAT_TAKES 0
#endif

/* ct_create's result when the reply tuple belongs to another flow. */
#define CT_CLASH 1
/* ct_promote's result when the flow stays in sluice_ct_new (ct_overflow). */
#define CT_OVERFLOW 1
/*
 * ct_promote's (and ct_promote_snat's) result when a key it needs in
 * sluice_conntrack is held by a dead entry another deleter claimed and
 * has not deleted yet: the flow stays half-open this once, and its next
 * reply promotes it.
 */
#define CT_DEFERRED 2

#define READ_ONCE(x)	 (*(volatile typeof(x) *)&(x))
#define WRITE_ONCE(x, v) (*(volatile typeof(x) *)&(x) = (v))

/* The RST marks of a flow's entries, either way (ct_track_tcp). */
#define CT_F_RST_ANY (CT_F_RST_FWD | CT_F_RST_REV)
/* The challenged RST marks, either way (ct_track_tcp). */
#define CT_F_CHAL_ANY (CT_F_CHAL_FWD | CT_F_CHAL_REV)

static __always_inline bool ct_closed(__u32 flags)
{
	return (flags & CT_F_RST_ANY) ||
	       (flags & (CT_F_FIN_FWD | CT_F_FIN_REV)) ==
		       (CT_F_FIN_FWD | CT_F_FIN_REV);
}

/*
 * ct_tcp_sets - the mark a TCP packet with @tcp_flags, in direction @dir
 * (its entry's key's), sets on its flow (ct_track_tcp): its RST or FIN,
 * with its side; 0 if none.
 */
static __always_inline __u32 ct_tcp_sets(__u8 tcp_flags, __u8 dir)
{
	if (tcp_flags & TCP_FLAG_RST)
		return dir == CT_FORWARD ? CT_F_RST_FWD : CT_F_RST_REV;
	if (tcp_flags & TCP_FLAG_FIN)
		return dir == CT_FORWARD ? CT_F_FIN_FWD : CT_F_FIN_REV;
	return 0;
}

/*
 * ct_tcp_clears - the marks a TCP packet with @tcp_flags, in direction
 * @dir, takes back from its flow (ct_track_tcp): its own side's RST and
 * challenged RST (its sender is alive: the RST was not its own, or not
 * its last word), unless the packet is a RST or a SYN itself; 0 if none.
 */
static __always_inline __u32 ct_tcp_clears(__u8 tcp_flags, __u8 dir)
{
	if (tcp_flags & (TCP_FLAG_RST | TCP_FLAG_SYN))
		return 0;
	return dir == CT_FORWARD ? CT_F_RST_FWD | CT_F_CHAL_FWD :
				   CT_F_RST_REV | CT_F_CHAL_REV;
}

/*
 * ct_tcp_challenges - the other side's RST mark that a TCP packet with
 * @tcp_flags, in direction @dir, without payload if @bare, challenges
 * (ct_track_tcp: it becomes CT_F_CHAL_*): the packet is a bare ACK (no
 * SYN, FIN or RST, no payload), the shape of a challenge ACK; 0 if not.
 */
static __always_inline __u32 ct_tcp_challenges(__u8 tcp_flags, bool bare,
					       __u8 dir)
{
	if (!bare || (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_FIN |
				   TCP_FLAG_RST)) != TCP_FLAG_ACK)
		return 0;
	return dir == CT_FORWARD ? CT_F_RST_REV : CT_F_RST_FWD;
}

/*
 * ct_tcp_stray - whether a TCP packet with @tcp_flags, which has no
 * conntrack entry, cannot open a flow: netfilter's table from NONE
 * (nf_conntrack_proto_tcp.c, tcp_conntracks) opens one for a SYN (SYN
 * without ACK) or, by loose pickup, an ACK (without SYN or FIN), and
 * neither with RST; a RST, a FIN, a SYN-ACK or a packet with neither SYN
 * nor ACK is INVALID there: no entry, no NAT. tc drops it, counted
 * (METRIC_TC_TCP_STRAY), instead of sending it to a random backend (to a
 * frontend on a node address it passes it up: METRIC_TC_TCP_STRAY_UP),
 * and, to a port a ClusterIP does not serve, instead of answering it with
 * a port unreachable (lb4_no_service, lb6_no_service).
 */
static __always_inline bool ct_tcp_stray(__u8 tcp_flags)
{
	__u8 f = tcp_flags &
		 (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_FIN | TCP_FLAG_RST);

	return f != TCP_FLAG_SYN && f != TCP_FLAG_ACK;
}

/* ct_alive - whether an entry expiring at @expires is alive at @now. */
static __always_inline bool ct_alive(__u64 expires, __u64 now)
{
	return (__s64)(expires - now) > 0;
}

_Static_assert(CT_F_SNAT == 1, "ct_lifetime multiplies by the bit");

/*
 * ct_snat_held - CT_F_SNAT (1) if a closed TCP flow with @flags holds its
 * entries, and so its SNAT port, for the backend's TIME_WAIT
 * (ct_timeout_snat_tw_ns): source-NATed and closed by FINs, with no RST
 * mark; 0 if not. A RST leaves no TIME_WAIT on the backend, and netfilter
 * sends a RST to CLOSE (10 s): such a flow lives the close timeout.
 * Without a branch (CT_F_SNAT is bit 0).
 */
static __always_inline __u32 ct_snat_held(__u32 flags)
{
	return (flags & CT_F_SNAT) & !(flags & CT_F_RST_ANY);
}

/*
 * ct_awaiting - whether a TCP flow with @flags is answered but not
 * assured yet (CT_F_AWAIT without CT_F_ASSURED): netfilter's SYN_RECV.
 */
static __always_inline bool ct_awaiting(__u32 flags)
{
	return (flags & (CT_F_AWAIT | CT_F_ASSURED)) == CT_F_AWAIT;
}

/* ct_awaiting_bit - ct_awaiting in bit 0, computed without a branch. */
static __always_inline __u32 ct_awaiting_bit(__u32 flags)
{
	return (flags / CT_F_AWAIT) & ~(flags / CT_F_ASSURED) & 1;
}

/*
 * ct_tcp_settled - 1 if a TCP flow with @flags (not closed) lives the
 * established timeout: answered (CT_F_REPLIED) and not awaiting its
 * assurance (ct_awaiting), and not challenged (CT_F_CHAL_ANY); else 0.
 * Computed without a branch: ct_lifetime runs at every refresh, on every
 * path, and each branch there is one more for the verifier to walk.
 */
static __always_inline __u32 ct_tcp_settled(__u32 flags)
{
	return (flags / CT_F_REPLIED) & ~ct_awaiting_bit(flags) & 1 &
	       !(flags & CT_F_CHAL_ANY);
}

/*
 * ct_lifetime - how long an entry of @proto with @flags lives idle: a TCP
 * flow the established timeout once answered and assured (ct_assure) and
 * not challenged, ct_timeout_syn_ns before or while challenged
 * (ct_tcp_settled).
 */
static __always_inline __u64 ct_lifetime(__u8 proto, __u32 flags)
{
	if (proto != IPPROTO_TCP)
		return ct_timeout_udp_ns;
	/* Without a branch (ct_snat_held): one less for the verifier to
	 * walk at every refresh.
	 */
	if (ct_closed(flags))
		return ct_timeout_close_ns +
		       (__u64)ct_snat_held(flags) *
			       (ct_timeout_snat_tw_ns - ct_timeout_close_ns);
	return ct_timeout_syn_ns +
	       (__u64)ct_tcp_settled(flags) *
		       (ct_timeout_tcp_ns - ct_timeout_syn_ns);
}

/*
 * ct_counts - whether an entry of sluice_conntrack with @flags, in
 * direction @dir, holds a place in the half-open count (ct_uncount, the
 * GC's count): a forward entry not source-NATed whose flow is half-open
 * or answered but unassured (CT_F_AWAIT), unless CT_F_COUNTED says it was
 * taken off (or never counted: an earlier release's established entry
 * has CT_F_REPLIED without CT_F_AWAIT, and one before the share
 * existed without CT_F_COUNTED); or a port reservation counted
 * (CT_F_ADMITTED) and not taken off yet.
 */
static __always_inline bool ct_counts(__u8 dir, __u32 flags)
{
	if (dir != CT_FORWARD)
		return (flags & (CT_F_ADMITTED | CT_F_COUNTED)) ==
		       CT_F_ADMITTED;
	return !(flags & (CT_F_COUNTED | CT_F_SNAT)) &&
	       (!(flags & CT_F_REPLIED) || ct_awaiting(flags));
}

/*
 * ct_snat_tw - whether a live entry of @proto with @flags, expiring at
 * @expires, is a closed source-NATed TCP flow's in its TIME_WAIT
 * extension: closed for ct_timeout_close_ns or more (idle since), living
 * on only for the backend's TIME_WAIT (ct_lifetime). Its port may be
 * taken over by a new flow that finds no free one (ct_create_snat).
 */
static __always_inline bool ct_snat_tw(__u8 proto, __u32 flags, __u64 expires,
				       __u64 now)
{
	return proto == IPPROTO_TCP && ct_snat_held(flags) &&
	       ct_closed(flags) &&
	       (__s64)(expires - now) <=
		       (__s64)(ct_timeout_snat_tw_ns - ct_timeout_close_ns);
}

/* Folds of a CPU's part of the half-open count (ct_admit_add). */
#define CT_ADMIT_BATCH 64

/* ct_admit_word - the family @idx's struct ct_admit (0: IPv4, 1: IPv6). */
static __always_inline struct ct_admit *ct_admit_word(__u32 idx)
{
	return bpf_map_lookup_elem(&sluice_ct_admit_v1,
				   (const void *)&ct_admit_keys[idx]);
}

/* ct_admit_part - this CPU's part of the family @idx's count. */
static __always_inline struct ct_admit_pcpu *ct_admit_part(__u32 idx)
{
	return bpf_map_lookup_elem(&sluice_ct_pcpu_v1,
				   (const void *)&ct_admit_keys[idx]);
}

/*
 * ct_new_live_at - whether the family @idx's sluice_ct_new may hold an
 * entry (above): while not, its lookups are skipped.
 */
static __always_inline bool ct_new_live_at(__u32 idx)
{
	struct ct_admit *g = ct_admit_word(idx);

	return !g || READ_ONCE(g->new_live);
}

/*
 * ct_new_inserted - note an insert into the family @idx's sluice_ct_new:
 * set its new_live word if clear. The per-CPU count's atomic add orders
 * the insert before the word's read (a locked instruction), so that the
 * GC, which clears the word and then looks for a key, finds the insert or
 * has its clear seen here.
 */
static __always_inline void ct_new_inserted(__u32 idx)
{
	struct ct_admit_pcpu *pc = ct_admit_part(idx);
	struct ct_admit *g = ct_admit_word(idx);

	if (pc)
		__sync_fetch_and_add(&pc->new_inserts, 1);
	if (g && !READ_ONCE(g->new_live))
		WRITE_ONCE(g->new_live, 1);
}

/*
 * ct_admit_add - add @d (+1 a flow admitted, -1 a flow taken off) to the
 * family @idx's count of half-open flows in sluice_conntrack: to this
 * CPU's part, which is moved into the shared word once it reaches
 * CT_ADMIT_BATCH either way (so the shared line is written once in 64
 * flows a CPU). Atomic adds, so that a program that interrupts another on
 * this CPU, or the agent's GC, loses nothing; each move subtracts what it
 * adds, so the parts and the word always sum to the count. A function of
 * its own (a BPF-to-BPF call; it needs no stack, its keys are constants):
 * inlined at every delete that may end a counted flow, it took XDP's
 * reply path 16 bytes over the combined stack limit.
 */
static __noinline void ct_admit_add(__u32 idx, __s64 d)
{
	struct ct_admit_pcpu *pc = ct_admit_part(idx);
	struct ct_admit *g;
	__s64 v;

	if (!pc)
		return;
	v = __sync_fetch_and_add(&pc->pending, d) + d;
	if (v < CT_ADMIT_BATCH && v > -CT_ADMIT_BATCH)
		return;
	g = ct_admit_word(idx);
	if (!g)
		return;
	__sync_fetch_and_add(&pc->pending, -v);
	__sync_fetch_and_add(&g->pending, v);
}

/*
 * ct_admit_paused - set while an agent's start migrates sluice_conntrack
 * to a new map and not sluice_ct_new (pkg/datapath, migrate.go:
 * pauseShare): the previous agent's programs, still on some hooks, use
 * the old sluice_conntrack, so a half-open flow this load's programs put
 * in the new one would be missed by them (a reply at an old egress left
 * untranslated). Meanwhile new flows go to sluice_ct_new, which both
 * share then, as before the share existed (a source-NATed flow's port
 * reservation, which needs this table, excepted: the migration shim in
 * front of an old program copies it into the old table when the flow's
 * reply comes, migrate_fam.h's mig_copy_back). A mutable global
 * (.data), each object that creates flows its own (tc.c, xdp.c); the
 * agent sets the tc object's before it loads and clears it once every
 * hook runs the new programs.
 */
extern volatile __u8 ct_admit_paused;

/*
 * ct_admit_room - whether a new flow of the family @idx may go into its
 * sluice_conntrack half-open: fewer than ct_half_open_max are there, as
 * the shared word and this CPU's part say (the other CPUs' parts, within
 * CT_ADMIT_BATCH each, are not seen), and no migration pauses the share.
 */
static __always_inline bool ct_admit_room(__u32 idx)
{
	struct ct_admit_pcpu *pc;
	struct ct_admit *g;

	if (!ct_half_open_max || ct_admit_paused)
		return false;
	pc = ct_admit_part(idx);
	g = ct_admit_word(idx);
	if (!pc || !g)
		return false;
	return READ_ONCE(g->pending) + READ_ONCE(pc->pending) <
	       (__s64)ct_half_open_max;
}

/*
 * ct_snat_room - whether a new source-NATed flow of the family @idx may
 * reserve a port (ct_create_snat): its reservation, which only
 * sluice_conntrack may hold, counts in the half-open share as a flow of
 * ct_create's does, and beyond the share the flow is refused
 * (METRIC_TC_SNAT_HALF_OPEN_FULL), where ct_create's goes to the LRU.
 * A reservation is one entry where ct_create's flow is two: reservations
 * are admitted while the count is below twice ct_half_open_max, so that
 * a flood of them holds the share's entries and no more, and a flood of
 * other flows, which stops at ct_half_open_max (ct_admit_room), leaves
 * room for as many reservations (it refused every one before:
 * TestHalfOpenFloodLeavesRoomForReservations). Half-open entries in
 * sluice_conntrack stay within 3 x ct_half_open_max (plus the batch).
 * Read as ct_admit_room, but a migration's pause does not refuse it (its
 * reservation goes into the new table then too: migrate_fam.h,
 * mig_copy_back), nor does a share of none (ct_half_open_max 0: every
 * other new flow in the LRU), which leaves reservations unbounded, as
 * before the share counted them.
 */
static __always_inline bool ct_snat_room(__u32 idx)
{
	struct ct_admit_pcpu *pc;
	struct ct_admit *g;

	if (!ct_half_open_max)
		return true;
	pc = ct_admit_part(idx);
	g = ct_admit_word(idx);
	if (!pc || !g)
		return true;
	return READ_ONCE(g->pending) + READ_ONCE(pc->pending) <
	       2 * (__s64)ct_half_open_max;
}

/* The conntrack types and maps of each family, for conntrack_fam.h. */
#define ct_key_t_4   struct ct4_key
#define ct_key_t_6   struct ct6_key
#define ct_entry_t_4 struct ct4_entry
#define ct_entry_t_6 struct ct6_entry
#define ct_est_4     CT_EST
#define ct_est_6     (&sluice6_conntrack_v1)
#define ct_new_4     CT_NEW
#define ct_new_6     (&sluice6_ct_new_v1)

#define LB_FAMILY 4
#include "conntrack_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "conntrack_fam.h"
#undef LB_FAMILY

#endif /* SLUICE_CONNTRACK_H */
