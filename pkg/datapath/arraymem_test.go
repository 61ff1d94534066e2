package datapath

import (
	"bufio"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// rssOf returns the bytes of a's reserved range that count in this
// process's RSS, from /proc/self/smaps: the Rss of every mapping inside
// the range.
func rssOf(t *testing.T, a *lazyArray) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	must(t, err)
	defer f.Close()
	lo := uint64(uintptr(unsafe.Pointer(&a.mem[0])))
	hi := lo + uint64(len(a.mem))
	in, rss := false, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			var start, end uint64
			if _, err := fmt.Sscanf(f[0], "%x-%x", &start, &end); err == nil {
				in = start >= lo && end <= hi
				continue
			}
		}
		if rest, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			must(t, err)
			rss += kb << 10
		}
	}
	must(t, sc.Err())
	return rss
}

// TestArraysMappedWhereWritten: the arrays the agent writes as memory
// count in its RSS only while it writes, and only where (arraymem.go).
// While an IPv4 service's backends are stored, one window of the IPv4
// backends array is mapped and nothing of the IPv6 one; once the calls
// return, nothing of any of the four arrays is mapped, and the entries
// are in the kernel's arrays. Fails with the arrays mapped whole (their
// whole size in the RSS from the start), or with windows left mapped.
func TestArraysMappedWhereWritten(t *testing.T) {
	d := openTestWith(t, smallConfig, func(c *Config) {
		c.MaxBackends = 100_000 // 1.6 MB of IPv4 backends, 4 MB of IPv6
		c.MaxServiceEntries = 100_000
	})
	m := d.Maps()
	tables := map[string]*lazyArray{"backends": m.be4.a, "backends6": m.be6.a, "slots": m.slots4.a, "slots6": m.slots6.a}
	none := func(when string) { t.Helper(); noneMapped(t, tables, when) }
	none("after Open")
	// While a backend is stored: its window, and nothing of the other
	// family's array.
	stores := checkFirstStore(t, "backends", m.be4, m.be6)
	// Two backends far apart: ids 1 and 90,000 (16-byte entries: 1.4 MB
	// apart, windows 0 and 5).
	b1 := testBackend{1, l4("10.1.7.1", 8080, model.TCP)}
	b2 := testBackend{90_000, l4("10.1.7.2", 8080, model.TCP)}
	addService(t, m, 7, vipTCP, b1, b2)
	if *stores == 0 {
		t.Fatal("no store into the mapped backends array")
	}
	m.be4.onStore = nil
	none("after the service is programmed")
	var v sockLb4Backend
	must(t, m.backends.Lookup(uint32(b2.id), &v))
	if v.Flags != bePresent || v.Addr != be32(b2.addr.Addr) {
		t.Errorf("backend %d in the kernel: %+v, want %s present", b2.id, v, b2.addr)
	}
	vipTCP4 := reconciler.Frontend{L4Addr: vipTCP}
	ks, err := m.Dump() // reads the slots through the table
	must(t, err)
	if n := len(ks.Slots[vipTCP4]); n != 2 {
		t.Errorf("Dump: %d slots of %s, want 2: %v", n, vipTCP, ks.Slots)
	}
	none("after a Dump")
	must(t, m.DeleteBackend(b1.id))
	must(t, m.DeleteBackend(b2.id))
	none("after the deletes")
	must(t, m.backends.Lookup(uint32(b2.id), &v))
	if v.Flags != 0 || v.Addr != be32(b2.addr.Addr) {
		t.Errorf("deleted backend %d: %+v, want its address kept, absent", b2.id, v)
	}
}

// noneMapped fails t if any of tables has a window mapped, or bytes of
// its range in the RSS, when (after what) it is called.
func noneMapped(t *testing.T, tables map[string]*lazyArray, when string) {
	t.Helper()
	for name, a := range tables {
		if rss := rssOf(t, a); a.count != 0 || rss != 0 {
			t.Errorf("%s %s: %d windows mapped, %d bytes in the RSS; want none", name, when, a.count, rss)
		}
	}
}

