/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * IPv4 fragments of TCP/UDP datagrams.
 *
 * Only the first fragment of a datagram carries its L4 header: the later
 * ones carry the IP header and a piece of payload, and nothing in them says
 * which flow they belong to. So, as Cilium's IPV4_FRAGMENTS map does, the
 * first fragment's ports are recorded in sluice_fragments under the fields
 * reassembly keys a datagram by (source, destination, IP id, protocol),
 * and each later fragment takes its ports from there. With them it meets
 * the same service, the same conntrack entries and so the same translation
 * of its addresses as its first; its L4 header, and the L4 checksum, which
 * covers the whole datagram, are in the first fragment, whose rewrite
 * fixes them.
 *
 *   C:5300 -> V:53, id 7, MF, off 0   (UDP header)  DNAT -> B:5353, record
 *   C      -> V,    id 7, MF, off 185 (payload)     ports of id 7: 5300,53
 *                                                   -> DNAT to B like it
 *
 * Every first fragment of a TCP/UDP datagram a program sees is recorded,
 * whether it is translated or not (that is decided later): a record is one
 * LRU entry, and fragmented traffic is rare. Records are keyed by the
 * packet as it is on the wire at the hook, so each hook that sees a
 * datagram under another tuple (after DNAT, say) records it under that
 * one, and finds it there for the later fragments.
 *
 * A later fragment that arrives before its first finds nothing: it is
 * passed untouched (counted as tc_fragment) and its datagram is lost, as
 * if a fragment had been dropped. Fragments of one datagram rarely overtake
 * each other (never through one queue).
 */
#ifndef SLUICE_FRAG_H
#define SLUICE_FRAG_H

#include "consts.h"
#include "maps.h"
#include "parse.h"
#include "explain.h"

static __always_inline void frag_key_of(struct frag4_key *key,
					const struct pkt4 *p)
{
	key->saddr = p->saddr;
	key->daddr = p->daddr;
	key->id = p->ip_id;
	key->proto = p->proto;
	key->pad = 0;
}

/*
 * frag_record - remember the ports of @p, the first fragment of a
 * datagram, for its later fragments. A failed update only costs those
 * fragments their translation.
 */
static __always_inline void frag_record(const struct pkt4 *p)
{
	struct frag4_key key;
	struct frag4_ports ports = {
		.sport = p->sport,
		.dport = p->dport,
	};

	if (explain_dry(p))
		return;
	frag_key_of(&key, p);
	bpf_map_update_elem(&sluice_fragments_v1, &key, &ports, BPF_ANY);
}

/*
 * frag_follow - give @p, a later fragment, the ports of its datagram's
 * first fragment. Returns false if that was not seen.
 */
static __always_inline bool frag_follow(struct pkt4 *p)
{
	struct frag4_key key;

	frag_key_of(&key, p);
	return frag_ports_take(bpf_map_lookup_elem(&sluice_fragments_v1, &key),
			       &p->sport, &p->dport);
}

#endif /* SLUICE_FRAG_H */
