package datapath

// Tests of a closed source-NATed TCP flow's TIME_WAIT extension
// (--conntrack-tcp-snat-time-wait, ct_timeout_snat_tw_ns in
// bpf/lib/config.h): its entries, and so its SNAT port, live the TIME_WAIT
// timeout instead of the close timeout, a new flow passes its port over
// while another is free and takes it over only when every port tried is
// held (tc_snat_tw_reuse), and flows not source-NATed keep the close
// timeout. Through BPF_PROG_TEST_RUN, per family, in a node namespace of
// the test's own (snatNode), with a SNAT range of 2 ports.

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
)

// twTimeWait is the tests' TIME_WAIT timeout, not the default (120 s), so
// that the configured one is seen to be the one used.
const twTimeWait = 90 * time.Second

// twNode is snatNode with the SNAT range 62000-62001 and the TIME_WAIT
// timeout twTimeWait (XDP loaded too with xdp), and its configuration
// with the defaults filled in.
func twNode(t *testing.T, v6, xdp bool) (d *Datapath, ifindex int, np model.L4Addr, be testBackend, cfg Config) {
	t.Helper()
	return twNodeWith(t, v6, xdp, func(*Config) {})
}

// twNodeWith is twNode with more set on its configuration.
func twNodeWith(t *testing.T, v6, xdp bool, more func(*Config)) (d *Datapath, ifindex int, np model.L4Addr, be testBackend, cfg Config) {
	t.Helper()
	base := smallConfig
	if xdp {
		base = xdpConfig
	}
	set := func(c *Config) {
		c.SNATPortMin, c.SNATPortMax = 62000, 62001
		c.CTTimeoutSNATTimeWait = twTimeWait
		more(c)
	}
	d, ifindex, np, be = snatNode(t, v6, configWith(base, set))
	cfg = configWith(base, set)("").withDefaults()
	return d, ifindex, np, be, cfg
}

// twFlow is a source-NATed flow of twNode's: its client, the port it
// holds, and its keys.
type twFlow struct {
	client   string
	cport    uint16
	port     uint16
	fwd, rev ctK
}

// twClient is the client's address of np's family (nsClientIP,
// nsClientIP6), which the node has a route to: flows differ by port.
func twClient(np model.L4Addr) string { return ofFamily(np.Addr, nsClientIP, nsClientIP6).String() }

// twSYN is a SYN from client:cport to np.
func twSYN(np model.L4Addr, client string, cport uint16) packet.Packet {
	syn := nsClient(cport, np)
	syn.Src, syn.TCPFlags = addr(client), tcpSYN_
	return syn
}

// twOpen opens a flow from client:cport to np through tc: its SYN, then
// the backend's SYN-ACK.
func twOpen(t *testing.T, d *Datapath, ifindex int, np model.L4Addr, be testBackend, client string, cport uint16) twFlow {
	t.Helper()
	if v, _ := runOn(t, d.TCIngress(), ifindex, twSYN(np, client, cport).Bytes()); v != tcActRedirect {
		t.Fatalf("SYN of %s:%d: verdict %d", client, cport, v)
	}
	f := twFlow{client: client, cport: cport, port: snatPortIn(t, d, client, cport, np)}
	node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
	f.rev = ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, f.port, model.TCP, ctReverse)
	f.fwd = ctKeyOf(client, cport, np.Addr.String(), np.Port, model.TCP, ctForward)
	if v, _ := runOn(t, d.TCIngress(), ifindex, replyFrom(be, f.port, tcpSA).Bytes()); v != tcActRedirect {
		t.Fatalf("SYN-ACK to port %d: verdict %d", f.port, v)
	}
	return f
}

