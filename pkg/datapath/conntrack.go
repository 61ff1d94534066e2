package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/model"
)

// Conntrack upkeep: the agent's side of bpf/lib/conntrack.h and
// bpf/ctgc.c.
//
// Established flows live in sluice_conntrack, a plain hash that nothing
// evicts, so expired entries stay until the agent's GC deletes them. The
// GC is a BPF program (bpf/ctgc.c) that the agent runs: it judges each
// entry by the same clock and rules as the datapath and deletes it with a
// compare-and-swap of the expiry it saw, so an entry the datapath
// refreshed or re-created meanwhile is never lost (listing expired keys
// here and deleting them later lost them). The same program flushes the
// flows of a set of backends in one pass over both conntrack maps.

// ConntrackStats is what a garbage collection found.
type ConntrackStats struct {
	Deleted int // expired entries deleted
	Live    int // entries left in sluice_conntrack (established flows, SNAT reservations); of the fuller family's table
	Pending int // of them, port reservations and entries of flows not answered yet
	Max     int // sluice_conntrack's size (each family's): new flows stay in sluice_ct_new when Live reaches it

	// HalfOpen is how many flows not answered yet (TCP: not assured
	// yet) the collection found in sluice_conntrack (both families; a
	// source-NATed flow by its port reservation), HalfOpenCounted what the
	// programs' count of them says after it (bpf/lib/conntrack.h,
	// ct_admit_add); new flows go there while the count is below
	// HalfOpenMax (Config.CTHalfOpenMax, each family), to sluice_ct_new
	// beyond. The two differ by the flows opened or answered during the
	// pass; a difference that lasts is a drift of the count, which the
	// collection corrects (HalfOpenResynced).
	HalfOpen, HalfOpenCounted, HalfOpenMax int

	// HalfOpenResynced is what the collection added to each family's
	// count (index 0: IPv4, 1: IPv6) to correct its drift
	// (halfOpenDrift): negative if it counted flows that are gone, 0 if
	// it made no correction. HalfOpenCounted is the count before it.
	HalfOpenResynced [2]int64

	// Refused counts the new flows sluice_conntrack had no room for so
	// far (since the pins were created): refused (tc_ct_est_full: port
	// reservations; tc_snat_half_open_full: source-NATed flows beyond
	// the half-open share), or kept in sluice_ct_new, the LRU, instead
	// (tc_ct_est_overflow: answered flows).
	Refused uint64
}

// GCConntrack deletes the expired entries of sluice_conntrack (idle past
// their timeout, closed TCP flows past the close timeout, source-NATed
// ones closed by FINs past the SNAT TIME_WAIT timeout), keeping
// those whose flow's other entry is alive, so dead flows neither fill the
// table nor hold SNAT ports.
//
// Each family's tables are collected (IPv4's, then IPv6's, whose tables
// are as large): Deleted counts both, Live and Pending are the fuller
// table's, the one that refuses new flows first.
//
// Then each family's count of half-open flows is resynced with what the
// pass found (halfOpenDrift), except while an agent's start is not
// committed (HoldConntrackNew): the previous release's programs may still
// run then, on tables and counts of their own.
func (m *Maps) GCConntrack() (ConntrackStats, error) {
	st := ConntrackStats{Max: m.cfg.MaxConntrack, HalfOpenMax: max(m.cfg.CTHalfOpenMax, 0)}
	mode := uint32(ctGCCollect)
	held := m.ctNewHeld.Load()
	if held {
		mode = ctGCHeld
	}
	m.halfOpen.mu.Lock()
	defer m.halfOpen.mu.Unlock()
	for _, family := range []uint32{4, 6} {
		// On an error, st keeps the corrections made so far (an
		// IPv4 one before an IPv6 failure), for them to be counted.
		a, err := m.runCTGC(mode, family)
		if err != nil {
			return st, fmt.Errorf("conntrack gc: %w", err)
		}
		st.Deleted += int(a.Deleted)
		st.HalfOpen += int(a.HalfOpen)
		n, err := m.HalfOpenCounted(family)
		if err != nil {
			return st, fmt.Errorf("conntrack gc: %w", err)
		}
		st.HalfOpenCounted += int(n)
		if int(a.Live) >= st.Live {
			st.Live, st.Pending = int(a.Live), int(a.Pending)
		}
		idx := ctAdmitIndex(family)
		if held || m.ctAdmit == nil {
			m.halfOpen.last[idx] = 0
			continue
		}
		if fix := m.halfOpen.next(idx, n-int64(a.HalfOpen), halfOpenBand(st.HalfOpenMax)); fix != 0 {
			if err := m.adjustHalfOpen(family, fix); err != nil {
				return st, fmt.Errorf("conntrack gc: %w", err)
			}
			st.HalfOpenResynced[idx] = fix
		}
	}
	var err error
	if st.Refused, err = m.ConntrackRefused(); err != nil {
		return st, fmt.Errorf("conntrack gc: %w", err)
	}
	return st, nil
}

