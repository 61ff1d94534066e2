package datapath

// A start that fails leaves the pins as they were (issue 14, thirty-fifth
// pass). Open converts the previous release's pins and resizes maps by
// renaming new maps' pins over the old ones (pins.go, migrate.go) before
// this build's programs are loaded, let alone attached: until the Attach
// methods replace them, the previous agent's programs run, on the old
// maps. A start that fails in between (a program the verifier rejects, a
// device that cannot be attached, the migration shims refused) used to
// leave the renamed pins: the next agent with the same sizes opened the
// copies made at the failed attempt, without the flows the old programs
// wrote since (broken connections, lost SNAT port reservations), and
// never migrated again, the sizes now matching.
//
// So every pin Open replaces or removes is pinned a second time first, as
// <name>_previous (pinJournal.keep), and
//
//   - a start that fails (Open's error, or Abort, which the agent calls
//     when it stops before it started) renames each _previous pin back
//     over its name and removes the pins the attempt created (a
//     sluice_backends_v2 converted from sluice_backends_v1, the maps the
//     load created): every pin names the map it named before, and the
//     next start migrates again, from the maps the old programs still
//     write;
//   - the start is complete (Commit) once everything is attached, before
//     the agent's first apply writes the maps (and at Close); the
//     _previous pins go then. A failure after that keeps the new pins:
//     this build's programs write them. A failure before it, after the
//     Attach methods updated links, puts the previous programs back on
//     them first (below: the thirty-ninth pass).
//
// A kill (SIGKILL, OOM) half way leaves the _previous pins on bpffs, with
// the old programs still attached and writing those maps; the next Open
// renames them back over their names first (recoverPins), so it finds
// the pins as the killed start found them and migrates again. Pins the
// killed attempt created stay: a map of this build's new name, which the
// next start converts the previous release's pin over again (migratePins
// takes the old-named pin as the live one), or a new map the old programs
// do not use, which the next start reuses. A temporary pin of pinOver's
// (_resizing, _migrating) is removed there too. A kill while Commit
// removes the _previous pins leaves some, with the links updated: the
// next Open finds the start's mark (switchedDir, below) and removes them.
//
// One Open at a time on a pin directory, as one agent per node: an Open
// beside another's uncommitted start would put that start's pins back.
//
// The programs a start put on the hooks are put back too (below), and
// what it cannot put back is listed there.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// previousSuffix names the second pin of a map Open replaced or removed,
// until the start is complete (bpffs refuses names with a dot).
const previousSuffix = "_previous"

// tempPinSuffixes are pinOver's temporary names.
var tempPinSuffixes = []string{"_resizing", "_migrating"}

// pinJournal is what Open changed in the pin directory, to put back if
// the start fails.
type pinJournal struct {
	dir    string
	before map[string]bool // the pins in dir when Open began
	kept   []string        // the pins kept as <name>_previous
	// steps are the replacements other than pins, in the order made;
	// switched: one of them ran this build's programs on a hook
	// (switchedDir is there).
	steps    []restoreStep
	switched bool
	// carryBack, set by Open, copies what this build's programs added to
	// the new conntrack maps into the old ones: the undo's last step.
	carryBack func(*pinJournal) error
}

// startPinJournal puts back what a start that did not finish left in dir
// (recoverPins) and notes the pins there.
func startPinJournal(dir string) (*pinJournal, error) {
	if err := recoverPins(dir); err != nil {
		return nil, err
	}
	names, err := pinNames(dir)
	if err != nil {
		return nil, err
	}
	j := &pinJournal{dir: dir, before: map[string]bool{}}
	for _, n := range names {
		j.before[n] = true
	}
	return j, nil
}

