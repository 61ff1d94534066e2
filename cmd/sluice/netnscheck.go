package main

// The agent is meant to run in the node's network namespace (the
// DaemonSet's hostNetwork): the socket programs serve NodePorts on
// 127.0.0.1 only to sockets of the namespace the agent loaded them from
// (agent_netns_cookie, bpf/lib/socklb.h), --socket-lb-host-netns-only
// translates that namespace's sockets only, and tc attaches to that
// namespace's devices. Started in another one (a standalone run under
// `ip netns exec`, a unit with PrivateNetwork, a pod without hostNetwork),
// the node's own processes silently lose those.
//
// The check that can be made soundly: the agent's network namespace
// against that of PID 1 as /proc shows it. Where the agent shares the
// host's PID namespace (outside a container, hostPID), PID 1 is the
// host's init, in the node's network namespace; a difference then means
// the agent is not in it. (Reading PID 1's namespace needs
// CAP_SYS_PTRACE over it: root outside a container has it, the
// DaemonSet's container does not.) In a container of its own PID namespace (the
// DaemonSet, which is not hostPID), PID 1 is the container's first
// process, in the agent's own network namespace whatever it is: the
// check then finds nothing, and a DaemonSet without hostNetwork shows
// only as the node IP on no interface (watchNodePorts' warning; README,
// Limitations). A PID 1 whose namespace cannot be read (no permission)
// is no finding either.

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
)

// The network namespaces the check compares, variables for tests.
var (
	selfNetnsPath = "/proc/self/ns/net"
	initNetnsPath = "/proc/1/ns/net"
)

// outsideNetns reports whether the namespace files self and init name
// different namespaces.
func outsideNetns(self, init string) (bool, error) {
	a, err := os.Stat(self)
	if err != nil {
		return false, fmt.Errorf("the agent's network namespace: %w", err)
	}
	b, err := os.Stat(init)
	if err != nil {
		return false, fmt.Errorf("PID 1's network namespace: %w", err)
	}
	return !os.SameFile(a, b), nil
}

// coversLocalhost reports whether --nodeport-addresses (cidrs, after the
// primary keyword's expansion) serve NodePorts on 127.0.0.1
// (nodePortsFor: none given, the node's primary addresses only; an IPv4
// family that takes every address, or a CIDR holding it).
func coversLocalhost(cidrs []netip.Prefix) bool {
	lo := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	return len(cidrs) > 0 && (takesAll(cidrs, false) || slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(lo) }))
}

// warnOutsideInitNetns logs at Warn, naming what the node's processes
// lose, when the agent runs in another network namespace than PID 1
// (localhost: --localhost-nodeports; hostNetnsOnly:
// --socket-lb-host-netns-only with socket load balancing on), and
// reports whether it did. An unreadable namespace is logged at Debug.
// localhost: NodePorts are served on 127.0.0.1 (--localhost-nodeports,
// socket load balancing, --nodeport-addresses covering it).
func warnOutsideInitNetns(log *slog.Logger, localhost, hostNetnsOnly bool) bool {
	outside, err := outsideNetns(selfNetnsPath, initNetnsPath)
	if err != nil {
		log.Debug("network namespace check skipped", "err", err)
		return false
	}
	if !outside {
		return false
	}
	msg := "the agent runs in another network namespace than PID 1 (the node's, outside a container or with hostPID; the DaemonSet needs hostNetwork); if this namespace is not the node's, tc runs on its devices only"
	if localhost {
		msg += ", and NodePorts on 127.0.0.1 are served to this namespace's sockets only, not to the node's processes"
	}
	if hostNetnsOnly {
		msg += ", and --socket-lb-host-netns-only translates this namespace's sockets only, not the node's processes'"
	}
	log.Warn(msg, "netns", selfNetnsPath, "pid1_netns", initNetnsPath)
	return true
}
