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
// count in its RSS only where it wrote (arraymem.go). An IPv4 service
// maps one window of the IPv4 slots array and the windows of its
// backends' ids in the IPv4 backends array; the IPv6 arrays are not
// mapped at all, and a delete of the IPv4 backends does not map them
// either. Fails with the arrays mapped whole (the IPv6 arrays' whole size
// in the RSS, all four arrays' windows mapped from the start).
func TestArraysMappedWhereWritten(t *testing.T) {
	d := openTestWith(t, smallConfig, func(c *Config) {
		c.MaxBackends = 100_000 // 1.6 MB of IPv4 backends, 4 MB of IPv6
		c.MaxServiceEntries = 100_000
	})
	m := d.Maps()
	tables := map[string]*lazyArray{"backends": m.be4.a, "backends6": m.be6.a, "slots": m.slots4.a, "slots6": m.slots6.a}
	for name, a := range tables {
		if a.count != 0 || rssOf(t, a) != 0 {
			t.Errorf("%s after Open: %d windows mapped, %d bytes in the RSS; want none", name, a.count, rssOf(t, a))
		}
	}
	// Two backends far apart: ids 1 and 90,000 (16-byte entries: 1.4 MB
	// apart, windows 0 and 5).
	b1 := testBackend{1, l4("10.1.7.1", 8080, model.TCP)}
	b2 := testBackend{90_000, l4("10.1.7.2", 8080, model.TCP)}
	addService(t, m, 7, vipTCP, b1, b2)

	want := map[string]int{"backends": 2, "backends6": 0, "slots": 1, "slots6": 0}
	for name, a := range tables {
		if a.count != want[name] {
			t.Errorf("%s: %d windows mapped, want %d", name, a.count, want[name])
		}
		if got := rssOf(t, a); got != a.mappedBytes() || got >= len(a.mem) {
			t.Errorf("%s: %d bytes in the RSS, want its %d windows' %d (of %d reserved)", name, got, a.count, a.mappedBytes(), len(a.mem))
		}
	}
	must(t, m.DeleteBackend(b1.id))
	must(t, m.DeleteBackend(b2.id))
	if n := m.be6.a.count; n != 0 {
		t.Errorf("deleting IPv4 backends mapped %d windows of the IPv6 array, want none", n)
	}
	var v sockLb4Backend
	must(t, m.backends.Lookup(uint32(b2.id), &v))
	if v.Flags != 0 || v.Addr != be32(b2.addr.Addr) {
		t.Errorf("deleted backend %d: %+v, want its address kept, absent", b2.id, v)
	}
}

// TestBackendsClearedOutsideMappedWindows: a backend present in a
// window the agent has not mapped (left by its predecessor in the pinned
// array) is cleared by the system call when deleted, and the window stays
// unmapped. Fails if a delete skips what it has not mapped (the entry
// stays present).
func TestBackendsClearedOutsideMappedWindows(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		d := newTestDatapath(t)
		m := d.Maps()
		tbl := m.be4
		if v6 {
			tbl = m.be6
		}
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
			t.Errorf("the delete mapped %d windows, want none", tbl.a.count)
		}
	})
}
