package datapath

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// pinnedMaxEntries returns the size of the map pinned as name.
func pinnedMaxEntries(t *testing.T, bpffs, name string) uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "sluice", name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.MaxEntries()
}

// ctEntry is an established forward entry of a TCP flow client:cport ->
// vip:80 translated to backend, expiring in an hour.
func ctEntry(t *testing.T, client string, cport uint16, vip, backend string) (sockCt4Key, sockCt4Entry) {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	k := sockCt4Key{Saddr: be32(addr(client)), Daddr: be32(addr(vip)), Sport: be16(cport), Dport: be16(80),
		Proto: uint8(model.TCP), Dir: ctForward}
	v := sockCt4Entry{Expires: now + 3600e9, Flags: ctFlagReplied, NatAddr: be32(addr(backend)), NatPort: be16(8080),
		BackendId: 1, RevNatId: 1}
	return k, v
}

// TestOpenResizesPinnedMaps (C4): an agent started with other map sizes
// than the pins were made with migrates every map to its size, keeping
// the entries (services, conntrack, source ranges, devices, ...), and
// refuses only a size too small for what a map holds, saying which map
// and what to do. Before, any other size was refused until `sluice
// cleanup` dropped all state.
func TestOpenResizesPinnedMaps(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	fe := l4("10.96.5.1", 80, model.TCP)
	addService(t, d.Maps(), 4, fe, testBackend{3, l4("10.2.5.1", 8080, model.TCP)})
	if err := d.Maps().UpsertSourceRange(fe, netip.MustParsePrefix("192.168.0.0/16")); err != nil {
		t.Fatal(err)
	}
	want := mustDump(t, d.Maps())
	k, v := ctEntry(t, "10.0.0.9", 40000, "10.96.5.1", "10.2.5.1")
	if err := d.Maps().conntrack.Put(&k, &v); err != nil {
		t.Fatal(err)
	}
	if err := d.Maps().setNodeDevice(7, addr("192.168.1.1"), 0); err != nil {
		t.Fatal(err)
	}
	d.Close()

	cfg := smallConfig(bpffs)
	cfg.MaxConntrack, cfg.MaxConntrackNew, cfg.MaxServices, cfg.MaxBackends = 8192, 2048, 512, 2048
	cfg.MaxServiceEntries, cfg.MaxSockRev, cfg.MaxSourceRanges, cfg.MaxDevices = 8192, 2048, 100, 16
	d2, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open with other sizes: %v", err)
	}
	defer d2.Close()
	for name, n := range cfg.withDefaults().maxEntries() {
		if got := pinnedMaxEntries(t, bpffs, name); got != uint32(n) {
			t.Errorf("pinned %s has %d entries, configured %d", name, got, n)
		}
	}
	got := mustDump(t, d2.Maps())
	if !reflect.DeepEqual(got, want) {
		t.Errorf("state after the resize\n got %+v\nwant %+v", got, want)
	}
	var gotV sockCt4Entry
	if err := d2.Maps().conntrack.Lookup(&k, &gotV); err != nil || gotV != v {
		t.Errorf("conntrack entry after the resize: %+v, %v; want %+v", gotV, err, v)
	}
	var dev sockNodeDev
	if err := d2.Maps().devices.Lookup(uint32(7), &dev); err != nil {
		t.Errorf("node device after the resize: %v", err)
	}
	// No pin of the migration is left behind.
	entries, _ := os.ReadDir(filepath.Join(bpffs, "sluice"))
	for _, e := range entries {
		if strings.Contains(e.Name(), "resizing") {
			t.Errorf("stray pin %s", e.Name())
		}
	}
	d2.Close()

	// Too small for what it holds: refused, naming the map and sizes,
	// and the pins are left as they were.
	cfg.MaxDevices = 1
	seedDevices(t, bpffs, 2)
	d3, err := Open(cfg)
	if err == nil {
		d3.Close()
		t.Fatal("Open shrinking sluice_devices below its entries succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, mapDevices) || !strings.Contains(msg, "from 16 to 1") || !strings.Contains(msg, "too small") {
		t.Errorf("error does not say which map, the sizes and why: %v", err)
	}
	if n := pinnedMaxEntries(t, bpffs, mapDevices); n != 16 {
		t.Errorf("a refused resize left %s with %d entries, want the 16 it had", mapDevices, n)
	}
}

