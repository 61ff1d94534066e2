// Package fakedp is an in-memory reconciler.Datapath for tests.
//
// It behaves like the pinned BPF maps (each address family has its own
// maps, each of the sizes given to New, as sluice_services and
// sluice6_services are; upserts of new keys fail when the map of their
// family is full; every operation is idempotent) and, after every single
// operation, checks the invariants a concurrent datapath reader relies on:
//
//   - every master's slots 1..count exist (and so name existing backends),
//   - every backend id is below BackendIDSlots (the backends maps are
//     arrays indexed by it),
//   - every slot names an existing backend,
//   - every master's service id has a rev_nat entry,
//   - every master flagged FlagSourceRanges has at least one source range
//     (else its frontend would drop every client),
//   - every master flagged FlagTwoScopes has its frontend's internal scope
//     (a master and its slots): the datapath follows the flag there,
//   - an address is a service IP only while a ClusterIP master (default
//     scope, no FlagExternal) at that address exists: a packet to it that
//     finds no frontend is rejected, which must never happen to a frontend
//     being programmed.
//
// The checks are incremental (each operation checks only what it can
// break), so a fake holding 10,000 services stays fast. Violations are
// recorded, not fatal: tests assert Violations() is empty. Check adds what
// must hold once an Apply succeeded: no source range is left for a
// frontend whose master does not check them, and every ClusterIP master's
// address is a service IP. Errors can be injected per operation with Fail.
//
// A batch (UpsertBackends and the like) is applied entry by entry, each
// checked and failable as a single operation (Op.Batch says it is part
// of a batch), and stops at the first entry that fails, as the kernel's
// BPF_MAP_UPDATE_BATCH does: so the invariants hold after every prefix of
// a batch, which is what a datapath reading concurrently may see.
//
// String prints the maps in the reconciler's dump format (KernelState.String).
package fakedp

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// OpKind names a Datapath operation.
type OpKind string

const (
	OpUpsertBackend     OpKind = "UpsertBackend"
	OpDeleteBackend     OpKind = "DeleteBackend"
	OpUpsertRevNat      OpKind = "UpsertRevNat"
	OpDeleteRevNat      OpKind = "DeleteRevNat"
	OpUpsertSlot        OpKind = "UpsertSlot"
	OpUpsertMaster      OpKind = "UpsertMaster"
	OpDeleteSlot        OpKind = "DeleteSlot"
	OpUpsertSourceRange OpKind = "UpsertSourceRange"
	OpDeleteSourceRange OpKind = "DeleteSourceRange"
	OpUpsertServiceIP   OpKind = "UpsertServiceIP"
	OpDeleteServiceIP   OpKind = "DeleteServiceIP"
	OpFlushConntrack    OpKind = "FlushConntrack"
	OpFixAffinity       OpKind = "FixAffinity"
	OpResetStats        OpKind = "ResetServiceStats"
	OpSetServiceCIDRs   OpKind = "SetServiceCIDRs"
)

// Op is one operation, as passed to Fail and recorded in Ops.
type Op struct {
	Kind     OpKind
	Frontend reconciler.Frontend // slots, masters, UpsertRevNat; source ranges (default scope)
	Slot     uint32              // UpsertSlot, DeleteSlot (0 = master)
	Backend  reconciler.BackendID
	Service  reconciler.ServiceID
	Addr     model.L4Addr   // UpsertBackend
	Addrs    []model.L4Addr // FlushConntrack
	Fixes    []reconciler.AffinityFix
	Master   reconciler.Master
	Prefix   netip.Prefix   // UpsertSourceRange, DeleteSourceRange
	IP       netip.Addr     // UpsertServiceIP, DeleteServiceIP
	Prefixes []netip.Prefix // SetServiceCIDRs
	// Batch says the operation is an entry of a batch (UpsertBackends
	// and the like): the fake applies a batch's entries one by one,
	// checking after each, and stops at the first that fails, as the
	// kernel does.
	Batch bool
}

func (o Op) String() string {
	switch o.Kind {
	case OpUpsertBackend:
		return fmt.Sprintf("%s %d %s", o.Kind, o.Backend, o.Addr)
	case OpDeleteBackend:
		return fmt.Sprintf("%s %d", o.Kind, o.Backend)
	case OpUpsertRevNat:
		return fmt.Sprintf("%s %d %s", o.Kind, o.Service, o.Frontend)
	case OpDeleteRevNat, OpResetStats:
		return fmt.Sprintf("%s %d", o.Kind, o.Service)
	case OpUpsertSlot:
		return fmt.Sprintf("%s %s[%d]=%d", o.Kind, o.Frontend, o.Slot, o.Backend)
	case OpUpsertMaster:
		if o.Master.AffinityTimeout != 0 {
			return fmt.Sprintf("%s %s id=%d count=%d flags=%#x affinity=%ds", o.Kind, o.Frontend, o.Master.ID, o.Master.Count, o.Master.Flags, o.Master.AffinityTimeout)
		}
		return fmt.Sprintf("%s %s id=%d count=%d flags=%#x", o.Kind, o.Frontend, o.Master.ID, o.Master.Count, o.Master.Flags)
	case OpDeleteSlot:
		return fmt.Sprintf("%s %s[%d]", o.Kind, o.Frontend, o.Slot)
	case OpUpsertSourceRange, OpDeleteSourceRange:
		return fmt.Sprintf("%s %s %s", o.Kind, o.Frontend, o.Prefix)
	case OpUpsertServiceIP, OpDeleteServiceIP:
		return fmt.Sprintf("%s %s", o.Kind, o.IP)
	case OpFlushConntrack:
		return fmt.Sprintf("%s %v", o.Kind, o.Addrs)
	case OpSetServiceCIDRs:
		return fmt.Sprintf("%s %v", o.Kind, o.Prefixes)
	case OpFixAffinity:
		return fmt.Sprintf("%s %v", o.Kind, o.Fixes)
	}
	return string(o.Kind)
}

