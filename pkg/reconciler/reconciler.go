// Package reconciler turns Sluice's desired state (pkg/model) into ordered,
// idempotent, minimal writes to the datapath's maps.
//
// The reconciler keeps a view of what the maps hold: it is read back from
// the kernel by Restore and updated after every write that succeeded, never
// before, so after a failed write the view is still the truth and the next
// Apply retries exactly what is missing. Apply diffs the desired state
// against that view, not against the previous desired state.
//
// The reconciler is the only code that orders map writes. Writes are made
// before breaks, so that the datapath, reading concurrently, never follows
// a slot to a backend that does not exist, a master to a slot that does
// not exist, a two-scope master to an internal scope that does not exist,
// or checks a frontend's loadBalancerSourceRanges before they are there.
// For each frontend (in each scope) that changes:
//
//	upsert new backends -> upsert rev_nat -> write slots 1..m ->
//	add new source ranges -> write the master (slot 0) with count m and
//	its flags -> delete slots m+1..old -> delete source ranges no longer
//	wanted -> add a ClusterIP's address to the service IPs
//
// A two-scope frontend (model.Service.TwoScopes) is two frontends under one
// address (Frontend.Scope): the internal scope is programmed before the
// default scope's master says FlagTwoScopes, and removed after that master
// stopped saying it or is gone. A frontend that goes away loses its
// master first (a ClusterIP's last master after its address left the
// service IPs, serviceips.go; a TCP one's is retired, kept with no
// backends for its established flows, retired.go), then its slots and
// source ranges. Only
// after all frontends are done are backends nobody names deleted, and the
// rev_nat entries of removed services (replies of flows still in
// conntrack need them until then), and last the service CIDRs, when the
// state names them (servicecidrs.go: their drop never applies to a
// programmed frontend, so they need no place in this order). An emptied service keeps its master
// with count 0, so the datapath refuses connections to the VIP (rejects
// them, or drops them with FlagDropEmpty) instead of letting them leak to
// whatever would answer it. A service that does not fit in the maps of
// its address family (any of them, source ranges included; capacity.go)
// fails alone, before any write, and keeps its previous programming.
//
// A frontend with session affinity (both scopes of a two-scope one) whose
// backends move down into holes has its clients' affinity entries moved
// to the new slots right before its master shrinks; the entries of
// backends that leave it (or of the whole frontend, when it goes or loses
// its affinity) are deleted once all frontends are done, by then the
// datapath no longer follows them.
//
// Slots are reused in place: a backend that stays keeps its slot, a new one
// fills a hole, and when a service shrinks the backends above the new count
// move down into the holes. Changing one endpoint of a service therefore
// writes one slot and the master, whatever the size of the service.
//
// Ids come from free lists (never 0, and a freed id only after a
// quarantine, because conntrack and socket affinity entries still name
// it); Restore marks the ids found in the pinned maps as used, so an agent
// restart keeps every id and applying the same state again writes nothing.
//
// The files follow the phases: reconciler.go is Apply's orchestration,
// view.go the view of the maps, frontend.go the programming of one
// frontend, srcranges.go its source ranges, serviceips.go the service
// IPs, servicecidrs.go the service CIDRs, flags.go the master flags,
// capacity.go what fits in the maps of each address family, gc.go the deletes of what nobody names and the
// release of ids (idalloc.go), recheck.go the periodic re-read of the
// maps and repair.go the repair of the drift it finds. dump.go prints a
// KernelState as text: the one form of the maps that the golden tests,
// fakedp and `sluicectl services --raw` share, so a golden case can be
// replayed against real maps.
package reconciler

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// ErrCapacity is wrapped by errors about a service that does not fit in the
// datapath's maps.
var ErrCapacity = errors.New("datapath map capacity exceeded")

// How many ids must be freed after an id before it is handed out again
// (see idAllocator).
const (
	ServiceIDQuarantine = 256
	BackendIDQuarantine = 1024
)

// BackendIDSlots bounds the backend ids the reconciler hands out when each
// family's backends map holds maxBackends (Datapath.Capacity): ids are
// below it. The datapath's backends maps are arrays indexed by the id, of
// this many entries. Ids are one space over both families, each with
// maxBackends in use at most; the allocator keeps them dense, at most its
// quarantine above the number in use; and id 0 is never used.
func BackendIDSlots(maxBackends int) int {
	return 2*maxBackends + BackendIDQuarantine + 1
}