// pinNames returns the pins in dir (links/ aside).
func pinNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read pin directory: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// recoverPins renames each <name>_previous pin in dir back over its name,
// and removes pinOver's temporary pins: a start killed between Open's
// changes and Commit left them (the top of this file). If that start had
// updated a link (switchedDir), its pins stay instead, as a commit would
// have them: the links it updated use them.
func recoverPins(dir string) error {
	names, err := pinNames(dir)
	if err != nil {
		return err
	}
	_, err = os.Stat(filepath.Join(dir, switchedDir))
	switched := err == nil
	var errs []error
	for _, n := range names {
		p := filepath.Join(dir, n)
		if orig, ok := strings.CutSuffix(n, previousSuffix); ok {
			if switched {
				if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, fmt.Errorf("remove pin %s that a start killed after its switch left: %w", n, err))
				}
				continue
			}
			if err := os.Rename(p, filepath.Join(dir, orig)); err != nil {
				errs = append(errs, fmt.Errorf("put back pin %s that an unfinished start left: %w", orig, err))
			}
			continue
		}
		if slices.ContainsFunc(tempPinSuffixes, func(s string) bool { return strings.HasSuffix(n, s) }) {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove temporary pin %s: %w", n, err))
			}
		}
	}
	if switched && len(errs) == 0 {
		if err := os.Remove(filepath.Join(dir, switchedDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove the mark of a start killed after its switch: %w", err))
		}
	}
	return errors.Join(errs...)
}

// keep pins the map pinned at path a second time, as path_previous,
// before Open replaces or removes that pin: once per path, and only a pin
// that was there when Open began (one the attempt created goes at undo).
func (j *pinJournal) keep(path string) error {
	if j == nil || !j.before[filepath.Base(path)] || slices.Contains(j.kept, path) {
		return nil
	}
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return fmt.Errorf("keep pinned map %s: %w", path, err)
	}
	defer m.Close()
	// A clone has no pin path: Pin on m would move the pin it was
	// loaded from instead of adding one.
	c, err := m.Clone()
	if err != nil {
		return fmt.Errorf("keep pinned map %s: %w", path, err)
	}
	defer c.Close()
	if err := c.Pin(path + previousSuffix); err != nil {
		return fmt.Errorf("keep pinned map %s: %w", path, err)
	}
	j.kept = append(j.kept, path)
	return nil
}