// TestOpenResizesBackendsArrays: the backends maps are arrays indexed by
// the id, so a smaller --max-backends shrinks them only if no backend's
// id is beyond the new size: else Open refuses, naming the map, and the
// pin is left as it was; a size that keeps every id keeps every backend,
// and a deleted backend's id does not hold the size.
func TestOpenResizesBackendsArrays(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	cfg := smallConfig(bpffs)
	high := testBackend{reconciler.BackendID(backendSlots(cfg.withDefaults()) - 10), l4("10.2.5.9", 8080, model.TCP)}
	addService(t, d.Maps(), 4, l4("10.96.5.1", 80, model.TCP), high)
	want := mustDump(t, d.Maps())
	d.Close()
	before := pinnedMaxEntries(t, bpffs, mapBackends)

	cfg.MaxBackends = 512 // backendSlots 2,049: below the id
	if d, err := Open(cfg); err == nil {
		d.Close()
		t.Fatalf("Open shrinking %s below backend id %d succeeded", mapBackends, high.id)
	} else if !strings.Contains(err.Error(), mapBackends) || !strings.Contains(err.Error(), "too small") {
		t.Errorf("error does not say which map and why: %v", err)
	}
	if n := pinnedMaxEntries(t, bpffs, mapBackends); n != before {
		t.Errorf("a refused resize left %s with %d entries, want the %d it had", mapBackends, n, before)
	}

	cfg.MaxBackends = 1020 // the id still fits
	d2 := openTest(t, cfg)
	if n := pinnedMaxEntries(t, bpffs, mapBackends); n != uint32(backendSlots(cfg.withDefaults())) {
		t.Errorf("%s has %d entries after the resize, want %d", mapBackends, n, backendSlots(cfg.withDefaults()))
	}
	if got, err := d2.Maps().Dump(); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("state after the resize: %+v, %v; want %+v", got, err, want)
	}

	// A deleted backend's entry keeps its address with BE_F_PRESENT
	// cleared (a program reading it as it is written sees it present or
	// absent, never half an address: clearIDs), and is absent to a
	// resize: the size below its id now shrinks the array.
	must(t, d2.Maps().DeleteBackend(high.id))
	var v sockLb4Backend
	if err := d2.Maps().backends.Lookup(uint32(high.id), &v); err != nil {
		t.Fatal(err)
	}
	if want := (sockLb4Backend{Addr: be32(addr("10.2.5.9")), Port: be16(8080), Proto: uint8(model.TCP)}); v != want {
		t.Errorf("deleted backend's entry %+v, want %+v (its address kept, flags 0)", v, want)
	}
	d2.Close()
	cfg.MaxBackends = 512
	d3 := openTest(t, cfg)
	if got, err := d3.Maps().Dump(); err != nil || len(got.Backends) != 0 {
		t.Errorf("backends after shrinking below a deleted one's id: %v, %v; want none", got.Backends, err)
	}
}

// seedDevices puts n entries into the pinned sluice_devices.
func seedDevices(t *testing.T, bpffs string, n int) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "sluice", mapDevices), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i := range n {
		if err := m.Put(uint32(100+i), &sockNodeDev{}); err != nil {
			t.Fatal(err)
		}
	}
}