// ServiceIDSlots bounds the service ids the reconciler hands out when
// maxServices services fit (Datapath.Capacity): ids are below it. The
// datapath's rev_nat maps and per-Service counters are arrays indexed by
// the id, of this many entries. Ids are one space over both families,
// maxServices of them in use at most (capacity.go counts services over
// both families together); the allocator keeps them dense, at most its
// quarantine above the number in use; and id 0 is never used.
func ServiceIDSlots(maxServices int) int {
	return maxServices + ServiceIDQuarantine + 1
}

// Stats says how much is programmed, and how much fits. The counts are
// of both address families; the ones ending in 6 say how many of them are
// IPv6. The capacities are per family (each family's maps are that
// large, capacity.go), but for MaxServices: services of both families
// together.
type Stats struct {
	Services       int // frontends with a master entry
	Backends       int // backend entries
	ServiceEntries int // masters plus slots
	RevNat         int // reverse-NAT entries
	SourceRanges   int // source ranges, of all frontends
	ServiceIPs     int // addresses of ClusterIP frontends

	Backends6, ServiceEntries6, SourceRanges6 int

	MaxServices       int
	MaxBackends       int
	MaxServiceEntries int
	MaxSourceRanges   int

	// Writes counts the datapath operations issued (upserts, deletes and
	// conntrack flushes), successful or not, since New.
	Writes uint64
}

