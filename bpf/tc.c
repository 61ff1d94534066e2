// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Per-packet ClusterIP load balancing at tc, for traffic the socket hooks
 * never saw (pods in other network namespaces, other hosts).
 *
 * Ingress: a reply of a translated flow (CT_REVERSE hit) gets its source
 * rewritten back to the VIP; a packet to a service is DNATed to a backend,
 * reusing the flow's conntrack entry when there is one; a packet to a
 * service without backends is answered with ICMP port unreachable.
 * Egress: replies leaving towards the client get their source rewritten
 * back to the VIP. Everything else passes untouched.
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/metrics.h"
#include "lib/parse.h"
#include "lib/csum.h"
#include "lib/lb.h"
#include "lib/conntrack.h"
#include "lib/icmp.h"

/*
 * parse_or_pass - parse @skb; returns true if it is a translatable packet,
 * counting the reason when it is not.
 */
static __always_inline bool parse_or_pass(struct __sk_buff *skb,
					  struct pkt4 *p)
{
	switch (parse_ipv4(skb, p)) {
	case PARSE_OK:
		return true;
	case PARSE_MALFORMED:
		metric_inc(METRIC_TC_MALFORMED);
		return false;
	case PARSE_FRAGMENT:
		metric_inc(METRIC_TC_FRAGMENT);
		return false;
	default:
		return false;
	}
}

/*
 * rev_nat - if @p is a reply of a translated flow, rewrite its source back
 * to the VIP. Returns a TC verdict, or -1 if @p is not such a reply.
 */
static __always_inline int rev_nat(struct __sk_buff *skb, const struct pkt4 *p,
				   __u64 now)
{
	struct ct4_key key = {};
	struct ct4_entry *e;

	ct_key_of(&key, p, CT_REVERSE);
	e = ct_lookup(&key, now);
	if (!e)
		return -1;
	if (rewrite_l4addr(skb, p, false, e->nat_addr, e->nat_port) < 0) {
		metric_inc(METRIC_TC_REWRITE_ERR);
		return TC_ACT_SHOT;
	}
	metric_inc(METRIC_TC_REV_NAT);
	return TC_ACT_OK;
}

/*
 * lb4_dnat - translate a packet to a service to one of its backends.
 * Returns a TC verdict.
 */
static __always_inline int lb4_dnat(struct __sk_buff *skb, const struct pkt4 *p,
				    __u64 now)
{
	struct lb4_service *svc;
	struct lb4_backend *be;
	struct ct4_key key = {};
	struct ct4_entry *fwd;
	__u32 backend_id = 0;
	__be32 nat_addr;
	__be16 nat_port;

	svc = lookup_service(p->daddr, p->dport, p->proto);
	if (!svc)
		return TC_ACT_OK;
	if (svc->count == 0) {
		int ret = reply_port_unreachable(skb, p);

		metric_inc(ret == TC_ACT_SHOT ? METRIC_TC_REWRITE_ERR :
						METRIC_TC_NO_BACKEND);
		return ret;
	}

	ct_key_of(&key, p, CT_FORWARD);
	fwd = ct_lookup(&key, now);
	if (fwd && p->proto == IPPROTO_UDP) {
		/* A UDP "flow" has no end: once its backend is gone (or its
		 * id reused for another address), re-balance it rather than
		 * send it into the void. TCP keeps its backend, as kube-proxy
		 * keeps established connections.
		 */
		be = lookup_backend(fwd->backend_id);
		if (!be || be->addr != fwd->nat_addr ||
		    be->port != fwd->nat_port)
			fwd = NULL;
	}

	if (fwd) {
		nat_addr = fwd->nat_addr;
		nat_port = fwd->nat_port;
		if (ct_refresh_reverse(p, fwd, now) < 0)
			metric_inc(METRIC_TC_CT_FULL);
		metric_inc(METRIC_TC_DNAT_CT);
	} else {
		be = select_backend(p->daddr, p->dport, p->proto, svc,
				    &backend_id);
		if (!be) {
			metric_inc(METRIC_TC_BACKEND_MISSING);
			return TC_ACT_SHOT;
		}
		nat_addr = be->addr;
		nat_port = be->port;
		if (ct_create(p, be, backend_id, svc->rev_nat_id, now) < 0)
			metric_inc(METRIC_TC_CT_FULL);
		metric_inc(METRIC_TC_DNAT_NEW);
	}

	if (rewrite_l4addr(skb, p, true, nat_addr, nat_port) < 0) {
		metric_inc(METRIC_TC_REWRITE_ERR);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

SEC("tc")
int sluice_ingress(struct __sk_buff *skb)
{
	struct pkt4 p = {};
	__u64 now;
	int ret;

	if (!parse_or_pass(skb, &p))
		return TC_ACT_OK;
	now = bpf_ktime_get_ns();
	ret = rev_nat(skb, &p, now);
	if (ret >= 0)
		return ret;
	return lb4_dnat(skb, &p, now);
}

SEC("tc")
int sluice_egress(struct __sk_buff *skb)
{
	struct pkt4 p = {};
	int ret;

	if (!parse_or_pass(skb, &p))
		return TC_ACT_OK;
	ret = rev_nat(skb, &p, bpf_ktime_get_ns());
	return ret >= 0 ? ret : TC_ACT_OK;
}

char __license[] SEC("license") = "Dual BSD/GPL";
