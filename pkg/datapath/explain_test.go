package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Dry runs of the tc program (bpf/lib/explain.h): what the program says it
// would do, and that it writes nothing while saying it. The live path is
// the packet tables' (tc_test.go and the others), which run the same
// programs unchanged.

// dumpTCMaps renders every map of the tc object but the dry-run record and
// program array (which a dry run writes, or which hold no data): the state
// a dry run must leave as it found it.
func dumpTCMaps(t *testing.T, d *Datapath) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, m := range objectsOf[*ebpf.Map](&d.tc) {
		if name == "sluice_expl_v1" || name == "sluice_expl6_v1" || name == "sluice_dry_v1" {
			continue
		}
		out[name] = testutil.DumpMap(t, name, m)
	}
	return out
}

// diffDumps names the maps whose dumps differ.
func diffDumps(before, after map[string]string) []string {
	var changed []string
	for _, name := range slices.Sorted(maps.Keys(before)) {
		if before[name] != after[name] {
			changed = append(changed, name)
		}
	}
	return changed
}

// explainDev is the device the explain tests' packets arrive on: its
// ifindex (0: none) and MAC.
type explainDev struct {
	ifindex int
	mac     [6]byte
}

// noDev is no device, as the packet tables' runProg.
var noDev = explainDev{mac: nodeMAC}

// frameOf is the explain frame of a packet from..to arriving on dev.
func frameOf(t *testing.T, dev explainDev, proto uint8, from, to string) []byte {
	t.Helper()
	frame, err := explainFrame(ExplainRequest{From: netip.MustParseAddrPort(from), To: netip.MustParseAddrPort(to), Proto: proto}, dev.mac[:])
	if err != nil {
		t.Fatal(err)
	}
	return frame
}

// dryRun explains a packet from..to through d's ingress program.
func dryRun(t *testing.T, d *Datapath, proto uint8, from, to string) (*Explanation, error) {
	return dryRunOn(t, d, noDev, proto, from, to)
}

// dryRunOn is dryRun for a packet arriving on dev.
func dryRunOn(t *testing.T, d *Datapath, dev explainDev, proto uint8, from, to string) (*Explanation, error) {
	t.Helper()
	frame := frameOf(t, dev, proto, from, to)
	// The record maps as sluicectl finds them: among the attached
	// program's.
	rec, err := explainMap(d.tc.SluiceIngress, explainMapName, binary.Size(sockExplainRecord{}))
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	var rec6 *ebpf.Map
	if netip.MustParseAddrPort(to).Addr().Is6() {
		if rec6, err = explainMap(d.tc.SluiceIngress, explain6MapName, binary.Size(sockExplain6Record{})); err != nil {
			t.Fatal(err)
		}
		defer rec6.Close()
	}
	return runExplain(d.tc.SluiceIngress, "sluice_ingress", rec, rec6, dev.ifindex, frame)
}

// mustDryRun is dryRun that must succeed and change no map.
func mustDryRun(t *testing.T, d *Datapath, proto uint8, from, to string) *Explanation {
	t.Helper()
	return mustDryRunOn(t, d, noDev, proto, from, to)
}

// mustDryRunOn is mustDryRun for a packet arriving on dev.
func mustDryRunOn(t *testing.T, d *Datapath, dev explainDev, proto uint8, from, to string) *Explanation {
	t.Helper()
	before := dumpTCMaps(t, d)
	e, err := dryRunOn(t, d, dev, proto, from, to)
	if err != nil {
		t.Fatalf("explain %s -> %s: %v", from, to, err)
	}
	if changed := diffDumps(before, dumpTCMaps(t, d)); len(changed) > 0 {
		t.Fatalf("explain %s -> %s changed %v", from, to, changed)
	}
	return e
}

// liveRun sends the same packet through the program without the mark.
func liveRun(t *testing.T, d *Datapath, proto uint8, from, to string) (uint32, netip.AddrPort) {
	t.Helper()
	return liveRunOn(t, d, noDev, proto, from, to)
}

// liveRunOn is liveRun for a packet arriving on dev.
func liveRunOn(t *testing.T, d *Datapath, dev explainDev, proto uint8, from, to string) (uint32, netip.AddrPort) {
	t.Helper()
	ret, out := runOn(t, d.tc.SluiceIngress, dev.ifindex, frameOf(t, dev, proto, from, to))
	_, dst := frameAddrs(out)
	return ret, dst
}