// Reconciler programs a Datapath. Its methods are safe for concurrent use.
type Reconciler struct {
	mu  sync.Mutex
	dp  Datapath
	log *slog.Logger

	// The view of the kernel's maps.
	frontends keyMap[Frontend, *frontendView, frontendKeys]
	// The backend and rev_nat entries by id, with the slots (of any
	// frontend, within its count or not) naming each backend id and the
	// masters naming each service id.
	backends idTable[model.L4Addr, backendKeys]
	revNat   idTable[Frontend, frontendKeys]
	// Per family (capacity.go): backend entries, service map entries
	// (masters plus slots), and source ranges of all frontends.
	nbackends [2]int
	entries   [2]int
	ranges    [2]int

	// Entries that may have lost their last user: backends no slot names,
	// rev_nat entries no master names. Only these are considered for
	// deletion, so a small change costs little however much is programmed.
	backendCand map[BackendID]bool
	revNatCand  map[ServiceID]bool

	// The id each backend address and each frontend is (to be) programmed
	// under. An id named here is reserved even before its entry is written.
	backendOf keyMap[model.L4Addr, BackendID, backendKeys]
	serviceOf keyMap[Frontend, ServiceID, frontendKeys]

	// The service IPs: what the map holds, how many ClusterIP masters
	// each address has, and the addresses whose membership may be wrong
	// (serviceips.go).
	ips         keyMap[netip.Addr, serviceIP, addrKeys]
	nServiceIPs int // addresses the map holds
	ipDirty     map[netip.Addr]bool
	// The service CIDRs the datapath holds, when cidrsKnown (read by
	// Restore and a refresh, set by each write of them; forgotten by a
	// failed write and by every periodic re-read, so that the next
	// state that has them writes them again, repairing drift:
	// servicecidrs.go).
	cidrs      []netip.Prefix
	cidrsKnown bool
	// The last set the datapath refused for its size (ErrCapacity),
	// when cidrsRefusedSet: logged once, not written again while the
	// maps are known to hold what they held.
	cidrsRefused    []netip.Prefix
	cidrsRefusedSet bool

	svcIDs *idAllocator
	beIDs  *idAllocator

	// UDP backends that left a service and whose conntrack entries still
	// need flushing (kept across Applies until a flush succeeds).
	pendingFlush map[model.L4Addr]bool
	// standbyRefs counts, per backend address, the frontends whose
	// Service holds it in standby: its entry stays (standby.go).
	standbyRefs map[model.L4Addr]int32
	// udpNamed holds, per Service port, its UDP frontends whose view
	// was programmed for it (the views' svc): a NodePort frontend that
	// goes flushes only the backends no NodePort frontend of its Service
	// port and number at another node address still serves (standby.go's
	// servedByName).
	udpNamed map[model.ServicePortName][]Frontend
	// Session affinity entries to delete: of backends that left a
	// frontend with affinity, or of whole frontends (kept across Applies
	// until the fix succeeds).
	pendingAffinity map[AffinityFix]bool

	inSync bool
	dirty  bool // reservations may need releasing (after Restore or a failure)

	// appliedGen is the generation (model.State.Gen) of the state the
	// last Apply programmed entirely, or 0.
	appliedGen  uint64
	incremental int // Applies that looked at st.Changed only, for tests
	sweeps      int // Applies that looked for reservations to release, for tests
	// lastFull says the last Apply compared every desired frontend,
	// not only st.Changed (LastApplyFull).
	lastFull bool

	// batchMin is the fewest new frontends an Apply programs in
	// batches (batch.go); 0 never does.
	batchMin int
	// freshChunk is how many of them it programs at once
	// (defaultFreshChunk).
	freshChunk int

	// Room for fastInSync's sorted copy of a frontend's backends.
	scratchKeys  []uint64
	scratchAddrs []model.L4Addr

	refreshEvery time.Duration
	lastRead     time.Time // when the view was last read from the maps
	aroundRead   func()    // SetRefreshHook's
	drift        DriftStats
	// recheck, when set, replaces recheckMaps as the periodic re-read:
	// the tests' reference that rebuilds the view on any drift
	// (export_test.go's RebuildOnDrift).
	recheck func() recheckOutcome
	writes  uint64

	// Retired masters (retired.go): how long one is kept, TCP's and
	// UDP's (0: a removed frontend's master is deleted at once), when
	// each was retired (or read from the maps), and the clock.
	retireAfter    time.Duration
	retireUDPAfter time.Duration
	retiredAt      map[Frontend]time.Time
	clock          func() time.Time
	// The flows of removed UDP frontends (udpretired.go): per address,
	// the backends they may use, and how many retired masters hold each
	// backend's entry. Not in the maps: kept across a rebuild of the
	// view.
	udpFlows map[model.L4Addr]*udpFlows
	heldRefs map[model.L4Addr]int32
	// udpFlowsCap bounds the backends of the unheld records
	// (udpFlowsMaxBackends; tests lower it).
	udpFlowsCap int
	// restoredFlows: the backends the conntrack flows to each live UDP
	// master's address used at Restore (restoreUDPFlows), for its
	// retirement before its first program (holdUDPFlows: no Service
	// names its standby backends then). An address's go when they are
	// used or its default scope's view gets a Service (setService), the
	// rest at the end of the Apply's second phase, but for a retirement
	// that failed there (settleRestoredFlows). Until then their
	// backends' entries are kept (restoredRefs counts the addresses
	// naming each), so that a retirement that fails and is retried
	// still finds them.
	restoredFlows map[model.L4Addr][]model.L4Addr
	restoredRefs  map[model.L4Addr]int32
	// The services of the Apply under way, for freeRetired (the
	// capacity check): nil outside Apply.
	applying model.Services
	// The backends the Apply's changed frontends want (Apply's
	// wantBackend), for freeRetired: nil outside Apply.
	applyingWant func() map[model.L4Addr]bool
}

// New returns a Reconciler with an empty view. Call Restore before the
// first Apply when the maps may already hold entries (pinned maps).
func New(dp Datapath, log *slog.Logger) *Reconciler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reconciler{dp: dp, log: log, refreshEvery: DefaultRefreshInterval, batchMin: defaultBatchMin, freshChunk: defaultFreshChunk, clock: time.Now}
	r.reset()
	r.udpFlows, r.heldRefs = map[model.L4Addr]*udpFlows{}, map[model.L4Addr]int32{}
	r.udpFlowsCap = udpFlowsMaxBackends
	r.lastRead = time.Now()
	return r
}

func (r *Reconciler) reset() {
	r.frontends = makeKeyMap[Frontend, *frontendView, frontendKeys](0)
	r.backends = idTable[model.L4Addr, backendKeys]{}
	r.revNat = idTable[Frontend, frontendKeys]{}
	r.nbackends = [2]int{}
	r.entries = [2]int{}
	r.ranges = [2]int{}
	r.backendCand = map[BackendID]bool{}
	r.revNatCand = map[ServiceID]bool{}
	r.backendOf = makeKeyMap[model.L4Addr, BackendID, backendKeys](0)
	r.serviceOf = makeKeyMap[Frontend, ServiceID, frontendKeys](0)
	r.ips, r.nServiceIPs = makeKeyMap[netip.Addr, serviceIP, addrKeys](0), 0
	r.ipDirty = map[netip.Addr]bool{}
	r.cidrs, r.cidrsKnown = nil, false
	r.svcIDs = newIDAllocator(ServiceIDQuarantine)
	r.beIDs = newIDAllocator(BackendIDQuarantine)
	r.pendingFlush = map[model.L4Addr]bool{}
	r.standbyRefs = map[model.L4Addr]int32{}
	r.udpNamed = map[model.ServicePortName][]Frontend{}
	r.pendingAffinity = map[AffinityFix]bool{}
	r.retiredAt = map[Frontend]time.Time{}
	r.inSync = false
	r.appliedGen = 0
}

