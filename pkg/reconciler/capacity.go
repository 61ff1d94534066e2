package reconciler

// Capacity accounting. Each address family has its own service, backend
// and source-range maps (sluice_services and sluice6_services, and so on),
// each as large as the datapath's Capacity and SourceRangeCapacity say, so
// service entries, backends and source ranges are counted per family and
// checked against their own family's maps: a full IPv4 service map refuses
// no IPv6 Service, and the reverse. Services (rev_nat entries) are counted
// over both families together: service ids are one space over both (the
// per-Service counters are indexed by them), so the number of services of
// both families is what must fit, and then each rev_nat map and service-IP
// set fits too.
//
// A frontend is checked before its first write (programFrontend, and
// programFresh for many at once), against what it adds at its peak: the
// make-before-break order writes its new slots and source ranges before
// its old ones go.
//
// A reserve of each map is kept for changes of programmed frontends: a
// new frontend (at an address not programmed now: programmed) may fill
// a map only up to its size less a 32nd (reserveOf; none for a map of
// fewer than 1,024 entries); a change of a programmed one may fill it to
// the last entry. A rollout replaces a Service's endpoints
// make-before-break: its new backends are written before its old ones
// go (in phase 3, after every frontend of the Apply; slots are rewritten
// in place, only a count that grows needs more), so at its peak it needs
// as many backends more as it has new endpoints. Without the reserve,
// new Services could take the maps' last entries (one tenant's Service
// of thousands of ports, or a cluster near its sizes), and every
// rollout after that would be refused, the Service left on its deleted
// pods' backends. With it, a flood of new Services stops at the size
// less the reserve and rollouts keep working, as long as one Apply's
// rollouts need no more than the reserve: at the default sizes 8,192
// backends (80 Services of 100 endpoints all replaced at once), 32,768
// service entries and 2,048 services of both families; the next Apply
// has the old backends' room back. A change that does not fit even with
// the reserve keeps its previous programming, as before.
//
// The reserve protects programmed frontends' changes against floods of
// new frontends and against a cluster growing into its sizes; it does
// not stop a tenant growing its own programmed Services into it: a
// scale-up is a change of a programmed frontend, so Services whose flood
// stopped at the reserve's edge can take the reserve an endpoint at a
// time, and other Services' rollouts are refused again. A per-namespace
// share would; until then admission bounds are the control (README,
// Limitations).
//
// A new two-scope frontend's scopes are checked together (pairAt): an
// internal scope whose default scope does not fit is not written, as no
// master would name it.

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/sluice-lb/sluice/pkg/model"
)

// family indexes what is counted per address family.
type family uint8

const (
	ipv4 family = iota
	ipv6
)

// familyOf returns a's address family.
func familyOf(a netip.Addr) family {
	if a.Is6() && !a.Is4In6() {
		return ipv6
	}
	return ipv4
}