// twClose closes f as a backend that closes first does (and then holds
// the tuple in TIME_WAIT): its FIN, the client's FIN, its last ACK.
func twClose(t *testing.T, d *Datapath, ifindex int, np model.L4Addr, be testBackend, f twFlow) {
	t.Helper()
	fin := nsClient(f.cport, np)
	fin.Src, fin.TCPFlags = addr(f.client), tcpFA
	for _, p := range []packet.Packet{replyFrom(be, f.port, tcpFA), fin, replyFrom(be, f.port, tcpACK)} {
		if v, _ := runOn(t, d.TCIngress(), ifindex, p.Bytes()); v != tcActRedirect {
			t.Fatalf("closing the flow of port %d, flags %#x: verdict %d", f.port, p.TCPFlags, v)
		}
	}
}

// twShift moves the expiry of the entry under k by delta (negative: as if
// its last packet came that much earlier).
func twShift(t *testing.T, m *Maps, k ctK, delta time.Duration) {
	t.Helper()
	add := func(e *uint64) { *e = uint64(int64(*e) + delta.Nanoseconds()) }
	for _, cm := range ctTablesOf(t, m, k) {
		var found bool
		var err error
		if k.v6() {
			found, err = ctEdit(cm, k.k6(), func(v *tcCt6Entry) { add(&v.Expires) })
		} else {
			found, err = ctEdit(cm, k.k4(), func(v *sockCt4Entry) { add(&v.Expires) })
		}
		if err != nil {
			t.Fatal(err)
		}
		if found {
			return
		}
	}
	t.Fatalf("no conntrack entry %s", k)
}

// otherPort is the port of twNode's range that is not p.
func otherPort(p uint16) uint16 {
	if p == 62000 {
		return 62001
	}
	return 62000
}

// twAlive reports whether the entry under k is there and alive now.
func twAlive(t *testing.T, m *Maps, k ctK) (ctView, bool) {
	t.Helper()
	e, ok := ctLookup(t, m, k)
	return e, ok && int64(e.expires-clockNow(t)) > 0
}

// TestSNATClosedFlowHoldsPortForTimeWait: a source-NATed flow the backend
// closes first keeps both its entries, and so its port, the TIME_WAIT
// timeout (not the close timeout) after its last packet; the Go copy of
// the lifetimes (ctTimeouts, which the migrations judge by) says the same.
// Closed 30 s ago (past the close timeout of 10 s, within TIME_WAIT),
// the agent's GC keeps them, and new flows never get that port while the
// other is free (8 flows; before, the entries were dead by then and each
// new flow had the port with a chance of 1/2). Past the TIME_WAIT
// timeout, the GC deletes them.
func TestSNATClosedFlowHoldsPortForTimeWait(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, ifindex, np, be, cfg := twNode(t, v6, false)
		m := d.Maps()
		lo := clockNow(t)
		a := twOpen(t, d, ifindex, np, be, twClient(np), 44000)
		twClose(t, d, ifindex, np, be, a)
		hi := clockNow(t)
		closed := ctFlagSNAT | ctFlagFinFwd | ctFlagFinRev
		for _, k := range []ctK{a.fwd, a.rev} {
			ctExpiresWithin(t, m, k, closed, 0, twTimeWait, lo, hi, "closed source-NATed flow")
			e, _ := ctLookup(t, m, k)
			if seen := e.expires - cfg.ctTimeouts().lifetime(uint8(model.TCP), e.flags); seen+uint64(time.Second) < lo || seen > hi+uint64(time.Second) {
				t.Errorf("%s: ctTimeouts says it was last seen %v after the flow's close began, want within [0, %v]",
					k, time.Duration(int64(seen-lo)), time.Duration(int64(hi-lo)))
			}
		}

		for _, k := range []ctK{a.fwd, a.rev} {
			twShift(t, m, k, -30*time.Second)
		}
		if _, err := m.GCConntrack(); err != nil {
			t.Fatal(err)
		}
		for _, k := range []ctK{a.fwd, a.rev} {
			if _, ok := twAlive(t, m, k); !ok {
				t.Fatalf("%s: gone or dead 30 s after the close, want it kept for TIME_WAIT (%v)", k, twTimeWait)
			}
		}
		for i := range 8 {
			client, cport := twClient(np), uint16(45000+i)
			if v, _ := runOn(t, d.TCIngress(), ifindex, twSYN(np, client, cport).Bytes()); v != tcActRedirect {
				t.Fatalf("new flow %d: verdict %d, want it sent on (a port is free)", i, v)
			}
			if sp := snatPortIn(t, d, client, cport, np); sp == a.port {
				t.Fatalf("new flow %d got port %d, held for the closed flow's TIME_WAIT, while the other was free", i, sp)
			}
			ctRemove(t, m, ctKeyOf(client, cport, np.Addr.String(), np.Port, model.TCP, ctForward))
			node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
			ctRemove(t, m, ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, otherPort(a.port), model.TCP, ctReverse))
		}
		if cs := counters(t, d); cs["tc_snat_tw_reuse"] != 0 {
			t.Errorf("tc_snat_tw_reuse %d, want 0: a port was free", cs["tc_snat_tw_reuse"])
		}

		for _, k := range []ctK{a.fwd, a.rev} {
			twShift(t, m, k, -twTimeWait)
		}
		if _, err := m.GCConntrack(); err != nil {
			t.Fatal(err)
		}
		for _, k := range []ctK{a.fwd, a.rev} {
			if e, ok := ctLookup(t, m, k); ok {
				t.Errorf("%s: %+v still there past TIME_WAIT after a GC", k, e)
			}
		}
	})
}

