package datapath

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
)

// TestServiceMapsAreNotPreallocatedInC: PreallocateMaps off keeps the
// objects' BPF_F_NO_PREALLOC (bpf/lib/maps.h), and the maps it switches
// are hashes there, not LRUs or tries (always or never preallocated).
func TestServiceMapsAreNotPreallocatedInC(t *testing.T) {
	spec := specOf(t, loadTc)
	for _, name := range preallocatedMaps {
		ms := spec.Maps[name]
		if ms == nil || ms.Type != ebpf.Hash || ms.Flags&unix.BPF_F_NO_PREALLOC == 0 {
			t.Errorf("%s in the tc object: %+v, want a BPF_F_NO_PREALLOC hash", name, ms)
		}
	}
}

// pinnedFlags returns the flags of the maps of preallocatedMaps pinned
// under bpffs, as the kernel reports them.
func pinnedFlags(t *testing.T, bpffs string) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	for _, name := range preallocatedMaps {
		m, info, err := loadPinnedInfo(filepath.Join(bpffs, "sluice", name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
		out[name] = info.Flags
	}
	return out
}

func checkPreallocated(t *testing.T, bpffs string, want bool) {
	t.Helper()
	for name, flags := range pinnedFlags(t, bpffs) {
		if got := flags&unix.BPF_F_NO_PREALLOC == 0; got != want {
			t.Errorf("pinned %s has flags %#x: preallocated %v, want %v", name, flags, got, want)
		}
	}
}

// TestPreallocateMapsSwitchKeepsServices: PreallocateMaps creates the
// service maps of both families without BPF_F_NO_PREALLOC (the kernel's
// own flags, read back), and an agent started with the other setting
// than the pins were made with rebuilds them with every entry (services,
// reverse NAT, service IPs, IPv4 and IPv6), both ways, leaving no
// temporary pin, where before the load refused the pins (cilium/ebpf
// compares flags); sluicectl explain reads either.
func TestPreallocateMapsSwitchKeepsServices(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	cfg := smallConfig(bpffs)
	cfg.DeferDryRun = true
	d := openTest(t, cfg)
	checkPreallocated(t, bpffs, false)
	vip4, vip6 := l4("10.96.7.1", 80, model.TCP), l4("fd00:96::7", 80, model.TCP)
	applyServices(t, d,
		clusterIP(vip4, l4("10.2.7.1", 8080, model.TCP), l4("10.2.7.2", 8080, model.TCP)),
		clusterIP(vip6, l4("fd00:2::7", 8080, model.TCP)))
	want := mustDump(t, d.Maps())
	if len(want.Masters) != 2 || len(want.RevNat) != 2 || len(want.ServiceIPs) != 2 {
		t.Fatalf("seeded state %+v: want 2 masters, rev-NAT entries and service IPs", want)
	}
	d.Close()

	for _, prealloc := range []bool{true, false, true} {
		cfg.PreallocateMaps = prealloc
		d, err := Open(cfg)
		if err != nil {
			t.Fatalf("Open with PreallocateMaps %v over the other's pins: %v", prealloc, err)
		}
		checkPreallocated(t, bpffs, prealloc)
		// sluicectl explain loads its program over the pins, of
		// whichever preallocation they have.
		e, err := ExplainSocket(bpffs, SocketExplainRequest{To: netip.AddrPortFrom(vip4.Addr, vip4.Port), Proto: unix.IPPROTO_TCP})
		if err != nil || !e.Frontend {
			t.Errorf("PreallocateMaps %v: ExplainSocket: %+v, %v; want the frontend found", prealloc, e, err)
		}
		got, err := d.Maps().Dump()
		d.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("PreallocateMaps %v: state after the rebuild\n got %+v\nwant %+v", prealloc, got, want)
		}
		entries, _ := os.ReadDir(filepath.Join(bpffs, "sluice"))
		for _, e := range entries {
			if strings.Contains(e.Name(), "resizing") {
				t.Errorf("stray pin %s", e.Name())
			}
		}
	}
}

