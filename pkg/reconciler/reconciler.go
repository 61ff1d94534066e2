// Package reconciler turns Sluice's desired state (pkg/model) into ordered,
// idempotent, minimal writes to the datapath's maps.
//
// The reconciler keeps a view of what the maps hold: it is read back from
// the kernel by Restore and updated after every write that succeeded, never
// before, so after a failed write the view is still the truth and the next
// Apply retries exactly what is missing. Apply diffs the desired state
// against that view, not against the previous desired state.
//
// Writes are made before breaks, so that the datapath, reading concurrently,
// never follows a slot to a backend that does not exist or a master to a
// slot that does not exist. For each frontend that changes:
//
//	upsert new backends -> upsert rev_nat -> write slots 1..m ->
//	write the master (slot 0) with count m -> delete slots m+1..old
//
// A frontend that goes away loses its master first, then its slots. Only
// after all frontends are done are backends nobody names deleted, and the
// rev_nat entries of removed services (replies of flows still in conntrack
// need them until then). An emptied service keeps its master with count 0,
// so the datapath refuses connections to the VIP instead of letting them
// leak to whatever would answer it.
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
package reconciler

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
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

// Stats says how much is programmed, and how much fits.
type Stats struct {
	Services       int // frontends with a master entry
	Backends       int // backend entries
	ServiceEntries int // masters plus slots
	RevNat         int // reverse-NAT entries

	MaxServices       int
	MaxBackends       int
	MaxServiceEntries int

	// Writes counts the datapath operations issued (upserts, deletes and
	// conntrack flushes), successful or not, since New.
	Writes uint64
}

// frontendView is what the maps hold for one frontend.
type frontendView struct {
	hasMaster bool
	master    Master
	slots     slotMap // slot >= 1 -> backend

	// synced says the frontend was last fully programmed with
	// syncedAddrs and nothing touched it since (a fast path for Apply).
	synced      bool
	syncedAddrs []model.L4Addr

	name model.ServicePortName // who it was programmed for; empty if restored
}

// Reconciler programs a Datapath. Its methods are safe for concurrent use.
type Reconciler struct {
	mu  sync.Mutex
	dp  Datapath
	log *slog.Logger

	// The view of the kernel's maps.
	frontends map[model.L4Addr]*frontendView
	backends  map[BackendID]model.L4Addr
	revNat    map[ServiceID]model.L4Addr
	entries   int               // masters plus slots
	slotRefs  map[BackendID]int // slots (of any frontend, within count or not) naming a backend id
	masterRef map[ServiceID]int // masters naming a service id

	// Entries that may have lost their last user: backends no slot names,
	// rev_nat entries no master names. Only these are considered for
	// deletion, so a small change costs little however much is programmed.
	backendCand map[BackendID]bool
	revNatCand  map[ServiceID]bool

	// The id each backend address and each frontend is (to be) programmed
	// under. An id named here is reserved even before its entry is written.
	backendOf map[model.L4Addr]BackendID
	serviceOf map[model.L4Addr]ServiceID

	svcIDs *idAllocator
	beIDs  *idAllocator

	// UDP backends that left a service and whose conntrack entries still
	// need flushing (kept across Applies until a flush succeeds).
	pendingFlush map[model.L4Addr]bool

	inSync bool
	dirty  bool // reservations may need releasing (after Restore or a failure)

	refreshEvery time.Duration
	lastRead     time.Time // when the view was last read from the maps
	writes       uint64
}

// New returns a Reconciler with an empty view. Call Restore before the
// first Apply when the maps may already hold entries (pinned maps).
func New(dp Datapath, log *slog.Logger) *Reconciler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reconciler{dp: dp, log: log, refreshEvery: DefaultRefreshInterval}
	r.reset()
	r.lastRead = time.Now()
	return r
}

func (r *Reconciler) reset() {
	r.frontends = map[model.L4Addr]*frontendView{}
	r.backends = map[BackendID]model.L4Addr{}
	r.revNat = map[ServiceID]model.L4Addr{}
	r.entries = 0
	r.slotRefs = map[BackendID]int{}
	r.masterRef = map[ServiceID]int{}
	r.backendCand = map[BackendID]bool{}
	r.revNatCand = map[ServiceID]bool{}
	r.backendOf = map[model.L4Addr]BackendID{}
	r.serviceOf = map[model.L4Addr]ServiceID{}
	r.svcIDs = newIDAllocator(ServiceIDQuarantine)
	r.beIDs = newIDAllocator(BackendIDQuarantine)
	r.pendingFlush = map[model.L4Addr]bool{}
	r.inSync = false
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
	r.log.Info("Restored datapath state", "frontends", len(ks.Masters), "backends", len(r.backends), "rev_nat", len(r.revNat))
	return nil
}

