package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// release0MetricReasons is how many reasons sluice_metrics had room for in
// release 0 (its METRIC_MAX).
const release0MetricReasons = 20

// pinRelease0 pins, under bpffs/sluice, maps as release 0 did: every name
// without a version, the UDP stickiness map as sluice_affinity, and
// sluice_metrics with one slot per reason. It returns the maps by
// release-0 name.
func pinRelease0(t *testing.T, bpffs string) map[string]*ebpf.Map {
	t.Helper()
	spec := specOf(t, loadSock)
	dir := filepath.Join(bpffs, "sluice")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sizes := smallConfig(bpffs).withDefaults().maxEntries()
	maps := map[string]*ebpf.Map{}
	for _, pm := range pinMigrations {
		if strings.HasSuffix(pm.from, "_v1") {
			continue // a later release's
		}
		ms := spec.Maps[pm.to].Copy()
		ms.Name = pm.from
		if n, ok := sizes[pm.to]; ok {
			ms.MaxEntries = uint32(n)
		}
		if pm.to == mapMetrics {
			ms.MaxEntries = release0MetricReasons
		}
		if pm.to == mapServices {
			ms.ValueSize = uint32(binary.Size(lb4ServiceV1{})) // masters and slots
		}
		if pm.to == mapConntrack {
			ms.Type = ebpf.LRUHash // and ct4EntryRelease0 values
		}
		if pm.to == mapBackends {
			ms.Type, ms.Flags = ebpf.Hash, unix.BPF_F_NO_PREALLOC
			ms.MaxEntries = uint32(smallConfig(bpffs).withDefaults().MaxBackends)
		}
		if pm.to == mapRevNat {
			// A hash of entries without flags (lb4RevNatV1).
			ms.Type, ms.Flags = ebpf.Hash, unix.BPF_F_NO_PREALLOC
			ms.MaxEntries = uint32(smallConfig(bpffs).withDefaults().MaxServices)
			ms.ValueSize = uint32(binary.Size(lb4RevNatV1{}))
		}
		m, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
		if err != nil {
			t.Fatalf("create release-0 map %s: %v", pm.from, err)
		}
		t.Cleanup(func() { m.Close() })
		maps[pm.from] = m
	}
	return maps
}

func mapID(t *testing.T, m *ebpf.Map) ebpf.MapID {
	t.Helper()
	info, err := m.Info()
	return kernelID[ebpf.MapID](t, "map", info, err)
}