// explainFamily is what the explain tests send, in one family: the tests
// run once per family, through the IPv4 program or its IPv6 one (and
// their dry twins), whose answers must agree.
type explainFamily struct {
	name                   string
	client, other          string // a client; an address no frontend has
	vipTCP, vipUDP, empty  model.L4Addr
	beTCP, beUDP           model.L4Addr
	affVIP                 model.L4Addr
	affBEs                 []model.L4Addr
	lb                     model.L4Addr // a LoadBalancer IP whose source ranges leave client out
	allowed, allowedClient string       // lb's source range, a client in it
}

var explainFamilies = []explainFamily{
	{name: "IPv4", client: "10.0.0.1", other: "192.0.2.1",
		vipTCP: vipTCP, vipUDP: vipUDP, empty: vipEmpty, beTCP: beTCP.addr, beUDP: beUDP.addr,
		affVIP: affVIP, affBEs: affBEs,
		lb: l4("192.0.2.10", 443, model.TCP), allowed: "198.51.100.0/24", allowedClient: "198.51.100.7"},
	{name: "IPv6", client: client6, other: "2001:db8:ff::1",
		vipTCP: vip6TCP, vipUDP: vip6UDP, empty: vip6Empty, beTCP: be6TCP, beUDP: be6UDP,
		affVIP: l4("2001:db8:96::30", 80, model.TCP),
		affBEs: []model.L4Addr{l4("2001:db8:1::41", 8080, model.TCP), l4("2001:db8:1::42", 8080, model.TCP),
			l4("2001:db8:1::43", 8080, model.TCP), l4("2001:db8:1::44", 8080, model.TCP)},
		lb: l4("2001:db8:200::10", 443, model.TCP), allowed: "2001:db8:77::/48", allowedClient: "2001:db8:77::7"},
}

// at is addr:port as explain takes it ([addr]:port for IPv6).
func at(addr string, port uint16) string {
	return netip.AddrPortFrom(netip.MustParseAddr(addr), port).String()
}

// fe is l4's address and port as explain takes them.
func fe(a model.L4Addr) string { return netip.AddrPortFrom(a.Addr, a.Port).String() }

// forEachFamily runs f as a subtest per family.
func forEachFamily(t *testing.T, f func(t *testing.T, fam explainFamily)) {
	for _, fam := range explainFamilies {
		t.Run(fam.name, func(t *testing.T) { f(t, fam) })
	}
}

func TestExplainNewFlowThenConntrack(t *testing.T) {
	forEachFamily(t, func(t *testing.T, fam explainFamily) {
		testutil.Privileged(t)
		cfg := smallConfig(testPinDir(t))
		cfg.ServiceMetrics = true // per-Service counters must not move either
		d := openTest(t, cfg)
		applyServices(t, d, clusterIP(fam.vipTCP, fam.beTCP), clusterIP(fam.vipUDP, fam.beUDP))
		from, to := at(fam.client, 40000), fe(fam.vipTCP)

		e := mustDryRun(t, d, unix.IPPROTO_TCP, from, to)
		want := netip.AddrPortFrom(fam.beTCP.Addr, fam.beTCP.Port)
		if !e.Frontend || e.FrontendAddr.String() != to || !e.NewFlow || e.ConntrackHit ||
			!e.DNAT || e.Backend != want || e.Slot != 1 || e.ScopeCount != 1 || e.Verdict != "pass" || e.OutDst != want {
			t.Fatalf("new flow: %+v", e)
		}
		if !slices.Equal(e.Reasons, []string{"tc_dnat_new"}) {
			t.Errorf("new flow reasons %v, want [tc_dnat_new]", e.Reasons)
		}

		// The same packet without the mark does write: the dumps see it.
		before := dumpTCMaps(t, d)
		if ret, dst := liveRun(t, d, unix.IPPROTO_TCP, from, to); ret != tcActOK || dst != want {
			t.Fatalf("live run: verdict %d to %s", ret, dst)
		}
		// The new flow is half-open in the established table (the
		// half-open share has room), and counted there.
		ct, metrics := mapConntrack, mapMetrics
		if fam.vipTCP.Addr.Is6() {
			ct = mapConntrack6
		}
		changed := diffDumps(before, dumpTCMaps(t, d))
		for _, m := range []string{ct, mapCTPcpu, metrics, mapSvcStats} {
			if !slices.Contains(changed, m) {
				t.Fatalf("a live new flow changed %v, want %s among them", changed, m)
			}
		}

		e = mustDryRun(t, d, unix.IPPROTO_TCP, from, to)
		if !e.ConntrackHit || e.NewFlow || e.Backend != want || e.Slot != 0 || !slices.Equal(e.Reasons, []string{"tc_dnat_ct"}) {
			t.Fatalf("existing flow: %+v", e)
		}

		// UDP, and a reply of the TCP flow.
		e = mustDryRun(t, d, unix.IPPROTO_UDP, at(fam.client, 5300), fe(fam.vipUDP))
		if !e.NewFlow || e.Backend != netip.AddrPortFrom(fam.beUDP.Addr, fam.beUDP.Port) {
			t.Fatalf("udp: %+v", e)
		}
		e = mustDryRun(t, d, unix.IPPROTO_TCP, want.String(), from)
		if !e.Reply || e.FrontendAddr.String() != to || e.OutSrc != e.FrontendAddr {
			t.Fatalf("reply: %+v", e)
		}
	})
}