// TestSNATTimeWaitTakenOverWhenExhausted: with every port of the range
// held, one by a live flow and one by a closed flow past its close
// timeout (in its TIME_WAIT extension), a new flow takes the closed
// flow's port over: the closed flow's entries go, the new flow's are
// there, counted tc_snat_tw_reuse. Then, both ports held by open flows,
// the next flow is refused (tc_snat_exhausted) as before. Through XDP,
// which leaves a flow it finds no free port for to tc, tc takes it over.
// Before, tc_snat_tw_reuse did not exist (and the closed flow's entries
// were dead 30 s after its close: any new flow had its port).
func TestSNATTimeWaitTakenOverWhenExhausted(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, xdp := range []bool{false, true} {
			t.Run(map[bool]string{false: "tc", true: "xdp"}[xdp], func(t *testing.T) { twTakeOver(t, v6, xdp) })
		}
	})
}

func twTakeOver(t *testing.T, v6, xdp bool) {
	d, ifindex, np, be, _ := twNode(t, v6, xdp)
	m := d.Maps()
	a := twOpen(t, d, ifindex, np, be, twClient(np), 44000)
	twClose(t, d, ifindex, np, be, a)
	for _, k := range []ctK{a.fwd, a.rev} {
		twShift(t, m, k, -30*time.Second)
	}
	b := twOpen(t, d, ifindex, np, be, twClient(np), 44001)
	if b.port == a.port {
		t.Fatalf("flow B got port %d of the closed flow A, while the other was free", b.port)
	}

	before := counters(t, d)
	client, cport := twClient(np), uint16(44002)
	syn := twSYN(np, client, cport)
	if xdp {
		if v, _ := runXDP(t, d.XDP(), ifindex, syn.Bytes()); v != xdpPass {
			t.Fatalf("flow C through XDP: verdict %d, want it left to tc (%d)", v, xdpPass)
		}
	}
	if v, _ := runOn(t, d.TCIngress(), ifindex, syn.Bytes()); v != tcActRedirect {
		t.Fatalf("flow C: verdict %d, want it sent on from the port A holds for TIME_WAIT", v)
	}
	if sp := snatPortIn(t, d, client, cport, np); sp != a.port {
		t.Errorf("flow C got port %d, want %d, A's", sp, a.port)
	}
	after := counters(t, d)
	if got := after["tc_snat_tw_reuse"] - before["tc_snat_tw_reuse"]; got != 1 {
		t.Errorf("tc_snat_tw_reuse +%d, want +1", got)
	}
	if got := after["tc_snat_exhausted"] - before["tc_snat_exhausted"]; got != 0 {
		t.Errorf("tc_snat_exhausted +%d, want +0", got)
	}
	if e, ok := ctLookup(t, m, a.fwd); ok {
		t.Errorf("A's forward entry %+v still there after its port was taken over", e)
	}
	if e, ok := twAlive(t, m, a.rev); !ok || ctClosed(e.flags) || e.snat.Addr().String() != client || e.snat.Port() != cport {
		t.Errorf("reply entry of port %d: %+v (alive %v), want flow C's, open, naming %s:%d", a.port, e, ok, client, cport)
	}
	for _, k := range []ctK{b.fwd, b.rev} {
		if _, ok := twAlive(t, m, k); !ok {
			t.Errorf("B's entry %s gone", k)
		}
	}

	before = after
	client, cport = twClient(np), 44003
	if v, _ := runOn(t, d.TCIngress(), ifindex, twSYN(np, client, cport).Bytes()); v != tcActShot {
		t.Errorf("flow D, both ports held by open flows: verdict %d, want it refused (drop)", v)
	}
	after = counters(t, d)
	if got := after["tc_snat_exhausted"] - before["tc_snat_exhausted"]; got != 1 {
		t.Errorf("flow D refused: tc_snat_exhausted +%d, want +1", got)
	}
	if got := after["tc_snat_tw_reuse"] - before["tc_snat_tw_reuse"]; got != 0 {
		t.Errorf("flow D refused: tc_snat_tw_reuse +%d, want +0", got)
	}
}