// HalfOpenCounted returns the programs' count of the half-open flows in
// family's sluice_conntrack (4 or 6): the shared word plus every CPU's
// part not folded into it yet (bpf/lib/conntrack.h, ct_admit_add).
func (m *Maps) HalfOpenCounted(family uint32) (int64, error) {
	if m.ctAdmit == nil || m.ctPcpu == nil {
		return 0, nil
	}
	idx := ctAdmitIndex(family)
	word := func() (int64, error) {
		var g sockCtAdmit
		if err := m.ctAdmit.Lookup(idx, &g); err != nil {
			return 0, fmt.Errorf("read %s: %w", mapCTAdmit, err)
		}
		return g.Pending, nil
	}
	// A CPU folding its part into the word (ct_admit_add: its part
	// less, then the word more) between the two reads would be missed:
	// the word is read again after the parts, until it did not move (a
	// few tries; the last reading is taken after them).
	var n int64
	for try := 0; try < 4; try++ {
		w, err := word()
		if err != nil {
			return 0, err
		}
		var parts []sockCtAdmitPcpu
		if err := m.ctPcpu.Lookup(idx, &parts); err != nil {
			return 0, fmt.Errorf("read %s: %w", mapCTPcpu, err)
		}
		n = w
		for _, p := range parts {
			n += p.Pending
		}
		if again, err := word(); err != nil || again == w {
			return n, err
		}
	}
	return n, nil
}

// halfOpenDrift is what GCConntrack remembers of each family's count of
// half-open flows (index as ctAdmitIndex): the count less what the last
// collection found (ct_gc_counted in bpf/lib/ctgc_fam.h: the entries the
// count holds), 0 after a correction.
//
// The count is kept right by the programs alone only if every flow
// counted is taken off exactly once; one counted and never taken off (an
// older release's program that deleted its entries while an upgrade
// replaced it, a path that missed it) stays for good, and since
// source-NATed flows are refused beyond the share (ct_snat_room), enough
// of them would refuse every new source-NATed flow of the node until a
// restart. So a difference that lasts two collections in a row, the same
// way, is corrected, by the smaller of the two: a flow opened or answered
// during a pass, which the pass finds or misses by chance, makes one
// collection's difference alone, and is never corrected for. Both ways:
// a count too low admits more than the share. A difference within
// halfOpenBand is no drift: a pass under churn (a flood refilling the
// slots the pass frees, behind its cursor; a busy node's short-lived
// flows) differs from the count by that much every time, the same way
// under a flood, and would be "corrected" every other pass, biasing the
// count below the truth; a leak that matters is larger.
//
// The band cannot go with what a collection sees today. Reading the count
// before the walk too, and tallying what the pass's own reaps take off,
// bounds a drift only while the churn goes one way: with only arrivals
// (a flood), before - reaped - found <= drift <= after - found; with only
// departures, the other way round. Both ways at once defeat every rule
// over those four numbers: a flow counted at the start whose client's
// ACK takes it off before the cursor reaches it, and a new flow counted
// behind the cursor, read as before 1, after 1, found 0, reaped 0, which
// an idle node with one flow leaked reads too, pass after pass; so a rule
// that corrects that leak takes a right count of a busy node below the
// truth. A band-free rule needs tallies of the flows counted (arrivals)
// and taken off by others than the pass (departures) during the walk,
// monotonic, kept beside ct_admit_add; they bound what the pass cannot
// see: drift >= max(before - reaped - found - departures,
// after - found - arrivals), whatever the interleaving.
type halfOpenDrift struct {
	mu   sync.Mutex // held by GCConntrack
	last [2]int64
}

// next records d, the family idx's count less what this collection found,
// and returns what to add to the count: the opposite of the smaller of d
// and the last collection's difference if both are the same way and
// beyond band, else 0.
func (h *halfOpenDrift) next(idx uint32, d, band int64) int64 {
	if -band <= d && d <= band {
		h.last[idx] = 0
		return 0
	}
	prev := h.last[idx]
	h.last[idx] = d
	switch {
	case prev > 0 && d > 0:
		h.last[idx] = 0
		return -min(prev, d)
	case prev < 0 && d < 0:
		h.last[idx] = 0
		return -max(prev, d)
	}
	return 0
}