// ErrFull is returned when an upsert would add a key to a full map (the
// kernel returns E2BIG).
var ErrFull = errors.New("map full")

// Fake is an in-memory Datapath. The zero value is not usable; call New.
type Fake struct {
	mu sync.Mutex

	masters  map[reconciler.Frontend]reconciler.Master
	slots    map[reconciler.Frontend]map[uint32]reconciler.BackendID
	backends map[reconciler.BackendID]model.L4Addr
	revNat   map[reconciler.ServiceID]reconciler.Frontend
	ranges   map[model.L4Addr]map[netip.Prefix]bool
	ips      map[netip.Addr]bool
	cips     map[netip.Addr]int // ClusterIP masters per address
	cidrs    map[netip.Prefix]bool
	// Entries per address family (fam): each family has its maps, of
	// the same sizes.
	nbackends, nrevNat, nmasters, nslots, nranges, nips [2]int

	slotRefs   map[reconciler.BackendID]int // slots naming a backend
	masterRefs map[reconciler.ServiceID]int // masters naming a service id

	maxServices, maxBackends, maxEntries, maxRanges int

	// Fail, if set, is called before every operation; a non-nil error is
	// returned and the operation is not applied.
	Fail func(Op) error

	// CheckAll, if true, also runs the full Check after every successful
	// operation (slow for big states; the incremental checks always run).
	CheckAll bool

	// Record, if true, appends every successful operation to Ops.
	Record bool
	Ops    []Op

	counts  map[OpKind]int
	batches int
	walks   int // calls of Walk
	flushed []model.L4Addr
	// udpFlows: the UDP flows the datapath's conntrack would hold, per
	// frontend (SetUDPFlows): the backends they use.
	udpFlows   map[model.L4Addr][]reconciler.UDPFlowBackend
	udpErr     error
	fixed      []reconciler.AffinityFix
	violations []string
}

// DefaultSourceRanges is the fake's source-range capacity unless
// SetSourceRangeCapacity changes it (the size of sluice_src_ranges).
const DefaultSourceRanges = 16384

// New returns an empty fake with the given capacities (services = rev_nat
// entries, backends, service map entries = masters plus slots), and room
// for DefaultSourceRanges source ranges: those of each family's maps.
func New(services, backends, serviceEntries int) *Fake {
	return &Fake{
		masters:     map[reconciler.Frontend]reconciler.Master{},
		slots:       map[reconciler.Frontend]map[uint32]reconciler.BackendID{},
		backends:    map[reconciler.BackendID]model.L4Addr{},
		revNat:      map[reconciler.ServiceID]reconciler.Frontend{},
		ranges:      map[model.L4Addr]map[netip.Prefix]bool{},
		ips:         map[netip.Addr]bool{},
		cips:        map[netip.Addr]int{},
		cidrs:       map[netip.Prefix]bool{},
		slotRefs:    map[reconciler.BackendID]int{},
		masterRefs:  map[reconciler.ServiceID]int{},
		maxServices: services, maxBackends: backends, maxEntries: serviceEntries,
		maxRanges: DefaultSourceRanges,
		counts:    map[OpKind]int{},
	}
}

// SetSourceRangeCapacity sets how many source ranges fit in each
// family's map, of all its frontends together.
func (f *Fake) SetSourceRangeCapacity(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.maxRanges = n
}

var _ reconciler.Datapath = (*Fake)(nil)

var _ reconciler.UDPFlowReader = (*Fake)(nil)

// SetUDPFlows makes the UDP flows the fake's conntrack holds flows: per
// frontend, the backends they use, each under the id its backend entry
// has now (0 if none), as a conntrack entry made now would name it
// (UDPFlowBackends reports them, and FlushConntrack ends those of the
// backends it flushes).
func (f *Fake) SetUDPFlows(flows map[model.L4Addr][]model.L4Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make(map[model.L4Addr]reconciler.BackendID, len(f.backends))
	for id, a := range f.backends {
		ids[a] = id
	}
	f.udpFlows = map[model.L4Addr][]reconciler.UDPFlowBackend{}
	for fe, bs := range flows {
		for _, a := range bs {
			f.udpFlows[fe] = append(f.udpFlows[fe], reconciler.UDPFlowBackend{Addr: a, ID: ids[a]})
		}
	}
}

// SetUDPFlowsErr makes UDPFlowBackends return err with the flows (a read
// that failed part way, the flows read so far); nil, none.
func (f *Fake) SetUDPFlowsErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.udpErr = err
}

// UDPFlowBackends returns the flows SetUDPFlows set that no flush ended,
// with the error SetUDPFlowsErr set.
func (f *Fake) UDPFlowBackends() (map[model.L4Addr][]reconciler.UDPFlowBackend, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[model.L4Addr][]reconciler.UDPFlowBackend, len(f.udpFlows))
	for fe, bs := range f.udpFlows {
		out[fe] = slices.Clone(bs)
	}
	return out, f.udpErr
}

