// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Conntrack garbage collection and flush, run by the agent
 * (BPF_PROG_TYPE_SYSCALL through BPF_PROG_RUN, see pkg/datapath).
 *
 * sluice_conntrack is a plain hash that nothing evicts: expired entries
 * stay until they are deleted here. Deciding in the kernel, next to the
 * entry, keeps the check and the delete together: an entry is deleted only
 * if a compare-and-swap of the expiry this pass saw to CT_DEAD succeeds
 * (ct_reap), so an entry the datapath refreshed or re-created meanwhile is
 * never lost, as it was when the agent listed expired keys and deleted
 * them later. An expired entry whose flow's other entry is still alive is
 * kept (above all a source-NATed flow's port reservation: deleting it
 * would free a port the flow still sends from).
 *
 * A collection also finds how many entries the half-open count
 * (conntrack.h, ct_admit) holds (ct_gc_counted); the agent compares them
 * with the count, and corrects a difference that lasts (ct_admit_fix).
 *
 * In flush mode the pass forgets the flows of the backends in
 * sluice_ct_flush, in both conntrack maps, in one pass for all of them.
 *
 * A run covers one family's maps (ct_gc_args.family): the IPv4 ones, or
 * the IPv6 ones (sluice6_conntrack_v1, sluice6_ct_new_v1,
 * sluice6_ct_flush_v1), with the same code (ctgc_fam.h).
 *
 * sluice_aff_fix does the same kind of upkeep for session affinity
 * (lib/affinity.h): the entries of backends that left a frontend, or moved
 * to another of its slots, are deleted or moved in one pass;
 * sluice_aff_fix6 for IPv6 frontends.
 */
#include "lib/consts.h"
#include "lib/config.h"
#include "lib/maps.h"
#include "lib/conntrack.h"

/*
 * aff_fix_apply - apply the fixes in @fixes to the session affinity entry
 * under @key in @map: move it to the slot its backend now has (into
 * @slot_out), or delete it (the backend left the frontend, or the
 * frontend its affinity). @fk is the entry's fix key (its master and
 * backend id), whose backend id @fk_backend is cleared to look up the
 * fix of every backend.
 *
 * A move writes the slot in place: a reader that sees the new slot with
 * the old backend, or the other way round, finds them not to belong
 * together and selects again (affinity.h). A datapath that replaces the
 * entry meanwhile (a fresh selection) may lose its entry to a delete:
 * that client selects again once.
 */
static __always_inline long aff_fix_apply(void *fixes, void *fk,
					  __u32 *fk_backend, __u16 *slot_out,
					  void *map, const void *key,
					  struct affinity_fix_args *args)
{
	__u32 *slot = bpf_map_lookup_elem(fixes, fk);

	if (!slot) {
		*fk_backend = 0;
		slot = bpf_map_lookup_elem(fixes, fk);
		if (!slot)
			return 0;
	}
	if (*slot && *fk_backend) {
		*slot_out = (__u16)*slot;
		args->moved++;
		return 0;
	}
	if (!bpf_map_delete_elem(map, key))
		args->deleted++;
	return 0;
}

/*
 * ct_gc_args.flush: what a run of sluice_ct_gc does. (2 was CT_GC_GATE,
 * at an agent's start, which now holds the word instead: CT_GC_HOLD.)
 */
#define CT_GC_COLLECT 0 /* delete expired entries; set new_live */
#define CT_GC_FLUSH   1 /* forget the flows of sluice_ct_flush */
#define CT_GC_HOLD    3 /* only set new_live (an agent's start begins) */
#define CT_GC_HELD    4 /* as COLLECT, new_live left as it is */
#define CT_GC_ADJUST  5 /* add adjust to the half-open count (ct_admit_fix) */

static long ct_new_any(void *map, const void *key, void *val, __u32 *found)
{
	*found = 1;
	return 1; /* stop at the first */
}

/*
 * ct_new_gate - keep the family @idx's new_live word (conntrack.h) true to
 * its sluice_ct_new, @lru: clear it, then look for any key and set it
 * again if there is one. A program that inserts after the clear sets it
 * itself (ct_new_inserted), and an insert before the clear is found by the
 * look (the clear is an exchange, a full barrier, before it).
 */
static __always_inline void ct_new_gate(void *lru, __u32 idx)
{
	struct ct_admit *g = ct_admit_word(idx);
	__u32 found = 0;

	if (!g)
		return;
	__sync_lock_test_and_set(&g->new_live, 0);
	bpf_for_each_map_elem(lru, ct_new_any, &found, 0);
	if (found)
		WRITE_ONCE(g->new_live, 1);
}

/*
 * ct_new_hold - set the family @idx's new_live word, whatever its
 * sluice_ct_new holds: an agent's start does so before it attaches a
 * program, and its collections leave the word set (CT_GC_HELD) until the
 * start is committed. The previous release's programs, which fill the LRU
 * without the word, run until they are replaced device by device, and a
 * collection's clear while they do would hide their next insert from the
 * new programs (ct_new_gate finds only what is there when it looks).
 */
static __always_inline void ct_new_hold(__u32 idx)
{
	struct ct_admit *g = ct_admit_word(idx);

	if (g)
		WRITE_ONCE(g->new_live, 1);
}

/*
 * ct_admit_fix - add @d to the family @idx's shared count of half-open
 * flows (conntrack.h): the agent's correction of a drift it saw last two
 * collections (pkg/datapath, GCConntrack), a flow counted and never taken
 * off, or the other way round. An atomic add, as the programs' folds
 * (ct_admit_add): they write the word meanwhile, and a read, add and
 * write from the agent would lose theirs. Returns whether the word is
 * there.
 */
static __always_inline bool ct_admit_fix(__u32 idx, __s64 d)
{
	struct ct_admit *g = ct_admit_word(idx);

	if (!g)
		return false;
	__sync_fetch_and_add(&g->pending, d);
	return true;
}

/* The affinity fix sets of each family, for ctgc_fam.h. */
#define aff_fix_key_t_4 struct affinity_fix_key
#define aff_fix_key_t_6 struct affinity_fix6_key
#define aff_fix_map_4	sluice_aff_fix_v1
#define aff_fix_map_6	sluice6_aff_fix_v1

#define LB_FAMILY 4
#include "lib/ctgc_fam.h"
#undef LB_FAMILY
#define LB_FAMILY 6
#include "lib/ctgc_fam.h"
#undef LB_FAMILY

/* sluice_ct_gc - one pass over the conntrack maps of args->family. */
SEC("syscall")
int sluice_ct_gc(struct ct_gc_args *args)
{
	/*
	 * The time is the agent's reading of now_ns()'s clock: a syscall
	 * program may not call bpf_ktime_get_coarse_ns.
	 */
	struct ct_gc_args a = {
		.flush = args->flush,
		.family = args->family,
		.now = args->now,
		.adjust = args->adjust,
	};

	if (a.family == 6)
		ct_gc_run6(&a);
	else
		ct_gc_run(&a);
	*args = a;
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
