package main

import (
	"bytes"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/model/modeltest"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

func TestWriteServicesListsBackendsInSlotOrder(t *testing.T) {
	fe := modeltest.L4("10.96.0.10", 80, model.TCP)
	empty := modeltest.L4("10.96.0.9", 53, model.UDP)
	b := func(s string) model.L4Addr {
		return modeltest.L4(s, 8080, model.TCP)
	}
	np := modeltest.L4("192.168.1.1", 30080, model.TCP)
	npIn := reconciler.Frontend{L4Addr: np, Scope: reconciler.ScopeInternal}
	ks := &reconciler.KernelState{
		Masters: map[reconciler.Frontend]reconciler.Master{
			reconciler.DefaultScope(fe):    {ID: 7, Count: 3},
			reconciler.DefaultScope(empty): {ID: 2, Count: 0},
			reconciler.DefaultScope(np):    {ID: 3, Count: 0, Flags: reconciler.FlagExternal | reconciler.FlagTwoScopes | reconciler.FlagDropEmpty},
			npIn:                           {ID: 4, Count: 1, Flags: reconciler.FlagExternal},
		},
		Slots: map[reconciler.Frontend]map[uint32]reconciler.BackendID{
			reconciler.DefaultScope(fe): {2: 11, 1: 12, 3: 99},
			npIn:                        {1: 11},
		},
		Backends: map[reconciler.BackendID]model.L4Addr{11: b("10.1.1.2"), 12: b("10.1.2.2")},
	}
	names := map[string]namesfile.Frontend{
		"10.96.0.10:80/TCP":     {Service: "default/web:http"},
		"192.168.1.1:30080/TCP": {Service: "default/web:http"},
	}
	var out bytes.Buffer
	if err := writeServices(&out, serviceRows(ks, names)); err != nil {
		t.Fatal(err)
	}
	want := "FRONTEND                        SERVICE           ID  COUNT  BACKENDS\n" +
		"10.96.0.9:53/UDP                -                 2   0      (none: connections refused)\n" +
		"10.96.0.10:80/TCP               default/web:http  7   3      10.1.2.2:8080 10.1.1.2:8080 <missing backend 99>\n" +
		"192.168.1.1:30080/TCP internal  default/web:http  4   1      10.1.1.2:8080\n" +
		"192.168.1.1:30080/TCP           default/web:http  3   0      (none: connections dropped)\n"
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestWriteCountersSorted(t *testing.T) {
	var out bytes.Buffer
	if err := writeCounters(&out, map[string]uint64{"tc_rev_nat": 5, "sock_xlate": 12}); err != nil {
		t.Fatal(err)
	}
	want := "REASON      COUNT\nsock_xlate  12\ntc_rev_nat  5\n"
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestWriteErrorsAreReturned: output that cannot be written (a full disk, a
// closed pipe) is an error, not a silently short listing with exit 0.
func TestWriteErrorsAreReturned(t *testing.T) {
	if err := writeCounters(failingWriter{}, map[string]uint64{"sock_xlate": 1}); !errors.Is(err, errWrite) {
		t.Errorf("writeCounters to a failing writer: %v, want %v", err, errWrite)
	}
	if err := writeServices(failingWriter{}, nil); !errors.Is(err, errWrite) {
		t.Errorf("writeServices to a failing writer: %v, want %v", err, errWrite)
	}
}

var errWrite = errors.New("no space left on device")

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errWrite }

func TestUsageErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"frobnicate"}, &stdout, &stderr); code != 2 {
		t.Errorf("unknown command exit = %d, want 2", code)
	}
	if code := run([]string{"--bpffs", t.TempDir(), "services"}, &stdout, &stderr); code != 1 {
		t.Errorf("no pinned datapath: exit = %d, want 1 (stderr %q)", code, stderr.String())
	}
}