// SetRefreshInterval makes Apply re-read the maps (as Restore does) when
// more than d has passed since they were last read, so that entries changed
// or deleted behind the reconciler's back are repaired by the next Apply
// (the agent's periodic resync). Zero disables it; the default is
// DefaultRefreshInterval.
func (r *Reconciler) SetRefreshInterval(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshEvery = d
}

// DefaultRefreshInterval is how often Apply re-reads the maps by default.
const DefaultRefreshInterval = 5 * time.Minute

// refresh re-reads the maps into the view, keeping what is not in them
// (pending conntrack flushes).
func (r *Reconciler) refresh() error {
	ks, err := r.dp.Dump()
	if err != nil {
		return fmt.Errorf("refresh: dump datapath maps: %w", err)
	}
	flush, writes, inSync := r.pendingFlush, r.writes, r.inSync
	r.reset()
	r.loadKernel(ks)
	r.pendingFlush, r.writes, r.inSync = flush, writes, inSync
	return nil
}

// loadKernel fills the (reset) view from a dump of the maps.
func (r *Reconciler) loadKernel(ks *KernelState) {
	r.lastRead = time.Now()
	for id, addr := range ks.Backends {
		r.backends[id] = addr
		r.beIDs.markUsed(uint32(id))
	}
	for id, fe := range ks.RevNat {
		r.revNat[id] = fe
		r.svcIDs.markUsed(uint32(id))
	}
	for fe, m := range ks.Masters {
		v := r.frontend(fe)
		v.hasMaster, v.master = true, m
		r.entries++
		r.masterRef[m.ID]++
		r.svcIDs.markUsed(uint32(m.ID))
	}
	for fe, slots := range ks.Slots {
		v := r.frontend(fe)
		for s, id := range slots {
			if s == 0 {
				continue
			}
			v.slots.put(s, id)
			r.entries++
			r.slotRefs[id]++
			r.beIDs.markUsed(uint32(id))
		}
	}
	// Choose the id each frontend and backend address is known by. A
	// master's id wins over a rev_nat entry naming the same frontend; of
	// several ids for one backend address (strays), the most named, then the
	// lowest, wins. The losers are rewritten and deleted by the next Apply.
	for _, fe := range sortedKeys(r.frontends) {
		if v := r.frontends[fe]; v.hasMaster && r.masterRef[v.master.ID] == 1 {
			r.serviceOf[fe] = v.master.ID
		}
	}
	for _, id := range sortedKeys(r.revNat) {
		fe := r.revNat[id]
		if _, ok := r.serviceOf[fe]; !ok && r.masterRef[id] == 0 {
			r.serviceOf[fe] = id
		}
	}
	for _, id := range sortedKeys(r.backends) {
		a := r.backends[id]
		cur, ok := r.backendOf[a]
		if !ok || r.slotRefs[id] > r.slotRefs[cur] {
			r.backendOf[a] = id
		}
	}
	for id := range r.backends {
		if r.slotRefs[id] == 0 {
			r.backendCand[id] = true
		}
	}
	for id := range r.revNat {
		if r.masterRef[id] == 0 {
			r.revNatCand[id] = true
		}
	}
	r.dirty = true
}

func (r *Reconciler) frontend(fe model.L4Addr) *frontendView {
	v := r.frontends[fe]
	if v == nil {
		v = &frontendView{}
		r.frontends[fe] = v
	}
	return v
}

func (r *Reconciler) isReal(id BackendID) bool {
	_, ok := r.backends[id]
	return ok
}

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
	s := Stats{RevNat: len(r.revNat), ServiceEntries: r.entries, Writes: r.writes}
	for _, v := range r.frontends {
		if v.hasMaster {
			s.Services++
		}
	}
	s.Backends = len(r.backends)
	s.MaxServices, s.MaxBackends, s.MaxServiceEntries = r.dp.Capacity()
	return s
}