// ctFlow is the forward and reply entries of an established TCP flow
// client:cport -> vip:80 translated to backend:8080.
func ctFlow(t *testing.T, client string, cport uint16, vip, backend string) (fk sockCt4Key, fv sockCt4Entry, rk sockCt4Key, rv sockCt4Entry) {
	t.Helper()
	fk, fv = ctEntry(t, client, cport, vip, backend)
	rk = sockCt4Key{Saddr: be32(addr(backend)), Daddr: be32(addr(client)), Sport: be16(8080), Dport: be16(cport),
		Proto: uint8(model.TCP), Dir: ctReverse}
	rv = fv
	rv.NatAddr, rv.NatPort = be32(addr(vip)), be16(80)
	return fk, fv, rk, rv
}

// ctFamily is one family's conntrack, for the migration tests written
// once over IPv4 flows: its maps in a datapath, and an IPv4 flow's entry
// as this family's (the IPv6 twin of each address, twinAddr).
type ctFamily[K ctMigKey[K], V ctTestValue] struct {
	v6   bool
	maps func(d *Datapath) (est, half *ebpf.Map)
	of   func(sockCt4Key, sockCt4Entry) (K, V)
}

// ctTestValue is a conntrack entry of either family, compared whole.
type ctTestValue interface {
	comparable
	ctValue
}

// forCTFamilies runs a test written once over ctFamily with IPv4's
// conntrack, then IPv6's (forFamilies): pass the generic test function
// for both.
func forCTFamilies(t *testing.T, f4 func(*testing.T, ctFamily[sockCt4Key, sockCt4Entry]),
	f6 func(*testing.T, ctFamily[tcCt6Key, tcCt6Entry]),
) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		if v6 {
			f6(t, ct6Family)
		} else {
			f4(t, ct4Family)
		}
	})
}

var (
	ct4Family = ctFamily[sockCt4Key, sockCt4Entry]{
		maps: func(d *Datapath) (est, half *ebpf.Map) { return d.Maps().conntrack, d.Maps().ctNew },
		of:   func(k sockCt4Key, v sockCt4Entry) (sockCt4Key, sockCt4Entry) { return k, v },
	}
	ct6Family = ctFamily[tcCt6Key, tcCt6Entry]{
		v6:   true,
		maps: func(d *Datapath) (est, half *ebpf.Map) { return d.tc.Sluice6ConntrackV1, d.tc.Sluice6CtNewV1 },
		of: func(k sockCt4Key, v sockCt4Entry) (tcCt6Key, tcCt6Entry) {
			return tcCt6Key{Saddr: twin6(k.Saddr), Daddr: twin6(k.Daddr), Sport: k.Sport, Dport: k.Dport, Proto: k.Proto, Dir: k.Dir},
				tcCt6Entry{Expires: v.Expires, Flags: v.Flags, BackendId: v.BackendId, RevNatId: v.RevNatId,
					NatPort: v.NatPort, SnatPort: v.SnatPort, NatAddr: twin6(v.NatAddr), SnatAddr: twin6(v.SnatAddr)}
		},
	}
)

// twin6 is the IPv6 twin of an IPv4 address in network order (0: none).
func twin6(a uint32) tcV6addr {
	if a == 0 {
		return tcV6addr{}
	}
	return tcV6addr{Addr: addr(twinAddr(true, addrFromBE32(a).String())).As16()}
}

// flow is ctFlow in this family.
func (f ctFamily[K, V]) flow(t *testing.T, client string, cport uint16, vip, backend string) (fk K, fv V, rk K, rv V) {
	t.Helper()
	k4, v4, rk4, rv4 := ctFlow(t, client, cport, vip, backend)
	fk, fv = f.of(k4, v4)
	rk, rv = f.of(rk4, rv4)
	return fk, fv, rk, rv
}

// ack is the client's ACK of the TCP flow client:cport -> vip:80.
func (f ctFamily[K, V]) ack(client string, cport uint16, vip string) packet.Packet {
	return packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr(twinAddr(f.v6, client)), Dst: addr(twinAddr(f.v6, vip)),
		SrcPort: cport, DstPort: 80, Proto: packet.TCP, TCPFlags: packet.ACK}
}

