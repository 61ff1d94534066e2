package datapath

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// The tc programs' IPv6 path (bpf/lib/tc6.h): programs of their own,
// which the tc entries tail-call for an IPv6 packet, so that the verifier
// checks them apart from the IPv4 programs.

// The IPv6 conntrack tables (bpf/lib/maps.h), sized as their IPv4 twins.
const (
	mapConntrack6 = "sluice6_conntrack_v1"
	mapCTNew6     = "sluice6_ct_new_v1"
	mapCTFlush6   = "sluice6_ct_flush_v1"
)

// setIPv6Programs puts the tc IPv6 programs into sluice6_tc_v1, in the
// order of its slots (TC6_PROG_INGRESS, TC6_PROG_EGRESS).
func (o *tcObjects) setIPv6Programs() error {
	return fillProgArray(o.Sluice6TcV1, "sluice6_tc_v1", o.Sluice6Ingress, o.Sluice6Egress)
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
