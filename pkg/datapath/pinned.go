package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Pinned is a read-only view of the maps an agent pinned, for operators'
// tools (sluicectl). Unlike Open it loads no programs, creates nothing and
// accepts pinned maps of any size: an inspection must work whatever
// --max-* sizes the agent was started with. Types, key and value sizes are
// still checked against this build's BPF objects, so that a layout this
// build does not know is an error rather than garbage.
type Pinned struct {
	// serviceIPs, the node CIDRs and the IPv6 maps are nil when pinned
	// by an agent without them.
	stateMaps
	metrics  *ebpf.Map
	svcStats *ebpf.Map // nil: pinned by an agent without it
	reasons  int       // counters this build and the pin both know
	dir      string    // bpffs/sluice
}

// OpenPinned opens the maps pinned under bpffs/sluice read-only. A map
// that an agent of the previous release pinned under its old name is read
// there (that is the live one, see migratePins), if its layout can be read
// the same; a missing pin is an error wrapping os.ErrNotExist.
func OpenPinned(bpffs string) (*Pinned, error) {
	if bpffs == "" {
		bpffs = DefaultBPFFS
	}
	dir := filepath.Join(bpffs, "sluice")
	spec, err := loadSock()
	if err != nil {
		return nil, err
	}
	p := &Pinned{dir: dir}
	for _, x := range []struct {
		name string
		m    **ebpf.Map
		// optional: a map an agent of an earlier release did not pin,
		// left nil.
		optional bool
	}{
		{mapServices, &p.services, false},
		{mapBackends, &p.backends, false},
		{mapRevNat, &p.revNat, false},
		{mapSrcRanges, &p.srcRanges, false},
		{mapMetrics, &p.metrics, false},
		{mapServiceIPs, &p.serviceIPs, true},
		{mapSvcStats, &p.svcStats, true},
		{mapServices6, &p.services6, true},
		// Not pinned by the previous release (its services held the
		// slots).
		{mapSlots, &p.slotArr4, true},
		{mapSlots6, &p.slotArr6, true},
		{mapBackends6, &p.backends6, true},
		{mapRevNat6, &p.revNat6, true},
		{mapSrcRanges6, &p.srcRanges6, true},
		{mapServiceIPs6, &p.serviceIPs6, true},
		{mapNodeCIDRs, &p.nodeCIDRs, true},
		{mapNodeCIDRs6, &p.nodeCIDRs6, true},
	} {
		m, err := openPinnedMap(dir, x.name, spec.Maps[x.name])
		switch {
		case err == nil:
			*x.m = m
		case x.optional && errors.Is(err, os.ErrNotExist):
		default:
			return nil, errors.Join(err, p.Close())
		}
	}
	info, err := p.metrics.Info()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("info of pinned map %s: %w", mapMetrics, err), p.Close())
	}
	// An agent built with fewer or more reasons than this tool: show the
	// ones both know.
	p.reasons = min(int(info.MaxEntries), len(metricNames()))
	return p, nil
}

// openPinnedMap opens the previous release's pin of the map name if there
// is one, else dir/name, read-only, and checks it against ms, except for
// its size.
func openPinnedMap(dir, name string, ms *ebpf.MapSpec) (*ebpf.Map, error) {
	if ms == nil {
		return nil, fmt.Errorf("map %s missing from BPF object", name)
	}
	path := filepath.Join(dir, name)
	prevHash, prevServices, prevValue := false, false, ms.ValueSize
	if prev := previousPin(dir, name); prev != "" {
		path = filepath.Join(dir, prev)
		// The previous backends maps were hashes of the same entries
		// (backendPresent reads both); the previous reverse-NAT maps
		// hashes of entries without flags (eachRevNatWhile reads
		// both).
		prevHash = name == mapBackends || name == mapBackends6 || name == mapRevNat || name == mapRevNat6
		switch name {
		case mapRevNat:
			prevValue = uint32(binary.Size(lb4RevNatV1{}))
		case mapRevNat6:
			prevValue = uint32(binary.Size(lb6RevNatV1{}))
		}
		// The previous services maps held the slots too, in values
		// without slots_base (walkState reads both).
		prevServices = name == mapServices || name == mapServices6
	}
	m, info, err := loadPinnedInfo(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	if (info.Type != ms.Type && !(prevHash && info.Type == ebpf.Hash)) || info.KeySize != ms.KeySize ||
		(info.ValueSize != ms.ValueSize && info.ValueSize != prevValue &&
			!(prevServices && info.ValueSize == uint32(binary.Size(lb4ServiceV1{})))) {
		m.Close()
		return nil, fmt.Errorf("pinned map %s is %s with key/value size %d/%d, this build reads %s with %d/%d",
			path, info.Type, info.KeySize, info.ValueSize, ms.Type, ms.KeySize, ms.ValueSize)
	}
	return m, nil
}

// Dump reads the service, backend, reverse-NAT, source-range and
// service-IP maps of both families, and the service CIDRs.
func (p *Pinned) Dump() (*reconciler.KernelState, error) {
	return dumpState(p.stateMaps)
}

// Counters returns the datapath outcome counters, summed over CPUs, by
// reason.
func (p *Pinned) Counters() (map[string]uint64, error) {
	return readCounters(p.metrics, p.reasons)
}

// NodeCIDRs reads the node's CIDRs (sluice_node_cidrs and its IPv6 twin)
// back: the cluster CIDRs the agent tells pods by, and the service CIDRs.
func (p *Pinned) NodeCIDRs() ([]NodeCIDR, error) {
	return (&Maps{nodeCIDRs: p.nodeCIDRs, nodeCIDRs6: p.nodeCIDRs6}).NodeCIDRs()
}

// Close releases the maps' file descriptors; the pins stay.
func (p *Pinned) Close() error {
	var errs []error
	for _, m := range []*ebpf.Map{p.services, p.backends, p.revNat, p.srcRanges, p.metrics, p.serviceIPs, p.svcStats,
		p.services6, p.backends6, p.revNat6, p.srcRanges6, p.serviceIPs6, p.slotArr4, p.slotArr6, p.nodeCIDRs, p.nodeCIDRs6} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
