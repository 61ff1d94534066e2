package reconciler_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// udpDNS is a UDP Service port "dns" with a ClusterIP and NodePort
// frontends at the given node addresses (--nodeport-addresses), each
// serving bs, as pkg/source/translate makes them: one frontend per node
// address.
func udpDNS(nodeAddrs []string, bs ...model.Backend) *model.State {
	cip := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.UDP}
	svcs := []*model.Service{svc(cip, "dns", bs...)}
	for _, a := range nodeAddrs {
		s := svc(model.L4Addr{Addr: netip.MustParseAddr(a), Port: 30053, Proto: model.UDP}, "dns", bs...)
		s.Kind = model.NodePort
		svcs = append(svcs, s)
	}
	return state(svcs...)
}

// A UDP backend's flows are flushed (and its connected sockets ended,
// which the datapath does with the flush) only when its Service port no
// longer serves it through any frontend, as kube-proxy's conntrack
// cleanup, keyed by Service port and endpoint, deletes them: a frontend
// of the port that goes while another still serves the backend flushes
// nothing.
func TestUDPFlushOnlyWhenServicePortStopsServing(t *testing.T) {
	b1, b2 := be(5, 1, model.UDP), be(5, 2, model.UDP)
	nodeAddrs := []string{"192.168.1.10", "192.168.1.99"}

	// A node address leaves (a VIP moved away, a DHCP or SLAAC address
	// expired): its NodePort frontend goes, the ClusterIP and the other
	// node address still serve b1 and b2.
	t.Run("NodeAddressLeaves", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, udpDNS(nodeAddrs, b1, b2))
		mustApply(t, r, udpDNS(nodeAddrs[:1], b1, b2))
		if fl := f.Flushed(); len(fl) != 0 {
			t.Fatalf("flushed %v when a node address left: the Service port still serves them", fl)
		}
		// The last address replaced by another in one change (a DHCP
		// renewal with a new address): the new address's NodePort
		// frontend is not programmed yet when the old one goes, so the
		// backends are flushed, as before (README, "UDP flush scope").
		mustApply(t, r, udpDNS([]string{"192.168.1.11"}, b1, b2))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr, b2.L4Addr}) {
			t.Fatalf("flushed %v when the last node address was replaced, want %v and %v", fl, b1.L4Addr, b2.L4Addr)
		}
	})

	// The same after an agent restart: the restored view knows no
	// Service port until a state programs it.
	t.Run("AfterRestart", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, udpDNS(nodeAddrs, b1, b2))
		r = reconciler.New(f, nil)
		if err := r.Restore(); err != nil {
			t.Fatal(err)
		}
		mustApply(t, r, udpDNS(nodeAddrs, b1, b2))
		mustApply(t, r, udpDNS(nodeAddrs[:1], b1, b2))
		if fl := f.Flushed(); len(fl) != 0 {
			t.Fatalf("flushed %v when a node address left after a restart", fl)
		}
	})

	// The Service's NodePort frontends all go (type NodePort to
	// ClusterIP), or its LoadBalancer IP: the ClusterIP still serves b1
	// and b2, but the port number or the address is given up and may be
	// given to another Service within the UDP timeout, whose frontend
	// the old flows' entries would then follow (the datapath checks an
	// entry's backend, not its Service): flushed, as before.
	t.Run("NodePortsRemoved", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, udpDNS(nodeAddrs, b1, b2))
		mustApply(t, r, udpDNS(nil, b1, b2))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr, b2.L4Addr}) {
			t.Fatalf("flushed %v when the NodePorts went, want %v and %v", fl, b1.L4Addr, b2.L4Addr)
		}
	})
	lbIP := model.L4Addr{Addr: netip.MustParseAddr("203.0.113.7"), Port: 53, Proto: model.UDP}
	withLB := func(name string, bs ...model.Backend) *model.Service {
		lb := svc(lbIP, name, bs...)
		lb.Kind = model.LoadBalancer
		return lb
	}
	t.Run("LoadBalancerIPRemoved", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		st := udpDNS(nil, b1, b2)
		st.Services.Set(lbIP, withLB("dns", b1, b2))
		mustApply(t, r, st)
		mustApply(t, r, udpDNS(nil, b1, b2))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr, b2.L4Addr}) {
			t.Fatalf("flushed %v when the LoadBalancer IP went, want %v and %v", fl, b1.L4Addr, b2.L4Addr)
		}
	})
	// The LoadBalancer IP given to another Service port in a later
	// sync: the first Service's flows at it were flushed when it went.
	t.Run("LoadBalancerIPMovesLater", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		c1 := be(6, 1, model.UDP)
		other := svc(model.L4Addr{Addr: netip.MustParseAddr("10.96.0.11"), Port: 53, Proto: model.UDP}, "other", c1)
		st := udpDNS(nil, b1)
		st.Services.Set(lbIP, withLB("dns", b1))
		st.Services.Set(other.Frontend, other)
		mustApply(t, r, st)
		st = udpDNS(nil, b1)
		st.Services.Set(other.Frontend, other)
		mustApply(t, r, st)
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr}) {
			t.Fatalf("flushed %v when the LoadBalancer IP went, want %v", fl, b1.L4Addr)
		}
		st.Services.Set(lbIP, withLB("other", c1))
		mustApply(t, r, st)
		if fl := f.Flushed(); len(fl) != 1 {
			t.Fatalf("flushed %v when the IP came back for another Service", fl)
		}
	})

	// A node address that leaves in the first sync after an agent
	// restart: the maps do not say which Service port its frontend was,
	// so its backends are flushed, as before (README, "UDP flush scope").
	t.Run("FirstSyncAfterRestart", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, udpDNS(nodeAddrs, b1, b2))
		r = reconciler.New(f, nil)
		if err := r.Restore(); err != nil {
			t.Fatal(err)
		}
		mustApply(t, r, udpDNS(nodeAddrs[:1], b1, b2))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr, b2.L4Addr}) {
			t.Fatalf("flushed %v, want %v and %v", fl, b1.L4Addr, b2.L4Addr)
		}
	})

	// A node address leaves while b2 leaves the Service port's
	// endpoints: b2 is flushed, b1 not.
	t.Run("NodeAddressLeavesAndBackendGoes", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, udpDNS(nodeAddrs, b1, b2))
		mustApply(t, r, udpDNS(nodeAddrs[:1], b1))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b2.L4Addr}) {
			t.Fatalf("flushed %v, want %v", fl, b2.L4Addr)
		}
	})

	// A real removal still flushes: the backend leaves the Service
	// port's endpoints (every frontend of it).
	t.Run("BackendLeaves", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		mustApply(t, r, udpDNS(nodeAddrs, b1, b2))
		mustApply(t, r, udpDNS(nodeAddrs, b1))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b2.L4Addr}) {
			t.Fatalf("flushed %v, want %v", fl, b2.L4Addr)
		}
	})

	// The Service deleted: every frontend of the port goes.
	t.Run("ServiceDeleted", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		other := svc(vip(1), "web", be(1, 1, model.TCP))
		st := udpDNS(nodeAddrs, b1, b2)
		st.Services.Set(other.Frontend, other)
		mustApply(t, r, st)
		mustApply(t, r, state(other))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr, b2.L4Addr}) {
			t.Fatalf("flushed %v, want %v and %v", fl, b1.L4Addr, b2.L4Addr)
		}
	})

	// Only frontends of the same Service port keep the flows: "dns"
	// loses its one frontend (a NodePort at a node address that leaves)
	// while Service "other" still has b2; "dns" no longer serves it, so
	// b2 is flushed, by backend address (a stated deviation from
	// kube-proxy, which would leave both alone).
	t.Run("OtherServicePortDoesNotCount", func(t *testing.T) {
		f := newFake(t)
		r := reconciler.New(f, nil)
		ou := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.11"), Port: 53, Proto: model.UDP}
		np := svc(model.L4Addr{Addr: netip.MustParseAddr("192.168.1.10"), Port: 30053, Proto: model.UDP}, "dns", b2)
		np.Kind = model.NodePort
		other := svc(ou, "other", b2)
		mustApply(t, r, state(other, np))
		mustApply(t, r, state(other))
		if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b2.L4Addr}) {
			t.Fatalf("flushed %v, want %v", fl, b2.L4Addr)
		}
	})
}

