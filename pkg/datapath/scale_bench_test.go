package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// BenchmarkMapsFromEmpty is issue 14's "programming from empty" figure
// over the real maps: N ClusterIP services x 10 endpoints (1M backends at
// 100k) programmed through the production reconciler into freshly
// created maps (no program attached), i.e. the agent's first Apply. The
// time is the reconciler's work plus the map writes; opening the maps is
// not timed. The -prealloc variants create the service maps preallocated
// (Config.PreallocateMaps).
func BenchmarkMapsFromEmpty(b *testing.B) {
	testutil.Privileged(b)
	for _, n := range testutil.ScaleSizes(1, 30000, 100000) {
		var sb model.ServicesBuilder
		for _, s := range benchServices(n) {
			sb.Set(s.Frontend, s)
		}
		st := &model.State{Services: sb.Services()}
		for _, prealloc := range []bool{false, true} {
			cfg := smallConfig(testPinDir(b))
			cfg.MaxServices, cfg.MaxBackends, cfg.MaxServiceEntries = n+n/4, 11*n+64, 12*n
			cfg.DeferDryRun, cfg.PreallocateMaps = true, prealloc
			name := fmt.Sprintf("%dk", n/1000)
			if prealloc {
				name += "-prealloc"
			}
			b.Run(name, func(b *testing.B) { benchMapsFromEmpty(b, cfg, st, false) })
			if !prealloc {
				b.Run(name+"-nogc", func(b *testing.B) { benchMapsFromEmpty(b, cfg, st, true) })
			}
		}
	}
}

// benchMapsFromEmpty programs st into maps of cfg made anew for each
// round. It reports the CPU time of the Apply and, apart, of the Open
// (open-cpu-ns: preallocated maps allocate their elements there), and
// the Apply's user time (user-ns, its CPU less its system time).
//
// With noGC the collector is off during the Apply (the -nogc variant).
// The benchmark's heap is small (the state, ~31 MB live after the
// collection below), so the Apply's ~26 MB of allocations reach the
// heap's goal and a collection, marking ~50 MB, runs during every Apply
// (GODEBUG=gctrace=1); the agent collects before its first apply
// (collectBeforeFirstApply: 73-86 MB live at 30,000 x 10), and its
// goal, twice that until the first sync ends, is not reached. The
// variant is the Apply's own work as the agent's first apply does it;
// the other counts the collection as well (issue 14, fifty-ninth pass).
func benchMapsFromEmpty(b *testing.B, cfg Config, st *model.State, noGC bool) {
	var cpu, sys, openCPU time.Duration // the process's CPU time in Apply (of it in the kernel), in Open
	for b.Loop() {
		b.StopTimer()
		cpu0 := testutil.CPUTime(b)
		d := openTest(b, cfg)
		openCPU += testutil.CPUTime(b) - cpu0
		// The agent collects before its first apply
		// (collectBeforeFirstApply): so does the benchmark, or the
		// collection of the Open's garbage (the programs' ELF and
		// BTF) falls into the Apply's CPU time, or not, by chance.
		runtime.GC()
		gcPercent := 0
		if noGC {
			gcPercent = debug.SetGCPercent(-1)
		}
		b.StartTimer()
		cpu0, sys0 := testutil.CPUTime(b), sysTime(b)
		if err := reconciler.New(d.Maps(), nil).Apply(st); err != nil {
			b.Fatal(err)
		}
		cpu += testutil.CPUTime(b) - cpu0
		sys += sysTime(b) - sys0
		b.StopTimer()
		if noGC {
			debug.SetGCPercent(gcPercent)
		}
		d.Close()
		if err := os.RemoveAll(filepath.Join(cfg.BPFFS, "sluice")); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	// On a loaded machine the wall time mostly waits for a CPU; the
	// CPU time is the agent's work.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(sys.Nanoseconds())/float64(b.N), "sys-ns/op")
	b.ReportMetric(float64((cpu-sys).Nanoseconds())/float64(b.N), "user-ns/op")
	b.ReportMetric(float64(openCPU.Nanoseconds())/float64(b.N), "open-cpu-ns/op")
}

// sysTime is the process's CPU time in the kernel (the map writes' part
// of an Apply).
func sysTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Stime.Nano())
}

// benchServices is the scale benchmarks' cluster: n ClusterIP services
// (10.96.0.0 on, port 80) of 10 endpoints each (11-20.x.y.z:8080, with
// x.y.z the service's number).
func benchServices(n int) []*model.Service {
	svcs := make([]*model.Service, n)
	for i := range svcs {
		fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
		s := &model.Service{Name: model.ServicePortName{Namespace: "bench", Name: fmt.Sprint("svc-", i)}, Kind: model.ClusterIP, Frontend: fe}
		for j := range 10 {
			s.Backends = append(s.Backends, model.Backend{L4Addr: model.L4Addr{
				Addr: netip.AddrFrom4([4]byte{byte(11 + j), byte(i >> 16), byte(i >> 8), byte(i)}), Port: 8080, Proto: model.TCP}})
		}
		svcs[i] = s
	}
	return svcs
}