// Restore replaces the view with the contents of the datapath's maps and
// rebuilds the id allocators from them, so that ids survive an agent
// restart. Entries nobody wants (strays) are deleted by the next Apply.
func (r *Reconciler) Restore() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ks, err := r.dp.Dump()
	if err != nil {
		return fmt.Errorf("restore: dump datapath maps: %w", err)
	}
	r.reset()
	r.loadKernel(ks)
	r.restoreUDPFlows()
	r.log.Info("Restored datapath state", "frontends", len(ks.Masters), "backends", r.backends.len(), "rev_nat", r.revNat.len())
	return nil
}

// SetRefreshInterval makes Apply re-read the maps when more than d has
// passed since they were last read, so that entries changed or deleted
// behind the reconciler's back are repaired by the next Apply (the
// agent's periodic resync): the re-read compares the maps with the view
// (recheck.go) and brings what drifted into it (repair.go), or rebuilds
// the view from a dump, as Restore reads it, when it cannot. Zero disables it; the default is
// DefaultRefreshInterval.
func (r *Reconciler) SetRefreshInterval(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshEvery = d
}

// SetRefreshHook makes an Apply that rebuilds its view from a dump of the
// maps (SetRefreshInterval, when they drifted from the view in a way the
// re-read does not repair entry by entry: its walk failed, or more than
// maxDrift entries drifted) call f right before the dump and again at
// the Apply's end. The agent collects its
// heap there: the rebuild holds a dump of every map and a new view beside
// the state (about 80 MiB of heap made, 40 live, at 30,000 Services x
// 10), which a collection in it would take for the live heap, setting the
// collector's goal to twice that until its next collection; and one
// before it starts the rebuild on the live heap alone. A re-read that
// finds no drift compares the maps with the view as it reads them,
// making next to no heap, and one that finds a few entries drifted
// brings those into the view (repair.go), making heap in proportion to
// them: neither calls f, as a collection around them would cost CPU and
// free nothing they made.
func (r *Reconciler) SetRefreshHook(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.aroundRead = f
}

// DefaultRefreshInterval is how often Apply re-reads the maps by default.
const DefaultRefreshInterval = 5 * time.Minute

// InSync reports whether the last Apply programmed everything it was asked
// to.
func (r *Reconciler) InSync() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inSync
}

// Stats returns what is programmed and the datapath's capacities.
func (r *Reconciler) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{
		RevNat: r.revNat.len(), ServiceIPs: r.nServiceIPs, Writes: r.writes,
		ServiceEntries: r.entries[ipv4] + r.entries[ipv6], ServiceEntries6: r.entries[ipv6],
		SourceRanges: r.ranges[ipv4] + r.ranges[ipv6], SourceRanges6: r.ranges[ipv6],
		Backends6: r.nbackends[ipv6],
	}
	for _, v := range r.frontends.all() {
		if v.hasMaster {
			s.Services++
		}
	}
	s.Backends = r.backends.len()
	s.MaxServices, s.MaxBackends, s.MaxServiceEntries = r.dp.Capacity()
	s.MaxSourceRanges = r.dp.SourceRangeCapacity()
	return s
}

// BackendCounts returns how many entries the backend maps hold, of both
// families, and how many of them are IPv6's: Stats' Backends and
// Backends6, without its walk of every frontend (pkg/metrics asks after
// every change).
func (r *Reconciler) BackendCounts() (backends, backends6 int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.backends.len(), r.nbackends[ipv6]
}