// halfOpenBand is how far the count may differ from what a collection
// found without being drift: a 64th of the share (1,024 flows at the
// default share of 65,536: a flood of tens of thousands of SYNs a second
// refills fewer behind a pass's cursor, and the share, a quarter of the
// table, is exceeded by at most that much), nothing for a share under
// 64 (the tests').
func halfOpenBand(share int) int64 { return int64(share / 64) }

// adjustHalfOpen adds d to family's count of half-open flows, by an
// atomic add of sluice_ct_gc (bpf/ctgc.c, ct_admit_fix): the programs
// add to the word meanwhile, so a write from here would lose theirs.
func (m *Maps) adjustHalfOpen(family uint32, d int64) error {
	in := sockCtGcArgs{Flush: ctGCAdjust, Family: family, Adjust: d}
	var out sockCtGcArgs
	if _, err := m.ctGC.Run(&ebpf.RunOptions{Context: in, ContextOut: &out}); err != nil {
		return fmt.Errorf("run sluice_ct_gc: adjust the half-open count: %w", err)
	}
	if out.Adjust != d {
		return fmt.Errorf("adjust the half-open count of IPv%d: %s missing", family, mapCTAdmit)
	}
	return nil
}

// ctAdmitIndex is family's index in sluice_ct_admit and sluice_ct_pcpu.
func ctAdmitIndex(family uint32) uint32 {
	if family == 6 {
		return 1
	}
	return 0
}

// HoldConntrackNew sets each family's new_live word whatever the LRU
// holds, and keeps it set until ReleaseConntrackNew: collections meanwhile
// leave it alone (bpf/ctgc.c, ct_new_hold). An agent's start holds it
// before it attaches a program (AttachDevices) and releases it once the
// start is committed (Commit): until then the previous release's
// programs may run on some device and insert into the LRU without setting
// the word, and a collection that cleared it would hide those half-open
// flows from the new programs beside them (their replies untranslated).
// After Commit, the programs set it on their inserts, and each
// collection clears it and sets it again if the LRU holds a key
// (bpf/ctgc.c, ct_new_gate).
func (m *Maps) HoldConntrackNew() error {
	m.ctNewHeld.Store(true)
	for _, family := range []uint32{4, 6} {
		if _, err := m.runCTGC(ctGCHold, family); err != nil {
			return fmt.Errorf("conntrack gate: %w", err)
		}
	}
	return nil
}

// ReleaseConntrackNew lets the collections clear the new_live word again
// (HoldConntrackNew).
func (m *Maps) ReleaseConntrackNew() {
	if m != nil {
		m.ctNewHeld.Store(false)
	}
}

// ConntrackRefused returns how many new flows sluice_conntrack had no room
// for so far (ConntrackStats.Refused: the tc_ct_est_full,
// tc_ct_est_overflow and tc_snat_half_open_full counters, the last a
// source-NATed flow refused while the half-open share is taken, which a
// collection may free: expired reservations): three map lookups, cheap
// enough to poll.
func (m *Maps) ConntrackRefused() (uint64, error) {
	var sum uint64
	for _, c := range []struct {
		reason sockMetricReason
		name   string
	}{
		{sockMetricReasonMETRIC_TC_CT_EST_FULL, "tc_ct_est_full"},
		{sockMetricReasonMETRIC_TC_CT_EST_OVERFLOW, "tc_ct_est_overflow"},
		{sockMetricReasonMETRIC_TC_SNAT_HALF_OPEN_FULL, "tc_snat_half_open_full"},
	} {
		var perCPU []uint64
		if err := m.metrics.Lookup(uint32(c.reason), &perCPU); err != nil {
			return 0, fmt.Errorf("read %s: %w", c.name, err)
		}
		for _, n := range perCPU {
			sum += n
		}
	}
	return sum, nil
}

// ctFlushBatch is how many backends one flush pass takes (the size of
// sluice_ct_flush in bpf/lib/maps.h).
const ctFlushBatch = 4096