// checkFirstStore has the first store into tbl (the table called name)
// check that one window of it is mapped, its bytes in the RSS and fewer
// than the array's, and nothing of the other family's table other. It
// returns the count of tbl's stores.
func checkFirstStore(t *testing.T, name string, tbl, other *beTable) *int {
	stores := 0
	tbl.onStore = func(int) {
		if stores++; stores > 1 {
			return
		}
		if rss := rssOf(t, tbl.a); tbl.a.count != 1 || rss != tbl.a.mappedBytes() || rss == 0 || rss >= len(tbl.a.mem) {
			t.Errorf("%s while stored: %d windows mapped, %d bytes in the RSS; want one window's %d", name, tbl.a.count, rss, tbl.a.mappedBytes())
		}
		if rss := rssOf(t, other.a); rss != 0 {
			t.Errorf("%s6 while IPv4 entries are stored: %d bytes in the RSS, want none", name, rss)
		}
	}
	return &stores
}

// TestBackendsClearedWhereNotWritten: a backend present where the agent
// has not written (left by its predecessor in the pinned array) is
// cleared when deleted, and no window stays mapped. Fails if a delete
// skips what is not mapped (the entry stays present).
func TestBackendsClearedWhereNotWritten(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		m := newTestDatapath(t).Maps()
		tbl := m.beTableOf(v6)
		b := testBackend{77, l4(twinAddr(v6, "10.1.7.7"), 8080, model.TCP)}
		k, v, err := backendEntry(b.id, b.addr)
		must(t, err)
		if v6 {
			v6v := lb6Backend(v, b.addr.Addr)
			must(t, m.backends6.Put(&k, &v6v))
		} else {
			must(t, m.backends.Put(&k, &v))
		}
		if tbl.a.count != 0 {
			t.Fatalf("%d windows mapped before any write, want none", tbl.a.count)
		}
		if n, err := m.DeleteBackends([]reconciler.BackendID{b.id}); n != 1 || err != nil {
			t.Fatalf("DeleteBackends: %d, %v", n, err)
		}
		var flags uint8
		if v6 {
			var got sockLb6Backend
			must(t, m.backends6.Lookup(uint32(b.id), &got))
			flags = got.Flags
		} else {
			var got sockLb4Backend
			must(t, m.backends.Lookup(uint32(b.id), &got))
			flags = got.Flags
		}
		if flags != 0 {
			t.Errorf("deleted backend's flags %#x, want absent", flags)
		}
		if tbl.a.count != 0 {
			t.Errorf("the delete left %d windows mapped, want none", tbl.a.count)
		}
	})
}

