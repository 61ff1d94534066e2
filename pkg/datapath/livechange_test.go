package datapath

import (
	"slices"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Live changes to a Service and the flows it has: a port's protocol
// changed, its type changed, a family removed, the Service deleted and
// created again. Each test programmes Services with the production
// reconciler (retirement on for TCP and UDP, as the agent runs it),
// opens flows through tc's BPF_PROG_TEST_RUN, applies the change and
// checks what the established flows' packets and new flows get, against
// kube-proxy (v1.36.3, k8s.io/kubernetes/pkg/proxy):
//
//   - netfilter translates a connection by its conntrack entry: only its
//     first packet walks the nat chains (nftables/proxier.go:355-357, the
//     nat base chains; iptables mode's nat table alike), and the chains
//     that reject or drop match `ct state new` only
//     (nftables/proxier.go:373-386). An established flow keeps its
//     translation whatever the rules become; a new flow meets the new
//     rules.
//   - A Service port is keyed by name and protocol (types.go:44-48,
//     servicechangetracker.go:150-161), per family
//     (servicechangetracker.go:145-148: a Service without a ClusterIP of
//     the proxier's family has no port in its map).
//   - UDP conntrack entries are deleted by CleanStaleEntries
//     (conntrack/cleanup.go), run after a sync in which a UDP Service
//     port's endpoints changed (nftables/proxier.go:1761-1764,
//     endpointschangetracker.go:212-230): only for a UDP Service port
//     still in the map with serving endpoints (cleanup.go:67-71, 89-92),
//     at its ClusterIP, LoadBalancer IPs, externalIPs and NodePort
//     (cleanup.go:96-112), whose reply source is not one of them
//     (cleanup.go:133-146). The flows of a frontend that went, and those
//     of a backend still serving, are left to idle out.
//
// Sluice matches each: a removed frontend's master, TCP or UDP, is
// retired for its flows, and a UDP one holds its backends' entries
// (pkg/reconciler/retired.go, udpretired.go).

// liveBench is one datapath and the reconciler that programmes it, as one
// agent.
type liveBench struct {
	d *Datapath
	r *reconciler.Reconciler
}

func newLiveBench(t *testing.T) *liveBench {
	t.Helper()
	d := newTestDatapath(t)
	r := reconciler.New(d.Maps(), nil)
	r.SetRetireTimeout(time.Hour)      // the agent's --conntrack-tcp-timeout
	r.SetUDPRetireTimeout(time.Minute) // and --conntrack-udp-timeout
	return &liveBench{d, r}
}

// apply makes svcs the whole desired state.
func (b *liveBench) apply(t *testing.T, svcs ...*model.Service) {
	t.Helper()
	st := model.NewState()
	for _, s := range svcs {
		st.Services.Set(s.Frontend, s)
	}
	if err := b.r.Apply(st); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

// open opens f to backend be: TCP's handshake, or a UDP datagram and its
// answer.
func (b *liveBench) open(t *testing.T, f flow, be model.L4Addr) {
	t.Helper()
	if f.fe.Proto == model.TCP {
		establish(t, b.d, f, testBackend{addr: be})
		return
	}
	if v, dst := sendTo(t, b.d.TCIngress(), f.pkt(0)); v != tcActOK || dst != be.Addr.String() {
		t.Fatalf("datagram of %+v: verdict %d to %s, want %d to %s", f, v, dst, tcActOK, be)
	}
	if v, out := runProg(t, b.d.TCEgress(), f.from(be, 0).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() || outSport(out) != f.fe.Port {
		t.Fatalf("answer of %+v from %s: verdict %d from %s:%d", f, be, v, outSrc(out), outSport(out))
	}
}

// follows checks that established flow f keeps its translation: its
// conntrack entry is there, the client's packet (an ACK, a datagram)
// reaches be, and be's comes back from f's frontend.
func (b *liveBench) follows(t *testing.T, f flow, be model.L4Addr) {
	t.Helper()
	if _, ok := ctLookup(t, b.d.Maps(), f.fwdKey()); !ok {
		t.Errorf("flow %s:%d -> %s: its conntrack entry is gone", f.client, f.cport, f.fe)
	}
	flags := uint8(0)
	if f.fe.Proto == model.TCP {
		flags = tcpACK
	}
	if v, dst := sendTo(t, b.d.TCIngress(), f.pkt(flags)); v != tcActOK || dst != be.Addr.String() {
		t.Errorf("flow %s:%d -> %s, the client's packet: verdict %d to %s, want %d to its backend %s", f.client, f.cport, f.fe, v, dst, tcActOK, be)
	}
	if v, out := runProg(t, b.d.TCEgress(), f.from(be, flags).Bytes()); v != tcActOK || outSrc(out) != f.fe.Addr.String() || outSport(out) != f.fe.Port {
		t.Errorf("flow %s:%d -> %s, the backend's packet: verdict %d from %s:%d, want %d from the frontend", f.client, f.cport, f.fe, v, outSrc(out), outSport(out), tcActOK)
	}
}

// startsTo checks that a new flow f (a SYN, a first datagram) reaches be.
func (b *liveBench) startsTo(t *testing.T, f flow, be model.L4Addr) {
	t.Helper()
	if v, dst := sendTo(t, b.d.TCIngress(), f.pkt(tcpSYN_)); v != tcActOK || dst != be.Addr.String() {
		t.Errorf("new flow %s:%d -> %s: verdict %d to %s, want %d to %s", f.client, f.cport, f.fe, v, dst, tcActOK, be)
	}
}

// startsNone checks that a new flow f meets no Service: its first packet
// goes on untranslated or is refused back to the client, and makes no
// conntrack entry.
func (b *liveBench) startsNone(t *testing.T, f flow) {
	t.Helper()
	if _, dst := sendTo(t, b.d.TCIngress(), f.pkt(tcpSYN_)); dst != f.fe.Addr.String() && dst != f.client {
		t.Errorf("new flow %s:%d -> %s: sent to %s, want it untranslated (or refused)", f.client, f.cport, f.fe, dst)
	}
	if _, ok := ctLookup(t, b.d.Maps(), f.fwdKey()); ok {
		t.Errorf("new flow %s:%d -> %s: a conntrack entry made", f.client, f.cport, f.fe)
	}
}

// TestLiveChangeProtocol: a Service port's protocol changed, TCP to UDP on
// the same port number, and back. kube-proxy: the TCP and the UDP port
// are two Service ports (types.go:44-48), so the change removes one and
// adds the other; the established TCP flow keeps its conntrack entry
// (nftables/proxier.go:355-357), which CleanStaleEntries never touches
// (cleanup.go:117-120: UDP entries only); new flows of the new protocol
// reach its backend. Back to TCP, the UDP port is no longer in the map,
// so its established flow's entry is not cleaned (cleanup.go:67-71) and
// keeps being translated until it idles out, as Sluice's retired master
// keeps it.
func TestLiveChangeProtocol(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := twinOf(v6)
		cipT := twinL4(v6, l4("10.96.20.1", 80, model.TCP))
		cipU := cipT
		cipU.Proto = model.UDP
		beT := l4(a("10.1.20.1"), 8080, model.TCP)
		beU := beT
		beU.Proto = model.UDP
		tcpSvc, udpSvc := clusterIP(cipT, beT), clusterIP(cipU, beU)
		udpSvc.Name = tcpSvc.Name
		client := a("10.0.20.3")
		b := newLiveBench(t)

		b.apply(t, tcpSvc)
		tf := flow{client, 45200, cipT}
		b.open(t, tf, beT)

		b.apply(t, udpSvc)
		uf := flow{client, 45201, cipU}
		t.Run("TCP to UDP", func(t *testing.T) {
			b.follows(t, tf, beT)
			b.startsNone(t, flow{client, 45202, cipT})
			b.startsTo(t, uf, beU)
			b.open(t, uf, beU)
		})

		b.apply(t, tcpSvc)
		t.Run("UDP back to TCP", func(t *testing.T) {
			b.follows(t, tf, beT)
			b.startsTo(t, flow{client, 45203, cipT}, beT)
			b.startsNone(t, flow{client, 45204, cipU})
			t.Run("established UDP flow", func(t *testing.T) { b.follows(t, uf, beU) })
		})
	})
}

// TestLiveChangeType: a Service's type changed. LoadBalancer to
// ClusterIP (its LoadBalancer IP's and NodePort's frontends go), NodePort
// to ClusterIP, ClusterIP to NodePort, each over TCP and UDP, with a flow
// established through each frontend before. kube-proxy: every
// established flow keeps its conntrack entry (nftables/proxier.go:355-357);
// a UDP flow through a frontend that went is not cleaned, CleanStaleEntries
// keys only the frontends the Service port has now (cleanup.go:96-112),
// nor one through the ClusterIP, whose backend still serves
// (cleanup.go:133-136). New flows to the frontends that went meet no
// rule; to those that came, the backends.
func TestLiveChangeType(t *testing.T) {
	for _, proto := range []model.Protocol{model.TCP, model.UDP} {
		t.Run(proto.String(), func(t *testing.T) {
			forFamilies(t, func(t *testing.T, v6 bool) { liveChangeType(t, v6, proto) })
		})
	}
}

func liveChangeType(t *testing.T, v6 bool, proto model.Protocol) {
	a := twinOf(v6)
	be := l4(a("10.1.21.1"), 8080, proto)
	cip := l4(a("10.96.21.1"), 80, proto)
	np := l4(a("192.168.21.10"), 30080, proto)
	lb := l4(a("192.168.1.221"), 80, proto)
	name := model.ServicePortName{Namespace: "test", Name: "svc", Port: "http"}
	frontend := func(kind model.FrontendKind, fe model.L4Addr) *model.Service {
		s := clusterIP(fe, be)
		s.Name, s.Kind = name, kind
		return s
	}
	cipS, npS, lbS := frontend(model.ClusterIP, cip), frontend(model.NodePort, np), frontend(model.LoadBalancer, lb)
	client := a("10.0.21.3")
	for i, c := range []struct {
		name        string
		before, now []*model.Service
	}{
		{"LoadBalancer to ClusterIP", []*model.Service{cipS, npS, lbS}, []*model.Service{cipS}},
		{"NodePort to ClusterIP", []*model.Service{cipS, npS}, []*model.Service{cipS}},
		{"ClusterIP to NodePort", []*model.Service{cipS}, []*model.Service{cipS, npS}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newLiveBench(t)
			b.apply(t, c.before...)
			port := uint16(45300 + 10*i)
			var flows []flow
			for _, s := range c.before {
				f := flow{client, port, s.Frontend}
				port++
				b.open(t, f, be)
				flows = append(flows, f)
			}

			b.apply(t, c.now...)
			for _, f := range flows {
				t.Run("established via "+f.fe.String(), func(t *testing.T) { b.follows(t, f, be) })
			}
			for _, s := range []*model.Service{cipS, npS, lbS} {
				f := flow{client, port, s.Frontend}
				port++
				switch {
				case slices.Contains(c.now, s):
					b.startsTo(t, f, be)
				case slices.Contains(c.before, s):
					b.startsNone(t, f)
				}
			}
		})
	}
}