// write makes one map operation, with f.mu held: Fail may refuse it
// first; apply changes the maps (noting violations), and an operation it
// fails (a full map, a bad argument) is neither checked, counted nor
// recorded, as a write the kernel refused.
func (f *Fake) write(op Op, apply func() error) error {
	if f.Fail != nil {
		if err := f.Fail(op); err != nil {
			return err
		}
	}
	if err := apply(); err != nil {
		return err
	}
	if f.CheckAll {
		for _, v := range f.check() {
			f.violate(op, "%s", v)
		}
	}
	f.counts[op.Kind]++
	if f.Record {
		f.Ops = append(f.Ops, op)
	}
	return nil
}

// locked runs fn with f.mu held.
func (f *Fake) locked(fn func() error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fn()
}

func (f *Fake) violate(op Op, format string, a ...any) {
	f.violations = append(f.violations, fmt.Sprintf("after %s: %s", op, fmt.Sprintf(format, a...)))
}

func (f *Fake) UpsertBackend(id reconciler.BackendID, b model.L4Addr) error {
	return f.locked(func() error { return f.upsertBackend(id, b, false) })
}

func (f *Fake) upsertBackend(id reconciler.BackendID, b model.L4Addr, batch bool) error {
	op := Op{Batch: batch, Kind: OpUpsertBackend, Backend: id, Addr: b}
	return f.write(op, func() error {
		if err := f.arrayIndex(op, "backend", uint32(id), "backends", reconciler.BackendIDSlots(f.maxBackends)); err != nil {
			return err
		}
		return putCounted(f.backends, &f.nbackends, f.maxBackends, "backends", id, b, addrOfBackend)
	})
}

// arrayIndex checks the id of an entry op writes to the maps named,
// arrays indexed by the id of slots entries (backends: BackendIDSlots;
// rev_nat: ServiceIDSlots): 0 is a violation, and an id beyond cannot be
// written.
func (f *Fake) arrayIndex(op Op, what string, id uint32, maps string, slots int) error {
	if id == 0 {
		f.violate(op, "%s id 0", what)
	}
	if int64(id) >= int64(slots) {
		f.violate(op, "%s id %d beyond the %d entries of the %s arrays", what, id, slots, maps)
		return fmt.Errorf("%s id %d: beyond the %d entries of the %s array", what, id, slots, maps)
	}
	return nil
}

func (f *Fake) DeleteBackend(id reconciler.BackendID) error {
	return f.locked(func() error { return f.deleteBackend(id, false) })
}

func (f *Fake) deleteBackend(id reconciler.BackendID, batch bool) error {
	op := Op{Batch: batch, Kind: OpDeleteBackend, Backend: id}
	return f.write(op, func() error {
		deleteCounted(f.backends, &f.nbackends, id, addrOfBackend)
		if f.slotRefs[id] > 0 {
			f.violate(op, "backend %d deleted while %d slots name it", id, f.slotRefs[id])
		}
		return nil
	})
}

func (f *Fake) UpsertRevNat(id reconciler.ServiceID, fe reconciler.Frontend) error {
	return f.locked(func() error { return f.upsertRevNat(id, fe, false) })
}

func (f *Fake) upsertRevNat(id reconciler.ServiceID, fe reconciler.Frontend, batch bool) error {
	op := Op{Batch: batch, Kind: OpUpsertRevNat, Service: id, Frontend: fe}
	return f.write(op, func() error {
		if err := f.arrayIndex(op, "service", uint32(id), "rev_nat", reconciler.ServiceIDSlots(f.maxServices)); err != nil {
			return err
		}
		return putCounted(f.revNat, &f.nrevNat, f.maxServices, "rev_nat", id, fe, addrOfFrontend)
	})
}

func (f *Fake) DeleteRevNat(id reconciler.ServiceID) error {
	return f.locked(func() error { return f.deleteRevNat(id, false) })
}

func (f *Fake) deleteRevNat(id reconciler.ServiceID, batch bool) error {
	op := Op{Batch: batch, Kind: OpDeleteRevNat, Service: id}
	return f.write(op, func() error {
		deleteCounted(f.revNat, &f.nrevNat, id, addrOfFrontend)
		if f.masterRefs[id] > 0 {
			f.violate(op, "rev_nat %d deleted while a master names it", id)
		}
		return nil
	})
}

// entries returns the service map entries (masters plus slots) of the
// family of a.
func (f *Fake) entries(a netip.Addr) int { return f.nmasters[fam(a)] + f.nslots[fam(a)] }

// fam indexes the per-family counts: 0 for IPv4, 1 for IPv6.
func fam(a netip.Addr) int {
	if a.Is6() && !a.Is4In6() {
		return 1
	}
	return 0
}

// putCounted writes m[id] = v, keeping n, the entries of m per family
// of their address (addr), up to date: an id that is new to the map of
// v's family (absent, or present in the other family's) needs room there
// below capacity, else ErrFull names the map of kind, and m is unchanged.
func putCounted[K comparable, V any](m map[K]V, n *[2]int, capacity int, kind string, id K, v V, addr func(V) netip.Addr) error {
	old, ok := m[id]
	if (!ok || fam(addr(old)) != fam(addr(v))) && n[fam(addr(v))] >= capacity {
		return fmt.Errorf("%s: %w", mapName(addr(v), kind), ErrFull)
	}
	if ok {
		n[fam(addr(old))]--
	}
	m[id] = v
	n[fam(addr(v))]++
	return nil
}

