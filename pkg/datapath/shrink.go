package datapath

// A --max-backends, --max-service-entries or --max-services smaller than
// what the pinned service maps hold is refused at Open, before any pin is
// touched: the previous agent's programs go on serving every Service with
// the maps they have, and the error names the flag and the size that
// keeps what is programmed.
//
// The other answer, programming what fits and reporting the rest as
// capacity failures, would need the new agent to choose Services to take
// out of maps that carry their flows now, before its reconciler has read
// them: a copy into a smaller hash keeps whichever entries come first, a
// master without its slots, a slot without its backend. And a backends
// array whose ids fit the smaller size would be accepted as it is, the
// maps then holding more than the flag allows: the reconciler refuses
// every new backend until enough go, so a programmed Service whose
// endpoints change keeps its old ones (previous programming kept).
// Removing Services first, or a size that holds them, is the operator's
// choice to make; the datapath makes none of it.
//
// Retired masters (a removed TCP frontend's, kept for its established
// flows: reconciler/retired.go) are not Services the operator keeps:
// they do not count here, neither as services nor as service entries,
// so that removing Services and restarting smaller works at once rather
// than --conntrack-tcp-timeout later. Where the services maps shrink
// below what they hold with them, the resize's copy leaves them out
// (retiredMasters.leaveOut), with the rev_nat entries of the ids only
// they name: their established flows end, as at a deletion. The
// reconciler's Restore then reads neither, as after a deletion. Where
// they fit, or only --max-service-entries shrinks (they hold no slots,
// and the services maps keep their size), they are kept and timed by
// the reconciler as at any restart; one that needs their entry for a
// new frontend frees them then (checkCapacity).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// shrinkLimit is what one --max-* flag bounds in the pinned maps.
type shrinkLimit struct {
	flag string // the agent's flag
	size int    // its value
	// maps are the pins it sizes, with the configured size of each.
	maps map[string]int
	// count says how many of the flag's units the pinned maps hold
	// (the largest of the families', or their sum, as the reconciler
	// counts them: capacity.go), not counting the retired masters rm
	// names (nil: counting them), and what they are, for the error.
	count func(dir string, rm *retiredMasters) (n int, what string, err error)
	// dropsRetired: the flag sizes the services maps, whose copy leaves
	// the retired masters out where they do not fit.
	dropsRetired bool
}

// shrinkLimits are the flags whose maps the reconciler fills.
func shrinkLimits(cfg Config) []shrinkLimit {
	return []shrinkLimit{
		{
			flag: "--max-backends", size: cfg.MaxBackends,
			maps:  map[string]int{mapBackends: backendSlots(cfg), mapBackends6: backendSlots(cfg)},
			count: countBackends,
		},
		{
			flag: "--max-service-entries", size: cfg.MaxServiceEntries,
			maps:  map[string]int{mapSlots: slotEntries(cfg), mapSlots6: slotEntries(cfg)},
			count: countServiceEntries,
		},
		{
			flag: "--max-services", size: cfg.MaxServices,
			maps: map[string]int{mapRevNat: serviceSlots(cfg), mapRevNat6: serviceSlots(cfg),
				mapServiceIPs: cfg.MaxServices, mapServiceIPs6: cfg.MaxServices,
				mapServices: cfg.MaxServices, mapServices6: cfg.MaxServices},
			count: countServices, dropsRetired: true,
		},
	}
}

