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

// dryRun explains a packet from..to through d's ingress program.
func dryRun(t *testing.T, d *Datapath, proto uint8, from, to string) (*Explanation, error) {
	t.Helper()
	frame, err := explainFrame(ExplainRequest{From: netip.MustParseAddrPort(from), To: netip.MustParseAddrPort(to), Proto: proto}, nodeMAC[:])
	if err != nil {
		t.Fatal(err)
	}
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
	return runExplain(d.tc.SluiceIngress, "sluice_ingress", rec, rec6, 0, frame)
}

// mustDryRun is dryRun that must succeed and change no map.
func mustDryRun(t *testing.T, d *Datapath, proto uint8, from, to string) *Explanation {
	t.Helper()
	before := dumpTCMaps(t, d)
	e, err := dryRun(t, d, proto, from, to)
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
	frame, err := explainFrame(ExplainRequest{From: netip.MustParseAddrPort(from), To: netip.MustParseAddrPort(to), Proto: proto}, nodeMAC[:])
	if err != nil {
		t.Fatal(err)
	}
	ret, out := runProg(t, d.tc.SluiceIngress, frame)
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
		ctNew, metrics := mapCTNew, mapMetrics
		if fam.vipTCP.Addr.Is6() {
			ctNew = "sluice6_ct_new_v1"
		}
		changed := diffDumps(before, dumpTCMaps(t, d))
		for _, m := range []string{ctNew, metrics, mapSvcStats} {
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

func TestExplainFrameChecksums(t *testing.T) {
	for _, c := range [][2]string{{"10.0.0.1:40000", "10.96.0.10:80"}, {"[2001:db8::1]:40000", "[2001:db8:96::10]:80"}} {
		for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			from, to := netip.MustParseAddrPort(c[0]), netip.MustParseAddrPort(c[1])
			f, err := explainFrame(ExplainRequest{From: from, To: to, Proto: proto}, nodeMAC[:])
			if err != nil {
				t.Fatal(err)
			}
			checkChecksums(t, f)
			if !bytes.Equal(f[:6], nodeMAC[:]) {
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