// TestResizeCarriesFlowsAddedDuringTheSwitch (C4): between the copy at
// Open and the update of the links, the previous agent's programs keep
// adding flows to the old conntrack map. The migration shim, which runs
// before tc meanwhile, carries a flow over on its next packet; once the
// links run the new programs, the rest is copied and the shims go. IPv6
// flows are carried over as IPv4 ones are (before, the IPv6 maps were
// copied once, at Open, and what the previous agent's programs added
// after that was lost), and the previous agent's IPv6 programs stay in
// the pinned program arrays until the links run the new entries.
func TestResizeCarriesFlowsAddedDuringTheSwitch(t *testing.T) {
	testutil.Privileged(t)
	forCTFamilies(t, testResizeCarries, testResizeCarries)
}

func testResizeCarries[K ctMigKey[K], V ctTestValue](t *testing.T, fam ctFamily[K, V]) {
	bpffs := testPinDir(t)
	ns := topology.NewNS(t, "resize")
	ns.Enter(t)
	links := addVeths(t, [2]string{"sl-r", "sl-s"})
	d1 := openTest(t, smallConfig(bpffs))
	if err := d1.AttachDevices([]string{"sl-r"}); err != nil {
		t.Fatal(err)
	}
	old, _ := fam.maps(d1)

	cfg := smallConfig(bpffs)
	cfg.MaxConntrack = 8192
	d2 := openTest(t, cfg)
	if shim, egressFirst := d2.migrating(); !shim || egressFirst {
		t.Fatalf("migrating() = %v, %v: want the shims, ingress first", shim, egressFirst)
	}
	if ok, egressFirst := d2.migratingIPv6(); !ok || egressFirst {
		t.Fatalf("migratingIPv6() = %v, %v: want IPv6 conntrack migrated, ingress first", ok, egressFirst)
	}
	cur, half := fam.maps(d2)
	if cur.MaxEntries() != 8192 {
		t.Fatalf("new conntrack has %d entries", cur.MaxEntries())
	}
	// Until the links run the new entries, IPv6 packets go to the
	// previous agent's IPv6 programs, which write the old maps.
	tc6Ingress := func() ebpf.ProgramID {
		t.Helper()
		var id uint32
		if err := d2.tc.Sluice6TcV1.Lookup(uint32(0), &id); err != nil {
			t.Fatalf("read %s: %v", mapTC6, err)
		}
		return ebpf.ProgramID(id)
	}
	if got, want := tc6Ingress(), progID(t, d1.tc.Sluice6Ingress); got != want {
		t.Errorf("before the switch, %s holds program %d, want the previous agent's %d", mapTC6, got, want)
	}

	// A flow the old programs established after the copy: its next
	// packet, through the shim, carries both its entries over.
	fk, fv, rk, rv := fam.flow(t, "10.0.0.9", 40001, "10.96.5.1", "10.2.5.1")
	for _, e := range []struct {
		k *K
		v *V
	}{{&fk, &fv}, {&rk, &rv}} {
		if err := old.Put(e.k, e.v); err != nil {
			t.Fatal(err)
		}
	}
	if verdict, _ := runProg(t, d2.shim.SluiceMigTc, fam.ack("10.0.0.9", 40001, "10.96.5.1").Bytes()); verdict != uint32(0xffffffff) {
		t.Errorf("shim verdict %d, want TC_ACT_UNSPEC (on to the next program)", int32(verdict))
	}
	for _, e := range []struct {
		k *K
		v V
	}{{&fk, fv}, {&rk, rv}} {
		var got V
		if err := cur.Lookup(e.k, &got); err != nil || got != e.v {
			t.Errorf("after the shim, new map has %+v (%v) under %+v; want %+v", got, err, *e.k, e.v)
		}
	}

	// A tuple a new flow has taken since (half-open, in sluice_ct_new):
	// the old flow's entries are not carried over beside it, or the new
	// flow's next packet would find them first and go to the old
	// backend. Neither are a dead flow's.
	tk4, tv4, _, _ := ctFlow(t, "10.0.0.9", 40003, "10.96.5.1", "10.2.5.1")
	half4 := tv4
	half4.Flags, half4.NatAddr = 0, be32(addr("10.2.5.2"))
	tk, halfV := fam.of(tk4, half4)
	if err := half.Put(&tk, &halfV); err != nil {
		t.Fatal(err)
	}
	_, tv, trk, trv := fam.flow(t, "10.0.0.9", 40003, "10.96.5.1", "10.2.5.1")
	dk4, dv4, _, _ := ctFlow(t, "10.0.0.9", 40004, "10.96.5.1", "10.2.5.1")
	dv4.Expires = 1
	dk, dv := fam.of(dk4, dv4)
	for _, e := range []struct {
		k *K
		v *V
	}{{&tk, &tv}, {&trk, &trv}, {&dk, &dv}} {
		if err := old.Put(e.k, e.v); err != nil {
			t.Fatal(err)
		}
	}
	for _, cport := range []uint16{40003, 40004} {
		runProg(t, d2.shim.SluiceMigTc, fam.ack("10.0.0.9", cport, "10.96.5.1").Bytes())
	}
	notCarried := func(when string) {
		t.Helper()
		var got V
		if err := cur.Lookup(&tk, &got); err == nil {
			t.Errorf("%s: the old flow's entry of a tuple a new flow took was carried over: %+v", when, got)
		}
		if err := cur.Lookup(&trk, &got); err == nil {
			t.Errorf("%s: the old flow's reply entry was carried over: %+v", when, got)
		}
		if err := cur.Lookup(&dk, &got); err == nil {
			t.Errorf("%s: a dead entry was carried over: %+v", when, got)
		}
	}
	notCarried("after the shim")

	// Another one, that sends nothing until the switch is over: copied
	// when the links run the new programs.
	fk2, fv2, _, _ := fam.flow(t, "10.0.0.9", 40002, "10.96.5.1", "10.2.5.1")
	if err := old.Put(&fk2, &fv2); err != nil {
		t.Fatal(err)
	}
	if err := d2.AttachDevices([]string{"sl-r"}); err != nil {
		t.Fatal(err)
	}
	var got V
	if err := cur.Lookup(&fk2, &got); err != nil || got != fv2 {
		t.Errorf("after the switch, new map has %+v (%v), want %+v", got, err, fv2)
	}
	notCarried("after the switch")
	if len(d2.migrations) != 0 {
		t.Errorf("migrations left after the switch: %d", len(d2.migrations))
	}
	if got, want := tc6Ingress(), progID(t, d2.tc.Sluice6Ingress); got != want {
		t.Errorf("after the switch, %s holds program %d, want the new agent's %d", mapTC6, got, want)
	}
	idx := links["sl-r"].Attrs().Index
	for _, at := range []struct {
		a    ebpf.AttachType
		prog *ebpf.Program
	}{{ebpf.AttachTCXIngress, d2.TCIngress()}, {ebpf.AttachTCXEgress, d2.TCEgress()}} {
		if got := attachedIDs(t, idx, at.a); !slices.Equal(got, []ebpf.ProgramID{progID(t, at.prog)}) {
			t.Errorf("%s programs %v after the switch, want only the new agent's", at.a, got)
		}
	}
}

