package datapath

// The tc programs' dry twins (bpf/lib/explain.h), which `sluicectl
// explain` runs a packet through, are as big as the live programs and
// cost the verifier as much again: of an agent's start, about half of the
// CPU loading its programs (sluice_ingress_dry alone is the most expensive
// program to verify; TestDryRunLoadsLater logs each one's share). Nothing
// on the packet path needs them, so the agent loads them after its first
// sync (Config.DeferDryRun, LoadDryRun): Services are programmed that much
// sooner, and an explain asked in the seconds before gets ErrNoExplain,
// which says so. Without DeferDryRun, Open loads them with the rest.
//
// They are loaded from the same collection spec, over the maps the live
// programs use (MapReplacements: the unpinned ones too, sluice_dry_v1 and
// the explain records, which the live programs and sluicectl share with
// them), and put into sluice_dry_v1, where the live programs send a dry
// run's packet.

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// tcLoaded is what Open loads of the tc object: its maps, variables and
// the live programs; the dry twins are in Datapath.dry.
type tcLoaded struct {
	tcMaps
	tcVariables
	tcLive
}

func (o *tcLoaded) Close() error { return errors.Join(o.tcLive.Close(), o.tcMaps.Close()) }

// tcLive are the tc programs that meet packets.
type tcLive struct {
	SluiceIngress  *ebpf.Program `ebpf:"sluice_ingress"`
	SluiceEgress   *ebpf.Program `ebpf:"sluice_egress"`
	Sluice6Ingress *ebpf.Program `ebpf:"sluice6_ingress"`
	Sluice6Egress  *ebpf.Program `ebpf:"sluice6_egress"`
}

func (p *tcLive) Close() error { return closePrograms(p) }

// tcDry are the live programs' dry twins, in the order of sluice_dry_v1's
// slots (IPv4 ingress and egress, then IPv6's: EXPLAIN_PROG_IPV6).
type tcDry struct {
	SluiceIngressDry  *ebpf.Program `ebpf:"sluice_ingress_dry"`
	SluiceEgressDry   *ebpf.Program `ebpf:"sluice_egress_dry"`
	Sluice6IngressDry *ebpf.Program `ebpf:"sluice6_ingress_dry"`
	Sluice6EgressDry  *ebpf.Program `ebpf:"sluice6_egress_dry"`
}

func (p *tcDry) Close() error { return closePrograms(p) }

// closePrograms closes every program of objs, a pointer to a struct of
// them (objectsOf).
func closePrograms(objs any) error {
	var errs []error
	for _, p := range objectsOf[*ebpf.Program](objs) {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// LoadDryRun loads the dry twins of the tc programs, if they are not
// loaded yet, and puts them where the live programs send a dry run, and
// says how long that took (0 if they were loaded already). The agent
// calls it after its first sync (Config.DeferDryRun); it may run while
// the maps are being written, and while the datapath is closed: Close
// does not wait for the verifier (an agent told to stop must stop), the
// load then fails or its programs are dropped.
func (d *Datapath) LoadDryRun() (time.Duration, error) {
	d.dryMu.Lock()
	switch {
	case d.dry != nil:
		d.dryMu.Unlock()
		return 0, nil
	case d.dryClosed:
		d.dryMu.Unlock()
		return 0, errDryRunClosed
	case d.dryLoading:
		d.dryMu.Unlock()
		return 0, errors.New("load dry-run programs: already being loaded")
	}
	d.dryLoading = true
	spec := d.tcSpec
	// Copies of the map descriptors, which Close leaves open.
	maps := map[string]*ebpf.Map{}
	var err error
	for name, m := range objectsOf[*ebpf.Map](&d.tc) {
		if maps[name], err = m.Clone(); err != nil {
			break
		}
	}
	d.dryMu.Unlock()
	defer func() {
		for _, m := range maps {
			_ = m.Close() // a copy of a descriptor; the map lives on
		}
	}()
	if err != nil {
		d.endDryLoad()
		return 0, fmt.Errorf("load dry-run programs: %w", err)
	}

	start := time.Now()
	var dry tcDry
	err = spec.LoadAndAssign(&dry, &ebpf.CollectionOptions{MapReplacements: maps})
	d.dryMu.Lock()
	defer d.dryMu.Unlock()
	d.dryLoading = false
	if err != nil {
		return 0, fmt.Errorf("load dry-run programs: %w", verifierDetail(err))
	}
	if d.dryClosed {
		return 0, errors.Join(errDryRunClosed, dry.Close())
	}
	err = fillProgArray(d.tc.SluiceDryV1, "sluice_dry_v1",
		dry.SluiceIngressDry, dry.SluiceEgressDry, dry.Sluice6IngressDry, dry.Sluice6EgressDry)
	if err != nil {
		return 0, errors.Join(err, dry.Close())
	}
	// Loaded once for the agent's life: the spec is not needed again.
	d.dry, d.tcSpec = &dry, nil
	return time.Since(start), nil
}

var errDryRunClosed = errors.New("load dry-run programs: the datapath is closed")

func (d *Datapath) endDryLoad() {
	d.dryMu.Lock()
	d.dryLoading = false
	d.dryMu.Unlock()
}

// closeDryRun releases the dry twins (the live programs' dry runs then
// find an empty slot: ErrNoExplain), forgets the spec and says the
// datapath is closed, so that a load under way drops what it loads.
func (d *Datapath) closeDryRun() error {
	d.dryMu.Lock()
	dry := d.dry
	d.tcSpec, d.dry, d.dryClosed = nil, nil, true
	d.dryMu.Unlock()
	if dry == nil {
		return nil
	}
	return dry.Close()
}