// TestSNATTimeWaitNotTakenWithinCloseTimeout: a closed source-NATed flow
// within its close timeout (just closed) holds its port as a closed flow
// always did: with the range's other port held by an open flow, a new
// flow is refused (tc_snat_exhausted), not given it. (The same before the
// change: this guards the take-over's bound.)
func TestSNATTimeWaitNotTakenWithinCloseTimeout(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, ifindex, np, be, _ := twNode(t, v6, false)
		m := d.Maps()
		a := twOpen(t, d, ifindex, np, be, twClient(np), 44000)
		twClose(t, d, ifindex, np, be, a)
		twOpen(t, d, ifindex, np, be, twClient(np), 44001)
		before := counters(t, d)
		if v, _ := runOn(t, d.TCIngress(), ifindex, twSYN(np, twClient(np), 44002).Bytes()); v != tcActShot {
			t.Errorf("new flow: verdict %d, want it refused: the closed flow is within its close timeout", v)
		}
		after := counters(t, d)
		if after["tc_snat_exhausted"]-before["tc_snat_exhausted"] != 1 || after["tc_snat_tw_reuse"] != before["tc_snat_tw_reuse"] {
			t.Errorf("tc_snat_exhausted +%d, tc_snat_tw_reuse +%d; want +1 and +0", after["tc_snat_exhausted"]-before["tc_snat_exhausted"],
				after["tc_snat_tw_reuse"]-before["tc_snat_tw_reuse"])
		}
		for _, k := range []ctK{a.fwd, a.rev} {
			if _, ok := twAlive(t, m, k); !ok {
				t.Errorf("closed flow's entry %s gone", k)
			}
		}
	})
}

