package datapath

// What each part of the datapath needs of the kernel, and the probes that
// choose between variants where an older kernel can still be served.
//
//	part                                     needs                                 Linux
//	per-packet tc programs (tc.c)            clsact, bpf_redirect_neigh, ...       5.10
//	  attached through tcx links                                                   6.6 (clsact below)
//	conntrack GC program (ctgc.c, with tc)   BPF_PROG_TYPE_SYSCALL, for_each_elem  5.14
//	socket load balancing (sock.c)           cgroup getpeername4                   5.8
//	  refusing with ECONNREFUSED              bpf_set_retval in sock_addr hooks     6.1 (EPERM below)
//	ending connected UDP sockets             iter/udp + bpf_sock_destroy kfunc      6.5
//	  below that                              netlink SOCK_DESTROY                 CONFIG_INET_DIAG_DESTROY
//	XDP fast path (xdp.c)                    XDP links, bpf_fib_lookup             5.9
//	map fill without walking (mapcount.c)    iter/bpf_map + bpf_map_sum_elem_count 6.6
//	  below that                              the maps are walked                  any
//
// The minimum for the whole agent is the newest row of what the flags ask
// for (README's table): 5.14 for --socket-lb=false --xdp=off. CheckNode
// (prereq.go) probes exactly the objects Open will load, so a node is
// never refused for a part it does not use; the two optional features are
// probed here and reported by Datapath.Features. The probes are variables
// so that the tests can force the answer an older kernel gives.

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// Features is what the kernel offers beyond what the loaded parts need.
type Features struct {
	// SetRetval: the socket programs may set the errno of a refusal, so
	// a connect to a Service without endpoints fails with ECONNREFUSED
	// (Linux 6.1+); without it the refusal is EPERM.
	SetRetval bool
	// SockDestroy is how connected UDP sockets of removed backends are
	// ended (sockdestroy.go), SockDestroyNone if they cannot be.
	SockDestroy SockDestroyMethod
	// MapCount: the entries of the hash maps are the kernel's own count
	// (the bpf_map_sum_elem_count kfunc, Linux 6.6+, mapcount.go);
	// without it MapFill walks them.
	MapCount bool
}

// SockDestroyMethod is how sockets are ended.
type SockDestroyMethod string

const (
	// SockDestroyBPF: an iter/udp program calling bpf_sock_destroy
	// (Linux 6.5+).
	SockDestroyBPF SockDestroyMethod = "bpf"
	// SockDestroyNetlink: sock_diag's SOCK_DESTROY (a kernel built with
	// CONFIG_INET_DIAG_DESTROY).
	SockDestroyNetlink SockDestroyMethod = "netlink"
	// SockDestroyNone: neither; connected UDP sockets keep a removed
	// backend until the application reconnects.
	SockDestroyNone SockDestroyMethod = "none"
)

// haveSetRetval reports whether sock_addr programs may call
// bpf_set_retval.
var haveSetRetval = func() error {
	return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSetRetval)
}

// sockDestroyMethod probes how sockets can be ended here, once.
var sockDestroyMethod = sync.OnceValue(func() SockDestroyMethod {
	if haveSockDestroyKfunc() == nil {
		return SockDestroyBPF
	}
	if haveNetlinkDestroy() == nil {
		return SockDestroyNetlink
	}
	return SockDestroyNone
})

// haveSockDestroyKfunc reports whether the kernel has the bpf_sock_destroy
// kfunc (which came with socket iterators being allowed to call it).
func haveSockDestroyKfunc() error { return haveKfunc("bpf_sock_destroy") }

// haveMapCount reports whether the kernel has the bpf_map_sum_elem_count
// kfunc; a variable so that the tests can force the answer an older
// kernel gives.
var haveMapCount = func() error { return haveKfunc("bpf_map_sum_elem_count") }

// haveKfunc reports whether the kernel's BTF has the kfunc name.
func haveKfunc(name string) error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("kernel BTF: %w", err)
	}
	var fn *btf.Func
	if err := spec.TypeByName(name, &fn); err != nil {
		return fmt.Errorf("%w: kfunc %s: %w", ebpf.ErrNotSupported, name, err)
	}
	return nil
}

// haveNetlinkDestroy reports whether sock_diag can destroy a UDP socket:
// it destroys one of its own, connected to another of its own on the
// loopback device (as Cilium probes it).
func haveNetlinkDestroy() error {
	peer, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return err
	}
	defer func() { _ = peer.Close() }() // a probe's socket: nothing to lose
	c, err := net.DialUDP("udp4", nil, peer.LocalAddr().(*net.UDPAddr))
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // (destroyed by the probe, if it worked)
	local, remote := c.LocalAddr().(*net.UDPAddr), c.RemoteAddr().(*net.UDPAddr)
	err = netlinkDestroyUDP(udpSocketID{
		family: unix.AF_INET, src: local.AddrPort(), dst: remote.AddrPort(), cookie: noCookie,
	})
	if errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("%w: SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY): %w", ebpf.ErrNotSupported, err)
	}
	return err
}
