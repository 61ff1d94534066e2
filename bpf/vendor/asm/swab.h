/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Sluice's own (see update.sh): no arch-specific byte swaps (the x86 one
 * is inline assembly), so <linux/swab.h> uses its generic C versions.
 */
#ifndef SLUICE_ASM_SWAB_H
#define SLUICE_ASM_SWAB_H

#endif /* SLUICE_ASM_SWAB_H */
