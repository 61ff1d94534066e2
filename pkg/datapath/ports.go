package datapath

// Keeping the node's own connections off the SNAT ports (the audit's B9).
//
// External flows to backends on other nodes are source-NATed to the node's
// address and a port of Config.SNATPortMin-Max, reserved in conntrack by
// its reply tuple <backend -> node:port>. A socket of the node itself
// (kubelet, a host-network pod) that picks the same port towards the same
// backend would have its replies taken for the NAT flow. The default range
// sits above the kernel's default ephemeral ports (32768-60999), but many
// nodes widen ip_local_port_range (to 1024-65535, say). So the agent adds
// the SNAT range to net.ipv4.ip_local_reserved_ports, which the kernel
// never hands out as an ephemeral port: merged with what is there, never
// removing an entry (of another tool, or of an earlier SNAT range of
// Sluice's, which it cannot tell apart). A range (--snat-port-range)
// that would leave the node fewer than minEphemeralLeft ephemeral ports
// is not reserved, and said so. Both sysctls are per network
// namespace: the agent's (the host's) is the one that matters. They are
// read under a directory standing for /proc/sys/net (--proc-sys-net,
// Config.ProcSysNet): a container's /proc/sys is read-only, so the
// DaemonSet mounts the node's /proc/sys/net writable at
// /host/proc/sys/net, as Cilium does.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// DefaultProcSysNet is where the network sysctls of the calling thread's
// network namespace are (--proc-sys-net's default).
const DefaultProcSysNet = "/proc/sys/net"

// The sysctls, under a /proc/sys/net directory.
const (
	reservedPortsName = "ipv4/ip_local_reserved_ports"
	portRangeName     = "ipv4/ip_local_port_range"
)

// PortReservation is what ReserveSNATPorts found and did.
type PortReservation struct {
	// Added: the range was added to ip_local_reserved_ports (false: it
	// was reserved already).
	Added bool
	// Exposed are the SNAT ports the node may still hand out as
	// ephemeral ports: in ip_local_port_range and not reserved, because
	// the reservation could not be written or was refused
	// (ErrReservationRefused). Empty when all is well.
	Exposed string
	// When refused: the ephemeral ports (ip_local_port_range, "A-B") and
	// how many of them the reservation would have left the node.
	Ephemeral     string
	EphemeralLeft int
}

// ErrReservationRefused is the error (errors.Is) of a SNAT range that is
// not reserved because it would leave the node fewer than
// minEphemeralLeft ephemeral ports: the range is to be narrowed or moved
// out of ip_local_port_range, not reserved by hand.
var ErrReservationRefused = errors.New("not written")

// ReserveSNATPorts reserves the SNAT ports (Config.SNATPortMin-Max) from
// the ephemeral ports (ip_local_reserved_ports) under Config.ProcSysNet,
// the node's network namespace's /proc/sys/net (empty: DefaultProcSysNet,
// the calling thread's). If that cannot be written (a read-only /proc/sys
// in a container), it says which SNAT ports the node may still hand out
// (ip_local_port_range), with the error.
func (d *Datapath) ReserveSNATPorts() (PortReservation, error) {
	dir := d.cfg.ProcSysNet
	if dir == "" {
		dir = DefaultProcSysNet
	}
	return ReserveSNATPortRangeIn(dir, d.cfg.SNATPortMin, d.cfg.SNATPortMax)
}

// ReserveSNATPortRange is ReserveSNATPorts for the SNAT range lo-hi,
// under DefaultProcSysNet.
func ReserveSNATPortRange(lo, hi uint16) (PortReservation, error) {
	return ReserveSNATPortRangeIn(DefaultProcSysNet, lo, hi)
}