// DriftStats counts the periodic re-reads of the maps
// (SetRefreshInterval) since New, by what they came to, and the entries
// the repaired ones found drifted.
type DriftStats struct {
	NoDrift  uint64 // the maps held what the view says
	Repaired uint64 // entries drifted and were brought into the view one by one
	Rebuilt  uint64 // the view was rebuilt from a dump (mass drift, or a walk that failed)
	// Entries counts the drifted entries of the repaired re-reads, per
	// map (DriftMaps names them); a rebuilt one does not count them.
	Entries [nMaps]uint64
}

// Drift returns the re-reads' counts (pkg/metrics exports them at scrape
// time).
func (r *Reconciler) Drift() DriftStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drift
}

// LastApplyFull reports whether the last Apply compared every desired
// frontend with its view (a first program, a state not made from the one
// applied last, one after a failure or a re-read that rebuilt the view),
// rather than only the frontends the state changed (none when it was the
// state applied last, applied again): kube-proxy's full sync against its
// partial one (pkg/metrics.Metrics.SetFullSync).
func (r *Reconciler) LastApplyFull() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastFull
}

// Apply programs st. It writes only what differs from the view, and returns
// a joined error naming every service that could not be (fully) programmed,
// one *FrontendError each (see errors.go); all the others are programmed
// regardless.
//
// Its cost is one comparison per desired frontend plus work proportional
// to what changed: frontends remember the backends they were last
// programmed with, and only backends and rev_nat entries that lost their
// last user are considered for deletion.
func (r *Reconciler) Apply(st *model.State) error {
	r.mu.Lock()
	defer r.mu.Unlock()

	capacity := capacityOf(r.dp)
	writes0 := r.writes
	var errs []error
	if r.refreshEvery > 0 && time.Since(r.lastRead) > r.refreshEvery {
		r.cidrsKnown = false // re-asserted below (servicecidrs.go)
		// The common case: nothing drifted, and the view stays as it
		// is (recheck.go). Drift is brought into the view entry by entry
		// (repair.go) for this Apply to repair; only when that cannot
		// be is the view rebuilt from a dump.
		switch r.reread() {
		case noDrift:
			r.lastRead = time.Now()
			r.drift.NoDrift++
		case repaired:
			r.lastRead = time.Now()
			r.drift.Repaired++
		case rebuild:
			r.drift.Rebuilt++
			if r.aroundRead != nil {
				r.aroundRead()
				defer r.aroundRead() // runs before the unlock
			}
			if err := r.refresh(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	var services model.Services
	if st != nil {
		services = st.Services
	}
	r.applying = services
	defer func() {
		r.applying, r.applyingWant = model.Services{}, nil
	}()
	// A state made from the one applied last, which left everything in
	// sync, differs from it only in st.Changed: the other frontends are
	// in sync (the view changes only by Apply, Restore and refresh, which
	// forget the generation).
	//
	// The state applied last, applied again (a periodic sync, the
	// agent's resync, with nothing changed since), is in sync as a
	// whole: nothing to look at, as kube-proxy's periodic sync is a
	// partial one. (Drift behind the agent's back is found by the
	// re-read above, which forgets the generation.)
	again := st != nil && st.Gen != 0 && st.Gen == r.appliedGen
	incremental := st != nil && (again || st.BaseGen != 0 && st.BaseGen == r.appliedGen) && len(errs) == 0 && !r.dirty
	var stChanged []model.L4Addr
	if incremental && !again {
		stChanged = st.Changed
	}
	r.appliedGen = 0
	r.lastFull = !incremental
	if incremental {
		r.incremental++
	}

	// Which frontends (in which scopes) need work, and the backends they
	// want. (Frontends in sync name all their backends already.)
	var changed []*desiredFrontend
	// A first program's desired frontends, made in one slice (one each,
	// 30,000 allocations); they live until the Apply returns, as the
	// others do.
	var slab []desiredFrontend
	if !incremental && r.frontends.len() == 0 {
		// A first program: every frontend changes (grown by append,
		// 30,000 pointers allocated 1.2 MB, the apply's peak).
		changed = make([]*desiredFrontend, 0, services.Len())
		slab = make([]desiredFrontend, 0, services.Len())
	}
	consider := func(fe Frontend, v *frontendView, svc *model.Service) {
		if r.fastInSync(v, fe, svc) {
			// The newer state's, so that v keeps the older one's no longer
			// alive, and so that its standby backends are counted (another
			// Service port at the same address and slots may hold others;
			// a restored view has none).
			r.setService(fe, v, svc)
			return
		}
		var in *desiredFrontend // nil: a new one
		if len(slab) < cap(slab) {
			slab = slab[:len(slab)+1]
			in = &slab[len(slab)-1]
		}
		d := makeDesired(in, fe, svc)
		if r.inSyncFrontend(fe, d) {
			r.markSynced(fe, d)
			return
		}
		changed = append(changed, d)
	}
	// Phase 1 (below) removes the frontends nobody wants any more: a
	// default scope goes before its internal one; an internal scope whose
	// default scope stays goes after phase 2, once that master no longer
	// names it.
	var gone, goneAfter []Frontend
	unwanted := func(fe Frontend) {
		switch {
		case wanted(services, fe):
		case r.retiredExpired(fe):
			// expiredRetired has it already.
		case fe.Scope == ScopeInternal && services.Get(fe.L4Addr) != nil:
			goneAfter = append(goneAfter, fe)
		default:
			gone = append(gone, fe)
		}
	}
	// Retired masters past their time go as frontends nobody wants.
	gone = r.expiredRetired(services, gone)
	if incremental {
		for _, a := range stChanged {
			for _, scope := range []Scope{ScopeDefault, ScopeInternal} {
				fe := Frontend{L4Addr: a, Scope: scope}
				v := r.frontends.val(fe)
				if svc := services.Get(a); svc != nil && scope < scopes(svc) {
					consider(fe, v, svc)
				} else if v != nil {
					unwanted(fe)
				}
			}
		}
	} else {
		known := 0 // desired frontends the view has
		for a, svc := range services.All() {
			if svc == nil {
				continue
			}
			for scope := range scopes(svc) {
				fe := Frontend{L4Addr: a, Scope: scope}
				v := r.frontends.val(fe)
				if v != nil {
					known++
				}
				consider(fe, v, svc)
			}
		}
		if known < r.frontends.len() { // else every frontend of the view is wanted
			for fe := range r.frontends.all() {
				unwanted(fe)
			}
		}
	}
	sortDesired(changed)
	r.presize(changed)
	// The backends the changed frontends want: made only when a
	// backend may have to be deleted (a first program deletes none).
	// Their Services' standby backends too: a changed frontend's view
	// counts them (standbyRefs) only once it is programmed, and until
	// then (after a Restore or a rebuild, which count none, or when its
	// programming fails) nothing else keeps their entries.
	var want map[model.L4Addr]bool
	wantBackend := func() map[model.L4Addr]bool {
		if want == nil {
			n := 0
			for _, d := range changed {
				n += len(d.backends) + len(d.svc.Standby)
			}
			want = make(map[model.L4Addr]bool, n)
			for _, d := range changed {
				for _, b := range d.backends {
					a := b.L4Addr
					want[a] = true
				}
				for _, a := range d.svc.Standby {
					want[a] = true
				}
			}
		}
		return want
	}
	r.applyingWant = wantBackend

	// Phase 1: frontends nobody wants any more: master, then slots. This
	// also frees room in the maps for what comes next.
	slices.SortFunc(gone, func(a, b Frontend) int {
		return cmp.Or(a.L4Addr.Compare(b.L4Addr), cmp.Compare(a.Scope, b.Scope))
	})
	for _, fe := range gone {
		errs = r.remove(fe, services, errs)
	}
	// Backends nobody names and nobody wants can go now (more room).
	if err := r.deleteUnusedBackends(wantBackend); err != nil {
		errs = append(errs, err)
	}
	// The flows of removed UDP frontends: held no more once their
	// retired master went; flushed where a changed frontend takes their
	// address for a Service that does not serve their backend
	// (udpretired.go).
	r.settleUDPFlows()
	r.claimUDPFlows(changed)

	// Phase 2: frontends to add or change, in a stable order (a
	// frontend's internal scope before its default one). New ones (at
	// addresses the view knows nothing of) go first, in batches
	// (batch.go): no other frontend depends on them.
	fresh, rest := r.splitFresh(changed)
	var buf freshBufs
	for len(fresh) > 0 {
		n := freshChunk(fresh, r.freshChunk)
		errs = append(errs, r.programFresh(fresh[:n], capacity, &buf)...)
		fresh = fresh[n:]
	}
	// dropOrphan removes the internal scope at a whose default scope was
	// refused (it does not fit, or is invalid) and whose master does not
	// name it: none will (a write of that master failed after it, an
	// Apply before).
	dropOrphan := func(a model.L4Addr) {
		if v := r.frontends.val(DefaultScope(a)); v != nil && v.hasMaster && v.master.Flags&FlagTwoScopes != 0 {
			return
		}
		if in := (Frontend{L4Addr: a, Scope: ScopeInternal}); r.frontends.val(in) != nil {
			errs = r.remove(in, services, errs)
		}
	}
	for i := 0; i < len(rest); i++ {
		d := rest[i]
		if pairAt(rest, i) {
			// Both scopes of a two-scope frontend, or neither.
			if err := r.checkPair(d, rest[i+1], capacity); err != nil {
				errs = append(errs, frontendError(d.svc.Name, d.fe, false, err),
					frontendError(rest[i+1].svc.Name, rest[i+1].fe, false, err))
				dropOrphan(d.fe.L4Addr)
				i++
				continue
			}
		}
		if d.flags&FlagTwoScopes != 0 {
			// Its master would name an internal scope that failed to be
			// programmed: it keeps its previous programming.
			if v := r.frontends.val(Frontend{L4Addr: d.fe.L4Addr, Scope: ScopeInternal}); v == nil || !v.hasMaster {
				errs = append(errs, frontendError(d.svc.Name, d.fe, false, errInternalScope))
				continue
			}
		}
		if err := r.programFrontend(d.fe, d, capacity); err != nil {
			errs = append(errs, frontendError(d.svc.Name, d.fe, false, err))
			if d.flags&FlagTwoScopes != 0 && (errors.Is(err, ErrCapacity) || errors.Is(err, ErrInvalid)) {
				dropOrphan(d.fe.L4Addr)
			}
			continue
		}
		r.markSynced(d.fe, d)
	}
	for _, fe := range goneAfter {
		errs = r.remove(fe, services, errs)
	}

	// Phase 3: backends nobody names, rev_nat of removed services, the
	// service IPs a failure left wrong, and conntrack of UDP backends that
	// left a service. The flows Restore read go first, but for a failed
	// retirement's (udpretired.go): their backends nothing else keeps
	// go with the others.
	r.settleRestoredFlows(services)
	if err := r.deleteUnusedBackends(wantBackend); err != nil {
		errs = append(errs, err)
	}
	if err := r.deleteUnusedRevNat(services); err != nil {
		errs = append(errs, err)
	}
	if err := r.syncServiceIPs(); err != nil {
		errs = append(errs, err)
	}
	// The service CIDRs, when the state names them: last, as they
	// need no order (servicecidrs.go).
	if st != nil && st.HasServiceCIDRs {
		if err := r.syncServiceCIDRs(st.ServiceCIDRs); err != nil {
			errs = append(errs, err)
		}
	}
	// One pass over conntrack for all of them.
	if len(r.pendingFlush) > 0 {
		flush := slices.SortedFunc(maps.Keys(r.pendingFlush), model.L4Addr.Compare)
		r.writes++
		if err := r.dp.FlushConntrack(flush); err != nil {
			errs = append(errs, fmt.Errorf("flush conntrack of backends %v: %w", flush, err))
		} else {
			r.flushedUDPFlows(r.pendingFlush)
			clear(r.pendingFlush)
		}
	}

	// And one pass over the session affinity entries.
	if len(r.pendingAffinity) > 0 {
		fixes := slices.SortedFunc(maps.Keys(r.pendingAffinity), compareAffinityFix)
		r.writes++
		if err := r.dp.FixAffinity(fixes); err != nil {
			errs = append(errs, fmt.Errorf("delete session affinity of %d frontends and backends: %w", len(fixes), err))
		} else {
			clear(r.pendingAffinity)
		}
	}

	// Ids reserved for writes that failed, or for frontends and backends
	// that are gone, are freed. Only failures and Restore leave such
	// reservations behind, so the scan is skipped otherwise.
	if len(errs) > 0 || r.dirty {
		r.releaseReservations(services, wantBackend)
		r.sweeps++
		r.dirty = len(errs) > 0
	}

	err := errors.Join(errs...)
	r.inSync = err == nil
	if err == nil && st != nil {
		r.appliedGen = st.Gen
	}
	if len(changed) > 0 || len(gone) > 0 || err != nil {
		r.log.Debug("Applied desired state", "frontends", services.Len(), "changed", len(changed),
			"removed", len(gone), "writes", r.writes-writes0, "errors", len(errs))
	}
	return err
}

// wanted reports whether the desired services want frontend fe (in its
// scope).
func wanted(services model.Services, fe Frontend) bool {
	svc := services.Get(fe.L4Addr)
	return svc != nil && fe.Scope < scopes(svc)
}

// remove removes frontend fe, adding a failure to errs. An internal scope
// whose default scope's master still says two scopes (its rewrite or
// removal failed, an error already) is kept for it.
func (r *Reconciler) remove(fe Frontend, services model.Services, errs []error) []error {
	if fe.Scope == ScopeInternal {
		if v := r.frontends.val(DefaultScope(fe.L4Addr)); v != nil && v.hasMaster && v.master.Flags&FlagTwoScopes != 0 {
			return errs
		}
	}
	name := r.frontends.val(fe).name()
	if err := r.removeFrontend(fe, services); err != nil {
		return append(errs, frontendError(name, fe, true, err))
	}
	return errs
}

// sortDesired sorts ds by frontend (Frontend.Compare). IPv4 frontends
// (all of them, the common case) sort by a packed key, whose order is
// theirs: a first program of 30,000 compared the whole frontends half a
// million times.
func sortDesired(ds []*desiredFrontend) {
	type keyed struct {
		k uint64
		d *desiredFrontend
	}
	ks := make([]keyed, len(ds))
	for i, d := range ds {
		// The internal scope first: packed as 0, the default as 1.
		k, ok := packL4(d.fe.L4Addr, ScopeInternal-d.fe.Scope)
		if !ok || d.fe.Scope > ScopeInternal {
			slices.SortFunc(ds, func(a, b *desiredFrontend) int { return a.fe.Compare(b.fe) })
			return
		}
		ks[i] = keyed{k, d}
	}
	slices.SortFunc(ks, func(a, b keyed) int { return cmp.Compare(a.k, b.k) })
	for i := range ks {
		ds[i] = ks[i].d
	}
}

// presize makes room in the view's maps for a first program (empty
// maps), so that programming 30,000 frontends does not rehash them a dozen
// times over.
func (r *Reconciler) presize(changed []*desiredFrontend) {
	if r.frontends.len() != 0 || len(changed) < 64 {
		return
	}
	nb, nf := 0, len(changed)
	nb4, nf4 := 0, 0 // IPv4's, packed in the key maps
	for _, d := range changed {
		nb += len(d.backends)
		if d.fe.Addr.Is4() {
			nb4 += len(d.backends)
			nf4++
		}
	}
	// Ids are handed out from 1 up: the tables need one more entry. And
	// the quarantine's worth beside: a change hands the backend it adds
	// a new id, above the ones in use until the freed ones come out of
	// quarantine, and a table cut to the first program's ids would be
	// copied whole (and a quarter larger) by one of the first changes
	// after it: 4.8 MB at 300,000 backends, for 16 KB.
	r.backends.grow(nb + 1 + BackendIDQuarantine)
	r.revNat.grow(nf + 1 + ServiceIDQuarantine)
	if r.backendOf.len() == 0 {
		r.backendOf = makeKeyMap[model.L4Addr, BackendID, backendKeys](nb4)
	}
	if r.serviceOf.len() == 0 {
		r.serviceOf = makeKeyMap[Frontend, ServiceID, frontendKeys](nf4)
	}
	r.frontends = makeKeyMap[Frontend, *frontendView, frontendKeys](nf4)
	if p, ok := r.dp.(FrontendPresizer); ok {
		// Grown one frontend at a time, the real maps' table of the
		// slots' ranges allocated 5.6 MB in a first program of 30,000
		// Services x 10, for the 3 MB it ends with, rehashing as it
		// grew.
		p.PresizeFrontends(nf4, nf-nf4)
	}
	if r.ips.len() == 0 {
		// At most one address each (most are ClusterIPs').
		r.ips = makeKeyMap[netip.Addr, serviceIP, addrKeys](nf4)
	}
}

// compareAffinityFix orders fixes by frontend, then backend and slot, for
// a stable order of writes.
func compareAffinityFix(a, b AffinityFix) int {
	if c := a.Frontend.Compare(b.Frontend); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Backend, b.Backend); c != 0 {
		return c
	}
	return cmp.Compare(a.Slot, b.Slot)
}