// TestSNATTimeWaitClientReusesPort: a SYN of the closed flow's own client
// from its own port (a client reusing its port) opens a new flow, as a
// SYN on a closed flow's forward entry always did: sent on, from the
// range's free port, its forward entry open, the closed flow's port
// reservation gone with the flow it superseded. Within the close timeout
// and past it (in TIME_WAIT).
func TestSNATTimeWaitClientReusesPort(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, ago := range []time.Duration{0, 30 * time.Second} {
			t.Run(fmt.Sprintf("closed %v ago", ago), func(t *testing.T) {
				d, ifindex, np, be, _ := twNode(t, v6, false)
				m := d.Maps()
				a := twOpen(t, d, ifindex, np, be, twClient(np), 44000)
				twClose(t, d, ifindex, np, be, a)
				for _, k := range []ctK{a.fwd, a.rev} {
					twShift(t, m, k, -ago)
				}
				if v, _ := runOn(t, d.TCIngress(), ifindex, twSYN(np, a.client, a.cport).Bytes()); v != tcActRedirect {
					t.Fatalf("the client's new SYN from its port: verdict %d, want it sent on", v)
				}
				sp := snatPortIn(t, d, a.client, a.cport, np)
				if sp == a.port {
					t.Errorf("the new flow got port %d, held for TIME_WAIT, while the other was free", sp)
				}
				if e, ok := twAlive(t, m, a.fwd); !ok || ctClosed(e.flags) {
					t.Errorf("forward entry %+v (alive %v), want the new flow's, open", e, ok)
				}
				if e, ok := ctLookup(t, m, a.rev); ok {
					t.Errorf("the superseded flow's port reservation %+v still there", e)
				}
			})
		}
	})
}

// TestClosedFlowNotSNATKeepsCloseTimeout: a flow that is not
// source-NATed (a ClusterIP's), closed by a FIN each way, lives the close
// timeout, not TIME_WAIT's.
func TestClosedFlowNotSNATKeepsCloseTimeout(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		a, vip := twinOf(v6), twinL4(v6, vipTCP)
		d := newTestDatapath(t)
		m := d.Maps()
		addService(t, m, 1, vip, testBackend{161, l4(a("10.1.16.1"), 8080, model.TCP)})
		f := flow{a("10.0.16.1"), 48000, vip}
		be := establish(t, d, f, testBackend{161, l4(a("10.1.16.1"), 8080, model.TCP)})
		lo := clockNow(t)
		if v, _ := runProg(t, d.TCEgress(), f.from(be.addr, tcpFA).Bytes()); v != tcActOK {
			t.Fatalf("backend's FIN: verdict %d", v)
		}
		if v, _ := runProg(t, d.TCIngress(), f.pkt(tcpFA).Bytes()); v != tcActOK {
			t.Fatalf("client's FIN: verdict %d", v)
		}
		hi := clockNow(t)
		cfg := m.cfg.withDefaults()
		if cfg.CTTimeoutClose == cfg.CTTimeoutSNATTimeWait {
			t.Fatalf("close timeout and TIME_WAIT both %v: the test tells nothing", cfg.CTTimeoutClose)
		}
		for _, k := range []ctK{f.fwdKey(), f.revKey(be.addr)} {
			ctExpiresWithin(t, m, k, ctFlagFinFwd|ctFlagFinRev, ctFlagSNAT, cfg.CTTimeoutClose, lo, hi, "closed flow not source-NATed")
		}
	})
}

