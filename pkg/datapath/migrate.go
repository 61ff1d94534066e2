package datapath

// Resizing pinned maps without a `sluice cleanup` (issue 11, the audit's
// C4): an agent started with another --max-conntrack (or --max-services,
// --max-sock-rev, ...) than the pins were made with migrates each map it
// sizes differently:
//
//  1. Open builds a map of the new size, copies the old one's entries into
//     it and renames its pin over the old pin: one step, so the pin names
//     either the old map or a complete new one (resizePins).
//  2. Open loads the programs: they use the new map. The previous agent's
//     programs, still attached, go on using the old one.
//  3. The Attach methods replace those programs through their links. The
//     old map is no longer read after that.
//
// Until the start is complete (Commit, after 3), the old map stays pinned
// as <name>_previous too: a start that fails before then puts the
// previous programs back on the links it updated and the old map's pin
// back; one killed before its first link update is put back by the next
// start (rollback.go).
//
// Maps only the agent writes (services, backends, ...) need nothing more:
// no agent writes between 1 and 3. Maps the programs write do: the flows
// the old programs add between 1 and 3 would be lost, so the old map is
// kept (a migration) until the switch is done. For conntrack, whose loss
// resets connections, the shim programs of bpf/migrate.c run before the
// tc programs (and in place of XDP) while the links are updated, carrying
// each packet's entries over from the old map first; once every link runs
// the new programs, settle copies what the old map still has that the new
// one lacks, and the shims go. For the socket programs' maps (translated
// peers, UDP stickiness) settle alone does it: an entry missed there shows
// a backend's address as a socket's peer, or re-selects a UDP socket's
// backend, and breaks no connection.
//
// The release-0 conntrack, converted by pins.go, is carried over the same
// way, converted entry by entry.
//
// IPv6 conntrack (sluice6_conntrack_v1, sluice6_ct_new_v1, resized with
// IPv4's) is carried over the same way, by the same shims, with one
// difference: the IPv6 programs are not behind links of their own but in
// the pinned program arrays the entries tail-call (tc6.go), which switch
// every device at once. So while those maps are migrated, load leaves the
// previous agent's IPv6 programs there, writing the old maps, and
// switchIPv6 puts this build's in only once the shims run on every device
// and the links run this build's entries; settle follows.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// migration is a pinned map replaced at Open whose old map the previous
// agent's programs may still be writing.
type migration struct {
	name string    // the map's pin name in this build
	old  *ebpf.Map // the map the previous agent's programs use
	cur  *ebpf.Map // this build's map (set when loaded; owned by d.tc)
	r0   bool      // old is release 0's sluice_conntrack (ct4EntryRelease0)
}

// writtenByPrograms are the maps the BPF programs write, whose old map a
// migration keeps until the switch. sluice_metrics is left out: counts
// lost in that moment do not matter.
var writtenByPrograms = map[string]bool{
	mapConntrack: true, mapCTNew: true, mapSockRev: true, mapUDPStick: true, mapFragments: true,
	mapConntrack6: true, mapCTNew6: true, mapSockRev6: true, mapUDPStick6: true,
}

// tcWrittenMaps are the maps of writtenByPrograms the tc and XDP programs
// write: settled once those programs are replaced.
var tcWrittenMaps = map[string]bool{mapConntrack: true, mapCTNew: true, mapFragments: true, mapConntrack6: true, mapCTNew6: true}

