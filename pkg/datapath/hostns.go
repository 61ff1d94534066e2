package datapath

// Socket load balancing for the host's network namespace only
// (--socket-lb-host-netns-only, Cilium's socketLB.hostNamespaceOnly).
//
// The socket programs run for every socket of the cgroup they are
// attached to, whatever its network namespace: with the cgroup2 root
// (the DaemonSet's), every pod's too. kube-proxy translates in the host's
// namespace only, after anything a pod does to its own traffic, and two
// kinds of pod depend on that: a service mesh's sidecar, whose iptables
// REDIRECT inside the pod must see the ClusterIP (istio/istio#27619), and
// a cluster nested in a pod (kind), whose own ClusterIPs (10.96.0.1) the
// outer cluster's Services would capture. With the option the forward
// hooks translate only sockets of the namespace Open runs in (the
// agent's, hostNetwork: the host's), by its cookie in the programs'
// host_netns_cookie (bpf/lib/socklb.h); a pod's connection then leaves it
// for the VIP, and tc translates it per packet where it runs.

import (
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// varHostNetnsCookie is the socket programs' constant for
// Config.SocketLBHostNetnsOnly: 0, every namespace's sockets.
const varHostNetnsCookie = "host_netns_cookie"

// NetnsCookie returns the cookie of the calling thread's network
// namespace, what bpf_get_netns_cookie gives the programs for a socket
// there (SO_NETNS_COOKIE, Linux 5.14): the socket path's client key
// (ExplainSocket) and the namespace it serves with
// --socket-lb-host-netns-only (configureHostNetns). A goroutine that
// has joined another namespace (setns) must keep its OS thread locked
// (runtime.LockOSThread) until it has the cookie: the Go scheduler may
// otherwise move it to a thread of another namespace in between.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("network namespace cookie: socket: %w", err)
	}
	defer func() { _ = unix.Close(fd) }() // read only: nothing to lose
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("network namespace cookie (SO_NETNS_COOKIE, Linux 5.14): %w", err)
	}
	return c, nil
}

// configureHostNetns sets the socket object's host_netns_cookie: with
// cfg.SocketLBHostNetnsOnly the cookie of the namespace the caller runs
// in, else 0.
func configureHostNetns(spec *ebpf.CollectionSpec, cfg Config) error {
	var cookie uint64
	if cfg.SocketLBHostNetnsOnly {
		c, err := NetnsCookie()
		if err != nil {
			return fmt.Errorf("socket load balancing for the host's network namespace only: %w", err)
		}
		cookie = c
	}
	vs, ok := spec.Variables[varHostNetnsCookie]
	if !ok {
		return fmt.Errorf("variable %s missing from the socket object", varHostNetnsCookie)
	}
	if err := vs.Set(cookie); err != nil {
		return fmt.Errorf("set %s: %w", varHostNetnsCookie, err)
	}
	return nil
}