// TestUpgradeCarriesRelease0FlowsAddedDuringTheSwitch: the same for
// release 0's conntrack, converted on the way (expiring when release 0
// would have let it go, established).
func TestUpgradeCarriesRelease0FlowsAddedDuringTheSwitch(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	old := pinRelease0(t, bpffs)["sluice_conntrack"]
	d := openTest(t, smallConfig(bpffs))
	if shim, egressFirst := d.migrating(); !shim || !egressFirst {
		t.Fatalf("migrating() = %v, %v: want the shims, egress first", shim, egressFirst)
	}
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	k := sockCt4Key{Saddr: be32(addr("10.0.0.9")), Daddr: be32(addr("10.96.5.1")), Sport: be16(40003), Dport: be16(80),
		Proto: uint8(model.TCP), Dir: ctForward}
	v := ct4EntryRelease0{LastSeen: now, NatAddr: be32(addr("10.2.5.1")), NatPort: be16(8080), BackendId: 7, RevNatId: 3}
	if err := old.Put(&k, &v); err != nil {
		t.Fatal(err)
	}
	ack := packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr("10.0.0.9"), Dst: addr("10.96.5.1"),
		SrcPort: 40003, DstPort: 80, Proto: packet.TCP, TCPFlags: packet.ACK}
	runProg(t, d.shim.SluiceMigTc, ack.Bytes())
	want := sockCt4Entry{Expires: now + uint64(DefaultCTTimeoutTCP), Flags: ctFlagReplied, NatAddr: v.NatAddr,
		NatPort: v.NatPort, BackendId: 7, RevNatId: 3}
	var got sockCt4Entry
	if err := d.Maps().conntrack.Lookup(&k, &got); err != nil || got != want {
		t.Errorf("converted entry %+v (%v), want %+v", got, err, want)
	}
}