// TestOpenMigratesPins: an agent started over the pins of release 0 finds
// their entries under the current names. Maps whose layout did not change
// are the same maps, renamed (so the programs of the agent being replaced
// keep using them); the metrics are copied into a map with room for more
// reasons. Until then, OpenPinned (sluicectl) reads the old pins.
func TestOpenMigratesPins(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	old := pinRelease0(t, bpffs)

	fe := l4("10.96.0.10", 80, model.TCP)
	be := testBackend{7, l4("10.1.0.7", 8080, model.TCP)}
	m0 := &Maps{services: old["sluice_services"], backends: old["sluice_backends"], revNat: old["sluice_rev_nat"],
		srcRanges: old["sluice_src_ranges"]}
	addService(t, m0, 3, fe, be)
	ctKey := sockCt4Key{Saddr: be32(netip.MustParseAddr("10.0.0.2")), Daddr: be32(fe.Addr),
		Sport: be16(40000), Dport: be16(80), Proto: 6, Dir: ctForward}
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	ctVal := ct4EntryRelease0{LastSeen: now, NatAddr: be32(be.addr.Addr), NatPort: be16(8080), BackendId: 7, RevNatId: 3}
	// Converted: expiring when release 0 would have dropped it, taken as
	// established.
	ctWant := sockCt4Entry{Expires: now + uint64(DefaultCTTimeoutTCP), Flags: ctFlagReplied,
		NatAddr: be32(be.addr.Addr), NatPort: be16(8080), BackendId: 7, RevNatId: 3}
	deadKey := ctKey
	deadKey.Proto = 17
	deadVal := ctVal
	deadVal.LastSeen = 1 // UDP idle for longer than its timeout: not copied
	revKey := sockSockRevKey{Cookie: 42, Addr: be32(be.addr.Addr), Port: be16(8080)}
	revVal := sockSockRevEntry{Vip: be32(fe.Addr), Port: be16(80), RevNatId: 3}
	stickKey := sockSockUdpStickKey{Cookie: 43, Vip: be32(fe.Addr), Port: be16(53), Proto: 17}
	stickVal := sockSockUdpStick{BackendId: 7, Addr: be32(be.addr.Addr), Port: be16(53), Slot: 1}
	devVal := sockNodeDev{Addr: be32(netip.MustParseAddr("192.168.1.1"))}
	rangeKey := srcRangeKey(fe, netip.MustParsePrefix("10.0.0.0/8"))
	for _, w := range []struct {
		m    string
		k, v any
	}{
		{"sluice_conntrack", &ctKey, &ctVal},
		{"sluice_conntrack", &deadKey, &deadVal},
		{"sluice_sock_rev", &revKey, &revVal},
		{"sluice_affinity", &stickKey, &stickVal},
		{"sluice_devices", uint32(5), &devVal},
		{"sluice_src_ranges", &rangeKey, uint8(1)},
	} {
		if err := old[w.m].Put(w.k, w.v); err != nil {
			t.Fatalf("seed %s: %v", w.m, err)
		}
	}
	want, err := m0.Dump() // the source range included
	if err != nil {
		t.Fatal(err)
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	perCPU := make([]uint64, cpus)
	for i := range perCPU {
		perCPU[i] = uint64(i + 1)
	}
	wantCount := uint64(cpus * (cpus + 1) / 2)
	for _, r := range []sockMetricReason{sockMetricReasonMETRIC_TC_DNAT_NEW, sockMetricReasonMETRIC_XDP_REV} {
		if err := old["sluice_metrics"].Put(uint32(r), perCPU); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]ebpf.MapID{}
	for name, m := range old {
		ids[name] = mapID(t, m)
	}
	// A pin under a new name as well: an agent of this release ran, then
	// one of release 0 again (a rollback), which pinned afresh under the
	// old names. The old-named pin is the live one.
	stale, err := ebpf.NewMapWithOptions(func() *ebpf.MapSpec {
		spec, _ := loadSock()
		ms := spec.Maps[mapBackends].Copy()
		ms.MaxEntries = uint32(smallConfig(bpffs).MaxBackends)
		return ms
	}(), ebpf.MapOptions{PinPath: filepath.Join(bpffs, "sluice")})
	if err != nil {
		t.Fatal(err)
	}
	stale.Close()

	counters := func(c map[string]uint64) {
		t.Helper()
		if c["tc_dnat_new"] != wantCount || c["xdp_rev"] != wantCount || c["tc_dnat_ct"] != 0 {
			t.Errorf("counters %v, want tc_dnat_new and xdp_rev %d", c, wantCount)
		}
	}
	p, err := OpenPinned(bpffs)
	if err != nil {
		t.Fatalf("OpenPinned over release-0 pins: %v", err)
	}
	if got, err := p.Dump(); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("OpenPinned over release-0 pins: Dump %+v, %v; want %+v", got, err, want)
	}
	c, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	counters(c)
	p.Close()

	for restart := range 2 {
		d, err := Open(smallConfig(bpffs))
		if err != nil {
			t.Fatalf("Open over release-0 pins (restart %d): %v", restart, err)
		}
		for _, pm := range pinMigrations {
			if _, err := os.Stat(filepath.Join(bpffs, "sluice", pm.from)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pin %s still there after Open: %v", pm.from, err)
			}
			m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "sluice", pm.to), nil)
			if err != nil {
				t.Errorf("pin %s: %v", pm.to, err)
				continue
			}
			if id := mapID(t, m); pm.convert == nil && pm.convertPins == nil && id != ids[pm.from] {
				t.Errorf("%s is map %d, want %s's map %d renamed", pm.to, id, pm.from, ids[pm.from])
			}
			m.Close()
		}
		// The IPv6 maps, which the pins lacked, are created (empty:
		// the Dump is the IPv4 state's).
		for _, name := range []string{mapServices6, mapBackends6, mapRevNat6, mapSrcRanges6, mapServiceIPs6, mapAffinity6, mapAffFix6, mapDevices6} {
			if _, err := os.Stat(filepath.Join(bpffs, "sluice", name)); err != nil {
				t.Errorf("pin %s after Open: %v", name, err)
			}
		}
		m := d.Maps()
		if got, err := m.Dump(); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Dump after migration: %+v, %v; want %+v", got, err, want)
		}
		var ct sockCt4Entry
		var rev sockSockRevEntry
		var stick sockSockUdpStick
		var dev sockNodeDev
		var one uint8
		for _, r := range []struct {
			m        *ebpf.Map
			key, out any // out points to a value like want
			want     any
		}{
			{m.conntrack, &ctKey, &ct, ctWant},
			{m.sockRev, &revKey, &rev, revVal},
			{m.udpStick, &stickKey, &stick, stickVal},
			{m.devices, uint32(5), &dev, devVal},
			{m.srcRanges, &rangeKey, &one, uint8(1)},
		} {
			if err := r.m.Lookup(r.key, r.out); err != nil {
				t.Errorf("%v after migration: %v", r.m, err)
				continue
			}
			if got := reflect.ValueOf(r.out).Elem().Interface(); !reflect.DeepEqual(got, r.want) {
				t.Errorf("%v after migration: %+v, want %+v", r.m, got, r.want)
			}
		}
		if err := m.conntrack.Lookup(&deadKey, &ct); err == nil {
			t.Errorf("expired release-0 conntrack entry copied: %+v", ct)
		}
		c, err := d.Counters()
		if err != nil {
			t.Fatal(err)
		}
		counters(c)
		d.Close()
	}
}

