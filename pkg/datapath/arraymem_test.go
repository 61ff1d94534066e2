package datapath

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

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
	none := func(when string) {
		t.Helper()
		for name, a := range tables {
			if rss := rssOf(t, a); a.count != 0 || rss != 0 {
				t.Errorf("%s %s: %d windows mapped, %d bytes in the RSS; want none", name, when, a.count, rss)
			}
		}
	}
	none("after Open")
	// While a backend is stored: its window, and nothing of the other
	// family's array.
	stores := 0
	m.be4.onStore = func(int) {
		if stores++; stores > 1 {
			return
		}
		if rss := rssOf(t, m.be4.a); m.be4.a.count != 1 || rss != m.be4.a.mappedBytes() || rss == 0 || rss >= len(m.be4.a.mem) {
			t.Errorf("backends while stored: %d windows mapped, %d bytes in the RSS; want one window's %d", m.be4.a.count, rss, m.be4.a.mappedBytes())
		}
		if rss := rssOf(t, m.be6.a); rss != 0 {
			t.Errorf("backends6 while IPv4 backends are stored: %d bytes in the RSS, want none", rss)
		}
	}
	// Two backends far apart: ids 1 and 90,000 (16-byte entries: 1.4 MB
	// apart, windows 0 and 5).
	b1 := testBackend{1, l4("10.1.7.1", 8080, model.TCP)}
	b2 := testBackend{90_000, l4("10.1.7.2", 8080, model.TCP)}
	addService(t, m, 7, vipTCP, b1, b2)
	if stores == 0 {
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
