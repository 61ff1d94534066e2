package reconciler

import (
	"net/netip"

	"github.com/sluice-lb/sluice/pkg/model"
)

// ServiceID identifies a service frontend in the datapath (the key of the
// reverse-NAT map). BackendID identifies a backend. Zero is never a valid id.
type (
	ServiceID uint32
	BackendID uint32
)

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
	Frontend model.L4Addr
	Backend  BackendID
	Slot     uint32
}

// KernelState is what the pinned maps hold, read back on start so that ids
// survive an agent restart and only differences are written.
type KernelState struct {
	Masters  map[model.L4Addr]Master
	Slots    map[model.L4Addr]map[uint32]BackendID // frontend -> slot (>=1) -> backend
	Backends map[BackendID]model.L4Addr
	RevNat   map[ServiceID]model.L4Addr
	// SourceRanges are the loadBalancerSourceRanges a frontend flagged
	// FlagSourceRanges accepts sources from: frontend -> prefixes.
	SourceRanges map[model.L4Addr][]netip.Prefix
}

// Datapath is the set of map operations the reconciler needs. pkg/datapath
// implements it over the pinned BPF maps; tests use an in-memory fake. Every
// operation is idempotent.
type Datapath interface {
	UpsertBackend(id BackendID, b model.L4Addr) error
	DeleteBackend(id BackendID) error
	UpsertRevNat(id ServiceID, frontend model.L4Addr) error
	DeleteRevNat(id ServiceID) error
	// UpsertSlot writes slot >= 1 of a frontend.
	UpsertSlot(frontend model.L4Addr, slot uint32, backend BackendID) error
	// UpsertMaster writes slot 0 of a frontend.
	UpsertMaster(frontend model.L4Addr, m Master) error
	// DeleteSlot deletes slot (0 = the master) of a frontend.
	DeleteSlot(frontend model.L4Addr, slot uint32) error
	// UpsertSourceRange lets the sources in prefix reach frontend while its
	// master has FlagSourceRanges. prefix is masked (no host bits).
	UpsertSourceRange(frontend model.L4Addr, prefix netip.Prefix) error
	// DeleteSourceRange deletes one source range of a frontend.
	DeleteSourceRange(frontend model.L4Addr, prefix netip.Prefix) error
	// Dump reads the current contents of the service, backend,
	// reverse-NAT and source-range maps.
	Dump() (*KernelState, error)
	// Capacity returns the maximum number of services (reverse-NAT entries),
	// backends, and service map entries (masters plus slots).
	Capacity() (services, backends, serviceEntries int)
	// SourceRangeCapacity returns the maximum number of source ranges, of
	// all frontends together.
	SourceRangeCapacity() int
	// FlushConntrack removes per-packet conntrack entries that point at
	// any of backends (used for UDP when backends go away, so stale flows
	// re-balance instead of black-holing), in one pass.
	FlushConntrack(backends []model.L4Addr) error
	// FixAffinity applies fixes to the session affinity entries, in one
	// pass. Clients whose entries it deletes select afresh on their
	// next connection.
	FixAffinity(fixes []AffinityFix) error
}