func TestExplainRejectAndNoService(t *testing.T) {
	forEachFamily(t, func(t *testing.T, fam explainFamily) {
		d := newTestDatapath(t)
		applyServices(t, d, clusterIP(fam.vipTCP, fam.beTCP), clusterIP(fam.empty))
		from := at(fam.client, 40000)

		e := mustDryRun(t, d, unix.IPPROTO_TCP, from, fe(fam.empty))
		if !e.Frontend || e.DNAT || e.Verdict != "reject" || !slices.Equal(e.Reasons, []string{"tc_no_backend"}) {
			t.Fatalf("empty service: %+v", e)
		}
		e = mustDryRun(t, d, unix.IPPROTO_TCP, from, at(fam.vipTCP.Addr.String(), 81))
		if e.Frontend || e.Verdict != "reject" || !slices.Equal(e.Reasons, []string{"tc_unknown_port"}) {
			t.Fatalf("unknown port: %+v", e)
		}
		e = mustDryRun(t, d, unix.IPPROTO_TCP, from, at(fam.other, 80))
		if e.Frontend || e.Verdict != "pass" || len(e.Reasons) != 0 {
			t.Fatalf("no service: %+v", e)
		}
		// From a source of no single host the kernel sends no error
		// (icmp.h): a drop, under the same reason.
		bad := "0.0.0.0"
		if netip.MustParseAddr(fam.client).Is6() {
			bad = "::"
		}
		e = mustDryRun(t, d, unix.IPPROTO_TCP, at(bad, 40000), fe(fam.empty))
		if e.Verdict != "drop" || !slices.Equal(e.Reasons, []string{"tc_no_backend"}) {
			t.Fatalf("empty service from %s: %+v", bad, e)
		}
	})
}

// TestExplainRateLimited: once a client's port unreachables are spent
// (the kernel's burst of 6, icmp.h's rate limits), explain says the next
// packet is dropped, under tc_icmp_ratelimited and its own reason, as the
// live program does; its dry run reads the buckets and changes neither
// (mustDryRun). Another client is still rejected.
func TestExplainRateLimited(t *testing.T) {
	forEachFamily(t, func(t *testing.T, fam explainFamily) {
		d := openTestWith(t, smallConfig, slowRefill)
		applyServices(t, d, clusterIP(fam.empty))
		from := at(fam.client, 40000)
		for i := range 6 {
			if v, _ := liveRun(t, d, unix.IPPROTO_TCP, from, fe(fam.empty)); v != tcActRedirect {
				t.Fatalf("live packet %d: verdict %d, want the port unreachable", i, v)
			}
		}
		e := mustDryRun(t, d, unix.IPPROTO_TCP, from, fe(fam.empty))
		if e.Verdict != "drop" || !slices.Equal(e.Reasons, []string{"tc_icmp_ratelimited", "tc_no_backend"}) {
			t.Fatalf("client over its rate limit: %+v", e)
		}
		if v, _ := liveRun(t, d, unix.IPPROTO_TCP, from, fe(fam.empty)); v != tcActShot {
			t.Errorf("live packet 7: verdict %d, want drop", v)
		}
		e = mustDryRun(t, d, unix.IPPROTO_TCP, at(fam.allowedClient, 40000), fe(fam.empty))
		if e.Verdict != "reject" || !slices.Equal(e.Reasons, []string{"tc_no_backend"}) {
			t.Fatalf("another client: %+v", e)
		}
	})
}