// ctPeerKey is conntrack_fam.h's ct_peer_key, both ways, with and without
// SNAT, in each family.
func TestCTPeerKey(t *testing.T) {
	forCTFamilies(t, testCTPeerKey, testCTPeerKey)
}

func testCTPeerKey[K ctMigKey[K], V ctTestValue](t *testing.T, fam ctFamily[K, V]) {
	fk, fv, rk, rv := fam.flow(t, "10.0.0.9", 40001, "10.96.5.1", "10.2.5.1")
	if got := ctPeerKey(&fk, &fv); got != rk {
		t.Errorf("peer of the forward entry %+v, want %+v", got, rk)
	}
	if got := ctPeerKey(&rk, &rv); got != fk {
		t.Errorf("peer of the reply entry %+v, want %+v", got, fk)
	}
	// Source-NATed: the reply is <B -> N:sp>, naming the client.
	fk4, fv4, _, _ := ctFlow(t, "10.0.0.9", 40001, "10.96.5.1", "10.2.5.1")
	fv4.Flags |= ctFlagSNAT
	fv4.SnatAddr, fv4.SnatPort = be32(addr("192.168.1.1")), be16(61000)
	_, fv = fam.of(fk4, fv4)
	want4 := sockCt4Key{Saddr: be32(addr("10.2.5.1")), Daddr: be32(addr("192.168.1.1")), Sport: be16(8080), Dport: be16(61000),
		Proto: uint8(model.TCP), Dir: ctReverse}
	rv4 := sockCt4Entry{Flags: ctFlagSNAT, NatAddr: fk4.Daddr, NatPort: fk4.Dport, SnatAddr: fk4.Saddr, SnatPort: fk4.Sport}
	want, rv := fam.of(want4, rv4)
	if got := ctPeerKey(&fk, &fv); got != want {
		t.Errorf("peer of a source-NATed forward entry %+v, want %+v", got, want)
	}
	if got := ctPeerKey(&want, &rv); got != fk {
		t.Errorf("peer of a port reservation %+v, want %+v", got, fk)
	}
}

// A tuple reused by a new flow after the migration's first copy: the new
// map holds the finished flow's entry (closed, backend 1), the old map the
// new flow's (open, backend 2, seen later): the old one supersedes it, as
// bpf/lib/migrate_fam.h's mig_supersedes decides. Before, the new map's
// entry was kept, and the new flow's next packet went to the finished
// flow's backend (1 in ~50k connections failed across an upgrade under
// load). A flow the new programs made since (seen later than the old
// map's) is never replaced, nor an entry of the same flow. Each family's
// entries are judged alike.
func TestConntrackSupersedes(t *testing.T) {
	forCTFamilies(t, testConntrackSupersedes, testConntrackSupersedes)
}