// checkShrink refuses sizes smaller than what the pinned service maps in
// dir hold (the top of this file), retired masters left out. Only a flag
// whose maps are pinned larger than it sizes them is counted: the usual
// start reads nothing. It returns the retired masters the resize leaves
// out of its copies (nil for none): those of a --max-services that holds
// the Services only without them.
func checkShrink(dir string, cfg Config) (*retiredMasters, error) {
	var errs []error
	var rm, drop *retiredMasters
	for _, l := range shrinkLimits(cfg) {
		shrinks, err := pinnedLarger(dir, l.maps)
		if err != nil {
			return nil, err
		}
		if !shrinks {
			continue
		}
		if rm == nil {
			if rm, err = readRetired(dir); err != nil {
				return nil, fmt.Errorf("read the retired masters before resizing the maps: %w", err)
			}
		}
		n, what, err := l.count(dir, rm)
		if err != nil {
			return nil, fmt.Errorf("count what the pinned maps hold before resizing them: %w", err)
		}
		if n > l.size {
			errs = append(errs, fmt.Errorf("%s=%d is too small for the %s programmed now: start the agent with %s=%d or more (or remove Services first, with the agent that programmed them); no map was changed",
				l.flag, l.size, what, l.flag, n))
			continue
		}
		if !l.dropsRetired || rm.n == 0 {
			continue
		}
		if all, _, err := l.count(dir, nil); err != nil {
			return nil, fmt.Errorf("count what the pinned maps hold before resizing them: %w", err)
		} else if all > l.size {
			drop = rm
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return drop, nil
}

// retiredMasters is what the pinned services maps hold of retired
// masters (count 0, reconciler.FlagRetired).
type retiredMasters struct {
	n int // retired masters, of both families
	// masters counts, by services map, its masters and the retired ones
	// among them.
	masters map[string][2]int
	// ids are the service ids that retired masters name and no other
	// master does: the rev_nat entries that go with them. (A live master
	// naming the id keeps its entry.)
	ids map[uint32]bool
}

// readRetired reads the retired masters pinned in dir.
func readRetired(dir string) (*retiredMasters, error) {
	rm := &retiredMasters{masters: map[string][2]int{}, ids: map[uint32]bool{}}
	live := map[uint32]bool{}
	for _, name := range []string{mapServices, mapServices6} {
		err := withPinned(dir, name, func(m *ebpf.Map) error {
			k := make([]byte, m.KeySize())
			var v sockLb4Service
			var c [2]int
			it := m.Iterate()
			for it.Next(k, &v) {
				c[0]++
				if v.Flags&reconciler.FlagRetired != 0 {
					c[1]++
					rm.ids[v.RevNatId] = true
				} else {
					live[v.RevNatId] = true
				}
			}
			rm.masters[name] = c
			rm.n += c[1]
			return it.Err()
		})
		if err != nil {
			return nil, err
		}
	}
	for id := range live {
		delete(rm.ids, id)
	}
	return rm, nil
}

// leaveOut returns what the resize's copy of the map name leaves out of
// it: the retired masters of a services map, the rev_nat entries of
// their ids; nil for a map that keeps everything (and for a nil rm).
// Keys and values are as the map holds them (an array's key its index).
func (rm *retiredMasters) leaveOut(name string) func(k, v []byte) bool {
	if rm == nil || rm.n == 0 {
		return nil
	}
	switch name {
	case mapServices, mapServices6:
		return func(_, v []byte) bool {
			var sv sockLb4Service
			_, err := binary.Decode(v, binary.NativeEndian, &sv)
			return err == nil && sv.Flags&reconciler.FlagRetired != 0
		}
	case mapRevNat, mapRevNat6:
		if len(rm.ids) == 0 {
			return nil
		}
		return func(k, _ []byte) bool { return rm.ids[binary.NativeEndian.Uint32(k)] }
	}
	return nil
}

// pinnedLarger says whether a map of sizes is pinned in dir with more
// entries than sizes gives it.
func pinnedLarger(dir string, sizes map[string]int) (bool, error) {
	for name, size := range sizes {
		m, info, err := loadPinnedInfo(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return false, err
		}
		m.Close()
		if int(info.MaxEntries) > size {
			return true, nil
		}
	}
	return false, nil
}

// withPinned calls f with the map pinned in dir as name, read-only, if
// there is one.
func withPinned(dir, name string, f func(*ebpf.Map) error) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned map %s: %w", name, err)
	}
	defer m.Close()
	if err := f(m); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// countLargest returns the most entries one of the hashes names holds
// (each family's map is as large as the flag, capacity.go), and says
// which.
func countLargest(dir, unit string, names ...string) (int, string, error) {
	most, which := 0, names[0]
	for _, name := range names {
		err := withPinned(dir, name, func(m *ebpf.Map) error {
			n, err := countByKey(m)
			if n > most {
				most, which = n, name
			}
			return err
		})
		if err != nil {
			return 0, "", err
		}
	}
	return most, fmt.Sprintf("%d %s in %s", most, unit, which), nil
}

// presentIDs returns the present entries of the pinned array name
// (presentEntry) and the largest id among them (0 for none), leaving out
// the ids skip names.
func presentIDs(dir, name string, skip map[uint32]bool) (n int, maxID uint32, err error) {
	err = withPinned(dir, name, func(m *ebpf.Map) error {
		return eachArrayEntry(m, func(k uint32, v []byte) error {
			if presentEntry(v) && !skip[k] {
				n++
				maxID = max(maxID, k)
			}
			return nil
		})
	})
	return n, maxID, err
}

// countServiceEntries returns the most service entries of one family,
// as the reconciler counts them: each master and its count of slots. A
// retired master (count 0) counts only with a nil rm.
func countServiceEntries(dir string, rm *retiredMasters) (int, string, error) {
	most, which := 0, mapServices
	for _, name := range []string{mapServices, mapServices6} {
		n := 0
		err := withPinned(dir, name, func(m *ebpf.Map) error {
			k := make([]byte, m.KeySize())
			var v sockLb4Service
			it := m.Iterate()
			for it.Next(k, &v) {
				if rm == nil || v.Flags&reconciler.FlagRetired == 0 {
					n += 1 + int(v.Count)
				}
			}
			return it.Err()
		})
		if err != nil {
			return 0, "", err
		}
		if n > most {
			most, which = n, name
		}
	}
	return most, fmt.Sprintf("%d service entries in %s", most, which), nil
}

// countServices returns the flag value that keeps every service: the
// present rev_nat entries of both families (services are counted over
// both together: service ids are one space), or more if an id is beyond
// the arrays that size makes (serviceSlots), or the service IPs or the
// masters of one family if more (they are at most as many: each master's
// frontend has its rev_nat entry). With rm, the retired masters it names
// and the rev_nat entries of their ids are left out.
func countServices(dir string, rm *retiredMasters) (int, string, error) {
	var skip map[uint32]bool
	if rm != nil {
		skip = rm.ids
	}
	sum, maxID := 0, uint32(0)
	for _, name := range []string{mapRevNat, mapRevNat6} {
		n, id, err := presentIDs(dir, name, skip)
		if err != nil {
			return 0, "", err
		}
		sum, maxID = sum+n, max(maxID, id)
	}
	what := fmt.Sprintf("%d services of both families in %s and %s", sum, mapRevNat, mapRevNat6)
	// A size of n keeps ids up to n + ServiceIDQuarantine (serviceSlots).
	if q := reconciler.ServiceIDQuarantine; int(maxID) > sum+q {
		sum = int(maxID) - q
		what += fmt.Sprintf(" and service id %d, which a size of %d keeps", maxID, sum)
	}
	n, nWhat, err := countLargest(dir, "service IPs", mapServiceIPs, mapServiceIPs6)
	if err != nil || n > sum {
		return n, nWhat, err
	}
	if n, nWhat, err = countFrontends(dir, rm); err != nil || n > sum {
		return n, nWhat, err
	}
	return sum, what, nil
}

// countFrontends returns the most masters one services map holds, and
// says which; with rm, not counting the retired ones.
func countFrontends(dir string, rm *retiredMasters) (int, string, error) {
	if rm == nil {
		return countLargest(dir, "frontends", mapServices, mapServices6)
	}
	most, which := 0, mapServices
	for _, name := range []string{mapServices, mapServices6} {
		if c := rm.masters[name]; c[0]-c[1] > most {
			most, which = c[0]-c[1], name
		}
	}
	return most, fmt.Sprintf("%d frontends in %s", most, which), nil
}

// countBackends returns the flag value that keeps every backend of the
// arrays: the most present entries of one family, or more if an id is
// beyond the arrays that size makes (backendSlots: the reconciler keeps
// ids dense, so only after many deletes).
func countBackends(dir string, _ *retiredMasters) (int, string, error) {
	need, maxID := 0, uint32(0)
	var what []string
	for _, name := range []string{mapBackends, mapBackends6} {
		n, id, err := presentIDs(dir, name, nil)
		if err != nil {
			return 0, "", err
		}
		need, maxID = max(need, n), max(maxID, id)
		if n > 0 {
			what = append(what, fmt.Sprintf("%d backends in %s", n, name))
		}
	}
	// A size of n keeps ids up to 2n + BackendIDQuarantine
	// (backendSlots).
	if q := reconciler.BackendIDQuarantine; int(maxID) > 2*need+q {
		need = (int(maxID) - q + 1) / 2
		what = append(what, fmt.Sprintf("backend id %d, which a size of %d keeps", maxID, need))
	}
	if len(what) == 0 {
		what = []string{"0 backends"}
	}
	return need, strings.Join(what, " and "), nil
}