// FlushConntrack deletes the per-packet conntrack entries of flows
// translated to any of backends: forward entries that name one and reverse
// entries keyed by its replies, established or half-open. The next packet
// of such a flow selects again. One pass over the maps covers up to
// ctFlushBatch backends. The connected UDP sockets the socket programs
// sent to one of them are ended as well (sockdestroy.go), so that they
// connect again: reported through OnSocketTermination, never an error
// here (the conntrack flush, which the reconciler retries, succeeded).
//
// IPv6 backends are flushed from the IPv6 tables the same way, in passes
// of their own, and their connected sockets ended alike.
func (m *Maps) FlushConntrack(backends []model.L4Addr) error {
	keys := make([]sockCtBackendKey, 0, len(backends))
	var keys6 []tcCt6BackendKey
	for _, b := range backends {
		b.Addr = b.Addr.Unmap()
		if b.Addr.Is6() {
			if b.Proto != model.TCP && b.Proto != model.UDP {
				return fmt.Errorf("flush conntrack: %s: protocol not supported", b)
			}
			keys6 = append(keys6, tcCt6BackendKey{Addr: tcV6addr{Addr: b.Addr.As16()}, Port: be16(b.Port), Proto: uint8(b.Proto)})
			continue
		}
		b, err := checkL4(b)
		if err != nil {
			return fmt.Errorf("flush conntrack: %w", err)
		}
		keys = append(keys, sockCtBackendKey{Addr: be32(b.Addr), Port: be16(b.Port), Proto: uint8(b.Proto)})
	}
	for batch := range slices.Chunk(keys, ctFlushBatch) {
		if err := flushBatch(m, m.ctFlush, mapCTFlush, 4, batch, m.terminateSockets); err != nil {
			return fmt.Errorf("flush conntrack of %d backends: %w", len(backends), err)
		}
	}
	for batch := range slices.Chunk(keys6, ctFlushBatch) {
		if err := flushBatch(m, m.ctFlush6, mapCTFlush6, 6, batch, m.terminateSockets6); err != nil {
			return fmt.Errorf("flush conntrack of %d backends: %w", len(backends), err)
		}
	}
	return nil
}

// flushBatch runs one flush pass over the conntrack tables of family for
// the backends keys, through their flush set (named name), then hands
// keys to after, if not nil.
func flushBatch[K any](m *Maps, set *ebpf.Map, name string, family uint32, keys []K, after func([]K)) error {
	one := make([]uint8, len(keys))
	for i := range one {
		one[i] = 1
	}
	return runOverSet(set, name, keys, one, func() error {
		_, err := m.runCTGC(ctGCFlush, family)
		// The connected sockets of the UDP ones go too (they keep the
		// backend otherwise), while the set is in the map for the
		// iterator.
		if after != nil {
			after(keys)
		}
		return err
	})
}

// runOverSet runs a BPF pass that reads its work from a request set: the
// map set (named name, for errors) is cleared of the leftovers of an
// agent that died in the middle of a pass (not to be applied again), gets
// keys with vals, run runs the pass, and the set is emptied again
// whatever happened: it must not linger into the next pass.
// sluice_ct_flush (flushBatch) and sluice_aff_fix (affFixes.run) work
// this way.
func runOverSet[K, V any](set *ebpf.Map, name string, keys []K, vals []V, run func() error) error {
	var k K
	var v V
	var stale []K
	for it := set.Iterate(); it.Next(&k, &v); {
		stale = append(stale, k)
	}
	for i := range stale {
		if err := deleteIgnoringMissing(set, &stale[i]); err != nil {
			return fmt.Errorf("clear %s: %w", name, err)
		}
	}
	if _, err := set.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	runErr := run()
	_, delErr := set.BatchDelete(keys, nil)
	if errors.Is(delErr, ebpf.ErrKeyNotExist) {
		delErr = nil
	}
	return errors.Join(runErr, delErr)
}

// The modes of sluice_ct_gc (bpf/ctgc.c: CT_GC_COLLECT, ...).
const (
	ctGCCollect = 0 // delete expired entries, then the LRU's new_live word
	ctGCFlush   = 1 // forget the flows of the backends in sluice_ct_flush
	// 2 was a gate at an agent's start, which the hold replaced.
	ctGCHold = 3 // set the new_live word
	ctGCHeld = 4 // as ctGCCollect, the new_live word left as it is
	// add ct_gc_args.adjust to the family's half-open count
	ctGCAdjust = 5
)

// runCTGC runs sluice_ct_gc in mode (ctGCCollect, ...) over the conntrack
// tables of family (4 or 6).
func (m *Maps) runCTGC(mode, family uint32) (sockCtGcArgs, error) {
	// The run judges expiry by the agent's reading of the programs'
	// clock: a syscall program may not call bpf_ktime_get_coarse_ns, and
	// bpf_ktime_get_ns runs up to a tick ahead of it (an entry the
	// programs still take for alive would be deleted).
	now, err := monotonicNow()
	if err != nil {
		return sockCtGcArgs{}, fmt.Errorf("read the clock: %w", err)
	}
	in := sockCtGcArgs{Flush: mode, Family: family, Now: now}
	var out sockCtGcArgs
	if _, err := m.ctGC.Run(&ebpf.RunOptions{Context: in, ContextOut: &out}); err != nil {
		return out, fmt.Errorf("run sluice_ct_gc: %w", err)
	}
	return out, nil
}

