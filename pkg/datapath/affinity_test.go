package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Session affinity (sessionAffinity ClientIP, bpf/lib/affinity.h) per
// packet, through BPF_PROG_TEST_RUN, with the maps written by the
// production reconciler (one per test, as an agent keeps one): new flows
// from one client address reach one backend, exactly rewritten; clients
// are independent; entries expire after the timeout without a new flow
// and are refreshed by every new flow; a backend that leaves ends the
// affinity to it, one that moves to another slot keeps its clients; and
// the entries survive an agent restart that writes nothing.

var (
	affVIP = l4("10.96.0.30", 80, model.TCP)
	affUDP = l4("10.96.0.31", 53, model.UDP)
	affBEs = []model.L4Addr{
		l4("10.1.4.1", 8080, model.TCP), l4("10.1.4.2", 8080, model.TCP),
		l4("10.1.4.3", 8080, model.TCP), l4("10.1.4.4", 8080, model.TCP),
	}
)

// affinityService is a ClusterIP Service port with session affinity.
func affinityService(fe model.L4Addr, timeout time.Duration, bes ...model.L4Addr) *model.Service {
	s := clusterIP(fe, bes...)
	s.AffinityTimeout = timeout
	return s
}

// affTest is a datapath with the reconciler that programs it, and the
// family its addresses are of (v6: the IPv6 twins of affVIP, affBEs and
// clientAddr, twinAddr).
type affTest struct {
	t  *testing.T
	d  *Datapath
	r  *reconciler.Reconciler
	v6 bool
}

func newAffTest(t *testing.T, v6 bool) *affTest {
	d := newTestDatapath(t)
	return &affTest{t: t, d: d, r: reconciler.New(d.Maps(), nil), v6: v6}
}

// vip is affVIP in a's family; bes affBEs; client clientAddr(i).
func (a *affTest) vip() model.L4Addr { return twinL4(a.v6, affVIP) }

func (a *affTest) bes() []model.L4Addr {
	var out []model.L4Addr
	for _, b := range affBEs {
		out = append(out, twinL4(a.v6, b))
	}
	return out
}

func (a *affTest) client(i int) string { return twinAddr(a.v6, clientAddr(i)) }

func (a *affTest) apply(svcs ...*model.Service) {
	a.t.Helper()
	st := model.NewState()
	for _, s := range svcs {
		c := *s
		c.Backends = model.SortBackends(slices.Clone(s.Backends))
		st.Services.Set(c.Frontend, &c)
	}
	if err := a.r.Apply(st); err != nil {
		a.t.Fatalf("reconciler.Apply: %v", err)
	}
}

// flow sends the first packet of a new TCP flow from client:sport to fe
// through tc ingress and returns the backend it was sent to, checking
// that the packet is exactly the request with that destination.
func (a *affTest) flow(client string, sport uint16, fe model.L4Addr) model.L4Addr {
	a.t.Helper()
	var in packet.Packet
	if fe.Proto == model.UDP {
		in = udpDgram(client, sport, fe.Addr.String(), fe.Port)
	} else {
		in = tcpSYN(client, sport, fe.Addr.String(), fe.Port)
	}
	verdict, out := runProg(a.t, a.d.TCIngress(), in.Bytes())
	if verdict != tcActOK {
		a.t.Fatalf("%s:%d -> %s: verdict %d", client, sport, fe, verdict)
	}
	be := model.L4Addr{Addr: addr(outDst(out)), Port: outDport(out), Proto: fe.Proto}
	if want := in.With(func(p *packet.Packet) { p.Dst, p.DstPort = be.Addr, be.Port }).Bytes(); !bytes.Equal(out, want) {
		a.t.Fatalf("%s:%d -> %s: output packet\n got %x\nwant %x", client, sport, fe, out, want)
	}
	checkChecksums(a.t, out)
	return be
}

// flows sends a new flow from sport of each of the first n clients
// (a.client) to fe and returns the backend each reached, by client.
func (a *affTest) flows(n int, sport uint16, fe model.L4Addr) []model.L4Addr {
	a.t.Helper()
	out := make([]model.L4Addr, n)
	for c := range n {
		out[c] = a.flow(a.client(c), sport, fe)
	}
	return out
}

