package datapath

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
)

// The conntrack of either family, for tests that run over IPv4 and IPv6
// (forFamilies): a key names a flow's entry by its addresses, and the
// helpers find it in the tables of their family, sluice_conntrack and
// sluice_ct_new or their IPv6 twins (bpf/lib/tc6.h), whose key and entry
// layouts differ only in the width of the addresses.

// ctK is the conntrack key of a packet <src -> dst> in direction dir.
type ctK struct {
	src, dst netip.AddrPort
	proto    model.Protocol
	dir      uint8
}

func (k ctK) v6() bool { return is6(k.src.Addr()) }

func (k ctK) k4() sockCt4Key {
	return sockCt4Key{Saddr: be32(k.src.Addr()), Daddr: be32(k.dst.Addr()), Sport: be16(k.src.Port()), Dport: be16(k.dst.Port()),
		Proto: uint8(k.proto), Dir: k.dir}
}

func (k ctK) k6() tcCt6Key {
	return tcCt6Key{Saddr: tcV6addr{Addr: k.src.Addr().As16()}, Daddr: tcV6addr{Addr: k.dst.Addr().As16()},
		Sport: be16(k.src.Port()), Dport: be16(k.dst.Port()), Proto: uint8(k.proto), Dir: k.dir}
}

func (k ctK) String() string {
	return fmt.Sprintf("%s %s -> %s dir %d", k.proto, k.src, k.dst, k.dir)
}

// ctTables6 returns the IPv6 conntrack tables of m (established, then
// half-open), opened from their pins once per m and closed when the test
// that first asked ends.
func ctTables6(t testing.TB, m *Maps) []*ebpf.Map {
	t.Helper()
	if ms, ok := ct6Opened.Load(m); ok {
		return ms.([]*ebpf.Map)
	}
	var out []*ebpf.Map
	for _, name := range []string{mapConntrack6, mapCTNew6} {
		cm, err := ebpf.LoadPinnedMap(filepath.Join(m.cfg.BPFFS, "sluice", name), nil)
		if err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		t.Cleanup(func() { _ = cm.Close() }) // writes are done by then
		out = append(out, cm)
	}
	t.Cleanup(func() { ct6Opened.Delete(m) })
	ct6Opened.Store(m, out)
	return out
}

// ct6Opened holds ctTables6's tables by their Maps.
var ct6Opened sync.Map

// ctTablesOf returns the conntrack tables of k's family.
func ctTablesOf(t testing.TB, m *Maps, k ctK) []*ebpf.Map {
	if k.v6() {
		return ctTables6(t, m)
	}
	return ctMaps(m)
}

// ctLookup returns the conntrack entry under k (established or half-open,
// alive or not), if any.
func ctLookup(t testing.TB, m *Maps, k ctK) (ctView, bool) {
	t.Helper()
	for _, cm := range ctTablesOf(t, m, k) {
		if k.v6() {
			key, v := k.k6(), tcCt6Entry{}
			if cm.Lookup(&key, &v) == nil {
				return v.view(), true
			}
			continue
		}
		key, v := k.k4(), sockCt4Entry{}
		if cm.Lookup(&key, &v) == nil {
			return v.view(), true
		}
	}
	return ctView{}, false
}

// ctRemove deletes the entry under k, as an LRU eviction or the GC would.
func ctRemove(t testing.TB, m *Maps, k ctK) {
	t.Helper()
	for _, cm := range ctTablesOf(t, m, k) {
		var err error
		if k.v6() {
			key := k.k6()
			err = cm.Delete(&key)
		} else {
			key := k.k4()
			err = cm.Delete(&key)
		}
		if err == nil {
			return
		}
	}
	t.Fatalf("delete conntrack entry %s: not found", k)
}

// ctSetSeen makes the entry under k look last refreshed at monotonic
// time now+delta (negative: in the past).
func ctSetSeen(t testing.TB, m *Maps, k ctK, delta time.Duration) {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	expires := func(flags uint32) uint64 {
		return uint64(int64(now) + delta.Nanoseconds() + ctLifetime(m.cfg, uint8(k.proto), flags).Nanoseconds())
	}
	for _, cm := range ctTablesOf(t, m, k) {
		var found bool
		if k.v6() {
			found, err = ctEdit(cm, k.k6(), func(v *tcCt6Entry) { v.Expires = expires(v.Flags) })
		} else {
			found, err = ctEdit(cm, k.k4(), func(v *sockCt4Entry) { v.Expires = expires(v.Flags) })
		}
		if err != nil {
			t.Fatal(err)
		}
		if found {
			return
		}
	}
	t.Fatalf("no conntrack entry %s", k)
}

// ctEdit hands the entry under key in cm, if any, to edit and writes it
// back; it reports whether there was one.
func ctEdit[K, V any](cm *ebpf.Map, key K, edit func(*V)) (bool, error) {
	var v V
	if cm.Lookup(&key, &v) != nil {
		return false, nil
	}
	edit(&v)
	return true, cm.Update(&key, &v, ebpf.UpdateExist)
}

// snatPortIn is snatPortOf, or snatPort6Of for an IPv6 frontend.
func snatPortIn(t testing.TB, d *Datapath, client string, cport uint16, fe model.L4Addr) uint16 {
	t.Helper()
	if is6(fe.Addr) {
		return snatPort6Of(t, d, client, cport, fe)
	}
	return snatPortOf(t, d.Maps(), client, cport, fe)
}

// twinPrefix is the IPv6 twin of an IPv4 prefix p when v6 is set, p's
// length a whole number of octets: the prefix of the twins of its
// addresses (twinAddr: 10.96.0.0/16 -> 2001:db8:a:60::/64).
func twinPrefix(v6 bool, p string) netip.Prefix {
	pp := netip.MustParsePrefix(p)
	if !v6 {
		return pp
	}
	return netip.PrefixFrom(addr(twinAddr(true, pp.Addr().String())), 32+2*pp.Bits()).Masked()
}