// TestAttachReplacesRenamedProgram: release 0's getpeername4 program was
// sluice_getpeer4. Its pinned link is found by the hook's name and
// updated in place to sluice_getpeername4: the same link, never a moment
// without a program.
func TestAttachReplacesRenamedProgram(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	cg := newTestCgroup(t).Path
	prev, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "sluice_getpeer4",
		Type:         ebpf.CGroupSockAddr,
		AttachType:   ebpf.AttachCgroupInet4GetPeername,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		License:      "Dual BSD/GPL",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prev.Close()
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCgroupInet4GetPeername, Program: prev})
	if err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(bpffs, "sluice", "links", "cgroup_getpeername4")
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := l.Pin(pin); err != nil {
		t.Fatal(err)
	}
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()

	d := openTest(t, smallConfig(bpffs))
	if err := d.AttachCgroup(cg); err != nil {
		t.Fatalf("AttachCgroup over release 0's link: %v", err)
	}
	l2, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	info2, err := l2.Info()
	if err != nil {
		t.Fatal(err)
	}
	want := progID(t, d.sock.Getpeername4)
	if info2.ID != info.ID || info2.Program != want {
		t.Errorf("link %d runs program %d, want link %d updated to %d", info2.ID, info2.Program, info.ID, want)
	}
	cgf, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer cgf.Close()
	if got := attachedIDs(t, int(cgf.Fd()), ebpf.AttachCgroupInet4GetPeername); !slices.Equal(got, []ebpf.ProgramID{want}) {
		t.Errorf("getpeername4 programs %v, want only %d", got, want)
	}
}

