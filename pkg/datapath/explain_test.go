package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
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
		if name == "sluice_expl_v1" || name == "sluice_dry_v1" {
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
	return runExplain(d.tc.SluiceIngress, "sluice_ingress", d.tc.SluiceExplV1, 0, frame)
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

func TestExplainNewFlowThenConntrack(t *testing.T) {
	testutil.Privileged(t)
	cfg := smallConfig(testPinDir(t))
	cfg.ServiceMetrics = true // per-Service counters must not move either
	d := openTest(t, cfg)
	applyServices(t, d, clusterIP(vipTCP, beTCP.addr), clusterIP(vipUDP, beUDP.addr))

	e := mustDryRun(t, d, unix.IPPROTO_TCP, "10.0.0.1:40000", "10.96.0.10:80")
	want := netip.AddrPortFrom(beTCP.addr.Addr, beTCP.addr.Port)
	if !e.Frontend || e.FrontendAddr != netip.MustParseAddrPort("10.96.0.10:80") || !e.NewFlow || e.ConntrackHit ||
		!e.DNAT || e.Backend != want || e.Slot != 1 || e.ScopeCount != 1 || e.Verdict != "pass" || e.OutDst != want {
		t.Fatalf("new flow: %+v", e)
	}
	if !slices.Equal(e.Reasons, []string{"tc_dnat_new"}) {
		t.Errorf("new flow reasons %v, want [tc_dnat_new]", e.Reasons)
	}

	// The same packet without the mark does write: the dumps see it.
	before := dumpTCMaps(t, d)
	if ret, dst := liveRun(t, d, unix.IPPROTO_TCP, "10.0.0.1:40000", "10.96.0.10:80"); ret != tcActOK || dst != want {
		t.Fatalf("live run: verdict %d to %s", ret, dst)
	}
	changed := diffDumps(before, dumpTCMaps(t, d))
	for _, m := range []string{mapCTNew, mapMetrics, mapSvcStats} {
		if !slices.Contains(changed, m) {
			t.Fatalf("a live new flow changed %v, want %s among them", changed, m)
		}
	}

	e = mustDryRun(t, d, unix.IPPROTO_TCP, "10.0.0.1:40000", "10.96.0.10:80")
	if !e.ConntrackHit || e.NewFlow || e.Backend != want || e.Slot != 0 || !slices.Equal(e.Reasons, []string{"tc_dnat_ct"}) {
		t.Fatalf("existing flow: %+v", e)
	}

	// UDP, and a reply of the TCP flow.
	e = mustDryRun(t, d, unix.IPPROTO_UDP, "10.0.0.1:5300", "10.96.0.11:53")
	if !e.NewFlow || e.Backend != netip.AddrPortFrom(beUDP.addr.Addr, beUDP.addr.Port) {
		t.Fatalf("udp: %+v", e)
	}
	e = mustDryRun(t, d, unix.IPPROTO_TCP, "10.1.0.1:8080", "10.0.0.1:40000")
	if !e.Reply || e.FrontendAddr != netip.MustParseAddrPort("10.96.0.10:80") || e.OutSrc != e.FrontendAddr {
		t.Fatalf("reply: %+v", e)
	}
}

func TestExplainRejectAndNoService(t *testing.T) {
	d := newTestDatapath(t)
	applyServices(t, d, clusterIP(vipTCP, beTCP.addr), clusterIP(vipEmpty))

	e := mustDryRun(t, d, unix.IPPROTO_TCP, "10.0.0.1:40000", "10.96.0.12:80")
	if !e.Frontend || e.DNAT || e.Verdict != "reject" || !slices.Equal(e.Reasons, []string{"tc_no_backend"}) {
		t.Fatalf("empty service: %+v", e)
	}
	e = mustDryRun(t, d, unix.IPPROTO_TCP, "10.0.0.1:40000", "10.96.0.10:81")
	if e.Frontend || e.Verdict != "reject" || !slices.Equal(e.Reasons, []string{"tc_unknown_port"}) {
		t.Fatalf("unknown port: %+v", e)
	}
	e = mustDryRun(t, d, unix.IPPROTO_TCP, "10.0.0.1:40000", "192.0.2.1:80")
	if e.Frontend || e.Verdict != "pass" || len(e.Reasons) != 0 {
		t.Fatalf("no service: %+v", e)
	}
}

func TestExplainAffinity(t *testing.T) {
	d := newTestDatapath(t)
	applyServices(t, d, affinityService(affVIP, time.Hour, affBEs...))
	vip := netip.AddrPortFrom(affVIP.Addr, affVIP.Port).String()

	// Before the client's first flow: no entry, a random pick.
	e := mustDryRun(t, d, unix.IPPROTO_TCP, "10.0.0.7:40000", vip)
	if e.AffinityHit || !e.NewFlow || e.SvcFlags&uint32(sockSvcFlagsSVC_F_AFFINITY) == 0 {
		t.Fatalf("first: %+v", e)
	}
	_, first := liveRun(t, d, unix.IPPROTO_TCP, "10.0.0.7:40000", vip)
	for port := range 8 {
		e := mustDryRun(t, d, unix.IPPROTO_TCP, fmt.Sprintf("10.0.0.7:%d", 41000+port), vip)
		if !e.AffinityHit || e.Backend != first {
			t.Fatalf("flow %d: %+v, want the affinity backend %s", port, e, first)
		}
	}
}

// TestExplainWithoutTwin: a marked packet that finds no dry twin is passed
// untouched and unrecorded, and said so; the live path never runs it.
func TestExplainWithoutTwin(t *testing.T) {
	d := newTestDatapath(t)
	applyServices(t, d, clusterIP(vipTCP, beTCP.addr))
	if err := d.tc.SluiceDryV1.Delete(uint32(0)); err != nil {
		t.Fatal(err)
	}
	before := dumpTCMaps(t, d)
	_, err := dryRun(t, d, unix.IPPROTO_TCP, "10.0.0.1:40000", "10.96.0.10:80")
	if !errors.Is(err, ErrNoExplain) {
		t.Fatalf("err %v, want ErrNoExplain", err)
	}
	if changed := diffDumps(before, dumpTCMaps(t, d)); len(changed) > 0 {
		t.Fatalf("changed %v", changed)
	}
}

func TestExplainFrameChecksums(t *testing.T) {
	for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
		f, err := explainFrame(ExplainRequest{From: netip.MustParseAddrPort("10.0.0.1:40000"), To: netip.MustParseAddrPort("10.96.0.10:80"), Proto: proto}, nodeMAC[:])
		if err != nil {
			t.Fatal(err)
		}
		checkChecksums(t, f)
		if !bytes.Equal(f[:6], nodeMAC[:]) {
			t.Errorf("destination MAC %x", f[:6])
		}
	}
}