func testConntrackSupersedes[K ctMigKey[K], V ctTestValue](t *testing.T, fam ctFamily[K, V]) {
	tm := smallConfig("").ctTimeouts()
	const now = uint64(1e12)
	tcp := uint8(model.TCP)
	entry := func(seen uint64, backend uint32, flags uint32) ctView {
		e := sockCt4Entry{Flags: flags | ctFlagReplied, BackendId: backend, NatAddr: be32(addr(fmt.Sprintf("10.2.5.%d", backend))),
			NatPort: be16(8080)}
		e.Expires = seen + tm.lifetime(tcp, e.Flags)
		_, v := fam.of(sockCt4Key{}, e)
		return v.view()
	}
	closed := ctFlagFinFwd | ctFlagFinRev
	for _, c := range []struct {
		what string
		o, n ctView
		want bool
	}{
		{"reused tuple, another backend", entry(now, 2, 0), entry(now-2e9, 1, closed), true},
		{"reused tuple, the same backend", entry(now, 1, 0), entry(now-2e9, 1, closed), true},
		{"the new programs' later flow", entry(now-2e9, 2, closed), entry(now, 1, 0), false},
		{"the same flow", entry(now, 1, 0), entry(now-2e9, 1, 0), false},
	} {
		if got := tm.supersedes(tcp, c.o, c.n); got != c.want {
			t.Errorf("%s: supersedes = %v, want %v", c.what, got, c.want)
		}
	}
}

// TestShrinkBelowProgrammedRefused: a --max-backends,
// --max-service-entries or --max-services smaller than what the pinned
// maps hold is refused before any pin changes, naming the flag and the
// size that keeps what is programmed (shrink.go); so is a --max-conntrack
// smaller than the flows (the copy fails), with every pin as it was,
// IPv6's too, which the resize used to swap first. The same pins then
// open as they were.
func TestShrinkBelowProgrammedRefused(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	for s := range 3 {
		var bes []testBackend
		for b := range 4 {
			bes = append(bes, testBackend{reconciler.BackendID(4*s + b + 1), l4(fmt.Sprintf("10.2.%d.%d", s, b+1), 8080, model.TCP)})
		}
		addService(t, d.Maps(), reconciler.ServiceID(s+1), l4(fmt.Sprintf("10.96.5.%d", s+1), 80, model.TCP), bes...)
	}
	for p := range 40 {
		k, v := ctEntry(t, "10.0.0.9", uint16(40000+p), "10.96.5.1", "10.2.0.1")
		if err := d.Maps().conntrack.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
	want := mustDump(t, d.Maps())
	d.Close()
	cfg := smallConfig(bpffs)
	before := pinnedSizes(t, bpffs, cfg)
	for _, tc := range []struct {
		set  func(*Config)
		want string // in the error
	}{
		// 12 backends, ids 1-12, within the arrays of a size of 8.
		{func(c *Config) { c.MaxBackends = 8 }, "--max-backends=8 is too small for the 12 backends in sluice_backends_v2 programmed now: start the agent with --max-backends=12 or more"},
		// 3 masters and 12 slots.
		{func(c *Config) { c.MaxServiceEntries = 10 }, "--max-service-entries=10 is too small for the 15 service entries in sluice_services_v2 programmed now: start the agent with --max-service-entries=15 or more"},
		{func(c *Config) { c.MaxServices = 2 }, "start the agent with --max-services=3 or more"},
		{func(c *Config) { c.MaxConntrack = 16 }, "resize pinned map " + filepath.Join(bpffs, "sluice", mapConntrack) + " from 4096 to 16 entries: the new size, 16, is too small"},
	} {
		c := cfg
		tc.set(&c)
		if d, err := Open(c); err == nil {
			d.Close()
			t.Errorf("Open with %+v, below what the maps hold, succeeded", c)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open's error\n%v\ndoes not say %q", err, tc.want)
		}
		if got := pinnedSizes(t, bpffs, cfg); !maps.Equal(got, before) {
			t.Errorf("a refused Open changed the pins' sizes: %v, were %v", got, before)
		}
	}
	d2 := openTest(t, cfg)
	if got, err := d2.Maps().Dump(); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("state after the refusals: %+v, %v; want %+v", got, err, want)
	}
}

