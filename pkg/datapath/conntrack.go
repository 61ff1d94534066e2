package datapath

// Garbage collection of the per-packet conntrack map (sluice_conntrack):
// the LRU reclaims entries only under pressure, so expired flows are
// deleted on a timer to free their SNAT ports early.

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/pkg/model"
)

// monotonicNow is bpf_ktime_get_ns's clock.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Nano()), nil
}

// ctLifetime mirrors ct_expired in bpf/lib/conntrack.h.
func (m *Maps) ctLifetime(proto, flags uint8) uint64 {
	if proto == uint8(model.TCP) {
		if flags&ctFlagRST != 0 || flags&(ctFlagFinFwd|ctFlagFinRev) == ctFlagFinFwd|ctFlagFinRev {
			return uint64(m.cfg.CTTimeoutClose.Nanoseconds())
		}
		return uint64(m.cfg.CTTimeoutTCP.Nanoseconds())
	}
	return uint64(m.cfg.CTTimeoutUDP.Nanoseconds())
}

// GCConntrack deletes the conntrack entries that have expired (idle past
// their protocol's timeout, or closed TCP flows past the close timeout),
// so dead flows neither fill the table nor hold SNAT ports. It returns
// how many it deleted.
func (m *Maps) GCConntrack() (int, error) {
	now, err := monotonicNow()
	if err != nil {
		return 0, fmt.Errorf("conntrack gc: %w", err)
	}
	var doomed []sockCt4Key
	var k sockCt4Key
	var v sockCt4Entry
	it := m.conntrack.Iterate()
	for it.Next(&k, &v) {
		if v.LastSeen < now && now-v.LastSeen > m.ctLifetime(k.Proto, v.Flags) {
			doomed = append(doomed, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("conntrack gc: %w", err)
	}
	n := 0
	for i := range doomed {
		err := m.conntrack.Delete(&doomed[i])
		switch {
		case err == nil:
			n++
		case errors.Is(err, ebpf.ErrKeyNotExist):
		default:
			return n, fmt.Errorf("conntrack gc: %w", err)
		}
	}
	return n, nil
}