// TestExplainSourceRanges: a LoadBalancer IP whose
// loadBalancerSourceRanges leave the client out is a drop; a client in
// them reaches the backend.
func TestExplainSourceRanges(t *testing.T) {
	forEachFamily(t, func(t *testing.T, fam explainFamily) {
		d := newTestDatapath(t)
		lb := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: "lb"}, Kind: model.LoadBalancer, Frontend: fam.lb,
			Backends:     []model.Backend{{L4Addr: fam.beTCP}},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix(fam.allowed)}}
		applyServices(t, d, lb)

		e := mustDryRun(t, d, unix.IPPROTO_TCP, at(fam.client, 40000), fe(fam.lb))
		if !e.Frontend || e.SvcFlags&uint32(sockSvcFlagsSVC_F_SRC_RANGES) == 0 || e.DNAT || e.Verdict != "drop" ||
			!slices.Equal(e.Reasons, []string{"tc_src_range_deny"}) {
			t.Fatalf("client outside the ranges: %+v", e)
		}
		e = mustDryRun(t, d, unix.IPPROTO_TCP, at(fam.allowedClient, 40000), fe(fam.lb))
		if !e.DNAT || e.Backend != netip.AddrPortFrom(fam.beTCP.Addr, fam.beTCP.Port) || e.Verdict == "drop" {
			t.Fatalf("client in the ranges: %+v", e)
		}
	})
}

func TestExplainAffinity(t *testing.T) {
	forEachFamily(t, func(t *testing.T, fam explainFamily) {
		d := newTestDatapath(t)
		applyServices(t, d, affinityService(fam.affVIP, time.Hour, fam.affBEs...))
		vip := fe(fam.affVIP)

		// Before the client's first flow: no entry, a random pick.
		e := mustDryRun(t, d, unix.IPPROTO_TCP, at(fam.client, 40000), vip)
		if e.AffinityHit || !e.NewFlow || e.SvcFlags&uint32(sockSvcFlagsSVC_F_AFFINITY) == 0 {
			t.Fatalf("first: %+v", e)
		}
		_, first := liveRun(t, d, unix.IPPROTO_TCP, at(fam.client, 40000), vip)
		for port := range 8 {
			e := mustDryRun(t, d, unix.IPPROTO_TCP, at(fam.client, uint16(41000+port)), vip)
			if !e.AffinityHit || e.Backend != first {
				t.Fatalf("flow %d: %+v, want the affinity backend %s", port, e, first)
			}
		}
	})
}

// TestExplainNorthSouth: a NodePort whose backend is on another node
// (nodeNetns, and addNodeIPv6 for IPv6), asked through eth0's program: the
// new flow is DNATed and source-NATed to the node's address with a free
// port of the SNAT range, and redirected; once a live SYN made the flow,
// its conntrack entry decides, and its backend's reply is sent back to
// the client from the NodePort.
func TestExplainNorthSouth(t *testing.T) {
	type nodePort struct{ node, client, backend string }
	cases := map[string]nodePort{
		"IPv4": {nsNodeIP, nsClientIP, "10.2.0.7"},
		"IPv6": {nsNodeIP6, nsClientIP6, "2001:db8:2::7"},
	}
	forEachFamily(t, func(t *testing.T, fam explainFamily) {
		c := cases[fam.name]
		testutil.Privileged(t)
		_, ifindex := nodeNetns(t)
		if fam.name == "IPv6" {
			addNodeIPv6(t)
		}
		d := openTest(t, smallConfig(testPinDir(t)))
		if err := d.AttachDevices([]string{"eth0"}); err != nil {
			t.Fatal(err)
		}
		np := l4(c.node, 30080, model.TCP)
		be := testBackend{11, l4(c.backend, 8080, model.TCP)}
		addExternal(t, d.Maps(), 11, np, reconciler.FlagExternal, be)
		dev := explainDev{ifindex: ifindex, mac: macOf(nodeEthMAC)}
		from, to, beAt := at(c.client, 40000), fe(np), netip.AddrPortFrom(be.addr.Addr, be.addr.Port)

		e := mustDryRunOn(t, d, dev, unix.IPPROTO_TCP, from, to)
		sp := e.SNATTo.Port()
		if !e.Frontend || e.SvcFlags&uint32(sockSvcFlagsSVC_F_EXTERNAL) == 0 || !e.Outside || !e.NewFlow || e.Backend != beAt ||
			!e.SNAT || e.SNATTo.Addr() != addr(c.node) || sp < DefaultSNATPortMin || sp > DefaultSNATPortMax ||
			e.Verdict != "redirect" || e.OutSrc != e.SNATTo || e.OutDst != beAt || !slices.Contains(e.Reasons, "tc_snat_new") {
			t.Fatalf("new flow: %+v", e)
		}

		if ret, dst := liveRunOn(t, d, dev, unix.IPPROTO_TCP, from, to); ret != tcActRedirect || dst != beAt {
			t.Fatalf("live SYN: verdict %d to %s", ret, dst)
		}
		e = mustDryRunOn(t, d, dev, unix.IPPROTO_TCP, from, to)
		if !e.ConntrackHit || e.NewFlow || e.Backend != beAt || !e.SNAT || e.SNATTo.Addr() != addr(c.node) || e.Verdict != "redirect" {
			t.Fatalf("the flow's next packet: %+v", e)
		}
		e = mustDryRunOn(t, d, dev, unix.IPPROTO_TCP, beAt.String(), e.SNATTo.String())
		if !e.Reply || e.FrontendAddr.String() != to || !e.SNAT || e.SNATTo.String() != from || e.Verdict != "redirect" ||
			e.OutSrc.String() != to || e.OutDst.String() != from {
			t.Fatalf("the backend's reply: %+v", e)
		}
	})
}

