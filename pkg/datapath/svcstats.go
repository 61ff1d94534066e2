package datapath

// Per-Service counters (--service-metrics, bpf/lib/svcstats.h): the
// programs count new flows, packets, bytes and refusals by reason in
// sluice_svc_stats, a per-CPU array indexed by the service id (the rev-NAT
// id) of the frontend's scope that served the client. This file reads them
// back: the array's CPUs summed, the ids turned into frontends through
// sluice_rev_nat and a two-scope frontend's two ids added together, so
// that a caller sees one row per frontend, as the kernel holds it at the
// moment of the read (a scrape, `sluicectl services --stats`).
//
// Both maps are read with batch lookups: at 30,000 services a read is a
// few dozen system calls, not one per id. The array is read only up to the
// highest id in use: the reconciler keeps ids dense from 1.
//
// An id is zeroed when the reconciler allocates it (ResetServiceStats), so
// that the counters of a frontend that went away never show under the
// frontend its id is handed to next.

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// ServiceStats are one frontend's counters, summed over CPUs and over its
// scopes.
type ServiceStats struct {
	Frontend model.L4Addr
	// NewFlows: flows whose first packet (tc, XDP) or whose connect or
	// sendmsg (the socket path) was translated to a backend.
	NewFlows uint64
	// Packets and Bytes (IPv4 total length) to the frontend translated
	// to a backend by tc or XDP; the socket path translates no packets.
	Packets, Bytes uint64
	// Drops by reason: Drops[i] is of ServiceDropReasons()[i] (the
	// rejects among them: no_endpoints). A slice, not a map by name: a
	// read of 30,000 frontends would spend most of its time on the maps.
	Drops []uint64
}

// DropsByReason returns s's drops by reason name.
func (s ServiceStats) DropsByReason() map[string]uint64 {
	out := make(map[string]uint64, len(s.Drops))
	for i, r := range svcDropReasons() {
		if i < len(s.Drops) {
			out[r] = s.Drops[i]
		}
	}
	return out
}

// svcStatsSize is the number of entries of sluice_svc_stats for cfg: every
// id the reconciler may hand out (MaxServices in use, plus those in
// quarantine, plus id 0, which is never used) with --service-metrics; one
// without, since an array's memory (value size, times entries, times
// CPUs: 88 B x 65,793 x CPUs by default) is allocated whole.
func svcStatsSize(cfg Config) int {
	if !cfg.ServiceMetrics {
		return 1
	}
	return cfg.MaxServices + reconciler.ServiceIDQuarantine + 1
}

// ServiceDropReasons returns the reasons ServiceStats.Drops is keyed by,
// in the order of enum svc_drop_reason: its C names lower-cased, without
// SVC_DROP_ (SVC_DROP_NO_ENDPOINTS is "no_endpoints"), read from the
// embedded object's BTF, so a reason added in C needs no change here.
func ServiceDropReasons() []string { return append([]string(nil), svcDropReasons()...) }

var svcDropReasons = sync.OnceValue(func() []string {
	names, err := enumNames(_SockBytes, "svc_drop_reason", "SVC_DROP_")
	if err != nil {
		// The object is embedded: only a broken build gets here.
		panic(fmt.Sprintf("embedded BPF object: %v", err))
	}
	if len(names) > len(sockSvcStats{}.Drops) {
		panic(fmt.Sprintf("embedded BPF object: %d drop reasons, room for %d", len(names), len(sockSvcStats{}.Drops)))
	}
	return names
})

// enumNames reads enum name of obj's BTF, whose values are 0..<prefix>MAX
// - 1 and <prefix>MAX, and returns the name of each value below MAX,
// lower-cased without prefix.
func enumNames(obj []byte, name, prefix string) ([]string, error) {
	spec, err := btf.LoadSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		return nil, fmt.Errorf("load BTF: %w", err)
	}
	var enum *btf.Enum
	if err := spec.TypeByName(name, &enum); err != nil {
		return nil, fmt.Errorf("enum %s: %w", name, err)
	}
	n := -1
	for _, v := range enum.Values {
		if v.Name == prefix+"MAX" {
			n = int(v.Value)
		}
	}
	if n < 0 || n != len(enum.Values)-1 {
		return nil, fmt.Errorf("enum %s: want values 0..%sMAX-1 and %sMAX", name, prefix, prefix)
	}
	names := make([]string, n)
	for _, v := range enum.Values {
		if v.Name == prefix+"MAX" {
			continue
		}
		s, ok := strings.CutPrefix(v.Name, prefix)
		if !ok || s == "" || int(v.Value) >= n || names[v.Value] != "" {
			return nil, fmt.Errorf("enum %s: %s = %d: want %s<name>, below %sMAX, each once", name, v.Name, v.Value, prefix, prefix)
		}
		names[v.Value] = strings.ToLower(s)
	}
	return names, nil
}