// BenchmarkMapsRefresh is the reconciler's periodic re-read of the maps
// (SetRefreshInterval) at 30,000 ClusterIP services x 10 endpoints over
// the real maps: one op is an Apply of the programmed state with the
// re-read due. walk compares the maps with the view as it walks them, nothing
// drifted (the agent's common case); drift is the same after one entry
// of each kind was changed and another deleted behind the reconciler's
// back (driftOnce, not timed), the re-read finding and the Apply
// repairing them; dump rebuilds the view from a dump (what every re-read
// did before, and what one that cannot repair drift entry by entry does:
// its walk is made to fail); none is the Apply without a re-read, to
// subtract.
func BenchmarkMapsRefresh(b *testing.B) {
	testutil.Privileged(b)
	const n = 30000
	var sb model.ServicesBuilder
	for _, s := range benchServices(n) {
		sb.Set(s.Frontend, s)
	}
	st := &model.State{Services: sb.Services()}
	cfg := smallConfig(testPinDir(b))
	cfg.MaxServices, cfg.MaxBackends, cfg.MaxServiceEntries = n+n/4, 11*n+64, 12*n
	cfg.DeferDryRun = true
	d := openTest(b, cfg)
	for _, mode := range []string{"walk", "drift", "dump", "none"} {
		b.Run(mode, func(b *testing.B) {
			var dp reconciler.Datapath = d.Maps()
			if mode == "dump" {
				dp = noWalk{dp}
			}
			r := reconciler.New(dp, nil)
			if err := r.Apply(st); err != nil {
				b.Fatal(err)
			}
			if mode != "none" {
				r.SetRefreshInterval(time.Nanosecond)
			}
			var cpu time.Duration
			b.ReportAllocs()
			for b.Loop() {
				if mode == "drift" {
					b.StopTimer()
					driftOnce(b, d.Maps(), st)
					runtime.GC() // the search's garbage, not the re-read's
					b.StartTimer()
				}
				time.Sleep(time.Microsecond) // the re-read is due
				cpu0 := testutil.CPUTime(b)
				if err := r.Apply(st); err != nil {
					b.Fatal(err)
				}
				cpu += testutil.CPUTime(b) - cpu0
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// noWalk is a datapath whose Walk fails: a re-read rebuilds the view from
// a dump.
type noWalk struct{ reconciler.Datapath }

func (noWalk) Walk(reconciler.KernelVisitor) error { return errors.New("no walk") }

// driftOnce changes or deletes, behind the reconciler's back (as bpftool
// would), one entry of each kind that the maps of st hold: a master
// changed and another deleted, a slot changed and another deleted, a
// backend changed and another deleted, a rev_nat entry changed and
// another deleted, and a service IP deleted, of seven frontends of st.
func driftOnce(b *testing.B, m reconciler.Datapath, st *model.State) {
	b.Helper()
	find := &entriesOf{masters: map[reconciler.Frontend]reconciler.Master{}, slots: map[reconciler.Frontend][]reconciler.BackendID{}}
	for i := 100; i < 107; i++ { // benchServices' frontends
		a := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
		find.fes = append(find.fes, reconciler.DefaultScope(a))
	}
	for _, fe := range find.fes {
		if st.Services.Get(fe.L4Addr) == nil {
			b.Fatalf("%s is not in the state", fe)
		}
		find.slots[fe] = make([]reconciler.BackendID, 11)
	}
	if err := m.Walk(find); err != nil {
		b.Fatal(err)
	}
	fe := find.fes
	changed := find.masters[fe[0]]
	changed.Flags ^= 0x80
	other := reconciler.DefaultScope(model.L4Addr{Addr: netip.MustParseAddr("10.95.0.1"), Port: 80, Proto: model.TCP})
	for _, err := range []error{
		m.UpsertMaster(fe[0], changed),
		m.DeleteSlot(fe[1], 0),
		m.UpsertSlot(fe[2], 1, find.slots[fe[2]][2]),
		m.DeleteSlot(fe[2], 3),
		m.UpsertBackend(find.slots[fe[3]][1], model.L4Addr{Addr: netip.MustParseAddr("10.9.9.9"), Port: 9, Proto: model.UDP}),
		m.DeleteBackend(find.slots[fe[3]][2]),
		m.UpsertRevNat(find.masters[fe[4]].ID, other),
		m.DeleteRevNat(find.masters[fe[5]].ID),
		m.DeleteServiceIP(fe[6].Addr),
	} {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// entriesOf is a KernelVisitor that keeps the masters and slots of fes.
type entriesOf struct {
	fes     []reconciler.Frontend
	masters map[reconciler.Frontend]reconciler.Master
	slots   map[reconciler.Frontend][]reconciler.BackendID
}

func (e *entriesOf) Master(fe reconciler.Frontend, m reconciler.Master) bool {
	if _, ok := e.slots[fe]; ok {
		e.masters[fe] = m
	}
	return true
}

func (e *entriesOf) Slot(fe reconciler.Frontend, slot uint32, id reconciler.BackendID) bool {
	if s, ok := e.slots[fe]; ok && int(slot) < len(s) {
		s[slot] = id
	}
	return true
}

func (*entriesOf) Backend(reconciler.BackendID, model.L4Addr) bool       { return true }
func (*entriesOf) RevNat(reconciler.ServiceID, reconciler.Frontend) bool { return true }
func (*entriesOf) SourceRange(model.L4Addr, netip.Prefix) bool           { return true }
func (*entriesOf) ServiceIP(netip.Addr) bool                             { return true }