// TestPreallocatedMapsMemory: the memory MapFill reports (the kernel's
// memlock) of an empty preallocated service map is its buckets and every
// element of max_entries, of an empty one made without preallocation its
// buckets alone; PreallocatedBytes sums the maps. It logs each map's cost
// at the default sizes, for the README.
func TestPreallocatedMapsMemory(t *testing.T) {
	testutil.Privileged(t)
	bytes := map[bool]map[string]uint64{}
	elems := map[string]uint64{}
	for _, prealloc := range []bool{false, true} {
		d := openTest(t, Config{BPFFS: testPinDir(t), DeferDryRun: true, PreallocateMaps: prealloc})
		bytes[prealloc] = mapBytes(t, d, func(f MapFill) string { return f.Pin })
		loaded := objectsOf[*ebpf.Map](&d.tc)
		var sum uint64
		for _, name := range preallocatedMaps {
			m := loaded[name]
			// A hash element: 48 bytes of header, the key and the
			// value rounded up to 8 (sizing.go).
			elems[name] = uint64(m.MaxEntries()) * uint64(48+roundUp8(int(m.KeySize()))+roundUp8(int(m.ValueSize())))
			sum += bytes[prealloc][name]
		}
		got, err := d.PreallocatedBytes()
		if err != nil || got != sum {
			t.Errorf("PreallocatedBytes = %d, %v; want the maps' %d", got, err, sum)
		}
		t.Logf("preallocated %v: %.1f MiB together", prealloc, float64(sum)/(1<<20))
		d.Close()
	}
	for _, name := range preallocatedMaps {
		pre, not := bytes[true][name], bytes[false][name]
		t.Logf("%s: %.1f MiB preallocated, %.1f MiB empty without, elements %.1f MiB",
			name, float64(pre)/(1<<20), float64(not)/(1<<20), float64(elems[name])/(1<<20))
		if not >= elems[name]/2 || pre < not+elems[name] {
			t.Errorf("%s: %d bytes preallocated, %d without (empty): want the %d bytes of its elements between",
				name, pre, not, elems[name])
		}
	}
}

// BenchmarkCreateServiceMaps creates (and closes) the maps of
// preallocatedMaps at BenchmarkMapsFromEmpty's 30k sizes, with and without
// preallocation: what preallocating adds to an agent's start on a node
// without pins (the elements are allocated at creation).
func BenchmarkCreateServiceMaps(b *testing.B) {
	testutil.Privileged(b)
	for _, prealloc := range []bool{false, true} {
		spec := specOf(b, loadTc)
		n := 30000
		cfg := Config{MaxServices: n + n/4, MaxBackends: 11*n + 64, MaxServiceEntries: 12 * n, PreallocateMaps: prealloc}
		if err := configure(spec, cfg.withDefaults()); err != nil {
			b.Fatal(err)
		}
		b.Run(map[bool]string{false: "30k", true: "30k-prealloc"}[prealloc], func(b *testing.B) {
			var sys time.Duration
			for b.Loop() {
				sys0 := sysTime(b)
				for _, name := range preallocatedMaps {
					m, err := ebpf.NewMap(unpinned(spec.Maps[name]))
					if err != nil {
						b.Fatal(err)
					}
					m.Close()
				}
				sys += sysTime(b) - sys0
			}
			b.ReportMetric(float64(sys.Nanoseconds())/float64(b.N), "sys-ns/op")
		})
	}
}

// BenchmarkFillServicesMap writes 30,000 frontends' masters, what
// sluice_services holds since the slots went to arrays (BenchmarkFillSlots),
// into a fresh sluice_services sized by the default --max-services, in
// batches of 1,024 as the Maps do, with and without preallocation: the
// kernel's insert alone (sys-ns/entry), without the reconciler's work
// between the batches. (Until the services hash was sized by
// --max-services it wrote 330,000 masters and slots, /330k.)
func BenchmarkFillServicesMap(b *testing.B) {
	testutil.Privileged(b)
	const frontends, batch = 30000, 1024
	keys := make([]sockLb4Key, 0, frontends)
	for i := range frontends {
		keys = append(keys, sockLb4Key{Vip: be32(netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)})),
			Port: be16(80), Proto: uint8(model.TCP)})
	}
	values := make([]sockLb4Service, len(keys))
	for _, prealloc := range []bool{false, true} {
		spec := specOf(b, loadTc)
		cfg := Config{PreallocateMaps: prealloc}
		if err := configure(spec, cfg.withDefaults()); err != nil {
			b.Fatal(err)
		}
		b.Run(map[bool]string{false: "30k", true: "30k-prealloc"}[prealloc], func(b *testing.B) {
			var sys time.Duration
			for b.Loop() {
				b.StopTimer()
				m, err := ebpf.NewMap(unpinned(spec.Maps[mapServices]))
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				sys0 := sysTime(b)
				for i := 0; i < len(keys); i += batch {
					j := min(i+batch, len(keys))
					if _, err := putBatch(m, keys[i:j], values[i:j]); err != nil {
						b.Fatal(err)
					}
				}
				sys += sysTime(b) - sys0
				b.StopTimer()
				m.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(sys.Nanoseconds())/float64(b.N)/float64(len(keys)), "sys-ns/entry")
		})
	}
}
