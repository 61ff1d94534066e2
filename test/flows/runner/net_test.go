package runner

import (
	"context"
	"net/netip"
	"testing"
	"testing/fstest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/flows"
)

// networkCase places a local and a remote endpoint, a local sink, pod,
// remote pod, external, stand-in ("SNATted to LB") and node clients: the
// places TestNetwork sends between with no agent running.
const networkCase = `
node:
  name: test-node
  ips: [192.168.0.2]
  addresses: [192.168.0.2/24, 192.168.1.2/24, 192.168.99.11/24]
  clusterCIDR: 10.0.0.0/8
  serviceCIDR: 172.30.0.0/16
  nodePortAddresses: [192.168.0.2/32]
  localhostNodePorts: false
  masqueradeAll: false
cases:
- name: network
  derived: the runner's own check of its network (TestNetwork), with no agent
  placement: {10.180.0.1: local, 10.180.1.1: remote, 10.0.0.3: local, 10.0.5.2: remote}
  objects:
  - apiVersion: v1
    kind: Service
    metadata: {name: svc1, namespace: ns1}
    spec:
      type: LoadBalancer
      clusterIP: 172.30.0.41
      externalIPs: [192.168.99.22]
      ports:
      - {name: p80, port: 80, protocol: TCP, nodePort: 3001}
      - {name: dns, port: 53, protocol: UDP, nodePort: 3053}
    status:
      loadBalancer: {ingress: [{ip: 198.51.100.4}]}
  - apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata: {name: svc1-1, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
    addressType: IPv4
    endpoints:
    - {addresses: [10.180.0.1], nodeName: test-node}
    - {addresses: [10.180.1.1], nodeName: other-node}
    ports: [{name: p80, port: 80, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]
  flows:
  - {name: pod to a local pod, source: {kind: pod, ip: 10.0.0.2}, destination: {ip: 10.0.0.3, port: 80}, expect: {verdict: UNTOUCHED}}
  - {name: pod to the node, source: {kind: pod, ip: 10.0.0.2}, destination: {ip: 192.168.0.2, port: 3001}, expect: {verdict: UNTOUCHED}}
  - {name: pod to the node over UDP, source: {kind: pod, ip: 10.0.0.2}, protocol: UDP, destination: {ip: 192.168.1.2, port: 3053}, expect: {verdict: UNTOUCHED}}
  - {name: external to the node, source: {kind: external, ip: 203.0.113.2}, destination: {ip: 192.168.1.2, port: 3001}, expect: {verdict: UNTOUCHED}}
  - {name: external with a blackholed return path, source: {kind: external, ip: 203.0.113.9}, destination: {ip: 192.168.0.2, port: 3001}, expect: {verdict: UNTOUCHED}}
  - {name: stand-in to the node, source: {kind: external, ip: 198.51.100.4}, destination: {ip: 192.168.0.2, port: 3001}, expect: {verdict: UNTOUCHED}}
  - {name: remote pod to the node, source: {kind: remotePod, ip: 10.0.5.2}, destination: {ip: 192.168.0.2, port: 3001}, expect: {verdict: UNTOUCHED}}
  - {name: node to itself, source: {kind: node, ip: 192.168.0.2}, destination: {ip: 192.168.1.2, port: 3001}, expect: {verdict: UNTOUCHED}}
  - {name: localhost, source: {kind: localhost, ip: 127.0.0.1}, destination: {ip: 127.0.0.1, port: 3001}, expect: {verdict: UNTOUCHED}}
`