// ResetServiceStats zeroes the counters of service id, which the
// reconciler has just allocated: a reused id's counters are those of the
// frontend that had it before. An id beyond the array (counted nowhere,
// see svcstats.h) needs nothing.
func (m *Maps) ResetServiceStats(id reconciler.ServiceID) error {
	if uint32(id) >= m.svcStats.MaxEntries() {
		return nil
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("reset counters of service %d: %w", id, err)
	}
	if err := m.svcStats.Put(uint32(id), make([]sockSvcStats, cpus)); err != nil {
		return fmt.Errorf("reset counters of service %d: %w", id, err)
	}
	return nil
}

// ServiceStats returns the per-Service counters of every frontend with a
// service id, sorted by frontend. Without --service-metrics they are all
// zero (the programs count nothing).
func (m *Maps) ServiceStats() ([]ServiceStats, error) {
	return readServiceStats(m.svcStats, m.revNat, m.revNat6)
}

// ServiceStats returns the counters of every frontend, as Maps.ServiceStats
// does, or nil if the agent pinned no sluice_svc_stats (an older agent).
func (p *Pinned) ServiceStats() ([]ServiceStats, error) {
	if p.svcStats == nil {
		return nil, nil
	}
	return readServiceStats(p.svcStats, p.revNat, p.revNat6)
}

// statsBatch is how many entries one batch lookup reads.
const statsBatch = 4096

// readServiceStats reads stats (sluice_svc_stats) for the ids in revNat
// and revNat6 (one id space).
func readServiceStats(stats, revNat, revNat6 *ebpf.Map) ([]ServiceStats, error) {
	ids, err := readRevNat(revNat, revNat6)
	if err != nil {
		return nil, err
	}
	var maxID uint32
	for id := range ids {
		maxID = max(maxID, id)
	}
	maxID = min(maxID, stats.MaxEntries()-1)
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	reasons := svcDropReasons()
	byFE := make(map[model.L4Addr]int, len(ids))
	out := make([]ServiceStats, 0, len(ids))
	// One array for every frontend's drops, cut into its rows: one
	// allocation, not 30,000.
	dropsOf := make([]uint64, len(ids)*len(reasons))
	newRow := func(fe model.L4Addr) int {
		j := len(out)
		byFE[fe] = j
		out = append(out, ServiceStats{Frontend: fe, Drops: dropsOf[j*len(reasons) : (j+1)*len(reasons) : (j+1)*len(reasons)]})
		return j
	}
	keys := make([]uint32, min(statsBatch, int(maxID)+1))
	values := make([]sockSvcStats, len(keys)*cpus)
	var cursor ebpf.MapBatchCursor
	for done := false; !done && len(ids) > 0; {
		n, err := stats.BatchLookup(&cursor, keys, values, nil)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			done = true
		} else if err != nil {
			return nil, fmt.Errorf("read %s: %w", mapSvcStats, err)
		}
		for i := range n {
			id := keys[i]
			if id > maxID {
				done = true
				break
			}
			fe, ok := ids[id]
			if !ok {
				continue
			}
			j, ok := byFE[fe]
			if !ok {
				j = newRow(fe)
			}
			s := &out[j]
			for _, v := range values[i*cpus : (i+1)*cpus] {
				s.NewFlows += v.NewFlows
				s.Packets += v.Packets
				s.Bytes += v.Bytes
				for r := range s.Drops {
					s.Drops[r] += v.Drops[r]
				}
			}
		}
	}
	// Frontends whose ids are beyond the array (restored from an agent
	// with a larger one) are shown, with nothing counted.
	for _, fe := range ids {
		if _, ok := byFE[fe]; !ok {
			newRow(fe)
		}
	}
	slices.SortFunc(out, func(a, b ServiceStats) int { return a.Frontend.Compare(b.Frontend) })
	return out, nil
}

// readRevNat returns the frontend of each service id in revNat and its
// IPv6 twin revNat6 (either scope: both count for the frontend): the
// arrays' present entries (eachRevNatWhile).
func readRevNat(revNat, revNat6 *ebpf.Map) (map[uint32]model.L4Addr, error) {
	out := make(map[uint32]model.L4Addr, min(statsBatch, int(revNat.MaxEntries())))
	err := eachRevNatWhile(revNat, revNat6, func(id reconciler.ServiceID, fe reconciler.Frontend) bool {
		out[uint32(id)] = fe.L4Addr
		return true
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
