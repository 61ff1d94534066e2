/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-Service counters (--service-metrics): new flows, packets, bytes and
 * refusals by reason of each frontend, in sluice_svc_stats_v1 under the
 * rev-NAT id of the frontend's scope that served the client. The agent
 * sums the CPUs and the scopes of a frontend at scrape time, and names
 * them after the Service (pkg/metrics service.go).
 *
 * What each path counts (the README says the same to operators):
 *   - tc ingress: every packet to a frontend translated to a backend, the
 *     first of a flow also as a new flow; refusals by reason. Replies are
 *     not counted (they carry the backend's address, not the frontend's).
 *   - XDP: the same for the external flows it forwards itself; what it
 *     passes on is counted by tc.
 *   - sock: connect() and sendmsg() translations as new flows (an
 *     unconnected UDP socket's every datagram is one), and refusals. The
 *     packets of a socket-balanced connection never carry the frontend's
 *     address, so they are not counted as the frontend's packets.
 *
 * Every write goes through svc_count, so that whatever must hold for all
 * of them (the constant that turns them off) is said once.
 */
#ifndef SLUICE_SVCSTATS_H
#define SLUICE_SVCSTATS_H

#include "config.h"
#include "maps.h"

/*
 * What svc_count counts. Values below SVC_DROP_SLOTS are enum
 * svc_drop_reason: a refusal of that reason. A new flow's first packet is
 * counted twice, as a flow where its backend is selected and as a packet
 * where it is translated: one event per call site, with nothing carried
 * between them, since a value the programs carried along their paths
 * only for this would keep the verifier from merging those paths even
 * with the counting off (the tc program is near its complexity limit).
 */
enum svc_event {
	/* a new flow: a backend selected for it (or a socket's connect or
	 * sendmsg translated)
	 */
	SVC_EV_FLOW = SVC_DROP_SLOTS,
	/* a packet to the frontend translated to a backend */
	SVC_EV_PACKET,
};

/*
 * svc_count - count @event (enum svc_event, or an enum svc_drop_reason)
 * for service id @id; @bytes: the packet's IPv4 total length, for
 * SVC_EV_PACKET. Nothing without --service-metrics: the verifier
 * knows service_metrics and removes the rest as dead code, leaving the
 * read of the constant and a jump (tc: 79 of 5873 instructions over all
 * its paths, a few on any one packet's). An id beyond the
 * map (restored from an older agent's maps, say) is not counted.
 */
static __always_inline void svc_count(__u32 id, __u32 event, __u32 bytes)
{
	struct svc_stats *s;

	if (!service_metrics)
		return;
	s = bpf_map_lookup_elem(&sluice_svc_stats_v1, &id);
	if (!s)
		return;
	/* Per-CPU values: plain adds, no other CPU writes this copy. */
	if (event < SVC_DROP_SLOTS) {
		s->drops[event] += 1;
		return;
	}
	if (event == SVC_EV_FLOW) {
		s->new_flows += 1;
		return;
	}
	s->packets += 1;
	s->bytes += bytes;
}

#endif /* SLUICE_SVCSTATS_H */
