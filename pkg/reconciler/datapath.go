package reconciler

import (
	"cmp"
	"net/netip"

	"github.com/sluice-lb/sluice/pkg/model"
)

// ServiceID identifies a service frontend in the datapath (the key of the
// reverse-NAT map). BackendID identifies a backend. Zero is never a valid id.
type (
	ServiceID uint32
	BackendID uint32
)

// Scope says which clients of a frontend a master and its slots serve: the
// scope field of the service map's key (lb4_key.scope).
type Scope uint8

const (
	// ScopeDefault serves every client of a one-scope frontend, and the
	// external clients of a two-scope one (model.Service.Backends).
	ScopeDefault Scope = 0
	// ScopeInternal serves the internal clients of a two-scope frontend
	// (model.Service.InternalBackends): sources in the cluster CIDR, and
	// the node through the socket path. Its master is looked up only once
	// the default scope's master says FlagTwoScopes.
	ScopeInternal Scope = 1
)

// Frontend is a frontend in one scope: what a master and its slots are
// keyed by.
type Frontend struct {
	model.L4Addr
	Scope Scope
}

// DefaultScope returns a's frontend in the default scope.
func DefaultScope(a model.L4Addr) Frontend { return Frontend{L4Addr: a} }

func (f Frontend) String() string {
	if f.Scope == ScopeInternal {
		return f.L4Addr.String() + " internal"
	}
	return f.L4Addr.String()
}

// Compare orders frontends by address, port and protocol, and a frontend's
// internal scope before its default one: the order they are programmed in,
// so that a default scope's master never says FlagTwoScopes before the
// internal scope is there.
func (f Frontend) Compare(g Frontend) int {
	if c := f.L4Addr.Compare(g.L4Addr); c != 0 {
		return c
	}
	return cmp.Compare(g.Scope, f.Scope)
}

// Master is the slot-0 entry of a service frontend.
type Master struct {
	ID    ServiceID
	Count uint32 // number of backend slots, 1..Count
	Flags uint8
	// AffinityTimeout is the session affinity timeout, in seconds, of a
	// master flagged FlagAffinity (lb4_service.affinity_timeout); 0
	// otherwise.
	AffinityTimeout uint32
}

// AffinityFix says what becomes of the session affinity entries of one
// frontend that name one backend (clients stuck to it, see
// bpf/lib/affinity.h): they move to the slot the backend moved to, or are
// deleted (Slot 0), because the backend left the frontend. Backend 0
// stands for every backend (Slot 0 only): the frontend went away, or lost
// its affinity.
type AffinityFix struct {
	Frontend Frontend // scope included: each scope has its own entries
	Backend  BackendID
	Slot     uint32
}

// KernelState is what the pinned maps hold, read back on start so that ids
// survive an agent restart and only differences are written.
type KernelState struct {
	Masters  map[Frontend]Master
	Slots    map[Frontend]map[uint32]BackendID // frontend -> slot (>=1) -> backend
	Backends map[BackendID]model.L4Addr
	RevNat   map[ServiceID]Frontend
	// SourceRanges are the loadBalancerSourceRanges a frontend flagged
	// FlagSourceRanges (in its default scope) accepts sources from:
	// frontend -> prefixes.
	SourceRanges map[model.L4Addr][]netip.Prefix
	// ServiceIPs are the addresses of ClusterIP frontends, sorted: a
	// packet to one of them that no frontend serves is rejected.
	ServiceIPs []netip.Addr
	// ServiceCIDRs are the service CIDRs, sorted: a packet to another
	// address in them is dropped (SetServiceCIDRs).
	ServiceCIDRs []netip.Prefix
}

// empty reports whether ks holds no entry at all.
func (ks *KernelState) empty() bool {
	return len(ks.Masters) == 0 && len(ks.Slots) == 0 && len(ks.Backends) == 0 && len(ks.RevNat) == 0 &&
		len(ks.SourceRanges) == 0 && len(ks.ServiceIPs) == 0
}