// entries returns the session affinity entries of fe, by client address.
func (a *affTest) entries(fe model.L4Addr) map[netip.Addr]AffinityEntry {
	a.t.Helper()
	all, err := a.d.Maps().Affinity()
	if err != nil {
		a.t.Fatal(err)
	}
	out := map[netip.Addr]AffinityEntry{}
	for _, e := range all {
		if e.Frontend == reconciler.DefaultScope(fe) && e.NetnsCookie == 0 {
			out[e.Client] = e
		}
	}
	return out
}

func clientAddr(i int) string { return fmt.Sprintf("10.0.%d.%d", 1+i/200, 1+i%200) }

// TestTCAffinitySticky: the same client reaches the same backend over many
// new flows (TCP and UDP), while different clients spread over the
// backends; without affinity, the same client's flows spread too (what
// the sticky cases would show if affinity did nothing).
func TestTCAffinitySticky(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := newAffTest(t, v6)
		affVIP, affBEs, affUDP := a.vip(), a.bes(), twinL4(v6, affUDP)
		clientAddr, c1 := a.client, twinAddr(v6, "10.0.0.1")
		var udpBEs []model.L4Addr
		for i, b := range affBEs {
			udpBEs = append(udpBEs, l4(b.Addr.String(), 5353, model.UDP))
			_ = i
		}
		noAff := l4(twinAddr(v6, "10.96.0.32"), 80, model.TCP)
		a.apply(affinityService(affVIP, time.Hour, affBEs...), affinityService(affUDP, time.Hour, udpBEs...), clusterIP(noAff, affBEs...))

		for _, fe := range []model.L4Addr{affVIP, affUDP} {
			first := a.flow(c1, 30000, fe)
			for i := 1; i < 32; i++ {
				if got := a.flow(c1, uint16(30000+i), fe); got != first {
					t.Fatalf("%s: flow %d of client %s went to %s, its first to %s", fe, i, c1, got, first)
				}
			}
			e, ok := a.entries(fe)[addr(c1)]
			if !ok || e.Backend != netip.AddrPortFrom(first.Addr, first.Port) || e.Slot == 0 {
				t.Errorf("%s: affinity entry of %s %+v (present %v), want it on %s", fe, c1, e, ok, first)
			}
		}

		// 32 clients: each sticky, together on more than one backend.
		seen := map[model.L4Addr]int{}
		for c := range 32 {
			first := a.flow(clientAddr(c), 31000, affVIP)
			seen[first]++
			for i := 1; i < 4; i++ {
				if got := a.flow(clientAddr(c), uint16(31000+i), affVIP); got != first {
					t.Fatalf("client %s: flow %d went to %s, its first to %s", clientAddr(c), i, got, first)
				}
			}
		}
		if len(seen) < 2 {
			t.Errorf("32 clients all on one backend: %v", seen)
		}

		// The control: no affinity, the same client spreads.
		spread := map[model.L4Addr]bool{}
		for i := range 32 {
			spread[a.flow(c1, uint16(32000+i), noAff)] = true
		}
		if len(spread) < 2 {
			t.Errorf("32 flows of one client to a frontend without affinity all reached %v", spread)
		}
		if n := len(a.entries(noAff)); n != 0 {
			t.Errorf("frontend without affinity has %d affinity entries", n)
		}
	})
}

