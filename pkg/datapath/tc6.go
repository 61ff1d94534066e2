package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The IPv6 paths of the tc programs (bpf/lib/tc6.h) and of the XDP
// program (bpf/xdp.c): programs of their own, which the entries
// tail-call for an IPv6 packet, so that the verifier checks them apart
// from the IPv4 programs.

// The IPv6 conntrack tables (bpf/lib/maps.h), sized as their IPv4 twins.
const (
	mapConntrack6 = "sluice6_conntrack_v1"
	mapCTNew6     = "sluice6_ct_new_v1"
	mapCTFlush6   = "sluice6_ct_flush_v1"
)

// setIPv6Programs puts the tc IPv6 programs into sluice6_tc_v1, in the
// order of its slots (TC6_PROG_INGRESS, TC6_PROG_EGRESS), or egress
// first (a conntrack migration, migratingIPv6).
func (o *tcLoaded) setIPv6Programs(egressFirst bool) error {
	if egressFirst {
		// Slot 1 (egress) first; filling the array then puts it again.
		if err := o.Sluice6TcV1.Put(uint32(1), o.Sluice6Egress); err != nil {
			return fmt.Errorf("put program 1 into %s: %w", mapTC6, err)
		}
	}
	return fillProgArray(o.Sluice6TcV1, mapTC6, o.Sluice6Ingress, o.Sluice6Egress)
}

// xdpProgs are the XDP programs, and the program array through which
// the attached one, sluice_xdp, tail-calls its IPv6 twin for an IPv6
// frame (bpf/xdp.c).
type xdpProgs struct {
	xdpPrograms
	Sluice6XdpV1 *ebpf.Map `ebpf:"sluice6_xdp_v1"`
	xdpRoutes
	DevL3Maybe     *ebpf.Variable `ebpf:"dev_l3_maybe"`     // (devices.go)
	DevTunnelMaybe *ebpf.Variable `ebpf:"dev_tunnel_maybe"` // (devices.go)
}

func (p *xdpProgs) Close() error {
	return errors.Join(p.xdpPrograms.Close(), p.Sluice6XdpV1.Close(), p.xdpRoutes.Close())
}

// setIPv6Program puts the IPv6 XDP program into sluice6_xdp_v1.
func (p *xdpProgs) setIPv6Program() error {
	return fillProgArray(p.Sluice6XdpV1, mapXDP6, p.Sluice6Xdp)
}

// fillProgArray puts progs into the program array m (named name, for
// errors), progs[i] at slot i.
func fillProgArray(m *ebpf.Map, name string, progs ...*ebpf.Program) error {
	for i, p := range progs {
		if err := m.Put(uint32(i), p); err != nil {
			return fmt.Errorf("put program %d into %s: %w", i, name, err)
		}
	}
	return nil
}