// undo puts back what the start replaced: the programs on the hooks and
// the other steps, last first, then every pin as the journal found it:
// the kept ones first, each renamed over its name in one step, then the
// pins created since removed. A kill between the two leaves created pins
// beside the previous ones, which the next start copes with (the top of
// this file).
func (j *pinJournal) undo() error {
	if j == nil {
		return nil
	}
	// The hooks run the previous programs again: from here a kill
	// should find the pins put back (recoverPins), so the mark goes.
	errs := []error{j.undoSteps(), j.unmarkSwitched()}
	for _, p := range j.kept {
		if err := os.Rename(p+previousSuffix, p); err != nil {
			errs = append(errs, fmt.Errorf("put back pin %s: %w", p, err))
		}
	}
	names, err := pinNames(j.dir)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, n := range names {
		if j.before[n] {
			continue
		}
		if err := os.Remove(filepath.Join(j.dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pin %s of the failed start: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// commit lets the kept pins go: the maps Open made stay.
func (j *pinJournal) commit() error {
	if j == nil {
		return nil
	}
	j.releaseSteps()
	var errs []error
	for _, p := range j.kept {
		if err := os.Remove(p + previousSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pin %s%s: %w", p, previousSuffix, err))
		}
	}
	// After the _previous pins: a kill between the two finds the mark
	// and lets the rest go too.
	if len(errs) == 0 {
		errs = append(errs, j.unmarkSwitched())
	}
	return errors.Join(errs...)
}

// Commit says the start is complete: the pins Open converted or resized,
// and the programs the Attach methods put on the hooks, stay, even if the
// agent fails or is killed from now on. Call it once the programs are
// attached, before the maps are written; Close commits.
func (d *Datapath) Commit() error {
	j := d.pins
	d.pins = nil
	// No program of the previous release runs now.
	d.maps.ReleaseConntrackNew()
	d.committedOnce.Do(func() { close(d.committed) })
	return j.commit()
}

// Abort is Close for a start that failed before Commit: it puts the
// previous agent's programs back on every hook the Attach methods (and
// Open, in the program arrays) changed, then every pin Open converted or
// resized, and removes the pins it created, so that the previous agent's
// programs go on with the maps the pins name and the next start migrates
// again. After Commit it is Close.
func (d *Datapath) Abort() error {
	j := d.pins
	d.pins = nil
	d.closeMigrations()
	return errors.Join(j.undo(), d.closeObjects())
}

// Putting back the programs (issue 14, thirty-ninth pass). A start
// replaces more than pins, and before Commit each replacement is noted
// in the journal with how to undo it, in the order made; a start that
// fails undoes them in reverse, then puts the pins back:
//
//   - the program behind a pinned link it updated in place (tcx, XDP,
//     cgroup): the link runs its previous program again, whose id the
//     link's info gave before the update, held open meanwhile (the link
//     was its only holder);
//   - a link it attached where none was (a device or cgroup the previous
//     agent did not attach, a device re-created since): detached;
//   - an XDP link of the other mode it detached (--xdp changed): attached
//     again, with its program;
//   - Sluice's clsact filters it replaced or removed (a kernel without
//     tcx; release 0's, or those of an agent that ran before the kernel
//     had tcx, removed once the tcx link is in): put back as they were;
//   - the slots of the pinned program arrays (sluice6_tc_v1,
//     sluice6_xdp_v1) it filled: the previous agent's IPv6 programs again;
//   - the entries of the node maps it rewrote (sluice_node_cidrs,
//     sluice_devices and their IPv6 twins): as they were.
//
// So the previous agent's programs run again on every hook, on the maps
// the pins name once more, and the next start migrates as this one did.
// Flows the new programs added to the new conntrack maps between their
// link's update and the undo are carried back into the old maps once
// every hook runs the old programs again (carryBack), as settle carries
// the old ones forward: a UDP flow or a connection established meanwhile
// keeps its backend. A packet of such a flow answered by an old program
// before the undo (its reply at an egress not yet updated) finds no entry
// there: the window of a failed AttachDevices, milliseconds. While
// sluice_conntrack alone is migrated, the new programs put new flows into
// the shared sluice_ct_new (pauseShare; paused again first if the start
// fails after it was cleared), so only source-NATed flows, whose port
// reservation needs sluice_conntrack, could have that window then; and
// while the migration shims are in front of the programs (the undo of a
// failed AttachDevices detaches them after the links and carryBack) they
// copy such a reservation into the old map when the flow's reply comes
// (mig_copy_back, TestFailedResizeStartKeepsRemappedFlow). Only a start
// that fails after AttachDevices returned, the shims gone, leaves
// source-NATed flows that window. Release 0's conntrack, of another
// layout, is not carried back.
//
// A kill after the first link update cannot undo anything: the start
// marks that moment with a directory in the pin directory (switchedDir),
// and the next Open, finding it, keeps the killed start's pins, which the
// links it updated use, as a commit would (the links not yet updated ran
// the old programs on the old maps, whose writes since are lost, as
// before this pass); without the mark it puts them back (recoverPins).
//
// Not put back: a cgroup link the start moved from another cgroup (the
// old cgroup's path is not in the link's info: the new link stays, or
// the node would have no socket load balancing at all), a link of a
// device re-created since the previous agent attached it (detached by the
// kernel then), what Prune detached (a device dropped from --devices),
// and the SNAT ports the agent reserved (ip_local_reserved_ports: the
// previous agent's range, or the node's own business).

// carryBack copies the live flows this build's programs added to the new
// conntrack maps (of both families) into the old maps that the previous
// agent's programs use again, where the old maps are kept (_previous,
// the same layout): the undo of a failed start, once every hook runs the
// old programs. Half-open flows go into the old sluice_ct_new only if it
// was replaced too (it is shared otherwise).
func (d *Datapath) carryBack(j *pinJournal) error {
	old := func(name string) (*ebpf.Map, error) {
		path := filepath.Join(d.dir, name)
		if !slices.Contains(j.kept, path) {
			return nil, nil
		}
		return ebpf.LoadPinnedMap(path+previousSuffix, nil)
	}
	t := d.cfg.ctTimeouts()
	var errs []error
	for _, fam := range []struct {
		family    uint32
		est, half string
		carry     func(curEst, curHalf, oldEst, oldHalf *ebpf.Map) (int64, error)
	}{
		{4, mapConntrack, mapCTNew, carryFlows[sockCt4Key, sockCt4Entry](t)},
		{6, mapConntrack6, mapCTNew6, carryFlows[tcCt6Key, tcCt6Entry](t)},
	} {
		curEst, err1 := d.tc.mapByName(fam.est)
		curHalf, err2 := d.tc.mapByName(fam.half)
		oldEst, err3 := old(fam.est)
		oldHalf, err4 := old(fam.half)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			errs = append(errs, fmt.Errorf("carry %s back: %w", fam.est, err))
		} else if oldEst != nil || oldHalf != nil {
			if oldEst == nil {
				oldEst = curEst // shared
			}
			if oldHalf == nil {
				oldHalf = curHalf
			}
			off, err := fam.carry(curEst, curHalf, oldEst, oldHalf)
			if err != nil {
				errs = append(errs, fmt.Errorf("carry %s back: %w", fam.est, err))
			}
			// The failed start's sluice_ct_gc is still loaded: Abort
			// undoes before it closes the objects.
			if off != 0 && d.maps.ctGC != nil {
				if err := d.maps.adjustHalfOpen(fam.family, -off); err != nil {
					errs = append(errs, fmt.Errorf("take the places the new %s held off the half-open count: %w", fam.est, err))
				}
			}
		}
		for _, m := range []*ebpf.Map{oldEst, oldHalf} {
			if m != nil && m != curEst && m != curHalf {
				m.Close()
			}
		}
	}
	return errors.Join(errs...)
}

// carryFlows copies the flows of the new maps into the old ones where
// they differ (an old map of another layout is left alone): established
// ones as settle's ctPlace says, half-open ones only where nothing alive
// is. It returns how many places in the half-open count (which both
// builds share) go with the new sluice_conntrack: its entries that hold
// one and are not carried back (the old map has a live entry under the
// key, or no room), and the old map's entries that held one and were
// deleted to make room (lapsed or superseded), as settle counts them the
// other way; carryBack takes them off. Such a place is a flow the shim
// moved into the new map with its place (mig_put_counted), or a new
// program's port reservation whose copy mig_copy_back put into the old
// map taken off (CT_F_COUNTED). Before, these were dropped uncounted: the
// count stayed high with no agent to resync it, and a crash-looping
// upgrade could fill the share, after which ct_snat_room refused every
// new source-NATed flow.
func carryFlows[K ctMigKey[K], V ctValue](t ctTimeouts) func(curEst, curHalf, oldEst, oldHalf *ebpf.Map) (int64, error) {
	return func(curEst, curHalf, oldEst, oldHalf *ebpf.Map) (int64, error) {
		var errs []error
		var off, deleted int64
		if oldEst != curEst && oldEst.KeySize() == curEst.KeySize() && oldEst.ValueSize() == curEst.ValueSize() {
			n, err := copyConntrackCounting(curEst, oldEst, ctPlaceCounting[K, V](t, oldEst, oldHalf, true, &deleted))
			off += n
			errs = append(errs, err)
		}
		if oldHalf != curHalf && oldHalf.KeySize() == curHalf.KeySize() && oldHalf.ValueSize() == curHalf.ValueSize() {
			errs = append(errs, copyConntrack(curHalf, oldHalf, ctPlace[K, V](t, oldEst, oldHalf, false)))
		}
		return off + deleted, errors.Join(errs...)
	}
}

// switchedDir marks, while it exists, that a start not yet committed has
// updated a link: a kill from then on keeps its pins (recoverPins).
const switchedDir = "switched"

// restoreStep is one replacement the start made other than a pin: undo
// puts it back, release lets go of what undo would need.
type restoreStep struct {
	undo    func() error
	release func()
}

// note adds a replacement to the journal. switching: the replacement
// makes this build's programs run on a hook (a link updated or attached,
// IPv6 programs put in at the switch), after which a kill keeps the pins.
func (j *pinJournal) note(switching bool, undo func() error, release func()) error {
	if j == nil {
		return nil
	}
	if switching && !j.switched {
		if err := os.Mkdir(filepath.Join(j.dir, switchedDir), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("mark the start as switching: %w", err)
		}
		j.switched = true
		if j.carryBack != nil {
			// Undone after every hook runs the old programs again.
			j.steps = append(j.steps, restoreStep{undo: func() error { return j.carryBack(j) }, release: func() {}})
		}
	}
	if release == nil {
		release = func() {}
	}
	j.steps = append(j.steps, restoreStep{undo: undo, release: release})
	return nil
}

// undoSteps undoes the journal's steps, last first, and releases them.
func (j *pinJournal) undoSteps() error {
	var errs []error
	for _, s := range slices.Backward(j.steps) {
		errs = append(errs, s.undo())
	}
	j.releaseSteps()
	return errors.Join(errs...)
}

func (j *pinJournal) releaseSteps() {
	for _, s := range j.steps {
		s.release()
	}
	j.steps = nil
}

// unmarkSwitched removes switchedDir.
func (j *pinJournal) unmarkSwitched() error {
	j.switched = false
	if err := os.Remove(filepath.Join(j.dir, switchedDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the start's mark: %w", err)
	}
	return nil
}

// keepLinkProgram notes the program behind the link pinned at pin (l,
// opened from it) before the start updates it: undo updates the link back
// to it.
func (j *pinJournal) keepLinkProgram(pin string, l link.Link) error {
	if j == nil {
		return nil
	}
	info, err := l.Info()
	if err != nil {
		return fmt.Errorf("info of link %s: %w", pin, err)
	}
	prev, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return fmt.Errorf("program %d of link %s: %w", info.Program, pin, err)
	}
	return j.note(true, func() error {
		l, err := loadPinnedLink(pin)
		if err != nil || l == nil {
			return err // the device or cgroup went, and its link with it
		}
		defer l.Close()
		if err := l.Update(prev); err != nil {
			return fmt.Errorf("put program %d back on link %s: %w", info.Program, pin, err)
		}
		return nil
	}, func() { prev.Close() })
}

// keepNoLink notes that the start attaches a link at pin where none was
// (or a dead one): undo detaches it.
func (j *pinJournal) keepNoLink(pin string) error {
	if j == nil {
		return nil
	}
	return j.note(true, func() error {
		if err := detachPinnedLink(pin); err != nil {
			return fmt.Errorf("detach link %s of the failed start: %w", pin, err)
		}
		return nil
	}, nil)
}

// keepXDPLink notes the XDP link pinned at pin, in mode flags, before the
// start detaches it (another XDP mode configured): undo attaches its
// program again in that mode, after the undo of the new mode's link.
func (j *pinJournal) keepXDPLink(pin string, flags link.XDPAttachFlags) error {
	if j == nil {
		return nil
	}
	l, err := loadPinnedLink(pin)
	if err != nil || l == nil {
		return err
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil || info.XDP() == nil {
		return nil // not an XDP link this build knows: nothing to put back
	}
	ifindex := int(info.XDP().Ifindex)
	prev, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return fmt.Errorf("program %d of link %s: %w", info.Program, pin, err)
	}
	return j.note(true, func() error {
		l, err := link.AttachXDP(link.XDPOptions{Program: prev, Interface: ifindex, Flags: flags})
		if err != nil {
			return fmt.Errorf("attach XDP program %d again (%s): %w", info.Program, pin, err)
		}
		return replacePinned(nil, l, pin)
	}, func() { prev.Close() })
}

// keepFilters notes Sluice's clsact filters of parent on ifindex (the
// migration shims' aside, which go anyway) before the start replaces or
// removes any: undo removes those it added and puts those back.
func (j *pinJournal) keepFilters(ifindex int, parent uint32) error {
	if j == nil {
		return nil
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return err
	}
	list, err := netlink.FilterList(l, parent)
	if err != nil {
		list = nil // no clsact qdisc: no filters
	}
	ours := func(f netlink.Filter) (*netlink.BpfFilter, bool) {
		bf, ok := f.(*netlink.BpfFilter)
		return bf, ok && strings.HasPrefix(bf.Name, filterPrefix) && !strings.HasPrefix(bf.Name, filterPrefix+"mig_")
	}
	type kept struct {
		f    netlink.BpfFilter
		prog *ebpf.Program
	}
	var prev []kept
	release := func() {
		for _, k := range prev {
			k.prog.Close()
		}
	}
	for _, f := range list {
		bf, ok := ours(f)
		if !ok {
			continue
		}
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(bf.Id))
		if err != nil {
			release()
			return fmt.Errorf("program %d of filter %s: %w", bf.Id, bf.Name, err)
		}
		prev = append(prev, kept{*bf, p})
	}
	return j.note(false, func() error {
		var errs []error
		if err := removeSluiceFilters(ifindex, parent, func(f *netlink.BpfFilter) bool {
			return strings.HasPrefix(f.Name, filterPrefix+"mig_")
		}); err != nil {
			errs = append(errs, err)
		}
		for _, k := range prev {
			f := k.f
			f.Fd = k.prog.FD()
			if err := netlink.FilterReplace(&f); err != nil {
				errs = append(errs, fmt.Errorf("put filter %s back: %w", f.Name, err))
			}
		}
		return errors.Join(errs...)
	}, release)
}

// keepProgArray notes the programs in the slots of the program array m
// (pinned as name) before the start puts its own there. switching: at
// the switch of a migration, not at the load.
func (j *pinJournal) keepProgArray(m *ebpf.Map, name string, switching bool) error {
	if j == nil || m == nil {
		return nil
	}
	arr, err := m.Clone()
	if err != nil {
		return fmt.Errorf("keep %s: %w", name, err)
	}
	prev := make([]*ebpf.Program, arr.MaxEntries())
	release := func() {
		for _, p := range prev {
			if p != nil {
				p.Close()
			}
		}
		arr.Close()
	}
	for i := range prev {
		var id uint32
		err := arr.Lookup(uint32(i), &id)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err == nil {
			prev[i], err = ebpf.NewProgramFromID(ebpf.ProgramID(id))
		}
		if err != nil {
			release()
			return fmt.Errorf("keep slot %d of %s: %w", i, name, err)
		}
	}
	return j.note(switching, func() error {
		var errs []error
		for i, p := range prev {
			var err error
			if p != nil {
				err = arr.Put(uint32(i), p)
			} else if err = arr.Delete(uint32(i)); errors.Is(err, ebpf.ErrKeyNotExist) {
				err = nil
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("put slot %d of %s back: %w", i, name, err))
			}
		}
		return errors.Join(errs...)
	}, release)
}

// keepEntries notes every entry of the small map m (named name) before
// the start rewrites it: undo makes m hold exactly those again.
func (j *pinJournal) keepEntries(m *ebpf.Map, name string) error {
	if j == nil || m == nil {
		return nil
	}
	c, err := m.Clone()
	if err != nil {
		return fmt.Errorf("keep %s: %w", name, err)
	}
	prev := map[string][]byte{}
	k, v := make([]byte, c.KeySize()), make([]byte, c.ValueSize())
	it := c.Iterate()
	for it.Next(&k, &v) {
		prev[string(k)] = slices.Clone(v)
	}
	if err := it.Err(); err != nil {
		c.Close()
		return fmt.Errorf("keep %s: %w", name, err)
	}
	return j.note(false, func() error {
		var stale [][]byte
		k := make([]byte, c.KeySize())
		for it := c.Iterate(); it.Next(&k, &v); {
			if _, ok := prev[string(k)]; !ok {
				stale = append(stale, slices.Clone(k))
			}
		}
		var errs []error
		for _, k := range stale {
			errs = append(errs, deleteIgnoringMissing(c, k))
		}
		for k, v := range prev {
			errs = append(errs, c.Put([]byte(k), v))
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("put %s back: %w", name, err)
		}
		return nil
	}, func() { c.Close() })
}