// TestTCAffinityExpires: with timeoutSeconds 1, a client that makes no new
// flow for longer selects afresh (over 16 clients and 4 backends, some
// land elsewhere), and its entry is rewritten; a new flow within the
// timeout refreshes it (clients that keep connecting every 0.3 s stay put
// for 1.8 s, almost twice the timeout). A refresh is due 0.3 s after the
// last, so a stall of 0.7 s (not 0.4 s, as with 0.6 s rounds) would let
// an entry expire between two rounds.
func TestTCAffinityExpires(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := newAffTest(t, v6)
		affVIP, affBEs := a.vip(), a.bes()
		clientAddr := a.client
		a.apply(affinityService(affVIP, time.Second, affBEs...))

		const clients = 16
		first := a.flows(clients, 40000, affVIP)
		// Refreshed by new flows every 0.3 s: still sticky after 1.8 s.
		for round := 1; round <= 6; round++ {
			time.Sleep(300 * time.Millisecond)
			for c := range clients {
				if got := a.flow(clientAddr(c), uint16(40000+round), affVIP); got != first[c] {
					t.Fatalf("round %d (%.1f s): client %s went to %s, stuck to %s: its affinity was not refreshed",
						round, 0.3*float64(round), clientAddr(c), got, first[c])
				}
			}
		}
		before := a.entries(affVIP)
		time.Sleep(1200 * time.Millisecond)
		moved := 0
		for c := range clients {
			if got := a.flow(clientAddr(c), 40010, affVIP); got != first[c] {
				moved++
			}
		}
		if moved == 0 {
			t.Errorf("after idling past the timeout, all %d clients kept their backend: the choice is not made afresh", clients)
		}
		after := a.entries(affVIP)
		for c := range clients {
			ip := addr(clientAddr(c))
			if after[ip].Expires <= before[ip].Expires {
				t.Errorf("client %s: entry expires at %d after its new flow, before at %d", ip, after[ip].Expires, before[ip].Expires)
			}
		}
	})
}

// TestTCAffinityBackendLeaves: a backend that leaves the frontend ends the
// affinity to it: its clients' next flows select among the others (never
// it), and its entries are gone, so that when it comes back its clients
// of old do not return to it. The backend that moves into its slot keeps
// its clients. A frontend that loses its affinity loses its entries.
func TestTCAffinityBackendLeaves(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := newAffTest(t, v6)
		affVIP, affBEs := a.vip(), a.bes()
		clientAddr := a.client
		a.apply(affinityService(affVIP, time.Hour, affBEs...))
		m := a.d.Maps()
		ks := mustDump(t, m)
		slotOf := map[model.L4Addr]uint32{}
		for s, id := range ks.Slots[reconciler.DefaultScope(affVIP)] {
			slotOf[ks.Backends[id]] = s
		}
		// Leaving: slot 1's backend. Moving into slot 1: slot 4's.
		var gone, mover model.L4Addr
		for b, s := range slotOf {
			switch s {
			case 1:
				gone = b
			case 4:
				mover = b
			}
		}

		// Clients until both gone and mover have some.
		stuck := map[string]model.L4Addr{}
		has := map[model.L4Addr]int{}
		for c := 0; c < 400 && (has[gone] < 3 || has[mover] < 3); c++ {
			b := a.flow(clientAddr(c), 50000, affVIP)
			stuck[clientAddr(c)] = b
			has[b]++
		}
		if has[gone] == 0 || has[mover] == 0 {
			t.Fatalf("no clients on %s or %s: %v", gone, mover, has)
		}

		var rest []model.L4Addr
		for _, b := range affBEs {
			if b != gone {
				rest = append(rest, b)
			}
		}
		a.apply(affinityService(affVIP, time.Hour, rest...))
		if s := func() uint32 {
			ks, _ := m.Dump()
			for s, id := range ks.Slots[reconciler.DefaultScope(affVIP)] {
				if ks.Backends[id] == mover {
					return s
				}
			}
			return 0
		}(); s != 1 {
			t.Fatalf("%s is in slot %d after the shrink, want 1 (the test's premise)", mover, s)
		}
		for ip, e := range a.entries(affVIP) {
			if e.Backend == netip.AddrPortFrom(gone.Addr, gone.Port) {
				t.Errorf("client %s: entry of %s, which left, survived: %+v", ip, gone, e)
			}
			if e.Backend == netip.AddrPortFrom(mover.Addr, mover.Port) && e.Slot != 1 {
				t.Errorf("client %s: entry of %s names slot %d, want 1 (moved)", ip, mover, e.Slot)
			}
		}
		now := map[string]model.L4Addr{}
		for client, b := range stuck {
			got := a.flow(client, 50001, affVIP)
			switch {
			case got == gone:
				t.Fatalf("client %s sent to %s, which left", client, gone)
			case b != gone && got != b:
				t.Errorf("client %s moved from %s to %s, though its backend stayed", client, b, got)
			}
			now[client] = got
			if again := a.flow(client, 50002, affVIP); again != got {
				t.Errorf("client %s: after reselecting %s, its next flow went to %s", client, got, again)
			}
		}

		// The backend comes back: nobody returns to it.
		a.apply(affinityService(affVIP, time.Hour, affBEs...))
		for client, b := range now {
			if got := a.flow(client, 50003, affVIP); got != b {
				t.Errorf("client %s: went to %s after %s came back, was stuck to %s", client, got, gone, b)
			}
		}

		// Without affinity: no entries left for the frontend.
		a.apply(affinityService(affVIP, 0, affBEs...))
		if n := len(a.entries(affVIP)); n != 0 {
			t.Errorf("%d affinity entries left after the frontend lost its affinity", n)
		}
	})
}

