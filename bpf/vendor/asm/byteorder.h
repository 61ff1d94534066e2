/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Sluice's own (see update.sh). The objects are built for bpfel only
 * (pkg/datapath/gen.go); this is what makes iphdr's ihl/version bitfields
 * come out in the right order.
 */
#ifndef SLUICE_ASM_BYTEORDER_H
#define SLUICE_ASM_BYTEORDER_H

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "bpf/vendor holds the little-endian byteorder header only: build for bpfel"
#endif
#include <linux/byteorder/little_endian.h>

#endif /* SLUICE_ASM_BYTEORDER_H */
