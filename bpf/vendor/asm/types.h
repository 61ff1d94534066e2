/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Sluice's own, not vendored (see update.sh): BPF has no arch directory in
 * the kernel's UAPI, so asm/ selects the generic definitions.
 */
#ifndef SLUICE_ASM_TYPES_H
#define SLUICE_ASM_TYPES_H

#include <asm-generic/types.h>

#endif /* SLUICE_ASM_TYPES_H */