// TestSessionAffinityPinNotMigrated: the session affinity maps are new in
// this release, under names release 0's migration does not touch (and
// that the kernel's 15-character map names keep apart from release 0's
// "sluice_affinity", the UDP stickiness map). A rollback to release 0 and
// an upgrade again move that release's sluice_affinity to
// sluice_udp_stick_v1 and leave the session affinity entries, IPv4's and
// IPv6's (sluice6_affinity_v1), as they were.
func TestSessionAffinityPinNotMigrated(t *testing.T) {
	d, bpffs := newTestDatapathAt(t)
	fe := l4("10.96.0.10", 80, model.TCP)
	k := sockLb4AffinityKey{Client: uint64(be32(netip.MustParseAddr("10.0.0.2"))), Kind: uint32(sockAffinityClientAFFINITY_CLIENT_ADDR)}
	k.Master, _ = serviceKey(reconciler.DefaultScope(fe), 0)
	v := sockLb4Affinity{Expires: 1 << 62, BackendId: 7, Addr: be32(netip.MustParseAddr("10.1.0.7")), Port: be16(8080), Slot: 1}
	// The IPv6 twin of the entry, in the IPv6 map.
	k6 := sockLb6AffinityKey{Master: lb6Key(k.Master, addr(twinAddr(true, "10.96.0.10"))), Client: v6addr(addr(twinAddr(true, "10.0.0.2"))), Kind: k.Kind}
	v6 := sockLb6Affinity{Expires: v.Expires, BackendId: v.BackendId, Addr: v6addr(addr(twinAddr(true, "10.1.0.7"))), Port: v.Port, Slot: v.Slot}
	pins := []struct {
		name string
		m    func(*Maps) *ebpf.Map
		k, v any
	}{
		{mapAffinity, func(m *Maps) *ebpf.Map { return m.affinity }, &k, &v},
		{mapAffinity6, func(m *Maps) *ebpf.Map { return m.affinity6 }, &k6, &v6},
	}
	ids, entries := make([]ebpf.MapID, len(pins)), make([][]byte, len(pins))
	for i, p := range pins {
		if err := p.m(d.Maps()).Put(p.k, p.v); err != nil {
			t.Fatal(err)
		}
		ids[i] = mapID(t, p.m(d.Maps()))
		if err := p.m(d.Maps()).Lookup(p.k, &entries[i]); err != nil {
			t.Fatal(err)
		}
		info, err := p.m(d.Maps()).Info()
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(info.Name, "sluice_affinity") {
			t.Errorf("%s's kernel name %q reads as release 0's UDP stickiness map", p.name, info.Name)
		}
	}
	d.Close()

	// The rollback: release 0 pins its UDP stickiness map again.
	old := pinRelease0(t, bpffs)
	stickKey := sockSockUdpStickKey{Cookie: 43, Vip: be32(fe.Addr), Port: be16(53), Proto: 17}
	stickVal := sockSockUdpStick{BackendId: 7, Addr: be32(netip.MustParseAddr("10.1.0.7")), Port: be16(53), Slot: 1}
	if err := old["sluice_affinity"].Put(&stickKey, &stickVal); err != nil {
		t.Fatal(err)
	}
	stickID := mapID(t, old["sluice_affinity"])

	d2 := openTest(t, smallConfig(bpffs))
	m := d2.Maps()
	for i, p := range pins {
		if id := mapID(t, p.m(m)); id != ids[i] {
			t.Errorf("%s is map %d after the upgrade, was %d", p.name, id, ids[i])
		}
		var got []byte
		if err := p.m(m).Lookup(p.k, &got); err != nil || !bytes.Equal(got, entries[i]) {
			t.Errorf("%s entry after the upgrade: %x, %v; want %x", p.name, got, err, entries[i])
		}
	}
	var got sockLb4Affinity
	if err := m.affinity.Lookup(&k, &got); err != nil || got != v {
		t.Errorf("session affinity entry after the upgrade: %+v, %v; want %+v", got, err, v)
	}
	if id := mapID(t, m.udpStick); id != stickID {
		t.Errorf("%s is map %d, want release 0's sluice_affinity (%d) renamed", mapUDPStick, id, stickID)
	}
	var stick sockSockUdpStick
	if err := m.udpStick.Lookup(&stickKey, &stick); err != nil || stick != stickVal {
		t.Errorf("UDP stickiness entry after the upgrade: %+v, %v", stick, err)
	}
}