// deleteCounted deletes m[id] (if there) and counts it out of n, as
// putCounted keeps it.
func deleteCounted[K comparable, V any](m map[K]V, n *[2]int, id K, addr func(V) netip.Addr) {
	if old, ok := m[id]; ok {
		delete(m, id)
		n[fam(addr(old))]--
	}
}

func addrOfBackend(b model.L4Addr) netip.Addr { return b.Addr }

func addrOfFrontend(fe reconciler.Frontend) netip.Addr { return fe.Addr }

// mapName names the map of a's family of a kind, as pkg/datapath's
// errors do.
func mapName(a netip.Addr, kind string) string {
	if fam(a) == 1 {
		return "sluice6_" + kind
	}
	return "sluice_" + kind
}

func (f *Fake) UpsertSlot(fe reconciler.Frontend, slot uint32, id reconciler.BackendID) error {
	return f.locked(func() error { return f.upsertSlot(fe, slot, id, false) })
}

func (f *Fake) upsertSlot(fe reconciler.Frontend, slot uint32, id reconciler.BackendID, batch bool) error {
	op := Op{Batch: batch, Kind: OpUpsertSlot, Frontend: fe, Slot: slot, Backend: id}
	return f.write(op, func() error {
		if slot == 0 {
			return errors.New("UpsertSlot: slot 0 is the master")
		}
		s := f.slots[fe]
		old, exists := s[slot]
		if !exists && f.entries(fe.Addr) >= f.maxEntries {
			return fmt.Errorf("%s: %w", mapName(fe.Addr, "services"), ErrFull)
		}
		if s == nil {
			s = map[uint32]reconciler.BackendID{}
			f.slots[fe] = s
		}
		if exists {
			f.unref(old)
		} else {
			f.nslots[fam(fe.Addr)]++
		}
		s[slot] = id
		f.slotRefs[id]++
		if b, ok := f.backends[id]; !ok {
			f.violate(op, "slot names backend %d, which does not exist", id)
		} else if b.Addr.Is6() != fe.Addr.Is6() {
			f.violate(op, "slot names backend %d (%s), of the other address family", id, b)
		}
		return nil
	})
}

func (f *Fake) unref(id reconciler.BackendID) {
	if f.slotRefs[id]--; f.slotRefs[id] <= 0 {
		delete(f.slotRefs, id)
	}
}

func (f *Fake) UpsertMaster(fe reconciler.Frontend, m reconciler.Master) error {
	return f.locked(func() error { return f.upsertMaster(fe, m, false) })
}

func (f *Fake) upsertMaster(fe reconciler.Frontend, m reconciler.Master, batch bool) error {
	op := Op{Batch: batch, Kind: OpUpsertMaster, Frontend: fe, Master: m}
	return f.write(op, func() error {
		old, exists := f.masters[fe]
		if !exists && f.entries(fe.Addr) >= f.maxEntries {
			return fmt.Errorf("%s: %w", mapName(fe.Addr, "services"), ErrFull)
		}
		if exists {
			if f.masterRefs[old.ID]--; f.masterRefs[old.ID] <= 0 {
				delete(f.masterRefs, old.ID)
			}
			f.countClusterIP(fe, old, -1)
		} else {
			f.nmasters[fam(fe.Addr)]++
		}
		f.masters[fe] = m
		f.countClusterIP(fe, m, 1)
		f.masterRefs[m.ID]++
		if m.ID == 0 {
			f.violate(op, "service id 0")
		}
		if rn, ok := f.revNat[m.ID]; !ok {
			f.violate(op, "master names service %d, which has no rev_nat entry", m.ID)
		} else if rn.Addr.Is6() != fe.Addr.Is6() {
			f.violate(op, "master names service %d, whose rev_nat entry (%s) is of the other address family", m.ID, rn)
		}
		for s := uint32(1); s <= m.Count; s++ {
			if _, ok := f.slots[fe][s]; !ok {
				f.violate(op, "master count %d but slot %d does not exist", m.Count, s)
				break
			}
		}
		if m.Flags&reconciler.FlagSourceRanges != 0 && len(f.ranges[fe.L4Addr]) == 0 {
			f.violate(op, "master checks source ranges but its frontend has none")
		}
		if m.Flags&reconciler.FlagTwoScopes != 0 && !f.hasInternal(fe.L4Addr) {
			f.violate(op, "master says two scopes but the internal scope has no master")
		}
		if w := retiredWrong(fe, m); w != "" {
			f.violate(op, "%s", w)
		}
		if exists && clusterIP(fe, old) && !clusterIP(fe, m) && f.ips[fe.Addr] && f.clusterIPMasters(fe.Addr) == 0 {
			f.violate(op, "the last ClusterIP master at %s stopped being one while it is a service IP", fe.Addr)
		}
		return nil
	})
}

// clusterIP reports whether m, the master of fe, is a ClusterIP's (a
// retired master is no frontend's).
func clusterIP(fe reconciler.Frontend, m reconciler.Master) bool {
	return fe.Scope == reconciler.ScopeDefault && m.Flags&(reconciler.FlagExternal|reconciler.FlagRetired) == 0
}

