#!/usr/bin/env bash
# Re-vendor the kernel and libbpf headers the BPF programs are built with.
#
# The objects are compiled with -nostdinc -I bpf/vendor (pkg/datapath/gen.go),
# so these files, and nothing on the build host, decide what the BPF code
# sees: `make check-generate` gives the same bytes on any machine with the
# pinned clang.
#
# Where each file comes from:
#
#   bpf/bpf_helpers.h, bpf/bpf_helper_defs.h, bpf/bpf_endian.h
#       libbpf, https://github.com/libbpf/libbpf, tag $LIBBPF_VERSION, src/.
#   linux/*.h, linux/byteorder/little_endian.h, asm-generic/*.h
#       Linux $LINUX_VERSION UAPI headers as `make headers_install` writes
#       them (the same files Debian's linux-libc-dev ships), from the
#       kernel.org tarball. Only the headers bpf/ includes and what they
#       include in turn; add a file to UAPI_HEADERS when a new #include
#       needs it (the build fails with -nostdinc until you do).
#
# Sluice's own, not fetched (the script leaves them alone):
#
#   asm/types.h, asm/bitsperlong.h, asm/posix_types.h, asm/swab.h,
#   asm/byteorder.h
#       BPF has no arch directory in the UAPI: these select the generic
#       definitions and little-endian byte order (the objects are bpfel).
#   linux/if.h
#       IFNAMSIZ, all <linux/icmp.h> wants of it: the UAPI one includes the
#       C library's <sys/socket.h>.
#   stdbool.h, stddef.h
#       bool, NULL, offsetof and size_t, without the C library or the
#       compiler's own headers.
#   .clang-format
#       keeps the vendored files as upstream wrote them.
#
# Version history: libbpf v1.1.2 and Linux 6.1.192, the versions the objects
# were built against from the host (Debian 12's libbpf-dev and
# linux-libc-dev) before the headers were vendored, so vendoring changed
# no object.
#
# Usage: bpf/vendor/update.sh   (needs curl, tar, make and a C compiler for
# the kernel's headers_install; run from anywhere). Then `make generate`,
# and commit the headers and the regenerated objects together.
set -euo pipefail

LIBBPF_VERSION=v1.1.2
LINUX_VERSION=6.1.192

LIBBPF_HEADERS=(bpf_helpers.h bpf_helper_defs.h bpf_endian.h)
UAPI_HEADERS=(
	linux/bpf.h
	linux/bpf_common.h
	linux/byteorder/little_endian.h
	linux/const.h
	linux/icmp.h
	linux/icmpv6.h
	linux/if_ether.h
	linux/in.h
	linux/in6.h
	linux/ip.h
	linux/ipv6.h
	linux/libc-compat.h
	linux/pkt_cls.h
	linux/pkt_sched.h
	linux/posix_types.h
	linux/socket.h
	linux/stddef.h
	linux/swab.h
	linux/tcp.h
	linux/types.h
	linux/udp.h
	asm-generic/bitsperlong.h
	asm-generic/int-ll64.h
	asm-generic/posix_types.h
	asm-generic/types.h
)

here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "libbpf $LIBBPF_VERSION"
for h in "${LIBBPF_HEADERS[@]}"; do
	curl -fsSL -o "$here/bpf/$h" \
		"https://raw.githubusercontent.com/libbpf/libbpf/$LIBBPF_VERSION/src/$h"
done

echo "Linux $LINUX_VERSION UAPI"
curl -fsSL "https://cdn.kernel.org/pub/linux/kernel/v${LINUX_VERSION%%.*}.x/linux-$LINUX_VERSION.tar.xz" |
	tar -xJ -C "$tmp"
make -s -C "$tmp/linux-$LINUX_VERSION" headers_install INSTALL_HDR_PATH="$tmp/usr"
for h in "${UAPI_HEADERS[@]}"; do
	mkdir -p "$here/$(dirname "$h")"
	cp "$tmp/usr/include/$h" "$here/$h"
done
echo "done: now run 'make generate' and commit bpf/vendor with the objects"
