package datapath

// The SNAT port range (--snat-port-range).
//
// A flow source-NATed to the node's address (a NodePort, ExternalIP or
// LoadBalancer flow to another node's endpoint, a hairpin, masquerading)
// gets a source port of Config.SNATPortMin-Max, reserved by its reply
// tuple <backend -> node:port> (bpf/lib/conntrack_fam.h, ct_create_snat).
// So at most SNATPortMax-SNATPortMin+1 such flows of one protocol can be
// open at once from one node address to one backend address and port,
// each family alike; the 61000-65535 default gives 4,536. kube-proxy's
// MASQUERADE --random-fully picks from 1024-65535 (64,512 ports) for a
// client port of 1024 or more (netfilter's nf_nat_l4proto_unique_tuple).
// The range is a load-time constant of the programs (snat_port_min,
// snat_port_max in bpf/lib/config.h), and the agent reserves it from the
// node's ephemeral ports (ports.go).

import (
	"fmt"
	"strconv"
	"strings"
)

// SNATPortFloor is the lowest port a SNAT range may hold: ports below
// 1024 are privileged, which some servers take as a sign of a trusted
// client (netfilter keeps a NATed port below 1024 below 1024 for that).
const SNATPortFloor = 1024

// ParseSNATPortRange parses a SNAT port range, "MIN-MAX" (inclusive, as
// kube-proxy's and the API server's port range flags are written), and
// checks it as Open does.
func ParseSNATPortRange(s string) (lo, hi uint16, err error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	if !ok {
		return 0, 0, fmt.Errorf("SNAT port range %q: want MIN-MAX, e.g. %d-%d", s, DefaultSNATPortMin, DefaultSNATPortMax)
	}
	l, err := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	if err != nil {
		return 0, 0, fmt.Errorf("SNAT port range %q: MIN %q is not a port (0-65535)", s, a)
	}
	h, err := strconv.ParseUint(strings.TrimSpace(b), 10, 16)
	if err != nil {
		return 0, 0, fmt.Errorf("SNAT port range %q: MAX %q is not a port (0-65535)", s, b)
	}
	lo, hi = uint16(l), uint16(h)
	if err := checkSNATPortRange(lo, hi); err != nil {
		return 0, 0, err
	}
	return lo, hi, nil
}

// checkSNATPortRange returns an error unless lo-hi is a SNAT port range
// the programs can use: not empty, within SNATPortFloor-65535.
func checkSNATPortRange(lo, hi uint16) error {
	switch {
	case hi < lo:
		return fmt.Errorf("SNAT port range %d-%d is empty (MIN > MAX)", lo, hi)
	case lo < SNATPortFloor:
		return fmt.Errorf("SNAT port range %d-%d starts below %d (the privileged ports)", lo, hi, SNATPortFloor)
	}
	return nil
}
