package translate

// Which listing of an endpoint wins when a Service's slices list its
// address (and port) twice. kube-proxy (endpointslicecache.go,
// addEndpoints) lets a listing replace those before it unless it is
// terminating: a non-terminating listing wins over a terminating one
// whatever the order the slices come in (a pod IP reused by a new pod
// while the old pod is still terminating reaches the new pod); of several
// not terminating the last wins, of several terminating the first. Across
// slices "last" and "first" are the order kube-proxy walks them in, a
// map's; Sluice's choice is kube-proxy's for the slices walked in name
// order, whatever order they come in.

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netutils "k8s.io/utils/net"
)

func TestDuplicateAddressListing(t *testing.T) {
	tcp := corev1.ProtocolTCP
	ports := []discoveryv1.EndpointPort{eport("", 8080, tcp)}
	svc := service("d", []string{"10.96.0.30"}, sport("", 80, tcp))
	local := svc.DeepCopy()
	local.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	type listing struct{ ready, serving, terminating bool }
	listed := func(name string, l listing, node string) *discoveryv1.EndpointSlice {
		return slice(name, "d", ports, ep{addr: "10.0.0.9", ready: ptr(l.ready), serving: ptr(l.serving), terminate: ptr(l.terminating), node: node})
	}
	cases := []struct {
		name   string
		da, db listing // the listings of slices d-a (on node a) and d-b (on node b)
		want   string  // the frontend's backends, as render prints them
		// The same with internalTrafficPolicy Local, on node a: whose
		// listing won, seen in the backends.
		local string
	}{
		{
			// Case A: the terminating listing is serving, the other
			// not: kube-proxy keeps the non-terminating one, which
			// is not usable, so the Service has no endpoint (REJECT).
			name:  "terminating serving vs not ready, not serving, not terminating",
			da:    listing{ready: false, serving: true, terminating: true},
			db:    listing{ready: false, serving: false, terminating: false},
			want:  "10.96.0.30:80/TCP default/d ->\n",
			local: "ClusterIP 10.96.0.30:80/TCP ->\n",
		},
		{
			// Case B: the terminating listing is even ready.
			name:  "ready terminating vs not ready, not terminating",
			da:    listing{ready: true, serving: true, terminating: true},
			db:    listing{ready: false, serving: false, terminating: false},
			want:  "10.96.0.30:80/TCP default/d ->\n",
			local: "ClusterIP 10.96.0.30:80/TCP ->\n",
		},
		{
			name:  "terminating vs ready",
			da:    listing{ready: false, serving: true, terminating: true},
			db:    listing{ready: true, serving: true, terminating: false},
			want:  "10.96.0.30:80/TCP default/d -> 10.0.0.9:8080/TCP@b\n",
			local: "ClusterIP 10.96.0.30:80/TCP drop ->\n",
		},
		// kube-proxy's choice depends on the order below; Sluice's is
		// kube-proxy's with d-a walked first.
		{
			name:  "both not terminating: d-b's, the last",
			da:    listing{ready: true, serving: true},
			db:    listing{ready: false, serving: false},
			want:  "10.96.0.30:80/TCP default/d ->\n",
			local: "ClusterIP 10.96.0.30:80/TCP ->\n",
		},
		{
			name:  "both ready, not terminating: d-b's, the last",
			da:    listing{ready: true, serving: true},
			db:    listing{ready: true, serving: true},
			want:  "10.96.0.30:80/TCP default/d -> 10.0.0.9:8080/TCP@b\n",
			local: "ClusterIP 10.96.0.30:80/TCP drop ->\n",
		},
		{
			name:  "both terminating: d-a's, the first",
			da:    listing{serving: true, terminating: true},
			db:    listing{serving: false, terminating: true},
			want:  "10.96.0.30:80/TCP default/d -> 10.0.0.9:8080/TCP(term)@a\n",
			local: "ClusterIP 10.96.0.30:80/TCP -> 10.0.0.9(term)\n",
		},
	}
	for _, tc := range cases {
		eps := []*discoveryv1.EndpointSlice{listed("d-a", tc.da, "a"), listed("d-b", tc.db, "b")}
		for _, order := range []string{"d-a first", "d-b first"} {
			t.Run(tc.name+"/"+order, func(t *testing.T) {
				in := slices.Clone(eps)
				if order == "d-b first" {
					slices.Reverse(in)
				}
				tr, err := ServiceToModel(svc, in, Options{})
				if err != nil {
					t.Fatal(err)
				}
				// render names the node of the listing that
				// endpointsFor keeps of the slices in name order.
				if got := render(tr.Services, eps); got != tc.want {
					t.Errorf("got\n%s\nwant\n%s", got, tc.want)
				}
				for _, s := range tr.Services {
					if len(s.Backends) == 0 && s.DropWhenEmpty {
						t.Errorf("%s: dropped, want rejected", s.Frontend)
					}
				}
				tr, err = ServiceToModel(local, in, Options{Node: Node{Name: "a"}})
				if err != nil {
					t.Fatal(err)
				}
				if got := renderNS(tr.Services); got != tc.local {
					t.Errorf("internalTrafficPolicy Local on node a: got\n%s\nwant\n%s", got, tc.local)
				}
			})
		}
	}
}

