package reconciler

// The periodic re-read of the maps (SetRefreshInterval) compares them with
// the view as it reads them (Datapath.Walk), collecting nothing: at 30,000
// Services x 10 a dump of them (KernelState) and a new view built from it
// made about 115 MB of heap (issue 14), every 5 minutes, to find in the
// common case that nothing drifted. When something did, the walk has
// written down the entries the view does not hold as they are, and the
// counts of the maps say whether the view holds entries the maps do not:
// those are found by a second walk that marks in the view what it reads
// (repair.go). The view is then brought to what the maps hold for those
// entries alone, as a rebuild from a dump would have made it, and the
// Apply repairs them as it repairs any difference. Only a walk that fails,
// drift of more than maxDrift entries, or counts that a second walk does
// not explain (the maps changed under the walks) rebuild the view from a
// dump (refresh), as every re-read once did.

import (
	"net/netip"
	"slices"

	"github.com/sluice-lb/sluice/pkg/model"
)

// The maps a re-read compares, as indices of per-map counts.
const (
	mapMasters = iota
	mapSlots
	mapBackends
	mapRevNat
	mapRanges
	mapServiceIPs
	nMaps
)

// maxDrift is the most entries a re-read repairs one by one: beyond it
// (maps emptied or written by someone else wholesale) the view is rebuilt
// from a dump, which then costs no more than the entries it repairs.
const maxDrift = 4096

// viewCheck is the KernelVisitor that compares the maps with the view: it
// counts the entries of each map the view holds as they are, so that an
// entry the view holds and the maps do not shows up as a count short, and
// writes down the others in d, up to limit of them: one more stops the
// walk (over).
type viewCheck struct {
	r       *Reconciler
	matched [nMaps]int
	d       drift // in the visitor, which is made on the heap anyway: one allocation
	n       int   // differences found
	limit   int
	over    bool
}

// differs counts a difference in map k (the view holding the key under
// another value if same) and reports whether to write it down.
func (c *viewCheck) differs(k int, same bool) bool {
	if c.n >= c.limit {
		c.over = true
		return false
	}
	c.n++
	if same {
		c.d.sameKey[k]++
	}
	return true
}

func (c *viewCheck) Master(fe Frontend, m Master) bool {
	v := c.r.frontends.val(fe)
	if v != nil && v.hasMaster && v.master == m {
		c.matched[mapMasters]++
		return true
	}
	if !c.differs(mapMasters, v != nil && v.hasMaster) {
		return false
	}
	c.d.masters = append(c.d.masters, masterDrift{fe: fe, m: m, present: true})
	return true
}

func (c *viewCheck) Slot(fe Frontend, slot uint32, id BackendID) bool {
	var got BackendID
	ok := false
	if v := c.r.frontends.val(fe); v != nil {
		got, ok = v.slots.get(slot)
	}
	if ok && got == id && slot != 0 {
		c.matched[mapSlots]++
		return true
	}
	if !c.differs(mapSlots, ok) {
		return false
	}
	c.d.slots = append(c.d.slots, slotDrift{fe: fe, slot: slot, id: id, present: true})
	return true
}

func (c *viewCheck) Backend(id BackendID, addr model.L4Addr) bool {
	more, record := checkEntry(c, &c.r.backends, mapBackends, uint32(id), addr)
	if record {
		c.d.backends = append(c.d.backends, backendDrift{id: id, addr: addr, present: true})
	}
	return more
}

func (c *viewCheck) RevNat(id ServiceID, fe Frontend) bool {
	more, record := checkEntry(c, &c.r.revNat, mapRevNat, uint32(id), fe)
	if record {
		c.d.revNat = append(c.d.revNat, revNatDrift{id: id, fe: fe, present: true})
	}
	return more
}

