// Package model is Sluice's desired state: which service frontends exist and
// which backends each of them balances over. Sources (manifest files, the
// Kubernetes API) produce it; the reconciler turns it into map writes. It
// imports neither Kubernetes nor eBPF packages, so both sides can be tested
// on their own.
package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// Protocol is an IP protocol number as the datapath sees it.
type Protocol uint8

const (
	TCP Protocol = 6
	UDP Protocol = 17
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// L4Addr is an <address, port, protocol> tuple: a frontend or a backend.
type L4Addr struct {
	Addr  netip.Addr
	Port  uint16
	Proto Protocol
}

func (a L4Addr) String() string { return string(a.AppendTo(nil)) }

// AppendTo appends a as String spells it ("10.96.0.1:443/TCP"), for an
// encoder that would not allocate a string per address (the names file).
func (a L4Addr) AppendTo(b []byte) []byte {
	if !a.Addr.IsValid() {
		b = append(b, "invalid AddrPort"...) // netip.AddrPort's String
	} else {
		b = netip.AddrPortFrom(a.Addr, a.Port).AppendTo(b)
	}
	return append(append(b, '/'), a.Proto.String()...)
}

// Compare orders L4Addrs by address, port, then protocol: -1, 0 or +1,
// as cmp.Compare (for slices.SortFunc and slices.BinarySearchFunc).
func (a L4Addr) Compare(b L4Addr) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Port, b.Port); c != 0 {
		return c
	}
	return cmp.Compare(a.Proto, b.Proto)
}

// Less reports whether a sorts before b (see Compare).
func (a L4Addr) Less(b L4Addr) bool { return a.Compare(b) < 0 }

// ServicePortName names one port of a Service, as kube-proxy does.
type ServicePortName struct {
	Namespace string
	Name      string
	Port      string // the ServicePort's name; may be empty for a single-port Service
}

func (n ServicePortName) String() string { return string(n.AppendTo(nil)) }

// AppendTo appends n as String spells it ("ns/name:port", or "ns/name"
// for a port without a name).
func (n ServicePortName) AppendTo(b []byte) []byte {
	b = append(append(append(b, n.Namespace...), '/'), n.Name...)
	if n.Port != "" {
		b = append(append(b, ':'), n.Port...)
	}
	return b
}

// Compare orders n and m as their spellings (String) compare, byte by
// byte, without building them: an apply's failures are sorted so, and
// sorting thousands that way made two strings a comparison. The spelling
// is not the order of the fields ("a-b/x" before "a/x": '-' before '/').
func (n ServicePortName) Compare(m ServicePortName) int {
	if n.Namespace == m.Namespace && n.Name == m.Name {
		// One Service's ports: "ns/name" before "ns/name:port".
		if n.Port == "" || m.Port == "" {
			return cmp.Compare(len(n.Port), len(m.Port))
		}
		return strings.Compare(n.Port, m.Port)
	}
	a, b := n.spelled(), m.spelled()
	var i, j int
	x, y := a[0], b[0]
	for {
		for x == "" && i < len(a)-1 {
			i++
			x = a[i]
		}
		for y == "" && j < len(b)-1 {
			j++
			y = b[j]
		}
		switch {
		case x == "" && y == "":
			return 0
		case x == "":
			return -1
		case y == "":
			return 1
		}
		k := min(len(x), len(y))
		if c := strings.Compare(x[:k], y[:k]); c != 0 {
			return c
		}
		x, y = x[k:], y[k:]
	}
}

// spelled is n as String spells it, in parts.
func (n ServicePortName) spelled() [5]string {
	colon := ""
	if n.Port != "" {
		colon = ":"
	}
	return [5]string{n.Namespace, "/", n.Name, colon, n.Port}
}

// FrontendKind says how traffic reaches a frontend.
type FrontendKind uint8

const (
	ClusterIP FrontendKind = iota
	NodePort
	ExternalIP
	LoadBalancer
)

// Backend is one endpoint a frontend may send traffic to. It holds only
// what the datapath or the choice of backends needs (the node an endpoint
// runs on decides that choice in pkg/source/translate, and is not kept):
// the state holds one per endpoint and Service port, 240,000 at 30,000
// Services.
type Backend struct {
	L4Addr
	Terminating bool // serving but terminating: used only when no backend is ready
}

