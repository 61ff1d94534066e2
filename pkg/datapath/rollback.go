package datapath

// A start that fails leaves the pins as they were (issue 14, thirty-fifth
// pass). Open converts the previous release's pins and resizes maps by
// renaming new maps' pins over the old ones (pins.go, migrate.go) before
// this build's programs are loaded, let alone attached: until the Attach
// methods replace them, the previous agent's programs run, on the old
// maps. A start that fails in between (a program the verifier rejects, a
// device that cannot be attached, the migration shims refused) used to
// leave the renamed pins: the next agent with the same sizes opened the
// copies made at the failed attempt, without the flows the old programs
// wrote since (broken connections, lost SNAT port reservations), and
// never migrated again, the sizes now matching.
//
// So every pin Open replaces or removes is pinned a second time first, as
// <name>_previous (pinJournal.keep), and
//
//   - a start that fails (Open's error, or Abort, which the agent calls
//     when it stops before it started) renames each _previous pin back
//     over its name and removes the pins the attempt created (a
//     sluice_backends_v2 converted from sluice_backends_v1, the maps the
//     load created): every pin names the map it named before, and the
//     next start migrates again, from the maps the old programs still
//     write;
//   - the start is complete (Commit) once this build's programs are about
//     to write the maps: AttachDevices commits right before its first tc
//     link update, the agent once it has attached everything, and Close;
//     the _previous pins go then. A failure after that keeps the new pins:
//     this build's programs write them.
//
// A kill (SIGKILL, OOM) half way leaves the _previous pins on bpffs, with
// the old programs still attached and writing those maps; the next Open
// renames them back over their names first (recoverPins), so it finds
// the pins as the killed start found them and migrates again. Pins the
// killed attempt created stay: a map of this build's new name, which the
// next start converts the previous release's pin over again (migratePins
// takes the old-named pin as the live one), or a new map the old programs
// do not use, which the next start reuses. A temporary pin of pinOver's
// (_resizing, _migrating) is removed there too. A kill while Commit
// removes the _previous pins, before any link was updated, leaves some:
// those maps are migrated again, the others not (the old programs' writes
// since the copy lost for those: the window of a few unlinks).
//
// One Open at a time on a pin directory, as one agent per node: an Open
// beside another's uncommitted start would put that start's pins back.
//
// Not put back: the previous agent's IPv6 programs in the pinned program
// arrays (sluice6_tc_v1), which load replaces when IPv6 conntrack is not
// migrated (their maps other than conntrack are the agent's, copied, or
// an LRU of affinity), the XDP link the shims took over (it hands every
// packet to tc, which the old programs still run), the cgroup links
// AttachCgroup updated before the start failed (the socket programs
// write no conntrack; what they write to a resized sluice_sock_rev or
// sluice_udp_stick meanwhile is lost, which breaks no connection:
// migrate.go), and what Prune detached (a device dropped from
// --devices).

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
)

// previousSuffix names the second pin of a map Open replaced or removed,
// until the start is complete (bpffs refuses names with a dot).
const previousSuffix = "_previous"

// tempPinSuffixes are pinOver's temporary names.
var tempPinSuffixes = []string{"_resizing", "_migrating"}

// pinJournal is what Open changed in the pin directory, to put back if
// the start fails.
type pinJournal struct {
	dir    string
	before map[string]bool // the pins in dir when Open began
	kept   []string        // the pins kept as <name>_previous
}

// startPinJournal puts back what a start that did not finish left in dir
// (recoverPins) and notes the pins there.
func startPinJournal(dir string) (*pinJournal, error) {
	if err := recoverPins(dir); err != nil {
		return nil, err
	}
	names, err := pinNames(dir)
	if err != nil {
		return nil, err
	}
	j := &pinJournal{dir: dir, before: map[string]bool{}}
	for _, n := range names {
		j.before[n] = true
	}
	return j, nil
}

// pinNames returns the pins in dir (links/ aside).
func pinNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read pin directory: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// recoverPins renames each <name>_previous pin in dir back over its name,
// and removes pinOver's temporary pins: a start killed between Open's
// changes and Commit left them (the top of this file).
func recoverPins(dir string) error {
	names, err := pinNames(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		p := filepath.Join(dir, n)
		if orig, ok := strings.CutSuffix(n, previousSuffix); ok {
			if err := os.Rename(p, filepath.Join(dir, orig)); err != nil {
				errs = append(errs, fmt.Errorf("put back pin %s that an unfinished start left: %w", orig, err))
			}
			continue
		}
		if slices.ContainsFunc(tempPinSuffixes, func(s string) bool { return strings.HasSuffix(n, s) }) {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove temporary pin %s: %w", n, err))
			}
		}
	}
	return errors.Join(errs...)
}

// keep pins the map pinned at path a second time, as path_previous,
// before Open replaces or removes that pin: once per path, and only a pin
// that was there when Open began (one the attempt created goes at undo).
func (j *pinJournal) keep(path string) error {
	if j == nil || !j.before[filepath.Base(path)] || slices.Contains(j.kept, path) {
		return nil
	}
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return fmt.Errorf("keep pinned map %s: %w", path, err)
	}
	defer m.Close()
	// A clone has no pin path: Pin on m would move the pin it was
	// loaded from instead of adding one.
	c, err := m.Clone()
	if err != nil {
		return fmt.Errorf("keep pinned map %s: %w", path, err)
	}
	defer c.Close()
	if err := c.Pin(path + previousSuffix); err != nil {
		return fmt.Errorf("keep pinned map %s: %w", path, err)
	}
	j.kept = append(j.kept, path)
	return nil
}

// undo puts every pin back as the journal found it: the kept ones first,
// each renamed over its name in one step, then the pins created since
// removed. A kill between the two leaves created pins beside the previous
// ones, which the next start copes with (the top of this file).
func (j *pinJournal) undo() error {
	if j == nil {
		return nil
	}
	var errs []error
	for _, p := range j.kept {
		if err := os.Rename(p+previousSuffix, p); err != nil {
			errs = append(errs, fmt.Errorf("put back pin %s: %w", p, err))
		}
	}
	names, err := pinNames(j.dir)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, n := range names {
		if j.before[n] {
			continue
		}
		if err := os.Remove(filepath.Join(j.dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pin %s of the failed start: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// commit lets the kept pins go: the maps Open made stay.
func (j *pinJournal) commit() error {
	if j == nil {
		return nil
	}
	var errs []error
	for _, p := range j.kept {
		if err := os.Remove(p + previousSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pin %s%s: %w", p, previousSuffix, err))
		}
	}
	return errors.Join(errs...)
}

// Commit says the start is complete: the pins Open converted or resized
// stay, even if the agent fails or is killed from now on. Call it once
// the programs are attached, before the maps are written. AttachDevices
// commits before it updates its first link, and Close commits.
func (d *Datapath) Commit() error {
	j := d.pins
	d.pins = nil
	return j.commit()
}

// Abort is Close for a start that failed before Commit: it puts back every
// pin Open converted or resized, and removes the pins it created, so that
// the previous agent's programs, still attached, go on with the maps the
// pins name and the next start migrates again. After Commit it is Close.
func (d *Datapath) Abort() error {
	j := d.pins
	d.pins = nil
	d.closeMigrations()
	return errors.Join(j.undo(), d.closeObjects())
}
