package datapath

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// mappedWindows records the address ranges of the windows the array code
// maps (through mmapArray) while a test runs, so that the RSS it counts is
// theirs alone, not that of another BPF map the test process maps or
// unmaps meanwhile (an earlier test's datapath: a page of one that went
// away made a scan's RSS -4 KiB once).
type mappedWindows struct {
	ranges  [][2]uintptr
	lengths []int
}

// recordWindows makes mmapArray record its mappings in the result until
// t ends.
func recordWindows(t *testing.T) *mappedWindows {
	t.Helper()
	w := &mappedWindows{}
	override(t, &mmapArray, func(fd int, off int64, length, prot, flags int) ([]byte, error) {
		b, err := unix.Mmap(fd, off, length, prot, flags)
		if err == nil && len(b) > 0 {
			p := uintptr(unsafe.Pointer(&b[0]))
			w.ranges = append(w.ranges, [2]uintptr{p, p + uintptr(len(b))})
			w.lengths = append(w.lengths, length)
		}
		return b, err
	})
	return w
}

// holds reports whether [start, end) overlaps a recorded window.
func (w *mappedWindows) holds(start, end uintptr) bool {
	for _, r := range w.ranges {
		if start < r[1] && r[0] < end {
			return true
		}
	}
	return false
}

// rss is the RSS of the process's mappings of BPF maps (/proc/self/smaps)
// that lie on the recorded windows, in bytes.
func (w *mappedWindows) rss(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	total, inMap := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			start, end, _ := strings.Cut(fields[0], "-")
			s, err1 := strconv.ParseUint(start, 16, 64)
			e, err2 := strconv.ParseUint(end, 16, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("smaps: %q", line)
			}
			inMap = len(fields) >= 6 && fields[5] == "anon_inode:bpf-map" && w.holds(uintptr(s), uintptr(e))
			continue
		}
		if inMap && len(fields) == 3 && fields[0] == "Rss:" {
			kb, err := strconv.Atoi(fields[1])
			if err != nil {
				t.Fatalf("smaps: %q", line)
			}
			total += kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}

// mappableArray is a mappable BPF array of n entries of 20 bytes (24 in
// its memory, as the backends arrays' values are laid out), closed when t
// ends; privileged.
func mappableArray(t *testing.T, n uint32) *ebpf.Map {
	t.Helper()
	testutil.Privileged(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 20, MaxEntries: n, Flags: unix.BPF_F_MMAPABLE})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestArrayScanMapsAWindow: a scan of a mappable array (the backends
// arrays, at each metrics scrape and refresh of the view) keeps no more
// than a window of it mapped at a time, so in the agent's RSS, and nothing
// once done; and it yields every entry that is not all zero, at the
// windows' edges too. With the whole array mapped for the scan (as before),
// the 24-byte entries of the array below add 7 MiB to the RSS.
func TestArrayScanMapsAWindow(t *testing.T) {
	const n = 300_000
	m := mappableArray(t, n)
	per := windowEntries(24)
	if per*24%os.Getpagesize() != 0 || per*24 > arrayWindow+os.Getpagesize() {
		t.Fatalf("a window of %d entries of 24 bytes", per)
	}
	want := []uint32{0, 1, uint32(per - 1), uint32(per), uint32(per + 1), uint32(3*per + 7), n / 2, n - 2, n - 1}
	for _, k := range want {
		v := make([]byte, 20)
		binary.NativeEndian.PutUint32(v, k+1)
		v[19] = 1
		if err := m.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}

	windows := recordWindows(t)
	most := 0
	var got []uint32
	err := eachArrayEntry(m, func(k uint32, v []byte) error {
		if binary.NativeEndian.Uint32(v) != k+1 || !bytes.Equal(v[4:19], make([]byte, 15)) || v[19] != 1 {
			t.Errorf("entry %d: %x", k, v)
		}
		got = append(got, k)
		most = max(most, windows.rss(t))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("entries %v, want %v", got, want)
	}
	if most > arrayWindow+os.Getpagesize() {
		t.Errorf("%d KiB of the array mapped during the scan, want at most a window (%d KiB)", most>>10, arrayWindow>>10)
	}
	if most == 0 {
		t.Errorf("no mapping seen during the scan: the test does not see what it checks")
	}
	if after := windows.rss(t); after != 0 {
		t.Errorf("%d KiB of the array still mapped after the scan", after>>10)
	}
}

// TestArrayValuesMapsWindows: reading some entries of a mappable array (a
// delete of backends, which clears their ids in both families' arrays)
// maps only windows that hold them, one at a time, and reads each entry
// into its place whatever the order of the keys. Mapping the whole array
// (as before) put all of its pages in the RSS: the kernel maps them when
// the array is.
func TestArrayValuesMapsWindows(t *testing.T) {
	const n = 300_000
	m := mappableArray(t, n)
	per := windowEntries(24)
	keys := []uint32{n - 1, 0, uint32(per), n / 2, uint32(per - 1), 5, uint32(per)}
	for _, k := range keys {
		var v [20]byte
		binary.NativeEndian.PutUint32(v[:], k+1)
		if err := m.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	windows := recordWindows(t)
	values := make([][20]byte, len(keys))
	if err := arrayValues(m, keys, values); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if got := binary.NativeEndian.Uint32(values[i][:]); got != k+1 {
			t.Errorf("entry %d read as %d's", k, got-1)
		}
	}
	// Windows 0, 1 and those of n/2 and n-1, each once.
	if len(windows.lengths) != 4 {
		t.Errorf("%d mappings %v, want one per window with keys (4)", len(windows.lengths), windows.lengths)
	}
	for _, l := range windows.lengths {
		if l > arrayWindow+os.Getpagesize() {
			t.Errorf("mapped %d KiB at once, want at most a window (%d KiB)", l>>10, arrayWindow>>10)
		}
	}
	if after := windows.rss(t); after != 0 {
		t.Errorf("%d KiB of the array still mapped after the read", after>>10)
	}
}