// TestLiveChangeFamilyRemoved: a dual-stack Service (RequireDualStack or
// PreferDualStack) made SingleStack IPv4: its IPv6 ClusterIP goes, one
// reconciler over both families, with a flow through each ClusterIP.
// kube-proxy: the IPv6 proxier has the Service no more
// (servicechangetracker.go:145-148), so the IPv6 flow keeps its conntrack
// entry (nftables/proxier.go:355-357), not cleaned even over UDP (its
// CleanStaleEntries, per family, no longer keys that ClusterIP:
// cleanup.go:67-112); the IPv4 flow is untouched; a new IPv6 flow meets
// no rule.
func TestLiveChangeFamilyRemoved(t *testing.T) {
	for _, proto := range []model.Protocol{model.TCP, model.UDP} {
		t.Run(proto.String(), func(t *testing.T) {
			cip4, cip6 := l4("10.96.22.1", 80, proto), l4(twinAddr(true, "10.96.22.1"), 80, proto)
			be4, be6 := l4("10.1.22.1", 8080, proto), l4(twinAddr(true, "10.1.22.1"), 8080, proto)
			s4, s6 := clusterIP(cip4, be4), clusterIP(cip6, be6)
			s6.Name = s4.Name
			f4, f6 := flow{"10.0.22.3", 45400, cip4}, flow{twinAddr(true, "10.0.22.3"), 45400, cip6}
			b := newLiveBench(t)
			b.apply(t, s4, s6)
			b.open(t, f4, be4)
			b.open(t, f6, be6)

			b.apply(t, s4)
			t.Run("established IPv6 flow", func(t *testing.T) { b.follows(t, f6, be6) })
			t.Run("established IPv4 flow", func(t *testing.T) { b.follows(t, f4, be4) })
			b.startsNone(t, flow{f6.client, 45401, cip6})
			b.startsTo(t, flow{f4.client, 45401, cip4}, be4)
		})
	}
}