// checkEntry compares v, what map k holds under id, with tab's entry: it
// reports whether the walk goes on, and whether to write the entry down.
func checkEntry[V comparable, P keyPacking[V]](c *viewCheck, tab *idTable[V, P], k int, id uint32, v V) (more, record bool) {
	got, ok := tab.get(id)
	if ok && got == v {
		c.matched[k]++
		return true, false
	}
	if !c.differs(k, ok) {
		return false, false
	}
	return true, true
}

func (c *viewCheck) SourceRange(fe model.L4Addr, p netip.Prefix) bool {
	if v := c.r.frontends.val(DefaultScope(fe)); v != nil {
		if _, ok := slices.BinarySearchFunc(v.ranges(), p, netip.Prefix.Compare); ok {
			c.matched[mapRanges]++
			return true
		}
	}
	if !c.differs(mapRanges, false) {
		return false
	}
	c.d.ranges = append(c.d.ranges, rangeDrift{fe: fe, p: p, present: true})
	return true
}

func (c *viewCheck) ServiceIP(a netip.Addr) bool {
	if c.r.inServiceIPs(a) {
		c.matched[mapServiceIPs]++
		return true
	}
	if !c.differs(mapServiceIPs, false) {
		return false
	}
	c.d.ips = append(c.d.ips, ipDrift{a: a, present: true})
	return true
}

// viewCounts returns how many entries of each map the view holds.
func (r *Reconciler) viewCounts() [nMaps]int {
	var n [nMaps]int
	for _, v := range r.frontends.all() {
		if v.hasMaster {
			n[mapMasters]++
		}
		n[mapSlots] += v.slots.n
		n[mapRanges] += len(v.ranges())
	}
	n[mapBackends], n[mapRevNat], n[mapServiceIPs] = r.backends.len(), r.revNat.len(), r.nServiceIPs
	return n
}

// reread is the periodic re-read of the maps: recheckMaps, or the tests'
// reference set in recheck.
func (r *Reconciler) reread() recheckOutcome {
	if r.recheck != nil {
		return r.recheck()
	}
	return r.recheckMaps()
}

// logMassDrift says that a re-read found more drifted entries than
// maxDrift, so the view is rebuilt from a dump.
func (r *Reconciler) logMassDrift() {
	r.log.Info("Datapath maps drifted from the reconciler's view in more entries than it repairs one by one, reading them whole",
		"entries", maxDrift)
}

// recheckOutcome is what a re-read of the maps came to.
type recheckOutcome int

const (
	noDrift  recheckOutcome = iota // the view kept as it is
	repaired                       // the view brought to the maps for the entries that drifted
	rebuild                        // the view is to be rebuilt from a dump
)

// recheckMaps is the periodic re-read: it compares the maps with the view and,
// when they drifted, brings the view to what they hold for the entries
// that differ (repair.go), so that the Apply rewrites or deletes those.
// rebuild says it could not: the caller rebuilds the view from a dump.
func (r *Reconciler) recheckMaps() recheckOutcome {
	c := &viewCheck{r: r, limit: maxDrift}
	d := &c.d
	if err := r.dp.Walk(c); err != nil {
		r.log.Debug("Walk of the datapath maps failed, reading them whole", "err", err)
		return rebuild
	}
	if c.over {
		r.logMassDrift()
		return rebuild
	}
	// Entries the view holds that the maps do not: per map, those it
	// holds less those read as they are or under another value.
	var short [nMaps]int
	missing := false
	for k, n := range r.viewCounts() {
		short[k] = n - c.matched[k] - d.sameKey[k]
		switch {
		case short[k] < 0: // read twice: the maps changed under the walk
			r.log.Debug("Walk of the datapath maps read more entries than they hold, reading them whole")
			return rebuild
		case short[k] > 0:
			missing = true
		}
	}
	if c.n == 0 && !missing {
		return noDrift
	}
	if missing && !r.findMissing(d, short) {
		return rebuild
	}
	r.log.Info("Datapath maps drifted from the reconciler's view, repairing the entries that differ", d.logAttrs()...)
	for k, n := range d.counts() {
		r.drift.Entries[k] += uint64(n)
	}
	r.patchView(d)
	return repaired
}