// TestExplainWithoutTwin: a marked packet that finds no dry twin is passed
// untouched and unrecorded, and said so; the live path never runs it.
func TestExplainWithoutTwin(t *testing.T) {
	d := newTestDatapath(t)
	applyServices(t, d, clusterIP(vipTCP, beTCP.addr))
	applyServices(t, d, clusterIP(vip6TCP, be6TCP))
	// An agent older than IPv6 dry runs has no IPv6 twins (slot 2).
	for _, slot := range []uint32{0, 2} {
		if err := d.tc.SluiceDryV1.Delete(slot); err != nil {
			t.Fatal(err)
		}
	}
	before := dumpTCMaps(t, d)
	for _, c := range [][2]string{{"10.0.0.1:40000", "10.96.0.10:80"}, {at(client6, 40000), fe(vip6TCP)}} {
		_, err := dryRun(t, d, unix.IPPROTO_TCP, c[0], c[1])
		if !errors.Is(err, ErrNoExplain) {
			t.Fatalf("%s -> %s: err %v, want ErrNoExplain", c[0], c[1], err)
		}
	}
	if changed := diffDumps(before, dumpTCMaps(t, d)); len(changed) > 0 {
		t.Fatalf("changed %v", changed)
	}
}

// TestDryRunLoadsLater: with Config.DeferDryRun the dry twins are not
// loaded by Open (a dry run then says ErrNoExplain, and the live path
// serves as before); LoadDryRun loads them, after which both families'
// dry runs answer, and a second call loads nothing.
func TestDryRunLoadsLater(t *testing.T) {
	d := openTestWith(t, smallConfig, func(c *Config) { c.DeferDryRun = true })
	applyServices(t, d, clusterIP(vipTCP, beTCP.addr))
	applyServices(t, d, clusterIP(vip6TCP, be6TCP))
	cases := [][2]string{{"10.0.0.1:40000", "10.96.0.10:80"}, {at(client6, 40000), fe(vip6TCP)}}
	for _, c := range cases {
		if _, err := dryRun(t, d, unix.IPPROTO_TCP, c[0], c[1]); !errors.Is(err, ErrNoExplain) {
			t.Fatalf("before LoadDryRun, %s -> %s: err %v, want ErrNoExplain", c[0], c[1], err)
		}
	}
	want := netip.AddrPortFrom(beTCP.addr.Addr, beTCP.addr.Port)
	if ret, dst := liveRun(t, d, unix.IPPROTO_TCP, cases[0][0], cases[0][1]); dst != want {
		t.Fatalf("live SYN before LoadDryRun: verdict %d to %s, want %s", ret, dst, want)
	}
	took, err := d.LoadDryRun()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dry twins loaded in %v", took)
	if took == 0 {
		t.Error("LoadDryRun reported no time spent on its first call")
	}
	for _, c := range cases {
		if e := mustDryRun(t, d, unix.IPPROTO_TCP, c[0], c[1]); !e.DNAT || e.FrontendAddr.String() != c[1] {
			t.Errorf("%s -> %s after LoadDryRun: %+v", c[0], c[1], e)
		}
	}
	if took, err := d.LoadDryRun(); err != nil || took != 0 {
		t.Errorf("second LoadDryRun: %v, %v; want 0, nil", took, err)
	}
}