// retiredWrong says what is wrong with m, fe's master, if it is a
// retired one the datapath could take for more than that: a retired
// master has no backends and no flag but FlagExternal besides, and is a
// default scope's (the only one the datapath follows flows under).
func retiredWrong(fe reconciler.Frontend, m reconciler.Master) string {
	if m.Flags&reconciler.FlagRetired == 0 {
		return ""
	}
	switch {
	case m.Count != 0:
		return fmt.Sprintf("retired master with count %d", m.Count)
	case m.Flags&^(reconciler.FlagRetired|reconciler.FlagExternal) != 0:
		return fmt.Sprintf("retired master with flags %#x", m.Flags)
	case fe.Scope != reconciler.ScopeDefault:
		return "retired master of an internal scope"
	}
	return ""
}

// clusterIPMasters counts the ClusterIP masters at a.
func (f *Fake) clusterIPMasters(a netip.Addr) int { return f.cips[a] }

// countClusterIP adds d to the ClusterIP masters at fe's address if m is
// one.
func (f *Fake) countClusterIP(fe reconciler.Frontend, m reconciler.Master, d int) {
	if !clusterIP(fe, m) {
		return
	}
	if f.cips[fe.Addr] += d; f.cips[fe.Addr] <= 0 {
		delete(f.cips, fe.Addr)
	}
}

// hasInternal reports whether a's internal scope has a master whose slots
// exist.
func (f *Fake) hasInternal(a model.L4Addr) bool {
	in := reconciler.Frontend{L4Addr: a, Scope: reconciler.ScopeInternal}
	m, ok := f.masters[in]
	if !ok {
		return false
	}
	for s := uint32(1); s <= m.Count; s++ {
		if _, ok := f.slots[in][s]; !ok {
			return false
		}
	}
	return true
}

func (f *Fake) DeleteSlot(fe reconciler.Frontend, slot uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := Op{Kind: OpDeleteSlot, Frontend: fe, Slot: slot}
	return f.write(op, func() error {
		if slot == 0 {
			if m, ok := f.masters[fe]; ok {
				delete(f.masters, fe)
				f.nmasters[fam(fe.Addr)]--
				if f.masterRefs[m.ID]--; f.masterRefs[m.ID] <= 0 {
					delete(f.masterRefs, m.ID)
				}
				f.countClusterIP(fe, m, -1)
				if clusterIP(fe, m) && f.ips[fe.Addr] && f.clusterIPMasters(fe.Addr) == 0 {
					f.violate(op, "the last ClusterIP master at %s deleted while it is a service IP", fe.Addr)
				}
				if dm, ok := f.masters[reconciler.DefaultScope(fe.L4Addr)]; fe.Scope == reconciler.ScopeInternal && ok && dm.Flags&reconciler.FlagTwoScopes != 0 {
					f.violate(op, "internal scope deleted while the default scope's master says two scopes")
				}
			}
		} else if id, ok := f.slots[fe][slot]; ok {
			delete(f.slots[fe], slot)
			if len(f.slots[fe]) == 0 {
				delete(f.slots, fe)
			}
			f.nslots[fam(fe.Addr)]--
			f.unref(id)
			if m, ok := f.masters[fe]; ok && m.Count >= slot {
				f.violate(op, "slot %d deleted while the master counts %d", slot, m.Count)
			}
		}
		return nil
	})
}

func (f *Fake) UpsertSourceRange(fe model.L4Addr, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := Op{Kind: OpUpsertSourceRange, Frontend: reconciler.DefaultScope(fe), Prefix: p}
	return f.write(op, func() error {
		if p != p.Masked() {
			f.violate(op, "prefix has host bits set")
		}
		rs := f.ranges[fe]
		if !rs[p] && f.nranges[fam(fe.Addr)] >= f.maxRanges {
			return fmt.Errorf("%s: %w", mapName(fe.Addr, "src_ranges"), ErrFull)
		}
		if rs == nil {
			rs = map[netip.Prefix]bool{}
			f.ranges[fe] = rs
		}
		if !rs[p] {
			rs[p] = true
			f.nranges[fam(fe.Addr)]++
		}
		return nil
	})
}

func (f *Fake) DeleteSourceRange(fe model.L4Addr, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := Op{Kind: OpDeleteSourceRange, Frontend: reconciler.DefaultScope(fe), Prefix: p}
	return f.write(op, func() error {
		if f.ranges[fe][p] {
			delete(f.ranges[fe], p)
			f.nranges[fam(fe.Addr)]--
			if len(f.ranges[fe]) == 0 {
				delete(f.ranges, fe)
				if m, ok := f.masters[reconciler.DefaultScope(fe)]; ok && m.Flags&reconciler.FlagSourceRanges != 0 {
					f.violate(op, "last source range deleted while the master checks them")
				}
			}
		}
		return nil
	})
}

// UpsertServiceIP adds a service IP; the set is as large as rev_nat (each
// ClusterIP has a frontend).
func (f *Fake) UpsertServiceIP(a netip.Addr) error {
	return f.locked(func() error { return f.upsertServiceIP(a, false) })
}