// TestOpenMigratesBackendsV1: the backends maps were hashes under their
// _v1 names (sluice_backends_v1, sluice6_backends_v1) and are arrays as
// v2. An agent started over v1 pins converts them (each backend under its
// id's index, flagged present), removes the v1 pins, and a flow that
// started before the upgrade keeps its backend: the programs find it by
// the id the flow's conntrack entry names (no tc_ct_backend_gone). Both
// families' v1 pins are there, as the previous agent pinned both; the
// flow is of one family.
func TestOpenMigratesBackendsV1(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		testutil.Privileged(t)
		bpffs := testPinDir(t)
		cfg := smallConfig(bpffs)
		dir := filepath.Join(bpffs, "sluice")
		fe := twinL4(v6, vipTCP)
		bes := []testBackend{{7, twinL4(v6, l4("10.1.2.7", 8080, model.TCP))}, {9, twinL4(v6, l4("10.1.2.9", 8080, model.TCP))}}
		other := testBackend{12, twinL4(!v6, l4("10.1.3.12", 8080, model.TCP))}
		syn := tcpSYN(twinAddr(v6, "10.0.0.3"), 41000, fe.Addr.String(), 80)

		// The previous agent: a Service, a flow to it, a backend of the
		// other family.
		d, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		addService(t, d.Maps(), 1, fe, bes...)
		if err := d.Maps().UpsertBackend(other.id, other.addr); err != nil {
			t.Fatal(err)
		}
		want := mustDump(t, d.Maps())
		verdict, out := runProg(t, d.TCIngress(), syn.Bytes())
		var chosen testBackend
		for _, b := range bes {
			if bytes.Equal(out, syn.With(toBackend(b)).Bytes()) {
				chosen = b
			}
		}
		if verdict != tcActOK || chosen.id == 0 {
			t.Fatalf("SYN: verdict %d, output %x: not to a backend", verdict, out)
		}
		d.Close()

		// Its backends maps, as v1 had them: hashes, entries without
		// flags.
		spec := specOf(t, loadSock)
		for _, x := range []struct{ v1, v2 string }{{"sluice_backends_v1", mapBackends}, {"sluice6_backends_v1", mapBackends6}} {
			cur, err := ebpf.LoadPinnedMap(filepath.Join(dir, x.v2), nil)
			if err != nil {
				t.Fatal(err)
			}
			ms := spec.Maps[x.v2].Copy()
			ms.Name, ms.Type, ms.Flags, ms.MaxEntries = x.v1, ebpf.Hash, unix.BPF_F_NO_PREALLOC, uint32(cfg.MaxBackends)
			old, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
			if err != nil {
				t.Fatalf("create %s: %v", x.v1, err)
			}
			k, v := make([]byte, cur.KeySize()), make([]byte, cur.ValueSize())
			for it := cur.Iterate(); it.Next(&k, &v); {
				if v[len(v)-1] == 0 {
					continue // absent
				}
				v[len(v)-1] = 0 // flags: reserved, zero in v1
				if err := old.Put(k, v); err != nil {
					t.Fatal(err)
				}
			}
			old.Close()
			cur.Close()
			if err := os.Remove(filepath.Join(dir, x.v2)); err != nil {
				t.Fatal(err)
			}
		}

		d = openTest(t, cfg)
		for _, name := range []string{"sluice_backends_v1", "sluice6_backends_v1"} {
			if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pin %s still there after Open: %v", name, err)
			}
		}
		if got, err := d.Maps().Dump(); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Dump after migration: %+v, %v; want %+v", got, err, want)
		}
		// The arrays' content: each backend under its id, present.
		m := d.Maps()
		for _, b := range append(bes, other) {
			var flags uint8
			var got netip.AddrPort
			if is6(b.addr.Addr) {
				var v sockLb6Backend
				if err := m.backends6.Lookup(uint32(b.id), &v); err != nil {
					t.Fatal(err)
				}
				flags, got = v.Flags, netip.AddrPortFrom(addrFrom16(v.Addr), portFromBE16(v.Port))
			} else {
				var v sockLb4Backend
				if err := m.backends.Lookup(uint32(b.id), &v); err != nil {
					t.Fatal(err)
				}
				flags, got = v.Flags, netip.AddrPortFrom(addrFromBE32(v.Addr), portFromBE16(v.Port))
			}
			if w := netip.AddrPortFrom(b.addr.Addr, b.addr.Port); flags != bePresent || got != w {
				t.Errorf("backend %d after migration: %s flags %d, want %s present", b.id, got, flags, w)
			}
		}
		ack := syn
		ack.TCPFlags = packet.ACK
		verdict, out = runProg(t, d.TCIngress(), ack.Bytes())
		if want := ack.With(toBackend(chosen)).Bytes(); verdict != tcActOK || !bytes.Equal(out, want) {
			t.Errorf("ACK after the upgrade: verdict %d, output\n got %x\nwant %x (to backend %d)", verdict, out, want, chosen.id)
		}
		if c := counters(t, d); c["tc_ct_backend_gone"] != 0 {
			t.Errorf("tc_ct_backend_gone %d after the upgrade: the flow lost its backend", c["tc_ct_backend_gone"])
		}
	})
}