// TestRevNatArraysMappedWhereWritten: the reverse-NAT entries are written
// as memory into the arrays (rnmem.go), which count in the agent's RSS
// only while it writes, and only where, as the backends arrays
// (TestArraysMappedWhereWritten). While a batch of IPv4 entries is stored,
// one window of the IPv4 array is mapped and nothing of the IPv6 one;
// once the calls return, nothing of either is mapped. The entries are in
// the kernel's arrays, present; a deleted one is absent there (its
// frontend kept), and neither Dump, the read-only OpenPinned (sluicectl,
// read with batch lookups) nor the per-Service counters name it any more.
// Fails with the entries written by system calls (no store into the
// mapped array), with windows left mapped, or with an absent entry read
// as a service.
func TestRevNatArraysMappedWhereWritten(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	d := openTest(t, configWith(smallConfig, func(c *Config) {
		c.MaxServices = 100_000 // 1.6 MB of IPv4 entries, 2.4 MB of IPv6
		c.ServiceMetrics = true
	})(bpffs))
	m := d.Maps()
	if !m.rnMapped() {
		t.Fatalf("reverse-NAT arrays not mapped: %v %v", m.rn4, m.rn6)
	}
	tables := map[string]*lazyArray{"rev_nat": m.rn4.a, "rev_nat6": m.rn6.a}
	none := func(when string) { t.Helper(); noneMapped(t, tables, when) }
	none("after Open")
	stores := checkFirstStore(t, "rev_nat", m.rn4, m.rn6)
	// Ids far apart (16-byte entries: 1.4 MB apart, windows 0 and 5),
	// both scopes of a frontend, and an IPv6 one.
	fe1 := reconciler.DefaultScope(vipTCP)
	fe2 := reconciler.Frontend{L4Addr: l4("10.96.0.11", 53, model.UDP), Scope: reconciler.ScopeInternal}
	fe6 := reconciler.DefaultScope(l4("2001:db8:96::10", 443, model.TCP))
	es := []reconciler.RevNatEntry{{ID: 1, Frontend: fe1}, {ID: 90_000, Frontend: fe2}, {ID: 7, Frontend: fe6}}
	if n, err := m.UpsertRevNats(es); n != len(es) || err != nil {
		t.Fatalf("UpsertRevNats = %d, %v", n, err)
	}
	if *stores == 0 {
		t.Fatal("no store into the mapped reverse-NAT array")
	}
	m.rn4.onStore = nil
	none("after UpsertRevNats")
	var v sockLb4RevNat
	must(t, m.revNat.Lookup(uint32(90_000), &v))
	if want := (sockLb4RevNat{Vip: be32(fe2.Addr), Port: be16(53), Proto: uint8(model.UDP), Scope: uint8(reconciler.ScopeInternal),
		Flags: rnPresent}); v != want {
		t.Errorf("rev_nat 90000 in the kernel: %+v, want %+v", v, want)
	}
	var v6 sockLb6RevNat
	must(t, m.revNat6.Lookup(uint32(7), &v6))
	if v6.Flags != rnPresent || v6.Vip != v6addr(fe6.Addr) {
		t.Errorf("rev_nat6 7 in the kernel: %+v, want %s present", v6, fe6)
	}
	// The single-entry call too.
	fe3 := reconciler.DefaultScope(l4("10.96.0.12", 80, model.TCP))
	must(t, m.UpsertRevNat(3, fe3))
	none("after UpsertRevNat")

	revNats := func(ks *reconciler.KernelState, err error) map[reconciler.ServiceID]reconciler.Frontend {
		t.Helper()
		if err != nil {
			t.Fatalf("Dump: %v", err)
		}
		return ks.RevNat
	}
	want := map[reconciler.ServiceID]reconciler.Frontend{1: fe1, 90_000: fe2, 7: fe6, 3: fe3}
	if got := revNats(m.Dump()); !reflect.DeepEqual(got, want) {
		t.Errorf("Dump: rev_nat %v, want %v", got, want)
	}
	none("after a Dump")

	// Deleted: absent in the kernel, the frontend kept; read by none.
	if n, err := m.DeleteRevNats([]reconciler.ServiceID{90_000, 7, 12345}); n != 3 || err != nil {
		t.Fatalf("DeleteRevNats = %d, %v", n, err)
	}
	must(t, m.DeleteRevNat(3))
	none("after the deletes")
	must(t, m.revNat.Lookup(uint32(90_000), &v))
	if v.Flags != 0 || v.Vip != be32(fe2.Addr) {
		t.Errorf("deleted rev_nat 90000: %+v, want its frontend kept, absent", v)
	}
	want = map[reconciler.ServiceID]reconciler.Frontend{1: fe1}
	if got := revNats(m.Dump()); !reflect.DeepEqual(got, want) {
		t.Errorf("Dump after the deletes: rev_nat %v, want %v", got, want)
	}
	p, err := OpenPinned(bpffs)
	must(t, err)
	got := revNats(p.Dump())
	ids, err := readRevNat(p.revNat, p.revNat6)
	p.Close()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("OpenPinned's Dump after the deletes: rev_nat %v, want %v", got, want)
	}
	if err != nil || !reflect.DeepEqual(ids, map[uint32]model.L4Addr{1: fe1.L4Addr}) {
		t.Errorf("OpenPinned's service ids for the counters: %v, %v; want only 1 (%s)", ids, err, fe1)
	}
	fills, err := d.MapFill()
	must(t, err)
	if i := slices.IndexFunc(fills, func(f MapFill) bool { return f.Pin == mapRevNat }); i < 0 ||
		fills[i].Entries != 1 || fills[i].Capacity != 100_000 {
		t.Errorf("map fill of %s in %+v: want 1 entry of 100000", mapRevNat, fills)
	}
}