// TestSNATTimeWaitConfig: the TIME_WAIT timeout's default is the BPF
// objects' (config.h), 120 s as netfilter's; Config's reaches the loaded
// programs (tc's of both families); one shorter than the close
// timeout is taken as the close timeout (no extension).
func TestSNATTimeWaitConfig(t *testing.T) {
	if DefaultCTTimeoutSNATTW != 120*time.Second {
		t.Errorf("default TIME_WAIT %v, want 120s (nf_conntrack_tcp_timeout_time_wait)", DefaultCTTimeoutSNATTW)
	}
	for obj, spec := range loadSpecs(t) {
		vs := spec.Variables["ct_timeout_snat_tw_ns"]
		if vs == nil {
			continue // an object without conntrack
		}
		var got uint64
		if err := vs.Get(&got); err != nil || time.Duration(got) != DefaultCTTimeoutSNATTW {
			t.Errorf("%s: ct_timeout_snat_tw_ns = %v (%v), want %v", obj, time.Duration(got), err, DefaultCTTimeoutSNATTW)
		}
	}
	if c := (Config{CTTimeoutClose: 3 * time.Minute, CTTimeoutSNATTimeWait: time.Minute}).withDefaults(); c.CTTimeoutSNATTimeWait != 3*time.Minute {
		t.Errorf("TIME_WAIT 1m below a close timeout of 3m: %v, want 3m", c.CTTimeoutSNATTimeWait)
	}
	finned := ctFlagFinFwd | ctFlagFinRev
	if tm := (Config{}).ctTimeouts(); tm.lifetime(uint8(model.TCP), ctFlagSNAT|finned) != uint64(DefaultCTTimeoutSNATTW) ||
		tm.lifetime(uint8(model.TCP), finned) != uint64(DefaultCTTimeoutClose) ||
		tm.lifetime(uint8(model.TCP), ctFlagSNAT|ctFlagRSTRev) != uint64(DefaultCTTimeoutClose) ||
		tm.lifetime(uint8(model.TCP), ctFlagSNAT|finned|ctFlagRSTFwd) != uint64(DefaultCTTimeoutClose) ||
		tm.lifetime(uint8(model.TCP), ctFlagSNAT|ctFlagReplied) != uint64(DefaultCTTimeoutTCP) {
		t.Errorf("ctTimeouts.lifetime: FIN-closed SNAT %v, FIN-closed %v, RST-closed SNAT %v, FIN-closed then RST SNAT %v, open SNAT %v",
			time.Duration(tm.lifetime(uint8(model.TCP), ctFlagSNAT|finned)), time.Duration(tm.lifetime(uint8(model.TCP), finned)),
			time.Duration(tm.lifetime(uint8(model.TCP), ctFlagSNAT|ctFlagRSTRev)),
			time.Duration(tm.lifetime(uint8(model.TCP), ctFlagSNAT|finned|ctFlagRSTFwd)),
			time.Duration(tm.lifetime(uint8(model.TCP), ctFlagSNAT|ctFlagReplied)))
	}

	d := openTestWith(t, smallConfig, func(c *Config) { c.CTTimeoutSNATTimeWait = 75 * time.Second })
	off := rodataOffset(t, "ct_timeout_snat_tw_ns")
	for _, prog := range []struct {
		name string
		p    *ebpf.Program
	}{{"sluice_ingress", d.tc.SluiceIngress}, {"sluice6_ingress", d.tc.Sluice6Ingress}} {
		rodata := loadedRodata(t, prog.p)
		if got := time.Duration(binary.LittleEndian.Uint64(rodata[off : off+8])); got != 75*time.Second {
			t.Errorf("ct_timeout_snat_tw_ns of the loaded %s = %v, want 75s", prog.name, got)
		}
	}
}