// TestTCAffinityRestart: the entries are in a pinned map: an agent that
// restarts (new datapath and reconciler over the same pins, restored)
// writes nothing, and every client keeps its backend.
func TestTCAffinityRestart(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a := newAffTest(t, v6)
		affVIP, affBEs := a.vip(), a.bes()
		clientAddr := a.client
		svc := affinityService(affVIP, time.Hour, affBEs...)
		a.apply(svc)
		stuck := a.flows(16, 60000, affVIP)
		before := a.entries(affVIP)

		cfg := a.d.cfg
		a.d.Close()
		d2 := openTest(t, cfg)
		r2 := reconciler.New(d2.Maps(), nil)
		if err := r2.Restore(); err != nil {
			t.Fatal(err)
		}
		w0 := r2.Stats().Writes
		b := &affTest{t: t, d: d2, r: r2, v6: v6}
		b.apply(svc)
		if w := r2.Stats().Writes - w0; w != 0 {
			t.Errorf("restart: applying the same state wrote %d times", w)
		}
		if after := b.entries(affVIP); len(after) != len(before) {
			t.Errorf("restart: %d affinity entries, had %d", len(after), len(before))
		}
		for c, be := range stuck {
			if got := b.flow(clientAddr(c), 60001, affVIP); got != be {
				t.Errorf("restart: client %s went to %s, was stuck to %s", clientAddr(c), got, be)
			}
		}
	})
}

// TestXDPAffinity: the XDP fast path follows and keeps session affinity
// for external flows to remote backends, sharing the entries with tc: a
// flow tc starts goes where XDP's went.
func TestXDPAffinity(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		var ifindex int
		var d *Datapath
		np := l4(nsNodeIP, 30090, model.TCP)
		beAddr := func(i int) string { return fmt.Sprintf("10.2.0.%d", 21+i) }
		if v6 {
			_, ifindex, d = nodeDatapath6(t, xdpConfig)
			np = l4(nsNodeIP6, 30090, model.TCP)
			beAddr = func(i int) string { return fmt.Sprintf("2001:db8:2::%x", 0x21+i) } // routed by node 2
		} else {
			_, ifindex, d = northSouthNode(t)
		}
		var bes []model.L4Addr
		for i := range 4 {
			bes = append(bes, l4(beAddr(i), 8080, model.TCP))
		}
		svc := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "np"}, Kind: model.NodePort, Frontend: np, AffinityTimeout: time.Hour}
		for _, b := range bes {
			svc.Backends = append(svc.Backends, model.Backend{L4Addr: b})
		}
		// The reconciler, over the frontends northSouthNode (nodeDatapath6)
		// wrote: they are not in its desired state, so they go; XDP and
		// tc need only np.
		st := model.NewState()
		st.Services.Set(np, svc)
		if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
			t.Fatal(err)
		}
		var first model.L4Addr
		for i := range 16 {
			in := nsClient(uint16(42000+i), np)
			verdict, out := runXDP(t, d.XDP(), ifindex, in.Bytes())
			sp := snatPortIn(t, d, in.Src.String(), in.SrcPort, np)
			got := l4(outDst(out), 8080, model.TCP)
			if i == 0 {
				first = got
			} else if got != first {
				t.Fatalf("XDP flow %d went to %s, the first to %s", i, got, first)
			}
			expectPacket(t, fmt.Sprintf("XDP flow %d", i), verdict, xdpTx, out, toRemote(in, sp, testBackend{addr: first}))
		}
		in := nsClient(42100, np)
		verdict, out := runOn(t, d.TCIngress(), ifindex, in.Bytes())
		sp := snatPortIn(t, d, in.Src.String(), in.SrcPort, np)
		expectPacket(t, "tc flow", verdict, tcActRedirect, out, toRemote(in, sp, testBackend{addr: first}))
	})
}