// ReserveSNATPortRangeIn is ReserveSNATPorts for the SNAT range lo-hi,
// under procSysNet (a /proc/sys/net).
func ReserveSNATPortRangeIn(procSysNet string, lo, hi uint16) (PortReservation, error) {
	reservedPath := filepath.Join(procSysNet, reservedPortsName)
	rangePath := filepath.Join(procSysNet, portRangeName)
	var res PortReservation
	if lo == 0 || hi < lo {
		return res, fmt.Errorf("SNAT port range %d-%d is empty", lo, hi)
	}
	cur, err := os.ReadFile(reservedPath)
	if err != nil {
		return res, fmt.Errorf("read %s: %w", reservedPath, err)
	}
	reserved, err := parsePortList(string(cur))
	if err != nil {
		return res, fmt.Errorf("%s: %w", reservedPath, err)
	}
	if covers(reserved, lo, hi) {
		return res, nil
	}
	// A range that would leave the node (almost) no ephemeral port is
	// not reserved: every connect() without a bound port would fail
	// (EADDRNOTAVAIL), the kubelet's among them. Its ports in the
	// ephemeral range are then exposed, as when the write fails.
	if elo, ehi, err := ephemeralRange(rangePath); err == nil {
		with := append(slices.Clone(reserved), portRange{int(lo), int(hi)})
		left := unreserved(with, elo, ehi)
		if left < minEphemeralLeft && left < unreserved(reserved, elo, ehi) {
			res.Exposed = exposed(reserved, max(int(lo), elo), min(int(hi), ehi))
			res.Ephemeral, res.EphemeralLeft = fmt.Sprintf("%d-%d", elo, ehi), left
			return res, fmt.Errorf("reserve the SNAT ports %d-%d in %s: %w, it would leave the node %d ephemeral ports of %d-%d (%s), fewer than %d: narrow the SNAT range",
				lo, hi, reservedPath, ErrReservationRefused, left, elo, ehi, rangePath, minEphemeralLeft)
		}
	}
	want := strings.TrimSpace(string(cur))
	if want != "" {
		want += ","
	}
	want += fmt.Sprintf("%d-%d", lo, hi)
	werr := os.WriteFile(reservedPath, []byte(want), 0)
	if werr == nil {
		res.Added = true
		return res, nil
	}
	werr = fmt.Errorf("reserve the SNAT ports %d-%d in %s: %w", lo, hi, reservedPath, werr)
	elo, ehi, err := ephemeralRange(rangePath)
	if err != nil {
		return res, errors.Join(werr, err)
	}
	res.Exposed = exposed(reserved, max(int(lo), elo), min(int(hi), ehi))
	return res, werr
}

// minEphemeralLeft is how many ephemeral ports the SNAT reservation must
// leave the node at least (ReserveSNATPortRange).
const minEphemeralLeft = 1024

// ephemeralRange reads ip_local_port_range, at rangePath.
func ephemeralRange(rangePath string) (lo, hi int, err error) {
	b, err := os.ReadFile(rangePath)
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", rangePath, err)
	}
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return 0, 0, fmt.Errorf("%s %q: %w", rangePath, b, err)
	}
	return lo, hi, nil
}

// unreserved counts the ports of lo-hi not in rs.
func unreserved(rs []portRange, lo, hi int) int {
	n := 0
	for p := lo; p <= hi; p++ {
		if !isReserved(rs, p) {
			n++
		}
	}
	return n
}

// portRange is an inclusive range of ports.
type portRange struct{ lo, hi int }

// parsePortList parses ip_local_reserved_ports: "8080,9000-9100", or empty.
func parsePortList(s string) ([]portRange, error) {
	var out []portRange
	for _, f := range strings.Split(strings.TrimSpace(s), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		a, b, isRange := strings.Cut(f, "-")
		lo, err := strconv.Atoi(a)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", f, err)
		}
		hi := lo
		if isRange {
			if hi, err = strconv.Atoi(b); err != nil {
				return nil, fmt.Errorf("port range %q: %w", f, err)
			}
		}
		out = append(out, portRange{lo, hi})
	}
	return out, nil
}

func isReserved(rs []portRange, p int) bool {
	for _, r := range rs {
		if p >= r.lo && p <= r.hi {
			return true
		}
	}
	return false
}

// covers reports whether every port of lo-hi is in rs.
func covers(rs []portRange, lo, hi uint16) bool {
	return exposed(rs, int(lo), int(hi)) == ""
}

// exposed returns the ports of lo-hi not in rs, as "a-b,c" (at most a few
// ranges, then "..."), or "".
func exposed(rs []portRange, lo, hi int) string {
	var parts []string
	for p := lo; p <= hi; p++ {
		if isReserved(rs, p) {
			continue
		}
		start := p
		for p < hi && !isReserved(rs, p+1) {
			p++
		}
		if len(parts) == 4 {
			parts = append(parts, "...")
			break
		}
		if start == p {
			parts = append(parts, strconv.Itoa(p))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", start, p))
		}
	}
	return strings.Join(parts, ",")
}