// TestReadsPinsOfAnySize: an agent started with small --max-* sizes pins
// small maps; sluicectl, which knows no sizes, still lists them, and does
// not change them.
func TestReadsPinsOfAnySize(t *testing.T) {
	bpffs, dp := openSmallPins(t)
	fe := modeltest.L4("10.96.3.1", 80, model.TCP)
	be := modeltest.L4("10.3.0.1", 8080, model.TCP)
	m := dp.Maps()
	for _, err := range []error{
		m.UpsertBackend(1, be), m.UpsertSlot(reconciler.DefaultScope(fe), 1, 1), m.UpsertRevNat(2, reconciler.DefaultScope(fe)),
		m.UpsertMaster(reconciler.DefaultScope(fe), reconciler.Master{ID: 2, Count: 1}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	dp.Close()

	var stdout, stderr bytes.Buffer
	if code := run([]string{"--bpffs", bpffs, "services"}, &stdout, &stderr); code != 0 {
		t.Fatalf("services: exit %d, stderr %q", code, stderr.String())
	}
	want := "FRONTEND          SERVICE  ID  COUNT  BACKENDS\n" +
		"10.96.3.1:80/TCP  -        2   1      10.3.0.1:8080\n"
	if stdout.String() != want {
		t.Errorf("services got:\n%s\nwant:\n%s", stdout.String(), want)
	}

	stdout.Reset()
	if code := run([]string{"--bpffs", bpffs, "counters"}, &stdout, &stderr); code != 0 {
		t.Fatalf("counters: exit %d, stderr %q", code, stderr.String())
	}
	for _, n := range datapath.CounterNames() {
		if !strings.Contains(stdout.String(), "\n"+n+" ") {
			t.Errorf("counters output has no %s:\n%s", n, stdout.String())
		}
	}
}

func TestServicesFlags(t *testing.T) {
	for _, args := range [][]string{{"services", "--bogus"}, {"counters", "--raw"}, {"services", "extra"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit = %d, want 2 (stderr %q)", args, code, stderr.String())
		}
	}
}

// TestServicesRaw: --raw prints the maps as the reconciler dumps them
// (its golden format), source ranges included, read from the pins.
func TestServicesRaw(t *testing.T) {
	bpffs, dp := openSmallPins(t)
	fe := modeltest.L4("192.168.1.200", 80, model.TCP)
	st := model.NewState()
	st.Services.Set(fe, &model.Service{Kind: model.LoadBalancer, Frontend: fe,
		Backends:     []model.Backend{{L4Addr: modeltest.L4("10.3.0.1", 8080, model.TCP)}},
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}})
	if err := reconciler.New(dp.Maps(), nil).Apply(st); err != nil {
		t.Fatal(err)
	}
	dp.Close()

	var stdout, stderr bytes.Buffer
	if code := run([]string{"--bpffs", bpffs, "services", "--raw"}, &stdout, &stderr); code != 0 {
		t.Fatalf("services --raw: exit %d, stderr %q", code, stderr.String())
	}
	want := `services:
  192.168.1.200:80/TCP [0] id=1 count=1 flags=0x5
  192.168.1.200:80/TCP [1] backend=1 10.3.0.1:8080/TCP
backends:
  1 10.3.0.1:8080/TCP
rev_nat:
  1 192.168.1.200:80/TCP
src_ranges:
  192.168.1.200:80/TCP 10.0.0.0/24
`
	if stdout.String() != want {
		t.Errorf("services --raw got:\n%s\nwant:\n%s", stdout.String(), want)
	}
}

// openSmallPins opens a datapath with small maps pinned in a bpffs
// directory of the test's own, as an agent started with small --max-*
// sizes would (root only).
func openSmallPins(t *testing.T, opts ...func(*datapath.Config)) (bpffs string, dp *datapath.Datapath) {
	t.Helper()
	bpffs = testutil.PinDir(t) // and a privileged test
	cfg := datapath.Config{
		BPFFS: bpffs, MaxServices: 64, MaxBackends: 128, MaxServiceEntries: 256, MaxConntrack: 256, MaxSockRev: 128,
	}
	for _, o := range opts {
		o(&cfg)
	}
	dp, err := datapath.Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return bpffs, dp
}

// programNamed programs st into dp and writes its names file as the agent
// does, returning the file's path.
func programNamed(t *testing.T, bpffs string, dp *datapath.Datapath, st *model.State) (names string) {
	t.Helper()
	if err := reconciler.New(dp.Maps(), nil).Apply(st); err != nil {
		t.Fatal(err)
	}
	names = filepath.Join(t.TempDir(), "names.json")
	b, err := namesfile.Of(bpffs, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := namesfile.WriteAtomic(names, b); err != nil {
		t.Fatal(err)
	}
	return names
}
