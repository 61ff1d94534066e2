package fakedp

import (
	"net/netip"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Nop is a reconciler.Datapath that takes every write and holds nothing,
// of any size: what the reconciler costs alone, in the benchmarks, and
// what its view holds.
type Nop struct{}

var _ reconciler.Datapath = Nop{}

func (Nop) UpsertBackend(reconciler.BackendID, model.L4Addr) error             { return nil }
func (Nop) DeleteBackend(reconciler.BackendID) error                           { return nil }
func (Nop) UpsertRevNat(reconciler.ServiceID, reconciler.Frontend) error       { return nil }
func (Nop) DeleteRevNat(reconciler.ServiceID) error                            { return nil }
func (Nop) UpsertSlot(reconciler.Frontend, uint32, reconciler.BackendID) error { return nil }
func (Nop) UpsertMaster(reconciler.Frontend, reconciler.Master) error          { return nil }
func (Nop) DeleteSlot(reconciler.Frontend, uint32) error                       { return nil }
func (Nop) UpsertSourceRange(model.L4Addr, netip.Prefix) error                 { return nil }
func (Nop) DeleteSourceRange(model.L4Addr, netip.Prefix) error                 { return nil }
func (Nop) UpsertServiceIP(netip.Addr) error                                   { return nil }
func (Nop) DeleteServiceIP(netip.Addr) error                                   { return nil }
func (Nop) SetServiceCIDRs([]netip.Prefix) error                               { return nil }
func (Nop) Dump() (*reconciler.KernelState, error)                             { return &reconciler.KernelState{}, nil }
func (Nop) Walk(reconciler.KernelVisitor) error                                { return nil }
func (Nop) Capacity() (int, int, int)                                          { return 1 << 30, 1 << 30, 1 << 30 }
func (Nop) SourceRangeCapacity() int                                           { return 1 << 30 }
func (Nop) FlushConntrack([]model.L4Addr) error                                { return nil }
func (Nop) FixAffinity([]reconciler.AffinityFix) error                         { return nil }
func (Nop) ResetServiceStats(reconciler.ServiceID) error                       { return nil }
func (Nop) UpsertBackends(es []reconciler.BackendEntry) (int, error)           { return len(es), nil }
func (Nop) UpsertRevNats(es []reconciler.RevNatEntry) (int, error)             { return len(es), nil }
func (Nop) UpsertMasters(es []reconciler.MasterEntry) (int, error)             { return len(es), nil }
func (Nop) UpsertServiceIPs(as []netip.Addr) (int, error)                      { return len(as), nil }
func (Nop) DeleteBackends(ids []reconciler.BackendID) (int, error)             { return len(ids), nil }
func (Nop) DeleteRevNats(ids []reconciler.ServiceID) (int, error)              { return len(ids), nil }

func (Nop) UpsertSlots(runs []reconciler.SlotRun) (int, error) {
	n := 0
	for _, run := range runs {
		n += len(run.IDs)
	}
	return n, nil
}