// TestLiveChangeRecreated: a Service deleted and created again at once
// with the same ClusterIP (a helm reinstall), but another targetPort and
// backends; in one sync (kube-proxy's change tracker folds the delete and
// the create into one change, servicechangetracker.go:92-98) or in two.
// kube-proxy: the established TCP flow keeps its conntrack entry, to the
// old backend (nftables/proxier.go:355-357), between the two syncs too;
// a new flow reaches the new backend. A UDP flow's entry is left by the
// sync that deletes the Service (no Service port to clean it for,
// cleanup.go:67-71) and deleted by the first sync in which the Service
// port is back with serving endpoints, its reply source not among them
// (cleanup.go:89-92, 133-136): its next datagram is a new flow, to the
// new backend.
func TestLiveChangeRecreated(t *testing.T) {
	for _, proto := range []model.Protocol{model.TCP, model.UDP} {
		for _, syncs := range []string{"one sync", "two syncs"} {
			t.Run(proto.String()+" "+syncs, func(t *testing.T) {
				forFamilies(t, func(t *testing.T, v6 bool) {
					a := twinOf(v6)
					cip := twinL4(v6, l4("10.96.23.1", 80, proto))
					old, now := l4(a("10.1.23.1"), 8080, proto), l4(a("10.1.23.2"), 9090, proto)
					client := a("10.0.23.3")
					b := newLiveBench(t)
					b.apply(t, clusterIP(cip, old))
					f := flow{client, 45500, cip}
					b.open(t, f, old)

					if syncs == "two syncs" {
						b.apply(t)
						t.Run("established flow, the Service deleted", func(t *testing.T) { b.follows(t, f, old) })
					}
					b.apply(t, clusterIP(cip, now))
					if proto == model.TCP {
						b.follows(t, f, old)
					} else {
						if _, ok := ctLookup(t, b.d.Maps(), f.fwdKey()); ok {
							t.Errorf("UDP flow to the old backend %s: its conntrack entry kept", old)
						}
						b.startsTo(t, f, now)
					}
					b.startsTo(t, flow{client, 45501, cip}, now)
				})
			})
		}
	}
}
