package datapath

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/pkg/model"
)

// hooks are the programs a node runs, by hook: what a failed start must
// leave as the previous agent left it.
type hooks map[string][]ebpf.ProgramID

// nodeHooks reads the programs on ingress and egress (tcx) of devs, their
// XDP links and Sluice's clsact filters, the cgroup's socket hooks, and
// the slots of the pinned program arrays.
func nodeHooks(t *testing.T, bpffs, cgroup string, devs ...string) hooks {
	t.Helper()
	out := hooks{}
	for _, dev := range devs {
		l := mustLink(t, dev)
		idx := l.Attrs().Index
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			out[dev+" "+at.String()] = attachedIDs(t, idx, at)
		}
		if xdp := l.Attrs().Xdp; xdp != nil && xdp.Attached {
			out[dev+" xdp"] = []ebpf.ProgramID{ebpf.ProgramID(xdp.ProgId)}
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, _ := netlink.FilterList(l, parent)
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok {
					out[dev+" filter "+bf.Name] = append(out[dev+" filter "+bf.Name], ebpf.ProgramID(bf.Id))
				}
			}
		}
	}
	if cgroup != "" {
		f, err := os.Open(cgroup)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, cp := range cgroupProgs {
			out["cgroup "+cp.name] = attachedIDs(t, int(f.Fd()), cp.attach)
		}
	}
	for _, arr := range []string{mapTC6, mapXDP6} {
		if pin := filepath.Join(bpffs, "sluice", arr); fileExists(pin) {
			out[arr] = testutil.ProgArrayIDs(t, pin)
		}
	}
	return out
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// sameHooks reports, after what, each hook of got that runs other programs
// than want says.
func sameHooks(t *testing.T, what string, got, want hooks) {
	t.Helper()
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Errorf("%s: %s runs %v, want %v (as the previous agent left it)", what, k, got[k], w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok && len(g) > 0 {
			t.Errorf("%s: %s runs %v, which the previous agent did not attach", what, k, g)
		}
	}
}

// synThrough runs a SYN of client port cport to 10.96.5.1:80 through the
// program id (as traffic reaching its hook would): it writes the flow to
// the conntrack maps that program uses (half-open, sluice_ct_new).
func synThrough(t *testing.T, id ebpf.ProgramID, cport uint16) {
	t.Helper()
	runID(t, id, packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr("10.0.0.9"), Dst: addr("10.96.5.1"),
		SrcPort: cport, DstPort: 80, Proto: packet.TCP, TCPFlags: packet.SYN})
}

// synAckThrough runs the backend's SYN-ACK of that flow through the
// program id (an egress one): the flow is answered, not yet assured
// (ackThrough establishes it).
func synAckThrough(t *testing.T, id ebpf.ProgramID, cport uint16) {
	t.Helper()
	runID(t, id, packet.Packet{SrcMAC: nodeMAC, DstMAC: clientMAC, Src: addr("10.2.5.1"), Dst: addr("10.0.0.9"),
		SrcPort: 8080, DstPort: cport, Proto: packet.TCP, TCPFlags: packet.SYN | packet.ACK})
}

// ackThrough runs the client's ACK after the SYN-ACK through the program
// id (an ingress one): the flow is established (assured), in the
// sluice_conntrack that program uses. Answered alone, a TCP flow the
// programs see while a start is migrating stays in sluice_ct_new until
// its ACK moves it.
func ackThrough(t *testing.T, id ebpf.ProgramID, cport uint16) {
	t.Helper()
	runID(t, id, packet.Packet{SrcMAC: clientMAC, DstMAC: nodeMAC, Src: addr("10.0.0.9"), Dst: addr("10.96.5.1"),
		SrcPort: cport, DstPort: 80, Proto: packet.TCP, TCPFlags: packet.ACK})
}

func runID(t *testing.T, id ebpf.ProgramID, pkt packet.Packet) {
	t.Helper()
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	runProg(t, p, pkt.Bytes())
}

// hasFlow says whether the flow from 10.0.0.9:cport is in one of the
// IPv4 conntrack maps ms.
func hasFlow(t *testing.T, cport uint16, ms ...*ebpf.Map) bool {
	t.Helper()
	for _, m := range ms {
		var k sockCt4Key
		var v sockCt4Entry
		for it := m.Iterate(); it.Next(&k, &v); {
			if k.Dir == ctForward && k.Sport == be16(cport) && k.Saddr == be32(addr("10.0.0.9")) {
				return true
			}
		}
	}
	return false
}

// pinnedFlow is hasFlow in the conntrack maps the pins in bpffs name
// (names).
func pinnedFlow(t *testing.T, bpffs string, cport uint16, names ...string) bool {
	t.Helper()
	var ms []*ebpf.Map
	for _, name := range names {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "sluice", name), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		ms = append(ms, m)
	}
	return hasFlow(t, cport, ms...)
}