// monotonicNow is the programs' clock (now_ns in bpf/lib/consts.h:
// bpf_ktime_get_coarse_ns), CLOCK_MONOTONIC_COARSE, which the vDSO reads
// from the same timekeeper update: an entry this plants or judges as
// expired a nanosecond before "now" is expired to the programs too, where
// CLOCK_MONOTONIC would run up to a tick ahead of them.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Nano()), nil
}

// ct4EntryRelease0 is struct ct4_entry as release 0 stored it in
// sluice_conntrack: the time of the last packet rather than of expiry,
// 8-bit flags.
type ct4EntryRelease0 struct {
	LastSeen  uint64
	NatAddr   uint32
	NatPort   uint16
	Flags     uint8
	_         uint8
	BackendId uint32
	RevNatId  uint32
	SnatAddr  uint32
	SnatPort  uint16
	_         uint16
}

// ctTimeouts are the conntrack lifetimes, by the names of their constants
// (snatTW: ct_timeout_snat_tw_ns).
type ctTimeouts struct{ tcp, syn, udp, close, snatTW uint64 }

// lifetime is bpf/lib/conntrack.h's ct_lifetime.
func (t ctTimeouts) lifetime(proto uint8, flags uint32) uint64 {
	switch {
	case proto != uint8(model.TCP):
		return t.udp
	case ctClosed(flags) && ctSNATHeld(flags):
		return t.snatTW
	case ctClosed(flags):
		return t.close
	case flags&ctFlagChal != 0:
		return t.syn
	case flags&ctFlagReplied != 0 && !ctAwaiting(flags):
		return t.tcp
	}
	return t.syn
}

// ctAwaiting is conntrack.h's ct_awaiting: a TCP flow answered whose
// client has not acknowledged the answer yet (netfilter's SYN_RECV).
func ctAwaiting(flags uint32) bool {
	return flags&(ctFlagAwait|ctFlagAssured) == ctFlagAwait
}

// ctSNATHeld is conntrack.h's ct_snat_held: a closed flow so flagged holds
// its SNAT port for the backend's TIME_WAIT (source-NATed, no RST mark).
func ctSNATHeld(flags uint32) bool {
	return flags&ctFlagSNAT != 0 && flags&ctFlagRST == 0
}

// ctClosed is conntrack.h's ct_closed: a RST, or a FIN each way.
func ctClosed(flags uint32) bool {
	return flags&ctFlagRST != 0 || flags&(ctFlagFinFwd|ctFlagFinRev) == ctFlagFinFwd|ctFlagFinRev
}

// seen is when the entry e (of either family) was last seen: its expiry
// less its lifetime (bpf/lib/migrate_fam.h's mig_seen).
func (t ctTimeouts) seen(proto uint8, e ctView) uint64 {
	return e.expires - t.lifetime(proto, e.flags)
}

// ctDead is bpf/lib/conntrack.h's CT_DEAD: the expiry of an entry that a
// deleter has claimed and not deleted yet.
const ctDead = 0

// supersedes is bpf/lib/migrate_fam.h's mig_supersedes: whether the old
// entry o is of another flow than n, the new map's entry under the same
// key, and was seen later (a tuple reused since n was copied).
func (t ctTimeouts) supersedes(proto uint8, o, n ctView) bool {
	if o.nat == n.nat && o.backendID == n.backendID && ctClosed(o.flags) == ctClosed(n.flags) {
		return false
	}
	return int64(t.seen(proto, o)-t.seen(proto, n)) > 0
}

func (c Config) ctTimeouts() ctTimeouts {
	c = c.withDefaults()
	return ctTimeouts{
		tcp: uint64(c.CTTimeoutTCP.Nanoseconds()), syn: uint64(c.CTTimeoutSYN.Nanoseconds()), udp: uint64(c.CTTimeoutUDP.Nanoseconds()),
		close: uint64(c.CTTimeoutClose.Nanoseconds()), snatTW: uint64(c.CTTimeoutSNATTimeWait.Nanoseconds()),
	}
}

