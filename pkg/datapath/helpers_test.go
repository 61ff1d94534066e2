package datapath

import (
	"net/netip"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Test helpers shared by the packet, socket and attach tests: a datapath
// in a pin directory of its own, namespaces and cgroups of the test's own,
// and service seeding through the production Maps API. Packets come from
// internal/testutil/packet, whose checksums are computed independently of
// the kernel's incremental updates.

// testPinDir returns a fresh directory on bpffs, removed with everything
// under it when the test ends.
func testPinDir(t testing.TB) string {
	t.Helper()
	return testutil.PinDir(t)
}

// newTestCgroup creates a cgroup of the test's own under the cgroup2
// mount, removed (whatever is left in it killed) when the test ends.
func newTestCgroup(t testing.TB) *topology.Cgroup {
	t.Helper()
	mount, err := CgroupV2Mount()
	if err != nil {
		t.Fatalf("CgroupV2Mount: %v", err)
	}
	cg, err := topology.NewT(t).AddCgroup(mount, "cg")
	if err != nil {
		t.Fatal(err)
	}
	return cg
}

// smallConfig keeps test maps small: LRU maps are preallocated.
func smallConfig(bpffs string) Config {
	return Config{
		BPFFS:             bpffs,
		MaxServices:       256,
		MaxBackends:       1024,
		MaxServiceEntries: 4096,
		MaxConntrack:      4096,
		MaxConntrackNew:   4096,
		MaxSockRev:        1024,
	}
}

// xdpConfig is smallConfig with the XDP program loaded (only an XDP mode
// loads it); AttachDevices then attaches it in generic mode.
func xdpConfig(bpffs string) Config {
	c := smallConfig(bpffs)
	c.XDP = XDPGeneric
	return c
}

func openTest(t testing.TB, cfg Config) *Datapath {
	t.Helper()
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newTestDatapath(t *testing.T) *Datapath {
	t.Helper()
	testutil.Privileged(t)
	return openTest(t, smallConfig(testPinDir(t)))
}

func l4(addr string, port uint16, proto model.Protocol) model.L4Addr {
	return model.L4Addr{Addr: netip.MustParseAddr(addr), Port: port, Proto: proto}
}

type testBackend struct {
	id   reconciler.BackendID
	addr model.L4Addr
}

// addLoopbackAddrs gives the loopback device of ns the addresses addrs
// (each a /32): local backends, reachable only inside ns.
func addLoopbackAddrs(t testing.TB, ns *topology.NS, addrs ...string) {
	t.Helper()
	for _, a := range addrs {
		if err := ns.AddAddr("lo", netip.PrefixFrom(addr(a), 32)); err != nil {
			t.Fatal(err)
		}
	}
}

// applyServices programs svcs into d through the production writer,
// reconciler.Apply, as an agent would: ids, write order and master flags
// are the reconciler's. Tests that need ids of their own or a write order
// the reconciler would not make use addService.
func applyServices(t testing.TB, d *Datapath, svcs ...*model.Service) {
	t.Helper()
	st := model.NewState()
	for _, s := range svcs {
		s.Backends = model.SortBackends(s.Backends)
		st.Services[s.Frontend] = s
	}
	if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
		t.Fatalf("reconciler.Apply: %v", err)
	}
}

// clusterIP is a ClusterIP service port of frontend fe over backends.
func clusterIP(fe model.L4Addr, backends ...model.L4Addr) *model.Service {
	s := &model.Service{Name: model.ServicePortName{Namespace: "test", Name: fe.String()}, Kind: model.ClusterIP, Frontend: fe}
	for _, b := range backends {
		s.Backends = append(s.Backends, model.Backend{L4Addr: b})
	}
	return s
}

// addService writes a service the way the reconciler does: backends, then
// slots, then the reverse-NAT entry and the master.
func addService(t testing.TB, m *Maps, id reconciler.ServiceID, fe model.L4Addr, bes ...testBackend) {
	t.Helper()
	for _, b := range bes {
		if err := m.UpsertBackend(b.id, b.addr); err != nil {
			t.Fatal(err)
		}
	}
	for i, b := range bes {
		if err := m.UpsertSlot(reconciler.DefaultScope(fe), uint32(i+1), b.id); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.UpsertRevNat(id, reconciler.DefaultScope(fe)); err != nil {
		t.Fatal(err)
	}
	if err := m.UpsertMaster(reconciler.DefaultScope(fe), reconciler.Master{ID: id, Count: uint32(len(bes))}); err != nil {
		t.Fatal(err)
	}
}

var (
	clientMAC = [6]byte{0x02, 0, 0, 0, 0, 0x01}
	nodeMAC   = [6]byte{0x02, 0, 0, 0, 0, 0x02}
)

// addr parses an address of the tables.
func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// checkChecksums fails t unless every checksum of frame is what a
// from-scratch computation gives.
func checkChecksums(t *testing.T, frame []byte) {
	t.Helper()
	if err := packet.Verify(frame); err != nil {
		t.Error(err)
	}
}

// expectCounted fails t unless every counter in reasons is non-zero, and
// returns all counters for further checks.
func expectCounted(t *testing.T, d *Datapath, reasons ...string) map[string]uint64 {
	t.Helper()
	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for _, reason := range reasons {
		if cs[reason] == 0 {
			t.Errorf("counter %s is 0; counters: %v", reason, cs)
		}
	}
	return cs
}