// desiredFrontend is one frontend of the desired state, with its backends.
type desiredFrontend struct {
	fe    model.L4Addr
	svc   *model.Service
	addrs []model.L4Addr // sorted, unique
}

func newDesired(fe model.L4Addr, svc *model.Service) *desiredFrontend {
	d := &desiredFrontend{fe: fe, svc: svc, addrs: make([]model.L4Addr, 0, len(svc.Backends))}
	for _, b := range svc.Backends {
		d.addrs = append(d.addrs, b.L4Addr)
	}
	slices.SortFunc(d.addrs, cmpL4)
	d.addrs = slices.Compact(d.addrs)
	return d
}

// Apply programs st. It writes only what differs from the view, and returns
// a joined error naming every service that could not be (fully) programmed;
// all the others are programmed regardless.
//
// Its cost is one comparison per desired frontend plus work proportional
// to what changed: frontends remember the backends they were last
// programmed with, and only backends and rev_nat entries that lost their
// last user are considered for deletion.
func (r *Reconciler) Apply(st *model.State) error {
	r.mu.Lock()
	defer r.mu.Unlock()

	capSvc, capBe, capEnt := r.dp.Capacity()
	writes0 := r.writes
	var errs []error
	if r.refreshEvery > 0 && time.Since(r.lastRead) > r.refreshEvery {
		if err := r.refresh(); err != nil {
			errs = append(errs, err)
		}
	}
	var services map[model.L4Addr]*model.Service
	if st != nil {
		services = st.Services
	}

	// Which frontends need work, and the backends they want. (Frontends in
	// sync name all their backends already.)
	var changed []*desiredFrontend
	wantBackend := map[model.L4Addr]bool{}
	known := 0 // desired frontends the view has
	for fe, svc := range services {
		if svc == nil {
			continue
		}
		v := r.frontends[fe]
		if v != nil {
			known++
		}
		if r.fastInSync(v, svc) {
			continue
		}
		d := newDesired(fe, svc)
		if r.inSyncFrontend(fe, d) {
			r.markSynced(fe, d)
			continue
		}
		changed = append(changed, d)
		for _, a := range d.addrs {
			wantBackend[a] = true
		}
	}
	slices.SortFunc(changed, func(a, b *desiredFrontend) int { return cmpL4(a.fe, b.fe) })
	r.presize(changed)

	// Phase 1: frontends nobody wants any more: master, then slots. This
	// also frees room in the maps for what comes next.
	var gone []model.L4Addr
	if known < len(r.frontends) { // else every frontend of the view is wanted
		for fe := range r.frontends {
			if services[fe] == nil {
				gone = append(gone, fe)
			}
		}
	}
	slices.SortFunc(gone, cmpL4)
	for _, fe := range gone {
		name := r.frontends[fe].name
		if err := r.removeFrontend(fe); err != nil {
			if name != (model.ServicePortName{}) {
				errs = append(errs, fmt.Errorf("service %s (%s): remove: %w", name, fe, err))
			} else {
				errs = append(errs, fmt.Errorf("remove frontend %s: %w", fe, err))
			}
		}
	}
	// Backends nobody names and nobody wants can go now (more room).
	if err := r.deleteUnusedBackends(wantBackend); err != nil {
		errs = append(errs, err)
	}

	// Phase 2: frontends to add or change, in a stable order.
	for _, d := range changed {
		if err := r.programFrontend(d.fe, d, capSvc, capBe, capEnt); err != nil {
			errs = append(errs, fmt.Errorf("service %s (%s): %w", d.svc.Name, d.fe, err))
			continue
		}
		r.markSynced(d.fe, d)
	}

	// Phase 3: backends nobody names, rev_nat of removed services, and
	// conntrack of UDP backends that left a service.
	if err := r.deleteUnusedBackends(wantBackend); err != nil {
		errs = append(errs, err)
	}
	if err := r.deleteUnusedRevNat(services); err != nil {
		errs = append(errs, err)
	}
	// One pass over conntrack for all of them.
	if flush := sortedKeys(r.pendingFlush); len(flush) > 0 {
		r.writes++
		if err := r.dp.FlushConntrack(flush); err != nil {
			errs = append(errs, fmt.Errorf("flush conntrack of backends %v: %w", flush, err))
		} else {
			clear(r.pendingFlush)
		}
	}

	// Ids reserved for writes that failed, or for frontends and backends
	// that are gone, are freed. Only failures and Restore leave such
	// reservations behind, so the scan is skipped otherwise.
	if len(errs) > 0 || r.dirty {
		r.releaseReservations(services, wantBackend)
		r.dirty = len(errs) > 0
	}

	err := errors.Join(errs...)
	r.inSync = err == nil
	if len(changed) > 0 || len(gone) > 0 || err != nil {
		r.log.Debug("Applied desired state", "frontends", len(services), "changed", len(changed),
			"removed", len(gone), "writes", r.writes-writes0, "errors", len(errs))
	}
	return err
}