// convertRelease0Conntrack is convertConntrack with the timeouts of spec's
// constants (a pinMigration's convert).
func convertRelease0Conntrack(old, cur *ebpf.Map, spec *ebpf.CollectionSpec) error {
	var t ctTimeouts
	for name, v := range map[string]*uint64{"ct_timeout_tcp_ns": &t.tcp, "ct_timeout_udp_ns": &t.udp, "ct_timeout_close_ns": &t.close,
		"ct_timeout_snat_tw_ns": &t.snatTW} {
		vs := spec.Variables[name]
		if vs == nil {
			return fmt.Errorf("variable %s missing from BPF object", name)
		}
		if err := vs.Get(v); err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
	}
	return convertConntrack(old, cur, t, nil)
}

// convertConntrack copies release 0's live conntrack entries into
// sluice_conntrack_v2, each expiring when it would have expired there.
// Release 0 did not know whether a flow had been answered: every entry is
// taken as established (the safe side: it stays until it idles out). What
// does not fit the configured size is left out. With place, only entries
// it says may go are copied, as it says (inserted, or replacing another
// flow's): the copy into a live map at the end of a migration (migrate.go;
// bpf/migrate.c converts the same way).
func convertConntrack(old, cur *ebpf.Map, t ctTimeouts, place ctPlacer[sockCt4Key, sockCt4Entry]) error {
	now, err := monotonicNow()
	if err != nil {
		return err
	}
	var k sockCt4Key
	var v ct4EntryRelease0
	it := old.Iterate()
	for it.Next(&k, &v) {
		life := t.udp
		if k.Proto == uint8(model.TCP) {
			life = t.tcp
			if f := uint32(v.Flags); f&ctFlagRST != 0 || f&(ctFlagFinFwd|ctFlagFinRev) == ctFlagFinFwd|ctFlagFinRev {
				life = t.close
				if ctSNATHeld(f) {
					life = t.snatTW
				}
			}
		}
		expires := v.LastSeen + life
		e := sockCt4Entry{
			Expires: expires, Flags: uint32(v.Flags) | ctFlagReplied,
			NatAddr: v.NatAddr, NatPort: v.NatPort, SnatAddr: v.SnatAddr, SnatPort: v.SnatPort,
			BackendId: v.BackendId, RevNatId: v.RevNatId,
		}
		if int64(expires-now) <= 0 {
			continue
		}
		flags := ebpf.UpdateAny
		if place != nil {
			if !place(&k, &e, now) {
				continue
			}
			flags = ebpf.UpdateNoExist
		}
		if err := cur.Update(&k, &e, flags); err != nil {
			if errors.Is(err, unix.E2BIG) {
				break
			}
			if errors.Is(err, ebpf.ErrKeyExist) {
				continue
			}
			return fmt.Errorf("copy entry: %w", err)
		}
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return fmt.Errorf("read entries: %w", err)
	}
	return nil
}