// resizePins migrates each map pinned in dir with another size or
// preallocation than spec gives it (step 1 above; prealloc.go). A map of
// another type, key or value is left for checkPinned to report.
//
// Every new map is built and filled before any pin is renamed: a map too
// small for what its old one holds (a conntrack table with more flows
// than the new size) refuses the resize with every pin as it was. Before,
// the maps were swapped one by one in name order, so a refusal of
// sluice_conntrack_v2 came after sluice6_conntrack_v1's pin named a copy
// the previous agent's IPv6 programs did not write: the next agent
// carried that copy over, without the IPv6 flows added since.
//
// Each pin renamed over is kept in j first, to be put back if the start
// fails (rollback.go).
//
// The copies leave out what drop.leaveOut says: the retired masters of
// a shrinking start that holds the Services only without them
// (shrink.go). A map they are in is rebuilt without them even at the
// same size, so that no master is kept whose rev_nat entry goes, nor the
// reverse.
func resizePins(dir string, spec *ebpf.CollectionSpec, j *pinJournal, drop *retiredMasters) (migs []*migration, err error) {
	type resized struct {
		name, path string
		old, cur   *ebpf.Map
	}
	var built []resized
	defer func() {
		for _, r := range built {
			r.cur.Close()
			if err != nil || !writtenByPrograms[r.name] {
				r.old.Close()
			}
		}
	}()
	err = eachPin(spec, dir, func(name, path string, ms *ebpf.MapSpec, old *ebpf.Map, info *ebpf.MapInfo) error {
		leave := drop.leaveOut(name)
		if info.Type != ms.Type || info.KeySize != ms.KeySize || info.ValueSize != ms.ValueSize ||
			(info.MaxEntries == ms.MaxEntries && !preallocationDiffers(info, ms) && leave == nil) {
			old.Close()
			return nil
		}
		cur, err := buildMap(ms, func(cur *ebpf.Map) error {
			if err := copyResized(old, cur, writtenByPrograms[name], leave); err != nil {
				return err
			}
			return uncountCopies(name, cur)
		})
		if err != nil {
			old.Close()
			if info.MaxEntries == ms.MaxEntries && !preallocationDiffers(info, ms) {
				return fmt.Errorf("rebuild pinned map %s without its retired masters: %w", path, err)
			}
			if info.MaxEntries == ms.MaxEntries {
				return fmt.Errorf("rebuild pinned map %s %s: %w", path, preallocation(ms.Flags), err)
			}
			return fmt.Errorf("resize pinned map %s from %d to %d entries: %w (no pin was resized)", path, info.MaxEntries, ms.MaxEntries, err)
		}
		built = append(built, resized{name: name, path: path, old: old, cur: cur})
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, r := range built {
		if err := j.keep(r.path); err != nil {
			return nil, err
		}
		if err := pinOver(r.cur, r.path, "_resizing"); err != nil {
			return nil, fmt.Errorf("resize pinned map %s: %w", r.path, err)
		}
		if writtenByPrograms[r.name] {
			migs = append(migs, &migration{name: r.name, old: r.old})
		}
	}
	return migs, nil
}

// uncountCopies marks the entries of cur, the new sluice_conntrack (of
// either family; name says which) just copied from the old one, that hold
// a place in the half-open count (counted: a half-open or unassured
// flow's forward entry, a port reservation not taken off) as taken off
// (CT_F_COUNTED), so that none is taken off twice. The count is the one
// both builds' programs share (sluice_ct_admit_v1 and sluice_ct_pcpu_v1
// are not migrated: the same maps), and it holds such a flow once, for
// its entry in the old map, which the previous agent's programs go on
// taking off (its assurance, promotion or reap) while they run; what the
// old map still holds at the end is taken off by settle
// (settleConntrack). A copy that gets a packet from the new programs
// meanwhile is the same flow, established or reaped there without
// taking anything off. Before, the copy went in counted too: the flow
// came off twice, once in each map (the count drifted down), or its old
// entry's place was lost with the old map (up). cur is not pinned yet:
// no program writes it.
func uncountCopies(name string, cur *ebpf.Map) error {
	switch name {
	case mapConntrack:
		return uncountEntries[sockCt4Key, sockCt4Entry](cur)
	case mapConntrack6:
		return uncountEntries[tcCt6Key, tcCt6Entry](cur)
	}
	return nil
}

func uncountEntries[K ctKey, V ctValue](m *ebpf.Map) error {
	var k K
	var v V
	var keys []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, _, _, dir := k.tuple(); counted(dir, v.view().flags) {
			keys = append(keys, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read entries: %w", err)
	}
	for i := range keys {
		if err := m.Lookup(&keys[i], &v); err != nil {
			return fmt.Errorf("look up conntrack entry: %w", err)
		}
		orCTFlags(&v, ctFlagCounted)
		if err := m.Update(&keys[i], &v, ebpf.UpdateExist); err != nil {
			return fmt.Errorf("mark conntrack entry taken off: %w", err)
		}
	}
	return nil
}

// orCTFlags sets bits in the flags of the conntrack entry v (of either
// family).
func orCTFlags[V ctValue](v *V, bits uint32) {
	switch e := any(v).(type) {
	case *sockCt4Entry:
		e.Flags |= bits
	case *tcCt6Entry:
		e.Flags |= bits
	}
}

// eachPin calls f, in name order, for each map of spec pinned by name
// that has a pin in dir, opened (f closes or keeps it), with its info. It
// stops at the first error, f's or the opening's.
func eachPin(spec *ebpf.CollectionSpec, dir string, f func(name, path string, ms *ebpf.MapSpec, m *ebpf.Map, info *ebpf.MapInfo) error) error {
	for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
		ms := spec.Maps[name]
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(dir, name)
		m, info, err := loadPinnedInfo(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := f(name, path, ms, m, info); err != nil {
			return err
		}
	}
	return nil
}

// dropOnError closes the old maps of *migs and forgets them when *err is
// set: the deferred clean-up of a function that collects migrations and
// fails half way.
func dropOnError(migs *[]*migration, err *error) {
	if *err != nil {
		for _, mg := range *migs {
			mg.old.Close()
		}
		*migs = nil
	}
}

// copyResized copies old's entries into cur, its resized map, but those
// leave says (nil: none; copyEntries). live: programs are writing old
// meanwhile (an iteration they disturb is cut short; settle copies the
// rest).
func copyResized(old, cur *ebpf.Map, live bool, leave func(k, v []byte) bool) error {
	if err := copyEntries(old, cur, false, leave); err != nil && !(live && errors.Is(err, ebpf.ErrIterationAborted)) {
		return err
	}
	return nil
}

// replacePin creates a map of ms, has fill fill it, and pins it at path,
// in place of whatever is pinned there (buildMap, pinOver).
func replacePin(path, suffix string, ms *ebpf.MapSpec, fill func(cur *ebpf.Map) error) error {
	cur, err := buildMap(ms, fill)
	if err != nil {
		return err
	}
	defer cur.Close()
	return pinOver(cur, path, suffix)
}

// buildMap creates a map of ms, unpinned, and has fill fill it.
func buildMap(ms *ebpf.MapSpec, fill func(cur *ebpf.Map) error) (*ebpf.Map, error) {
	cur, err := ebpf.NewMap(unpinned(ms))
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	if err := fill(cur); err != nil {
		cur.Close()
		return nil, err
	}
	return cur, nil
}

// pinOver pins cur at path, in place of whatever is pinned there: under
// the temporary name path+suffix first, then renamed into place, as
// rename(2) replaces a pin in one step. An agent that dies half way
// leaves the old pin or the complete new one, never none or a partial
// one (a stale temporary pin is removed by the next Open: recoverPins).
func pinOver(cur *ebpf.Map, path, suffix string) error {
	tmp := path + suffix // (bpffs refuses names with a dot)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := cur.Pin(tmp); err != nil {
		return fmt.Errorf("pin: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = cur.Unpin()
		return err
	}
	return nil
}

// copyEntries copies the entries of old into cur, which has the same type,
// key and value, but those leave says (nil: none; not asked of per-CPU
// arrays). With missingOnly, entries cur has are left as they are. A
// full cur is an error, unless it is an LRU (which makes room).
func copyEntries(old, cur *ebpf.Map, missingOnly bool, leave func(k, v []byte) bool) error {
	switch old.Type() {
	case ebpf.PerCPUArray:
		return copyCounters(old, cur, nil)
	case ebpf.Array:
		return copyArray(old, cur, leave)
	}
	flags := ebpf.UpdateAny
	if missingOnly {
		flags = ebpf.UpdateNoExist
	}
	k, v := make([]byte, old.KeySize()), make([]byte, old.ValueSize())
	n := 0
	it := old.Iterate()
	for it.Next(&k, &v) {
		if leave != nil && leave(k, v) {
			continue
		}
		err := cur.Update(k, v, flags)
		switch {
		case err == nil:
			n++
		case errors.Is(err, ebpf.ErrKeyExist):
		case errors.Is(err, unix.E2BIG):
			return fmt.Errorf("the new size, %d, is too small: %d entries copied, more to come (wait for fewer, or choose a larger size)",
				cur.MaxEntries(), n)
		default:
			return fmt.Errorf("copy entry: %w", err)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read entries: %w", err)
	}
	return nil
}

// copyArray copies the present entries of the array old (the backends,
// reverse-NAT and slots arrays, the only arrays pinned: structs.h) into the
// array cur (new, all absent). An absent entry (zero, or a deleted
// backend's, which keeps its address: clearIDs) is left out; a present
// one beyond cur is an error, as a hash's copy into a map too small is. A
// slots array's entry is present when it names a backend (not 0): a
// smaller array must still hold every range in use. An entry leave says
// (given its index as a key) is left out too.
func copyArray(old, cur *ebpf.Map, leave func(k, v []byte) bool) error {
	slots := old.ValueSize() == 4 // a __u32 backend id (slots.go)
	var key [4]byte
	return eachArrayEntry(old, func(k uint32, v []byte) error {
		if !slots && !presentEntry(v) {
			return nil
		}
		if leave != nil {
			binary.NativeEndian.PutUint32(key[:], k)
			if leave(key[:], v) {
				return nil
			}
		}
		if k >= cur.MaxEntries() {
			return fmt.Errorf("the new size, %d, is too small: entry %d is in use (choose a larger size)", cur.MaxEntries(), k)
		}
		if err := cur.Put(k, v); err != nil {
			return fmt.Errorf("write entry %d: %w", k, err)
		}
		return nil
	})
}

// loadShim loads bpf/migrate.c's programs if a conntrack map is being
// migrated, with the old maps in place of its sluice_mig_old_* maps.
func (d *Datapath) loadShim(opts *ebpf.CollectionOptions) error {
	spec, err := loadMigrate()
	if err != nil {
		return err
	}
	repl := map[string]*ebpf.Map{}
	for _, mg := range d.migrations {
		var m, v string
		switch {
		case mg.r0:
			m, v = "sluice_mig_old_r0", "mig_from_r0"
		case mg.name == mapConntrack:
			m, v = "sluice_mig_old_est", "mig_from_est"
		case mg.name == mapCTNew:
			m, v = "sluice_mig_old_new", "mig_from_new"
		case mg.name == mapConntrack6:
			m, v = "sluice6_mig_old_est", "mig_from_est6"
		case mg.name == mapCTNew6:
			m, v = "sluice6_mig_old_new", "mig_from_new6"
		default:
			continue
		}
		spec.Maps[m].MaxEntries = mg.old.MaxEntries()
		repl[m] = mg.old
		if err := spec.Variables[v].Set(uint8(1)); err != nil {
			return fmt.Errorf("set %s: %w", v, err)
		}
	}
	if len(repl) == 0 {
		return nil
	}
	if err := configure(spec, d.cfg); err != nil {
		return err
	}
	o := *opts
	o.MapReplacements = repl
	if err := spec.LoadAndAssign(&d.shim, &o); err != nil {
		return fmt.Errorf("load conntrack migration programs: %w", verifierDetail(err))
	}
	return nil
}

// migrating reports whether a conntrack migration needs the shims, and
// whether the egress programs must be replaced before the ingress ones.
//
// The order matters for the flows that start while the links are being
// updated, whose packets meet old and new programs in turn: the new
// programs find the old programs' entries (the shims copy them), but not
// the other way round. Say sluice_conntrack is resized: a SYN meets the
// old ingress program (half-open, in sluice_ct_new, which both share), its
// SYN-ACK the new egress program (established, in the new map only), its
// ACK the old ingress program again: no entry there, a new flow. So
// ingress goes first, and until every hook runs the new programs they
// put no new flow half-open into the new sluice_conntrack, where an old
// egress would miss its reply, but into sluice_ct_new (pauseShare). A
// source-NATed flow's port reservation still goes into the new
// sluice_conntrack (with sluice_ct_new resized too or not), where its
// port's uniqueness is checked; it is the one entry the shims copy the
// other way: when the flow's reply meets an old program (another device's
// ingress not switched yet; an egress, for a flow remapped to another
// client port), the shim in front of it puts the reservation into the old
// map first unless the flow was seen closed (mig_copy_back), and the old
// program answers the flow as its own. When sluice_ct_new itself, or
// release 0's single map, is the one replaced, the half-open entry is the
// old programs' to find: the SYN must meet an old program and its answer a
// new one, so egress goes first. (Both sluice_conntrack and sluice_ct_new
// resized at once leaves such a flow a window of the few microseconds
// between two link updates.) The IPv6 programs follow the same rule, slot
// by slot (switchIPv6).
func (d *Datapath) migrating() (shim, egressFirst bool) {
	if d.shim.SluiceMigTc == nil {
		return false, false
	}
	for _, mg := range d.migrations {
		if mg.r0 || mg.name == mapCTNew {
			egressFirst = true
		}
	}
	return true, egressFirst
}

// migratingIPv6 reports whether IPv6 conntrack is migrated, so that this
// build's IPv6 programs wait for switchIPv6; and whether their egress
// program goes in first (migrating's rule).
func (d *Datapath) migratingIPv6() (ok, egressFirst bool) {
	for _, mg := range d.migrations {
		switch mg.name {
		case mapCTNew6:
			egressFirst = true
			ok = true
		case mapConntrack6:
			ok = true
		}
	}
	return ok, egressFirst
}

// switchIPv6 puts this build's IPv6 programs into the pinned program
// arrays if load left the previous agent's there (migratingIPv6): every
// device's IPv6 traffic goes to them from then on.
func (d *Datapath) switchIPv6() error {
	if !d.ipv6Pending {
		return nil
	}
	_, egressFirst := d.migratingIPv6()
	if err := d.pins.keepProgArray(d.tc.Sluice6TcV1, mapTC6, true); err != nil {
		return err
	}
	if err := d.tc.setIPv6Programs(egressFirst); err != nil {
		return err
	}
	if d.xdp.Sluice6Xdp != nil {
		if err := d.pins.keepProgArray(d.xdp.Sluice6XdpV1, mapXDP6, true); err != nil {
			return err
		}
		if err := d.xdp.setIPv6Program(); err != nil {
			return err
		}
	}
	d.ipv6Pending = false
	return nil
}

// pauseShare reports whether this load's programs keep new flows out of
// the half-open share until every hook runs them (resumeAdmit): while a
// family's sluice_conntrack is migrated and its sluice_ct_new is not. The
// links then switch ingress first (migrating), so a flow a new ingress
// program starts has its first reply met by an old egress program (or an
// old ingress on another device), which looks in the old sluice_conntrack
// only: put half-open into the new one, the reply went out untranslated
// (a UDP exchange lost in TestFailedResizeStartUnderLoad, 1 in ~10,000).
// In sluice_ct_new, which both builds share then, the old program finds
// it, as before the share. Not otherwise: with sluice_ct_new migrated
// alone, the shared map is sluice_conntrack, where the old programs find
// a half-open flow and not one in the new LRU; with both, or release 0's
// map, migrated, neither is shared.
func (d *Datapath) pauseShare() bool {
	migrated := map[string]bool{}
	for _, mg := range d.migrations {
		if mg.r0 {
			return false
		}
		migrated[mg.name] = true
	}
	return (migrated[mapConntrack] && !migrated[mapCTNew]) || (migrated[mapConntrack6] && !migrated[mapCTNew6])
}

// resumeAdmit lets this load's programs put new flows half-open into
// sluice_conntrack again (pauseShare), once no previous program runs. A
// start that fails after it puts the previous programs back link by link:
// the word is set again first (noted after the link updates, so undone
// before them), or a new ingress program still on a link would put a flow
// half-open into the new map that a restored old egress misses. A kernel
// without mmapable .data leaves them paused: new flows then go to
// sluice_ct_new, the LRU, as before the half-open share.
func (d *Datapath) resumeAdmit() error {
	v := d.tc.CtAdmitPaused
	if v == nil {
		return nil
	}
	var paused uint8
	if err := v.Get(&paused); err != nil || paused == 0 {
		return nil // not paused, or not writable (ErrNotSupported): left
	}
	if err := d.pins.note(false, func() error { return v.Set(uint8(1)) }, nil); err != nil {
		return err
	}
	if err := v.Set(uint8(0)); err != nil {
		return fmt.Errorf("set ct_admit_paused: %w", err)
	}
	return nil
}

// finishTCSwitch ends the migrations of the maps the tc and XDP programs
// write, once no program of the previous agent writes them: this build's
// IPv6 programs go in (switchIPv6), then settle.
func (d *Datapath) finishTCSwitch() error {
	if err := d.switchIPv6(); err != nil {
		return err
	}
	if err := d.resumeAdmit(); err != nil {
		return err
	}
	return d.settle(tcWrittenMaps)
}

// settle finishes the migrations of the maps names once the programs that
// wrote their old maps are replaced: it copies what the old maps hold that
// the new ones lack, and lets the old maps go.
//
// The half-open count, which both builds' programs share (the same
// maps: not migrated), holds each flow counted in either sluice_conntrack
// once (uncountCopies; bpf/lib/migrate_fam.h, mig_put_counted): an entry
// of the old map that holds a place and is not carried over (expired, or
// the new map has its own entry, or no room) gives it up with its map,
// and one of the new map that holds a place and is deleted to make room
// for the old one (ctPlace) does too. settle takes those off the count
// (through sluice_ct_gc, as the GC's resync adds); an entry carried over
// keeps its place.
func (d *Datapath) settle(names map[string]bool) error {
	var errs []error
	var off4, off6 int64 // places given up, per family
	t := d.cfg.ctTimeouts()
	place4 := ctPlaceCounting[sockCt4Key, sockCt4Entry](t, d.maps.conntrack, d.maps.ctNew, true, &off4)
	half4 := ctPlace[sockCt4Key, sockCt4Entry](t, d.maps.conntrack, d.maps.ctNew, false)
	place6 := ctPlaceCounting[tcCt6Key, tcCt6Entry](t, d.tc.Sluice6ConntrackV1, d.tc.Sluice6CtNewV1, true, &off6)
	half6 := ctPlace[tcCt6Key, tcCt6Entry](t, d.tc.Sluice6ConntrackV1, d.tc.Sluice6CtNewV1, false)
	keep := d.migrations[:0]
	for _, mg := range d.migrations {
		if !names[mg.name] {
			keep = append(keep, mg)
			continue
		}
		var err error
		var off int64
		switch {
		case mg.r0:
			err = convertConntrack(mg.old, mg.cur, t, place4)
		case mg.name == mapCTNew:
			err = copyConntrack(mg.old, mg.cur, half4)
		case mg.name == mapConntrack:
			off, err = copyConntrackCounting(mg.old, mg.cur, place4)
			off4 += off
		case mg.name == mapCTNew6:
			err = copyConntrack(mg.old, mg.cur, half6)
		case mg.name == mapConntrack6:
			off, err = copyConntrackCounting(mg.old, mg.cur, place6)
			off6 += off
		default:
			err = copyEntries(mg.old, mg.cur, true, nil)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("carry %s over to its new map: %w", mg.name, err))
		}
		mg.old.Close()
	}
	d.migrations = keep
	for family, off := range map[uint32]int64{4: off4, 6: off6} {
		if off != 0 && d.maps.ctGC != nil {
			if err := d.maps.adjustHalfOpen(family, -off); err != nil {
				errs = append(errs, fmt.Errorf("take the places the old conntrack map held off the half-open count: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// ctPlacer says whether an old conntrack entry (of key K and value V:
// one family's), alive at now, goes into the new maps at the end of a
// migration; what it supersedes there it has deleted, and the entry goes
// in with BPF_NOEXIST.
type ctPlacer[K, V any] func(k *K, e *V, now uint64) bool

// ctMigKey is a conntrack key of either family that can be rebuilt from
// its tuple: sockCt4Key or tcCt6Key.
type ctMigKey[K any] interface {
	ctKey
	withTuple(src, dst netip.AddrPort, proto, dir uint8) K
}

func (sockCt4Key) withTuple(src, dst netip.AddrPort, proto, dir uint8) sockCt4Key {
	return sockCt4Key{Saddr: be32(src.Addr()), Daddr: be32(dst.Addr()), Sport: be16(src.Port()), Dport: be16(dst.Port()),
		Proto: proto, Dir: dir}
}

func (tcCt6Key) withTuple(src, dst netip.AddrPort, proto, dir uint8) tcCt6Key {
	return tcCt6Key{Saddr: tcV6addr{Addr: src.Addr().As16()}, Daddr: tcV6addr{Addr: dst.Addr().As16()},
		Sport: be16(src.Port()), Dport: be16(dst.Port()), Proto: proto, Dir: dir}
}

// ctPlace is bpf/lib/migrate_fam.h's mig_put for settle, over one
// family's new maps est (sluice_conntrack) and half (sluice_ct_new), for
// entries that go into est (toEst) or half: the old entry e under k goes
// if the new maps have nothing alive under k, or (into est) an
// established entry of an earlier flow on the tuple that e supersedes;
// never over a live half-open entry, the new programs' own. Neither does
// it go if the other entry of its flow's key is taken by another live
// flow that was seen later, or is claimed.
//
// The new maps' entries are judged as mig_put judges them, which is as
// the datapath does (bpf/lib/conntrack.h): a lapsed entry (dead, not
// claimed) counts as absent, and one in the map e goes into is deleted
// to make room; an entry another deleter has claimed (expiry CT_DEAD,
// between its compare-and-swap and its delete) is left to it, and e does
// not go: the flow's next packet finds nothing and is a new flow, as the
// claimer (a flush, the GC, a new flow on the tuple) meant. e then goes
// in with BPF_NOEXIST, never over an entry, after the delete of what it
// supersedes. Before, it was judged by when it was seen alone: a claimed
// entry, seen earliest of all, was overwritten (BPF_ANY), and its
// claimer's delete by key then took e; a lapsed entry of the same flow
// kept e out, and the flow's next packet was balanced afresh.
//
// User space cannot compare-and-swap an expiry: what it deletes it has
// judged from a lookup a moment before. An entry the datapath claims, or
// replaces, between that lookup and the delete is deleted all the same
// (the datapath's new entry lost: that flow's next packet is balanced
// afresh; or a claimer's delete, coming after e's insert, takes e).
// The window is the time between two syscalls, and only lapsed or
// superseded entries are deleted, which the datapath replaces only when a
// packet of their tuple comes in that moment.
func ctPlace[K ctMigKey[K], V ctValue](t ctTimeouts, est, half *ebpf.Map, toEst bool) ctPlacer[K, V] {
	return ctPlaceCounting[K, V](t, est, half, toEst, nil)
}

// ctPlaceCounting is ctPlace, adding to *off (if off is not nil) each
// entry of est it deletes that held a place in the half-open count
// (counted): for settle to take off. User space cannot take it off as a
// claimer does (an atomic or of CT_F_COUNTED): a program that claims the
// entry, and takes it off, between the lookup and the delete here (a
// packet of that tuple in that microsecond, for an entry lapsed or
// superseded) has it taken off twice, until the GC's resync.
func ctPlaceCounting[K ctMigKey[K], V ctValue](t ctTimeouts, est, half *ebpf.Map, toEst bool, off *int64) ctPlacer[K, V] {
	return func(k *K, e *V, now uint64) bool {
		var n V
		alive := func(v ctView) bool { return int64(v.expires-now) > 0 }
		_, _, proto, _ := (*k).tuple()
		var del []*ebpf.Map
		var held int64 // est's entry under k holds a place
		if half.Lookup(k, &n) == nil {
			v := n.view()
			if v.expires == ctDead || alive(v) {
				return false
			}
			if !toEst {
				del = append(del, half)
			}
		}
		if est.Lookup(k, &n) == nil {
			v := n.view()
			if v.expires == ctDead || alive(v) && (!toEst || !t.supersedes(proto, (*e).view(), v)) {
				return false
			}
			if toEst {
				del = append(del, est)
				if _, _, _, dir := (*k).tuple(); counted(dir, v.flags) {
					held = 1
				}
			}
		}
		// The peer's key: taken by a live half-open flow, or a live
		// established one seen later, or claimed (the flow cannot be
		// whole there until the claimer is done), e stays out.
		pk := ctPeerKey(k, e)
		if half.Lookup(&pk, &n) == nil && (n.view().expires == ctDead || alive(n.view())) {
			return false
		}
		if est.Lookup(&pk, &n) == nil && (n.view().expires == ctDead || alive(n.view()) && ctPeerKey(&pk, &n) != *k &&
			int64(t.seen(proto, (*e).view())-t.seen(proto, n.view())) <= 0) {
			return false
		}
		for _, m := range del {
			err := m.Delete(k)
			if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return false
			}
			if m == est && err == nil && off != nil {
				*off += held
			}
		}
		return true
	}
}

// ctPeerKey is bpf/lib/conntrack_fam.h's ct_peer_key: the key of the
// other entry of the flow of e, found under k.
func ctPeerKey[K ctMigKey[K], V ctValue](k *K, e *V) K {
	src, dst, proto, dir := (*k).tuple()
	w := (*e).view()
	snat := w.flags&ctFlagSNAT != 0
	if dir == ctForward {
		// <C -> F> names B (and N:sp): the reply, <B -> N:sp or C>.
		if snat {
			src = w.snat
		}
		return (*k).withTuple(w.nat, src, proto, ctReverse)
	}
	// <B -> X> names F (and C): the request is <C -> F>.
	if snat {
		dst = w.snat
	}
	return (*k).withTuple(dst, w.nat, proto, ctForward)
}

// copyConntrack copies the live entries of the conntrack map old into cur
// as place says, as bpf/migrate.c does packet by packet.
func copyConntrack[K ctMigKey[K], V ctValue](old, cur *ebpf.Map, place ctPlacer[K, V]) error {
	_, err := copyConntrackCounting(old, cur, place)
	return err
}

// copyConntrackCounting is copyConntrack, for old a sluice_conntrack: it
// also returns how many of old's entries that held a place in the
// half-open count (counted) it left behind (expired, refused by place,
// or not inserted), whose places go with old (settle). Their flags are
// read again just before: the shim's mig_put_counted may have taken one
// over meanwhile (a copy made, CT_F_COUNTED set on the old entry).
//
// After the first error inserting (no room, E2BIG, or another) it
// inserts nothing more but goes on reading old, counting each entry
// still to come that holds a place as left behind, and returns the
// count with that first error: before, it returned at once, and the
// places of the entries not yet read went with old without being
// counted (the count high until the GC's resync). An error reading old
// (the iterator's) ends the walk: the entries not read by then are not
// counted, since nothing more of old can be read.
func copyConntrackCounting[K ctMigKey[K], V ctValue](old, cur *ebpf.Map, place ctPlacer[K, V]) (int64, error) {
	now, err := monotonicNow()
	if err != nil {
		return 0, err
	}
	var k K
	var v V
	var off int64
	var failed error // the first insert error: nothing more goes in
	leftBehind := func() {
		var o V
		if _, _, _, dir := k.tuple(); old.Lookup(&k, &o) == nil && counted(dir, o.view().flags) {
			off++
		}
	}
	it := old.Iterate()
	for it.Next(&k, &v) {
		if failed != nil || int64(v.view().expires-now) <= 0 || !place(&k, &v, now) {
			leftBehind()
			continue
		}
		err := cur.Update(&k, &v, ebpf.UpdateNoExist)
		switch {
		case err == nil:
		case errors.Is(err, ebpf.ErrKeyExist):
			leftBehind()
		case errors.Is(err, unix.E2BIG):
			failed = fmt.Errorf("the new size, %d, is too small for the flows added meanwhile", cur.MaxEntries())
			leftBehind()
		default:
			failed = fmt.Errorf("copy entry: %w", err)
			leftBehind()
		}
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return off, errors.Join(failed, fmt.Errorf("read entries: %w", err))
	}
	return off, failed
}

// closeMigrations lets the old maps go without copying anything more.
func (d *Datapath) closeMigrations() {
	for _, mg := range d.migrations {
		mg.old.Close()
	}
	d.migrations = nil
}

// shimLinks are the shims attached while conntrack is migrated.
type shimLinks struct {
	tcx     []link.Link
	filters []*netlink.BpfFilter
}

func (s *shimLinks) detach() error {
	var errs []error
	for _, l := range s.tcx {
		errs = append(errs, l.Close())
	}
	for _, f := range s.filters {
		if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete filter %s: %w", f.Name, err))
		}
	}
	*s = shimLinks{}
	return errors.Join(errs...)
}

// mapByName returns the loaded map of the pin name.
func (o *tcLoaded) mapByName(name string) (*ebpf.Map, error) {
	for _, m := range []struct {
		name string
		m    *ebpf.Map
	}{
		{mapServices, o.SluiceServicesV2}, {mapSlots, o.SluiceSlotsV1}, {mapBackends, o.SluiceBackendsV2}, {mapRevNat, o.SluiceRevNatV2},
		{mapConntrack, o.SluiceConntrackV2}, {mapCTNew, o.SluiceCtNewV1}, {mapCTFlush, o.SluiceCtFlushV1},
		{mapConntrack6, o.Sluice6ConntrackV1}, {mapCTNew6, o.Sluice6CtNewV1},
		{mapSockRev, o.SluiceSockRevV1}, {mapUDPStick, o.SluiceUdpStickV1}, {mapMetrics, o.SluiceMetricsV1},
		{mapSockRev6, o.Sluice6SockRevV1}, {mapUDPStick6, o.Sluice6UdpStickV1},
		{mapDevices, o.SluiceDevicesV1}, {mapSrcRanges, o.SluiceSrcRangesV1}, {mapFragments, o.SluiceFragmentsV1},
		{mapSvcStats, o.SluiceSvcStatsV1},
	} {
		if m.name == name {
			return m.m, nil
		}
	}
	return nil, fmt.Errorf("map %s missing from the tc object", name)
}