// TestSNATTimeWaitTakenOverWhenTableFull: with the table of established
// flows full (64 entries: a closed source-NATed flow 30 s into its
// TIME_WAIT extension, and 62 live entries of other flows) and the
// range's other port free, a new flow takes the closed flow's port over
// (its 2 entries deleted, 1 inserted), counted tc_snat_tw_reuse, as
// netfilter early-drops a TIME_WAIT conntrack when its table is full.
// Before, the try of the free port met the full table (-E2BIG) and the
// search gave up at once: the SYN dropped, tc_ct_est_full +1. Then, the
// table full of live entries only, the next flow is refused as before
// (tc_ct_est_full).
func TestSNATTimeWaitTakenOverWhenTableFull(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, ifindex, np, be, _ := twNodeWith(t, v6, false, func(c *Config) { c.MaxConntrack = 64 })
		m := d.Maps()
		a := twOpen(t, d, ifindex, np, be, twClient(np), 44000)
		twClose(t, d, ifindex, np, be, a)
		for _, k := range []ctK{a.fwd, a.rev} {
			twShift(t, m, k, -30*time.Second)
		}
		est := ctTablesOf(t, m, a.fwd)[0]
		other := twinOf(v6)("10.0.99.1")
		dst := twinOf(v6)("10.96.99.1")
		expires := clockNow(t) + uint64(time.Hour)
		for i := range 64 - mapLen(t, est) {
			k := ctKeyOf(other, uint16(30000+i), dst, 53, model.UDP, ctForward)
			var err error
			if v6 {
				key, v := k.k6(), tcCt6Entry{Expires: expires}
				err = est.Update(&key, &v, ebpf.UpdateNoExist)
			} else {
				key, v := k.k4(), sockCt4Entry{Expires: expires}
				err = est.Update(&key, &v, ebpf.UpdateNoExist)
			}
			if err != nil {
				t.Fatalf("filling the table, entry %d: %v", i, err)
			}
		}
		if n := mapLen(t, est); n != 64 {
			t.Fatalf("%d entries in the established table, want it full (64)", n)
		}

		before := counters(t, d)
		client, cport := twClient(np), uint16(44002)
		if v, _ := runOn(t, d.TCIngress(), ifindex, twSYN(np, client, cport).Bytes()); v != tcActRedirect {
			t.Fatalf("new flow, table full: verdict %d, want it sent on from the port the closed flow holds for TIME_WAIT", v)
		}
		if sp := snatPortIn(t, d, client, cport, np); sp != a.port {
			t.Errorf("new flow got port %d, want %d, the closed flow's", sp, a.port)
		}
		after := counters(t, d)
		if got := after["tc_snat_tw_reuse"] - before["tc_snat_tw_reuse"]; got != 1 {
			t.Errorf("tc_snat_tw_reuse +%d, want +1", got)
		}
		if got := after["tc_ct_est_full"] - before["tc_ct_est_full"]; got != 0 {
			t.Errorf("tc_ct_est_full +%d, want +0", got)
		}
		if e, ok := ctLookup(t, m, a.fwd); ok {
			t.Errorf("the closed flow's forward entry %+v still there after its port was taken over", e)
		}
		if e, ok := twAlive(t, m, a.rev); !ok || ctClosed(e.flags) || e.snat.Addr().String() != client || e.snat.Port() != cport {
			t.Errorf("reply entry of port %d: %+v (alive %v), want the new flow's, open, naming %s:%d", a.port, e, ok, client, cport)
		}

		// The table full again, of live entries only: refused as before.
		k := ctKeyOf(other, 29999, dst, 53, model.UDP, ctForward)
		var err error
		if v6 {
			key, v := k.k6(), tcCt6Entry{Expires: expires}
			err = est.Update(&key, &v, ebpf.UpdateNoExist)
		} else {
			key, v := k.k4(), sockCt4Entry{Expires: expires}
			err = est.Update(&key, &v, ebpf.UpdateNoExist)
		}
		if err != nil {
			t.Fatal(err)
		}
		before = after
		if v, _ := runOn(t, d.TCIngress(), ifindex, twSYN(np, client, cport+1).Bytes()); v != tcActShot {
			t.Errorf("next flow, table full of live entries: verdict %d, want it refused (drop)", v)
		}
		after = counters(t, d)
		if after["tc_ct_est_full"]-before["tc_ct_est_full"] != 1 || after["tc_snat_tw_reuse"] != before["tc_snat_tw_reuse"] {
			t.Errorf("next flow refused: tc_ct_est_full +%d, tc_snat_tw_reuse +%d; want +1 and +0",
				after["tc_ct_est_full"]-before["tc_ct_est_full"], after["tc_snat_tw_reuse"]-before["tc_snat_tw_reuse"])
		}
	})
}