// presize makes room in the view's maps for a first program (empty
// maps), so that programming 30,000 frontends does not rehash them a dozen
// times over.
func (r *Reconciler) presize(changed []*desiredFrontend) {
	if len(r.frontends) != 0 || len(changed) < 64 {
		return
	}
	nb := 0
	for _, d := range changed {
		nb += len(d.addrs)
	}
	nf := len(changed)
	if len(r.backends) == 0 && len(r.slotRefs) == 0 && len(r.backendOf) == 0 {
		r.backends = make(map[BackendID]model.L4Addr, nb)
		r.slotRefs = make(map[BackendID]int, nb)
		r.backendOf = make(map[model.L4Addr]BackendID, nb)
	}
	if len(r.revNat) == 0 && len(r.masterRef) == 0 && len(r.serviceOf) == 0 {
		r.revNat = make(map[ServiceID]model.L4Addr, nf)
		r.masterRef = make(map[ServiceID]int, nf)
		r.serviceOf = make(map[model.L4Addr]ServiceID, nf)
	}
	r.frontends = make(map[model.L4Addr]*frontendView, nf)
}

// fastInSync reports whether v (nil if unknown) was fully programmed with exactly svc's
// backends, and nothing touched it since.
func (r *Reconciler) fastInSync(v *frontendView, svc *model.Service) bool {
	if v == nil || !v.synced || len(v.syncedAddrs) != len(svc.Backends) || v.master.Flags != masterFlags(svc) {
		return false
	}
	for i, b := range svc.Backends {
		if b.L4Addr != v.syncedAddrs[i] {
			return false
		}
	}
	return true
}

func (r *Reconciler) markSynced(fe model.L4Addr, d *desiredFrontend) {
	if v := r.frontends[fe]; v != nil {
		v.synced, v.syncedAddrs, v.name = true, d.addrs, d.svc.Name
	}
}

// deleteUnusedRevNat deletes the rev_nat entries of services no master
// names, unless a desired frontend is being programmed under that id.
func (r *Reconciler) deleteUnusedRevNat(services map[model.L4Addr]*model.Service) error {
	var errs []error
	for _, id := range sortedKeys(r.revNatCand) {
		fe, ok := r.revNat[id]
		if !ok || r.masterRef[id] > 0 {
			delete(r.revNatCand, id)
			continue
		}
		if services[fe] != nil && r.serviceOf[fe] == id {
			continue // its master failed to be written; reused next time
		}
		r.writes++
		if err := r.dp.DeleteRevNat(id); err != nil {
			errs = append(errs, fmt.Errorf("delete rev_nat %d (%s): %w", id, fe, err))
			continue
		}
		delete(r.revNat, id)
		delete(r.revNatCand, id)
		if r.serviceOf[fe] == id {
			delete(r.serviceOf, fe)
		}
		r.maybeReleaseService(id, fe)
	}
	return errors.Join(errs...)
}

// inSyncFrontend reports whether fe is programmed exactly as d asks.
func (r *Reconciler) inSyncFrontend(fe model.L4Addr, d *desiredFrontend) bool {
	v := r.frontends[fe]
	if v == nil || !v.hasMaster {
		return false
	}
	sid, ok := r.serviceOf[fe]
	if !ok || v.master.ID != sid || v.master.Count != uint32(len(d.addrs)) || v.master.Flags != masterFlags(d.svc) {
		return false
	}
	if a, ok := r.revNat[sid]; !ok || a != fe || r.masterRef[sid] != 1 {
		return false
	}
	if v.slots.n != len(d.addrs) {
		return false
	}
	for _, a := range d.addrs {
		id, ok := r.backendOf[a]
		if !ok || !r.isReal(id) {
			return false
		}
	}
	// Every slot 1..m must hold a wanted backend, each exactly once.
	seen := make(map[BackendID]bool, len(d.addrs))
	for s := uint32(1); s <= uint32(len(d.addrs)); s++ {
		id, ok := v.slots.get(s)
		a, real := r.backends[id]
		if !ok || seen[id] || !real || !wantsAddr(d, a) || r.backendOf[a] != id {
			return false
		}
		seen[id] = true
	}
	return true
}

