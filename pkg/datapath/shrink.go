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

import (
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
	// counts them: capacity.go) and what they are, for the error.
	count func(dir string) (n int, what string, err error)
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
			count: countServices,
		},
	}
}

// checkShrink refuses sizes smaller than what the pinned service maps in
// dir hold (the top of this file). Only a flag whose maps are pinned
// larger than it sizes them is counted: the usual start reads nothing.
func checkShrink(dir string, cfg Config) error {
	var errs []error
	for _, l := range shrinkLimits(cfg) {
		shrinks, err := pinnedLarger(dir, l.maps)
		if err != nil {
			return err
		}
		if !shrinks {
			continue
		}
		n, what, err := l.count(dir)
		if err != nil {
			return fmt.Errorf("count what the pinned maps hold before resizing them: %w", err)
		}
		if n > l.size {
			errs = append(errs, fmt.Errorf("%s=%d is too small for the %s programmed now: start the agent with %s=%d or more (or remove Services first, with the agent that programmed them); no map was changed",
				l.flag, l.size, what, l.flag, n))
		}
	}
	return errors.Join(errs...)
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
// (presentEntry) and the largest id among them (0 for none).
func presentIDs(dir, name string) (n int, maxID uint32, err error) {
	err = withPinned(dir, name, func(m *ebpf.Map) error {
		return eachArrayEntry(m, func(k uint32, v []byte) error {
			if presentEntry(v) {
				n++
				maxID = max(maxID, k)
			}
			return nil
		})
	})
	return n, maxID, err
}

// countServiceEntries returns the most service entries of one family,
// as the reconciler counts them: each master and its count of slots.
func countServiceEntries(dir string) (int, string, error) {
	most, which := 0, mapServices
	for _, name := range []string{mapServices, mapServices6} {
		n := 0
		err := withPinned(dir, name, func(m *ebpf.Map) error {
			k := make([]byte, m.KeySize())
			var v sockLb4Service
			it := m.Iterate()
			for it.Next(k, &v) {
				n += 1 + int(v.Count)
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
// frontend has its rev_nat entry).
func countServices(dir string) (int, string, error) {
	sum, maxID := 0, uint32(0)
	for _, name := range []string{mapRevNat, mapRevNat6} {
		n, id, err := presentIDs(dir, name)
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
	for _, set := range []struct {
		unit        string
		name, name6 string
	}{{"service IPs", mapServiceIPs, mapServiceIPs6}, {"frontends", mapServices, mapServices6}} {
		n, nWhat, err := countLargest(dir, set.unit, set.name, set.name6)
		if err != nil || n > sum {
			return n, nWhat, err
		}
	}
	return sum, what, nil
}

// countBackends returns the flag value that keeps every backend of the
// arrays: the most present entries of one family, or more if an id is
// beyond the arrays that size makes (backendSlots: the reconciler keeps
// ids dense, so only after many deletes).
func countBackends(dir string) (int, string, error) {
	need, maxID := 0, uint32(0)
	var what []string
	for _, name := range []string{mapBackends, mapBackends6} {
		n, id, err := presentIDs(dir, name)
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
