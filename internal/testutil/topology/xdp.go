package topology

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// AttachXDPPass attaches, in native mode, an XDP program that passes
// every frame to dev in the namespace; it is detached when the topology
// closes.
//
// Native XDP on a veth transmits (XDP_TX, redirect) into the peer's NAPI
// queue, which only a peer that runs XDP itself has. The kernel documents
// GRO on the peer as enough, but frames XDP_TXed into a GRO-only peer were
// seen never to reach its IP layer; with an XDP program on the peer they
// are delivered. So the far end of a link to a node running Sluice's XDP
// (a switch port, in a real network) gets this program.
//
// It lives here, not in pkg/datapath, because it is wiring of a test
// topology: it loads a two-instruction program of its own, shares nothing
// with Sluice's objects, and the rule that only pkg/datapath imports
// cilium/ebpf is about production code.
func (n *NS) AttachXDPPass(dev string) error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
	})
	if err != nil {
		return fmt.Errorf("load XDP_PASS program: %w", err)
	}
	var l link.Link
	err = n.Do(func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		prog.Close()
		return fmt.Errorf("attach XDP_PASS to %s in %s: %w", dev, n.Name, err)
	}
	n.topo.Defer(func() error { return errors.Join(l.Close(), prog.Close()) })
	return nil
}