// TestFixAffinity: sluice_aff_fix (and sluice_aff_fix6, for the IPv6
// frontends of the same fixes) touches only the entries the fixes name: a
// backend's entries of one frontend move or go, a whole frontend's go,
// and every other entry (other frontends, other backends, the socket
// path's of other frontends, the other scope of the same frontend, the
// other family's) stays as it was.
func TestFixAffinity(t *testing.T) {
	d := newTestDatapath(t)
	m := d.Maps()
	addrKind, netns := sockAffinityClientAFFINITY_CLIENT_ADDR, sockAffinityClientAFFINITY_CLIENT_NETNS
	var fixes []reconciler.AffinityFix
	var want []string
	// The same entries and fixes in each family: vip(i) is a
	// frontend's address, client(i) a client's.
	for _, fam := range []struct {
		vip, client func(i int) string
		put         func(k sockLb4AffinityKey, fe reconciler.Frontend, client string, v sockLb4Affinity) error
	}{
		{func(i int) string { return fmt.Sprintf("10.96.0.%d", 50+i) }, func(i int) string { return fmt.Sprintf("10.0.0.%d", i) },
			func(k sockLb4AffinityKey, _ reconciler.Frontend, client string, v sockLb4Affinity) error {
				if k.Kind == uint32(addrKind) {
					k.Client = uint64(be32(addr(client)))
				}
				v.Addr = be32(addr("10.1.0.1"))
				return m.affinity.Put(&k, &v)
			}},
		{func(i int) string { return fmt.Sprintf("2001:db8:96::%d", 50+i) }, func(i int) string { return fmt.Sprintf("2001:db8::%d", i) },
			func(k sockLb4AffinityKey, fe reconciler.Frontend, client string, v sockLb4Affinity) error {
				k6 := sockLb6AffinityKey{Master: lb6Key(k.Master, fe.Addr), Kind: k.Kind}
				if k.Kind == uint32(addrKind) {
					k6.Client = v6addr(addr(client))
				} else {
					binary.NativeEndian.PutUint64(k6.Client.Addr[:8], k.Client)
				}
				v6 := sockLb6Affinity{Expires: v.Expires, BackendId: v.BackendId, Port: v.Port, Slot: v.Slot, Addr: v6addr(addr("2001:db8:1::1"))}
				return m.affinity6.Put(&k6, &v6)
			}},
	} {
		fe := func(i int) reconciler.Frontend { return reconciler.DefaultScope(l4(fam.vip(i), 80, model.TCP)) }
		fe1, fe2, fe3 := fe(0), fe(1), fe(2)
		fe1in := reconciler.Frontend{L4Addr: fe1.L4Addr, Scope: reconciler.ScopeInternal}
		put := func(fe reconciler.Frontend, client int, kind sockAffinityClient, id reconciler.BackendID, slot uint16) {
			t.Helper()
			k := sockLb4AffinityKey{Client: uint64(client), Kind: uint32(kind)}
			k.Master, _ = serviceKey(fe, 0)
			v := sockLb4Affinity{Expires: 1 << 62, BackendId: uint32(id), Port: be16(8080), Slot: slot}
			if err := fam.put(k, fe, fam.client(client), v); err != nil {
				t.Fatal(err)
			}
		}
		put(fe1, 1, addrKind, 7, 4) // moves to slot 2
		put(fe1, 2, addrKind, 8, 1) // deleted
		put(fe1, 3, addrKind, 9, 3) // stays
		put(fe1, 77, netns, 7, 4)   // moves to slot 2
		put(fe2, 1, addrKind, 7, 4) // deleted with its frontend
		put(fe2, 77, netns, 8, 1)   // deleted with its frontend
		put(fe3, 1, addrKind, 8, 1) // stays: backend 8 goes from fe1 only
		// fe1's internal scope has entries of its own, which fixes of
		// its default scope leave alone.
		put(fe1in, 1, addrKind, 7, 4) // stays
		put(fe1in, 2, addrKind, 8, 1) // stays
		fixes = append(fixes, reconciler.AffinityFix{Frontend: fe1, Backend: 7, Slot: 2}, reconciler.AffinityFix{Frontend: fe1, Backend: 8},
			reconciler.AffinityFix{Frontend: fe2})
		want = append(want,
			fmt.Sprintf("%s internal %s backend=7 slot=4", fe1, fam.client(1)),
			fmt.Sprintf("%s internal %s backend=8 slot=1", fe1, fam.client(2)),
			fmt.Sprintf("%s %s backend=7 slot=2", fe1, fam.client(1)),
			fmt.Sprintf("%s %s backend=9 slot=3", fe1, fam.client(3)),
			fmt.Sprintf("%s netns 77 backend=7 slot=2", fe1),
			fmt.Sprintf("%s %s backend=8 slot=1", fe3, fam.client(1)),
		)
	}

	if err := m.FixAffinity(fixes); err != nil {
		t.Fatal(err)
	}
	all, err := m.Affinity()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range all {
		client := e.Client.String()
		if e.NetnsCookie != 0 {
			client = fmt.Sprintf("netns %d", e.NetnsCookie)
		}
		got = append(got, fmt.Sprintf("%s %s backend=%d slot=%d", e.Frontend, client, e.BackendID, e.Slot))
	}
	if !slices.Equal(got, want) {
		t.Errorf("entries after the fixes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The fix sets are emptied after the pass.
	for _, set := range []*ebpf.Map{m.affFix, m.affFix6} {
		if n, err := countEntries(set); n != 0 || err != nil {
			t.Errorf("%s: %d entries after the pass (%v)", set, n, err)
		}
	}
	if err := m.FixAffinity([]reconciler.AffinityFix{{Frontend: reconciler.DefaultScope(l4("10.96.0.50", 80, model.TCP)), Slot: 3}}); err == nil {
		t.Error("FixAffinity moved every backend of a frontend to one slot")
	}
}

// TestTCAffinityTwoScopes: an externalTrafficPolicy Local NodePort with
// session affinity (and a cluster CIDR) keeps its external and internal
// clients apart: each is stuck within the scope that serves it, under
// that scope's master key, to that scope's backend, and its next flows
// follow the entry, exactly rewritten.
func TestTCAffinityTwoScopes(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		w := semanticsOf(v6)
		ns, d, eth0, _ := semanticsNode(t, Config{ClusterCIDRs: w.prefixes("10.0.0.0/8")}, w)
		two := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "two"}, Kind: model.NodePort, Frontend: w.npTwo,
			Backends: []model.Backend{{L4Addr: w.beLocal.addr}}, ExternalLocal: true, TwoScopes: true,
			InternalBackends: []model.Backend{{L4Addr: w.beRemote.addr}}, AffinityTimeout: time.Hour}
		r := reconciler.New(d.Maps(), nil)
		if err := r.Restore(); err != nil {
			t.Fatal(err)
		}
		st := model.NewState()
		st.Services.Set(w.npTwo, two)
		if err := r.Apply(st); err != nil {
			t.Fatal(err)
		}
		ing := d.TCIngress()
		ns.Enter(t)
		for i, sport := range []uint16{42000, 42001} {
			ext := nsClient(sport, w.npTwo)
			verdict, out := runOn(t, ing, eth0, ext.Bytes())
			expectPacket(t, fmt.Sprintf("external flow %d", i), verdict, tcActOK, out, dnat(ext, w.beLocal))
			pod := nsClient(sport, w.npTwo)
			pod.Src = addr(w.remotePod)
			verdict, out = runOn(t, ing, eth0, pod.Bytes())
			expectPacket(t, fmt.Sprintf("remote pod flow %d", i), verdict, tcActOK, out, dnat(pod, w.beRemote))
		}
		all, err := d.Maps().Affinity()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range all {
			got = append(got, fmt.Sprintf("%s %s -> %s", e.Frontend, e.Client, e.Backend))
		}
		want := []string{
			fmt.Sprintf("%s internal %s -> %s", w.npTwo, w.remotePod, netip.AddrPortFrom(w.beRemote.addr.Addr, w.beRemote.addr.Port)),
			fmt.Sprintf("%s %s -> %s", w.npTwo, w.client(), netip.AddrPortFrom(w.beLocal.addr.Addr, w.beLocal.addr.Port)),
		}
		if !slices.Equal(got, want) {
			t.Errorf("affinity entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}
