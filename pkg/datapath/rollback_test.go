package datapath

import (
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// errFailedStart is what a test makes a start fail with.
var errFailedStart = errors.New("the start fails here (test)")

// TestFailedStartLeavesPinsAsTheyWere: a start that fails after Open
// resized or converted the pins (a later program the verifier rejects, a
// device that cannot be attached) puts every pin back: each names the map
// it named before, the previous release's under its old name, and nothing
// the attempt pinned is left. The previous agent's programs, still
// attached, go on writing those maps; the next start migrates again and
// carries what they wrote meanwhile. Before, the renamed pins stayed: the
// next agent with the same sizes opened the copies made at the failed
// attempt, without the flows added since, and never migrated again.
func TestFailedStartLeavesPinsAsTheyWere(t *testing.T) {
	for _, tc := range []struct {
		name string
		// previous pins the previous agent's maps in bpffs and returns
		// the pin of its IPv4 conntrack and how to write a flow to it.
		previous func(t *testing.T, bpffs string) (ctPin string, write func(m *ebpf.Map, cport uint16))
		set      func(*Config)
		resized  string // a pin the new sizes resize (or create)
		// fail is where the start fails: in Open (after the load),
		// at AttachDevices (a missing device), or killed after Open
		// (its handles closed, nothing else done).
		fail string
	}{
		{name: "max-conntrack", previous: previousAgent, set: func(c *Config) { c.MaxConntrack = 8192 }, resized: mapConntrack, fail: "open"},
		{name: "max-backends", previous: previousAgent, set: func(c *Config) { c.MaxBackends = 2048 }, resized: mapBackends, fail: "open"},
		{name: "max-backends, attach fails", previous: previousAgent, set: func(c *Config) { c.MaxBackends = 2048 },
			resized: mapBackends, fail: "attach"},
		{name: "release 0 upgrade", previous: previousRelease0, set: func(*Config) {}, resized: mapConntrack, fail: "open"},
		{name: "max-conntrack, killed", previous: previousAgent, set: func(c *Config) { c.MaxConntrack = 8192 }, resized: mapConntrack, fail: "kill"},
		{name: "release 0 upgrade, killed", previous: previousRelease0, set: func(*Config) {}, resized: mapConntrack, fail: "kill"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.Privileged(t)
			bpffs := testPinDir(t)
			ctPin, write := tc.previous(t, bpffs)
			ct, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "sluice", ctPin), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ct.Close()
			write(ct, 40001)
			p, err := OpenPinned(bpffs)
			if err != nil {
				t.Fatal(err)
			}
			want, err := p.Dump()
			p.Close()
			if err != nil {
				t.Fatal(err)
			}
			before := testutil.PinnedMapIDs(t, filepath.Join(bpffs, "sluice"))

			cfg := smallConfig(bpffs)
			tc.set(&cfg)
			switch tc.fail {
			case "kill":
				d, err := Open(cfg)
				if err != nil {
					t.Fatal(err)
				}
				// What the kernel does to a killed agent's handles.
				d.closeMigrations()
				must(t, d.closeObjects())
			case "attach":
				d, err := Open(cfg)
				if err != nil {
					t.Fatal(err)
				}
				if err := d.AttachDevices([]string{"sl-nosuch0"}); err == nil {
					t.Fatal("AttachDevices to a missing device succeeded")
				}
				// As the agent does when its start fails.
				if err := d.Abort(); err != nil {
					t.Fatal(err)
				}
			default:
				override(t, &failAfterLoad, func() error { return errFailedStart })
				if d, err := Open(cfg); !errors.Is(err, errFailedStart) {
					if err == nil {
						d.Close()
					}
					t.Fatalf("Open: %v, want the test's failure", err)
				}
				failAfterLoad = nil
			}
			if tc.fail != "kill" {
				testutil.SamePinnedMaps(t, "after the failed start", testutil.PinnedMapIDs(t, filepath.Join(bpffs, "sluice")), before)
			}
			p, err = OpenPinned(bpffs)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Dump()
			p.Close()
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("pinned state after the failed start: %+v, %v; want %+v", got, err, want)
			}

			// The previous agent's programs write the old map
			// meanwhile; the next start migrates again and carries it.
			write(ct, 40002)
			d := openTest(t, cfg)
			if n, want := pinnedMaxEntries(t, bpffs, tc.resized), cfg.withDefaults().maxEntries()[tc.resized]; n != uint32(want) {
				t.Errorf("%s has %d entries after the next start, want %d", tc.resized, n, want)
			}
			for _, cport := range []uint16{40001, 40002} {
				k, _ := ctEntry(t, "10.0.0.9", cport, "10.96.5.1", "10.2.5.1")
				var v sockCt4Entry
				if err := d.Maps().conntrack.Lookup(&k, &v); err != nil {
					t.Errorf("flow from port %d after the next start: %v", cport, err)
				}
			}
			if got, err := d.Maps().Dump(); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("state after the next start: %+v, %v; want %+v", got, err, want)
			}
		})
	}
}

// previousAgent is an agent of this build with smallConfig's sizes, a
// Service and its backends programmed.
func previousAgent(t *testing.T, bpffs string) (string, func(*ebpf.Map, uint16)) {
	t.Helper()
	d := openTest(t, smallConfig(bpffs))
	addService(t, d.Maps(), 1, l4("10.96.5.1", 80, model.TCP),
		testBackend{1, l4("10.2.5.1", 8080, model.TCP)}, testBackend{2, l4("10.2.5.2", 8080, model.TCP)})
	d.Close()
	return mapConntrack, func(m *ebpf.Map, cport uint16) {
		k, v := ctEntry(t, "10.0.0.9", cport, "10.96.5.1", "10.2.5.1")
		if err := m.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
}

// previousRelease0 is release 0's pins (pinRelease0), a Service
// programmed.
func previousRelease0(t *testing.T, bpffs string) (string, func(*ebpf.Map, uint16)) {
	t.Helper()
	old := pinRelease0(t, bpffs)
	m0 := &Maps{services: old["sluice_services"], backends: old["sluice_backends"], revNat: old["sluice_rev_nat"],
		srcRanges: old["sluice_src_ranges"]}
	addService(t, m0, 1, l4("10.96.5.1", 80, model.TCP), testBackend{reconciler.BackendID(1), l4("10.2.5.1", 8080, model.TCP)})
	return "sluice_conntrack", func(m *ebpf.Map, cport uint16) {
		k, v := ctEntry(t, "10.0.0.9", cport, "10.96.5.1", "10.2.5.1")
		r0 := ct4EntryRelease0{LastSeen: v.Expires - 3600e9, NatAddr: v.NatAddr, NatPort: v.NatPort, BackendId: 1, RevNatId: 1}
		if err := m.Put(&k, &r0); err != nil {
			t.Fatal(err)
		}
	}
}