func wantsAddr(d *desiredFrontend, a model.L4Addr) bool {
	_, ok := slices.BinarySearchFunc(d.addrs, a, cmpL4)
	return ok
}

// masterFlags returns the SVC_F_* flags of a frontend's master.
func masterFlags(svc *model.Service) uint8 { return MasterFlags(svc) }

// programFrontend brings one frontend to its desired programming, in
// make-before-break order, stopping at the first failed write (the view
// then says how far it got).
func (r *Reconciler) programFrontend(fe model.L4Addr, d *desiredFrontend, capSvc, capBe, capEnt int) error {
	v := r.frontends[fe]
	m := uint32(len(d.addrs))

	// Capacity: what this frontend adds at its peak, before its old slots
	// go. Checked before any write, so a service that does not fit keeps
	// its previous programming.
	sid, haveSID := r.serviceOf[fe]
	needSvc := 0
	if !haveSID {
		needSvc = 1
	} else if _, ok := r.revNat[sid]; !ok {
		needSvc = 1
	}
	needBe := 0
	for _, a := range d.addrs {
		if id, ok := r.backendOf[a]; !ok || !r.isReal(id) {
			needBe++
		}
	}
	needEnt := 0
	for s := uint32(0); s <= m; s++ {
		if v == nil {
			needEnt++
		} else if s == 0 && !v.hasMaster {
			needEnt++
		} else if _, ok := v.slots.get(s); s > 0 && !ok {
			needEnt++
		}
	}
	var short []string
	if len(r.revNat)+needSvc > capSvc {
		short = append(short, fmt.Sprintf("services: %d in use of %d", len(r.revNat), capSvc))
	}
	if nb := len(r.backends); nb+needBe > capBe {
		short = append(short, fmt.Sprintf("%d new backends: %d in use of %d", needBe, nb, capBe))
	}
	if r.entries+needEnt > capEnt {
		short = append(short, fmt.Sprintf("%d new service entries: %d in use of %d", needEnt, r.entries, capEnt))
	}
	if len(short) > 0 {
		return fmt.Errorf("%w (%s); previous programming kept", ErrCapacity, strings.Join(short, "; "))
	}

	if !haveSID {
		sid = ServiceID(r.svcIDs.alloc())
		r.serviceOf[fe] = sid
	}
	if v != nil {
		v.synced = false
	}

	// Backends this frontend names now (within its count), to flush the
	// UDP ones that leave it once it no longer names them.
	var before []model.L4Addr
	if v != nil && v.hasMaster {
		for s := uint32(1); s <= v.master.Count; s++ {
			if id, ok := v.slots.get(s); ok && r.isReal(id) {
				before = append(before, r.backends[id])
			}
		}
	}

	// 1. Backends.
	ids := make([]BackendID, len(d.addrs))
	for i, a := range d.addrs {
		id, ok := r.backendOf[a]
		if !ok {
			id = BackendID(r.beIDs.alloc())
			r.backendOf[a] = id
		}
		ids[i] = id
		if cur, ok := r.backends[id]; ok && cur == a {
			continue
		}
		r.writes++
		if err := r.dp.UpsertBackend(id, a); err != nil {
			return fmt.Errorf("upsert backend %d (%s): %w", id, a, err)
		}
		r.backends[id] = a
		r.backendCand[id] = true // until a slot names it
	}

	// 2. Reverse NAT.
	if cur, ok := r.revNat[sid]; !ok || cur != fe {
		r.writes++
		if err := r.dp.UpsertRevNat(sid, fe); err != nil {
			return fmt.Errorf("upsert rev_nat %d: %w", sid, err)
		}
		r.revNat[sid] = fe
		r.revNatCand[sid] = true // until a master names it
	}

	// 3. Slots 1..m: keep the wanted backends where they are, fill the
	// holes with the others.
	v = r.frontend(fe)
	want := make(map[BackendID]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	kept := make(map[BackendID]bool, len(ids))
	var holes []uint32
	for s := uint32(1); s <= m; s++ {
		id, ok := v.slots.get(s)
		if ok && want[id] && !kept[id] {
			kept[id] = true
			continue
		}
		holes = append(holes, s)
	}
	h := 0
	for _, id := range ids {
		if kept[id] {
			continue
		}
		s := holes[h]
		h++
		r.writes++
		if err := r.dp.UpsertSlot(fe, s, id); err != nil {
			return fmt.Errorf("upsert slot %d: %w", s, err)
		}
		r.setSlot(v, s, id)
	}

	// 4. The master.
	wantM := Master{ID: sid, Count: m, Flags: masterFlags(d.svc)}
	if !v.hasMaster || v.master != wantM {
		r.writes++
		if err := r.dp.UpsertMaster(fe, wantM); err != nil {
			return fmt.Errorf("upsert master: %w", err)
		}
		if v.hasMaster {
			r.masterRef[v.master.ID]--
			r.revNatCand[v.master.ID] = true
			r.maybeReleaseService(v.master.ID, fe)
		} else {
			r.entries++
		}
		v.hasMaster, v.master = true, wantM
		r.masterRef[sid]++
	}
	// From here on no new connection can pick a backend that left: flush
	// the conntrack entries of the UDP ones so their flows re-balance.
	for _, a := range before {
		if a.Proto == model.UDP && !wantsAddr(d, a) {
			r.pendingFlush[a] = true
		}
	}

	// 5. Slots above the new count.
	extra := v.slots.keys(m + 1)
	for i := len(extra) - 1; i >= 0; i-- {
		s := extra[i]
		r.writes++
		if err := r.dp.DeleteSlot(fe, s); err != nil {
			return fmt.Errorf("delete slot %d: %w", s, err)
		}
		r.deleteSlot(v, s)
	}
	return nil
}

// removeFrontend deletes a frontend nobody wants: master first, then its
// slots. Its rev_nat entry goes at the end of Apply.
func (r *Reconciler) removeFrontend(fe model.L4Addr) error {
	v := r.frontends[fe]
	var named []model.L4Addr
	if v.hasMaster {
		for s := uint32(1); s <= v.master.Count; s++ {
			if id, ok := v.slots.get(s); ok && r.isReal(id) {
				named = append(named, r.backends[id])
			}
		}
		r.writes++
		if err := r.dp.DeleteSlot(fe, 0); err != nil {
			return fmt.Errorf("delete master: %w", err)
		}
		v.hasMaster, v.synced = false, false
		r.entries--
		r.masterRef[v.master.ID]--
		r.revNatCand[v.master.ID] = true
		r.maybeReleaseService(v.master.ID, fe)
		for _, a := range named {
			if a.Proto == model.UDP {
				r.pendingFlush[a] = true
			}
		}
	}
	for _, s := range v.slots.keys(1) {
		r.writes++
		if err := r.dp.DeleteSlot(fe, s); err != nil {
			return fmt.Errorf("delete slot %d: %w", s, err)
		}
		r.deleteSlot(v, s)
	}
	delete(r.frontends, fe)
	return nil
}

// releaseReservations drops the ids chosen for frontends and backend
// addresses that neither the maps hold nor the desired state wants.
func (r *Reconciler) releaseReservations(services map[model.L4Addr]*model.Service, want map[model.L4Addr]bool) {
	for fe, id := range r.serviceOf {
		if services[fe] != nil {
			continue
		}
		if _, ok := r.frontends[fe]; ok {
			continue
		}
		if cur, ok := r.revNat[id]; ok && cur == fe {
			continue
		}
		delete(r.serviceOf, fe)
		r.maybeReleaseService(id, fe)
	}
	for a, id := range r.backendOf {
		if _, ok := r.backends[id]; ok || want[a] || r.slotRefs[id] > 0 {
			continue
		}
		delete(r.backendOf, a)
		r.maybeReleaseBackend(id, a)
	}
}

// deleteUnusedBackends deletes the backend entries that lost their last
// slot (or never got one), unless a frontend being programmed wants their
// address under that id.
func (r *Reconciler) deleteUnusedBackends(want map[model.L4Addr]bool) error {
	var errs []error
	for _, id := range sortedKeys(r.backendCand) {
		a, ok := r.backends[id]
		if !ok || r.slotRefs[id] > 0 {
			delete(r.backendCand, id)
			continue
		}
		if want[a] && r.backendOf[a] == id {
			continue
		}
		r.writes++
		if err := r.dp.DeleteBackend(id); err != nil {
			errs = append(errs, fmt.Errorf("delete backend %d (%s): %w", id, a, err))
			continue
		}
		delete(r.backends, id)
		delete(r.backendCand, id)
		if r.backendOf[a] == id {
			delete(r.backendOf, a)
		}
		r.maybeReleaseBackend(id, a)
	}
	return errors.Join(errs...)
}

func (r *Reconciler) setSlot(v *frontendView, s uint32, id BackendID) {
	if old, ok := v.slots.get(s); ok {
		r.unref(old)
	} else {
		r.entries++
	}
	v.slots.put(s, id)
	r.slotRefs[id]++
	delete(r.backendCand, id) // named: not a candidate for deletion
}

func (r *Reconciler) deleteSlot(v *frontendView, s uint32) {
	old, ok := v.slots.get(s)
	if !ok {
		return
	}
	v.slots.del(s)
	r.entries--
	r.unref(old)
}

func (r *Reconciler) unref(id BackendID) {
	if r.slotRefs[id]--; r.slotRefs[id] <= 0 {
		delete(r.slotRefs, id)
		r.backendCand[id] = true
		if _, real := r.backends[id]; !real {
			// A stray slot named an id the backend map does not hold.
			r.beIDs.release(uint32(id))
		}
	}
}

// maybeReleaseService frees a service id once nothing holds or reserves it.
func (r *Reconciler) maybeReleaseService(id ServiceID, fe model.L4Addr) {
	if _, ok := r.revNat[id]; ok || r.masterRef[id] > 0 {
		return
	}
	delete(r.masterRef, id)
	if r.serviceOf[fe] == id {
		return
	}
	r.svcIDs.release(uint32(id))
}

// maybeReleaseBackend frees a backend id once nothing holds or reserves it.
func (r *Reconciler) maybeReleaseBackend(id BackendID, a model.L4Addr) {
	if _, ok := r.backends[id]; ok || r.slotRefs[id] > 0 || r.backendOf[a] == id {
		return
	}
	r.beIDs.release(uint32(id))
}

func cmpL4(a, b model.L4Addr) int {
	if a.Less(b) {
		return -1
	}
	if b.Less(a) {
		return 1
	}
	return 0
}

func sortedKeys[K interface {
	comparable
}, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b K) int { return compareKeys(a, b) })
	return keys
}