// KernelVisitor is given the entries of the maps by Datapath.Walk: the
// entries of a KernelState, one at a time. A method returning false stops
// the walk.
type KernelVisitor interface {
	Master(fe Frontend, m Master) bool
	// Slot is given slots >= 1.
	Slot(fe Frontend, slot uint32, id BackendID) bool
	Backend(id BackendID, addr model.L4Addr) bool
	RevNat(id ServiceID, fe Frontend) bool
	SourceRange(fe model.L4Addr, p netip.Prefix) bool
	ServiceIP(a netip.Addr) bool
}

// Datapath is the set of map operations the reconciler needs. pkg/datapath
// implements it over the pinned BPF maps; tests use an in-memory fake. Every
// operation is idempotent.
type Datapath interface {
	UpsertBackend(id BackendID, b model.L4Addr) error
	DeleteBackend(id BackendID) error
	// UpsertRevNat writes the frontend (and scope) service id stands for.
	UpsertRevNat(id ServiceID, frontend Frontend) error
	DeleteRevNat(id ServiceID) error
	// UpsertSlot writes slot >= 1 of a frontend.
	UpsertSlot(frontend Frontend, slot uint32, backend BackendID) error
	// UpsertMaster writes slot 0 of a frontend.
	UpsertMaster(frontend Frontend, m Master) error
	// DeleteSlot deletes slot (0 = the master) of a frontend.
	DeleteSlot(frontend Frontend, slot uint32) error
	// UpsertSourceRange lets the sources in prefix reach frontend while its
	// master has FlagSourceRanges. prefix is masked (no host bits).
	UpsertSourceRange(frontend model.L4Addr, prefix netip.Prefix) error
	// DeleteSourceRange deletes one source range of a frontend.
	DeleteSourceRange(frontend model.L4Addr, prefix netip.Prefix) error
	// UpsertServiceIP adds addr to the service IPs: a packet to it that
	// no frontend serves (another port or protocol) is rejected, as
	// kube-proxy's nftables mode rejects it.
	UpsertServiceIP(addr netip.Addr) error
	// DeleteServiceIP removes addr from the service IPs.
	DeleteServiceIP(addr netip.Addr) error
	// SetServiceCIDRs makes the service CIDRs exactly cidrs (masked, of
	// either family): a packet to an address in them that no frontend
	// serves and that is no service IP is dropped. It adds the new ones
	// before it deletes those no longer wanted, and leaves the node's
	// other CIDRs (the cluster CIDRs) alone.
	SetServiceCIDRs(cidrs []netip.Prefix) error
	// Dump reads the current contents of the service, backend,
	// reverse-NAT, source-range and service-IP maps.
	Dump() (*KernelState, error)
	// Walk gives v the entries Dump reads, one at a time, in no order,
	// without collecting them: the reconciler's periodic re-read
	// compares them with its view as they come. It stops, returning
	// nil, once a method of v returns false. Like Dump, it may update
	// the datapath's own bookkeeping from what it reads (the real maps
	// check each master's slots base against the agent's slot ranges:
	// that is how a base that drifted is repaired).
	Walk(v KernelVisitor) error
	// Capacity returns the sizes of each address family's reverse-NAT,
	// backend and service maps (masters plus slots): each family has its
	// own, of the same sizes. The reconciler counts backends and service
	// map entries per family against them, and services over both
	// families together: service ids are one space over both (the
	// per-Service counters are indexed by them). The service IPs fit:
	// there are no more of them than services.
	Capacity() (services, backends, serviceEntries int)
	// SourceRangeCapacity returns the size of each family's source-range
	// map: the source ranges of all its frontends together.
	SourceRangeCapacity() int
	// FlushConntrack removes per-packet conntrack entries that point at
	// any of backends (used for UDP when backends go away, so stale flows
	// re-balance instead of black-holing), in one pass.
	FlushConntrack(backends []model.L4Addr) error
	// FixAffinity applies fixes to the session affinity entries, in one
	// pass. Clients whose entries it deletes select afresh on their
	// next connection.
	FixAffinity(fixes []AffinityFix) error
	// ResetServiceStats zeroes the per-Service counters of service id,
	// just allocated: a reused id must not carry the counts of the
	// frontend that had it before.
	ResetServiceStats(id ServiceID) error

	BatchDatapath
}