// TestOpenMigratesRevNatV1: the reverse-NAT maps were hashes under their
// _v1 names (sluice_rev_nat_v1, sluice6_rev_nat_v1), of values without
// flags, and are arrays as v2. Before the upgrade, the read-only
// OpenPinned (sluicectl) reads the v1 pins; an agent started over them
// converts them (each entry under its id's index, flagged present),
// removes the v1 pins, and reads back the state it had; the ids of both
// families are in one space. Fails without the conversion (the v1 pins
// stay, the new arrays are empty) or with an entry not flagged present.
func TestOpenMigratesRevNatV1(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		// The previous agent: a Service of the family, a frontend of
		// the other, at the top of the ids the arrays hold.
		d, bpffs := newTestDatapathAt(t)
		cfg, dir := smallConfig(bpffs), filepath.Join(bpffs, "sluice")
		addService(t, d.Maps(), 1, twinL4(v6, vipTCP), testBackend{7, twinL4(v6, l4("10.1.2.7", 8080, model.TCP))})
		top := reconciler.ServiceID(serviceSlots(cfg.withDefaults()) - 1)
		must(t, d.Maps().UpsertRevNat(top, reconciler.Frontend{L4Addr: twinL4(!v6, l4("10.96.3.3", 53, model.UDP)),
			Scope: reconciler.ScopeInternal}))
		want := mustDump(t, d.Maps())
		d.Close()

		// Its reverse-NAT maps, as v1 had them.
		spec := specOf(t, loadSock)
		for _, x := range []struct{ v1, v2 string }{{"sluice_rev_nat_v1", mapRevNat}, {"sluice6_rev_nat_v1", mapRevNat6}} {
			cur, err := ebpf.LoadPinnedMap(filepath.Join(dir, x.v2), nil)
			must(t, err)
			ms := spec.Maps[x.v2].Copy()
			ms.Name, ms.Type, ms.Flags, ms.MaxEntries = x.v1, ebpf.Hash, unix.BPF_F_NO_PREALLOC, uint32(cfg.MaxServices)
			ms.ValueSize -= 4 // pad and flags
			old, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
			if err != nil {
				t.Fatalf("create %s: %v", x.v1, err)
			}
			k, v := make([]byte, cur.KeySize()), make([]byte, cur.ValueSize())
			for it := cur.Iterate(); it.Next(&k, &v); {
				if !presentEntry(v) {
					continue
				}
				must(t, old.Put(k, v[:len(v)-4]))
			}
			old.Close()
			cur.Close()
			must(t, os.Remove(filepath.Join(dir, x.v2)))
		}
		p, err := OpenPinned(bpffs)
		if err != nil {
			t.Fatalf("OpenPinned over v1 pins: %v", err)
		}
		got, err := p.Dump()
		p.Close()
		if err != nil || !reflect.DeepEqual(got.RevNat, want.RevNat) {
			t.Errorf("OpenPinned over v1 pins: rev_nat %v, %v; want %v", got.RevNat, err, want.RevNat)
		}

		d = openTest(t, cfg)
		for _, name := range []string{"sluice_rev_nat_v1", "sluice6_rev_nat_v1"} {
			if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pin %s still there after Open: %v", name, err)
			}
		}
		m := d.Maps()
		if got, err := m.Dump(); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Dump after migration: %+v, %v; want %+v", got, err, want)
		}
		for id, f := range want.RevNat {
			var flags uint8
			if is6(f.Addr) {
				var v sockLb6RevNat
				must(t, m.revNat6.Lookup(uint32(id), &v))
				flags = v.Flags
			} else {
				var v sockLb4RevNat
				must(t, m.revNat.Lookup(uint32(id), &v))
				flags = v.Flags
			}
			if flags != rnPresent {
				t.Errorf("rev_nat %d (%s) after migration: flags %d, want present", id, f, flags)
			}
		}
	})
}