// kubeProxyListing is what kube-proxy keeps of an endpoint: its node and
// conditions.
type kubeProxyListing struct {
	node                        string
	ready, serving, terminating bool
}

// kubeProxyEndpoints is kube-proxy v1.36.3's endpointInfoByServicePort and
// addEndpoints (endpointslicecache.go), for one Service port, walking eps
// in their order: the endpoints by "address:port".
func kubeProxyEndpoints(eps []*discoveryv1.EndpointSlice, portName string, proto corev1.Protocol) map[string]kubeProxyListing {
	set := map[string]kubeProxyListing{}
	for _, es := range eps {
		for _, port := range es.Ports {
			if port.Name == nil || port.Port == nil || *port.Port == 0 {
				continue // "Ignoring port with nil name", "Ignoring invalid endpoint port"
			}
			if *port.Name != portName || *port.Protocol != proto {
				continue // another ServicePortName
			}
			for _, e := range es.Endpoints {
				if len(e.Addresses) == 0 {
					continue
				}
				ready := e.Conditions.Ready == nil || *e.Conditions.Ready
				serving := e.Conditions.Serving == nil || *e.Conditions.Serving
				terminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
				key := net.JoinHostPort(netutils.ParseIPSloppy(e.Addresses[0]).String(), strconv.Itoa(int(*port.Port)))
				if _, exists := set[key]; !exists || !terminating {
					set[key] = kubeProxyListing{ptrOr(e.NodeName, ""), ready, serving, terminating}
				}
			}
		}
	}
	return set
}

// endpointsFor keeps, of the listings of an address and port, the one
// kube-proxy keeps when it walks the slices in name order; in any order
// Translate is given them. Drawn at random: two to four slices, each
// listing the port (8080 or 8081) or not, with a few addresses listed
// once or several times, in one slice or several, with every combination
// of conditions and nodes.
func TestDuplicateAddressAsKubeProxy(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 2))
	conds := []*bool{nil, ptr(true), ptr(false)}
	addrs := []string{"10.0.0.1", "10.0.0.2", "10.0.0.02", "10.0.0.3"}
	svc := service("d", []string{"10.96.0.30"}, sport("http", 80, corev1.ProtocolTCP))
	for n := range 3000 {
		var eps []*discoveryv1.EndpointSlice
		for i := range 2 + r.IntN(3) {
			port := eport("http", 8080+int32(r.IntN(2)), corev1.ProtocolTCP)
			if r.IntN(6) == 0 {
				port.Name = ptr("other")
			}
			es := slice(fmt.Sprintf("d-%d", i), "d", []discoveryv1.EndpointPort{port})
			for range r.IntN(5) {
				e := discoveryv1.Endpoint{Addresses: []string{addrs[r.IntN(len(addrs))]},
					Conditions: discoveryv1.EndpointConditions{Ready: conds[r.IntN(3)], Serving: conds[r.IntN(3)], Terminating: conds[r.IntN(3)]}}
				if k := r.IntN(4); k > 0 {
					e.NodeName = ptr(fmt.Sprintf("n%d", k))
				}
				es.Endpoints = append(es.Endpoints, e)
			}
			eps = append(eps, es)
		}
		want := kubeProxyEndpoints(eps, "http", corev1.ProtocolTCP) // eps are in name order
		in := slices.Clone(eps)
		r.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
		tr, err := ServiceToModel(svc, in, Options{})
		if err != nil {
			t.Fatal(err)
		}
		// The listing kept, as endpointsFor keeps it of the slices
		// Translate sorted.
		got := map[string]kubeProxyListing{}
		for _, e := range endpointsFor(nil, "http", corev1.ProtocolTCP, 0, SlicesOf(eps), "") {
			got[netip.AddrPortFrom(e.b.Addr, e.b.Port).String()] = kubeProxyListing{e.node, e.ready, e.serving, e.terminating}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("draw %d: kept\n%v\nkube-proxy keeps\n%v", n, got, want)
		}
		// The translation's backends are those endpoints' (the Cluster
		// policy's: ready ones, else serving and terminating ones).
		var ready, fallback []string
		for k, l := range want {
			if l.ready {
				ready = append(ready, k)
			} else if l.serving && l.terminating {
				fallback = append(fallback, k)
			}
		}
		if len(ready) == 0 {
			ready = fallback
		}
		var backends []string
		for _, b := range tr.Services[0].Backends {
			backends = append(backends, netip.AddrPortFrom(b.Addr, b.Port).String())
		}
		slices.Sort(ready)
		slices.Sort(backends)
		if !slices.Equal(backends, ready) {
			t.Fatalf("draw %d: backends %v, want %v (kube-proxy's endpoints %v)", n, backends, ready, want)
		}
	}
}