// TestSNATRSTClosedKeepsCloseTimeout: a source-NATed flow closed by a
// RST lives the close timeout, not TIME_WAIT's (a RST leaves no
// TIME_WAIT on the backend; netfilter sends a RST to CLOSE): a refused
// connection (the backend answers the SYN with RST|ACK), an established
// flow the backend resets, and a flow the backend closed first with FINs
// that the client then resets (its TIME_WAIT extension cut short). A
// flow whose RST was challenged (the client's bare ACK after the
// backend's RST) keeps the SYN timeout. Before, the RST-closed flows
// lived TIME_WAIT's timeout.
func TestSNATRSTClosedKeepsCloseTimeout(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d, ifindex, np, be, cfg := twNode(t, v6, false)
		m := d.Maps()
		if cfg.CTTimeoutClose == twTimeWait {
			t.Fatalf("close timeout and TIME_WAIT both %v: the test tells nothing", twTimeWait)
		}
		clientPkt := func(f twFlow, flags uint8) packet.Packet {
			p := nsClient(f.cport, np)
			p.Src, p.TCPFlags = addr(f.client), flags
			return p
		}
		send := func(what string, p packet.Packet) {
			t.Helper()
			if v, _ := runOn(t, d.TCIngress(), ifindex, p.Bytes()); v != tcActRedirect {
				t.Fatalf("%s: verdict %d", what, v)
			}
		}
		expect := func(f twFlow, want, no uint32, life time.Duration, lo, hi uint64, what string) {
			t.Helper()
			for _, k := range []ctK{f.fwd, f.rev} {
				ctExpiresWithin(t, m, k, want, no, life, lo, hi, what)
			}
		}

		// Refused: SYN, RST|ACK.
		client := twClient(np)
		send("refused flow's SYN", twSYN(np, client, 44100))
		r := twFlow{client: client, cport: 44100, port: snatPortIn(t, d, client, 44100, np)}
		node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
		r.rev = ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, r.port, model.TCP, ctReverse)
		r.fwd = ctKeyOf(client, 44100, np.Addr.String(), np.Port, model.TCP, ctForward)
		lo := clockNow(t)
		send("backend's RST|ACK", replyFrom(be, r.port, tcpRST|tcpACK))
		hi := clockNow(t)
		expect(r, ctFlagSNAT|ctFlagRSTRev, 0, cfg.CTTimeoutClose, lo, hi, "refused source-NATed flow")
		for _, k := range []ctK{r.fwd, r.rev} {
			ctRemove(t, m, k)
		}

		// Established, reset by the backend.
		e := twOpen(t, d, ifindex, np, be, client, 44101)
		lo = clockNow(t)
		send("backend's RST", replyFrom(be, e.port, tcpRST))
		hi = clockNow(t)
		expect(e, ctFlagSNAT|ctFlagRSTRev, 0, cfg.CTTimeoutClose, lo, hi, "RST-closed source-NATed flow")

		// Reset by the backend, the RST challenged by the client's bare
		// ACK: open again, the SYN timeout.
		lo = clockNow(t)
		send("client's bare ACK", clientPkt(e, tcpACK))
		hi = clockNow(t)
		expect(e, ctFlagSNAT|ctFlagChalRev, ctFlagRST, cfg.CTTimeoutSYN, lo, hi, "challenged source-NATed flow")
		for _, k := range []ctK{e.fwd, e.rev} {
			ctRemove(t, m, k)
		}

		// Closed with FINs (TIME_WAIT), then reset by the client.
		f := twOpen(t, d, ifindex, np, be, client, 44102)
		twClose(t, d, ifindex, np, be, f)
		lo = clockNow(t)
		send("client's RST after the close", clientPkt(f, tcpRST))
		hi = clockNow(t)
		expect(f, ctFlagSNAT|ctFlagFinFwd|ctFlagFinRev|ctFlagRSTFwd, 0, cfg.CTTimeoutClose, lo, hi, "FIN-closed source-NATed flow, then reset")
	})
}
