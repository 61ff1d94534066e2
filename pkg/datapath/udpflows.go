package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

var _ reconciler.UDPFlowReader = (*Maps)(nil)

// UDPFlowBackends returns, per frontend address the UDP flows of the
// conntrack tables (established and new, of both families) were sent
// to, the backends they are translated to: of each live forward entry
// (the client's tuple), its destination, its NAT address and the backend
// id it names (the reconciler keeps a flow only while that id names
// that address, as the datapath follows it: ct_fwd_usable), unsorted
// and without duplicates. The reconciler's Restore rebuilds from it
// which backends the flows of removed UDP frontends use
// (pkg/reconciler/udpretired.go). Entries change under the walk: it is a
// snapshot of each entry, not of the tables. A table that cannot be read
// to its end is an error, which the flows read (of it so far, and of the
// other tables) come with.
func (m *Maps) UDPFlowBackends() (map[model.L4Addr][]reconciler.UDPFlowBackend, error) {
	now, err := monotonicNow()
	if err != nil {
		return nil, fmt.Errorf("read the clock: %w", err)
	}
	out := map[model.L4Addr][]reconciler.UDPFlowBackend{}
	type flow struct {
		fe model.L4Addr
		be reconciler.UDPFlowBackend
	}
	seen := map[flow]bool{}
	add := func(fe, be netip.AddrPort, id uint32) {
		f := model.L4Addr{Addr: fe.Addr(), Port: fe.Port(), Proto: model.UDP}
		b := reconciler.UDPFlowBackend{
			Addr: model.L4Addr{Addr: be.Addr(), Port: be.Port(), Proto: model.UDP},
			ID:   reconciler.BackendID(id),
		}
		if k := (flow{f, b}); !seen[k] {
			seen[k] = true
			out[f] = append(out[f], b)
		}
	}
	// Each table on its own: one that fails (an LRU under a flood
	// whose walk is aborted) leaves the others' flows, and its own read
	// so far, in the result.
	var errs []error
	for _, t := range []struct {
		name string
		m    *ebpf.Map
		v6   bool
	}{{mapConntrack, m.conntrack, false}, {mapCTNew, m.ctNew, false}, {mapConntrack6, m.conntrack6, true}, {mapCTNew6, m.ctNew6, true}} {
		if t.v6 {
			err = udpForwardEntries[tcCt6Key, tcCt6Entry](t.m, t.name, now, add)
		} else {
			err = udpForwardEntries[sockCt4Key, sockCt4Entry](t.m, t.name, now, add)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// udpForwardEntries gives add the destination, NAT address and backend
// id of every live forward entry of a UDP flow in the conntrack table m
// (name; nil: none), of key type K and value type V (an expired or
// lapsed one is no flow the datapath follows). It reads the table as
// eachEntry does: in batches (a table of a million entries is a few
// hundred system calls, not two million, and a batch walk goes on
// through entries changing under it, where Iterate gives up on a busy
// LRU: ErrIterationAborted), one key at a time only where the kernel has
// no batch lookup.
func udpForwardEntries[K ctKey, V ctValue](m *ebpf.Map, name string, now uint64, add func(fe, be netip.AddrPort, id uint32)) error {
	return eachEntry(m, name, func(k *K, v *V) {
		_, dst, proto, dir := (*k).tuple()
		w := (*v).view()
		if proto != uint8(model.UDP) || dir != ctForward || int64(w.expires-now) <= 0 {
			return
		}
		add(dst, w.nat, w.backendID)
	})
}