func (f family) String() string {
	if f == ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

// mapName returns the name of f's map of a kind ("services", "backends",
// "src_ranges"), as pinned, without its version: for errors.
func (f family) mapName(kind string) string {
	if f == ipv6 {
		return "sluice6_" + kind
	}
	return "sluice_" + kind
}

// reserveShare is the share of each map's size kept for changes of
// programmed frontends: size/reserveShare entries, rounded down. A map
// of fewer than reserveMinSize entries keeps none: its 32nd (under 32
// entries) is no rollout's worth, and would only shorten a map sized
// that small on purpose (tests of a full map, a tiny node).
const (
	reserveShare   = 32
	reserveMinSize = 1024
)

// reserveOf returns the entries of each map of capacity c that new
// frontends may not take.
func reserveOf(c sizes) sizes {
	r := sizes{services: reserveIn(c.services)}
	for f := range r.entries {
		r.backends[f] = reserveIn(c.backends[f])
		r.entries[f] = reserveIn(c.entries[f])
		r.ranges[f] = reserveIn(c.ranges[f])
	}
	return r
}

// reserveIn returns the reserve of a map of n entries.
func reserveIn(n int) int {
	if n < reserveMinSize {
		return 0
	}
	return n / reserveShare
}

// sizeFor returns the smallest size from which on every size of a map
// lets new frontends fill it with n entries, its reserve kept: what a
// flag must be raised to ("or more"). (A size under the reserve's
// minimum that holds n would fit too, but not every size above it.)
func sizeFor(n int) int {
	s := n + n/(reserveShare-1) // about n/(1-1/32), at most a few off
	for s-reserveIn(s) < n {
		s++
	}
	for s > 0 && s-1-reserveIn(s-1) >= n {
		s--
	}
	return s
}

// programmed reports whether fe is programmed now, for the reserve
// (reserveOf): fe itself has a master of a Service (not a retired one),
// or fe is an internal scope and its default scope has one (the internal
// scope a programmed NodePort gets when it turns externalTrafficPolicy
// Local). A default scope is not programmed through its internal one: an
// internal scope written earlier in the same Apply (its pair is checked
// together, pairAt) or left by an older version is no programmed Service.
func (r *Reconciler) programmed(fe Frontend) bool {
	live := func(fe Frontend) bool {
		v := r.frontends.val(fe)
		return v != nil && v.hasMaster && v.master.Flags&FlagRetired == 0
	}
	return live(fe) || fe.Scope == ScopeInternal && live(DefaultScope(fe.L4Addr))
}

// reserveFor returns what fe's check keeps of capacity's maps: their
// reserve for a new frontend, none for a programmed one's change.
func (r *Reconciler) reserveFor(fe Frontend, capacity sizes) sizes {
	if r.programmed(fe) {
		return sizes{}
	}
	return reserveOf(capacity)
}

// markNewBackends sets in m the addresses of d's backends that are not
// programmed yet (no real backend id): a later frontend of the same
// check that names one does not need it again.
func (r *Reconciler) markNewBackends(d *desiredFrontend, m map[model.L4Addr]bool) {
	for _, b := range d.backends {
		if id, ok := r.backendOf.get(b.L4Addr); !ok || !r.isReal(id) {
			m[b.L4Addr] = true
		}
	}
}

// pairAt reports whether ds[i] (sorted, Frontend.Compare) is the internal
// scope of a two-scope frontend whose default scope, ds[i+1], is written
// in the same Apply. The two are checked together, before either is
// written: an internal scope whose default scope does not fit would be
// left with no master naming it.
func pairAt(ds []*desiredFrontend, i int) bool {
	d := ds[i]
	return d.fe.Scope == ScopeInternal && i+1 < len(ds) &&
		ds[i+1].fe == DefaultScope(d.fe.L4Addr) && ds[i+1].flags&FlagTwoScopes != 0
}

// needOf returns what programming the frontends of ds adds to the maps at
// its peak: their capacityNeeded, a backend new to several of them (or
// in counted, taken already) counted once.
func (r *Reconciler) needOf(ds []*desiredFrontend, counted map[model.L4Addr]bool) sizes {
	var n sizes
	var seen map[model.L4Addr]bool
	for i, d := range ds {
		n = n.add(r.capacityNeeded(d.fe, d))
		for _, b := range d.backends {
			if a := b.L4Addr; counted[a] || seen[a] {
				n.backends[familyOf(a.Addr)]--
			}
		}
		if i+1 == len(ds) {
			break
		}
		if seen == nil {
			seen = make(map[model.L4Addr]bool, len(d.backends))
		}
		r.markNewBackends(d, seen)
	}
	return n
}

// sizes counts entries per map: in use, available, or needed. Service
// map entries, backends and source ranges are per family (indexed by
// family), services are of both families.
type sizes struct {
	services int    // rev_nat entries, of both families
	backends [2]int // backend entries
	entries  [2]int // service map entries: masters plus slots
	ranges   [2]int // source ranges
}

// add returns s plus t.
func (s sizes) add(t sizes) sizes {
	s.services += t.services
	for f := range s.entries {
		s.backends[f] += t.backends[f]
		s.entries[f] += t.entries[f]
		s.ranges[f] += t.ranges[f]
	}
	return s
}

// capacityOf returns the capacity of the datapath's maps: each family's
// maps are as large as Capacity and SourceRangeCapacity say.
func capacityOf(dp Datapath) sizes {
	var c sizes
	services, backends, entries := dp.Capacity()
	ranges := dp.SourceRangeCapacity()
	c.services = services
	c.backends = [2]int{backends, backends}
	c.entries = [2]int{entries, entries}
	c.ranges = [2]int{ranges, ranges}
	return c
}

// inUse returns what the view says the maps hold.
func (r *Reconciler) inUse() sizes {
	return sizes{services: r.revNat.len(), backends: r.nbackends, entries: r.entries, ranges: r.ranges}
}

// capacityNeeded returns what programming d adds to the maps at its peak,
// before the frontend's old slots and source ranges go. All of it is of
// d's family (validate refuses backends and ranges of the other one).
func (r *Reconciler) capacityNeeded(fe Frontend, d *desiredFrontend) sizes {
	var n sizes
	f := familyOf(fe.Addr)
	v := r.frontends.val(fe)
	if sid, ok := r.serviceOf.get(fe); !ok {
		n.services = 1
	} else if !r.revNat.has(uint32(sid)) {
		n.services = 1
	}
	for _, b := range d.backends {
		a := b.L4Addr
		if id, ok := r.backendOf.get(a); !ok || !r.isReal(id) {
			n.backends[f]++
		}
	}
	for s := uint32(0); s <= uint32(len(d.backends)); s++ {
		if v == nil {
			n.entries[f]++
		} else if s == 0 && !v.hasMaster {
			n.entries[f]++
		} else if _, ok := v.slots.get(s); s > 0 && !ok {
			n.entries[f]++
		}
	}
	for _, p := range d.ranges {
		if v == nil || !v.hasRange(p) {
			n.ranges[f]++
		}
	}
	return n
}

// checkCapacity returns an ErrCapacity error naming every map that has no
// room for need: how many entries it needs, how many the map holds, of
// how many (the map of the family that has no room, for the per-family
// maps), and the flag that sizes it. Service entries (a frontend's master
// and its slots) are named by their flag alone: they are counted against
// --max-service-entries, which neither the masters' hash (sized by
// --max-services) nor the slots' array (twice as large) holds as such.
// A map need adds nothing to never refuses it. reserve is what need may
// not take of each map (reserveOf, for a new frontend; none for a change
// of a programmed one); an error names it.
//
// When need does not fit, the retired masters (retired.go) make room
// first: freeRetired deletes them with their rev_nat entries, and need
// is checked again. This is the only place that frees them early.
func (r *Reconciler) checkCapacity(need, capacity, reserve sizes) error {
	return r.checkRoomFreeing(sizes{}, need, capacity, reserve)
}

// checkPair checks a two-scope frontend's internal scope in and default
// scope def together (pairAt, programFrontend's way: Apply writes one
// and then the other), when def's master does not name the internal
// scope yet (a new address, a NodePort turning externalTrafficPolicy
// Local): if def is invalid or does not fit, in is not written either,
// as no master would name it. The reserve is def's: a change of a
// programmed default scope may take it, a new one not. When def's master
// names in already, each is checked on its own, as before: a refused
// default scope keeps naming an internal scope that is there.
func (r *Reconciler) checkPair(in, def *desiredFrontend, capacity sizes) error {
	if v := r.frontends.val(def.fe); v != nil && v.hasMaster && v.master.Flags&FlagTwoScopes != 0 {
		return nil
	}
	for _, d := range []*desiredFrontend{in, def} {
		if err := validate(d); err != nil {
			return err
		}
	}
	return r.checkCapacity(r.needOf([]*desiredFrontend{in, def}, nil), capacity, r.reserveFor(def.fe, capacity))
}

// checkRoomFreeing is checkCapacity with extra taken as in use besides
// what the view says (programFresh's frontends before one in its batch).
// Retired masters are freed only when that would make need fit: when
// what is short is services or service entries of a family they hold,
// and no more than they hold (freeable: an upper bound); a frontend that
// would not fit all the same (its backends or source ranges short, or
// larger than what they free) leaves them their flows.
func (r *Reconciler) checkRoomFreeing(extra, need, capacity, reserve sizes) error {
	use := r.inUse().add(extra)
	err := checkRoom(use, need, capacity, reserve)
	if err != nil && checkRoom(use.sub(r.freeable()), need, capacity, reserve) == nil && r.freeRetired() {
		err = checkRoom(r.inUse().add(extra), need, capacity, reserve)
	}
	return err
}

// sub returns s minus t.
func (s sizes) sub(t sizes) sizes {
	s.services -= t.services
	for f := range s.entries {
		s.backends[f] -= t.backends[f]
		s.entries[f] -= t.entries[f]
		s.ranges[f] -= t.ranges[f]
	}
	return s
}

// freeable is at most what freeRetired can free: a service id and a
// service entry (its master) per retired master the Apply's services do
// not want, a service id per rev_nat entry waiting for phase 3, and a
// backend entry per backend that only retired UDP masters freeRetired
// deletes hold for their flows (udpretired.go): no slot names it, no
// Service holds it standby, the Apply's changed frontends do not want it
// (deleteUnusedBackends keeps it), and every held record naming it is at
// a retired master the Apply does not want (freeRetired keeps one it
// wants: its hold stays). Counting those too made a frontend short of
// backends free every retired master, TCP ones too, and still be refused.
func (r *Reconciler) freeable() sizes {
	var n sizes
	for fe := range r.retiredAt {
		if !wanted(r.applying, fe) {
			n.services++
			n.entries[familyOf(fe.Addr)]++
		}
	}
	n.services += len(r.revNatCand)
	if len(r.heldRefs) == 0 {
		return n
	}
	// evictable counts, per backend, the held records naming it whose
	// retired master freeRetired deletes.
	evictable := make(map[model.L4Addr]int32, len(r.heldRefs))
	for addr, rec := range r.udpFlows {
		if rec.held && !wanted(r.applying, DefaultScope(addr)) {
			for _, a := range rec.backends {
				evictable[a]++
			}
		}
	}
	var want map[model.L4Addr]bool
	if r.applyingWant != nil {
		want = r.applyingWant()
	}
	for a, refs := range r.heldRefs {
		if evictable[a] < refs || want[a] {
			continue
		}
		if id, ok := r.backendOf.get(a); ok && r.isReal(id) && r.backends.refs(uint32(id)) <= 0 && !r.standby(a) && !r.restoredHeld(a) {
			n.backends[familyOf(a.Addr)]++
		}
	}
	return n
}

// checkRoom is checkCapacity with the maps holding use: programFresh
// counts what the frontends before one in its batch take as in use, so
// that each frontend's error names what it needs itself, as
// programFrontend's do (the same numbers from one apply to the next: a
// Service's event about it does not change).
func checkRoom(use, need, capacity, reserve sizes) error {
	var short []string
	// fits reports whether need (of a map of size n, kept of it for
	// changes of programmed frontends) fits with use.
	fits := func(use, need, n, kept int) bool {
		return need == 0 || use+need <= n-kept
	}
	// limit is the flag's text for a map of size n, use and need in it:
	// when it is refused only for the reserve (a first program after a
	// reboot, of Services that grew into it), the size that fits them.
	limit := func(flag string, use, need, n, kept int) string {
		if kept == 0 {
			return "(" + flag + ")"
		}
		what := fmt.Sprintf("(%s; %d of them kept for changes of programmed frontends", flag, kept)
		if use+need <= n {
			what += fmt.Sprintf("; refused only for them: %s=%d or more fits it", flag, sizeFor(use+need))
		}
		return what + ")"
	}
	if !fits(use.services, need.services, capacity.services, reserve.services) {
		short = append(short, fmt.Sprintf("services, of both families: %d in use of %d %s", use.services, capacity.services,
			limit("--max-services", use.services, need.services, capacity.services, reserve.services)))
	}
	for _, f := range []family{ipv4, ipv6} {
		if !fits(use.backends[f], need.backends[f], capacity.backends[f], reserve.backends[f]) {
			short = append(short, fmt.Sprintf("%d new %s backends: %d in use of %d in %s %s",
				need.backends[f], f, use.backends[f], capacity.backends[f], f.mapName("backends"),
				limit("--max-backends", use.backends[f], need.backends[f], capacity.backends[f], reserve.backends[f])))
		}
		if !fits(use.entries[f], need.entries[f], capacity.entries[f], reserve.entries[f]) {
			short = append(short, fmt.Sprintf("%d new %s service entries: %d in use of %d %s",
				need.entries[f], f, use.entries[f], capacity.entries[f],
				limit("--max-service-entries", use.entries[f], need.entries[f], capacity.entries[f], reserve.entries[f])))
		}
		if !fits(use.ranges[f], need.ranges[f], capacity.ranges[f], reserve.ranges[f]) {
			short = append(short, fmt.Sprintf("%d new %s source ranges: %d in use of %d in %s %s",
				need.ranges[f], f, use.ranges[f], capacity.ranges[f], f.mapName("src_ranges"),
				limit("--max-source-ranges", use.ranges[f], need.ranges[f], capacity.ranges[f], reserve.ranges[f])))
		}
	}
	if len(short) > 0 {
		return fmt.Errorf("%w (%s); previous programming kept", ErrCapacity, strings.Join(short, "; "))
	}
	return nil
}

// putBackend records that the backend map of a's family holds id -> a.
func (r *Reconciler) putBackend(id BackendID, a model.L4Addr) {
	if old, ok := r.backends.put(uint32(id), a); ok {
		r.nbackends[familyOf(old.Addr)]--
	}
	r.nbackends[familyOf(a.Addr)]++
}