// Service is one frontend and the backends it balances over.
//
// Which backends a packet may reach depends on where it comes from, as
// kube-proxy's traffic policies say (pkg/source/translate holds the
// rules). Most frontends have one set, Backends. A frontend with
// TwoScopes has two: Backends for external clients, InternalBackends for
// cluster-internal ones (sources in the cluster CIDR, and the node itself
// through the socket path).
type Service struct {
	Name ServicePortName
	// The small fields are together, ahead of the frontend: one word for
	// all of them (each on its own would cost 24 bytes more a Service,
	// one per frontend).
	Kind FrontendKind
	// DropWhenEmpty makes an empty Backends drop new connections instead
	// of rejecting them: the Service has usable endpoints, but none for
	// this traffic here (internalTrafficPolicy Local on a node without a
	// local endpoint, for a ClusterIP; externalTrafficPolicy Local, for
	// external clients), or its loadBalancerSourceRanges admit no source.
	DropWhenEmpty bool
	// TwoScopes says InternalBackends is the set for internal clients
	// (externalTrafficPolicy Local: kube-proxy's short-circuit of traffic
	// from pods and from the node to all of the Service's endpoints).
	TwoScopes bool
	// North-south settings (NodePort, ExternalIP and LoadBalancer kinds).
	// ExternalLocal is externalTrafficPolicy: Local: Backends holds only
	// this node's endpoints and the client's source is preserved.
	// HealthCheckNodePort, if non-zero, is where this node reports
	// LocalReady, the addresses of the Service port's ready endpoints on
	// this node (terminating ones do not count, so that load balancers
	// drain a node whose endpoints terminate). These two are also on the
	// ClusterIP frontends of such a Service, ExternalLocal not (the
	// health server alone reads them; the datapath does not), so that
	// the port is served as kube-proxy serves it when the Service has no
	// north-south frontend (allocateLoadBalancerNodePorts false, an
	// ingress of hostnames or ipMode Proxy). SourceRanges, if any, are
	// the only sources allowed (loadBalancerSourceRanges).
	ExternalLocal       bool
	HealthCheckNodePort uint16

	Frontend L4Addr
	// Backends is sorted by L4Addr and holds no duplicates. Empty means the
	// service exists and refuses new connections: rejected (ICMP port
	// unreachable, ECONNREFUSED), or dropped if DropWhenEmpty.
	Backends []Backend
	// InternalBackends, with TwoScopes, is sorted and unique like
	// Backends; empty rejects.
	InternalBackends []Backend
	SourceRanges     []netip.Prefix
	LocalReady       []netip.Addr
	// Standby, of a UDP frontend, holds the Service port's serving
	// endpoints (of the frontend's family) that neither Backends nor
	// InternalBackends hold: serving and terminating ones while others
	// are ready, others' zones or nodes under topology hints, other
	// nodes' under a Local policy. No new flow reaches them, but the
	// flows they have keep them: kube-proxy's conntrack cleanup
	// (pkg/proxy/conntrack/cleanup.go) deletes a UDP flow only when its
	// endpoint is no longer serving. Sorted, unique; nil nearly always.
	Standby []L4Addr

	// AffinityTimeout is sessionAffinity ClientIP's timeout: a client
	// keeps reaching the backend it was last sent to until it opens no
	// new connection for this long. Zero means no session affinity.
	// Whole seconds, at most 86400 (the API's bounds).
	AffinityTimeout time.Duration
}

// State is the whole desired state, keyed by frontend.
type State struct {
	Services Services

	// Gen identifies a state made by NewGeneration's caller (0: none).
	// A state whose BaseGen is not 0 is the state of generation BaseGen
	// with only the frontends in Changed added, replaced or removed:
	// every other frontend maps to the very same *Service in both. A
	// consumer that applied generation BaseGen may look at Changed only,
	// so that one change among 30,000 Services costs what changed.
	Gen, BaseGen uint64
	Changed      []L4Addr

	// ServiceCIDRs are the cluster's service CIDRs, of both families,
	// sorted, masked and unique, when HasServiceCIDRs: a packet to an
	// address in them that no ClusterIP holds is dropped (kube-proxy
	// nftables' "drop traffic to unallocated ClusterIPs"). The Kubernetes
	// source sets them, from the ServiceCIDR objects and --service-cidr;
	// without HasServiceCIDRs (the manifest source) the datapath keeps
	// the CIDRs it was opened with (--service-cidr), and the reconciler
	// writes none. A state made by patching another carries them too:
	// they are not among Changed.
	ServiceCIDRs    []netip.Prefix
	HasServiceCIDRs bool
}

var generations atomic.Uint64

// NewGeneration returns a State generation number never returned before
// in this process (so states of different sources never share one).
func NewGeneration() uint64 { return generations.Add(1) }

// NewState returns an empty State.
func NewState() *State { return &State{} }

// SortBackends sorts backends by address and removes duplicates, keeping the
// first of each.
func SortBackends(bs []Backend) []Backend {
	sort.SliceStable(bs, func(i, j int) bool { return bs[i].L4Addr.Less(bs[j].L4Addr) })
	out := bs[:0]
	for i, b := range bs {
		if i > 0 && b.L4Addr == out[len(out)-1].L4Addr {
			continue
		}
		out = append(out, b)
	}
	return out
}

// Trigger is a change a source took, for the network programming latency
// (kube-proxy's network_programming_duration_seconds): when it happened
// (an EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time)
// and the IP family of the addresses it is about (the slice's
// addressType), the family whose series records it, as kube-proxy's
// proxier of that family does.
type Trigger struct {
	At   time.Time
	IPv6 bool
}

// NormalPrefix returns p in the one form CIDRs are kept and keyed in
// (the service and cluster CIDRs of the flags, the ServiceCIDR objects
// and the datapath's node CIDR maps): masked, an IPv4-mapped prefix as
// its IPv4 prefix. It refuses what is no IPv4 or IPv6 prefix: invalid
// (a netip.Prefix holds no zone), or IPv4-mapped and shorter than /96
// (no IPv4 prefix is that).
func NormalPrefix(p netip.Prefix) (netip.Prefix, error) {
	a := p.Addr()
	switch {
	case !p.IsValid():
		return p, fmt.Errorf("%s: not an IPv4 or IPv6 prefix", p)
	case a.Is4In6() && p.Bits() < 96:
		return p, fmt.Errorf("%s: an IPv4-mapped prefix shorter than /96", p)
	case a.Is4In6():
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}
