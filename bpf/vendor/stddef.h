/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Sluice's own (see update.sh), for a build with -nostdinc. */
#ifndef SLUICE_STDDEF_H
#define SLUICE_STDDEF_H

typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;

#define NULL		       ((void *)0)
#define offsetof(type, member) __builtin_offsetof(type, member)

#endif /* SLUICE_STDDEF_H */