func (f *Fake) upsertServiceIP(a netip.Addr, batch bool) error {
	op := Op{Batch: batch, Kind: OpUpsertServiceIP, IP: a}
	return f.write(op, func() error {
		if !f.ips[a] && f.nips[fam(a)] >= f.maxServices {
			return fmt.Errorf("%s: %w", mapName(a, "service_ips"), ErrFull)
		}
		if !f.ips[a] {
			f.ips[a] = true
			f.nips[fam(a)]++
		}
		if f.clusterIPMasters(a) == 0 {
			f.violate(op, "service IP %s added while no ClusterIP master is at it", a)
		}
		return nil
	})
}

// DeleteServiceIP removes a service IP.
func (f *Fake) DeleteServiceIP(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := Op{Kind: OpDeleteServiceIP, IP: a}
	return f.write(op, func() error {
		if f.ips[a] {
			delete(f.ips, a)
			f.nips[fam(a)]--
		}
		return nil
	})
}

// SetServiceCIDRs makes the service CIDRs cidrs, refusing, as the real
// maps do, a prefix that is not valid and masked; nothing is written then.
// The set has no invariant to check against the frontends: the datapath
// drops for it only what matched no frontend and no service IP.
func (f *Fake) SetServiceCIDRs(cidrs []netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := Op{Kind: OpSetServiceCIDRs, Prefixes: slices.Clone(cidrs)}
	return f.write(op, func() error {
		for _, p := range cidrs {
			if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() {
				return fmt.Errorf("service CIDR %s: not a masked IPv4 or IPv6 prefix", p)
			}
		}
		clear(f.cidrs)
		for _, p := range cidrs {
			f.cidrs[p] = true
		}
		return nil
	})
}

func (f *Fake) FlushConntrack(bs []model.L4Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := Op{Kind: OpFlushConntrack, Addrs: slices.Clone(bs)}
	return f.write(op, func() error {
		f.flushed = append(f.flushed, bs...)
		for fe, fl := range f.udpFlows {
			fl = slices.DeleteFunc(fl, func(b reconciler.UDPFlowBackend) bool { return slices.Contains(bs, b.Addr) })
			if len(fl) == 0 {
				delete(f.udpFlows, fe)
			} else {
				f.udpFlows[fe] = fl
			}
		}
		return nil
	})
}

// FixAffinity records fixes. A move must name a slot that holds its
// backend when it is made (the reconciler moves session affinity to a
// backend's new slot once it is written, before the master's count can
// end the old one), and a fix for every backend of a frontend can only
// delete.
func (f *Fake) FixAffinity(fixes []reconciler.AffinityFix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := Op{Kind: OpFixAffinity, Fixes: slices.Clone(fixes)}
	return f.write(op, func() error {
		for _, x := range fixes {
			switch {
			case x.Backend == 0 && x.Slot != 0:
				f.violate(op, "%s: moves every backend to slot %d", x.Frontend, x.Slot)
			case x.Slot != 0 && f.slots[x.Frontend][x.Slot] != x.Backend:
				f.violate(op, "%s: moves backend %d to slot %d, which names %d", x.Frontend, x.Backend, x.Slot, f.slots[x.Frontend][x.Slot])
			}
		}
		f.fixed = append(f.fixed, fixes...)
		return nil
	})
}

// ResetServiceStats zeroes the per-Service counters of id. The fake keeps
// no counters; it checks that the id is free: zeroing the counters of an
// id a rev_nat entry or a master still names would lose a live
// frontend's counts. An id only retired masters name (their frontend's
// Service gone) is free in that sense: a frontend re-added over one
// starts its counters from zero.
func (f *Fake) ResetServiceStats(id reconciler.ServiceID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := Op{Kind: OpResetStats, Service: id}
	return f.write(op, func() error {
		if id == 0 {
			f.violate(op, "service id 0")
		}
		if f.onlyRetired(id) {
			return nil
		}
		if fe, ok := f.revNat[id]; ok {
			f.violate(op, "service id %d is in use: rev_nat names %s", id, fe)
		}
		if f.masterRefs[id] > 0 {
			f.violate(op, "service id %d is in use by %d masters", id, f.masterRefs[id])
		}
		return nil
	})
}

// onlyRetired says whether masters name id and every one is retired.
func (f *Fake) onlyRetired(id reconciler.ServiceID) bool {
	n := 0
	for _, m := range f.masters {
		if m.ID == id {
			if m.Flags&reconciler.FlagRetired == 0 {
				return false
			}
			n++
		}
	}
	return n > 0
}

// Dump returns a copy of the maps.
func (f *Fake) Dump() (*reconciler.KernelState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snapshot(), nil
}

// Walk gives v the entries Dump returns, one at a time, without copying
// the maps. v must not call the fake (it is locked).
func (f *Fake) Walk(v reconciler.KernelVisitor) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.walks++
	for fe, m := range f.masters {
		if !v.Master(fe, m) {
			return nil
		}
	}
	for fe, s := range f.slots {
		for slot, id := range s {
			if !v.Slot(fe, slot, id) {
				return nil
			}
		}
	}
	for id, b := range f.backends {
		if !v.Backend(id, b) {
			return nil
		}
	}
	for id, fe := range f.revNat {
		if !v.RevNat(id, fe) {
			return nil
		}
	}
	for fe, rs := range f.ranges {
		for p := range rs {
			if !v.SourceRange(fe, p) {
				return nil
			}
		}
	}
	for a := range f.ips {
		if !v.ServiceIP(a) {
			return nil
		}
	}
	return nil
}

// Walks counts the calls of Walk.
func (f *Fake) Walks() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.walks
}

