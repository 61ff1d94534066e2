package harness

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// The benchmark's network: for each mode a triple of network namespaces,
// client -> node -> backend, joined by veth pairs, with addresses only
// inside them (see package rules for the plan). Each mode gets its own
// triple, in a topology of its own, so its ruleset, conntrack table and
// agent never meet another mode's, and modes can be measured in turn
// without reprogramming. Closing the topology deletes the namespaces and
// everything in them (rules, routes, tc programs); a later run removes
// those of a run that was killed.

// Addresses inside every triple.
const (
	ClientAddr     = "10.64.1.2" // first client source address; more follow
	NodeClientAddr = "10.64.1.1"
	NodeBackAddr   = "10.64.2.1"
	BackendAddr    = "10.64.2.2"
	NodeClientDev  = "nc" // the node's client-facing veth
	NodeBackDev    = "nb"
	ClientDev      = "c0"
	BackendDev     = "b0"
	ClientSources  = 8 // client source addresses 10.64.1.2 .. 10.64.1.9
)

// ClientSourceAddrs are the client namespace's source addresses.
func ClientSourceAddrs() []string {
	var out []string
	for i := 0; i < ClientSources; i++ {
		out = append(out, fmt.Sprintf("10.64.1.%d", 2+i))
	}
	return out
}

// triple is one mode's client, node and backend namespaces.
type triple struct {
	topo                  *topology.Topology
	Client, Node, Backend *topology.NS
}

// newTriple creates the triple for a mode.
func newTriple(ctx context.Context, mode string) (*triple, error) {
	topo, err := topology.New()
	if err != nil {
		return nil, err
	}
	t := &triple{topo: topo}
	if err := t.setup(ctx, mode); err != nil {
		t.close()
		return nil, fmt.Errorf("topology %s: %w", mode, err)
	}
	return t, nil
}

func (t *triple) setup(ctx context.Context, mode string) error {
	var err error
	for _, ns := range []struct {
		p    **topology.NS
		name string
	}{{&t.Client, mode + "-c"}, {&t.Node, mode + "-n"}, {&t.Backend, mode + "-b"}} {
		if *ns.p, err = t.topo.AddNS(ns.name); err != nil {
			return err
		}
	}
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	steps := []func() error{
		func() error { return t.topo.Veth(t.Node, NodeClientDev, t.Client, ClientDev) },
		func() error { return t.topo.Veth(t.Node, NodeBackDev, t.Backend, BackendDev) },
	}
	for _, a := range ClientSourceAddrs() {
		steps = append(steps, func() error { return t.Client.AddAddr(ClientDev, pfx(a+"/24")) })
	}
	steps = append(steps,
		func() error { return t.Node.AddAddr(NodeClientDev, pfx(NodeClientAddr+"/24")) },
		func() error { return t.Node.AddAddr(NodeBackDev, pfx(NodeBackAddr+"/24")) },
		func() error { return t.Node.AddRoute(pfx("10.80.0.0/12"), addr(BackendAddr)) },
		// Node-local clients need a route to the service CIDR before their
		// OUTPUT DNAT runs (a real node has a default route). Only locally
		// generated traffic (iif lo) gets it: forwarded traffic to a VIP no
		// rule matches still fails at once with "net unreachable", which
		// keeps the programming-time probes sharp.
		func() error {
			return t.Node.Run(ctx, "ip", "route", "add", "10.32.0.0/16", "via", BackendAddr, "table", "100")
		},
		func() error { return t.Node.Run(ctx, "ip", "rule", "add", "iif", "lo", "lookup", "100", "pref", "100") },
		func() error { return t.Client.AddRoute(pfx("0.0.0.0/0"), addr(NodeClientAddr)) },
		func() error { return t.Backend.AddAddr(BackendDev, pfx(BackendAddr+"/24")) },
		func() error { return t.Backend.AddRoute(pfx("0.0.0.0/0"), addr(NodeBackAddr)) },
		// Every backend address is local to the backend namespace, so one
		// listener on 0.0.0.0 answers for all of them.
		func() error { return t.Backend.Run(ctx, "ip", "route", "add", "local", "10.80.0.0/12", "dev", "lo") },
	)
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	for _, s := range []struct {
		ns   *topology.NS
		k, v string
	}{
		{t.Node, "net.ipv4.ip_forward", "1"},
		{t.Node, "net.ipv4.ip_local_port_range", "1024 65535"},
		{t.Node, "net.ipv4.tcp_tw_reuse", "1"},
		{t.Client, "net.ipv4.ip_local_port_range", "1024 65535"},
		{t.Client, "net.ipv4.tcp_tw_reuse", "1"},
		{t.Backend, "net.core.somaxconn", "4096"},
		{t.Backend, "net.ipv4.tcp_max_syn_backlog", "4096"},
	} {
		if err := s.ns.Sysctl(s.k, s.v); err != nil {
			return err
		}
	}
	return nil
}

// conntrackSysctls sizes the node's conntrack for connection churn. They
// exist only once conntrack is in use in the namespace, so call it after
// the rules are loaded; missing keys are skipped and reported.
func (t *triple) conntrackSysctls() []string {
	var set []string
	for _, kv := range [][2]string{
		{"net.netfilter.nf_conntrack_tcp_timeout_time_wait", "10"},
		{"net.netfilter.nf_conntrack_tcp_timeout_close_wait", "10"},
		{"net.netfilter.nf_conntrack_tcp_timeout_fin_wait", "10"},
	} {
		if err := t.Node.Sysctl(kv[0], kv[1]); err == nil {
			set = append(set, kv[0]+"="+kv[1])
		}
	}
	return set
}

// close deletes the triple's namespaces, after stopping what the topology
// started in them.
func (t *triple) close() { _ = t.topo.Close() }