// TestNetwork checks the runner's network with no agent: every client
// reaches the places a flow may land, with its own address, and an
// untranslated packet to a frontend lands in the router's trap. What the
// runner then reports about Sluice is Sluice's doing.
func TestNetwork(t *testing.T) {
	testutil.Privileged(t)
	testutil.NeedCommands(t, "nsenter", "ip", "nft")
	corpus, err := flows.LoadFS(fstest.MapFS{"network.yaml": {Data: []byte(networkCase)}})
	if err != nil {
		t.Fatal(err)
	}
	c := corpus.Cases[0]
	r := newCaseRun(t, c)
	st := c.Steps[0]
	sinks, errs := r.startSinks(st)
	t.Cleanup(func() {
		for _, s := range sinks {
			s.Close()
		}
	})
	for k, err := range errs {
		if err != nil {
			t.Fatalf("sink %v: %v", k, err)
		}
	}
	// The other node drops what it sends to 203.0.113.9: a reply that
	// never comes back, as from an unmasqueraded remote endpoint.
	if err := r.net.other.Run(context.Background(), "ip", "route", "add", "blackhole", "203.0.113.9/32"); err != nil {
		t.Fatal(err)
	}

	// The corpus's own UNTOUCHED flows: the original destination sees
	// the original source.
	for _, f := range st.Flows {
		if f.Name == "external with a blackholed return path" {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			o := r.attempt(f, 2*time.Second)
			if p := (checker{c, f}).verdictOK(o); p != nil {
				t.Errorf("%s: %s", p.class, p.why)
			}
		})
	}

	flow := func(kind, src, proto, dst string, port uint16) *flows.Flow {
		return &flows.Flow{
			Name:        kind + " " + src + " to " + dst,
			Source:      flows.Source{Kind: kind, IP: netip.MustParseAddr(src)},
			Protocol:    corev1.Protocol(proto),
			Destination: flows.Destination{IP: netip.MustParseAddr(dst), Port: port},
		}
	}
	ep := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
	for _, x := range []struct {
		f    *flows.Flow
		want Observation
	}{
		// Pods, the node and external hosts reach the endpoints directly.
		{flow("pod", "10.0.0.2", "TCP", "10.180.1.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1:80"), Seen: netip.MustParseAddr("10.0.0.2")}},
		{flow("pod", "10.0.0.2", "UDP", "10.180.1.1", 53), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1:53"), Seen: netip.MustParseAddr("10.0.0.2")}},
		{flow("pod", "10.0.0.2", "TCP", "10.180.0.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.0.1:80"), Seen: netip.MustParseAddr("10.0.0.2")}},
		{flow("node", "192.168.0.2", "TCP", "10.180.0.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.0.1:80"), Seen: netip.MustParseAddr("192.168.0.2")}},
		{flow("node", "192.168.0.2", "UDP", "10.180.1.1", 53), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1:53"), Seen: netip.MustParseAddr("192.168.0.2")}},
		{flow("external", "203.0.113.2", "TCP", "10.180.1.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1:80"), Seen: netip.MustParseAddr("203.0.113.2")}},
		{flow("remotePod", "10.0.5.2", "TCP", "10.180.0.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.0.1:80"), Seen: netip.MustParseAddr("10.0.5.2")}},
		// A reply that never comes back: the SYN capture (TCP) and the
		// server's log (UDP) still say where the request went.
		{flow("external", "203.0.113.9", "TCP", "10.180.1.1", 80), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1:80"), Seen: netip.MustParseAddr("203.0.113.9"), ReplyLost: true}},
		{flow("external", "203.0.113.9", "UDP", "10.180.1.1", 53), Observation{Kind: Reached, Name: endpointName, Server: ep("10.180.1.1:53"), Seen: netip.MustParseAddr("203.0.113.9"), ReplyLost: true}},
		// Untranslated packets to frontends end in the router's trap,
		// from every kind of client, over TCP and UDP, to a ClusterIP, an
		// ExternalIP on the node's own subnet, and a LoadBalancer IP.
		{flow("pod", "10.0.0.2", "TCP", "172.30.0.41", 80), Observation{Kind: Leaked, Seen: netip.MustParseAddr("10.0.0.2")}},
		{flow("pod", "10.0.0.2", "UDP", "172.30.0.41", 53), Observation{Kind: Leaked, Seen: netip.MustParseAddr("10.0.0.2")}},
		{flow("pod", "10.0.0.2", "TCP", "172.30.9.9", 80), Observation{Kind: Leaked, Seen: netip.MustParseAddr("10.0.0.2")}},
		{flow("external", "203.0.113.2", "TCP", "172.30.0.41", 80), Observation{Kind: Leaked, Seen: netip.MustParseAddr("203.0.113.2")}},
		{flow("external", "203.0.113.2", "TCP", "192.168.99.22", 80), Observation{Kind: Leaked, Seen: netip.MustParseAddr("203.0.113.2")}},
		{flow("remotePod", "10.0.5.2", "TCP", "198.51.100.4", 80), Observation{Kind: Leaked, Seen: netip.MustParseAddr("10.0.5.2")}},
		{flow("node", "192.168.0.2", "TCP", "192.168.99.22", 80), Observation{Kind: Leaked, Seen: netip.MustParseAddr("192.168.0.2")}},
		{flow("external", "198.51.100.4", "TCP", "172.30.0.41", 80), Observation{Kind: Leaked, Seen: netip.MustParseAddr("198.51.100.4")}},
		{flow("external", "198.51.100.4", "UDP", "172.30.0.41", 53), Observation{Kind: Leaked, Seen: netip.MustParseAddr("198.51.100.4")}},
		// A closed port of a pod answers with a reset.
		{flow("pod", "10.0.0.2", "TCP", "10.180.0.1", 81), Observation{Kind: Rejected}},
	} {
		t.Run(x.f.Name, func(t *testing.T) {
			if got := r.attempt(x.f, time.Second); got != x.want {
				t.Errorf("got %+v, want %+v", got, x.want)
			}
		})
	}
}
