/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Session affinity (Kubernetes sessionAffinity: ClientIP), shared by the
 * socket, tc and XDP paths.
 *
 * kube-proxy keeps, for each endpoint of a ClientIP Service port, a set of
 * client addresses that time out after the Service's timeoutSeconds. A new
 * connection from an address in an endpoint's set goes to that endpoint,
 * and every new connection puts its client in the set of the endpoint it
 * went to, restarting the timeout; packets of established connections
 * touch nothing (its rules only see a connection's first packet). Here a
 * frontend flagged SVC_F_AFFINITY keeps one entry per client in
 * sluice_session_affinity: a new connection takes the entry's backend if
 * the entry is alive and its backend is still one of the frontend's
 * (aff_select, before the random pick), and once the connection is sent,
 * the entry names the backend it went to and expires a timeout from now
 * (aff_remember). So the same client reaches the same backend until it
 * makes no new connection for the timeout, and a backend that leaves the
 * frontend ends the affinity to it at once (slot_still_names): the
 * client's next connection selects afresh among those left.
 *
 * A client is its address as the packet arrived (tc, XDP: before any
 * source NAT), or on the socket path its network namespace: every socket
 * of a pod (one address) or of the node (whose processes kube-proxy sees
 * under the node's address) is one client (Cilium does the same).
 *
 * Entries are per frontend (its master key, scope included), where
 * kube-proxy's sets are per Service port and shared by its ClusterIP,
 * NodePort, ExternalIP and LoadBalancer frontends: a client that reaches
 * one Service port through two of them may be sent to two backends.
 *
 * Expiry is absolute (now_ns(), consts.h), compared signed and moved
 * forward only, by compare-and-swap, as conntrack's (conntrack.h): a CPU
 * whose clock reading predates another CPU's refresh never takes the entry
 * for dead, nor moves it back.
 */
#ifndef SLUICE_AFFINITY_H
#define SLUICE_AFFINITY_H

#include "consts.h"
#include "maps.h"
#include "lb.h"

#ifndef READ_ONCE
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#endif

/* aff_alive - whether an entry expiring at @expires is alive at @now. */
static __always_inline bool aff_alive(__u64 expires, __u64 now)
{
	return (__s64)(expires - now) > 0;
}

/* aff_expiry - when an entry of frontend @svc refreshed at @now expires. */
static __always_inline __u64 aff_expiry(const struct lb4_service *svc,
					__u64 now)
{
	return now + (__u64)svc->affinity_timeout * NSEC_PER_SEC;
}

#define LB_FAMILY 4
#include "affinity_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "affinity_fam.h"
#undef LB_FAMILY

#endif /* SLUICE_AFFINITY_H */