// TestFailedStartPutsProgramsBack (issue 14, thirty-ninth pass): a start
// that fails after it updated its first link (here the third device's
// link cannot be read: a directory where its pin goes) puts back the
// previous agent's programs on every hook it changed (the tcx links of
// the first device, updated; the second device's clsact filters, which
// an agent from before the kernel had tcx left and the tcx link replaced;
// the XDP link the migration shim took over; the cgroup links; the IPv6
// programs in the pinned program arrays), then the pins: the old
// programs run on the old maps, and what they write after the failure is
// there at the next start, which migrates as the failed one did. Before,
// AttachDevices committed before its first link update: the links
// updated ran the new programs on the new maps, which the pins kept,
// and the flows they wrote were the only ones the next start saw.
//
// Killed at the same point (nothing undone), the next start keeps the
// killed start's pins, which the links it updated use, as before.
func TestFailedStartPutsProgramsBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		base func(bpffs string) Config
		// set is what the failed start changes: the conntrack size
		// (migrated, with the shims), or the backends' (no
		// migration: this build's IPv6 programs go into the program
		// arrays at the load).
		set  func(*Config)
		kill bool
	}{
		{name: "max-conntrack: tcx, filters, cgroup", base: smallConfig, set: func(c *Config) { c.MaxConntrack = 8192 }},
		{name: "max-conntrack: XDP", base: xdpConfig, set: func(c *Config) { c.MaxConntrack = 8192 }},
		{name: "max-backends: program arrays", base: xdpConfig, set: func(c *Config) { c.MaxBackends = 2048 }},
		{name: "max-conntrack, killed", base: smallConfig, set: func(c *Config) { c.MaxConntrack = 8192 }, kill: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bpffs, cg := attachNode(t, "failstart")
			links := addVeths(t, [2]string{"sl-a", "sl-a1"}, [2]string{"sl-b", "sl-b1"}, [2]string{"sl-c", "sl-c1"})

			// The previous agent: tcx on sl-a, a clsact filter of
			// its own on sl-b (a kernel without tcx then), the
			// socket programs on the cgroup, a Service.
			prev := openTest(t, tc.base(bpffs))
			must(t, prev.AttachDevices([]string{"sl-a"}))
			must(t, attachClsact(links["sl-b"].Attrs().Index, netlink.HANDLE_MIN_INGRESS, filterPrefix+"ingress", prev.TCIngress(), nil))
			must(t, prev.AttachCgroup(cg))
			addService(t, prev.Maps(), 1, l4("10.96.5.1", 80, model.TCP), testBackend{1, l4("10.2.5.1", 8080, model.TCP)})
			must(t, prev.Close())
			before := nodeHooks(t, bpffs, cg, "sl-a", "sl-b", "sl-c")
			pins := testutil.PinnedMapIDs(t, filepath.Join(bpffs, "sluice"))
			oldIngress := before["sl-a "+ebpf.AttachTCXIngress.String()]
			if len(oldIngress) != 1 {
				t.Fatalf("previous agent's ingress on sl-a: %v", oldIngress)
			}
			oldEgress := before["sl-a "+ebpf.AttachTCXEgress.String()]
			if len(oldEgress) != 1 {
				t.Fatalf("previous agent's egress on sl-a: %v", oldEgress)
			}
			synThrough(t, oldIngress[0], 40001)
			synAckThrough(t, oldEgress[0], 40001)
			ackThrough(t, oldIngress[0], 40001)
			if !pinnedFlow(t, bpffs, 40001, mapConntrack) {
				t.Fatal("the previous agent's programs established no flow in the pinned conntrack map")
			}

			// sl-b's ifindex was an L3 device's (an entry says so):
			// the start clears the flag before its programs go on
			// sl-b (markL3), and the undo puts the entry back.
			stale := sockNodeDev{Flags: nodeDevL3}
			devices := pinnedDevices(t, bpffs, func(m *ebpf.Map) {
				must(t, m.Put(uint32(links["sl-b"].Attrs().Index), &stale))
			})

			// sl-c's link cannot be read: the start fails there,
			// after sl-a's and sl-b's ingress links are in.
			must(t, os.Mkdir(filepath.Join(bpffs, "sluice", "links", "tcx_ingress_sl-c"), 0o700))
			cfg := tc.base(bpffs)
			tc.set(&cfg)
			d, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			must(t, d.AttachCgroup(cg))
			if err := d.AttachDevices([]string{"sl-a", "sl-b", "sl-c"}); err == nil {
				t.Fatal("AttachDevices with sl-c's pin a directory succeeded")
			}
			// A flow the new programs established before the start
			// failed: carried back into the old maps.
			synThrough(t, progID(t, d.TCIngress()), 40003)
			synAckThrough(t, progID(t, d.TCEgress()), 40003)
			ackThrough(t, progID(t, d.TCIngress()), 40003)
			// And one answered, not yet assured (in sluice_ct_new
			// while the start migrates): carried back too.
			synThrough(t, progID(t, d.TCIngress()), 40004)
			synAckThrough(t, progID(t, d.TCEgress()), 40004)
			if tc.kill {
				// What the kernel does to a killed agent's handles.
				d.closeMigrations()
				d.pins.releaseSteps()
				must(t, d.closeObjects())
			} else {
				must(t, d.Abort())
			}
			must(t, os.Remove(filepath.Join(bpffs, "sluice", "links", "tcx_ingress_sl-c")))

			now := nodeHooks(t, bpffs, cg, "sl-a", "sl-b", "sl-c")
			ingress := now["sl-a "+ebpf.AttachTCXIngress.String()]
			if len(ingress) != 1 {
				t.Fatalf("ingress on sl-a after the failed start: %v", ingress)
			}
			if !tc.kill {
				if !pinnedFlow(t, bpffs, 40003, mapConntrack) {
					t.Error("the flow the new programs established before the failure is not in the old conntrack map")
				}
				if !pinnedFlow(t, bpffs, 40004, mapConntrack, mapCTNew) {
					t.Error("the flow the new programs answered (not assured) before the failure is not in the old conntrack maps")
				}
				sameHooks(t, "after the failed start", now, before)
				if got := pinnedDevices(t, bpffs, nil); !maps.Equal(got, devices) {
					t.Errorf("%s after the failed start: %v, want %v as before it", mapDevices, got, devices)
				}
				testutil.SamePinnedMaps(t, "after the failed start", testutil.PinnedMapIDs(t, filepath.Join(bpffs, "sluice")), pins)
			}
			if fileExists(filepath.Join(bpffs, "sluice", switchedDir)) != tc.kill {
				t.Errorf("%s there after the failed start: %v", switchedDir, !tc.kill)
			}

			// Traffic after the failure, through what sl-a runs (its
			// ingress was updated, its egress not yet): the next
			// start sees it.
			synThrough(t, ingress[0], 40002)
			if egress := now["sl-a "+ebpf.AttachTCXEgress.String()]; len(egress) == 1 {
				synAckThrough(t, egress[0], 40002)
				ackThrough(t, ingress[0], 40002)
			} else {
				t.Errorf("egress on sl-a after the failed start: %v", egress)
			}
			next := openTest(t, cfg)
			for name, want := range cfg.withDefaults().maxEntries() {
				if n := pinnedMaxEntries(t, bpffs, name); n != uint32(want) {
					t.Errorf("%s has %d entries after the next start, want %d", name, n, want)
				}
			}
			if tc.kill {
				// The killed start's pins stayed: the map its
				// ingress program on sl-a writes is the one pinned.
				ct := testutil.PinnedMapIDs(t, filepath.Join(bpffs, "sluice"))[mapConntrack]
				if ids := programMapIDs(t, ingress[0]); !slices.Contains(ids, ct) {
					t.Errorf("after the next Open, %s names map %d, which sl-a's ingress program (maps %v) does not use", mapConntrack, ct, ids)
				}
			}
			must(t, next.AttachDevices([]string{"sl-a", "sl-b", "sl-c"}))
			must(t, next.Commit())
			// Killed, what the links not yet updated wrote to the
			// old map after the copy is lost (the flow the old
			// egress established).
			for _, cport := range []uint16{40001, 40002, 40003} {
				if tc.kill && cport == 40002 {
					continue
				}
				if !hasFlow(t, cport, next.Maps().conntrack) {
					t.Errorf("established flow from port %d missing after the next start", cport)
				}
			}
			if !hasFlow(t, 40004, next.Maps().conntrack, next.Maps().ctNew) {
				t.Error("answered flow from port 40004 (not assured) missing after the next start")
			}
			for name := range testutil.PinnedMapIDs(t, filepath.Join(bpffs, "sluice")) {
				if n, ok := cutPrevious(name); ok {
					t.Errorf("pin %s left after the next start (%s)", name, n)
				}
			}
			if fileExists(filepath.Join(bpffs, "sluice", switchedDir)) {
				t.Errorf("%s left after the next start", switchedDir)
			}
		})
	}
}

// programMapIDs returns the maps program id uses.
func programMapIDs(t *testing.T, id ebpf.ProgramID) []ebpf.MapID {
	t.Helper()
	info, err := programInfo(id)
	if err != nil {
		t.Fatalf("program %d: %v", id, err)
	}
	ids, _ := info.MapIDs()
	return ids
}

func programInfo(id ebpf.ProgramID) (*ebpf.ProgramInfo, error) {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	return p.Info()
}

func cutPrevious(name string) (string, bool) {
	if len(name) > len(previousSuffix) && name[len(name)-len(previousSuffix):] == previousSuffix {
		return name[:len(name)-len(previousSuffix)], true
	}
	return "", false
}

// pinnedDevices calls change (if not nil) on the pinned sluice_devices
// map, then returns its entries.
func pinnedDevices(t *testing.T, bpffs string, change func(*ebpf.Map)) map[uint32]sockNodeDev {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "sluice", mapDevices), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if change != nil {
		change(m)
	}
	out := map[uint32]sockNodeDev{}
	var k uint32
	var v sockNodeDev
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
