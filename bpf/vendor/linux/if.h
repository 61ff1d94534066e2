/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Sluice's own, in place of the UAPI <linux/if.h> (see update.sh), which
 * includes the C library's <sys/socket.h>. <linux/icmp.h> includes it only
 * for IFNAMSIZ.
 */
#ifndef _LINUX_IF_H
#define _LINUX_IF_H

#define IFNAMSIZ 16

#endif /* _LINUX_IF_H */
