package main

// The health and metrics listeners, opened before anything else so that a
// taken port fails the start at once. kube-proxy listens on the same
// ports by default (10256 for /healthz on every address, 10249 for
// /metrics on the loopback address: 0.0.0.0 and 127.0.0.1, or [::] and
// [::1] when its bindAddress is IPv6), so on a node where it still runs,
// both as hostNetwork pods, Sluice's bind fails with EADDRINUSE and the
// agent exits: a crash loop whose usual cause the bare "address already
// in use" does not name. The error says it.

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// kubeProxyHint is added to an "address already in use" error of the
// health or metrics listener.
const kubeProxyHint = "is kube-proxy still running on this node? by default it listens on port 10256 of every address (0.0.0.0, or [::] with an IPv6 bindAddress) and 10249 of the loopback (127.0.0.1, or [::1]): remove its DaemonSet first (deploy/README.md, Moving an existing cluster off kube-proxy)"

// listenServer opens the TCP listener of the named server (health,
// metrics) on addr.
func listenServer(name, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err == nil {
		return l, nil
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("%s listener: %w (%s)", name, err, kubeProxyHint)
	}
	return nil, fmt.Errorf("%s listener: %w", name, err)
}