func (f *Fake) snapshot() *reconciler.KernelState {
	ks := &reconciler.KernelState{
		Masters:      maps.Clone(f.masters),
		Slots:        map[reconciler.Frontend]map[uint32]reconciler.BackendID{},
		Backends:     maps.Clone(f.backends),
		RevNat:       maps.Clone(f.revNat),
		SourceRanges: map[model.L4Addr][]netip.Prefix{},
		ServiceIPs:   slices.SortedFunc(maps.Keys(f.ips), netip.Addr.Compare),
		ServiceCIDRs: slices.SortedFunc(maps.Keys(f.cidrs), netip.Prefix.Compare),
	}
	for fe, s := range f.slots {
		ks.Slots[fe] = maps.Clone(s)
	}
	for fe, rs := range f.ranges {
		ks.SourceRanges[fe] = slices.SortedFunc(maps.Keys(rs), netip.Prefix.Compare)
	}
	return ks
}

// Capacity returns the capacities given to New: of each family's maps.
func (f *Fake) Capacity() (services, backends, serviceEntries int) {
	return f.maxServices, f.maxBackends, f.maxEntries
}

// SourceRangeCapacity returns DefaultSourceRanges or what
// SetSourceRangeCapacity set.
func (f *Fake) SourceRangeCapacity() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxRanges
}

// Seed replaces the maps' contents, without checks or counting: a kernel
// state left by an earlier agent, strays and all.
func (f *Fake) Seed(ks *reconciler.KernelState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.masters = maps.Clone(ks.Masters)
	f.backends = maps.Clone(ks.Backends)
	f.revNat = maps.Clone(ks.RevNat)
	f.slots = map[reconciler.Frontend]map[uint32]reconciler.BackendID{}
	f.slotRefs = map[reconciler.BackendID]int{}
	f.ips = map[netip.Addr]bool{}
	f.cidrs = map[netip.Prefix]bool{}
	for _, p := range ks.ServiceCIDRs {
		f.cidrs[p] = true
	}
	f.nbackends, f.nrevNat, f.nmasters, f.nslots, f.nranges, f.nips = [2]int{}, [2]int{}, [2]int{}, [2]int{}, [2]int{}, [2]int{}
	for _, a := range ks.ServiceIPs {
		if !f.ips[a] {
			f.ips[a] = true
			f.nips[fam(a)]++
		}
	}
	for _, b := range f.backends {
		f.nbackends[fam(b.Addr)]++
	}
	for _, fe := range f.revNat {
		f.nrevNat[fam(fe.Addr)]++
	}
	f.masterRefs = map[reconciler.ServiceID]int{}
	f.ranges = map[model.L4Addr]map[netip.Prefix]bool{}
	for fe, ps := range ks.SourceRanges {
		for _, p := range ps {
			if f.ranges[fe] == nil {
				f.ranges[fe] = map[netip.Prefix]bool{}
			}
			if !f.ranges[fe][p] {
				f.ranges[fe][p] = true
				f.nranges[fam(fe.Addr)]++
			}
		}
	}
	for fe, s := range ks.Slots {
		c := map[uint32]reconciler.BackendID{}
		for n, id := range s {
			if n == 0 {
				continue
			}
			c[n] = id
			f.slotRefs[id]++
			f.nslots[fam(fe.Addr)]++
		}
		f.slots[fe] = c
	}
	f.cips = map[netip.Addr]int{}
	for fe, m := range f.masters {
		f.masterRefs[m.ID]++
		f.nmasters[fam(fe.Addr)]++
		f.countClusterIP(fe, m, 1)
	}
	if f.masters == nil {
		f.masters = map[reconciler.Frontend]reconciler.Master{}
	}
	if f.backends == nil {
		f.backends = map[reconciler.BackendID]model.L4Addr{}
	}
	if f.revNat == nil {
		f.revNat = map[reconciler.ServiceID]reconciler.Frontend{}
	}
}

// Violations returns the invariant violations seen so far.
func (f *Fake) Violations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.violations)
}

// Check verifies the invariants over the whole state (not only what the
// last operation touched) and returns the violations found. It also checks
// what holds only between Applies, once one succeeded: no frontend has
// source ranges unless its master checks them, no internal scope exists
// without a default scope that says two scopes, and the service IPs are
// exactly the ClusterIP masters' addresses. (During an Apply ranges and
// internal scopes are written before the master that names them, and
// deleted after; a ClusterIP's address joins the service IPs after its
// master.)
func (f *Fake) Check() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.check()
	for fe, rs := range f.ranges {
		if m, ok := f.masters[reconciler.DefaultScope(fe)]; !ok || m.Flags&reconciler.FlagSourceRanges == 0 {
			for _, p := range slices.SortedFunc(maps.Keys(rs), netip.Prefix.Compare) {
				v = append(v, fmt.Sprintf("%s: source range %s, but no master checks it", fe, p))
			}
		}
	}
	for fe := range f.masters {
		if fe.Scope != reconciler.ScopeInternal {
			continue
		}
		if m, ok := f.masters[reconciler.DefaultScope(fe.L4Addr)]; !ok || m.Flags&reconciler.FlagTwoScopes == 0 {
			v = append(v, fmt.Sprintf("%s: internal scope, but no master says two scopes", fe))
		}
	}
	cips := map[netip.Addr]bool{}
	for fe, m := range f.masters {
		if clusterIP(fe, m) {
			cips[fe.Addr] = true
			if !f.ips[fe.Addr] {
				v = append(v, fmt.Sprintf("%s: ClusterIP master, but its address is not a service IP", fe))
			}
		}
	}
	for a := range f.ips {
		if !cips[a] {
			v = append(v, fmt.Sprintf("service IP %s, but no ClusterIP master is at it", a))
		}
	}
	slices.Sort(v)
	return v
}