func compareKeys[K comparable](a, b K) int {
	switch x := any(a).(type) {
	case model.L4Addr:
		return cmpL4(x, any(b).(model.L4Addr))
	case uint32:
		return cmp.Compare(x, any(b).(uint32))
	case ServiceID:
		return cmp.Compare(x, any(b).(ServiceID))
	case BackendID:
		return cmp.Compare(x, any(b).(BackendID))
	}
	panic(fmt.Sprintf("sortedKeys: unsupported key type %T", a))
}

// slotMap holds a frontend's slots, indexed by slot number: slots are
// dense (1..count), so a slice beats a map per frontend, in memory and in
// the time to fill it.
type slotMap struct {
	ids []slotEntry
	n   int // slots present
}

type slotEntry struct {
	id BackendID
	ok bool
}

func (m *slotMap) get(s uint32) (BackendID, bool) {
	if int64(s) >= int64(len(m.ids)) {
		return 0, false
	}
	e := m.ids[s]
	return e.id, e.ok
}

func (m *slotMap) put(s uint32, id BackendID) {
	if old := len(m.ids); int64(s) >= int64(old) {
		m.ids = slices.Grow(m.ids, int(s)+1-old)[:s+1]
		clear(m.ids[old:])
	}
	if !m.ids[s].ok {
		m.n++
	}
	m.ids[s] = slotEntry{id, true}
}

func (m *slotMap) del(s uint32) {
	if int64(s) < int64(len(m.ids)) && m.ids[s].ok {
		m.ids[s] = slotEntry{}
		m.n--
	}
	for len(m.ids) > 0 && !m.ids[len(m.ids)-1].ok {
		m.ids = m.ids[:len(m.ids)-1]
	}
}

// keys returns the slots >= from that are present, in order.
func (m *slotMap) keys(from uint32) []uint32 {
	var out []uint32
	for s := int(from); s < len(m.ids); s++ {
		if m.ids[s].ok {
			out = append(out, uint32(s))
		}
	}
	return out
}