// TestDryRunLoadAndClose: Close does not wait for a LoadDryRun under way
// (an agent told to stop while the verifier works must stop): whichever
// ends first, the dry twins are released with the datapath, and a load
// after Close fails.
func TestDryRunLoadAndClose(t *testing.T) {
	testutil.Privileged(t)
	d, err := Open(configWith(smallConfig, func(c *Config) { c.DeferDryRun = true })(testPinDir(t)))
	if err != nil {
		t.Fatal(err)
	}
	loaded := make(chan error, 1)
	go func() {
		_, err := d.LoadDryRun()
		loaded <- err
	}()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	err = <-loaded
	t.Logf("LoadDryRun beside Close: %v", err)
	d.dryMu.Lock()
	left := d.dry
	d.dryMu.Unlock()
	if left != nil {
		t.Error("dry twins still held after Close")
	}
	if _, err := d.LoadDryRun(); !errors.Is(err, errDryRunClosed) {
		t.Errorf("LoadDryRun after Close: %v, want %v", err, errDryRunClosed)
	}
}

// BenchmarkOpen opens a datapath of the default sizes from empty pins
// (its programs verified, its maps created): with the dry twins, and
// without them (Config.DeferDryRun), as the agent starts. "insns" is what
// the verifier walked for the four live tc programs (the kernel's
// verified_insns): the figure to watch in review, as it does not depend
// on the machine's load.
func BenchmarkOpen(b *testing.B) {
	for _, deferred := range []bool{false, true} {
		b.Run(map[bool]string{false: "with_dry_run", true: "dry_run_deferred"}[deferred], func(b *testing.B) {
			testutil.Privileged(b)
			var cpu time.Duration // the verifier's time is the process's, in the kernel
			for b.Loop() {
				t0 := testutil.CPUTime(b)
				d, err := Open(Config{BPFFS: testPinDir(b), DeferDryRun: deferred})
				if err != nil {
					b.Fatal(err)
				}
				cpu += testutil.CPUTime(b) - t0
				b.StopTimer()
				if err := d.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(liveVerifiedInsns(b, deferred)), "insns")
		})
	}
}

func TestExplainFrameChecksums(t *testing.T) {
	for _, c := range [][2]string{{"10.0.0.1:40000", "10.96.0.10:80"}, {"[2001:db8::1]:40000", "[2001:db8:96::10]:80"}} {
		for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			from, to := netip.MustParseAddrPort(c[0]), netip.MustParseAddrPort(c[1])
			// Not nodeMAC, which is zero, what a frame not written has.
			f, err := explainFrame(ExplainRequest{From: from, To: to, Proto: proto}, otherHostMAC[:])
			if err != nil {
				t.Fatal(err)
			}
			checkChecksums(t, f)
			if !bytes.Equal(f[:6], otherHostMAC[:]) {
				t.Errorf("destination MAC %x", f[:6])
			}
			if s, d := frameAddrs(f); s != from || d != to {
				t.Errorf("frame of %s -> %s reads as %s -> %s", from, to, s, d)
			}
		}
	}
	// What no packet can carry is named.
	for _, c := range []struct{ from, to, want string }{
		{"10.0.0.1:1", "[2001:db8:96::10]:80", "different families"},
		{"[::ffff:10.0.0.1]:1", "10.96.0.10:80", "::ffff:10.0.0.1 is IPv4-mapped"},
	} {
		_, err := explainFrame(ExplainRequest{From: netip.MustParseAddrPort(c.from), To: netip.MustParseAddrPort(c.to), Proto: unix.IPPROTO_TCP}, nodeMAC[:])
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s -> %s: %v, want %q", c.from, c.to, err, c.want)
		}
	}
}

// liveVerifiedInsns is the instructions the verifier walked for the live
// tc programs of a datapath opened as BenchmarkOpen does.
func liveVerifiedInsns(b *testing.B, deferred bool) uint32 {
	d, err := Open(Config{BPFFS: testPinDir(b), DeferDryRun: deferred})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = d.Close() }()
	var sum uint32
	for i, p := range []*ebpf.Program{d.tc.SluiceIngress, d.tc.SluiceEgress, d.tc.Sluice6Ingress, d.tc.Sluice6Egress} {
		info := progInfo(b, p)
		n, ok := info.VerifiedInstructions()
		if !ok {
			b.Skip("the kernel does not report verified instructions (5.16+)")
		}
		b.Logf("%s: %d verified instructions", [...]string{"sluice_ingress", "sluice_egress", "sluice6_ingress", "sluice6_egress"}[i], n)
		sum += n
	}
	return sum
}
