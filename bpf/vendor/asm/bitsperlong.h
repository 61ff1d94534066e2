/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Sluice's own (see update.sh): the generic definition, for BPF. */
#ifndef SLUICE_ASM_BITSPERLONG_H
#define SLUICE_ASM_BITSPERLONG_H

#include <asm-generic/bitsperlong.h>

#endif /* SLUICE_ASM_BITSPERLONG_H */
