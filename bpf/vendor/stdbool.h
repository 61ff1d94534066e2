/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Sluice's own (see update.sh). The objects are built with -nostdinc, so
 * neither the C library's nor the compiler's headers are used.
 */
#ifndef SLUICE_STDBOOL_H
#define SLUICE_STDBOOL_H

#define bool  _Bool
#define true  1
#define false 0

#define __bool_true_false_are_defined 1

#endif /* SLUICE_STDBOOL_H */