// DeleteConntrack deletes flows from the conntrack tables pinned under p,
// for an operator (sluicectl conntrack delete). Each of flows is an entry
// of Conntrack's list; its flow goes whole: the entry, and the other
// entry of the flow (forward, keyed by the client's tuple, or reverse,
// keyed by the replies', which for a source-NATed flow is its SNAT port
// reservation), in whichever table holds them. It returns how many
// entries it deleted (a half-open flow's forward entry in
// sluice_conntrack is lapsed for the GC instead, deleteFlow).
//
// An entry whose translation is no longer the one listed (its tuple was
// reused by another flow since), and a peer that does not point back at
// the entry, are left alone. The flow's next packet finds no entry and is
// a new flow: a TCP mid-stream packet is then sent to a backend chosen
// again (which resets it), a UDP datagram starts a new flow.
func (p *Pinned) DeleteConntrack(flows []ConntrackEntry) (int, error) {
	spec, err := loadSock()
	if err != nil {
		return 0, err
	}
	var tables4, tables6 []*ebpf.Map
	var est4, est6 []bool
	defer func() {
		for _, m := range append(tables4, tables6...) {
			m.Close()
		}
	}()
	for _, t := range ctTables {
		// Checked as the read-only inspection checks it, then opened
		// for writing.
		ro, err := openPinnedMap(p.dir, t.name, spec.Maps[t.name])
		if errors.Is(err, os.ErrNotExist) && t.optional {
			continue // pinned by an agent without this table
		}
		if err != nil {
			return 0, err
		}
		path := filepath.Join(p.dir, t.name)
		if prev := previousPin(p.dir, t.name); prev != "" {
			path = filepath.Join(p.dir, prev)
		}
		ro.Close()
		m, err := ebpf.LoadPinnedMap(path, nil)
		if err != nil {
			return 0, fmt.Errorf("open pinned map %s for writing: %w", path, err)
		}
		if t.v6 {
			tables6, est6 = append(tables6, m), append(est6, t.established)
		} else {
			tables4, est4 = append(tables4, m), append(est4, t.established)
		}
	}
	now, err := monotonicNow()
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, f := range flows {
		var n int
		if f.Src.Addr().Unmap().Is4() {
			n, err = deleteFlow[sockCt4Key, sockCt4Entry](tables4, est4, now, f, func(src, dst netip.AddrPort, dir uint8) sockCt4Key {
				return sockCt4Key{Saddr: be32(src.Addr().Unmap()), Sport: be16(src.Port()), Daddr: be32(dst.Addr().Unmap()), Dport: be16(dst.Port()),
					Proto: uint8(f.Proto), Dir: dir}
			})
		} else {
			n, err = deleteFlow[tcCt6Key, tcCt6Entry](tables6, est6, now, f, func(src, dst netip.AddrPort, dir uint8) tcCt6Key {
				return tcCt6Key{Saddr: tcV6addr{Addr: src.Addr().As16()}, Sport: be16(src.Port()), Daddr: tcV6addr{Addr: dst.Addr().As16()},
					Dport: be16(dst.Port()), Proto: uint8(f.Proto), Dir: dir}
			})
		}
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// deleteFlow deletes the entry e lists and its flow's other entry from
// tables, the conntrack tables of e's family (est: which are
// sluice_conntrack), whose keys key builds.
//
// The forward entry in sluice_conntrack of a flow half-open, or of a TCP
// flow answered and not assured yet, counts against the table's
// half-open share (bpf/lib/conntrack.h, ct_counts; counted here), as
// does a port reservation not yet taken off (its reply entry,
// CT_F_ADMITTED: until the first reply, a TCP flow's until its client's
// ACK after it), and only the programs can take it off the count (an
// atomic or of CT_F_COUNTED and an atomic add): it is not deleted but
// lapsed (its expiry put in the past), which makes it absent to the
// datapath at once, and the GC's claim deletes it and takes it off. A
// packet that takes the flow off (a UDP reply promoting it, a TCP
// client's ACK assuring it) between the lookup here and the lapse, a
// microsecond apart, has its flags overwritten and the flow is taken off
// twice (the share admits one flow more, until two collections resync
// the count: GCConntrack).
func deleteFlow[K ctKey, V ctValue](tables []*ebpf.Map, est []bool, now uint64, e ConntrackEntry, key func(src, dst netip.AddrPort, dir uint8) K) (int, error) {
	var self, peer K
	if !e.Reverse {
		// <C -> V> naming B; its replies come <B -> C>, or <B -> node:port>
		// when source-NATed (the port reservation).
		self = key(e.Src, e.Dst, ctForward)
		replyTo := e.Src
		if e.SNAT.IsValid() {
			replyTo = e.SNAT
		}
		peer = key(e.NAT, replyTo, ctReverse)
	} else {
		// <B -> C (or node:port)> naming V; the client's tuple is
		// <C -> V>, C being the entry's SNAT (the client's) if any.
		self = key(e.Src, e.Dst, ctReverse)
		client := e.Dst
		if e.SNAT.IsValid() {
			client = e.SNAT
		}
		peer = key(client, e.NAT, ctForward)
	}
	n := 0
	nat := netip.AddrPortFrom(e.NAT.Addr().Unmap(), e.NAT.Port())
	for i, m := range tables {
		ok, foreign, err := deleteIfOurs[K, V](m, est[i], now, &self, func(w ctView) bool { return w.nat == nat && w.backendID == e.BackendID })
		if err != nil {
			return n, err
		}
		if foreign {
			return n, nil // another flow holds the tuple now
		}
		n += b2n(ok)
	}
	// The peer points back at self: a forward peer's translation is the
	// reverse entry's source (the backend), a reverse peer's the forward
	// entry's destination (the frontend).
	src, dst, _, dir := self.tuple()
	back := src
	if dir == ctForward {
		back = dst
	}
	for i, m := range tables {
		ok, _, err := deleteIfOurs[K, V](m, est[i], now, &peer, func(w ctView) bool { return w.nat == back })
		if err != nil {
			return n, err
		}
		n += b2n(ok)
	}
	return n, nil
}

// deleteIfOurs deletes key's entry from m if ours says it is the flow's,
// reporting whether it deleted it, or found it held by another (foreign);
// a missing entry is neither. In sluice_conntrack (est), an entry the
// half-open count holds (counted) is lapsed instead (deleteFlow), and one
// lapsed already is taken for missing.
func deleteIfOurs[K ctKey, V ctValue](m *ebpf.Map, est bool, now uint64, key *K, ours func(ctView) bool) (deleted, foreign bool, err error) {
	var v V
	if err := m.Lookup(key, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, false, nil
		}
		return false, false, fmt.Errorf("look up conntrack entry: %w", err)
	}
	w := v.view()
	if !ours(w) {
		return false, true, nil
	}
	if _, _, _, dir := (*key).tuple(); est && counted(dir, w.flags) {
		if int64(w.expires-now) <= 0 {
			return false, false, nil // lapsed (or claimed) already: the GC's
		}
		lapse(&v)
		if err := m.Update(key, &v, ebpf.UpdateExist); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return false, false, nil
			}
			return false, false, fmt.Errorf("lapse conntrack entry: %w", err)
		}
		return true, false, nil
	}
	deleted, err = deleteIfPresent(m, key)
	return deleted, false, err
}

