/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Sluice's own (see update.sh): the generic definitions, for BPF. */
#ifndef SLUICE_ASM_POSIX_TYPES_H
#define SLUICE_ASM_POSIX_TYPES_H

#include <asm-generic/posix_types.h>

#endif /* SLUICE_ASM_POSIX_TYPES_H */