// A Service port renamed: the Service's change is synced before the
// EndpointSlice controller renames the slices' port, so for one sync the
// renamed port has no endpoints. Sluice flushes its backends then, where
// kube-proxy, which cleans nothing for a Service port without serving
// endpoints, keeps them: a stated deviation (README, "UDP flush scope"),
// kept because keeping the flows of a Service port left without
// endpoints would keep connected sockets sending to an address no
// endpoint holds any more. This pins it.
func TestUDPFlushPortRenamed(t *testing.T) {
	u := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: model.UDP}
	b1 := be(5, 1, model.UDP)
	named := func(port string, bs ...model.Backend) *model.State {
		s := svc(u, "dns", bs...)
		s.Name.Port = port
		return state(s)
	}
	f := newFake(t)
	r := reconciler.New(f, nil)
	mustApply(t, r, named("dns", b1))
	mustApply(t, r, named("domain"))
	if fl := f.Flushed(); !slices.Equal(fl, []model.L4Addr{b1.L4Addr}) {
		t.Fatalf("flushed %v, want %v", fl, b1.L4Addr)
	}
	mustApply(t, r, named("domain", b1))
	if fl := f.Flushed(); len(fl) != 1 {
		t.Fatalf("flushed %v when the endpoint came back", fl)
	}
}