// counted reports whether an entry of sluice_conntrack in direction dir
// with flags holds a place in the half-open count (bpf/lib/conntrack.h,
// ct_counts): a half-open or unassured flow's forward entry, or a port
// reservation counted and not taken off yet.
func counted(dir uint8, flags uint32) bool {
	if dir == ctForward {
		return flags&(ctFlagCounted|ctFlagSNAT) == 0 && (flags&ctFlagReplied == 0 || ctAwaiting(flags))
	}
	return flags&(ctFlagAdmitted|ctFlagCounted) == ctFlagAdmitted
}

// ctLapsed is the expiry DeleteConntrack gives an entry it lapses (1 ns
// after boot): dead to the programs and to the GC, which claims it (not
// ctDead, which says claimed already), and left out of Conntrack's list.
// The programs never write it: they write now plus a lifetime, or
// ctDead.
const ctLapsed = 1

// lapse puts the expiry of the conntrack entry v (of either family) at
// ctLapsed.
func lapse[V ctValue](v *V) {
	switch e := any(v).(type) {
	case *sockCt4Entry:
		e.Expires = ctLapsed
	case *tcCt6Entry:
		e.Expires = ctLapsed
	}
}

// deleteIfPresent deletes key from m, reporting whether it was there.
func deleteIfPresent[K any](m *ebpf.Map, key *K) (bool, error) {
	err := m.Delete(key)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return false, nil // gone meanwhile (expired and collected, or closed)
	}
	return false, fmt.Errorf("delete conntrack entry: %w", err)
}

// countedTable is a conntrack table as ConntrackEntries polls it: its id
// in the kernel's element counts and its size.
type countedTable struct {
	id   ebpf.MapID
	size int
}

// countedTables looks up the ids and sizes of the conntrack tables once,
// when the datapath is loaded, so that the poll does not (a nil map, as
// in a datapath without IPv6, and a map without an id are left out).
func countedTables(maps ...*ebpf.Map) ([]countedTable, error) {
	var out []countedTable
	for _, m := range maps {
		if m == nil {
			continue
		}
		info, err := m.Info()
		if err != nil {
			return nil, fmt.Errorf("information of conntrack map: %w", err)
		}
		if id, ok := info.ID(); ok {
			out = append(out, countedTable{id: id, size: int(m.MaxEntries())})
		}
	}
	return out, nil
}

func b2n(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ConntrackEntries returns how many entries the fuller family's (by its
// share of its size) sluice_conntrack holds now, expired ones that no collection has deleted
// yet included, and its size: the kernel's own element counts (one run of
// the map iterator, mapcount.go), cheap enough to poll every second. Expired
// entries take room until the GC deletes them, so a table that short
// flows fill between two collections refuses new flows (their first reply
// is dropped: a second's stall for the client) although few of its entries
// are alive; the agent collects once it is 3/4 full (runConntrackGC). size
// is 0 on a kernel without the count (Features.MapCount): only a collection
// tells then.
func (d *Datapath) ConntrackEntries() (n, size int, err error) {
	if d.counter == nil {
		return 0, 0, nil
	}
	counts, err := d.counter.counts()
	if err != nil {
		return 0, 0, err
	}
	for _, t := range d.ctCounted {
		// The families' tables may differ in size (their entries do).
		if c := counts[t.id]; size == 0 || c*size > n*t.size {
			n, size = c, t.size
		}
	}
	return n, size, nil
}
