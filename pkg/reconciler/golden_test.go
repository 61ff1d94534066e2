package reconciler_test

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/source/manifest"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestGolden feeds real Service and EndpointSlice YAML through
// manifest.Load and the reconciler into the fake maps, and compares a text
// dump of the maps (reconciler.KernelState.String) with
// testdata/golden/<case>.golden. A case is a directory of manifests, or a
// directory of numbered steps applied in order (the dump after each step,
// with the conntrack flushes it caused). Run with -update to rewrite the
// golden files after an intended change.
func TestGolden(t *testing.T) {
	forEachGoldenCase(t, func(t *testing.T, dir string) {
		f := newFake(t)
		out := replayGolden(t, dir, &counting{Datapath: f})
		golden := dir + ".golden"
		if *update {
			if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		compareGolden(t, golden, out)
	})
}

// TestGoldenPinnedMaps replays the golden cases against real BPF maps
// (pkg/datapath, pinned in a bpffs directory of its own) and expects the
// same dumps: the fake and the kernel agree, and Restore reads back from
// the pins everything Apply wrote.
func TestGoldenPinnedMaps(t *testing.T) {
	testutil.Privileged(t)
	if *update {
		t.Skip("-update rewrites the golden files from the fake")
	}
	forEachGoldenCase(t, func(t *testing.T, dir string) {
		bpffs := testutil.PinDir(t)
		d, err := datapath.Open(datapath.Config{
			BPFFS: bpffs, MaxServices: 256, MaxBackends: 1024, MaxServiceEntries: 4096, MaxConntrack: 256, MaxSockRev: 256,
		})
		if err != nil {
			t.Fatalf("open datapath: %v", err)
		}
		t.Cleanup(func() { d.Close() })
		compareGolden(t, dir+".golden", replayGolden(t, dir, &counting{Datapath: d.Maps()}))
	})
}

func forEachGoldenCase(t *testing.T, run func(t *testing.T, dir string)) {
	cases, err := filepath.Glob("testdata/golden/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range cases {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		t.Run(filepath.Base(dir), func(t *testing.T) { run(t, dir) })
	}
}

// replayGolden applies the steps of the case in dir to dp and returns the
// dumps.
func replayGolden(t *testing.T, dir string, dp *counting) string {
	t.Helper()
	steps := []string{dir}
	if subs, _ := filepath.Glob(filepath.Join(dir, "[0-9]*")); len(subs) > 0 {
		slices.Sort(subs)
		steps = subs
	}
	r := reconciler.New(dp, nil)
	var out strings.Builder
	for _, step := range steps {
		res, err := manifest.Load(step, translate.Options{Node: translate.Node{Name: "node-a"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Errors {
			t.Errorf("%s", e)
		}
		dp.reset()
		mustApply(t, r, res.State)
		if len(steps) > 1 {
			fmt.Fprintf(&out, "### after %s (%d map writes)\n", filepath.Base(step), dp.writes)
		}
		ks, err := dp.Dump()
		if err != nil {
			t.Fatal(err)
		}
		out.WriteString(ks.String())
		for _, b := range dp.flushed {
			fmt.Fprintf(&out, "conntrack flushed: %s\n", b)
		}
		for _, x := range dp.fixed {
			switch {
			case x.Backend == 0:
				fmt.Fprintf(&out, "session affinity deleted: %s, every backend\n", x.Frontend)
			case x.Slot == 0:
				fmt.Fprintf(&out, "session affinity deleted: %s backend=%d\n", x.Frontend, x.Backend)
			default:
				fmt.Fprintf(&out, "session affinity moved: %s backend=%d to slot %d\n", x.Frontend, x.Backend, x.Slot)
			}
		}
		// Restart: restoring and re-applying writes nothing.
		dp.reset()
		r2 := reconciler.New(dp, nil)
		if err := r2.Restore(); err != nil {
			t.Fatal(err)
		}
		mustApply(t, r2, res.State)
		if dp.writes != 0 || len(dp.fixed) != 0 {
			t.Errorf("%s: re-apply after restore wrote %d entries, fixed session affinity %v", step, dp.writes, dp.fixed)
		}
	}
	return out.String()
}

func compareGolden(t *testing.T, golden, got string) {
	t.Helper()
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("maps differ from %s (run with -update if intended)\ngot:\n%s\nwant:\n%s", golden, got, want)
	}
}

// counting is a Datapath that counts the map writes that succeed and
// records the conntrack flushes and session affinity fixes, the same way
// over the fake and over real maps.
type counting struct {
	reconciler.Datapath
	writes  int
	flushed []model.L4Addr
	fixed   []reconciler.AffinityFix
}

func (c *counting) reset() { c.writes, c.flushed, c.fixed = 0, nil, nil }

func (c *counting) count(err error) error {
	if err == nil {
		c.writes++
	}
	return err
}

func (c *counting) UpsertBackend(id reconciler.BackendID, b model.L4Addr) error {
	return c.count(c.Datapath.UpsertBackend(id, b))
}

func (c *counting) DeleteBackend(id reconciler.BackendID) error {
	return c.count(c.Datapath.DeleteBackend(id))
}

func (c *counting) UpsertRevNat(id reconciler.ServiceID, fe reconciler.Frontend) error {
	return c.count(c.Datapath.UpsertRevNat(id, fe))
}

func (c *counting) DeleteRevNat(id reconciler.ServiceID) error {
	return c.count(c.Datapath.DeleteRevNat(id))
}

func (c *counting) UpsertSlot(fe reconciler.Frontend, slot uint32, b reconciler.BackendID) error {
	return c.count(c.Datapath.UpsertSlot(fe, slot, b))
}

func (c *counting) UpsertMaster(fe reconciler.Frontend, m reconciler.Master) error {
	return c.count(c.Datapath.UpsertMaster(fe, m))
}

func (c *counting) DeleteSlot(fe reconciler.Frontend, slot uint32) error {
	return c.count(c.Datapath.DeleteSlot(fe, slot))
}

func (c *counting) UpsertSourceRange(fe model.L4Addr, p netip.Prefix) error {
	return c.count(c.Datapath.UpsertSourceRange(fe, p))
}

func (c *counting) DeleteSourceRange(fe model.L4Addr, p netip.Prefix) error {
	return c.count(c.Datapath.DeleteSourceRange(fe, p))
}

func (c *counting) UpsertServiceIP(a netip.Addr) error {
	return c.count(c.Datapath.UpsertServiceIP(a))
}

func (c *counting) DeleteServiceIP(a netip.Addr) error {
	return c.count(c.Datapath.DeleteServiceIP(a))
}

func (c *counting) FlushConntrack(bs []model.L4Addr) error {
	err := c.Datapath.FlushConntrack(bs)
	if err == nil {
		c.flushed = append(c.flushed, bs...)
	}
	return err
}

func (c *counting) FixAffinity(fixes []reconciler.AffinityFix) error {
	err := c.Datapath.FixAffinity(fixes)
	if err == nil {
		c.fixed = append(c.fixed, fixes...)
	}
	return err
}

// countBatch counts the entries a batch wrote.
func (c *counting) countBatch(n int, err error) (int, error) {
	c.writes += n
	return n, err
}

func (c *counting) UpsertBackends(es []reconciler.BackendEntry) (int, error) {
	return c.countBatch(c.Datapath.UpsertBackends(es))
}

func (c *counting) UpsertRevNats(es []reconciler.RevNatEntry) (int, error) {
	return c.countBatch(c.Datapath.UpsertRevNats(es))
}

func (c *counting) UpsertSlots(runs []reconciler.SlotRun) (int, error) {
	return c.countBatch(c.Datapath.UpsertSlots(runs))
}

func (c *counting) UpsertMasters(es []reconciler.MasterEntry) (int, error) {
	return c.countBatch(c.Datapath.UpsertMasters(es))
}

func (c *counting) UpsertServiceIPs(as []netip.Addr) (int, error) {
	return c.countBatch(c.Datapath.UpsertServiceIPs(as))
}

func (c *counting) DeleteBackends(ids []reconciler.BackendID) (int, error) {
	return c.countBatch(c.Datapath.DeleteBackends(ids))
}

func (c *counting) DeleteRevNats(ids []reconciler.ServiceID) (int, error) {
	return c.countBatch(c.Datapath.DeleteRevNats(ids))
}
