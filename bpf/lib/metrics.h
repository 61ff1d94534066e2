/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Datapath outcome counters: one per-CPU __u64 per reason (enum
 * metric_reason in structs.h) in sluice_metrics. The agent sums the CPUs at
 * scrape time; programs never bpf_printk.
 */
#ifndef SLUICE_METRICS_H
#define SLUICE_METRICS_H

#include "maps.h"

static __always_inline void metric_inc(enum metric_reason reason)
{
	__u32 key = reason;
	__u64 *count = bpf_map_lookup_elem(&sluice_metrics_v1, &key);

	if (count)
		*count += 1;
}

#endif /* SLUICE_METRICS_H */
