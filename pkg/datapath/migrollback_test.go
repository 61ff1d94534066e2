package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// TestMigRollbackCopyErrorCountsRest (review12 LOW-2): a copy of
// sluice_conntrack that fails inserting (here E2BIG: the new map holds
// one entry) still counts as left behind every entry of the old map that
// holds a place in the half-open count, those read after the error too:
// their places go with the old map, and settle (or the undo of a failed
// start) takes them off. Three counted forward entries, one goes in: two
// left behind. Before, the copy returned at the error, counting none.
func TestMigRollbackCopyErrorCountsRest(t *testing.T) {
	testutil.Privileged(t)
	newMap := func(max uint32) *ebpf.Map {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: uint32(binary.Size(sockCt4Key{})),
			ValueSize: uint32(binary.Size(sockCt4Entry{})), MaxEntries: max})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	old, cur := newMap(8), newMap(1)
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		k := sockCt4Key{}.withTuple(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(1 + i)}), 40000),
			netip.MustParseAddrPort("10.96.0.1:80"), 6, ctForward)
		v := sockCt4Entry{Expires: now + 60e9}
		if _, _, _, dir := k.tuple(); !counted(dir, v.view().flags) {
			t.Fatal("the planted entry holds no place")
		}
		if err := old.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
	off, err := copyConntrackCounting(old, cur, func(*sockCt4Key, *sockCt4Entry, uint64) bool { return true })
	if err == nil {
		t.Fatal("copying 3 entries into a map of 1 did not fail")
	}
	if off != 2 {
		t.Errorf("left behind %d counted entries, want 2 (the two that did not fit): %v", off, err)
	}
}