func (f *Fake) check() []string {
	var v []string
	for fe, m := range f.masters {
		for s := uint32(1); s <= m.Count; s++ {
			if _, ok := f.slots[fe][s]; !ok {
				v = append(v, fmt.Sprintf("%s: master count %d, slot %d missing", fe, m.Count, s))
			}
		}
		if _, ok := f.revNat[m.ID]; !ok {
			v = append(v, fmt.Sprintf("%s: master names service %d without rev_nat", fe, m.ID))
		}
		if m.Flags&reconciler.FlagSourceRanges != 0 && len(f.ranges[fe.L4Addr]) == 0 {
			v = append(v, fmt.Sprintf("%s: master checks source ranges, none exist", fe))
		}
		if m.Flags&reconciler.FlagTwoScopes != 0 && !f.hasInternal(fe.L4Addr) {
			v = append(v, fmt.Sprintf("%s: master says two scopes, the internal scope is incomplete", fe))
		}
		if w := retiredWrong(fe, m); w != "" {
			v = append(v, fmt.Sprintf("%s: %s", fe, w))
		}
	}
	for fe, s := range f.slots {
		for n, id := range s {
			if _, ok := f.backends[id]; !ok {
				v = append(v, fmt.Sprintf("%s[%d]: names missing backend %d", fe, n, id))
			}
		}
	}
	slices.Sort(v)
	return v
}

// Count returns how many operations of kind succeeded.
func (f *Fake) Count(kind OpKind) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[kind]
}

// Writes returns how many map-changing operations succeeded (conntrack
// flushes, session affinity fixes and counter resets excluded).
func (f *Fake) Writes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for k, c := range f.counts {
		if k != OpFlushConntrack && k != OpFixAffinity && k != OpResetStats {
			n += c
		}
	}
	return n
}

// ResetCounts zeroes the operation counts and the recorded Ops, flushes
// and affinity fixes.
func (f *Fake) ResetCounts() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts = map[OpKind]int{}
	f.batches = 0
	f.Ops = nil
	f.flushed = nil
	f.fixed = nil
}

// AffinityFixes returns the session affinity fixes made, in order.
func (f *Fake) AffinityFixes() []reconciler.AffinityFix {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.fixed)
}

// Flushed returns the backends whose conntrack entries were flushed.
func (f *Fake) Flushed() []model.L4Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flushed)
}

// Sizes returns the number of rev_nat entries, backends and service map
// entries (masters plus slots).
func (f *Fake) Sizes() (services, backends, serviceEntries int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.revNat), len(f.backends), len(f.masters) + f.nslots[0] + f.nslots[1]
}

// String dumps the maps as the golden files hold them (see
// reconciler.KernelState.String).
func (f *Fake) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snapshot().String()
}

// eachInBatch applies n entries of one batch with apply, in order, and
// stops at the first that fails, as the kernel's BPF_MAP_*_BATCH do: it
// returns how many were applied. Every entry is checked (and can be
// failed by Fail) as a single operation is.
func (f *Fake) eachInBatch(n int, apply func(i int) error) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches++
	for i := range n {
		if err := apply(i); err != nil {
			return i, err
		}
	}
	return n, nil
}

func (f *Fake) UpsertBackends(es []reconciler.BackendEntry) (int, error) {
	return f.eachInBatch(len(es), func(i int) error { return f.upsertBackend(es[i].ID, es[i].Addr, true) })
}

func (f *Fake) UpsertRevNats(es []reconciler.RevNatEntry) (int, error) {
	return f.eachInBatch(len(es), func(i int) error { return f.upsertRevNat(es[i].ID, es[i].Frontend, true) })
}

// UpsertSlots writes each slot of runs as UpsertSlot would, one after
// the other: the checks see every slot's write, in the order the maps
// get them.
func (f *Fake) UpsertSlots(runs []reconciler.SlotRun) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches++
	n := 0
	for _, run := range runs {
		for j, id := range run.IDs {
			if err := f.upsertSlot(run.Frontend, run.First+uint32(j), id, true); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

func (f *Fake) UpsertMasters(es []reconciler.MasterEntry) (int, error) {
	return f.eachInBatch(len(es), func(i int) error { return f.upsertMaster(es[i].Frontend, es[i].Master, true) })
}

func (f *Fake) UpsertServiceIPs(as []netip.Addr) (int, error) {
	return f.eachInBatch(len(as), func(i int) error { return f.upsertServiceIP(as[i], true) })
}

func (f *Fake) DeleteBackends(ids []reconciler.BackendID) (int, error) {
	return f.eachInBatch(len(ids), func(i int) error { return f.deleteBackend(ids[i], true) })
}

func (f *Fake) DeleteRevNats(ids []reconciler.ServiceID) (int, error) {
	return f.eachInBatch(len(ids), func(i int) error { return f.deleteRevNat(ids[i], true) })
}

// Batches returns how many batch operations were made (each counts in
// Count and Writes once per entry written).
func (f *Fake) Batches() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.batches
}