// TestShrinkCountsFrontends: the services hashes are sized by
// --max-services (each master's frontend has a service id), so a
// --max-services below the masters pinned is refused naming them, even
// where the rev_nat entries, which the reconciler counts, are fewer (a
// previous agent's pins, or one stopped between a rev_nat delete and
// its master's); and the pins are left as they were.
func TestShrinkCountsFrontends(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	for s := range 3 {
		fe := l4(fmt.Sprintf("10.96.6.%d", s+1), 80, model.TCP)
		addService(t, d.Maps(), reconciler.ServiceID(s+1), fe, testBackend{reconciler.BackendID(s + 1), l4(fmt.Sprintf("10.2.6.%d", s+1), 8080, model.TCP)})
		if err := d.Maps().DeleteRevNat(reconciler.ServiceID(s + 1)); err != nil {
			t.Fatal(err)
		}
	}
	d.Close()
	cfg := smallConfig(bpffs)
	cfg.MaxServices = 2
	if d, err := Open(cfg); err == nil {
		d.Close()
		t.Fatal("Open with --max-services=2 below 3 masters succeeded")
	} else if want := "3 frontends in " + mapServices + " programmed now: start the agent with --max-services=3 or more"; !strings.Contains(err.Error(), want) {
		t.Errorf("Open's error\n%v\ndoes not say %q", err, want)
	}
	if n := pinnedMaxEntries(t, bpffs, mapServices); n != uint32(smallConfig("").MaxServices) {
		t.Errorf("a refused Open left %s with %d entries, want %d", mapServices, n, smallConfig("").MaxServices)
	}
}

// TestShrinkKeepsServiceIDs: a --max-services whose reverse-NAT arrays
// (serviceSlots) would not hold a service id in use is refused before any
// pin changes, naming the size that keeps it, even where the services
// themselves are fewer than the flag: an id beyond the smaller array
// would lose its entry (and the frontend's master names it). That size
// then opens with the state as it was. Fails if the shrink check counts
// the services only (the resize's copy then fails without naming the
// flag).
func TestShrinkKeepsServiceIDs(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	addService(t, d.Maps(), 300, vipTCP, testBackend{1, l4("10.2.0.1", 8080, model.TCP)})
	want := mustDump(t, d.Maps())
	d.Close()
	cfg := smallConfig(bpffs)
	cfg.MaxServices = 4 // arrays of 4 + 257 entries: id 300 beyond
	if d, err := Open(cfg); err == nil {
		d.Close()
		t.Fatalf("Open with --max-services=4 over service id 300 succeeded")
	} else if w := "start the agent with --max-services=44 or more"; !strings.Contains(err.Error(), w) {
		t.Errorf("Open's error\n%v\ndoes not say %q", err, w)
	}
	if got := pinnedMaxEntries(t, bpffs, mapRevNat); got != 256+257 {
		t.Errorf("after the refusal, %s has %d entries, want 513 as before", mapRevNat, got)
	}
	cfg.MaxServices = 44
	d = openTest(t, cfg)
	if got, err := d.Maps().Dump(); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("state with --max-services=44: %+v, %v; want %+v", got, err, want)
	}
	if got := pinnedMaxEntries(t, bpffs, mapRevNat); got != 44+257 {
		t.Errorf("%s has %d entries with --max-services=44, want 301", mapRevNat, got)
	}
}

// pinnedSizes returns the max entries of every map cfg sizes, as pinned
// in bpffs.
func pinnedSizes(t *testing.T, bpffs string, cfg Config) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	for name := range cfg.withDefaults().maxEntries() {
		out[name] = pinnedMaxEntries(t, bpffs, name)
	}
	return out
}