// UDPFlowReader is a Datapath that can say which backends the UDP flows
// its conntrack holds use, per frontend: of every live forward entry of
// a UDP flow (the client's tuple), its destination (the frontend's
// address and port) and the backend it is translated to, with the
// backend id the entry names. Restore reads it, when removed UDP
// frontends are retired, to rebuild what a restart would forget: which
// backends a removed frontend's flows use (udpretired.go). With an
// error it returns what it could read (nil if nothing).
type UDPFlowReader interface {
	UDPFlowBackends() (map[model.L4Addr][]UDPFlowBackend, error)
}

// UDPFlowBackend is the backend a UDP flow's forward conntrack entry
// translates it to: its address (the entry's NAT address) and the
// backend id the entry names. The datapath follows the entry only while
// that id's backend entry holds that address (ct_fwd_usable).
type UDPFlowBackend struct {
	Addr model.L4Addr
	ID   BackendID
}

// BatchDatapath writes many entries of one map in one operation
// (BPF_MAP_UPDATE_BATCH): the reconciler uses it to program many new
// frontends at once (a first program of 30,000 services), map by map in
// make-before-break order.
//
// Each method writes its entries in the order given, one after the other,
// and stops at the first that fails: it returns how many were written (a
// prefix of entries; all of them with a nil error) and that entry's
// error. A reader of the maps may see any prefix, as it may between two
// single writes. The reconciler retries what follows the failed entry one
// entry at a time, so an implementation need not be able to batch at all.
type BatchDatapath interface {
	UpsertBackends(entries []BackendEntry) (int, error)
	UpsertRevNats(entries []RevNatEntry) (int, error)
	// UpsertSlots writes the slots of runs, run after run, each run's
	// slots in its order: one write per slot, as UpsertSlot would make
	// them. It counts (and a failure's prefix counts) slots, over all
	// runs together.
	UpsertSlots(runs []SlotRun) (int, error)
	UpsertMasters(entries []MasterEntry) (int, error)
	UpsertServiceIPs(addrs []netip.Addr) (int, error)
	// DeleteBackends and DeleteRevNats delete entries; deleting a
	// missing entry succeeds, as the single deletes do.
	DeleteBackends(ids []BackendID) (int, error)
	DeleteRevNats(ids []ServiceID) (int, error)
}

// FrontendPresizer is a Datapath that keeps bookkeeping of its own per
// frontend (the real maps: each frontend's range of the slots array) and
// can make room in it at once for the frontends of a first program,
// before their writes come, as the reconciler presizes its view
// (optional; a hint, which changes nothing the maps hold).
type FrontendPresizer interface {
	// PresizeFrontends makes room for n4 IPv4 and n6 IPv6 frontends.
	PresizeFrontends(n4, n6 int)
}

// BackendEntry is one entry of the backend map.
type BackendEntry struct {
	ID   BackendID
	Addr model.L4Addr
}

// RevNatEntry is one entry of the reverse-NAT map.
type RevNatEntry struct {
	ID       ServiceID
	Frontend Frontend
}

// SlotRun is slots First, First+1, ... (>= 1) of a frontend, naming IDs
// in that order: a first program's batch of slots is one run per
// frontend, 30,000 runs at 30,000 Services x 10 where one entry per
// slot made 300,000 copies of their frontends that the datapath then
// read back to encode.
type SlotRun struct {
	Frontend Frontend
	First    uint32
	IDs      []BackendID
}

// MasterEntry is the master (slot 0) of a frontend.
type MasterEntry struct {
	Frontend Frontend
	Master   Master
}
